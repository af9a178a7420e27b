"""Reading a model and putting its graph in a form every later step can rely on.

A model is loaded once, from a path (with its external data) or copied from a ModelProto;
the user's file and object are never changed. Its graph is then topologically sorted
(some quantizers store nodes out of order, which onnxruntime accepts but a pass in graph
order would not) and every node gets a unique name (unnamed ones ``<OpType>_<k>``).
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import weakref
from collections import defaultdict

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from .. import onnxfile, params
from ..errors import PTQError, shown
from ..guard import external_data_file


def load_model(model_or_file, what="model", external=True, parse=True):
    """Load an ONNX model from a path or return a copy of a ModelProto (never modified).
    ``external=False`` leaves external data where it is (see :func:`externalize`);
    ``parse=False`` only checks the path (returns ``(None, path)``)."""
    if isinstance(model_or_file, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_file)
        return model, None
    if isinstance(model_or_file, bool) or not isinstance(model_or_file, (str, os.PathLike)):
        raise PTQError(f"{what} must be the path of an .onnx file or an onnx.ModelProto, got {shown(model_or_file)}")
    path = params.input_path(model_or_file, f"{what} file")
    if path.is_dir():
        raise PTQError(f"{what} {str(path)!r} is a folder; pass the .onnx file")
    if not path.is_file():
        if path.exists():
            raise PTQError(f"{what} file {str(path)!r} is not a regular file (a device or a pipe); pass the path of "
                           "an .onnx file")
        raise PTQError(f"{what} file {str(path)!r} does not exist; pass the path of an .onnx file")
    if not parse:
        return None, path
    try:
        model = onnxfile.read(path, external=external)
    except Exception as exc:  # onnx raises DecodeError, OSError, ... for a broken file
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PTQError(f"{what} file {str(path)!r} is not a readable ONNX model "
                       f"({type(exc).__name__}: {first}); check that it is a complete .onnx file with its "
                       "external data beside it") from None
    if not model.graph.node:
        raise PTQError(f"{what} file {str(path)!r} holds no graph nodes; pass an exported ONNX model")
    return model, path


def attribute(node, name, default=None):
    """An int, float, string or tensor attribute of ``node``, or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


# Ops that only lay a tensor out anew: applied to constants, they give constants.
LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten")


def laid_out(node, x, constant, source=None):
    """``node`` (one of :data:`LAYOUT_OPS`) applied to the constant ``x``, or None where its
    other inputs are not constant. A node that cannot apply to ``x`` (a perm that is no
    permutation of its dims, a shape of another size) is refused in one sentence naming it
    (``source``: the file, for that sentence)."""
    try:
        return _laid_out(node, x, constant)
    except (ValueError, IndexError, TypeError) as exc:
        # numpy's reason (repeated axis, sizes that differ) read where the file is, not a bug's traceback
        of = f" of {source}" if source else ""
        raise PTQError(f"{node.op_type} {node.name!r}{of} cannot lay out constant {node.input[0]!r} of shape "
                       f"{list(np.shape(x))} ({exc}): the file is malformed (onnxruntime refuses it too); fix the "
                       f"node's attributes or shape in the export") from None


def _laid_out(node, x, constant):
    second = constant(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if node.op_type == "Reshape":
        if second is None:
            return None
        shape = [int(d) for d in np.asarray(second).reshape(-1)]
        if not attribute(node, "allowzero", 0):  # a 0 keeps that dimension of the input
            shape = [x.shape[k] if d == 0 and k < x.ndim else d for k, d in enumerate(shape)]
        return x.reshape(shape)
    if node.op_type == "Transpose":
        perm = attribute(node, "perm")
        return np.transpose(x, None if perm is None else [int(p) for p in perm])
    if node.op_type == "Flatten":
        axis = int(attribute(node, "axis", 1))
        axis += x.ndim if axis < 0 else 0
        return x.reshape(math.prod(x.shape[:axis]), -1)
    axes = attribute(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        if second is None:
            return None
        axes = np.asarray(second).reshape(-1)
    if node.op_type == "Squeeze":
        return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(int(a) for a in axes))
    return np.expand_dims(x, tuple(int(a) for a in axes)) if axes is not None else None


def declared_dims(value):
    """The dims the tensor type of ``value`` (a graph input, output or value info) declares,
    None for each it leaves open, as onnxruntime reads them: a name, nothing, or a negative
    number (Paddle's exports write -1 for a dynamic batch; 0 is a size); None where it
    declares no shape."""
    tt = value.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim]


def subgraphs(node):
    """The subgraphs of a node's attributes (If branches, Loop and Scan bodies)."""
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def has_subgraphs(node):
    """Whether ``node`` holds a subgraph (If, Loop, Scan)."""
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _subgraph_refs(graph, bound):
    """Names a subgraph reads from the enclosing scope."""
    bound = set(bound) | {i.name for i in graph.input} | {i.name for i in graph.initializer}
    refs = []
    for node in graph.node:
        refs += [i for i in node.input if i and i not in bound]
        for g in subgraphs(node):
            refs += [r for r in _subgraph_refs(g, bound) if r not in bound]
        bound.update(node.output)
    return refs


def node_refs(node):
    """Explicit inputs plus names read implicitly by the node's subgraphs, in order, unique."""
    refs = [i for i in node.input if i]
    for g in subgraphs(node):
        refs += _subgraph_refs(g, ())
    return list(dict.fromkeys(refs))


class Unprovided(PTQError):
    """A node reads a tensor that nothing in the graph provides (``implicit``: its subgraph
    reads it from the enclosing graph); :meth:`explain` adds what the float model shows."""

    def __init__(self, node, tensor, implicit, source):
        self.node, self.tensor, self.implicit, self.source = node, tensor, implicit, source
        super().__init__(self.explain())

    def explain(self, float_node=None, kept=None):
        """The sentence; ``float_node``: the float model's node that writes the tensor;
        ``kept``: this model's node of that name, where it still has one."""
        where = "a subgraph of node" if self.implicit else "node"
        head = (f"{where} {self.node.name or self.node.op_type!r} of {self.source} reads tensor {self.tensor!r}, "
                "which no node, input or initializer provides (onnxruntime refuses the file too)")
        if float_node is not None:
            # a folded Relu leaves its producer in place, writing the Relu's output instead
            done = (f"here it writes {', '.join(repr(o) for o in kept.output)} instead: the quantizer folded the op "
                    "after it into it" if kept is not None else "the quantizer removed that node")
            return (f"{head}: the float model's {float_node.op_type} {float_node.name or float_node.op_type!r} "
                    f"writes it; {done} without rewiring what reads it"
                    f"{' inside the subgraph' if self.implicit else ''}; quantize again with that node "
                    "excluded or kept (onnxruntime: extra_options={'QDQKeepRemovableActivations': True}), or "
                    "report it to the quantizer")
        if self.implicit:
            return (f"{head}; a quantizer that deletes an op it folds (a Relu, say) without rewiring the subgraphs "
                    "that read its output writes such a file: pass the float model to name the op, and quantize "
                    "again keeping it")
        return f"{head}; re-export the model"


def sort_topologically(graph, source="the model"):
    """Reorder ``graph.node`` so every node follows the producers of what it reads; a graph
    already in order is left exactly as it is. Returns True when nodes moved."""
    nodes = list(graph.node)
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    producer = {}
    for k, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = k
    waiting, users = [0] * len(nodes), defaultdict(list)
    for k, n in enumerate(nodes):
        for r in node_refs(n):
            if r in available:
                continue
            if r not in producer:
                raise Unprovided(n, r, r not in n.input, source)
            waiting[k] += 1
            users[producer[r]].append(k)
    for o in graph.output:
        if o.name not in available and o.name not in producer:
            raise PTQError(f"output {o.name!r} of {source} is written by no node, input or initializer "
                           "(onnxruntime refuses the file too); re-export the model")
    ready = [k for k in range(len(nodes)) if waiting[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)  # the lowest original index first keeps stored order where it is valid
        order.append(k)
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = next(nodes[k] for k in range(len(nodes)) if k not in set(order))
        raise PTQError(f"the graph of {source} has a cycle through node {stuck.name or stuck.op_type!r}; "
                       "re-export the model")
    if order == list(range(len(nodes))):
        return False
    del graph.node[:]
    graph.node.extend(nodes[k] for k in order)
    return True


def name_nodes(graph):
    """Give unnamed nodes stable names ``<OpType>_<k>`` (k counts that op type in graph order)
    and suffix repeated names (``<name>__<k>``, k the first free), so that every result names
    one node. Returns ``(unnamed, repeated)``: the names given to nodes that had none, and to
    those whose name another node shares (no tool that reads the file can name either)."""
    taken = {n.name for n in graph.node if n.name}
    counts = defaultdict(int)
    given = set()
    for n in graph.node:
        if n.name:
            continue
        while True:
            candidate = f"{n.op_type}_{counts[n.op_type]}"
            counts[n.op_type] += 1
            if candidate not in taken:
                break
        n.name = candidate
        taken.add(candidate)
        given.add(candidate)
    seen, suffix, repeated = set(), defaultdict(int), set()
    for n in graph.node:
        if n.name in seen:  # A, A, A__1 named the second A A__1 too
            base = n.name
            while n.name in seen or n.name in taken:
                suffix[base] += 1
                n.name = f"{base}__{suffix[base]}"
            repeated.add(n.name)
        seen.add(n.name)
    return given, repeated


# Initializers at least this large leave the ModelProto: their values are kept once, as numpy
# arrays, and every onnxruntime session the engine builds shares them (see engine/runtime.py),
# so copying and serializing the graph for each session costs nothing.
LARGE_BYTES = 64 * 2**10
# The external-data location a placeholder names: never read, its session supplies the value.
SHARED_LOCATION = "ptq-shared-initializer"
# Sub-byte types, two or four elements to a byte in a file, one to a byte in numpy.
PACKED = frozenset(getattr(onnx.TensorProto, t) for t in ("INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1")
                   if hasattr(onnx.TensorProto, t))


def placeholder(name, array):
    """A TensorProto with the name, type and shape of ``array`` and no data: onnxruntime gets
    the value through SessionOptions.add_initializer, onnx's shape inference only its type."""
    t = onnx.TensorProto()
    t.name = name
    t.data_type = onnx.helper.np_dtype_to_tensor_dtype(np.asarray(array).dtype)
    t.dims.extend(np.shape(array))
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", SHARED_LOCATION), ("offset", "0"), ("length", "1")):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def is_placeholder(tensor):
    return tensor.data_location == onnx.TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == SHARED_LOCATION for e in tensor.external_data)


def externalize(graph, shared=None, folder=None, source="the model"):
    """Move every large initializer of ``graph`` out into ``{name: numpy array}`` (returned),
    leaving a placeholder. External data (beside the model, under ``folder``) is mapped from
    its file, not copied; inline data is copied out one tensor at a time and dropped from the
    proto; placeholders already there take their value from ``shared``."""
    out = {}
    for k, init in enumerate(graph.initializer):
        if is_placeholder(init):
            if shared is None or init.name not in shared:
                raise ValueError(f"initializer {init.name!r} has no value to share")
            out[init.name] = shared[init.name]
            continue
        if init.data_location == onnx.TensorProto.EXTERNAL:
            value = _mapped(init, folder, source)
        elif _nbytes(init) >= LARGE_BYTES:
            value = numpy_helper.to_array(init)
        else:
            continue
        out[init.name] = value
        graph.initializer[k].CopyFrom(placeholder(init.name, value))
    return out


def _nbytes(init):
    if init.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    return int(np.prod(init.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize


def _mapped(init, folder, source):
    """A read-only memory map of an initializer's external data: pages stay in the file until
    read, and onnxruntime shares them instead of copying."""
    info = {e.key: e.value for e in init.external_data}
    # the path checked is the path read: no second spelling of it to resolve otherwise
    path = str(external_data_file(folder, info.get("location", ""), f"initializer {init.name!r} of {source}"))
    dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
    shape = tuple(init.dims)
    count = int(np.prod(shape, dtype=np.int64))
    offset = int(info.get("offset", 0))
    if dtype.itemsize == 0 or init.data_type in PACKED:  # onnx unpacks them
        return numpy_helper.to_array(init, base_dir=folder or "")
    _check_length(init, source, path, offset, offset + count * dtype.itemsize)
    try:
        key = _file_key(path) + (offset, dtype.str, shape)
        array = _LIVE.get(key)
        if array is None and not _descriptor_left():  # read, not mapped: no descriptor to hold a mapping
            array = np.fromfile(path, dtype=dtype, count=count, offset=offset)
            if array.size != count:
                raise ValueError(f"the file ends before the tensor's {count} values")
        elif array is None:
            array = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape if count else (0,))
            _LIVE[key] = array
            _remember(mapping(array), path, offset)
    except (OSError, ValueError) as exc:
        raise PTQError(f"initializer {init.name!r} of {source} keeps its data in {path!r}, which cannot be read "
                       f"({type(exc).__name__}: {exc}); keep the external data file beside the model") from None
    return array.reshape(shape)


def _check_length(init, source, path, start, end):
    """Refuse an external data file shorter than ``init``'s bytes ``start:end`` in one sentence
    that says so (numpy's "mmap length is greater than file size" came with the advice to keep
    a file beside the model that was there, cut short)."""
    try:
        size = os.path.getsize(path)
    except OSError:  # missing or unreadable: the reading below says which
        return
    if size < end:
        raise PTQError(f"initializer {init.name!r} of {source} keeps its data in bytes {start}..{end} of {path!r}, "
                       f"which holds {size}: the file is cut short or comes from another save of the model; copy "
                       "the model and its external data file again, together")


# Descriptors kept free for everything else a run opens (sessions, data files, the report).
FREE_DESCRIPTORS = 64


def _descriptor_left():
    """Whether another mapping fits under the open-file limit: each weight's mapping holds a
    file descriptor, and a model of some 500 weights (with its float model's) passed Linux's
    default soft limit of 1024 (macOS: 256). Near it the soft limit is raised toward the hard
    one, as a process may, until the last mapping goes (see :func:`_mapping_gone`); where it
    cannot be, weights are read instead of mapped."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or len(_COVERS) + FREE_DESCRIPTORS < soft // 2:
            return True  # far from it: no listing of every descriptor for each weight mapped
        used = _descriptors()
    except (ImportError, OSError, ValueError):  # Windows: no such limit on mappings
        return True
    if used + FREE_DESCRIPTORS < soft:
        return True
    raised = hard if hard != resource.RLIM_INFINITY else used + 16 * FREE_DESCRIPTORS
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(raised, max(2 * soft, used + 16 * FREE_DESCRIPTORS)), hard))
        now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if now != soft:
            _RAISED[0] = (soft if _RAISED[0] is None else _RAISED[0][0], now)
        soft = now
    return used + FREE_DESCRIPTORS < soft


def _descriptors():
    """How many files this process has open."""
    return len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))


# (the soft open-file limit the process had, the one set) while mappings made here hold the
# descriptors it was raised for: a raised limit left for the rest of the process was the
# user's later code's, and its child processes' (a test suite's after a model's release)
_RAISED = [None]
_OPEN = [0]  # mappings made here alive


def _mapping_gone():
    _TOTAL[0] = None
    _OPEN[0] -= 1
    if _OPEN[0] or _RAISED[0] is None:
        return
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        before, raised = _RAISED[0]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != raised:  # set since by someone else: theirs
            _RAISED[0] = None
        elif _descriptors() + FREE_DESCRIPTORS < before:  # else the files opened since need it: kept raised
            resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))
            _RAISED[0] = None


def _file_key(path):
    """A file's identity for reusing its mapping: the same path, inode, size and time of
    change (a file rewritten in between is mapped anew)."""
    st = os.stat(path)
    return os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns


# Mappings made here, by file key (and range): a file read twice (the float model, read by
# the alignment and again by the check's float session) is mapped once, so a page both read
# is resident once (two mappings of a 192 MiB float model held both copies' pages: the
# check's peak)
_LIVE = weakref.WeakValueDictionary()


# Every file mapping of weights made here, and what it covers: (real path, offset in the
# file). A range may still be mapped twice (a file's inline weights through its whole-file
# mapping, its external data range by range); where mapped bytes set a limit it counts once
# (see mapped_bytes).
_COVERS = weakref.WeakKeyDictionary()
_TOTAL = [None]  # the registry's mapped_bytes, dropped whenever a mapping comes or goes


def _remember(mm, path, offset):
    if mm is not None:
        _COVERS[mm] = (os.path.realpath(path), offset)
        _TOTAL[0] = None
        _OPEN[0] += 1
        weakref.finalize(mm, _mapping_gone)


def file_mappings():
    """The open file mappings of weights this process holds (made by :func:`load_mapped` and
    :func:`externalize`)."""
    maps = (ref() for ref in _COVERS.keyrefs())  # a copy taken at once: the pager's thread reads it too
    return [mm for mm in maps if mm is not None and not mm.closed]


def mapped_bytes(maps=None):
    """Bytes of file the mappings ``maps`` (default: :func:`file_mappings`, computed once while
    they stay the same: the pager asks after every run) cover, a range mapped more than once
    counted once."""
    if maps is None:
        if _TOTAL[0] is None:
            _TOTAL[0] = mapped_bytes(file_mappings())
        return _TOTAL[0]
    covered = {}
    for mm in maps:
        key = _COVERS.get(mm, mm)
        covered[key] = max(covered.get(key, 0), len(mm))
    return sum(covered.values())


def mapping(array):
    """The memory map ``array`` is a view on (a weight left in its file by :func:`load_mapped`
    or :func:`externalize`), or None."""
    import mmap

    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return base


def hand_back(mm):
    """Drop this process's resident pages of the read-only file mapping ``mm``. Exact: a
    later read faults them back in from the page cache. A no-op without madvise, or once
    the mapping is closed."""
    import mmap

    if mm is not None and hasattr(mmap, "MADV_DONTNEED") and not mm.closed:
        with contextlib.suppress(ValueError, OSError):  # this kernel refuses: the pages stay, nothing is lost
            mm.madvise(mmap.MADV_DONTNEED)


def initializer(name, value, shared):
    """The TensorProto for ``value`` in a built graph: a placeholder registered in ``shared``
    when large, else the value itself."""
    value = np.asarray(value)
    if value.nbytes >= LARGE_BYTES:
        shared[name] = value
        return placeholder(name, value)
    return numpy_helper.from_array(value, name)


def _copy_without(message, fields):
    """A copy of protobuf ``message`` (a ModelProto, a GraphProto) without ``fields``, made
    field by field: a whole copy emptied after keeps the memory of all it held, since
    protobuf frees a message's memory only with the message (a gated 8000-node model held
    15 MiB of copied and deleted nodes)."""
    copy = type(message)()
    for field, value in message.ListFields():
        if field.name in fields:
            continue
        if field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED:
            getattr(copy, field.name).extend(value)
        elif field.message_type is not None:
            getattr(copy, field.name).CopyFrom(value)
        else:
            setattr(copy, field.name, value)
    return copy


def model_without(model, fields):
    """A copy of ModelProto ``model`` whose graph lacks ``fields`` (see :func:`_copy_without`)."""
    copy = _copy_without(model, ("graph",))
    copy.graph.CopyFrom(_copy_without(model.graph, fields))
    return copy


def restore(model, shared):
    """A copy of ``model`` with the placeholders that ``shared`` holds filled from it (for
    tools that run the model without the engine)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for k, init in enumerate(copy.graph.initializer):
        if is_placeholder(init) and init.name in shared:
            copy.graph.initializer[k].CopyFrom(numpy_helper.from_array(shared[init.name], init.name))
    return copy


# -- inline weights, mapped from the file instead of parsed into the proto -------------------
# ModelProto.graph = 7, GraphProto.initializer = 5, TensorProto: data_type = 2,
# name = 8, raw_data = 9 (onnx.proto).
_GRAPH, _INITIALIZER, _DATA_TYPE, _NAME, _RAW = 7, 5, 2, 8, 9


def _encode(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# Types whose raw data is not one element per item (packed, or variable length).
_UNMAPPABLE = {onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED} | PACKED


def _without_raw(buf, start, end, found):
    """A TensorProto's bytes without its raw data when that is large (its place in the file
    noted in ``found``), or None to keep it as it is."""
    name, raw, dtype = None, None, onnx.TensorProto.UNDEFINED
    for field, wire, head, vstart, vend in onnxfile.fields(buf, start, end):
        if field == _NAME and wire == 2:
            name = bytes(buf[vstart:vend]).decode("utf-8")
        elif field == _DATA_TYPE and wire == 0:
            dtype, _ = onnxfile.varint(buf, vstart)
        elif field == _RAW and wire == 2 and vend - vstart >= LARGE_BYTES:
            raw = (head, vstart, vend)
    if raw is None or name is None or dtype in _UNMAPPABLE:
        return None
    found[name] = (raw[1], raw[2] - raw[1])
    return bytes(buf[start:raw[0]]) + bytes(buf[raw[2]:end])


def _light_graph(buf, start, end, found):
    pieces, changed = [], False
    for field, wire, head, vstart, vend in onnxfile.fields(buf, start, end):
        if field == _INITIALIZER and wire == 2:
            tensor = _without_raw(buf, vstart, vend, found)
            if tensor is not None:
                pieces.append(bytes(buf[head:vstart - len(_encode(vend - vstart))]) + _encode(len(tensor)) + tensor)
                changed = True
                continue
        pieces.append(bytes(buf[head:vend]))
    return b"".join(pieces) if changed else None


def load_mapped(path):
    """``(model, {name: array})`` of a model file whose large inline weights stay in the file:
    the model is parsed without them (placeholders in their place) and each is a read-only
    view on a memory map of the file, so loading costs no copy of the weights. None when the
    file has no large inline weights or is not binary protobuf (load it as usual, by content)."""
    import mmap

    key = _file_key(path) + ("whole",)
    mm = _LIVE.get(key)
    if mm is None:
        with open(path, "rb") as fh:
            try:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file
                return None
        _LIVE[key] = mm
        _remember(mm, path, 0)
    buf = memoryview(mm)
    found, pieces, changed = {}, [], False
    try:
        for field, wire, head, vstart, vend in onnxfile.fields(buf, 0, len(buf)):
            if field == _GRAPH and wire == 2:
                graph = _light_graph(buf, vstart, vend, found)
                if graph is not None:
                    key = bytes(buf[head:vstart - len(_encode(vend - vstart))])
                    pieces.append(key + _encode(len(graph)) + graph)
                    changed = True
                    continue
            pieces.append(bytes(buf[head:vend]))
    except (ValueError, IndexError):
        return None  # not a protobuf we can walk: load_model says why
    if not changed:
        buf.release()
        return None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(b"".join(pieces))
    except DecodeError:  # a text model whose first bytes happen to walk as fields: onnxfile.read reads it
        buf.release()
        return None
    arrays = {}
    for init in model.graph.initializer:
        if init.name in found and not init.HasField("raw_data"):
            offset, length = found[init.name]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
            arrays[init.name] = np.frombuffer(mm, dtype=dtype, count=length // dtype.itemsize,
                                              offset=offset).reshape(tuple(init.dims))
            init.CopyFrom(placeholder(init.name, arrays[init.name]))
    return model, arrays


def load_light(model_or_file, what="model"):
    """``(model, path, {name: mapped array})``: a file's large inline weights stay in the file
    (memory-mapped, placeholders in the proto, see :func:`load_mapped`); external data stays
    where it is (see :func:`externalize`); a ModelProto is copied, its large inline weights
    copied out into arrays (placeholders in the copy)."""
    if not isinstance(model_or_file, onnx.ModelProto):
        model, path = load_model(model_or_file, what, external=False, parse=False)
        light = load_mapped(path)
        if light is not None and light[0].graph.node:
            return _inlined(light[0]), path, light[1]
        model, path = load_model(path, what, external=False)
        return _inlined(model), path, {}
    model, arrays = _light_copy(model_or_file)
    return _inlined(model), None, arrays


def _inlined(model):
    """``model`` with its local functions (``model.functions``) inlined: a call of one is no
    op onnxruntime's kernels or the analyses know by type, and pairs inside its body are the
    model's pairs like any other. Inlined nodes keep the body's names, made unique by onnx's inliner."""
    if not model.functions:
        return model
    from onnx import inliner

    return inliner.inline_local_functions(model)


def _light_copy(proto):
    """``(copy, {name: array})``: a copy of ModelProto ``proto`` whose large inline
    initializers are placeholders, each value copied out once. A whole copy would keep them in
    its memory after :func:`externalize` replaced them (protobuf frees a message's memory only
    with the message): a second copy of the weights for the engine's life."""
    model = model_without(proto, ("initializer",))
    arrays = {}
    for init in proto.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL and _nbytes(init) >= LARGE_BYTES:
            arrays[init.name] = numpy_helper.to_array(init)
            init = placeholder(init.name, arrays[init.name])
        model.graph.initializer.append(init)
    return model, arrays


def load_weightless(model_or_file, what="model"):
    """``(model, path, {name: array})``: the model with every large initializer a placeholder
    and its value mapped from the file that stores it (inline or external data), or copied
    out of a ModelProto (see :func:`load_light`, :func:`externalize`)."""
    model, path, mapped = load_light(model_or_file, what)
    arrays = externalize(model.graph, mapped, path.parent if path else None, f"the {what} {str(path)!r}" if path
                         else f"the {what}")
    return model, path, arrays

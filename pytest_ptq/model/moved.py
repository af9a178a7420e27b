"""Pairs whose codes a data-movement node lays out between QuantizeLinear and
DequantizeLinear (Q -> Identity / Reshape / Transpose / Squeeze / Unsqueeze / Flatten -> DQ:
exporters that lay a tensor out after quantizing it).

QuantizeLinear rounds element by element, so moving such a node before the Q, onto the float
tensor, gives the same values; the tool's copy of the graph is rewritten so, and each such
chain becomes an ordinary pair whose bypass runs the node on the float tensor, as the float
model does. A per-channel Q moves only through an Identity or a Transpose (its axis follows
the permutation; without perm, the reversed dims of the rank the file declares or onnx
infers), a per-block one through an Identity alone (its scale would need the same
layout); through a reshaping node its channels would land on another axis, so such a chain
is left as it is, said in one sentence naming its nodes. Every Transpose without perm in the
tool's copy of the graph, moved or not, gets its reversed dims written where its rank is known
(onnxruntime 1.28 aborts the process loading one beside a per-channel pair).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

from onnx import helper

from ..errors import PTQError
from .graph import LAYOUT_OPS, attribute, node_refs

MOVERS = ("Identity",) + LAYOUT_OPS
_DOMAINS = ("", "ai.onnx")


@dataclasses.dataclass
class Moved:
    """What :func:`hoist` did: ``notes`` for the model's notes, ``left`` a sentence each for
    the chains it could not move (their Q and DQ stay ordinary nodes), naming their nodes;
    ``names``: each pair's new float tensor -> the tensor its Q read in the file (what a
    quantizer's option names and a user knows)."""

    notes: list
    left: list
    names: dict = dataclasses.field(default_factory=dict)


def hoist(graph, source, is_q, is_dq, dims=lambda tensor: None):
    """Move every data-movement node between a Q and its DQs (``is_q``, ``is_dq``: the
    predicates of :mod:`.qdq`) before the Q, in ``graph`` (sorted topologically; it stays so);
    ``dims(tensor)``: its dims as declared or inferred (None where unknown), which a Transpose
    without perm needs, and every Transpose without perm gets its perm written where that
    rank is known (named in a note where the graph holds a per-channel or per-block pair, which
    onnxruntime 1.28 aborts beside one: the export should write it). Returns a :class:`Moved`."""
    order = list(graph.node)  # one wrapper per node: the indices below are by identity
    written = write_perms(order, dims)
    outputs = {o.name for o in graph.output}
    readers = defaultdict(list)
    for n in order:
        for r in node_refs(n):
            readers[r].append(n)
    sizes = _sizes(order, graph.initializer)
    perms = _perms_note(written, source) if written and _wide_scale(order, sizes, is_q, is_dq, dims) else []
    names = {t for n in order for t in (*n.input, *n.output)} | {i.name for i in graph.input}
    moved, left, renamed = [], [], {}
    for q in list(order):
        if not is_q(q):
            continue
        chain = _chain(q, readers, outputs, is_dq)
        if not chain:
            continue
        ends = readers[chain[-1].output[0]]
        rank = _rank(q, chain, ends, dims)
        axes = _axes(q, chain, sizes, rank, source)
        shown = " -> ".join(f"{n.op_type} {n.name!r}" for n in (q, *chain, ends[0]))  # a DQ, or the Clip before them
        if axes is None:
            blocks = attribute(q, "block_size", 0)
            blocker = next((m for m in chain if m.op_type != "Identity" and not (
                m.op_type == "Transpose" and (attribute(m, "perm") is not None or rank is not None) and not blocks)),
                chain[0])
            op = blocker.op_type
            which = ("a per-block QuantizeLinear's scale" if blocks else
                     "a per-channel QuantizeLinear's axis" if q.input[1] in sizes else "a computed scale's layout")
            if op == "Transpose" and attribute(blocker, "perm") is None and not blocks:
                left.append(f"{shown}: the Transpose has no perm (it reverses its input's dims) and neither the file "
                            f"nor onnx's shape inference gives the rank of {q.input[0]!r}, so the tool cannot follow "
                            f"{which} through it and its Q and DQ stay quantized in every configuration, the float "
                            "reference included; give the Transpose its perm, or declare that tensor's shape, in the "
                            "export")
                continue
            left.append(f"{shown}: the tool does not follow {which} through a {op}, so its Q and DQ stay quantized "
                        f"in every configuration, the float reference included; put the {op} before the QuantizeLinear "
                        "(or after the DequantizeLinear) in the export")
            continue
        for m, axis in zip(chain, axes):
            if m.op_type == "Transpose" and attribute(m, "perm") is None and rank is not None:
                # its reversed dims written out: onnxruntime 1.28 aborts the process (no
                # exception) loading a segment that holds the perm-less Transpose moved before the Q
                m.attribute.append(helper.make_attribute("perm", list(range(rank))[::-1]))
            x, codes, out = q.input[0], q.output[0], m.output[0]
            fresh = f"{out}::float"
            while fresh in names:
                fresh += "_"
            names.add(fresh)
            renamed[fresh] = renamed.get(x, x)
            m.input[0], m.output[0] = x, fresh
            q.input[0], q.output[0] = fresh, out
            readers[x] = [m if r is q else r for r in readers[x]]
            readers[fresh] = [q]
            readers.pop(codes, None)
            _drop_value_info(graph, codes)
            if axis is not None:
                _set_axis(q, axis)
            elif m.op_type != "Identity":  # a one-element scale's axis may not exist in the new rank
                _drop_axis(q)
            # the Q now runs right after the node it read through
            del order[_index(order, q)]
            order.insert(_index(order, m) + 1, q)
        moved.append(shown)
    if moved:
        del graph.node[:]
        graph.node.extend(order)
    more = f"; and {len(moved) - 2} more" if len(moved) > 2 else ""
    notes = [f"{len(moved)} pair(s) of {source} lay their codes out between QuantizeLinear and DequantizeLinear "
             f"({'; '.join(moved[:2])}{more}): each is analysed as one pair, that node moved onto the float tensor "
             "before its QuantizeLinear (the same values: QuantizeLinear rounds element by element), so that the pair "
             "bypassed is the float computation"] if moved else []
    left_notes = [f"a chain left quantized in every configuration in {source}: {chain}" for chain in left]
    return Moved(notes=perms + notes + left_notes, left=left, names=renamed)


def write_perms(nodes, dims):
    """Give each Transpose of ``nodes`` without perm its reversed dims, where ``dims`` knows the
    rank of its input or output: onnxruntime 1.28 aborts the whole process (no exception)
    loading a graph where such a Transpose meets a per-channel Q or DQ of known rank, the
    user's own graph included, and the tool's copy of it is what every session loads. Returns
    those it wrote into."""
    written = []
    for n in nodes:
        if n.op_type != "Transpose" or n.domain not in _DOMAINS or attribute(n, "perm") is not None:
            continue
        known = next((d for d in (dims(n.input[0]), dims(n.output[0])) if d is not None), None)
        if known is not None:
            n.attribute.append(helper.make_attribute("perm", list(range(len(known)))[::-1]))
            written.append(n)
    return written


def _wide_scale(nodes, sizes, is_q, is_dq, dims):
    """Whether a Q or DQ of ``nodes`` has a scale of more than one element (per channel or per
    block; one of unknown size is not counted): only beside such a pair does onnxruntime 1.28
    abort loading a Transpose without perm."""
    for n in nodes:
        if len(n.input) > 1 and (is_q(n) or is_dq(n)):
            size = sizes.get(n.input[1])
            if size is None:
                d = dims(n.input[1])
                size = math.prod(d) if d is not None and all(isinstance(k, int) for k in d) else 1
            if size > 1:
                return True
    return False


def _perms_note(written, source):
    """The note for the user's Transposes :func:`write_perms` gave a perm, in a graph with a
    per-channel or per-block pair (:func:`_wide_scale`): every run, the file as deployed
    included, has it written, so a deployment on onnxruntime 1.28 would not."""
    if not written:
        return []
    shown = ", ".join(repr(n.name or n.output[0]) for n in written[:3])
    more = f" and {len(written) - 3} more" if len(written) > 3 else ""
    return [f"Transpose node(s) {shown}{more} of {source} have no perm attribute; every run of the tool, the file "
            "as deployed included, runs them with their reversed dims written as their perm (the same values), "
            "because onnxruntime 1.28 aborts the process loading such a Transpose beside a per-channel "
            "QuantizeLinear/DequantizeLinear: write perm in the export"]


def _chain(q, readers, outputs, is_dq):
    """The data-movement nodes from Q node ``q``'s codes to DQs only (or an integer Clip, a
    narrower grid's, before them), in order; [] where ``q`` is no such chain's."""
    chain, tensor = [], q.output[0]
    while True:
        users = readers.get(tensor, [])
        if len(users) != 1 or tensor in outputs:
            break
        m = users[0]
        if (m.op_type not in MOVERS or m.domain not in _DOMAINS or list(m.input).count(tensor) != 1
                or m.input[0] != tensor or len([o for o in m.output if o]) != 1):
            break
        chain.append(m)
        tensor = m.output[0]
    if not chain:
        return []
    users = readers.get(tensor, [])
    if users and (all(is_dq(u) for u in users) or (len(users) == 1 and users[0].op_type == "Clip")):
        return chain
    return []


def _rank(q, chain, ends, dims):
    """The rank of Q node ``q``'s tensor, as far as ``dims`` knows it: of its input or output,
    or of any tensor after it that the chain's Identity and Transpose nodes (and ``ends``, its
    DQs or Clip, after a chain of those alone) leave of the same rank; None where none says."""
    same = [q.input[0], q.output[0]]
    for m in chain:
        if m.op_type not in ("Identity", "Transpose"):
            break
        same.append(m.output[0])
    else:
        same += [e.output[0] for e in ends if e.output]
    return next((len(d) for d in map(dims, same) if d is not None), None)


def _axes(q, chain, sizes, rank=None, source="the model"):
    """The axis Q node ``q`` quantizes along once moved past each node of ``chain`` (None each
    for a per-tensor Q), or None where a node moves its channels onto another axis, or is a
    Transpose without perm (reversing dims) of an unknown ``rank``. An axis outside the
    tensor or a perm that is no permutation of its axes (a file onnxruntime refuses) is
    refused in one sentence: wrapped, the channels would land on an axis the file never names."""
    per_tensor = sizes.get(q.input[1]) == 1 if len(q.input) > 1 else False
    if per_tensor and not attribute(q, "block_size", 0):
        return [None] * len(chain)
    axis, out = int(attribute(q, "axis", 1)), []
    blocks = bool(attribute(q, "block_size", 0))  # a block scale's own layout would move too
    for m in chain:
        if m.op_type == "Transpose" and not blocks:
            perm = attribute(m, "perm")
            if perm is None and rank is None:
                return None
            perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
            if sorted(perm) != list(range(len(perm))) or rank is not None and len(perm) != rank:
                raise PTQError(f"Transpose {m.name!r} of {source} has perm {perm}, not a permutation of the "
                               f"{rank if rank is not None else len(perm)} axes of {m.input[0]!r}: the file is "
                               "malformed (onnxruntime refuses it too); fix the perm in the export")
            if not -len(perm) <= axis < len(perm):
                raise PTQError(f"{q.op_type} {q.name!r} of {source} has axis {axis} on its {len(perm)}-D input "
                               f"{q.input[0]!r}: out of range for that input; fix the export so that the axis indexes "
                               "the channels of the quantized tensor")
            axis = perm.index(axis % len(perm))
        elif m.op_type != "Identity":
            return None
        out.append(axis)
    return out


def _sizes(nodes, initializers):
    """Element counts of the initializers and Constant outputs, also through an Identity or
    Cast of one (fp16 exports' scales): a scale of one is a per-tensor Q's."""
    sizes = {i.name: math.prod(i.dims) for i in initializers}
    for n in nodes:  # in topological order: a Cast's source is counted before it
        value = attribute(n, "value") if n.op_type == "Constant" else None
        if value is not None:
            sizes[n.output[0]] = math.prod(value.dims)
        elif n.op_type in ("Identity", "Cast") and n.input and n.input[0] in sizes:
            sizes[n.output[0]] = sizes[n.input[0]]
    return sizes


def _index(nodes, node):
    return next(k for k, n in enumerate(nodes) if n is node)


def _set_axis(node, axis):
    for a in node.attribute:
        if a.name == "axis":
            a.i = axis
            return
    node.attribute.append(helper.make_attribute("axis", axis))


def _drop_axis(node):
    kept = [a for a in node.attribute if a.name != "axis"]
    del node.attribute[:]
    node.attribute.extend(kept)


def _drop_value_info(graph, name):
    """Forget a tensor the move removed (its integer type would otherwise name nothing)."""
    kept = [v for v in graph.value_info if v.name != name]
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)


def undo(node, shape, axis, before):
    """``(shape, axis)`` of data-movement node ``node``'s input, given its output's ``shape``
    and ``axis`` (an axis of it, or None); ``before``: the input's dims as far as they are known
    without running it (None each where open, None where unknown), which a reshaping node
    needs. The axis is None where the input has no axis holding the same channels (a Reshape
    that merges or splits it); an open dim is solved from the element count where it can be."""
    shape = list(shape)
    if node.op_type == "Identity":
        return shape, axis
    if node.op_type == "Transpose":
        perm = attribute(node, "perm")
        perm = list(range(len(shape)))[::-1] if perm is None else [int(p) for p in perm]  # none: reversed
        dims = [0] * len(perm)
        for k, p in enumerate(perm):
            dims[p] = shape[k]
        return dims, None if axis is None else perm[axis % len(perm)]
    if before is None:
        return None, None
    dims = list(before)
    open_ = [k for k, d in enumerate(dims) if d is None]
    known = math.prod(d for d in dims if d is not None)
    if len(open_) == 1 and known:
        dims[open_[0]] = math.prod(shape) // known
    if axis is None or None in dims:
        return dims, None
    axis %= len(shape)
    lead = math.prod(shape[:axis])
    same = [j for j in range(len(dims)) if dims[j] == shape[axis] and math.prod(dims[:j]) == lead]
    return dims, same[0] if same else None

"""QDQ model -> gated model: graph rewrites only (ModelProto in, ModelProto out).

Every bypassable calibration node becomes an ``If`` on a boolean feed (its *gate*): the
then-branch holds the original Q/DQ nodes, the else-branch passes the float tensor
through. A config (which calibration nodes are quantized) is then a set of feed values,
and one compiled model serves every config. A node may carry a second fake-quant (16 bit,
per channel), chosen by a second feed; and the model may carry *local clones*: a copy of
each normal node fed by calibration nodes, reading its inputs quantized from their float
values, so that one pass gives every node's local error.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..model.graph import initializer, model_without, node_refs
from ..model.qdq import HALF_TYPES

FLAG_PREFIX = "ptq_flag::"
ALT_PREFIX = "ptq_alt::"
GATE_PREFIX = "ptq_if::"
LOCAL_PREFIX = "ptq_local::"


@dataclasses.dataclass
class Gates:
    """The feeds of a gated model: one flag per bypassable calibration node (True =
    quantized) and one per alternative (True = quantized the alternative way)."""

    flags: dict  # calibration node name -> flag input name
    alternatives: dict  # calibration node name -> QParams
    alt_flags: dict  # calibration node name -> alternative flag input name

    @classmethod
    def of(cls, names, alternatives=None):
        alternatives = dict(alternatives or {})
        return cls(flags={n: f"{FLAG_PREFIX}{k}" for k, n in enumerate(names)}, alternatives=alternatives,
                   alt_flags={n: f"{ALT_PREFIX}{k}" for k, n in enumerate(alternatives)})

    def is_feed(self, name):
        return name.startswith(FLAG_PREFIX) or name.startswith(ALT_PREFIX)

    def feed_names(self):
        return set(self.flags.values()) | set(self.alt_flags.values())


UNFOLDED = "::unfolded"  # ends the name of a pair's output for its readers without the fold


def bypass_nodes(c, out, elem=onnx.TensorProto.FLOAT):
    """Nodes computing ``out`` for calibration node ``c`` bypassed: its float tensor, with the
    Relu/Clip that quantize_static folded into the pair (``c.folded``) applied again, but for
    the output its readers without the fold read (``c.unfolded``, named ``...::unfolded``)."""
    src = c.float_weight or c.input
    if c.folded is None or out.endswith(UNFOLDED):
        return [helper.make_node("Identity", [src], [out])]
    op, lo, hi = c.folded
    if op == "Relu":
        return [helper.make_node("Relu", [src], [out])]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    return [helper.make_node("Constant", [], [f"{out}::lo"], value=numpy_helper.from_array(np.array(lo, dtype))),
            helper.make_node("Constant", [], [f"{out}::hi"], value=numpy_helper.from_array(np.array(hi, dtype))),
            helper.make_node("Clip", [src, f"{out}::lo", f"{out}::hi"], [out])]


def gate_of(node):
    """The calibration node a gate ``If`` stands for, or None for any other node."""
    if node.op_type == "If" and node.name.startswith(GATE_PREFIX):
        return node.name[len(GATE_PREFIX):]
    return None


def instrument(qmodel, gates, extra_outputs=(), local=False, shared=None):
    """The gated copy of ``qmodel``'s graph, with ``extra_outputs`` exposed and, with
    ``local``, the local clones (their outputs exposed too). Large float weights go into
    ``shared`` (``{name: array}``) behind placeholders, like the model's own large weights."""
    model = model_without(qmodel.model, ("node",))
    graph = model.graph
    at_node, dropped = {}, set()
    for c in qmodel.calibration.values():
        if c.name not in gates.flags:
            continue
        # the gate stands where the pair's last node before its DQs stood: past the constants
        # a Clip between Q and DQ reads (a Constant node written after the Q)
        anchor = c.between[-1] if c.between else c.q_node if c.q_node is not None else c.dq_nodes[0]
        at_node[anchor.name] = c
        dropped.update(d.name for d in [c.q_node, *c.between, *c.dq_nodes] if d is not None)
    # readers of a pair whose float counterparts read the tensor before its fold
    unfolded = {}
    for c in at_node.values():
        for r in c.unfolded if c.folded else ():
            unfolded.setdefault(r, {}).update({o: o + UNFOLDED for o in c.outputs})  # a reader of several
    for node in qmodel.model.graph.node:
        if node.name in at_node:
            graph.node.append(_gate(qmodel, gates, at_node[node.name]))
        elif node.name in unfolded:
            reader = onnx.NodeProto()
            reader.CopyFrom(node)
            for k, i in enumerate(reader.input):
                reader.input[k] = unfolded[node.name].get(i, i)
            graph.node.append(reader)
        elif node.name not in dropped:
            graph.node.append(node)
    shared = {} if shared is None else shared
    for name, value in qmodel.float_weights.items():
        graph.initializer.append(initializer(name, value, shared))
    for name in gates.flags.values():
        graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.BOOL, []))
    for name, alt in gates.alternatives.items():
        k = gates.alt_flags[name]
        graph.input.append(helper.make_tensor_value_info(k, onnx.TensorProto.BOOL, []))
        # the alternative's arithmetic runs in the dtype of the tensor it quantizes, float32
        # for a 16-bit float one (see _alternative_branch), on a scale of the tensor's type
        # (a DequantizeLinear's scale has its output's)
        own = _float_type(qmodel, qmodel.calibration[name])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(_alternative_type(own))
        scale = np.asarray(alt.scale).astype(onnx.helper.tensor_dtype_to_np_dtype(own))
        graph.initializer.extend([
            numpy_helper.from_array(scale.astype(dtype), f"{k}::scale"),
            numpy_helper.from_array(np.asarray(alt.zero_point).astype(dtype), f"{k}::zp"),
            numpy_helper.from_array(np.asarray(alt.qmin).astype(dtype), f"{k}::qmin"),
            numpy_helper.from_array(np.asarray(alt.qmax).astype(dtype), f"{k}::qmax")])
    if local:
        clones, outputs = local_clones(qmodel)
        graph.node.extend(clones)
        extra_outputs = list(extra_outputs) + outputs
    present = {o.name for o in graph.output}
    for t in extra_outputs:
        if t not in present:
            # a local clone's output has the type of the output it copies
            base = t[len(LOCAL_PREFIX):] if t.startswith(LOCAL_PREFIX) else t
            graph.output.append(helper.make_tensor_value_info(
                t, qmodel.value_types.get(base, onnx.TensorProto.FLOAT), None))
            present.add(t)
    return model


def constants_late(graph, inits, gates):
    """``graph``'s nodes with every node computed from constants only (weight gates, weight
    DQs, Constant; ``inits``: the initializer names, ``gates``: the :class:`Gates`, whose flags
    count as constants) moved to just before its first consumer; one that no node reads and
    that is no graph output is left out.

    Quantizers emit weight Q/DQ first. Left there, a dequantized weight would cross segment
    boundaries as a fed tensor, which onnxruntime cannot prepack; and a session whose weights
    pass through gates at run time (low-memory mode) computes them in graph order, so all at
    once: a 180 MiB convolution net's bypassed run held a copy of every weight (+240 MiB).
    """
    nodes = list(graph.node)  # one wrapper per node: emitted is keyed by identity
    constant = set(inits)
    deferred = {}  # output name -> node
    order, emitted = [], set()

    def emit(node):
        if id(node) in emitted:
            return
        emitted.add(id(node))
        for r in node_refs(node):
            if r in deferred:
                emit(deferred[r])
        order.append(node)

    for node in nodes:
        refs = node_refs(node)
        if node.op_type != "If" or gate_of(node) is not None:
            if all(r in constant for r in refs if not gates.is_feed(r)):
                constant.update(node.output)
                for o in node.output:
                    deferred[o] = node
                continue
        emit(node)
    # what is left unemitted computes from constants and no node reads it: kept for a graph
    # output only. Quantizers leave unread Constants behind (quantize_static, 188 of a Paddle
    # detector's 878), and at the end they made a segment of nothing but them, which
    # onnxruntime cannot load.
    outputs = {o.name for o in graph.output}
    for node in nodes:
        if outputs.intersection(node.output):
            emit(node)
    return order


# A node computing from constants only waits for its consumer's input when it reads a
# constant of at least this many elements (a weight), not for a shape or a scale of its own.
ANCHOR_ELEMENTS = 1 << 14
_NO_COPY = ("Identity", "Constant")  # ops whose output aliases or is small: nothing to wait for
_BOOL = onnx.TensorProto.BOOL
# what onnxruntime's CPU Expand takes (not bfloat16, 4-bit or float8 types)
_EXPANDABLE = {getattr(onnx.TensorProto, t) for t in ("FLOAT", "FLOAT16", "DOUBLE", "BOOL", "INT8", "UINT8", "INT16",
                                                      "UINT16", "INT32", "UINT32", "INT64", "UINT64")}


def anchored(nodes, inits, feeds=()):
    """``nodes`` in which each node that computes from constants only and reads a large one
    (a weight's gate, its Q/DQ, the lone DQ of an int8 weight) runs just before its first
    consumer, after the first run-time tensor that consumer reads: one of its small inputs
    becomes ``Expand(input, Slice(Shape(tensor), [0], [0]))``, the same value, later.

    ``inits``: ``{name: TensorProto}`` of the graph's initializers; ``feeds``: other names
    available before any node runs (a gated graph's flags). For low-memory sessions, which
    compute such nodes at run time (no constant folding): onnxruntime runs the ready node of
    lowest index first, and the nodes its fusions make get new, higher indices, so every
    weight a fused node reads was computed at the start of the run and held to its use
    (measured on a ViT-S with int8 weights behind lone DQs, every pair quantized: +96 MiB
    within a run; +28 MiB with onnxruntime's optimizations off)."""
    # only the initializers these nodes read: a segment of a 1500-node graph sized them all,
    # for every segment (a fifth of a ranking's time)
    read = {r for node in nodes for r in node_refs(node) if r in inits}
    sizes = {name: int(np.prod(inits[name].dims, dtype=np.int64)) for name in read}
    types = {name: inits[name].data_type for name in read}  # a feed is a boolean flag
    constant = read | set(feeds)
    made_by = {}  # tensor computed from constants only -> its node
    for node in nodes:
        if all(r in constant for r in node_refs(node)):
            constant.update(node.output)
            for o in node.output:
                made_by[o] = node
    out, done, anchors = [], set(), {}
    zero = "ptq_anchor::zero"

    def anchor(x):
        if x not in anchors:
            if not anchors:
                out.append(helper.make_node("Constant", [], [zero], value=numpy_helper.from_array(np.zeros(1, np.int64))))
            anchors[x] = f"ptq_anchor::{x}"
            out.append(helper.make_node("Shape", [x], [f"{anchors[x]}::shape"]))
            out.append(helper.make_node("Slice", [f"{anchors[x]}::shape", zero, zero], [anchors[x]]))
        return anchors[x]

    def emit(node, x):
        if id(node) in done:
            return
        done.add(id(node))
        refs = node_refs(node)
        for r in refs:
            if r in made_by:
                emit(made_by[r], x)
        root = x is not None and node.op_type not in _NO_COPY and not any(r in made_by for r in refs)
        if root and max((sizes.get(r, 0) for r in refs), default=0) >= ANCHOR_ELEMENTS:
            slot = min((k for k, i in enumerate(node.input) if types.get(i, _BOOL) in _EXPANDABLE),
                       key=lambda k: sizes.get(node.input[k], 1), default=None)
            if slot is not None:
                node = _copy(node)
                waited = f"{node.input[slot]}::after::{x}"
                out.append(helper.make_node("Expand", [node.input[slot], anchor(x)], [waited]))
                node.input[slot] = waited
        out.append(node)

    for node in nodes:
        if node.output and node.output[0] in made_by:
            continue  # computed when a consumer needs it
        refs = node_refs(node)
        x = next(r for r in refs if r not in constant)
        for r in refs:
            if r in made_by:
                emit(made_by[r], x)
        done.add(id(node))
        out.append(node)
    for node in nodes:  # what no run-time node reads (a constant model output)
        emit(node, None)
    return out


def _copy(node):
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def lowered(nodes):
    """``nodes`` with every gate on a 16-bit float tensor (fp16/bf16 graphs) turned into
    plain nodes: both branches' nodes, then ``Where(flag, quantized, bypassed)`` per output.

    Inside an If, a Q reads its input as stored, rounded to 16 bits; in the file, onnxruntime's
    CPU provider computes 16-bit float ops in float32 and drops the casts between them, so the
    same Q reads the unrounded value (measured on Model Optimizer's fp16 PP-OCRv4 detector:
    every pair quantized, If gates 0.9927 cosine to onnxruntime on the file, Where gates
    1.000000). In the main graph the Q/DQ get the provider's own treatment, whichever it is,
    at the cost of computing them when bypassed too, which is not free of effect (a Q reading
    a tensor keeps its writer in 16 bits): segments give configs of such gates a form of
    their own (:meth:`.segments.Segments.touched`). 32-bit gates stay Ifs."""
    out = []
    for node in nodes:
        if gate_of(node) is not None and low_precision(node):
            out += _as_where(node)
        else:
            out.append(node)
    return out


def quantized_nodes(node):
    """The nodes of gate ``node`` quantized for good: its quantized branch inline, writing
    the gate's outputs (constant weights then fold and fuse as in the file; measured on Model
    Optimizer's fp16 transformer: a MatMul whose weight comes through a gate is not fused
    with its bias Add into a Gemm, 0.9986 cosine to the file fully quantized)."""
    branch = _branches(node)["then_branch"]
    rename = {o.name: node.output[k] for k, o in enumerate(branch.output)}
    nodes = []
    for n in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        for k, o in enumerate(copy.output):
            copy.output[k] = rename.get(o, o)
        nodes.append(copy)
    return nodes


def _branches(node):
    """An If node's ``{"then_branch": graph, "else_branch": graph}``."""
    return {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}


def low_precision(node):
    """Whether gate ``node`` passes a 16-bit float tensor (see :func:`lowered`)."""
    return any(o.type.tensor_type.elem_type in HALF_TYPES for o in _branches(node)["else_branch"].output)


def _as_where(node):
    """An If's branches inlined, nested Ifs (an alternative's) too, joined by Where."""
    flag = node.input[0]
    branches = _branches(node)
    nodes = []
    for key in ("then_branch", "else_branch"):
        for n in branches[key].node:
            nodes += _as_where(n) if n.op_type == "If" else [n]
    nodes += [helper.make_node("Where", [flag, t.name, e.name], [o], name=f"{node.name}::where::{k}")
              for k, (t, e, o) in enumerate(zip(branches["then_branch"].output, branches["else_branch"].output,
                                                 node.output))]
    return nodes


def _float_type(qmodel, c):
    """The float type a calibration node's float side computes in (float32 or float16...)."""
    for t in (c.float_weight, c.input, *c.outputs):
        if t in qmodel.float_weights:
            return onnx.helper.np_dtype_to_tensor_dtype(qmodel.float_weights[t].dtype)
        if t and qmodel.is_float_tensor(t):
            return qmodel.value_types[t]
    return onnx.TensorProto.FLOAT


def _tensor_type(elem_type):
    return onnx.helper.make_tensor_type_proto(elem_type, None)


def _gate(qmodel, gates, c):
    """The If node that computes ``c``'s DQ outputs, quantized or bypassed by its flag."""
    then_nodes, then_out, else_nodes, else_out = [], [], [], []
    renamed = {}
    if c.q_node is not None and not c.fused:
        # every output: a dynamic quantizer's scale and zero point feed the DQ too
        q, renamed = _renamed_copy(c.q_node, "ptq_t::")
        then_nodes += _quantizing(qmodel, c, q) + _between(c, "ptq_t::", renamed)
    for dq in c.dq_nodes:
        d = onnx.NodeProto()
        d.CopyFrom(dq)
        for k, i in enumerate(d.input):
            d.input[k] = renamed.get(i, i)
        d.output[0] = f"ptq_t::{dq.output[0]}"
        then_nodes.append(d)
        elem = qmodel.value_types.get(dq.output[0]) or onnx.helper.np_dtype_to_tensor_dtype(c.scale.dtype)
        then_out.append(helper.make_value_info(d.output[0], _tensor_type(elem)))
        else_nodes += bypass_nodes(c, f"ptq_e::{dq.output[0]}", elem)
        else_out.append(helper.make_value_info(f"ptq_e::{dq.output[0]}", _tensor_type(elem)))
    outputs = list(c.outputs)
    if c.folded and c.unfolded:  # the same values quantized; bypassed, without the fold
        dqs = [n for n in then_nodes if n.output[0].startswith("ptq_t::") and n.output[0][7:] in outputs]
        for o, t, e, dq in zip(list(outputs), list(then_out), list(else_out), dqs):
            # a second DequantizeLinear, not an Identity of the first: inlined, a branch's
            # outputs take the gate's names and an Identity would read a name gone
            copy = onnx.NodeProto()
            copy.CopyFrom(dq)
            copy.output[0], copy.name = f"ptq_tu::{o}", f"{dq.name}{UNFOLDED}"
            then_nodes.append(copy)
            then_out.append(helper.make_value_info(f"ptq_tu::{o}", t.type))
            else_nodes += bypass_nodes(c, f"ptq_e::{o}{UNFOLDED}", e.type.tensor_type.elem_type)
            else_out.append(helper.make_value_info(f"ptq_e::{o}{UNFOLDED}", e.type))
            outputs.append(o + UNFOLDED)
    then_g = helper.make_graph(then_nodes, f"ptq_q_{c.name}", [], then_out)
    if c.name in gates.alternatives:
        then_g = _alternative_branch(gates, c, then_g)
    else_g = helper.make_graph(else_nodes, f"ptq_f_{c.name}", [], else_out)
    return helper.make_node("If", [gates.flags[c.name]], outputs, name=f"{GATE_PREFIX}{c.name}",
                            then_branch=then_g, else_branch=else_g)


_INTEGER_TYPES = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def _quantizing(qmodel, c, q):
    """Nodes computing QuantizeLinear ``q`` of calibration node ``c``: ``[q]`` itself, except
    for a float32 weight quantized per channel along its last axis (MatMul weights), which
    onnxruntime quantizes one element at a time: a 2048x2048 weight takes 74 ms on axis 1
    against 1.2 ms on axis 0, paid by every session that folds the pair and, in low-memory
    mode, by every run quantizing it. There the same arithmetic as plain operators (divide,
    round half to even, add the zero point, saturate, as onnxruntime's kernel does) takes
    2 ms and gives the same integers (tests/test_engine.py checks ties and saturation)."""
    if c.kind != "weight" or c.block_size or q.op_type != "QuantizeLinear" or q.domain not in ("", "ai.onnx"):
        return [q]
    shape = qmodel.shapes.get(q.input[0])
    scale = qmodel.constant(q.input[1])
    zero_point = qmodel.constant(q.input[2]) if len(q.input) > 2 and q.input[2] else None
    if (not shape or len(shape) < 2 or c.axis not in (len(shape) - 1, -1) or scale is None
            or scale.dtype != np.float32 or scale.size != shape[-1] or zero_point is None
            or zero_point.size != scale.size or qmodel.value_types.get(q.input[0]) != onnx.TensorProto.FLOAT
            or onnx.helper.np_dtype_to_tensor_dtype(zero_point.dtype) not in _INTEGER_TYPES):
        return [q]
    info = np.iinfo(zero_point.dtype)
    p = f"ptq_wq::{q.output[0]}"

    def const(name, value):
        return helper.make_node("Constant", [], [f"{p}::{name}"],
                                value=numpy_helper.from_array(np.asarray(value, np.float32), f"{p}::{name}"))

    return [const("scale", scale.reshape(-1)), const("zp", zero_point.astype(np.float32).reshape(-1)),
            const("lo", info.min), const("hi", info.max),
            *_on_grid(q.input[0], f"{p}::scale", f"{p}::zp", f"{p}::lo", f"{p}::hi", f"{p}::c"),
            helper.make_node("Cast", [f"{p}::c"], [q.output[0]], to=onnx.helper.np_dtype_to_tensor_dtype(zero_point.dtype))]


def _on_grid(src, scale, zero_point, qmin, qmax, out):
    """Nodes computing ``out``: ``src`` on the integer grid, as float (divide by the scale,
    round half to even like QuantizeLinear, add the zero point, saturate to [qmin, qmax])."""
    return [helper.make_node("Div", [src, scale], [f"{out}::d"]),
            helper.make_node("Round", [f"{out}::d"], [f"{out}::r"]),
            helper.make_node("Add", [f"{out}::r", zero_point], [f"{out}::z"]),
            # one Clip, not Max and Min: a pass less over a weight (0.105 vs 0.145 s per fully
            # quantized run of the 192 MiB MatMul stack in low-memory mode)
            helper.make_node("Clip", [f"{out}::z", qmin, qmax], [out])]


def _between(c, prefix, renamed, suffix=""):
    """Copies of ``c``'s integer nodes between its Q and DQs (a Clip), reading and writing
    ``prefix``-renamed tensors; ``renamed`` (``{old: new}``) takes their outputs too."""
    nodes = []
    for node in c.between:
        copy, outputs = _renamed_copy(node, prefix)
        copy.name += suffix
        for k, i in enumerate(copy.input):
            copy.input[k] = renamed.get(i, i)
        renamed.update(outputs)
        nodes.append(copy)
    return nodes


def _renamed_copy(node, prefix):
    """A copy of ``node`` whose outputs carry ``prefix``, and ``{old name: new name}``."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    renamed = {}
    for k, o in enumerate(node.output):
        if o:
            renamed[o] = copy.output[k] = f"{prefix}{o}"
    return copy, renamed


def _alternative_branch(gates, c, original):
    """Wrap the quantized branch in an If choosing the alternative fake-quant by its flag.

    The alternative is plain arithmetic (Round is half-to-even like QuantizeLinear), so it
    works at any opset and any bit width.
    """
    k = gates.alt_flags[c.name]
    src = c.float_weight or c.input
    out_nodes, outs, values = [], [], []
    for j, _ in enumerate(c.dq_nodes):
        p = f"ptq_a::{c.name}::{j}"
        elem = original.output[j].type.tensor_type.elem_type
        wide = _alternative_type(elem)
        # a 16-bit float holds whole numbers up to 2048 only (no 16-bit codes): cast in, and back
        # to the graph's type, as a DequantizeLinear with a half scale gives it
        x, y = (f"{p}::x", f"{p}::w") if wide != elem else (src, f"{p}::v")
        if wide != elem:
            out_nodes.append(helper.make_node("Cast", [src], [x], to=wide))
        out_nodes += [
            *_on_grid(x, f"{k}::scale", f"{k}::zp", f"{k}::qmin", f"{k}::qmax", f"{p}::c"),
            helper.make_node("Sub", [f"{p}::c", f"{k}::zp"], [f"{p}::s"]),
            helper.make_node("Mul", [f"{p}::s", f"{k}::scale"], [y]),
        ]
        if wide != elem:
            out_nodes.append(helper.make_node("Cast", [y], [f"{p}::v"], to=elem))
        values.append(f"{p}::v")
    # each output an Identity of an inner value: inlined, outputs take the gate's names; the
    # outputs past the DQs' are the copies a pair's readers without its fold read
    for j, o in enumerate(original.output):
        out_nodes.append(helper.make_node("Identity", [values[j % len(values)]], [f"ptq_a::{c.name}::{j}::y"]))
        outs.append(helper.make_value_info(f"ptq_a::{c.name}::{j}::y", o.type))
    alt_g = helper.make_graph(out_nodes, f"ptq_alt_{c.name}", [], outs)
    wrapped = [helper.make_value_info(f"ptq_w::{c.name}::{j}", o.type) for j, o in enumerate(original.output)]
    # named: inlined as Where nodes (half graphs, see lowered), an unnamed If named them all alike
    node = helper.make_node("If", [k], [o.name for o in wrapped], name=f"ptq_alt_if::{c.name}", then_branch=alt_g,
                            else_branch=original)
    return helper.make_graph([node], f"ptq_qa_{c.name}", [], wrapped)


def _alternative_type(elem):
    """The float type an alternative's arithmetic runs in for a tensor of type ``elem``:
    float32 for the 16-bit floats, whose whole numbers stop at 2048 (float16) or 256."""
    return onnx.TensorProto.FLOAT if elem in HALF_TYPES else elem


def local_clones(qmodel, names=None):
    """``(nodes, outputs)``: for every normal node fed by calibration nodes, directly or
    through Casts between float types (those named in ``names`` only, when given), a clone fed
    by its inputs quantized from their float values, with the nodes that quantize them (every
    pair of a requantize chain, and copies of those Casts); ``outputs``: the clones' float
    outputs, to expose.

    A node whose own pairs write model outputs (:meth:`.QuantModel.delivered`, a detector
    head's Concat) is read where the model delivers them: its clone's output passes through
    copies of those pairs (and of the Casts between float types after or before them), named
    after the model output (``ptq_local::<output>``), so that its local error holds its whole
    own loss, like for like with the point the curves read there; so is one whose output
    Casts between float types alone make a model output, through copies of those Casts. One
    that reads no pair (float inputs) but owns pairs gets no clone: its own output, float,
    passes through those copies.

    Run with every flag off, the clones give each node's *local* error in one pass.
    """
    by_output = {o: c for c in qmodel.calibration.values() for o in c.outputs}
    protos = {p.name: p for p in qmodel.model.graph.node}
    nodes, local_in, outputs = [], {}, []
    # a model output a node's own pairs deliver is that node's local value: a Cast between
    # float types writing it (reading the pair) gets no clone of its own, whose output would
    # take the same name (curves read no Cast's local error: it passes its pairs on)
    delivered = {n: qmodel.delivered(n) for n in qmodel.normal}
    taken = {t for ts in delivered.values() for t in ts}

    def pair_copy(c, dq, src, tag, out):
        """Nodes computing ``out``: a copy of pair ``c``'s quantizing nodes and of its DQ ``dq``
        reading ``src``; their tensors and names carry ``tag``."""
        made, renamed = [], {}
        if c.q_node is not None and not c.fused:
            q, renamed = _renamed_copy(c.q_node, f"{tag}::")
            q.name = f"{tag}::{q.name}"
            q.input[0] = src
            made += _quantizing(qmodel, c, q) + _between(c, f"{tag}::", renamed, f"::{tag}")
        d = onnx.NodeProto()
        d.CopyFrom(dq)
        d.name = f"{tag}::{dq.name}"
        if c.fused:
            d.input[0] = src
        for j, name in enumerate(d.input):
            d.input[j] = renamed.get(name, name)
        d.output[0] = out
        return made + [d]

    def quantized(i):
        """The name of tensor ``i`` computed from its pair's float input, or None where no pair
        feeds it (directly or through Casts between float types)."""
        if i in local_in:
            return local_in[i]
        c, cast = by_output.get(i), qmodel.producer.get(i)
        if c is not None:
            dq = next(d for d in c.dq_nodes if d.output[0] == i)
            # a pair that quantizes another pair's output again (a requantize chain) reads that
            # pair quantized too: the operator ranking counts the whole chain for the node
            src = quantized(c.input) if qmodel.requantizes(c.name) is not None else c.float_weight or c.input
            nodes.extend(pair_copy(c, dq, src, f"ptq_lq::{i}", f"ptq_lq::{i}"))
        elif cast is not None and qmodel.passes_on(cast.name) and quantized(cast.input[0]) is not None:
            # a float16 graph computing the node in float32 reads its pair through this Cast
            d = onnx.NodeProto()
            d.CopyFrom(cast)
            d.name = f"ptq_lcast::{i}"
            d.input[0] = local_in[cast.input[0]]
            d.output[0] = f"ptq_lq::{i}"
            nodes.append(d)
        else:
            return None
        local_in[i] = nodes[-1].output[0]
        return local_in[i]

    def delivering(t, clone_of, made):
        """Tensor ``t`` downstream of a clone (``clone_of``: ``{output: clone's output}``) through
        the node's own output pairs and Casts between float types, computed by nodes appended to
        ``made``; None where ``t`` is none of those."""
        if t in clone_of:
            return clone_of[t]
        c, cast = by_output.get(t), qmodel.producer.get(t)
        if c is not None:
            src = delivering(c.input, clone_of, made)
            if src is None:
                return None
            dq = next(d for d in c.dq_nodes if d.output[0] == t)
            made += _fixed_parameters(qmodel, pair_copy(c, dq, src, f"ptq_lo::{t}", f"ptq_lo::{t}"))
        elif cast is not None and qmodel.passes_on(cast.name):
            src = delivering(cast.input[0], clone_of, made)
            if src is None:
                return None
            d = onnx.NodeProto()
            d.CopyFrom(cast)
            d.name = f"ptq_locast::{t}"
            d.input[0] = src
            d.output[0] = f"ptq_lo::{t}"
            made.append(d)
        else:
            return None
        return made[-1].output[0]

    def deliver(name, clone_of):
        """Node ``name``'s model outputs through copies of its own pairs from ``clone_of``
        (``{output: its local value}``), exposed under the model outputs' names."""
        for t in delivered.get(name, ()):
            made = []
            if delivering(t, clone_of, made) is not None and made:
                made[-1].output[0] = f"{LOCAL_PREFIX}{t}"
                nodes.extend(made)
                outputs.append(made[-1].output[0])

    for n in qmodel.normal.values():
        if names is not None and n.name not in names:
            continue
        if not qmodel.has_local_error(n.name) or taken.intersection(n.outputs):
            continue
        if not qmodel.reads_pairs(n.name):
            # float inputs (a Concat of float tensors behind its pair): the node's own output,
            # run with every flag off, is its clone's; only its own output pairs are copied
            deliver(n.name, {o: o for o in n.outputs if o})
            continue
        proto = protos[n.name]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in proto.attribute):
            continue
        clone = onnx.NodeProto()
        clone.CopyFrom(proto)
        clone.name = f"{LOCAL_PREFIX}{n.name}"
        for k, i in enumerate(proto.input):
            if i and quantized(i) is not None:
                clone.input[k] = local_in[i]
        for k, o in enumerate(proto.output):
            if o:
                clone.output[k] = f"{LOCAL_PREFIX}{o}"
        nodes.append(clone)
        outputs += [o for o in clone.output if o and qmodel.is_float_tensor(o[len(LOCAL_PREFIX):])]
        deliver(n.name, {o: clone.output[k] for k, o in enumerate(proto.output) if o})
    return nodes, outputs


def _fixed_parameters(qmodel, made):
    """``made`` (copies of a pair's nodes) with each scale or zero point that a node of the
    graph computes read from a Constant of its value instead: a pair after its node may read
    a Constant written after that node, which a segment holding the node's clone lacks."""
    produced = {o for node in made for o in node.output}
    out = []
    for node in made:
        for k, i in enumerate(node.input):
            if k == 0 or not i or i in produced or i not in qmodel.producer:
                continue
            value = qmodel.constant(i)
            if value is not None:
                name = f"{node.name}::{k}"
                out.append(helper.make_node("Constant", [], [name], name=name,
                                            value=numpy_helper.from_array(np.asarray(value), name)))
                node.input[k] = name
        out.append(node)
    return out

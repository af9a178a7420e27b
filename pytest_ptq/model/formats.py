"""onnxruntime's other two formats, rewritten into QDQ form before the model is parsed.

* **QOperator** (``quantize_static(quant_format=QuantFormat.QOperator)``, the ONNX zoo's
  ``-int8`` models): integer ops such as ``QLinearConv`` read and write quantized tensors
  and carry the scales of their inputs and output. Each becomes its QDQ form: a
  DequantizeLinear of every quantized input (a lone DQ of an integer weight or int32 bias),
  the float op, and a QuantizeLinear of its output with the op's output scale and zero
  point, writing the integer tensor the op wrote. Ops that move quantized values without
  computing (MaxPool, Reshape, Transpose, ...) run on the dequantized tensor instead, and a
  Q is added after them only where they compute new values (Resize with interpolation).
* **dynamic** (``quantize_dynamic``): ``DynamicQuantizeLinear`` computes an activation's
  scale and zero point on every run; it feeds ``ConvInteger`` / ``MatMulInteger`` whose int32
  result is cast and multiplied by the scales' product. The quantizer stays, followed by a
  DequantizeLinear of its own outputs (a *dynamic* calibration node); the integer op, its
  Cast and scale Mul become the float op on dequantized inputs (and Conv takes back the bias
  the quantizer moved into an Add). onnxruntime's fused forms (``MatMulIntegerToFloat``,
  ``DynamicQuantizeMatMul``, ``QAttention``, ``DynamicQuantizeLSTM``) are unfused likewise.
* **weight-only** (``com.microsoft`` ``MatMulNBits``, written by onnxruntime's
  ``MatMulNBitsQuantizer`` in its default QOperator format, onnxruntime-genai's model builder,
  Olive, Neural Compressor): 2/4/8-bit codes packed in uint8 blocks along K, one scale (and
  zero point) per block and column. It becomes ``DequantizeLinear(codes, scale, zero point,
  axis=0, block_size)`` of the ``[K, N]`` weight, the MatMul, and an Add of its bias input:
  what ``MatMulNBitsQuantizer(quant_format=QuantFormat.QDQ)`` writes. Without zero points the
  codes are stored signed (``int4``, no zero point, as that QDQ form stores symmetric
  weights). Block-wise DequantizeLinear and int4 take opset 21 (int2: 25), so an older model's
  opset is raised: in place where no op it uses changed meaning since, else with onnx's
  version converter. The rewrite simulates the weights only: ``accuracy_level=4`` also
  quantizes the input to int8 inside the CPU kernel, which a note says.

Integer tensors keep their names, float tensors take the float model's names where
onnxruntime's ``_quantized`` suffix gives them away, and the float op takes the name of the
node it replaces less onnxruntime's ``_quant`` suffix (``_Q4``/``_Q8`` for MatMulNBits;
onnxruntime-genai's ``.../MatMulNBits`` becomes ``.../MatMul``), so names read as in the float model
(and as ``nodes_to_exclude`` wants them). ``com.microsoft`` ``FusedConv`` / ``FusedGemm`` /
``FusedMatMul`` are split into the ops onnxruntime fused, so that each matches the float model.

A model already in QDQ form is returned as it is, but for integer codes that nodes move
before their DequantizeLinear where the parser cannot read them as a constant (an embedding
table's codes -> Gather by ids -> DequantizeLinear, beside Q/DQ pairs): those are dequantized
before the nodes that move them, as in a dynamic file, so that the table is a weight; its pairs
stay the parser's. Anything this cannot rewrite is one sentence naming the op and the format,
and what to do in that format's terms.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx.version_converter
from onnx import TensorProto, helper, numpy_helper

from ..errors import PTQError
from . import moved
from .graph import LAYOUT_OPS, attribute, declared_dims, node_refs, sort_topologically

QDQ, QOPERATOR, DYNAMIC, MIXED = "QDQ", "QOperator", "dynamic", "mixed"
WEIGHT_ONLY = "weight-only"  # onnxruntime's block-wise weight-only ops

# QOperator ops: (quantized inputs as (tensor, scale, zero point) positions, output scale
# and zero point positions, the float op). Positions beyond the node's inputs are absent.
_UNARY = ([(0, 1, 2)], (3, 4))
QLINEAR = {
    "QLinearConv": ([(0, 1, 2), (3, 4, 5)], (6, 7), "Conv"),
    "QLinearConvTranspose": ([(0, 1, 2), (3, 4, 5)], (6, 7), "ConvTranspose"),
    "QLinearMatMul": ([(0, 1, 2), (3, 4, 5)], (6, 7), "MatMul"),
    "QGemm": ([(0, 1, 2), (3, 4, 5)], (7, 8), "Gemm"),
    "QLinearAdd": ([(0, 1, 2), (3, 4, 5)], (6, 7), "Add"),
    "QLinearMul": ([(0, 1, 2), (3, 4, 5)], (6, 7), "Mul"),
    "QLinearSigmoid": (*_UNARY, "Sigmoid"),
    "QLinearLeakyRelu": (*_UNARY, "LeakyRelu"),
    "QLinearSoftmax": (*_UNARY, "Softmax"),
    "QLinearGlobalAveragePool": (*_UNARY, "GlobalAveragePool"),
    "QLinearAveragePool": (*_UNARY, "AveragePool"),
    "QLinearConcat": (None, (0, 1), "Concat"),  # inputs: Y_scale, Y_zp, then (X, scale, zp) triples
}
# Integer ops whose int32 result is cast and multiplied by the product of the input scales.
INTEGER = {"ConvInteger": "Conv", "MatMulInteger": "MatMul"}
# onnxruntime's fused forms of dynamic quantization.
FUSED_DYNAMIC = ("DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention",
                 "DynamicQuantizeLSTM")
# onnxruntime's weight-only ops (MatMulNBits: codes packed in uint8 blocks, rewritten here)
WEIGHT_ONLY_OPS = ("MatMulNBits", "MatMulBnb4", "GatherBlockQuantized", "MatMulFpQ4")
# Quantized ops seen in the wild that this module does not rewrite (named in the error, with
# why where "is a quantized op" would not say it)
UNSUPPORTED = ("QEmbedLayerNormalization", "QMoE", "MatMulBnb4", "GatherBlockQuantized", "MatMulFpQ4", "QuantizeBFP",
               "DequantizeBFP", "QuantizeWithOrder", "DequantizeWithOrder", "MatMulInteger16")
_WHY = {
    "MatMulBnb4": "is bitsandbytes' FP4/NF4 weight format, a lookup table that DequantizeLinear cannot express",
    "GatherBlockQuantized": "is a block-quantized embedding table",
    "MatMulFpQ4": "is Neural Compressor's older weight-only op, whose blob packs codes and scales in MLAS's own layout",
    "QuantizeBFP": "is block floating point (BFP) quantization, which QuantizeLinear/DequantizeLinear cannot express",
    "DequantizeBFP": "is block floating point (BFP) quantization, which QuantizeLinear/DequantizeLinear cannot express",
    "QuantizeWithOrder": "is the CUDA ordered-layout quantization of onnxruntime's QOrdered ops",
    "DequantizeWithOrder": "is the CUDA ordered-layout quantization of onnxruntime's QOrdered ops",
    "MatMulInteger16": "multiplies int16 tensors with no scales to read them by",
}
_FIX = {
    "MatMulBnb4": "quantize the float model with onnxruntime's MatMulNBitsQuantizer instead (int4 blocks, in its "
                  "default MatMulNBits form or in QDQ format), which pytest-ptq analyses",
    "GatherBlockQuantized": "quantize the embedding's Gather with quantize_static(..., "
                            "quant_format=QuantFormat.QDQ), or quantize the float model again with the embedding left in "
                            "float (MatMulNBitsQuantizer's default op_types_to_quantize, MatMul only), whose MatMulNBits "
                            "nodes pytest-ptq analyses",
    "MatMulFpQ4": "export it with MatMulNBits (Neural Compressor's current weight-only export, or onnxruntime's "
                  "MatMulNBitsQuantizer), which pytest-ptq analyses",
}
# Every op that computes on quantized values or makes them, in any format
QUANTIZED_OPS = frozenset(("QuantizeLinear", "DequantizeLinear", *QLINEAR, *INTEGER, *FUSED_DYNAMIC, *WEIGHT_ONLY_OPS,
                           *UNSUPPORTED))
# ops of the standard domain whose every revision from opset 13 to 25 only took more types or
# optional attributes/inputs whose defaults keep the earlier meaning: raising the opset of a
# model that uses them changes nothing
_WIDENED = frozenset((
    "Cast", "CastLike", "Constant", "ConstantOfShape", "QuantizeLinear", "DequantizeLinear", "Flatten", "Identity",
    "If", "Loop", "Scan", "Pad", "Reshape", "Shape", "Size", "Squeeze", "Unsqueeze", "Transpose", "Equal",
    "Resize", "ScatterElements", "ScatterND", "AveragePool", "MaxPool", "Conv", "ConvTranspose", "GlobalAveragePool",
    "GlobalMaxPool", "Dropout", "LSTM", "GRU", "RNN", "Elu", "Selu", "HardSigmoid", "HardSwish", "Softplus",
    "Softsign", "ThresholdedRelu", "Mish", "InstanceNormalization", "LpNormalization", "LpPool", "EyeLike",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Sin", "Cos", "Tan", "Asin", "Acos",
    "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Round", "Det", "Multinomial", "Bernoulli", "MaxRoiPool",
    "MaxUnpool"))

# Ops that only move quantized values (their output is on the input's grid): they run on the
# dequantized tensor and their output keeps the input's scale and zero point.
MOVING = {"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Split", "Gather",
          "GatherElements", "GatherND", "Slice", "Pad", "Identity", "Expand", "Tile", "DepthToSpace",
          "SpaceToDepth", "Concat", "ArgMax", "ArgMin", "TopK", "ReduceMax", "ReduceMin", "Resize", "Upsample",
          "GlobalMaxPool", "Dropout"}
_INDEX_ONLY = {"ArgMax", "ArgMin"}  # read quantized values, write indices

SHAPE_ONLY = {"Shape", "Size"}  # read only the shape of a quantized tensor, which quantizing never changes
_CODES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT4,
          TensorProto.UINT4)

# The integer reader's input (by position) whose several scales run along an axis other than 0,
# as onnxruntime's kernels read them: a ConvTranspose weight's output channels (axis 1), a MatMul
# B's columns (its last axis; a QGemm's B without transB is [K, N]); others read along axis 0
_CHANNEL_AXIS = {"QLinearConvTranspose": (3, 1), "QLinearMatMul": (3, -1), "QGemm": (3, 1),
                 "MatMulInteger": (1, -1), "MatMulIntegerToFloat": (1, -1), "DynamicQuantizeMatMul": (1, -1),
                 "QAttention": (1, -1)}


def _channel_axis(node, position):
    """The axis (negative: from the last) along which integer op ``node`` reads several scales
    of its input at ``position``."""
    at, axis = _CHANNEL_AXIS.get(node.op_type, (None, 0))
    if position != at:
        return 0
    if node.op_type == "QGemm" and attribute(node, "transB", 0):
        return 0  # B stored [N, K]
    return axis


_FUSED = ("FusedConv", "FusedGemm", "FusedMatMul")  # com.microsoft fusions split back into their ops

_ACTIVATIONS = {"Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "Clip", "Elu", "Selu", "Softplus",
                "Softsign", "ThresholdedRelu"}


def unsupported(op):
    """True for a quantized op that :func:`to_qdq` cannot rewrite."""
    return op in UNSUPPORTED or (op.startswith("QLinear") and op not in QLINEAR) or op.startswith("QOrdered")


@dataclasses.dataclass
class Rewrite:
    """The QDQ-form model, the format found, and sentences for the user."""

    model: onnx.ModelProto
    format: str  # QDQ, QOperator, dynamic or mixed
    parts: tuple  # the formats a mixed model mixes
    notes: list
    # {float tensor of the rewrite: the float model's name for it}, where the file's own name
    # was taken (a DequantizeLinear after the integer op kept it): what a remedy must name
    float_names: dict = dataclasses.field(default_factory=dict)
    # a QDQ file's DequantizeLinear nodes whose codes the rewrite dequantized before the nodes
    # that move them: the graph departs from the file's there
    moved: list = dataclasses.field(default_factory=list)

    @property
    def label(self):
        """``mixed (QDQ + QOperator)``, or the format alone."""
        return f"{MIXED} ({' + '.join(self.parts)})" if self.format == MIXED else self.format


def formats_of(model):
    """The quantization formats ``model`` uses, in a fixed order (empty for a float model)."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    found, integer_tables, laid_out_weights = set(), False, False
    for n in graph.node:
        op = n.op_type
        if op in WEIGHT_ONLY_OPS:
            found.add(WEIGHT_ONLY)
        elif op in QLINEAR or unsupported(op):
            found.add(QOPERATOR)
        elif op in FUSED_DYNAMIC:
            found.add(DYNAMIC)
        elif op in INTEGER:
            src, table = _source(n.input[0], producer, inits)
            if table:
                # an integer table moved into it (quantize_dynamic's embedding Gather): no format of its own
                integer_tables = True
            else:
                found.add(DYNAMIC if src is not None and src.op_type == "DynamicQuantizeLinear" else QOPERATOR)
        elif op.endswith("DequantizeLinear") and n.input[0] in inits:
            # a weight in QDQ form: a lone DQ of an integer initializer read by a float op
            if any(not c.op_type.endswith("QuantizeLinear") for c in consumers.get(n.output[0], ())):
                found.add(QDQ)
        elif op.endswith("DequantizeLinear") and _laid_out_codes(n.input[0], producer, inits):
            # a weight in QDQ form whose codes are stored in another layout (Transpose, Reshape
            # before the DQ): the parser reads them laid out as constants, no rewrite needed
            if any(not c.op_type.endswith("QuantizeLinear") for c in consumers.get(n.output[0], ())):
                laid_out_weights = True
        elif op.endswith("DequantizeLinear") and _source(n.input[0], producer, inits)[1]:
            if _read_at_run_time(_moves(n.input[0], producer), inits, producer):
                integer_tables = True  # quantize_dynamic's embedding, dequantized after a Gather and a Transpose
            else:  # a weight's codes moved by constants alone (a Gather of fixed indices): static
                laid_out_weights = True
        elif op.endswith("DequantizeLinear") and n.input[0] in producer:
            q = producer[n.input[0]]
            if q.op_type.endswith("QuantizeLinear") and not q.op_type.endswith("DequantizeLinear") and any(
                    c.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm")
                    for c in consumers.get(n.output[0], ())):
                found.add(QDQ)
    if integer_tables and not found:
        found.add(DYNAMIC)  # the rewrite dequantizes the laid-out weights with the tables
    elif laid_out_weights:
        found.add(QDQ)
    return tuple(f for f in (QDQ, QOPERATOR, DYNAMIC, WEIGHT_ONLY) if f in found)


def _source(tensor, producer, inits):
    """``(node, moved table)``: the node that made ``tensor`` before ops that only move values
    (None for an initializer or input), and whether the first of those moves an initializer
    (an embedding table's Gather, then a Transpose...)."""
    src = producer.get(tensor)
    while src is not None and src.op_type in MOVING and src.input and src.input[0] not in inits:
        src = producer.get(src.input[0])
    return src, src is not None and src.op_type in MOVING and bool(src.input) and src.input[0] in inits


def _moves(tensor, producer):
    """The nodes that move values from an initializer into ``tensor`` (see :func:`_source`),
    first to last."""
    chain, node = [], producer.get(tensor)
    while node is not None and node.op_type in MOVING and node.input:
        chain.append(node)
        node = producer.get(node.input[0])
    return chain[::-1]


def _read_at_run_time(nodes, inits, producer):
    """Whether any of ``nodes`` reads a further input computed at run time (a Gather's ids)."""
    return any(i and i not in inits and getattr(producer.get(i), "op_type", "") != "Constant"
               for n in nodes for i in n.input[1:])


def _moved_codes(graph):
    """``[(DequantizeLinear node, the nodes before it)]`` for each DequantizeLinear of
    ``graph`` reading an integer initializer through nodes that move values (an embedding
    table's Gather by ids, a Gather of fixed indices, then Transposes...) where the parser
    cannot compute its codes as a constant (:func:`_laid_out_codes`): what the rewrite of a
    QDQ file dequantizes before those nodes, so that the initializer is a weight."""
    inits = {i.name for i in graph.initializer}
    codes = {i.name for i in graph.initializer if i.data_type in _CODES}  # those the walk dequantizes
    producer = {o: n for n in graph.node for o in n.output}
    found = [(n, _moves(n.input[0], producer)) for n in graph.node
             if n.op_type.endswith("DequantizeLinear") and n.input[0] not in inits
             and not _laid_out_codes(n.input[0], producer, inits) and _source(n.input[0], producer, inits)[1]]
    return [(n, chain) for n, chain in found if chain[0].input[0] in codes]


def _laid_out_codes(tensor, producer, inits):
    """Whether ``tensor`` is an integer initializer laid out by shape-only ops alone
    (Identity, Transpose, Reshape, Squeeze, Unsqueeze, Flatten) whose other inputs are
    constants: a value the parser computes as a constant (see ``QuantModel.constant``)."""
    node = producer.get(tensor)
    if node is None or node.op_type not in ("Identity", *LAYOUT_OPS) or not node.input:
        return False
    if any(i and i not in inits and getattr(producer.get(i), "op_type", "") != "Constant" for i in node.input[1:]):
        return False  # a shape computed at run time
    return node.input[0] in inits or _laid_out_codes(node.input[0], producer, inits)


def _axis_before(node, axis, dims, reader):
    """Channel axis ``axis`` of moving ``node``'s output as its input lays it out (None stays
    None, a sentence stays as it is); ``dims``: a tensor's dims (None each where open, None
    where unknown); ``reader``: the op type that reads the channels downstream. The channels
    stay on one axis through an Identity, a Transpose with its perm, a Gather along another
    axis, and a Reshape, Squeeze, Unsqueeze or Flatten that keeps the channel axis a dimension
    of its own; elsewhere the answer is a sentence saying why the channels cannot be followed
    back onto the constant."""
    if axis is None or isinstance(axis, str) or node.op_type == "Identity":
        return axis
    what = f"a per-channel {reader} reads it after a {node.op_type} {node.name!r}"
    out, data = dims(node.output[0]), dims(node.input[0])
    if node.op_type == "Transpose":
        perm = attribute(node, "perm")
        if perm is None:  # the dims reversed, of the rank either side declares
            rank = len(data) if data is not None else (len(out) if out is not None else None)
            if rank is None:
                return f"{what}, whose reversed dims are of a rank the tool does not know"
            perm = list(range(rank))[::-1]
        return int(perm[axis % len(perm)])
    if node.op_type == "Gather" and len(node.input) > 1:
        indices = dims(node.input[1])
        if data is None or indices is None:
            return f"{what}, whose input or indices have a rank the tool does not know"
        along, picked = int(attribute(node, "axis", 0)) % len(data), len(indices)
        axis %= len(data) + picked - 1
        if axis < along:
            return axis
        if axis >= along + picked:
            return axis - picked + 1
        return (f"{what} along its channel axis: each of its output channels is whichever stored channel the "
                "indices pick, so its scale belongs to no one stored channel")
    if node.op_type in LAYOUT_OPS and out is not None and None not in out:
        _, before = moved.undo(node, out, axis, data)
        if before is not None:
            return before
        return (f"{what} that merges or splits its channel axis (axis {axis % len(out)} of {out}, from "
                f"{data})")
    return f"{what}, whose channels the tool does not follow back onto the constant"


# what to do where a per-channel reader's channels cannot be followed back onto its codes
_AXIS_FIX = ("dequantize the stored codes along their own channel axis before that node in the export (a "
             "DequantizeLinear of the initializer), or store them as their per-channel reader reads them")


def to_qdq(model, source="the model", arrays=None):
    """``model`` in QDQ form, as a :class:`Rewrite`: its graph is rewritten in place (pass a
    copy of the user's model); ``source`` names it in messages; ``arrays``: the values of its
    placeholder initializers (``{name: array}``, see :func:`.graph.load_light`)."""
    parts = formats_of(model)
    result = Rewrite(model, parts[0] if len(parts) == 1 else (MIXED if parts else QDQ), parts, [])
    if parts in ((), (QDQ,)):
        # its pairs stay as they are (a Q -> Reshape -> DQ chain is the parser's, see .moved);
        # only codes that nodes move before their DequantizeLinear, which the parser cannot read
        # as a constant (an embedding table gathered by ids), are dequantized before those nodes,
        # so that the table is a weight whose bypass is its float value
        moved = _moved_codes(model.graph)
        _refuse_untyped(model, moved, source)
        if not moved and not any(n.domain == "com.microsoft" and n.op_type in _FUSED for n in model.graph.node):
            return result
        _Rewriter(model, source, result.label, result.notes, arrays or {}, result.float_names, static=moved or None).run()
        result.moved = [dq.name or dq.output[0] for dq, _ in moved]
        if moved:
            shown = "; ".join(" -> ".join(f"{m.op_type} {m.name!r}" for m in (*chain, dq)) for dq, chain in moved[:2])
            more = f"; and {len(moved) - 2} more" if len(moved) > 2 else ""
            result.notes.append(
                f"{len(moved)} DequantizeLinear node(s) of {source} read an integer initializer through nodes that move "
                f"its values ({shown}{more}): each initializer is analysed as a weight, dequantized before those nodes "
                "(the same values: they only move elements), so that bypassing it gives its float value")
        return result
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
    if nbits:
        # block-wise DequantizeLinear and int4 codes take opset 21, int2 codes 25
        bits = {next((a.i for a in n.attribute if a.name == "bits"), 4) for n in nbits}
        model = result.model = _raise_opset(model, 25 if 2 in bits else 21, source, result.label, nbits[0])
    _Rewriter(model, source, result.label, result.notes, arrays or {}, result.float_names).run()
    return result


def onnx_opset(model):
    """The opset ``model`` imports for the standard domain; where it imports none (other
    domains only), the latest, at which onnxruntime loads it and which onnx.helper.make_model
    writes (the checker's opset 1 is for IR < 3 files importing nothing, which onnxruntime
    refuses to load)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                onnx.defs.onnx_opset_version())


def inferred_values(model):
    """The value infos, inputs and outputs of ``model``'s graph after onnx's shape inference
    (those it declares where inference fails)."""
    # onnx infers no op of onnxruntime's domain, so 16-bit Q/DQ there (quantize_static's and
    # Quark's below opset 21) left every tensor after them untyped: one segment, and no
    # node output to probe. They are the standard ops, so they are inferred as those.
    contrib = [n for n in model.graph.node
               if n.domain == "com.microsoft" and n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    for n in contrib:
        n.domain = ""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        values = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    except Exception:  # inference is a help for typing outputs, never a requirement
        values = list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)
    finally:
        for n in contrib:
            n.domain = "com.microsoft"
    return values


def dims_of(model):
    """``dims(tensor)``: its dims as ``model``'s graph declares them or onnx infers them (None
    each where open; None where unknown), inferred on the first call, from the graph as it is
    then: a Transpose without perm needs its tensor's rank, which most graphs never ask."""
    shapes = None

    def dims(tensor):
        nonlocal shapes
        if shapes is None:
            shapes = {v.name: declared_dims(v) for v in inferred_values(model)
                      if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
            shapes.update({i.name: list(i.dims) for i in model.graph.initializer})
        return shapes.get(tensor)
    return dims


def _refuse_untyped(model, moved, source):
    """Refuse a node of ``moved`` (see :func:`_moved_codes`) that reads the stored codes in a
    type its schema does not take at the model's opset (int4 codes into a Gather, which takes
    int4 from no opset): onnxruntime refuses such a file as malformed, and the rewrite would
    dequantize the codes before that node and analyse a graph no runtime loads."""
    opset = onnx_opset(model)
    types = {i.name: i.data_type for i in model.graph.initializer}
    for dq, chain in moved:
        stored = TensorProto.DataType.Name(types[chain[0].input[0]]).lower()
        for m in chain:
            try:
                schema = onnx.defs.get_schema(m.op_type, opset, m.domain or "")
            except onnx.defs.SchemaError:
                continue  # an op of no standard schema: onnxruntime's checker has nothing to say either
            param = schema.inputs[0].type_str if schema.inputs else ""
            allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == param), None)
            if allowed is not None and f"tensor({stored})" not in allowed:
                raise PTQError(f"{m.op_type} node {m.name or '(unnamed)'!r} of {source} reads the {stored} codes "
                               f"{chain[0].input[0]!r} (through to DequantizeLinear {dq.name or dq.output[0]!r}), "
                               f"a type {m.op_type} does not take at opset {opset}: the file is malformed "
                               "(onnxruntime refuses it too); store those codes as int8 or uint8, or dequantize "
                               f"them before the {m.op_type}, in the export")


def _raise_opset(model, target, source, label, node):
    """``model`` at opset ``target`` at least: the same model with its opset raised where no
    op of the standard domain it uses changed meaning between the two, else onnx's version
    converter's copy."""
    entry = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if entry is not None and entry.version >= target:
        return model
    old = entry.version if entry is not None else 1
    ops, graphs = set(), [model.graph]
    while graphs:
        graph = graphs.pop()
        for n in graph.node:
            if n.domain in ("", "ai.onnx"):
                ops.add(n.op_type)
            graphs.extend(a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)
            graphs.extend(g for a in n.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs)

    def changed(op):
        try:  # _WIDENED holds from opset 13 (Squeeze's axes became an input there); Split is not in it:
            # from 18 it needs its split input or num_outputs, which 13-17 models often leave out
            return (old < 13 or op not in _WIDENED) and (onnx.defs.get_schema(op, old, "").since_version
                    != onnx.defs.get_schema(op, target, "").since_version)
        except onnx.defs.SchemaError:  # not an op of that opset: leave it to the converter
            return True

    if entry is None and not ops:
        model.opset_import.append(helper.make_opsetid("", target))
    elif entry is not None and not any(changed(op) for op in ops):
        entry.version = target
    else:
        try:
            model = onnx.version_converter.convert_version(model, target)
        except Exception as exc:  # the converter's own exceptions are of many kinds
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PTQError(f"model {source} is in {label} format and its {node.op_type} node "
                           f"{node.name or '(unnamed)'!r} becomes a block-wise DequantizeLinear, which takes opset "
                           f"{target}, but onnx's version converter could not raise the model's opset {old} to it "
                           f"({why}); to analyse it, convert the float model to opset {target} "
                           f"(onnx.version_converter.convert_version(model, {target})) and quantize it again") from None
    model.ir_version = max(model.ir_version, helper.find_min_ir_version_for(
        [helper.make_opsetid("", target)], ignore_unknown=True))
    return model


def _key(node):
    return node.name, tuple(node.output)


def _unpack(packed, bits, mask):
    """Rows of uint8 bytes -> rows of ``bits``-bit codes, the first in each byte's low bits."""
    per = 8 // bits
    if per == 1:
        return packed.copy()
    parts = [(packed >> np.uint8(bits * j)) & np.uint8(mask) for j in range(per)]
    return np.stack(parts, axis=-1).reshape(packed.shape[0], -1)


@dataclasses.dataclass
class _Quantized:
    """An integer tensor of the original graph: its scale and zero point (tensor names; ""
    for none), its axis, and where its float value lives in the rewritten graph."""

    scale: str
    zero_point: str
    axis: int | None = None
    float: str | None = None  # the float tensor equal to its dequantized value, once made
    real: bool = True  # the integer tensor exists in the rewritten graph


class _Rewriter:
    """One walk over the graph in topological order, emitting the QDQ form of each node."""

    def __init__(self, model, source, label, notes, arrays, float_names, static=None):
        self.model, self.graph = model, model.graph
        # a QDQ file's rewrite (see to_qdq; ``static``: its [(DequantizeLinear, the nodes moving
        # its codes)]): its Q outputs are no quantized tensors of this walk, and of the nodes
        # that move integer constants only those (keys) run on float values
        self.static = None if static is None else {_key(m) for _, chain in static for m in chain}
        # and the DequantizeLinear of such a constant keeps the name of the file's one, where it
        # has one alone: the name the user sees of that weight
        tables = [(chain[0].input[0], dq.name) for dq, chain in static or ()]
        self.dq_names = {t: name for t, name in tables if name and [u for u, _ in tables].count(t) == 1}
        self.float_names = float_names  # filled by float_name (see Rewrite.float_names)
        self.arrays = arrays  # placeholders' values
        self.source, self.label = source, label
        self.notes = notes
        sort_topologically(self.graph, repr(source))
        # one list of wrappers: protobuf hands out a new one on every access of graph.node
        self.original = list(self.graph.node)
        self.inits = {i.name: i for i in self.graph.initializer}
        self.constants = {n.output[0]: n for n in self.original if n.op_type == "Constant"}
        self.producer = {o: n for n in self.original for o in n.output if o}
        self.consumers = {}
        for n in self.original:
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.inputs = {i.name for i in self.graph.input}
        self.taken = {n.name for n in self.original} | set(self.producer) | set(self.inits) | self.inputs
        self.opset = onnx_opset(model)
        self.quantized = {}  # integer tensor -> _Quantized
        self.dequantized = {}  # (tensor, scale, zero point, axis) -> float tensor
        self.dynamic = {}  # float tensor -> its DynamicQuantizeLinear outputs
        self.run_biases = []  # float ops whose bias the model quantizes on every run
        self.input_quantized = []  # MatMulNBits nodes whose kernel quantizes their input (accuracy_level 4)
        self.nodes = []
        self.skip = set()  # keys of original nodes another node's rewrite absorbed
        self.touched = set()  # tensors whose consumers changed (dead-code candidates)
        self._dims = dims_of(model)  # of the original graph: the walk first asks before it replaces its nodes
        # in a QDQ file, the parameters of the moved codes' own DequantizeLinear only (a tied
        # table's other reader, a Transpose before another DequantizeLinear, stays the parser's)
        self.hints = self._hints(None if static is None else [n for dq, chain in static for n in (*chain, dq)])

    # -- helpers -------------------------------------------------------------------------
    def fresh(self, base):
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def float_name(self, tensor):
        """A name for the float tensor whose quantized form is ``tensor``: onnxruntime's
        ``<float>_quantized`` gives the float model's own name back."""
        stem = self.stem(tensor)
        if stem != tensor and stem not in self.taken:
            return self.fresh(stem)
        if stem in self._graph_outputs():  # as onnxruntime names it in QDQ form
            return self.fresh(f"{stem}_QuantizeLinear_Input")
        name = self.fresh(f"{tensor}_float")
        if stem != tensor:  # the float model's name, taken here by the file's own DequantizeLinear
            self.float_names[name] = stem
        return name

    def op_name(self, node):
        """The float op's name: the integer node's less onnxruntime's ``_quant``, when free."""
        name = node.name or node.op_type
        if name.endswith("_quant") and name[: -len("_quant")] not in self.taken:
            return self.fresh(name[: -len("_quant")])
        return self.fresh(name) if name != node.name else name

    def constant(self, name):
        if name in self.arrays:
            return self.arrays[name]
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        if name in self.constants:
            for a in self.constants[name].attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
        return None

    def integer_constant(self, name):
        return name in self.inits and self.inits[name].data_type in _CODES

    def add_init(self, base, value):
        name = self.fresh(base)
        init = numpy_helper.from_array(np.asarray(value), name)
        self.graph.initializer.append(init)
        self.inits[name] = init
        return name

    def fail(self, node, why, fix=None):
        """Refuse ``node`` (None: the model) for ``why``; ``fix``: what the export should do
        instead, where the node's own case says it."""
        what = f"its {node.op_type} node {node.name or '(unnamed)'!r}" if node is not None else "it"
        if self.static is not None:
            # a QDQ file: nothing to quantize again, only how its export stores those codes
            fix = fix or ("dequantize the integer initializer itself in the export (its DequantizeLinear before the "
                          "nodes that move it), which pytest-ptq analyses as a weight")
            raise PTQError(f"model {self.source} is in {self.label} format and {what} {why}; pytest-ptq dequantizes an "
                           "integer initializer before the nodes that move it into its DequantizeLinear, but not "
                           f"here; to analyse it, {fix}")
        again = _FIX.get(node.op_type if node is not None else "", (
            "quantize the float model again with onnxruntime's MatMulNBitsQuantizer (either format; GPTQ without "
            "act-order), whose MatMulNBits nodes pytest-ptq analyses" if node is not None and node.op_type == "MatMulNBits" else
            "quantize the float model in QDQ format (quantize_static(..., quant_format=QuantFormat.QDQ))"))
        raise PTQError(f"model {self.source} is in {self.label} format and {what} {why}; pytest-ptq rewrites "
                       "onnxruntime's QLinear ops, QGemm, ConvInteger/MatMulInteger, MatMulNBits and its "
                       f"dynamic-quantization ops into Q/DQ pairs but not this; to analyse it, "
                       f"{fix + ', or ' + again if fix else again}")

    def same_params(self, a, b):
        """True when scale/zero-point tensor names ``a`` and ``b`` hold the same values."""
        if a == b:
            return True
        va, vb = self.constant(a) if a else 0, self.constant(b) if b else 0
        return va is not None and vb is not None and np.array_equal(np.asarray(va), np.asarray(vb))

    def _hints(self, nodes=None):
        """``{integer initializer: (scale, zero point, axis)}`` for integer constants that ops
        moving quantized values read (an embedding table before Gather, a weight's codes before
        a Transpose): their parameters are those the first quantized reader downstream gives.
        ``axis``: the axis a per-channel reader (a DequantizeLinear, a QLinear op) scales, as the
        constant lays it out (followed back through Transposes), else None; a sentence where it
        cannot be followed. ``nodes``: those to read, in topological order (default: all). Two
        readers that want one float value of the codes along different axes are refused."""
        hints, readers = {}, {}  # readers: tensor -> (the reader its hint is from, whether through moves)

        def give(t, hint, reader, moved):
            if t in hints:
                self._one_axis(t, (hints[t], *readers[t]), (hint, reader, moved))
            else:
                hints[t], readers[t] = hint, (reader, moved)

        for n in reversed(self.original if nodes is None else nodes):
            if n.op_type.endswith("DequantizeLinear"):
                give(n.input[0], (n.input[1], n.input[2] if len(n.input) > 2 else "", self._dq_axis(n)), n, False)
            elif n.op_type in QLINEAR:
                for t, s, z, k in self._quantized_inputs(n):
                    scale = self.constant(s) if s else None
                    give(t, (s, z, _channel_axis(n, k) if np.size(scale) > 1 else None), n, False)
            elif n.op_type in INTEGER and len(n.input) > 2 and n.input[2]:
                # an integer table read straight into ConvInteger/MatMulInteger (quantize_dynamic's
                # embedding before a MatMul): its zero point is the op's, its scale the scalar
                # factor of the op's scale product
                scaled = self._scaled(n)
                scale = self._table_scale(scaled[2]) if scaled is not None else None
                if scale is not None:
                    give(n.input[0], (scale, n.input[2], None), n, False)
            elif n.op_type in MOVING and n.input and n.output[0] in hints:
                # through a chain of them (quantize_dynamic's table read by Gather, then a
                # Transpose, then the DequantizeLinear)
                s, z, axis = hints[n.output[0]]
                reader = readers[n.output[0]][0]
                give(n.input[0], (s, z, _axis_before(n, axis, self._dims, reader.op_type)), reader, True)
        return hints

    def _one_axis(self, tensor, first, second):
        """Refuse ``tensor`` where two of its quantized readers, each ``(hint, reader node,
        whether through moves)``, one of them through moves, read its codes per channel with the
        same scales along different axes: the codes are dequantized once before the moves, along
        the one axis their hint holds (readers that read them directly get one each, see dq)."""
        (s1, z1, a1), r1, moved1 = first
        (s2, z2, a2), r2, moved2 = second
        if not isinstance(a1, int) or not isinstance(a2, int):
            return
        dims = self._dims(tensor)
        if dims is not None:
            a1, a2 = a1 % len(dims), a2 % len(dims)
        elif (a1 < 0) != (a2 < 0):
            return  # the same axis, maybe
        if not (moved1 or moved2) or a1 == a2 or not (self.same_params(s1, s2) and self.same_params(z1, z2)):
            return  # read directly, each gets a DequantizeLinear of its own axis (see dq)
        root = tensor
        while root in self.producer and self.producer[root].op_type in MOVING:
            root = self.producer[root].input[0]
        if not self.integer_constant(root):
            return
        where = f" (axes of {tensor!r}, which it moves into)" if root != tensor else ""
        self.fail(r2, f"reads integer constant {root!r} per channel along axis {a2}, and its {r1.op_type} node "
                  f"{r1.name or '(unnamed)'!r} along axis {a1}{where}, with the same scales, where the rewrite makes "
                  "one float value of those codes", "store the codes once for each reader, laid out as it reads them")

    def _dq_axis(self, node):
        """The channel axis of DequantizeLinear ``node`` with more than one scale, else None;
        a sentence for a per-block one (its scale would need the moved layout too)."""
        scale = self.constant(node.input[1])
        if scale is None or np.size(scale) < 2:
            return None
        if attribute(node, "block_size", 0):
            return f"a per-block DequantizeLinear {node.name!r} reads its codes after it"
        axis, dims = int(attribute(node, "axis", 1)), self._dims(node.input[0])
        if dims is not None and not -len(dims) <= axis < len(dims):
            # followed back through the moves, the axis would wrap onto some channel of the codes
            # and the file (which onnxruntime refuses) would be analysed on scales it does not use
            raise PTQError(f"{node.op_type} {node.name!r} of {self.source} has axis {axis} on its {len(dims)}-D input "
                           f"{node.input[0]!r}: out of range for that input; fix the export so that the axis indexes "
                           "the channels of the quantized tensor")
        return axis

    def _table_scale(self, product):
        """The factor of ``product`` (a Mul of two constant scales) that scales a per-tensor
        input beside a weight's scale: the scalar one, the first where both are (onnxruntime
        writes the input's scale first), None where neither is."""
        node = self.producer.get(product)
        if node is None or node.op_type != "Mul" or len(node.input) != 2:
            return None
        sizes = [None if self.constant(t) is None else np.size(self.constant(t)) for t in node.input]
        return next((t for t, size in zip(node.input, sizes) if size == 1), None)

    def _quantized_inputs(self, n):
        """``[(tensor, scale, zero point, the tensor's input position)]`` of QLinear node ``n``."""
        spec = QLINEAR[n.op_type][0]
        if spec is None:  # QLinearConcat
            spec = [(k, k + 1, k + 2) for k in range(2, len(n.input), 3)]
        ins = list(n.input)
        get = lambda k: ins[k] if k < len(ins) else ""  # noqa: E731
        return [(get(t), get(s), get(z), t) for t, s, z in spec if get(t)]

    # -- emitting ------------------------------------------------------------------------
    def emit(self, op, inputs, outputs, name, domain="", **attrs):
        node = helper.make_node(op, inputs, outputs, name=name, domain=domain or None, **attrs)
        self.nodes.append(node)
        return node

    def dq(self, tensor, scale, zero_point, axis=None, base=None, block_size=0):
        """The float tensor ``DequantizeLinear(tensor, scale, zero_point)`` along ``axis``, made
        once: two readers of one per-channel constant along different axes get one each."""
        key = (tensor, scale, zero_point, axis)
        if key in self.dequantized:
            return self.dequantized[key]
        stem = base or self.stem(tensor)
        name = self.dq_names.pop(tensor, None) or self.fresh(f"{stem}_DequantizeLinear")
        out = self.fresh(f"{stem}_DequantizeLinear_Output")
        inputs = [tensor, scale] + ([zero_point] if zero_point else [])
        attrs = {"axis": axis} if axis is not None else {}
        if block_size:
            attrs["block_size"] = block_size
        # per channel below opset 13 (the directions of an LSTM's weights, say): onnxruntime's
        # own DequantizeLinear takes an axis at any opset
        domain = "com.microsoft" if axis is not None and self.opset < 13 else ""
        self.emit("DequantizeLinear", inputs, [out], name, domain=domain, **attrs)
        self.dequantized[key] = out
        return out

    @staticmethod
    def stem(tensor):
        for suffix in ("_output_quantized", "_quantized"):
            if tensor.endswith(suffix):
                return tensor[: -len(suffix)]
        return tensor

    def float_of(self, node, tensor, scale, zero_point, axis=0):
        """The float value of quantized input ``tensor`` read with ``scale``/``zero_point``:
        a lone DQ of an integer constant (per channel along ``axis``), the float of a tensor an
        op moved, or a DQ of the integer tensor."""
        if tensor in self.inits or tensor in self.constants:
            return self.dq(tensor, scale, zero_point, self._axis(node, tensor, scale, axis))
        info = self.quantized.get(tensor)
        if info is None:
            if tensor in self.producer or tensor in self.inputs:
                # an integer graph input, say: per channel along the op's axis too (without
                # one, DequantizeLinear's default axis 1 is the input channels of a Conv weight)
                return self.dq(tensor, scale, zero_point, self._axis(node, tensor, scale, axis))
            self.fail(node, f"reads {tensor!r}, which nothing produces")
        if not info.real:
            if self.same_params(info.scale, scale) and self.same_params(info.zero_point, zero_point):
                return info.float
            self.materialize(tensor)
        return self.dq(tensor, scale, zero_point, self._axis(node, tensor, scale, axis))

    def _axis(self, node, tensor, scale, axis):
        """The axis quantized input ``tensor`` of ``node`` is read along with constant ``scale``:
        None for one scale (or a computed one), ``axis`` counted from 0 for several; the rank of
        a computed tensor from its types or shape inference, refused where unknown."""
        s = self.constant(scale)
        if s is None or np.size(s) < 2:
            return None
        value = self.constant(tensor)
        rank = value.ndim if value is not None else self._rank(tensor, node)
        return axis % rank

    def materialize(self, tensor):
        """Make the integer tensor exist: quantize the float value an op moved."""
        info = self.quantized[tensor]
        if info.real:
            return
        inputs = [info.float, info.scale] + ([info.zero_point] if info.zero_point else [])
        attrs = {}
        if self._per_channel(info):
            # codes quantized again along the axis they were dequantized on: without one,
            # QuantizeLinear's default axis 1 would scale other channels (a second reader of a
            # moved weight's codes, with other scales, read them so, silently)
            if info.axis is None:
                self.fail(self.producer.get(tensor), f"moves the per-channel codes {tensor!r}, which its readers "
                          "dequantize with different scales, along an axis the rewrite does not know",
                          "give every reader of those codes the same scales")
            attrs["axis"] = info.axis
        self.emit("QuantizeLinear", inputs, [tensor], self.fresh(f"{info.float}_QuantizeLinear"), **attrs)
        info.real = True

    def quantize_output(self, value, out, scale, zero_point):
        """Q of float ``value`` into the op's original integer output ``out``."""
        inputs = [value, scale] + ([zero_point] if zero_point else [])
        # named after the tensor, as onnxruntime names the Q of the same tensor in QDQ form
        self.emit("QuantizeLinear", inputs, [out], self.fresh(f"{self.stem(out)}_QuantizeLinear"))
        self.quantized[out] = _Quantized(scale, zero_point)

    # -- the walk ------------------------------------------------------------------------
    def run(self):
        for node in self.original:
            if _key(node) in self.skip:
                continue
            op = node.op_type
            if unsupported(op):
                self.fail(node, _WHY.get(op, "is a quantized op"))
            if op == "MatMulNBits" and node.domain == "com.microsoft":
                self.matmul_nbits(node)
            elif op in QLINEAR:
                self.qlinear(node)
            elif op in INTEGER:
                self.integer(node)
            elif op == "DynamicQuantizeLinear":
                self.keep(node)
                self.dynamic[node.input[0]] = list(node.output)
                self.quantized[node.output[0]] = _Quantized(node.output[1], node.output[2])
            elif op in ("MatMulIntegerToFloat", "DynamicQuantizeMatMul"):
                self.matmul_to_float(node)
            elif op == "QAttention":
                self.qattention(node)
            elif op == "DynamicQuantizeLSTM":
                self.lstm(node)
            elif node.domain == "com.microsoft" and op in _FUSED[:2]:
                self.unfuse(node)
            elif node.domain == "com.microsoft" and op == "FusedMatMul":
                self.unfuse_matmul(node)
            elif op.endswith("QuantizeLinear") and not op.endswith("DequantizeLinear"):
                self.keep(node)
                if self.static is not None:
                    continue  # a QDQ file's pair, the parser's
                axis = next((a.i for a in node.attribute if a.name == "axis"), None)
                self.quantized[node.output[0]] = _Quantized(node.input[1], node.input[2] if len(node.input) > 2
                                                            else "", axis)
            elif op.endswith("DequantizeLinear"):
                self.dequantize(node)
            elif any(i in self.quantized for i in node.input) or (
                    node.input and node.input[0] in self.hints and self.integer_constant(node.input[0])
                    and (self.static is None or _key(node) in self.static)):
                self.moving(node)
            else:
                self.keep(node)
        self.finish()

    def keep(self, node):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        self.nodes.append(copy)

    def dequantize(self, node):
        """An original DQ: of an op-moved tensor it is the float value itself."""
        t = node.input[0]
        info = self.quantized.get(t)
        scale, zp = node.input[1], node.input[2] if len(node.input) > 2 else ""
        if info is not None and not info.real:
            if self.same_params(info.scale, scale) and self.same_params(info.zero_point, zp):
                self.emit("Identity", [info.float], [node.output[0]], self.fresh(node.name or "Identity"))
                return
            self.materialize(t)
        self.keep(node)
        # keyed as dq keys it, for a later reader of the same values to share; per channel only
        # an initializer's, whose rank needs no shape inference (not per block: no reader's)
        many, axis = np.size(self.constant(scale)) > 1, int(attribute(node, "axis", 1))
        rank = len(self.inits[t].dims) if t in self.inits else None
        if not many or rank is not None and not attribute(node, "block_size", 0) and -rank <= axis < rank:
            self.dequantized.setdefault((t, scale, zp, axis % rank if many else None), node.output[0])

    def qlinear(self, node):
        op = node.op_type
        _, (ys, yz), float_op = QLINEAR[op]
        ins = list(node.input)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        channels_last = bool(attrs.pop("channels_last", 0))

        floats = []
        quantized = self._quantized_inputs(node)
        for t, s, z, k in quantized:
            floats.append(self.float_of(node, t, s, z, _channel_axis(node, k)))
        inputs = floats
        if op in ("QLinearConv", "QLinearConvTranspose") and len(ins) > 8 and ins[8]:
            inputs = floats + [self.bias(node, ins[8], [ins[1], ins[4]])]
        elif op == "QGemm" and len(ins) > 6 and ins[6]:
            alpha = attrs.get("alpha", 1.0)
            inputs = floats + [self.bias(node, ins[6], [ins[1], ins[4]], alpha)]
        if op == "QLinearSoftmax":
            attrs.pop("opset", None)
        out = node.output[0]
        has_q = ys < len(ins) and ins[ys]
        value = self.float_name(out) if has_q else out
        name = self.op_name(node)
        if channels_last and op in ("QLinearConv", "QLinearGlobalAveragePool", "QLinearAveragePool"):
            rank = self._rank(quantized[0][0], node)
            to_first = [0, rank - 1] + list(range(1, rank - 1))
            to_last = [0] + list(range(2, rank)) + [1]
            nchw = self.fresh(f"{inputs[0]}_nchw")
            self.emit("Transpose", [inputs[0]], [nchw], self.fresh(f"{name}_to_nchw"), perm=to_first)
            inner = self.fresh(f"{value}_nchw")
            self.emit(float_op, [nchw] + inputs[1:], [inner], name, **attrs)
            self.emit("Transpose", [inner], [value], self.fresh(f"{name}_to_nhwc"), perm=to_last)
        else:
            self.emit(float_op, inputs, [value], name, **attrs)
        if has_q:
            self.quantize_output(value, out, ins[ys], ins[yz] if yz < len(ins) else "")

    def _rank(self, tensor, node=None):
        """The rank of ``tensor`` in the original graph, from its types or shape inference."""
        dims = self._dims(tensor)
        if dims is None:
            self.fail(node or self.producer.get(tensor), f"reads {tensor!r}, whose rank is unknown")
        return len(dims)

    def bias(self, node, bias, scales, alpha=1.0):
        """A lone DQ of an int32 bias, its scale the product of the input and weight scales
        (times Gemm's alpha), as the integer kernels read it."""
        values = [self.constant(s) for s in scales]
        if any(v is None for v in values) or self.constant(bias) is None:
            self.fail(node, f"reads bias {bias!r} or its scales from computed tensors")
        scale = (np.asarray(values[0], np.float32) * np.asarray(values[1], np.float32) * np.float32(alpha))
        scale_name = self.add_init(f"{self.stem(bias)}_scale", scale.astype(np.float32))
        return self.dq(bias, scale_name, "", 0 if scale.size > 1 else None)

    def integer(self, node):
        """ConvInteger/MatMulInteger -> Cast -> Mul(scales): the float op on dequantized inputs."""
        op = node.op_type
        int_bias = self._integer_bias(node.output[0])
        scaled = self._scaled(node)
        if scaled is None:
            self.fail(node, "is not followed by the Cast and scale Mul that onnxruntime writes")
        cast, mul, product = scaled
        ins = list(node.input) + [""] * 4
        a, b, a_zp, b_zp = ins[:4]
        a_info = self.quantized.get(a)
        if a_info is None:
            self.fail(node, f"reads {a!r}, which no quantizer wrote")
        a_zp = a_zp or a_info.zero_point
        b_scale = self._other_scale(product, a_info.scale)
        if b_scale is None:
            self.fail(node, f"is scaled by {product!r}, which is not the product of its inputs' scales")
        fa = self.float_of(node, a, a_info.scale, a_zp)
        fb = self.float_of(node, b, b_scale, b_zp, _channel_axis(node, 1))
        self.skip.update((_key(cast), _key(mul)))
        self.touched.add(product)
        inputs, value = [fa, fb], mul.output[0]
        attrs = {at.name: helper.get_attribute_value(at) for at in node.attribute}
        if int_bias:
            add, addend = int_bias
            self.skip.add(_key(add))
            self.touched.update(add.input)
            flat = self._flat_bias(addend) if op == "ConvInteger" else None
            name = self.op_name(node)
            self.run_biases.append(name)
            # the int32 bias on the product's grid, as the integer kernel added it: its
            # rounding (onnx.quantize's Floor) stays in the graph, not a calibration node
            cast_bias, bias = self.fresh(f"{addend}_float"), self.fresh(f"{addend}_dequantized")
            self.emit("Cast", [flat or addend], [cast_bias], self.fresh(f"{addend}_Cast"), to=TensorProto.FLOAT)
            self.emit("Mul", [cast_bias, product], [bias], self.fresh(f"{addend}_scale_Mul"))
            if flat:
                self.emit(INTEGER[op], inputs + [bias], [value], name, **attrs)
            else:
                raw = self.fresh(f"{value}_unbiased")
                self.emit(INTEGER[op], inputs, [raw], name, **attrs)
                self.emit("Add", [raw, bias], [value], self.fresh(f"{name}_bias_Add"))
            return
        if op == "ConvInteger":
            folded = self._bias_add(value)
            if folded is not None:
                add, bias = folded
                inputs.append(bias)
                value = add.output[0]
                self.skip.add(_key(add))
                self.touched.update(add.input)
        self.emit(INTEGER[op], inputs, [value], self.op_name(node), **attrs)

    def _scaled(self, node):
        """``(Cast, Mul, scale product)`` that turn integer op ``node``'s int32 output (after
        an int32 bias Add, where there is one) into float, or None."""
        out = node.output[0]
        int_bias = self._integer_bias(out)
        cast = self._only_consumer(int_bias[0].output[0] if int_bias else out, "Cast")
        mul = self._only_consumer(cast.output[0], "Mul") if cast is not None else None
        if mul is None:
            return None
        return cast, mul, mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]

    def _only_consumer(self, tensor, op):
        users = self.consumers.get(tensor, [])
        if len(users) == 1 and users[0].op_type == op and tensor not in self._graph_outputs():
            return users[0]
        return None

    def _graph_outputs(self):
        return {o.name for o in self.graph.output}

    def _other_scale(self, product, scale):
        """The factor beside ``scale`` in ``product`` (a Mul of two scales), or None."""
        node = self.producer.get(product)
        if node is not None and node.op_type == "Mul":
            if node.input[0] == scale:
                return node.input[1]
            if node.input[1] == scale:
                return node.input[0]
        return None

    def _integer_bias(self, out):
        """``(Add, int32 addend)`` when integer op output ``out`` only feeds an Add of an
        int32 value before its Cast (how onnxruntime's first dynamic quantizer, producer
        ``onnx.quantize``, adds a bias quantized on every run with the input's scale), else
        None."""
        add = self._only_consumer(out, "Add")
        if add is None:
            return None
        addend = add.input[1] if add.input[0] == out else add.input[0]
        return (add, addend) if self._is_int32(addend) else None

    def _is_int32(self, tensor):
        """Whether ``tensor`` is an int32 constant, an int32 Cast, or one reshaped."""
        value = self.constant(tensor)  # an initializer or a Constant node
        if value is not None:
            return np.asarray(value).dtype == np.int32
        node = self.producer.get(tensor)
        if node is None:
            return False
        if node.op_type == "Cast":
            return any(a.name == "to" and a.i == TensorProto.INT32 for a in node.attribute)
        return node.op_type in ("Reshape", "Unsqueeze", "Identity") and self._is_int32(node.input[0])

    def _flat_bias(self, addend):
        """The 1-D int32 tensor that ``addend`` reshapes to Conv's ``[1, C, 1, ...]``, or None."""
        node = self.producer.get(addend)
        if node is None or node.op_type not in ("Reshape", "Unsqueeze") or len(self.consumers.get(addend, [])) != 1:
            return None
        shape = self.constant(node.input[1]) if node.op_type == "Reshape" and len(node.input) > 1 else None
        if shape is None or len(shape) < 3 or shape[0] != 1 or any(d != 1 for d in shape[2:]):
            return None
        return node.input[0]

    def _bias_add(self, value):
        """``(Add, bias)`` when ``value`` only feeds an Add of a per-channel constant shaped
        ``[1, C, 1, ...]`` or a Reshape of a 1-D one (how quantize_dynamic moves a Conv's bias
        out of ConvInteger); ``bias`` is the 1-D tensor Conv takes."""
        add = self._only_consumer(value, "Add")
        if add is None:
            return None
        other = add.input[1] if add.input[0] == value else add.input[0]
        reshape = self.producer.get(other)
        if reshape is not None and reshape.op_type == "Reshape" and len(self.consumers.get(other, [])) == 1:
            bias = self.constant(reshape.input[0])
            return (add, reshape.input[0]) if bias is not None and bias.ndim == 1 else None
        bias = self.constant(other)
        if bias is None or bias.ndim < 2 or bias.shape[0] != 1 or any(d != 1 for d in bias.shape[2:]):
            return None
        return add, self.add_init(f"{other}_bias", bias.reshape(-1))

    def dynamic_quantize(self, tensor):
        """The DynamicQuantizeLinear outputs for float ``tensor`` (made once)."""
        if tensor not in self.dynamic:
            stem = tensor
            outs = [self.fresh(f"{stem}_quantized"), self.fresh(f"{stem}_scale"), self.fresh(f"{stem}_zero_point")]
            self.emit("DynamicQuantizeLinear", [tensor], outs, self.fresh(f"{stem}_QuantizeLinear"))
            self.dynamic[tensor] = outs
            self.quantized[outs[0]] = _Quantized(outs[1], outs[2])
        return self.dynamic[tensor]

    def matmul_to_float(self, node):
        ins = list(node.input) + [""] * 7
        if node.op_type == "DynamicQuantizeMatMul":  # A, B, b_scale, b_zp, bias
            aq, a_s, a_zp = self.dynamic_quantize(ins[0])
            b, b_s, b_zp, bias = ins[1], ins[2], ins[3], ins[4]
        else:  # MatMulIntegerToFloat: A, B, a_scale, b_scale, a_zp, b_zp, bias
            aq, b, a_s, b_s, a_zp, b_zp, bias = ins[:7]
        fa = self.float_of(node, aq, a_s, a_zp)
        fb = self.float_of(node, b, b_s, b_zp, _channel_axis(node, 1))
        self.matmul(fa, fb, node.output[0], self.op_name(node), bias)

    def matmul(self, a, b, out, name, bias=""):
        """``out = a @ b``, plus ``bias`` where given (an Add after the MatMul ``name``)."""
        if bias:
            mm = self.fresh(f"{out}_MatMul")
            self.emit("MatMul", [a, b], [mm], name)
            self.emit("Add", [mm, bias], [out], self.fresh(f"{name}_bias"))
        else:
            self.emit("MatMul", [a, b], [out], name)

    def matmul_nbits(self, node):
        """com.microsoft MatMulNBits -> DequantizeLinear of its ``[K, N]`` weight (block-wise
        along K) -> MatMul -> Add of its bias input, where it has one."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        a, b, s, z, g_idx, bias = (list(node.input) + [""] * 6)[:6]
        bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 0))
        k, n = int(attrs.get("K", 0)), int(attrs.get("N", 0))
        if bits not in (2, 4, 8):
            self.fail(node, f"packs {bits}-bit codes")
        if bits == 2 and not hasattr(TensorProto, "INT2"):
            self.fail(node, f"packs 2-bit codes, which onnx {onnx.__version__} has no type for (onnx 1.20 and "
                            "later have)")
        if k <= 0 or n <= 0 or block < 16 or block & (block - 1):
            self.fail(node, f"has K={k}, N={n}, block_size={block}, not positive sizes and a power of two from 16")
        packed, scale = self.constant(b), self.constant(s)
        zp = self.constant(z) if z else None
        if packed is None or scale is None or (z and zp is None):
            self.fail(node, "reads its packed weight, scales or zero points from computed tensors")
        blocks, per = -(-k // block), 8 // bits
        if g_idx:
            self.fail(node, f"reads g_idx {g_idx!r}, an act-order assignment of its weight's rows to blocks (GPTQ's "
                            "desc_act), which a block-wise DequantizeLinear cannot express")
        if np.size(packed) != n * blocks * block // per or np.size(scale) != n * blocks:
            self.fail(node, f"has a weight of {np.size(packed)} bytes and {np.size(scale)} scales, not the "
                            f"{n * blocks * block // per} and {n * blocks} that K={k}, N={n}, bits={bits}, "
                            f"block_size={block} make")
        mask = (1 << bits) - 1
        codes = _unpack(np.asarray(packed, np.uint8).reshape(n, -1), bits, mask)[:, :k].T  # [K, N]
        scales = np.ascontiguousarray(np.asarray(scale).reshape(n, blocks).T)  # [K blocks, N]
        if zp is None:  # the zero point is the middle code: stored signed, as the QDQ form's symmetric weights
            codes = codes.astype(np.int16) - (1 << (bits - 1))
            points = None
        elif np.asarray(zp).dtype == np.uint8:
            if np.size(zp) != n * -(-blocks // per):
                self.fail(node, f"has {np.size(zp)} packed zero points, not the {n * -(-blocks // per)} its sizes make")
            points = _unpack(np.asarray(zp).reshape(n, -1), bits, mask)[:, :blocks].T
        else:  # HQQ's float zero points: DequantizeLinear takes codes only
            points = np.asarray(zp, np.float64).reshape(-1)
            if points.size != n * blocks or np.any(points != np.round(points)) or points.min() < 0 or points.max() > mask:
                self.fail(node, f"reads float zero points {z!r} that are not whole {bits}-bit codes (HQQ's), which "
                                "DequantizeLinear cannot take")
            points = points.astype(np.uint8).reshape(n, blocks).T
        code_type = getattr(TensorProto, f"{'' if points is None else 'U'}INT{bits}")  # signed without zero points
        weight = self.weight_name(b, bits)
        qn = self.add_codes(f"{weight}_quantized", codes, code_type, bits)
        sn = self.add_init(f"{weight}_scale", scales)
        zn = self.add_codes(f"{weight}_zero_point", points, code_type, bits) if points is not None else ""
        fw = self.dq(qn, sn, zn, 0, base=weight, block_size=block)
        name = self.nbits_name(node, bits)
        if attrs.get("accuracy_level", 0) == 4:
            self.input_quantized.append(name)
        self.matmul(a, fw, node.output[0], name, bias)

    def weight_name(self, packed, bits):
        """The float weight's name: the packed one's less onnxruntime's ``_Q4``."""
        suffix = f"_Q{bits}"
        return packed[: -len(suffix)] if packed.endswith(suffix) and len(packed) > len(suffix) else packed

    def nbits_name(self, node, bits):
        """The MatMul's name: MatMulNBitsQuantizer's ``<MatMul>_Q4`` less ``_Q4``,
        onnxruntime-genai's ``.../MatMulNBits`` as ``.../MatMul``, where free."""
        name = node.name or node.op_type
        for suffix, instead in ((f"_Q{bits}", ""), ("MatMulNBits", "MatMul")):
            if name.endswith(suffix) and len(name) > len(suffix) and name[: -len(suffix)] + instead not in self.taken:
                return self.fresh(name[: -len(suffix)] + instead)
        return self.fresh(name) if name != node.name else name

    def add_codes(self, base, codes, data_type, bits):
        """An initializer of integer ``codes`` (any shape) of ``data_type``, packed as ONNX
        stores 2- and 4-bit tensors (first element in the low bits)."""
        if bits == 8:
            return self.add_init(base, codes.astype(np.int8 if data_type == TensorProto.INT8 else np.uint8))
        name = self.fresh(base)
        per = 8 // bits
        flat = np.asarray(codes).reshape(-1).astype(np.uint8) & np.uint8((1 << bits) - 1)  # two's complement
        flat = np.concatenate([flat, np.zeros(-flat.size % per, np.uint8)]).reshape(-1, per)
        raw = np.zeros(flat.shape[0], np.uint8)
        for j in range(per):
            raw |= flat[:, j] << np.uint8(bits * j)
        init = helper.make_tensor(name, data_type, list(np.shape(codes)), raw.tobytes(), raw=True)
        self.graph.initializer.append(init)
        self.inits[name] = init
        return name

    def qattention(self, node):
        # input, weight, bias, input_scale, weight_scale, mask_index, input_zp, weight_zp, past
        ins = list(node.input) + [""] * 9
        fa = self.float_of(node, ins[0], ins[3], ins[6])
        fw = self.float_of(node, ins[1], ins[4], ins[7], _channel_axis(node, 1))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = [fa, fw, ins[2], ins[5], ins[8]]
        while inputs and not inputs[-1]:
            inputs.pop()
        self.emit("Attention", inputs, list(node.output), self.op_name(node), domain="com.microsoft", **attrs)

    def lstm(self, node):
        """DynamicQuantizeLSTM -> LSTM with dequantized weights (stored transposed, scales per
        direction or per direction and gate row)."""
        # X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zp, R_scale, R_zp
        ins = list(node.input) + [""] * 12
        if ins[0] in self.quantized:
            self.fail(node, "reads a quantized input")
        # the kernel quantizes its input dynamically once per run, as DynamicQuantizeLinear does
        xq, xs, xz = self.dynamic_quantize(ins[0])
        x = self.float_of(node, xq, xs, xz)
        weights = []
        for t, s, z in ((ins[1], ins[8], ins[9]), (ins[2], ins[10], ins[11])):
            w, scale, zp = self.constant(t), self.constant(s), self.constant(z)
            if w is None or scale is None or w.ndim != 3:
                self.fail(node, f"reads weight {t!r} or its scale from a computed tensor")
            directions = w.shape[0]
            rows = np.ascontiguousarray(np.transpose(w, (0, 2, 1)))  # back to LSTM's [dirs, 4H, in]
            if scale.size == 1:
                layout, axis = rows, None
            elif scale.size == directions:
                layout, axis = rows, 0
            elif directions == 1:  # one scale per gate row
                layout, axis = rows, 1
            else:  # per direction and gate row: DequantizeLinear takes them on one axis of a matrix
                layout, axis = rows.reshape(-1, rows.shape[2]), 0
            wq = self.add_init(t, layout)
            sn = self.add_init(s, np.asarray(scale, np.float32).reshape(-1) if axis is not None
                               else np.asarray(scale, np.float32).reshape(()))
            zn = self.add_init(z, np.asarray(zp).reshape(-1) if axis is not None else np.asarray(zp).reshape(()))
            fw = self.dq(wq, sn, zn, axis, base=self.stem(t))
            if layout.ndim == 2:
                shape = self.add_init(f"{t}_shape", np.asarray(rows.shape, np.int64))
                shaped = self.fresh(f"{fw}_shaped")
                self.emit("Reshape", [fw, shape], [shaped], self.fresh(f"{self.stem(t)}_Reshape"))
                fw = shaped
            weights.append(fw)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = [x] + weights + ins[3:8]
        while inputs and not inputs[-1]:
            inputs.pop()
        self.emit("LSTM", inputs, list(node.output), self.op_name(node), **attrs)
        self.notes.append(f"DynamicQuantizeLSTM {node.name!r} also quantizes its hidden state inside its kernel at "
                          "every step; the analysis simulates the quantization of its input and weights only")

    def unfuse(self, node):
        """com.microsoft FusedConv/FusedGemm -> the op, the Add of FusedConv's Z, the activation."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        act = attrs.pop("activation", b"")
        act = act.decode() if isinstance(act, bytes) else act
        params = list(attrs.pop("activation_params", []) or [])
        for key in [k for k in attrs if k.startswith("activation_")]:
            attrs.pop(key)
        op = "Conv" if node.op_type == "FusedConv" else "Gemm"
        ins = list(node.input)
        z = ins[3] if op == "Conv" and len(ins) > 3 else ""
        out = node.output[0]
        value = self.fresh(f"{out}_{op.lower()}") if act or z else out
        self.emit(op, ins[:3], [value], node.name, **attrs)
        if z:
            added = self.fresh(f"{out}_sum") if act else out
            self.emit("Add", [value, z], [added], self.fresh(f"{node.name}_add"))
            value = added
        if act:
            if act not in _ACTIVATIONS:
                self.fail(node, f"fuses activation {act!r}")
            act_attrs, act_inputs = {}, [value]
            if act in ("LeakyRelu", "Elu", "ThresholdedRelu") and params:
                act_attrs["alpha"] = float(params[0])
            elif act == "HardSigmoid" and len(params) >= 2:
                act_attrs.update(alpha=float(params[0]), beta=float(params[1]))
            elif act == "Selu" and len(params) >= 2:
                act_attrs.update(alpha=float(params[0]), gamma=float(params[1]))
            elif act == "Clip" and len(params) >= 2:
                act_inputs += [self.add_init(f"{node.name}_min", np.float32(params[0])),
                               self.add_init(f"{node.name}_max", np.float32(params[1]))]
            self.emit(act, act_inputs, [out], self.fresh(f"{node.name}_{act.lower()}"), **act_attrs)

    def unfuse_matmul(self, node):
        """com.microsoft FusedMatMul (``alpha * op(A) @ op(B)``) -> Transposes, MatMul and Mul,
        the ops onnxruntime fused."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transBatchA") or attrs.get("transBatchB"):
            self.fail(node, "transposes batch axes")
        ins = []
        for k, flag in enumerate(("transA", "transB")):
            t = node.input[k]
            if attrs.get(flag):
                rank = self._rank(t, node)
                perm = list(range(rank - 2)) + [rank - 1, rank - 2]
                out = self.fresh(f"{t}_transposed")
                self.emit("Transpose", [t], [out], self.fresh(f"{node.name}_{flag}"), perm=perm)
                t = out
            ins.append(t)
        alpha = float(attrs.get("alpha", 1.0))
        out = node.output[0]
        value = self.fresh(f"{out}_unscaled") if alpha != 1.0 else out
        self.emit("MatMul", ins, [value], node.name)
        if alpha != 1.0:
            self.emit("Mul", [value, self.add_init(f"{node.name}_alpha", np.float32(alpha))], [out],
                      self.fresh(f"{node.name}_alpha"))

    def moving(self, node):
        """An op that moves quantized values: it runs on their float values."""
        op = node.op_type
        if op not in MOVING and op not in SHAPE_ONLY:
            t = next(i for i in node.input if i in self.quantized or i in self.hints)
            self.fail(node, f"reads the quantized tensor {t!r}")
        if any(self.quantized[t].real and self._per_channel(self.quantized[t]) for t in node.input
               if t in self.quantized):
            # a per-channel Q's codes laid out before their DequantizeLinear (a QDQ part's
            # Q -> Transpose -> DQ): the node stays on the codes as the file has it, and the
            # chain is the parser's (see .moved), which follows the channel axis through it;
            # run on floats, the codes would be dequantized here without their axis (a moved
            # table's float value, not real, was taken along the axis its hints followed back)
            for t in node.input:
                if t in self.quantized:
                    self.materialize(t)
            self.keep(node)
            return
        ins = list(node.input)
        params = None
        for k, t in enumerate(ins):
            if not t:
                continue
            info = self.quantized.get(t)
            if info is None and self.integer_constant(t) and t in self.hints and (k == 0 or op == "Concat"):
                s, z, axis = self.hints[t]
                if isinstance(axis, str):
                    self.fail(node, f"moves integer constant {t!r}, and {axis}", _AXIS_FIX)
                # the reader after it (a DequantizeLinear, a QLinear op) scales the channels
                # along its own axis: the codes' axis holding them (a Transpose moves it)
                ins[k] = self.float_of(node, t, s, z, axis or 0)
                params = params or (s, z, self.hints.get(node.output[0], (None, None, None))[2])
                continue
            if info is None:
                continue
            if params is not None and not (self.same_params(params[0], info.scale)
                                           and self.same_params(params[1], info.zero_point)):
                self.fail(node, "joins quantized tensors of different scales")
            params = params or (info.scale, info.zero_point, info.axis)
            ins[k] = self.float_of(node, t, info.scale, info.zero_point)
        if op == "Pad":
            ins = self._pad_value(node, ins, params)
        data = list(range(len(node.output))) if op == "Split" else (
            [] if op in _INDEX_ONLY or op in SHAPE_ONLY else [0])
        outs = list(node.output)
        new = []
        for k in data:
            if k < len(outs) and outs[k]:
                value = self.float_name(outs[k])
                self.quantized[outs[k]] = _Quantized(params[0], params[1], params[2], float=value, real=False)
                new.append((outs[k], value))
                outs[k] = value
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(ins)
        del copy.output[:]
        copy.output.extend(outs)
        self.nodes.append(copy)
        if not self._keeps_grid(node):
            for t, _ in new:
                self.materialize(t)

    def _per_channel(self, info):
        """Whether quantized tensor ``info`` has more than one scale (a computed one: where
        its QuantizeLinear names an axis)."""
        scale = self.constant(info.scale)
        return np.size(scale) > 1 if scale is not None else info.axis is not None

    def _keeps_grid(self, node):
        if node.op_type in ("Resize", "Upsample"):
            mode = next((a.s for a in node.attribute if a.name == "mode"), b"nearest")
            return mode in (b"nearest", "nearest")
        return True

    def _pad_value(self, node, ins, params):
        """Pad's constant is a code; on float values it is that code dequantized."""
        mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
        if mode not in (b"constant", "constant") or params is None:
            return ins
        s = self.constant(params[0])
        z = self.constant(params[1]) if params[1] else 0
        code = self.constant(ins[2]) if len(ins) > 2 and ins[2] else 0
        if s is None or z is None or code is None:
            self.fail(node, "pads with a computed value")
        value = (np.asarray(code, np.float64) - np.asarray(z, np.float64)) * np.asarray(s, np.float64)
        if not np.any(value):  # onnxruntime pads with the zero point: Pad's default 0, as in the float model
            return ins[:2]
        ins = ins + [""] * (3 - len(ins))
        ins[2] = self.add_init(f"{node.name or 'Pad'}_value", np.asarray(value, np.float32).reshape(()))
        return ins

    # -- the end -------------------------------------------------------------------------
    def finish(self):
        graph = self.graph
        if self.run_biases:
            some = ", ".join(repr(n) for n in self.run_biases[:3]) + (", ..." if len(self.run_biases) > 3 else "")
            self.notes.append(f"the bias of {len(self.run_biases)} node(s) ({some}) is quantized on every run with its "
                              "input's scale by the model's own nodes; every config keeps that, so the float reference "
                              "differs from the float model by the bias's rounding")
        if self.input_quantized:
            some = ", ".join(repr(n) for n in self.input_quantized[:3]) + (
                ", ..." if len(self.input_quantized) > 3 else "")
            self.notes.append(f"{len(self.input_quantized)} MatMulNBits node(s) ({some}) have accuracy_level=4: "
                              "onnxruntime's CPU kernel also quantizes their input to int8 per block on every run, "
                              "which the analysis does not simulate (it simulates their weights' quantization only)")
        for out in graph.output:
            if out.name in self.quantized:
                self.materialize(out.name)
        del graph.node[:]
        graph.node.extend(self.nodes)
        self._drop_dead()
        self._twin_dynamic_scales()
        used = {i for n in graph.node for i in n.input} | self._graph_outputs()
        used |= {r for n in graph.node for r in node_refs(n)}
        for init in [i for i in graph.initializer if i.name not in used]:
            graph.initializer.remove(init)
        produced = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
        keep = [v for v in graph.value_info if v.name in produced and self._same_type(v)]
        del graph.value_info[:]
        graph.value_info.extend(keep)
        for out in graph.output:
            if out.name not in produced:
                raise PTQError(f"model {self.source} is in {self.label} format and its output {out.name!r} was lost "
                               "rewriting it into Q/DQ form; report this model")
        sort_topologically(graph, repr(self.source))
        if any(n.domain == "com.microsoft" for n in graph.node) and not any(
                o.domain == "com.microsoft" for o in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid("com.microsoft", 1))

    def _twin_dynamic_scales(self):
        """Give a DynamicQuantizeLinear whose scale or zero point other nodes read, besides the
        DQ of its own output, a twin for those readers (onnx.quantize quantizes a Conv's bias
        on every run with the input's scale): the quantizer and its DQ then form one
        calibration node that can be bypassed, while the readers keep the scale each run
        computes from the same float tensor."""
        graph = self.graph
        readers = {}
        for n in graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        for node in [n for n in graph.node if n.op_type == "DynamicQuantizeLinear"]:
            own = list(node.output)
            others = [r for t in own[1:] for r in readers.get(t, ())
                      if not (r.op_type.endswith("DequantizeLinear") and list(r.input[:3]) == own)]
            if not others:
                continue
            twin = [self.fresh(f"{t}_twin") for t in own]
            graph.node.append(helper.make_node("DynamicQuantizeLinear", [node.input[0]], twin,
                                               name=self.fresh(f"{node.name}_twin")))
            for r in {id(r): r for r in others}.values():
                for k, i in enumerate(r.input):
                    if i in own[1:]:
                        r.input[k] = twin[own.index(i)]

    def _same_type(self, v):
        """False for the value info of a tensor whose type the rewrite changed."""
        return v.name not in self.quantized or self.quantized[v.name].real

    def _drop_dead(self):
        """Remove the nodes the rewrite left without readers (the scales' products, the bias
        Reshapes), and nothing the user's graph had without readers already."""
        graph = self.graph
        outputs = self._graph_outputs()
        candidates = set(self.touched)
        while candidates:
            readers = {i for n in graph.node for i in n.input} | outputs
            readers |= {r for n in graph.node for r in node_refs(n)}
            dead = [n for n in graph.node if any(o in candidates for o in n.output)
                    and not any(o in readers for o in n.output if o)]
            if not dead:
                break
            candidates = set()
            for n in dead:
                graph.node.remove(n)
                candidates.update(i for i in n.input if i)

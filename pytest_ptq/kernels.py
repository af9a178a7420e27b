"""Where onnxruntime's integer kernels on this CPU depart from Q/DQ arithmetic, and which
nodes of a model that touches.

On x86 CPUs without AVX-VNNI, onnxruntime's kernels that multiply uint8 activations by int8
weights sum the products in pairs into int16 (onnxruntime documents it), which saturates
once a pair passes 32767: with 8-bit weights, not with 7-bit ones (``reduce_range=True``) or
uint8 ones. Every analysis simulates Q/DQ arithmetic, so this matters where a figure reads
the kernels themselves: the integer stage of ``stages`` and the check that the file runs
as simulated.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .engine.runtime import integer_kernels_saturate
from .model import grids
from .tables import listed

# onnxruntime's integer ops whose CPU kernels sum uint8 x int8 products in pairs into int16:
# {op: (index of the activation's zero point, None where the kernel quantizes its float input
# to uint8 itself; (index of a weight, index of its zero point) for each weight)}. ConvInteger's
# kernel sums exactly (measured).
_PAIR_SUMMED = {"QLinearConv": (2, ((3, 5),)), "QLinearMatMul": (2, ((3, 5),)), "QGemm": (2, ((3, 5),)),
                "MatMulInteger": (2, ((1, 3),)), "MatMulIntegerToFloat": (4, ((1, 5),)),
                "DynamicQuantizeMatMul": (None, ((1, 3),)), "DynamicQuantizeLSTM": (None, ((1, 9), (2, 11))),
                "QAttention": (None, ((1, 7),))}
# Weight codes up to this far from the zero point cannot saturate a pair: 2 x 255 x 64 <= 32767
# (reduce_range's 7-bit weights)
_NARROW = 64


def saturating_nodes(qm):
    """Names of the nodes, in graph order, whose kernels multiply uint8 activation codes by
    int8 weight codes reaching beyond 7 bits, what onnxruntime's CPU kernels saturate on x86
    without AVX-VNNI: in a QDQ model the ops fed by both (onnxruntime fuses them into such
    kernels; on x86 it shifts int8 activations to uint8 first, so those count too: an int8
    and a uint8 model of the same weights read the same 0.9914 there), in a QOperator or
    dynamic file its integer ops that sum in int16 pairs."""
    if qm.format == "QDQ":
        wide = {o for c in _wide_qdq_weights(qm) for o in c.outputs}  # their DequantizeLinear outputs
        return [n.name for n in qm.model.graph.node if _fused_product(qm, n, wide)]
    return [(node.name or node.output[0]) for node, _ in _wide_integer_ops(qm.as_given().graph)]


# The ops whose Q/DQ onnxruntime fuses into kernels of integer products (QLinearConv,
# QLinearConvTranspose, QLinearMatMul or MatMulIntegerToFloat, QGemm); a BatchNormalization
# or an Add between pairs runs in float, whatever its scale's type
_FUSED_PRODUCTS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# ops a constant weight's DequantizeLinear output may pass before its product (onnxruntime
# folds them into the weight: DQ -> Transpose -> Gemm still becomes QGemm)
_WEIGHT_MOVES = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _fused_product(qm, node, wide):
    """Whether onnxruntime fuses ``node`` into a kernel of 8-bit activation codes times wide
    int8 weight codes (``wide``: those weights' DequantizeLinear outputs), read by structure (measured on onnxruntime 1.32's optimized graphs):
    its first input dequantized from an 8-bit tensor computed at run time (a pair's, or a
    quantized model input's), its second a wide int8 weight's DequantizeLinear output (through
    ops that move it); a Conv only with its output quantized (else it stays float), a Gemm
    only with no bias or a dequantized one (a float bias keeps it float), a MatMul either way."""
    if node.op_type not in _FUSED_PRODUCTS or len(node.input) < 2:
        return False
    act = qm.producer.get(node.input[0])
    if act is None or act.op_type != "DequantizeLinear" or qm.constant(act.input[0]) is not None or \
            qm.value_types.get(act.input[0]) not in (TensorProto.UINT8, TensorProto.INT8):
        return False
    weight = node.input[1]
    while weight in qm.producer and qm.producer[weight].op_type in _WEIGHT_MOVES:
        weight = qm.producer[weight].input[0]
    if weight not in wide:
        return False
    if node.op_type in ("Conv", "ConvTranspose"):
        return any(r.op_type == "QuantizeLinear" for r in qm.consumers.get(node.output[0], ()))
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        bias = qm.producer.get(node.input[2])
        return bias is not None and bias.op_type == "DequantizeLinear"
    return True


def _wide_qdq_weights(qm):
    """A QDQ model's 8-bit int8 weight nodes whose codes reach beyond 7 bits."""
    return [c for c in qm.calibration.values() if c.kind == "weight" and c.role != "bias"
            and c.qtype == TensorProto.INT8 and c.bit == 8 and _wide_weight(qm, c)]


def _wide_integer_ops(graph):
    """A QOperator or dynamic graph's pair-summing ops with a uint8 activation and wide int8
    weights, in graph order: ``[(node, [(weight initializer, the node reading it, at which
    input, the index of the weight's zero point on node), ...])]``."""
    inits = {i.name: i for i in graph.initializer}
    made_by = {o: n for n in graph.node for o in n.output}

    def source(node, index, hops=3):  # the initializer behind an input, through a weight's Reshape/Transpose
        name = node.input[index] if len(node.input) > index else ""
        if name in inits or not name:
            return inits.get(name), node, index
        producer = made_by.get(name)
        if producer is None or hops == 0 or not producer.input or producer.op_type == "DynamicQuantizeLinear":
            return None, producer, None
        return source(producer, 0, hops - 1)

    def uint8_activation(node, zp):
        if zp is None or len(node.input) <= zp or not node.input[zp]:
            return True
        init, producer, _ = source(node, zp)
        return (init.data_type == TensorProto.UINT8 if init is not None
                else producer is not None and producer.op_type == "DynamicQuantizeLinear")

    def wide_int8(init, node, zp):
        if init is None or init.data_type != TensorProto.INT8:
            return False
        codes = numpy_helper.to_array(init).astype(np.int32)
        if not codes.size:
            return False
        zero = inits.get(node.input[zp]) if len(node.input) > zp else None
        zero = numpy_helper.to_array(zero).astype(np.int32) if zero is not None else np.zeros(1, np.int32)
        # the farthest a code can be from a zero point of its tensor: exact for one zero point
        # (onnxruntime's quantizers write 0), an upper bound for per-channel ones
        return max(int(codes.max()) - int(zero.min()), int(zero.max()) - int(codes.min())) > _NARROW

    found = []
    for node in graph.node:
        if node.op_type not in _PAIR_SUMMED or not uint8_activation(node, _PAIR_SUMMED[node.op_type][0]):
            continue
        wide = [(*source(node, w), zp) for w, zp in _PAIR_SUMMED[node.op_type][1]]
        wide = [w for w in wide if wide_int8(w[0], node, w[3])]
        if wide:
            found.append((node, wide))
    return found


def _wide_weight(qm, c):
    """Whether weight node ``c``'s codes reach beyond :data:`_NARROW` from its zero point
    (True where its values are unknown)."""
    values = qm.constant(c.input)
    if values is None:
        return True
    if c.q_node is None:  # the codes themselves
        zero = grids.broadcast(c.zero_point.astype(np.int32), values.shape, c.axis, c.block_size)
        spread = values.astype(np.int32) - zero
    else:  # a float weight, quantized at run time
        spread = np.rint(values.astype(np.float64)
                         / grids.broadcast(c.scale.astype(np.float64), values.shape, c.axis, c.block_size))
    return float(np.abs(spread).max(initial=0)) > _NARROW


# What WeightBiasQuantization quantizes the float weight (input 1) and bias (input 2) of
_REQUANTIZED_OPS = ("Conv", "ConvTranspose", "Gemm")
_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def requantized_nodes(qm, inputs=(1, 2)):
    """Names of a QDQ file's nodes, in graph order, whose float weight (input 1) or bias
    (input 2), of ``inputs``, onnxruntime's WeightBiasQuantization (a default optimization of
    recent releases) quantizes as it loads the file: a Conv, ConvTranspose or Gemm reading a
    per-tensor DequantizeLinear, with a float initializer there, whose output goes on to a
    QuantizeLinear alone (through a Relu or Clip): a node a quantizer left in float between
    quantized neighbours (``nodes_to_exclude``) gets per-tensor int8 weights all the same, and
    a float bias int32 codes."""
    if qm.format != "QDQ":
        return []
    graph = qm.model.graph

    def dequantized(name):
        node = qm.producer.get(name)
        return node if node is not None and node.op_type == "DequantizeLinear" else None

    def per_tensor_dq(name):
        node = dequantized(name)
        scale = qm.constant(node.input[1]) if node is not None else None
        return scale is not None and np.size(scale) == 1

    def float_constant(name):
        init = qm.inits.get(name)
        return init is not None and init.data_type in _FLOAT_TYPES

    def alone_to_quantize(tensor, hops=3):
        readers = qm.consumers.get(tensor, [])
        if len(readers) != 1 or tensor in qm.output_names:
            return False
        if readers[0].op_type == "QuantizeLinear":
            return True
        return hops > 0 and readers[0].op_type in ("Relu", "Clip") and alone_to_quantize(readers[0].output[0], hops - 1)

    def rounded(n):
        weight = float_constant(n.input[1])
        bias = len(n.input) > 2 and bool(n.input[2])
        # a float weight beside an already quantized bias is left alone (measured, onnxruntime 1.32)
        return ((1 in inputs and weight and not (bias and dequantized(n.input[2]) is not None))
                or (2 in inputs and bias and float_constant(n.input[2])
                    and (weight or dequantized(n.input[1]) is not None)))

    return [n.name for n in graph.node if n.op_type in _REQUANTIZED_OPS and n.domain in ("", "ai.onnx")
            and len(n.input) > 1 and per_tensor_dq(n.input[0]) and rounded(n) and alone_to_quantize(n.output[0])]


def float8_rewrites(qm):
    """Names of a QDQ file's Relu/Clip nodes whose output only a float8 QuantizeLinear reads:
    what onnxruntime's ReluQuantRewrite and ClipQuantRewrite (default optimizations) delete,
    taking zero for the floor of the float8 grid, which goes below it."""
    if qm.format != "QDQ":
        return []
    out = []
    for n in qm.model.graph.node:
        readers = qm.consumers.get(n.output[0], []) if n.op_type in ("Relu", "Clip") and n.output else []
        if len(readers) == 1 and readers[0].op_type == "QuantizeLinear" and len(readers[0].input) > 2:
            zero = qm.constant(readers[0].input[2])
            if zero is not None and "float8" in str(zero.dtype):
                out.append(n.name)
    return out


def requantize_chains(qm):
    """Names of a QDQ file's QuantizeLinear nodes that read a DequantizeLinear read by
    QuantizeLinears only: the second pair of a requantize chain, which onnxruntime's
    DoubleQDQPairsRemover (a default optimization) merges with the first as it loads the file."""
    if qm.format != "QDQ":
        return []
    out = []
    for n in qm.model.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] not in qm.producer:
            continue
        dq = qm.producer[n.input[0]]
        readers = qm.consumers.get(dq.output[0], [])
        if dq.op_type == "DequantizeLinear" and all(r.op_type == "QuantizeLinear" for r in readers):
            out.append(n.name)
    return out


def saturation_cause(qm, providers):
    """A clause naming int16 saturation as why onnxruntime's kernels differ from the
    simulation, where they run on this CPU, saturate here and the model has such products;
    else ""."""
    if (providers or ["CPUExecutionProvider"])[0] != "CPUExecutionProvider" or not integer_kernels_saturate():
        return ""
    nodes = saturating_nodes(qm)
    if not nodes:
        return ""
    return (f"on this CPU onnxruntime's kernels saturate uint8 x int8 products (summed in pairs into int16, as on "
            f"x86 without AVX-VNNI), and {len(nodes)} node(s) here run such products "
            f"({listed(nodes)}); with AVX-VNNI, on ARM or on another execution provider, or with the weights quantized "
            "with reduce_range=True (7 bits) or as uint8, no such product saturates")


def as_uint8_weights(qm):
    """The file as given with the weights of :func:`saturating_nodes` stored as uint8 codes
    (codes and zero points plus 128: the same values, which onnxruntime's kernels multiply
    exactly on every CPU), or None where some cannot be (a missing zero point). Large weights
    stay placeholders for the engine's shared values; the converted ones are new initializers."""
    model = onnx.ModelProto()
    model.CopyFrom(qm.as_given())
    graph = model.graph
    added, renamed = [], {}

    def shifted(name, value):  # a uint8 initializer of ``value`` + 128, once per source tensor
        if name not in renamed:
            renamed[name] = f"{name}::as_uint8"
            added.append(numpy_helper.from_array((np.asarray(value, np.int16) + 128).astype(np.uint8), renamed[name]))
        return renamed[name]

    if qm.format == "QDQ":
        by_output = {n.output[0]: n for n in graph.node if n.output}
        saturating = set(saturating_nodes(qm))
        for c in _wide_qdq_weights(qm):
            if not saturating & set(c.consumers):
                continue
            readers = [by_output[d.output[0]] for d in c.dq_nodes] + (
                [by_output[c.q_node.output[0]]] if c.q_node is not None else [])
            if c.between or any(len(r.input) < 3 or qm.constant(r.input[2]) is None for r in readers) or (
                    c.q_node is None and qm.constant(c.input) is None):
                return None
            for r in readers:
                r.input[2] = shifted(r.input[2], qm.constant(r.input[2]))
            if c.q_node is None:  # lone DQs of the codes themselves
                for r in readers:
                    r.input[0] = shifted(r.input[0], qm.constant(c.input))
    else:
        inits = {i.name: i for i in graph.initializer}
        for node, weights in _wide_integer_ops(graph):
            for init, reader, at, zp in weights:
                if len(node.input) <= zp or node.input[zp] not in inits:
                    return None
                node.input[zp] = shifted(node.input[zp], numpy_helper.to_array(inits[node.input[zp]]))
                reader.input[at] = shifted(init.name, numpy_helper.to_array(init))
    if not added:
        return None
    graph.initializer.extend(added)  # the int8 ones stay: a subgraph or another node may read them
    return model

"""Where onnxruntime's integer kernels on this CPU depart from Q/DQ arithmetic, and which
nodes of a model that touches.

On x86 CPUs without AVX-VNNI, onnxruntime's kernels that multiply uint8 activations by int8
weights sum the products in pairs into int16 (onnxruntime documents it), which saturates
once a pair passes 32767: with 8-bit weights, not with 7-bit ones (``reduce_range=True``) or
uint8 ones. Every analysis simulates Q/DQ arithmetic, so this matters where a figure reads
the kernels themselves: the integer stage of ``stages`` and the check that a QOperator or
dynamic file runs as simulated.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, numpy_helper

from .engine.runtime import integer_kernels_saturate
from .model import grids
from .tables import listed

# onnxruntime's integer ops whose CPU kernels sum uint8 x int8 products in pairs into int16:
# {op: (index of the activation's zero point, None where the kernel quantizes its float input
# to uint8 itself; indices of the weights)}. ConvInteger's kernel sums exactly (measured).
_PAIR_SUMMED = {"QLinearConv": (2, (3,)), "QLinearMatMul": (2, (3,)), "QGemm": (2, (3,)), "MatMulInteger": (2, (1,)),
                "MatMulIntegerToFloat": (4, (1,)), "DynamicQuantizeMatMul": (None, (1,)),
                "DynamicQuantizeLSTM": (None, (1, 2)), "QAttention": (None, (1,))}
# Weight codes up to this far from the zero point cannot saturate a pair: 2 x 255 x 64 <= 32767
# (reduce_range's 7-bit weights)
_NARROW = 64


def saturating_nodes(qm):
    """Names of the nodes, in graph order, whose kernels multiply uint8 activation codes by
    int8 weight codes reaching beyond 7 bits, what onnxruntime's CPU kernels saturate on x86
    without AVX-VNNI: in a QDQ model the ops fed by both (onnxruntime fuses them into such
    kernels), in a QOperator or dynamic file its integer ops that sum in int16 pairs."""
    if qm.format == "QDQ":
        def fed(take, qtype):
            return {c for n in qm.calibration.values() if take(n) and n.qtype == qtype and n.bit == 8
                    for c in n.consumers}

        both = fed(lambda n: n.is_activation, TensorProto.UINT8) & fed(
            lambda n: n.kind == "weight" and n.role != "bias" and _wide_weight(qm, n), TensorProto.INT8)
        return [n.name for n in qm.model.graph.node if n.name in both]
    graph = qm.as_given().graph
    inits = {i.name: i for i in graph.initializer}
    made_by = {o: n for n in graph.node for o in n.output}

    def source(name, hops=3):  # the initializer behind a tensor, through a weight's Reshape/Transpose
        node = made_by.get(name)
        if name in inits or node is None or hops == 0 or not node.input:
            return inits.get(name), node
        return source(node.input[0], hops - 1) if node.op_type != "DynamicQuantizeLinear" else (None, node)

    def uint8_activation(node, zp):
        if zp is None or len(node.input) <= zp or not node.input[zp]:
            return True
        init, producer = source(node.input[zp])
        return (init.data_type == TensorProto.UINT8 if init is not None
                else producer is not None and producer.op_type == "DynamicQuantizeLinear")

    def wide_int8_weight(node, index):
        if len(node.input) <= index or not node.input[index]:
            return False
        init = source(node.input[index])[0]
        # onnxruntime's quantizers, the only writers of these formats, store int8 weights symmetric
        return (init is not None and init.data_type == TensorProto.INT8
                and int(np.abs(numpy_helper.to_array(init).astype(np.int32)).max(initial=0)) > _NARROW)

    return [n.name or n.output[0] for n in graph.node if n.op_type in _PAIR_SUMMED
            and uint8_activation(n, _PAIR_SUMMED[n.op_type][0])
            and any(wide_int8_weight(n, w) for w in _PAIR_SUMMED[n.op_type][1])]


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
            f"({listed(nodes)}); with AVX-VNNI, on ARM or on another execution provider the file runs as simulated, and "
            "quantized with reduce_range=True (7-bit weights) or uint8 weights it runs so here too")

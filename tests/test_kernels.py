"""Which nodes of a QDQ file onnxruntime runs as kernels of integer products, read by
structure, checked against the nodes onnxruntime's own optimizer fuses (they keep their
names) in the graph it writes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_ptq.kernels import saturating_nodes
from pytest_ptq.model import QuantModel

_INTEGER_KERNELS = {"QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat", "QGemm", "QLinearConvTranspose"}


def _model(op, out_q=False, float_bias=False, transposed_weight=False, input_codes=False):
    """One product (``op``) of an 8-bit activation and wide int8 weights (codes to +-127)."""
    rng = np.random.default_rng(0)
    conv = op == "Conv"
    w = rng.integers(-127, 128, (4, 3, 3, 3) if conv else (8, 16) if transposed_weight else (16, 8)).astype(np.int8)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             numpy_helper.from_array(np.array(128, np.uint8), "xz"),
             numpy_helper.from_array(np.full(w.shape[0] if conv or transposed_weight else 1, 0.01, np.float32)
                                     if conv else np.array(0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(w.shape[0], np.int8) if conv else np.array(0, np.int8), "wz"),
             numpy_helper.from_array(w, "wq"),
             numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
             numpy_helper.from_array(np.array(128, np.uint8), "yz"),
             numpy_helper.from_array(np.ones(8, np.float32), "bias")]
    shape = [1, 3, 8, 8] if conv else [2, 16]
    if input_codes:  # the model's input is already quantized: a lone DequantizeLinear reads it
        inputs = [helper.make_tensor_value_info("xq", TensorProto.UINT8, shape)]
        nodes = []
    else:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
        nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_Q")]
    nodes += [helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="x_DQ"),
              helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="w_DQ",
                               **({"axis": 0} if conv else {}))]
    weight = "wd"
    if transposed_weight:
        nodes.append(helper.make_node("Transpose", ["wd"], ["wt"], name="w_T", perm=[1, 0]))
        weight = "wt"
    product = "y0" if out_q else "y"
    extra = ["bias"] if float_bias else []
    nodes.append(helper.make_node(op, ["xd", weight, *extra], [product], name="product"))
    if out_q:
        nodes += [helper.make_node("QuantizeLinear", ["y0", "ys", "yz"], ["yq"], name="y_Q"),
                  helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="y_DQ")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _fused_by_onnxruntime(model, tmp_path):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    # a fusion that takes a Transpose in names the node "product/GemmTransposeFusion/"
    return [n.name.split("/")[0] for n in onnx.load(options.optimized_model_filepath).graph.node
            if n.op_type in _INTEGER_KERNELS]


@pytest.mark.parametrize("op,kw", [
    ("Conv", {"out_q": True}),
    ("Conv", {}),  # no Q after it: onnxruntime leaves it in float
    ("MatMul", {}),
    ("MatMul", {"out_q": True}),
    ("MatMul", {"input_codes": True}),  # a quantized input read by a lone DQ was not counted
    ("Gemm", {}),
    ("Gemm", {"transposed_weight": True}),  # DQ -> Transpose -> Gemm was not counted
    ("Gemm", {"float_bias": True}),  # a float bias keeps it in float: it was named
])
def test_the_nodes_read_as_integer_products_are_those_onnxruntime_fuses(op, kw, tmp_path):
    model = _model(op, **kw)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert saturating_nodes(QuantModel(str(path))) == _fused_by_onnxruntime(model, tmp_path)

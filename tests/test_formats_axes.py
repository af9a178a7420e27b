"""Per-channel integer constants a QOperator file moves (Identity, Transpose, Gather, Reshape)
before its QLinear reader: the rewrite dequantizes them before the move, along the axis the
reader scales (a Conv weight's output channels, a MatMul B's columns, a QGemm B's N axis).

References: a plain onnxruntime session on the file (its integer kernels) for the quantized
run, numpy on the codes dequantized along the reader's axis for the bypassed one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from numpy.lib.stride_tricks import sliding_window_view

from builders import run_model
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError


def _c(value, name, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _model(nodes, inits, x_shape, y_shape):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17),
                                                                 helper.make_opsetid("com.microsoft", 1)])


_MOVERS = {  # the mover, and how the stored codes are laid out so that it gives the reader's layout
    "Identity": (lambda name: [helper.make_node("Identity", ["codes"], [name], name="move")], [], lambda a: a),
    "Transpose": (lambda name: [helper.make_node("Transpose", ["codes"], [name], name="move", perm=[1, 0])], [],
                  lambda a: a.T),
    "Gather": (lambda name: [helper.make_node("Gather", ["codes", "pick"], [name], name="move")],
               [_c(0, "pick", np.int64)], lambda a: a[None]),
    "Reshape": (lambda name: [helper.make_node("Reshape", ["codes", "shape"], [name], name="move")],
                [_c([0, -1], "shape", np.int64)], lambda a: a.reshape(a.shape[0], 1, a.shape[1])),
}


def _reader_net(reader, mover, k=6, n=8, seed=0):
    """x -> QuantizeLinear -> ``reader`` (its B: int8 codes [k, n] behind ``mover``, one scale per
    column, so far apart that a wrong axis shows) -> DequantizeLinear -> y. Returns the model,
    the dequantized B as the reader reads it (as float64, [k, n]) and samples."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-63, 64, (k, n)).astype(np.int8)  # 7 bits: exact in onnxruntime's kernels
    scales = np.linspace(0.001, 0.01, n).astype(np.float32)
    trans_b = reader == "QGemm transB"
    read = codes.T if trans_b else codes  # as the reader reads it
    make, extra, stored = _MOVERS[mover]
    inits = [_c(0.02, "xs"), _c(128, "xz", np.uint8), _c(0.05, "ys"), _c(128, "yz", np.uint8),
             _c(np.ascontiguousarray(stored(read)), "codes", np.int8), _c(scales, "bs"), _c(np.zeros(n), "bz", np.int8),
             *extra]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_Q"), *make("B")]
    if reader == "QLinearMatMul":
        nodes.append(helper.make_node("QLinearMatMul", ["xq", "xs", "xz", "B", "bs", "bz", "ys", "yz"], ["yq"],
                                      name="reader"))
    else:
        nodes.append(helper.make_node("QGemm", ["xq", "xs", "xz", "B", "bs", "bz", "", "ys", "yz"], ["yq"],
                                      name="reader", domain="com.microsoft", transB=int(trans_b)))
    nodes.append(helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="y_DQ"))
    samples = {"x": [rng.standard_normal((3, k)).astype(np.float32) for _ in range(2)]}
    return _model(nodes, inits, [3, k], [3, n]), codes.astype(np.float64) * scales, samples


def _conv_net(mover, seed=0):
    """The control: QLinearConv, its weight [6, 3, 3, 3] per output channel, behind ``mover``
    (Identity; Transpose from [3, 6, 3, 3])."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-63, 64, (6, 3, 3, 3)).astype(np.int8)
    scales = np.linspace(0.001, 0.01, 6).astype(np.float32)
    transpose = mover == "Transpose"
    inits = [_c(0.02, "xs"), _c(128, "xz", np.uint8), _c(0.05, "ys"), _c(128, "yz", np.uint8),
             _c(np.ascontiguousarray(codes.transpose(1, 0, 2, 3)) if transpose else codes, "codes", np.int8),
             _c(scales, "ws"), _c(np.zeros(6), "wz", np.int8)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_Q"),
             helper.make_node("Transpose", ["codes"], ["W"], name="move", perm=[1, 0, 2, 3]) if transpose else
             helper.make_node("Identity", ["codes"], ["W"], name="move"),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "W", "ws", "wz", "ys", "yz"], ["yq"], name="reader"),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="y_DQ")]
    samples = {"x": [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(2)]}
    return (_model(nodes, inits, [1, 3, 8, 8], [1, 6, 6, 6]), codes.astype(np.float64) * scales[:, None, None, None],
            samples)


def _conv(x, w):
    windows = sliding_window_view(x.astype(np.float64)[0], (3, 3), axis=(1, 2))  # [c, 6, 6, 3, 3]
    return np.einsum("chwij,mcij->mhw", windows, w)[None]


CASES = [("QLinearMatMul", m, k) for m in _MOVERS for k in (6, 8)] + [
    ("QGemm", "Identity", 6), ("QGemm", "Identity", 8), ("QGemm transB", "Transpose", 6),
    ("QGemm transB", "Transpose", 8), ("QLinearConv", "Identity", None), ("QLinearConv", "Transpose", None)]


@pytest.mark.parametrize("reader, mover, k", CASES, ids=[f"{r}-{m}-{k}" for r, m, k in CASES])
def test_moved_per_channel_codes_are_dequantized_along_their_readers_axis(reader, mover, k):
    """The moved codes' hint from a QLinear reader carried no axis, so they were dequantized
    along axis 0 whatever the reader: a square QLinearMatMul / QGemm B ran with each column on a
    row's scale (the quantized run 1.3 off onnxruntime's on the file, outputs step 0.05; the
    bypassed one 1.39 off numpy), any other was refused naming a DequantizeLinear the file does
    not have; so was a QLinearConv weight transposed into place."""
    model, w, samples = _conv_net(mover) if reader == "QLinearConv" else _reader_net(reader, mover, k)
    onnx.checker.check_model(model)
    engine = Engine(model, samples)
    for i, x in enumerate(samples["x"]):
        given = run_model(model, {"x": x})["y"]
        # quantized: the file; QLinearConv requantizes its exact int32 sum, the simulation a float
        # sum, so an output within float error of a rounding boundary may land one step (0.05) away
        off = np.abs(engine.run(i, "all")["y"] - given)
        assert off.max() <= (0.05 + 1e-6 if reader == "QLinearConv" else 1e-5) and np.mean(off > 1e-5) < 0.02
        ref = _conv(x, w) if reader == "QLinearConv" else x.astype(np.float64) @ w
        np.testing.assert_allclose(engine.run(i, ()).get("y"), ref, rtol=0, atol=1e-5)  # bypassed: its float weight


def _shared_net(moved):
    """One int8 [8, 8] constant read per channel by a QLinearMatMul (along its columns, axis 1)
    and a QGemm with transB (along axis 0), with the same scales; ``moved``: each reads it
    through an Identity of its own (its own scale initializer, of equal values)."""
    rng = np.random.default_rng(0)
    codes = rng.integers(-63, 64, (8, 8)).astype(np.int8)
    scales = np.linspace(0.001, 0.01, 8).astype(np.float32)
    inits = [_c(0.02, "xs"), _c(128, "xz", np.uint8), _c(0.05, "ys"), _c(128, "yz", np.uint8),
             _c(codes, "codes", np.int8), _c(scales, "bs"), _c(np.zeros(8), "bz", np.int8), _c(scales, "bs2")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_Q")]
    b1, b2, s2 = "codes", "codes", "bs"
    if moved:
        nodes += [helper.make_node("Identity", ["codes"], ["b1"], name="move1"),
                  helper.make_node("Identity", ["codes"], ["b2"], name="move2")]
        b1, b2, s2 = "b1", "b2", "bs2"
    nodes += [helper.make_node("QLinearMatMul", ["xq", "xs", "xz", b1, "bs", "bz", "ys", "yz"], ["q1"], name="mm"),
              helper.make_node("QGemm", ["xq", "xs", "xz", b2, s2, "bz", "", "ys", "yz"], ["q2"], name="gemm",
                               domain="com.microsoft", transB=1),
              helper.make_node("QLinearAdd", ["q1", "ys", "yz", "q2", "ys", "yz", "ys", "yz"], ["yq"], name="add",
                               domain="com.microsoft"),
              helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="y_DQ")]
    samples = {"x": [rng.standard_normal((3, 8)).astype(np.float32)]}
    return _model(nodes, inits, [3, 8], [3, 8]), samples


def test_a_constant_two_readers_read_directly_along_different_axes_each_get_their_own_axis():
    """The rewrite's DequantizeLinear cache left the axis out of its key, so the QGemm got the
    QLinearMatMul's float value of the codes (each row on a column's scale), and the file was
    then refused instead; now each reader dequantizes them along its own axis."""
    model, samples = _shared_net(False)
    codes = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "codes")).astype(np.float64)
    scales = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "bs")).astype(np.float64)
    engine = Engine(model, samples)
    x = samples["x"][0]
    np.testing.assert_allclose(engine.run(0, "all")["y"], run_model(model, {"x": x})["y"], rtol=0, atol=1e-6)
    floats = x.astype(np.float64) @ (codes * scales) + x.astype(np.float64) @ (codes * scales[:, None]).T
    np.testing.assert_allclose(engine.run(0, ())["y"], floats, rtol=0, atol=1e-5)


def test_a_constant_two_readers_move_and_scale_along_different_axes_is_refused_in_a_sentence():
    """Both readers got one float value of the codes, dequantized before their moves along the
    first reader's axis: the QGemm silently read each row on a column's scale (the quantized run
    1.3 off the file, which onnxruntime runs)."""
    model, samples = _shared_net(True)
    run_model(model, {"x": samples["x"][0]})  # onnxruntime runs the file
    with pytest.raises(PTQError) as info:
        Engine(model, samples)
    said = str(info.value)
    assert "\n" not in said
    assert "'codes'" in said and "'mm'" in said and "'gemm'" in said
    assert "along axis 0" in said and "along axis 1" in said


def test_moved_codes_whose_columns_a_reshape_merges_are_refused_naming_their_reader():
    """Codes stored flat [48] -> Reshape [6, 8] -> QLinearMatMul with a scale per column: no axis
    of the stored codes holds the columns. The refusal named a DequantizeLinear of the rewrite's
    own, its scales on axis 0 (the rows); now the Reshape, the reader and what to do."""
    model, _, samples = _reader_net("QLinearMatMul", "Reshape")
    flat = next(i for i in model.graph.initializer if i.name == "codes")
    flat.CopyFrom(_c(numpy_helper.to_array(flat).reshape(-1), "codes", np.int8))
    next(i for i in model.graph.initializer if i.name == "shape").CopyFrom(_c([6, 8], "shape", np.int64))
    run_model(model, {"x": samples["x"][0]})  # onnxruntime runs the file
    with pytest.raises(PTQError, match=r"its Reshape node 'move' moves integer constant 'codes', and a per-channel "
                       r"QLinearMatMul reads it after a Reshape 'move' that merges or splits its channel axis .*to "
                       r"analyse it, dequantize the stored codes along their own channel axis"):
        Engine(model, samples)

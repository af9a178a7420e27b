"""Leftovers of the format rewrite and of moved pairs: codes a Gather moves in a type the file
cannot hold there, and Transposes without perm beside per-channel pairs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError
from pytest_ptq.model import QuantModel


def _gathered_table(path, data_type):
    """A QDQ file: an embedding table [20, 8] stored as codes of ``data_type`` (a scalar scale,
    no zero point) -> Gather(ids [1, 5]) -> DequantizeLinear -> activation pair -> MatMul.
    Returns the samples."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((20, 8)).astype(np.float32)
    s = np.float32(np.abs(table).max() / 7)
    codes = np.clip(np.round(table / s), -8, 7).astype(np.int8)
    inits = [helper.make_tensor("codes", data_type, codes.shape, codes.ravel().tolist()),
             numpy_helper.from_array(np.asarray(s), "s"),
             numpy_helper.from_array((rng.standard_normal((8, 4)) * 0.5).astype(np.float32), "w")]
    nodes = [helper.make_node("Gather", ["codes", "ids"], ["g"], name="gather"),
             helper.make_node("DequantizeLinear", ["g", "s"], ["e"], name="table_DQ")]
    e = builders.add_pair(inits, nodes, "e", np.abs(table).max() / 127, np.int8(0))
    nodes.append(helper.make_node("MatMul", [e, "w"], ["y"], name="mm"))
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(path))
    return {"ids": [rng.integers(0, 20, (1, 5)).astype(np.int64) for _ in range(2)]}


def test_int4_codes_a_gather_moves_are_refused_as_onnxruntime_refuses_the_file(tmp_path):
    """int4 table -> Gather -> DequantizeLinear: onnxruntime refuses the file (Gather takes no
    int4), yet the tool dequantized the codes before the Gather and analysed a graph no runtime
    loads. Now one sentence naming the Gather and what the export should do; the same file
    with int8 codes, which onnxruntime runs, is analysed as before."""
    path = tmp_path / "q4.onnx"
    samples = _gathered_table(path, TensorProto.INT4)
    with pytest.raises(Exception, match="Gather"):  # onnxruntime's own verdict on the file
        builders.run_model(path, {"ids": samples["ids"][0]})
    with pytest.raises(PTQError) as info:
        Engine(str(path), samples)
    said = str(info.value)
    assert "\n" not in said
    assert said.startswith(f"Gather node 'gather' of {str(path)!r} reads the int4 codes 'codes'")
    assert "onnxruntime refuses it too" in said and "store those codes as int8 or uint8" in said
    ok = tmp_path / "q8.onnx"
    samples = _gathered_table(ok, TensorProto.INT8)
    builders.run_model(ok, {"ids": samples["ids"][0]})  # onnxruntime runs it
    assert "table_DQ" in Engine(str(ok), samples).qmodel.calibration


def _reversed_activation(path, moved=False, per_channel=True):
    """Relu(a [8, 4]) -> Transpose without perm -> QuantizeLinear / DequantizeLinear per channel
    (axis 1, 8 scales; without ``per_channel``, one scale) -> MatMul M [8, 3], in the file's own
    layout (nothing between Q and DQ); with ``moved``, a per-tensor pair on its output whose
    codes a Reshape lays out between Q and DQ. Returns the float computation of a feed."""
    rng = np.random.default_rng(0)
    m = (rng.standard_normal((8, 3)) * 0.5).astype(np.float32)
    s = np.linspace(0.01, 0.05, 8, dtype=np.float32) if per_channel else np.float32(0.03)
    axis = {"axis": 1} if per_channel else {}
    nodes = [helper.make_node("Relu", ["a"], ["r"], name="relu"), helper.make_node("Transpose", ["r"], ["t"], name="T"),
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["q"], name="Q", **axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="DQ", **axis),
             helper.make_node("MatMul", ["d", "M"], ["y0" if moved else "y"], name="mm")]
    inits = [numpy_helper.from_array(s, "s"), numpy_helper.from_array(np.zeros(np.shape(s), np.int8), "z"),
             numpy_helper.from_array(m, "M")]
    if moved:
        nodes += [helper.make_node("QuantizeLinear", ["y0", "s2", "z2"], ["q2"], name="Q2"),
                  helper.make_node("Reshape", ["q2", "shape"], ["q2r"], name="R"),
                  helper.make_node("DequantizeLinear", ["q2r", "s2", "z2"], ["y"], name="DQ2")]
        inits += [numpy_helper.from_array(np.float32(0.05), "s2"), numpy_helper.from_array(np.int8(0), "z2"),
                  numpy_helper.from_array(np.array([12], np.int64), "shape")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [8, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return lambda a: np.maximum(a, 0).T.astype(np.float64) @ m.astype(np.float64)


def test_a_transpose_without_perm_beside_a_per_channel_pair_gets_its_perm_where_its_rank_is_known(tmp_path):
    """onnxruntime 1.28 aborted the whole process (SIGABRT, no exception) loading this graph,
    the file itself or any segment of it: a Transpose without perm of known rank before a
    per-channel pair of the user's own graph (measured in a subprocess: rc 134; none where the
    rank is unknown). Only Transposes the tool moved got their perm written; now every one whose
    rank the file declares or onnx infers does, in the tool's copy, which runs as the file."""
    path = tmp_path / "t.onnx"
    floats = _reversed_activation(path)
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
    rank = next(len(v.type.tensor_type.shape.dim) for v in inferred.value_info if v.name == "r")
    feeds = [np.random.default_rng(k).standard_normal((8, 4)).astype(np.float32) for k in range(3)]
    engine = Engine(str(path), {"a": feeds})
    [t] = [n for n in engine.qmodel.model.graph.node if n.op_type == "Transpose"]
    assert [list(a.ints) for a in t.attribute if a.name == "perm"] == [list(range(rank))[::-1]]
    for i, a in enumerate(feeds):
        given = builders.run_model(path, {"a": a})["y"]
        np.testing.assert_allclose(engine.run(i, "all")["y"], given, rtol=0, atol=1e-6)
        np.testing.assert_allclose(engine.run(i, ())["y"], floats(a), rtol=0, atol=1e-5)
        assert np.abs(given - floats(a)).max() > 1e-3


def test_the_file_as_given_of_a_moved_pair_gets_the_perms_too(tmp_path):
    """A file whose pair the tool moves is run as given (QuantModel.as_given: the simulation
    warnings, stages, kernels) beside the tool's copy; it kept its Transpose without perm, and
    onnxruntime 1.28 aborted the process building that session (rc 134 in a subprocess, in
    simulation_warnings). The copy it hands out gets the reversed dims written; the file stays
    as it is, and the session runs as the file does."""
    from pytest_ptq.engine.runtime import make_session

    path = tmp_path / "t.onnx"
    _reversed_activation(path, moved=True)
    before = path.read_bytes()
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
    rank = next(len(v.type.tensor_type.shape.dim) for v in inferred.value_info if v.name == "r")
    feeds = [np.random.default_rng(k).standard_normal((8, 4)).astype(np.float32) for k in range(3)]
    engine = Engine(str(path), {"a": feeds})
    given = engine.qmodel.as_given()
    assert [n.op_type for n in given.graph.node if n.op_type == "Reshape"]  # the file's layout, not the copy's
    [t] = [n for n in given.graph.node if n.op_type == "Transpose"]
    assert [list(a.ints) for a in t.attribute if a.name == "perm"] == [list(range(rank))[::-1]]
    assert path.read_bytes() == before
    # the session the simulation warnings build, against a plain one of the file with the perm
    # its Transpose means written here (onnxruntime 1.28 aborts loading the file itself so)
    import onnxruntime as ort

    session = make_session(given, "all", ["CPUExecutionProvider"], fake_quant=False, disabled_optimizers=())
    meant = onnx.load(str(path))
    [t] = [n for n in meant.graph.node if n.op_type == "Transpose"]
    t.attribute.append(helper.make_attribute("perm", list(range(rank))[::-1]))
    plain = ort.InferenceSession(meant.SerializeToString(), providers=["CPUExecutionProvider"])
    for a in feeds:
        np.testing.assert_array_equal(session.run(["y"], {"a": a})[0], plain.run(["y"], {"a": a})[0])


def _qoperator_and_weight_only(tmp_path):
    """The conv net quantized by quantize_static in QOperator format, and one MatMulNBits
    (K 64, N 8, 4-bit codes in blocks of 32, no zero points) as MatMulNBitsQuantizer writes
    it: their QuantModels, and the float conv net and its samples."""
    import format_models as fm

    data = builders.samples(2)
    fp = builders.conv_net(tmp_path / "conv.onnx")
    qop = fm.quantize_qoperator(fp, tmp_path / "qop.onnx", data)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (8, 64)).astype(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).reshape(8, 2, 16)
    inits = [numpy_helper.from_array(packed, "w_Q4"),
             numpy_helper.from_array(rng.uniform(0.01, 0.1, 16).astype(np.float32), "w_scales")]
    node = helper.make_node("MatMulNBits", ["x", "w_Q4", "w_scales"], ["y"], name="fc_Q4", domain="com.microsoft",
                            K=64, N=8, bits=4, block_size=32)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])], inits)
    nbits = tmp_path / "nbits.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(
        "com.microsoft", 1)], ir_version=10), str(nbits))
    builders.run_model(nbits, {"x": np.ones((1, 64), np.float32)})  # onnxruntime runs it
    return QuantModel(str(qop)), QuantModel(str(nbits)), fp, data


def test_the_spread_step_names_the_call_that_can_widen_the_models_kind(tmp_path):
    """runall's step for a loss spread over many nodes said quantize_static(..., weight_type=
    QuantType.QInt16) for every model: a MatMulNBits model's quantizer has no 16 bit (its next
    width is 8 bits, as the per-node steps say), and quantize_static raises for 16-bit types in
    the QOperator format a QOperator model was made in. Each call is checked against
    onnxruntime's quantizer itself."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from pytest_ptq.runall import _spread_step

    qop, nbits, fp, data = _qoperator_and_weight_only(tmp_path)
    assert (qop.format, nbits.weight_only) == ("QOperator", True)
    step = _spread_step("weight", 0.1, 0.01, 2, 0.1, ["ptq-debug", "suggest"], nbits)
    assert "raise every weight to 8 bits (the weight-only quantizer's 8-bit setting for every weight, e.g. " \
           "MatMulNBitsQuantizer(..., bits=8))" in step and "quantize_static" not in step
    # the call named is one onnxruntime's quantizer takes (read from its source: importing it
    # needs onnx_ir, which the test environment lacks)
    import ast
    import importlib.util

    tree = ast.parse(Path(importlib.util.find_spec("onnxruntime.quantization.matmul_nbits_quantizer").origin).read_text())
    init = next(f for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "MatMulNBitsQuantizer"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    assert "bits" in [a.arg for a in init.args.args]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": a} for a in data["x"]])

        def get_next(self):
            return next(self.it, None)

    for kind, arg in (("activation", "activation_type"), ("weight", "weight_type")):
        step = _spread_step(kind, 0.1, 0.01, 2, 0.1, ["ptq-debug", "suggest"], qop)
        wide = {arg: QuantType.QUInt16 if kind == "activation" else QuantType.QInt16}
        assert f"quantize_static(..., quant_format=QuantFormat.QDQ, {arg}=QuantType." in step, step
        with pytest.raises(ValueError, match="QDQ"):  # the format the model was made in takes no 16 bit
            quantize_static(str(fp), str(tmp_path / "no.onnx"), Reader(), quant_format=QuantFormat.QOperator, **wide)
        quantize_static(str(fp), str(tmp_path / f"{kind}16.onnx"), Reader(), quant_format=QuantFormat.QDQ, **wide)
        widened = QuantModel(str(tmp_path / f"{kind}16.onnx")).of_kind(kind)
        assert {c.bit for c in widened if c.role != "bias"} == {16}


def _qlinear_convs(path, weight_input, scales):
    """QuantizeLinear(x [1, 4, 5, 5]) -> QLinearConv per output channel (4 scales each of
    ``scales``) -> DequantizeLinear, one Conv per scale set, all reading one int8 weight
    [4, 4, 3, 3]: a graph input ``w`` (``weight_input``) or an initializer through an Identity.
    Returns the feeds of one run."""
    rng = np.random.default_rng(0)
    weight = rng.integers(-100, 100, (4, 4, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(np.float32(0.02), "as"), numpy_helper.from_array(np.uint8(128), "az"),
             numpy_helper.from_array(np.zeros(4, np.int8), "wz"), numpy_helper.from_array(np.float32(0.5), "ys"),
             numpy_helper.from_array(np.uint8(128), "yz")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "as", "az"], ["xq"], name="xq")]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.INT8, [4, 4, 3, 3]))
    else:
        inits.append(numpy_helper.from_array(weight, "W"))
        nodes.append(helper.make_node("Identity", ["W"], ["w"], name="id"))
    outputs = []
    for k, s in enumerate(scales):
        inits.append(numpy_helper.from_array(np.asarray(s, np.float32), f"ws{k}"))
        nodes += [helper.make_node("QLinearConv", ["xq", "as", "az", "w", f"ws{k}", "wz", "ys", "yz"], [f"yq{k}"],
                                   name=f"conv{k}_quant"),
                  helper.make_node("DequantizeLinear", [f"yq{k}", "ys", "yz"], [f"y{k}"], name=f"y{k}_dq")]
        outputs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None))
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                                opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return {"x": rng.standard_normal((1, 4, 5, 5)).astype(np.float32), **({"w": weight} if weight_input else {})}


def test_a_per_channel_weight_fed_at_run_time_is_dequantized_along_its_output_channels(tmp_path):
    """A QLinearConv whose per-channel int8 weight is a graph input (not a constant): its
    DequantizeLinear was written without an axis, so DequantizeLinear's default (1, the input
    channels) scaled the weight: 39 off onnxruntime running the file where the two counts
    agree, and refused by onnxruntime where they do not. The rewrite, run without onnxruntime's
    QDQ fusion (which reads the axis from QLinearConv's rule), now equals the file."""
    from pytest_ptq.model.formats import to_qdq

    path = tmp_path / "conv.onnx"
    feeds = _qlinear_convs(path, True, [np.linspace(0.01, 0.08, 4)])
    given = builders.run_model(path, feeds, level="all")["y0"]
    rewritten = to_qdq(onnx.load(str(path)), "conv").model
    [dq] = [n for n in rewritten.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w"]
    assert [a.i for a in dq.attribute if a.name == "axis"] == [0]
    np.testing.assert_allclose(builders.run_model(rewritten, feeds)["y0"], given, rtol=0, atol=1e-6)


def test_per_channel_codes_two_readers_dequantize_with_other_scales_are_requantized_along_their_axis(tmp_path):
    """int8 W -> Identity -> two QLinearConvs of different per-channel scales: the rewrite
    dequantized W with one reader's scales and quantized it again for the other with no axis
    (QuantizeLinear's default 1: the input channels), 34 and 12.5 off onnxruntime running the
    file, silently; then it refused the file, the axis not known there. The moved codes now
    carry their readers' axis (the output channels): requantized along it, each reader reads
    its own scales, and the rewrite equals the file."""
    from pytest_ptq.model.formats import to_qdq

    path = tmp_path / "two.onnx"
    feeds = _qlinear_convs(path, False, [np.linspace(0.01, 0.08, 4), np.linspace(0.03, 0.005, 4)])
    given = builders.run_model(path, feeds, level="all")  # onnxruntime runs the file
    rewritten = to_qdq(onnx.load(str(path)), "two").model
    got = builders.run_model(rewritten, feeds)
    for out in ("y0", "y1"):
        np.testing.assert_allclose(got[out], given[out], rtol=0, atol=1e-6)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel pair", "per-tensor pairs"])
@pytest.mark.parametrize("perm", [None, [1, 0]], ids=["without perm", "with perm"])
def test_a_transpose_whose_perm_the_tool_writes_is_named_in_a_note(tmp_path, perm, per_channel):
    """The file as deployed (as_given), and the tool's copy, run the user's perm-less Transpose
    with its perm written, which onnxruntime 1.28 aborts loading beside a per-channel pair: a
    deployment there would fail where every run of the tool passed, and no note said so. Now one
    names it; where every pair is per tensor it said the same, false for that model: no note."""
    path = tmp_path / "t.onnx"
    _reversed_activation(path, per_channel=per_channel)
    if perm is not None:
        model = onnx.load(str(path))
        transpose = next(n for n in model.graph.node if n.op_type == "Transpose")
        transpose.attribute.append(helper.make_attribute("perm", perm))
        onnx.save(model, str(path))
    # the file's own Transposes without perm, and whether a Q or DQ has more than one scale, read from its protos
    graph = onnx.load(str(path)).graph
    bare = [n.name for n in graph.node if n.op_type == "Transpose" and not any(a.name == "perm" for a in n.attribute)]
    scales = {i.name: numpy_helper.to_array(i).size for i in graph.initializer}
    wide = any(scales[n.input[1]] > 1 for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear"))
    qmodel = Engine(str(path), {"a": [np.ones((8, 4), np.float32)]}).qmodel
    said = [n for n in qmodel.notes if "perm" in n]
    assert all(any(a.name == "perm" for a in n.attribute) for n in qmodel.as_given().graph.node
               if n.op_type == "Transpose")
    if bare and wide:
        assert len(said) == 1 and all(repr(name) in said[0] for name in bare), qmodel.notes
        assert "onnxruntime 1.28" in said[0] and "write perm in the export" in said[0]
    else:
        assert said == []

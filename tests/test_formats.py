"""onnxruntime's QOperator and dynamic formats, analysed through their QDQ form.

The references are computed without pytest_ptq: plain onnxruntime on the original files
(the integer kernels), on the float models, on models quantized by onnxruntime itself with
other options (QDQ format, ``nodes_to_quantize``) and on QDQ models rewired in the tests.

Tolerances. Against the integer kernels, fake-quant agrees to float rounding except where a
kernel rounds an intermediate value differently: QLinearConv, QLinearMatMul, QGemm add
exact int32 sums and requantize them with one float multiplier, the simulation rounds the
float sum, so an output may land one quantization step away when it falls within float
error of a rounding boundary; onnxruntime's uint8 Resize (linear) interpolates codes and
rounds its ties another way than QuantizeLinear's half-to-even. The bound is therefore one
output step per element, and the tests also bound how often it is reached.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
import format_models as fm
from builders import pooled_cosine, rewire, run_model
from pytest_ptq.cli import main
from pytest_ptq.engine import Engine
from pytest_ptq.errors import NotQuantized, PTQError
from pytest_ptq.model import QuantModel
from pytest_ptq.model.formats import formats_of
from pytest_ptq.model.grids import dynamic_fake_quant
from pytest_ptq.remedy.terms import onnxruntime_settings
from pytest_ptq.sensitivity import get_sensitivity_of_nodes


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Float models, their onnxruntime quantizations and data, built once."""
    root = tmp_path_factory.mktemp("formats")
    p = {name: root / f"{name}.onnx" for name in (
        "ops", "ops_qop", "ops_qop_pc", "ops_qdq", "att", "att_qop", "att_dyn", "att_dyn2", "att_dyn_opt",
        "lstm", "lstm_dyn", "lstm2", "lstm2_dyn_pc")}
    data = {"ops": fm.samples_of((1, 3, 16, 16)), "att": fm.samples_of((1, 6, 16)), "lstm": fm.samples_of((5, 1, 8))}
    fm.ops_net(p["ops"])
    fm.quantize_qoperator(p["ops"], p["ops_qop"], data["ops"])
    fm.quantize_qoperator(p["ops"], p["ops_qop_pc"], data["ops"], per_channel=True, activation_type="QInt8",
                          extra_options={"ActivationSymmetric": True})
    builders.quantize(p["ops"], p["ops_qdq"], data["ops"], keep_float=False, reduce_range=True)  # as the QOperator's
    fm.attention_net(p["att"])
    fm.quantize_qoperator(p["att"], p["att_qop"], data["att"])
    fm.quantize_dyn(p["att"], p["att_dyn"])
    fm.quantize_dyn(p["att"], p["att_dyn2"], per_channel=True, extra_options={"MatMulConstBOnly": False})
    fm.optimized(p["att_dyn"], p["att_dyn_opt"])
    fm.lstm_net(p["lstm"])
    fm.quantize_dyn(p["lstm"], p["lstm_dyn"])
    fm.lstm_net(p["lstm2"], bidirectional=True)
    fm.quantize_dyn(p["lstm2"], p["lstm2_dyn_pc"], per_channel=True)
    return p, data


def _data(name):
    return "ops" if name.startswith("ops") else ("att" if name.startswith("att") else "lstm")


def _float(name):
    return {"ops": "ops", "att": "att", "lstm": "lstm"}[_data(name)] if not name.startswith("lstm2") else "lstm2"


def _output_steps(path):
    """``{graph output: its quantization step}`` from the final DequantizeLinear of each."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    return {n.output[0]: float(inits[n.input[1]]) for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.output[0] in outputs}


def _ops(path):
    return {n.op_type for n in onnx.load(str(path)).graph.node}


# -- what the tool says it found --------------------------------------------------------------
@pytest.mark.parametrize("name, fmt", [("ops_qop", "QOperator"), ("att_dyn", "dynamic"), ("att_dyn_opt", "dynamic"),
                                       ("lstm_dyn", "dynamic"), ("ops_qdq", "QDQ")])
def test_the_format_is_named(built, name, fmt):
    p, _ = built
    qm = QuantModel(p[name])
    assert qm.format == fmt and qm.format_label == fmt
    kinds = {c.kind for c in qm.calibration.values()}
    assert kinds == ({"weight", "dynamic"} if fmt == "dynamic" else {"weight", "activation"})
    assert qm.made_by.name == ("onnxruntime quantize_dynamic" if fmt == "dynamic" else "onnxruntime quantize_static")
    # no integer op is left: every analysis sees Q/DQ pairs and float ops
    left = {n.op_type for n in qm.model.graph.node} & {"QLinearConv", "QGemm", "QLinearMatMul", "ConvInteger",
                                                       "MatMulInteger", "DynamicQuantizeMatMul",
                                                       "MatMulIntegerToFloat", "DynamicQuantizeLSTM"}
    assert not left


def test_the_qoperator_test_model_covers_the_common_ops(built):
    p, _ = built
    assert {"QLinearConv", "QLinearLeakyRelu", "QLinearAveragePool", "QLinearConcat", "QLinearSigmoid", "QLinearMul",
            "QLinearAdd", "QLinearGlobalAveragePool", "QLinearMatMul", "QGemm", "QLinearSoftmax", "MaxPool", "Pad",
            "Resize"} <= _ops(p["ops_qop"])
    assert {"DynamicQuantizeMatMul", "MatMulIntegerToFloat", "FusedMatMul"} <= _ops(p["att_dyn_opt"])
    assert "DynamicQuantizeLSTM" in _ops(p["lstm_dyn"])


def test_list_nodes_names_the_format(built, capsys):
    p, _ = built
    assert main(["list-nodes", str(p["att_dyn"])]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"{p['att_dyn']}: dynamic model, made by onnxruntime quantize_dynamic")
    assert "(2 of them dynamic: ranges computed per run)" in out
    assert "| x_QuantizeLinear " in out and " dynamic " in out


def _mixed_model():
    """A Conv in QDQ form (Q/DQ input, lone-DQ weight) feeding a QLinearConv."""
    rng = np.random.default_rng(0)
    # 7-bit weights: onnxruntime's uint8 x int8 kernels are exact with them on every x86 CPU
    w1 = rng.integers(-63, 64, (4, 3, 3, 3)).astype(np.int8)
    w2 = rng.integers(-63, 64, (2, 4, 1, 1)).astype(np.int8)
    c = lambda v, n, t=np.float32: numpy_helper.from_array(np.asarray(v, t), n)  # noqa: E731
    inits = [c(0.02, "xs"), c(128, "xz", np.uint8), c(w1, "w1q", np.int8), c(0.003, "w1s"), c(0, "w1z", np.int8),
             c(0.05, "ys"), c(128, "yz", np.uint8), c(w2, "w2q", np.int8), c(0.004, "w2s"), c(0, "w2z", np.int8),
             c(0.03, "zs"), c(128, "zz", np.uint8)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="x_DequantizeLinear"),
             helper.make_node("DequantizeLinear", ["w1q", "w1s", "w1z"], ["w1d"], name="w1_DequantizeLinear"),
             helper.make_node("Conv", ["xd", "w1d"], ["y"], name="conv1"),
             helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["y_quantized"], name="y_QuantizeLinear"),
             helper.make_node("QLinearConv", ["y_quantized", "ys", "yz", "w2q", "w2s", "w2z", "zs", "zz"],
                              ["z_quantized"], name="conv2_quant"),
             helper.make_node("DequantizeLinear", ["z_quantized", "zs", "zz"], ["z"], name="z_DequantizeLinear")]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_mixed_model_is_named_and_runs_as_onnxruntime_runs_it():
    model = _mixed_model()
    assert formats_of(model) == ("QDQ", "QOperator")
    data = fm.samples_of((1, 3, 8, 8), n=3)
    engine = Engine(model, data)
    assert (engine.qmodel.format, engine.qmodel.format_label) == ("mixed", "mixed (QDQ + QOperator)")
    for i, x in enumerate(data["x"]):
        ref = run_model(model, {"x": x}, level="all")["z"]  # the QLinearConv on its integer kernel
        assert np.abs(engine.run(i, "all")["z"] - ref).max() <= 0.03 + 1e-6  # one output step at most


def test_the_dynamic_part_of_a_mixed_model_is_offered_no_int16(tmp_path):
    # quantize_static on the first MatMul, quantize_dynamic on the second: the dynamic
    # quantizer and the MatMulInteger's weight were offered int16, which the integer op cannot
    # take and quantize_dynamic cannot produce (a dynamic model offers none)
    from pytest_ptq.remedy.alternatives import candidates_for

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((16, 8)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "f.onnx")
    data = fm.samples_of((1, 16), n=4)
    builders.quantize(tmp_path / "f.onnx", tmp_path / "s.onnx", data, nodes_to_exclude=["mm2"])
    path = fm.quantize_dyn(tmp_path / "s.onnx", tmp_path / "mixed.onnx", op_types=["MatMul"], nodes_to_exclude=["mm1"])
    proto = onnx.load(path)
    stored = {i.name for i in proto.graph.initializer}
    # what the integer ops read, from the file: the dynamic quantizer's input and the stored weights
    dynamic = {n.input[0] for n in proto.graph.node if n.op_type == "DynamicQuantizeLinear"} | {
        i for n in proto.graph.node if n.op_type in ("MatMulInteger", "ConvInteger") for i in n.input[:2] if i in stored}
    engine = Engine(str(path), data)
    qm = engine.qmodel
    assert qm.format_label == "mixed (QDQ + dynamic)" and len(dynamic) == 2
    assert {c.input for c in qm.calibration.values() if qm.wider_type(c) is None} == dynamic
    offered = set(candidates_for(engine, "int16")[0])
    assert offered and not {qm.calibration[n].input for n in offered} & dynamic


def test_what_cannot_be_rewritten_is_one_sentence_naming_op_and_format():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    inits = [numpy_helper.from_array(np.zeros((4, 1, 4), np.uint8), "w"),
             numpy_helper.from_array(np.ones(4, np.float32), "s")]
    bnb4 = helper.make_node("MatMulBnb4", ["x", "w", "s"], ["y"], domain="com.microsoft", K=8, N=4, block_size=8,
                            quant_type=1, name="mm")
    model = helper.make_model(helper.make_graph([bnb4], "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(PTQError) as err:
        QuantModel(model)
    msg = str(err.value)
    assert not isinstance(err.value, NotQuantized) and "\n" not in msg
    assert msg.startswith("model '<ModelProto>' is in weight-only format and its MatMulBnb4 node 'mm' is bitsandbytes' "
                          "FP4/NF4 weight format")
    assert "MatMulNBitsQuantizer" in msg  # MatMulNBits is analysed (tests/test_nbits.py)
    model.graph.node[0].op_type = "QLinearLayerNorm"
    with pytest.raises(PTQError, match="is in QOperator format and its QLinearLayerNorm node 'mm' is a quantized "
                                       r"op; .*quant_format=QuantFormat\.QDQ"):
        QuantModel(model)


# -- QOperator: the rewrite against the integer kernels and the float model -------------------
@pytest.mark.parametrize("name", ["ops_qop", "ops_qop_pc", "att_qop"])
def test_qoperator_fake_quant_matches_the_integer_kernels(built, name):
    p, data = built
    samples = data[_data(name)]
    engine = Engine(p[name], samples)
    steps = _output_steps(p[name])
    assert set(steps) == set(engine.model_outputs)
    for out, step in steps.items():
        off = []
        for i, x in enumerate(samples["x"]):
            ref = run_model(p[name], {"x": x}, level="all")[out]
            diff = np.abs(engine.run(i, "all")[out].astype(np.float64) - ref) / step
            assert diff.max() <= 1 + 1e-4, (out, i)  # one output step at most
            off.append(diff > 0.5)
        share = float(np.mean(np.concatenate([o.ravel() for o in off])))
        # on these models only the linear Resize's ties differ, on a quarter of its values
        assert share <= (0.3 if out == "up2" else 0.01), (out, share)


@pytest.mark.parametrize("name", ["ops_qop", "ops_qop_pc", "att_qop"])
def test_qoperator_bypassed_is_the_float_model(built, name):
    p, data = built
    samples = data[_data(name)]
    engine = Engine(p[name], samples, float_model=p[_float(name)])
    qm = engine.qmodel
    assert not qm.alignment.rewrites and not qm.alignment.unmatched_weights
    assert all(c.bypassable for c in qm.calibration.values())
    # Relu folded into the conv's output range is found again in the float model
    for i, x in enumerate(samples["x"]):
        ref = run_model(p[_float(name)], {"x": x})
        got = engine.run(i, ())
        for out, r in ref.items():
            assert np.abs(got[out] - r).max() <= 1e-5 * max(1.0, float(np.abs(r).max())), out


def _qoperator(tmp_path, nodes, inputs, outputs, inits, samples):
    """The float graph and its QOperator form by quantize_static (uint8, reduce_range)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [1, 3, 8, 8])
                                           for i in inputs],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QOperator,
                    reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return tmp_path / "f.onnx", tmp_path / "q.onnx"


def test_a_node_reading_two_pairs_without_their_folds_reads_both_unfolded(tmp_path):
    """Add(x, y) beside Relu(x)->Conv and Relu(y)->Conv: the Add reads both pairs without the
    Relus the quantizer deleted for the Convs (one map a reader: the second pair's replaced
    the first's, and the Add read x through its Relu, 3.9 off the float model)."""
    rng = np.random.default_rng(1)
    w = [numpy_helper.from_array((rng.standard_normal((4, 3, 1, 1)) * 0.3).astype(np.float32), f"w{k}")
         for k in (1, 2)]
    nodes = [helper.make_node("Add", ["x", "y"], ["a"], name="add"),
             helper.make_node("Relu", ["x"], ["rx"], name="relu_x"), helper.make_node("Conv", ["rx", "w1"], ["c1"]),
             helper.make_node("Relu", ["y"], ["ry"], name="relu_y"), helper.make_node("Conv", ["ry", "w2"], ["c2"])]
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
                "y": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    fpath, qpath = _qoperator(tmp_path, nodes, ["x", "y"], ["a", "c1", "c2"], w, samples)
    engine = Engine(qpath, {k: [s[k] for s in samples] for k in ("x", "y")}, float_model=fpath)
    assert [engine.qmodel.calibration[f"{t}_QuantizeLinear"].unfolded for t in "xy"] == [["add"], ["add"]]
    for i, feeds in enumerate(samples):
        ref, got = run_model(fpath, feeds), engine.run(i, ())
        for out in ("a", "c1", "c2"):
            assert np.abs(got[out] - ref[out]).max() <= 1e-6, out


def test_a_relu_deleted_for_one_reader_of_a_shared_tensor_is_put_back_for_that_reader_only(tmp_path):
    """x feeds a Sigmoid and a Relu->Conv; onnxruntime's QOperator quantizer deletes the Relu
    and its QLinearConv reads x's one quantized tensor. Bypassed, the Relu came back on every
    reader of the pair: the Sigmoid branch computed Sigmoid(Relu(x)), which neither the float
    model nor the file computes, and its gap was blamed on the quantizer."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 1, 1)) * 0.3).astype(np.float32), "w")
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"), helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w"], ["c"], name="conv")]
    xs = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(4)]
    _qoperator(tmp_path, nodes, ["x"], ["s", "c"], [w], [{"x": x} for x in xs])
    assert "Relu" not in _ops(tmp_path / "q.onnx")
    engine = Engine(tmp_path / "q.onnx", {"x": xs}, float_model=tmp_path / "f.onnx")
    assert engine.qmodel.calibration["x_QuantizeLinear"].unfolded == ["sig"]
    for i, x in enumerate(xs):
        ref = run_model(tmp_path / "f.onnx", {"x": x})
        got = engine.run(i, ())
        for out in ("s", "c"):
            assert np.abs(got[out] - ref[out]).max() <= 1e-6, out
    # fully quantized, the file as onnxruntime runs it; x alone quantized, the Sigmoid reads it
    # without the Relu and the Conv through it, as quantized
    files = [run_model(tmp_path / "q.onnx", {"x": x}) for x in xs]
    quantized = [engine.run(i, "all") for i in range(len(xs))]
    for out in ("s", "c"):
        assert pooled_cosine([f[out] for f in files], [q[out] for q in quantized]) > 1 - 1e-6, out
    alone = engine.run(0, ["x_QuantizeLinear"])
    through_relu = 1 / (1 + np.exp(-np.maximum(xs[0], 0)))
    assert np.abs(alone["s"] - files[0]["s"]).max() < 0.1 < np.abs(alone["s"] - through_relu).max()


def test_qoperator_single_nodes_match_onnxruntimes_own_qdq_form_rewired(built):
    """Each node alone quantized in the rewritten QOperator model against the QDQ model that
    onnxruntime makes from the same float model and data, rewired to keep that node only."""
    p, data = built
    samples = data["ops"]
    engine = Engine(p["ops_qop"], samples, float_model=p["ops"])
    qdq = builders.qdq_pairs(p["ops_qdq"])
    qdq_inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(p["ops_qdq"])).graph.initializer}
    qop_inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(p["ops_qop"])).graph.initializer}
    qop_q = {n.name: n for n in onnx.load(str(p["ops_qop"])).graph.node if n.op_type == "QuantizeLinear"}

    def same_scale(name):
        q, dqs = qdq[name]
        mine = engine.qmodel.calibration[name]
        return np.allclose(qdq_inits[(q or dqs[0]).input[1]], mine.scale, rtol=1e-6)

    common = [n for n in engine.calib_names if n in qdq]
    differ = sorted(n for n in common if not same_scale(n))
    # the two formats differ there: QDQ gives AveragePool its input's scale, QLinearAveragePool
    # its own; QLinearSoftmax quantizes to 1/256, QDQ's Softmax to 1/255
    assert differ == ["a1_QuantizeLinear", "prob_QuantizeLinear"]
    assert qop_inits[qop_q["x_QuantizeLinear"].input[1]] == qdq_inits[qdq["x_QuantizeLinear"][0].input[1]]
    common = [n for n in common if n not in differ]
    assert len(common) >= 15
    x = samples["x"][0]
    for name in common:
        ref = run_model(rewire(p["ops_qdq"], keep=[name], float_model=p["ops"]), {"x": x})
        got = engine.run(0, [name])
        for out, r in ref.items():
            assert np.abs(got[out] - r).max() <= 1e-5 * max(1.0, float(np.abs(r).max())), (name, out)


# -- dynamic ---------------------------------------------------------------------------------
def test_dynamic_fake_quant_is_dynamicquantizelinear():
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "dql",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(3)
    for x in (rng.standard_normal((4, 50)) * 3, rng.uniform(0.5, 2, (30,)), -rng.uniform(0, 1, (7, 7)),
              np.zeros((5,))):
        x = x.astype(np.float32)
        ref = run_model(model, {"x": x})["y"]
        np.testing.assert_allclose(dynamic_fake_quant(x), ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["att_dyn", "att_dyn2", "att_dyn_opt", "lstm_dyn", "lstm2_dyn_pc"])
def test_dynamic_bypassed_is_the_float_model_and_quantized_is_the_file(built, name):
    p, data = built
    samples = data[_data(name)]
    engine = Engine(p[name], samples, float_model=p[_float(name)])
    qm = engine.qmodel
    assert not qm.alignment.unmatched_weights
    if not name.startswith("lstm2"):  # the bidirectional LSTM's weights are stored as one matrix (a Reshape)
        assert not qm.alignment.rewrites
    dynamic = qm.of_kind("dynamic")
    assert dynamic and all(np.isnan(c.threshold) and c.bypassable for c in dynamic)
    ref_q, got_q = [], []
    for i, x in enumerate(samples["x"]):
        feeds = {"x": x}
        for out, r in run_model(p[_float(name)], feeds).items():
            np.testing.assert_allclose(engine.run(i, ())[out], r, rtol=0, atol=1e-6)
        for out, r in run_model(p[name], feeds, level="all").items():
            got = engine.run(i, "all")[out]
            ref_q.append(r)
            got_q.append(got)
            if not name.startswith("lstm"):
                # integer sums are exact, the rest is float rounding
                assert np.abs(got - r).max() <= 1e-5 * max(1.0, float(np.abs(r).max())), out
    # DynamicQuantizeLSTM also quantizes its hidden state at every step, which no Q/DQ
    # expresses: the simulation covers its input and weights
    assert pooled_cosine(ref_q, got_q) >= (0.99999 if name.startswith("lstm") else 0.9999999)
    if name.startswith("lstm"):
        assert any("hidden state" in w for w in engine.warnings)


def test_an_embedding_table_read_straight_into_matmulinteger(tmp_path):
    """quantize_dynamic's embedding before a MatMul (a decoder's first layer): the table is
    quantized, Gathered and fed to MatMulInteger with no runtime quantizer; its zero point is
    the MatMulInteger's, its scale the scalar factor of the scale product."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")], "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 16])],
        [numpy_helper.from_array(rng.normal(size=(50, 32)).astype(np.float32), "emb"),
         numpy_helper.from_array(rng.normal(size=(32, 16)).astype(np.float32) / 6, "w")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), fp)
    q = fm.quantize_dyn(fp, tmp_path / "q.onnx")
    assert {"Gather", "MatMulInteger"} <= _ops(q) and "DynamicQuantizeLinear" not in _ops(q)
    ids = [rng.integers(0, 50, size=(1, 6)).astype(np.int64) for _ in range(4)]
    engine = Engine(q, {"ids": ids}, float_model=fp)
    assert engine.qmodel.format == "dynamic" and len(engine.qmodel.of_kind("weight")) == 2
    for i, x in enumerate(ids):
        np.testing.assert_allclose(engine.run(i, ())["y"], run_model(fp, {"ids": x})["y"], rtol=0, atol=1e-5)
        given = run_model(q, {"ids": x}, level="all")["y"]
        assert np.abs(engine.run(i, "all")["y"] - given).max() <= 1e-5 * float(np.abs(given).max())
    assert len(get_sensitivity_of_nodes(engine, node_type="weight")) == 2


@pytest.mark.parametrize("nodes, config", [
    (["proj_q", "proj_k", "proj_v"], ["x_QuantizeLinear", "wq_DequantizeLinear", "wk_DequantizeLinear",
                                      "wv_DequantizeLinear"]),
    (["proj_o"], ["ctx_QuantizeLinear", "wo_DequantizeLinear"]),
    (["scores"], ["q_QuantizeLinear", "kt_QuantizeLinear"]),
])
def test_dynamic_configs_match_onnxruntime_quantizing_those_nodes(built, tmp_path, nodes, config):
    """A config of the engine against quantize_dynamic(nodes_to_quantize=...) run as is."""
    p, data = built
    engine = Engine(p["att_dyn2"], data["att"], float_model=p["att"])
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(str(p["att"]), str(tmp_path / "part.onnx"), per_channel=True, nodes_to_quantize=nodes,
                     extra_options={"MatMulConstBOnly": False}, reduce_range=True)  # as fm.quantize_dyn
    for i, x in enumerate(data["att"]["x"]):
        ref = run_model(tmp_path / "part.onnx", {"x": x}, level="all")["y"]
        got = engine.run(i, config)["y"]
        assert np.abs(got - ref).max() <= 1e-5 * float(np.abs(ref).max())


def test_qattention_becomes_attention_on_dequantized_inputs(tmp_path):
    rng = np.random.default_rng(0)
    h = 16
    inits = [numpy_helper.from_array((rng.standard_normal((h, 3 * h)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(3 * h) * 0.1).astype(np.float32), "b")]
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=2, name="attn")
    graph = helper.make_graph([node], "a", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, h])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "a.onnx"))
    fm.quantize_dyn(tmp_path / "a.onnx", tmp_path / "a_dyn.onnx")
    assert "QAttention" in _ops(tmp_path / "a_dyn.onnx")
    data = fm.samples_of((1, 6, h), n=3)
    engine = Engine(tmp_path / "a_dyn.onnx", data, float_model=tmp_path / "a.onnx")
    assert [c.kind for c in engine.qmodel.calibration.values()] == ["dynamic", "weight"]
    for i, x in enumerate(data["x"]):
        np.testing.assert_allclose(engine.run(i, ())["y"], run_model(tmp_path / "a.onnx", {"x": x})["y"], atol=1e-6)
        ref = run_model(tmp_path / "a_dyn.onnx", {"x": x}, level="all")["y"]
        assert np.abs(engine.run(i, "all")["y"] - ref).max() <= 1e-5 * float(np.abs(ref).max())


# -- the analyses on these formats --------------------------------------------------------------
@pytest.mark.parametrize("name", ["ops_qop", "att_dyn2", "lstm_dyn"])
def test_rankings_are_finite(built, name):
    p, data = built
    engine = Engine(p[name], data[_data(name)], float_model=p[_float(name)])
    for kind in ("weight", "activation"):
        sens = get_sensitivity_of_nodes(engine, ["cosine-similarity"], node_type=kind, progress=False)
        values = [v["cosine-similarity"] for v in sens.values()]
        assert values and all(np.isfinite(values)), kind
    if name == "att_dyn2":
        assert {sens.details[n]["kind"] for n in sens} == {"dynamic"}


def test_runall_on_a_dynamic_model(built, tmp_path):
    import pytest_ptq.debug as dbg

    p, data = built
    summary = dbg.runall(p["att_dyn2"], data["att"], save_dir=tmp_path / "out", float_model=p["att"], top=2,
                         progress=False)
    assert summary["format"] == "dynamic" and summary["made_by"].startswith("onnxruntime quantize_dynamic")
    md = (tmp_path / "out" / "summary.md").read_text()
    assert f"(dynamic format, made by {summary['made_by']})" in md
    dynamic = [d for d in summary["distributions"].values() if d["kind"] == "dynamic"]
    assert dynamic and all(d["clipped_count"] == 0 and d["range_lo"] <= 0 <= d["range_hi"] for d in dynamic)
    items = [it for it in summary["verdict"]["nodes"] if it["kind"] == "activation"]
    close = summary["verdict"]["source"] == "neither"  # the model stays close to float: nothing to do
    assert items and all(it["try"] == ([] if close else ["keep in float"]) for it in items)  # no int16 to try


def test_a_dynamic_remedy_is_in_quantize_dynamic_terms_and_re_quantized(built, tmp_path):
    import pytest_ptq.debug as dbg

    p, data = built
    engine = Engine(p["att_dyn2"], data["att"], float_model=p["att"])
    r = dbg.suggest_remedy(engine, target=0.99996, float_model=p["att"], save_dir=tmp_path)
    assert r.settings["quantizer"] == "quantize_dynamic" and r.settings["nodes_to_exclude"]
    assert r.python_snippet().startswith("quantize_dynamic(..., nodes_to_exclude=")
    assert set(r.settings["nodes_to_exclude"]) <= {n.name for n in onnx.load(str(p["att"])).graph.node}
    assert r.measured["options"]["quantizer"] == "quantize_dynamic"
    # the re-quantized model is the simulated remedy, to rounding
    assert abs(r.measured["value"] - r.figures["calibration"]["after"]) < 1e-4


def test_a_dynamic_per_channel_remedy_is_quantize_dynamics_switch(built, tmp_path):
    """quantize_dynamic refuses a per-channel TensorQuantOverrides entry ("Expected tensor 'wq'
    to use per-tensor quantization overrides"): per-channel weights are its per_channel
    switch, and the re-quantized model is the simulated one."""
    import pytest_ptq.debug as dbg
    from onnx import numpy_helper

    p, data = built
    engine = Engine(p["att_dyn"], data["att"], float_model=p["att"])
    r = dbg.suggest_remedy(engine, target=0.99999, remedy="per-channel", float_model=p["att"], save_dir=tmp_path,
                           progress=False)
    assert r.nodes and r.settings["per_channel"] is True and r.settings["TensorQuantOverrides"] == {}
    assert r.python_snippet() == "quantize_dynamic(..., per_channel=True)"
    assert abs(r.measured["value"] - r.figures["calibration"]["after"]) < 1e-5
    requantized = onnx.load(r.measured["model"])
    scales = [numpy_helper.to_array(i).size for i in requantized.graph.initializer if i.name.endswith("_scale")]
    assert scales and all(n > 1 for n in scales)


def test_the_report_header_names_the_format(built, tmp_path):
    from types import SimpleNamespace

    from pytest_ptq import report
    from pytest_ptq.analysis import Analysis, AnalysisKey

    p, data = built
    builders.save_folder(data["att"], tmp_path / "calib")
    analysis = Analysis(AnalysisKey(str(p["att_dyn"]), str(tmp_path / "calib"), str(p["att"])), root=tmp_path)
    settings = SimpleNamespace(node_type="activation", metric="cosine-similarity", top=3)
    payload = report.model_payload(analysis, [], settings)
    assert payload["format"] == "dynamic" and payload["made_by"].startswith("onnxruntime quantize_dynamic")
    page = report.render([payload])
    assert f"<p>dynamic format, made by {payload['made_by']}; data " in page


@pytest.mark.parametrize("name", ["ops_qop", "lstm_dyn"])
def test_the_integer_stage_runs_the_file_as_given(built, name):
    import pytest_ptq.debug as dbg

    p, data = built
    samples = data[_data(name)]
    report = dbg.localize_stages(p[_float(name)], p[name], samples)
    outs = [o.name for o in onnx.load(str(p[name])).graph.output]
    floats = [run_model(p[_float(name)], {"x": x}) for x in samples["x"]]
    files = [run_model(p[name], {"x": x}, level="all") for x in samples["x"]]
    expected = min(pooled_cosine([f[o] for f in floats], [q[o] for q in files]) for o in outs)
    assert report.value("integer") == pytest.approx(expected, abs=1e-9)
    described = {st["stage"]: st["description"] for st in report.stages}
    fmt = "QOperator" if name.endswith("qop") else "dynamic"
    assert described["integer"].startswith(f"{fmt} model as stored")
    assert described["fake-quant"].startswith(f"{fmt} model rewritten to Q/DQ")
    # the simulation is the QDQ form: within a step of the kernels, or the LSTM's hidden state
    assert 0.9999 <= report.kernel_gap["values"]["cosine-similarity"] < 1 - 1e-9


@pytest.mark.parametrize("name", ["ops_qop", "ops_qop_pc", "att_qop", "att_dyn", "att_dyn2", "att_dyn_opt",
                                  "lstm_dyn", "lstm2_dyn_pc"])
def test_curves_part_by_part_equal_one_session_on_rewritten_formats(built, name):
    """QOperator and dynamic models analysed in their QDQ form: the curves, run part by part
    through the segments (each part exposing its own nodes), equal those of one session
    exposing every node, local errors included."""
    from pytest_ptq.curves import configs_from, get_acc_error

    p, data = built
    args = (str(p[name]), data[_data(name)])
    kwargs = dict(float_model=str(p[_float(name)]), optimization="disable")
    whole, parted = Engine(*args, segments=0, **kwargs), Engine(*args, segments=4, **kwargs)
    configs = {**configs_from(whole, ["weight", "activation"]), "all": list(whole.calib_names)}
    want = get_acc_error(whole, configs, progress=False)
    got = get_acc_error(parted, configs, progress=False)
    assert got.nodes == want.nodes and parted.probe_parts(got.tensors) > 1
    for label in configs:
        np.testing.assert_allclose(got.values[label], want.values[label], rtol=0, atol=1e-6, err_msg=label)
    assert [v is None for v in got.local] == [v is None for v in want.local]
    np.testing.assert_allclose([v for v in got.local if v is not None], [v for v in want.local if v is not None],
                               rtol=0, atol=1e-6)


def test_the_first_dynamic_quantizers_run_quantized_bias_and_large_weights(tmp_path):
    """onnx.quantize 0.1.0 (ddddocr's OCR model, say) adds a bias quantized on every run to
    ConvInteger's sum before the Cast; its second weight is a large initializer, which the
    rewrite reads from the memory-mapped file. Each config against the same convention
    written with just those input quantizers (the rest float Convs of the float input) and
    run in plain onnxruntime, the integer kernels included."""
    path, float_path = tmp_path / "early.onnx", tmp_path / "early_float.onnx"
    fm.early_dynamic_net(path, float_path=float_path)
    data = fm.samples_of((1, 1, 8, 12), n=3)
    engine = Engine(path, data)
    dynamic = [c.name for c in engine.qmodel.of_kind("dynamic")]
    assert engine.qmodel.format_label == "dynamic" and dynamic == ["x_QuantizeLinear", "h0_QuantizeLinear"]
    assert any("quantized on every run" in n and "'conv0', 'conv1'" in n for n in engine.warnings)
    out = engine.model_outputs[0]
    expected = {(0, 1): "all", (0,): dynamic[:1], (1,): dynamic[1:], (): []}
    for integer, config in expected.items():
        ref = fm.early_dynamic_net(tmp_path / f"part{len(integer)}{integer[:1]}.onnx", integer=integer)
        for i, x in enumerate(data["x"]):
            want, got = run_model(ref, {"x": x})[out], engine.run(i, config)[out]
            assert np.abs(got - want).max() <= 1e-6 * float(np.abs(want).max()), (integer, i)
    # with the float model, only the bias's rounding is left between bypassed and float
    engine = Engine(path, data, float_model=float_path)
    got = [engine.run(i, ())[out] for i in range(3)]
    want = [run_model(float_path, {"x": x})[out] for x in data["x"]]
    assert pooled_cosine(want, got) >= 0.999999 and max(np.abs(g - w).max() for g, w in zip(got, want)) > 0
    # the float model of another training: said so, without quantize_static's QDQ options
    fm.early_dynamic_net(tmp_path / "other.onnx", float_path=tmp_path / "other_float.onnx", seed=5)
    with pytest.raises(PTQError, match="only 0 of the 2 weights matched by position round from its values; check "
                                       "that it is the model this one was quantized from$"):
        Engine(path, data, float_model=tmp_path / "other_float.onnx")


@pytest.mark.parametrize("per_channel", [False, True])
def test_per_direction_lstm_weights_below_opset_13(tmp_path, per_channel):
    """quantize_dynamic scales a bidirectional LSTM's weights per direction, which the
    standard DequantizeLinear takes only from opset 13: at opset 12 the rewrite uses
    onnxruntime's own; bypassed is the float model, quantized the file."""
    fm.lstm_net(tmp_path / "lstm.onnx", bidirectional=True)
    model = onnx.load(str(tmp_path / "lstm.onnx"))
    model.opset_import[0].version = 12
    onnx.save(model, str(tmp_path / "lstm12.onnx"))
    fm.quantize_dyn(tmp_path / "lstm12.onnx", tmp_path / "q.onnx", per_channel=per_channel)
    data = fm.samples_of((5, 1, 8))
    engine = Engine(tmp_path / "q.onnx", data, float_model=tmp_path / "lstm12.onnx")
    assert not engine.qmodel.alignment.unmatched_weights
    assert engine.qmodel.calibration["W_DequantizeLinear"].axis == 0
    ref_q, got_q = [], []
    for i, x in enumerate(data["x"]):
        want = run_model(tmp_path / "lstm12.onnx", {"x": x})["logits"]
        np.testing.assert_allclose(engine.run(i, ())["logits"], want, rtol=0, atol=1e-6)
        ref_q.append(run_model(tmp_path / "q.onnx", {"x": x}, level="all")["logits"])
        got_q.append(engine.run(i, "all")["logits"])
    assert pooled_cosine(ref_q, got_q) >= 0.99999  # the kernel also quantizes the hidden state


@pytest.mark.parametrize("where", ["inline", "external"])
@pytest.mark.parametrize("fmt", ["dynamic", "QOperator"])
def test_large_integer_weights_are_read_from_the_mapped_file(tmp_path, fmt, where):
    """A weight of 64 KiB or more stays in the file (memory-mapped) when the model is loaded,
    the .onnx file or its external data; the rewrite into QDQ form reads it from there (both
    raised onnx's external-data error)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((300, 300)) * 0.05).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 300])], [w])
    builders.save_model(graph, tmp_path / "f.onnx")
    data = fm.samples_of((1, 4, 300), n=2)
    if fmt == "dynamic":
        fm.quantize_dyn(tmp_path / "f.onnx", tmp_path / "q.onnx")
    else:
        fm.quantize_qoperator(tmp_path / "f.onnx", tmp_path / "q.onnx", data)
    assert max(i.ByteSize() for i in onnx.load(str(tmp_path / "q.onnx")).graph.initializer) >= 300 * 300
    qpath = tmp_path / "q.onnx"
    if where == "external":
        qpath = tmp_path / "external" / "q.onnx"
        qpath.parent.mkdir()
        onnx.save(onnx.load(str(tmp_path / "q.onnx")), str(qpath), save_as_external_data=True, location="q.bin",
                  size_threshold=1024)
    engine = Engine(qpath, data, float_model=tmp_path / "f.onnx")
    assert engine.qmodel.format_label == fmt
    for i, x in enumerate(data["x"]):
        np.testing.assert_allclose(engine.run(i, ())["y"], run_model(tmp_path / "f.onnx", {"x": x})["y"],
                                   rtol=0, atol=1e-5)
        want = run_model(tmp_path / "q.onnx", {"x": x}, level="all")["y"]
        assert pooled_cosine([want], [engine.run(i, "all")["y"]]) >= 0.9999


@pytest.mark.parametrize("name", ["ops_qop", "att_dyn"])
def test_runall_says_when_the_file_runs_otherwise_than_its_simulation(built, name, tmp_path, monkeypatch):
    from pytest_ptq import runall as runall_mod
    from pytest_ptq import stages
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.stages import simulation_gap

    p, data = built
    samples = {k: v[:2] for k, v in data[_data(name)].items()}
    engine = Engine(p[name], samples, float_model=p[_float(name)])
    specs = parse_outputs(None, engine)
    # the file on onnxruntime's kernels against its Q/DQ form run with Q/DQ as float arithmetic
    rewritten = QuantModel(p[name]).full_model()
    feeds = [{k: v[i] for k, v in samples.items()} for i in range(2)]
    given = [run_model(p[name], f, level="all") for f in feeds]
    simulated = [run_model(rewritten, f) for f in feeds]
    expected = min(pooled_cosine([g[s.tensor]], [q[s.tensor]]) for g, q in zip(given, simulated) for s in specs)
    gap = simulation_gap(engine, specs)
    assert gap == pytest.approx(expected, abs=1e-6) and 0.999 < gap < 1
    summary = runall_mod.runall(engine, save_dir=tmp_path / "quiet", top=1, progress=False)
    assert not any("simulates this" in w for w in summary["warnings"])
    monkeypatch.setattr(stages, "SIMULATION_CLOSE", 1.0)  # any difference at all
    summary = runall_mod.runall(engine, save_dir=tmp_path / "told", top=1, progress=False)
    told = [w for w in summary["warnings"] if "simulates this" in w]
    assert len(told) == 1 and f"output cosine {gap:.4f}" in told[0]
    assert "\n  - fix: measure the file itself against float" in (tmp_path / "told" / "summary.md").read_text()
    whole = Engine(p[name], data[_data(name)], float_model=p[_float(name)])
    read = []
    monkeypatch.setattr(whole.data, "sample", lambda i, sample=whole.data.sample: read.append(i) or sample(i))
    simulation_gap(whole, specs, samples=3)  # spread over the data: its end too
    last = len(whole.data) - 1
    assert last >= 3 and len(set(read)) == 3 and {0, last} < set(read)
    # runall --data-num 2 looks at those two samples only, and says how many it compared
    read.clear()
    summary = runall_mod.runall(whole, data_num=2, save_dir=tmp_path / "two", top=1, progress=False)
    told = [w for w in summary["warnings"] if "simulates this" in w]
    assert len(told) == 1 and "the worst of 2 samples spread over the data" in told[0]
    assert "`stages` compares every sample, pooled and one by one" in told[0]
    assert set(read) <= {0, 1}, read


def test_the_clis_rankings_and_curves_say_when_the_file_runs_otherwise(built, tmp_path, monkeypatch, capsys):
    from pytest_ptq import stages
    from pytest_ptq.cli import main

    p, data = built
    folder = builders.save_folder({k: v[:2] for k, v in data[_data("ops_qop")].items()}, tmp_path / "calib")
    common = [str(p["ops_qop"]), str(folder), "--float-model", str(p[_float("ops_qop")]), "--quiet"]
    assert main(["get-sensitivity-of-nodes", *common]) == 0
    assert "simulates this" not in capsys.readouterr().err  # close: nothing said
    monkeypatch.setattr(stages, "SIMULATION_CLOSE", 1.0)  # any difference at all
    for command in (["get-sensitivity-of-nodes"], ["plot-acc-error", "-s", str(tmp_path / "curves")]):
        assert main([*command, *common]) == 0
        err = capsys.readouterr().err
        assert err.count("simulates this") == 1, (command, err)


def test_a_qdq_file_is_checked_on_the_kernels_onnxruntime_fuses_its_pairs_into(built, tmp_path, monkeypatch):
    """A QDQ file deploys on onnxruntime with its pairs fused into integer kernels (its default
    options), which round otherwise than the Q/DQ arithmetic every figure simulates, and on
    x86 without AVX-VNNI saturate: runall measured only QOperator and dynamic files, so a QDQ
    file whose deployed outputs left the simulation's (YOLOv8n per channel: simulated 0.62,
    on this CPU's kernels 0) got no word of it."""
    import onnxruntime as ort

    from pytest_ptq import runall as runall_mod
    from pytest_ptq import stages
    from pytest_ptq.engine.runtime import integer_kernels_saturate
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.stages import simulation_gap

    p, data = built
    samples = {k: v[:3] for k, v in data["ops"].items()}
    engine = Engine(p["ops_qdq"], samples, float_model=p["ops"])
    specs = parse_outputs(None, engine)
    fused = ort.InferenceSession(str(p["ops_qdq"]), providers=["CPUExecutionProvider"])  # a user's session
    feeds = [{k: v[i] for k, v in samples.items()} for i in range(3)]
    simulated = [run_model(p["ops_qdq"], f, "all", disabled_optimizers=("NchwcTransformer",)) for f in feeds]  # plain layout
    expected = min(pooled_cosine([fused.run([s.tensor], f)[0]], [sim[s.tensor]])
                   for f, sim in zip(feeds, simulated) for s in specs)
    gap = simulation_gap(engine, specs)
    assert gap == pytest.approx(expected, abs=1e-6) and gap < 1 - 1e-7  # the kernels do round otherwise
    monkeypatch.setattr(stages, "SIMULATION_CLOSE", 1.0)  # any difference at all
    summary = runall_mod.runall(engine, save_dir=tmp_path / "told", top=1, progress=False)
    told = [w for w in summary["warnings"] if w.startswith(stages.SIMULATION_WARNING)]
    assert len(told) == 1 and f"output cosine {gap:.4f}" in told[0]
    assert "running this QDQ file with its default options (its pairs fused into integer kernels" in told[0]
    # the widest weights of quantize_static's defaults, on a CPU whose kernels saturate: named as the cause
    assert ("saturate uint8 x int8 products" in told[0]) == (integer_kernels_saturate() and bool(
        stages.saturation_cause(engine.qmodel, None)))


def test_a_node_left_float_between_quantized_ones_is_named_as_onnxruntime_requantizes_it(zoo, tmp_path, monkeypatch):
    """onnxruntime's WeightBiasQuantization (a default optimization) quantizes a Conv's float
    weight to per-tensor int8 where the Conv reads a quantized input and feeds a
    QuantizeLinear: a node kept in float between quantized neighbours (nodes_to_exclude, a
    'float' remedy) is float only in the simulation. The PP-OCRv4 detector's fixed model read
    0.9512 against its simulation, all of it this (0.9997 with the optimization off)."""
    import onnxruntime as ort

    from pytest_ptq import stages
    from pytest_ptq.kernels import requantized_nodes
    from pytest_ptq.outputs import parse_outputs

    # one channel of conv2's weight 30x the others: per-tensor int8 codes crush the rest
    float_model, data = onnx.load(str(zoo.float("qdq"))), zoo.data("qdq")
    w2 = next(i for i in float_model.graph.initializer if i.name == "w2")
    wide = numpy_helper.to_array(w2).copy()
    wide[0] *= 30
    w2.CopyFrom(numpy_helper.from_array(wide, "w2"))
    fpath = tmp_path / "float.onnx"
    onnx.save(float_model, fpath)
    q = builders.quantize(fpath, tmp_path / "q.onnx", data, keep_float=False, reduce_range=True)
    model = onnx.load(str(q))  # conv2's weight and bias as the float model has them: the node excluded
    conv2 = next(n for n in model.graph.node if n.name == "conv2")
    floats = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(fpath)).graph.initializer}
    for k, name in ((1, "w2"), (2, "b2")):
        model.graph.initializer.append(numpy_helper.from_array(floats[name], f"{name}_kept_float"))
        conv2.input[k] = f"{name}_kept_float"
    onnx.save(model, tmp_path / "excluded.onnx")
    engine = Engine(tmp_path / "excluded.onnx", data, float_model=fpath)
    assert requantized_nodes(engine.qmodel, (1,)) == ["conv2"] == requantized_nodes(engine.qmodel, (2,))
    specs = parse_outputs(None, engine)
    feeds = [{"x": x} for x in data["x"]]

    def against_simulation(disabled):  # independently: plain sessions, as deployed and with Q/DQ as float
        sess = ort.InferenceSession(str(tmp_path / "excluded.onnx"), providers=["CPUExecutionProvider"],
                                    disabled_optimizers=disabled)
        sim = run_model(tmp_path / "excluded.onnx", feeds, "all")
        return min(pooled_cosine([sess.run(["prob"], f)[0]], [s["prob"]]) for f, s in zip(feeds, sim))

    given, off = against_simulation([]), against_simulation(["WeightBiasQuantization"])
    assert given < off  # the deployed file loses more than the simulation
    monkeypatch.setattr(stages, "SIMULATION_CLOSE", 1.0)
    (told,) = stages.simulation_warnings(engine, specs)
    assert f"output cosine {given:.4f}" in told
    assert ("default optimization WeightBiasQuantization quantizes the float weights of 1 node(s) reading a "
            "quantized input ('conv2') to per-tensor int8 (so a node left in float there is float only in the "
            "simulation), and the float biases of 1 node(s) to int32") in told
    finding, *causes = told.split("\n")  # a line each
    assert finding.endswith("; why:") and any(c.startswith("onnxruntime's default optimization Weight") for c in causes)
    assert f"disabled_optimizers=['WeightBiasQuantization'])) the file reads {off:.6f}" in told


def test_saturating_kernels_are_said_to_be_why_the_file_differs(built, tmp_path):
    """quantize_dynamic's full-range int8 weights: onnxruntime's kernels run the file as the
    simulation where they do not saturate, and where they do the warning says so."""
    from pytest_ptq.engine.runtime import integer_kernels_saturate
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.stages import simulation_gap, simulation_warnings

    from pytest_ptq.kernels import saturating_nodes

    p, data = built
    assert saturating_nodes(QuantModel(p["att_dyn"])) == []  # 7-bit weights: no pair reaches int16's limit
    path = fm.quantize_dyn(p["att"], tmp_path / "full.onnx", reduce_range=False)
    engine = Engine(path, data["att"], float_model=p["att"])
    specs = parse_outputs(None, engine)
    gap, told = simulation_gap(engine, specs), simulation_warnings(engine, specs)
    if integer_kernels_saturate():
        assert gap < 0.999 and len(told) == 1
        integer = [n.name for n in onnx.load(str(path)).graph.node if n.op_type in ("MatMulInteger",
                                                                                     "DynamicQuantizeMatMul")]
        assert len(integer) == 4 and "saturate uint8 x int8 products" in told[0]
        assert f"4 node(s) here run such products ('{integer[0]}'" in told[0]
        read = re.search(r"\(checked: with those weights stored as uint8, the same values, the file reads ([0-9.]+) ",
                         told[0])
        assert read and float(read.group(1)) >= 0.999
    else:
        assert gap > 0.99999 and told == []


def test_a_search_on_a_file_that_runs_otherwise_than_simulated_says_so(built, tmp_path):
    """suggest scores a dynamic model in its Q/DQ form: where this CPU's kernels saturate, the
    file itself falls short of those figures, and the result says so as runall does."""
    from pytest_ptq.engine.runtime import integer_kernels_saturate
    from pytest_ptq.remedy import suggest_remedy

    p, data = built
    path = fm.quantize_dyn(p["att"], tmp_path / "full.onnx", reduce_range=False)
    # met by the simulation with nothing remedied (0.99996), while the file reads 0.993 here
    result = suggest_remedy(str(path), data["att"], float_model=p["att"], target=0.9999, progress=False)
    assert result.met and result.nodes == []
    told = [w for w in result.warnings if w.startswith("the file runs otherwise than its simulation")]
    assert len(told) == (1 if integer_kernels_saturate() else 0)


def test_an_lstm_is_named_by_its_recurrent_weights_too(built, tmp_path):
    """DynamicQuantizeLSTM multiplies the hidden state by its recurrent weights R as well as
    the input by W: full-range codes in either one saturate its pair sums; how far a code
    reaches is counted from its zero point."""
    from pytest_ptq.kernels import saturating_nodes

    p, _ = built
    assert saturating_nodes(QuantModel(p["lstm_dyn"])) == []  # reduce_range: both 7-bit
    for weight in ("W_quantized", "R_quantized"):
        model = onnx.load(p["lstm_dyn"])
        init = next(i for i in model.graph.initializer if i.name == weight)
        codes = numpy_helper.to_array(init).copy()
        codes.flat[0] = 127
        init.CopyFrom(numpy_helper.from_array(codes, weight))
        onnx.save(model, tmp_path / "wide.onnx")
        assert saturating_nodes(QuantModel(str(tmp_path / "wide.onnx"))) == ["lstm_quant"], weight
    # codes far from 0 but near their zero point reach no further than 7-bit ones
    model = onnx.load(p["lstm_dyn"])
    shifted = {"R_quantized": lambda r: (r.astype(np.int16) // 2 - 60).astype(np.int8),
               "R_zero_point": lambda z: np.full_like(z, -60)}
    for init in model.graph.initializer:
        if init.name in shifted:
            init.CopyFrom(numpy_helper.from_array(shifted[init.name](numpy_helper.to_array(init)), init.name))
    onnx.save(model, tmp_path / "offset.onnx")
    assert np.abs(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "R_quantized"))).max() > 64
    assert saturating_nodes(QuantModel(str(tmp_path / "offset.onnx"))) == []


def test_the_plugin_tells_when_the_file_runs_otherwise_than_its_simulation(built, pytester, monkeypatch):
    from pytest_ptq import stages
    from test_plugin import run

    p, data = built
    folder = builders.save_folder({k: v[:4] for k, v in data["ops"].items()}, pytester.path / "calib")
    monkeypatch.setattr(stages, "SIMULATION_CLOSE", 1.0)  # any difference at all (in-process run)
    result = run(pytester, "--ptq-model", str(p["ops_qop"]), "--ptq-data", str(folder), "--ptq-float-model",
                 str(p["ops"]), "-p", "no:xdist")
    # the finding on the warning's lines, each cause and the fix on lines of their own (each wrapped)
    joined = " ".join(result.stdout.str().split())
    assert re.search(r"warning: \S+ the file runs otherwise than its simulation: every figure simulates this QOperator "
                     r"file.*; why: - .* fix: measure the file itself against float.*ptq-debug stages", joined), joined
    assert any(x.startswith("  - ") for x in result.stdout.lines)
    assert any(x.startswith("  fix: measure the file itself") for x in result.stdout.lines)


def test_a_released_analysis_has_checked_its_simulation_before_its_sessions_went(built, tmp_path, monkeypatch):
    from pytest_ptq import stages
    from pytest_ptq.analysis import Analysis, AnalysisKey

    p, data = built
    folder = builders.save_folder({k: v[:2] for k, v in data["ops"].items()}, tmp_path / "calib")
    monkeypatch.setattr(stages, "SIMULATION_CLOSE", 1.0)
    analysis = Analysis(AnalysisKey(str(p["ops_qop"]), str(folder), str(p["ops"])), root=tmp_path)
    engine = analysis.engine
    analysis.release()  # as the plugin does after a model's last test
    runs = []
    monkeypatch.setattr(type(engine), "run", lambda *a, **k: runs.append(a))
    told = [w for w in analysis.warnings if w.startswith(stages.SIMULATION_WARNING)]
    assert len(told) == 1 and runs == []  # read after the release: nothing runs again


def test_a_remedy_names_the_float_tensor_a_qoperator_files_dequantizelinear_kept(tmp_path):
    """Conv -> LeakyRelu -> Sin: the QOperator file keeps the float name 'lr' on the
    DequantizeLinear before the float Sin, so the rewrite named LeakyRelu's float output anew;
    suggest printed that name ('lr_quantized_float'), which quantize_static ignores."""
    helper = onnx.helper
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4, name="conv"),
                               helper.make_node("LeakyRelu", ["c"], ["lr"], alpha=0.1, name="leaky"),
                               helper.make_node("Sin", ["lr"], ["y"], name="sin")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = fm.samples_of((1, 3, 16, 16))
    q = tmp_path / "q.onnx"
    fm.quantize_qoperator(fp, q, data)
    assert any(n.op_type == "DequantizeLinear" and n.output[0] == "lr" for n in onnx.load(str(q)).graph.node)
    qm = QuantModel(str(q), float_model=str(fp))
    pair = next(c for c in qm.calibration.values() if c.producer == "leaky")
    assert pair.input != "lr" and qm.float_names == {pair.input: "lr"}
    settings = onnxruntime_settings(qm, "int16", [pair.name])
    assert settings["TensorQuantOverrides"] == {"lr": [{"quant_type": "QUInt16"}]}
    # independently: quantize_static applies it (a name it does not know it drops silently)
    from onnxruntime.quantization import QuantType

    again = builders.quantize(fp, tmp_path / "again.onnx", data, extra_options={
        "TensorQuantOverrides": {"lr": [{"quant_type": QuantType.QUInt16}]}})
    model = onnx.load(str(again))
    zp = next(n.input[2] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "lr")
    assert next(i for i in model.graph.initializer if i.name == zp).data_type == TensorProto.UINT16


def test_integer_ops_inside_a_branch_are_named_as_not_analysed(tmp_path, capsys):
    """quantize_dynamic with EnableSubgraph quantizes an If branch's MatMul into a
    MatMulInteger, which no note named: the float reference kept it quantized in silence."""
    rng = np.random.default_rng(0)
    wi, wo = (numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32), n) for n in ("wi", "wo"))
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 6]) for n in ("t", "t2", "x", "y")]
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "wi"], ["t"], name="then_mm")], "then", [], [vi[0]],
                               [wi])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t2"], name="else_neg")], "else", [], [vi[1]])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="rsum"),
             helper.make_node("Greater", ["s", "z"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["o"], then_branch=then_g, else_branch=else_g, name="iff"),
             helper.make_node("MatMul", ["o", "wo"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [vi[2]], [vi[3]], [wo, numpy_helper.from_array(np.float32(0), "z")])
    fpath = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), fpath)
    q = fm.quantize_dyn(fpath, tmp_path / "q.onnx", extra_options={"EnableSubgraph": True})
    inner = [b.op_type for n in onnx.load(str(q)).graph.node if n.op_type == "If"
             for a in n.attribute for b in a.g.node]
    assert "MatMulInteger" in inner  # the case
    assert main(["list-nodes", str(q)]) == 0
    assert "1 quantized node(s) (1 MatMulInteger) inside the subgraphs of If 'iff' are not analysed" in \
        capsys.readouterr().out


def test_a_batch_normalization_between_pairs_is_not_named_as_running_integer_products(tmp_path):
    """A BatchNormalization quantize_static quantizes, scale and input, runs in float when
    onnxruntime loads the file; the saturation warning named it beside the Convs."""
    from pytest_ptq.kernels import saturating_nodes

    rng = np.random.default_rng(0)
    c = 8
    inits = [numpy_helper.from_array((rng.standard_normal((c, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(c) * 3).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "beta"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "mean"),
             numpy_helper.from_array((rng.random(c) + 0.5).astype(np.float32), "var")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])], inits)
    fpath = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), fpath)
    data = {"x": [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(2)]}
    q = builders.quantize(fpath, tmp_path / "q.onnx", data, keep_float=False)
    qm = QuantModel(str(q))
    assert {n for c_ in qm.calibration.values() if c_.kind == "weight" for n in c_.consumers} >= {"conv", "bn"}
    assert saturating_nodes(qm) == ["conv"]


def _runs_are_the_file_and_the_float_model(engine, q, f, samples, atol, apart):
    """Each sample's quantized run against a plain session on file ``q`` and its bypassed run
    against one on float model ``f`` (output "y", within ``atol``), the two more than ``apart``
    off each other; returns the float model's outputs and the file's."""
    [(name, feeds)] = samples.items()
    refs, files = [], []
    for i, x in enumerate(feeds):
        given, ref = run_model(q, {name: x})["y"], run_model(f, {name: x})["y"]
        np.testing.assert_allclose(engine.run(i, "all")["y"], given, rtol=0, atol=atol)  # quantized: the file
        np.testing.assert_allclose(engine.run(i, ())["y"], ref, rtol=0, atol=atol)  # bypassed: the float model
        assert np.abs(given - ref).max() > apart  # which differ
        refs.append(ref)
        files.append(given)
    return refs, files


def test_a_dynamic_table_dequantized_after_the_ops_that_move_it_is_a_weight(tmp_path):
    """quantize_dynamic stores an embedding as uint8 and dequantizes it after Gather and a
    Transpose (before an op it does not quantize): that table was no weight node, stayed
    quantized in the float reference, and the file was refused as unquantized when nothing
    else was quantized."""
    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.standard_normal((20, 8)).astype(np.float32), "emb")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["g"], name="gather"),
             helper.make_node("Transpose", ["g"], ["t"], perm=[1, 0, 2], name="tr"),
             helper.make_node("Tanh", ["t"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 8])], [emb])
    fpath = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fpath)
    q = fm.quantize_dyn(fpath, tmp_path / "q.onnx")
    ops = [n.op_type for n in onnx.load(str(q)).graph.node]
    assert ops == ["Gather", "Transpose", "DequantizeLinear", "Tanh"]  # the case
    samples = {"ids": [rng.integers(0, 20, (1, 5)).astype(np.int64) for _ in range(3)]}
    engine = Engine(str(q), samples, float_model=str(fpath))
    assert [c.name for c in engine.qmodel.of_kind("weight")] == ["emb_DequantizeLinear"]
    _runs_are_the_file_and_the_float_model(engine, q, fpath, samples, atol=1e-6, apart=1e-3)


def _transposed_codes_net(tmp_path, out_ch, in_ch, mover=("Transpose", {"perm": [1, 0, 2, 3]}, {}), seed=0,
                          stored=lambda a: a.transpose(1, 0, 2, 3), producer=""):
    """A Conv weight stored as int8 codes laid out [in, out, kh, kw] (``stored``: the layout
    of the [out, in, kh, kw] codes), a ``mover`` (a Transpose to [out, in, kh, kw]) and a
    per-channel DequantizeLinear along its output axis 0; and its float model, the float
    weight stored the same way behind the same node. ``mover``: (op, attributes, {its further
    inputs: their values}); ``producer``: the quantized file's producer_name."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out_ch, in_ch, 3, 3)) * 0.3).astype(np.float32)
    w[2] *= 8  # one channel's scale far from the others': scales on the wrong axis show
    scales = (np.abs(w).max(axis=(1, 2, 3)) / 127).astype(np.float32)
    codes = np.clip(np.round(w / scales.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8)
    op, attrs, extra = mover
    extra_inits = [numpy_helper.from_array(v, k) for k, v in extra.items()]
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, in_ch, 8, 8])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_ch, 8, 8])])
    conv = helper.make_node("Conv", ["x", "wdq"], ["y"], name="conv", pads=[1, 1, 1, 1])
    qdq = helper.make_graph(
        [helper.make_node(op, ["codes", *extra], ["ct"], name="w_move", **attrs),
         helper.make_node("DequantizeLinear", ["ct", "s", "z"], ["wdq"], name="w_DQ", axis=0), conv], "q", *io,
        [numpy_helper.from_array(np.ascontiguousarray(stored(codes)), "codes"), numpy_helper.from_array(scales, "s"),
         numpy_helper.from_array(np.zeros(out_ch, np.int8), "z"), *extra_inits])
    flt = helper.make_graph([helper.make_node(op, ["wt", *extra], ["wdq"], name="w_move", **attrs), conv], "f", *io,
                            [numpy_helper.from_array(np.ascontiguousarray(stored(w)), "wt"), *extra_inits])
    samples = {"x": [rng.standard_normal((1, in_ch, 8, 8)).astype(np.float32) for _ in range(2)]}
    qmodel = helper.make_model(qdq, opset_imports=[helper.make_opsetid("", 13)], ir_version=8, producer_name=producer)
    onnx.save(qmodel, tmp_path / "q.onnx")
    return tmp_path / "q.onnx", builders.save_model(flt, tmp_path / "f.onnx", opset=13), samples


def _decoded(q, dq):
    """What DequantizeLinear node ``dq`` of file ``q`` writes (a weight: no input matters), as a
    plain onnxruntime session on the file computes it."""
    model = onnx.load(str(q))
    node = next(n for n in model.graph.node if n.name == dq)
    model.graph.output.extend([helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)])
    feeds = {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim],
                              helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
             for i in model.graph.input}
    return run_model(model, feeds, outputs=[node.output[0]])[node.output[0]]


@pytest.mark.parametrize("in_ch", [6, 4])
def test_per_channel_codes_transposed_before_their_dequantizelinear_keep_their_channels(tmp_path, in_ch):
    """int8 codes -> Transpose -> per-channel DequantizeLinear: the codes were dequantized
    before the Transpose along the DequantizeLinear's own axis, which the Transpose had moved.
    A square weight ran with every scale on the wrong axis (without a float model the quantized
    run was 45.9 off onnxruntime's on the file, outputs up to 47; with one, that float model was
    refused as not the one quantized, cosine 0.384), any other was refused, naming a node the
    file does not have; the axis is now followed back through the Transpose."""
    q, f, samples = _transposed_codes_net(tmp_path, 6, in_ch)
    engine = Engine(str(q), samples, float_model=str(f))
    assert [c.kind for c in engine.qmodel.calibration.values()] == ["weight"]
    _runs_are_the_file_and_the_float_model(engine, q, f, samples, atol=1e-4, apart=1e-2)


def _one_weight_ranked_as_the_file(q, f, samples, atol):
    """The engine on file ``q`` and float model ``f``, its one pair (a weight, its float weight
    found), and the weights' rankings, checked: the runs are the file's and the float model's,
    and that weight's ranking is the file's pooled cosine against the float model (its one pair
    quantized is the file itself)."""
    engine = Engine(str(q), samples, float_model=str(f))
    [c] = engine.qmodel.calibration.values()
    assert c.kind == "weight" and engine.qmodel.alignment.unmatched_weights == []
    refs, files = _runs_are_the_file_and_the_float_model(engine, q, f, samples, atol=atol, apart=1e-2)
    sens = get_sensitivity_of_nodes(engine, node_type="weight")
    assert sens[c.name]["cosine-similarity"] == pytest.approx(pooled_cosine(refs, files), abs=1e-7)
    return engine, c, sens


def _dequantized_then_transposed_net(tmp_path, per_channel, stored, float_scale=1.0, seed=0):
    """A Conv weight w [6, 4, 3, 3] held laid out [4, 6, 3, 3], dequantized, then a Transpose
    back to [6, 4, 3, 3] before the Conv; its float model's Conv reads w directly (times
    ``float_scale``: another model's weight). ``stored``: "codes" (int8 codes behind a lone
    DequantizeLinear) or "on grid" (their dequantized values behind QuantizeLinear and
    DequantizeLinear)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32)
    w[2] *= 8
    wt = w.transpose(1, 0, 2, 3)
    shape = [1, -1, 1, 1] if per_channel else []
    scales = (np.abs(w).max(axis=(1, 2, 3)) if per_channel else np.abs(w).max()) / np.float32(127)
    scales = np.asarray(scales, np.float32)
    codes = np.clip(np.round(wt / scales.reshape(shape)), -127, 127).astype(np.int8)
    axis = {"axis": 1} if per_channel else {}
    zero = np.zeros(scales.shape, np.int8)
    if stored == "codes":
        nodes, held = [], numpy_helper.from_array(codes, "codes")
    else:
        nodes = [helper.make_node("QuantizeLinear", ["wg", "s", "z"], ["codes"], name="w_Q", **axis)]
        held = numpy_helper.from_array((codes * scales.reshape(shape)).astype(np.float32), "wg")
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8])])
    qdq = helper.make_graph(
        [*nodes, helper.make_node("DequantizeLinear", ["codes", "s", "z"], ["wdq"], name="w_DQ", **axis),
         helper.make_node("Transpose", ["wdq"], ["wt"], name="w_T", perm=[1, 0, 2, 3]),
         helper.make_node("Conv", ["x", "wt"], ["y"], name="conv", pads=[1, 1, 1, 1])], "q", *io,
        [held, numpy_helper.from_array(scales, "s"), numpy_helper.from_array(zero, "z")])
    flt = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "f", *io,
                            [numpy_helper.from_array(w * np.float32(float_scale), "w")])
    samples = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(3)]}
    return (builders.save_model(qdq, tmp_path / "q.onnx", opset=13), builders.save_model(flt, tmp_path / "f.onnx", opset=13),
            samples)


@pytest.mark.parametrize("stored", ["codes", "on grid"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_a_weight_transposed_after_its_dequantizelinear_finds_its_float_weight(tmp_path, per_channel, stored):
    """codes -> DequantizeLinear -> Transpose -> Conv, the float Conv reading its weight
    directly: the search by value tried transposes of matrices only, so the float weight was
    not found and bypassing the weight kept it quantized (the bypassed model 0.21 off the float
    one per-tensor, 0.14 per-channel), and the pair on grid read as costing nothing (cosine
    1 - 6e-15 against 0.999949 and 0.999992). The Transpose's permutation is now tried on the float weights."""
    q, f, samples = _dequantized_then_transposed_net(tmp_path, per_channel, stored)
    _, c, sens = _one_weight_ranked_as_the_file(q, f, samples, atol=1e-4)
    assert sens[c.name]["cosine-similarity"] < 1 - 1e-6  # costs something: read as none, it was 1 - 6e-15


# how a 1x1 Conv weight [6, 4, 1, 1] is stored (from the [6, 4, 1, 1] array), the per-channel
# DequantizeLinear's axis there, and the shape-only nodes from its output "wdq" to the Conv's "wc"
# ({name: value} of their further inputs)
_LAID_OUT = {
    "Reshape": (lambda a: a.reshape(6, 4), 0, [helper.make_node("Reshape", ["wdq", "shp"], ["wc"], name="w_R")],
                {"shp": np.array([6, 4, 1, 1], np.int64)}),
    "Unsqueeze": (lambda a: a.reshape(6, 4), 0, [helper.make_node("Unsqueeze", ["wdq", "axes"], ["wc"], name="w_U")],
                  {"axes": np.array([2, 3], np.int64)}),
    "Squeeze": (lambda a: a.reshape(6, 4, 1, 1, 1), 0,
                [helper.make_node("Squeeze", ["wdq", "axes"], ["wc"], name="w_S")], {"axes": np.array([4], np.int64)}),
    "Flatten, Transpose, Reshape": (
        lambda a: a.reshape(6, 4).T.reshape(4, 6, 1), 1,
        [helper.make_node("Flatten", ["wdq"], ["wf"], name="w_F", axis=1),
         helper.make_node("Transpose", ["wf"], ["wt"], name="w_T", perm=[1, 0]),
         helper.make_node("Reshape", ["wt", "shp"], ["wc"], name="w_R")], {"shp": np.array([6, 4, 1, 1], np.int64)}),
}


@pytest.mark.parametrize("case", list(_LAID_OUT))
def test_a_weight_laid_out_by_shape_only_nodes_after_its_dequantizelinear_finds_its_float_weight(tmp_path, case):
    """codes -> per-channel DequantizeLinear -> Reshape / Squeeze / Unsqueeze / Flatten (and a
    Transpose) -> Conv, the float Conv reading its weight directly: the search by value
    followed Transposes only, so the float weight was not found and bypassing the weight kept
    it quantized (the bypassed model 0.038 off the float one). The nodes' layout is now
    undone on the float weights, whatever it does to the channel axis."""
    stored, axis, movers, extra = _LAID_OUT[case]
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 4, 1, 1)) * 0.3).astype(np.float32)
    w[2] *= 8
    held = stored(w)
    scales = (np.abs(np.moveaxis(held, axis, 0)).reshape(6, -1).max(1) / 127).astype(np.float32)
    bshape = [-1 if k == axis else 1 for k in range(held.ndim)]
    codes = np.clip(np.round(held / scales.reshape(bshape)), -127, 127).astype(np.int8)
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8])])
    qdq = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["codes", "s", "z"], ["wdq"], name="w_DQ", axis=axis), *movers,
         helper.make_node("Conv", ["x", "wc"], ["y"], name="conv")], "q", *io,
        [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scales, "s"),
         numpy_helper.from_array(np.zeros(6, np.int8), "z"), *(numpy_helper.from_array(v, k) for k, v in extra.items())])
    flt = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "f", *io,
                            [numpy_helper.from_array(w, "w")])
    q, f = builders.save_model(qdq, tmp_path / "q.onnx", opset=13), builders.save_model(flt, tmp_path / "f.onnx", opset=13)
    samples = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(3)]}
    engine, c, sens = _one_weight_ranked_as_the_file(q, f, samples, atol=1e-5)
    ours, numpys = _per_channel_max(engine, c.name, _decoded(q, "w_DQ"), axis, tmp_path)
    np.testing.assert_allclose(ours, numpys, rtol=1e-6)


def test_a_ranked_weight_without_its_float_weight_is_said_to_compare_against_its_dequantized_value(tmp_path):
    """A weight pair already on its grid whose float weight the float model given lacks: its
    bypass keeps its dequantized value, so its ranking reads as costing nothing; the note said
    that the rankings leave it out, which they did not."""
    q, f, samples = _dequantized_then_transposed_net(tmp_path, True, "on grid", float_scale=3.0)
    engine = Engine(str(q), samples, float_model=str(f))
    assert engine.qmodel.alignment.unmatched_weights == ["w_Q"]
    said = [w for w in engine.warnings if w.startswith("the float model holds no weight")]
    assert len(said) == 1 and "('w_Q')" in said[0]
    assert "compare each against its dequantized value" in said[0] and "leave them out" not in said[0]
    assert "w_Q" in get_sensitivity_of_nodes(engine, node_type="weight")


def _per_channel_max(engine, node, weight, axis, tmp_path):
    """The per-channel max |x| the box plots give for weight ``node``, and numpy's of
    ``weight`` along ``axis``."""
    from pytest_ptq.distribution import get_channelwise_data_distribution

    box = get_channelwise_data_distribution(tmp_path / "boxes", engine, nodes_list=[node])[node]
    assert box["axis"] == axis
    return box["max_abs"], np.abs(np.moveaxis(weight, axis, 0)).reshape(weight.shape[axis], -1).max(1)


@pytest.mark.parametrize("move", ["Transpose", "Reshape"])
def test_a_static_weight_whose_codes_are_laid_out_before_its_dequantizelinear_is_qdq(tmp_path, move):
    """int8 codes -> Transpose (or Reshape) -> per-channel DequantizeLinear -> Conv is a weight
    in QDQ form, the only quantization in the file: it read as quantize_dynamic's (format
    "dynamic", made by "onnxruntime quantize_dynamic"), its weight was named after the codes
    ('codes_DequantizeLinear', no node of the file), and through a Reshape it was refused."""
    mover, stored = {"Transpose": (("Transpose", {"perm": [1, 0, 2, 3]}, {}), lambda a: a.transpose(1, 0, 2, 3)),
                     "Reshape": (("Reshape", {}, {"shp": np.array([6, 4, 3, 3], np.int64)}),
                                 lambda a: a.reshape(6, -1))}[move]
    q, f, samples = _transposed_codes_net(tmp_path, 6, 4, mover=mover, stored=stored, producer="onnx.quantize")
    assert formats_of(onnx.load(str(q))) == ("QDQ",)
    engine = Engine(str(q), samples, float_model=str(f))
    qm = engine.qmodel
    assert (qm.format, qm.format_label, qm.made_by.name) == ("QDQ", "QDQ", "onnxruntime quantize_static")
    assert [c.name for c in qm.of_kind("weight")] == ["w_DQ"] and qm.alignment.unmatched_weights == []
    _runs_are_the_file_and_the_float_model(engine, q, f, samples, atol=1e-4, apart=1e-2)
    ours, numpys = _per_channel_max(engine, "w_DQ", _decoded(q, "w_DQ"), 0, tmp_path)
    np.testing.assert_allclose(ours, numpys, rtol=1e-6)


def test_per_channel_codes_a_gather_moves_along_another_axis_keep_their_channels(tmp_path):
    """codes -> Gather along axis 1 -> per-channel DequantizeLinear along axis 0: the Gather
    keeps the channels on axis 0, where the rewrite now dequantizes the codes; it was refused
    ("does not follow back onto the constant")."""
    q, f, samples = _transposed_codes_net(tmp_path, 6, 4, mover=("Gather", {"axis": 1}, {"idx": np.array([1, 0, 3, 2])}),
                                          stored=lambda a: a)
    engine = Engine(str(q), samples, float_model=str(f))
    [c] = engine.qmodel.of_kind("weight")
    assert c.axis == 0 and engine.qmodel.alignment.unmatched_weights == []
    _runs_are_the_file_and_the_float_model(engine, q, f, samples, atol=1e-4, apart=1e-2)
    # the codes dequantized before the Gather: its input, which the file's DequantizeLinear reads gathered
    decoded = _decoded(q, "w_DQ")[:, np.argsort([1, 0, 3, 2])]
    ours, numpys = _per_channel_max(engine, c.name, decoded, 0, tmp_path)
    np.testing.assert_allclose(ours, numpys, rtol=1e-6)


def _table_net(tmp_path, shape, axis, seed=0, reversed_=False):
    """An embedding table [20, 8] stored as int8 codes (per column), read by Gather(ids
    [1, 5]), a Reshape of the rows to ``shape`` (``reversed_``: a Transpose without perm,
    which reverses the dims to ``shape`` [8, 5, 1]) and a per-channel DequantizeLinear along
    ``axis`` (the columns' scales, as many as that axis holds), then Tanh; its float model:
    the float table through the same Gather and Reshape. Returns the two files and samples."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((20, 8)).astype(np.float32)
    table[:, 3] *= 20  # one column far from the others: scales on the wrong channels show
    columns = (np.abs(table).max(0) / 127).astype(np.float32)
    codes = np.clip(np.round(table / columns), -127, 127).astype(np.int8)
    scales = columns[:shape[axis]]
    io = ([helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    shp = numpy_helper.from_array(np.array(shape, np.int64), "shp")
    move = (lambda i, o: helper.make_node("Transpose", [i], [o], name="rows")) if reversed_ else (
        lambda i, o: helper.make_node("Reshape", [i, "shp"], [o], name="rows"))
    q = helper.make_graph(
        [helper.make_node("Gather", ["codes", "ids"], ["g"], name="gather"), move("g", "r"),
         helper.make_node("DequantizeLinear", ["r", "s", "z"], ["e"], name="table_DQ", axis=axis),
         helper.make_node("Tanh", ["e"], ["y"], name="act")], "q", *io,
        [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scales, "s"),
         numpy_helper.from_array(np.zeros(scales.shape, np.int8), "z"), shp])
    f = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["g"], name="gather"), move("g", "e"),
         helper.make_node("Tanh", ["e"], ["y"], name="act")], "f", *io, [numpy_helper.from_array(table, "table"), shp])
    samples = {"ids": [rng.integers(0, 20, (1, 5)).astype(np.int64) for _ in range(3)]}
    return (builders.save_model(q, tmp_path / "q.onnx", opset=13), builders.save_model(f, tmp_path / "f.onnx", opset=13),
            samples)


@pytest.mark.parametrize("move", ["Reshape", "Transpose without perm"])
def test_a_per_channel_table_gathered_and_reshaped_before_its_dequantizelinear_keeps_its_columns(tmp_path, move):
    """An embedding table's codes -> Gather -> Reshape [1, 5, 8] to [5, 8] (or a Transpose
    without perm: reversed, [8, 5, 1]) -> per-channel DequantizeLinear along the columns: the
    columns stay an axis of their own through both, so the rewrite dequantizes the table along
    its axis 1; it was refused (the Transpose: "whose reversed dims the tool does not follow")."""
    q, f, samples = _table_net(tmp_path, [5, 8], 1) if move == "Reshape" else _table_net(tmp_path, [8, 5, 1], 0,
                                                                                          reversed_=True)
    engine = Engine(str(q), samples, float_model=str(f))
    [c] = engine.qmodel.of_kind("weight")
    assert c.axis == 1 and engine.qmodel.alignment.unmatched_weights == []
    _runs_are_the_file_and_the_float_model(engine, q, f, samples, atol=1e-6, apart=1e-3)
    model = onnx.load(str(q))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    decoded = inits["codes"].astype(np.float64) * inits["s"]  # the whole table, each column by its scale
    ours, numpys = _per_channel_max(engine, c.name, decoded, 1, tmp_path)
    np.testing.assert_allclose(ours, numpys, rtol=1e-6)


@pytest.mark.parametrize("case", ["gather along the channels", "reshape splitting them"])
def test_per_channel_codes_moved_where_their_channels_cannot_be_followed_are_refused_in_a_sentence(tmp_path, case):
    """A per-channel DequantizeLinear after an op whose channels cannot be followed back onto
    the codes (a Gather picking along the channel axis, a Reshape splitting it): one sentence
    naming that op, the constant and why, not a run on misplaced scales; in the terms of the
    file's format: codes a Gather of fixed indices moves are a static weight, whose file read as
    dynamic and was told to be quantized again in QDQ format."""
    if case.startswith("gather"):
        q, _, _ = _transposed_codes_net(tmp_path, 4, 4, mover=("Gather", {"axis": 0}, {"idx": np.array([1, 0, 2, 3])}))
        run_model(q, {"x": np.ones((1, 4, 8, 8), np.float32)})  # onnxruntime runs it
        why = r"is in QDQ format and its Gather node 'w_move' moves integer constant 'codes', and a per-channel " \
              r"DequantizeLinear reads it after a Gather 'w_move' along its channel axis: each of its output channels " \
              r"is whichever stored channel the indices pick"
    else:
        q, _, _ = _table_net(tmp_path, [5, 2, 4], 2)
        run_model(q, {"ids": np.zeros((1, 5), np.int64)})
        why = r"is in dynamic format and its Gather node 'gather' moves integer constant 'codes', and a per-channel " \
              r"DequantizeLinear reads it after a Reshape 'rows' that merges or splits its channel axis \(axis 2 of " \
              r"\[5, 2, 4\], from \[1, 5, 8\]\)"
    with pytest.raises(PTQError, match=why + r".*to analyse it, dequantize the stored codes along their own channel axis"
                       ) as info:
        QuantModel(str(q))
    # a static weight's codes moved by fixed indices: nothing in the file to quantize again
    assert ("quantize the float model" in str(info.value)) == case.startswith("reshape")


def _qdq_table_net(tmp_path, per_channel, weight_laid_out=False, seed=0):
    """A QDQ file: an embedding table [20, 8] stored as int8 codes, Gather(ids [1, 5]), a
    DequantizeLinear (per tensor, or per column along axis 2 of the gathered [1, 5, 8]), an
    activation pair on the embeddings, then MatMul with a weight [8, 4]: a lone DQ of its int8
    codes, or (``weight_laid_out``) its float values stored [4, 8] through QuantizeLinear
    (per row), a Transpose and a DequantizeLinear (per column), as exporters that lay codes out
    between Q and DQ write. Its float model: the float table through the same Gather, MatMul.
    Returns the two files, the samples and the table's codes and scales."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((20, 8)).astype(np.float32)
    table[:, 3] *= 20  # one column far from the others: scales on the wrong channels show
    w = (rng.standard_normal((8, 4)) * 0.5).astype(np.float32)
    s = (np.abs(table).max(0) if per_channel else np.abs(table).max()) / np.float32(127)
    s = np.asarray(s, np.float32)
    codes = np.clip(np.round(table / s), -127, 127).astype(np.int8)
    inits = [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(s, "s"),
             numpy_helper.from_array(np.zeros(s.shape, np.int8), "z")]
    nodes = [helper.make_node("Gather", ["codes", "ids"], ["g"], name="gather"),
             helper.make_node("DequantizeLinear", ["g", "s", "z"], ["e"], name="table_DQ",
                              **({"axis": 2} if per_channel else {}))]
    e = builders.add_pair(inits, nodes, "e", np.abs(table).max() / 127, np.int8(0))
    if weight_laid_out:
        ws = (np.abs(w).max(0) / 127).astype(np.float32)
        inits += [numpy_helper.from_array(np.ascontiguousarray(w.T), "wt"), numpy_helper.from_array(ws, "ws"),
                  numpy_helper.from_array(np.zeros(4, np.int8), "wz")]
        nodes += [helper.make_node("QuantizeLinear", ["wt", "ws", "wz"], ["wtq"], name="w_Q", axis=0),
                  helper.make_node("Transpose", ["wtq"], ["wq"], name="w_T", perm=[1, 0]),
                  helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wdq"], name="w_DQ", axis=1)]
    else:
        ws = np.float32(np.abs(w).max() / 127)
        inits += [numpy_helper.from_array(np.clip(np.round(w / ws), -127, 127).astype(np.int8), "wq"),
                  numpy_helper.from_array(np.asarray(ws), "ws"), numpy_helper.from_array(np.int8(0), "wz")]
        nodes.append(helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wdq"], name="w_DQ"))
    nodes.append(helper.make_node("MatMul", [e, "wdq"], ["y"], name="mm"))
    io = ([helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 4])])
    q = builders.save_model(helper.make_graph(nodes, "q", *io, inits), tmp_path / "q.onnx", opset=13)
    f = builders.save_model(helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="gather"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="mm")], "f", *io,
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")]), tmp_path / "f.onnx", opset=13)
    samples = {"ids": [rng.integers(0, 20, (1, 5)).astype(np.int64) for _ in range(3)]}
    return q, f, samples, codes, s


@pytest.mark.parametrize("weight_laid_out", [False, True], ids=["lone DQ weight", "Q-Transpose-DQ weight"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_an_embedding_table_gathered_before_its_dequantizelinear_in_a_qdq_file_is_a_weight(tmp_path, per_channel,
                                                                                         weight_laid_out):
    """int8 table -> Gather(ids) -> DequantizeLinear in a file that also holds Q/DQ pairs: the
    file read as QDQ and was left as it is, so the table's DequantizeLinear was no weight node
    and stayed quantized in the float reference (the bypassed model 0.21 off the float one per
    tensor, 0.06 per column), silently. The table is now dequantized before its Gather (along
    its columns where the DequantizeLinear reads them) and is a weight of its own; a pair that
    lays its codes out between Q and DQ stays the parser's (one pair, moved)."""
    q, f, samples, codes, s = _qdq_table_net(tmp_path, per_channel, weight_laid_out)
    assert formats_of(onnx.load(str(q))) == ("QDQ",)
    engine = Engine(str(q), samples, float_model=str(f))
    qm = engine.qmodel
    assert qm.format == "QDQ"
    assert sorted(c.name for c in qm.of_kind("weight")) == ["table_DQ", "w_Q" if weight_laid_out else "w_DQ"]
    assert qm.alignment.unmatched_weights == []
    assert any("Gather 'gather' -> DequantizeLinear 'table_DQ'" in n for n in qm.notes)
    if weight_laid_out:
        assert any("lay their codes out between QuantizeLinear and DequantizeLinear" in n for n in qm.notes)
    # the table alone quantized, independently: the float model with its table decoded by numpy
    decoded = (codes.astype(np.float32) * s).astype(np.float32)
    alone = onnx.load(str(f))
    alone.graph.initializer[0].CopyFrom(numpy_helper.from_array(decoded, "table"))
    refs, _ = _runs_are_the_file_and_the_float_model(engine, q, f, samples, atol=1e-6, apart=1e-3)
    tables = [run_model(alone, {"ids": ids})["y"] for ids in samples["ids"]]
    sens = get_sensitivity_of_nodes(engine, node_type="weight")
    assert sens["table_DQ"]["cosine-similarity"] == pytest.approx(pooled_cosine(refs, tables), abs=1e-7)
    assert sens["table_DQ"]["cosine-similarity"] < 1 - 1e-7  # costs something
    if per_channel:
        ours, numpys = _per_channel_max(engine, "table_DQ", decoded, 1, tmp_path)
        np.testing.assert_allclose(ours, numpys, rtol=1e-6)


def test_a_qdq_files_table_whose_channels_cannot_be_followed_is_refused_in_its_formats_terms(tmp_path):
    """The QDQ file above with its table's DequantizeLinear per channel along the axis its
    Gather picks (one scale per id position): refused in one sentence that says the file is QDQ
    and what its export should store, not that it is in dynamic format and should be quantized
    in QDQ format (it was not refused at all: the table stayed quantized in the float reference)."""
    q, _, _, _, _ = _qdq_table_net(tmp_path, True)
    model = onnx.load(str(q))
    dq = next(n for n in model.graph.node if n.name == "table_DQ")
    dq.attribute[0].i = 1
    for init in model.graph.initializer:
        if init.name in ("s", "z"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init)[:5], init.name))
    onnx.save(model, str(q))
    run_model(q, {"ids": np.zeros((1, 5), np.int64)})  # onnxruntime runs it
    with pytest.raises(PTQError) as info:
        QuantModel(str(q))
    said = str(info.value)
    assert "is in QDQ format and its Gather node 'gather' moves integer constant 'codes'" in said
    assert "after a Gather 'gather' along its channel axis" in said
    assert "to analyse it, dequantize the stored codes along their own channel axis" in said
    assert "dynamic" not in said and "quantize the float model" not in said


def _laid_out_weight_branch(model, fused):
    """Add to ``model`` a branch ``y2 = x_dq @ W.T`` (x [1, 3, 8, 8]) whose weight W [8, 8] is
    quantized per row (QuantizeLinear axis 0), transposed, and dequantized per column (axis 1),
    as exporters lay codes out between Q and DQ; ``fused``: a com.microsoft FusedMatMul with
    alpha 0.5 instead of the MatMul (as onnxruntime saves a MatMul and a Mul optimised).
    Returns W, its scales and the branch's float factor."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((8, 8)) * 0.5).astype(np.float32)
    # rows far apart in size: a scale read along the wrong axis shows
    w *= np.linspace(0.2, 3, 8, dtype=np.float32)[:, None]
    s = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    g = model.graph
    g.initializer.extend([numpy_helper.from_array(w, "W"), numpy_helper.from_array(s, "ws"),
                          numpy_helper.from_array(np.zeros(8, np.int8), "wz")])
    g.node.extend([helper.make_node("QuantizeLinear", ["W", "ws", "wz"], ["Wq"], name="W_Q", axis=0),
                   helper.make_node("Transpose", ["Wq"], ["Wt"], name="W_T", perm=[1, 0]),
                   helper.make_node("DequantizeLinear", ["Wt", "ws", "wz"], ["Wd"], name="W_DQ", axis=1)])
    if fused:
        g.node.append(helper.make_node("FusedMatMul", ["xd", "Wd"], ["y2"], name="mm2", domain="com.microsoft",
                                       alpha=0.5))
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    else:
        g.node.append(helper.make_node("MatMul", ["xd", "Wd"], ["y2"], name="mm2"))
    g.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 3, 8, 8]))
    return w, s, 0.5 if fused else 1.0


@pytest.mark.parametrize("fused", [False, True], ids=["QOperator beside it", "FusedMatMul in a QDQ file"])
def test_per_channel_codes_transposed_between_q_and_dq_in_a_rewritten_file_keep_their_axis(fused):
    """A per-channel Q -> Transpose -> DQ in a file the rewrite walks whole (QOperator ops beside
    it, or a QDQ file with onnxruntime's fused ops): the Q's output was taken for a quantized
    tensor and dequantized before the Transpose without its axis, so the quantized run read
    each row with another row's scale (0.4 off the file, silently)."""
    model = _mixed_model()
    if fused:  # the QDQ Conv alone, its output quantized for nothing else
        keep = [n for n in model.graph.node if n.op_type != "QLinearConv" and n.name not in (
            "y_QuantizeLinear", "z_DequantizeLinear")]
        del model.graph.node[:]
        model.graph.node.extend(keep)
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6]))
    w, s, alpha = _laid_out_weight_branch(model, fused)
    onnx.checker.check_model(model)
    assert formats_of(model) == (("QDQ",) if fused else ("QDQ", "QOperator"))
    data = fm.samples_of((1, 3, 8, 8), n=3)
    engine = Engine(model, data)
    assert engine.qmodel.calibration["W_Q"].per_channel
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    xs, xz = float(inits["xs"]), int(inits["xz"])
    for i, x in enumerate(data["x"]):
        given = run_model(model, {"x": x})["y2"]
        np.testing.assert_allclose(engine.run(i, "all")["y2"], given, rtol=0, atol=1e-5)  # quantized: the file
        # bypassed: the float computation, by numpy
        ref = alpha * np.matmul(x.astype(np.float64), w.T.astype(np.float64))
        np.testing.assert_allclose(engine.run(i, ())["y2"], ref, rtol=0, atol=1e-5)
        # and the file, by numpy: each row of W on its own scale
        codes = np.clip(np.round(w / s[:, None]), -128, 127)
        xq = (np.clip(np.round(x / xs) + xz, 0, 255) - xz) * xs
        np.testing.assert_allclose(given, alpha * np.matmul(xq, (codes * s[:, None]).T), rtol=0, atol=1e-5)


def _fused_qdq_net(tmp_path):
    """A float net (Conv, Conv-Relu-Conv, pooling, Gemm-Relu, MatMul-Mul(0.5), Gemm), quantized
    by quantize_static in QDQ format with the middle nodes left float, then saved by an
    onnxruntime session at ORT_ENABLE_EXTENDED keeping its Q/DQ (session.disable_quant_qdq,
    constant folding off so that the weights keep their DequantizeLinear): the float nodes
    become com.microsoft FusedConv, FusedGemm and FusedMatMul beside the Q/DQ pairs."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    c = lambda v, n: numpy_helper.from_array(np.asarray(v, np.float32), n)  # noqa: E731
    inits = [c(rng.standard_normal((8, 3, 3, 3)) * 0.3, "w1"), c(rng.standard_normal(8) * 0.1, "b1"),
             c(rng.standard_normal((8, 8, 3, 3)) * 0.2, "w2"), c(rng.standard_normal(8) * 0.1, "b2"),
             c(rng.standard_normal((8, 8, 1, 1)) * 0.3, "w3"), c(rng.standard_normal((16, 8)) * 0.3, "wg"),
             c(rng.standard_normal(16) * 0.1, "bg"), c(rng.standard_normal((16, 16)) * 0.3, "wm"), c(0.5, "half"),
             c(rng.standard_normal((10, 16)) * 0.3, "wf")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3"),
             helper.make_node("GlobalAveragePool", ["c3"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["hr"], name="relu3"),
             helper.make_node("MatMul", ["hr", "wm"], ["m0"], name="matmul"),
             helper.make_node("Mul", ["m0", "half"], ["m"], name="scale"),
             helper.make_node("Gemm", ["m", "wf"], ["y"], transB=1, name="fc2")]
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    f = builders.save_model(graph, tmp_path / "f.onnx")
    data = fm.samples_of((1, 3, 8, 8))
    builders.quantize(f, tmp_path / "qdq.onnx", data, keep_float=False, reduce_range=True,
                      nodes_to_exclude=["conv2", "relu2", "conv3", "fc1", "relu3", "matmul", "scale"])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "q.onnx")
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    so.log_severity_level = 3
    ort.InferenceSession(str(tmp_path / "qdq.onnx"), so, providers=["CPUExecutionProvider"],
                         disabled_optimizers=["ConstantFolding"])
    return f, tmp_path / "q.onnx", data


def test_a_qdq_file_saved_with_onnxruntimes_fused_ops_runs_as_the_file_and_bypasses_to_the_float_model(tmp_path):
    """The rewrite that splits FusedConv / FusedGemm / FusedMatMul in a QDQ file: its quantized
    run is the file's, its bypassed run the float model's, both by plain sessions."""
    f, q, data = _fused_qdq_net(tmp_path)
    ops = {(n.domain, n.op_type) for n in onnx.load(str(q)).graph.node}
    assert {("com.microsoft", op) for op in ("FusedConv", "FusedGemm", "FusedMatMul")} <= ops
    assert ("", "QuantizeLinear") in ops and not any(op.startswith("QLinear") for _, op in ops)
    assert formats_of(onnx.load(str(q))) == ("QDQ",)
    engine = Engine(str(q), data, float_model=str(f))
    qm = engine.qmodel
    assert qm.format == "QDQ" and not qm.alignment.unmatched_weights
    assert not {n.op_type for n in qm.model.graph.node} & {"FusedConv", "FusedGemm", "FusedMatMul"}
    assert {c.kind for c in qm.calibration.values()} == {"weight", "activation"}
    _runs_are_the_file_and_the_float_model(engine, q, f, data, atol=1e-5, apart=1e-3)


def _malformed(q, node, **attrs):
    """File ``q`` with ``attrs`` of its node ``node`` set anew (an edit onnxruntime refuses)."""
    model = onnx.load(str(q))
    n = next(n for n in model.graph.node if n.name == node)
    for name, value in attrs.items():
        kept = [a for a in n.attribute if a.name != name]
        del n.attribute[:]
        n.attribute.extend([*kept, helper.make_attribute(name, value)])
    onnx.save(model, str(q))
    return q


def _refused_by_onnxruntime(q, feeds):
    """Whether a plain onnxruntime session refuses file ``q`` (to load it, or to run it on ``feeds``)."""
    try:
        run_model(q, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime's own error types differ between load and run
        return True
    return False


_MALFORMED = {
    # codes -> Transpose / Reshape -> DequantizeLinear, the layout node unable to apply to the codes
    "perm repeats an axis": (lambda d: _malformed(_transposed_codes_net(d, 6, 6, stored=lambda a: a)[0], "w_move",
                                                  perm=[0, 0, 2, 3]), "x",
                             r"Transpose 'w_move' of '.*q\.onnx' cannot lay out constant 'codes' of shape \[6, 6, 3, 3\] "
                             r"\(repeated axis in transpose\): the file is malformed"),
    "perm names an axis past the rank": (
        lambda d: _malformed(_transposed_codes_net(d, 6, 6)[0], "w_move", perm=[5, 0, 2, 3]), "x",
        r"Transpose 'w_move' of .* cannot lay out constant 'codes' of shape \[6, 6, 3, 3\] \(axis 5 is out of bounds"),
    "reshape to another size": (
        lambda d: _transposed_codes_net(d, 6, 4, mover=("Reshape", {}, {"shp": np.array([6, 4, 3, 4], np.int64)}),
                                        stored=lambda a: a.reshape(6, -1))[0], "x4",
        r"Reshape 'w_move' of .* cannot lay out constant 'codes' of shape \[6, 36\] \(cannot reshape array of size 216"),
    # a table gathered by ids, then a DequantizeLinear whose axis its input does not have: it was
    # followed back wrapped onto the table's columns and analysed (reversed dims), or refused as
    # a Gather along the channels (after a Reshape)
    "table's DequantizeLinear axis past a Transpose without perm": (
        lambda d: _malformed(_table_net(d, [8, 5, 1], 0, reversed_=True)[0], "table_DQ", axis=3), "ids",
        r"DequantizeLinear 'table_DQ' of .* has axis 3 on its 3-D input 'r': out of range for that input"),
    "table's DequantizeLinear axis past a Reshape": (
        lambda d: _malformed(_table_net(d, [5, 8], 1)[0], "table_DQ", axis=2), "ids",
        r"DequantizeLinear 'table_DQ' of .* has axis 2 on its 2-D input 'r': out of range for that input"),
    # Q -> Transpose -> DQ of a weight: its Q's axis wrapped onto another one, analysed; a perm
    # that is no permutation
    "laid-out pair's Q axis past its input": (
        lambda d: _malformed(_qdq_table_net(d, True, weight_laid_out=True)[0], "w_Q", axis=2), "ids",
        r"QuantizeLinear 'w_Q' of .* has axis 2 on its 2-D input 'wt': out of range for that input"),
    "laid-out pair's perm repeats an axis": (
        lambda d: _malformed(_qdq_table_net(d, True, weight_laid_out=True)[0], "w_T", perm=[0, 0]), "ids",
        r"Transpose 'w_T' of .* has perm \[0, 0\], not a permutation of the 2 axes of 'wtq': the file is malformed"),
}


@pytest.mark.parametrize("case", list(_MALFORMED))
def test_a_file_whose_moved_codes_onnxruntime_refuses_is_refused_in_a_sentence_naming_the_node(tmp_path, case):
    """Codes laid out or gathered before their DequantizeLinear by a node whose attributes do
    not fit them (a perm that is no permutation, a Reshape to another size, an axis the tensor
    does not have): onnxruntime refuses each file; the tool ended in numpy's traceback
    ('repeated axis in transpose', 'cannot reshape array'), or wrapped the axis onto another one
    and analysed the file on scales it does not use. One sentence now names the node and its
    file, and nothing is computed."""
    make, feed, why = _MALFORMED[case]
    q = make(tmp_path)
    feeds = {"x": {"x": np.ones((1, 6, 8, 8), np.float32)}, "x4": {"x": np.ones((1, 4, 8, 8), np.float32)},
             "ids": {"ids": np.zeros((1, 5), np.int64)}}[feed]  # the inputs the file declares
    assert _refused_by_onnxruntime(q, feeds)  # the case this test is about
    with pytest.raises(PTQError, match=why) as info:
        QuantModel(str(q))
    assert "\n" not in str(info.value)

"""Stage localisation against plain onnxruntime sessions, and its verdicts."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import builders
from pytest_ptq.cli import main
from pytest_ptq.errors import PTQError
from pytest_ptq.engine.runtime import integer_kernels_saturate
from pytest_ptq.engine import Engine
from pytest_ptq.metrics import compare
from pytest_ptq.model import QuantModel
from pytest_ptq.outputs import parse_outputs
from pytest_ptq import kernels
from pytest_ptq.kernels import saturating_nodes, saturation_cause
from pytest_ptq.stages import STAGES, localize_stages, simulation_gap, verdict

N = 6


def _session(path, level, fake_quant):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    if fake_quant:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    # the simulation in the plain layout, as the engine's fully quantized figure is computed
    disabled = ["NchwcTransformer"] if fake_quant else []
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)


def _pooled_cosine(ref, got):
    r = np.concatenate([a.ravel() for a in ref]).astype(np.float64)
    t = np.concatenate([a.ravel() for a in got]).astype(np.float64)
    return float(r @ t / np.sqrt((r @ r) * (t @ t)))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    data = builders.samples(N, seed=3)
    fpath = builders.conv_net(root / "float.onnx")
    qpath = builders.quantize(fpath, root / "qdq.onnx", data, keep_float=False)
    # the same model with r1's activation scale 64x too coarse: a calibration fault
    model = onnx.load(str(qpath))
    for init in model.graph.initializer:
        if init.name == "r1_scale":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 64, init.name))
    onnx.save(model, str(root / "planted.onnx"))
    return {"float": fpath, "qdq": qpath, "planted": root / "planted.onnx", "data": data, "root": root}


def test_each_stage_matches_a_plain_session(models, tmp_path):
    report = localize_stages(str(models["float"]), str(models["qdq"]), models["data"], save_dir=tmp_path)
    L = ort.GraphOptimizationLevel
    ref_sess = _session(models["float"], L.ORT_DISABLE_ALL, False)
    sessions = {"optimized-float": _session(models["float"], L.ORT_ENABLE_ALL, False),
                "fake-quant": _session(models["qdq"], L.ORT_ENABLE_ALL, True),
                "integer": _session(models["qdq"], L.ORT_ENABLE_ALL, False)}
    feeds = [{"x": a} for a in models["data"]["x"]]
    ref = [ref_sess.run(["prob"], f)[0] for f in feeds]
    outs = {k: [s.run(["prob"], f)[0] for f in feeds] for k, s in sessions.items()}
    assert [s["stage"] for s in report.stages] == list(STAGES)
    for stage, got in outs.items():
        assert report.value(stage) == pytest.approx(_pooled_cosine(ref, got), abs=1e-9)
    assert report.kernel_gap["values"]["cosine-similarity"] == pytest.approx(
        _pooled_cosine(outs["fake-quant"], outs["integer"]), abs=1e-9)
    # the fused model really runs integer kernels: it is not the fake-quant model
    assert not all(np.array_equal(a, b) for a, b in zip(outs["fake-quant"], outs["integer"]))
    assert report and report.first_drop is None
    assert (tmp_path / "optimized_float_model.onnx").is_file()
    assert report.samples == N and len(report.stages[0]["per_sample"]["cosine-similarity"]) == N


def test_the_fake_quant_stage_is_computed_in_the_layout_of_the_fully_quantized_figure(models, monkeypatch):
    """The stage ran in onnxruntime's NCHWc layout: on PP-OCR's classifier it read 0.991186
    where the verdict's fully quantized figure (and a plain session) reads 0.991432."""
    from pytest_ptq import stages

    made, real = {}, stages.make_session

    def recording(model, optimization, providers, fake_quant=True, **kwargs):
        made[fake_quant] = kwargs.get("disabled_optimizers", ())
        return real(model, optimization, providers, fake_quant=fake_quant, **kwargs)

    monkeypatch.setattr(stages, "make_session", recording)
    localize_stages(str(models["float"]), str(models["qdq"]), models["data"])
    assert "NchwcTransformer" in made[True]


def test_a_calibration_fault_is_placed_at_the_fake_quant_stage(models):
    report = localize_stages(str(models["float"]), str(models["planted"]), models["data"], threshold=0.999)
    assert report.value("optimized-float") > 0.9999
    assert report.value("fake-quant") < 0.999
    assert report.first_drop == "fake-quant" and not report
    assert "calibration" in report.message


@pytest.mark.parametrize("values, gap, first, words", [
    ({"optimized-float": 0.95, "fake-quant": 0.94, "integer": 0.94}, 1.0, "optimized-float", "export"),
    ({"optimized-float": 1.0, "fake-quant": 0.999, "integer": 0.90}, 0.90, "integer", "kernel"),
    ({"optimized-float": 1.0, "fake-quant": 0.999, "integer": 0.995}, 0.98, None, "differ from the simulation"),
    ({"optimized-float": 1.0, "fake-quant": 0.999, "integer": 0.999}, 1.0, None, "every stage"),
    # a calibration loss, and the kernels' own on top (a BERT's QDQ file: 0.8955 simulated, 0.8803 as run)
    ({"optimized-float": 1.0, "fake-quant": 0.8955, "integer": 0.8803}, 0.9979, "fake-quant",
     "the integer kernels lose more on top of it (cosine-similarity 0.9979 against the simulation)"),
    # kernels that differ from the simulation but read closer to float lose nothing more
    ({"optimized-float": 1.0, "fake-quant": 0.983487, "integer": 0.983761}, 0.9940, "fake-quant",
     "the integer kernels differ from it (cosine-similarity 0.994 against the simulation; the file as run reads "
     "0.983761 against float, no worse)"),
])
def test_verdicts(values, gap, first, words):
    stage, message = verdict(values, gap, "cosine-similarity", 0.99)
    assert stage == first
    assert words in message
    assert ("lose more on top of it" in message) == (first == "fake-quant" and gap < 0.999
                                                     and values["integer"] < values["fake-quant"])


def test_an_error_metric_is_said_to_rise_above_its_threshold():
    # mse grows as a stage loses accuracy: its crossing is upwards, its hold a ceiling
    stage, message = verdict({"optimized-float": 0.0, "fake-quant": 2e-6, "integer": 3e-6}, 1e-6, "mse", 1e-6)
    assert stage == "fake-quant" and message.startswith("mse first rises above 1e-06 at stage 'fake-quant'")
    stage, message = verdict({"optimized-float": 0.0, "fake-quant": 2e-6, "integer": 3e-6}, 1e-6, "mse", 5)
    assert stage is None and message.startswith("every stage keeps mse at or below 5")


def test_what_the_quantizer_changed_replaces_the_rewritten_stages_generic_advice():
    values = {"optimized-float": 1.0, "rewritten": 0.05, "fake-quant": 0.04, "integer": 0.04}
    said = "the Relu folded into 'r_QuantizeLinear' fed the subgraphs of 'If_0'"
    stage, message = verdict(values, 1.0, "cosine-similarity", 0.99, rewrite=said)
    assert stage == "rewritten" and message.endswith(said) and "e.g. Sigmoid" not in message
    assert "e.g. Sigmoid -> HardSigmoid" in verdict(values, 1.0, "cosine-similarity", 0.99)[1]


def test_a_known_kernel_cause_replaces_the_generic_advice():
    cause = "on this CPU the kernels saturate"
    stage, message = verdict({"optimized-float": 1.0, "fake-quant": 0.999, "integer": 0.90}, 0.90,
                             "cosine-similarity", 0.99, cause=cause)
    assert stage == "integer" and message.endswith(f"integer kernels do not: {cause}")
    stage, message = verdict({"optimized-float": 1.0, "fake-quant": 0.999, "integer": 0.995}, 0.98,
                             "cosine-similarity", 0.99, cause=cause)
    assert stage is None and message.endswith(f"(cosine-similarity 0.98 between them): {cause}")


# -- int16 saturation of onnxruntime's uint8 x int8 kernels ------------------------------------
def _largest_codes_sum(node, x_shape, inits, y_type):
    """onnxruntime's sum of 255 x 127 products through one integer ``node`` (input "x")."""
    helper = onnx.helper
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, x_shape)],
                              [helper.make_tensor_value_info("y", y_type, None)], inits)
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13),
                                                                  helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return float(sess.run(None, {"x": np.full(x_shape, 255, np.uint8)})[0].ravel()[0])


def test_the_saturation_probe_predicts_another_kernel_and_convinteger_sums_exactly():
    """The probe runs MatMulInteger; QGemm's kernel, fed the same largest codes, saturates on
    the same CPUs, and ConvInteger's on none (so its nodes are not named); exact sums computed
    here."""
    k, helper = 64, onnx.helper
    c = lambda v, n, t: numpy_helper.from_array(np.asarray(v, t), n)  # noqa: E731
    inits = [c(1.0, "xs", np.float32), c(0, "xz", np.uint8), c(np.full((k, 1), 127), "w", np.int8),
             c(1.0, "ws", np.float32), c(0, "wz", np.int8)]
    qgemm = helper.make_node("QGemm", ["x", "xs", "xz", "w", "ws", "wz"], ["y"], domain="com.microsoft")
    assert integer_kernels_saturate() == (_largest_codes_sum(qgemm, [1, k], inits, onnx.TensorProto.FLOAT)
                                          != 255 * 127 * k)
    conv = helper.make_node("ConvInteger", ["x", "w"], ["y"])
    weight = [c(np.full((4, k, 3, 3), 127), "w", np.int8)]
    assert _largest_codes_sum(conv, [1, k, 5, 5], weight, onnx.TensorProto.INT32) == 255 * 127 * k * 9


def test_saturating_products_are_found_and_named(models, tmp_path, monkeypatch):
    qm = QuantModel(str(models["qdq"]))
    convs = [n.name for n in onnx.load(str(models["float"])).graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    assert len(convs) >= 3 and saturating_nodes(qm) == convs  # uint8 activations, int8 weights: all of them
    # onnxruntime shifts int8 activations to uint8 on x86 before fusing: the same kernels
    int8 = builders.quantize(models["float"], tmp_path / "s8.onnx", models["data"], activation_type="QInt8")
    assert saturating_nodes(QuantModel(str(int8))) == convs
    wide = builders.quantize(models["float"], tmp_path / "a16.onnx", models["data"], activation_type="QUInt16")
    assert saturating_nodes(QuantModel(str(wide))) == []
    for keep_float in (True, False):  # 7-bit weights behind pairs or lone DQs: no pair sum reaches int16's limit
        narrow = builders.quantize(models["float"], tmp_path / f"rr{keep_float}.onnx", models["data"],
                                   keep_float=keep_float, reduce_range=True)
        assert saturating_nodes(QuantModel(str(narrow))) == []
    monkeypatch.setattr(kernels, "integer_kernels_saturate", lambda: True)
    cause = saturation_cause(qm, None)
    assert f"{len(convs)} node(s) here run such products ('{convs[0]}'" in cause
    assert "reduce_range=True" in cause
    assert saturation_cause(qm, ["CUDAExecutionProvider", "CPUExecutionProvider"]) == ""
    assert saturation_cause(QuantModel(str(wide)), None) == ""
    monkeypatch.setattr(kernels, "integer_kernels_saturate", lambda: False)
    assert saturation_cause(qm, None) == ""


def test_the_report_and_the_contract_carry_the_cause(models, monkeypatch):
    import dataclasses
    from types import SimpleNamespace

    from pytest_ptq.checks import check_stages

    monkeypatch.setattr(kernels, "integer_kernels_saturate", lambda: True)
    report = localize_stages(str(models["float"]), str(models["qdq"]), models["data"])
    cause = saturation_cause(QuantModel(str(models["qdq"])), None)
    assert cause and report.kernel_cause.startswith(cause)
    read = re.search(r"\(checked: with those weights stored as uint8, the same values, the file reads ([0-9.]+) ",
                     report.kernel_cause)
    assert read and float(read.group(1)) >= 0.999
    cause = report.kernel_cause
    # the contract's check words its verdict with it: its integer stage made to drop
    dropped = [dict(st, values={**st["values"], "cosine-similarity": 0.9}) if st["stage"] == "integer" else st
               for st in report.stages]
    analysis = SimpleNamespace(stages=lambda _: dataclasses.replace(report, stages=dropped), label="m",
                               relative=str)
    result = check_stages(analysis, min_cosine=0.99)
    assert not result.passed and result.first_drop == "integer" and result.message.endswith(cause)
    monkeypatch.setattr(kernels, "integer_kernels_saturate", lambda: False)
    assert localize_stages(str(models["float"]), str(models["qdq"]), models["data"]).kernel_cause == ""


@pytest.mark.parametrize("keep_float", [False, True])
def test_weights_stored_as_uint8_hold_the_same_values_and_run_as_simulated(models, tmp_path, keep_float):
    """The check behind the saturation cause: lone DQs of int8 codes, or float weights behind
    pairs, given uint8 codes and zero points 128 higher: the same dequantized values, no
    product any kernel saturates, and onnxruntime's fused kernels then read as the simulation
    on every CPU."""
    qpath = builders.quantize(models["float"], tmp_path / "q.onnx", models["data"], keep_float=keep_float)
    qm = QuantModel(str(qpath))
    widened = kernels.as_uint8_weights(qm)
    assert widened is not None and saturating_nodes(QuantModel(widened)) == []
    converted = [i for i in widened.graph.initializer if i.name.endswith("::as_uint8")]
    # every weight's zero point (a pair's Q and DQ share it), and with lone DQs its codes too
    weights = [c for c in qm.of_kind("weight") if c.role != "bias"]
    assert len(weights) == 3 and len(converted) == len(weights) * (1 if keep_float else 2)
    assert all(i.data_type == onnx.TensorProto.UINT8 for i in converted)
    plain = ort.InferenceSession(widened.SerializeToString(), providers=["CPUExecutionProvider"])
    for i in range(N):
        feed = {"x": models["data"]["x"][i]}
        same = builders.run_model(widened, feed)
        assert all(np.array_equal(same[k], v) for k, v in builders.run_model(qpath, feed).items())
        fused = plain.run(None, feed)[0]
        assert builders.pooled_cosine([same[plain.get_outputs()[0].name]], [fused]) > 0.9999


def test_the_checked_cause_says_what_the_uint8_file_read(models, monkeypatch):
    from pytest_ptq import stages
    from pytest_ptq.engine import Engine
    from pytest_ptq.outputs import parse_outputs

    engine = Engine(str(models["qdq"]), models["data"], float_model=str(models["float"]))
    specs = parse_outputs(None, engine)
    monkeypatch.setattr(kernels, "integer_kernels_saturate", lambda: True)
    # the saturation's clause says what it found without contradicting the check: products
    # that do not saturate, not a file that runs as simulated
    monkeypatch.setattr(stages, "simulation_gap", lambda *a, **k: 0.99)
    told = stages.kernel_cause(engine, specs)
    assert "no such product saturates" in told and "runs so here too" not in told
    assert told.endswith("; with those weights stored as uint8, the same values, the file reads 0.990000 against the "
                         "simulation, 0.990000 as given: not what moves this file's outputs; no cause removed brings "
                         "the file to the simulation: its kernels depart from it in more")
    for uint8, given, said in ((0.995, 0.99, "0.995000 against the simulation, from 0.990000 as given; no cause"),
                               # rounding, not a tenth of the difference gone
                               (0.951236, 0.951231, "0.951236 against the simulation, 0.951231 as given: not what")):
        gaps = iter([uint8, given])  # with the weights stored as uint8, then as given
        monkeypatch.setattr(stages, "simulation_gap", lambda *a, **k: next(gaps))
        assert said in stages.kernel_cause(engine, specs, given=None)
    monkeypatch.setattr(stages, "simulation_gap", lambda *a, **k: 0.9999912)
    assert stages.kernel_cause(engine, specs).endswith("the file reads 0.999991 against the simulation)")
    monkeypatch.setattr(kernels, "integer_kernels_saturate", lambda: False)
    assert stages.kernel_cause(engine, specs) == ""


def test_a_cause_onnxruntime_cannot_check_is_named_unchecked(models, monkeypatch):
    """Model Optimizer's fp16 classifier with its weights stored as uint8 was a file onnxruntime
    refuses (its value_info still says int8): the check stopped the whole example suite with an
    internal error. A cause that cannot be checked is named unchecked."""
    import onnx

    from pytest_ptq import stages
    from pytest_ptq.engine import Engine
    from pytest_ptq.outputs import parse_outputs

    engine = Engine(str(models["qdq"]), models["data"], float_model=str(models["float"]))
    specs = parse_outputs(None, engine)
    refused = onnx.ModelProto()
    refused.CopyFrom(engine.qmodel.full_model())
    refused.graph.node[0].op_type = "NoSuchOp"
    monkeypatch.setattr(stages, "saturation_cause", lambda qm, providers: "its kernels saturate")
    monkeypatch.setattr(stages, "as_uint8_weights", lambda qm: refused)
    assert stages.kernel_cause(engine, specs) == "its kernels saturate"
    monkeypatch.setattr(stages, "SIMULATION_CLOSE", 1.0)
    (told,) = stages.simulation_warnings(engine, specs)
    assert told.startswith(stages.SIMULATION_WARNING) and "its kernels saturate" in told


def test_error_metrics_rank_the_other_way():
    stage, _ = verdict({"optimized-float": 0.0, "fake-quant": 0.5, "integer": 0.5}, 0.0, "mse", 0.1)
    assert stage == "fake-quant"
    assert verdict({"optimized-float": 0.0, "fake-quant": 0.5, "integer": 0.5}, 0.0, "mse", None)[0] is None


def test_models_that_do_not_belong_together(models, tmp_path):
    other = builders.conv_net(tmp_path / "two.onnx", two_inputs=True)
    with pytest.raises(PTQError, match="inputs"):
        localize_stages(str(other), str(models["qdq"]), models["data"])
    with pytest.raises(PTQError, match="not an output of both"):
        localize_stages(str(models["float"]), str(models["qdq"]), models["data"], output_node="r1")
    with pytest.raises(PTQError, match="the two look swapped; give the float model first"):
        localize_stages(str(models["qdq"]), str(models["float"]), models["data"])
    # the same graph with other weights: its outputs differ from the first stage on, which read
    # as the quantizer's rewrite of the graph; it is another model
    retrained = builders.conv_net(tmp_path / "retrained.onnx", seed=5)
    with pytest.raises(PTQError, match=r"does not reproduce the float model .*retrained.onnx.*check that it is the "
                       "model this one was quantized from"):
        localize_stages(str(retrained), str(models["qdq"]), models["data"])
    # the quantized model given as the float one: refused by path, and beside an engine that has its own
    from pytest_ptq.engine import Engine

    for calibrated in (str(models["planted"]), Engine(models["qdq"], models["data"], float_model=models["float"])):
        with pytest.raises(PTQError, match=rf"the float model '{re.escape(str(models['qdq']))}' holds \d+ "
                           "QuantizeLinear node"):
            localize_stages(str(models["qdq"]), calibrated, models["data"])


def test_cli_stages(models, tmp_path, capsys):
    folder = builders.save_folder(models["data"], tmp_path / "data")
    assert main(["stages", str(models["float"]), str(models["qdq"]), str(folder), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "integer vs fake-quant" in text and "every stage keeps" in text
    rc = main(["stages", str(models["float"]), str(models["planted"]), str(folder), "--threshold", "0.999",
               "-m", "cosine-similarity", "sqnr", "--json", str(tmp_path / "s.json"), "--quiet"])
    assert rc == 1
    assert "'fake-quant'" in capsys.readouterr().out
    assert (tmp_path / "s.json").is_file()
    assert main(["stages", str(tmp_path / "none.onnx"), str(models["qdq"]), str(folder)]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["stages", "-h"])
    assert exc.value.code == 0
    assert "FLOAT_MODEL" in capsys.readouterr().out


@pytest.mark.skipif(not integer_kernels_saturate(), reason="this CPU's kernels do not saturate uint8 x int8 products")
@pytest.mark.parametrize("activation_type", ["QUInt8", "QInt8"])
def test_int8_activations_saturate_like_uint8_ones_here(tmp_path, activation_type):
    """Positive weights and inputs near the top of their range: every pair of products is
    large. onnxruntime's kernels depart from the simulation alike for uint8 and int8
    activations (it shifts int8 ones to uint8 on x86), and read as the simulation once the
    weights are stored as uint8."""
    helper, rng = onnx.helper, np.random.default_rng(0)
    w1 = numpy_helper.from_array((0.01 * rng.uniform(0.5, 1, (64, 64, 3, 3))).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((0.05 * rng.uniform(-1, 1, (8, 64, 3, 3))).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4), helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1] * 4)], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 16, 16])], [w1, w2])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [rng.uniform(0.7, 1, (1, 64, 16, 16)).astype(np.float32) for _ in range(2)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", data, activation_type=activation_type, keep_float=False)
    qm = QuantModel(str(q))
    assert saturating_nodes(qm) == [n.name for n in qm.normal.values() if n.op_type == "Conv"]
    simulated = [builders.run_model(q, {"x": x})["y"] for x in data["x"]]

    def kernels_read(model):
        sess = ort.InferenceSession(model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model),
                                    providers=["CPUExecutionProvider"])
        return builders.pooled_cosine(simulated, [sess.run(None, {"x": x})[0] for x in data["x"]])

    assert kernels_read(q) < 0.999
    assert kernels_read(kernels.as_uint8_weights(qm)) > 0.99999


def _added_then_reshaped(root):
    """a, b -> Add -> Reshape -> y in float, and its int8 QDQ model whose output pair lays its
    codes out: Add -> Q -> Reshape -> DQ (the tool analyses it as Reshape -> Q -> DQ). onnxruntime
    fuses the rewrite's DQ, DQ -> Add -> Q into a QLinearAdd, which rounds the sum's ties
    otherwise, but not the file's, whose Add stays in float (0.1 + 0.1 scales over a 0.2 one)."""
    from onnx import TensorProto, helper

    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    io = ([helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, 16, 16]) for x in "ab"],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 768])])
    add = helper.make_node("Add", ["a", "b"], ["sum"], name="add")
    builders.save_model(helper.make_graph([add, helper.make_node("Reshape", ["sum", "shape"], ["y"], name="reshape")],
                                     "float", *io, [shape]), root / "float.onnx")
    inits, nodes = [shape], []
    parts = [builders.add_pair(inits, nodes, x, 0.1, np.int8(0)) for x in "ab"]
    inits += [numpy_helper.from_array(np.array(0.2, np.float32), "o_s"),
              numpy_helper.from_array(np.array(0, np.int8), "o_z")]
    nodes += [helper.make_node("Add", parts, ["sum"], name="add"),
              helper.make_node("QuantizeLinear", ["sum", "o_s", "o_z"], ["sum_q"], name="o_Q"),
              helper.make_node("Reshape", ["sum_q", "shape"], ["y_q"], name="reshape"),
              helper.make_node("DequantizeLinear", ["y_q", "o_s", "o_z"], ["y"], name="o_DQ")]
    builders.save_model(helper.make_graph(nodes, "qdq", *io, inits), root / "qdq.onnx")
    return root / "float.onnx", root / "qdq.onnx"


def test_the_integer_stage_runs_the_file_not_the_tools_rewrite_of_a_moved_pair(tmp_path):
    """A pair whose codes a Reshape lays out was run on the integer kernels as the tool rewrites
    it (the Reshape before the Q), which onnxruntime fused otherwise than the file: the stage
    read a QLinearAdd the file never runs."""
    fpath, qpath = _added_then_reshaped(tmp_path)
    data = builders.samples(N, seed=5, names=("a", "b"))
    report = localize_stages(str(fpath), str(qpath), data)
    assert any("Reshape 'reshape'" in note for note in QuantModel(str(qpath)).notes)  # analysed as a moved pair
    L = ort.GraphOptimizationLevel
    feeds = [{"a": a, "b": b} for a, b in zip(data["a"], data["b"])]
    ref = [_session(fpath, L.ORT_DISABLE_ALL, False).run(["y"], f)[0] for f in feeds]
    integer = [_session(qpath, L.ORT_ENABLE_ALL, False).run(["y"], f)[0] for f in feeds]
    fake = [_session(qpath, L.ORT_ENABLE_ALL, True).run(["y"], f)[0] for f in feeds]
    assert [s["stage"] for s in report.stages] == list(STAGES)
    assert report.value("integer") == pytest.approx(_pooled_cosine(ref, integer), abs=1e-12)
    assert report.value("fake-quant") == pytest.approx(_pooled_cosine(ref, fake), abs=1e-12)
    assert report.kernel_gap["values"]["cosine-similarity"] == pytest.approx(_pooled_cosine(fake, integer), abs=1e-12)
    # and the warning that the file runs otherwise than simulated compares the file too (it
    # read 0.99916 for the rewrite's QLinearAdd, a gap the file does not have)
    engine = Engine(str(qpath), data)
    worst = min(compare(f, i)["cosine-similarity"] for f, i in zip(fake, integer))
    assert simulation_gap(engine, parse_outputs(None, engine)) == pytest.approx(worst, abs=1e-9)
    # the rewrite runs otherwise on the integer kernels: what the stage read before
    moved = builders.load(qpath)
    order = {n.name: n for n in moved.graph.node}
    order["o_Q"].input[0], order["o_Q"].output[0] = "y_f", "y_q"
    order["reshape"].input[0], order["reshape"].output[0] = "sum", "y_f"
    del moved.graph.node[:]
    moved.graph.node.extend(order[k] for k in ("a_Q", "a_DQ", "b_Q", "b_DQ", "add", "reshape", "o_Q", "o_DQ"))
    so = ort.SessionOptions()
    rewrite = ort.InferenceSession(moved.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert _pooled_cosine(ref, [rewrite.run(["y"], f)[0] for f in feeds]) != pytest.approx(
        report.value("integer"), abs=1e-9)


def test_a_moved_pairs_file_whose_nodes_share_a_name_runs_its_integer_stage(tmp_path):
    # onnxruntime refuses repeated node names; the file read as given for its kernels made
    # every stage fail where the same file without a moved pair ran
    fpath, qpath = _added_then_reshaped(tmp_path)
    model = builders.load(qpath)
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            n.name = "dup"
    onnx.save(model, str(tmp_path / "dup.onnx"))
    data = builders.samples(N, seed=5, names=("a", "b"))
    before = (tmp_path / "dup.onnx").read_bytes()
    named = localize_stages(str(fpath), str(tmp_path / "dup.onnx"), data)
    report = localize_stages(str(fpath), str(qpath), data)
    assert named.value("integer") == report.value("integer")
    assert (tmp_path / "dup.onnx").read_bytes() == before


def _chain_beside_an_empty_output(path):
    """x -> Conv -> a coarse pair read straight by a fine one -> Conv -> y, which onnxruntime's
    default DoubleQDQPairsRemover merges into one pair (a real gap from the simulation), beside
    e [n, 4] -> pair -> MatMul -> z, empty where the data holds no rows (n = 0)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "M")]
    nodes = []

    def pair(src, name, scale):
        return builders.add_pair(inits, nodes, src, scale, np.int8(0), name)

    w = pair("W", "wq", 0.01)
    nodes.append(helper.make_node("Conv", ["x", w], ["c"], name="conv0", pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Conv", [pair(pair("c", "coarse", 1.5), "fine", 0.05), w], ["y"], name="conv1",
                                  pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("MatMul", [pair("e", "ea", 0.05), pair("M", "mq", 0.02)], ["z"], name="matmul"))
    graph = helper.make_graph(nodes, "empty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                                               helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 3])], inits)
    builders.save_model(graph, path)
    return path


def test_an_empty_output_is_no_failed_session_and_a_gap_beside_it_is_still_told(tmp_path):
    """A model output of shape [0, 3] made every face warn that a plain default session
    cannot run the file (compare refuses arrays without values): it is skipped, and the gap
    onnxruntime's merge of a requantize chain makes on the other output is measured."""
    from pytest_ptq.stages import SIMULATION_WARNING, simulation_warnings

    path = _chain_beside_an_empty_output(tmp_path / "model.onnx")
    rng = np.random.default_rng(8)
    feeds = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32), "e": np.zeros((0, 4), np.float32)}
             for _ in range(4)]
    engine = Engine(str(path), {k: [f[k] for f in feeds] for k in ("x", "e")})
    L = ort.GraphOptimizationLevel
    written = [_session(path, L.ORT_DISABLE_ALL, False).run(None, f) for f in feeds]  # the Q/DQ as written
    plain = [_session(path, L.ORT_ENABLE_ALL, False).run(None, f) for f in feeds]  # as onnxruntime deploys it
    assert all(p[1].shape == (0, 3) for p in plain)
    worst = min(compare(w[0], p[0])["cosine-similarity"] for w, p in zip(written, plain))
    assert worst < 0.999
    assert simulation_gap(engine, parse_outputs(None, engine)) == pytest.approx(worst, abs=1e-6)
    (told,) = simulation_warnings(engine)
    assert told.startswith(SIMULATION_WARNING) and "cannot run" not in told and f"{worst:.4f}" in told, told
    assert "DoubleQDQPairsRemover" in told

"""Alarms that are true: clean models with non-negative tensors raise no folding warning, a
badly quantized clean model is analysed (not refused), and a verdict comes from every sample
even when the ranking's first sample says otherwise.

Every figure is checked against plain onnxruntime on the float model or on rewired copies.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.runall import runall
from test_runall import _bypassed, _cos, _outputs

KEEP = {"AddQDQPairToWeight": True, "QDQKeepRemovableActivations": True}


def _non_negative_net(path):
    """x [1, 4, 8, 8] through tensors that are >= 0 by nature or by the data: a sum of squares,
    LayerNorm's variance + eps, x * sigmoid(x) (>= -0.28), and a Conv with positive weights on
    |x|; each feeds on, so every one is a quantized activation."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(np.abs(rng.normal(size=(4, 4, 3, 3))).astype(np.float32), "w_pos")
    w2 = numpy_helper.from_array(rng.normal(size=(4, 4, 3, 3)).astype(np.float32) * 0.3, "w2")
    eps = numpy_helper.from_array(np.array(1e-5, np.float32), "eps")
    nodes = [
        helper.make_node("Abs", ["x"], ["ax"], name="abs"),
        helper.make_node("Conv", ["ax", "w_pos"], ["pos"], name="conv_pos", pads=[1, 1, 1, 1]),  # >= 0 on the data
        helper.make_node("Conv", ["x", "w2"], ["h"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["h", "h"], ["h2"], name="square"),
        helper.make_node("Mul", ["pos", "pos"], ["p2"], name="square2"),
        helper.make_node("Add", ["h2", "p2"], ["ss"], name="sum_of_squares"),
        helper.make_node("ReduceMean", ["h"], ["mu"], name="mean", axes=[1], keepdims=1),
        helper.make_node("Sub", ["h", "mu"], ["d"], name="centre"),
        helper.make_node("Mul", ["d", "d"], ["d2"], name="dev2"),
        helper.make_node("ReduceMean", ["d2"], ["var"], name="var", axes=[1], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="var_eps"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="sd"),
        helper.make_node("Div", ["d", "sd"], ["norm"], name="normalise"),
        helper.make_node("Sigmoid", ["norm"], ["sg"], name="sigmoid"),
        helper.make_node("Mul", ["norm", "sg"], ["silu"], name="silu"),
        helper.make_node("Add", ["silu", "ss"], ["mix"], name="mix"),
        helper.make_node("Mul", ["mix", "ve"], ["y"], name="out"),
    ]
    graph = helper.make_graph(nodes, "nonneg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, w2, eps])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _data(n, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return {"x": [(rng.standard_normal((1, 4, 8, 8)) * scale).astype(np.float32) for _ in range(n)]}


def test_non_negative_tensors_raise_no_folding_alarm(tmp_path):
    fp = _non_negative_net(tmp_path / "float.onnx")
    data = _data(8)
    q = builders.quantize(fp, tmp_path / "q.onnx", data, extra_options=KEEP)
    folder = builders.save_folder(data, tmp_path / "calib")
    engine = Engine(str(q), folder)
    # the planted tensors are quantized activations whose ranges start at (or near) 0
    acts = {c.input for c in engine.qmodel.calibration.values() if c.kind == "activation"}
    assert {"ss", "ve", "pos", "silu"} <= acts
    assert not [w for w in engine.warnings if "fold" in w], engine.warnings
    # and bypassing every pair is the float model, run in plain onnxruntime
    want = builders.run_model(fp, [{"x": a} for a in data["x"]])
    for i in range(len(data["x"])):
        np.testing.assert_allclose(engine.run(i, ())["y"], want[i]["y"], rtol=1e-5, atol=1e-6)


def test_a_badly_quantized_clean_model_is_analysed_not_refused(tmp_path):
    fp = builders.conv_net(tmp_path / "float.onnx")
    data = builders.samples(6)
    # ranges calibrated on inputs 100x smaller than the data: activations clip hard
    narrow = {k: [a * 0.01 for a in v] for k, v in data.items()}
    q = builders.quantize(fp, tmp_path / "q.onnx", narrow, extra_options=KEEP)
    folder = builders.save_folder(data, tmp_path / "calib")
    quantized = _outputs(onnx.load(str(q)), data, "logits")
    floats = _outputs(onnx.load(str(fp)), data, "logits")
    assert _cos(floats, quantized) < 0.95  # genuinely bad
    engine = Engine(str(q), folder)
    assert not [w for w in engine.warnings if "fold" in w], engine.warnings
    n = len(data["x"])
    bypassed = np.concatenate([engine.run(i, (), ["logits"])["logits"] for i in range(n)]).astype(np.float64)
    assert _cos(floats, bypassed) == pytest.approx(1.0, abs=1e-6)


def test_the_verdict_comes_from_every_sample_not_the_rankings_first(tmp_path):
    fp = builders.conv_net(tmp_path / "float.onnx", outlier_channel=3)
    q = builders.quantize(fp, tmp_path / "q.onnx", builders.samples(6), weight_type="QInt4")
    # sample 0 looks like the calibration data; the others are 4x larger and clip the
    # activations: on sample 0 alone weights look like the cause, on all 8 activations are
    data = builders.samples(8, seed=2)
    data["x"][1:] = [a * 4 for a in data["x"][1:]]
    folder = builders.save_folder(data, tmp_path / "calib")
    s = runall(str(q), folder, save_dir=tmp_path / "out", rank_samples=1, top=1, output_node=["logits"], progress=False)
    v = s["verdict"]
    ref = _outputs(_bypassed(q, {"weight", "activation"}), data, "logits")
    weights_only = _cos(ref, _outputs(_bypassed(q, {"activation"}), data, "logits"))
    acts_only = _cos(ref, _outputs(_bypassed(q, {"weight"}), data, "logits"))
    assert v["values"]["calibration"]["weight only"] == pytest.approx(weights_only, abs=1e-6)
    assert v["values"]["calibration"]["activation only"] == pytest.approx(acts_only, abs=1e-6)
    assert 1 - acts_only >= 2 * (1 - weights_only)  # the rule's "activation" on the whole set
    assert v["source"] == "activation" and v["samples"]["calibration"] == 8
    one = {k: v_[:1] for k, v_ in data.items()}
    w0 = _cos(_outputs(_bypassed(q, {"weight", "activation"}), one, "logits"),
              _outputs(_bypassed(q, {"activation"}), one, "logits"))
    assert v["disagreement"].startswith("on the 1 sample(s) every node was ranked on, the verdict would be 'weight'")
    assert f"weights only {w0:.5g}"[:18] in v["disagreement"]
    assert "trust the verdict" in (tmp_path / "out" / "summary.md").read_text()

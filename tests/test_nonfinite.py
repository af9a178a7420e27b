"""A node whose quantization alone makes the outputs non-finite: a normalisation whose
variance, quantized on a range set by one loud calibration sample, rounds to 0 on the quiet
ones, so the Sqrt and the Div after it give Inf and NaN. It is the worst node there is, and
every face says why, without hiding the finite nodes that matter."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import builders
from pytest_ptq.diagnosis import diagnose
from pytest_ptq.engine import Engine
from pytest_ptq.outputs import parse_outputs
from pytest_ptq.runall import runall
from pytest_ptq.sensitivity import get_sensitivity_of_nodes
from pytest_ptq.verdict import three_configs

WIDTH = 16


def norm_net(path):
    """x -> (x - mean) / sqrt(mean((x - mean)^2) + eps) -> MatMul: a layer norm without scale."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", axes=[1]),
        helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
        helper.make_node("Mul", ["centred", "centred"], ["square"], name="square"),
        helper.make_node("ReduceMean", ["square"], ["var"], name="variance", axes=[1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="std"),
        helper.make_node("Div", ["centred", "std"], ["normed"], name="normalise"),
        helper.make_node("MatMul", ["normed", "w"], ["y"], name="project"),
    ]
    graph = helper.make_graph(
        nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]), onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite")
    rng = np.random.default_rng(1)
    # one loud sample sets the variance's range; on the quiet ones it rounds to 0
    scales = [1000.0, 0.01, 0.02, 0.01]
    data = {"x": [(s * rng.standard_normal((1, WIDTH))).astype(np.float32) for s in scales]}
    q = builders.quantize(norm_net(root / "float.onnx"), root / "q.onnx", data)
    return q, builders.save_folder(data, root / "calib")


def _gate(engine):
    return next(c.name for c in engine.qmodel.of_kind("activation") if c.input == "var_eps")


def test_the_engine_gives_nan_where_a_plain_session_gives_non_finite_outputs(model):
    q, folder = model
    engine = Engine(q, folder)
    gate = _gate(engine)
    sens = get_sensitivity_of_nodes(engine, node_type="activation")
    assert math.isnan(sens[gate]["cosine-similarity"])
    assert list(sens)[0] == gate  # the worst there is
    assert any(math.isfinite(v["cosine-similarity"]) and v["cosine-similarity"] < 0.999 for v in sens.values())
    # independently: only that pair kept, in a plain onnxruntime session
    rewired = builders.rewire(q, keep={gate})
    out = builders.run_model(rewired, {"x": engine.sample(1)["x"]})
    assert not np.isfinite(next(iter(out.values()))).all()
    assert "nan: quantizing the node alone makes the model outputs non-finite" in sens.table()


def test_diagnosis_and_runall_name_the_sqrt_and_keep_the_finite_nodes(model, tmp_path):
    q, folder = model
    engine = Engine(q, folder)
    gate = _gate(engine)
    sens = get_sensitivity_of_nodes(engine, node_type="activation")
    d = diagnose(engine, sens, three_configs(engine, parse_outputs(None, engine)))
    first = d.nodes[0]
    assert first["node"] == gate and first["badness"] == math.inf and first["relevant"]
    assert "non-finite (NaN or Inf): it feeds Sqrt 'std'" in first["reason"]
    assert first["try"][0] == "keep in float"
    # the finite nodes that cost a tenth of the worst finite one still show
    finite = [it for it in d.nodes if math.isfinite(it["badness"])]
    worst = max(it["badness"] for it in finite)
    assert [it["relevant"] for it in finite] == [it["badness"] >= 0.1 * worst and it["badness"] > 0 for it in finite]
    assert any(it["relevant"] for it in finite)

    summary = runall(engine, save_dir=tmp_path / "out", node_type=["activation"], progress=False)
    item = next(it for it in summary["verdict"]["nodes"] if it["node"] == gate)
    assert "it feeds Sqrt 'std'" in item["reasons"][0]
    assert "nothing to do" not in " ".join(item["reasons"])

"""Integration: a remedy in the producer's own terms, applied by re-quantizing with that producer.

Each producer runs in its own environment, named by ``PTQ_MODELOPT_PYTHON``,
``PTQ_QUARK_PYTHON``, ``PTQ_INC_PYTHON`` or ``PTQ_AIMET_PYTHON`` (see README.md); a producer
whose variable is unset is skipped. Per producer and small model: the producer quantizes the
float model; pytest-ptq detects it, writes a remedy (nodes kept in float, raised to 16 bit,
weights per channel: what the producer can express) in its terms; the producer re-quantizes
with them, and every remedied tensor must come out as asked. Then ``suggest_remedy`` does the
same end to end and reports the measured metric.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import builders
import conventions
from pytest_ptq.data import load_data
from pytest_ptq.engine import Engine
from pytest_ptq.remedy import PYTHON_ENV, check_producer_terms, producer_terms, requantize_with_producer, suggest_remedy
from pytest_ptq.remedy.result import producer_lines

# How each first quantizes the model: its defaults, an fp32 graph for Model Optimizer (so
# that the float model's weights are the model's); per-tensor weights where the producer can, so that
# a per-channel remedy changes something.
RECIPES = {"modelopt": {"quantize_mode": "int8", "high_precision_dtype": "fp32"},
           "quark": {"config": "A8W8_QCONFIG"}, "neural-compressor": {"per_channel": False},
           "aimet": {"activation_type": "int8", "param_type": "int8", "per_channel": False}}
# The kinds each can express (ModelOpt: no int16, weights per channel already).
KINDS = {"modelopt": ("float",), "quark": ("float", "int16", "per-channel"),
         "neural-compressor": ("float", "per-channel"), "aimet": ("float", "int16", "per-channel")}


def _param(key):
    env = PYTHON_ENV[key]
    return pytest.param(key, id=key, marks=pytest.mark.skipif(
        not os.environ.get(env), reason=f"set {env} to the Python of an environment with the producer"))


PRODUCERS = [_param(k) for k in PYTHON_ENV]


@pytest.fixture(scope="module")
def floats(tmp_path_factory):
    root = tmp_path_factory.mktemp("float_models")
    conv, mlp = builders.samples(8), conventions.mlp_samples(8)
    return {"conv": (builders.conv_net(root / "conv.onnx"), builders.save_folder(conv, root / "conv_data")),
            "mlp": (conventions.mlp_net(root / "mlp.onnx"), builders.save_folder(mlp, root / "mlp_data"))}


def _made(key, floats, base, tmp_path):
    fpath, folder = floats[base]
    path = requantize_with_producer(key, fpath, load_data(folder, None, None), tmp_path / f"{key}_{base}.onnx",
                                    recipe=RECIPES[key])
    return Engine(str(path), folder, float_model=str(fpath)), fpath


def _axis(qm, c):
    """The output-channel axis of a weight for the op that reads it."""
    node = qm.node(c.consumers[0])
    if node.op_type == "Gemm":
        return 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
    return 1 if node.op_type == "MatMul" else 0


def _pick(qm, key):
    """Calibration nodes and the kind each takes: activations computed inside the graph, in
    graph order, then a weight quantized per tensor (any weight where there is none)."""
    kinds = KINDS[key]
    acts = [c for c in qm.of_kind("activation") if c.producer in qm.normal and c.consumers]
    choices = {acts[0].name: "float"}
    if "int16" in kinds and len(acts) > 1:
        choices[acts[-1].name] = "int16"  # away from the first: its exclusions would leave this one float
    weights = [c for c in qm.of_kind("weight") if c.role != "bias" and c.consumers]
    if "per-channel" in kinds and weights:
        # the last: the first's reader is the one a float activation near the input excludes
        w = next((c for c in reversed(weights) if not c.per_channel), weights[-1])
        choices[w.name] = "per-channel"
    axes = {n: _axis(qm, qm.calibration[n]) for n, k in choices.items() if k == "per-channel"}
    return choices, axes


@pytest.mark.parametrize("base", ["conv", "mlp"])
@pytest.mark.parametrize("key", PRODUCERS)
def test_the_producer_re_quantized_with_its_terms_does_what_they_say(key, base, floats, tmp_path):
    engine, fpath = _made(key, floats, base, tmp_path)
    qm = engine.qmodel
    assert qm.made_by.key == key, qm.made_by
    choices, axes = _pick(qm, key)
    terms = producer_terms(qm, "mixed", list(choices), axes, choices, float_model=str(fpath))
    measured = check_producer_terms(engine, terms, recipe=RECIPES[key])
    print("\n".join(producer_lines(terms, measured)))
    assert measured["applied"], measured["not_applied"]
    asked = {t for ts in terms["expect"].values() for t in ts}
    assert asked and all(ok for ts in measured["kept"].values() for ok in ts.values())
    for part in ("original", "before", "after"):
        assert 0 < measured[part]["calibration"] <= 1 + 1e-9


@pytest.mark.parametrize("key", PRODUCERS)
def test_suggest_checks_its_terms_with_the_producer(key, floats, tmp_path):
    # Model Optimizer leaves the small convs of the conv net float: nothing there to remedy
    engine, fpath = _made(key, floats, "mlp" if key == "modelopt" else "conv", tmp_path)
    r = suggest_remedy(engine, target=0.99999, remedy="float", float_model=str(fpath), save_dir=tmp_path / "out",
                       progress=False)
    print(r.summary())
    assert r.nodes and r.producer_terms["producer"] == key
    m = r.producer_measured
    assert m is not None and m["applied"], (r.warnings, m)
    assert Path(m["model"]).exists()
    assert f"re-quantized with {r.producer_terms['short']} and these terms" in r.summary()

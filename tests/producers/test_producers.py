"""Integration: QDQ models made by the real third-party quantizers, analysed right.

The models come from tests/producers/make_models.py, run in each producer's own virtual
environment (the producers pin onnxruntime builds of their own, so they never share one
with pytest-ptq): point ``PTQ_PRODUCER_MODELS`` at its output folder. A producer that is
importable here is also run directly. Without either, the module is skipped.

Per model, as the producers issue asks: the engine loads it with its float model;
bypassing every pair reproduces the float model, or the tool reports the quantizer's
rewrite; the fully quantized engine equals onnxruntime running the file with its QDQ fusion
off; weight and activation rankings are finite; runall finishes.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

import builders
from pytest_ptq.data import load_data
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError
from pytest_ptq.metrics import compare
from pytest_ptq.runall import runall
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

MODULES = {"modelopt": "modelopt.onnx.quantization", "quark": "quark.onnx", "inc": "onnx_neural_compressor",
           "aimet": "aimet_onnx", "torch-qat": "torch.ao.quantization"}


def _importable(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _folders():
    root = os.environ.get("PTQ_PRODUCER_MODELS")
    found = sorted(p for p in Path(root).iterdir() if (p / "model.onnx").exists()) if root else []
    here = [name for name, module in MODULES.items() if _importable(module)]
    return found, here


FOUND, HERE = _folders()


@pytest.fixture(scope="module")
def made_here(tmp_path_factory):
    """Models quantized in this process by the producers importable here."""
    import make_models

    root = tmp_path_factory.mktemp("producer_models")
    return {f.name: f for p in HERE for f in make_models.make(p, root)}


def _cases():
    cases = [pytest.param(str(f), id=f.name) for f in FOUND]
    cases += [pytest.param(f"here:{p}", id=f"here-{p}") for p in HERE]
    return cases or [pytest.param(None, marks=pytest.mark.skip(
        reason="no producer models: run tests/producers/make_models.py in a producer's venv and set "
               "PTQ_PRODUCER_MODELS (see tests/producers/README.md)"))]


def _cos(a, b):
    return compare(a, b)["cosine-similarity"]


def _check(folder, tmp_path):
    """The engine of ``folder``'s model after the checks; None where onnxruntime refuses the
    file itself (Neural Compressor's silero-vad), which the tool must refuse in one sentence."""
    import onnxruntime as ort

    data = load_data(folder / "calib", None, 4)
    samples = {k: [data.sample(i)[k] for i in range(len(data))] for k in data.names}
    try:
        ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own refusal, whatever its type
        with pytest.raises(PTQError) as info:
            Engine(folder / "model.onnx", samples, float_model=folder / "float.onnx")
        assert "\n" not in str(info.value) and str(folder / "model.onnx") in str(info.value), (exc, info.value)
        return None
    engine = Engine(folder / "model.onnx", samples, float_model=folder / "float.onnx")
    # every Q and DQ belongs to a calibration node: one left as an ordinary node is quantized in
    # every run, the float reference too (PyTorch's Q, Clip, DQ pairs were, before they were read)
    left = [n.name for n in engine.qmodel.normal.values() if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert not left, (folder.name, left)
    feeds = [data.sample(i) for i in range(len(data))]
    # bypassed: the float model, or a rewrite the tool names
    fsess = ort.InferenceSession(str(folder / "float.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in fsess.get_outputs()]
    bypassed = min(_cos(dict(zip(names, fsess.run(names, f)))[k], engine.run(i, ())[k])
                   for i, f in enumerate(feeds) for k in engine.model_outputs if k in names)
    if engine.rewrite is None:
        assert bypassed > 0.9999, (folder.name, bypassed)
    else:
        assert engine.rewrite["cosine"] == pytest.approx(bypassed, abs=1e-5)
    # fully quantized: onnxruntime running the file as stored, QDQ fusion off, at the engine's
    # level (ORT_ENABLE_ALL, without the rewrites the engine always turns off), or without
    # optimizations where onnxruntime's own at that level move the file's outputs (the
    # README's CRNNs); the engine equals one of them on every sample and output
    from pytest_ptq.engine import runtime

    runnable = str(builders.runnable(folder / "model.onnx", tmp_path / "runnable.onnx"))
    plains = []
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.add_session_config_entry("session.disable_quant_qdq", "1")
        plains.append(ort.InferenceSession(runnable, so, providers=["CPUExecutionProvider"],
                                           disabled_optimizers=list(runtime.ALWAYS_DISABLED)))
    fp16 = any(i.data_type == onnx.TensorProto.FLOAT16
               for i in onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.initializer)
    worst = [1.0, 1.0] if fp16 else [0.0, 0.0]  # lowest cosine (fp16) or largest excess over the tolerance
    for i, f in enumerate(feeds):
        got = engine.run(i, "all")
        for j, plain in enumerate(plains):
            want = dict(zip([o.name for o in plain.get_outputs()], plain.run(None, f)))
            for k in engine.model_outputs:
                if fp16:  # onnxruntime computes fp16 ops in float32 between casts; the gates round to fp16
                    worst[j] = min(worst[j], _cos(want[k], got[k]))
                else:
                    excess = np.abs(got[k] - want[k]) - (1e-4 + 1e-4 * np.abs(want[k]))
                    worst[j] = max(worst[j], float(excess.max()))
    assert (max(worst) > 0.998) if fp16 else (min(worst) <= 0), (folder.name, worst)
    for kind in ("weight", "activation"):
        s = get_sensitivity_of_nodes(engine, node_type=kind, data_num=2)
        assert all(math.isfinite(v["cosine-similarity"]) for v in s.values()), (folder.name, kind)
    return engine


@pytest.mark.parametrize("case", _cases())
def test_a_producers_models_are_analysed_right(case, request, tmp_path):
    if case.startswith("here:"):
        producer = case[len("here:"):]
        folders = [f for name, f in request.getfixturevalue("made_here").items() if name.startswith(producer + "_")]
    else:
        folders = [Path(case)]
    assert folders
    for folder in folders:
        engine = _check(folder, tmp_path)
        if engine is None:
            continue
        summary = runall(engine, save_dir=tmp_path / folder.name, data_num=1, top=2, progress=False)
        assert summary["verdict"]["source"] in ("weight", "activation", "both", "neither")

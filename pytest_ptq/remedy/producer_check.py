"""Checking a remedy in the producer's terms by re-quantizing with that producer.

The producers pin onnxruntime builds of their own, so each runs in its own environment: an
environment variable names its Python (:data:`PYTHON_ENV`), and
:mod:`.producer_script` runs there in a subprocess. The float model is quantized twice, as
the model was (:func:`producer_recipe`) and with the terms; the re-quantized model must keep
each remedied tensor in float (no Q/DQ on it), raise it to 16 bit or quantize it per
channel, and both are scored against the float reference.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx

from .. import guard
from ..engine.runtime import make_session, run
from ..errors import FLOAT_MODEL_OPTION, NotQuantized, PTQError
from ..metrics import Pooled, get_metric
from ..model import QuantModel, load_model
from ..outputs import parse_outputs
from .effect import changes, places
from .producer_terms import SHORT, ProducerNames
from .requantize import requantized_runner

PYTHON_ENV = {"modelopt": "PTQ_MODELOPT_PYTHON", "quark": "PTQ_QUARK_PYTHON", "neural-compressor": "PTQ_INC_PYTHON",
              "aimet": "PTQ_AIMET_PYTHON"}
PACKAGE = {"modelopt": "nvidia-modelopt[onnx]", "quark": "amd-quark", "neural-compressor": "onnx-neural-compressor",
           "aimet": "aimet-onnx"}
SCRIPT = Path(__file__).with_name("producer_script.py")


def producer_python(key):
    """The Python named by the producer's environment variable, or None when unset."""
    value = os.environ.get(PYTHON_ENV.get(key, ""), "")
    return value or None


def producer_recipe(qmodel):
    """How the producer seems to have quantized ``qmodel``, as the options its re-run takes:
    what the Q/DQ pairs show (type, granularity, stored weights, the graph's float type);
    calibration methods leave no trace and stay the producer's defaults."""
    key = qmodel.made_by.key
    acts = [c for c in qmodel.of_kind("activation") if c.q_node is not None]
    weights = [c for c in qmodel.of_kind("weight") if c.role != "bias"]
    float8 = any(c.grid.is_float for c in acts + weights)
    if key == "modelopt":
        fp16 = any(i.data_type == onnx.TensorProto.FLOAT16 for i in qmodel.model.graph.initializer)
        mode = "fp8" if float8 else ("int4" if any(c.block_size for c in weights) else "int8")
        return {"quantize_mode": mode, "high_precision_dtype": "fp16" if fp16 else "fp32",
                "dq_only": mode == "int8" and bool(weights) and all(c.q_node is None for c in weights)}
    if key == "quark":
        if qmodel.custom_ops:
            raise PTQError(f"{qmodel.source!r} uses Quark's custom ops {sorted(t for _, t in qmodel.custom_ops)}; "
                           "re-quantizing is checked for its integer configs (XINT8, A8W8, A16W8) only")
        if any(c.bit == 16 for c in acts):
            return {"config": "A16W8_QCONFIG"}
        scales = np.concatenate([np.asarray(c.scale, np.float64).ravel() for c in acts]) if acts else np.ones(1)
        pow2 = bool(np.all(np.isclose(np.exp2(np.round(np.log2(scales))), scales, rtol=1e-6)))
        return {"config": "XINT8_QCONFIG" if pow2 else "A8W8_QCONFIG"}
    if key == "neural-compressor":
        return {"per_channel": any(c.per_channel for c in weights)}
    if key == "aimet":
        act_bits = max((c.bit for c in acts), default=8)
        w_bits = min((c.bit for c in weights), default=8)
        if float8:
            return {"activation_type": "float8e4m3fn", "param_type": "float8e4m3fn"}
        # aimet's default config is per channel: a per-tensor model re-quantized so read as another
        return {"activation_type": "int16" if act_bits >= 16 else "int8", "param_type": "int4" if w_bits <= 4 else "int8",
                "prequantize_constants": bool(weights) and all(c.q_node is None for c in weights),
                "per_channel": any(c.per_channel for c in weights)}
    raise PTQError(f"no re-quantizing with {qmodel.made_by.label}; the producers checked are "
                   f"{', '.join(SHORT[k] for k in PYTHON_ENV)}")


def requantize_with_producer(key, float_model, data, out_path, settings=None, recipe=None, python=None,
                             timeout=1800):
    """Quantize ``float_model`` with producer ``key`` (run by ``python``, default its
    :data:`PYTHON_ENV` variable) on the samples of ``data`` (a :class:`~pytest_ptq.data`
    set), as ``recipe`` says, with the terms' ``settings`` (None: the baseline); writes
    ``out_path`` and returns it. A failure is one sentence quoting the producer."""
    python = python or producer_python(key)
    if key not in PYTHON_ENV:
        raise PTQError(f"no producer {key!r} to re-quantize with; choose one of {', '.join(PYTHON_ENV)}")
    if not python:
        raise PTQError(f"set {PYTHON_ENV[key]} to the Python of an environment with {PACKAGE[key]} to re-quantize "
                       f"with {SHORT[key]}")
    if not Path(python).exists():
        raise PTQError(f"{PYTHON_ENV[key]}={python!r} does not exist; name the Python of an environment with "
                       f"{PACKAGE[key]}")
    model = load_model(float_model, what="float model")[0]
    out_path = guard.claim(out_path)
    with guard.scratch("ptq_producer_") as tmp:
        # the producer reads a copy: it never writes next to the user's float model
        onnx.save(model, str(tmp / "float.onnx"))
        samples = [data.sample(i) for i in range(len(data))]
        np.savez(tmp / "samples.npz", **{k: np.stack([s[k] for s in samples]) for k in samples[0]})
        spec = {"producer": key, "float": str(tmp / "float.onnx"), "out": str(tmp / "out" / "model.onnx"),
                "samples": str(tmp / "samples.npz"), "recipe": recipe or {}, "settings": settings or {}}
        (tmp / "out").mkdir()
        (tmp / "spec.json").write_text(json.dumps(spec))
        try:
            # UTF-8 both ways: Windows' code page fails on a producer's progress bars and names
            proc = subprocess.run([python, str(SCRIPT), str(tmp / "spec.json")], capture_output=True,
                                  encoding="utf-8", errors="replace", timeout=timeout,
                                  env={**os.environ, "PYTHONIOENCODING": "utf-8"})
        except subprocess.TimeoutExpired:
            raise PTQError(f"{SHORT[key]} did not finish re-quantizing within {timeout} s") from None
        except OSError as exc:
            raise PTQError(f"{PYTHON_ENV[key]}={python!r} cannot be run ({exc.strerror or exc})") from None
        if proc.returncode != 0:
            last = [line for line in (proc.stderr or proc.stdout or "").strip().splitlines() if line.strip()]
            raise PTQError(f"{SHORT[key]} could not re-quantize the float model with the remedy's terms: "
                           f"{last[-1].strip() if last else 'no output'} (exit {proc.returncode})")
        written = tmp / "out" / "model.onnx"
        extra = [p for p in written.parent.iterdir() if p.name.startswith("model.onnx") and p != written]
        if extra:  # weights the producer wrote as external data: one file for the caller
            onnx.save(onnx.load(str(written)), str(tmp / "merged.onnx"))
            written = tmp / "merged.onnx"
        guard.write_bytes(out_path, written.read_bytes())
    return Path(out_path)


def effect(terms, float_model, baseline_path, fixed_path):
    """What re-quantizing with the terms did to the remedied tensors: ``kept`` (per kind,
    tensor -> applied), ``not_applied``, ``in_float`` (asked at 16 bit or per channel, left in
    float) and ``collateral`` (tensors it also left in float or changed that the remedy did
    not name), read by structure from both re-quantized models."""
    key = terms["producer"]

    def quantized(path):
        try:
            qm = QuantModel(str(path), float_model=float_model)
        except NotQuantized:  # the terms left nothing quantized
            return {}
        names = ProducerNames(qm, key, float_model)
        return places(qm, lambda c: names.tensor(c)[0], names.node)

    return changes(quantized(baseline_path), quantized(fixed_path), expected_places(terms))


def expected_places(terms):
    """``{kind: [(tensor, chain position, readers)]}``: each tensor ``terms`` expect of a kind,
    at the position in its requantize chain of the pair they name it for, read by the operator
    inputs that pair reaches (terms kept from before positions were recorded: 0; before readers
    were: None, every pair there)."""
    out = {}
    for kind, tensors in terms["expect"].items():
        for tensor in tensors:
            # a reader is [operator, input index] as JSON holds it (an operator alone in older terms)
            at = {(e.get("position", 0), None if e.get("readers") is None else
                   tuple(r if isinstance(r, str) else tuple(r) for r in e["readers"]))
                  for e in terms["nodes"].values() if e["tensor"] == tensor and e["kind"] == kind}
            out.setdefault(kind, []).extend((tensor, p, r) for p, r in sorted(at or {(0, None)}, key=str))
    return out


def output_score(engine, float_model, metric="cosine-similarity"):
    """``score(path) -> {"calibration": value}``: the worst output's ``metric`` over every
    sample of ``engine``, the model at ``path`` (None: the calibrated model itself) run fully
    quantized against the float model run as stored."""
    m = get_metric(metric)
    fmodel = load_model(float_model, what="float model")[0]
    reference = make_session(fmodel, "disable", engine.providers, fake_quant=False, what="the float model")
    float_outputs = {o.name for o in fmodel.graph.output}
    source = "<float ModelProto>" if isinstance(float_model, onnx.ModelProto) else str(float_model)

    defaults = parse_outputs(None, engine)  # a concatenation of unlike parts: by part

    def score(path=None):
        new = engine if path is None else requantized_runner(path, engine.data, engine)
        specs = [s for s in defaults if s.tensor in new.model_outputs and s.tensor in float_outputs]
        if not specs:
            raise PTQError(f"the float model and the re-quantized model share no output (float: "
                           f"{sorted(float_outputs)}); pass the float model the calibrated model was made from")
        tensors = list(dict.fromkeys(s.tensor for s in specs))
        pool = Pooled(m, specs)
        for i in range(len(engine.data)):
            feeds = engine.data.sample(i)
            with engine.on_sample(i):
                pool.add(dict(zip(tensors, run(reference, tensors, feeds, source))), new.run(i, "all", tensors))
        return {"calibration": pool.judged(engine.data)}

    return score


def check_producer_terms(engine, terms, float_model=None, recipe=None, save_dir=None, score=None, python=None,
                         timeout=1800):
    """Re-quantize the float model with the producer of ``terms`` (see
    :func:`~pytest_ptq.remedy.producer_terms.producer_terms`), without and with them, and
    report what it did. ``engine``: the calibrated model's (its data are the calibration
    samples, its float model the default ``float_model``); ``recipe``: the producer's options
    (default :func:`producer_recipe`); ``score(path) -> {part: value}`` (path None: the calibrated model; default
    :func:`output_score`: worst output cosine against the float model). Returns ``{producer, python, recipe, kept,
    not_applied, collateral, applied, original, before, after, model, baseline_model}`` with
    ``original`` the calibrated model's score and ``before`` / ``after`` those of the two
    re-quantized models."""
    float_model = float_model if float_model is not None else engine.float_model
    if float_model is None:
        raise PTQError(f"re-quantizing with the producer needs the float model; pass it ({FLOAT_MODEL_OPTION})")
    key = terms["producer"]
    recipe = recipe if recipe is not None else producer_recipe(engine.qmodel)
    python = python or producer_python(key)
    score = score or output_score(engine, float_model)
    out_dir, tmp = guard.output_folder(save_dir, "ptq_producer_check_")
    try:
        tag = key.replace("-", "_")
        base = requantize_with_producer(key, float_model, engine.data, out_dir / f"requantized_{tag}_baseline.onnx",
                                        None, recipe, python, timeout)
        fixed = requantize_with_producer(key, float_model, engine.data, out_dir / f"requantized_{tag}_remedy.onnx",
                                         terms["settings"], recipe, python, timeout)
        found = effect(terms, float_model, base, fixed)
        found.update({"producer": key, "label": terms["label"], "python": python, "recipe": recipe,
                      "applied": not found["not_applied"], "original": score(None), "before": score(base),
                      "after": score(fixed),
                      "model": None if tmp else str(fixed), "baseline_model": None if tmp else str(base)})
        return found
    finally:
        if tmp is not None:
            tmp.cleanup()

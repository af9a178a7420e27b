"""The fixes found by ``ptq-debug suggest``, re-applied with onnxruntime's quantizer.

``fixes.json`` records, per fixed model, the settings the remedy search emitted
(onnxruntime's ``nodes_to_exclude`` and ``TensorQuantOverrides``) and the command that found
them. The suite re-quantizes the float model with them into ``<cache>/<model>/fixed_model.onnx``
(``quantize_static``, reusing the calibration ranges), or, for an entry whose settings name
``quantize_dynamic``, into the entry's ``file`` with that quantizer; an entry's ``model`` (the
model folder) defaults to its key. A model is rebuilt only when its settings change.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXES = HERE / "fixes.json"


def _say(verbose, message):
    """``verbose``: True prints to stderr, a callable (the conftest's progress) takes the line."""
    if callable(verbose):
        verbose(message)
    elif verbose:
        print(f"example suite: {message}", file=sys.stderr, flush=True)


def build_fixed_models(paths, verbose=True):
    """Write ``fixed_model.onnx`` for every model in fixes.json; returns {model: path}."""
    sys.path.insert(0, str(HERE.parent))
    from example_suite.quantize import quantize, quantize_dynamically
    from pytest_ptq.remedy import quantize_static_kwargs

    fixes = json.loads(FIXES.read_text())
    built = {}
    for key, fix in fixes.items():
        info = paths["models"][fix.get("model", key)]
        out = Path(info["dir"]) / fix.get("file", "fixed_model.onnx")
        stamp = out.with_suffix(".settings")
        fingerprint = hashlib.sha256(json.dumps(fix["settings"], sort_keys=True).encode()).hexdigest()
        if not out.exists() or not stamp.exists() or stamp.read_text() != fingerprint:
            _say(verbose, f"re-quantizing {key} with the fix from fixes.json into {out.name} ...")
            start = time.perf_counter()
            kwargs = quantize_static_kwargs(fix["settings"])
            if fix["settings"].get("quantizer") == "quantize_dynamic":
                quantize_dynamically(info["float_model"], out, nodes_to_exclude=kwargs["nodes_to_exclude"])
            else:
                quantize(info["float_model"], out, info["calibration_data"],
                         nodes_to_exclude=kwargs["nodes_to_exclude"],
                         tensor_quant_overrides=kwargs["extra_options"].get("TensorQuantOverrides"),
                         calibration_cache=info["calibration_cache"])
            stamp.write_text(fingerprint)
            _say(verbose, f"{key}: {out.name} ({time.perf_counter() - start:.1f} s)")
        built[key] = out
    return built

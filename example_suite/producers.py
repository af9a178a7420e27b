"""The example suite's third-party model: the text-direction classifier quantized by NVIDIA
Model Optimizer (its ONNX int8 PTQ, default settings: an fp16 graph with per-channel
weights), when a Python with ``nvidia-modelopt[onnx]`` is named by ``PTQ_MODELOPT_PYTHON``.

Model Optimizer pins its own onnxruntime build, so it runs in its own virtual environment
(tests/producers/README.md says how to make one; CI does). Without it the contract
``ppocr_cls_modelopt.ptq.yaml`` is skipped with that reason. The model is cached as
``<cache>/ppocr_mobile_v2_cls/modelopt_int8.onnx`` and made again only when its inputs or
the command change.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODEL = "ppocr_mobile_v2_cls"
FILE = "modelopt_int8.onnx"
COMMAND = ["--quantize_mode", "int8", "--calibration_eps", "cpu"]
ENV = "PTQ_MODELOPT_PYTHON"


def modelopt_python():
    """The Python of a Model Optimizer environment, or None when none is named."""
    python = os.environ.get(ENV)
    return python if python and Path(python).exists() else None


def _say(verbose, message):
    """``verbose``: True prints to stderr, a callable (the conftest's progress) takes the line."""
    if callable(verbose):
        verbose(message)
    elif verbose:
        print(f"example suite: {message}", file=sys.stderr, flush=True)


def build_modelopt_model(paths, verbose=True):
    """``<cache>/<MODEL>/modelopt_int8.onnx`` (made on first use), or None without Model Optimizer."""
    python = modelopt_python()
    info = paths["models"][MODEL]
    out = Path(info["dir"]) / FILE
    stamp = out.with_suffix(".command")
    calib = sorted(Path(info["calibration_data"], "x").glob("*.npy"), key=lambda p: int(p.stem))
    fingerprint = hashlib.sha256(" ".join(COMMAND + [Path(info["float_model"]).name, str(len(calib))]).encode()).hexdigest()
    if out.exists() and stamp.exists() and stamp.read_text() == fingerprint:
        return out
    if python is None:
        return None
    _say(verbose, f"quantizing {MODEL} with NVIDIA Model Optimizer ({python}) into {FILE} ...")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "calib.npz"
        np.savez(npz, x=np.concatenate([np.load(f) for f in calib]))
        proc = subprocess.run([python, "-m", "modelopt.onnx.quantization", "--onnx_path", str(info["float_model"]),
                               "--output_path", str(out), "--calibration_data_path", str(npz), *COMMAND],
                              capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"Model Optimizer could not quantize {MODEL}: {last[0]}")
    stamp.write_text(fingerprint)
    _say(verbose, f"{MODEL}: {FILE} ({time.perf_counter() - start:.1f} s)")
    return out

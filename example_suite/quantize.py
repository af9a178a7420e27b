"""Quantize an example-suite model with onnxruntime, the way a user would.

The example suite needs one helper to make the *naive* quantized model and to
quantize again with a fix applied (some nodes left in float, some activations
raised to 16 bits).  It lives here so that ``prepare.py`` and the tests share
the same settings:

* ``QuantFormat.QDQ``, per-tensor scales, ``QInt8`` weights, ``QUInt8``
  activations, ``CalibrationMethod.MinMax``: the first thing people try.
* ``BYPASSABLE_EXTRA_OPTIONS`` by default, so that taking out every
  QuantizeLinear/DequantizeLinear pair gives back the float model exactly:

  - ``AddQDQPairToWeight``: every weight stays a float initializer behind a
    Q/DQ pair (by default it is stored as int8 behind a lone DequantizeLinear);
  - ``QDQKeepRemovableActivations``: Relu/Clip nodes stay in the graph (by
    default they are deleted and only the activation's quantization range
    [0, 6] or [0, max] still clips; bypass that pair and the clipping is gone);
  - ``QuantizeBias: False``: Conv/Gemm biases stay float.  By default a bias
    becomes int32 (scale = input scale * weight scale) behind a lone
    DequantizeLinear with no Q in front, so no pair can restore it, and on the
    PP-OCRv4 detector that rounding alone moves the output by up to 0.29
    (the float model is recovered to 5e-5 with float biases).

  Pass ``extra_options={}`` for onnxruntime's defaults (int8 weights, int32
  biases, Relu/Clip folded away): that is ``calibrated_model_default.onnx``.

16-bit activations (tested with onnxruntime 1.32)
-------------------------------------------------
``tensor_quant_overrides={"some_tensor": QuantType.QUInt16}`` is the short
form of onnxruntime's
``extra_options["TensorQuantOverrides"] = {"some_tensor": [{"quant_type": QuantType.QUInt16}]}``.
What works, and why:

* Nothing else is needed: no ``UseQDQContribOps`` and no
  ``ActivationSymmetric``.  The tensor gets a uint16 Q/DQ pair (asymmetric,
  from its MinMax range) and every consumer reads the 16-bit DequantizeLinear;
  the other tensors stay 8-bit.
* The ONNX QuantizeLinear/DequantizeLinear ops take 16-bit types only from
  opset 21.  Given a model below opset 21, ``quantize_static`` runs
  ``onnx.version_converter`` to opset 21 *inside* the call as soon as an
  override names a 16-bit type (it logs a warning, "Automatically update the
  model to opset 21"), so the 16-bit model comes from another graph than the
  8-bit one (the converter may rewrite or add nodes).  ``prepare.py``
  therefore stores the float models at opset 21 already: no conversion
  happens, and every 16-bit Q/DQ is a standard ONNX op (``ai.onnx`` domain)
  that onnxruntime runs with and without graph optimizations.
* ``UseQDQContribOps=True`` only moves every Q/DQ to the ``com.microsoft``
  domain; in onnxruntime 1.32 it does not avoid the opset-21 conversion
  (tested: an opset-11 model still comes out at opset 21, with the warning).

Calibration cache
-----------------
onnxruntime 1.32's ``quantize_static`` takes ``calibration_cache_path``: the
MinMax ranges are saved to that JSON file the first time and read back on
later calls, so re-quantizing with a fix skips the calibration runs.  Pass
``calibration_cache=`` here to use it; the ranges do not depend on
``nodes_to_exclude`` or on the overrides, only on the float model and the
calibration data.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

__all__ = [
    "BYPASSABLE_EXTRA_OPTIONS",
    "NpyCalibrationDataReader",
    "load_samples",
    "quantize",
    "quantize_dynamically",
    "build_dynamic_model",
]

#: Extra options of the "bypassable" calibrated model (see the module docstring).
BYPASSABLE_EXTRA_OPTIONS: dict = {
    "AddQDQPairToWeight": True,
    "QDQKeepRemovableActivations": True,
    "QuantizeBias": False,
}

_QUANT_TYPE_NAMES = {
    "quint8": QuantType.QUInt8,
    "uint8": QuantType.QUInt8,
    "qint8": QuantType.QInt8,
    "int8": QuantType.QInt8,
    "quint16": QuantType.QUInt16,
    "uint16": QuantType.QUInt16,
    "qint16": QuantType.QInt16,
    "int16": QuantType.QInt16,
}


def load_samples(data_dir: str | Path) -> list[dict[str, np.ndarray]]:
    """Read ``<data_dir>/<input_name>/<i>.npy`` into a list of feed dicts.

    Files are ordered by their integer stem (0.npy, 1.npy, ..., 10.npy), so the
    i-th dict holds the i-th sample of every input.
    """
    data_dir = Path(data_dir)
    inputs = sorted(p for p in data_dir.iterdir() if p.is_dir())
    if not inputs:
        raise FileNotFoundError(f"no <input_name>/ folders in {data_dir}")
    per_input = {}
    for folder in inputs:
        files = sorted(folder.glob("*.npy"), key=lambda p: int(p.stem))
        per_input[folder.name] = files
    counts = {name: len(files) for name, files in per_input.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"inputs in {data_dir} have different sample counts: {counts}")
    n = next(iter(counts.values()))
    return [{name: np.load(files[i]) for name, files in per_input.items()} for i in range(n)]


class NpyCalibrationDataReader(CalibrationDataReader):
    """CalibrationDataReader over the ``<input_name>/<i>.npy`` layout."""

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir)
        self._samples = load_samples(self.data_dir)
        self._iter: Iterator[dict[str, np.ndarray]] = iter(self._samples)

    def get_next(self):
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    def set_range(self, start_index: int, end_index: int) -> None:  # CalibStridedMinMax
        self._iter = iter(self._samples[start_index:end_index])


def _normalise_overrides(overrides: Mapping) -> dict:
    """Accept ``{tensor: QuantType}`` / ``{tensor: "uint16"}`` / onnxruntime's own list form."""
    result = {}
    for tensor, value in overrides.items():
        if isinstance(value, str):
            try:
                value = _QUANT_TYPE_NAMES[value.lower()]
            except KeyError:
                raise ValueError(f"unknown quant type {value!r} for tensor {tensor!r}") from None
        if isinstance(value, QuantType):
            value = [{"quant_type": value}]
        elif isinstance(value, Mapping):
            value = [dict(value)]
        result[tensor] = list(value)
    return result


class _DropPreprocessHint(logging.Filter):
    """Hide quantize_static's "Please consider to run pre-processing" hint (our models are)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "consider to run pre-processing" not in record.getMessage()


def quantize(
    float_model: str | Path,
    out_path: str | Path,
    calib_dir: str | Path,
    nodes_to_exclude: Sequence[str] | None = None,
    tensor_quant_overrides: Mapping | None = None,
    extra_options: Mapping | None = None,
    *,
    calibration_cache: str | Path | None = None,
    per_channel: bool = False,
) -> Path:
    """Quantize ``float_model`` to ``out_path`` (QDQ, per-tensor, int8 weights, uint8 activations, MinMax).

    Args:
        float_model: the float ONNX model (``<cache>/<model>/float_model.onnx``).
        out_path: where to write the QDQ model.
        calib_dir: ``<cache>/<model>/calibration_data`` (holds ``<input_name>/<i>.npy``).
        nodes_to_exclude: node names to leave in float (no Q/DQ around them).
        tensor_quant_overrides: ``{tensor_name: QuantType.QUInt16}`` (or ``"uint16"``, or
            onnxruntime's ``[{"quant_type": ..., ...}]`` list) merged into
            ``extra_options["TensorQuantOverrides"]``.
        extra_options: passed to ``quantize_static`` as given; ``None`` means
            ``BYPASSABLE_EXTRA_OPTIONS``, ``{}`` means onnxruntime's defaults.
        calibration_cache: JSON file for onnxruntime's calibration cache (written if missing,
            read if present), to skip the calibration runs when quantizing again.  Only valid
            for the float model and calibration data it was made from (prepare.py keeps one
            per model as ``calibration_ranges.json``).
        per_channel: per-channel weight scales (the naive model is per-tensor; on both
            example models this is the single most effective fix).

    Returns:
        ``out_path`` as a Path.
    """
    out_path = Path(out_path)
    options = dict(BYPASSABLE_EXTRA_OPTIONS if extra_options is None else extra_options)
    if tensor_quant_overrides:
        merged = _normalise_overrides(options.get("TensorQuantOverrides", {}))
        merged.update(_normalise_overrides(tensor_quant_overrides))
        options["TensorQuantOverrides"] = merged

    kwargs = {}
    reader = None
    if calibration_cache is not None:
        if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
            raise RuntimeError("calibration_cache needs a quantize_static with calibration_cache_path "
                               "(onnxruntime 1.32 has it)")
        kwargs["calibration_cache_path"] = str(calibration_cache)
    if calibration_cache is None or not Path(calibration_cache).is_file() or options.get("SmoothQuant"):
        reader = NpyCalibrationDataReader(calib_dir)  # not read at all when the cache is there

    out_path.parent.mkdir(parents=True, exist_ok=True)
    hint_filter = _DropPreprocessHint()
    root = logging.getLogger()
    root.addFilter(hint_filter)
    try:
        quantize_static(
            str(float_model),
            str(out_path),
            reader,
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=list(nodes_to_exclude or []),
            extra_options=options,
            **kwargs,
        )
    finally:
        root.removeFilter(hint_filter)
    return out_path


#: The classifier quantized with onnxruntime's ``quantize_dynamic``, in its model folder.
DYNAMIC_MODEL = "dynamic_model.onnx"


def quantize_dynamically(float_model: str | Path, out_path: str | Path,
                         nodes_to_exclude: Sequence[str] | None = None) -> Path:
    """``quantize_dynamic`` with its defaults, as onnxruntime recommends it for a first try:
    int8 weights per tensor, uint8 activations whose range DynamicQuantizeLinear computes on
    every run (no calibration data), ConvInteger/MatMulInteger kernels."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    hint_filter = _DropPreprocessHint()
    root = logging.getLogger()
    root.addFilter(hint_filter)
    try:
        quantize_dynamic(str(float_model), str(out_path), weight_type=QuantType.QInt8,
                         nodes_to_exclude=list(nodes_to_exclude or []))
    finally:
        root.removeFilter(hint_filter)
    return out_path


def build_dynamic_model(paths: Mapping, model: str = "ppocr_mobile_v2_cls", verbose: bool = True) -> Path:
    """``<cache>/<model>/dynamic_model.onnx``, made again when the float model changes."""
    import hashlib
    import sys
    import time

    info = paths["models"][model]
    out = Path(info["dir"]) / DYNAMIC_MODEL
    stamp = out.with_suffix(".float")
    fingerprint = hashlib.sha256(Path(info["float_model"]).read_bytes()).hexdigest()
    if not out.exists() or not stamp.exists() or stamp.read_text() != fingerprint:
        start = time.perf_counter()
        quantize_dynamically(info["float_model"], out)
        stamp.write_text(fingerprint)
        message = f"{model}: {out.name} by quantize_dynamic ({time.perf_counter() - start:.1f} s)"
        if callable(verbose):  # the conftest's progress line
            verbose(message)
        elif verbose:
            print(f"example suite: {message}", file=sys.stderr)
    return out

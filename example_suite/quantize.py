"""Quantize an example-suite model with onnxruntime, the way a user would.

The example suite needs one helper to make the *naive* quantized model and to
quantize again with a fix applied (some nodes left in float, some activations
raised to 16 bits).  It lives here so that ``prepare.py`` and the tests share
the same settings:

* ``QuantFormat.QDQ``, per-tensor scales, ``QInt8`` weights, ``QUInt8``
  activations, ``CalibrationMethod.MinMax``: the first thing people try.
* ``BYPASSABLE_EXTRA_OPTIONS`` by default: ``AddQDQPairToWeight`` keeps every
  weight as a float initializer behind a QuantizeLinear/DequantizeLinear pair,
  and ``QDQKeepRemovableActivations`` keeps Relu/Clip nodes that onnxruntime
  would otherwise fold into the activation's quantization range.  With both,
  taking out every Q/DQ pair gives back the float model (up to the int32 bias,
  which onnxruntime stores quantized, without a Q in front of its
  DequantizeLinear).  Pass ``extra_options={}`` for onnxruntime's defaults.

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
  opset 21.  ``quantize_static`` handles a model below opset 21 by running
  ``onnx.version_converter`` to opset 21 *inside* the call as soon as an
  override names a 16-bit type, which can add nodes (the classifier's
  Softmax gets a Flatten and a Reshape) so that the 16-bit model no longer
  matches the float model node for node.  ``prepare.py`` therefore stores the
  float models at opset 21 already; then no conversion happens and 8-bit and
  16-bit models share one graph.
* ``UseQDQContribOps=True`` (Q/DQ in the ``com.microsoft`` domain) is only
  the fallback for a model that must stay below opset 21.

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
    quantize_static,
)

__all__ = [
    "BYPASSABLE_EXTRA_OPTIONS",
    "NpyCalibrationDataReader",
    "load_samples",
    "quantize",
]

#: Extra options of the "bypassable" calibrated model (see the module docstring).
BYPASSABLE_EXTRA_OPTIONS: dict = {
    "AddQDQPairToWeight": True,
    "QDQKeepRemovableActivations": True,
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
            read if present), to skip the calibration runs when quantizing again.

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
    if calibration_cache is not None:
        if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
            raise RuntimeError("calibration_cache needs onnxruntime >= 1.32 (quantize_static(calibration_cache_path=))")
        kwargs["calibration_cache_path"] = str(calibration_cache)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    hint_filter = _DropPreprocessHint()
    root = logging.getLogger()
    root.addFilter(hint_filter)
    try:
        quantize_static(
            str(float_model),
            str(out_path),
            NpyCalibrationDataReader(calib_dir),
            quant_format=QuantFormat.QDQ,
            per_channel=False,
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

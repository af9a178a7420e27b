"""Applying a remedy for real: re-quantize the float model with onnxruntime and measure it."""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from .. import guard
from ..engine import Engine
from ..errors import PTQError
from ..model import load_model
from .alternatives import PER_CHANNEL_OPS
from .result import meets
from .scoring import score
from .terms import float_tensor_name, quantize_static_kwargs

_QUANT_TYPES = {onnx.TensorProto.INT8: "QInt8", onnx.TensorProto.UINT8: "QUInt8",
                onnx.TensorProto.INT16: "QInt16", onnx.TensorProto.UINT16: "QUInt16"}
for _name, _qt in (("INT4", "QInt4"), ("UINT4", "QUInt4"), ("FLOAT8E4M3FN", "QFLOAT8E4M3FN")):
    if hasattr(onnx.TensorProto, _name):
        _QUANT_TYPES[getattr(onnx.TensorProto, _name)] = _qt


def infer_quantize_options(qmodel):
    """quantize_static arguments that reproduce ``qmodel`` as far as its Q/DQ pairs show.

    The calibration method and ``op_types_to_quantize`` leave no trace; MinMax and the
    default op list are assumed. Float weights and Relu/Clip are always kept
    (AddQDQPairToWeight, QDQKeepRemovableActivations) so that the result can be analysed.
    """
    acts = [c for c in qmodel.of_kind("activation") if c.q_node is not None]
    weights = [c for c in qmodel.of_kind("weight") if c.role != "bias"]

    def common(nodes, default):
        types = Counter(_QUANT_TYPES.get(c.qtype) for c in nodes if c.qtype in _QUANT_TYPES)
        return types.most_common(1)[0][0] if types else default

    act_type = common(acts, "QUInt8")
    weight_type = common(weights, "QInt8")
    extra = {"AddQDQPairToWeight": True, "QDQKeepRemovableActivations": True}
    signed_acts = [c for c in acts if c.qrange[0] < 0]
    if signed_acts and all(np.all(c.zero_point == 0) for c in signed_acts):
        extra["ActivationSymmetric"] = True
    unsigned_w = [c for c in weights if c.qrange[0] >= 0]
    if unsigned_w and any(np.any(c.zero_point != 0) for c in unsigned_w):
        extra["WeightSymmetric"] = False
    # a node onnxruntime would quantize that reads no Q/DQ was excluded on purpose
    excluded = [n.name for n in qmodel.normal.values()
                if n.op_type in PER_CHANNEL_OPS and not n.calibration_inputs]
    return {"activation_type": act_type, "weight_type": weight_type,
            "per_channel": any(c.per_channel for c in weights), "extra_options": extra,
            "nodes_to_exclude": excluded}


def requantize(float_model, out_path, data, options, settings=None):
    """Run quantize_static (QDQ format, MinMax) on ``float_model`` with ``options`` from
    :func:`infer_quantize_options` plus remedy ``settings``; returns ``out_path``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    extra = dict(options["extra_options"])
    exclude = list(options.get("nodes_to_exclude", []))
    if settings:
        kw = quantize_static_kwargs(settings)
        exclude += [n for n in kw["nodes_to_exclude"] if n not in exclude]
        extra.update(kw["extra_options"])

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self.i = 0

        def get_next(self):
            if self.i >= len(data):
                return None
            self.i += 1
            return data.sample(self.i - 1)

    model, path = load_model(float_model, what="float model")
    source = str(path) if path else model
    root = logging.getLogger()
    level = root.level
    # quantize_static logs a pre-processing advice on every call; it is noise here
    root.setLevel(logging.ERROR)
    guard.claim(out_path)
    try:
        quantize_static(source, str(out_path), _Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.from_string(options["activation_type"]),
                        weight_type=QuantType.from_string(options["weight_type"]),
                        per_channel=options["per_channel"], nodes_to_exclude=exclude, extra_options=extra)
    except PTQError:
        raise
    except OSError as exc:
        raise guard.write_error(getattr(exc, "filename", None) or out_path, exc) from None
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PTQError(f"onnxruntime could not re-quantize the float model with the suggested settings "
                       f"({msg}); check that the float model is the one the calibrated model came from") from None
    finally:
        root.setLevel(level)
    return Path(out_path)



def measure(engine, qm, float_model, result, specs, m, indices, save_dir):
    """Re-quantize the float model without and with the settings; score both against the
    original engine's float reference."""

    options = infer_quantize_options(qm)
    tmp = None
    if save_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ptq_remedy_")
        out_dir = Path(tmp.name)
    else:
        out_dir = Path(save_dir)
        guard.makedirs(out_dir)
    try:
        base_path = requantize(float_model, out_dir / "requantized_baseline.onnx", engine.data, options)
        fixed_path = requantize(float_model, out_dir / f"requantized_{result.remedy}.onnx", engine.data,
                                options, result.settings)
        measured = {"options": options, "model": None if tmp else str(fixed_path),
                    "baseline_model": None if tmp else str(base_path)}
        fmodel = load_model(float_model, what="float model")[0]
        fnames = {n.name for n in fmodel.graph.node}
        unknown_names = [n for n in result.settings["nodes_to_exclude"] if n not in fnames]
        if unknown_names:
            result.notes.append(f"nodes_to_exclude names {unknown_names} are not node names of the float model "
                                "(unnamed nodes get generated names); exclude them by their float-model names")
        values = {}
        for key, path in (("baseline_value", base_path), ("value", fixed_path)):
            new = Engine(str(path), engine.data, optimization=engine.optimization, providers=engine.providers,
                         check=False)
            missing = [s.tensor for s in specs if s.tensor not in new.model_outputs and s.tensor not in new.probe_tensors]
            if missing:
                result.notes.append(f"tensor {missing[0]!r} is not in the re-quantized model; no measured value")
                return None
            values[key] = score(new, "all", specs, m, indices, reference=engine)
            if key == "value":
                measured.update(_effect(qm, new.qmodel, result))
        measured.update(values)
        measured["met"] = meets(m, values["value"], result.target)
        if meets(m, values["baseline_value"], result.target) and not meets(m, result.baseline, result.target):
            result.notes.append("re-quantizing without the settings already meets the target: the model was "
                                "calibrated differently (another method or other data) from MinMax on these samples")
        return measured
    finally:
        if tmp is not None:
            tmp.cleanup()


def _effect(old, new, result):
    """What the re-quantization changed beyond, or failed to change among, the chosen nodes."""
    def quantized(qm):
        return {float_tensor_name(qm, c): c for c in qm.calibration.values() if c.role != "bias"}

    before, after = quantized(old), quantized(new)
    intended = {float_tensor_name(old, old.calibration[n]) for n in result.nodes}
    collateral, not_applied = [], []
    if result.remedy == "float":
        collateral = sorted(t for t in before if t not in after and t not in intended)
        not_applied = sorted(t for t in intended if t in after)
    elif result.remedy == "int16":
        collateral = sorted(t for t in after if t in before and after[t].bit != before[t].bit and t not in intended)
        not_applied = sorted(t for t in intended if t in after and after[t].bit < 16)
    else:
        weights = {t for t in intended if t in before and before[t].kind == "weight"}
        collateral = sorted(t for t in after if t in before and after[t].per_channel and not before[t].per_channel
                            and t not in intended)
        not_applied = sorted(t for t in weights if t in after and not after[t].per_channel)
    return {"collateral": collateral, "not_applied": not_applied}



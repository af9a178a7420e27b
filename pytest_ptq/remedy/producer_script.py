"""Quantize a float model with a third-party producer, with a remedy in its own terms.

:mod:`pytest_ptq.remedy.producer_check` runs this file with the Python of the producer's own
environment (each pins an onnxruntime build of its own, so none shares pytest-ptq's):

    python producer_script.py SPEC.json

It imports the producer, onnx and numpy only, never pytest-ptq. SPEC holds ``producer``
(modelopt, quark, neural-compressor, aimet), ``float`` and ``out`` (paths; ``float`` a binary
``.onnx`` copy the caller read by content, so onnx.load, which picks the format from the
extension, and the producers read it whatever the user's file is named), ``samples`` (an
``.npz`` with one array per model input, samples stacked on a new first axis), ``recipe``
(how the model was first quantized) and ``settings`` (the remedy's
``producer_terms()["settings"]``; empty for the baseline). A failure ends with one line on
stderr saying what went wrong.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys

import numpy as np


def _samples(path):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    n = min(len(a) for a in arrays.values())
    return [{k: a[i] for k, a in arrays.items()} for i in range(n)]


class _Reader:
    """The calibration-reader protocol every producer uses: get_next() until None."""

    def __init__(self, samples):
        self.samples = samples
        self.rewind()

    def get_next(self):
        return next(self.it, None)

    def rewind(self):
        self.it = iter(self.samples)


def modelopt(spec, samples):
    from modelopt.onnx.quantization import quantize

    r, s = spec["recipe"], spec["settings"]
    # the command line's layout: the samples concatenated on their batch axis
    calib = {k: np.concatenate([x[k] for x in samples]) for k in samples[0]}
    quantize(spec["float"], quantize_mode=r.get("quantize_mode", "int8"), calibration_data=calib,
             calibration_method=r.get("calibration_method"), calibration_eps=["cpu"],
             high_precision_dtype=r.get("high_precision_dtype", "fp16"), dq_only=bool(r.get("dq_only", False)),
             nodes_to_exclude=list(s.get("nodes_to_exclude") or []) or None,
             op_types_to_exclude=list(s.get("op_types_to_exclude") or []) or None, output_path=spec["out"])


def quark(spec, samples):
    import quark.onnx
    from quark.onnx import CalibrationDataReader, ExtendedQuantType, ModelQuantizer

    class Reader(_Reader, CalibrationDataReader):
        pass

    r, s = spec["recipe"], spec["settings"]
    config = copy.deepcopy(getattr(quark.onnx, r.get("config", "A8W8_QCONFIG")))
    if s.get("exclude"):
        config.exclude = list(config.exclude or []) + list(s["exclude"])
    if s.get("TensorQuantOverrides"):
        def typed(entry):  # JSON's names and lists: the quant types and the set of receiving nodes Quark takes
            return {k: getattr(ExtendedQuantType, v) if k == "quant_type" else typed(v) if k == "convert" else
                    set(v) if k == "recv_nodes" else v for k, v in entry.items()}

        overrides = {tensor: [typed(e) for e in entries] for tensor, entries in s["TensorQuantOverrides"].items()}
        config.extra_options.setdefault("TensorQuantOverrides", {}).update(overrides)
    ModelQuantizer(config).quantize_model(spec["float"], spec["out"], Reader(samples))


def neural_compressor(spec, samples):
    from onnx_neural_compressor import data_reader
    from onnx_neural_compressor.quantization import config, quantize
    from onnxruntime.quantization import QuantFormat, QuantType

    class Reader(_Reader, data_reader.CalibrationDataReader):
        pass

    r, s = spec["recipe"], spec["settings"]
    qconfig = config.StaticQuantConfig(calibration_data_reader=Reader(samples), quant_format=QuantFormat.QDQ,
                                       per_channel=bool(r.get("per_channel", False)),
                                       nodes_to_exclude=list(s.get("nodes_to_exclude") or []) or None)
    for pattern, op in (s.get("per_channel") or {}).items():
        kw = {k: getattr(QuantType, v) if k.endswith("_type") else v for k, v in op.items()}
        qconfig.set_local(pattern, config.OperatorConfig(**kw))
    quantize(spec["float"], spec["out"], qconfig)


def aimet(spec, samples):
    import onnx
    from aimet_onnx.quantsim import QuantizationSimModel

    r, s = spec["recipe"], spec["settings"]
    kw = {k: r[k] for k in ("activation_type", "param_type") if r.get(k)}
    sim = QuantizationSimModel(onnx.load(spec["float"]), **kw)
    quantizers = sim.qc_quantize_op_dict
    if r.get("per_channel") is False:  # the model's weights are per tensor; aimet's default config is not
        weights = {i.name for i in sim.model.model.graph.initializer}
        for name, q in quantizers.items():
            if name in weights and q.enabled:
                with contextlib.suppress(RuntimeError):  # a quantizer with no channels to speak of
                    q.enable_per_channel_quantization(False)
    wanted = list(s.get("disable") or []) + list(s.get("bitwidth") or {}) + list(s.get("per_channel") or [])
    missing = [t for t in wanted if t not in quantizers]
    if missing:
        raise SystemExit(f"aimet-onnx has no quantizer for tensor(s) {missing}; it quantizes {sorted(quantizers)}")
    for t in s.get("disable") or []:
        quantizers[t].enabled = False
    for t, bits in (s.get("bitwidth") or {}).items():
        quantizers[t].set_bitwidth(int(bits))
    for t in s.get("per_channel") or []:
        quantizers[t].enable_per_channel_quantization()
    sim.compute_encodings(samples)
    onnx.save(sim.to_onnx_qdq(prequantize_constants=bool(r.get("prequantize_constants", False))), spec["out"])


RUN = {"modelopt": modelopt, "quark": quark, "neural-compressor": neural_compressor, "aimet": aimet}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    # producers write side files (Quark's quantized_info.csv) into the working folder
    os.chdir(os.path.dirname(os.path.abspath(spec["out"])))
    try:
        RUN[spec["producer"]](spec, _samples(spec["samples"]))
    except SystemExit:
        raise
    except BaseException as exc:  # one line for the caller; the traceback stays in the log above
        import traceback

        traceback.print_exc()
        text = str(exc).strip().splitlines()
        sys.stderr.write(f"\n{type(exc).__name__}: {text[0] if text else ''}\n")
        sys.exit(1)
    if not os.path.exists(spec["out"]):
        sys.exit(f"{spec['producer']} wrote no model to {spec['out']}")


if __name__ == "__main__":
    main()

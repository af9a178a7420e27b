"""Quantize small models with a third-party quantizer, for tests/producers/test_producers.py.

Run it with the Python of a virtual environment where the producer is installed (see
tests/producers/README.md); it needs only that producer, onnx and numpy, not pytest-ptq:

    python tests/producers/make_models.py PRODUCER OUT [--real FLOAT.onnx CALIB_DIR]

PRODUCER is modelopt, quark, inc, aimet or torch-qat (PyTorch's QAT export). For every variant and model it writes
``OUT/<producer>_<variant>_<model>/`` with ``model.onnx`` (the quantized model),
``float.onnx`` (the model given to the quantizer) and ``calib/<input>/<i>.npy``. The
models are the tests' own conv net and MLP (builders.py, conventions.py) and, with
``--real``, a real float model with its calibration folder (the example suite's
text-direction classifier, say). A variant the producer cannot make is reported and skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import builders  # noqa: E402
import conventions  # noqa: E402


def _samples(folder):
    """``[{input: array}]`` from ``folder/<input>/<i>.npy`` in numeric order."""
    inputs = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    files = {d.name: sorted(d.glob("*.npy"), key=lambda p: int(p.stem)) for d in inputs}
    n = min(len(v) for v in files.values())
    return [{k: np.load(v[i]) for k, v in files.items()} for i in range(n)]


def float_models(root, real=None):
    """``{name: (float path, [samples])}``: a conv net, an MLP and, with ``real``, a real model."""
    root.mkdir(parents=True, exist_ok=True)
    conv = builders.samples(8)
    mlp = conventions.mlp_samples(8)
    out = {"conv": (builders.conv_net(root / "conv.onnx"), [{"x": a} for a in conv["x"]]),
           "mlp": (conventions.mlp_net(root / "mlp.onnx"), [{"x": a} for a in mlp["x"]])}
    if real:
        fpath, calib = Path(real[0]), Path(real[1])
        out[fpath.parent.name or "real"] = (fpath, _samples(calib)[:16])
    return out


class Reader:
    """The calibration-reader protocol every producer uses: get_next() until None."""

    def __init__(self, samples):
        self.samples = samples
        self.rewind()

    def get_next(self):
        return next(self.it, None)

    def rewind(self):
        self.it = iter(self.samples)


def _stacked(arrays):
    """One input's samples as Model Optimizer's calibration file holds them, stacked on the
    batch axis; a rank-0 input (a sample rate) has none, and goes as its one value."""
    if arrays[0].ndim:
        return np.concatenate(arrays)
    if any(a != arrays[0] for a in arrays):
        raise ValueError("a rank-0 input varies between samples; Model Optimizer's calibration file cannot hold it")
    return arrays[0]


# -- the producers: (variant, models it applies to, function(float, out, samples)) ----------
def modelopt_variants():
    def cli(*extra):
        def run(fpath, out, samples):
            with tempfile.TemporaryDirectory() as tmp:
                npz = Path(tmp) / "calib.npz"
                np.savez(npz, **{k: _stacked([s[k] for s in samples]) for k in samples[0]})
                subprocess.run([sys.executable, "-m", "modelopt.onnx.quantization", "--onnx_path", str(fpath),
                                "--output_path", str(out), "--calibration_data_path", str(npz),
                                "--calibration_eps", "cpu", *extra], check=True, capture_output=True, text=True)
        return run

    return [("int8", None, cli("--quantize_mode", "int8")),
            ("int8fp32", None, cli("--quantize_mode", "int8", "--high_precision_dtype", "fp32")),
            ("fp8fp32", {"mlp"}, cli("--quantize_mode", "fp8", "--high_precision_dtype", "fp32")),
            ("int4", {"mlp"}, cli("--quantize_mode", "int4", "--calibration_method", "rtn_dq"))]


def quark_variants():
    import quark.onnx
    from quark.onnx import ModelQuantizer

    def config(name):
        def run(fpath, out, samples):
            ModelQuantizer(copy.deepcopy(getattr(quark.onnx, name))).quantize_model(str(fpath), str(out),
                                                                                   Reader(samples))
        return run

    return [("xint8", None, config("XINT8_QCONFIG")), ("a8w8", None, config("A8W8_QCONFIG")),
            ("a16w8", None, config("A16W8_QCONFIG"))]


def inc_variants():
    from onnx_neural_compressor import data_reader
    from onnx_neural_compressor.quantization import config, quantize
    from onnxruntime.quantization import QuantFormat

    class IncReader(Reader, data_reader.CalibrationDataReader):
        pass

    def static(per_channel):
        def run(fpath, out, samples):
            quantize(str(fpath), str(out), config.StaticQuantConfig(
                calibration_data_reader=IncReader(samples), quant_format=QuantFormat.QDQ, per_channel=per_channel))
        return run

    return [("static", None, static(False)), ("static_perchannel", None, static(True))]


def aimet_variants():
    import onnx
    from aimet_onnx.quantsim import QuantizationSimModel

    def sim(**export):
        def run(fpath, out, samples):
            s = QuantizationSimModel(onnx.load(str(fpath)))
            s.compute_encodings(samples)
            onnx.save(s.to_onnx_qdq(**export), str(out))
        return run

    return [("qdq", None, sim()), ("prequant", None, sim(prequantize_constants=True))]


def torch_qat_variants():
    """PyTorch's eager-mode QAT, exported as it trains: a torch module of the float model's
    input shape (a conv net for images, an MLP for vectors; PyTorch makes its own model, the
    ONNX float model only lends its shape), a few training steps with fake quantization on the
    samples, then the fake-quantized module exported (``fbgemm``: reduce-range activations,
    written as QuantizeLinear, Clip to 127, DequantizeLinear; ``qnnpack``: full range) and the
    same module with fake quantization off as the float model."""
    import torch
    from torch import nn
    from torch.ao import quantization as tq

    class Net(nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
            if len(shape) == 4:
                c = shape[1]
                self.body = nn.Sequential(nn.Conv2d(c, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 6))
            else:
                self.body = nn.Sequential(nn.Linear(shape[-1], 32), nn.ReLU(), nn.Linear(32, 6))

        def forward(self, x):
            return self.dequant(self.body(self.quant(x)))

    def export(module, x, path):
        torch.onnx.export(module, x, str(path), opset_version=13, input_names=["x"], output_names=["y"],
                          dynamo=False)

    def qat(backend):
        def run(fpath, out, samples):
            torch.manual_seed(0)
            xs = [torch.from_numpy(s["x"]) for s in samples]
            net = Net(tuple(xs[0].shape))
            net.qconfig = tq.get_default_qat_qconfig(backend, version=0)  # FakeQuantize modules: exportable
            net = tq.prepare_qat(net.train())
            opt = torch.optim.SGD(net.parameters(), lr=0.01)
            for _ in range(3):
                for x in xs:
                    loss = net(x).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            net.eval().apply(tq.disable_observer)
            export(net, xs[0], out)
            net.apply(tq.disable_fake_quant)
            export(net, xs[0], fpath)  # the float model: the same weights, fake quantization off
        return run

    return [("fbgemm", None, qat("fbgemm")), ("qnnpack", None, qat("qnnpack"))]


PRODUCERS = {"modelopt": modelopt_variants, "quark": quark_variants, "inc": inc_variants, "aimet": aimet_variants,
             "torch-qat": torch_qat_variants}


def make(producer, out_root, real=None):
    """Quantize every model with every variant of ``producer`` into ``out_root``; returns the
    folders written."""
    out_root = Path(out_root).resolve()
    real = real and [Path(p).resolve() for p in real]
    written = []
    # Some producers write reports into the working directory (Quark: quantized_info.csv):
    # they run in the scratch folder, so that nothing lands beside the caller.
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        models = float_models(Path(tmp) / "float", real)
        for variant, only, run in PRODUCERS[producer]():
            for name, (fpath, samples) in models.items():
                if only is not None and name not in only:
                    continue
                folder = out_root / f"{producer}_{variant}_{name}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                shutil.copy(fpath, folder / "float.onnx")
                for i, s in enumerate(samples):
                    for k, v in s.items():
                        (folder / "calib" / k).mkdir(parents=True, exist_ok=True)
                        np.save(folder / "calib" / k / f"{i}.npy", v)
                try:
                    run(folder / "float.onnx", folder / "model.onnx", samples)
                except Exception as exc:  # a variant this producer cannot make here: say so, go on
                    detail = getattr(exc, "stderr", "") or traceback.format_exc()
                    print(f"{producer} {variant} {name}: FAILED ({detail.strip().splitlines()[-1][:200]})")
                    shutil.rmtree(folder)
                    continue
                print(f"{producer} {variant} {name}: {folder}")
                written.append(folder)
    return written


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("producer", choices=sorted(PRODUCERS))
    p.add_argument("out")
    p.add_argument("--real", nargs=2, metavar=("FLOAT_ONNX", "CALIB_DIR"), default=None)
    args = p.parse_args(argv)
    if not make(args.producer, args.out, args.real):
        sys.exit(f"{args.producer}: no model could be quantized")


if __name__ == "__main__":
    main()

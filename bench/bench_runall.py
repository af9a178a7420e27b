"""Benchmark: runall with its defaults on many samples against runall on one sample.

The model is PP-OCRv4's text recognizer from the rapidocr-onnxruntime 1.4.4 wheel, input
fixed to 1x3x48x320 and quantized with quantize_static (QDQ, int8 weights, uint8
activations, the example suite's bypassable options), calibrated on ``--samples`` text-line
shaped crops of scikit-image's pictures (all of them saved as calibration data). Both
wheels come from the example suite's cache (``python -m example_suite.prepare`` fetches
them); the model and data are built once under ``bench/.cache/``.

In one process, one after the other, it times

  one sample   runall(data_num=1): every analysis on the first sample;
  defaults     runall(): the defaults, which choose how many samples the rankings use;
  all samples  runall(rank_samples=all) (with --full): every ranking on every sample, to
               compare the default's top nodes with.

and prints the ratio defaults / one sample (target <= 3) and, with --full, how many of the
default's top-10 nodes per ranking are in the all-sample top 10.

Usage: python bench/bench_runall.py [--samples 32] [--full]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = ROOT / "bench" / ".cache" / "ppocrv4_rec"
SHAPE = (1, 3, 48, 320)


def prepare(samples):
    """``(model, data folder)``: the QDQ recognizer and ``samples`` crops, built once."""
    model, data = CACHE / f"rec_qdq_{samples}.onnx", CACHE / f"calib_{samples}"
    if model.exists() and data.exists():
        return model, data
    from example_suite import prepare as ex
    from example_suite import quantize as exq

    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = ex.fetch_wheels(ex.default_cache_dir(), verbose=True)
    with zipfile.ZipFile(wheels["rapidocr"]) as z:
        raw = z.read("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx")
    float_model = CACHE / "rec_float.onnx"
    if not float_model.exists():
        static(raw, float_model)
    from PIL import Image

    rng = np.random.default_rng(20250117)
    pictures = []
    with zipfile.ZipFile(wheels["skimage"]) as z:
        for name in sorted(n for n in z.namelist() if n.startswith("skimage/data/") and n.endswith(".png")):
            img = Image.open(io.BytesIO(z.read(name))).convert("RGB")
            if min(img.size) >= 64:
                pictures.append(np.asarray(img))
    (data / "x").mkdir(parents=True, exist_ok=True)
    for i in range(samples):
        pic = pictures[i % len(pictures)]
        h = int(rng.integers(24, max(25, min(pic.shape[0], 96))))
        w = min(pic.shape[1], int(h * rng.uniform(3, 8)))
        top, left = rng.integers(0, pic.shape[0] - h + 1), rng.integers(0, pic.shape[1] - w + 1)
        crop = Image.fromarray(pic[top:top + h, left:left + w]).resize((SHAPE[3], SHAPE[2]), Image.BILINEAR)
        x = (np.asarray(crop, dtype=np.float32) / 255.0 - 0.5) / 0.5
        np.save(data / "x" / f"{i}.npy", x.transpose(2, 0, 1)[None].astype(np.float32))
    exq.quantize(float_model, model, data)
    return model, data


def static(raw, out):
    """The float model with its input fixed to SHAPE, pre-processed as onnxruntime advises."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load_from_string(raw)
    for dim, value in zip(model.graph.input[0].type.tensor_type.shape.dim, SHAPE):
        dim.Clear()
        dim.dim_value = value
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, f"{tmp}/static.onnx")
        quant_pre_process(f"{tmp}/static.onnx", str(out), skip_symbolic_shape=True)
    model = onnx.load(str(out))
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    onnx.save(model, str(out))


def timed(label, fn):
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    print(f"  {label:>12}: {seconds:7.1f} s", flush=True)
    return seconds, out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--full", action="store_true", help="also rank on every sample, to compare top nodes")
    a = p.parse_args(argv)
    model, data = prepare(a.samples)

    from pytest_ptq.engine import Engine
    from pytest_ptq.runall import runall

    engine = Engine(model, data)
    print(f"model: PP-OCRv4 recognizer, {len(engine.calib_names)} Q/DQ pairs "
          f"({sum(c.kind == 'activation' for c in engine.qmodel.calibration.values())} on activations), "
          f"{len(engine.data)} samples", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        one, _ = timed("one sample", lambda: runall(model, data, save_dir=f"{tmp}/one", data_num=1, progress=False))
        default, summary = timed("defaults", lambda: runall(model, data, save_dir=f"{tmp}/default", progress=False))
        print(f"defaults rank on {summary['samples']} of {len(engine.data)} samples; "
              f"ratio defaults / one sample: {default / one:.2f}x")
        if a.full:
            full, every = timed("all samples", lambda: runall(model, data, save_dir=f"{tmp}/all",
                                                            rank_samples="all", progress=False))
            for kind, nodes in summary["top_nodes"].items():
                ref = every["sensitivity"][kind]["ranking"][:10]
                mine = nodes[:10]
                print(f"  {kind}: {len(set(mine) & set(ref))} of the default's top {len(mine)} are in the "
                      f"all-sample top 10")
            print(f"all samples / one sample: {full / one:.2f}x")


if __name__ == "__main__":
    main()

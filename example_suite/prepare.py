"""Prepare the real models and data of the pytest-ptq example suite.

Run ``python -m example_suite.prepare`` (or ``python example_suite/prepare.py``)
once on a machine with access to PyPI; everything lands in a git-ignored
cache folder, ``example_suite/.cache/`` unless the environment variable
``PTQ_EXAMPLE_CACHE`` names another one.  A second run finds every file in
place and does nothing but print the figures measured the first time.

What it builds, per model (``<cache>/<model>/``)::

    float_model.onnx               float model, static input shape, opset 21, pre-processed
    calibrated_model.onnx          quantize_static, QDQ, AddQDQPairToWeight + QDQKeepRemovableActivations
    calibrated_model_default.onnx  quantize_static, QDQ, onnxruntime's default extra options
    calibration_ranges.json        onnxruntime's calibration cache (MinMax ranges), reusable
    calibration_data/<input>/<i>.npy   one preprocessed sample per file, float32, batch dim 1
    heldout_data/<input>/<i>.npy       the same for the held-out samples
    prepare.json                   settings fingerprint, sample provenance, measured figures

The models come out of the ``rapidocr-onnxruntime==1.4.4`` wheel, the images
out of the ``scikit-image==0.26.0`` wheel (``skimage/data``).  Both wheels are
fetched with ``pip download`` and read with ``zipfile``; nothing is installed.
Images are decoded with Pillow (a dependency of matplotlib) and resized with
Pillow's bilinear filter where rapidocr uses ``cv2.resize`` (INTER_LINEAR), so
OpenCV is not needed.  All the randomness comes from one fixed seed.

Models:

* ``ppocrv4_det`` - PP-OCRv4 text detector (DBNet), input ``x`` 1x3x320x320,
  output a 1x1x320x320 text-probability map.
* ``ppocr_mobile_v2_cls`` - PP-OCR mobile v2.0 text-direction classifier,
  input ``x`` 1x3x48x192, output softmax over (0 degrees, 180 degrees).

See ``example_suite/MODELS.md`` for the preprocessing and the measured figures.
"""

from __future__ import annotations

import argparse
import copy
import glob
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: python example_suite/prepare.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from example_suite.quantize import BYPASSABLE_EXTRA_OPTIONS, load_samples, quantize  # noqa: E402

# --------------------------------------------------------------------------------------
# Settings.  Everything that changes an output goes into the fingerprint below, so a
# cache made with other settings is rebuilt instead of silently reused.
# --------------------------------------------------------------------------------------

PREPARE_VERSION = 1
SEED = 20250117  # the date of the rapidocr 1.4.4 wheel; any fixed number would do

RAPIDOCR_REQUIREMENT = "rapidocr-onnxruntime==1.4.4"
RAPIDOCR_WHEEL = "rapidocr_onnxruntime-1.4.4-py3-none-any.whl"
SKIMAGE_VERSION = "0.26.0"
SKIMAGE_REQUIREMENT = f"scikit-image=={SKIMAGE_VERSION}"
SKIMAGE_WHEEL_GLOB = f"scikit_image-{SKIMAGE_VERSION}-*.whl"
# scikit-image wheels are platform specific but carry the same skimage/data files.  We ask
# pip for this one file first, whatever the platform, so every machine reads the same bytes;
# if the index lacks it we take the wheel pip picks for this interpreter.
SKIMAGE_PINNED_PLATFORM = ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
                           "--implementation", "cp", "--abi", "cp311"]

RAPIDOCR_CONFIG = "rapidocr_onnxruntime/config.yaml"
DET = "ppocrv4_det"
CLS = "ppocr_mobile_v2_cls"
MODEL_SOURCES = {
    DET: "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    CLS: "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
}
# sha256 of the two .onnx files inside the 1.4.4 wheel, to catch a corrupt or different wheel.
MODEL_SHA256 = {
    DET: "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
    CLS: "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
}

DET_SIZE = 320  # the detector's static input is 1x3xDET_SIZExDET_SIZE
TARGET_OPSET = 21  # 16-bit QuantizeLinear/DequantizeLinear are standard from opset 21

# Detector samples: (image, how many crops, scale range).  "text" scales multiply the image
# size (page.png's text is ~15 px high, so 1.2-3.2 gives 18-48 px); "photo" scales map the
# shorter side to that many pixels.  Photos are also flipped at random; text is not.
DET_CALIBRATION = [
    ("page.png", "text", 12, (1.2, 3.2)),
    ("text.png", "text", 12, (1.0, 2.5)),
    ("astronaut.png", "photo", 4, (320, 640)),
    ("coffee.png", "photo", 4, (320, 640)),
    ("chelsea.png", "photo", 4, (320, 640)),
    ("rocket.jpg", "photo", 4, (320, 640)),
    ("motorcycle_left.png", "photo", 4, (320, 640)),
    ("camera.png", "photo", 4, (320, 640)),
]
DET_HELDOUT = [
    ("page.png", "letterbox", 1, None),
    ("text.png", "letterbox", 1, None),
    ("page.png", "text", 6, (1.2, 3.2)),
    ("text.png", "text", 6, (1.0, 2.5)),
    ("motorcycle_right.png", "photo", 4, (320, 640)),
    ("coins.png", "photo", 3, (320, 640)),
    ("clock_motion.png", "photo", 3, (320, 640)),
]

# Classifier samples.  Text crops come from running the original (dynamic-shape) detector
# with rapidocr's own settings on these images; every third box (in reading order) is kept
# for the held-out set.  Photo strips are random text-line shaped crops of photos, the kind
# of false positive a detector hands the classifier.
CLS_TEXT_IMAGES = ["page.png", "text.png"]
CLS_CALIBRATION_TEXT = 72  # half of them rotated by 180 degrees
CLS_CALIBRATION_STRIPS = (["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg",
                           "motorcycle_left.png"], 24)
CLS_HELDOUT_TEXT = 32
CLS_HELDOUT_STRIPS = (["motorcycle_right.png", "coins.png"], 8)

TIMING_RUNS = 15  # runs per median for the timings


class PrepareError(RuntimeError):
    """Raised with one sentence that says what to do (missing download, bad cache...)."""


def default_cache_dir() -> Path:
    """``$PTQ_EXAMPLE_CACHE`` if set, else ``example_suite/.cache``."""
    env = os.environ.get("PTQ_EXAMPLE_CACHE")
    return Path(env).expanduser() if env else Path(__file__).resolve().parent / ".cache"


def _log(verbose: bool, *args) -> None:
    if verbose:
        print("[prepare]", *args, flush=True)


# --------------------------------------------------------------------------------------
# Step 1: the wheels.
# --------------------------------------------------------------------------------------

def _pip_download(wheel_dir: Path, requirement: str, extra_args=(), log_path: Path | None = None) -> bool:
    """``pip download`` one wheel into wheel_dir; True on success.  pip's output goes to log_path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--retries", "2", "--timeout", "20",
           "-d", str(wheel_dir), *extra_args, requirement]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:  # no python/pip at all
        output, ok = f"{cmd}: {exc}", False
    else:
        output, ok = proc.stdout, proc.returncode == 0
    if log_path is not None:
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(cmd)}\n{output}\n")
    return ok


def _fetch_wheels(cache_dir: Path, verbose: bool) -> dict[str, Path]:
    wheel_dir = cache_dir / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    log_path = cache_dir / "pip-download.log"
    offline_hint = (
        f"run `python -m example_suite.prepare` on a machine with network access (or set "
        f"PTQ_EXAMPLE_CACHE to a folder it prepared), or put {RAPIDOCR_WHEEL} and a "
        f"scikit_image-{SKIMAGE_VERSION}-*.whl into {wheel_dir}; pip's output is in {log_path}"
    )

    rapidocr = wheel_dir / RAPIDOCR_WHEEL
    if not rapidocr.is_file():
        _log(verbose, f"downloading {RAPIDOCR_REQUIREMENT} ...")
        if not _pip_download(wheel_dir, RAPIDOCR_REQUIREMENT, log_path=log_path) or not rapidocr.is_file():
            raise PrepareError(f"could not download {RAPIDOCR_REQUIREMENT} with pip; {offline_hint}.")

    def find_skimage():
        found = sorted(glob.glob(str(wheel_dir / SKIMAGE_WHEEL_GLOB)))
        return Path(found[0]) if found else None

    skimage = find_skimage()
    if skimage is None:
        _log(verbose, f"downloading {SKIMAGE_REQUIREMENT} (only its skimage/data images are used) ...")
        if not _pip_download(wheel_dir, SKIMAGE_REQUIREMENT, SKIMAGE_PINNED_PLATFORM, log_path):
            _pip_download(wheel_dir, SKIMAGE_REQUIREMENT, log_path=log_path)
        skimage = find_skimage()
        if skimage is None:
            raise PrepareError(f"could not download {SKIMAGE_REQUIREMENT} with pip; {offline_hint}.")
    return {"rapidocr": rapidocr, "skimage": skimage}


class _Wheels:
    """Read-only access to the two wheels: models, rapidocr's config, skimage's images."""

    def __init__(self, paths: dict[str, Path]):
        self.paths = paths
        try:
            self._rapidocr = zipfile.ZipFile(paths["rapidocr"])
            self._skimage = zipfile.ZipFile(paths["skimage"])
        except zipfile.BadZipFile:
            raise PrepareError(
                f"a wheel in {paths['rapidocr'].parent} is damaged; delete that folder and run "
                "`python -m example_suite.prepare` again."
            ) from None
        self._images: dict[str, np.ndarray] = {}

    def model_bytes(self, model: str) -> bytes:
        data = self._rapidocr.read(MODEL_SOURCES[model])
        digest = hashlib.sha256(data).hexdigest()
        if digest != MODEL_SHA256[model]:
            raise PrepareError(
                f"{MODEL_SOURCES[model]} in {self.paths['rapidocr'].name} has sha256 {digest}, not "
                f"{MODEL_SHA256[model]}; delete {self.paths['rapidocr']} and run the script again."
            )
        return data

    def rapidocr_config(self) -> dict:
        import yaml

        return yaml.safe_load(self._rapidocr.read(RAPIDOCR_CONFIG))

    def image_bgr(self, name: str) -> np.ndarray:
        """skimage/data/<name> as HxWx3 uint8 in BGR order, as rapidocr's LoadImage returns it.

        LoadImage opens the file with PIL and converts grey to BGR (cv2.COLOR_GRAY2BGR) and
        RGB to BGR (cv2.COLOR_RGB2BGR).  (RGBA images take a peculiar path there; none is used.)
        """
        if name not in self._images:
            from PIL import Image

            with Image.open(io.BytesIO(self._skimage.read(f"skimage/data/{name}"))) as im:
                if im.mode not in ("L", "RGB"):
                    raise ValueError(f"{name}: unexpected PIL mode {im.mode}")
                rgb = np.asarray(im.convert("RGB"))
            self._images[name] = np.ascontiguousarray(rgb[..., ::-1])
        return self._images[name]

    def close(self):
        self._rapidocr.close()
        self._skimage.close()


# --------------------------------------------------------------------------------------
# Step 2: preprocessing, as rapidocr 1.4.4 does it.
# --------------------------------------------------------------------------------------

def _resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """Bilinear resize of an HxWx3 uint8 image (Pillow; rapidocr uses cv2.resize INTER_LINEAR)."""
    from PIL import Image

    if img.shape[1] == width and img.shape[0] == height:
        return img
    return np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((width, height), Image.BILINEAR))


def _det_normalize(bgr: np.ndarray, mean, std) -> np.ndarray:
    """rapidocr DetPreProcess.normalize + permute + batch: (x/255 - mean)/std, HWC->CHW, 1xCxHxW.

    The channels stay in BGR order (rapidocr feeds the BGR image from LoadImage as is).
    """
    x = (bgr.astype(np.float32) * np.float32(1 / 255.0) - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


def _det_rapidocr_resize(bgr: np.ndarray, limit_side_len: int, limit_type: str) -> np.ndarray:
    """rapidocr DetPreProcess.resize: scale to the side limit, round both sides to multiples of 32."""
    h, w = bgr.shape[:2]
    if limit_type == "max":
        ratio = limit_side_len / max(h, w) if max(h, w) > limit_side_len else 1.0
    else:
        ratio = limit_side_len / min(h, w) if min(h, w) < limit_side_len else 1.0
    rh = int(round(int(h * ratio) / 32) * 32)
    rw = int(round(int(w * ratio) / 32) * 32)
    return _resize(bgr, rw, rh)


def _place(canvas_size: int, img: np.ndarray, top: int, left: int) -> np.ndarray:
    """Paste img on a black canvas_size^2 canvas (black = rapidocr's letterbox colour)."""
    canvas = np.zeros((canvas_size, canvas_size, 3), np.uint8)
    h, w = img.shape[:2]
    canvas[top:top + h, left:left + w] = img
    return canvas


def _det_view(bgr: np.ndarray, kind: str, scale_range, rng: np.random.Generator):
    """One DET_SIZE x DET_SIZE uint8 view of an image plus a description of it.

    letterbox: whole image, longer side -> DET_SIZE, centred on black (rapidocr's
               add_round_letterbox pads with black, top and bottom alike).
    text:      image scaled by a random factor, random DET_SIZE crop (black padding
               where the scaled image is smaller).
    photo:     shorter side scaled to a random length, random crop, random h-flip.
    """
    s = DET_SIZE
    h, w = bgr.shape[:2]
    if kind == "letterbox":
        f = s / max(h, w)
        img = _resize(bgr, max(1, round(w * f)), max(1, round(h * f)))
        top, left = (s - img.shape[0]) // 2, (s - img.shape[1]) // 2
        return _place(s, img, top, left), {"kind": kind, "scale": round(f, 4)}
    if kind == "text":
        f = float(rng.uniform(*scale_range))
    elif kind == "photo":
        f = float(rng.uniform(*scale_range)) / min(h, w)
    else:
        raise ValueError(kind)
    img = _resize(bgr, max(1, round(w * f)), max(1, round(h * f)))
    ih, iw = img.shape[:2]
    # Crop window (if the image is larger) or paste position (if smaller), per axis.
    y = int(rng.integers(0, abs(ih - s) + 1))
    x = int(rng.integers(0, abs(iw - s) + 1))
    img = img[y:y + s, x:x + s] if ih >= s else img
    img = img[:, x:x + s] if iw >= s else img
    flip = kind == "photo" and bool(rng.integers(0, 2))
    if flip:
        img = img[:, ::-1]
    view = _place(s, img, 0 if ih >= s else y, 0 if iw >= s else x)
    return view, {"kind": kind, "scale": round(f, 4), "y": y, "x": x, "flip": flip}


def _det_samples(wheels: _Wheels, plan, mean, std, rng):
    samples, provenance = [], []
    for name, kind, count, scale_range in plan:
        bgr = wheels.image_bgr(name)
        for _ in range(count):
            view, info = _det_view(bgr, kind, scale_range, rng)
            samples.append(_det_normalize(view, mean, std))
            provenance.append({"image": name, **info})
    return samples, provenance


def _cls_resize_norm(crop_bgr: np.ndarray, shape) -> np.ndarray:
    """rapidocr TextClassifier.resize_norm_img: keep aspect, height 48, width <= 192, zero pad.

    resized_w = min(192, ceil(48 * w / h)); resize; /255; -0.5; /0.5; CHW; pad with 0 on the
    right to 192 (0 is mid-grey after the normalisation).  BGR channel order, like rapidocr.
    """
    c, img_h, img_w = shape
    h, w = crop_bgr.shape[:2]
    resized_w = img_w if math.ceil(img_h * w / h) > img_w else int(math.ceil(img_h * w / h))
    img = _resize(crop_bgr, resized_w, img_h).astype(np.float32).transpose(2, 0, 1) / 255
    img = (img - 0.5) / 0.5
    out = np.zeros((c, img_h, img_w), np.float32)
    out[:, :, :resized_w] = img
    return out[None]


def _label_components(mask: np.ndarray) -> list[np.ndarray]:
    """8-connected components of a boolean mask, as arrays of (y, x) run triples.

    Union-find over horizontal runs; returns, per component, an int array of rows
    (y, x_start, x_stop).  (rapidocr uses cv2.findContours for this.)
    """
    runs = []  # (y, x0, x1) with x1 exclusive
    row_runs = []
    for y in range(mask.shape[0]):
        row = np.concatenate(([0], mask[y].astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(row))
        starts, stops = edges[0::2], edges[1::2]
        row_runs.append(list(range(len(runs), len(runs) + len(starts))))
        runs.extend((y, int(a), int(b)) for a, b in zip(starts, stops))
    parent = list(range(len(runs)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for y in range(1, mask.shape[0]):
        prev, cur = row_runs[y - 1], row_runs[y]
        j = 0
        for i in cur:
            _, a, b = runs[i]
            # 8-connectivity: runs touch if [a-1, b] overlaps [a', b'-1]
            while j < len(prev) and runs[prev[j]][2] < a:  # prev run ends before a-1
                j += 1
            k = j
            while k < len(prev) and runs[prev[k]][1] <= b:
                ri, rk = find(i), find(prev[k])
                if ri != rk:
                    parent[ri] = rk
                k += 1
    groups: dict[int, list] = {}
    for i, run in enumerate(runs):
        groups.setdefault(find(i), []).append(run)
    return [np.asarray(g) for g in groups.values()]


def _detect_text_boxes(session, bgr: np.ndarray, det_cfg: dict) -> list[tuple[int, int, int, int]]:
    """Text boxes (x0, y0, x1, y1) in image pixels, from the original detector run as rapidocr runs it.

    Pre-processing: DetPreProcess with limit_side_len/limit_type/mean/std from config.yaml.
    Post-processing: a simplified DBPostProcess - threshold (thresh), 2x2 dilation
    (use_dilation), connected components, mean probability >= box_thresh, axis-aligned
    box unclipped by area * unclip_ratio / perimeter, scaled back to the image.
    """
    resized = _det_rapidocr_resize(bgr, det_cfg["limit_side_len"], det_cfg["limit_type"])
    pred = session.run(None, {session.get_inputs()[0].name: _det_normalize(resized, det_cfg["mean"], det_cfg["std"])})[0][0, 0]
    mask = pred > det_cfg["thresh"]
    if det_cfg.get("use_dilation", True):  # cv2.dilate with a 2x2 kernel, anchor (1, 1)
        dil = mask.copy()
        dil[1:, :] |= mask[:-1, :]
        dil[:, 1:] |= mask[:, :-1]
        dil[1:, 1:] |= mask[:-1, :-1]
        mask = dil
    mh, mw = pred.shape
    ih, iw = bgr.shape[:2]
    boxes = []
    for comp in _label_components(mask):
        y0, y1 = int(comp[:, 0].min()), int(comp[:, 0].max()) + 1
        x0, x1 = int(comp[:, 1].min()), int(comp[:, 2].max())
        if min(y1 - y0, x1 - x0) < 3:
            continue
        score = float(np.mean(np.concatenate([pred[y, a:b] for y, a, b in comp])))
        if score < det_cfg["box_thresh"]:
            continue
        bw, bh = x1 - x0, y1 - y0
        d = bw * bh * det_cfg["unclip_ratio"] / (2 * (bw + bh))
        if min(bw, bh) + 2 * d < 5:
            continue
        box = (
            max(0, int(round((x0 - d) * iw / mw))), max(0, int(round((y0 - d) * ih / mh))),
            min(iw, int(round((x1 + d) * iw / mw))), min(ih, int(round((y1 + d) * ih / mh))),
        )
        if box[2] - box[0] > 3 and box[3] - box[1] > 3:
            boxes.append(box)
    # reading order, as RapidOCR.sorted_boxes (top to bottom, then left to right)
    return sorted(boxes, key=lambda b: (b[1] // 10, b[0]))


def _rapidocr_crop(bgr: np.ndarray, box) -> np.ndarray:
    """get_rotate_crop_image for an axis-aligned box: the crop, turned 90 degrees if tall (h/w >= 1.5)."""
    x0, y0, x1, y1 = box
    crop = bgr[y0:y1, x0:x1]
    if crop.shape[0] / crop.shape[1] >= 1.5:
        crop = np.rot90(crop)
    return crop


def _jitter_crop(bgr: np.ndarray, box, rng: np.random.Generator, sub: bool):
    """A box with random margins (+-15% of its height per side), optionally a random part of the line."""
    x0, y0, x1, y1 = box
    h, w = y1 - y0, x1 - x0
    if sub and w > 3 * h:  # a random stretch of the line, at least 2 heights long
        length = int(rng.integers(2 * h, w + 1))
        x0 = x0 + int(rng.integers(0, w - length + 1))
        x1 = x0 + length
    m = lambda: int(round(rng.uniform(-0.15, 0.15) * h))  # noqa: E731
    ih, iw = bgr.shape[:2]
    nx0, ny0 = min(max(0, x0 + m()), iw - 4), min(max(0, y0 + m()), ih - 4)
    nx1, ny1 = max(min(iw, x1 - m()), nx0 + 4), max(min(ih, y1 - m()), ny0 + 4)
    return (nx0, ny0, nx1, ny1)


def _strip(bgr: np.ndarray, rng: np.random.Generator):
    """A random text-line shaped strip of a photo (height 24-96 px, aspect ratio 2-8)."""
    ih, iw = bgr.shape[:2]
    h = int(rng.integers(24, min(96, ih) + 1))
    w = min(iw, int(h * rng.uniform(2, 8)))
    y, x = int(rng.integers(0, ih - h + 1)), int(rng.integers(0, iw - w + 1))
    return (x, y, x + w, y + h)


def _cls_samples(wheels, boxes_by_image, n_text, strips, shape, rng):
    """n_text text crops (alternately upright / 180 degrees) plus photo strips, preprocessed."""
    samples, provenance = [], []
    pool = [(name, box) for name, boxes in boxes_by_image.items() for box in boxes]
    for i in range(n_text):
        name, box = pool[i % len(pool)]
        bgr = wheels.image_bgr(name)
        # first pass over the pool: the boxes as detected; later passes: jittered / partial
        jb = box if i < len(pool) else _jitter_crop(bgr, box, rng, sub=bool(rng.integers(0, 2)))
        crop = _rapidocr_crop(bgr, jb)
        rotated = i % 2 == 1
        if rotated:
            crop = crop[::-1, ::-1]  # 180 degrees
        samples.append(_cls_resize_norm(crop, shape))
        provenance.append({"image": name, "box": list(jb), "rotated_180": rotated, "label": int(rotated)})
    images, count = strips
    for i in range(count):
        name = images[i % len(images)]
        bgr = wheels.image_bgr(name)
        sb = _strip(bgr, rng)
        crop = bgr[sb[1]:sb[3], sb[0]:sb[2]]
        rotated = bool(rng.integers(0, 2))
        if rotated:
            crop = crop[::-1, ::-1]
        samples.append(_cls_resize_norm(crop, shape))
        provenance.append({"image": name, "box": list(sb), "rotated_180": rotated, "label": -1})
    return samples, provenance


# --------------------------------------------------------------------------------------
# Step 4: the static-shape float model.
# --------------------------------------------------------------------------------------

def _remove_noop_reshapes(model):
    """Drop Flatten/Reshape nodes whose input and output shapes are equal (added by the opset converter)."""
    import onnx

    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    graph_outputs = {o.name for o in model.graph.output}
    changed = True
    while changed:
        changed = False
        for node in list(model.graph.node):
            if node.op_type not in ("Flatten", "Reshape"):
                continue
            src, dst = node.input[0], node.output[0]
            if src not in shapes or shapes.get(src) != shapes.get(dst):
                continue
            if src in graph_outputs or (dst in graph_outputs and src in {i.name for i in model.graph.input}):
                continue  # nothing to rename safely
            model.graph.node.remove(node)
            if dst in graph_outputs:  # keep the output name: the producer of src now writes dst
                old, new = src, dst
            else:
                old, new = dst, src
            for n in model.graph.node:
                for k, name in enumerate(n.input):
                    if name == old:
                        n.input[k] = new
                for k, name in enumerate(n.output):
                    if name == old:
                        n.output[k] = new
            changed = True
            break
    # drop initializers nobody reads any more (e.g. the Reshape target shape)
    used = {i for n in model.graph.node for i in n.input}
    for init in list(model.graph.initializer):
        if init.name not in used:
            model.graph.initializer.remove(init)
    keep = {n.output[0] for n in model.graph.node} | used
    for vi in list(model.graph.value_info):
        if vi.name not in keep:
            model.graph.value_info.remove(vi)
    return onnx.shape_inference.infer_shapes(model)


def _make_float_model(raw: bytes, input_shape, out_path: Path) -> None:
    """Static input shape -> opset 21 -> quant_pre_process -> named nodes -> out_path.

    * The input dims are fixed in a copy of the model and all other shapes are re-inferred
      (onnx.shape_inference), so calibration and analysis see one static graph.
    * onnx.version_converter takes it to opset 21, where QuantizeLinear/DequantizeLinear
      accept 16-bit types; otherwise quantize_static converts silently whenever a
      TensorQuantOverrides entry asks for 16 bits, and that model would no longer match
      this one node for node.  The converter wraps the classifier's Softmax in a no-op
      Flatten/Reshape (opset 13 changed Softmax's axis semantics); those are removed again.
    * onnxruntime.quantization.quant_pre_process (ORT_ENABLE_BASIC optimizations: constant
      folding, Conv+BatchNormalization fusion, MatMul+Add -> Gemm; then ONNX shape
      inference) - the pre-processing onnxruntime recommends before quantize_static.
      Symbolic shape inference is skipped (it needs sympy; the shapes are static anyway).
    * Nodes without a name get one (nodes_to_exclude works on names); the unused opset
      imports that the ORT optimizer writes into the model are dropped again.
    """
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load_from_string(raw)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, value in zip(dims, input_shape):
        dim.Clear()
        dim.dim_value = value
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model = onnx.version_converter.convert_version(model, TARGET_OPSET)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model = _remove_noop_reshapes(model)

    with tempfile.TemporaryDirectory(prefix="ptq-prepare-") as tmp:
        static_path, pre_path = Path(tmp) / "static.onnx", Path(tmp) / "pre.onnx"
        onnx.save(model, static_path)
        quant_pre_process(str(static_path), str(pre_path), skip_symbolic_shape=True)
        model = onnx.load(pre_path)

    seen = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    used_domains = {n.domain for n in model.graph.node}
    for opset in list(model.opset_import):
        if opset.domain not in ("", "ai.onnx") and opset.domain not in used_domains:
            model.opset_import.remove(opset)
    onnx.checker.check_model(model, full_check=True)
    _atomic_save_model(model, out_path)


def _atomic_save_model(model, path: Path) -> None:
    import onnx

    tmp = path.with_name(path.name + ".tmp")
    onnx.save(model, tmp)
    os.replace(tmp, path)


def _save_dataset(samples: list[np.ndarray], input_name: str, target: Path) -> None:
    """Write <target>/<input_name>/<i>.npy through a temporary folder, renamed when complete."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / input_name).mkdir(parents=True)
    for i, sample in enumerate(samples):
        np.save(tmp / input_name / f"{i}.npy", np.ascontiguousarray(sample, dtype=np.float32))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


# --------------------------------------------------------------------------------------
# Step 6: measurements.
# --------------------------------------------------------------------------------------

def _session(model, disable_all: bool = False):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if disable_all:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _median_ms(session, feed, runs=TIMING_RUNS) -> float:
    session.run(None, feed)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t)
    return round(float(np.median(times)) * 1000, 2)


def _outputs(session, feeds) -> np.ndarray:
    return np.stack([session.run(None, f)[0] for f in feeds])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sum(a * b, axis=1) / den


def count_qdq_pairs(model) -> dict:
    """Count QuantizeLinear -> DequantizeLinear edges: on weights (Q reads an initializer) and on activations."""
    inits = {i.name for i in model.graph.initializer}
    q_by_out = {n.output[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    weight = activation = 0
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in q_by_out:
            if q_by_out[n.input[0]].input[0] in inits:
                weight += 1
            else:
                activation += 1
    dq_only = sum(1 for n in model.graph.node
                  if n.op_type == "DequantizeLinear" and n.input[0] not in q_by_out)
    return {"total": weight + activation, "weights": weight, "activations": activation,
            "dequantize_only": dq_only}


def remove_qdq_pairs(model):
    """A copy of a QDQ model with every QuantizeLinear -> DequantizeLinear pair taken out.

    Consumers of a DequantizeLinear read the QuantizeLinear's float input instead.
    DequantizeLinear nodes with no QuantizeLinear in front (int8 weights, int32 biases)
    stay, so for those the stored quantized values remain.
    """
    import onnx

    model = copy.deepcopy(model)
    g = model.graph
    q_by_out = {n.output[0]: n for n in g.node if n.op_type == "QuantizeLinear"}
    rename, drop = {}, []
    for n in g.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in q_by_out:
            rename[n.output[0]] = q_by_out[n.input[0]].input[0]
            drop.append(n)
    for n in drop:
        g.node.remove(n)
    for n in g.node:
        for k, name in enumerate(n.input):
            while name in rename:
                name = rename[name]
            n.input[k] = name
    for out in g.output:  # keep graph output names
        if out.name in rename:
            src = out.name
            while src in rename:
                src = rename[src]
            g.node.append(onnx.helper.make_node("Identity", [src], [out.name], name=f"{out.name}_bypass"))
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for n in list(g.node):
        if n.op_type == "QuantizeLinear" and n.output[0] not in used:
            g.node.remove(n)
    used = {i for n in g.node for i in n.input}
    for init in list(g.initializer):
        if init.name not in used:
            g.initializer.remove(init)
    return model


def _measure(paths: dict, model_name: str, heldout_labels, verbose: bool) -> dict:
    import onnx

    float_model = onnx.load(paths["float_model"])
    calibrated = onnx.load(paths["calibrated_model"])
    default = onnx.load(paths["calibrated_model_default"])
    feeds = load_samples(paths["heldout_data"])

    sess_float = _session(float_model)
    ref = _outputs(sess_float, feeds)
    fig: dict = {
        "float_ms": _median_ms(sess_float, feeds[0]),
        "qdq_pairs": count_qdq_pairs(calibrated),
        "qdq_pairs_default": count_qdq_pairs(default),
        "heldout_samples": len(feeds),
    }

    def stats(model, disable_all):
        sess = _session(model, disable_all)
        out = _outputs(sess, feeds)
        cos = _cosines(ref, out)
        res = {
            "cosine_mean": round(float(np.nanmean(cos)), 6) if np.isfinite(cos).any() else float("nan"),
            "cosine_min": round(float(np.nanmin(cos)), 6) if np.isfinite(cos).any() else float("nan"),
            "max_abs_diff": float(np.max(np.abs(out - ref))) if np.isfinite(out).all() else float("nan"),
            "nonfinite_values": int(np.size(out) - np.isfinite(out).sum()),
            "ms": _median_ms(sess, feeds[0]),
        }
        if heldout_labels is not None:
            labels = np.asarray(heldout_labels)
            known = labels >= 0
            pred = out.reshape(len(out), -1).argmax(1)
            res["accuracy"] = round(float(np.mean(pred[known] == labels[known])), 4)
        return res

    for tag, model in (("calibrated_model", calibrated), ("calibrated_model_default", default)):
        fig[tag] = {"ORT_DISABLE_ALL": stats(model, True), "ORT_ENABLE_ALL": stats(model, False)}
        fig[tag + "_pairs_removed"] = stats(remove_qdq_pairs(model), True)
    if heldout_labels is not None:
        labels = np.asarray(heldout_labels)
        known = labels >= 0
        fig["float_accuracy"] = round(float(np.mean(ref.reshape(len(ref), -1).argmax(1)[known] == labels[known])), 4)
    return fig


def _describe(name: str, info: dict) -> str:
    f = info["figures"]
    c, d = f["calibrated_model"], f["calibrated_model_default"]
    lines = [
        f"{name}: input {info['input_name']} {info['input_shape']}, "
        f"{info['calibration_samples']} calibration / {info['heldout_samples']} held-out samples",
        f"  float pass {f['float_ms']} ms (median of {TIMING_RUNS}); "
        f"calibrated_model: {f['qdq_pairs']['total']} Q/DQ pairs "
        f"({f['qdq_pairs']['weights']} on weights, {f['qdq_pairs']['activations']} on activations)",
        f"  cosine(float, calibrated_model) on held-out: mean {c['ORT_DISABLE_ALL']['cosine_mean']:.4f} "
        f"min {c['ORT_DISABLE_ALL']['cosine_min']:.4f} (ORT_DISABLE_ALL, {c['ORT_DISABLE_ALL']['ms']} ms), "
        f"mean {c['ORT_ENABLE_ALL']['cosine_mean']:.4f} min {c['ORT_ENABLE_ALL']['cosine_min']:.4f} "
        f"(default optimizations, {c['ORT_ENABLE_ALL']['ms']} ms)",
        f"  cosine(float, calibrated_model_default): mean {d['ORT_DISABLE_ALL']['cosine_mean']:.4f} "
        f"(ORT_DISABLE_ALL), {d['ORT_ENABLE_ALL']['cosine_mean']:.4f} (default)",
        f"  all Q/DQ pairs removed: calibrated_model max|diff| vs float "
        f"{f['calibrated_model_pairs_removed']['max_abs_diff']:.3g}; calibrated_model_default max|diff| "
        f"{f['calibrated_model_default_pairs_removed']['max_abs_diff']:.3g}, cosine "
        f"{f['calibrated_model_default_pairs_removed']['cosine_mean']:.4f}, "
        f"{f['calibrated_model_default_pairs_removed']['nonfinite_values']} non-finite values",
    ]
    if "float_accuracy" in f:
        lines.append(
            f"  0/180 accuracy on labelled held-out crops: float {f['float_accuracy']:.3f}, "
            f"calibrated_model {c['ORT_DISABLE_ALL']['accuracy']:.3f}, "
            f"calibrated_model_default {d['ORT_DISABLE_ALL']['accuracy']:.3f}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# The driver.
# --------------------------------------------------------------------------------------

def _fingerprint(model_name: str, input_shape, preprocessing: dict) -> str:
    import onnxruntime

    settings = {
        "prepare_version": PREPARE_VERSION, "seed": SEED, "model": model_name,
        "source": MODEL_SOURCES[model_name], "sha256": MODEL_SHA256[model_name],
        "rapidocr": RAPIDOCR_REQUIREMENT, "skimage": SKIMAGE_REQUIREMENT,
        "input_shape": list(input_shape), "opset": TARGET_OPSET, "preprocessing": preprocessing,
        "det": [DET_CALIBRATION, DET_HELDOUT] if model_name == DET else None,
        "cls": [CLS_TEXT_IMAGES, CLS_CALIBRATION_TEXT, CLS_CALIBRATION_STRIPS, CLS_HELDOUT_TEXT,
                CLS_HELDOUT_STRIPS] if model_name == CLS else None,
        "extra_options": BYPASSABLE_EXTRA_OPTIONS,
        "onnxruntime": onnxruntime.__version__.split("+")[0],
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _model_paths(model_dir: Path, input_name: str) -> dict:
    return {
        "dir": model_dir,
        "float_model": model_dir / "float_model.onnx",
        "calibrated_model": model_dir / "calibrated_model.onnx",
        "calibrated_model_default": model_dir / "calibrated_model_default.onnx",
        "calibration_cache": model_dir / "calibration_ranges.json",
        "calibration_data": model_dir / "calibration_data",
        "heldout_data": model_dir / "heldout_data",
        "calibration_inputs": model_dir / "calibration_data" / input_name,
        "heldout_inputs": model_dir / "heldout_data" / input_name,
        "info": model_dir / "prepare.json",
    }


def _data_complete(folder: Path, count: int) -> bool:
    return folder.is_dir() and all((folder / f"{i}.npy").is_file() for i in range(count))


def prepare(cache_dir: str | Path | None = None, verbose: bool = True, remeasure: bool = False) -> dict:
    """Download, build and measure everything the example suite needs; idempotent.

    Args:
        cache_dir: the cache folder; default ``$PTQ_EXAMPLE_CACHE`` or ``example_suite/.cache``.
        verbose: print progress and the measured figures.
        remeasure: measure again even if ``prepare.json`` holds figures.

    Returns:
        ``{"cache_dir": Path, "wheels": {"rapidocr": Path, "skimage": Path},
        "models": {name: {"dir", "float_model", "calibrated_model", "calibrated_model_default",
        "calibration_cache", "calibration_data", "heldout_data", "calibration_inputs",
        "heldout_inputs", "info": Path, "input_name": str, "input_shape": [int, ...],
        "output_name": str, "calibration_samples": int, "heldout_samples": int,
        "figures": dict}}}``
        where ``calibration_data``/``heldout_data`` hold ``<input_name>/<i>.npy``.

    Raises:
        PrepareError: with one sentence on what to do, e.g. when the wheels cannot be downloaded.
    """
    t_start = time.perf_counter()
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cache_dir = cache_dir.resolve()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrepareError(f"cannot create the cache folder {cache_dir} ({exc.strerror}); "
                           "set PTQ_EXAMPLE_CACHE to a writable folder.") from None
    result = {"cache_dir": cache_dir, "models": {}}

    # Fast path: every model complete with the current settings -> no wheel is even opened.
    # (The fingerprint needs the preprocessing from config.yaml, which prepare.json records.)
    models = {}
    for name in (DET, CLS):
        info_path = cache_dir / name / "prepare.json"
        info = json.loads(info_path.read_text()) if info_path.is_file() else None
        models[name] = info
    wheel_paths = None
    wheels = None
    try:
        for name in (DET, CLS):
            info = models[name]
            if info is not None and info.get("fingerprint") == _fingerprint(
                    name, info["input_shape"], info["preprocessing"]):
                paths = _model_paths(cache_dir / name, info["input_name"])
                complete = all(paths[k].is_file() for k in ("float_model", "calibrated_model",
                                                            "calibrated_model_default"))
                complete = complete and _data_complete(paths["calibration_inputs"], info["calibration_samples"])
                complete = complete and _data_complete(paths["heldout_inputs"], info["heldout_samples"])
                if complete and "figures" in info and not remeasure:
                    result["models"][name] = {**paths, **_public(info)}
                    continue
            if wheels is None:
                wheel_paths = _fetch_wheels(cache_dir, verbose)
                wheels = _Wheels(wheel_paths)
            result["models"][name] = _build_model(name, cache_dir, wheels, info, remeasure, verbose)
    finally:
        if wheels is not None:
            wheels.close()
    if wheel_paths is None:  # all cached; report the wheel files that are there
        wheel_dir = cache_dir / "wheels"
        sk = sorted(glob.glob(str(wheel_dir / SKIMAGE_WHEEL_GLOB)))
        wheel_paths = {"rapidocr": wheel_dir / RAPIDOCR_WHEEL, "skimage": Path(sk[0]) if sk else None}
    result["wheels"] = wheel_paths

    if verbose:
        for name, info in result["models"].items():
            print(_describe(name, info), flush=True)
        _log(True, f"cache: {cache_dir} ({time.perf_counter() - t_start:.1f} s)")
    return result


def _public(info: dict) -> dict:
    keys = ("input_name", "input_shape", "output_name", "calibration_samples", "heldout_samples", "figures")
    return {k: info[k] for k in keys if k in info}


def _preprocessing(name: str, config: dict) -> dict:
    """The preprocessing settings of a model, read from rapidocr's config.yaml."""
    if name == DET:
        c = config["Det"]
        return {"config_section": "Det", "mean": c["mean"], "std": c["std"], "scale": "1/255",
                "channel_order": "BGR", "limit_side_len": c["limit_side_len"],
                "limit_type": c["limit_type"], "thresh": c["thresh"], "box_thresh": c["box_thresh"],
                "unclip_ratio": c["unclip_ratio"], "use_dilation": c["use_dilation"]}
    c = config["Cls"]
    return {"config_section": "Cls", "cls_image_shape": c["cls_image_shape"], "mean": [0.5] * 3,
            "std": [0.5] * 3, "scale": "1/255", "channel_order": "BGR", "pad": "zeros on the right",
            "label_list": c["label_list"]}


def _build_model(name, cache_dir, wheels, old_info, remeasure, verbose) -> dict:
    import onnx

    config = wheels.rapidocr_config()
    pre = _preprocessing(name, config)
    raw = wheels.model_bytes(name)
    input_name = onnx.load_from_string(raw).graph.input[0].name
    input_shape = [1, 3, DET_SIZE, DET_SIZE] if name == DET else [1, *pre["cls_image_shape"]]
    fingerprint = _fingerprint(name, input_shape, pre)
    model_dir = cache_dir / name
    if old_info is not None and old_info.get("fingerprint") != fingerprint:
        _log(verbose, f"{name}: cache made with other settings, rebuilding {model_dir}")
        shutil.rmtree(model_dir, ignore_errors=True)
        old_info = None
    model_dir.mkdir(parents=True, exist_ok=True)
    paths = _model_paths(model_dir, input_name)
    info = dict(old_info or {})
    rebuilt = False

    # Step 2 + 3: the data sets.
    if not (old_info and _data_complete(paths["calibration_inputs"], old_info["calibration_samples"])
            and _data_complete(paths["heldout_inputs"], old_info["heldout_samples"])):
        t = time.perf_counter()
        rng = np.random.default_rng(SEED)
        if name == DET:
            calib, calib_prov = _det_samples(wheels, DET_CALIBRATION, pre["mean"], pre["std"], rng)
            held, held_prov = _det_samples(wheels, DET_HELDOUT, pre["mean"], pre["std"], rng)
        else:
            calib, calib_prov, held, held_prov = _build_cls_data(wheels, config, pre, rng)
        _save_dataset(calib, input_name, paths["calibration_data"])
        _save_dataset(held, input_name, paths["heldout_data"])
        info.update(calibration_samples=len(calib), heldout_samples=len(held),
                    calibration_provenance=calib_prov, heldout_provenance=held_prov)
        info.pop("figures", None)
        rebuilt = True
        _log(verbose, f"{name}: {len(calib)} calibration + {len(held)} held-out samples "
                      f"({time.perf_counter() - t:.1f} s)")

    # Step 4: float model.
    if rebuilt or not paths["float_model"].is_file():
        t = time.perf_counter()
        _make_float_model(raw, input_shape, paths["float_model"])
        rebuilt = True
        _log(verbose, f"{name}: float_model.onnx ({time.perf_counter() - t:.1f} s)")

    # Step 5: the two calibrated models (the second reuses the calibration cache).
    if rebuilt:
        paths["calibration_cache"].unlink(missing_ok=True)
    for key, extra in (("calibrated_model", None), ("calibrated_model_default", {})):
        if rebuilt or not paths[key].is_file():
            t = time.perf_counter()
            tmp = paths[key].with_name(paths[key].name + ".tmp.onnx")
            quantize(paths["float_model"], tmp, paths["calibration_data"], extra_options=extra,
                     calibration_cache=paths["calibration_cache"])
            os.replace(tmp, paths[key])
            rebuilt = True
            _log(verbose, f"{name}: {key}.onnx ({time.perf_counter() - t:.1f} s)")

    float_model = onnx.load(paths["float_model"])
    info.update(fingerprint=fingerprint, model=name, source_wheel=wheels.paths["rapidocr"].name,
                source_path=MODEL_SOURCES[name], sha256=MODEL_SHA256[name],
                images_wheel=wheels.paths["skimage"].name, input_name=input_name,
                input_shape=input_shape, output_name=float_model.graph.output[0].name,
                preprocessing=pre, opset=TARGET_OPSET)

    # Step 6: measurements, stored in prepare.json (written last: it marks the model complete).
    if rebuilt or remeasure or "figures" not in info:
        t = time.perf_counter()
        labels = [p["label"] for p in info["heldout_provenance"]] if name == CLS else None
        info["figures"] = _measure(paths, name, labels, verbose)
        info["figures"]["measured_on"] = f"{os.cpu_count()} CPU cores, onnxruntime CPUExecutionProvider"
        _log(verbose, f"{name}: measured ({time.perf_counter() - t:.1f} s)")
    tmp = paths["info"].with_name("prepare.json.tmp")
    tmp.write_text(json.dumps(info, indent=1, default=str))
    os.replace(tmp, paths["info"])
    return {**paths, **_public(info)}


def _build_cls_data(wheels, config, pre, rng):
    """Classifier data: text boxes from the original detector, then crops, 180-degree turns, strips."""
    import onnxruntime as ort

    det_cfg = {**config["Det"]}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    det = ort.InferenceSession(wheels.model_bytes(DET), so, providers=["CPUExecutionProvider"])
    calib_boxes, held_boxes = {}, {}
    for image in CLS_TEXT_IMAGES:
        boxes = _detect_text_boxes(det, wheels.image_bgr(image), det_cfg)
        calib_boxes[image] = [b for i, b in enumerate(boxes) if i % 3 != 2]
        held_boxes[image] = [b for i, b in enumerate(boxes) if i % 3 == 2]
    shape = pre["cls_image_shape"]
    calib, calib_prov = _cls_samples(wheels, calib_boxes, CLS_CALIBRATION_TEXT, CLS_CALIBRATION_STRIPS, shape, rng)
    held, held_prov = _cls_samples(wheels, held_boxes, CLS_HELDOUT_TEXT, CLS_HELDOUT_STRIPS, shape, rng)
    return calib, calib_prov, held, held_prov


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", default=None,
                        help="cache folder (default: $PTQ_EXAMPLE_CACHE or example_suite/.cache)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--remeasure", action="store_true", help="measure the figures again")
    parser.add_argument("--json", action="store_true", help="print the returned dict as JSON")
    args = parser.parse_args(argv)
    try:
        result = prepare(args.cache_dir, verbose=not args.quiet, remeasure=args.remeasure)
    except PrepareError as exc:
        print(f"example_suite.prepare: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

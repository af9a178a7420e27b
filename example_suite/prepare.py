"""Prepare the real models and data of the pytest-ptq example suite.

Run ``python -m example_suite.prepare`` (or ``python example_suite/prepare.py``)
once on a machine with access to PyPI; everything lands in a git-ignored
cache folder, ``example_suite/.cache/`` unless the environment variable
``PTQ_EXAMPLE_CACHE`` names another one.  A second run finds every file in
place and does nothing but print the figures measured the first time.

What it builds, per model (``<cache>/<model>/``)::

    float_model.onnx               float model, static input shape, opset 21, pre-processed
    calibrated_model.onnx          quantize_static, QDQ, per-tensor, int8 weights / uint8 activations,
                                   MinMax, with quantize.BYPASSABLE_EXTRA_OPTIONS (AddQDQPairToWeight,
                                   QDQKeepRemovableActivations, QuantizeBias=False): removing every
                                   Q/DQ pair gives back float_model.onnx
    calibrated_model_default.onnx  the same with onnxruntime's default extra options (int8 weights and
                                   int32 biases behind lone DequantizeLinear, Relu/Clip folded away)
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
import contextlib
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

# Detector samples: (image, kind, how many, scale range); see _det_view for the kinds.  For
# "text" the scale multiplies the image size: rapidocr itself scales page.png by 3.85 and
# text.png by 4.28 (limit_side_len 736, limit_type min); page.png's printed lines are
# ~15 px high at 1x.  (On 320x320 crops of text.png the detector finds little of the
# handwriting: those samples are mostly text-like background.)  For "photo" the shorter
# side is scaled to that many pixels.  Photos are also flipped left-right at random;
# text is not.
DET_CALIBRATION = [
    ("page.png", "text", 12, (1.5, 4.0)),
    ("text.png", "text", 12, (2.0, 4.5)),
    ("astronaut.png", "photo", 4, (320, 640)),
    ("coffee.png", "photo", 4, (320, 640)),
    ("chelsea.png", "photo", 4, (320, 640)),
    ("rocket.jpg", "photo", 4, (320, 640)),
    ("motorcycle_left.png", "photo", 4, (320, 640)),
    ("camera.png", "photo", 4, (320, 640)),
]
DET_HELDOUT = [
    ("page.png", "letterbox", 1, None),
    ("page.png", "text", 7, (1.5, 4.0)),
    ("text.png", "text", 6, (2.0, 4.5)),
    ("motorcycle_right.png", "photo", 4, (320, 640)),
    ("coins.png", "photo", 3, (320, 640)),
    ("clock_motion.png", "photo", 3, (320, 640)),
]

# Classifier samples: (images, kind, how many).  "boxes" are the text boxes that the original
# (dynamic-shape) detector finds with rapidocr's own settings: the first pass over them as
# detected, later passes with random margins and, for long lines, a random stretch of the
# line.  Every other sample is turned by 180 degrees.  Where an image serves both sets its
# boxes are split, every third box (in reading order) going to the held-out set.  "strips"
# are random text-line shaped crops of photos.  Only page.png (printed text) gets a 0/180
# label for the accuracy figure: on handwriting and on photo boxes the classifier's answer
# has no ground truth.
CLS_CALIBRATION = [
    (["page.png"], "boxes", 48),
    (["text.png"], "boxes", 24),
    (["chelsea.png", "coffee.png", "motorcycle_left.png"], "boxes", 8),
    (["astronaut.png", "rocket.jpg", "camera.png"], "strips", 16),
]
CLS_HELDOUT = [
    (["page.png"], "boxes", 20),
    (["text.png"], "boxes", 8),
    (["coins.png", "motorcycle_right.png"], "boxes", 6),
    (["motorcycle_right.png", "clock_motion.png"], "strips", 6),
]
CLS_LABELLED_IMAGES = ("page.png",)

TIMING_RUNS = 15  # runs per median for the timings


class PrepareError(RuntimeError):
    """Raised with one sentence that says what to do (missing download, bad cache...)."""


def default_cache_dir() -> Path:
    """``$PTQ_EXAMPLE_CACHE`` if set, else ``example_suite/.cache``."""
    env = os.environ.get("PTQ_EXAMPLE_CACHE")
    return Path(env).expanduser() if env else Path(__file__).resolve().parent / ".cache"


@contextlib.contextmanager
def _cache_lock(cache_dir: Path):
    """Serialise concurrent prepare() calls on one cache (pytest-xdist workers); POSIX only."""
    try:
        import fcntl
        fh = open(cache_dir / ".prepare.lock", "a")
    except (ImportError, OSError):  # Windows, or a read-only cache: go without the lock
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_info(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _log(verbose, *args) -> None:
    """Progress: ``verbose`` True prints it, a callable (the example suite's conftest) takes it."""
    if callable(verbose):
        verbose(" ".join(str(a) for a in args))
    elif verbose:
        print("[prepare]", *args, flush=True)


# --------------------------------------------------------------------------------------
# Step 1: the wheels.
# --------------------------------------------------------------------------------------

def pip_download(wheel_dir: Path, requirement: str, extra_args=(), log_path: Path | None = None) -> bool:
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


def fetch_wheels(cache_dir: Path, verbose: bool) -> dict[str, Path]:
    """The wheels the suite reads its models and pictures from, downloaded into
    ``cache_dir/wheels`` once: ``{"rapidocr": path, "skimage": path}``."""
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
        _log(verbose, f"downloading {RAPIDOCR_REQUIREMENT} from PyPI (the OCR models, about 15 MB) ...")
        t = time.perf_counter()
        if not pip_download(wheel_dir, RAPIDOCR_REQUIREMENT, log_path=log_path) or not rapidocr.is_file():
            raise PrepareError(f"could not download {RAPIDOCR_REQUIREMENT} with pip; {offline_hint}.")
        _log(verbose, f"downloaded {RAPIDOCR_WHEEL} ({time.perf_counter() - t:.1f} s)")

    def find_skimage():
        found = sorted(glob.glob(str(wheel_dir / SKIMAGE_WHEEL_GLOB)))
        return Path(found[0]) if found else None

    skimage = find_skimage()
    if skimage is None:
        _log(verbose, f"downloading {SKIMAGE_REQUIREMENT} from PyPI (about 14 MB; only its skimage/data images "
                      "are used) ...")
        t = time.perf_counter()
        if not pip_download(wheel_dir, SKIMAGE_REQUIREMENT, SKIMAGE_PINNED_PLATFORM, log_path):
            pip_download(wheel_dir, SKIMAGE_REQUIREMENT, log_path=log_path)
        skimage = find_skimage()
        if skimage is None:
            raise PrepareError(f"could not download {SKIMAGE_REQUIREMENT} with pip; {offline_hint}.")
        _log(verbose, f"downloaded {skimage.name} ({time.perf_counter() - t:.1f} s)")
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
    # Per axis: the crop offset if the scaled image is larger than s, else the paste offset.
    y = int(rng.integers(0, abs(ih - s) + 1))
    x = int(rng.integers(0, abs(iw - s) + 1))
    if ih >= s:
        img = img[y:y + s]
    if iw >= s:
        img = img[:, x:x + s]
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


def _cross(o, a, b) -> float:
    """z of the cross product (a - o) x (b - o)."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _convex_hull(points: np.ndarray) -> np.ndarray:
    """Convex hull (Andrew's monotone chain) of Nx2 points, counter-clockwise."""
    pts = np.unique(points, axis=0)
    if len(pts) < 3:
        return pts.astype(np.float64)

    def half(seq):
        out = []
        for p in seq:
            while len(out) >= 2 and _cross(out[-2], out[-1], p) <= 0:
                out.pop()
            out.append(p)
        return out

    pts = pts.astype(np.float64)
    lower, upper = half(pts), half(pts[::-1])
    return np.array(lower[:-1] + upper[:-1])


def _order_box(box: np.ndarray) -> np.ndarray:
    """rapidocr TextDetector.order_points_clockwise: (top-left, top-right, bottom-right, bottom-left)."""
    xs = box[np.argsort(box[:, 0], kind="stable")]
    left, right = xs[:2], xs[2:]
    tl, bl = left[np.argsort(left[:, 1], kind="stable")]
    tr, br = right[np.argsort(right[:, 1], kind="stable")]
    return np.array([tl, tr, br, bl], dtype=np.float64)


def _min_area_rect(points: np.ndarray):
    """cv2.minAreaRect + cv2.boxPoints by rotating calipers: (4x2 corners, width, height).

    width runs along the first edge (top-left -> top-right after _order_box).
    """
    hull = _convex_hull(points)
    if len(hull) < 3:
        hull = np.vstack([hull, hull + 1e-3])
    best = None
    for i in range(len(hull)):
        edge = hull[(i + 1) % len(hull)] - hull[i]
        norm = np.hypot(*edge)
        if norm == 0:
            continue
        u = edge / norm
        v = np.array([-u[1], u[0]])
        pu, pv = hull @ u, hull @ v
        area = (pu.max() - pu.min()) * (pv.max() - pv.min())
        if best is None or area < best[0]:
            best = (area, u, v, pu.min(), pu.max(), pv.min(), pv.max())
    _, u, v, u0, u1, v0, v1 = best
    corners = np.array([u0 * u + v0 * v, u1 * u + v0 * v, u1 * u + v1 * v, u0 * u + v1 * v])
    box = _order_box(corners)
    return box, float(np.linalg.norm(box[1] - box[0])), float(np.linalg.norm(box[3] - box[0]))


def _expand_box(box: np.ndarray, left: float, top: float, right: float, bottom: float) -> np.ndarray:
    """Move the sides of an ordered box (tl, tr, br, bl) outwards by the given amounts (inwards if < 0)."""
    tl, tr, br, bl = box
    u = (tr - tl) / max(np.linalg.norm(tr - tl), 1e-9)
    v = (bl - tl) / max(np.linalg.norm(bl - tl), 1e-9)
    return np.array([tl - left * u - top * v, tr + right * u - top * v,
                     br + right * u + bottom * v, bl - left * u + bottom * v])


def _detect_text_boxes(session, bgr: np.ndarray, det_cfg: dict) -> list[list[list[float]]]:
    """Text boxes (4 corners, tl/tr/br/bl, image pixels) from the original detector, run as rapidocr runs it.

    Pre-processing: DetPreProcess with limit_side_len/limit_type/mean/std from config.yaml.
    Post-processing, DBPostProcess re-done with numpy: threshold (thresh), 2x2 dilation
    (use_dilation), connected components (cv2.findContours there), minimum-area rectangle
    (get_mini_boxes), score = mean probability over the component (box_score_fast uses the
    rectangle) >= box_thresh, rectangle grown by area * unclip_ratio / perimeter on every
    side (the pyclipper offset there), sides >= 5, scaled back to the image, clipped.
    """
    resized = _det_rapidocr_resize(bgr, det_cfg["limit_side_len"], det_cfg["limit_type"])
    feed = {session.get_inputs()[0].name: _det_normalize(resized, det_cfg["mean"], det_cfg["std"])}
    pred = session.run(None, feed)[0][0, 0]
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
        y, a, b = comp[:, 0], comp[:, 1], comp[:, 2]
        corners = np.concatenate([np.stack([a, y], 1), np.stack([b, y], 1),
                                  np.stack([a, y + 1], 1), np.stack([b, y + 1], 1)])
        box, w, h = _min_area_rect(corners)
        if min(w, h) < 3:
            continue
        score = float(np.mean(np.concatenate([pred[r, x0:x1] for r, x0, x1 in comp])))
        if score < det_cfg["box_thresh"]:
            continue
        d = w * h * det_cfg["unclip_ratio"] / (2 * (w + h))
        box = _expand_box(box, d, d, d, d)
        if min(w, h) + 2 * d < 5:
            continue
        box = box * np.array([iw / mw, ih / mh])
        box = np.round(box)
        box[:, 0] = np.clip(box[:, 0], 0, iw - 1)
        box[:, 1] = np.clip(box[:, 1], 0, ih - 1)
        box = _order_box(box)
        if np.linalg.norm(box[0] - box[1]) <= 3 or np.linalg.norm(box[0] - box[3]) <= 3:
            continue
        boxes.append(box)
    # reading order, roughly as RapidOCR.sorted_boxes (top to bottom, then left to right)
    boxes.sort(key=lambda bx: (int(bx[0][1]) // 10, bx[0][0]))
    return [bx.tolist() for bx in boxes]


def _rapidocr_crop(bgr: np.ndarray, box) -> np.ndarray:
    """RapidOCR.get_crop_img_list / get_rotate_crop_image: warp the box to an upright rectangle.

    Size int(max side lengths); rapidocr uses cv2.warpPerspective (INTER_CUBIC,
    BORDER_REPLICATE), here Pillow's QUAD transform with bicubic resampling (identical
    geometry for the parallelograms used here).  Turned 90 degrees if h/w >= 1.5.
    """
    from PIL import Image

    tl, tr, br, bl = np.asarray(box, np.float64)
    w = int(max(np.linalg.norm(tl - tr), np.linalg.norm(br - bl)))
    h = int(max(np.linalg.norm(tl - bl), np.linalg.norm(tr - br)))
    w, h = max(w, 1), max(h, 1)
    quad = (*tl, *bl, *br, *tr)
    crop = np.asarray(Image.fromarray(np.ascontiguousarray(bgr)).transform(
        (w, h), Image.QUAD, quad, resample=Image.BICUBIC))
    if h / w >= 1.5:
        crop = np.rot90(crop)
    return crop


def _jitter_box(bgr: np.ndarray, box, rng: np.random.Generator, sub: bool):
    """A box with random margins (+-15% of its height per side), optionally a random stretch of the line.

    A stretch is 2 to 8 box heights long: rapidocr squeezes any crop wider than 4:1 into
    192x48, so whole lines of page.png (about 16:1) arrive squashed four times over.
    """
    box = np.asarray(box, np.float64)
    w, h = np.linalg.norm(box[1] - box[0]), np.linalg.norm(box[3] - box[0])
    if sub and w > 3 * h:
        length = rng.uniform(2 * h, min(w, 8 * h))
        start = rng.uniform(0, w - length)
        box = _expand_box(box, -start, 0, -(w - start - length), 0)
    box = _expand_box(box, *(rng.uniform(-0.15, 0.15, 4) * h))
    ih, iw = bgr.shape[:2]
    box[:, 0] = np.clip(box[:, 0], 0, iw - 1)
    box[:, 1] = np.clip(box[:, 1], 0, ih - 1)
    return np.round(box, 1).tolist()


def _strip(bgr: np.ndarray, rng: np.random.Generator):
    """A random text-line shaped, axis-aligned strip of a photo (height 24-96 px, aspect ratio 2-8)."""
    ih, iw = bgr.shape[:2]
    h = int(rng.integers(24, min(96, ih) + 1))
    w = min(iw, int(h * rng.uniform(2, 8)))
    y, x = int(rng.integers(0, ih - h + 1)), int(rng.integers(0, iw - w + 1))
    return [[x, y], [x + w, y], [x + w, y + h], [x, y + h]]


def _cls_samples(wheels, plan, boxes_of, shape, rng):
    """Preprocessed classifier samples for one plan (CLS_CALIBRATION or CLS_HELDOUT)."""
    samples, provenance = [], []
    for images, kind, count in plan:
        pool = [(name, box) for name in images for box in boxes_of(name)] if kind == "boxes" else []
        if kind == "boxes" and not pool:
            raise RuntimeError(f"the detector found no text box in {images}")
        for i in range(count):
            if kind == "boxes":
                name, box = pool[i % len(pool)]
                bgr = wheels.image_bgr(name)
                # first pass: the boxes as detected; then random margins / stretches
                if i >= len(pool):
                    box = _jitter_box(bgr, box, rng, sub=bool(rng.integers(0, 2)))
            else:
                name = images[i % len(images)]
                bgr = wheels.image_bgr(name)
                box = _strip(bgr, rng)
            crop = _rapidocr_crop(bgr, box)
            rotated = i % 2 == 1
            if rotated:
                crop = crop[::-1, ::-1]  # 180 degrees
            samples.append(_cls_resize_norm(crop, shape))
            label = int(rotated) if name in CLS_LABELLED_IMAGES else -1
            provenance.append({"image": name, "kind": kind, "box": box, "rotated_180": rotated, "label": label})
    return samples, provenance


# --------------------------------------------------------------------------------------
# Step 4: the static-shape float model.
# --------------------------------------------------------------------------------------

def _make_float_model(raw: bytes, input_shape, out_path: Path) -> None:
    """Static input shape -> quant_pre_process -> opset 21 -> named nodes -> out_path.

    * The input dims are fixed in a copy of the model and all other shapes are re-inferred
      (onnx.shape_inference), so calibration and analysis see one static graph.
    * onnxruntime.quantization.quant_pre_process, the pre-processing onnxruntime recommends
      before quantize_static: ORT_ENABLE_BASIC optimizations (constant folding,
      Conv+BatchNormalization fusion, MatMul+Add -> Gemm) and ONNX shape inference.
      Symbolic shape inference is skipped (it needs sympy; the shapes are static anyway).
    * onnx.version_converter takes the result from opset 12 (detector) / 11 (classifier) to
      opset 21, where QuantizeLinear/DequantizeLinear accept 16-bit types.  Otherwise
      quantize_static runs that converter itself whenever a TensorQuantOverrides entry asks
      for 16 bits, and 8-bit and 16-bit models would come from different graphs.  (Done
      after pre-processing it adds no node; done before, it wraps the classifier's Softmax
      in a Flatten/Reshape pair.)
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

    with tempfile.TemporaryDirectory(prefix="ptq-prepare-") as tmp:
        static_path, pre_path = Path(tmp) / "static.onnx", Path(tmp) / "pre.onnx"
        onnx.save(model, static_path)
        quant_pre_process(str(static_path), str(pre_path), skip_symbolic_shape=True)
        model = onnx.load(pre_path)

    n_nodes = len(model.graph.node)
    model = onnx.version_converter.convert_version(model, TARGET_OPSET)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    if len(model.graph.node) != n_nodes:
        raise RuntimeError(f"the opset {TARGET_OPSET} conversion changed the number of nodes")

    seen = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    used_domains = {n.domain for n in model.graph.node}
    for opset in list(model.opset_import):
        if opset.domain not in ("", "ai.onnx") and opset.domain not in used_domains:
            model.opset_import.remove(opset)
    for out in model.graph.output:  # every output must have a static shape now
        if not all(d.HasField("dim_value") for d in out.type.tensor_type.shape.dim):
            raise RuntimeError(f"output {out.name} has no static shape")
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


def _timing_ms(session, feed, runs=TIMING_RUNS) -> dict:
    """Median and minimum wall time of one pass, in ms, after one warm-up pass."""
    session.run(None, feed)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t)
    return {"median": round(float(np.median(times)) * 1000, 2), "min": round(float(np.min(times)) * 1000, 2)}


def _outputs(session, feeds) -> np.ndarray:
    return np.stack([session.run(None, f)[0] for f in feeds])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-sample cosine similarity of the flattened outputs, with a small epsilon.

    (a.b + eps) / sqrt((a.a + eps)(b.b + eps)), eps = 1e-6 * size: the cosine of the two
    outputs with one constant element appended.  The detector's probability map is exactly
    0.0 (a saturated sigmoid) wherever there is no text, so for a photo without text the
    plain cosine of the two maps is 0/0; with eps two all-zero maps count as equal (1.0)
    and an all-zero map against a map with text as different (about 0).  NaN where an
    output is not finite.
    """
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    eps = 1e-6 * a.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):
        return (np.sum(a * b, axis=1) + eps) / np.sqrt((np.sum(a * a, axis=1) + eps) * (np.sum(b * b, axis=1) + eps))


def count_qdq_pairs(model) -> dict:
    """Count QuantizeLinear -> DequantizeLinear edges, and lone DequantizeLinear nodes.

    weights: the Q reads an initializer that is the weight input (index 1) of a Conv,
    ConvTranspose, Gemm or MatMul; constants: the Q reads another initializer (the 3 and 6
    of hard-swish, for instance); activations: the Q reads a computed tensor or a graph input.
    """
    g = model.graph
    inits = {i.name for i in g.initializer}
    q_by_out = {n.output[0]: n for n in g.node if n.op_type == "QuantizeLinear"}
    weight_inputs = {n.input[1] for n in g.node
                     if n.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul") and len(n.input) > 1}
    counts = {"total": 0, "weights": 0, "constants": 0, "activations": 0, "dequantize_only": 0}
    for n in g.node:
        if n.op_type != "DequantizeLinear":
            continue
        q = q_by_out.get(n.input[0])
        if q is None:
            counts["dequantize_only"] += 1
            continue
        counts["total"] += 1
        if q.input[0] not in inits:
            counts["activations"] += 1
        elif n.output[0] in weight_inputs:
            counts["weights"] += 1
        else:
            counts["constants"] += 1
    return counts


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


def _measure(paths: dict, heldout_labels, mask_threshold) -> dict:
    """The figures of step 6, on the held-out set.

    For each calibrated model, run with ORT_DISABLE_ALL (every Q/DQ executed as written) and
    with the default ORT_ENABLE_ALL (onnxruntime fuses Q/DQ groups into integer kernels
    where it can), and once more (ORT_DISABLE_ALL) with every Q/DQ pair taken out.
    """
    import onnx

    float_model = onnx.load(paths["float_model"])
    calibrated = onnx.load(paths["calibrated_model"])
    default = onnx.load(paths["calibrated_model_default"])
    feeds = load_samples(paths["heldout_data"])

    sess_float = _session(float_model)
    ref = _outputs(sess_float, feeds)
    fig: dict = {
        "float_ms": _timing_ms(sess_float, feeds[0]),
        "qdq_pairs": count_qdq_pairs(calibrated),
        "qdq_pairs_default": count_qdq_pairs(default),
        "heldout_samples": len(feeds),
    }
    labels = np.asarray(heldout_labels) if heldout_labels is not None else None
    if labels is not None:
        known = labels >= 0
        fig["labelled_heldout_samples"] = int(known.sum())
        fig["float_accuracy"] = round(float(np.mean(ref.reshape(len(ref), -1).argmax(1)[known] == labels[known])), 4)

    def stats(model, disable_all):
        sess = _session(model, disable_all)
        out = _outputs(sess, feeds)
        cos = _cosines(ref, out)
        finite = bool(np.isfinite(out).all())
        res = {
            "cosine_mean": round(float(np.mean(cos)), 6) if finite else None,
            "cosine_min": round(float(np.min(cos)), 6) if finite else None,
            "max_abs_diff": float(np.max(np.abs(out - ref))) if finite else None,
            "mean_abs_diff": float(np.mean(np.abs(out - ref))) if finite else None,
            "nonfinite_values": int(out.size - np.isfinite(out).sum()),
            "output_values": int(out.size),
            "ms": _timing_ms(sess, feeds[0]),
        }
        if mask_threshold is not None:  # detector: IoU of the text masks, pooled over the set
            mf, mq = ref > mask_threshold, out > mask_threshold
            res["mask_iou"] = round(float((mf & mq).sum() / max(1, (mf | mq).sum())), 4)
        if labels is not None:  # classifier: top-1 agreement with float, accuracy on labelled crops
            pred = out.reshape(len(out), -1).argmax(1)
            res["top1_agreement"] = round(float(np.mean(pred == ref.reshape(len(ref), -1).argmax(1))), 4) if finite else None
            res["accuracy"] = round(float(np.mean(pred[known] == labels[known])), 4) if finite else None
        return res

    for tag, model in (("calibrated_model", calibrated), ("calibrated_model_default", default)):
        fig[tag] = {"ORT_DISABLE_ALL": stats(model, True), "ORT_ENABLE_ALL": stats(model, False)}
        fig[tag + "_pairs_removed"] = stats(remove_qdq_pairs(model), True)
    return fig


def _fmt(value, spec=".4f") -> str:
    return "n/a" if value is None else format(value, spec)


def _describe(name: str, info: dict) -> str:
    f = info["figures"]
    lines = [
        f"{name}: input {info['input_name']} {info['input_shape']}, {info['calibration_samples']} "
        f"calibration / {info['heldout_samples']} held-out samples; float pass {f['float_ms']['median']} ms "
        f"(median of {TIMING_RUNS}, min {f['float_ms']['min']} ms; {f.get('measured_on', '')}, "
        f"load average {f.get('load_average_1min', '?')})",
    ]
    for tag in ("calibrated_model", "calibrated_model_default"):
        pairs = f["qdq_pairs" if tag == "calibrated_model" else "qdq_pairs_default"]
        lines.append(f"  {tag}.onnx: {pairs['total']} Q/DQ pairs ({pairs['activations']} on activations, "
                     f"{pairs['weights']} on weights, {pairs['constants']} on other constants), "
                     f"{pairs['dequantize_only']} lone DequantizeLinear")
        for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL"):
            r = f[tag][level]
            extra = "".join(f", {k} {_fmt(r[k])}" for k in ("mask_iou", "top1_agreement", "accuracy") if k in r)
            lines.append(f"    {level:15s} cosine mean {_fmt(r['cosine_mean'])} min {_fmt(r['cosine_min'])}, "
                         f"max|diff| {_fmt(r['max_abs_diff'], '.3g')}{extra}, {r['ms']['median']} ms")
        r = f[tag + "_pairs_removed"]
        if r["nonfinite_values"]:
            lines.append(f"    all pairs removed: {r['nonfinite_values']} of {r['output_values']} output values "
                         "are not finite")
        else:
            lines.append(f"    all pairs removed: max|diff| vs float {_fmt(r['max_abs_diff'], '.3g')}, "
                         f"cosine mean {_fmt(r['cosine_mean'])}")
    if "float_accuracy" in f:
        lines.append(f"  float model accuracy on the {f['labelled_heldout_samples']} labelled held-out crops: "
                     f"{f['float_accuracy']:.4f}")
    return "\n".join(lines)


def figures_markdown(result: dict) -> str:
    """The measured figures of a prepare() result as the Markdown table of MODELS.md."""
    models = result["models"]
    names = list(models)

    def row(label, fn):
        cells = []
        for name in names:
            try:
                cells.append(fn(models[name]["figures"]))
            except (KeyError, TypeError):
                cells.append("-")
        return f"| {label} | " + " | ".join(cells) + " |"

    def pairs(p):
        return (f"{p['total']} ({p['activations']} activations, {p['weights']} weights, "
                f"{p['constants']} other constants); {p['dequantize_only']} lone DQ")

    def quality(r):
        parts = [f"cosine {_fmt(r['cosine_mean'])} (min {_fmt(r['cosine_min'])})"]
        parts += [f"{k.replace('_', ' ')} {_fmt(r[k])}" for k in ("mask_iou", "top1_agreement", "accuracy") if k in r]
        return ", ".join(parts) + f"; {r['ms']['median']} ms"

    def removed(r):
        if r["nonfinite_values"]:
            return f"{r['nonfinite_values']} of {r['output_values']} output values NaN/inf"
        return f"max abs diff {_fmt(r['max_abs_diff'], '.2g')}, cosine {_fmt(r['cosine_mean'])}"

    lines = [
        "| | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
        "| input | " + " | ".join("x".join(map(str, models[n]["input_shape"])) for n in names) + " |",
        "| calibration / held-out samples | " + " | ".join(
            f"{models[n]['calibration_samples']} / {models[n]['heldout_samples']}" for n in names) + " |",
    ]
    lines += [
        row("float pass, median (min) of 15", lambda f: f"{f['float_ms']['median']} ms ({f['float_ms']['min']} ms)"),
        row("Q/DQ pairs, `calibrated_model.onnx`", lambda f: pairs(f["qdq_pairs"])),
        row("Q/DQ pairs, `calibrated_model_default.onnx`", lambda f: pairs(f["qdq_pairs_default"])),
        row("`calibrated_model` vs float, ORT_DISABLE_ALL", lambda f: quality(f["calibrated_model"]["ORT_DISABLE_ALL"])),
        row("`calibrated_model` vs float, ORT_ENABLE_ALL", lambda f: quality(f["calibrated_model"]["ORT_ENABLE_ALL"])),
        row("`calibrated_model_default` vs float, ORT_DISABLE_ALL",
            lambda f: quality(f["calibrated_model_default"]["ORT_DISABLE_ALL"])),
        row("`calibrated_model_default` vs float, ORT_ENABLE_ALL",
            lambda f: quality(f["calibrated_model_default"]["ORT_ENABLE_ALL"])),
        row("`calibrated_model`, all Q/DQ pairs removed", lambda f: removed(f["calibrated_model_pairs_removed"])),
        row("`calibrated_model_default`, all Q/DQ pairs removed",
            lambda f: removed(f["calibrated_model_default_pairs_removed"])),
        row("float accuracy on labelled held-out crops", lambda f: f"{f['float_accuracy']:.2f} "
            f"({f['labelled_heldout_samples']} page.png crops)"),
        row("load average while measuring", lambda f: str(f["load_average_1min"])),
    ]
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
        "cls": [CLS_CALIBRATION, CLS_HELDOUT, CLS_LABELLED_IMAGES] if model_name == CLS else None,
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
        verbose: True prints progress and the measured figures; a callable receives each
            progress line instead (and the figures are not printed).
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
    with _cache_lock(cache_dir):
        result = _prepare_locked(cache_dir, verbose, remeasure)
    if verbose is True:
        for name, info in result["models"].items():
            print(_describe(name, info), flush=True)
        _log(True, f"cache: {cache_dir} ({time.perf_counter() - t_start:.1f} s)")
    return result


def _prepare_locked(cache_dir: Path, verbose: bool, remeasure: bool) -> dict:
    result = {"cache_dir": cache_dir, "models": {}}
    # A model whose prepare.json matches the current settings and whose files are all there
    # is taken as is, without opening a wheel (prepare.json records the preprocessing read
    # from config.yaml, which the fingerprint includes).
    wheel_paths = None
    wheels = None
    try:
        for name in (DET, CLS):
            info = _read_info(cache_dir / name / "prepare.json")
            if info is not None and info.get("fingerprint") == _fingerprint(
                    name, info.get("input_shape", []), info.get("preprocessing", {})):
                paths = _model_paths(cache_dir / name, info["input_name"])
                complete = all(paths[k].is_file() for k in ("float_model", "calibrated_model",
                                                            "calibrated_model_default"))
                complete = complete and _data_complete(paths["calibration_inputs"], info["calibration_samples"])
                complete = complete and _data_complete(paths["heldout_inputs"], info["heldout_samples"])
                if complete and "figures" in info and not remeasure:
                    result["models"][name] = {**paths, **_public(info)}
                    continue
            if wheels is None:
                wheel_paths = fetch_wheels(cache_dir, verbose)
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
    _log(verbose, f"{name}: preparing the model and its samples into {model_dir} ...")
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
        info["figures"] = _measure(paths, labels, pre["thresh"] if name == DET else None)
        info["figures"]["measured_on"] = f"{os.cpu_count()} CPU cores, onnxruntime CPUExecutionProvider"
        if hasattr(os, "getloadavg"):  # timings are only comparable on an idle machine
            info["figures"]["load_average_1min"] = round(os.getloadavg()[0], 2)
        _log(verbose, f"{name}: measured float vs quantized outputs and timings into prepare.json "
                      f"({time.perf_counter() - t:.1f} s)")
    tmp = paths["info"].with_name("prepare.json.tmp")
    tmp.write_text(json.dumps(info, indent=1, default=str))
    os.replace(tmp, paths["info"])
    return {**paths, **_public(info)}


def _build_cls_data(wheels, config, pre, rng):
    """Classifier data: text boxes from the original detector, then crops, 180-degree turns, strips."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    det = ort.InferenceSession(wheels.model_bytes(DET), so, providers=["CPUExecutionProvider"])
    calib_images = {n for images, kind, _ in CLS_CALIBRATION if kind == "boxes" for n in images}
    held_images = {n for images, kind, _ in CLS_HELDOUT if kind == "boxes" for n in images}
    boxes = {n: _detect_text_boxes(det, wheels.image_bgr(n), config["Det"])
             for n in sorted(calib_images | held_images)}

    def split(held):
        def boxes_of(name):
            if name not in calib_images or name not in held_images:
                return boxes[name]
            return [b for i, b in enumerate(boxes[name]) if (i % 3 == 2) == held]
        return boxes_of

    shape = pre["cls_image_shape"]
    calib, calib_prov = _cls_samples(wheels, CLS_CALIBRATION, split(False), shape, rng)
    held, held_prov = _cls_samples(wheels, CLS_HELDOUT, split(True), shape, rng)
    return calib, calib_prov, held, held_prov


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", default=None,
                        help="cache folder (default: $PTQ_EXAMPLE_CACHE or example_suite/.cache)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--remeasure", action="store_true", help="measure the figures again")
    parser.add_argument("--json", action="store_true", help="print the returned dict as JSON")
    parser.add_argument("--markdown", action="store_true",
                        help="print the figures as the Markdown table of MODELS.md")
    args = parser.parse_args(argv)
    try:
        result = prepare(args.cache_dir, verbose=not args.quiet, remeasure=args.remeasure)
    except PrepareError as exc:
        print(f"example_suite.prepare: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    if args.markdown:
        print(figures_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

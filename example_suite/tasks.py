"""Task-level checks of the example models, as the contracts' ``accuracy`` functions.

A whole-tensor cosine says little about what the user sees: for the detector it is the
binarised text map (which pixels are text), for the classifier the predicted class. Both
are measured as agreement with the float model on the same samples, so the float model
scores 1.0 and the quantized one its share of agreement.

Signature (pytest-ptq's ``accuracy`` contract): ``evaluate(run, data) -> float`` where
``run(feeds) -> {output: array}`` and iterating ``data`` yields feed dicts.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

CACHE = Path(__file__).resolve().parent / ".cache"
# rapidocr's DBNet post-processing threshold on the probability map (config.yaml: thresh)
MASK_THRESHOLD = 0.3


@lru_cache(maxsize=4)
def _float_session(model):
    import onnxruntime as ort

    return ort.InferenceSession(str(CACHE / model / "float_model.onnx"), providers=["CPUExecutionProvider"])


def _float_outputs(model, feeds):
    sess = _float_session(model)
    return sess.run(None, feeds)[0]


def text_mask_iou(run, data):
    """Pooled IoU of the text mask (prob > 0.3) with the float detector's mask, over samples."""
    inter = union = 0
    for feeds in data:
        ref = _float_outputs("ppocrv4_det", feeds) > MASK_THRESHOLD
        got = next(iter(run(feeds).values())) > MASK_THRESHOLD
        inter += int(np.logical_and(ref, got).sum())
        union += int(np.logical_or(ref, got).sum())
    return 1.0 if union == 0 else inter / union


def class_agreement(run, data):
    """Share of samples whose predicted direction (0 or 180 degrees) matches the float model's."""
    same = total = 0
    for feeds in data:
        ref = _float_outputs("ppocr_mobile_v2_cls", feeds).argmax(axis=-1)
        got = next(iter(run(feeds).values())).argmax(axis=-1)
        same += int((ref == got).sum())
        total += ref.size
    return same / total

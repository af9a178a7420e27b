"""Calibration data checks: rule out the data before blaming the quantization (seed 003).

The checks read the raw ``.npy`` arrays themselves, so a folder that does not fit the
model (NHWC data for an NCHW model, raw uint8 pixels) is diagnosed instead of rejected:

* count against the 20-100 samples the seed recommends; NaN/Inf; constant samples (a plain
  colour image); duplicate samples;
* dtype and layout against the model input (``[1, H, W, 3]`` data for a ``[1, 3, H, W]``
  input is NHWC);
* value range against the range the input's Q/DQ pair was calibrated for, and the data's
  own statistics (whole numbers in 0-255 are unnormalised pixels);
* per-channel mean/std against expected preprocessing statistics or a held-out set:
  reversed channel means are BGR data for an RGB model, shifted or scaled ones a
  mean/scale mismatch;
* with a held-out set, the fully quantized model's output metric on both sets: a model
  that holds on the calibration data and fails on held-out data was calibrated on data
  that do not represent what it will see.

Each finding has a severity (``error``, ``warning``, ``info``) and a fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from .channelwise import image_channel_axis
from .data import NP_OF_ONNX, extended_float, load_data, type_info
from . import params
from .errors import NonFinite, NotFloatEquivalent, NotQuantized, PTQError
from .metrics import Pooled, get_metric
from .engine import Engine
from .model import QuantModel, load_model
from .model.graph import declared_dims
from .outputs import blind_warnings, parse_outputs
from .progress import Progress
from .results import JsonResult
from .verdict import badness

SEVERITIES = params.SEVERITIES
FEW_SAMPLES, MANY_SAMPLES = params.FEW_SAMPLES, params.MANY_SAMPLES
# Share of values outside the calibrated input range above which the data cannot be the
# data the model was calibrated for.
CLIPPED_ERROR = 0.01
# Data spanning less than this share of the calibrated input range are scaled down.
NARROW_SHARE = 1 / 8
# Channel means this many standard deviations apart differ; this close, they agree. Two real
# image sets made by one preprocessing differ by up to about 0.7 with their content (greyscale
# pictures beside colour ones), so against held-out data only a larger gap is a warning.
MEAN_DIFFERS, MEAN_AGREES = 0.5, 0.25
HELDOUT_MEAN_DIFFERS = 1.0
STD_RATIO = 1.5
_SHOWN = 5
# Errors after which the quantized model cannot run on the data or its result means nothing.
_BLOCKING = {"inputs", "unreadable", "nan", "shape", "layout", "dtype", "preprocessing-differs"}


@dataclasses.dataclass
class Finding:
    """One problem: ``check`` is a short code (``count``, ``nan``, ``constant``, ``duplicate``,
    ``dtype``, ``layout``, ``shape``, ``inputs``, ``unreadable``, ``range``, ``range-narrow``,
    ``raw-pixels``, ``colour-order``, ``channel-stats``, ``channel-scale``,
    ``preprocessing-differs``, ``not-representative``, ``empty``, ``heldout-gap``, ``heldout-worse``,
    ``heldout-clipping``, ``no-qdq``, ``heldout-skipped``, ``metric-blind``)."""

    check: str
    severity: str
    message: str
    fix: str = ""
    input: str | None = None
    dataset: str = "calibration"
    samples: list = dataclasses.field(default_factory=list)
    details: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class DataReport(JsonResult):
    """Findings, worst first, and the statistics they rest on; truthy when no error.

    ``stats[dataset][input]``: samples, shape, dtype, layout, min/max/mean/std, channel
    means/stds, the calibrated input range and the share of values outside it.
    ``quantized``: ``{dataset: {metric: value}}`` of the fully quantized model against the
    float model (with a held-out set).
    """

    findings: list
    stats: dict
    quantized: dict | None
    model: str
    data: str
    heldout: str | None = None

    def __bool__(self):
        return not self.errors

    @property
    def errors(self):
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self):
        return [f for f in self.findings if f.severity == "warning"]

    def checks(self, severity=None):
        """The check codes found (optionally of one severity), in report order."""
        return [f.check for f in self.findings if severity is None or f.severity == severity]

    def text(self):
        lines = []
        for f in self.findings:
            where = f" [{f.dataset}:{f.input}]" if f.input else f" [{f.dataset}]"
            lines.append(f"{f.severity.upper():7} {f.check}{where}: {f.message}")
            if f.fix:
                lines.append(f"        fix: {f.fix}")
            if f.samples and not all(str(w) in f.message for w in f.samples):  # which files, where not said
                lines.append(f"        samples: {', '.join(map(str, f.samples))}")
        if not self.findings:
            lines.append("no problem found")
        errors, warnings = len(self.errors), len(self.warnings)
        lines.append(f"{errors} error(s), {warnings} warning(s), {len(self.findings) - errors - warnings} note(s)")
        return "\n".join(lines)




# -- the model side ---------------------------------------------------------------------------
@dataclasses.dataclass
class _InputSpec:
    name: str
    dims: list | None
    dtype: object
    range: tuple | None = None  # calibrated (lo, hi) of the input's Q/DQ pair
    step: float = 0.0
    channel_axis: int | None = None  # of the model's layout


def _model_side(model_or_file, float_model):
    """(QuantModel or None, {input: _InputSpec}, source); an :class:`Engine` lends its model."""
    try:
        qm = model_or_file.qmodel if isinstance(model_or_file, Engine) else QuantModel(model_or_file,
                                                                                        float_model=float_model)
        model, source = qm.model, qm.source
    except NotQuantized:
        qm = None
        model, path = load_model(model_or_file)
        source = str(path) if path else "<ModelProto>"
    inits = {i.name for i in model.graph.initializer}
    specs = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        dims = declared_dims(i)
        specs[i.name] = _InputSpec(i.name, dims, NP_OF_ONNX.get(tt.elem_type))
        if dims and len(dims) >= 3:
            axis = image_channel_axis(dims)
            # an open axis holds tokens or positions of a length that varies, not channels: per-position
            # means of two sets compared would read a different preprocessing where there is none
            specs[i.name].channel_axis = axis if dims[axis] else None
    if qm is not None:
        for c in qm.of_kind("activation"):
            # a pair moved past a layout node (input -> Q -> Reshape -> DQ) reads the input under
            # the tool's own name: the file's is the input's, holding the same values
            spec = specs.get(qm.shown_name(c.input))
            if spec is not None and not c.dynamic:  # a dynamic range fits any data
                lo, hi = c.range()
                spec.range = (float(np.min(lo)), float(np.max(hi)))
                spec.step = float(np.max(np.abs(c.scale)))
    return qm, specs, source


# -- the data side ----------------------------------------------------------------------------
def _matches(shape, dims):
    return len(shape) == len(dims) and all(d is None or d == 0 or s == d for s, d in zip(shape, dims))


def _constant(st, name, dataset):
    """Samples holding one value. Where the input varies in other samples they are blank
    images or empty records; where every sample holds the same value it is a flag, a mask
    or a segment id, worth a note for a float input. An integer or boolean input (token ids,
    a padding mask, a segment id) holds one value in normal samples: a mask of a sequence
    without padding, a one-token prefix, token_type_ids of one-segment text; so does a float
    input of zeros and ones only (an attention mask given as float)."""
    # zeros alone are no mask: all padding, or a blank feature
    mask = st.integral and st.count > 0 and 0 <= st.lo and 0 < st.hi <= 1 and len(st.spec.dims or ()) != 4  # no image
    if not st.constant or mask or all(np.dtype(d).kind in "iub" for d in st.dtypes):
        return []
    if len(st.constant) < st.n or st.n == 1:
        what = "a plain-colour or blank image" if len(st.spec.dims or ()) == 4 else "a blank input"
        return [Finding("constant", "warning", f"{len(st.constant)} sample(s) hold a single value ({what}); they "
                        "narrow nothing and skew ranges", "replace them with representative samples", name, dataset,
                        st.constant[:_SHOWN])]
    return [Finding("constant", "info", f"every sample holds one value ({st.lo:.6g}): right for a flag or "
                    "a mask, wrong for an image or a feature, and for a recurrent state (the state a stream "
                    "carries after its first step is calibrated nowhere)",
                    "if this input carries data, check the preprocessing; for a state, calibrate on states the "
                    "model itself produced over a stream", name, dataset)]


def _shapes(st, name, dataset):
    """Samples of different shapes: an error where they differ on an axis the model fixes,
    a note where only its open axes vary (sequence lengths, image sizes) or the model declares
    no shape at all, which run one at a time; a warning where it declares none but they differ
    in rank: the rankings run them one at a time, the per-channel box plots skip a tensor whose
    rank follows them."""
    shapes = list(st.shapes)
    listed = ", ".join(str(list(s)) for s in shapes[:3])
    dims = st.spec.dims
    if dims is not None:  # a sample saved without its batch axis is read with one (data.py)
        shapes = [(1, *s) if len(s) == len(dims) - 1 else s for s in shapes]
    ranks = {len(s) for s in shapes}
    if dims is None and len(ranks) == 1:  # no shape declared ("any rank"): nothing fixes an axis
        return Finding("shape", "info", f"samples have different shapes ({listed}); the model declares no shape "
                       f"for {name!r}, so they run one at a time", "nothing to do; samples of one shape can run "
                       "stacked, which is faster", name, dataset)
    if dims is not None and ranks == {len(dims)}:
        varying = [k for k in range(len(dims)) if len({s[k] for s in shapes}) > 1]
        if all(dims[k] is None for k in varying):
            spans = ", ".join(f"axis {k}: {min(s[k] for s in shapes)}-{max(s[k] for s in shapes)}" for k in varying)
            return Finding("shape", "info", f"samples vary along the model's open axes ({spans}); they run one at a "
                           "time", "nothing to do; samples of one shape can run stacked, which is faster", name,
                           dataset)
    common = st.shapes.most_common(1)[0][0]
    odd = [st.wheres[i] for i, s in st.sample_shapes.items() if s != common]
    if dims is None:  # the model runs each (a rank-agnostic graph); no declared shape to restore
        return Finding("shape", "warning", f"samples have different ranks ({' and '.join(map(str, sorted(ranks)))}: "
                       f"{listed}); the model declares no shape for {name!r} and the rankings and suggest run them "
                       "one at a time, but a tensor whose rank follows them gets no per-channel box plot (runall, "
                       f"get-channelwise-data-distribution); {len(odd)} of {st.n} are not {list(common)} as most are",
                       f"save every sample with {len(common)} axes as most are, or leave the others out", name,
                       dataset, odd[:_SHOWN])
    return Finding("shape", "error", f"samples have different shapes ({listed}); {len(odd)} of {st.n} are not "
                   f"{list(common)} as most are", "save every sample with the model's input shape", name, dataset,
                   odd[:_SHOWN])


def _layout(shape, spec):
    """(verdict, channel axis of the data, message, fix) for one sample shape."""
    dims = spec.dims
    if dims is None:
        return "ok", None, "", ""
    shape = tuple(shape)
    if len(shape) == len(dims) - 1:  # saved without its batch dim
        shape = (1, *shape)
        off = 1
    else:
        off = 0
    if len(shape) == len(dims) and _matches(shape, dims):
        ax = spec.channel_axis
        return "ok", (ax - off if ax is not None else None), "", ""
    if len(shape) == 4 == len(dims):
        n, a, b, c = shape
        if _matches((n, c, a, b), dims):
            return ("nhwc", 3 - off,
                    f"samples are {list(shape)} (NHWC) but the model expects {_fmt(dims)} (NCHW)",
                    "transpose each sample with np.transpose(a, (0, 3, 1, 2)) (HWC->CHW) before saving")
        if _matches((n, b, c, a), dims):
            return ("nchw", 1 - off,
                    f"samples are {list(shape)} (NCHW) but the model expects {_fmt(dims)} (NHWC)",
                    "transpose each sample with np.transpose(a, (0, 2, 3, 1)) (CHW->HWC) before saving")
    return ("shape", None, f"samples are {list(shape)} but the model expects {_fmt(dims)}",
            "resize/crop to the model's input size and save one preprocessed sample per file")


def _holds(dtype, lo, hi):
    """Whether numbers of ``dtype`` span ``lo``..``hi`` (the finite values seen)."""
    info = type_info(dtype)
    return lo > hi or float(info.min) <= lo and hi <= float(info.max)


def _fmt(dims):
    return "[" + ", ".join("?" if not d else str(d) for d in dims) + "]"


class _Stats:
    """One pass over one input's samples: moments, extremes, channel moments, clipping."""

    def __init__(self, spec):
        self.spec = spec
        self.n = 0
        self.shapes, self.dtypes = Counter(), Counter()
        self.lo, self.hi = math.inf, -math.inf
        self.total = self.total_sq = 0.0
        self.count = 0
        self.integral = True
        self.nonfinite, self.constant, self.unreadable = [], [], []
        self.clipped = 0
        self.layout = None
        self.axis = None
        self.layout_message = self.layout_fix = ""
        self.misfits = defaultdict(list)  # (verdict, message, fix) of a sample the model cannot take -> where
        self.sample_shapes = {}  # sample index -> its shape
        self.ch_sum = self.ch_sq = None
        self.ch_count = 0
        self.digests = {}  # sample index -> digest of its array
        self.empty = set()  # sample indices whose array has a dimension of size 0
        self.wheres = {}

    def add(self, arr, where, index):
        self.n += 1
        self.shapes[tuple(arr.shape)] += 1
        self.dtypes[str(arr.dtype)] += 1
        self.digests[index] = hashlib.blake2b(
            arr.tobytes() + str(arr.shape).encode() + str(arr.dtype).encode(), digest_size=16).hexdigest()
        self.wheres[index] = where
        if arr.size == 0:
            self.empty.add(index)
        if extended_float(arr.dtype):
            arr = arr.astype(np.float32)  # as the analyses read it
        self.sample_shapes[index] = tuple(arr.shape)
        verdict, axis, message, fix = _layout(arr.shape, self.spec)
        if self.layout is None:  # the first sample's layout reads the channels
            self.layout, self.axis, self.layout_message, self.layout_fix = verdict, axis, message, fix
        if verdict != "ok":
            self.misfits[verdict, message, fix].append(where)
        if arr.dtype.kind not in "fiub":
            return
        a = arr.astype(np.float64, copy=False)
        finite = np.isfinite(a)
        if not finite.all():
            self.nonfinite.append(where)
            a = np.where(finite, a, np.nan)
        vals = a[finite] if not finite.all() else a.ravel()
        if vals.size == 0:
            return
        lo, hi = float(vals.min()), float(vals.max())
        if lo == hi and vals.size > 1:  # one value is no sign of a blank sample
            self.constant.append(where)
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self.total += float(vals.sum())
        self.total_sq += float(np.square(vals).sum())
        self.count += vals.size
        if self.integral and not np.all(vals == np.round(vals)):
            self.integral = False
        if self.spec.range is not None:
            rlo, rhi = self.spec.range
            tol = self.spec.step / 2
            self.clipped += int(np.count_nonzero((vals < rlo - tol) | (vals > rhi + tol)))
        if self.axis is not None and a.ndim > self.axis and a.shape[self.axis] <= 64 and finite.all():
            other = tuple(k for k in range(a.ndim) if k != self.axis)
            s, sq = a.sum(axis=other), np.square(a).sum(axis=other)
            if self.ch_sum is None or self.ch_sum.shape != s.shape:
                if self.ch_sum is not None:  # shapes vary: no channel statistics, not the first sample's
                    self.axis, self.ch_sum, self.ch_sq, self.ch_count = None, None, None, 0
                    return
                self.ch_sum, self.ch_sq = np.zeros_like(s), np.zeros_like(sq)
            self.ch_sum += s
            self.ch_sq += sq
            self.ch_count += a.size // a.shape[self.axis]

    def mean(self):
        return self.total / self.count if self.count else math.nan

    def std(self):
        if not self.count:
            return math.nan
        return math.sqrt(max(self.total_sq / self.count - self.mean() ** 2, 0.0))

    def channel_mean(self):
        return self.ch_sum / self.ch_count if self.ch_sum is not None and self.ch_count else None

    def channel_std(self):
        m = self.channel_mean()
        if m is None:
            return None
        return np.sqrt(np.maximum(self.ch_sq / self.ch_count - m**2, 0.0))

    def to_dict(self):
        shape = self.shapes.most_common(1)[0][0] if self.shapes else None
        cm, cs = self.channel_mean(), self.channel_std()
        ranks = {len(sh) for sh in self.shapes}
        # shapes that vary (text of several lengths): each axis's span, "5..19"
        span = ([f"{min(d)}..{max(d)}" if min(d) != max(d) else str(d[0]) for d in zip(*self.shapes)]
                if len(self.shapes) > 1 and len(ranks) == 1 else None)
        return {"samples": self.n, "shape": list(shape) if shape is not None else None,  # a scalar: []
                "shape_span": span,
                "dtype": self.dtypes.most_common(1)[0][0] if self.dtypes else None,
                "layout": self.layout, "channel_axis": self.axis,
                "min": self.lo if self.count else None, "max": self.hi if self.count else None,
                "mean": self.mean(), "std": self.std(), "whole_numbers": self.integral and self.count > 0,
                "channel_mean": cm.tolist() if cm is not None else None,
                "channel_std": cs.tolist() if cs is not None else None,
                "calibrated_range": list(self.spec.range) if self.spec.range else None,
                "clipped_share": self.clipped / self.count if self.count and self.spec.range else None}


def _scan(data, specs, dataset, bar):
    """Statistics of every input of ``data`` (a CalibrationData, unvalidated) and the
    per-sample digests for duplicate detection; the samples of its view only (``data_num``)."""
    stats = {}
    for name, src in data.sources.items():
        st = _Stats(specs.get(name) or _InputSpec(name, None, None))
        for i in data.indices:
            try:
                arr = src.load(i)
            except PTQError:
                st.unreadable.append(src.describe(i))
                continue
            st.add(np.asarray(arr), src.describe(i), i)
            bar.advance()
        stats[name] = st
    return stats


def _describe_scale(lo, hi, integral=False):
    if lo >= 0 and hi <= 1.0 + 1e-6:
        return "0-1"
    if lo >= 0 and hi <= 255 and (integral or hi > 2):
        return "0-255"
    if lo < 0:
        return "zero-centred (normalised)"
    return "other"


# -- findings -----------------------------------------------------------------------------------
def _data_findings(stats, specs, dataset, unscanned=0):
    """``unscanned``: samples of the set beyond ``data_num``, which count towards its size."""
    out = []
    names = list(stats)
    n = max((s.n for s in stats.values()), default=0) + unscanned
    if dataset == "calibration":
        if n < FEW_SAMPLES:
            out.append(Finding("count", "warning", f"{n} sample(s); calibration wants {FEW_SAMPLES}-{MANY_SAMPLES} "
                               "representative samples, fewer give ranges that miss real data",
                               f"add samples from the training/validation set up to {FEW_SAMPLES}-{MANY_SAMPLES}",
                               dataset=dataset))
        elif n > MANY_SAMPLES:
            out.append(Finding("count", "info", f"{n} samples; beyond {MANY_SAMPLES} calibration is slower and "
                               "rarely more accurate", f"use {FEW_SAMPLES}-{MANY_SAMPLES} representative samples",
                               dataset=dataset))
    missing = [k for k in specs if k not in stats]
    extra = [k for k in stats if k not in specs]
    for k in missing:
        out.append(Finding("inputs", "error", f"no samples for model input {k!r} (the data hold {names})",
                           f"add a folder {k!r} with one .npy per sample", input=k, dataset=dataset))
    for k in extra:
        out.append(Finding("inputs", "error", f"samples for {k!r}, which is not a model input "
                           f"(inputs: {list(specs)})", "rename the folder after the model input or remove it",
                           input=k, dataset=dataset))
    for name, st in stats.items():
        spec = st.spec
        if st.unreadable:
            out.append(Finding("unreadable", "error", f"{len(st.unreadable)} file(s) are not readable .npy arrays",
                               "re-save them with numpy.save", name, dataset, st.unreadable[:_SHOWN]))
        if st.nonfinite:
            out.append(Finding("nan", "error", f"{len(st.nonfinite)} sample(s) hold NaN or Inf values",
                               "fix the preprocessing (division by zero, log of 0) or drop these samples",
                               name, dataset, st.nonfinite[:_SHOWN]))
        out += _constant(st, name, dataset)
        if len(st.shapes) > 1 and not st.misfits:  # a misfit's finding names the odd samples
            out.append(_shapes(st, name, dataset))
        for (verdict, message, fix), wheres in st.misfits.items():
            some = "" if len(wheres) == st.n else f"{len(wheres)} of {st.n} "
            out.append(Finding("layout" if verdict in ("nhwc", "nchw") else "shape", "error", some + message, fix,
                               name, dataset, wheres[:_SHOWN], details={"layout": verdict}))
        if spec.dtype is not None and st.dtypes:
            got = np.dtype(st.dtypes.most_common(1)[0][0])
            want = np.dtype(spec.dtype)
            # every dtype present: one sample of float ids among int64 ones stops every analysis
            wrong = {d: n for d, n in st.dtypes.items()
                     if np.dtype(d).kind != want.kind and not (extended_float(d) and want.kind == "f")}
            if wrong:
                some = "" if sum(wrong.values()) == st.n else f"{sum(wrong.values())} of {st.n} "
                out.append(Finding("dtype", "error", f"{some}samples are {' or '.join(wrong)} but the model input is "
                                   f"{want}", f"preprocess, then save with a.astype(np.{want.name})", name, dataset))
            elif want.kind in "iuf" and (np.dtype(np.float32) if extended_float(got) else got).kind == want.kind \
                    and not _holds(want, st.lo, st.hi):
                # the analyses refuse such samples (a cast would make them infinite or wrap them)
                info = type_info(want)
                out.append(Finding("dtype", "error", f"samples are {got} and reach {st.lo:g}..{st.hi:g}, beyond the "
                                   f"{want} the model takes ({float(info.min):g}..{float(info.max):g})",
                                   "check the preprocessing (its scale)", name, dataset))
            elif got != want:
                out.append(Finding("dtype", "info", f"samples are {got}; they are converted to {want} on load",
                                   f"save them as {want.name} to halve the files" if got.itemsize > want.itemsize else "",
                                   name, dataset))
        if dataset == "calibration":
            # held-out values beyond the calibrated range are what the held-out comparison measures
            out += _range_findings(name, st, spec, dataset)
    # one input may hold nothing (a decoder's empty past); a sample empty in every input is
    # refused by the analyses
    empty = sorted(set.intersection(*(s.empty for s in stats.values()))) if stats else []
    if empty:
        first = next(iter(stats.values()))
        out.append(Finding("empty", "error", f"{len(empty)} sample(s) hold no values (every input has a dimension of "
                           "size 0); the analyses refuse them", "drop them, or save the preprocessed arrays the model "
                           "takes", None, dataset, [first.wheres[i] for i in empty[:_SHOWN]]))
    groups = _duplicates(stats)
    if groups:
        shown = [" = ".join(Path(w).name if "/" in w or os.sep in w else w for w in g[:3]) for g in groups[:_SHOWN]]
        out.append(Finding("duplicate", "warning", f"{sum(len(g) - 1 for g in groups)} sample(s) repeat others "
                           f"({'; '.join(shown)}); duplicates weigh their content twice",
                           "drop the copies and add distinct samples", None, dataset, shown))
    return out


def _duplicates(stats):
    """Groups of samples equal in every input, each as the first input's file names."""
    if not stats:
        return []
    per_input = list(stats.values())
    common = set.intersection(*(set(s.digests) for s in per_input))
    groups = defaultdict(list)
    for i in sorted(common):
        groups[tuple(s.digests[i] for s in per_input)].append(per_input[0].wheres[i])
    return [g for g in groups.values() if len(g) > 1]


def _range_findings(name, st, spec, dataset):
    out = []
    if not st.count:
        return out
    scale = _describe_scale(st.lo, st.hi, st.integral)
    consistent = True
    if spec.range is not None:
        rlo, rhi = spec.range
        share = st.clipped / st.count
        cal_scale = _describe_scale(rlo, rhi)
        details = {"data_range": [st.lo, st.hi], "calibrated_range": [rlo, rhi], "clipped_share": share}
        if share > CLIPPED_ERROR:
            consistent = False
            out.append(Finding(
                "range", "error",
                f"{share:.1%} of the values fall outside [{rlo:.4g}, {rhi:.4g}], the range the input's Q/DQ pair "
                f"was calibrated for (data span [{st.lo:.4g}, {st.hi:.4g}], {scale}; calibrated: {cal_scale})",
                "apply the model's own preprocessing (e.g. /255, then (x - mean) / std) before saving; if these "
                "data are right, the model was calibrated on wrongly preprocessed data: re-calibrate",
                name, dataset, details=details))
        elif st.lo < st.hi and (st.hi - st.lo) < NARROW_SHARE * (rhi - rlo):  # one value: the constant finding
            consistent = False
            out.append(Finding(
                "range-narrow", "warning",
                f"the data span [{st.lo:.4g}, {st.hi:.4g}] ({scale}), only {(st.hi - st.lo) / (rhi - rlo):.1%} of "
                f"the calibrated range [{rlo:.4g}, {rhi:.4g}] ({cal_scale}): scaled down (divided by 255 twice?)",
                "preprocess exactly as for the data the model was calibrated on", name, dataset, details=details))
    # whole numbers are what an integer input takes (token ids, indices, uint8 images the
    # model scales itself): pixels left unscaled only where the model wants floats
    wants_float = spec.dtype is None or np.dtype(spec.dtype).kind == "f"
    if scale == "0-255" and st.integral and st.hi > 1 and wants_float:
        severity = "info" if spec.range is not None and consistent else "warning"
        out.append(Finding(
            "raw-pixels", severity,
            f"the values are whole numbers in [{st.lo:.4g}, {st.hi:.4g}]: unnormalised 0-255 pixels",
            "if the model was trained on x/255 or normalised inputs, apply that before saving"
            + ("; the model was calibrated on the same scale" if severity == "info" else ""),
            name, dataset))
    return out


def _channel_findings(name, cal, other, other_std, against, dataset="calibration"):
    """Compare calibration channel means with ``other`` (expected or held-out means).

    ``against`` names the reference in messages. Distances are in units of the channel std.
    """
    cm = cal.channel_mean()
    if cm is None or other is None:
        return []
    cs = cal.channel_std()
    given = {"means": other, "standard deviations": other_std}
    for what, values in given.items():
        values = None if values is None else np.asarray(values, dtype=np.float64)
        if values is not None and values.shape != cm.shape and values.size != 1:
            return [Finding("channel-stats", "warning", f"{len(cm)} data channels but {values.size} {against} "
                            f"channel {what}; check the channel axis", "", name, dataset)]
        # one number stands for every channel
        given[what] = None if values is None else np.broadcast_to(values, cm.shape)
    other, other_std = given["means"], given["standard deviations"]
    scale = np.maximum((cs + (cs if other_std is None else other_std)) / 2, 1e-12)
    d_same = float(np.max(np.abs(cm - other) / scale))
    d_rev = float(np.max(np.abs(cm - other[::-1]) / scale))
    details = {"channel_mean": cm.tolist(), "reference_mean": other.tolist(), "distance": d_same,
               "distance_reversed": d_rev}
    out = []
    if len(cm) > 1 and d_same > MEAN_DIFFERS and d_rev < MEAN_AGREES:
        out.append(Finding(
            "colour-order", "error",
            f"the channel means {vector(cm)} match the {against} means {vector(other)} in reverse order: the channels "
            "are swapped (BGR vs RGB)",
            "reverse the channel axis (a[:, ::-1] for NCHW, a[..., ::-1] for NHWC) in the preprocessing",
            name, dataset, details=details))
    elif d_same > MEAN_DIFFERS:
        # against held-out data the content differs too: below a larger gap it is a note
        held = against == "held-out"
        severity = "warning" if not held or d_same > HELDOUT_MEAN_DIFFERS else "info"
        why = ("a different mean/scale or channel order in one of the two preprocessing paths, or images of other "
               "content (greyscale beside colour, night beside day)" if held else
               "a different mean/scale in the preprocessing, or images unlike the training set")
        out.append(Finding(
            "channel-stats", severity,
            f"the channel means {vector(cm)} differ from the {against} means {vector(other)} by up to {d_same:.2g} "
            f"standard deviations: {why}",
            "check that both sets go through the same preprocessing (mean_value / scale_value, channel order); if "
            "they do, the held-out content differs and the calibration set should cover it" if held else
            "use the same mean and scale (mean_value / scale_value) as the model's training preprocessing",
            name, dataset, details=details))
    if other_std is not None:
        # a channel constant on both sides (a recurrent state fed as zeros) has no scale to compare
        ratio = np.where((cs <= 1e-12) & (other_std <= 1e-12), 1.0, cs / np.maximum(other_std, 1e-12))
        if np.any(ratio > STD_RATIO) or np.any(ratio < 1 / STD_RATIO):
            out.append(Finding(
                "channel-scale", "warning",
                f"the channel standard deviations {vector(cs)} are {vector(ratio)} times the {against} ones: a "
                "different scale (std / scale_value) in the preprocessing",
                "divide by the same std (or multiply by the same scale_value) as at training", name, dataset,
                details={"channel_std": cs.tolist(), "reference_std": other_std.tolist()}))
    return out


def _scale_class_findings(name, cal, held):
    if not cal.count or not held.count:
        return []
    a = _describe_scale(cal.lo, cal.hi, cal.integral)
    b = _describe_scale(held.lo, held.hi, held.integral)
    if a == b:
        return []
    return [Finding("preprocessing-differs", "error",
                    f"the calibration data are {a} (span [{cal.lo:.4g}, {cal.hi:.4g}]) but the held-out data are {b} "
                    f"(span [{held.lo:.4g}, {held.hi:.4g}]): the two sets are preprocessed differently",
                    "preprocess both sets with the same function as the model's training pipeline", name, "heldout")]


def vector(v):
    return "[" + ", ".join(f"{x:.3g}" for x in np.asarray(v).ravel()) + "]"


# -- held-out comparison --------------------------------------------------------------------------
def _quantized_metrics(engine, data, metric, bar, outputs=None):
    """Pooled metric (worst of ``outputs``, default the model's outputs, a concatenation of
    unlike parts by part) of the fully quantized model on ``data`` and the per-node share of
    float activation values outside their calibrated range."""
    qm = engine.qmodel
    specs = parse_outputs(outputs, engine)
    pool = Pooled(metric, specs)
    acts = [c for c in qm.of_kind("activation") if engine.is_gated(c.name) and not c.dynamic]
    clipped, counted = Counter(), Counter()

    def count(values):
        for c in acts:
            v = values.get(c.input)
            if v is None or v.dtype.kind != "f":
                continue
            lo, hi = c.range()
            tol = float(np.max(np.abs(c.scale))) / 2
            clipped[c.name] += int(np.count_nonzero((v < np.min(lo) - tol) | (v > np.max(hi) + tol)))
            counted[c.name] += v.size

    probe = list(dict.fromkeys(engine.model_outputs + [c.input for c in acts if c.input in engine.probe_tensors]))
    for sample, parts in engine.probes((data.sample(i) for i in range(len(data))), [], probe):
        count(sample)
        ref = {}
        for values, _, _ in parts:  # float values a part of the sample at a time
            count(values)
            ref.update({o: values[o] for o in engine.model_outputs if o in values})
        out = engine.run(sample, "all")
        if engine.rewrite is not None:  # the bypassed graph is not the float model there: compare with that
            ref = engine.true_float(sample)
        pool.add(ref, out)
        bar.advance()
    value = pool.judged(data)
    shares = {n: clipped[n] / counted[n] for n in counted if counted[n]}
    return value, shares


# The held-out data losing this many times what the calibration data lose (and by GAP_MIN at
# least) is a gap between the two sets, whatever the threshold.
GAP_RATIO = 1.5
GAP_MIN = 0.01


def _gap(metric, cal_value, held_value):
    """True when the held-out loss is GAP_RATIO times the calibration loss, and GAP_MIN more."""
    cal, held = badness(metric.name, cal_value), badness(metric.name, held_value)
    if not metric.unit and metric.name != "sqnr":  # error metrics: no absolute scale for GAP_MIN
        return held >= GAP_RATIO * cal and held > cal
    return held >= GAP_RATIO * cal and held - cal >= GAP_MIN * (1 if metric.unit else 0.1)


def _heldout_findings(engine, cal_data, held_data, metric, threshold, bar, threshold_from="", outputs=None):
    cal_value, cal_clip = _quantized_metrics(engine, cal_data, metric, bar, outputs)
    held_value, held_clip = _quantized_metrics(engine, held_data, metric, bar, outputs)
    quantized = {"calibration": {metric.name: cal_value}, "heldout": {metric.name: held_value}}
    clipping = sorted(((n, s) for n, s in held_clip.items() if s > max(1e-3, 10 * cal_clip.get(n, 0.0))),
                      key=lambda x: -x[1])
    out = []
    hint = ""
    if clipping:
        hint = "; held-out values fall outside the calibrated range of " + ", ".join(
            f"{n} ({s:.1%})" for n, s in clipping[:3])
    details = {"calibration": cal_value, "heldout": held_value,
               "heldout_clipping": {n: s for n, s in clipping[:10]}}
    # an output far from zero (or of zeros, or kl's one logit) reads alike on both sets whatever
    # quantization does to it; each sentence names the metrics that see it
    out += [Finding("metric-blind", "warning", w, "rerun with --metric set to one the warning names", None,
                    "heldout") for w in blind_warnings(engine, metric=metric.name)]
    # without held-out values beyond the calibrated ranges, the ranges cover the held-out data:
    # those samples lose more to the same grids (a detector's scores on images without its
    # classes, a fifth of the calibration's, rounded away by the output's step), which a
    # calibration drawn like them does not change (measured: YOLOv8n calibrated on its own
    # held-out images read 0 there too)
    if clipping:
        why = "the calibration set does not represent the held-out data"
        recalibrate = "calibrate on samples drawn like the held-out data"
    else:
        why = ("the held-out values stay within the calibrated ranges, so it is not their coverage: those samples "
               "lose more to the same grids (their values sit lower in the ranges, nearer a step)")
        recalibrate = ("rank the nodes on the held-out data (runall --heldout) and raise the first to int16 or keep them "
                       "in float (suggest --heldout); recalibrating does not widen what they use of the ranges")
    if threshold is None:
        gap = _gap(metric, cal_value, held_value)
        out.append(Finding("heldout-gap" if gap else "heldout-worse", "warning" if gap else "info",
                           f"fully quantized {metric.name}: {cal_value:.6g} on the calibration data, {held_value:.6g} "
                           f"on the held-out data{hint}" + (f": {why}" if gap else ""),
                           recalibrate if gap else "", None, "heldout", details=details))
        return out, quantized
    # where the threshold comes from, beside it: one fixed 0.99 failed a contract whose own
    # floor passed the same figure
    said = f"{threshold}, {threshold_from}" if threshold_from else f"{threshold}"
    missed = f"{threshold} ({threshold_from})" if threshold_from else f"{threshold}"
    cal_ok = not metric.worse(cal_value, threshold)
    held_ok = not metric.worse(held_value, threshold)
    if cal_ok and not held_ok:
        out.append(Finding(
            "not-representative", "error",
            f"quantization keeps {metric.name} at {cal_value:.6g} on the calibration data but only {held_value:.6g} on "
            f"the held-out data (threshold {said}){hint}: "
            + ("the calibration set does not represent the data the model will see" if clipping else why),
            "calibrate on 20-100 samples drawn like the held-out/production data (scenes, lighting, classes, value range)"
            if clipping else recalibrate, None, "heldout", details=details))
    elif not cal_ok and not held_ok and _gap(metric, cal_value, held_value):
        ratio = badness(metric.name, held_value) / max(badness(metric.name, cal_value), 1e-12)
        out.append(Finding(
            "heldout-gap", "warning",
            f"quantization misses {missed} on both sets, and the held-out data lose {ratio:.1f}x as much "
            f"({metric.name} {cal_value:.6g} on the calibration data, {held_value:.6g} on the held-out data){hint}: "
            + ("the model is sensitive and the calibration set does not represent the held-out data either" if clipping
               else f"the model is sensitive; {why}"),
            "calibrate on 20-100 samples drawn like the held-out data (a remedy chosen on the calibration set may not "
            "hold there), then rank the sensitive nodes and run suggest with --heldout" if clipping else recalibrate,
            None, "heldout", details={**details, "loss_ratio": ratio}))
    elif not cal_ok and not held_ok:
        out.append(Finding(
            "heldout-worse", "info",
            f"quantization misses {missed} on both sets ({metric.name} {cal_value:.6g} calibration, {held_value:.6g} "
            "held-out) by comparable amounts: not a representativeness problem; rank the sensitive nodes",
            "run get-sensitivity-of-nodes and suggest", None, "heldout", details=details))
    elif clipping:
        out.append(Finding("heldout-clipping", "warning", f"held-out data exceed calibrated ranges{hint} "
                           f"({metric.name} still {held_value:.6g})",
                           "add samples like these to the calibration set", None, "heldout", details=details))
    return out, quantized


def _reference_engine(model_or_file, qm, cal, float_model, libraries):
    """(engine, None), or (None, why) where the float reference the comparison needs is not
    to be had: without the float model it is the graph with every pair bypassed, which is
    another model where the quantizer folded a Relu/Clip into a range and deleted it (a
    cosine of 0.01 against 0.998 with the float model, on a Conv-Relu-Conv)."""
    if isinstance(model_or_file, Engine):  # checked where it was built
        return model_or_file, None
    engine = Engine(qm, cal, float_model=float_model, check=False, custom_op_libraries=libraries)
    try:
        found = engine.check_float_equivalence()
    except (NotFloatEquivalent, NonFinite) as e:  # no float reference on these data: the report stays
        return None, str(e)
    if found.suspects and float_model is None:
        return None, found.warnings[0]
    return engine, None


# -- entry point ---------------------------------------------------------------------------------
def check_data(model_or_file, calibrated_data=None, heldout=None, data_num=None, float_model=None,
               metric=None, threshold=None, expect_mean=None, expect_std=None, progress=None,
               custom_op_libraries=(), threshold_from=None, outputs=None):
    """Check calibration data (and a held-out set) against the model.

    ``model_or_file``: the calibrated QDQ model (a float model works too, without the
    range and held-out checks), or an :class:`Engine` whose model and data are reused. ``expect_mean``/``expect_std``: per-channel statistics that
    correctly preprocessed data should have (after normalisation). ``metric`` (default cosine
    similarity) and ``threshold`` (default 0.99 for cosine similarity) judge the held-out
    comparison alone: an error where the calibration data keep the threshold and the held-out
    data do not; without ``heldout`` they are refused, as they would judge nothing.
    ``custom_op_libraries``: onnxruntime libraries the model's custom Q/DQ ops need (the
    held-out comparison runs the model). ``threshold_from``: where the threshold comes from,
    said beside it in the findings (default: "as given", or the default's own words); ``outputs``:
    the outputs or slices judged (default every output), as ``output_node`` names them. Returns a
    :class:`DataReport`, findings ordered error, warning, info.
    """
    m = get_metric("cosine-similarity" if metric is None else metric)
    asked = metric is not None or threshold is not None
    threshold = None if threshold is None else params.threshold(threshold, m.name)
    if heldout is None and asked:
        raise PTQError("metric and threshold (--metric, --threshold) judge the held-out comparison alone; give "
                       "held-out data (--heldout) or leave them out")
    expect_mean = params.numbers_list(expect_mean, "expect_mean")
    expect_std = params.numbers_list(expect_std, "expect_std", positive=True)
    custom_op_libraries = params.libraries(custom_op_libraries)
    if threshold_from is None:
        threshold_from = "as given" if threshold is not None else "the default of --threshold / threshold="
    if threshold is None and m.name == "cosine-similarity":
        threshold = params.DEFAULT_MIN_COSINE
    if calibrated_data is None and isinstance(model_or_file, Engine):
        calibrated_data = model_or_file.data
    qm, specs, source = _model_side(model_or_file, float_model)
    datasets = {"calibration": load_data(calibrated_data, None, data_num)}
    if heldout is not None:
        # data_num counts calibration samples only
        datasets["heldout"] = load_data(heldout, None, role="held-out", calibration=datasets["calibration"])
    total = sum(len(d) * len(d.sources) for d in datasets.values())
    findings, stats, scans = [], {}, {}
    if qm is None:
        findings.append(Finding("no-qdq", "info", f"{source} has no Q/DQ pairs: range and held-out checks need "
                                "the calibrated model", "pass the calibrated QDQ model"))
    with Progress(total, "check data", enabled=progress) as bar:
        for dataset, data in datasets.items():
            scans[dataset] = _scan(data, specs, dataset, bar)
            stats[dataset] = {k: v.to_dict() for k, v in scans[dataset].items()}
            findings += _data_findings(scans[dataset], specs, dataset, data.count - len(data))
        for name, st in scans["calibration"].items():
            if expect_mean is not None:
                findings += _channel_findings(name, st, expect_mean, expect_std, "expected")
            elif expect_std is not None and st.channel_std() is not None:
                findings += _channel_findings(name, st, st.channel_mean(), expect_std, "expected")
            if "heldout" in scans and name in scans["heldout"]:
                held = scans["heldout"][name]
                findings += _scale_class_findings(name, st, held)
                findings += _channel_findings(name, st, held.channel_mean(),
                                              held.channel_std(), "held-out")
    quantized = None
    if heldout is not None and qm is not None:
        blocking = [f for f in findings if f.severity == "error" and f.check in _BLOCKING]
        if blocking:
            findings.append(Finding("heldout-skipped", "info", "the quantized model was not run on the two sets "
                                    f"because of the errors above ({blocking[0].check})",
                                    "fix the errors, then check again", None, "heldout"))
        else:
            cal = load_data(calibrated_data, qm, data_num)
            engine, why = _reference_engine(model_or_file, qm, cal, float_model, custom_op_libraries)
            if why:
                findings.append(Finding("heldout-skipped", "warning", "the quantized model was not compared on "
                                        f"the two sets: {why}", "", None, "heldout"))
            else:
                held = load_data(heldout, qm, role="held-out", calibration=cal)
                # a bar of its own: a run of the model costs ten times a sample's statistics, and
                # counted as one step alike, the time left read a sixth of what it was
                with Progress(len(cal) + len(held), "check data: the quantized model on both sets",
                              enabled=progress) as bar:
                    more, quantized = _heldout_findings(engine, cal, held, m, threshold, bar, threshold_from, outputs)
                findings += more
    order = {s: k for k, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    data_where = getattr(datasets["calibration"], "where", str(calibrated_data))
    held_where = getattr(datasets.get("heldout"), "where", None) if heldout is not None else None
    return DataReport(findings=findings, stats=stats, quantized=quantized, model=source, data=data_where,
                      heldout=held_where)

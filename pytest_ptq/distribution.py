"""Data distributions of chosen nodes (histograms) and per-channel box plots.

What is drawn, per node kind:

* activation calibration node: its input in the float model (every pair bypassed) over the
  chosen samples, the max |x| (triangle), the calibration range (dashed, both ends), the
  share of values outside it (clipped) and the bit width;
* weight calibration node: the float weight against the dequantized one, and the error;
  a lone DequantizeLinear whose float weight is unknown compares the dequantized weight
  with itself and says so;
* normal node: its output in the float model against the fully quantized model, and the
  error between them.

Memory: one pass over the samples gives exact counts, extremes, moments and clipped
shares; histogram bins are then fixed from the exact range. The samples' tensors are kept
for the histograms while they fit in ``CACHE_BYTES``; beyond, a second pass recomputes
them, so memory stays bounded by one sample plus the per-channel reservoirs
(see :mod:`pytest_ptq.channelwise`).
"""

from __future__ import annotations

import hashlib
import math
import re
import weakref
from pathlib import Path

import numpy as np

from .channelwise import OUTLIER_K, ChannelStats, channel_axis, plot_channels, wrap
from .channelwise import reading as channel_reading
from .errors import PTQError, unknown
from .figures import pyplot, save_figure
from .progress import Progress
from .results import json_safe
from .sensitivity import engine_for, sample_indices

HIST_BINS = 128
CACHE_BYTES = 256 * 2**20
# Share of values left out at each end when measuring the "bulk" range of a tensor.
BULK_TAIL = 0.0005
# Share of clipped values beyond which the calibration range is too narrow.
CLIP_SHARE = 1e-3
# The bulk of a tensor spanning fewer levels than this wastes at least 4 bits of an 8-bit type.
FEW_LEVELS = 16
# A weight channel below this SQNR (dB) is starved of levels (int8 weights usually reach 30-40).
WEAK_SQNR_DB = 20.0

_extra_sessions = weakref.WeakKeyDictionary()


# -- gathering ---------------------------------------------------------------------------
def _run(engine, i, quantized, tensors):
    """Float (``quantized=()``) or quantized values of ``tensors`` for sample ``i``.

    Model inputs come from the sample; normal-node outputs from the probe session; any
    other tensor (the output of another pair, say) from a session exposing it.
    """
    sample = engine.sample(i)
    out = {t: sample[t] for t in tensors if t in sample}
    rest = [t for t in tensors if t not in out]
    if not rest:
        return out
    known = set(engine.probe_tensors) | set(engine.model_outputs)
    if all(t in known for t in rest):
        out.update(engine.run(sample, quantized, rest, kind="probe"))
        return out
    from .engine import make_session

    sessions = _extra_sessions.setdefault(engine, {})
    key = tuple(sorted(rest))
    if key not in sessions:
        sessions[key] = make_session(engine._instrumented(list(key)), engine.optimization, engine.providers)
    names = engine.calib_names if isinstance(quantized, str) and quantized == "all" else quantized
    values = sessions[key].run(rest, engine.feeds(sample, names))
    out.update(zip(rest, values))
    return out


class _Values:
    """Exact scalars of a stream of arrays, then a histogram over fixed edges."""

    def __init__(self, get, lo=None, hi=None, axis=None):
        self.get, self.lo, self.hi, self.axis = get, lo, hi, axis
        self.count = self.nonfinite = self.clipped_lo = self.clipped_hi = 0
        self.min, self.max, self.sum, self.sumsq = math.inf, -math.inf, 0.0, 0.0
        self.peak = 0.0  # the value with the largest magnitude, sign kept
        self.edges = self.counts = None
        self.shape = None

    def first(self, vals):
        a = np.asarray(self.get(vals))
        if self.shape is None:
            self.shape = list(a.shape)
        finite = np.isfinite(a)
        if not finite.all():
            self.nonfinite += int(a.size - finite.sum())
            a_flat = a[finite]
        else:
            a_flat = a.reshape(-1)
        if a_flat.size == 0:
            return
        amin, amax = float(a_flat.min()), float(a_flat.max())
        self.min, self.max = min(self.min, amin), max(self.max, amax)
        big = amax if abs(amax) >= abs(amin) else amin
        if abs(big) > abs(self.peak):
            self.peak = big
        f64 = a_flat.astype(np.float64)
        self.sum += float(f64.sum())
        self.sumsq += float(f64 @ f64)
        self.count += a_flat.size
        if self.lo is not None:
            lo, hi = self._bounds(a)
            self.clipped_lo += int(np.count_nonzero(a < lo))
            self.clipped_hi += int(np.count_nonzero(a > hi))

    def _bounds(self, a):
        lo, hi = np.asarray(self.lo, np.float64), np.asarray(self.hi, np.float64)
        if lo.size > 1:
            shape = [1] * a.ndim
            shape[self.axis % a.ndim] = -1
            return lo.reshape(shape), hi.reshape(shape)
        return lo.reshape(()), hi.reshape(())

    def set_edges(self, lo, hi, bins):
        if not math.isfinite(lo) or not math.isfinite(hi):
            lo, hi = 0.0, 0.0
        if hi <= lo:
            lo, hi = lo - 0.5, hi + 0.5
        self.edges = np.linspace(lo, hi, bins + 1)
        self.counts = np.zeros(bins, dtype=np.int64)

    def second(self, vals):
        a = np.asarray(self.get(vals)).reshape(-1)
        a = a[np.isfinite(a)] if self.nonfinite else a
        self.counts += np.histogram(a, bins=self.edges)[0]

    def result(self):
        n = max(self.count, 1)
        mean = self.sum / n
        out = {"count": int(self.count), "min": self.min if self.count else None,
               "max": self.max if self.count else None, "max_abs": abs(self.peak), "peak": self.peak,
               "mean": mean, "std": math.sqrt(max(self.sumsq / n - mean * mean, 0.0)),
               "nonfinite": int(self.nonfinite), "shape": self.shape,
               "hist": {"counts": self.counts.tolist(), "edges": self.edges.tolist()}}
        out["bulk_lo"], out["bulk_hi"] = _bulk(self.counts, self.edges)
        if self.lo is not None:
            clipped = self.clipped_lo + self.clipped_hi
            out.update(clipped_count=int(clipped), clipped_low=int(self.clipped_lo),
                       clipped_high=int(self.clipped_hi), clipped_share=clipped / n)
        return out


def _bulk(counts, edges):
    """The range holding all but BULK_TAIL of the values at each end, to a bin's width."""
    total = counts.sum()
    if not total:
        return None, None
    cum = np.cumsum(counts)
    lo = int(np.searchsorted(cum, BULK_TAIL * total, side="right"))
    hi = int(np.searchsorted(cum, (1 - BULK_TAIL) * total, side="left"))
    return float(edges[lo]), float(edges[min(hi + 1, len(edges) - 1)])


class _Group:
    """Histograms that share their bins (float and quantized overlays)."""

    def __init__(self, members, bins):
        self.members, self.bins = members, bins

    def first(self, vals):
        for m in self.members:
            m.first(vals)

    def prepare(self):
        live = [m for m in self.members if m.count]
        lo = min((m.min for m in live), default=0.0)
        hi = max((m.max for m in live), default=0.0)
        for m in self.members:
            m.set_edges(lo, hi, self.bins)
        return True

    def second(self, vals):
        for m in self.members:
            m.second(vals)


class _Pair:
    """Similarity of a quantized stream to its float stream (cosine, SQNR, max error)."""

    def __init__(self, ref, test):
        self.ref, self.test = ref, test
        self.dot = self.rr = self.tt = 0.0

    def first(self, vals):
        r = np.asarray(self.ref(vals), np.float64).reshape(-1)
        t = np.asarray(self.test(vals), np.float64).reshape(-1)
        self.dot += float(r @ t)
        self.rr += float(r @ r)
        self.tt += float(t @ t)

    def prepare(self):
        return False

    def result(self, err):
        cos = 1.0 if self.rr == 0 and self.tt == 0 else (
            0.0 if self.rr == 0 or self.tt == 0 else self.dot / math.sqrt(self.rr * self.tt))
        noise = err["std"] ** 2 + err["mean"] ** 2
        signal = self.rr / max(err["count"], 1)
        sqnr = math.inf if noise == 0 else (-math.inf if signal == 0 else 10 * math.log10(signal / noise))
        return {"cosine-similarity": cos, "sqnr": sqnr, "max_abs_error": err["max_abs"],
                "rmse": math.sqrt(noise)}


class _Channels:
    """Per-channel statistics of a stream; the channel axis is settled by its first array."""

    def __init__(self, get, stats, axis_of, skip_unboxable=False):
        self.get, self.stats, self.axis_of, self.skip = get, stats, axis_of, skip_unboxable
        self.error = None

    def first(self, vals):
        if self.error is not None:
            return
        a = self.get(vals)
        if self.stats.axis is None:
            try:
                self.stats.axis = self.axis_of(np.shape(a))
            except PTQError as exc:
                if not self.skip:
                    raise
                self.error = str(exc)
                return
        self.stats.add(a)

    def prepare(self):
        return False


def _sweep(engine, indices, float_tensors, quant_tensors, accs, bar):
    """Feed every sample's tensors to the accumulators (two passes where they need one)."""
    def fetch(i):
        vals = {}
        if float_tensors:
            vals.update({("f", t): v for t, v in _run(engine, i, (), float_tensors).items()})
        if quant_tensors:
            vals.update({("q", t): v for t, v in _run(engine, i, "all", quant_tensors).items()})
        return vals

    cache, size, complete = [], 0, True
    for i in indices:
        vals = fetch(i)
        for a in accs:
            a.first(vals)
        if complete:
            size += sum(v.nbytes for v in vals.values())
            if size <= CACHE_BYTES:
                cache.append(vals)
            else:
                complete, cache = False, []
        bar.advance()
    second = [a for a in accs if a.prepare()]
    if second:
        for k, i in enumerate(indices):
            vals = cache[k] if complete else fetch(i)
            for a in second:
                a.second(vals)
            if not complete:
                bar.advance()


# -- node description ---------------------------------------------------------------------
def _resolve(qm, nodes_list, what):
    if nodes_list is None or (not isinstance(nodes_list, str) and len(nodes_list) == 0):
        raise PTQError(f"{what} needs nodes_list: the calibration or normal node names to plot "
                       "(list them with `ptq-debug list-nodes MODEL`)")
    names = [nodes_list] if isinstance(nodes_list, str) else list(nodes_list)
    for name in names:
        if name not in qm.calibration and name not in qm.normal:
            raise unknown("node", name, list(qm.calibration) + list(qm.normal))
    return list(dict.fromkeys(names))


def _output_tensor(engine, node):
    t = next((o for o in node.outputs if o in engine.probe_tensors), None)
    if t is None:
        raise PTQError(f"node {node.name!r} ({node.op_type}) has no float output to compare; "
                       "pick a node that computes a float tensor")
    return t


def weight_arrays(qm, c):
    """(float weight or None, dequantized weight) of weight calibration node ``c``."""
    deq = None
    if c.q_node is not None:
        w = qm.constant(c.input)
        if w is None:
            raise PTQError(f"weight {c.name!r} of {qm.source!r} has no constant input {c.input!r}")
        w = np.asarray(w, dtype=np.float32)
        return w, c.fake_quant(w)
    ints = np.asarray(qm.constant(c.input)).astype(np.float64)
    s, zp = c.scale.astype(np.float64), c.zero_point.astype(np.float64)
    if c.per_channel and ints.ndim:
        shape = [1] * ints.ndim
        shape[c.axis % ints.ndim] = -1
        s, zp = s.reshape(shape), zp.reshape(shape)
    deq = ((ints - zp) * s).astype(np.float32)
    w = qm.float_weights.get(c.float_weight) if c.float_weight else None
    return (None if w is None else np.asarray(w, dtype=np.float32)), deq


def clip_bounds(c):
    """Values below the first or above the second are clipped: beyond the representable
    range by more than half a step, so their error exceeds rounding's."""
    lo, hi = c.range()
    half = c.scale.astype(np.float64) / 2
    return lo - half, hi + half


def _describe(c):
    lo, hi = c.range()
    return {"kind": c.kind, "tensor": c.input, "bit": c.bit, "dtype": c.dtype_name,
            "per_channel": c.per_channel, "axis": c.axis, "threshold": float(c.threshold),
            "range_lo": float(np.min(lo)), "range_hi": float(np.max(hi)),
            "scale": float(np.max(c.scale)), "role": c.role, "feeds": list(c.consumers)}


# -- collection ---------------------------------------------------------------------------
def collect(engine, dist_nodes=(), box_nodes=(), axis=None, data_num=None, bins=HIST_BINS,
            outlier_k=OUTLIER_K, progress=False, skip_unboxable=False):
    """Statistics for the distribution and box plots of the given nodes, from one sweep.

    Returns ``(distributions, channelwise)``: dicts keyed by node name, JSON-safe, without
    the plots (see :func:`plot_distribution`, :func:`get_channelwise_data_distribution`).
    With ``skip_unboxable``, a node without a channel axis gets ``{"skipped": reason}``
    instead of raising.
    """
    qm = engine.qmodel
    for name in box_nodes:
        if name not in qm.calibration:
            feeds = qm.normal[name].calibration_inputs if name in qm.normal else []
            hint = f"; it is a normal node fed by {feeds}" if feeds else ""
            raise PTQError(f"get_channelwise_data_distribution takes calibration nodes and {name!r} is not "
                           f"one{hint}")
    float_t, quant_t, accs, plans = [], [], [], {}
    dist, boxes = {}, {}

    def need(lst, t):
        if t not in lst:
            lst.append(t)

    for name in dist_nodes:
        if name in qm.calibration:
            c = qm.calibration[name]
            info = {"node": name, **_describe(c)}
            if c.kind == "weight":
                dist[name] = _weight_distribution(qm, c, info, bins)
                continue
            need(float_t, c.input)
            info["relu_follows"] = bool(c.consumers) and all(
                qm.normal[n].op_type == "Relu" for n in c.consumers if n in qm.normal)
            v = _Values(lambda vals, t=c.input: vals[("f", t)], *clip_bounds(c), axis=c.axis)
            accs.append(_Group([v], bins))
            plans[name] = ("activation", info, v)
        else:
            n = qm.normal[name]
            t = _output_tensor(engine, n)
            need(float_t, t)
            need(quant_t, t)
            fv = _Values(lambda vals, t=t: vals[("f", t)])
            qv = _Values(lambda vals, t=t: vals[("q", t)])
            ev = _Values(lambda vals, t=t: vals[("q", t)].astype(np.float64) - vals[("f", t)])
            pair = _Pair(lambda vals, t=t: vals[("f", t)], lambda vals, t=t: vals[("q", t)])
            accs += [_Group([fv, qv], bins), _Group([ev], bins), pair]
            info = {"node": name, "kind": "node", "op_type": n.op_type, "tensor": t,
                    "calibration_inputs": list(n.calibration_inputs)}
            plans[name] = ("node", info, (fv, qv, ev, pair))
    errors = {}
    for name in box_nodes:
        c = qm.calibration[name]
        info = {"node": name, **_describe(c)}
        lo, hi = c.range()
        info.update(range_lo=np.asarray(lo).reshape(-1).tolist() if c.per_channel else float(np.min(lo)),
                    range_hi=np.asarray(hi).reshape(-1).tolist() if c.per_channel else float(np.max(hi)),
                    range_axis=c.axis)
        stats = ChannelStats(None)
        boxes[name] = (info, stats)
        if c.kind == "weight":
            w, deq = weight_arrays(qm, c)
            info["compared_against"] = "float weight" if w is not None else "dequantized weight"
            chan = _Channels(lambda v: v, stats, lambda shape, c=c: channel_axis(qm, c, shape, axis),
                             skip_unboxable)
            chan.first(w if w is not None else deq)
            errors[name] = chan
            continue
        need(float_t, c.input)
        chan = _Channels(lambda vals, t=c.input: vals[("f", t)], stats,
                         lambda shape, c=c: channel_axis(qm, c, shape, axis), skip_unboxable)
        accs.append(chan)
        errors[name] = chan
    if accs:
        indices = sample_indices(engine, data_num)
        with Progress(len(indices), "distributions", enabled=progress) as bar:
            _sweep(engine, indices, float_t, quant_t, accs, bar)
        samples = len(indices)
    else:
        samples = 0
    for name, (kind, info, acc) in plans.items():
        info["samples"] = samples
        if kind == "activation":
            r = acc.result()
            info.update(r)
            info["bulk_levels"] = _levels(info, r)
            # a Relu after the pair zeroes what is clipped below a range starting at <= 0 anyway
            harmless = info["relu_follows"] and info["range_lo"] <= 0
            info["effective_clipped_share"] = (r["clipped_high"] if harmless else r["clipped_count"]) / max(r["count"], 1)
        else:
            fv, qv, ev, pair = acc
            err = ev.result()
            info.update(float=fv.result(), quantized=qv.result(), error=err, **pair.result(err))
            info["max_abs"] = info["float"]["max_abs"]
        dist[name] = info
    out_boxes = {}
    for name, (info, stats) in boxes.items():
        if errors[name].error is not None:
            out_boxes[name] = {"node": name, "kind": info["kind"], "skipped": errors[name].error}
            continue
        if stats.channels is None:
            raise PTQError(f"node {name!r} produced no values to box-plot")
        info.update(stats.result(outlier_k), axis=stats.axis, shape=stats.shape,
                    samples=samples if info["kind"] == "activation" else 0)
        out_boxes[name] = info
    order = list(dict.fromkeys(list(dist_nodes)))
    return ({k: json_safe(dist[k]) for k in order},
            {k: json_safe(out_boxes[k]) for k in dict.fromkeys(box_nodes)})


def _levels(info, r):
    """Quantization levels spanned by the bulk of the values (all but the thinnest tails)."""
    if r["bulk_lo"] is None or not info["scale"]:
        return None
    return float((r["bulk_hi"] - r["bulk_lo"]) / info["scale"])


def _weight_distribution(qm, c, info, bins):
    w, deq = weight_arrays(qm, c)
    ref = w if w is not None else deq
    fv = _Values(lambda v: v["w"], *clip_bounds(c), axis=c.axis)
    qv = _Values(lambda v: v["d"])
    ev = _Values(lambda v: v["d"].astype(np.float64) - v["w"])
    pair = _Pair(lambda v: v["w"], lambda v: v["d"])
    vals = {"w": ref, "d": deq}
    groups = [_Group([fv, qv], bins), _Group([ev], bins), pair]
    for g in groups:
        g.first(vals)
    for g in groups:
        if g.prepare():
            g.second(vals)
    err = ev.result()
    f = fv.result()
    info.update(samples=0, compared_against="float weight" if w is not None else "dequantized weight",
                float=f, dequantized=qv.result(), error=err, **pair.result(err))
    for key in ("count", "min", "max", "max_abs", "mean", "std", "hist", "clipped_share", "clipped_count",
                "bulk_lo", "bulk_hi", "shape"):
        info[key] = f.get(key)
    info["bulk_levels"] = _levels(info, f)
    info.update(_channel_sqnr(qm, c, ref, deq))
    if w is None:
        info["note"] = ("float weight unknown (stored quantized, no float model given): compared "
                        "against the dequantized weight, so the error is zero by construction")
    return info


def _channel_sqnr(qm, c, w, deq):
    """SQNR (dB) of each output channel: a per-tensor scale set by one wide channel shows up
    as a weak channel even when the whole tensor's SQNR looks fine."""
    try:
        ax = channel_axis(qm, c, w.shape)
    except PTQError:
        return {"channel_axis": None, "channel_sqnr": None, "worst_channel": None, "worst_channel_sqnr": None}
    wf = np.moveaxis(w.astype(np.float64), ax, 0).reshape(w.shape[ax], -1)
    ef = np.moveaxis(deq.astype(np.float64), ax, 0).reshape(w.shape[ax], -1) - wf
    signal, noise = (wf * wf).sum(axis=1), (ef * ef).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        db = np.where(noise > 0, 10 * np.log10(np.where(signal > 0, signal, 1e-300) / noise), np.inf)
    db = np.where((signal == 0) & (noise > 0), -np.inf, db)
    worst = int(np.argmin(db))
    return {"channel_axis": ax, "channel_sqnr": db.tolist(), "worst_channel": worst,
            "worst_channel_sqnr": float(db[worst])}


# -- plots --------------------------------------------------------------------------------
def _slug(name):
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "node"
    if safe != name:
        safe += "-" + hashlib.sha1(name.encode()).hexdigest()[:6]
    return safe[:120]


def _stairs(ax, hist, label, colour, fill=True, alpha=0.55):
    counts, edges = np.asarray(hist["counts"]), np.asarray(hist["edges"])
    ax.stairs(counts, edges, fill=fill, alpha=alpha if fill else 1.0, color=colour, label=label,
              linewidth=1.2)
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    if ax.get_yscale() == "linear" and counts.max(initial=0) < 50:
        # a handful of values: a log axis would show one tick and hide nothing
        # headroom above the tallest bar for the legend and the statistics box
        ax.set_ylim(0, max(ax.get_ylim()[1], counts.max(initial=0) * 1.4))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("count")
        return
    ax.set_yscale("log")
    ax.set_ylim(0.7, max(ax.get_ylim()[1], counts.max(initial=1) * 12))
    ax.set_ylabel("count (log scale)")

    # plain numbers: sub-decade ranges otherwise get labels like 6x10^0 on minor ticks
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _margins(fig, heading, height, extra=0.0):
    """Fixed margins for a known layout: tight_layout costs a full extra draw per figure."""
    lines = heading.count("\n") + 1
    top = 1 - (0.12 + 0.17 * lines + extra) / height
    width = fig.get_figwidth()
    fig.subplots_adjust(left=0.95 / width, right=1 - 0.2 / width, bottom=0.5 / height, top=top, wspace=0.18)


def _fmt(v):
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return v
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.3e}"
    return f"{v:.4g}"


def few_levels(bit):
    """Levels under which a tensor's bulk counts as starved: FEW_LEVELS, or 1/16 of a narrower type's."""
    return min(FEW_LEVELS, 2 ** bit / 16)


def activation_reading(d):
    """One line saying what an activation's histogram means for quantization."""
    if d.get("effective_clipped_share", 0) > CLIP_SHARE:
        return (f"{100 * d['effective_clipped_share']:.2f}% of values fall outside the calibration range and "
                "are clipped -> recalibrate with a wider range, or int16")
    if d.get("clipped_share", 0) > CLIP_SHARE and d.get("relu_follows"):
        extra = "the Relu after it zeroes them anyway"
        return (f"{100 * d['clipped_share']:.2f}% of values fall below the range's start and are clipped; "
                f"{extra}, so the cut is harmless")
    levels = d.get("bulk_levels")
    if levels is not None and levels < few_levels(d["bit"]):
        return (f"99.9% of values span only {levels:.0f} of the {2 ** d['bit']} levels: rare large values "
                "stretch the range -> int16, or fix the model (clip/normalise the tail)")
    if d["max_abs"] and d["threshold"] > 4 * d["max_abs"] and d["role"] != "bias":
        return (f"the calibration range is {d['threshold'] / d['max_abs']:.0f}x wider than the data on these "
                "samples: the samples may not match the calibration data")
    return "the range fits the data: per-tensor quantization looks adequate here"


def _plot_activation(d, path, title):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=100)
    _stairs(ax, d["hist"], f"float input '{d['tensor']}'", "#4c72b0")
    ax.plot([d["peak"]], [0.03], marker="^", markersize=11, color="#1f3f8f", clip_on=False, linestyle="none",
            label=f"max |x| = {_fmt(d['max_abs'])}", zorder=5, transform=ax.get_xaxis_transform())
    span = max(abs(d["min"] or 0), abs(d["max"] or 0), 1e-12)
    if max(abs(d["range_lo"]), abs(d["range_hi"])) <= 20 * span:
        ax.axvline(d["range_lo"], color="#c0392b", ls="--", lw=1.4,
                   label=f"calibration range [{_fmt(d['range_lo'])}, {_fmt(d['range_hi'])}]")
        ax.axvline(d["range_hi"], color="#c0392b", ls="--", lw=1.4)
        lo_x, hi_x = ax.get_xlim()
        ax.axvspan(lo_x, d["range_lo"], color="#c0392b", alpha=0.06)
        ax.axvspan(d["range_hi"], hi_x, color="#c0392b", alpha=0.06)
        ax.set_xlim(lo_x, hi_x)
    harmless = " (Relu follows)" if d.get("relu_follows") and d["clipped_low"] else ""
    text = (f"max |x|: {_fmt(d['max_abs'])}   threshold: {_fmt(d['threshold'])}\n"
            f"clipped: {100 * d['clipped_share']:.3f}% ({d['clipped_count']} of {d['count']}){harmless}\n"
            f"scale: {_fmt(d['scale'])}   99.9% of values span {_fmt(d['bulk_levels'])} levels")
    ax.text(0.01, 0.97, text, transform=ax.transAxes, va="top", fontsize=8, family="monospace",
            bbox=dict(boxstyle="round", facecolor="white", alpha=0.85))
    ax.set_xlabel("value")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, alpha=0.3)
    heading = wrap(title, 10) + "\n" + wrap(activation_reading(d), 10)
    ax.set_title(heading, fontsize=10)
    _margins(fig, heading, 4.8)
    save_figure(fig, path, tight=False)


def _plot_pair(d, path, title, left_a, left_b, labels, note=None):
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), dpi=100)
    known = d.get("compared_against") != "dequantized weight"
    _stairs(ax1, left_a["hist"], labels[0], "#4c72b0")
    if known:
        _stairs(ax1, left_b["hist"], labels[1], "#dd8452", fill=False)
    if d["kind"] == "weight":
        span = max(abs(left_a["min"] or 0), abs(left_a["max"] or 0), 1e-12)
        if max(abs(d["range_lo"]), abs(d["range_hi"])) <= 20 * span:
            ax1.axvline(d["range_lo"], color="#c0392b", ls="--", lw=1.2,
                        label=f"quantization range [{_fmt(d['range_lo'])}, {_fmt(d['range_hi'])}]")
            ax1.axvline(d["range_hi"], color="#c0392b", ls="--", lw=1.2)
    ax1.plot([left_a["peak"]], [0.03], marker="^", markersize=10, color="#1f3f8f", linestyle="none",
             clip_on=False, label=f"max |x| = {_fmt(left_a['max_abs'])}", zorder=5,
             transform=ax1.get_xaxis_transform())
    ax1.set_xlabel("value")
    ax1.legend(loc="upper right", fontsize=8)
    ax1.grid(True, alpha=0.3)
    ax1.set_title("values", fontsize=10)
    err = d["error"]
    if not known:
        ax2.text(0.5, 0.5, "float weight unknown:\nthe quantization error cannot be measured.\n"
                 "Pass the float model (float_model= / --float-model).", ha="center", va="center",
                 transform=ax2.transAxes, fontsize=11)
        ax2.set_axis_off()
    else:
        _stairs(ax2, err["hist"], "quantized - float", "#c44e52")
        if d["kind"] == "weight" and not d["per_channel"]:
            ax2.axvline(-d["scale"] / 2, color="grey", ls=":", lw=1, label="+-scale/2 (rounding bound)")
            ax2.axvline(d["scale"] / 2, color="grey", ls=":", lw=1)
        ax2.set_xlabel("error (quantized - float)")
        ax2.legend(loc="upper right", fontsize=8)
        ax2.grid(True, alpha=0.3)
        ax2.set_title("error", fontsize=10)
        text = (f"cosine: {d['cosine-similarity']:.6f}   SQNR: {_fmt(d['sqnr'])} dB\n"
                f"max |error|: {_fmt(err['max_abs'])}   rmse: {_fmt(d['rmse'])}\n"
                f"mean error: {_fmt(err['mean'])}")
        if d.get("worst_channel") is not None:
            text += f"\nworst channel: {d['worst_channel']} at {_fmt(d['worst_channel_sqnr'])} dB"
        ax2.text(0.01, 0.97, text, transform=ax2.transAxes, va="top", fontsize=8, family="monospace",
                 bbox=dict(boxstyle="round", facecolor="white", alpha=0.85))
    heading = wrap(title, 13) + ("\n" + wrap(note, 13) if note else "")
    fig.suptitle(heading, fontsize=10)
    _margins(fig, heading, 4.8, extra=0.28)
    save_figure(fig, path, tight=False)


def weight_issue(d, box=None):
    """``(remedies, reason)`` for a weight's statistics (and box plot, when drawn); the
    remedies are empty when the weight quantizes cleanly."""
    if d.get("note"):
        return ["keep in float"], "float weight unknown: pass the float model to judge the weight itself"
    if d["role"] == "bias":
        return [], "int32 bias: its quantization error is negligible"
    worst, whole, levels = d.get("worst_channel_sqnr"), d["sqnr"], d.get("bulk_levels")
    starved_bulk = levels is not None and levels < few_levels(d["bit"])
    if not d["per_channel"]:
        if worst is not None and worst < WEAK_SQNR_DB and whole - worst > 6:
            return ["per-channel"], (f"channel {d['worst_channel']} keeps only {worst:.1f} dB SQNR (whole tensor "
                                     f"{whole:.1f} dB): a few wide channels set the per-tensor scale -> per-channel weights")
        if box and "skipped" not in box and box["outlier_channels"]:
            return ["per-channel"], channel_reading(box)
        if starved_bulk:
            return ["per-channel"], (f"99.9% of the weights span {levels:.0f} of {2 ** d['bit']} levels: a few "
                                     "large weights set the scale -> per-channel weights")
    if whole < WEAK_SQNR_DB:
        return ["int16", "fix the model"], (f"SQNR {whole:.1f} dB at {d['bit']} bits: too few levels for this "
                                            "weight -> more bits (int8/int16), or QAT")
    if worst is not None and worst < WEAK_SQNR_DB:
        return ["int16", "fix the model"], (f"channel {d['worst_channel']} keeps only {worst:.1f} dB even per "
                                            "channel -> int16 weights, or QAT")
    if starved_bulk:
        return ["int16", "fix the model"], (f"99.9% of the weights span {levels:.0f} of {2 ** d['bit']} levels "
                                            "even per channel -> int16 weights, or QAT")
    tail = f", worst channel {worst:.1f} dB" if worst is not None else ""
    return [], f"SQNR {_fmt(whole)} dB{tail}: the weight quantizes cleanly"


def weight_reading(d):
    """One line saying what a weight's histogram means for quantization."""
    return weight_issue(d)[1]


def draw_distribution(d, save_dir):
    """Write one node's distribution PNG under ``save_dir``; returns its path."""
    path = Path(save_dir) / f"distribution_{_slug(d['node'])}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    if d["kind"] == "activation":
        where = "per channel" if d["per_channel"] else "per tensor"
        title = (f"{d['node']}: activation input '{d['tensor']}' in the float model, {d['samples']} sample(s) "
                 f"- {d['dtype']} ({d['bit']}-bit, {where})")
        _plot_activation(d, path, title)
    elif d["kind"] == "weight":
        where = f"per channel (axis {d['axis']})" if d["per_channel"] else "per tensor"
        known = d["compared_against"] == "float weight"
        what = "float vs dequantized" if known else "dequantized only (float unknown)"
        title = (f"{d['node']}: weight '{d['tensor']}' {what} - {d['dtype']} ({d['bit']}-bit, "
                 f"{where}), feeds {', '.join(d['feeds']) or '-'}")
        _plot_pair(d, path, title, d["float"], d["dequantized"],
                   ["float weight" if known else "dequantized weight", "dequantized weight"],
                   note=weight_reading(d))
    else:
        title = (f"{d['node']} ({d['op_type']}): output '{d['tensor']}', float model vs fully quantized, "
                 f"{d['samples']} sample(s)")
        _plot_pair(d, path, title, d["float"], d["quantized"], ["float model", "fully quantized model"],
                   note=f"output cosine {d['cosine-similarity']:.6f} with every pair quantized")
    return str(path)


def draw_channelwise(d, save_dir):
    """Write one node's per-channel box plot under ``save_dir``; returns its path."""
    path = Path(save_dir) / f"channelwise_{_slug(d['node'])}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    what = "float weight" if d["kind"] == "weight" else "float input"
    if d["kind"] == "weight" and d.get("compared_against") == "dequantized weight":
        what = "dequantized weight (float unknown)"
    where = "per channel" if d["per_channel"] else "per tensor"
    samples = f", {d['samples']} sample(s)" if d["kind"] == "activation" else ""
    title = (f"{d['node']}: {what} '{d['tensor']}' by channel (axis {d['axis']} of {d['shape']}, "
             f"{d['channels']} channels{samples}) - {d['dtype']} {where}")
    plot_channels(d, path, title)
    return str(path)


# -- public API ---------------------------------------------------------------------------
def plot_distribution(save_dir, model_or_file, calibrated_data=None, nodes_list=None, data_num=None,
                      float_model=None, bins=HIST_BINS, progress=False):
    """Histograms of the chosen nodes, one PNG per node under ``save_dir``.

    Returns ``{node: statistics}`` in the order given: ``hist`` (``counts`` and ``edges``,
    ``bins`` equal-width bins over the exact min..max), ``max_abs``, ``min``, ``max``,
    ``mean``, ``std``, ``count``; for calibration nodes ``threshold``, ``range_lo``/``range_hi``
    (the representable range), ``clipped_share`` (values beyond it by more than half a step),
    ``bit``, ``dtype``; for weights and
    normal nodes the compared histograms and ``error`` with cosine, SQNR (dB) and max error.
    ``png`` is the written file.
    """
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    names = _resolve(engine.qmodel, nodes_list, "plot_distribution")
    dist, _ = collect(engine, names, (), data_num=data_num, bins=bins, progress=progress)
    for d in dist.values():
        d["png"] = draw_distribution(d, save_dir)
    return dist


def get_channelwise_data_distribution(save_dir, model_or_file, calibrated_data=None, nodes_list=None,
                                      axis=None, data_num=None, float_model=None, outlier_k=OUTLIER_K,
                                      progress=False):
    """Box plot per channel of each calibration node's input, one PNG per node.

    ``axis`` is the channel axis (inferred when None, see :mod:`pytest_ptq.channelwise`).
    Returns ``{node: statistics}`` with lists indexed by channel (``q1``, ``median``, ``q3``,
    ``whisker_lo``/``whisker_hi`` at 1.5 IQR, ``mean``, ``min``, ``max``, ``max_abs``) and
    ``outlier_channels``: channels whose max |x| exceeds ``outlier_k`` times the median
    channel's, widest first, with ``outlier_ratios``.
    """
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    names = _resolve(engine.qmodel, nodes_list, "get_channelwise_data_distribution")
    _, boxes = collect(engine, (), names, axis=axis, data_num=data_num, outlier_k=outlier_k,
                       progress=progress)
    for d in boxes.values():
        d["png"] = draw_channelwise(d, save_dir)
    return boxes


# -- command line ---------------------------------------------------------------------------
def node_names(values):
    """CLI node lists in either form: ``-n a b`` or the seed's ``-n "['a','b']"``."""
    out = []
    for v in values or []:
        for part in re.split(r"[,\s]+", v.strip().strip("[]")):
            part = part.strip().strip("'\"")
            if part:
                out.append(part)
    return out


def _register():
    from . import cli

    @cli.subcommand("plot-distribution", "histogram a node's data: activation input vs its calibration "
                    "range, float vs dequantized weight, or float vs quantized output")
    def cmd_distribution(args):
        from .tables import format_table

        engine = cli._engine(args)
        dist = plot_distribution(args.save_dir, engine, nodes_list=node_names(args.nodes),
                                 bins=args.bins, progress=not args.quiet)
        rows = [{"node": k, "kind": d["kind"], "tensor": d["tensor"], "max_abs": d["max_abs"],
                 "threshold": d.get("threshold", ""), "clipped %": 100 * d["clipped_share"]
                 if d.get("clipped_share") is not None else "", "bit": d.get("bit", ""),
                 "cosine": d.get("cosine-similarity", "")} for k, d in dist.items()]
        print(format_table(rows, ["node", "kind", "tensor", "max_abs", "threshold", "clipped %", "bit", "cosine"]))
        for d in dist.values():
            print(f"wrote {d['png']}")
        _maybe_json(args, dist)

    def configure_distribution(p):
        cli._common(p)
        p.add_argument("-n", "--nodes", nargs="+", required=True, metavar="NODE",
                       help="calibration or normal nodes to plot (also the seed's \"['a','b']\" form)")
        p.add_argument("-s", "--save-dir", default="ptq_debug_output", help="Default: ptq_debug_output")
        p.add_argument("--bins", type=cli._positive_int, default=HIST_BINS,
                       help=f"histogram bins. Default: {HIST_BINS}")
        p.add_argument("--json", default=None, metavar="OUT", help="also save the statistics as JSON")

    cmd_distribution.configure = configure_distribution

    @cli.subcommand("get-channelwise-data-distribution",
                    "box plot per channel of a calibration node's input; names outlier channels")
    def cmd_channelwise(args):
        from .tables import format_table

        engine = cli._engine(args)
        boxes = get_channelwise_data_distribution(args.save_dir, engine, nodes_list=node_names(args.nodes),
                                                  axis=args.axis, outlier_k=args.outlier_k,
                                                  progress=not args.quiet)
        rows = [{"node": k, "tensor": d["tensor"], "axis": d["axis"], "channels": d["channels"],
                 "outlier channels": ",".join(map(str, d["outlier_channels"][:10])) or "-"}
                for k, d in boxes.items()]
        print(format_table(rows, ["node", "tensor", "axis", "channels", "outlier channels"]))
        for d in boxes.values():
            print(f"wrote {d['png']}")
        _maybe_json(args, boxes)

    def configure_channelwise(p):
        cli._common(p)
        p.add_argument("-n", "--nodes", nargs="+", required=True, metavar="NODE",
                       help="calibration nodes (also the seed's \"['a','b']\" form)")
        p.add_argument("--axis", type=int, default=None,
                       help="channel axis of the input. Default: inferred (1 for NCHW, last for [B, T, C])")
        p.add_argument("--outlier-k", type=float, default=OUTLIER_K,
                       help=f"a channel is an outlier when its max|x| exceeds K x the median channel's. "
                            f"Default: {OUTLIER_K:g}")
        p.add_argument("-s", "--save-dir", default="ptq_debug_output", help="Default: ptq_debug_output")
        p.add_argument("--json", default=None, metavar="OUT", help="also save the statistics as JSON")

    cmd_channelwise.configure = configure_channelwise


def _maybe_json(args, result):
    if args.json:
        import json

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")


_register()

"""Gathering the statistics behind the distribution and box plots, in one sweep.

Memory: one pass over the samples gives exact counts, extremes, moments and clipped
shares; histogram bins are then fixed from the exact range. The samples' tensors are kept
for the histograms while they fit in ``CACHE_BYTES``; beyond, a second pass recomputes
them, so memory stays bounded by one sample plus the per-channel reservoirs
(see :mod:`pytest_ptq.channelwise`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import params
from ..channelwise import OUTLIER_K, ChannelStats, channel_axis
from ..model import grids
from ..errors import PTQError, unknown
from ..progress import Progress
from ..results import plain
from ..sensitivity import sample_indices

HIST_BINS = 128
CACHE_BYTES = 256 * 2**20
# Share of values left out at each end when measuring the "bulk" range of a tensor.
BULK_TAIL = 0.0005


class _Values:
    """Exact scalars of a stream of arrays, then a histogram over fixed edges."""

    def __init__(self, get, bounds=None):
        # bounds(shape) -> (lo, hi) broadcast against an array of that shape: values outside are clipped
        self.get, self.bounds = get, bounds
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
        if self.bounds is not None:
            lo, hi = self.bounds(a.shape)
            self.clipped_lo += int(np.count_nonzero(a < lo))
            self.clipped_hi += int(np.count_nonzero(a > hi))

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
        if self.bounds is not None:
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


class _Codes:
    """Counts of the grid codes a stream of arrays quantizes to, for the levels it really uses,
    and of the codes a 16-bit grid over the same range would give them: whether int16 helps
    a starved bulk or the range is set by values no grid of that size resolves (a mask's
    -3.4e38, say)."""

    WIDE = 16

    def __init__(self, get, c):
        self.get, self.c, self.counts, self.wide = get, c, None, None

    def first(self, vals):
        x = self.get(vals)
        counts = self.c.code_counts(x)
        if counts is not None:
            self.counts = counts if self.counts is None else self.counts + counts
            if self.c.grid.bits < self.WIDE:
                wide = self.c.code_counts(x, self.WIDE)
                if wide is not None:
                    self.wide = wide if self.wide is None else self.wide + wide

    def prepare(self):
        return False

    def result(self):
        if self.counts is None:
            return {}
        out = grids.code_usage(self.counts, self.c.grid.levels, BULK_TAIL)
        if self.wide is not None:
            out["bulk_codes_16"] = grids.code_usage(self.wide, 2 ** self.WIDE, BULK_TAIL)["bulk_codes"]
        return out


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

    def __init__(self, get, stats, axis_of, skip_unboxable=False, what=""):
        self.get, self.stats, self.axis_of, self.skip, self.what = get, stats, axis_of, skip_unboxable, what
        self.error = None

    def first(self, vals):
        if self.error is not None:
            return
        a = self.get(vals)
        if np.size(a) == 0:  # an empty sample tells no channel axis and holds no values
            self.stats.shape = self.stats.shape or list(np.shape(a))
            return
        try:
            if self.stats.axis is None:
                self.stats.axis = self.axis_of(a)
            self.stats.add(a)
        except PTQError as exc:
            if not self.skip:
                raise PTQError(f"{self.what}: {exc}" if self.what and self.what not in str(exc) else str(exc)) \
                    from None
            self.error = str(exc)

    def prepare(self):
        return False


def _sweep(engine, indices, float_tensors, quant_tensors, accs, bar):
    """Feed every sample's tensors to the accumulators (two passes where they need one)."""
    def fetch(i):
        vals = {}
        if float_tensors:
            vals.update({("f", t): v for t, v in engine.tensors(i, (), float_tensors).items()})
        if quant_tensors:
            vals.update({("q", t): v for t, v in engine.tensors(i, "all", quant_tensors).items()})
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
def resolve_nodes(qm, nodes_list, what):
    names = params.names(nodes_list, "nodes_list")
    if not names:
        raise PTQError(f"{what} needs nodes_list: the calibration or normal node names to plot "
                       "(list them with `ptq-debug list-nodes MODEL`)")
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
    """(float weight or None, dequantized weight) of weight calibration node ``c``.

    The float weight is the float model's where the alignment found it (a weight stored
    quantized, or one already rounded onto the grid), else the float tensor behind the pair.
    """
    stored = qm.constant(c.input)
    if stored is None:
        raise PTQError(f"weight {c.name!r} of {qm.source!r} has no constant input {qm.shown_name(c.input)!r}")
    if c.q_node is not None:
        stored = np.asarray(stored, dtype=np.float32)
        deq = c.fake_quant(stored)
        w = stored
    else:
        deq = c.dequantize(stored)
        w = None
    if c.float_weight:
        w = qm.float_weights[c.float_weight]
    return (None if w is None else np.asarray(w, dtype=np.float32)), deq


def clip_bounds(c):
    """``bounds(shape)``: values below the first or above the second are clipped, beyond the
    representable range by more than half a step, so their error exceeds rounding's."""
    def bounds(shape):
        lo, hi = c.bounds(shape)
        half = c.half_step(shape)
        return lo - half, hi + half

    return bounds


def _describe(qm, c):
    dtype, threshold, lo, hi = qm.shown_grid(c)  # reduce_range's weights: on their half grid
    return {"kind": c.kind, "tensor": qm.shown_name(c.input), "bit": c.bit, "wider": qm.wider_type(c), "dtype": dtype,
            "per_channel": c.per_channel, "block_size": c.block_size or None, "axis": c.axis, "threshold": threshold,
            "range_lo": float(np.min(lo)), "range_hi": float(np.max(hi)),
            "scale": float(np.max(np.abs(c.scale))), "role": c.role, "feeds": qm.counts_for(c.name),
            "takes_per_channel": qm.takes_per_channel(c), "float_grid": c.grid.is_float}


# -- collection ---------------------------------------------------------------------------
def collect(engine, dist_nodes=(), box_nodes=(), axis=None, data_num=None, bins=HIST_BINS,
            outlier_k=OUTLIER_K, progress=False, skip_unboxable=False):
    """Statistics for the distribution and box plots of the given nodes, from one sweep.

    Returns ``(distributions, channelwise)``: dicts keyed by node name, JSON-safe, without
    the plots (see :func:`plot_distribution`, :func:`get_channelwise_data_distribution`).
    With ``skip_unboxable``, a node without a channel axis gets ``{"skipped": reason}``
    instead of raising.
    """
    bins = params.bins(bins)
    axis = params.axis(axis)
    outlier_k = params.positive(outlier_k, "outlier_k")
    params.data_num(data_num)
    qm = engine.qmodel
    for name in box_nodes:
        if name not in qm.calibration:
            feeds = qm.quantizing(name) if name in qm.normal else []
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
            info = {"node": name, **_describe(qm, c)}
            if c.kind == "weight":
                dist[name] = _weight_distribution(qm, c, info, bins)
                continue
            need(float_t, c.input)
            # only Relus read the pair's values: a graph output or a subgraph reading them sees
            # the clipped negatives as lost
            readers = [n for o in c.outputs for n in qm.readers(o)]
            info["relu_follows"] = bool(readers) and all(n.op_type == "Relu" for n in readers) and not any(
                o in qm.output_names for o in c.outputs)
            v = _Values(lambda vals, c=c: c.as_float_model_has_it(vals[("f", c.input)]), clip_bounds(c))
            codes = _Codes(lambda vals, c=c: c.as_float_model_has_it(vals[("f", c.input)]), c)
            accs += [_Group([v], bins), codes]
            plans[name] = ("activation", info, (v, codes))
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
            info = {"node": name, "kind": "node", "op_type": n.op_type, "tensor": qm.shown_name(t),
                    "calibration_inputs": qm.quantizing(name), "probed": t}
            plans[name] = ("node", info, (fv, qv, ev, pair))
    errors = {}
    for name in box_nodes:
        c = qm.calibration[name]
        info = {"node": name, **_describe(qm, c)}
        _, _, lo, hi = qm.shown_grid(c)
        info.update(range_lo=np.asarray(lo).reshape(-1).tolist() if c.per_channel else float(np.min(lo)),
                    range_hi=np.asarray(hi).reshape(-1).tolist() if c.per_channel else float(np.max(hi)),
                    range_axis=c.axis)
        stats = ChannelStats(None, shown_axis=lambda k, shape, c=c: qm.file_layout(c.input, shape, k)[1])
        boxes[name] = (info, stats)
        if c.kind == "weight":
            w, deq = weight_arrays(qm, c)
            info["compared_against"] = "float weight" if w is not None else "dequantized weight"
            chan = _Channels(lambda v: v, stats, lambda a, c=c: channel_axis(qm, c, np.shape(a), axis),
                             skip_unboxable, f"{name!r}")
            chan.first(w if w is not None else deq)
            errors[name] = chan
            continue
        need(float_t, c.input)
        chan = _Channels(lambda vals, c=c: c.as_float_model_has_it(vals[("f", c.input)]), stats,
                         lambda a, c=c: channel_axis(qm, c, np.shape(a), axis, a), skip_unboxable,
                         f"input {qm.shown_name(c.input)!r} of {name!r}")
        accs.append(chan)
        errors[name] = chan
    if accs:
        indices = sample_indices(engine, data_num)
        with Progress(len(indices), "distributions", enabled=progress) as bar:
            _sweep(engine, indices, float_t, quant_t, accs, bar)
        for names in (float_t, quant_t):  # read once: their sessions go (see Engine.tensors)
            engine.forget_tensors(names)
        samples = len(indices)
    else:
        samples = 0
    for name, (kind, info, acc) in plans.items():
        info["samples"] = samples
        if kind == "activation":
            r = acc[0].result()
            info.update(r, **acc[1].result())
            _in_file(qm, qm.calibration[name].input, info, r["shape"])
            if info["kind"] == "dynamic":
                info.update(_dynamic_range(r))
            info["bulk_levels"] = _levels(info, r)
            if not r["count"] and not r["nonfinite"]:
                info["skipped"] = empty(info["tensor"], info["shape"], "draw")
            # a Relu after the pair zeroes what is clipped below a range starting at <= 0 anyway
            harmless = info["relu_follows"] and info["range_lo"] <= 0
            info["effective_clipped_share"] = (r["clipped_high"] if harmless else r["clipped_count"]) / max(r["count"], 1)
        else:
            fv, qv, ev, pair = acc
            err = ev.result()
            info.update(float=fv.result(), quantized=qv.result(), error=err, **pair.result(err))
            probed = info.pop("probed")  # a layout node's output in the tool's copy: a moved pair's tensor
            for part in ("float", "quantized", "error"):
                _in_file(qm, probed, info[part], info[part]["shape"])
            info["max_abs"] = info["float"]["max_abs"]
            if not info["float"]["count"] and not info["float"]["nonfinite"]:
                info["skipped"] = empty(info["tensor"], info["float"]["shape"], "draw")
        dist[name] = info
    out_boxes = {}
    for name, (info, stats) in boxes.items():
        if errors[name].error is not None:
            out_boxes[name] = {"node": name, "kind": info["kind"], "skipped": errors[name].error}
            continue
        if stats.channels is None:
            why = empty(info["tensor"], qm.file_layout(qm.calibration[name].input, stats.shape)[0], "box-plot")
            if not skip_unboxable:
                raise PTQError(f"node {name!r}: {why}")
            out_boxes[name] = {"node": name, "kind": info["kind"], "skipped": why}
            continue
        info.update(stats.result(outlier_k), axis=stats.axis, samples=samples if info["kind"] != "weight" else 0)
        _in_file(qm, qm.calibration[name].input, info, stats.shape)
        out_boxes[name] = info
    if axis is not None and out_boxes and all("skipped" in d for d in out_boxes.values()):
        # an axis no node has is the caller's mistake, not a node's shape: skipping them all
        # would draw no box plot and still succeed
        first = next(iter(out_boxes.values()))["skipped"]
        raise PTQError(f"no node has axis {axis}: {first}")
    order = list(dict.fromkeys(list(dist_nodes)))
    return ({k: plain(dist[k]) for k in order}, {k: plain(out_boxes[k]) for k in dict.fromkeys(box_nodes)})


def _in_file(qm, tensor, info, shape):
    """Set ``info``'s shape and axes (the values of ``tensor`` have ``shape`` in the tool's
    copy) to the user's file's layout: a moved pair's tensor is laid out otherwise there
    (:meth:`QuantModel.file_layout`); channel indices along an axis stay as they are."""
    for key in ("axis", "range_axis", "channel_axis"):
        if info.get(key) is not None and shape is not None:
            info[key] = qm.file_layout(tensor, shape, info[key])[1]
    info["shape"] = qm.file_layout(tensor, shape)[0]


def empty(tensor, shape, what):
    """Why a tensor with no values on any sample (a zero-size initializer, an empty Slice) has
    no figure: the skip note of its distribution or box plot."""
    shown = "" if shape is None else f" (shape {list(shape)})"
    return f"{tensor!r} is empty{shown}: there are no values to {what}"


def _dynamic_range(r):
    """A dynamic quantizer's widest per-run range: DynamicQuantizeLinear spans each run's
    values and 0, so the extremes over every sample bound the range of any one run."""
    if not r["count"]:
        return {}
    lo, hi = min(0.0, r["min"]), max(0.0, r["max"])
    return {"range_lo": lo, "range_hi": hi, "scale": (hi - lo) / 255, "threshold": max(-lo, hi)}


def _levels(info, r):
    """Quantization levels spanned by the bulk of the values (all but the thinnest tails)."""
    if r["bulk_lo"] is None or not info["scale"]:
        return None
    return float((r["bulk_hi"] - r["bulk_lo"]) / info["scale"])


def _weight_distribution(qm, c, info, bins):
    w, deq = weight_arrays(qm, c)
    ref = w if w is not None else deq
    if ref.size == 0:  # a zero-size weight: no values, no channels to score
        _in_file(qm, c.input, info, ref.shape)
        info.update(samples=0, count=0, max_abs=0.0, skipped=empty(info["tensor"], info["shape"], "draw"))
        return info
    fv = _Values(lambda v: v["w"], clip_bounds(c))
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
    codes = _Codes(lambda v: v, c)
    codes.first(ref)
    info.update(codes.result())
    info.update(_channel_sqnr(qm, c, ref, deq))
    _in_file(qm, c.input, info, ref.shape)
    if w is None:
        info["note"] = ("float weight unknown (stored quantized, no float model given): compared "
                        "against the dequantized weight, so the error is zero by construction")
    return info


_DEAD_SHARE = 1e-4  # a channel's energy below this share of the median channel's: near dead


def _channel_sqnr(qm, c, w, deq):
    """SQNR (dB) of each output channel: a per-tensor scale set by one wide channel shows up
    as a weak channel even when the whole tensor's SQNR looks fine."""
    none = {"channel_axis": None, "channel_sqnr": None, "worst_channel": None, "worst_channel_sqnr": None,
            "widest_channel": None, "widest_ratio": None}
    if w.size == 0:  # no channel holds a value (a zero-size weight)
        return none
    try:
        ax = channel_axis(qm, c, w.shape)
    except PTQError:
        return none
    wf = np.moveaxis(w.astype(np.float64), ax, 0).reshape(w.shape[ax], -1)
    ef = np.moveaxis(deq.astype(np.float64), ax, 0).reshape(w.shape[ax], -1) - wf
    signal, noise = (wf * wf).sum(axis=1), (ef * ef).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        db = np.where(noise > 0, 10 * np.log10(np.where(signal > 0, signal, 1e-300) / noise), np.inf)
    db = np.where((signal == 0) & (noise > 0), -np.inf, db)
    # a channel of almost nothing (pruned, or nearly) rounds to zero and reads 0 dB, but its
    # loss is nothing next to the others': the worst channel is among those that carry energy
    carried = signal >= _DEAD_SHARE * np.median(signal[signal > 0]) if np.any(signal > 0) else np.ones(len(db), bool)
    worst = int(np.flatnonzero(carried)[np.argmin(db[carried])]) if carried.any() else int(np.argmin(db))
    # the channel whose range sets a per-tensor scale: the one the box plot marks widest
    peak = np.abs(wf).max(axis=1) if wf.size else np.zeros(len(wf))
    live = peak[peak > 0]
    widest = int(np.argmax(peak)) if peak.size else None
    ratio = float(peak[widest] / np.median(live)) if widest is not None and live.size else 0.0
    return {"channel_axis": ax, "channel_sqnr": db.tolist(), "worst_channel": worst,
            "worst_channel_sqnr": float(db[worst]), "widest_channel": widest, "widest_ratio": ratio,
            "near_dead_channels": int(len(db) - carried.sum())}

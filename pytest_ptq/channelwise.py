"""Per-channel statistics of a calibration node's input, and their box plot.

The seed reads these plots for one thing: a channel whose range dwarfs the others makes a
per-tensor scale waste most of its levels on the rest ("per-tensor risk"), so the node
wants per-channel quantization, a wider type, or a model fix.

Channel axis, when not given:

1. the axis of a per-channel quantized node;
2. weights: the output-channel axis of the op they feed (Conv 0, ConvTranspose 1, Gemm 0
   with transB else 1, MatMul last), otherwise the first axis longer than 1 (a broadcast
   operand ``[1, C, 1, 1]`` of a Mul has its channels on axis 1);
3. activations: 1 when a consumer or the producer is a channel-first op (Conv, pooling,
   BatchNormalization, ...), the last axis when it is MatMul/Gemm/LayerNormalization;
4. otherwise, the axis of a Concat that wrote the tensor (seen through Q/DQ) from parts whose
   magnitudes differ 10x or more (``[1, 4 + classes, anchors]`` of a YOLOv8 head, boxes in
   pixels beside scores in 0..1); else rule 3 for the nearest such op reached through ops
   that keep the layout (elementwise ops, Slice, Pad: a Conv1d's ``[N, C, T]`` output
   behind a Slice and a Pow keeps its channels on axis 1); else 1 for rank >= 4 (NCHW) and
   the last axis for rank 2 and 3 ([N, C] and the transformer layout [B, T, C]);
5. a tensor of rank below 2 has no channel axis: pass ``axis`` explicitly.

Memory: exact per-channel count, min, max, mean and max |x|; quartiles and whiskers come
from a uniform reservoir sample of each channel (``reservoir_size`` values, exact while a
channel has no more values than that).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import PTQError
from .figures import drawing, pyplot, save_figure, wrap
from .outputs import layouts, unlike

# A channel is an outlier when its max |x| exceeds OUTLIER_K times the median over channels
# of max |x| (channels that are all zero excluded): at 8x a per-tensor scale leaves the
# typical channel 1/8 of the levels, i.e. 3 bits fewer.
OUTLIER_K = 8.0
# Reservoir values kept per channel, and the cap on all channels together (elements).
RESERVOIR = 4096
RESERVOIR_TOTAL = 16 * 2**20
# Beyond this ratio of the widest channel's max |x| to the median channel's, a linear axis
# flattens every ordinary channel to a line at 0: the y axis turns symmetric-log, linear
# within the median channel's max |x|.
SYMLOG_RATIO = 100.0
BOXES_PER_PANEL = 64
PANELS_MAX = 4  # beyond BOXES_PER_PANEL * PANELS_MAX channels, the plot summarises

_CHANNEL_FIRST = {"Conv", "ConvTranspose", "BatchNormalization", "InstanceNormalization",
                  "GlobalAveragePool", "GlobalMaxPool", "AveragePool", "MaxPool", "LpPool",
                  "Resize", "Upsample", "DepthToSpace", "SpaceToDepth", "PRelu", "LRN",
                  "GroupNormalization", "ConvInteger", "QLinearConv"}
_CHANNEL_LAST = {"MatMul", "Gemm", "LayerNormalization", "MatMulInteger", "QLinearMatMul"}
# Ops whose output keeps its input's layout (elementwise, a Slice, a Pad, the Q/DQ pairs):
# a tensor reached through them has the channels of the op that set that layout.
_KEEPS_LAYOUT = {"Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu",
                 "Selu", "Softplus", "Erf", "Gelu", "Abs", "Neg", "Sqrt", "Exp", "Log", "Reciprocal", "Pow", "Add",
                 "Sub", "Mul", "Div", "Max", "Min", "Slice", "Pad", "Identity", "Cast", "Dropout",
                 "QuantizeLinear", "DequantizeLinear"}
LAYOUT_HOPS = 8  # tensors walked from a calibration input looking for the op that set its layout


def channel_axis(qm, c, shape, axis=None, value=None):
    """The channel axis (non-negative) of calibration node ``c``'s input of ``shape`` (one
    sample's ``value`` of it, when given, tells a concatenation of unlike parts: rule 4).

    Raises PTQError when ``axis`` is out of range or none can be inferred (rank < 2).
    """
    rank = len(shape)
    tensor = qm.shown_name(c.input)
    # a moved pair's tensor is laid out otherwise in the file: what is said and given is the file's
    file_shape, _ = qm.file_layout(c.input, shape)
    shown = shape if file_shape is None else file_shape
    what = f"input {tensor!r} of {c.name!r} has shape {tuple(shown)}"
    if rank == 0:  # one value: no axis at all (axis 0 read as in range divided by 0)
        raise PTQError(f"input {tensor!r} of {c.name!r} is a scalar, so it has no channels to box-plot; its "
                       "histogram (plot-distribution) shows its values")
    if axis is not None:
        if not -len(shown) <= int(axis) < max(len(shown), 1):
            raise PTQError(f"axis {axis} is out of range: {what}; pass an axis in [{-len(shown)}, {len(shown) - 1}]")
        found = qm.tool_axis(c.input, shape, int(axis))
        if found is None:
            raise PTQError(f"axis {axis} of input {tensor!r} of {c.name!r} (shape {tuple(shown)}) is laid out "
                           f"across several axes by the pair's layout node, so it has no channels of its own; pass "
                           "another axis")
        return found
    if c.per_channel and c.axis is not None:
        return c.axis % rank
    if rank < 2:
        raise PTQError(f"{what}, so it has no channel axis to infer; pass axis=0 (--axis 0) to "
                       "box-plot each element as a channel")
    if c.kind == "weight":
        for n in qm.feeds(c.name):
            node = qm.normal.get(n)
            if node is None:
                continue
            if node.op_type == "Conv":
                return 0
            if node.op_type == "ConvTranspose":
                return 1
            if node.op_type == "MatMul":
                return rank - 1
            if node.op_type == "Gemm":
                trans_b = _attr(qm, n, "transB", 0)
                weight_is_b = len(node.inputs) > 1 and node.inputs[1] in c.outputs
                return (0 if trans_b else 1) if weight_is_b else (rank - 1 if _attr(qm, n, "transA", 0) else 0)
        # a broadcast operand of an elementwise op ([1, C, 1, 1], a mask [1, C, H, W]) leads
        # with size-1 axes: boxed along one, it shows one box and hides its outlier channels
        return next((k for k, n in enumerate(shape) if n != 1), 0)
    ops = [qm.normal[n].op_type for n in qm.feeds(c.name)]
    if c.producer in qm.normal:
        ops.append(qm.normal[c.producer].op_type)
    for op in ops:
        if op in _CHANNEL_FIRST:
            return 1
        if op in _CHANNEL_LAST:
            return rank - 1
    found = unlike(value, layouts(qm, c.input)) if value is not None else None
    if found is not None:
        return found[0]  # a detector's boxes beside its scores: the parts are what differ
    through = _layout_through(qm, c.input)
    if through is not None:
        return 1 if through == "first" else rank - 1
    if rank == 4 and c.input in qm.input_names:  # an image as given: NHWC data is common there
        return image_channel_axis(shape)
    return 1 if rank >= 4 else rank - 1


def _layout_through(qm, tensor):
    """``"first"`` or ``"last"``: where the channels are, as the nearest op that sets a layout
    tells, walking from ``tensor`` through ops that keep it (a Conv's output behind a Slice
    and a Pow is still channels-first), up and down the graph; None when none is reached."""
    seen, frontier = {tensor}, [tensor]
    for _ in range(LAYOUT_HOPS):
        ahead = []
        for t in frontier:
            for node in ([qm.producer[t]] if t in qm.producer else []) + list(qm.consumers.get(t, ())):
                if node.op_type in _CHANNEL_FIRST:
                    return "first"
                if node.op_type in _CHANNEL_LAST:
                    return "last"
                if node.op_type in _KEEPS_LAYOUT:
                    fresh = [x for x in (*node.input, *node.output) if x and x not in seen and x not in qm.inits]
                    seen.update(fresh)
                    ahead += fresh
        frontier = ahead
    return None


def image_channel_axis(dims):
    """1 for an image-like NCHW shape, 3 for NHWC (a last axis of 1, 3 or 4 beside a wider
    second one, and not the other way round); 1 when it cannot be told."""
    small = (1, 3, 4)
    if len(dims) == 4 and dims[3] in small and dims[1] not in small:
        return 3
    return 1


def _attr(qm, node_name, name, default):
    proto = next((p for p in qm.model.graph.node if p.name == node_name), None)
    for a in getattr(proto, "attribute", ()):
        if a.name == name:
            return a.i
    return default


class ChannelStats:
    """Accumulates per-channel statistics of one tensor over samples, memory bounded."""

    def __init__(self, axis, reservoir_size=RESERVOIR, seed=0, shown_axis=None):
        self.axis = axis
        # ``shown_axis(axis, shape)``: ``axis`` of a sample of ``shape`` as the user's file lays
        # the tensor out (a moved pair's Transpose lays it elsewhere in the tool's copy), for messages
        self.shown_axis = shown_axis
        self.reservoir_size = reservoir_size
        self.rng = np.random.default_rng(seed)
        self.channels = None
        self.shape = None

    def _start(self, channels):
        self.channels = channels
        self.size = int(max(16, min(self.reservoir_size, RESERVOIR_TOTAL // max(channels, 1))))
        self.res = np.empty((channels, self.size), dtype=np.float32)
        self.filled = 0
        self.seen = 0
        self.count = 0
        self.min = np.full(channels, np.inf)
        self.max = np.full(channels, -np.inf)
        self.total = np.zeros(channels)
        self.max_abs = np.zeros(channels)

    def add(self, array):
        arr = np.asarray(array)
        if self.shape is None:
            self.shape = list(arr.shape)
        if arr.ndim != len(self.shape):
            # a rank-agnostic graph run on samples of several ranks (an input that declares no
            # shape): the axis of one rank is no channel axis of another
            raise PTQError(f"its samples differ in rank ({len(self.shape)} axes in one, {arr.ndim} in another), so "
                           "no axis holds the same channels in all of them; give samples of one rank to box-plot it")
        if arr.size == 0:  # a sample of an empty tensor (an empty Slice): no values, maybe no channels
            return
        block = np.moveaxis(arr, self.axis, 0).reshape(arr.shape[self.axis], -1).astype(np.float32)
        if self.channels is None:
            self._start(block.shape[0])
        elif block.shape[0] != self.channels:
            shown = None if self.shown_axis is None else self.shown_axis(self.axis, self.shape)
            raise PTQError(f"its axis {self.axis if shown is None else shown} has {block.shape[0]} elements in one sample and {self.channels} in "
                           "another, so it is no channel axis (a sequence length?); pass an axis all samples share "
                           "(axis=, --axis)")
        if block.shape[1] == 0:
            return
        self.min = np.minimum(self.min, block.min(axis=1))
        self.max = np.maximum(self.max, block.max(axis=1))
        self.total += block.sum(axis=1, dtype=np.float64)
        self.max_abs = np.maximum(self.max_abs, np.abs(block).max(axis=1))
        self.count += block.shape[1]
        self._reservoir(block)

    def _reservoir(self, block):
        """Algorithm R, the same slot draws for every channel (channels stay independent)."""
        m = block.shape[1]
        take = min(m, self.size - self.filled)
        if take:
            self.res[:, self.filled:self.filled + take] = block[:, :take]
            self.filled += take
        rest = block[:, take:]
        if rest.shape[1]:
            position = self.seen + take + np.arange(rest.shape[1])
            slot = self.rng.integers(0, position + 1)
            keep = np.nonzero(slot < self.size)[0]
            # a later value replacing the same slot wins, as in the sequential algorithm
            slots_rev, cols_rev = slot[keep][::-1], keep[::-1]
            uniq, first = np.unique(slots_rev, return_index=True)
            self.res[:, uniq] = rest[:, cols_rev[first]]
        self.seen += m

    @property
    def exact(self):
        """True when every value is in the reservoir, so quartiles are exact."""
        return self.count <= self.size

    def result(self, outlier_k=OUTLIER_K):
        """Box statistics per channel (lists indexed by channel) and the outlier channels."""
        vals = self.res[:, :self.filled].astype(np.float64)
        q1, med, q3 = np.percentile(vals, [25, 50, 75], axis=1)
        iqr = q3 - q1
        lo_lim, hi_lim = q1 - 1.5 * iqr, q3 + 1.5 * iqr
        whislo = np.where(vals >= lo_lim[:, None], vals, np.inf).min(axis=1)
        whishi = np.where(vals <= hi_lim[:, None], vals, -np.inf).max(axis=1)
        # the exact extremes bound the whiskers when they fall inside the fences
        whislo = np.where(self.min >= lo_lim, self.min, whislo)
        whishi = np.where(self.max <= hi_lim, self.max, whishi)
        mean = self.total / max(self.count, 1)
        live = self.max_abs[self.max_abs > 0]
        reference = float(np.median(live)) if live.size else 0.0
        ratio = self.max_abs / reference if reference > 0 else np.zeros_like(self.max_abs)
        outliers = [int(k) for k in np.argsort(-self.max_abs, kind="stable") if reference > 0 and ratio[k] > outlier_k]
        return {
            "channels": int(self.channels),
            "values_per_channel": int(self.count),
            "exact_quartiles": bool(self.exact),
            "sampled_per_channel": int(min(self.size, self.count)),  # what the quartiles come from
            "q1": q1.tolist(), "median": med.tolist(), "q3": q3.tolist(),
            "whisker_lo": whislo.tolist(), "whisker_hi": whishi.tolist(),
            "mean": mean.tolist(), "min": self.min.tolist(), "max": self.max.tolist(),
            "max_abs": self.max_abs.tolist(),
            "median_channel_max_abs": reference,
            "outlier_k": float(outlier_k),
            "outlier_channels": outliers,
            "outlier_ratios": [float(ratio[k]) for k in outliers],
        }


def lost_bits(ratio, bits=None):
    """Bits of resolution a per-tensor scale costs the median channel next to one ``ratio``x
    wider; at most ``bits``, the grid's own, where given (a channel cannot lose more than it has)."""
    lost = math.log2(ratio) if ratio > 1 else 0.0
    return lost if bits is None else min(lost, float(bits))


@drawing
def plot_channels(stats, path, title, marked=None):
    """Write the box plot of ``stats`` (:meth:`ChannelStats.result` plus the node's fields) to
    ``path``; ``marked``: ``{channel: what}`` for channels a reading names beside the outliers
    (shown among the widest where only those are drawn)."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    C = stats["channels"]
    outliers = set(stats["outlier_channels"])
    if C <= BOXES_PER_PANEL * PANELS_MAX:
        groups = [list(range(s, min(s + BOXES_PER_PANEL, C))) for s in range(0, C, BOXES_PER_PANEL)]
        summary = False
    else:
        widest = list(np.argsort(-np.asarray(stats["max_abs"]), kind="stable")[:48])
        groups = [sorted({int(k) for k in widest} | {k for k in marked or {} if 0 <= k < C})]
        summary = True
    rows = len(groups) + (1 if summary else 0)
    width = max(8.0, min(18.0, 2.5 + 0.22 * max(len(g) for g in groups)))
    heading = wrap(title, width) + "\n" + wrap(reading(stats), width)
    lines = heading.count("\n") + 1
    rotated = max(len(g) for g in groups) > 32
    ncol = 5 if width >= 12 else 3
    # fixed margins (inches) instead of tight_layout, which costs a full extra draw
    top_in, tick_in = 0.15 + 0.17 * lines + (0.25 if summary else 0.0), (0.85 if rotated else 0.55)
    bottom_in = tick_in + 0.1 + 0.2 * math.ceil(5 / ncol)
    panel_in = 2.9
    height = top_in + bottom_in + rows * panel_in + (rows - 1) * tick_in
    fig, axes = plt.subplots(rows, 1, figsize=(width, height), dpi=100, squeeze=False, sharey=True)
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.2 / width, top=1 - top_in / height,
                        bottom=bottom_in / height, hspace=tick_in / panel_in)
    axes = axes[:, 0]
    lo, hi = stats.get("range_lo"), stats.get("range_hi")
    span = max(abs(v) for v in (stats["min"] + stats["max"])) if C else 1.0
    linthresh = symlog_threshold(stats)
    # 150000 as "1.5" beside "value (x 1e5)": whole numbers ran past the fixed margin over the
    # label, and matplotlib's own "1e5" above the axis sat under the title
    power = int(math.floor(math.log10(span))) if linthresh is None and (span >= 1e4 or 0 < span < 1e-3) else 0
    ylabel = (f"value (symlog: linear within ±{linthresh:.3g})" if linthresh is not None else
              f"value (x 1e{power})" if power else "value")
    if summary:
        _band(axes[0], stats, outliers, lo, hi, span)
    for ax, group in zip(axes[1:] if summary else axes, groups):
        _boxes(ax, stats, group, outliers)
        _range_lines(ax, stats, group, lo, hi, span)
        for k, what in (marked or {}).items():
            if k in group:
                x, top = group.index(k) + 1, stats["max"][k]
                ax.plot([x], [top], marker="v", color=_MARKED, markersize=8, zorder=6, linestyle="none")
                ax.annotate(f"{k}: {what}", (x, top), xytext=(0, 9), textcoords="offset points", ha="center",
                            fontsize=7, color=_MARKED, zorder=6)
        ax.tick_params(axis="x", labelsize=7 if len(group) > 32 else 9, rotation=90 if len(group) > 32 else 0)
        ax.set_xlabel("channel (widest 48, by index)" if summary else f"channel (axis {stats['axis']})")
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes:
        if linthresh is not None:
            ax.set_yscale("symlog", linthresh=linthresh, linscale=1.5)
            ax.autoscale_view(scalex=False)  # the margins, in the new scale: the extreme dots sat on the frame
            # plain numbers: the scale's own labels are formulas ($10^{3}$), and figures draw
            # text as written (see figures.drawing); none inside the linear band but 0, where
            # 1, 0 and -1 overlapped
            ax.yaxis.set_major_formatter(FuncFormatter(
                lambda v, _, t=linthresh: "" if 0 < abs(v) < t else f"{v:g}"))
        elif power:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 10 ** power:.4g}"))
        ax.set_ylabel(ylabel)
    handles = [Line2D([], [], color="red", lw=1.5, label="median"),
               Line2D([], [], color="blue", lw=1.2, ls="--", label="mean"),
               Patch(facecolor="#dbe9f6", edgecolor="black", label="q1-q3; whiskers 1.5 IQR; dots min/max" + (
                   "" if stats.get("exact_quartiles", True) else
                   f"\n(quartiles, whiskers: a sample of {stats.get('sampled_per_channel', '?')} of "
                   f"{stats['values_per_channel']} values a channel)")),
               Patch(facecolor="#f4a261", edgecolor="black",
                     label=f"outlier channel (max|x| > {stats['outlier_k']:g}x median channel)")]
    if lo is not None and _drawable(lo, hi, span):
        # each channel's own range: caret marks (a plain dash read as a second median)
        own = _by_channel(stats, lo)
        handles.append(Line2D([], [], color="#c0392b", lw=1, ls=":", marker=7 if own else None,
                              label="each channel's quantization range" if own else "quantization range"))
    if marked:
        handles.append(Line2D([], [], color=_MARKED, marker="v", ls="none", label="channel the reading names"))
    # below the plots: inside, it would hide the tallest boxes, which are the point
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.05 / height), ncol=ncol, fontsize=7,
               frameon=False)
    fig.suptitle(heading, fontsize=10, y=1 - 0.08 / height, va="top")
    save_figure(fig, path, tight=False)
    return path


_MARKED = "#8e44ad"  # a channel a reading names (the worst by SQNR)


def symlog_threshold(stats):
    """The linear range (the median channel's max |x|) of a symmetric-log y axis for a box
    plot whose widest channel reaches SYMLOG_RATIO times that, else None (a linear axis)."""
    ref = stats["median_channel_max_abs"]
    widest = max(stats["max_abs"], default=0.0)
    return float(ref) if ref > 0 and widest > SYMLOG_RATIO * ref else None


def _boxes(ax, stats, group, outliers):
    """Draw one box per channel of ``group`` at x = 1..n with a handful of collections:
    matplotlib's bxp makes seven artists per box, seconds for a few hundred channels."""
    from matplotlib.collections import LineCollection, PolyCollection

    x = np.arange(1, len(group) + 1, dtype=float)
    g = np.asarray(group)
    q1, med, q3 = (np.asarray(stats[k])[g] for k in ("q1", "median", "q3"))
    wlo, whi, mean = (np.asarray(stats[k])[g] for k in ("whisker_lo", "whisker_hi", "mean"))
    vmin, vmax = np.asarray(stats["min"])[g], np.asarray(stats["max"])[g]
    half, cap = 0.3, 0.15
    rects = [[(xi - half, a), (xi + half, a), (xi + half, b), (xi - half, b)] for xi, a, b in zip(x, q1, q3)]
    colours = ["#f4a261" if k in outliers else "#dbe9f6" for k in group]
    ax.add_collection(PolyCollection(rects, facecolors=colours, edgecolors="black", linewidths=0.8, zorder=2))
    whiskers = [[(xi, a), (xi, b)] for xi, a, b in zip(x, q1, wlo)] + [[(xi, a), (xi, b)] for xi, a, b in zip(x, q3, whi)]
    caps = [[(xi - cap, v), (xi + cap, v)] for xi, v in zip(np.r_[x, x], np.r_[wlo, whi])]
    ax.add_collection(LineCollection(whiskers + caps, colors="black", linewidths=0.8, zorder=1))
    ax.add_collection(LineCollection([[(xi - half, v), (xi + half, v)] for xi, v in zip(x, med)],
                                     colors="red", linewidths=1.5, zorder=3))
    ax.add_collection(LineCollection([[(xi - half, v), (xi + half, v)] for xi, v in zip(x, mean)],
                                     colors="blue", linewidths=1.2, linestyles="--", zorder=3))
    low, high = vmin < wlo, vmax > whi
    ax.scatter(np.r_[x[low], x[high]], np.r_[vmin[low], vmax[high]], s=6, facecolors="none",
               edgecolors="grey", linewidths=0.8, zorder=3)
    # an outlier channel's box is often ordinary: its extreme values make it one, so they
    # carry the legend's colour too
    odd = np.asarray([k in outliers for k in group], dtype=bool)
    if odd.any():
        lo_odd, hi_odd = odd & low, odd & high
        ax.scatter(np.r_[x[lo_odd], x[hi_odd]], np.r_[vmin[lo_odd], vmax[hi_odd]], s=28, color="#f4a261",
                   edgecolors="black", linewidths=0.6, zorder=4)
    ax.set_xlim(0.4, len(group) + 0.6)
    ax.update_datalim(np.c_[np.r_[x, x], np.r_[np.minimum(vmin, wlo), np.maximum(vmax, whi)]])
    ax.autoscale_view(scalex=False)
    ax.set_xticks(x, [str(k) for k in group])
    for tick, k in zip(ax.get_xticklabels(), group):
        if k in outliers:
            tick.set_color("#c0392b")
            tick.set_fontweight("bold")


def _band(ax, stats, outliers, lo, hi, span):
    x = np.arange(stats["channels"])
    ax.fill_between(x, stats["min"], stats["max"], color="#dbe9f6", step="mid", label="min-max")
    ax.fill_between(x, stats["q1"], stats["q3"], color="#7fa7d1", step="mid", label="q1-q3")
    ax.plot(x, stats["median"], color="red", lw=0.6, label="median")
    marked = sorted(outliers, key=lambda k: -stats["max_abs"][k])[:8]
    if outliers:
        idx = sorted(outliers)
        ax.scatter(idx, [stats["max"][k] if abs(stats["max"][k]) >= abs(stats["min"][k]) else stats["min"][k]
                         for k in idx], color="#c0392b", s=12, zorder=3)
        for k in marked:
            v = stats["max"][k] if abs(stats["max"][k]) >= abs(stats["min"][k]) else stats["min"][k]
            ax.annotate(str(k), (k, v), xytext=(3, 3), textcoords="offset points", fontsize=7, color="#c0392b")
    if lo is not None and _drawable(lo, hi, span):
        if _by_channel(stats, lo):  # each its own: one pair of lines at the widest misread them as one range
            ax.plot(x, np.atleast_1d(lo), drawstyle="steps-mid", color="#c0392b", ls=":", lw=1)
            ax.plot(x, np.atleast_1d(hi), drawstyle="steps-mid", color="#c0392b", ls=":", lw=1)
        else:
            ax.axhline(min(np.atleast_1d(lo)), color="#c0392b", ls=":", lw=1)
            ax.axhline(max(np.atleast_1d(hi)), color="#c0392b", ls=":", lw=1)
    ax.set_xlim(-0.5, stats["channels"] - 0.5)
    ax.set_xlabel(f"channel (axis {stats['axis']}), all {stats['channels']}")
    ax.set_ylabel("value")
    ranges = "; each channel's quantization range dotted" if lo is not None and _drawable(lo, hi, span) and \
        _by_channel(stats, lo) else ""
    ax.set_title(f"every channel: min-max (light), q1-q3 (dark), median (red); outliers marked{ranges}", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)


def _drawable(lo, hi, span):
    """Draw the calibration range only near the data: an int32 bias range would flatten it."""
    reach = max(np.max(np.abs(np.atleast_1d(lo))), np.max(np.abs(np.atleast_1d(hi))))
    return reach <= 20 * max(span, 1e-12)


def _by_channel(stats, lo):
    """Whether ``lo`` holds one range start per channel of the plot's axis."""
    lo = np.atleast_1d(lo)
    return lo.size > 1 and stats.get("range_axis") == stats["axis"] and lo.size == stats["channels"]


def _range_lines(ax, stats, group, lo, hi, span):
    if lo is None or not _drawable(lo, hi, span):
        return
    lo, hi = np.atleast_1d(lo), np.atleast_1d(hi)
    if lo.size == 1:
        ax.axhline(lo[0], color="#c0392b", ls=":", lw=1)
        ax.axhline(hi[0], color="#c0392b", ls=":", lw=1)
    elif _by_channel(stats, lo):
        pos = np.arange(1, len(group) + 1)
        ax.scatter(pos, hi[group], marker=7, color="#c0392b", s=22, zorder=4)  # a caret down at the top
        ax.scatter(pos, lo[group], marker=6, color="#c0392b", s=22, zorder=4)  # and up at the bottom


def reading(stats):
    """One line saying what the box plot means for quantization."""
    outliers = stats["outlier_channels"]
    if not outliers and stats["channels"] and not any(stats["max_abs"]):
        # max|x| 0 over the median's 0 is no ratio: "0.0x" read as if one channel were tiny
        return "every channel is 0 (a constant tensor): no channel is wider than another"
    if stats["channels"] and all(lo == hi for lo, hi in zip(stats["min"], stats["max"])):
        if len(set(stats["min"])) == 1:
            return "every channel holds a single value (a constant tensor): there is no spread to show"
        # channels of different values that no sample moves: the tensor is not constant, and
        # its histogram reads how those values sit on the grid
        return ("every channel holds one value, the same on every sample (the tensor does not vary with the input): "
                "there is no spread to show; its histogram shows how the values sit on the grid")
    zeros = [k for k, m in enumerate(stats["max_abs"]) if m == 0]
    dead = (f"; channel{'s' if len(zeros) > 1 else ''} {', '.join(map(str, zeros[:5]))}"
            f"{' and more' if len(zeros) > 5 else ''} {'are' if len(zeros) > 1 else 'is'} all 0") if zeros else ""
    if not outliers:
        return (f"no outlier channel: the widest channel reaches "
                f"{_widest_ratio(stats):.1f}x the median channel's max|x|{dead}")
    shown = ", ".join(f"{k} ({r:.0f}x)" for k, r in zip(outliers[:5], stats["outlier_ratios"][:5]))
    more = f" and {len(outliers) - 5} more" if len(outliers) > 5 else ""
    if stats.get("per_channel"):
        return f"outlier channels {shown}{more}; already quantized per channel, so each has its own scale"
    grid = stats.get("bit")
    bits = lost_bits(stats["outlier_ratios"][0], grid)
    cost = (f"all {grid} bits: it rounds to 0" if grid and bits >= grid else f"~{bits:.1f} bits")
    wider = stats.get("wider", "int16")
    if stats.get("kind") == "weight":
        # onnxruntime splits only a Conv's, Gemm's or MatMul's weight by channel (as the histogram's reading says)
        remedy = "per-channel weights" if stats.get("takes_per_channel", True) else \
            f"{wider or 'wider'} weights (its operator takes no per-channel scale)"
    else:
        remedy = f"try per-channel{f' or {wider}' if wider else ''}"
    return f"outlier channels {shown}{more}: a per-tensor scale costs the median channel {cost} -> {remedy}"


def _widest_ratio(stats):
    ref = stats["median_channel_max_abs"]
    return max(stats["max_abs"]) / ref if ref > 0 and stats["max_abs"] else 0.0

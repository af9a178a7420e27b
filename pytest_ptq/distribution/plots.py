"""The distribution and box-plot figures of :func:`~pytest_ptq.distribution.collect`'s statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..channelwise import plot_channels
from ..figures import drawing, file_stem, pyplot, save_figure, wrap
from ..tables import short as _fmt
from .readings import activation_reading, codes_text, weight_reading


def _stairs(ax, hist, label, colour, fill=True, alpha=0.55):
    counts, edges = np.asarray(hist["counts"]), np.asarray(hist["edges"])
    # above the range lines (zorder 2): a bar on a range's end, a constant's, was hidden under them
    ax.stairs(counts, edges, fill=fill, alpha=alpha if fill else 1.0, color=colour, label=label,
              linewidth=1.2, zorder=2.5)
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


def _one_value(ax, s, colour):
    """Say what a tensor of a single value holds: its one bin, of a range widened around it by
    a unit, is a sliver a few pixels wide, and the plot reads as empty."""
    if not s.get("count") or s.get("min") is None or s["min"] != s["max"]:
        return
    v = s["min"]
    lo, hi = ax.get_xlim()
    right = hi > lo and (v - lo) / (hi - lo) > 0.5
    ax.annotate(f"all {s['count']} values = {v:.6g}", xy=(v, 0.5), xycoords=ax.get_xaxis_transform(),
                xytext=(-14 if right else 14, 0), textcoords="offset points", ha="right" if right else "left",
                va="center", fontsize=9, color=colour, fontweight="bold", zorder=6,
                bbox=dict(boxstyle="round", facecolor="white", edgecolor=colour, alpha=0.9),
                arrowprops=dict(arrowstyle="->", color=colour))


def _margins(fig, heading, height, extra=0.0):
    """Fixed margins for a known layout: tight_layout costs a full extra draw per figure."""
    lines = heading.count("\n") + 1
    top = 1 - (0.12 + 0.17 * lines + extra) / height
    width = fig.get_figwidth()
    fig.subplots_adjust(left=0.95 / width, right=1 - 0.2 / width, bottom=0.5 / height, top=top, wspace=0.18)


def _plot_activation(d, path, title, box=None):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=100)
    _stairs(ax, d["hist"], "float input (named in the title)", "#4c72b0")
    # hollow: a filled marker hid the count-1 bar of the very value it points at
    ax.plot([d["peak"]], [0.03], marker="^", markersize=11, color="#1f3f8f", markerfacecolor="none",
            markeredgewidth=1.6, clip_on=False, linestyle="none", label=f"max |x| = {_fmt(d['max_abs'])}", zorder=5,
            transform=ax.get_xaxis_transform())
    span = max(abs(d["min"] or 0), abs(d["max"] or 0), 1e-12)
    if max(abs(d["range_lo"]), abs(d["range_hi"])) <= 20 * span:
        which = "widest per-run range" if d["kind"] == "dynamic" else "calibration range"
        ax.axvline(d["range_lo"], color="#c0392b", ls="--", lw=1.4,
                   label=f"{which} [{_fmt(d['range_lo'])}, {_fmt(d['range_hi'])}]")
        ax.axvline(d["range_hi"], color="#c0392b", ls="--", lw=1.4)
        lo_x, hi_x = ax.get_xlim()
        ax.axvspan(lo_x, d["range_lo"], color="#c0392b", alpha=0.06)
        ax.axvspan(d["range_hi"], hi_x, color="#c0392b", alpha=0.06)
        ax.set_xlim(lo_x, hi_x)
    _one_value(ax, d, "#1f3f8f")
    harmless = " (Relu follows)" if d.get("relu_follows") and d["clipped_low"] else ""
    # a value past the threshold by less than half a step rounds onto the last code: no clip
    over = None not in (d["max_abs"], d["threshold"]) and d["max_abs"] > d["threshold"]
    rounds = " (within half a step)" if over and not d["clipped_count"] else ""
    text = (f"max |x|: {_fmt(d['max_abs'])}{rounds}   threshold: {_fmt(d['threshold'])}\n"
            f"clipped: {100 * d['clipped_share']:.3f}% ({d['clipped_count']} of {d['count']}){harmless}\n"
            f"scale: {_fmt(d['scale'])}   " + (codes_text(d) or f"99.9% of values span {_fmt(d['bulk_levels'])} levels"))
    ax.text(0.01, 0.97, text, transform=ax.transAxes, va="top", fontsize=8, family="monospace",
            bbox=dict(boxstyle="round", facecolor="white", alpha=0.85))
    ax.set_xlabel("value")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, alpha=0.3)
    # centred over the axes, which sit 0.75 in right of the figure's centre (margins 0.95 and 0.2)
    heading = wrap(title, 10 - 0.75) + "\n" + wrap(activation_reading(d, box), 10 - 0.75)
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
                        label=("widest of the ranges" if d["per_channel"] or d.get("block_size") else
                               "quantization range") + f" [{_fmt(d['range_lo'])}, {_fmt(d['range_hi'])}]")
            ax1.axvline(d["range_hi"], color="#c0392b", ls="--", lw=1.2)
    ax1.plot([left_a["peak"]], [0.03], marker="^", markersize=10, color="#1f3f8f", linestyle="none",
             markerfacecolor="none", markeredgewidth=1.6, clip_on=False,
             label=f"max |x| = {_fmt(left_a['max_abs'])}", zorder=5, transform=ax1.get_xaxis_transform())
    _one_value(ax1, left_a, "#1f3f8f")
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
        if d["kind"] == "weight" and not d["per_channel"] and not d.get("block_size"):  # one scale: one bound
            ax2.axvline(-d["scale"] / 2, color="grey", ls=":", lw=1, label="+-scale/2 (rounding bound)")
            ax2.axvline(d["scale"] / 2, color="grey", ls=":", lw=1)
        _one_value(ax2, err, "#8c2d30")
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


def _granularity(d, axis=False):
    """How a calibration node's scale is shared, as a title says it ("per block of 32"; a
    blocked weight read "per tensor", as it has more than one scale but not one a channel)."""
    on = f" (axis {d['axis']})" if axis and d.get("axis") is not None else ""
    if d.get("block_size"):
        return f"per block of {d['block_size']}{on}"
    if d["per_channel"]:
        return f"per channel{on}"
    return "per run" if d["kind"] == "dynamic" else "per tensor"


@drawing
def draw_distribution(d, save_dir, box=None):
    """Write one node's distribution PNG under ``save_dir``; returns its path. ``box``: the
    node's channel statistics, where drawn, whose reading the heading then agrees with."""
    path = Path(save_dir) / f"distribution_{file_stem(d['node'])}.png"
    if d["kind"] in ("activation", "dynamic"):
        where = _granularity(d)
        title = (f"{d['node']}: activation input '{d['tensor']}' in the float model, {d['samples']} sample(s) "
                 f"- {d['dtype']} ({d['bit']}-bit, {where})")
        _plot_activation(d, path, title, box)
    elif d["kind"] == "weight":
        where = _granularity(d, axis=True)
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
                   note=f"this node's own output vs float with every pair quantized: cosine "
                        f"{_fmt(d['cosine-similarity'])}, upstream error included (not the sensitivity ranking's "
                        "figure, which is the model outputs' cosine with only this node quantized)")
    return str(path)


@drawing
def draw_channelwise(d, save_dir, dist=None):
    """Write one node's per-channel box plot under ``save_dir``; returns its path. ``dist``:
    the node's distribution statistics, whose worst channel by SQNR (what a weight's reading
    names) is marked too."""
    path = Path(save_dir) / f"channelwise_{file_stem(d['node'])}.png"
    what = "float weight" if d["kind"] == "weight" else "float input"
    if d["kind"] == "weight" and d.get("compared_against") == "dequantized weight":
        what = "dequantized weight (float unknown)"
    where = _granularity(d)
    samples = f", {d['samples']} sample(s)" if d["kind"] != "weight" else ""
    title = (f"{d['node']}: {what} '{d['tensor']}' by channel (axis {d['axis']} of {d['shape']}, "
             f"{d['channels']} channels{samples}) - {d['dtype']} {where}")
    worst = (dist or {}).get("worst_channel")
    marked = {} if worst is None else {int(worst): f"worst SQNR, {dist['worst_channel_sqnr']:.1f} dB"}
    plot_channels(d, path, title, marked)
    return str(path)

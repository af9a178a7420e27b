"""Saving matplotlib figures the same way everywhere (headless, folders made, memory freed)."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import warnings
from pathlib import Path

from . import guard

# Fonts with Chinese, Japanese and Korean glyphs, drawn where DejaVu Sans (matplotlib's
# default) has none, when one is installed: a model's file or node names may be in them.
_CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Source Han Sans SC", "WenQuanYi Zen Hei",
              "WenQuanYi Micro Hei", "Droid Sans Fallback", "Microsoft YaHei", "SimHei", "PingFang SC",
              "Hiragino Sans GB", "Hiragino Sans", "Yu Gothic", "Malgun Gothic", "AppleGothic")


def pyplot():
    """matplotlib.pyplot on the Agg backend: the analyses run headless, in CI too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def drawing(draw):
    """Decorator of a function that draws figures: the text falls back on an installed CJK
    font, and a glyph no font has is drawn as a box without a warning (a warning that
    ``-W error`` would turn into a failed test, or pytest's internal error in a hook)."""
    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        plt = pyplot()
        with warnings.catch_warnings(), plt.rc_context({"font.sans-serif": _fonts()}):
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
            return draw(*args, **kwargs)
    return drawn


@functools.cache
def _fonts():
    from matplotlib import font_manager, rcParams

    installed = {f.name for f in font_manager.fontManager.ttflist}
    return list(rcParams["font.sans-serif"][:1]) + [f for f in _CJK_FONTS if f in installed]


def file_stem(name, limit=120, key=None):
    """A file name stem for ``name`` (a node's, a config's) of at most ``limit`` characters:
    letters, digits, ``_.-``; where it had to change or be cut, a hash of the whole name ends
    it, so that two names never share a file (scoped names often share their first 120).
    ``key``: what the name stands for, where ``name`` is already a rewriting of it (hashed
    instead, and where it differs from ``name``)."""
    key = name if key is None else key
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-") or "node"
    if safe == key and len(safe) <= limit:
        return safe
    return safe[: limit - 7].rstrip("._-") + "-" + hashlib.sha1(key.encode()).hexdigest()[:6]


def save_figure(fig, path, tight=True):
    """Write ``fig`` to ``path`` (parents created) and close it; returns the Path."""
    plt = pyplot()
    try:
        with guard.writing(Path(path)) as path:
            if tight:
                fig.tight_layout()
            fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def drawn_by():
    """The matplotlib that draws figures (a key part of a figure kept between runs: another
    one draws it again)."""
    import matplotlib

    return "matplotlib " + matplotlib.__version__


def kept_figure(store, request, folder, draw):
    """The path of the figure ``draw(folder)`` writes under ``folder`` (returning its path),
    drawn once for ``request`` (a tuple of what the figure shows) while ``store`` (a
    :class:`~pytest_ptq.cache.ResultCache`, or None) keeps its PNG: a rerun writes the kept
    bytes instead of drawing them again."""
    if store is None:
        return str(draw(folder))
    drawn = []

    def compute():
        path = Path(draw(folder))
        drawn.append(path)
        return path.name, path.read_bytes()

    name, png = store.get((*request, drawn_by()), compute)
    if drawn:
        return str(drawn[0])
    return str(guard.write_bytes(Path(folder) / name, png))


def metric_label(metric):
    """Axis label of a metric that says which way is better."""
    return metric.name + (" (higher is better)" if metric.higher_is_better else " (lower is better)")


def with_side_panel(plt, figsize, ratio=(4.0, 1.35)):
    """A figure with the plot on the left and a text panel on the right, where legends and
    the labels of marked points go instead of onto the curves: ``(fig, ax, side)``."""
    fig = plt.figure(figsize=figsize, dpi=100)
    # fixed margins: tight_layout does not handle a panel without axes
    grid = fig.add_gridspec(1, 2, width_ratios=list(ratio), wspace=0.03, left=1.0 / figsize[0],
                            right=1 - 0.1 / figsize[0], top=1 - 0.45 / figsize[1], bottom=0.6 / figsize[1])
    ax, side = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    side.set_axis_off()
    return fig, ax, side


def mark_points(ax, points, colour="black"):
    """Number the ``(x, y)`` points on ``ax`` (1, 2, ...) with small labels placed where they
    overlap neither each other nor the marker: each label tries a few offsets around its
    point and takes the first free one. Returns the numbers, in the order of ``points``."""
    ax.figure.canvas.draw()  # settles the limits, so that data map to their final pixels
    taken = []  # label boxes in pixels
    to_px = ax.transData.transform
    offsets = [(6, 6), (6, -14), (-14, 6), (-14, -14), (6, 18), (6, -26), (-26, 6), (18, -4), (-30, -4)]
    for k, (x, y) in enumerate(points, 1):
        px, py = to_px((x, y))
        ax.plot([x], [y], marker="o", markersize=7, markerfacecolor="none", markeredgecolor=colour, zorder=5,
                linestyle="none")
        width = 7 * len(str(k)) + 2
        for dx, dy in offsets:
            box = (px + dx, py + dy, px + dx + width, py + dy + 11)
            if not any(_overlap(box, b) for b in taken):
                break
        taken.append(box)
        ax.annotate(str(k), (x, y), xytext=(dx, dy), textcoords="offset pixels", fontsize=8, color=colour,
                    fontweight="bold", zorder=6)
    return list(range(1, len(points) + 1))


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def fit_label(text, width):
    """``text`` in at most ``width`` characters for a side panel: its start and its end, which
    tell apart names that share a long prefix (/backbone/stage1/conv1/Conv, .../conv2/Conv)."""
    text = str(text)
    if len(text) <= width:
        return text
    head = max(1, (width - 1) // 3)
    return text[:head] + "~" + text[len(text) - (width - 1 - head):]


def fit_labels(texts, width):
    """:func:`fit_label` of each of ``texts``, told apart: texts that would read the same leave
    out the ending they share (four characters or more: onnxruntime's ``_QuantizeLinear``),
    so that the ends kept are the parts that differ."""
    texts = [str(t) for t in texts]
    out = [fit_label(t, width) for t in texts]
    for label in set(out):
        same = [k for k, x in enumerate(out) if x == label]
        group = list(dict.fromkeys(texts[k] for k in same))
        if len(group) < 2:
            continue
        common = len(os.path.commonprefix([t[::-1] for t in group]))
        if common >= 4 and all(len(t) > common for t in group):
            for k in same:
                out[k] = fit_label(texts[k][:-common] + "~", width)
    return out


def side_legend(side, ax, fontsize=8):
    """``ax``'s legend at the top of the side panel, each label wrapped to the panel's width
    (a long one ran off the figure); returns the axes fraction just below it."""
    import textwrap

    handles, labels = ax.get_legend_handles_labels()
    fig = side.figure
    # characters that fit beside a legend handle: a monospace-ish estimate of 0.6 em per character
    width = side.get_window_extent().width - 3.5 * fontsize * fig.dpi / 72
    chars = max(12, int(width / (0.6 * fontsize * fig.dpi / 72)))
    legend = side.legend(handles, ["\n".join(textwrap.wrap(label, chars)) or label for label in labels],
                         loc="upper left", fontsize=fontsize, frameon=False, borderaxespad=0)
    fig.canvas.draw()
    box = legend.get_window_extent().transformed(side.transAxes.inverted())
    return box.y0 - 0.04


def side_text(side, lines, top=1.0, fontsize=8):
    """Write ``lines`` down the side panel from ``top`` (axes fraction); returns the fraction
    where the text ends."""
    text = "\n".join(lines)
    side.text(0.02, top, text, transform=side.transAxes, va="top", ha="left", fontsize=fontsize, family="monospace")
    return top - (len(lines) + 0.5) * fontsize * 1.35 / (side.bbox.height or 1)

"""Saving matplotlib figures the same way everywhere (headless, folders made, memory freed)."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import re
import threading
import warnings
from pathlib import Path

from . import guard

# Fonts with Chinese, Japanese and Korean glyphs, drawn where DejaVu Sans (matplotlib's
# default) has none, when one is installed: a model's file or node names may be in them.
_CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Source Han Sans SC", "WenQuanYi Zen Hei",
              "WenQuanYi Micro Hei", "Droid Sans Fallback", "Microsoft YaHei", "SimHei", "PingFang SC",
              "Hiragino Sans GB", "Hiragino Sans", "Yu Gothic", "Malgun Gothic", "AppleGothic")


class _Canvas:
    """The few pyplot calls the figures make, on figures of their own Agg canvas: headless,
    in CI too, and without pyplot, whose backend (a notebook's inline one, a desktop's
    windows) and open figures are the user's process's and stay as they are."""

    @staticmethod
    def figure(**kwargs):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(**kwargs)
        FigureCanvasAgg(fig)
        return fig

    @classmethod
    def subplots(cls, nrows=1, ncols=1, figsize=None, dpi=None, **kwargs):
        fig = cls.figure(figsize=figsize, dpi=dpi)
        return fig, fig.subplots(nrows, ncols, **kwargs)

    @staticmethod
    def close(fig):
        """Nothing to close: pyplot never held the figure, which goes with its last reference."""

    def __getattr__(self, name):  # rcParams, rc_context: matplotlib's own
        import matplotlib

        return getattr(matplotlib, name)


def pyplot():
    """What the figures draw with: figures on their own Agg canvas (see :class:`_Canvas`)."""
    return _Canvas()


def drawing(draw):
    """Decorator of a function that draws figures: the text falls back on an installed CJK
    font, and a glyph no font has is drawn as a box without a warning (a warning that
    ``-W error`` would turn into a failed test, or pytest's internal error in a hook). Text is
    drawn as written: a node name with two dollar signs (``price$_$``) is no formula, which
    matplotlib failed to parse (every figure of the model lost, the plugin's report with them)."""
    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        plt = pyplot()
        with _DRAWING, warnings.catch_warnings(), plt.rc_context({"font.sans-serif": _fonts(),
                                                                  "text.parse_math": False}):
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
            return draw(*args, **kwargs)
    return drawn


# One figure drawn at a time in a process: rc_context and catch_warnings save and restore
# process-wide state (two threads restored each other's, leaving the user's matplotlib without
# formulas), and the glyph fonts below are shared FreeType objects (two threads measuring text
# corrupted the heap: the process aborted)
_DRAWING = threading.RLock()


@functools.cache
def _fonts():
    from matplotlib import font_manager, rcParams

    installed = {f.name for f in font_manager.fontManager.ttflist}
    return list(rcParams["font.sans-serif"][:1]) + [f for f in _CJK_FONTS if f in installed]


@functools.cache
def _glyph_fonts():
    from matplotlib.font_manager import FontProperties, findfont, get_font

    fonts = []
    for family in _fonts():
        font = get_font(findfont(FontProperties(family=family), fallback_to_default=True))
        font.set_size(10, 72)
        fonts.append(font)
    return fonts


@functools.cache
def _advance(ch):
    """The width of ``ch`` at 10 pt, in points, in the first font that has it; None when none has."""
    with _DRAWING:
        for font in _glyph_fonts():
            if font.get_char_index(ord(ch)):
                return font.load_char(ord(ch)).linearHoriAdvance / 65536
    return None


def drawable(text):
    """``text`` with each character that no installed font has written as Python writes its
    escape (a backslash, ``u`` and four hex digits, ``U`` and eight past the first plane):
    drawn, it was an empty box (a CJK node name without a CJK font), and two names differing
    there read the same."""
    text = str(text)
    return "".join(ch if ch in "\n\t" or _advance(ch) is not None else
                   (f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}") for ch in text)


def text_width(text, fontsize=10):
    """The width of one line of ``text`` in points at ``fontsize`` (the glyphs' advances: no
    kerning, close enough to wrap by)."""
    return sum(_advance(ch) or 10.0 for ch in str(text)) * fontsize / 10


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
    from matplotlib.text import Text

    try:
        for text in fig.findobj(Text):
            shown_text = text.get_text()
            if shown_text and not shown_text.isascii():
                text.set_text(drawable(shown_text))
        if tight:
            fig.tight_layout()
        # the margins are set for the text they expect: where a title wraps to more lines,
        # or tick labels run wider, the image grows rather than cut them off
        image = io.BytesIO()
        fig.savefig(image, format=Path(path).suffix[1:].lower() or "png", bbox_inches=_text_bbox(fig))
    finally:
        plt.close(fig)
    # whole or not at all: a run killed while saving left half a PNG under the final name
    return guard.write_bytes(Path(path), image.getvalue())


def _text_bbox(fig):
    """The figure's box in inches, grown to hold the titles, axis and tick labels, legends and
    notes that run past its edges; None where none does. Measured on the text alone:
    savefig's bbox_inches="tight" draws the figure once more to find it, seconds for a box
    plot of a few hundred channels."""
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.texts if t.get_visible() and t.get_text()]
    boxes += [legend.get_window_extent(renderer) for legend in fig.legends]
    for ax in fig.axes:
        texts = [ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None), *ax.texts]
        boxes += [t.get_window_extent(renderer) for t in texts if t is not None and t.get_visible() and t.get_text()]
        if ax.get_legend() is not None:
            boxes.append(ax.get_legend().get_window_extent(renderer))
        # the y axis: its tick labels' width is the data's; the x axis's channel numbers and
        # operator indices fit the bottom margins, and laying out hundreds of them costs
        box = ax.yaxis.get_tightbbox(renderer) if ax.axison else None
        if box is not None:
            boxes.append(box)
    whole = Bbox.union([fig.bbox, *boxes])
    if whole.x0 >= fig.bbox.x0 and whole.y0 >= fig.bbox.y0 and whole.x1 <= fig.bbox.x1 and whole.y1 <= fig.bbox.y1:
        return None
    return whole.padded(0.08 * fig.dpi).transformed(fig.dpi_scale_trans.inverted())


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
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..") or \
            not name.endswith(".png") or not isinstance(png, bytes):
        return str(draw(folder))  # a kept entry is only ever a PNG's name in this folder: anything else is drawn again
    return str(guard.write_bytes(Path(folder) / name, png))


def metric_label(metric):
    """Axis label of a metric that says which way is better."""
    return metric.name + (f" in {metric.units}" if metric.units else "") + (
        " (higher is better)" if metric.higher_is_better else " (lower is better)")


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


def axes_title(ax, text, fontsize=11):
    """``text`` as ``ax``'s title, wrapped to the axes' width (a model path of 180 characters
    ran on one line, and the figure grew so wide that a report scaled its text to nothing)."""
    width = ax.figure.get_size_inches()[0] * ax.get_position().width
    ax.set_title(wrap(text, width, fontsize), fontsize=fontsize)


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


def _around(text, start, end, width, whole_start=True):
    """``text[start:end]`` (the part that differs) in ``width`` characters with what surrounds
    it: the whole start where it fits (``whole_start``), else more of what follows than of what
    precedes it; ``~`` where cut."""
    if whole_start and end + 1 <= width:
        return text[:end] + ("~" if end < len(text) else "")
    room = width - (end - start) - 2  # beside the core and two cuts
    if room < 0:
        return ("~" if start else "") + fit_label(text[start:end], width - (1 if start else 0))
    after = len(text) - end
    if after <= room:  # the rest fits whole after the core
        a = max(0, start - (room - after + (1 if start <= room - after else 0)))
        return ("~" if a else "") + text[a:]
    left = min(start, room // 3)
    return ("~" if start > left else "") + text[start - left:end + room - left] + "~"


# the fewest characters a label keeps: a narrow panel's line less a caller's fixed columns
# (an index, a value) left one or none for the name, which read '/~' or '~3~'
MIN_LABEL = 8


def fit_labels(texts, width):
    """:func:`fit_label` of each of ``texts``, told apart: texts that would read the same show
    the part where all the texts they were mistaken for differ, and the ends around it (``~``
    where cut: /backbone/stage4/block10/attention/output/dense/MatMul and .../block3/... read
    /backbone/stage4/block10~ and /backbone/stage4/block3~); texts still alike are numbered. A
    text given twice keeps one label. ``width`` is at least :data:`MIN_LABEL`."""
    texts = [str(t) for t in texts]
    width = max(width, MIN_LABEL)
    cut = _scope_cut(texts, width) if any(len(t) > width for t in texts) else 0
    if cut:  # the scope every text shares tells none apart: its room goes to the rest
        return fit_labels(["~" + t[cut:] for t in texts], width)
    out = [fit_label(t, width) for t in texts]
    clusters = {t: {t} for t in texts}  # the texts each was mistaken for, itself included
    for whole_start in (True, False, False):
        alike = []  # texts that read the same as another
        for label in set(out):
            group = {texts[k] for k, x in enumerate(out) if x == label}
            if len(group) < 2:
                continue
            alike += group
            merged = set().union(*(clusters[t] for t in group))
            for t in merged:
                clusters[t] = merged
        for cluster in {id(clusters[t]): clusters[t] for t in alike}.values():
            start = len(os.path.commonprefix(list(cluster)))
            end = len(os.path.commonprefix([t[::-1] for t in cluster]))
            end = min(end, min(len(t) for t in cluster) - start)  # a text that is another's start
            for k, t in enumerate(texts):
                if t in cluster:
                    out[k] = _around(t, start, len(t) - end, width, whole_start)
    seen = {}
    for k, label in enumerate(out):
        first = seen.setdefault(label, texts[k])
        if first != texts[k]:
            n = 2
            while fit_label(label, width - len(f" #{n}")) + f" #{n}" in seen:
                n += 1
            out[k] = fit_label(label, width - len(f" #{n}")) + f" #{n}"
            seen[out[k]] = texts[k]
    return out


def _scope_cut(texts, width):
    """Where to cut the leading scope ('/backbone', '/model/encoder') that every one of
    ``texts`` starts with: after as few of its parts as make the texts fit ``width`` with a
    '~' for them, else after the whole scope, up to its last '/'; 0 where they share none."""
    if len(set(texts)) < 2:
        return 0
    prefix = os.path.commonprefix(texts)
    cuts = [i for i, ch in enumerate(prefix) if ch == "/" and i > 1]
    longest = max(len(t) for t in texts)
    return next((i for i in cuts if 1 + longest - i <= width), cuts[-1] if cuts else 0)


def panel_chars(side, fontsize=8):
    """How many monospace characters at ``fontsize`` one line of the side panel holds (what
    :func:`side_text` writes there), measured on the figure."""
    fig = side.figure
    probe = side.text(0, 0, "M" * 10, fontsize=fontsize, family="monospace")
    char = probe.get_window_extent(fig.canvas.get_renderer()).width / 10
    probe.remove()
    return max(12, int(side.get_window_extent().width * 0.98 / char))


def side_legend(side, ax, fontsize=8):
    """``ax``'s legend at the top of the side panel, each label wrapped to the panel's width
    (a long one ran off the figure); returns the axes fraction just below it."""
    handles, labels = ax.get_legend_handles_labels()
    fig = side.figure
    # the room beside a legend handle, in inches; wrap() keeps 0.3 inch of margin, given back
    # here, and breaks a long node name after a '_', '.' or '/' of it, not inside a word
    room = (side.get_window_extent().width - 3.5 * fontsize * fig.dpi / 72) / fig.dpi
    legend = side.legend(handles, [wrap(label, room + 0.3, fontsize) or label for label in labels],
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


def wrap(text, width_inches, fontsize=10):
    """Break a title into lines that fit a figure ``width_inches`` wide, measured in the
    font's glyph widths: between phrases (after "; ", ": " or ", ", before " - " or " -> ",
    never inside brackets) where it can, between words only inside a phrase longer than a
    line, and inside a name longer than a line after a '/', '_' or '.' of it (a character
    count let long names run off the figure's edges, and broke them mid-word)."""
    text = drawable(text)
    limit = max(1.0, width_inches - 0.3) * 72  # points, a margin at each edge

    def fits(line):
        return text_width(line.rstrip(), fontsize) <= limit

    lines = []
    for paragraph in text.split("\n"):
        line = ""
        for piece in _phrases(paragraph):
            if fits(line + piece):
                line += piece
                continue
            if line.strip():
                lines.append(line.rstrip())
            piece = piece.lstrip()
            if piece.startswith("- "):  # a dash between phrases means nothing at the start of a line
                piece = piece[2:]
            if not fits(piece):
                *full, piece = _break(piece, fits)
                lines += full
            line = piece
        lines.append(line.rstrip())
    return "\n".join(lines)


def _break(piece, fits):
    """``piece`` in lines that fit: at its spaces, and inside a word that fits no line after a
    '/' of a scoped name, else after a '_' or '.', else (a run of letters longer than a line)
    anywhere. The last line keeps its trailing space, which separates it from what follows."""
    lines, line = [], ""

    def add(token):
        nonlocal line
        if fits(line + token) or not line.strip():
            line += token
        else:
            lines.append(line.rstrip())
            line = token

    def split(token, separators):
        if fits(token):
            add(token)
            return
        if not separators:
            for ch in token:
                add(ch)
            return
        sep = re.escape(separators[0])
        for part in re.findall(rf"[^{sep}]*[{sep}]+|[^{sep}]+", token):
            split(part, separators[1:])

    for word in re.findall(r"\S+\s*", piece):
        if fits(line + word):
            add(word)
        else:
            split(word, ["/", "_.", "-:"])
    return [x for x in lines if x] + [line]


def _phrases(text):
    """``text`` cut into phrases at depth 0 of its brackets, each keeping its separator."""
    out, start, depth = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and ch == " " and i > start:
            after_sep = text[i - 1] in ";:,"
            before_dash = text.startswith(" - ", i) or text.startswith(" -> ", i)
            if after_sep or before_dash:
                out.append(text[start:i + (1 if after_sep else 0)])
                start = i + (1 if after_sep else 0)
    out.append(text[start:])
    return [p for p in out if p]

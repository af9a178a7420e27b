"""Plain-text tables, as the seed tool prints them."""

from __future__ import annotations

import math
import unicodedata

LIST_CELL = 3  # names a table cell shows of a list of names (the JSON output holds them all)


def fmt(value):
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.4e}"
        if 0.999999 < abs(value) < 1 - 1e-10:  # a similarity a hair below 1 must not read as 1.000000
            return f"{value:.{1 - math.floor(math.log10(1 - abs(value)))}f}"
        return f"{value:.6f}"
    if isinstance(value, (list, tuple)):
        # names in a cell, not the list: an input feeding 60 nodes made every row 2400 wide (a
        # shape, of numbers, is shown whole)
        cut = len(value) > LIST_CELL and all(isinstance(v, str) for v in value)
        return ",".join(str(v) for v in (value[:LIST_CELL] if cut else value)) + (
            f" +{len(value) - LIST_CELL} more" if cut else "")
    return str(value)


def listed(names, shown=3):
    """The first ``shown`` names quoted, and how many more there are."""
    names = list(names)
    return ", ".join(repr(n) for n in names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown
                                                         else "")


# The width the plugin's summary and the diagnoses wrap their text to
SUMMARY_WIDTH = 118


def warning_lines(text, fix="", head="warning: ", fix_head="  fix: ", width=None):
    """A warning as plain-text lines: ``head`` and its first line; each further line of
    ``text`` (a cause, say) as an indented item; the ``fix`` after a one-line warning, or
    after the items on a line of its own that starts with ``fix_head``. ``width``: each
    wrapped to that many characters, continued four spaces further in (names never cut)."""
    first, *more = text.split("\n")
    if not more:
        lines = [head + first + (f"; fix: {fix}" if fix else "")]
    else:
        lines = [head + first, *(f"  - {m}" for m in more), *([fix_head + fix] if fix else [])]
    if width is None:
        return lines
    import re
    import textwrap

    out = []
    for line in lines:
        # a command in backticks stays on one line, to be copied whole from a log
        kept = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), line)
        lead = 4 if line.startswith("  - ") else len(line) - len(line.lstrip(" "))
        out += [part.replace("\0", " ") for part in textwrap.wrap(
            kept, width=width, subsequent_indent=" " * (lead + 4), break_long_words=False,
            break_on_hyphens=False)] or [line]
    return out


def threshold_text(t):
    """A threshold as the user wrote it: every digit it has (0.9999999, not 1)."""
    return f"{t:.15g}" if isinstance(t, float) else str(t)


def short(value):
    """A figure at four significant digits, for plots and sentences ("n/a" for None); a
    similarity just below 1 keeps two digits of its distance to 1 (0.999981, not 1)."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    if 0.99 <= abs(value) < 1:
        digits = min(9, 2 - math.floor(math.log10(1 - abs(value))))
        return f"{value:.{digits}g}"
    return f"{value:.4g}"


def _width(text):
    """Columns ``text`` takes on a terminal: two for a wide (Chinese, Japanese, Korean)
    character, none for a combining one (an accent written after its letter)."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def printable(text):
    """``text`` on one line, its control characters (a node named with a newline, an escape
    sequence a terminal would run) shown escaped as Python writes them."""
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_table(rows, columns, limit=None):
    """``rows``: list of dicts; ``columns``: keys to show, in order. Returns one string."""
    shown = rows if limit is None else rows[:limit]
    cells = [[printable(c) for c in columns]] + [[printable(fmt(r.get(c, ""))) for c in columns] for r in shown]
    widths = [max(_width(row[k]) for row in cells) for k in range(len(columns))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line]
    for k, row in enumerate(cells):
        out.append("| " + " | ".join(v + " " * (w - _width(v)) for v, w in zip(row, widths)) + " |")
        if k == 0:
            out.append(line)
    out.append(line)
    if limit is not None and len(rows) > limit:
        out.append(f"... {len(rows) - limit} more")
    return "\n".join(out)

"""A small progress bar on stderr for long runs (no dependency, silent when disabled)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time

from . import params

REDRAW = 0.1  # seconds between redraws on a terminal: thousands of steps stay cheap
# In a log (CI), work shorter than LOG_AFTER seconds prints nothing, and longer work a line
# per tenth at most every LOG_EVERY seconds: a line per tenth of every few-second step made two
# thirds of an example suite's log
LOG_AFTER = 5.0
LOG_EVERY = 10.0
# ... and a line at least this often, however slow a tenth: CI systems stop a job silent for
# ten minutes
HEARTBEAT = 240.0


class Progress:
    """``with Progress(total, "sensitivity") as p: ... p.advance()``; ``enabled``: a bool, or
    the text stream to draw on; ``total`` None: work of unknown size (a search), counted with
    no time left.

    ``announce``: say when the work starts (its first step alone may take minutes).
    ``tentative``: the total is a bound the work replaces once it has timed a first part
    (``bar.total = ...; bar.tentative = False``): no time left is told until then, where one
    read from the bound was ten times the truth.

    Draws in place on a terminal, within its width (a longer line would wrap and every
    redraw would add a row); elsewhere (CI logs) prints a line every 10% with the time
    left, at most every :data:`LOG_EVERY` seconds (a line a minute for work of unknown
    size), and one when done; a run under :data:`LOG_AFTER` seconds prints nothing.
    """

    def __init__(self, total, desc, enabled=True, stream=None, announce=False, tentative=False):
        if hasattr(enabled, "write"):  # a stream to draw on (the plugin's, around pytest's capture)
            enabled, stream = True, enabled
        elif enabled is not None:  # text such as "no" would read as true
            enabled = params.flag(enabled, "progress")
        self.open = total is None  # no total to count down to: no time left is told
        self.total, self.desc, self.enabled = 1 if self.open else max(int(total), 1), desc, bool(enabled)
        self.stream = stream or sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self._last_pct = -1
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.estimate = None  # the first total, once the work has gone past it (see extend)
        self._last_line = self.start
        self._drawn = None  # when the terminal line was last drawn
        self.announce = announce  # a line at the start: for work whose first step alone is long
        self.tentative = tentative
        self._lock = threading.Lock()  # the heartbeat's thread writes lines too
        self._stop = threading.Event()
        self._paused = False
        self._spoke = False  # a line was written: the work says when it is done too

    def __enter__(self):
        if self.enabled and self.announce:
            self._line(f"{self.desc}: started")
        if self.enabled and not self.tty:
            # a step that alone outlasts HEARTBEAT (one pass of a large model) would otherwise
            # leave the log silent until it ends
            threading.Thread(target=self._beat, name="ptq-progress-heartbeat", daemon=True).start()
        return self

    def _beat(self):
        while not self._stop.wait(min(HEARTBEAT, 30.0)):
            with self._lock:
                quiet = time.perf_counter() - self._last_line
                if quiet < HEARTBEAT or self._paused or self._stop.is_set():  # the bar may have ended meanwhile
                    continue
                step = f"{self.done + 1}" if self.open else f"{min(self.done + 1, self.total)}/{self.total}"
                self.stream.write(f"{self.desc}: still on step {step}, {time.perf_counter() - self.start:.1f}s "
                                  f"elapsed\n")
                self.stream.flush()
                self._last_line, self._spoke = time.perf_counter(), True

    def _line(self, text):
        """Write one log line and note when (the heartbeat keeps quiet while lines come)."""
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_line, self._spoke = time.perf_counter(), True

    def __exit__(self, *exc):
        with self._lock:
            self._stop.set()
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        elif exc[0] is None and (self._spoke or time.perf_counter() - self.start > LOG_AFTER):
            elapsed = time.perf_counter() - self.start
            count = self.done if self.open else f"{self.done}/{self.total}"
            self._line(f"{self.desc}: {count} done, {elapsed:.1f}s elapsed")

    @contextlib.contextmanager
    def paused(self):
        """Time spent inside does not count towards the time left (work with its own bar)."""
        began = time.perf_counter()
        self._paused = True  # the inner work's bar tells the log it is alive
        try:
            yield
        finally:
            self._paused = False
            self._last_line = time.perf_counter()
            self.start += time.perf_counter() - began

    def extend(self):
        """The work goes on past the total, which was an estimate (a search that finds more
        to try): no time left is shown from then on, only what was done."""
        if self.estimate is None and not self.open:
            self.estimate = self.total
        self.total = max(self.total, self.done + 1)

    def advance(self, n=1):
        self.done += n
        if not self.enabled:
            return
        pct = int(100 * self.done / self.total)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0
        if self.open or self.estimate is not None:
            past = f"{self.desc}: {self.done} done, {elapsed:.1f}s elapsed" + (
                "" if self.open else f" (past the first estimate of {self.estimate}; the work decides how much more)")
            if self.tty:
                self._draw(past)
            elif time.perf_counter() - self._last_line >= 60:  # logs: a line a minute
                self._line(past)
            return
        if self.tty:
            counts = f" {self.done}/{self.total} {elapsed:5.1f}s elapsed" + ("" if self.tentative else
                                                                            f", ~{eta:4.0f}s left")
            self._draw(f"{self.desc}: [{'#' * (pct // 4):<25}]" + counts, f"{self.desc}:" + counts)
        elif (elapsed > LOG_AFTER and self.done < self.total
              and (pct // 10 > self._last_pct // 10
                   and (self._last_pct < 0 or time.perf_counter() - self._last_line >= LOG_EVERY)
                   or time.perf_counter() - self._last_line >= HEARTBEAT)):
            # logs get a line per 10% (at most every LOG_EVERY seconds, at least every
            # HEARTBEAT) and one at the end (a total that grows as the work finds more, as a
            # search's does, prints no line per step), short runs none
            self._line(f"{self.desc}: {self.done}/{self.total} ({pct}%) {elapsed:.1f}s elapsed"
                       + ("" if self.tentative else f", ~{eta:.0f}s left"))
            self._last_pct = pct

    def _columns(self):
        """The width of the terminal the bar is drawn on: stderr's, where stdout may be a file
        (``--json - > out.json``) whose size, read instead, was 80 on a narrower terminal and
        every redraw wrapped into a row of its own."""
        if os.environ.get("COLUMNS", "").isdigit():  # the user's word first, as shutil takes it
            return int(os.environ["COLUMNS"])
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # no descriptor (a captured stream), or not a terminal
            return shutil.get_terminal_size().columns

    def _draw(self, line, narrow=None):
        """Redraw the terminal line (at most every :data:`REDRAW` seconds, and at the last
        step): ``line`` where it fits the width, else ``narrow`` (the same without the bar),
        its description cut short with "..." where even that does not fit."""
        now = time.perf_counter()
        last = not self.open and self.done >= self.total
        if self._drawn is not None and now - self._drawn < REDRAW and not last:
            return
        self._drawn = now
        width = self._columns() - 1  # the last column would wrap on some terminals
        if len(line) > width and narrow is not None:
            line = narrow
        if len(line) > width:
            counts = line[len(self.desc):]  # the counts and times matter more than the words
            line = (self.desc[: max(width - len(counts) - 3, 0)] + "..." + counts)[:width]
        self.stream.write(f"\r{line:<{width}}")
        self.stream.flush()

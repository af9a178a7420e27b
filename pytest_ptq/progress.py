"""A small progress bar on stderr for long runs (no dependency, silent when disabled)."""

from __future__ import annotations

import sys
import time


class Progress:
    """``with Progress(total, "sensitivity") as p: ... p.advance()``.

    Draws in place on a terminal; elsewhere (CI logs) prints a line every 10%.
    """

    def __init__(self, total, desc, enabled=True, stream=None):
        self.total, self.desc, self.enabled = max(int(total), 1), desc, enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self._last_pct = -1
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def advance(self, n=1):
        self.done += n
        if not self.enabled:
            return
        pct = int(100 * self.done / self.total)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0
        if self.tty:
            bar = "#" * (pct // 4)
            self.stream.write(f"\r{self.desc}: [{bar:<25}] {self.done}/{self.total} "
                              f"{elapsed:5.1f}s elapsed, ~{eta:4.0f}s left")
            self.stream.flush()
        elif elapsed > 2 and (pct // 10 != self._last_pct // 10 or self.done == self.total):
            # logs get a line per 10%, and short runs none at all
            left = f", ~{eta:.0f}s left" if self.done < self.total else ""
            self.stream.write(f"{self.desc}: {self.done}/{self.total} ({pct}%) {elapsed:.1f}s elapsed{left}\n")
            self.stream.flush()
        self._last_pct = pct

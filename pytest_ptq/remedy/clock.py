"""A search's time budget."""

from __future__ import annotations

import time


class OutOfTime(Exception):
    """The time budget ran out; the search returns its best result so far."""


class Clock:
    """A search's time: ``budget`` seconds (validated by :func:`~pytest_ptq.params.seconds`
    where the search starts), None for none."""

    def __init__(self, budget):
        self.start = time.perf_counter()
        self.deadline = self.start + budget if budget else None

    def check(self):
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise OutOfTime

    @property
    def elapsed(self):
        return time.perf_counter() - self.start

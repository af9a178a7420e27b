"""Scoring configs for the search: the metric of one config against the float reference,
within a time budget."""

from __future__ import annotations

import time

from ..errors import PTQError


class OutOfTime(Exception):
    """The time budget ran out; the search returns its best result so far."""


class Clock:
    def __init__(self, budget):
        if budget is not None and budget <= 0:
            raise PTQError(f"budget must be a positive number of seconds, got {budget}")
        self.start = time.perf_counter()
        self.deadline = self.start + budget if budget else None
        self.exhausted = False

    def check(self):
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.exhausted = True
            raise OutOfTime

    @property
    def elapsed(self):
        return time.perf_counter() - self.start



class Scorer:
    """The metric of one config, worst over outputs, samples pooled; memoised per set."""

    def __init__(self, engine, remedy, metric, specs, indices, clock, bar):
        self.engine, self.remedy, self.metric = engine, remedy, metric
        self.specs, self.indices, self.clock, self.bar = specs, indices, clock, bar
        self.tensors = list(dict.fromkeys(s.tensor for s in specs))
        self.memo = {}
        self.evaluations = 0

    def config(self, chosen):
        if self.remedy == "float":
            return [n for n in self.engine.calib_names if n not in chosen], ()
        return self.engine.calib_names, list(chosen)

    def __call__(self, chosen):
        key = frozenset(chosen)
        if key not in self.memo:
            quantized, alternative = self.config(key)
            self.memo[key] = score(self.engine, quantized, self.specs, self.metric, self.indices,
                                   alternative=alternative, clock=self.clock)
            self.evaluations += 1
            self.bar.advance()
        return self.memo[key]


def score(engine, quantized, specs, metric, indices, alternative=(), clock=None, reference=None):
    """The metric of one config against the float reference: per output pooled over
    samples, then the worst output. ``reference`` is another engine whose float outputs
    serve as the reference (default: ``engine`` itself)."""
    reference = reference or engine
    tensors = list(dict.fromkeys(s.tensor for s in specs))
    states = {s.name: metric.new() for s in specs}
    for i in indices:
        if clock is not None:
            clock.check()
        ref = reference.reference(i, tensors)
        out = engine.run(i, quantized, tensors, alternative=alternative)
        for s in specs:
            metric.update(states[s.name], s.take(ref[s.tensor]), s.take(out[s.tensor]))
    return metric.worst([metric.value(st) for st in states.values()])



"""Scoring remedy sets: the objective of one set on one part of the data, within a time budget.

A *set* is a frozenset of ``(node, kind)`` pairs: the calibration nodes remedied and how
(``float``, ``int16``, ``per-channel``); every other node stays quantized as calibrated.
"""

from __future__ import annotations

import numpy as np

from .. import params
from ..errors import InputRefused, PTQError, raised_by_user
from ..metrics import Pooled, Reference, Scratch, meets
from .biases import biases_of
from .clock import OutOfTime


def cost_of(chosen, costs):
    """The cost of a set: the sum of its kinds' costs."""
    return float(sum(costs[k] for _, k in chosen))


def config(engine, chosen):
    """``(quantized, alternative)`` of a set: float nodes bypassed, others on their alternative,
    and the int32 biases of the nodes they change with them (see :mod:`.biases`)."""
    biases = biases_of(engine)
    floats = {n for n, k in chosen if k == "float"}
    floats.update(biases.floats(floats))
    alternative = [n for n, k in chosen if k != "float"]
    alternative += [b for b in biases.following(alternative, engine.alternatives) if b not in floats]
    return [n for n in engine.calib_names if n not in floats], alternative


class Scorer:
    """The objective of sets on one :class:`~.parts.Part`, memoised per set.

    ``scorer(s)`` counts against the budget; ``scorer.prepare(sets)`` scores several with the
    samples as the outer loop (each sample's float pass is shared by every set);
    ``scorer.final(s)`` reports a set after the search, outside the budget. Output metrics
    keep their pooled sums per set, so that two parts' figures can be pooled (:func:`pooled`).
    """

    def __init__(self, part, objective, clock, bar=None, metric=None):
        self.part, self.objective, self.clock, self.bar = part, objective, clock, bar
        # a task objective's guide figures are an output metric on the same part
        self.metric = metric or objective.metric
        self.task = self.metric is objective.metric and objective.is_task
        self.specs = objective.specs
        self.tensors = list(dict.fromkeys(s.tensor for s in self.specs))
        self.memo, self.pools = {}, {}
        self.evaluations = 0
        self._float_score = None

    @property
    def engine(self):
        return self.part.engine

    # -- the bar on this part ------------------------------------------------------------
    @property
    def target(self):
        """The absolute bar on this part (a ratio target times the float score here)."""
        if self.objective.min_ratio is None:
            return self.objective.target
        return self.objective.min_ratio * self.float_score()

    def float_score(self):
        """The task score of the float model on this part (computed once)."""
        if self._float_score is None:
            engine = self.engine
            self._float_score = self._evaluate(lambda feeds: engine.run(dict(feeds), ()))
            if not self._float_score > 0:
                raise PTQError(f"the evaluation function {self.metric.name} gave the float model "
                               f"{self._float_score!r} on the {self.part.where}; a ratio target needs a positive "
                               "score, so return an accuracy-like number where higher is better")
        return self._float_score

    def meets(self, value):
        if self.metric is not self.objective.metric:  # a task's guide figures: no bar of their own
            return meets(self.metric, value, self.target)
        return self.objective.meets(value, self.target)

    def key(self, value):
        """Sort key of a value, better last (NaN and None worst)."""
        if value is None:
            return -np.inf
        return self.objective.key(value, self.metric)

    # -- scoring -------------------------------------------------------------------------
    def __call__(self, chosen):
        key = frozenset(chosen)
        if key not in self.memo:
            self._compute([key], self.clock)
            self._advance()
        return self.memo[key]

    def prepare(self, sets):
        """Score the new sets among ``sets`` together, samples outermost, so that each
        sample's float pass serves all of them; calls then find them memoised."""
        fresh = list(dict.fromkeys(frozenset(s) for s in sets if frozenset(s) not in self.memo))
        if len(fresh) > 1 and not self.task:
            self._compute(fresh, self.clock)
            for _ in fresh:
                self._advance()

    def final(self, chosen):
        """The value of a set, computed outside the budget when the search did not score it."""
        key = frozenset(chosen)
        if key not in self.memo:
            self._compute([key], None)
        return self.memo[key]

    def pool(self, chosen):
        """The :class:`~pytest_ptq.metrics.Pooled` output metric of a set (after :meth:`final`
        or a call)."""
        return self.pools[frozenset(chosen)]

    def _advance(self):
        self.evaluations += 1
        if self.bar is not None:
            if self.bar.done + 1 > self.bar.total:
                self.bar.extend()
            self.bar.advance()

    def _compute(self, keys, clock):
        if self.task:
            for k in keys:
                if clock is not None:
                    clock.check()
                quantized, alternative = config(self.engine, k)
                engine = self.engine
                self.memo[k] = self._evaluate(lambda feeds: engine.run(dict(feeds), quantized,
                                                                       alternative=alternative))
            return
        pools = {k: Pooled(self.metric, self.specs) for k in keys}
        configs = {k: config(self.engine, k) for k in keys}
        scratch = Scratch()
        for i in self.part.indices:
            ref = self.engine.reference(i, self.tensors)
            prepared = Reference.of_outputs(self.specs, ref, scratch)
            for k, out in zip(keys, self.engine.run_many(i, [configs[k] for k in keys], self.tensors)):
                if clock is not None:
                    clock.check()
                pools[k].add_prepared(prepared, out)
        for k in keys:
            self.pools[k] = pools[k]
            self.memo[k] = self.objective.figure(pools[k], self.part)

    def _evaluate(self, run):
        try:
            score = self.objective.evaluate(run, self.part.data())
        except InputRefused as exc:  # feeds the function built: its line, not the data, is at fault
            raise raised_by_user(f"the evaluation function {self.metric.name}", exc) from None
        except (PTQError, OutOfTime):
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: one sentence naming its line, not our frames
            raise raised_by_user(f"the evaluation function {self.metric.name}", exc) from exc
        return params.task_score(score, self.metric.name)


def pooled(scorers, chosen):
    """The output metric of a set over the samples of several scorers' parts together."""
    for sc in scorers:
        sc.final(chosen)
    total = scorers[0].pool(chosen).copy()
    for sc in scorers[1:]:
        total.merge(sc.pool(chosen))
    return scorers[0].objective.figure(total, scorers[0].engine.data)


def score(engine, quantized, specs, metric, indices, alternative=(), clock=None, reference=None):
    """The metric of one config against the float reference: per output pooled over
    samples, then the worst output. ``reference`` is another engine whose float outputs
    serve as the reference (default: ``engine`` itself)."""
    reference = reference or engine
    tensors = list(dict.fromkeys(s.tensor for s in specs))
    pool = Pooled(metric, specs)
    for i in indices:
        if clock is not None:
            clock.check()
        pool.add(reference.reference(i, tensors), engine.run(i, quantized, tensors, alternative=alternative))
    return pool.judged(engine.data)

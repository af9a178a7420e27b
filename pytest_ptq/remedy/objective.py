"""What a remedy is judged by: an output metric against a target, or the user's task metric.

A task metric is the accuracy check's contract, ``evaluate(run, data) -> float`` (higher is
better). Its target is either a score (``target``) or a share of the float model's score on
the same samples (``min_ratio``), so it differs between the search and the held-out data.
"""

from __future__ import annotations

import dataclasses

from .. import params
from ..errors import PTQError
from ..metrics import COSINE, Metric, get_metrics
from ..tables import threshold_text


class TaskMetric(Metric):
    """A user evaluation function seen as a metric: one score per sample set, higher is better."""

    higher_is_better = True

    def __init__(self, name):
        self.name = name


@dataclasses.dataclass
class Objective:
    """The figure a remedy set is judged by, and the bar it must clear.

    ``metric``: an output metric, or a :class:`TaskMetric` when ``evaluate`` is given.
    ``guide``: the output metric that ranks nodes (the same as ``metric`` for output metrics:
    a task score is too coarse to rank single nodes). ``specs``: the outputs compared.
    ``target``: an absolute bar; ``min_ratio``: the bar as a share of the float score.
    """

    metric: Metric
    guide: Metric
    specs: list
    target: float | None = None
    min_ratio: float | None = None
    evaluate: object = None

    @property
    def is_task(self):
        return self.evaluate is not None

    def describe(self):
        """The bar in words, e.g. ``cosine-similarity >= 0.99`` or ``top1 >= 0.99 x float``."""
        op = ">=" if self.metric.higher_is_better else "<="
        if self.min_ratio is not None:
            return f"{self.metric.name} {op} {threshold_text(self.min_ratio)} x float"
        return f"{self.metric.name} {op} {threshold_text(self.target)}"

    def to_dict(self):
        out = {"metric": self.metric.name, "kind": "task" if self.is_task else "output"}
        if self.min_ratio is not None:
            out["min_ratio"] = self.min_ratio
        else:
            out["target"] = self.target
        if self.is_task:
            out["guide"] = self.guide.name
        return out


def objective_for(metric, target, specs, evaluate=None, min_ratio=None):
    """The :class:`Objective` of a search, its arguments validated once here.

    Without ``evaluate``: ``metric`` must reach ``target`` (default 0.99 for cosine). With
    it: the task score must reach ``target``, or ``min_ratio`` times the float score
    (default 0.99 when neither is given); ``metric`` then only ranks the nodes.
    """
    guide = get_metrics(params.metric(metric))[0]  # one metric: a search reaches one target
    if evaluate is None:
        if min_ratio is not None:
            raise PTQError("min_ratio is a share of the float model's task score; give evaluate= with it, "
                           "or a target for the output metric")
        if target is None:
            if guide.name != COSINE:
                raise PTQError(f"give a target for {guide.name}; only cosine similarity has a default "
                               f"({params.DEFAULT_MIN_COSINE})")
            target = params.DEFAULT_MIN_COSINE
        _number(target, "target")
        return Objective(guide, guide, specs, target=params.threshold(target, guide.name, "target"))
    params.evaluation_function(evaluate)
    if target is not None and min_ratio is not None:
        raise PTQError("give the task target either as a score (target=) or as a share of float (min_ratio=), "
                       "not both")
    task = TaskMetric(getattr(evaluate, "__name__", None) or type(evaluate).__name__)
    if target is not None:
        return Objective(task, guide, specs, target=_number(target, "target"), evaluate=evaluate)
    ratio = params.DEFAULT_MIN_RATIO if min_ratio is None else params.ratio(min_ratio)
    return Objective(task, guide, specs, min_ratio=ratio, evaluate=evaluate)


def _number(value, what):
    try:
        return params.number(value, what)
    except PTQError:
        raise PTQError(f"{what} must be a number, got {value!r}") from None

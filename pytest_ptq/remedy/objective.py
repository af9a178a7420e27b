"""What a remedy is judged by: an output metric against a target, or the user's task metric.

An output metric's target is one number for every output compared, or one per output (the
output checks' mapping, ``{"": 0.99, "logits": 0.999}``): a set then meets it when every
output meets its own, so the search is not sent after more than a contract asks.

A task metric is the accuracy check's contract, ``evaluate(run, data) -> float`` (higher is
better). Its target is either a score (``target``) or a share of the float model's score on
the same samples (``min_ratio``), so it differs between the search and the held-out data.
"""

from __future__ import annotations

import dataclasses

from .. import params
from ..errors import PTQError, shown
from ..metrics import COSINE, Metric, get_metrics, meets
from ..outputs import others, parse_outputs, strictest, targeted, thresholds
from ..tables import threshold_text


class TaskMetric(Metric):
    """A user evaluation function seen as a metric: one score per sample set, higher is better."""

    higher_is_better = True

    def __init__(self, name):
        self.name = name


class Figure(float):
    """The worst output's figure of a set (what is reported), with each output's own in
    ``outputs``: what per-output targets judge.

    A float, not a ``(worst, per output)`` pair: the figure is shown, stored, sorted and
    plotted as one number in every record of the search (the curve, the confirmations, the
    refinements, the figures, the JSON), and only the judge (:meth:`Objective.meets`,
    :meth:`Objective.key`) reads the outputs, so a pair would be unpacked at each of those
    places for the judge's sake. Where a value lost its outputs (read back from a file), the
    judge falls back to the strictest target, which asks no less than every output's own."""

    def __new__(cls, value, outputs=None):
        figure = super().__new__(cls, value)
        figure.outputs = outputs
        return figure


@dataclasses.dataclass
class Objective:
    """The figure a remedy set is judged by, and the bar it must clear.

    ``metric``: an output metric, or a :class:`TaskMetric` when ``evaluate`` is given.
    ``guide``: the output metric that ranks nodes (the same as ``metric`` for output metrics:
    a task score is too coarse to rank single nodes). ``specs``: the outputs compared.
    ``target``: an absolute bar; ``min_ratio``: the bar as a share of the float score.
    ``targets``: ``{output name: bar}`` where the outputs have bars of their own (``target``
    is then the strictest of them, the headline); None where ``target`` is every output's.
    """

    metric: Metric
    guide: Metric
    specs: list
    target: float | None = None
    min_ratio: float | None = None
    evaluate: object = None
    targets: dict | None = None

    @property
    def is_task(self):
        return self.evaluate is not None

    def describe(self):
        """The bar in words, e.g. ``cosine-similarity >= 0.99`` or ``top1 >= 0.99 x float``."""
        op = ">=" if self.metric.higher_is_better else "<="
        if self.min_ratio is not None:
            return f"{self.metric.name} {op} {threshold_text(self.min_ratio)} x float"
        return f"{self.metric.name} {op} {targets_text(self.target, self.targets)}"

    def figure(self, pool, data):
        """The figure of a :class:`~pytest_ptq.metrics.Pooled` (``data``: its samples' data):
        the worst output's, carrying each output's where the outputs have targets of their own."""
        value = pool.judged(data)
        return value if self.targets is None else Figure(value, pool.per_output())

    def meets(self, value, target):
        """``value`` (a :meth:`figure`) meets the bar ``target`` of its data: with per-output
        targets, every output its own (a plain number, read back from a file, the strictest)."""
        outputs = getattr(value, "outputs", None)
        if self.targets is None or outputs is None:
            return meets(self.metric, value, target)
        return all(meets(self.metric, outputs[o], t) for o, t in self.targets.items())

    def short(self, outputs):
        """``{output: (value, its target)}`` of the outputs in ``outputs`` (``{output: value}``)
        short of their own target."""
        own = self.targets or {o: self.target for o in outputs}
        return {o: (v, own[o]) for o, v in outputs.items() if not meets(self.metric, v, own[o])}

    def key(self, value, metric):
        """Sort key of a value of ``metric``, better last: with per-output targets the output
        furthest short of (or least above) its own target decides, not the lowest figure."""
        outputs = getattr(value, "outputs", None)
        if self.targets is None or outputs is None or metric is not self.metric:
            return metric.sort_key(value)
        return min(metric.sort_key(outputs[o]) - metric.sort_key(t) for o, t in self.targets.items())

    def by_output(self, before, after):
        """What a figures record (``{before, after, target, ...}``) adds with per-output targets:
        each output's target (``targets``) and its values before and after (``outputs``);
        nothing where one target is every output's."""
        if self.targets is None:
            return {}
        return {"targets": dict(self.targets),
                "outputs": {"before": getattr(before, "outputs", None), "after": getattr(after, "outputs", None)}}

    def to_dict(self):
        out = {"metric": self.metric.name, "kind": "task" if self.is_task else "output"}
        if self.min_ratio is not None:
            out["min_ratio"] = self.min_ratio
        else:
            out["target"] = self.target
            if self.targets is not None:
                out["targets"] = dict(self.targets)
        if self.is_task:
            out["guide"] = self.guide.name
        return out


def targets_text(target, targets=None):
    """``0.99``, or per output ``'logits' 0.999, 'boxes' 0.99``."""
    if not targets:
        return threshold_text(target)
    return ", ".join(f"{o!r} {threshold_text(t)}" for o, t in targets.items())


def objective_for(metric, target, output_node, engine, evaluate=None, min_ratio=None):
    """The :class:`Objective` of a search on the outputs ``output_node`` of ``engine``, its
    arguments validated once here.

    Without ``evaluate``: ``metric`` must reach ``target`` (default 0.99 for cosine): a
    number, or the output checks' mapping ``{output or slice: value, "": default}`` (see
    :func:`per_output`). With it: the task score must reach ``target``, or ``min_ratio``
    times the float score (default 0.99 when neither is given); ``metric`` then only ranks
    the nodes.
    """
    guide = get_metrics(params.metric(metric))[0]  # one metric: a search reaches one target
    if isinstance(target, dict):
        if evaluate is not None:
            raise PTQError("with evaluate= the target is one task score; per-output targets are for an output metric")
        specs, targets = per_output(target, output_node, engine, guide)
        if len(set(targets.values())) > 1:
            return Objective(guide, guide, specs, target=strictest(guide, targets.values()), targets=targets)
        target = next(iter(targets.values()))  # one bar for all: the search as with a number
    else:
        specs = parse_outputs(output_node, engine)
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


def per_output(target, output_node, engine, metric):
    """``(specs, {output name: target})`` of a per-output ``target`` as the output checks read
    theirs (:func:`~pytest_ptq.outputs.thresholds`, :func:`~pytest_ptq.outputs.targeted`):
    each key an output or slice, two spellings of one output one output at the strictest of
    their targets; the default (``""`` or ``"default"``, an output named ``default`` being
    ``default=default``) for the outputs of ``output_node`` (None: the model's) that no key
    names. Without a default every output of ``output_node`` must be named."""
    qmodel = getattr(engine, "qmodel", engine)
    given = {k: params.threshold(v, metric.name, f"target for {k or 'the default'!r}")
             for k, v in thresholds(target, qmodel).items()}
    specs, targets, _ = targeted(given, engine, metric)
    rest = others(parse_outputs(output_node, engine), specs, qmodel)
    if rest and "" not in given and output_node is not None:
        raise PTQError(f"output {rest[0].name!r} of output_node (-o) has no target: name it in the targets, or give a "
                       "default ('default' / '')")
    if "" in given:
        specs += rest
        targets.update((s.name, given[""]) for s in rest)
    if not specs:
        raise PTQError(f"the targets {shown(target)} name no output; name outputs (or slices) or give a default "
                       "('default' / '')")
    return specs, targets


def _number(value, what):
    try:
        return params.number(value, what)
    except PTQError:
        raise PTQError(f"{what} must be a number, got {value!r}") from None

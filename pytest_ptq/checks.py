"""Accuracy checks and their results.

Each ``check_*`` function measures one property of an :class:`Analysis` and returns a
result object that is true when the check passes and carries its figures (like
Polygraphy's ``DistanceMetricsResult``); ``assert_*`` raises :class:`ContractFailed` with
the result's plain-text report when it does not. :class:`PTQ` (the ``ptq`` fixture) binds
them to one test's model and settings and records every result for the reports.

Thresholds follow the metric's direction: a floor for similarities (cosine, sqnr, correlation), a
ceiling for errors (mse, mre, chebyshev, l1, kl). Per-output thresholds are a dict whose
``""`` key is the default for every model output not named, Polygraphy style; a key may
be an output slice such as ``"cls=prob[:, 4:]"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import math
import os
import statistics
from pathlib import Path

from . import guard, params
from .baseline import Baseline, BaselineError, compare, measure
from .errors import PTQError, as_sentence, closest, user_level
from .errors import shown as shown_value
from .metrics import COSINE, NO_VALUES, get_metric, get_metrics, held_no_values
from .outputs import key_of, others, parse_output, targeted
from .outputs import thresholds as output_thresholds
from .tables import fmt, format_table, listed, printable, threshold_text

# How many rows a failure message lists before it says "... N more".
_CAP = 20


class ContractFailed(AssertionError):
    """A check failed; ``result`` holds its figures and ``str()`` its report."""

    def __init__(self, result):
        super().__init__(result.text)
        self.result = result


class Result:
    """Common behaviour: truth is ``passed``; ``text`` is the readable report."""

    kind = "check"

    def __bool__(self):
        return bool(self.passed)

    def __str__(self):
        return self.text

    @property
    def text(self):
        # each line one line: a node or output name holding a newline or an escape sequence
        # would start lines of its own in a CI log (the names in the details are shown so too)
        details = "\n".join(map(printable, self.details.split("\n"))) if self.details else ""
        return printable(self.summary) + ("\n" + details if details else "")

    def measures(self):
        """What the check measured, each beside its threshold: dicts with ``what``, ``value``,
        ``bound`` (">=", "<=" or ""), ``threshold``, ``passed`` and ``on`` (the data)."""
        return []

    def headline(self):
        """The measured values beside their thresholds, in one line (the failing ones, or all
        when none fails); the summary when the check measures nothing."""
        ms = self.measures()
        shown = [m for m in ms if not m["passed"]] or ms
        if not shown or self.kind in ("baseline", "data"):  # their sentence names the file and what to run
            return self.summary
        more = f"; and {len(shown) - 3} more" if len(shown) > 3 else ""
        return "; ".join(_measure_text(m) for m in shown[:3]) + more

    def properties(self):
        """``(name, value)`` pairs for JUnit XML ``<property>`` elements: the figures, and the
        bounds they were judged against (a test tab shows no message beside them)."""
        return [(f"{self.scope}.{k}", v) for k, v in {**self.figures(), **self.bounds()}.items()]

    @property
    def scope(self):
        """What the property names start with: enough to tell this check's figures from those
        of another kind of check in the same test."""
        return f"ptq.{self.kind}"

    def bounds(self):
        """``{name: value}`` of what the figures were judged against (thresholds, the data)."""
        return {}

    def to_dict(self):
        """JSON-safe form for reports and xdist payloads."""
        return {"kind": self.kind, "passed": bool(self.passed), "summary": self.summary,
                "details": self.details, "figures": {k: _plain(v) for k, v in self.figures().items()},
                "headline": self.headline(), "measures": [{k: _plain(v) if not isinstance(v, (list, dict)) else v
                                                            for k, v in m.items()} for m in self.measures()]}


def _measure_text(m):
    value = m["value"] if isinstance(m["value"], str) else fmt(m["value"])
    need = f", needs {m['bound']} {threshold_text(m['threshold'])}" if m.get("bound") else ""
    on = f" on {m['on']}" if m.get("on") else ""
    detail = f" ({m['detail']})" if m.get("detail") else ""
    return f"{m['what']} {value}{detail}{on}{need}"


def _on(samples, data, holdout):
    """"24 held-out samples" or "16 calibration samples"."""
    return f"{samples} {'held-out' if holdout else 'calibration'} sample(s) ({data})"


def _plain(value):
    return value if isinstance(value, (str, int, bool)) or value is None else float(value)


def _bound(metric):
    return ">=" if metric.higher_is_better else "<="


# -- outputs -------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class OutputResult(Result):
    """The fully quantized model against the float one, per output (or output slice)."""

    passed: bool
    metric: str
    values: dict  # output -> value
    thresholds: dict  # output -> threshold
    samples: int
    model: str
    data: str
    holdout: str | None = None  # the held-out data judged on (absolute), None: calibration data
    parts: dict = dataclasses.field(default_factory=dict)  # output -> its spec where it is a slice
    # output -> its shape where it held no values on any sample: its value is None, not judged
    unjudged: dict = dataclasses.field(default_factory=dict)
    kind = "outputs"

    def __repr__(self):
        return f"OutputResult(passed={self.passed}, metric={self.metric!r}, values={self.values})"

    @property
    def judged(self):
        """``{output: value}`` of the outputs that held values: those the check judges."""
        return {o: v for o, v in self.values.items() if o not in self.unjudged}

    @property
    def failing(self):
        m = get_metrics(self.metric)[0]
        return [o for o, v in self.judged.items() if not _meets(m, v, self.thresholds[o])]

    @property
    def summary(self):
        m = get_metrics(self.metric)[0]
        bad, judged = self.failing, self.judged
        where = f"{self.model}, {self.samples} sample(s) of {self.data}"
        if bad:
            listed = ", ".join(f"{o!r} {fmt(self.values[o])} (needs {_bound(m)} {fmt(self.thresholds[o])})"
                               for o in bad[:5])
            return (f"output {self.metric} fails for {len(bad)} of {len(judged)} output(s): {listed}"
                    f"{self._not_judged} [{where}]")
        worst = min(judged, key=lambda o: m.sort_key(judged[o]))
        return (f"output {self.metric} meets every threshold (worst {worst!r} {fmt(self.values[worst])} "
                f"{_bound(m)} {fmt(self.thresholds[worst])}){self._not_judged} [{where}]")

    @property
    def _not_judged(self):
        if not self.unjudged:
            return ""
        one = len(self.unjudged) == 1
        shown = ", ".join(f"{o!r} (shape {shape})" for o, shape in self.unjudged.items())
        return (f"; {shown} not judged: {'it holds' if one else 'they hold'} no values on any sample, "
                f"{NO_VALUES}")

    def measures(self):
        m = get_metrics(self.metric)[0]
        on = _on(self.samples, self.data, self.holdout)
        return [{"what": f"{self.metric} of {o!r}" if len(self.values) > 1 else self.metric, "value": v,
                 "bound": _bound(m), "threshold": self.thresholds[o], "passed": _meets(m, v, self.thresholds[o]),
                 "on": on, "output": o} for o, v in self.judged.items()]

    @property
    def details(self):
        m = get_metrics(self.metric)[0]
        if len(self.values) == 1:  # the summary says it all
            return ""
        rows = [{"output": o, self.metric: NO_VALUES if o in self.unjudged else v,
                 "threshold": f"{_bound(m)} {fmt(self.thresholds[o])}",
                 "verdict": "not judged" if o in self.unjudged else "ok" if _meets(m, v, self.thresholds[o]) else "FAIL"}
                for o, v in self.values.items()]
        return format_table(rows, ["output", self.metric, "threshold", "verdict"], _CAP)

    def figures(self):
        return {f"{o}.{self.metric}": v for o, v in self.judged.items()}

    def bounds(self):
        # named by metric: a cosine floor and an mse ceiling on one output are both thresholds
        return {**{f"{o}.{self.metric}.threshold": t for o, t in self.thresholds.items()},
                f"{self.metric}.samples": self.samples,
                f"{self.metric}.data": "held-out" if self.holdout else "calibration"}


def _meets(metric, value, threshold):
    # A bound is a bound: equality passes, nothing else is fudged (a NaN never passes).
    return value >= threshold if metric.higher_is_better else value <= threshold


def check_outputs(analysis, threshold, metric=COSINE, holdout=None):
    """Output ``metric`` of the quantized model vs float, each against its threshold.

    ``threshold``: a number or ``{output or slice: value, "": default}`` (see module doc).
    Model outputs not named get the ``""`` value; without one only the named are checked.
    """
    m = get_metric(metric)
    th = {k: params.threshold(v, m.name, f"output {m.name} threshold{f' for {k!r}' if k else ''}")
          for k, v in output_thresholds(threshold, analysis).items()}
    if not th:
        raise PTQError(f"no threshold for output {m.name}; pass a number or {{output: value}}")
    specs, limit, keys = targeted(th, analysis, m)
    metrics = analysis.output_metrics(specs, [m.name], holdout) if specs else None
    values = {name: vals[m.name] for name, vals in metrics.values.items()} if specs else {}
    empty = dict(metrics.empty) if specs else {}
    if "" in th:  # the default outputs (a concatenation of parts of unlike size: each part) not named
        qm = analysis.qmodel
        if not any(qm.is_float_tensor(n) for n in qm.output_names):  # a check that could not fail
            said, source = qm.unjudged(qm.output_names[0])
            raise PTQError(f"{said}, and the model has no float output: name the tensor to judge in the check's "
                           f"outputs ({{{source or 'a float tensor'!r}: {threshold_text(th[''])}}}), or judge the ids "
                           "with an accuracy evaluate function")
        metrics = analysis.output_metrics(None, [m.name], holdout)
        rest = others([parse_output(name, qm) for name in metrics.values], specs, qm)
        for s in rest:
            limit[s.name], values[s.name] = th[""], metrics.values[s.name][m.name]
            keys[s.name] = key_of(s.name)
            if s.name in metrics.empty:
                empty[s.name] = metrics.empty[s.name]
    # an output that held no values reads a perfect score no comparison measured: not judged
    unjudged = {o: empty[o] for o in values if o in empty}
    if values and len(unjudged) == len(values):  # a check that could not fail
        raise PTQError(held_no_values(unjudged, analysis.relative(metrics.data)))
    ok = all(_meets(m, values[o], limit[o]) for o in values if o not in unjudged)
    return OutputResult(passed=ok, metric=m.name, values=values, thresholds=limit, samples=metrics.samples,
                        model=analysis.label, data=analysis.relative(metrics.data),
                        holdout=None if holdout is None else str(holdout),
                        parts={o: k for o, k in keys.items() if k != o}, unjudged=unjudged)


# -- nodes ---------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class NodeResult(Result):
    """Every node's sensitivity against a limit, with an allow-list."""

    passed: bool
    metric: str
    threshold: float
    node_type: str
    offenders: list  # (node, value), worst first
    allowed: list  # (node, value) past the limit but allowed
    worst: tuple  # (node, value) or ()
    nodes: int
    table: str
    model: str
    on: str = ""  # the samples ranked on: "4 calibration sample(s) (calib)"
    unmeasured: list = dataclasses.field(default_factory=list)  # nodes whose outputs held no values: not judged
    kind = "nodes"

    def __repr__(self):
        return f"NodeResult(passed={self.passed}, offenders={self.offenders})"

    @property
    def summary(self):
        m = get_metrics(self.metric)[0]
        rule = f"{self.metric} {_bound(m)} {fmt(self.threshold)} with only that node quantized"
        if self.offenders:
            listed = ", ".join(f"{n} ({fmt(v)})" for n, v in self.offenders[:5])
            more = f" and {len(self.offenders) - 5} more" if len(self.offenders) > 5 else ""
            return (f"{len(self.offenders)} of {self.nodes} {_nodes(self.node_type)} of {self.model} are too "
                    f"sensitive (need {rule}): {listed}{more}; keep them in higher precision, or allow "
                    f"them with allow=[...]{self._left_out}")
        allowed = f"; {len(self.allowed)} allowed past it" if self.allowed else ""
        worst = f" (most sensitive {self.worst[0]}: {fmt(self.worst[1])})" if self.worst else ""
        return f"all {self.nodes} {_nodes(self.node_type)} of {self.model} meet {rule}{worst}{allowed}{self._left_out}"

    @property
    def _left_out(self):
        if not self.unmeasured:
            return ""
        return (f"; {len(self.unmeasured)} left out, whose quantization changes no value compared ("
                f"{listed(self.unmeasured, 3)}): no values compared")

    @property
    def details(self):
        return "most sensitive nodes:\n" + self.table if self.table else ""

    def measures(self):
        if not self.worst:
            return []
        m = get_metrics(self.metric)[0]
        name, value = (self.offenders[0] if self.offenders else self.worst)
        return [{"what": f"{self.metric} with only {name} quantized", "value": value, "bound": _bound(m),
                 "threshold": self.threshold, "passed": not self.offenders, "on": self.on,
                 "over_limit": len(self.offenders)}]

    @property
    def scope(self):
        # a check of the weight nodes and one of the activation nodes in one test count apart
        return f"ptq.nodes.{self.node_type}"

    def bounds(self):
        return {f"{self.metric}.threshold": self.threshold}

    def figures(self):
        fig = {"over_limit": len(self.offenders)}
        if self.worst:
            fig["worst"] = self.worst[0]
            fig[f"worst.{self.metric}"] = self.worst[1]
        return fig


def _nodes(node_type):
    return "nodes" if node_type == "node" else f"{node_type} nodes"


def check_nodes(analysis, threshold, metric=COSINE, node_type="node", allow=(), outputs=None, top=10):
    """No node of ``node_type`` more sensitive than ``threshold``, except allowed ones.

    A node's sensitivity is ``metric`` at the outputs with only that node quantized.
    ``allow``: node names or glob patterns (``"conv*"``); an entry matching no node is an
    error, since it is most likely a typo.
    """
    m = get_metric(metric)
    limit = params.threshold(threshold, m.name, f"node {m.name} threshold")
    sens = analysis.sensitivity(node_type, m.name, outputs)
    names = list(sens)
    patterns = params.names(allow, "allow") or []
    for p in patterns:
        if not any(_allows(p, n) for n in names):
            near = closest(p, names)
            # a pattern is seldom close to a whole name: then some names show what to write
            hint = f"did you mean {', '.join(repr(n) for n in near)}?" if near else f"they are {listed(names, 5)}"
            raise PTQError(f"allow-list entry {p!r} matches none of the {_nodes(node_type)} of {analysis.label}; "
                           f"{hint}; fix or remove the entry")
    offenders, allowed = [], []
    # a node changing no value compared (only outputs that held no values, or none of those compared) has no
    # figure: passing it would be a made-up score
    unmeasured = [n for n in names if sens[n][m.name] is None]
    judged = [n for n in names if n not in unmeasured]
    if unmeasured and not judged:  # a check that could not fail
        raise PTQError(f"no {_nodes(node_type)[:-1]} of {analysis.label} can be judged: quantizing any of them alone "
                       f"{sens.details[unmeasured[0]]['no_values']} (no values compared); check outputs that hold "
                       "values")
    for name in judged:
        v = sens[name][m.name]
        if not _meets(m, v, limit):
            (allowed if any(_allows(p, name) for p in patterns) else offenders).append((name, v))
    worst = (judged[0], sens[judged[0]][m.name]) if judged else ()
    return NodeResult(passed=not offenders, metric=m.name, threshold=limit, node_type=node_type,
                      offenders=offenders, allowed=allowed, worst=worst, nodes=len(judged),
                      table=sens.table(limit=top, threshold="range max|x|") if names else "", model=analysis.label,
                      on=_on(sens.samples, analysis.relative(analysis.key.data), None), unmeasured=unmeasured)


def _allows(pattern, name):
    """An allow-list entry covers a node: its exact name (an exporter's may hold '[0]', a
    character class to fnmatch), else a shell pattern, case kept on every system."""
    return name == pattern or fnmatch.fnmatchcase(name, pattern)


# -- task accuracy -------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class AccuracyResult(Result):
    """A user metric (accuracy, mAP, ...) of the quantized model relative to float."""

    passed: bool
    float_score: float
    quantized_score: float
    ratio: float
    min_ratio: float
    evaluate: str
    model: str
    samples: int = 0
    data: str = ""
    holdout: str | None = None  # the held-out data judged on (absolute), None: calibration data
    source: str = ""  # FILE.py:NAME that loads the evaluation function again, "" where none does
    nonfinite: tuple = ()  # quantized outputs handed to the function that held NaN or Inf
    kind = "accuracy"

    def __repr__(self):
        return f"AccuracyResult(passed={self.passed}, ratio={self.ratio:.6g})"

    @property
    def summary(self):
        if not math.isfinite(self.quantized_score):
            if self.nonfinite:
                why = (f"its quantized output(s) {listed(list(self.nonfinite), 5)} held NaN or Inf; look for the "
                       "nodes that make them non-finite")
            else:  # the metric's own arithmetic: one class never predicted, say
                why = (f"the evaluation function {self.evaluate} returned {self.quantized_score!r} for the quantized "
                       f"model while its outputs were finite (a "
                       f"{'0/0' if math.isnan(self.quantized_score) else 'division by 0'} in the metric?)")
            return (f"{self.evaluate}: quantized {self.quantized_score!r}, not a finite score (float "
                    f"{fmt(self.float_score)}), which does not meet the {self.min_ratio:.3%} required; {why} "
                    f"[{self.model}]")
        verdict = "meets" if self.passed else "is below"
        return (f"{self.evaluate}: quantized {fmt(self.quantized_score)} = {self.ratio:.3%} of float "
                f"{fmt(self.float_score)}, which {verdict} the {self.min_ratio:.3%} required [{self.model}]")

    details = ""

    def measures(self):
        return [{"what": f"{self.evaluate} ratio to float", "value": self.ratio,
                 "detail": f"quantized {fmt(self.quantized_score)}, float {fmt(self.float_score)}",
                 "bound": ">=", "threshold": self.min_ratio, "passed": bool(self.passed),
                 "on": _on(self.samples, self.data, self.holdout) if self.samples else ""}]

    def figures(self):
        return {"float": self.float_score, "quantized": self.quantized_score, "ratio": self.ratio}

    def bounds(self):
        return {"min_ratio": self.min_ratio, "samples": self.samples, "data": "held-out" if self.holdout else "calibration"}


def check_accuracy(analysis, evaluate, min_ratio=params.DEFAULT_MIN_RATIO, holdout=None):
    """``evaluate`` of the quantized model at least ``min_ratio`` times that of the float one.

    ``evaluate(run, data) -> float``, higher is better: ``run(feeds)`` maps
    ``{input: array}`` to ``{output: array}``; ``data`` is the sample set (calibration data,
    or ``holdout``): ``len(data)``, ``data.sample(i)``, iterating yields feed dicts.
    """
    __tracebackhide__ = True  # an evaluation function that raises shows its own frames
    ratio_min = params.ratio(min_ratio)
    params.evaluation_function(evaluate)
    f_score, q_score, nonfinite = analysis.accuracy(evaluate, holdout)
    name = getattr(evaluate, "__name__", None) or type(evaluate).__name__
    if not 0 < f_score < math.inf:
        raise PTQError(f"the evaluation function {name} gave the float model {f_score!r}; a ratio needs a "
                       "positive, finite score, so return an accuracy-like number where higher is better")
    ratio = q_score / f_score
    data = analysis.dataset(holdout)
    return AccuracyResult(passed=math.isfinite(ratio) and ratio >= ratio_min, float_score=f_score, quantized_score=q_score,
                          ratio=ratio, min_ratio=ratio_min, evaluate=name, model=analysis.label, samples=len(data),
                          data=analysis.relative(holdout if holdout is not None else analysis.key.data),
                          holdout=None if holdout is None else str(holdout), source=_source_of(evaluate),
                          nonfinite=nonfinite)


def _source_of(function):
    """``FILE.py:NAME`` (absolute) that loads ``function`` again, as ``--evaluate`` and a
    contract's ``evaluate:`` take it: defined at the top level of a file; else "" (a lambda, a
    closure, a method, a callable object)."""
    import inspect

    name = getattr(function, "__qualname__", "")
    # the globals of the module that defines it (a decorator's wrapper has its own module's),
    # whether or not that module is still in sys.modules
    scope = getattr(inspect.unwrap(function), "__globals__", {})
    if not name.isidentifier() or scope.get(name) is not function:
        return ""
    file = scope.get("__file__") or ""
    return f"{os.path.abspath(file)}:{name}" if file.endswith(".py") and os.path.isfile(file) else ""


# -- baseline ------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class BaselineResult(Result):
    """Sensitivity and output metrics against the committed baseline."""

    passed: bool
    status: str  # "ok" | "degraded" | "mismatch" | "missing" | "created" | "rewritten" | "unreadable"
    path: str
    diff: object  # baseline.Diff or None
    tolerance: float
    model: str
    problem: str = ""  # what is wrong with an unreadable or malformed baseline, naming the key
    foreign: bool = False  # not a baseline this version may rewrite (another file, a newer format)
    detail: str = ""  # why it could not be read
    # the command that writes it: this run's own options, so that it runs as printed
    update_command: str = "pytest --ptq-update-baseline"
    rerun_command: str = "pytest"
    kind = "baseline"

    def __repr__(self):
        return f"BaselineResult(passed={self.passed}, status={self.status!r})"

    @property
    def summary(self):
        p = self.path
        if self.status == "missing":
            return (f"baseline {p} does not exist, so there is nothing to compare {self.model} against; "
                    f"create it with `{self.update_command}`, review it and commit it")
        if self.status == "created":
            return (f"baseline {p} did not exist and has been written; review and commit it, then rerun "
                    f"`{self.rerun_command}` (this run fails so that a run never passes on a baseline it wrote "
                    "itself)")
        if self.status == "unreadable":
            why = f" ({self.detail})" if self.detail else ""
            if self.foreign:
                return f"baseline {p} {self.problem or 'cannot be read'}{why}"
            return (f"baseline {p} {self.problem or 'cannot be read'}{why}; rewrite it with "
                    f"`{self.update_command}`")
        d = self.diff
        if self.status == "rewritten":
            what = "failed against it and " if d is not None and not d.ok else (
                f"{self.problem} and " if self.problem else "")
            tail = "" if self.passed else "; rerun to compare against it"
            return f"baseline {p} {what}has been rewritten from this run ({self.model}){tail}"
        if d.other_model:
            return (f"baseline {p} does not fit this check: {d.mismatch}; give this model a baseline of its own "
                    "(--ptq-baseline-dir, a marker's or a contract's baseline), or, if the model moved, rewrite "
                    f"this one with `{self.update_command.replace('--ptq-update-baseline', '--ptq-update-all')}` "
                    "(a failing run does not rewrite another model's baseline)")
        if d.mismatch:
            return (f"baseline {p} does not fit this check: {d.mismatch}; rewrite it with "
                    f"`{self.update_command}`")
        if self.status == "degraded":
            parts = []
            if d.nodes:
                parts.append(f"{len(d.nodes)} node(s)")
            if d.outputs:
                parts.append(f"{len(d.outputs)} output(s)")
            return (f"{' and '.join(parts)} of {self.model} got worse than baseline {p} by more than "
                    f"{threshold_text(self.tolerance)} {d.metric}; if intended, run `{self.update_command}` "
                    "and commit the new file")
        # a baselined node gone from the model (another quantization, a rewrite) compares no more: say so
        gone = (f"; {len(d.removed)} of its node(s) are not in the model now ({', '.join(d.removed[:3])}"
                f"{', ...' if len(d.removed) > 3 else ''}) and were not compared" if d.removed else "")
        return (f"{self.model} is within {threshold_text(self.tolerance)} {d.metric} of baseline {p} "
                f"({len(d.improved)} value(s) improved){gone}")

    @property
    def details(self):
        d = self.diff
        if d is None:  # an unreadable file's detail is in the summary already (it came twice)
            return ""
        lines = []
        for title, moves in (("outputs", d.outputs), ("nodes", d.nodes)):
            if not moves:
                continue
            worse = [mv.worse for mv in moves]
            lines.append(f"{title} worse by more than {threshold_text(d.tolerance)} ({d.metric}, old -> new): "
                         f"max {fmt(max(worse))}, mean {fmt(sum(w / len(worse) for w in worse))}, "
                         f"median {fmt(statistics.median(worse))}")
            lines += [f"  {printable(mv.name)}: {fmt(mv.old)} -> {fmt(mv.new)} (worse by {fmt(mv.worse)})"
                      for mv in moves[:_CAP]]
            if len(moves) > _CAP:
                lines.append(f"  ... {len(moves) - _CAP} more")
        if d.improved and self.status in ("degraded", "ok"):
            names = ", ".join(f"{printable(mv.name)} {fmt(mv.old)} -> {fmt(mv.new)}" for mv in d.improved[:5])
            lines.append(f"improved past the tolerance: {names}" + (" ..." if len(d.improved) > 5 else ""))
        if d.removed:
            lines.append(f"in the baseline but not measured now: {', '.join(map(printable, d.removed[:10]))}")
        if d.added:
            lines.append(f"measured now but not in the baseline: {', '.join(map(printable, d.added[:10]))}")
        lines += d.notes
        return "\n".join(lines)

    def measures(self):
        d = self.diff
        if d is None or not (d.nodes or d.outputs):
            return [{"what": "baseline", "value": self.status, "bound": "", "threshold": None,
                     "passed": bool(self.passed), "on": self.path}]
        worst = max((mv for mv in d.nodes + d.outputs), key=lambda mv: mv.worse)
        return [{"what": f"{d.metric} of {worst.name} moved the wrong way by", "value": worst.worse, "bound": "<=",
                 "threshold": self.tolerance, "passed": False, "on": f"baseline {self.path}"}]

    def figures(self):
        d = self.diff
        fig = {"status": self.status}
        if d is not None:
            fig["nodes_worse"] = len(d.nodes)
            fig["outputs_worse"] = len(d.outputs)
        return fig


UPDATES = ("none", "failing", "all")


def check_baseline(analysis, path, update="none", tolerance=0.001, node_type="node", metric=COSINE,
                   inputs=None, update_command=None, rerun_command=None, named=(), written=None):
    """Compare ``analysis`` with the baseline at ``path`` and apply the update policy;
    ``named``: outputs and slices whose figures the baseline keeps too (see ``measure``).
    ``written``: ``{resolved path: status}`` of the baselines this run wrote, kept by the
    caller across checks: a later check of one (a rerun by pytest-rerunfailures) fails as the
    first did instead of passing against the numbers it wrote itself.

    ``update``: ``"none"`` (CI: a missing baseline fails), ``"failing"`` (write missing or
    failing baselines; the check still fails), ``"all"`` (rewrite and pass). A baseline is
    only ever written, never deleted, and never onto what the analysis reads (or ``inputs``:
    :class:`~pytest_ptq.guard.Inputs`, default the analysis' model, data and float model).
    """
    tol = params.non_negative(tolerance, "tolerance")
    if update not in UPDATES:
        raise PTQError(f"update must be one of {', '.join(UPDATES)}, got {shown_value(update)}")
    path = params.baseline_path(path, inputs if inputs is not None else analysis.inputs(), writable=update != "none")
    # a killed update leaves its temporary file beside the baseline; never let it be committed
    guard.clean_stale_temps(path.parent, path.name)
    new = measure(analysis, metric, node_type, relative_to=path.parent, named=named)
    shown = analysis.relative(path)

    def result(passed, status, diff=None, problem="", detail="", foreign=False):
        return BaselineResult(passed=passed, status=status, path=shown, diff=diff, tolerance=tol,
                              model=analysis.label, problem=problem, detail=detail, foreign=foreign,
                              update_command=update_command or "pytest --ptq-update-baseline",
                              rerun_command=rerun_command or "pytest")

    mine = written.get(path.resolve()) if written is not None and update != "all" else None
    # another model's check of a baseline this run wrote compares with it below: its file says
    # whose it is, and a second "has been written" hid that it held the first model's numbers
    if mine is not None and not _made_for_another(path, new, tol):
        return result(False, mine)

    def wrote(status, diff=None, problem=""):
        if written is not None:
            written[path.resolve()] = status
        return result(update == "all", status, diff, problem=problem)

    if not path.exists():
        if update == "none":
            return result(False, "missing")
        # exclusive: of two xdist workers writing one missing baseline, the second compares
        # with the first's file instead of replacing it
        with contextlib.suppress(FileExistsError):
            new.save(path, exclusive=True)
            return wrote("created")
    try:
        old = Baseline.load(path)
    except BaselineError as exc:
        if update == "none":
            return result(False, "unreadable", problem=exc.problem, detail=exc.detail, foreign=exc.foreign)
        if exc.foreign:
            raise PTQError(f"baseline {shown_value(str(path), 240)} {exc.problem}; pytest-ptq only ever replaces its "
                           "own baselines, so choose another path for this one") from None
        new.save(path)
        return wrote("rewritten", problem=exc.problem)
    diff = compare(old, new, tol)
    # another model's baseline is never rewritten on a failure: one of two models sharing the
    # name replaced the other's committed baseline, which then passed against its numbers
    if update == "all" or (update == "failing" and not diff.ok and not diff.other_model):
        new.save(path)
        return wrote("rewritten", diff)
    return result(diff.ok, "ok" if diff.ok else "mismatch" if diff.mismatch else "degraded", diff)


def _made_for_another(path, new, tolerance):
    """Whether the baseline at ``path`` was made for another model than ``new``'s."""
    try:
        return compare(Baseline.load(path), new, tolerance).other_model
    except BaselineError:
        return False


# -- calibration data ----------------------------------------------------------------------
SEVERITIES = params.SEVERITIES


@dataclasses.dataclass(repr=False)
class DataResult(Result):
    """The calibration data checks of :func:`pytest_ptq.datacheck.check_data`; fails on any
    finding at or above ``max_severity`` (error > warning > info)."""

    passed: bool
    max_severity: str
    findings: list  # {check, severity, message, fix, input, dataset, samples}, errors first
    samples: int
    model: str
    data: str
    holdout: str | None = None
    kind = "data"

    def __repr__(self):
        return f"DataResult(passed={self.passed}, failing={[f['check'] for f in self.failing]})"

    @property
    def failing(self):
        """The findings at or above ``max_severity``, errors first."""
        limit = SEVERITIES.index(self.max_severity)
        return [f for f in self.findings if SEVERITIES.index(f["severity"]) <= limit]

    @property
    def summary(self):
        where = f"calibration data {self.data}" + (f" (held out: {self.holdout})" if self.holdout else "")
        bad = self.failing
        if bad:
            listed = ", ".join(f"{f['check']} ({f['severity']})" for f in bad[:6])
            more = f" and {len(bad) - 6} more" if len(bad) > 6 else ""
            accept = ("" if any(f["severity"] == "error" for f in bad)
                      else '; or accept warnings by setting max_severity to error')
            return (f"{len(bad)} finding(s) at or above {self.max_severity} in the {where} of {self.model}: "
                    f"{listed}{more}; fix them as listed below{accept}")
        below = (f"; below it: {', '.join(f['check'] + ' (' + f['severity'] + ')' for f in self.findings[:6])}"
                 if self.findings else "")
        return (f"the {where} of {self.model} ({self.samples} sample(s)) have no finding at or above "
                f"{self.max_severity}{below}")

    @property
    def details(self):
        lines = []
        for f in self.findings:
            where = f"{f['dataset']}:{f['input']}" if f["input"] else f["dataset"]
            lines.append(f"{f['severity'].upper():7} {f['check']} [{where}]: {f['message']}")
            if f["samples"] and not all(x in f["message"] for x in f["samples"]):
                lines.append(f"        samples: {', '.join(f['samples'])}")
            if f["fix"]:
                lines.append(f"        fix: {f['fix']}")
        return "\n".join(map(printable, lines))  # an input or file name holding a newline stays on its line

    def measures(self):
        return [{"what": f"findings at or above {self.max_severity}", "value": len(self.failing), "bound": "<=",
                 "threshold": 0, "passed": bool(self.passed), "on": self.data}]

    def figures(self):
        count = {s: sum(f["severity"] == s for f in self.findings) for s in SEVERITIES}
        fig = {"errors": count["error"], "warnings": count["warning"], "notes": count["info"]}
        if self.failing:
            fig["failing"] = ",".join(f["check"] for f in self.failing)
        return fig


def check_data(analysis, max_severity="warning", holdout=None, threshold=None, metric=COSINE, threshold_from=None):
    """No finding of the calibration data checks at or above ``max_severity``.

    The checks (count, NaN/Inf, constant and duplicate samples, dtype, layout, value range
    against the calibrated input range, and with ``holdout`` whether the calibration set
    represents the held-out data) are those of ``ptq-debug check-data``. The held-out data
    are judged by ``metric`` against ``threshold``: a number, or output floors as
    :func:`check_outputs` takes them, of which the loosest (the worst output must meet it,
    where every output meets its own), on the outputs they name where none is a default;
    ``threshold_from`` says where it comes from.
    """
    params.severity(max_severity)
    m = get_metric(metric)
    floors = {k: params.threshold(v, m.name, f"data check {m.name} threshold")
              for k, v in output_thresholds(threshold, analysis).items()}
    threshold = None
    for floor in floors.values():
        if threshold is None or m.worse(floor, threshold):
            threshold = floor
    if len(set(floors.values())) > 1 and threshold_from:
        threshold_from += ", the loosest of several"
    # floors of some outputs (or slices) alone judge those: an output no floor names failed a
    # contract whose outputs item passed, held to another output's floor
    named = None if "" in floors or not floors else [k for k in floors if k]
    report = analysis.data_check(holdout, m.name, threshold, threshold_from, named)
    findings = [{"check": f.check, "severity": f.severity, "message": f.message, "fix": f.fix, "input": f.input,
                 "dataset": f.dataset, "samples": [analysis.relative(s) if "/" in s or os.sep in s else s for s in f.samples]}
                for f in report.findings]
    limit = SEVERITIES.index(max_severity)
    samples = max((s["samples"] for s in report.stats.get("calibration", {}).values()), default=0)
    return DataResult(passed=not any(SEVERITIES.index(f["severity"]) <= limit for f in findings),
                      max_severity=max_severity, findings=findings, samples=samples, model=analysis.label,
                      data=analysis.relative(analysis.key.data),
                      holdout=analysis.relative(holdout) if holdout is not None else None)


# -- stages --------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class StagesResult(Result):
    """The integer-kernel model (onnxruntime's fused Q/DQ kernels) against the float model and
    against the fake-quant simulation the other checks measure."""

    passed: bool
    threshold: float
    values: dict  # stage -> output cosine against the unoptimised float model, pipeline order
    kernel_gap: float  # output cosine between the integer and the fake-quant model
    first_drop: str | None
    message: str
    samples: int
    model: str
    float_model: str
    descriptions: dict = dataclasses.field(default_factory=dict)
    kind = "stages"

    def __repr__(self):
        return f"StagesResult(passed={self.passed}, integer={self.values.get('integer')}, gap={self.kernel_gap})"

    @property
    def summary(self):
        t = self.threshold
        where = f"[{self.model} vs float {self.float_model}, {self.samples} sample(s)]"
        problems = []
        if not _meets(_cosine(), self.values["integer"], t):
            problems.append(f"the integer-kernel outputs reach cosine {fmt(self.values['integer'])} against "
                            f"float, below {threshold_text(t)}")
        if not _meets(_cosine(), self.kernel_gap, t):
            problems.append(f"the integer kernels reach only cosine {fmt(self.kernel_gap)} against the "
                            f"fake-quant simulation, below {threshold_text(t)}")
        if problems:
            return "; ".join(problems) + f". {self.message} {where}"
        return (f"the integer-kernel outputs keep cosine {fmt(self.values['integer'])} >= {threshold_text(t)} against "
                f"float and {fmt(self.kernel_gap)} against the fake-quant simulation {where}")

    @property
    def details(self):
        required = f">= {threshold_text(self.threshold)}"
        rows = [{"stage": s, COSINE: v, "required": required if s == "integer" else "",
                 "description": self.descriptions.get(s, "")} for s, v in self.values.items()]
        rows.append({"stage": "integer vs fake-quant", COSINE: self.kernel_gap, "required": required,
                     "description": "how far the integer kernels are from the simulation"})
        return format_table(rows, ["stage", COSINE, "required", "description"])

    def measures(self):
        t, m = self.threshold, _cosine()
        on = f"{self.samples} calibration sample(s)"
        return [{"what": "integer-kernel output cosine vs float", "value": self.values["integer"], "bound": ">=",
                 "threshold": t, "passed": _meets(m, self.values["integer"], t), "on": on},
                {"what": "integer kernels vs fake-quant cosine", "value": self.kernel_gap, "bound": ">=",
                 "threshold": t, "passed": _meets(m, self.kernel_gap, t), "on": on}]

    def figures(self):
        fig = {f"{stage}.{COSINE}": v for stage, v in self.values.items()}
        fig[f"kernel_gap.{COSINE}"] = self.kernel_gap
        if self.first_drop:
            fig["first_drop"] = self.first_drop
        return fig


def _cosine():
    return get_metrics(COSINE)[0]


def check_stages(analysis, float_model=None, min_cosine=params.DEFAULT_MIN_COSINE):
    """The integer-kernel outputs at least ``min_cosine`` against the float model, and at least
    ``min_cosine`` against the fake-quant outputs (so that what the other checks simulate is
    what onnxruntime runs). ``float_model`` defaults to the analysis' float model."""
    from .stages import verdict

    t = params.cosine(min_cosine, "min_cosine")
    report = analysis.stages(float_model)
    values = {s["stage"]: s["values"][COSINE] for s in report.stages}
    gap = report.kernel_gap["values"][COSINE]
    first_drop, message = verdict(values, gap, COSINE, t, cause=report.kernel_cause)
    m = _cosine()
    return StagesResult(passed=_meets(m, values["integer"], t) and _meets(m, gap, t), threshold=t, values=values,
                        kernel_gap=gap, first_drop=first_drop, message=message, samples=report.samples,
                        model=analysis.label, float_model=analysis.relative(report.float_model),
                        descriptions={s["stage"]: s["description"] for s in report.stages})


# -- the per-test helper -------------------------------------------------------------------
def _in_one_sentence(method):
    """``method`` with bad input (a PTQError, or one of our warnings raised as an error)
    failing the test in its one sentence, as the plugin's own input errors do, not as a
    traceback through the package."""
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        __tracebackhide__ = True
        kwargs = _unaliased(kwargs, method.__name__)
        try:
            return method(*args, **kwargs)
        except (PTQError, Warning) as exc:
            error = as_sentence(exc)
            if error is None:
                raise
        # outside the except block: no "during handling" chain
        from .settings import InputFailure

        raise InputFailure(error, pytrace=False)
    return wrapped


def _unaliased(kwargs, name):
    """``kwargs`` of ``ptq.<name>`` with each parameter under the name it takes, given in either
    spelling (``heldout=`` as the API spells ``holdout=``, see params.ALIASES)."""
    __tracebackhide__ = True
    try:
        return params.unaliased(kwargs, f"ptq.{name}()")
    except PTQError as exc:
        from .settings import InputFailure

        raise InputFailure(str(exc), pytrace=False) from None


def _spelled(method):
    """``method`` (an ``assert_*``) taking its parameters in either spelling, as its ``check_*``."""
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        __tracebackhide__ = True
        return method(*args, **_unaliased(kwargs, method.__name__))
    return wrapped


class PTQ:
    """The ``ptq`` fixture: the checks bound to one test's model and settings.

    Every ``check_*`` returns its result (true when it passes); every ``assert_*`` raises
    :class:`ContractFailed` on failure and returns the result otherwise. Bad input fails the
    test in one sentence (both forms, and ``suggest``). Each result is
    recorded for the failure section, JUnit properties and the HTML report.
    """

    def __init__(self, analysis, settings, record, baseline_path, inputs=None, commands=None, base=None,
                 written=None):
        self.analysis = analysis
        self._base = base  # the test module's folder: paths given to the checks are relative to it
        self.settings = settings
        self._record = record
        self._baseline_path = baseline_path
        self._inputs = inputs  # what the test reads beyond the analysis (a contract, its evaluate file)
        # how to run this test again, as printed in messages: {"update": ..., "rerun": ...}
        self._commands = commands or {}
        self._written = written  # the baselines the session wrote (see check_baseline)

    @property
    def engine(self):
        return self.analysis.engine

    def _here(self, path):
        """A path given to a check, relative to the test module as the marker's are (data in
        memory and absolute paths as they are)."""
        if self._base is None or not isinstance(path, (str, os.PathLike)):
            return path
        path = Path(os.path.expanduser(str(path)))
        return path if path.is_absolute() else Path(self._base) / path

    def _holdout(self, holdout):
        """The held-out data a check runs on: ``holdout`` (see :meth:`_here`), else the marker's."""
        return self._here(holdout) if holdout is not None else self.settings.holdout

    def _done(self, result):
        self._record(result)
        return result

    @_in_one_sentence
    def check_outputs(self, threshold=None, metric=COSINE, holdout=None):
        """Output similarity (or error) vs float; default threshold ``min_cosine``, on the
        marker's ``holdout`` data when it names some, else on the calibration data."""
        m = get_metric(metric)
        if threshold is None:
            if m.name != COSINE:
                raise PTQError(f"give a threshold for output {m.name}; only cosine has a default (min_cosine)")
            threshold = self.settings.min_cosine
        return self._done(check_outputs(self.analysis, threshold, m.name,
                                        self._holdout(holdout)))

    @_in_one_sentence
    def check_nodes(self, threshold=None, allow=None, node_type=None, metric=None, outputs=None):
        """No node more sensitive than ``threshold``; defaults ``min_node_cosine``, marker allow-list."""
        m = get_metrics(metric or self.settings.metric)[0]
        if threshold is None:
            if m.name != COSINE:
                raise PTQError(f"give a threshold for node {m.name}; only cosine has a default (min_node_cosine)")
            threshold = self.settings.min_node_cosine
        allowed = tuple(self.settings.allow) + tuple(params.names(allow, "allow") or ())
        return self._done(check_nodes(self.analysis, threshold, m.name, node_type or self.settings.node_type,
                                      allowed, outputs, self.settings.top))

    @_in_one_sentence
    def check_accuracy(self, evaluate, min_ratio=params.DEFAULT_MIN_RATIO, holdout=None):
        """``evaluate(run, data) -> float`` of quantized at least ``min_ratio`` x float."""
        __tracebackhide__ = True
        return self._done(check_accuracy(self.analysis, evaluate, min_ratio,
                                         self._holdout(holdout)))

    @_in_one_sentence
    def check_baseline(self, path=None, tolerance=None, node_type=None, metric=None, outputs=()):
        """Against the baseline file (default: from the test id under ``--ptq-baseline-dir``);
        ``outputs``: outputs or slices (``"tail=out[:, 2000:]"``) kept beside the model's own."""
        s = self.settings
        path = self._here(path) or s.baseline or self._baseline_path
        if callable(path):  # the test's default, claimed only by a test that compares with it
            path = path()
        inputs = self.analysis.inputs(*[p for p in (s.holdout,) if p is not None]) | self._inputs
        if isinstance(path, (str, Path)):
            self._warn_outside_root(Path(path))
        return self._done(check_baseline(
            self.analysis, path, s.update, s.tolerance if tolerance is None else tolerance,
            node_type or s.node_type, metric or s.metric, inputs=inputs,
            update_command=self._commands.get("update"), rerun_command=self._commands.get("rerun"),
            named=tuple(outputs or ()), written=self._written))

    def _warn_outside_root(self, path):
        # the baseline folder itself is warned about once, at start-up (see session.py)
        import warnings

        from .settings import PTQPathWarning, below

        root = self.analysis.root
        if below(path, root) or (self.settings.baseline_dir is not None and below(path, self.settings.baseline_dir)):
            return
        warnings.warn(PTQPathWarning(f"baseline {str(path)!r} lies outside the rootdir {str(root)!r}, so it is not "
                                     "kept with the project; move it under the rootdir unless that is intended"),
                      stacklevel=user_level())

    @_in_one_sentence
    def check_data(self, max_severity="warning", holdout=None, threshold=None, metric=COSINE):
        """The calibration data checks; fails on a finding at or above ``max_severity``. With
        held-out data (``holdout``, else the marker's or ``--ptq-holdout``) also whether the
        calibration set represents them, the quantized outputs judged there by ``metric``
        against ``threshold`` (default ``min_cosine``, as :meth:`check_outputs`)."""
        m = get_metric(metric)
        source, held = "as given", self._holdout(holdout)
        if held is None and (threshold is not None or metric != COSINE):
            raise PTQError("check_data's threshold and metric judge the held-out comparison alone; give held-out "
                           "data (holdout=, the marker's, or --ptq-holdout) or leave them out")
        if threshold is None and m.name == COSINE:
            threshold, source = self.settings.min_cosine, "min_cosine (--ptq-min-cosine)"
        return self._done(check_data(self.analysis, max_severity, held, threshold, m.name,
                                     source if threshold is not None else None))

    @_in_one_sentence
    def check_stages(self, float_model=None, min_cosine=None):
        """Integer-kernel outputs vs float and vs fake-quant, both >= ``min_cosine`` (default
        ``min_cosine``); the float model defaults to the marker's or ``--ptq-float-model``."""
        return self._done(check_stages(self.analysis, self._here(float_model) or self.settings.float_model,
                                       self.settings.min_cosine if min_cosine is None else min_cosine))

    @_in_one_sentence
    def suggest(self, target=None, remedy="float", metric=COSINE, outputs=None, budget=None, candidates=None,
                holdout=None, evaluate=None, min_ratio=None, costs=None, search="refine"):
        """The cheapest set of nodes to keep in float (``remedy="float"``), raise to 16 bit
        (``"int16"``), quantize per channel (``"per-channel"``) or any of these per node at
        ``costs`` (``"mixed"``) so that ``metric`` meets ``target`` (default ``min_cosine``; or
        per output, ``{output or slice: value, "": default}`` as :meth:`check_outputs` takes it), or
        with ``evaluate(run, data) -> float`` the task score meets ``target`` or ``min_ratio``
        x float (default 0.99 x). Chosen on the calibration samples and accepted on held-out
        data (``holdout``, else the marker's or ``--ptq-holdout``; without any, on calibration
        samples the search did not see). Returns the :class:`~pytest_ptq.remedy.Remedy` (true
        when met there) and keeps it for the HTML report. Budget in seconds."""
        m = get_metric(metric)
        if target is None and evaluate is None:
            if m.name != COSINE:
                raise PTQError(f"give a target for {m.name}; only cosine has a default (min_cosine)")
            target = self.settings.min_cosine
        return self.analysis.suggest(target, remedy, m.name, outputs, budget, candidates,
                                     self._holdout(holdout), evaluate,
                                     min_ratio, costs, search)

    # each assert_* takes its check_*'s parameters, by name (a test pins the two signatures)
    @_spelled
    def assert_outputs(self, threshold=None, metric=COSINE, holdout=None):
        __tracebackhide__ = True
        return _raise_unless(self.check_outputs, threshold=threshold, metric=metric, holdout=holdout)

    @_spelled
    def assert_nodes(self, threshold=None, allow=None, node_type=None, metric=None, outputs=None):
        __tracebackhide__ = True
        return _raise_unless(self.check_nodes, threshold=threshold, allow=allow, node_type=node_type, metric=metric,
                             outputs=outputs)

    @_spelled
    def assert_accuracy(self, evaluate, min_ratio=params.DEFAULT_MIN_RATIO, holdout=None):
        __tracebackhide__ = True
        return _raise_unless(self.check_accuracy, evaluate, min_ratio=min_ratio, holdout=holdout)

    @_spelled
    def assert_baseline(self, path=None, tolerance=None, node_type=None, metric=None, outputs=()):
        __tracebackhide__ = True
        return _raise_unless(self.check_baseline, path=path, tolerance=tolerance, node_type=node_type, metric=metric,
                             outputs=outputs)

    @_spelled
    def assert_data(self, max_severity="warning", holdout=None, threshold=None, metric=COSINE):
        __tracebackhide__ = True
        return _raise_unless(self.check_data, max_severity=max_severity, holdout=holdout, threshold=threshold,
                             metric=metric)

    @_spelled
    def assert_stages(self, float_model=None, min_cosine=None):
        __tracebackhide__ = True
        return _raise_unless(self.check_stages, float_model=float_model, min_cosine=min_cosine)


def _raise_unless(check, *args, **kwargs):
    __tracebackhide__ = True
    result = check(*args, **kwargs)
    if not result:
        raise ContractFailed(result)
    return result

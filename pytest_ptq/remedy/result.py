"""The outcome of a remedy search."""

from __future__ import annotations

import dataclasses
import json

from ..metrics import get_metrics, meets
from ..results import JsonResult
from ..tables import format_table, threshold_text, warning_lines
from .objective import TaskMetric, targets_text

REMEDIES = ("float", "int16", "per-channel")
MIXED = "mixed"
# A mixed search's default cost per remedied node: bytes per element of the tensor left
# off int8 (float 4, int16 2); a per-channel int8 weight runs on the same kernels but is
# still a change, so 1.
DEFAULT_COSTS = {"per-channel": 1.0, "int16": 2.0, "float": 4.0}
WHAT = {"float": "kept in float", "int16": "raised to 16 bit", "per-channel": "quantized per channel",
        MIXED: "remedied"}


def snippet(settings, call=None, overrides=True):
    """Remedy ``settings`` (see :func:`.terms.onnxruntime_settings`) as one call of ``call``
    (default: the quantizer they name, else quantize_static), ready to paste; "" when they
    change nothing. Without ``overrides`` (a quantizer with no such options), the switches
    per_channel and TensorQuantOverrides are left out."""
    parts = []
    if settings.get("per_channel") and overrides:
        parts.append("per_channel=True")
    if settings.get("nodes_to_exclude"):
        parts.append(f"nodes_to_exclude={settings['nodes_to_exclude']!r}")
    tensors = settings.get("TensorQuantOverrides")
    if tensors and overrides:
        body = ", ".join(f"{t!r}: [" + ", ".join(override_text(e) for e in entries) + "]"
                         for t, entries in tensors.items())
        parts.append("extra_options={'TensorQuantOverrides': {" + body + "}}")
    if not parts:
        return ""
    return f"{call or settings.get('quantizer', 'quantize_static')}(..., {', '.join(parts)})"


def override_text(entry, types="QuantType"):
    """A TensorQuantOverrides entry as Python quantize_static (or Quark, ``types`` its
    ``ExtendedQuantType``) takes: types as members of ``types``, a convert's receiving nodes as
    the set it requires."""
    def value(k, v):
        if k == "quant_type":
            return f"{types}.{v}"
        if k == "convert":
            return override_text(v, types)
        return repr(set(v)) if k == "recv_nodes" else repr(v)
    return "{" + ", ".join(f"{k!r}: {value(k, v)}" for k, v in entry.items()) + "}"


@dataclasses.dataclass
class Remedy(JsonResult):
    """The outcome of a remedy search; truthy when the target is met on the judging data, in
    simulation and, where one ran, in the re-quantization that judges (:meth:`failure` is
    None). ``met``: the simulation's verdict alone.

    The judging data (``judged_on``) are the held-out data when given, else the calibration
    samples the search did not choose on (``split``), else (one sample) the search's own.

    ``nodes``: calibration nodes to remedy, most promising first; ``choices``: the kind of
    each (``float``, ``int16``, ``per-channel``), ``cost`` their total under ``costs``.
    ``target``: the bar (a task's ``min_ratio``: that ratio); with per-output targets the
    strictest, the headline, and each output's own in :attr:`targets`.
    ``value`` / ``baseline``: the objective with them remedied / with nothing remedied, on
    every calibration sample used (output metrics: worst output, samples pooled).
    ``figures``: per data set (``calibration``, ``search`` when split, ``held-out`` or
    ``confirmation``) ``{samples, before, after, target, met, ...}``, with per-output targets
    also ``targets`` (each output's) and ``outputs`` (``{"before": {output: value}, "after":
    ...}``), as in the re-quantized checks' figures. ``ceiling``: every
    candidate remedied, on the search samples; ``ceiling_outputs``: where it falls short of
    the target with several outputs, ``{output: value}`` of those that stay short there.
    ``curve``: one point per greedy step on the search samples, ``{"nodes": k, "cost": c,
    "added": name, "kind": kind, "value": v}`` with ``k = 0`` the baseline (with per-output
    targets also ``outputs``: each output's value). ``confirmations``: every set scored on the judging data.
    ``refinements``: the moves that improved the greedy set. ``settings``:
    ``nodes_to_exclude``, ``TensorQuantOverrides`` (JSON form) and ``simulation_only`` (``notes`` where
    they do otherwise than the simulated remedy).
    ``measured``: the re-quantized check (None without a float model), with its figures.
    ``warnings``: gains that do not hold on the judging data, one sentence each.
    ``judge_chose``: the judging data chose part of the set (the search samples' set fell
    short there, and nodes were added and pruned on them), so they confirm it less than
    data that chose nothing would.
    ``producer_terms``: the remedy in the terms of the quantizer that made the model (see
    :func:`~pytest_ptq.remedy.producer_terms.producer_terms`; None for onnxruntime's own and
    unknown producers); ``producer_measured``: re-quantizing with that producer and them,
    when its Python is named (see :mod:`~pytest_ptq.remedy.producer_check`).
    """

    remedy: str
    metric: str
    target: float
    met: bool
    nodes: list
    value: float | None
    baseline: float | None
    ceiling: float | None
    curve: list
    pruned: list
    ranking: list
    settings: dict
    measured: dict | None = None
    notes: list = dataclasses.field(default_factory=list)
    samples: int = 0
    outputs: list = dataclasses.field(default_factory=list)
    evaluations: int = 0
    elapsed_s: float = 0.0
    budget_s: float | None = None
    budget_exhausted: bool = False
    model: str = ""
    png: str | None = None
    objective: dict = dataclasses.field(default_factory=dict)
    choices: dict = dataclasses.field(default_factory=dict)
    cost: float = 0.0
    costs: dict = dataclasses.field(default_factory=dict)
    search: str = "refine"
    judged_on: str = "calibration"
    judge_chose: bool = False
    heldout: str | None = None
    split: dict | None = None
    figures: dict = dataclasses.field(default_factory=dict)
    confirmations: list = dataclasses.field(default_factory=list)
    refinements: list = dataclasses.field(default_factory=list)
    warnings: list = dataclasses.field(default_factory=list)
    producer_terms: dict | None = None
    producer_measured: dict | None = None
    ceiling_outputs: dict | None = None

    def __bool__(self):
        return self.failure() is None

    @property
    def objective_metric(self):
        """The metric object of the figures: an output metric, or the task (higher is better)."""
        if self.objective.get("kind") == "task":
            return TaskMetric(self.objective["metric"])
        return get_metrics(self.metric)[0]

    @property
    def targets(self):
        """``{output: its own target}`` where the outputs have targets of their own, else None."""
        return self.objective.get("targets")

    @property
    def target_text(self):
        """The target as the user gave it: ``0.99``, ``0.99 x float`` or per output
        ``'logits' 0.999, 'boxes' 0.99``."""
        if self.objective.get("min_ratio") is not None:
            return f"{threshold_text(self.objective['min_ratio'])} x float"
        return targets_text(self.target, self.targets)

    def _short(self, outputs):
        """``; output 'a' 0.998, short of its 0.999`` for each output of ``outputs`` (``{output:
        value}``) short of its own target, with per-output targets; "" otherwise."""
        targets = self.targets
        if not targets or not outputs:
            return ""
        m = self.objective_metric
        return "".join(f"; output {o!r} {_fmt(v)}, short of its {threshold_text(targets[o])}"
                       for o, v in outputs.items() if o in targets and not meets(m, v, targets[o]))

    def needed_for(self, target=None):
        """The fewest nodes on the search curve whose value (the worst output's) meets ``target``
        (default: the search's bar, with per-output targets the strictest), or None. Each
        output against its own target: :meth:`needed_per_output`."""
        if target is None:  # a ratio's bar on the samples the curve was scored on
            target = self.figures.get("search", self.figures.get("calibration", {})).get("target", self.target)
        m = self.objective_metric
        return next((p["nodes"] for p in self.curve if p["value"] is not None and meets(m, p["value"], target)), None)

    def needed_per_output(self):
        """With per-output targets ``{output: the fewest nodes on the search curve with which it
        meets its own target, or None}`` (0: it meets it with nothing remedied); ``{}`` where one
        target is every output's (:meth:`needed_for` answers then). A curve point without its
        outputs (a record from before they were kept) is judged as the search judges such a
        value: the worst output against the strictest target, which asks no less than each own."""
        m = self.objective_metric

        def meets_own(p, o, t):
            outputs = p.get("outputs")
            return meets(m, outputs.get(o), t) if outputs else meets(m, p["value"], self.target)

        return {o: next((p["nodes"] for p in self.curve if meets_own(p, o, t)), None)
                for o, t in (self.targets or {}).items()}

    def python_snippet(self):
        """The settings as quantize_static (quantize_dynamic) keyword arguments, ready to paste."""
        return snippet(self.settings)

    def failure(self):
        """Why the remedy does not hold, in one sentence; None when it does."""
        on = _on(self.judged_on)
        name = self.objective.get("metric", self.metric)
        if self.value is None:
            return "the budget ended before anything was scored; raise --budget"
        if self.budget_exhausted and not self.nodes and not self.met:
            judged = self.figures.get(self.judged_on, {})
            return (f"the budget ended before any remedy was scored (the model as given reads {name} "
                    f"{_fmt(judged.get('before', self.baseline))} on {on}, target {self.target_text}); raise --budget")
        if not self.met:
            judged = self.figures.get(self.judged_on, {})
            why = " before the budget ended" if self.budget_exhausted else ""
            return (f"no set found{why} meets the target {self.target_text} on {on}: the best, {len(self.nodes)} "
                    f"node(s), reaches {name} {_fmt(judged.get('after', self.value))}"
                    + self._short(judged.get("outputs", {}).get("after"))
                    + (f" (target there {_fmt(judged['target'])})" if self.objective.get("min_ratio") is not None
                       and judged.get("target") is not None else "")
                    + ("; with every candidate " + WHAT[self.remedy] + " on the search samples, " + ", ".join(
                        f"output {o!r} reaches only {_fmt(v)}" + (
                            f" of its {threshold_text(self.targets[o])}" if self.targets
                            else "") for o, v in self.ceiling_outputs.items())
                       if self.ceiling_outputs else ""))
        decisive = self.requantized
        if decisive and not decisive[1].get("met", True):
            by, mm = decisive
            judged = mm.get("figures", {}).get(self.judged_on, {})
            value = judged.get("after", mm.get("value"))
            return (f"re-quantized with {by}, the model reaches {name} {_fmt(value)} on {on}, short of the target "
                    f"{_bar({'target': self.target, 'targets': self.targets, **judged}, _fmt)}")
        return None

    @property
    def requantized(self):
        """``(quantizer, measured)``: the re-quantization that judges the remedy beside the
        simulation, or None where none ran. For a model a third-party quantizer made it is
        that quantizer's (``producer_measured``): onnxruntime's re-quantization
        (``measured``) quantizes the float model its own way, which says nothing of the
        user's, and is only reported."""
        if self.producer_terms:
            return (self.producer_terms["short"], self.producer_measured) if self.producer_measured else None
        return ("onnxruntime", self.measured) if self.measured else None

    def judged_by(self):
        """How the verdict was reached, as a phrase: ``simulated and re-quantized with X`` or
        ``simulated`` and what would re-quantize it."""
        if self.requantized:
            return f"simulated and re-quantized with {self.requantized[0]}"
        if self.producer_terms and self.measured:
            return (f"simulated; not re-quantized with {self.producer_terms['short']}, which made the model "
                    "(see the notes)")
        return "simulated only, not re-quantized"

    def figures_table(self):
        """The figures before and after the remedy, one row per data set: simulated, then
        re-quantized by each quantizer that ran (onnxruntime, the producer's)."""
        rows = []
        order = [k for k in ("calibration", "search", "confirmation", "held-out") if k in self.figures]
        fitted = " chose part of the set" if self.judge_chose else ""  # no independent check then
        # per-output targets: each output's, not the strictest alone (the headline's number); a
        # record read back from before they were recorded, the search's
        def bar(f):
            return _bar({"targets": self.targets, **f})

        for key in order:
            f = self.figures[key]
            rows.append({"data": f"{key} ({f['samples']}){fitted if key == self.judged_on else ''}",
                         "float": f.get("float"), "no remedy": f["before"],
                         "remedy": f["after"], "target": bar(f), "met": "yes" if f["met"] else "no"})
        runs = [("onnxruntime", self.measured)]
        if self.producer_terms:
            runs.append((self.producer_terms["short"], self.producer_measured))
        for by, measured in runs:
            figures = (measured or {}).get("figures", {})
            for key in order:
                if key in figures:
                    f = figures[key]
                    rows.append({"data": f"{key}, re-quantized with {by}",
                                 "float": self.figures.get(key, {}).get("float"), "no remedy": f["before"],
                                 "remedy": f["after"], "target": bar(f), "met": "yes" if f["met"] else "no"})
                    if f.get("deployed") is not None:  # a plain session on this machine: read only
                        met = f.get("deployed_met", meets(self.objective_metric, f["deployed"], f["target"]))
                        rows.append({"data": f"{key}, that file in a plain onnxruntime session",
                                     "float": self.figures.get(key, {}).get("float"),
                                     "no remedy": f.get("deployed_before", ""), "remedy": f["deployed"],
                                     "target": bar(f), "met": "yes" if met else "no"})
        if not rows:
            return ""
        task = self.objective.get("kind") == "task"
        return format_table(rows, ["data"] + (["float"] if task else []) + ["no remedy", "remedy", "target", "met"])

    def summary(self):
        """A few readable lines: the verdict, the figures, the nodes and the settings to use."""
        lines = []
        what = WHAT[self.remedy]
        name = self.objective.get("metric", self.metric)
        judged = self.figures.get(self.judged_on, {})
        where = "" if self.judged_on == "calibration" else f" on {_on(self.judged_on)}"
        if self.judge_chose:
            where += ", which chose part of the set (a fitted figure, not an independent check)"
        missed = bool(self.requantized) and not self.requantized[1].get("met", True)
        if self.met:
            lines.append(f"{name} {_fmt(judged.get('after', self.value))}{where} meets the target {self.target_text} "
                         f"{'in simulation ' if missed else ''}with {len(self.nodes)} node(s) {what} "
                         f"(baseline {_fmt(judged.get('before', self.baseline))})"
                         + (f"; re-quantized with {self.requantized[0]} it falls short (below)" if missed else ""))
        else:
            ceiling = ("" if self.ceiling is None else
                       f", every candidate {what} on the search samples: {_fmt(self.ceiling)}")
            lines.append(f"target {name} {self.target_text} not met{where}: best "
                         f"{_fmt(judged.get('after', self.value))} with {len(self.nodes)} node(s) {what} (baseline "
                         f"{_fmt(judged.get('before', self.baseline))}{ceiling})")
        if self.remedy == MIXED and self.nodes:
            each = ", ".join(f"{k} {v:g}" for k, v in self.costs.items())
            lines.append(f"cost {self.cost:g} ({each} per node)")
        table = self.figures_table()
        if table:
            lines.append(table)
        if self.nodes:
            lines.append(f"the {len(self.nodes)} node(s) {what}:")
        for n in self.nodes:
            kind = self.choices.get(n)
            lines.append(f"  {n}" + (f" ({kind})" if self.remedy == MIXED and kind else ""))
        s = self.settings
        if s.get("nodes_to_exclude"):
            lines.append("nodes_to_exclude=" + json.dumps(s["nodes_to_exclude"]))
        if s.get("TensorQuantOverrides"):
            lines.append('extra_options["TensorQuantOverrides"]=' + json.dumps(s["TensorQuantOverrides"]))
        if s.get("per_channel"):
            lines.append("per_channel=True (the quantizer's switch for every weight)")
        if s.get("nodes_to_exclude") or s.get("TensorQuantOverrides") or s.get("per_channel"):
            lines.append("in Python: " + self.python_snippet())
        if s.get("simulation_only"):
            lines.append("simulation only (onnxruntime cannot express it): " + ", ".join(s["simulation_only"]))
        if s.get("not_in_float_model"):
            lines.append("not in the float model (the quantizer inserted them: quantize_static has nothing there to "
                         "exclude): " + ", ".join(s["not_in_float_model"]))
        lines += [f"note: {n}" for n in s.get("notes", ())]  # where the settings do otherwise than simulated
        if self.measured:
            mm = self.measured
            other = (f" (onnxruntime's quantizer, not {self.producer_terms['short']}'s that made the model: reported, "
                     "not part of the verdict)" if self.producer_terms else "")
            lines.append(f"re-quantized with these settings{other}: {name} {_fmt(mm.get('value'))} on calibration "
                         f"(simulated {_fmt(self.value)}; re-quantized without them {_fmt(mm.get('baseline_value'))})"
                         + (f"; {self.failure()}" if missed and not self.producer_terms else ""))
            if mm.get("collateral"):
                # the calibration differs first where it does not reproduce (a note says); where the
                # figures agree, the tensors moved nothing measurable
                differs = mm.get("value") is not None and self.value is not None and abs(mm["value"] - self.value) > \
                    1e-6 * max(1.0, abs(self.value))
                why = ("" if mm.get("reproduces") is False else
                       ", so the re-quantized figure differs from the simulation" if differs else
                       ", which moves the re-quantized figure by nothing measurable")
                lines.append(f"  also changed by onnxruntime ({len(mm['collateral'])} tensor(s) beyond the chosen "
                             f"nodes that these settings reach{why}): " + ", ".join(mm["collateral"]))
            if mm.get("not_applied"):
                lines.append("  not applied by onnxruntime: " + ", ".join(mm["not_applied"]))
        lines += producer_lines(self.producer_terms, self.producer_measured, name, self.judged_on)
        if missed and self.producer_terms:
            lines.append(f"  {self.failure()}")
        lines += [line for w in self.warnings for line in warning_lines(w)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def producer_lines(terms, measured=None, metric="cosine-similarity", judged_on="calibration"):
    """The remedy in the producer's terms as a few summary lines: what to pass it, what it
    cannot express, and what re-quantizing with it measured."""
    if not terms or not (terms["lines"] or terms["unsupported"]):
        return []
    lines = [f"in {terms['label']}'s terms (names of the {terms['names']}):"]
    lines += [f"  {line}" for line in terms["lines"]]
    by_why = {}
    for item in terms["unsupported"]:
        by_why.setdefault((item["kind"], item["why"]), []).append(item["node"])
    for (kind, why), nodes in by_why.items():
        lines.append(f"  no {terms['short']} term for {len(nodes)} node(s) to take {kind} ({why}): " + ", ".join(nodes))
    if terms.get("instead"):
        lines.append(f"  to keep those in float instead: {terms['instead']}")
    lines += [f"  note: {n}" for n in terms["notes"]]
    if measured:
        m = measured
        kept = sum(ok for ts in m["kept"].values() for ok in ts.values())
        total = sum(len(ts) for ts in m["kept"].values())
        lines.append(f"  re-quantized with {terms['short']} and these terms: {metric} "
                     f"{_fmt(m['after'].get('calibration'))} on calibration against the float model (without them "
                     f"{_fmt(m['before'].get('calibration'))}, the model as given {_fmt(m['original'].get('calibration'))}"
                     f"); {kept} of {total} remedied tensor(s) as asked")
        judged = m.get("figures", {}).get(judged_on)
        if judged and judged_on != "calibration":
            lines.append(f"  on {_on(judged_on)}: {metric} {_fmt(judged['after'])} (without the terms "
                         f"{_fmt(judged['before'])}, the model as given {_fmt(judged['original'])}; target "
                         f"{_bar(judged, _fmt)})")
        if m.get("not_applied"):
            lines.append(f"  not applied by {terms['short']}: " + ", ".join(m["not_applied"]))
        if m.get("in_float"):
            lines.append(f"  left in float by {terms['short']} (more than asked): " + ", ".join(m["in_float"]))
        if m.get("collateral"):
            lines.append(f"  also changed by {terms['short']}: " + ", ".join(m["collateral"]))
    return lines


def _bar(figure, number=lambda v: v):
    """The target of a figures record as shown: each output's where it has ``targets``, else
    its ``target`` (through ``number``)."""
    if figure.get("targets"):
        return targets_text(figure["target"], figure["targets"])
    return number(figure["target"])


def _on(judged_on):
    return {"held-out": "held-out data", "confirmation": "the confirmation samples",
            "calibration": "calibration data"}.get(judged_on, judged_on)


def _fmt(v):
    return "n/a" if v is None else f"{v:.6g}"

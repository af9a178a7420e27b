"""The outcome of a remedy search."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from ..metrics import get_metrics
from ..results import JsonResult

REMEDIES = ("float", "int16", "per-channel")


@dataclasses.dataclass
class Remedy(JsonResult):
    """The outcome of a remedy search; truthy when the target is met in simulation.

    ``nodes``: calibration nodes to remedy, most sensitive first. ``value``: the simulated
    metric with them remedied (worst over outputs, samples pooled); ``baseline``: with
    nothing remedied; ``ceiling``: with every candidate remedied. ``curve``: one point per
    greedy step, ``{"nodes": k, "added": name, "value": v}`` with ``k = 0`` the baseline.
    ``settings``: ``nodes_to_exclude``, ``TensorQuantOverrides`` (JSON form) and
    ``simulation_only``. ``measured``: the re-quantized check (None without a float model).
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

    def __bool__(self):
        return bool(self.met)

    def needed_for(self, target):
        """The fewest nodes on the curve whose value meets ``target``, or None."""
        m = get_metrics(self.metric)[0]
        for point in self.curve:
            if point["value"] is not None and meets(m, point["value"], target):
                return point["nodes"]
        return None

    def python_snippet(self):
        """The settings as quantize_static keyword arguments, ready to paste."""
        parts = []
        if self.settings.get("nodes_to_exclude"):
            parts.append(f"nodes_to_exclude={self.settings['nodes_to_exclude']!r}")
        overrides = self.settings.get("TensorQuantOverrides")
        if overrides:
            body = ", ".join(
                f"{t!r}: [" + ", ".join("{" + ", ".join(
                    f"{k!r}: QuantType.{v}" if k == "quant_type" else f"{k!r}: {v!r}" for k, v in e.items()) + "}"
                    for e in entries) + "]"
                for t, entries in overrides.items())
            parts.append("extra_options={'TensorQuantOverrides': {" + body + "}}")
        return "quantize_static(..., " + ", ".join(parts) + ")"



    def summary(self):
        """A few readable lines: the verdict, the nodes, and the settings to use."""
        lines = []
        what = {"float": "kept in float", "int16": "raised to 16 bit", "per-channel": "quantized per channel"}
        if self.met:
            lines.append(f"{self.metric} {_fmt(self.value)} meets the target {self.target} with "
                         f"{len(self.nodes)} node(s) {what[self.remedy]} (baseline {_fmt(self.baseline)})")
        else:
            lines.append(f"target {self.metric} {self.target} not met: best {_fmt(self.value)} with "
                         f"{len(self.nodes)} node(s) {what[self.remedy]} (baseline {_fmt(self.baseline)}, "
                         f"every candidate {what[self.remedy]}: {_fmt(self.ceiling)})")
        for n in self.nodes:
            lines.append(f"  {n}")
        s = self.settings
        if s.get("nodes_to_exclude"):
            lines.append("nodes_to_exclude=" + json.dumps(s["nodes_to_exclude"]))
        if s.get("TensorQuantOverrides"):
            lines.append('extra_options["TensorQuantOverrides"]=' + json.dumps(s["TensorQuantOverrides"]))
        if s.get("nodes_to_exclude") or s.get("TensorQuantOverrides"):
            lines.append("in Python: " + self.python_snippet())
        if s.get("simulation_only"):
            lines.append("simulation only (onnxruntime cannot express it): " + ", ".join(s["simulation_only"]))
        if self.measured:
            mm = self.measured
            lines.append(f"re-quantized with these settings: {self.metric} {_fmt(mm.get('value'))} "
                         f"(simulated {_fmt(self.value)}; re-quantized without them {_fmt(mm.get('baseline_value'))})")
            if mm.get("collateral"):
                lines.append("  also changed by onnxruntime: " + ", ".join(mm["collateral"]))
            if mm.get("not_applied"):
                lines.append("  not applied by onnxruntime: " + ", ".join(mm["not_applied"]))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _fmt(v):
    return "n/a" if v is None else f"{v:.6g}"


def meets(metric, value, target):
    return value is not None and not np.isnan(value) and not metric.worse(value, target)



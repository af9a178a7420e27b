"""Baselines: what a model measured when its contract was accepted, committed by the user.

One JSON file per contract or test, keys sorted, no machine id and no absolute path, so
that it diffs cleanly in review and holds on any CI machine::

    {"format": 1, "metric": "cosine-similarity", "node_type": "node",
     "outputs": {"prob": 0.99812}, "sensitivity": {"conv1": 0.99951, ...},
     "model": {"path": "model.onnx", "sha256": "..."}, "data": {...}, "float_model": null,
     "tool": {"pytest_ptq": "0.1.0", "onnxruntime": "1.23.0", "onnx": "1.17.0"}}

Values are compared with a tolerance, never exactly: a value only fails when it moved the
wrong way (a similarity down, an error up) by more than the tolerance.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from .analysis import relative
from .errors import PTQError
from .metrics import get_metrics
from .results import json_restore, json_safe

FORMAT = 1
# Significant digits kept: float32 results carry about 7, and fewer digits keep diffs readable.
_DIGITS = 8


def _round(value):
    value = float(value)
    return value if math.isinf(value) or math.isnan(value) else float(f"{value:.{_DIGITS}g}")


@dataclasses.dataclass
class Baseline:
    """Headline output metrics and per-node sensitivity of one model, in one metric."""

    metric: str
    node_type: str
    outputs: dict  # output name -> metric value
    sensitivity: dict  # node name -> metric value
    model: dict = dataclasses.field(default_factory=dict)
    data: dict = dataclasses.field(default_factory=dict)
    float_model: dict | None = None
    tool: dict = dataclasses.field(default_factory=dict)

    def to_dict(self):
        return json_safe({"format": FORMAT, **dataclasses.asdict(self)})

    def save(self, path):
        """Write atomically (a reader never sees half a file); returns the path."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        return guard.write_text(Path(path), text, atomic=True)

    @classmethod
    def load(cls, path):
        try:
            d = json.loads(Path(path).read_text())
            if d.get("format") != FORMAT:
                raise ValueError(f"format {d.get('format')!r}, expected {FORMAT}")
            return cls(metric=d["metric"], node_type=d["node_type"],
                       outputs=json_restore(d["outputs"]), sensitivity=json_restore(d["sensitivity"]),
                       model=d.get("model", {}), data=d.get("data", {}), float_model=d.get("float_model"),
                       tool=d.get("tool", {}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PTQError(f"baseline {str(path)!r} cannot be read ({type(exc).__name__}: {exc}); "
                           "rewrite it with --ptq-update-baseline") from None


def measure(analysis, metric="cosine-similarity", node_type="node", outputs=None, relative_to="."):
    """A :class:`Baseline` of ``analysis`` now; paths relative to ``relative_to``."""
    name = get_metrics(metric)[0].name
    out = analysis.output_metrics(outputs, [name]).values
    sens = analysis.sensitivity(node_type, name, outputs)
    fp = analysis.fingerprint()
    key = analysis.key
    return Baseline(
        metric=name, node_type=node_type,
        outputs={o: _round(v[name]) for o, v in out.items()},
        sensitivity={n: _round(v[name]) for n, v in sens.items()},
        model={"path": relative(key.model, relative_to), "sha256": fp["model_sha256"]},
        data={"path": relative(key.data, relative_to), "sha256": fp["data_sha256"], "samples": fp["samples"]},
        float_model=({"path": relative(key.float_model, relative_to), "sha256": fp["float_model_sha256"]}
                     if key.float_model else None),
        tool={"pytest_ptq": fp["pytest_ptq"], "onnxruntime": fp["onnxruntime"], "onnx": fp["onnx"]})


@dataclasses.dataclass
class Move:
    """A value that changed: ``worse`` is how far it moved the wrong way (negative: better)."""

    name: str
    old: float
    new: float
    worse: float


@dataclasses.dataclass
class Diff:
    """How a new measurement differs from its baseline."""

    metric: str
    tolerance: float
    nodes: list  # Move, past the tolerance the wrong way, worst first
    outputs: list  # Move, past the tolerance the wrong way, worst first
    improved: list  # Move, past the tolerance the right way
    removed: list  # nodes in the baseline, gone now
    added: list  # nodes measured now, not in the baseline
    notes: list  # changed hashes and versions, as sentences
    mismatch: str = ""  # the baseline measured something else (metric, node type)

    @property
    def ok(self):
        return not (self.nodes or self.outputs or self.mismatch)


def _worse_by(metric, old, new):
    """How far ``new`` is worse than ``old`` (negative when better)."""
    if math.isnan(old) or math.isnan(new):
        return 0.0 if math.isnan(old) and math.isnan(new) else math.inf
    if old == new:  # also equal infinities, whose difference is nan
        return 0.0
    return old - new if metric.higher_is_better else new - old


def compare(old, new, tolerance):
    """Compare two baselines; a value fails when it is worse by more than ``tolerance``."""
    m = get_metrics(old.metric)[0]
    mismatch = ""
    if old.metric != new.metric or old.node_type != new.node_type:
        mismatch = (f"the baseline holds {old.metric} of {old.node_type} nodes but this check measures "
                    f"{new.metric} of {new.node_type} nodes")
    nodes, outputs, improved = [], [], []
    for bucket, old_vals, new_vals in ((nodes, old.sensitivity, new.sensitivity),
                                       (outputs, old.outputs, new.outputs)):
        for name in old_vals:
            if name not in new_vals:
                continue
            move = Move(name, old_vals[name], new_vals[name], _worse_by(m, old_vals[name], new_vals[name]))
            if move.worse > tolerance:
                bucket.append(move)
            elif -move.worse > tolerance:
                improved.append(move)
    nodes.sort(key=lambda mv: -mv.worse)
    outputs.sort(key=lambda mv: -mv.worse)
    removed = [n for n in old.sensitivity if n not in new.sensitivity]
    added = [n for n in new.sensitivity if n not in old.sensitivity]
    notes = []
    for what, a, b in (("model", old.model, new.model), ("calibration data", old.data, new.data),
                       ("float model", old.float_model or {}, new.float_model or {})):
        if a.get("sha256") and b.get("sha256") and a["sha256"] != b["sha256"]:
            notes.append(f"the {what} changed since the baseline (sha256 {a['sha256'][:12]} -> {b['sha256'][:12]})")
    for tool in ("onnxruntime", "pytest_ptq"):
        if old.tool.get(tool) and old.tool.get(tool) != new.tool.get(tool):
            notes.append(f"the baseline was made with {tool} {old.tool[tool]}, this run uses {new.tool.get(tool)}")
    return Diff(metric=m.name, tolerance=tolerance, nodes=nodes, outputs=outputs, improved=improved,
                removed=removed, added=added, notes=notes, mismatch=mismatch)

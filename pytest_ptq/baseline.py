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
import difflib
import json
import math
import numbers
import re
from pathlib import Path

from . import guard, params
from .analysis import relative
from .errors import PTQError, clip, shown
from .metrics import METRICS, get_metric, get_metrics
from .results import json_restore, json_safe
from .tables import listed, printable

FORMAT = 1
# A baseline holds a few numbers per node; anything this large is not one, and is not read.
MAX_BYTES = 64 * 2**20
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

    def save(self, path, exclusive=False):
        """Write atomically (a reader never sees half a file); ``exclusive``: only where no
        file is there yet, else FileExistsError. Returns the path."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        return guard.write_text(Path(path), text, atomic=True, exclusive=exclusive)

    @classmethod
    def load(cls, path):
        """Read and validate a baseline file; raises :class:`BaselineError` naming the file and,
        for a malformed field, the key."""
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_BYTES:
                raise BaselineError(path, "cannot be read", f"it is {size / 2**20:.0f} MiB, larger than any baseline")
            d = json.loads(path.read_bytes().decode("utf-8-sig"))  # a BOM from a Windows editor
        except BaselineError:
            raise
        except OSError as exc:
            raise BaselineError(path, "cannot be read", exc.strerror or type(exc).__name__) from None
        except UnicodeDecodeError:
            raise BaselineError(path, "cannot be read", "it is not UTF-8 text", foreign=True) from None
        except ValueError as exc:
            if re.search(rb"^<<<<<<< ", path.read_bytes(), re.M):  # git's markers: both sides are in it
                raise BaselineError(path, "holds a merge conflict (<<<<<<< markers)", "keep one side, or measure "
                                    "this model again") from None
            raise BaselineError(path, "cannot be read", f"it is not valid JSON: {clip(str(exc), 120)}") from None
        except RecursionError:
            raise BaselineError(path, "cannot be read", "its JSON nests too deeply") from None
        return cls(**validate(d, path))


class BaselineError(PTQError):
    """A baseline file that cannot be used: ``problem`` says what is wrong with it (one
    clause naming the key, when one is at fault), ``detail`` why it could not be read."""

    def __init__(self, path, problem, detail="", foreign=False):
        self.path, self.problem, self.detail = Path(path), problem, detail
        # not a baseline gone wrong but some other file (package.json, a binary): never rewritten
        self.foreign = foreign
        tail = f" ({detail})" if detail else ""
        super().__init__(f"baseline {str(path)!r} {problem}{tail}; rewrite it with --ptq-update-baseline")


_FIELDS = ("format", "metric", "node_type", "outputs", "sensitivity", "model", "data", "float_model", "tool")


def validate(d, path):
    """The :class:`Baseline` fields of a parsed baseline file, every field's type checked
    (a malformed field is never read as "nothing to compare")."""
    def bad(key, must, value):
        return BaselineError(path, f"has a malformed {shown(key)}: it must be {must}, got {shown(value)}")

    if not isinstance(d, dict) or (d and not any(key in _FIELDS for key in d)):
        raise BaselineError(path, f"is not a pytest-ptq baseline: it must be a JSON object with keys such as "
                            f"'format' and 'sensitivity', got {shown(d)}", foreign=True)
    version = d.get("format")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT:
        # a newer pytest-ptq's: read as malformed, an update rewrote it in the old format, its
        # new fields gone
        tool = d.get("tool") if isinstance(d.get("tool"), dict) else {}
        by = f" ({tool['pytest_ptq']})" if isinstance(tool.get("pytest_ptq"), str) else ""
        raise BaselineError(path, f"was written by a newer pytest-ptq{by} in format {version}, which this one "
                            f"(format {FORMAT}) cannot read: upgrade pytest-ptq; it is never rewritten in the older "
                            "format", foreign=True)
    for key in d:
        if key not in _FIELDS:
            near = difflib.get_close_matches(str(key)[:100], _FIELDS, n=1, cutoff=0.7)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise BaselineError(path, f"has an unknown key {shown(key)}{hint}")
    for key in ("format", "metric", "node_type", "outputs", "sensitivity"):
        if key not in d:
            raise BaselineError(path, f"has no {key!r} key")
    if d["format"] != FORMAT or isinstance(d["format"], bool):
        raise bad("format", f"{FORMAT} (this version of pytest-ptq writes format {FORMAT})", d["format"])
    if not isinstance(d["metric"], str) or not _metric_ok(d["metric"]):
        raise bad("metric", f"one of {', '.join(METRICS)}", d["metric"])
    if not isinstance(d["node_type"], str) or d["node_type"] not in params.NODE_TYPES:
        raise bad("node_type", f"one of {', '.join(params.NODE_TYPES)}", d["node_type"])
    m = get_metrics(d["metric"])[0]
    outputs = _values(d["outputs"], "outputs", "output", bad, m)
    if not outputs:
        raise bad("outputs", "a mapping of output names to numbers with at least one output", d["outputs"])
    sensitivity = _values(d["sensitivity"], "sensitivity", "node", bad, m)
    fields = {"metric": m.name, "node_type": d["node_type"], "outputs": outputs,
              "sensitivity": sensitivity}
    for key in ("model", "data", "float_model"):
        value = d.get(key, None if key == "float_model" else {})
        if value is None and key == "float_model":
            fields[key] = None
            continue
        if not isinstance(value, dict):
            must = "null or " if key == "float_model" else ""
            raise bad(key, must + "a mapping with 'path' and 'sha256'", value)
        for sub, types, must in (("path", str, "a path"), ("sha256", str, "a hex digest"),
                                 ("samples", int, "a whole number")):
            if sub in value and value[sub] is not None and (not isinstance(value[sub], types)
                                                            or isinstance(value[sub], bool)):
                raise bad(f"{key}.{sub}", must, value[sub])
        fields[key] = value
    tool = d.get("tool", {})
    if not isinstance(tool, dict) or not all(isinstance(v, str) or v is None for v in tool.values()):
        raise bad("tool", "a mapping of package names to version strings", tool)
    fields["tool"] = tool
    return fields


def _metric_ok(name):
    try:
        get_metrics(name)
        return True
    except PTQError:
        return False


_SLACK = 0.01


def _values(value, key, what, bad, metric):
    """``{name: float}`` from a baseline mapping; the special floats come as strings (a
    measurement may be NaN or infinite), a finite value must be one ``metric`` can take."""
    if not isinstance(value, dict):
        raise bad(key, f"a mapping of {what} names to numbers", value)
    out = {}
    for name, v in value.items():
        v = json_restore(v)
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise bad(f"{key}.{name}", "a number", v)
        try:
            v = float(v)
        except OverflowError:  # a JSON integer of hundreds of digits: an edit, no measurement
            raise bad(f"{key}.{name}", "a number within a float's range", v) from None
        # rounding may take a similarity a hair past 1 (and a test nudges one): far past is an edit
        if metric.unit and not (abs(v) <= 1 + _SLACK or math.isnan(v)) or not metric.higher_is_better and v < 0:
            raise bad(f"{key}.{name}", f"a {metric.name} value ({'in [-1, 1]' if metric.unit else '>= 0'})", v)
        out[name] = v
    return out


def measure(analysis, metric="cosine-similarity", node_type="node", relative_to=".", named=()):
    """A :class:`Baseline` of ``analysis`` now; paths relative to ``relative_to``; ``named``:
    outputs and slices (``"tail=out[:, 2000:]"``) whose figures join the outputs' (a contract's
    output thresholds name them: a slice could lose 4x the tolerance and the baseline pass)."""
    name = get_metric(metric).name
    out = dict(analysis.output_metrics(None, [name]).values)
    if named:
        out.update(analysis.output_metrics(list(named), [name]).values)
    sens = analysis.sensitivity(node_type, name, None)
    fp = analysis.fingerprint()
    key = analysis.key
    return Baseline(
        metric=name, node_type=node_type,
        outputs={o: _round(v[name]) for o, v in out.items() if v[name] is not None},
        # a node changing only outputs that held no values has no figure to hold it to
        sensitivity={n: _round(v[name]) for n, v in sens.items() if v[name] is not None},
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
    mismatch: str = ""  # the baseline measured something else (metric, node type, another model)
    other_model: bool = False  # it was made for a model at another path: not this model's to rewrite

    @property
    def ok(self):
        return not (self.nodes or self.outputs or self.mismatch)


def _worse_by(metric, old, new):
    """How far ``new`` is worse than ``old`` (negative when better). NaN (an output gone
    non-finite) is worse than any number: a value that became one is worse by inf, one that
    left it better by inf (it read "nan -> 1.000000 (worse by inf)")."""
    if math.isnan(old) or math.isnan(new):
        return 0.0 if math.isnan(old) and math.isnan(new) else -math.inf if math.isnan(old) else math.inf
    if old == new:  # also equal infinities, whose difference is nan
        return 0.0
    return old - new if metric.higher_is_better else new - old


def compare(old, new, tolerance):
    """Compare two baselines; a value fails when it is worse by more than ``tolerance``."""
    m = get_metrics(old.metric)[0]
    mismatch = ""
    was, now = old.model.get("path"), new.model.get("path")
    # the same bytes elsewhere (a cache folder reached through a link, a checkout moved) are the
    # same model
    other_model = bool(was and now and was != now) and old.model.get("sha256") != new.model.get("sha256")
    if other_model:  # two models whose files share a name (a/model.onnx, b/model.onnx), or a moved one
        mismatch = (f"it was made for the model {was} and this check measures {now} (paths relative to the "
                    "baseline): two models share this baseline file, or the model moved")
    elif old.metric != new.metric or old.node_type != new.node_type:
        mismatch = (f"the baseline holds {old.metric} of {params.nodes_of_type(old.node_type)} but this check "
                    f"measures {new.metric} of {params.nodes_of_type(new.node_type)}")
    was_n, now_n = old.data.get("samples"), new.data.get("samples")
    if not mismatch and was_n and now_n and was_n != now_n:  # pooled over other samples: other quantities
        mismatch = f"it was measured on {was_n} calibration sample(s) and this check measures {now_n}"
    kept = len(set(old.sensitivity) & set(new.sensitivity))
    if not mismatch and len(old.sensitivity) >= 4 and 0 < kept < len(old.sensitivity) / 2:
        # a pass comparing one node in nine guards nothing, and said so only in its details
        mismatch = (f"only {kept} of its {len(old.sensitivity)} nodes are in the model now: it was exported or "
                    "quantized again under other names")
    for what, a, b in (("node", old.sensitivity, new.sensitivity), ("output", old.outputs, new.outputs)):
        if not mismatch and b and not set(a) & set(b):  # it would pass comparing nothing
            mismatch = (f"none of the baseline's {len(a)} {what}(s) is measured now ({listed(a)} in the baseline, "
                        f"{listed(b)} now): the model was exported or quantized again under other names" if a else
                        f"the baseline holds no {what} values, and {len(b)} are measured now ({listed(b)})")
    nodes, outputs, improved = [], [], []
    # values of another metric or other names are not compared: a move between them means nothing
    for bucket, old_vals, new_vals in (() if mismatch else ((nodes, old.sensitivity, new.sensitivity),
                                                            (outputs, old.outputs, new.outputs))):
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
    gone = [o for o in old.outputs if o not in new.outputs]
    if gone:  # say so: an output compared no more must not pass unseen
        notes.append(f"the baseline's output(s) {', '.join(gone)} are not measured now (now: "
                     f"{', '.join(new.outputs) or 'none'}); update the baseline to compare these")
    for what, a, b in (("model", old.model, new.model), ("calibration data", old.data, new.data),
                       ("float model", old.float_model or {}, new.float_model or {})):
        if a.get("sha256") and b.get("sha256") and a["sha256"] != b["sha256"]:
            notes.append(f"the {what} changed since the baseline (sha256 {a['sha256'][:12]} -> {b['sha256'][:12]})")
    for tool in ("onnxruntime", "pytest_ptq"):
        if old.tool.get(tool) and old.tool.get(tool) != new.tool.get(tool):
            notes.append(f"the baseline was made with {tool} {old.tool[tool]}, this run uses {new.tool.get(tool)}")
    # each a line: names and versions from the committed file, which a newline would break
    return Diff(metric=m.name, tolerance=tolerance, nodes=nodes, outputs=outputs, improved=improved,
                removed=removed, added=added, notes=list(map(printable, notes)), mismatch=mismatch,
                other_model=other_model)

"""Remedy search: the fewest nodes to keep in float, raise to 16 bit or quantize per channel
so that the output meets a target, written in onnxruntime's own terms.

The search runs on the compiled engine: keeping a node in float is leaving it out of the
quantized set; 16 bit and per channel are the node's alternative fake-quant
(:class:`~pytest_ptq.model.QParams`), chosen per run by a feed. Candidates are ranked by
their sensitivity (weight and activation nodes together, most sensitive first); nodes are
added in that order until the target is met, then every member whose removal still meets
it is dropped. The value after each addition is kept as a curve, so one run also tells
how many nodes other targets would need.

How the result maps onto ``onnxruntime.quantization.quantize_static``:

* **float**: ``nodes_to_exclude`` names normal nodes. onnxruntime puts a Q/DQ pair on a
  tensor when its producer *or any* of its consumers is quantized, and then every consumer
  reads the pair's output. Keeping tensor T in float therefore needs T's producer and all
  of T's consumers excluded; a weight needs the node that reads it excluded. Excluding a
  node also leaves its other inputs and outputs in float unless a neighbour still asks
  for them; the re-quantized check reports such collateral tensors.
* **int16**: ``extra_options["TensorQuantOverrides"] = {tensor: [{"quant_type":
  QuantType.QUInt16}]}`` (``QInt16`` where the node is signed): the same calibrated range
  at 16 bit. JSON holds the type's name (``"QUInt16"``), as onnxruntime itself writes it;
  :func:`quantize_static_kwargs` turns it back into the enum quantize_static requires.
* **per-channel**: weights get ``{weight: [{"axis": A}]}`` (onnxruntime quantizes that
  initializer per channel whatever ``per_channel`` says). onnxruntime cannot quantize
  activations per channel; with ``per_channel_activations`` they are simulated and listed
  under ``simulation_only``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from .errors import PTQError, unknown
from .figures import metric_label, pyplot, save_figure
from .metrics import get_metrics
from .model import QParams, load_model
from .outputs import parse_outputs
from .progress import Progress
from .results import JsonResult
from .sensitivity import engine_for, get_sensitivity_of_nodes, sample_indices

REMEDIES = ("float", "int16", "per-channel")
_QUANT_TYPES = {onnx.TensorProto.INT8: "QInt8", onnx.TensorProto.UINT8: "QUInt8",
                onnx.TensorProto.INT16: "QInt16", onnx.TensorProto.UINT16: "QUInt16"}
for _name, _qt in (("INT4", "QInt4"), ("UINT4", "QUInt4"), ("FLOAT8E4M3FN", "QFLOAT8E4M3FN")):
    if hasattr(onnx.TensorProto, _name):
        _QUANT_TYPES[getattr(onnx.TensorProto, _name)] = _qt
# onnxruntime quantizes the weight input of these ops per channel.
_PER_CHANNEL_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
# Candidates are ranked this many at a time so that a time budget can stop the ranking.
_RANK_CHUNK = 16


class _OutOfTime(Exception):
    """The time budget ran out; the search returns its best result so far."""


class _Clock:
    def __init__(self, budget):
        if budget is not None and budget <= 0:
            raise PTQError(f"budget must be a positive number of seconds, got {budget}")
        self.start = time.perf_counter()
        self.deadline = self.start + budget if budget else None
        self.exhausted = False

    def check(self):
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.exhausted = True
            raise _OutOfTime

    @property
    def elapsed(self):
        return time.perf_counter() - self.start


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
            if point["value"] is not None and _meets(m, point["value"], target):
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


def _meets(metric, value, target):
    return value is not None and not np.isnan(value) and not metric.worse(value, target)


# -- candidates and their alternative quantization ----------------------------------------
def candidates_for(engine, remedy, per_channel_activations=False):
    """Calibration nodes the remedy can act on, graph order, and why others cannot."""
    qm = engine.qmodel
    out, skipped = [], []
    for c in qm.calibration.values():
        if c.role == "bias" or c.kind not in ("weight", "activation"):
            continue
        if c.name not in engine._flag:
            skipped.append(c.name)
            continue
        if remedy == "int16" and c.bit >= 16:
            continue
        if remedy == "per-channel":
            if c.per_channel:
                continue
            if c.kind == "weight" and not any(qm.normal[n].op_type in _PER_CHANNEL_OPS for n in c.consumers):
                continue
            if c.kind == "activation" and not per_channel_activations:
                continue
        out.append(c.name)
    return out, skipped


def float_input(engine, c):
    """The float value of a weight node's input (the float weight), or None if unknown."""
    qm = engine.qmodel
    if c.float_weight:
        return qm.float_weights[c.float_weight]
    if c.q_node is not None:
        return qm.constant(c.input)
    return None


def channel_range_qparams(c, lo, hi, rank, axis):
    """Per-channel QParams covering ``[lo, hi]`` (one value per channel) at ``c``'s bit width.

    Signed nodes with zero points of 0 stay symmetric (onnxruntime's weight default, which
    uses ``[-127, 127]`` for int8); others are asymmetric over the range extended to 0.
    """
    qmin, qmax = c.qrange
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    if qmin < 0 and np.all(c.zero_point == 0):
        q = min(qmax, -qmin)
        span = np.maximum(np.abs(lo), np.abs(hi))
        scale = np.where(span > 0, span / q, 1.0)
        zp = np.zeros_like(scale)
        qlo, qhi = -q, q
    else:
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
        span = hi - lo
        # a channel of zeros quantizes exactly with any scale
        scale = np.where(span > 0, span / (qmax - qmin), 1.0)
        zp = np.clip(np.rint(qmin - lo / scale), qmin, qmax)
        qlo, qhi = qmin, qmax
    shape = [1] * rank
    shape[axis] = -1
    return QParams(scale.astype(np.float32).reshape(shape), zp.astype(np.float32).reshape(shape),
                   qlo, qhi, f"per-channel {c.dtype_name}")


def _activation_ranges(engine, names, indices, clock):
    """Per-channel (min, max, rank, axis) of the float input of activation nodes over samples."""
    from .channelwise import channel_axis

    qm = engine.qmodel
    tensors = {n: qm.calibration[n].input for n in names}
    found = {}
    for i in indices:
        clock.check()
        sample = engine.sample(i)
        probe = [t for t in tensors.values() if t not in sample and t in engine.probe_tensors]
        values = dict(sample)
        if probe:
            values.update(engine.run(sample, (), probe, kind="probe"))
        for n, t in tensors.items():
            if t not in values:
                continue
            v = values[t]
            if v.ndim < 2:
                continue
            axis = channel_axis(qm, qm.calibration[n], v.shape)
            other = tuple(a for a in range(v.ndim) if a != axis)
            lo, hi = v.min(axis=other), v.max(axis=other)
            if n in found:
                found[n] = (np.minimum(found[n][0], lo), np.maximum(found[n][1], hi), v.ndim, axis)
            else:
                found[n] = (lo, hi, v.ndim, axis)
    return found


def alternatives_for(engine, remedy, names, indices, clock=None):
    """``({node: QParams}, {node: channel axis})`` simulating ``remedy`` for ``names``."""
    from .channelwise import channel_axis

    clock = clock or _Clock(None)
    qm = engine.qmodel
    alts, axes = {}, {}
    if remedy == "int16":
        for n in names:
            c = qm.calibration[n]
            rank = None
            if c.per_channel:
                w = float_input(engine, c)
                rank = w.ndim if w is not None else None
            alts[n] = QParams.wider(c, 16, rank)
    elif remedy == "per-channel":
        acts = [n for n in names if qm.calibration[n].kind == "activation"]
        for n in names:
            c = qm.calibration[n]
            if c.kind != "weight":
                continue
            w = float_input(engine, c)
            if w is None or w.ndim < 2:
                continue
            axis = channel_axis(qm, c, w.shape)
            other = tuple(a for a in range(w.ndim) if a != axis)
            alts[n] = channel_range_qparams(c, w.min(axis=other), w.max(axis=other), w.ndim, axis)
            axes[n] = axis
        for n, (lo, hi, rank, axis) in _activation_ranges(engine, acts, indices, clock).items():
            alts[n] = channel_range_qparams(qm.calibration[n], lo, hi, rank, axis)
            axes[n] = axis
    return alts, axes


# -- settings in onnxruntime's terms -------------------------------------------------------
def float_tensor_name(qmodel, c):
    """The tensor of the float model that calibration node ``c`` quantizes.

    onnxruntime renames a quantized graph output's producer output to
    ``<name>_QuantizeLinear_Input`` and stores weights as ``<W>_quantized``.
    """
    if c.kind == "weight":
        if c.float_weight:
            return c.float_weight[len("ptq_float::"):]
        if c.q_node is None and c.input.endswith("_quantized"):
            return c.input[: -len("_quantized")]
        return c.input
    for o in c.outputs:
        if o in qmodel.output_names:
            return o
    return c.input


def onnxruntime_settings(qmodel, remedy, nodes, axes=None):
    """``{"nodes_to_exclude": [...], "TensorQuantOverrides": {...}, "simulation_only": [...]}``
    that apply ``remedy`` to the calibration ``nodes`` when quantizing the float model.

    ``nodes_to_exclude`` is in topological order; see the module docstring for why a tensor
    kept in float excludes both its producer and its consumers.
    """
    if remedy not in REMEDIES:
        raise unknown("remedy", remedy, REMEDIES)
    axes = axes or {}
    exclude, overrides, sim_only = set(), {}, []
    for name in nodes:
        c = qmodel.calibration[name]
        if remedy == "float":
            if c.kind == "activation" and c.producer in qmodel.normal:
                exclude.add(c.producer)
            exclude.update(n for n in c.consumers if n in qmodel.normal)
        elif remedy == "int16":
            signed = c.qrange[0] < 0
            overrides[float_tensor_name(qmodel, c)] = [{"quant_type": "QInt16" if signed else "QUInt16"}]
        elif c.kind == "weight" and name in axes:
            overrides[float_tensor_name(qmodel, c)] = [{"axis": int(axes[name])}]
        else:
            sim_only.append(name)
    ordered = sorted(exclude, key=lambda n: qmodel.normal[n].index)
    return {"nodes_to_exclude": ordered, "TensorQuantOverrides": overrides, "simulation_only": sim_only}


def quantize_static_kwargs(settings):
    """``nodes_to_exclude`` and ``extra_options`` for quantize_static from JSON settings
    (a dict or a path), with quant types turned into ``QuantType`` members."""
    from onnxruntime.quantization import QuantType

    if not isinstance(settings, dict):
        try:
            settings = json.loads(Path(settings).read_text())
        except (OSError, ValueError) as exc:
            raise PTQError(f"remedy settings {str(settings)!r} cannot be read ({type(exc).__name__}); "
                           "write them with ptq-debug suggest") from None
    overrides = {}
    for tensor, entries in settings.get("TensorQuantOverrides", {}).items():
        fixed = []
        for entry in entries:
            entry = dict(entry)
            if isinstance(entry.get("quant_type"), str):
                entry["quant_type"] = QuantType.from_string(entry["quant_type"])
            fixed.append(entry)
        overrides[tensor] = fixed
    extra = {"TensorQuantOverrides": overrides} if overrides else {}
    return {"nodes_to_exclude": list(settings.get("nodes_to_exclude", [])), "extra_options": extra}


def infer_quantize_options(qmodel):
    """quantize_static arguments that reproduce ``qmodel`` as far as its Q/DQ pairs show.

    The calibration method and ``op_types_to_quantize`` leave no trace; MinMax and the
    default op list are assumed. Float weights and Relu/Clip are always kept
    (AddQDQPairToWeight, QDQKeepRemovableActivations) so that the result can be analysed.
    """
    acts = [c for c in qmodel.of_kind("activation") if c.q_node is not None]
    weights = [c for c in qmodel.of_kind("weight") if c.role != "bias"]

    def common(nodes, default):
        types = Counter(_QUANT_TYPES.get(c.qtype) for c in nodes if c.qtype in _QUANT_TYPES)
        return types.most_common(1)[0][0] if types else default

    act_type = common(acts, "QUInt8")
    weight_type = common(weights, "QInt8")
    extra = {"AddQDQPairToWeight": True, "QDQKeepRemovableActivations": True}
    signed_acts = [c for c in acts if c.qrange[0] < 0]
    if signed_acts and all(np.all(c.zero_point == 0) for c in signed_acts):
        extra["ActivationSymmetric"] = True
    unsigned_w = [c for c in weights if c.qrange[0] >= 0]
    if unsigned_w and any(np.any(c.zero_point != 0) for c in unsigned_w):
        extra["WeightSymmetric"] = False
    # a node onnxruntime would quantize that reads no Q/DQ was excluded on purpose
    excluded = [n.name for n in qmodel.normal.values()
                if n.op_type in _PER_CHANNEL_OPS and not n.calibration_inputs]
    return {"activation_type": act_type, "weight_type": weight_type,
            "per_channel": any(c.per_channel for c in weights), "extra_options": extra,
            "nodes_to_exclude": excluded}


def requantize(float_model, out_path, data, options, settings=None):
    """Run quantize_static (QDQ format, MinMax) on ``float_model`` with ``options`` from
    :func:`infer_quantize_options` plus remedy ``settings``; returns ``out_path``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    extra = dict(options["extra_options"])
    exclude = list(options.get("nodes_to_exclude", []))
    if settings:
        kw = quantize_static_kwargs(settings)
        exclude += [n for n in kw["nodes_to_exclude"] if n not in exclude]
        extra.update(kw["extra_options"])

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self.i = 0

        def get_next(self):
            if self.i >= len(data):
                return None
            self.i += 1
            return data.sample(self.i - 1)

    model, path = load_model(float_model, what="float model")
    source = str(path) if path else model
    root = logging.getLogger()
    level = root.level
    # quantize_static logs a pre-processing advice on every call; it is noise here
    root.setLevel(logging.ERROR)
    try:
        quantize_static(source, str(out_path), _Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.from_string(options["activation_type"]),
                        weight_type=QuantType.from_string(options["weight_type"]),
                        per_channel=options["per_channel"], nodes_to_exclude=exclude, extra_options=extra)
    except PTQError:
        raise
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PTQError(f"onnxruntime could not re-quantize the float model with the suggested settings "
                       f"({msg}); check that the float model is the one the calibrated model came from") from None
    finally:
        root.setLevel(level)
    return Path(out_path)


# -- the search ----------------------------------------------------------------------------
class _Scorer:
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


def _rank(engine, names, metric, specs, data_num, clock, ranking):
    """``[(node, sensitivity)]`` most sensitive first, from a given ranking or computed."""
    if ranking is not None:
        return _given_ranking(ranking, names, metric)
    qm = engine.qmodel
    values = {}
    for kind in ("weight", "activation"):
        of_kind = [n for n in names if qm.calibration[n].kind == kind]
        for k in range(0, len(of_kind), _RANK_CHUNK):
            clock.check()
            s = get_sensitivity_of_nodes(engine, [metric.name], output_node=specs, node_type=kind,
                                         data_num=data_num, interested_nodes=of_kind[k:k + _RANK_CHUNK],
                                         progress=False)
            values.update({n: v[metric.name] for n, v in s.items()})
    order = sorted(values, key=lambda n: metric.sort_key(values[n]))
    return [(n, values[n]) for n in order]


def _given_ranking(ranking, names, metric):
    allowed = set(names)
    if isinstance(ranking, dict):
        ranking = [ranking]
    entries = {}
    order = []
    for item in ranking:
        if isinstance(item, str):
            if item in allowed and item not in entries:
                entries[item] = None
                order.append(item)
        elif isinstance(item, dict):
            for n, v in item.items():
                if n in allowed and n not in entries:
                    entries[n] = v.get(metric.name) if isinstance(v, dict) else None
                    order.append(n)
        else:
            raise PTQError("ranking must be a Sensitivity, a list of them, or a list of node names")
    if all(v is not None for v in entries.values()):
        order.sort(key=lambda n: metric.sort_key(entries[n]))
    return [(n, entries[n]) for n in order]


def suggest_remedy(model_or_file, calibrated_data=None, target=0.99, metric="cosine-similarity",
                   remedy="float", output_node=None, data_num=None, float_model=None, budget=None,
                   candidates=None, ranking=None, full_curve=False, per_channel_activations=False,
                   requantize_check=True, save_dir=None, progress=None, verbose=False):
    """The fewest nodes to remedy so that ``metric`` meets ``target`` (worst output, samples
    pooled), found greedily on the sensitivity ranking and then pruned.

    ``remedy``: "float", "int16" or "per-channel". ``budget``: seconds for the whole search;
    when it ends the best result so far is returned (``budget_exhausted`` set).
    ``candidates``: restrict to these calibration or normal nodes. ``ranking``: a weight or
    activation :class:`Sensitivity` (or a list of them, or calibration node names, most
    sensitive first) to reuse instead of ranking anew. With the float model (``float_model``
    or the engine's), the settings are applied by re-quantizing (after the search, outside
    the budget) and the measured value is reported beside the simulated one; the
    re-quantized models go to ``save_dir`` (or a temporary folder). Returns :class:`Remedy`.
    """
    if remedy not in REMEDIES:
        raise unknown("remedy", remedy, REMEDIES)
    clock = _Clock(budget)
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    float_model = float_model if float_model is not None else engine.float_model
    m = get_metrics(metric)[0]
    try:
        target = float(target)
    except (TypeError, ValueError):
        raise PTQError(f"target must be a number, got {target!r}") from None
    if m.name == "cosine-similarity" and not -1 <= target <= 1:
        raise PTQError(f"a cosine-similarity target must lie in [-1, 1], got {target}")
    specs = parse_outputs(output_node, engine.qmodel)
    indices = sample_indices(engine, data_num)
    qm = engine.qmodel
    pool, skipped = candidates_for(engine, remedy, per_channel_activations)
    notes = []
    if skipped:
        notes.append(f"{len(skipped)} weight node(s) such as {skipped[0]!r} are stored already quantized and "
                     "cannot be simulated; pass the float model to consider them")
    if candidates is not None:
        wanted = set(qm.resolve_calibration([candidates] if isinstance(candidates, str) else list(candidates)))
        pool = [n for n in pool if n in wanted]
    if not pool:
        raise PTQError(f"no node of {qm.source!r} can take the {remedy!r} remedy"
                       + (" among the given candidates" if candidates is not None else "")
                       + "; try another remedy")

    result = Remedy(remedy=remedy, metric=m.name, target=target, met=False, nodes=[], value=None,
                    baseline=None, ceiling=None, curve=[], pruned=[], ranking=[],
                    settings={"nodes_to_exclude": [], "TensorQuantOverrides": {}, "simulation_only": []},
                    notes=notes, samples=len(indices), outputs=[s.name for s in specs], budget_s=budget,
                    model=qm.source)
    show = verbose if progress is None else progress
    axes = {}
    scorer = None
    with Progress(len(pool) + 2, f"remedy search ({remedy})", enabled=bool(show)) as bar:
        try:
            search_engine = engine
            if remedy != "float":
                alts, axes = alternatives_for(engine, remedy, pool, indices, clock)
                missing = [n for n in pool if n not in alts]
                if missing:
                    notes.append(f"{len(missing)} node(s) such as {missing[0]!r} have no channel axis to "
                                 "quantize along and were left out")
                pool = [n for n in pool if n in alts]
                search_engine = _with_alternatives(engine, alts)
            scorer = _Scorer(search_engine, remedy, m, specs, indices, clock, bar)
            _search(result, scorer, engine, m, specs, data_num, clock, pool, ranking, full_curve)
        except _OutOfTime:
            result.budget_exhausted = True
            notes.append(f"the {budget:g} s budget ended after {clock.elapsed:.1f} s; the result is the best "
                         "found so far (raise --budget for a complete search)")
        result.evaluations = scorer.evaluations if scorer is not None else 0
    result.settings = onnxruntime_settings(qm, remedy, result.nodes, axes)
    if float_model is not None and requantize_check and result.nodes and not result.budget_exhausted:
        result.measured = _measure(engine, qm, float_model, result, specs, m, indices, save_dir)
    elif float_model is None and result.nodes:
        notes.append("pass the float model (float_model= / --float-model) to check the settings by "
                     "re-quantizing")
    result.elapsed_s = clock.elapsed
    if save_dir is not None and result.curve:
        result.png = str(plot_remedy(result, Path(save_dir) / f"remedy_{remedy}.png"))
    if verbose:
        print(result.summary())
    return result


def _with_alternatives(engine, alts):
    from .engine import Engine

    return Engine(engine.qmodel, engine.data, float_model=engine.float_model, optimization=engine.optimization,
                  providers=engine.providers, check=False, alternatives=alts)


def _search(result, scorer, engine, m, specs, data_num, clock, pool, ranking, full_curve):
    """Greedy on the ranking, then pruning; fills ``result`` as it goes so that a budget
    stop leaves the best configuration found so far in it."""
    target = result.target

    def rank_of(nodes, value, met):
        # met beats unmet; among met, fewer nodes; then the better value
        return (met, -len(nodes) if met else 0, m.sort_key(value) if value is not None else -np.inf)

    def keep(nodes, value):
        met = _meets(m, value, target)
        if result.value is None or rank_of(nodes, value, met) > rank_of(result.nodes, result.value, result.met):
            result.nodes, result.value, result.met = list(nodes), value, met

    result.baseline = scorer(())
    result.curve.append({"nodes": 0, "added": None, "value": result.baseline})
    keep([], result.baseline)
    if result.met:
        return
    ranked = _rank(engine, pool, m, specs, data_num, clock, ranking)
    result.ranking = [{"node": n, "sensitivity": v} for n, v in ranked]
    order = [n for n, _ in ranked]
    if not order:
        raise PTQError("the given ranking names none of the candidate nodes; rank the same model's nodes")
    result.ceiling = scorer(order)
    if not _meets(m, result.ceiling, target):
        what = {"float": "in float", "int16": "at 16 bit", "per-channel": "per channel"}[result.remedy]
        result.notes.append(f"even with every candidate {what} the {m.name} is {result.ceiling:.6g}, short of "
                            f"{target}; try another remedy or check the data and the float model")
    found = None
    for k in range(1, len(order) + 1):
        value = scorer(order[:k])
        result.curve.append({"nodes": k, "added": order[k - 1], "value": value})
        keep(order[:k], value)
        if found is None and _meets(m, value, target):
            found = order[:k]
            if not full_curve:
                break
    if found is None:
        keep(order, result.ceiling)
        return
    chosen = list(found)
    for n in reversed(found):
        if len(chosen) == 1:
            break
        trial = [x for x in chosen if x != n]
        value = scorer(trial)
        if _meets(m, value, target):
            chosen = trial
            result.pruned.append(n)
            keep(chosen, value)
    result.nodes, result.value, result.met = chosen, scorer(chosen), True


def _measure(engine, qm, float_model, result, specs, m, indices, save_dir):
    """Re-quantize the float model without and with the settings; score both against the
    original engine's float reference."""
    from .engine import Engine

    options = infer_quantize_options(qm)
    tmp = None
    if save_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ptq_remedy_")
        out_dir = Path(tmp.name)
    else:
        out_dir = Path(save_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
    try:
        base_path = requantize(float_model, out_dir / "requantized_baseline.onnx", engine.data, options)
        fixed_path = requantize(float_model, out_dir / f"requantized_{result.remedy}.onnx", engine.data,
                                options, result.settings)
        measured = {"options": options, "model": None if tmp else str(fixed_path),
                    "baseline_model": None if tmp else str(base_path)}
        fmodel = load_model(float_model, what="float model")[0]
        fnames = {n.name for n in fmodel.graph.node}
        unknown_names = [n for n in result.settings["nodes_to_exclude"] if n not in fnames]
        if unknown_names:
            result.notes.append(f"nodes_to_exclude names {unknown_names} are not node names of the float model "
                                "(unnamed nodes get generated names); exclude them by their float-model names")
        values = {}
        for key, path in (("baseline_value", base_path), ("value", fixed_path)):
            new = Engine(str(path), engine.data, optimization=engine.optimization, providers=engine.providers,
                         check=False)
            missing = [s.tensor for s in specs if s.tensor not in new.model_outputs and s.tensor not in new.probe_tensors]
            if missing:
                result.notes.append(f"tensor {missing[0]!r} is not in the re-quantized model; no measured value")
                return None
            values[key] = score(new, "all", specs, m, indices, reference=engine)
            if key == "value":
                measured.update(_effect(qm, new.qmodel, result))
        measured.update(values)
        measured["met"] = _meets(m, values["value"], result.target)
        if _meets(m, values["baseline_value"], result.target) and not _meets(m, result.baseline, result.target):
            result.notes.append("re-quantizing without the settings already meets the target: the model was "
                                "calibrated differently (another method or other data) from MinMax on these samples")
        return measured
    finally:
        if tmp is not None:
            tmp.cleanup()


def _effect(old, new, result):
    """What the re-quantization changed beyond, or failed to change among, the chosen nodes."""
    def quantized(qm):
        return {float_tensor_name(qm, c): c for c in qm.calibration.values() if c.role != "bias"}

    before, after = quantized(old), quantized(new)
    intended = {float_tensor_name(old, old.calibration[n]) for n in result.nodes}
    collateral, not_applied = [], []
    if result.remedy == "float":
        collateral = sorted(t for t in before if t not in after and t not in intended)
        not_applied = sorted(t for t in intended if t in after)
    elif result.remedy == "int16":
        collateral = sorted(t for t in after if t in before and after[t].bit != before[t].bit and t not in intended)
        not_applied = sorted(t for t in intended if t in after and after[t].bit < 16)
    else:
        weights = {t for t in intended if t in before and before[t].kind == "weight"}
        collateral = sorted(t for t in after if t in before and after[t].per_channel and not before[t].per_channel
                            and t not in intended)
        not_applied = sorted(t for t in weights if t in after and not after[t].per_channel)
    return {"collateral": collateral, "not_applied": not_applied}


# -- plot -----------------------------------------------------------------------------------
def plot_remedy(result, path):
    """The search curve as a PNG: nodes remedied on x, the metric on y, the target dashed."""
    plt = pyplot()
    m = get_metrics(result.metric)[0]
    pts = [p for p in result.curve if p["value"] is not None]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    xs = [p["nodes"] for p in pts]
    ys = [p["value"] for p in pts]
    ax.plot(xs, ys, marker="o", linewidth=1.5, label=f"top-k nodes by sensitivity ({result.remedy})")
    # name the first additions only: beyond a handful the labels pile up
    for p in pts[1:9]:
        ax.annotate(p["added"], (p["nodes"], p["value"]), textcoords="offset points", xytext=(4, -12),
                    fontsize=7, rotation=-20)
    ax.axhline(result.target, linestyle="--", color="tab:red", linewidth=1, label=f"target {result.target}")
    if result.value is not None:
        ax.scatter([len(result.nodes)], [result.value], s=120, facecolors="none", edgecolors="tab:green",
                   linewidths=2, zorder=3, label=f"chosen after pruning: {len(result.nodes)} node(s)")
    if result.measured and result.measured.get("value") is not None:
        ax.scatter([len(result.nodes)], [result.measured["value"]], marker="*", s=150, color="tab:purple",
                   zorder=4, label="measured after re-quantizing")
    ax.set_title(f"Remedy search ({result.remedy}) on {Path(result.model).name}, {result.samples} sample(s)")
    ax.set_xlabel("number of nodes remedied (most sensitive first)")
    ax.set_ylabel(metric_label(m))
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, path)


# -- command line ------------------------------------------------------------------------------
def _register():
    from . import cli
    from .tables import format_table

    @cli.subcommand("suggest", "find the fewest nodes to keep in float, raise to 16 bit or quantize per "
                    "channel so the output meets a target; print onnxruntime settings")
    def cmd_suggest(args):
        if args.target is None and args.metric != "cosine-similarity":
            raise PTQError(f"--metric {args.metric} needs --target VALUE (--target-cosine is for cosine similarity)")
        metric, target = ("cosine-similarity", args.target_cosine) if args.target is None else (args.metric, args.target)
        engine = cli._engine(args)
        save_dir = None if args.no_save else args.save_dir
        result = suggest_remedy(engine, metric=metric, target=target, remedy=args.remedy,
                                output_node=args.output_node, budget=args.budget, candidates=args.candidates,
                                full_curve=args.full_curve, per_channel_activations=args.per_channel_activations,
                                requantize_check=not args.no_requantize, save_dir=save_dir,
                                progress=not args.quiet)
        rows = [{"nodes": p["nodes"], "added": p["added"] or "(baseline)", result.metric: p["value"]}
                for p in result.curve]
        print(format_table(rows, ["nodes", "added", result.metric]))
        print(result.summary())
        if save_dir is not None:
            settings = Path(save_dir) / f"remedy_{result.remedy}_settings.json"
            settings.write_text(json.dumps(result.settings, indent=1))
            print(f"wrote {settings}")
            print(f"wrote {result.save(Path(save_dir) / f'remedy_{result.remedy}.json')}")
            if result.png:
                print(f"wrote {result.png}")
        if args.json:
            print(f"wrote {result.save(args.json)}")
        measured_ok = result.measured is None or result.measured.get("met", True)
        return 0 if result.met and measured_ok else 1

    def configure(p):
        cli._common(p)
        g = p.add_mutually_exclusive_group()
        g.add_argument("--target-cosine", type=_cosine, default=0.99, metavar="C",
                       help="cosine similarity the outputs must reach. Default: 0.99")
        g.add_argument("--target", type=float, default=None, metavar="V",
                       help="value of --metric the outputs must reach (instead of --target-cosine)")
        p.add_argument("--metric", default="cosine-similarity",
                       help="metric for --target. Default: cosine-similarity")
        p.add_argument("--remedy", default="float", choices=REMEDIES,
                       help="keep nodes in float, raise them to 16 bit, or quantize them per channel. Default: float")
        p.add_argument("--budget", type=_seconds, default=None, metavar="SECONDS",
                       help="stop after this long and report the best result so far. Default: no limit")
        p.add_argument("-o", "--output-node", nargs="+", default=None, metavar="OUTPUT",
                       help="outputs to compare (a tensor or a slice 'name=out[:, 0:4]'). Default: every model output")
        p.add_argument("--candidates", nargs="+", default=None, metavar="NODE",
                       help="consider only these calibration or normal nodes. Default: every eligible node")
        p.add_argument("--full-curve", action="store_true",
                       help="keep adding nodes after the target is met, for the whole curve")
        p.add_argument("--per-channel-activations", action="store_true",
                       help="with --remedy per-channel, also simulate activations per channel "
                            "(onnxruntime cannot emit it)")
        p.add_argument("--no-requantize", action="store_true",
                       help="skip re-quantizing the float model to measure the settings")
        p.add_argument("-s", "--save-dir", default="ptq_debug_output",
                       help="where the settings, curve plot and re-quantized models go. Default: ptq_debug_output")
        p.add_argument("--no-save", action="store_true", help="write nothing")
        p.add_argument("--json", default=None, metavar="OUT", help="also save the result as JSON here")

    cmd_suggest.configure = configure


def _cosine(text):
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not -1 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a cosine similarity lies in [-1, 1], got {value}")
    return value


def _seconds(text):
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


_register()

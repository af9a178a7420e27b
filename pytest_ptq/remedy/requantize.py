"""Applying a remedy for real: re-quantize the float model with onnxruntime and measure it."""

from __future__ import annotations

import logging
import shlex
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from .. import guard, params
from ..progress import Progress
from ..engine import Engine
from ..engine.runtime import ALWAYS_DISABLED, make_session, run
from ..errors import InputRefused, NotQuantized, PTQError, raised_by_user
from ..metrics import Pooled
from ..model import QuantModel, load_model
from ..model.align import FOLDABLE, counterpart, float_counterpart
from ..model.graph import name_nodes
from ..model.qdq import PER_CHANNEL_OPS
from ..stages import SIMULATION_WARNING, simulation_warnings
from ..tables import fmt
from .effect import changes, places, readers
from .objective import targets_text
from .terms import float_node_name, float_tensor_name, quantize_static_kwargs, quantized_ops, quantizer_call

_QUANT_TYPES = {onnx.TensorProto.INT8: "QInt8", onnx.TensorProto.UINT8: "QUInt8",
                onnx.TensorProto.INT16: "QInt16", onnx.TensorProto.UINT16: "QUInt16"}
for _name, _qt in (("INT4", "QInt4"), ("UINT4", "QUInt4"), ("FLOAT8E4M3FN", "QFLOAT8E4M3FN")):
    if hasattr(onnx.TensorProto, _name):
        _QUANT_TYPES[getattr(onnx.TensorProto, _name)] = _qt


def infer_quantize_options(qmodel):
    """quantize_static arguments that reproduce ``qmodel`` as far as its Q/DQ pairs show.

    The calibration method and ``op_types_to_quantize`` leave no trace; MinMax and the
    default op list are assumed. Float weights and Relu/Clip are always kept
    (AddQDQPairToWeight, QDQKeepRemovableActivations) so that the result can be analysed;
    biases stay float (QuantizeBias=False) when every quantized Conv/Gemm reads a float one.
    A dynamically quantized model is re-quantized with quantize_dynamic (``quantizer``). A
    QOperator model comes back in QDQ form: the same quantization, and analysable.
    """
    acts = [c for c in qmodel.of_kind("activation") if c.q_node is not None and not c.dynamic]
    weights = [c for c in qmodel.of_kind("weight") if c.role != "bias"]

    def common(nodes, default):
        types = Counter(_QUANT_TYPES.get(c.qtype) for c in nodes if c.qtype in _QUANT_TYPES)
        return types.most_common(1)[0][0] if types else default

    # the weights onnxruntime quantizes as weights: a matrix product's; an Add's constant takes
    # the activation type, or the weight type without its symmetry
    products = [c for c in weights
                if any(qmodel.normal[n].op_type in PER_CHANNEL_OPS for n in c.consumers if n in qmodel.normal)]

    def float_weight(n):  # read as the float initializer it is, no DequantizeLinear between
        w = n.inputs[1] if len(n.inputs) > 1 else ""
        return bool(w) and w not in qmodel.producer and qmodel.is_constant(w) and qmodel.is_float_tensor(w)

    # a node onnxruntime would quantize that reads no Q/DQ was excluded on purpose, or its op
    # type left out of op_types_to_quantize (its output may still have a pair, for a quantized
    # reader; a float16 graph's node computed in float32 reads its pairs through Casts); so
    # was a product whose weight stays float where other products' are quantized, though its
    # neighbours' pairs feed it
    ops = quantized_ops(qmodel)
    excluded = [n.name for n in qmodel.normal.values() if n.op_type in ops and (
        not qmodel.quantizers_through_casts(n.name) or (n.op_type in PER_CHANNEL_OPS and products and float_weight(n)))]
    weight_type = common(products or weights, "QInt8")
    typed = [c for c in products if _QUANT_TYPES.get(c.qtype) == weight_type]
    # reduce_range keeps 8-bit weights on 7 bits; asked for on the whole model, it shows on every one
    reduce_range = bool(typed) and all(qmodel.reduced_range(c) is not None for c in typed)
    if qmodel.format == "dynamic":
        # quantize_dynamic quantizes a MatMul between two activations only when told to
        both = any(sum(qmodel.calibration[c].dynamic for c in n.calibration_inputs) > 1
                   for n in qmodel.normal.values() if n.op_type == "MatMul")
        return {"quantizer": "quantize_dynamic", "weight_type": weight_type,
                "per_channel": any(c.per_channel for c in weights), "reduce_range": reduce_range,
                "extra_options": {"MatMulConstBOnly": False} if both else {}, "nodes_to_exclude": excluded}

    act_type = common(acts, "QUInt8")
    extra = {"AddQDQPairToWeight": True, "QDQKeepRemovableActivations": True}
    if qmodel.symmetric_activations():
        extra["ActivationSymmetric"] = True
    if typed:
        # symmetric weights sit on the grid's middle code (0 signed, 128 uint8); onnxruntime's
        # default is symmetric for signed types only, so the option is given where it differs
        signed = typed[0].qrange[0] < 0
        asymmetric = any(np.any(c.zero_point != (0 if signed else (c.qrange[0] + c.qrange[1] + 1) // 2))
                         for c in typed)
        if asymmetric == signed:
            extra["WeightSymmetric"] = not asymmetric
    # biases left float (QuantizeBias=False) read a float initializer; re-quantizing them to
    # int32 would move the outputs away from the model being remedied
    biased = [n for n in qmodel.normal.values() if n.op_type in PER_CHANNEL_OPS and n.calibration_inputs
              and len(n.inputs) > 2 and n.inputs[2]]
    if biased and all(qmodel.is_constant(n.inputs[2]) and qmodel.is_float_tensor(n.inputs[2]) for n in biased):
        extra["QuantizeBias"] = False
    return {"quantizer": "quantize_static", "activation_type": act_type, "weight_type": weight_type,
            "per_channel": any(c.per_channel for c in weights), "reduce_range": reduce_range, "extra_options": extra,
            "nodes_to_exclude": excluded}


def own_grids(qmodel):
    """``TensorQuantOverrides`` giving each tensor ``qmodel`` quantizes (float model names,
    weights included) the quant type, scale and zero point it holds: its calibration
    rebuilt, whatever method made it. Tensors whose pairs disagree, block-wise or float
    grids, biases and dynamic pairs are left to the calibration."""
    from onnxruntime.quantization import QuantType

    found = {}
    for c in qmodel.calibration.values():
        if c.role == "bias" or c.dynamic or c.block_size or c.grid.is_float or c.qtype not in _QUANT_TYPES:
            continue
        found.setdefault(float_tensor_name(qmodel, c), []).append(c)
    out = {}
    for tensor, pairs in found.items():
        c = pairs[0]
        # float32 as onnxruntime computes its own, whatever the file stores (a float16 graph's
        # float16 scales would not type-check on the float32 tensors it quantizes)
        scale, zp = np.ravel(c.scale).astype(np.float32), np.ravel(c.zero_point)
        if any(d.qtype != c.qtype or d.axis != c.axis or not np.array_equal(np.ravel(d.scale), scale)
               or not np.array_equal(np.ravel(d.zero_point), zp) for d in pairs[1:]):
            continue  # two grids for one tensor: a single override cannot give both
        qt = QuantType.from_string(_QUANT_TYPES[c.qtype])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(c.qtype)
        if c.per_channel:
            out[tensor] = [{"scale": np.float32(s), "zero_point": np.array(z, dtype), "quant_type": qt,
                            **({"axis": int(c.axis)} if k == 0 else {})} for k, (s, z) in enumerate(zip(scale, zp))]
        else:
            out[tensor] = [{"scale": np.array(scale[0], np.float32), "zero_point": np.array(zp[0], dtype),
                            "quant_type": qt}]
    return out


def unreproducible(qmodel):
    """Why re-quantizing the float model with onnxruntime cannot check a remedy of
    ``qmodel``, or None: a model that quantizes weights only (block-wise int4 from a
    weight-only quantizer) would come back with its activations quantized too."""
    if not qmodel.weight_only:
        return None
    return ("it quantizes weights only (no activation has a pair), and quantize_static would quantize the activations "
            "too: re-quantizing with it would measure another model; apply the settings with the weight-only quantizer "
            "that made it (onnxruntime's MatMulNBitsQuantizer takes nodes_to_exclude as well)")


def requantize(float_model, out_path, data, options, settings=None, kept=None):
    """Run quantize_static (QDQ format, MinMax), or quantize_dynamic for a dynamic model, on
    ``float_model`` with ``options`` from :func:`infer_quantize_options` plus remedy
    ``settings``; returns ``out_path``. ``kept``: overrides (:func:`own_grids`) for the
    tensors the settings' own overrides do not name."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    extra = dict(options["extra_options"])
    exclude = list(options.get("nodes_to_exclude", []))
    per_channel = options["per_channel"]
    if settings:
        kw = quantize_static_kwargs(settings)
        exclude += [n for n in kw["nodes_to_exclude"] if n not in exclude]
        extra.update(kw["extra_options"])
        per_channel = per_channel or kw.get("per_channel", False)

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self.i = 0

        def get_next(self):
            if self.i >= len(data):
                return None
            self.i += 1
            return data.sample(self.i - 1)

    # the model, not its path: given a path, onnxruntime writes <name>-inferred.onnx beside the
    # user's file and deletes it (a user's file of that name included; a read-only folder fails);
    # given the model, it works in a temporary folder of its own
    model = load_model(float_model, what="float model")[0]
    if not set(exclude) <= {n.name for n in model.graph.node}:
        # quantize_static excludes nodes by name only: unnamed ones get the names pytest-ptq
        # gives them everywhere (see measure's note), in this copy
        name_nodes(model.graph)
    if kept:
        present = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input} | {
            o for n in model.graph.node for o in n.output}
        # the remedy's overrides replace the model's own whole: a tensor raised to int16 must
        # not keep the 8-bit scale, a weight made per channel not its one scale; and come first,
        # as onnxruntime validates the first tensor's only (its reason for refusing the remedy's)
        own = extra.get("TensorQuantOverrides", {})
        extra["TensorQuantOverrides"] = {**own, **{t: e for t, e in kept.items() if t in present and t not in own}}
    source = model
    root = logging.getLogger()
    level = root.level
    # quantize_static logs a pre-processing advice on every call; it is noise here
    root.setLevel(logging.ERROR)
    guard.claim(out_path)
    try:
        if options.get("quantizer") == "quantize_dynamic":
            quantize_dynamic(source, str(out_path), weight_type=QuantType.from_string(options["weight_type"]),
                             per_channel=per_channel, reduce_range=options.get("reduce_range", False),
                             nodes_to_exclude=exclude, extra_options=extra)
        else:
            quantize_static(source, str(out_path), _Reader(), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.from_string(options["activation_type"]),
                            weight_type=QuantType.from_string(options["weight_type"]),
                            per_channel=per_channel, reduce_range=options.get("reduce_range", False),
                            nodes_to_exclude=exclude, extra_options=extra)
    except PTQError:
        raise
    except OSError as exc:
        raise guard.write_error(getattr(exc, "filename", None) or out_path, exc) from None
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if settings is None:  # the model as it was quantized: the float model must be the wrong one
            raise PTQError(f"onnxruntime could not re-quantize the float model with the calibrated model's options "
                           f"({msg}); check that the float model is the one the calibrated model came from") from None
        raise SettingsRefused(f"onnxruntime's quantizer cannot apply the suggested settings to the float model "
                              f"({msg}), though it quantizes it without them: the figures are simulated only; "
                              "try another remedy (--remedy float), or apply this one by editing the model") from None
    finally:
        root.setLevel(level)
    return Path(out_path)



def measure(parts, objective, float_model, result, save_dir, progress=False):
    """Re-quantize the float model without and with the settings and score both on each
    part of ``parts`` (``{name: (Part, Scorer)}``, ``calibration`` first, then the judging
    part) against the calibrated model's float reference; the scorer gives each part's bar.
    ``progress``: a bar over the four steps (quantize_static tells nothing while it works)."""
    cal_part = parts["calibration"][0]
    engine = cal_part.engine
    qm = engine.qmodel
    options = infer_quantize_options(qm)
    out_dir, tmp = guard.output_folder(save_dir, "ptq_remedy_")
    # announced: the first step alone may take a minute on a large model
    bar = Progress(4, f"re-quantizing the float model without and with the remedy ({options['quantizer']}), "
                      "then scoring both", enabled=progress, announce=True)
    try:
        with bar:
            base_path = requantize(float_model, out_dir / "requantized_baseline.onnx", engine.data, options)
            kept, first = _kept_grids(qm, float_model, base_path, engine.data, options)
            bar.advance()
            try:
                fixed_path = requantize(float_model, out_dir / f"requantized_{result.remedy}.onnx", engine.data,
                                        options, result.settings, kept)
            except SettingsRefused as exc:
                result.warnings.append(str(exc))
                return None
            bar.advance()
            measured = {"options": options, "model": None if tmp else str(fixed_path),
                        "baseline_model": None if tmp else str(base_path)}
            if kept:
                measured["kept_grids"] = len(kept)
            fmodel = load_model(float_model, what="float model")[0]
            fnames = {n.name for n in fmodel.graph.node}
            given = set().union(*name_nodes(fmodel.graph))
            missing = [n for n in result.settings["nodes_to_exclude"] if n not in fnames]
            unnamed = [n for n in missing if n in given]
            if unnamed:
                result.notes.append(f"the float model's nodes {unnamed} have no name of their own in its file (none, or "
                                    "one another node shares), and quantize_static excludes nodes by name only: "
                                    "pytest-ptq names such a node <OpType>_<k> (k counting that op type in graph order) "
                                    "or <name>__<k>, and re-quantized a copy so named; name each so in the float model "
                                    "before quantizing it")
            if len(unnamed) < len(missing):
                result.notes.append(f"nodes_to_exclude names {[n for n in missing if n not in unnamed]} are not node names "
                                    "of the float model, and quantize_static ignores them")
            figures = {name: {"samples": len(part), "target": scorer.target} for name, (part, scorer) in parts.items()}
            for key, path in (("before", base_path), ("after", fixed_path)):
                try:
                    values, new = score_parts(parts, objective, path, float_model)
                except MissingTensor as exc:
                    result.notes.append(f"{exc}; no measured value")
                    return None
                bar.advance()
                for name, value in values.items():
                    figures[name][key] = value
                if key == "before":
                    baseline = new.qmodel
                    _reproduced(qm, baseline, result)
                    differ = _differences(qm, new.qmodel) if options.get("quantizer") != "quantize_dynamic" else []
                if key == "after":
                    measured.update(_effect(qm, baseline, new.qmodel, result))
                    if not objective.is_task:  # a name that holds other values in each file: which was read
                        moved = {t: r for t, r in _reads(engine, new, objective.specs, path).items() if t != r}
                        if moved:
                            t, r = next(iter(moved.items()))
                            result.notes.append(
                                f"{t!r} of {qm.source!r} is read as {r!r} in the re-quantized models, which compute "
                                "its values there (the two files name that tensor differently)")
                    if isinstance(new, Engine):  # the file as a plain session runs it, against its simulation
                        result.warnings += [f"the re-quantized file: {w}" for w in simulation_warnings(new)]
            for f in figures.values():  # each output's values and target, as the simulation's figures
                f.update(objective.by_output(f["before"], f["after"]))
            measured.update(judged(figures, objective, result.judged_on))
            _deployed(parts, objective, fixed_path, base_path, measured, result)
            judged_part = figures.get(result.judged_on, figures["calibration"])
            given, again = result.figures.get("calibration", {}).get("before"), figures["calibration"].get("before")
            if kept and not differ:
                shown = "; ".join(first[:3]) + ("; ..." if len(first) > 3 else "")
                result.notes.append(
                    f"re-quantizing with the options read from the file alone does not reproduce the model given "
                    f"({len(first)} of its quantized tensors differ: {shown}): it was calibrated or quantized otherwise "
                    "than onnxruntime's MinMax with those options, so the check kept the model's own scales and zero "
                    "points for the tensors the remedy does not change (TensorQuantOverrides given to quantize_static "
                    "for the check only, not part of the settings)")
            elif objective.meets(judged_part["before"], judged_part["target"]) and not result.figures.get(
                    result.judged_on, {}).get("met_before", False):
                result.notes.append(
                    "re-quantizing without the settings already meets the target: quantize_dynamic calibrates nothing, "
                    "so the simulation and the re-quantized model differ only where float rounding flips a few codes of "
                    "a range computed per run" if options.get("quantizer") == "quantize_dynamic" else
                    "re-quantizing without the settings already meets the target: the model was calibrated differently "
                    "(another method or other data) from MinMax on these samples")
            elif differ or (options.get("quantizer") != "quantize_dynamic" and _unlike(objective.metric, given, again)):
                # pair by pair where both files are read: a loss one pair dominates hid the rest
                measured["reproduces"] = False
                name = getattr(objective.metric, "name", "the metric")
                shown = "; ".join(differ[:3]) + ("; ..." if len(differ) > 3 else "")
                pairs = (f": {len(differ)} of its quantized tensors differ ({shown})" if differ else "") + (
                    ", though the check kept the model's own scales and zero points" if kept else "")
                result.notes.append(
                    f"re-quantizing without the settings does not reproduce the model given ({name} {again:.6g} on "
                    f"calibration against {given:.6g} as given){pairs}: it was calibrated or quantized otherwise "
                    "(other data, another method or options) than onnxruntime's MinMax with the options read from the "
                    "file, so the re-quantized figures judge that and the simulated ones the model given; re-quantize "
                    "with the data and options that made it")
            return measured
    finally:
        if tmp is not None:
            tmp.cleanup()


def _kept_grids(qmodel, float_model, base_path, data, options):
    """``(overrides, differences)``: where re-quantizing with ``options`` alone gave another
    model than ``qmodel`` (another calibration method, other data, overrides), ``qmodel``'s
    own grids (:func:`own_grids`) and how the first try differed, with ``base_path``
    re-quantized again with them; else ``(None, differences)``, ``base_path`` as it was."""
    if options.get("quantizer") == "quantize_dynamic":
        return None, []
    try:
        first = _differences(qmodel, QuantModel(str(base_path)))
    except NotQuantized:  # nothing left to keep a grid for; scoring says what it measured
        return None, []
    kept = own_grids(qmodel) if first else None
    if not kept:
        return None, first
    try:
        requantize(float_model, base_path, data, options, kept=kept)
    except PTQError:  # grids it refuses (an axis it cannot take) fail before it writes: the first file stands
        return None, first
    return kept, first


def _unlike(metric, a, b):
    """Whether two values of ``metric`` for what should be the same model differ beyond
    float rounding and the codes it flips: losses (1 - a similarity, an error) more than 1.5x
    apart, other figures (SQNR, a task score) by more than 2%."""
    if a is None or b is None or not np.isfinite([a, b]).all():
        return False
    unit, higher = getattr(metric, "unit", False), getattr(metric, "higher_is_better", True)
    if unit or not higher:
        la, lb = (1 - a, 1 - b) if unit else (a, b)
        low, high = sorted((abs(la), abs(lb)))
        return high - low > 1e-5 and high > 1.5 * low
    return abs(a - b) > 0.02 * max(abs(a), abs(b))


class SettingsRefused(PTQError):
    """onnxruntime's quantizer fails with a remedy's settings on a float model it quantizes
    without them (per-channel weights it does not hold as initializers, say)."""


class MissingTensor(PTQError):
    """A tensor the objective reads is not in a re-quantized model."""


def judged(figures, objective, judged_on):
    """``{value, baseline_value, met, figures}`` of a re-quantization: ``figures`` (per part
    ``{before, after, target, ...}``) each marked ``met``; the values are calibration's, ``met``
    the judging part's."""
    for f in figures.values():
        f["met"] = objective.meets(f["after"], f["target"])
    cal = figures["calibration"]
    return {"value": cal["after"], "baseline_value": cal["before"], "met": figures.get(judged_on, cal)["met"],
            "figures": figures}


def _deployed(parts, objective, path, base_path, measured, result):
    """The judging part's objective of the re-quantized file (``path``, and ``base_path``
    re-quantized without the settings) as a plain onnxruntime session runs it (its default
    options: pairs fused into integer kernels, every default optimization on), beside the
    simulated one: the file deployed on this machine. Read only (the verdict stays the
    simulation's, the same on every machine); a warning where the simulation meets the target
    and the file so run does not, and where the settings lose accuracy so run."""
    name = result.judged_on if result.judged_on in parts else "calibration"
    part, _ = parts[name]
    inner = [] if objective.is_task else [s.tensor for s in objective.specs
                                          if s.tensor not in part.engine.model_outputs]
    if inner:  # a session returns its graph outputs only; exposing one would undo the fusions it measures
        result.notes.append(f"the re-quantized file was not scored as a plain onnxruntime session runs it: "
                            f"{inner[0]!r} is a tensor inside the graph, which such a session does not return (its "
                            "fused integer kernels may not compute it at all); name a model output to have it scored so")
        return
    try:
        value, before = (_value(_Plain(p, part.engine.data, part.engine, deployed=True), part, objective)
                         for p in (path, base_path))
    except PTQError as exc:  # a file onnxruntime cannot load with its default options: said, nothing measured
        result.warnings.append(f"the re-quantized file does not run in a plain onnxruntime session ({exc})")
        return
    figure = measured["figures"][name]
    figure["deployed"], figure["deployed_before"] = value, before
    # where the gap on the calibration samples was too small to warn of, point at the tool
    # that compares the file with its simulation on any data
    told = any(w.startswith(f"the re-quantized file: {SIMULATION_WARNING}") for w in result.warnings)
    why = ("see the warning on how the file runs otherwise than its simulation for why" if told else
           f"`ptq-debug stages FLOAT_MODEL {shlex.quote(measured.get('model') or 'REQUANTIZED_MODEL')} DATA` (the "
           f"{name} data) compares the file with its simulation and checks why they differ")
    if value is not None and before is not None and objective.metric.worse(value, before):
        result.warnings.append(
            f"run as a plain onnxruntime session runs them (default options, on this machine), the file re-quantized "
            f"with these settings reads {fmt(value)} on {name}, worse than re-quantized without them ({fmt(before)}): "
            f"as deployed here the settings cost accuracy; {why}")
    figure["deployed_met"] = objective.meets(value, figure["target"])
    if figure["met"] and not figure["deployed_met"]:
        bar = fmt(figure["target"]) if objective.targets is None else targets_text(objective.target, objective.targets)
        result.warnings.append(
            f"the re-quantized file, run as a plain onnxruntime session runs it (default options, on this machine), "
            f"reads {fmt(value)} on {name}, short of the target {bar} that its simulation meets "
            f"({fmt(figure['after'])}): the verdict is the simulation's; {why}"
            + (", and deploy it with the setting that warning checks" if told else ""))


def score_parts(parts, objective, path, float_model=None):
    """``({part: value}, engine)``: the objective of the model at ``path`` fully quantized on
    each part of ``parts`` (``{name: (Part, Scorer)}``), against the calibrated model's float
    reference; ``engine`` runs ``path`` on the calibration part's data. An output named
    inside the graph is read where the re-quantized model computes what the calibrated
    model's tensor of that name computes (:func:`_reads`; ``float_model``: the float model
    both came from, which maps the two)."""
    cal = parts["calibration"][0].engine
    # an output of the model is the model's output in both; a tensor inside is found through
    # the alignment of each with the float model, the re-quantized one aligned only for it
    inner = not objective.is_task and any(s.tensor not in cal.model_outputs for s in objective.specs)
    engines, values, read = {}, {}, None
    for name, (part, _) in parts.items():
        data = part.engine.data
        if id(data) not in engines:  # one engine per data set: runs by index reuse each sample's float reference
            engines[id(data)] = requantized_runner(path, data, cal, float_model if inner else None)
        new = engines[id(data)]
        if read is None and not objective.is_task:
            read = _reads(cal, new, objective.specs, path)
        values[name] = _value(new, part, objective, read)
    return values, engines[id(cal.data)]


def _reads(given, new, specs, path):
    """``{tensor of the calibrated model: the tensor of the re-quantized model (``new``, at
    ``path``) computing it}`` for ``specs``: a model output by its name; a tensor inside the
    graph through both models' alignments with the float model (quantize_static gives a
    folded Relu's name to the Conv before it, and keeps the Relu when re-quantizing, so the
    name alone would read the Relu's output against the Conv's). :class:`MissingTensor`
    where the re-quantized model does not compute one, or the alignments do not say where."""
    out = {}
    for t in dict.fromkeys(s.tensor for s in specs):
        if t in given.model_outputs:
            found = t if t in new.model_outputs else None
        elif new.qmodel is None:
            # nothing left quantized (every node the quantizer would touch excluded): quantize_static
            # wrote the float model's graph back under the float model's names
            found = float_counterpart(given.qmodel, t)
        else:
            found = counterpart(given.qmodel, new.qmodel, t)
        if found is None or (found not in new.model_outputs and found not in new.probe_tensors):
            if t in given.model_outputs or t in getattr(getattr(given.qmodel, "alignment", None), "computes", ()):
                raise MissingTensor(f"tensor {t!r} is not in the re-quantized model {str(path)!r}")
            raise MissingTensor(f"tensor {t!r} of {given.source!r} has no counterpart in the re-quantized model "
                                f"{str(path)!r} that the alignments of both with the float model find, so the "
                                "re-quantized models are not scored on it (a tensor of that name there may hold other "
                                "values); name a model output or a tensor the float model computes")
        out[t] = found
    return out


def requantized_runner(path, data, engine, float_model=None):
    """What runs the re-quantized model at ``path`` on ``data`` as ``engine`` runs its own
    (``run(sample, "all", tensors)``): an engine, or a plain session where the model is left
    with nothing quantized. ``float_model``: aligned with it (:func:`_reads` maps tensors so)."""
    try:
        return Engine(str(path), data, optimization=engine.optimization, providers=engine.providers, check=False,
                      segments=0, plain_layout=True, float_model=float_model)
    except NotQuantized:
        return _Plain(path, data, engine)


class _Plain:
    """A re-quantized model run as stored in one session (``qmodel`` None): one with nothing
    quantized, or any as deployed."""

    qmodel = None

    def __init__(self, path, data, engine, deployed=False):
        """``deployed``: as a plain session runs it (default options, none of the optimizations
        the engine turns off), whatever it holds; else a tensor inside the graph can be read
        too (:attr:`probe_tensors`), through a session that returns it."""
        model = load_model(str(path), what="the re-quantized model")[0]
        self.source, self.data = str(path), data
        self._model, self._engine, self._deployed = model, engine, deployed
        self.session = self._session(model)
        self.model_outputs = [o.name for o in model.graph.output]
        # as deployed, a session returns its graph outputs only (exposing one would undo fusions)
        self.probe_tensors = [] if deployed else [o for n in model.graph.node for o in n.output if o]
        self._exposing = {}  # the tensors inside the graph a session returns -> that session

    def _session(self, model):
        return make_session(model, "all" if self._deployed else self._engine.optimization, self._engine.providers,
                            fake_quant=False, what=f"the re-quantized model {self.source!r}",
                            disabled_optimizers=() if self._deployed else ALWAYS_DISABLED)

    def _session_for(self, tensors):
        inner = tuple(t for t in tensors if t not in self.model_outputs)
        if not inner:
            return self.session
        if inner not in self._exposing:
            model = onnx.ModelProto()
            model.CopyFrom(self._model)
            types = {v.name: v.type.tensor_type.elem_type
                     for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
            model.graph.output.extend(onnx.helper.make_tensor_value_info(t, types.get(t) or onnx.TensorProto.FLOAT,
                                                                         None) for t in inner)
            self._exposing[inner] = self._session(model)
        return self._exposing[inner]

    def run(self, sample, quantized="all", tensors=None):
        feeds = self.data.sample(int(sample)) if isinstance(sample, (int, np.integer)) else sample
        tensors = list(tensors or self.model_outputs)
        return dict(zip(tensors, run(self._session_for(tensors), tensors, feeds, self.source)))


def _value(new, part, objective, read=None):
    """The objective of the re-quantized model ``new`` (everything quantized) on ``part``;
    ``read``: ``{tensor: new's tensor}`` (:func:`_reads`), default the same names."""
    if objective.is_task:
        name = objective.metric.name
        try:
            score = objective.evaluate(lambda feeds: new.run(dict(feeds), "all"), part.data())
        except InputRefused as exc:  # feeds the function built: its line, not the data, is at fault
            raise raised_by_user(f"the evaluation function {name}", exc) from None
        except PTQError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: one sentence naming its line, not our frames
            raise raised_by_user(f"the evaluation function {name}", exc) from exc
        return params.task_score(score, name)
    tensors = list(dict.fromkeys(s.tensor for s in objective.specs))
    read = read or {t: t for t in tensors}
    theirs = list(dict.fromkeys(read[t] for t in tensors))
    pool = Pooled(objective.metric, objective.specs)
    for i in part.indices:
        values = new.run(i, "all", theirs)
        pool.add(part.engine.reference(i, tensors), {t: values[read[t]] for t in tensors})
    return objective.figure(pool, part)


def _reproduced(old, new, result):
    """A warning where re-quantizing without the settings quantizes fewer tensors of a kind
    than the model given: onnxruntime's quantizer skipped what the model's quantizer
    quantized, so the re-quantized figures measure another, less quantized model."""
    if new is None:
        return
    # tensors, not pairs: a tensor two nodes read may have a pair for each (DedicatedQDQPair)
    given, again = (Counter(k for k, _ in {(c.kind, c.input) for c in qm.calibration.values() if c.role != "bias"})
                    for qm in (old, new))
    short = [f"{again[k]} of its {n} {k} tensor(s)" for k, n in given.items() if again[k] < n]
    if short:
        result.warnings.append(
            f"re-quantizing the float model without the settings ({quantizer_call(old)}) quantizes only "
            f"{' and '.join(short)}: onnxruntime left the rest in float, so the re-quantized figures measure a less "
            "quantized model than the one given and verify nothing of it; the simulated figures are the model's")


def _differences(old, new):
    """How re-quantizing without settings (``new``) departs from the model given (``old``),
    tensor by tensor: one phrase each ("'r1': scale 0.0123 against 0.0145 given"), graph
    order; [] where every quantized tensor has the same type, grid and granularity."""
    if new is None:
        return []

    def grids(qm):
        return {float_tensor_name(qm, c): c for c in qm.calibration.values() if c.role != "bias" and not c.dynamic}

    before, after = grids(old), grids(new)
    # the check re-quantizes keeping each Relu/Clip (QDQKeepRemovableActivations), which puts a
    # pair on its input too, where the model given folded it into its output's pair: as made
    kept = {float_tensor_name(new, new.calibration[ci]) for n in new.normal.values()
            if n.op_type in FOLDABLE and n.outputs and getattr(before.get(n.outputs[0]), "folded", None)
            for ci in n.calibration_inputs}
    out = [f"{t!r}: quantized only re-quantized" for t in after if t not in before and t not in kept]
    for t, c in before.items():
        d = after.get(t)
        if d is None:
            out.append(f"{t!r}: float re-quantized")
        elif (c.dtype_name, c.per_channel, c.block_size) != (d.dtype_name, d.per_channel, d.block_size):
            out.append(f"{t!r}: {_grid_words(d)} against {_grid_words(c)} given")
        elif c.scale.shape != d.scale.shape or not np.allclose(d.scale, c.scale, rtol=1e-4, atol=0):
            out.append(f"{t!r}: scale {np.max(np.abs(d.scale)):.4g} against {np.max(np.abs(c.scale)):.4g} given")
        elif not np.array_equal(np.ravel(c.zero_point), np.ravel(d.zero_point)):
            out.append(f"{t!r}: zero point {np.ravel(d.zero_point)[0]:g} against {np.ravel(c.zero_point)[0]:g} given")
    return out


def _grid_words(c):
    return f"{c.dtype_name} {'per block' if c.block_size else 'per channel' if c.per_channel else 'per tensor'}"


def _effect(old, baseline, new, result):
    """What the re-quantization with the settings (``new``) changed beyond, or failed to
    change among, the chosen nodes of the model given (``old``), against the re-quantization
    without them (``baseline``): what the settings reach, not where quantize_static differs
    from the file's producer anyway (:func:`~.effect.changes`; per channel is checked on
    weights, which quantize_static quantizes per channel itself)."""
    def quantized(qm):
        return places(qm, lambda c: float_tensor_name(qm, c), float_node_name(qm))

    before, after = quantized(baseline), ({} if new is None else quantized(new))
    expect, named = {}, set()
    for n in result.nodes:
        kind, tensor = result.choices.get(n, result.remedy), float_tensor_name(old, old.calibration[n])
        if kind != "per-channel" or old.calibration[n].kind == "weight":
            # the operators it reaches tell it from another pair of the same tensor (one for each reader)
            expect.setdefault(kind, []).append((tensor, old.chain_position(n), readers(old, n, float_node_name(old))))
        else:  # touched without a check of its own
            named.add(tensor)
    found = changes(before, after, expect, named)
    return {"collateral": found["collateral"], "not_applied": found["not_applied"]}



"""Stage localisation: at which step between the float model and the integer model the
outputs drift, on the same data (the seed's original / optimized / calibrated / quantized
model comparison).

Stages, each compared with the float model run without graph optimisations:

1. ``optimized-float``: the float model under onnxruntime's ORT_ENABLE_ALL optimisations;
2. ``rewritten`` (only when the quantizer changed the graph beyond Q/DQ): the QDQ model with
   every pair bypassed (float weights from the float model): what is left of the float model
   after the quantizer's own changes (a Sigmoid made a HardSigmoid, a BatchNormalization folded);
3. ``fake-quant``: the calibrated QDQ model with Q/DQ kept as float arithmetic
   (``session.disable_quant_qdq=1``): the quantization as simulated;
4. ``integer``: the QDQ file as it is stored, with default session options, where onnxruntime
   fuses Q/DQ into its integer kernels (QLinearConv, QLinearMatMul, ...); a QOperator or
   dynamic model, or a pair whose codes a Reshape or Transpose lays out between Q and DQ,
   runs as its file holds it (stage 3 runs the tool's form of it).

A drop at stage 1 points at the export or a graph optimisation, at stage 2 at the
quantizer's rewrite, at stage 3 at calibration and quantization (find the nodes with
sensitivity, fix them with ``suggest``), at stage 4 only at the integer kernels.
``kernel_gap`` compares stages 4 and 3 directly.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import guard, params
from .data import load_data, overflows
from .engine import Engine
from .engine.core import on_sample
from .engine.runtime import CHAIN_MERGE, FLOAT8_REWRITES, INLINE_DISABLED, asked_providers, make_session, run
from .engine.sanity import spread
from .errors import NotQuantized, PTQError
from .kernels import as_uint8_weights, float8_rewrites, requantize_chains, requantized_nodes, saturation_cause
from .metrics import Pooled, by_output, compare, get_metric, get_metrics
from .model import QuantModel, load_model
from .model.align import refuse_quantized
from .outputs import parse_outputs, parts_note
from .progress import Progress
from .results import JsonResult, read_from
from .tables import format_table, listed

STAGES = {
    "optimized-float": "float model, onnxruntime ORT_ENABLE_ALL",
    "fake-quant": "QDQ model, Q/DQ simulated in float (disable_quant_qdq=1)",
    "integer": "QDQ model on onnxruntime's integer kernels (default options)",
}
# Shown between optimized-float and fake-quant only when the quantizer changed the graph
# beyond Q/DQ: a clean model would only carry a row of 1.0 there.
REWRITE = ("rewritten", "QDQ model with every pair bypassed: the float graph as the quantizer rewrote it")
_HOLDS = "the simulation holds but onnxruntime's integer kernels do not: "
_ADVICE = {
    "optimized-float": ("the float model already changes under onnxruntime's graph optimisations: check the "
                        "export (opset, unsupported ops) before looking at quantization"),
    "rewritten": ("the quantizer changed the graph beyond inserting Q/DQ (ops replaced or fused, e.g. Sigmoid -> "
                  "HardSigmoid): that change alone loses it; turn the rewrite off in the quantizer's options or exclude "
                  "those ops"),
    "fake-quant": ("the simulated quantization loses it: a calibration or quantization problem; rank the nodes "
                   "with get-sensitivity-of-nodes and fix them with suggest"),
    "integer": (_HOLDS + "a kernel problem (int16 "
                "saturation of u8s8 kernels on CPUs without VNNI, an unsupported fusion); try reduce_range=True, "
                "per-channel weights, QInt8 activations or another execution provider"),
}


@dataclasses.dataclass
class StageReport(JsonResult):
    """Per stage ``{"stage", "description", "values": {metric: v}, "per_output": {output:
    {metric: v}}, "per_sample": {metric: [v]}}`` in pipeline order; ``values`` is the worst
    output, samples pooled. ``kernel_gap``: integer vs fake-quant, same shape.
    ``first_drop``: the first stage worse than ``threshold`` (None when all hold or no
    threshold applies). Truthy when no stage drops.
    """

    metrics: list
    outputs: list
    samples: int
    threshold: float | None
    stages: list
    kernel_gap: dict
    first_drop: str | None
    message: str
    float_model: str = ""
    calibrated_model: str = ""
    optimized_model: str | None = None
    notes: list = dataclasses.field(default_factory=list)  # outputs scored in parts, and why
    kernel_cause: str = ""  # why the integer kernels differ from the simulation, where known

    def __bool__(self):
        return self.first_drop is None

    def value(self, stage, metric=None):
        metric = metric or self.metrics[0]
        for s in self.stages:
            if s["stage"] == stage:
                return s["values"][metric]
        raise KeyError(stage)

    def table(self):
        rows = [{"stage": s["stage"], **s["values"], "description": s["description"]} for s in self.stages]
        rows.append({"stage": "integer vs fake-quant", **self.kernel_gap["values"],
                     "description": "how far the integer kernels are from the simulation"})
        return format_table(rows, ["stage"] + self.metrics + ["description"])




def localize_stages(float_model, calibrated_model, calibrated_data, metrics=("cosine-similarity",),
                    output_node=None, data_num=None, threshold=None, providers=None, save_dir=None,
                    progress=None):
    """Compare every stage's outputs with the float model's on the same samples.

    ``threshold`` applies to the first metric (default 0.99 for cosine similarity, none for
    other metrics, which then only report values). ``output_node``: model outputs or slices
    of them. With ``save_dir``, onnxruntime's optimised float model is written there.
    ``calibrated_model`` may be an :class:`Engine`: its model and (with ``calibrated_data``
    None) its data are reused.
    Returns a :class:`StageReport`.
    """
    metric_objs = get_metrics(metrics)
    first = metric_objs[0]
    threshold = None if threshold is None else params.threshold(threshold, first.name)
    if threshold is None and first.name == "cosine-similarity":
        threshold = params.DEFAULT_MIN_COSINE
    fmodel, fpath = load_model(float_model, what="float model")
    if isinstance(calibrated_model, Engine):  # its model and data, loaded once
        refuse_quantized(fmodel, fpath)  # an engine with its own float model never aligns this one
        engine = calibrated_model
        qm = engine.qmodel
        data = load_data(engine.data if calibrated_data is None else calibrated_data, qm, data_num)
        if engine.float_model is None:  # the bypassed stage needs the float weights
            engine = Engine(QuantModel(qm.model, float_model=fmodel, shared=qm.shared), data,
                            float_model=fpath or fmodel, custom_op_libraries=engine.libraries)
    else:
        try:
            qm = QuantModel(calibrated_model, float_model=fpath or fmodel)
        except NotQuantized:
            if any(n.op_type == "QuantizeLinear" for n in fmodel.graph.node):
                raise PTQError(f"the calibrated model {str(calibrated_model)!r} has no Q/DQ pairs and the float "
                               f"model {str(fpath or '(given as a ModelProto)')!r} has: the two look swapped; give the float model "
                               "first, then the calibrated one") from None
            raise
        data = load_data(calibrated_data, qm, data_num)
        # checked against the float model: another model's outputs would read as a rewrite
        engine = Engine(qm, data, float_model=fpath or fmodel)
    qmodel = qm.model
    inputs = (guard.Inputs().add(fpath, guard.FLOAT_MODEL).add(qm.path, guard.MODEL_FILE)
              .add(getattr(data, "path", None), "calibration data"))
    if save_dir is not None:
        save_dir = guard.output_path(save_dir, "save_dir", inputs, folder=True)
    specs = parse_outputs(output_node, engine)  # a concatenation of unlike parts: by part
    float_outputs = {o.name for o in fmodel.graph.output}
    for s in specs:
        if s.tensor not in qm.output_names or s.tensor not in float_outputs:
            raise PTQError(f"output {s.tensor!r} is not an output of both the float and the calibrated model; "
                           f"stages compare model outputs (common: {sorted(float_outputs & set(qm.output_names))})")
    finputs = [i.name for i in fmodel.graph.input if i.name not in {x.name for x in fmodel.graph.initializer}]
    if sorted(finputs) != sorted(qm.input_names):
        raise PTQError(f"the float model's inputs {finputs} differ from the calibrated model's {qm.input_names}; "
                       "pass the float model the calibrated model was made from")
    optimized = None
    if save_dir is not None:
        guard.makedirs(save_dir)
        optimized = inputs.check(guard.claim(save_dir / "optimized_float_model.onnx"), "the optimised float model")
    providers = asked_providers(providers) or ["CPUExecutionProvider"]
    what = "the model for stage comparison"
    libs = calibrated_model.libraries if isinstance(calibrated_model, Engine) else ()
    sessions = {
        "reference": make_session(fmodel, "disable", providers, fake_quant=False, what=what),
        "optimized-float": make_session(fmodel, "all", providers, fake_quant=False, optimized_path=optimized,
                                        what=what),
        # in the plain layout, as the engine's fully quantized figure (see runtime.INLINE_DISABLED)
        "fake-quant": make_session(qmodel, "all", providers, fake_quant=True, what=what, libraries=libs,
                                   shared=engine.shared, disabled_optimizers=INLINE_DISABLED),
        "integer": make_session(qm.as_given(), "all", providers, fake_quant=False, what=what, libraries=libs,
                                shared=engine.shared, disabled_optimizers=()),  # as a plain session deploys it
    }
    sources = {"reference": fpath, "optimized-float": fpath, "fake-quant": qm.source, "integer": qm.source}
    tensors = list(dict.fromkeys(s.tensor for s in specs))
    labels = ["optimized-float", REWRITE[0], "fake-quant", "integer", "kernel-gap"]
    pools = {k: [Pooled(m, specs, per_sample=True) for m in metric_objs] for k in labels}
    indices = range(len(data))
    ran = set()
    with Progress(len(data), "stages", enabled=progress) as bar:
        for i in indices:
            feeds = data.sample(i)
            with on_sample(data, i, ran):
                outs = {k: dict(zip(tensors, run(sess, tensors, feeds, str(sources[k] or "<ModelProto>"))))
                        for k, sess in sessions.items()}
            _check_reference(outs["reference"], feeds, i, fpath)
            outs["rewritten"] = engine.run(feeds, (), tensors)
            for k in labels:
                ref, test = (outs["fake-quant"], outs["integer"]) if k == "kernel-gap" else (outs["reference"], outs[k])
                for pool in pools[k]:
                    pool.add(ref, test)
            bar.advance()
    rows = {}
    for k in labels:
        per_output = by_output(pools[k])
        values = {m.name: pool.judged(data) for m, pool in zip(metric_objs, pools[k])}
        rows[k] = {"stage": k, "description": {**_described(qm), REWRITE[0]: REWRITE[1]}.get(
            k, "integer kernels vs the simulation"), "values": values, "per_output": per_output,
            "per_sample": {m.name: pool.samples for m, pool in zip(metric_objs, pools[k])}}
    rewritten = bool(getattr(engine.qmodel, "alignment", None) and engine.qmodel.alignment.rewrites) or \
        rows[REWRITE[0]]["values"].get("cosine-similarity", 1.0) < 1 - 1e-6
    shown = [k for k in labels[:-1] if k != REWRITE[0] or rewritten]
    stages = [rows[k] for k in shown]
    cause = kernel_cause(engine, specs, providers)
    first_drop, message = verdict({k: rows[k]["values"][first.name] for k in shown},
                                  rows["kernel-gap"]["values"][first.name], first.name, threshold, cause=cause,
                                  rewrite=_rewrite_cause(engine))
    return read_from(StageReport(
        metrics=[m.name for m in metric_objs], outputs=[s.name for s in specs], samples=len(data),
        threshold=threshold, stages=stages, kernel_gap=rows["kernel-gap"], first_drop=first_drop, message=message,
        float_model=str(fpath) if fpath else "<ModelProto>", calibrated_model=qm.source,
        optimized_model=str(optimized) if optimized else None, notes=parts_note(specs), kernel_cause=cause), inputs)


# Output cosine between the simulation and a QOperator or dynamic file as onnxruntime runs
# it, below which runall says the two differ (a step's rounding on 8 bits stays above it)
SIMULATION_CLOSE = 0.999
# Samples it is measured on, spread over the data: the gap is a few samples' (the example
# classifier's dynamic file on a CPU whose kernels saturate read 1.0 on its first two crops and
# 0.9976 on the third), and a data set sorted by source may hold its hard ones at the end
SIMULATION_SAMPLES = 8


def simulation_gap(engine, specs, samples=SIMULATION_SAMPLES, model=None, providers=None, disabled=(),
                   simulated=None, count=None):
    """Worst output cosine between the engine's fully quantized run (Q/DQ as float arithmetic;
    a QOperator or dynamic file simulated in its Q/DQ form) and onnxruntime running the file as
    given with its default options, on its integer kernels (a QDQ file's pairs fused into
    them), over ``samples`` samples spread evenly over the data (its first ``count``, default
    all; first and last included); None without samples or values (outputs of size 0 are
    skipped); compared on those of ``specs`` that are the file's outputs (its default
    outputs where none is). ``model``: a ModelProto run instead of the file (any format);
    ``providers``: its session's (default: the engine's); ``disabled``: onnxruntime optimizers
    turned off in it (none: as a plain session deploys it); ``simulated``: a dict of the
    engine's runs by sample, read and filled, shared by the calls comparing one file several
    ways. Its session and the engine's for every pair quantized are dropped after."""
    qm = engine.qmodel
    count = len(engine.data or ()) if count is None else min(count, len(engine.data or ()))
    n = min(samples, count)
    if not n:
        return None
    # the file's outputs only: a tensor inside it may be fused away on the integer kernels
    specs = [s for s in specs if s.tensor in qm.output_names] or parse_outputs(None, engine)
    tensors = list(dict.fromkeys(s.tensor for s in specs))
    session = make_session(qm.as_given() if model is None else model, "all", providers or engine.providers,
                           fake_quant=False, what=repr(qm.source), libraries=engine.libraries, shared=engine.shared,
                           disabled_optimizers=disabled)
    simulated = {} if simulated is None else simulated
    worst = []
    try:
        for i in spread(count, n):
            with engine.on_sample(i):
                given = dict(zip(tensors, run(session, tensors, engine.data.sample(i), qm.source)))
            if (i, tuple(tensors)) not in simulated:
                simulated[i, tuple(tensors)] = engine.run(i, "all", tensors)
            ours = simulated[i, tuple(tensors)]
            for s in specs:
                sim, ran = s.take(ours[s.tensor]), s.take(given[s.tensor])
                # an output holding no values on this sample (a detector's [0, 3] boxes) has
                # nothing to differ in; compare refuses it, which is no failed session
                if np.size(sim) or np.size(ran):
                    worst.append(compare(sim, ran)["cosine-similarity"])
    finally:
        engine.forget_config("all")  # a whole-graph session of every gate, which analyses seldom run again
    return get_metrics("cosine-similarity")[0].worst(worst) if worst else None


def kernel_cause(engine, specs, providers=None, given=None, simulated=None):
    """:func:`kernel_causes` in one sentence ("" where none may)."""
    return "; ".join(kernel_causes(engine, specs, providers, given, simulated))


def kernel_causes(engine, specs, providers=None, given=None, simulated=None, count=None):
    """Why onnxruntime runs the file otherwise than its simulation, each cause checked by
    running the file without it: this CPU's saturation of uint8 x int8 products
    (:func:`~pytest_ptq.kernels.saturation_cause`; the file with those weights stored as uint8,
    the same values, which no kernel saturates on), and the default optimizations that change
    a QDQ file as it loads (WeightBiasQuantization, float8's Relu/Clip rewrites, the merge of
    requantize chains; the file with them off), a clause each, the cause whose removal brings
    the file closest to the simulation first; ``[]`` where none may. ``given``: :func:`simulation_gap` of the file as given, where
    known; ``simulated`` and ``count``: as :func:`simulation_gap` takes them."""
    providers = providers or engine.providers
    simulated = {} if simulated is None else simulated
    qm = engine.qmodel
    clauses, checked = [], []  # clauses: (what the file reads without that cause, sentence)
    cause = saturation_cause(qm, providers)
    widened = as_uint8_weights(qm) if cause else None
    gap = _without(engine, specs, providers, simulated, count, model=widened) if widened is not None else None
    if gap is None:
        clauses += [(-1.0, cause)] if cause else []
    else:
        checked.append(gap)
        stored = f"with those weights stored as uint8, the same values, the file reads {gap:.6f} against the simulation"
        if gap < SIMULATION_CLOSE and given is None:
            given = _without(engine, specs, providers, simulated, count)
        # closer: a tenth of the difference gone at least (0.951231 -> 0.951236 is rounding)
        closer = given is not None and 1 - gap < 0.9 * (1 - given)
        clauses.append((gap, cause + (f" (checked: {stored})" if gap >= SIMULATION_CLOSE else
                                      f"; {stored}, from {given:.6f} as given" if closer else
                                      f"; {stored}, {given:.6f} as given: not what moves this file's outputs"
                                      if given is not None else f"; {stored}")))
    weights, biases = requantized_nodes(qm, (1,)), requantized_nodes(qm, (2,))
    rounded = ", and ".join(([f"the float weights of {len(weights)} node(s) reading a quantized input "
                              f"({listed(weights)}) to per-tensor int8 (so a node left in float there is float only "
                              "in the simulation)"] if weights else [])
                            + ([f"the float biases of {len(biases)} node(s) to int32 (which lets it fuse them into "
                                "its integer kernels)"] if biases else []))
    rewrites, chains = float8_rewrites(qm), requantize_chains(qm)
    tried, alone = [], []  # (optimizers, what they do, the file without them); their clauses
    for nodes, optimizers, what in (
            (weights + biases, ("WeightBiasQuantization",), f"quantizes {rounded} as it loads the file"),
            (rewrites, FLOAT8_REWRITES, f"delete {len(rewrites)} Relu/Clip node(s) before float8 QuantizeLinears "
                                        f"({listed(rewrites)}), taking zero for the floor of a grid that goes below "
                                        "it"),
            (chains, CHAIN_MERGE, f"merges {len(chains)} requantize chain(s) (a pair read straight by another "
                                  f"pair's QuantizeLinear: {listed(chains)}) into one pair each as it loads the file "
                                  "(the simulation runs the Q/DQ as written)")):
        if not nodes:
            continue
        if given is None:
            given = _without(engine, specs, providers, simulated, count)
        off = _without(engine, specs, providers, simulated, count, disabled=optimizers)
        tried.append((optimizers, what, off))
        if off is not None and given is not None and off > given:
            checked.append(off)
            named = f"optimization{'s' if len(optimizers) > 1 else ''} {' and '.join(optimizers)} {what}"
            alone.append((off, _optimization_clause(optimizers, named, off)))
    if len(tried) > 1 and given is not None:
        # causes that only add up together: on a classifier, the merge of its chains alone took
        # the file further from the simulation while its biases were quantized as it loaded,
        # and both off brought it there (it was said to depart "in more")
        together = tuple(o for optimizers, _, _ in tried for o in optimizers)
        both = _without(engine, specs, providers, simulated, count, disabled=together)
        best = max([given] + [off for _, _, off in tried if off is not None])
        # a tenth closer at least, where no cause alone brings the file to its simulation
        if both is not None and best < SIMULATION_CLOSE and 1 - both < 0.9 * (1 - best):
            checked.append(both)
            named = "optimizations " + "; ".join(f"{' and '.join(optimizers)} {what}" for optimizers, what, _ in tried)
            alone = [(both, "together (each alone moves it less): " + _optimization_clause(together, named, both))]
    clauses += alone
    # the cause whose removal brings the file closest to the simulation first
    sentences = [c for _, c in sorted(clauses, key=lambda fc: -fc[0])]
    if checked and max(checked) < SIMULATION_CLOSE:
        sentences[-1] += "; no cause removed brings the file to the simulation: its kernels depart from it in more"
    return sentences


def _optimization_clause(optimizers, named, off):
    """The sentence of onnxruntime's default ``optimizers`` as a cause: ``named``, what they
    do, and what the file reads with them off (``off``)."""
    them = "them" if len(optimizers) > 1 else "it"
    return (f"onnxruntime's default {named}; with {them} off (InferenceSession(..., disabled_optimizers="
            f"{list(optimizers)!r})) the file reads {off:.6f} against the simulation")


def _without(engine, specs, providers, simulated, count, **changed):
    """:func:`simulation_gap` of the file run without a cause (``changed``: its arguments), or
    None where onnxruntime cannot run it so (a changed file its checker refuses): that cause
    goes unchecked, never the analysis stopped."""
    try:
        return simulation_gap(engine, specs, providers=providers, simulated=simulated, count=count, **changed)
    except PTQError:
        return None


SIMULATION_WARNING = "the file runs otherwise than its simulation"


def _check_reference(values, feeds, i, fpath):
    """Refuse a sample on which the float model itself gives non-finite outputs: every stage
    would read NaN and blame the first one."""
    bad = next((k for k, v in values.items() if np.asarray(v).dtype.kind == "f" and not np.isfinite(v).all()), None)
    if bad is None:
        return
    raise overflows(f"the float model {str(fpath or '(given as a ModelProto)')!r}", bad, i, feeds)


def simulation_warnings(engine, specs=None, count=None):
    """``[warning]`` when the file, run as given on onnxruntime's integer kernels, differs
    from the Q/DQ arithmetic every analysis simulates (:func:`simulation_gap` below
    :data:`SIMULATION_CLOSE`), else ``[]``; the warning's first line says so, a line after it
    each cause (see :func:`~pytest_ptq.tables.warning_lines`). ``specs``: the outputs compared
    (default: the engine's default outputs); ``count``: the first samples looked at (default all)."""
    specs = parse_outputs(None, engine) if specs is None else specs
    simulated = {}  # the engine's runs, shared by every way the file is run below
    try:
        gap = simulation_gap(engine, specs, simulated=simulated, count=count)
    except PTQError as exc:  # onnxruntime's default optimizations break it (float8's ClipQuantRewrite, say)
        try:
            # the rewrites that can fail a session, not every one the simulation turns off
            simulation_gap(engine, specs, samples=1, disabled=FLOAT8_REWRITES, simulated=simulated, count=count)
            runs = (f"; it runs with InferenceSession(..., disabled_optimizers={list(FLOAT8_REWRITES)!r}), as the "
                    "simulation does")
        except PTQError:
            runs = "; the simulation runs it with onnxruntime's QDQ fusion off (session.disable_quant_qdq)"
        return [f"{SIMULATION_WARNING}: every figure simulates Q/DQ as float arithmetic, and a plain onnxruntime session "
                f"with its default options cannot run this file ({exc}){runs}"]
    if gap is None or gap >= SIMULATION_CLOSE:
        return []
    causes = (kernel_causes(engine, specs, given=gap, simulated=simulated, count=count) or
              ["its integer kernels round otherwise than Q/DQ arithmetic, and the model amplifies the difference"])
    qm = engine.qmodel
    simulated = ("Q/DQ as float arithmetic, and onnxruntime running this QDQ file with its default options (its "
                 "pairs fused into integer kernels, as it deploys it)" if qm.format == "QDQ" else
                 f"this {qm.format_label} file in its Q/DQ form, and onnxruntime running the file itself")
    # a line each: the finding, then each cause with what running the file without it read
    return ["\n".join([f"{SIMULATION_WARNING}: every figure simulates {simulated} differs from that simulation "
                       f"(output cosine {gap:.4f}, the worst of {min(SIMULATION_SAMPLES, count or len(engine.data))} "
                       "samples spread over the data, each compared on its own; `stages` compares every sample, "
                       "pooled and one by one); the rankings and the verdict are the simulation's; why:", *causes])]


def _described(qm):
    """:data:`STAGES`, worded for the model's format: a QOperator or dynamic file is simulated
    through its rewrite into Q/DQ, and its integer stage is the file as stored."""
    if qm.format == "QDQ":
        return STAGES
    return {**STAGES, "fake-quant": f"{qm.format_label} model rewritten to Q/DQ, simulated in float (what the "
                                    "analyses measure)",
            "integer": f"{qm.format_label} model as stored, on onnxruntime's kernels (default options)"}


def _rewrite_cause(engine):
    """What the quantizer changed beyond Q/DQ, as the engine's float-equivalence check found
    it ("" when it found nothing to name)."""
    if engine.folded:
        names = ", ".join(repr(n) for n in engine.folded[:3]) + (" ..." if len(engine.folded) > 3 else "")
        return (f"the quantizer folded the Relu/Clip before {names} into the Q/DQ range and deleted it, and what "
                "reads the tensor beyond the pair now gets it unclipped; re-quantize with "
                "extra_options={'QDQKeepRemovableActivations': True}")
    if engine.rewrite is not None:
        return (f"the quantizer changed the graph beyond inserting Q/DQ ({engine.rewrite['changes']}): that change "
                "alone loses it; turn the rewrite off in the quantizer's options or exclude those ops")
    return ""


def verdict(values, kernel_gap, metric, threshold, cause="", rewrite=""):
    """``(first stage worse than threshold or None, one readable sentence)``.

    ``values``: ``{stage: value}`` for the stages in :data:`STAGES` order; ``kernel_gap``:
    the integer-vs-fake-quant value of the same metric; ``cause``: why the kernels differ,
    where known (:func:`~pytest_ptq.kernels.saturation_cause`); ``rewrite``: what the
    quantizer changed, where known (the rewritten stage's advice).
    """
    m = get_metric(metric)
    if threshold is None:
        return None, (f"no threshold for {m.name}: compare the stages by eye or pass a threshold")
    for stage in (st for st in ("optimized-float", REWRITE[0], *list(STAGES)[1:]) if st in values):
        v = values[stage]
        if v != v or m.worse(v, threshold):
            advice = _HOLDS + cause if stage == "integer" and cause else (
                rewrite if stage == REWRITE[0] and rewrite else _ADVICE[stage])
            # the kernels' own difference on top of an earlier stage's, where it is more than
            # rounding: a loss where the file reads worse against float than the simulation
            close = SIMULATION_CLOSE if m.name == "cosine-similarity" else threshold
            more = ""
            if stage != "integer" and kernel_gap == kernel_gap and m.worse(kernel_gap, close):
                lose = "integer" in values and m.worse(values["integer"], v)
                more = (f"; the integer kernels {'lose more on top of it' if lose else 'differ from it'} ({m.name} "
                        f"{kernel_gap:.6g} against the simulation{': ' + cause if cause else ''}"
                        + ("" if lose or "integer" not in values else
                           f"; the file as run reads {values['integer']:.6g} against float, no worse") + ")")
            crosses = "falls below" if m.higher_is_better else "rises above"
            return stage, f"{m.name} first {crosses} {threshold} at stage {stage!r} ({v:.6g}): {advice}{more}"
    gap = ""
    if kernel_gap == kernel_gap and m.worse(kernel_gap, threshold):
        why = f": {cause}" if cause else ", so results on other data may not hold"
        gap = f"; the integer kernels differ from the simulation ({m.name} {kernel_gap:.6g} between them){why}"
    keeps = "at or above" if m.higher_is_better else "at or below"
    return None, f"every stage keeps {m.name} {keeps} {threshold}{gap}"

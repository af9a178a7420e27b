"""Why a model misses its contract: whose loss it is, which nodes, why, and what to change.

A failing check says *that* a model falls short; this says *why*, from what the plugin has
already computed plus one cheap sweep, so that every failing test can afford it (no remedy
search runs here):

* the three-config :class:`~pytest_ptq.verdict.Verdict` (weights only, activations only,
  everything) on the data the contract judged on;
* each of the top ranked nodes with its kind (weight, activation, or operator: a normal node,
  whose weight and activation inputs are scored apart to say which of them costs more), and
  the reading of its statistics behind it (the same readings as ``runall``: a per-tensor weight
  scale losing channels, clipping, a bulk starved of codes, or a plainly sensitive node);
* the fix in the producer's terms: onnxruntime ``quantize_static`` settings
  (``per_channel=True``, ``nodes_to_exclude``, ``TensorQuantOverrides`` at 16 bit), with what
  each is for; NVIDIA Model Optimizer's ``nodes_to_exclude`` where it made the model;
* the engine's warnings (folded activations, rewritten graphs, weights on the grid) with the
  fix each names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .distribution import collect
from .distribution.readings import advise
from .errors import PTQError
from .metrics import get_metric
from .outputs import blind_warnings, parse_outputs
from .remedy.producer_terms import MODELOPT_PER_CHANNEL, MODELOPT_QUANTIZE, PRODUCERS, kept_in_float, modelopt_call, producer_advice
from .remedy.result import override_text, snippet
from .remedy.terms import onnxruntime_settings, per_channel_weights, quantizer_call
from .results import JsonResult
from .params import KIND_WORDS
from .sensitivity import rank_configs
from .stages import SIMULATION_WARNING
from .tables import SUMMARY_WIDTH, short
from .verdict import DOMINANT, RELEVANT, WEIGHTS_UNSEEN, badness, float_first, relevant, severe_reason

SOURCE_WORDS = {"weight": "weights", "activation": "activations", "both": "weights and activations",
                "neither": "neither (close to float)"}
# What the engine's warnings ask for, where their sentence does not say it already;
# {stages} is the stage comparison's command for the model at hand.
_WARNING_FIXES = {
    "graph rewritten by the quantizer": "compare the stages (ptq.assert_stages() in a test, or `{stages}`) to see "
                                        "what the rewrite costs on its own",
    SIMULATION_WARNING: "measure the file itself against float (ptq.assert_stages() in a test, or `{stages}`) "
                        "before trusting a figure",
}


@dataclasses.dataclass
class Diagnosis(JsonResult):
    """``verdict``: the :class:`~pytest_ptq.verdict.Verdict` as a dict (``source``, ``text``,
    ``values``, ``decided_on``, ``samples``); ``nodes``: the top ranked nodes, each with
    ``kind``, ``op_type``, its ``value``, the ``cause`` (weight, activation, both) and
    ``reason``, ``try`` and its calibration ``inputs``; ``fixes``: ``{kind, text, nodes}`` most
    useful first; ``settings``: the fixes as quantizer arguments, ``snippet`` the call;
    ``producer_terms``: the fixes in the terms of the quantizer that made the model, where it is
    neither onnxruntime nor Model Optimizer (whose terms the fixes use), as summary lines;
    ``warnings``: ``{text, fix}``."""

    model: str
    producer: str
    producer_key: str
    format: str
    metric: str
    node_type: str
    samples: int
    verdict: dict
    nodes: list
    fixes: list
    settings: dict
    snippet: str
    terms: str
    warnings: list
    producer_terms: list = dataclasses.field(default_factory=list)
    outputs: list = dataclasses.field(default_factory=list)  # the output specs judged, where not the model's
    asked_type: str = ""  # the node type asked for, where the verdict blamed the other kind (see caveat)

    @property
    def source(self):
        return self.verdict["source"]

    @property
    def cause(self):
        """"weights", "activations", "weights and activations" or "neither (close to float)"."""
        return SOURCE_WORDS.get(self.source, self.source)

    def headline(self):
        """The cause and the first fix, in one line (for summaries)."""
        fix = f"; try {self.fixes[0]['short']}" if self.fixes else ""
        return f"cause: {self.cause} ({self.verdict_figures()}){fix}"

    def verdict_figures(self, dataset=None):
        """"0.9257 weights only, 0.9314 activations only, 0.8661 everything, on 24 held-out samples"."""
        v = self.verdict
        dataset = dataset or v["decided_on"]
        f = v["values"][dataset]
        on = "held-out" if dataset == "heldout" else "calibration"
        return (f"{short(f['weight only'])} weights only, {short(f['activation only'])} activations only, "
                f"{short(f['all quantized'])} everything, on {v['samples'][dataset]} {on} samples")

    def cause_text(self):
        """The verdict in one sentence with its figures, on the data it was decided on (and
        the calibration figures beside held-out ones)."""
        v = self.verdict
        what = {"weight": "weight quantization causes most of the loss",
                "activation": "activation quantization causes most of the loss",
                "both": "weights and activations each cause a comparable part of the loss: fix the worst nodes "
                        "of each",
                "neither": "the quantized model stays close to float; the threshold asks for more than that"}
        text = f"cause: {self.cause}: {what.get(self.source, self.source)} ({v['metric']} {self.verdict_figures()}"
        if v["decided_on"] != "calibration":
            text += f"; {self.verdict_figures('calibration')}"
        text += ")"
        if WEIGHTS_UNSEEN in v.get("text", ""):
            text += f"; {WEIGHTS_UNSEEN}"
        if v.get("rewrite"):
            text += f"; {v['rewrite']}"
        return text

    def caveat(self):
        """When the ranking is of another kind than asked, or its few samples alone would blame
        another kind, a sentence saying so."""
        v = self.verdict
        if self.asked_type and self.asked_type != self.node_type:
            return (f"note: {self.asked_type} nodes were asked for, but {self.cause} cause the loss, so the "
                    f"{self.node_type} nodes are ranked below: fixing {self.asked_type} nodes recovers little")
        if not v.get("disagreement") or not v.get("ranking"):
            return ""
        r = v["ranking"]
        return (f"note: on the {self.samples} sample(s) the ranking used, weights only reach {short(r['weight only'])} "
                f"and activations only {short(r['activation only'])}, which would blame another kind; the cause "
                "above is measured on all samples: rank on more samples (data_num) before trusting the node order")

    def lines(self, top=None, width=SUMMARY_WIDTH, report=None):
        """Plain text lines: the verdict, the ranked nodes with their reasons, the fix.
        ``report``: the HTML report being written, if any: there a node's reason is cut to three
        lines, its conclusion kept, and the nodes left out are found; without one, everything is
        printed."""
        import textwrap

        def wrapped(text, indent="  ", first=None, max_lines=None, ending=""):
            # the fullest pointer to the report that fits a line (textwrap refuses a wider one)
            pointers = (f" ...{ending} ({report} has it all)", f" ... ({report} has it all)")
            placeholder = next((p for p in pointers if len(indent) + 4 + len(p) <= width), " ... (the report has it all)")
            return textwrap.wrap(text, width=width, initial_indent=first if first is not None else indent,
                                 subsequent_indent=indent + "    ", break_on_hyphens=False,
                                 break_long_words=False,  # a node name cut in two cannot be copied
                                 max_lines=max_lines if report else None, placeholder=placeholder) or [indent]

        out = wrapped(self.cause_text(), first="")
        if self.caveat():
            out += wrapped(self.caveat())
        # the nodes that matter: those costing a tenth of the worst node's loss or more
        ranked = self.nodes if top is None else self.nodes[:top]
        nodes = [it for it in ranked if it.get("relevant", True)] or ranked[:1]
        kind = "nodes" if self.node_type == "node" else f"{self.node_type} nodes"
        judged = "of " + ", ".join(repr(o) for o in self.outputs) if self.outputs else "of the model outputs"
        out.append(f"most sensitive {kind} ({self.metric} {judged} with only that node quantized, "
                   f"{self.samples} sample(s), worst first):")
        told = {}  # reason -> the node it was first given for
        for it in nodes:
            # a pair on a model output feeds no operator
            what = (f"{it['op_type']} operator" if it["kind"] == "operator" else
                    f"{it['kind']} into {it['op_type']}" if it["op_type"] else f"{it['kind']} on a model output")
            cause = f": {it['cause']}" if it["kind"] == "operator" and it.get("cause") else ""
            split = ""
            if it.get("split"):
                split = (f" (its weights alone {short(it['split']['weight'])}, its activations alone "
                         f"{short(it['split']['activation'])})")
            head = f"{it['rank']:>3}. {it['node']} ({what}) {short(it[self.metric])}{cause}{split}"
            out += wrapped(head, indent="  ", first="")
            if it.get("reason") and it["reason"] in told:  # two nodes reading one pair: one reason
                out += wrapped(f"why: the same as for {told[it['reason']]} above", indent="       ")
            elif it.get("reason"):
                told[it["reason"]] = it["node"]
                # cut short, a reason keeps its conclusion (what to do), which comes last
                # (the one reason's: not one input's of several)
                verdict = it["reason"].rpartition(" -> ")[2] if " -> " in it["reason"] else ""
                out += wrapped(f"why: {it['reason']}", indent="       ", max_lines=3,
                               ending=f" -> {verdict}" if verdict and "; " not in verdict else "")
        if len(nodes) < len(ranked):
            out.append(f"  ... {len(ranked) - len(nodes)} more of the top {len(ranked)} cost less than a tenth of the "
                       f"worst node's loss ({report or '--ptq-report=FILE.html'} lists them)")
        if self.fixes:
            out.append(f"fix to try ({self.terms}):")
            for k, f in enumerate(self.fixes, 1):
                out += wrapped(f"{k}. {f['text']}", indent="  ")
            if self.snippet and len(self.fixes) > 1:  # one fix is its own "all at once"
                out += wrapped(f"all at once: {self.snippet}", indent="  ")
            out += ["  " + line for line in self.producer_terms]  # one of the fixes' lines
        return out  # the warnings are the caller's to print: once per model, passing or not


def diagnose(engine, sensitivity, verdict, top=10, outputs=None, asked=None):
    """The :class:`Diagnosis` of ``engine``'s model from its ``verdict`` and ``sensitivity``
    ranking (any node type): the top ``top`` nodes' statistics are gathered in one sweep over
    the ranking's samples, and an operator's weights and activations are scored apart.
    ``asked``: the node type the caller wanted ranked, where the verdict made it rank another."""
    qm = engine.qmodel
    metric = sensitivity.metrics[0]
    m = get_metric(metric)
    # an entry with no values compared (it changes only outputs holding none) has nothing to explain
    names = [n for n in sensitivity if "no_values" not in sensitivity.details.get(n, {})][:top]
    inputs = {n: _calibration_inputs(qm, sensitivity.node_type, n) for n in names}
    calib = list(dict.fromkeys(c for cs in inputs.values() for c in cs))
    dist, boxes = collect(engine, calib, calib, data_num=sensitivity.samples, skip_unboxable=True) if calib \
        else ({}, {})
    specs = parse_outputs(None if outputs is None else list(outputs), engine)
    split, alone = scored_inputs(engine, names, inputs, m, specs, range(sensitivity.samples)) \
        if sensitivity.node_type == "node" else ({}, {})
    nodes = [_node(qm, sensitivity, k + 1, n, inputs[n], dist, boxes, split.get(n), metric, alone)
             for k, n in enumerate(names)]
    matter = relevant(nodes)
    for it in nodes:
        it["relevant"] = it in matter
    fixes, settings, snippet, terms, choices = _fixes(qm, matter, verdict.source, engine.float_model)
    own = producer_advice(engine, choices) if qm.made_by.key != "modelopt" else []
    told = engine.warnings + blind_warnings(engine, specs, metric)
    return Diagnosis(model=qm.source, producer=qm.made_by.label, producer_key=qm.made_by.key, format=qm.format,
                     metric=metric, node_type=sensitivity.node_type, samples=sensitivity.samples,
                     verdict=verdict.to_dict(), nodes=nodes, fixes=fixes, settings=settings, snippet=snippet,
                     terms=terms, warnings=[warning(w, _stages_command(engine)) for w in told], producer_terms=own,
                     outputs=list(outputs or []), asked_type=asked or sensitivity.node_type)


def warning(text, stages="ptq-debug stages FLOAT_MODEL CALIBRATED_MODEL DATA"):
    """``{text, fix}`` of an engine warning: the fix it implies where its sentence does not
    name one. ``stages``: the stage comparison's command, with the model's own paths."""
    for start, fix in _WARNING_FIXES.items():
        if text.startswith(start):
            return {"text": text, "fix": fix.format(stages=stages)}
    return {"text": text, "fix": ""}


def _stages_command(engine):
    import shlex

    float_model = engine.float_model if isinstance(engine.float_model, (str, Path)) else "FLOAT_MODEL"
    data = getattr(engine.data, "where", None) or "DATA"
    return shlex.join(["ptq-debug", "stages", str(float_model), str(engine.qmodel.source), str(data)])


def _calibration_inputs(qm, node_type, name):
    names = qm.quantizing(name) if node_type == "node" else [name]
    return [c for c in names if qm.calibration[c].role != "bias"]


def scored_inputs(engine, names, inputs, m, specs, indices):
    """``({operator: {"weight": value, "activation": value}}, {calibration node: value})``:
    of the operators ``names`` (``inputs``: their calibration inputs), those that have both
    with only their weight inputs, then only their activation inputs quantized; and each
    quantizer alone of an operator quantized by several of a kind (which of them explains it),
    all scored in ``m`` on ``specs`` in one pass over the samples ``indices``."""
    qm = engine.qmodel
    configs = {}
    for n in names:
        # a dynamic quantizer is an activation's
        by_kind = {k: engine.gated([c for c in inputs[n] if (qm.calibration[c].is_activation if k == "activation"
                                                             else qm.calibration[c].kind == k)])
                   for k in ("weight", "activation")}
        if all(by_kind.values()):
            configs.update({f"{n}\0{k}": v for k, v in by_kind.items()})
        for gated in by_kind.values():  # one of a kind is the kind's own figure already
            if len(gated) > 1:
                configs.update({f"\0{c}": [c] for c in gated})
    if not configs:
        return {}, {}
    scored = rank_configs(engine, configs, [m], specs, list(indices), "node", lambda _: {}, "operator inputs", False)
    split, alone = {}, {}
    for label, values in scored.items():
        n, k = label.split("\0")
        if n:
            split.setdefault(n, {})[k] = values[m.name]
        else:
            alone[k] = values[m.name]
    return split, alone


def _node(qm, sens, rank, name, calib, dist, boxes, split, metric, alone):
    value = sens[name][metric]
    bad = badness(metric, value)
    kind = KIND_WORDS[sens.node_type]
    op_type = ("Q/DQ" if name in qm.unowned else qm.normal[name].op_type) if sens.node_type == "node" else ", ".join(
        dict.fromkeys(qm.normal[n].op_type for n in qm.counts_for(name)))  # a chain's earlier pair: its readers
    ins = []
    for c in calib:
        cn = qm.calibration[c]
        d = dist.get(c)
        if d is None:
            continue
        tries, reasons = advise(d, boxes.get(c))
        if c in alone:
            reasons.insert(0, f"alone {short(alone[c])}")
        ins.append({"node": c, "kind": cn.kind, "tensor": qm.shown_name(cn.input), "granularity": cn.granularity,
                    "bit": cn.bit, "try": tries, "reason": "; ".join(reasons), "alone": alone.get(c)})
    cause, chosen = explaining_inputs(ins, split, metric)
    tries = list(dict.fromkeys(t for i in chosen for t in i["try"]))
    reason = "; ".join((f"{i['kind']} {i['node']} ({i['granularity']} {i['bit']}-bit): " if sens.node_type == "node"
                        else f"{i['granularity']} {i['bit']}-bit: ") + i["reason"] for i in chosen[:2])
    tries, severe = float_first(metric, bad, tries)
    if severe:
        reason = severe_reason(qm, metric, name, value) + "; " + reason
    return {"rank": rank, "node": name, "kind": kind, "op_type": op_type, metric: value, "badness": bad,
            "cause": cause, "split": split, "reason": reason, "try": tries or ["int16", "keep in float"],
            "inputs": ins, "chosen": [i["node"] for i in chosen]}


def explaining_inputs(ins, split, metric):
    """``(cause, chosen)`` of an operator whose calibration inputs are ``ins`` (dicts with
    ``kind``, ``try`` and ``alone``, the input's figure quantized alone or None) and ``split``
    its figures with only its weights or only its activations quantized (see
    :func:`scored_inputs`; None where it has one kind): the kind that costs it (weight,
    activation, both) and the inputs that explain it, those of that kind, the worst alone
    first (where scored), then the worst-read, less those costing little beside the worst."""
    if split:
        bw, ba = badness(metric, split["weight"]), badness(metric, split["activation"])
        cause = "weight" if bw >= DOMINANT * ba else "activation" if ba >= DOMINANT * bw else "both"
    else:
        kinds = {i["kind"] for i in ins}
        cause = kinds.pop() if len(kinds) == 1 else ("both" if kinds else None)
    chosen = [i for i in ins if cause in (i["kind"], "both")] or list(ins)
    chosen.sort(key=lambda i: (-badness(metric, i["alone"]) if i["alone"] is not None else 0.0,
                               i["try"][:1] in (["int16"], ["keep in float"])))
    scored = [badness(metric, i["alone"]) for i in chosen if i["alone"] is not None]
    if scored and max(scored) > 0:  # those that cost little alone beside the worst explain nothing
        chosen = [i for i in chosen if i["alone"] is None or badness(metric, i["alone"]) >= RELEVANT * max(scored)]
    return cause, chosen


def _names(names, limit=4):
    names = list(dict.fromkeys(names))
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _fixes(qm, relevant, source, float_model=None):
    """``(fixes, settings, snippet, terms, choices)`` for the relevant nodes, the verdict's kind
    first; ``choices``: the remedy each fix names per calibration node (``{node: "float" |
    "int16" | "per-channel"}``; 16 bit for a node to recalibrate, which no quantizer takes per
    node). ``float_model`` (path or ModelProto): names a producer's own notes as it names nodes."""
    groups = {"per-channel": [], "int16": [], "float": [], "recalibrate": [], "activation per-channel": [],
              "weight scale": []}
    for it in relevant:
        if it["try"][0] == "keep in float":
            groups["float"] += it["chosen"]
            continue
        for name in it["chosen"]:
            i = next(x for x in it["inputs"] if x["node"] == name)
            first = i["try"][0]
            if first == "per-channel" and i["kind"] == "weight":
                groups["per-channel"].append(name)
            elif first == "per-channel":
                groups["activation per-channel"].append(name)
            elif first == "recalibrate":
                groups["weight scale" if i["kind"] == "weight" else "recalibrate"].append(name)
            elif first == "keep in float":
                groups["float"].append(name)
            else:
                groups["int16"].append(name)
    groups = {k: list(dict.fromkeys(v)) for k, v in groups.items()}
    # a node kept in float needs no other remedy
    for k in ("per-channel", "int16", "recalibrate", "activation per-channel", "weight scale"):
        groups[k] = [n for n in groups[k] if n not in groups["float"]]
    modelopt = qm.made_by.key == "modelopt"
    int16 = groups["int16"] + groups["activation per-channel"]
    if modelopt:  # Model Optimizer's int8 mode has no 16-bit override: those nodes stay in float
        groups["float"] += int16
        int16 = []
    per_channel = bool(groups["per-channel"])
    if modelopt:
        # Model Optimizer's own exclusion (the readers of a pair, not quantize_static's producer
        # and readers of a tensor), from its terms: the fix, its note and the snippet alike
        kept, notes, failed = _modelopt_kept(qm, groups["float"], float_model)
        settings = {**kept, "quantizer": MODELOPT_QUANTIZE}
    else:
        choices = {**{n: "float" for n in groups["float"]}, **{n: "int16" for n in int16}}
        ort = onnxruntime_settings(qm, "mixed", list(choices), choices=choices) if choices else {
            "nodes_to_exclude": [], "TensorQuantOverrides": {}}
        settings = {"nodes_to_exclude": ort["nodes_to_exclude"], "TensorQuantOverrides": ort["TensorQuantOverrides"],
                    "quantizer": quantizer_call(qm)}
        if per_channel:
            settings["per_channel"] = True
    fixes = []
    if per_channel:
        what = MODELOPT_PER_CHANNEL if modelopt else per_channel_weights(qm)
        fixes.append({"kind": "weight", "nodes": groups["per-channel"], "short": "per-channel weights",
                      "text": f"per-channel weights ({what}): {_names(groups['per-channel'])} "
                              f"{_verb(groups['per-channel'], 'loses', 'lose')} channels to a per-tensor scale"})
    if groups["activation per-channel"] and not modelopt:
        fixes.append({"kind": "activation", "nodes": groups["activation per-channel"], "short": "int16 activations",
                      "text": f"{_names(groups['activation per-channel'])} "
                              f"{_verb(groups['activation per-channel'], 'has', 'have')} outlier channels under a "
                              "per-tensor "
                              "scale and onnxruntime cannot quantize activations per channel: raise them to 16 bit ("
                              + _overrides_text(qm, groups["activation per-channel"]) + "), or equalise the channel "
                              "ranges in the model"})
    if groups["recalibrate"]:
        fixes.append({"kind": "activation", "nodes": groups["recalibrate"], "short": "recalibrate",
                      "text": f"{_names(groups['recalibrate'])} {_verb(groups['recalibrate'], 'clips', 'clip')} values "
                              "outside the calibrated range on the samples ranked: the range was set on narrower "
                              "data than these, or by a method that cuts the tail; calibrate again on samples like "
                              "these, with "
                              + ("calibration_method='max' (modelopt.onnx.quantization.quantize)" if modelopt
                                 else "calibrate_method=CalibrationMethod.MinMax")
                              + " to keep every value" + ("" if modelopt else ", or raise them to 16 bit")})
    if groups["weight scale"]:
        fixes.append({"kind": "weight", "nodes": groups["weight scale"], "short": "weight scales",
                      "text": f"the scale of {_names(groups['weight scale'])} clips a large share of "
                              f"{'its' if len(groups['weight scale']) == 1 else 'their'} weights: re-quantize with "
                              "scales computed from the weights' range (every quantizer's MinMax default for weights), "
                              "or check that the float model is the one that was quantized"})
    plain16 = [n for n in groups["int16"]]
    if plain16 and not modelopt:
        kinds = {qm.calibration[n].kind for n in plain16}
        reasons = [i["reason"] for it in relevant for i in it["inputs"] if i["node"] in plain16]
        why = ("sensitive although well shaped" if all("simply sensitive" in r for r in reasons)
               else _verb(plain16, "its grid is too coarse for it", "their grid is too coarse for them")
               + " (see why above)")
        fixes.append({"kind": kinds.pop() if len(kinds) == 1 else "", "nodes": plain16, "short": "16-bit tensors",
                      "text": f"raise {_names(plain16)} to 16 bit ({_overrides_text(qm, plain16)}): {why}"})
    if groups["float"]:
        if modelopt:
            how = modelopt_call(settings) or f"Model Optimizer's nodes_to_exclude cannot be named ({failed})"
        else:
            kept = onnxruntime_settings(qm, "float", groups["float"])
            how = f"{quantizer_call(qm)}(..., nodes_to_exclude={kept['nodes_to_exclude']!r})"
            notes = kept.get("notes", ())
        # where the exclusion does otherwise than the simulation (a requantize chain's later pair
        # takes its earlier ones): the note of the terms the fix is written in, as the remedy prints it
        fixes.append({"kind": "", "nodes": groups["float"], "short": "keep nodes in float",
                      "text": f"keep {_names(groups['float'])} in float: {how}" + "".join(f"; note: {n}"
                                                                                       for n in notes)})
    # the verdict's kind first: fixing the other kind would not move the output much
    fixes.sort(key=lambda f: f["kind"] != source and not (source == "both" and f["kind"]))
    terms = ("NVIDIA Model Optimizer" if modelopt else
             f"onnxruntime {quantizer_call(qm)} on the float model; {qm.made_by.label}'s own terms follow them"
             if qm.made_by.key in PRODUCERS else f"onnxruntime {quantizer_call(qm)}")
    choices = {**dict.fromkeys(groups["per-channel"], "per-channel"),
               **dict.fromkeys(groups["int16"] + groups["activation per-channel"] + groups["recalibrate"], "int16"),
               **dict.fromkeys(groups["float"], "float")}
    call = modelopt_call(settings) if modelopt else snippet(settings)
    return fixes, settings, call, terms, choices


def _modelopt_kept(qm, nodes, float_model):
    """``(settings, notes, why not)``: Model Optimizer's settings keeping ``nodes`` in float and
    its terms' notes on them, or none and the sentence saying why they cannot be named."""
    if not nodes:
        return {}, [], ""
    try:
        kept, notes = kept_in_float(qm, nodes, float_model)
    except PTQError as exc:
        return {}, [], str(exc)
    return {k: v for k, v in kept.items() if v}, notes, ""


def _verb(names, one, many):
    return one if len(names) == 1 else many


def _overrides_text(qm, names):
    # the remedy's own settings: a requantize chain's later pair is raised by a convert, not
    # by a type on the whole tensor
    tensors = onnxruntime_settings(qm, "int16", names)["TensorQuantOverrides"]
    if not tensors:  # a chain of three pairs, a moved weight's channels spread over axes: no entry writes it
        return "which TensorQuantOverrides cannot write alone: the remedy search simulates it"
    shown = list(tensors.items())[:2]
    body = ", ".join(f"{t!r}: [{', '.join(map(override_text, entries))}]" for t, entries in shown)
    more = ", ..." if len(tensors) > 2 else ""
    return f"extra_options={{'TensorQuantOverrides': {{{body}{more}}}}}"

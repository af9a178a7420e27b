"""Whose loss is it: weights, activations, or both? Three configs on every sample.

Quantizing only the weights, only the activations, and everything costs three passes per
sample, so the verdict is computed on every calibration sample (and the held-out ones when
given), whatever number of samples the rankings used: a verdict from one sample can be
wrong (on a text recogniser, sample 0 says weights-only 0.968 while all five samples say
0.73).

The rule, with ``loss = 1 - cosine`` (for other metrics see :func:`badness`):

* everything quantized loses at most ``CLOSE``: **neither**, the model is close to float;
* one kind alone loses at least ``DOMINANT`` times what the other loses alone: **that kind**;
* otherwise **both**: each alone loses a comparable part; fix the worst nodes of each.

The sentence always carries the three figures, so it cannot contradict its table.
"""

from __future__ import annotations

import dataclasses
import math

from .curves import configs_from
from .data import load_data
from .metrics import Pooled, Reference, Scratch, get_metric
from .progress import Progress
from .results import JsonResult
from .tables import short

CLOSE = 1e-3  # loss (1 - cosine) with everything quantized under which the model is close to float
DOMINANT = 2.0  # one kind explains the loss when its own loss is this many times the other's
WEIGHT, ACTIVATION, ALL = "weight only", "activation only", "all quantized"
SEVERE = 0.1  # loss (1 - cosine) of one node quantized alone beyond which it should stay in float
# a node matters when it costs at least this share of the worst node's: the others would not
# move the output if fixed
RELEVANT = 0.1
# ops that turn a finite input rounded to 0 (or below it) into Inf or NaN: what they read there,
# and at which input
POLES = {"Sqrt": ("a value rounded to 0 or below", 0), "Reciprocal": ("a value rounded to 0", 0),
         "Div": ("a divisor rounded to 0", 1), "Log": ("a value rounded to 0 or below", 0),
         "Pow": ("a base rounded to 0 or below", 0)}


def badness(metric, value):
    """A non-negative "how far from float" for any metric: 1 - value for a similarity of at
    most 1 (cosine, correlation), the noise-to-signal power ratio for SQNR, the value itself
    for error metrics; infinite for NaN, the metric of outputs gone non-finite (the engine
    refuses a model whose float or bypassed outputs are), NaN for None (not measured)."""
    if value is None:
        return math.nan
    if isinstance(value, float) and math.isnan(value):
        return math.inf
    if get_metric(metric).unit:
        return max(0.0, 1.0 - value)
    if metric == "sqnr":
        return 0.0 if value == math.inf else 10 ** (-value / 10)
    return float(value)


def relevant(items):
    """The items (dicts with a "badness") that matter: those whose outputs went non-finite,
    and those costing at least :data:`RELEVANT` of the worst finite loss, in their order."""
    worst = max((it["badness"] for it in items if math.isfinite(it["badness"])), default=0.0)
    return [it for it in items
            if it["badness"] == math.inf or (it["badness"] > 0 and it["badness"] >= RELEVANT * worst)]


def severe_reason(qm, metric, name, value):
    """The first reason for keeping node ``name`` (calibration or normal) in float: what
    quantizing it alone does to the outputs, and, where they went non-finite, the consumer
    that can make them so."""
    if not (isinstance(value, float) and math.isnan(value)):
        return f"quantizing it alone drops the output {metric} to {short(value)}"
    cause = pole_cause(qm, name)
    where = f": it feeds {cause} (finer steps near 0: int16)" if cause else " downstream"
    return f"quantizing it alone makes the model outputs non-finite (NaN or Inf){where}"


def pole_cause(qm, name):
    """"Log 'x', which turns a value rounded to 0 or below into Inf or NaN": the first normal
    node fed by ``name`` (or the normal node itself) that can, or ""."""
    pole = _pole(qm, name)
    return f"{pole.op_type} {pole.name!r}, which turns {POLES[pole.op_type][0]} into Inf or NaN" if pole else ""


def _pole(qm, name):
    """The first normal node fed by ``name`` (or the normal node itself) that reads it where
    a value rounded to 0 gives Inf or NaN, or None."""
    c = qm.calibration.get(name)
    reads = {o for dq in c.dq_nodes for o in dq.output} if c is not None else None
    for n in (c.consumers if c is not None else [name]):
        node = qm.normal.get(n)
        if node is None or node.op_type not in POLES:
            continue
        at = POLES[node.op_type][1]
        if reads is None or (len(node.inputs) > at and node.inputs[at] in reads):
            return node
    return None


def float_first(metric, bad, tries):
    """``(tries, severe)``: the remedies to try, "keep in float" first and once when quantizing
    the node alone costs the output more than SEVERE in cosine."""
    severe = get_metric(metric).unit and bad >= SEVERE
    return (list(dict.fromkeys(["keep in float", *tries])) if severe else tries), severe


@dataclasses.dataclass
class Verdict(JsonResult):
    """``values[dataset][config]``: the metric (worst output, samples pooled) of ``weight
    only``, ``activation only`` and ``all quantized`` on ``calibration`` (every sample) and
    ``heldout``; ``source``: weight, activation, both or neither, decided on the held-out data
    when given, else on the calibration data; ``text``: the sentence with its figures;
    ``disagreement``: a sentence when the ranking's samples alone would decide otherwise;
    ``rewrite``: one when the quantizer's rewrite of the graph loses more on its own, which the
    three configs (measured against the rewritten graph) cannot show."""

    metric: str
    source: str
    text: str
    rule: str
    values: dict
    samples: dict
    decided_on: str
    disagreement: str | None = None
    ranking: dict | None = None  # the three values on the ranking's samples only
    rewrite: str | None = None

    @property
    def figures(self):
        """The three values the verdict was decided on."""
        return self.values[self.decided_on]


def score(engine, data, specs, metric, configs, count=None, bar=None, apart=()):
    """``({label: value}, {label: value} or None)``: each config on every sample of ``data``
    (worst output, pooled), and on the samples ``apart`` (indices among them) pooled apart in
    the same pass, None without them; ``data`` None: the engine's own first ``count`` samples
    (default all), whose float references the engine caches. ``bar``: a Progress advanced a
    sample."""
    pools = {label: Pooled(metric, specs) for label in configs}
    apart = set(apart)
    pools_apart = {label: Pooled(metric, specs) for label in configs} if apart else None
    tensors = list(dict.fromkeys(s.tensor for s in specs))
    own = data is None
    scratch = Scratch()
    for i in range((count or len(engine.data)) if own else len(data)):
        if own:
            ref, outs = engine.reference(i, tensors), engine.run_many(i, [(q, ()) for q in configs.values()], tensors)
        else:  # held-out samples: the float run first, from the same prefix
            outs = engine.run_many(data.sample(i), [((), ())] + [(q, ()) for q in configs.values()], tensors)
            ref = next(outs)
        prepared = Reference.of_outputs(specs, ref, scratch)
        for label, out in zip(configs, outs):
            pools[label].add_prepared(prepared, out)
            if i in apart:
                pools_apart[label].add_prepared(prepared, out)
        if bar is not None:
            bar.advance()
    # every pool compared the same references: outputs holding no values are refused at the first
    judged = engine.data if own else data
    return ({label: pool.judged(judged) for label, pool in pools.items()},
            None if pools_apart is None else {label: pool.value() for label, pool in pools_apart.items()})


def decide(values, metric, weights_known=True, both_step=None):
    """``(source, sentence)`` from ``{weight only, activation only, all quantized: value}``;
    ``both_step``: what else to do where both kinds cause the loss, in the words of the face
    that shows the sentence (None: nothing else)."""
    bw, ba, ball = (badness(metric, values[k]) for k in (WEIGHT, ACTIVATION, ALL))
    figures = (f"{metric} {short(values[WEIGHT])} with weights only quantized, {short(values[ACTIVATION])} with "
               f"activations only, {short(values[ALL])} with everything")
    if ball <= CLOSE:
        source, text = "neither", f"the quantized model stays close to float ({figures})"
    elif bw >= DOMINANT * ba:
        source, text = "weight", f"weight quantization causes most of the loss ({figures})"
    elif ba >= DOMINANT * bw:
        source, text = "activation", f"activation quantization causes most of the loss ({figures})"
    else:
        source = "both"
        text = (f"weights and activations each cause a comparable part of the loss ({figures}): fix the worst "
                "nodes of each" + (f", or {both_step}" if both_step else ""))
    if not weights_known:
        text += f"; {WEIGHTS_UNSEEN}"
    return source, text


# Said beside a verdict whose weights only figure cannot show weight error.
WEIGHTS_UNSEEN = ("but the weights are stored quantized or rounded onto their grid and no float model was given, so "
                  "weights only cannot show weight error, and every figure is against weights already quantized: give "
                  "the float model to measure them")


def rule(metric="cosine-similarity"):
    """The rule :func:`decide` applies, in words, with ``metric``'s loss (:func:`badness`)."""
    m = get_metric(metric)
    loss = (f"1 - {m.name}" if m.unit else "the noise-to-signal power ratio" if m.name == "sqnr"
            else f"the {m.name} itself")
    return (f"loss = {loss}; everything quantized losing at most {CLOSE:g}: neither; one kind alone losing at "
            f"least {DOMINANT:g}x what the other loses alone: that kind; otherwise both")


def _rewrite_note(engine, m, everything):
    """Where the quantizer's rewrite of the graph (the engine's float-equivalence check found
    it) loses more cosine on its own than quantizing does against the rewritten graph: the
    three configs measure against that graph, so they cannot see it; said after them."""
    rewrite = engine.rewrite
    if rewrite is None or m.name != "cosine-similarity":
        return None
    lost = 1.0 - rewrite["cosine"]
    if lost <= CLOSE or lost < badness(m.name, everything):
        return None
    return (f"but the quantizer's rewrite of the graph loses more on its own (output cosine {rewrite['cosine']:.4f} "
            f"between the float model and this model with every pair bypassed, on output {rewrite['output']!r}), "
            f"which these figures measure against: fix it first ({rewrite['changes']})")


def three_configs(engine, specs, metric="cosine-similarity", heldout=None, ranking_samples=None, data=None,
                  count=None, progress=False, both_step=None):
    """The :class:`Verdict` of ``engine`` on every sample of ``data`` (default: the first
    ``count`` of the engine's, default all) and of ``heldout``; with ``ranking_samples`` (the
    samples a ranking used: how many, the first of ``data``, or the engine's indices), says
    when those samples alone would decide otherwise. ``progress``: a bar over the samples.
    ``both_step``: see :func:`decide`."""
    m = get_metric(metric)
    configs = {**configs_from(engine, ["weight", "activation"]), ALL: list(engine.calib_names)}
    # a weight already on its grid (aimet, QAT exports) bypasses to itself: only a float model shows its error
    # (a model with no weight pairs at all has no weight error to miss: nothing to say of it)
    weights = [c for c in engine.qmodel.calibration.values() if c.kind == "weight"]
    weights_known = not weights or any(c.bypassable and (not c.on_grid or c.float_weight is not None)
                                       for c in weights)
    own = data is None
    samples = {"calibration": (count or len(engine.data)) if own else len(data)}
    n = samples["calibration"]
    chosen = None if ranking_samples is None or isinstance(ranking_samples, int) else list(ranking_samples)
    if chosen is not None:
        ranking_samples = len(chosen)
    # the ranking's samples pooled apart in the same pass (a second pass over them was silent)
    apart = () if ranking_samples is None or ranking_samples >= n else (
        chosen if chosen is not None and own else range(ranking_samples))
    held = None if heldout is None else load_data(heldout, engine.qmodel, role="held-out", calibration=engine.data)
    with Progress(n + (0 if held is None else len(held)), "weights, activations, both", enabled=progress) as bar:
        values, few = score(engine, data, specs, m, configs, count, bar=bar, apart=apart)
        values = {"calibration": values}
        if held is not None:
            values["heldout"], samples["heldout"] = score(engine, held, specs, m, configs, bar=bar)[0], len(held)
    decided_on = "heldout" if "heldout" in values else "calibration"
    source, text = decide(values[decided_on], m.name, weights_known, both_step)
    if decided_on == "heldout":
        text += f" on {samples['heldout']} held-out sample(s)"
    rewrite = _rewrite_note(engine, m, values[decided_on][ALL])
    verdict = Verdict(metric=m.name, source=source, text=text + (f"; {rewrite}" if rewrite else ""),
                      rule=rule(m.name), values=values, samples=samples, decided_on=decided_on, rewrite=rewrite)
    if few is not None:
        verdict.ranking = few
        alone, _ = decide(few, m.name, weights_known)
        if alone != source:
            verdict.disagreement = (
                f"on the {ranking_samples} sample(s) every node was ranked on, the verdict would be {alone!r} (weights only "
                f"{short(few[WEIGHT])}, activations only {short(few[ACTIVATION])}); on all {n} samples "
                f"weights only is {short(values['calibration'][WEIGHT])} and activations only "
                f"{short(values['calibration'][ACTIVATION])}: trust the verdict, and rank on more samples")
    return verdict

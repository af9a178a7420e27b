"""Rankings on many samples in bounded time: rank on the samples a time budget allows,
then confirm the top of each ranking on every sample.

Ranking every node costs one run per node per sample, so on 32 samples it costs 32 times
one sample. The order of the top nodes is what a user acts on, and it is settled on a few
samples far more often than the tail's. So :func:`screen` scores every node on the first
sample, measures what that took, scores as many further samples as fit in the budget
(never fewer than ``min_samples``, but see narrowing below), spread evenly over the data,
and then scores the top ``confirm`` nodes of each ranking on the remaining samples. The confirmed nodes' values are
exact over every sample (pooled as any ranking pools them) and they are re-ordered by them;
the rest keep their values on the screening samples. The bootstrap of the confirmed nodes'
per-sample values (:func:`~pytest_ptq.confidence.ranking_confidence`) says whether their top
order holds.

Where the budget chose 4 samples or more, it is spent narrowing, where that costs no more
runs: every node on half of them, the top quarter of each ranking (at least 3 times
``confirm`` nodes) on three times as many, the top ``confirm`` on all. A node's error is often made by a few samples of its own, which
few samples miss whichever they are. Simulated from every node's values on every sample
over 30 orders of the data, the top 10 this confirms held more of the loss of the all-sample
top 10 than every node on the budget's 6 samples did, in fewer runs: PP-OCRv4's recogniser
(32 samples) activations 0.879 against 0.877 of it on average, weights 0.978 against
0.956, in 0.77 of the runs; the classifier (96) 0.94 against 0.84 and 0.993 against 0.979,
in 0.90; the detector (48, not used to choose the shares) 0.917 against 0.877 and 0.966
against 0.936, in 0.79.
"""

from __future__ import annotations

import dataclasses
import math
import time

from .confidence import ranking_confidence
from .engine.sanity import spread
from .progress import Progress
from .results import inputs_of, read_from
from .params import KIND_WORDS
from .sensitivity import (Sensitivity, confirmed_text, describe, held_outputs, merge_scores, ranked, reached_outputs,
                          score_configs, targets_for)

# The default budget: what ranking DEFAULT_BUDGET_SAMPLES samples takes, measured on the
# first, and never more than DEFAULT_BUDGET_S. A budget in seconds alone ranked on more
# samples the faster the machine (the PP-OCRv4 recogniser: 7 of 32 samples in 60 s with one
# onnxruntime, 21 with a 3x faster one, and runall then cost 5.8x its one-sample run instead
# of 2.9x); counted in samples, a model ranks on about as many samples on any machine (the
# recogniser: 5 of 32, runall 2.45x its one-sample run; 7 and 3.07x with the time of 8).
DEFAULT_BUDGET_S = 60.0
DEFAULT_BUDGET_SAMPLES = 6
DEFAULT_CONFIRM = 10
# narrowing (module docstring): the share of each ranking scored on NARROW_MORE times the
# samples every node was, and never fewer nodes than NARROW_MIN times those confirmed
NARROW_SHARE = 0.25
NARROW_MORE = 3
NARROW_MIN = 3


@dataclasses.dataclass
class Screening:
    """How the rankings were computed: on ``samples`` of ``of`` samples (chosen for
    ``budget_s`` seconds, or all of them when ``budget_s`` is None), the top ``confirmed``
    of each (the most asked) to be re-scored on all ``of``; ``top[type]`` how many were,
    ``rescored[type]`` how many more were because their outputs held no values on the samples
    they were ranked on (both read from the rankings, :meth:`Sensitivity.rescored`: a type of
    fewer nodes than ``confirmed`` confirms fewer); ``confidence[type]`` is the bootstrap of the confirmed
    nodes (a :class:`~pytest_ptq.confidence.Confidence`), ``reordered[type]`` whether
    confirming changed their order, ``seconds`` what ranking and confirming took."""

    samples: int
    of: int
    budget_s: float | None
    confirmed: int
    seconds: float
    confidence: dict
    reordered: dict
    indices: tuple = ()  # the samples every node was scored on, spread over the data
    narrowed: dict = dataclasses.field(default_factory=dict)  # {type: nodes scored on narrowed_samples}
    narrowed_samples: int = 0
    held: int = 0  # the samples the data hold, where ``of`` are the first of them (data_num)
    top: dict = dataclasses.field(default_factory=dict)
    rescored: dict = dataclasses.field(default_factory=dict)

    def to_dict(self):
        return {"text": self.text(), "samples": self.samples, "of": self.of, "budget_s": self.budget_s, "confirmed": self.confirmed,
                "top": dict(self.top), "rescored": dict(self.rescored), "narrowed": dict(self.narrowed), "narrowed_samples": self.narrowed_samples,
                "seconds": round(self.seconds, 3), "reordered": dict(self.reordered),
                "confidence": {t: {"stable": c.stable, "top_k": c.top_k, "top_k_set_frequency": c.top_k_set_frequency,
                                   "message": c.message} for t, c in self.confidence.items()}}

    def text(self):
        """One sentence: how many samples ranked, how many the top was narrowed on and confirmed."""
        # a limit on the samples (data_num) said: "all 8" of 12 read as every sample there is
        pool = f"the first {self.of} of {self.held}" if self.held > self.of else f"all {self.of}"
        if self.samples >= self.of:
            return f"rankings on {pool} sample(s)"
        budget = f" (what a {self.budget_s:.3g} s budget allows)" if self.budget_s is not None else ""
        narrowed = (f", the top {' and '.join(f'{n} {KIND_WORDS[t]}' for t, n in self.narrowed.items())} nodes on "
                    f"{self.narrowed_samples}" if self.narrowed else "")
        return (f"rankings on {self.samples} of {pool.removeprefix('all ')} samples{budget}{narrowed}, "
                f"{confirmed_text(self.top, self.rescored, self.of)}")


def samples_within(budget_s, first_s, total, min_samples, confirm_share):
    """How many samples every node can be scored on within ``budget_s`` seconds, when one
    sample took ``first_s`` and the remaining samples still have to score a ``confirm_share``
    of the nodes: between ``min_samples`` and ``total``."""
    if total <= min_samples or first_s <= 0:
        return total
    # k samples of everything and (total - k) of the confirmed share fit in the budget
    k = (budget_s / first_s - total * confirm_share) / max(1e-9, 1 - confirm_share)
    return max(min_samples, min(total, math.floor(k)))


def screen(engine, node_types, metric_objs, specs, indices, budget_s=None, rank_samples=None,
           min_samples=2, confirm=None, progress=False):
    """``({node type: Sensitivity}, Screening)`` on the samples ``indices``.

    ``rank_samples``: how many samples every node is scored on (an int, or None to choose by
    ``budget_s`` seconds, never fewer than ``min_samples``; None: the time the first sample
    took times :data:`DEFAULT_BUDGET_SAMPLES`, at most :data:`DEFAULT_BUDGET_S`); the top
    ``confirm`` (default :data:`DEFAULT_CONFIRM`) nodes of each ranking are then scored on all of
    ``indices``, and where that is every node of each type, every node is ranked on all of them.
    Samples chosen by the budget are spent narrowing where it pays (module docstring), which
    scores every node on half of them. Rankings are worst first; the confirmed nodes come
    first, in their order over every sample, then the narrowed ones, each with
    ``details["samples"]``.
    """
    confirm = DEFAULT_CONFIRM if confirm is None else confirm
    start = time.perf_counter()
    configs = {(t, name): quantized for t in node_types for name, quantized in targets_for(engine, t).items()}
    total = len(indices)
    desc = f"sensitivity ({', '.join(node_types)})"
    # each config compiles a form of its own on a config-major engine: timing the first sample
    # apart compiled every form twice, and its time was mostly compiling; the budget counted
    # in samples is the same number of them, scored in one pass
    one_pass = engine.config_major and not (rank_samples is None and budget_s is not None)
    if one_pass and rank_samples is None:
        rank_samples = DEFAULT_BUDGET_SAMPLES
    counts = {t: sum(tt == t for tt, _ in configs) for t in node_types}
    confirmed_count = sum(min(confirm, n) for n in counts.values())  # runs per confirming sample
    # where every node of each type is among its top, confirming them is ranking them all
    small = all(n <= confirm for n in counts.values())
    planned = total if rank_samples is None or (one_pass and small) else min(total, rank_samples)
    # the total is a bound until the first sample is timed and the samples to rank are known:
    # a time left read from it was ten times the truth
    with Progress(planned * len(configs), desc, enabled=progress, tentative=not one_pass) as bar:
        run = _Scoring(engine, configs, metric_objs, specs, indices, bar)
        if one_pass:
            k, scores = max(1, planned), None
        else:
            scores = score_configs(engine, configs, metric_objs, specs, indices[:1], bar)
            first_s = time.perf_counter() - start
            if budget_s is None:
                budget_s = min(DEFAULT_BUDGET_S, DEFAULT_BUDGET_SAMPLES * first_s)
                # the default ranks on as many samples as its budget counts whatever confirming
                # costs (on 96 samples that left 2, whose top missed nodes the rest rank 3rd),
                # within its cap in seconds
                min_samples = max(min_samples, int(min(DEFAULT_BUDGET_SAMPLES, DEFAULT_BUDGET_S // max(first_s, 1e-9))))
            share = min(1.0, confirm * len(node_types) / max(1, len(configs)))
            k = max(1, min(total, rank_samples) if rank_samples is not None else total if small
                    else samples_within(budget_s, first_s, total, min_samples, share))
        keep = {t: min(n, max(NARROW_MIN * confirm, math.ceil(NARROW_SHARE * n))) for t, n in counts.items()}
        k, wide = _narrowing(k, total, sum(keep.values()), len(configs), confirmed_count) \
            if rank_samples is None and not one_pass else (k, k)
        narrowed = wide > k
        confirming = wide < total  # samples beyond the narrowing's: the top is scored on them too
        if k < total:
            # the bar now counts what is left for sure: the screening samples, the narrowing, the confirmation
            bar.total = (k * len(configs) + (wide - k) * (sum(keep.values()) if narrowed else len(configs))
                         + (total - wide) * confirmed_count)
        bar.tentative = False
        # spread over the data, the first included (scored already): the first k of data stored
        # in order (crops of one page) may all miss what the rest shows; the narrowing's
        # samples hold the screening's
        wider = [indices[j] for j in spread(total, wide)]
        chosen = [wider[j] for j in spread(wide, k)]
        held, screened = set(wider), set(chosen)
        others = [i for i in indices if i not in held]
        between = [i for i in wider if i not in screened]  # the narrowing's samples beyond the screening's
        rest = run.score(configs, chosen[0 if one_pass else 1:])
        scores = rest if one_pass else merge_scores(scores, rest)
        sens = {t: run.rank(t, {name: scores[(t, name)] for (tt, name) in configs if tt == t}, chosen)
                for t in node_types}
        near, narrower = _narrow(run, sens, scores, keep, chosen, between) if narrowed else ({}, {})
        layers = {t: [] for t in node_types}  # narrower rankings over the screening's, widest samples first
        for t, layer in narrower.items():
            if keep[t] < counts[t]:
                layers[t].append(layer)
            else:  # every node of the type: the whole ranking is on the wider samples
                sens[t] = layer
        top = {}
        if confirming:
            top = {t: list((layers[t] or [sens[t]])[-1])[:confirm] for t in node_types}
            chosen_configs = {(t, name): configs[(t, name)] for t in node_types for name in top[t]}
            rescore, nowhere = _rescored(run, sens, layers, scores, chosen_configs, near, between, others)
            scored_configs = {**chosen_configs, **rescore}
            more = run.score(scored_configs, others)
    confidence, reordered = {}, {}
    if confirming:
        confidence, reordered = _confirm(run, sens, layers, top, scores, scored_configs, more, nowhere,
                                         chosen + between + others)
    sens = {t: _layered(sens[t], layers[t][::-1], top[t]) if layers[t] else sens[t] for t in node_types}
    return sens, Screening(samples=k, of=total, budget_s=budget_s if rank_samples is None else None,
                           confirmed=confirm if confirming else 0, seconds=time.perf_counter() - start,
                           confidence=confidence, reordered=reordered, indices=tuple(chosen),
                           narrowed={t: n for t, n in keep.items() if n} if narrowed else {},
                           narrowed_samples=wide if narrowed else 0,
                           # what the rankings hold, not what was asked: the sentence says what was done
                           top={t: len(sens[t].confirmed) for t in node_types} if confirming else {},
                           rescored={t: len(sens[t].rescored()) for t in node_types} if confirming else {})


class _Scoring:
    """What a screening's steps score and rank with: ``configs`` (``{(type, name): calibration
    nodes quantized}``) of ``engine`` on the samples ``indices``, counted on ``bar``."""

    def __init__(self, engine, configs, metric_objs, specs, indices, bar):
        self.engine, self.configs, self.metric_objs, self.specs = engine, configs, metric_objs, specs
        self.indices, self.bar = indices, bar
        # a node is not run on a sample where the outputs it reaches hold no values: a run there
        # compares nothing of it (every sample but the first, timed for the budget as a whole)
        self.reaches = reached_outputs(engine.qmodel, configs, specs)

    def score(self, chosen, samples):
        """:func:`score_configs` of ``chosen`` (some of ``configs``) on ``samples``."""
        return score_configs(self.engine, chosen, self.metric_objs, self.specs, samples, self.bar, reaches=self.reaches)

    def rank(self, t, values, scored):
        """The ranking of type ``t`` from ``{name: states}`` over the samples ``scored`` (in the
        order scored), its per-sample values laid on ``indices``: a column is the same sample in
        every layer of the ranking, whichever order the samples were scored in."""
        qm, configs = self.engine.qmodel, self.configs
        return ranked(self.engine, values, self.metric_objs, self.specs, scored, t,
                      lambda name: describe(qm, name, t, configs[(t, name)]), {n: configs[(t, n)] for n in values},
                      columns=self.indices)


def _narrow(run, sens, scores, keep, chosen, between):
    """``(configs, {type: ranking})``: the top ``keep[type]`` of each screened ranking ``sens``,
    and their ranking on the samples ``between`` too; their states in ``scores`` get those
    samples (confirming adds the rest of the samples to them)."""
    near = {(t, name): run.configs[(t, name)] for t in sens for name in list(sens[t])[:keep[t]]}
    more = run.score(near, between)
    return near, {t: run.rank(t, _merged(near, t, scores, more), chosen + between) for t in sens}


def _rescored(run, sens, layers, scores, confirmed, near, between, others):
    """``(configs, nowhere)``: the nodes beside the ``confirmed`` top to score on the samples
    ``others`` too, and the labels of those whose outputs hold no values on any sample.

    A node that compared no values only because the outputs it reaches held none on the
    samples so far may on the rest: "no values on any sample" would be said of a few. Scoring
    it there runs it on no sample where its outputs hold none in float (:func:`score_configs`),
    so one holding none on any sample costs no run, and the float references it reads are
    those the confirmed top read. Those the narrowing left out (not among ``near``, those it
    scored) are scored on its samples ``between`` here."""
    unseen = {}
    for t, s in sens.items():
        latest = (layers[t] or [s])[-1]
        unseen.update({(t, n): run.configs[(t, n)] for n in s if (t, n) not in confirmed
                       and "no_values" in (latest if n in latest else s).details[n] and scores[(t, n)][0].empty()})
    nowhere = set()
    if unseen and run.engine.config_major:
        # there each config reads a sample's float reference itself, computed again where the
        # cache has no room: the outputs held on the rest, read once, leave those with none out
        later = set(held_outputs(run.engine, run.specs, others))
        wider = later | (set(held_outputs(run.engine, run.specs, between)) if between else set())
        # the narrowing's top were scored on its samples already: only the rest can show them values
        nowhere = {c for c in unseen if not set(run.reaches[c]) & (later if c in near else wider)}
        unseen = {c: q for c, q in unseen.items() if c not in nowhere}
    behind = {c: q for c, q in unseen.items() if between and c not in near}
    run.bar.total += len(behind) * len(between) + len(unseen) * len(others)
    if behind:
        merge_scores(scores, run.score(behind, between))
    return unseen, nowhere


def _confirm(run, sens, layers, top, scores, configs, more, nowhere, every):
    """``(confidence, reordered)`` per type, the ranking of the ``configs`` scored on the rest
    confirmed on the samples ``every`` (``scores`` merged with ``more`` on the rest) appended
    to ``layers``; the nodes ``nowhere`` (no values on any sample) listed in it with no figure."""
    confidence, reordered = {}, {}
    for t in sens:
        confirmed = run.rank(t, _merged(configs, t, scores, more), every)
        _no_values_anywhere(confirmed, [n for n in sens[t] if (t, n) in nowhere], [*layers[t], sens[t]])
        reordered[t] = [n for n in confirmed if n in top[t]] != top[t]
        if sum("no_values" not in confirmed.details[n] for n in confirmed) > 1:  # no figure: left out
            confidence[t] = ranking_confidence(confirmed, k=min(5, len(confirmed)), annotate=False)
        layers[t].append(confirmed)
    return confidence, reordered


def _merged(chosen, t, scores, more):
    """``{name: states}`` of the nodes of type ``t`` among ``chosen`` (``{(type, name): ...}``),
    their ``scores`` on earlier samples merged with ``more`` on later ones."""
    names = [name for tt, name in chosen if tt == t]
    return merge_scores({n: scores[(t, n)] for n in names}, {n: more[(t, n)] for n in names})


def _narrowing(k, total, kept, nodes, confirmed):
    """``(samples every node is scored on, samples the ``kept`` top nodes are)`` for a budget
    of ``k`` samples of all ``nodes``, ``confirmed`` of them then scored on every sample
    (module docstring); ``(k, k)`` where half the budget would leave a node a single sample,
    narrowing reaches every sample (confirming covers that), or it would cost more runs than
    every node on the ``k`` (types of a few dozen nodes, whose top quarter is held up by the
    ``NARROW_MIN`` floor)."""
    first = math.ceil(k / 2)
    wide = NARROW_MORE * first
    narrowed = first * nodes + (wide - first) * kept + (total - wide) * confirmed
    if first < 2 or wide >= total or narrowed > k * nodes + (total - k) * confirmed:
        return k, k
    return first, wide


def _no_values_anywhere(confirmed, names, earlier):
    """Add to the ``confirmed`` ranking the nodes ``names``, whose outputs held no values on
    any of its samples (the float references said so on those they were not scored on), with
    their entry in the first of the ``earlier`` rankings holding them: no figure, listed last."""
    for name in names:
        source = next(r for r in earlier if name in r)
        dict.__setitem__(confirmed, name, source[name])
        confirmed.details[name] = {k: v for k, v in source.details[name].items() if k != "scored_samples"}


def _layered(screened, layers, top):
    """``screened`` (every node on its samples) with the nodes of each narrower ranking in
    ``layers`` (most samples first: the confirmed, then the narrowed) first, in that
    ranking's order and with its values; each entry's ``details["samples"]`` says which it has.
    Entries with no figure (``details["no_values"]``) come last, whichever ranking holds them.
    ``top``: the nodes confirmed as the top of the ranking (the confirmed ranking holds those
    re-scored because their outputs held no values on the samples they were ranked on too)."""
    out = read_from(Sensitivity(node_type=screened.node_type, metrics=screened.metrics, outputs=screened.outputs,
                                samples=screened.samples, model=screened.model,
                                confirmed=[n for n in layers[0] if n in top], confirmed_samples=layers[0].samples,
                                sample_indices=screened.sample_indices), inputs_of(screened))
    for unmeasured in (False, True):  # a confirmed entry may have none: confirming scored it on the rest
        for source in [*layers, screened]:
            for name, values in source.items():
                if name not in out and ("no_values" in source.details[name]) == unmeasured:
                    dict.__setitem__(out, name, values)
                    out.details[name] = {**source.details[name], "samples": source.samples}
    return out

"""The remedy search's entry point: arguments, data sets, the search, the figures."""

from __future__ import annotations

from pathlib import Path

from .. import guard, params
from ..engine import engine_for
from ..errors import FLOAT_MODEL_OPTION, PTQError, unknown
from ..outputs import blind_warnings
from ..progress import Progress
from ..results import read_from
from ..sensitivity import sample_indices
from ..stages import simulation_warnings
from .alternatives import alternatives_for, menus_for
from .biases import with_biases
from .objective import objective_for
from .parts import layout, with_alternatives
from .plot import plot_remedy
from .producer_check import PACKAGE, PYTHON_ENV, check_producer_terms, producer_python
from .producer_terms import producer_terms
from .ranking import given_ranking, mixed_moves, rank
from .requantize import judged, measure, score_parts, unreproducible
from .result import DEFAULT_COSTS, MIXED, REMEDIES, WHAT, Remedy
from .clock import Clock, OutOfTime
from .scoring import Scorer, cost_of, pooled
from .strategy import Search
from .terms import onnxruntime_settings

SEARCHES = ("refine", "greedy")


def costs_for(remedy, costs):
    """``{kind: cost}`` of a search: one kind at cost 1 for a single remedy; for ``mixed`` the
    kinds given (their menu) or :data:`DEFAULT_COSTS`, ``"nodes"`` counting every kind 1."""
    if remedy != MIXED:
        if costs is not None:  # taken in silence, a price list would seem to have been used
            raise PTQError(f"costs price the kinds of a mixed search; give remedy='mixed' (--remedy mixed) with them, "
                           f"or leave them out of a {remedy!r} search")
        return {remedy: 1.0}
    if costs is None:
        return dict(DEFAULT_COSTS)
    if costs == "nodes":
        return {k: 1.0 for k in REMEDIES}
    if not isinstance(costs, dict) or not costs:
        raise PTQError(f"costs must be a mapping {{kind: cost}} such as {DEFAULT_COSTS} or 'nodes', got {costs!r}")
    out = {}
    for kind, cost in costs.items():
        if kind not in REMEDIES:
            raise unknown("remedy", kind, REMEDIES)
        out[kind] = params.positive(cost, f"the cost of {kind!r}")
    return {k: out[k] for k in REMEDIES if k in out}


def suggest_remedy(model_or_file, calibrated_data=None, target=None, metric="cosine-similarity",
                   remedy="float", output_node=None, data_num=None, float_model=None, budget=None,
                   candidates=None, ranking=None, full_curve=False, per_channel_activations=False,
                   requantize_check=True, save_dir=None, progress=None, verbose=False, heldout=None,
                   evaluate=None, min_ratio=None, costs=None, search="refine"):
    """The cheapest set of nodes to remedy so that the objective meets its target on data the
    search did not choose on. Returns :class:`Remedy`.

    The search scores sets on calibration samples (the first ``data_num``); a set is
    accepted only when it meets the target on ``heldout`` data (a folder, ``.npz`` or
    mapping like ``calibrated_data``) or, without it, on calibration samples it did not
    choose on (those beyond ``data_num``, else every third). The objective is ``metric``
    (worst output, samples pooled) against ``target`` (default 0.99 cosine; or per output,
    ``{output or slice: value, "": default}`` as the output checks take it: every output
    must meet its own, and the targets name the outputs compared; an output named
    ``default`` is ``default=default``), or with
    ``evaluate(run, data) -> float`` (the accuracy check's contract) the task score against
    ``target`` or ``min_ratio`` x the float score (default 0.99 x).

    ``remedy``: "float", "int16", "per-channel", or "mixed" (a kind per node among the keys
    of ``costs``: ``{kind: cost}``, default :data:`DEFAULT_COSTS`, or "nodes" for the fewest
    non-int8 nodes). ``search``: "refine" (greedy, then local moves) or "greedy" (greedy on
    the ranking, then pruning). ``budget``: seconds for the search; when it ends the best
    result so far is returned (``budget_exhausted``); the final figures and the re-quantized
    check come after it. ``candidates``: restrict to these calibration or normal nodes
    (default: every node that the quantizer which made the model can remedy in its own terms).
    ``ranking``: a :class:`Sensitivity` of any node type (or a list of them, or node names, most
    sensitive first; a normal node stands for the calibration nodes quantizing it) to reuse
    instead of ranking anew. With the float model
    (``float_model`` or the engine's) the settings are applied by re-quantizing and measured
    on the same data sets; the re-quantized models go to ``save_dir`` (or a temporary folder).
    """
    if not isinstance(remedy, str) or remedy not in REMEDIES + (MIXED,):
        raise unknown("remedy", remedy, REMEDIES + (MIXED,))
    if not isinstance(search, str) or search not in SEARCHES:
        raise unknown("search", search, SEARCHES)
    budget = None if budget is None else params.seconds(budget, "budget")
    full_curve, per_channel_activations, requantize_check, verbose = (
        params.flag(v, name) for v, name in ((full_curve, "full_curve"), (per_channel_activations,
                                             "per_channel_activations"), (requantize_check, "requantize_check"),
                                            (verbose, "verbose")))
    if per_channel_activations and remedy not in ("per-channel", MIXED):
        raise PTQError(f"per_channel_activations (--per-channel-activations) widens a per-channel or mixed search; "
                       f"a {remedy!r} search has no per-channel remedy to give activations")
    # a mapping is per output, as the output checks take it: read with the outputs, in objective_for
    target = target if target is None or isinstance(target, dict) else params.number(target, "target")
    candidates = None if candidates is None else params.names(candidates, "candidates")
    clock = Clock(budget)
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    also = guard.Inputs().add(float_model, guard.FLOAT_MODEL).add(heldout if isinstance(heldout, (str, Path)) else None,
                                                               "held-out data")
    with engine.writes(save_dir, also=also, optional=True) as out:
        if out is not None:  # the files named in advance, before the search
            tag = engine.qmodel.made_by.key.replace("-", "_")
            for name in ("requantized_baseline.onnx", f"requantized_{remedy}.onnx", f"remedy_{remedy}.png",
                         f"remedy_{remedy}.json", f"remedy_{remedy}_settings.json",
                         f"requantized_{tag}_baseline.onnx", f"requantized_{tag}_remedy.onnx"):
                guard.claim(out / name)
        return _suggest(engine, out, clock, target, metric, remedy, output_node, data_num, float_model, budget,
                        candidates, ranking, full_curve, per_channel_activations, requantize_check, progress,
                        verbose, heldout, evaluate, min_ratio, costs, search, also)


def _suggest(engine, save_dir, clock, target, metric, remedy, output_node, data_num, float_model, budget,
             candidates, ranking, full_curve, per_channel_activations, requantize_check, progress, verbose,
             heldout, evaluate, min_ratio, costs, search, also):
    float_model = float_model if float_model is not None else engine.float_model
    qm = engine.qmodel
    objective = objective_for(metric, target, output_node, engine, evaluate, min_ratio)
    specs = objective.specs
    costs = costs_for(remedy, costs)
    indices = sample_indices(engine, data_num)
    if remedy == MIXED and ranking is not None:
        raise PTQError("a mixed search ranks each node on each kind itself; leave out ranking=")
    if ranking is not None:
        given_ranking(ranking, objective.metric, qm)  # a misspelt name is said even when no search runs
    menus, skipped = menus_for(engine, list(costs), per_channel_activations)
    notes = []
    if skipped:
        notes.append(f"{len(skipped)} weight node(s) such as {skipped[0]!r} are stored already quantized and "
                     "cannot be simulated; pass the float model to consider them")
    if candidates is not None:
        wanted = set(qm.resolve_calibration(candidates))
        menus = {n: k for n, k in menus.items() if n in wanted}
    else:
        menus = _expressible(qm, menus, float_model, notes)
    if not menus:
        raise PTQError(f"no node of {qm.source!r} can take the {remedy!r} remedy"
                       + (" among the given candidates" if candidates is not None else "")
                       + "; try another remedy")
    base = layout(engine, indices, heldout)
    if base.note:
        notes.append(base.note)
    result = Remedy(remedy=remedy, metric=objective.guide.name,
                    target=objective.min_ratio if objective.min_ratio is not None else objective.target,
                    met=False, nodes=[], value=None, baseline=None, ceiling=None, curve=[], pruned=[], ranking=[],
                    settings={"nodes_to_exclude": [], "TensorQuantOverrides": {}, "simulation_only": []},
                    notes=notes, samples=len(base.calibration), outputs=[s.name for s in specs], budget_s=budget,
                    model=qm.source, objective=objective.to_dict(), costs=costs, search=search,
                    judged_on=base.judge.name, heldout=_where(heldout, base))
    read_from(result, engine.inputs() | also)
    alignment = getattr(qm, "alignment", None)
    for t in dict.fromkeys(s.tensor for s in specs) if alignment is not None else ():
        # a quantizer that deletes a Relu/Clip gives its name to the tensor before it: the
        # figures read that tensor, which the float model names otherwise
        fold = next((c for c, o in alignment.fold_outputs.items() if o == t), None)
        if fold is not None and alignment.computes.get(t, t) != t:
            op = qm.calibration[fold].folded[0]
            notes.append(f"{t!r} of {qm.source!r} holds what the float model names {alignment.computes[t]!r}: the "
                         f"quantizer folded the float model's {op} that computes {t!r} into the pair after it and "
                         f"gave {t!r} to the {op}'s input, so the figures read the values before the {op}")
    if evaluate is None:  # a target met on an output far from zero may be met by nothing at all
        result.warnings += blind_warnings(engine, specs, objective.metric.name)
    # a file that runs otherwise than its simulation on this machine's kernels: every figure
    # of the search is the simulation's
    result.warnings += simulation_warnings(engine, specs)
    if base.confirms and base.judge.engine is base.search.engine:
        result.split = {"search": list(base.search.indices), "confirmation": list(base.judge.indices)}
    show = verbose if progress is None else progress
    axes, lay, searcher = {}, base, None
    scorer = judge = None
    # the sets a search scores are not known in advance (the greedy may stop at the first, the
    # refinement go on past the candidates): counted, with no time left
    with Progress(None, f"remedy search ({remedy}), sets scored", enabled=show) as bar:
        try:
            with bar.paused():  # the ranking has its own bar; the search's time left counts sets
                alts, axes, moves = _alternatives(engine, remedy, menus, costs, objective, base, clock, notes, show)
            lay = with_alternatives(base, alts)
            scorer = Scorer(lay.search, objective, clock, bar)
            judge = Scorer(lay.judge, objective, clock, bar) if lay.confirms else scorer
            if moves is None:
                pool = list(menus)

                def moves():
                    with bar.paused():
                        ranked = rank(base.search.engine, pool, objective.guide, specs, base.search.indices, clock,
                                      ranking, show)
                    result.ranking = [{"node": n, "sensitivity": v} for n, v in ranked]
                    return [(n, remedy) for n, _ in ranked]
            else:
                ordered = moves
                moves = lambda: ordered  # noqa: E731
            searcher = Search(result, scorer, judge, costs, moves, search, full_curve)
            searcher.run()
        except OutOfTime:
            result.budget_exhausted = True
            scored = searcher is not None and searcher.best_S is not None and bool(searcher.best_S[1])
            notes.append(f"the {budget:g} s budget ended after {clock.elapsed:.1f} s; " + (
                "the result is the best found so far (raise --budget for a complete search)" if scored else
                "no remedy was scored yet (the alternatives and the ranking of every candidate node come first), so "
                "the figures are the model's as given; raise --budget, or search on fewer samples (--data-num)"))
        result.evaluations = (scorer.evaluations if scorer is not None else 0) + (
            judge.evaluations if judge is not None and judge is not scorer else 0)
    chosen = _pick(searcher, lay) if searcher is not None else None
    if chosen is not None:
        order = searcher.sorted(chosen)
        result.choices = {n: k for n, k in order}
        result.nodes = list(result.choices)
        result.cost = cost_of(chosen, costs)
        _figures(result, lay, objective, scorer, judge, chosen)
        _warn_chosen(result, searcher, chosen)
        result.judge_chose = bool(lay.confirms and searcher.chosen is not None and chosen != searcher.chosen)
    else:  # the budget ended before any set was scored: the model as given, outside the budget
        _figures(result, base, objective, None, None, frozenset())
    result.settings = onnxruntime_settings(qm, remedy, result.nodes, axes, result.choices)
    # after the budget too, as documented: a set found in time is applied and measured
    check = float_model is not None and requantize_check and result.nodes
    if check and unreproducible(qm):
        notes.append(f"the settings were not checked by re-quantizing the model: {unreproducible(qm)}")
        check = False
    if check:
        parts = {"calibration": (lay.calibration, _scorer_for(lay.calibration, scorer, judge, objective))}
        if lay.confirms:
            parts[lay.judge.name] = (lay.judge, judge)
        result.measured = measure(parts, objective, float_model, result, save_dir, progress=show)
        if result.measured:
            _warn(result, result.measured["figures"], "re-quantized: ")
    elif float_model is None and result.nodes:
        notes.append(f"pass the float model ({FLOAT_MODEL_OPTION}) to check the settings by "
                     "re-quantizing")
    result.producer_terms = producer_terms(qm, remedy, result.nodes, axes, result.choices, float_model)
    if check:
        _check_with_producer(engine, result, float_model, save_dir, parts, objective)
    result.elapsed_s = clock.elapsed
    if save_dir is not None and result.curve:
        result.png = str(plot_remedy(result, Path(save_dir) / f"remedy_{remedy}.png"))
    if verbose:
        print(result.summary())
    return result


def _expressible(qm, menus, float_model, notes):
    """``menus`` less ``float`` where the quantizer that made the model has no term to keep
    the node's tensor in float (an unnamed node of its own rewrite touches it, and its
    exclusions match names): a remedy its user cannot apply is no remedy. onnxruntime's own
    and unknown producers: unchanged. (The other kinds are tensor settings every producer
    with them can name.)"""
    nodes = [n for n, kinds in menus.items() if "float" in kinds]
    terms = producer_terms(qm, "float", nodes, float_model=float_model) if nodes else None
    dropped = {u["node"]: u["why"] for u in (terms or {}).get("unsupported", ()) if "instead" not in u}
    if not dropped:
        return menus
    first = next(iter(dropped))
    notes.append(f"{len(dropped)} node(s) not kept in float by the search: {terms['short']} has no term for it "
                 f"(e.g. {first!r}: {dropped[first]}); pass candidates= (--candidates) to search them anyway, in "
                 "simulation")
    out = {n: [k for k in kinds if not (k == "float" and n in dropped)] for n, kinds in menus.items()}
    out = {n: kinds for n, kinds in out.items() if kinds}
    if not out:
        raise PTQError(f"no node of {qm.source!r} can be kept in float in {terms['short']}'s terms (e.g. {first!r}: "
                       f"{dropped[first]}); pass candidates= (--candidates) to search in simulation, or try another "
                       "remedy")
    return out


def _check_with_producer(engine, result, float_model, save_dir, parts, objective):
    """Re-quantize with the producer that made the model and the remedy in its terms, when
    its Python is named, and judge it as the simulation is judged (same parts, objective and
    targets); a producer that fails is a warning, the search's result stands."""
    terms = result.producer_terms
    if not terms or not any(terms["expect"].values()):
        return
    key = terms["producer"]
    if not producer_python(key):
        result.notes.append(f"set {PYTHON_ENV[key]} to the Python of an environment with {PACKAGE[key]} to check "
                            f"the {terms['short']} terms by re-quantizing with it")
        return
    def score(path=None):  # the model as given: the search's own figures with nothing remedied
        if path is None:
            return {name: result.figures[name]["before"] for name in parts}
        return score_parts(parts, objective, path, float_model)[0]

    try:
        measured = check_producer_terms(engine, terms, float_model, save_dir=save_dir, score=score)
    except PTQError as exc:
        result.warnings.append(f"re-quantizing with {terms['short']} failed: {exc}")
        return
    figures = {name: {"samples": len(part), "original": measured["original"][name], "before": measured["before"][name],
                      "after": measured["after"][name], "target": sc.target,
                      **objective.by_output(measured["before"][name], measured["after"][name])}
               for name, (part, sc) in parts.items()}
    measured.update(judged(figures, objective, result.judged_on))
    result.producer_measured = measured
    _warn(result, figures, f"re-quantized with {terms['short']}: ")
    if measured["not_applied"]:
        result.warnings.append(f"re-quantized with {terms['short']}, {', '.join(measured['not_applied'])} did not "
                               "come out as the remedy asks")


def _where(heldout, lay):
    if heldout is None:
        return None
    if isinstance(heldout, (str, Path)):
        return str(heldout)
    return getattr(heldout, "where", None) or lay.judge.where


def _alternatives(engine, remedy, menus, costs, objective, base, clock, notes, progress):
    """``(alternatives, axes, moves)``: the fake-quant each node can switch to, the channel axes
    of per-channel ones, and for a mixed search its ranked moves (None: rank lazily), ranked
    with a progress bar when ``progress``."""
    cal = base.calibration.indices
    if remedy == "float":
        return {}, {}, None
    if remedy != MIXED:
        alts, axes = alternatives_for(engine, remedy, list(menus), cal, clock)
        missing = [n for n in menus if n not in alts]
        if missing:
            notes.append(f"{len(missing)} node(s) such as {missing[0]!r} have no channel axis to quantize along "
                         "and were left out")
            for n in missing:
                del menus[n]
        if not menus:
            raise PTQError(f"no node of {engine.qmodel.source!r} can take the {remedy!r} remedy; try another remedy")
        return alts, axes, None
    by_kind, axes, engines = {}, {}, {}
    for kind in costs:
        if kind == "float":
            continue
        names = [n for n, ks in menus.items() if kind in ks]
        alts, kind_axes = alternatives_for(engine, kind, names, cal, clock)
        for n in names:
            if n not in alts:
                menus[n] = [k for k in menus[n] if k != kind]
        by_kind[kind] = (alts, kind_axes)
        if alts:
            engines[kind] = engine.with_alternatives(with_biases(engine, alts))
    for n in [n for n, ks in menus.items() if not ks]:
        del menus[n]
    moves, kinds, gains = mixed_moves(engine, engines, menus, costs, objective.guide, objective.specs,
                                      base.search.indices, clock, progress)
    mix = {}
    for n, kind in kinds.items():
        mix[n] = by_kind[kind][0][n]
        if n in by_kind[kind][1]:
            axes[n] = by_kind[kind][1][n]
    return mix, axes, moves


def _pick(searcher, lay):
    """The set to report: the search samples' set where the judging data confirm it (meet the
    target with it), else the best on the judging data, no remedy included; a set the budget
    left unjudged is judged now (outside the budget) and kept if better. A confirmed set
    stays: the judge preferring a cheaper one it also meets (no remedy, on two easy
    confirmation samples while the search samples read 0.98 of a 0.995 target) would choose
    on the data that was to check the choice."""
    if searcher.best_S is None:
        return None
    if not lay.confirms:
        return searcher.best_S[1]
    first = searcher.chosen
    if first is not None and first in searcher.J.memo and searcher.J.meets(searcher.J.memo[first]):
        return first
    best = searcher.best_J
    for candidate in (searcher.best_S[1], frozenset()):
        if best is not None and candidate in searcher.J.memo:
            continue  # judged during the search: best_J has weighed it
        value = searcher.J.final(candidate)
        r = searcher.rank(searcher.J, candidate, value)
        if best is None or r > best[0]:
            best = (r, candidate)
    return best[1]


def _scorer_for(part, scorer, judge, objective):
    """The scorer of ``part``: the search's or the judge's, else a new one (outside the budget)."""
    for sc in (scorer, judge):
        if sc is not None and part is sc.part:
            return sc
    return Scorer(part, objective, None)


def _figures(result, lay, objective, scorer, judge, chosen):
    """Fill ``result.figures`` (and ``value``, ``baseline``, ``met``) before and after ``chosen``."""
    base = frozenset()
    parts = {"calibration": lay.calibration}
    if lay.confirms:
        if lay.calibration is not lay.search:
            parts["search"] = lay.search
        parts[lay.judge.name] = lay.judge
    figures = {}
    for name, part in parts.items():
        sc = _scorer_for(part, scorer, judge, objective)
        if name == "calibration" and scorer is not None and sc is not scorer and not objective.is_task:
            # the split's two parts make up the calibration samples: pool their sums, no rerun
            values = pooled([scorer, judge], base), pooled([scorer, judge], chosen)
        else:
            values = sc.final(base), sc.final(chosen)
        target = sc.target
        f = {"samples": len(part), "where": part.where, "before": values[0], "after": values[1], "target": target,
             "met": objective.meets(values[1], target), "met_before": objective.meets(values[0], target),
             **objective.by_output(*values)}  # which output stays short of its own target, read back
        if objective.is_task:
            guide = Scorer(part, objective, None, metric=objective.guide)
            f["float"] = sc.float_score()
            f[objective.guide.name] = {"before": guide.final(base), "after": guide.final(chosen)}
        figures[name] = f
    result.figures = figures
    result.baseline, result.value = figures["calibration"]["before"], figures["calibration"]["after"]
    result.met = figures.get(result.judged_on, figures["calibration"])["met"]
    _warn(result, figures, "")


def _warn(result, figures, prefix):
    """One sentence when the reported set's gain does not hold on the judging data."""
    if result.judged_on not in figures or result.judged_on == "calibration" or not result.nodes:
        return
    cal, judged = figures.get("search", figures["calibration"]), figures[result.judged_on]
    what = f"{prefix}{len(result.nodes)} node(s) {WHAT[result.remedy]}"
    sentence = _not_holding(result, what, (cal["before"], cal["after"], cal["met"]),
                            (judged["before"], judged["after"], judged["met"], judged["target"]))
    if sentence:
        result.warnings.append(sentence)


def _not_holding(result, what, search, judged):
    """``what: 0.9958 on calibration, 0.904 on held-out: worse than no remedy (0.954)`` or
    ``...: the gain does not hold, short of the target T``; None when the gain holds."""
    m = result.objective_metric
    on = "held-out" if result.judged_on == "held-out" else "the confirmation samples"
    s_before, s_after, s_met = search
    j_before, j_after, j_met, target = judged
    figs = f"{s_after:.6g} on calibration, {j_after:.6g} on {on}"
    if m.worse(s_before, s_after) and m.worse(j_after, j_before):
        return f"{what}: {figs}: worse than no remedy ({j_before:.6g})"
    if s_met and not j_met:
        bar = result.target_text if result.objective.get("targets") else f"{target:.6g}"  # each output's own
        return f"{what}: {figs}: the gain does not hold, short of the target {bar}"
    return None


def _warn_chosen(result, searcher, chosen):
    """The set the search samples chose, when the judge overruled it: say why, one sentence."""
    first = searcher.chosen
    if first is None or first == chosen or first not in searcher.J.memo:
        return
    S, J = searcher.S, searcher.J
    base = frozenset()
    if not first:
        if S.meets(S.final(base)) and not J.meets(J.final(base)):
            on = "held-out data" if result.judged_on == "held-out" else "the confirmation samples"
            how = (f"the nodes were found by adding remedies in ranking order and pruning, judged on {on}"
                   if result.met else f"adding remedies in ranking order found no set that meets it on {on}")
            result.notes.append(f"the search samples already meet the target without a remedy "
                                f"({S.final(base):.6g}) but {on} do not ({J.final(base):.6g}): {how}")
        return
    # the curve printed ends where the target was first met there; pruning and refining then
    # made the set another size
    met = next((p["nodes"] for p in result.curve if S.meets(p["value"])), None)
    pruned = (f": the search curve's first {met}, which pruning and refining on those samples made {len(first)}"
              if met is not None and met != len(first) else "")
    what = f"the set chosen on the search samples ({len(first)} node(s) {WHAT[result.remedy]}{pruned})"
    sentence = _not_holding(result, what, (S.final(base), S.final(first), S.meets(S.final(first))),
                            (J.final(base), J.final(first), J.meets(J.final(first)), J.target))
    if sentence:
        then = (f"; {len(chosen)} node(s) found by adding and pruning on that data meet it" if result.met
                else "")
        result.warnings.append(sentence + then)

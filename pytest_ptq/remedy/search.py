"""The search: greedy on the sensitivity ranking, then pruning, within a time budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import guard, params
from ..engine import engine_for
from ..errors import PTQError, unknown
from ..metrics import get_metrics
from ..outputs import parse_outputs
from ..progress import Progress
from ..results import read_from
from ..sensitivity import rank_configs, sample_indices
from .alternatives import alternatives_for, candidates_for
from .plot import plot_remedy
from .requantize import measure
from .result import REMEDIES, Remedy, meets
from .scoring import Clock, OutOfTime, Scorer
from .terms import onnxruntime_settings

# Candidates are ranked this many at a time so that a time budget can stop the ranking.
_RANK_CHUNK = 16


def _rank(engine, names, metric, specs, indices, clock, ranking):
    """``[(node, sensitivity)]`` most sensitive first, from a given ranking or computed."""
    if ranking is not None:
        return _given_ranking(ranking, names, metric)
    values = {}
    for k in range(0, len(names), _RANK_CHUNK):
        clock.check()
        chunk = {n: [n] for n in names[k:k + _RANK_CHUNK]}
        s = rank_configs(engine, chunk, [metric], specs, indices, "calibration", lambda n: {}, "ranking")
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
    if not isinstance(remedy, str) or remedy not in REMEDIES:
        raise unknown("remedy", remedy, REMEDIES)
    budget = None if budget is None else params.seconds(budget, "budget")
    target = params.number(target, "target")
    candidates = None if candidates is None else params.names(candidates, "candidates")
    clock = Clock(budget)
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    with engine.writes(save_dir, also=guard.Inputs().add(float_model, "float model"),
                       optional=True) as out:
        if out is not None:  # the files named in advance, before the search
            for name in ("requantized_baseline.onnx", f"requantized_{remedy}.onnx", f"remedy_{remedy}.png",
                         f"remedy_{remedy}.json", f"remedy_{remedy}_settings.json"):
                guard.claim(out / name)
        return _suggest(engine, out, clock, target, metric, remedy, output_node, data_num, float_model, budget,
                        candidates, ranking, full_curve, per_channel_activations, requantize_check, progress,
                        verbose)


def _suggest(engine, save_dir, clock, target, metric, remedy, output_node, data_num, float_model, budget,
             candidates, ranking, full_curve, per_channel_activations, requantize_check, progress, verbose):
    float_model = float_model if float_model is not None else engine.float_model
    m = get_metrics(metric)[0]
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
        wanted = set(qm.resolve_calibration(candidates))
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
    read_from(result, engine.inputs() | guard.Inputs().add(float_model, "float model"))
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
                search_engine = engine.with_alternatives(alts)
            scorer = Scorer(search_engine, remedy, m, specs, indices, clock, bar)
            _search(result, scorer, engine, m, specs, indices, clock, pool, ranking, full_curve)
        except OutOfTime:
            result.budget_exhausted = True
            notes.append(f"the {budget:g} s budget ended after {clock.elapsed:.1f} s; the result is the best "
                         "found so far (raise --budget for a complete search)")
        result.evaluations = scorer.evaluations if scorer is not None else 0
    result.settings = onnxruntime_settings(qm, remedy, result.nodes, axes)
    if float_model is not None and requantize_check and result.nodes and not result.budget_exhausted:
        result.measured = measure(engine, qm, float_model, result, specs, m, indices, save_dir)
    elif float_model is None and result.nodes:
        notes.append("pass the float model (float_model= / --float-model) to check the settings by "
                     "re-quantizing")
    result.elapsed_s = clock.elapsed
    if save_dir is not None and result.curve:
        result.png = str(plot_remedy(result, Path(save_dir) / f"remedy_{remedy}.png"))
    if verbose:
        print(result.summary())
    return result


def _search(result, scorer, engine, m, specs, indices, clock, pool, ranking, full_curve):
    """Greedy on the ranking, then pruning; fills ``result`` as it goes so that a budget
    stop leaves the best configuration found so far in it."""
    target = result.target

    def rank_of(nodes, value, met):
        # met beats unmet; among met, fewer nodes; then the better value
        return (met, -len(nodes) if met else 0, m.sort_key(value) if value is not None else -np.inf)

    def keep(nodes, value):
        met = meets(m, value, target)
        if result.value is None or rank_of(nodes, value, met) > rank_of(result.nodes, result.value, result.met):
            result.nodes, result.value, result.met = list(nodes), value, met

    result.baseline = scorer(())
    result.curve.append({"nodes": 0, "added": None, "value": result.baseline})
    keep([], result.baseline)
    if result.met:
        return
    ranked = _rank(engine, pool, m, specs, indices, clock, ranking)
    result.ranking = [{"node": n, "sensitivity": v} for n, v in ranked]
    order = [n for n, _ in ranked]
    if not order:
        raise PTQError("the given ranking names none of the candidate nodes; rank the same model's nodes")
    result.ceiling = scorer(order)
    if not meets(m, result.ceiling, target):
        what = {"float": "in float", "int16": "at 16 bit", "per-channel": "per channel"}[result.remedy]
        result.notes.append(f"even with every candidate {what} the {m.name} is {result.ceiling:.6g}, short of "
                            f"{target}; try another remedy or check the data and the float model")
    found = None
    for k in range(1, len(order) + 1):
        value = scorer(order[:k])
        result.curve.append({"nodes": k, "added": order[k - 1], "value": value})
        keep(order[:k], value)
        if found is None and meets(m, value, target):
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
        if meets(m, value, target):
            chosen = trial
            result.pruned.append(n)
            keep(chosen, value)
    result.nodes, result.value, result.met = chosen, scorer(chosen), True



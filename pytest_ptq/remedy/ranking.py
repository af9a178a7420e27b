"""The order in which the search tries remedies: most promising first.

A single remedy follows the nodes' sensitivity (the output metric with only that node
quantized, as ``get-sensitivity-of-nodes`` ranks them). A mixed remedy needs a kind per node
too: each node is also run alone on each alternative, and a move ``(node, kind)`` is worth
what it recovers of the node's loss per unit of cost, as in AIMET's mixed-precision search.
"""

from __future__ import annotations

import math

from ..errors import PTQError, shown, unknown
from ..progress import Progress
from ..sensitivity import score_configs

# Candidates are ranked this many at a time so that a time budget can stop the ranking.
RANK_CHUNK = 16


def rank(engine, names, metric, specs, indices, clock, ranking=None, progress=False):
    """``[(node, sensitivity)]`` most sensitive first, from a given ranking or computed (with a
    progress bar when ``progress``)."""
    if ranking is not None:
        return _given_ranking(ranking, names, metric, engine.qmodel)
    with Progress(len(names) * len(indices), f"ranking {len(names)} nodes", enabled=progress) as bar:
        values = one_node_values(engine, names, metric, specs, indices, clock, bar=bar)
    order = sorted(values, key=lambda n: metric.sort_key(values[n]))
    return [(n, values[n]) for n in order]


def given_ranking(ranking, metric, qm):
    """``([(calibration node, value or None)], [calibration node])``: the entries in the order
    ``ranking`` gives (a Sensitivity, or a list of them, of calibration nodes, or of normal nodes,
    each standing for the calibration nodes quantizing it, in the node's rank, with no value of
    its own; or node names), then the nodes only ranked with no values compared (they change
    none of the ranking's outputs: the search tries them last). Raises PTQError naming an
    entry that is no node of ``qm``."""
    if isinstance(ranking, (str, dict)):
        ranking = [ranking]
    entries, unmeasured = {}, []

    def take(name, value):
        if not isinstance(name, str):
            raise PTQError(f"ranking names nodes by str, got {shown(name)}")
        if name not in qm.calibration and name not in qm.normal:
            raise unknown("node", name, sorted(qm.names()))
        normal = name not in qm.calibration
        if not normal and isinstance(value, dict) and value.get(metric.name) is None:
            unmeasured.append(name)
            return
        for n in qm.quantizing(name) if normal else [name]:
            if n not in entries:
                entries[n] = None if normal or not isinstance(value, dict) else value.get(metric.name)

    for item in ranking:
        if isinstance(item, str):
            take(item, None)
        elif isinstance(item, dict):
            for n, v in item.items():
                take(n, v)
        else:
            raise PTQError(f"ranking must be a Sensitivity, a list of them, or a list of node names, got {shown(item)}")
    return list(entries.items()), [n for n in dict.fromkeys(unmeasured) if n not in entries]


def _given_ranking(ranking, names, metric, qm):
    allowed = set(names)
    ranked, unmeasured = given_ranking(ranking, metric, qm)
    entries = [(n, v) for n, v in ranked if n in allowed]
    if not entries and not any(n in allowed for n in unmeasured):
        raise PTQError(f"the given ranking names none of the {len(names)} candidate nodes (its nodes cannot take this "
                       "remedy, or are not gated); rank them with get_sensitivity_of_nodes, or leave out ranking=")
    if all(v is not None for _, v in entries):
        entries.sort(key=lambda e: metric.sort_key(e[1]))
    return entries + [(n, None) for n in unmeasured if n in allowed]


def one_node_values(engine, names, metric, specs, indices, clock, alternative=False, bar=None):
    """``{node: metric}`` with only that node quantized (on its alternative when asked), the
    worst output's, samples pooled; ``bar`` advances once per node and sample."""
    values = {}
    for k in range(0, len(names), RANK_CHUNK):
        clock.check()
        chunk = {n: [n] for n in names[k:k + RANK_CHUNK]}
        for n, (pool,) in score_configs(engine, chunk, [metric], specs, indices, bar, alternative).items():
            values[n] = pool.judged(engine.data)
    return values


def mixed_moves(engine, alt_engines, menus, costs, metric, specs, indices, clock, progress=False):
    """``(moves, kinds, gains)`` for a mixed search.

    ``moves``: ``[(node, kind)]`` by estimated gain per cost, best first, with each node's
    float move and its one alternative (``kinds[node]``: the alternative with the best gain
    per cost; the engine can simulate one per node). ``gains``: ``{(node, kind): gain}`` in
    the metric's sort units (what the move recovers with the node alone quantized).
    ``alt_engines``: ``{kind: engine}`` able to run that kind on every node whose menu has it.
    A progress bar when ``progress``: these runs come before the search scores any set.
    """
    names = list(menus)
    have = {kind: [n for n in names if kind in menus[n]] for kind in alt_engines}
    runs = (len(names) + sum(map(len, have.values()))) * len(indices)
    alone = {}
    with Progress(runs, f"ranking {len(names)} nodes, each kind alone", enabled=progress) as bar:
        int8 = one_node_values(engine, names, metric, specs, indices, clock, bar=bar)
        for kind, eng in alt_engines.items():
            for n, v in one_node_values(eng, have[kind], metric, specs, indices, clock, True, bar).items():
                alone[(n, kind)] = v
    finite = [k for k in (metric.sort_key(v) for v in list(int8.values()) + list(alone.values())) if math.isfinite(k)]
    # an error-free output: cosine 1, error 0; SQNR's is infinite, so cap it at the best seen
    perfect = math.inf if metric.name == "sqnr" else metric.sort_key(1.0 if metric.higher_is_better else 0.0)
    if not math.isfinite(perfect):
        perfect = max(finite, default=0.0)
    worst = min(finite, default=perfect)

    def key(value):
        # within [worst seen, perfect]: a node that alone changes nothing judged reads an
        # infinite SQNR, whose gains (inf - inf) were NaN and left the moves' sort unordered
        return min(max(metric.sort_key(value), worst), perfect)

    gains, kinds, moves = {}, {}, []
    for n in names:
        base = key(int8[n])
        options = {}
        for kind in menus[n]:
            if kind == "float":
                options[kind] = perfect - base
            elif (n, kind) in alone:
                options[kind] = key(alone[(n, kind)]) - base
        alts = [k for k in options if k != "float"]
        if alts:
            # ties go to the cheaper kind
            kinds[n] = max(alts, key=lambda k: (options[k] / costs[k], -costs[k]))
        for kind, gain in options.items():
            if kind == "float" or kind == kinds.get(n):
                gains[(n, kind)] = gain
                moves.append((n, kind))
    moves.sort(key=lambda mv: (-gains[mv] / costs[mv[1]], costs[mv[1]]))
    return moves, kinds, gains

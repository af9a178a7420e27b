"""How far a sensitivity ranking can be trusted.

Ranking confidence resamples the calibration samples (bootstrap) to show how much each
node's sensitivity moves from sample to sample, and whether the top of the ranking would
stay the same with other data.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import params
from .errors import PTQError
from .metrics import get_metrics
from .results import JsonResult, inputs_of, read_from
from .sensitivity import Sensitivity
from .tables import listed


@dataclasses.dataclass
class Confidence(JsonResult):
    """How stable a sensitivity ranking is under resampling of the calibration samples.

    ``nodes[name]``: ``mean``, ``std``, ``min``, ``max`` of the per-sample values, ``samples``
    (those judged: on the others the outputs its quantization reaches held no values), ``rank``
    (1 = most sensitive, by the mean over samples), ``rank_low``/``rank_high`` (the 5th and
    95th percentile of the bootstrap ranks) and ``top_k_frequency`` (share of resamples in
    which the node is in the top ``k``). A resample holding none of the samples a node was
    judged on gives it no rank: it is left out of that resample's comparison, and its rank
    interval and ``top_k_frequency`` are over the resamples holding one (as the last of that
    resample it read as the least sensitive node there). ``top_k_set_frequency`` is the share
    of resamples whose top-``k`` set equals ``top_k`` (one missing a node of it does not: it
    cannot show that set); ``stable`` is whether it reaches ``stable_at`` (None with fewer
    than two samples, where nothing can be said). ``left_out``: the nodes whose quantization
    changes no value compared (no figure in the ranking), not resampled; ``unconfirmed``: those
    a screened ranking scored on fewer of its samples than the rest (the samples they lack
    would be judged as missing values), not resampled.
    """

    metric: str
    samples: int
    k: int
    resamples: int
    top_k: list
    top_k_set_frequency: float | None
    stable: bool | None
    stable_at: float
    unstable_nodes: list
    nodes: dict
    pooled_top_k: list
    message: str
    left_out: list = dataclasses.field(default_factory=list)
    unconfirmed: list = dataclasses.field(default_factory=list)

    def __bool__(self):
        return bool(self.stable)


    def rows(self):
        return [{"node": n, **v} for n, v in self.nodes.items()]


MAX_RESAMPLES = 20000


def ranking_confidence(sensitivity, k=5, resamples=1000, seed=0, metric=None, stable_at=0.9,
                       annotate=True):
    """Bootstrap the per-sample values of a :class:`Sensitivity` over samples.

    Nodes are ranked by their mean per-sample value (the headline ranking pools samples
    instead; ``pooled_top_k`` shows its top ``k`` beside). With ``annotate`` the spread (std
    over samples) and the 5-95% rank interval go into ``sensitivity.details[node]``.
    Returns a :class:`Confidence`, nodes in mean-rank order.
    """
    k = params.positive_int(k, "k")
    resamples = params.positive_int(resamples, "resamples")
    if resamples > MAX_RESAMPLES:
        raise PTQError(f"resamples must be at most {MAX_RESAMPLES} (a 5-95% interval settles within a few "
                       f"thousand), got {resamples}")
    seed = params.whole(seed, "seed", minimum=0)
    stable_at = params.fraction(stable_at, "stable_at")
    annotate = params.flag(annotate, "annotate")
    if not isinstance(sensitivity, Sensitivity):
        raise PTQError("ranking_confidence needs a Sensitivity result (from get_sensitivity_of_nodes, "
                       "group_sensitivity or Sensitivity.load)")
    m = get_metrics(metric or (sensitivity.metrics[0] if sensitivity.metrics else "cosine-similarity"))[0]
    if not list(sensitivity):
        raise PTQError("the sensitivity result ranks no node; nothing to assess")
    # a node changing no value compared has no figure, per sample neither: as 1.0 it read as the steadiest
    left_out = [n for n in sensitivity if "no_values" in sensitivity.details.get(n, {})]
    # a screened ranking's nodes scored on some of its samples only: their means over fewer
    # samples set against the others' over all are no like-for-like comparison
    unconfirmed = [n for n in sensitivity if n not in left_out and "scored_samples" in sensitivity.details.get(n, {})]
    names = [n for n in sensitivity if n not in left_out and n not in unconfirmed]
    if not names and unconfirmed:
        # confirmed_samples: every sample screening ranked on, kept where a file lost its sample_indices
        raise PTQError(f"no node of the sensitivity result was scored on all its {sensitivity.confirmed_samples} "
                       "samples (a screened ranking that confirmed none); rank with confirm above 0 or on every sample")
    if not names:
        raise PTQError(f"no node of the sensitivity result has a figure: quantizing any of them "
                       f"{sensitivity.details[left_out[0]]['no_values']} (no values compared); rank it on outputs "
                       "that hold values")
    rows, judged = [], []
    for n in names:
        per_sample = sensitivity.details.get(n, {}).get("per_sample", {}).get(m.name)
        if per_sample is None:
            raise PTQError(f"the sensitivity result has no per-sample {m.name} values for {n!r}; "
                           f"compute it with metric {m.name!r} among its metrics")
        # None: a sample on which the outputs its quantization reaches held no values, left out
        rows.append([np.nan if v is None else float(v) for v in per_sample])
        judged.append([v is not None for v in per_sample])
    lengths = {len(r) for r in rows}
    if len(lengths) != 1 and not sensitivity.sample_indices:
        # a screened ranking of a release before sample_indices: unequal lists in each node's own scoring order
        raise PTQError(f"the sensitivity result is a screened ranking saved before per-sample values were laid by "
                       f"sample (it has no sample_indices): its nodes' lists hold {min(lengths)} to {max(lengths)} "
                       "values each in the order each node was scored, so no column is one sample for every node; "
                       "rank it again with this release")
    if len(lengths) != 1:
        raise PTQError("nodes of the sensitivity result were scored on different numbers of samples; "
                       "recompute it in one run")
    values = np.asarray(rows, dtype=np.float64)  # [nodes, samples]
    judged = np.asarray(judged, dtype=bool).reshape(values.shape)
    n_nodes, n_samples = values.shape
    k = max(1, min(int(k), n_nodes))
    keyed = np.where(judged, _keys(values, m), 0.0)  # summed over the samples judged only
    if n_samples == 0:
        raise PTQError("the sensitivity result holds no per-sample values; score at least one sample")
    means = np.array([r[~np.isnan(r)].mean() if (~np.isnan(r)).any() else np.nan for r in values])
    order = np.argsort(_mean(keyed.sum(axis=1), judged.sum(axis=1)), kind="stable")
    rank_of = np.empty(n_nodes, dtype=int)
    rank_of[order] = np.arange(1, n_nodes + 1)
    top_k = [names[i] for i in order[:k]]
    pooled_top_k = names[:k]

    nodes = {}
    if n_samples >= 2:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, n_samples, size=(int(resamples), n_samples))
        # [nodes, resamples], lower key = more sensitive; in chunks, as [nodes, chunk, samples]
        # is the largest array
        boot = np.concatenate([_mean(keyed[:, picks[r:r + 256]].sum(axis=2), judged[:, picks[r:r + 256]].sum(axis=2))
                               for r in range(0, len(picks), 256)], axis=1)
        # NaN (no sample judged in the resample) sorts last: the ranks of the others are those
        # among the nodes judged there, and its own is none
        seen = ~np.isnan(boot)
        boot_rank = np.argsort(np.argsort(boot, axis=0, kind="stable"), axis=0, kind="stable") + 1
        in_top = seen & (boot_rank <= k)
        top_set = set(order[:k].tolist())
        same_set = np.array([set(np.flatnonzero(in_top[:, r]).tolist()) == top_set
                             for r in range(in_top.shape[1])])
        set_freq = float(same_set.mean())
        stable = set_freq >= stable_at
        counted = seen.sum(axis=1)
        freq = _mean(in_top.sum(axis=1), counted)
        low, high = (np.array([np.percentile(r[s], q) if s.any() else np.nan for r, s in zip(boot_rank, seen)])
                     for q in (5, 95))
        missing = float((~seen[order[:k]]).any(axis=0).mean())
        unstable = [names[i] for i in order if 1 - stable_at < freq[i] < stable_at]
    else:
        set_freq, stable, unstable = None, None, []
        freq = low = high = None
        missing = 0.0
    for i in order:
        row = values[i]
        finite = row[np.isfinite(row)]
        nodes[names[i]] = {
            "mean": float(means[i]), "std": float(np.std(finite)) if finite.size else float("nan"),
            "min": float(finite.min()) if finite.size else float("nan"),
            "max": float(finite.max()) if finite.size else float("nan"),
            "rank": int(rank_of[i]), "samples": int(judged[i].sum()),
            "rank_low": float(low[i]) if low is not None else None,
            "rank_high": float(high[i]) if high is not None else None,
            "top_k_frequency": float(freq[i]) if freq is not None else None,
        }
        if annotate:
            d = sensitivity.details.setdefault(names[i], {})
            d["spread"] = nodes[names[i]]["std"]
            if low is not None:
                d["rank_interval"] = [nodes[names[i]]["rank_low"], nodes[names[i]]["rank_high"]]
    if stable is None:
        message = (f"only {n_samples} sample(s): the ranking's stability cannot be judged; "
                   "rank with several samples (the seed recommends 20-100)")
    elif stable:
        message = (f"the top {k} ({', '.join(top_k)}) is the same in {set_freq:.0%} of "
                   f"{resamples} resamples of the {n_samples} samples: stable"
                   + (f" among them, but resampling so few samples understates how much other samples move it: "
                      f"rank on {params.FEW_SAMPLES} or more to trust it" if n_samples < params.FEW_SAMPLES else ""))
    else:
        who = f"; {', '.join(unstable)} move in and out of it" if unstable else ""
        message = (f"the top {k} is the same in only {set_freq:.0%} of {resamples} resamples of the "
                   f"{n_samples} samples{who}: do not trust its order, add samples or compare with "
                   "group sensitivity")
    if missing:
        message += (f"; {missing:.0%} of the resamples held no sample some node of the top {k} was judged on, "
                    "and could not show that top")
    fewer = [names[i] for i in order if judged[i].sum() < n_samples]
    if fewer:
        message += (f"; {listed(fewer, 3)} judged on fewer samples ('samples'), those on which the outputs their "
                    "quantization reaches hold values")
    if left_out:
        message += (f"; {len(left_out)} left out, whose quantization changes no value compared ({listed(left_out, 3)}): "
                    "no values compared")
    if unconfirmed:
        message += (f"; {len(unconfirmed)} left out, ranked on fewer of the {n_samples} samples than the rest "
                    f"({listed(unconfirmed, 3)}): screening confirmed only the top on all")
    if set(top_k) != set(pooled_top_k):  # the set named is not the table's
        message += (f" (ranked by the mean over samples; the ranking shown pools them, and its top {k} differs: "
                    f"{', '.join(pooled_top_k)})")
    return read_from(Confidence(metric=m.name, samples=n_samples, k=k, resamples=int(resamples), top_k=top_k,
                                top_k_set_frequency=set_freq, stable=stable, stable_at=stable_at,
                                unstable_nodes=unstable, nodes=nodes, pooled_top_k=pooled_top_k, message=message,
                                left_out=left_out, unconfirmed=unconfirmed),
                     inputs_of(sensitivity))


def _mean(sums, counts):
    """``sums / counts``, NaN where a count is 0 (a resample holding no sample a node was judged
    on: argsort puts it last), quietly (``-W error``)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts


def _keys(values, metric):
    """Sort keys, lower = more sensitive; NaN counts as the most sensitive (as in sort_key).

    Infinities (an SQNR of a node without error) become large finite keys so that means of
    keys stay ordered instead of turning into inf - inf = NaN.
    """
    keys = values if metric.higher_is_better else -values
    return np.nan_to_num(keys, nan=-_BIG, posinf=_BIG, neginf=-_BIG)


_BIG = 1e30


def confidence_rows(conf):
    """Table rows of a :class:`Confidence`, mean-rank order; bootstrap columns only when
    there were samples enough to resample, the samples each node was judged on only where
    some node was judged on fewer than all."""
    rows = []
    fewer = any(v.get("samples", conf.samples) < conf.samples for v in conf.nodes.values())
    for name, v in conf.nodes.items():
        row = {"node": name, "rank": v["rank"], f"mean {conf.metric}": v["mean"], "spread (std)": v["std"],
               "min": v["min"], "max": v["max"]}
        if fewer:
            row["samples"] = v["samples"]
        if v["rank_low"] is not None:
            row["rank 5-95%"] = f"{v['rank_low']:g}-{v['rank_high']:g}"
            row[f"in top {conf.k}"] = f"{v['top_k_frequency']:.0%}"
        rows.append(row)
    return rows

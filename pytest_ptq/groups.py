"""Blocks of nodes scored together, and how far a ranking can be trusted.

Group sensitivity quantizes a whole block (a residual block, an attention block) with
everything else in float, so the error it reports is the block's own, interactions
included: two nodes that are harmless alone can add up inside a block.

Ranking confidence resamples the calibration samples (bootstrap) to show how much each
node's sensitivity moves from sample to sample, and whether the top of the ranking
would stay the same with other data.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np

from .errors import PTQError, unknown
from .metrics import get_metrics
from .results import JsonResult
from .sensitivity import Sensitivity, engine_for, rank_configs


@dataclasses.dataclass(frozen=True)
class Subgraph:
    """Every calibration node on a path from tensor ``start`` to tensor ``end``.

    The pair quantizing ``start`` belongs to the block (it quantizes what the block reads,
    as a normal node's sensitivity quantizes its inputs); the pair quantizing ``end``
    belongs to the next block. Weights read by the block's nodes are included unless
    ``weights`` is False.
    """

    start: str
    end: str
    weights: bool = True

    @property
    def label(self):
        return f"{self.start}->{self.end}"


def subgraph_nodes(qmodel, start, end, weights=True):
    """Names of the calibration nodes between tensors ``start`` and ``end``, graph order."""
    graph = qmodel.model.graph
    tensors = set(qmodel.producer) | set(qmodel.input_names)
    for t in (start, end):
        if t not in tensors:
            raise unknown("tensor", t, sorted(tensors))
    forward = _reach(start, lambda t: [o for n in qmodel.consumers.get(t, []) for o in n.output if o])
    backward = _reach(end, lambda t: [i for i in qmodel.producer[t].input if i] if t in qmodel.producer else [])
    if end not in forward:
        raise PTQError(f"tensor {end!r} does not depend on tensor {start!r} in {qmodel.source!r}; "
                       "give the block's input tensor first and its output tensor second")
    on_path = [n for n in graph.node
               if any(i in forward for i in n.input) and any(o in backward for o in n.output)]
    on_path_names = {n.name for n in on_path}
    chosen = []
    for c in qmodel.calibration.values():
        if c.kind == "activation":
            if c.input in forward and c.input != end and any(o in backward for o in c.outputs):
                chosen.append(c.name)
        elif weights and any(n in on_path_names for n in c.consumers):
            chosen.append(c.name)
    if not chosen:
        raise PTQError(f"no calibration node lies between tensors {start!r} and {end!r} in "
                       f"{qmodel.source!r}; pick a wider block")
    return chosen


def _reach(seed, step):
    seen, todo = {seed}, deque([seed])
    while todo:
        for nxt in step(todo.popleft()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def resolve_groups(engine, groups):
    """``{label: calibration nodes}`` from the accepted group forms.

    ``groups``: a dict ``{label: spec}`` or a list of specs, where a spec is a node name,
    a list of node names (calibration or normal nodes), a :class:`Subgraph`, or a dict
    ``{"from": tensor, "to": tensor}``.
    """
    if isinstance(groups, (str, Subgraph)):
        groups = [groups]
    items = list(groups.items()) if isinstance(groups, dict) else [(None, g) for g in groups]
    if not items:
        raise PTQError("no group given; pass a list of node names or a Subgraph(start, end)")
    qm = engine.qmodel
    out = {}
    for label, spec in items:
        if isinstance(spec, dict) and set(spec) >= {"from", "to"}:
            spec = Subgraph(spec["from"], spec["to"], spec.get("weights", True))
        if isinstance(spec, Subgraph):
            names = subgraph_nodes(qm, spec.start, spec.end, spec.weights)
            label = label or spec.label
        else:
            members = [spec] if isinstance(spec, str) else list(spec)
            if not members:
                raise PTQError("a group is empty; give at least one node name")
            names = qm.resolve_calibration(members)
            label = label or "+".join(members)
        names = [n for n in names if n in engine._flag]
        if not names:
            raise PTQError(f"group {label!r} holds no calibration node that can be bypassed; "
                           "pass the float model to use weights stored already quantized")
        if label in out:
            raise PTQError(f"group label {label!r} repeats; give each group its own label with a dict")
        out[label] = names
    return out


def group_sensitivity(model_or_file, groups, calibrated_data=None, metrics=("cosine-similarity",),
                      output_node=None, data_num=None, float_model=None, verbose=False, progress=None):
    """Sensitivity of blocks: the output error with only each block quantized.

    Returns a :class:`Sensitivity` with ``node_type="group"``, most sensitive block first by
    the first metric (similarities ascending, errors descending);
    ``details[label]["calibration_nodes"]`` lists what each block quantizes.
    """
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    configs = resolve_groups(engine, groups)
    return rank_configs(engine, configs, metrics, output_node, data_num, "group",
                        lambda label: {"kind": "group", "calibration_nodes": list(configs[label]),
                                       "size": len(configs[label])},
                        "group sensitivity", verbose, progress)


# -- ranking confidence -------------------------------------------------------------------
@dataclasses.dataclass
class Confidence(JsonResult):
    """How stable a sensitivity ranking is under resampling of the calibration samples.

    ``nodes[name]``: ``mean``, ``std``, ``min``, ``max`` of the per-sample values, ``rank``
    (1 = most sensitive, by the mean over samples), ``rank_low``/``rank_high`` (the 5th and
    95th percentile of the bootstrap ranks) and ``top_k_frequency`` (share of resamples in
    which the node is in the top ``k``). ``top_k_set_frequency`` is the share of resamples
    whose top-``k`` set equals ``top_k``; ``stable`` is whether it reaches ``stable_at``
    (None with fewer than two samples, where nothing can be said).
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

    def __bool__(self):
        return bool(self.stable)


    def rows(self):
        return [{"node": n, **v} for n, v in self.nodes.items()]


def ranking_confidence(sensitivity, k=5, resamples=1000, seed=0, metric=None, stable_at=0.9,
                       annotate=True):
    """Bootstrap the per-sample values of a :class:`Sensitivity` over samples.

    Nodes are ranked by their mean per-sample value (the headline ranking pools samples
    instead; ``pooled_top_k`` shows its top ``k`` beside). With ``annotate`` the spread (std
    over samples) and the 5-95% rank interval go into ``sensitivity.details[node]``.
    Returns a :class:`Confidence`, nodes in mean-rank order.
    """
    if not isinstance(sensitivity, Sensitivity):
        raise PTQError("ranking_confidence needs a Sensitivity result (from get_sensitivity_of_nodes, "
                       "group_sensitivity or Sensitivity.load)")
    m = get_metrics(metric or (sensitivity.metrics[0] if sensitivity.metrics else "cosine-similarity"))[0]
    names = list(sensitivity)
    if not names:
        raise PTQError("the sensitivity result ranks no node; nothing to assess")
    rows = []
    for n in names:
        per_sample = sensitivity.details.get(n, {}).get("per_sample", {}).get(m.name)
        if per_sample is None:
            raise PTQError(f"the sensitivity result has no per-sample {m.name} values for {n!r}; "
                           f"compute it with metric {m.name!r} among its metrics")
        rows.append([float(v) for v in per_sample])
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise PTQError("nodes of the sensitivity result were scored on different numbers of samples; "
                       "recompute it in one run")
    values = np.asarray(rows, dtype=np.float64)  # [nodes, samples]
    n_nodes, n_samples = values.shape
    k = max(1, min(int(k), n_nodes))
    keyed = _keys(values, m)
    if n_samples == 0:
        raise PTQError("the sensitivity result holds no per-sample values; score at least one sample")
    means = np.array([r[~np.isnan(r)].mean() if (~np.isnan(r)).any() else np.nan for r in values])
    order = np.argsort(keyed.mean(axis=1), kind="stable")
    rank_of = np.empty(n_nodes, dtype=int)
    rank_of[order] = np.arange(1, n_nodes + 1)
    top_k = [names[i] for i in order[:k]]
    pooled_top_k = names[:k]

    nodes = {}
    if n_samples >= 2:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, n_samples, size=(int(resamples), n_samples))
        boot = keyed[:, picks].mean(axis=2)  # [nodes, resamples], lower key = more sensitive
        boot_rank = np.argsort(np.argsort(boot, axis=0, kind="stable"), axis=0, kind="stable") + 1
        in_top = boot_rank <= k
        top_set = set(order[:k].tolist())
        same_set = np.array([set(np.flatnonzero(in_top[:, r]).tolist()) == top_set
                             for r in range(in_top.shape[1])])
        set_freq = float(same_set.mean())
        stable = set_freq >= stable_at
        freq = in_top.mean(axis=1)
        low = np.percentile(boot_rank, 5, axis=1)
        high = np.percentile(boot_rank, 95, axis=1)
        unstable = [names[i] for i in order if 1 - stable_at < freq[i] < stable_at]
    else:
        set_freq, stable, unstable = None, None, []
        freq = low = high = None
    for i in order:
        row = values[i]
        finite = row[np.isfinite(row)]
        nodes[names[i]] = {
            "mean": float(means[i]), "std": float(np.std(finite)) if finite.size else float("nan"),
            "min": float(finite.min()) if finite.size else float("nan"),
            "max": float(finite.max()) if finite.size else float("nan"),
            "rank": int(rank_of[i]),
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
                   f"{resamples} resamples of the {n_samples} samples: stable")
    else:
        who = f"; {', '.join(unstable)} move in and out of it" if unstable else ""
        message = (f"the top {k} is the same in only {set_freq:.0%} of {resamples} resamples of the "
                   f"{n_samples} samples{who}: do not trust its order, add samples or compare with "
                   "group sensitivity")
    return Confidence(metric=m.name, samples=n_samples, k=k, resamples=int(resamples), top_k=top_k,
                      top_k_set_frequency=set_freq, stable=stable, stable_at=stable_at,
                      unstable_nodes=unstable, nodes=nodes, pooled_top_k=pooled_top_k, message=message)


def _keys(values, metric):
    """Sort keys, lower = more sensitive; NaN counts as the most sensitive (as in sort_key).

    Infinities (an SQNR of a node without error) become large finite keys so that means of
    keys stay ordered instead of turning into inf - inf = NaN.
    """
    keys = values if metric.higher_is_better else -values
    return np.nan_to_num(keys, nan=-_BIG, posinf=_BIG, neginf=-_BIG)


_BIG = 1e30


# -- command line -----------------------------------------------------------------------------
def confidence_rows(conf):
    """Table rows of a :class:`Confidence`, mean-rank order; bootstrap columns only when
    there were samples enough to resample."""
    rows = []
    for name, v in conf.nodes.items():
        row = {"node": name, "rank": v["rank"], f"mean {conf.metric}": v["mean"], "spread (std)": v["std"],
               "min": v["min"], "max": v["max"]}
        if v["rank_low"] is not None:
            row["rank 5-95%"] = f"{v['rank_low']:g}-{v['rank_high']:g}"
            row[f"in top {conf.k}"] = f"{v['top_k_frequency']:.0%}"
        rows.append(row)
    return rows


def print_confidence(sensitivity, k, limit=None):
    """Print the spread of each node over samples and whether the top ``k`` holds; returns
    the :class:`Confidence` (it also annotates ``sensitivity.details``)."""
    from .tables import format_table

    conf = ranking_confidence(sensitivity, k=k)
    rows = confidence_rows(conf)
    columns = list(rows[0]) if rows else ["node"]
    print(f"ranking confidence ({conf.metric} per sample, {conf.samples} sample(s), {conf.resamples} resamples):")
    print(format_table(rows, columns, limit))
    print(conf.message)
    return conf


def _cli_groups(args):
    """The groups of ``-g`` and ``--from/--to``, checked before any model is loaded."""
    groups = []
    for entry in args.group or []:
        members = [m.strip() for m in entry.split(",")]
        if not all(members):
            raise PTQError(f"group {entry!r} has an empty node name; separate node names with single commas")
        groups.append(members)
    starts, ends = args.start or [], args.end or []
    if len(starts) != len(ends):
        raise PTQError(f"--from and --to come in pairs, got {len(starts)} --from and {len(ends)} --to")
    groups += [Subgraph(s, e, not args.no_weights) for s, e in zip(starts, ends)]
    if not groups:
        raise PTQError("no group given; pass -g NODE[,NODE...] (one group per entry) or --from TENSOR --to TENSOR")
    return groups


def _register():
    from . import cli
    from .tables import format_table

    @cli.subcommand("group-sensitivity", "rank blocks of nodes by the output error when only the block is "
                    "quantized: nodes given together, or the subgraph between two tensors")
    def cmd_group_sensitivity(args):
        groups = _cli_groups(args)
        result = group_sensitivity(cli._engine(args), groups, metrics=args.metrics, output_node=args.output_node,
                                   progress=not args.quiet)
        rows = [{"group": label, **values, "size": result.details[label]["size"],
                 "calibration nodes": result.details[label]["calibration_nodes"]} for label, values in result.items()]
        print(format_table(rows, ["group", *result.metrics, "size", "calibration nodes"], args.top))
        if args.confidence:
            print_confidence(result, args.confidence, args.top)
        if args.json:
            print(f"wrote {result.save(args.json)}")

    def configure(p):
        cli._common(p)
        p.add_argument("-g", "--group", nargs="+", action="extend", default=None, metavar="NODE[,NODE...]",
                       help="one group per entry: calibration or normal nodes joined by commas, quantized together")
        p.add_argument("--from", dest="start", action="append", default=None, metavar="TENSOR",
                       help="a block's input tensor: the group is every calibration node between it and --to "
                            "(repeat --from/--to for several blocks)")
        p.add_argument("--to", dest="end", action="append", default=None, metavar="TENSOR",
                       help="a block's output tensor (the pair quantizing it belongs to the next block)")
        p.add_argument("--no-weights", action="store_true",
                       help="--from/--to blocks without the weights their nodes read")
        p.add_argument("-m", "--metrics", nargs="+", default=["cosine-similarity"], metavar="METRIC",
                       help="metrics, the first sorts the ranking. Default: cosine-similarity")
        p.add_argument("-o", "--output-node", nargs="+", default=None, metavar="OUTPUT",
                       help="outputs to compare (a tensor or a slice 'name=out[:, 0:4]'). Default: every model output")
        add_confidence_option(p)
        p.add_argument("--top", type=cli._positive_int, default=None, help="print only the top N rows. Default: all")
        p.add_argument("--json", default=None, metavar="OUT", help="also save the result as JSON")

    cmd_group_sensitivity.configure = configure


def add_confidence_option(p):
    """``--confidence [K]``, shared by group-sensitivity and get-sensitivity-of-nodes."""
    from .cli import _positive_int

    p.add_argument("--confidence", nargs="?", const=5, type=_positive_int, default=None, metavar="K",
                   help="also resample the samples (bootstrap) to print each node's spread over samples and "
                        "whether the top K (default 5) order is stable; needs several samples")


_register()

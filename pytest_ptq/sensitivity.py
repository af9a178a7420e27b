"""Node sensitivity: the error of the model output when only one node is quantized.

The headline value of a node, per metric, pools every selected sample (the metric of the
samples concatenated) and takes the worst over the compared outputs (the lowest similarity
or the highest error). Per-output and per-sample values are kept beside it.
"""

from __future__ import annotations

from collections import defaultdict
import json
import math
from pathlib import Path

import numpy as np

from . import __version__, params
from .engine import engine_for
from .errors import FLOAT_MODEL_OPTION, PTQError, shown, unknown
from .metrics import NO_VALUES, Pooled, Reference, Scratch, by_output, get_metrics
from .model.formats import SHAPE_ONLY
from .outputs import parse_outputs
from .progress import Progress
from .results import json_restore, read_from, save_result
from .tables import format_table, listed

__all__ = ["Sensitivity", "get_sensitivity_of_nodes", "engine_for", "sample_indices", "rank_configs",
           "reached_outputs", "held_outputs", "confirmed_text"]


def sample_indices(engine, data_num):
    """The samples an analysis uses: the first ``data_num`` of the engine's data (all when
    None). This is where ``data_num`` is applied."""
    if engine.data is None:
        raise PTQError("no calibration data was given; pass calibrated_data (a folder or a mapping)")
    return list(range(len(engine.data.first(data_num))))


def targets_for(engine, node_type, interested_nodes=None):
    """``{target name: calibration nodes quantized}`` for a node type, in graph order (in the
    order given, with ``interested_nodes``)."""
    qm = engine.qmodel
    params.node_type(node_type)
    if node_type == "node":
        operators = (name for name in qm.normal if qm.ranks(name))
        targets = {name: engine.gated(pairs) for name in operators if (pairs := qm.quantizing(name))}
        # a pair no operator reads or computes is a row of its own, else no config would hold it
        targets.update({name: engine.gated([name]) for name in qm.unowned if qm.calibration[name].bypassable})
    else:
        targets = {c.name: [c.name] for c in qm.of_kind(node_type) if c.bypassable}
    if interested_nodes is not None:
        interested_nodes = params.names(interested_nodes, "interested_nodes")
        if not interested_nodes:  # an empty list ranking every node would read as those asked for
            raise PTQError("interested_nodes is empty; name the nodes to rank, or leave it out to rank every node")
        chosen = {}
        for name in interested_nodes:
            if name in targets:
                chosen[name] = targets[name]
            elif name in qm.calibration and qm.calibration[name].kind == node_type:
                raise stored_quantized(qm, f"weight {name!r}")
            elif name in qm.normal and qm.passes_on(name):
                fed = qm.through_casts([name])
                raise PTQError(f"node {name!r} is a Cast between float types; the ranking names the operators its pairs "
                               + (f"quantize the inputs of ({', '.join(map(repr, fed))}): rank those" if fed else
                                  "belong to (the one whose output it casts): rank that"))
            elif name in qm.normal and qm.normal[name].op_type in SHAPE_ONLY:
                raise PTQError(f"node {name!r} ({qm.normal[name].op_type}) reads only the shape of its input, which "
                               "quantization does not change; rank the nodes that read its values")
            elif name in qm.normal and node_type == "node":  # an operator no pair reads or writes
                raise PTQError(f"node {name!r} ({qm.normal[name].op_type}) of {qm.source!r} reads no quantized input "
                               "and writes no quantized output, so quantization changes nothing of its own: it runs "
                               "in float in every config; rank the nodes around it (`ptq-debug list-nodes MODEL` "
                               "lists which read Q/DQ pairs)")
            elif name in qm.calibration or name in qm.normal:
                kinds = {"node": "an operator (node type 'node')", "weight": "a weight node",
                         "activation": "an activation node"}
                raise PTQError(f"node {name!r} is {kinds[_kind_of(qm, name)]}, not {kinds[node_type]}; use "
                               f"node_type={_kind_of(qm, name)!r} "
                               f"(-t {_kind_of(qm, name)}) or pick from the {params.nodes_of_type(node_type)}")
            else:
                raise unknown("node", name, list(targets))
        targets = chosen
    return {k: v for k, v in targets.items() if v}


def stored_quantized(qm, what):
    """The PTQError for ``what`` (weights of ``qm``) stored already quantized, which no config
    can bypass without the float model."""
    if qm.aligned:
        return PTQError(f"{what} of {qm.source!r}, stored already quantized (DequantizeLinear only) and matched by no "
                        "weight of the float model given, cannot be bypassed; check that it is the float model this "
                        "one was quantized from")
    return PTQError(f"{what} of {qm.source!r}, stored already quantized (DequantizeLinear only), cannot be "
                    f"bypassed; pass the float model ({FLOAT_MODEL_OPTION}) to recover the float weights")


def _kind_of(qm, name):
    return qm.calibration[name].kind if name in qm.calibration else "node"


class Sensitivity(dict):
    """Ordered ``{node: {metric: value}}``, most sensitive first by the first metric.

    ``details[node]`` holds ``per_output`` ({output: {metric: value}}), ``per_sample``
    ({metric: [value per sample]}) and descriptive fields (kind, threshold, bit, feeds).
    ``sample_indices``: the sample of the data each per-sample column is, the same for every
    node (empty in a screened ranking saved before they were recorded, whose lists ran in the
    order scored; one on every sample saved then is read as on the first ``samples``); a node
    scored on fewer of them (a screened ranking) has None in the others' columns and lists its
    own in ``details[node]["scored_samples"]``.
    ``samples``: the samples every node was scored on; ``confirmed``: the top nodes re-scored
    on all ``confirmed_samples`` samples (see :mod:`~pytest_ptq.screening`), first, in that order.
    """

    def __init__(self, node_type="node", metrics=(), outputs=(), samples=0, model="", details=None,
                 confirmed=(), confirmed_samples=0, sample_indices=()):
        super().__init__()
        self.node_type, self.metrics, self.outputs = node_type, list(metrics), list(outputs)
        self.samples, self.model, self.details = samples, model, dict(details or {})
        self.confirmed, self.confirmed_samples = list(confirmed), confirmed_samples
        self.sample_indices = list(sample_indices)

    @property
    def ranking(self):
        return list(self)

    def rows(self):
        rows = []
        for name, values in self.items():
            row = {"node": name, **values}
            d = self.details.get(name, {})
            for key in ("feeds", "threshold", "bit", "op_type", "spread"):
                if key in d:
                    row[key] = d[key]
            rows.append(row)
        return rows

    def table(self, limit=None, threshold="threshold"):
        """The seed's table: node, metrics, then threshold/bit (activation) and fed nodes;
        ``limit``: the first that many rows (None: all); ``threshold``: the heading of the
        quantization range's largest magnitude (the seed's word; beside a check's own
        threshold, another)."""
        limit = None if limit is None else params.whole(limit, "limit", minimum=0)
        cols = ["node"] + list(self.metrics)
        if self.node_type == "activation":
            cols += [threshold, "bit"]
        if self.node_type in ("weight", "activation"):
            cols += ["feeds"]
        else:
            cols += ["op_type"]
        rows = [{**r, threshold: r["threshold"]} if "threshold" in r else r for r in self.rows()]
        unmeasured = [n for n in self if "no_values" in self.details.get(n, {})]
        for r in rows:
            if r["node"] in unmeasured:
                r.update(dict.fromkeys(self.metrics, NO_VALUES))
        table = format_table(rows, cols, limit)
        if self.confirmed_samples:
            table += f"\n({self._screened()})"
        alone = [n for n in self if "unowned" in self.details.get(n, {})]
        if alone:
            table += (f"\nQ/DQ: a pair no operator reads or computes ({', '.join(alone[:3])}"
                      f"{' ...' if len(alone) > 3 else ''}; {self.details[alone[0]]['unowned']!r} straight to a model "
                      "output), ranked on its own")
        reasons = {}
        for n in unmeasured:
            reasons.setdefault(self.details[n]["no_values"], []).append(n)
        for why, names in reasons.items():  # a figure would read as a perfect score, which nothing measured
            table += (f"\n{NO_VALUES}: quantizing {', '.join(names[:3])}{' ...' if len(names) > 3 else ''} alone "
                      f"{why}; listed last")
        broken = [n for n, v in self.items() if any(isinstance(x, float) and math.isnan(x) for x in v.values())]
        if broken:
            table += (f"\nnan: quantizing the node alone makes the model outputs non-finite (NaN or Inf), the worst "
                      f"there is ({len(broken)} node(s): {', '.join(broken[:3])}{' ...' if len(broken) > 3 else ''})")
        return table

    def rescored(self):
        """The nodes of a screened ranking (screening.py) re-scored on all ``confirmed_samples``
        samples beside the ``confirmed`` top: their outputs held no values on the samples they
        were ranked on. Those with no figure even so are not among them."""
        if not self.confirmed_samples:
            return []
        return [name for name in self if name not in self.confirmed and "no_values" not in self.details.get(name, {})
                and self.details.get(name, {}).get("samples") == self.confirmed_samples]

    def _screened(self):
        """What a screened ranking scored its nodes on (screening.py), in the table's words."""
        on = {}  # the nodes with a figure beside those on every sample (the no-values line names the others)
        for name in self:
            d = self.details.get(name, {})
            if name in self.confirmed or "no_values" in d or d.get("samples") in (None, self.confirmed_samples):
                continue
            on[d["samples"]] = on.get(d["samples"], 0) + 1
        rest = on.pop(self.samples, 0)
        more = len(self.rescored())
        # the sentence screening says of the whole run, of this ranking's type alone
        said = confirmed_text({self.node_type: len(self.confirmed)}, {self.node_type: more}, self.confirmed_samples)
        ahead = bool(self.confirmed or more)
        parts = [said] + [f"the {'next' if ahead or j else 'top'} {count} on {n}" for j, (n, count) in enumerate(on.items())]
        if len(parts) == 1 and not ahead:  # confirming none (confirm=0): no top for "the rest" to follow
            return f"{said}; every node ranked on {self.samples}"
        return ", ".join(parts) + (f"; the rest ranked on {self.samples}" if rest else "")

    def to_dict(self):
        return {"tool": "pytest-ptq", "version": __version__, "model": self.model,
                "node_type": self.node_type, "metrics": list(self.metrics), "outputs": list(self.outputs),
                "samples": self.samples, "ranking": list(self),
                **({"sample_indices": self.sample_indices} if self.sample_indices else {}),
                "values": {k: dict(v) for k, v in self.items()}, "details": self.details,
                **({"confirmed": self.confirmed, "confirmed_samples": self.confirmed_samples}
                   if self.confirmed_samples else {})}

    def save(self, path):
        """Write the result as JSON (sorted keys, ranking order kept in ``ranking``)."""
        return save_result(self, self.to_dict(), path, sort_keys=True)

    @classmethod
    def from_dict(cls, d):
        """The ranking :meth:`to_dict` wrote; anything else is refused in one sentence."""
        try:
            return cls._from_dict(d)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise PTQError(f"not a saved sensitivity ranking ({type(exc).__name__}: {shown(str(exc))}); pass what "
                           "Sensitivity.to_dict returned, or read a file with Sensitivity.load") from None

    @classmethod
    def _from_dict(cls, d):
        get_metrics(d["metrics"])  # a metric this version does not know is no ranking it can use
        s = cls(node_type=d["node_type"], metrics=d["metrics"], outputs=d.get("outputs", []),
                samples=d.get("samples", 0), model=d.get("model", ""),
                details={k: _restored(k, v) for k, v in d.get("details", {}).items()},
                confirmed=d.get("confirmed", ()), confirmed_samples=d.get("confirmed_samples", 0),
                sample_indices=d.get("sample_indices", ()))
        if "sample_indices" not in d and not s.confirmed_samples and all(
                len(v) == s.samples for det in s.details.values() for v in det.get("per_sample", {}).values()):
            # saved before they were recorded: a ranking on every sample scored the first
            # ``samples`` in order (a screened one's lists ran in the order scored: left unknown)
            s.sample_indices = list(range(s.samples))
        for name in d["ranking"]:
            dict.__setitem__(s, name, json_restore(d["values"][name]))
        return s

    @classmethod
    def _from_seed(cls, d):
        """The seed's own JSON of a ranking, ``{node: {metric: value}}`` (``json.dumps`` of its
        return value), in its order; the node type unknown."""
        metrics = list(next(iter(d.values())))
        get_metrics(metrics)
        s = cls(node_type="unknown", metrics=metrics)
        for name, values in d.items():
            dict.__setitem__(s, name, {m: float(values[m]) for m in metrics})
        return s

    @classmethod
    def load(cls, path):
        """A ranking saved by :meth:`save` (or ``--json``), or the seed's ``{node: {metric:
        value}}``."""
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8-sig"))
            if isinstance(d, dict) and d and "ranking" not in d and all(
                    isinstance(v, dict) and v and all(isinstance(x, (int, float)) for x in v.values())
                    for v in d.values()):
                return cls._from_seed(d)
            return cls._from_dict(d)
        except PTQError as exc:
            raise PTQError(f"sensitivity file {str(path)!r} cannot be used: {exc}") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            # a JSON list, a number or a nesting deeper than Python's stack instead of a saved ranking
            why = (f"it has no {shown(exc.args[0])} entry" if isinstance(exc, KeyError) and exc.args else
                   f"{type(exc).__name__}: {shown(str(exc))}")
            raise PTQError(f"sensitivity file {str(path)!r} cannot be read ({why}); write it with Sensitivity.save "
                           "or --json") from None


# the details that hold measurements, where json_safe wrote a non-finite float as "inf" or
# "nan"; the rest are names (feeds, input, op_type, calibration_nodes), which a model may spell
# "inf" or "nan" too, and came back as floats
_MEASURED = ("threshold", "spread", "rank_interval", "per_output", "per_sample")


def _restored(node, details):
    """One node's saved details, with the special floats back in its measurements only; its
    per-sample values, which the confidence reads as numbers, checked to be numbers (None on a
    sample where no values were compared): a file edited by hand is refused in one sentence."""
    if not isinstance(details, dict):
        raise PTQError(f"the details of node {node!r} must be a mapping, got {shown(details)}")
    out = {k: json_restore(v) if k in _MEASURED else v for k, v in details.items()}
    per_sample = out.get("per_sample", {})
    if not isinstance(per_sample, dict):
        raise PTQError(f"the per-sample values of node {node!r} must be a mapping of metric names to lists, got "
                       f"{shown(per_sample)}")
    for metric, values in per_sample.items():
        if not isinstance(values, list) or not all(
                v is None or isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise PTQError(f"the per-sample {metric} values of node {node!r} must be a list of numbers (null where "
                           f"no values were compared), got {shown(values)}")
    return out


def confirmed_text(top, rescored, of):
    """What screening (screening.py) re-scored on all ``of`` samples, in one clause: ``top``
    and ``rescored`` are ``{node type: count}`` of the top confirmed and of those re-scored
    because their outputs held no values on the samples they were ranked on; per node type
    where the types differ. The run's sentence and each ranking's table line both say it."""
    counts = set(top.values())
    if counts == {0} or not counts:
        said = f"none confirmed on all {of}"
    elif len(counts) == 1:
        said = f"the top {counts.pop()}{' of each' if len(top) > 1 else ''} confirmed on all {of}"
    else:
        said = f"the top {_per_type(top)} confirmed on all {of}"
    more = {t: n for t, n in rescored.items() if n}
    if more:
        said += (f", and {_per_type(more, 'more ')} on all {of}, whose outputs held no values on the samples "
                 "they were ranked on")
    return said


def _per_type(counts, word=""):
    """"3 weight and 10 activation nodes": ``{node type: count}``, the types counting none left out."""
    shown = [(t, n) for t, n in counts.items() if n]
    return (f"{' and '.join(f'{n} {word}{params.KIND_WORDS.get(t, t)}' for t, n in shown)} "
            f"node{'' if len(shown) == 1 and shown[0][1] == 1 else 's'}")


def score_configs(engine, configs, metrics, specs, indices, progress=None, alternative=False, reaches=None):
    """Each config's metrics pooled over the samples: ``{label: [Pooled, one per metric, with
    its samples' own figures]}`` (:class:`~pytest_ptq.metrics.Pooled`).

    ``configs``: ``{label: calibration nodes quantized}`` (on their alternative fake-quant,
    see :meth:`Engine.with_alternatives`, when ``alternative``). Samples are the outer loop so
    that only one sample's (or one group's, see :meth:`Engine.batches`) tensors are alive at
    a time; the float reference of each is computed once and shared by every config.
    Per-sample figures follow ``indices``. Where each config compiles a form of its own
    (:attr:`Engine.config_major`), configs are the outer loop instead, so that it compiles
    once, not once per sample.

    ``reaches``: ``{label: names of the outputs of specs it may change}`` (:func:`reached_outputs`),
    or None. Where given, a config is not run on a sample (a group) on which none of those
    outputs holds values in float: nothing it changes is compared there, and every other
    output is the float one, so the sample is scored with the float reference as its output,
    the figures a run gives, for no run.
    """
    from .engine.batching import split

    tensors = list(dict.fromkeys(s.tensor for s in specs))
    pools = {label: [Pooled(m, specs, per_sample=True) for m in metrics] for label in configs}
    groups = engine.batches(indices, tensors)
    scratch, prepared = Scratch(), {}

    def references(group, count):
        """``(float values, [{output: Reference}, one per sample])`` of ``group``."""
        # one group's at a time: in a sample-major loop every config compares with them
        if group not in prepared:
            prepared.clear()
            ref = engine.reference(group, tensors)
            prepared[group] = (ref, [Reference.of_outputs(specs, one, scratch)
                                     for one in (split(ref, count) if count > 1 else [ref])])
        return prepared[group]

    def counted(group):
        return len(group) if isinstance(group, tuple) else 1

    def runs(label, group):
        """Whether ``label`` is run on ``group``: some output it may change holds values there."""
        if reaches is None:
            return True
        return any(one[name].array.size for one in references(group, counted(group))[1] for name in reaches[label])

    def score(label, group, out):
        count = counted(group)
        for ref, got in zip(references(group, count)[1], split(out, count) if count > 1 else [out]):
            for pool in pools[label]:
                pool.add_prepared(ref, got)
        if progress is not None:
            progress.advance(count)

    if engine.config_major:
        for label, q in configs.items():
            for group in groups:
                score(label, group, engine.run(group, q, tensors, alternative=q if alternative else ())
                      if runs(label, group) else references(group, counted(group))[0])
    else:
        for group in groups:
            run = [label for label in configs if runs(label, group)]
            outs = engine.run_many(group, [(configs[label], configs[label] if alternative else ()) for label in run],
                                   tensors)
            for label, out in zip(run, outs):
                score(label, group, out)
            for label in configs:
                if label not in run:
                    score(label, group, references(group, counted(group))[0])
    return pools


def get_sensitivity_of_nodes(model_or_file, metrics=("cosine-similarity",), calibrated_data=None,
                             output_node=None, node_type="node", data_num=None, verbose=False,
                             interested_nodes=None, float_model=None, progress=None):
    """Sensitivity of each node of ``node_type``: the output error with only it quantized.

    For a normal node, its calibration inputs are quantized together (with a pair on a model
    output it writes, which no node reads). Returns a
    :class:`Sensitivity`, most sensitive first by the first metric (similarities
    ascending, errors descending).
    """
    verbose = params.flag(verbose, "verbose")
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    metric_objs = get_metrics(metrics)
    specs = parse_outputs(output_node, engine)
    indices = sample_indices(engine, data_num)
    targets = targets_for(engine, node_type, interested_nodes)
    qm = engine.qmodel
    if not targets and node_type == "weight" and qm.of_kind("weight"):  # an empty ranking would read as "none"
        raise stored_quantized(qm, f"all {len(qm.of_kind('weight'))} weights")
    result = rank_configs(engine, targets, metric_objs, specs, indices, node_type,
                          lambda name: describe(qm, name, node_type, targets[name]),
                          f"sensitivity ({node_type})", verbose if progress is None else progress)
    if verbose:
        print(result.table())
    return result


def rank_configs(engine, configs, metric_objs, specs, indices, node_type, describe, desc, progress=False):
    """Score ``{label: calibration nodes quantized}`` on the samples ``indices`` and rank them
    in a :class:`Sensitivity`, worst first by the first of ``metric_objs``; ``specs``: the
    parsed outputs; ``describe(label)`` gives each entry's descriptive details."""
    with Progress(len(indices) * len(configs), desc, enabled=progress) as bar:
        scores = score_configs(engine, configs, metric_objs, specs, indices, bar)
    return ranked(engine, scores, metric_objs, specs, list(indices), node_type, describe, configs)


def merge_scores(into, more):
    """Add the scores ``more`` of further samples to ``into`` (both from :func:`score_configs`,
    same labels, metrics and outputs), in place."""
    for label, pools in more.items():
        for pool, added in zip(into[label], pools):
            pool.merge(added)
    return into


def ranked(engine, scores, metric_objs, specs, scored, node_type, describe, configs, columns=None):
    """The :class:`Sensitivity` of ``scores`` (from :func:`score_configs` on the samples
    ``scored``, in the order scored, of ``configs``: ``{label: calibration nodes quantized}``),
    worst first by the first of ``metric_objs``. Per-sample values are laid on the samples
    ``columns`` (default ``scored``), None in those not scored, so that a column is the same
    sample for every ranking of them. An entry whose quantization reaches only outputs that
    held no values on any sample, or none of the outputs compared, has no figure (None, per
    sample too; ``details[label]["no_values"]`` says why) and comes last: its metrics read no
    change measured as a perfect score."""
    columns = list(scored if columns is None else columns)
    result = read_from(Sensitivity(node_type=node_type, metrics=[m.name for m in metric_objs],
                                   outputs=[s.name for s in specs], samples=len(scored),
                                   model=engine.qmodel.source, sample_indices=columns), engine.inputs())
    at = {i: j for j, i in enumerate(scored)}
    place = [at.get(i) for i in columns]
    fewer = {"scored_samples": [i for i in columns if i in at]} if len(at) < len(columns) else {}
    entries, unmeasured = {}, set()
    reached = reached_outputs(engine.qmodel, configs, specs, scores)
    for name, pools in scores.items():
        per_output, empty = by_output(pools), pools[0].empty()
        entries[name] = {m.name: pool.value() for m, pool in zip(metric_objs, pools)}
        hit = reached[name]
        # a sample on which every output it reaches held no values compared none of its change:
        # the other outputs' figure there (identical, perfect) is no figure of it
        result.details[name] = {**describe(name), "per_output": per_output, **fewer,
                                "per_sample": {m.name: [None if j is None or not set(hit) & pool.held[j]
                                                        else pool.samples[j] for j in place]
                                               for m, pool in zip(metric_objs, pools)}}
        why = _no_values(hit, specs, empty)
        if why:  # its samples' figures too compare nothing (confidence would read them as perfect)
            entries[name] = dict.fromkeys(entries[name])
            result.details[name]["no_values"] = why
            result.details[name]["per_sample"] = {m.name: [None] * len(columns) for m in metric_objs}
            unmeasured.add(name)
    first = metric_objs[0]
    for name in sorted(entries, key=lambda n: (1, 0) if n in unmeasured else (0, first.sort_key(entries[n][first.name]))):
        dict.__setitem__(result, name, entries[name])
    return result


def reached_outputs(qm, configs, specs, labels=None):
    """``{label: names of the outputs of specs that quantizing configs[label] may change}``,
    in the order of ``specs``, for the labels ``labels`` (default: all of ``configs``)."""
    # the outputs each tensor may change: every output's sources walked once, not every entry's
    # consequences (a walk of the graph per entry, on a model of thousands of pairs)
    changes = defaultdict(set)
    for s in specs:
        for t in qm.upstream(s.tensor):
            changes[t].add(s.name)
    return {label: _reached(qm, configs[label], specs, changes) for label in (configs if labels is None else labels)}


def held_outputs(engine, specs, indices):
    """The names of the outputs of ``specs`` that hold values in float on some of the samples
    ``indices``, read from the float references (cached, in the groups scoring runs them in:
    a ranking scoring these samples next computes none again)."""
    from .engine.batching import split

    tensors = list(dict.fromkeys(s.tensor for s in specs))
    held = set()
    for group in engine.batches(indices, tensors):
        ref = engine.reference(group, tensors)
        for one in split(ref, len(group)) if isinstance(group, tuple) else [ref]:
            held.update(s.name for s in specs if np.size(s.take(one[s.tensor])))
    return [s.name for s in specs if s.name in held]


def _reached(qm, quantized, specs, changes):
    """The names of the outputs of ``specs`` that quantizing ``quantized`` may change, in their
    order. ``changes``: ``{tensor: names of the outputs computed from it}``."""
    reached = set().union(*(changes.get(t, ()) for c in quantized for t in qm.calibration[c].outputs))
    return [s.name for s in specs if s.name in reached]


def _no_values(hit, specs, empty):
    """Why quantizing what reaches the outputs ``hit`` (:func:`_reached`) changes no value
    compared: it reaches none of the outputs of ``specs``, or those it reaches all are among
    ``empty`` (``{output: shape}`` of those that held no values); "" where it reaches one
    holding values."""
    if not hit:
        return f"changes none of the outputs compared ({listed([s.name for s in specs], 3)})"
    if any(n not in empty for n in hit):
        return ""
    shown = ", ".join(f"{n!r} (shape {empty[n]})" for n in hit)
    return f"changes only {shown}, which hold{'s' if len(hit) == 1 else ''} no values on any sample"


def describe(qm, name, node_type, quantized):
    """The descriptive details of a ranked entry: op type and calibration nodes of a normal
    node; kind, threshold, bit, the operators it counts for (:meth:`QuantModel.counts_for`: a
    requantize chain's earlier pair, those reading the chain) and granularity of a calibration node."""
    if node_type == "node" and name in qm.unowned:
        c = qm.calibration[name]
        return {"kind": "node", "op_type": "Q/DQ", "calibration_nodes": list(quantized),
                "unowned": qm.shown_name(c.input)}
    if node_type == "node":
        n = qm.normal[name]
        return {"kind": "node", "op_type": n.op_type, "calibration_nodes": list(quantized)}
    c = qm.calibration[name]
    return {"kind": c.kind, "threshold": c.shown_threshold, "bit": c.bit, "feeds": qm.counts_for(name),
            "per_channel": c.per_channel, "input": qm.shown_name(c.input)}

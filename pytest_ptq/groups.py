"""Blocks of nodes scored together.

Group sensitivity quantizes a whole block (a residual block, an attention block) with
everything else in float, so the error it reports is the block's own, interactions
included: two nodes that are harmless alone can add up inside a block.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from . import params
from .engine import engine_for
from .errors import PTQError, shown, unknown
from .metrics import get_metrics
from .model import QuantModel
from .outputs import parse_outputs
from .sensitivity import rank_configs, sample_indices


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
    """Names of the calibration nodes between tensors ``start`` and ``end``, graph order.
    ``qmodel``: a QuantModel, an Engine, or the model's path or ModelProto."""
    weights = params.flag(weights, "weights")
    qmodel = getattr(qmodel, "qmodel", qmodel)  # an Engine's model
    if not isinstance(qmodel, QuantModel):
        qmodel = QuantModel(qmodel)
    for what, t in (("start", start), ("end", end)):
        if not isinstance(t, str):
            raise PTQError(f"a subgraph's {what} must be one tensor name, got {shown(t)}")
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
        if c.is_activation and c.input in forward:
            if c.input != end and any(o in backward for o in c.outputs):
                chosen.append(c.name)
        elif weights and any(n in on_path_names for n in c.consumers) and (
                c.kind == "weight" or _constant(qmodel, c.input)):
            # a weight, or a constant quantized as an activation (a weight an exporter shared
            # through an Identity) that a node of the block reads
            chosen.append(c.name)
    if not chosen:
        raise PTQError(f"no calibration node lies between tensors {start!r} and {end!r} in "
                       f"{qmodel.source!r}; pick a wider block")
    return chosen


def _constant(qmodel, tensor):
    """Whether ``tensor`` depends on no model input (computed from initializers only)."""
    back = _reach(tensor, lambda t: [i for i in qmodel.producer[t].input if i] if t in qmodel.producer else [])
    return not back & set(qmodel.input_names)


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
    if not isinstance(groups, (dict, list, tuple)):
        raise PTQError(f"groups must be a list of groups (node names, lists of names or Subgraphs) or a dict "
                       f"{{label: group}}, got {shown(groups)}")
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
            if not isinstance(spec, (str, list, tuple)) or not all(isinstance(n, str) for n in (
                    [spec] if isinstance(spec, str) else spec)):
                raise PTQError(f"a group must be a node name, a list of node names or a Subgraph, got {shown(spec)}")
            members = [spec] if isinstance(spec, str) else list(spec)
            if not members:
                raise PTQError("a group is empty; give at least one node name")
            names = qm.resolve_calibration(members)
            label = label or "+".join(members)
        names = engine.gated(names)
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
    verbose = params.flag(verbose, "verbose")
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    metric_objs = get_metrics(metrics)
    specs = parse_outputs(output_node, engine)
    indices = sample_indices(engine, data_num)
    configs = resolve_groups(engine, groups)
    result = rank_configs(engine, configs, metric_objs, specs, indices, "group",
                          lambda label: {"kind": "group", "calibration_nodes": list(configs[label]),
                                         "size": len(configs[label])},
                          "group sensitivity", verbose if progress is None else progress)
    if verbose:
        print(result.table())
    return result

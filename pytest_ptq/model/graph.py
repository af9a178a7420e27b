"""Reading a model and putting its graph in a form every later step can rely on.

A model is loaded once, from a path (with its external data) or copied from a ModelProto;
the user's file and object are never changed. Its graph is then topologically sorted
(some quantizers store nodes out of order, which onnxruntime accepts but a pass in graph
order would not) and every node gets a unique name (unnamed ones ``<OpType>_<k>``).
"""

from __future__ import annotations

import heapq
import os
from collections import defaultdict

import onnx

from .. import params
from ..errors import PTQError, shown


def load_model(model_or_file, what="model"):
    """Load an ONNX model from a path or return a copy of a ModelProto (never modified)."""
    if isinstance(model_or_file, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_file)
        return model, None
    if isinstance(model_or_file, bool) or not isinstance(model_or_file, (str, os.PathLike)):
        raise PTQError(f"{what} must be the path of an .onnx file or an onnx.ModelProto, got {shown(model_or_file)}")
    path = params.input_path(model_or_file, f"{what} file")
    if path.is_dir():
        raise PTQError(f"{what} {str(path)!r} is a folder; pass the .onnx file")
    if not path.is_file():
        raise PTQError(f"{what} file {str(path)!r} does not exist; pass the path of an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=True)
    except Exception as exc:  # onnx raises DecodeError, OSError, ... for a broken file
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PTQError(f"{what} file {str(path)!r} is not a readable ONNX model "
                       f"({type(exc).__name__}: {first}); check that it is a complete .onnx file with its "
                       "external data beside it") from None
    if not model.graph.node:
        raise PTQError(f"{what} file {str(path)!r} holds no graph nodes; pass an exported ONNX model")
    return model, path


def subgraphs(node):
    """The subgraphs of a node's attributes (If branches, Loop and Scan bodies)."""
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _subgraph_refs(graph, bound):
    """Names a subgraph reads from the enclosing scope."""
    bound = set(bound) | {i.name for i in graph.input} | {i.name for i in graph.initializer}
    refs = []
    for node in graph.node:
        refs += [i for i in node.input if i and i not in bound]
        for g in subgraphs(node):
            refs += [r for r in _subgraph_refs(g, bound) if r not in bound]
        bound.update(node.output)
    return refs


def node_refs(node):
    """Explicit inputs plus names read implicitly by the node's subgraphs, in order, unique."""
    refs = [i for i in node.input if i]
    for g in subgraphs(node):
        refs += _subgraph_refs(g, ())
    return list(dict.fromkeys(refs))


def sort_topologically(graph, source="the model"):
    """Reorder ``graph.node`` so every node follows the producers of what it reads; a graph
    already in order is left exactly as it is. Returns True when nodes moved."""
    nodes = list(graph.node)
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    producer = {}
    for k, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = k
    waiting, users = [0] * len(nodes), defaultdict(list)
    for k, n in enumerate(nodes):
        for r in node_refs(n):
            if r in available:
                continue
            if r not in producer:
                raise PTQError(f"node {n.name or n.op_type!r} of {source} reads tensor {r!r}, which no node, "
                               "input or initializer provides; re-export the model")
            waiting[k] += 1
            users[producer[r]].append(k)
    ready = [k for k in range(len(nodes)) if waiting[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)  # the lowest original index first keeps stored order where it is valid
        order.append(k)
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = next(nodes[k] for k in range(len(nodes)) if k not in set(order))
        raise PTQError(f"the graph of {source} has a cycle through node {stuck.name or stuck.op_type!r}; "
                       "re-export the model")
    if order == list(range(len(nodes))):
        return False
    del graph.node[:]
    graph.node.extend(nodes[k] for k in order)
    return True


def name_nodes(graph):
    """Give unnamed nodes stable names ``<OpType>_<k>`` (k counts that op type in graph order)
    and suffix repeated names, so that every result names one node."""
    taken = {n.name for n in graph.node if n.name}
    counts = defaultdict(int)
    for n in graph.node:
        if n.name:
            continue
        while True:
            candidate = f"{n.op_type}_{counts[n.op_type]}"
            counts[n.op_type] += 1
            if candidate not in taken:
                break
        n.name = candidate
        taken.add(candidate)
    seen = defaultdict(int)
    for n in graph.node:
        seen[n.name] += 1
        if seen[n.name] > 1:
            n.name = f"{n.name}__{seen[n.name] - 1}"

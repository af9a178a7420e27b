"""Weights whose DequantizeLinear onnxruntime's constant folding computed into the file,
put back in the tool's copy of the graph.

A session saving ``optimized_model_filepath`` with its constant folding on turns each
DequantizeLinear of constant codes into a float initializer holding the dequantized values:
the file no longer says the weight is quantized. Where the float model shows such a weight
to be its own rounded onto an integer grid (:func:`.align.folded_weights`), the copy holds it
again as the quantizer wrote it: int8 codes and their scale and zero point (read off the
values, :func:`.grids.stored_codes`) behind a DequantizeLinear whose output keeps the
weight's name, so every reader stays as it is. It is then a lone-DQ weight like any other,
which the float model's weight bypasses. A Conv's or Gemm's bias folded beside it is put back
the same way as int32 codes on the input scale times the weight scale. The user's file is
never changed.

The DequantizeLinear, the calibration node rankings and reports show, is named
``<weight>::DequantizeLinear`` after the tensor it gives back: the initializer a user finds
in the file by that name, one per weight (a reader's name would repeat for a weight two nodes
share, and for the bias beside it), and ``::`` says the node is the tool's, not the file's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from onnx import helper

from .graph import initializer


@dataclasses.dataclass
class Unfolded:
    """What :func:`unfold` put back: ``nodes`` each weight's DequantizeLinear name (its
    calibration node), ``codes`` each codes tensor -> the weight's name in the file."""

    nodes: dict = dataclasses.field(default_factory=dict)
    codes: dict = dataclasses.field(default_factory=dict)


def unfold(graph, weights, shared):
    """Put back ``weights`` (``{initializer: (axis, codes, scale, zero_point)}``, axis None per
    tensor) in ``graph`` (sorted topologically; it stays so) as codes + scale + zero point
    behind a DequantizeLinear written just before the weight's first reader. ``shared``: the
    large initializers' values (see :func:`.graph.externalize`): the float values leave it, large
    codes join it. Returns an :class:`Unfolded`."""
    out = Unfolded()
    if not weights:
        return out
    taken = {t for n in graph.node for t in (*n.input, *n.output)} | {i.name for i in graph.initializer}
    taken |= {i.name for i in graph.input} | {n.name for n in graph.node if n.name}

    def fresh(base):
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}__{k}"
        taken.add(name)
        return name

    kept = [i for i in graph.initializer if i.name not in weights]
    if len(kept) < len(graph.initializer):
        # rebuilt from the kept ones: deleting from a repeated field one at a time is quadratic
        del graph.initializer[:]
        graph.initializer.extend(kept)
    nodes = list(graph.node)
    first = {}  # weight -> index of its first reader
    for k, n in enumerate(nodes):
        for t in n.input:
            if t in weights and t not in first:
                first[t] = k
    added = {}  # reader index -> the DequantizeLinear nodes written before it
    for tensor, (axis, codes, scale, zero) in weights.items():
        shared.pop(tensor, None)
        names = [fresh(f"{tensor}::{part}") for part in ("codes", "scale", "zero_point")]
        graph.initializer.extend([initializer(names[0], codes, shared),
                                  initializer(names[1], np.asarray(scale, np.float32), shared),
                                  initializer(names[2], np.asarray(zero), shared)])
        node = helper.make_node("DequantizeLinear", names, [tensor], name=fresh(f"{tensor}::DequantizeLinear"),
                                **({} if axis is None else {"axis": int(axis)}))
        added.setdefault(first.get(tensor, 0), []).append(node)
        out.nodes[tensor], out.codes[names[0]] = node.name, tensor
    del graph.node[:]
    graph.node.extend(x for k, n in enumerate(nodes) for x in (*added.get(k, ()), n))
    return out

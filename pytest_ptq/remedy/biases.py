"""A quantized bias follows the node that reads it.

onnxruntime quantizes a Conv's or Gemm's bias to int32 on the grid of the node's input scale
times its weight scale, and leaves it in float where the node is excluded. So a remedy of
the node's input or weight remedies its bias too: kept in float (the node excluded), or on
the finer grid of a 16-bit input or a per-channel weight. A simulation that kept the bias
on its old grid measured a model that re-quantizing does not give: behind an input range
widened by an outlier, the old grid's rounding alone held every remedy below its target.
"""

from __future__ import annotations

import weakref

import numpy as np

from ..model import QParams
from .alternatives import float_input
from .terms import excluded_by, quantized_ops

INT32 = (-(2 ** 31), 2 ** 31 - 1)


class Biases:
    """The gated int32 biases of an engine's model and the calibration nodes they follow."""

    def __init__(self, engine):
        qm = engine.qmodel
        self.qmodel = qm
        self.feeds = {}  # bias -> its node's input and weight calibration nodes
        # the other way round, for a set's few nodes on every scored set: a normal node ->
        # its bias, a feed -> the biases of the nodes it feeds
        self.bias_of, self.fed = {}, {}
        for b in qm.calibration.values():
            readers = [n for n in b.consumers if n in qm.normal]
            if b.role != "bias" or len(readers) != 1 or not engine.is_gated(b.name):
                continue
            self.bias_of[readers[0]] = b.name
            self.feeds[b.name] = [x for x in qm.normal[readers[0]].calibration_inputs
                                  if x in qm.calibration and qm.calibration[x].role != "bias"]
            for f in self.feeds[b.name]:
                self.fed.setdefault(f, []).append(b.name)
        self._ops = None
        self._excluded = {}

    def floats(self, nodes):
        """The biases kept in float with the calibration ``nodes``: those whose node
        ``nodes_to_exclude`` names to keep them in float."""
        if not self.bias_of or not nodes:
            return []
        if self._ops is None:
            self._ops = quantized_ops(self.qmodel)
        for n in nodes:
            if n not in self._excluded:
                excluded = excluded_by(self.qmodel, self.qmodel.calibration[n], self._ops)
                self._excluded[n] = [self.bias_of[x] for x in excluded if x in self.bias_of]
        return list(dict.fromkeys(b for n in nodes for b in self._excluded[n]))

    def following(self, nodes, available):
        """The biases (among ``available``, those with an alternative) whose node's input or
        weight is among ``nodes`` run on their alternative."""
        return list(dict.fromkeys(b for n in nodes for b in self.fed.get(n, ()) if b in available))

    def alternatives(self, engine, alternatives):
        """``{bias: QParams}``: each bias whose input or weight has an alternative in
        ``alternatives``, on the grid of their scales (the alternative's where there is one),
        as onnxruntime derives it. A value beyond int32 there is clipped, as onnxruntime
        clips it, but behind a signed weight grid with zero points 0, which onnxruntime widens
        until the bias fits: the bias's grid is widened instead (the weight's is not simulated).
        No entry for a bias whose input has a per-channel alternative, which only the
        simulation makes (no quantizer derives a bias grid from one). A bias whose input and
        weight both have alternatives runs on the grid of both whichever a set turns on
        (one alternative a node): finer than onnxruntime's where one stays at 8 bit, and both
        far finer than the 8-bit grid's."""
        qm = self.qmodel
        out = {}
        for b, feeds in self.feeds.items():
            if not any(f in alternatives for f in feeds) or len(feeds) != 2:
                continue
            grids = [alternatives.get(f) or qm.calibration[f] for f in feeds]
            scales = [np.asarray(g.scale, np.float64).reshape(-1) for g in grids]
            if any(s.size > 1 for s, f in zip(scales, feeds) if qm.calibration[f].kind == "activation"):
                continue
            scale = scales[0] * scales[1]
            weight = next((g for g, f in zip(grids, feeds) if qm.calibration[f].kind == "weight"), None)
            value = float_input(engine, qm.calibration[b])
            if value is not None and weight is not None and _signed_on_zero(weight):
                scale = np.maximum(scale, np.abs(np.asarray(value, np.float64).reshape(-1)) / INT32[1])
            out[b] = QParams(scale.astype(np.float32), np.zeros_like(scale, np.float32), *INT32, "int32")
        return out


def _signed_on_zero(grid):
    """Whether a weight grid (a calibration node or QParams) is signed with every zero point 0."""
    qmin = grid.qmin if isinstance(grid, QParams) else grid.qrange[0]
    return qmin < 0 and not np.any(np.asarray(grid.zero_point))


_OF = weakref.WeakKeyDictionary()  # per engine: what its gates make of the model's biases


def biases_of(engine):
    """The :class:`Biases` of ``engine`` (built once per engine)."""
    if engine not in _OF:
        _OF[engine] = Biases(engine)
    return _OF[engine]


def with_biases(engine, alternatives):
    """``alternatives`` ({node: QParams}) and the biases that follow them
    (:meth:`Biases.alternatives`), for an engine built to run them."""
    if not alternatives:
        return alternatives
    return {**alternatives, **biases_of(engine).alternatives(engine, alternatives)}

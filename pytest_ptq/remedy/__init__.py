"""Remedy search: the cheapest set of nodes to keep in float, raise to 16 bit or quantize per
channel so that the model meets a target on data the search did not choose on, written in
onnxruntime's own terms.

The search runs on the compiled engine: keeping a node in float is leaving it out of the
quantized set; 16 bit and per channel are the node's alternative fake-quant
(:class:`~pytest_ptq.model.QParams`), chosen per run by a feed. Sets are chosen on
calibration samples (cheap, many evaluations) and accepted on held-out data, or on
calibration samples the search did not see: a gain that only the search samples show is
not a gain. The objective is an output metric or the user's task metric.

The package: :mod:`.result` (the :class:`Remedy`), :mod:`.objective` (what a set is judged
by), :mod:`.parts` (where it is chosen and where judged), :mod:`.alternatives` (which nodes
can take a remedy and its fake-quant), :mod:`.ranking` (the order moves are tried in),
:mod:`.scoring` (one set on one data set, within the budget), :mod:`.strategy` (greedy,
refinement and acceptance), :mod:`.search` (the entry point and the figures), :mod:`.terms`
(the result in onnxruntime's settings), :mod:`.requantize` (applying them to the float model
and measuring), :mod:`.producer_terms` (the result in the terms of the quantizer that made the
model: Model Optimizer, Quark, Neural Compressor, aimet-onnx), :mod:`.producer_check`
(re-quantizing with that quantizer, in its own Python, to check them), :mod:`.plot` (metric
vs cost).
"""

from __future__ import annotations

from .alternatives import (
           alternatives_for,
           candidates_for,
           channel_range_qparams,
           float_input,
           menus_for,
)
from .objective import Objective, TaskMetric, objective_for
from .plot import plot_remedy
from .producer_check import PYTHON_ENV, check_producer_terms, producer_recipe, requantize_with_producer
from .producer_terms import producer_terms
from .requantize import infer_quantize_options, requantize
from .result import DEFAULT_COSTS, MIXED, REMEDIES, Remedy
from .scoring import score
from .search import suggest_remedy
from .terms import float_tensor_name, onnxruntime_settings, quantize_static_kwargs

__all__ = [
           "DEFAULT_COSTS",
           "MIXED",
           "Objective",
           "PYTHON_ENV",
           "REMEDIES",
           "Remedy",
           "TaskMetric",
           "alternatives_for",
           "candidates_for",
           "check_producer_terms",
           "channel_range_qparams",
           "float_input",
           "float_tensor_name",
           "infer_quantize_options",
           "menus_for",
           "objective_for",
           "onnxruntime_settings",
           "plot_remedy",
           "producer_recipe",
           "producer_terms",
           "quantize_static_kwargs",
           "requantize",
           "requantize_with_producer",
           "score",
           "suggest_remedy",
]

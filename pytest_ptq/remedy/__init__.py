"""Remedy search: the fewest nodes to keep in float, raise to 16 bit or quantize per channel
so that the output meets a target, written in onnxruntime's own terms.

The search runs on the compiled engine: keeping a node in float is leaving it out of the
quantized set; 16 bit and per channel are the node's alternative fake-quant
(:class:`~pytest_ptq.model.QParams`), chosen per run by a feed. Candidates are ranked by
their sensitivity (weight and activation nodes together, most sensitive first); nodes are
added in that order until the target is met, then every member whose removal still meets
it is dropped. The value after each addition is kept as a curve, so one run also tells
how many nodes other targets would need.

The package: :mod:`.result` (the :class:`Remedy`), :mod:`.alternatives` (which nodes can take
a remedy and its fake-quant), :mod:`.search` (the search itself), :mod:`.terms` (the
result in onnxruntime's settings), :mod:`.requantize` (applying them to the float model and
measuring), :mod:`.plot` (the search curve).
"""

from __future__ import annotations

from .alternatives import (
           alternatives_for,
           candidates_for,
           channel_range_qparams,
           float_input,
)
from .plot import plot_remedy
from .requantize import infer_quantize_options, requantize
from .result import REMEDIES, Remedy
from .scoring import score
from .search import suggest_remedy
from .terms import float_tensor_name, onnxruntime_settings, quantize_static_kwargs

__all__ = [
           "REMEDIES",
           "Remedy",
           "alternatives_for",
           "candidates_for",
           "channel_range_qparams",
           "float_input",
           "float_tensor_name",
           "infer_quantize_options",
           "onnxruntime_settings",
           "plot_remedy",
           "quantize_static_kwargs",
           "requantize",
           "score",
           "suggest_remedy",
]

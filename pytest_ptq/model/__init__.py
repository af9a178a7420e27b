"""The calibrated model as the analyses see it.

- :mod:`.graph`: loading (external data; the user's file never changed), topological order,
  node names;
- :mod:`.grids`: what each quantized type represents, and its numpy fake-quant;
- :mod:`.qdq`: calibration nodes (Q/DQ pairs, lone DQs) and normal nodes (:class:`QuantModel`);
- :mod:`.align`: the float model aligned by structure and values (float weights, folded
  activations, rewrites);
- :mod:`.folded`: weights whose DequantizeLinear onnxruntime's constant folding computed into
  the file, put back as codes behind one in the tool's copy (where the alignment finds them);
- :mod:`.producers`: which quantizer made the file.

A new producer convention goes here, recognised by structure and values.
"""

from .graph import load_model, load_weightless
from .grids import GRIDS, Grid, grid_of
from .producers import Producer, detect
from .qdq import CalibrationNode, NormalNode, QParams, QuantModel

__all__ = ["QuantModel", "CalibrationNode", "NormalNode", "QParams", "load_model", "load_weightless", "Grid", "GRIDS",
           "grid_of", "Producer", "detect"]

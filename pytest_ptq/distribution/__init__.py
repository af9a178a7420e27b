"""Data distributions of chosen nodes (histograms) and per-channel box plots.

What is drawn, per node kind:

* activation calibration node: its input in the float model (every pair bypassed) over the
  chosen samples, the max |x| (triangle), the calibration range (dashed, both ends), the
  share of values outside it (clipped) and the bit width;
* weight calibration node: the float weight against the dequantized one, and the error;
  a lone DequantizeLinear whose float weight is unknown compares the dequantized weight
  with itself and says so;
* normal node: its output in the float model against the fully quantized model, and the
  error between them.

The package: :mod:`.gather` sweeps the samples once into exact statistics (memory bounded
by one sample), :mod:`.readings` says what they mean for quantization, :mod:`.plots`
draws them.
"""

from __future__ import annotations

from ..channelwise import OUTLIER_K
from ..engine import engine_for
from ..errors import PTQError
from ..progress import Progress
from .gather import BULK_TAIL, CACHE_BYTES, HIST_BINS, clip_bounds, collect, resolve_nodes, weight_arrays
from .plots import draw_channelwise, draw_distribution
from .readings import (CLIP_SHARE, FEW_LEVELS, WEAK_SQNR_DB, activation_reading, few_levels, weight_issue,
                       weight_reading)

__all__ = ["plot_distribution", "get_channelwise_data_distribution", "collect", "draw_distribution",
           "draw_channelwise", "activation_reading", "weight_reading", "weight_issue", "few_levels",
           "weight_arrays", "clip_bounds", "HIST_BINS", "CACHE_BYTES", "BULK_TAIL", "CLIP_SHARE", "FEW_LEVELS",
           "WEAK_SQNR_DB"]


def plot_distribution(save_dir, model_or_file, calibrated_data=None, nodes_list=None, data_num=None,
                      float_model=None, bins=HIST_BINS, progress=False):
    """Histograms of the chosen nodes, one PNG per node under ``save_dir``.

    Returns ``{node: statistics}`` in the order given: ``hist`` (``counts`` and ``edges``,
    ``bins`` equal-width bins over the exact min..max), ``max_abs``, ``min``, ``max``,
    ``mean``, ``std``, ``count``; for calibration nodes ``threshold``, ``range_lo``/``range_hi``
    (the representable range), ``clipped_share`` (values beyond it by more than half a step),
    ``bit``, ``dtype``; for weights and
    normal nodes the compared histograms and ``error`` with cosine, SQNR (dB) and max error.
    ``png`` is the written file. Of several nodes, one whose tensor is empty (zero-size) gets
    ``skipped`` (why) and no PNG; a single one, or every one given, raises.
    """
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    with engine.writes(save_dir) as out:
        names = resolve_nodes(engine.qmodel, nodes_list, "plot_distribution")
        dist, _ = collect(engine, names, (), data_num=data_num, bins=bins, progress=progress)
        _refuse_if_none_drawn(dist, "histogram",
                              "name nodes whose tensors hold values (`ptq-debug list-nodes MODEL` lists the nodes)")
        with Progress(len(dist), "drawing histograms", enabled=progress) as bar:  # a third of the run, said
            for d in dist.values():
                if "skipped" not in d:
                    d["png"] = draw_distribution(d, out)
                bar.advance()
    return dist


def get_channelwise_data_distribution(save_dir, model_or_file, calibrated_data=None, nodes_list=None,
                                      axis=None, data_num=None, float_model=None, outlier_k=OUTLIER_K,
                                      progress=False):
    """Box plot per channel of each calibration node's input, one PNG per node.

    ``axis`` is the channel axis (inferred when None, see :mod:`pytest_ptq.channelwise`).
    Returns ``{node: statistics}`` with lists indexed by channel (``q1``, ``median``, ``q3``,
    ``whisker_lo``/``whisker_hi`` at 1.5 IQR, ``mean``, ``min``, ``max``, ``max_abs``) and
    ``outlier_channels``: channels whose max |x| exceeds ``outlier_k`` times the median
    channel's, widest first, with ``outlier_ratios``. Of several nodes, one without a channel
    axis (a 1-D bias) gets ``{"skipped": why}`` and no PNG; a single one, or every one given, raises.
    """
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    with engine.writes(save_dir) as out:
        names = resolve_nodes(engine.qmodel, nodes_list, "get_channelwise_data_distribution")
        _, boxes = collect(engine, (), names, axis=axis, data_num=data_num, outlier_k=outlier_k,
                           progress=progress, skip_unboxable=len(names) > 1)
        _refuse_if_none_drawn(boxes, "box plot",
                              "name other calibration nodes, or do what each one's reason says")
        with Progress(len(boxes), "drawing box plots", enabled=progress) as bar:
            for d in boxes.values():
                if "skipped" not in d:
                    d["png"] = draw_channelwise(d, out)
                bar.advance()
    return boxes


def _refuse_if_none_drawn(results, what, advice):
    """Raise where none of the nodes asked for gets a figure: a call that draws nothing is
    refused as one node alone is, not a success whose table is empty and whose folder holds
    no file."""
    if not results or any("skipped" not in d for d in results.values()):
        return
    if len(results) == 1:
        name, d = next(iter(results.items()))
        raise PTQError(f"node {name!r}: {d['skipped']}")
    why = "; ".join(f"{name!r}: {d['skipped']}" for name, d in results.items())
    raise PTQError(f"nothing to draw: none of the {len(results)} nodes given has a {what} ({why}); {advice}")

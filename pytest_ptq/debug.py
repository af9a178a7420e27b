"""The seed-compatible API: ``import pytest_ptq.debug as dbg``.

Names and parameter names follow the seed tool (``horizon_nn.debug``) so its users feel at
home. Every function takes ``model_or_file`` (a path, a ModelProto, or an :class:`Engine`
to reuse one compiled model across calls) and ``calibrated_data`` (a folder, an ``.npz``,
or ``{input name: [arrays]}``), returns plain data, and writes only under ``save_dir``.
"""

from .curves import Curves, configs_from, get_acc_error, plot_acc_error
from .datacheck import DataReport, Finding, check_data
from .distribution import get_channelwise_data_distribution, plot_distribution
from .engine import Engine
from .errors import PTQError
from .confidence import Confidence, ranking_confidence
from .groups import Subgraph, group_sensitivity, subgraph_nodes
from .metrics import METRICS, compare
from .model import QuantModel
from .remedy import Remedy, onnxruntime_settings, quantize_static_kwargs, suggest_remedy
from .runall import runall
from .sensitivity import Sensitivity, get_sensitivity_of_nodes
from .stages import StageReport, localize_stages


def load_sensitivity(path):
    """Read a sensitivity result written by ``Sensitivity.save`` or ``--json``."""
    return Sensitivity.load(path)


def save_sensitivity(result, path):
    """Write a sensitivity result as JSON; returns the path."""
    return result.save(path)


__all__ = [
    # seed parity
    "get_sensitivity_of_nodes", "plot_acc_error", "plot_distribution", "get_channelwise_data_distribution",
    "runall", "load_sensitivity", "save_sensitivity",
    # beyond the seed: remedy search, blocks, ranking confidence, stages, data checks
    "suggest_remedy", "onnxruntime_settings", "quantize_static_kwargs", "group_sensitivity", "subgraph_nodes",
    "ranking_confidence", "localize_stages", "check_data",
    # building blocks and result types
    "Engine", "QuantModel", "METRICS", "compare", "configs_from", "get_acc_error", "PTQError",
    "Sensitivity", "Curves", "Remedy", "Confidence", "Subgraph", "StageReport", "DataReport", "Finding",
]

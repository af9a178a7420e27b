"""The seed-compatible API: ``import pytest_ptq.debug as dbg``.

Names and parameter names follow the seed tool (``horizon_nn.debug``) so its users feel at
home. Every function takes ``model_or_file`` (a path, a ModelProto, or an :class:`Engine`
to reuse one compiled model across calls) and ``calibrated_data`` (a folder, an ``.npz``,
or ``{input name: [arrays]}``), returns plain data, and writes only under ``save_dir``.
"""

from .curves import Curves, configs_from, get_acc_error, plot_acc_error
from .engine import Engine
from .errors import PTQError
from .metrics import METRICS, compare
from .model import QuantModel
from .sensitivity import Sensitivity, get_sensitivity_of_nodes


def load_sensitivity(path):
    """Read a sensitivity result written by ``Sensitivity.save`` or ``--json``."""
    return Sensitivity.load(path)


def save_sensitivity(result, path):
    """Write a sensitivity result as JSON; returns the path."""
    return result.save(path)


__all__ = [
    "Curves", "Engine", "METRICS", "PTQError", "QuantModel", "Sensitivity", "compare", "configs_from",
    "get_acc_error", "get_sensitivity_of_nodes", "load_sensitivity", "plot_acc_error", "save_sensitivity",
]

# Beyond the seed: remedy search, blocks, ranking confidence, stages, data checks.
from .datacheck import DataReport, Finding, check_data  # noqa: E402
from .groups import Confidence, Subgraph, group_sensitivity, ranking_confidence, subgraph_nodes  # noqa: E402
from .remedy import Remedy, onnxruntime_settings, quantize_static_kwargs, suggest_remedy  # noqa: E402
from .stages import StageReport, localize_stages  # noqa: E402

__all__ += [
    "Confidence", "DataReport", "Finding", "Remedy", "StageReport", "Subgraph", "check_data", "group_sensitivity",
    "localize_stages", "onnxruntime_settings", "quantize_static_kwargs", "ranking_confidence", "subgraph_nodes",
    "suggest_remedy",
]

# Distributions, per-channel box plots and the one-command run (seed parity).
from .distribution import get_channelwise_data_distribution, plot_distribution  # noqa: E402
from .runall import runall  # noqa: E402

__all__ += ["get_channelwise_data_distribution", "plot_distribution", "runall"]

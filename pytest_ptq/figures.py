"""Saving matplotlib figures the same way everywhere (headless, folders made, memory freed)."""

from __future__ import annotations

from pathlib import Path

from . import guard


def pyplot():
    """matplotlib.pyplot on the Agg backend: the analyses run headless, in CI too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, tight=True):
    """Write ``fig`` to ``path`` (parents created) and close it; returns the Path."""
    plt = pyplot()
    try:
        with guard.writing(Path(path)) as path:
            if tight:
                fig.tight_layout()
            fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def metric_label(metric):
    """Axis label of a metric that says which way is better."""
    return metric.name + (" (higher is better)" if metric.higher_is_better else " (lower is better)")

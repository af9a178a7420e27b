"""The remedy search curve as a figure."""

from __future__ import annotations

from pathlib import Path

from ..figures import metric_label, pyplot, save_figure
from ..metrics import get_metrics


def plot_remedy(result, path):
    """The search curve as a PNG: nodes remedied on x, the metric on y, the target dashed."""
    plt = pyplot()
    m = get_metrics(result.metric)[0]
    pts = [p for p in result.curve if p["value"] is not None]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    xs = [p["nodes"] for p in pts]
    ys = [p["value"] for p in pts]
    ax.plot(xs, ys, marker="o", linewidth=1.5, label=f"top-k nodes by sensitivity ({result.remedy})")
    # name the first additions only: beyond a handful the labels pile up
    for p in pts[1:9]:
        ax.annotate(p["added"], (p["nodes"], p["value"]), textcoords="offset points", xytext=(4, -12),
                    fontsize=7, rotation=-20)
    ax.axhline(result.target, linestyle="--", color="tab:red", linewidth=1, label=f"target {result.target}")
    if result.value is not None:
        ax.scatter([len(result.nodes)], [result.value], s=120, facecolors="none", edgecolors="tab:green",
                   linewidths=2, zorder=3, label=f"chosen after pruning: {len(result.nodes)} node(s)")
    if result.measured and result.measured.get("value") is not None:
        ax.scatter([len(result.nodes)], [result.measured["value"]], marker="*", s=150, color="tab:purple",
                   zorder=4, label="measured after re-quantizing")
    ax.set_title(f"Remedy search ({result.remedy}) on {Path(result.model).name}, {result.samples} sample(s)")
    ax.set_xlabel("number of nodes remedied (most sensitive first)")
    ax.set_ylabel(metric_label(m))
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, path)



"""The remedy search as a figure: the objective against the cost of the set."""

from __future__ import annotations

from pathlib import Path

from ..figures import axes_title, drawing, metric_label, pyplot, save_figure
from .result import WHAT

_ON = {"held-out": "held-out", "confirmation": "confirmation samples", "calibration": "calibration"}


@drawing
def plot_remedy(result, path):
    """A PNG of the search: cost on x (nodes for a single remedy), the objective on y; the
    greedy path on the search samples, refinements, every set scored on the judging data,
    the chosen set on calibration and judging data, and the target dashed."""
    from ..figures import fit_labels, mark_points, panel_chars, side_legend, side_text, with_side_panel
    from ..tables import short

    plt = pyplot()
    m = result.objective_metric
    single = result.remedy != "mixed"
    fig, ax, side = with_side_panel(plt, (11, 5.2), ratio=(3.0, 1.25))
    pts = [p for p in result.curve if p["value"] is not None]
    xs = [p.get("cost", p["nodes"]) for p in pts]
    ax.plot(xs, [p["value"] for p in pts], marker="o", linewidth=1.5, label=f"greedy on the search samples "
            f"({result.remedy})")
    if pts:  # where every set starts from
        ax.scatter(xs[:1], [pts[0]["value"]], marker="X", s=70, color="black", zorder=4,
                   label="no remedy, on the search samples")
    moves = [r for r in result.refinements if r.get("value") is not None]
    if moves:
        ax.scatter([r["cost"] for r in moves], [r["value"] for r in moves], marker="s", s=30, color="tab:orange",
                   zorder=3, label="refined on the search samples")
    judged = [c for c in result.confirmations if c.get("value") is not None]
    on = _ON.get(result.judged_on, result.judged_on)
    for met, colour, word in ((True, "tab:green", "meets"), (False, "tab:gray", "short")):
        group = [c for c in judged if bool(c["met"]) is met]
        if group:
            ax.scatter([c["cost"] for c in group], [c["value"] for c in group], marker="D", s=28, color=colour,
                       alpha=0.7, zorder=3, label=f"scored on {on}: {word}")
    if result.targets:
        # the points are the worst output's figure, each output judged against its own target:
        # no one line is the bar, so the targets are said, not drawn
        ax.plot([], [], linestyle="none", label=f"targets per output: {result.target_text}")
    else:
        ax.axhline(result.target if result.objective.get("min_ratio") is None else
                   result.figures.get(result.judged_on, {}).get("target", result.target),
                   linestyle="--", color="tab:red", linewidth=1, label=f"target {result.target_text}")
    if result.value is not None:
        x = result.cost
        ax.scatter([x], [result.value], s=120, facecolors="none", edgecolors="tab:blue", linewidths=2, zorder=4,
                   label=f"chosen, on calibration: {len(result.nodes)} node(s)")
        after = result.figures.get(result.judged_on, {}).get("after")
        if after is not None and result.judged_on != "calibration":
            # where the judging data chose part of the set, their figure is fitted, not a check
            ax.scatter([x], [after], s=140, facecolors="none", edgecolors="tab:green", linewidths=2, zorder=4,
                       label=f"chosen, on {on}" + ("\n(which chose part of the set)" if result.judge_chose else ""))
        if result.requantized:
            by, mm = result.requantized
            figure = mm.get("figures", {}).get(result.judged_on, {})
            value = figure.get("after", mm.get("value"))
            if value is not None:
                ax.scatter([x], [value], marker="*", s=150, color="tab:purple", zorder=5,
                           label=f"re-quantized with {by}, on {on}")
            if figure.get("deployed") is not None:  # the same file as a plain session runs it, on this machine
                ax.scatter([x], [figure["deployed"]], marker="P", s=90, color="tab:brown", zorder=5,
                           label=f"that file in a plain onnxruntime\nsession (this machine), on {on}")
    axes_title(ax, f"Remedy search ({result.remedy}) on {Path(result.model).name}, {result.samples} calibration "
                   "sample(s)")
    ax.set_xlabel(f"number of nodes {WHAT.get(result.remedy, 'remedied')}" if single else
                  "cost of the set (" + ", ".join(f"{k} {v:g}" for k, v in result.costs.items()) + " per node)")
    ax.set_ylabel(metric_label(m))
    ax.ticklabel_format(axis="y", useOffset=False)
    if single:
        ax.xaxis.get_major_locator().set_params(integer=True)
    if len(set(xs)) <= 1:  # the model as given, alone: a unit axis, not -0.04 to 0.04
        ax.set_xlim(-0.5, max(xs, default=0) + 1.5)
    ax.grid(True, alpha=0.3)
    # the greedy path's additions are numbered on it and named beside it: on the curve the
    # names pile up onto each other and onto the points
    added = list(zip(pts, xs))[1:_NAMED + 1]
    mark_points(ax, [(x, p["value"]) for p, x in added], colour="tab:blue")
    below = side_legend(side, ax)
    # names as wide as the panel's lines allow beside their number and value (a fixed 24
    # characters read '~onv10_depthwise_weight~' in a panel of 47)
    chars = panel_chars(side, fontsize=7.5)
    value = max((len(short(p["value"])) for p, _ in added), default=0)
    names = fit_labels([p["added"] for p, _ in added], chars - 4 - value)
    lines = (["greedy additions, in order:"] + [f"{k:>2} {name} {short(p['value'])}"
                                                for k, ((p, _), name) in enumerate(zip(added, names), 1)]
             if added else ["greedy additions: none (the budget", "ended before the first)"] if result.budget_exhausted
             else ["greedy additions: none (the model", "meets the target on the search", "samples as given)"])
    if len(pts) - 1 > len(added):
        lines.append(f"   ... {len(pts) - 1 - len(added)} more")
    greedy = [p["added"] for p in pts[1:]]
    if result.nodes and list(result.nodes) != greedy[:len(result.nodes)]:  # chosen off the greedy path: named
        kind = max((len(str(result.choices.get(n, result.remedy))) for n in result.nodes[:_NAMED]), default=0)
        chosen = fit_labels(result.nodes[:_NAMED], chars - 6 - kind)
        lines += ["", "chosen:"] + [f"   {name} ({result.choices.get(n, result.remedy)})"
                                    for n, name in zip(result.nodes, chosen)]
        if len(result.nodes) > _NAMED:
            lines.append(f"   ... {len(result.nodes) - _NAMED} more")
    side_text(side, lines, top=below, fontsize=7.5)
    return save_figure(fig, path, tight=False)


_NAMED = 12  # additions named beside the plot



"""Cumulative error curves: how error grows node by node under a quantization config.

For each config, the metric between every normal node's output and the float model's, in
topological order (x = node index). Beside it, the *local* error of each node: its error
when its own pairs quantize (its inputs from float values, and, read like its point, the
pairs it owns on model outputs) and nothing upstream does, which tells a node whose error
is its own from one that only inherits error.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from . import params
from .errors import PTQError, shown, unknown
from .figures import drawing, file_stem, metric_label, pyplot, save_figure
from .metrics import Reference, Scratch, get_metric, get_metrics
from .outputs import parse_outputs
from .progress import Progress
from .results import JsonResult, read_from
from .tables import short
from .engine import Engine, engine_for
from .sensitivity import sample_indices

KINDS = ("weight", "activation")


@dataclasses.dataclass
class Curves(JsonResult):
    """``values[config][k]`` is the metric at ``nodes[k]`` (tensor ``tensors[k]``, as the
    user's file names it: :meth:`QuantModel.shown_name`); in
    ``average_mode`` (the seed's average cumulative error), ``means[config][k]`` the running
    mean of ``values[config][:k + 1]``, what the plot draws. ``worst_of[node]``: the model
    outputs a node's point is the worst of, where its own pairs write several (a Split's
    outputs, each behind its pair), ``tensors[k]`` the first of them. ``no_values[node]``:
    ``{tensor: shape}`` of what a node's point reads where none of it held a value on any
    sample (a Slice selecting nothing): its point, in every config, and its local error are
    None, not the perfect score a metric reads no values as."""

    metric: str
    nodes: list
    tensors: list
    values: dict
    configs: dict  # label -> calibration nodes quantized
    local: list | None = None  # local error per node under full quantization (None: no pair of its own)
    average_mode: bool = False
    samples: int = 0
    png: str | None = None
    means: dict | None = None
    worst_of: dict | None = None
    no_values: dict | None = None

    def read(self, k):
        """The tensors the point of ``nodes[k]`` is the worst of."""
        return (self.worst_of or {}).get(self.nodes[k], [self.tensors[k]])

    def worst(self, label, k=3):
        """The ``k`` nodes with the worst value in a config's curve, worst first."""
        m = get_metrics(self.metric)[0]
        ys = self.values[label]
        order = sorted((i for i in range(len(self.nodes)) if ys[i] is not None), key=lambda i: m.sort_key(ys[i]))
        return [(self.nodes[i], ys[i]) for i in order[:k]]

    def notes(self):
        """One sentence per node without a point (see :func:`no_point_notes`)."""
        return no_point_notes(self.no_values)


def no_point_notes(no_values):
    """One sentence per node of :attr:`Curves.no_values` (also read from a saved summary):
    what its point reads, which held no values."""
    out = []
    for node, read in (no_values or {}).items():
        said = ", ".join(f"{t!r} (shape {shape})" for t, shape in read.items())
        out.append(f"{node!r} reads {said}, which hold{'s' if len(read) == 1 else ''} no values on any sample: "
                   "no point")
    return out


def configs_from(engine, quantize_node=None, non_quantize_node=None):
    """``{label: calibration nodes quantized}`` from the seed's argument forms.

    ``['weight', 'activation']``: one config per kind (only those quantized); a list of
    names: one config per name; a list of lists: one config per inner list. With
    ``non_quantize_node`` the same forms give "everything but those".
    """
    engine = engine_for(engine)
    qm = engine.qmodel
    every = list(engine.calib_names)
    if quantize_node is not None and non_quantize_node is not None:
        raise PTQError("give quantize_node or non_quantize_node, not both")
    spec, invert = (quantize_node, False) if quantize_node is not None else (non_quantize_node, True)
    if spec is None:
        return {"all quantized": every}
    what = "non_quantize_node" if invert else "quantize_node"
    spec = params.names(spec, what, nested=True)
    if not spec:  # no config: an empty figure
        raise PTQError(f"{what} is empty; give 'weight', 'activation', node names or lists of them, or leave it out "
                       "for the model with every node quantized")
    configs = {}
    for entry in spec:
        if isinstance(entry, str) and entry in KINDS:
            names = [c.name for c in qm.of_kind(entry) if c.bypassable]
            label = f"{entry} only" if not invert else f"all but {entry}"
        else:
            group = [entry] if isinstance(entry, str) else list(entry)
            names = qm.resolve_calibration(group)
            label = ("+".join(group) if not invert else "all but " + "+".join(group))
        chosen = set(names)
        configs[label] = [c for c in every if (c in chosen) != invert]
    return configs


def get_acc_error(engine, configs, metric="cosine-similarity", data_num=None, local=True, progress=True):
    """Compute the curves (no plot). Memory: one segment's activations at a time where the
    model runs in segments, else one sample's (see :meth:`.engine.Engine.probes`)."""
    m = get_metric(metric)
    local = params.flag(local, "local")
    if not isinstance(engine, Engine):
        raise PTQError(f"get_acc_error needs an Engine(model, data), got {shown(engine)}; plot_acc_error takes a "
                       "model file and its data")
    if not isinstance(configs, dict) or not configs:
        raise PTQError("configs must be a mapping {label: [calibration nodes quantized]}, such as "
                       f"configs_from(engine) gives; got {shown(configs)}")
    known = set(engine.calib_names)
    for label, nodes in configs.items():
        missing = [n for n in params.names(nodes, f"config {label!r}") or () if n not in known]
        if missing:
            raise unknown("calibration node", missing[0], sorted(known))
    indices = sample_indices(engine, data_num)
    qm = engine.qmodel
    tensor_of = {}  # node -> the tensors its curve and its local error read, the worst of them
    for n in qm.normal.values():
        t = next((o for o in n.outputs if o in engine.probe_tensors), None)
        # a Cast between float types (a float16 graph computing operators in float32) shows
        # the error of the tensor it casts, or of its pair: the operators' points say it
        if t is not None and not qm.passes_on(n.name):
            # a node whose own pairs write model outputs (a detector head's Concat) is read
            # after those pairs: what the model delivers, the pairs' error included, the worst
            # of them where they write several (a Split's outputs), as the rankings score it;
            # one whose output Casts between float types make a model output, after the Casts
            # (the float16 values the rankings score); its local error too, which its local
            # clone passes through those pairs and Casts for (see local_clones), like for like
            tensor_of[n.name] = qm.delivered(n.name) or [t]
    nodes, tensors = list(tensor_of), [read[0] for read in tensor_of.values()]
    every = list(dict.fromkeys(t for read in tensor_of.values() for t in read))
    # a model output the rankings score by part (outputs.parts) is scored by its worst part
    # here too, so that the curve ends where the verdict does
    whole, views = [lambda a: a], {}
    for spec in parse_outputs(None, engine):
        if spec.index and spec.tensor in every:
            views.setdefault(spec.tensor, []).append(spec.take)

    def fresh(names):
        return {t: [m.new() for _ in views.get(t, whole)] for t in names}

    scratch = Scratch()
    # values compared per tensor and part, the same in every config (the references'): a
    # metric reads no values as a perfect score, which only these tell apart from a measured one
    held = {t: [0] * len(views.get(t, whole)) for t in every}
    shapes = {}

    def update(st, values, ref, prepared):
        for t, v in values.items():
            if t in st:
                if t not in prepared:  # every config of a part compares with the same references
                    prepared[t] = [Reference(take(ref[t]), scratch) for take in views.get(t, whole)]
                    for j, r in enumerate(prepared[t]):
                        held[t][j] += r.array.size
                        if not r.array.size:
                            shapes.setdefault(t, list(r.array.shape))
                for r, take, one in zip(prepared[t], views.get(t, whole), st[t]):
                    m.update(one, r, take(v))

    def worst(st, read):
        """The worst figure of the parts of ``read`` that held values; None where none did."""
        found = [m.value(one) for t in read for one, n in zip(st[t], held[t]) if n]
        return m.worst(found) if found else None

    states = {label: fresh(every) for label in configs}
    local_states = fresh(every) if local else None
    with Progress(len(indices) * engine.probe_parts(every), "error curves", enabled=progress) as bar:
        for _, parts in engine.probes(indices, list(configs.values()), every, local):
            for ref, local_vals, outs in parts:
                prepared = {}
                if local:
                    update(local_states, local_vals, ref, prepared)
                local_vals.clear()  # gone before the configs' runs add theirs
                for label, out in zip(configs, outs):
                    update(states[label], out, ref, prepared)
                    out.clear()
                bar.advance()
    values = {label: [worst(st, read) for read in tensor_of.values()] for label, st in states.items()}
    local_vals = ([worst(local_states, tensor_of[n]) if qm.has_local_error(n) else None for n in nodes]
                  if local else None)
    no_values = {n: {qm.shown_name(t): shapes.get(t, []) for t in read} for n, read in tensor_of.items()
                 if not any(map(any, (held[t] for t in read)))}
    # the tool's own names (a moved pair's '<out>::float') are not in the user's file
    return read_from(Curves(metric=m.name, nodes=nodes, tensors=[qm.shown_name(t) for t in tensors], values=values,
                            configs=configs, local=local_vals, samples=len(indices),
                            worst_of={n: [qm.shown_name(t) for t in read] for n, read in tensor_of.items()
                                      if len(read) > 1} or None, no_values=no_values or None),
                     engine.inputs())


def unplotted_outputs(engine, curves):
    """``{output: why}``: the compared model outputs no point of the curves reads, and where
    their error shows instead: a graph input passed straight through; a pair on one, which the
    rankings score as that pair; a pair the rankings credit to the operators it quantizes; an
    operator's output read elsewhere (after its pair, or after its Casts between float types
    on another model output)."""
    qm = engine.qmodel
    read = {t for k in range(len(curves.nodes)) for t in curves.read(k)}
    point = dict(zip(curves.nodes, curves.tensors))
    out = {}
    for t in dict.fromkeys(s.tensor for s in parse_outputs(None, engine)):
        if t in read:
            continue
        # a Cast between float types has no point of its own: what it casts says who computes it
        src, casts = qm.uncast(t)
        through = f" through {_named_list('Cast', casts[::-1])}" if casts else ""
        pair, writer = qm.by_output().get(src), qm.producer.get(src)
        if src in qm.input_names:
            how = through[1:] + " only" if casts else "straight through"
            out[t] = f"a graph input passed {how}, the same in every config"
        elif pair is not None:
            owners = qm.credited(pair.name)
            out[t] = f"written by pair {pair.name!r} on {qm.shown_name(pair.input)!r}{through}" + (
                " with no operator between, which the rankings score as that pair" if owners == [pair.name] else
                f", whose error the rankings credit to {_named_list('node', owners)}, whose input"
                f"{'s' if len(owners) > 1 else ''} it quantizes" if owners else
                ", whose values no operator reads (no ranking row holds it)")
        elif writer is not None and writer.name in point:
            at = point[writer.name]  # as the file names it, as the tensors below are compared
            after = next((c for c in qm.normal[writer.name].calibration_outputs
                          if at in map(qm.shown_name, qm.cast_on(qm.calibration[c].outputs))), None)
            where = f", after its pair {after!r}" if after else ""
            out[t] = (f"computed by node {writer.name!r}{through}; the curves read {writer.name!r} at tensor "
                      f"{at!r}{where}")
        elif writer is None or writer.op_type == "Constant":
            out[t] = f"a constant{through}, the same in every config"
        else:  # integer ids or codes, compared where the model has no float output
            out[t] = (f"computed by {writer.op_type} {writer.name!r}{through} as integers; the curves compare float "
                      "tensors only")
    return out


def _named_list(what, names):
    """``Cast 'a'`` or ``Casts 'a', 'b'``: names after their kind, in the order given."""
    return f"{what}{'s' if len(names) > 1 else ''} " + ", ".join(map(repr, names))


def running_mean(values):
    """The mean of the first 1, 2, ... values, as plain floats; a point without a value
    (None: it read no values) stays None and counts in no mean."""
    known = [v is not None for v in values]
    arr = np.asarray([v if k else 0.0 for v, k in zip(values, known)], dtype=np.float64)
    means = np.cumsum(arr) / np.maximum(np.cumsum(known), 1)
    return [float(v) if k else None for v, k in zip(means, known)]


def _drawn(ys):
    """``ys`` as floats, NaN (a gap in the line) where a point has no value."""
    return [math.nan if v is None else v for v in ys]


@drawing
def plot_curves(curves, path, title=None, annotate=3):
    """Write the curves as a PNG: operators in execution order on x, the metric on y; the
    ``annotate`` worst points of each curve are numbered on it and named in a side panel with
    the legend, so that no label covers a curve or another label."""
    from .figures import (axes_title, drawable, fit_labels, mark_points, panel_chars, side_legend, side_text,
                          with_side_panel)

    plt = pyplot()
    m = get_metrics(curves.metric)[0]
    fig, ax, side = with_side_panel(plt, (12.5, 5.5), ratio=(4.0, 1.1))
    x = np.arange(len(curves.nodes))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    plotted = _plotted(curves)
    for k, (label, ys) in enumerate(plotted.items()):
        ax.plot(x, _drawn(ys), marker=".", markersize=3, linewidth=1.2, color=colours[k % len(colours)],
                label=drawable(label))
    for k, n in enumerate(curves.no_values or ()):  # the gap shown where it is, the axis kept to the last operator
        i = curves.nodes.index(n)
        ax.axvspan(i - 0.4, i + 0.4, color="0.92", zorder=0, label=None if k else "no point: read\nno values")
    worst = marked(curves, annotate)
    if curves.local is not None:
        idx = [i for i, v in enumerate(curves.local) if v is not None]  # None: no pair of its own, or no values
        ax.scatter(idx, [curves.local[i] for i in idx], s=10, marker="x", color="grey",
                   label="local error: its own\npairs quantized only", zorder=3)
    mode = " (running mean)" if curves.average_mode else ""
    axes_title(ax, title or f"Cumulative {curves.metric}{mode} vs float model, {curves.samples} sample(s)")
    ax.set_xlabel("operator, in execution order (index from the model inputs)")
    ax.set_ylabel(("running mean of " if curves.average_mode else "") + metric_label(m))
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.grid(True, alpha=0.3)
    # one number per marked operator, worst first, on the curve drawn (the running mean's
    # point there, in average mode); the side panel names it with its own value
    order = sorted(worst, key=lambda i: min(m.sort_key(v) for _, v in worst[i]))
    mark_points(ax, [(i, plotted[min(worst[i], key=lambda lv: m.sort_key(lv[1]))[0]][i]) for i in order])
    below = side_legend(side, ax)
    lines = ["worst points:"] if not curves.average_mode else ["worst points (the node's", "own value, not the mean):"]
    undefined = sum(any(v is not None and math.isnan(v) for v in (ys[i] for ys in curves.values.values()))
                    for i in range(len(curves.nodes)))
    if undefined:
        lines[:0] = [f"{undefined} operator(s) without a value", "(NaN: no finite float value", "to compare), not drawn", ""]
    # names as wide as the panel's lines allow, beside their number and operator index (a
    # fixed 26 characters cut the stage out of '/backbone/stage4/block3/conv1/Conv')
    chars = panel_chars(side, fontsize=7.5)
    index = len(f" (#{len(curves.nodes)})")
    empty = [curves.nodes.index(n) for n in curves.no_values or ()]
    if empty:  # a gap in every curve: said, not left for the reader to guess
        shown_empty = fit_labels([drawable(curves.nodes[i]) for i in empty], chars - 2 - index)
        lines[:0] = [f"{len(empty)} operator(s) without a point", "(they read tensors holding", "no values on any sample):",
                     *(f"  {name} (#{i})" for name, i in zip(shown_empty[:5], empty)),
                     *([f"  and {len(empty) - 5} more"] if len(empty) > 5 else []), ""]
    # escaped before they are cut to fit: a glyph no font has, escaped after, ran past the width
    names = dict(zip(order, fit_labels([drawable(curves.nodes[i]) for i in order], chars - 3 - index)))
    value = max((len(short(v)) for i in order for _, v in worst[i]), default=0)
    labels = dict(zip(curves.values, fit_labels([drawable(label) for label in curves.values], chars - 4 - value)))
    for k, i in enumerate(order, 1):
        lines.append(f"{k:>2} {names[i]} (#{i})")
        lines += [f"   {labels.get(label, label)} {short(v)}" for label, v in worst[i]]
    side_text(side, lines, top=below, fontsize=7.5)
    return save_figure(fig, path, tight=False)


def _means(values):
    return {label: running_mean(vals) for label, vals in values.items()}


def _plotted(curves):
    if not curves.average_mode:
        return curves.values
    return curves.means or _means(curves.values)


def marked(curves, annotate=3):
    """``{node index: [(config, value)]}``: the ``annotate`` worst points of each curve, those
    worse than the curve's best only (a flat curve, as when nothing of a kind can be bypassed,
    has none). The nodes' own values, in average mode too: the nodes :meth:`Curves.worst`
    names (and the command line prints), not the running mean's start, which is low only
    because it averages few nodes."""
    m = get_metrics(curves.metric)[0]
    worst = {}
    for label, ys in curves.values.items():
        # a point with no value (NaN: a float tensor holding infinities, say; None: it read no
        # values) is no worst point: sorted first, three of them left a transformer's panel empty
        comparable = [i for i in range(len(ys)) if ys[i] is not None and not math.isnan(ys[i])]
        best = max((ys[i] for i in comparable), key=m.sort_key, default=None)
        for i in sorted(comparable, key=lambda i: m.sort_key(ys[i]))[:annotate]:
            if m.worse(ys[i], best):
                worst.setdefault(i, []).append((label, ys[i]))
    return worst



def plot_acc_error(save_dir, calibrated_data=None, model_or_file=None, quantize_node=None,
                   non_quantize_node=None, metric="cosine-similarity", average_mode=False,
                   data_num=None, float_model=None, local=True, progress=True, filename=None):
    """Cumulative error curves of each config, written to ``save_dir`` as a PNG.

    Returns :class:`Curves`; ``curves.png`` is the written file.
    """
    if model_or_file is None:
        raise PTQError("plot_acc_error needs model_or_file (the calibrated model)")
    if filename is not None and (not isinstance(filename, str) or Path(filename).name != filename
                                 or filename in ("", ".", "..")):
        raise PTQError(f"filename must be a plain file name (it goes into save_dir), got {shown(filename)}")
    if filename is not None and not filename.lower().endswith(".png"):  # before the curves, not after
        raise PTQError(f"filename must end in .png (the curves are a PNG image), got {shown(filename)}")
    average_mode = params.flag(average_mode, "average_mode")
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    with engine.writes(save_dir) as out:
        configs = configs_from(engine, quantize_node, non_quantize_node)
        curves = get_acc_error(engine, configs, metric, data_num, local=local, progress=progress)
        curves.average_mode = average_mode
        if curves.average_mode:
            curves.means = _means(curves.values)
        words = "_".join("".join(ch if ch.isalnum() else "-" for ch in label).strip("-") for label in configs)
        # another metric or the average: another file, not the default figure overwritten
        words += "".join(f"_{x}" for x in ((curves.metric,) if curves.metric != "cosine-similarity" else ())
                         + (("average",) if curves.average_mode else ()))
        # labels of words and spaces read back from the name; others ('/a/conv.1') get their hash
        plain = all(ch.isalnum() or ch == " " for label in configs for ch in label)
        name = filename or f"acc_error_{file_stem(words, 80, key=None if plain else chr(0).join(configs))}.png"
        curves.png = str(plot_curves(curves, out / name))
    return curves


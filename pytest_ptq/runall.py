"""``runall``: every analysis in the seed's order, with one engine, and a verdict.

1. sensitivity of the weight and of the activation calibration nodes;
2. distributions of the top ``top`` of each (for ``node_type='node'``: of the calibration
   nodes feeding the top normal nodes, and those nodes' outputs);
3. their per-channel box plots;
4. the weight-only and activation-only cumulative error curves (and the fully quantized
   one), and the model outputs under each of these configs.

One compiled engine serves every step and the float reference of each sample is computed
once (the engine caches model outputs), so the whole costs little more than its
sensitivity and curve steps.

The verdict says whether weights or activations lose the accuracy, which nodes, and what
to try for each; the rules (thresholds are the module constants below):

* activation with an outlier channel, quantized per tensor -> per-channel or int16 (or
  fix the model: equalise the channel ranges);
* activation with more than CLIP_SHARE of its values clipped (a Relu after it excepted)
  -> recalibrate with a wider range, or int16;
* activation whose bulk (all but 0.05% at each end) spans fewer than 16 levels (fewer
  than 1/16 of them below 8 bits) -> int16, or fix the model (rare huge values set the range);
* weight with an outlier or starved channel (below 20 dB SQNR) quantized per tensor ->
  per-channel weights; already per channel, or too few bits for the whole tensor -> int16
  or QAT;
* a node alone costing more than SEVERE of the output (cosine below 0.9) -> keep in float;
* otherwise the node is sensitive with a well-shaped distribution -> int16, else float.

Beside each, whether the error at the node it feeds is its own (local error, its own pairs
quantized, its inputs from float values, at least half its error in the fully quantized
model) or inherited from upstream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fnmatch
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from . import __version__, guard, params
from . import cache as results_cache
from .cache import through
from .curves import configs_from, get_acc_error, no_point_notes, plot_curves
from .data import load_data
from .diagnosis import explaining_inputs, scored_inputs, warning
from .errors import PTQError, shown
from .distribution import collect, draw_channelwise, draw_distribution
from .distribution.readings import advise
from .figures import kept_figure
from .metrics import get_metrics
from .outputs import OFFSET_BLIND, blind_warnings, far_from_zero, parse_outputs, parts_note
from .progress import Progress
from .remedy.producer_terms import MODELOPT_PER_CHANNEL, PRODUCERS, kept_in_float, modelopt_call, producer_advice
from .remedy.terms import onnxruntime_settings, per_channel_weights, quantizer_call, suggest_command
from .results import json_safe
from .engine import engine_for
from .screening import DEFAULT_BUDGET_S, DEFAULT_BUDGET_SAMPLES, screen
from .stages import simulation_warnings
from .tables import fmt, printable, warning_lines
from .sensitivity import NO_VALUES, sample_indices
from .verdict import (ACTIVATION, ALL, DOMINANT, WEIGHT, badness, float_first, pole_cause, relevant, severe_reason,
                      three_configs)

KINDS = ("weight", "activation")


@contextlib.contextmanager
def _step(timings, key, label, progress):
    if progress:
        print(f"runall: {label}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    yield
    timings[key] = round(time.perf_counter() - start, 3)


def _node_types(node_type):
    if node_type is None:
        return list(KINDS)
    return params.node_types(node_type)


def runall(model_or_file, calibrated_data=None, save_dir="ptq_debug_runall", metrics=("cosine-similarity",),
           output_node=None, node_type=None, data_num=None, top=5, axis=None, float_model=None,
           progress=True, average_mode=False, heldout=None, rank_samples=None, time_budget=None,
           cache=None):
    """Run every analysis and write a tidy folder under ``save_dir``.

    ``node_type``: None ranks weight and activation nodes (the seed's runall); one type
    ('weight', 'activation', 'node': normal nodes) ranks that type only, a list each it names. ``top``: how many of each ranking get distributions and
    box plots. The first of ``metrics`` sorts the rankings and draws the curves.

    Samples: ``data_num`` limits every step to the first N samples. The rankings score every
    node on ``rank_samples`` of them (an int, or "all"); by default (with neither given) on as
    many as ``time_budget`` seconds allow (default: what ranking 6 samples takes, measured on
    the first, at most 60 s), at least two (from four, every node on half of them and the top
    quarter of each ranking on three times as many), and then confirm the top 10 of each
    ranking on every sample (see :mod:`~pytest_ptq.screening`); distributions and curves use
    the samples every node was ranked on, the weights/activations verdict every sample.

    ``cache``: a :class:`~pytest_ptq.cache.ResultCache`, or a folder, that keeps each
    step's results between runs (plots are drawn again from them).

    Writes ``summary.md`` (the verdict), ``summary.json`` (everything below),
    ``sensitivity_<type>.json`` (reloadable with ``Sensitivity.load``), ``acc_error.png``,
    ``distributions/*.png`` and ``channelwise/*.png``. Into a folder an earlier runall wrote,
    the files its summary lists and this run does not write go; a folder whose summary runall
    did not write, or that another runall is writing into, is refused. Until the run ends,
    ``summary.md`` says it did not finish and ``summary.json`` lists every file written so far.
    Returns the summary dict: what ``summary.json`` holds, except that its ``files`` entry
    (and each plot's ``png``) names the files as written, to open from the current folder,
    where ``summary.json`` names them relative to its own folder.
    """
    top = params.positive_int(top, "top")
    average_mode = params.flag(average_mode, "average_mode")
    axis = params.axis(axis)
    rank_samples = params.rank_samples(rank_samples)
    time_budget = None if time_budget is None else params.seconds(time_budget, "time_budget")
    if time_budget is not None and rank_samples is not None:  # one would be ignored in silence
        raise PTQError("give time_budget (--time-budget) or rank_samples (--rank-samples), not both: one sets how many "
                       "samples the ranking takes from the time it may spend, the other directly")
    if rank_samples is None and data_num is not None:
        rank_samples = "all"  # asked for N samples: rank on all N
    start = time.perf_counter()
    engine = engine_for(model_or_file, calibrated_data, float_model=float_model)
    _check_axis(engine.qmodel, axis)
    cache = _cache_for(cache, engine)
    if heldout is not None:  # refused before the work, not after the rankings
        load_data(heldout, engine.qmodel, role="held-out", calibration=engine.data)
    also = guard.Inputs().add(heldout if isinstance(heldout, (str, Path)) else None, "held-out data")
    with engine.writes(save_dir, also=also) as out, _owning(out):
        return _runall(engine, out, metrics, output_node, node_type, data_num, top, axis, progress,
                       average_mode, start, heldout, rank_samples, time_budget, cache)


# what runall writes into its folder: the only names it ever removes there
_OWN = ("summary.md", "summary.json", "acc_error.png", "sensitivity_*.json", "distributions/distribution_*.png",
        "channelwise/channelwise_*.png")
_UNFINISHED = ("# runall did not finish\n\nThis folder's files may come from several runs: an interrupted runall "
               "left it. Run runall again.\n")


def _own(out, path):
    """``path`` (as a summary lists it) under ``out`` when it is one of runall's names there,
    else None: a summary edited by hand cannot make runall remove a user's file."""
    path = Path(path)
    sub = path.parent.name if path.parent.name in ("distributions", "channelwise") else ""
    rel = f"{sub}/{path.name}" if sub else path.name
    return out / rel if any(fnmatch.fnmatchcase(rel, pattern) for pattern in _OWN) else None


def _listed(files):
    """Every path in a summary's ``files`` entry (strings in nested dicts and lists)."""
    if isinstance(files, str):
        return [files]
    if isinstance(files, dict):
        files = list(files.values())
    return [p for f in files for p in _listed(f)] if isinstance(files, list) else []


def _check_axis(qm, axis):
    """Refuse, before the rankings, an ``axis`` that no calibration node's input has (as the
    shapes inferred from the file tell; the box plots refuse it all the same, minutes later)."""
    ranks = {len(qm.shapes[c.input]) for c in qm.calibration.values() if c.role != "bias" and c.input in qm.shapes}
    ranks.discard(0)  # a scalar has no axis at all
    if axis is not None and ranks and not any(-r <= axis < r for r in ranks):
        raise PTQError(f"axis {axis} is out of range for every calibration node's input (of rank "
                       f"{', '.join(map(str, sorted(ranks)))}); pass an axis in [{-max(ranks)}, {max(ranks) - 1}], or "
                       "none to infer each node's")


@contextlib.contextmanager
def _owning(out):
    """This process alone writes runall's files into ``out`` for the block: a lock on the
    folder itself (no file of its own), which the system drops when the process ends however
    it ends (two runs into one folder mixed their files). Without ``fcntl`` (Windows), or on a
    file system that locks no folder (NFS), none."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    guard.makedirs(out)
    try:
        fd = os.open(out, os.O_RDONLY)
    except OSError as exc:
        raise guard.write_error(out, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise PTQError(f"another runall is writing into {shown(str(out))}; wait for it to end, or give this "
                               "one another folder") from None
            # a file system that locks no folder (NFS, SMB): unguarded, as before there was a lock
        yield
    finally:
        os.close(fd)  # and the lock with it


class _Listing:
    """The unfinished summary of a run in progress: the files of the earlier runs into the
    folder (runall's names only) and those this run has written so far, rewritten after each,
    so that a run killed at any point leaves the next one a list of what to remove."""

    def __init__(self, out, earlier):
        self.out, self.earlier, self.written = out, set(earlier), []
        guard.write_text(out / "summary.md", _UNFINISHED, atomic=True)
        self._write()

    def wrote(self, path):
        """Note ``path`` as written by this run; returns it."""
        self.written.append(str(path))
        self._write()
        return path

    def _write(self):
        # written whole or not at all: a run killed mid-write left a summary no later run took
        guard.write_text(self.out / "summary.json", json.dumps({
            "tool": "pytest-ptq", "version": __version__, "unfinished": True,
            "files": sorted({_from(self.out, p) for p in (*self.earlier, *self.written)})}, indent=1), atomic=True,
            again=True)


def _take_folder(out):
    """Claim ``out`` for this run (a :class:`_Listing`, whose ``earlier`` holds the files an
    earlier runall listed there, its own names only). A summary there that runall did not
    write is refused rather than replaced. Until this run ends, its summary says the folder is
    unfinished, so that an interrupted run leaves no summary describing other files."""
    earlier, found = set(), [n for n in ("summary.md", "summary.json") if (out / n).exists()]
    if found:
        try:
            old = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if not (isinstance(old, dict) and old.get("tool") == "pytest-ptq" and isinstance(old.get("files"), (dict, list))):
            raise PTQError(f"{shown(str(out))} holds a {' and a '.join(found)} that runall did not write; give runall a "
                           "folder of its own (a new one, or one an earlier runall wrote)")
        earlier = {_own(out, f) for f in _listed(old["files"])} - {None, out / "summary.md", out / "summary.json"}
    return _Listing(out, earlier)


def _drop_earlier(out, earlier, files):
    """Remove the files an earlier runall into this folder wrote and this one did not (a rerun
    with a smaller ``top`` or other node types left them beside a summary that lists fewer)."""
    kept = {_own(out, p) for p in _listed(files)}
    for old in earlier - kept:
        with contextlib.suppress(OSError):
            old.unlink()


def _cache_for(cache, engine):
    """``runall``'s ``cache`` argument as a ResultCache (or None): one, or a folder to keep
    results in."""
    if cache is None or isinstance(cache, results_cache.ResultCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):  # checked as the CLI checks --cache-dir: a path, outside the inputs
        # a folder it cannot write is read all the same (for_engine warns), as the CLI's
        return results_cache.for_engine(guard.output_path(cache, "cache", engine.inputs(), folder=True,
                                                          writable=False), engine, option="cache")
    raise PTQError(f"cache must be a folder to keep results in or a ResultCache, got {shown(cache)}")


def _runall(engine, out, metrics, output_node, node_type, data_num, top, axis, progress, average_mode, start,
            heldout, rank_samples, time_budget, cache):
    metric_objs = get_metrics(metrics)
    metric = metric_objs[0].name
    # what every step's cached result depends on besides the engine's files (cache.py)
    base = (tuple(m.name for m in metric_objs), None if output_node is None else tuple(params.names(output_node, "")),
            data_num)
    every_index = sample_indices(engine, data_num)
    specs = parse_outputs(output_node, engine)
    # from the float outputs of the samples every step pools, before the rankings use and drop
    # them (correlation sees an offset, not an output of zeros)
    blind_to = through(cache, ("runall far from zero", base), lambda: far_from_zero(engine, specs, every_index)) \
        if metric in (*OFFSET_BLIND, "correlation") else []
    far = [f for f in blind_to if not f.get("zero")] if metric in OFFSET_BLIND else []
    zeros = [f for f in blind_to if f.get("zero")]
    left_out = []
    if zeros and len(zeros) < len(specs):
        # its figure is 0 or 1 whatever the nodes do: as the worst output it decided every ranking and
        # the verdict ("weights cause the loss", cosine 0); the other outputs judge
        specs = [s for s in specs if s.name not in {f["output"] for f in zeros}]
        seen = max(f["samples"] for f in zeros)
        left_out = [f"runall ranks and judges by {_names([s.name for s in specs])} alone: "
                    f"{_names([f['output'] for f in zeros])} hold(s) only zeros in float on the first {seen} "
                    f"sample(s), where {metric} is undefined"]
    types = _node_types(node_type)
    qm = engine.qmodel
    # the files named in advance are checked before the work (plots are checked as written)
    for name in ("summary.md", "summary.json", "acc_error.png", *(f"sensitivity_{t}.json" for t in types)):
        guard.claim(out / name)
    for name in ("distributions", "channelwise"):  # its own folders, unlike the one given, are never links
        # nor a data folder (-s . beside one of that name) nor a file: refused now, not at their
        # first figure after the rankings
        guard.claim(out / name, "runall's folder", folder=True)
        guard.refuse_link(out / name, "runall's folder")
        guard.check_writable(out / name, "runall's folder", folder=True)
    guard.makedirs(out)
    listing = _take_folder(out)
    timings, files, steps = {}, {"sensitivity": {}}, 4

    budget = "" if rank_samples is not None else (
        f", as many samples as {time_budget:.3g} s allow" if time_budget is not None else
        f", on as many samples as fit in the time {DEFAULT_BUDGET_SAMPLES} samples take to rank (at most "
        f"{DEFAULT_BUDGET_S:.0f} s)")
    with _step(timings, "sensitivity", f"[1/{steps}] sensitivity of {' and '.join(types)} nodes{budget}", progress):
        ranked = ("runall rankings", base, tuple(types), rank_samples, time_budget)
        sens, screening = through(cache, ranked,
                                  lambda: screen(engine, types, metric_objs, specs, every_index, budget_s=time_budget,
                                                 rank_samples=None if rank_samples is None else
                                                 (len(every_index) if rank_samples == "all" else rank_samples),
                                                 progress=progress))
        for t in types:
            files["sensitivity"][t] = str(listing.wrote(sens[t].save(out / f"sensitivity_{t}.json")))
    # the samples the data hold: with data_num, the rankings say they were on the first few
    screening = dataclasses.replace(screening, held=engine.data.count)
    indices = list(screening.indices) or every_index[:screening.samples]  # the rankings' samples
    data_num = len(indices)  # distributions and curves: as many samples (the first)
    if progress:
        print(f"runall: {screening.text()}", file=sys.stderr, flush=True)

    top_nodes = {t: list(sens[t])[:top] for t in types}
    dist_nodes, box_nodes = [], []
    for t in types:
        for name in top_nodes[t]:
            calib = qm.quantizing(name) if t == "node" else [name]
            if t == "node":
                dist_nodes.append(name)
            for c in calib:
                if qm.calibration[c].role != "bias":
                    dist_nodes.append(c)
                    box_nodes.append(c)
    dist_nodes, box_nodes = list(dict.fromkeys(dist_nodes)), list(dict.fromkeys(box_nodes))
    with _step(timings, "distributions", f"[2/{steps}] distributions and box plots of "
               f"{len(box_nodes)} calibration nodes", progress):
        dist, boxes = through(cache, ("runall distributions", data_num, tuple(dist_nodes), tuple(box_nodes), axis),
                              lambda: collect(engine, dist_nodes, box_nodes, axis=axis, data_num=data_num,
                                              progress=progress, skip_unboxable=True))
        # a rerun writes the figures kept with the results instead of drawing them again
        shown = (data_num, tuple(dist_nodes), tuple(box_nodes), axis)
        # drawing took most of the step, after the bar of the statistics had said done
        with Progress(len(dist) + len(boxes), "drawing the figures", enabled=progress) as bar:
            for d in dist.values():
                if "skipped" in d:  # an empty tensor: summary.md names it
                    bar.advance()
                    continue
                d["png"] = listing.wrote(kept_figure(
                    cache, ("runall distribution", *shown, d["node"]), out / "distributions",
                    lambda folder, d=d: draw_distribution(d, folder, boxes.get(d["node"]))))
                bar.advance()
            for d in boxes.values():
                if "skipped" not in d:
                    d["png"] = listing.wrote(kept_figure(
                        cache, ("runall channels", *shown, d["node"]), out / "channelwise",
                        lambda folder, d=d: draw_channelwise(d, folder, dist.get(d["node"]))))
                bar.advance()
        files["distributions"] = [d["png"] for d in dist.values() if "skipped" not in d]
        files["channelwise"] = [d["png"] for d in boxes.values() if "skipped" not in d]

    with _step(timings, "curves", f"[3/{steps}] weight-only, activation-only and full error curves",
               progress):
        configs = configs_from(engine, list(KINDS))
        # full quantization beside the seed's two curves: where a node's local error is set
        # against the error it carries in the deployed model
        curves = through(cache, ("runall curves", base, data_num),
                         lambda: get_acc_error(engine, {**configs, ALL: list(engine.calib_names)}, metric, data_num,
                                               local=True, progress=progress))
        curves.average_mode = average_mode
        curves.png = listing.wrote(kept_figure(cache, ("runall curves", base, data_num, average_mode), out,
                                               lambda folder: plot_curves(curves, folder / "acc_error.png")))
        files["acc_error"] = curves.png

    with _step(timings, "outputs", f"[4/{steps}] weights only, activations only and everything "
               f"quantized on all {len(every_index)} sample(s)" + (" and the held-out data" if heldout is not None
                                                                    else ""), progress):
        # held-out data given as arrays has no file to hash: then the verdict is not kept
        held = str(heldout) if isinstance(heldout, (str, Path)) else (None if heldout is None else object())
        # ranking operator nodes shows where both kinds add up: said in the CLI's words, where
        # this run did not rank them already (the sentence stood above their table)
        both_step = None if "node" in types else "rank operator nodes (-t node) to see where they add up"
        three = through(cache, ("runall verdict", base, held, tuple(indices), both_step),
                        lambda: three_configs(engine, specs, metric, heldout, ranking_samples=indices,
                                              count=len(every_index), progress=progress, both_step=both_step),
                        files=(heldout,) if isinstance(held, str) else ())
        outputs = {label: {metric: value} for label, value in three.figures.items()}
        blind = None
        if far:  # outputs the metric cannot see: their verdict by correlation too
            names = {f["output"] for f in far}
            blind = through(cache, ("runall verdict by correlation", base, held, tuple(indices)),
                            lambda: three_configs(engine, [s for s in specs if s.name in names], "correlation",
                                                  heldout, count=len(every_index), progress=progress),
                            files=(heldout,) if isinstance(held, str) else ())

    # the search a step proposes asks this run's question: its data, sample limit and held-out data
    suggest = suggest_command(qm.source, getattr(engine.data, "where", None) or "DATA",
                              heldout if isinstance(heldout, (str, Path)) else None,
                              engine.float_model if isinstance(engine.float_model, (str, Path)) else None, base[2])
    # which input of each top operator costs it more, scored as the plugin's diagnosis scores
    # them: the try column names that input's remedies first
    operators = top_nodes.get("node", [])
    inputs = {n: [c for c in qm.quantizing(n) if qm.calibration[c].role != "bias"] for n in operators}
    scored = through(cache, ("runall operator inputs", base, tuple(indices), tuple(operators)),
                     lambda: scored_inputs(engine, operators, inputs, metric_objs[0], specs, indices)) \
        if operators else ({}, {})
    verdict = _verdict(engine, metric, three, sens, top_nodes, dist, boxes, curves, len(indices), blind, far, suggest,
                       scored)
    timings["total"] = round(time.perf_counter() - start, 3)
    summary = {
        "tool": "pytest-ptq", "version": __version__, "model": qm.source, "format": qm.format_label,
        "made_by": qm.made_by.label, "data": getattr(engine.data, "where", None), "samples": len(indices),
        # the choice the kept results ran with, keyed as the rankings: a rerun reading them
        # would time a new one (decided here, at the end, so that no step before runs otherwise)
        "ranking": screening.to_dict(), "samples_per_run": through(cache, ("samples per run", *ranked),
                                                                   lambda: engine.batching(every_index).reason),
        "metrics": [m.name for m in metric_objs],
        "outputs_compared": [s.name for s in specs], "output_parts": parts_note(specs), "node_types": types,
        "top": top,
        "top_nodes": top_nodes, "outputs": outputs, "verdict": verdict,
        "sensitivity": {t: s.to_dict() for t, s in sens.items()},
        "distributions": dist, "channelwise": boxes, "curves": curves.to_dict(),
        "warnings": [*engine.warnings, *through(cache, ("runall simulation gap", base),
                                                lambda: simulation_warnings(engine, specs, len(every_index))),
                     *blind_warnings(engine, specs, metric, found=blind_to), *left_out],
        "timings_s": timings,
    }
    files["summary_md"] = str(out / "summary.md")
    files["summary_json"] = str(out / "summary.json")
    summary["files"] = files
    summary = json_safe(summary)
    # over the summary marked unfinished at the start (see _take_folder)
    guard.write_text(Path(files["summary_md"]), markdown(summary), atomic=True, again=True)
    guard.write_text(Path(files["summary_json"]), json.dumps(_in_folder(summary, out), indent=1), atomic=True,
                     again=True)
    _drop_earlier(out, listing.earlier, files)
    return summary


def _from(out, path):
    """``path``, a file runall wrote into ``out``, relative to ``out`` (POSIX)."""
    return Path(os.path.relpath(path, out)).as_posix()


def _in_folder(summary, out):
    """``summary`` as summary.json holds it: the files runall wrote named relative to the folder
    they share with it, as summary.md names them. Named as written (relative to the folder runall
    ran in), they resolved from nowhere else, where the folder is read: a CI artifact, a
    dashboard. The model and the data stay as given, as the commands in the next steps name them."""
    def listed(files):
        if isinstance(files, dict):
            return {k: listed(v) for k, v in files.items()}
        return [listed(f) for f in files] if isinstance(files, list) else _from(out, files)

    def drawn(plots):
        return {k: {**d, "png": _from(out, d["png"])} if d.get("png") else d for k, d in plots.items()}

    curves = summary["curves"]
    return {**summary, "files": listed(summary["files"]), "distributions": drawn(summary["distributions"]),
            "channelwise": drawn(summary["channelwise"]),
            "curves": {**curves, "png": _from(out, curves["png"])} if curves.get("png") else curves}


# -- verdict --------------------------------------------------------------------------------
def _verdict(engine, metric, three, sens, top_nodes, dist, boxes, curves, samples, blind=None, far=(), suggest=(),
             scored=({}, {})):
    """The verdict, the ranked nodes' advice and the next steps; ``samples``: how many the
    rankings used; ``blind``: the verdict by correlation on the outputs ``far`` from zero, which
    ``metric`` cannot see; ``scored``: the top operators' inputs scored apart
    (:func:`~pytest_ptq.diagnosis.scored_inputs`)."""
    source, text = three.source, three.text
    items = []
    for t, names in top_nodes.items():
        for rank, name in enumerate(names, 1):
            items.append(_advise(engine, metric, t, rank, name, sens[t], dist, boxes, curves, scored))
    # nodes an order of magnitude below the worst would not move the output if fixed, and
    # none needs fixing where the whole model stays close to float (by every measure asked);
    # the worst of the verdict's kind matter beside a worse node of the other kind
    kinds = {"weight": ("weight",), "activation": ("activation",), "both": ("weight", "activation")}.get(source, ())
    matter = relevant(items)
    matter += [it for k in kinds for it in relevant([i for i in items if i["kind"] == k]) if it not in matter]
    spread = _spread(engine.qmodel, metric, three, samples, items, kinds)
    close = source == "neither" and (blind is None or blind.source == "neither")
    for it in items:
        if (close or it not in matter) and it["try"] and it["try"][0] in ("int16", "keep in float"):
            it["try"] = []
            it["reasons"].append("the model stays close to float with everything quantized: nothing to do" if close
                                 else "it costs little next to the worst node: nothing to do")
    if source == "neither":
        steps, choices = _plan(items, [], source, structural_only=True, qm=engine.qmodel,
                               float_model=engine.float_model)
        next_steps = ([] if blind is not None and blind.source != "neither" else
                      ["nothing urgent; if a task metric still drops, start from the top nodes listed here"]) \
            + [s + " (optional)" for s in steps]
    else:
        next_steps, choices = _plan(items, matter, source, qm=engine.qmodel, float_model=engine.float_model)
        next_steps[:0] = [_spread_step(k, *spread[k], suggest, engine.qmodel) for k in kinds if k in spread]
    # the same steps as the quantizer that made the model takes them, where it is not onnxruntime:
    # a heading, then its code and what it cannot express, a line each
    terms = producer_advice(engine, choices)
    if terms:
        head, *lines = terms
        optional = " (optional)" if source == "neither" else ""
        head = head.removesuffix(":") + optional + ":" if lines else head + optional
        next_steps.append("\n".join([head, *(line.strip() for line in lines)]))
    by_correlation = None
    if blind is not None:
        names = _names([f["output"] for f in far])
        by_correlation = {"outputs": [f["output"] for f in far], "source": blind.source, "text": blind.text,
                          "values": blind.figures}
        next_steps.insert(0, f"judge {names} by correlation, which sees what {metric} cannot there: {blind.text}; "
                             "rerun with --metric correlation to rank the nodes by it")
    figures = three.figures
    return {"source": source, "text": text, "metric": metric, "rule": three.rule, "decided_on": three.decided_on,
            "samples": three.samples, "values": three.values, "disagreement": three.disagreement,
            # keyed as in outputs and values: a reader of one spelling missed the other
            **{label: figures[label] for label in (WEIGHT, ACTIVATION, ALL)}, "nodes": items,
            "next_steps": next_steps, "by_correlation": by_correlation}


# a kind's loss is spread over many nodes when its worst node alone costs less than this
# share of what quantizing the whole kind costs: fixing its top nodes moves little
SPREAD = 0.25


# a kind's loss on the rankings' samples below this share of its loss on the data the verdict
# was decided on: those samples do not show the loss, and the ranking may miss its causes
UNSEEN = 0.01


def _spread(qm, metric, three, samples, items, kinds):
    """``{kind: (loss of that kind alone, loss of its worst ranked node alone, samples, loss
    on the verdict's data)}`` for the verdict's ``kinds`` whose loss no single ranked node
    explains (see :data:`SPREAD`), where some of its nodes are below 16 bits on an integer grid
    (a dynamic model's too: its step names the static call and the float search): both losses
    on the ``samples`` calibration samples the rankings used, as the nodes were ranked on them."""
    ranked_on = three.ranking or three.values["calibration"]
    out = {}
    for k in (k for k in kinds if any(c.bit < 16 and not c.grid.is_float for c in qm.of_kind(k))):
        loss, decided = (badness(metric, figures[f"{k} only"]) for figures in (ranked_on, three.figures))
        worst = max((it["badness"] for it in items if it["kind"] == k and not math.isnan(it["badness"])),
                    default=math.nan)
        if math.isfinite(decided) and decided > 0 and (loss < UNSEEN * decided or worst < SPREAD * loss):
            out[k] = (loss, worst, samples, decided)
    return out


def _spread_step(kind, loss, worst, samples, decided, suggest, qm):
    """The step for a ``kind`` whose loss no few nodes explain: every node of it wider, in the
    terms of the call that makes ``qm``'s kind of model, or the search for the fewest: 16-bit
    where some node of the kind can take it, else kept in float (a dynamic model's nodes and
    the weights beside them take no 16-bit type, and suggest refuses int16 for them)."""
    import shlex

    remedy = "int16" if any(qm.wider_type(c) for c in qm.of_kind(kind)) else "float"
    suggest = shlex.join([*suggest, "--remedy", remedy])
    fewest = "the smallest set that meets" if remedy == "int16" else "the fewest nodes to keep in float that meet"
    wider = _wider_call(kind, qm)
    raise_all = f"raise every {kind} to {wider}, or " if wider else ""
    on = f"on the {samples} calibration sample(s) every node was ranked on"
    if loss < UNSEEN * decided:
        return (f"{kind} quantization alone loses {decided:.3g} where the verdict was decided but only {loss:.2g} "
                f"{on}, and its worst node alone {worst:.2g}: those samples do not show the loss, so the {kind} "
                "ranking may miss the nodes that cause it; rank on more samples (--rank-samples all) or on data like "
                f"the deployment's, {raise_all}let `{suggest}` find {fewest} a target")
    return (f"{kind} quantization alone loses {loss:.3g} {on}, and its worst node alone {worst:.2g} "
            f"({worst / loss:.0%} of it): the loss is spread over many {kind} nodes, so fixing the few ranked here "
            f"moves it little; {raise_all}let `{suggest}` find {fewest} a target")


# a weight-only quantizer's next width (it has no 16 bit), for every weight or for the nodes
# ``which`` names: onnxruntime's MatMulNBitsQuantizer takes one width a call, and a width per
# node only in its RTN / GPTQ configs' customized_weight_config, keyed by node name
WEIGHT_ONLY_8_BITS = "the weight-only quantizer's 8-bit setting for every weight, e.g. MatMulNBitsQuantizer(..., bits=8)"
WEIGHT_ONLY_8_BITS_FOR = ("the weight-only quantizer's 8-bit setting for {which}, e.g. MatMulNBitsQuantizer's "
                          "customized_weight_config {{node name: {{'bits': 8}}}} of its RTN or GPTQ algo_config")


def _wider_call(kind, qm):
    """"<width> (<the call>)": every ``kind`` node of ``qm`` one step wider, as the quantizer of
    its kind of model takes it: a weight-only quantizer's 8-bit setting (it has no 16 bit;
    None where every weight is 8-bit already);
    else quantize_static at 16 bit (quantize_dynamic takes no 16-bit type), in QDQ format
    (given a QOperator format with one, quantize_static raises ValueError)."""
    if qm.weight_only:  # its widest is 8 bits: none wider for weights there already
        narrow = any(c.bit < 8 for c in qm.of_kind(kind))
        return f"8 bits ({WEIGHT_ONLY_8_BITS})" if narrow else None
    arg = "activation_type=QuantType.QUInt16" if kind == "activation" else "weight_type=QuantType.QInt16"
    if qm.format != "QDQ":
        arg = "quant_format=QuantFormat.QDQ, " + arg
    call = f"quantize_static(..., {arg}){_on_float(qm)}"
    return f"16 bit ({call})" if kind == "activation" else \
        f"16 bit (per-channel weights where they are per tensor, else {call})"


def _advise(engine, metric, kind, rank, name, sens, dist, boxes, curves, scored=({}, {})):
    qm = engine.qmodel
    value = sens[name][metric]
    why = sens.details.get(name, {}).get("no_values")
    if why:  # nothing measured, nothing to advise: any change can reach only outputs holding no values
        return {"node": name, "kind": kind, "rank": rank, metric: None, "badness": math.nan, "try": [],
                "reasons": [f"{NO_VALUES}: quantizing it alone {why}"], "findings": [],
                "feeds": qm.counts_for(name) if name in qm.calibration else []}
    bad = badness(metric, value)
    calib = qm.quantizing(name) if kind == "node" else [name]
    read, findings = [], []
    for c in calib:
        d, b = dist.get(c), boxes.get(c)
        if d is None:
            continue
        t, r = advise(d, b)
        read.append({"node": c, "kind": qm.calibration[c].kind, "try": t, "reasons": r, "alone": scored[1].get(c)})
        findings.append({"node": c, "kind": d["kind"], "try": t})
    if kind == "node":
        # the inputs that cost the operator more first, as the plugin's diagnosis names them: in
        # graph order a Conv read its harmless input's "int16" before its weight's "per-channel"
        _, chosen = explaining_inputs(read, scored[0].get(name), metric)
        read = chosen + [i for i in read if i not in chosen]
    tries, reasons = [], []
    for i in read:
        tries += [x for x in i["try"] if x not in tries]
        reasons += [(f"{i['node']}: " if kind == "node" else "") + x for x in i["reasons"]]
    tries, severe = float_first(metric, bad, tries)
    if severe:
        reasons.insert(0, severe_reason(qm, metric, name, value))
    if not tries:
        tries = ["int16", "keep in float"]
    item = {"node": name, "kind": kind, "rank": rank, metric: value, "badness": bad, "try": tries,
            "reasons": reasons, "findings": findings, "feeds": qm.counts_for(name) if name in qm.calibration else []}
    item.update(_origin(qm, metric, kind, name, curves))
    return item


def _origin(qm, metric, kind, name, curves):
    """At the first operator the target counts for (:meth:`QuantModel.credited`): its local
    error (its own pairs quantized, its inputs from float values; read, like its point, after
    its pairs on model outputs) against its error with everything
    quantized. At least half of it local: its error is its own; less: it mostly inherits
    error from upstream; NaN with no
    node there that turns a value rounded to 0 into Inf (its float values are not finite, an
    attention mask's -inf): not measured there; ``unowned`` for a pair no node reads or
    computes (:attr:`QuantModel.unowned`). ``also``: the same at every other node it feeds
    (a weight two Convs share), in graph order."""
    if name in qm.unowned:  # no node to measure at: said, not left blank
        return {"origin": "unowned", "tensor": qm.shown_name(qm.calibration[name].input)}
    # at the operators whose ranking entries count it: an earlier pair of a requantize chain at
    # those reading the chain, a pair on a model output at the operator computing it
    found = [at for n in ([name] if kind == "node" else qm.credited(name)) if (at := _at(qm, metric, n, curves))]
    if not found:
        return {"origin": None}
    return {**found[0], "also": found[1:]} if len(found) > 1 else found[0]


def _at(qm, metric, n, curves):
    """Node ``n``'s local error against its fully quantized one, as :func:`_origin` reads it;
    None where the curves did not measure it."""
    if n not in curves.nodes or curves.local is None or ALL not in curves.values:
        return None
    k = curves.nodes.index(n)
    local, acc = curves.local[k], curves.values[ALL][k]
    if local is None:
        return None
    lb, ab = badness(metric, local), badness(metric, acc)
    pole = pole_cause(qm, n) if math.isinf(lb) else ""
    if (math.isnan(local) or math.isnan(acc)) and not pole:
        return {"at": n, "local": local, "accumulated": acc, "origin": "unmeasured", "pole": ""}
    own = ab == 0 or lb >= 0.5 * ab
    return {"at": n, "local": local, "accumulated": acc, "origin": "local" if own else "inherited", "pole": pole}


def _code(text, table=False):
    """``text`` (a node's, tensor's or file's name) as Markdown code: a fence longer than its
    own backtick runs, control characters shown escaped (a newline would end the line); in a
    ``table`` row its pipes escaped (they would split the row)."""
    text = printable(text)
    text = text.replace("|", "\\|") if table else text
    fence = "`" * (max((len(r) for r in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _names(names):
    names = list(dict.fromkeys(names))
    shown = ", ".join(_code(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _plan(items, relevant, source, structural_only=False, qm=None, float_model=None):
    """``(next steps, choices)``: the steps in onnxruntime's terms, most effective first
    (per-channel weights, one switch for the whole model; per-node structure fixes; then int16
    and float for what stays sensitive), and the remedy each names per calibration node
    (``{node: "per-channel" | "int16" | "float"}``, for :func:`producer_advice`). A Model
    Optimizer model's nodes kept in float are in its own terms, as the diagnosis gives them
    (``float_model``: names them as its terms do), and its int16, which it has not, is float."""
    # per-channel weights is one switch for the whole model: worth it for any ranked weight
    # when weights are (part of) the problem, otherwise only for nodes that matter
    def first(f):  # a weight exactly on its grid has nothing to try
        return f["try"][0] if f["try"] else None

    pool = items if source in ("weight", "both", "neither") else relevant
    weight_pc = [f["node"] for it in pool for f in it["findings"] if f["kind"] == "weight" and first(f) == "per-channel"]
    pool = items if source in ("activation", "both", "neither") else relevant
    act_pc = [f["node"] for it in pool for f in it["findings"]
              if f["kind"] == "activation" and first(f) == "per-channel"]
    recal = [f["node"] for it in relevant for f in it["findings"] if first(f) == "recalibrate"]
    # nodes at 16 bits already, on a float grid or in a dynamic model have no int16 to go to
    widen = {f["node"] for it in items for f in it["findings"] if "int16" in f["try"]}
    steps = []
    if weight_pc:
        how = MODELOPT_PER_CHANNEL if qm is not None and qm.made_by.key == "modelopt" else per_channel_weights(qm)
        if how == f"{quantizer_call(qm)}(..., per_channel=True)":  # the bare call, not a sentence saying where
            how += _on_float(qm)
        steps.append(("weight", f"quantize weights per channel ({how}): "
                                f"{_names(weight_pc)} {'loses' if len(weight_pc) == 1 else 'lose'} channels to a "
                                "per-tensor scale"))
    if act_pc:
        raise_ = "raise them to int16 or " if widen & set(act_pc) else ""
        steps.append(("activation", f"{_names(act_pc)} {'has' if len(act_pc) == 1 else 'have'} outlier channels "
                                    "that make a per-tensor scale coarse: quantize them per channel where the "
                                    f"backend allows, else {raise_}equalise the channel ranges in the model"))
    if recal:
        kind = "weight" if all(qm is not None and qm.calibration[n].kind == "weight" for n in recal) else "activation"
        steps.append((kind, f"recalibrate {_names(recal)} with a wider range (MinMax, or a higher "
                            "percentile)" + (", or raise them to int16" if widen & set(recal) else "")))
    # onnxruntime cannot quantize activations per channel, nor any quantizer calibrate one
    # node its own way: 16 bit is what each can do for those
    choices = {**dict.fromkeys([n for n in act_pc + recal if n in widen], "int16"),
               **dict.fromkeys(weight_pc, "per-channel")}
    if structural_only:
        return [text for _, text in steps], choices
    steps.sort(key=lambda s: s[0] != source)
    handled = set(weight_pc) | set(act_pc) | set(recal)
    severe = [it for it in relevant if it["try"][0] == "keep in float"]
    floats = _calibration(qm, severe)
    if severe:
        # the nodes a re-quantization leaves out, as the float model names them
        how, notes = _kept(qm, floats, float_model) if floats else ("", [])
        how = how or "onnxruntime: nodes_to_exclude"
        # first where they cost far more than what the steps above fix (a mask's fill beside
        # outlier channels): fixing those first would leave most of the loss
        fixed = [it["badness"] for it in items if {f["node"] for f in it["findings"]} & handled]
        ahead = bool(steps) and max(it["badness"] for it in severe) >= DOMINANT * max(fixed, default=0.0)
        first = "if they still cost too much after that, " if steps and not ahead else ""
        kept = _names([it['node'] for it in severe])
        if any(qm.calibration[c].bit < 8 for c in floats) and qm.weight_only:  # floats: none without qm
            # a weight-only quantizer's 8-bit blocks, which no remedy simulates (see QuantModel.wider_type)
            text = (f"{first}raise {kept} to 8 bits or more ({WEIGHT_ONLY_8_BITS_FOR.format(which='them')}), or keep "
                    f"them in float ({how}), and re-check the output")
        else:
            text = f"{first}keep {kept} in float ({how}) and re-check the output"
        step = ("", text + _notes(notes))
        if ahead:
            steps.insert(0, step)
        else:
            steps.append(step)
    rest = [it for it in sorted(relevant, key=lambda it: it["kind"] != source)
            if it not in severe and not ({f["node"] for f in it["findings"]} & handled)]
    wide = [it for it in rest if "int16" in it["try"]]
    if wide:
        # below 8 bits (int4 weights) the next step is 8 bits; a weight-only model's quantizer
        # (MatMulNBits, block-wise int4) takes no TensorQuantOverrides
        raised = _calibration(qm, wide)
        narrow = any(qm.calibration[c].bit < 8 for c in raised)
        how, notes = _kept(qm, raised, float_model) if raised else ("", [])
        own = qm.made_by.key == "modelopt" and not qm.weight_only
        if own:
            # Model Optimizer has no 16-bit integer mode: float is its one step (as in the diagnosis)
            steps.append(("", f"keep {_names([it['node'] for it in wide])} in float "
                              f"({how or 'Model Optimizer: nodes_to_exclude'}; Model Optimizer has no int16) and "
                              "re-check" + _notes(notes)))
            floats += raised
        elif qm.weight_only:
            to, how = ("8 bits or more", WEIGHT_ONLY_8_BITS_FOR.format(which="them"))
        else:
            to, how = (("int8 or int16", "TensorQuantOverrides with an 8- or 16-bit type") if narrow
                       else ("int16", "TensorQuantOverrides with a 16-bit type"))
        if not own:
            # keeping them in float is advised too: where that departs from the simulation, the note
            steps.append(("", f"raise {_names([it['node'] for it in wide])} to {to} ({how}), or keep them in float, "
                              "and re-check" + _notes(notes)))
            choices.update(dict.fromkeys([c for c in raised if qm.wider_type(qm.calibration[c])], "int16"))
    if len(wide) < len(rest):
        others = _calibration(qm, [it for it in rest if it not in wide])
        steps.append(("", f"keep {_names([it['node'] for it in rest if it not in wide])} in float, or fix the model "
                          "there, and re-check" + (_notes(_kept(qm, others, float_model)[1]) if others else "")))
    choices.update(dict.fromkeys(floats, "float"))  # a node kept in float needs nothing else
    return [text for _, text in steps], choices


def _kept(qm, nodes, float_model):
    """``(call, notes)`` keeping calibration ``nodes`` in float in the terms the steps give it:
    Model Optimizer's own for its models (it excludes a pair's readers, not quantize_static's
    producer and readers of a tensor), from its terms; else onnxruntime's settings. ``call``:
    "" where nothing is excluded; ``notes``: where the exclusion does otherwise than the
    simulation (a requantize chain's later pair), the sentences of the terms that give it."""
    if qm is not None and qm.made_by.key == "modelopt":
        try:
            settings, notes = kept_in_float(qm, nodes, float_model)
        except PTQError as exc:
            return f"Model Optimizer's nodes_to_exclude cannot be named: {exc}", []
        return modelopt_call(settings), notes
    kept = onnxruntime_settings(qm, "float", nodes)
    exclude = kept["nodes_to_exclude"]
    return (f"{quantizer_call(qm)}(..., nodes_to_exclude={exclude}){_on_float(qm)}" if exclude else ""), \
        kept.get("notes", [])


def _on_float(qm):
    """" on the float model" where another quantizer made the model (Model Optimizer, Quark,
    Neural Compressor, aimet: their own terms follow the steps): onnxruntime's call re-quantizes
    the float model, and a step naming it alone read as a call on the file given."""
    return " on the float model" if qm is not None and qm.made_by.key in PRODUCERS else ""


def _notes(notes):
    """``notes`` on keeping nodes in float, where the exclusion does otherwise than the
    simulation: their own sentences, as the remedy prints them."""
    return "".join(f"; note: {n}" for n in notes)


def _calibration(qm, items):
    """The calibration nodes of ranked ``items``: an operator's inputs (but its bias), or the
    calibration node itself."""
    if qm is None:
        return []
    return [c for it in items for c in (qm.quantizing(it["node"]) if it["kind"] == "node" else [it["node"]])
            if qm.calibration[c].role != "bias"]


# -- summary text -----------------------------------------------------------------------------
def _outputs_text(names, shown=5):
    """The outputs compared, the first ``shown`` of many (60 made one line 1600 wide)."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more (summary.json lists them)" if more > 0 else "")


def _v(x):
    if isinstance(x, float):
        # 8 significant digits: cosines that matter differ in the 5th-7th decimal; a
        # similarity a hair below 1 keeps the digits that say so (0.9999999982 read "1", as
        # an exact 1 of a pair that stores its values exactly does)
        text = f"{x:.8g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.3e}"
        return fmt(x) if abs(float(text)) == 1 and abs(x) != 1 else text
    return str(x)


def _by_correlation(v, metric):
    """The verdict by correlation on the outputs too far from zero for ``metric``, as lines."""
    by = v.get("by_correlation")
    if not by:
        return ()
    one = len(by["outputs"]) == 1
    return (f"**By correlation on {_names(by['outputs'])}, {'which sits' if one else 'which sit'} too far from zero "
            f"for {metric} to see {'its' if one else 'their'} errors (see Warnings): {by['text']}.**", "")


def _ranking_text(summary):
    ranking = summary.get("ranking") or {}
    text = ranking.get("text") or f"rankings on {summary['samples']} sample(s)"
    unstable = [t for t, c in ranking.get("confidence", {}).items() if c.get("stable") is False]
    if unstable:
        text += f" (the top of the {' and '.join(unstable)} ranking is not stable over the samples)"
    return text


def _origin_text(at):
    """One node's "own or inherited" cell text, from :func:`_at`."""
    local = f"non-finite: {at['pole']}" if at.get("pole") else _v(at["local"])
    if at["origin"] == "unmeasured":
        return f"not measured at {_code(at['at'], table=True)} (its float values are not finite)"
    return (f"{'own' if at['origin'] == 'local' else 'inherited'} at {_code(at['at'], table=True)} "
            f"(local {local}, fully quantized {_v(at['accumulated'])})")


def markdown(summary):
    """The human summary of a runall result: verdict, top nodes, next steps, files."""
    v = summary["verdict"]
    m = v["metric"]
    sets = list(v["values"])
    lines = [f"# PTQ debug summary: {Path(summary['model']).name}", "",
             f"Model `{summary['model']}` ({summary.get('format', 'QDQ')} format, made by "
             f"{summary.get('made_by', 'an unknown producer')}); {_ranking_text(summary)}, metric {m} on "
             f"{_outputs_text(summary['outputs_compared'])}.", "",
             *(line for note in summary.get("output_parts", []) for line in (f"Note: {note}.", "")), "## Verdict", "",
             f"**{v['text'][0].upper() + v['text'][1:]}.**", "",
             *_by_correlation(v, m),
             "| config | " + " | ".join(f"{m}, {k} ({v['samples'][k]} samples)" for k in sets) + " |",
             "|---|" + "---|" * len(sets)]
    for label, key in (("weights only quantized", "weight only"), ("activations only quantized", "activation only"),
                       ("everything quantized", "all quantized")):
        lines.append(f"| {label} | " + " | ".join(_v(v["values"][k][key]) for k in sets) + " |")
    lines += ["", f"Rule: {v['rule']} (decided on the {v['decided_on']} data)."]
    if v.get("disagreement"):
        lines += ["", f"Note: {v['disagreement']}."]
    lines.append("")
    for t, names in summary["top_nodes"].items():
        lines += [f"## Most sensitive {params.KIND_WORDS[t]} nodes", "",
                  f"| rank | node | {m} | try | why | error of the node it feeds: own or inherited |",
                  "|---|---|---|---|---|---|"]
        for it in (i for i in v["nodes"] if i["kind"] == t):
            origin = ""
            if it.get("origin") == "unowned":
                origin = (f"none: a pair on {_code(it['tensor'], table=True)} straight to a model output, which no "
                          "operator reads or computes" + (" (ranked on its own)" if t == "node" else ""))
            elif it.get("origin"):
                origin = "; ".join(_origin_text(at) for at in (it, *it.get("also", ())))
            lines.append(f"| {it['rank']} | {_code(it['node'], table=True)} | {NO_VALUES if it[m] is None else _v(it[m])} | {', '.join(it['try']) or '-'} | "
                         f"{'; '.join(it['reasons'])} | {origin} |")
        if not names:
            lines.append("| - | (none: nothing of this kind can be bypassed) | | | | |")
        lines.append("")
    lines += ["## What to try next", ""]
    for k, step in enumerate(v["next_steps"], 1):
        first, *more = step.split("\n")
        lines.append(f"{k}. {first}")
        if more:  # code to paste: a code block inside the list item
            lines += ["", *("       " + m for m in more), ""]
    if not v["next_steps"]:
        lines.append("nothing stands out.")
    lines += ["", "## Files", ""]
    files = summary["files"]
    lines.append(f"- `{Path(files['acc_error']).name}`: weight-only, activation-only and fully quantized "
                 "cumulative error curves, with each node's local error"
                 + "".join(f"; {printable(note)}" for note in no_point_notes(summary["curves"].get("no_values"))))
    for t, p in files["sensitivity"].items():
        lines.append(f"- `{Path(p).name}`: {t} sensitivity (reload with `Sensitivity.load`)")
    lines.append(f"- `distributions/`: {len(files['distributions'])} histograms; "
                 f"`channelwise/`: {len(files['channelwise'])} per-channel box plots")
    lines.append("- `summary.json`: every number above and behind the plots")
    empty = [k for k, d in summary["distributions"].items() if "skipped" in d]
    if empty:
        lines.append(f"- no histogram for {', '.join(_code(k) for k in empty)} ({_code(empty[0])}: "
                     f"{summary['distributions'][empty[0]]['skipped']})")
    skipped = [k for k, d in summary["channelwise"].items() if "skipped" in d]
    if skipped:
        first = summary["channelwise"][skipped[0]]["skipped"]
        lines.append(f"- no box plot for {', '.join(_code(k) for k in skipped)} ({_code(skipped[0])}: {first})")
    if summary["warnings"]:
        told = [warning(w) for w in summary["warnings"]]
        lines += ["", "## Warnings", ""] + [line for w in told
                                            for line in warning_lines(w["text"], w["fix"], "- ", "  - fix: ")]
    t = summary["timings_s"]
    lines += ["", "Timings (s): " + ", ".join(f"{k} {val}" for k, val in t.items()), ""]
    return "\n".join(lines)



"""Several samples in one run, where the model allows it and it is faster.

Rankings score every config on every sample. Stacking samples along the batch axis runs
each config once per group instead of once per sample, which onnxruntime executes faster
on some models (matrix-heavy ones) and slower on others (a batch-1 convolution already
uses every core), so the engine measures before it decides. A group is used only when

* no quantizer computes its range per run (DynamicQuantizeLinear: the range of a stacked
  batch is not the range of each sample) and no Q/DQ is a custom op of unknown semantics;
* every sample has batch size 1, all have the same shapes, and every model input and
  output has a batch axis first
  (Reshapes to constant shapes, where batch-1 exports fix the batch, leave their first axis
  to the stack: see :meth:`.segments.Segments._rebatched`);
* the stacked run gives what the samples give one at a time (float, and every activation
  quantized: weight quantizers see no sample), to within float rounding (a different
  kernel may sum in another order), each output holding one row per sample. The check
  stacks the two most different of the samples run, and the tolerance is a
  share of how far their outputs differ: a graph that mixes the batch (a mean over axis 0)
  moves a sample by a share of that difference, so two equal or nearly equal samples (the
  first frames of a video) would pass any tolerance, and the choice holds for every group; and
* its float pass is at least :data:`MIN_GAIN` times faster, measured on the first samples:
  stacks of 2, 4, ... are tried while each is faster than the last, and the fastest is
  kept (the PP-OCRv4 detector ran 0.90x as fast by 2, 0.88x by 4, 0.83x by 8: one at a
  time; a MatMul stack 3.2x faster by 8). Stacked runs hand their buffers back when they end (see
  :func:`.runtime.run`), so the trial does not leave every session sized for the stack.

Otherwise samples run one at a time, as before. Only model outputs run in groups (through
the segments); tensors of single nodes always run one sample at a time.
"""

from __future__ import annotations

import dataclasses
import re
import time

import numpy as np

from ..errors import PTQError, shown
from ..model.graph import declared_dims
from .runtime import trim_memory

MAX_GROUP = 8
# A trial times whole float passes, a ranking's configs their downstream part, and the trial
# itself costs a few passes: a small gain would not pay for it.
MIN_GAIN = 1.25
REPEAT = 3  # timings of a trial: the best of these (one run moves by tens of percent on a shared machine)
RTOL, ATOL = 1e-3, 1e-4  # atol relative to the largest magnitude of each output
# Stacked against one at a time: at most this share of how far the two samples' outputs differ,
# or of the output's largest magnitude (float rounding) where that is more. A graph mixing the
# batch moves a sample by about half of that difference.
SPREAD_SHARE, ROUNDING = 1e-2, 1e-5
PROBE = 32  # samples spread over those run, among which the check's two are chosen


@dataclasses.dataclass(frozen=True)
class Batching:
    """The engine's choice: ``size`` samples per run (1: one at a time), ``reason`` in words
    and ``gain`` (one-at-a-time time / grouped time, None when not measured)."""

    size: int
    reason: str
    gain: float | None = None


def stack(samples):
    """One feed dict of the samples (``[{input: array}]``) stacked on axis 0."""
    return {name: np.concatenate([s[name] for s in samples], axis=0) for name in samples[0]}


def split(values, count):
    """``count`` per-sample dicts of the stacked ``values`` (axis 0 split into size 1)."""
    return [{t: v[j:j + 1] for t, v in values.items()} for j in range(count)]


def groups(indices, size):
    """``indices`` cut into consecutive groups: tuples of up to ``size`` (a lone sample stays an int)."""
    if size <= 1:
        return list(indices)
    out = []
    for k in range(0, len(indices), size):
        part = tuple(indices[k:k + size])
        out.append(part if len(part) > 1 else part[0])
    return out


def _blocker(engine):
    """Why the model cannot run samples in groups, or None."""
    qm = engine.qmodel
    if engine.segments is None:
        return "the engine runs without segments"
    if any(c.kind == "dynamic" for c in qm.calibration.values()):
        return "a quantizer computes its range per run (DynamicQuantizeLinear)"
    if qm.custom_ops:
        return "custom Q/DQ ops of unknown batch semantics"
    for value_info in list(qm.model.graph.input) + list(qm.model.graph.output):
        if value_info.name in qm.inits:
            continue
        dims = declared_dims(value_info)
        if not dims or dims[0] not in (None, 1):
            return f"{value_info.name!r} has no batch axis of size 1 first"
    return None


def _largest(a):
    # the finite values set a tolerance: an output gone infinite (a Log of a code 0) would make
    # it infinite, which numpy warns of; infinities themselves compare as equal or not
    a = np.asarray(a, np.float64)
    finite = np.abs(a[np.isfinite(a)])
    return float(np.max(finite)) if finite.size else 0.0


def _close(alone, stacked):
    """Whether ``stacked`` equals the samples' outputs ``alone`` concatenated, to within
    rounding and :data:`SPREAD_SHARE` of how far the samples differ."""
    a = np.concatenate(alone, axis=0)
    if a.shape != stacked.shape:
        return False
    scale = _largest(a)
    if not np.allclose(a, stacked, rtol=RTOL, atol=ATOL * max(scale, 1e-30), equal_nan=True):
        return False
    with np.errstate(invalid="ignore"):
        spread = max(_largest(o - alone[0]) for o in alone[1:])
        moved = _largest(a - stacked)
    return moved <= max(SPREAD_SHARE * spread, ROUNDING * scale)


def _probe(engine, indices):
    """The two most different samples among :data:`PROBE` spread over ``indices`` (those the
    caller runs: a sample limit is never read past), as a key."""
    count = len(indices)
    spread = [indices[k] for k in sorted({round(k * (count - 1) / (PROBE - 1)) for k in range(PROBE)})]
    if len(spread) <= 2:
        return tuple(spread)
    def flat(i):
        return np.concatenate([np.asarray(v, np.float64).ravel() for v in engine.data.sample(i).values()])

    def farthest(k):  # one sample held at a time beside ``k``'s: large inputs are not all kept
        ref = flat(spread[k])
        return max(range(len(spread)), key=lambda j: float(np.abs(flat(spread[j]) - ref).max()))

    # the farthest from the first, then the farthest from that one: near the most different pair
    first = farthest(0)
    second = farthest(first)
    return tuple(sorted({spread[first], spread[second]})) if first != second else tuple(indices[:2])


def decide(engine, indices, size=MAX_GROUP, grow=True):
    """:class:`Batching` for ``engine``: stacks of 2, 4, ... up to ``size`` of ``indices`` are
    tried while each is faster than the last, and the fastest is kept (``grow=False``: only
    ``size`` is tried). Times are the best of :data:`REPEAT` float passes; the stacked values
    are checked (:func:`_differs`) once a stack is faster or ``size`` was asked for."""
    if len(indices) < 2:
        return Batching(1, "fewer than two samples")
    why = _blocker(engine)
    if why is None and any(np.shape(v)[:1] != (1,) for i in indices[:size] for v in engine.sample(i).values()):
        why = "a sample holds more than one item"
    # every sample, not only the trial's: the choice is kept for every later run of the data
    if why is None and len({engine.data.shapes(i) for i in range(len(engine.data))}) > 1:
        why = "samples differ in shape (an open axis varies: sequence lengths, image sizes)"
    if why is not None:
        return Batching(1, why)
    best, count = None, 2 if grow else size
    while True:
        count = min(count, size, len(indices))
        gain = _gain(engine, tuple(indices[:count]))
        if isinstance(gain, str):
            return Batching(1, gain)
        if best is not None and gain <= best.gain:
            return best
        slower = Batching(1, f"stacking {count} samples is not faster here ({gain:.2f}x)", gain)
        if gain < MIN_GAIN and grow:
            return slower
        # checked once it pays (or was asked for): the check compiles quantized segments for stacks too
        why = _differs(engine, _probe(engine, indices)) if best is None else None
        if why is not None:
            return Batching(1, why)
        if gain < MIN_GAIN:
            return slower
        best = Batching(count, f"{count} samples per run, {gain:.2f}x faster than one at a time", gain)
        if count >= min(size, len(indices)):
            return best
        count *= 2


def _differs(engine, key):
    """Why the samples ``key`` stacked do not give what they give one at a time (float, and
    every activation quantized), or None. Weight quantizers see no sample, so they are left
    out: fake-quantizing every weight is most of a fully quantized pass's cost."""
    names = set(engine.calib_names)
    acts = [c.name for c in engine.qmodel.calibration.values() if c.kind != "weight" and c.name in names]
    try:
        one = [(engine.reference(i), engine.run(i, acts)) for i in key]
        for i in key:  # a sample's kept boundaries would sit beside the stack's buffers
            engine.forget(i)
        for name, value in one[0][0].items():
            if np.shape(value)[:1] != (1,):
                # a stack's rows would not be its samples (a batch folded into rows, a flattened output)
                rows = f"{np.shape(value)[0]} rows" if np.ndim(value) else "no rows"
                return f"output {name!r} holds {rows} for one sample, not one"
        if len(key) < 2 or not any(_largest(np.asarray(o[0][n], np.float64) - np.asarray(one[0][0][n], np.float64))
                                   for o in one[1:] for n in o[0]):
            return "the samples checked give equal outputs, so a stack of them cannot show whether the graph mixes them"
        stacked = (engine.segments.float_outputs(key, engine.sample(key)), engine.run(key, acts))
        for k, values in enumerate(stacked):
            for name, value in values.items():
                if not _close([o[k][name] for o in one], value):
                    return f"stacked samples give other values at {name!r} (the graph mixes or fixes its batch somewhere)"
    except Exception as exc:  # noqa: BLE001 - a graph that rejects a batch only loses the speed-up
        return _rejected(exc)
    finally:
        engine.forget(key)
        # the check's whole-graph sessions (one sample, and stacked) serve no ranking's config:
        # an 8000-node MatMul stack held 100 MiB in them through its ranking
        engine.forget_config(acts)
        trim_memory()  # the stack's buffers, freed by the arenas, back to the system
    return None


def _rejected(exc):
    text = str(exc)
    # onnxruntime names the node that fails and why; the rest (the file, what to check when a
    # model does not run at all) says nothing about a stack, which only loses the speed-up
    node = re.search(r"running (\S+) node\. Name:'([^']*)' Status Message: (?:\S+:\d+ )?(.*?)(?:; the model does not|$)",
                     text)
    if node:
        return (f"the graph does not take stacked samples: its {node[1]} node {node[2]!r} fails on them "
                f"({shown(node[3], 120)})")
    text = text.split(": ", 1)[-1] if isinstance(exc, PTQError) else f"{type(exc).__name__}: {exc}"
    return f"the graph does not take stacked samples ({shown(text, 160)})"


def _gain(engine, key):
    """How many times faster the float pass of the samples ``key`` runs stacked than one at
    a time, best of :data:`REPEAT`; or why the graph cannot run them stacked. The float pass
    is the proxy: a ranking's configs run float segments but for the one they touch, and it
    costs a trial no fake-quantization."""
    segments = engine.segments
    samples = {i: engine.sample(i) for i in key}
    stack_feed = stack([samples[i] for i in key])
    alone, grouped = [], []
    try:
        # untimed first runs: they compile the sessions and size onnxruntime's buffers, so that
        # each of the REPEAT timings is a clean one (the first of each was not, which left a best
        # of 2; an 8000-node stack's trial read 1.08x in one run against 1.4-2.7x in the others,
        # and its ranking, one sample at a time, took twice as long)
        segments.float_outputs(key[0], samples[key[0]])
        segments.float_outputs(key, stack_feed)
        for _ in range(REPEAT):
            seconds = 0.0
            for i in key:
                start = time.perf_counter()
                segments.float_outputs(i, samples[i])
                seconds += time.perf_counter() - start
            alone.append(seconds)
            start = time.perf_counter()
            segments.float_outputs(key, stack_feed)
            grouped.append(time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - as in _differs
        return _rejected(exc)
    finally:
        engine.forget(key)
        trim_memory()
    return min(alone) / max(1e-12, min(grouped))

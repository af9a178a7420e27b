"""Which tensors a metric is computed on: model outputs, intermediate tensors, or slices.

A slice is written like numpy indexing after a tensor name, ``"output0[:, 0:4]"``, and may
be named: ``"boxes=output0[:, :4]"``. A whole-tensor cosine of 0.999 can hide a collapse of
small-valued class scores beside large box coordinates; slicing them apart shows it. So by
default an output that concatenates parts whose magnitudes differ by :data:`APART` or more
(a detector's box coordinates in pixels beside its class scores in 0..1, told apart by the
graph's Concat and the float values of the first sample) is scored part by part, each part a
slice named like one a user would write.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from pathlib import Path

import numpy as np

from . import params
from .errors import PTQError, PTQWarning, shown, unknown, user_level
from .model.qdq import attribute

_SLICE = re.compile(r"^\s*(?:(?P<alias>[^=\[\]]+?)\s*=\s*)?(?P<tensor>[^\[\]]+?)\s*(?:\[(?P<index>[^\]]*)\])?\s*$")


APART = 10.0  # RMS ratio of adjacent concatenated parts scored apart: a part 10x smaller weighs
# 1/100 per element in a whole-tensor cosine or error, so its collapse moves the whole by ~1e-2
# An output whose float values, every one replaced by their mean, still read this cosine sits
# so far from zero that a cosine (or an SQNR, or a relative error) cannot see it flattened
FLAT_COSINE = 0.99
OFFSET_SAMPLES = 8  # samples an output constant within each (a score, a scalar) is judged over
OFFSET_BLIND = ("cosine-similarity", "sqnr", "mre")  # the metrics an offset inflates
OFFSET_WARNING = "an output sits so far from zero that cosine similarity cannot see its errors"
ZERO_WARNING = "an output is 0 in float, where a metric scaled by its values is undefined"
KL_WARNING = "kl cannot see errors in an output whose last axis holds one value"
_THROUGH = ("QuantizeLinear", "DequantizeLinear", "Identity", "Cast")  # keep every element in place


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """A named view on one tensor: ``name`` is what results are keyed by; ``rms``: for a part
    of a concatenated output scored apart by default, its float RMS on the first sample."""

    name: str
    tensor: str
    index: tuple = ()
    rms: float | None = None

    def take(self, array):
        """The values this spec names in ``array`` (the tensor's values); one sentence where
        the slice does not fit them (a shape the model left open)."""
        if not self.index:
            return array
        try:
            part = array[self.index]
        except (IndexError, ValueError, TypeError) as exc:
            raise PTQError(f"output slice {self.name!r} does not fit {self.tensor!r}, of shape {list(np.shape(array))} "
                           f"here ({exc}); slice within that shape") from None
        # where the tensor holds no values on this sample (a detector's rows on an image with no
        # detection) the slice has none either, as the whole output has none: no values compared here,
        # as for the whole output; only a slice that selects none of values held is wrong
        if not np.size(part) and np.size(array):
            raise PTQError(f"output slice {self.name!r} selects no values of {self.tensor!r}, of shape "
                           f"{list(np.shape(array))} here; slice within that shape")
        return part

    def view(self, qmodel):
        """``(tensor, index)`` with the index written one way: slices as ``(start, stop, step)``
        with the defaults filled in (the axis' extent where ``qmodel`` declares it), negative
        integers counted from that end, and the trailing whole axes and ``...`` left off, so
        that two spellings of the same values (``out[0:2]`` and ``out[:2]``, ``out`` and
        ``out[:]``) compare equal."""
        shape = qmodel.shapes.get(self.tensor) or None
        index = list(self.index)
        if Ellipsis in index and shape is not None and len(index) - 1 <= len(shape):
            k = index.index(Ellipsis)
            index[k:k + 1] = [slice(None)] * (len(shape) - len(index) + 1)
        parts, axis = [], 0
        for part in index:
            dim = shape[axis] if shape is not None and axis < len(shape) and Ellipsis not in parts else None
            dim = dim if isinstance(dim, int) and dim > 0 else None
            if part is Ellipsis:
                parts.append(part)
                continue
            if isinstance(part, slice):
                if dim is not None:
                    part = part.indices(dim)
                else:
                    step = 1 if part.step is None else part.step
                    part = (0 if part.start is None and step > 0 else part.start, part.stop, step)
                whole = part == ((0, dim, 1) if dim is not None else (0, None, 1))
                parts.append(None if whole else part)
            else:
                parts.append(part % dim if dim is not None and part < 0 else part)
            axis += 1
        while parts and (parts[-1] is None or parts[-1] is Ellipsis):
            parts.pop()
        return self.tensor, tuple(parts)


def distinct(specs, qmodel):
    """``specs`` less those selecting the same values as an earlier one (``out[0:2]`` after
    ``out[:2]``, ``out[:]`` after ``out``; :meth:`OutputSpec.view`): each output is compared
    once, under its first name."""
    seen, out = set(), []
    for s in specs:
        view = s.view(qmodel)
        if view not in seen:
            seen.add(view)
            out.append(s)
    return out


def _parse_index(text, spec):
    parts = []
    for part in text.split(","):
        part = part.strip()
        try:
            if part == "...":
                value = Ellipsis
            elif ":" in part:
                bits = [int(b) if b.strip() else None for b in part.split(":")]
                if len(bits) > 3:
                    raise ValueError
                value = slice(*bits)
            else:
                value = int(part)
        except ValueError:
            raise PTQError(f"output slice {spec!r} has an index part {part!r} that is not an integer, "
                           "a start:stop[:step] slice or '...'; write it like 'output0[:, 0:4]'") from None
        if value is Ellipsis and Ellipsis in parts:
            raise PTQError(f"output slice {spec!r} has '...' twice; it may stand for the other axes once")
        if isinstance(value, slice) and value.step == 0:
            raise PTQError(f"output slice {spec!r} has a step of 0 in {part!r}; a step is a nonzero integer")
        parts.append(value)
    return tuple(parts)


def is_named(name, qmodel):
    """Whether ``qmodel`` has a tensor or normal node named exactly ``name``, which
    :func:`parse_output` reads as that tensor before any slice syntax."""
    return name in qmodel.producer or name in qmodel.input_names or name in qmodel.normal


def key_of(name):
    """The key that names the output ``name`` (a tensor, or a default part) in a per-output
    mapping (a contract's ``outputs``, ``--target-cosine OUTPUT=VALUE``): the name itself, but
    ``default=default`` for a tensor named ``default``, as the bare key is the outputs not
    named (:func:`~pytest_ptq.params.thresholds`)."""
    return "default=default" if name == "default" else name


def parse_output(spec, qmodel):
    """An :class:`OutputSpec` for a tensor, normal node or slice description."""
    if isinstance(spec, OutputSpec):
        return spec
    # a tensor or node named exactly so wins over the slice syntax: an exporter's name may hold
    # '=' or '[0]' (the default outputs are named back through here too)
    exact = str(spec)
    if exact in qmodel.producer or exact in qmodel.input_names:
        return OutputSpec(name=exact, tensor=exact, index=())
    if exact in qmodel.normal:  # named by the tensor it writes, as through the slice syntax
        tensor = qmodel.normal[exact].outputs[0]
        return OutputSpec(name=tensor, tensor=tensor, index=())
    m = _SLICE.match(str(spec))
    if not m:
        raise PTQError(f"output {spec!r} is not a tensor name or a slice like 'output0[:, 0:4]'")
    tensor = m.group("tensor")
    if tensor not in qmodel.producer and tensor not in qmodel.input_names:
        if tensor in qmodel.normal:
            tensor = qmodel.normal[tensor].outputs[0]
        else:
            raise unknown("output", tensor, qmodel.output_names + list(qmodel.normal), usual=qmodel.output_names)
    index = _parse_index(m.group("index"), spec) if m.group("index") is not None else ()
    _check_index(spec, tensor, index, qmodel.shapes.get(tensor))
    name = m.group("alias") or (str(spec).strip() if index else tensor)
    return OutputSpec(name=name.strip(), tensor=tensor, index=index)


def _check_index(spec, tensor, index, shape):
    """Refuse, before any work, a slice that does not fit ``tensor``'s ``shape`` as the model
    declares it (axes left open are checked when the values come, in :meth:`OutputSpec.take`)."""
    if shape is None or not index:
        return
    axes = [p for p in index if p is not Ellipsis]
    if len(axes) > len(shape):
        raise PTQError(f"output slice {spec!r} indexes {len(axes)} axes of {tensor!r}, which has {len(shape)} "
                       f"({shape}); index at most {len(shape)}")
    if Ellipsis in index:
        k = index.index(Ellipsis)
        dims = shape[:k] + shape[len(shape) - (len(index) - k - 1):]
    else:
        dims = shape[:len(axes)]
    for part, dim in zip(axes, dims):
        if not isinstance(dim, int) or dim <= 0:
            continue
        if isinstance(part, int) and not -dim <= part < dim:
            raise PTQError(f"output slice {spec!r} takes index {part} of an axis of {tensor!r} that has {dim} "
                           f"({shape}); use an index below {dim}")
        if isinstance(part, slice) and not len(range(*part.indices(dim))):
            raise PTQError(f"output slice {spec!r} selects nothing of an axis of {tensor!r} that has {dim} "
                           f"({shape}); slice within it")


def parse_outputs(output_node, model):
    """OutputSpecs for ``output_node`` (None = every float model output, or every output
    where none is float; a name; or a list). ``model``: a QuantModel, or an Engine with data,
    whose float values split a concatenated default output into its parts (see
    :func:`parts`). Two spellings of one output are one, under the first (:func:`distinct`)."""
    qmodel = getattr(model, "qmodel", model)
    if output_node is None:
        # a bool mask or integer ids passed through carry no quantization error a metric
        # could weigh (cosine of a mask is 1 whatever happens), unless nothing else is there
        floats = [n for n in qmodel.output_names if qmodel.is_float_tensor(n)]
        specs = [s for n in floats or qmodel.output_names for s in parts(model, n)]
    else:
        if isinstance(output_node, (str, OutputSpec)):
            items = [output_node]
        elif isinstance(output_node, (list, tuple)) and all(isinstance(o, (str, OutputSpec)) for o in output_node):
            items = list(output_node)
            if not items:  # nothing to score: every figure would be NaN
                raise PTQError(f"output_node is empty; name the outputs to score ({', '.join(qmodel.output_names)}), or "
                               "leave it out (None) for every output")
        else:
            raise PTQError(f"output_node must be an output name, a slice such as 'out[:, 0:4]' or a list of them, "
                           f"got {shown(output_node)}")
        specs = distinct(_parse_each(items, qmodel), qmodel)
    return _named_once(specs)


def _parse_each(items, qmodel):
    specs = [parse_output(o, qmodel) for o in items]
    for tensor in dict.fromkeys(s.tensor for s in specs if not qmodel.is_float_tensor(s.tensor)):
        warnings.warn(PTQOutputWarning(
            f"output {tensor!r} holds {_type_name(qmodel, tensor)} values (ids or a mask?): an output metric of "
            "them depends on how the ids are numbered (id 0 weighs nothing in a cosine); name the float tensor "
            "they come from (the scores before an ArgMax), or count matching ids in an accuracy evaluate "
            "function"), stacklevel=user_level())
    return specs


def _named_once(specs):
    names = [s.name for s in specs]
    if len(set(names)) != len(names):  # two views under one name: their figures would be one
        raise PTQError(f"output names {names} repeat; give each slice its own name with 'name=tensor[...]'")
    return specs


def thresholds(spec, model):
    """:func:`~pytest_ptq.params.thresholds` of ``spec`` on ``model``'s outputs: its key
    ``default`` is the outputs not named, and refused where the model has a tensor or node so
    named (that one is ``default=default``). The model is read only for that key; the refusal
    names it as the checks' messages do (an analysis's ``label``), else by its file name."""
    clash = None
    if isinstance(spec, dict) and "default" in spec:
        qmodel = getattr(model, "qmodel", model)
        if is_named("default", qmodel):
            clash = getattr(model, "label", None) or Path(qmodel.source).name
    return params.thresholds(spec, clash)


def targeted(given, model, metric):
    """The outputs the keys of ``given`` (``{key: value}`` as :func:`thresholds` gives it) name,
    as ``(specs, {name: value}, {name: key})``: keys naming the same values (``out[0:2]`` and
    ``out[:2]``) are one output, under the first key, held to the strictest of their values
    for ``metric`` (a :class:`~pytest_ptq.metrics.Metric`); the default ``""`` names none."""
    keys = [k for k in given if k]
    if not keys:
        return [], {}, {}
    qmodel = getattr(model, "qmodel", model)
    each = _parse_each(keys, qmodel)
    specs = _named_once(distinct(each, qmodel))
    first = {s.view(qmodel): s.name for s in specs}
    values, named = {}, {}
    for s, k in zip(each, keys):  # the spellings of one output: every bar met is the strictest met
        name = first[s.view(qmodel)]
        values[name] = given[k] if name not in values else strictest(metric, (values[name], given[k]))
        named.setdefault(name, k)
    return specs, values, named


def strictest(metric, values):
    """The strictest of targets of ``metric`` (a :class:`~pytest_ptq.metrics.Metric`): the
    best value, which meets every other; the first of equals."""
    values = iter(values)
    best = next(values)
    for v in values:
        if metric.worse(best, v):
            best = v
    return best


def others(candidates, specs, qmodel):
    """``candidates`` (the default outputs, or those of ``output_node``) that ``specs`` leave:
    not of a name they hold, the same values, or part of a tensor they name whole; each once."""
    names = {s.name for s in specs}
    views = {s.view(qmodel) for s in specs}
    return distinct([c for c in candidates if c.name not in names and c.view(qmodel) not in views
                     and (c.tensor, ()) not in views], qmodel)


class PTQOutputWarning(PTQWarning):
    """An output named for a metric that cannot judge it (integer ids)."""


def _type_name(qmodel, tensor):
    from onnx import TensorProto

    t = qmodel.value_types.get(tensor)
    return TensorProto.DataType.Name(t).lower() if t is not None else "non-float"


def layouts(qmodel, tensor):
    """``[(axis, [extent of each part])]``: the ways ``tensor`` is a concatenation, axes in
    its own order: a Concat's output seen through Q/DQ, Identity, Cast, Transpose and a
    Reshape that keeps the parts' axis (:func:`_kept_axis`; nested Concats on the same axis
    flattened), and the layout its inputs all share on another axis (YOLOv5's levels, each
    ``[xy, wh, scores]`` on the last axis, concatenated along the anchors). A part's extent comes from the inferred
    shapes; one may be unknown (None): :func:`unlike_parts` reads it off the value."""
    memo = {}

    def walk(t):
        if t not in memo:
            memo[t] = []
            memo[t] = _layouts(qmodel, t, walk)
        return memo[t]

    try:
        return walk(tensor)
    except RecursionError:  # Concats nested past Python's stack: scored whole
        return []
    finally:
        # the function refers to itself: its cycle held the model (and its mapped file) past
        # the engine's last reference, until the cyclic collector ran
        walk = None  # noqa: F841


def _layouts(qmodel, tensor, walk):
    node = qmodel.producer.get(tensor)
    if node is None:
        return []
    if node.op_type in _THROUGH:
        return walk(node.input[0])
    if node.op_type == "Transpose":
        perm = attribute(node, "perm")
        return [] if perm is None else [(list(perm).index(a), e) for a, e in walk(node.input[0])]
    if node.op_type == "Reshape":
        src, dst = qmodel.shapes.get(node.input[0]) or (), qmodel.shapes.get(tensor) or ()
        if not src or not dst:
            return []
        kept = ((_kept_axis(src, dst, a), e) for a, e in walk(node.input[0]))
        return [(b, e) for b, e in kept if b is not None]
    rank = len(qmodel.shapes.get(tensor) or ())
    if node.op_type != "Concat" or not rank:
        return []
    axis = attribute(node, "axis", 0) % rank
    subs = [walk(i) for i in node.input]
    extents = []
    for inp, sub in zip(node.input, subs):
        nested = next((e for a, e in sub if a == axis), None)
        shape = qmodel.shapes.get(inp) or ()
        extents += nested if nested is not None else [shape[axis] if len(shape) == rank else None]
    known = [e for e in extents if e is not None]
    out = [] if len(known) < len(extents) - 1 or min(known, default=1) <= 0 else [(axis, extents)]
    out += [(a, e) for a, e in subs[0] if a != axis and all((a, e) in sub for sub in subs[1:])]
    return out


def _kept_axis(src, dst, a):
    """The axis of a Reshape's output ``dst`` (a shape) that axis ``a`` of its input ``src``
    becomes element for element, or None: the same extent, and as many elements before it
    (YOLOX's ``[1, 6, H, W]`` flattened to ``[1, 6, H*W]`` keeps its channels), or the last
    axis kept last."""
    if src[a] is None:
        return None
    if a == len(src) - 1 and src[a] == dst[-1]:
        return len(dst) - 1
    known = all(isinstance(d, int) for d in (*src[:a], *dst))
    for b, d in enumerate(dst):
        if d != src[a]:
            continue
        if known and math.prod(src[:a]) == math.prod(dst[:b]):
            return b
        # an unknown dimension before (a dynamic batch): the same dimensions before, and as
        # many elements after ([N, 6, 4] to [-1, 6, 2] keeps no axis)
        after = (*src[a + 1:], *dst[b + 1:])
        if not known and list(src[:a]) == list(dst[:b]) and all(isinstance(x, int) for x in after) and \
                math.prod(src[a + 1:]) == math.prod(dst[b + 1:]):
            return b
    return None


def unlike(value, candidates):
    """``(axis, [(start, stop, RMS)])`` of the first of ``candidates`` (:func:`layouts`) that
    cuts ``value`` into runs of unlike parts (:func:`unlike_parts`), or None."""
    for axis, extents in candidates:
        runs = unlike_parts(value, axis, extents)
        if runs:
            return axis, runs
    return None


def parts(model, tensor):
    """``tensor``'s default specs: the whole, or, when ``model`` is an Engine with data and
    ``tensor`` concatenates parts whose float RMS on the first sample differ by :data:`APART`
    or more from one part to the next, one slice per run of parts within that of each other
    (parts that are all zero join their neighbour), in axis order."""
    whole = [OutputSpec(tensor, tensor)]
    qmodel = getattr(model, "qmodel", None)
    candidates = [] if qmodel is None or getattr(model, "data", None) is None else layouts(qmodel, tensor)
    found = unlike(model.reference(0, [tensor])[tensor], candidates) if candidates else None
    if found is None:
        return whole
    axis, runs = found
    lead = (slice(None),) * axis
    return [OutputSpec(f"{tensor}[{', '.join([':'] * axis + [f'{a}:{b}'])}]", tensor, lead + (slice(a, b),), rms)
            for a, b, rms in runs]


def unlike_parts(value, axis, extents):
    """``[(start, stop, RMS)]`` along ``axis`` of ``value`` cut into parts of ``extents``:
    runs of adjacent parts whose RMS stay within :data:`APART` of each other (an all-zero part
    joins its neighbour); [] when that leaves one run, or the extents do not fit ``value``."""
    value = np.asarray(value)
    if value.ndim <= axis:
        return []
    if None in extents:  # one part's extent is what the others leave of this value's
        extents = list(extents)
        extents[extents.index(None)] = value.shape[axis] - sum(e for e in extents if e is not None)
    if value.shape[axis] != sum(extents) or min(extents) <= 0:
        return []
    edges = np.cumsum([0] + list(extents)).tolist()
    runs = []  # [start, stop, sum of squares, count]
    for a, b in zip(edges[:-1], edges[1:]):
        part = np.take(value, np.arange(a, b), axis=axis).astype(np.float64)
        ss, n = float(np.square(part).sum()), part.size
        if runs and (ss == 0 or runs[-1][2] == 0 or not _apart(runs[-1][2] / runs[-1][3], ss / n)):
            runs[-1][1:] = [b, runs[-1][2] + ss, runs[-1][3] + n]
        else:
            runs.append([a, b, ss, n])
    return [(a, b, math.sqrt(ss / n)) for a, b, ss, n in runs] if len(runs) > 1 else []


def _apart(ms_a, ms_b):
    return max(ms_a, ms_b) >= APART ** 2 * min(ms_a, ms_b)


def parts_note(specs):
    """One sentence per output scored in parts by default (see :func:`parts`), or []."""
    notes = []
    for tensor in dict.fromkeys(s.tensor for s in specs if s.rms is not None):
        mine = [s for s in specs if s.tensor == tensor]
        listed = ", ".join(f"{s.name} (RMS {s.rms:.3g})" for s in mine)
        notes.append(f"output {tensor!r} concatenates parts whose magnitudes differ {APART:g}x or more, so each "
                     f"is scored apart, as a whole-tensor metric would weigh the largest alone: {listed}; name "
                     f"the output (output_node / --output-node) to score it whole")
    return notes


def one_value_rows(engine, specs=None):
    """``[(output, shape)]``: the outputs (default: the engine's default outputs) whose float
    values on the first sample are a scalar or have a last axis of one value (a binary
    classifier's one logit, a score), the rows kl's softmax sees as 1 whatever they hold; []
    without data."""
    if getattr(engine, "data", None) is None:
        return []
    specs = parse_outputs(None, engine) if specs is None else specs
    ref = engine.reference(0, list(dict.fromkeys(s.tensor for s in specs)))
    shapes = [(s.name, list(np.shape(s.take(ref[s.tensor])))) for s in specs]
    return [(name, shape) for name, shape in shapes if not shape or shape[-1] == 1]


def far_from_zero(engine, specs=None, samples=None):
    """``[{output, mean, spread, flat, samples}]``: the outputs (or default parts, see
    :func:`parts`) whose float values, each replaced by their mean, would still read a cosine
    (``flat``) of :data:`FLAT_COSINE` or more against themselves, judged on the first sample
    (an output constant within a sample, a score: on up to :data:`OFFSET_SAMPLES`, as the
    metrics pool them); and those holding zeros alone on every sample, with ``zero`` true and
    ``flat`` None (every metric scaled by the float values is undefined there). [] without
    data. ``specs``: the outputs judged (default: the engine's default outputs); ``samples``:
    the indices of the samples the metrics pool (default: every sample of the data)."""
    if getattr(engine, "data", None) is None:
        return []
    specs = parse_outputs(None, engine) if specs is None else specs
    samples = list(range(len(engine.data)) if samples is None else samples)
    tensors = list(dict.fromkeys(s.tensor for s in specs))
    refs = []  # the first samples' float outputs, read once for every output (most need the first only)
    found, zeros = [], []
    for s in specs:
        seen, value = [], np.zeros(0)
        for k, i in enumerate(samples[:OFFSET_SAMPLES]):
            if k == len(refs):
                refs.append(engine.reference(i, tensors))
            seen.append(np.asarray(s.take(refs[k][s.tensor]), dtype=np.float64).ravel())
            value = np.concatenate(seen)
            if not value.size or not np.isfinite(value).all() or value.min() < value.max():
                break
        if not value.size or not np.isfinite(value).all():
            continue
        if not value.any():  # zeros alone so far: judged on the samples after (below)
            zeros.append(s)
            continue
        mean, spread = float(value.mean()), float(value.std())
        rms = math.sqrt(mean * mean + spread * spread)
        if spread > 0 and abs(mean) >= FLAT_COSINE * rms:  # a constant output has nothing to lose
            found.append({"output": s.name, "mean": mean, "spread": spread, "flat": abs(mean) / rms,
                          "samples": len(seen)})
    # zeros on the first samples may end later (a Relu the first inputs keep below 0): the
    # metrics pool every sample, so an output is left undefined only where all of them are 0
    for i in samples[OFFSET_SAMPLES:] if zeros else ():
        values = engine.reference(i, tensors)
        zeros = [s for s in zeros if not np.asarray(s.take(values[s.tensor])).any()]
        if not zeros:
            break
    for s in zeros:  # a metric scaled by the float values has no scale there
        found.append({"output": s.name, "mean": 0.0, "spread": 0.0, "flat": None, "samples": len(samples),
                      "zero": True})
    order = {s.name: k for k, s in enumerate(specs)}
    return sorted(found, key=lambda f: order[f["output"]])


def blind_warnings(engine, specs=None, metric="cosine-similarity", found=None):
    """One sentence per output ``metric`` cannot see errors in: for a metric an offset
    inflates (:data:`OFFSET_BLIND`), each output :func:`far_from_zero` finds (``found``: its
    result, if computed); for those and correlation, each output of zeros alone it finds;
    for kl, each output of one value per row (:func:`one_value_rows`); else []."""
    if metric == "kl":
        return [f"{KL_WARNING}: {o!r} has shape {shape} on the first sample, and a softmax over one value is 1 "
                "whatever quantization does, so kl reads 0 there and ties every node; judge it by an error in its "
                "units (mse, chebyshev) or by correlation" for o, shape in one_value_rows(engine, specs)]
    if metric not in (*OFFSET_BLIND, "correlation"):
        return []
    out = []
    for f in far_from_zero(engine, specs) if found is None else found:
        on = "the first sample" if f["samples"] == 1 else f"the first {f['samples']} samples"
        if f.get("zero"):
            # one sentence for every metric it concerns: said once, whichever were asked for
            out.append(f"{ZERO_WARNING}: {f['output']!r} holds only zeros in float on {on}, so cosine, sqnr, mre and "
                       "correlation read it as wholly lost wherever quantization adds anything to it, however "
                       "little, and as perfect where it adds nothing; judge it by an error in its units (mse, "
                       "chebyshev), or on data where it is not 0")
            continue
        if metric == "correlation":  # the offset is what it leaves out
            continue
        out.append(f"{OFFSET_WARNING}: {f['output']!r} has mean {f['mean']:.4g} and spread {f['spread']:.3g} on {on}, "
                   f"so even a constant output at its mean reads cosine {f['flat']:.6f} against it; judge it by "
                   "correlation (metric: correlation in a contract, --metric correlation), which ignores the offset, "
                   "or by an error in its units (mse, chebyshev)")
    return out

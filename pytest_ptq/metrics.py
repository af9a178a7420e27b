"""Metrics between a float reference and a quantized tensor, pooled over samples.

Each metric keeps running sums, so a value over many samples equals the value over the
samples concatenated, with memory bounded by one sample. ``higher_is_better`` tells the
sort order: similarities rank ascending (worst first), errors descending (worst first).
A value that infinite or NaN tensors leave undefined is NaN, which sorts worst.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import PTQError, shown, unknown


class Metric:
    name = ""
    higher_is_better = False
    unit = False  # a similarity of at most 1, reached by identical tensors: its loss is 1 - value
    doc = ""
    units = ""  # what its values are measured in, where a heading should say ("dB")

    def new(self):
        return np.zeros(self._slots, dtype=np.float64)

    def merge(self, state, other):
        """Add the sums of ``other`` into ``state`` (pooling samples)."""
        state += other

    def worst(self, values):
        """The worst of several values (min for similarities, max for errors); NaN (a value
        non-finite outputs leave undefined) where any is: dropped, an output gone NaN left
        its node's headline and the verdict at the other outputs' figure."""
        values = list(values)
        if not values or any(math.isnan(v) for v in values):
            return math.nan
        return min(values) if self.higher_is_better else max(values)

    def sort_key(self, value):
        """Key that sorts worst first."""
        if math.isnan(value):
            return -math.inf
        return value if self.higher_is_better else -value

    def worse(self, a, b):
        """True when value ``a`` is worse than value ``b``."""
        return a < b if self.higher_is_better else a > b


def _dot(a, b):
    # einsum's own loop, not BLAS: BLAS threads fight onnxruntime's for the cores
    return float(np.einsum("i,i->", a, b))


class Scratch:
    """Two float64 buffers, grown as needed, that a loop comparing many tensors widens each
    pair into: a fresh array per comparison cost more in page faults than the sums it fed
    (1.06 ms against 0.4 ms per cosine of a 265,000-value output). Owned by one loop, never
    kept past it."""

    def __init__(self):
        self._buffers = (np.empty(0), np.empty(0))

    def pair(self, ref, test):
        """``(ref, test)`` as flat float64 views into the buffers, valid until the next call."""
        ref, test = np.asarray(ref), np.asarray(test)
        if ref.size != test.size:  # copyto would broadcast a single value over the reference
            raise ValueError(f"a reference of {ref.size} values compared with a tensor of {test.size}")
        if self._buffers[0].size < ref.size:
            self._buffers = (np.empty(ref.size), np.empty(ref.size))
        r, t = (b[:ref.size] for b in self._buffers)
        np.copyto(r, ref.reshape(-1))
        np.copyto(t, test.reshape(-1))
        return r, t


class Reference:
    """A float reference that many tensors are compared with (a ranking compares every
    config's output with one sample's): the sums of it alone that metrics need are
    computed once, and the pairs are widened in ``scratch`` (a :class:`Scratch`). Pass it as
    a metric's ``ref``; it holds ``array``, not a copy."""

    __slots__ = ("array", "scratch", "sums")

    def __init__(self, array, scratch):
        self.array, self.scratch, self.sums = np.asarray(array), scratch, {}

    @classmethod
    def of_outputs(cls, specs, values, scratch):
        """``{output name: Reference}`` of the part of ``values`` (one sample's tensors) each
        of ``specs`` (:func:`~pytest_ptq.outputs.parse_outputs`) compares."""
        return {s.name: cls(s.take(values[s.tensor]), scratch) for s in specs}


class Pooled:
    """One metric of several outputs (``specs`` of :func:`~pytest_ptq.outputs.parse_outputs`),
    each pooled over the samples added; :meth:`value` is the worst output's figure, the one
    a model is judged on. With ``per_sample``, :attr:`samples` lists each sample's own worst
    output figure too, in the order added, over the outputs that held values on it (None where
    none did), and :attr:`held` the names of those outputs, per sample."""

    def __init__(self, metric, specs, per_sample=False):
        self.metric, self.specs = metric, specs
        self.states = {s.name: metric.new() for s in specs}
        self.samples = [] if per_sample else None
        self.held = [] if per_sample else None
        # values compared per output, and the shape of an output where it held none: a metric
        # reads no values as perfect, which only these tell apart from a measured 1.0
        self.sizes = {s.name: 0 for s in specs}
        self.shapes = {}

    def add(self, ref, out):
        """One sample: ``ref`` and ``out`` the float and the compared tensors, by name."""
        self.add_prepared({s.name: s.take(ref[s.tensor]) for s in self.specs}, out)

    def add_prepared(self, refs, out):
        """One sample whose references :meth:`Reference.of_outputs` prepared (shared by the
        configs compared with them)."""
        m = self.metric
        held = []
        for s in self.specs:
            ref = refs[s.name]
            shape = np.shape(ref.array if isinstance(ref, Reference) else ref)
            self.sizes[s.name] += math.prod(shape)
            if math.prod(shape):
                held.append(s.name)
            else:
                self.shapes.setdefault(s.name, list(shape))
        if self.samples is None:
            for s in self.specs:
                m.update(self.states[s.name], refs[s.name], s.take(out[s.tensor]))
            return
        values = {}
        for s in self.specs:
            one = m.new()
            m.update(one, refs[s.name], s.take(out[s.tensor]))
            m.merge(self.states[s.name], one)
            values[s.name] = m.value(one)
        # an output holding no values on this sample (a detection of nothing) reads the perfect
        # score of no values: left out of the sample's figure, which has none where all are
        self.held.append(frozenset(held))
        self.samples.append(m.worst(values[n] for n in held) if held else None)

    def merge(self, other):
        """Add the samples of ``other`` (same metric and outputs) into this one, in place."""
        for name, st in self.states.items():
            self.metric.merge(st, other.states[name])
            self.sizes[name] += other.sizes[name]
            if name in other.shapes:
                self.shapes.setdefault(name, other.shapes[name])
        if self.samples is not None:
            self.samples.extend(other.samples)
            self.held.extend(other.held)

    def copy(self):
        twin = Pooled(self.metric, self.specs, per_sample=self.samples is not None)
        twin.merge(self)
        return twin

    def per_output(self):
        """``{output name: value}``, in the order of ``specs`` (an output in :meth:`empty`
        reads the metric's figure of no values: :func:`by_output` makes it None)."""
        return {name: self.metric.value(st) for name, st in self.states.items()}

    def value(self):
        return self.metric.worst(self.per_output().values())

    def judged(self, data):
        """:meth:`value`, the figure a model is judged on; where every output held no values
        on every sample added (of ``data``, the samples' :class:`~pytest_ptq.data.Data`), a
        PTQError instead: that figure would be the perfect score a metric reads no values as."""
        empty = self.empty()
        if self.specs and len(empty) == len(self.specs):
            raise PTQError(held_no_values(empty, getattr(data, "where", None) or "the data"))
        return self.value()

    def empty(self):
        """``{output name: shape}`` of the outputs that held no values on any sample added,
        whose figure no comparison measured."""
        return {name: self.shapes.get(name, []) for name, n in self.sizes.items() if not n}


# what a figure shows where no value was compared: an output that held none on any sample, or a
# ranking entry whose quantization changes only such outputs (or none of those compared)
NO_VALUES = "no values compared"


def by_output(pools):
    """``{output name: {metric name: value}}`` of several metrics' :class:`Pooled` of the same
    outputs."""
    values = [(pool.metric.name, pool.per_output()) for pool in pools]
    # an output that held no values has no figure: a metric reads no values as a perfect score
    empty = pools[0].empty() if pools else {}
    return {s.name: {name: None if s.name in empty else v[s.name] for name, v in values}
            for s in pools[0].specs} if pools else {}


def held_no_values(empty, data):
    """The sentence for outputs that all held no values (``{output: shape}`` of
    :meth:`Pooled.empty`) on every sample of ``data``: a figure of theirs compares nothing,
    so nothing can be judged on them."""
    shown = ", ".join(f"{n!r} (shape {shape})" for n, shape in empty.items())
    return (f"every output compared ({shown}) holds no values on any sample of {data}: no values were compared, so "
            "nothing can be judged; compare outputs that hold values, or use data on which these do")


def _pair(ref, test):
    if isinstance(ref, Reference):
        return ref.scratch.pair(ref.array, test)
    r = np.asarray(ref, dtype=np.float64).ravel()
    t = np.asarray(test, dtype=np.float64).ravel()
    return r, t


def _diff(r, t):
    """``t - r``; where both hold the same infinity (a -inf mask in both) NaN, without
    numpy's RuntimeWarning (which ``-W error`` turns into a failure): the metric reads NaN."""
    with np.errstate(invalid="ignore"):
        return t - r


def _of_ref(ref, key, compute):
    """``compute()``, a sum of the reference alone: kept on a :class:`Reference`, the same
    for every tensor compared with it."""
    if not isinstance(ref, Reference):
        return compute()
    if key not in ref.sums:
        ref.sums[key] = compute()
    return ref.sums[key]


class Cosine(Metric):
    name, higher_is_better, unit, _slots = "cosine-similarity", True, True, 3
    doc = "cosine of the angle between the flattened tensors (1 = identical direction)"

    def update(self, s, ref, test):
        r, t = _pair(ref, test)
        s += (_dot(r, t), _of_ref(ref, "rr", lambda: _dot(r, r)), _dot(t, t))

    def value(self, s):
        if not np.isfinite(s).all():
            return math.nan  # an infinite value (a variance quantized to 0, then divided by)
        if s[1] == 0 and s[2] == 0:
            return 1.0
        if s[1] == 0 or s[2] == 0:
            return 0.0
        # within [-1, 1]: rounding read identical tensors as 1.0000000000000016
        return float(min(1.0, max(-1.0, s[0] / math.sqrt(s[1] * s[2]))))


class MSE(Metric):
    name, _slots = "mse", 2
    doc = "mean squared error"

    def update(self, s, ref, test):
        r, t = _pair(ref, test)
        d = _diff(r, t)
        s += (_dot(d, d), d.size)

    def value(self, s):
        return float(s[0] / s[1]) if s[1] else 0.0


class MRE(Metric):
    name, _slots = "mre", 2
    doc = "mean relative error: mean |test - ref| over mean |ref|"

    def update(self, s, ref, test):
        r, t = _pair(ref, test)
        s += (np.abs(_diff(r, t)).sum(), _of_ref(ref, "|r|", lambda: np.abs(r).sum()))

    def value(self, s):
        if not np.isfinite(s).all():
            return math.nan
        if s[1] == 0:
            return 0.0 if s[0] == 0 else math.inf
        return float(s[0] / s[1])


class SQNR(Metric):
    name, higher_is_better, _slots, units = "sqnr", True, 2, "dB"
    doc = "signal to quantization noise ratio in dB: 10 log10(sum ref^2 / sum (test - ref)^2)"

    def update(self, s, ref, test):
        r, t = _pair(ref, test)
        rr = _of_ref(ref, "rr", lambda: _dot(r, r))
        d = _diff(r, t)
        s += (rr, _dot(d, d))

    def value(self, s):
        if not np.isfinite(s).all():
            return math.nan
        if s[1] == 0:
            return math.inf
        if s[0] == 0:
            return -math.inf
        return float(10 * math.log10(s[0] / s[1]))


class Chebyshev(Metric):
    name, _slots = "chebyshev", 1
    doc = "largest absolute difference"

    def update(self, s, ref, test):
        r, t = _pair(ref, test)
        if r.size:  # np.maximum keeps a NaN, where max(0.0, nan) read 0.0: a perfect score
            s[0] = np.maximum(s[0], np.abs(_diff(r, t)).max())

    def merge(self, state, other):
        state[0] = np.maximum(state[0], other[0])

    def value(self, s):
        return float(s[0])


class L1(Metric):
    name, _slots = "l1", 2
    doc = "mean absolute difference"

    def update(self, s, ref, test):
        r, t = _pair(ref, test)
        s += (np.abs(_diff(r, t)).sum(), r.size)

    def value(self, s):
        return float(s[0] / s[1]) if s[1] else 0.0


class KL(Metric):
    name, _slots = "kl", 2
    doc = "KL(softmax(ref) || softmax(test)) over the last axis, mean over rows, in nats"

    def update(self, s, ref, test):
        r = np.asarray(ref.array if isinstance(ref, Reference) else ref, dtype=np.float64)
        t = np.asarray(test, dtype=np.float64)
        if r.ndim == 0:
            r, t = r.reshape(1, 1), t.reshape(1, 1)
        r = r.reshape(-1, r.shape[-1])
        t = t.reshape(-1, t.shape[-1])
        with np.errstate(invalid="ignore", over="ignore"):  # an infinite output: NaN, quietly (-W error)
            lp = r - r.max(axis=1, keepdims=True)
            lp -= np.log(np.exp(lp).sum(axis=1, keepdims=True))
            lq = t - t.max(axis=1, keepdims=True)
            lq -= np.log(np.exp(lq).sum(axis=1, keepdims=True))
            s += ((np.exp(lp) * (lp - lq)).sum(), r.shape[0])

    def value(self, s):
        return float(max(s[0], 0.0) / s[1]) if s[1] else 0.0


class Correlation(Metric):
    name, higher_is_better, unit, _slots = "correlation", True, True, 6
    doc = ("Pearson correlation of the flattened tensors: the cosine of their deviations from their means "
           "(1 = identical up to offset and scale), for outputs far from zero, where a cosine cannot see errors")

    # (count, mean of ref, mean of test, centred sums of ref^2, test^2, ref*test), pooled by
    # the parallel formula: raw sums would cancel catastrophically on the far-from-zero
    # outputs this metric is for
    def update(self, s, ref, test):
        r, t = _pair(ref, test)
        if r.size:
            with np.errstate(invalid="ignore", over="ignore"):  # an infinite output: NaN, quietly (-W error)
                mr, mt = float(r.mean()), float(t.mean())
                dr, dt = r - mr, t - mt
                self.merge(s, np.array([r.size, mr, mt, _dot(dr, dr), _dot(dt, dt), _dot(dr, dt)]))

    def merge(self, state, other):
        na, nb = state[0], other[0]
        if nb == 0:
            return
        if na == 0:
            state[:] = other
            return
        n = na + nb
        with np.errstate(invalid="ignore", over="ignore"):
            dr, dt = other[1] - state[1], other[2] - state[2]
            w = na * nb / n
            state[:] = (n, state[1] + dr * nb / n, state[2] + dt * nb / n, state[3] + other[3] + dr * dr * w,
                        state[4] + other[4] + dt * dt * w, state[5] + other[5] + dr * dt * w)

    def value(self, s):
        if not np.isfinite(s).all():
            return math.nan
        if s[3] == 0 and s[4] == 0:
            return 1.0  # both constant: no variation to lose
        if s[3] == 0 or s[4] == 0:
            return 0.0
        return float(min(1.0, max(-1.0, s[5] / math.sqrt(s[3] * s[4]))))  # within [-1, 1], as the cosine


COSINE = "cosine-similarity"
METRICS = {m.name: m for m in (Cosine(), MSE(), MRE(), SQNR(), Chebyshev(), L1(), KL(), Correlation())}
_ALIASES = {"cosine": "cosine-similarity", "cos": "cosine-similarity", "cosine_similarity": "cosine-similarity",
            "max-abs": "chebyshev", "mae": "l1", "pearson": "correlation"}


def meets(metric, value, target):
    """True when ``value`` is a number at least as good as ``target`` in ``metric`` (None and
    NaN never are)."""
    return value is not None and not math.isnan(value) and not metric.worse(value, target)


def get_metrics(metrics):
    """Metric objects for a name or a list of names (first one decides the sort order)."""
    if metrics is None:
        metrics = ["cosine-similarity"]
    if isinstance(metrics, str):
        metrics = [metrics]
    if not isinstance(metrics, (list, tuple)) and not (hasattr(metrics, "__iter__") and not isinstance(metrics, dict)):
        raise PTQError(f"metrics must be a metric name or a list of names such as ['cosine-similarity'], "
                       f"got {shown(metrics)}")
    out = []
    for m in metrics:
        key = _ALIASES.get(str(m).lower(), str(m).lower())
        if key not in METRICS:
            raise unknown("metric", m, list(METRICS))
        if METRICS[key] not in out:  # a metric named twice (or by two aliases) is one column
            out.append(METRICS[key])
    if not out:
        raise PTQError("no metric given; use one of " + ", ".join(METRICS))
    return out


def get_metric(metric):
    """The metric object of a parameter that takes one (a name, or a list of one): a list of
    several is refused, not cut to its first."""
    found = get_metrics(metric)
    if len(found) > 1:
        raise PTQError(f"metric must be one metric name, got {shown(metric)}; several metrics are for a ranking's "
                       "metrics=")
    return found[0]


def compare(ref, test, metrics=("cosine-similarity",)):
    """All ``metrics`` between two arrays of the same shape: ``{metric name: value}``."""
    try:
        shapes = np.shape(ref), np.shape(test)
        numeric = all(np.asarray(a).dtype.kind in "biuf" for a in (ref, test))
    except ValueError:  # ragged nested lists
        shapes, numeric = None, False
    if not numeric or shapes[0] != shapes[1]:
        raise PTQError(f"compare needs two numeric arrays of the same shape, got {shown(ref)} and {shown(test)}"
                       + (f" (shapes {list(shapes[0])} and {list(shapes[1])})" if numeric else ""))
    if not np.size(ref):  # no value to compare: a perfect score would be made up
        raise PTQError(f"compare needs arrays holding values, got two of shape {list(shapes[0])}")
    result = {}
    for m in get_metrics(metrics):
        s = m.new()
        m.update(s, ref, test)
        result[m.name] = m.value(s)
    return result

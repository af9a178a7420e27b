"""Quantization grids: what a Q/DQ pair of each ONNX type can represent, and its numpy
fake-quant, following onnxruntime's semantics.

* integer grids (int2/uint2, int4/uint4, int8/uint8, int16/uint16, int32): ``q = clip(round(x /
  scale) + zp, qmin, qmax)`` with round half to even, then ``(q - zp) * scale``;
* float grids (float8 e4m3fn / e4m3fnuz / e5m2 / e5m2fnuz, float4 e2m1): ``x / scale`` rounded to
  the nearest value of the float type (ties to even) and saturated to its largest finite
  value (the ``saturate=1`` default of QuantizeLinear), then times ``scale``; the zero
  point is 0.

Scales broadcast per tensor (one value), per axis (one per index of ``axis``) or per block
(``block_size`` consecutive elements of ``axis`` share one), as QuantizeLinear-21 defines.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from ..errors import PTQError

TP = onnx.TensorProto


@dataclasses.dataclass(frozen=True)
class Grid:
    """The values a quantized type represents. ``qmin``/``qmax``: the code range (integers) or
    the largest finite magnitudes (floats); ``levels``: how many distinct values it has."""

    dtype: int
    name: str
    bits: int
    kind: str  # "int" or "float"
    qmin: float
    qmax: float
    np_type: object = None  # ml_dtypes type of a float grid

    @property
    def signed(self):
        return self.qmin < 0

    @property
    def is_float(self):
        return self.kind == "float"

    @property
    def is_custom(self):
        """A quantizer known only through its custom op (block floating point, say)."""
        return self.kind == "custom"

    @property
    def levels(self):
        """Distinct representable values (finite ones for a float grid; +0 and -0 count once)."""
        if self.is_custom:
            return 2 ** self.bits
        if not self.is_float:
            return int(self.qmax - self.qmin + 1)
        codes = np.arange(2 ** self.bits, dtype=np.uint16 if self.bits > 8 else np.uint8)
        values = codes.view(self.np_type).astype(np.float32)
        return int(np.unique(values[np.isfinite(values)]).size)

    def quantize(self, scaled, zero_point=0.0):
        """Codes on the grid of ``scaled`` (= x / scale): integers, or float-type values as float64."""
        if self.is_custom:
            raise PTQError(f"{self.name} is computed by its custom op only; pytest-ptq cannot simulate it in numpy")
        if self.is_float:
            x = np.clip(np.asarray(scaled, np.float64), self.qmin, self.qmax)
            return x.astype(np.float32).astype(self.np_type).astype(np.float64)
        return np.clip(np.rint(np.asarray(scaled, np.float64)) + zero_point, self.qmin, self.qmax)

    def dequantize(self, codes, zero_point=0.0):
        """``codes - zero_point`` in grid units (multiply by the scale for input units)."""
        return np.asarray(codes, np.float64) - (0.0 if self.is_float else zero_point)


def _grids():
    grids = {}
    ints = [("INT8", "int8", 8, -128, 127), ("UINT8", "uint8", 8, 0, 255), ("INT16", "int16", 16, -32768, 32767),
            ("UINT16", "uint16", 16, 0, 65535), ("INT32", "int32", 32, -(2 ** 31), 2 ** 31 - 1),
            ("INT4", "int4", 4, -8, 7), ("UINT4", "uint4", 4, 0, 15), ("INT2", "int2", 2, -2, 1),
            ("UINT2", "uint2", 2, 0, 3)]
    for attr, name, bits, lo, hi in ints:
        if hasattr(TP, attr):
            grids[getattr(TP, attr)] = Grid(getattr(TP, attr), name, bits, "int", lo, hi)
    try:
        import ml_dtypes
    except ImportError:  # onnx depends on it; without it float grids are unknown
        return grids
    floats = [("FLOAT8E4M3FN", "float8e4m3fn", 8, "float8_e4m3fn"), ("FLOAT8E4M3FNUZ", "float8e4m3fnuz", 8,
              "float8_e4m3fnuz"), ("FLOAT8E5M2", "float8e5m2", 8, "float8_e5m2"),
              ("FLOAT8E5M2FNUZ", "float8e5m2fnuz", 8, "float8_e5m2fnuz"), ("FLOAT4E2M1", "float4e2m1", 4,
                                                                            "float4_e2m1fn"),
              ("BFLOAT16", "bfloat16", 16, "bfloat16")]
    for attr, name, bits, np_name in floats:
        np_type = getattr(ml_dtypes, np_name, None)
        if hasattr(TP, attr) and np_type is not None:
            top = float(ml_dtypes.finfo(np_type).max)
            grids[getattr(TP, attr)] = Grid(getattr(TP, attr), name, bits, "float", -top, top, np_type)
    return grids


GRIDS = _grids()


def narrowed(grid, lo, hi):
    """``grid`` (an integer one) with its codes clipped to ``[lo, hi]``: a pair whose Q output
    goes through an integer Clip before its DQ (PyTorch's QAT export of the (0, 127) activation
    range, Brevitas' sub-8-bit QCDQ). Named by its type and range; ``bits``: those its levels
    need. ``grid`` itself where the Clip leaves the whole range."""
    lo, hi = max(grid.qmin, lo), min(grid.qmax, hi)
    if (lo, hi) == (grid.qmin, grid.qmax):
        return grid
    if lo > hi:
        raise PTQError(f"clips the {grid.name} codes to an empty range [{lo:g}, {hi:g}]")
    bits = max(1, int(np.ceil(np.log2(hi - lo + 1))))
    return dataclasses.replace(grid, name=f"{grid.name} [{lo:g}, {hi:g}]", bits=bits, qmin=lo, qmax=hi)


def custom(name, bits=16):
    """The grid of a fused custom fake-quant op, known by name only."""
    return Grid(0, name, bits, "custom", -np.inf, np.inf)


def grid_of(dtype, where=""):
    """The :class:`Grid` of an ONNX quantized type; a type with none is one sentence."""
    if dtype in GRIDS:
        return GRIDS[dtype]
    name = TP.DataType.Name(dtype) if dtype in TP.DataType.values() else str(dtype)
    raise PTQError(f"{where}quantizes to {name}, a type pytest-ptq has no grid for; supported: "
                   + ", ".join(g.name for g in GRIDS.values()))


def broadcast(values, shape, axis=None, block_size=0):
    """``values`` (a scale or zero point) shaped to multiply an array of ``shape``: as is when
    it has one element, along ``axis`` per index or, with ``block_size``, per block."""
    values = np.asarray(values)
    if values.size == 1 or not shape:
        return values.reshape(())
    rank = len(shape)
    axis = (1 if axis is None else axis) % rank
    if block_size:
        expanded = np.repeat(values, block_size, axis=axis)
        index = [slice(None)] * rank
        index[axis] = slice(0, shape[axis])
        return expanded[tuple(index)]
    if values.ndim == rank:  # already shaped like the input
        return values
    out = [1] * rank
    out[axis] = -1
    return values.reshape(out)


# float32's smallest normal number: a scale below it (or at 0, or negative) divides to inf or NaN
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def divided(x, scale):
    """``x / scale`` in float64, quietly: a scale of 0 gives +-inf, which the grid saturates
    as onnxruntime does (0 / 0 gives 0); such a scale is said once, where the model is read."""
    x = np.asarray(x, np.float64)
    if np.all(np.asarray(scale) >= SMALLEST_NORMAL):  # the usual case, without the passes below over x
        return x / scale
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = x / scale
    return np.where(np.isnan(out) & ~np.isnan(x), 0.0, out)


def fake_quant(x, grid, scale, zero_point, axis=None, block_size=0):
    """Quantize then dequantize ``x`` on ``grid`` (float32 result, ``x``'s shape)."""
    x = np.asarray(x)
    s = broadcast(np.asarray(scale, np.float64), x.shape, axis, block_size)
    z = broadcast(np.asarray(zero_point, np.float64), x.shape, axis, block_size)
    codes = grid.quantize(divided(x, s), z)
    return (grid.dequantize(codes, z) * s).astype(np.float32)


def codes_used(x, grid, scale, zero_point, axis=None, block_size=0):
    """How many distinct grid values ``x`` falls on (at most ``grid.levels``)."""
    x = np.asarray(x)
    if x.size == 0:
        return 0
    s = broadcast(np.asarray(scale, np.float64), x.shape, axis, block_size)
    z = broadcast(np.asarray(zero_point, np.float64), x.shape, axis, block_size)
    return int(np.unique(grid.quantize(divided(x, s), z)).size)


def code_usage(counts, levels, tail=0.0005):
    """What share of a grid the data use, from per-code counts: ``codes_used`` (distinct codes
    hit), ``bulk_codes`` (distinct codes holding all but ``tail`` of the values at each end) and
    ``levels`` (codes the grid has)."""
    counts = np.asarray(counts)
    total = int(counts.sum())
    if not total:
        return {"codes_used": 0, "bulk_codes": 0, "levels": int(levels)}
    cum = np.cumsum(counts)
    lo = int(np.searchsorted(cum, tail * total, side="right"))
    hi = int(np.searchsorted(cum, (1 - tail) * total, side="left"))
    return {"codes_used": int(np.count_nonzero(counts)), "bulk_codes": int(np.count_nonzero(counts[lo:hi + 1])),
            "levels": int(levels)}


def step_bound(x, grid, scale, axis=None, block_size=0):
    """The largest rounding error quantization can make on ``x`` where it is not clipped,
    per element, in input units: half a step on an integer grid; half the local spacing of
    the float type (relative to |x|) on a float grid."""
    x = np.asarray(x, np.float64)
    s = np.abs(broadcast(np.asarray(scale, np.float64), x.shape, axis, block_size))
    if not grid.is_float:
        return np.broadcast_to(s / 2, x.shape)
    import ml_dtypes

    finfo = ml_dtypes.finfo(grid.np_type)
    mant = finfo.nmant
    scaled = np.abs(divided(x, s))
    exponent = np.floor(np.log2(np.maximum(scaled, float(finfo.smallest_normal))))
    return (2.0 ** (exponent - mant)) * s / 2 * (1 + 1e-6)


def dynamic_qparams(x):
    """``(scale, zero_point)`` that DynamicQuantizeLinear computes for ``x``: uint8 over the
    range of ``x`` extended to include 0, in float32 as onnxruntime does."""
    x = np.asarray(x, np.float32)
    lo = np.float32(min(0.0, float(x.min()))) if x.size else np.float32(0)
    hi = np.float32(max(0.0, float(x.max()))) if x.size else np.float32(0)
    scale = np.float32((hi - lo) / np.float32(255))
    if scale == 0:
        return scale, np.int64(0)
    zp = np.int64(np.clip(np.rint(np.float32(0) - lo / scale), 0, 255))
    return scale, zp


def dynamic_fake_quant(x):
    """Quantize then dequantize ``x`` as DynamicQuantizeLinear + DequantizeLinear do: the
    range comes from ``x`` itself on every call."""
    x = np.asarray(x)
    scale, zp = dynamic_qparams(x)
    if scale == 0:
        return np.zeros(x.shape, np.float32)
    return fake_quant(x, GRIDS[TP.UINT8], scale, zp)


# An integer grid found in float values (see integer_grid): at most this many codes apart
# (int8's and uint8's 256; int4's 16 fit too), and each value within this share of a step
# of its code (float32's rounding of code * scale is a few millionths of a step)
FOUND_LEVELS = 256
FOUND_TOLERANCE = 1e-4
# slices of a weight read per axis: a few tell as well as all of them
_FOUND_SLICES = 16
_FOUND_ELEMENTS = 1 << 16  # elements read for one grid over the whole tensor


# a grid's search divides a weight's values by its smallest: a tiny (subnormal) value next to
# large ones overflows to inf, which the checks read as no grid; numpy's warning of it
# stopped a user's run under filterwarnings = error
_quietly = np.errstate(over="ignore", divide="ignore", invalid="ignore")


@_quietly
def integer_grid(values, min_levels=3):
    """``(axis, picked, steps)`` where float ``values`` (a weight) lie on an integer grid: each value
    a whole multiple of one step per tensor (``axis`` None) or per index of ``axis``, the
    multiples at most FOUND_LEVELS apart, as a weight quantized to int8/uint8 (or fewer
    bits) and dequantized holds; None where they do not, or tell nothing (fewer than
    ``min_levels`` distinct values, or at most two elements a slice). ``picked``: the indices of ``axis``
    read (a few spread over it; ``[None]`` per tensor), ``steps`` their grids' steps (0 for
    an all-zero slice). Read from at most _FOUND_ELEMENTS elements a part, spread over it: every
    float weight read without a pair is looked at on load, and sorting a large one whole took
    a good part of a second each."""
    x = np.asarray(values)
    if x.dtype.kind != "f" or x.size < 8:
        return None
    spread_over = _spread(x.reshape(-1) if x.flags.c_contiguous else x.flat)  # no copy of the whole
    if not np.isfinite(spread_over).all():
        return None
    distinct = np.unique(spread_over).size
    if distinct < min_levels and spread_over.size < x.size:  # a few values sampled: count them all
        distinct = np.unique(x).size
    if distinct < min_levels:
        return None
    for axis in [None, *range(x.ndim)]:
        if axis is None:  # elements spread over the whole tensor, every channel among them
            picked, parts = [None], [spread_over]
        else:
            if x.shape[axis] < 2 or x.size // x.shape[axis] < 3:
                continue
            picked = np.unique(np.linspace(0, x.shape[axis] - 1, min(x.shape[axis], _FOUND_SLICES)).astype(int))
            parts = [_spread(np.take(x, k, axis=axis).reshape(-1)) for k in picked]
        steps = []
        for part in parts:  # a part at a time: the first off any grid settles the axis
            if not np.isfinite(part).all():
                return None
            step = _fitted_step(part) if part.any() else 0.0  # an all-zero slice lies on every grid
            if step is None:
                break
            steps.append(step)
        else:
            if any(steps):
                return axis, list(picked), np.asarray(steps)
    return None


def _fitted_step(v):
    """The step of the integer grid the values ``v`` (1-D float64, some non-zero) lie on, or
    None: the codes :func:`_grid_codes` finds, and the step fitted to them by least squares,
    every value within FOUND_TOLERANCE of a step of its code."""
    codes, found = _grid_codes(v[None, :])
    if not found[0]:
        return None
    codes = codes[0].astype(np.float64)
    step = float(np.dot(codes, v) / np.dot(codes, codes))
    return step if np.abs(v - codes * step).max() <= FOUND_TOLERANCE * step else None


def _spread(flat):
    """At most _FOUND_ELEMENTS elements of ``flat`` (1-D, or a flat iterator), spread evenly over
    it, as float64."""
    size = flat.size if hasattr(flat, "size") else len(flat)
    return np.asarray(flat[::-(-size // _FOUND_ELEMENTS)], np.float64)


@_quietly
def stored_codes(values, axis=None):
    """``(codes, scale, zero_point)`` that a DequantizeLinear (``axis``: per tensor when None)
    turns back into float32 ``values`` lying on an integer grid (see :func:`integer_grid`,
    which finds the axis from a sample): int8 codes ``round(values / step) + zero_point``, the
    steps (float32, one or one per index of ``axis``) and int8 zero points that keep the codes
    in range; None where a part lies on no such grid, or its codes do not give the values back
    within float32 rounding. Each step is the float32 number whose products with the codes are
    the values, where one is (onnxruntime's constant folding computed them so): the
    dequantized codes are the values bit for bit. Every part at once, a row each, in float32
    and without sorting where it can: a slice at a time took 2 ms, 50 s for twelve 2048 x 2048
    weights per channel. The rows are a view of ``values`` where its layout allows (per tensor,
    along the first axis or along the last one) and the passes over them reuse their
    temporaries: a transposed copy and a new array a pass took 0.13 s and 80 MiB a weight."""
    x = np.asarray(values, np.float32)
    if x.size == 0 or not np.isfinite(x).all():
        return None
    rows = _parts(x, axis)
    codes, found = _grid_codes(rows)
    if not found.all():
        return None
    steps = _exact_steps(rows, codes)
    if not steps.any():
        return None
    off = np.multiply(codes, steps[:, None])
    np.subtract(off, rows, out=off)
    np.abs(off, out=off)
    if (off.max(axis=1) > 4 * np.spacing(np.maximum(rows.max(axis=1), -rows.min(axis=1)))).any():
        return None
    del off
    low, high = codes.min(axis=1), codes.max(axis=1)
    # int8 holds 256 codes: the grid's own zero point shifts codes past its range (a uint8
    # weight with zero point 128 holds -128..127 about 0; an asymmetric one is shifted)
    zeros = np.where(low < -128, -128 - low, np.where(high > 127, 127 - high, 0)).astype(np.float32)
    codes += zeros[:, None]
    if codes.min() < -128 or codes.max() > 127:  # more than 256 codes
        return None
    # an all-zero row lies on every grid: any positive step gives its zeros back
    steps[steps == 0] = np.median(steps[steps > 0])
    codes, zeros = codes.astype(np.int8), zeros.astype(np.int8)
    if axis is None:
        return codes.reshape(x.shape), steps.reshape(()), zeros.reshape(())
    moved = (x.shape[axis],) + tuple(d for k, d in enumerate(x.shape) if k != axis % x.ndim)
    return np.moveaxis(codes.reshape(moved), 0, axis), steps, zeros


def _parts(x, axis):
    """``x`` as a row per part (per tensor: one row; else one per index of ``axis``): a view
    where its layout allows, a part's elements a column of the memory along the last axis
    (numpy reduces along it as fast as along a row), else a copy laid out a row a part
    (reductions along other strides ran several times slower)."""
    if axis is None:
        return x.reshape(1, -1)
    axis %= x.ndim
    if axis == 0:
        return x.reshape(x.shape[0], -1)
    if axis == x.ndim - 1:
        return x.reshape(-1, x.shape[-1]).T
    return np.ascontiguousarray(np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1))


def _grid_codes(rows):
    """``(codes, found)``: each row of ``rows`` (float32 or float64) as whole multiples of a
    step of its own, codes at most FOUND_LEVELS apart (float32; 0 for an all-zero row), and
    which rows lie on such a grid. The smallest magnitude is a whole number of steps, few of
    them in a weight's row; the smallest gap between two values (a sort) is tried only where
    it is not."""
    magnitudes = np.abs(rows)
    seeds = magnitudes.min(axis=1, where=magnitudes != 0, initial=np.inf)
    del magnitudes
    codes, found = _row_codes(rows, seeds)
    if not found.all():
        left = np.flatnonzero(~found)
        gaps = np.diff(np.sort(rows[left], axis=1), axis=1)
        gaps[gaps == 0] = np.inf
        codes[left], found[left] = _row_codes(rows[left], gaps.min(axis=1, initial=np.inf))
    return codes, found


def _row_codes(rows, seeds):
    """``(codes, found)``: each row of ``rows`` as whole multiples of ``seeds`` (a
    whole number of its grid's steps; inf for an all-zero row) divided by 1 to 16, codes at
    most FOUND_LEVELS apart (float32; 0 for an all-zero row), and which rows lie on one."""
    codes = None  # made on the first row found off that first pass: usually every row is on it
    found = ~np.isfinite(seeds)
    looking = ~found
    for whole in range(1, 17):  # unused codes between zero and the smallest value (or the closest two)
        at = np.flatnonzero(looking)
        if not at.size:
            break
        whole_rows = at.size == len(rows)
        part = rows if whole_rows else rows[at]  # no copy of the whole on the first pass
        scaled = part / (seeds[at] / np.float32(whole))[:, None]
        ours = np.rint(scaled)
        span = ours.max(axis=1) - ours.min(axis=1)
        np.subtract(scaled, ours, out=scaled)
        np.abs(scaled, out=scaled)
        ok = (scaled.max(axis=1) <= 0.05) & (span < FOUND_LEVELS)
        del scaled
        if codes is None and whole_rows and ok.all():
            codes = ours.astype(np.float32, copy=False)
        else:
            if codes is None:
                codes = np.zeros(rows.shape, np.float32)
            codes[at[ok]] = ours[ok]
        found[at[ok]] = True
        # a finer step only spreads the codes wider: a row FOUND_LEVELS codes wide is on no grid
        looking[at[ok | (span >= FOUND_LEVELS)]] = False
    return (np.zeros(rows.shape, np.float32) if codes is None else codes), found


def _exact_steps(rows, codes):
    """Per row, the float32 step whose products with ``codes`` (float32) are ``rows`` (float32)
    for the most elements: the ratio at the row's largest code (within a float32 step of the
    grid's, as ``code * step`` was rounded to float32) or its neighbours; 0 for an all-zero row."""
    index = np.arange(len(rows))
    magnitudes = np.abs(codes)
    # the first of a row's largest codes, as argmax gives it: argmax itself copies a row
    # that is a column of the memory (a weight per channel along its last axis), 30 ms a weight
    largest = magnitudes.max(axis=1)
    top = np.min(np.broadcast_to(np.arange(codes.shape[1]), codes.shape), axis=1,
                 where=magnitudes == largest[:, None], initial=codes.shape[1])
    del magnitudes
    nonzero = codes[index, top] != 0
    ratio = np.where(nonzero, rows[index, top] / np.where(nonzero, codes[index, top], 1), 0).astype(np.float32)
    best, matched = np.zeros(len(rows), np.float32), np.full(len(rows), -1)
    at = np.arange(len(rows))  # the rows not yet given back bit for bit: usually none after the ratio
    for step in (ratio, np.nextafter(ratio, np.float32(0)), np.nextafter(ratio, np.float32(np.inf))):
        whole_rows = at.size == len(rows)  # no copy of the whole on the first pass
        part, ours = (rows, codes) if whole_rows else (rows[at], codes[at])
        count = np.count_nonzero(ours * step[at][:, None] == part, axis=1)
        better = nonzero[at] & (step[at] > 0) & (count > matched[at])
        best[at[better]], matched[at[better]] = step[at][better], count[better]
        at = at[matched[at] < rows.shape[1]]
        if not at.size:
            break
    return best


def bias_codes(values, scale):
    """int32 codes whose DequantizeLinear (zero point 0) on ``scale`` (float32, one or one per
    element of the 1-D ``values``) gives float32 ``values`` back bit for bit, or None: a bias
    quantized on its reader's input scale times its weight scale (quantize_static's int32
    bias) and folded into the file. Exactness is the test: a float bias off that grid, whose
    codes run in the thousands, hardly ever lands on it in every element."""
    x = np.asarray(values)
    scale = np.asarray(scale, np.float32).reshape(-1)
    if x.dtype != np.float32 or x.ndim != 1 or scale.size not in (1, x.size) or not (scale > 0).all():
        return None
    codes = np.rint(x.astype(np.float64) / scale)
    if not np.isfinite(codes).all() or np.abs(codes).max(initial=0) >= 2 ** 31:
        return None
    if not np.array_equal(codes.astype(np.float32) * scale, x):
        return None
    return codes.astype(np.int32)

"""Which calibration nodes a remedy can act on, and the fake-quant that simulates it."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..channelwise import channel_axis
from ..model import QParams
from .clock import Clock


def candidates_for(engine, remedy, per_channel_activations=False):
    """Calibration nodes the remedy can act on, graph order, and why others cannot."""
    qm = engine.qmodel
    out, skipped = [], []
    for c in qm.calibration.values():
        if c.role == "bias" or (c.dynamic and remedy != "float"):
            continue  # a dynamic range has no calibrated range to widen or split by channel
        if remedy == "int16" and qm.wider_type(c) is None:
            continue
        if not engine.is_gated(c.name):
            skipped.append(c.name)
            continue
        if remedy == "per-channel":
            if c.per_channel:
                continue
            if c.kind == "weight" and not qm.takes_per_channel(c):
                continue
            if c.kind == "activation" and not per_channel_activations:
                continue
        out.append(c.name)
    return out, skipped


def menus_for(engine, kinds, per_channel_activations=False):
    """``({node: [kinds it can take]}, skipped)`` for a mixed search over ``kinds``, graph order."""
    menus, skipped = {}, []
    for kind in kinds:
        pool, out = candidates_for(engine, kind, per_channel_activations)
        skipped += [n for n in out if n not in skipped]
        for n in pool:
            menus.setdefault(n, []).append(kind)
    order = {n: k for k, n in enumerate(engine.qmodel.calibration)}
    return {n: menus[n] for n in sorted(menus, key=order.get)}, skipped


def float_input(engine, c):
    """The float value of a weight node's input (the float weight), or None if unknown."""
    qm = engine.qmodel
    if c.float_weight:
        return qm.float_weights[c.float_weight]
    if c.q_node is not None:
        return qm.constant(c.input)
    return None


def symmetric_channels(c):
    """Whether the per-channel grid a remedy gives calibration node ``c`` is symmetric: a
    signed node whose zero points are all 0. Others get an asymmetric one, which their
    settings ask for (``"symmetric": False``: quantize_static makes every per-channel weight
    symmetric unless told, a grid other than the one scored)."""
    return c.qrange[0] < 0 and bool(np.all(c.zero_point == 0))


def channel_range_qparams(c, lo, hi, rank, axis, qrange=None):
    """Per-channel QParams covering ``[lo, hi]`` (one value per channel) at ``c``'s bit width,
    or on the codes ``qrange`` (a weight's half grid under reduce_range).

    Symmetric where :func:`symmetric_channels` (onnxruntime's weight default, which uses
    ``[-127, 127]`` for int8); others are asymmetric over the range extended to 0.
    """
    qmin, qmax = qrange or c.qrange
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    if symmetric_channels(c):
        q = min(qmax, -qmin)
        span = np.maximum(np.abs(lo), np.abs(hi))
        scale = np.where(span > 0, span / q, 1.0)
        zp = np.zeros_like(scale)
        qlo, qhi = -q, q
    else:
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
        span = hi - lo
        # a channel of zeros quantizes exactly with any scale
        scale = np.where(span > 0, span / (qmax - qmin), 1.0)
        zp = np.clip(np.rint(qmin - lo / scale), qmin, qmax)
        qlo, qhi = qmin, qmax
    shape = [1] * rank
    shape[axis] = -1
    return QParams(scale.astype(np.float32).reshape(shape), zp.astype(np.float32).reshape(shape),
                   qlo, qhi, f"per-channel {c.dtype_name}")


def _wider_weight(c, w, bits):
    """The grid a MinMax quantizer gives weight ``w`` at ``bits`` bits (onnxruntime's
    quantize_static with a 16-bit override): over the weight's own range, per channel where
    ``c`` is, symmetric where ``c`` is. Not ``c``'s 8-bit range at more bits: that range
    ends a step beyond the weights, and the model given may amplify the difference (one
    depthwise weight of the PP-OCR classifier so read 0.9928 against 0.9948 re-quantized)."""
    signed = c.grid.signed
    qrange = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    if c.per_channel:
        axis = (c.axis if c.axis is not None else 1) % w.ndim
        other = tuple(a for a in range(w.ndim) if a != axis)
        lo, hi = w.min(axis=other), w.max(axis=other)
    else:
        axis, lo, hi = 0, np.array([w.min()]), np.array([w.max()])
    q = channel_range_qparams(c, lo, hi, w.ndim, axis, qrange)
    return dataclasses.replace(q, label=f"int{bits}" if signed else f"uint{bits}")


def _activation_ranges(engine, names, indices, clock, per_channel=True):
    """Per-channel (min, max, rank, axis) of the float input of activation nodes over samples;
    without ``per_channel``, (min, max, rank, None) over the whole tensor (samples of other
    lengths along any axis)."""

    qm = engine.qmodel
    tensors = {n: qm.calibration[n].input for n in names}
    found = {}

    def add(values):
        for n, t in tensors.items():
            v = values.get(t)
            if v is None or (v.ndim < 2 if per_channel else not v.size):
                continue
            if not per_channel:
                lo, hi, axis = v.min(), v.max(), None
            else:
                axis = channel_axis(qm, qm.calibration[n], v.shape)
                other = tuple(a for a in range(v.ndim) if a != axis)
                lo, hi = v.min(axis=other), v.max(axis=other)
            if n in found:
                found[n] = (np.minimum(found[n][0], lo), np.maximum(found[n][1], hi), v.ndim, axis)
            else:
                found[n] = (lo, hi, v.ndim, axis)

    probe = list(dict.fromkeys(t for t in tensors.values() if t in engine.probe_tensors))
    for i, parts in engine.probes(indices, [], probe):
        clock.check()
        add(engine.sample(i))  # the model's inputs
        for values, _, _ in parts:  # the nodes' outputs, a part of the sample at a time
            add(values)
    return found


def _calibrated_spans(engine, names, indices, clock):
    """``{node: (lo, hi)}``: the range onnxruntime's MinMax calibrated a per-tensor activation
    pair on, where the data given are what it calibrated on. An 8-bit grid rounds its zero
    point to a whole code, which shifts the calibrated range by up to half a step: a masked
    Softmax input calibrated on [-10003.5, 6.57] holds [-10011, 0] in uint8 codes, and a
    16-bit grid on that range cut every positive score to 0 where onnxruntime's 16-bit grid
    keeps them. Where both ends of the data lie within half a step of the grid's, the data's
    range (with 0, as onnxruntime's) is the one calibrated; elsewhere (other data, another
    method) the grid's is kept."""
    qm = engine.qmodel
    per_tensor = [n for n in names if qm.calibration[n].scale.size == 1 and not qm.calibration[n].grid.is_float]
    out = {}
    for n, (lo, hi, _, _) in _activation_ranges(engine, per_tensor, indices, clock, per_channel=False).items():
        c = qm.calibration[n]
        low, high = (float(v) for v in c.range())
        half = abs(float(c.scale.reshape(-1)[0])) / 2
        if abs(float(lo) - low) <= half and abs(float(hi) - high) <= half:
            out[n] = (min(float(lo), 0.0), max(float(hi), 0.0))
    return out


def alternatives_for(engine, remedy, names, indices, clock=None):
    """``({node: QParams}, {node: channel axis})`` simulating ``remedy`` for ``names``."""

    clock = clock or Clock(None)
    qm = engine.qmodel
    alts, axes = {}, {}
    if remedy == "int16":
        spans = _calibrated_spans(engine, [n for n in names if qm.calibration[n].kind != "weight"], indices, clock)
        for n in names:
            c = qm.calibration[n]
            w = float_input(engine, c) if c.kind == "weight" else None
            if w is not None and w.ndim and not c.block_size:
                alts[n] = _wider_weight(c, np.asarray(w, np.float64), 16)
            else:  # an activation: the range calibrated for it, on the finer grid
                alts[n] = QParams.wider(c, 16, w.shape if w is not None and c.scale.size > 1 else None, spans.get(n),
                                        symmetric=c.kind == "activation" and qm.symmetric_activations())
    elif remedy == "per-channel":
        acts = [n for n in names if qm.calibration[n].kind == "activation"]
        for n in names:
            c = qm.calibration[n]
            if c.kind != "weight":
                continue
            w = float_input(engine, c)
            if w is None or w.ndim < 2:
                continue
            axis = channel_axis(qm, c, w.shape)
            other = tuple(a for a in range(w.ndim) if a != axis)
            # a weight quantized with reduce_range is re-quantized with it: 7 bits per channel too
            alts[n] = channel_range_qparams(c, w.min(axis=other), w.max(axis=other), w.ndim, axis,
                                            qm.reduced_range(c))
            axes[n] = axis
        for n, (lo, hi, rank, axis) in _activation_ranges(engine, acts, indices, clock).items():
            alts[n] = channel_range_qparams(qm.calibration[n], lo, hi, rank, axis)
            axes[n] = axis
    return alts, axes


"""What re-quantizing with a remedy did, read from the grids of the models it gave.

A quantizer may apply a remedy otherwise than asked (a tensor asked at 16 bits left at 8, a
neighbour's exclusion taking a pair away) and change tensors it did not name; both the
onnxruntime check and a producer's check report it by the same rules.

A pair is found by its place: the float tensor it quantizes and its position in that tensor's
requantize chain (0 for the chain's head or a lone pair). A chain puts two pairs on one float
tensor, and the remedy names one of them: keyed by the tensor alone, the later pair hid the
head, and raising the head read as not applied where the file had it at 16 bit.
"""

from __future__ import annotations

KINDS = ("float", "int16", "per-channel")


def places(qmodel, tensor_of):
    """``{(float tensor, chain position): calibration node}`` of ``qmodel``'s quantized tensors
    (biases left out); ``tensor_of(c)``: the float tensor calibration node ``c`` quantizes."""
    return {(tensor_of(c), qmodel.chain_position(c.name)): c for c in qmodel.calibration.values()
            if c.role != "bias"}


def _read_at(pairs, place):
    """The pair of ``pairs`` that the readers of ``place`` read: its own, else the last one
    before it in the tensor's chain (a quantizer writing a shorter chain); None: float."""
    tensor, position = place
    return next((pairs[(tensor, p)] for p in range(position, -1, -1) if (tensor, p) in pairs), None)


def _chains(pairs):
    """``{tensor: [(bit, per channel) of each pair, first to last]}`` of :func:`places`."""
    out = {}
    for (tensor, _), c in sorted(pairs.items(), key=lambda item: item[0][1]):
        out.setdefault(tensor, []).append((c.bit, c.per_channel))
    return out


def changes(before, after, expect, named=()):
    """``{"kept", "not_applied", "in_float", "collateral"}`` of a re-quantization.

    ``before`` / ``after``: :func:`places` of the quantized tensors without and with the
    remedy; ``expect``: ``{kind: [(tensor, chain position)]}`` the remedy names (a missing
    kind: none); ``named``: tensors it also touches without a check of its own. ``kept``: per
    kind, tensor -> applied at every position named (a tensor asked at 16 bits or per channel
    that came out float has more precision than asked: applied, and listed in ``in_float``);
    ``collateral``: tensors not named whose chain of pairs it left in float or changed in
    length, width or granularity. Lists sorted, of tensors.
    """
    expect = {kind: list(expect.get(kind, ())) for kind in KINDS}
    applied = {"float": lambda d: d is None, "int16": lambda d: d is None or d.bit >= 16,
               "per-channel": lambda d: d is None or d.per_channel}
    kept = {kind: {} for kind in KINDS}
    for kind, asked in expect.items():
        for place in asked:
            kept[kind][place[0]] = kept[kind].get(place[0], True) and applied[kind](_read_at(after, place))
    every = {t for ts in expect.values() for t, _ in ts} | set(named)

    was, now = _chains(before), _chains(after)
    collateral = sorted(t for t in was if t not in every and was[t] != now.get(t))
    return {"kept": kept, "not_applied": sorted(t for ts in kept.values() for t, ok in ts.items() if not ok),
            "in_float": sorted({t for kind in ("int16", "per-channel") for t, p in expect[kind]
                                if _read_at(after, (t, p)) is None}),
            "collateral": collateral}

"""What re-quantizing with a remedy did, read from the grids of the models it gave.

A quantizer may apply a remedy otherwise than asked (a tensor asked at 16 bits left at 8, a
neighbour's exclusion taking a pair away) and change tensors it did not name; both the
onnxruntime check and a producer's check report it by the same rules.
"""

from __future__ import annotations

KINDS = ("float", "int16", "per-channel")


def changes(before, after, expect, named=()):
    """``{"kept", "not_applied", "in_float", "collateral"}`` of a re-quantization.

    ``before`` / ``after``: ``{tensor: calibration node}`` of the quantized tensors without
    and with the remedy; ``expect``: ``{kind: [tensors]}`` the remedy names (a missing kind:
    none); ``named``: tensors it also touches without a check of its own. ``kept``: per
    kind, tensor -> applied (a tensor asked at 16 bits or per channel that came out float
    has more precision than asked: applied, and listed in ``in_float``); ``collateral``:
    tensors not named that it left in float or changed in width or granularity. Lists sorted.
    """
    expect = {kind: list(expect.get(kind, ())) for kind in KINDS}
    kept = {"float": {t: t not in after for t in expect["float"]},
            "int16": {t: t not in after or after[t].bit >= 16 for t in expect["int16"]},
            "per-channel": {t: t not in after or after[t].per_channel for t in expect["per-channel"]}}
    every = {t for ts in expect.values() for t in ts} | set(named)
    collateral = sorted(t for t in before if t not in every and (
        t not in after or after[t].bit != before[t].bit or after[t].per_channel != before[t].per_channel))
    return {"kept": kept, "not_applied": sorted(t for ts in kept.values() for t, ok in ts.items() if not ok),
            "in_float": sorted(t for t in expect["int16"] + expect["per-channel"] if t not in after),
            "collateral": collateral}

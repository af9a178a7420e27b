"""What a node's statistics mean for quantization: one readable line, and what to try."""

from __future__ import annotations

import math

from ..channelwise import reading as channel_reading
from ..tables import short as _fmt
from .gather import empty

# Share of clipped values beyond which the calibration range is too narrow.
CLIP_SHARE = 1e-3
# The bulk of a tensor spanning fewer levels than this wastes at least 4 bits of an 8-bit type.
FEW_LEVELS = 16
# A weight's share clipped by its own scale beyond which the scale does not fit the weights:
# a clipping calibrator (AWQ's clip search, a percentile) cuts a few per cent at most.
WEIGHT_CLIP_SHARE = 0.1
# A weight channel below this SQNR (dB) is starved of levels (int8 weights usually reach 30-40).
WEAK_SQNR_DB = 20.0


def few_levels(bit):
    """Levels under which a tensor's bulk counts as starved: FEW_LEVELS, or 1/16 of a narrower type's."""
    return min(FEW_LEVELS, 2 ** bit / 16)


def bulk_codes(d):
    """Distinct grid codes that all but the thinnest tails of the data fall on (counted on the
    real grid), else the histogram estimate of the levels the bulk spans."""
    return d.get("bulk_codes", d.get("bulk_levels"))


def starved(d):
    """Whether the bulk of a tensor falls on too few codes: fewer than :func:`few_levels`, and
    fewer than half its values (ten bias values on ten codes use all they can)."""
    levels = bulk_codes(d)
    return levels is not None and levels < few_levels(d["bit"]) and levels < d.get("count", math.inf) / 2


def codes_text(d):
    """"uses 37 of 256 codes (99.9% of values on 12)", or "" when not counted."""
    if d.get("codes_used") is None:
        return ""
    return f"uses {d['codes_used']} of {d['levels']} codes (99.9% of values on {d['bulk_codes']})"


def wider(d):
    """The wider type to try for a node's statistics ``d`` ("int16"), or None where there is
    none (16 bits already, a float grid, a dynamic model: see ``QuantModel.wider_type``)."""
    return d.get("wider", "int16" if d.get("bit", 8) < 16 else None)


def _wider_list(d):
    w = wider(d)
    return [w] if w else []


def _or_wider(d):
    w = wider(d)
    return f", or {w}" if w else ""


def beyond_int16(d):
    """Whether the bulk of an activation would stay starved of codes on a 16-bit grid over
    the same range (or is, at 16 bits): more bits cannot help, the range itself is wrong."""
    wide = d.get("bulk_codes_16", bulk_codes(d) if d.get("bit", 8) >= 16 else None)
    return wide is not None and wide < FEW_LEVELS


# A magnitude no real activation reaches: float32's extremes (3.4e38) and the -1e9 style
# fills that masks use as minus infinity.
FILL_MAGNITUDE = 1e8
# Fewer values than this (a scalar per sample, on a few samples) show no distribution to judge
FEW_VALUES = 32


def too_few(d):
    """``"only 2 values on these samples ..."`` where an activation holds too few values for
    its histogram to say how its range fits them, else ""."""
    n = d.get("count", 0)
    if n >= FEW_VALUES or constant(d):
        return ""
    return f"only {n} value(s) on these samples (a few per sample): too few to judge how the range fits them"


def _far(d):
    """What sets a starved range: named by its extreme when that is a fill value."""
    lo, hi = d.get("min"), d.get("max")
    far = [v for v in (lo, hi) if v is not None and abs(v) >= FILL_MAGNITUDE]
    if far:
        v = max(far, key=abs)
        return f"values at {v:.4g} (a fill such as a mask's minus infinity)"
    return "a few values far from the rest"


# A calibrated range this share or more below zero, on a tensor that never goes there (a
# symmetric range on a Relu's output), wastes a bit of the grid.
UNUSED_BELOW = 0.25


def unused_below_zero(d):
    """The share of an activation's range below zero where its values never go (none of them
    negative), or None below :data:`UNUSED_BELOW`: what a symmetric range costs a Relu output.
    None on a float grid (float8): its zero point is 0, there is no asymmetric range to move to."""
    lo, hi, least = d.get("range_lo"), d.get("range_hi"), d.get("min")
    if d.get("kind") != "activation" or d.get("float_grid") or None in (lo, hi, least) or hi <= lo or lo >= 0 \
            or least < -0.5 * (d.get("scale") or 0):  # within half a step of zero: rounding
        return None
    share = -lo / (hi - lo)
    return share if share >= UNUSED_BELOW else None


def constant(d):
    """Whether a tensor held one value on every sample (its range's codes then say nothing)."""
    return d.get("count", 0) > 1 and d.get("min") is not None and d["min"] == d.get("max")


def activation_reading(d, box=None):
    """One line saying what an activation's histogram means for quantization; with its
    channels' ``box`` statistics, their outlier channels first where a per-tensor scale holds
    them (the pooled histogram can look well fitted while most channels starve)."""
    if box and "skipped" not in box and box.get("outlier_channels") and not d.get("per_channel"):
        return channel_reading(box)
    if d.get("effective_clipped_share", 0) > CLIP_SHARE:
        return (f"{100 * d['effective_clipped_share']:.2f}% of values fall outside the calibration range and "
                f"are clipped -> recalibrate with a wider range{_or_wider(d)}")
    if d.get("clipped_share", 0) > CLIP_SHARE and d.get("relu_follows"):
        extra = "the Relu after it zeroes them anyway"
        return (f"{100 * d['clipped_share']:.2f}% of values fall below the range's start and are clipped; "
                f"{extra}, so the cut is harmless")
    if constant(d):
        return (f"every value is {d['min']:.6g} on every sample (a constant, such as a weight behind an Identity): "
                f"one code, off by at most half a step ({d['scale'] / 2:.3g}) -> harmless")
    if too_few(d):
        return too_few(d)
    levels = bulk_codes(d)
    if starved(d):
        few = f"99.9% of values fall on only {levels:.0f} of the {d.get('levels', 2 ** d['bit'])} codes"
        if beyond_int16(d):
            would = f", and would on {d['bulk_codes_16']} of 65536 at 16 bits" if "bulk_codes_16" in d else ""
            return (f"{few}{would}: {_far(d)} set the range -> keep in float, or fix the model (a finite fill, "
                    "or clip the tail)")
        return (f"{few}: rare large values stretch the range -> {wider(d) or 'keep in float'}, or fix the model "
                "(clip/normalise the tail)")
    if d["kind"] == "dynamic":
        return "the range is computed on every run from the tensor itself: nothing is clipped, and it fits the data"
    if d["max_abs"] and d["threshold"] > 4 * d["max_abs"] and d["role"] != "bias":
        return (f"the calibration range is {d['threshold'] / d['max_abs']:.0f}x wider than the data on these "
                "samples: the samples may not match the calibration data")
    unused = unused_below_zero(d)
    if unused is not None:
        return (f"{unused:.0%} of the range lies below zero, where no value goes (a symmetric range on a "
                f"non-negative tensor), so the values use {'only ' + str(d['codes_used']) if d.get('codes_used') else 'part'}"
                f" of the {d.get('levels', 2 ** d['bit'])} codes -> an asymmetric range (onnxruntime: "
                f"ActivationSymmetric=False){_or_wider(d)}")
    used = codes_text(d)
    return f"the range fits the data ({used})" if used else "the range fits the data: per-tensor quantization looks adequate here"


def weight_issue(d, box=None):
    """``(remedies, reason)`` for a weight's statistics (and box plot, when drawn); the
    remedies are empty when the weight quantizes cleanly."""
    if d.get("note"):
        return ["keep in float"], "float weight unknown: pass the float model to judge the weight itself"
    if d["role"] == "bias":
        return [], "int32 bias: its quantization error is negligible"
    if exact(d):
        # an all-zero weight, or one already on the grid, falls on one code yet loses nothing:
        # "too few codes" advice would send the user after a weight that is not the problem
        return [], "every weight is stored exactly (max error 0): its quantization costs nothing, nothing to do"
    worst, whole, levels = d.get("worst_channel_sqnr"), d["sqnr"], bulk_codes(d)
    clipped = d.get("clipped_share", 0)
    lowest = (d.get("float") or {}).get("min")
    if clipped > WEIGHT_CLIP_SHARE and d["range_lo"] >= 0 and lowest is not None and lowest < 0:
        # a scale that fits the weights' magnitude on a grid without negative codes: no
        # recalibration recovers them
        return ["keep in float", "fix the model"], (
            f"the grid holds no value below 0 (range [{d['range_lo']:.4g}, {d['range_hi']:.4g}]: an unsigned type "
            "with zero point 0, what a QuantizeLinear without a zero point quantizes to), so every negative weight "
            f"becomes 0 ({100 * clipped:.1f}% clipped, SQNR {whole:.1f} dB) -> quantize the weight with a signed type "
            "(an int8 zero point), or a zero point that puts 0 inside its range")
    if clipped > WEIGHT_CLIP_SHARE:
        return ["recalibrate", "fix the model"], (
            f"{100 * clipped:.1f}% of the weights lie beyond the range their scale covers and are clipped (SQNR "
            f"{whole:.1f} dB): the scale was not computed from these weights -> recompute it from their range "
            "(MinMax), or check that the float model is the one that was quantized")
    starved_bulk = starved(d)
    # onnxruntime splits only a Conv's, Gemm's or MatMul's weight by channel (not a norm's scale)
    splittable = d.get("takes_per_channel", True)
    if not d["per_channel"] and splittable:
        if worst is not None and worst < WEAK_SQNR_DB and whole - worst > 6:
            wide = d.get("widest_channel")
            # as the box plot words it (7.6x read "8x" here beside its "no outlier channel" under 8x)
            who = (f"channel {wide}, {d['widest_ratio']:.1f}x wider than the median channel, sets the per-tensor "
                   "scale" if wide is not None and wide != d["worst_channel"] else "a few wide channels set the "
                   "per-tensor scale")
            return ["per-channel"], (f"channel {d['worst_channel']} keeps only {worst:.1f} dB SQNR (whole tensor "
                                     f"{whole:.1f} dB): {who} -> per-channel weights")
        if box and "skipped" not in box and box["outlier_channels"]:
            return ["per-channel"], channel_reading(box)
        if starved_bulk:
            return ["per-channel"], (f"99.9% of the weights fall on {levels:.0f} of {d.get('levels', 2 ** d['bit'])} "
                                     "codes: a few large weights set the scale -> per-channel weights")
    # too few levels even per channel: more bits where the type allows, else float
    more = [wider(d) or "keep in float", "fix the model"]
    # below 8 bits, int8 is the next step a quantizer offers (a weight-only one's 8-bit blocks too, which no
    # remedy simulates); int16 is what the remedies simulate
    then = (f"{'int8 or ' if d['bit'] < 8 else ''}{wider(d)} weights" if wider(d) else
            "int8 weights or keep it in float" if d["bit"] < 8 else "keep it in float")
    if whole < WEAK_SQNR_DB:
        return more, (f"SQNR {whole:.1f} dB at {d['bit']} bits: too few levels for this weight -> "
                      f"{'more bits (int8/int16)' if wider(d) else then}, or QAT")
    if d.get("block_size"):
        even = f"even per block of {d['block_size']}"
    elif d["per_channel"] or splittable:
        even = "even per channel"
    else:
        even = "per tensor (onnxruntime quantizes the weights of this op per tensor only)"
    if worst is not None and worst < WEAK_SQNR_DB:
        return more, f"channel {d['worst_channel']} keeps only {worst:.1f} dB {even} -> {then}, or QAT"
    if starved_bulk:
        return more, (f"99.9% of the weights fall on {levels:.0f} of {d.get('levels', 2 ** d['bit'])} codes {even} "
                      f"-> {then}, or QAT")
    tail = f", worst channel {worst:.1f} dB" if worst is not None else ""
    return [], f"SQNR {_fmt(whole)} dB{tail}: the weight quantizes cleanly"


def exact(d):
    """Whether a weight's dequantized values equal its float ones (a float model to compare
    with given): SQNR infinite, nothing lost."""
    return d.get("compared_against") == "float weight" and d.get("max_abs_error") == 0 and d.get("count", 0) > 0


def weight_reading(d):
    """One line saying what a weight's histogram means for quantization."""
    return weight_issue(d)[1]


def advise_activation(d, box=None):
    """``(what to try, reasons)`` for an activation's statistics (and box plot, when drawn):
    outlier channels under a per-tensor scale, clipping, or a bulk starved of codes; a
    well-shaped distribution leaves int16 or float."""
    tries, reasons = [], []
    if box and "skipped" not in box and box["outlier_channels"] and not d["per_channel"]:
        tries += ["per-channel", *_wider_list(d), "fix the model"]
        reasons.append(channel_reading(box) + "; or equalise the channel ranges in the model")
    if d.get("effective_clipped_share", 0) > CLIP_SHARE:
        tries += ["recalibrate", *_wider_list(d)]
        reasons.append(activation_reading(d))
    elif not constant(d) and not too_few(d) and starved(d):
        tries += ["keep in float" if beyond_int16(d) else wider(d) or "keep in float", "fix the model"]
        reasons.append(activation_reading(d))
    if not tries and unused_below_zero(d) is not None:
        tries = [*_wider_list(d), "keep in float"]
        reasons.append(activation_reading(d))
    if not tries and too_few(d):
        tries = [*_wider_list(d), "keep in float"]
        reasons.append(too_few(d) + "; rank on more samples to read its range")
    if not tries:
        tries = [*_wider_list(d), "keep in float"]
        clipped = d.get("effective_clipped_share", 0)
        relu = " beyond what the Relu after it zeroes" if d.get("relu_follows") and d.get("clipped_low") else ""
        used = codes_text(d) or f"bulk spans {d.get('bulk_levels') or 0:.0f} levels"
        reasons.append(f"its distribution is well shaped (clipped {100 * clipped:.3f}%{relu}, {used}): the node is "
                       "simply sensitive")
    return list(dict.fromkeys(tries)), reasons


def advise_weight(d, box=None):
    """``(what to try, reasons)`` for a weight's statistics: :func:`weight_issue`'s remedy, or
    int16 / float for a weight that quantizes cleanly but is sensitive all the same."""
    tries, reason = weight_issue(d, box)
    if exact(d):
        return [], [reason]
    if not tries:
        return [*_wider_list(d), "keep in float"], [reason + "; the node is simply sensitive"]
    return tries, [reason]


def advise_dynamic(d, box=None):
    """``(what to try, reasons)`` for a dynamic quantizer (DynamicQuantizeLinear): it clips
    nothing and quantize_dynamic offers it no other type, so what remains is keeping its
    consumers in float."""
    levels = d.get("bulk_levels")
    if starved(d):
        return ["keep in float"], [activation_reading(d) + "; quantize_dynamic has no 16-bit activations, so keep "
                                   "its consumers in float (nodes_to_exclude)"]
    return ["keep in float"], [f"its range is computed per run (bulk spans {levels or 0:.0f} levels): the node is "
                               "simply sensitive; keep its consumers in float (nodes_to_exclude) if it costs too much"]


def advise(d, box=None):
    """``(what to try, reasons)`` for a calibration node's statistics ``d`` (from
    :func:`~pytest_ptq.distribution.collect`), by its kind; nothing to try for an empty
    tensor, which no grid can lose anything of."""
    if "skipped" in d:
        return [], [empty(d["tensor"], d.get("shape"), "lose: quantizing it changes nothing")]
    return {"activation": advise_activation, "weight": advise_weight, "dynamic": advise_dynamic}[d["kind"]](d, box)

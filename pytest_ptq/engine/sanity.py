"""Is the model with every pair bypassed the float model? Decided on the data.

Quantizers that delete a Relu/Clip after folding it into a pair's range leave a graph
whose bypassed form is not the float model, and every sensitivity would then be measured
against the wrong reference. The mark is in the values: with every pair bypassed, the
input of such a pair goes below the floor of its range (the deleted Relu made it
non-negative), on a good share of the data. A range starting at 0 alone says nothing
(MinMax calibration puts 0 in every range, and many tensors are non-negative by nature),
and a bypassed model far from the quantized one is a badly quantized model, not evidence.

So, on a spread of samples: a pair is a suspect when more than ``FLOOR_SHARE`` of its
input's values fall below its floor by more than half a step. The model is refused only on
decisive evidence (bypassed outputs that are non-finite or explode, or suspects on several
pairs); one suspect is a warning with its evidence and the fix. With the float model, the
bypassed outputs are compared with it; a gap the alignment explains as a rewrite by the
quantizer is reported (``rewrite``), one it cannot explain means another float model.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..data import largest_float, overflows
from ..errors import FLOAT_MODEL_OPTION, NonFinite, NotFloatEquivalent
from ..metrics import compare
from ..model import load_weightless
from . import runtime

SPREAD = 8  # samples the checks look at, spread over the data
FLOOR_SHARE = 0.01  # share of a pair's input values below its floor that makes it a suspect
# Bypassed outputs explode when they exceed this many times the quantized ones (or 1, when
# those collapsed toward 0: a badly quantized model's outputs are no measure of scale).
EXPLODE = 1e3
SAME = 0.999  # output cosine at which the bypassed model is the float model
# Differences up to this share of an output's largest float magnitude (over the samples
# checked) are float rounding, whatever the cosine of that sample reads
NEGLIGIBLE = 1e-5
_REQUANTIZE = "re-quantize with extra_options={'AddQDQPairToWeight': True, 'QDQKeepRemovableActivations': True}"
FIX = f"pass the float model ({FLOAT_MODEL_OPTION}) or {_REQUANTIZE}"
# where the float model was given: its Relu/Clip and weights did not match these pairs
FIX_GIVEN = ("check that the float model given is the one this model was quantized from (its Relu/Clip and weights "
             f"are matched to the pairs by structure and values), or {_REQUANTIZE}")


@dataclasses.dataclass
class Equivalence:
    """What the check saw: ``suspects[pair] = (values below its floor, values seen)``;
    ``rewrite``: ``{"cosine", "output", "sample", "changes"}`` when the quantizer rewrote the
    graph beyond Q/DQ (the float model's outputs against the bypassed ones); ``warnings``:
    sentences for the user."""

    samples: list
    suspects: dict
    rewrite: dict | None
    warnings: list


# Float inputs this large are no preprocessed data: an overflow they cause is the data's
HUGE_INPUT = 1e18
# float16 values this large beside a non-finite one tell an overflow (a sixteenth of its largest)
HALF_NEAR_MAX = float(np.finfo(np.float16).max) / 16


def _half_overflow(source, broken, reach):
    """The sentence for a float16 output that the bypassed model (the float model's
    arithmetic) makes non-finite where every pair quantized does not: each pair clips what it
    passes, so only the float path leaves float16's range."""
    _, largest, inf = reach
    return (f"bypassing every Q/DQ pair of {source!r} gives {'infinite' if inf else 'NaN'} values in output "
            f"{broken[0]!r} (sample {broken[1]}), a float16 output whose finite values reach {largest:.3g} of the "
            f"{float(np.finfo(np.float16).max):g} float16 holds, where every pair quantized gives finite ones: the "
            "float16 graph overflows in float on that sample (each pair clips what it passes), so nothing can be "
            "measured against its float arithmetic there; check that sample's preprocessing (its scale), or compute "
            "in float32 the part of the model that overflows")


def spread(n, k=SPREAD):
    """Up to ``k`` sample indices spread evenly over ``n`` samples, first and last included."""
    if n <= k:
        return list(range(n))
    return sorted({int(round(v)) for v in np.linspace(0, n - 1, k)})


def check(engine):
    """Check ``engine`` (which has data); raise :class:`~pytest_ptq.errors.NotFloatEquivalent` on decisive evidence, else
    return the :class:`Equivalence`.

    In two passes over the samples, so that no two whole-graph sessions are held at once
    (a low-memory engine's peak was set here): every pair quantized, its session dropped
    after it (analyses rarely run that config again, and its session beside the float
    segments every analysis runs set the PP-OCRv4 detector's peak), then bypassed (the
    model outputs and the watched pair inputs, compared with the float model on the fly
    when it is given)."""
    qm = engine.qmodel
    samples = spread(len(engine.data))
    candidates = [qm.calibration[n] for n in qm.folded_activation_suspects() if engine.is_gated(n)]
    watched = list(dict.fromkeys(c.input for c in candidates))
    read = list(dict.fromkeys(engine.model_outputs + watched))
    below, seen = {c.name: 0 for c in candidates}, {c.name: 0 for c in candidates}
    scale = {}  # (output, sample) -> the largest finite quantized value, or 1 when smaller
    both = set()  # (output, sample) non-finite quantized too: the data or the model, not the bypass
    try:
        for i in samples:
            for k, q in engine.run(i, "all").items():
                if q.dtype.kind == "f" and q.size and np.isfinite(q).all():
                    scale[k, i] = max(float(np.abs(q).max()), 1.0)
                elif q.dtype.kind == "f" and q.size:
                    both.add((k, i))
    finally:
        engine.forget_config("all")
    broken, exploded = None, None
    against = FloatModel(engine) if engine.float_model is not None else None
    try:
        for i in samples:
            values = engine.tensors(i, (), read)
            for k in engine.model_outputs:
                v = values[k]
                if v.dtype.kind != "f":
                    continue
                if broken is None and not np.isfinite(v).all():
                    broken = (k, i)
                    finite = np.abs(v[np.isfinite(v)])
                    reach = (v.dtype, float(finite.max()) if finite.size else 0.0, bool(np.isinf(v).any()))
                if exploded is None and (k, i) in scale and np.isfinite(v).all() and v.size:
                    if float(np.abs(v).max()) > EXPLODE * scale[k, i]:
                        exploded = (k, i)
            if against is not None:
                against.compare(i, values)
            for c in candidates:
                x = np.asarray(values[c.input], np.float64)
                lo, _ = c.bounds(x.shape)
                below[c.name] += int(np.count_nonzero(x < lo - c.half_step(x.shape)))
                seen[c.name] += x.size
            del values
    finally:
        if against is not None:
            against.close()
        engine.forget_tensors(read)  # read once: its session goes
    suspects = {n: (below[n], seen[n]) for n in below if seen[n] and below[n] > FLOOR_SHARE * seen[n]}
    fix = FIX if engine.float_model is None else FIX_GIVEN
    evidence = _evidence(suspects)
    if broken:
        feeds = engine.sample(broken[1])
        if broken in both or largest_float(feeds) >= HUGE_INPUT:
            how = "every Q/DQ pair quantized, and with every pair bypassed," if broken in both else \
                "every Q/DQ pair bypassed"
            raise overflows(f"{qm.source!r} with {how}", broken[0], broken[1], feeds)
    # infinite, or near float16's largest: an overflow; NaN among small values is arithmetic
    if broken and not suspects and reach[0] == np.float16 and (reach[2] or reach[1] >= HALF_NEAR_MAX):
        raise NonFinite(_half_overflow(qm.source, broken, reach))
    if broken or exploded or len(suspects) >= 2:
        if broken:
            why = f"gives non-finite values in output {broken[0]!r} (sample {broken[1]})"
        elif exploded:
            why = (f"makes output {exploded[0]!r} more than {EXPLODE:g} times larger than the quantized model's "
                   f"(sample {exploded[1]})")
        else:
            why = "is not the float model"
        extra = (f": on {len(samples)} sample(s) the inputs of {evidence}, so the Relu/Clip that kept them "
                 "non-negative was folded into the Q/DQ range and deleted" if suspects else "")
        raise NotFloatEquivalent(f"bypassing every Q/DQ pair of {qm.source!r} {why}{extra}; {fix}")
    warnings = []
    if suspects:
        warnings.append(f"folded activations suspected: with every pair bypassed, the input of {evidence} on "
                        f"{len(samples)} sample(s); its Relu/Clip was probably folded into the range and deleted: "
                        f"{fix}")
    rewrite = None
    if against is not None:
        lost = (getattr(qm, "alignment", None) and qm.alignment.unmatched_weights) or []
        # a lone DQ cannot be bypassed at all; a pair on an on-grid weight can, but its
        # bypass keeps the dequantized value: ranked, it reads as costing nothing
        left_out = [n for n in lost if not qm.calibration[n].bypassable]
        ranked = [n for n in lost if qm.calibration[n].bypassable]
        for names, what in ((left_out, "so the weight rankings leave them out"),
                            (ranked, "so the weight rankings compare each against its dequantized value and read "
                                     "it as costing nothing")):
            if names:
                warnings.append(f"the float model holds no weight that {len(names)} quantized weight(s) round to "
                                f"({', '.join(repr(n) for n in names[:3])}{' ...' if len(names) > 3 else ''}): they "
                                f"stay dequantized in every configuration, {what}, and every other figure carries "
                                "their quantization error; check that the float model is the one this model was "
                                "quantized from")
        rewrite = against.verdict()
        if rewrite is not None:
            warnings.append(f"graph rewritten by the quantizer: output cosine {rewrite['cosine']:.6f} between the float "
                            f"model and this model with every pair bypassed (output {rewrite['output']!r}, worst "
                            f"on sample {rewrite['sample']}; {rewrite['changes']}); rankings, curves and the verdict "
                            "compare against the bypassed graph, a contract's outputs and accuracy against the "
                            "float model itself, and the gap is reported as its own stage")
    else:
        on_grid = [c for c in qm.of_kind("weight") if c.on_grid and c.float_weight is None]
        if on_grid:
            warnings.append(f"{len(on_grid)} weight(s) such as {on_grid[0].name!r} sit behind Q/DQ already rounded "
                            "onto their grid, so bypassing them changes nothing and their sensitivity reads as "
                            f"none; pass the float model ({FLOAT_MODEL_OPTION}) to measure them")
    return Equivalence(samples=samples, suspects=suspects, rewrite=rewrite, warnings=warnings)


def _evidence(suspects):
    shown = sorted(suspects, key=lambda n: -suspects[n][0] / suspects[n][1])
    parts = [f"{n!r} ({suspects[n][0]} of {suspects[n][1]} values, {suspects[n][0] / suspects[n][1]:.1%}, below its "
             "range floor)" for n in shown[:5]]
    more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
    return (f"{len(shown)} pair(s) " if len(shown) > 1 else "pair ") + ", ".join(parts) + more


class FloatModel:
    """The float model run beside the bypassed one, sample by sample: the worst output cosine
    between them, and the verdict on it; and its outputs where it, not the bypassed graph, is
    the reference (see :meth:`.core.Engine.true_float`)."""

    def __init__(self, engine):
        self.engine = engine
        # its weights mapped from their file and shared with the session, not copied: the check
        # runs it on a few samples only, and a private copy of a large model's float weights set
        # the engine's peak (a 180 MiB convolution net: +360 MiB)
        fmodel, fpath, arrays = load_weightless(engine.float_model, what="float model")
        self.where = str(fpath) if fpath else "<ModelProto>"
        self.shared = runtime.SharedWeights(arrays, low_memory=True)  # kept while the session runs: it holds the values
        self.session = runtime.make_session(fmodel, engine.optimization, engine.providers, what="the float model",
                                            libraries=engine.libraries, shared=self.shared)
        self.names = [o.name for o in self.session.get_outputs()]
        self.seen = []  # (cosine, output, sample, largest difference) per output and sample
        self.scale = {}  # output -> its largest magnitude in the float model over the samples

    def outputs(self, feeds):
        """The float model's outputs on ``feeds`` ({input: array}), by name."""
        return dict(zip(self.names, runtime.run(self.session, self.names, feeds, self.where, float_model=True)))

    def compare(self, i, bypassed):
        """Compare the float model on sample ``i`` with ``bypassed`` (name -> value)."""
        with self.engine.on_sample(i):
            ref = self.outputs(self.engine.sample(i))
        for k in self.engine.model_outputs:
            v = bypassed[k]
            if k in ref and v.dtype.kind == "f" and v.size:  # an empty output (no detection) agrees trivially
                r, b = np.asarray(ref[k], np.float64), np.asarray(v, np.float64)
                with np.errstate(invalid="ignore"):  # a NaN difference stays NaN: material
                    diff = float(np.max(np.abs(r - b), initial=0.0))
                self.scale[k] = max(self.scale.get(k, 0.0), float(np.max(np.abs(r), initial=0.0)))
                self.seen.append((compare(ref[k], v)["cosine-similarity"], k, i, diff))

    def close(self):
        self.session = None  # before the values it was given: a session must not outlive them
        self.shared = None

    def verdict(self):
        """None when the float model and the bypassed one agree, a rewrite record when the
        alignment explains the gap; raise when nothing does."""
        qm = self.engine.qmodel
        # a sample whose differences are noise beside the output's scale says nothing: a
        # detector's map of a blank image (at most 9e-8, the others' up to 1) read cosine
        # 0.32 from float32 rounding alone, and was taken for a rewrite
        material = [s for s in self.seen if not s[3] <= NEGLIGIBLE * self.scale[s[1]]]
        worst = min(material, key=lambda s: s[0], default=None)
        if worst is None or worst[0] >= SAME:
            return None
        alignment = getattr(qm, "alignment", None)
        if alignment is None or not alignment.same_weights:
            fitted = (f"; only {alignment.weights_fitted} of the {alignment.weights_tried} weights matched by position "
                      "round from its values" if alignment is not None else "")
            # the options only exist for quantize_static's QDQ output
            again = f", or {_REQUANTIZE}" if qm.format_label == "QDQ" else ""
            raise NotFloatEquivalent(f"bypassing every Q/DQ pair of {qm.source!r} does not reproduce the float model "
                           f"{self.where!r} on output {worst[1]!r} (cosine {worst[0]:.4f} on sample {worst[2]}){fitted}; "
                           f"check that it is the model this one was quantized from{again}")
        inner = qm.inner_qdq()
        changes = "; ".join(alignment.rewrites + ([f"the {inner} stay quantized in every configuration, the "
                                                   "bypassed graph included"] if inner else [])) \
            or "no op changed, but the values differ"
        return {"cosine": worst[0], "output": worst[1], "sample": worst[2], "changes": changes}

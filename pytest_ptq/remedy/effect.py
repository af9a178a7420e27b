"""What re-quantizing with a remedy did, read from the grids of the models it gave.

A quantizer may apply a remedy otherwise than asked (a tensor asked at 16 bits left at 8, a
neighbour's exclusion taking a pair away) and change tensors it did not name; both the
onnxruntime check and a producer's check report it by the same rules.

A pair is found by its place: the float tensor it quantizes, its position in that tensor's
requantize chain (0 for the chain's head or a lone pair) and the operators reading it
(through the chain's later pairs too: :meth:`~pytest_ptq.model.QuantModel.counts_for`). A
chain puts two pairs on one float tensor, and the remedy names one of them: keyed by the
tensor alone, the later pair hid the head, and raising the head read as not applied where the
file had it at 16 bit. A quantizer may also give each reader of a tensor a pair of its own
(ModelOpt, Quark, ``DedicatedQDQPair``), all at position 0: keyed by tensor and position, one
hid the other, and the pair the remedy named, left in float, read as not applied. The readers
are the float model's operators, the same in both re-quantized files, whatever those name
their Q/DQ nodes. One operator may read a tensor at two inputs, each through a pair of its own
(``Add(t, t)``, ``Mul(t, t)``): tensor, position and operator the same, one pair hid the other,
so a reader is an operator and the input it reads the pair at, ``(operator, input index)``; the
index is the float operator's own, kept by every file quantized from it.
"""

from __future__ import annotations

KINDS = ("float", "int16", "per-channel")


def places(qmodel, tensor_of, reader_of=lambda n: n):
    """``{(float tensor, chain position, readers): calibration node}`` of ``qmodel``'s quantized
    tensors (biases left out); ``tensor_of(c)``: the float tensor calibration node ``c``
    quantizes; readers: :func:`readers` with ``reader_of``."""
    return {(tensor_of(c), qmodel.chain_position(c.name), readers(qmodel, c.name, reader_of)): c
            for c in qmodel.calibration.values() if c.role != "bias"}


def readers(qmodel, name, reader_of=lambda n: n):
    """The inputs reading calibration node ``name`` directly or through the later pairs of its
    requantize chain (and Casts between float types), as ``(operator, input index)`` with the
    operator as ``reader_of(node)`` names it in the float model (None: a node the quantizer
    inserted, left out), sorted; () for a pair no operator reads."""
    tensors = set(qmodel.cast_on([o for p in qmodel.requantized_through(name) for o in qmodel.calibration[p].outputs]))
    out = set()
    for n in qmodel.counts_for(name):
        op = reader_of(n)
        if op is not None:
            at = [i for i, t in enumerate(qmodel.normal[n].inputs) if t in tensors]
            out.update((op, i) for i in at or [None])  # None: no input of its own found, any input
    return tuple(sorted(out, key=lambda r: (r[0], -1 if r[1] is None else r[1])))


def _parts(place):
    """``(tensor, position, readers)`` of a place; readers None where the place names none
    (terms kept from before readers were recorded): every pair at that position. A reader
    named by its operator alone (terms kept from before input indices were) is
    ``(operator, None)``: any input of it; one JSON held, a list, a tuple again."""
    tensor, position, *rest = place
    if not rest or rest[0] is None:
        return tensor, position, None
    return tensor, position, tuple((r, None) if isinstance(r, str) else tuple(r) for r in rest[0])


def _hit(a, b):
    """Whether readers ``a`` and ``b`` are one input (an index None: any input of the operator)."""
    return a == b or (a is not None and b is not None and a[0] == b[0] and None in (a[1], b[1]))


def _among(r, readers):
    return any(_hit(r, s) for s in readers)


def _meet(named, theirs):
    """Whether a pair read by ``theirs`` is one of the pairs read by ``named`` (None: any)."""
    return named is None or theirs is None or any(_among(r, theirs) for r in named) or (not named and not theirs)


def _index(pairs):
    """``{(tensor, chain position): [(readers, calibration node)]}`` of :func:`places`: a place
    looked up here, not through every pair, keeps the check linear in a remedy naming
    thousands of pairs of a large model."""
    out = {}
    for place, c in pairs.items():
        tensor, position, names = _parts(place)
        out.setdefault((tensor, position), []).append((names, c))
    return out


def _read_at(index, place):
    """The pairs of ``index`` (:func:`_index`) that the readers of ``place`` read: their own,
    else those last before it in the tensor's chain (a quantizer writing a shorter chain); []:
    float."""
    tensor, position, named = _parts(place)
    for p in range(position, -1, -1):
        found = [c for names, c in index.get((tensor, p), ()) if _meet(named, names)]
        if found:
            return found
    return []


def _reads(pairs):
    """``{tensor: {reader: [(bit, per channel) of each pair it reads, first to last]}}`` of
    :func:`places` (reader None: a pair no operator reads, or a place naming none)."""
    out = {}
    for place, c in sorted(pairs.items(), key=lambda item: item[0][1]):
        tensor, _, names = _parts(place)
        for r in names or (None,):
            out.setdefault(tensor, {}).setdefault(r, []).append((c.bit, c.per_channel))
    return out


def changes(before, after, expect, named=()):
    """``{"kept", "not_applied", "in_float", "collateral"}`` of a re-quantization.

    ``before`` / ``after``: :func:`places` of the quantized tensors without and with the
    remedy; ``expect``: ``{kind: [(tensor, chain position, readers)]}`` the remedy names (a
    missing kind: none; readers as :func:`readers` gives them for the pair named, left out or
    None: every pair at that position); ``named``: tensors it also touches without a check of
    its own. ``kept``: per kind, tensor -> applied at every place named (a tensor asked at 16
    bits or per channel that came out float has more precision than asked: applied, and listed
    in ``in_float``); ``collateral``: tensors of which an operator the remedy did not name (nor
    one reading the same chain of pairs before it) reads another chain of pairs, or float.
    Lists sorted, of tensors.
    """
    was, now = _reads(before), _reads(after)
    at_before, at_after = _index(before), _index(after)
    readers_before = {}  # id of a calibration node -> the readers of its places before
    for place, c in before.items():
        readers_before.setdefault(id(c), []).extend(_parts(place)[2] or (None,))
    spoken = {t: None for t in named}  # tensor -> readers named (None: all of them)

    def known(place):
        # readers the file before the remedy does not know (a quantizer naming its operators
        # otherwise) name nothing: every pair at the place
        tensor, position, names = _parts(place)
        if names is not None and not any(r is None or _among(r, names) for r in was.get(tensor, {})):
            names = None
        return tensor, position, names

    expect = {kind: [known(p) for p in expect.get(kind, ())] for kind in KINDS}
    applied = {"float": lambda d: d is None, "int16": lambda d: d is None or d.bit >= 16,
               "per-channel": lambda d: d is None or d.per_channel}
    kept = {kind: {} for kind in KINDS}
    for kind, asked in expect.items():
        for place in asked:
            tensor, _, names = place
            ok = all(applied[kind](d) for d in _read_at(at_after, place) or [None])
            kept[kind][tensor] = kept[kind].get(tensor, True) and ok
            if tensor not in spoken or spoken[tensor] is not None:
                # a remedy on a pair reaches every operator reading its chain (the head's readers)
                chain = {r for c in _read_at(at_before, (tensor, 0, names)) for r in readers_before[id(c)]}
                spoken[tensor] = None if names is None else set(spoken.get(tensor) or ()) | set(names) | chain
    collateral = sorted(t for t, by in was.items()
                        if any(by.get(r) != now.get(t, {}).get(r) for r in set(by) | set(now.get(t, {}))
                               if t not in spoken or (spoken[t] is not None and not _among(r, spoken[t]))))
    return {"kept": kept, "not_applied": sorted(t for ts in kept.values() for t, ok in ts.items() if not ok),
            "in_float": sorted({p[0] for kind in ("int16", "per-channel") for p in expect[kind]
                                if not _read_at(at_after, p)}),
            "collateral": collateral}


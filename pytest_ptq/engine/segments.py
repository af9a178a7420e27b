"""Segmented execution: configs reuse the float prefix they share with the reference.

The instrumented graph is cut, in topological order, into a chain of segments. Each
segment has a *float* form (every gate replaced by a pass-through, weights constant, so
onnxruntime prepacks and fuses as in the float model) and forms for the groups of
calibration nodes a config quantizes there, weight quantizers (:data:`WEIGHTS`) and
activation quantizers (:data:`ACTIVATIONS`): a group the config quantizes whole is inline
(:data:`ON`: the Q/DQ as stored, constant weights folded and fused as in the file), one it
quantizes in part is gated (:data:`SWITCHED`; in a 16-bit float graph, a form of that
config's own instead, see :meth:`Segments._count_groups`), one it leaves is pass-throughs. So an
activation config keeps constant, prepacked weights, and a weight config pays no activation
gate (measured on the PP-OCRv4 detector: a segment with every gate switchable ran 2x its
float form). Forms are compiled on first use, with the shapes onnxruntime fuses by.

For a config, everything before the first segment it touches equals the float reference and
is taken from the reference's boundary tensors (a :class:`Prefix`, computed as far as configs
ask and kept while they still read it); touched segments run in their form,
the others float. A config that quantizes one node therefore costs its downstream part of a
float pass, plus one gated segment. A config quantizing whole groups shares no prefix with
the reference and runs as one session of the whole graph (see :meth:`Segments.run`).
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import weakref

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import PTQError
from ..model.graph import model_without, node_refs
from ..model.qdq import HALF_TYPES
from .instrument import (LOCAL_PREFIX, anchored, bypass_nodes, constants_late, gate_of, local_clones, low_precision,
                         lowered, quantized_nodes)
from .runtime import ALWAYS_DISABLED, INLINE_DISABLED, make_session, run

WEIGHTS, ACTIVATIONS = "weights", "activations"  # the groups of gates in a segment's form
# Quantized forms kept per segment beside its float one, the least recently used dropped
# first: an analysis uses one or two (runall up to nine, one after another), and a form
# compiles in milliseconds where each kept one holds its kernels and prepacked weights
# (measured: the example suite peaked at 1.79 GB keeping every form)
MAX_FORMS = 3
# The parts :meth:`Segments.walk` cuts a sample's exposed tensors into, at least (by bytes)
WALK_PARTS = 16
ON, SWITCHED = "on", "switched"  # a group's state in a form: all quantized, inline; some, by feeds


class WalkPart(collections.namedtuple("WalkPart", "segment span tensors exposed ends")):
    """A part of :meth:`Segments.walk`: the ``segment`` whose form it runs in, its nodes'
    ``span`` ``(first, end)``, the ``tensors`` it yields, those its float session outputs
    (``exposed``: also what a later part's local clones read) and the tensors later parts
    read (``ends``)."""


def _sweep(spans, n, test=None):
    """Per position 0..n, how many of ``spans`` (``(tensor, first, last position)``) cover it;
    with ``test``, only those whose tensor passes it."""
    change = [0] * (n + 2)
    for t, first, last in spans:
        if first <= last and (test is None or test(t)):
            change[first] += 1
            change[min(last, n) + 1] -= 1
    return list(itertools.accumulate(change[:n + 1]))


class Segments:
    """A chain of segment sessions over a gated model (see :mod:`.instrument`).

    ``model``: the gated model; ``qmodel`` its calibrated model; ``gates`` its feeds;
    ``optimization``, ``providers``: as for every engine session; ``source``: the model's
    name in messages. Configs of one sample may run from several threads at once (see
    :mod:`.workers`): compiling is under a lock, and so is a sample's :class:`Prefix`, which
    :meth:`prefix` replaces. ``threads``: intra-op threads of a segment's
    sessions (None: the process's share; the whole graph's sessions always have that).
    """

    def __init__(self, model, qmodel, gates, optimization="all", providers=None, count=None, source="",
                 libraries=(), shared=None):
        self.qmodel, self.gates, self.libraries, self.shared = qmodel, gates, libraries, shared
        self._lock, self.threads = threading.Lock(), None
        self.optimization, self.providers, self.source = optimization, providers, source
        self.template = model
        graph = model.graph
        # a segment's model: the template's opsets and metadata, an empty graph (copying the
        # whole template per session took O(nodes) each: 0.6 s of an 8000-node model's build)
        self._shell = model_without(model, ("node", "input", "output", "initializer", "value_info"))
        self.inits = {i.name: i for i in graph.initializer}
        self.nodes = constants_late(graph, self.inits, gates)
        self.flag_names = gates.feed_names()
        self.model_inputs = [i.name for i in graph.input if i.name not in self.flag_names
                             and i.name not in self.inits]
        self.outputs = [o.name for o in graph.output]
        self.types = dict(qmodel.value_types)
        self.gate_of = {}  # node index -> calibration node name
        self.group_of = {c.name: WEIGHTS if c.kind == "weight" else ACTIVATIONS for c in qmodel.calibration.values()}
        for k, n in enumerate(self.nodes):
            name = gate_of(n)
            if name is not None:
                self.gate_of[k] = name
        self.refs = [node_refs(n) for n in self.nodes]
        self._plan(count)
        self._sessions = collections.OrderedDict()  # (segment, form, stacked) -> session, by last use
        self._state = None  # the Prefix of the last sample asked for
        self._plans = {}  # (tensors, local) -> walk_plan's

    # -- planning ------------------------------------------------------------------------
    def _plan(self, count):
        n = len(self.nodes)
        produced = {}
        for k, node in enumerate(self.nodes):
            for o in node.output:
                produced[o] = k
        last_use = {}
        for k, refs in enumerate(self.refs):
            for r in refs:
                last_use[r] = k
        for o in self.outputs:
            last_use[o] = n
        for i in self.model_inputs:
            produced.setdefault(i, -1)
        self.produced, self.last_use = produced, last_use
        # per position, how many tensors are live there, and how many of those cannot cross a
        # segment's or a walk's cut: untyped ones, and 16-bit floats the graph computes, which
        # onnxruntime's CPU provider mostly computes in float32 and passes on unrounded within
        # a session, fusing ops across what a cut would part (measured on Model Optimizer's
        # fp16 PP-OCR classifier through 12 segments: the float pass 1.2e-4 from the file's on
        # its softmax, one pair's config up to 3e-3 with the boundaries kept in float32, and
        # 0 whole). One sweep, where listing each candidate's live tensors cost the planning
        # O(nodes x tensors) (2.7 s of an 8000-node model's 6.7 s build)
        spans = [(t, k + 1, last_use.get(t, -1)) for t, k in produced.items() if t not in self.inits]
        self._live_count = _sweep(spans, n)
        self._uncut = _sweep(spans, n, lambda t: t not in self.model_inputs
                             and (t not in self.types or self.types[t] in HALF_TYPES))
        self._live = {}
        gates = len(self.gate_of)
        if count is None:
            count = max(1, min(16, round(math.sqrt(max(gates, 1)))))
        count = max(1, min(count, n))
        cuts = [0]
        for j in range(1, count):
            target = j * n / count
            window = range(max(cuts[-1] + 1, int(target - n / (4 * count))),
                           min(n, int(target + n / (4 * count)) + 1))
            best = None
            for p in window:
                if self._uncut[p]:
                    continue  # a tensor live here cannot cross a cut (above)
                if best is None or self._live_count[p] < best[0]:
                    best = (self._live_count[p], p)
            if best is not None:
                cuts.append(best[1])
        cuts.append(n)
        self.cuts = cuts
        self.cut_live = [self.live(c) for c in cuts]
        self.boundary_bytes = sum(self._bytes(t) for live in self.cut_live for t in live)
        self.segment_of_gate = {}
        for j in range(len(cuts) - 1):
            for k in range(cuts[j], cuts[j + 1]):
                if k in self.gate_of:
                    self.segment_of_gate[self.gate_of[k]] = j
        self._count_groups()

    def live(self, p):
        """Tensors computed before node ``p`` (or fed) that node ``p`` or later still reads."""
        if p not in self._live:
            self._live[p] = tuple(t for t, k in self.produced.items() if k < p <= self.last_use.get(t, -1)
                                  and t not in self.inits)
        return self._live[p]

    def __len__(self):
        return len(self.cuts) - 1

    # -- compilation ---------------------------------------------------------------------
    def touched(self, quantized):
        """``{segment index: form}`` of the config quantizing ``quantized`` (names): the
        segments it touches, each with the state of each group of gates there (absent: all
        bypassed; :data:`ON`: all quantized; :data:`SWITCHED`: some, chosen by feeds; a
        frozenset of names: those quantized inline, the rest bypassed, in a group of 16-bit
        float gates, see :meth:`_count_groups`)."""
        names = {}
        for name in set(quantized):
            j = self.segment_of_gate.get(name)
            if j is not None:
                names.setdefault((j, self.group_of[name]), set()).add(name)
        forms = {}
        for (j, group), some in names.items():
            if (j, group) in self._alternative:
                state = SWITCHED
            elif len(some) == self._sizes[j, group]:
                state = ON
            else:
                state = frozenset(some) if (j, group) in self._exact else SWITCHED
            forms.setdefault(j, set()).add((group, state))
        return {j: frozenset(f) for j, f in forms.items()}

    @property
    def per_config(self):
        """Whether configs quantizing part of a group get a form of their own (16-bit float
        gates, see :meth:`_count_groups`), compiled for each."""
        return bool(self._exact)

    def _count_groups(self):
        """Gates per (segment, group); the (segment, group)s with an alternative (whose choice
        is a feed, so they are never inlined); and those of 16-bit float gates, which a config
        quantizing some of them gets a form of its own for: a switched gate computes its Q/DQ
        bypassed too (:func:`.instrument.lowered`), and a Q reading a tensor keeps the
        node writing it in 16 bits where onnxruntime's CPU provider computes it in float32
        in the file (measured on Model Optimizer's fp16 PP-OCR classifier: every Clip before a
        bypassed pair rounded, one pair's config 6.4e-3 from the file on its softmax, ranks 2-5
        reordered; in a form of its own, through the one segment such a graph gets, equal to
        the file)."""
        self._sizes, self._alternative, self._exact = {}, set(), set()
        for k, name in self.gate_of.items():
            j = self.segment_of_gate.get(name)
            if j is None:
                continue
            key = (j, self.group_of[name])
            self._sizes[key] = self._sizes.get(key, 0) + 1
            if name in self.gates.alt_flags:
                self._alternative.add(key)
            if low_precision(self.nodes[k]):
                self._exact.add(key)

    def _whole(self, touched):
        """The form of the whole graph when the config ``touched`` quantizes whole groups
        (every weight, every activation, or both: the model as stored; none: float), else None."""
        groups = set()
        for form in touched.values():
            for group, state in form:
                if state != ON:
                    return None
                groups.add(group)
        if any(g in groups and (g, ON) not in touched.get(j, ()) for (j, g) in self._sizes):
            return None
        return frozenset((g, ON) for g in groups)

    def _segment_model(self, j, form, stacked=False, expose=(), local=False):
        lo, hi = (0, len(self.nodes)) if j is None else j if isinstance(j, tuple) else self.cuts[j:j + 2]
        states = dict(form)
        nodes, flags = [], []
        for k in range(lo, hi):
            node = self.nodes[k]
            state = states.get(self.group_of[self.gate_of[k]]) if k in self.gate_of else None
            if isinstance(state, frozenset):  # an exact form's: this gate quantized or not
                state = ON if self.gate_of[k] in state else None
            if k in self.gate_of and state is None:
                c = self.qmodel.calibration[self.gate_of[k]]
                nodes += [n for o in node.output
                          for n in bypass_nodes(c, o, self.types.get(o, onnx.TensorProto.FLOAT))]
            elif state == ON:
                nodes += quantized_nodes(node)
            else:
                nodes.append(node)
                if k in self.gate_of:
                    name = self.gate_of[k]
                    flags.append(self.gates.flags[name])
                    if name in self.gates.alt_flags:
                        flags.append(self.gates.alt_flags[name])
        if local:
            clones, clone_outputs = local_clones(self.qmodel, {self.nodes[k].name for k in range(lo, hi)})
            nodes += clones
            expose = (*expose, *clone_outputs)
        nodes = lowered(nodes)
        if self.shared is not None and self.shared.low_memory:
            nodes = anchored(nodes, self.inits, flags)
        inits = self.inits
        if stacked:
            nodes, shapes = self._rebatched(nodes)
            inits = {**inits, **shapes}
        produced = {o for nd in nodes for o in nd.output}
        refs = list(dict.fromkeys(r for nd in nodes for r in node_refs(nd)))
        inputs = [r for r in refs if r not in produced and r not in inits and r not in flags]
        used_inits = [inits[r] for r in refs if r in inits]
        outputs = [o for o in produced if self.last_use.get(o, -1) >= hi or o in expose]
        model = onnx.ModelProto()
        model.CopyFrom(self._shell)
        g = model.graph
        g.node.extend(nodes)
        g.initializer.extend(used_inits)
        for name in inputs:
            g.input.append(helper.make_tensor_value_info(name, self._type(name), self._shape(name, stacked)))
        for name in flags:
            g.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.BOOL, []))
        for name in outputs:
            g.output.append(helper.make_tensor_value_info(name, self._type(name), None))
        return model, inputs, flags, outputs

    def _rebatched(self, nodes):
        """``nodes`` for samples stacked on the first axis, and ``{name: initializer}`` of the
        shapes they reshape to. Exports of batch-1 models fix the batch in Reshapes to
        constant shapes: a classifier flattens to ``[1, C]``, a transformer folds the batch
        into its rows (``[1, 40, 120]`` to ``[40, 120]`` for a MatMul, and back). A stack
        multiplies the first axis of such tensors, so each constant shape leaves its first
        axis free: -1 where no other axis is (the stack's rows, folded or not), else 0 (the
        input's first axis) where it was 1. Where the first axis does not carry the stack, a
        stacked run fails or gives other values, and the engine's check rejects the stack
        (see :mod:`.batching`)."""
        out, shapes = [], {}
        for node in nodes:
            value = self.qmodel.constant(node.input[1]) if node.op_type == "Reshape" and len(node.input) > 1 else None
            first = None
            if (value is not None and value.ndim == 1 and value.size and value[0] not in (0, -1)
                    and not any(a.name == "allowzero" and a.i for a in node.attribute)):
                first = -1 if -1 not in value else 0 if value[0] == 1 else None
            if first is None:
                out.append(node)
                continue
            name = f"{node.input[1]}::stacked"
            shapes[name] = numpy_helper.from_array(np.concatenate([[first], value[1:]]).astype(value.dtype), name)
            out.append(helper.make_node("Reshape", [node.input[0], name], list(node.output), name=node.name))
        return out, shapes

    def _bytes(self, name):
        """Bytes of tensor ``name`` of one sample as inferred (unknown axes count as 1)."""
        shape = self.qmodel.shapes.get(name) or []
        try:
            size = onnx.helper.tensor_dtype_to_np_dtype(self.types.get(name, onnx.TensorProto.FLOAT)).itemsize
        except (KeyError, TypeError, ValueError):  # a type numpy has no dtype for: an estimate is enough
            size = 4
        return math.prod(d if isinstance(d, int) and d > 0 else 1 for d in shape) * size

    def _shape(self, name, stacked):
        """The shape a segment declares for its input ``name``: as inferred from the model
        (onnxruntime fuses by shapes: MatMul + bias Add into Gemm needs them all), the first
        axis free in sessions for samples run stacked on it; None where unknown."""
        shape = self.qmodel.shapes.get(name)
        if not shape:
            return None
        # a name per tensor and axis: onnxruntime may take equally named dimensions as equal
        return [d if d is not None and not (stacked and k == 0) else f"{name}::{k}" for k, d in enumerate(shape)]

    def _type(self, name):
        name = name[len(LOCAL_PREFIX):] if name.startswith(LOCAL_PREFIX) else name  # a clone's: its node's
        if name in self.types:
            return self.types[name]
        for i in self.template.graph.input:
            if i.name == name:
                return i.type.tensor_type.elem_type
        raise PTQError(f"tensor {name!r} has no known type; run onnx shape inference on the model")

    def session(self, j, form=frozenset(), stacked=False, expose=(), local=False):
        """Segment ``j``'s session (None: the whole graph's; ``(first node, end)``: those
        nodes', a part of :meth:`walk`) in ``form`` (see :meth:`touched`; empty: float), for
        samples run stacked or one at a time; ``expose``: tensors it outputs besides those
        later nodes read; ``local``: with the local clones of its normal nodes (see
        :func:`.instrument.local_clones`), their outputs exposed too."""
        key = (j, form, stacked, tuple(expose), local)
        with self._lock:
            if key in self._sessions:
                self._sessions.move_to_end(key)
                return self._sessions[key]
            if form:  # a thread still running a dropped form keeps it alive until it returns
                kept = [k for k in self._sessions if k[0] == j and k[1] and k[2:] == key[2:]]
                for old in kept[:max(0, len(kept) - MAX_FORMS + 1)]:  # the least recently used
                    del self._sessions[old]
            model, inputs, flags, outputs = self._segment_model(j, form, stacked, expose, local)
            # the whole graph and a walk's parts run one at a time: on the process's threads
            threads = self.threads if isinstance(j, int) else None
            self._sessions[key] = (make_session(model, self.optimization, self.providers, what=self.source,
                                                libraries=self.libraries, shared=self.shared, threads=threads,
                                                disabled_optimizers=INLINE_DISABLED if form else ALWAYS_DISABLED),
                                   inputs, flags, outputs)
            return self._sessions[key]

    # -- running ---------------------------------------------------------------------------
    def _run_segment(self, j, values, form, flag_values, stacked=False, expose=(), local=False):
        sess, inputs, flags, outputs = self.session(j, form, stacked, expose, local)
        if not outputs:  # a segment that only feeds what nothing reads (an If's outer pair): onnxruntime asks for one
            return
        feeds = {name: values[name] for name in inputs}
        for f in flags:
            feeds[f] = flag_values[f]
        values.update(zip(outputs, run(sess, outputs, feeds, self.source, shrink=stacked)))

    def prefix(self, key, sample):
        """The :class:`Prefix` of a sample (or group) ``key``: its float run's values at each
        segment boundary, kept for reuse until another key's is asked for (a key of None: not
        kept)."""
        with self._lock:
            if self._state is not None and self._state.key == key and key is not None:
                return self._state
            self._state = None  # the last sample's boundaries go before this one's are computed
            prefix = Prefix(self, key, sample)
            if key is not None:
                self._state = prefix
            return prefix

    def start(self, touched):
        """The boundary a config (``touched``: see :meth:`touched`) reads its float prefix
        from in :meth:`run` (``len(self)``: the model outputs), or None where it reads none."""
        if len(self) > 1 and touched and self._whole(touched) is not None:
            return None
        if not touched:
            return len(self)
        return min(touched) or None

    def forget(self, key):
        """Drop the kept boundary values if they are sample (or group) ``key``'s."""
        with self._lock:
            if self._state is not None and self._state.key == key:
                self._state = None

    def drop_stacked(self):
        """Drop the sessions compiled for stacked samples (after a trial that rejected them)."""
        self._drop(lambda k: k[2])

    def run(self, key, sample, flag_values, touched, tensors):
        """Model outputs of a sample under a config (``touched``: see :meth:`touched`): float
        prefix reused, then the rest. A config quantizing whole groups (every weight, every
        activation, or both) reuses no prefix, and runs as one session of the whole graph:
        faster than the chain (the PP-OCRv4 detector's float pass: 24 ms whole, 38 ms through
        16 segments), with the process's threads where segments run on fewer (see
        :mod:`.workers`), and in a 16-bit float graph the only way to match the file:
        onnxruntime's CPU provider computes 16-bit ops in float32 and passes unrounded values
        between them within a session, which a segment boundary would round (measured on
        Model Optimizer's fp16 PP-OCRv4 detector, every pair quantized: 0.9927 cosine to
        onnxruntime on the file through 16 segments, 1.000000 whole; single-node configs,
        which the segments serve, moved by at most 1.2e-4). So does a float run of a sample
        without a key (a feed dict run once: no prefix to keep)."""
        whole = self._whole(touched) if len(self) > 1 and (touched or key is None) else None
        if whole is not None:
            values = dict(sample)
            self._run_segment(None, values, whole, flag_values, isinstance(key, tuple))
            return {t: values[t] for t in tensors}
        if not touched:
            return {t: self.prefix(key, sample).read(len(self), keep=False)[t] for t in tensors}
        first = min(touched)
        # a config touching the first segment needs no float prefix: none is computed
        values = self._chain(dict(sample if first == 0 else self.prefix(key, sample).read(first)), first,
                             touched, flag_values, isinstance(key, tuple))
        return {t: values[t] for t in tensors}

    def fixed_form(self, quantized):
        """The whole graph's form when the config quantizing ``quantized`` (names) quantizes
        whole groups or nothing (see :meth:`run`), else None."""
        return self._whole(self.touched(quantized))

    def exact_form(self, quantized):
        """The whole graph's form quantizing exactly ``quantized`` (names) inline and bypassing
        every other gate, none left to feeds: a config of a 16-bit float graph as onnxruntime
        runs the file with only those pairs (see :meth:`_count_groups`), for :meth:`exposing`.
        Alternatives have no part in it."""
        names = set(quantized)
        return frozenset((group, frozenset(n for n in names if self.group_of.get(n) == group))
                         for group in {self.group_of[n] for n in names if n in self.group_of})

    def exposing(self, sample, form, names):
        """Tensors ``names`` of a sample run through the whole graph in ``form`` (see
        :meth:`fixed_form`), from a session that outputs them, compiled on first use and
        kept until :meth:`forget_exposing`. Gates cost a session that exposes tensors
        a subgraph each (measured: 46 MiB for the 770 gates of a ViT-S, and 96 MiB within
        a run in low-memory mode); a fixed form has none."""
        names = tuple(sorted(names))
        sess, inputs, _, outputs = self.session(None, form, expose=names)
        values = dict(zip(outputs, run(sess, outputs, {n: sample[n] for n in inputs}, self.source)))
        return {t: values[t] for t in names}

    def walkable(self, tensors):
        """Whether :meth:`walk` can give ``tensors`` as a whole-graph run does: more than one
        segment, each tensor computed in one, and no 16-bit float tensor crossing a boundary
        (a boundary rounds what a whole 16-bit graph passes unrounded, see :meth:`run`)."""
        return (len(self) > 1 and all(self.produced.get(t, -1) >= 0 for t in tensors)
                and not any(self.types.get(t) in HALF_TYPES for live in self.cut_live for t in live))

    def walk_plan(self, tensors, local=False):
        """The parts :meth:`walk` runs for ``tensors`` (a list of :class:`WalkPart`), and
        ``{tensor: the last part whose local clones read it}`` (with ``local``), worked out
        once per set of tensors."""
        key = (tuple(tensors), local)
        if key not in self._plans:
            self._plans[key] = self._plan_walk(tensors, local)
        return self._plans[key]

    def _plan_walk(self, tensors, local):
        # the segments, cut further where they compute more than 1/WALK_PARTS of the bytes
        # (early layers' activations are large: the PP-OCRv4 detector's first of 16 segments
        # computes a fifth of them), at points whose live tensors are typed and not 16-bit floats
        size = {t: self._bytes(t) for t in tensors}
        budget = sum(size.values()) / WALK_PARTS
        spans = []
        for j in range(len(self)):
            lo, held = self.cuts[j], 0
            for k in range(self.cuts[j], self.cuts[j + 1]):
                add = sum(size.get(o, 0) for o in self.nodes[k].output)
                if held and held + add > budget and not self._uncut[k]:
                    spans.append((j, (lo, k)))
                    lo, held = k, 0
                held += add
            spans.append((j, (lo, self.cuts[j + 1])))
        needed = {}  # what a part's local clones read from before it: kept (and exposed) till then
        for p, (_, (lo, hi)) in enumerate(spans if local else ()):
            clones, _ = local_clones(self.qmodel, {self.nodes[k].name for k in range(lo, hi)})
            made = {o for n in clones for o in n.output}
            for n in clones:
                for r in node_refs(n):
                    if r not in made and r not in self.inits and not lo <= self.produced.get(r, -1) < hi:
                        needed[r] = p
        parts = []
        for j, (lo, hi) in spans:
            own = tuple(t for t in tensors if lo <= self.produced[t] < hi)
            kept = tuple(t for t in needed if lo <= self.produced.get(t, -1) < hi and t not in own)
            parts.append(WalkPart(j, (lo, hi), own, own + kept, frozenset(self.live(hi))))
        return parts, needed

    def walk(self, sample, configs, tensors, local=False, last=False):
        """Tensors ``tensors`` of a sample, part by part (see :meth:`walkable`). Yields per
        part ``(float, local values, outputs)``: ``{tensor: value}`` of the tensors it
        computes, run float; with ``local``, the local clones' values of those fed by
        calibration nodes or delivered by a node's own pairs (see
        :func:`.instrument.local_clones`; else empty); and an iterator over ``configs``
        (``[(touched, flag values)]``, see :meth:`touched`) of the same tensors under each,
        computed as it is read. A part is a segment or a piece of one (see
        :meth:`walk_plan`), run in its segment's form. Holds one part's tensors at a time
        beside each chain's boundary values, where a session exposing them all holds a whole
        sample's (the PP-OCRv4 detector's curves: 280 MiB this way, 585 MiB that way, 88 MiB
        for a plain session). Its sessions stay until :meth:`forget_walk`, a part's until it
        has run with ``last`` (the walk's last sample)."""
        parts, needed = self.walk_plan(tensors, local)
        values = dict(sample)
        chains = [None] * len(configs)  # a config's boundary values, from the first segment it touches

        def outputs(part):
            for c, (touched, flag_values) in enumerate(configs):
                if chains[c] is None and touched and min(touched) == part.segment:
                    chains[c] = {t: values[t] for t in self.live(part.span[0]) if t in values}
                if chains[c] is None:  # nothing quantized before or here: the float values
                    yield {t: values[t] for t in part.tensors}
                    continue
                self._run_segment(part.span, chains[c], touched.get(part.segment, frozenset()), flag_values,
                                  expose=part.tensors)
                yield {t: chains[c][t] for t in part.tensors}
                chains[c] = {t: v for t, v in chains[c].items() if t in part.ends}

        for p, part in enumerate(parts):
            self._run_segment(part.span, values, frozenset(), None, expose=part.exposed, local=local)
            clones = {t: values.pop(LOCAL_PREFIX + t) for t in part.tensors if LOCAL_PREFIX + t in values}
            runs = outputs(part)
            yield {t: values[t] for t in part.tensors}, clones, runs
            collections.deque(runs, maxlen=0)  # configs left unread still advance their chains
            # a clone's value read at a later part's tensor (a node's, through its own pairs to
            # the model output they deliver, see local_clones) waits for that part's reference
            values = {t: v for t, v in values.items() if t in part.ends or needed.get(t, -1) > p
                      or t.startswith(LOCAL_PREFIX) and self.produced.get(t[len(LOCAL_PREFIX):], -1) >= part.span[1]}
            if last:  # no sample runs this part again
                self._drop(lambda k, span=part.span: k[0] == span)

    def forget_walk(self):
        """Drop the sessions :meth:`walk` compiled."""
        self._drop(lambda k: isinstance(k[0], tuple))

    def forget_exposing(self, names):
        """Drop the sessions :meth:`exposing` compiled for ``names``."""
        names = tuple(sorted(names))
        self._drop(lambda k: k[3] == names)

    def forget_whole(self, form):
        """Drop the whole graph's sessions in ``form`` (see :meth:`fixed_form`)."""
        self._drop(lambda k: k[0] is None and k[1] == form)

    def _drop(self, which):
        """Drop the sessions whose key ``(segment, form, stacked, expose, local)`` ``which`` picks."""
        with self._lock:
            for key in [k for k in self._sessions if which(k)]:
                del self._sessions[key]

    def float_outputs(self, key, sample, start=0):
        """Model outputs of a float run of a sample (or stack), nothing kept for reuse (a
        trial's stacked runs: their boundaries would double the reference's memory).
        ``start``: run segments ``start`` onwards from the sample's kept boundary values
        (computed first if not kept): the least work of a config touching segment ``start``."""
        values = dict(sample if start == 0 else self.prefix(key, sample).read(start))
        return self._chain(values, start, {}, None, isinstance(key, tuple))

    def _chain(self, values, first, touched, flag_values, stacked):
        """Segments ``first`` onwards on ``values`` (a boundary's), each in its form."""
        for j in range(first, len(self)):
            self._run_segment(j, values, touched.get(j, frozenset()), flag_values, stacked)
            # what later segments no longer read goes now, not with the config (peak memory)
            values = {t: values[t] for t in self.cut_live[j + 1] if t in values}
        return values


class Prefix:
    """A sample's float run through the segments, computed as far as a config asks (the values
    at boundary ``j``: what later segments read, in :meth:`read`) and forgotten below the
    boundaries configs still :meth:`expect` to read. So a sample's configs, run in graph order,
    hold one or two boundaries' values rather than every boundary's (the PicoDet layout
    detector's: 53 MiB at 800x608, 7.4 MiB at most at one boundary; configs in another order
    hold the boundaries they still read). Thread-safe: configs in flight read it from several
    threads."""

    def __init__(self, segments, key, sample):
        # not a reference: the segments keep their last prefix, and a cycle between them left every
        # session and mapped weight of a dropped engine to the cyclic collector, not to `del`
        self._seg = weakref.proxy(segments)
        self.key, self._sample, self._stacked = key, sample, isinstance(key, tuple)
        self._lock = threading.Lock()
        self._kept = {}  # boundary -> {tensor: value}
        self._values, self._next = dict(sample), 0  # the run so far: values at boundary _next
        self._expected = collections.Counter()

    def expect(self, starts):
        """Boundaries that configs about to run will each :meth:`read` once (None: none),
        besides those still expected: from now on only those are kept (and the model outputs),
        each until its last expected read."""
        with self._lock:
            self._expected.update(j for j in starts if j is not None)
            for k in [k for k in self._kept if k not in self._expected and k != len(self._seg)]:
                del self._kept[k]

    @property
    def held(self):
        """The boundaries whose values are held now, in order."""
        with self._lock:
            return sorted(self._kept)

    def read(self, j, keep=True):
        """The float values at boundary ``j`` (``len(segments)``: the model outputs). The
        boundaries computed on the way are kept where :meth:`expect` asked for them, or, with
        ``keep`` and none asked for, all of them (a float run of the outputs keeps none: the
        configs after it say which they read)."""
        seg = self._seg
        with self._lock:
            if j not in self._kept and j < self._next:  # dropped earlier: the run starts over
                self._kept = {k: v for k, v in self._kept.items() if k == len(seg)}
                self._values, self._next = dict(self._sample), 0
            while self._next <= j:
                k = self._next
                if k < len(seg):
                    if k == j or (self._expected[k] if self._expected else keep):
                        self._kept[k] = {t: self._values[t] for t in seg.cut_live[k] if t in self._values}
                    seg._run_segment(k, self._values, frozenset(), None, self._stacked)
                    self._values = {t: v for t, v in self._values.items() if t in seg.cut_live[k + 1]
                                    or t in seg.outputs}
                else:
                    self._kept[k] = {t: self._values[t] for t in seg.outputs}
                self._next = k + 1
            values = self._kept[j]
            if self._expected[j] > 0:  # its last expected read: it goes (this reader has it)
                self._expected[j] -= 1
                if not self._expected[j]:
                    del self._expected[j]
                    if j != len(seg):
                        del self._kept[j]
            return values

"""The float model a QDQ model came from, aligned with it by structure and values.

Quantizers rename tensors (``W_quantized``, ``*_QuantizeInput``, ``*_q``), store weights
already quantized, round float weights onto the grid, delete Relu/Clip after folding them
into a pair's range, and insert Casts. None of that can be undone by names. Here the QDQ
graph with every Q/DQ bypassed is walked in topological order beside the float graph:

* graph inputs match by name (else by position);
* a normal node matches the unmatched float node of the same op type that reads the
  tensors its own inputs match, position by position, a constant where it reads a weight;
  a float Relu/Clip between the two is one the quantizer deleted and folded into the pair
  there (re-applied when the pair is bypassed);
* a Cast or Identity the quantizer inserted passes its input's match through;
* the float constant a weight matches is its float weight when the dequantized weight lies
  within rounding (half a step on an integer grid) of it, or outside the range (clipped),
  for nearly every element; weights left unmatched are tried against every float constant
  of their shape by value alone.

Quantizers that run onnxruntime's graph optimizations first (Intel Neural Compressor,
quantize_static after ``quant_pre_process``) also change the float graph in ways that
keep its values:

* a Mul/Add/Sub/Div by per-channel constants or a BatchNormalization after a Conv, Gemm or
  MatMul folded into its weight and bias (a MatMul and its Add becoming a Gemm): the float
  node matches with the chain folded into its constants the same way, when the QDQ
  weights round to those;
* Reshapes inserted around such a Gemm pass their input's match through;
* identical nodes merged into one (common subexpressions), Identity nodes removed, and
  shape arithmetic folded into constants;
* an op ONNX defines as a function of others inlined as that definition (AMD Quark's
  HardSwish as HardSigmoid and Mul): the float op is compared as its definition;
* a Split made Slices: each Slice matches the Split output it takes;
* a bias corrected by the quantizer: the weight decides the match, and the bias stays as
  quantized.

A float constant an operator reads without a pair, where the float model's differs and it
is that weight rounded onto an integer grid, is a weight whose DequantizeLinear onnxruntime's
constant folding computed into the file (:attr:`Alignment.quantized_constants`): nothing in
the file bypasses it, so the model puts its codes back behind a DequantizeLinear (see
:mod:`.folded`) and is parsed and aligned again.

Folds are compared with a tolerance for the quantizer's float32 arithmetic in its own
order; where two float weights both fit, the closer one wins. What stays unmatched on either
side is a rewrite by the quantizer (a Sigmoid replaced by HardSigmoid and Mul);
:attr:`Alignment.rewrites` lists it, and the match picks up after it at the first node whose
weights round to a float node's.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.inliner import inline_selected_functions

from ..errors import PTQError
from ..tables import listed
from . import grids
from .graph import (LAYOUT_OPS, attribute, has_subgraphs, hand_back, laid_out, load_weightless, mapping, name_nodes,
                    node_refs, sort_topologically)

# Share of a weight's elements that must lie within rounding of the float candidate.
FIT_SHARE = 0.99
# Ops a quantizer deletes after folding them into the range of the pair that follows.
FOLDABLE = ("Relu", "Clip")
# Ops a quantizer inserts (dtype changes, pass-throughs) that stand for no float op.
TRANSPARENT = ("Cast", "Identity")
# Shape-only ops a quantizer's fusion may insert (a 3-D MatMul and Add become Reshape, Gemm,
# Reshape): where the float model has none to match, they pass their input's match through.
RESHAPING = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
# QDQ ops a float op may have become: a MatMul with the Add after it, a Gemm with a bias.
BECOMES = {"Gemm": ("Gemm", "MatMul")}
# Ops whose weights a quantizer's preprocessing may fold the per-channel ops after them into,
# and those ops (besides BatchNormalization).
FUSING = ("Conv", "Gemm", "MatMul")
AFFINE = ("Mul", "Add", "Sub", "Div")
FUSED = "::fused::"  # marks the name of a float weight with the ops after its node folded in
FLOAT_PREFIX = "ptq_float::"  # of the initializers that hold recovered float weights
# elements of two weights compared at once where only whether they differ matters: the
# temporaries of a part stay in cache (a part of 1 << 18 took twice as long as the whole)
_COMPARED = 1 << 16
# Ops whose every run differs: two of them on the same input are not one computation.
_RANDOM = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
           "Dropout")


@dataclasses.dataclass
class Alignment:
    """What the alignment found: node matches, recovered weights, folds and rewrites."""

    nodes: dict  # QDQ normal node -> float node (of the same op, computing the same tensors)
    weights: dict  # calibration node -> float initializer name (see float_source)
    folded: dict  # calibration node -> (op, lo, hi)
    rewrites: list  # sentences, e.g. "float Sigmoid 'sig' has no counterpart"
    unmatched_weights: list  # weight calibration nodes whose float weight was not found
    unmatched_float: list = dataclasses.field(default_factory=list)  # float node names
    unmatched_qdq: list = dataclasses.field(default_factory=list)  # QDQ normal node names
    weights_tried: int = 0  # weights whose matched float constant was compared by value
    weights_fitted: int = 0  # ... and lay within rounding of it
    # QDQ normal node -> the float node the quantizer's graph optimization fused the ops after
    # into (or turned into another op): the producer knew it by the QDQ graph's name, and its
    # outputs are the last fused op's
    fused: dict = dataclasses.field(default_factory=dict)
    # QDQ tensor -> the float tensor it computes, where the quantizer renamed it ('*_QuantizeInput')
    tensors: dict = dataclasses.field(default_factory=dict)
    # calibration node -> the output of the float Relu/Clip folded into it: the tensor the
    # quantizer quantized (onnxruntime gives its name to the fold's input as it deletes it)
    fold_outputs: dict = dataclasses.field(default_factory=dict)
    # QDQ tensor -> the float tensor whose very values it computes (renamed or not): the
    # inputs, the outputs of matched nodes and of an Identity passed through, not those of a
    # Cast or reshape passed through
    computes: dict = dataclasses.field(default_factory=dict)
    # QDQ tensor -> the float model's weight it is, quantized: a float constant an operator
    # reads without a pair whose values lie on an integer grid, rounded from that weight
    # (onnxruntime's constant folding computed its DequantizeLinear into the file, see
    # folded_weights); every configuration runs it quantized
    quantized_constants: dict = dataclasses.field(default_factory=dict)
    # ... and the axis of its grid's steps (None: one step for the tensor), as found there
    quantized_axes: dict = dataclasses.field(default_factory=dict)

    @property
    def same_weights(self):
        """False when most weights that matched by position differ from the float model's:
        the float model is not the one this model was quantized from."""
        return self.weights_tried == 0 or self.weights_fitted >= 0.5 * self.weights_tried


class _Float:
    """The float graph, sorted and named like the QDQ one, with its constants."""

    def __init__(self, model, arrays):
        graph = model.graph
        self.arrays = arrays  # its large constants, mapped from the file where they are stored
        name_nodes(graph)
        sort_topologically(graph, "the float model")
        self.inits = {i.name: i for i in graph.initializer}
        self.constant_nodes = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
        self.nodes = [n for n in graph.node if n.op_type != "Constant"]
        self.inputs = [i.name for i in graph.input if i.name not in self.inits]
        self.outputs = {o.name for o in graph.output}
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.consumers = defaultdict(list)
        self.readers = defaultdict(list)  # consumers, and nodes whose subgraphs read the tensor
        for n in self.nodes:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
            for r in node_refs(n):
                self.readers[r].append(n)
        self._values = {}  # constants read, and those derived by folding a chain (see _fused)
        self._slack = {}  # derived constant -> how far float32 rounding of its fold may move it
        self._static = {}  # tensor -> whether it is computed from shapes only
        # (weight calibration node, constant) -> fit_of's answer (see _fit_to): the node
        # matching asks it of a weight's candidates, the weight assignment again of the match
        self.fitted = {}
        # a node computing what an earlier one computes from the same inputs (two Shapes of
        # one tensor, say) is one the quantizer's preprocessing may have merged (onnxruntime's
        # common subexpression elimination): its outputs stand for the earlier one's
        self.same, self.aliases, first = {}, defaultdict(list), {}
        for n in self.nodes:
            if n.op_type == "Identity" and n.input[0] and n.output[0] not in self.outputs:
                # a pass-through the quantizer's graph optimization removes: its output
                # stands for its input
                self._alias(n.output[0], n.input[0])
                continue
            if n.op_type in _RANDOM or has_subgraphs(n):
                continue
            key = (n.domain, n.op_type, tuple(self.canonical(i) for i in n.input),
                   tuple(a.SerializeToString() for a in n.attribute))
            if key in first:
                for o, o0 in zip(n.output, first[key].output):
                    if o:
                        self._alias(o, o0)
            else:
                first[key] = n

    def _alias(self, tensor, of):
        """Record that ``tensor`` holds what ``of`` holds."""
        self.same[tensor] = self.canonical(of)
        self.aliases[self.same[tensor]].append(tensor)

    def shape_derived(self, tensor):
        """Whether ``tensor`` depends on the graph inputs only through their shapes (Shape,
        Size), so that a quantizer's constant folding may store it as a constant."""
        stack = [tensor]  # depth-first without recursion: a chain may be as deep as the graph
        while stack:
            t = stack[-1]
            if t in self._static:
                stack.pop()
                continue
            node = self.producer.get(t)
            if self.constant(t) is not None or (node is not None and node.op_type in ("Shape", "Size")):
                self._static[t] = True
            elif node is None or node.op_type in _RANDOM or has_subgraphs(node):
                self._static[t] = False
            else:
                pending = [i for i in node.input if i and i not in self._static]
                if pending:
                    stack.extend(pending)
                    continue
                self._static[t] = all(self._static[i] for i in node.input if i)
            stack.pop()
        return self._static[tensor]

    def derive(self, name, value, slack=0.0):
        """Make ``value`` the constant ``name`` (a weight with a chain folded into it), which
        the quantizer's own fold may have computed up to ``slack`` (per element) away."""
        self._values[name], self._slack[name] = value, slack
        return name

    def slack(self, name):
        """How far a quantizer's float32 fold may have put constant ``name`` from its value here."""
        return self._slack.get(name, 0.0)

    def canonical(self, tensor):
        """The tensor ``tensor`` is a common subexpression of (itself if none)."""
        return self.same.get(tensor, tensor)

    def equivalents(self, tensor):
        """``tensor`` and every tensor computed the same way."""
        root = self.canonical(tensor)
        return [root, *self.aliases.get(root, ())]

    def constant(self, name):
        if name in self._values:
            return self._values[name]
        value = None
        if name in self.arrays:
            value = self.arrays[name]
        elif name in self.inits:
            value = numpy_helper.to_array(self.inits[name])
        elif name in self.constant_nodes:
            for a in self.constant_nodes[name].attribute:
                if a.name == "value":
                    value = numpy_helper.to_array(a.t)
        elif name in self.producer and self.producer[name].op_type in TRANSPARENT:
            node = self.producer[name]
            value = self.constant(node.input[0])
            if value is not None and node.op_type == "Cast":
                to = next(a.i for a in node.attribute if a.name == "to")
                value = value.astype(onnx.helper.tensor_dtype_to_np_dtype(to))
        elif name in self.producer and self.producer[name].op_type in LAYOUT_OPS:
            # a bias reshaped from a constant (Paddle's exports: Conv, then Add of a Reshape):
            # a quantizer quantizes it as the weight the QDQ model computes the same way
            node = self.producer[name]
            src = self.constant(node.input[0])
            value = None if src is None else laid_out(node, np.asarray(src), self.constant)
        self._values[name] = value
        return value

    def fold_bounds(self, node):
        """``(op, lo, hi)`` of a Relu/Clip, or None when a Clip bound is computed at run time."""
        if node.op_type == "Relu":
            return ("Relu", 0.0, math.inf)
        attrs = {a.name: a.f for a in node.attribute}  # opset < 11 keeps bounds as attributes
        bounds = [attrs.get("min", -math.inf), attrs.get("max", math.inf)]
        for k, name in enumerate(node.input[1:3]):
            if name:
                value = self.constant(name)
                if value is None:
                    return None
                bounds[k] = float(np.asarray(value).reshape(-1)[0])
        return ("Clip", float(bounds[0]), float(bounds[1]))


def refuse_quantized(fmodel, fpath=None):
    """Refuse a "float model" (a ModelProto, read from ``fpath``) that quantizes: its outputs
    would be a quantized reference, every figure 1.0 or near."""
    quantizers = sum(n.op_type == "QuantizeLinear" for n in fmodel.graph.node)
    if quantizers:
        raise PTQError(f"the float model {str(fpath) if fpath else '(given as a ModelProto)'!r} holds {quantizers} "
                       "QuantizeLinear node(s), so it is a quantized model; pass the float model the calibrated one "
                       "was quantized from")


def align(qm, float_model):
    """Align ``qm`` (a :class:`~pytest_ptq.model.QuantModel`) with ``float_model``; sets the
    float weights (``qm.float_weights``, ``c.float_weight``) and folds (``c.folded``) it finds
    and returns the :class:`Alignment` (also kept as ``qm.alignment``)."""
    # its large weights stay in their file (mapped), as the calibrated model's do: a float
    # model read whole held a copy of every weight beside the calibrated one's
    fmodel, fpath, arrays = load_weightless(float_model, what="float model")
    refuse_quantized(fmodel, fpath)
    f = _Float(_expanded(fmodel, {qm.node(n).op_type for n in qm.normal}), arrays)
    by_output = qm.by_output()
    tmatch = {}  # QDQ tensor -> float tensor
    q_inputs, f_inputs = qm.input_names, f.inputs
    for k, name in enumerate(q_inputs):
        if name in f_inputs:
            tmatch[name] = name
        elif len(q_inputs) == len(f_inputs):
            tmatch[name] = f_inputs[k]
    nodes, fused, weights_at, folded, used, values, passed = {}, {}, {}, {}, set(), {}, set()
    constants_at = {}  # (QDQ node, input index) -> the float constant its matched node reads there
    fold_outputs, fold_readers, reshaped = {}, {}, set()
    for n in qm.normal.values():
        proto = qm.node(n.name)
        expect = [_expectation(qm, by_output, tmatch, i, values) for i in proto.input]
        best = _best_candidate(f, proto, expect, used)
        if proto.op_type in FUSING and (best is None or not best.weights_fit):
            best = _fused_candidate(f, proto, expect, used) or best
        if best is None and not any(e[0] == "tensor" for e in expect):
            best = _by_weight(f, proto, expect, used)
        if best is None and proto.op_type == "Slice":
            part = _split_part(f, expect, len(qm.shapes.get(proto.input[0]) or ()) or None)
            if part is not None:  # one output of a float Split, which the quantizer made Slices
                split, k = part
                used.add(split.name)
                fused[n.name] = split.name
                tmatch[proto.output[0]] = split.output[k]
                continue
        if best is None:
            tensors = [e for e in expect if e[0] == "tensor"]
            if proto.op_type in TRANSPARENT + RESHAPING and len(tensors) == 1:
                tmatch[proto.output[0]] = tensors[0][1]
                passed.add(n.name)
                if proto.op_type != "Identity":  # a Cast or reshape holds the values otherwise
                    reshaped.add(proto.output[0])
            continue
        fnode = best.node
        used.update([fnode.name, *(c.name for c in best.chain)])
        (fused if best.chain or fnode.op_type != proto.op_type else nodes)[n.name] = fnode.name
        outputs = [best.chain[-1].output[0]] if best.chain else fnode.output
        for qo, fo in zip(proto.output, outputs):
            if qo and fo:
                tmatch[qo] = fo
        for cname, (fold, output) in best.folds.items():
            folded[cname], fold_outputs[cname] = fold, output
            fold_readers.setdefault(cname, set()).add(n.name)
        for k, e in enumerate(expect):
            if e[0] == "weight" and k < len(best.inputs) and best.inputs[k]:
                weights_at.setdefault(e[1].name, []).append(best.inputs[k])
            elif e[0] == "const" and k < len(best.inputs) and best.inputs[k]:
                constants_at[n.name, k] = best.inputs[k]
    for c in qm.calibration.values():
        if c.kind == "activation" and c.name not in folded and c.input in tmatch:
            fold = _unread_fold(f, tmatch[c.input], used)
            if fold is not None:
                used.add(fold.name)
                folded[c.name], fold_outputs[c.name] = f.fold_bounds(fold), fold.output[0]
    weights, unmatched, tried, fitted = _assign_weights(qm, f, weights_at, values)
    for cname, fold in folded.items():
        qm.calibration[cname].folded = fold
    for cname, readers in fold_readers.items():
        # a reader matched without the fold reads the tensor before it (onnxruntime's QOperator
        # quantizer deletes a Relu for its one reader though another reads the same tensor)
        c = qm.calibration[cname]
        c.unfolded = [r for r in c.consumers if r not in readers and (r in nodes or r in fused)]
    rewrites, unmatched_float, unmatched_qdq = _rewrites(qm, f, {**nodes, **fused}, used, passed)
    rewrites += _stale_subgraph_reads(qm, folded)
    quantized = folded_weights(qm, f, constants_at)
    result = Alignment(nodes=nodes, weights=weights, folded=folded, rewrites=rewrites,
                       unmatched_weights=unmatched, unmatched_float=unmatched_float, unmatched_qdq=unmatched_qdq,
                       weights_tried=tried, weights_fitted=fitted, fused=fused,
                       tensors={q: t for q, t in tmatch.items() if q != t}, fold_outputs=fold_outputs,
                       computes={q: t for q, t in tmatch.items() if q not in reshaped},
                       quantized_constants={t: fname for t, (fname, _) in quantized.items()},
                       quantized_axes={t: axis for t, (_, axis) in quantized.items()})
    qm.alignment = result
    return result


def folded_weights(qm, f, constants_at):
    """``{QDQ tensor: (float weight, axis)}`` for the weights whose quantization is folded into the
    file: a float constant an operator reads without a pair (see
    :meth:`~pytest_ptq.model.QuantModel.unpaired_weights`) that differs from the float
    constant its matched node reads, lies on an integer grid (:func:`.grids.integer_grid`),
    and is that float constant rounded onto it (``axis``: of its grid's steps, None for one).
    ``constants_at``: ``(QDQ node, input index) -> float constant`` of the matched nodes."""
    out = {}
    for node, k, tensor in qm.unpaired_weights():
        fname = constants_at.get((node, k))
        if fname is None or tensor in out:
            continue
        # read once and not kept: every weight read without a pair is looked at, on every load
        stored, given = qm.transient_constant(tensor), f.constant(fname)
        if given is None or np.shape(given) != np.shape(stored) or np.asarray(given).dtype.kind != "f":
            continue
        mine, fw = np.asarray(stored, np.float32), np.asarray(given, np.float32)  # no copy of a float32 weight
        if not _all_close(mine, fw, rtol=1e-6):  # else the float model's own weight: nothing quantized
            grid = grids.integer_grid(mine)
            if grid is not None and _rounded_from(mine, fw, *grid):
                out[tensor] = float_source(fname), grid[0]
        _hand_back(stored, given)
    return out


def _all_close(a, b, rtol):
    """``np.allclose(a, b, rtol=rtol, atol=0)`` part by part (see :func:`_parts`), stopping at
    the first part that differs: a folded weight differs at once, and comparing a large
    weight whole made float temporaries several times its size on every load."""
    return all(np.allclose(a[part], b[part], rtol=rtol, atol=0) for part in _parts(a.shape, _COMPARED))


def _parts(shape, elements, lead=()):
    """Index tuples that cut an array of ``shape`` into consecutive parts of at most
    ``elements`` elements (of one row at least, where a row holds fewer), each a view
    whatever the array's strides."""
    if not shape:
        yield lead
        return
    per_row = math.prod(shape[1:])
    if per_row <= elements:
        step = max(1, elements // max(per_row, 1))
        for a in range(0, shape[0], step):
            yield lead + (slice(a, a + step),)
        return
    for k in range(shape[0]):
        yield from _parts(shape[1:], elements, lead + (k,))


def _rounded_from(mine, fw, axis, picked, steps):
    """Whether ``mine`` is ``fw`` rounded onto the grid of ``steps`` (one per tensor, or one
    per index ``picked`` of ``axis``): within half a step of it, or clipped (beyond it), for
    FIT_SHARE of the elements of those slices."""
    good = total = 0
    for k, step in zip(picked, steps):
        ours = mine if axis is None else np.take(mine, k, axis=axis)
        theirs = fw if axis is None else np.take(fw, k, axis=axis)
        top = np.abs(ours).max()
        err = np.abs(ours - theirs)
        good += int(np.count_nonzero((err <= step / 2 * 1.001 + 1e-7 * np.abs(theirs)) | (np.abs(theirs) > top)))
        total += ours.size
    return total > 0 and good >= FIT_SHARE * total


def counterpart(qm, other, tensor):
    """The tensor of ``other`` that computes what ``tensor`` of ``qm`` computes, both
    :class:`~pytest_ptq.model.QuantModel` aligned with the same float model, or None where
    the alignments do not say: a name may hold another value in each (onnxruntime gives a
    folded Relu's name to the Conv before it; a quantizer that keeps the Relu does not).
    A tensor behind Casts between float types or reshapes that keep its values in their
    places (:func:`_held_from`) is what the tensor before them is."""
    theirs = getattr(other, "alignment", None)
    value = None if theirs is None else float_counterpart(qm, tensor)
    if value is None:
        return None
    found = [t for t, f in theirs.computes.items() if f == value]
    if len(found) == 1:
        return found[0]
    return value if value in found else None


def float_counterpart(qm, tensor):
    """The tensor of the float model ``qm`` is aligned with whose values ``tensor`` of ``qm``
    holds (through the Casts and reshapes :func:`_held_from` follows), or None where the
    alignment does not say (or ``qm`` has none)."""
    mine = getattr(qm, "alignment", None)
    source = None if mine is None else _held_from(qm, tensor)
    return None if source is None else mine.computes[source]


def _held_from(qm, tensor):
    """The tensor of ``qm`` its alignment maps (:attr:`Alignment.computes`) whose values
    ``tensor`` holds, each in its place: ``tensor`` itself, or the one before the Casts
    between float types (the precision aside, which the alignment never tells apart: a
    float16 node computes the float32 one's values) and reshapes (which keep row-major
    order) that lead to it, where the reshapes give its shape back; else None (a Transpose
    moves values, a reshape alone lays them out in another shape, a pair quantizes them)."""
    computes = qm.alignment.computes
    t, reshaped = tensor, False
    while t not in computes:
        node = qm.producer.get(t)
        if node is None or not node.input or not node.input[0]:
            return None
        if node.op_type in RESHAPING:
            reshaped = True
        elif node.op_type not in TRANSPARENT or not (qm.is_float_tensor(node.input[0]) and qm.is_float_tensor(t)):
            return None
        t = node.input[0]
    if reshaped:
        # every dim known but at most one, which the element count then fixes
        before, after = qm.shapes.get(t), qm.shapes.get(tensor)
        if before is None or before != after or before.count(None) > 1:
            return None
    return t


def _expanded(fmodel, ops):
    """``fmodel`` with the ops that ONNX defines as a function of other ops (HardSwish as
    HardSigmoid and Mul, Gelu...) replaced by that definition where the QDQ graph has none of
    them but every op of the definition: a quantizer may inline them to quantize between
    their parts (AMD Quark does HardSwish). ``ops``: the QDQ graph's op types. A Relu or
    Clip the QDQ graph lacks is one the quantizer folded, and stays."""
    ids = set()
    opsets = {o.domain: o.version for o in fmodel.opset_import}
    for n in fmodel.graph.node:
        key = (n.domain, n.op_type)
        if key in ids or n.op_type in ops or n.op_type in FOLDABLE or n.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(n.op_type, opsets.get(n.domain, 1), n.domain)
        except onnx.defs.SchemaError:
            continue
        if schema.has_function and {b.op_type for b in schema.function_body.node} <= ops:
            ids.add(key)
    if not ids:
        return fmodel
    try:
        return inline_selected_functions(fmodel, sorted(ids), inline_schema_functions=True)
    except Exception:  # noqa: BLE001 - onnx's inliner could not (types it needs unknown): compare as stored
        return fmodel


def _unread_fold(f, tensor, used):
    """The float Relu/Clip a quantizer folded into the pair of float ``tensor`` where no QDQ
    node reads the pair to show it (the node after it matches with the fold, see
    :func:`_fits_inputs`): the fold's output is a model output, or read only inside a
    subgraph. It is the one node that reads ``tensor``, and nothing matched it."""
    readers = f.readers.get(tensor, ())
    if len(readers) != 1 or readers[0].op_type not in FOLDABLE or readers[0].name in used:
        return None
    return readers[0] if f.fold_bounds(readers[0]) is not None else None


def _stale_subgraph_reads(qm, folded):
    """Sentences for folds whose output a subgraph read: quantize_static gives the fold's
    output name to its input when it deletes it, and rewires the main graph only, so the
    subgraphs that read the output now read the input."""
    with_subgraphs = [n for n in qm.model.graph.node if has_subgraphs(n)]
    out = []
    for cname, (op, _, _) in folded.items():
        tensor = qm.calibration[cname].input
        readers = [n.name for n in with_subgraphs if tensor not in n.input and tensor in node_refs(n)]
        if readers:
            out.append(f"the {op} folded into {cname!r} fed the subgraphs of {listed(readers)}, which still read "
                       f"its input {tensor!r} (the quantizer rewired the main graph only); quantize with "
                       "extra_options={'QDQKeepRemovableActivations': True}")
    return out


def _latest(cache, key, fn, *args):
    """``fn(*args)``, kept for the next call with ``key`` only: a node's candidates ask for its
    weight's value again and again, but keeping every dequantized weight held a float copy
    of all of them while aligning."""
    if key not in cache:
        cache.clear()
        cache[key] = fn(*args)
    return cache[key]


def _expectation(qm, by_output, tmatch, name, values):
    """What input ``name`` of a QDQ node should be on the float side; ``values`` caches the
    weight's value, compared with every candidate."""
    if not name:
        return ("none",)
    c = by_output.get(name)
    if c is not None and c.kind == "weight":
        return ("weight", c, tuple(qm.shapes.get(c.input, ())), lambda: _latest(values, c.name, _model_value, qm, c))
    # a later pair of a requantize chain reads the earlier pair's DequantizeLinear output, which
    # no float model holds: the chain quantizes the tensor its first pair reads
    t = qm.chain_head(c.name).input if c is not None else name
    if t in tmatch:
        return ("tensor", tmatch[t], c)
    if qm.is_constant(t):
        return ("const", qm.constant(t))
    return ("unknown",)


@dataclasses.dataclass
class _Match:
    """A float node a QDQ node matches: the folds it implies, whether every weight it reads
    lies within rounding of the float one, and, where the quantizer's preprocessing folded
    the float Mul/Add/BatchNormalization after it into its weights (onnxruntime's
    ConvMulFusion, ConvAddFusion, ConvBNFusion), that chain and the folded constants' names
    in place of the node's inputs."""

    node: object
    folds: dict  # calibration node -> ((op, lo, hi), the folded Relu/Clip's float output)
    weights_fit: bool
    score: int = 0
    distance: float = 0.0  # of its weights from the float ones (see fit_of): the lower the closer
    chain: tuple = ()
    inputs: tuple = ()


def _candidates(f, expect, used, op):
    """Unmatched float nodes of type ``op`` reading what ``expect``'s tensors match (or a
    tensor computed the same way), directly or through a Relu/Clip the quantizer may have
    folded."""
    pool = []
    for e in expect:
        if e[0] != "tensor":
            continue
        for tensor in f.equivalents(e[1]):
            for user in f.consumers.get(tensor, ()):
                pool.append(user)
                if user.op_type in FOLDABLE:
                    pool += f.consumers.get(user.output[0], ())
    unique = {c.name: c for c in pool}
    return [c for c in unique.values() if c.name not in used and c.op_type in BECOMES.get(op, (op,))]


def _better(fit, best):
    """Whether match ``fit`` beats ``best``: a higher score, else weights closer to its own."""
    return fit is not None and (best is None or (fit.score, -fit.distance) > (best.score, -best.distance))


def _best_candidate(f, proto, expect, used):
    """The float node ``proto`` matches (a :class:`_Match`), or None."""
    best = None
    for cand in _candidates(f, expect, used, proto.op_type):
        fit = _fits_inputs(f, cand, expect)
        if _better(fit, best):
            best = fit
    return best


def _split_part(f, expect, rank):
    """``(float Split, output index)`` when a Slice whose inputs are ``expect`` takes exactly
    that output of a float Split of the same tensor (AMD Quark turns Splits into Slices), or
    None. ``rank``: the sliced tensor's, where known (to compare negative axes)."""
    if expect[0][0] != "tensor" or any(e[0] not in ("const", "none") for e in expect[1:]):
        return None
    values = [np.asarray(e[1]).reshape(-1).tolist() if e[0] == "const" else None for e in expect[1:]]
    starts, ends, axes, steps = (values + [None] * 4)[:4]
    if len(starts) != 1 or len(ends) != 1 or (steps is not None and steps != [1]):
        return None
    for split in (u for t in f.equivalents(expect[0][1]) for u in f.consumers.get(t, ()) if u.op_type == "Split"):
        attrs = {a.name: a for a in split.attribute}
        axis = attrs["axis"].i if "axis" in attrs else 0
        axis_of = axes[0] if axes else 0
        if rank is not None:
            axis, axis_of = axis % rank, axis_of % rank
        sizes = (f.constant(split.input[1]) if len(split.input) > 1 and split.input[1]
                 else list(attrs["split"].ints) if "split" in attrs else None)
        if axis != axis_of or sizes is None:
            continue  # sizes left to the input's shape: not worked out here
        offsets = np.concatenate([[0], np.cumsum(np.asarray(sizes, np.int64).reshape(-1))]).tolist()
        for k in range(len(split.output)):
            last = k == len(split.output) - 1
            if starts[0] == offsets[k] and (ends[0] == offsets[k + 1] or last and ends[0] >= offsets[k + 1]):
                return split, k
    return None


def _by_weight(f, proto, expect, used):
    """Where nothing ``proto`` reads matched (it follows a rewrite by the quantizer), the
    unmatched float node of its op whose every weight the QDQ weights round to, folded chain
    and all: the match picks up again after the rewrite. None where ``proto`` reads no weight
    of several values or none fits."""
    if not any(e[0] == "weight" and math.prod(e[2]) > 1 for e in expect):
        return None  # a scalar (an Add's 3) fits any float constant of its shape
    pool = [c for c in f.nodes if c.name not in used and c.op_type in BECOMES.get(proto.op_type, (proto.op_type,))]
    best = None
    for cand in pool:
        fit = _fits_inputs(f, cand, expect)
        if fit is not None and fit.weights_fit and _better(fit, best):
            best = fit
    if best is None and proto.op_type in FUSING:
        best = _fused_candidate(f, proto, expect, used, pool)
    return best


def _fused_candidate(f, proto, expect, used, pool=None):
    """The float node ``proto`` matches once the float Mul/Add/Sub/Div by per-channel
    constants or the BatchNormalization after it are folded into its weight and bias (per
    float node the longest such chain whose folded weights the QDQ weights round to; of
    those nodes the closest), or None. ``pool``: the float nodes to try (default: those
    reading what ``proto``'s inputs match)."""
    best = None
    for cand in _candidates(f, expect, used, proto.op_type) if pool is None else pool:
        chain = _affine_chain(f, cand)
        for length in range(len(chain), 0, -1):
            inputs = _fused(f, cand, chain[:length])
            if inputs is None:
                continue
            fit = _fits_inputs(f, cand, expect, inputs)
            if fit is not None and fit.weights_fit:
                fit.chain = tuple(chain[:length])
                best = fit if _better(fit, best) else best
                break
    return best


def _affine_chain(f, node):
    """The float nodes after ``node`` (its only reader, then that one's) that scale or shift
    each output channel by a constant, or normalise it (BatchNormalization)."""
    chain, tensor = [], node.output[0]
    while True:
        readers = f.readers.get(tensor, ())
        if len(readers) != 1 or tensor in f.outputs:
            return chain
        r = readers[0]
        if r.op_type == "Identity":  # a pass-through the quantizer's optimization removed
            tensor = r.output[0]
            continue
        if r.op_type == "BatchNormalization":
            if any(f.constant(i) is None for i in r.input[1:5]) or len(r.output) > 1 and any(r.output[1:]):
                return chain
        elif r.op_type not in AFFINE or r.input[0] != tensor or f.constant(r.input[1]) is None:
            return chain
        chain.append(r)
        tensor = r.output[0]


def _fused(f, node, chain):
    """Names of ``node``'s inputs with ``chain`` folded into its weight and bias (made
    constants of ``f``), or None where a constant is not one value per output channel.
    Conv's output channels are its weight's axis 0; Gemm's and MatMul's the output's last
    axis (Gemm's weight rows with transB)."""
    weight = f.constant(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.dtype.kind != "f" or weight.ndim < 2:
        return None
    trans_b = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
    if node.op_type == "Gemm" and any(a.name in ("alpha", "beta") and a.f != 1 for a in node.attribute):
        return None
    axis = 0 if node.op_type == "Conv" or trans_b else weight.ndim - 1
    channels = weight.shape[axis]
    from_end = weight.ndim - 2 if node.op_type == "Conv" else 0  # the channel axis of its output
    bias_in = node.input[2] if len(node.input) > 2 and node.input[2] else None
    bias = f.constant(bias_in) if bias_in else np.zeros(channels, np.float64)
    if bias is None or bias.size not in (1, channels):
        return None
    w, b = weight.astype(np.float64), np.broadcast_to(bias.astype(np.float64).reshape(-1), (channels,))
    size = np.abs(b)  # a bound on the magnitudes each bias value passes through while folding
    for r in chain:
        norm = r.op_type == "BatchNormalization"
        if norm and node.op_type == "MatMul":
            return None  # it normalises axis 1, which is a MatMul's channels only in 2-D
        values = [f.constant(i) for i in r.input[1:5]] if norm else [f.constant(r.input[1])]
        per = [_per_channel(v, channels, from_end, norm) for v in values]
        if any(p is None for p in per):
            return None
        if r.op_type == "BatchNormalization":
            eps = next((a.f for a in r.attribute if a.name == "epsilon"), 1e-5)
            scale, shift, mean, var = per
            gain = scale / np.sqrt(var + eps)
            w, b = w * _along(gain, axis, w.ndim), (b - mean) * gain + shift
            size = (size + np.abs(mean)) * np.abs(gain) + np.abs(shift)
        elif r.op_type in ("Mul", "Div"):
            gain = per[0] if r.op_type == "Mul" else 1 / per[0]
            w, b, size = w * _along(gain, axis, w.ndim), b * gain, size * np.abs(gain)
        else:
            b = b + per[0] if r.op_type == "Add" else b - per[0]
            size = size + np.abs(per[0])
    # named after the float tensor each stands for (see float_source), unique per node and chain
    key = f"{FUSED}{node.name}::{len(chain)}"
    inputs = (node.input[0], f.derive(f"{node.input[1]}{key}", w.astype(weight.dtype)))
    if bias_in is None and all(r.op_type in ("Mul", "Div") for r in chain):
        return inputs  # scaled only: still no bias
    # the quantizer folded in float32, in its own order: a few units in the last place of
    # what the bias passed through (a 16-bit activation's bias step is that fine; a weight's
    # step is far coarser than its product's rounding)
    bias_name = f"{bias_in or node.name + '::bias'}{key}"
    return inputs + (f.derive(bias_name, b.astype(weight.dtype), 8 * np.finfo(np.float32).eps * size),)


def float_source(name):
    """The float model's tensor that the float weight ``name`` stands for: itself, or, for a
    weight with the ops after its node folded in, the node's weight or bias input (what a
    quantizer's settings name when it quantizes the float model). ``name`` may be a
    calibration node's ``float_weight`` (``ptq_float::NAME``, ``::T`` when transposed)."""
    return name.removeprefix(FLOAT_PREFIX).removesuffix("::T").split(FUSED)[0]


def _per_channel(value, channels, from_end, normalisation=False):
    """``value`` as one float per output channel, or None where it is not one value per
    channel broadcast along the output's channel axis, ``from_end`` axes before its last
    (BatchNormalization's constants are 1-D per channel by definition)."""
    v = np.asarray(value, np.float64)
    if v.size == 1:
        return np.full(channels, float(v.reshape(-1)[0]))
    if v.size != channels:
        return None
    if normalisation and v.ndim == 1:
        return v
    return v.reshape(-1) if v.ndim > from_end and v.shape[v.ndim - 1 - from_end] == channels else None


def _along(values, axis, ndim):
    shape = [1] * ndim
    shape[axis] = values.size
    return values.reshape(shape)


def _fits_inputs(f, cand, expect, inputs=None):
    """A :class:`_Match` when float node ``cand`` reads what ``expect`` says (``inputs``: its
    inputs' names, when a folded chain replaced them), else None."""
    inputs = tuple(cand.input) if inputs is None else tuple(inputs)
    if any(inputs[len(expect):]):
        return None  # the float node reads more than the QDQ node
    score, folds, weights_fit, distance = 0, {}, True, 0.0
    for k, e in enumerate(expect):
        fin = inputs[k] if k < len(inputs) else ""
        kind = e[0]
        if kind == "none":
            if fin:
                return None
        elif kind == "tensor":
            if f.canonical(fin) == f.canonical(e[1]):
                score += 2
                continue
            prod = f.producer.get(fin)
            c = e[2]
            if (prod is not None and prod.op_type in FOLDABLE and f.canonical(prod.input[0]) == f.canonical(e[1])
                    and c is not None and c.kind == "activation"):
                bounds = f.fold_bounds(prod)
                if bounds is None:
                    return None
                folds[c.name] = (bounds, fin)
                score += 2
                continue
            return None
        elif kind in ("weight", "const"):
            value = f.constant(fin) if fin else None
            if value is None and kind == "const" and fin and f.shape_derived(fin):
                score += 1  # a shape computed from shapes, stored folded
                continue
            if value is None:
                return None
            want = e[2] if kind == "weight" else np.shape(e[1])
            if tuple(np.shape(value)) != tuple(want):
                return None
            score += 1
            if kind == "const" and np.size(value) <= 64 and np.array_equal(value, e[1]):
                score += 1  # two Gathers of one shape: the one taking the same index
            if kind == "weight" and np.size(value) > 1:
                # among nodes of one op reading one tensor (q, k and v projections), the one
                # whose weight the quantized weight rounds to
                mine = e[3]()
                fit, far = _fit_to(f, e[1], mine, fin) if mine is not None else (False, math.inf)
                score += fit
                # a bias that does not round to the float one may be corrected by the
                # quantizer (bias correction: AMD Quark, aimet): the weight decides
                bias = k == 2 and cand.op_type in ("Conv", "Gemm")
                weights_fit, distance = weights_fit and (fit or bias), distance + far
        # "unknown": an input whose source did not match; anything goes
    return _Match(cand, folds, weights_fit, score, distance, inputs=inputs)


def _assign_weights(qm, f, weights_at, values):
    """Float weights for the weight calibration nodes: their positional match when it fits,
    else the best-fitting float constant of their shape (or, for a matrix, of its transposed
    shape: quantizers turn MatMul into Gemm with transB). Returns ``(weights, unmatched,
    tried, fitted)``; scalars (a QLinearMul's constant factor, say) are matched by position
    only and left out of the counts: by value they tell nothing. ``values``: the node
    matching's cache of the weight being compared (see :func:`_latest`), shared so that
    one dequantized weight is held at a time, not that one's and the last node's."""
    index, by_size = defaultdict(list), defaultdict(list)
    for fname in list(f.inits) + list(f.constant_nodes):
        value = f.constant(fname)
        if value is not None and value.dtype.kind == "f" and value.size > 1:
            index[tuple(value.shape)].append(fname)
            by_size[value.size].append(fname)
    weights, unmatched = {}, []
    tried = fitted = 0
    for c in qm.of_kind("weight"):
        mine = _latest(values, c.name, _model_value, qm, c)
        if mine is None:
            continue
        if mine.size < 2:
            fname = next((n for n in weights_at.get(c.name, ()) if f.constant(n) is not None
                          and np.size(f.constant(n)) == mine.size
                          and fits(c, mine, np.asarray(f.constant(n)).reshape(mine.shape))), None)
            if fname is not None:
                weights[c.name] = float_source(fname)
                _set_float(qm, c, np.asarray(f.constant(fname)).reshape(mine.shape), fname)
            continue
        tried += 1
        found = None
        for fname in dict.fromkeys(weights_at.get(c.name, ())):
            fw = f.constant(fname)
            if fw is not None and _fit_to(f, c, mine, fname)[0]:
                found = (fname, fw)
                break
        smoothing = _smoothing(qm, c)
        if found is None and smoothing is not None:  # positionally first, then any float weight of its shape
            for fname in dict.fromkeys([*weights_at.get(c.name, ()), *index.get(tuple(mine.shape), ())]):
                fw = f.constant(fname)
                smoothed = None if fw is None else _smoothed(fw, *smoothing)
                if smoothed is not None and fits(c, mine, smoothed, f.slack(fname)):
                    found = (fname, smoothed)
                    break
        if found is None:
            found = _by_value(f, index, c, mine, by_size, _layouts(qm, c, mine.shape))
        if found is None:
            if _needs_float(qm, c):
                unmatched.append(c.name)
            continue
        fitted += 1
        weights[c.name] = float_source(found[0])
        _set_float(qm, c, found[1], found[0])
    return weights, unmatched, tried, fitted


def _smoothing(qm, c):
    """``(axis, factor)`` where a SmoothQuant pass (Neural Compressor) divided the activation
    the node reading weight ``c`` takes by a per-input-channel factor and gave the weight that
    factor: its data input comes (through its pair) from a Mul by a constant vector, and the
    model's weight is the float one over it along ``axis``, its input channels; else None."""
    for name in c.consumers:
        node = qm.normal.get(name)
        if node is None or node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.inputs) < 2 or \
                node.inputs[1] not in c.outputs:
            continue
        mul = qm.producer.get(qm.source_of(node.inputs[0]))
        if mul is None or mul.op_type != "Mul":
            continue
        factor = next((qm.constant(i) for i in mul.input if qm.is_constant(i)), None)
        if factor is None or np.size(factor) < 2:
            continue
        attrs = {a.name: a.i for a in qm.node(name).attribute}
        if node.op_type == "Conv" and attrs.get("group", 1) != 1:
            continue
        # a Conv's weight is [out, in, ...], a transposed Gemm's [out, in], a MatMul's [..., in, out]
        axis = 1 if node.op_type == "Conv" or attrs.get("transB") else -2
        return axis, np.asarray(factor, np.float64).reshape(-1)
    return None


def _smoothed(fw, axis, factor):
    """``fw`` over ``factor`` along ``axis`` (see :func:`_smoothing`), or None where they do
    not fit."""
    if np.ndim(fw) < 2 or fw.shape[axis] != factor.size:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(fw, np.float64) / _along(factor, axis % fw.ndim, fw.ndim)).astype(fw.dtype)


def _layouts(qm, c, shape):
    """How the shape-only nodes between weight ``c``'s DequantizeLinear and the nodes reading
    the weight lay it out (an export storing the codes in another layout and transposing or
    reshaping them after dequantizing: [O*I] or [O, I] made [O, I, 1, 1]), one per distinct
    chain, those that leave ``shape`` as it is left out. Each is ``(steps, shape read)``, a
    step ``("T", perm)`` for a Transpose or ``("R", its input's shape)`` for a Reshape,
    Squeeze, Unsqueeze or Flatten: every one moves elements without changing them, so the
    float weight the reader takes goes back exactly through their inverses (see
    :func:`_undo_layout`), whatever becomes of the channel axis on the way."""
    layouts, start = [], np.broadcast_to(np.zeros((), bool), tuple(shape))
    for out in c.outputs:
        stack = [(out, start, (), tuple(range(len(shape))))]  # perm: the transposes so far, None after a reshape
        while stack:
            tensor, laid, steps, perm = stack.pop()
            for node in qm.consumers.get(tensor, ()):
                moved = laid_out(node, laid, qm.constant) if node.op_type in LAYOUT_OPS else None
                if node.op_type == "Identity":
                    stack.append((node.output[0], laid, steps, perm))
                elif moved is not None and node.op_type == "Transpose":
                    p = attribute(node, "perm")
                    p = list(range(laid.ndim))[::-1] if p is None else [int(a) for a in p]
                    stack.append((node.output[0], moved, steps + (("T", tuple(p)),),
                                  None if perm is None else tuple(perm[a] for a in p)))
                elif moved is not None:
                    stack.append((node.output[0], moved, steps + (("R", laid.shape),), None))
                elif steps and (steps, laid.shape) not in layouts and not (
                        perm == tuple(range(len(perm or ()))) if perm is not None else
                        laid.shape == start.shape and all(k == "R" for k, _ in steps)):
                    layouts.append((steps, laid.shape))
    return layouts


def _undo_layout(fw, steps):
    """``fw``, laid out as the reader of a weight takes it, in the layout its DequantizeLinear
    writes: the inverse of each of ``steps`` (see :func:`_layouts`), last first."""
    for kind, arg in reversed(steps):
        fw = fw.transpose(np.argsort(arg)) if kind == "T" else fw.reshape(arg)
    return fw


def _by_value(f, index, c, mine, by_size=None, layouts=()):
    """``(name, value)`` of the float constant closest to ``mine`` among those it fits, the
    value transposed when the match is the transposed matrix or the weight as the shape-only
    nodes after its DequantizeLinear lay it out (``layouts``: see :func:`_layouts`), or
    reshaped when the match has the same trailing axis and the leading ones merged or split
    (an LSTM's weights per direction and gate, stored as one matrix); or None. The value is
    in ``mine``'s layout."""
    best = None
    reshaped = [n for n in (by_size or {}).get(mine.size, ())
                if f.constant(n).ndim != mine.ndim and f.constant(n).shape[-1] == mine.shape[-1]]
    pools = [(None, index.get(tuple(mine.shape), ())), ("reshaped", reshaped)]
    if mine.ndim == 2:
        pools.insert(1, ((("T", (1, 0)),), index.get(tuple(mine.shape[::-1]), ())))
    # the float model's reader takes the weight laid out by those nodes: its float weight goes
    # back through their inverses
    pools += [(steps, index.get(tuple(shape), ())) for steps, shape in layouts
              if steps != (("T", (1, 0)),) or mine.ndim != 2]
    for how, names in pools:
        for fname in names:
            fw = f.constant(fname)
            fw = fw.reshape(mine.shape) if how == "reshaped" else fw if how is None else _undo_layout(fw, how)
            if fits(c, mine, fw):
                err = max(float(np.abs(mine[rows].astype(np.float64) - fw[rows]).max(initial=0))
                          for rows, _ in c.row_blocks(mine.shape))
                _hand_back(mine, fw)
                if best is None or err < best[0]:
                    best = (err, fname, fw)
    return None if best is None else (best[1], best[2])


def _model_value(qm, c):
    """What the QDQ model holds for a weight: its float tensor behind a pair, or its
    dequantized initializer behind a lone DQ."""
    value = qm.constant(c.input)
    if value is None:
        return None
    if c.q_node is not None:
        return np.asarray(value, np.float32)
    dequantized = c.dequantize(value)
    # the stored weight is read once, into this float copy: its file's pages go now, or
    # every int8 weight stays resident to the end (a 192 MiB stack's 48 MiB, the engine's
    # peak while aligning)
    _hand_back(value)
    return dequantized


def _needs_float(qm, c):
    """A lone DQ without a float weight, or a pair whose float weight is already on the grid."""
    return c.q_node is None or c.on_grid


def _fit_to(f, c, mine, fname):
    """:func:`fit_of` of weight ``c`` (its value ``mine``) and float constant ``fname`` of
    ``f``, worked out once an alignment: each comparison reads both weights whole."""
    key = (c.name, fname)
    if key not in f.fitted:
        f.fitted[key] = fit_of(c, mine, f.constant(fname), f.slack(fname))
    return f.fitted[key]


def fits(c, mine, fw, slack=0.0):
    """True when the model's weight ``mine`` is ``fw`` quantized by ``c`` (see :func:`fit_of`)."""
    return fit_of(c, mine, fw, slack)[0]


def fit_of(c, mine, fw, slack=0.0):
    """``(fits, distance)``: whether the model's weight ``mine`` is ``fw`` quantized by ``c``,
    within rounding of it (and ``slack``: how far the quantizer's own computation of ``fw``
    may be, per element or for all) or clipped where it lies outside the range, for at least
    FIT_SHARE of the elements; and the squared distance between the two over ``mine``'s
    squared norm, which tells apart two float weights that both fit (a depthwise weight
    whose every small element rounds to 0 fits many)."""
    fw = np.asarray(fw)
    if fw.dtype.kind != "f" or tuple(fw.shape) != tuple(mine.shape):
        return False, math.inf
    slack = np.broadcast_to(np.asarray(slack, np.float64), fw.shape)
    # a float16 model's weights, and the scale that dequantizes them, are rounded to half a
    # float16 step after the codes were computed from float32 values: up to that share of each
    half = max((np.finfo(t).eps / 2 for t in (fw.dtype, mine.dtype) if t == np.float16), default=0.0)
    good, diff, norm = 0, 0.0, 0.0
    for rows, part in c.row_blocks(fw.shape):
        fw64 = fw[rows].astype(np.float64)
        try:
            bound = grids.step_bound(fw64, part.grid, part.scale, part.axis, part.block_size)
            lo, hi = part.bounds(fw64.shape)
        except ValueError:  # scales that do not broadcast against this shape: not its weight
            return False, math.inf
        ours = mine[rows].astype(np.float64)
        with np.errstate(invalid="ignore"):  # an infinite constant (a mask's -inf) equals itself
            err = np.abs(ours - fw64)
            tolerance = bound * 1.001 + 1e-7 * np.abs(fw64) + slack[rows] + half * (np.abs(ours) + np.abs(fw64))
            good += int(np.count_nonzero((err <= tolerance) | (ours == fw64) | (fw64 < lo) | (fw64 > hi)))
            finite = np.isfinite(err)
            diff += float(np.square(err[finite]).sum())
            norm += float(np.square(ours[finite]).sum())
    _hand_back(mine, fw)
    return fw.size > 0 and good >= FIT_SHARE * fw.size, diff / norm if norm else (0.0 if diff == 0 else math.inf)


def _hand_back(*arrays):
    """Return the pages of weights left in their files (see :func:`.graph.mapping`) once read:
    comparing every weight with its float model otherwise leaves both files resident."""
    for array in arrays:
        if isinstance(array, np.ndarray):
            hand_back(mapping(array))


def _set_float(qm, c, fw, fname):
    """Use ``fw`` as ``c``'s float weight, in the dtype the graph computes with there."""
    elem = qm.value_types.get(c.outputs[0], onnx.TensorProto.FLOAT)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    if c.q_node is not None and not c.on_grid:
        return  # the float weight behind the pair is the float weight
    value = np.asarray(fw, dtype=dtype, order="C")  # a mapped weight stays mapped, a scalar 0-d
    name = f"{FLOAT_PREFIX}{fname}"
    if name in qm.float_weights and qm.float_weights[name].shape != value.shape:
        name += "::T"  # the same float weight transposed for another node
    qm.float_weights[name] = value
    c.float_weight = name


def _rewrites(qm, f, nodes, used, passed):
    """Sentences for what the quantizer changed beyond Q/DQ: float ops without counterpart and
    QDQ ops the float model does not have (but the reshapes that passed a match through)."""
    # a float Relu/Clip the quantizer deleted is explained when the node after it matched
    explained = {n.name for n in f.nodes if n.op_type in FOLDABLE and n.name not in used
                 and any(u.name in used for u in f.consumers.get(n.output[0], ()))}
    # so is a float node the quantizer merged with an identical one, and shape arithmetic
    # (constant-folded where the shapes are fixed)
    explained |= {n.name for n in f.nodes if n.output and all(o in f.same or f.shape_derived(o)
                                                              for o in n.output if o)}
    unmatched_float = [n.name for n in f.nodes if n.name not in used and n.name not in explained
                       and n.op_type not in ("Identity", "Dropout")]
    # a QDQ node the float model holds as it is (its name and op) was not rewritten, only
    # left unmatched (shape arithmetic whose inputs a pair changed, a read from a subgraph)
    kept = {(n.name, n.op_type) for n in f.nodes}
    unmatched_qdq = [n.name for n in qm.normal.values() if n.name not in nodes and n.name not in passed
                     and n.op_type not in TRANSPARENT and (n.name, n.op_type) not in kept]
    out = []
    if unmatched_float or unmatched_qdq:
        fops = _ops(f.nodes, unmatched_float)
        qops = _ops([qm.node(n) for n in unmatched_qdq], unmatched_qdq)
        parts = ([f"float {fops} without counterpart"] if fops else []) + (
            [f"QDQ {qops} not in the float model"] if qops else [])
        out.append("the quantizer changed the graph beyond Q/DQ: " + ", ".join(parts))
    return out, unmatched_float, unmatched_qdq


def _ops(nodes, names):
    wanted = set(names)
    counts = defaultdict(int)
    for n in nodes:
        if n.name in wanted:
            counts[n.op_type] += 1
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(counts.items()))

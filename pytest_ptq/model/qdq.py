"""The calibrated QDQ model as the analyses see it.

A *calibration node* is what the seed tool calls HzCalibration: here a ``QuantizeLinear``
and the ``DequantizeLinear`` nodes it feeds (one node however many DQs it feeds), or a
lone ``DequantizeLinear`` of a quantized initializer (onnxruntime's default for weights
and biases). Every other node is a *normal node*. Q/DQ are recognised by op type in the
standard domain and in onnxruntime's ``com.microsoft`` one, whatever their names; their
type (int2..int16, int32 biases, float8, float4) and granularity (per tensor, per axis,
per block) come from the graph's types and the ops' attributes. A ``DynamicQuantizeLinear``
feeding a DQ of its own outputs is a calibration node of kind ``dynamic``: its range is
computed on every run. QOperator and dynamic models arrive here in QDQ form (:mod:`.formats`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict

import numpy as np
import onnx
from onnx import numpy_helper

from .. import params
from ..errors import NotQuantized, PTQError, unknown
from . import folded, formats, grids, moved
from .graph import (Unprovided, externalize, hand_back, load_light, load_model, mapping, name_nodes, node_refs,
                    restore, has_subgraphs, sort_topologically, subgraphs, declared_dims, attribute, laid_out,
                    LAYOUT_OPS)
from .producers import detect

# Elements of a weight that numpy computes on at once (see CalibrationNode.row_blocks): float64
# temporaries of 2 MiB each. A million made aligning a 192 MiB MatMul stack behind lone DQs
# peak 16 MiB higher (six such temporaries in flight) and run 2.4x as long (1.29 vs 0.54 s).
ROW_BLOCK = 1 << 18
# Domains whose ops onnxruntime runs without a custom-op library.
STANDARD_DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml")
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)
HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)  # 16-bit floats
# An If/Loop/Scan with this many float nodes inside, beside quantized ones outside, is named
FLOAT_BODY = 10


def is_q(node):
    """QuantizeLinear, in any domain (custom ones such as ExtendedQuantizeLinear too), with
    its scale as an input (not DynamicQuantizeLinear, which computes it)."""
    op = node.op_type
    return op.endswith("QuantizeLinear") and not op.endswith("DequantizeLinear") and op != "DynamicQuantizeLinear"


def is_dq(node):
    """DequantizeLinear, in any domain."""
    return node.op_type.endswith("DequantizeLinear")


def is_fused(node):
    """A custom op that quantizes and dequantizes in one node (e.g. BFPQuantizeDequantize)."""
    return "QuantizeDequantize" in node.op_type and node.domain not in STANDARD_DOMAINS


# onnxruntime quantizes the weight input of these ops per channel.
PER_CHANNEL_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
# Distinct values a float weight read without a pair must hold, on an integer grid, for the
# model alone to suggest a quantization folded into the file: a hand-made kernel (a mean
# filter's 0 and +-1/81, a binomial blur's six multiples of 1/256) lies on a grid too, with
# fewer; a dequantized int8 or int4 weight of a few dozen elements holds more.
GRID_LEVELS = 8


@dataclasses.dataclass
class CalibrationNode:
    """One Q/DQ pair (or lone DQ) with its quantization parameters.

    ``threshold`` is the largest magnitude the pair represents, in the units of its input
    (``scale * max(qmax - zp, zp - qmin)``, the max over channels or blocks).
    """

    name: str
    # "activation", "weight", or "dynamic": an activation quantizer (DynamicQuantizeLinear)
    # whose scale and zero point each run computes from the tensor, so that ``scale`` and
    # ``threshold`` are NaN
    kind: str
    input: str  # the tensor quantized (float for pairs; the quantized initializer for a lone DQ)
    q_node: onnx.NodeProto | None
    dq_nodes: list
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None
    qtype: int
    grid: grids.Grid
    threshold: float
    block_size: int = 0
    role: str = ""  # "bias" for int32 bias DQs
    float_weight: str | None = None  # initializer holding the float weight, when known
    consumers: list = dataclasses.field(default_factory=list)  # normal nodes fed, by name
    producer: str | None = None  # normal node that computes an activation's input
    # (op_type, low, high) of a Relu/Clip that the quantizer folded into this pair's range
    # and deleted, found in the float model; bypassing the pair re-applies it
    folded: tuple | None = None
    # normal nodes reading the pair whose float counterparts read the tensor before that
    # Relu/Clip (a quantizer deleted it for one reader of a shared tensor): bypassed, they
    # read it without the fold
    unfolded: list = dataclasses.field(default_factory=list)
    on_grid: bool = False  # a float weight behind the pair already rounded onto its grid
    fused: bool = False  # one custom node quantizes and dequantizes (q_node is dq_nodes[0])
    # integer nodes between the Q and its DQs (a Clip narrowing the codes: ``grid`` is narrowed)
    between: list = dataclasses.field(default_factory=list)

    @property
    def outputs(self):
        return [dq.output[0] for dq in self.dq_nodes]

    @property
    def dynamic(self):
        """True for a quantizer whose range each run computes (no calibrated range)."""
        return self.kind == "dynamic"

    @property
    def is_activation(self):
        """An activation quantizer, calibrated or dynamic."""
        return self.kind in ("activation", "dynamic")

    @property
    def bypassable(self):
        """False for a lone DQ whose float weight is unknown: bypassing it changes nothing."""
        return self.q_node is not None or self.float_weight is not None

    @property
    def bit(self):
        return self.grid.bits

    @property
    def per_channel(self):
        """One scale per index of ``axis`` (not per block)."""
        return self.scale.size > 1 and not self.block_size

    @property
    def granularity(self):
        if self.block_size:
            return f"per-block ({self.block_size})"
        return "per-channel" if self.per_channel else "per-tensor"

    @property
    def qrange(self):
        return self.grid.qmin, self.grid.qmax

    @property
    def dtype_name(self):
        return self.grid.name

    def as_float_model_has_it(self, values):
        """``values`` of this node's input tensor as the pair quantizes them: through the
        Relu/Clip the quantizer folded into it (``folded``), if any, where the pair's range
        applies it. What such a fold zeroes or bounds is the model's, not clipping by the
        quantization grid; a fold the range does not apply (:meth:`fold_lost`) is gone from the
        quantized model, which quantizes the values as they are."""
        if self.folded is None or self.fold_lost():
            return values
        _, lo, hi = self.folded
        return np.clip(values, lo, hi)

    def fold_lost(self):
        """Whether the quantizer deleted a Relu/Clip (``folded``) whose bound this pair's range
        reaches past by more than a step, so that the quantized model no longer applies it
        (a signed or symmetric range after a Relu: onnxruntime deletes the Relu all the same)."""
        if self.folded is None or self.dynamic:
            return False
        _, lo, hi = self.folded
        low, high = self.range()
        step = np.abs(self.scale.astype(np.float64))
        return bool(np.any(low < lo - step) or np.any(high > hi + step))

    def range(self, codes=None):
        """(lowest, highest) representable values, per channel or block, in input units; of
        the codes ``(qmin, qmax)`` where given (the half grid of :meth:`QuantModel.reduced_range`).
        A negative scale (onnxruntime's symmetric block quantizer writes them on purpose) maps
        the lowest code to the highest value."""
        s = self.scale.astype(np.float64)
        zp = 0.0 if self.grid.is_float else self.zero_point.astype(np.float64)
        qmin, qmax = codes or (self.grid.qmin, self.grid.qmax)
        a, b = s * (qmin - zp), s * (qmax - zp)
        return np.minimum(a, b), np.maximum(a, b)

    def bounds(self, shape):
        """:meth:`range` broadcast against a tensor of ``shape`` (channels or blocks expanded)."""
        lo, hi = self.range()
        return (grids.broadcast(lo, shape, self.axis, self.block_size),
                grids.broadcast(hi, shape, self.axis, self.block_size))

    def row_blocks(self, shape, elements=None):
        """``(rows, node)`` pairs that cover axis 0 of a tensor of ``shape`` in order, about
        ``elements`` elements each (default :data:`ROW_BLOCK`): ``rows`` a slice of that axis
        (``...``: the whole tensor in one block), ``node`` this one with the scale and zero
        point of those rows (itself where they do not depend on the row). So that float64
        arithmetic on a large weight needs temporaries of a block, not of the weight (a 36
        MiB convolution weight took 400 MiB to compare with its float model)."""
        shape, elements = tuple(shape), elements or ROW_BLOCK
        rows = shape[0] if shape else 1
        per_row = math.prod(shape[1:]) if shape else 1
        if self.dynamic or rows * per_row <= elements:
            yield ..., self
            return
        step = max(1, elements // max(per_row, 1))
        on_rows = (1 if self.axis is None else self.axis) % len(shape) == 0
        block = self.block_size if on_rows else 0
        if block:
            step = max(block, step // block * block)
        lead = -(-rows // block) if block else rows
        sliced = self.scale.size > 1 and self.scale.ndim >= 1 and self.scale.shape[0] == lead and (
            on_rows or self.scale.ndim == len(shape))
        for a in range(0, rows, step):
            b = min(rows, a + step)
            if not sliced:
                yield slice(a, b), self
                continue
            index = slice(a // block, -(-b // block)) if block else slice(a, b)
            zp = self.zero_point[index] if self.zero_point.size == self.scale.size else self.zero_point
            yield slice(a, b), dataclasses.replace(self, scale=self.scale[index], zero_point=zp)

    def half_step(self, shape):
        """Half a quantization step (the scale over 2), broadcast against ``shape``."""
        return grids.broadcast(np.abs(self.scale.astype(np.float64)) / 2, shape, self.axis, self.block_size)

    def fake_quant(self, x):
        """Quantize then dequantize ``x`` with this node's parameters in numpy (onnxruntime's
        rounding); a dynamic node takes them from ``x`` as DynamicQuantizeLinear does."""
        if self.dynamic:
            return grids.dynamic_fake_quant(x)
        x = np.asarray(x)
        return self._by_rows(x, lambda c, rows: grids.fake_quant(x[rows], c.grid, c.scale, c.zero_point, c.axis,
                                                                 c.block_size))

    def dequantize(self, codes):
        """The float value of a quantized initializer (a lone DQ's input)."""
        codes = np.asarray(codes)

        def dequantized(c, rows):
            part = codes[rows].astype(np.float64)
            s = grids.broadcast(c.scale.astype(np.float64), part.shape, c.axis, c.block_size)
            z = grids.broadcast(c.zero_point.astype(np.float64), part.shape, c.axis, c.block_size)
            return (c.grid.dequantize(part, z) * s).astype(np.float32)

        return self._by_rows(codes, dequantized)

    def _by_rows(self, x, compute):
        """``compute(node, rows)`` (a float32 array of those rows) over :meth:`row_blocks`."""
        blocks = list(self.row_blocks(np.shape(x)))
        if len(blocks) == 1:
            rows, c = blocks[0]
            return compute(c, rows)
        out = np.empty(np.shape(x), np.float32)
        for rows, c in blocks:
            out[rows] = compute(c, rows)
        return out

    def codes_used(self, x):
        """Distinct grid values that ``x`` quantizes to."""
        if self.dynamic:
            scale, zp = grids.dynamic_qparams(x)
            return grids.codes_used(x, self.grid, scale, zp) if scale else 1
        return grids.codes_used(x, self.grid, self.scale, self.zero_point, self.axis, self.block_size)

    def code_counts(self, x, bits=None):
        """How many values of ``x`` fall on each code of the grid, indexed from the lowest code
        (integer grids) or by bit pattern (float grids); None for grids too large to count
        (int32) or known only to their custom op. With ``bits``, on an integer grid of that many
        bits spanning the same range (what re-calibrating to a wider type would give the same
        data); None for float, dynamic or custom grids."""
        g = self.grid
        if g.is_custom or g.bits > 16 or (bits is not None and (g.is_float or self.dynamic)):
            return None
        x = np.asarray(x, np.float64)
        if self.dynamic:  # this run's own range, as DynamicQuantizeLinear takes it
            scale, zp = grids.dynamic_qparams(x)
            if not scale:
                return None
            s, z = np.float64(scale), np.float64(zp)
        else:
            s = grids.broadcast(self.scale.astype(np.float64), x.shape, self.axis, self.block_size)
            z = grids.broadcast(self.zero_point.astype(np.float64), x.shape, self.axis, self.block_size)
            if not (np.asarray(s) != 0).all() or (bits is not None and not (np.asarray(s) > 0).all()):
                return None  # a grid of no width; or a reversed one, which a wider grid's count needs upright
        if bits is not None:
            # the calibrated range lies within a step of the grid's ends (its zero point was
            # rounded to a code), so the wider grid spans one step more at each end
            step = s * (g.levels + 1) / (2 ** bits - 1)
            codes = np.clip(np.rint((x - (g.qmin - z - 1) * s) / step), 0, 2 ** bits - 1)
            return np.bincount(codes.reshape(-1).astype(np.int64), minlength=2 ** bits)
        codes = g.quantize(x / s, z)
        if g.is_float:
            bits = codes.astype(np.float32).astype(g.np_type).view(np.uint8 if g.bits <= 8 else np.uint16)
            return np.bincount(bits.reshape(-1).astype(np.int64), minlength=2 ** g.bits)
        return np.bincount((codes - g.qmin).reshape(-1).astype(np.int64), minlength=g.levels)

    @property
    def shown_threshold(self):
        """``threshold`` for tables and JSON: "per run" where each run sets the range (dynamic)."""
        return "per run" if self.dynamic else self.threshold

    def summary(self):
        return {"name": self.name, "kind": self.kind, "input": self.input, "bit": self.bit,
                "dtype": self.dtype_name, "threshold": self.shown_threshold, "granularity": self.granularity,
                "per_channel": self.per_channel, "axis": self.axis, "block_size": self.block_size,
                "consumers": list(self.consumers), "role": self.role}


@dataclasses.dataclass
class QParams:
    """An alternative fake-quant for a calibration node: ``scale`` and ``zero_point`` are
    shaped to broadcast against the node's input (per channel: ``[1, C, 1, 1]`` and so on)."""

    scale: np.ndarray
    zero_point: np.ndarray
    qmin: float
    qmax: float
    label: str = ""

    @classmethod
    def wider(cls, c, bits=16, shape=None, span=None, symmetric=False):
        """The same range as ``c`` at ``bits`` bits: the pair re-quantized finer, not wider.
        ``shape``: of the tensor quantized, needed when ``c`` has several scales; ``span``:
        ``(lo, hi)`` to use instead of ``c``'s range; ``symmetric``: centred on 0 as
        ActivationSymmetric centres it (:meth:`QuantModel.symmetric_activations`)."""
        lo, hi = c.range() if span is None else (np.asarray(span[0], np.float64), np.asarray(span[1], np.float64))
        signed = c.grid.signed
        nmin, nmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
        if symmetric:
            # over the range's largest magnitude, as the narrow grid (half its span from its
            # codes, which reach a step further on one side)
            half = np.maximum(np.abs(lo), np.abs(hi)) if span is not None else (hi - lo) / 2
            scale = 2 * half / (nmax - nmin)
            zp = np.full_like(np.asarray(scale, np.float64), 0 if signed else (nmin + nmax + 1) // 2)
        else:
            scale = (hi - lo) / (nmax - nmin)
            zp = np.rint(nmin - grids.divided(lo, scale))
        if scale.size > 1 and shape is None:
            shape = [1] * 4
            shape[(c.axis if c.axis is not None else 1) % 4] = scale.size
        as_input = lambda v: grids.broadcast(np.asarray(v, np.float32), shape, c.axis, c.block_size)  # noqa: E731
        return cls(as_input(scale), as_input(zp), nmin, nmax, f"int{bits}" if signed else f"uint{bits}")


@dataclasses.dataclass
class NormalNode:
    name: str
    op_type: str
    inputs: list
    outputs: list
    calibration_inputs: list  # names of the calibration nodes feeding it
    index: int  # topological position among normal nodes
    # pairs on its outputs that only the model's outputs read (a detector head's Concat): no
    # node's input, so the node they quantize owns them
    calibration_outputs: list = dataclasses.field(default_factory=list)
    # pairs earlier in a requantize chain (Q-DQ-Q-DQ) that ends in a pair on its input: its
    # input passes through them too, and no operator reads their own output
    calibration_chained: list = dataclasses.field(default_factory=list)

    @property
    def quantizers(self):
        """The calibration nodes quantizing this node: its inputs', then its model outputs'."""
        return self.calibration_inputs + self.calibration_outputs


class QuantModel:
    """A calibrated QDQ model parsed into calibration nodes and normal nodes.

    ``calibration`` keeps graph order; ``normal`` is in topological order. ``float_model``:
    the model it was quantized from, aligned by structure and values to recover float
    weights and the activations the quantizer deleted (see :mod:`.align`).
    """

    def __init__(self, model_or_file, float_model=None, shared=None):
        self.model, self.path, mapped = load_light(model_or_file)
        self.source = str(self.path) if self.path else "<ModelProto>"
        self.notes = []
        # large initializers as numpy arrays (external data mapped from its file), shared by
        # every session (``shared``: the values of a ModelProto from another QuantModel)
        folder = self.path.parent if self.path else None
        arrays = externalize(self.model.graph, {**(shared or {}), **mapped}, folder, repr(self.source))
        # QOperator and dynamic models are analysed in their QDQ form (see .formats), which
        # reads their weights' values
        rewrite = formats.to_qdq(self.model, repr(self.source), arrays)
        self.model, self._format, self.format_label = rewrite.model, rewrite.format, rewrite.label
        # a tensor of the tool's copy -> the name the file and the float model give it (see shown_name)
        self.float_names = rewrite.float_names
        # the file as onnxruntime runs it, where the tool's copy departs from it (a QDQ file's
        # table dequantized before its Gather, see formats.to_qdq)
        self._given = None if self._format == formats.QDQ and not rewrite.moved else model_or_file
        self.notes += rewrite.notes
        graph = self.model.graph
        if self.model.ir_version < 4:
            # IR 3 lists every initializer as a graph input, and onnxruntime then registers one
            # that only a subgraph reads (the engine's gates read scales from their If
            # branches) nowhere; from IR 4 an initializer needs no input entry
            inits = {i.name for i in graph.initializer}
            kept = [i for i in graph.input if i.name not in inits]
            del graph.input[:]
            graph.input.extend(kept)
            self.model.ir_version = 4
        self._refuse_axis_before_opset_13()
        self.shared = externalize(graph, arrays, folder, repr(self.source))  # and the rewrite's own
        repeated = Counter(n.name for n in graph.node if n.name)
        repeated = {k: v for k, v in repeated.items() if v > 1}
        # nodes without a name of their own in the file: none, or one another shares (no
        # quantizer option names one of them apart)
        self.unnamed = set().union(*name_nodes(graph))
        if repeated:
            name, times = next(iter(repeated.items()))
            self.notes.append(f"node names repeat in the file ({name!r} {times} times"
                              + (f", and {len(repeated) - 1} other name(s)" if len(repeated) > 1 else "")
                              + f"), which onnxruntime refuses to load; the analyses tell them apart as {name!r}, "
                              f"{name + '__1'!r}, ... in graph order: give each node its own name")
        self.made_by = detect(self.model, self._format)  # the quantizer, for reports and remedies only
        try:
            self.resorted = sort_topologically(graph, repr(self.source))
        except Unprovided as exc:
            writer = _writer(float_model, exc.tensor)
            kept = None if writer is None or not writer.name else next(
                (n for n in graph.node if n.name == writer.name and n.op_type == writer.op_type), None)
            raise PTQError(exc.explain(writer, kept)) from None
        if self.resorted:
            self.notes.append("the graph was stored out of topological order; it is analysed sorted")
        # a Q -> Reshape (Identity, Transpose, ...) -> DQ chain is one pair: the node runs on the float tensor
        hoisted = moved.hoist(graph, repr(self.source), is_q, is_dq, formats.dims_of(self.model))
        self.notes += hoisted.notes
        if hoisted.names and self._given is None:  # a pair moved: the file is not the tool's copy
            # onnxruntime fuses the file's own layout, not the rewrite: an Add before an int8
            # Q -> Reshape -> DQ runs in float in the file, and as a QLinearAdd once the Reshape
            # comes first
            self._given = model_or_file
        self.float_names.update(hoisted.names)
        self._moved = hoisted.names  # a moved pair's float tensor -> the one its Q reads in the file (see file_layout)
        # weights whose DequantizeLinear the file's constant folding computed away, put back
        # (see .folded): tensor -> its DequantizeLinear, the calibration node it now is
        self.restored = {}
        said, outputs = len(self.notes), [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in graph.output]
        self._parse(float_model, hoisted.left)
        if self._unfold(outputs):
            # parsed again with them put back: only for such a file, so that no other pays for it
            del self.notes[said:]
            del graph.output[:]
            graph.output.extend(outputs)  # the parse leaves out those no configuration changes, with a note each
            if self._given is None:  # the file runs its float initializers, the copy their codes
                self._given = model_or_file
            self._parse(float_model, hoisted.left)
        self._note_quantized_constants()

    def _parse(self, float_model, unmoved):
        """Calibration nodes, normal nodes and the alignment with ``float_model`` (if any),
        from the tool's copy of the graph; ``unmoved``: a sentence each for the chains between
        a Q and its DQ that stay as they are (see :mod:`.moved`)."""
        graph = self.model.graph
        self._by_output = self._protos = None  # built on first use (see by_output, node), from this parse's graph
        self.alignment = None
        self.inits = {i.name: i for i in graph.initializer}
        self.constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
        self.input_names = [i.name for i in graph.input if i.name not in self.inits]
        self.inputs = {i.name: i for i in graph.input if i.name not in self.inits}
        self.output_names = [o.name for o in graph.output]
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers = defaultdict(list)
        for n in graph.node:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.value_types = self._infer_types()
        self._constant_cache = {}
        self._readers = None  # tensor -> main-graph nodes reading it (see readers), built on first use
        self._reduced = {}  # calibration node -> its reduce_range half grid or None (see reduced_range)
        self.custom_ops = sorted({(n.domain, n.op_type) for n in graph.node if n.domain not in STANDARD_DOMAINS})
        self.calibration = self._find_calibration_nodes()
        if not self.calibration and self.custom_ops:
            raise PTQError(f"model {self.source!r} holds no Q/DQ pair the tool recognises but custom ops "
                           f"{_ops(self.custom_ops)}; pytest-ptq analyses QuantizeLinear/DequantizeLinear pairs in any "
                           "domain and fused *QuantizeDequantize ops, so re-export it with one of those")
        if not self.calibration and unmoved:  # quantized, though in no pair the tool can bypass
            many = f" ({len(unmoved)} chains like this one)" if len(unmoved) > 1 else ""
            raise NotQuantized(f"model {self.source!r} has no QuantizeLinear/DequantizeLinear pair the tool "
                               f"analyses{many}: {unmoved[0]}")
        if not self.calibration:
            raise NotQuantized(self._inside_control_flow() or (
                f"model {self.source!r} has no QuantizeLinear/DequantizeLinear pairs; pass the calibrated QDQ model "
                "(quantize_static with QuantFormat.QDQ), not the float one"))
        self._drop_unchanging_outputs()
        self._note_unjudged_outputs()
        self._note_inner_pairs()
        self._mark_on_grid()
        self.float_weights = {}
        self._map_normal_nodes()
        self.aligned = float_model is not None  # its weights were looked for in a float model
        if float_model is not None:
            from .align import align

            align(self, float_model)
            self._note_lost_folds()

    def _refuse_axis_before_opset_13(self):
        """Q/DQ of the standard domain take an axis from opset 13: quantize_static(per_channel=True)
        on an older model writes one all the same, a file onnxruntime refuses to load."""
        opset = formats.onnx_opset(self.model)
        if opset >= 13:
            return
        node = next((n for n in self.model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                     and n.domain in ("", "ai.onnx") and any(a.name == "axis" for a in n.attribute)), None)
        if node is not None:
            raise PTQError(f"{self.source!r} quantizes per channel at opset {opset} ({node.op_type} {node.name!r} has an "
                           "axis), which Q/DQ take only from opset 13, so onnxruntime cannot load it; convert the float "
                           "model to opset 13 first (onnx.version_converter.convert_version(model, 13)) and quantize it "
                           "again")

    def _note_lost_folds(self):
        """A note for the Relu/Clip the quantizer deleted before pairs whose range does not
        apply it: the quantized model runs without that activation, a change no figure
        would otherwise name (the pair's sensitivity reads it; its reasons would blame the range)."""
        lost = [c for c in self.calibration.values() if c.fold_lost()]
        if not lost:
            return
        c = lost[0]
        op, lo, hi = c.folded
        low, high = float(np.min(c.range()[0])), float(np.max(c.range()[1]))
        bound = f"{op} ({lo:g}, {hi:g})" if op == "Clip" else op
        others = ", ".join(repr(x.name) for x in lost[1:4]) + (" ..." if len(lost) > 4 else "")
        more = f" (nor do those of {len(lost) - 1} more pair(s): {others})" if len(lost) > 1 else ""
        self.notes.append(
            f"the quantizer deleted the {bound} before pair {c.name!r}, taking the pair's range to apply it, but that "
            f"range [{low:.4g}, {high:.4g}] does not{more}: the quantized model runs without that activation, which "
            "its figures count as quantization error; re-quantize keeping it (onnxruntime: "
            "extra_options={'QDQKeepRemovableActivations': True})")

    def _unfold(self, outputs):
        """Put back the weights the alignment found folded into the file (see :mod:`.folded`):
        float32 initializers whose codes give their values back (per channel from opset 13,
        where DequantizeLinear takes an axis), not listed among the graph's inputs (a value a
        caller may override) nor its ``outputs`` (the file's). True where any was."""
        found = self.alignment.quantized_constants if self.alignment is not None else {}
        self._unrestored = {}  # folded weight -> why it stays folded, for its note
        if not found:
            return False
        opset = formats.onnx_opset(self.model)
        listed = {i.name for i in self.model.graph.input} | {o.name for o in outputs}
        weights = {}
        for tensor in found:
            init = self.inits.get(tensor)
            axis = self.alignment.quantized_axes.get(tensor)
            why = _unrestorable(init, axis, opset, tensor in listed)
            if why is None:
                value = self.constant(tensor)
                stored = grids.stored_codes(value, axis)
                hand_back(mapping(value))  # read once: a weight left in its file goes back to it
                if stored is not None:
                    weights[tensor] = (axis, *stored)
                else:
                    why = "its values give no int8 codes back exactly"
            if why is not None:
                self._unrestored[tensor] = why
        for tensor in list(weights):
            weights.update(self._folded_biases(tensor, weights[tensor], listed))
        put_back = folded.unfold(self.model.graph, weights, self.shared)
        self.restored = put_back.nodes
        self.float_names.update(put_back.codes)  # the codes are the file's weight, quantized
        return bool(self.restored)

    def _folded_biases(self, weight, restored, listed):
        """``{bias: (axis, codes, scale, zero_point)}`` for the float32 biases of the Conv/Gemm
        nodes reading restored ``weight`` (``restored``: its axis, codes, scale, zero point)
        whose values lie bit for bit on the int32 grid of the node's input scale times that
        weight scale, zero point 0, as quantize_static quantizes a bias: folded with the weight,
        and put back with it so that bypassing it runs the float model's bias."""
        axis, _, steps, _ = restored
        out = {}
        for node in self.consumers.get(weight, ()):
            if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or node.input[1] != weight:
                continue
            bias, source = node.input[2], self.by_output().get(node.input[0])
            init = self.inits.get(bias)
            if (init is None or init.data_type != onnx.TensorProto.FLOAT or bias in listed or source is None
                    or source.kind != "activation" or np.size(source.scale) != 1):
                continue
            channels = 0 if node.op_type == "Conv" or attribute(node, "transB", 0) else 1
            if axis is not None and axis != channels:  # a weight's grid across its output channels only
                continue
            scale = np.float32(np.asarray(source.scale, np.float32).reshape(())) * np.asarray(steps, np.float32)
            codes = grids.bias_codes(self.constant(bias), scale)
            if codes is not None:
                per = None if scale.size == 1 else 0
                out[bias] = (per, codes, scale.reshape(() if per is None else -1), np.zeros(scale.shape, np.int32))
        return out

    def _why_unrestored(self, tensors):
        """`` (not restored ...: 'w': why)`` for the folded weights ``tensors`` that :meth:`_unfold` left."""
        by_reason = {}
        for t in tensors:
            if t in self._unrestored:
                by_reason.setdefault(self._unrestored[t], []).append(repr(self.shown_name(t)))
        said = [f"{', '.join(names)}: {why}" for why, names in by_reason.items()]
        return f" (not restored behind a DequantizeLinear: {'; '.join(said)})" if said else ""

    def _note_quantized_constants(self):
        """A note for the weights whose quantization onnxruntime's constant folding computed
        into the file (a session saving ``optimized_model_filepath`` folds each weight's
        DequantizeLinear of constant codes into a float initializer). With the float model the
        alignment finds them (:func:`.align.folded_weights`) and the copy holds them as codes
        behind a DequantizeLinear again (:attr:`restored`), analysed as any lone-DQ weight;
        one that could not be put back runs quantized in every configuration, the bypassed one
        included. Without the float model, a float constant on an integer grid read beside a
        pair is only a possibility: a grid alone is no proof, and nothing is put back."""
        if self.restored:
            biases = [t for t in self.restored if self.calibration[self.restored[t]].role == "bias"]
            found = [t for t in self.restored if t not in biases]
            many = len(found) > 1
            also = (f"; so {'are' if len(biases) > 1 else 'is'} the int32 bias{'es' if len(biases) > 1 else ''} of "
                    f"{'their' if many else 'its'} reader{'s' if len(biases) > 1 else ''} "
                    f"({', '.join(repr(self.shown_name(t)) for t in biases)}), on the grid of the input scale times the "
                    "weight scale" if biases else "")
            self.notes.append(
                f"{_weights(self, found)} the file holds as float {'are' if many else 'is'} the float model's "
                f"weight{'s' if many else ''} rounded onto an integer grid: the quantizer's DequantizeLinear of "
                f"{'them was' if many else 'it was'} folded into the file (onnxruntime's constant folding, as when a "
                f"session saves optimized_model_filepath); {'they are' if many else 'it is'} analysed as restored "
                f"pair{'s' if many else ''}, int8 codes and scale read off the values behind a DequantizeLinear "
                f"({', '.join(repr(self.restored[t]) for t in found)}) that gives the file's values back{also}, so "
                f"{'their' if many else 'its'} quantization error shows in the weight rankings and bypassing every "
                "pair runs the float model's weights; runs of the file as deployed run it as given")
        alignment = self.alignment
        if alignment is not None:
            found = list(alignment.quantized_constants)
            if found:
                self.notes.append(
                    f"{_weights(self, found)} the file holds as float {'are' if len(found) > 1 else 'is'} the float "
                    "model's weight(s) rounded onto an integer grid: the quantizer's DequantizeLinear of "
                    f"{'them was' if len(found) > 1 else 'it was'} folded into the file (onnxruntime's constant "
                    "folding, as when a session saves optimized_model_filepath), so no pair is left to bypass; "
                    "their quantization error counts in every configuration, the bypassed (float) one included, and "
                    f"no ranking shows it{self._why_unrestored(found)}; analyse the file saved before constant "
                    "folding (the quantizer's own output, or one saved with graph_optimization_level ORT_DISABLE_ALL)")
            return
        if self.aligned:
            return
        found = list(dict.fromkeys(t for _, _, t in self.unpaired_weights()
                                   if self._on_integer_grid(t)))
        if found:
            self.notes.append(
                f"{_weights(self, found)}, read without a pair beside quantized inputs, hold{'' if len(found) > 1 else 's'} "
                "values on an integer grid (whole multiples of one step per tensor or channel, as a dequantized "
                "int8 weight does): the quantizer's DequantizeLinear may have been folded into the file "
                "(onnxruntime's constant folding, as when a session saves optimized_model_filepath), in which case "
                "their quantization error counts in every configuration and cannot be bypassed; pass the float "
                "model to tell, or analyse the file saved before constant folding")

    def _drop_unchanging_outputs(self):
        """Leave out of the tool's copy, with a note, the model outputs no configuration
        changes: an initializer (no session computes it), and the integer tensor inside a Q/DQ
        pair (the engine replaces the pair; its dequantized value is what the model computes
        with); an output listed twice is kept once."""
        # a fused fake-quant node (Quark's BFP) is its own pair: its output is float, the model's
        inner = {c.q_node.output[0]: c.name for c in self.calibration.values() if c.q_node is not None and not c.fused}
        graph = self.model.graph
        kept, seen = [], set()
        for o in graph.output:
            why = ("is listed twice: it is compared once" if o.name in seen
                   else "is an initializer, which no configuration changes: it is left out of every comparison"
                   if o.name in self.inits
                   else f"is the integer tensor inside pair {inner[o.name]!r}, which the analyses replace with its "
                        "dequantized value: it is left out of every comparison" if o.name in inner else None)
            if why is None:
                seen.add(o.name)
                kept.append(onnx.ValueInfoProto.FromString(o.SerializeToString()))
            else:
                self.notes.append(f"model output {o.name!r} {why}")
        if len(kept) == len(graph.output):
            return
        if not kept:
            raise PTQError(f"model {self.source!r} has no output that quantization changes (each is an initializer "
                           "or the integer tensor of a Q/DQ pair); export the model with its computed outputs")
        del graph.output[:]
        graph.output.extend(kept)
        self.output_names = [o.name for o in kept]

    def _note_unjudged_outputs(self):
        """A note for each output whose values no output metric can weigh (a bool mask, integer
        ids): left out of the default comparisons where float outputs are judged (see
        :func:`~pytest_ptq.outputs.parse_outputs`), judged all the same where none is."""
        floats = any(self.is_float_tensor(n) for n in self.output_names)
        for n in self.output_names:
            if self.is_float_tensor(n):
                continue
            said, source = self.unjudged(n)
            self.notes.append(said + (": the comparisons judge the float outputs; name it (output_node / "
                                      "--output-node) to compare it all the same" if floats else
                                      ": with no float output the comparisons judge it all the same; name "
                                      f"{source or 'a float tensor'!r} (output_node / --output-node) to judge that"))

    def unjudged(self, output):
        """``(sentence, float tensor or None)`` for an output of ids or a mask: what it holds,
        and the float tensor it is computed from (see :meth:`float_source`)."""
        t = self.value_types.get(output)
        what = onnx.TensorProto.DataType.Name(t).lower() if t is not None else "non-float"
        source = self.float_source(output)
        origin = "" if source is None else (f"; {self.producer[source[1]].op_type} {self.producer[source[1]].name!r} "
                                            f"computes it from the float tensor {source[0]!r}")
        return (f"model output {output!r} holds {what} values (a mask or ids?), which no output metric can weigh (a "
                f"change of every id may read as none){origin}", None if source is None else source[0])

    def float_source(self, tensor, steps=8):
        """``(float tensor, the tensor it leads to)`` for a non-float ``tensor``: walking back
        through its producers, the first float tensor one of them reads (the scores an ArgMax
        or TopK turns into ids, the values a comparison turns into a mask; before the pair
        that quantizes them, if any), or None."""
        for _ in range(steps):
            node = self.producer.get(tensor)
            if node is None:
                return None
            inputs = [i for i in node.input if i and not self.is_constant(i)]
            found = next((i for i in inputs if self.is_float_tensor(i)), None)
            if found is not None:
                # a pair's output is no node's: the tensor the pair quantizes is, unless the
                # model outputs it (its name is the one a user knows)
                return (found if found in self.output_names else self.source_of(found)), node.output[0]
            if not inputs:
                return None
            tensor = inputs[0]
        return None

    def _control_flow(self):
        """``[(node, nodes inside, quantized nodes inside)]`` of the main graph's If/Loop/Scan
        nodes, nested subgraphs included; the quantized ones (:data:`.formats.QUANTIZED_OPS`:
        Q/DQ, a QOperator or dynamic file's integer ops) as a Counter of op types."""
        def inside(node):
            nodes, quantized = 0, Counter()
            for g in subgraphs(node):
                for n in g.node:
                    deeper = inside(n)
                    nodes += 1 + deeper[0]
                    quantized += deeper[1]
                    if n.op_type in formats.QUANTIZED_OPS:
                        quantized[n.op_type] += 1
            return nodes, quantized

        return [(n, *inside(n)) for n in self.model.graph.node if has_subgraphs(n)]

    def inner_qdq(self, flow=None):
        """``"N quantized node(s) (2 QuantizeLinear, 2 DequantizeLinear) inside the subgraphs of
        If 'x'"``, or "" where no subgraph holds any: they stay as stored in every
        configuration. ``flow``: :meth:`_control_flow`'s list, where already walked."""
        holders = [h for h in (self._control_flow() if flow is None else flow) if h[2]]
        if not holders:
            return ""
        ops = sum((h[2] for h in holders), Counter())
        return (f"{sum(ops.values())} quantized node(s) ({', '.join(f'{n} {op}' for op, n in ops.most_common())}) "
                f"inside the subgraphs of {holders[0][0].op_type} {holders[0][0].name!r}"
                + (f" and {len(holders) - 1} other control-flow node(s)" if len(holders) > 1 else ""))

    def _note_inner_pairs(self):
        """A note where Q/DQ nodes live in subgraphs beside the main graph's pairs: the analyses
        see the main graph's only; and where a subgraph of many nodes stays float beside them
        (onnxruntime's quantizers leave If/Loop/Scan bodies so), whose inputs are quantized."""
        flow = self._control_flow()
        inner = self.inner_qdq(flow)
        if inner:
            self.notes.append(f"{inner} are not analysed: the rankings, curves and verdicts cover the main graph's "
                              "pairs only (export the branch inline to analyse it)")
        for node, nodes, quantized in flow:
            if not quantized and nodes >= FLOAT_BODY:
                self.notes.append(f"the {nodes} nodes inside the subgraphs of {node.op_type} {node.name!r} stay in "
                                  "float (the quantizer left them so): the analyses rank the main graph's pairs, among "
                                  f"them those feeding the {node.op_type}, whose error it carries on")

    def _inside_control_flow(self):
        """Why a model without pairs in its main graph is not the float one, where most of its
        nodes, or any Q/DQ, live in If/Loop/Scan subgraphs (onnxruntime's quantizers leave those in
        float); else None."""
        holders = self._control_flow()
        if not holders:
            return None
        inner, qdq = sum(h[1] for h in holders), sum(sum(h[2].values()) for h in holders)
        if not qdq and inner * 2 < len(self.model.graph.node) + inner:
            return None
        big = max(holders, key=lambda h: h[1])[0]
        where = (f"the subgraphs of its {big.op_type} node {big.name!r}" +
                 (f" and {len(holders) - 1} other control-flow node(s)" if len(holders) > 1 else ""))
        found = (f"its {qdq} quantized node(s) are all inside {where}" if qdq else
                 f"{inner} of its {len(self.model.graph.node) + inner} nodes are inside {where}, which "
                 "onnxruntime's quantize_static and quantize_dynamic leave in float")
        return (f"model {self.source!r} has no QuantizeLinear/DequantizeLinear pairs in its main graph: {found}; "
                "pytest-ptq analyses the main graph's pairs, so export the model without that control flow (its "
                "branch inputs fixed, or the loop unrolled) and quantize that")

    # -- parsing -------------------------------------------------------------------------
    def _infer_types(self):
        types, shapes = {}, {}
        for v in formats.inferred_values(self.model):
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                types[v.name] = v.type.tensor_type.elem_type
                if v.type.tensor_type.HasField("shape"):
                    shapes[v.name] = declared_dims(v)
        for name, init in self.inits.items():
            types[name] = init.data_type
            shapes[name] = list(init.dims)
        self.shapes = shapes
        return types

    def constant(self, name):
        """The numpy value of an initializer or Constant output (also through Identity or
        Cast of one, as fp16 exports store scales, and through the layout ops an export puts
        before a weight's pair: Reshape, Transpose, Squeeze, Unsqueeze, Flatten), or None."""
        if name in self._constant_cache:
            return self._constant_cache[name]
        value = None
        if name in self.shared:
            value = self.shared[name]
        elif name in self.inits:
            value = numpy_helper.to_array(self.inits[name])
        elif name in self.constants:
            t = attribute(self.constants[name], "value")
            value = numpy_helper.to_array(t) if t is not None else None
        elif name in self.producer and self.producer[name].op_type in ("Identity", "Cast"):
            node = self.producer[name]
            src = self.constant(node.input[0])
            if src is not None and node.op_type == "Cast":
                src = src.astype(onnx.helper.tensor_dtype_to_np_dtype(attribute(node, "to")))
            value = src
        elif name in self.producer and self.producer[name].op_type in LAYOUT_OPS:
            node = self.producer[name]
            src = self.constant(node.input[0])
            value = None if src is None else laid_out(node, np.asarray(src), self.constant, repr(self.source))
        self._constant_cache[name] = value
        return value

    def is_constant(self, name):
        return self.constant(name) is not None

    def transient_constant(self, name):
        """:meth:`constant` for one look (a check on load): a value not kept before is not kept
        after, so that looking at every weight leaves no decoded copy of each beside the file."""
        cached = name in self._constant_cache
        value = self.constant(name)
        if not cached and name not in self.shared:
            self._constant_cache.pop(name, None)
        return value

    def upstream(self, tensor):
        """The tensors ``tensor`` is computed from (itself included): what may change it."""
        seen, todo = {tensor}, [tensor]
        while todo:
            n = self.producer.get(todo.pop())
            for i in () if n is None else node_refs(n) if has_subgraphs(n) else n.input:
                if i and i not in seen:
                    seen.add(i)
                    todo.append(i)
        return seen

    def readers(self, tensor):
        """Main-graph nodes that read ``tensor``, as an input or inside one of their subgraphs
        (an If branch reading the outer scope), graph order."""
        if self._readers is None:  # indexed once: asked once per pair
            self._readers = defaultdict(list)
            for n in self.model.graph.node:
                for r in dict.fromkeys(node_refs(n) if has_subgraphs(n) else n.input):
                    self._readers[r].append(n)
        return list(self._readers.get(tensor, ()))

    def _float_cast(self, name):
        """Whether normal node ``name`` is a Cast from one float type to another."""
        n = self.normal.get(name)
        return n is not None and n.op_type == "Cast" and self.is_float_tensor(n.inputs[0]) and \
            self.is_float_tensor(n.outputs[0])

    def through_casts(self, names, downstream=True):
        """Normal nodes ``names`` with each Cast between float types replaced by the nodes it
        feeds (``downstream``) or the one feeding it, repeatedly: the node a pair quantizes
        where a float16 graph computes it in float32 (DequantizeLinear, Cast, MatMul), or the
        reverse. Order kept, no repeats."""
        out = []
        for name in names:
            if not self._float_cast(name):
                out.append(name)
                continue
            n = self.normal[name]
            nxt = [r.name for r in self.consumers.get(n.outputs[0], ())] if downstream else \
                [self.producer[n.inputs[0]].name] if n.inputs[0] in self.producer else []
            out += self.through_casts([m for m in nxt if m in self.normal], downstream)
        return list(dict.fromkeys(out))

    def quantizers_through_casts(self, name):
        """The calibration nodes feeding normal node ``name``, directly or through Casts
        between float types (see :meth:`through_casts`)."""
        node, out = self.normal[name], list(self.normal[name].calibration_inputs)
        for i in node.inputs:
            if i in self.producer and self._float_cast(self.producer[i].name):
                out += self.quantizers_through_casts(self.producer[i].name)
        return list(dict.fromkeys(out))

    def quantizing(self, name):
        """The calibration nodes quantizing normal node ``name``: its inputs', directly or
        through Casts between float types (:meth:`quantizers_through_casts`), the earlier pairs
        of a chain on its input, then its model outputs' (:attr:`NormalNode.quantizers`). A pair
        of :attr:`unowned` quantizes only itself."""
        if name in self.unowned:
            return [name]
        n = self.normal[name]
        return list(dict.fromkeys([*self.quantizers_through_casts(name), *n.calibration_chained,
                                   *n.calibration_outputs]))

    def counts_for(self, name):
        """The normal nodes calibration node ``name`` counts for, as the operator ranking counts
        it (:meth:`quantizing`): those it quantizes the input of (:meth:`feeds`), then, for an
        earlier pair of a requantize chain, the operators reading the chain's later pairs
        (:attr:`NormalNode.calibration_chained`), which no operator reads the output of. Never
        a node that reads only shapes (a Shape of the pair's output: no ranking row)."""
        return [n for n in dict.fromkeys([*self.feeds(name), *self._chained_into.get(name, ())]) if self.ranks(n)]

    def owner(self, name):
        """The normal node that owns calibration node ``name``, a pair no operator reads on a
        model output that node computes (:attr:`NormalNode.calibration_outputs`), whose
        ranking entry counts it; None for any other pair (:meth:`counts_for` names the
        operators those count for, :attr:`unowned` those that rank on their own)."""
        return self._owners.get(name)

    def delivered(self, name):
        """The model outputs normal node ``name``'s own pairs write (:attr:`NormalNode.calibration_outputs`),
        through Casts between float types, then those its own outputs become through such Casts
        only (Conv -> Cast to float16 -> model output), in order: where its error is read, what
        the model delivers and the rankings score (a detector head's Concat behind its pair);
        empty for a node doing neither, and for such a Cast itself (:meth:`passes_on`)."""
        n = self.normal[name]
        if self.passes_on(name):
            return []
        owned = [o for c in n.calibration_outputs for o in self.cast_on(self.calibration[c].outputs)]
        cast = [o for o in self.cast_on(n.outputs) if o not in n.outputs]
        outputs = set(self.output_names)
        return [o for o in dict.fromkeys(owned + cast) if o in outputs]

    def requantizes(self, name):
        """The calibration node whose output calibration node ``name`` quantizes again (the
        pair before it in a requantize chain Q-DQ-Q-DQ), or None."""
        return self._requantizes.get(name)

    def _back_to_head(self, name):
        """Calibration node ``name`` and the pairs it quantizes again, back to its chain's head."""
        walk = [name]
        while (earlier := self.requantizes(walk[-1])) is not None and earlier not in walk:
            walk.append(earlier)
        return walk

    def chain_head(self, name):
        """The calibration node of the first pair of the requantize chain calibration node
        ``name`` is in (``name``'s own where it quantizes no pair's output): the pair on the
        float tensor every pair of the chain quantizes again, which the float model and a
        quantizer's settings name."""
        return self.calibration[self._back_to_head(name)[-1]]

    def chain_position(self, name):
        """How many pairs calibration node ``name`` quantizes again: 0 for a requantize chain's
        head or a pair in no chain, 1 for the pair reading the head's, ..."""
        return len(self._back_to_head(name)) - 1

    def chain(self, name):
        """Every pair of the requantize chain calibration node ``name`` is in, first to last
        (``[name]`` where it is in none)."""
        return self.requantized_through(self.chain_head(name).name)

    def requantized_through(self, name):
        """Calibration node ``name`` and the pairs of its requantize chain after it (each
        quantizing the one before again), in order: ``[name]`` where no pair reads its output."""
        return list(self._chains.get(name, [name]))

    def reads_pairs(self, name):
        """Whether normal node ``name`` reads calibration nodes, directly or, unless it is such
        a Cast itself, through Casts between float types: a node whose local clone quantizes
        its inputs (:meth:`has_local_error` adds those owning pairs on model outputs)."""
        return bool(self.normal[name].calibration_inputs) or (
            not self.passes_on(name) and bool(self.quantizers_through_casts(name)))

    def has_local_error(self, name):
        """Whether normal node ``name`` has a local error: it reads pairs (:meth:`reads_pairs`)
        or its own pairs write model outputs (:meth:`delivered`), whose loss is its own even
        where its inputs are float (a Concat of float tensors behind its pair)."""
        return self.reads_pairs(name) or bool(self.normal[name].calibration_outputs)

    @property
    def weight_only(self):
        """Whether the model quantizes weights only: no activation has a pair, calibrated or
        dynamic (block-wise int4 from a weight-only quantizer, MatMulNBits rewritten)."""
        return not (self.of_kind("activation") or self.of_kind("dynamic"))

    def passes_on(self, name):
        """Whether normal node ``name`` is a Cast between float types: the pairs it reads are
        the nodes' it feeds (:meth:`quantizing`), or, before a model output, the pairs of the
        node that computed it (:attr:`NormalNode.calibration_outputs`); an operator ranking
        names those, not it."""
        return self._float_cast(name)

    def feeds(self, name):
        """The normal nodes calibration node ``name`` quantizes the input of: its consumers,
        through Casts between float types (:meth:`through_casts`)."""
        return self.through_casts([n for n in self.calibration[name].consumers if n in self.normal])

    def cast_on(self, tensors):
        """``tensors`` and what Casts between float types make of them, repeatedly (a float16
        graph's output cast back to float32 behind its pair)."""
        out = list(tensors)
        for t in out:
            out += [n.output[0] for n in self.consumers.get(t, ()) if self._float_cast(n.name)]
        return out

    def uncast(self, tensor):
        """``(source, casts)``: the tensor that Casts between float types make ``tensor`` of,
        repeatedly (the reverse of :meth:`cast_on`), and those Casts' names, the last one first."""
        casts = []
        while tensor in self.producer and self._float_cast(self.producer[tensor].name):
            casts.append(self.producer[tensor].name)
            tensor = self.producer[tensor].input[0]
        return tensor, casts

    def credited(self, name):
        """The operators whose ranking entries count calibration node ``name`` (the inverse of
        :meth:`quantizing`): those it :meth:`counts_for`, then its :meth:`owner`; ``[name]``
        for a pair of :attr:`unowned`, ranked on its own."""
        if name in self.unowned:
            return [name]
        return list(dict.fromkeys([*self.counts_for(name), *filter(None, [self.owner(name)])]))

    def ranks(self, name):
        """Whether an operator ranking has a row for normal node ``name``: not for a node that
        reads only shapes (Shape, Size), whose row would carry its input pair's figure, which
        the pair's other readers carry, nor for a Cast between float types (:meth:`passes_on`)."""
        return self.normal[name].op_type not in formats.SHAPE_ONLY and not self.passes_on(name)

    def _qparams(self, node, qtype):
        where = f"node {node.name!r} of {self.source!r} "
        scale = self.constant(node.input[1]) if len(node.input) > 1 else None
        source = self.producer.get(node.input[1]) if len(node.input) > 1 else None
        if scale is None and source is not None and source.op_type == "DequantizeLinear":
            raise PTQError(f"{where}takes its scale {node.input[1]!r} from DequantizeLinear {source.name!r}: a "
                           "two-level block scale, as NVIDIA Model Optimizer's NVFP4 and MXFP8 exports for TensorRT "
                           "write it; pytest-ptq runs models in onnxruntime, which has no kernel for float4 and reads "
                           "no such chain: analyse the model's int8, fp8 or int4 QDQ export")
        if scale is None:
            raise PTQError(f"{where}takes its scale {node.input[1] if len(node.input) > 1 else ''!r} from a "
                           "computed tensor; pytest-ptq reads constant scales, and ranges computed per run only "
                           "from DynamicQuantizeLinear (quantize_dynamic at opset 11 or later writes it)")
        grid = grids.grid_of(qtype, where)
        zp = self.constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        zp = np.zeros_like(scale, dtype=np.float64) if zp is None or grid.is_float else np.asarray(zp).astype(np.int64)
        block_size = int(attribute(node, "block_size", 0) or 0)
        axis = None
        if scale.size > 1 or block_size:
            axis = self._valid_axis(node, int(attribute(node, "axis", 1)), scale)
        self._check_params(node, scale, zp, axis, block_size)
        return scale.astype(np.float32), zp, axis, block_size, grid

    def _check_params(self, node, scale, zp, axis, block):
        """Refuse, in one sentence, a scale or zero point whose values or shape onnxruntime
        would turn into NaN or refuse; note scales of zero, below zero or nearly zero (values
        that dequantize to 0 or to the wrong side). A negative scale flips the grid, which
        onnxruntime's symmetric block quantizer does on purpose on weights (its codes reach -8
        on the weights' larger side): only there is it not noted."""
        where = f"{node.op_type} {node.name!r} of {self.source!r}"
        values = np.asarray(scale, np.float64)
        if np.isinf(values).any() and node.op_type == "QuantizeLinear" and node.input[0] in self.producer:
            # a range calibrated on a tensor that holds infinities by design (an attention mask
            # filled with -inf): calibrating again gives the same
            pairs, readers = self._infinite_pairs()
            others = f" (and {len(pairs) - 1} more such pair(s))" if len(pairs) > 1 else ""
            raise PTQError(f"{where} has a scale of inf ({node.input[1]!r}){others}: the range of {node.input[0]!r} "
                           "it quantizes was infinite on the calibration data (a tensor that holds infinities, as "
                           "an attention mask filled with -inf does), and calibrating again gives the same; quantize "
                           "the float model again with the nodes reading such pairs left in float (nodes_to_exclude="
                           f"{readers!r} with quantize_static), or fill the mask with a finite value such as -1e4")
        if not np.isfinite(values).all():
            raise PTQError(f"{where} has a scale of {values.ravel()[~np.isfinite(values.ravel())][0]} "
                           f"({node.input[1]!r}); a scale is the step of the quantization grid, a finite positive "
                           "number: re-calibrate the model, or fix that initializer")
        # one zero point per scale ([1] beside a scalar is per tensor too, as quantize_static's biases)
        if np.size(zp) != values.size and len(node.input) > 2 and node.input[2]:
            raise PTQError(f"{where} has a zero point of shape {list(np.shape(zp))} ({node.input[2]!r}) beside a "
                           f"scale of shape {list(values.shape)}; they must have the same shape, one zero point "
                           "per scale: fix the export")
        if axis is not None and not block:
            shape = self.shapes.get(node.input[0])
            channels = shape[axis] if shape is not None and -len(shape) <= axis < len(shape) else None
            if values.ndim != 1 or (isinstance(channels, int) and channels > 0 and channels != values.size):
                there = f", which has {channels} there" if isinstance(channels, int) and channels > 0 else ""
                raise PTQError(f"{where} has a scale of shape {list(values.shape)} for axis {axis} of its input "
                               f"{node.input[0]!r}{there}; per-channel quantization takes one scale per channel, a "
                               "1-D scale as long as that axis: fix the export")
        if block:
            shape = self.shapes.get(node.input[0])
            known = shape is not None and all(isinstance(d, int) and d > 0 for d in shape)
            want = [-(-d // block) if k == axis % len(shape) else d for k, d in enumerate(shape)] if known else None
            if known and -len(shape) <= axis < len(shape) and list(values.shape) != want:
                raise PTQError(f"{where} has a scale of shape {list(values.shape)} for blocks of {block} along axis "
                               f"{axis} of its input {node.input[0]!r} of shape {shape}; block-wise quantization "
                               f"takes a scale of shape {want} (one per block along the axis, the input's size "
                               "elsewhere), and onnxruntime refuses this one: fix the export")
        magnitude = np.abs(values)
        if (magnitude == 0).any():
            self.notes.append(f"{where} has a scale of 0 ({node.input[1]!r}): its values dequantize to 0 there; a "
                              "scale should not be 0 (re-calibrate the model)")
        elif (values < 0).any() and not (block and self.is_constant(node.input[0])):
            self.notes.append(f"{where} has a scale of {values.ravel()[np.argmin(values)]:g} ({node.input[1]!r}), "
                              "below zero: its grid is mirrored, covering the negated range (the threshold shown is "
                              "of its magnitude), so a range not symmetric about 0 saturates; a scale should be "
                              "positive (re-calibrate the model, or fix that initializer)")
        elif (magnitude < grids.SMALLEST_NORMAL).any():
            self.notes.append(f"{where} has a scale of {values.ravel()[np.argmin(magnitude)]:g} ({node.input[1]!r}), "
                              f"below float32's smallest normal number ({grids.SMALLEST_NORMAL:g}): its values saturate "
                              "or dequantize to nearly 0 there, as with a scale of 0 (re-calibrate the model)")

    def _infinite_pairs(self):
        """``(QuantizeLinear names, names of the nodes reading their DequantizeLinears)`` of
        every pair with an infinite constant scale, in graph order: what quantize_static put
        the pairs there for (an Add of a -inf mask, then the Softmax after it)."""
        pairs, readers = [], []
        for q in self.model.graph.node:
            scale = self.constant(q.input[1]) if q.op_type == "QuantizeLinear" and len(q.input) > 1 else None
            if scale is None or not np.isinf(np.asarray(scale, np.float64)).any():
                continue
            pairs.append(q.name)
            readers += [r.name for d in self.consumers.get(q.output[0], ()) if d.op_type == "DequantizeLinear"
                        for r in self.consumers.get(d.output[0], ()) if r.name and r.op_type != "QuantizeLinear"]
        return pairs, list(dict.fromkeys(readers))

    def _valid_axis(self, node, axis, scale):
        """The per-axis quantization axis of ``node``, repaired in the tool's copy when a
        quantizer wrote one outside a 1-D input (a bias DQ with ``axis=1``: onnxruntime runs it
        only with its QDQ fusion on, and fails with the fake-quant the analyses need)."""
        shape = self.shapes.get(node.input[0])
        if shape is None or -len(shape) <= axis < len(shape):
            return axis
        where = (f"{node.op_type} {node.name!r} of {self.source!r} has axis {axis} on its {len(shape)}-D input "
                 f"{node.input[0]!r}")
        if len(shape) == 1 and shape[0] in (None, scale.size):
            for a in node.attribute:
                if a.name == "axis":
                    a.i = 0
            self.notes.append(f"{where}, which onnxruntime runs only with its QDQ fusion on; it is analysed with "
                              "axis 0 (fix the export: the axis of a 1-D tensor is 0)")
            return 0
        raise PTQError(f"{where}: out of range for that input; fix the export so that the axis indexes the "
                       "channels of the quantized tensor")

    def _qtype(self, node, tensor):
        """The quantized type of a Q's output or a DQ's input: from the graph's types, else
        the Q's ``output_dtype`` or zero point, else uint8 (QuantizeLinear's default)."""
        if tensor in self.value_types and self.value_types[tensor] not in FLOAT_TYPES:
            return self.value_types[tensor]
        out_dtype = attribute(node, "output_dtype", 0)
        if out_dtype:
            return out_dtype
        if len(node.input) > 2 and node.input[2]:
            zp = self.constant(node.input[2])
            if zp is not None:
                return onnx.helper.np_dtype_to_tensor_dtype(np.asarray(zp).dtype)
        return onnx.TensorProto.UINT8

    def _find_calibration_nodes(self):
        graph = self.model.graph
        found, used = [], set()
        for node in graph.node:
            if is_q(node):
                clipped = self._clipped(node)
                users = self.consumers[(clipped[0] if clipped else node).output[0]]
                dqs = [c for c in users if is_dq(c)]
                if not dqs or len(dqs) != len(users):
                    continue  # a Q feeding integer kernels is not a fake-quant pair
                qtype = self._qtype(node, node.output[0])
                scale, zp, axis, block, grid = self._qparams(node, qtype)
                if clipped:
                    clip, lo, hi = clipped
                    try:
                        grid = grids.narrowed(grid, grid.qmin if lo is None else lo, grid.qmax if hi is None else hi)
                    except PTQError as exc:
                        raise PTQError(f"node {clip.name!r} of {self.source!r} {exc}; check the export") from None
                kind = "weight" if self.is_constant(node.input[0]) else "activation"
                c = self._calib(node.name, kind, node.input[0], node, dqs, scale, zp, axis, block, grid)
                c.between = [clipped[0]] if clipped else []
                found.append(c)
                used.update(d.name for d in dqs)
        for node in graph.node:
            if is_fused(node):
                found.append(self._fused(node))
            elif node.op_type == "DynamicQuantizeLinear":
                c = self._dynamic(node)
                if c is not None:
                    found.append(c)
                    used.update(d.name for d in c.dq_nodes)
        for node in graph.node:
            if is_dq(node) and node.name not in used and self.is_constant(node.input[0]):
                qtype = self._qtype(node, node.input[0])
                scale, zp, axis, block, grid = self._qparams(node, qtype)
                c = self._calib(node.name, "weight", node.input[0], None, [node], scale, zp, axis, block, grid)
                c.role = "bias" if qtype == onnx.TensorProto.INT32 else ""
                found.append(c)
        return {c.name: c for c in found}

    def _clipped(self, q):
        """``(clip, low, high)`` for an integer Clip that alone reads Q node ``q``'s codes and
        only DQs read (a bound it leaves out is None), else None. PyTorch exports its (0, 127)
        activation range so (QuantizeLinear, Clip to 127, DequantizeLinear) and Brevitas its
        sub-8-bit grids (QCDQ): one fake-quant on the narrower grid."""
        users = self.consumers[q.output[0]]
        if len(users) != 1 or users[0].op_type != "Clip" or users[0].domain not in ("", "ai.onnx"):
            return None
        clip = users[0]
        readers = self.consumers[clip.output[0]]
        if (clip.input[0] != q.output[0] or not readers or not all(is_dq(r) for r in readers)
                or clip.output[0] in self.output_names):
            return None
        bounds = []
        for k in (1, 2):
            name = clip.input[k] if len(clip.input) > k else ""
            value = self.constant(name) if name else None
            if name and (value is None or np.size(value) != 1 or np.asarray(value).dtype.kind not in "iu"):
                return None  # computed or non-integer bounds: not a grid
            bounds.append(None if value is None else float(np.asarray(value).reshape(())))
        return clip, bounds[0], bounds[1]

    def _mark_on_grid(self):
        """Flag float weights behind a pair that are already rounded onto its grid (aimet and
        QAT exports): bypassing such a pair changes nothing, so only the float model can show
        the weight's quantization error."""
        for c in self.of_kind("weight"):
            w = self.constant(c.input) if c.q_node is not None and not c.grid.is_custom else None
            if w is None or np.size(w) < 8 or np.asarray(w).dtype.kind != "f":
                continue
            w, quantizer = np.asarray(w, np.float32), c
            if w.size > _ON_GRID_SAMPLE and w.ndim >= 2:
                # a few slices tell as well as the whole tensor, at a fraction of the memory: across
                # the channels, or the first rows with their blocks' scales
                if c.block_size:
                    rows, quantizer = next(c.row_blocks(w.shape, _ON_GRID_SAMPLE))
                    w = w[rows]
                else:
                    other = 1 if c.axis is not None and c.axis % w.ndim == 0 else 0
                    w = np.take(w, range(min(w.shape[other], 8)), axis=other)
            close = np.abs(quantizer.fake_quant(w) - w) <= 1e-6 * np.abs(w) + 1e-12
            c.on_grid = bool(close.mean() >= 0.999)
            # a weight left in its file: the pages read go back, so that loading a model
            # does not leave every weight resident (a 192 MiB model: 184 MiB); one decoded from
            # the proto is not kept beside it (a copy of every small weight, 8 MiB of an
            # 8000-node MatMul stack's 8 MiB)
            hand_back(mapping(self.constant(c.input)))
            if c.input not in self.shared:
                self._constant_cache.pop(c.input, None)

    def _dynamic(self, node):
        """A DynamicQuantizeLinear whose three outputs only feed DequantizeLinear nodes: an
        activation quantizer whose range is computed on every run (kind ``dynamic``)."""
        dqs = [c for c in self.consumers[node.output[0]] if is_dq(c)]
        if not dqs or len(dqs) != len(self.consumers[node.output[0]]):
            return None
        readers = {c.name for t in node.output[1:] for c in self.consumers[t]}
        if not readers <= {d.name for d in dqs} or any(list(d.input[1:3]) != list(node.output[1:3]) for d in dqs):
            return None
        grid = grids.grid_of(onnx.TensorProto.UINT8)
        c = self._calib(node.name, "dynamic", node.input[0], node, dqs, np.full(1, np.nan, np.float32),
                        np.zeros(1, np.int64), None, 0, grid)
        c.producer = self.producer[node.input[0]].name if node.input[0] in self.producer else None
        return c

    def _fused(self, node):
        """A custom node that is a whole fake-quant: its numbers are its op's business."""
        bits = int(attribute(node, "bit_width", 16) or 16)
        grid = grids.custom(f"{node.domain}::{node.op_type}", bits)
        kind = "weight" if self.is_constant(node.input[0]) else "activation"
        c = self._calib(node.name, kind, node.input[0], node, [node], np.ones(1, np.float32),
                        np.zeros(1, np.float64), None, 0, grid)
        c.fused = True
        return c

    def _calib(self, name, kind, inp, q, dqs, scale, zp, axis, block, grid):
        s = np.abs(scale.astype(np.float64).reshape(-1))
        if grid.is_custom:
            threshold = float("inf")
        elif kind == "dynamic":
            threshold = float("nan")  # set by each run's range
        elif grid.is_float:
            threshold = float(np.max(s * grid.qmax))
        else:
            z = np.broadcast_to(zp.astype(np.float64).reshape(-1), s.shape)
            threshold = float(np.max(s * np.maximum(grid.qmax - z, z - grid.qmin)))
        producer = self.producer[inp].name if kind == "activation" and inp in self.producer else None
        return CalibrationNode(name=name, kind=kind, input=inp, q_node=q, dq_nodes=dqs, scale=scale,
                               zero_point=zp, axis=axis, qtype=grid.dtype, grid=grid, threshold=threshold,
                               block_size=block, producer=producer)

    def _map_normal_nodes(self):
        dq_out, calib_nodes = {}, set()
        for c in self.calibration.values():
            for dq in c.dq_nodes:
                dq_out[dq.output[0]] = c.name
                calib_nodes.add(dq.name)
            if c.q_node is not None:
                calib_nodes.add(c.q_node.name)
            calib_nodes.update(b.name for b in c.between)
        self.normal = {}
        for node in self.model.graph.node:
            if node.name in calib_nodes or node.op_type == "Constant":
                continue
            feeding = []
            for i in node.input:
                if i in dq_out and dq_out[i] not in feeding:
                    feeding.append(dq_out[i])
            n = NormalNode(node.name, node.op_type, list(node.input), list(node.output), feeding, len(self.normal))
            self.normal[node.name] = n
            for cname in feeding:
                self.calibration[cname].consumers.append(node.name)
        # a pair whose DQ output another pair quantizes again (a requantize chain Q-DQ-Q-DQ)
        # is no operator's input: the operators reading the chain's last pair read it too
        # (pair -> the pair whose output it quantizes again, see requantizes)
        self._requantizes = {c.name: dq_out[c.input] for c in self.calibration.values()
                             if c.input in dq_out and dq_out[c.input] != c.name}
        after = defaultdict(list)
        for later, earlier in self._requantizes.items():
            after[earlier].append(later)

        chains = {}  # pair -> the pairs its chain passes through from it on, in order

        def chain(name):  # each worked out once: the owners' loop below reads it again
            if name not in chains:
                chains[name] = list(dict.fromkeys([name, *(x for a in after[name] for x in chain(a))]))
            return chains[name]

        self._chained_into = {}  # pair -> the operators it counts for through its chain (counts_for)
        for c in self.calibration.values():
            own = self.feeds(c.name)
            for n in dict.fromkeys(r for a in chain(c.name)[1:] for r in self.feeds(a)):
                if n not in own:
                    self.normal[n].calibration_chained.append(c.name)
                    self._chained_into.setdefault(c.name, []).append(n)
        self._chains = chains  # every pair's, worked out in the loop above (requantized_through)
        outputs = set(self.output_names)
        # pairs no operator reads or computes (a graph input straight through a pair to a model
        # output): an operator ranking would leave their loss out, so it ranks each on its own
        self.unowned = []
        self._owners = {}  # pair -> the operator whose model output it quantizes (owner)
        for c in self.calibration.values():
            # a float16 graph's model output is often its last pair's value cast to float32
            # (or the pair's input a float32 value cast to float16): the node behind owns it
            links = chain(c.name)
            # a Shape reading the output reads no value: the pair is still the producer's
            if any(self.ranks(n) for a in links for n in self.feeds(a)) or not outputs.intersection(
                    self.cast_on([t for a in links for t in self.calibration[a].outputs])):
                continue
            head = self.chain_head(c.name)
            producer = self.producer[head.input].name if head.input in self.producer else None
            owner = self.through_casts([producer], downstream=False) if producer in self.normal else []
            for n in owner[:1]:
                self.normal[n].calibration_outputs.append(c.name)
                self._owners[c.name] = n
            if not owner:
                self.unowned.append(c.name)

    def full_model(self):
        """The (sorted, named) model with every initializer's data back in the proto."""
        return restore(self.model, self.shared)

    # -- queries -------------------------------------------------------------------------
    @property
    def format(self):
        """How the file is quantized, in a word: ``QDQ`` (Q/DQ pairs and lone DQs),
        ``QOperator`` (QLinear ops), ``dynamic`` (DynamicQuantizeLinear and integer ops) or
        ``mixed``; :attr:`format_label` names what a mixed one mixes."""
        return self._format

    def as_given(self):
        """The model as its file holds it (QOperator, dynamic, or QDQ whose pairs lay their codes
        out between Q and DQ, see :mod:`.moved`, or whose codes a Gather moves before their DQ,
        see :func:`.formats.to_qdq`): what onnxruntime's integer kernels run. Any
        other QDQ model is :attr:`model` itself, not read again: the tool's other changes to it
        (a sorted graph, unique node names) change no kernel onnxruntime picks. Its nodes get
        unique names here too: onnxruntime refuses a file whose nodes share one, which the tool's
        own copy runs with; and each Transpose without perm of known rank its reversed dims, as
        in the tool's copy (see :mod:`.moved`)."""
        if self._given is None:
            return self.model
        model = load_model(self._given)[0]  # a copy: the caller's proto stays as it is
        name_nodes(model.graph)
        # onnxruntime 1.28 aborts the process loading a Transpose without perm of known rank beside
        # a per-channel Q or DQ; its reversed dims, written, are what it runs (as in the tool's copy,
        # whose notes name each such Transpose, see moved.hoist)
        moved.write_perms(model.graph.node, formats.dims_of(model))
        return model

    def aligned_with(self, float_model):
        """This model parsed again beside ``float_model`` (see :mod:`.align`), from the file as
        given where the tool's copy departs from it (:meth:`as_given`), so that what runs the
        file as onnxruntime deploys it (a kernel's cause, the simulation's gap) runs that file
        and not the copy; from the copy, its weights shared, where the two run alike."""
        return QuantModel(self.model if self._given is None else self._given, float_model=float_model,
                          shared=self.shared)

    def of_kind(self, kind):
        """Calibration nodes of ``kind`` in graph order; ``activation`` includes the dynamic ones."""
        if kind == "activation":
            return [c for c in self.calibration.values() if c.is_activation]
        return [c for c in self.calibration.values() if c.kind == kind]

    def reduced_range(self, c):
        """The half grid ``(qmin, qmax)`` 8-bit weight ``c``'s codes keep to, reaching its
        bound: onnxruntime's reduce_range (int8 codes in [-64, 64], uint8 in [0, 127]); else
        None. A MinMax weight on the whole grid puts its extreme on the grid's end (127, -128
        or 255), never on 64. Reads the weight once, when first asked, and hands its pages back."""
        g = c.grid
        if c.kind != "weight" or c.role == "bias" or g.kind != "int" or g.bits != 8 or c.block_size:
            return None
        if c.name not in self._reduced:
            x = self.transient_constant(c.input)  # as _mark_on_grid: no copy of every weight kept
            self._reduced[c.name] = self._half_grid(c, x)
            hand_back(mapping(x))
        return self._reduced[c.name]

    def shown_grid(self, c):
        """``(dtype, threshold, lo, hi)`` of calibration node ``c`` as tables and plots show it:
        a reduce_range weight on its half grid ("int8 [-64, 64]", the range its codes reach),
        any other on its type's."""
        half = self.reduced_range(c)
        lo, hi = c.range(half)
        if half is None:
            return c.dtype_name, float(c.threshold), lo, hi
        return f"{c.dtype_name} [{half[0]}, {half[1]}]", float(max(np.max(-lo), np.max(hi))), lo, hi

    @staticmethod
    def _half_grid(c, x):
        g = c.grid
        if x is None or not np.size(x):
            return None
        x = np.asarray(x)
        if x.dtype.kind == "f":  # a float weight behind its pair: the codes it quantizes to
            s = grids.broadcast(c.scale.astype(np.float64), x.shape, c.axis, c.block_size)
            z = grids.broadcast(c.zero_point.astype(np.float64), x.shape, c.axis, c.block_size)
            x = g.quantize(grids.divided(x, s), z)
        lo, hi = float(np.min(x)), float(np.max(x))
        half = (-64, 64) if g.signed else (0, 127)
        reached = 64 in (-lo, hi) if g.signed else hi == 127
        return half if half[0] <= lo and hi <= half[1] and reached else None

    def takes_per_channel(self, c):
        """Whether onnxruntime can quantize weight ``c`` per channel: it does so for the weight
        input of the ops in :data:`PER_CHANNEL_OPS` only (a LayerNormalization's scale stays
        per tensor whatever ``per_channel`` says)."""
        return c.kind == "weight" and any(self.normal[n].op_type in PER_CHANNEL_OPS
                                          for n in c.consumers if n in self.normal)

    def symmetric_activations(self):
        """Whether every activation pair sits on its grid's middle code (0 signed, 128 for
        uint8): quantized with onnxruntime's ActivationSymmetric, whose wider grids centre
        there too."""
        acts = [c for c in self.of_kind("activation") if c.q_node is not None and not c.dynamic]
        return bool(acts) and all(np.all(c.zero_point == (0 if c.qrange[0] < 0 else (c.qrange[0] + c.qrange[1] + 1) // 2))
                                  for c in acts)

    def wider_type(self, c):
        """The integer type calibration node ``c`` can be widened to ("int16"), or None: it
        holds 16 bits already, sits on a float grid (fp8, whose wider form is float16), or the
        model is dynamic, or ``c`` is the dynamic part of a mixed one: a dynamic quantizer or a
        weight beside one (ConvInteger/MatMulInteger take 8-bit operands only, and
        quantize_dynamic has no 16-bit activation type), or ``c`` is a block-wise weight:
        MatMulNBits packs 2, 4 or 8 bits and the QDQ form MatMulNBitsQuantizer writes 4, so
        no quantizer makes 16-bit blocks (its 8 bits are requantized blocks, not this range
        on a finer grid, which is what the remedies simulate)."""
        if c.bit >= 16 or c.grid.is_float or self.format == "dynamic" or c.dynamic:
            return None
        if c.kind == "weight" and c.block_size:
            return None
        beside = (q for n in c.consumers if n in self.normal for q in self.normal[n].calibration_inputs)
        if c.kind == "weight" and any(self.calibration[q].dynamic for q in beside):
            return None
        return "int16"

    def names(self):
        """Every calibration and normal node name (a set)."""
        return set(self.calibration) | set(self.normal)

    def node(self, name):
        """The NodeProto of a node (normal or calibration) by name."""
        if self._protos is None:
            self._protos = {n.name: n for n in self.model.graph.node}
        return self._protos[name]

    def resolve_calibration(self, names):
        """Calibration node names for a list of calibration or normal node names."""
        out = []
        for name in params.names(names, "node names"):
            if name in self.calibration:
                out.append(name)
            elif name in self.normal:
                out.extend(self.quantizing(name))
            else:
                parts = [p.strip() for p in name.split(",")]
                if len(parts) > 1 and all(p in self.calibration or p in self.normal for p in parts):
                    # the command line's comma form, given to Python
                    raise PTQError(f"unknown node {name!r}: node names are not joined by commas here; give a list, "
                                   f"{parts!r}")
                raise unknown("node", name, list(self.calibration) + list(self.normal))
        return list(dict.fromkeys(out))

    def is_float_tensor(self, name):
        return self.value_types.get(name) in FLOAT_TYPES

    def shown_name(self, tensor):
        """The name the user's file gives ``tensor``, for whatever the tool shows or writes.

        The tool's copy of the graph holds tensors the file does not: a pair whose codes a
        layout node moves (see :mod:`.moved`) quantizes ``<out>::float``, the node run on the
        float tensor, which the file names by the tensor its QuantizeLinear reads; a QOperator
        file's rewrite names some float tensors anew (:attr:`float_names`). Any other tensor
        is the file's own and keeps its name. A moved pair's file name still names a tensor of
        the copy, the one its layout node now reads (the same values), so a tensor a user
        names back (an output, a subgraph's end) needs no mapping the other way."""
        return self.float_names.get(tensor, tensor)

    def file_layout(self, tensor, shape, axis=None):
        """``(shape, axis)`` as the user's file lays out ``tensor`` of the tool's copy, whose
        values have ``shape`` (``axis``: one of its axes, or None), for whatever the tool shows.

        A moved pair's tensor (see :meth:`shown_name`) is the file's tensor laid out by the
        chain's Transpose, Reshape, ...: the file's shape is that tensor's, the axis the one
        holding the same channels (a per-channel pair's: the axis of the file's
        QuantizeLinear), and channel indices along it are the same. The shape is None (or has
        None dims) where the file's is not known without running it, the axis None where the
        file has no axis of those channels (a Reshape merged them). Any other tensor is the
        file's own and keeps its layout."""
        shape = None if shape is None else list(shape)
        while tensor in self._moved and shape is not None:
            node = self.producer[tensor]
            tensor = node.input[0]
            value = self.constant(tensor)
            before = list(np.shape(value)) if value is not None else self.shapes.get(tensor)
            shape, axis = moved.undo(node, shape, axis, before)
        return shape, (None if axis is None or shape is None else axis % max(len(shape), 1))

    def file_axis(self, c, axis=None):
        """``axis`` of calibration node ``c``'s input (default: the axis of its scale, None for
        one scale) as the file lays the input out, the axis its QuantizeLinear has there (see
        :meth:`file_layout`); a moved pair's Transpose lays it elsewhere in the tool's copy."""
        axis = c.axis if axis is None else axis
        if axis is None or c.input not in self._moved:
            return axis
        value = self.constant(c.input)
        shape = self.shapes.get(c.input) if value is None else np.shape(value)
        return axis if shape is None else self.file_layout(c.input, [d or 0 for d in shape], axis)[1]

    def tool_axis(self, tensor, shape, axis):
        """The axis of ``tensor`` of the tool's copy (of ``shape``) that is axis ``axis`` of
        the file's layout (:meth:`file_layout`), or None where none is."""
        file_shape, _ = self.file_layout(tensor, shape)
        rank = len(shape) if file_shape is None else len(file_shape)
        if not -rank <= axis < max(rank, 1):
            return None
        return next((k for k in range(len(shape)) if self.file_layout(tensor, shape, k)[1] == axis % rank), None)

    def source_of(self, tensor):
        """The tensor a normal node reads with every Q/DQ bypassed: a DQ output maps to the
        pair's float input (or, for a lone DQ, its quantized initializer)."""
        c = self.by_output().get(tensor)
        return tensor if c is None else (c.float_weight or c.input)

    def by_output(self):
        """``{DQ output tensor: calibration node}``."""
        if self._by_output is None:
            self._by_output = {o: c for c in self.calibration.values() for o in c.outputs}
        return self._by_output

    def _on_integer_grid(self, tensor):
        value = self.transient_constant(tensor)
        try:
            return grids.integer_grid(value, GRID_LEVELS) is not None
        finally:
            hand_back(mapping(value))

    def unpaired_weights(self):
        """``[(node, input index, tensor)]``: the float constants (a matrix or more) that an
        operator onnxruntime quantizes the weight of (Conv, ConvTranspose, Gemm, MatMul) reads
        as its first or second input with no pair, where it reads the other of the two through
        a pair. Such a weight's quantization may have been folded into the file: onnxruntime's
        constant folding (a session saving ``optimized_model_filepath``) computes
        DequantizeLinear(codes) into a float initializer holding the quantized values."""
        by_output, out = self.by_output(), []
        for n in self.normal.values():
            if n.op_type not in PER_CHANNEL_OPS or len(n.inputs) < 2:
                continue
            for k, other in ((0, 1), (1, 0)):
                tensor = n.inputs[k]
                if tensor in by_output or other >= len(n.inputs) or n.inputs[other] not in by_output:
                    continue
                init = self.inits.get(tensor)
                if init is not None:  # its type and rank read from the proto: decoding it would keep a copy
                    weight = init.data_type in FLOAT_TYPES and len(init.dims) >= 2
                else:
                    value = self.constant(tensor) if tensor else None
                    weight = value is not None and value.dtype.kind == "f" and value.ndim >= 2
                if weight:
                    out.append((n.name, k, tensor))
        return out

    def folded_activation_suspects(self):
        """Activation pairs whose range starts at exactly 0 right after an op that can go
        negative, and which no Relu/Clip follows: where a quantizer that deletes Relu/Clip after
        folding them into the Q/DQ range would leave its mark. Only candidates: a range that
        starts at 0 is also what MinMax calibration gives any non-negative tensor, so the
        engine confirms them on data (see :mod:`pytest_ptq.engine.sanity`)."""
        out = []
        for c in self.of_kind("activation"):
            if c.folded is not None or c.dynamic:
                continue  # found in the float model: the bypass re-applies it; a dynamic range folds nothing
            lo, _ = c.range()
            prod = self.producer.get(c.input)
            kept = any(self.normal[n].op_type in ("Relu", "Clip") for n in self.feeds(c.name))
            empty = not np.all(c.scale >= grids.SMALLEST_NORMAL)  # a range of no width says nothing of a floor at 0
            if prod is not None and prod.op_type in _SIGNED_PRODUCERS and np.all(lo == 0) and not kept and not empty:
                out.append(c.name)
        return out


_ON_GRID_SAMPLE = 1 << 16

# Ops after which a tensor can be negative.
_SIGNED_PRODUCERS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "BatchNormalization",
                     "InstanceNormalization", "LayerNormalization", "Mul"}


def _weights(qm, tensors):
    """``weight 'a' (read by Conv 'c')``, or ``2 weights ('a' (...), 'b' (...))``, as the file names them."""
    readers = {t: n for n, _, t in reversed(qm.unpaired_weights())}
    readers.update({t: qm.consumers[t][0].name for t in tensors if t not in readers and qm.consumers.get(t)})
    shown = [f"{qm.shown_name(t)!r} (read by {qm.node(readers[t]).op_type} {readers[t]!r})" if t in readers
             else repr(qm.shown_name(t)) for t in tensors]
    return f"weight {shown[0]}" if len(shown) == 1 else f"{len(shown)} weights ({', '.join(shown)})"


def _unrestorable(init, axis, opset, listed):
    """Why a folded weight (its initializer, its grid's ``axis``) cannot be put back behind a
    DequantizeLinear in a model of ``opset``, or None where it can."""
    dtype = None if init is None else init.data_type
    if dtype is None or listed:
        return "it is no initializer of its own, or the graph lists it as an input or output"
    if dtype == onnx.TensorProto.FLOAT16:
        return ("DequantizeLinear gives float16 only from opset 19" + (f" and the file is at opset {opset}"
                if opset < 19 else ", and pytest-ptq restores float32 weights only"))
    if dtype != onnx.TensorProto.FLOAT:
        return f"DequantizeLinear gives no {onnx.TensorProto.DataType.Name(dtype).lower()} output"
    if axis is not None and opset < 13:
        return (f"its grid is per channel and DequantizeLinear takes an axis only from opset 13 (the file is at "
                f"opset {opset})")
    return None


def _ops(ops, shown=3):
    """``domain::Op`` names of custom ops, the first ``shown`` of them."""
    names = [f"{d}::{o}" for d, o in ops]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def custom_op_sentence(qm):
    """What to do when a model needs a custom-op library that was not given."""
    tensorrt = [(d, o) for d, o in qm.custom_ops if d == "trt" or d.startswith("trt.")]
    if tensorrt:
        return (f"model {qm.source!r} uses TensorRT plugin ops {_ops(tensorrt)} (NVIDIA Model Optimizer writes them "
                "in its NVFP4, MXFP8 and INT4 exports for TensorRT), which no onnxruntime library implements: "
                "analyse the model's QDQ export with standard QuantizeLinear/DequantizeLinear (int8, fp8, or int4 "
                "weights behind DequantizeLinear)")
    return (f"model {qm.source!r} uses custom ops {_ops(qm.custom_ops)} that plain onnxruntime does not know; "
            "register the library that implements them (the quantizer ships it, e.g. AMD Quark's custom-op "
            "library) with --custom-op-library PATH (custom_op_libraries=[PATH] in the API, ptq_custom_op_library "
            "in the ini file, custom_op_library in a marker or a contract)")


def _writer(float_model, tensor):
    """The float model's node that writes ``tensor``, or None (no float model, or none)."""
    if float_model is None:
        return None
    model = load_model(float_model, what="float model", external=False)[0]
    return next((n for n in model.graph.node if tensor in n.output), None)

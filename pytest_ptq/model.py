"""The calibrated QDQ model as the analyses see it.

A *calibration node* is what the seed tool calls HzCalibration: here a ``QuantizeLinear``
and the ``DequantizeLinear`` nodes it feeds (one node however many DQs it feeds), or a
lone ``DequantizeLinear`` of a quantized initializer (onnxruntime's default for weights
and biases). Every other node is a *normal node*.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper

from . import params
from .errors import NotQuantized, PTQError, shown, unknown

Q_OPS = {"QuantizeLinear"}
DQ_OPS = {"DequantizeLinear"}

# (qmin, qmax) of every quantized type ONNX knows; float8 ranges are their largest finite values.
_RANGES = {
    onnx.TensorProto.INT8: (-128, 127),
    onnx.TensorProto.UINT8: (0, 255),
    onnx.TensorProto.INT16: (-32768, 32767),
    onnx.TensorProto.UINT16: (0, 65535),
    onnx.TensorProto.INT32: (-(2**31), 2**31 - 1),
}
_BITS = {
    onnx.TensorProto.INT8: 8, onnx.TensorProto.UINT8: 8, onnx.TensorProto.INT16: 16,
    onnx.TensorProto.UINT16: 16, onnx.TensorProto.INT32: 32,
}
for _name, _rng, _bits in (("INT4", (-8, 7), 4), ("UINT4", (0, 15), 4),
                           ("FLOAT8E4M3FN", (-448, 448), 8), ("FLOAT8E4M3FNUZ", (-240, 240), 8),
                           ("FLOAT8E5M2", (-57344, 57344), 8), ("FLOAT8E5M2FNUZ", (-57344, 57344), 8)):
    if hasattr(onnx.TensorProto, _name):
        _RANGES[getattr(onnx.TensorProto, _name)] = _rng
        _BITS[getattr(onnx.TensorProto, _name)] = _bits

# Ops after which a tensor can be negative: a [0, max] range right behind one of these means
# the Relu/Clip that made it non-negative was folded into the Q/DQ range and deleted.
_SIGNED_PRODUCERS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "BatchNormalization",
                     "InstanceNormalization", "LayerNormalization", "Mul"}


@dataclasses.dataclass
class CalibrationNode:
    """One Q/DQ pair (or lone DQ) with its quantization parameters.

    ``threshold`` is the largest magnitude the pair represents, in the units of its input
    (``scale * max(qmax - zp, zp - qmin)``, the max over channels when per-channel).
    """

    name: str
    kind: str  # "activation" or "weight"
    input: str  # the tensor quantized (float for pairs; the quantized initializer for a lone DQ)
    q_node: onnx.NodeProto | None
    dq_nodes: list
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None
    qtype: int
    bit: int
    threshold: float
    role: str = ""  # "bias" for int32 bias DQs
    float_weight: str | None = None  # initializer holding the float weight, when known
    consumers: list = dataclasses.field(default_factory=list)  # normal nodes fed, by name
    producer: str | None = None  # normal node that computes an activation's input
    # (op_type, low, high) of a Relu/Clip that quantize_static folded into this pair's range
    # and deleted, found in the float model; bypassing the pair re-applies it
    folded: tuple | None = None

    @property
    def outputs(self):
        return [dq.output[0] for dq in self.dq_nodes]

    @property
    def bypassable(self):
        """False for a lone DQ whose float weight is unknown: bypassing it changes nothing."""
        return self.q_node is not None or self.float_weight is not None

    @property
    def per_channel(self):
        return self.scale.size > 1

    @property
    def qrange(self):
        return _RANGES.get(self.qtype, (0, 255))

    @property
    def dtype_name(self):
        return onnx.TensorProto.DataType.Name(self.qtype).lower()

    def range(self):
        """(lowest, highest) representable values, per channel, in input units."""
        qmin, qmax = self.qrange
        s = self.scale.astype(np.float64)
        zp = self.zero_point.astype(np.float64)
        return s * (qmin - zp), s * (qmax - zp)

    def fake_quant(self, x):
        """Quantize then dequantize ``x`` with this node's parameters in numpy (half to even)."""
        qmin, qmax = self.qrange
        s, zp = self.scale, self.zero_point.astype(np.float32)
        if self.per_channel:
            shape = [1] * x.ndim
            shape[self.axis % x.ndim] = -1
            s, zp = s.reshape(shape), zp.reshape(shape)
        q = np.clip(np.rint(x / s) + zp, qmin, qmax)
        return ((q - zp) * s).astype(np.float32)

    def summary(self):
        return {"name": self.name, "kind": self.kind, "input": self.input, "bit": self.bit,
                "dtype": self.dtype_name, "threshold": self.threshold,
                "per_channel": self.per_channel, "axis": self.axis,
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
    def wider(cls, c, bits=16, rank=None):
        """The same range as ``c`` at ``bits`` bits: the pair re-quantized finer, not wider."""
        qmin, qmax = c.qrange
        lo, hi = c.range()
        signed = qmin < 0
        nmin, nmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
        scale = (hi - lo) / (nmax - nmin)
        zp = np.rint(nmin - lo / scale)
        return cls(_broadcast(c, scale, rank), _broadcast(c, zp, rank), nmin, nmax,
                   f"int{bits}" if signed else f"uint{bits}")


def _broadcast(c, values, rank=None):
    values = np.asarray(values, dtype=np.float32)
    if values.size == 1:
        return values.reshape(())
    rank = rank or 4
    shape = [1] * rank
    shape[(c.axis if c.axis is not None else 1) % rank] = -1
    return values.reshape(shape)


@dataclasses.dataclass
class NormalNode:
    name: str
    op_type: str
    inputs: list
    outputs: list
    calibration_inputs: list  # names of the calibration nodes feeding it
    index: int  # topological position among normal nodes


def load_model(model_or_file, what="model"):
    """Load an ONNX model from a path or return a copy of a ModelProto (never modified)."""
    if isinstance(model_or_file, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_file)
        return model, None
    if isinstance(model_or_file, bool) or not isinstance(model_or_file, (str, os.PathLike)):
        raise PTQError(f"{what} must be the path of an .onnx file or an onnx.ModelProto, got {shown(model_or_file)}")
    path = params.input_path(model_or_file, f"{what} file")
    if path.is_dir():
        raise PTQError(f"{what} {str(path)!r} is a folder; pass the .onnx file")
    if not path.is_file():
        raise PTQError(f"{what} file {str(path)!r} does not exist; pass the path of an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=True)
    except Exception as exc:  # onnx raises DecodeError, OSError, ... for a broken file
        raise PTQError(f"{what} file {str(path)!r} is not a readable ONNX model "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                       f"check that it is a complete .onnx file with its external data beside it") from None
    if not model.graph.node:
        raise PTQError(f"{what} file {str(path)!r} holds no graph nodes; pass an exported ONNX model")
    return model, path


class QuantModel:
    """A calibrated QDQ model parsed into calibration nodes and normal nodes.

    ``calibration`` keeps graph order; ``normal`` is in topological order.
    """

    def __init__(self, model_or_file, float_model=None):
        self.model, self.path = load_model(model_or_file)
        self.source = str(self.path) if self.path else "<ModelProto>"
        graph = self.model.graph
        _name_nodes(graph)
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
        self.calibration = self._find_calibration_nodes()
        if not self.calibration:
            raise NotQuantized(f"model {self.source!r} has no QuantizeLinear/DequantizeLinear pairs; "
                           "pass the calibrated QDQ model (quantize_static with QuantFormat.QDQ), "
                           "not the float one")
        self.float_weights = {}
        if float_model is not None:
            self._recover_float_weights(float_model)
        self._map_normal_nodes()

    # -- parsing -------------------------------------------------------------------------
    def _infer_types(self):
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
            values = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
        except Exception:  # inference is a help for typing outputs, never a requirement
            values = list(self.model.graph.value_info) + list(self.model.graph.output) + list(self.model.graph.input)
        types = {}
        for v in values:
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                types[v.name] = v.type.tensor_type.elem_type
        for name, init in self.inits.items():
            types[name] = init.data_type
        return types

    def constant(self, name):
        """The numpy value of an initializer or Constant output, or None."""
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.constants.get(name)
        if node is not None:
            for a in node.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
        return None

    def is_constant(self, name):
        return name in self.inits or name in self.constants

    def _qparams(self, node, qtype_hint=None):
        scale = self.constant(node.input[1])
        if scale is None:
            raise PTQError(f"node {node.name!r} in {self.source!r} takes its scale {node.input[1]!r} "
                           "from a computed tensor; only constant scales are supported")
        zp = self.constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        qtype = None
        for a in node.attribute:
            if a.name == "output_dtype" and a.i:
                qtype = a.i
        if zp is not None:
            qtype = onnx.helper.np_dtype_to_tensor_dtype(zp.dtype) if qtype is None else qtype
        else:
            zp = np.zeros_like(scale, dtype=np.int64)
        if qtype is None:
            qtype = qtype_hint or onnx.TensorProto.UINT8
        axis = None
        if scale.size > 1:
            axis = 1
            for a in node.attribute:
                if a.name == "axis":
                    axis = a.i
        return scale.astype(np.float32), np.asarray(zp).astype(np.int64), axis, qtype

    def _find_calibration_nodes(self):
        graph = self.model.graph
        found, used = [], set()
        for node in graph.node:
            if node.op_type in Q_OPS:
                dqs = [c for c in self.consumers[node.output[0]] if c.op_type in DQ_OPS]
                if not dqs or len(dqs) != len(self.consumers[node.output[0]]):
                    continue  # a Q feeding integer kernels is not a fake-quant pair
                scale, zp, axis, qtype = self._qparams(node)
                kind = "weight" if self.is_constant(node.input[0]) else "activation"
                found.append(self._calib(node.name, kind, node.input[0], node, dqs, scale, zp, axis, qtype))
                used.update(d.name for d in dqs)
        for node in graph.node:
            if node.op_type in DQ_OPS and node.name not in used and self.is_constant(node.input[0]):
                qinit = self.constant(node.input[0])
                hint = onnx.helper.np_dtype_to_tensor_dtype(qinit.dtype)
                scale, zp, axis, qtype = self._qparams(node, hint)
                qtype = hint
                c = self._calib(node.name, "weight", node.input[0], None, [node], scale, zp, axis, qtype)
                c.role = "bias" if qtype == onnx.TensorProto.INT32 else ""
                found.append(c)
        return {c.name: c for c in found}

    def _calib(self, name, kind, inp, q, dqs, scale, zp, axis, qtype):
        qmin, qmax = _RANGES.get(qtype, (0, 255))
        s = scale.astype(np.float64).reshape(-1)
        z = np.broadcast_to(zp.astype(np.float64).reshape(-1), s.shape)
        threshold = float(np.max(s * np.maximum(qmax - z, z - qmin)))
        producer = None
        if kind == "activation" and inp in self.producer:
            producer = self.producer[inp].name
        return CalibrationNode(name=name, kind=kind, input=inp, q_node=q, dq_nodes=dqs, scale=scale,
                               zero_point=zp, axis=axis, qtype=qtype, bit=_BITS.get(qtype, 8),
                               threshold=threshold, producer=producer)

    def _recover_float_weights(self, float_model):
        """Find the float weight of every lone-DQ weight in the original float model.

        onnxruntime names a quantized weight ``<W>_quantized``; the float model keeps ``<W>``.
        """
        fmodel, _ = load_model(float_model, what="float model")
        self._find_folded(fmodel)
        finits = {i.name: i for i in fmodel.graph.initializer}
        for c in self.calibration.values():
            if c.q_node is not None:
                continue
            base = c.input[: -len("_quantized")] if c.input.endswith("_quantized") else c.input
            init = finits.get(base)
            if init is None or tuple(init.dims) != tuple(self.inits[c.input].dims):
                continue
            name = f"ptq_float::{base}"
            self.float_weights[name] = numpy_helper.to_array(init)
            c.float_weight = name

    def _find_folded(self, fmodel):
        """Mark activation pairs whose input the float model computes with a Relu/Clip that
        the QDQ model lacks: quantize_static folded it into the range and deleted it."""
        fprod = {o: n for n in fmodel.graph.node for o in n.output}
        fconst = {i.name: numpy_helper.to_array(i) for i in fmodel.graph.initializer}
        for n in fmodel.graph.node:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value":
                        fconst[n.output[0]] = numpy_helper.to_array(a.t)
        for c in self.of_kind("activation"):
            f, q = fprod.get(c.input), self.producer.get(c.input)
            if f is None or q is None or f.op_type not in ("Relu", "Clip") or q.op_type == f.op_type:
                continue
            bounds = [0.0, math.inf]
            if f.op_type == "Clip":
                attrs = {a.name: a.f for a in f.attribute}  # opset < 11 keeps bounds as attributes
                bounds = [attrs.get("min", -math.inf), attrs.get("max", math.inf)]
                given = [i for i in f.input[1:3] if i]
                if any(i not in fconst for i in given):
                    continue  # bounds computed at run time: nothing to re-apply faithfully
                for k, name in enumerate(f.input[1:3]):
                    if name:
                        bounds[k] = float(np.asarray(fconst[name]).reshape(-1)[0])
            c.folded = (f.op_type, float(bounds[0]), float(bounds[1]))

    def _map_normal_nodes(self):
        dq_out = {}
        calib_nodes = set()
        for c in self.calibration.values():
            for dq in c.dq_nodes:
                dq_out[dq.output[0]] = c.name
                calib_nodes.add(dq.name)
            if c.q_node is not None:
                calib_nodes.add(c.q_node.name)
        self.normal = {}
        for node in self.model.graph.node:
            if node.name in calib_nodes or node.op_type == "Constant":
                continue
            feeding = []
            for i in node.input:
                if i in dq_out and dq_out[i] not in feeding:
                    feeding.append(dq_out[i])
            n = NormalNode(node.name, node.op_type, list(node.input), list(node.output), feeding,
                           len(self.normal))
            self.normal[node.name] = n
            for cname in feeding:
                self.calibration[cname].consumers.append(node.name)

    # -- queries -------------------------------------------------------------------------
    def of_kind(self, kind):
        return [c for c in self.calibration.values() if c.kind == kind]

    def resolve_calibration(self, names):
        """Calibration node names for a list of calibration or normal node names."""
        out = []
        for name in params.names(names, "node names"):
            if name in self.calibration:
                out.append(name)
            elif name in self.normal:
                out.extend(self.normal[name].calibration_inputs)
            else:
                raise unknown("node", name, list(self.calibration) + list(self.normal))
        return list(dict.fromkeys(out))

    def is_float_tensor(self, name):
        return self.value_types.get(name) in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                                              onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)

    def folded_activation_suspects(self):
        """Activation pairs whose range starts at exactly 0 right after an op that can go negative.

        That is the mark of quantize_static's default of deleting Relu/Clip after folding them
        into the Q/DQ range: with the pair bypassed, the activation function is gone.
        """
        out = []
        for c in self.of_kind("activation"):
            if c.folded is not None:
                continue  # found in the float model: the bypass re-applies it
            lo, _ = c.range()
            prod = self.producer.get(c.input)
            kept = any(n.op_type in ("Relu", "Clip") for dq in c.dq_nodes for n in self.consumers[dq.output[0]])
            if prod is not None and prod.op_type in _SIGNED_PRODUCERS and np.all(lo == 0) and not kept:
                out.append(c.name)
        return out


def _name_nodes(graph):
    """Give unnamed nodes stable names ``<OpType>_<k>`` (k counts that op type in graph order)."""
    taken = {n.name for n in graph.node if n.name}
    counts = defaultdict(int)
    for n in graph.node:
        if n.name:
            continue
        while True:
            candidate = f"{n.op_type}_{counts[n.op_type]}"
            counts[n.op_type] += 1
            if candidate not in taken:
                break
        n.name = candidate
        taken.add(candidate)
    # duplicate names would make results ambiguous: suffix later ones
    seen = defaultdict(int)
    for n in graph.node:
        seen[n.name] += 1
        if seen[n.name] > 1:
            n.name = f"{n.name}__{seen[n.name] - 1}"

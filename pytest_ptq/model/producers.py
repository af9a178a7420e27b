"""Which quantizer made a model, from what it writes into the file.

Used to name the producer in summaries and reports and to speak its terms in remedies;
never to decide how the graph is analysed (that is recognised by structure and values).
The evidence, strongest first: ``producer_name``, metadata keys, op domains, then naming
habits.
"""

from __future__ import annotations

import dataclasses
import re

import onnx
from onnx import numpy_helper

KNOWN = {
    "onnxruntime": "onnxruntime quantize_static",
    "modelopt": "NVIDIA Model Optimizer",
    "quark": "AMD Quark",
    "neural-compressor": "Intel Neural Compressor",
    "aimet": "Qualcomm aimet-onnx",
}


@dataclasses.dataclass(frozen=True)
class Producer:
    """``key``: one of :data:`KNOWN` or ``"unknown"``; ``evidence``: why, in a few words."""

    key: str
    name: str
    version: str
    evidence: str

    @property
    def label(self):
        version = f" {self.version}" if self.version else ""
        return f"{self.name}{version}" if self.key != "unknown" else (self.name or "unknown producer")


_PRODUCER_NAMES = [
    (re.compile(r"onnx\.quantize|onnxruntime", re.I), "onnxruntime"),
    (re.compile(r"modelopt|model.?optimizer|nvidia", re.I), "modelopt"),
    (re.compile(r"quark|vai_q_onnx", re.I), "quark"),
    (re.compile(r"neural.?compressor|\binc\b|onnx_neural_compressor", re.I), "neural-compressor"),
    (re.compile(r"aimet", re.I), "aimet"),
]


def detect(model, fmt="QDQ"):
    """The :class:`Producer` of a ModelProto; ``fmt``, the format the file came in, tells
    onnxruntime's quantize_dynamic from its quantize_static."""
    found = _detect(model, fmt)
    if found.key == "onnxruntime" and fmt == "dynamic":
        return dataclasses.replace(found, name="onnxruntime quantize_dynamic")
    return found


def _detect(model, fmt):
    raw = f"{model.producer_name} {model.producer_version}".strip()
    if model.producer_name == "onnx.quantize":
        # onnxruntime's quantizer writes this, and so do Model Optimizer and Neural Compressor
        return _onnx_quantize(model, qdq=fmt == "QDQ")
    for pattern, key in _PRODUCER_NAMES:
        if pattern.search(model.producer_name or ""):
            return Producer(key, KNOWN[key], model.producer_version, f"producer_name {model.producer_name!r}")
    meta = {p.key: p.value for p in model.metadata_props}
    # a 'producer' entry names the tool; others (onnx.quant.pre_process=onnxruntime.quant) name
    # a step it ran, so onnxruntime's name counts only when nothing more specific does
    texts = [meta["producer"]] if "producer" in meta else []
    texts.append(" ".join(f"{k}={v}" for k, v in meta.items()))
    for text in texts:
        for pattern, key in sorted(_PRODUCER_NAMES, key=lambda pk: pk[1] == "onnxruntime"):
            if text and pattern.search(text):
                version = text.split()[-1] if text is meta.get("producer") and " " in text else ""
                return Producer(key, KNOWN[key], version, "metadata")
    domains = {n.domain for n in model.graph.node}
    if any(d.startswith("com.amd.quark") or d.startswith("com.vai.quantize") for d in domains):
        return Producer("quark", KNOWN["quark"], "", "com.amd.quark ops")
    names = [n.name for n in model.graph.node[:2000]] + [i.name for i in model.graph.initializer[:2000]]
    if any(n.endswith("_QuantizeInput") for n in names):
        return Producer("neural-compressor", KNOWN["neural-compressor"], "", "tensor names *_QuantizeInput")
    if fmt == "QDQ" and any(n.op_type == "DequantizeLinear" and any(a.name == "block_size" for a in n.attribute)
                            for n in model.graph.node):
        # onnxruntime's MatMulNBitsQuantizer in QDQ form writes the same: Model Optimizer's
        # terms are given, the name says which two it may be
        return Producer("modelopt", f"{KNOWN['modelopt']} (int4) or onnxruntime's MatMulNBitsQuantizer", "",
                        "block-wise DequantizeLinear weights, which both write")
    if fmt == "weight-only" and not model.producer_name:  # the block-wise DQs are the rewrite's, not the file's
        return Producer("unknown", "a weight-only quantizer writing MatMulNBits (onnxruntime's MatMulNBitsQuantizer, "
                        "onnxruntime-genai, Olive or Neural Compressor)", "", "MatMulNBits weights")
    if model.producer_name:  # a name, but not of a quantizer whose conventions are known (a QAT export)
        return Producer("unknown", raw, "", f"producer_name {model.producer_name!r}, no quantizer known by it")
    return Producer("unknown", raw, "", "nothing in the file names it")


def _onnx_quantize(model, qdq=True):
    """Which of the three quantizers that write ``producer_name='onnx.quantize'`` it was.
    ``qdq``: False for a file that came in QOperator or dynamic form, whose ``*_quant``
    names are onnxruntime's own."""
    nodes = list(model.graph.node)
    names = [n.name for n in nodes] + [o for n in nodes for o in n.output]
    if any(n.endswith("_QuantizeInput") or (qdq and n.endswith("_quant")) for n in names):
        return Producer("neural-compressor", KNOWN["neural-compressor"], "", "producer_name 'onnx.quantize' and "
                        "tensors named *_QuantizeInput")
    by_output = {o: n for n in nodes for o in n.output}
    for n in nodes:
        if n.op_type == "DequantizeLinear" and n.input[0] in by_output:
            q = by_output[n.input[0]]
            if q.op_type == "QuantizeLinear" and len(q.input) > 1 and q.input[1] != n.input[1]:
                # Model Optimizer gives the Q and the DQ of a pair their own scale tensors
                return Producer("modelopt", KNOWN["modelopt"], "", "producer_name 'onnx.quantize' and pairs with "
                                "separate Q and DQ scales")
    if model.ir_version >= 10 and _symmetric_signed_activations(model):
        # with an fp32 graph Model Optimizer's pairs share their scales as onnxruntime's do; what
        # remains is its defaults: IR raised to 10 and int8 (or fp8) activations with zero point 0,
        # where onnxruntime keeps the IR it was given and quantizes activations to uint8
        return Producer("modelopt", KNOWN["modelopt"], "", "producer_name 'onnx.quantize', IR 10 and symmetric "
                        "int8/fp8 activations")
    # its producer_version is its quantizer module's own 0.1.0, which would read as onnxruntime's version
    return Producer("onnxruntime", KNOWN["onnxruntime"], "", "producer_name 'onnx.quantize'")


_SIGNED = {onnx.TensorProto.INT8, onnx.TensorProto.FLOAT8E4M3FN}


def _symmetric_signed_activations(model):
    """True when every QuantizeLinear of a computed tensor has a signed 8-bit zero point of 0."""
    inits = {i.name: i for i in model.graph.initializer}
    found = False
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in inits:
            continue
        zp = inits.get(n.input[2]) if len(n.input) > 2 else None
        if zp is None or zp.data_type not in _SIGNED or numpy_helper.to_array(zp).astype(float).any():
            return False
        found = True
    return found

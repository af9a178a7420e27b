"""Which quantizer made a model, from what it writes into the file.

Used to name the producer in summaries and reports and to speak its terms in remedies;
never to decide how the graph is analysed (that is recognised by structure and values).
The evidence, strongest first: ``producer_name``, metadata keys, op domains, then naming
habits.
"""

from __future__ import annotations

import dataclasses
import re

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


def detect(model):
    """The :class:`Producer` of a ModelProto."""
    raw = f"{model.producer_name} {model.producer_version}".strip()
    for pattern, key in _PRODUCER_NAMES:
        if pattern.search(model.producer_name or ""):
            return Producer(key, KNOWN[key], model.producer_version, f"producer_name {model.producer_name!r}")
    meta = " ".join(f"{p.key}={p.value}" for p in model.metadata_props)
    for pattern, key in _PRODUCER_NAMES:
        if meta and pattern.search(meta):
            return Producer(key, KNOWN[key], "", "metadata")
    domains = {n.domain for n in model.graph.node}
    if any(d.startswith("com.amd.quark") or d.startswith("com.vai.quantize") for d in domains):
        return Producer("quark", KNOWN["quark"], "", "com.amd.quark ops")
    names = [n.name for n in model.graph.node[:2000]] + [i.name for i in model.graph.initializer[:2000]]
    if any(n.endswith("_QuantizeInput") for n in names):
        return Producer("neural-compressor", KNOWN["neural-compressor"], "", "tensor names *_QuantizeInput")
    if any(n.endswith("_QuantizeLinear") or n.endswith("_quantized") for n in names):
        return Producer("onnxruntime", KNOWN["onnxruntime"], "", "node names *_QuantizeLinear")
    return Producer("unknown", raw, "", "nothing in the file names it")

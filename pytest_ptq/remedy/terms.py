"""A remedy in onnxruntime's own terms (``quantize_static`` arguments).

* **float**: ``nodes_to_exclude`` names normal nodes. onnxruntime puts a Q/DQ pair on a
  tensor when its producer *or any* of its consumers is quantized, and then every consumer
  reads the pair's output. Keeping tensor T in float therefore needs T's producer and all
  of T's consumers excluded; a weight needs the node that reads it excluded. Excluding a
  node also leaves its other inputs and outputs in float unless a neighbour still asks
  for them; the re-quantized check reports such collateral tensors. A requantize chain's
  later pair cannot go alone: its readers read the chain's tensor, which then goes float for
  every reader, its earlier pairs gone too (the settings' ``notes`` say so).
* **int16**: ``extra_options["TensorQuantOverrides"] = {tensor: [{"quant_type":
  QuantType.QUInt16}]}`` (``QInt16`` where the node is signed): the same calibrated range
  at 16 bit. JSON holds the type's name (``"QUInt16"``), as onnxruntime itself writes it;
  :func:`quantize_static_kwargs` turns it back into the enum quantize_static requires.
* **per-channel**: weights get ``{weight: [{"axis": A}]}`` (onnxruntime quantizes that
  initializer per channel whatever ``per_channel`` says). onnxruntime cannot quantize
  activations per channel; with ``per_channel_activations`` they are simulated and listed
  under ``simulation_only``.
* **mixed**: each node its own kind of the three, their settings merged.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import params
from ..errors import PTQError, unknown
from ..model.align import float_source
from ..model.formats import onnx_opset
from .alternatives import symmetric_channels
from .result import MIXED, REMEDIES


def float_tensor_name(qmodel, c):
    """The tensor of the float model that calibration node ``c`` quantizes.

    onnxruntime renames a quantized graph output's producer output to
    ``<name>_QuantizeLinear_Input`` and stores weights as ``<W>_quantized``; a QOperator
    file's rewrite names some float tensors anew (``QuantModel.float_names``), and a
    quantizer may rename the tensors it quantizes (Neural Compressor's ``*_QuantizeInput``,
    found by the alignment with the float model); where it deleted a Relu/Clip and folded it
    into the pair, the tensor it quantized is that Relu/Clip's output. A later pair of a
    requantize chain quantizes its first pair's tensor again: that is its float tensor.
    """
    c = qmodel.chain_head(c.name)
    if c.kind == "weight":
        if c.float_weight:
            return float_source(c.float_weight)
        if c.q_node is None and c.input.endswith("_quantized"):
            return c.input[: -len("_quantized")]
        return qmodel.float_names.get(c.input, c.input)
    # a model output a pair of the chain writes keeps its name in the float model; else the head's input
    for later in qmodel.requantized_through(c.name):
        for o in qmodel.calibration[later].outputs:
            if o in qmodel.output_names:
                return o
    alignment = getattr(qmodel, "alignment", None)
    if alignment is None:
        return qmodel.float_names.get(c.input) or c.input
    return (qmodel.float_names.get(c.input) or alignment.fold_outputs.get(c.name) or alignment.tensors.get(c.input)
            or c.input)


def float_tensor_names(qmodel, c):
    """The float model's tensors an override for calibration node ``c`` names: its
    :func:`float_tensor_name`, and for a pair the quantizer folded a Relu/Clip into, the tensor
    before that Relu/Clip too, which onnxruntime quantizes when it keeps them
    (``QDQKeepRemovableActivations``, as pytest-ptq re-quantizes) and ignores when it folds."""
    name = float_tensor_name(qmodel, c)
    alignment = getattr(qmodel, "alignment", None)
    before = alignment.tensors.get(c.input, c.input) if alignment is not None and c.name in alignment.fold_outputs \
        else name
    return list(dict.fromkeys([name, before]))


def quantized_ops(qmodel):
    """The op types onnxruntime's quantizer of ``qmodel``'s kind quantizes by default
    (quantize_dynamic's integer ops; quantize_static's QLinear and QDQ ones)."""
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

    if qmodel.format == "dynamic":
        return set(IntegerOpsRegistry)
    return set(QLinearOpsRegistry) | set(QDQRegistry)


def quantizer_call(qmodel):
    """The onnxruntime quantizer that makes ``qmodel``'s kind of model: quantize_dynamic for a
    dynamic one, MatMulNBitsQuantizer for block-wise weights with no activation quantized,
    else quantize_static (each takes nodes_to_exclude)."""
    if qmodel.format == "dynamic":
        return "quantize_dynamic"
    weights = qmodel.of_kind("weight")
    if weights and qmodel.weight_only and all(c.block_size for c in weights if c.role != "bias"):
        return "MatMulNBitsQuantizer"
    return "quantize_static"


def per_channel_weights(qmodel):
    """How to ask onnxruntime for per-channel weights on ``qmodel``'s per-tensor ones: its
    switch, or, where other weights are per channel already (the switch was on, and
    onnxruntime left these per tensor: an embedding's Gather, a weight held as a Constant
    node), their axis one by one."""
    if any(c.per_channel for c in qmodel.of_kind("weight")):
        # whether per_channel=True or per-weight axes made the others, these stayed per tensor
        return ("these stayed per tensor beside the model's per-channel weights (which "
                f"{quantizer_call(qmodel)}(..., per_channel=True) or an axis in TensorQuantOverrides gives): "
                "ask for their axis in extra_options['TensorQuantOverrides'] ({'axis': A}), which onnxruntime honours "
                "only on initializers of ops it quantizes per channel"
                + ("" if qmodel.format == "dynamic" else ", or raise them to int16"))
    opset = onnx_opset(qmodel.model)
    if qmodel.format == "QDQ" and opset < 13:
        # quantize_static writes the axis all the same, and the model then fails to load
        return (f"{quantizer_call(qmodel)}(..., per_channel=True) on the float model converted to opset 13 first "
                f"(onnx.version_converter.convert_version(model, 13)): at its opset {opset} DequantizeLinear takes no axis")
    return f"{quantizer_call(qmodel)}(..., per_channel=True)"


def excluded_by(qmodel, c, ops):
    """The normal nodes ``nodes_to_exclude`` names to keep calibration node ``c``'s tensor in
    float (see the module docstring), of the op types ``ops`` (:func:`quantized_ops`)."""
    # a dynamic quantizer serves only its consumers: excluding them is enough; a node of an op
    # onnxruntime never quantizes (a Log) asks for no pair, and excluding it would only
    # lengthen the list; through Casts: a float16 graph computing a node in float32 between
    # its pairs. In a requantize chain the float model holds one tensor for all its pairs:
    # the head's producer writes it, and the operators reading any of the chain's pairs
    # (counts_for) read it.
    # A Relu/Clip reading the tensor is left out: it quantizes its input only where a
    # neighbour already did (QDQRemovableActivation, and QLinearActivation alike), which
    # the exclusion of every other neighbour rules out.
    head = qmodel.chain_head(c.name)
    producers = qmodel.through_casts([head.producer], downstream=False) if head.kind == "activation" and \
        head.producer in qmodel.normal else []
    readers = [n for n in qmodel.counts_for(head.name) if not _follows_its_input(qmodel.normal[n].op_type)]
    return [n for n in dict.fromkeys(producers + readers) if qmodel.normal[n].op_type in ops]


def _follows_its_input(op_type):
    """Whether onnxruntime's quantizer puts a pair on an ``op_type`` node's input only where
    another node already quantizes that tensor (its removable activations, Relu and Clip)."""
    from onnxruntime.quantization.operators.activation import QDQRemovableActivation
    from onnxruntime.quantization.registry import QDQRegistry

    return QDQRegistry.get(op_type) is QDQRemovableActivation


def onnxruntime_settings(qmodel, remedy, nodes, axes=None, choices=None):
    """``{"nodes_to_exclude": [...], "TensorQuantOverrides": {...}, "simulation_only": [...]}``
    that apply ``remedy`` to the calibration ``nodes`` when quantizing the float model
    (``"not_in_float_model": [...]`` too where nodes to exclude are ones the quantizer
    inserted, which the float model lacks; ``"notes": [...]`` where they do otherwise than the
    simulated remedy: a requantize chain's later pair kept in float takes its earlier pairs too).

    ``remedy="mixed"`` takes each node's kind from ``choices`` (``{node: kind}``).
    ``nodes_to_exclude`` is in topological order, named as in the float model when ``qmodel``
    was aligned with one; see the module docstring for why a tensor kept in float excludes
    both its producer and its consumers.
    """
    if remedy not in REMEDIES + (MIXED,):
        raise unknown("remedy", remedy, REMEDIES + (MIXED,))
    qmodel = getattr(qmodel, "qmodel", qmodel)  # an Engine's model
    axes, choices = axes or {}, choices or {}
    exclude, overrides, sim_only, per_channel, notes = set(), {}, [], False, []
    rename = float_node_name(qmodel)
    nodes = params.names(nodes, "nodes") or []
    ops = quantized_ops(qmodel)
    for name in nodes:
        if name not in qmodel.calibration:
            raise unknown("calibration node", name, list(qmodel.calibration))
        c = qmodel.calibration[name]
        kind = choices.get(name, remedy)
        if kind not in REMEDIES:
            raise PTQError(f"node {name!r} needs a remedy kind ({', '.join(REMEDIES)}) in choices, got {kind!r}")
        if kind == "float":
            excluded = excluded_by(qmodel, c, ops)
            exclude.update(excluded)
            if qmodel.requantizes(name) is not None and excluded:
                notes.append(_later_pair_float_note(qmodel, c, [rename(n) or n for n in excluded]))
        elif kind == "int16" and len(qmodel.chain(c.name)) > 1:
            entry = chain_entry(qmodel, c, rename)
            if entry is None:
                sim_only.append(name)
            else:
                overrides.update({t: [entry] for t in float_tensor_names(qmodel, c)})
        elif kind == "int16" and (axis := _channel_axis(qmodel, c)) is not False:
            signed = c.qrange[0] < 0
            entry = {"quant_type": "QInt16" if signed else "QUInt16"}
            if axis is not None:
                entry["axis"] = axis  # a type alone makes quantize_static quantize it per tensor
                if not symmetric_channels(c):
                    entry["symmetric"] = False
            overrides.update({t: [entry] for t in float_tensor_names(qmodel, c)})
        elif c.kind == "weight" and name in axes and qmodel.format == "dynamic":
            per_channel = True  # quantize_dynamic refuses an axis override; its switch covers every weight
        elif c.kind == "weight" and name in axes and qmodel.file_axis(c, axes[name]) is not None:
            overrides[float_tensor_name(qmodel, c)] = [{"axis": int(qmodel.file_axis(c, axes[name])),
                                                        **({} if symmetric_channels(c) else {"symmetric": False})}]
        else:  # (a moved weight's channels a Reshape spreads over several of the file's axes: none to name)
            sim_only.append(name)
    ordered = sorted(exclude, key=lambda n: qmodel.normal[n].index)
    absent = [n for n in ordered if rename(n) is None]
    ordered = list(dict.fromkeys(rename(n) for n in ordered if n not in absent))
    settings = {"nodes_to_exclude": ordered, "TensorQuantOverrides": overrides, "simulation_only": sim_only}
    if absent:
        settings["not_in_float_model"] = absent
    if notes:
        settings["notes"] = notes
    if per_channel:
        settings["per_channel"] = True
    if quantizer_call(qmodel) != "quantize_static":
        settings["quantizer"] = quantizer_call(qmodel)  # the same arguments, for the quantizer that made it
    return settings


def float_node_name(qmodel):
    """``rename(node)``: the float model's name of ``qmodel``'s normal node, as quantize_static
    reads it, or None for a node the quantizer inserted (which the float model lacks)."""
    alignment = getattr(qmodel, "alignment", None)
    if alignment is None:
        return lambda n: n
    # where a quantizer renamed nodes (Neural Compressor's '<name>_quant') or fused them and the
    # alignment found them; a node it inserted (AMD Quark's AveragePool for a Split) has none
    found = {**alignment.fused, **alignment.nodes}  # fused: the float op the quantizer's own fusion kept
    floats = set(found.values()) | set(alignment.unmatched_float)
    return lambda n: found.get(n, n) if n in found or n in floats else None


def later_pair_note(qmodel, c, consequence, why):
    """The note on terms that keep ``c``, a later pair of a requantize chain, in float though
    the quantizer cannot remove that pair alone, as the simulated remedy does: what they do
    instead (``consequence``, to the chain's earlier pairs) and ``why``."""
    chain = qmodel.chain(c.name)
    earlier = ", ".join(chain[:chain.index(c.name)])
    return (f"{c.name} is the later pair of a requantize chain (after {earlier}); {consequence}, which the simulated "
            f"remedy kept ({why})")


def chain_float_consequence(qmodel, c, excluded, tensor, name=lambda n: n, action=None):
    """What excluding ``excluded`` does to a requantize chain under onnxruntime's placement (a
    pair on a tensor while its producer or any reader is quantized, read by every reader):
    ``tensor`` float for every operator reading the chain (``name`` gives their names), its
    earlier pairs gone too. ``action``: the words of what the terms do, where they exclude no
    nodes (a quantizer of the tensor disabled, read by every reader as well)."""
    chain = qmodel.chain(c.name)
    readers = [m for m in dict.fromkeys(name(n) for n in qmodel.counts_for(chain[0])) if m]
    return (f"{action or 'excluding ' + ', '.join(excluded)} keeps {tensor} in float for every operator reading it "
            f"({', '.join(readers)}), without {', '.join(chain[:chain.index(c.name)])} too")


def _later_pair_float_note(qmodel, c, excluded):
    return later_pair_note(
        qmodel, c, chain_float_consequence(qmodel, c, excluded, float_tensor_name(qmodel, c),
                                           float_node_name(qmodel)),
        "quantize_static puts one pair on a tensor for all its readers, and the later pair only from a 'convert' "
        "entry in TensorQuantOverrides: where the settings that made the model give the tensor one, dropping it "
        "removes that pair alone")


def chain_entry(qmodel, c, rename):
    """The TensorQuantOverrides entry that raises calibration node ``c``, a pair of a requantize
    chain, to 16 bit and leaves the chain's other pair as it is, or None where quantize_static
    cannot write it. ``rename(node)``: the quantizer's name of a QDQ normal node (None: it has
    none); AMD Quark, whose quantizer is onnxruntime's, reads the same entry.

    quantize_static writes a chain of two pairs from one entry on the float tensor: its
    ``quant_type`` for the first pair and a ``convert`` for the second, read by ``recv_nodes``
    (all the tensor's readers when the first pair has none of its own). A bare 16-bit type
    would raise the first pair too, and the readers of the first pair with it. One convert per
    tensor: a chain of three pairs or more, or a grid of neither 8 nor 16 bit, has no entry.
    """
    first, *later = [qmodel.calibration[n] for n in qmodel.chain(c.name)]
    if len(later) != 1 or c.kind != "activation" or any(p.bit not in (8, 16) for p in (first, *later)):
        return None
    types = [("QInt" if p.qrange[0] < 0 else "QUInt") + str(16 if p.name == c.name else p.bit)
             for p in (first, later[0])]
    if types[0] == types[1]:
        return {"quant_type": types[0]}  # both pairs on one grid: one pair (quantize_static refuses the same type)
    convert = {"quant_type": types[1]}
    if qmodel.feeds(first.name) or set(first.outputs) & set(qmodel.output_names):
        recv = [rename(n) for n in qmodel.feeds(later[0].name)]
        if None in recv:
            return None
        convert["recv_nodes"] = recv
    return {"quant_type": types[0], "convert": convert}


def suggest_command(model, data, heldout=None, float_model=None, data_num=None):
    """The words of ``ptq-debug suggest`` for this model and data (its held-out data, float
    model and sample limit where given): what a report proposes to run next."""
    words = ["ptq-debug", "suggest", str(model), str(data)]
    for flag, value in (("--heldout", heldout), ("--float-model", float_model), ("--data-num", data_num)):
        if value:
            words += [flag, str(value)]
    return words


def _channel_axis(qmodel, c):
    """The file's axis of calibration node ``c``'s scales for a per-channel weight, None for
    one scale, False where the file has no such axis (a moved weight's channels a Reshape
    spreads over several: no term names them)."""
    if not (c.kind == "weight" and c.per_channel and not c.block_size):
        return None
    axis = qmodel.file_axis(c)
    return False if axis is None else int(axis)


def quantize_static_kwargs(settings):
    """``nodes_to_exclude``, ``extra_options`` (and ``per_channel`` where set) for quantize_static from JSON settings
    (a dict or a path), with quant types turned into ``QuantType`` members."""
    from onnxruntime.quantization import QuantType

    if not isinstance(settings, dict):
        try:
            settings = json.loads(Path(settings).read_text(encoding="utf-8-sig"))
        except (OSError, ValueError, TypeError) as exc:
            raise PTQError(f"remedy settings {str(settings)!r} cannot be read ({type(exc).__name__}); "
                           "write them with ptq-debug suggest") from None
    overrides = {}
    for tensor, entries in settings.get("TensorQuantOverrides", {}).items():
        fixed = []
        for entry in entries:
            entry = dict(entry)
            if isinstance(entry.get("quant_type"), str):
                entry["quant_type"] = QuantType.from_string(entry["quant_type"])
            if isinstance(entry.get("convert"), dict):  # JSON's list of receiving nodes: quantize_static takes a set
                convert = entry["convert"] = dict(entry["convert"])
                if isinstance(convert.get("quant_type"), str):
                    convert["quant_type"] = QuantType.from_string(convert["quant_type"])
                if "recv_nodes" in convert:
                    convert["recv_nodes"] = set(convert["recv_nodes"])
            fixed.append(entry)
        overrides[tensor] = fixed
    extra = {"TensorQuantOverrides": overrides} if overrides else {}
    kwargs = {"nodes_to_exclude": list(settings.get("nodes_to_exclude", [])), "extra_options": extra}
    if settings.get("per_channel"):
        kwargs["per_channel"] = True
    return kwargs


"""A remedy in the terms of the quantizer that made the model, beside onnxruntime's.

Each producer places Q/DQ pairs by its own rule and takes its own settings; what each can
express, as read in its installed source (versions in tests/producers/README.md):

* **NVIDIA Model Optimizer** (``modelopt.onnx.quantization``): Q/DQ only on the inputs of the
  ops it quantizes, so a tensor stays float when every node that reads it through the pair
  is excluded (``--nodes_to_exclude``, regular expressions matched with ``re.match``, so a
  name that prefixes another gets a ``$``; ``--op_types_to_exclude`` when every node of an
  op type goes). It has no 16-bit integer mode and quantizes int8 weights per channel
  always: those remedies have no Model Optimizer term.
* **AMD Quark** (``quark.onnx.ModelQuantizer(QConfig)``): onnxruntime's placement (a tensor
  gets a pair when its producer or any consumer is quantized), so a float tensor needs its
  producer and consumers in ``config.exclude`` (exact node names). 16 bit and per-channel
  weights go into ``config.extra_options["TensorQuantOverrides"]`` per tensor
  (``{"quant_type": ExtendedQuantType.QInt16}``, ``{"axis": A}``); a requantize chain's pair
  through a ``convert`` entry, which its QDQQuantizer reads as onnxruntime's does
  (``calc_graph_quant_params``). Keeping a chain's later pair in float, with onnxruntime's
  placement (Quark's, Neural Compressor's), takes the whole tensor: a note says so.
* **Intel Neural Compressor** (``onnx_neural_compressor``): onnxruntime's placement too, plus
  the Relu/Clip it folds into the pair, in ``StaticQuantConfig(nodes_to_exclude=[...])``
  (exact names of its own graph: the float names, or those of the ops it fused, shown in
  the QDQ file without the ``_quant`` suffix). Its quantizer knows int8/uint8 only (no
  int16 term); per-channel weights per node are ``set_local(pattern,
  OperatorConfig(..., per_channel=True))``.
* **Qualcomm aimet-onnx** (``QuantizationSimModel``): one quantizer per float tensor, named
  by the tensor: ``sim.qc_quantize_op_dict[name].enabled = False`` keeps it float,
  ``.set_bitwidth(16)`` raises it, ``.enable_per_channel_quantization()`` for a weight; set
  before ``compute_encodings``. A requantize chain's pairs are one quantizer, so keeping its
  later pair in float disables the whole tensor's, its earlier pairs with it: a note says so.

Names: a remedy names calibration nodes of the QDQ graph; producers want the float model's
nodes and tensors. With the float model the QDQ nodes are mapped onto it by
:mod:`~pytest_ptq.model.align` (structure and values, not names); without it the QDQ names
are used (Model Optimizer, Quark and aimet keep the float names; Neural Compressor's lose
their ``_quant`` suffix) and the terms say so. Activations per channel have no term in any
of them (simulation only), as in onnxruntime.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter, defaultdict

import numpy as np

from ..channelwise import channel_axis
from ..errors import PTQError, unknown
from ..model import load_model
from ..model.align import FOLDABLE, RESHAPING, TRANSPARENT, float_source
from ..model.graph import name_nodes, sort_topologically
from ..model.producers import KNOWN
from .alternatives import float_input
from .effect import readers
from .result import MIXED, REMEDIES, override_text, producer_lines
from .terms import chain_entry, chain_float_consequence, later_pair_note

PRODUCERS = ("modelopt", "quark", "neural-compressor", "aimet")
SHORT = {"modelopt": "ModelOpt", "quark": "Quark", "neural-compressor": "Neural Compressor", "aimet": "aimet-onnx"}
# How each stores a weight behind a lone DequantizeLinear: the float name plus this suffix.
_STORED_SUFFIX = {"modelopt": "_i4", "aimet": "_q", "quark": "_quantized", "neural-compressor": "_quantized"}
_QUANT_TYPES = {8: ("QInt8", "QUInt8"), 16: ("QInt16", "QUInt16")}


class _FloatGraph:
    """Names, op types, producers and consumers of the float model (or, without one, of the
    QDQ graph's normal nodes), named as the alignment names them."""

    def __init__(self, qm, float_model, own):
        self.given = float_model is not None
        if float_model is not None:
            model = load_model(float_model, what="float model")[0]
            graph = model.graph
            self.unnamed = set().union(*name_nodes(graph))  # the names the alignment gave (see name_nodes)
            sort_topologically(graph, "the float model")
            nodes = [n for n in graph.node if n.op_type != "Constant"]
            self.op = {n.name: n.op_type for n in nodes}  # in topological order, as the alignment sorts it
            self.outputs = {n.name: list(n.output) for n in nodes}
            self.consumers = defaultdict(list)
            for n in nodes:
                for i in n.input:
                    if i:
                        self.consumers[i].append(n.name)
        else:
            self.unnamed = set()
            self.op = {own(n.name): n.op_type for n in qm.normal.values()}
            self.outputs = {own(n.name): list(n.outputs) for n in qm.normal.values()}
            self.consumers = defaultdict(list)

    def of_type(self, op_type):
        return [n for n, t in self.op.items() if t == op_type]

    def ordered(self, names):
        """``names`` once each, in graph order (names it does not know last, as given)."""
        index = {n: k for k, n in enumerate(self.op)}
        names = list(dict.fromkeys(names))
        return sorted(names, key=lambda n: (index.get(n, len(index)), names.index(n)))


class ProducerNames:
    """The names producer ``key`` gives the QDQ nodes and calibration nodes of ``qm``: the
    float model's, mapped by the alignment, or the QDQ graph's without a float model."""

    def __init__(self, qm, key, float_model, unnamed=None):
        self.qm, self.key = qm, key
        self.fg = _FloatGraph(qm, float_model, self._own)
        self.alignment = getattr(qm, "alignment", None) if float_model is not None else None
        self.rewritten = []  # QDQ nodes with no float counterpart, named as in the QDQ graph
        # QDQ nodes unnamed in the file (default: ``qm``'s): past a rewrite nothing can name them
        self.unnamed = qm.unnamed if unnamed is None else unnamed

    def node(self, name):
        """The producer's name for QDQ normal node ``name``, or None for a node it inserted
        that stands for nothing (a Cast, an Identity). See :meth:`nameless`."""
        qn = self.qm.normal[name]
        own = self._own(name)
        if self.alignment is not None:
            fname = self.alignment.nodes.get(name)
            if fname is not None and (fname in self.fg.op or not self.fg.given):
                return fname
            if fname is None and qn.op_type in TRANSPARENT:
                return None
            if fname is not None or self.fg.op.get(own) != qn.op_type:
                # past a rewrite the structural match stops (or matched a part of a float op
                # the alignment expanded, a HardSwish the producer inlined); a float node of the
                # same name and op is the producer's own (it keeps names), anything else is its
                # rewrite
                self.rewritten.append(own)
        return own

    def nameless(self, nodes):
        """Those of ``nodes`` (the producer's names) that only the rewrite made and the file
        leaves unnamed: the producer has no name to exclude them by."""
        return [n for n in nodes if n in self.unnamed and n in self.rewritten]

    def _own(self, name):
        # Neural Compressor renames the nodes it quantizes '<name>_quant' and matches its
        # settings against the name without it (quant_utils.get_node_original_name)
        if self.key == "neural-compressor" and name.endswith("_quant"):
            return name[: -len("_quant")]
        return name

    def tensor(self, c):
        """``(float tensor, folded Relu/Clip node or None)`` that calibration node ``c`` quantizes.

        Quark applies its tensor settings to the graph it rewrote first (MatMul+Add into a
        Gemm with a transposed weight of its own name, say), so its names are those the QDQ
        file shows, less its Q/DQ suffixes; the others' are the float model's."""
        qm = self.qm
        c = qm.chain_head(c.name)  # a requantize chain quantizes its first pair's tensor again
        alignment = None if self.key == "quark" else self.alignment
        if c.kind == "weight":
            if alignment is not None and c.name in alignment.weights:
                return alignment.weights[c.name], None
            if c.float_weight and alignment is not None:
                return float_source(c.float_weight), None
            suffix = _STORED_SUFFIX.get(self.key, "_quantized")
            if c.q_node is None and c.input.endswith(suffix):
                return c.input[: -len(suffix)], None
            return c.input, None
        if c.input in qm.input_names:
            return c.input, None
        for o in c.outputs:
            if o in qm.output_names:
                return o, None  # the pair writes the graph output (Quark, aimet)
        if alignment is not None and c.producer in alignment.nodes:
            fnode = alignment.nodes[c.producer]
            k = list(qm.normal[c.producer].outputs).index(c.input)
            tensor = self.fg.outputs[fnode][k]
            if c.folded:
                # the quantizer deleted the Relu/Clip after the op and took its range: the
                # float tensor is the activation's output, and the activation is excluded too
                act = next((n for n in self.fg.consumers.get(tensor, ()) if self.fg.op[n] in FOLDABLE), None)
                if act is not None:
                    return self.fg.outputs[act][0], act
            return tensor, None
        for suffix in ("_QuantizeInput", "_QuantizeLinear_Input"):
            if c.input.endswith(suffix):
                return c.input[: -len(suffix)], None
        return c.input, None

    def keep_float(self, c, with_producer):
        """Nodes to exclude so that ``c``'s tensor is not quantized: the operators ``c`` counts
        for (:meth:`QuantModel.counts_for`, the ranking's mapping: those reading it, and for an
        earlier pair of a requantize chain those reading the chain), and with onnxruntime's
        placement its producer (and a folded activation). There a tensor gets a pair while any
        of its readers is quantized, so the operators of the whole chain it is in go too,
        with its first pair's producer (a later pair's input is a DequantizeLinear's)."""
        qm, out = self.qm, []
        _, act = self.tensor(c)
        head = qm.chain_head(c.name)
        if with_producer and head.is_activation and head.producer in qm.normal:
            out.append(self.node(head.producer))
            out.append(act)
        out += [self.node(n) for n in qm.counts_for(head.name if with_producer else c.name)]
        return [n for n in dict.fromkeys(out) if n]


def producer_terms(qmodel, remedy, nodes, axes=None, choices=None, float_model=None):
    """The remedy in the terms of the producer that made ``qmodel`` (its ``made_by``), or
    None when that is onnxruntime or unknown (onnxruntime's settings say it all).

    ``remedy``, ``axes`` (per-channel axes of weights) and ``choices`` as in
    :func:`~pytest_ptq.remedy.onnxruntime_settings`; ``float_model`` (path or ModelProto) maps the
    QDQ names onto the float model's. Returns a JSON-safe dict: ``producer``, ``label``
    (and ``short``),
    ``names`` (``"float model"`` or ``"QDQ graph"``), ``settings`` in the producer's own
    vocabulary, ``expect`` (float tensors that must come out ``float``, ``int16`` or
    ``per-channel`` when re-quantized with them), ``unsupported`` (what it cannot express,
    with why; ``instead``: the nearest term, keeping those nodes in float), ``lines`` (the
    ready-to-paste command or code) and ``notes``; :meth:`Remedy.summary` prints them.
    """
    if remedy not in REMEDIES + (MIXED,):
        raise unknown("remedy", remedy, REMEDIES + (MIXED,))
    key = qmodel.made_by.key
    if key not in PRODUCERS:
        return None
    choices, axes = choices or {}, axes or {}
    unnamed = qmodel.unnamed  # a second parse sees the names the first one gave
    if float_model is not None and getattr(qmodel, "alignment", None) is None:
        from ..model import QuantModel

        qmodel = QuantModel(qmodel.full_model(), float_model=float_model)  # aligned, the given one untouched
    names = ProducerNames(qmodel, key, float_model, unnamed)
    kinds = {}
    for name in nodes:
        if name not in qmodel.calibration:
            raise unknown("calibration node", name, list(qmodel.calibration))
        kind = choices.get(name, remedy)
        if kind not in REMEDIES:
            raise PTQError(f"node {name!r} needs a remedy kind ({', '.join(REMEDIES)}) in choices, got {kind!r}")
        kinds[name] = kind
    version = f" {qmodel.made_by.version}" if qmodel.made_by.version else ""
    terms = {"producer": key, "label": KNOWN[key] + version, "short": SHORT[key],
             "names": "float model" if names.fg.given else "QDQ graph", "settings": {}, "nodes": {}, "expect": {k: [] for k in REMEDIES}, "unsupported": [],
             "lines": [], "notes": []}
    build = {"modelopt": _modelopt, "quark": _quark, "neural-compressor": _inc, "aimet": _aimet}[key]
    build(qmodel, names, kinds, axes, terms)
    rewritten = len(names.rewritten)
    for name, entry in terms["nodes"].items():  # which pair of a requantize chain the re-quantized check compares
        entry["position"] = qmodel.chain_position(name)
        # and which of a tensor's pairs, where each operator reading it (or each input of one
        # operator) has its own: the [operator, input index] it reaches
        entry["readers"] = [list(r) for r in readers(qmodel, name, names.node)]
    del names.rewritten[rewritten:]  # naming the readers is no term: their rewrites are no note of these terms
    for kind in REMEDIES:
        terms["expect"][kind] = list(dict.fromkeys(terms["expect"][kind]))
    if not names.fg.given:
        terms["notes"].append(f"names are the QDQ graph's ({_keeps(key)}); pass the float model to map them onto "
                              "its nodes")
    if names.rewritten:
        shown = ", ".join(dict.fromkeys(names.rewritten))
        terms["notes"].append(f"{shown}: made by {SHORT[key]}'s own rewrite (no float-model counterpart), named as "
                              "in the QDQ graph")
    generated = sorted({n for entry in terms["nodes"].values() for n in entry.get("nodes", ())} & names.fg.unnamed)
    if generated:
        terms["notes"].append(f"float node(s) {', '.join(generated)} have no name of their own in the file (none, or "
                              f"one another node shares: the names are generated); name each in the float model so "
                              f"that {SHORT[key]} can exclude them")
    return terms


def producer_advice(engine, choices):
    """A fix in the terms of the quantizer that made ``engine``'s model, as the summary lines
    of :func:`~.result.producer_lines`: ``choices`` maps calibration nodes to ``float``,
    ``int16`` or ``per-channel`` (a weight's channel axis read from its float values); named
    as the engine's float model names them when it has one. [] for onnxruntime's own models,
    an unknown producer or no choice."""
    qm = engine.qmodel
    if not choices or qm.made_by.key not in PRODUCERS:
        return []
    axes = {}
    for name, kind in choices.items():
        c = qm.calibration[name]
        w = float_input(engine, c) if kind == "per-channel" and c.kind == "weight" else None
        if w is not None and w.ndim >= 2:
            axes[name] = channel_axis(qm, c, w.shape)
    try:
        return producer_lines(producer_terms(qm, MIXED, list(choices), axes, choices, engine.float_model))
    except PTQError as exc:  # advice beside a finished analysis: said, never its end
        return [f"in {qm.made_by.label}'s terms: none given ({exc})"]


def _keeps(key):
    return {"neural-compressor": "Neural Compressor's without their _quant suffix"}.get(
        key, f"{SHORT[key]} keeps the float model's names")


def _entry(terms, name, kind, tensor, nodes=None):
    entry = {"kind": kind, "tensor": tensor}
    if nodes is not None:
        entry["nodes"] = nodes
    terms["nodes"][name] = entry


def _unsupported(terms, name, kind, why, instead=None):
    item = {"node": name, "kind": kind, "why": why}
    if instead is not None:
        item["instead"] = instead
    terms["unsupported"].append(item)


def _pattern(name, others):
    """A ``re.match`` pattern that matches node ``name`` and no other: the name itself when
    it is no regular-expression trouble, anchored with ``$`` when it prefixes another."""
    pattern = re.escape(name)
    if any(o != name and re.match(pattern, o) for o in others):
        pattern += "$"
    return pattern


def _exclusion(terms, names, c, name, kind, tensor, with_producer, cannot=None):
    """The nodes to exclude that keep calibration node ``c``'s tensor in float, entered in
    ``terms``; ``cannot``: why the producer cannot apply ``kind``, which float then replaces."""
    nodes = names.keep_float(c, with_producer=with_producer)
    _entry(terms, name, kind, tensor, nodes)
    if cannot is None:
        terms["expect"]["float"].append(tensor)
    else:
        _unsupported(terms, name, kind, cannot, {"nodes_to_exclude": nodes})
    return nodes


def _modelopt(qm, names, kinds, axes, terms):
    excluded, instead = [], []
    for name, kind in kinds.items():
        c = qm.calibration[name]
        tensor, _ = names.tensor(c)
        if kind == "float" and qm.requantizes(name) is not None:
            excluded += _later_pair_excluded(qm, names, c, terms)
        elif kind == "float":
            excluded += _exclusion(terms, names, c, name, kind, tensor, False)
        elif kind == "int16":
            instead += _exclusion(terms, names, c, name, kind, tensor, False,
                                  "Model Optimizer has no int16 quantization (int8, fp8 and int4 only)")
        elif c.kind == "weight":
            _entry(terms, name, kind, tensor)
            _unsupported(terms, name, kind, "Model Optimizer quantizes int8 weights per channel always; there is no "
                         "per-tensor setting to change")
        else:
            _entry(terms, name, kind, tensor)
            _unsupported(terms, name, kind, "Model Optimizer quantizes activations per tensor only")
    excluded = names.fg.ordered(excluded)
    node_list, op_types = _by_op_type(names.fg, excluded)
    every = list(names.fg.op)
    patterns = [_pattern(n, every) for n in node_list]
    terms["settings"] = {"nodes_to_exclude": patterns, "op_types_to_exclude": op_types}
    if patterns or op_types:
        cli = ["python -m modelopt.onnx.quantization --onnx_path FLOAT.onnx ..."]
        if patterns:
            cli.append("--nodes_to_exclude " + " ".join(shlex.quote(p) for p in patterns))
        if op_types:
            cli.append("--op_types_to_exclude " + " ".join(op_types))
        terms["lines"].append(" ".join(cli))
        terms["lines"].append("in Python: " + modelopt_call(terms["settings"]))
    if instead:
        shown = " ".join(shlex.quote(_pattern(n, every)) for n in dict.fromkeys(instead))
        terms["instead"] = f"--nodes_to_exclude {shown}"


MODELOPT_QUANTIZE = "modelopt.onnx.quantization.quantize"
# what per-channel weights come to with Model Optimizer, which has no per-channel switch to set
MODELOPT_PER_CHANNEL = ("Model Optimizer quantizes int8 weights per channel by default; the ones below are per "
                        "tensor: re-export them per channel")


def modelopt_call(settings):
    """Model Optimizer's ``settings`` (``nodes_to_exclude`` patterns, ``op_types_to_exclude``)
    as its Python call, ready to paste; "" when they exclude nothing."""
    kw = [f"{k}={settings[k]!r}" for k in ("nodes_to_exclude", "op_types_to_exclude") if settings.get(k)]
    return f"{MODELOPT_QUANTIZE}(..., {', '.join(kw)})" if kw else ""


def kept_in_float(qmodel, nodes, float_model=None):
    """``(settings, notes)`` that keep calibration ``nodes`` in float in the terms of the
    quantizer that made ``qmodel``, for advice written in those terms rather than onnxruntime's
    (Model Optimizer's, whose placement is not quantize_static's): its settings and the notes of
    the nodes' entries (a requantize chain's later pair), one source for every line that prints
    them. Raises :class:`~pytest_ptq.errors.PTQError` where they cannot be named."""
    terms = producer_terms(qmodel, "float", nodes, float_model=float_model)
    if terms is None:
        raise PTQError(f"{qmodel.made_by.label} has no terms of its own; use onnxruntime's settings")
    notes = [e["note"] for n in nodes if "note" in (e := terms["nodes"].get(n, {}))]
    return terms["settings"], list(dict.fromkeys(notes))


def _later_pair_excluded(qm, names, c, terms):
    """Model Optimizer's exclusion for a later pair of a requantize chain kept in float, and the
    note on how it departs from the simulated remedy (that pair alone removed): it puts one pair
    on an op's input, so excluding the operators reading the later pair leaves their input with
    no pair, the earlier ones' too; the tensor comes out float only where no operator reads
    the chain's earlier pairs (a Relu beside it still reads them, as simulated)."""
    tensor, _ = names.tensor(c)
    nodes = names.keep_float(c, with_producer=False)
    _entry(terms, c.name, "float", tensor, nodes)
    earlier = qm.chain(c.name)
    earlier = earlier[:earlier.index(c.name)]
    others = [names.node(n) for n in qm.counts_for(qm.chain_head(c.name).name) if names.node(n) not in nodes]
    others = [n for n in dict.fromkeys(others) if n]
    if not others:
        terms["expect"]["float"].append(tensor)
    _chain_note(terms, c, later_pair_note(
        qm, c, f"excluding {', '.join(nodes)} leaves {'its' if len(nodes) == 1 else 'their'} input without the earlier "
        "pair too", "Model Optimizer puts one pair on an op's input: it has no term for the later pair alone")
        + (f"; {', '.join(others)} still {'reads' if len(others) == 1 else 'read'} {tensor} through {', '.join(earlier)}"
           if others else ""))
    return nodes


def _later_pair_note(qm, names, c, nodes, terms, why, action=None):
    """The note for a producer whose exclusion (of ``nodes``, or ``action``: the words of what
    its terms do instead) keeps a requantize chain's later pair in float with one pair, or one
    quantizer, on a tensor for all its readers (onnxruntime's placement, aimet's quantizers):
    the whole tensor goes float, its earlier pairs with it."""
    if qm.requantizes(c.name) is not None:
        tensor, _ = names.tensor(c)
        _chain_note(terms, c, later_pair_note(qm, c, chain_float_consequence(qm, c, nodes, tensor, names.node, action),
                                              why))


def _chain_note(terms, c, note):
    """``note`` on keeping ``c``, a requantize chain's later pair, in float: among the terms'
    notes, and as its entry's ``note``, for whoever gives that pair's advice alone (the
    diagnosis, for a producer whose terms its fix is written in)."""
    terms["notes"].append(note)
    terms["nodes"][c.name]["note"] = note


def _by_op_type(fg, excluded):
    """``(names, op types)``: an op type replaces its names when every node of it (two or
    more) is excluded, as ``--op_types_to_exclude`` says it shorter."""
    counts = Counter(fg.op.get(n) for n in excluded)
    types = sorted(t for t, k in counts.items() if t and k >= 2 and k == len(fg.of_type(t)))
    return [n for n in excluded if fg.op.get(n) not in types], types


def _signed_type(c, bits):
    signed, unsigned = _QUANT_TYPES[bits]
    return signed if c.qrange[0] < 0 else unsigned


def _quark(qm, names, kinds, axes, terms):
    excluded, overrides = [], {}
    for name, kind in kinds.items():
        c = qm.calibration[name]
        tensor, _ = names.tensor(c)
        if kind == "float":
            nodes = names.keep_float(c, with_producer=True)
            _entry(terms, name, kind, tensor, nodes)
            nameless = names.nameless(nodes)
            if nameless:
                _unsupported(terms, name, kind, "a node of Quark's own rewrite that reads or writes the tensor "
                             "(the Mul of an inlined HardSwish, say) has no name, and exclude matches names")
            else:
                excluded += nodes
                terms["expect"]["float"].append(tensor)
                _later_pair_note(qm, names, c, nodes, terms, _QUARK_CHAIN)
        elif kind == "int16" and len(qm.chain(name)) > 1:
            # a bare 16-bit type on the tensor would raise the chain's other pair too
            entry = chain_entry(qm, c, names.node)
            _entry(terms, name, kind, tensor)
            if entry is None:
                _unsupported(terms, name, kind, "Quark takes one 'convert' a tensor in TensorQuantOverrides, which "
                             "writes a chain of two pairs of 8 or 16 bit only")
            else:
                overrides[tensor] = [entry]
                terms["expect"]["int16"].append(tensor)
        elif kind == "int16":
            overrides.setdefault(tensor, [{}])[0]["quant_type"] = _signed_type(c, 16)
            _entry(terms, name, kind, tensor)
            terms["expect"]["int16"].append(tensor)
        elif c.kind == "weight" and name in axes and qm.file_axis(c, axes[name]) is not None:
            overrides.setdefault(tensor, [{}])[0]["axis"] = int(qm.file_axis(c, axes[name]))
            _entry(terms, name, kind, tensor)
            terms["expect"]["per-channel"].append(tensor)
        else:
            _entry(terms, name, kind, tensor)
            _unsupported(terms, name, kind, "Quark quantizes activations per tensor only")
    excluded = names.fg.ordered(excluded)
    terms["settings"] = {"exclude": excluded, "TensorQuantOverrides": overrides}
    if excluded or overrides:
        terms["lines"].append("config = copy.deepcopy(quark.onnx.<the QConfig you used>)")
        if excluded:
            terms["lines"].append(f"config.exclude += {excluded!r}")
        if overrides:
            body = ", ".join(f"{t!r}: [{override_text(e[0], 'ExtendedQuantType')}]" for t, e in overrides.items())
            terms["lines"].append("config.extra_options.setdefault('TensorQuantOverrides', {}).update({" + body
                                  + "})  # from quark.onnx import ExtendedQuantType")
        terms["lines"].append("ModelQuantizer(config).quantize_model(FLOAT.onnx, OUT.onnx, reader)")


_QUARK_CHAIN = ("Quark puts one pair on a tensor for all its readers, as onnxruntime does, and the later pair only "
                "from a 'convert' entry in TensorQuantOverrides: where the config that made the model gives the tensor "
                "one, dropping it removes that pair alone")


def _inc(qm, names, kinds, axes, terms):
    excluded, per_channel, instead = [], [], []
    for name, kind in kinds.items():
        c = qm.calibration[name]
        tensor, _ = names.tensor(c)
        if kind == "float":
            nodes = _exclusion(terms, names, c, name, kind, tensor, True)
            excluded += nodes
            _later_pair_note(qm, names, c, nodes, terms, "Neural Compressor puts one pair on a tensor for all its "
                             "readers, as onnxruntime does: it has no term for the later pair alone")
        elif kind == "int16":
            instead += _exclusion(terms, names, c, name, kind, tensor, True,
                                  "Neural Compressor's quantizer knows 8-bit types only (no int16)")
        elif c.kind == "weight" and name in axes:
            nodes = names.keep_float(c, with_producer=False)  # the nodes reading the weight
            per_channel += nodes
            _entry(terms, name, kind, tensor, nodes)
            terms["expect"]["per-channel"].append(tensor)
        else:
            _entry(terms, name, kind, tensor)
            _unsupported(terms, name, kind, "Neural Compressor quantizes activations per tensor only")
    excluded = names.fg.ordered(excluded)
    per_channel = names.fg.ordered(per_channel)
    every = list(names.fg.op)
    op_config = _inc_operator_config(qm) if per_channel else None
    terms["settings"] = {"nodes_to_exclude": excluded,
                         "per_channel": {_pattern(n, every): op_config for n in per_channel}}
    if excluded or per_channel:
        terms["lines"].append("qconfig = config.StaticQuantConfig(calibration_data_reader=reader, "
                              f"quant_format=QuantFormat.QDQ, nodes_to_exclude={excluded!r})")
        for n in per_channel:
            kw = ", ".join(f"{k}=QuantType.{v}" if k.endswith("_type") else f"{k}={v!r}" for k, v in op_config.items())
            terms["lines"].append(f"qconfig.set_local({_pattern(n, every)!r}, config.OperatorConfig({kw}))")
        terms["lines"].append("quantize(FLOAT.onnx, OUT.onnx, qconfig)  # from onnx_neural_compressor.quantization")
    if instead:
        terms["instead"] = f"nodes_to_exclude={list(dict.fromkeys(instead))!r}"


def _inc_operator_config(qm):
    """The model's own weight and activation types and symmetry, for an OperatorConfig that
    changes only per_channel."""
    def common(cs, default):
        types = Counter((c.bit, c.qrange[0] < 0) for c in cs if c.bit == 8)
        if not types:
            return default
        bits, signed = types.most_common(1)[0][0]
        return _QUANT_TYPES[bits][0 if signed else 1]

    acts = [c for c in qm.of_kind("activation") if c.q_node is not None]
    weights = [c for c in qm.of_kind("weight") if c.role != "bias"]
    act_type = common(acts, "QUInt8")
    return {"weight_type": common(weights, "QInt8"), "activation_type": act_type, "per_channel": True,
            "weight_sym": all(not c.zero_point.any() for c in weights) if weights else True,
            "activation_sym": act_type == "QInt8" and all(not c.zero_point.any() for c in acts)}


# Ops that move data without computing it: aimet's export puts a pair after them that copies
# the encoding of the pair before (it has no quantizer of its own there).
_MOVES = {*RESHAPING, *TRANSPARENT, "Transpose", "MaxPool"}


def _copied_from(qm, c):
    """The calibration node whose encoding ``c`` copies across a data-movement op (the same
    scale and zero point right before it), else ``c`` itself; followed up the chain."""
    seen = {c.name}
    while c.kind == "activation":
        op = qm.producer.get(c.input)
        up = qm.by_output().get(op.input[0]) if op is not None and op.op_type in _MOVES and op.input else None
        if up is None or up.name in seen or np.shape(up.scale) != np.shape(c.scale) or \
                not (np.array_equal(up.scale, c.scale) and np.array_equal(up.zero_point, c.zero_point)):
            break
        seen.add(up.name)
        c = up
    return c


_AIMET_CHAIN = ("aimet-onnx's QuantizationSimModel has one quantizer per float tensor, sim.qc_quantize_op_dict[name], "
                "which every reader of the tensor reads and .enabled = False turns off for all of them: it has no "
                "term for the later pair alone")


def _aimet(qm, names, kinds, axes, terms):
    disable, bitwidth, per_channel = [], {}, []
    for name, kind in kinds.items():
        c = qm.calibration[name]
        tensor, _ = names.tensor(_copied_from(qm, c))  # aimet's quantizer: the one whose encoding it copies
        _entry(terms, name, kind, tensor)
        if kind == "float":
            disable.append(tensor)
            terms["expect"]["float"].append(tensor)
            _later_pair_note(qm, names, c, (), terms, _AIMET_CHAIN, action=f"disabling the quantizer of {tensor}")
        elif kind == "int16":
            bitwidth[tensor] = 16
            terms["expect"]["int16"].append(tensor)
        elif c.kind == "weight":
            per_channel.append(tensor)
            terms["expect"]["per-channel"].append(tensor)
        else:
            _unsupported(terms, name, kind, "aimet-onnx quantizes activations per tensor only")
    disable = list(dict.fromkeys(disable))
    per_channel = list(dict.fromkeys(per_channel))
    terms["settings"] = {"disable": disable, "bitwidth": bitwidth, "per_channel": per_channel}
    if disable or bitwidth or per_channel:
        terms["lines"].append("sim = QuantizationSimModel(model, ...)  # then, before sim.compute_encodings(...):")
        if disable:
            terms["lines"].append(f"for name in {disable!r}: sim.qc_quantize_op_dict[name].enabled = False")
        if bitwidth:
            terms["lines"].append(f"for name in {list(bitwidth)!r}: sim.qc_quantize_op_dict[name].set_bitwidth(16)")
        if per_channel:
            terms["lines"].append(f"for name in {per_channel!r}: "
                                  "sim.qc_quantize_op_dict[name].enable_per_channel_quantization()")

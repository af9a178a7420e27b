"""The engine: a calibrated QDQ model compiled once, run under any quantization config.

Every calibration node becomes an ``If`` on a boolean feed: its then-branch holds the
original Q/DQ nodes, its else-branch passes the float tensor through. A config (which
calibration nodes are quantized) is therefore a set of feed values, one onnxruntime
session serves every config, and a bypassed pair costs one ``If`` dispatch instead of a
quantize-dequantize over the whole tensor, so a config with one quantized node costs about
one float forward pass.

Q/DQ run as fake-quant: onnxruntime's QDQ-to-integer fusion is switched off.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .data import load_data
from .errors import PTQError, unknown
from .metrics import compare
from .model import QuantModel

_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
           "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
FLAG_PREFIX = "ptq_flag::"
ALT_PREFIX = "ptq_alt::"
# Keep float references in memory up to this many bytes; beyond, they are recomputed.
_REF_CACHE_BYTES = 512 * 2**20


def _ort():
    import onnxruntime as ort

    return ort


def default_providers():
    """CUDA when onnxruntime has it (and PTQ_PROVIDERS does not say otherwise), else CPU."""
    env = os.environ.get("PTQ_PROVIDERS")
    if env:
        return [p.strip() for p in env.split(",") if p.strip()]
    available = _ort().get_available_providers()
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def session_options(optimization="all"):
    """SessionOptions that keep Q/DQ as fake-quant at the given optimisation level."""
    ort = _ort()
    if optimization not in _LEVELS:
        raise unknown("optimization level", optimization, list(_LEVELS))
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[optimization])
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    # An engine holds many sessions run one after another: threads left spinning by one
    # starve the next (measured: a float pass 6x slower with spinning on).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def make_session(model, optimization="all", providers=None):
    """An onnxruntime session for a ModelProto, with a readable error if it fails."""
    ort = _ort()
    try:
        return ort.InferenceSession(model.SerializeToString(), session_options(optimization),
                                    providers=providers or default_providers())
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PTQError(f"onnxruntime cannot load the model ({msg}); check that it runs in a plain "
                       "onnxruntime session") from None


def bypass_nodes(c, out, elem=onnx.TensorProto.FLOAT):
    """Nodes computing ``out`` for calibration node ``c`` bypassed: its float tensor, with the
    Relu/Clip that quantize_static folded into the pair (``c.folded``) applied again."""
    src = c.float_weight or c.input
    if c.folded is None:
        return [helper.make_node("Identity", [src], [out])]
    op, lo, hi = c.folded
    if op == "Relu":
        return [helper.make_node("Relu", [src], [out])]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    return [helper.make_node("Constant", [], [f"{out}::lo"], value=numpy_helper.from_array(np.array(lo, dtype))),
            helper.make_node("Constant", [], [f"{out}::hi"], value=numpy_helper.from_array(np.array(hi, dtype))),
            helper.make_node("Clip", [src, f"{out}::lo", f"{out}::hi"], [out])]


def _tensor_type(elem_type):
    return onnx.helper.make_tensor_type_proto(elem_type, None)


class Engine:
    """A calibrated model and its data, compiled once for every analysis.

    ``run(i, quantized)`` returns the chosen tensors of sample ``i`` with exactly the
    calibration nodes in ``quantized`` quantized and every other one bypassed.

    ``float_model``: the original float model, to recover float weights and folded Relu/Clip.
    ``data_num``: keep the first N samples. ``optimization``: onnxruntime graph optimisation
    level (``disable``, ``basic``, ``extended``, ``all``). ``providers``: onnxruntime
    execution providers (default: CUDA when available, else CPU). ``check``: refuse a model
    whose bypassed form cannot be the float model. ``alternatives``: ``{node: QParams}``, a
    second fake-quant per node (16 bit, per channel) chosen per run. ``segments``: number of
    segments for model-output runs (default about sqrt(#calibration nodes), at most 16; 0 runs
    the whole gated model instead).
    """

    def __init__(self, model_or_file, calibrated_data=None, float_model=None, data_num=None,
                 optimization="all", providers=None, check=True, alternatives=None, segments=None):
        if isinstance(model_or_file, QuantModel):
            self.qmodel = model_or_file
        else:
            self.qmodel = QuantModel(model_or_file, float_model=float_model)
        self.float_model = float_model
        self.optimization = optimization
        session_options(optimization)  # reject a bad level now, not at first run
        self.providers = providers or default_providers()
        self.data = load_data(calibrated_data, self.qmodel, data_num) if calibrated_data is not None else None
        self.calib_names = [c.name for c in self.qmodel.calibration.values() if c.bypassable]
        self._flag = {name: f"{FLAG_PREFIX}{k}" for k, name in enumerate(self.calib_names)}
        # A second way to quantize some nodes (16 bit, per channel), chosen per run by a feed.
        self.alternatives = dict(alternatives or {})
        for name in self.alternatives:
            if name not in self._flag:
                raise unknown("node", name, self.calib_names)
        self._alt = {name: f"{ALT_PREFIX}{k}" for k, name in enumerate(self.alternatives)}
        self._true, self._false = np.array(True), np.array(False)
        self._sessions = {}
        self._segments_count = segments
        self._segments = None
        self._last_sample = None
        self._ref_cache, self._ref_bytes = {}, 0
        self.model_outputs = list(self.qmodel.output_names)
        self.probe_tensors = [t for n in self.qmodel.normal.values() for t in n.outputs
                              if t and self.qmodel.is_float_tensor(t)]
        self.warnings = []
        if not self.calib_names:
            self.warnings.append(
                "every calibration node is a lone DequantizeLinear of an already quantized weight, so "
                "nothing can be bypassed; pass the float model (float_model=...) to recover float weights")
        elif any(not c.bypassable and c.role != "bias" for c in self.qmodel.calibration.values()):
            self.warnings.append(
                "weights are stored already quantized (DequantizeLinear only) and no float model was "
                "given: weight analyses compare against the dequantized weight; pass the float model "
                "or quantize with extra_options={'AddQDQPairToWeight': True} for float weights")
        if check and self.data is not None:
            self.check_float_equivalence()

    # -- compilation -------------------------------------------------------------------
    def _instrumented(self, extra_outputs=(), local=False):
        qm = self.qmodel
        model = onnx.ModelProto()
        model.CopyFrom(qm.model)
        graph = model.graph
        del graph.node[:]
        at_node = {}
        dropped = set()
        for c in qm.calibration.values():
            if not c.bypassable:
                continue
            anchor = c.q_node if c.q_node is not None else c.dq_nodes[0]
            at_node[anchor.name] = c
            dropped.update(d.name for d in c.dq_nodes)
        for node in qm.model.graph.node:
            if node.name in at_node:
                graph.node.append(self._gate(at_node[node.name]))
            elif node.name not in dropped:
                graph.node.append(node)
        for name, value in qm.float_weights.items():
            graph.initializer.append(numpy_helper.from_array(value, name))
        for name in self.calib_names:
            graph.input.append(helper.make_tensor_value_info(self._flag[name], onnx.TensorProto.BOOL, []))
        for name, alt in self.alternatives.items():
            graph.input.append(helper.make_tensor_value_info(self._alt[name], onnx.TensorProto.BOOL, []))
            k = self._alt[name]
            graph.initializer.extend([
                numpy_helper.from_array(np.asarray(alt.scale, np.float32), f"{k}::scale"),
                numpy_helper.from_array(np.asarray(alt.zero_point, np.float32), f"{k}::zp"),
                numpy_helper.from_array(np.asarray(alt.qmin, np.float32), f"{k}::qmin"),
                numpy_helper.from_array(np.asarray(alt.qmax, np.float32), f"{k}::qmax")])
        if local:
            extra_outputs = list(extra_outputs) + self._add_local_clones(graph)
        present = {o.name for o in graph.output}
        for t in extra_outputs:
            if t not in present:
                graph.output.append(helper.make_tensor_value_info(
                    t, qm.value_types.get(t, onnx.TensorProto.FLOAT), None))
                present.add(t)
        return model

    def _gate(self, c):
        """The If node that computes ``c``'s DQ outputs, quantized or bypassed by its flag."""
        qm = self.qmodel
        then_nodes, then_out, else_nodes, else_out = [], [], [], []
        if c.q_node is not None:
            q = onnx.NodeProto()
            q.CopyFrom(c.q_node)
            q.output[0] = f"ptq_t::{c.q_node.output[0]}"
            then_nodes.append(q)
        for dq in c.dq_nodes:
            d = onnx.NodeProto()
            d.CopyFrom(dq)
            if c.q_node is not None:
                d.input[0] = f"ptq_t::{c.q_node.output[0]}"
            d.output[0] = f"ptq_t::{dq.output[0]}"
            then_nodes.append(d)
            elem = qm.value_types.get(dq.output[0]) or onnx.helper.np_dtype_to_tensor_dtype(c.scale.dtype)
            then_out.append(helper.make_value_info(d.output[0], _tensor_type(elem)))
            else_nodes += bypass_nodes(c, f"ptq_e::{dq.output[0]}", elem)
            else_out.append(helper.make_value_info(f"ptq_e::{dq.output[0]}", _tensor_type(elem)))
        then_g = helper.make_graph(then_nodes, f"ptq_q_{c.name}", [], then_out)
        if c.name in self.alternatives:
            then_g = self._alternative_branch(c, then_g)
        else_g = helper.make_graph(else_nodes, f"ptq_f_{c.name}", [], else_out)
        return helper.make_node("If", [self._flag[c.name]], c.outputs, name=f"ptq_if::{c.name}",
                                then_branch=then_g, else_branch=else_g)

    def _alternative_branch(self, c, original):
        """Wrap the quantized branch in an If choosing the alternative fake-quant by its flag.

        The alternative is plain arithmetic (Round is half-to-even like QuantizeLinear), so it
        works at any opset and any bit width.
        """
        k = self._alt[c.name]
        src = c.float_weight or c.input
        out_nodes, outs = [], []
        for j, dq in enumerate(c.dq_nodes):
            p = f"ptq_a::{c.name}::{j}"
            out_nodes += [
                helper.make_node("Div", [src, f"{k}::scale"], [f"{p}::d"]),
                helper.make_node("Round", [f"{p}::d"], [f"{p}::r"]),
                helper.make_node("Add", [f"{p}::r", f"{k}::zp"], [f"{p}::z"]),
                helper.make_node("Max", [f"{p}::z", f"{k}::qmin"], [f"{p}::lo"]),
                helper.make_node("Min", [f"{p}::lo", f"{k}::qmax"], [f"{p}::c"]),
                helper.make_node("Sub", [f"{p}::c", f"{k}::zp"], [f"{p}::s"]),
                helper.make_node("Mul", [f"{p}::s", f"{k}::scale"], [f"{p}::y"]),
            ]
            outs.append(helper.make_value_info(f"{p}::y", original.output[j].type))
        alt_g = helper.make_graph(out_nodes, f"ptq_alt_{c.name}", [], outs)
        wrapped_outs = [helper.make_value_info(f"ptq_w::{c.name}::{j}", o.type) for j, o in enumerate(original.output)]
        node = helper.make_node("If", [k], [o.name for o in wrapped_outs], then_branch=alt_g, else_branch=original)
        return helper.make_graph([node], f"ptq_qa_{c.name}", [], wrapped_outs)

    def _add_local_clones(self, graph):
        """Append, for every normal node fed by calibration nodes, a clone fed by its inputs
        quantized from their float values; returns the clone outputs to expose.

        Run with every flag off, the clones give each node's *local* error in one pass.
        """
        qm = self.qmodel
        by_output = {o: c for c in qm.calibration.values() for o in c.outputs}
        local_in, outputs = {}, []
        for n in qm.normal.values():
            if not n.calibration_inputs:
                continue
            proto = next(p for p in qm.model.graph.node if p.name == n.name)
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in proto.attribute):
                continue
            clone = onnx.NodeProto()
            clone.CopyFrom(proto)
            clone.name = f"ptq_local::{n.name}"
            for k, i in enumerate(proto.input):
                c = by_output.get(i)
                if c is None:
                    continue
                if i not in local_in:
                    dq = next(d for d in c.dq_nodes if d.output[0] == i)
                    src = c.float_weight or c.input
                    if c.q_node is not None:
                        q = onnx.NodeProto()
                        q.CopyFrom(c.q_node)
                        q.name = f"ptq_lq::{q.name}::{i}"
                        q.input[0] = src
                        q.output[0] = f"ptq_lq::{i}::q"
                        graph.node.append(q)
                    d = onnx.NodeProto()
                    d.CopyFrom(dq)
                    d.name = f"ptq_ldq::{i}"
                    if c.q_node is not None:
                        d.input[0] = f"ptq_lq::{i}::q"
                    d.output[0] = f"ptq_lq::{i}"
                    graph.node.append(d)
                    local_in[i] = d.output[0]
                clone.input[k] = local_in[i]
            for k, o in enumerate(proto.output):
                if o:
                    clone.output[k] = f"ptq_local::{o}"
            graph.node.append(clone)
            outputs += [o for o in clone.output if o and qm.is_float_tensor(o[len("ptq_local::"):])]
        return outputs

    def session(self, kind="main"):
        """The compiled session: ``main`` (model outputs), ``probe`` (every normal node's
        output too) or ``local`` (plus clones that measure local error). Built on first use."""
        if kind not in self._sessions:
            if kind == "main":
                model = self._instrumented()
            elif kind == "probe":
                model = self._instrumented(self.probe_tensors)
            elif kind == "local":
                model = self._instrumented(self.probe_tensors, local=True)
            else:
                raise ValueError(kind)
            self._sessions[kind] = make_session(model, self.optimization, self.providers)
        return self._sessions[kind]

    @property
    def segments(self):
        """The segmented runner for model outputs (None when ``segments=0``)."""
        if self._segments is None and self._segments_count != 0:
            from .segments import Segments

            self._segments = Segments(self, self._segments_count)
        return self._segments

    # -- running -----------------------------------------------------------------------
    def feeds(self, sample, quantized=(), alternative=()):
        """Model inputs plus one flag per calibration node (True = quantized), and one per
        alternative (True = quantized the alternative way)."""
        quantized, alternative = set(quantized), set(alternative)
        unknown_names = quantized - set(self._flag) - set(self.qmodel.calibration)
        if unknown_names:
            name = sorted(unknown_names)[0]
            raise unknown("node", name, list(self.qmodel.calibration))
        feeds = dict(sample)
        for name, flag in self._flag.items():
            feeds[flag] = self._true if name in quantized else self._false
        for name, flag in self._alt.items():
            feeds[flag] = self._true if name in alternative else self._false
        return feeds

    def sample(self, i):
        """Sample ``i`` of the data; the last one is kept, since analyses loop samples outermost."""
        if self.data is None:
            raise PTQError("no calibration data was given; pass calibrated_data")
        if self._last_sample is None or self._last_sample[0] != i:
            self._last_sample = (i, self.data.sample(i))
        return self._last_sample[1]

    def run(self, sample, quantized=(), tensors=None, kind=None, alternative=()):
        """Tensors of one sample (an index or a feed dict) under a config.

        ``quantized``: the calibration node names quantized ("all" for every one).
        ``tensors``: the tensor names to return (default: the model outputs).
        ``alternative``: quantized nodes that use their alternative parameters.
        """
        key = None
        if isinstance(sample, (int, np.integer)):
            key = int(sample)
            sample = self.sample(key)
        if isinstance(quantized, str) and quantized == "all":
            quantized = self.calib_names
        tensors = list(tensors or self.model_outputs)
        if kind is None:
            main_ok = all(t in self.model_outputs for t in tensors)
            kind = "main" if main_ok else "probe"
        if kind == "probe" and any(t not in self.model_outputs and t not in self.probe_tensors
                                   for t in tensors):
            missing = [t for t in tensors if t not in self.model_outputs and t not in self.probe_tensors]
            raise PTQError(f"tensor {missing[0]!r} is not a float output of a normal node of "
                           f"{self.qmodel.source!r}; name a model output or a node output")
        try:
            if kind == "main" and self.segments is not None:
                return self._run_segmented(key, sample, quantized, alternative, tensors)
            values = self.session(kind).run(tensors, self.feeds(sample, quantized, alternative))
        except PTQError:
            raise
        except Exception as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PTQError(f"onnxruntime failed to run {self.qmodel.source!r} on the calibration "
                           f"data ({msg}); check the data's shapes and dtypes") from None
        return dict(zip(tensors, values))

    def _run_segmented(self, key, sample, quantized, alternative, tensors):
        feeds = self.feeds({}, quantized, alternative)
        seg = self.segments
        touched = {seg.segment_of_gate[name] for name in quantized if name in seg.segment_of_gate}
        return seg.run(key, sample, feeds, touched, tensors)

    def reference(self, i, tensors=None):
        """Float (all bypassed) values of sample ``i``; model outputs are cached per sample."""
        tensors = list(tensors or self.model_outputs)
        key = (i, tuple(tensors))
        if key in self._ref_cache:
            return self._ref_cache[key]
        values = self.run(i, (), tensors)
        size = sum(v.nbytes for v in values.values())
        if self._ref_bytes + size <= _REF_CACHE_BYTES:
            self._ref_cache[key] = values
            self._ref_bytes += size
        return values

    def local(self, i):
        """(float values, locally quantized values) of every normal node output of sample i.

        The second dict holds, per normal node fed by calibration nodes, its output when its
        own inputs are quantized from their float values and nothing upstream is.
        """
        sess = self.session("local")
        names = [o.name for o in sess.get_outputs()]
        values = dict(zip(names, sess.run(names, self.feeds(self.sample(i)))))
        local = {k[len("ptq_local::"):]: v for k, v in values.items() if k.startswith("ptq_local::")}
        return values, local

    # -- sanity --------------------------------------------------------------------------
    def check_float_equivalence(self, sample=0):
        """Raise when bypassing every pair cannot be the float model (folded Relu/Clip)."""
        qm = self.qmodel
        suspects = qm.folded_activation_suspects()
        bypassed = self.run(sample, ())
        quant = self.run(sample, "all")
        broken = [k for k, v in bypassed.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
        exploded = []
        # One suspect can be a conv whose outputs happen to be non-negative; folding by the
        # quantizer marks many. A badly quantized model can legitimately sit far from float,
        # so drift alone convicts only with many suspects.
        many = len(suspects) >= max(2, 0.1 * len(qm.of_kind("activation")))
        for k, v in bypassed.items():
            q = quant[k]
            if suspects and v.dtype.kind == "f" and np.isfinite(v).all() and np.isfinite(q).all():
                vn, qn = float(np.abs(v).max(initial=0)), float(np.abs(q).max(initial=0))
                if vn > 10 * max(qn, 1e-6) or (many and compare(v, q)["cosine-similarity"] < 0.99):
                    exploded.append(k)
        fix = ("pass the float model (float_model=... / --float-model) or re-quantize with "
               "extra_options={'AddQDQPairToWeight': True, 'QDQKeepRemovableActivations': True}")
        if broken or exploded:
            why = (f"gives non-finite values in output {broken[0]!r}" if broken
                   else f"makes output {exploded[0]!r} diverge from the quantized model")
            extra = (f" ({len(suspects)} activation pairs such as {suspects[0]!r} start at exactly 0 after "
                     f"a signed op: their Relu/Clip was folded into the Q/DQ range and deleted)"
                     if suspects else "")
            raise PTQError(f"bypassing every Q/DQ pair of {qm.source!r} {why}, so it is not the float "
                           f"model{extra}; {fix}")
        if self.float_model is not None:
            fsess = make_session(_load_float(self.float_model), self.optimization, self.providers)
            ref = dict(zip([o.name for o in fsess.get_outputs()],
                           fsess.run(None, self.sample(sample) if isinstance(sample, int) else sample)))
            for k, v in bypassed.items():
                if k in ref:
                    cos = compare(ref[k], v)["cosine-similarity"]
                    if cos < 0.999:
                        raise PTQError(f"bypassing every Q/DQ pair of {qm.source!r} does not reproduce the "
                                       f"float model {_describe(self.float_model)!r} on output {k!r} (cosine "
                                       f"{cos:.4f}); check that it is the model this one was quantized "
                                       "from, or re-quantize with extra_options={'AddQDQPairToWeight': "
                                       "True, 'QDQKeepRemovableActivations': True}")
        elif suspects:
            self.warnings.append("folded activations suspected: " + ", ".join(suspects[:5]))
        if many and self.float_model is None:
            warnings.warn(f"{len(suspects)} activation pairs of {qm.source} (e.g. {suspects[0]}) look like "
                          "they absorbed a deleted Relu/Clip; bypassed results may not be the float "
                          f"model: {fix}", stacklevel=2)


def _describe(model_or_file):
    return "<ModelProto>" if isinstance(model_or_file, onnx.ModelProto) else str(model_or_file)


def _load_float(float_model):
    from .model import load_model

    return load_model(float_model, what="float model")[0]

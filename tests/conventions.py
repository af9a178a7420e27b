"""QDQ models in other quantizers' conventions, made from a float model with onnx.helper.

A small quantizer of its own (MinMax ranges from the calibration samples) whose options
reproduce what NVIDIA Model Optimizer, AMD Quark, Intel Neural Compressor, Qualcomm
aimet-onnx and onnxruntime write: the Q/DQ type (integer or float8, standard or
com.microsoft domain), granularity (per tensor, per channel, per block), where weights
live (float behind a pair, already on the grid, stored quantized behind a lone DQ), folded
and deleted Relu, renamed tensors, an fp16 graph with Casts, a graph stored out of order,
Sigmoid replaced by HardSigmoid, a bias DQ with a stray axis. No pytest_ptq code is used.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import builders

# Ops whose float inputs get a Q/DQ pair, and the input positions that are weights.
QUANT_OPS = {"Conv": (1,), "Gemm": (1,), "MatMul": (1,), "Add": (), "Mul": (), "GlobalAveragePool": (),
             "Concat": (), "AveragePool": ()}
FOLDABLE = {"Relu"}
_NP = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
       TensorProto.UINT16: np.uint16, TensorProto.INT4: ml_dtypes.int4, TensorProto.UINT4: ml_dtypes.uint4,
       TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn}
_RANGE = {TensorProto.INT8: (-128, 127), TensorProto.UINT8: (0, 255), TensorProto.INT16: (-32768, 32767),
          TensorProto.UINT16: (0, 65535), TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15),
          TensorProto.FLOAT8E4M3FN: (-448.0, 448.0)}


@dataclasses.dataclass(frozen=True)
class Convention:
    """How a quantizer writes its QDQ model (see the module docstring)."""

    act: int = TensorProto.UINT8
    weight: int = TensorProto.INT8
    per_channel: bool = False
    block_size: int = 0  # weights quantized per block of this many input channels (MatMul)
    weights: str = "pair"  # "pair": float behind Q/DQ; "on_grid": rounded first; "stored": lone DQ
    act_weights_only: bool = False  # no activation pairs (weight-only int4)
    fold_relu: bool = False  # delete Relu after folding it into the range of the pair that follows
    fp16: bool = False  # compute in float16, Cast at the inputs and outputs, fp16 scales
    shuffle: bool = False  # store the nodes out of topological order
    domain: str = ""  # domain of the Q/DQ ops ("com.microsoft" for onnxruntime's contrib ops)
    rename: str = ""  # suffix given to every intermediate tensor and initializer
    hardsigmoid: bool = False  # Sigmoid replaced by HardSigmoid (a quantizer rewriting ops)
    bias: bool = False  # Conv/Gemm biases quantized to int32 behind a lone DQ
    bias_axis: int | None = None  # axis attribute written on a per-channel bias DQ
    pow2: bool = False  # scales rounded up to powers of two
    symmetric: bool = False  # signed activations with zero point 0
    # block scales of the weight's signed extreme over -8 (onnxruntime's symmetric 4-bit
    # quantizer: negative where that extreme is positive, its code -8)
    signed_extreme: bool = False
    opset: int = 21


CONVENTIONS = {
    "onnxruntime": Convention(),
    "modelopt_int8_fp16": Convention(act=TensorProto.INT8, per_channel=True, symmetric=True, fp16=True),
    "modelopt_int8_fp32": Convention(act=TensorProto.INT8, per_channel=True, symmetric=True),
    "modelopt_fp8": Convention(act=TensorProto.FLOAT8E4M3FN, weight=TensorProto.FLOAT8E4M3FN, per_channel=True,
                               symmetric=True),
    "modelopt_int4": Convention(weight=TensorProto.INT4, block_size=32, weights="stored", act_weights_only=True,
                                rename="_i4"),
    "onnxruntime_int4_symmetric": Convention(weight=TensorProto.INT4, block_size=32, weights="stored",
                                             act_weights_only=True, signed_extreme=True),
    "quark_xint8": Convention(act=TensorProto.INT8, symmetric=True, pow2=True, shuffle=True, hardsigmoid=True),
    "quark_a16w8": Convention(act=TensorProto.UINT16, domain="com.microsoft", opset=17),
    "inc": Convention(weights="stored", fold_relu=True, rename="_QuantizeInput", bias=True),
    "inc_per_channel": Convention(weights="stored", fold_relu=True, rename="_QuantizeInput", bias=True,
                                  per_channel=True, bias_axis=1),
    "aimet": Convention(act=TensorProto.UINT8, per_channel=True, weights="on_grid", symmetric=False),
}


def _scale_zp(lo, hi, qtype, symmetric, pow2):
    qmin, qmax = _RANGE[qtype]
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if qtype == TensorProto.FLOAT8E4M3FN or symmetric or qmin < 0 and symmetric:
        amax = max(abs(lo), abs(hi), 1e-8)
        scale = amax / (qmax if qtype == TensorProto.FLOAT8E4M3FN else min(qmax, -qmin))
        zp = 0
    else:
        scale = max(hi - lo, 1e-8) / (qmax - qmin)
        zp = int(np.clip(np.rint(qmin - lo / scale), qmin, qmax))
    if pow2:
        scale = float(2.0 ** np.ceil(np.log2(scale)))
        if zp:
            zp = int(np.clip(np.rint(qmin - lo / scale), qmin, qmax))
    return scale, zp


def _quantize(w, scale, zp, qtype, shape):
    s = np.broadcast_to(scale, shape) if np.ndim(scale) else scale
    qmin, qmax = _RANGE[qtype]
    if qtype == TensorProto.FLOAT8E4M3FN:
        return np.clip(w / s, qmin, qmax).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    return np.clip(np.rint(w / s) + zp, qmin, qmax).astype(_NP[qtype])


def _ranges(model, data, tensors):
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for t in tensors:
        if t not in have:
            probe.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    names = list(data)
    feeds = [{k: data[k][i] for k in names} for i in range(len(data[names[0]]))]
    runs = builders.run_model(probe, feeds, outputs=list(tensors))
    return {t: (min(float(r[t].min()) for r in runs), max(float(r[t].max()) for r in runs)) for t in tensors}


def make(float_path, out_path, data, convention, exclude=()):
    """Quantize ``float_path`` the way ``convention`` (a name of :data:`CONVENTIONS` or a
    :class:`Convention`) does, leaving the inputs of the nodes named in ``exclude`` alone
    (Model Optimizer's ``nodes_to_exclude``: pairs sit on the inputs of quantized ops only);
    returns ``out_path``."""
    cv = CONVENTIONS[convention] if isinstance(convention, str) else convention
    model = onnx.load(str(float_path))
    graph = model.graph
    if cv.hardsigmoid:
        for n in graph.node:
            if n.op_type == "Sigmoid":
                n.op_type = "HardSigmoid"
                n.attribute.extend([helper.make_attribute("alpha", 1 / 6), helper.make_attribute("beta", 0.5)])
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}
    acts = []
    for n in graph.node:
        if n.op_type in QUANT_OPS and n.name not in exclude:
            for k, i in enumerate(n.input):
                if i and i not in inits and k not in QUANT_OPS[n.op_type] and i not in acts:
                    acts.append(i)
    ranges = _ranges(model, data, list(dict.fromkeys(acts + [r.output[0] for r in graph.node if r.op_type == "Relu"])))
    # fold: a Relu right after a quantized op's output is deleted; the pair on its input takes its range
    drop, replace = set(), {}
    if cv.fold_relu:
        for r in graph.node:
            src = producer.get(r.input[0])
            if (r.op_type in FOLDABLE and src is not None and src.op_type in ("Conv", "Gemm", "MatMul", "Add")
                    and len(consumers[r.input[0]]) == 1 and r.output[0] in acts and r.output[0] not in outputs):
                drop.add(r.name)
                replace[r.output[0]] = r.input[0]
                ranges[r.input[0]] = ranges[r.output[0]]
    nodes, new_inits, qnames = [], [], {}
    float_np = np.float16 if cv.fp16 else np.float32

    def pair(t, lo, hi):
        if t in qnames:
            return qnames[t]
        scale, zp = _scale_zp(lo, hi, cv.act, cv.symmetric, cv.pow2)
        s, z = f"{t}_scale", f"{t}_zero_point"
        new_inits.append(numpy_helper.from_array(np.array(scale, float_np), s))
        zp_arr = (np.array(0, np.float32).astype(ml_dtypes.float8_e4m3fn) if cv.act == TensorProto.FLOAT8E4M3FN
                  else np.array(zp, _NP[cv.act]))
        new_inits.append(numpy_helper.from_array(zp_arr, z))
        nodes.append(helper.make_node("QuantizeLinear", [t, s, z], [f"{t}_q"], name=f"{t}_QuantizeLinear",
                                      domain=cv.domain))
        nodes.append(helper.make_node("DequantizeLinear", [f"{t}_q", s, z], [f"{t}_dq"], name=f"{t}_DequantizeLinear",
                                      domain=cv.domain))
        qnames[t] = f"{t}_dq"
        return qnames[t]

    w_scales = {}

    def weight(n, k, name):
        w = inits[name].astype(np.float32)
        axis = None
        if cv.block_size and n.op_type == "MatMul":
            axis, blocks = 0, -(-w.shape[0] // cv.block_size)
            amax = np.stack([np.abs(w[b * cv.block_size:(b + 1) * cv.block_size]).max(axis=0) for b in range(blocks)])
            scale = np.maximum(amax, 1e-8) / _RANGE[cv.weight][1]
            if cv.signed_extreme:
                part = [w[b * cv.block_size:(b + 1) * cv.block_size] for b in range(blocks)]
                extreme = np.stack([np.take_along_axis(p, np.abs(p).argmax(axis=0)[None], 0)[0] for p in part])
                scale = np.where(extreme == 0, 1e-8, extreme / _RANGE[cv.weight][0])
            full = np.repeat(scale, cv.block_size, axis=0)[: w.shape[0]]
            zp = np.zeros_like(scale, dtype=_NP[cv.weight])
        elif cv.per_channel:
            axis = 1 if n.op_type == "MatMul" else 0
            other = tuple(a for a in range(w.ndim) if a != axis)
            amax = np.abs(w).max(axis=other)
            qmax = _RANGE[cv.weight][1]
            scale = np.maximum(amax, 1e-8) / (qmax if cv.weight == TensorProto.FLOAT8E4M3FN else min(qmax, 127))
            shape = [1] * w.ndim
            shape[axis] = -1
            full = scale.reshape(shape)
            zp = np.zeros(scale.shape, _NP[cv.weight]) if cv.weight != TensorProto.FLOAT8E4M3FN else \
                np.zeros(scale.shape, np.float32).astype(ml_dtypes.float8_e4m3fn)
        else:
            scale = max(float(np.abs(w).max()), 1e-8) / 127
            full = scale
            zp = np.array(0, _NP[cv.weight]) if cv.weight != TensorProto.FLOAT8E4M3FN else \
                np.array(0, np.float32).astype(ml_dtypes.float8_e4m3fn)
        scale = np.asarray(scale, np.float32)
        w_scales[n.name] = scale
        attrs = {"axis": axis} if axis is not None else {}
        if cv.block_size and axis == 0 and n.op_type == "MatMul":
            attrs["block_size"] = cv.block_size
        s, z = f"{name}_scale", f"{name}_zero_point"
        new_inits.append(numpy_helper.from_array(scale.astype(float_np), s))
        new_inits.append(numpy_helper.from_array(np.asarray(zp), z))
        q = _quantize(w, full, 0, cv.weight, w.shape)
        if cv.weights == "stored":
            qi = f"{name}_quantized"
            new_inits.append(numpy_helper.from_array(np.asarray(q), qi))
            nodes.append(helper.make_node("DequantizeLinear", [qi, s, z], [f"{name}_dq"], name=f"{name}_DequantizeLinear",
                                          domain=cv.domain, **attrs))
        else:
            value = w
            if cv.weights == "on_grid":
                value = (q.astype(np.float32) * full).astype(np.float32)
            new_inits.append(numpy_helper.from_array(value.astype(float_np), f"{name}_float"))
            nodes.append(helper.make_node("QuantizeLinear", [f"{name}_float", s, z], [f"{name}_q"],
                                          name=f"{name}_QuantizeLinear", domain=cv.domain, **attrs))
            nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", s, z], [f"{name}_dq"],
                                          name=f"{name}_DequantizeLinear", domain=cv.domain, **attrs))
        return f"{name}_dq"

    def bias(n, name, act_in):
        act_scale = float(numpy_helper.to_array(next(i for i in new_inits if i.name == f"{act_in}_scale")))
        scale = (w_scales[n.name] * act_scale).astype(np.float32)
        b = inits[name].astype(np.float32)
        q = np.rint(b / scale).astype(np.int32)
        qi, s = f"{name}_quantized", f"{name}_scale"
        new_inits.extend([numpy_helper.from_array(q, qi), numpy_helper.from_array(scale.astype(float_np), s)])
        attrs = {"axis": cv.bias_axis} if cv.bias_axis is not None and scale.size > 1 else {}
        nodes.append(helper.make_node("DequantizeLinear", [qi, s], [f"{name}_dq"], name=f"{name}_DequantizeLinear",
                                      domain=cv.domain, **attrs))
        return f"{name}_dq"

    used_inits = set()
    for n in graph.node:
        if n.name in drop:
            continue
        new = onnx.NodeProto()
        new.CopyFrom(n)
        for k, i in enumerate(new.input):
            i = replace.get(i, i)
            new.input[k] = i
            if n.op_type not in QUANT_OPS or not i or n.name in exclude:
                continue
            if i in inits and k in QUANT_OPS[n.op_type]:
                new.input[k] = weight(n, k, i)
                used_inits.add(i)
            elif i in inits and k == 2 and cv.bias and n.op_type in ("Conv", "Gemm") and not cv.act_weights_only:
                new.input[k] = bias(n, i, replace.get(n.input[0], n.input[0]))
                used_inits.add(i)
            elif i not in inits and not cv.act_weights_only:
                lo, hi = ranges[i]
                new.input[k] = pair(i, lo, hi)
        nodes.append(new)
    keep_inits = [i for i in graph.initializer if i.name not in used_inits or cv.weights != "stored"]
    if cv.weights != "stored":
        keep_inits = [i for i in graph.initializer if i.name not in used_inits]
    if cv.fp16:
        keep_inits = [numpy_helper.from_array(numpy_helper.to_array(i).astype(np.float16), i.name)
                      if i.data_type == TensorProto.FLOAT else i for i in keep_inits]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(keep_inits + new_inits)
    del graph.value_info[:]
    if cv.fp16:
        _cast_to_fp16(graph)
    if cv.rename:
        _rename(graph, cv.rename)
    if cv.shuffle:
        order = list(graph.node)
        del graph.node[:]
        graph.node.extend(order[::-1])
    if cv.domain:
        model.opset_import.append(helper.make_opsetid(cv.domain, 1))
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, cv.opset)
    model.ir_version = 10 if cv.opset >= 21 else 8
    model.producer_name = "pytest-ptq tests/conventions.py"
    onnx.save(model, str(out_path))
    return out_path


def _cast_to_fp16(graph):
    """Graph inputs cast to float16 on entry, outputs back to float32 on exit."""
    entry = []
    for i in graph.input:
        if i.type.tensor_type.elem_type == TensorProto.FLOAT:
            entry.append(helper.make_node("Cast", [i.name], [f"{i.name}_fp16"], to=TensorProto.FLOAT16,
                                          name=f"{i.name}_cast_fp16"))
            for n in graph.node:
                for k, x in enumerate(n.input):
                    if x == i.name:
                        n.input[k] = f"{i.name}_fp16"
    exits = []
    for o in graph.output:
        if o.type.tensor_type.elem_type == TensorProto.FLOAT:
            for n in graph.node:
                for k, x in enumerate(n.output):
                    if x == o.name:
                        n.output[k] = f"{o.name}_fp16"
                for k, x in enumerate(n.input):
                    if x == o.name:
                        n.input[k] = f"{o.name}_fp16"
            exits.append(helper.make_node("Cast", [f"{o.name}_fp16"], [o.name], to=TensorProto.FLOAT,
                                          name=f"{o.name}_cast_fp32"))
    nodes = entry + list(graph.node) + exits
    del graph.node[:]
    graph.node.extend(nodes)


def _rename(graph, suffix):
    """Every intermediate tensor and initializer gets ``suffix``: names carry no information."""
    keep = {i.name for i in graph.input} | {o.name for o in graph.output}
    mapping = {}
    for n in graph.node:
        for o in n.output:
            if o and o not in keep:
                mapping[o] = o + suffix
    for i in graph.initializer:
        if i.name not in keep:
            mapping[i.name] = i.name + suffix
            i.name = mapping[i.name]
    for n in graph.node:
        for k, x in enumerate(n.input):
            n.input[k] = mapping.get(x, x)
        for k, x in enumerate(n.output):
            n.output[k] = mapping.get(x, x)


def mlp_net(path, seed=0, width=64, hidden=128):
    """x [1, 8, width] -> MatMul -> Add -> Relu -> MatMul -> Sigmoid*x (SiLU) -> MatMul -> y."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((width, hidden)) / np.sqrt(width)).astype(np.float32)
    b1 = (rng.standard_normal(hidden) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    w3 = (rng.standard_normal((hidden, width)) / np.sqrt(hidden)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (w3, "w3"))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="mm2"),
             helper.make_node("Sigmoid", ["m2"], ["s2"], name="sig2"),
             helper.make_node("Mul", ["m2", "s2"], ["g2"], name="silu2"),
             helper.make_node("MatMul", ["g2", "w3"], ["y"], name="mm3")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mlp_samples(n=4, width=64, seed=1):
    rng = np.random.default_rng(seed)
    return {"x": [rng.standard_normal((1, 8, width)).astype(np.float32) for _ in range(n)]}


def _initializers(rng):
    """``init(name, shape, scale=0.3, low=None)``: a float32 initializer, normal times
    ``scale``, or uniform in [low, 1.5) (scales and variances)."""
    def init(name, shape, scale=0.3, low=None):
        value = rng.uniform(low, 1.5, shape) if low is not None else rng.standard_normal(shape) * scale
        return numpy_helper.from_array(value.astype(np.float32), name)
    return init


def preprocessed_net(folder, seed=0):
    """A float net as PyTorch exports some (a convolution's BatchNormalization left as a
    per-channel Mul and Add, another as BatchNormalization, a third convolution without bias
    scaled per channel, a 3-D MatMul and its bias Add, two
    Shape nodes of one tensor feeding a Reshape), the same net after onnxruntime's basic
    graph optimizations (what Intel Neural Compressor runs before quantizing, and what
    ``quant_pre_process`` does: ConvMulFusion, ConvAddFusion, ConvBNFusion, MatMulAddFusion,
    common subexpression elimination, constant folding), and that optimized net quantized by
    quantize_static with its defaults (int8 weights behind lone DQs, Relus folded).
    Returns ``{"float", "optimized", "qdq": path, "samples": {"x": [...]}}``."""
    import onnxruntime as ort

    rng = np.random.default_rng(seed)
    c = 8

    init = _initializers(rng)

    inits = [init("w1", (c, 3, 3, 3)), init("gamma", (1, c, 1, 1), low=0.5), init("beta", (1, c, 1, 1)),
             init("w2", (c, c, 3, 3)), init("bn_scale", (c,), low=0.5), init("bn_bias", (c,)),
             init("bn_mean", (c,), 0.1), init("bn_var", (c,), low=0.5), init("wm", (c, 12)), init("bm", (12,)),
             init("wo", (12, 4)), init("w3", (c, c, 1, 1)), init("gamma3", (1, c, 1, 1), low=0.5),
             numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Mul", ["c1", "gamma"], ["m1"], name="scale1"),
             helper.make_node("Add", ["m1", "beta"], ["a1"], name="shift1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("BatchNormalization", ["c2", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["b2"],
                              name="bn2", epsilon=1e-3),
             helper.make_node("Relu", ["b2"], ["r2a"], name="relu2"),
             helper.make_node("Conv", ["r2a", "w3"], ["c3"], name="conv3"),  # no bias, scaled only
             helper.make_node("Mul", ["c3", "gamma3"], ["m3"], name="scale3"),
             helper.make_node("Relu", ["m3"], ["r2"], name="relu3a"),
             # [1, C, H, W] -> [1, H*W, C]: the batch size taken twice from one shape
             helper.make_node("Shape", ["r2"], ["s_a"], name="shape_a"),
             helper.make_node("Shape", ["r2"], ["s_b"], name="shape_b"),
             helper.make_node("Gather", ["s_a", "zero"], ["n_a"], name="batch_a"),
             helper.make_node("Gather", ["s_b", "one"], ["c_b"], name="channels_b"),
             helper.make_node("Unsqueeze", ["n_a", "axis0"], ["n_1"], name="unsqueeze_n"),
             helper.make_node("Unsqueeze", ["c_b", "axis0"], ["c_1"], name="unsqueeze_c"),
             helper.make_node("Concat", ["n_1", "c_1", "minus1"], ["shape3"], name="concat_shape", axis=0),
             helper.make_node("Reshape", ["r2", "shape3"], ["flat"], name="flatten"),
             helper.make_node("Transpose", ["flat"], ["tokens"], name="tokens", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["tokens", "wm"], ["mm"], name="proj"),
             helper.make_node("Add", ["mm", "bm"], ["pm"], name="proj_bias"),
             helper.make_node("Relu", ["pm"], ["rp"], name="relu3"),
             helper.make_node("MatMul", ["rp", "wo"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "preprocessed", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                    [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 36, 4])], inits)
    paths = {k: folder / f"{k}.onnx" for k in ("float", "optimized", "qdq")}
    builders.save_model(graph, paths["float"])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(paths["optimized"])
    ort.InferenceSession(str(paths["float"]), options, providers=["CPUExecutionProvider"])
    samples = {"x": [rng.standard_normal((1, 3, 6, 6)).astype(np.float32) for _ in range(4)]}
    builders.quantize(paths["optimized"], paths["qdq"], samples, activation_type="QInt8", keep_float=False)
    return {**paths, "samples": samples}


def inlined_net(folder, seed=0):
    """A float net with a HardSwish after a convolution's BatchNormalization, a convolution
    whose bias is an Add behind an Identity (as Paddle exports them), and a Sigmoid; and that
    net as AMD Quark quantizes it: HardSwish inlined as its ONNX definition (HardSigmoid and
    Mul, to quantize between them), onnxruntime's basic optimizations (BatchNormalization and
    the bias Add folded into the convolutions, the Identity gone), the Sigmoid rewritten as a
    HardSigmoid, a bias corrected (moved by 0.01), the last convolution's Split made two
    Slices, then quantize_static with 16-bit activations (a bias step far below float32
    rounding of a fold through a large mean). Returns ``{"float", "rewritten", "qdq": path,
    "samples": {"x": [...]}}``."""
    import onnxruntime as ort
    from onnx.inliner import inline_selected_functions

    rng = np.random.default_rng(seed)
    c = 8

    init = _initializers(rng)

    inits = [init("w1", (c, 3, 3, 3)), init("bn_scale", (c,), low=0.5), init("bn_bias", (c,)),
             numpy_helper.from_array(rng.uniform(-60, 60, c).astype(np.float32), "bn_mean"),
             init("bn_var", (c,), low=0.5), init("w2", (c, c, 3, 3)), init("b2", (1, c, 1, 1)),
             init("w3", (c, c, 1, 1)), init("w4", (c, c, 1, 1)), init("b4", (c,)), init("w5", (4, c, 1, 1)),
             numpy_helper.from_array(np.array([2, 2], np.int64), "halves")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n1"],
                              name="bn1", epsilon=1e-3),
             helper.make_node("HardSwish", ["n1"], ["h1"], name="hswish"),
             helper.make_node("Conv", ["h1", "w2"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("Identity", ["c2"], ["c2i"], name="pass"),
             helper.make_node("Add", ["c2i", "b2"], ["a2"], name="bias2"),
             helper.make_node("Relu", ["a2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3"),
             helper.make_node("Sigmoid", ["c3"], ["s3"], name="sigmoid"),
             helper.make_node("Conv", ["s3", "w4", "b4"], ["c4"], name="conv4"),
             helper.make_node("Relu", ["c4"], ["r4"], name="relu4"),
             helper.make_node("Conv", ["r4", "w5"], ["c5"], name="conv5"),
             helper.make_node("Split", ["c5", "halves"], ["y", "z"], name="halve", axis=1)]
    graph = helper.make_graph(nodes, "inlined", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 2, 6, 6]) for t in "yz"], inits)
    paths = {k: folder / f"{k}.onnx" for k in ("float", "inlined", "rewritten", "qdq")}
    builders.save_model(graph, paths["float"])
    inlined = inline_selected_functions(onnx.load(str(paths["float"])), [("", "HardSwish")],
                                        inline_schema_functions=True)
    onnx.save(inlined, str(paths["inlined"]))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(paths["rewritten"])
    ort.InferenceSession(str(paths["inlined"]), options, providers=["CPUExecutionProvider"])
    model = onnx.load(str(paths["rewritten"]))
    g = model.graph
    for n in g.node:
        if n.op_type == "HardSigmoid" and not n.name:  # Quark names the inlined HardSigmoid, not the Mul
            n.name = "_inlfunc_HardSwish_HS_X"
        if n.op_type == "Sigmoid":
            n.op_type = "HardSigmoid"
            n.attribute.extend([helper.make_attribute("alpha", 0.2), helper.make_attribute("beta", 0.5)])
    b4 = next(i for i in g.initializer if i.name == "b4")
    b4.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b4) + np.float32(0.01), "b4"))
    split = next(n for n in g.node if n.op_type == "Split")
    g.initializer.extend(numpy_helper.from_array(np.array([v], np.int64), k)
                         for k, v in (("at0", 0), ("at2", 2), ("at4", 4), ("axis1", 1)))
    slices = [helper.make_node("Slice", ["c5", lo, hi, "axis1"], [out], name=f"slice_{out}")
              for lo, hi, out in (("at0", "at2", "y"), ("at2", "at4", "z"))]
    nodes = [n for n in g.node if n is not split]
    del g.node[:]
    g.node.extend(nodes + slices)
    onnx.save(model, str(paths["rewritten"]))
    samples = {"x": [rng.standard_normal((1, 3, 6, 6)).astype(np.float32) for _ in range(4)]}
    builders.quantize(paths["rewritten"], paths["qdq"], samples, activation_type="QInt16", keep_float=False)
    del paths["inlined"]
    return {**paths, "samples": samples}

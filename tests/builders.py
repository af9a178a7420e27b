"""Small float models and their QDQ quantizations, built in the tests' temp folders."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# root writes where modes forbid it (Windows has no user ids: never root there)
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def conv_net(path, channels=8, size=16, seed=0, outlier_channel=None, two_outputs=False,
             two_inputs=False, unnamed=False):
    """Conv-Relu-Conv-Add(residual)-Relu-GlobalAvgPool-Gemm-Softmax network, float32.

    ``outlier_channel`` scales one output channel of the first conv by 50, planting a
    channel whose range dwarfs the others.
    """
    rng = np.random.default_rng(seed)
    C = channels
    w1 = (rng.standard_normal((C, 3, 3, 3)) * 0.3).astype(np.float32)
    if outlier_channel is not None:
        w1[outlier_channel] *= 50
    b1 = (rng.standard_normal(C) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((C, C, 3, 3)) * 0.2).astype(np.float32)
    b2 = (rng.standard_normal(C) * 0.1).astype(np.float32)
    wf = (rng.standard_normal((10, C)) * 0.5).astype(np.float32)
    bf = (rng.standard_normal(10) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"), (wf, "wf"), (bf, "bf"))]
    nm = (lambda s: "") if unnamed else (lambda s: s)
    nodes = []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])]
    src = "x"
    if two_inputs:
        inputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, size, size]))
        nodes.append(helper.make_node("Add", ["x", "y"], ["xy"], name=nm("add_in")))
        src = "xy"
    nodes += [
        helper.make_node("Conv", [src, "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name=nm("conv1")),
        helper.make_node("Relu", ["c1"], ["r1"], name=nm("relu1")),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name=nm("conv2")),
        helper.make_node("Add", ["c2", "r1"], ["a2"], name=nm("add2")),
        helper.make_node("Relu", ["a2"], ["r2"], name=nm("relu2")),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name=nm("pool")),
        helper.make_node("Flatten", ["p"], ["f"], name=nm("flatten")),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name=nm("fc")),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1, name=nm("softmax")),
    ]
    outputs = [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])]
    if two_outputs:
        outputs.append(helper.make_tensor_value_info("r2", TensorProto.FLOAT, [1, C, size, size]))
    graph = helper.make_graph(nodes, "convnet", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def samples(n=4, size=16, seed=1, names=("x",)):
    rng = np.random.default_rng(seed)
    return {name: [rng.standard_normal((1, 3, size, size)).astype(np.float32) for _ in range(n)]
            for name in names}


def save_folder(data, root):
    """Write ``{input: [arrays]}`` in the seed's layout ``root/<input>/<i>.npy``."""
    for name, arrays in data.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for i, a in enumerate(arrays):
            np.save(d / f"{i}.npy", a)
    return root


def narrow_conv_setup(root, n, seed):
    """A conv net with an outlier channel quantized on samples ten times too small (so that
    activation pairs differ clearly), and its ``n`` samples: ``{"q", "folder", "feeds",
    "data", "root"}``."""
    data = samples(n, seed=seed)
    folder = save_folder(data, root / "calib")
    narrow = {k: [a * 0.1 for a in v] for k, v in data.items()}
    q = quantize(conv_net(root / "float.onnx", outlier_channel=3), root / "q.onnx", narrow)
    return {"q": q, "folder": folder, "feeds": [{k: v[i] for k, v in data.items()} for i in range(n)],
            "data": data, "root": root}


def add_pair(inits, nodes, tensor, scale, zero, name=None, out=None):
    """A Q/DQ pair ``{name}_Q``/``{name}_DQ`` (``name`` default ``tensor``) quantizing ``tensor``
    with a scalar ``scale`` and ``zero`` (its dtype the codes'), appended to ``inits`` and
    ``nodes``; returns the dequantized tensor, ``out`` (default ``{name}_dq``)."""
    name = tensor if name is None else name
    out = f"{name}_dq" if out is None else out
    inits.extend([numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
                  numpy_helper.from_array(np.array(zero), f"{name}_z")])
    nodes.extend([helper.make_node("QuantizeLinear", [tensor, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_Q"),
                  helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [out], name=f"{name}_DQ")])
    return out


def quantize(float_path, out_path, data, per_channel=False, activation_type="QUInt8",
             weight_type="QInt8", keep_float=True, extra_options=None, nodes_to_exclude=None, reduce_range=False,
             calibrate_method="MinMax"):
    """quantize_static in QDQ format; ``keep_float`` keeps float weights and Relu/Clip."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            names = list(data)
            self.it = iter([{k: data[k][i] for k in names} for i in range(len(data[names[0]]))])

        def get_next(self):
            return next(self.it, None)

    opts = {"AddQDQPairToWeight": True, "QDQKeepRemovableActivations": True} if keep_float else {}
    opts.update(extra_options or {})
    quantize_static(str(float_path), str(out_path), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, activation_type=getattr(QuantType, activation_type),
                    weight_type=getattr(QuantType, weight_type), extra_options=opts,
                    nodes_to_exclude=nodes_to_exclude or [], reduce_range=reduce_range,
                    calibrate_method=getattr(CalibrationMethod, calibrate_method))
    return out_path


# -- independent references for the engine tests -----------------------------------------
# These read the QDQ proto directly (no pytest_ptq code), so a test comparing the engine
# with them compares two independent computations.

def load(model_or_path):
    if isinstance(model_or_path, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model_or_path)
        return copy
    return onnx.load(str(model_or_path))


def qdq_pairs(model_or_path):
    """``{name: (Q node or None, [DQ nodes])}`` straight from the proto, in graph order.

    A Q and every DQ it feeds are one entry named after the Q; a DQ of an initializer is
    an entry of its own named after the DQ.
    """
    model = load(model_or_path)
    inits = {i.name for i in model.graph.initializer}
    pairs = {}
    for q in model.graph.node:
        if q.op_type == "QuantizeLinear":
            pairs[q.name] = (q, [d for d in model.graph.node
                                 if d.op_type == "DequantizeLinear" and d.input[0] == q.output[0]])
    for d in model.graph.node:
        if d.op_type == "DequantizeLinear" and d.input[0] in inits:
            pairs[d.name] = (None, [d])
    return pairs


def rewire(qdq_model, keep=(), float_model=None, outputs=()):
    """The QDQ model with every Q/DQ pair not named in ``keep`` removed by reconnecting.

    Consumers of a removed pair's DQ outputs read the Q's float input instead; a lone DQ
    of a quantized weight is replaced by the float weight that the node of the same name
    reads at the same input position in ``float_model`` (kept when no float model is
    given). ``outputs`` adds intermediate tensors as graph outputs.
    """
    model = load(qdq_model)
    graph = model.graph
    nodes = []
    for n in graph.node:  # plain copies: protobuf hands out a new wrapper on every access
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        nodes.append(copy)
    fnodes, finits = {}, {}
    if float_model is not None:
        fm = load(float_model)
        fnodes = {n.name: n for n in fm.graph.node if n.name}
        finits = {i.name: i for i in fm.graph.initializer}
    inits = {i.name for i in graph.initializer}
    replace, drop = {}, set()
    for name, (q, dqs) in qdq_pairs(model).items():
        if name in keep:
            continue
        if q is not None:
            for d in dqs:
                replace[d.output[0]] = q.input[0]
                drop.add(d.output[0])
            drop.add(q.output[0])
            continue
        d = dqs[0]
        users = [(n, k) for n in nodes for k, i in enumerate(n.input) if i == d.output[0]]
        sources = {fnodes[n.name].input[k] for n, k in users if n.name in fnodes}
        if len(sources) != 1 or next(iter(sources)) not in finits:
            continue  # no float weight known: the dequantized weight stays
        src = next(iter(sources))
        if src not in inits:
            graph.initializer.append(finits[src])
            inits.add(src)
        if src != d.output[0]:  # onnxruntime names a bias DQ's output after the float bias
            replace[d.output[0]] = src
        drop.add(d.output[0])
    kept = [n for n in nodes if n.output[0] not in drop]
    for n in kept:
        for k in range(len(n.input)):
            i = n.input[k]
            while i in replace:
                i = replace[i]
            n.input[k] = i
    graph_outputs = {o.name for o in graph.output}
    for t in sorted(graph_outputs):
        src = t
        while src in replace:
            src = replace[src]
        if src != t:  # a graph output keeps its name through an Identity
            kept.append(helper.make_node("Identity", [src], [t], name=f"ref_out_{t}"))
    del graph.node[:]
    graph.node.extend(kept)
    for t in outputs:
        if t not in graph_outputs:
            graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    return model


def run_model(model, feeds, level="disable", outputs=None, disabled_optimizers=()):
    """Run a ModelProto or path in a plain onnxruntime session; Q/DQ stay fake-quant.

    ``level``: "disable" (ORT_DISABLE_ALL) or "all" (ORT_ENABLE_ALL).
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL if level == "disable"
                                   else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    so.log_severity_level = 3
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled_optimizers))
    names = outputs or [o.name for o in sess.get_outputs()]
    if isinstance(feeds, dict):
        return dict(zip(names, sess.run(names, feeds)))
    return [dict(zip(names, sess.run(names, f))) for f in feeds]


def split_dq(qdq_path, out_path, q_name):
    """Give each consumer of ``q_name``'s DQ its own DQ, as torch and modelopt exports do."""
    model = load(qdq_path)
    graph = model.graph
    q = next(n for n in graph.node if n.name == q_name)
    dq = next(n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
    users = [n for n in graph.node if dq.output[0] in n.input]
    nodes = list(graph.node)
    at = nodes.index(dq)
    for k, user in enumerate(users[1:], start=1):
        extra = onnx.NodeProto()
        extra.CopyFrom(dq)
        extra.name = f"{dq.name}_{k}"
        extra.output[0] = f"{dq.output[0]}_{k}"
        for j, i in enumerate(user.input):
            if i == dq.output[0]:
                user.input[j] = extra.output[0]
        nodes.insert(at + k, extra)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(out_path))
    return out_path


def conv_clip_net(path, seed=0):
    """Conv -> Clip(0, 6) -> Conv, float32, input ``x`` [1, 3, 8, 8]: quantize_static with its
    defaults folds the Clip into the Q/DQ range and deletes it."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 2).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6, np.float32), "hi"),
             numpy_helper.from_array(rng.standard_normal((2, 4, 1, 1)).astype(np.float32), "w2")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("Clip", ["c", "lo", "hi"], ["r"], name="clip"),
         helper.make_node("Conv", ["r", "w2"], ["y"], name="conv_out")],
        "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# -- planted causes for the remedy search ------------------------------------------------

def side_net(path, size=16, k=9, seed=0):
    """Two outputs: ``prob``, a Conv-Relu-Pool-Gemm-Softmax classifier that reads input
    channels 0-1 only, and ``side``, a k x k mean filter (and its negative) of channel 2.

    White noise barely excites a mean filter (its response shrinks by k), a smooth image
    does not: calibrated on noise, ``side``'s pair gets a range k times too narrow for
    smooth images (see :func:`smooth_samples`), and clips them.
    """
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    w1[:, 2] = 0
    b1 = (rng.standard_normal(4) * 0.1).astype(np.float32)
    wf = (rng.standard_normal((10, 4)) * 0.5).astype(np.float32)
    bf = (rng.standard_normal(10) * 0.1).astype(np.float32)
    ws = np.zeros((2, 3, k, k), np.float32)
    ws[0, 2], ws[1, 2] = 1.0 / (k * k), -1.0 / (k * k)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (wf, "wf"), (bf, "bf"), (ws, "ws"))]
    p = k // 2
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1, name="softmax"),
        helper.make_node("Conv", ["x", "ws"], ["side"], pads=[p, p, p, p], name="conv_side"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])]
    graph = helper.make_graph(nodes, "side", inputs,
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10]),
                               helper.make_tensor_value_info("side", TensorProto.FLOAT, [1, 2, size, size])], inits)
    return save_model(graph, path)


def smooth_samples(n, size=16, seed=2):
    """Like :func:`samples` but channel 2 is a smooth field (2 x 2 blocks, same spread)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((1, 3, size, size)).astype(np.float32)
        x[0, 2] = np.kron(rng.standard_normal((2, 2)), np.ones((size // 2, size // 2)))
        out.append(x)
    return {"x": out}


def cancel_net(path, big=100.0, k=0.99, seed=0):
    """``y = (Conv(x, wa) - Conv(x, k * wa)) + Conv(x, wv)``, float32, input [1, 3, 8, 8].

    The first two convs are large and nearly equal, their difference small: quantized with
    the same integers (scales in the ratio k), their errors cancel; remedy one of a pair
    alone and the other's error shows, amplified 1 / (1 - k) times.
    """
    rng = np.random.default_rng(seed)
    wa = (rng.standard_normal((4, 3, 3, 3)) * 0.3 * big).astype(np.float32)
    wv = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((wa, "wa"), ((wa * k).astype(np.float32), "wb"), (wv, "wv"))]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1], name="conv_b"),
             helper.make_node("Sub", ["a", "b"], ["d"], name="sub"),
             helper.make_node("Conv", ["x", "wv"], ["v"], pads=[1, 1, 1, 1], name="conv_v"),
             helper.make_node("Add", ["d", "v"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "cancel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return save_model(graph, path)


def scaled(qdq_path, out_path, initializer, factor):
    """The QDQ model with one initializer (a pair's scale) multiplied by ``factor``."""
    model = load(qdq_path)
    for init in model.graph.initializer:
        if init.name == initializer:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * factor, init.name))
    onnx.save(model, str(out_path))
    return out_path


def pooled_cosine(refs, tests):
    """Cosine of the samples concatenated (float64)."""
    r = np.concatenate([np.asarray(a).ravel() for a in refs]).astype(np.float64)
    t = np.concatenate([np.asarray(a).ravel() for a in tests]).astype(np.float64)
    return float(r @ t / np.sqrt((r @ r) * (t @ t)))


def worst_cosine(ref_outputs, test_outputs):
    """The worst output's pooled cosine, from ``run_model`` results of two models."""
    return min(pooled_cosine([o[k] for o in ref_outputs], [o[k] for o in test_outputs]) for k in ref_outputs[0])


def clipping_pair(path, gain):
    """x -> Mul(gain) -> a pair whose range is [-1, 1] -> y: quantized, y stays within the
    range; bypassed, it is ``gain`` times the input."""
    nodes = [helper.make_node("Mul", ["x", "gain"], ["t"]),
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["t_q"]),
             helper.make_node("DequantizeLinear", ["t_q", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [numpy_helper.from_array(np.array(gain, np.float32), "gain"),
                               numpy_helper.from_array(np.array(1 / 127, np.float32), "s"),
                               numpy_helper.from_array(np.array(0, np.int8), "z")])
    return save_model(graph, path)


def save_model(graph, path, opset=17, ir_version=8, full_check=False):
    """``graph`` saved as a checked model at ``path`` (``ir_version`` None: onnx's default); returns ``path``."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    onnx.checker.check_model(model, full_check=full_check)
    onnx.save(model, str(path))
    return path


def runnable(qpath, out_path):
    """The QDQ file as onnxruntime runs it with its QDQ fusion off: a 1-D DQ's axis of 1
    (which only the fused kernels accept, Neural Compressor writes it on biases) set to 0.
    Returns ``qpath`` itself when nothing needs it."""
    model = onnx.load(str(qpath))
    ranks = {i.name: len(i.dims) for i in model.graph.initializer}
    changed = False
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and ranks.get(n.input[0]) == 1:
            for a in n.attribute:
                if a.name == "axis" and a.i not in (0, -1):
                    a.i, changed = 0, True
    if not changed:
        return qpath
    onnx.save(model, str(out_path))
    return out_path


def relu_out_net(path, seed=0, subgraph=None):
    """Conv-Relu-Conv-Relu, the last Relu the model's output (quantize_static folds it into
    the output's pair, where no node after it shows the fold). ``subgraph="if"``: the first
    Relu's output is read only inside the branches of an If on the input's mean (a Conv in
    each); ``"loop"``: it is a Loop's initial value and read inside its body too (3 steps of
    acc = tanh(acc + it))."""
    rng = np.random.default_rng(seed)
    C = 8

    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [w("w0", (C, 3, 3, 3)), w("w3", (C, C, 3, 3))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0")]
    if subgraph == "loop":
        inits += [numpy_helper.from_array(np.array(3, np.int64), "steps"), numpy_helper.from_array(np.array(True), "go")]
        body = helper.make_graph(
            [helper.make_node("Identity", ["go_in"], ["go_out"]), helper.make_node("Add", ["acc", "r0"], ["sum"]),
             helper.make_node("Tanh", ["sum"], ["acc_out"])], "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("go_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("acc", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("go_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None)])
        nodes.append(helper.make_node("Loop", ["steps", "go", "r0"], ["b"], body=body, name="repeat"))
    elif subgraph == "if":
        inits += [w("w1", (C, C, 3, 3)), w("w2", (C, C, 3, 3)), numpy_helper.from_array(np.float32(0), "zero")]

        def branch(name, weight, op):
            return helper.make_graph([helper.make_node("Conv", ["r0", weight], [f"{name}c"], pads=[1, 1, 1, 1]),
                                      helper.make_node(op, [f"{name}c"], [f"{name}y"])], name, [],
                                     [helper.make_tensor_value_info(f"{name}y", TensorProto.FLOAT, None)])

        nodes += [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0, name="mean"),
                  helper.make_node("Greater", ["m", "zero"], ["cond"], name="greater"),
                  helper.make_node("If", ["cond"], ["b"], then_branch=branch("t", "w1", "Relu"),
                                   else_branch=branch("e", "w2", "Sigmoid"), name="choose")]
    nodes += [helper.make_node("Conv", ["b" if subgraph else "r0", "w3"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
              helper.make_node("Relu", ["c3"], ["y"], name="relu3")]
    graph = helper.make_graph(nodes, "reluout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def detector_head_net(path, classes=6, transposed=False, like=False, seed=0):
    """A YOLOv8-like head: Conv to ``4 + classes`` rows of 64 cells, box rows scaled to pixels
    (0..~300), class rows through a Sigmoid (~0.05), concatenated on axis 1 into ``out``
    ``[1, 4 + classes, 64]`` (``transposed``: ``[1, 64, 4 + classes]``). ``like``: both parts
    plain Conv rows of one scale, a concatenation nothing needs to tell apart."""
    rng = np.random.default_rng(seed)
    rows = 4 + classes
    w = (rng.standard_normal((rows, 3, 1, 1)) * 0.5).astype(np.float32)
    grid = (np.arange(4 * 64, dtype=np.float32).reshape(1, 4, 64) % 64 * 4.0)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, rows, 64], np.int64), "shape"),
             numpy_helper.from_array(np.array([4, classes], np.int64), "split"),
             numpy_helper.from_array(np.array(8.0, np.float32), "stride"), numpy_helper.from_array(grid, "grid"),
             numpy_helper.from_array(np.array(3.0, np.float32), "shift")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="head_conv"),
             helper.make_node("Reshape", ["c", "shape"], ["flat"], name="flatten_cells"),
             helper.make_node("Split", ["flat", "split"], ["box_raw", "cls_raw"], axis=1, name="split_head")]
    if like:
        parts = ["box_raw", "cls_raw"]
    else:
        nodes += [helper.make_node("Relu", ["box_raw"], ["box_pos"], name="box_relu"),
                  helper.make_node("Mul", ["box_pos", "stride"], ["box_px"], name="box_scale"),
                  helper.make_node("Add", ["box_px", "grid"], ["box"], name="box_grid"),
                  helper.make_node("Sub", ["cls_raw", "shift"], ["cls_low"], name="cls_shift"),
                  helper.make_node("Sigmoid", ["cls_low"], ["cls"], name="cls_sigmoid")]
        parts = ["box", "cls"]
    out = "cat" if transposed else "out"
    nodes.append(helper.make_node("Concat", parts, [out], axis=1, name="head_concat"))
    shape = [1, rows, 64]
    if transposed:
        nodes.append(helper.make_node("Transpose", ["cat"], ["out"], perm=[0, 2, 1], name="head_transpose"))
        shape = [1, 64, rows]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], inits)
    return save_model(graph, path)


def yolov5_head_net(path, classes=4, seed=0):
    """A YOLOv5-like head: two levels (8x8 and 4x4 cells), each ``[1, cells, 4 + classes]``
    from a Concat on the last axis of box columns in pixels and Sigmoid scores, reshaped
    (last axis kept) and concatenated along the cells into ``out`` ``[1, 80, 4 + classes]``."""
    rng = np.random.default_rng(seed)
    rows = 4 + classes
    inits = [numpy_helper.from_array(np.array([4, classes], np.int64), "split"),
             numpy_helper.from_array(np.array(8.0, np.float32), "stride"),
             numpy_helper.from_array(np.array(3.0, np.float32), "shift")]
    nodes = [helper.make_node("MaxPool", ["x"], ["x2"], kernel_shape=[2, 2], strides=[2, 2], name="down")]
    levels = []
    for k, (src, cells) in enumerate((("x", 64), ("x2", 16))):
        inits += [numpy_helper.from_array((rng.standard_normal((rows, 3, 1, 1)) * 0.5).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(np.array([1, rows, cells], np.int64), f"flat{k}"),
                  numpy_helper.from_array(np.array([1, cells, rows], np.int64), f"cells{k}"),
                  numpy_helper.from_array((np.arange(cells * 4, dtype=np.float32).reshape(1, cells, 4) % 64 * 4), f"g{k}")]
        nodes += [helper.make_node("Conv", [src, f"w{k}"], [f"c{k}"], name=f"conv{k}"),
                  helper.make_node("Reshape", [f"c{k}", f"flat{k}"], [f"f{k}"], name=f"flat{k}"),
                  helper.make_node("Transpose", [f"f{k}"], [f"t{k}"], perm=[0, 2, 1], name=f"tr{k}"),
                  helper.make_node("Split", [f"t{k}", "split"], [f"b{k}", f"s{k}"], axis=2, name=f"split{k}"),
                  helper.make_node("Relu", [f"b{k}"], [f"bp{k}"], name=f"relu{k}"),
                  helper.make_node("Mul", [f"bp{k}", "stride"], [f"bs{k}"], name=f"scale{k}"),
                  helper.make_node("Add", [f"bs{k}", f"g{k}"], [f"box{k}"], name=f"grid{k}"),
                  helper.make_node("Sub", [f"s{k}", "shift"], [f"sl{k}"], name=f"shift{k}"),
                  helper.make_node("Sigmoid", [f"sl{k}"], [f"cls{k}"], name=f"sig{k}"),
                  helper.make_node("Concat", [f"box{k}", f"cls{k}"], [f"y{k}"], axis=-1, name=f"cat{k}"),
                  helper.make_node("Reshape", [f"y{k}", f"cells{k}"], [f"lvl{k}"], name=f"view{k}")]
        levels.append(f"lvl{k}")
    nodes.append(helper.make_node("Concat", levels, ["out"], axis=1, name="levels"))
    graph = helper.make_graph(nodes, "yolov5_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 80, rows])], inits)
    return save_model(graph, path)


def yolox_head_net(path, seed=0):
    """A YOLOX-like head: two levels (8x8 and 4x4 cells), each a Concat on the channels of 4
    box offsets, an objectness logit scaled 100x down (near-zero scores) and a Sigmoid class
    score ``[1, 6, H, W]``, flattened to ``[1, 6, cells]`` (the channel axis kept, the last
    not), concatenated along the cells and transposed into ``out`` ``[1, 80, 6]``."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.array(0.01, np.float32), "small")]
    nodes = [helper.make_node("MaxPool", ["x"], ["x2"], kernel_shape=[2, 2], strides=[2, 2], name="down")]
    levels = []
    for k, (src, cells) in enumerate((("x", 64), ("x2", 16))):
        for part, rows in (("reg", 4), ("obj", 1), ("cls", 1)):
            inits.append(numpy_helper.from_array((rng.standard_normal((rows, 3, 1, 1))).astype(np.float32),
                                                 f"w_{part}{k}"))
            nodes.append(helper.make_node("Conv", [src, f"w_{part}{k}"], [f"{part}{k}"], name=f"conv_{part}{k}"))
        inits.append(numpy_helper.from_array(np.array([1, 6, cells], np.int64), f"flat{k}"))
        nodes += [helper.make_node("Mul", [f"obj{k}", "small"], [f"objs{k}"], name=f"obj_scale{k}"),
                  helper.make_node("Sigmoid", [f"cls{k}"], [f"clss{k}"], name=f"sig{k}"),
                  helper.make_node("Concat", [f"reg{k}", f"objs{k}", f"clss{k}"], [f"y{k}"], axis=1, name=f"cat{k}"),
                  helper.make_node("Reshape", [f"y{k}", f"flat{k}"], [f"lvl{k}"], name=f"flatten{k}")]
        levels.append(f"lvl{k}")
    nodes += [helper.make_node("Concat", levels, ["cat"], axis=2, name="levels"),
              helper.make_node("Transpose", ["cat"], ["out"], perm=[0, 2, 1], name="to_cells")]
    graph = helper.make_graph(nodes, "yolox_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 80, 6])], inits)
    return save_model(graph, path)


def inf_mask_net(path):
    """Scores ``x [1, 8] @ w`` with a mask filled with -inf added (``Where(keep, 0, -inf)``,
    as exporters write an attention mask) and a Softmax: the Add's and the Softmax's input
    hold -inf where ``keep`` is false."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "w")
    inits = [w, numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"], name="score"),
             helper.make_node("Where", ["keep", "zero", "ninf"], ["bias"], name="mask_fill"),
             helper.make_node("Add", ["s", "bias"], ["masked"], name="masked_scores"),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1, name="attention")]
    graph = helper.make_graph(nodes, "mask", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                                              helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 8])],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 8])], inits)
    return save_model(graph, path)


def inf_mask_samples(n=4, seed=1):
    """Inputs for :func:`inf_mask_net`: the last 2 to n+1 tokens of each sample masked."""
    rng = np.random.default_rng(seed)
    return {"x": [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(n)],
            "keep": [(np.arange(8) < 6 - i % 6)[None] for i in range(n)]}


def masked_attention_net(path, fill, tokens=8, dim=16, seed=0):
    """One attention head over ``x [1, tokens, dim]`` whose padded tokens (``mask [1, tokens]``
    of 1/0) get ``fill`` added to their scores before the Softmax (``scores``), as exporters
    write an attention mask: -3.4e38 (float32's lowest, PyTorch's), -1e4 (BERT's original)."""
    rng = np.random.default_rng(seed)
    wq = (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
    inits = [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(fill, np.float32), "fill"),
             numpy_helper.from_array(np.array([1, 1, tokens], np.int64), "mask_shape")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="query"),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1], name="keys"),
             helper.make_node("MatMul", ["q", "xt"], ["raw"], name="score"),
             helper.make_node("Sub", ["one", "mask"], ["pad"], name="padded"),
             helper.make_node("Mul", ["pad", "fill"], ["bias_flat"], name="mask_fill"),
             helper.make_node("Reshape", ["bias_flat", "mask_shape"], ["bias"], name="mask_rows"),
             helper.make_node("Add", ["raw", "bias"], ["scores"], name="masked_scores"),
             helper.make_node("Softmax", ["scores"], ["attn"], axis=-1, name="attention"),
             helper.make_node("MatMul", ["attn", "x"], ["out"], name="mix")]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, tokens])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, tokens, dim])], inits)
    return save_model(graph, path)


def masked_samples(n=6, tokens=8, dim=16, seed=3):
    """Inputs for :func:`masked_attention_net`: the last 1-5 tokens of each sample padded."""
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal((1, tokens, dim)).astype(np.float32) for _ in range(n)]
    mask = [(np.arange(tokens) < tokens - 1 - i % 5).astype(np.float32)[None] for i in range(n)]
    return {"x": x, "mask": mask}


def offset_net(path, offset=100.0, size=8, seed=0, scalar=False):
    """Conv-Relu-Conv then a constant ``offset`` added: an output (a depth map, a regression
    in absolute units) whose values sit far from zero, spread by a few units; ``scalar``: its
    mean, one value a sample (a score)."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((1, 4, 3, 3)) * 0.3).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(np.array(offset, np.float32), "offset")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Add", ["c2", "offset"], ["map" if scalar else "depth"], name="add_offset")]
    if scalar:
        nodes.append(helper.make_node("ReduceMean", ["map"], ["depth"], name="mean", keepdims=1))
    shape = [1, 1, 1, 1] if scalar else [1, 1, size, size]
    graph = helper.make_graph(nodes, "offset",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("depth", TensorProto.FLOAT, shape)], inits)
    return save_model(graph, path)


def owned_output_net(path, convs=2, tail=None, output_scale=0.4, seed=7, float_inputs=False):
    """A detector head's layout, QDQ already: x -> pair -> Conv(W pair) [-> pair -> Conv(W
    pair)] -> c -> pair ``c_Q`` -> y, a model output no node reads, so the last Conv owns the
    pair. ``tail``: "cast" adds a Cast to float16 after the pair (the model output ``yh``),
    "cast_before" one before it (a float16 pair, its output ``y`` float16), "constant" reads
    the pair's scale from a Constant written after the Conv. ``float_inputs``: the last Conv
    reads its input and weight without pairs, its output pair its only one. Returns ``(path,
    data)``, five samples of ``x``."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    src = "x"
    for k in range(1, convs + 1):
        inits.append(numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), f"W{k}"))
        if float_inputs and k == convs:
            w, x = f"W{k}", src
        else:
            w = add_pair(inits, nodes, f"W{k}", 0.01, np.int8(0))
            x = add_pair(inits, nodes, src, 0.03 if k == 1 else 0.05, np.uint8(128) if k == 1 else np.int8(0))
        src = "c" if k == convs else f"c{k}"
        nodes.append(helper.make_node("Conv", [x, w], [src], pads=[1] * 4, name=f"conv{k}"))
    out, elem = "y", TensorProto.FLOAT
    if tail == "cast_before":
        nodes.append(helper.make_node("Cast", ["c"], ["ch"], to=TensorProto.FLOAT16, name="to16"))
        inits += [numpy_helper.from_array(np.array(output_scale, np.float16), "c_s"),
                  numpy_helper.from_array(np.array(0, np.int8), "c_z")]
        nodes += [helper.make_node("QuantizeLinear", ["ch", "c_s", "c_z"], ["c_q"], name="c_Q"),
                  helper.make_node("DequantizeLinear", ["c_q", "c_s", "c_z"], ["y"], name="c_DQ")]
        elem = TensorProto.FLOAT16
    elif tail == "constant":
        nodes += [helper.make_node("Constant", [], ["c_s"], name="c_scale",
                                   value=numpy_helper.from_array(np.array(output_scale, np.float32), "c_s")),
                  helper.make_node("Constant", [], ["c_z"], name="c_zero",
                                   value=numpy_helper.from_array(np.array(0, np.int8), "c_z")),
                  helper.make_node("QuantizeLinear", ["c", "c_s", "c_z"], ["c_q"], name="c_Q"),
                  helper.make_node("DequantizeLinear", ["c_q", "c_s", "c_z"], ["y"], name="c_DQ")]
    else:
        add_pair(inits, nodes, "c", output_scale, np.int8(0), out="y")
    if tail == "cast":
        nodes.append(helper.make_node("Cast", ["y"], ["yh"], to=TensorProto.FLOAT16, name="to16"))
        out, elem = "yh", TensorProto.FLOAT16
    graph = helper.make_graph(nodes, "owned", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info(out, elem, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)  # a float16 pair
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path, {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(5)]}


def gemm_head_net(path, channels=8, size=8, classes=10, seed=0, dynamic=False):
    """Conv-Relu, then a classifier head exported as Reshape -> Gemm -> Reshape: the Gemm's
    output 'gemm_out' is a tensor inside the graph, the model output 'logits' the last
    Reshape's ([1, classes, 1, 1]). ``dynamic``: a batch left open (Reshape to [0, -1] and
    [-1, classes, 1, 1])."""
    rng = np.random.default_rng(seed)
    C, S = channels, size
    inits = [numpy_helper.from_array(a, n) for a, n in (
        ((rng.standard_normal((C, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
        ((rng.standard_normal(C) * 0.1).astype(np.float32), "b1"),
        ((rng.standard_normal((C * S * S, classes)) * 0.1).astype(np.float32), "wf"),
        ((rng.standard_normal(classes) * 0.1).astype(np.float32), "bf"),
        (np.array([0, -1] if dynamic else [1, C * S * S], np.int64), "shape_in"),
        (np.array([-1 if dynamic else 1, classes, 1, 1], np.int64), "shape_out"))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Reshape", ["r1", "shape_in"], ["flat"], name="reshape_in"),
             helper.make_node("Gemm", ["flat", "wf", "bf"], ["gemm_out"], name="fc"),
             helper.make_node("Reshape", ["gemm_out", "shape_out"], ["logits"], name="reshape_out")]
    batch = "N" if dynamic else 1
    graph = helper.make_graph(nodes, "gemm_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, S, S])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes, 1, 1])], inits)
    return save_model(graph, path)

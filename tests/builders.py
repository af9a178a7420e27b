"""Small float models and their QDQ quantizations, built in the tests' temp folders."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


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


def quantize(float_path, out_path, data, per_channel=False, activation_type="QUInt8",
             weight_type="QInt8", keep_float=True, extra_options=None, nodes_to_exclude=None):
    """quantize_static in QDQ format; ``keep_float`` keeps float weights and Relu/Clip."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

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
                    nodes_to_exclude=nodes_to_exclude or [])
    return out_path

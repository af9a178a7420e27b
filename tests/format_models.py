"""Float models that exercise onnxruntime's QOperator and dynamic formats, and their
quantizations (quantize_static with QuantFormat.QOperator, quantize_dynamic)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from builders import save_model


def _inits(rng, **shapes):
    return [numpy_helper.from_array((rng.standard_normal(s) * scale).astype(np.float32), n)
            for n, (s, scale) in shapes.items()]


def ops_net(path, size=16, seed=0):
    """Conv-LeakyRelu, MaxPool and AveragePool side by side, Concat, Conv, x*Sigmoid(x), Add,
    GlobalAveragePool, MatMul, Gemm, Softmax; a second output through Pad, Resize (nearest)
    and Resize (linear). Input ``x`` [1, 3, size, size]."""
    rng = np.random.default_rng(seed)
    inits = _inits(rng, w1=((8, 3, 3, 3), 0.3), b1=((8,), 0.1), w2=((8, 16, 1, 1), 0.3), b2=((8,), 0.1),
                   wm=((8, 12), 0.4), wf=((10, 12), 0.4), bf=((10,), 0.1))
    inits += [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
              numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("LeakyRelu", ["c1"], ["l1"], alpha=0.1, name="leaky"),
        helper.make_node("MaxPool", ["l1"], ["m1"], kernel_shape=[2, 2], strides=[2, 2], name="maxpool"),
        helper.make_node("AveragePool", ["l1"], ["a1"], kernel_shape=[2, 2], strides=[2, 2], name="avgpool"),
        helper.make_node("Concat", ["m1", "a1"], ["cat"], axis=1, name="concat"),
        helper.make_node("Conv", ["cat", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Sigmoid", ["c2"], ["s2"], name="sigmoid"),
        helper.make_node("Mul", ["c2", "s2"], ["sw"], name="swish"),
        helper.make_node("Add", ["sw", "m1"], ["ad"], name="add"),
        helper.make_node("GlobalAveragePool", ["ad"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "wm"], ["mm"], name="matmul"),
        helper.make_node("Gemm", ["mm", "wf", "bf"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1, name="softmax"),
        helper.make_node("Pad", ["ad", "pads"], ["pd"], mode="constant", name="pad"),
        helper.make_node("Resize", ["pd", "", "scales"], ["up"], mode="nearest", name="resize"),
        helper.make_node("Resize", ["up", "", "scales"], ["up2"], mode="linear", name="resize_linear"),
    ]
    graph = helper.make_graph(nodes, "ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10]),
                               helper.make_tensor_value_info("up2", TensorProto.FLOAT, [1, 8, 40, 40])], inits)
    return save_model(graph, path)


def attention_net(path, tokens=6, dim=16, seed=0):
    """One self-attention block: q, k, v projections (MatMul + Add), q k^T scaled, Softmax,
    times v, output projection, residual Add. Input ``x`` [1, tokens, dim]."""
    rng = np.random.default_rng(seed)
    d = dim
    inits = _inits(rng, wq=((d, d), 0.3), bq=((d,), 0.1), wk=((d, d), 0.3), bk=((d,), 0.1),
                   wv=((d, d), 0.3), bv=((d,), 0.1), wo=((d, d), 0.3), bo=((d,), 0.1))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "inv_sqrt_d"))
    nodes = []
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"], name=f"proj_{n}"),
                  helper.make_node("Add", [f"{n}0", f"b{n}"], [n], name=f"bias_{n}")]
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="transpose_k"),
        helper.make_node("MatMul", ["q", "kt"], ["qk"], name="scores"),
        helper.make_node("Mul", ["qk", "inv_sqrt_d"], ["qks"], name="scale"),
        helper.make_node("Softmax", ["qks"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["ctx"], name="context"),
        helper.make_node("MatMul", ["ctx", "wo"], ["o0"], name="proj_o"),
        helper.make_node("Add", ["o0", "bo"], ["o"], name="bias_o"),
        helper.make_node("Add", ["o", "x"], ["y"], name="residual"),
    ]
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, dim])], inits)
    return save_model(graph, path)


def lstm_net(path, steps=5, inputs=8, hidden=6, seed=0, bidirectional=False):
    """LSTM over ``x`` [steps, 1, inputs], its last output through a MatMul classifier."""
    rng = np.random.default_rng(seed)
    dirs = 2 if bidirectional else 1
    inits = _inits(rng, W=((dirs, 4 * hidden, inputs), 0.4), R=((dirs, 4 * hidden, hidden), 0.4),
                   B=((dirs, 8 * hidden), 0.1), wc=((dirs * hidden, 4), 0.5))
    inits.append(numpy_helper.from_array(np.array([steps, dirs * hidden], np.int64), "shape"))
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], hidden_size=hidden, name="lstm",
                              direction="bidirectional" if bidirectional else "forward"),
             helper.make_node("Transpose", ["Y"], ["Yt"], perm=[0, 2, 1, 3], name="transpose"),
             helper.make_node("Reshape", ["Yt", "shape"], ["h"], name="reshape"),
             helper.make_node("MatMul", ["h", "wc"], ["logits"], name="classifier")]
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, inputs])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [steps, 4])], inits)
    return save_model(graph, path)


def samples_of(shape, n=6, seed=1):
    rng = np.random.default_rng(seed)
    return {"x": [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]}


# The files below are quantized with reduce_range=True (7-bit weights) because the tests read
# onnxruntime's integer kernels as the exact arithmetic of the file, and on x86 CPUs without
# AVX-VNNI its uint8 x int8 kernels sum products in pairs into int16, saturating with 8-bit
# weights (onnxruntime's own advice for those CPUs is this option).
def quantize_qoperator(float_path, out_path, data, per_channel=False, activation_type="QUInt8",
                       weight_type="QInt8", extra_options=None):
    """quantize_static in QOperator format (onnxruntime's defaults but reduce_range: Relu/Clip folded)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": a} for a in data["x"]])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(float_path), str(out_path), Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=per_channel, activation_type=getattr(QuantType, activation_type),
                    weight_type=getattr(QuantType, weight_type), extra_options=extra_options or {},
                    reduce_range=True)
    return out_path


def quantize_dyn(float_path, out_path, per_channel=False, extra_options=None, op_types=None, nodes_to_exclude=None,
                 reduce_range=True):
    """quantize_dynamic with onnxruntime's defaults but ``reduce_range``."""
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(str(float_path), str(out_path), per_channel=per_channel, extra_options=extra_options or {},
                     op_types_to_quantize=op_types, nodes_to_exclude=nodes_to_exclude or [], reduce_range=reduce_range)
    return out_path


def optimized(path, out_path, level="extended"):
    """The model as onnxruntime saves it after its graph optimisations (fused contrib ops)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    so.optimized_model_filepath = str(out_path)
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return out_path



def early_dynamic_net(path, integer=(0, 1), float_path=None, seed=0):
    """Two Conv layers with a swish between, written as onnxruntime's first dynamic quantizer
    (producer ``onnx.quantize`` 0.1.0, opset 12) wrote them: DynamicQuantizeLinear of the
    input, uint8 weights with zero points, and the float bias quantized on every run with the
    input's scale (Div, Floor, Cast to int32, Reshape) and added to ConvInteger's int32 sum
    before the Cast and scale Mul. Layers not in ``integer`` are written as the engine
    bypasses their input quantizer: a float Conv of the float input and the dequantized
    weight, the bias still quantized with that run's input scale. The second layer's weight
    is 64 KiB or more (stored as a large initializer). With ``float_path``, the float model
    is written there too."""
    rng = np.random.default_rng(seed)
    shapes = [(32, 1, 3, 3), (256, 32, 3, 3)]
    nodes, inits, float_nodes, float_inits, src = [], [], [], [], "x"

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    for k, shape in enumerate(shapes):
        w = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        b = (rng.standard_normal(shape[0]) * 0.2).astype(np.float32)
        float_inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        float_nodes.append(helper.make_node("Conv", [src, f"w{k}", f"b{k}"], [f"c{k}"], name=f"conv{k}", pads=[1] * 4))
        lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
        ws = np.float32((hi - lo) / 255)
        wz = np.uint8(np.clip(np.round(-lo / ws), 0, 255))
        wq = np.clip(np.round(w / ws) + wz, 0, 255).astype(np.uint8)
        const(f"w{k}_quantized", wq), const(f"w{k}_scale", ws), const(f"w{k}_zero_point", wz), const(f"b{k}", b)
        const(f"b{k}_shape", np.array([1, shape[0], 1, 1], np.int64))
        q, s, z = f"{src}_quantized", f"{src}_scale", f"{src}_zero_point"
        nodes += [helper.make_node("DynamicQuantizeLinear", [src], [q, s, z], name=f"{src}_QuantizeLinear"),
                  helper.make_node("Mul", [s, f"w{k}_scale"], [f"b{k}_scale"], name=f"b{k}_scale_node"),
                  helper.make_node("Div", [f"b{k}", f"b{k}_scale"], [f"b{k}_tmp"], name=f"b{k}_tmp_quant"),
                  helper.make_node("Floor", [f"b{k}_tmp"], [f"b{k}_rounded"], name=f"b{k}_quant_rounded"),
                  helper.make_node("Cast", [f"b{k}_rounded"], [f"b{k}_quantized"], to=TensorProto.INT32,
                                   name=f"b{k}_quantized_node"),
                  helper.make_node("Reshape", [f"b{k}_quantized", f"b{k}_shape"], [f"b{k}_reshape"],
                                   name=f"b{k}_quantizedreshape")]
        if k in integer:
            nodes += [helper.make_node("ConvInteger", [q, f"w{k}_quantized", z, f"w{k}_zero_point"], [f"c{k}_int"],
                                       name=f"conv{k}_quant", pads=[1] * 4),
                      helper.make_node("Add", [f"c{k}_int", f"b{k}_reshape"], [f"c{k}_bias_add"],
                                       name=f"b{k}_quantizedbias_add"),
                      helper.make_node("Cast", [f"c{k}_bias_add"], [f"c{k}_cast"], to=TensorProto.FLOAT,
                                       name=f"c{k}_bias_add_cast"),
                      helper.make_node("Mul", [s, f"w{k}_scale"], [f"c{k}_scales"], name=f"conv{k}_quant_scales_mul"),
                      helper.make_node("Mul", [f"c{k}_cast", f"c{k}_scales"], [f"c{k}"],
                                       name=f"conv{k}_quant_output_scale_mul")]
        else:
            nodes += [helper.make_node("DequantizeLinear", [f"w{k}_quantized", f"w{k}_scale", f"w{k}_zero_point"],
                                       [f"w{k}_dq"], name=f"w{k}_dq"),
                      helper.make_node("Cast", [f"b{k}_reshape"], [f"b{k}_float"], to=TensorProto.FLOAT,
                                       name=f"b{k}_float"),
                      helper.make_node("Mul", [f"b{k}_float", f"b{k}_scale"], [f"b{k}_dq"], name=f"b{k}_dq"),
                      helper.make_node("Conv", [src, f"w{k}_dq"], [f"c{k}_raw"], name=f"conv{k}", pads=[1] * 4),
                      helper.make_node("Add", [f"c{k}_raw", f"b{k}_dq"], [f"c{k}"], name=f"conv{k}_bias")]
        for n in (nodes, float_nodes):
            n += [helper.make_node("Sigmoid", [f"c{k}"], [f"g{k}"], name=f"sigmoid{k}"),
                  helper.make_node("Mul", [f"c{k}", f"g{k}"], [f"h{k}"], name=f"swish{k}")]
        src = f"h{k}"
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 12])],
          [helper.make_tensor_value_info(src, TensorProto.FLOAT, [1, shapes[-1][0], 8, 12])])
    for graph_nodes, graph_inits, out, producer in ((nodes, inits, path, ("onnx.quantize", "0.1.0")),
                                                    (float_nodes, float_inits, float_path, ("", ""))):
        if out is not None:
            model = helper.make_model(helper.make_graph(graph_nodes, "early", *io, graph_inits),
                                      opset_imports=[helper.make_opsetid("", 12)], producer_name=producer[0],
                                      producer_version=producer[1])
            model.ir_version = 7
            onnx.save(model, str(out))
    return path

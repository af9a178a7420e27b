"""Benchmark: peak memory of the engine against a plain onnxruntime session, same QDQ model.

Builds a QDQ model whose float weights total ``--weights-mib`` (a stack of MatMuls with
per-channel int8 weight pairs and uint8 activation pairs, float weights kept behind the
pairs, as quantize_static with AddQDQPairToWeight writes them; with ``--lone-dq`` the same
stack quantized by quantize_static with its defaults, see :func:`build_lone_dq`; with
``--folded``, that stack with its weights' DQs folded into float initializers, see
:func:`build_folded`; with ``--conv``, a stack of convolutions that quantize_static quantizes, see :func:`build_conv`;
with ``--deep``, a deep, narrow residual stack of 16 nodes a block, see :func:`build_deep`)
and measures, each in a
fresh process (peak resident set, VmHWM):

  plain     onnxruntime.InferenceSession(model) with default options, one run;
  plain-fake-quant   the same with QDQ fusion off, as the engine simulates it;
  engine N  pytest_ptq Engine on N samples + activation sensitivity of every pair (with
            --curves: its cumulative error curves instead, three configs and local errors).

and prints the ratios engine / plain (target <= 1.5 at any N); each figure is the median
of --repeat processes.

Usage: python bench/bench_memory.py [--weights-mib 192] [--samples 1 8] [--keep DIR] [--conv dq|pairs | --lone-dq | --folded]
       python bench/bench_memory.py --deep 500 [--keep DIR]
       python bench/bench_memory.py --vit pairs|dq [--samples 1 8]
       python bench/bench_memory.py --model QDQ.onnx --data DATA [--float-model FLOAT.onnx]
       (any of them with --workers N: N configs at once, as on a machine with N cores; with
       --curves: the cumulative error curves instead of the sensitivity)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 2048  # MatMul width: a layer holds WIDTH^2 float32 weights (16 MiB)
TOKENS = 16


def build(folder, weights_mib, inline=False, pairs=True, name="model.onnx"):
    """The QDQ model (``name`` + external data) and 8 samples under ``folder``; without
    ``pairs``, the float model of the same weights and samples."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    layers = max(1, round(weights_mib * 2**20 / (WIDTH * WIDTH * 4)))
    rng = np.random.default_rng(0)
    nodes, inits, src = [], [], "x"

    def pair(t, scale, zp, qtype, axis=None):
        s, z = f"{t}_scale", f"{t}_zp"
        inits.extend([numpy_helper.from_array(np.asarray(scale, np.float32), s),
                      numpy_helper.from_array(np.asarray(zp, qtype), z)])
        attrs = {} if axis is None else {"axis": axis}
        nodes.extend([helper.make_node("QuantizeLinear", [t, s, z], [f"{t}_q"], name=f"{t}_QuantizeLinear", **attrs),
                      helper.make_node("DequantizeLinear", [f"{t}_q", s, z], [f"{t}_dq"], name=f"{t}_DequantizeLinear",
                                       **attrs)])
        return f"{t}_dq"

    for k in range(layers):
        w = (rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{k}"))
        wq, xq = f"w{k}", src
        if pairs:
            wq = pair(wq, np.abs(w).max(axis=0) / 127, np.zeros(WIDTH, np.int8), np.int8, axis=1)
            xq = pair(xq, 8.0 / 255, 128, np.uint8)
        nodes.append(helper.make_node("MatMul", [xq, wq], [f"m{k}"], name=f"mm{k}"))
        nodes.append(helper.make_node("Tanh", [f"m{k}"], [f"h{k}"], name=f"tanh{k}"))
        src = f"h{k}"
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, WIDTH])],
                              [helper.make_tensor_value_info(src, TensorProto.FLOAT, [1, TOKENS, WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if inline:
        onnx.save(model, str(folder / name))
    else:
        onnx.save(model, str(folder / name), save_as_external_data=True, location=f"{name}.data", size_threshold=1024)
    for i in range(8):
        (folder / "data" / "x").mkdir(parents=True, exist_ok=True)
        np.save(folder / "data" / "x" / f"{i}.npy", rng.standard_normal((1, TOKENS, WIDTH)).astype(np.float32))
    return layers


def build_lone_dq(folder, weights_mib):
    """The MatMul + Tanh stack of :func:`build` in float (``float.onnx``, external data),
    quantized by quantize_static with its defaults, per channel, into ``model.onnx`` (int8
    weights behind lone DequantizeLinear, external data): the engine needs the float model."""
    layers = build(folder, weights_mib, pairs=False, name="float.onnx")
    quantize(folder, [np.load(folder / "data" / "x" / f"{i}.npy") for i in range(2)], external=True)
    return layers


def build_folded(folder, weights_mib):
    """The stack of :func:`build_lone_dq` with each weight's DequantizeLinear computed in numpy
    into a float32 initializer (``model.onnx``, external data), as onnxruntime's constant
    folding leaves it: the engine finds the weights folded and puts their DQs back."""
    import onnx
    from onnx import numpy_helper

    layers = build_lone_dq(folder, weights_mib)
    model = onnx.load(str(folder / "model.onnx"))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    kept = []
    for n in graph.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in inits:
            kept.append(n)
            continue
        codes, scale, zero = (numpy_helper.to_array(inits[t]) for t in n.input)
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        shape = [1] * codes.ndim
        if scale.size > 1:
            shape[axis] = -1
        value = (codes.astype(np.int64) - zero.astype(np.int64).reshape(shape)).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(value * scale.astype(np.float32).reshape(shape), n.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    read = {t for n in graph.node for t in n.input}
    left = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(left)
    (folder / "model.onnx.data").unlink()
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=1024)
    return layers


def quantize(folder, xs, pairs=False, external=False):
    """quantize_static of ``folder/float.onnx`` into ``folder/model.onnx``, per channel, int8
    weights and uint8 activations, calibrated on the samples ``xs``; ``pairs``: float weights
    behind Q/DQ pairs instead of lone DQs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": x} for x in xs])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(folder / "float.onnx"), str(folder / "model.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    use_external_data_format=external,
                    extra_options={"AddQDQPairToWeight": True} if pairs else {})


CHANNELS, SIZE = 1024, 14  # --conv: a layer holds CHANNELS^2 3x3 float32 weights (36 MiB)


def build_conv(folder, weights_mib, pairs=False):
    """A stack of 3x3 convolutions + Relu (``float.onnx``, weights inline), quantized by
    onnxruntime's quantize_static per channel into ``model.onnx``: with its defaults (int8
    weights behind lone DequantizeLinear, Relus folded: the engine needs the float model), or
    with ``pairs`` float weights behind Q/DQ pairs. 8 samples under ``folder/data``."""
    from onnx import helper, numpy_helper
    layers = max(1, round(weights_mib * 2**20 / (CHANNELS * CHANNELS * 9 * 4)))
    rng = np.random.default_rng(0)
    nodes, inits, src = [], [], "x"
    for k in range(layers):
        w = (rng.standard_normal((CHANNELS, CHANNELS, 3, 3)) / np.sqrt(9 * CHANNELS)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(np.zeros(CHANNELS, np.float32), f"b{k}")]
        nodes += [helper.make_node("Conv", [src, f"w{k}", f"b{k}"], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}")]
        src = f"r{k}"
    save_and_quantize(folder, nodes, inits, src, [1, CHANNELS, SIZE, SIZE], rng, pairs)
    return layers


def save_and_quantize(folder, nodes, inits, output, shape, rng, pairs):
    """Save the float graph of ``nodes`` (input ``x`` and ``output`` of ``shape``) as
    ``folder/float.onnx`` with 8 random samples under ``folder/data``, and quantize it on two
    of them into ``folder/model.onnx`` (see :func:`quantize`)."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "float.onnx"))
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
    (folder / "data" / "x").mkdir(parents=True, exist_ok=True)
    for i, x in enumerate(xs):
        np.save(folder / "data" / "x" / f"{i}.npy", x)
    quantize(folder, xs[:2], pairs)


def build_deep(folder, blocks):
    """A deep, narrow residual stack (``float.onnx``): ``blocks`` x (MatMul 64x64, bias Add,
    Tanh, residual Add) on 16 tokens, quantized by quantize_static per channel with float
    weights behind pairs into ``model.onnx``: 16 nodes a block, about 8000 for 500 blocks, and
    a few MiB of weights, so the engine's cost per node shows. 8 samples under ``folder/data``."""
    import onnx
    from onnx import helper, numpy_helper
    width, rng = 64, np.random.default_rng(0)
    nodes, inits, src = [], [], "x"
    for k in range(blocks):
        inits += [numpy_helper.from_array((rng.standard_normal((width, width)) / 8).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(np.zeros(width, np.float32), f"b{k}")]
        nodes += [helper.make_node("MatMul", [src, f"w{k}"], [f"m{k}"]),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"]),
                  helper.make_node("Tanh", [f"a{k}"], [f"h{k}"]),
                  helper.make_node("Add", [f"h{k}", src], [f"r{k}"])]
        src = f"r{k}"
    save_and_quantize(folder, nodes, inits, src, [1, TOKENS, width], rng, pairs=True)
    return len(onnx.load(str(folder / "model.onnx")).graph.node)


CHILD = r'''
import json, os, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
mode, model, data, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import numpy as np
if mode in ("plain", "plain-fake-quant"):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if mode == "plain-fake-quant":
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    # the first n samples of a <data>/<input>/<i>.npy folder
    for i in range(n):
        s.run(None, {x.name: np.load(os.path.join(data, x.name, sorted(
            os.listdir(os.path.join(data, x.name)), key=lambda f: int(f.split(".")[0]))[i])) for x in s.get_inputs()})
else:
    sys.path.insert(0, sys.argv[5])
    from pytest_ptq.engine import Engine
    from pytest_ptq.sensitivity import get_sensitivity_of_nodes
    e = Engine(model, data, float_model=sys.argv[6] or None, workers=int(sys.argv[7]) if sys.argv[7] else "auto")
    if mode == "curves":  # runall's: the seed's two kinds, every pair, each node's local error
        from pytest_ptq.curves import configs_from, get_acc_error
        configs = {**configs_from(e, ["weight", "activation"]), "all quantized": list(e.calib_names)}
        get_acc_error(e, configs, data_num=n, local=True, progress=False)
    else:
        get_sensitivity_of_nodes(e, node_type="activation", data_num=n)
print(json.dumps({"peak_mib": peak()}))
'''


def measure(mode, model, data, n=1, repeat=3, float_model=None, workers=None):
    """Median peak (MiB) over ``repeat`` fresh processes: a single process's peak moves by
    tens of MiB from run to run. ``workers``: the engine's configs in flight (None: its
    default, one per core up to 8)."""
    peaks = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, mode, str(model), str(data), str(n), str(ROOT),
                              str(float_model or ""), str(workers or "")], capture_output=True, text=True, check=True)
        peaks.append(json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"])
    return statistics.median(peaks)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights-mib", type=float, default=192)
    p.add_argument("--samples", type=int, nargs="+", default=[1, 8])
    p.add_argument("--inline", action="store_true", help="weights inside the .onnx file (default: external data)")
    p.add_argument("--conv", choices=["dq", "pairs"], default=None,
                   help="a convolution stack quantized by quantize_static instead: int8 weights behind lone DQs "
                        "(its defaults) or float weights behind pairs; the engine gets the float model")
    p.add_argument("--lone-dq", action="store_true",
                   help="the MatMul stack quantized by quantize_static with its defaults instead: int8 weights "
                        "behind lone DQs, external data; the engine gets the float model")
    p.add_argument("--folded", action="store_true",
                   help="the --lone-dq stack with its weights' DequantizeLinear folded into float initializers "
                        "(numpy), as onnxruntime's constant folding leaves them; the engine gets the float model")
    p.add_argument("--deep", type=int, default=None, metavar="BLOCKS",
                   help="a deep, narrow residual MatMul stack of BLOCKS blocks instead (16 nodes each, 64 wide): "
                        "what the engine costs per node")
    p.add_argument("--repeat", type=int, default=3, help="processes per measurement (the median is printed)")
    p.add_argument("--keep", default=None, help="build the model here (and keep it) instead of a temp folder")
    p.add_argument("--vit", choices=["pairs", "dq"], default=None,
                   help="a real ViT-S instead (bench/vit.py): float weights behind pairs, or int8 behind lone DQs "
                        "with the float model given")
    p.add_argument("--model", default=None, help="measure this QDQ model instead of building one (with --data)")
    p.add_argument("--data", default=None, help="its calibration data: a folder of <input>/<i>.npy")
    p.add_argument("--float-model", default=None, help="its float model, if the engine needs it")
    p.add_argument("--workers", type=int, default=None,
                   help="configs the engine runs at once (default: one per core, up to 8): what a machine with "
                        "that many cores would run")
    p.add_argument("--curves", action="store_true",
                   help="measure the cumulative error curves instead of the activation sensitivity: weight only, "
                        "activation only and every pair quantized, with each node's local error (runall's)")
    args = p.parse_args(argv)
    if args.vit:
        from vit import prepare as prepare_vit

        args.model, args.data, float_model = prepare_vit(args.vit)
        args.float_model = str(float_model) if args.vit == "dq" else None
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model, data = Path(args.model), Path(args.data)
            print(f"model: {model}")
        else:
            folder = Path(args.keep or tmp)
            folder.mkdir(parents=True, exist_ok=True)
            model, data = folder / "model.onnx", folder / "data"
            if args.deep:
                nodes = build_deep(folder, args.deep)
                print(f"model: {args.deep} residual MatMul blocks, {nodes} nodes, "
                      f"{args.deep * 64 * 65 * 4 / 2**20:.1f} MiB of float weights behind pairs")
            elif args.conv:
                layers = build_conv(folder, args.weights_mib, pairs=args.conv == "pairs")
                args.float_model = str(folder / "float.onnx")
                held = "behind Q/DQ pairs" if args.conv == "pairs" else "as int8 behind lone DQs"
                print(f"model: {layers} 3x3 convolutions, {layers * CHANNELS * CHANNELS * 36 / 2**20:.0f} MiB of float "
                      f"weights inline, stored {held}; the float model given")
            elif args.folded:
                layers = build_folded(folder, args.weights_mib)
                args.float_model = str(folder / "float.onnx")
                print(f"model: {layers} MatMul layers, {layers * WIDTH * WIDTH * 4 / 2**20:.0f} MiB of float weights, "
                      "stored as int8 DQs folded into float initializers (external data); the float model given")
            elif args.lone_dq:
                layers = build_lone_dq(folder, args.weights_mib)
                args.float_model = str(folder / "float.onnx")
                print(f"model: {layers} MatMul layers, {layers * WIDTH * WIDTH * 4 / 2**20:.0f} MiB of float weights, "
                      "stored as int8 behind lone DQs (external data); the float model given")
            else:
                layers = build(folder, args.weights_mib, args.inline)
                where = "inline" if args.inline else "as external data"
                print(f"model: {layers} MatMul layers, {layers * WIDTH * WIDTH * 4 / 2**20:.0f} MiB of float weights "
                      f"{where}")
        most = max(args.samples)
        plain = measure("plain", model, data, most, repeat=args.repeat)
        fake = measure("plain-fake-quant", model, data, most, repeat=args.repeat)
        print(f"plain onnxruntime session, {most} sample(s): peak {plain:.0f} MiB (QDQ fused into int8 kernels, the "
              f"float weights dropped); with QDQ fusion off (disable_quant_qdq=1, float weights kept): {fake:.0f} MiB")
        what = "cumulative curves (3 configs, local errors)" if args.curves else "activation sensitivity"
        for n in args.samples:
            peak = measure("curves" if args.curves else "engine", model, data, n, repeat=args.repeat,
                           float_model=args.float_model, workers=args.workers)
            print(f"engine + {what}, {n} sample(s): peak {peak:.0f} MiB = {peak / plain:.2f}x plain, "
                  f"{peak / fake:.2f}x plain with fusion off")


if __name__ == "__main__":
    main()

"""onnxruntime's weight-only ``com.microsoft::MatMulNBits``, analysed through its QDQ form
(a block-wise DequantizeLinear of the weight, the MatMul, the Add of its bias).

The models are built here, their codes packed as the op's spec says (``B`` is ``[N, blocks,
block_size * bits / 8]`` uint8, the first code of a byte in its low bits; zero points packed
likewise per column); the references are onnxruntime running the MatMulNBits file itself
and the float model with a weight replaced by values dequantized here in numpy.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from builders import pooled_cosine, run_model
from pytest_ptq.engine import Engine
from pytest_ptq.errors import NotQuantized, PTQError
from pytest_ptq.model import QuantModel
from pytest_ptq.sensitivity import get_sensitivity_of_nodes


def _pack(codes, bits):
    """``[rows, n]`` codes -> ``[rows, ceil(n * bits / 8)]`` bytes, the first code in the low bits."""
    per = 8 // bits
    codes = np.concatenate([codes, np.zeros((codes.shape[0], -codes.shape[1] % per), np.uint8)], axis=1)
    out = np.zeros((codes.shape[0], codes.shape[1] // per), np.uint8)
    for j in range(per):
        out |= (codes[:, j::per].astype(np.uint8) << (bits * j)).astype(np.uint8)
    return out


def _rtn(w, bits, block, symmetric):
    """Round-to-nearest block quantization of float ``w`` [K, N] along K: ``(codes [N, K
    padded], scales [N, blocks], zero points [N, blocks] or None)``, codes unsigned."""
    k, n = w.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), np.float64)
    padded[:k] = w
    b = padded.T.reshape(n, blocks, block)
    top = (1 << bits) - 1
    if symmetric:
        scales = np.abs(b).max(axis=2) / (1 << (bits - 1))
        scales[scales == 0] = 1.0
        zp = np.full(scales.shape, 1 << (bits - 1))
    else:
        lo, hi = np.minimum(b.min(axis=2), 0), np.maximum(b.max(axis=2), 0)
        scales = (hi - lo) / top
        scales[scales == 0] = 1.0
        zp = np.clip(np.round(-lo / scales), 0, top)
    scales = scales.astype(np.float32)
    codes = np.clip(np.round(b / scales[..., None]) + zp[..., None], 0, top).astype(np.uint8).reshape(n, -1)
    return codes, scales, (None if symmetric else zp.astype(np.uint8))


def _dequantized(codes, scales, zp, bits, k, block):
    """The ``[K, N]`` weight a MatMulNBits computes with, in numpy."""
    zp = np.full(scales.shape, 1 << (bits - 1)) if zp is None else zp
    w = (codes.astype(np.float64) - np.repeat(zp, block, axis=1)) * np.repeat(scales.astype(np.float64), block, 1)
    return w[:, :k].T.astype(np.float32)


def _nbits_node(name, a, out, weight, codes, scales, zp, bits, k, block, bias=None, zp_float=False, **attrs):
    """A MatMulNBits node and its initializers (``weight``_Q<bits>, _scales, _zero_points)."""
    n = codes.shape[0]
    blocks = scales.shape[1]
    inits = [numpy_helper.from_array(_pack(codes, bits).reshape(n, blocks, block * bits // 8), f"{weight}_Q{bits}"),
             numpy_helper.from_array(scales.reshape(-1), f"{weight}_scales")]
    ins = [a, f"{weight}_Q{bits}", f"{weight}_scales"]
    if zp is not None:
        value = zp.astype(np.float32) if zp_float else _pack(zp, bits)
        inits.append(numpy_helper.from_array(value.reshape(-1), f"{weight}_zero_points"))
        ins.append(f"{weight}_zero_points")
    if bias is not None:
        ins += [""] * (5 - len(ins)) + [f"{weight}_bias"]
        inits.append(numpy_helper.from_array(bias, f"{weight}_bias"))
    node = helper.make_node("MatMulNBits", ins, [out], name=name, domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block, **attrs)
    return node, inits


def _model(nodes, inits, k, n, opset=21, ir=10):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = ir
    return model


def _single(k=64, n=8, bits=4, block=32, zero_points=True, bias=False, seed=0, zp_float=False, opset=21, **attrs):
    """One MatMulNBits of random codes: (model, its [K, N] weight as the kernel reads it)."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    codes = rng.integers(0, 1 << bits, (n, blocks * block)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (n, blocks)).astype(np.float32)
    zp = rng.integers(0, 1 << bits, (n, blocks)).astype(np.uint8) if zero_points else None
    b = rng.normal(size=n).astype(np.float32) if bias else None
    node, inits = _nbits_node("fc_Q%d" % bits, "x", "y", "w", codes, scales, zp, bits, k, block, b, zp_float, **attrs)
    return _model([node], inits, k, n, opset, 10 if opset >= 21 else 8), _dequantized(codes, scales, zp, bits, k, block)


def _samples(k, n=3, seed=1):
    rng = np.random.default_rng(seed)
    return {"x": [rng.standard_normal((4, k)).astype(np.float32) for _ in range(n)]}


# -- the rewrite against onnxruntime running MatMulNBits --------------------------------------
@pytest.mark.parametrize("case", [
    dict(bits=4, zero_points=False),
    dict(bits=4, zero_points=True, block=16),
    dict(bits=4, zero_points=True, bias=True, k=80),  # K not a multiple of block_size
    dict(bits=4, zero_points=False, bias=True, k=40, block=64),  # K below one block
    dict(bits=4, zero_points=True, k=200, block=128, n=7),  # an odd number of blocks: padded zero points
    dict(bits=8, zero_points=True, bias=True, k=96),
    dict(bits=8, zero_points=False, k=100),
    dict(bits=4, zero_points=True, zp_float=True, k=80),  # zero points of the scales' type
    pytest.param(dict(bits=2, zero_points=True, k=80, block=16),
                 marks=pytest.mark.skipif(not hasattr(TensorProto, "INT2"), reason="int2: onnx 1.20 and later")),
], ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_rewrite_equals_onnxruntime_running_matmulnbits(case):
    model, weight = _single(**case)
    k = case.get("k", 64)
    data = _samples(k)
    engine = Engine(model, data)
    qm = engine.qmodel
    assert qm.format == "weight-only" and [c.kind for c in qm.calibration.values()] == ["weight"]
    dq = next(n for n in qm.model.graph.node if n.op_type == "DequantizeLinear")
    attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
    assert attrs == {"axis": 0, "block_size": case.get("block", 32)}
    codes = qm.inits[dq.input[0]]
    bits = case["bits"]
    signed = not case["zero_points"]
    assert codes.data_type == getattr(TensorProto, f"{'' if signed else 'U'}INT{bits}")
    assert list(codes.dims) == [k, case.get("n", 8)] and (len(dq.input) == 2) == signed
    # the float op takes the name of the MatMul the quantizer replaced (fc_Q4 -> fc)
    assert {n.name for n in qm.model.graph.node if n.op_type == "MatMul"} == {"fc"}
    for i, x in enumerate(data["x"]):
        ref = run_model(model, {"x": x})["y"]  # onnxruntime's MatMulNBits kernel
        got = engine.run(i, "all")["y"]
        assert np.abs(got - ref).max() <= 1e-6 * max(1.0, float(np.abs(ref).max()))
        plain = x.astype(np.float64) @ weight
        assert np.abs(got - plain).max() <= 1e-4 * max(1.0, float(np.abs(plain).max())) or case.get("bias")


def test_an_older_opset_is_raised_as_the_block_wise_weights_need():
    """Opset 17: raised in place where no op changed meaning; with onnx's converter where one
    did (ReduceMean's axes became an input at opset 18), and from below opset 13 (Squeeze's
    axes became an input there; a Split with neither split input nor num_outputs, which opset
    18 refuses)."""
    for extra, opset in ((False, 17), (True, 17), ("Unsqueeze", 11), ("Split", 17)):
        model, _ = _single(opset=opset)
        g = model.graph
        if extra is True:
            g.node[0].output[0] = "mm"
            g.node.extend([helper.make_node("ReduceMean", ["mm"], ["mean"], axes=[1], keepdims=1, name="mean"),
                           helper.make_node("Sub", ["mm", "mean"], ["y"], name="center")])
        elif extra == "Unsqueeze":  # below opset 13 its axes were an attribute
            g.node[0].output[0] = "mm"
            g.node.extend([helper.make_node("Unsqueeze", ["mm"], ["u"], axes=[0], name="u"),
                           helper.make_node("Squeeze", ["u"], ["y"], axes=[0], name="s")])
        elif extra:  # from opset 18 a Split needs its split input or num_outputs, which this leaves out
            g.node[0].output[0] = "mm"
            g.node.extend([helper.make_node("Split", ["mm"], ["a", "b"], axis=1, name="split"),
                           helper.make_node("Concat", ["b", "a"], ["y"], axis=1, name="swap")])
        data = _samples(64, n=2)
        engine = Engine(model, data)
        assert engine.qmodel.model.opset_import[0].version == 21 and engine.qmodel.model.ir_version >= 10
        assert ("ReduceMean" in {n.op_type for n in engine.qmodel.model.graph.node}) == (extra is True)
        for i, x in enumerate(data["x"]):
            ref = run_model(model, {"x": x})["y"]
            assert np.abs(engine.run(i, "all")["y"] - ref).max() <= 1e-6 * float(np.abs(ref).max())


def test_names_read_as_in_the_float_model():
    """onnxruntime-genai names the node ``.../MatMulNBits`` where its float export has ``.../MatMul``."""
    model, _ = _single()
    model.graph.node[0].name = "/model/layers.0/mlp/down_proj/MatMulNBits"
    qm = QuantModel(model)
    assert [n.name for n in qm.model.graph.node if n.op_type == "MatMul"] == ["/model/layers.0/mlp/down_proj/MatMul"]
    assert list(qm.calibration) == ["w_DequantizeLinear"]
    assert "MatMulNBits" in qm.made_by.evidence and "Model Optimizer" not in qm.made_by.label
    assert "MatMulNBitsQuantizer" in qm.made_by.label  # named, not "unknown producer"


def test_accuracy_level_4_is_noted():
    model, _ = _single(accuracy_level=4)
    notes = QuantModel(model).notes
    assert any("accuracy_level=4" in n and "quantizes their input to int8" in n and "'fc'" in n for n in notes)
    assert not any("accuracy_level" in n for n in QuantModel(_single()[0]).notes)


# -- the analysis -----------------------------------------------------------------------------
def _float_mlp(k=80, h=48, n=16, seed=0):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((k, h)) * 0.2).astype(np.float32)
    b1 = (rng.standard_normal(h) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((h, n)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
             helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_add"),
             helper.make_node("Relu", ["h1"], ["h"], name="relu"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2")]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")]
    return _model(nodes, inits, k, n, ir=10).graph, {"w1": w1, "b1": b1, "w2": w2}


def _as_model(graph):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _brute_force(float_model, name, value, data):
    """Pooled output cosine of the float model with only weight ``name`` replaced by ``value``."""
    replaced = onnx.ModelProto()
    replaced.CopyFrom(float_model)
    for init in replaced.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(value, name))
    refs = [run_model(float_model, {"x": x})["y"] for x in data["x"]]
    return pooled_cosine(refs, [run_model(replaced, {"x": x})["y"] for x in data["x"]])


def test_weight_sensitivity_equals_the_float_model_with_that_weight_dequantized():
    graph, w = _float_mlp()
    float_model = _as_model(graph)
    layers = {"w1": (4, 32, False, "fc1"), "w2": (8, 16, True, "fc2")}
    nodes, inits, expected = [], [], {}
    for name, (bits, block, symmetric, node) in layers.items():
        codes, scales, zp = _rtn(w[name], bits, block, symmetric)
        k, n = w[name].shape
        a, out = ("x", "h1") if name == "w1" else ("h", "y")
        made, more = _nbits_node(f"{node}_Q{bits}", a, out, name, codes, scales, zp, bits, k, block,
                                 bias=w["b1"] if name == "w1" else None)  # fc1's bias fused into MatMulNBits
        nodes.append(made)
        inits += more
        expected[f"{name}_DequantizeLinear"] = _dequantized(codes, scales, zp, bits, k, block)
    nodes.insert(1, helper.make_node("Relu", ["h1"], ["h"], name="relu"))
    model = _model(nodes, inits, 80, 16)
    data = _samples(80, n=4)
    sens = get_sensitivity_of_nodes(model, calibrated_data=data, node_type="weight", float_model=float_model,
                                    progress=False)
    got = {name: values["cosine-similarity"] for name, values in sens.items()}
    assert set(got) == set(expected)
    for dq, value in expected.items():
        want = _brute_force(float_model, dq.split("_")[0], value, data)
        assert abs(got[dq] - want) <= 1e-6, (dq, got[dq], want)
        assert want < 0.99999  # the weight's quantization shows


def test_a_qdq_body_with_a_matmulnbits_head_is_analysed(tmp_path):
    """quantize_static's int8 QDQ body, the last MatMul left to a MatMulNBits (as running
    MatMulNBitsQuantizer on that file does: it skips MatMuls whose weight is a DQ)."""
    graph, w = _float_mlp()
    float_model = _as_model(graph)
    onnx.save(float_model, tmp_path / "f.onnx")
    data = _samples(80, n=4)
    builders.quantize(tmp_path / "f.onnx", tmp_path / "body.onnx", data, keep_float=False, nodes_to_exclude=["fc2"],
                      reduce_range=True)
    model = onnx.load(tmp_path / "body.onnx")
    codes, scales, zp = _rtn(w["w2"], 4, 16, False)
    k, n = w["w2"].shape
    fc2 = next(i for i, nd in enumerate(model.graph.node) if nd.name == "fc2")
    head, more = _nbits_node("fc2_Q4", model.graph.node[fc2].input[0], "y", "w2", codes, scales, zp, 4, k, 16)
    model.graph.node[fc2].CopyFrom(head)
    kept = [i for i in model.graph.initializer if i.name != "w2"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + more)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    engine = Engine(model, data, float_model=float_model)
    qm = engine.qmodel
    assert qm.format_label == "mixed (QDQ + weight-only)"
    assert {c.kind for c in qm.calibration.values()} == {"weight", "activation"}
    for i, x in enumerate(data["x"]):
        ref = run_model(model, {"x": x})["y"]  # the body's pairs fake-quant, the head on its kernel
        assert np.abs(engine.run(i, "all")["y"] - ref).max() <= 1e-5 * float(np.abs(ref).max())
        assert np.abs(engine.run(i, ())["y"] - run_model(float_model, {"x": x})["y"]).max() <= 1e-5
    sens = get_sensitivity_of_nodes(engine, node_type="weight", progress=False)
    got = {name: values["cosine-similarity"] for name, values in sens.items()}
    assert {"w1_DequantizeLinear", "w2_DequantizeLinear"} <= set(got)
    want = _brute_force(float_model, "w2", _dequantized(codes, scales, zp, 4, k, 16), data)
    assert abs(got["w2_DequantizeLinear"] - want) <= 1e-6


# -- what stays refused -----------------------------------------------------------------------
def _refusal(model):
    with pytest.raises(PTQError) as err:
        QuantModel(model)
    msg = str(err.value)
    assert not isinstance(err.value, NotQuantized) and "\n" not in msg
    assert "no QuantizeLinear/DequantizeLinear pairs" not in msg
    return msg


def test_act_order_g_idx_is_refused_naming_the_node():
    model, _ = _single(k=64)
    node = model.graph.node[0]
    node.input.extend(["g"])
    model.graph.initializer.append(numpy_helper.from_array(np.random.default_rng(0).permutation(64).astype(np.int32)
                                                           // 32, "g"))
    msg = _refusal(model)
    assert msg.startswith("model '<ModelProto>' is in weight-only format and its MatMulNBits node 'fc_Q4' reads g_idx "
                          "'g', an act-order assignment")


def _contrib(op, inputs, inits, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(op, inputs, ["y"], domain="com.microsoft", name="q", **attrs)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def test_gather_block_quantized_advice_is_what_works():
    inits = [numpy_helper.from_array(np.zeros((16, 4), np.uint8), "table"),
             numpy_helper.from_array(np.ones((16, 1), np.float32), "s")]
    msg = _refusal(_contrib("GatherBlockQuantized", ["table", "x", "s"], inits, block_size=8))
    assert msg.startswith("model '<ModelProto>' is in weight-only format and its GatherBlockQuantized node 'q' is a "
                          "block-quantized embedding table;")
    assert "quantize the embedding's Gather with quantize_static(..., quant_format=QuantFormat.QDQ)" in msg
    assert "embedding left in float" in msg
    assert "MatMulNBitsQuantizer(..., quant_format=QuantFormat.QDQ)" not in msg  # it asserts on Gather


@pytest.mark.parametrize("op, fmt, why", [
    ("MatMulFpQ4", "weight-only", "is Neural Compressor's older weight-only op"),
    ("QuantizeBFP", "QOperator", "is block floating point (BFP) quantization"),
    ("DequantizeBFP", "QOperator", "is block floating point (BFP) quantization"),
    ("QuantizeWithOrder", "QOperator", "is the CUDA ordered-layout quantization"),
    ("DequantizeWithOrder", "QOperator", "is the CUDA ordered-layout quantization"),
    ("MatMulInteger16", "QOperator", "multiplies int16 tensors"),
])
def test_other_contrib_quantized_ops_are_one_sentence(op, fmt, why):
    inits = [numpy_helper.from_array(np.zeros((8, 4), np.uint8), "b")]
    msg = _refusal(_contrib(op, ["x", "b"], inits))
    assert msg.startswith(f"model '<ModelProto>' is in {fmt} format and its {op} node 'q' {why}")
    if op == "MatMulFpQ4":
        assert "export it with MatMulNBits" in msg


def test_a_matmulnbits_weight_has_no_16_bit_form_to_be_offered():
    """MatMulNBits packs 2, 4 or 8 bits (the file's ``bits``): the int16 remedy, simulated as
    the same blocks on a 16-bit grid, is no model any quantizer writes, so no weight of it is
    offered one."""
    from pytest_ptq.remedy.alternatives import candidates_for

    model, _ = _single(bits=4, k=64, n=8, block=32)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["bits"] == 4
    engine = Engine(model, _samples(64))
    weights = [c for c in engine.qmodel.calibration.values() if c.kind == "weight"]
    assert weights and all(engine.qmodel.wider_type(c) is None for c in weights)
    assert candidates_for(engine, "int16")[0] == []


@pytest.mark.parametrize("bits", [4, 8])
def test_runalls_spread_step_offers_8_bits_only_to_weights_below_them(bits):
    """A weight-only quantizer's widest is 8 bits: weights at 8 bits already were told to
    'raise every weight to 8 bits'; the step then offers the search for the fewest kept in
    float alone, a search suggest takes."""
    from pytest_ptq.runall import _spread_step

    model, _ = _single(bits=bits, k=64, n=8, block=32)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["bits"] == bits  # read from the file
    qm = Engine(model, _samples(64)).qmodel
    step = _spread_step("weight", 0.1, 0.01, 2, 0.1, ["ptq-debug", "suggest"], qm)
    assert ("raise every weight to 8 bits" in step) == (bits < 8), step
    assert "`ptq-debug suggest --remedy float` find the fewest nodes to keep in float" in step, step


def test_runalls_search_for_a_spread_weight_loss_is_one_suggest_takes_and_a_quantizer_makes(tmp_path, capsys):
    """A 4-bit model of onnxruntime's MatMulNBitsQuantizer whose loss is spread over its weights:
    runall's step advised the quantizer's 8-bit setting but printed `suggest ... --remedy int16`,
    16-bit blocks that no quantizer makes (MatMulNBits packs 2, 4 or 8 bits; the quantizer asserts
    so). The weights have no wider type the remedies simulate: the search keeps nodes in float,
    in suggest's wording, and the printed command runs through the CLI."""
    import json
    import shlex

    nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")  # needs onnx_ir
    from pytest_ptq.cli import main

    rng = np.random.default_rng(0)
    d, inits, nodes, t = 32, [], [], "x"
    for k in range(8):
        inits.append(numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), f"W{k}"))
        nodes.append(helper.make_node("MatMul", [t, f"W{k}"], [f"h{k}"], name=f"mm{k}"))
        t = f"h{k}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, d])],
                              [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 8, d])], inits)
    fp, q = tmp_path / "float.onnx", tmp_path / "q4.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    with pytest.raises(AssertionError, match="2, 4 or 8 bits"):
        nbits.MatMulNBitsQuantizer(onnx.load(fp), bits=16)
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(fp), bits=4, block_size=16, is_symmetric=True)
    quantizer.process()
    quantizer.model.save_model_to_file(str(q))
    packed = [n for n in onnx.load(q).graph.node if n.op_type == "MatMulNBits"]
    assert len(packed) == 8 and all(helper.get_attribute_value(a) == 4 for n in packed for a in n.attribute
                                    if a.name == "bits")
    qm = QuantModel(str(q))
    assert all(qm.wider_type(c) is None for c in qm.calibration.values() if c.kind == "weight")
    folder = builders.save_folder({"x": [rng.standard_normal((1, 8, d)).astype(np.float32) for _ in range(4)]},
                                  tmp_path / "calib")

    assert main(["runall", str(q), str(folder), "--float-model", str(fp), "-s", str(tmp_path / "out"), "--quiet"]) == 0
    verdict = json.loads((tmp_path / "out" / "summary.json").read_text())["verdict"]
    assert not any("int16" in it["try"] for it in verdict["nodes"])
    step = next(s for s in verdict["next_steps"] if "spread over many weight nodes" in s)
    assert "8 bits (the weight-only quantizer's 8-bit setting" in step
    # the nodes it names are raised to the 8 bits it makes, or kept in float
    assert any(s.startswith("raise `") and "to 8 bits or more (" in s and ", or keep them in float (MatMulNBitsQuantizer(" in s
               for s in verdict["next_steps"]), verdict["next_steps"]
    command = shlex.split(step.split("`")[1])
    assert command[:2] == ["ptq-debug", "suggest"] and command[command.index("--remedy") + 1] == "float"
    assert "find the fewest nodes to keep in float" in step
    capsys.readouterr()
    rc = main([*command[1:], "-s", str(tmp_path / "search"), "--quiet"])
    out = capsys.readouterr()
    assert rc in (0, 1) and "error" not in out.err, out.err  # 1: the target unmet, still a search run
    assert "kept in float" in out.out
    assert json.loads((tmp_path / "search" / "remedy_float.json").read_text())["remedy"] == "float"

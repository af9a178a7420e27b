"""QuantModel parsing, checked against the ONNX proto read directly with numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import builders
from pytest_ptq.errors import PTQError
from pytest_ptq.model import QuantModel

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
BITS = {np.dtype(np.int8): 8, np.dtype(np.uint8): 8, np.dtype(np.int16): 16,
        np.dtype(np.uint16): 16, np.dtype(np.int32): 32}


def _inits(model):
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _expected(path):
    """Every calibration node's parameters, from the proto and numpy only."""
    model = onnx.load(str(path))
    inits = _inits(model)
    out = {}
    for name, (q, dqs) in builders.qdq_pairs(model).items():
        node = q if q is not None else dqs[0]
        scale = inits[node.input[1]].astype(np.float64).reshape(-1)
        zp_arr = inits[node.input[2]]
        info = np.iinfo(zp_arr.dtype)
        zp = np.broadcast_to(zp_arr.astype(np.float64).reshape(-1), scale.shape)
        axis = None
        if scale.size > 1:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        users = [n.name for d in dqs for n in model.graph.node
                 if d.output[0] in n.input and n.op_type not in QDQ_OPS]
        out[name] = {
            "kind": "weight" if node.input[0] in inits else "activation",
            "input": node.input[0], "scale": scale, "zp": zp, "axis": axis, "bit": BITS[zp_arr.dtype],
            "threshold": float(np.max(scale * np.maximum(info.max - zp, zp - info.min))),
            "role": "bias" if zp_arr.dtype == np.int32 else "",
            "consumers": users, "dq_outputs": {d.output[0] for d in dqs},
        }
    return out


VARIANTS = ["qdq", "qdq_pc", "default", "default_pc", "dq_weights", "int8", "int16", "uint16"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_calibration_nodes_match_the_proto(zoo, variant):
    path = zoo.qdq(variant)
    want = _expected(path)
    qm = QuantModel(path)
    assert set(qm.calibration) == set(want)
    for name, c in qm.calibration.items():
        w = want[name]
        assert (c.kind, c.input, c.axis, c.bit, c.role) == (w["kind"], w["input"], w["axis"], w["bit"], w["role"]), name
        np.testing.assert_array_equal(c.scale.astype(np.float64).reshape(-1), w["scale"])
        np.testing.assert_array_equal(np.broadcast_to(c.zero_point.reshape(-1), w["scale"].shape), w["zp"])
        assert c.threshold == pytest.approx(w["threshold"], rel=1e-6), name
        assert c.per_channel == (w["axis"] is not None)
        assert sorted(c.consumers) == sorted(w["consumers"]), name
        assert set(c.outputs) == w["dq_outputs"]


@pytest.mark.parametrize("variant", ["qdq", "default", "dq_weights_pc"])
def test_normal_nodes_map_to_their_calibration_inputs(zoo, variant):
    path = zoo.qdq(variant)
    model = onnx.load(str(path))
    dq_owner = {o: name for name, (_, dqs) in builders.qdq_pairs(model).items() for d in dqs for o in d.output}
    qm = QuantModel(path)
    normal = [n for n in model.graph.node if n.op_type not in QDQ_OPS]
    assert list(qm.normal) == [n.name for n in normal]  # graph order is topological here
    for n in normal:
        feeding = list(dict.fromkeys(dq_owner[i] for i in n.input if i in dq_owner))
        got = qm.normal[n.name]
        assert got.calibration_inputs == feeding, n.name
        assert (got.op_type, got.inputs, got.outputs) == (n.op_type, list(n.input), list(n.output))
    # the two directions agree
    for c in qm.calibration.values():
        for consumer in c.consumers:
            assert c.name in qm.normal[consumer].calibration_inputs


def test_weight_and_activation_kinds_for_default_quantization(zoo):
    qm = QuantModel(zoo.qdq("default_pc"))
    weights = qm.of_kind("weight")
    # onnxruntime's default: weights and biases are quantized initializers behind a lone DQ
    assert weights and all(c.q_node is None and len(c.dq_nodes) == 1 for c in weights)
    assert {c.role for c in weights} == {"bias", ""}
    assert all(c.bit == 32 for c in weights if c.role == "bias")
    assert all(c.axis == 0 and c.per_channel for c in weights if c.role == "")
    assert all(c.q_node is not None for c in qm.of_kind("activation"))
    # without the float model a lone DQ cannot be bypassed
    assert not any(c.bypassable for c in weights)


@pytest.mark.parametrize("variant,qtype,bit", [("int16", onnx.TensorProto.INT16, 16),
                                               ("uint16", onnx.TensorProto.UINT16, 16),
                                               ("int8", onnx.TensorProto.INT8, 8)])
def test_activation_bit_width(zoo, variant, qtype, bit):
    qm = QuantModel(zoo.qdq(variant))
    acts = qm.of_kind("activation")
    assert acts and all(c.qtype == qtype and c.bit == bit for c in acts)
    assert all(c.bit == 8 for c in qm.of_kind("weight") if c.role == "")


def test_a_quantize_feeding_several_dequantizes_is_one_node(zoo, tmp_path):
    path = builders.split_dq(zoo.qdq("qdq"), tmp_path / "split.onnx", "r1_QuantizeLinear")
    model = onnx.load(str(path))
    q_out = next(n.output[0] for n in model.graph.node if n.name == "r1_QuantizeLinear")
    assert sum(q_out in n.input for n in model.graph.node) == 2
    qm = QuantModel(path)
    c = qm.calibration["r1_QuantizeLinear"]
    assert len(c.dq_nodes) == 2 and sorted(c.consumers) == ["add2", "conv2"]
    assert not any(d.name in qm.calibration for d in c.dq_nodes)
    assert len(qm.calibration) == len(QuantModel(zoo.qdq("qdq")).calibration)


def test_fake_quant_equals_onnxruntime_quantize_dequantize(zoo):
    qm = QuantModel(zoo.qdq("qdq_pc"))
    rng = np.random.default_rng(3)
    for c in (qm.calibration["w2_QuantizeLinear"], qm.calibration["c2_QuantizeLinear"]):
        x = (rng.standard_normal((8, 8, 3, 3)) * 2 * c.threshold).astype(np.float32)
        # a Q/DQ model with the node's own parameters as the reference
        scale = numpy_helper.from_array(c.scale, "s")
        zp = numpy_helper.from_array(qm.constant(c.q_node.input[2]), "z")
        axis = {"axis": c.axis} if c.axis is not None else {}
        graph = helper.make_graph(
            [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **axis)],
            "qdq", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [scale, zp])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        want = builders.run_model(model, {"x": x})["y"]
        np.testing.assert_array_equal(c.fake_quant(x), want)
        lo, hi = c.range()
        assert np.max(np.maximum(-lo, hi)) == pytest.approx(c.threshold, rel=1e-6)


def test_external_data_model_parses_like_the_inline_one(zoo, tmp_path):
    src = zoo.qdq("qdq_pc")
    out = tmp_path / "ext" / "model.onnx"
    out.parent.mkdir()
    onnx.save(onnx.load(str(src)), str(out), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    assert (out.parent / "weights.bin").stat().st_size > 0
    assert not onnx.load(str(out), load_external_data=False).graph.initializer[0].raw_data
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.parent.iterdir())
    ext, inline = QuantModel(out), QuantModel(src)
    assert list(ext.calibration) == list(inline.calibration)
    for name, c in ext.calibration.items():
        np.testing.assert_array_equal(c.scale, inline.calibration[name].scale)
        assert c.threshold == inline.calibration[name].threshold
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.parent.iterdir()) == before


def test_unnamed_nodes_get_stable_generated_names(zoo, tmp_path):
    path = zoo.qdq("unnamed")
    raw = onnx.load(str(path))
    assert any(not n.name for n in raw.graph.node if n.op_type not in QDQ_OPS)
    first = QuantModel(path)
    names = list(first.normal)
    assert all(names) and len(set(names)) == len(names)
    assert names[:2] == ["Conv_0", "Relu_0"]
    # same names on reload, and from a copy saved elsewhere
    copy = tmp_path / "copy.onnx"
    onnx.save(raw, str(copy))
    assert list(QuantModel(path).normal) == names == list(QuantModel(copy).normal)
    assert QuantModel(copy).calibration["r1_QuantizeLinear"].consumers == ["Conv_1", "Add_0"]
    # the user's file keeps its unnamed nodes
    assert onnx.load(str(path)) == raw


def test_two_inputs_and_two_outputs(zoo):
    qm = QuantModel(zoo.qdq("two_inputs"))
    assert qm.input_names == ["x", "y"]
    assert {"x_QuantizeLinear", "y_QuantizeLinear"} <= set(qm.calibration)
    assert qm.normal["add_in"].calibration_inputs == ["x_QuantizeLinear", "y_QuantizeLinear"]
    qm2 = QuantModel(zoo.qdq("two_outputs"))
    assert qm2.output_names == ["prob", "r2"]


def test_float_model_recovers_lone_dq_weights(zoo):
    fpath = zoo.float("default")
    finits = _inits(onnx.load(str(fpath)))
    fnodes = {n.name: n for n in onnx.load(str(fpath)).graph.node}
    qm = QuantModel(zoo.qdq("default"), float_model=fpath)
    weights = qm.of_kind("weight")
    assert len(weights) == 6
    for c in weights:
        assert c.bypassable and c.float_weight is not None, c.name
        # the float weight is what the float model's node of the same name reads there
        (consumer,) = c.consumers
        k = qm.normal[consumer].inputs.index(c.outputs[0])
        np.testing.assert_array_equal(qm.float_weights[c.float_weight], finits[fnodes[consumer].input[k]])
    # the Relu that quantize_static folded into these pairs and deleted is found
    folded = {c.name: c.folded for c in qm.of_kind("activation") if c.folded}
    assert folded == {"r1_QuantizeLinear": ("Relu", 0.0, np.inf), "r2_QuantizeLinear": ("Relu", 0.0, np.inf)}
    assert QuantModel(zoo.qdq("default")).folded_activation_suspects() == list(folded)
    assert qm.folded_activation_suspects() == []


def test_float_model_finds_a_folded_clip_with_its_bounds(tmp_path):
    fpath = builders.conv_clip_net(tmp_path / "clip.onnx")
    qpath = builders.quantize(fpath, tmp_path / "clip_q.onnx", builders.samples(4, size=8), keep_float=False)
    assert "Clip" not in [n.op_type for n in onnx.load(str(qpath)).graph.node]
    qm = QuantModel(qpath, float_model=fpath)
    assert [c.folded for c in qm.of_kind("activation") if c.folded] == [("Clip", 0.0, 6.0)]


def test_a_relu_after_a_bias_reshaped_from_a_constant_is_found_where_the_quantizer_folded_it(tmp_path):
    """Paddle's exports add a Conv's bias through a Reshape of a Constant node, which
    quantize_static quantizes as a weight: the float side could not compute that Reshape, the
    Add matched nothing, and the Relu after it (folded) was never re-applied; PP-OCR's
    classifier was refused as "not the float model" with its own float model given."""
    from pytest_ptq.engine import Engine

    rng = np.random.default_rng(0)
    const = [helper.make_node("Constant", [], ["bias_flat"], value=numpy_helper.from_array(
                 rng.standard_normal(8).astype(np.float32), "bias_flat")),
             helper.make_node("Constant", [], ["bias_shape"], value=numpy_helper.from_array(
                 np.array([1, 8, 1, 1], np.int64), "bias_shape"))]
    nodes = const + [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                     helper.make_node("Reshape", ["bias_flat", "bias_shape"], ["bias"], name="bias_reshape"),
                     helper.make_node("Add", ["c", "bias"], ["c_b"], name="bias_add"),
                     helper.make_node("Relu", ["c_b"], ["r"], name="relu"),
                     helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 1, 1])],
                              [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")])
    fpath = builders.save_model(graph, tmp_path / "f.onnx")
    data = builders.samples(4, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data, keep_float=False)
    assert "Relu" not in [n.op_type for n in onnx.load(str(qpath)).graph.node]
    qm = QuantModel(qpath, float_model=fpath)
    assert qm.alignment.nodes.get("bias_add") == "bias_add" and not qm.alignment.rewrites
    assert [c.folded for c in qm.of_kind("activation") if c.folded] == [("Relu", 0.0, float("inf"))]
    engine = Engine(qm, data, float_model=str(fpath))  # float-equivalent, not refused
    np.testing.assert_allclose(engine.run(0, ())["y"], builders.run_model(fpath, {"x": data["x"][0]})["y"],
                               rtol=1e-6, atol=1e-6)


def test_model_without_qdq_is_a_clear_error(zoo):
    with pytest.raises(PTQError, match="no QuantizeLinear/DequantizeLinear.*quantize_static") as err:
        QuantModel(zoo.float())
    assert str(zoo.float()) in str(err.value)


def _if_model(branch_nodes, inits):
    """``y = If(flag)``: the then-branch computes ``branch_nodes`` on ``x``, the else-branch
    passes ``x`` through; the branches read ``x`` and ``inits`` from the main graph."""
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])
    then = helper.make_graph(branch_nodes, "then", [], [helper.make_tensor_value_info(branch_nodes[-1].output[0],
                                                                                      onnx.TensorProto.FLOAT, [1, 8])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["x_copy"])], "else", [],
                              [helper.make_tensor_value_info("x_copy", onnx.TensorProto.FLOAT, [1, 8])])
    graph = helper.make_graph([helper.make_node("If", ["flag"], ["y"], name="gate", then_branch=then,
                                                else_branch=other)], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8]),
                               helper.make_tensor_value_info("flag", onnx.TensorProto.BOOL, [])], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_model_computing_inside_control_flow_is_told_so(tmp_path):
    """quantize_static leaves If/Loop subgraphs in float (silero-vad's model is one If): the
    refusal says where the nodes are and what to export, not "pass the quantized model"."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from pytest_ptq.errors import NotQuantized

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "w")
    model = _if_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["t"])], [w])

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": np.ones((1, 8), np.float32), "flag": np.array(True)}])

        def get_next(self):
            return next(self.it, None)

    onnx.save(model, str(tmp_path / "f.onnx"))
    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ)
    with pytest.raises(NotQuantized) as err:
        QuantModel(str(tmp_path / "q.onnx"))
    assert "3 of its 4 nodes are inside the subgraphs of its If node 'gate'" in str(err.value)
    assert "export the model without that control flow" in str(err.value)
    # Q/DQ only inside a branch: said as such
    s, z = (numpy_helper.from_array(np.array(v, t), n) for v, t, n in ((0.1, np.float32, "s"), (0, np.uint8, "z")))
    model = _if_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                       helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"])], [s, z])
    with pytest.raises(NotQuantized, match="its 2 quantized node.s. are all inside the "
                                           "subgraphs of its If node 'gate'"):
        QuantModel(model)


def test_missing_and_corrupt_model_files(tmp_path):
    with pytest.raises(PTQError, match="does not exist"):
        QuantModel(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a model" * 10)
    with pytest.raises(PTQError, match="bad.onnx.*not a readable ONNX model"):
        QuantModel(bad)


def test_resolve_calibration_and_unknown_names(zoo):
    qm = QuantModel(zoo.qdq("qdq"))
    assert qm.resolve_calibration(["conv2", "x_QuantizeLinear"]) == [
        "r1_QuantizeLinear", "w2_QuantizeLinear", "b2_DequantizeLinear", "x_QuantizeLinear"]
    with pytest.raises(PTQError, match="unknown node 'conv_2'.*'conv2'"):
        qm.resolve_calibration(["conv_2"])


def _single_pair(q_attrs, zero_point, opset):
    """x -> Q -> DQ -> Relu with scale 0.05, the zero point optional."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s")]
    q_in = ["x", "s"]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(zero_point, "z"))
        q_in.append("z")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", q_in, ["q"], name="q_x", **q_attrs),
         helper.make_node("DequantizeLinear", ["q", *q_in[1:]], ["dq"], name="dq_x"),
         helper.make_node("Relu", ["dq"], ["y"], name="relu")],
        "pair", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 4, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("q_attrs,zero_point,opset,qtype,qmax_minus_zp", [
    ({}, None, 17, onnx.TensorProto.UINT8, 255),  # no zero point: uint8, zero point 0
    ({"output_dtype": onnx.TensorProto.INT16}, None, 21, onnx.TensorProto.INT16, 32768),
    ({}, np.array(3, np.int8), 17, onnx.TensorProto.INT8, 131),  # max(127 - 3, 3 + 128)
])
def test_hand_built_pairs(q_attrs, zero_point, opset, qtype, qmax_minus_zp):
    model = _single_pair(q_attrs, zero_point, opset)
    before = model.SerializeToString()
    c = QuantModel(model).calibration["q_x"]
    assert model.SerializeToString() == before  # a ModelProto passed in is not touched
    assert (c.kind, c.qtype, c.bit) == ("activation", qtype, BITS[np.dtype(helper.tensor_dtype_to_np_dtype(qtype))])
    assert c.threshold == pytest.approx(0.05 * qmax_minus_zp)
    x = (np.random.default_rng(0).standard_normal((1, 3, 4, 4)) * 1000).astype(np.float32)
    want = builders.run_model(model, {"x": x})["y"]
    np.testing.assert_array_equal(np.maximum(c.fake_quant(x), 0), want)


def test_a_model_proto_keeps_its_unnamed_nodes(zoo):
    proto = onnx.load(str(zoo.qdq("unnamed")))
    before = proto.SerializeToString()
    assert "Conv_0" in QuantModel(proto).normal
    assert proto.SerializeToString() == before


@pytest.mark.parametrize("shape, scale_shape, axis, block", [
    ((40, 30), (), None, 0),            # per tensor
    ((40, 30), (40,), 0, 0),            # per channel on the rows (a convolution's output channels)
    ((40, 30), (30,), 1, 0),            # per channel on another axis (a MatMul weight's columns)
    ((40, 30), (40, 3), 1, 10),         # blocks along the columns
    ((45, 30), (3, 30), 0, 16),         # blocks along the rows, the last one short
    ((), (), None, 0),                  # a scalar
])
def test_fake_quant_and_dequantize_by_row_blocks_equal_the_whole_tensor(monkeypatch, shape, scale_shape, axis, block):
    """A large weight is computed a block of rows at a time; the values are those of the
    whole tensor at once, computed here with numpy from the parameters directly."""
    from pytest_ptq.model import grids, qdq

    rng = np.random.default_rng(0)
    scale = rng.uniform(0.01, 0.05, scale_shape).astype(np.float32)
    zp = rng.integers(-3, 4, scale_shape).astype(np.int8)
    c = qdq.CalibrationNode("w_QuantizeLinear", "weight", "w", None, [], scale, zp, axis, onnx.TensorProto.INT8,
                            grids.GRIDS[onnx.TensorProto.INT8], 1.0, block)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    codes = rng.integers(-128, 128, shape).astype(np.int8)
    if block:  # each scale repeated over its block, cut to the tensor
        s = np.repeat(scale.astype(np.float64), block, axis=axis)[tuple(slice(0, n) for n in shape)]
        z = np.repeat(zp.astype(np.float64), block, axis=axis)[tuple(slice(0, n) for n in shape)]
    elif scale.size > 1:
        s = scale.astype(np.float64).reshape([-1 if k == axis else 1 for k in range(len(shape))])
        z = zp.astype(np.float64).reshape(s.shape)
    else:
        s, z = np.float64(scale), np.float64(zp)
    want_fq = ((np.clip(np.rint(x / s) + z, -128, 127) - z) * s).astype(np.float32)
    want_dq = ((codes - z) * s).astype(np.float32)
    monkeypatch.setattr(qdq, "ROW_BLOCK", 100)  # blocks of about 3 rows
    assert len(list(c.row_blocks(shape))) == (1 if not shape else -(-shape[0] // (16 if axis == 0 and block else 3)))
    np.testing.assert_array_equal(c.fake_quant(x), want_fq)
    np.testing.assert_array_equal(c.dequantize(codes), want_dq)


def test_aligning_lone_dq_weights_holds_one_dequantized_weight_and_a_few_blocks(tmp_path):
    """Matching int8 weights behind lone DQs to their float model dequantizes each one: the
    alignment holds one such float copy at a time (not also the last one the node matching
    compared) and float64 temporaries of a block of rows, not of the weight. Measured with
    tracemalloc, which sees every numpy allocation: the bound is the largest weight in
    float32 plus eight float64 temporaries of a block (the last release: 56 MiB here)."""
    import tracemalloc

    import conventions
    from pytest_ptq.model import qdq

    fpath = conventions.mlp_net(tmp_path / "f.onnx", width=1024, hidden=2048)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", conventions.mlp_samples(2, width=1024), per_channel=True,
                              keep_float=False)
    largest = 2048 * 2048 * 4
    tracemalloc.start()
    try:
        qm = QuantModel(qpath, float_model=fpath)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert all(c.float_weight for c in qm.of_kind("weight"))  # every weight matched
    assert peak < largest + 8 * 8 * qdq.ROW_BLOCK, peak / 2**20


def test_float_weights_stay_mapped_in_the_float_model_file(tmp_path, monkeypatch):
    """The float model's large weights are read from its file, not copied, and matched to
    the quantized ones a few rows at a time."""
    from pytest_ptq.model import graph, qdq

    fpath = builders.conv_net(tmp_path / "f.onnx", channels=64)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", builders.samples(4), per_channel=True, keep_float=False)
    monkeypatch.setattr(qdq, "ROW_BLOCK", 1000)
    qm = QuantModel(qpath, float_model=fpath)
    want = _inits(onnx.load(str(fpath)))["w2"]
    assert want.nbytes >= graph.LARGE_BYTES
    (c,) = [c for c in qm.of_kind("weight") if "conv2" in c.consumers and c.role != "bias"]
    value = qm.float_weights[c.float_weight]
    np.testing.assert_array_equal(value, want)
    assert graph.mapping(value) is not None  # a view on the file's mapping


def test_model_without_equals_a_whole_copy_emptied(tmp_path):
    from pytest_ptq.model.graph import model_without

    model = onnx.load(builders.conv_net(tmp_path / "f.onnx"))
    model.metadata_props.add(key="producer note", value="kept")
    model.graph.doc_string = "kept too"
    before = model.SerializeToString()
    got = model_without(model, ("node", "initializer"))
    want = onnx.ModelProto()
    want.CopyFrom(model)
    del want.graph.node[:], want.graph.initializer[:]
    assert got == want and got.metadata_props[0].value == "kept" and got.graph.doc_string == "kept too"
    assert len(got.opset_import) == len(model.opset_import) > 0 and not got.graph.node
    assert model.SerializeToString() == before


def test_a_model_proto_gives_the_engine_of_its_file_without_a_second_copy_of_its_weights(tmp_path):
    from pytest_ptq.engine import Engine
    from pytest_ptq.model.graph import is_placeholder, load_light
    from pytest_ptq.sensitivity import get_sensitivity_of_nodes

    fpath = builders.conv_net(tmp_path / "f.onnx", channels=64)
    data = builders.samples(2)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data, per_channel=True)
    builders.save_folder(data, tmp_path / "data")
    proto = onnx.load(str(qpath))
    before = proto.SerializeToString()
    light, path, arrays = load_light(proto)
    assert path is None and arrays and proto.SerializeToString() == before
    stored = {i.name: i for i in proto.graph.initializer}
    assert all(is_placeholder(i) for i in light.graph.initializer if i.name in arrays)
    assert all(np.array_equal(a, numpy_helper.to_array(stored[n])) for n, a in arrays.items())
    from_file = get_sensitivity_of_nodes(Engine(str(qpath), tmp_path / "data"), node_type="activation")
    from_proto = get_sensitivity_of_nodes(Engine(proto, tmp_path / "data"), node_type="activation")
    assert list(from_proto) == list(from_file)
    for name in from_file:
        assert from_proto[name]["cosine-similarity"] == pytest.approx(from_file[name]["cosine-similarity"], abs=1e-7)
    assert proto.SerializeToString() == before


def test_a_float_body_beside_quantized_nodes_is_named(tmp_path):
    """A Loop or If body the quantizer left in float beside a quantized main graph (a table
    recogniser's attention decoder in a Loop) went unmentioned."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    chain = [helper.make_node("Tanh", ["m" if k == 0 else f"t{k - 1}"], [f"t{k}"]) for k in range(12)]
    branch_model = _if_model([helper.make_node("Identity", ["m"], ["m_in"])] + chain, [])
    graph = branch_model.graph
    graph.node.insert(0, helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"))
    graph.initializer.append(w)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rng.standard_normal((1, 8)).astype(np.float32), "flag": np.array(True)}])

        def get_next(self):
            return next(self.it, None)

    onnx.save(branch_model, tmp_path / "f.onnx")
    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ)
    notes = QuantModel(str(tmp_path / "q.onnx")).notes
    assert [n for n in notes if "stay in float" in n] == [
        "the 14 nodes inside the subgraphs of If 'gate' stay in float (the quantizer left them so): the analyses rank "
        "the main graph's pairs, among them those feeding the If, whose error it carries on"]


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("rounded", [False, True])
def test_a_large_block_quantized_weight_pair_is_ranked_and_its_grid_read(axis, rounded):
    """A float weight behind a per-block int4 pair, larger than the sample the on-grid check
    reads: the model loads, the weight's sensitivity equals the pair alone run in a plain
    session against the float model, and a weight already rounded onto the blocks' grid is
    flagged as such (bypassing its pair changes nothing)."""
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from pytest_ptq import debug

    rng = np.random.default_rng(0)
    k, n, block = 1024, 256, 128
    w = rng.normal(size=(k, n)).astype(np.float32)
    blocks = w.reshape(k // block, block, n).swapaxes(0, 1) if axis == 0 else w.reshape(k, n // block, block).swapaxes(1, 2)
    scale = (np.abs(blocks).max(axis=axis) / 7).astype(np.float32)  # [k/block, n] or [k, n/block]
    if rounded:
        full = np.repeat(scale, block, axis=axis)
        w = (np.clip(np.rint(w / full), -8, 7) * full).astype(np.float32)

    def model(nodes, inits):
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, k])],
                                  [helper.make_tensor_value_info("y", TP.FLOAT, [2, n])], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)

    zp = helper.make_tensor("wz", TP.INT4, list(scale.shape), [0] * scale.size)
    qdq = model([helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="q_w", axis=axis, block_size=block),
                 helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dq_w", axis=axis, block_size=block),
                 helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm")],
                [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "ws"), zp])
    qm = QuantModel(qdq)
    assert qm.calibration["q_w"].block_size == block and qm.calibration["q_w"].on_grid == rounded
    if rounded:
        return
    data = {"x": [rng.normal(size=(2, k)).astype(np.float32) for _ in range(3)]}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    float_model = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [numpy_helper.from_array(w, "w")])

    def outputs(m):
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return np.concatenate([s.run(None, {"x": x})[0] for x in data["x"]]).ravel().astype(np.float64)

    ref, quant = outputs(float_model), outputs(qdq)
    want = ref @ quant / np.sqrt((ref @ ref) * (quant @ quant))
    got = debug.get_sensitivity_of_nodes(qdq, ["cosine-similarity"], data, node_type="weight")
    assert got["q_w"]["cosine-similarity"] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("layout", ["Reshape", "Transpose", "Unsqueeze+Squeeze", "Flatten", "computed shape"])
def test_a_weight_laid_out_before_its_pair_is_a_weight(layout):
    """Exports put a Reshape or Transpose between an initializer and its pair: the tensor is
    still a constant, so its pair is a weight's, ranked with the weights, and its sensitivity
    equals the pair alone in a plain session against the float weights. A Reshape to a shape
    computed from the input is not constant, and stays an activation."""
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from pytest_ptq import debug

    rng = np.random.default_rng(0)
    d = 8
    w = rng.normal(size=(d, d)).astype(np.float32)
    inits = [numpy_helper.from_array(np.float32(np.abs(w).max() / 127), "s"), numpy_helper.from_array(np.int8(0), "z")]
    if layout == "Reshape":
        inits += [numpy_helper.from_array(w.reshape(d, 2, d // 2), "src"),
                  numpy_helper.from_array(np.array([0, -1], np.int64), "shape")]
        pre = [helper.make_node("Reshape", ["src", "shape"], ["wf"])]  # 0 keeps the input's first dimension
    elif layout == "Transpose":
        inits.append(numpy_helper.from_array(w.T.copy(), "src"))
        pre = [helper.make_node("Transpose", ["src"], ["wf"], perm=[1, 0])]
    elif layout == "Unsqueeze+Squeeze":
        inits += [numpy_helper.from_array(w, "src"), numpy_helper.from_array(np.array([0, 3], np.int64), "axes")]
        pre = [helper.make_node("Unsqueeze", ["src", "axes"], ["wu"]), helper.make_node("Squeeze", ["wu", "axes"], ["wf"])]
    elif layout == "Flatten":
        inits.append(numpy_helper.from_array(w.reshape(d, 2, d // 2), "src"))
        pre = [helper.make_node("Flatten", ["src"], ["wf"], axis=-2)]
    else:
        inits.append(numpy_helper.from_array(w.ravel(), "src"))
        pre = [helper.make_node("Shape", ["x"], ["xs"], end=1), helper.make_node("Concat", ["xs", "xs"], ["sh"], axis=0),
               helper.make_node("Mul", ["sh", "four"], ["shape"]), helper.make_node("Reshape", ["src", "shape"], ["wf"])]
        inits.append(numpy_helper.from_array(np.array([4, 4], np.int64), "four"))
    nodes = pre + [helper.make_node("QuantizeLinear", ["wf", "s", "z"], ["wq"], name="q_w"),
                   helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"], name="dq_w"),
                   helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm")]
    rows = 2 if layout == "computed shape" else 4
    model = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [rows, d])],
                                                [helper.make_tensor_value_info("y", TP.FLOAT, [rows, d])], inits),
                              opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    if layout == "computed shape":
        assert QuantModel(model).calibration["q_w"].kind == "activation"
        return
    assert QuantModel(model).calibration["q_w"].kind == "weight"
    xs = [rng.normal(size=(rows, d)).astype(np.float32) for _ in range(3)]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    quant = np.concatenate([session.run(None, {"x": x})[0] for x in xs]).ravel().astype(np.float64)
    ref = np.concatenate([x @ w for x in xs]).ravel().astype(np.float64)
    got = debug.get_sensitivity_of_nodes(model, ["cosine-similarity"], {"x": xs}, node_type="weight")
    assert list(got) == ["q_w"]
    assert got["q_w"]["cosine-similarity"] == pytest.approx(ref @ quant / np.sqrt((ref @ ref) * (quant @ quant)), abs=1e-6)


def test_a_block_scale_that_does_not_fit_its_weight_is_refused_in_one_sentence():
    """A block-wise DQ whose scale has blocks along the wrong axis (an int4 export of a Gemm
    with transB): onnxruntime refuses it, and dequantizing it stopped on numpy's broadcast
    error; a scale of the right shape loads."""
    from onnx import TensorProto as TP

    codes = np.zeros((128, 256), np.int8)

    def model(scale_shape):
        graph = helper.make_graph(
            [helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], name="dq_w", axis=0, block_size=128),
             helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm")], "g",
            [helper.make_tensor_value_info("x", TP.FLOAT, [1, 128])], [helper.make_tensor_value_info("y", TP.FLOAT, [1, 256])],
            [helper.make_tensor("wq", TP.INT4, list(codes.shape), codes.ravel().tolist()),
             numpy_helper.from_array(np.full(scale_shape, 0.1, np.float32), "ws")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)

    assert QuantModel(model((1, 256))).calibration["dq_w"].block_size == 128
    with pytest.raises(PTQError, match=r"DequantizeLinear 'dq_w' .* has a scale of shape \[128, 2\] for blocks of 128 "
                                       r"along axis 0 .* of shape \[128, 256\]; block-wise quantization takes a scale "
                                       r"of shape \[1, 256\]"):
        QuantModel(model((128, 2)))


def test_a_model_output_written_by_a_fused_fake_quant_node_is_kept():
    """Quark's BFP wraps a Softmax in one BFPQuantizeDequantize node whose float output is the
    model's: it was read as the integer tensor inside a pair, left out, and the model refused
    as having no output that quantization changes."""
    from onnx import TensorProto as TP

    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["s"], name="softmax", axis=1),
         helper.make_node("BFPQuantizeDequantize", ["s"], ["y"], name="bfp", domain="com.amd.quark", bit_width=16)],
        "g", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 8])], [helper.make_tensor_value_info("y", TP.FLOAT, [1, 8])])
    qm = QuantModel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                            helper.make_opsetid("com.amd.quark", 1)]))
    assert qm.output_names == ["y"] and qm.calibration["bfp"].fused
    assert not any("'y'" in n for n in qm.notes)


def test_a_float16_models_weights_behind_lone_dqs_are_matched_to_its_float_model():
    """An fp16 export quantized in float32 and then converted (codes from the float32 scale,
    the scale and the float weights rounded to float16): some elements lie a little over half
    a step from the fp16 float weight, and the weight went unmatched and unranked. Matched, its
    sensitivity equals the float model with that weight dequantized, run in a plain session."""
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from pytest_ptq import debug

    rng = np.random.default_rng(7)
    d = 64
    w = rng.uniform(-1, 1, size=(d, d)).astype(np.float32)
    # a float32 scale just under half a float16 step above its float16 value: the most it moves
    scale = np.float32(np.float16(1 / 127)) * np.float32(1 + 0.98 * 2.0 ** -11)
    codes = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)

    def model(weight_nodes, inits):
        graph = helper.make_graph(
            [helper.make_node("Cast", ["x"], ["x16"], to=TP.FLOAT16), *weight_nodes,
             helper.make_node("MatMul", ["x16", "wd"], ["y16"], name="mm"),
             helper.make_node("Cast", ["y16"], ["y"], to=TP.FLOAT)], "g",
            [helper.make_tensor_value_info("x", TP.FLOAT, [2, d])], [helper.make_tensor_value_info("y", TP.FLOAT, [2, d])],
            inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)

    quantized = model([helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], name="dq_w")],
                      [numpy_helper.from_array(codes, "wq"), numpy_helper.from_array(np.float16(scale), "ws")])
    float_model = model([helper.make_node("Identity", ["w16"], ["wd"])], [numpy_helper.from_array(w.astype(np.float16), "w16")])
    off = np.abs(codes * np.float64(np.float16(scale)) - w.astype(np.float16)) / np.float64(np.float16(scale))
    assert (off > 0.5).mean() > 1 - 0.99  # past the rounding of float32 values: the case at hand
    assert QuantModel(quantized, float_model=float_model).calibration["dq_w"].float_weight is not None
    xs = [rng.normal(size=(2, d)).astype(np.float32) for _ in range(3)]
    dequantized = model([helper.make_node("Identity", ["w16"], ["wd"])],
                        [numpy_helper.from_array((codes * np.float16(scale)).astype(np.float16), "w16")])

    def outputs(m):
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return np.concatenate([s.run(None, {"x": x})[0] for x in xs]).ravel().astype(np.float64)

    ref, quant = outputs(float_model), outputs(dequantized)
    got = debug.get_sensitivity_of_nodes(quantized, ["cosine-similarity"], {"x": xs}, node_type="weight",
                                         float_model=float_model)
    assert got["dq_w"]["cosine-similarity"] == pytest.approx(ref @ quant / np.sqrt((ref @ ref) * (quant @ quant)), abs=1e-5)


@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_a_smoothquant_weight_is_matched_to_its_float_model_through_the_activations_factor(op):
    """Neural Compressor's SmoothQuant multiplies a node's input by a factor per input channel
    (a Mul the float model lacks) and stores the weight over that factor: the weight matched
    no float weight, stayed dequantized and was left out of the weight ranking. Matched, its
    sensitivity equals the lone DQ alone in a plain session against the float model."""
    from onnx import TensorProto as TP
    from pytest_ptq import debug

    rng = np.random.default_rng(3)
    k, n = 16, 8
    w = rng.normal(size=(n, k) if op == "Gemm" else (k, n)).astype(np.float32)
    factor = rng.uniform(0.2, 5, size=k).astype(np.float32)
    axis = 1 if op == "Gemm" else 0
    stored = w / (factor[None, :] if op == "Gemm" else factor[:, None])
    scale = (np.abs(stored).max(axis=axis) / 127).astype(np.float32)
    codes = np.clip(np.rint(stored / (scale[:, None] if op == "Gemm" else scale[None, :])), -127, 127).astype(np.int8)
    attrs = {"transB": 1} if op == "Gemm" else {}
    x_info = helper.make_tensor_value_info("x", TP.FLOAT, [2, k])
    y_info = helper.make_tensor_value_info("y", TP.FLOAT, [2, n])
    xs_scale = numpy_helper.from_array(np.float32(0.1), "xs")
    xs_zero = numpy_helper.from_array(np.int8(0), "xz")
    quantized = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "m"], ["xm"], name="smooth_mul"),
         helper.make_node("QuantizeLinear", ["xm", "xs", "xz"], ["xq"], name="q_x"),
         helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq_x"),
         helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], name="dq_w", axis=1 - axis),
         helper.make_node(op, ["xd", "wd"], ["y"], name="node", **attrs)], "q", [x_info], [y_info],
        [numpy_helper.from_array(factor, "m"), xs_scale, xs_zero, numpy_helper.from_array(codes, "wq"),
         numpy_helper.from_array(scale, "ws")]), opset_imports=[helper.make_opsetid("", 17)])
    float_model = helper.make_model(helper.make_graph(
        [helper.make_node(op, ["x", "w"], ["y"], name="node", **attrs)], "f", [x_info], [y_info],
        [numpy_helper.from_array(w, "w")]), opset_imports=[helper.make_opsetid("", 17)])
    assert QuantModel(quantized, float_model=float_model).calibration["dq_w"].float_weight is not None
    xs = [rng.normal(size=(2, k)).astype(np.float32) for _ in range(3)]
    only_weight = builders.rewire(quantized, keep=["dq_w"])

    def outputs(m):  # Q/DQ as float arithmetic, as every figure simulates them
        return np.concatenate([builders.run_model(m, {"x": x})["y"] for x in xs]).ravel().astype(np.float64)

    ref, quant = outputs(float_model), outputs(only_weight)
    got = debug.get_sensitivity_of_nodes(quantized, ["cosine-similarity"], {"x": xs}, node_type="weight",
                                         float_model=float_model)
    assert got["dq_w"]["cosine-similarity"] == pytest.approx(ref @ quant / np.sqrt((ref @ ref) * (quant @ quant)), abs=1e-6)


def test_an_external_data_file_cut_short_is_refused_as_such(zoo, tmp_path):
    """A truncated data file beside the model was refused with numpy's "mmap length is greater
    than file size" and the advice to keep the file beside the model, which it was."""
    out = tmp_path / "model.onnx"
    onnx.save(onnx.load(str(zoo.qdq("qdq"))), str(out), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    size = (tmp_path / "weights.bin").stat().st_size
    # the first tensor whose bytes the cut leaves incomplete, read from the protos themselves
    cut = size // 2
    proto = onnx.load(str(out), load_external_data=False)
    spans = []
    for init in proto.graph.initializer:
        info = {e.key: e.value for e in init.external_data}
        if info:
            start = int(info.get("offset", 0))
            spans.append((init.name, start, start + int(info["length"])))
    name, start, end = next(s for s in spans if s[2] > cut)
    with open(tmp_path / "weights.bin", "r+b") as f:
        f.truncate(cut)
    with pytest.raises(PTQError) as info:
        QuantModel(out)
    text = str(info.value)
    assert f"keeps its data in bytes {start}..{end} of" in text and f"which holds {cut}: the file is cut short" in text
    assert "mmap" not in text


def _varint3(v):
    """``v`` as a three-byte protobuf varint that is also UTF-8 text (a two-byte character and
    an ASCII one), or None."""
    b = bytes([0x80 | (v & 0x7F), 0x80 | ((v >> 7) & 0x7F), v >> 14])
    return b if 0xC2 <= b[0] <= 0xDF and b[1] <= 0xBF and b[2] < 0x80 and b[2] not in (0, 10, 13) else None


def _walks_as_binary(text):
    """``text`` (a textproto) behind a first comment line whose bytes walk as a binary ModelProto
    holding a graph with a 64 KiB raw initializer (the rest of the text), then a field numbered
    0 that no protobuf parser takes: still a text model onnx reads, by its extension."""
    from pytest_ptq.model.graph import LARGE_BYTES

    for raw in range(max(LARGE_BYTES, len(text) + 2), 1 << 21):
        for n in range(1, 120):
            if _varint3(raw) is None or n in (10, 13) or _varint3(raw + n + 8) is None or _varint3(raw + n + 12) is None:
                continue
            tensor = b"B" + bytes([n]) + b"w" * n + b"\x10\x01J" + _varint3(raw)  # name, FLOAT, raw_data
            head = b"\n#" + b"x" * 35 + b":" + _varint3(raw + n + 12) + b"*" + _varint3(raw + n + 8) + tensor
            body = b"\n" + text + b"#"
            return head + body + b"z" * (raw - len(body)) + b"\x02 " + b"y" * 31 + b"\n"
    raise AssertionError("no lengths fit")


@pytest.mark.parametrize("external", [False, True])
def test_a_text_model_whose_bytes_walk_as_protobuf_is_read_as_text(tmp_path, external):
    """The memory-mapped loading walks a file's bytes as binary protobuf: a text model whose
    first bytes walk as fields raised protobuf's DecodeError (a traceback) instead of being
    read as the text it is. It lists the nodes the binary .onnx does, read by onnx directly."""
    qpath = builders.quantize(builders.conv_net(tmp_path / "f.onnx"), tmp_path / "q.onnx", builders.samples(2))
    model = onnx.load(str(qpath))
    kw = {"save_as_external_data": True, "location": "t.data", "size_threshold": 0} if external else {}
    onnx.save(model, str(tmp_path / "t.textproto"), **kw)
    (tmp_path / "t.textproto").write_bytes(_walks_as_binary((tmp_path / "t.textproto").read_bytes()))
    assert [n.name for n in onnx.load(str(tmp_path / "t.textproto")).graph.node] == [n.name for n in model.graph.node]
    qm = QuantModel(str(tmp_path / "t.textproto"))
    assert [n.name for n in qm.model.graph.node] == [n.name for n in model.graph.node]
    assert {i.name: list(i.dims) for i in qm.model.graph.initializer} == \
        {i.name: list(i.dims) for i in model.graph.initializer}

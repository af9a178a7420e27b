"""Weights whose quantization onnxruntime's constant folding computed into the file.

A session saving ``optimized_model_filepath`` with its constant folding on folds each
weight's DequantizeLinear of constant codes (or Q/DQ of a constant float weight) into a
float initializer holding the quantized values: no pair is left to bypass, and nothing
else tells it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import builders
from pytest_ptq.engine.core import Engine
from pytest_ptq.model import QuantModel
from pytest_ptq.model import grids
from pytest_ptq.model.grids import GRIDS, fake_quant, integer_grid
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

FOLDED = "rounded onto an integer grid"
POSSIBLY = "may have been folded into the file"


def optimized(qpath, out, level="BASIC"):
    """``qpath`` as an onnxruntime session saves it optimized at ``level``, Q/DQ kept."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, f"ORT_ENABLE_{level}")
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(qpath), so, providers=["CPUExecutionProvider"])
    return out


def folded_from_proto(qpath, opt_path):
    """The initializers of the optimized file that stand where the quantized file computed a
    DequantizeLinear of 8-bit codes (a weight's; a bias's codes are int32), read from both
    protos."""
    q, opt = onnx.load(str(qpath)), onnx.load(str(opt_path))
    inits = {i.name: i for i in q.graph.initializer}
    producer = {o: n for n in q.graph.node for o in n.output}

    eight_bit = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)

    def codes(tensor):  # 8-bit codes of a constant: an initializer, or a Q (its zero point's type) of one
        if tensor in inits:
            return inits[tensor].data_type in eight_bit
        node = producer.get(tensor)
        return (node is not None and node.op_type == "QuantizeLinear" and node.input[0] in inits
                and inits[node.input[2]].data_type in eight_bit)

    dq_weights = {n.output[0] for n in q.graph.node if n.op_type == "DequantizeLinear" and codes(n.input[0])}
    remaining_dq = {n.output[0] for n in opt.graph.node if n.op_type == "DequantizeLinear"}
    found = {i.name for i in opt.graph.initializer if i.name in dq_weights}
    assert not found & remaining_dq
    return found


def folded_biases_from_proto(qpath, opt_path):
    """The initializers of the optimized file that stand where the quantized file computed a
    DequantizeLinear of int32 codes (a Conv's or Gemm's bias), read from both protos."""
    q, opt = onnx.load(str(qpath)), onnx.load(str(opt_path))
    int32 = {i.name for i in q.graph.initializer if i.data_type == onnx.TensorProto.INT32}
    dq_biases = {n.output[0] for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in int32}
    return {i.name for i in opt.graph.initializer if i.name in dq_biases}


@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    root = tmp_path_factory.mktemp("folded")
    fp = builders.conv_net(root / "float.onnx")
    data = builders.samples(4)
    made = {}
    for name, kw, level in (("pairs", {}, "BASIC"),
                            ("lone_pc", {"keep_float": False, "per_channel": True,
                                         "extra_options": {"QDQKeepRemovableActivations": True}}, "EXTENDED")):
        q = builders.quantize(fp, root / f"{name}.onnx", data, **kw)
        made[name] = (q, optimized(q, root / f"{name}_opt.onnx", level))
    return {"float": fp, "data": data, "folder": builders.save_folder(data, root / "calib"), "made": made}


def _named(note, tensors):
    return {t for t in tensors if repr(t) in note}


@pytest.mark.parametrize("name", ["pairs", "lone_pc"])
def test_weights_whose_dequantize_was_folded_into_the_file_are_named_with_the_float_model(folded, name):
    q, opt = folded["made"][name]
    expected, biases = folded_from_proto(q, opt), folded_biases_from_proto(q, opt)
    assert len(expected) == 3 and len(biases) == 3  # both convs' and the Gemm's
    qm = QuantModel(str(opt), float_model=str(folded["float"]))
    notes = [n for n in qm.notes if FOLDED in n]
    assert len(notes) == 1
    every_init = {i.name for i in onnx.load(str(opt)).graph.initializer}
    assert _named(notes[0], every_init) == expected | biases  # exactly those, no scale
    assert set(qm.restored) == expected | biases  # each put back behind a DequantizeLinear of its own
    assert "analysed as restored pairs" in notes[0]
    # why they must be: bypassing every pair of the file leaves them quantized, so the bypassed
    # file (every pair removed) is not the float model
    feeds = {"x": folded["data"]["x"][0]}
    bypassed = builders.run_model(builders.rewire(opt), feeds)["prob"]
    reference = builders.run_model(folded["float"], feeds)["prob"]
    assert np.abs(bypassed - reference).max() > 1e-4
    # and every face hears it: the engine's warnings are what the CLI, the plugin and
    # contracts print
    engine = Engine(str(opt), str(folded["folder"]), float_model=str(folded["float"]))
    assert notes[0] in engine.warnings


def _file_values(opt, float_path):
    """``{float model initializer: the optimized file's value}`` for each constant the two
    models' nodes of the same name read at the same input (weights and biases), read from
    both protos."""
    fmodel, model = onnx.load(str(float_path)), onnx.load(str(opt))
    finits = {i.name for i in fmodel.graph.initializer}
    stored = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    return {f: stored[nodes[n.name].input[k]] for n in fmodel.graph.node if n.name in nodes
            for k, f in enumerate(n.input) if f in finits and k < len(nodes[n.name].input)
            and nodes[n.name].input[k] in stored}


def _float_with(float_path, values, outputs=()):
    """The float model with the initializers ``values`` names holding those values: the
    file's weights put in by hand (the file's Q/DQ pairs, and the Relus its optimization
    deleted, left out: every pair bypassed); ``outputs``: inner tensors it outputs too."""
    model = onnx.load(str(float_path))
    model.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in outputs)
    for init in model.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(np.asarray(values[init.name], np.float32), init.name))
    return model


@pytest.mark.parametrize("name", ["pairs", "lone_pc"])
def test_a_folded_weight_is_restored_behind_a_dequantize_whose_codes_give_its_values_back(folded, name):
    """The copy holds each folded weight as int8 codes, scale and zero point behind a
    DequantizeLinear (per tensor, or per channel along the axis its grid lies on) whose
    output is the file's values to the bit; the user's file is left as it is, and the file
    as deployed (as_given) is that file."""
    q, opt = folded["made"][name]
    expected = folded_from_proto(q, opt)
    before = opt.read_bytes()
    qm = QuantModel(str(opt), float_model=str(folded["float"]))
    assert set(qm.restored) == expected | folded_biases_from_proto(q, opt)  # the biases: see test_folded_more
    stored = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(opt)).graph.initializer}
    for tensor in expected:
        c = qm.calibration[qm.restored[tensor]]
        assert c.q_node is None and c.kind == "weight" and c.outputs == [tensor]
        codes = np.asarray(qm.constant(c.input))
        assert codes.dtype == np.int8 and codes.shape == stored[tensor].shape
        axis = integer_grid(stored[tensor])[0]
        assert c.axis == axis
        shape = [1] * codes.ndim
        if axis is not None:
            shape[axis] = -1
        scale = np.asarray(c.scale, np.float32).reshape(shape if axis is not None else ())
        zero = np.asarray(c.zero_point, np.int32).reshape(shape if axis is not None else ())
        back = (codes.astype(np.int32) - zero).astype(np.float32) * scale  # DequantizeLinear, by hand
        assert np.array_equal(back, stored[tensor])
        assert qm.shown_name(c.input) == tensor  # shown as the file's weight
    assert opt.read_bytes() == before
    given = qm.as_given()
    assert {n.op_type for n in given.graph.node} == {n.op_type for n in onnx.load(str(opt)).graph.node}
    assert {i.name for i in given.graph.initializer} == set(stored)


@pytest.mark.parametrize("name", ["pairs", "lone_pc"])
def test_the_bypass_of_a_restored_weight_is_the_float_model_and_its_quantized_run_the_file(folded, name):
    q, opt = folded["made"][name]
    engine = Engine(str(opt), str(folded["folder"]), float_model=str(folded["float"]))
    for i in range(len(folded["data"]["x"])):
        feeds = {"x": folded["data"]["x"][i]}
        bypassed, quantized = engine.run(i, ())["prob"], engine.run(i, "all")["prob"]
        # the folded int32 biases are restored too: bypassed, the float model's to float32 rounding
        np.testing.assert_allclose(bypassed, builders.run_model(folded["float"], feeds)["prob"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(quantized, builders.run_model(opt, feeds)["prob"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["pairs", "lone_pc"])
def test_the_sensitivity_of_a_restored_weight_is_the_file_with_only_it_quantized(folded, name):
    """Each restored weight (and bias) is ranked: a weight's figure is the pooled cosine between
    the float model and the same with that weight as the file holds it (put in by hand)."""
    q, opt = folded["made"][name]
    engine = Engine(str(opt), str(folded["folder"]), float_model=str(folded["float"]))
    values = _file_values(opt, folded["float"])
    weights = {"w1": "conv1", "w2": "conv2", "wf": "fc"}  # the float model's names, and their readers
    # the logits: the softmax's probabilities move too little for a cosine to tell
    result = get_sensitivity_of_nodes(engine, ["cosine-similarity"], node_type="weight", output_node="logits")
    restored = engine.qmodel.restored
    assert set(result) == set(restored.values()) and len(restored) == 6  # three weights, three biases
    nodes = {n.name: n for n in onnx.load(str(opt)).graph.node}
    feeds = [{"x": x} for x in folded["data"]["x"]]
    reference = [o["logits"] for o in builders.run_model(_float_with(folded["float"], {}, ["logits"]), feeds,
                                                               outputs=["logits"])]
    for fname, reader in weights.items():
        only = builders.run_model(_float_with(folded["float"], {fname: values[fname]}, ["logits"]), feeds,
                                  outputs=["logits"])
        want = builders.pooled_cosine(reference, [o["logits"] for o in only])
        assert want < 1 - 1e-8  # the weight's rounding shows (int8 weights lose little)
        cname = restored[nodes[reader].input[1]]
        got = result[cname]["cosine-similarity"]
        assert abs(got - want) <= 1e-3 * (1 - want), (fname, got, want)  # the loss to 0.1 %


@pytest.mark.parametrize("name", ["pairs", "lone_pc"])
def test_without_the_float_model_weights_on_an_integer_grid_are_a_possibility(folded, name):
    q, opt = folded["made"][name]
    notes = [n for n in QuantModel(str(opt)).notes if POSSIBLY in n]
    assert len(notes) == 1
    assert _named(notes[0], {i.name for i in onnx.load(str(opt)).graph.initializer}) == folded_from_proto(q, opt)


@pytest.mark.parametrize("variant", ["qdq", "qdq_pc", "default", "dq_weights_pc", "int16"])
def test_files_without_folding_get_no_note(zoo, variant):
    for qm in (QuantModel(str(zoo.qdq(variant))), QuantModel(str(zoo.qdq(variant)), float_model=str(zoo.float(variant)))):
        assert not [n for n in qm.notes if FOLDED in n or POSSIBLY in n]
        assert not getattr(qm, "alignment", None) or not qm.alignment.quantized_constants


def test_a_float_weight_left_out_of_quantization_gets_no_note(tmp_path):
    # conv2 excluded: it reads the quantized r1 through its pair, but its float weight is the
    # float model's own (off any grid)
    fp = builders.conv_net(tmp_path / "float.onnx")
    q = builders.quantize(fp, tmp_path / "q.onnx", builders.samples(4), nodes_to_exclude=["conv2"])
    for qm in (QuantModel(str(q)), QuantModel(str(q), float_model=str(fp))):
        assert [t for n, _, t in qm.unpaired_weights()] == ["w2"]
        assert not [n for n in qm.notes if FOLDED in n or POSSIBLY in n]


@pytest.mark.parametrize("qtype,axis", [(onnx.TensorProto.INT8, None), (onnx.TensorProto.INT8, 0),
                                        (onnx.TensorProto.UINT8, 0), (onnx.TensorProto.INT4, 1)])
def test_integer_grid_finds_a_dequantized_weight_and_nothing_in_float_ones(qtype, axis):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((6, 5, 3, 3)) * 0.2).astype(np.float32)
    grid = GRIDS[qtype]
    channels = 1 if axis is None else w.shape[axis]
    lo, hi = w.min(), w.max()
    scale = (rng.uniform(0.5, 1.5, channels) * (hi - lo) / (grid.qmax - grid.qmin)).astype(np.float32)
    zero = np.zeros(channels) if grid.signed else np.full(channels, 128.0)
    q = fake_quant(w, grid, scale, zero, axis=axis)
    found = integer_grid(q)
    assert found is not None and found[0] == axis
    picked, steps = found[1], found[2]
    np.testing.assert_allclose(steps, scale[[0 if k is None else k for k in picked]], rtol=1e-5)
    for _ in range(50):
        assert integer_grid(rng.standard_normal((6, 5, 3, 3)).astype(np.float32)) is None


def test_a_hand_made_kernel_left_out_of_quantization_gets_no_note(tmp_path):
    # a 9 x 9 mean filter (0 and +-1/81) lies on an integer grid, but a kernel of three values
    # is no sign of a quantized weight
    fp = builders.side_net(tmp_path / "float.onnx")
    q = builders.quantize(fp, tmp_path / "q.onnx", builders.samples(4), nodes_to_exclude=["conv_side"])
    qm = QuantModel(str(q))
    assert [t for n, _, t in qm.unpaired_weights()] == ["ws"]
    assert integer_grid(qm.constant("ws")) is not None
    assert not [n for n in qm.notes if POSSIBLY in n]


def test_integer_grid_of_a_large_weight_reads_a_sample_of_it(monkeypatch):
    """Every float weight read without a pair is looked at when a file is loaded (a layer left
    out of quantization among quantized ones): a grid is found from a few slices and a spread
    sample, never by sorting the whole weight (2.4 s for twelve 2048 x 2048 MatMul weights,
    where the load took 0.02 s). Steps read against the scales the weight was quantized with."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((1024, 2048)) * 0.1).astype(np.float32)
    grid = GRIDS[onnx.TensorProto.INT8]
    scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    q = fake_quant(w, grid, scale, np.zeros(w.shape[1]), axis=1)
    sorted_sizes = []
    unique = np.unique

    def counted(a, *args, **kwargs):
        sorted_sizes.append(np.size(a))
        return unique(a, *args, **kwargs)

    monkeypatch.setattr(np, "unique", counted)
    found = integer_grid(q)
    assert found is not None and found[0] == 1
    np.testing.assert_allclose(found[2], scale[found[1]], rtol=1e-5)
    assert integer_grid(w) is None
    assert max(sorted_sizes) <= 1 << 16, max(sorted_sizes)


@pytest.mark.parametrize("qtype,axis,zero", [(onnx.TensorProto.INT8, None, 0), (onnx.TensorProto.INT8, 0, 0),
                                             (onnx.TensorProto.UINT8, 0, 128), (onnx.TensorProto.UINT8, None, 30),
                                             (onnx.TensorProto.INT4, 1, 0)])
def test_stored_codes_give_a_dequantized_weight_back_bit_for_bit(qtype, axis, zero):
    """int8 codes, float32 steps and int8 zero points whose DequantizeLinear (computed in
    numpy here) is the dequantized weight exactly; a uint8 grid whose zero point leaves its
    codes past int8's range (30: codes -30..225) is shifted into it."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((6, 5, 3, 3)) * 0.2 + (0.3 if zero == 30 else 0)).astype(np.float32)
    grid = GRIDS[qtype]
    channels = 1 if axis is None else w.shape[axis]
    scale = (rng.uniform(0.8, 1.2, channels) * np.abs(w).max() * 2 / (grid.qmax - grid.qmin)).astype(np.float32)
    q = fake_quant(w, grid, scale, np.full(channels, float(zero)), axis=axis)
    found = integer_grid(q)
    assert found is not None and found[0] == axis
    codes, steps, zeros = grids.stored_codes(q, axis)
    assert codes.dtype == np.int8 and zeros.dtype == np.int8 and steps.dtype == np.float32
    shape = [1] * q.ndim if axis is not None else []
    if axis is not None:
        shape[axis] = -1
    back = (codes.astype(np.int32) - zeros.astype(np.int32).reshape(shape)).astype(np.float32) * steps.reshape(shape)
    assert np.array_equal(back, q)
    if zero == 30:
        assert int(zeros) != 0  # shifted into int8's range
    assert grids.stored_codes(rng.standard_normal((6, 5, 3, 3)).astype(np.float32), axis) is None

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

import builders
from pytest_ptq.engine.core import Engine
from pytest_ptq.model import QuantModel
from pytest_ptq.model.grids import GRIDS, fake_quant, integer_grid

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
    expected = folded_from_proto(q, opt)
    assert len(expected) == 3  # both convs' and the Gemm's
    qm = QuantModel(str(opt), float_model=str(folded["float"]))
    notes = [n for n in qm.notes if FOLDED in n]
    assert len(notes) == 1
    every_init = {i.name for i in onnx.load(str(opt)).graph.initializer}
    assert _named(notes[0], every_init) == expected  # exactly those, no bias or scale
    assert set(qm.alignment.quantized_constants) == expected
    # what the note says: bypassing every pair leaves them quantized, so the bypassed file
    # (every pair removed) is not the float model
    feeds = {"x": folded["data"]["x"][0]}
    bypassed = builders.run_model(builders.rewire(opt), feeds)["prob"]
    reference = builders.run_model(folded["float"], feeds)["prob"]
    assert np.abs(bypassed - reference).max() > 1e-4
    # and every face hears it: the engine's warnings are what the CLI, the plugin and
    # contracts print
    engine = Engine(str(opt), str(folded["folder"]), float_model=str(folded["float"]))
    assert notes[0] in engine.warnings


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

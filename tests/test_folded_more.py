"""Folded weights beyond onnxruntime's own optimized files: a weight's and a bias's
DequantizeLinear folded by hand (numpy) into float initializers, as other producers'
constant folding leaves them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import builders
from pytest_ptq.engine.core import Engine
from pytest_ptq.model import QuantModel


def fold_constant_dqs(qpath, out):
    """``qpath`` with each DequantizeLinear of a constant (the weights' int8 codes and the
    biases' int32 ones) computed in numpy into a float32 initializer under its output's name,
    the DQ node and its inputs left out; returns ``{folded tensor: its codes' type}``."""
    model = onnx.load(str(qpath))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    folded, kept = {}, []
    for n in graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            codes = numpy_helper.to_array(inits[n.input[0]])
            scale = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
            zero = numpy_helper.to_array(inits[n.input[2]]) if len(n.input) > 2 and n.input[2] else np.zeros_like(scale)
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
            shape = [1] * codes.ndim
            if scale.size > 1:
                shape[axis] = -1
            value = (codes.astype(np.int64) - zero.astype(np.int64).reshape(shape or ())).astype(np.float32)
            value = value * scale.reshape(shape or ())
            graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), n.output[0]))
            folded[n.output[0]] = inits[n.input[0]].data_type
        else:
            kept.append(n)
    del graph.node[:]
    graph.node.extend(kept)
    read = {i for n in graph.node for i in n.input}
    left = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(left)
    onnx.save(model, str(out))
    return folded


@pytest.fixture(scope="module", params=[False, True], ids=["per_tensor", "per_channel"])
def hand_folded(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("hand_folded")
    fp = builders.conv_net(root / "float.onnx")
    data = builders.samples(3)
    q = builders.quantize(fp, root / "q.onnx", data, keep_float=False, per_channel=request.param)
    opt = root / "folded.onnx"
    types = fold_constant_dqs(q, opt)
    return {"float": fp, "data": data, "folder": builders.save_folder(data, root / "calib"), "file": opt,
            "biases": {t for t, dtype in types.items() if dtype == onnx.TensorProto.INT32}}


def test_a_folded_int32_bias_is_restored_so_the_bypass_runs_the_float_model(hand_folded):
    """A Conv/Gemm bias quantized to int32 on input scale * weight scale and folded into float
    is put back behind a DequantizeLinear of its own: bypassing every pair gives the float
    model's output to float32 rounding, not the int32-rounded biases' (~1e-5 away)."""
    assert len(hand_folded["biases"]) == 3  # both convs' and the Gemm's
    engine = Engine(str(hand_folded["file"]), str(hand_folded["folder"]), float_model=str(hand_folded["float"]))
    assert hand_folded["biases"] <= set(engine.qmodel.restored)
    for i, x in enumerate(hand_folded["data"]["x"]):
        feeds = {"x": x}
        np.testing.assert_allclose(engine.run(i, ())["prob"], builders.run_model(hand_folded["float"], feeds)["prob"],
                                   rtol=0, atol=1e-6)
        np.testing.assert_allclose(engine.run(i, "all")["prob"], builders.run_model(hand_folded["file"], feeds)["prob"],
                                   rtol=0, atol=1e-6)


def test_a_restored_bias_gives_the_file_values_back_bit_for_bit(hand_folded):
    """Its int32 codes, times the scale its DequantizeLinear holds (zero point 0), are the
    file's float bias exactly; the scale is the reader's input scale times its weight's."""
    qm = QuantModel(str(hand_folded["file"]), float_model=str(hand_folded["float"]))
    stored = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(hand_folded["file"])).graph.initializer}
    for tensor in hand_folded["biases"]:
        c = qm.calibration[qm.restored[tensor]]
        codes = np.asarray(qm.constant(c.input))
        assert codes.dtype == np.int32 and c.role == "bias"
        assert not np.any(np.asarray(c.zero_point))
        back = codes.astype(np.float32) * np.asarray(c.scale, np.float32)
        assert np.array_equal(back, stored[tensor])


def test_a_per_channel_folded_weight_below_opset_13_keeps_its_note_saying_why(tmp_path):
    """DequantizeLinear takes an axis only from opset 13: a per-channel weight folded into a
    file at opset 11 cannot be put back, and the note that it stays quantized says so."""
    fp = builders.conv_net(tmp_path / "float.onnx")
    q = builders.quantize(fp, tmp_path / "q.onnx", builders.samples(3), keep_float=False, per_channel=True)
    types = fold_constant_dqs(q, tmp_path / "folded.onnx")
    model = onnx.load(str(tmp_path / "folded.onnx"))
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = 11
    onnx.save(model, str(tmp_path / "old.onnx"))
    qm = QuantModel(str(tmp_path / "old.onnx"), float_model=str(fp))
    weights = {t for t, dtype in types.items() if dtype == onnx.TensorProto.INT8}
    assert not set(qm.restored) & weights
    note = next(n for n in qm.notes if "no pair is left to bypass" in n)
    per_channel = sorted(t for t in weights if qm.alignment.quantized_axes.get(t) is not None)
    assert per_channel
    why = "its grid is per channel and DequantizeLinear takes an axis only from opset 13 (the file is at opset 11)"
    reasons = note[note.index("(not restored behind a DequantizeLinear: ") + 41:]
    assert all(repr(t) in reasons.split(why)[0] for t in per_channel)


def test_a_weight_whose_search_overflows_loads_without_a_numpy_warning(tmp_path):
    """A subnormal value beside large ones overflowed the grid search's division: numpy's
    RuntimeWarning stopped a run under filterwarnings = error. Such a weight lies on no grid
    its codes give back, and is read as float, quietly."""
    import warnings

    from pytest_ptq.model import grids

    w = np.array([[1e-38, 3e38, 1.0], [1.0, -2.0, 3.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert grids.stored_codes(w, axis=0) is None
        assert grids.integer_grid(w) is None
        # the rows that do lie on a grid are still found: the second row alone, step 1
        codes, step, zero = grids.stored_codes(w[1:], axis=0)
    assert np.array_equal((codes.astype(np.float32) - zero[:, None]) * step[:, None], w[1:])

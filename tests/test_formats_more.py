"""Leftovers of the format rewrite and of moved pairs: codes a Gather moves in a type the file
cannot hold there, and Transposes without perm beside per-channel pairs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError
from pytest_ptq.model import QuantModel


def _gathered_table(path, data_type):
    """A QDQ file: an embedding table [20, 8] stored as codes of ``data_type`` (a scalar scale,
    no zero point) -> Gather(ids [1, 5]) -> DequantizeLinear -> activation pair -> MatMul.
    Returns the samples."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((20, 8)).astype(np.float32)
    s = np.float32(np.abs(table).max() / 7)
    codes = np.clip(np.round(table / s), -8, 7).astype(np.int8)
    inits = [helper.make_tensor("codes", data_type, codes.shape, codes.ravel().tolist()),
             numpy_helper.from_array(np.asarray(s), "s"),
             numpy_helper.from_array((rng.standard_normal((8, 4)) * 0.5).astype(np.float32), "w")]
    nodes = [helper.make_node("Gather", ["codes", "ids"], ["g"], name="gather"),
             helper.make_node("DequantizeLinear", ["g", "s"], ["e"], name="table_DQ")]
    e = builders.add_pair(inits, nodes, "e", np.abs(table).max() / 127, np.int8(0))
    nodes.append(helper.make_node("MatMul", [e, "w"], ["y"], name="mm"))
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(path))
    return {"ids": [rng.integers(0, 20, (1, 5)).astype(np.int64) for _ in range(2)]}


def test_int4_codes_a_gather_moves_are_refused_as_onnxruntime_refuses_the_file(tmp_path):
    """int4 table -> Gather -> DequantizeLinear: onnxruntime refuses the file (Gather takes no
    int4), yet the tool dequantized the codes before the Gather and analysed a graph no runtime
    loads. Now one sentence naming the Gather and what the export should do; the same file
    with int8 codes, which onnxruntime runs, is analysed as before."""
    path = tmp_path / "q4.onnx"
    samples = _gathered_table(path, TensorProto.INT4)
    with pytest.raises(Exception, match="Gather"):  # onnxruntime's own verdict on the file
        builders.run_model(path, {"ids": samples["ids"][0]})
    with pytest.raises(PTQError) as info:
        Engine(str(path), samples)
    said = str(info.value)
    assert "\n" not in said
    assert said.startswith(f"Gather node 'gather' of {str(path)!r} reads the int4 codes 'codes'")
    assert "onnxruntime refuses it too" in said and "store those codes as int8 or uint8" in said
    ok = tmp_path / "q8.onnx"
    samples = _gathered_table(ok, TensorProto.INT8)
    builders.run_model(ok, {"ids": samples["ids"][0]})  # onnxruntime runs it
    assert "table_DQ" in Engine(str(ok), samples).qmodel.calibration


def _reversed_activation(path):
    """Relu(a [8, 4]) -> Transpose without perm -> QuantizeLinear / DequantizeLinear per channel
    (axis 1, 8 scales) -> MatMul M [8, 3], in the file's own layout (nothing between Q and
    DQ). Returns the float computation of a feed."""
    rng = np.random.default_rng(0)
    m = (rng.standard_normal((8, 3)) * 0.5).astype(np.float32)
    s = np.linspace(0.01, 0.05, 8, dtype=np.float32)
    nodes = [helper.make_node("Relu", ["a"], ["r"], name="relu"), helper.make_node("Transpose", ["r"], ["t"], name="T"),
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["q"], name="Q", axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="DQ", axis=1),
             helper.make_node("MatMul", ["d", "M"], ["y"], name="mm")]
    inits = [numpy_helper.from_array(s, "s"), numpy_helper.from_array(np.zeros(8, np.int8), "z"),
             numpy_helper.from_array(m, "M")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [8, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return lambda a: np.maximum(a, 0).T.astype(np.float64) @ m.astype(np.float64)


def test_a_transpose_without_perm_beside_a_per_channel_pair_gets_its_perm_where_its_rank_is_known(tmp_path):
    """onnxruntime 1.28 aborted the whole process (SIGABRT, no exception) loading this graph,
    the file itself or any segment of it: a Transpose without perm of known rank before a
    per-channel pair of the user's own graph (measured in a subprocess: rc 134; none where the
    rank is unknown). Only Transposes the tool moved got their perm written; now every one whose
    rank the file declares or onnx infers does, in the tool's copy, which runs as the file."""
    path = tmp_path / "t.onnx"
    floats = _reversed_activation(path)
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
    rank = next(len(v.type.tensor_type.shape.dim) for v in inferred.value_info if v.name == "r")
    feeds = [np.random.default_rng(k).standard_normal((8, 4)).astype(np.float32) for k in range(3)]
    engine = Engine(str(path), {"a": feeds})
    [t] = [n for n in engine.qmodel.model.graph.node if n.op_type == "Transpose"]
    assert [list(a.ints) for a in t.attribute if a.name == "perm"] == [list(range(rank))[::-1]]
    for i, a in enumerate(feeds):
        given = builders.run_model(path, {"a": a})["y"]
        np.testing.assert_allclose(engine.run(i, "all")["y"], given, rtol=0, atol=1e-6)
        np.testing.assert_allclose(engine.run(i, ())["y"], floats(a), rtol=0, atol=1e-5)
        assert np.abs(given - floats(a)).max() > 1e-3

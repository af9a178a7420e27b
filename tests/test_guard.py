"""What a run reads and never writes (pytest_ptq.guard): a model's external data files, read
without its weights."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import json_format
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from pytest_ptq import guard


def _model(rng, width=8):
    """Tensors in every place onnx lists external data from: the graph's initializers, a
    Constant's value, an If branch's initializer and a local function's Constant."""
    w = numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "w")
    branch = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y_then"])], "then", [],
                               [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, [1, width])],
                               [numpy_helper.from_array(rng.standard_normal((1, width)).astype(np.float32), "b")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["y_else"])], "else", [],
                              [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, [1, width])])
    k = numpy_helper.from_array(rng.standard_normal((1, width)).astype(np.float32), "k")
    fk = numpy_helper.from_array(rng.standard_normal((1, width)).astype(np.float32), "fk")
    fn = helper.make_function("local", "Scale", ["a"], ["o"],
                              [helper.make_node("Constant", [], ["c"], value=fk), helper.make_node("Mul", ["a", "c"], ["o"])],
                              [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Constant", [], ["k"], value=k),
             helper.make_node("Add", ["m", "k"], ["a"]), helper.make_node("Scale", ["a"], ["s"], domain="local"),
             helper.make_node("ReduceSum", ["s"], ["r"], keepdims=0),
             helper.make_node("Greater", ["r", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
                              [w, numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                             functions=[fn])


def _external_model(folder, rng):
    model = _model(rng)
    # a file a tensor, attribute tensors too: every place gets its own name to be listed by
    external_data_helper.convert_model_to_external_data(model, all_tensors_to_one_file=False, size_threshold=0,
                                                        convert_attribute=True)
    path = folder / "m.onnx"
    onnx.save(model, str(path))
    return path


def _listed_by_onnx(path):
    """The external data files onnx itself reads the model's tensors from, in its order."""
    model = onnx.load(str(path), load_external_data=False)
    out = []
    for t in external_data_helper._get_all_tensors(model):
        if external_data_helper.uses_external_data(t):
            out.append(Path(path).parent.resolve() / dict((e.key, e.value) for e in t.external_data)["location"])
    return list(dict.fromkeys(out))


def test_external_data_files_are_those_onnx_reads(tmp_path):
    path = _external_model(tmp_path, np.random.default_rng(0))
    expected = _listed_by_onnx(path)
    assert len(expected) == 5  # w, zero, b (in the If branch), k (a Constant), fk (the function's Constant)
    # the same files (the order of onnx's own listing changed between onnx 1.19 and 1.23)
    assert sorted(guard.external_data_files(path)) == sorted(expected)


def test_a_text_model_lists_its_external_data_too(tmp_path):
    binary = _external_model(tmp_path, np.random.default_rng(1))
    text = tmp_path / "m.json"
    text.write_text(json_format.MessageToJson(onnx.load(str(binary), load_external_data=False)))
    assert guard.external_data_files(text) == _listed_by_onnx(binary)


def test_inline_weights_are_not_read_to_list_none(tmp_path):
    """Listing a model's external data files read the whole file and parsed it: a model of
    192 MiB inline weights cost 424 MiB for an empty list."""
    model = _model(np.random.default_rng(2), width=1024)  # 4 MiB of inline weights
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert _listed_by_onnx(path) == []
    tracemalloc.start()
    try:
        assert guard.external_data_files(path) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < path.stat().st_size / 8, peak


@pytest.mark.parametrize("content", [b"", b"\x08", b"not a model at all"])
def test_a_file_that_holds_no_model_names_no_external_data(tmp_path, content):
    path = tmp_path / "m.onnx"
    path.write_bytes(content)
    assert guard.external_data_files(path) == []

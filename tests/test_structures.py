"""Model structures beyond a plain main graph: old IR versions, local functions, a pair read by a
model output beside a Relu, a subgraph reading a tensor a quantizer renamed. Each ranking is
checked against brute-force rewired models in plain onnxruntime sessions."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq.distribution import plot_distribution
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

N = 4


def _brute_force(qpath, feeds, names):
    """Worst output's pooled cosine with only ``names[k]`` quantized, against every pair bypassed."""
    def rewired(keep=()):
        model = builders.rewire(qpath, keep=keep)
        # onnxruntime refuses an IR 3 file holding an initializer nothing reads (a bypassed scale)
        model.ir_version = max(model.ir_version, 4)
        return model

    base = builders.run_model(rewired(), feeds)
    return {n: builders.worst_cosine(base, builders.run_model(rewired((n,)), feeds)) for n in names}


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": [rng.standard_normal(shape).astype(np.float32) for _ in range(N)]}


def test_an_ir3_model_is_ranked_like_any_other_and_its_file_left_as_it_is(tmp_path):
    # IR 3 lists initializers as graph inputs; onnxruntime then finds no scale an If branch
    # (the engine's gate) reads from the outer scope, and the activation ranking was refused
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.4).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Sigmoid", ["c"], ["y"], name="sig")], "ir3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
         helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    onnx.save(model, str(tmp_path / "f.onnx"))
    data = _data((1, 3, 8, 8))
    qpath = builders.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", data)
    assert onnx.load(str(qpath)).ir_version == 3
    before = _digest(qpath)
    ranking = get_sensitivity_of_nodes(Engine(str(qpath), data), node_type="activation")
    assert len(ranking) >= 2
    feeds = [{"x": x} for x in data["x"]]
    for name, value in _brute_force(qpath, feeds, list(ranking)).items():
        assert ranking[name]["cosine-similarity"] == pytest.approx(value, abs=1e-5), name
    assert _digest(qpath) == before


def _function_model(tmp_path):
    """x -> Q/DQ -> Block(x, W) -> Q/DQ -> MatMul(W2) -> y, where the local function Block
    quantizes its own weight (a Q/DQ pair inside the body) before its MatMul and Tanh."""
    rng = np.random.default_rng(2)
    body = [helper.make_node("Constant", [], ["ws"], value=numpy_helper.from_array(np.array(0.01, np.float32))),
            helper.make_node("Constant", [], ["wz"], value=numpy_helper.from_array(np.array(0, np.int8))),
            helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="fw_Q"),
            helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wdq"], name="fw_DQ"),
            helper.make_node("MatMul", ["a", "wdq"], ["m"], name="f_mm"),
            helper.make_node("Tanh", ["m"], ["o"], name="f_tanh")]
    function = helper.make_function("local", "Block", ["a", "w"], ["o"], body,
                                    opset_imports=[helper.make_opsetid("", 17)])
    inits, nodes = [], []

    def pair(t, scale, zero):
        return builders.add_pair(inits, nodes, t, scale, zero)

    pair("x", 0.03, np.uint8(128))
    nodes.append(helper.make_node("Block", ["x_dq", "W"], ["h"], name="blk", domain="local"))
    pair("h", 1 / 127, np.uint8(128))
    pair("W2", 0.02, np.int8(0))
    nodes.append(helper.make_node("MatMul", ["h_dq", "W2_dq"], ["y"], name="mm2"))
    inits += [numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.5).astype(np.float32), "W"),
              numpy_helper.from_array((rng.standard_normal((8, 4)) * 0.5).astype(np.float32), "W2")]
    graph = helper.make_graph(nodes, "fnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 17),
                                                                          helper.make_opsetid("local", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "q.onnx"))
    return tmp_path / "q.onnx"


def test_a_local_functions_pairs_are_ranked_with_the_main_graphs(tmp_path):
    # a call of a local function was read as a custom op, and the model refused with advice
    # to register a library that does not exist
    qpath = _function_model(tmp_path)
    before = _digest(qpath)
    data = _data((2, 8), seed=1)
    engine = Engine(str(qpath), data)
    weights = get_sensitivity_of_nodes(engine, node_type="weight")
    assert any(n.startswith("fw_Q") for n in weights)  # the pair inside the body, inlined
    # the reference: onnx's inliner, then brute force on that file in plain onnxruntime
    inlined = tmp_path / "inlined.onnx"
    onnx.save(onnx.inliner.inline_local_functions(onnx.load(str(qpath))), str(inlined))
    feeds = [{"x": x} for x in data["x"]]
    for node_type in ("weight", "activation"):
        ranking = get_sensitivity_of_nodes(engine, node_type=node_type)
        for name, value in _brute_force(inlined, feeds, list(ranking)).items():
            assert ranking[name]["cosine-similarity"] == pytest.approx(value, abs=1e-5), name
    assert _digest(qpath) == before and onnx.load(str(qpath)).functions


def test_a_pair_a_model_output_reads_beside_a_relu_clips_what_that_output_loses(tmp_path):
    # quantize_static gives m1's pair the Relu's range; the model output m1 loses every
    # negative value, which the distribution called harmless since "a Relu follows"
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m1"], name="mm"), helper.make_node("Relu", ["m1"], ["y"], name="relu")],
        "relu_out", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
         helper.make_tensor_value_info("m1", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "f.onnx"))
    data = _data((4, 8))
    qpath = builders.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", data)
    engine = Engine(str(qpath), data)
    pair = next(c for c in engine.qmodel.calibration.values() if c.kind == "activation" and "m1" in c.outputs)
    d = plot_distribution(tmp_path / "plots", engine, nodes_list=[pair.name])[pair.name]
    negatives = np.mean(np.concatenate([x @ numpy_helper.to_array(graph.initializer[0]) for x in data["x"]]) < 0)
    assert d["relu_follows"] is False
    assert d["effective_clipped_share"] == pytest.approx(negatives, abs=0.02) and negatives > 0.3


def test_a_subgraph_reading_the_output_of_a_folded_op_names_the_node_that_now_writes_another(tmp_path):
    # quantize_static folds the Relu after mm1 by renaming mm1's output; the Loop's body still
    # reads mm1's old output. mm1 is in the file, so "the quantizer removed that node" was untrue
    rng = np.random.default_rng(1)
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "h"], ["s_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("s_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["hr"], name="relu"),
         helper.make_node("Loop", ["trip", "go", "hr"], ["s"], name="loop", body=body),
         helper.make_node("Mul", ["s", "hr"], ["y"], name="mul")], "loopnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.5).astype(np.float32), "W"),
         numpy_helper.from_array(np.array(3, np.int64), "trip"), numpy_helper.from_array(np.array(True), "go")])
    fpath = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(fpath))
    data = _data((2, 8))
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data, keep_float=False)
    if any(n.name == "relu" for n in onnx.load(str(qpath)).graph.node):
        pytest.skip("this onnxruntime keeps the Relu")
    with pytest.raises(PTQError) as info:
        Engine(str(qpath), data, float_model=str(fpath))
    said = str(info.value)
    assert "the float model's MatMul 'mm1' writes it; here it writes 'hr' instead" in said
    assert "removed" not in said


def test_repeated_node_names_are_told_apart_and_said_so(tmp_path):
    # onnxruntime refuses such a file; the analyses ran on their renamed copy without a word
    data = _data((1, 3, 8, 8))
    qpath = builders.quantize(builders.conv_net(tmp_path / "f.onnx", size=8), tmp_path / "q.onnx",
                              {"x": data["x"]})
    model = onnx.load(str(qpath))
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    for n in convs:
        n.name = "blk"
    onnx.save(model, str(tmp_path / "dup.onnx"))
    with pytest.raises(Exception, match="two nodes with same node name"):
        builders.run_model(tmp_path / "dup.onnx", {"x": data["x"][0]})
    qm = Engine(str(tmp_path / "dup.onnx"), data).qmodel
    assert [n for n in qm.normal if n.startswith("blk")] == ["blk"] + [f"blk__{k}" for k in range(1, len(convs))]
    assert any(f"node names repeat in the file ('blk' {len(convs)} times)" in note and "refuses" in note
               for note in qm.notes)
    assert "blk__1" in qm.unnamed  # no quantizer's option can name it apart


def test_suffixed_names_never_meet_a_name_the_file_has():
    from pytest_ptq.model.graph import name_nodes

    graph = helper.make_graph([helper.make_node("Relu", ["a"], ["b"], name=n) for n in ("A", "A", "A__1", "A", "")],
                              "g", [], [])
    unnamed, repeated = name_nodes(graph)
    names = [n.name for n in graph.node]
    assert unnamed == {"Relu_0"} and repeated == {names[1], names[3]}
    assert len(set(names)) == 5 and names[0] == "A" and names[2] == "A__1"  # the file's names stay


def _orphan_pairs_model(tmp_path, passthrough=False):
    """x -> Q/DQ -> Conv(W Q/DQ) -> coarse Q/DQ -> fine Q/DQ -> Conv(W Q/DQ) -> y, beside a
    second input u -> Q/DQ -> model output u_out: the coarse pair and u's are read by no
    operator (the fine pair's Q reads one; u's DQ writes a model output)."""
    rng = np.random.default_rng(5)
    inits, nodes = [], []

    def pair(t, scale, zero, name):
        return builders.add_pair(inits, nodes, t, scale, zero, name, "u_out" if name == "u" else None)

    inits.append(numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W"))
    w = pair("W", 0.01, np.int8(0), "w")
    nodes.append(helper.make_node("Conv", [pair("x", 0.03, np.uint8(128), "x"), w], ["c"], pads=[1, 1, 1, 1],
                                  name="conv0"))
    fine = pair(pair("c", 1.5, np.int8(0), "coarse"), 0.05, np.int8(0), "fine")
    nodes.append(helper.make_node("Conv", [fine, w], ["y"], pads=[1, 1, 1, 1], name="conv1"))
    pair("u", 0.25, np.int8(0), "u")
    graph = helper.make_graph(nodes, "orphans", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                                                 helper.make_tensor_value_info("u", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("u_out", TensorProto.FLOAT, [1, 4])], inits)
    if passthrough:  # the graph input x is a model output too, as it is
        graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "q.onnx"))
    data = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(N)],
            "u": [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(N)]}
    return tmp_path / "q.onnx", data


def test_every_pair_counts_in_the_operator_ranking(tmp_path):
    # the first pair of a requantize chain and a pair from a graph input straight to an output
    # were in no operator's config: the default (operator) ranking and nodes check never saw
    # u's pair cost 0.99, which the activation ranking named
    qpath, data = _orphan_pairs_model(tmp_path)
    engine = Engine(str(qpath), data, optimization="disable")  # the chain as written, not merged
    ranking = get_sensitivity_of_nodes(engine, node_type="node")
    pairs = set(builders.qdq_pairs(qpath))
    held = {c for n in ranking for c in ranking.details[n]["calibration_nodes"]}
    assert held == pairs
    assert {"coarse_Q", "fine_Q", "w_Q"} == set(ranking.details["conv1"]["calibration_nodes"])
    assert ranking.details["u_Q"]["op_type"] == "Q/DQ" and "ranked on its own" in ranking.table()
    feeds = [{"x": x, "u": u} for x, u in zip(data["x"], data["u"])]
    base = builders.run_model(builders.rewire(qpath), feeds)
    for name in ranking:
        alone = builders.run_model(builders.rewire(qpath, keep=ranking.details[name]["calibration_nodes"]), feeds)
        assert ranking[name]["cosine-similarity"] == pytest.approx(builders.worst_cosine(base, alone), abs=1e-6), name
    assert ranking["u_Q"]["cosine-similarity"] < 0.999
    activations = get_sensitivity_of_nodes(engine, node_type="activation")
    assert ranking["u_Q"]["cosine-similarity"] == pytest.approx(activations["u_Q"]["cosine-similarity"], abs=1e-9)


def test_a_pair_no_operator_reads_is_diagnosed_as_its_own_row(tmp_path):
    # ranked on its own, it ended the diagnosis (KeyError) that names it the worst
    from pytest_ptq.diagnosis import diagnose
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.verdict import three_configs

    qpath, data = _orphan_pairs_model(tmp_path)
    engine = Engine(str(qpath), data, optimization="disable")
    ranking = get_sensitivity_of_nodes(engine, node_type="node")
    diag = diagnose(engine, ranking, three_configs(engine, parse_outputs(None, engine)), top=3)
    row = next(it for it in diag.nodes if it["node"] == "u_Q")
    assert row["op_type"] == "Q/DQ" and row["chosen"] == ["u_Q"]
    assert row["cosine-similarity"] == ranking["u_Q"]["cosine-similarity"]


def test_runall_says_why_a_pair_no_operator_reads_has_no_node_error(tmp_path):
    from pytest_ptq.runall import runall

    qpath, data = _orphan_pairs_model(tmp_path)
    s = runall(str(qpath), data, save_dir=tmp_path / "out", top=3, node_type=["node", "activation"], progress=False)
    rows = [line for line in (tmp_path / "out" / "summary.md").read_text().splitlines() if "| `u_Q` |" in line]
    assert len(rows) == 2 and all("`u` straight to a model output" in r for r in rows), rows
    assert "ranked on its own" in rows[0]
    assert {it["origin"] for it in s["verdict"]["nodes"] if it["node"] == "u_Q"} == {"unowned"}


def test_the_curves_say_why_an_output_no_operator_computes_has_no_point(tmp_path, capsys):
    # the rankings list x and u_out among their outputs; the curves left them out in silence
    from pytest_ptq.cli import main

    qpath, data = _orphan_pairs_model(tmp_path, passthrough=True)
    builders.save_folder(data, tmp_path / "calib")
    assert main(["plot-acc-error", str(qpath), str(tmp_path / "calib"), "-s", str(tmp_path / "c"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "at the output y " in out
    assert "no point for output 'x': a graph input passed straight through, the same in every config" in out
    assert "no point for output 'u_out': written by pair 'u_Q' on 'u'" in out
    ranking = get_sensitivity_of_nodes(Engine(str(qpath), data, optimization="disable"))
    assert {"x", "u_out", "y"} <= set(ranking.outputs)


def test_runall_names_every_node_a_shared_weight_feeds(tmp_path):
    # "error of the node it feeds" named only the first of the two Convs reading the weight
    from pytest_ptq.runall import runall

    rng = np.random.default_rng(6)
    inits, nodes = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W")], []

    def pair(t, scale, zero):
        return builders.add_pair(inits, nodes, t, scale, zero)

    w = pair("W", 0.02, np.int8(0))
    nodes.append(helper.make_node("Conv", [pair("x", 0.03, np.uint8(128)), w], ["a"], pads=[1] * 4, name="convA"))
    nodes.append(helper.make_node("Conv", [pair("a", 0.05, np.int8(0)), w], ["y"], pads=[1] * 4, name="convB"))
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "q.onnx"))
    data = _data((1, 4, 8, 8), seed=6)
    s = runall(str(tmp_path / "q.onnx"), data, save_dir=tmp_path / "out", top=3, progress=False)
    item = next(it for it in s["verdict"]["nodes"] if it["node"] == "W_Q")
    assert item["at"] == "convA" and [a["at"] for a in item["also"]] == ["convB"]
    row = next(line for line in (tmp_path / "out" / "summary.md").read_text().splitlines() if "| `W_Q` |" in line)
    assert " at `convA` (" in row and " at `convB` (" in row
    # convB's fully quantized figure: its output with every pair quantized against float, by hand
    feeds = [{"x": x} for x in data["x"]]
    every = set(builders.qdq_pairs(tmp_path / "q.onnx"))
    ref = builders.run_model(builders.rewire(tmp_path / "q.onnx", outputs=["a"]), feeds)
    full = builders.run_model(builders.rewire(tmp_path / "q.onnx", keep=every, outputs=["a"]), feeds)
    assert item["accumulated"] == pytest.approx(builders.pooled_cosine([o["a"] for o in ref], [o["a"] for o in full]),
                                                abs=1e-6)
    assert item["also"][0]["accumulated"] == pytest.approx(builders.worst_cosine(
        [{"y": o["y"]} for o in ref], [{"y": o["y"]} for o in full]), abs=1e-6)


def test_a_pair_on_an_output_that_a_shape_also_reads_counts_for_its_producer(tmp_path):
    # the Shape counted as the pair's reader, and the operator ranking skips Shapes: the output
    # pair was in no row, so the default nodes check never saw its loss
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W")]
    nodes = []
    w = builders.add_pair(inits, nodes, "W", 0.01, np.int8(0))
    nodes.append(helper.make_node("Conv", [builders.add_pair(inits, nodes, "x", 0.03, np.uint8(128)), w], ["c"],
                                  pads=[1, 1, 1, 1], name="conv"))
    builders.add_pair(inits, nodes, "c", 0.4, np.int8(0), out="y")
    nodes.append(helper.make_node("Shape", ["y"], ["s"], name="shape"))
    graph = helper.make_graph(nodes, "shaped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "q.onnx"))
    data = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(N)]}
    ranking = get_sensitivity_of_nodes(Engine(str(tmp_path / "q.onnx"), data, optimization="disable"),
                                       node_type="node")
    pairs = set(builders.qdq_pairs(tmp_path / "q.onnx"))
    assert set(ranking.details["conv"]["calibration_nodes"]) == pairs
    assert list(ranking) == ["conv"]
    feeds = [{"x": a} for a in data["x"]]
    base = builders.run_model(builders.rewire(tmp_path / "q.onnx"), feeds, outputs=["y"])
    quantized = builders.run_model(builders.rewire(tmp_path / "q.onnx", keep=pairs), feeds, outputs=["y"])
    expected = builders.worst_cosine(base, quantized)
    assert ranking["conv"]["cosine-similarity"] == pytest.approx(expected, abs=1e-6)
    assert expected < 0.999  # the output pair's coarse grid is what costs
    # and every face names the Conv for it, the Shape as a reader only
    from pytest_ptq.cli import main

    activations = get_sensitivity_of_nodes(Engine(str(tmp_path / "q.onnx"), data), node_type="activation")
    assert activations.details["c_Q"]["feeds"] == []  # it was ['shape']: "activation into Shape"
    assert main(["list-nodes", str(tmp_path / "q.onnx"), "--json", str(tmp_path / "n.json")]) == 0
    row = next(r for r in json.loads((tmp_path / "n.json").read_text())["calibration_nodes"] if r["name"] == "c_Q")
    assert (row["consumers"], row["counts_for"], row["owner"]) == (["shape"], ["conv"], "conv")


def test_an_operator_no_pair_reads_or_writes_is_refused_for_what_it_is(tmp_path):
    # "node 'relu' is an operator (node type 'node'), not an operator (node type 'node'); use
    # node_type='node'": the advice was the option given
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W")]
    nodes = []
    w = builders.add_pair(inits, nodes, "W", 0.01, np.int8(0))
    nodes += [helper.make_node("Conv", [builders.add_pair(inits, nodes, "x", 0.03, np.uint8(128)), w], ["c"],
                               pads=[1, 1, 1, 1], name="conv"),
              helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "bare", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "q.onnx"))
    engine = Engine(str(tmp_path / "q.onnx"), _data((1, 4, 8, 8), seed=8))
    assert list(get_sensitivity_of_nodes(engine, node_type="node")) == ["conv"]
    with pytest.raises(PTQError, match=r"node 'relu' \(Relu\) of .* reads no quantized input and writes no quantized "
                                       r"output, so quantization changes nothing of its own") as info:
        get_sensitivity_of_nodes(engine, node_type="node", interested_nodes=["relu"])
    assert "node_type" not in str(info.value)

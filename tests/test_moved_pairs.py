"""Pairs whose integer codes a data-movement node lays out between QuantizeLinear and
DequantizeLinear: Q -> Identity -> DQ on the input, a per-channel weight Q -> Transpose -> DQ,
Q -> Reshape -> Unsqueeze -> DQ on an activation.

Each is one pair whose bypass runs the node on the float tensor. The references are
independent: the same net built with onnx.helper with the nodes on the float tensors and only
some pairs written, run in plain onnxruntime sessions without graph optimisations.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq import cli
from pytest_ptq.engine import Engine
from pytest_ptq.errors import NotQuantized, PTQError
from pytest_ptq.model import QuantModel
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

PAIRS = ("x_Q", "w_Q", "c_Q")


def moved_net(path, keep=PAIRS, per_channel_reshape=False):
    """Identity on the input, a Transpose of the weight (stored [in, out, kh, kw]), a Reshape
    and an Unsqueeze after the conv; the pairs in ``keep`` quantize before those nodes and
    dequantize after them, the others are left out (the nodes then run on float).
    ``per_channel_reshape``: the conv output's pair per channel, which no Reshape keeps."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((4, 6, 3, 3)) * 0.3).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, 6, 64], np.int64), "shape"),
             numpy_helper.from_array(np.array([0], np.int64), "axes")]
    nodes = []

    def through(name, src, movers, scale, q_axis=None, dq_axis=None):
        """``src`` through ``movers`` ([(op, extra inputs, attributes)]), in a pair when kept."""
        kept = f"{name}_Q" in keep
        if kept:
            inits.extend([numpy_helper.from_array(np.asarray(scale, np.float32), f"{name}_s"),
                          numpy_helper.from_array(np.zeros(np.shape(scale), np.int8), f"{name}_z")])
            axis = {} if q_axis is None else {"axis": q_axis}
            nodes.append(helper.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q0"],
                                          name=f"{name}_Q", **axis))
            src = f"{name}_q0"
        for k, (op, extra, attrs) in enumerate(movers):
            out = f"{name}_{'q' if kept else 'f'}{k + 1}"
            nodes.append(helper.make_node(op, [src, *extra], [out], name=f"{name}_{op}", **attrs))
            src = out
        if kept:
            if dq_axis is not None and np.size(scale) > 1:
                # the DQ's channels are where the movers put them
                inits.extend([numpy_helper.from_array(np.asarray(scale, np.float32), f"{name}_ds"),
                              numpy_helper.from_array(np.zeros(np.shape(scale), np.int8), f"{name}_dz")])
                nodes.append(helper.make_node("DequantizeLinear", [src, f"{name}_ds", f"{name}_dz"], [f"{name}_dq"],
                                              name=f"{name}_DQ", axis=dq_axis))
            else:
                nodes.append(helper.make_node("DequantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                                              name=f"{name}_DQ"))
            src = f"{name}_dq"
        return src

    x = through("x", "x", [("Identity", [], {})], 0.05)
    channel_scales = (np.abs(w).max(axis=(0, 2, 3)) / 127).astype(np.float32)
    wt = through("w", "w", [("Transpose", [], {"perm": [1, 0, 2, 3]})], channel_scales, q_axis=1, dq_axis=0)
    nodes.append(helper.make_node("Conv", [x, wt], ["c"], name="conv", pads=[1, 1, 1, 1]))
    c_scale = np.full(6, 0.08, np.float32) if per_channel_reshape else 0.08
    c = through("c", "c", [("Reshape", ["shape"], {}), ("Unsqueeze", ["axes"], {})], c_scale, q_axis=1, dq_axis=2)
    nodes.append(helper.make_node("Relu", [c], ["y"], name="relu"))
    graph = helper.make_graph(nodes, "moved", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 6, 64])], inits)
    return builders.save_model(graph, path, opset=13, ir_version=None, full_check=True)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    root = tmp_path_factory.mktemp("moved")
    rng = np.random.default_rng(5)
    data = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(4)]}
    builders.save_folder(data, root / "calib")
    return {"root": root, "calib": root / "calib", "feeds": [{"x": a} for a in data["x"]],
            "model": moved_net(root / "model.onnx")}


def _plain(net, keep):
    path = moved_net(net["root"] / f"keep_{'_'.join(keep) or 'none'}.onnx", keep)
    return [o["y"] for o in builders.run_model(path, net["feeds"], level="disable")]


def test_each_chain_is_one_pair_and_its_nodes_belong_to_it(net):
    qm = QuantModel(str(net["model"]))
    assert sorted(qm.calibration) == sorted(PAIRS)
    assert [c.kind for c in (qm.calibration[p] for p in PAIRS)] == ["activation", "weight", "activation"]
    assert qm.calibration["w_Q"].per_channel
    assert sorted(qm.normal) == sorted(["x_Identity", "w_Transpose", "conv", "c_Reshape", "c_Unsqueeze", "relu"])
    shown = "QuantizeLinear 'x_Q' -> Identity 'x_Identity' -> DequantizeLinear 'x_DQ'"
    assert any(n.startswith("3 pair(s)") and shown in n for n in qm.notes)


def test_bypassed_quantized_and_one_pair_runs_are_the_net_so_written(net):
    engine = Engine(str(net["model"]), net["calib"])
    for keep in ((), PAIRS):
        for i, want in enumerate(_plain(net, keep)):
            np.testing.assert_allclose(engine.run(i, keep or ())["y"], want, rtol=1e-5, atol=1e-5)
    sens = {**get_sensitivity_of_nodes(engine, node_type="weight"),
            **get_sensitivity_of_nodes(engine, node_type="activation")}
    ref = _plain(net, ())
    for name in PAIRS:
        want = builders.pooled_cosine(ref, _plain(net, (name,)))
        assert sens[name]["cosine-similarity"] == pytest.approx(want, abs=1e-6)
    # each pair costs something: bypassing none of them would read 1.0
    assert max(v["cosine-similarity"] for v in sens.values()) < 0.99999


def test_a_per_channel_pair_through_a_reshape_is_said_and_refused_alone(tmp_path):
    path = moved_net(tmp_path / "per_channel.onnx", per_channel_reshape=True)
    qm = QuantModel(str(path))
    assert sorted(qm.calibration) == ["w_Q", "x_Q"] and "c_Reshape" in qm.normal
    said = [n for n in qm.notes if n.startswith(f"a chain left quantized in every configuration in {str(path)!r}: "
                                                "QuantizeLinear 'c_Q' "
                                                "-> Reshape 'c_Reshape' -> Unsqueeze 'c_Unsqueeze' -> DequantizeLinear "
                                                "'c_DQ': ")]
    assert len(said) == 1 and "stay quantized in every configuration, the float reference included" in said[0]
    alone = moved_net(tmp_path / "alone.onnx", keep=("c_Q",), per_channel_reshape=True)
    with pytest.raises(NotQuantized, match=r"has no QuantizeLinear/DequantizeLinear pair the tool analyses: "
                                           r"QuantizeLinear 'c_Q' -> Reshape 'c_Reshape' .* put the Reshape before "
                                           r"the QuantizeLinear \(or after the DequantizeLinear\) in the export$"
                       ) as err:
        QuantModel(str(alone))
    assert "not the float one" not in str(err.value)


def test_a_moved_pairs_settings_name_the_tensor_its_quantizer_read(net):
    """The moved pair's float tensor is the tool's own: the printed TensorQuantOverrides named
    'x_q1::float', which quantize_static cannot act on, where the file's Q read 'x'."""
    from pytest_ptq.remedy.terms import onnxruntime_settings

    qm = QuantModel(str(net["model"]))
    q_inputs = {n.name: n.input[0] for n in onnx.load(str(net["model"])).graph.node if n.op_type == "QuantizeLinear"}
    settings = onnxruntime_settings(qm, "int16", ["x_Q", "c_Q"])
    assert set(settings["TensorQuantOverrides"]) == {q_inputs["x_Q"], q_inputs["c_Q"]}


def test_a_per_block_chain_through_a_transpose_is_said(tmp_path):
    """A per-block Q through a Transpose was moved with its axis alone, its scale left in the
    old layout, and refused."""
    w = (np.random.default_rng(0).standard_normal((4, 8)) * 0.3).astype(np.float32)
    scale = np.full((4, 2), 0.01, np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(scale, "s"),
             numpy_helper.from_array(np.zeros(scale.shape, np.int8), "z"),
             numpy_helper.from_array(scale.T.copy(), "sT"), numpy_helper.from_array(np.zeros((2, 4), np.int8), "zT")]
    nodes = [helper.make_node("QuantizeLinear", ["W", "s", "z"], ["wq"], name="w_Q", axis=1, block_size=4),
             helper.make_node("Transpose", ["wq"], ["wt"], name="w_T", perm=[1, 0]),
             helper.make_node("DequantizeLinear", ["wt", "sT", "zT"], ["wd"], name="w_DQ", axis=0, block_size=4),
             helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / "t.onnx"
    onnx.save(model, str(path))
    with pytest.raises(NotQuantized, match=r"QuantizeLinear 'w_Q' -> Transpose 'w_T' -> DequantizeLinear 'w_DQ': the "
                                           r"tool does not follow a per-block QuantizeLinear's"):
        QuantModel(str(path))


def _reversed_net(path, case):
    """A per-channel QuantizeLinear (axis 0, 8 scales) -> Transpose without perm ->
    DequantizeLinear (axis 1) of an [8, 4] tensor: a weight W (``case`` "weight", then
    ``y = x @ W.T``), or an activation r then ``y = r.T @ M``, r being Relu(a) of an input
    declared [8, 4] ("inferred": onnx infers r's rank) or a Reshape of a [32] input by a
    shape fed at run time ("declared after": the file declares the transposed codes' rank;
    "unknown": nothing says it). Returns the float computation as a function of the feeds."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 4)) * np.linspace(0.2, 3, 8)[:, None]).astype(np.float32)  # rows apart
    m = (rng.standard_normal((8, 3)) * 0.5).astype(np.float32)
    s = (np.abs(w).max(1) / 127).astype(np.float32) if case == "weight" else np.linspace(0.01, 0.05, 8, dtype=np.float32)
    inits = [numpy_helper.from_array(s, "s"), numpy_helper.from_array(np.zeros(8, np.int8), "z"),
             numpy_helper.from_array(m, "M")]
    f32 = TensorProto.FLOAT
    if case == "weight":
        inits.append(numpy_helper.from_array(w, "W"))
        inputs, nodes, src = [helper.make_tensor_value_info("x", f32, [2, 4])], [], "W"
    elif case == "inferred":
        inputs, src = [helper.make_tensor_value_info("a", f32, [8, 4])], "r"
        nodes = [helper.make_node("Relu", ["a"], ["r"], name="relu")]
    else:
        inputs, src = [helper.make_tensor_value_info("a", f32, [32]),
                       helper.make_tensor_value_info("shape", TensorProto.INT64, [None])], "r"
        nodes = [helper.make_node("Reshape", ["a", "shape"], ["r"], name="reshape")]
    nodes += [helper.make_node("QuantizeLinear", [src, "s", "z"], ["q"], name="Q", axis=0),
              helper.make_node("Transpose", ["q"], ["t"], name="T"),
              helper.make_node("DequantizeLinear", ["t", "s", "z"], ["d"], name="DQ", axis=1),
              helper.make_node("MatMul", ["x", "d"] if case == "weight" else ["d", "M"], ["y"], name="mm")]
    known = [helper.make_tensor_value_info("t", TensorProto.INT8, ["n", "c"])] if case == "declared after" else []
    graph = helper.make_graph(nodes, "reversed", inputs, [helper.make_tensor_value_info("y", f32, None)], inits,
                              value_info=known)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    if case == "weight":
        return lambda feeds: feeds["x"].astype(np.float64) @ w.T.astype(np.float64)
    return lambda feeds: np.maximum(feeds["a"], 0).reshape(8, 4).T.astype(np.float64) @ m.astype(np.float64) if (
        case == "inferred") else feeds["a"].reshape(8, 4).T.astype(np.float64) @ m.astype(np.float64)


@pytest.mark.parametrize("case", ["weight", "inferred", "declared after"])
def test_a_per_channel_pair_through_a_transpose_without_perm_follows_its_axis_where_the_rank_is_known(tmp_path, case):
    """A Transpose without perm reverses its input's dims: a per-channel Q -> Transpose -> DQ
    through one was left quantized in every configuration (or the file refused as holding no
    pair) even where the file declares the rank or onnx infers it."""
    path = tmp_path / "reversed.onnx"
    floats = _reversed_net(path, case)
    rng = np.random.default_rng(1)
    if case == "weight":
        feeds = [{"x": rng.standard_normal((2, 4)).astype(np.float32)} for _ in range(3)]
    else:
        feeds = [{"a": rng.standard_normal((8, 4) if case == "inferred" else (32,)).astype(np.float32),
                  **({} if case == "inferred" else {"shape": np.array([8, 4], np.int64)})} for _ in range(3)]
    engine = Engine(str(path), {k: [f[k] for f in feeds] for k in feeds[0]})
    assert list(engine.qmodel.calibration) == ["Q"] and engine.qmodel.calibration["Q"].per_channel
    for i, f in enumerate(feeds):
        given = builders.run_model(path, f)["y"]
        np.testing.assert_allclose(engine.run(i, "all")["y"], given, rtol=0, atol=1e-5)  # quantized: the file
        np.testing.assert_allclose(engine.run(i, ())["y"], floats(f), rtol=0, atol=1e-5)  # bypassed: the float one
        assert np.abs(given - floats(f)).max() > 1e-3  # which differ


def test_a_per_channel_pair_through_a_transpose_without_perm_of_unknown_rank_is_said(tmp_path):
    path = tmp_path / "reversed.onnx"
    _reversed_net(path, "unknown")
    with pytest.raises(NotQuantized) as err:
        QuantModel(str(path))
    said = str(err.value)
    assert "\n" not in said and said.endswith(
        "QuantizeLinear 'Q' -> Transpose 'T' -> DequantizeLinear 'DQ': the Transpose has no perm (it reverses its "
        "input's dims) and neither the file nor onnx's shape inference gives the rank of 'r', so the tool cannot follow "
        "a per-channel QuantizeLinear's axis through it and its Q and DQ stay quantized in every configuration, the "
        "float reference included; give the Transpose its perm, or declare that tensor's shape, in the export")


def shown_net(path):
    """x -> Relu -> r -> act_Q -> Transpose -> act_DQ (a moved activation pair), W [4, 36] ->
    w_Q -> Reshape [4, 4, 3, 3] -> w_DQ (a moved weight pair) -> Conv -> c; an empty Slice of
    x -> hol_Q -> Transpose -> hol_DQ (a moved pair on a tensor without values); Concat -> y; and
    input p -> pp_Q -> Identity -> pp_DQ -> output p_out (its Identity now computes the pair's input)."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 36)) * 0.3).astype(np.float32), "W"),
             numpy_helper.from_array(np.array([4, 4, 3, 3], np.int64), "wshape"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]
    for name, scale in (("act", 0.05), ("w", 0.01), ("hol", 0.05), ("pp", 0.02)):
        inits += [numpy_helper.from_array(np.float32(scale), f"{name}_s"),
                  numpy_helper.from_array(np.int8(0), f"{name}_z")]

    def moved(name, src, op, extra=(), **attrs):
        return [helper.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_Q"),
                helper.make_node(op, [f"{name}_q", *extra], [f"{name}_m"], name=f"{name}_{op}", **attrs),
                helper.make_node("DequantizeLinear", [f"{name}_m", f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                                 name=f"{name}_DQ")]

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             *moved("act", "r", "Transpose", perm=[0, 1, 3, 2]),
             *moved("w", "W", "Reshape", ["wshape"]),
             helper.make_node("Conv", ["act_dq", "w_dq"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Slice", ["x", "zero", "zero", "one"], ["hollow"], name="slice"),
             *moved("hol", "hollow", "Transpose", perm=[0, 1, 3, 2]),
             helper.make_node("Concat", ["c", "hol_dq"], ["y"], name="concat", axis=1),
             *moved("pp", "p", "Identity")]
    nodes[-1].output[0] = "p_out"
    graph = helper.make_graph(nodes, "shown", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                                               helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("p_out", TensorProto.FLOAT, [1, 6])], inits)
    return builders.save_model(graph, path, opset=13, full_check=True)


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    root = tmp_path_factory.mktemp("shown")
    rng = np.random.default_rng(8)
    builders.save_folder({"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(3)],
                          "p": [rng.standard_normal((1, 6)).astype(np.float32) for _ in range(3)]}, root / "calib")
    path = shown_net(root / "model.onnx")
    # what the file holds, read without the tool: every tensor name, and what each Q reads
    model = onnx.load(str(path))
    tensors = ({t for n in model.graph.node for t in (*n.input, *n.output)} | {i.name for i in model.graph.input}
               | {i.name for i in model.graph.initializer})
    reads = {n.name: n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    return {"root": root, "model": path, "calib": root / "calib", "tensors": tensors, "reads": reads}


def _named(value, keys=("tensor", "tensors", "input", "unowned")):
    """Every tensor name a result names under ``keys``, however deep."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k in keys and isinstance(v, str):
                yield v
            elif k in keys and isinstance(v, list) and all(isinstance(t, str) for t in v):
                yield from v
            else:
                yield from _named(v, keys)
    elif isinstance(value, list):
        for v in value:
            yield from _named(v, keys)


def test_every_face_names_a_moved_pairs_tensor_as_the_file_does(shown, tmp_path):
    """A moved pair quantizes a tensor of the tool's copy ('act_m::float': the layout node run on
    the float tensor), which the tables, JSON, plot titles and skip notes named where the user's
    file has no such tensor; they name the tensor the file's QuantizeLinear reads."""
    from pytest_ptq.curves import plot_acc_error
    from pytest_ptq.diagnosis import diagnose
    from pytest_ptq.distribution import get_channelwise_data_distribution, plot_distribution
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.runall import runall
    from pytest_ptq.verdict import three_configs

    reads, tensors = shown["reads"], shown["tensors"]
    engine = Engine(str(shown["model"]), shown["calib"])
    dist = plot_distribution(tmp_path / "d", engine, nodes_list=["act_Q", "w_Q", "hol_Q", "act_Transpose", "conv"])
    boxes = get_channelwise_data_distribution(tmp_path / "b", engine, nodes_list=["act_Q", "w_Q", "hol_Q"])
    for name in ("act_Q", "w_Q"):  # what the plots' titles name
        assert dist[name]["tensor"] == boxes[name]["tensor"] == reads[name], name
    # the Transpose's float output holds the values of the tensor the pair's Q reads in the file
    assert dist["act_Transpose"]["tensor"] == reads["act_Q"] and dist["conv"]["tensor"] == "c"
    for skipped in (dist["hol_Q"]["skipped"], boxes["hol_Q"]["skipped"]):
        assert skipped.startswith(f"{reads['hol_Q']!r} is empty"), skipped
    with pytest.raises(PTQError, match=f"input {reads['act_Q']!r} of 'act_Q' has shape"):
        get_channelwise_data_distribution(tmp_path / "b", engine, nodes_list=["act_Q"], axis=7)
    curves = plot_acc_error(tmp_path / "c", model_or_file=engine, progress=False)
    assert set(curves.tensors) <= tensors and reads["act_Q"] in curves.tensors, curves.tensors
    sens = {**get_sensitivity_of_nodes(engine, node_type="weight").details,
            **get_sensitivity_of_nodes(engine, node_type="activation").details}
    assert {n: sens[n]["input"] for n in reads} == reads
    diagnosis = diagnose(engine, get_sensitivity_of_nodes(engine, node_type="node"),
                         three_configs(engine, parse_outputs(None, engine)))
    assert {i["node"]: i["tensor"] for it in diagnosis.nodes for i in it["inputs"]}["act_Q"] == reads["act_Q"]
    assert set(_named(diagnosis.nodes)) <= tensors
    summary = runall(engine, save_dir=tmp_path / "r", progress=False)
    written = json.loads((tmp_path / "r" / "summary.json").read_text())
    named = set(_named(written))
    assert named <= tensors and {reads["act_Q"], reads["w_Q"]} <= named, named - tensors
    assert set(_named(summary)) <= tensors
    md = (tmp_path / "r" / "summary.md").read_text()
    assert "::float" not in md and f"{reads['hol_Q']!r} is empty" in md


def test_the_command_line_names_a_moved_pairs_tensor_as_the_file_does(shown, tmp_path, capsys):
    reads, tensors = shown["reads"], shown["tensors"]
    model, calib = str(shown["model"]), str(shown["calib"])
    drawn = ["--quiet", "-s", str(tmp_path / "drawn")]
    runs = {"list-nodes": [model], "plot-distribution": [model, calib, "-n", *reads, *drawn],
            "get-channelwise-data-distribution": [model, calib, "-n", *reads, *drawn],
            "plot-acc-error": [model, calib, *drawn], "get-sensitivity-of-nodes": [model, calib, "-t", "activation"]}
    for command, args in runs.items():
        out = tmp_path / f"{command}.json"
        rc = cli.main([command, *args, "--json", str(out)])
        text = capsys.readouterr().out
        assert rc == 0 and "::float" not in text, (command, text)
        named = set(_named(json.loads(out.read_text())))
        assert named and named <= tensors, (command, named - tensors)
        if command in ("plot-distribution", "get-channelwise-data-distribution"):
            assert f"skipped hol_Q: {reads['hol_Q']!r} is empty" in text and reads["act_Q"] in text, text


def test_the_plugins_report_names_a_moved_pairs_tensor_as_the_file_does(shown, pytester):
    """The report's note on a ranked pair without values named 'hol_m::float', the tool's own tensor."""
    import html
    import re

    from test_plugin import run

    path = pytester.path / "report.html"
    run(pytester, f"--ptq-model={shown['model']}", f"--ptq-data={shown['calib']}", f"--ptq-report={path}",
        "--ptq-node-type=activation", "-p", "no:xdist")
    text = html.unescape(re.sub(r"<[^>]*>", "", path.read_text()))
    assert "::float" not in text
    assert f"{shown['reads']['hol_Q']!r} is empty" in text


def test_check_data_holds_an_input_to_its_moved_pairs_range(shown, tmp_path):
    """An input quantized through a moved pair (p -> Q -> Identity -> DQ) had no calibrated
    range in check-data: data 50x wider than the pair's range raised no range error."""
    from pytest_ptq.datacheck import check_data

    model = onnx.load(str(shown["model"]))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "p")
    scale, zero = float(inits[q.input[1]]), int(inits[q.input[2]])
    lo, hi = (-128 - zero) * scale, (127 - zero) * scale  # int8 codes
    rng = np.random.default_rng(9)
    data = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(3)],
            "p": [(rng.standard_normal((1, 6)) * 50 * hi).astype(np.float32) for _ in range(3)]}
    report = check_data(str(shown["model"]), builders.save_folder(data, tmp_path / "wide"))
    stats = report.stats["calibration"]["p"]
    assert stats["calibrated_range"] == pytest.approx([lo, hi])
    values = np.stack(data["p"])
    assert stats["clipped_share"] == pytest.approx(np.mean((values < lo - scale / 2) | (values > hi + scale / 2)))
    assert "range" in report.checks("error")


def _file_reads(path, feeds, tensor):
    """``tensor``'s values in the file as given, run in a plain onnxruntime session on the file
    with that tensor made an output (its type and shape left to onnxruntime)."""
    model = onnx.load(str(path))
    model.graph.output.append(onnx.ValueInfoProto(name=tensor))
    return [o[tensor] for o in builders.run_model(model, feeds, outputs=[tensor])]


def _file_q(path, name):
    """The file's QuantizeLinear ``name``: (the tensor it reads, its axis attribute or None)."""
    q = next(n for n in onnx.load(str(path)).graph.node if n.name == name)
    axis = next((a.i for a in q.attribute if a.name == "axis"), None)
    return q.input[0], axis


def empty_net(path):
    """x [3, 2, 4] -> Slice to an empty e [0, 2, 4] -> e_Q -> Reshape [0, 8] -> e_DQ -> an output,
    beside x -> Relu -> a_Q -> Identity -> a_DQ -> y."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("zero", [0]), ("flat", [0, 8]))]
    for name in ("e", "a"):
        inits += [numpy_helper.from_array(np.float32(0.05), f"{name}_s"), numpy_helper.from_array(np.int8(0), f"{name}_z")]
    nodes = [helper.make_node("Slice", ["x", "zero", "zero", "zero"], ["e"], name="slice"),
             helper.make_node("QuantizeLinear", ["e", "e_s", "e_z"], ["e_q"], name="e_Q"),
             helper.make_node("Reshape", ["e_q", "flat"], ["e_m"], name="e_Reshape"),
             helper.make_node("DequantizeLinear", ["e_m", "e_s", "e_z"], ["e_out"], name="e_DQ"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "a_s", "a_z"], ["a_q"], name="a_Q"),
             helper.make_node("Identity", ["a_q"], ["a_m"], name="a_Identity"),
             helper.make_node("DequantizeLinear", ["a_m", "a_s", "a_z"], ["y"], name="a_DQ")]
    graph = helper.make_graph(nodes, "empty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2, 4]),
                               helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [0, 8])], inits)
    return builders.save_model(graph, path, opset=13, full_check=True)


def test_an_empty_moved_tensors_note_gives_the_files_shape(tmp_path):
    """The note read "'e' is empty (shape [0, 8])", the Reshape's layout in the tool's copy,
    where the file's e, which its QuantizeLinear reads, is [0, 2, 4]."""
    from pytest_ptq.distribution import get_channelwise_data_distribution, plot_distribution

    path = empty_net(tmp_path / "empty.onnx")
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((3, 2, 4)).astype(np.float32)} for _ in range(2)]
    builders.save_folder({"x": [f["x"] for f in feeds]}, tmp_path / "calib")
    tensor, _ = _file_q(path, "e_Q")
    want = list(_file_reads(path, feeds, tensor)[0].shape)
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    assert [d.dim_value for d in next(v for v in inferred.graph.value_info if v.name == tensor)
            .type.tensor_type.shape.dim] == want
    engine = Engine(str(path), tmp_path / "calib")
    dist = plot_distribution(tmp_path / "d", engine, nodes_list=["e_Q", "e_Reshape", "a_Q"])
    boxes = get_channelwise_data_distribution(tmp_path / "b", engine, nodes_list=["e_Q", "a_Q"])
    note = f"{tensor!r} is empty (shape {want})"
    for skipped in (dist["e_Q"]["skipped"], dist["e_Reshape"]["skipped"], boxes["e_Q"]["skipped"]):
        assert skipped.startswith(note), skipped
    assert dist["e_Q"]["shape"] == want


def test_a_pair_moved_through_a_transpose_shows_the_files_axis_shape_and_channels(net, tmp_path, capsys):
    """The weight's Q reads w [4, 6, 3, 3] per channel on axis 1 in the file; the tool's copy
    quantizes the Transpose's [6, 4, 3, 3] on axis 0, which the box plot, the distribution,
    list-nodes and the remedy settings showed ("axis 0 of [6, 4, 3, 3]"). The conv output's
    pair, through a Reshape and an Unsqueeze, showed [1, 1, 6, 64] for the file's [1, 6, 8, 8]."""
    from pytest_ptq.distribution import get_channelwise_data_distribution, plot_distribution
    from pytest_ptq.remedy.terms import onnxruntime_settings

    path = net["model"]
    w_tensor, w_axis = _file_q(path, "w_Q")
    w = numpy_helper.to_array(next(i for i in onnx.load(str(path)).graph.initializer if i.name == w_tensor))
    c_tensor, _ = _file_q(path, "c_Q")
    # the box plots read the float model's c: the same net with no pair written
    c = np.stack(_file_reads(moved_net(tmp_path / "float.onnx", keep=()), net["feeds"], c_tensor))  # [samples, ...]
    engine = Engine(str(path), net["calib"])
    boxes = get_channelwise_data_distribution(tmp_path / "b", engine, nodes_list=["w_Q", "c_Q"])
    dist = plot_distribution(tmp_path / "d", engine, nodes_list=["w_Q", "c_Q"])
    box = boxes["w_Q"]
    assert (box["axis"], box["range_axis"], box["shape"]) == (w_axis, w_axis, list(w.shape))
    assert dist["w_Q"]["axis"] == dist["w_Q"]["channel_axis"] == w_axis and dist["w_Q"]["shape"] == list(w.shape)
    # channel k is the file's channel k along that axis
    np.testing.assert_allclose(box["max_abs"], np.abs(np.moveaxis(w, w_axis, 0)).reshape(w.shape[w_axis], -1).max(1),
                               rtol=1e-6)
    box = boxes["c_Q"]
    assert box["shape"] == list(c.shape[1:]) and dist["c_Q"]["shape"] == list(c.shape[1:])
    per_channel = np.abs(np.moveaxis(c, box["axis"] + 1, 0)).reshape(c.shape[box["axis"] + 1], -1).max(1)
    np.testing.assert_allclose(box["max_abs"], per_channel, rtol=1e-6)
    # an axis given is the file's
    given = get_channelwise_data_distribution(tmp_path / "g", engine, nodes_list=["w_Q", "c_Q"], axis=1)
    np.testing.assert_allclose(given["w_Q"]["max_abs"], np.abs(w).max(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(given["c_Q"]["max_abs"], np.abs(c).max(axis=(0, 1, 3, 4)), rtol=1e-6)
    assert given["w_Q"]["axis"] == given["c_Q"]["axis"] == 1
    out = tmp_path / "list.json"
    assert cli.main(["list-nodes", str(path), "--json", str(out)]) == 0
    listed = {r["name"]: r for r in json.loads(out.read_text())["calibration_nodes"]}
    assert listed["w_Q"]["axis"] == w_axis
    out = tmp_path / "boxes.json"
    assert cli.main(["get-channelwise-data-distribution", str(path), str(net["calib"]), "-n", "w_Q", "--quiet",
                     "-s", str(tmp_path / "cli"), "--json", str(out)]) == 0
    capsys.readouterr()
    assert json.loads(out.read_text())["w_Q"]["axis"] == w_axis
    settings = onnxruntime_settings(engine.qmodel, "int16", ["w_Q"])
    assert settings["TensorQuantOverrides"][w_tensor][0]["axis"] == w_axis


def test_an_axis_whose_length_follows_the_sample_is_named_as_the_file_lays_it_out(tmp_path):
    """x [1, seq, 8] -> Q -> Transpose -> DQ: the tool's copy quantizes x transposed,
    [1, 8, seq], so the file's axis 1 (the sequence, of another length in each sample) is its
    axis 2, which the refusal named ("its axis 2 has 9 elements in one sample and 5 in
    another") for the axis the user gave, 1."""
    from pytest_ptq.distribution import get_channelwise_data_distribution

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 8)) * 0.3).astype(np.float32), "W"),
             numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="x_Q"),
             helper.make_node("Transpose", ["xq"], ["xqt"], name="x_T", perm=[0, 2, 1]),
             helper.make_node("DequantizeLinear", ["xqt", "s", "z"], ["xt"], name="x_DQ"),
             helper.make_node("MatMul", ["W", "xt"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "seq"])], inits)
    path = builders.save_model(graph, tmp_path / "seq.onnx", opset=13)
    data = {"x": [rng.standard_normal((1, n, 8)).astype(np.float32) for n in (9, 5)]}
    engine = Engine(str(path), builders.save_folder(data, tmp_path / "calib"))
    # the file's axis 1 is the one whose length differs
    assert [builders.run_model(path, {"x": x})["y"].shape for x in data["x"]] == [(1, 4, 9), (1, 4, 5)]
    with pytest.raises(PTQError, match=r"its axis 1 has 5 elements in one sample and 9 in another"):
        get_channelwise_data_distribution(tmp_path / "b", engine, nodes_list=["x_Q"], axis=1)
    # the file's axis 2, of one length in every sample, is boxed: channel k is x[..., k]
    boxes = get_channelwise_data_distribution(tmp_path / "c", engine, nodes_list=["x_Q"], axis=2)
    assert boxes["x_Q"]["axis"] == 2
    np.testing.assert_allclose(boxes["x_Q"]["max_abs"], np.abs(np.concatenate(data["x"], axis=1)).max(axis=(0, 1)),
                               rtol=1e-6)

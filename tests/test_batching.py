"""Samples run in groups (pytest_ptq.engine.batching): the same rankings as one at a time and
as brute-force rewired models in plain onnxruntime sessions; groups only where the model
takes them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
import format_models
from pytest_ptq.engine import Engine
from pytest_ptq.engine.batching import MIN_GAIN, Batching, groups, split, stack
from pytest_ptq.errors import PTQError
from pytest_ptq.sensitivity import get_sensitivity_of_nodes
from test_plugin import independent_sensitivity

N = 6


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    return builders.narrow_conv_setup(tmp_path_factory.mktemp("batching"), N, seed=3)


@pytest.mark.parametrize("node_type", ["activation", "weight", "node"])
def test_grouped_rankings_equal_one_at_a_time_and_brute_force(net, node_type):
    grouped_engine = Engine(net["q"], net["folder"], batch=4)
    grouped = get_sensitivity_of_nodes(grouped_engine, node_type=node_type)
    assert grouped_engine.batching(list(range(N))).size == 4
    assert grouped_engine.batches(range(N)) == [(0, 1, 2, 3), (4, 5)]
    alone = get_sensitivity_of_nodes(Engine(net["q"], net["folder"], batch=1), node_type=node_type)
    assert set(grouped) == set(alone)
    for name in alone:
        assert grouped[name]["cosine-similarity"] == pytest.approx(alone[name]["cosine-similarity"], abs=1e-6)
        assert grouped.details[name]["per_sample"]["cosine-similarity"] == pytest.approx(
            alone.details[name]["per_sample"]["cosine-similarity"], abs=1e-6)
    if node_type == "activation":
        expected = independent_sensitivity(net["q"], net["feeds"], list(grouped))
        for name, value in expected.items():
            assert grouped[name]["cosine-similarity"] == pytest.approx(value, abs=1e-5), name


def test_auto_measures_and_says_why(net):
    engine = Engine(net["q"], net["folder"])
    choice = engine.batching(list(range(N)))
    assert isinstance(choice, Batching) and choice.gain is not None and choice.gain > 0
    # stacks of 2, 4, ... are tried while each is faster; the one kept was measured
    assert (choice.size in (2, 4, N) and choice.gain >= MIN_GAIN and f"{choice.size} samples per run" in choice.reason
            and "faster than one at a time" in choice.reason) or (
        choice.size == 1 and "not faster here" in choice.reason)


def test_low_memory_mode_runs_one_sample_at_a_time_unless_asked(net):
    choice = Engine(net["q"], net["folder"], memory="low").batching(list(range(N)))
    assert choice.size == 1 and "low-memory mode" in choice.reason and choice.gain is None
    assert Engine(net["q"], net["folder"], memory="low", batch=4).batches(range(N)) == [(0, 1, 2, 3), (4, 5)]


def _fixed_batch_model(path, mode="export"):
    """Tokens ``x`` [1, 8, 16] through a MatMul and a classifier head to ``prob``, reshaped
    as batch-1 exports write it (mode "export"): the rows folded for the MatMul (``[8, 16]``)
    and back (``[1, 8, 32]``), then flattened to ``[1, -1]``. "transposed": the tokens
    transposed first, so the folded rows' first axis is not the batch's; "fixed": a Reshape
    to ``[8, -1]`` before a second MatMul fixes the rows for good."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(16, 32)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(size=(256, 10)).astype(np.float32) / 16, "w2"),
             numpy_helper.from_array(np.array([8, 16], np.int64), "rows"),
             numpy_helper.from_array(np.array([1, 8, 32], np.int64), "unfold"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "flat")]
    nodes = []
    src = "x"
    if mode == "transposed":
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="transpose"))
        src = "xt"
    nodes += [helper.make_node("Reshape", [src, "rows"], ["x2"], name="fold"),
              helper.make_node("MatMul", ["x2", "w1"], ["h"], name="tokens")]
    if mode == "fixed":
        inits += [numpy_helper.from_array(rng.normal(size=(32, 32)).astype(np.float32), "w3"),
                  numpy_helper.from_array(np.array([8, -1], np.int64), "fixed")]
        nodes += [helper.make_node("Reshape", ["h", "fixed"], ["hf"], name="fix"),
                  helper.make_node("MatMul", ["hf", "w3"], ["h2"], name="mix")]
    nodes += [helper.make_node("Reshape", ["h2" if mode == "fixed" else "h", "unfold"], ["h3"], name="unfold"),
              helper.make_node("Relu", ["h3"], ["r"], name="relu"),
              helper.make_node("Reshape", ["r", "flat"], ["f"], name="flatten"),
              helper.make_node("MatMul", ["f", "w2"], ["logits"], name="head"),
              helper.make_node("Softmax", ["logits"], ["prob"], axis=-1, name="softmax")]
    graph = helper.make_graph(nodes, "fixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _fixed_batch_setup(root, mode="export"):
    data = {"x": [np.random.default_rng(i).normal(size=(1, 8, 16)).astype(np.float32) for i in range(4)]}
    folder = builders.save_folder(data, root / "calib")
    q = builders.quantize(_fixed_batch_model(root / "f.onnx", mode), root / "q.onnx", data)
    return q, folder, [{"x": a} for a in data["x"]]


def test_reshapes_that_fix_the_batch_to_one_are_rebatched(tmp_path):
    q, folder, feeds = _fixed_batch_setup(tmp_path)
    engine = Engine(q, folder, batch=4)
    choice = engine.batching(list(range(4)))
    assert choice.size == 4 and "samples per run" in choice.reason, choice.reason
    grouped = get_sensitivity_of_nodes(engine, node_type="activation")
    alone = get_sensitivity_of_nodes(Engine(q, folder, batch=1), node_type="activation")
    expected = independent_sensitivity(q, feeds, list(alone))
    assert set(grouped) == set(alone) == set(expected)
    for name, value in expected.items():
        assert grouped[name]["cosine-similarity"] == pytest.approx(alone[name]["cosine-similarity"], abs=1e-6)
        assert grouped[name]["cosine-similarity"] == pytest.approx(value, abs=1e-5), name
    # "auto" measures it like any other graph: kept or not faster, never rejected
    reason = Engine(q, folder).batching(list(range(4))).reason
    assert "samples per run" in reason or "not faster here" in reason, reason


@pytest.mark.parametrize("mode, why", [("transposed", "stacked samples give other values"),
                                       ("fixed", "does not take stacked samples: its MatMul node 'mix' fails")])
def test_a_graph_whose_batch_cannot_be_freed_runs_one_at_a_time(tmp_path, mode, why):
    q, folder, _ = _fixed_batch_setup(tmp_path, mode)
    for batch in ("auto", 4):
        engine = Engine(q, folder, batch=batch)
        choice = engine.batching(list(range(4)))
        # "auto" checks the values of a stack that measures faster only
        assert choice.size == 1 and (why in choice.reason or batch == "auto" and "not faster here" in choice.reason), \
            choice.reason
        assert engine.batches(range(4)) == [0, 1, 2, 3]
    get_sensitivity_of_nodes(engine, node_type="activation")  # still runs, one at a time


def _mixing_setup(root, output, samples):
    """A dynamic-batch MLP on ``x`` [N, 16] to ``y``. output "mixing": ``h + (h - mean of h
    over the batch)``, which is ``h`` for one sample and mixes a stack; "folded": ``y`` reshaped
    to [-1, 4], four rows a sample (a stack's rows are not its samples). ``samples``: "distinct";
    "first equal", the first two the same; "close", all within 2e-4 of one (a video's frames)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(16, 32)).astype(np.float32) / 4, "w1"),
             numpy_helper.from_array(rng.normal(size=(32, 16)).astype(np.float32) / 4, "w2"),
             numpy_helper.from_array(np.array([-1, 4], np.int64), "rows")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1")]
    if output == "mixing":
        nodes += [helper.make_node("ReduceMean", ["h"], ["hm"], axes=[0], keepdims=1, name="batch_mean"),
                  helper.make_node("Sub", ["h", "hm"], ["hc"], name="centre"),
                  helper.make_node("Add", ["h", "hc"], ["ha"], name="add"),
                  helper.make_node("MatMul", ["ha", "w2"], ["y"], name="mm2")]
    else:
        nodes += [helper.make_node("Relu", ["h"], ["ha"], name="relu"),
                  helper.make_node("MatMul", ["ha", "w2"], ["z"], name="mm2"),
                  helper.make_node("Reshape", ["z", "rows"], ["y"], name="fold")]
    graph = helper.make_graph(nodes, output, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 16 if output == "mixing"
                                                                                       else 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), root / "f.onnx")
    xs = [rng.normal(size=(1, 16)).astype(np.float32) for _ in range(8)]
    if samples == "first equal":
        xs[1] = xs[0]
    elif samples == "close":
        xs = [xs[0] + np.float32(2e-4) * rng.normal(size=(1, 16)).astype(np.float32) for _ in xs]
    data = {"x": xs}
    folder = builders.save_folder(data, root / "calib")
    return builders.quantize(root / "f.onnx", root / "q.onnx", data), folder, [{"x": a} for a in xs]


@pytest.mark.parametrize("output, samples, why", [
    ("mixing", "first equal", "stacked samples give other values at 'y'"),
    ("mixing", "close", "stacked samples give other values at 'y'"),
    ("folded", "distinct", "output 'y' holds 4 rows for one sample")])
def test_stacks_that_would_score_samples_wrong_are_refused(tmp_path, output, samples, why):
    q, folder, feeds = _mixing_setup(tmp_path, output, samples)
    for batch in ("auto", 4):
        engine = Engine(q, folder, batch=batch)
        choice = engine.batching(list(range(8)))
        assert choice.size == 1 and (why in choice.reason or batch == "auto" and "not faster" in choice.reason), \
            choice.reason
    sens = get_sensitivity_of_nodes(engine, metrics=["mse"], node_type="activation")
    # every sample's figure as a plain session gives it, one sample at a time, with only that pair quantized
    ref = builders.run_model(builders.rewire(q, set()), feeds)
    for name in sens:
        got = builders.run_model(builders.rewire(q, {name}), feeds)
        expected = [float(np.mean((g["y"] - r["y"]) ** 2)) for g, r in zip(got, ref)]
        assert sens.details[name]["per_sample"]["mse"] == pytest.approx(expected, rel=1e-4, abs=1e-12), name


def test_dynamic_quantizers_never_run_in_groups(tmp_path):
    fp = format_models.ops_net(tmp_path / "f.onnx")
    q = format_models.quantize_dyn(fp, tmp_path / "q.onnx")
    x = onnx.load(str(fp)).graph.input[0]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    folder = builders.save_folder({x.name: [np.random.default_rng(i).normal(size=shape).astype(np.float32)
                                            for i in range(3)]}, tmp_path / "calib")
    choice = Engine(q, folder, float_model=fp, batch=3).batching([0, 1, 2])
    assert choice.size == 1 and "DynamicQuantizeLinear" in choice.reason


def test_samples_of_other_lengths_run_one_at_a_time(tmp_path):
    """An open sequence axis: samples of unlike lengths cannot be stacked, whether the unlike
    one comes within the trial's first samples or after them (the choice is kept for every
    run); the ranking is one at a time's and a plain session's."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.normal(size=(50, 16)).astype(np.float32), "table")
    mix = numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32) / 4, "mix")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
         helper.make_node("Tanh", ["e"], ["t"], name="tanh"),
         helper.make_node("MatMul", ["t", "mix"], ["prob"], name="proj")], "seq",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "len"])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, "len", 8])], [table, mix])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), fp)
    for lengths in ([5, 7, 5, 7], [5, 5, 5, 5, 5, 5, 5, 5, 7]):
        ids = [rng.integers(0, 50, size=(1, n)).astype(np.int64) for n in lengths]
        folder = builders.save_folder({"ids": ids}, tmp_path / f"calib{len(lengths)}")
        q = builders.quantize(fp, tmp_path / f"q{len(lengths)}.onnx", {"ids": ids})
        for batch in ("auto", 4):
            engine = Engine(q, folder, batch=batch)
            choice = engine.batching(list(range(len(lengths))))
            assert choice.size == 1 and "samples differ in shape" in choice.reason, choice.reason
            ranked = get_sensitivity_of_nodes(engine, node_type="activation")
            expected = independent_sensitivity(q, [{"ids": i} for i in ids], list(ranked))
            for name, value in expected.items():
                assert ranked[name]["cosine-similarity"] == pytest.approx(value, abs=1e-5), name


def test_stacked_samples_run_model_outputs_only(net):
    engine = Engine(net["q"], net["folder"])
    name = engine.probe_tensors[0]
    with pytest.raises(PTQError, match="stacked samples run model outputs only"):
        engine.run((0, 1), (), [name])


def test_bad_batch_setting_is_one_sentence(net):
    for bad in (0, -2, "many", 2.5, True):
        with pytest.raises(PTQError, match="batch must be 'auto' or a whole number >= 1"):
            Engine(net["q"], net["folder"], batch=bad)


def test_groups_stack_and_split():
    assert groups([0, 1, 2, 3, 4], 2) == [(0, 1), (2, 3), 4]
    assert groups([0, 1, 2], 1) == [0, 1, 2]
    samples = [{"x": np.full((1, 2), i, np.float32)} for i in range(3)]
    stacked = stack(samples)
    assert stacked["x"].shape == (3, 2)
    back = split(stacked, 3)
    assert all(np.array_equal(b["x"], s["x"]) for b, s in zip(back, samples))

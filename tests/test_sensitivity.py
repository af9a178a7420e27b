"""Node sensitivity against metrics computed by hand on independently rewired models."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError, closest
from pytest_ptq.sensitivity import Sensitivity, get_sensitivity_of_nodes

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def cosine(r, t):
    return float(r @ t / np.sqrt((r @ r) * (t @ t)))


def mse(r, t):
    return float(((t - r) ** 2).mean())


def sqnr(r, t):
    return float(10 * np.log10((r @ r) / ((t - r) @ (t - r))))


HAND = {"cosine-similarity": cosine, "mse": mse, "sqnr": sqnr}
# Per-element difference between the engine and the rewired references at ORT_DISABLE_ALL
# (float32 summation order; measured <= 7.5e-8 in test_engine), doubled: the float
# reference and the quantized run each carry it.
DELTA = 2e-7


def assert_metric(metric, got, ref, test):
    """``got`` is ``metric`` of (ref, test) up to what a DELTA per element can move it."""
    __tracebackhide__ = True
    want = HAND[metric](ref, test)
    rms = lambda a: float(np.sqrt((a * a).mean()))  # noqa: E731
    if metric == "cosine-similarity":
        # a perturbation e moves the cosine by at most |e| / |t| times the sine of the angle
        sine = math.sqrt(max(2 * (1 - want), 0.0))
        tol = 2 * DELTA / min(rms(ref), rms(test)) * sine + 1e-12
        assert abs(got - want) <= tol, (got, want, tol)
    elif metric == "mse":
        # the error's RMS moves by at most the perturbation's RMS
        assert abs(math.sqrt(got) - math.sqrt(want)) <= DELTA, (got, want)
    else:
        noise = rms(ref) * 10 ** (-got / 20)  # the error RMS that this SQNR means
        assert abs(noise - rms(test - ref)) <= DELTA, (got, want)


class Setup:
    """An engine at ORT_DISABLE_ALL plus everything needed to recompute results by hand."""

    def __init__(self, zoo, variant="qdq_pc"):
        self.qpath, self.fpath = zoo.qdq(variant), zoo.float(variant)
        data = zoo.data(variant)
        self.feeds = [{k: data[k][i] for k in data} for i in range(len(data["x"]))]
        self.engine = Engine(self.qpath, data, float_model=self.fpath, optimization="disable")
        self.model = onnx.load(str(self.qpath))
        self.pairs = builders.qdq_pairs(self.model)
        self._float = None

    def outputs(self, keep, tensors=None):
        model = builders.rewire(self.qpath, keep=set(keep), float_model=self.fpath, outputs=tensors or ())
        return builders.run_model(model, self.feeds, "disable", tensors)

    def float_outputs(self):
        if self._float is None:
            self._float = self.outputs(())
        return self._float

    def keep_for_node(self, node):
        """The pairs whose DQ outputs feed a normal node, and a pair on its output whose DQ
        writes a model output, read from the proto."""
        owner = {d.output[0]: name for name, (_, dqs) in self.pairs.items() for d in dqs}
        n = next(n for n in self.model.graph.node if n.name == node)
        outputs = {o.name for o in self.model.graph.output}
        return [owner[i] for i in n.input if i in owner] + [
            name for name, (q, dqs) in self.pairs.items()
            if q is not None and q.input[0] in n.output and any(d.output[0] in outputs for d in dqs)]

    def pooled(self, keep, tensor="prob", take=lambda a: a):
        """(float, quantized) outputs over every sample, concatenated, in float64."""
        ref = np.concatenate([take(o[tensor]).ravel() for o in self.float_outputs()]).astype(np.float64)
        test = np.concatenate([take(o[tensor]).ravel() for o in self.outputs(keep)]).astype(np.float64)
        return ref, test


@pytest.fixture(scope="module")
def setup(zoo):
    return Setup(zoo)


@pytest.mark.parametrize("node_type", ["activation", "weight", "node"])
def test_values_equal_hand_computation(setup, node_type):
    metrics = ["cosine-similarity", "mse", "sqnr"]
    result = get_sensitivity_of_nodes(setup.engine, metrics, node_type=node_type)
    if node_type == "node":
        expected = [n.name for n in setup.model.graph.node if n.op_type not in QDQ_OPS]
    else:
        inits = {i.name for i in setup.model.graph.initializer}
        expected = [name for name, (q, dqs) in setup.pairs.items()
                    if ((q or dqs[0]).input[0] in inits) == (node_type == "weight")]
    assert sorted(result) == sorted(expected)
    for name, values in result.items():
        keep = setup.keep_for_node(name) if node_type == "node" else [name]
        ref, test = setup.pooled(keep)
        for metric in metrics:
            assert_metric(metric, values[metric], ref, test)
        assert result.details[name]["per_output"]["prob"] == values
        assert len(result.details[name]["per_sample"]["mse"]) == len(setup.feeds)
    # most sensitive first: cosine ascending
    cos = [v["cosine-similarity"] for v in result.values()]
    assert cos == sorted(cos) and cos[0] < cos[-1]


def test_per_sample_values(setup):
    result = get_sensitivity_of_nodes(setup.engine, ["mse"], node_type="activation",
                                      interested_nodes=["c2_QuantizeLinear"])
    got = result.details["c2_QuantizeLinear"]["per_sample"]["mse"]
    assert len(got) == len(setup.feeds)
    for value, r, t in zip(got, setup.float_outputs(), setup.outputs(["c2_QuantizeLinear"])):
        assert_metric("mse", value, r["prob"].astype(np.float64).ravel(), t["prob"].astype(np.float64).ravel())


def test_mse_first_sorts_descending(setup):
    result = get_sensitivity_of_nodes(setup.engine, ["mse", "cosine-similarity"], node_type="weight")
    mses = [v["mse"] for v in result.values()]
    assert mses == sorted(mses, reverse=True) and mses[0] > mses[-1]
    assert result.metrics == ["mse", "cosine-similarity"]


def test_interested_nodes_restrict(setup):
    wanted = ["conv2", "fc"]
    result = get_sensitivity_of_nodes(setup.engine, node_type="node", interested_nodes=wanted)
    assert sorted(result) == wanted
    assert result.details["conv2"]["calibration_nodes"] == setup.keep_for_node("conv2")


def test_bad_arguments_are_clear_errors(setup):
    with pytest.raises(PTQError, match="unknown node 'conv_2'.*'conv2'"):
        get_sensitivity_of_nodes(setup.engine, node_type="node", interested_nodes=["conv_2"])
    with pytest.raises(PTQError, match="'conv2' is an operator \\(node type 'node'\\), not an activation node; use "
                                       "node_type='node' \\(-t node\\)"):
        get_sensitivity_of_nodes(setup.engine, node_type="activation", interested_nodes=["conv2"])
    with pytest.raises(PTQError, match="unknown node_type 'weights'.*'weight'"):
        get_sensitivity_of_nodes(setup.engine, node_type="weights")
    with pytest.raises(PTQError, match="unknown metric 'cosine-sim'"):
        get_sensitivity_of_nodes(setup.engine, ["cosine-sim"])
    with pytest.raises(PTQError, match="unknown output 'probs'.*'prob'"):
        get_sensitivity_of_nodes(setup.engine, output_node="probs")
    with pytest.raises(PTQError, match="unknown output 'zzzz'; the model's outputs are 'prob'$"):
        get_sensitivity_of_nodes(setup.engine, output_node="zzzz")
    # a weak likeness to an internal tensor is no suggestion beside the model's outputs
    assert "conv1" in setup.engine.qmodel.normal and closest("xcnv", ["conv1"])
    with pytest.raises(PTQError, match="unknown output 'xcnv'; the model's outputs are 'prob'$"):
        get_sensitivity_of_nodes(setup.engine, output_node="xcnv")


def test_output_slice(setup):
    result = get_sensitivity_of_nodes(setup.engine, ["cosine-similarity", "mse"], node_type="activation",
                                      output_node="cls=prob[:, 4:]",
                                      interested_nodes=["logits_QuantizeLinear", "r2_QuantizeLinear"])
    assert result.outputs == ["cls"]
    for name, values in result.items():
        ref, test = setup.pooled([name], take=lambda a: a[:, 4:])
        for metric in ("cosine-similarity", "mse"):
            assert_metric(metric, values[metric], ref, test)
        # and the slice is not the whole tensor
        assert values["mse"] != pytest.approx(mse(*setup.pooled([name])), rel=1e-3)


def test_every_output_is_compared_and_the_worst_leads(zoo):
    s = Setup(zoo, "two_outputs")
    result = get_sensitivity_of_nodes(s.engine, ["cosine-similarity"], node_type="activation",
                                      interested_nodes=["a2_QuantizeLinear", "x_QuantizeLinear"])
    assert result.outputs == ["prob", "r2"]
    for name, values in result.items():
        per_output = result.details[name]["per_output"]
        assert set(per_output) == {"prob", "r2"}
        for out in ("prob", "r2"):
            assert_metric("cosine-similarity", per_output[out]["cosine-similarity"], *s.pooled([name], out))
        assert values["cosine-similarity"] == min(p["cosine-similarity"] for p in per_output.values())


def test_json_round_trip(setup, tmp_path):
    result = get_sensitivity_of_nodes(setup.engine, ["cosine-similarity", "sqnr"], node_type="activation")
    # an infinite SQNR (an output that quantization leaves untouched) must survive JSON too
    first = next(iter(result))
    result[first]["sqnr"] = math.inf
    path = result.save(tmp_path / "deep" / "sens.json")
    back = Sensitivity.load(path)
    assert list(back) == list(result) and dict(back) == dict(result)
    assert back.details == result.details
    assert (back.node_type, back.metrics, back.outputs, back.samples) == (
        "activation", ["cosine-similarity", "sqnr"], ["prob"], len(setup.feeds))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(PTQError, match="broken.json.*cannot be read"):
        Sensitivity.load(tmp_path / "broken.json")
    # the seed's own snippet, json.dumps of the returned dict, loads as the ranking it holds
    (tmp_path / "seed.json").write_text(json.dumps(dict(result)))
    seed = Sensitivity.load(tmp_path / "seed.json")
    assert list(seed) == list(result) and dict(seed) == dict(result) and seed.metrics == ["cosine-similarity", "sqnr"]


def test_names_spelt_like_special_floats_load_as_names(setup, tmp_path):
    """json_restore turned every "inf" or "nan" string of a saved ranking's details into a
    float: a node feeding an operator named "inf", or reading a tensor named "nan", came back
    feeding inf and reading nan."""
    result = get_sensitivity_of_nodes(setup.engine, ["cosine-similarity"], node_type="activation")
    first = next(iter(result))
    result.details[first].update(feeds=["inf", "-inf"], input="nan", threshold=math.inf)
    back = Sensitivity.load(result.save(tmp_path / "sens.json"))
    assert back.details[first]["feeds"] == ["inf", "-inf"] and back.details[first]["input"] == "nan"
    assert back.details[first]["threshold"] == math.inf  # a measurement: a float again
    assert back.details == result.details


def test_verbose_prints_the_seed_table(setup, capsys):
    result = get_sensitivity_of_nodes(setup.engine, ["cosine-similarity"], node_type="activation",
                                      verbose=True)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "node" in line and "|" in line)
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "node", "cosine-similarity", "threshold", "bit", "feeds"]
    c = setup.engine.qmodel.calibration["c2_QuantizeLinear"]
    row = next(line for line in out.splitlines() if "| c2_QuantizeLinear " in line)
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert float(cells[2]) == pytest.approx(c.threshold, rel=1e-5) and cells[3] == "8"
    assert cells[4] == "add2"
    # rows in ranking order
    names = [line.split("|")[1].strip() for line in out.splitlines()
             if line.startswith("| ") and "QuantizeLinear" in line]
    assert names == list(result)


def test_model_path_and_float_model_arguments(zoo):
    """The public path form compiles its own engine (default optimisation) and agrees."""
    s = Setup(zoo, "dq_weights")
    result = get_sensitivity_of_nodes(s.qpath, ["cosine-similarity"], zoo.data("dq_weights"),
                                      node_type="weight", float_model=s.fpath, data_num=2)
    assert result.samples == 2 and len(result) == 6
    name = next(iter(result))
    ref = np.concatenate([o["prob"].ravel() for o in s.float_outputs()[:2]]).astype(np.float64)
    test = np.concatenate([o["prob"].ravel() for o in s.outputs([name])[:2]]).astype(np.float64)
    # only a weight is quantized: no activation rounding step can flip between levels
    assert_metric("cosine-similarity", result[name]["cosine-similarity"], ref, test)


def test_a_weight_stored_quantized_says_to_pass_the_float_model(zoo):
    engine = Engine(zoo.qdq("dq_weights"), zoo.data("dq_weights"), optimization="disable")
    with pytest.raises(PTQError, match="'w1_DequantizeLinear'.*stored already quantized.*float model"):
        get_sensitivity_of_nodes(engine, node_type="weight", interested_nodes=["w1_DequantizeLinear"])
    # every weight: an empty ranking would read as "no weight matters"
    with pytest.raises(PTQError, match="all 6 weights .*stored already quantized.*float model"):
        get_sensitivity_of_nodes(engine, node_type="weight")
    # a float model given that matches none of them is not asked for again
    other = Engine(zoo.qdq("dq_weights"), zoo.data("dq_weights"), optimization="disable",
                   float_model=zoo.float("dq_weights"))
    for c in other.qmodel.of_kind("weight"):
        c.float_weight = None
    with pytest.raises(PTQError, match="all 6 weights .*matched by no weight of the float model given.*check that it is"):
        get_sensitivity_of_nodes(other, node_type="weight")


def test_output_node_can_be_an_inner_node(setup):
    """A normal node name compares its output tensor (here add2's 'a2'), not the model's."""
    result = get_sensitivity_of_nodes(setup.engine, ["cosine-similarity"], node_type="activation",
                                      output_node="add2", interested_nodes=["c2_QuantizeLinear", "x_QuantizeLinear"])
    assert result.outputs == ["a2"]
    ref = setup.outputs((), ["a2"])
    for name, values in result.items():
        test = setup.outputs([name], ["a2"])
        r = np.concatenate([o["a2"].ravel() for o in ref]).astype(np.float64)
        t = np.concatenate([o["a2"].ravel() for o in test]).astype(np.float64)
        assert_metric("cosine-similarity", values["cosine-similarity"], r, t)


def test_outputs_that_are_not_float_are_left_out_of_the_default_metric(tmp_path):
    """A label (ArgMax) or a mask passed through is no tensor a cosine weighs: by default the
    metric reads the float outputs only; a model with no float output keeps them all."""
    from onnx import TensorProto, helper

    from pytest_ptq.model import QuantModel
    from pytest_ptq.outputs import parse_outputs

    model = onnx.load(str(builders.conv_net(tmp_path / "f.onnx")))
    model.graph.node.append(helper.make_node("ArgMax", ["prob"], ["label"], axis=1, name="label"))
    model.graph.output.append(helper.make_tensor_value_info("label", TensorProto.INT64, [1, 1]))
    onnx.save(model, str(tmp_path / "f2.onnx"))
    data = builders.samples(2)
    qpath = builders.quantize(tmp_path / "f2.onnx", tmp_path / "q.onnx", data)
    result = get_sensitivity_of_nodes(Engine(qpath, data), node_type="activation", progress=False)
    assert result.outputs == ["prob"]
    with pytest.warns(UserWarning, match="output 'label' holds int64 values"):  # asked for: kept, and warned
        assert [s.name for s in parse_outputs("label", QuantModel(qpath))] == ["label"]
    # nothing float left: the integer output is what there is
    model.graph.output.remove(model.graph.output[0])
    onnx.save(model, str(tmp_path / "f3.onnx"))
    qpath = builders.quantize(tmp_path / "f3.onnx", tmp_path / "q3.onnx", data)
    assert [s.name for s in parse_outputs(None, QuantModel(qpath))] == ["label"]


def test_an_engine_with_other_data_or_float_model_passed_beside_it_is_refused(tmp_path):
    """An Engine analyses the data and float model it was built with: other ones passed beside
    it were silently ignored, so a ranking said to be on held-out data was on calibration data."""
    data = builders.samples(4)
    fp = builders.conv_net(tmp_path / "f.onnx")
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    folder = builders.save_folder(data, tmp_path / "calib")
    engine = Engine(q, str(folder))
    base = get_sensitivity_of_nodes(engine, node_type="activation")
    # the same data, however named, is its own
    for same in (str(folder), folder, engine.data):
        assert get_sensitivity_of_nodes(engine, node_type="activation", calibrated_data=same) == base
    held = {"x": [a * 10 for a in builders.samples(3, seed=9)["x"]]}
    with pytest.raises(PTQError, match="the Engine given analyses its own calibration data .*calib"):
        get_sensitivity_of_nodes(engine, node_type="activation", calibrated_data=held)
    with pytest.raises(PTQError, match=r"the Engine given compares against its own float model \(none\)"):
        get_sensitivity_of_nodes(engine, node_type="activation", float_model=str(fp))
    mapped = Engine(q, data)
    assert get_sensitivity_of_nodes(mapped, node_type="activation", calibrated_data=data).samples == 4
    with pytest.raises(PTQError, match="its own calibration data"):
        get_sensitivity_of_nodes(mapped, node_type="activation", calibrated_data=held)


def test_a_shape_reader_is_no_node_to_rank(tmp_path):
    """A Shape reading a quantized tensor (after every layer of an exported transformer) was
    ranked with its input pair's figure and advised "keep in higher precision"."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(2)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    engine = Engine(str(q), data)
    assert "shape" in engine.qmodel.normal and engine.qmodel.normal["shape"].quantizers  # it reads a pair
    ranked = get_sensitivity_of_nodes(engine, node_type="node")
    assert "shape" not in ranked and "reshape" in ranked
    with pytest.raises(PTQError, match=r"node 'shape' \(Shape\) reads only the shape of its input"):
        get_sensitivity_of_nodes(engine, node_type="node", interested_nodes=["shape"])


def test_per_sample_values_are_the_worst_output_of_each_sample(zoo):
    """details[node]["per_sample"] holds, per sample, the worst output's own value (the lowest
    cosine, the largest mse) from plain onnxruntime runs of the model with only that pair."""
    s = Setup(zoo, "two_outputs")
    result = get_sensitivity_of_nodes(s.engine, ["cosine-similarity", "mse"], node_type="activation")
    outputs = ("prob", "r2")
    second_is_worse = 0
    for name in result:
        got = s.outputs([name])
        per_sample = result.details[name]["per_sample"]
        assert len(per_sample["cosine-similarity"]) == len(s.feeds)
        for i, (ref, test) in enumerate(zip(s.float_outputs(), got)):
            cos = {o: cosine(ref[o].ravel().astype(np.float64), test[o].ravel().astype(np.float64)) for o in outputs}
            err = {o: mse(ref[o].ravel().astype(np.float64), test[o].ravel().astype(np.float64)) for o in outputs}
            assert per_sample["cosine-similarity"][i] == pytest.approx(min(cos.values()), abs=1e-6)
            assert per_sample["mse"][i] == pytest.approx(max(err.values()), rel=1e-3, abs=1e-12)
            second_is_worse += cos["r2"] < cos["prob"] - 1e-5
    assert second_is_worse  # the test tells the worst output from the first one

"""A ranking row whose quantization reaches only model outputs holding no values (a Slice
selecting nothing, a detector's [0, 8] boxes): its metrics read no values as a perfect score,
which no comparison measured. Such rows have no figure on any face; the rest still match
plain onnxruntime sessions on rewired models."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq import cli
from pytest_ptq.confidence import ranking_confidence
from pytest_ptq.sensitivity import Sensitivity, get_sensitivity_of_nodes
from pytest_ptq.errors import PTQError
from test_plugin import plugin_args

N = 4


@pytest.fixture(scope="module")
def empty_tail(tmp_path_factory):
    """y = x @ w1 and e = (x @ w2)[0:0], quantized by onnxruntime: every pair of the second
    branch but x's changes only e, which holds no values."""
    root = tmp_path_factory.mktemp("empty_tail")
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["y"], name="m1"),
             helper.make_node("MatMul", ["x", "w2"], ["m2"], name="m2"),
             helper.make_node("Slice", ["m2", "start", "end", "axes"], ["e"], name="sl")]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w2"),
             *(numpy_helper.from_array(np.array([0], np.int64), n) for n in ("start", "end", "axes"))]
    graph = helper.make_graph(nodes, "empty_tail", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
                               helper.make_tensor_value_info("e", TensorProto.FLOAT, [0, 8])], inits)
    builders.save_model(graph, root / "float.onnx")
    data = {"x": [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(N)]}
    builders.quantize(root / "float.onnx", root / "model.onnx", data)
    builders.save_folder(data, root / "calib")
    return {"root": root, "model": root / "model.onnx", "data": data,
            "feeds": [{"x": a} for a in data["x"]]}


def brute_force(setup, keep):
    """The worst pooled cosine over the outputs holding values, only ``keep`` quantized, from
    plain onnxruntime sessions on rewired models; and whether any such output changed."""
    ref = builders.run_model(builders.rewire(setup["model"], keep=()), setup["feeds"])
    got = builders.run_model(builders.rewire(setup["model"], keep=set(keep)), setup["feeds"])
    held = [k for k in ref[0] if ref[0][k].size]
    assert held == ["y"] and ref[0]["e"].shape == (0, 8)  # the model is what the tests are about
    changed = any(not np.array_equal(r[k], g[k]) for r, g in zip(ref, got) for k in held)
    return builders.worst_cosine([{k: r[k] for k in held} for r in ref],
                                 [{k: g[k] for k in held} for g in got]), changed


@pytest.mark.parametrize("node_type, empty_only", [
    ("weight", ["w2_QuantizeLinear"]),
    ("activation", ["m2_QuantizeLinear", "e_QuantizeLinear"]),
    ("node", ["sl"]),
])
def test_rows_reaching_only_empty_outputs_have_no_figure(empty_tail, tmp_path, node_type, empty_only):
    sens = get_sensitivity_of_nodes(str(empty_tail["model"]), calibrated_data=empty_tail["data"], node_type=node_type)
    assert list(sens)[-len(empty_only):] == empty_only  # last: no figure to sort by
    for name in sens:
        keep = sens.details[name].get("calibration_nodes", [name])
        expected, changed = brute_force(empty_tail, keep)
        if name in empty_only:
            assert not changed  # it reaches no output that holds values: nothing was compared
            assert sens[name]["cosine-similarity"] is None
            assert sens.details[name]["no_values"] == "changes only 'e' (shape [0, 8]), which holds no values on " \
                                                      "any sample"
        else:
            assert changed and sens[name]["cosine-similarity"] == pytest.approx(expected, abs=1e-6)
        assert sens.details[name]["per_output"]["e"] == {"cosine-similarity": None}
    table = sens.table()
    for name in empty_only:
        assert any(line.startswith(f"| {name} ") and "| no values compared |" in line for line in table.splitlines())
    assert "1.000000" not in table
    assert f"no values compared: quantizing {', '.join(empty_only)} alone changes only 'e' (shape [0, 8])" in table
    saved = json.loads(sens.save(tmp_path / "s.json").read_text())
    assert all(saved["values"][n] == {"cosine-similarity": None} for n in empty_only)
    assert all(saved["details"][n]["no_values"] for n in empty_only)
    back = Sensitivity.load(tmp_path / "s.json")
    assert list(back) == list(sens) and back.table() == table


def test_runall_shows_no_figure_and_no_advice_for_them(empty_tail, tmp_path, capsys):
    out = tmp_path / "ra"
    rc = cli.main(["runall", str(empty_tail["model"]), str(empty_tail["root"] / "calib"), "-s", str(out),
                   "--quiet"])
    assert rc == 0
    md = (out / "summary.md").read_text()
    rows = {line.split("|")[2].strip(" `"): line for line in md.splitlines() if line.startswith("| ")
            and "_QuantizeLinear" in line}
    for name in ("w2_QuantizeLinear", "m2_QuantizeLinear", "e_QuantizeLinear"):
        assert "| no values compared | - | no values compared: quantizing it alone changes only 'e'" in rows[name]
    summary = json.loads((out / "summary.json").read_text())
    nodes = {it["node"]: it for it in summary["verdict"]["nodes"]}
    for name in ("w2_QuantizeLinear", "m2_QuantizeLinear", "e_QuantizeLinear"):
        assert nodes[name]["cosine-similarity"] is None and nodes[name]["try"] == []
    assert not any("m2_QuantizeLinear" in step for step in summary["verdict"]["next_steps"])


def test_the_nodes_check_leaves_them_out_and_says_so(empty_tail, pytester):
    for name in ("model.onnx",):
        shutil.copy(empty_tail["root"] / name, pytester.path / name)
    shutil.copytree(empty_tail["root"] / "calib", pytester.path / "calib")
    sens = get_sensitivity_of_nodes(str(empty_tail["model"]), calibrated_data=empty_tail["data"],
                                    node_type="activation")
    worst = list(sens)[0]
    expected, _ = brute_force(empty_tail, [worst])
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_nodes(ptq):
            result = ptq.check_nodes(0.9999, node_type="activation")
            assert result.passed and result.nodes == 2 and result.offenders == []
            assert result.unmeasured == ["m2_QuantizeLinear", "e_QuantizeLinear"]
            assert result.worst[0] == {worst!r} and abs(result.worst[1] - {expected!r}) < 1e-6
            print("SUMMARY", result.summary)
    """)
    result = pytester.runpytest_inprocess(*plugin_args(), "-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*SUMMARY all 2 activation nodes of model.onnx meet cosine-similarity >= 0.999900 with only that node "
        "quantized (most sensitive *); 2 left out, whose quantization changes no value compared "
        "('m2_QuantizeLinear', 'e_QuantizeLinear'): no values compared"])


def test_rows_reaching_none_of_the_outputs_compared_have_no_figure(empty_tail):
    # ranked on y alone, the second branch's pairs change nothing compared (e is not even compared)
    sens = get_sensitivity_of_nodes(str(empty_tail["model"]), calibrated_data=empty_tail["data"],
                                    node_type="activation", output_node="y")
    unmeasured = ["m2_QuantizeLinear", "e_QuantizeLinear"]
    assert list(sens)[-2:] == unmeasured
    for name in sens:
        expected, changed = brute_force(empty_tail, [name])
        if name in unmeasured:
            assert not changed
            assert sens[name]["cosine-similarity"] is None
            assert sens.details[name]["no_values"] == "changes none of the outputs compared ('y')"
        else:
            assert changed and sens[name]["cosine-similarity"] == pytest.approx(expected, abs=1e-6)
    table = sens.table()
    assert "1.000000" not in table
    assert ("no values compared: quantizing m2_QuantizeLinear, e_QuantizeLinear alone changes none of the outputs "
            "compared ('y'); listed last") in table


def _cosine(a, b):
    a, b = (np.asarray(v, np.float64).ravel() for v in (a, b))
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def test_confidence_leaves_out_rows_with_no_values_compared(empty_tail):
    sens = get_sensitivity_of_nodes(str(empty_tail["model"]), calibrated_data=empty_tail["data"],
                                    node_type="activation")
    unmeasured = ["m2_QuantizeLinear", "e_QuantizeLinear"]
    for name in unmeasured:  # no figure per sample either: 1.0 read as the steadiest node
        assert sens.details[name]["per_sample"]["cosine-similarity"] == [None] * N
    conf = ranking_confidence(sens, k=2, resamples=50)
    assert conf.left_out == unmeasured and set(conf.nodes) == {"x_QuantizeLinear", "y_QuantizeLinear"}
    ref = builders.run_model(builders.rewire(empty_tail["model"], keep=()), empty_tail["feeds"])
    for name, v in conf.nodes.items():  # each sample's own cosine of y, from plain sessions
        got = builders.run_model(builders.rewire(empty_tail["model"], keep={name}), empty_tail["feeds"])
        per_sample = [_cosine(r["y"], g["y"]) for r, g in zip(ref, got)]
        assert v["mean"] == pytest.approx(np.mean(per_sample), abs=1e-6)
        assert v["min"] == pytest.approx(min(per_sample), abs=1e-6)
    assert conf.message.endswith("; 2 left out, whose quantization changes no value compared ('m2_QuantizeLinear', "
                                 "'e_QuantizeLinear'): no values compared")
    only_e = get_sensitivity_of_nodes(str(empty_tail["model"]), calibrated_data=empty_tail["data"],
                                      node_type="activation", output_node="e")
    with pytest.raises(PTQError, match="no node of the sensitivity result has a figure"):
        ranking_confidence(only_e)


def _in_pytester(empty_tail, pytester):
    shutil.copy(empty_tail["model"], pytester.path / "model.onnx")
    shutil.copytree(empty_tail["root"] / "calib", pytester.path / "calib")


def test_the_outputs_check_does_not_judge_an_output_holding_no_values(empty_tail, pytester):
    _in_pytester(empty_tail, pytester)
    ref = builders.run_model(builders.rewire(empty_tail["model"], keep=()), empty_tail["feeds"])
    got = builders.run_model(empty_tail["model"], empty_tail["feeds"])
    y = builders.pooled_cosine([r["y"] for r in ref], [g["y"] for g in got])
    pytester.makepyfile(f"""
        import pytest
        from pytest_ptq.checks import ContractFailed

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_outputs(ptq):
            result = ptq.check_outputs(0.99)
            assert result.passed and result.unjudged == {{"e": [0, 8]}}
            assert abs(result.values["y"] - {y!r}) < 1e-6 and result.values["e"] is None
            assert [m["output"] for m in result.measures()] == ["y"] and "e.cosine-similarity" not in result.figures()
            print("SUMMARY", result.summary)
            print("DETAILS", result.details.replace("\\n", " "))
            strict = ptq.check_outputs({(1 + y) / 2!r})  # y fails; e neither passes nor fails
            assert not strict.passed and strict.failing == ["y"]
            print("FAILS", strict.summary)
            ptq.assert_outputs({{"y": 0.99, "e": 0.99}})

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_only_empty(ptq):
            ptq.check_outputs({{"e": 0.99}})

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_nodes_only_empty(ptq):
            ptq.check_nodes(0.99, node_type="activation", outputs=["e"])
    """)
    result = pytester.runpytest_inprocess(*plugin_args(), "-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()  # fnmatch would read '[0, 8]' as a character class
    for said in [
        f"SUMMARY output cosine-similarity meets every threshold (worst 'y' {y:.6f} >= 0.990000); 'e' (shape [0, 8]) "
        "not judged: it holds no values on any sample, no values compared [model.onnx, 4 sample(s) of calib]",
        "| e      | no values compared | >= 0.990000 | not judged |",
        f"FAILS output cosine-similarity fails for 1 of 1 output(s): 'y' {y:.6f} (needs >= {(1 + y) / 2:.6f}); "
        "'e' (shape [0, 8]) not judged",
        "every output compared ('e' (shape [0, 8])) holds no values on any sample of calib: no values were "
        "compared, so nothing can be judged; compare outputs that hold values, or use data on which these do",
        "no activation node of model.onnx can be judged: quantizing any of them alone changes only 'e' "
        "(shape [0, 8]), which holds no values on any sample (no values compared); check outputs that hold values",
    ]:
        assert said in out
    assert not any("1.000000" in line for line in out.splitlines() if any(w in line for w in ("SUMMARY", "DETAILS",
                                                                                             "FAILS")))


def test_runall_refuses_a_verdict_on_outputs_holding_no_values(empty_tail, tmp_path, capsys):
    rc = cli.main(["runall", str(empty_tail["model"]), str(empty_tail["root"] / "calib"), "-s", str(tmp_path / "ra"),
                   "--quiet", "-o", "e"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "every output compared ('e' (shape [0, 8])) holds no values on any sample of " in err


# -- cumulative error curves --------------------------------------------------------------------
def _pooled_y_and_m2(setup, keep):
    """Pooled cosines of y and of m2 (the MatMul's output, before its pair) with only ``keep``
    quantized, from plain onnxruntime sessions on rewired models."""
    ref = builders.run_model(builders.rewire(setup["model"], keep=(), outputs=("m2",)), setup["feeds"])
    got = builders.run_model(builders.rewire(setup["model"], keep=set(keep), outputs=("m2",)), setup["feeds"])
    assert all(r["e"].size == 0 for r in ref)
    return [builders.pooled_cosine([r[t] for r in ref], [g[t] for g in got]) for t in ("y", "m2")]


def test_curves_give_no_point_to_a_node_reading_no_values(empty_tail, tmp_path, capsys):
    from pytest_ptq.curves import Curves, marked, plot_curves

    rc = cli.main(["plot-acc-error", str(empty_tail["model"]), str(empty_tail["root"] / "calib"), "-q", "weight",
                   "activation", "-s", str(tmp_path), "--average", "--json", str(tmp_path / "c.json"), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["nodes"] == ["m1", "m2", "sl"] and saved["no_values"] == {"sl": {"e": [0, 8]}}
    for label, keep in saved["configs"].items():  # m1 reads y after its pair, m2 its MatMul's output
        y, m2 = _pooled_y_and_m2(empty_tail, keep)
        assert saved["values"][label][:2] == pytest.approx([y, m2], abs=1e-6)
        assert saved["values"][label][2] is None  # was 1.0: e holds no values
        assert saved["means"][label] == pytest.approx([y, (y + m2) / 2, None], abs=1e-6)
        assert f"{label}: cosine-similarity at the outputs y {y:.6g}, e no values compared; worst at " in out
    assert saved["local"][2] is None  # was 1.0
    y, _ = _pooled_y_and_m2(empty_tail, ["w1_QuantizeLinear", "x_QuantizeLinear", "y_QuantizeLinear"])
    assert saved["local"][0] == pytest.approx(y, abs=1e-6)  # m1's own pairs, nothing upstream
    assert "note: 'sl' reads 'e' (shape [0, 8]), which holds no values on any sample: no point" in out
    assert "sl (" not in out  # was "worst at m2 (0.999974), m1 (0.999984), sl (1)"
    back = Curves(**saved)  # read back from its JSON, it draws and marks the same
    assert 2 not in marked(back) and [n for n, _ in back.worst("weight only")] == ["m2", "m1"]
    assert plot_curves(back, tmp_path / "back.png").stat().st_size > 0


def test_runall_curves_have_no_point_for_it(empty_tail, tmp_path):
    out = tmp_path / "ra"
    assert cli.main(["runall", str(empty_tail["model"]), str(empty_tail["root"] / "calib"), "-s", str(out),
                     "--quiet"]) == 0
    curves = json.loads((out / "summary.json").read_text())["curves"]
    assert len(curves["values"]) == 3  # weights only, activations only, everything
    for label, ys in curves["values"].items():
        assert ys[:2] == pytest.approx(_pooled_y_and_m2(empty_tail, curves["configs"][label]), abs=1e-6)
        assert ys[2] is None  # was 1.0
    assert curves["local"][2] is None
    assert "'sl' reads 'e' (shape [0, 8]), which holds no values on any sample: no point" in \
        (out / "summary.md").read_text()


# -- other figures judged on outputs: refused where every output compared holds none --------------
NO_VALUES_SAID = "every output compared ('e' (shape [0, 8])) holds no values on any sample of "


@pytest.fixture(scope="module")
def only_empty(tmp_path_factory):
    """e = (x @ w2)[0:0], the model's only output, quantized by onnxruntime."""
    root = tmp_path_factory.mktemp("only_empty")
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w2"], ["m2"], name="m2"),
             helper.make_node("Slice", ["m2", "start", "end", "axes"], ["e"], name="sl")]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w2"),
             *(numpy_helper.from_array(np.array([0], np.int64), n) for n in ("start", "end", "axes"))]
    graph = helper.make_graph(nodes, "only_empty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [0, 8])], inits)
    builders.save_model(graph, root / "float.onnx")
    data = {"x": [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(N)]}
    builders.quantize(root / "float.onnx", root / "model.onnx", data)
    builders.save_folder(data, root / "calib")
    builders.save_folder({"x": [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(3)]}, root / "held")
    return root


@pytest.mark.parametrize("remedy", ["float", "int16"])
def test_remedy_search_refuses_outputs_holding_no_values(empty_tail, remedy):
    from pytest_ptq.remedy import suggest_remedy

    # was: "cosine-similarity 1 ... meets the target 0.99 with 0 node(s) kept in float (baseline 1)"
    with pytest.raises(PTQError, match=re.escape(NO_VALUES_SAID)):
        suggest_remedy(str(empty_tail["model"]), empty_tail["data"], target=0.99, output_node="e", remedy=remedy,
                       progress=False)


def test_stages_refuse_outputs_holding_no_values(empty_tail):
    from pytest_ptq.stages import localize_stages

    with pytest.raises(PTQError, match=re.escape(NO_VALUES_SAID)):
        localize_stages(str(empty_tail["root"] / "float.onnx"), str(empty_tail["model"]),
                        str(empty_tail["root"] / "calib"), output_node="e", progress=False)


def test_the_data_check_refuses_outputs_holding_no_values(empty_tail, only_empty):
    from pytest_ptq.datacheck import check_data

    with pytest.raises(PTQError, match=re.escape(NO_VALUES_SAID)):
        check_data(str(only_empty / "model.onnx"), str(only_empty / "calib"), heldout=str(only_empty / "held"),
                   progress=False)
    with pytest.raises(PTQError, match=re.escape(NO_VALUES_SAID)):
        check_data(str(empty_tail["model"]), str(empty_tail["root"] / "calib"), heldout=str(only_empty / "held"),
                   outputs=["e"], progress=False)


def test_the_producer_check_score_refuses_outputs_holding_no_values(empty_tail, only_empty):
    from pytest_ptq.engine import Engine
    from pytest_ptq.remedy.producer_check import output_score

    with pytest.raises(PTQError, match=re.escape(NO_VALUES_SAID)):
        output_score(Engine(str(only_empty / "model.onnx"), str(only_empty / "calib")),
                     str(only_empty / "float.onnx"))(None)
    # beside an output holding values, that one is scored: the fully quantized model's y
    ref = builders.run_model(empty_tail["root"] / "float.onnx", empty_tail["feeds"])
    got = builders.run_model(builders.rewire(empty_tail["model"], keep=set(builders.qdq_pairs(empty_tail["model"]))),
                             empty_tail["feeds"])
    score = output_score(Engine(str(empty_tail["model"]), empty_tail["data"]), str(empty_tail["root"] / "float.onnx"))
    assert score(None)["calibration"] == pytest.approx(builders.pooled_cosine([r["y"] for r in ref],
                                                                              [g["y"] for g in got]), abs=1e-6)


# e holds rows on these samples only: Compress keeps the rows of x @ w2 where g > 0
RAGGED_SIGNS = [1, -1, 1, 1, -1, -1]


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    """y = x @ w1 and e = Compress(x @ w2, g > 0), quantized by onnxruntime: e holds values on
    some samples and none on the others, so w2's pair changes values compared on some samples
    only; g, read by Greater alone, stays float."""
    root = tmp_path_factory.mktemp("ragged")
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["y"], name="m1"),
             helper.make_node("MatMul", ["x", "w2"], ["m2"], name="m2"),
             helper.make_node("Greater", ["g", "zero"], ["keep"], name="gt"),
             helper.make_node("Compress", ["m2", "keep"], ["e"], name="cp", axis=0)]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(0, np.float32), "zero")]
    graph = helper.make_graph(nodes, "ragged", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                                                helper.make_tensor_value_info("g", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
                               helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", 8])], inits)
    builders.save_model(graph, root / "float.onnx")
    data = {"x": [rng.standard_normal((4, 16)).astype(np.float32) for _ in RAGGED_SIGNS],
            "g": [s * (0.5 + np.abs(rng.standard_normal(4))).astype(np.float32) for s in RAGGED_SIGNS]}
    builders.quantize(root / "float.onnx", root / "model.onnx", data)
    feeds = [{"x": x, "g": g} for x, g in zip(data["x"], data["g"])]
    return {"root": root, "model": root / "model.onnx", "data": data, "feeds": feeds}


def per_sample_brute_force(setup, keep):
    """Each sample's worst cosine over the outputs holding values on it, only ``keep``
    quantized, from plain onnxruntime sessions on rewired models; None on a sample where no
    output that ``keep`` changes on some sample holds values."""
    ref = builders.run_model(builders.rewire(setup["model"], keep=()), setup["feeds"])
    got = builders.run_model(builders.rewire(setup["model"], keep=set(keep)), setup["feeds"])
    assert [r["e"].size > 0 for r in ref] == [s > 0 for s in RAGGED_SIGNS]  # the model is what the test is about
    changed = {k for r, g in zip(ref, got) for k in r if not np.array_equal(r[k], g[k])}
    out = []
    for r, g in zip(ref, got):
        held = [k for k in r if r[k].size]
        out.append(min(_cosine(r[k], g[k]) for k in held) if changed & set(held) else None)
    return out


def test_a_sample_on_which_the_outputs_a_node_reaches_hold_no_values_has_no_figure_of_it(ragged):
    sens = get_sensitivity_of_nodes(str(ragged["model"]), calibrated_data=ragged["data"], node_type="weight")
    expected = {name: per_sample_brute_force(ragged, [name]) for name in sens}
    assert [v is None for v in expected["w2_QuantizeLinear"]] == [s < 0 for s in RAGGED_SIGNS]
    for name in sens:  # was: 1.0 on the samples where e held no rows, a perfect score nothing measured
        got = sens.details[name]["per_sample"]["cosine-similarity"]
        assert [v is None for v in got] == [v is None for v in expected[name]], name
        assert [v for v in got if v is not None] == pytest.approx([v for v in expected[name] if v is not None],
                                                                  abs=1e-6), name
    conf = ranking_confidence(sens, k=1, resamples=50)
    for name, v in conf.nodes.items():  # pooled over the samples judged only
        judged = [x for x in expected[name] if x is not None]
        assert v["samples"] == len(judged)
        assert v["mean"] == pytest.approx(np.mean(judged), abs=1e-6)
        assert (v["min"], v["max"]) == pytest.approx((min(judged), max(judged)), abs=1e-6)
    means = {name: np.mean([x for x in expected[name] if x is not None]) for name in sens}
    assert conf.top_k == [min(means, key=means.get)]
    assert "'w2_QuantizeLinear' judged on fewer samples ('samples')" in conf.message
    saved = Sensitivity.from_dict(json.loads(json.dumps(sens.to_dict())))
    assert saved.details["w2_QuantizeLinear"]["per_sample"] == sens.details["w2_QuantizeLinear"]["per_sample"]



def test_a_slice_of_an_output_holding_no_rows_on_some_samples_is_judged_on_the_others(ragged):
    """A slice of the columns of e (a detector's box coordinates, 'boxes=out[:, 0:4]'), which
    holds no rows on some samples: the slice was refused on those ("selects no values of 'e',
    of shape [0, 8] here; slice within that shape"), though it is within the shape and the
    whole output is judged on the samples holding values. It is now judged as the whole is: on
    those samples, as plain onnxruntime sessions on rewired models give it."""
    sens = get_sensitivity_of_nodes(str(ragged["model"]), calibrated_data=ragged["data"], node_type="weight",
                                    output_node=["head=e[:, 0:2]"])
    ref = builders.run_model(builders.rewire(ragged["model"], keep=()), ragged["feeds"])
    got = builders.run_model(builders.rewire(ragged["model"], keep={"w2_QuantizeLinear"}), ragged["feeds"])
    held = [i for i, r in enumerate(ref) if r["e"].size]
    assert 0 < len(held) < len(ref)  # the case this test is about
    pooled = builders.pooled_cosine([ref[i]["e"][:, 0:2] for i in held], [got[i]["e"][:, 0:2] for i in held])
    assert sens.outputs == ["head"]
    assert sens["w2_QuantizeLinear"]["cosine-similarity"] == pytest.approx(pooled, abs=1e-6)
    per_sample = sens.details["w2_QuantizeLinear"]["per_sample"]["cosine-similarity"]
    assert [v is None for v in per_sample] == [not r["e"].size for r in ref]
    assert [v for v in per_sample if v is not None] == pytest.approx(
        [_cosine(ref[i]["e"][:, 0:2], got[i]["e"][:, 0:2]) for i in held], abs=1e-6)
    # w1 changes y alone, which the slice does not read: no figure
    assert sens["w1_QuantizeLinear"]["cosine-similarity"] is None
    # a slice selecting none of the rows held (along the axis the model leaves open) is still refused
    with pytest.raises(PTQError, match=r"output slice 'e\[9:\]' selects no values of 'e', of shape \[4, 8\] here"):
        get_sensitivity_of_nodes(str(ragged["model"]), calibrated_data=ragged["data"], node_type="weight",
                                 output_node=["e[9:]"])

def test_stages_give_no_per_sample_figure_where_the_outputs_hold_no_values(ragged):
    from pytest_ptq.stages import localize_stages

    report = localize_stages(str(ragged["root"] / "float.onnx"), str(ragged["model"]), ragged["data"],
                             output_node="e", progress=False)
    ref = builders.run_model(ragged["root"] / "float.onnx", ragged["feeds"])
    got = builders.run_model(builders.rewire(ragged["model"], keep=set(builders.qdq_pairs(ragged["model"]))),
                             ragged["feeds"])
    fake = next(s for s in report.stages if s["stage"] == "fake-quant")["per_sample"]["cosine-similarity"]
    want = [_cosine(r["e"], g["e"]) if r["e"].size else None for r, g in zip(ref, got)]
    assert [v is None for v in fake] == [v is None for v in want]  # was: 1.0 on the empty samples
    assert [v for v in fake if v is not None] == pytest.approx([v for v in want if v is not None], abs=1e-5)


def _screened(setup, node_type, order, **kw):
    from pytest_ptq.engine import Engine
    from pytest_ptq.metrics import get_metrics
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.screening import screen

    engine = Engine(str(setup["model"]), setup["data"])
    sens, how = screen(engine, [node_type], get_metrics(["cosine-similarity"]), parse_outputs(None, engine.qmodel),
                       order, **kw)
    return sens[node_type], how


def test_screening_samples_holding_no_values_are_not_every_sample(ragged):
    # screened on samples 1 and 4 (the first and last of the order), on which e holds no rows
    order = [1, 5, 0, 2, 3, 4]
    s, how = _screened(ragged, "weight", order, rank_samples=2, confirm=1)
    assert how.samples == 2 and [RAGGED_SIGNS[i] for i in how.indices] == [-1, -1]
    ref = builders.run_model(builders.rewire(ragged["model"], keep=()), ragged["feeds"])
    for name in s:  # each on every sample, pooled over those holding values
        got = builders.run_model(builders.rewire(ragged["model"], keep={name}), ragged["feeds"])
        expected = min(builders.pooled_cosine([r[k] for r in ref], [g[k] for g in got]) for k in ("y", "e"))
        # was: w2's "changes only 'e' (shape [0, 8]), which holds no values on any sample", and no figure
        assert "no_values" not in s.details[name], name
        assert s.details[name]["samples"] == len(order)
        assert s[name]["cosine-similarity"] == pytest.approx(expected, abs=1e-6), name
    assert "no values compared" not in s.table()


def test_screening_says_no_values_on_any_sample_after_every_sample_and_lists_them_last(empty_tail):
    s, how = _screened(empty_tail, "activation", list(range(N)), rank_samples=2, confirm=1)
    assert how.samples == 2
    unmeasured = [n for n in s if "no_values" in s.details[n]]
    assert sorted(unmeasured) == ["e_QuantizeLinear", "m2_QuantizeLinear"] and list(s)[-2:] == unmeasured
    for name in unmeasured:  # e, of shape [0, 8] on every sample, was looked at on every sample
        assert s.details[name]["samples"] == N
        assert s.details[name]["no_values"] == "changes only 'e' (shape [0, 8]), which holds no values on any sample"


def _screening_done(setup, s, how, confirm):
    """``(top, more, rest)``: how many nodes of ``s`` screening confirmed on every sample, how
    many more it re-scored on every sample and how many it left on the screened ones, from
    plain onnxruntime sessions on rewired models: the top ``confirm`` of those whose changed
    outputs held values on the screened samples, those that held none there but some on the
    rest, the others with values."""
    ref = builders.run_model(builders.rewire(setup["model"], keep=()), setup["feeds"])
    changed, measured = {}, set()
    for name in s:
        got = builders.run_model(builders.rewire(setup["model"], keep={name}), setup["feeds"])
        changed[name] = {k for r, g in zip(ref, got) for k in r if not np.array_equal(r[k], g[k])}
        if any(r[k].size for r in ref for k in changed[name]):
            measured.add(name)  # has a figure: some output it changes holds values on some sample
    seen = [n for n in measured if any(ref[i][k].size for i in how.indices for k in changed[n])]
    top = min(confirm, len(seen))  # the screening ranks those with values first
    blind = len(measured) - len(seen)  # no values on the screened samples, some on the rest
    rest = len(seen) - top
    return top, blind, rest


def _screening_line(setup, s, how, confirm):
    """The screening line of ``s`` as what was done makes it (:func:`_screening_done`)."""
    top, blind, rest = _screening_done(setup, s, how, confirm)
    n = len(setup["feeds"])
    kind = {"weight": "weight", "activation": "activation", "node": "operator"}[s.node_type]
    said = [f"the top {top} confirmed on all {n}" if top else f"none confirmed on all {n}"] + (
        [f"and {blind} more {kind} node{'s' if blind > 1 else ''} on all {n}, whose outputs held no values on the "
         "samples they were ranked on"] if blind else [])
    end = f"; the rest ranked on {how.samples}" if rest else ""
    return "(" + ", ".join(said) + end + ")", ", ".join(said)


@pytest.mark.parametrize("fixture, node_type, order", [
    ("empty_tail", "activation", list(range(N))),  # two never hold values: not among the top
    ("ragged", "weight", [1, 5, 0, 2, 3, 4]),  # w2's e holds none on 1 and 4: re-scored, and no rest
])
def test_the_screening_line_says_what_was_done(fixture, node_type, order, request):
    setup = request.getfixturevalue(fixture)
    s, how = _screened(setup, node_type, order, rank_samples=2, confirm=1)
    line, _ = _screening_line(setup, s, how, 1)
    # was: "(the top 3 on all 4 samples; the rest ranked on 2)" and "(the top 2 on all 6
    # samples; the rest ranked on 2)", the nodes re-scored for holding no values counted in the top
    assert line in s.table().splitlines()


def test_the_screening_sentence_counts_the_nodes_re_scored_for_holding_no_values(ragged):
    # w2's e holds no rows on samples 1 and 4, those screened: it is re-scored on every sample, beside the top 1
    s, how = _screened(ragged, "weight", [1, 5, 0, 2, 3, 4], rank_samples=2, confirm=1)
    top, more, _ = _screening_done(ragged, s, how, 1)
    assert more
    n = len(ragged["feeds"])
    # was: "the top 1 of each confirmed on all 6", silent on the one re-scored
    assert how.text() == (f"rankings on 2 of {n} samples, the top {top} confirmed on all {n}, and {more} more "
                          f"weight node{'s' if more > 1 else ''} on all {n}, whose outputs held no values on the "
                          "samples they were ranked on")


def test_confirming_none_the_table_and_the_sentence_say_the_same_of_the_re_scored(ragged):
    """confirm=0, w2 re-scored on every sample for holding no values on those screened: the
    run's sentence said "none confirmed on all 6, and 1 more weight node ...", the table
    line "(1 more on all 6, ...; the rest ranked on 2)", silent on none being confirmed."""
    s, how = _screened(ragged, "weight", [1, 5, 0, 2, 3, 4], rank_samples=2, confirm=0)
    line, said = _screening_line(ragged, s, how, 0)
    assert said.startswith("none confirmed") and "1 more weight node" in said  # the case this test is about
    assert line in s.table().splitlines()
    assert how.text().endswith(said)


@pytest.mark.parametrize("room", [True, False])
def test_screening_runs_no_node_whose_outputs_hold_no_values_on_any_sample(empty_tail, monkeypatch, room):
    """Those nodes were scored on every remaining sample before they were labelled; the float
    references (computed for confirming anyway) say it: no extra run, float or quantized. With
    no room to keep float references, checking them first ran each remaining sample's twice."""
    from pytest_ptq import screening
    from pytest_ptq.engine import Engine, core

    from pytest_ptq.metrics import get_metrics
    from pytest_ptq.outputs import parse_outputs

    if not room:
        monkeypatch.setattr(core, "_REF_CACHE_BYTES", 0)
    engine = Engine(str(empty_tail["model"]), empty_tail["data"])
    assert not engine.config_major  # every quantized run goes through run_many
    runs, floats = [], []
    original_many = Engine.run_many
    monkeypatch.setattr(Engine, "run_many", lambda self, i, configs, *a, **kw: (
        runs.append(len(list(configs)) * (len(i) if isinstance(i, tuple) else 1))
        or original_many(self, i, configs, *a, **kw)))
    original = Engine.run
    monkeypatch.setattr(Engine, "run", lambda self, sample, quantized=(), *a, **kw: (
        floats.append(len(sample) if isinstance(sample, tuple) else 1) if not quantized else None)
        or original(self, sample, quantized, *a, **kw))
    sens, how = screening.screen(engine, ["activation"], get_metrics(["cosine-similarity"]),
                                 parse_outputs(None, engine.qmodel), list(range(N)), rank_samples=2, confirm=1)
    s = sens["activation"]
    unmeasured = [n for n in s if "no_values" in s.details[n]]
    assert sorted(unmeasured) == ["e_QuantizeLinear", "m2_QuantizeLinear"]
    # every node on the first sample (it times the budget), those holding values on the other
    # screened one, the top 1 on the other 2: was 4 * 2 + 3 * 2 = 14 configs scored
    assert sum(runs) == len(s) + (len(s) - len(unmeasured)) * (how.samples - 1) + 1 * (N - how.samples) == 8
    assert sum(floats) <= N  # each sample's float reference once at most
    for name in unmeasured:
        assert s.details[name]["samples"] == N and s.details[name]["per_sample"]["cosine-similarity"] == [None] * N
        assert s.details[name]["no_values"] == "changes only 'e' (shape [0, 8]), which holds no values on any sample"


@pytest.mark.parametrize("node_type", ["weight", "activation", "node"])
def test_screening_runs_no_node_on_a_sample_where_the_outputs_it_reaches_hold_no_values(ragged, monkeypatch,
                                                                                        node_type):
    """The nodes reaching e alone (w2's pairs) are run on the samples where e holds rows only:
    elsewhere a run compares nothing of them and every other output is the float one. Their
    figures are those of a run on every sample."""
    from pytest_ptq import screening, sensitivity
    from pytest_ptq.engine import Engine

    order, n = list(range(len(RAGGED_SIGNS))), len(RAGGED_SIGNS)
    quantized = []
    original = Engine.run_many

    def run_many(self, i, configs, tensors=None):
        configs = list(configs)
        quantized.append(len(configs) * (len(i) if isinstance(i, tuple) else 1))
        return original(self, i, configs, tensors)

    monkeypatch.setattr(Engine, "run_many", run_many)
    s, how = _screened(ragged, node_type, order, rank_samples=2, confirm=10)  # every node confirmed
    assert not Engine(str(ragged["model"]), ragged["data"]).config_major  # every config runs through run_many
    runs, quantized[:] = sum(quantized), []
    real = sensitivity.score_configs
    # the full scoring this replaced: every node run on every sample
    monkeypatch.setattr(screening, "score_configs", lambda *a, reaches=None, **kw: real(*a, **kw))
    full, _ = _screened(ragged, node_type, order, rank_samples=2, confirm=10)
    assert list(s) == list(full) and how.samples == 2
    for name in s:
        assert s[name] == full[name], name
        assert s.details[name] == full.details[name], name
    ref = builders.run_model(builders.rewire(ragged["model"], keep=()), ragged["feeds"])
    blind = 0  # runs of a node on a sample where every output it changes on some sample holds no values
    for name in s:
        keep = set(s.details[name].get("calibration_nodes", [name]))
        got = builders.run_model(builders.rewire(ragged["model"], keep=keep), ragged["feeds"])
        expected = min(builders.pooled_cosine([r[k] for r in ref], [g[k] for g in got]) for k in ("y", "e"))
        assert s[name]["cosine-similarity"] == pytest.approx(expected, abs=1e-6), name
        got = s.details[name]["per_sample"]["cosine-similarity"]
        want = per_sample_brute_force(ragged, keep)
        assert [v is None for v in got] == [v is None for v in want], name
        assert [v for v in got if v is not None] == pytest.approx([v for v in want if v is not None], abs=1e-6)
        # the first sample is run for every node: it times the budget
        blind += sum(v is None for v in want[1:])
    assert blind  # some node reaches e alone: the model is what the test is about
    # every node on every sample, the first included, less those where it changed nothing compared: was n per node
    assert runs == len(s) * n - blind < sum(quantized) == len(s) * n


def test_a_resample_holding_no_sample_a_node_was_judged_on_leaves_it_out_of_that_comparison():
    """a, judged on sample 0 only, is the most sensitive wherever it is judged; a resample of
    the 4 samples misses sample 0 with probability (3/4)^4. There it has no rank: as the last
    of those resamples it read as the least sensitive node (rank 3, in the top 1 in 68%)."""
    values = {"a": [0.5, None, None, None], "b": [0.90, 0.91, 0.92, 0.93], "c": [0.95, 0.96, 0.97, 0.98]}
    s = Sensitivity(node_type="activation", metrics=["cosine-similarity"], samples=4)
    for name, per_sample in values.items():
        dict.__setitem__(s, name, {"cosine-similarity": float(np.mean([v for v in per_sample if v is not None]))})
        s.details[name] = {"per_sample": {"cosine-similarity": per_sample}}
    conf = ranking_confidence(s, k=1, resamples=4000, seed=3)
    miss = (3 / 4) ** 4  # a resample without sample 0
    a, b, c = (conf.nodes[n] for n in "abc")
    assert (a["rank_low"], a["rank_high"], a["top_k_frequency"]) == (1, 1, 1.0)
    # b is the first where a is not judged, the second elsewhere; c the second or the third
    assert b["top_k_frequency"] == pytest.approx(miss, abs=0.03) and (b["rank_low"], b["rank_high"]) == (1, 2)
    assert (c["rank_low"], c["rank_high"], c["top_k_frequency"]) == (2, 3, 0.0)
    # a resample without a cannot show the top {a}: it does not count as the same
    assert conf.top_k == ["a"] and conf.top_k_set_frequency == pytest.approx(1 - miss, abs=0.03)
    assert f"; {round(100 * conf.nodes['b']['top_k_frequency'])}% of the resamples held no sample" in conf.message

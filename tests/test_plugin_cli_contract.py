"""The built-in contract: ``pytest --ptq-model m.onnx --ptq-data calib`` checks a model in a
folder with no test file, as the items ``ptq::m.onnx::outputs``, ``nodes`` and ``baseline``.

Every figure it reports is checked against plain onnxruntime sessions on rewired models
(test_plugin.keep_only), computed here without pytest_ptq.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import builders
from test_plugin_baseline import run_printed
from test_plugin import N, activation_pairs, feeds_of, independent_sensitivity, keep_only, pooled_cosine, \
    properties, run
from test_report import Page, rows

ARGS = ("--ptq-model", "m.onnx", "--ptq-data", "calib")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """m.onnx, its calibration folder calib/ and a held-out folder holdout/ of other samples."""
    root = tmp_path_factory.mktemp("cli_contract_models")
    float_path = builders.conv_net(root / "float.onnx")
    data, holdout = builders.samples(N), builders.samples(N, seed=7)
    builders.save_folder(data, root / "calib")
    builders.save_folder(holdout, root / "holdout")
    model = builders.quantize(float_path, root / "m.onnx", data)

    def outputs(feeds):
        return ([r["prob"] for r in builders.run_model(keep_only(model), feeds)],
                [q["prob"] for q in builders.run_model(model, feeds)])

    feeds = feeds_of(data)
    ref, quant = outputs(feeds)
    return {"root": root, "cosine": pooled_cosine(ref, quant),
            "mse": float(np.mean([np.mean((q.astype(np.float64) - r) ** 2) for r, q in zip(ref, quant)])),
            "holdout_cosine": pooled_cosine(*outputs(feeds_of(holdout))),
            "sensitivity": independent_sensitivity(model, feeds, activation_pairs(model))}


@pytest.fixture
def project(pytester, models):
    """An otherwise empty folder with m.onnx, calib/ and holdout/."""
    shutil.copy(models["root"] / "m.onnx", pytester.path / "m.onnx")
    for name in ("calib", "holdout"):
        shutil.copytree(models["root"] / name, pytester.path / name)
    return pytester


def collected(project, *args):
    """Node ids that ``--collect-only -q`` lists, and the exit code."""
    result = run(project, "--collect-only", "-q", *args)
    return [line for line in result.stdout.lines if "::" in line], result.ret


def test_baseline_lifecycle_from_the_command_line(project, models):
    sens = models["sensitivity"]
    args = (*ARGS, "--ptq-node-type", "activation", "--ptq-min-node-cosine", repr(min(sens.values()) - 1e-6))
    path = project.path / "ptq_baselines" / "m.json"

    missing = run(project, *args, "-v")
    assert missing.ret == pytest.ExitCode.TESTS_FAILED
    missing.stdout.fnmatch_lines(["*collected 3 items", "ptq::m.onnx::outputs PASSED*", "ptq::m.onnx::nodes PASSED*",
                                  "ptq::m.onnx::baseline FAILED*"])
    missing.stdout.fnmatch_lines(["contract m (m.onnx), check baseline: FAILED",
                                  "baseline ptq_baselines/m.json does not exist, so there is nothing to compare "
                                  "m.onnx against; create it with `pytest -p * --ptq-model=m.onnx --ptq-data=calib "
                                  "--ptq-node-type=activation --ptq-min-node-cosine=* -v --ptq-update-baseline`, "
                                  "review it and commit it"])
    assert "Traceback" not in missing.stdout.str()
    assert not path.exists()

    # run as printed: the built-in contract needs --ptq-model and --ptq-data, which the command keeps
    created = run_printed(project, missing, "create it with")
    created.assert_outcomes(passed=2, failed=1)
    created.stdout.fnmatch_lines(["baseline ptq_baselines/m.json did not exist and has been written; *"])
    saved = json.loads(path.read_text())
    assert saved["node_type"] == "activation" and saved["metric"] == "cosine-similarity"
    assert saved["model"]["path"] == "../m.onnx" and saved["data"]["path"] == "../calib"
    assert set(saved["sensitivity"]) == set(sens)
    for name, value in sens.items():
        assert saved["sensitivity"][name] == pytest.approx(value, abs=2e-7), name
    assert saved["outputs"]["prob"] == pytest.approx(models["cosine"], abs=2e-7)

    passed = run(project, *args)
    assert passed.ret == pytest.ExitCode.OK
    passed.assert_outcomes(passed=3)


def test_thresholds_come_from_the_command_line(project, models):
    sens = models["sensitivity"]
    order = sorted(sens, key=sens.get)
    limit = (sens[order[0]] + sens[order[1]]) / 2  # only the most sensitive node falls below it
    assert models["cosine"] < 0.99999999
    result = run(project, *ARGS, "--ptq-min-cosine", "0.99999999", "--ptq-node-type", "activation",
                 "--ptq-min-node-cosine", repr(limit), "-k", "not baseline", "--junitxml=junit.xml")
    result.assert_outcomes(failed=2, deselected=1)
    result.stdout.fnmatch_lines([
        "contract m (m.onnx), check outputs: FAILED",
        "output cosine-similarity fails for 1 of 1 output(s): 'prob' * (needs >= *) [[]m.onnx, 4 sample(s) of calib[]]",
        "contract m (m.onnx), check nodes: FAILED",
        f"1 of {len(sens)} activation nodes of m.onnx are too sensitive (need cosine-similarity >= * with only "
        f"that node quantized): {order[0]} (*); *",
    ])
    shown = re.search(r"'prob' (\S+) \(needs >= ", result.stdout.str()).group(1)
    assert float(shown) == pytest.approx(models["cosine"], abs=1e-6)  # printed with 6 decimals
    props = properties(project.path / "junit.xml")
    assert float(props["outputs"]["ptq.outputs.prob.cosine-similarity"]) == pytest.approx(models["cosine"], abs=2e-7)
    assert props["nodes"]["ptq.nodes.activation.over_limit"] == "1"
    assert props["nodes"]["ptq.nodes.activation.worst"] == order[0]
    assert float(props["nodes"]["ptq.nodes.activation.worst.cosine-similarity"]) == pytest.approx(sens[order[0]], abs=2e-7)
    # beside each figure what it was judged against, for a test tab that shows nothing else
    assert float(props["outputs"]["ptq.outputs.prob.cosine-similarity.threshold"]) == float(shown_threshold(result))
    assert props["outputs"]["ptq.outputs.cosine-similarity.samples"] == "4"
    assert props["outputs"]["ptq.outputs.cosine-similarity.data"] == "calibration"
    assert float(props["nodes"]["ptq.nodes.activation.cosine-similarity.threshold"]) == pytest.approx(limit, rel=1e-12)


def test_metric_option_sets_the_baseline_not_the_cosine_thresholds(project, models):
    result = run(project, *ARGS, "--ptq-metric", "mse", "--ptq-update-baseline", "--junitxml=junit.xml")
    result.assert_outcomes(passed=2, failed=1)  # outputs and nodes hold as cosines; the baseline is new
    props = properties(project.path / "junit.xml")
    assert float(props["outputs"]["ptq.outputs.prob.cosine-similarity"]) == pytest.approx(models["cosine"], abs=2e-7)
    assert "ptq.nodes.node.worst.cosine-similarity" in props["nodes"]
    saved = json.loads((project.path / "ptq_baselines" / "m.json").read_text())
    assert saved["metric"] == "mse"
    assert saved["outputs"]["prob"] == pytest.approx(models["mse"], rel=1e-4)


def test_holdout_data_serves_the_output_check(project, models):
    cal, hold = models["cosine"], models["holdout_cosine"]
    assert abs(cal - hold) > 1e-5, "the held-out samples must measure differently"
    middle = repr((cal + hold) / 2)  # passes on one data set, fails on the other

    def outputs(*args):
        result = run(project, "-k", "outputs", "--ptq-min-cosine", middle, "--junitxml=junit.xml", *args)
        value = float(properties(project.path / "junit.xml")["outputs"]["ptq.outputs.prob.cosine-similarity"])
        return result, value

    for flag in ("--ptq-holdout", "--ptq-heldout"):  # the second: as the CLI and the API spell it
        held, value = outputs(*ARGS, flag, "holdout")
        held.assert_outcomes(**{"passed" if hold > cal else "failed": 1}, deselected=2)
        assert value == pytest.approx(hold, abs=2e-7)

    calib, value = outputs(*ARGS)
    calib.assert_outcomes(**{"passed" if cal > hold else "failed": 1}, deselected=2)
    assert value == pytest.approx(cal, abs=2e-7)

    # the same through ini keys, paths relative to the ini file
    project.makepyprojecttoml("""
        [tool.pytest.ini_options]
        ptq_model = "m.onnx"
        ptq_data = "calib"
        ptq_holdout = "holdout"
    """)
    ini, value = outputs("-v")
    ini.stdout.fnmatch_lines(["ptq::m.onnx::outputs *"])
    assert value == pytest.approx(hold, abs=2e-7)
    failed = run(project, "-k", "outputs", "--ptq-min-cosine", "0.99999999")
    failed.stdout.fnmatch_lines(["output cosine-similarity fails * [[]m.onnx, 4 sample(s) of holdout[]]"])

    # a Python test's ptq.check_outputs() takes --ptq-holdout too (and replaces the built-in contract)
    project.makepyfile(test_own="def test_own(ptq):\n    ptq.assert_outputs(0.5)\n")
    own = run(project, "--junitxml=junit.xml")
    own.assert_outcomes(passed=1)
    assert float(properties(project.path / "junit.xml")["test_own"]["ptq.outputs.prob.cosine-similarity"]) \
        == pytest.approx(hold, abs=2e-7)


def test_xdist_selection_and_report(project, models):
    baseline = project.path / "ptq_baselines" / "m.json"
    run(project, *ARGS, "-n", "2", "--ptq-update-baseline").assert_outcomes(passed=2, failed=1)
    assert baseline.is_file()
    result = run(project, *ARGS, "-n", "2", "-k", "outputs or baseline", "-v", "--ptq-report", "report.html")
    # xdist workers deselect without telling the controller: the count of passed tests shows it
    result.assert_outcomes(passed=2)
    for check in ("outputs", "baseline"):  # in the order the workers finish
        result.stdout.fnmatch_lines([f"*PASSED ptq::m.onnx::{check}*"])
    page = Page((project.path / "report.html").read_text())
    assert [s["title"] for s in page.sections] == ["m.onnx PASSED"]
    tests = {r["test"]: r["outcome"] for r in rows(page.sections[0]["tables"]["tests"])}
    assert tests == {"ptq::m.onnx::outputs": "passed", "ptq::m.onnx::baseline": "passed"}
    outputs = rows(page.sections[0]["tables"]["outputs"])
    assert float(outputs[0]["cosine-similarity"]) == pytest.approx(models["cosine"], abs=1e-6)


BUILTIN = [f"ptq::m.onnx::{check}" for check in ("outputs", "nodes", "baseline")]


@pytest.mark.parametrize("files, args, expected", [
    pytest.param({}, (), [], id="no model: nothing added"),
    pytest.param({}, ARGS, BUILTIN, id="model and data"),
    pytest.param({"test_unit.py": "def test_unit(): pass\n"}, ARGS, ["test_unit.py::test_unit"] + BUILTIN,
                 id="beside plain tests"),
    pytest.param({"test_unit.py": "def test_unit(): pass\n"}, (*ARGS, "--ptq-no-default-contract"),
                 ["test_unit.py::test_unit"], id="opted out"),
    pytest.param({"test_own.py": "def test_own(ptq_analysis): pass\n"}, ARGS, ["test_own.py::test_own"],
                 id="a test uses a ptq fixture"),
    pytest.param({"test_own.py": "import pytest\n\n@pytest.mark.ptq(min_cosine=0.9)\ndef test_own(): pass\n"},
                 ARGS, ["test_own.py::test_own"], id="a test is marked ptq"),
    pytest.param({"own.ptq.yaml": "model: m.onnx\ndata: calib\nbaseline: false\n"}, ARGS, ["own.ptq.yaml::outputs"],
                 id="a YAML contract"),
])
def test_added_only_when_no_test_uses_the_plugin(project, files, args, expected):
    for name, text in files.items():
        (project.path / name).write_text(text)
    ids, ret = collected(project, *args)
    assert ids == expected
    assert ret == (pytest.ExitCode.OK if expected else pytest.ExitCode.NO_TESTS_COLLECTED)


def test_a_run_narrowed_on_the_command_line_leaves_out_an_ini_models_contract(project):
    """With ``ptq_model`` in the ini, ``pytest tests/test_unit.py::test_unit`` ran the built-in
    contract's three items beside the one test named; ``--ptq-model`` on the command line and
    a run over the configured paths still add them."""
    (project.path / "test_unit.py").write_text("def test_unit(): pass\n")
    project.makepyprojecttoml("""
        [tool.pytest.ini_options]
        ptq_model = "m.onnx"
        ptq_data = "calib"
    """)
    assert collected(project, "test_unit.py::test_unit")[0] == ["test_unit.py::test_unit"]
    assert collected(project, "test_unit.py")[0] == ["test_unit.py::test_unit"]
    assert collected(project)[0] == ["test_unit.py::test_unit"] + BUILTIN
    assert collected(project, "test_unit.py", "--ptq-model", "m.onnx")[0] == ["test_unit.py::test_unit"] + BUILTIN


def test_model_without_data_fails_in_one_sentence(project):
    result = run(project, "--ptq-model", "m.onnx")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["contract m (m.onnx), check outputs: no calibration data: pass --ptq-data PATH, *"])
    assert "Traceback" not in result.stdout.str()


def test_a_failed_checks_one_line_is_its_reason(project, monkeypatch):
    """pytest's short summary, ``--tb=line`` and JUnit's message take one line from a failure:
    they took the report's heading cut at 50 characters, or under -vv the whole report."""
    # the summary line whole: pytest before 8.2 cuts it to the terminal's width under -vv too,
    # but never on CI
    monkeypatch.setenv("CI", "true")
    args = (*ARGS, "--ptq-min-cosine", "1.0", "-k", "outputs", "--junitxml=j.xml")
    reason = "output cosine-similarity fails for 1 of 1 output(s): 'prob' * (needs >= 1.000000) [[]m.onnx, *"
    result = run(project, *args, "-rf", "-vv")
    result.assert_outcomes(failed=1, deselected=2)
    result.stdout.fnmatch_lines([f"FAILED ptq::m.onnx::outputs - {reason}"])
    assert "FAILED ptq::m.onnx::outputs - contract m" not in result.stdout.str()
    run(project, *args, "--tb=line").stdout.fnmatch_lines([f"*m.onnx:1: {reason}"])
    [failure] = ET.parse(project.path / "j.xml").iter("failure")
    assert failure.get("message").startswith("output cosine-similarity fails for 1 of 1 output(s): 'prob' ")


def test_a_contracts_node_threshold_read_in_the_command_lines_metric_warns(project):
    """``nodes: {threshold: 0.999}`` written as a cosine floor passed under --ptq-metric=sqnr as a
    0.999 dB floor, in silence; a contract that names its metric keeps its meaning."""
    project.makefile(".ptq.yaml", c="model: m.onnx\ndata: calib\nbaseline: false\nnodes: {threshold: 0.999}\n",
                     named="model: m.onnx\ndata: calib\nbaseline: false\n"
                           "nodes: {threshold: 0.999, metric: cosine-similarity}\n")
    result = run(project, "-k", "nodes", "--ptq-metric", "sqnr")
    result.stdout.fnmatch_lines(["*PTQContractWarning: c.ptq.yaml: nodes.threshold 0.999 is read in sqnr (the "
                                 "session's --ptq-metric), as the contract names no metric*"])
    assert "named.ptq.yaml: nodes.threshold" not in result.stdout.str()
    assert "PTQContractWarning" not in run(project, "-k", "nodes").stdout.str()


def shown_threshold(result):
    """The output threshold the failure message printed."""
    return re.search(r"'prob' \S+ \(needs >= (\S+)\)", result.stdout.str()).group(1)

"""The pytest plugin: options, ini keys, the marker, fixtures and assertion helpers.

Every figure the plugin reports is checked against plain onnxruntime sessions on rewired
models (tests/builders.py), computed here without pytest_ptq.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import builders

ROOT = Path(__file__).resolve().parents[1]

N = 4


def plugin_args():
    """``-p`` for the plugin: by entry point name when installed, else by module."""
    if any(ep.name == "ptq" and ep.value == "pytest_ptq.plugin" for ep in entry_points(group="pytest11")):
        return ["-p", "ptq"]  # also loads it under PYTEST_DISABLE_PLUGIN_AUTOLOAD
    return ["-p", "pytest_ptq.plugin"]


def run(pytester, *args):
    return pytester.runpytest_inprocess(*plugin_args(), "-p", "no:cacheprovider", *args)


def feeds_of(data):
    return [{k: v[i] for k, v in data.items()} for i in range(N)]


def pooled_cosine(refs, tests):
    r = np.concatenate([np.ravel(a).astype(np.float64) for a in refs])
    t = np.concatenate([np.ravel(a).astype(np.float64) for a in tests])
    return float(r @ t / np.sqrt((r @ r) * (t @ t)))


def activation_pairs(model_path):
    """Names of the Q nodes on run-time tensors, read from the proto."""
    graph = onnx.load(str(model_path)).graph
    inits = {i.name for i in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits]


def keep_only(model_path, keep=()):
    """The QDQ model with every Q -> DQ pair not in ``keep`` cut out by reconnecting its
    consumers to the Q's float input (lone DQs of quantized biases stay)."""
    model = onnx.load(str(model_path))
    graph = model.graph
    q_of = {n.output[0]: n for n in graph.node if n.op_type == "QuantizeLinear"}
    replace, drop = {}, set()
    for n in graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in q_of and q_of[n.input[0]].name not in keep:
            replace[n.output[0]] = q_of[n.input[0]].input[0]
            drop.update({n.name, q_of[n.input[0]].name})
    kept = []
    for n in graph.node:
        if n.name not in drop:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.input[:] = [replace.get(i, i) for i in n.input]
            kept.append(copy)
    for o in graph.output:
        if o.name in replace:
            kept.append(helper.make_node("Identity", [replace[o.name]], [o.name]))
    del graph.node[:]
    graph.node.extend(kept)
    return model


def independent_sensitivity(model_path, feeds, names):
    """Output cosine with only one pair kept, per pair (plain onnxruntime on rewired models)."""
    ref = builders.run_model(keep_only(model_path), feeds)
    out = {}
    for name in names:
        got = builders.run_model(keep_only(model_path, {name}), feeds)
        out[name] = pooled_cosine([r["prob"] for r in ref], [g["prob"] for g in got])
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A float net, its calibration folder and two QDQ quantizations."""
    return build_models(tmp_path_factory.mktemp("plugin_models"))


def build_models(root):
    """Float net, calibration folder, per-tensor and per-channel QDQ models, and the float
    and quantized outputs computed by plain onnxruntime sessions."""
    float_path = builders.conv_net(root / "float.onnx")
    data = builders.samples(N)
    builders.save_folder(data, root / "calib")
    builders.quantize(float_path, root / "model.onnx", data)
    builders.quantize(float_path, root / "model_pc.onnx", data, per_channel=True)
    feeds = feeds_of(data)
    ref = builders.run_model(keep_only(root / "model.onnx"), feeds)
    quant = builders.run_model(root / "model.onnx", feeds)
    return {"root": root, "feeds": feeds, "ref": ref, "quant": quant}


@pytest.fixture
def project(pytester, models):
    """The pytester folder with model.onnx, model_pc.onnx and calib/ copied in."""
    root = models["root"]
    for name in ("model.onnx", "model_pc.onnx", "float.onnx"):
        shutil.copy(root / name, pytester.path / name)
    shutil.copytree(root / "calib", pytester.path / "calib")
    return pytester


def properties(path):
    """``{test name: {property: value}}`` from a JUnit XML file."""
    tree = ET.parse(path)
    return {tc.get("name"): {p.get("name"): p.get("value") for p in tc.iter("property")}
            for tc in tree.iter("testcase")}


# -- options -------------------------------------------------------------------------------
def help_entries(text, title):
    """``{option: help text on one line}`` of one option group of ``pytest --help``."""
    block = text.split(title + "\n", 1)[1].split("\n\n", 1)[0]
    entries = {}
    for chunk in ("\n" + block).split("\n  --")[1:]:
        # a line broken after a hyphen ("cosine-" / "similarity", as older argparse wraps) joins without a space
        words = re.sub(r"(?<=\w)- (?=\w)", "-", " ".join(chunk.split()))
        flag, _, rest = words.partition(" ")
        # "--ptq-holdout, --ptq-heldout=PATH": Python 3.13's argparse names the value once
        entries["--" + re.split(r"[=,]", flag)[0]] = rest
    return entries


def test_help_pins_the_option_group(pytester):
    result = run(pytester, "--help")
    entries = help_entries(result.stdout.str(), "post-training quantization accuracy contracts (pytest-ptq):")
    assert list(entries) == [
        "--ptq-model", "--ptq-data", "--ptq-holdout", "--ptq-float-model", "--ptq-custom-op-library", "--ptq-data-num", "--ptq-node-type",
        "--ptq-metric", "--ptq-min-cosine", "--ptq-min-node-cosine", "--ptq-tolerance", "--ptq-baseline-dir",
        "--ptq-report", "--ptq-top", "--ptq-cache-dir", "--ptq-memory", "--ptq-workers", "--ptq-update-baseline",
        "--ptq-update-all",
        "--ptq-no-default-contract", "--ptq-no-cache"]
    defaults = {"--ptq-model": "none", "--ptq-holdout": "the calibration data", "--ptq-data-num": "all samples",
                "--ptq-node-type": "node",
                "--ptq-metric": "cosine-similarity", "--ptq-min-cosine": "0.99", "--ptq-min-node-cosine": "0.999",
                "--ptq-tolerance": "0.001", "--ptq-baseline-dir": "<rootdir>/ptq_baselines", "--ptq-report": "none",
                "--ptq-top": "10", "--ptq-update-baseline": "off", "--ptq-update-all": "off",
                "--ptq-no-default-contract": "off", "--ptq-cache-dir": "<pytest's cache dir>/d/ptq",
                "--ptq-no-cache": "off", "--ptq-memory": "auto", "--ptq-workers": "auto"}
    for flag, help_text in entries.items():
        assert help_text.endswith(f"Default: {defaults.get(flag, 'none')}."), (flag, help_text)
        if flag not in ("--ptq-update-baseline", "--ptq-update-all", "--ptq-no-default-contract", "--ptq-no-cache"):
            assert f"Ini: ptq_{flag[6:].replace('-', '_')}." in help_text, flag
    numbers = pytest.version_tuple[:2] >= (9, 2)  # typed ini keys: a TOML table's numbers
    result.stdout.fnmatch_lines(["  ptq_model (string):*", f"  ptq_min_cosine ({'float | ' if numbers else ''}string):*",
                                 f"  ptq_top ({'int | ' if numbers else ''}string):*"])


def test_each_assert_takes_its_checks_parameters():
    """``ptq.assert_baseline`` had lost ``outputs``, which ``ptq.check_baseline`` takes (and a
    contract uses): the asserts re-listed their checks' parameters by hand."""
    import inspect

    from pytest_ptq.checks import PTQ

    for name in ("outputs", "nodes", "accuracy", "baseline", "data", "stages"):
        check, assertion = getattr(PTQ, f"check_{name}"), getattr(PTQ, f"assert_{name}")
        assert inspect.signature(assertion) == inspect.signature(check), name


def test_a_run_without_models_imports_neither_onnx_nor_onnxruntime(pytester):
    # the terminal summary imported the report module, and onnx behind it, in every run
    pytester.makepyfile(test_plain="def test_a():\n    assert 1\n")
    pytester.makeconftest("import sys\n\ndef pytest_unconfigure(config):\n"
                          "    print('LOADED', sorted(m for m in ('onnx', 'onnxruntime', 'matplotlib') "
                          "if m in sys.modules))\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["LOADED []"])


def test_a_report_that_fails_to_write_is_an_error_line_not_an_internal_error(pytester):
    # a library's fault while drawing the page (a matplotlib warning under -W error) crashed
    # the run with INTERNALERROR after every test had run
    pytester.makepyfile(test_plain="def test_a():\n    assert 1\n")
    pytester.makeconftest("import pytest_ptq.report as r\n\ndef boom(*a, **k):\n"
                          "    raise RuntimeError('drawing failed')\n\nr.write = boom\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--ptq-report", "r.html")
    result.assert_outcomes(passed=1)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["ERROR: the ptq report was not written: RuntimeError: drawing failed*"])


@pytest.mark.parametrize("flag, value, message", [
    ("--ptq-min-cosine", "2", "must lie in [[]-1, 1[]], got 2"),
    ("--ptq-min-node-cosine", "high", "must be a number, got 'high'"),
    ("--ptq-tolerance", "-0.5", "must be >= 0, got -0.5"),
    ("--ptq-data-num", "0", "must be at least 1, got 0"),
    ("--ptq-metric", "cosin", "unknown metric 'cosin'; did you mean*"),
    ("--ptq-node-type", "layer", "unknown node_type 'layer'; use one of 'node', 'weight', 'activation'"),
    ("--ptq-model", "missing.onnx", "'missing.onnx' does not exist"),
    ("--ptq-model", ".", "'.' is a folder; give the file"),
    ("--ptq-float-model", ".", "'.' is a folder; give the file"),
    ("--ptq-memory", "tiny", "must be one of auto, low, fast, got 'tiny'"),
    ("--ptq-workers", "0", "must be 'auto' or a whole number >= 1, got '0'"),
])
def test_bad_option_values_are_rejected_at_startup(pytester, flag, value, message):
    pytester.makepyfile("def test_never_runs(): raise AssertionError")
    result = run(pytester, flag, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*argument {flag}: {message}*"])
    result.stdout.no_fnmatch_line("*test_never_runs*")


@pytest.mark.parametrize("flag", ["--ptq-data", "--ptq-holdout"])
def test_data_that_is_no_folder_nor_npz_is_refused_at_startup(pytester, flag):
    """A .npy file given as the data was refused by each test that read it, one failure per
    test, where a bad --ptq-model stops the run at start-up."""
    np.save(pytester.path / "x.npy", np.zeros((2, 3), np.float32))
    pytester.makepyfile("def test_never_runs(): raise AssertionError")
    for args in ([flag, "x.npy"], ["-o", f"ptq_{flag[6:]}=x.npy"]):
        result = run(pytester, *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*{'argument ' + flag if args[0] == flag else 'ini key ptq_' + flag[6:]}*"
                                     "x.npy* is neither a folder nor an .npz file; give a folder*"])
        result.stdout.no_fnmatch_line("*test_never_runs*")


def test_bad_ini_value_names_the_key(pytester):
    pytester.makeini("[pytest]\nptq_tolerance = lots\n")
    pytester.makepyfile("def test_never_runs(): raise AssertionError")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini key ptq_tolerance = 'lots': must be a number, got 'lots'*"])


# -- outputs -------------------------------------------------------------------------------
def test_output_metrics_match_plain_onnxruntime(project, models):
    cos = pooled_cosine([r["prob"] for r in models["ref"]], [q["prob"] for q in models["quant"]])
    cls = pooled_cosine([r["prob"][:, 4:] for r in models["ref"]], [q["prob"][:, 4:] for q in models["quant"]])
    mse = float(np.mean([np.mean((q["prob"].astype(np.float64) - r["prob"]) ** 2)
                         for r, q in zip(models["ref"], models["quant"])]))
    assert 0.99 < cos < 1.0 and mse > 0
    project.makepyfile(f"""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_error_metric_is_a_ceiling(ptq):
            assert ptq.check_outputs({mse * 1.001}, metric="mse")
            assert not ptq.check_outputs({mse * 0.999}, metric="mse")

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_just_below(ptq):
            ptq.assert_outputs({{"": {cos - 1e-6}, "cls=prob[:, 4:]": {cls - 1e-6}}})

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_just_above(ptq):
            ptq.assert_outputs({{"": {cos + 1e-6}}})

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_slice_just_above(ptq):
            result = ptq.check_outputs({{"": 0.5, "cls=prob[:, 4:]": {cls + 1e-6}}})
            assert not result and result.failing == ["cls"]
            assert result.values["prob"] > 0.5
    """)
    result = run(project, "--junitxml=junit.xml")
    result.assert_outcomes(passed=3, failed=1)
    props = properties(project.path / "junit.xml")
    assert float(props["test_error_metric_is_a_ceiling"]["ptq.outputs.prob.mse"]) == pytest.approx(mse, rel=1e-4)
    assert props["test_just_below"]["ptq.model"] == "model.onnx"
    assert float(props["test_just_below"]["ptq.outputs.prob.cosine-similarity"]) == pytest.approx(cos, abs=2e-7)
    assert float(props["test_just_below"]["ptq.outputs.cls.cosine-similarity"]) == pytest.approx(cls, abs=2e-7)
    result.stdout.fnmatch_lines([
        "*ContractFailed: output cosine-similarity fails for 1 of 1 output(s): 'prob' 0.99* (needs >= 0.99*)*",
        "*_ ptq: why the models fail _*",
        "*_ ptq: model.onnx FAILED: 1 of 4 test(s) failed _*",
        "* made by onnxruntime quantize_static*; ranked on 4 of 4 calibration sample(s) of calib",
        "  FAILED outputs  cosine-similarity 0.99* on 4 calibration sample(s) (calib), needs >= 0.99*  "
        "[[]test_output_metrics_match_plain_onnxruntime.py::test_just_above[]]",
        "  passed: test_error_metric_is_a_ceiling, test_just_below, test_slice_just_above",
        "cause: *",
        "most sensitive nodes (cosine-similarity of the model outputs with only that node quantized, 4 sample(s), "
        "worst first):",
        "  1. * (* operator) 0.99*",
    ])


def test_the_diagnosis_says_how_many_of_the_samples_a_contract_kept(project):
    """A contract on the first 2 of 4 samples said "ranked on 2 of 2", then "ranked on 2 of the
    first 2 of 4"."""
    project.makepyfile("""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib", data_num=2, min_cosine=1.0)
        def test_strict(ptq):
            ptq.assert_outputs()
    """)
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*; ranked on the first 2 of 4 calibration sample(s) of calib"])


def test_a_failing_slice_is_explained_and_searched_on_that_slice(project, models):
    """A contract failing on a slice while the whole output passes was explained with the whole
    output's figures ("close to float") and sent to a search on the whole output."""
    cls = pooled_cosine([r["prob"][:, 4:] for r in models["ref"]], [q["prob"][:, 4:] for q in models["quant"]])
    project.makepyfile(f"""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib", float_model="float.onnx")
        def test_slice(ptq):
            ptq.assert_outputs({{"": 0.5, "cls=prob[:, 4:]": {cls + 1e-6}}})
    """)
    result = run(project)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    everything = re.search(r"cause: .*?([0-9.]+) everything, on 4 calibration\s+samples", out, re.S)
    assert everything and float(everything.group(1)) == pytest.approx(cls, abs=2e-4), out
    assert "most sensitive nodes (cosine-similarity of 'cls=prob[:, 4:]' with only that node quantized" in out
    assert "--remedy mixed -o 'cls=prob[:, 4:]'" in out


def test_node_check_names_exactly_the_nodes_past_the_limit(project, models):
    names = activation_pairs(models["root"] / "model.onnx")
    sens = independent_sensitivity(models["root"] / "model.onnx", models["feeds"], names)
    order = sorted(sens, key=sens.get)
    limit = (sens[order[1]] + sens[order[2]]) / 2  # two nodes fall below it
    project.makepyfile(f"""
        import pytest
        pytestmark = pytest.mark.ptq(model="model.onnx", data="calib", node_type="activation")

        def test_two_offenders(ptq):
            ptq.assert_nodes({limit!r})

        @pytest.mark.ptq(allow=["{order[0]}"])
        def test_one_allowed_by_marker(ptq):
            ptq.assert_nodes({limit!r})

        def test_both_allowed(ptq):
            result = ptq.assert_nodes({limit!r}, allow=["{order[0]}", "{order[1][:3]}*"])
            assert [n for n, _ in result.allowed] == {order[:2]!r}

        def test_typo_in_allow_list(ptq):
            ptq.assert_nodes({limit!r}, allow=["{order[0]}_typo"])

        def test_pattern_matching_nothing(ptq):
            ptq.assert_nodes({limit!r}, allow=["zz*"])
    """)
    result = run(project, "--junitxml=junit.xml", "-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(passed=1, failed=4)
    props = properties(project.path / "junit.xml")
    assert props["test_two_offenders"]["ptq.nodes.activation.over_limit"] == "2"
    assert props["test_two_offenders"]["ptq.nodes.activation.worst"] == order[0]
    worst = float(props["test_two_offenders"]["ptq.nodes.activation.worst.cosine-similarity"])
    assert worst == pytest.approx(sens[order[0]], abs=2e-7)
    assert props["test_one_allowed_by_marker"]["ptq.nodes.activation.over_limit"] == "1"
    result.stdout.fnmatch_lines([
        f"*ContractFailed: 2 of {len(names)} activation nodes of model.onnx are too sensitive (need "
        f"cosine-similarity >= * with only that node quantized): {order[0]} (*), {order[1]} (*); *",
        f"*ContractFailed: 1 of {len(names)} activation nodes*: {order[1]} (*)*",
        f"*allow-list entry '{order[0]}_typo' matches none of the activation nodes of model.onnx; "
        f"did you mean '{order[0]}'*",
        # a pattern near no name: some of the names, to show what the entries look like
        f"*allow-list entry 'zz*' matches none of the activation nodes of model.onnx; they are '{order[0]}', "
        f"'{order[1]}'*; fix or remove the entry",
    ])
    # the range's column is not called a threshold beside the check's own
    result.stdout.fnmatch_lines(["*| node *| cosine-similarity *| range max|x| *| bit *| feeds *|"])


def test_checks_of_one_test_keep_junit_property_names_of_their_own(project, models):
    """Two output checks and three node checks in one test wrote `ptq.outputs.prob.threshold`
    for a cosine floor and again for an mse ceiling, and `ptq.nodes.over_limit` 2 then 0: a
    reader keeping the last value of a name showed the failing check clean."""
    names = activation_pairs(models["root"] / "model.onnx")
    sens = independent_sensitivity(models["root"] / "model.onnx", models["feeds"], names)
    order = sorted(sens, key=sens.get)
    limit = (sens[order[1]] + sens[order[2]]) / 2  # two activation nodes fall below it
    mse = float(np.mean([np.mean((q["prob"].astype(np.float64) - r["prob"]) ** 2)
                         for r, q in zip(models["ref"], models["quant"])]))
    project.makepyfile(f"""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_many(ptq):
            ptq.check_outputs(0.5)
            ptq.check_outputs({mse * 2!r}, metric="mse")
            ptq.check_nodes({limit!r}, node_type="activation")
            ptq.check_nodes(-1.0, node_type="weight")
            ptq.check_nodes({limit!r}, node_type="activation", allow=["{order[0]}"])
    """)
    run(project, "--junitxml=junit.xml").assert_outcomes(passed=1)
    pairs = [(p.get("name"), p.get("value")) for p in ET.parse(project.path / "junit.xml").iter("property")]
    assert len({n for n, _ in pairs}) == len(pairs), pairs
    props = dict(pairs)
    assert float(props["ptq.outputs.prob.cosine-similarity.threshold"]) == 0.5
    assert float(props["ptq.outputs.prob.mse.threshold"]) == pytest.approx(mse * 2)
    assert props["ptq.outputs.cosine-similarity.data"] == props["ptq.outputs.mse.data"] == "calibration"
    assert float(props["ptq.nodes.activation.cosine-similarity.threshold"]) == pytest.approx(limit, rel=1e-12)
    assert float(props["ptq.nodes.weight.cosine-similarity.threshold"]) == -1.0
    assert props["ptq.nodes.activation.over_limit"] == "2" and props["ptq.nodes.weight.over_limit"] == "0"
    assert props["ptq.nodes.activation.worst"] == order[0]
    # the same check again keeps its own figures under a suffix, all of them
    assert props["ptq.nodes.activation.over_limit#2"] == "1"
    assert props["ptq.nodes.activation.worst#2"] == order[0]
    assert float(props["ptq.nodes.activation.cosine-similarity.threshold#2"]) == pytest.approx(limit, rel=1e-12)


def test_an_output_name_xml_cannot_hold_leaves_the_junit_file_readable(pytester, tmp_path):
    """An output named with a control character went raw into a property name (pytest escapes
    values, not names): no XML parser read the junit.xml, and CI dropped every result."""
    out = 'pr"ob<&\x03'
    model = onnx.load(str(builders.conv_net(tmp_path / "float.onnx")))
    for n in model.graph.node:
        n.output[:] = [out if o == "prob" else o for o in n.output]
    model.graph.output[0].name = out
    onnx.save(model, str(tmp_path / "float.onnx"))
    data = builders.samples(N)
    builders.save_folder(data, pytester.path / "calib")
    builders.quantize(tmp_path / "float.onnx", pytester.path / "model.onnx", data)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_outputs(ptq):
            ptq.assert_outputs(0.5)
    """)
    run(pytester, "--junitxml=junit.xml").assert_outcomes(passed=1)
    props = properties(pytester.path / "junit.xml")["test_outputs"]
    assert 'ptq.outputs.pr"ob<&#x03.cosine-similarity' in props


def test_accuracy_ratio_of_a_user_evaluation_function(project, models):
    def score(outputs):
        return float(np.mean([o["prob"][0, 3] for o in outputs]))

    ratio = score(models["quant"]) / score(models["ref"])
    assert ratio != 1.0
    project.makepyfile(f"""
        import numpy as np
        import pytest

        def mean_class3(run, data):
            assert len(data) == {N}
            return float(np.mean([run(feeds)["prob"][0, 3] for feeds in data]))

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_meets(ptq):
            ptq.assert_accuracy(mean_class3, min_ratio={ratio - 1e-5})

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_misses(ptq):
            ptq.assert_accuracy(mean_class3, min_ratio={ratio + 1e-5})

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_not_a_number(ptq):
            ptq.assert_accuracy(lambda run, data: "high")

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_text_of_a_number(ptq):
            ptq.assert_accuracy(lambda run, data: "0.9")

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_infinite_float_score(ptq):
            ptq.assert_accuracy(lambda run, data: float("inf"))

        calls = []

        def nan_when_quantized(run, data):  # the float model is scored first
            calls.append(1)
            return 1.0 if len(calls) % 2 else float("nan")

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_nan_quantized_score(ptq):
            ptq.assert_accuracy(nan_when_quantized)

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_misspelt_output(ptq):
            ptq.assert_accuracy(lambda run, data: float(run(data.sample(0))["porb"].mean()))

        passes = []

        def fails_when_quantized(run, data):
            passes.append(1)
            if len(passes) == 2:
                raise ValueError("no class 9 predicted")
            return 1.0

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_raises_on_the_quantized_model(ptq):
            ptq.assert_accuracy(fails_when_quantized)
    """)
    result = run(project, "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=7)
    # which pass raised, under the user's own frames and exception
    result.stdout.fnmatch_lines(["*raise ValueError(\"no class 9 predicted\")", "E *ValueError: no class 9 predicted",
                                 "E *the evaluation function fails_when_quantized raised it on the quantized model, "
                                 "after scoring the float model 1.0"])
    props = properties(project.path / "junit.xml")
    assert float(props["test_meets"]["ptq.accuracy.ratio"]) == pytest.approx(ratio, abs=2e-6)
    assert float(props["test_meets"]["ptq.accuracy.float"]) == pytest.approx(score(models["ref"]), rel=1e-5)
    result.stdout.fnmatch_lines([
        "*ContractFailed: mean_class3: quantized * = *% of float *, which is below the *% required [[]model.onnx[]]",
        "*the evaluation function *<lambda> returned 'high'; it must return one number*",
    ], consecutive=False)
    result.stdout.fnmatch_lines(["*the evaluation function *<lambda> returned '0.9'; it must return one number*"])
    result.stdout.fnmatch_lines(["*the evaluation function *<lambda> gave the float model inf; a ratio needs a "
                                 "positive, finite score*"])
    # no output it was handed held NaN: the NaN is the metric's own (a 0/0), not the model's
    result.stdout.fnmatch_lines(["*ContractFailed: nan_when_quantized: quantized nan, not a finite score (float 1*), "
                                 "which does not meet the *% required; the evaluation function nan_when_quantized "
                                 "returned nan for the quantized model while its outputs were finite (a 0/0 in the "
                                 "metric?)*"])
    # a KeyError in the user's function names the outputs there are
    result.stdout.fnmatch_lines(["*UnknownOutput: 'porb' is not an output of *model.onnx' (did you mean 'prob'?); "
                                 "its outputs are *prob*"])


def test_a_nan_score_beside_quantized_outputs_gone_nan_names_those_outputs(models, tmp_path, monkeypatch):
    """The same NaN score from outputs that held NaN: the hint is the model's outputs, named."""
    from pytest_ptq.analysis import Analysis, AnalysisKey
    from pytest_ptq.checks import check_accuracy
    from pytest_ptq.engine import Engine

    real = Engine.run

    def broken(self, sample, quantized=(), *args, **kwargs):
        out = real(self, sample, quantized, *args, **kwargs)
        return {k: v * np.nan for k, v in out.items()} if quantized else out

    monkeypatch.setattr(Engine, "run", broken)
    root = models["root"]
    analysis = Analysis(AnalysisKey(str(root / "model.onnx"), str(root / "calib")), tmp_path)
    result = check_accuracy(analysis, lambda run, data: float(np.mean([run(f)["prob"].max() for f in data])))
    assert not result and result.nonfinite == ("prob",)
    assert ("not a finite score (float " in result.summary and "; its quantized output(s) 'prob' held NaN or Inf; "
            "look for the nodes that make them non-finite" in result.summary), result.summary
    assert "while its outputs were finite" not in result.summary


# -- settings precedence and the marker ----------------------------------------------------
def test_marker_over_command_line_over_ini(project):
    project.mkdir("models")
    shutil.move(project.path / "model.onnx", project.path / "models" / "model.onnx")
    # ini paths are relative to the ini file; cosine 1.0 fails any real quantization
    project.makepyprojecttoml("""
        [tool.pytest.ini_options]
        ptq_model = "models/model.onnx"
        ptq_data = "calib"
        ptq_min_cosine = "1.0"
    """)
    project.mkdir("tests")
    (project.path / "tests" / "test_prec.py").write_text(
        "import pytest\n\n"
        "def test_default(ptq):\n    ptq.assert_outputs()\n\n"
        "@pytest.mark.ptq(min_cosine=0.5)\ndef test_marker_low(ptq):\n    ptq.assert_outputs()\n\n"
        "@pytest.mark.ptq(min_cosine=1.0)\ndef test_marker_high(ptq):\n    ptq.assert_outputs()\n")
    first = run(project, "tests", "-v")
    first.stdout.fnmatch_lines(["*test_default FAILED*", "*test_marker_low PASSED*", "*test_marker_high FAILED*"])
    second = run(project, "tests", "-v", "--ptq-min-cosine", "0.5")
    second.stdout.fnmatch_lines(["*test_default PASSED*", "*test_marker_low PASSED*", "*test_marker_high FAILED*"])


@pytest.mark.skipif(pytest.version_tuple[:2] < (9, 2),
                    reason="typed ini keys and the [tool.pytest] table: pytest 9.2")
def test_numbers_in_pytests_own_toml_table(project):
    """pytest 9 reads ``[tool.pytest]`` as TOML: ``ptq_min_cosine = 1.0`` was refused with
    "config option 'ptq_min_cosine' expects a string, got float" (exit 4, nothing run)."""
    project.makepyprojecttoml("""
        [tool.pytest]
        ptq_model = "model.onnx"
        ptq_data = "calib"
        ptq_min_cosine = 1.0
        ptq_top = 3
    """)
    project.makepyfile("def test_default(ptq):\n    ptq.assert_outputs()\n")
    result = run(project, "-v")
    result.stdout.fnmatch_lines(["*test_default FAILED*", "*1.0*"])
    assert result.ret == 1


@pytest.mark.parametrize("key, value, must", [("data_num", "3", "a whole number"), ("min_cosine", "0.9", "a number"),
                                             ("min_node_cosine", "0.9", "a number"), ("tolerance", "0.1", "a number"),
                                             ("top", "5", "a whole number")])
def test_a_marker_refuses_a_number_given_as_text_which_an_ini_file_gives(tmp_path, key, value, must):
    """A marker's values are Python's: "3" is a mistake there (as in a contract), while an
    ini file's 3 is text and read."""
    from pytest_ptq.errors import PTQError
    from pytest_ptq.settings import BY_NAME, Settings, apply_marker

    with pytest.raises(PTQError, match=re.escape(f"ptq marker {key}={value!r}: it must be {must}, got the text "
                                                 f"{value!r}; write the number without quotes")):
        apply_marker(Settings(), (), {key: value}, tmp_path)
    number = float(value) if "." in value else int(value)
    assert getattr(apply_marker(Settings(), (), {key: number}, tmp_path), key) == number
    assert BY_NAME[key].parse(value) == number  # the ini file's text


def test_bad_marker_argument_fails_the_test_in_one_sentence(project):
    project.makepyfile("""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib", min_cosin=0.9)
        def test_typo(ptq):
            pass

        @pytest.mark.ptq(model="model.onnx", data="calib", min_cosine=3)
        def test_range(ptq):
            pass

        def test_no_model(ptq_model):
            pass
    """)
    result = run(project)
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([
        "*unknown ptq marker argument 'min_cosin'; did you mean 'min_cosine'*",
        "*ptq marker min_cosine=3: it must lie in [[]-1, 1[]], got 3*",
        "*no model to test: pass --ptq-model PATH, set ptq_model in [[]tool.pytest.ini_options[]], or mark*",
    ])
    result.stdout.no_fnmatch_line("*Traceback*")
    # each sentence once: not again as the context of the failure that reports it
    result.stdout.no_fnmatch_line("*During handling of the above exception*")
    # the short summary repeats each error's first line (whole, not cut to the terminal's
    # width, where the CI variable is set): count in the report of the errors itself
    errors = result.stdout.str().split("short test summary info")[0]
    assert errors.count("it must lie in") == 1


def test_marker_help_and_the_docs_carry_the_signature_the_marker_takes(pytester):
    from pytest_ptq import settings

    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.ptq(model=None, data=None, *, holdout=None, float_model=None, "
                                 "custom_op_library=None, data_num=None, node_type='node', *min_cosine=0.99*"
                                 "tolerance=0.001, top=10, allow=(), baseline=None)*"])
    taken = re.findall(r"(\w+)=", settings.MARKER_SIGNATURE)
    accepted = [o.name for o in settings.OPTIONS if o.name not in settings.SESSION_ONLY] + list(settings.MARKER_ONLY)
    assert sorted(taken) == sorted(accepted)
    doc = (ROOT / "docs" / "plugin.md").read_text()
    shown = re.search(r"```text\n@pytest\.mark\.(ptq\(.*?\))\n```", doc, re.S).group(1)
    assert " ".join(shown.split()) == settings.MARKER_SIGNATURE
    help_text = run(pytester, "--help").stdout.str()
    flags = help_entries(help_text, "post-training quantization accuracy contracts (pytest-ptq):")
    table = set(re.findall(r"^\| `(--ptq-[a-z-]+)", doc, re.M))
    assert table == set(flags)


def test_one_analysis_per_model_data_and_sample_count(project, monkeypatch):
    # through sys.modules, as the plugin's lazy import does: pytester drops modules that
    # earlier in-process runs imported, so the package attribute may be a stale copy
    analysis = importlib.import_module("pytest_ptq.analysis")
    built = []

    class CountingEngine(analysis.Engine):
        def __init__(self, model, data, **kw):
            built.append((model.rsplit("/", 1)[-1], kw.get("data_num")))
            super().__init__(model, data, **kw)

    monkeypatch.setattr(analysis, "Engine", CountingEngine)
    project.makepyfile("""
        import pytest

        pytestmark = pytest.mark.ptq(data="calib")

        @pytest.mark.ptq(model="model.onnx")
        def test_a(ptq):
            ptq.assert_outputs(0.5)

        @pytest.mark.ptq(model="model.onnx")
        def test_b(ptq, ptq_analysis):
            ptq.assert_nodes(0.5)
            assert ptq.analysis is ptq_analysis

        @pytest.mark.ptq(model="model.onnx", data_num=2)
        def test_fewer_samples(ptq_analysis):
            assert ptq_analysis.samples == 2

        @pytest.mark.parametrize("ptq_model", ["model.onnx", "model_pc.onnx"], indirect=True)
        def test_two_models(ptq, ptq_model):
            assert ptq.analysis.key.model == str(ptq_model)
            ptq.assert_outputs(0.9)
    """)
    result = run(project)
    result.assert_outcomes(passed=5)
    # model.onnx is freed, engine and all, after its last item known at collection (test_fewer_samples):
    # test_two_models, whose model is known only at run time, compiles it again
    assert sorted(built, key=str) == [("model.onnx", 2), ("model.onnx", None), ("model.onnx", None),
                                      ("model_pc.onnx", None)]


def test_memory_and_workers_reach_every_engine_and_leave_results_alone(project):
    """--ptq-memory / --ptq-workers (and their ini keys) set how each model's engine runs;
    the sensitivities are those of the default (fast, for this small conv net) to float
    rounding, so the options are not part of a result's identity."""
    project.makepyfile("""
        import json, pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_engine(ptq_analysis, pytestconfig):
            engine = ptq_analysis.engine
            mode = pytestconfig.getini("ptq_memory") or pytestconfig.getoption("ptq_memory") or "auto"
            with open(f"{mode}.json", "w") as f:
                json.dump({"low": engine.shared.low_memory, "workers": engine.workers,
                           "ranking": ptq_analysis.sensitivity("activation")}, f)
    """)
    run(project).assert_outcomes(passed=1)
    run(project, "--ptq-memory", "low", "--ptq-workers", "2").assert_outcomes(passed=1)
    project.makeini("[pytest]\nptq_memory = fast\n")
    run(project).assert_outcomes(passed=1)
    auto, low, fast = (json.loads((project.path / f"{m}.json").read_text()) for m in ("auto", "low", "fast"))
    assert (auto["low"], auto["workers"]) == (False, "auto")
    assert (low["low"], low["workers"]) == (True, 2)
    assert (fast["low"], fast["workers"]) == (False, "auto")
    ranking = auto["ranking"]
    assert len(ranking) >= 3 and low["ranking"].keys() == ranking.keys() == fast["ranking"].keys()
    for name, metrics in ranking.items():
        for metric, value in metrics.items():
            assert low["ranking"][name][metric] == pytest.approx(value, abs=1e-6), (name, metric)
            assert fast["ranking"][name][metric] == value


def test_bad_model_fails_setup_in_one_sentence(project):
    (project.path / "broken.onnx").write_bytes(b"not a model")
    project.makepyfile("""
        import pytest

        @pytest.mark.ptq(model="broken.onnx", data="calib")
        def test_broken(ptq):
            pass
    """)
    result = run(project)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*model file '*broken.onnx' is not a readable ONNX model*"])
    result.stdout.no_fnmatch_line("*Traceback*")


def test_pytest_html_gets_the_figures_as_extras(project):
    pytest.importorskip("pytest_html")
    project.makepyfile("""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_pass(ptq):
            ptq.assert_outputs(0.5)

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_fail(ptq):
            ptq.assert_outputs(1.0)
    """)
    result = run(project, "--html=page.html", "--self-contained-html")
    result.assert_outcomes(passed=1, failed=1)
    page = (project.path / "page.html").read_text()
    assert page.count("ptq-results") == 2  # one results table per test
    assert "ptq curves model.onnx" in page  # the failing test's cumulative curve
    assert "image/png" in page


def test_the_docs_helper_table_gives_each_assert_helpers_signature():
    """docs/plugin.md's table of the ``ptq`` fixture's helpers had left out assert_baseline's
    ``outputs``: each row is the helper's signature as Python states it."""
    import inspect

    from pytest_ptq.checks import PTQ

    doc = (ROOT / "docs" / "plugin.md").read_text()
    rows = dict(re.findall(r"^\| `(assert_\w+)(\(.*?\))` *\|", doc, re.M))
    helpers = {n: f for n, f in vars(PTQ).items() if n.startswith("assert_")}
    assert set(rows) == set(helpers)
    for name, shown in rows.items():
        sig = inspect.signature(inspect.unwrap(helpers[name]))
        params = [p for p in sig.parameters.values() if p.name != "self"]
        stated = "(" + ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params) + ")"
        assert shown == stated.replace("'cosine-similarity'", '"cosine-similarity"').replace("'warning'", '"warning"'), name

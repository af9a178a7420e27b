"""The ptq fixture's data, stage and remedy helpers, and the contract's data_check key.

Each check runs on a planted cause; its figures are compared with plain onnxruntime
sessions and numpy computed here, not with pytest_ptq.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import builders
from test_plugin import activation_pairs, keep_only, pooled_cosine, properties, run

N = 20  # the calibration count the data checks ask for, so that a good set has no finding


def _input_range(path):
    """(lo, hi, step) of the pair on the model input, read from the proto."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    s, z = float(inits[q.input[1]]), int(inits[q.input[2]])
    return s * (0 - z), s * (255 - z), s


def stage_outputs(float_path, qdq_path, feeds):
    """``prob`` of every sample under the float reference and the three stages, plain sessions."""
    level = ort.GraphOptimizationLevel

    def session(path, opt, fake_quant=False):
        so = ort.SessionOptions()
        so.graph_optimization_level = opt
        if fake_quant:
            so.add_session_config_entry("session.disable_quant_qdq", "1")
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    sessions = {"reference": session(float_path, level.ORT_DISABLE_ALL),
                "optimized-float": session(float_path, level.ORT_ENABLE_ALL),
                "fake-quant": session(qdq_path, level.ORT_ENABLE_ALL, True),
                "integer": session(qdq_path, level.ORT_ENABLE_ALL)}
    return {k: [s.run(["prob"], f)[0] for f in feeds] for k, s in sessions.items()}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A model calibrated on normalised data, good and planted data folders, and a model
    whose r1 activation scale is 64 times too coarse (a calibration fault)."""
    root = tmp_path_factory.mktemp("extras")
    data = builders.samples(N, seed=5)
    float_path = builders.conv_net(root / "float.onnx")
    builders.quantize(float_path, root / "model.onnx", data)
    builders.save_folder(data, root / "calib")
    arrays = [a.copy() for a in data["x"]]
    arrays[7] = arrays[3].copy()
    arrays[5] = np.full_like(arrays[5], 0.25)
    builders.save_folder({"x": arrays}, root / "repeats")
    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 256, (1, 3, 16, 16)).astype(np.float32) for _ in range(N)]
    builders.save_folder({"x": pixels}, root / "pixels")
    builders.save_folder({"x": data["x"][:4]}, root / "few")
    # calibrated on low-contrast samples: the ranges miss ordinary data
    dim = {"x": [a * 0.2 for a in data["x"]]}
    builders.quantize(float_path, root / "dim.onnx", dim)
    builders.save_folder(dim, root / "dim_calib")
    builders.save_folder(builders.samples(N, seed=6), root / "holdout")
    planted = onnx.load(str(root / "model.onnx"))
    for init in planted.graph.initializer:
        if init.name == "r1_scale":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 64, init.name))
    onnx.save(planted, str(root / "planted.onnx"))
    lo, hi, step = _input_range(root / "model.onnx")
    values = np.stack(pixels)
    clipped = float(np.mean((values < lo - step / 2) | (values > hi + step / 2)))
    feeds = [{"x": a} for a in data["x"]]
    stages = {name: stage_outputs(float_path, root / name, feeds) for name in ("model.onnx", "planted.onnx")}
    return {"root": root, "clipped": clipped, "feeds": feeds, "stages": stages}


@pytest.fixture
def project(pytester, models):
    for item in models["root"].iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy)(item, pytester.path / item.name)
    return pytester


# -- data ------------------------------------------------------------------------------------
def test_assert_data_names_the_planted_findings_and_passes_a_good_set(project, models):
    project.makepyfile("""
        import pytest

        pytestmark = pytest.mark.ptq(model="model.onnx")

        @pytest.mark.ptq(data="calib")
        def test_good(ptq):
            result = ptq.assert_data(max_severity="info")
            assert result.findings == [] and result.samples == 20

        @pytest.mark.ptq(data="repeats")
        def test_repeats(ptq):
            ptq.assert_data()

        @pytest.mark.ptq(data="repeats")
        def test_repeats_accepted(ptq):
            result = ptq.assert_data(max_severity="error")
            assert [f["check"] for f in result.findings] == ["constant", "duplicate"]

        @pytest.mark.ptq(data="pixels")
        def test_pixels(ptq):
            ptq.assert_data(max_severity="error")

        @pytest.mark.ptq(data="few")
        def test_few(ptq):
            assert not ptq.check_data()
            ptq.assert_data(max_severity="error")

        @pytest.mark.ptq(data="calib")
        def test_bad_severity(ptq):
            ptq.assert_data(max_severity="fatal")
    """)
    result = run(project, "--junitxml=junit.xml")
    result.assert_outcomes(passed=3, failed=3)
    props = properties(project.path / "junit.xml")
    assert props["test_repeats"]["ptq.data.failing"] == "constant,duplicate"
    assert props["test_pixels"]["ptq.data.failing"] == "range"
    assert (props["test_pixels"]["ptq.data.errors"], props["test_pixels"]["ptq.data.warnings"]) == ("1", "1")
    assert props["test_few"]["ptq.data.failing"] == "count"
    share = f"{models['clipped']:.1%}"
    assert share not in ("0.0%", "100.0%")
    result.stdout.fnmatch_lines([
        "*ContractFailed: 2 finding(s) at or above warning in the calibration data repeats of model.onnx: "
        'constant (warning), duplicate (warning); fix them as listed below; or accept warnings by setting '
        'max_severity to error',
        "*WARNING constant [[]calibration:x[]]: 1 sample(s) hold a single value*",
        "*samples: repeats/x/5.npy",
        "*fix: replace them with representative samples",
        "*WARNING duplicate [[]calibration[]]: 1 sample(s) repeat others (3.npy = 7.npy)*",
        "*fix: drop the copies and add distinct samples",
    ])
    result.stdout.fnmatch_lines([
        "*ContractFailed: 1 finding(s) at or above error in the calibration data pixels of model.onnx: range (error)*",
        f"*ERROR   range [[]calibration:x[]]: {share} of the values fall outside*",
        "*fix: apply the model's own preprocessing*",
        "*WARNING raw-pixels*",
    ])
    result.stdout.fnmatch_lines(["*max_severity must be one of error, warning, info, got 'fatal'*"])


def test_assert_data_compares_with_the_marker_holdout(project, models):
    project.makepyfile("""
        import pytest

        @pytest.mark.ptq(model="dim.onnx", data="dim_calib", holdout="holdout")
        def test_dim(ptq):
            ptq.assert_data()

        @pytest.mark.ptq(model="model.onnx", data="calib", holdout="holdout")
        def test_representative(ptq):
            # drawn like the calibration set: a little clipping (a warning), no error
            result = ptq.assert_data(max_severity="error")
            assert "not-representative" not in [f["check"] for f in result.findings]
    """)
    result = run(project)
    result.assert_outcomes(passed=1, failed=1)
    feeds = [{"x": np.load(models["root"] / "holdout" / "x" / f"{i}.npy")} for i in range(N)]
    ref = builders.run_model(models["root"] / "float.onnx", feeds)
    got = builders.run_model(models["root"] / "dim.onnx", feeds)
    cosine = pooled_cosine([r["prob"] for r in ref], [g["prob"] for g in got])
    assert cosine < 0.99
    result.stdout.fnmatch_lines([
        "*calibration data dim_calib (held out: holdout) of dim.onnx: not-representative (error)*",
        "*ERROR   not-representative [[]heldout[]]: quantization keeps cosine-similarity at * on the calibration "
        "data but only * on the held-out data (threshold 0.99, min_cosine (--ptq-min-cosine))*",
    ])
    shown = re.search(r"but only ([0-9.]+) on the held-out data", result.stdout.str()).group(1)
    # loose: a float32 difference flips a rounding of the badly clipped model here and there
    assert float(shown) == pytest.approx(cosine, abs=1e-4)


# -- stages ----------------------------------------------------------------------------------
def test_a_data_checks_held_out_comparison_keeps_the_floor_the_contract_or_the_test_sets(project, models):
    """A contract's data_check judged the held-out figure against a fixed 0.99 that the user
    never set: its outputs item passed the figure on the contract's own floor and its
    data_check failed the same figure. Both now hold it to the outputs floor (a test to its
    min_cosine), and the finding says where the threshold comes from."""
    feeds = [{"x": np.load(models["root"] / "holdout" / "x" / f"{i}.npy")} for i in range(N)]
    ref = builders.run_model(models["root"] / "float.onnx", feeds)
    got = builders.run_model(models["root"] / "dim.onnx", feeds)
    cosine = pooled_cosine([r["prob"] for r in ref], [g["prob"] for g in got])
    loose, strict = round(cosine - 0.02, 4), round(cosine + 0.005, 4)
    assert strict < 0.99  # both floors below the fixed threshold the check used
    for name, floor in (("loose", loose), ("strict", strict)):
        (project.path / f"{name}.ptq.yaml").write_text(
            f"model: dim.onnx\ndata: dim_calib\nholdout: holdout\nbaseline: false\noutputs: {{default: {floor}}}\n"
            "data_check: {max_severity: error}\n")
    project.makepyfile(f"""
        import pytest

        @pytest.mark.ptq(model="dim.onnx", data="dim_calib", holdout="holdout", min_cosine={loose})
        def test_min_cosine(ptq):
            ptq.assert_data(max_severity="error")

        @pytest.mark.ptq(model="dim.onnx", data="dim_calib", holdout="holdout")
        def test_threshold(ptq):
            ptq.assert_data(max_severity="error", threshold={strict})
    """)
    result = run(project, "-v")
    result.stdout.fnmatch_lines(["*loose.ptq.yaml::outputs PASSED*", "*loose.ptq.yaml::data_check PASSED*"],
                                consecutive=False)
    result.stdout.fnmatch_lines(["*strict.ptq.yaml::outputs FAILED*", "*strict.ptq.yaml::data_check FAILED*"],
                                consecutive=False)
    result.stdout.fnmatch_lines(["*test_min_cosine PASSED*", "*test_threshold FAILED*"], consecutive=False)
    result.stdout.fnmatch_lines([
        f"ERROR   not-representative [[]heldout[]]: *on the held-out data (threshold {strict}, the contract's outputs "
        "floor)*"])
    result.stdout.fnmatch_lines([f"*not-representative*on the held-out data (threshold {strict}, as given)*"])


def test_held_out_data_is_taken_in_either_spelling_wherever_the_plugin_takes_it(project, models):
    """The CLI and the API spell it heldout, the plugin holdout: ptq.suggest's note told a
    plugin user to pass heldout=, which the marker, a contract and the ptq.* checks then
    refused. Each takes both (measured on the held-out data), and refuses both at once."""
    feeds = [{"x": np.load(models["root"] / "holdout" / "x" / f"{i}.npy")} for i in range(N)]
    ref = builders.run_model(models["root"] / "float.onnx", feeds)
    got = builders.run_model(models["root"] / "model.onnx", feeds)
    held = pooled_cosine([r["prob"] for r in ref], [g["prob"] for g in got])
    (project.path / "y.ptq.yaml").write_text("model: model.onnx\ndata: calib\nheldout: holdout\nbaseline: false\n")
    project.makepyfile(f"""
        import pytest

        HELD = {held!r}

        @pytest.mark.ptq(model="model.onnx", data="calib", heldout="holdout")
        def test_marker(ptq):
            assert ptq.check_outputs().values["prob"] == pytest.approx(HELD, abs=2e-7)

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_keywords(ptq):
            assert ptq.check_outputs(heldout="holdout").values["prob"] == pytest.approx(HELD, abs=2e-7)
            assert ptq.assert_outputs(heldout="holdout", threshold=0.5).holdout.endswith("holdout")
            assert ptq.check_data(heldout="holdout").holdout == "holdout"
            assert "held-out" in ptq.suggest(target=0.5, heldout="holdout").figures
            # without any, the note names the spellings a test takes (--heldout is the CLI's alone)
            note = next(n for n in ptq.suggest(target=0.5).notes if n.startswith("no held-out data"))
            assert "(heldout=, --heldout, or under pytest --ptq-heldout)" in note, note

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_both(ptq):
            ptq.check_outputs(heldout="holdout", holdout="holdout")
    """)
    result = run(project, "-v", "--junitxml=junit.xml")
    result.stdout.fnmatch_lines(["*y.ptq.yaml::outputs PASSED*"], consecutive=False)
    value = float(properties(project.path / "junit.xml")["outputs"]["ptq.outputs.prob.cosine-similarity"])
    assert value == pytest.approx(held, abs=2e-7)
    result.stdout.fnmatch_lines(["*test_marker PASSED*", "*test_keywords PASSED*", "*test_both FAILED*"],
                                consecutive=False)
    result.stdout.fnmatch_lines(["*ptq.check_outputs() gives both 'holdout' and 'heldout', two spellings of one "
                                 "setting; keep one*"])
    result.stdout.no_fnmatch_line("*Traceback*")
    (project.path / "y.ptq.yaml").write_text("model: model.onnx\ndata: calib\nheldout: holdout\nholdout: holdout\n")
    both = run(project, "y.ptq.yaml")
    both.stdout.fnmatch_lines(["*contract 'y.ptq.yaml' gives both 'holdout' and 'heldout', two spellings of one "
                               "setting; keep one*"])


def test_paths_given_to_the_checks_are_relative_to_the_test_module_as_the_markers_are(project):
    # the test module in a folder of its own, pytest run from the project root
    sub = project.path / "suite"
    sub.mkdir()
    (sub / "test_here.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.ptq(model='../model.onnx', data='../calib')\n"
        "def test_here(ptq):\n"
        "    ptq.check_stages(float_model='../float.onnx', min_cosine=0.0)\n"
        "    ptq.check_outputs(0.0, holdout='../holdout')\n")
    result = run(project, "suite")
    result.assert_outcomes(passed=1)


def test_assert_stages_checks_the_integer_kernels_against_float_and_simulation(project, models):
    out = models["stages"]["model.onnx"]
    integer = pooled_cosine(out["reference"], out["integer"])
    gap = pooled_cosine(out["fake-quant"], out["integer"])
    bound = min(integer, gap)
    planted = models["stages"]["planted.onnx"]
    planted_fake = pooled_cosine(planted["reference"], planted["fake-quant"])
    assert planted_fake < 0.999 < pooled_cosine(planted["reference"], planted["optimized-float"])
    project.makepyfile(f"""
        import pytest

        pytestmark = pytest.mark.ptq(data="calib", float_model="float.onnx")

        @pytest.mark.ptq(model="model.onnx")
        def test_just_below(ptq):
            ptq.assert_stages(min_cosine={bound - 1e-6!r})

        @pytest.mark.ptq(model="model.onnx")
        def test_just_above(ptq):
            ptq.assert_stages(min_cosine={bound + 1e-6!r})

        @pytest.mark.ptq(model="planted.onnx")
        def test_planted(ptq):
            ptq.assert_stages(min_cosine=0.999)

        @pytest.mark.ptq(model="model.onnx", float_model=None)
        def test_no_float_model(ptq):
            ptq.assert_stages()
    """)
    result = run(project, "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=3)
    props = properties(project.path / "junit.xml")
    below = props["test_just_below"]
    assert float(below["ptq.stages.integer.cosine-similarity"]) == pytest.approx(integer, abs=1e-9)
    assert float(below["ptq.stages.kernel_gap.cosine-similarity"]) == pytest.approx(gap, abs=1e-9)
    assert float(below["ptq.stages.fake-quant.cosine-similarity"]) == pytest.approx(
        pooled_cosine(out["reference"], out["fake-quant"]), abs=1e-9)
    assert props["test_planted"]["ptq.stages.first_drop"] == "fake-quant"
    result.stdout.fnmatch_lines([
        f"*ContractFailed: the integer-kernel outputs reach cosine * against float, below {0.999:g}*"
        f"first falls below 0.999 at stage 'fake-quant' ({planted_fake:.6g}): the simulated quantization loses it*",
        "*| integer vs fake-quant | *| >= 0.999 *| how far the integer kernels are from the simulation *|",
    ])
    result.stdout.fnmatch_lines(["*comparing the stages of model.onnx needs the float model it came from; pass "
                                 "float_model=..., the marker's float_model= or --ptq-float-model*"])
    failing = "integer-kernel outputs reach cosine" if integer < gap else "integer kernels reach only cosine"
    result.stdout.fnmatch_lines([f"*ContractFailed: *{failing}*below {bound + 1e-6:g}*"])


# -- remedies --------------------------------------------------------------------------------
def test_suggest_returns_the_remedy_whose_value_a_rewired_model_reproduces(project, models):
    project.makepyfile("""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib", float_model="float.onnx")
        def test_suggest(ptq):
            remedy = ptq.suggest(target=0.99999)
            # met in simulation; true only where the re-quantized model meets it too
            assert remedy.met and remedy.remedy == "float" and remedy.measured is not None
            assert bool(remedy) == (remedy.measured["met"] and remedy.failure() is None)
            assert ptq.suggest(target=0.99999) is remedy  # kept on the analysis, searched once
            remedy.save("remedy.json")

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_bad_target(ptq):
            ptq.suggest(target="high")
    """)
    result = run(project)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*target must be a number, got 'high'*"])
    remedy = json.loads((project.path / "remedy.json").read_text())
    model = models["root"] / "model.onnx"
    pairs = [n.name for n in onnx.load(str(model)).graph.node if n.op_type == "QuantizeLinear"]
    assert remedy["nodes"] and set(remedy["nodes"]) <= set(pairs)
    ref = [r["prob"] for r in builders.run_model(keep_only(model), models["feeds"])]
    fixed = builders.run_model(keep_only(model, set(pairs) - set(remedy["nodes"])), models["feeds"])
    assert remedy["value"] == pytest.approx(pooled_cosine(ref, [g["prob"] for g in fixed]), abs=1e-6)
    assert remedy["value"] >= 0.99999 > remedy["baseline"]
    assert len(activation_pairs(model)) < len(pairs)  # weights were candidates too


# -- the contract key ------------------------------------------------------------------------
def test_contract_data_check_item(project):
    (project.path / "repeats.ptq.yaml").write_text(
        "model: model.onnx\ndata: repeats\nbaseline: false\ndata_check: {max_severity: warning}\n")
    (project.path / "good.ptq.yaml").write_text("model: model.onnx\ndata: calib\nbaseline: false\ndata_check: true\n")
    result = run(project, "-v")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*good.ptq.yaml::data_check PASSED*", "*repeats.ptq.yaml::data_check FAILED*"])
    result.stdout.fnmatch_lines([
        "contract repeats (repeats.ptq.yaml), check data_check: FAILED",
        "2 finding(s) at or above warning in the calibration data repeats of model.onnx: constant (warning), "
        "duplicate (warning)*",
    ])
    result.stdout.no_fnmatch_line("*Traceback*")


@pytest.mark.parametrize("value, message", [
    ("{max_severity: severe}", "'data_check.max_severity' must be one of error, warning, info, got 'severe'"),
    ("{max_sev: error}", "unknown key 'data_check.max_sev'; did you mean 'max_severity'?"),
    ("warning", "'data_check' must be a mapping such as '{max_severity: warning}' or true, got 'warning'"),
])
def test_contract_data_check_schema_errors_name_the_key(pytester, value, message):
    pytester.path.joinpath("m.ptq.yaml").write_text(f"model: m.onnx\ndata: calib\ndata_check: {value}\n")
    result = run(pytester)
    assert result.ret != 0
    result.stdout.fnmatch_lines([f"*contract 'm.ptq.yaml': {message}*"])


def test_a_data_check_threshold_without_held_out_data_is_refused(project):
    """ptq.check_data(threshold=...) without held-out data judged nothing and passed in
    silence, where the CLI and the API refuse it."""
    project.makepyfile("""
        import pytest

        @pytest.mark.ptq(model="model.onnx", data="calib")
        def test_threshold(ptq):
            ptq.assert_data(threshold=0.95)
    """)
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*check_data's threshold and metric judge the held-out comparison alone; give "
                                 "held-out data*"])

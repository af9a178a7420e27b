"""Baselines: missing -> fail; update -> still fail but written; rerun -> pass; model changed
-> fail naming the nodes old -> new; update-all -> pass. Partial runs delete nothing.

The figures in a baseline and the nodes a failure names are checked against plain
onnxruntime sessions on rewired models (test_plugin.keep_only), computed here.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil

import pytest

import builders
from test_plugin import N, activation_pairs, feeds_of, independent_sensitivity, pooled_cosine, keep_only, run

TOL = 1e-4
GUARDED = f"""
import pytest

pytestmark = pytest.mark.ptq(data="calib", node_type="activation", tolerance={TOL})

@pytest.mark.ptq(model="model.onnx")
def test_guarded(ptq):
    ptq.assert_baseline()
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """model.onnx, and model_clipped.onnx: the same net calibrated on data shrunk 10x, so
    its activation ranges clip and some activation nodes get more sensitive."""
    root = tmp_path_factory.mktemp("baseline_models")
    float_path = builders.conv_net(root / "float.onnx")
    data = builders.samples(N)
    builders.save_folder(data, root / "calib")
    builders.quantize(float_path, root / "model.onnx", data)
    builders.quantize(float_path, root / "model_clipped.onnx", {k: [a * 0.1 for a in v] for k, v in data.items()})
    builders.quantize(float_path, root / "model_pc.onnx", data, per_channel=True)
    return {"root": root, "feeds": feeds_of(data)}


@pytest.fixture
def project(pytester, models):
    for name in ("model.onnx", "model_clipped.onnx", "model_pc.onnx"):
        shutil.copy(models["root"] / name, pytester.path / name)
    shutil.copytree(models["root"] / "calib", pytester.path / "calib")
    return pytester


def moved_lines(text):
    """``{node: (old, new)}`` from the failure's ``  node: old -> new (worse by d)`` lines."""
    return {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^E?\s+(\S+): (\S+) -> (\S+) \(worse by \S+\)$", text, re.M)}


def printed_command(result, after):
    """The command quoted in backticks right after ``after`` in a run's output, as argv."""
    match = re.search(re.escape(after) + r" `([^`]+)`", result.stdout.str())
    assert match, f"no command after {after!r}"
    return shlex.split(match.group(1))


def run_printed(pytester, result, after):
    """Run the command a message printed, literally (in process, from the same folder)."""
    argv = printed_command(result, after)
    assert argv[0] == "pytest"
    return pytester.runpytest_inprocess(*argv[1:])


def test_baseline_lifecycle(project, models):
    project.makepyfile(test_life=GUARDED)
    path = project.path / "ptq_baselines" / "test_life" / "test_guarded.json"

    missing = run(project)
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*baseline ptq_baselines/test_life/test_guarded.json does not exist, so there "
                                  "is nothing to compare model.onnx against; create it with `pytest -p * "
                                  "test_life.py::test_guarded --ptq-update-baseline`, review it and commit it"])
    assert not path.exists()

    # the command the message prints, run as printed: it selects the test and writes its baseline
    created = run_printed(project, missing, "create it with")
    created.assert_outcomes(failed=1)
    created.stdout.fnmatch_lines(["*baseline ptq_baselines/test_life/test_guarded.json did not exist and has been "
                                  "written; review and commit it, then rerun `pytest -p * test_life.py::test_guarded` "
                                  "(this run fails *"])
    text = path.read_text()
    saved = json.loads(text)
    assert text == json.dumps(saved, indent=2, sort_keys=True) + "\n"
    assert str(project.path) not in text  # no machine-specific path
    assert saved["model"] == {"path": "../../model.onnx",
                              "sha256": hashlib.sha256((project.path / "model.onnx").read_bytes()).hexdigest()}
    assert saved["data"]["samples"] == N and saved["metric"] == "cosine-similarity"
    assert set(saved["tool"]) == {"pytest_ptq", "onnxruntime", "onnx"}
    names = activation_pairs(project.path / "model.onnx")
    before = independent_sensitivity(project.path / "model.onnx", models["feeds"], names)
    assert set(saved["sensitivity"]) == set(names)
    for name, value in before.items():
        assert saved["sensitivity"][name] == pytest.approx(value, abs=2e-7), name
    ref = builders.run_model(keep_only(project.path / "model.onnx"), models["feeds"])
    quant = builders.run_model(project.path / "model.onnx", models["feeds"])
    assert saved["outputs"]["prob"] == pytest.approx(pooled_cosine([r["prob"] for r in ref],
                                                                   [q["prob"] for q in quant]), abs=2e-7)

    run(project).assert_outcomes(passed=1)

    shutil.copy(project.path / "model_clipped.onnx", project.path / "model.onnx")
    after = independent_sensitivity(project.path / "model.onnx", models["feeds"], names)
    expected = {n for n in names if saved["sensitivity"][n] - after[n] > TOL}
    assert expected, "the clipped calibration must degrade some activation node"
    changed = run(project)
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines([
        f"*{len(expected)} node(s)* of model.onnx got worse than baseline ptq_baselines/test_life/test_guarded.json "
        f"by more than 0.0001 cosine-similarity; if intended, run `pytest -p * test_life.py::test_guarded "
        "--ptq-update-baseline`*",
        "*the model changed since the baseline (sha256 *",
        # a degraded baseline is a quantization loss: the model's diagnosis names its cause
        "*_ ptq: model.onnx FAILED: 1 of 1 test(s) failed _*",
        "  FAILED baseline * got worse than baseline *",
        "cause: activations: *",
    ])
    moved = moved_lines(changed.stdout.str())
    assert set(moved) - {"prob"} == expected
    for name in expected:
        old, new = moved[name]
        assert old == pytest.approx(saved["sensitivity"][name], abs=1e-6)
        assert new == pytest.approx(after[name], abs=1e-6)

    run(project, "--ptq-update-all").assert_outcomes(passed=1)
    rewritten = json.loads(path.read_text())
    for name in names:
        assert rewritten["sensitivity"][name] == pytest.approx(after[name], abs=2e-7), name
    run(project).assert_outcomes(passed=1)


def test_update_rewrites_only_failing_baselines(project):
    project.makepyfile(test_two=GUARDED + """
@pytest.mark.ptq(model="model_pc.onnx")
def test_other(ptq):
    ptq.assert_baseline()
""")
    run(project, "--ptq-update-baseline").assert_outcomes(failed=2)
    guarded = project.path / "ptq_baselines" / "test_two" / "test_guarded.json"
    other = project.path / "ptq_baselines" / "test_two" / "test_other.json"
    other_before, other_mtime = other.read_bytes(), other.stat().st_mtime_ns
    guarded_before = guarded.read_bytes()
    shutil.copy(project.path / "model_clipped.onnx", project.path / "model.onnx")
    result = run(project, "--ptq-update-baseline", "-v")
    result.stdout.fnmatch_lines(["*test_guarded FAILED*", "*test_other PASSED*"])
    result.stdout.fnmatch_lines(["*baseline ptq_baselines/test_two/test_guarded.json failed against it and has "
                                 "been rewritten from this run (model.onnx); rerun to compare against it"])
    assert guarded.read_bytes() != guarded_before
    assert other.read_bytes() == other_before and other.stat().st_mtime_ns == other_mtime
    run(project).assert_outcomes(passed=2)


def test_partial_runs_delete_nothing(project):
    project.makepyfile(test_part=GUARDED + """
@pytest.mark.ptq(model="model_pc.onnx")
def test_other(ptq):
    ptq.assert_baseline()
""")
    folder = project.path / "ptq_baselines" / "test_part"
    run(project, "--ptq-update-all").assert_outcomes(passed=2)
    stale = folder / "test_removed_long_ago.json"
    stale.write_text("{}")
    snapshot = {p.name: p.read_bytes() for p in folder.iterdir()}
    run(project, "--ptq-update-all", "-k", "other").assert_outcomes(passed=1, deselected=1)
    run(project, "--ptq-update-baseline", "-n", "2").assert_outcomes(passed=2)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == snapshot


def test_workers_write_their_baselines(project):
    project.makepyfile(test_xd=GUARDED + """
@pytest.mark.ptq(model="model_pc.onnx")
def test_other(ptq):
    ptq.assert_baseline()
""")
    run(project, "-n", "2", "--ptq-update-baseline").assert_outcomes(failed=2)
    assert sorted(p.name for p in (project.path / "ptq_baselines" / "test_xd").iterdir()) == [
        "test_guarded.json", "test_other.json"]
    run(project, "-n", "2").assert_outcomes(passed=2)


def test_tolerance_is_a_tolerance(project):
    """A node that looks worse than its baseline by half the tolerance passes; by twice, fails."""
    project.makepyfile(test_tol=GUARDED)
    run(project, "--ptq-update-baseline").assert_outcomes(failed=1)
    path = project.path / "ptq_baselines" / "test_tol" / "test_guarded.json"
    saved = json.loads(path.read_text())
    node = sorted(saved["sensitivity"], key=saved["sensitivity"].get)[0]
    for shift, outcome in ((0.5 * TOL, "passed"), (2 * TOL, "failed")):
        nudged = dict(saved, sensitivity=dict(saved["sensitivity"], **{node: saved["sensitivity"][node] + shift}))
        path.write_text(json.dumps(nudged))
        result = run(project)
        result.assert_outcomes(**{outcome: 1})
    assert set(moved_lines(result.stdout.str())) == {node}


def test_unreadable_baseline_fails_in_one_sentence(project):
    project.makepyfile(test_bad=GUARDED)
    path = project.path / "ptq_baselines" / "test_bad" / "test_guarded.json"
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*baseline ptq_baselines/test_bad/test_guarded.json cannot be read (it is not valid "
                                 "JSON: Expecting property name enclosed in double quotes: line 1 column 3 (char 2)); "
                                 "rewrite it with `pytest -p * test_bad.py::test_guarded --ptq-update-baseline`"])
    run_printed(project, result, "rewrite it with").assert_outcomes(failed=1)
    run(project).assert_outcomes(passed=1)


def test_printed_commands_glue_option_values_with_equals(project):
    """pytest takes an option's value after a space for a path to test as it finds the rootdir
    (a report file that exists moved it, and the ini file went unread): the commands a failure
    prints write '--ptq-top=3', and they still run as printed."""
    project.makepyfile(test_life=GUARDED)
    missing = run(project, "--ptq-top", "3")
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*create it with `pytest -p * --ptq-top=3 test_life.py::test_guarded "
                                  "--ptq-update-baseline`*"])
    run_printed(project, missing, "create it with").assert_outcomes(failed=1)
    assert (project.path / "ptq_baselines" / "test_life" / "test_guarded.json").exists()


def test_printed_commands_leave_the_sessions_reports_alone(project):
    """A printed command reruns one test: with the run's --ptq-report or --junitxml it would
    overwrite the whole session's report with a page of that test."""
    project.makepyfile(test_life=GUARDED)
    missing = run(project, "--ptq-report", "r.html", "--junitxml=j.xml", "--ptq-top=3")
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*create it with `pytest -p * --ptq-top=3 test_life.py::test_guarded "
                                  "--ptq-update-baseline`*"])
    assert "r.html" not in missing.stdout.str().split("create it with")[1].split("`")[1]
    report = (project.path / "r.html").read_bytes()
    run_printed(project, missing, "create it with").assert_outcomes(failed=1)
    assert (project.path / "r.html").read_bytes() == report


def test_a_baseline_that_would_compare_nothing_fails_and_says_why(project):
    """Every node named anew (another export) left none of the baseline's nodes measured, and
    the check passed comparing nothing; a baseline of another metric listed cosines against
    mse values as moves."""
    import onnx

    project.makepyfile(test_names=GUARDED)
    run(project, "--ptq-update-baseline").assert_outcomes(failed=1)
    run(project).assert_outcomes(passed=1)
    path = project.path / "ptq_baselines" / "test_names" / "test_guarded.json"
    saved = json.loads(path.read_text())
    model = onnx.load(str(project.path / "model.onnx"))
    for k, node in enumerate(model.graph.node):
        node.name = f"renamed_{k}"
    onnx.save(model, str(project.path / "model.onnx"))
    activations = set(saved["sensitivity"])
    renamed = run(project)
    renamed.assert_outcomes(failed=1)
    renamed.stdout.fnmatch_lines([f"*does not fit this check: none of the baseline's {len(activations)} node(s) is "
                                  "measured now*"])
    assert not moved_lines(renamed.stdout.str())
    path.write_text(json.dumps(dict(saved, metric="mse")))
    other = run(project)
    other.assert_outcomes(failed=1)
    other.stdout.fnmatch_lines(["*does not fit this check: the baseline holds mse of activation nodes but this check "
                                "measures cosine-similarity*"])
    assert not moved_lines(other.stdout.str()) and "worse by more than" not in other.stdout.str()
    path.write_text(json.dumps(dict(saved, sensitivity={})))
    emptied = run(project)
    emptied.assert_outcomes(failed=1)
    emptied.stdout.fnmatch_lines([f"*does not fit this check: the baseline holds no node values, and "
                                  f"{len(activations)} are measured now*"])
    # a value no cosine takes is an edited file, not a measurement to compare against
    path.write_text(json.dumps(dict(saved, sensitivity={f"renamed_{k}": 1e308 for k in range(3)})))
    huge = run(project)
    huge.assert_outcomes(failed=1)
    huge.stdout.fnmatch_lines(["*has a malformed 'sensitivity.renamed_0': it must be a cosine-similarity value "
                               "(in ?-1, 1?), got 1e+308*"])


def test_two_models_of_one_file_name_do_not_share_a_baseline(project):
    """The built-in contract names its baseline by the model's file name: a/model.onnx and
    b/model.onnx shared ptq_baselines/model.json. b was compared with a's numbers, its
    update replaced a's committed baseline, and a then passed against b's."""
    for folder, name in (("a", "model.onnx"), ("b", "model_clipped.onnx")):
        (project.path / folder).mkdir()
        shutil.copy(project.path / name, project.path / folder / "model.onnx")
    a, b = (("--ptq-model", f"{f}/model.onnx", "--ptq-data", "calib", "-k", "baseline") for f in "ab")
    run(project, *a, "--ptq-update-baseline").assert_outcomes(failed=1, deselected=2)
    baseline = project.path / "ptq_baselines" / "model.json"
    kept = baseline.read_bytes()
    assert json.loads(kept)["model"]["path"] == "../a/model.onnx"
    for extra in ((), ("--ptq-update-baseline",)):
        other = run(project, *b, *extra)
        other.assert_outcomes(failed=1, deselected=2)
        other.stdout.fnmatch_lines(["*it was made for the model ../a/model.onnx and this check measures "
                                    "../b/model.onnx*two models share this baseline file, or the model moved*"])
        assert baseline.read_bytes() == kept  # a's is not b's to rewrite
    run(project, *a).assert_outcomes(passed=1, deselected=2)
    # a model that moved: --ptq-update-all takes the baseline over
    run(project, *b, "--ptq-update-all").assert_outcomes(passed=1, deselected=2)
    assert json.loads(baseline.read_text())["model"]["path"] == "../b/model.onnx"


def test_two_tests_whose_ids_map_to_one_default_baseline_are_told_apart(project):
    """Ids that differ only in characters a file name cannot hold ("resnet v1", "resnet_v1")
    map to one default baseline file: the second compared with, or rewrote, the first's
    numbers. It is refused in one sentence naming both; a test given a path of its own, and
    tests that never compare with a baseline, are not."""
    project.makepyfile(test_ids="""
import pytest

pytestmark = pytest.mark.ptq(model="model.onnx", data="calib", node_type="activation")

@pytest.mark.parametrize("name", ["resnet v1", "resnet_v1"])
def test_guarded(ptq, name):
    ptq.assert_baseline()

@pytest.mark.parametrize("name", ["a b", "a_b"])
def test_own_path(ptq, name):
    ptq.assert_baseline(name.replace(" ", "-") + ".json")

@pytest.mark.parametrize("name", ["c d", "c_d"])
def test_outputs_only(ptq, name):
    ptq.assert_outputs(0.5)
""")
    result = run(project, "test_ids.py", "--ptq-update-baseline", "-p", "no:randomly")
    result.assert_outcomes(failed=4, passed=2)  # baselines written fail once; the shared one is refused
    assert ("tests test_ids.py::test_guarded[resnet v1] and test_ids.py::test_guarded[resnet_v1] share the "
            "default baseline file ptq_baselines/test_ids/test_guarded[resnet_v1].json (their ids differ only in "
            "characters a file name cannot hold)") in result.stdout.str()
    assert "Traceback" not in result.stdout.str()
    written = sorted(p.name for p in (project.path / "ptq_baselines").rglob("*.json"))
    assert written == ["test_guarded[resnet_v1].json"]
    assert sorted(p.name for p in project.path.glob("a*.json")) == ["a-b.json", "a_b.json"]


def test_a_baseline_written_by_this_run_fails_each_check_of_it_in_this_run(project):
    """--ptq-update-baseline fails the checks it wrote a baseline for, so that no run passes
    on a file it wrote itself; pytest-rerunfailures' rerun compared with the file the first
    attempt had just written, and the run passed. A later check of it (a rerun, a second
    call) fails as the first did; the next run compares."""
    project.makepyfile(test_twice=f"""
import pytest

pytestmark = pytest.mark.ptq(model="model.onnx", data="calib", node_type="activation", tolerance={TOL})

def test_twice(ptq):
    first, second = ptq.check_baseline(), ptq.check_baseline()
    assert (first.passed, first.status) == (second.passed, second.status) == (False, "created")

def test_shared_a(ptq):
    ptq.assert_baseline("shared.json")

def test_shared_b(ptq):
    ptq.assert_baseline("shared.json")
""")
    result = run(project, "test_twice.py", "--ptq-update-baseline")
    result.assert_outcomes(passed=1, failed=2)
    told = [line for line in result.stdout.lines
            if line.startswith("E ") and "baseline shared.json did not exist and has been written" in line]
    assert len(told) == 2  # test_shared_a's and test_shared_b's failures (the summary may repeat them)
    run(project, "test_twice.py").assert_outcomes(passed=2, failed=1)  # test_twice's first check compares now


def test_two_models_naming_one_baseline_file_in_one_run(project):
    """Two models whose contracts name one baseline file, updated in one run: both said "did
    not exist and has been written" though it held the first's numbers (the next run failed
    the other), and under xdist which model's numbers stayed was a race between workers."""
    for folder, name in (("a", "model.onnx"), ("b", "model_clipped.onnx")):
        (project.path / folder).mkdir()
        shutil.copy(project.path / name, project.path / folder / "model.onnx")
    project.makepyfile(test_clash="""
import pytest

@pytest.mark.ptq(model="a/model.onnx", data="calib", baseline="clash.json")
def test_a(ptq):
    ptq.assert_baseline()

@pytest.mark.ptq(model="b/model.onnx", data="calib", baseline="clash.json")
def test_b(ptq):
    ptq.assert_baseline()
""")
    for workers in ((), ("-n", "2")):
        (project.path / "clash.json").unlink(missing_ok=True)
        result = run(project, "test_clash.py", "--ptq-update-baseline", *workers)
        result.assert_outcomes(failed=2)
        text = result.stdout.str()
        owner = json.loads((project.path / "clash.json").read_text())["model"]["path"]
        other = "b" if owner == "a/model.onnx" else "a"
        assert owner in ("a/model.onnx", "b/model.onnx")
        assert text.count("clash.json did not exist and has been written") in (1, 2), text  # a summary may repeat it
        assert f"it was made for the model {owner} and this check measures {other}/model.onnx" in text, text
        result = run(project, "test_clash.py", *workers)  # the file is the first writer's, the other fails
        result.assert_outcomes(passed=1, failed=1)


REPEATED = """
import pytest

# pytest-repeat's convention (--count 2): a parameter of its own whose ids are "1-2", "2-2"
@pytest.fixture
def __pytest_repeat_step_number(request):
    return request.param

def pytest_generate_tests(metafunc):
    metafunc.fixturenames.append("__pytest_repeat_step_number")
    metafunc.parametrize("__pytest_repeat_step_number", range(2), indirect=True, ids=lambda i: f"{i + 1}-2")
"""


def test_the_repetitions_of_a_repeated_test_share_its_baseline(project):
    """pytest-repeat's --count N gave each repetition an id of its own ([1-2], [2-2]): each
    failed as a missing baseline beside the committed one, and an update wrote one per
    repetition."""
    project.makepyfile(test_rep=GUARDED.replace("test_guarded", "test_rep"))
    run(project, "test_rep.py", "--ptq-update-baseline").assert_outcomes(failed=1)
    run(project, "test_rep.py").assert_outcomes(passed=1)
    project.makeconftest(REPEATED)
    result = run(project, "test_rep.py", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_rep.py::test_rep?1-2? PASSED*", "*test_rep.py::test_rep?2-2? PASSED*"])
    run(project, "test_rep.py", "--ptq-update-baseline").assert_outcomes(passed=2)
    assert [p.name for p in (project.path / "ptq_baselines").rglob("*.json")] == ["test_rep.json"]


def test_a_contracts_output_slices_are_kept_in_its_baseline(project, models):
    """A contract's thresholds named a slice; its baseline kept the whole output only, so the
    slice could lose 4x the tolerance (and fail its own floor) while the baseline passed."""
    project.makefile(".ptq.yaml", c="model: model.onnx\ndata: calib\noutputs: {default: 0.5, \"cls=prob[:, 4:]\": 0.5}\n")
    run(project, "--ptq-update-baseline").assert_outcomes(passed=1, failed=1)
    saved = json.loads((project.path / "c.baseline.json").read_text())
    feeds = models["feeds"]
    ref = builders.run_model(builders.rewire(project.path / "model.onnx"), feeds)
    quant = builders.run_model(project.path / "model.onnx", feeds, "disable")
    want = pooled_cosine([r["prob"][:, 4:] for r in ref], [q["prob"][:, 4:] for q in quant])
    assert set(saved["outputs"]) == {"prob", "cls"} and saved["outputs"]["cls"] == pytest.approx(want, abs=1e-7)
    run(project).assert_outcomes(passed=2)


def test_the_same_model_reached_through_a_link_keeps_its_baseline(project):
    """The example suite's models live in a cache folder that an environment variable may
    put elsewhere behind a link: the path resolved through it differs from the committed
    baseline's, and its contract failed as measuring another model. The same bytes are the
    same model; another model's bytes under the baseline's name still fail."""
    (project.path / "store").mkdir()
    shutil.copy(project.path / "model.onnx", project.path / "store" / "model.onnx")
    (project.path / "cache").symlink_to(project.path / "store")
    args = ("--ptq-model", "store/model.onnx", "--ptq-data", "calib", "-k", "baseline")
    run(project, *args, "--ptq-update-baseline").assert_outcomes(failed=1, deselected=2)
    baseline = project.path / "ptq_baselines" / "model.json"
    # the baseline as committed where the folder was real, read where it is a link elsewhere
    saved = json.loads(baseline.read_text())
    baseline.write_text(json.dumps(dict(saved, model=dict(saved["model"], path="../cache/model.onnx"))))
    run(project, *args).assert_outcomes(passed=1, deselected=2)
    shutil.copy(project.path / "model_clipped.onnx", project.path / "store" / "model.onnx")
    other = run(project, *args)
    other.assert_outcomes(failed=1, deselected=2)
    other.stdout.fnmatch_lines(["*it was made for the model ../cache/model.onnx and this check measures "
                                "../store/model.onnx*"])


def _baseline(outputs, sensitivity=None):
    from pytest_ptq.baseline import Baseline

    return Baseline(metric="cosine-similarity", node_type="activation", outputs=dict(outputs),
                    sensitivity=dict(sensitivity or {"n": 0.999}))


def test_an_output_gone_nan_since_the_baseline_fails_the_comparison():
    """NaN (outputs gone non-finite) is worse than any number: 0.99 -> NaN must not pass."""
    import math

    from pytest_ptq.baseline import compare

    broken = compare(_baseline({"y": 0.99}), _baseline({"y": math.nan}), 1e-3)
    assert not broken.ok
    assert [(m.name, m.worse) for m in broken.outputs] == [("y", math.inf)]
    mended = compare(_baseline({"y": math.nan}), _baseline({"y": 0.99}), 1e-3)
    assert mended.ok and [m.name for m in mended.improved] == ["y"]
    # NaN both times did not move
    same = compare(_baseline({"y": math.nan}), _baseline({"y": math.nan}), 1e-3)
    assert same.ok and not same.improved


@pytest.mark.parametrize("times, ok", [(0.8, True), (1.2, False), (1.9, False)])
def test_a_move_past_the_tolerance_fails_and_one_within_it_passes(times, ok):
    """A value fails when it moved the wrong way by more than the tolerance (module doc)."""
    from pytest_ptq.baseline import compare

    tol = 1e-3
    old = _baseline({"y": 0.5}, {"n": 0.75})
    # cosine: worse is lower; both the output and the node move down by times x tol
    new = _baseline({"y": 0.5 - times * tol}, {"n": 0.75 - times * tol})
    result = compare(old, new, tol)
    assert result.ok is ok
    assert [m.name for m in result.outputs] == ([] if ok else ["y"])
    assert [m.name for m in result.nodes] == ([] if ok else ["n"])
    # moving the right way by as much is no failure
    assert compare(new, old, tol).ok

"""Accuracy contracts as data: ``*.ptq.yaml`` files collected as pytest items.

Thresholds sit just above or below figures computed here with plain onnxruntime, so a
pass or a fail proves the contract measured the right thing.
"""

from __future__ import annotations

import re
import shutil
import textwrap

import numpy as np
import pytest

import builders
from test_plugin import N, activation_pairs, feeds_of, independent_sensitivity, keep_only, pooled_cosine, run


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract_models")
    float_path = builders.conv_net(root / "float.onnx")
    data = builders.samples(N)
    builders.save_folder(data, root / "calib")
    builders.save_folder(builders.samples(N, seed=7), root / "holdout")
    builders.quantize(float_path, root / "model.onnx", data)
    feeds = feeds_of(data)
    ref = builders.run_model(keep_only(root / "model.onnx"), feeds)
    quant = builders.run_model(root / "model.onnx", feeds)
    names = activation_pairs(root / "model.onnx")
    return {"root": root, "feeds": feeds, "ref": ref, "quant": quant,
            "sensitivity": independent_sensitivity(root / "model.onnx", feeds, names)}


@pytest.fixture
def project(pytester, models):
    """model.onnx, calib/ and holdout/ under models/; contracts go in contracts/."""
    (pytester.path / "models").mkdir()
    for name in ("model.onnx", "calib", "holdout"):
        src = models["root"] / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, pytester.path / "models" / name)
    (pytester.path / "contracts").mkdir()
    return pytester


def contract(project, name, text):
    path = project.path / "contracts" / f"{name}.ptq.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_contract_checks_are_items_with_plain_failures(project, models):
    cos = pooled_cosine([r["prob"] for r in models["ref"]], [q["prob"] for q in models["quant"]])
    cls = pooled_cosine([r["prob"][:, 4:] for r in models["ref"]], [q["prob"][:, 4:] for q in models["quant"]])
    sens = models["sensitivity"]
    order = sorted(sens, key=sens.get)
    limit = (sens[order[1]] + sens[order[2]]) / 2
    contract(project, "net", f"""
        # paths are relative to this file
        model: ../models/model.onnx
        data: ../models/calib
        outputs:
          default: {cos - 1e-6}
          "cls=prob[:, 4:]": {cls + 1e-6}
        nodes:
          type: activation
          threshold: {limit}
          allow: [{order[0]}]
        baseline: false
    """)
    result = run(project, "-v")
    result.stdout.fnmatch_lines(["contracts/net.ptq.yaml::outputs FAILED*", "contracts/net.ptq.yaml::nodes FAILED*"])
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*_ ptq contract net: outputs _*",
        "contract net (net.ptq.yaml), check outputs: FAILED",
        "output cosine-similarity fails for 1 of 2 output(s): 'cls' * (needs >= *) [[]models/model.onnx, "
        "4 sample(s) of models/calib[]]",
        "| cls    | * | FAIL    |",
        "| prob   | * | ok      |",
        "*_ ptq contract net: nodes _*",
        "contract net (net.ptq.yaml), check nodes: FAILED",
        f"1 of {len(sens)} activation nodes of models/model.onnx are too sensitive (need cosine-similarity >= * "
        f"with only that node quantized): {order[1]} (*); *",
        "most sensitive nodes:",
        f"| {order[0]} *",
        "*_ ptq: models/model.onnx FAILED: 2 of 2 test(s) failed _*",
        "cause: *",
        # the slice that failed is what the ranking behind the explanation judges
        "most sensitive activation nodes (cosine-similarity of 'cls=prob[[]:, 4:]' with only that node quantized, *",
        f"  1. {order[0]} (activation *) *",
    ])
    out = result.stdout.str()
    assert "Traceback" not in out and "contract.py" not in out and "def runtest" not in out


def test_our_warnings_raised_as_errors_are_one_sentence(project):
    """Under ``filterwarnings = error`` a data warning (more samples asked for than the data
    holds) failed the contract's items with 35 lines of pytest's and pluggy's frames each, and
    a test's ``ptq`` fixture with the fixture's source; now one sentence each."""
    # pytest's own warning that the installed plugin was imported before it could rewrite it
    # is no concern of this test (it depends on how the project was installed)
    project.makeini("[pytest]\nfilterwarnings =\n    error\n    ignore::pytest.PytestAssertRewriteWarning\n")
    contract(project, "net", """
        model: ../models/model.onnx
        data: ../models/calib
        data_num: 50
        outputs:
          default: 0.5
        baseline: false
    """)
    project.makepyfile(test_w="""
        import pytest

        @pytest.mark.ptq(model="models/model.onnx", data="models/calib", data_num=50)
        def test_outputs(ptq):
            ptq.assert_outputs(0.5)

        @pytest.mark.ptq(model="models/model.onnx", data="models/calib")
        def test_baseline_outside(ptq):
            ptq.assert_baseline("../outside.baseline.json")  # a warning where the check runs
    """)
    result = run(project, "-v")
    result.assert_outcomes(failed=2, errors=1)
    out = result.stdout.str()
    assert out.count("calibration samples were asked for") >= 2 and "(warnings are errors in this run)" in out, out
    assert "lies outside the rootdir" in out and out.count("(warnings are errors in this run)") >= 3, out
    assert "pluggy/" not in out and "_pytest/" not in out and "def ptq_analysis" not in out, out
    assert "_raise_unless" not in out and "warnings.warn(" not in out, out
    assert not (project.path.parent / "outside.baseline.json").exists()


def test_a_skip_mark_on_a_contract_item_skips_it(project):
    contract(project, "net", """
        model: ../models/model.onnx
        data: ../models/calib
        outputs: 0.5
        baseline: false
    """)
    project.makeconftest("""
        import pytest
        def pytest_collection_modifyitems(items):
            for item in items:
                item.add_marker(pytest.mark.skip(reason="no tool here"))
    """)
    result = run(project, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] contracts/net.ptq.yaml*: no tool here"])
    assert "INTERNALERROR" not in result.stdout.str()


def test_contract_baseline_sits_beside_the_yaml(project):
    contract(project, "net", """
        model: ../models/model.onnx
        data: ../models/calib
        outputs: 0.5
        tolerance: 0.0001
    """)
    path = project.path / "contracts" / "net.baseline.json"
    missing = run(project, "-v")
    missing.stdout.fnmatch_lines(["*::outputs PASSED*", "*::baseline FAILED*",
                                  "*baseline contracts/net.baseline.json does not exist*"])
    assert not path.exists()
    run(project, "--ptq-update-baseline").assert_outcomes(passed=1, failed=1)
    assert path.is_file()
    run(project).assert_outcomes(passed=2)


def test_accuracy_and_holdout(project, models):
    def score(outputs):
        return float(np.mean([o["prob"][0, 3] for o in outputs]))

    holdout = builders.samples(N, seed=7)
    hfeeds = feeds_of(holdout)
    ratio = (score(builders.run_model(project.path / "models" / "model.onnx", hfeeds))
             / score(builders.run_model(keep_only(project.path / "models" / "model.onnx"), hfeeds)))
    (project.path / "contracts" / "evaluate.py").write_text(textwrap.dedent("""
        import numpy as np

        def mean_class3(run, data):
            return float(np.mean([run(feeds)["prob"][0, 3] for feeds in data]))
    """))
    for name, min_ratio in (("meets", ratio - 1e-5), ("misses", ratio + 1e-5)):
        contract(project, name, f"""
            model: ../models/model.onnx
            data: ../models/calib
            holdout: ../models/holdout
            outputs: 0.5
            accuracy:
              evaluate: evaluate.py:mean_class3
              min_ratio: {min_ratio}
            baseline: false
        """)
    result = run(project, "-v")
    result.stdout.fnmatch_lines(["contracts/meets.ptq.yaml::accuracy PASSED*",
                                 "contracts/misses.ptq.yaml::accuracy FAILED*"])
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["contract misses (misses.ptq.yaml), check accuracy: FAILED",
                                 "mean_class3: quantized * = *% of float *, which is below the *% required*"])


def test_a_check_on_a_few_calibration_samples_and_no_held_out_data_says_so_even_when_it_passes(project):
    """Outputs judged on the 4 calibration samples alone passed with nothing said of the
    data; on held-out data the same contract says nothing more."""
    from pytest_ptq.datacheck import FEW_SAMPLES

    assert N < FEW_SAMPLES
    for name, holdout in (("alone", ""), ("held", "holdout: ../models/holdout\n")):
        contract(project, name, f"model: ../models/model.onnx\ndata: ../models/calib\n{holdout}outputs: 0.5\n"
                                "baseline: false\n")
    result = run(project, "contracts/alone.ptq.yaml")
    result.assert_outcomes(passed=1)
    joined = " ".join(result.stdout.str().split())  # the summary wraps its warnings
    assert re.search(rf"warning: \S*model\.onnx: its outputs check\(s\) judged it on {N} calibration sample\(s\) "
                     r"\(\S*calib\) and no held-out data.*give the check held-out data", joined), joined
    held = run(project, "contracts/held.ptq.yaml")
    held.assert_outcomes(passed=1)
    assert "calibration sample(s)" not in held.stdout.str()


def test_an_error_in_the_users_evaluate_shows_its_frames_not_pytests(project):
    (project.path / "contracts" / "evaluate.py").write_text(textwrap.dedent("""
        def broken(run, data):
            return sum(run(feeds)["logits"][0, 0] for feeds in data)
    """))
    contract(project, "broken", """
        model: ../models/model.onnx
        data: ../models/calib
        accuracy: {evaluate: evaluate.py:broken}
        baseline: false
    """)
    result = run(project)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    failure = out[out.index("= FAILURES ="):out.index("= warnings summary =") if "= warnings summary =" in out
                  else out.index("short test summary")]
    result.stdout.fnmatch_lines(["*evaluate.py:3: in broken", "*return sum(run(feeds)[[]\"logits\"[]]*",
                                 "E   *'logits' is not an output of *; its outputs are 'prob'",
                                 "E   the evaluation function broken raised it on the float model"])
    assert "_pytest/" not in failure and "pluggy/" not in failure and "pytest_ptq/" not in failure
    assert len(failure.splitlines()) < 40


def test_feeds_onnxruntime_refuses_from_the_users_evaluate_name_its_line_and_what_it_passed(project):
    """Feeds the function built itself (every sample in one run on a model whose batch axis
    is 1): onnxruntime's line saying which axis was cut after "for the following indices",
    and the data's files were blamed."""
    (project.path / "contracts" / "evaluate.py").write_text(textwrap.dedent("""
        import numpy as np
        def batched(run, data):
            return float(run({"x": np.concatenate([f["x"] for f in data])})["prob"].mean())
    """))
    contract(project, "batched", """
        model: ../models/model.onnx
        data: ../models/calib
        accuracy: {evaluate: evaluate.py:batched}
        baseline: false
    """)
    result = run(project, "contracts/batched.ptq.yaml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "contract batched (batched.ptq.yaml), check accuracy: the evaluation function batched called run() at "
        f"evaluate.py:4 with feeds onnxruntime refuses for '*model.onnx' (*Got invalid dimensions for input: x for the "
        f"following indices: index: 0 Got: {N} Expected: 1): it passed 'x' float32 [[]{N}, *] where the model "
        "takes float32 [[]1, *]; make the feeds it builds fit the model's inputs*"])
    assert "check the data's" not in result.stdout.str()


@pytest.mark.parametrize("body, message", [
    ("modle: m.onnx\n", "contract 'bad.ptq.yaml': unknown key 'modle'; did you mean 'model'?"),
    ("model: ../models/model.onnx\ndata: ../models/calib\nnodes:\n  treshold: 0.9\n",
     "contract 'bad.ptq.yaml': unknown key 'nodes.treshold'; did you mean 'threshold'?"),
    ("model: ../models/model.onnx\n", "contract 'bad.ptq.yaml' has no 'data' key; add 'data: PATH' (relative to "
     "bad.ptq.yaml)"),
    ("model: ../models/model.onnx\ndata: ../models/calib\noutputs:\n  prob: high\n",
     "contract 'bad.ptq.yaml': 'outputs.prob' must be a number, got 'high'"),
    ("model: ../models/model.onnx\ndata: ../models/calib\noutputs: [0.99]\n",
     "contract 'bad.ptq.yaml': 'outputs' must be a number, or a mapping {output: value} such as {prob: 0.99, "
     "default: 0.9} for one per output, got [[]0.99[]]"),
    ("model: ../models/model.onnx\ndata: ../models/calib\nnodes: {outputs: 3}\n",
     "contract 'bad.ptq.yaml': 'nodes.outputs' must be a list of output names or slices, got 3"),
    ("model: ../models/model.onnx\ndata: ../models/calib\nmetric: mse\n",
     "contract 'bad.ptq.yaml': 'metric: mse' needs the mse the outputs must reach: add 'outputs: VALUE' (or one per "
     "output); only cosine-similarity has a default threshold"),
    ("model: ../models/model.onnx\ndata: ../models/calib\nmetric: cosin\n",
     "contract 'bad.ptq.yaml': 'metric': unknown metric 'cosin'; did you mean*"),
    ("model: ../models/model.onnx\ndata: ../models/calib\ndata_num: 0\n",
     "contract 'bad.ptq.yaml': 'data_num' must be at least 1, got 0"),
    ("model: [unclosed\n", "contract 'bad.ptq.yaml' (*bad.ptq.yaml) is not valid YAML at line *"),
    ("- model\n", "contract 'bad.ptq.yaml' (*) must be a mapping of keys such as 'model:' and 'data:', got list"),
    # YAML would keep the last: a pasted line loosening a threshold unseen
    ("model: ../models/model.onnx\ndata: ../models/calib\noutputs: {default: 0.9999}\nbaseline: false\n"
     "outputs: {default: 0.5}\n", "contract 'bad.ptq.yaml' (*bad.ptq.yaml) sets 'outputs' twice (again at line 5); "
     "keep one"),
    ("model: ../models/model.onnx\ndata: ../models/calib\nnodes:\n  threshold: 0.99\n  threshold: 0.5\n",
     "contract 'bad.ptq.yaml' (*) sets 'threshold' twice (again at line 5); keep one"),
    ("model: ../models/model.onnx\ndata: ../models/calib\ntolerance: .inf\n",
     "contract 'bad.ptq.yaml': 'tolerance' must be a finite number, got inf"),
    # a number quoted is text: refused the same way for every numeric key (data_num's was read)
    *((f"model: ../models/model.onnx\ndata: ../models/calib\n{body}\n",
       f"contract 'bad.ptq.yaml': {key!r} must be {must}, got the text {value!r}; write the number without quotes")
      for body, key, value, must in [
          ("data_num: '3'", "data_num", "3", "a whole number"),
          ("outputs: '0.99'", "outputs", "0.99", "a number"),
          ("outputs: {prob: '0.99'}", "outputs.prob", "0.99", "a number"),
          ("nodes: {threshold: '0.9'}", "nodes.threshold", "0.9", "a number"),
          ("tolerance: '0.1'", "tolerance", "0.1", "a number"),
          ("accuracy: {evaluate: e.py:f, min_ratio: '0.9'}", "accuracy.min_ratio", "0.9", "a number")]),
    ("model: ../models/model.onnx\ndata: ../models/calib\naccuracy: {evaluate: e.py:f, min_ratio: 0}\n",
     "contract 'bad.ptq.yaml': 'accuracy.min_ratio' must be a share of the float model's score in (0, 10] such as "
     "0.99, got 0"),
])
def test_schema_errors_name_the_key_and_the_file(project, body, message):
    contract(project, "bad", body)
    result = run(project)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*ERROR collecting contracts/bad.ptq.yaml*", message])
    assert "Traceback" not in result.stdout.str()


def test_bad_paths_fail_the_items_in_one_sentence(project):
    contract(project, "nomodel", """
        model: ../models/missing.onnx
        data: ../models/calib
        baseline: false
    """)
    contract(project, "noeval", """
        model: ../models/model.onnx
        data: ../models/calib
        accuracy: {evaluate: "nowhere.py:top1"}
        baseline: false
    """)
    result = run(project)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "contract 'noeval.ptq.yaml': 'accuracy.evaluate' file '*nowhere.py' does not exist; write the path of the .py "
        "file relative to '*contracts' (FILE.py:FUNCTION), or name an importable module (module:FUNCTION)",
        "contract nomodel (nomodel.ptq.yaml), check outputs: model file '*missing.onnx' does not exist; *",
    ])
    assert "Traceback" not in result.stdout.str()
    assert "Captured ptq call" not in result.stdout.str()  # no tables under an input error


def test_the_sessions_sample_limit_applies_where_a_contract_sets_none(project):
    contract(project, "open", """
        model: ../models/model.onnx
        data: ../models/calib
        baseline: false
    """)
    contract(project, "own", """
        model: ../models/model.onnx
        data: ../models/calib
        data_num: 3
        baseline: false
    """)
    result = run(project, "--ptq-data-num=2", "-rA", "-k", "outputs")
    out = result.stdout.str()
    # the contract's own limit first, else the session's (it ran every sample)
    assert "judged it on 2 calibration sample(s)" in out and "judged it on 3 calibration sample(s)" in out, out
    assert f"judged it on {N} calibration sample(s)" not in out, out


def test_a_contracts_own_tolerance_decides_its_baseline_check(project):
    """A contract's 'tolerance:' is the baseline check's tolerance, whatever --ptq-tolerance says:
    a node 1e-5 worse than its baseline passes under tolerance 1e-4 and fails under 1e-6."""
    import json

    path = project.path / "contracts" / "net.baseline.json"
    body = "model: ../models/model.onnx\ndata: ../models/calib\nnodes:\n  type: activation\ntolerance: {:.6f}\n"
    contract(project, "net", body.format(1e-4))
    run(project, "--ptq-update-baseline", "-k", "baseline").assert_outcomes(failed=1)  # written, not yet trusted
    saved = json.loads(path.read_text())
    node = sorted(saved["sensitivity"], key=saved["sensitivity"].get)[0]
    assert saved["sensitivity"][node] < 1 - 2e-5  # room for the nudge below a cosine of 1
    nudged = dict(saved, sensitivity=dict(saved["sensitivity"], **{node: saved["sensitivity"][node] + 1e-5}))
    path.write_text(json.dumps(nudged))
    for tol, session, outcome in ((1e-4, 1e-6, "passed"), (1e-6, 1e-4, "failed")):
        contract(project, "net", body.format(tol))
        result = run(project, f"--ptq-tolerance={session}", "-k", "baseline")
        result.assert_outcomes(**{outcome: 1})
    assert node in result.stdout.str() and "worse" in result.stdout.str(), result.stdout.str()


def test_a_contracts_metric_is_the_one_its_node_check_reads(project, models):
    """'metric: mse' in a contract makes nodes.threshold an mse ceiling: 1.0 is far above any
    node's output mse (softmax outputs, cosines all above 0.9999), so the check passes; read as
    a cosine floor of 1.0 it would fail every node."""
    assert min(models["sensitivity"].values()) < 1.0
    contract(project, "net", """
        model: ../models/model.onnx
        data: ../models/calib
        metric: mse
        outputs: 1.0
        nodes:
          type: activation
          threshold: 1.0
        baseline: false
    """)
    result = run(project, "-v", "-k", "nodes")
    result.assert_outcomes(passed=1)


def test_an_allow_entry_that_is_a_node_name_with_brackets_allows_that_node(tmp_path):
    """An exporter's node name may hold '[0]', a character class to fnmatch: the entry that
    spells the name exactly allows that node (it matched none and was refused as a typo)."""
    import onnx

    from pytest_ptq.analysis import Analysis, AnalysisKey
    from pytest_ptq.checks import check_nodes

    fpath = builders.conv_net(tmp_path / "f.onnx")
    model = onnx.load(str(fpath))
    odd = "conv2[0]"
    next(n for n in model.graph.node if n.name == "conv2").name = odd
    onnx.save(model, str(fpath))
    data = builders.samples(3)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    builders.save_folder(data, tmp_path / "calib")
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), tmp_path)
    result = check_nodes(analysis, 1.0, allow=[odd, "conv1*"])  # at a cosine of 1 every node offends
    allowed = [n for n, _ in result.allowed]
    assert odd in allowed and "conv1" in allowed
    assert odd not in [n for n, _ in result.offenders] and result.offenders


def _loaded(tmp_path, body):
    from pytest_ptq import contract

    (tmp_path / "m.onnx").write_bytes(b"")
    (tmp_path / "calib").mkdir(exist_ok=True)
    path = tmp_path / "c.ptq.yaml"
    path.write_text("model: m.onnx\ndata: calib\nbaseline: false\n" + body)
    return contract.load(path)


@pytest.mark.parametrize("written", ["1e-3", "1E-3", "+2e3", "1e+2", "5e-7", "0.5", ".5", "3"])
def test_a_number_in_scientific_notation_reads_as_the_number_it_is(tmp_path, written):
    """YAML 1.1 (PyYAML) reads an unquoted 1e-3 as text, which the thresholds then refused as
    a number written in quotes; written so it is the number Python reads from the same text,
    and only quoted is it text."""
    c = _loaded(tmp_path, f"metric: mse\noutputs: {{prob: {written}}}\ntolerance: {written}\n")
    assert c.tolerance == float(written) and type(c.tolerance) is type(c.outputs["prob"])
    assert c.outputs == {"prob": float(written)} and c.metric == "mse"
    from pytest_ptq.contract import ContractError

    with pytest.raises(ContractError, match="got the text '1e-3'; write the number without quotes"):
        _loaded(tmp_path, "tolerance: '1e-3'\n")


@pytest.mark.parametrize("body, node_outputs", [
    # the outputs a contract holds to a floor, where it gives no default
    ("outputs: {prob: 0.9}\nnodes: 0.5\n", ["prob"]),
    ("outputs: {prob: 0.9, default: 0.5}\nnodes: 0.5\n", None),
    ("outputs: {prob: 0.9, '': 0.5}\nnodes: 0.5\n", None),
    ("outputs: 0.9\nnodes: 0.5\n", None),
    # named under nodes: a name that outputs gives a slice is read as that slice, spaces aside
    ("outputs: {'head=prob[:, 1:]': 0.9, default: 0.5}\nnodes: {outputs: [head, prob]}\n",
     ["head=prob[:, 1:]", "prob"]),
    ("outputs: {'head = prob[:, 1:]': 0.9}\nnodes: {outputs: head}\n", ["head = prob[:, 1:]"]),
])
def test_the_outputs_a_node_check_judges(tmp_path, body, node_outputs):
    from pytest_ptq import params

    c = _loaded(tmp_path, body)  # m.onnx has no tensor named 'default': read as on such a model
    assert c.node_outputs(params.thresholds(c.outputs)) == node_outputs


def test_node_and_output_keys_are_read_as_written(tmp_path):
    from pytest_ptq.contract import ContractError

    c = _loaded(tmp_path, "outputs: {default: 0.9, prob: 0.95}\nnodes: {allow: 'conv1*', outputs: prob}\n")
    # 'default' kept as written: read against the model, which may have a tensor so named
    assert c.outputs == {"default": 0.9, "prob": 0.95}
    assert c.nodes == {"type": None, "threshold": None, "allow": ["conv1*"], "metric": None, "outputs": ["prob"]}
    # the node check's own metric bounds its threshold: -0.5 is a cosine, not an mse
    c = _loaded(tmp_path, "metric: mse\noutputs: 0.1\nnodes: {metric: cosine-similarity, threshold: -0.5}\n")
    assert c.nodes["threshold"] == -0.5 and c.nodes["metric"] == "cosine-similarity"
    for nodes in ("{metric: cosine-similarity, threshold: 1.5}", "{outputs: []}", "{outputs: ['']}"):
        with pytest.raises(ContractError, match="nodes"):
            _loaded(tmp_path, f"nodes: {nodes}\n")

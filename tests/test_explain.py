"""A failure that explains itself: the diagnosis (whose loss, which nodes and why, the fix),
printed once per model in the terminal, and the same in the HTML report.

The planted model: int4 per-tensor weights beside 16-bit activations, with one wide output
channel in conv1's weight (w1), so that weights cause the loss and w1's other channels round
to nothing. Figures are checked against plain onnxruntime sessions on rewired models.
"""

from __future__ import annotations

import re
import shutil
import sys

import onnx
import pytest

import builders
from pytest_ptq.analysis import Analysis, AnalysisKey
from pytest_ptq.diagnosis import SOURCE_WORDS
from test_plugin import feeds_of, keep_only, pooled_cosine, run
from test_report import Page, rows

N = 4
CONTRACT = """
model: qw.onnx
data: calib
float_model: float.onnx
holdout: held
outputs: {default: 0.9999}
nodes: {threshold: 0.9999}
baseline: false
"""
TESTS = """
import pytest

@pytest.mark.ptq(model="qw.onnx", data="calib", float_model="float.onnx", holdout="held")
def test_qw_outputs(ptq):
    ptq.assert_outputs(0.9999)

@pytest.mark.xfail(strict=True, reason="a copy kept as the naive baseline of the story")
@pytest.mark.ptq(model="naive.onnx", data="calib", float_model="float.onnx")
def test_naive(ptq):
    ptq.assert_outputs(0.9999)

@pytest.mark.ptq(model="stored.onnx", data="calib")
def test_stored_weights(ptq):
    ptq.assert_outputs(0.5)
"""


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain")
    calib, held = builders.samples(N, seed=1), builders.samples(N, seed=5)
    builders.save_folder(calib, root / "calib")
    builders.save_folder(held, root / "held")
    # two outputs: the feature map r2 shows the loss that the saturated softmax hides
    fp = builders.conv_net(root / "float.onnx", outlier_channel=3, two_outputs=True)
    builders.quantize(fp, root / "qw.onnx", calib, weight_type="QInt4", activation_type="QUInt16")
    shutil.copy(root / "qw.onnx", root / "naive.onnx")
    # weights stored quantized behind a lone DequantizeLinear, as onnxruntime does by default
    builders.quantize(fp, root / "stored.onnx", calib, keep_float=False,
                      extra_options={"QDQKeepRemovableActivations": True})
    feeds = feeds_of(held)
    ref = builders.run_model(keep_only(root / "qw.onnx"), feeds)
    out = builders.run_model(root / "qw.onnx", feeds)
    cosines = {t: pooled_cosine([r[t] for r in ref], [o[t] for o in out]) for t in ("prob", "r2")}
    assert cosines["r2"] < cosines["prob"]
    return {"root": root, "held_cosine": cosines["r2"]}


@pytest.fixture
def project(pytester, planted):
    for name in ("float.onnx", "qw.onnx", "naive.onnx", "stored.onnx"):
        shutil.copy(planted["root"] / name, pytester.path / name)
    for name in ("calib", "held"):
        shutil.copytree(planted["root"] / name, pytester.path / name)
    pytester.makefile(".ptq.yaml", qw=CONTRACT)
    pytester.makepyfile(test_models=TESTS)
    return pytester


def block(text, label):
    """The lines of a model's block in the terminal summary."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if re.match(rf"_+ ptq: {re.escape(label)} FAILED", line))
    end = next(k for k in range(start + 1, len(lines)) if re.match(r"^(_{3,}|={3,}|-{3,}) ", lines[k])
               or lines[k].startswith(("1 expected failure(s)", "warning: ")))
    return lines[start:end]


def test_diagnosis_names_the_weights_the_channel_and_the_fix(planted):
    root = planted["root"]
    a = Analysis(AnalysisKey(str(root / "qw.onnx"), str(root / "calib"), str(root / "float.onnx")), root)
    d = a.diagnosis("node", holdout=root / "held")
    assert d.source == "weight" and d.verdict["decided_on"] == "heldout"
    assert d.verdict["values"]["heldout"]["all quantized"] == pytest.approx(planted["held_cosine"], abs=1e-6)
    conv1 = next(n for n in d.nodes if n["node"] == "conv1")
    assert conv1["kind"] == "operator" and conv1["op_type"] == "Conv" and conv1["cause"] == "weight"
    assert conv1["split"]["weight"] < conv1["split"]["activation"]
    assert "channel" in conv1["reason"] and "w1_QuantizeLinear" in conv1["reason"]
    assert d.fixes[0]["kind"] == "weight" and "per_channel=True" in d.fixes[0]["text"]
    assert d.settings["per_channel"] is True and d.snippet.startswith("quantize_static(..., per_channel=True")
    assert d.terms == "onnxruntime quantize_static"
    # a ranking of weights says weight, and names the channel in the same words as runall
    w = a.diagnosis("weight", holdout=root / "held")
    w1 = next(n for n in w.nodes if n["node"] == "w1_QuantizeLinear")
    assert w1["kind"] == "weight" and w1["op_type"] == "Conv" and w1["cause"] == "weight"
    assert "keeps only" in w1["reason"] and "per-channel weights" in w1["reason"]
    # an activation ranking would point at nodes whose fix recovers nothing: weights are ranked
    # instead, as the weight ranking itself, and the caveat says so
    act = a.diagnosis("activation", holdout=root / "held")
    assert act.node_type == "weight" and act.asked_type == "activation"
    assert [n["node"] for n in act.nodes] == [n["node"] for n in w.nodes]
    assert act.caveat().startswith("note: activation nodes were asked for, but weights cause the loss")
    assert act.fixes[0]["kind"] == "weight" and w.caveat() == ""


@pytest.mark.parametrize("dist", [["-p", "no:xdist"], ["-n", "2"]], ids=["one process", "xdist"])
def test_terminal_prints_each_failing_model_once(project, planted, dist):
    result = run(project, *dist)
    result.assert_outcomes(failed=3, passed=1, xfailed=1)
    out = result.stdout.str()
    # three failing items on one model (two contract checks and a Python test): one block
    assert out.count("ptq: qw.onnx FAILED") == 1
    assert out.count("cause: weights:") == 1
    assert "Captured ptq call" not in out
    lines = block(out, "qw.onnx")
    assert len(lines) <= 45, "\n".join(lines)
    text = "\n".join(lines)
    assert "ptq: qw.onnx FAILED: 3 of 3 test(s) failed" in lines[0]
    # every measured value beside its threshold, on the data the check used
    held = f"{planted['held_cosine']:.6f}"
    assert re.search(rf"FAILED outputs  cosine-similarity of 'r2' {held} on 4 held-out sample\(s\) \(held\), needs >= "
                     r"0\.9999  \[qw\.ptq\.yaml::outputs\]", text), text
    assert re.search(r"FAILED nodes    cosine-similarity with only \S+ quantized 0\.\d+ on 4 calibration sample\(s\) "
                     r"\(calib\), needs >= 0\.9999", text)
    # the cause on held-out data, the operator and its weight's channel, the fix in onnxruntime's terms
    assert re.search(r"cause: weights: weight quantization causes most of the loss \(cosine-similarity .* on 4 "
                     r"held-out samples; .* on 4 calibration samples\)", " ".join(lines)), text
    assert re.search(r"\d+\. conv1 \(Conv operator\) 0\.\d+: weight \(its weights alone", text)
    assert "fix to try (onnxruntime quantize_static):" in text
    assert "per-channel weights (quantize_static(..., per_channel=True)): w1_QuantizeLinear loses channels" in text
    assert "ptq-debug suggest qw.onnx calib --heldout held --float-model float.onnx --target-cosine 0.9999" in text
    # the expected failure is counted apart, with its reason, and gets no block
    assert "ptq: naive.onnx FAILED" not in out
    assert re.search(r"1 expected failure\(s\) \(xfail\) on 1 model\(s\), not counted as failures:\n  naive\.onnx "
                     r"\(1 test\(s\)\): a copy kept as the naive baseline of the story; cause: weights", out)
    # a warning of a passing model, with its fix, in the summary
    # wrapped to the summary's width, its continuation lines indented
    assert re.search(r"warning: stored\.onnx: weights are stored already quantized .*pass the float model",
                     " ".join(out.split()))
    assert all(len(line) <= 118 for line in out.splitlines() if line.startswith("warning: stored.onnx")), out


def test_report_shows_the_cause_the_fix_and_the_contract_figure(project, planted):
    run(project, "--ptq-report", "report.html", "-p", "no:xdist").assert_outcomes(failed=3, passed=1, xfailed=1)
    text = (project.path / "report.html").read_text()
    page = Page(text)
    summary = {r["model"]: r for r in rows(page.summary)}
    qw = summary["qw.onnx"]
    # the contract's own figure: held-out, with its threshold
    assert float(qw["contract figure"]) == pytest.approx(planted["held_cosine"], abs=1e-6)
    assert qw["measured on, threshold"] == "cosine-similarity of 'r2' on 4 held-out sample(s), needs >= 0.9999"
    assert qw["cause"] == "weights" and qw["fix to try"] == "per-channel weights"
    assert summary["naive.onnx"]["verdict"] == "xfailed"
    assert re.search(r"3 model\(s\): <span[^>]*>1 failing</span>, <span[^>]*>1 failing as expected \(xfail\)</span>, "
                     r"1 passing", text)
    assert "naive.onnx (1 test(s)): a copy kept as the naive baseline of the story" in text
    section = next(s for s in page.sections if s["title"] == "qw.onnx FAILED")
    measured = rows(section["tables"]["measures"])
    assert {r["check"] for r in measured} == {"outputs", "nodes"}
    assert all(r["threshold"].startswith(">= ") for r in measured)
    nodes = rows(section["tables"]["sensitivity"])
    conv1 = next(r for r in nodes if r["node"] == "conv1")
    assert conv1["kind"] == "operator (Conv)" and conv1["cause"] == "weight" and "channel" in conv1["why"]
    assert "quantize_static(..., per_channel=True" in text
    verdict = rows(section["tables"]["verdict"])
    assert [r["quantized"] for r in verdict] == ["weights only", "activations only", "everything"]
    assert float(verdict[2]["cosine-similarity, held-out (4 samples)"]) == pytest.approx(planted["held_cosine"],
                                                                                         abs=1e-6)
    stored = next(s for s in page.sections if s["title"] == "stored.onnx PASSED")
    assert stored["tables"]["sensitivity"]
    assert "warning: weights are stored already quantized" in text


def test_a_diagnosis_that_crashes_leaves_the_failure_standing(project):
    project.makeconftest("""
import pytest_ptq.analysis as a

_real = a.Analysis.diagnosis

def _crash(self, *args, **kwargs):
    raise ValueError("boom")

def pytest_configure(config):
    a.Analysis.diagnosis = _crash

def pytest_unconfigure(config):
    a.Analysis.diagnosis = _real
""")
    result = run(project)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*no diagnosis: ValueError: boom*"])



def test_the_cause_is_decided_on_the_data_the_failing_check_used(pytester, tmp_path):
    """A nodes check failing on calibration data (a third of its samples 6 times too large)
    beside outputs passing on held-out data read "cause: neither (close to float)" with
    the calibration figure that failed in the same sentence."""
    calib, held = builders.samples(6, seed=1), builders.samples(6, seed=5)
    fp = builders.conv_net(tmp_path / "float.onnx")
    builders.quantize(fp, pytester.path / "q.onnx", held)
    shutil.copy(fp, pytester.path / "float.onnx")
    calib = {"x": [a * 6 if k % 3 == 0 else a for k, a in enumerate(calib["x"])]}
    builders.save_folder(calib, pytester.path / "calib")
    builders.save_folder(held, pytester.path / "held")
    pytester.makefile(".ptq.yaml", c="model: q.onnx\ndata: calib\nfloat_model: float.onnx\nholdout: held\n"
                                     "outputs: 0.5\nnodes: {type: activation, threshold: 0.9999}\nbaseline: false\n")
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    lines = result.stdout.lines
    start = next(k for k, x in enumerate(lines) if x.startswith("cause: "))
    cause = " ".join([lines[start]] + [x.strip() for x in lines[start + 1:start + 4] if x.startswith("      ")])
    # decided on the 6 calibration samples the failing check judged, held-out figures not first
    assert "on 6 calibration samples)" in cause and "held-out" not in cause, cause
    a = Analysis(AnalysisKey(str(pytester.path / "q.onnx"), str(pytester.path / "calib"),
                             str(pytester.path / "float.onnx")), pytester.path)
    assert a.verdict().source != "neither"
    assert cause.startswith(f"cause: {SOURCE_WORDS[a.verdict().source]}:")


def test_terminal_and_report_rank_the_kind_the_verdict_blames(pytester, tmp_path):
    """A contract ranking weights on an activation loss: the terminal ranked activations and
    said why, while the report ranked the session's node type and named a weight as the most
    sensitive node."""
    data = builders.samples(4, seed=1)
    fp = builders.conv_net(tmp_path / "float.onnx")
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    builders.scaled(q, pytester.path / "q.onnx", "r1_scale", 1024)  # r1's steps 1024 times too coarse
    shutil.copy(fp, pytester.path / "float.onnx")
    builders.save_folder(data, pytester.path / "calib")
    pytester.makefile(".ptq.yaml", c="model: q.onnx\ndata: calib\nfloat_model: float.onnx\noutputs: 0.9999\n"
                                     "nodes: {type: weight, threshold: 0.0}\nbaseline: false\n")
    result = run(pytester, f"--ptq-report={pytester.path / 'r.html'}")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "note: weight nodes were asked for, but activations cause the loss" in " ".join(out.split())
    assert "most sensitive activation nodes" in out
    page = (pytester.path / "r.html").read_text()
    assert "Most sensitive activation nodes" in page and "Most sensitive weight nodes" not in page
    assert "note: weight nodes were asked for, but activations cause the loss" in page
    top = Analysis(AnalysisKey(str(pytester.path / "q.onnx"), str(pytester.path / "calib"),
                               str(pytester.path / "float.onnx")), pytester.path).sensitivity("activation")
    assert next(iter(top)) in page.split("Most sensitive activation nodes", 1)[1][:3000]


def test_the_explanation_ranks_the_kind_of_the_failing_nodes_check_whatever_the_order(pytester, tmp_path):
    """A nodes check given its node type as an argument, or by a contract beside a Python
    test that failed first, was explained in the session's node type: its "fix to try" left
    out the node the check named (0.29 with only it quantized), and which ranking stood
    changed with the order of the tests (pytest-randomly's seed)."""
    data = builders.samples(8, seed=1)
    fp = builders.conv_net(tmp_path / "float.onnx", outlier_channel=3)
    builders.quantize(fp, pytester.path / "q.onnx", {k: [a * 0.1 for a in v] for k, v in data.items()})
    builders.save_folder(data, pytester.path / "calib")
    shutil.copy(fp, pytester.path / "float.onnx")
    mark = '@pytest.mark.ptq(model="q.onnx", data="calib", float_model="float.onnx")\n'
    pytester.makepyfile(test_act="import pytest\n" + mark + "def test_act(ptq):\n"
                                 "    ptq.assert_nodes(0.999, node_type='activation')\n",
                        test_out="import pytest\n" + mark + "def test_out(ptq):\n    ptq.assert_outputs(0.99)\n")
    pytester.makefile(".ptq.yaml", m="model: q.onnx\ndata: calib\nfloat_model: float.onnx\noutputs: 0.99\n"
                                     "nodes: {type: activation, threshold: 0.999}\nbaseline: false\n")
    top = next(iter(Analysis(AnalysisKey(str(pytester.path / "q.onnx"), str(pytester.path / "calib"),
                                         str(pytester.path / "float.onnx")), pytester.path).sensitivity("activation")))
    for args in (["test_act.py"], ["m.ptq.yaml", "test_out.py"], ["test_out.py", "m.ptq.yaml"]):
        out = run(pytester, *args, "-p", "no:randomly").stdout.str()
        assert f"FAILED nodes    cosine-similarity with only {top} quantized" in out, args
        explained = out.split("most sensitive activation nodes", 1)
        assert len(explained) == 2, (args, out)
        assert f"  1. {top} " in explained[1] and f"keep {top}" in explained[1], (args, out)


def test_a_rewrite_that_loses_more_than_quantizing_is_said_beside_the_three_configs():
    """The three configs measure against the graph as the quantizer rewrote it: where that
    rewrite alone (float model vs every pair bypassed) loses more, the cause says so."""
    from types import SimpleNamespace

    from pytest_ptq.metrics import get_metrics
    from pytest_ptq.verdict import _rewrite_note

    cos = get_metrics("cosine-similarity")[0]
    changes = "the Relu folded into 'r_QuantizeLinear' fed the subgraphs of 'If_0'"
    broken = SimpleNamespace(rewrite={"cosine": -0.005, "output": "state", "sample": 3, "changes": changes})
    note = _rewrite_note(broken, cos, 0.4731)
    assert "output cosine -0.0050 between the float model and this model with every pair bypassed" in note
    assert note.endswith(f"fix it first ({changes})")
    # a rewrite that costs less than quantizing, none, or another metric: nothing to add
    assert _rewrite_note(SimpleNamespace(rewrite={**broken.rewrite, "cosine": 0.99}), cos, 0.4731) is None
    assert _rewrite_note(SimpleNamespace(rewrite=None), cos, 0.4731) is None
    assert _rewrite_note(broken, get_metrics("mse")[0], 0.1) is None


def test_a_contract_judges_nodes_on_the_outputs_it_holds_to_a_floor(pytester, planted):
    """A contract whose outputs named one output (a recurrent model's speech probability beside
    the state it carries) judged its nodes on every output, and failed on the state's figures."""
    root = planted["root"]
    qw = root / "qw.onnx"
    graph = onnx.load(str(qw)).graph
    inits = {i.name for i in graph.initializer}
    weights = [n.name for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] in inits]
    feeds = feeds_of(builders.samples(N, seed=1))
    ref = builders.run_model(keep_only(qw), feeds)
    sens = {}
    for w in weights:
        got = builders.run_model(keep_only(qw, {w}), feeds)
        sens[w] = {t: pooled_cosine([r[t] for r in ref], [g[t] for g in got]) for t in ("prob", "r2")}
    on_prob = min(s["prob"] for s in sens.values())
    on_both = min(min(s.values()) for s in sens.values())
    assert on_both < on_prob
    limit = (on_prob + on_both) / 2
    for name in ("qw.onnx", "float.onnx"):
        shutil.copy(root / name, pytester.path / name)
    shutil.copytree(root / "calib", pytester.path / "calib")
    common = "model: qw.onnx\ndata: calib\nbaseline: false\n"
    pytester.makefile(".ptq.yaml", named=common + f"outputs: {{prob: 0.5}}\nnodes: {{type: weight, threshold: {limit!r}}}\n",
                      default=common + f"outputs: {{default: 0.5}}\nnodes: {{type: weight, threshold: {limit!r}}}\n",
                      chosen=common + "outputs: {default: 0.5}\n"
                      f"nodes: {{type: weight, threshold: {limit!r}, outputs: [prob]}}\n",
                      # a slice named under outputs, named again under nodes
                      sliced=common + "outputs: {'head=prob[...]': 0.5, default: 0.5}\n"
                      f"nodes: {{type: weight, threshold: {limit!r}, outputs: [head]}}\n")
    result = run(pytester, "-p", "no:xdist", "-rA")
    result.assert_outcomes(passed=7, failed=1)
    out = result.stdout.str()
    assert all(f"PASSED {name}.ptq.yaml::nodes" in out for name in ("named", "chosen", "sliced")), out
    assert "FAILED default.ptq.yaml::nodes" in out
    # its outputs pass: a search for their floors would find them met (it was offered at 0.5)
    assert "ptq-debug suggest" not in out


def test_a_failing_output_is_explained_and_searched_on_that_output(project, planted):
    """A contract failing on one of two outputs was explained with, and sent to a search on,
    every output: the search then held the other output to the failing one's floor."""
    result = run(project, "-p", "no:xdist", "-k", "qw.ptq.yaml")
    out = result.stdout.str()
    assert "FAILED outputs  cosine-similarity of 'r2'" in out
    assert "most sensitive nodes (cosine-similarity of 'r2' with only that node quantized" in out
    assert re.search(r"ptq-debug suggest qw\.onnx calib --heldout held --float-model float\.onnx --target-cosine "
                     r"0\.9999 --remedy mixed -o r2\b", out), out


def test_terminal_lines_point_at_a_report_only_when_one_is_written(planted):
    root = planted["root"]
    d = Analysis(AnalysisKey(str(root / "qw.onnx"), str(root / "calib"), str(root / "float.onnx")),
                 root).diagnosis("node", holdout=root / "held")
    d.nodes[0]["reason"] = d.nodes[0].get("reason", "") + " and then" + " a long tail of words" * 20 + " ending here"
    d.nodes.append(dict(d.nodes[-1], relevant=False))  # one node left out of the terminal
    plain = "\n".join(d.lines(width=80))
    # no report: nothing is cut and nothing points at a page that is not written
    assert "ending here" in " ".join(plain.split()) and "report" not in plain.replace("--ptq-report=FILE.html", "")
    assert "(--ptq-report=FILE.html lists them)" in plain
    with_report = "\n".join(d.lines(width=80, report="r.html"))
    assert "(r.html has it all)" in with_report and "ending here" not in with_report
    # two nodes whose reason is one (an input they share) print it once
    d.nodes[1]["reason"] = d.nodes[0]["reason"]
    twice = "\n".join(d.lines(width=80))
    assert " ".join(twice.split()).count("ending here") == 1, twice
    assert f"why: the same as for {d.nodes[0]['node']} above" in twice
    # a reason cut short keeps what to do, which comes last
    d.nodes[0]["reason"] = "a long tail of words " * 30 + "-> per-channel weights"
    cut = " ".join("\n".join(d.lines(width=80, report="r.html")).split())
    # beside a report whose name leaves the conclusion no room, the reason is cut plainly (a
    # placeholder wider than the line stopped the whole diagnosis)
    long_report = "nightly_full_suite_quantization_report_of_every_model.html"
    assert f"... ({long_report} has it all)" in " ".join("\n".join(d.lines(width=118, report=long_report)).split())
    assert "... (the report has it all)" in "\n".join(d.lines(width=80, report="r" * 80 + ".html"))
    assert "... -> per-channel weights (r.html has it all)" in cut, cut
    assert "(r.html lists them)" in with_report
    # a name longer than the line stays whole: cut in two, it was copied wrong into a fix
    long_name = "/model/encoder/layers.11/self_attention_block/feed_forward/q_proj_dense/MatMul_output_0_QuantizeLinear"
    d.nodes[0]["reason"] = f"keep {long_name} in float"
    assert long_name in "\n".join(d.lines(width=80)).split()


def test_the_search_printed_aims_at_the_failing_outputs_floor(project, planted):
    """r2 fails its floor while prob passes a stricter one: the search printed holds r2 to
    r2's floor, not to prob's."""
    feeds = feeds_of(builders.samples(N, seed=5))
    ref = builders.run_model(keep_only(planted["root"] / "qw.onnx"), feeds)
    out = builders.run_model(planted["root"] / "qw.onnx", feeds)
    prob = pooled_cosine([r["prob"] for r in ref], [o["prob"] for o in out])
    strict = float(f"{prob - 2e-6:.6f}")
    assert planted["held_cosine"] < 0.9999 < strict < prob
    project.makefile(".ptq.yaml", two=CONTRACT.replace("outputs: {default: 0.9999}",
                                                       f"outputs: {{r2: 0.9999, prob: {strict}}}")
                     .replace("nodes: {threshold: 0.9999}\n", ""))
    text = run(project, "-p", "no:xdist", "-k", "two.ptq.yaml").stdout.str()
    assert "FAILED outputs  cosine-similarity of 'r2'" in text and "of 'prob'" not in text, text
    assert re.search(r"ptq-debug suggest qw\.onnx calib --heldout held --float-model float\.onnx --target-cosine "
                     r"0\.9999 --remedy mixed -o r2\b", text), text


def test_the_verdict_uses_the_samples_the_checks_use(planted):
    """A contract limited to its first samples (data_num) explains its failure on them, not on
    samples it leaves out."""
    root = planted["root"]
    a = Analysis(AnalysisKey(str(root / "qw.onnx"), str(root / "calib"), str(root / "float.onnx"), 2), root)
    v = a.verdict()
    assert v.samples["calibration"] == 2 == a.output_metrics().samples, (v.samples, a.output_metrics())


def test_a_failing_nodes_item_run_alone_offers_no_search_at_a_floor_the_contract_did_not_set(project):
    """-k selecting a failing contract's nodes item: the explanation offered a search at the
    session's default floor (0.99, the contract's 0.9999 unseen) without the held-out data;
    the nodes check names its own offenders, and with its outputs item the search is right."""
    project.makefile(".ptq.yaml", c=CONTRACT)
    text = run(project, "-p", "no:xdist", "-k", "c.ptq.yaml and nodes").stdout.str()
    assert "FAILED nodes" in text and "FAILED outputs" not in text and "ptq-debug suggest" not in text, text
    text = run(project, "-p", "no:xdist", "-k", "c.ptq.yaml").stdout.str()
    assert ("ptq-debug suggest qw.onnx calib --heldout held --float-model float.onnx --target-cosine 0.9999 "
            "--remedy mixed") in text, text


def test_a_failing_accuracy_check_is_searched_on_its_own_task_score(project):
    """The search printed for a contract whose accuracy check failed aimed at the output
    cosine only (a fix found so lost task accuracy); now it searches the task score itself
    with the contract's function, and the output floors' search follows where those failed.
    A function no file defines at its top level (a lambda) cannot be named to ptq-debug."""
    project.makepyfile(task="""
        import numpy as np

        def top(run, data):
            return float(np.mean([run(f)["prob"].max() for f in data]))
        """)
    project.makefile(".ptq.yaml", acc=CONTRACT.replace("nodes: {threshold: 0.9999}\n", "").replace(
        "outputs: {default: 0.9999}", "outputs: {default: 0.5}\naccuracy: {evaluate: task.py:top, min_ratio: 2}"))
    text = run(project, "-p", "no:xdist", "-k", "acc.ptq.yaml").stdout.str()
    assert "FAILED accuracy" in text and "FAILED outputs" not in text, text
    accuracy = ("ptq-debug suggest qw.onnx calib --heldout held --float-model float.onnx --evaluate task.py:top "
                "--min-ratio 2 --remedy mixed")
    assert f"the smallest set that meets its accuracy check, searched and re-quantized (minutes): {accuracy}\n" in text
    assert "--target-cosine" not in text
    # both failing: a search each, labelled in the terminal and the report
    project.makefile(".ptq.yaml", acc=CONTRACT.replace("nodes: {threshold: 0.9999}\n", "").replace(
        "outputs: {default: 0.9999}", "outputs: {default: 0.9999}\naccuracy: {evaluate: task.py:top, min_ratio: 2}"))
    text = run(project, "-p", "no:xdist", "-k", "acc.ptq.yaml", "--ptq-report=r.html").stdout.str()
    floors = ("ptq-debug suggest qw.onnx calib --heldout held --float-model float.onnx --target-cosine 0.9999 "
              "--remedy mixed -o r2")
    assert f"meets its accuracy check, searched and re-quantized (minutes): {accuracy}\n" in text, text
    assert f"meets its output floors, searched and re-quantized (minutes): {floors}\n" in text, text
    page = (project.path / "r.html").read_text()
    assert page.index("meets its accuracy check") < page.index(accuracy) < page.index("meets its output floors") \
        < page.index(floors)
    # the same from a Python test, whose function is a lambda: no command names it
    project.makepyfile(test_lambda="""
        import pytest

        @pytest.mark.ptq(model="qw.onnx", data="calib", float_model="float.onnx", holdout="held")
        def test_lambda(ptq):
            ptq.assert_accuracy(lambda run, data: 1.0 + len(data) * 0, min_ratio=2)
        """)
    text = run(project, "-p", "no:xdist", "-k", "test_lambda").stdout.str()
    assert "FAILED accuracy" in text and "--evaluate" not in text, text


def test_a_decorated_evaluation_function_is_named_by_the_file_that_defines_it(tmp_path, monkeypatch):
    """A function wrapped by a decorator from another file was named by the decorator's file,
    which holds no such name: the command printed could not load it."""
    import importlib

    from pytest_ptq.checks import _source_of

    (tmp_path / "deco.py").write_text("import functools\n\ndef logged(f):\n    @functools.wraps(f)\n"
                                      "    def inner(*a):\n        return f(*a)\n    return inner\n")
    (tmp_path / "my task.py").write_text("import functools\nfrom deco import logged\n\n@logged\n"
                                         "def top1(run, data):\n    return 1.0\n\n"
                                         "@functools.lru_cache\ndef cached(run, data):\n    return 1.0\n\n"
                                         "top = lambda run, data: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location("my_task_module", tmp_path / "my task.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "my_task_module", module)
    spec.loader.exec_module(module)
    assert _source_of(module.top1) == f"{tmp_path / 'my task.py'}:top1"
    assert _source_of(module.cached) == f"{tmp_path / 'my task.py'}:cached"
    assert _source_of(module.top) == ""  # a lambda: no name loads it again


# -- the verdict's rule, from the module docstring: a kind alone losing at least DOMINANT (2)
# times what the other loses alone is the source; otherwise both; a loss with everything at
# most CLOSE (1e-3) is neither. Losses below are exact in binary (0.25, 0.375, 0.5, 0.625).
_W_LOSS = 0.25


@pytest.mark.parametrize("ratio, source", [(1.5, "both"), (2.0, "{kind}"), (2.5, "{kind}")])
@pytest.mark.parametrize("kind", ["activation", "weight"])
def test_the_verdict_names_a_kind_from_twice_the_others_loss(ratio, source, kind):
    from pytest_ptq.verdict import ACTIVATION, ALL, WEIGHT, decide

    small, large = 1 - _W_LOSS, 1 - ratio * _W_LOSS  # cosines: loss 0.25 and ratio x 0.25
    values = {WEIGHT: large if kind == "weight" else small, ACTIVATION: large if kind == "activation" else small,
              ALL: 0.25}
    got, text = decide(values, "cosine-similarity")
    assert got == source.format(kind=kind), text
    # an error metric (badness is the value itself) follows the same rule
    errors = {k: 1 - v for k, v in values.items()}
    assert decide(errors, "mse")[0] == source.format(kind=kind)


def test_sqnr_badness_is_the_noise_to_signal_power_ratio_and_ranks_like_cosine():
    from pytest_ptq.verdict import ACTIVATION, ALL, WEIGHT, badness, decide

    # SQNR = 10 log10(signal / noise): 20 dB is noise at 1% of the signal's power
    assert badness("sqnr", 20) == pytest.approx(0.01)
    assert badness("sqnr", 30) == pytest.approx(0.001)
    assert badness("sqnr", 0) == pytest.approx(1.0)
    assert badness("sqnr", float("inf")) == 0.0
    assert badness("sqnr", 30) < badness("sqnr", 20)  # higher dB: closer to float
    assert badness("cosine-similarity", 0.99) == pytest.approx(0.01)
    # weights alone keep 30 dB, activations alone 20 dB: activations lose ten times more, as a
    # cosine of 0.999 beside 0.99 says
    sqnr = decide({WEIGHT: 30.0, ACTIVATION: 20.0, ALL: 19.0}, "sqnr")[0]
    cosine = decide({WEIGHT: 0.999, ACTIVATION: 0.99, ALL: 0.985}, "cosine-similarity")[0]
    assert sqnr == cosine == "activation"
    assert decide({WEIGHT: 20.0, ACTIVATION: 30.0, ALL: 19.0}, "sqnr")[0] == "weight"
    # everything quantized at 40 dB: noise 1e-4 of the signal, under CLOSE: close to float
    assert decide({WEIGHT: 45.0, ACTIVATION: 42.0, ALL: 40.0}, "sqnr")[0] == "neither"


def test_the_search_printed_holds_each_failing_output_to_its_own_floor(project, planted, monkeypatch):
    """r2 and a slice of it both fail floors of their own: the search printed held both to the
    stricter, more than the contract asks of the other; it now carries each output's floor
    as the contract names it, and run, starts from the contract's outcome: each short of its
    own floor on the held-out data, the figures those of a plain onnxruntime session."""
    import json
    import math
    import shlex

    from pytest_ptq.cli import main

    feeds = feeds_of(builders.samples(N, seed=5))
    ref = builders.run_model(keep_only(planted["root"] / "qw.onnx"), feeds)
    out = builders.run_model(planted["root"] / "qw.onnx", feeds)
    held = {"r2": pooled_cosine([r["r2"] for r in ref], [o["r2"] for o in out]),
            "head": pooled_cosine([r["r2"][:, 0:4] for r in ref], [o["r2"][:, 0:4] for o in out])}
    floor = math.ceil(held["head"] * 1e6) / 1e6 + 1e-6  # just above the slice's figure, below 1
    floor = float(f"{floor:.6f}")
    assert held["r2"] < 0.9999 and held["head"] < floor < 1 and floor != 0.9999
    project.makefile(".ptq.yaml", both=CONTRACT.replace("outputs: {default: 0.9999}",
                                                        f"outputs: {{r2: 0.9999, 'head=r2[:, 0:4]': {floor!r}}}")
                     .replace("nodes: {threshold: 0.9999}\n", ""))
    text = run(project, "-p", "no:xdist", "-k", "both.ptq.yaml").stdout.str()
    assert "FAILED outputs" in text and "'r2'" in text and "'head'" in text, text
    line = next(t for t in text.splitlines() if "meets its output floors" in t)
    command = line[line.index("ptq-debug suggest"):]
    assert command == ("ptq-debug suggest qw.onnx calib --heldout held --float-model float.onnx --target-cosine "
                       f"r2=0.9999 'head=r2[:, 0:4]={floor!r}' --remedy mixed"), command
    monkeypatch.chdir(project.path)
    main(shlex.split(command)[1:] + ["--no-save", "--quiet", "--no-requantize", "--budget", "30", "--json", "r.json"])
    saved = json.loads((project.path / "r.json").read_text())
    assert saved["objective"]["targets"] == {"r2": 0.9999, "head": floor}
    before = saved["figures"]["held-out"]["outputs"]["before"]
    assert before == pytest.approx(held, abs=1e-6)
    assert not saved["figures"]["held-out"]["met_before"]
    assert before["r2"] < 0.9999 and before["head"] < floor

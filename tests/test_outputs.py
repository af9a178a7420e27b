"""Default outputs: a concatenation of unlike parts (a detector's boxes beside its scores) is
scored part by part, against slices of plain onnxruntime runs computed here."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import builders
from pytest_ptq.analysis import Analysis, AnalysisKey
from pytest_ptq.checks import check_outputs
from pytest_ptq.curves import configs_from, get_acc_error
from pytest_ptq.distribution import collect
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError
from pytest_ptq.outputs import OFFSET_WARNING, far_from_zero, parse_outputs
from pytest_ptq.sensitivity import get_sensitivity_of_nodes
from pytest_ptq.verdict import three_configs

CONCAT_PAIR = "out_QuantizeLinear"  # quantize_static's pair on the Concat's output (its one scale)


def _head(tmp_path, **kw):
    fpath = builders.detector_head_net(tmp_path / "f.onnx", **kw)
    data = builders.samples(6, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    builders.save_folder(data, tmp_path / "calib")
    return fpath, qpath, data


def _cos(refs, tests, take):
    return builders.pooled_cosine([take(r["out"]) for r in refs], [take(t["out"]) for t in tests])


@pytest.mark.parametrize("transposed", [False, True])
def test_a_detector_output_is_scored_per_part(tmp_path, transposed):
    fpath, qpath, data = _head(tmp_path, transposed=transposed)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    specs = parse_outputs(None, engine)
    lead = "out[:, :, " if transposed else "out[:, "
    assert [s.name for s in specs] == [lead + "0:4]", lead + "4:10]"]
    feeds = [{"x": a} for a in data["x"]]
    ref = builders.run_model(fpath, feeds)
    alone = builders.run_model(builders.rewire(qpath, keep={CONCAT_PAIR}, float_model=fpath), feeds)
    boxes, scores = ((lambda a: a[..., :4], lambda a: a[..., 4:]) if transposed
                     else (lambda a: a[:, :4], lambda a: a[:, 4:]))
    # the shared scale of the concatenation leaves the scores a code or two, which a
    # whole-tensor cosine does not see
    assert _cos(ref, alone, lambda a: a) > 0.999
    assert _cos(ref, alone, scores) < 0.9
    sens = get_sensitivity_of_nodes(engine, node_type="activation", interested_nodes=[CONCAT_PAIR])
    per_output = sens.details[CONCAT_PAIR]["per_output"]
    assert per_output[specs[0].name]["cosine-similarity"] == pytest.approx(_cos(ref, alone, boxes), abs=1e-6)
    assert per_output[specs[1].name]["cosine-similarity"] == pytest.approx(_cos(ref, alone, scores), abs=1e-6)
    assert sens[CONCAT_PAIR]["cosine-similarity"] == pytest.approx(_cos(ref, alone, scores), abs=1e-6)
    full = builders.run_model(qpath, feeds)
    verdict = three_configs(engine, specs)
    assert verdict.values["calibration"]["all quantized"] == pytest.approx(_cos(ref, full, scores), abs=1e-6)


def test_a_yolox_head_flattened_with_its_channels_kept_is_scored_per_part(tmp_path):
    """YOLOX concatenates box offsets, objectness and class score on the channels, flattens
    each level to ``[1, 6, cells]`` (the channel axis kept, the last not) and transposes: the
    split followed only Reshapes that keep the last axis, so the whole tensor was scored and a
    ddddocr detector's 0.87 objectness read 0.997."""
    fpath = builders.yolox_head_net(tmp_path / "f.onnx")
    data = builders.samples(6, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    specs = parse_outputs(None, engine)
    assert [s.name for s in specs] == ["out[:, :, 0:4]", "out[:, :, 4:5]", "out[:, :, 5:6]"]
    feeds = [{"x": a} for a in data["x"]]
    ref, full = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    objectness = _cos(ref, full, lambda a: a[..., 4:5])
    assert objectness < _cos(ref, full, lambda a: a)
    verdict = three_configs(engine, specs)
    assert verdict.values["calibration"]["all quantized"] == pytest.approx(
        min(_cos(ref, full, lambda a, k=k: a[..., k]) for k in (slice(0, 4), slice(4, 5), slice(5, 6))), abs=1e-6)


def test_a_reshape_keeps_an_axis_only_where_its_elements_stay_in_place():
    """A dynamic batch before the axis: the same dimensions before and as many elements after
    keep it (YOLOX's flatten); [N, 6, 4] to [N, 6, 2] moves elements across it."""
    from pytest_ptq.outputs import _kept_axis

    assert _kept_axis([None, 6, 20, 20], [None, 6, 400], 1) == 1
    assert _kept_axis([1, 6, 20, 20], [1, 6, 400], 1) == 1
    assert _kept_axis([None, 6, 4], [None, 6, 2], 1) is None
    assert _kept_axis([None, 80, 4], [None, 20, 4, 4], 2) == 3  # the last axis kept last
    assert _kept_axis([None, 6, 20, 20], [None, 6, None], 1) is None  # as many elements after: unknown


def test_the_curves_end_where_the_verdict_does(tmp_path):
    fpath, qpath, data = _head(tmp_path)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    curves = get_acc_error(engine, {**configs_from(engine, ["activation"]), "all": list(engine.calib_names)})
    writer = curves.nodes.index("head_concat")
    feeds = [{"x": a} for a in data["x"]]
    ref, full = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    scores = _cos(ref, full, lambda a: a[:, 4:])
    assert scores < _cos(ref, full, lambda a: a) and scores < _cos(ref, full, lambda a: a[:, :4])
    assert curves.values["all"][writer] == pytest.approx(scores, abs=1e-6)
    assert curves.local[writer] is not None  # its local error: its own output, before the pair


def test_naming_the_output_scores_it_whole_and_parts_alike_stay_whole(tmp_path):
    fpath, qpath, data = _head(tmp_path)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    assert [s.name for s in parse_outputs("out", engine)] == ["out"]
    assert [s.name for s in parse_outputs(None, engine.qmodel)] == ["out"]  # no values: whole
    like = tmp_path / "like"
    like.mkdir()
    fpath, qpath, data = _head(like, like=True)
    assert [s.name for s in parse_outputs(None, Engine(qpath, data, float_model=fpath))] == ["out"]


def test_the_default_threshold_holds_each_part(tmp_path):
    fpath, qpath, data = _head(tmp_path)
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path)
    result = check_outputs(analysis, 0.99)
    assert not result.passed
    assert set(result.values) == {"out[:, 0:4]", "out[:, 4:10]"}
    assert result.values["out[:, 0:4]"] > 0.99 > result.values["out[:, 4:10]"]
    # a part named gets its own threshold, the whole named is the whole
    assert check_outputs(analysis, {"out[:, 4:10]": 0.0, "": 0.99}).passed
    assert check_outputs(analysis, {"out": 0.99}).passed
    # a threshold is shown with every digit given: 0.9999999 is not "needs >= 1"
    strict = check_outputs(analysis, {"out": 0.9999999})
    assert not strict.passed and strict.headline().endswith("needs >= 0.9999999")


def test_the_box_plot_of_the_concatenation_is_by_part(tmp_path):
    fpath, qpath, data = _head(tmp_path)
    engine = Engine(qpath, data, float_model=fpath)
    _, boxes = collect(engine, box_nodes=[CONCAT_PAIR])
    box = boxes[CONCAT_PAIR]
    assert box["axis"] == 1 and box["channels"] == 10
    assert sorted(box["outlier_channels"]) == [0, 1, 2, 3]


def test_a_baseline_of_the_whole_output_says_it_is_compared_no_more(tmp_path):
    import dataclasses

    from pytest_ptq.baseline import compare, measure

    fpath, qpath, _ = _head(tmp_path)
    now = measure(Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path))
    assert set(now.outputs) == {"out[:, 0:4]", "out[:, 4:10]"}
    before = dataclasses.replace(now, outputs={"out": 0.9999})
    notes = compare(before, now, 0.001).notes
    assert any("output(s) out are not measured now" in n for n in notes), notes
    assert not any("not measured" in n for n in compare(now, now, 0.001).notes)


def test_levels_split_alike_are_split_on_their_common_axis(tmp_path):
    fpath = builders.yolov5_head_net(tmp_path / "f.onnx")
    data = builders.samples(6, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    specs = parse_outputs(None, engine)
    assert [s.name for s in specs] == ["out[:, :, 0:4]", "out[:, :, 4:8]"]
    feeds = [{"x": a} for a in data["x"]]
    ref, full = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    verdict = three_configs(engine, specs)
    assert verdict.values["calibration"]["all quantized"] == pytest.approx(
        _cos(ref, full, lambda a: a[..., 4:]), abs=1e-6)


def test_stages_compare_the_parts(tmp_path):
    from pytest_ptq.stages import localize_stages

    fpath, qpath, data = _head(tmp_path)
    report = localize_stages(fpath, qpath, tmp_path / "calib")
    assert report.outputs == ["out[:, 0:4]", "out[:, 4:10]"] and "concatenates parts" in report.notes[0]
    feeds = [{"x": a} for a in data["x"]]
    ref, full = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds, level="all")
    assert report.value("fake-quant") == pytest.approx(_cos(ref, full, lambda a: a[:, 4:]), abs=1e-6)
    assert report.first_drop == "fake-quant"


def test_a_pair_on_a_model_output_belongs_to_the_node_that_writes_it(tmp_path):
    fpath, qpath, data = _head(tmp_path)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    concat = engine.qmodel.normal["head_concat"]
    assert concat.calibration_outputs == [CONCAT_PAIR]
    sens = get_sensitivity_of_nodes(engine, node_type="node")
    assert next(iter(sens)) == "head_concat"  # the worst: its output pair's one scale
    assert CONCAT_PAIR in sens.details["head_concat"]["calibration_nodes"]
    feeds = [{"x": a} for a in data["x"]]
    keep = set(sens.details["head_concat"]["calibration_nodes"])
    ref = builders.run_model(fpath, feeds)
    alone = builders.run_model(builders.rewire(qpath, keep=keep, float_model=fpath), feeds)
    assert sens["head_concat"]["cosine-similarity"] == pytest.approx(_cos(ref, alone, lambda a: a[:, 4:]), abs=1e-6)


def test_one_unknown_extent_is_what_the_value_leaves():
    from pytest_ptq.outputs import unlike_parts

    value = np.concatenate([np.full((1, 4, 5), 100.0), np.full((1, 6, 5), 0.5)], axis=1)
    assert [(a, b) for a, b, _ in unlike_parts(value, 1, [4, None])] == [(0, 4), (4, 10)]
    assert [(a, b) for a, b, _ in unlike_parts(value, 1, [None, 6])] == [(0, 4), (4, 10)]
    assert unlike_parts(value, 1, [4, 7]) == []  # extents that do not fit: whole
    assert unlike_parts(value, 1, [None, 10]) == []  # an empty part: whole


def test_check_data_scores_the_parts(tmp_path):
    from pytest_ptq.datacheck import check_data

    fpath, qpath, data = _head(tmp_path)
    held = builders.samples(4, size=8, seed=7)
    builders.save_folder(held, tmp_path / "held")
    report = check_data(qpath, tmp_path / "calib", heldout=tmp_path / "held", float_model=fpath)
    for name, arrays in (("calibration", data), ("heldout", held)):
        feeds = [{"x": a} for a in arrays["x"]]
        want = _cos(builders.run_model(fpath, feeds), builders.run_model(qpath, feeds), lambda a: a[:, 4:])
        assert report.quantized[name]["cosine-similarity"] == pytest.approx(want, abs=1e-6), name


def test_the_diagnosis_names_the_pair_that_explains_the_node(tmp_path):
    from pytest_ptq.diagnosis import diagnose

    fpath, qpath, data = _head(tmp_path)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    sens = get_sensitivity_of_nodes(engine, node_type="node")
    diag = diagnose(engine, sens, three_configs(engine, parse_outputs(None, engine)), top=3)
    head = next(it for it in diag.nodes if it["node"] == "head_concat")
    assert head["chosen"] == [CONCAT_PAIR]  # not the Sigmoid's or the boxes' pair it also reads
    feeds = [{"x": a} for a in data["x"]]
    ref = builders.run_model(fpath, feeds)
    for i in head["inputs"]:
        alone = builders.run_model(builders.rewire(qpath, keep={i["node"]}, float_model=fpath), feeds)
        assert i["alone"] == pytest.approx(min(_cos(ref, alone, lambda a: a[:, :4]),
                                               _cos(ref, alone, lambda a: a[:, 4:])), abs=1e-6), i["node"]


def test_the_plugin_fails_the_scores_and_its_report_says_why(pytester, tmp_path):
    import html

    from test_plugin import run

    fpath, qpath, data = _head(tmp_path)
    feeds = [{"x": a} for a in data["x"]]
    scores = _cos(builders.run_model(fpath, feeds), builders.run_model(qpath, feeds), lambda a: a[:, 4:])
    result = run(pytester, "--ptq-model", str(qpath), "--ptq-data", str(tmp_path / "calib"), "--ptq-float-model",
                 str(fpath), "--ptq-report", "report.html", "-p", "no:xdist")
    result.stdout.fnmatch_lines([f"*cosine-similarity of 'out[[]:, 4:10[]]' {scores:.6f}*needs >= 0.99*"])
    page = html.unescape((pytester.path / "report.html").read_text())
    assert "Output 'out' concatenates parts whose magnitudes differ 10x or more" in page


def test_an_output_far_from_zero_is_flagged_and_correlation_sees_what_cosine_hides(tmp_path):
    from pytest_ptq.outputs import OFFSET_WARNING, blind_warnings

    fpath = builders.offset_net(tmp_path / "f.onnx", offset=300.0)
    data = builders.samples(6, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    builders.save_folder(data, tmp_path / "calib")
    feeds = [{"x": a} for a in data["x"]]
    ref, full = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    r = np.concatenate([o["depth"].ravel() for o in ref]).astype(np.float64)
    t = np.concatenate([o["depth"].ravel() for o in full]).astype(np.float64)
    cosine, correlation = float(r @ t / np.sqrt((r @ r) * (t @ t))), float(np.corrcoef(r, t)[0, 1])
    assert cosine > 0.9999 and correlation < 0.99  # the output's one scale spans 0..300: steps of ~1.2
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path)
    values = analysis.output_metrics(metrics=["cosine-similarity", "correlation"]).values["depth"]
    assert values["cosine-similarity"] == pytest.approx(cosine, abs=1e-6)
    assert values["correlation"] == pytest.approx(correlation, abs=1e-6)
    first = ref[0]["depth"].astype(np.float64)
    flat = abs(first.mean()) / np.sqrt(np.mean(first ** 2))  # cosine of the first sample against its mean
    told = [w for w in analysis.warnings if w.startswith(OFFSET_WARNING)]
    assert len(told) == 1 and "'depth'" in told[0] and f"cosine {flat:.6f}" in told[0], analysis.warnings
    assert blind_warnings(analysis.engine, metric="mse") == []  # an error in units sees it
    assert blind_warnings(analysis.engine, metric="correlation") == []


def test_an_offset_that_three_metrics_are_blind_to_is_told_once(tmp_path, monkeypatch):
    """Checks in cosine, sqnr and mre on an output far from zero listed the same warning three
    times in the report, each metric scanning the outputs again."""
    from pytest_ptq import analysis as analysis_module

    data = builders.samples(4, size=8)
    qpath = builders.quantize(builders.offset_net(tmp_path / "f.onnx", offset=300.0), tmp_path / "q.onnx", data)
    scans = []
    monkeypatch.setattr(analysis_module, "far_from_zero",
                        lambda *a, **k: scans.append(1) or far_from_zero(*a, **k))
    analysis = Analysis(AnalysisKey(str(qpath), str(builders.save_folder(data, tmp_path / "calib"))), tmp_path)
    for metric in ("cosine-similarity", "sqnr", "mre", "correlation"):
        analysis.output_metrics(None, [metric])
    assert [w[:60] for w in analysis.warnings] == [OFFSET_WARNING[:60]] and len(scans) == 1


def test_a_score_far_from_zero_is_judged_over_the_samples(tmp_path):
    from pytest_ptq.outputs import OFFSET_WARNING, blind_warnings

    fpath = builders.offset_net(tmp_path / "f.onnx", offset=300.0, scalar=True)
    data = builders.samples(6, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    told = blind_warnings(Engine(qpath, data, float_model=fpath))
    # one value a sample has no spread within it: two samples give it one
    values = np.array([o["depth"].item() for o in builders.run_model(fpath, [{"x": a} for a in data["x"][:2]])])
    flat = abs(values.mean()) / np.sqrt(np.mean(values ** 2))
    assert len(told) == 1 and told[0].startswith(OFFSET_WARNING) and "on the first 2 samples" in told[0]
    assert f"cosine {flat:.6f}" in told[0]


def test_outputs_near_zero_raise_no_offset_warning(tmp_path):
    from pytest_ptq.outputs import blind_warnings

    fpath, qpath, data = _head(tmp_path)
    assert blind_warnings(Engine(qpath, data, float_model=fpath)) == []


def test_a_contract_on_an_output_far_from_zero_warns_and_correlation_fails_it(pytester, tmp_path):
    from test_plugin import run

    fpath = builders.offset_net(pytester.path / "f.onnx", offset=300.0)
    data = builders.samples(6, size=8)
    builders.quantize(fpath, pytester.path / "q.onnx", data)
    builders.save_folder(data, pytester.path / "calib")
    pytester.makefile(".ptq.yaml", cos="model: q.onnx\ndata: calib\nfloat_model: f.onnx\noutputs: 0.999\n",
                      corr="model: q.onnx\ndata: calib\nfloat_model: f.onnx\nmetric: correlation\noutputs: 0.999\n")
    result = run(pytester, "-p", "no:xdist", "-v")
    result.stdout.fnmatch_lines(["corr.ptq.yaml::outputs FAILED*"])
    result.stdout.fnmatch_lines(["cos.ptq.yaml::outputs PASSED*"])  # a cosine of 0.9999+ whatever the grid
    joined = " ".join(result.stdout.str().split())  # the summary wraps its warnings
    assert re.search(r"an output sits so far from zero that cosine similarity cannot see its errors: 'depth' has "
                     r"mean.*judge it by correlation", joined), joined


def test_runall_and_the_diagnosis_warn_of_an_output_far_from_zero(tmp_path):
    from pytest_ptq.outputs import OFFSET_WARNING
    from pytest_ptq.runall import runall

    fpath = builders.offset_net(tmp_path / "f.onnx", offset=300.0)
    data = builders.samples(4, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    summary = runall(Engine(qpath, data, float_model=fpath), save_dir=tmp_path / "out", top=1, progress=False)
    assert sum(w.startswith(OFFSET_WARNING) for w in summary["warnings"]) == 1
    text = (tmp_path / "out" / "summary.md").read_text()
    assert OFFSET_WARNING in text and "nothing urgent" not in text
    # cosine calls it close to float; correlation on the same runs blames the activations
    feeds = [{"x": a} for a in data["x"]]
    ref, full = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    r = np.concatenate([o["depth"].ravel() for o in ref]).astype(np.float64)
    t = np.concatenate([o["depth"].ravel() for o in full]).astype(np.float64)
    verdict = summary["verdict"]
    assert verdict["source"] == "neither" and verdict["by_correlation"]["source"] == "activation"
    assert verdict["by_correlation"]["values"]["all quantized"] == pytest.approx(np.corrcoef(r, t)[0, 1], abs=1e-6)
    assert "By correlation on `depth`, which sits too far from zero" in text
    assert summary["verdict"]["next_steps"][0].startswith("judge `depth` by correlation")
    quiet = runall(Engine(qpath, data, float_model=fpath), save_dir=tmp_path / "corr", metrics=["correlation"],
                   top=1, progress=False)
    assert not any(w.startswith(OFFSET_WARNING) for w in quiet["warnings"])
    assert quiet["verdict"]["source"] == "activation"
    assert quiet["top_nodes"]["activation"] == ["depth_QuantizeLinear"]  # the output's one coarse scale
    assert quiet["verdict"]["by_correlation"] is None
    analysis = Analysis(AnalysisKey(str(qpath), str(builders.save_folder(data, tmp_path / "calib")), str(fpath)),
                        root=tmp_path)
    told = [w["text"] for w in analysis.diagnosis(node_type="activation").warnings]
    assert sum(w.startswith(OFFSET_WARNING) for w in told) == 1


def test_suggest_warns_when_its_target_is_a_cosine_of_an_output_far_from_zero(tmp_path):
    from pytest_ptq.outputs import OFFSET_WARNING
    from pytest_ptq.remedy import suggest_remedy

    fpath = builders.offset_net(tmp_path / "f.onnx", offset=300.0)
    data = builders.samples(4, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    cos = suggest_remedy(str(qpath), data, target=0.999, remedy="float", float_model=str(fpath),
                         save_dir=tmp_path / "cos", progress=False)
    assert cos.met and cos.nodes == []  # met by nothing at all
    assert sum(w.startswith(OFFSET_WARNING) for w in cos.warnings) == 1
    corr = suggest_remedy(str(qpath), data, target=0.999, metric="correlation", remedy="float",
                          float_model=str(fpath), save_dir=tmp_path / "corr", progress=False)
    assert corr.nodes and not any(w.startswith(OFFSET_WARNING) for w in corr.warnings)


def _one_logit(root):
    """A net whose one output holds one value a sample (a binary classifier's logit), beside
    its calibration folder."""
    fpath = builders.offset_net(root / "f.onnx", offset=0.0, scalar=True)
    data = builders.samples(6, size=8)
    qpath = builders.quantize(fpath, root / "q.onnx", data)
    builders.save_folder(data, root / "calib")
    return fpath, qpath, data


def test_kl_on_an_output_of_one_value_a_row_is_said_blind_by_the_ranking_and_the_analysis(tmp_path, capsys):
    """kl's softmax over a last axis of one value is 1 whatever quantization does: every node
    ranked 0 in kl, with no word, on an output the quantized model moves."""
    from pytest_ptq.cli import main
    from pytest_ptq.outputs import KL_WARNING

    fpath, qpath, data = _one_logit(tmp_path)
    feeds = [{"x": a} for a in data["x"]]
    ref = np.concatenate([o["depth"] for o in builders.run_model(fpath, feeds)]).astype(np.float64)
    full = np.concatenate([o["depth"] for o in builders.run_model(qpath, feeds)]).astype(np.float64)
    p, q = (np.exp(v - v.max(-1, keepdims=True)) for v in (ref, full))
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    assert float((p * np.log(p / q)).sum(-1).mean()) == 0.0 and np.mean((ref - full) ** 2) > 0
    assert main(["get-sensitivity-of-nodes", str(qpath), str(tmp_path / "calib"), "-m", "kl", "mse", "--quiet",
                 "--json", str(tmp_path / "s.json")]) == 0
    err = capsys.readouterr().err
    told = [line for line in err.splitlines() if KL_WARNING in line]
    assert len(told) == 1 and "'depth' has shape [1, 1, 1, 1]" in told[0] and "mse" in told[0], err
    values = json.loads((tmp_path / "s.json").read_text())["values"]
    assert {v["kl"] for v in values.values()} == {0.0} and max(v["mse"] for v in values.values()) > 0
    assert main(["get-sensitivity-of-nodes", str(qpath), str(tmp_path / "calib"), "-m", "mse", "--quiet"]) == 0
    assert KL_WARNING not in capsys.readouterr().err  # another metric sees the output
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path)
    analysis.sensitivity(metric="cosine-similarity")
    assert not [w for w in analysis.warnings if KL_WARNING in w]
    analysis.sensitivity(metric="kl")
    assert sum(KL_WARNING in w for w in analysis.warnings) == 1, analysis.warnings


def test_a_contract_in_kl_on_one_logit_warns_that_kl_cannot_see_it(pytester):
    from test_plugin import run

    _one_logit(pytester.path)
    pytester.makefile(".ptq.yaml", kl="model: q.onnx\ndata: calib\nfloat_model: f.onnx\nmetric: kl\noutputs: 0.01\n")
    result = run(pytester, "-p", "no:xdist", "-v")
    result.stdout.fnmatch_lines(["kl.ptq.yaml::outputs PASSED*"])  # 0 whatever the grid
    joined = " ".join(result.stdout.str().split())  # the summary wraps its warnings
    assert re.search(r"kl cannot see errors in an output whose last axis holds one value: 'depth' has shape "
                     r"\[1, 1, 1, 1\].*judge it by an error in its units", joined), joined


def test_a_passing_baseline_says_which_of_its_nodes_the_model_no_longer_has(tmp_path):
    import dataclasses

    from pytest_ptq.baseline import compare, measure
    from pytest_ptq.checks import BaselineResult

    fpath, qpath, _ = _head(tmp_path)
    now = measure(Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path))
    assert now.sensitivity
    before = dataclasses.replace(now, sensitivity={**now.sensitivity, "gone_QuantizeLinear": 0.999})
    d = compare(before, now, 0.001)
    result = BaselineResult(passed=d.ok, status="ok", path="b.json", diff=d, tolerance=0.001, model="m.onnx")
    assert d.ok and result.summary.endswith(
        "; 1 of its node(s) are not in the model now (gone_QuantizeLinear) and were not compared")
    same = compare(now, now, 0.001)
    assert "not in the model now" not in BaselineResult(passed=True, status="ok", path="b.json", diff=same,
                                                        tolerance=0.001, model="m.onnx").summary


def _classifier(tmp_path, logits_output=True):
    """A MatMul and the ArgMax of its logits, quantized: ``(float path, QDQ path, data)``."""
    helper = onnx.helper
    w = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    outputs = [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 5])] if logits_output else []
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"]),
                               helper.make_node("ArgMax", ["logits"], ["cls"], axis=1)], "cls",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
                              outputs + [helper.make_tensor_value_info("cls", onnx.TensorProto.INT64, [1])],
                              [numpy_helper.from_array(w, "w")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [np.random.default_rng(k).standard_normal((1, 8)).astype(np.float32) for k in range(4)]}
    return fp, builders.quantize(fp, tmp_path / "q.onnx", data), data


def test_naming_an_integer_output_warns_that_a_metric_cannot_judge_ids(tmp_path):
    """``outputs: {cls: 0.97}`` on an ArgMax's int64 ids passed on cosine 0.977 where 96% of
    the ids agreed: a cosine of ids weighs their numbering, not the model."""
    _, qpath, data = _classifier(tmp_path)
    qm = Engine(str(qpath), data).qmodel
    with pytest.warns(UserWarning, match=r"output 'cls' holds int64 values \(ids or a mask\?\)"):
        parse_outputs(["cls"], qm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [s.name for s in parse_outputs(["logits"], qm)] == ["logits"]
        assert [s.name for s in parse_outputs(None, qm)] == ["logits"]  # the default leaves ids out
    # and says so, where README promises what is left out is never left out in silence
    assert [n for n in qm.notes if "'cls'" in n] == [
        "model output 'cls' holds int64 values (a mask or ids?), which no output metric can weigh (a change of every "
        "id may read as none); ArgMax 'ArgMax_0' computes it from the float tensor 'logits': the "
        "comparisons judge the float outputs; name it (output_node / --output-node) to compare it all the same"]


def test_a_model_of_ids_only_fails_an_output_check_that_could_not_fail_and_names_the_scores(tmp_path):
    """A classifier whose only output is its ArgMax: a cosine of the ids passes whatever the
    ids do (labels 1 against 2 read 1), so the default output check refuses, naming the float
    tensor the ids come from; named, that tensor is judged, equal to the float model's and the
    quantized model's logits compared directly."""
    from pytest_ptq.errors import PTQError

    fp, qpath, data = _classifier(tmp_path, logits_output=False)
    calib = builders.save_folder(data, tmp_path / "calib")
    analysis = Analysis(AnalysisKey(str(qpath), str(calib), str(fp)), root=tmp_path)
    with pytest.raises(PTQError, match=r"model output 'cls' holds int64 values .* ArgMax 'ArgMax_0' computes it from "
                                       r"the float tensor 'logits', and the model has no float output: name the tensor "
                                       r"to judge in the check's outputs \({'logits': 0.99}\)"):
        check_outputs(analysis, 0.99)
    result = check_outputs(analysis, {"logits": 0.5})
    feeds = [{"x": x} for x in data["x"]]
    ref = np.concatenate([o["logits"].ravel() for o in builders.run_model(builders.rewire(fp, outputs=["logits"]), feeds,
                                                                              outputs=["logits"])])
    got = np.concatenate([o["logits"].ravel() for o in builders.run_model(
        builders.rewire(qpath, keep=list(builders.qdq_pairs(qpath)), outputs=["logits"]), feeds, outputs=["logits"])])
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    assert result.passed and result.values["logits"] == pytest.approx(ref @ got / np.sqrt((ref @ ref) * (got @ got)),
                                                                      abs=1e-6)


def test_an_empty_output_list_is_refused_naming_the_outputs(tmp_path):
    # scored on no output every figure was NaN, and runall's verdict read NaNs as a cause
    from pytest_ptq.errors import PTQError
    from pytest_ptq.model import QuantModel

    data = builders.samples(2)
    q = builders.quantize(builders.conv_net(tmp_path / "f.onnx"), tmp_path / "q.onnx", data)
    qm = QuantModel(q)
    with pytest.raises(PTQError, match=r"output_node is empty; name the outputs to score \(prob\)"):
        parse_outputs([], qm)
    assert [s.tensor for s in parse_outputs(None, qm)] == [s.tensor for s in parse_outputs(list(qm.output_names), qm)]


def test_a_baseline_value_that_leaves_nan_has_improved():
    """An output or node recorded as NaN (it went non-finite) and finite now read "nan ->
    1.000000 (worse by inf)" and failed the check; finite to NaN is the one that is worse."""
    import math

    from pytest_ptq.baseline import Baseline, compare

    def baseline(value):
        return Baseline(metric="cosine-similarity", node_type="activation", outputs={"out": value},
                        sensitivity={"n": value})

    mended = compare(baseline(math.nan), baseline(1.0), 0.001)
    assert not mended.nodes and not mended.outputs and {m.name for m in mended.improved} == {"out", "n"}
    broken = compare(baseline(1.0), baseline(math.nan), 0.001)
    assert [m.name for m in broken.nodes] == ["n"] and [m.name for m in broken.outputs] == ["out"]
    assert all(m.worse == math.inf for m in broken.nodes + broken.outputs)


def test_a_baseline_of_other_samples_or_of_few_nodes_now_does_not_pass_unseen():
    """Measured on 8 samples and compared on 1, or with 8 of its 9 nodes renamed, the check
    passed with "ok", what it had not compared said only in its details."""
    from pytest_ptq.baseline import Baseline, compare

    def baseline(samples=8, nodes=("a", "b", "c", "d", "e", "f", "g", "h", "i")):
        return Baseline(metric="cosine-similarity", node_type="activation", outputs={"out": 0.99},
                        sensitivity={n: 0.999 for n in nodes}, data={"samples": samples})

    assert compare(baseline(), baseline(), 0.001).ok
    fewer = compare(baseline(), baseline(samples=1), 0.001)
    assert not fewer.ok and fewer.mismatch == "it was measured on 8 calibration sample(s) and this check measures 1"
    renamed = compare(baseline(), baseline(nodes=("a", *(f"{n}_v2" for n in "bcdefghi"))), 0.001)
    assert not renamed.ok and renamed.mismatch.startswith("only 1 of its 9 nodes are in the model now")
    assert compare(baseline(), baseline(nodes="abcdefg"), 0.001).ok  # a few nodes gone: noted, compared


def test_a_baseline_saved_by_a_windows_editor_is_read(tmp_path):
    """A baseline edited in Notepad or written by PowerShell 5.1 starts with a UTF-8 BOM (and
    ends its lines with CRLF): it read "it is not valid JSON: Unexpected UTF-8 BOM"."""
    from pytest_ptq.baseline import Baseline

    saved = Baseline(metric="cosine-similarity", node_type="activation", outputs={"out": 0.99},
                     sensitivity={"n": 0.999}, data={"samples": 8})
    saved.save(tmp_path / "b.json")
    edited = tmp_path / "edited.json"
    edited.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "b.json").read_bytes().replace(b"\n", b"\r\n"))
    assert Baseline.load(edited).to_dict() == Baseline.load(tmp_path / "b.json").to_dict()


def test_a_folders_hash_orders_its_files_by_their_names_parts_with_case(tmp_path):
    """The data's hash ordered its files as paths compare: without case on Windows, by the
    whole string on Python 3.12; the same folder hashed otherwise, and a baseline made on
    Linux noted "the data changed" there. The order is now the names' parts, case kept."""
    import hashlib

    from pytest_ptq.cache import file_hash

    names = ["x-y/0.npy", "x/0.npy", "Mask/0.npy", "input/0.npy"]
    for k, name in enumerate(names):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(bytes([k]))
    h = hashlib.sha256()
    for name in sorted(names, key=lambda n: n.split("/")):  # "Mask" < "input" < "x" < "x-y"
        h.update(name.encode() + b"\0" + (tmp_path / name).read_bytes())
    assert file_hash(tmp_path) == h.hexdigest()


def test_a_baseline_of_a_newer_format_is_neither_read_nor_downgraded(tmp_path):
    """Format 2 with a key format 1 lacks read "has an unknown key 'holdout'; rewrite it", and
    --ptq-update-baseline rewrote it in format 1, its new fields gone."""
    from pytest_ptq.baseline import FORMAT
    from pytest_ptq.checks import check_baseline

    data = builders.samples(4)
    builders.save_folder(data, tmp_path / "calib")
    builders.quantize(builders.conv_net(tmp_path / "f.onnx"), tmp_path / "q.onnx", data)
    analysis = Analysis(AnalysisKey(str(tmp_path / "q.onnx"), str(tmp_path / "calib")), tmp_path)
    newer = tmp_path / "b.json"
    text = json.dumps({"format": FORMAT + 1, "metric": "cosine-similarity", "node_type": "node", "outputs": {"prob": 1},
                       "sensitivity": {}, "holdout": {}, "tool": {"pytest_ptq": "9.0.0"}})
    newer.write_text(text)
    result = check_baseline(analysis, newer)
    assert not result and result.summary == (
        f"baseline {analysis.relative(newer)} was written by a newer pytest-ptq (9.0.0) in format {FORMAT + 1}, which "
        f"this one (format {FORMAT}) cannot read: upgrade pytest-ptq; it is never rewritten in the older format")
    with pytest.raises(PTQError, match="never rewritten in the older format"):
        check_baseline(analysis, newer, update="failing")
    assert newer.read_text() == text


def test_a_merge_conflicted_baseline_says_so_once(tmp_path):
    """A baseline with git's conflict markers read "it is not valid JSON: Expecting property
    name ... line 27", the sentence twice (summary and details)."""
    from pytest_ptq.checks import check_baseline

    data = builders.samples(4)
    builders.save_folder(data, tmp_path / "calib")
    builders.quantize(builders.conv_net(tmp_path / "f.onnx"), tmp_path / "q.onnx", data)
    analysis = Analysis(AnalysisKey(str(tmp_path / "q.onnx"), str(tmp_path / "calib")), tmp_path)
    path = tmp_path / "b.json"
    path.write_text('{\n<<<<<<< HEAD\n  "format": 1,\n=======\n  "format": 1,\n>>>>>>> other\n}\n')
    result = check_baseline(analysis, path)
    assert "holds a merge conflict (<<<<<<< markers) (keep one side, or measure this model again)" in result.summary
    assert result.details == ""


@pytest.mark.parametrize("metric, stricter", [("cosine-similarity", np.inf), ("mse", -np.inf)])
def test_a_threshold_equal_to_the_measured_value_passes(tmp_path, metric, stricter):
    """A bound is a bound: a value equal to its threshold meets it; the next float past it does not."""
    fpath, qpath, data = _head(tmp_path)
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path)
    measured = check_outputs(analysis, {"out": 0.0 if metric != "mse" else 1e9}, metric=metric).values["out"]
    feeds = [{"x": a} for a in data["x"]]
    ref, got = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    if metric == "mse":
        r = np.concatenate([o["out"].ravel() for o in ref]).astype(np.float64)
        t = np.concatenate([o["out"].ravel() for o in got]).astype(np.float64)
        assert measured == pytest.approx(np.mean((r - t) ** 2), rel=1e-5)
    else:
        assert measured == pytest.approx(_cos(ref, got, lambda a: a), abs=1e-6)
    assert check_outputs(analysis, {"out": measured}, metric=metric).passed
    assert not check_outputs(analysis, {"out": float(np.nextafter(measured, stricter))}, metric=metric).passed


def test_an_output_named_like_a_slice_is_the_tensor_of_that_name(tmp_path):
    """An exporter's output name may hold '=' and '[0]': the name itself wins over the slice
    syntax, by default and when named (it read as an alias of an unknown tensor 'score')."""
    fpath = builders.conv_net(tmp_path / "f.onnx")
    model = onnx.load(str(fpath))
    name = "cls=score[0]"
    model.graph.node[-1].output[0] = model.graph.output[0].name = name
    onnx.save(model, str(fpath))
    data = builders.samples(4)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    builders.save_folder(data, tmp_path / "calib")
    qm = onnx.load(str(qpath))
    specs = parse_outputs([name], Engine(qpath, tmp_path / "calib"))
    assert [(s.name, s.tensor, s.index) for s in specs] == [(name, name, ())]
    result = check_outputs(Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib")), tmp_path), 0.5)
    floats = [builders.run_model(onnx.load(str(fpath)), {"x": x})[name] for x in data["x"]]
    quants = [builders.run_model(qm, {"x": x})[name] for x in data["x"]]
    assert result.values[name] == pytest.approx(builders.pooled_cosine(floats, quants), abs=1e-6)


def test_an_output_of_zeros_in_float_is_said_undefined_for_scaled_metrics(tmp_path):
    """z = Gemm(x, 0, 0.1) - 0.1 is 0 in float and a few steps off it quantized: cosine read
    0 ("wholly lost"), the stages, the verdict and the plugin blamed the weights, and nothing
    said that cosine, sqnr, mre and correlation are undefined on an output of zeros."""
    from onnx import TensorProto, helper, numpy_helper

    from pytest_ptq.outputs import ZERO_WARNING, blind_warnings
    from pytest_ptq.runall import runall

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.zeros((8, 8), np.float32), "wz"),
             numpy_helper.from_array(np.full(8, 0.1, np.float32), "b"),
             numpy_helper.from_array(np.full((1, 8), 0.1, np.float32), "c"),
             numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "wz", "b"], ["g"], name="gemm"),
         helper.make_node("Sub", ["g", "c"], ["z"], name="sub"), helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "zero_out", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    fpath = builders.save_model(graph, tmp_path / "f.onnx")
    data = {"x": [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(5)]}
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    feeds = [{"x": a} for a in data["x"]]
    assert not any(o["z"].any() for o in builders.run_model(fpath, feeds))
    assert all(o["z"].any() for o in builders.run_model(qpath, feeds))  # a few steps off 0: cosine 0 by definition
    engine = Engine(qpath, data, float_model=fpath)
    told = {metric: blind_warnings(engine, metric=metric) for metric in ("cosine-similarity", "sqnr", "correlation")}
    [[one]] = {tuple(t) for t in told.values()}  # one sentence, said once whichever metrics were asked for
    assert one.startswith(f"{ZERO_WARNING}: 'z' holds only zeros in float on the first 5 samples, so cosine, sqnr")
    assert blind_warnings(engine, metric="mse") == []
    summary = runall(engine, save_dir=tmp_path / "out", top=1, progress=False)
    assert sum(w.startswith(ZERO_WARNING) for w in summary["warnings"]) == 1
    assert "judge 'z' by correlation" not in (tmp_path / "out" / "summary.md").read_text()  # undefined there too
    # its 0 decided the verdict ("weights cause the loss", cosine 0): y alone judges now
    assert summary["outputs_compared"] == ["y"]
    assert any(w.startswith("runall ranks and judges by `y` alone: `z` hold(s) only zeros in float on the first 5 "
                            "sample(s)") for w in summary["warnings"])
    by_correlation = runall(engine, save_dir=tmp_path / "corr", top=1, progress=False, metrics=["correlation"])
    assert by_correlation["outputs_compared"] == ["y"]  # 0 or 1 there too
    ref, full = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    r = np.concatenate([o["y"].ravel() for o in ref]).astype(np.float64)
    t = np.concatenate([o["y"].ravel() for o in full]).astype(np.float64)
    assert summary["verdict"]["all quantized"] == pytest.approx(r @ t / np.sqrt((r @ r) * (t @ t)), abs=1e-6)


def test_an_output_of_zeros_on_the_first_samples_alone_still_ranks(tmp_path):
    """z = Relu(x @ w1) is 0 on the first 8 samples (x below 0, w1 above) and not on the ones
    after. The scan for outputs of zeros stopped at 8 samples, so runall dropped z from its
    rankings and its verdict, though the metrics pool every sample and z's cosine is defined
    there: w1, whose outlier costs z alone, ranked 1.0 (y alone) against 0.99971 over all."""
    from onnx import TensorProto, helper

    from pytest_ptq.outputs import OFFSET_SAMPLES, ZERO_WARNING
    from pytest_ptq.runall import runall
    from pytest_ptq.sensitivity import Sensitivity

    rng = np.random.default_rng(0)
    w1 = np.abs(rng.standard_normal((8, 8))).astype(np.float32)
    w1[0, 0] = 20.0  # an outlier: a coarse per-tensor scale for w1's other values
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"), helper.make_node("Relu", ["m1"], ["z"], name="relu"),
         helper.make_node("MatMul", ["x", "w2"], ["y"], name="mm2")],
        "late", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w2")])
    fpath = builders.save_model(graph, tmp_path / "f.onnx")
    xs = [-np.abs(rng.standard_normal((1, 8))).astype(np.float32) for _ in range(OFFSET_SAMPLES)] + \
         [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(4)]
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", {"x": xs})
    feeds = [{"x": x} for x in xs]
    ref = builders.run_model(fpath, feeds)
    assert not any(o["z"].any() for o in ref[:OFFSET_SAMPLES]) and any(o["z"].any() for o in ref[OFFSET_SAMPLES:])
    summary = runall(Engine(qpath, {"x": xs}, float_model=fpath), save_dir=tmp_path / "out", top=1, progress=False,
                     rank_samples="all", node_type="weight")
    assert summary["outputs_compared"] == ["z", "y"]
    assert not any(w.startswith(ZERO_WARNING) or "alone:" in w for w in summary["warnings"])
    ranked = Sensitivity.load(summary["files"]["sensitivity"]["weight"])
    brute = {name: builders.worst_cosine(ref, builders.run_model(builders.rewire(qpath, keep=[name], float_model=fpath),
                                                                 feeds))
             for name in ranked}
    assert set(brute) == {"w1_QuantizeLinear", "w2_QuantizeLinear"}
    assert {n: v["cosine-similarity"] for n, v in ranked.items()} == pytest.approx(brute, abs=1e-6)
    assert ranked.ranking == sorted(brute, key=brute.get)


def test_the_cli_warns_of_an_output_of_zeros_on_the_samples_its_data_num_pools(tmp_path, capsys):
    """z = Relu(x @ w) is 0 on the first 8 samples and not on the 4 after. With --data-num 8
    the ranking pools those 8 alone, where z's cosine is undefined; the scan for outputs of
    zeros read every sample of the data, found z's later values and said nothing."""
    from onnx import TensorProto, helper

    from pytest_ptq.cli import main
    from pytest_ptq.outputs import ZERO_WARNING

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Relu", ["m"], ["z"], name="relu"),
         helper.make_node("MatMul", ["x", "w2"], ["y"], name="mm2")],
        "late", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.abs(rng.standard_normal((8, 8))).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w2")])
    fpath = builders.save_model(graph, tmp_path / "f.onnx")
    xs = [-np.abs(rng.standard_normal((1, 8))).astype(np.float32) for _ in range(8)] + \
         [np.abs(rng.standard_normal((1, 8))).astype(np.float32) for _ in range(4)]
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", {"x": xs})
    builders.save_folder({"x": xs}, tmp_path / "calib")
    ref = builders.run_model(fpath, [{"x": x} for x in xs])
    assert not any(o["z"].any() for o in ref[:8]) and all(o["z"].any() for o in ref[8:])
    for data_num, warned in (("8", True), ("12", False)):
        assert main(["get-sensitivity-of-nodes", str(qpath), str(tmp_path / "calib"), "--data-num", data_num,
                     "--quiet"]) == 0
        err = capsys.readouterr().err
        assert (f"{ZERO_WARNING}: 'z' holds only zeros in float" in err) is warned, (data_num, err)


def _two_outputs(tmp_path, rename=None):
    """conv_net's two outputs (the feature map r2 and prob), int4 weights so that r2 loses;
    ``rename``: r2's new name. ``(float path, quantized path, data, figures)``, the figures
    pooled cosines of a plain onnxruntime session of each (and of r2's first two channels)
    against the float one."""
    data = builders.samples(4, seed=1)
    model = onnx.load(builders.conv_net(tmp_path / "conv.onnx", outlier_channel=3, two_outputs=True))
    r2 = rename or "r2"
    for names in [n.output for n in model.graph.node] + [n.input for n in model.graph.node]:
        for k, name in enumerate(names):
            if name == "r2":
                names[k] = r2
    next(o for o in model.graph.output if o.name == "r2").name = r2
    fpath = tmp_path / "float.onnx"
    onnx.save(model, fpath)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data, weight_type="QInt4", activation_type="QUInt16")
    builders.save_folder(data, tmp_path / "calib")
    feeds = [{"x": a} for a in data["x"]]
    ref, out = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    return fpath, qpath, data, {
        r2: builders.pooled_cosine([r[r2] for r in ref], [o[r2] for o in out]),
        f"{r2}[:, :2]": builders.pooled_cosine([r[r2][:, :2] for r in ref], [o[r2][:, :2] for o in out]),
        "prob": builders.pooled_cosine([r["prob"] for r in ref], [o["prob"] for o in out])}


def test_two_spellings_of_one_output_are_checked_once_at_the_stricter_threshold(tmp_path, pytester):
    """'r2[:, 0:2]' and 'r2[:, :2]' were two outputs checked twice, and a whole output named
    'r2[:]' was checked again under the default's threshold: each is one output, under its
    first key, held to the stricter threshold, in the checks API and in a contract file."""
    from test_plugin import run

    fpath, qpath, data, cos = _two_outputs(tmp_path)
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path)
    r = check_outputs(analysis, {"r2[:, 0:2]": 0.0, "r2[:, :2]": 1.0, "prob": 0.0})
    assert r.thresholds == {"r2[:, 0:2]": 1.0, "prob": 0.0} and not r.passed
    assert r.values == pytest.approx({"r2[:, 0:2]": cos["r2[:, :2]"], "prob": cos["prob"]}, abs=1e-6)
    r = check_outputs(analysis, {"r2[:]": 0.0, "": 1.0})
    assert r.thresholds == {"r2[:]": 0.0, "prob": 1.0}
    assert r.values == pytest.approx({"r2[:]": cos["r2"], "prob": cos["prob"]}, abs=1e-6)
    for name in ("float.onnx", "q.onnx", "calib"):
        (shutil.copytree if name == "calib" else shutil.copy)(tmp_path / name, pytester.path / name)
    pytester.makefile(".ptq.yaml", c="model: q.onnx\ndata: calib\nfloat_model: float.onnx\nbaseline: false\n"
                      "outputs: {'r2[:, :2]': 0.0, 'r2[:, 0:2]': 1.0}\n")
    text = run(pytester, "-p", "no:xdist", "-k", "c.ptq.yaml").stdout.str()
    assert f"'r2[:, :2]' {cos['r2[:, :2]']:.6f} (needs >= 1.000000)" in text, text
    assert "'r2[:, 0:2]'" not in text, text


def test_an_output_named_default_is_checked_as_default_equals_default_and_its_search_runs(tmp_path, pytester,
                                                                                          monkeypatch):
    """'default' in a contract's outputs is the outputs not named: a model's output named
    'default' had no threshold of its own, and the search printed for it read
    '--target-cosine default=V', which suggest refuses on such a model. 'default=default' is
    that output in the contract and in the printed command, which runs and starts from the
    contract's figures (a plain onnxruntime session's); the bare key is refused in one sentence."""
    import json
    import math
    import shlex

    from pytest_ptq.cli import main
    from test_plugin import run

    fpath, qpath, data, cos = _two_outputs(tmp_path, rename="default")
    cos["head"] = cos.pop("default[:, :2]")
    floors = {o: float(f"{math.ceil(cos[o] * 1e6) / 1e6 + 1e-6:.6f}") for o in ("default", "head")}
    assert floors["default"] != floors["head"] and all(cos[o] < floors[o] < 1 for o in floors), (cos, floors)
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path)
    r = check_outputs(analysis, {"default=default": floors["default"], "": 0.0})
    assert r.thresholds == {"default": floors["default"], "prob": 0.0} and r.failing == ["default"]
    assert r.values == pytest.approx({o: cos[o] for o in ("default", "prob")}, abs=1e-6)
    with pytest.raises(PTQError, match="write 'default=default' for its own"):
        check_outputs(analysis, {"default": 0.5, "prob": 0.5})
    for name in ("float.onnx", "q.onnx", "calib"):
        (shutil.copytree if name == "calib" else shutil.copy)(tmp_path / name, pytester.path / name)
    common = "model: q.onnx\ndata: calib\nfloat_model: float.onnx\nbaseline: false\n"
    pytester.makefile(".ptq.yaml", own=common + f"outputs: {{'default=default': {floors['default']!r}, "
                      f"'head=default[:, :2]': {floors['head']!r}, '': 0.0}}\n",
                      bare=common + "outputs: {default: 0.5}\n")
    text = run(pytester, "-p", "no:xdist").stdout.str()
    assert "bare.ptq.yaml), check outputs: the thresholds {'default': 0.5} give 'default', which" in text, text
    # the model named as the contract's other checks name it (relative), not by its absolute path
    assert "which 'q.onnx' also has a tensor or node named: write 'default=default' for its own" in text, text
    line = next(t for t in text.splitlines() if "meets its output floors" in t)
    command = line[line.index("ptq-debug suggest"):]
    assert command == ("ptq-debug suggest q.onnx calib --float-model float.onnx --target-cosine "
                       f"default=default={floors['default']!r} 'head=default[:, :2]={floors['head']!r}' "
                       "--remedy mixed"), command
    monkeypatch.chdir(pytester.path)
    main(shlex.split(command)[1:] + ["--no-save", "--quiet", "--no-requantize", "--budget", "30", "--json", "r.json"])
    saved = json.loads((pytester.path / "r.json").read_text())
    assert saved["objective"]["targets"] == floors
    assert saved["figures"]["calibration"]["outputs"]["before"] == pytest.approx(
        {o: cos[o] for o in floors}, abs=1e-6)


def test_every_contract_item_reading_the_outputs_refuses_a_bare_default_on_a_model_with_one(tmp_path, pytester):
    """A bare 'default' on a model whose own output is named 'default' could mean either: the
    outputs item refused it, but the nodes, data_check and baseline items read it without the
    model as the outputs not named, and ran on in silence. Each refuses it in one sentence, as
    does check_data of the checks API."""
    from pytest_ptq.checks import check_data
    from test_plugin import run

    fpath, qpath, data, _ = _two_outputs(tmp_path, rename="default")
    assert "default" in [o.name for o in onnx.load(qpath).graph.output]  # the proto, read directly
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), str(fpath)), root=tmp_path)
    with pytest.raises(PTQError, match="write 'default=default' for its own"):
        check_data(analysis, "error", None, {"default": 0.5})
    for name in ("float.onnx", "q.onnx", "calib"):
        (shutil.copytree if name == "calib" else shutil.copy)(tmp_path / name, pytester.path / name)
    pytester.makefile(".ptq.yaml", bare="model: q.onnx\ndata: calib\nfloat_model: float.onnx\n"
                      "outputs: {default: 0.5}\nnodes: 0.0\ndata_check: {max_severity: error}\n")
    text = run(pytester, "-p", "no:xdist").stdout.str()
    for item in ("outputs", "nodes", "data_check", "baseline"):
        assert (f"bare.ptq.yaml), check {item}: the thresholds {{'default': 0.5}} give 'default', which "
                in text), (item, text)
    assert not (pytester.path / "bare.baseline.json").exists()

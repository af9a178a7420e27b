"""Calibration data checks on folders with one planted problem each."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import builders
from pytest_ptq.cli import main
from pytest_ptq.datacheck import check_data
from pytest_ptq.engine import Engine

N = 20  # enough samples that the count check stays quiet


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    root = tmp_path_factory.mktemp("datacheck")
    data = builders.samples(N, seed=7)
    fpath = builders.conv_net(root / "float.onnx")
    qpath = builders.quantize(fpath, root / "qdq.onnx", data)
    return {"float": fpath, "qdq": qpath, "data": data, "root": root}


@pytest.fixture(scope="module")
def rgb_net(tmp_path_factory):
    """A model calibrated on image-like RGB data whose channel means differ."""
    root = tmp_path_factory.mktemp("rgb")
    rng = np.random.default_rng(11)
    mean = np.array([0.7, 0.45, 0.2], np.float32).reshape(1, 3, 1, 1)
    data = {"x": [(mean + 0.1 * rng.standard_normal((1, 3, 16, 16))).astype(np.float32) for _ in range(N)]}
    fpath = builders.conv_net(root / "float.onnx")
    qpath = builders.quantize(fpath, root / "qdq.onnx", data)
    return {"qdq": qpath, "data": data, "root": root}


def _input_range(qpath):
    """(lo, hi) of the pair on the model input, read from the proto."""
    model = onnx.load(str(qpath))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    s, z = float(inits[q.input[1]]), int(inits[q.input[2]])
    return s * (0 - z), s * (255 - z), s


def test_clean_data_pass(net):
    report = check_data(str(net["qdq"]), builders.save_folder(net["data"], net["root"] / "clean"))
    assert report.findings == []
    assert report
    stats = report.stats["calibration"]["x"]
    arr = np.stack(net["data"]["x"]).astype(np.float64)
    assert stats["samples"] == N and stats["layout"] == "ok"
    assert stats["mean"] == pytest.approx(arr.mean()) and stats["std"] == pytest.approx(arr.std())
    assert stats["channel_mean"] == pytest.approx(arr.mean(axis=(0, 1, 3, 4)).tolist())
    assert stats["clipped_share"] == 0


def test_an_nhwc_folder_is_named_as_such(net, tmp_path):
    folder = builders.save_folder({"x": [a.transpose(0, 2, 3, 1) for a in net["data"]["x"]]}, tmp_path / "nhwc")
    before = {p: p.read_bytes() for p in folder.rglob("*.npy")}
    report = check_data(str(net["qdq"]), folder)
    assert report.checks("error") == ["layout"]
    f = report.errors[0]
    assert f.input == "x" and "NHWC" in f.message and "(0, 3, 1, 2)" in f.fix
    assert report.stats["calibration"]["x"]["channel_axis"] == 3
    assert {p: p.read_bytes() for p in folder.rglob("*.npy")} == before  # the user's files are untouched


def test_samples_saved_without_batch_dim_in_hwc_are_nhwc_too(net, tmp_path):
    folder = builders.save_folder({"x": [a[0].transpose(1, 2, 0) for a in net["data"]["x"]]}, tmp_path / "hwc")
    assert check_data(str(net["qdq"]), folder).checks("error") == ["layout"]


def test_0_255_pixels_fall_outside_the_calibrated_range(net, tmp_path):
    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 256, (1, 3, 16, 16)).astype(np.float32) for _ in range(N)]
    report = check_data(str(net["qdq"]), builders.save_folder({"x": pixels}, tmp_path / "px"))
    assert report.checks("error") == ["range"]
    lo, hi, step = _input_range(net["qdq"])
    values = np.stack(pixels)
    share = np.mean((values < lo - step / 2) | (values > hi + step / 2))
    assert report.errors[0].details["clipped_share"] == pytest.approx(share)
    assert "0-255" in report.errors[0].message
    assert "raw-pixels" in report.checks("warning")


def test_token_ids_are_not_taken_for_pixels(tmp_path):
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.standard_normal((100, 16)).astype(np.float32), "emb"),
               numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"])], "ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "f.onnx")
    ids = {"ids": [rng.integers(0, 100, (1, 8)).astype(np.int64) for _ in range(N)]}
    qpath = builders.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", ids)
    report = check_data(str(qpath), builders.save_folder(ids, tmp_path / "ids"))
    assert report.findings == [] and report.stats["calibration"]["ids"]["samples"] == N


def _text_model(tmp_path, seq):
    """Token ids and segment ids (Gather, Add, MatMul), ``seq`` long (None: open)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(4)
    weights = [numpy_helper.from_array(rng.standard_normal((100, 16)).astype(np.float32), "emb"),
               numpy_helper.from_array(rng.standard_normal((2, 16)).astype(np.float32), "seg"),
               numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("Gather", ["seg", "types"], ["t"]),
         helper.make_node("Add", ["e", "t"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["y"])], "text",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq]),
         helper.make_tensor_value_info("types", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / f"text_{seq}.onnx")
    return tmp_path / f"text_{seq}.onnx"


@pytest.mark.parametrize("seq", [None, 12])
def test_token_inputs_of_several_lengths_and_one_segment(tmp_path, seq):
    rng = np.random.default_rng(5)
    lengths = [12] * N if seq else [1] + [int(n) for n in rng.integers(5, 30, N - 1)]  # a one-token sample too
    data = {"ids": [rng.integers(0, 100, (1, n)).astype(np.int64) for n in lengths],
            # one-segment text (every id 0) beside two-segment text: a constant sample is no blank one
            "types": [(np.arange(n) >= n // 2).astype(np.int64)[None] * (i % 2) for i, n in enumerate(lengths)]}
    fpath = _text_model(tmp_path, seq)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", {k: v[:1] for k, v in data.items()})
    report = check_data(str(qpath), builders.save_folder(data, tmp_path / "text"))
    assert "constant" not in report.checks()  # an integer input holding one id is no blank image
    if seq:
        assert report.findings == []
    else:  # lengths vary along the axis the model leaves open: a note, and every sample runs
        assert report.checks("error") == [] and report.checks("info") == ["shape", "shape"]
        assert "axis 1: " in report.findings[0].message
        # the table's shape is the span of every sample's, not the commonest one's
        assert report.stats["calibration"]["ids"]["shape_span"] == ["1", f"{min(lengths)}..{max(lengths)}"]
        Engine(qpath, data).run(N - 1, "all")


def test_a_shape_the_model_fixes_is_an_error_and_a_constant_float_input_a_note(net, tmp_path):
    arrays = [a.copy() for a in net["data"]["x"]]
    arrays[3] = arrays[3][:, :, :8]
    report = check_data(str(net["qdq"]), {"x": arrays})
    assert "shape" in report.checks("error")
    report = check_data(str(net["qdq"]), {"x": [np.full_like(a, 0.5) for a in net["data"]["x"]]})
    assert report.checks("info") == ["constant"] and "range-narrow" not in report.checks()  # one value, no span
    [constant] = [f for f in report.findings if f.check == "constant"]
    assert "(0.5)" in constant.message
    assert "for a recurrent state" in constant.message  # zeros fed as a stream's state


def test_data_divided_by_255_twice_use_a_sliver_of_the_range(tmp_path):
    rng = np.random.default_rng(2)
    good = {"x": [rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32) for _ in range(N)]}
    fpath = builders.conv_net(tmp_path / "f.onnx")
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", good)
    report = check_data(str(qpath), {"x": [a / 255 for a in good["x"]]})
    assert report.checks() == ["range-narrow"]


def test_nan_constant_and_duplicate_samples_are_named(net, tmp_path):
    arrays = [a.copy() for a in net["data"]["x"]]
    arrays[1][0, 0, 0, 0] = np.nan
    arrays[2] = np.full_like(arrays[2], 0.5)
    arrays[9] = arrays[4].copy()
    folder = builders.save_folder({"x": arrays}, tmp_path / "bad")
    report = check_data(str(net["qdq"]), folder)
    by_check = {f.check: f for f in report.findings}
    assert set(by_check) == {"nan", "constant", "duplicate"}
    assert by_check["nan"].severity == "error" and by_check["nan"].samples == [str(folder / "x" / "1.npy")]
    assert by_check["constant"].samples == [str(folder / "x" / "2.npy")]
    assert by_check["duplicate"].samples == ["4.npy = 9.npy"]


def test_wrong_dtype_and_missing_input(net, tmp_path):
    report = check_data(str(net["qdq"]), {"x": [(a * 50 + 128).clip(0, 255).astype(np.uint8) for a in net["data"]["x"]]})
    assert "dtype" in report.checks("error")
    report = check_data(str(net["qdq"]), {"y": net["data"]["x"]})
    assert report.checks("error") == ["inputs", "inputs"]
    # one sample of another kind among the right ones stops every analysis: an error too
    mixed = list(net["data"]["x"])
    mixed[1] = (mixed[1] * 50 + 128).clip(0, 255).astype(np.uint8)
    (dtype,) = [f for f in check_data(str(net["qdq"]), {"x": mixed}).findings if f.check == "dtype"]
    assert dtype.severity == "error" and dtype.message == f"1 of {len(mixed)} samples are uint8 but the model input is float32"


def test_too_few_samples_are_a_warning(net):
    report = check_data(str(net["qdq"]), {"x": net["data"]["x"][:3]})
    assert report.checks() == ["count"] and report


def test_data_num_counts_calibration_samples_only(net):
    """The statistics cover the calibration samples checked; the held-out set is compared
    whole, as the plugin's outputs check compares it; the set's size is the folder's."""
    held = builders.samples(6, seed=8)
    whole = check_data(str(net["qdq"]), net["data"], heldout=held, float_model=str(net["float"]))
    cut = check_data(str(net["qdq"]), net["data"], heldout=held, float_model=str(net["float"]), data_num=3)
    arr = np.stack(net["data"]["x"][:3]).astype(np.float64)
    stats = cut.stats["calibration"]["x"]
    assert stats["samples"] == 3 and stats["mean"] == pytest.approx(arr.mean())
    assert cut.stats["heldout"]["x"]["samples"] == 6
    assert cut.quantized["heldout"] == whole.quantized["heldout"]
    assert cut.quantized["calibration"] != whole.quantized["calibration"]
    assert "count" not in cut.checks()  # 20 samples in the set, 3 of them checked


def test_bgr_data_against_rgb_heldout_data(rgb_net):
    bgr = {"x": [a[:, ::-1].copy() for a in rgb_net["data"]["x"]]}
    report = check_data(str(rgb_net["qdq"]), bgr, heldout=rgb_net["data"])
    assert report.checks("error") == ["colour-order"]
    f = report.errors[0]
    means = np.stack(bgr["x"]).mean(axis=(0, 1, 3, 4))
    assert f.details["channel_mean"] == pytest.approx(means.tolist())
    assert "BGR" in f.message and "::-1" in f.fix


@pytest.mark.parametrize("shift, severity", [(0.07, "info"), (0.15, "warning")])
def test_heldout_channel_means_apart_by_content_are_a_note_and_far_apart_a_warning(rgb_net, shift, severity):
    """Two real image sets made by one preprocessing differ by up to about 0.7 std with their
    content: a warning blaming the preprocessing there was false."""
    held = {"x": [a + np.array([shift, 0, 0], np.float32).reshape(1, 3, 1, 1) for a in rgb_net["data"]["x"]]}
    [f] = [f for f in check_data(str(rgb_net["qdq"]), rgb_net["data"], heldout=held).findings
           if f.check == "channel-stats"]
    cal, ref = np.stack(rgb_net["data"]["x"]), np.stack(held["x"])
    std = (cal.std(axis=(0, 1, 3, 4)) + ref.std(axis=(0, 1, 3, 4))) / 2
    by_hand = np.max(np.abs(cal.mean(axis=(0, 1, 3, 4)) - ref.mean(axis=(0, 1, 3, 4))) / std)
    assert f.details["distance"] == pytest.approx(by_hand, rel=1e-3)
    assert f.severity == severity and "or images of other content" in f.message


def test_bgr_data_against_expected_statistics(rgb_net):
    bgr = {"x": [a[:, ::-1].copy() for a in rgb_net["data"]["x"]]}
    expect = dict(expect_mean=[0.7, 0.45, 0.2], expect_std=[0.1, 0.1, 0.1])
    assert check_data(str(rgb_net["qdq"]), bgr, **expect).checks() == ["colour-order"]
    assert check_data(str(rgb_net["qdq"]), rgb_net["data"], **expect).findings == []
    # a missing normalisation shifts and scales every channel
    report = check_data(str(rgb_net["qdq"]), rgb_net["data"], expect_mean=[0, 0, 0], expect_std=[1, 1, 1])
    assert report.checks() == ["channel-stats", "channel-scale"]


def test_a_calibration_set_that_misses_the_heldout_data(net, tmp_path):
    # calibrated on low-contrast samples: ranges too narrow for real data
    dim = {"x": [a * 0.2 for a in net["data"]["x"]]}
    qpath = builders.quantize(net["float"], tmp_path / "dim.onnx", dim)
    report = check_data(str(qpath), dim, heldout=net["data"])
    assert "not-representative" in report.checks("error")
    feeds_c = [{"x": a} for a in dim["x"]]
    feeds_h = [{"x": a} for a in net["data"]["x"]]
    for dataset, feeds in (("calibration", feeds_c), ("heldout", feeds_h)):
        ref = [o["prob"] for o in builders.run_model(net["float"], feeds)]
        got = [o["prob"] for o in builders.run_model(qpath, feeds)]
        r = np.concatenate([a.ravel() for a in ref]).astype(np.float64)
        t = np.concatenate([a.ravel() for a in got]).astype(np.float64)
        # loose: a float32 difference flips a rounding of the badly clipped model here and there
        assert report.quantized[dataset]["cosine-similarity"] == pytest.approx(
            r @ t / np.sqrt((r @ r) * (t @ t)), abs=1e-4)
    assert report.quantized["calibration"]["cosine-similarity"] >= 0.99
    assert report.quantized["heldout"]["cosine-similarity"] < 0.99
    # the share of each node's float input outside its calibrated range (+- half a step), from
    # the float model exposing those inputs in a plain session
    finding = next(f for f in report.errors if f.check == "not-representative")
    clipping = finding.details["heldout_clipping"]
    model = onnx.load(str(qpath))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    acts = {name: q for name, (q, _) in builders.qdq_pairs(model).items() if q and q.input[0] not in inits}
    floats = builders.run_model(builders.rewire(qpath, outputs=[q.input[0] for q in acts.values()]), feeds_h)
    assert len(clipping) >= 2 and set(clipping) <= set(acts)
    for name, share in clipping.items():
        q = acts[name]
        scale, zp = float(inits[q.input[1]]), float(inits[q.input[2]])
        info = np.iinfo(inits[q.input[2]].dtype)
        v = np.concatenate([f[q.input[0]].ravel() for f in floats])
        out = (v < scale * (info.min - zp) - scale / 2) | (v > scale * (info.max - zp) + scale / 2)
        assert share == pytest.approx(out.mean(), abs=1e-6), name
    # the same comparison with a held-out set drawn like the calibration set passes
    fine = check_data(str(net["qdq"]), net["data"], heldout=builders.samples(N, seed=8))
    assert fine.checks("error") == [] and fine.quantized["heldout"]["cosine-similarity"] >= 0.99


def test_heldout_preprocessed_differently_is_not_blamed_on_representativeness(net):
    rng = np.random.default_rng(4)
    pixels = {"x": [rng.integers(0, 256, (1, 3, 16, 16)).astype(np.float32) for _ in range(N)]}
    report = check_data(str(net["qdq"]), net["data"], heldout=pixels)
    assert "preprocessing-differs" in report.checks("error")
    assert "not-representative" not in report.checks()
    assert "heldout-skipped" in report.checks("info")


def test_a_float_model_gets_the_data_checks_only(net, tmp_path):
    folder = builders.save_folder({"x": [a.transpose(0, 2, 3, 1) for a in net["data"]["x"]]}, tmp_path / "f")
    report = check_data(str(net["float"]), folder)
    assert report.checks("error") == ["layout"] and "no-qdq" in report.checks("info")


def test_cli_check_data(net, tmp_path, capsys):
    good = builders.save_folder(net["data"], tmp_path / "good")
    # the same samples in another order: held-out data drawn like the calibration data
    alike = builders.save_folder({"x": net["data"]["x"][::-1]}, tmp_path / "alike")
    nhwc = builders.save_folder({"x": [a.transpose(0, 2, 3, 1) for a in net["data"]["x"]]}, tmp_path / "nhwc")
    assert main(["check-data", str(net["qdq"]), str(good), "--heldout", str(alike), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no problem found" in out and "fully quantized on the held-out data" in out
    assert main(["check-data", str(net["qdq"]), str(nhwc), "--json", str(tmp_path / "r.json"), "--quiet"]) == 1
    assert "ERROR   layout" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["findings"][0]["check"] == "layout"
    assert main(["check-data", str(net["qdq"]), str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["check-data", "-h"])
    assert exc.value.code == 0
    assert "--heldout" in capsys.readouterr().out


def test_heldout_gap_in_the_output_metric_is_flagged(net, tmp_path):
    """Both sets miss the threshold, but the held-out data lose far more: that gap is the
    calibration set's, not only the model's (0.941 vs 0.866 on the example detector)."""
    shifted = {"x": [a * 3.0 for a in net["data"]["x"]]}  # values past the calibrated ranges
    report = check_data(net["qdq"], net["data"], heldout=shifted, threshold=1.0, progress=False)
    cal, held = report.quantized["calibration"]["cosine-similarity"], report.quantized["heldout"]["cosine-similarity"]
    assert (1 - held) >= 1.5 * (1 - cal)
    [gap] = [f for f in report.findings if f.check == "heldout-gap"]
    assert gap.severity == "warning" and f"{cal:.6g}" in gap.message and f"{held:.6g}" in gap.message
    assert "does not represent the held-out data" in gap.message and "--heldout" in gap.fix
    # the same samples on both sides, in another order: comparable losses, no gap
    same = check_data(net["qdq"], net["data"], heldout={"x": net["data"]["x"][::-1]}, threshold=1.0, progress=False)
    assert "heldout-gap" not in same.checks() and "heldout-worse" in same.checks()


def test_the_progress_of_a_held_out_check_ends_at_its_total(net, monkeypatch):
    """It counted every sample of the held-out comparison twice and ended at 272/408; the
    comparison (a model run a sample) has a bar of its own, its time left not read from the
    statistics' far cheaper steps."""
    import pytest_ptq.datacheck as datacheck
    from pytest_ptq.progress import Progress

    ended = []

    class Recorded(Progress):
        def __exit__(self, *exc):
            ended.append((self.done, self.total))
            return super().__exit__(*exc)

    monkeypatch.setattr(datacheck, "Progress", Recorded)
    check_data(net["qdq"], net["data"], heldout={"x": net["data"]["x"][::-1]}, threshold=1.0, progress=False)
    assert ended == [(2 * len(net["data"]["x"]),) * 2] * 2


def test_the_heldout_comparison_says_when_its_metric_cannot_see_an_output(tmp_path):
    fpath = builders.offset_net(tmp_path / "f.onnx", offset=300.0)
    data = builders.samples(4, size=8)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    held = builders.samples(4, size=8, seed=9)
    cos = check_data(str(qpath), data, heldout=held, float_model=str(fpath))
    blind = [f for f in cos.findings if f.check == "metric-blind"]
    assert len(blind) == 1 and blind[0].severity == "warning" and "'depth'" in blind[0].message
    corr = check_data(str(qpath), data, heldout=held, float_model=str(fpath), metric="correlation")
    assert not [f for f in corr.findings if f.check == "metric-blind"]


def test_a_channel_constant_on_both_sides_has_no_scale_to_compare(rgb_net):
    # a recurrent state fed as zeros: constant in the calibration and the held-out data alike
    zeroed = {"x": [a.copy() for a in rgb_net["data"]["x"]]}
    for a in zeroed["x"]:
        a[:, 0] = 0
    assert "channel-scale" not in check_data(str(rgb_net["qdq"]), zeroed, heldout={"x": zeroed["x"][::-1]}).checks()
    # constant on one side only is a scale that differs
    assert "channel-scale" in check_data(str(rgb_net["qdq"]), zeroed, heldout=rgb_net["data"]).checks()


def test_the_heldout_comparison_needs_a_float_reference_where_a_relu_was_folded(tmp_path):
    """quantize_static deletes the Relu after a Conv into the pair's range; without the float
    model the graph with every pair bypassed lacks it, and the comparison read cosine 0.55
    where the model keeps 0.9999: it is skipped with the evidence, and with the float model it
    equals plain onnxruntime sessions of the two files."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((0.3 * rng.standard_normal((8, 3, 3, 3))).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((0.3 * rng.standard_normal((4, 8, 3, 3))).astype(np.float32), "w2")
    b1 = numpy_helper.from_array(np.full(8, -0.5, np.float32), "b1")  # the Relu zeroes most values
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
         onnx.helper.make_node("Relu", ["c1"], ["r1"]), onnx.helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1] * 4)],
        "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8, 8])], [w1, w2, b1])
    fpath = tmp_path / "f.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8), fpath)
    cal, held = builders.samples(N, size=8, seed=1), builders.samples(6, size=8, seed=2)
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", cal, keep_float=False)
    assert "Relu" not in {n.op_type for n in onnx.load(str(qpath)).graph.node}

    blind = check_data(str(qpath), cal, heldout=held)
    [skipped] = [f for f in blind.findings if f.check == "heldout-skipped"]
    assert skipped.severity == "warning" and blind.quantized is None
    assert "r1_QuantizeLinear" in skipped.message and "float" in skipped.message

    seen = check_data(str(qpath), cal, heldout=held, float_model=str(fpath))
    assert "heldout-skipped" not in seen.checks()
    for name, data in (("calibration", cal), ("heldout", held)):
        feeds = [{"x": a} for a in data["x"]]
        expected = builders.worst_cosine(builders.run_model(fpath, feeds), builders.run_model(qpath, feeds))
        assert seen.quantized[name]["cosine-similarity"] == pytest.approx(expected, abs=1e-4), name


def test_one_expected_number_stands_for_every_channel_and_a_wrong_count_says_so(rgb_net):
    # one number for every channel: the missing normalisation found as with three equal ones
    one = check_data(str(rgb_net["qdq"]), rgb_net["data"], expect_mean=0, expect_std=1)
    three = check_data(str(rgb_net["qdq"]), rgb_net["data"], expect_mean=[0, 0, 0], expect_std=[1, 1, 1])
    assert one.checks() == three.checks() == ["channel-stats", "channel-scale"]
    assert [f.details for f in one.findings] == [f.details for f in three.findings]
    # counts that match no channel axis: one warning each, never a broadcasting traceback
    for bad in (dict(expect_mean=[0, 0, 0], expect_std=[1, 1]), dict(expect_std=[1, 1])):
        [f] = check_data(str(rgb_net["qdq"]), rgb_net["data"], **bad).findings
        assert f.check == "channel-stats" and "3 data channels but 2 expected channel standard deviations" in f.message


def test_a_heldout_gap_within_the_calibrated_ranges_is_not_blamed_on_the_calibration_set(tmp_path):
    """YOLOv8n's held-out images read 0 fully quantized against 0.74 on calibration, and
    check-data said to calibrate on held-out-like samples; their values lay within the
    calibrated ranges, and a calibration on the held-out images themselves read 0 too."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    graph = onnx.helper.make_graph(  # a conv's map, as a detector's scores: its step set by the calibration
        [onnx.helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")], "conv",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 16, 16])], [w])
    fpath = builders.save_model(graph, tmp_path / "float.onnx")
    data = {"x": [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(N)]}
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data)
    dim = {"x": [a * 0.01 for a in data["x"]]}  # inside every range, on a few of its codes
    report = check_data(qpath, data, heldout=dim, progress=False)
    cal, held = report.quantized["calibration"]["cosine-similarity"], report.quantized["heldout"]["cosine-similarity"]
    assert cal > 0.99 > 0.9 > held
    [finding] = [f for f in report.findings if f.check == "not-representative"]
    assert not finding.details["heldout_clipping"]
    assert "does not represent" not in finding.message and "stay within the calibrated ranges" in finding.message
    assert "runall --heldout" in finding.fix and "calibrate on" not in finding.fix


def test_samples_of_other_lengths_saved_without_their_batch_axis_are_a_note(tmp_path):
    """Token sequences of 7 and 12, each saved without its batch axis, which every analysis
    reads with one: check-data called them an error of different shapes."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "seq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 4])],
                              [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")
    samples = [rng.standard_normal((1, n, 4)).astype(np.float32) for n in (7, 12, 7, 12)]
    builders.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", {"x": samples})
    report = check_data(tmp_path / "q.onnx", {"x": [x[0] for x in samples]})  # [7, 4], [12, 4]
    shape = [f for f in report.findings if f.check == "shape"]
    assert [f.severity for f in shape] == ["info"] and "axis 1: 7-12" in shape[0].message, shape


def test_a_float_attention_mask_without_padding_is_no_blank_input(tmp_path):
    """A float 0/1 mask is all ones in a sequence without padding: check-data told those
    samples blank inputs to replace (an integer mask was already let be)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph([helper.make_node("Mul", ["x", "mask"], ["m"], name="masked"),
                               helper.make_node("MatMul", ["m", "w"], ["y"], name="mm")], "masked",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4]),
                               helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 8, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4])],
                              [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")
    masks = [np.ones((1, 8, 1), np.float32) for _ in range(4)]
    masks[1][0, 5:] = 0  # one padded sequence
    data = {"x": [rng.standard_normal((1, 8, 4)).astype(np.float32) for _ in range(4)], "mask": masks}
    builders.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", data)
    assert not [f for f in check_data(tmp_path / "q.onnx", data).findings if f.check == "constant"]
    # a blank input among real ones is still one
    blank = dict(data, x=[*data["x"][:3], np.zeros((1, 8, 4), np.float32)])
    assert [f.input for f in check_data(tmp_path / "q.onnx", blank).findings if f.check == "constant"] == ["x"]


def test_blank_images_of_zeros_and_ones_are_still_told(net):
    """Images hold 0/1 too where they are blank: the mask exemption hid a set of white images."""
    white = [np.ones((1, 3, 16, 16), np.float32) for _ in range(4)]
    white[2] = np.zeros((1, 3, 16, 16), np.float32)
    told = [f for f in check_data(str(net["qdq"]), {"x": white}).findings if f.check == "constant"]
    assert [f.severity for f in told] == ["info"] and "wrong for an image" in told[0].message, told


def _sequence_model(tmp_path, rng, dim=16):
    """y = Relu(x @ w) over ``x [N, T, dim]``, T open."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                               helper.make_node("Relu", ["h"], ["y"], name="relu")], "seq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", dim])],
                              [numpy_helper.from_array((rng.standard_normal((dim, dim)) / 4).astype(np.float32),
                                                       "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")
    return tmp_path / "f.onnx"


def test_sequences_of_varying_length_have_no_channel_statistics(tmp_path):
    """Over [N, T, 16] with T open, the "channel means" were the per-token means of the
    first sample alone, and two sets drawn alike read "a different scale (std / scale_value)
    in the preprocessing" or "25 data channels but 6 held-out channel means", which failed
    ptq.assert_data at its default severity."""
    rng = np.random.default_rng(0)

    def draw(first):
        return {"x": [rng.standard_normal((1, int(t), 16)).astype(np.float32)
                      for t in [first, *rng.integers(4, 40, N - 1)]]}

    cal, held = draw(25), draw(25)  # first samples of one length: their per-token means compared
    qpath = builders.quantize(_sequence_model(tmp_path, rng), tmp_path / "q.onnx", cal)
    report = check_data(str(qpath), cal, heldout=held)
    assert not {"channel-stats", "channel-scale"} & set(report.checks()), report.text()
    assert [s["x"]["channel_mean"] for s in report.stats.values()] == [None, None]
    # the same model fed one length throughout: T is still no channel axis
    fixed = {"x": [rng.standard_normal((1, 25, 16)).astype(np.float32) for _ in range(N)]}
    assert check_data(str(qpath), fixed).stats["calibration"]["x"]["channel_mean"] is None


@pytest.mark.parametrize("odd", [0, 7])
def test_a_sample_of_another_shape_is_named_wherever_it_lies(net, tmp_path, odd):
    """One photo not resized among 20: check-data named no file, and where it came first
    said "samples are [1, 3, 16, 20] but the model expects ..." as if every sample were."""
    arrays = [a.copy() for a in net["data"]["x"]]
    arrays[odd] = np.concatenate([arrays[odd], arrays[odd][..., :4]], axis=3)
    folder = builders.save_folder({"x": arrays}, tmp_path / f"calib{odd}")
    report = check_data(str(net["qdq"]), str(folder))
    [shape] = [f for f in report.findings if f.check in ("shape", "layout")]
    assert (shape.check, shape.severity) == ("shape", "error")
    assert shape.message.startswith(f"1 of {N} samples are [1, 3, 16, 20] but the model expects [1, 3, 16, 16]")
    assert shape.samples == [str(folder / "x" / f"{odd}.npy")]
    assert f"        samples: {folder / 'x' / f'{odd}.npy'}" in report.text().splitlines()


def test_the_table_shows_every_axis_span_and_all_zero_data_are_constant_not_scaled_down(tmp_path, capsys):
    """Images of 8..32 x 16..40 read "1,3,8..32 +1 more" in check-data's table (cut as a
    list of names); all-zero float samples were taken for a mask and blamed on data
    "divided by 255 twice"."""
    rng = np.random.default_rng(1)
    fpath = builders.conv_net(tmp_path / "f.onnx")
    model = onnx.load(str(fpath))
    for d in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.dim_param = "side"
    for d in model.graph.output[0].type.tensor_type.shape.dim[2:]:
        d.dim_param = "side_out"
    onnx.save(model, str(fpath))
    data = {"x": [rng.standard_normal((1, 3, h, w)).astype(np.float32) for h, w in ((8, 16), (32, 40), (16, 24))]}
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data)
    assert main(["check-data", str(qpath), str(builders.save_folder(data, tmp_path / "d"))]) in (0, 1)
    assert "| 1,3,8..32,16..40 |" in capsys.readouterr().out

    zeros = {"x": [np.zeros((1, 8), np.float32) for _ in range(N)]}
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "flat",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                              [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    qpath = builders.quantize(tmp_path / "m.onnx", tmp_path / "mq.onnx", zeros)
    report = check_data(str(qpath), zeros)
    assert "range-narrow" not in report.checks()
    assert [f.check for f in report.findings if f.input == "x"] == ["constant"]


def test_floors_of_some_outputs_judge_the_held_out_comparison_on_those(net, tmp_path):
    """A contract flooring one output (r2) had its data check hold the worst of every output,
    prob among them, to r2's floor: it failed where the outputs item passed."""
    from pytest_ptq.analysis import Analysis, AnalysisKey
    from pytest_ptq.checks import check_data as check_data_of

    fpath = builders.conv_net(tmp_path / "float2.onnx", two_outputs=True)
    dim = {"x": [a * 0.2 for a in net["data"]["x"]]}
    qpath = builders.quantize(fpath, tmp_path / "dim2.onnx", dim)
    feeds = [{"x": a} for a in net["data"]["x"]]
    ref, got = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    held = {o: builders.pooled_cosine([r[o] for r in ref], [g[o] for g in got]) for o in ("prob", "r2")}
    assert held["prob"] < held["r2"]
    report = check_data(str(qpath), dim, heldout=net["data"], threshold=0.5, outputs=["r2"], progress=False)
    assert report.quantized["heldout"]["cosine-similarity"] == pytest.approx(held["r2"], abs=1e-4)
    builders.save_folder(dim, tmp_path / "dim")
    builders.save_folder(net["data"], tmp_path / "held")
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "dim")), tmp_path)
    floor = round((held["prob"] + held["r2"]) / 2, 4)  # r2 meets it, prob does not
    for floors, passed in (({"r2": floor}, True), ({"default": floor}, False)):
        result = check_data_of(analysis, "error", tmp_path / "held", floors, threshold_from="the floor")
        assert result.passed is passed, (floors, result.findings)

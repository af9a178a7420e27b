"""Distributions and per-channel box plots: the numbers behind the plots against numpy
computed from plain onnxruntime sessions on the float and calibrated models."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import builders
from pytest_ptq import channelwise, cli, distribution, figures
from pytest_ptq.distribution import get_channelwise_data_distribution, plot_distribution, readings
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    data = builders.samples(4)
    fp = builders.conv_net(root / "float.onnx", outlier_channel=3)
    q = builders.quantize(fp, root / "q.onnx", data)
    # weights stored quantized (lone DequantizeLinear), Relu kept so bypassing stays float
    qd = builders.quantize(fp, root / "qd.onnx", data, extra_options={"AddQDQPairToWeight": False})
    folder = builders.save_folder(data, root / "calibration_data")
    # with the float model the int32 bias DQs bypass too, so "float" is exactly float.onnx
    return {"root": root, "data": data, "float": fp, "q": q, "qd": qd, "folder": folder,
            "engine": Engine(q, data, float_model=fp)}


def _counts_close(counts, want, moved=2):
    """Histogram counts equal but for ``moved`` values: the engine's session optimises (a
    fused convolution rounds in the last bit), the plain one does not, so a value on a bin
    edge may cross it, or leave the range whose ends the engine's values set."""
    return np.abs(np.asarray(counts) - np.asarray(want)).sum() <= 2 * moved


def _run_plain(path, data, tensors):
    """Run a model with extra intermediate outputs in a plain session, no optimisation."""
    model = onnx.load(str(path))
    have = {o.name for o in model.graph.output}
    for t in tensors:
        if t not in have:
            model.graph.output.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    n = len(next(iter(data.values())))
    outs = {t: [] for t in tensors}
    for i in range(n):
        vals = sess.run(tensors, {k: v[i] for k, v in data.items()})
        for t, v in zip(tensors, vals):
            outs[t].append(v)
    return {t: np.concatenate(v, axis=0) for t, v in outs.items()}


def _qparams(path, q_name):
    """(scale, zero point, qmin, qmax) of a QuantizeLinear read straight from the file."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.name == q_name)
    zp = inits[node.input[2]]
    info = np.iinfo(zp.dtype)
    return inits[node.input[1]].astype(np.float64), zp.astype(np.float64), info.min, info.max


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def _tukey(values):
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    iqr = q3 - q1
    return (q1, med, q3, values[values >= q1 - 1.5 * iqr].min(), values[values <= q3 + 1.5 * iqr].max())


# -- activation histograms -------------------------------------------------------------------
def test_activation_histogram_threshold_and_clipping(models, tmp_path):
    res = plot_distribution(tmp_path, models["engine"], nodes_list=["c2_QuantizeLinear"])
    d = res["c2_QuantizeLinear"]
    x = _run_plain(models["float"], models["data"], ["c2"])["c2"]
    scale, zp, qmin, qmax = _qparams(models["q"], "c2_QuantizeLinear")
    lo, hi = scale * (qmin - zp), scale * (qmax - zp)
    assert d["kind"] == "activation" and d["bit"] == 8 and d["samples"] == 4
    assert d["count"] == x.size
    assert d["max_abs"] == pytest.approx(float(np.abs(x).max()), rel=1e-6)
    assert d["threshold"] == pytest.approx(max(hi, -lo), rel=1e-6)
    assert (d["range_lo"], d["range_hi"]) == (pytest.approx(lo, rel=1e-6), pytest.approx(hi, rel=1e-6))
    edges = np.asarray(d["hist"]["edges"])
    assert len(edges) == distribution.HIST_BINS + 1
    assert edges[0] == pytest.approx(x.min()) and edges[-1] == pytest.approx(x.max())
    assert _counts_close(d["hist"]["counts"], np.histogram(x, bins=edges)[0])
    # clipped: beyond the range by more than half a step (the error exceeds rounding)
    clipped = np.count_nonzero((x < lo - scale / 2) | (x > hi + scale / 2))
    assert d["clipped_count"] == clipped
    assert d["clipped_share"] == pytest.approx(clipped / x.size)
    assert _is_png(d["png"])
    json.dumps(res, allow_nan=False)


def test_model_input_taken_from_the_samples(models, tmp_path):
    d = plot_distribution(tmp_path, models["engine"], nodes_list="x_QuantizeLinear")["x_QuantizeLinear"]
    x = np.concatenate(models["data"]["x"])
    assert d["tensor"] == "x"
    assert d["hist"]["counts"] == np.histogram(x, bins=np.asarray(d["hist"]["edges"]))[0].tolist()
    assert d["mean"] == pytest.approx(float(x.astype(np.float64).mean()), abs=1e-9)
    assert d["std"] == pytest.approx(float(x.astype(np.float64).std()), rel=1e-6)


def test_clipping_below_zero_before_relu_is_marked_harmless(models, tmp_path):
    # onnxruntime gives a Conv followed by Relu the Relu's [0, max] range
    d = plot_distribution(tmp_path, models["engine"], nodes_list=["c1_QuantizeLinear"])["c1_QuantizeLinear"]
    x = _run_plain(models["float"], models["data"], ["c1"])["c1"]
    assert d["relu_follows"] and d["range_lo"] == 0.0
    half = d["scale"] / 2
    assert d["clipped_low"] == np.count_nonzero(x < -half) > 0
    assert d["effective_clipped_share"] == pytest.approx(np.count_nonzero(x > d["range_hi"] + half) / x.size)
    assert "harmless" in distribution.activation_reading(d)
    # the CLI's table gives the share that matters too, not what the Relu zeroes anyway
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["plot-distribution", str(models["q"]), str(models["folder"]), "--float-model", str(models["float"]),
                     "-n", "c1_QuantizeLinear", "-s", str(tmp_path / "cli"), "--quiet"]) == 0
    [row] = [line for line in out.getvalue().splitlines() if line.startswith("| c1_QuantizeLinear")]
    clipped = float(row.split("|")[6])
    assert clipped == pytest.approx(100 * d["effective_clipped_share"], abs=1e-4)
    assert 100 * d["clipped_share"] > clipped + 1


def test_a_relu_the_quantizer_deleted_is_applied_again(models, tmp_path):
    # onnxruntime's defaults delete the Relu after c1 and quantize c1 on the Relu's range: what
    # the pair reads in the float model is the Relu's output, and nothing of it is clipped
    root = models["root"]
    qf = builders.quantize(models["float"], root / "q_folded.onnx", models["data"], keep_float=False)
    engine = Engine(qf, models["data"], float_model=models["float"])
    pair = next(c for c in engine.qmodel.of_kind("activation") if c.folded is not None)
    d = plot_distribution(tmp_path, engine, nodes_list=[pair.name])[pair.name]
    # the pair reads the tensor the deleted Relu wrote, now the Conv's output
    relu = next(n for n in onnx.load(str(models["float"])).graph.node
                if n.op_type == "Relu" and pair.input in (*n.input, *n.output))
    x = _run_plain(models["float"], models["data"], [relu.output[0]])[relu.output[0]]
    assert d["count"] == x.size and d["min"] == 0.0
    assert d["max_abs"] == pytest.approx(float(x.max()), rel=1e-6)
    assert _counts_close(d["hist"]["counts"], np.histogram(x, bins=np.asarray(d["hist"]["edges"]))[0])
    half = d["scale"] / 2
    assert d["clipped_count"] == np.count_nonzero(x > d["range_hi"] + half)
    assert "recalibrate" not in readings.advise(d)[0]
    box = get_channelwise_data_distribution(tmp_path / "box", engine, nodes_list=[pair.name])[pair.name]
    per = np.moveaxis(x, 1, 0).reshape(box["channels"], -1)
    assert box["min"] == pytest.approx(per.min(1).tolist()) and min(box["min"]) == 0.0
    assert box["median"] == pytest.approx(np.median(per, 1).tolist(), abs=1e-5)


def test_second_pass_when_the_cache_is_full(models, tmp_path, monkeypatch):
    monkeypatch.setattr(distribution.gather, "CACHE_BYTES", 0)
    d = plot_distribution(tmp_path, models["engine"], nodes_list=["r1_QuantizeLinear"])["r1_QuantizeLinear"]
    x = _run_plain(models["float"], models["data"], ["r1"])["r1"]
    assert d["hist"]["counts"] == np.histogram(x, bins=np.asarray(d["hist"]["edges"]))[0].tolist()


def test_bulk_range_is_within_a_bin_of_the_quantiles(models, tmp_path):
    d = plot_distribution(tmp_path, models["engine"], nodes_list=["c2_QuantizeLinear"])["c2_QuantizeLinear"]
    x = _run_plain(models["float"], models["data"], ["c2"])["c2"].ravel()
    width = d["hist"]["edges"][1] - d["hist"]["edges"][0]
    assert abs(d["bulk_lo"] - np.quantile(x, distribution.BULK_TAIL)) <= width
    assert abs(d["bulk_hi"] - np.quantile(x, 1 - distribution.BULK_TAIL)) <= width
    assert d["bulk_levels"] == pytest.approx((d["bulk_hi"] - d["bulk_lo"]) / d["scale"])


def test_input_of_a_pair_chained_behind_another(models, tmp_path):
    # a second Q/DQ pair reading the first pair's output: its input is no node's output
    model = onnx.load(str(models["q"]))
    nodes = []
    for n in model.graph.node:
        if n.name == "conv2":
            n.input[0] = "rq_dq"
        nodes.append(n)
        if n.name == "r1_DequantizeLinear":
            nodes += [helper.make_node("QuantizeLinear", ["r1_DequantizeLinear_Output", "r1_scale", "r1_zero_point"],
                                       ["rq"], name="requant_Q"),
                      helper.make_node("DequantizeLinear", ["rq", "r1_scale", "r1_zero_point"], ["rq_dq"],
                                       name="requant_DQ")]
    copies = []
    for n in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        copies.append(c)
    del model.graph.node[:]
    model.graph.node.extend(copies)
    d = plot_distribution(tmp_path, model, models["data"], ["requant_Q"], float_model=models["float"])["requant_Q"]
    x = _run_plain(models["float"], models["data"], ["r1"])["r1"]
    assert d["tensor"] == "r1_DequantizeLinear_Output"
    assert d["max_abs"] == pytest.approx(float(np.abs(x).max()), rel=1e-6)
    assert d["hist"]["counts"] == np.histogram(x, bins=np.asarray(d["hist"]["edges"]))[0].tolist()


# -- weights ----------------------------------------------------------------------------------
def test_weight_float_vs_dequantized(models, tmp_path):
    d = plot_distribution(tmp_path, models["engine"], nodes_list=["w1_QuantizeLinear"])["w1_QuantizeLinear"]
    w = numpy_helper.to_array(next(i for i in onnx.load(str(models["float"])).graph.initializer if i.name == "w1"))
    scale, zp, qmin, qmax = _qparams(models["q"], "w1_QuantizeLinear")
    s32, zp32 = np.float32(scale), np.float32(zp)  # QuantizeLinear computes in float32
    deq = (np.clip(np.rint(w / s32) + zp32, qmin, qmax) - zp32) * s32
    err = deq.astype(np.float64) - w
    assert d["compared_against"] == "float weight"
    assert d["hist"]["counts"] == np.histogram(w, bins=np.asarray(d["hist"]["edges"]))[0].tolist()
    assert d["dequantized"]["hist"]["counts"] == np.histogram(deq, bins=np.asarray(d["hist"]["edges"]))[0].tolist()
    assert d["error"]["max_abs"] == pytest.approx(np.abs(err).max(), rel=1e-4)
    assert d["error"]["max_abs"] <= scale / 2 * 1.0001
    per_channel = 10 * np.log10((w.reshape(8, -1) ** 2).sum(1) / (err.reshape(8, -1) ** 2).sum(1))
    assert d["worst_channel"] == int(np.argmin(per_channel))
    assert d["worst_channel_sqnr"] == pytest.approx(per_channel.min(), abs=0.05)
    # the per-tensor scale is set by the planted wide channel: the others starve
    assert d["worst_channel"] != 3 and d["worst_channel_sqnr"] < distribution.WEAK_SQNR_DB
    assert "per-channel" in distribution.weight_reading(d)


def test_lone_dq_weight_without_float_model_says_so(models, tmp_path):
    res = plot_distribution(tmp_path, models["qd"], models["data"], ["w1_DequantizeLinear"])
    d = res["w1_DequantizeLinear"]
    assert d["compared_against"] == "dequantized weight"
    assert "dequantized weight" in d["note"]
    assert d["error"]["max_abs"] == 0.0
    assert _is_png(d["png"])


def test_lone_dq_weight_with_float_model_compares_float(models, tmp_path):
    res = plot_distribution(tmp_path, models["qd"], models["data"], ["w1_DequantizeLinear"],
                            float_model=models["float"])
    d = res["w1_DequantizeLinear"]
    w = numpy_helper.to_array(next(i for i in onnx.load(str(models["float"])).graph.initializer if i.name == "w1"))
    assert d["compared_against"] == "float weight" and "note" not in d
    assert d["max_abs"] == pytest.approx(float(np.abs(w).max()))
    assert 0 < d["error"]["max_abs"] <= d["scale"] / 2 * 1.0001


# -- normal nodes -----------------------------------------------------------------------------
def test_normal_node_float_vs_fully_quantized(models, tmp_path):
    d = plot_distribution(tmp_path, models["engine"], nodes_list=["conv2"])["conv2"]
    f = _run_plain(models["float"], models["data"], ["c2"])["c2"]
    q = _run_plain(models["q"], models["data"], ["c2"])["c2"]
    edges = np.asarray(d["float"]["hist"]["edges"])
    assert d["tensor"] == "c2" and d["kind"] == "node"
    assert edges[0] == pytest.approx(min(f.min(), q.min()), rel=1e-5)
    assert _counts_close(d["float"]["hist"]["counts"], np.histogram(f, bins=edges)[0])
    assert _counts_close(d["quantized"]["hist"]["counts"], np.histogram(q, bins=edges)[0])
    e = q.astype(np.float64) - f
    cos = float((f.ravel() @ q.ravel()) / np.sqrt((f.ravel() @ f.ravel()) * (q.ravel() @ q.ravel())))
    assert d["cosine-similarity"] == pytest.approx(cos, abs=1e-6)
    assert d["error"]["max_abs"] == pytest.approx(np.abs(e).max(), rel=1e-3)
    assert d["rmse"] == pytest.approx(np.sqrt((e ** 2).mean()), rel=1e-3)


# -- box plots --------------------------------------------------------------------------------
def test_box_statistics_per_channel_and_outlier_channel(models, tmp_path):
    res = get_channelwise_data_distribution(tmp_path, models["engine"], nodes_list=["r1_QuantizeLinear"])
    d = res["r1_QuantizeLinear"]
    x = _run_plain(models["float"], models["data"], ["r1"])["r1"]
    per = np.moveaxis(x, 1, 0).reshape(8, -1).astype(np.float64)
    assert d["axis"] == 1 and d["channels"] == 8 and d["exact_quartiles"]
    for k in range(8):
        q1, med, q3, wlo, whi = _tukey(per[k])
        assert d["q1"][k] == pytest.approx(q1, abs=1e-5)
        assert d["median"][k] == pytest.approx(med, abs=1e-5)
        assert d["q3"][k] == pytest.approx(q3, abs=1e-5)
        assert d["whisker_lo"][k] == pytest.approx(wlo, abs=1e-5)
        assert d["whisker_hi"][k] == pytest.approx(whi, abs=1e-5)
        assert d["mean"][k] == pytest.approx(per[k].mean(), rel=1e-6, abs=1e-6)
        assert d["min"][k] == pytest.approx(per[k].min()) and d["max"][k] == pytest.approx(per[k].max())
    ref = np.median(np.abs(per).max(1)[np.abs(per).max(1) > 0])
    expected = [k for k in np.argsort(-np.abs(per).max(1)) if np.abs(per[k]).max() > channelwise.OUTLIER_K * ref]
    assert d["outlier_channels"] == expected == [3]
    assert d["outlier_ratios"][0] == pytest.approx(np.abs(per[3]).max() / ref, rel=1e-5)
    assert _is_png(d["png"])
    json.dumps(res, allow_nan=False)


def test_explicit_axis_and_weight_axis(models, tmp_path):
    res = get_channelwise_data_distribution(tmp_path, models["engine"],
                                            nodes_list=["c2_QuantizeLinear"], axis=-1)
    d = res["c2_QuantizeLinear"]
    x = _run_plain(models["float"], models["data"], ["c2"])["c2"]
    per = np.moveaxis(x, 3, 0).reshape(16, -1)
    assert d["axis"] == 3 and d["channels"] == 16
    assert d["median"] == pytest.approx(np.median(per, axis=1).tolist(), abs=1e-5)
    w = get_channelwise_data_distribution(tmp_path, models["engine"], nodes_list=["w1_QuantizeLinear"])
    assert w["w1_QuantizeLinear"]["axis"] == 0 and w["w1_QuantizeLinear"]["outlier_channels"] == [3]
    assert "per-channel weights" in channelwise.reading(w["w1_QuantizeLinear"])
    # a channel 2^12 times the median's costs the median channel all of an 8-bit grid, no more
    huge = dict(w["w1_QuantizeLinear"], outlier_ratios=[4096.0] + w["w1_QuantizeLinear"]["outlier_ratios"][1:])
    assert huge["bit"] == 8 and "costs the median channel all 8 bits: it rounds to 0" in channelwise.reading(huge)
    assert channelwise.lost_bits(4096.0, 16) == 12.0
    # a constant tensor, and a channel all 0, are said
    flat = dict(w["w1_QuantizeLinear"], outlier_channels=[], outlier_ratios=[], min=[2.5] * 3, max=[2.5] * 3,
                max_abs=[2.5] * 3, channels=3)
    assert channelwise.reading(flat).startswith("every channel holds a single value (a constant tensor)")
    # channels of different values no sample moves: not a constant tensor (its histogram said
    # its values crowd a few codes, and the box plot called it constant)
    fixed = dict(flat, min=[2.5, -1.0, 0.5], max=[2.5, -1.0, 0.5], max_abs=[2.5, 1.0, 0.5])
    assert "constant" not in channelwise.reading(fixed)
    assert channelwise.reading(fixed).startswith("every channel holds one value, the same on every sample")
    dead = dict(flat, min=[-1.0, 0.0, -2.0], max=[1.0, 0.0, 2.0], max_abs=[1.0, 0.0, 2.0], median_channel_max_abs=1.0)
    assert channelwise.reading(dead).endswith("; channel 1 is all 0")
    # a weight its operator cannot split by channel (a Mul's): the reading says what it can take
    unsplit = dict(w["w1_QuantizeLinear"], takes_per_channel=False)
    assert "-> int16 weights (its operator takes no per-channel scale)" in channelwise.reading(unsplit)


@pytest.mark.parametrize("channels", [8, 300])  # boxes alone; an overview band above the widest boxes
def test_each_channels_range_is_drawn_apart_from_its_median(tmp_path, monkeypatch, channels):
    """A per-channel range was a short red dash, the median's look, under a legend showing a
    dotted line; the overview drew one pair of lines at the widest range as "the" range."""
    from matplotlib.lines import Line2D

    data = builders.samples(2)
    fpath = builders.conv_net(tmp_path / "f.onnx", channels=channels, outlier_channel=3)
    engine = Engine(str(builders.quantize(fpath, tmp_path / "q.onnx", data, per_channel=True)), data)
    saved = []
    monkeypatch.setattr(channelwise, "save_figure", lambda fig, path, tight=True: saved.append(fig) or path)
    get_channelwise_data_distribution(tmp_path / "out", engine, nodes_list=["w1_QuantizeLinear"])
    fig = saved[0]
    red = [c for ax in fig.axes for c in ax.collections if len(c.get_facecolor()) and c.get_offsets().size
           and np.allclose(c.get_facecolor()[0][:3], (0xc0 / 255, 0x39 / 255, 0x2b / 255))]
    assert red and all(len(c.get_offsets()) == min(channels, 48) for c in red[-2:])  # a mark per box drawn
    legend = {t.get_text() for lg in fig.legends for t in lg.get_texts()}
    assert "each channel's quantization range" in legend and "quantization range" not in legend
    if channels > 48:
        band = fig.axes[0]
        steps = [ln for ln in band.get_lines() if ln.get_linestyle() == ":" and len(ln.get_xdata()) == channels]
        assert len(steps) == 2 and "each channel's quantization range dotted" in band.get_title()
        assert not [ln for ln in band.get_lines() if isinstance(ln, Line2D) and len(ln.get_xdata()) == 2
                    and ln.get_linestyle() == ":"]  # no single pair of lines across all channels


def test_axis_inference_rules(models):
    qm = models["engine"].qmodel
    c = qm.calibration
    assert channelwise.channel_axis(qm, c["logits_QuantizeLinear"], (1, 10)) == 1
    assert channelwise.channel_axis(qm, c["r1_QuantizeLinear"], (1, 8, 16, 16)) == 1
    assert channelwise.channel_axis(qm, c["wf_QuantizeLinear"], (10, 8)) == 0  # Gemm transB=1
    with pytest.raises(PTQError, match="no channel axis"):
        channelwise.channel_axis(qm, c["p_QuantizeLinear"], (8,))
    with pytest.raises(PTQError, match="out of range"):
        channelwise.channel_axis(qm, c["r1_QuantizeLinear"], (1, 8, 16, 16), axis=4)


def test_reservoir_keeps_exact_extremes_and_close_quartiles():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((20, 4, 500)).astype(np.float32)
    x[:, 2] *= 30
    stats = channelwise.ChannelStats(axis=1, reservoir_size=512)
    for s in x:
        stats.add(s[None])
    r = stats.result()
    per = np.moveaxis(x, 1, 0).reshape(4, -1)
    assert not r["exact_quartiles"] and r["values_per_channel"] == 10000 and r["sampled_per_channel"] == 512
    assert r["min"] == pytest.approx(per.min(1).tolist()) and r["max"] == pytest.approx(per.max(1).tolist())
    assert r["mean"] == pytest.approx(per.mean(1).tolist(), abs=1e-5)
    spread = per.std(1)
    for k in range(4):
        assert abs(r["median"][k] - np.median(per[k])) < 0.15 * spread[k]
        assert abs(r["q3"][k] - np.percentile(per[k], 75)) < 0.15 * spread[k]
    assert r["outlier_channels"] == [2]


@pytest.mark.parametrize("channels", [100, 300])
def test_many_channels_stay_readable(tmp_path, channels):
    data = builders.samples(1, size=8)
    fp = builders.conv_net(tmp_path / "f.onnx", channels=channels, size=8, outlier_channel=7)
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    res = get_channelwise_data_distribution(tmp_path, q, data, ["r1_QuantizeLinear"])
    d = res["r1_QuantizeLinear"]
    assert d["channels"] == channels and 7 in d["outlier_channels"]
    assert _is_png(d["png"])
    import matplotlib.image as mpimg

    height, width = mpimg.imread(d["png"]).shape[:2]
    assert width <= 1800 and height <= 1800


# -- bad input --------------------------------------------------------------------------------
def test_unknown_node_suggests_names(models, tmp_path):
    with pytest.raises(PTQError, match="did you mean 'c2_QuantizeLinear'"):
        plot_distribution(tmp_path, models["engine"], nodes_list=["c2_QuantizeLinea"])


def test_channelwise_rejects_normal_nodes_and_empty_lists(models, tmp_path):
    with pytest.raises(PTQError, match="calibration nodes.*fed by"):
        get_channelwise_data_distribution(tmp_path, models["engine"], nodes_list=["conv2"])
    with pytest.raises(PTQError, match="nodes_list"):
        plot_distribution(tmp_path, models["engine"], nodes_list=[])


def test_nothing_written_outside_save_dir(models, tmp_path):
    before = sorted(p.name for p in models["root"].iterdir())
    plot_distribution(tmp_path / "out", models["engine"], nodes_list=["r1_QuantizeLinear", "conv2"])
    assert sorted(p.name for p in models["root"].iterdir()) == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["distribution_conv2.png",
                                                                  "distribution_r1_QuantizeLinear.png"]


# -- command line -----------------------------------------------------------------------------
def test_cli_plot_distribution(models, tmp_path, capsys):
    out = tmp_path / "o"
    rc = cli.main(["plot-distribution", str(models["q"]), str(models["folder"]), "-n",
                   "['r1_QuantizeLinear','conv2']", "-s", str(out), "--quiet", "--json", str(out / "d.json")])
    text = capsys.readouterr().out
    assert rc == 0
    assert "r1_QuantizeLinear" in text and "conv2" in text
    saved = json.loads((out / "d.json").read_text())
    assert list(saved) == ["r1_QuantizeLinear", "conv2"]
    assert _is_png(saved["conv2"]["png"])


def test_cli_channelwise(models, tmp_path, capsys):
    rc = cli.main(["get-channelwise-data-distribution", str(models["q"]), str(models["folder"]), "-n",
                   "r1_QuantizeLinear", "--axis", "1", "-s", str(tmp_path), "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0
    row = next(line for line in text.splitlines() if "r1_QuantizeLinear" in line and "|" in line)
    assert row.split("|")[-2].strip() == "3"
    assert (tmp_path / "channelwise_r1_QuantizeLinear.png").is_file()


def test_cli_errors_and_help(models, tmp_path, capsys):
    rc = cli.main(["get-channelwise-data-distribution", str(models["q"]), str(models["folder"]), "-n",
                   "r1_QuantizeLinear", "--axis", "7", "-s", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "out of range" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    rc = cli.main(["plot-distribution", str(models["q"]), str(models["folder"]), "-n", "nosuch", "--quiet",
                   "-s", str(tmp_path)])
    assert rc == 2 and "unknown node 'nosuch'" in capsys.readouterr().err
    for command in ("plot-distribution", "get-channelwise-data-distribution"):
        with pytest.raises(SystemExit) as exc:
            cli.main([command, "-h"])
        assert exc.value.code == 0
        assert "--nodes" in capsys.readouterr().out


def test_an_axis_no_node_has_is_refused_not_skipped_node_by_node(models, tmp_path, capsys):
    # several nodes skip one without a channel axis; an axis none of them has is the caller's
    with pytest.raises(PTQError, match="no node has axis 7: axis 7 is out of range"):
        get_channelwise_data_distribution(tmp_path, models["engine"], nodes_list=["r1_QuantizeLinear", "c2_QuantizeLinear"],
                                          axis=7)
    assert not list(tmp_path.glob("*.png"))
    rc = cli.main(["runall", str(models["q"]), str(models["folder"]), "--axis", "7", "--data-num", "1",
                   "-s", str(tmp_path / "runall"), "--quiet"])
    err = capsys.readouterr().err
    # runall says so before its rankings, which take minutes on a real model
    assert rc == 2 and "axis 7 is out of range for every calibration node's input" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runall").exists()


def test_a_scalar_has_no_channels_whatever_the_axis(tmp_path):
    # axis 0 on a scalar passed the range check, then divided by its rank of 0: exit 3
    data = builders.samples(2, size=8)
    qpath = builders.quantize(builders.offset_net(tmp_path / "f.onnx", scalar=True), tmp_path / "q.onnx", data)
    engine = Engine(str(qpath), data)
    c = next(c for c in engine.qmodel.calibration.values() if engine.qmodel.shapes.get(c.input) == [])
    for axis in (0, None):
        with pytest.raises(PTQError, match="is a scalar, so it has no channels to box-plot"):
            channelwise.channel_axis(engine.qmodel, c, (), axis=axis)


def test_titles_wrap_between_phrases_never_inside_brackets():
    from pytest_ptq.figures import wrap

    title = ("conv2d_412.w_0_QuantizeLinear: float weight 'conv2d_412.w_0' by channel (axis 0 of [256, 64, 3, 3], "
             "256 channels, 4 sample(s)) - int8 per tensor\noutlier channels 189 (37x), 3 (12x): a per-tensor scale "
             "costs the median channel ~5.2 bits -> per-channel weights")
    lines = wrap(title, 8).split("\n")
    assert len(lines) >= 3
    for line in lines:
        assert len(line) <= 108
        assert line.count("(") == line.count(")") and line.count("[") == line.count("]"), line
    assert [w for w in " ".join(lines).split() if w != "-"] == [w for w in title.split() if w != "-"]
    assert not any(line.startswith("- ") for line in lines)


# -- a range no 16-bit grid resolves ---------------------------------------------------------
def _bulk_codes(x, scale, zp, qmin, qmax):
    codes = np.clip(np.rint(x / scale) + zp, qmin, qmax).astype(np.int64)
    lo, hi = np.quantile(codes, [distribution.BULK_TAIL, 1 - distribution.BULK_TAIL], method="inverted_cdf")
    return np.unique(codes[(codes >= lo) & (codes <= hi)]).size


@pytest.mark.parametrize("fill, int16_helps", [(-3.4028235e38, False), (-1e4, True)])
def test_a_mask_fill_setting_the_range_is_told_from_a_tail_int16_resolves(tmp_path, fill, int16_helps):
    from onnxruntime.quantization import QuantType

    data = builders.masked_samples()
    fp = builders.masked_attention_net(tmp_path / "float.onnx", fill)
    q8 = builders.quantize(fp, tmp_path / "q8.onnx", data)
    q16 = builders.quantize(fp, tmp_path / "q16.onnx", data, extra_options={
        "TensorQuantOverrides": {"scores": [{"quant_type": QuantType.QInt16}]}})
    pair = "scores_QuantizeLinear"
    d = plot_distribution(tmp_path / "plots", Engine(q8, data, float_model=fp), nodes_list=[pair])[pair]
    tries, reasons = readings.advise(d)

    # the 16-bit count is what onnxruntime's own 16-bit calibration of the same data gives
    # (its range differs from the 8-bit grid's by where each rounded its zero point)
    x = _run_plain(fp, data, ["scores"])["scores"].ravel()
    scale, zp, qmin, qmax = _qparams(q16, pair)
    assert d["bulk_codes_16"] == pytest.approx(_bulk_codes(x, scale, zp, qmin, qmax), rel=0.05, abs=1)

    # and the advice is true of the model's output: int16 recovers it, or only float does
    feeds = [{k: v[i] for k, v in data.items()} for i in range(len(data["x"]))]
    ref = [builders.run_model(fp, f)["out"] for f in feeds]

    def cos(model):
        return builders.pooled_cosine(ref, [builders.run_model(model, f)["out"] for f in feeds])

    others = [n for n in builders.qdq_pairs(q8) if n != pair]
    float_pair = builders.rewire(q8, keep=others)
    at8, at16, in_float = cos(q8), cos(q16), cos(float_pair)
    assert d["bulk_codes"] < 16
    if int16_helps:
        assert at16 > 0.999 > at8
        assert "int16" in tries and "keep in float" not in tries
        assert "stretch the range -> int16" in reasons[0]
    else:
        assert d["bulk_codes_16"] < 16
        assert at16 < 0.99 < in_float
        assert tries[0] == "keep in float" and "int16" not in tries
        assert "values at -3.403e+38" in reasons[0] and "-> keep in float" in reasons[0]
    # the model at 16 bits there already: int16 is no advice for it, whatever else it reads
    d16 = plot_distribution(tmp_path / "plots16", Engine(q16, data, float_model=fp), nodes_list=[pair])[pair]
    assert d16["bit"] == 16 and d16["wider"] is None
    tries16, reasons16 = readings.advise(d16)
    assert "int16" not in tries16 and "int16" not in " ".join(reasons16) and "keep in float" in tries16
    if not int16_helps:
        assert tries16[0] == "keep in float" and "-> keep in float" in reasons16[0]


def test_a_bias_without_channels_is_skipped_among_several_and_refused_alone(models, tmp_path, capsys):
    """A 1-D bias has no channel axis: among several nodes it stopped every other box plot; it
    is skipped with the reason now, and alone it is refused naming the CLI flag."""
    from pytest_ptq.cli import main

    args = ["get-channelwise-data-distribution", str(models["q"]), str(models["folder"]), "--float-model",
            str(models["float"]), "-s", str(tmp_path / "box"), "--quiet"]
    assert main([*args, "-n", "w1_QuantizeLinear", "b1_DequantizeLinear", "--json", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "skipped b1_DequantizeLinear: " in out and "--axis 0" in out
    assert (tmp_path / "box" / "channelwise_w1_QuantizeLinear.png").exists()
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["w1_QuantizeLinear"]["outlier_channels"] == [3] and "skipped" in saved["b1_DequantizeLinear"]
    assert main([*args, "-n", "b1_DequantizeLinear"]) == 2
    assert "no channel axis to infer; pass axis=0 (--axis 0)" in capsys.readouterr().err


def test_a_near_dead_weight_channel_is_not_the_worst_one(tmp_path):
    """A pruned channel (weights 1e-5 of the others) rounds to zero and reads 0 dB: it was
    named the worst channel ("keeps only 0.0 dB") though it carries nothing."""
    helper, rng = onnx.helper, np.random.default_rng(0)
    w = (0.1 * rng.standard_normal((8, 3, 3, 3))).astype(np.float32)
    w[2] *= 1e-5
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 8, 8])],
                              [onnx.numpy_helper.from_array(w, "w")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = builders.samples(2, size=8)
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    [d] = plot_distribution(tmp_path / "p", Engine(str(q), data, float_model=str(fp)),
                            nodes_list=["w_QuantizeLinear"]).values()
    # by hand: each channel's SQNR on onnxruntime's per-tensor grid
    scale = np.abs(w).max() / 127
    err = np.clip(np.rint(w / scale), -128, 127) * scale - w
    db = 10 * np.log10((w.reshape(8, -1) ** 2).sum(1) / (err.reshape(8, -1) ** 2).sum(1))
    assert db[2] < 1 and d["channel_sqnr"][2] == pytest.approx(db[2], abs=0.01)
    live = [k for k in range(8) if k != 2]
    assert d["near_dead_channels"] == 1 and d["worst_channel"] == live[int(np.argmin(db[live]))]
    assert d["worst_channel_sqnr"] == pytest.approx(db[live].min(), abs=0.01)


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_symmetric_range_on_a_relu_output_is_read_as_half_unused(models, tmp_path, symmetric):
    """int8 activations with ActivationSymmetric put half of a Relu output's range below zero,
    where no value goes: that read "well shaped"."""
    data = models["data"]
    q = builders.quantize(models["float"], tmp_path / "q.onnx", data, activation_type="QInt8",
                          extra_options={"ActivationSymmetric": symmetric})
    pair = "r1_QuantizeLinear"
    [d] = plot_distribution(tmp_path / "p", Engine(str(q), data, float_model=str(models["float"])),
                            nodes_list=[pair]).values()
    scale, zp, qmin, qmax = _qparams(q, pair)
    below = (zp - qmin) / (qmax - qmin)  # the share of the grid under zero, from the file
    tries, reasons = readings.advise(d)
    if symmetric:
        assert below == pytest.approx(0.5, abs=0.01)
        assert reasons[0].startswith(f"{below:.0%} of the range lies below zero") and "ActivationSymmetric=False" in reasons[0]
    else:
        assert below < 0.01 and "below zero" not in " ".join(reasons)


def _attention(tmp_path, lengths):
    """x [1, seq, 8] -> q = x W; scores s = q x^T [1, seq, seq] -> Softmax -> p x: samples of
    different sequence lengths, as a text model's calibration set has."""
    helper, rng = onnx.helper, np.random.default_rng(0)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    graph = helper.make_graph([
        helper.make_node("MatMul", ["x", "W"], ["q"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "xt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "x"], ["y"])], "attn",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, "seq", 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, "seq", 8])],
        [onnx.numpy_helper.from_array(w, "W")])
    fp = tmp_path / "attn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [rng.standard_normal((1, n, 8)).astype(np.float32) for n in lengths]}
    return fp, builders.quantize(fp, tmp_path / "attn_q.onnx", data), data


def test_a_sequence_axis_is_no_channel_axis_runall_skips_it_and_alone_it_is_refused_by_name(tmp_path, capsys):
    from pytest_ptq.cli import main

    fp, q, data = _attention(tmp_path, (5, 9, 5, 9))
    folder = builders.save_folder(data, tmp_path / "calib")
    # the scores' last axis is the sequence: its size follows the sample
    assert main(["runall", str(q), str(folder), "--float-model", str(fp), "-s", str(tmp_path / "out"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "9 elements in one sample and 5 in another" in summary["channelwise"]["s_QuantizeLinear"]["skipped"]
    # the embeddings' last axis is the same in every sample: boxed
    assert summary["channelwise"]["x_QuantizeLinear"]["axis"] == 2
    assert "`s_QuantizeLinear`: its axis 2 has 9 elements" in (tmp_path / "out" / "summary.md").read_text()
    capsys.readouterr()
    assert main(["get-channelwise-data-distribution", str(q), str(folder), "-n", "s_QuantizeLinear", "-s",
                 str(tmp_path / "box"), "--quiet"]) == 2
    assert "input 's' of 's_QuantizeLinear': its axis 2 has 9 elements" in capsys.readouterr().err


def test_an_nhwc_image_input_is_boxed_by_its_colour_channels(tmp_path):
    """An NHWC input read by an op with no layout of its own (Pad, then Transpose to NCHW)
    was boxed by its 224 rows."""
    helper = onnx.helper
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph([
        helper.make_node("Pad", ["x", "pads"], ["xp"]),
        helper.make_node("Transpose", ["xp"], ["xc"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["xc", "w"], ["y"])], "nhwc",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 16, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w"),
         onnx.numpy_helper.from_array(np.array([0, 1, 1, 0, 0, 1, 1, 0], np.int64), "pads")])
    fp = tmp_path / "nhwc.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    rng = np.random.default_rng(2)
    # the colour channels far apart, so that a box per channel shows them
    data = {"x": [(rng.standard_normal((1, 16, 16, 3)) * [1, 4, 16]).astype(np.float32) for _ in range(3)]}
    q = builders.quantize(fp, tmp_path / "nhwc_q.onnx", data)
    [box] = get_channelwise_data_distribution(tmp_path / "box", Engine(str(q), data, float_model=str(fp)),
                                              nodes_list=["x_QuantizeLinear"]).values()
    assert box["axis"] == 3 and box["channels"] == 3
    by_hand = [float(np.abs(np.concatenate(data["x"])[..., k]).max()) for k in range(3)]
    assert box["max_abs"] == pytest.approx(by_hand, rel=1e-6)


def test_long_and_cjk_node_names_get_files_of_their_own_and_draw_where_warnings_are_errors(models, tmp_path):
    # scoped names share their first 120 characters; DejaVu Sans has no CJK glyph and warns
    # at each one, which -W error (or filterwarnings = error) raises
    model = onnx.load(str(models["q"]))
    scope = "StatefulPartitionedCall/model/backbone/stage_1/block_1/" * 3
    renamed = {"c2_QuantizeLinear": scope + "卷积_a", "r1_QuantizeLinear": scope + "卷积_b"}
    for node in model.graph.node:
        node.name = renamed.get(node.name, node.name)
    path = tmp_path / "named.onnx"
    onnx.save(model, str(path))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = plot_distribution(tmp_path / "out", path, models["data"], nodes_list=list(renamed.values()))
    pngs = [res[name]["png"] for name in renamed.values()]
    assert len(set(pngs)) == 2 and all(_is_png(p) for p in pngs)
    assert all(len(Path(p).name) <= 140 for p in pngs)


def _engine_of(graph, tmp_path, name, shape, rng, samples=2):
    """The graph saved as a float model, quantized by quantize_static on ``samples`` random
    inputs of ``shape``, in an Engine with its float model."""
    fp = tmp_path / f"{name}.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [rng.standard_normal(shape).astype(np.float32) for _ in range(samples)]}
    q = builders.quantize(fp, tmp_path / f"{name}_q.onnx", data)
    return Engine(str(q), data, float_model=str(fp))


def test_a_conv1d_output_behind_a_slice_and_elementwise_ops_keeps_its_channel_axis(tmp_path):
    """[N, C, T] from a Conv1d, then a Slice, a Mul and an Add (a spectrogram's magnitude):
    the Slice's and Mul's outputs were boxed by their time frames (the rank-3 default)."""
    helper = onnx.helper
    rng = np.random.default_rng(4)
    w = rng.standard_normal((8, 2, 3)).astype(np.float32)
    w[5] *= 40  # one channel far wider: the box plot by channel must show it
    graph = helper.make_graph([
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Slice", ["c", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Mul", ["s", "s"], ["m"]),
        helper.make_node("Add", ["m", "eps"], ["y"])], "conv1d",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 32])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(np.array([0], np.int64), "starts"),
         onnx.numpy_helper.from_array(np.array([2**62], np.int64), "ends"),
         onnx.numpy_helper.from_array(np.array([2], np.int64), "axes"),
         onnx.numpy_helper.from_array(np.array(1e-3, np.float32), "eps")])
    engine = _engine_of(graph, tmp_path, "conv1d", (1, 2, 32), rng, samples=3)
    qm = engine.qmodel
    inputs = {c.input: c.name for c in qm.calibration.values() if c.is_activation}
    assert {"c", "m"} <= set(inputs)  # the Conv's and the Mul's outputs are quantized
    for tensor in ("c", "m"):
        assert channelwise.channel_axis(qm, qm.calibration[inputs[tensor]], (1, 8, 30)) == 1, tensor
    [box] = get_channelwise_data_distribution(tmp_path / "box", engine, nodes_list=[inputs["m"]]).values()
    assert box["axis"] == 1 and box["channels"] == 8 and 5 in box["outlier_channels"]


def test_a_norm_scale_is_not_advised_per_channel_weights_which_onnxruntime_cannot_give_it(tmp_path):
    """A LayerNormalization's scale with one large value: its codes starve, yet onnxruntime
    quantizes only a Conv's, Gemm's or MatMul's weight per channel, so that is no advice."""
    helper = onnx.helper
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    gamma = np.ones(16, np.float32)
    gamma[3] = 500.0
    graph = helper.make_graph([
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["y"], axis=-1)], "ln",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(gamma, "gamma"),
         onnx.numpy_helper.from_array(np.zeros(16, np.float32), "beta")])
    engine = _engine_of(graph, tmp_path, "ln", (1, 8, 16), rng)
    qm = engine.qmodel
    by_input = {c.input: c for c in qm.of_kind("weight")}
    assert {"w", "gamma"} <= set(by_input), sorted(by_input)
    assert qm.takes_per_channel(by_input["w"]) and not qm.takes_per_channel(by_input["gamma"])
    d = plot_distribution(tmp_path / "out", engine, nodes_list=[by_input["gamma"].name])[by_input["gamma"].name]
    tries, reason = readings.weight_issue(d)
    assert tries and tries[0] != "per-channel" and "per-channel weights" not in reason
    assert "onnxruntime quantizes the weights of this op per tensor only" in reason


def test_a_constant_behind_an_identity_reads_as_harmless(tmp_path):
    """An exporter's deduplicated weight (all ones, through an Identity) is quantized as an
    activation: "99.9% of values fall on only 1 of the 256 codes ... keep in float" was
    read off a tensor that every code represents exactly."""
    helper = onnx.helper
    rng = np.random.default_rng(6)
    graph = helper.make_graph([
        helper.make_node("Identity", ["ones"], ["g"]),
        helper.make_node("Mul", ["x", "g"], ["y"])], "dedup",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.ones(16, np.float32), "ones")])
    engine = _engine_of(graph, tmp_path, "dedup", (1, 8, 16), rng)
    [c] = [c for c in engine.qmodel.calibration.values() if c.input == "g"]
    d = plot_distribution(tmp_path / "out", engine, nodes_list=[c.name])[c.name]
    assert d["min"] == d["max"] == 1.0
    reading = readings.activation_reading(d)
    assert reading.startswith("every value is 1 on every sample") and reading.endswith("harmless")
    assert "keep in float" not in " ".join(readings.advise_activation(d)[0][:1])


@pytest.mark.parametrize("values, starved", [(np.arange(10) * 0.37 - 1.5, False),  # ten values, ten codes
                                             (np.r_[np.full(63, 0.01), 30.0], True)])  # one value sets the scale
def test_a_tensor_is_starved_of_codes_only_where_its_values_could_fill_more(tmp_path, values, starved):
    """A bias of ten values falls on ten codes, all it can: not "starved"; 64 values of which
    63 round to one code beside one large value are."""
    helper = onnx.helper
    rng = np.random.default_rng(7)
    bias = np.asarray(values, np.float32)
    graph = helper.make_graph([
        helper.make_node("Add", ["x", "bias"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"])], "bias",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, bias.size])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(bias, "bias")])
    engine = _engine_of(graph, tmp_path, "bias", (1, bias.size), rng)
    [c] = [c for c in engine.qmodel.of_kind("weight") if c.input == "bias"]
    d = plot_distribution(tmp_path / "out", engine, nodes_list=[c.name])[c.name]
    codes = np.unique(np.clip(np.rint(bias / c.scale) + c.zero_point, c.grid.qmin, c.grid.qmax)).size
    assert d["count"] == bias.size and d["bulk_codes"] <= codes  # the codes its values fall on
    tries, reason = readings.weight_issue(d)
    assert ("codes" in reason) is starved, reason


def test_a_broadcast_weight_is_boxed_along_its_channels_not_its_leading_size_1_axis(tmp_path):
    """A mask [1, C, H, W] multiplied into an activation was boxed along axis 0: one box,
    "no outlier channel", though two of its channels hold values 1000x the others."""
    helper = onnx.helper
    rng = np.random.default_rng(8)
    mask = rng.uniform(0.5, 1.5, (1, 16, 4, 4)).astype(np.float32)
    mask[0, 3, 1, 1], mask[0, 9, 2, 0] = 5000.0, -3000.0
    graph = helper.make_graph([helper.make_node("Mul", ["x", "mask"], ["y"])], "mask",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 4, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(mask, "mask")])
    engine = _engine_of(graph, tmp_path, "mask", (1, 16, 4, 4), rng)
    [c] = [c for c in engine.qmodel.of_kind("weight") if c.input == "mask"]
    assert channelwise.channel_axis(engine.qmodel, c, (1, 16, 4, 4)) == 1
    assert channelwise.channel_axis(engine.qmodel, c, (1, 1, 1, 8)) == 3
    [box] = get_channelwise_data_distribution(tmp_path / "box", engine, nodes_list=[c.name]).values()
    assert box["axis"] == 1 and box["channels"] == 16
    assert box["outlier_channels"] == [3, 9]
    assert channelwise.reading(box).startswith("outlier channels 3 (")


def _drawn_figures(monkeypatch):
    """The figures the distribution plots save, kept for their artists."""
    from pytest_ptq.distribution import plots

    figures, save = [], plots.save_figure

    def keep(fig, path, tight=True):
        figures.append(fig)
        return save(fig, path, tight)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures


def _constant_branch(tmp_path):
    """x * zeros + 3: an all-zero weight (stored exactly), an all-zero activation and one that
    is 3 everywhere, then added back to x."""
    helper = onnx.helper
    rng = np.random.default_rng(9)
    graph = helper.make_graph([
        helper.make_node("Mul", ["x", "zeros"], ["z"]),
        helper.make_node("Add", ["z", "three"], ["c"]),
        helper.make_node("Add", ["x", "c"], ["y"])], "const",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.zeros((1, 8, 1, 1), np.float32), "zeros"),
         onnx.numpy_helper.from_array(np.full((1,), 3.0, np.float32), "three")])
    engine = _engine_of(graph, tmp_path, "const", (1, 8, 4, 4), rng)
    by_input = {c.input: c.name for c in engine.qmodel.calibration.values()}
    return engine, by_input


def test_a_constant_tensor_histogram_says_what_it_holds_above_the_range_lines(tmp_path, monkeypatch):
    """Every value 3: its one bin, 2 px wide, lay under the dashed calibration-range line at 3
    and the histogram looked empty."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import StepPatch

    engine, by_input = _constant_branch(tmp_path)
    figures = _drawn_figures(monkeypatch)
    d = plot_distribution(tmp_path / "out", engine, nodes_list=[by_input["c"]])[by_input["c"]]
    assert d["min"] == d["max"] == 3.0 and d["range_hi"] == pytest.approx(3.0, abs=d["scale"])
    [ax] = figures[0].axes
    texts = [t.get_text() for t in ax.texts]
    assert f"all {d['count']} values = 3" in texts
    [bars] = [p for p in ax.patches if isinstance(p, StepPatch)]
    lines = [line for line in ax.lines if isinstance(line, Line2D) and line.get_linestyle() == "--"]
    assert lines and all(bars.get_zorder() > line.get_zorder() for line in lines)


def test_an_all_zero_weight_is_stored_exactly_and_gets_no_advice(tmp_path, monkeypatch):
    """A zero weight falls on one code of 256, yet loses nothing: "-> int16 weights, or QAT"
    sent the user after a weight that is not the problem."""
    engine, by_input = _constant_branch(tmp_path)
    figures = _drawn_figures(monkeypatch)
    node = by_input["zeros"]
    d = plot_distribution(tmp_path / "out", engine, nodes_list=[node])[node]
    assert d["kind"] == "weight" and d["max_abs_error"] == 0 and d["codes_used"] == 1
    tries, reason = readings.weight_issue(d)
    assert tries == [] and "stored exactly" in reason and "int16" not in reason
    assert readings.advise(d) == ([], [reason])
    heading = figures[0]._suptitle.get_text()
    assert "stored exactly" in heading and "QAT" not in heading
    # the values and the error panels each say all 16 are 0
    assert [t.get_text() for ax in figures[0].axes for t in ax.texts if t.get_text().startswith("all ")] == \
        ["all 8 values = 0", "all 8 values = 0"]


def test_an_all_zero_tensor_reads_as_constant_not_as_a_zero_ratio(tmp_path):
    """0/0 printed as "the widest channel reaches 0.0x the median channel's max|x|"."""
    engine, by_input = _constant_branch(tmp_path)
    node = by_input["z"]
    [box] = get_channelwise_data_distribution(tmp_path / "box", engine, nodes_list=[node]).values()
    assert box["channels"] == 8 and not any(box["max_abs"]) and box["outlier_channels"] == []
    reading = channelwise.reading(box)
    assert reading.startswith("every channel is 0") and "0.0x" not in reading


def _box_stats(x, axis=1, **fields):
    stats = channelwise.ChannelStats(axis=axis)
    stats.add(x)
    return {**stats.result(), "axis": axis, "shape": list(x.shape), "kind": "activation", "per_channel": False,
            **fields}


def _saved_channel_plot(monkeypatch, tmp_path, stats, title):
    figures, save = [], channelwise.save_figure

    def keep(fig, path, tight=True):
        figures.append(fig)
        return save(fig, path, tight)

    monkeypatch.setattr(channelwise, "save_figure", keep)
    channelwise.plot_channels(stats, tmp_path / "box.png", title)
    [fig] = figures
    fig.canvas.draw()
    return fig


def test_a_long_title_wraps_at_words_and_scope_separators_inside_the_figure(tmp_path, monkeypatch):
    """A scoped name of 150 characters ran off both edges ("odel/encoder/..." at the left) and
    was cut mid-word ("attention_score" / "s/scaled"); a wrap after "," lost its space."""
    rng = np.random.default_rng(10)
    scope = ("/model/encoder/layers.99/self_attn/q_proj/very_long_submodule_name_generated_by_the_exporter/"
             "attention_scores/scaled_dot_product/tail/Mul_end_b_output_0")
    title = (f"{scope}_QuantizeLinear: float input '{scope}' by channel (axis 1 of [1, 16, 32, 32], 16 channels, "
             "5 sample(s)) - uint8 per tensor")
    fig = _saved_channel_plot(monkeypatch, tmp_path, _box_stats(rng.standard_normal((1, 16, 8, 8))), title)
    heading = fig._suptitle
    box = heading.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (box, fig.bbox)
    *lines, reading = heading.get_text().split("\n")
    assert reading.startswith("no outlier channel") and len(lines) >= 3
    for line in lines:
        assert line in title
    for line in lines[:-1]:
        # a break between words, or after a separator of a scoped name: never inside a word
        assert line + " " in title or line.endswith(("/", "_", ".")), line
    assert "16 channels, 5 sample(s)" in " ".join(lines)
    wrapped = figures.wrap("x: " + "a" * 100 + ", 5 s", 4).split("\n")
    assert wrapped[-1].endswith("a, 5 s") and len(wrapped) >= 3, wrapped


def test_a_wide_tick_label_leaves_the_y_label_inside_the_figure(tmp_path, monkeypatch):
    """Values near 150000 drew tick labels "150000" over the fixed margin and the y label
    "value" off the figure's left edge."""
    rng = np.random.default_rng(11)
    stats = _box_stats(150000 + 1000 * rng.standard_normal((1, 8, 8, 8)))
    fig = _saved_channel_plot(monkeypatch, tmp_path, stats, "wide values")
    [ax] = fig.axes
    assert ax.get_yscale() == "linear" and ax.get_ylabel() == "value (x 1e5)"
    label = ax.yaxis.label.get_window_extent()
    ticks = [t.get_window_extent() for t in ax.get_yticklabels() if t.get_text()]
    assert label.x0 >= 0 and ticks and all(label.x1 <= t.x0 for t in ticks)


def test_outlier_channels_spanning_decades_get_a_symlog_axis_and_their_colour(tmp_path, monkeypatch):
    """One value 5000x the rest flattened every other channel to a line at 0 on a linear axis,
    and the outlier channels' boxes, flat too, never showed the legend's orange."""
    from matplotlib.collections import PathCollection
    from matplotlib.colors import to_hex

    rng = np.random.default_rng(12)
    x = rng.uniform(0, 10, (1, 16, 8, 8))
    x[0, 3, 1, 1], x[0, 9, 2, 2] = 50000.0, -30000.0
    stats = _box_stats(x)
    assert stats["outlier_channels"] == [3, 9] and channelwise.symlog_threshold(stats) == \
        pytest.approx(stats["median_channel_max_abs"])
    fig = _saved_channel_plot(monkeypatch, tmp_path, stats, "outliers")
    [ax] = fig.axes
    assert ax.get_yscale() == "symlog" and "symlog" in ax.get_ylabel()
    # its labels are plain numbers: the scale's own, formulas, read "$\\mathdefault{10^{3}}$" where
    # figures draw text as written
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and not any("$" in t or "mathdefault" in t for t in ticks), ticks
    # an ordinary channel's box now spans a visible height: its q1..q3 covers a fifth of the axis or so
    to_px = ax.transData.transform
    box_px = to_px((1, stats["q3"][0]))[1] - to_px((1, stats["q1"][0]))[1]
    assert box_px > 0.05 * ax.bbox.height
    orange = [c for c in ax.collections if isinstance(c, PathCollection)
              and any(to_hex(f) == "#f4a261" for f in c.get_facecolors())]
    assert [sorted(o[0] for o in c.get_offsets()) for c in orange] == [[4.0, 10.0]]  # channels 3 and 9 at x = k + 1
    # a tensor without such a channel keeps its linear axis
    assert channelwise.symlog_threshold(_box_stats(rng.uniform(0, 10, (1, 16, 8, 8)))) is None


def test_a_distribution_heading_agrees_with_its_channels(tmp_path, monkeypatch):
    """runall's histogram of an activation read "the range fits the data" while its box plot
    and the summary said outlier channels starve the rest under the per-tensor scale."""
    from pytest_ptq import runall as runall_mod
    from pytest_ptq.channelwise import reading as channel_reading

    data = builders.samples(2)
    fp = builders.conv_net(tmp_path / "float.onnx", outlier_channel=3)
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    engine = Engine(str(q), data, float_model=str(fp))
    act = engine.qmodel.calibration["c1_QuantizeLinear"]  # the planted channel's conv output
    dist, boxes = distribution.collect(engine, [act.name], [act.name])
    d, box = dist[act.name], boxes[act.name]
    assert box["outlier_channels"] == [3] and not d["per_channel"]  # the case
    assert readings.activation_reading(d, box) == channel_reading(box)
    drawn = {}
    real = runall_mod.draw_distribution
    monkeypatch.setattr(runall_mod, "draw_distribution",
                        lambda d, folder, box=None: drawn.setdefault(d["node"], box) or real(d, folder, box))
    runall_mod.runall(engine, save_dir=tmp_path / "out", top=3, progress=False)
    assert drawn.get("c1_QuantizeLinear") is not None  # its histogram drawn with its channels


def test_the_box_plot_marks_the_channel_a_weights_reading_names(tmp_path, monkeypatch):
    """runall's reading named "channel 168 keeps only 0.0 dB SQNR" beside a box plot that marked
    only the outlier channel 189."""
    from pytest_ptq.distribution import plots

    data = builders.samples(2)
    fp = builders.conv_net(tmp_path / "float.onnx", outlier_channel=3)
    engine = Engine(str(builders.quantize(fp, tmp_path / "q.onnx", data)), data, float_model=str(fp))
    w = "w1_QuantizeLinear"
    dist, boxes = distribution.collect(engine, [w], [w])
    worst = dist[w]["worst_channel"]
    assert worst is not None and worst not in boxes[w]["outlier_channels"]  # the case
    seen = {}
    real = plots.plot_channels
    monkeypatch.setattr(plots, "plot_channels", lambda *a: seen.setdefault("marked", a[3]) and real(*a))
    plots.draw_channelwise(boxes[w], tmp_path, dist[w])
    assert list(seen["marked"]) == [worst] and f"{dist[w]['worst_channel_sqnr']:.1f} dB" in seen["marked"][worst]


def test_a_few_values_are_not_read_as_a_well_shaped_distribution(tmp_path):
    """A scalar per sample, ranked on two samples, read "well shaped ... uses 2 of 256 codes"."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["s"], keepdims=1, name="mean"),
         helper.make_node("Mul", ["x", "s"], ["y"], name="mul")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [(rng.standard_normal((1, 64)) + 1).astype(np.float32) for _ in range(2)]}
    engine = Engine(str(builders.quantize(fp, tmp_path / "q.onnx", data)), data, float_model=str(fp))
    name = next(c.name for c in engine.qmodel.of_kind("activation") if c.input == "s")
    d = distribution.collect(engine, [name], [])[0][name]
    assert d["count"] == 2  # the case
    assert readings.activation_reading(d).startswith("only 2 value(s) on these samples")
    tries, reasons = readings.advise(d)
    assert "well shaped" not in " ".join(reasons) and "rank on more samples" in reasons[-1]


def test_figures_leave_the_users_pyplot_backend_and_figures_as_they_were(models, tmp_path):
    """A notebook's inline backend was switched to Agg by the first plot, and pyplot's state
    is the user's: the figures are drawn on a canvas of their own (in a process of its own
    here, as a backend is process-wide)."""
    import subprocess
    import sys

    script = f"""
import matplotlib
matplotlib.use("svg")
import matplotlib.pyplot as plt
mine = plt.figure()
from pytest_ptq.engine import Engine
from pytest_ptq.distribution import plot_distribution
from pytest_ptq.curves import plot_acc_error
engine = Engine({str(models["q"])!r}, {str(models["folder"])!r})
d = plot_distribution({str(tmp_path)!r}, engine, nodes_list=["c1_QuantizeLinear"])
plot_acc_error({str(tmp_path)!r}, model_or_file=engine, quantize_node=["c1_QuantizeLinear"], progress=False)
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert plt.get_fignums() == [mine.number], plt.get_fignums()
print(d["c1_QuantizeLinear"]["png"])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _is_png(done.stdout.strip().splitlines()[-1])


def test_a_weight_on_a_grid_without_negative_codes_is_read_as_such(tmp_path):
    """A weight's QuantizeLinear without a zero point quantizes to uint8 with zero point 0:
    every negative weight becomes 0. The reading said the scale was not computed from these
    weights and sent the user to recompute it, which recovers nothing."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["w", "s"], ["wq"], name="w_Q"),
         helper.make_node("DequantizeLinear", ["wq", "s"], ["wd"], name="w_DQ"),
         helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(np.abs(w).max() / 255), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    data = {"x": [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(2)]}
    d = plot_distribution(tmp_path / "out", Engine(str(tmp_path / "m.onnx"), data), nodes_list=["w_Q"])["w_Q"]
    assert d["range_lo"] == 0 and d["clipped_share"] == pytest.approx(np.mean(w < 0))  # independently: the negatives
    tries, reason = readings.weight_issue(d)
    assert "the grid holds no value below 0" in reason and "every negative weight becomes 0" in reason
    assert "recompute it from their range" not in reason and tries[0] == "keep in float"


def test_the_widest_channels_ratio_reads_as_the_box_plot_reads_it():
    """7.6x read "8x wider than the median channel" in the text beside a box plot titled "no
    outlier channel: the widest channel reaches 7.6x" (its outliers start at 8x)."""
    d = {"role": "", "worst_channel_sqnr": 10.0, "sqnr": 30.0, "clipped_share": 0, "range_lo": -1.0, "range_hi": 1.0,
         "float": {"min": -1.0}, "per_channel": False, "takes_per_channel": True, "widest_channel": 3,
         "widest_ratio": 7.6, "worst_channel": 1, "bit": 8, "levels": 256}
    tries, reason = readings.weight_issue(d)
    assert tries == ["per-channel"] and "channel 3, 7.6x wider than the median channel" in reason, reason


def _empty_tensors_model(tmp_path):
    """x -> Q/DQ -> Concat(x, a lone DQ of an int8 [1, 0, 8, 8] initializer, a Q/DQ pair on a
    float [1, 0, 8, 8] initializer, a Q/DQ pair on an empty Slice of x) -> Q/DQ -> Relu -> y."""
    from onnx import TensorProto

    inits, nodes = [], []

    def pair(t, scale, name):
        return builders.add_pair(inits, nodes, t, scale, np.int8(0), name)

    inits += [numpy_helper.from_array(np.zeros((1, 0, 8, 8), np.int8), "E8"),
              numpy_helper.from_array(np.array(0.1, np.float32), "e_s"),
              numpy_helper.from_array(np.array(0, np.int8), "e_z"),
              numpy_helper.from_array(np.zeros((1, 0, 8, 8), np.float32), "EF"),
              numpy_helper.from_array(np.array([0], np.int64), "st"),
              numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes.append(helper.make_node("DequantizeLinear", ["E8", "e_s", "e_z"], ["e_dq"], name="lone_empty"))
    x = pair("x", 0.03, "xin")
    nodes.append(helper.make_node("Slice", [x, "st", "st", "ax"], ["hollow"], name="slice_empty"))
    parts = [x, "e_dq", pair("EF", 0.1, "wef"), pair("hollow", 0.05, "hol")]
    nodes.append(helper.make_node("Concat", parts, ["cat"], name="concat", axis=1))
    nodes.append(helper.make_node("Relu", [pair("cat", 0.03, "cat")], ["y"], name="relu"))
    graph = helper.make_graph(nodes, "hollow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(tmp_path / "hollow.onnx"))
    rng = np.random.default_rng(4)
    return tmp_path / "hollow.onnx", {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(3)]}


EMPTY = ("wef_Q", "hol_Q", "lone_empty")


def test_a_zero_size_tensor_is_skipped_with_a_note_and_the_rest_drawn(tmp_path):
    # a zero-size weight or activation in a pair ended every figure: cannot reshape array of size 0
    qpath, data = _empty_tensors_model(tmp_path)
    engine = Engine(str(qpath), data)
    dist = plot_distribution(tmp_path / "d", engine, nodes_list=[*EMPTY, "xin_Q", "concat"])
    for name in EMPTY:
        assert "is empty (shape [1, 0, 8, 8])" in dist[name]["skipped"] and "png" not in dist[name], name
    x = np.concatenate([a.ravel() for a in data["x"]])
    assert dist["xin_Q"]["max_abs"] == pytest.approx(np.abs(x).max()) and dist["xin_Q"]["count"] == x.size
    every = set(builders.qdq_pairs(qpath))
    full = builders.run_model(builders.rewire(qpath, keep=every, outputs=["cat"]), [{"x": a} for a in data["x"]])
    assert dist["concat"]["quantized"]["max_abs"] == pytest.approx(max(np.abs(o["cat"]).max() for o in full))
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["distribution_concat.png", "distribution_xin_Q.png"]
    boxes = get_channelwise_data_distribution(tmp_path / "b", engine, nodes_list=[*EMPTY, "xin_Q"])
    for name in EMPTY:
        assert "no values to box-plot" in boxes[name]["skipped"], name
    assert boxes["xin_Q"]["max_abs"] == pytest.approx(np.abs(np.stack(data["x"])).max(axis=(0, 1, 3, 4)).tolist())
    for name in EMPTY:  # alone: one sentence naming it, no traceback
        with pytest.raises(PTQError, match=f"node '{name}': '.*' is empty"):
            plot_distribution(tmp_path / "d", engine, nodes_list=[name])
        with pytest.raises(PTQError, match=f"node '{name}': '.*' is empty"):
            get_channelwise_data_distribution(tmp_path / "b", engine, nodes_list=[name])


def test_nodes_that_are_all_empty_are_refused_on_every_face(tmp_path, capsys):
    """Every node named with a zero-size tensor: each was skipped with a note, and the command
    printed an empty table, drew nothing and exited 0. Now one sentence names them and why, and
    the CLI exits 2, as it does for one such node alone."""
    qpath, data = _empty_tensors_model(tmp_path)
    engine = Engine(str(qpath), data)
    # what the tool reads in the file: three tensors without a value
    model = onnx.load(str(qpath))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert inits["E8"].size == 0 and inits["EF"].size == 0
    hollow = builders.run_model(builders.rewire(qpath, outputs=["hollow"]), {"x": data["x"][0]})["hollow"]
    assert hollow.size == 0
    for call, what in ((plot_distribution, "histogram"), (get_channelwise_data_distribution, "box plot")):
        with pytest.raises(PTQError, match=f"nothing to draw: none of the 3 nodes given has a {what}") as exc:
            call(tmp_path / what, engine, nodes_list=list(EMPTY))
        assert all(f"{name!r}: " in str(exc.value) for name in EMPTY) and "is empty (shape [1, 0, 8, 8])" in str(exc.value)
    assert not list(tmp_path.rglob("*.png"))
    builders.save_folder(data, tmp_path / "calib")
    for command in ("plot-distribution", "get-channelwise-data-distribution"):
        rc = cli.main([command, str(qpath), str(tmp_path / "calib"), "-n", *EMPTY, "--quiet", "-s", str(tmp_path / "cli"),
                       "--json", str(tmp_path / "cli.json")])
        out, err = capsys.readouterr()
        assert rc == 2 and not out, out
        # the model's own warning (no float weights), then the refusal on one line
        assert err.strip().splitlines()[-1].startswith(
            f"ptq-debug {command}: error: nothing to draw: none of the 3 nodes given"), err
        assert not (tmp_path / "cli.json").exists() and not list((tmp_path / "cli").glob("*.png"))


def test_the_reports_ranked_nodes_without_values_are_named(tmp_path):
    """The report's ranked nodes that hold empty tensors went missing from its figures without a
    word (runall's summary and the debug API name them): a note says which and why."""
    from pytest_ptq import report
    from pytest_ptq.analysis import Analysis, AnalysisKey

    qpath, data = _empty_tensors_model(tmp_path)
    builders.save_folder(data, tmp_path / "calib")
    analysis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), None), root=tmp_path)
    sens = analysis.sensitivity("activation")
    top = [n for n in EMPTY if n in sens]
    assert top == ["hol_Q"]  # the weights are ranked apart; hol_Q is the empty activation
    images, note = report._distribution_figures(analysis, sens, "cosine-similarity", top, {}, [])
    assert images == [] and note.startswith("no distribution for 'hol_Q' ('hol_Q': 'hollow' is empty"), note


def test_runall_and_the_diagnosis_skip_a_zero_size_tensor(tmp_path):
    from pytest_ptq.analysis import Analysis, AnalysisKey
    from pytest_ptq.runall import runall

    qpath, data = _empty_tensors_model(tmp_path)
    s = runall(str(qpath), data, save_dir=tmp_path / "out", top=5, progress=False)
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "no histogram for `wef_Q`, `hol_Q`" in text and "no box plot for `wef_Q`, `hol_Q`" in text
    assert "xin_Q" in s["distributions"] and Path(s["distributions"]["xin_Q"]["png"]).exists()
    # the empty pairs change nothing: brute force, the model with each alone quantized
    feeds = [{"x": a} for a in data["x"]]
    base = builders.run_model(builders.rewire(qpath), feeds)
    for name in ("wef_Q", "hol_Q"):
        alone = builders.run_model(builders.rewire(qpath, keep={name}), feeds)
        assert builders.worst_cosine(base, alone) == pytest.approx(1.0, abs=1e-12)
        assert next(it for it in s["verdict"]["nodes"] if it["node"] == name)["cosine-similarity"] == \
            pytest.approx(1.0, abs=1e-12)
    builders.save_folder(data, tmp_path / "calib")
    diagnosis = Analysis(AnalysisKey(str(qpath), str(tmp_path / "calib"), None), root=tmp_path).diagnosis()
    assert {it["node"] for it in diagnosis.nodes} >= {"concat", "relu"}


def test_figures_drawn_from_two_threads_at_once(models, tmp_path):
    """Two threads drawing at once shared the glyph fonts' FreeType objects (the heap was
    corrupted and the process aborted, or FreeType raised) and restored each other's
    matplotlib settings and warning filters, leaving the user's process without formulas."""
    import threading
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    import matplotlib

    before = (matplotlib.rcParams["text.parse_math"], list(matplotlib.rcParams["font.sans-serif"]),
              list(warnings.filters))
    start = threading.Barrier(2)
    nodes = ["c1_QuantizeLinear", "r1_QuantizeLinear", "conv2", "w1_QuantizeLinear"]

    def draw(k):
        start.wait()
        for round_ in range(3):
            plot_distribution(tmp_path / f"{k}_{round_}", models["engine"], nodes_list=nodes)
        return sorted(p.name for p in (tmp_path / f"{k}_0").rglob("*.png"))

    with ThreadPoolExecutor(2) as pool:
        drawn = list(pool.map(draw, range(2)))
    assert drawn[0] == drawn[1] and len(drawn[0]) >= len(nodes)
    assert all(_is_png(p) for p in tmp_path.rglob("*.png"))
    after = (matplotlib.rcParams["text.parse_math"], list(matplotlib.rcParams["font.sans-serif"]),
             list(warnings.filters))
    assert after == before


def test_a_tensor_whose_samples_differ_in_rank_is_refused_its_box_plot_and_runall_boxes_the_rest(tmp_path, capsys):
    """An input that declares no shape, before ReduceMean(keepdims=0), runs samples of ranks 3
    and 2; the per-channel statistics took the rank-3 sample's channel axis 2 to the rank-2
    one and ended in an internal AxisError (runall too). That tensor's box plot is refused in
    one sentence naming the ranks; runall boxes the other pair's tensor, whose statistics match
    numpy's over a plain session's values of it (a graph output of the float model)."""
    from pytest_ptq.cli import main

    inits, nodes = [], []
    x = builders.add_pair(inits, nodes, "x", 0.02, np.uint8(128))
    nodes.append(helper.make_node("ReduceMean", [x], ["y"], keepdims=0, name="mean"))
    gain = np.array([1.0, 1.0, 20.0, 1.0], np.float32).reshape(1, 4, 1)  # channel 2 the outlier
    inits.append(numpy_helper.from_array(gain, "gain"))
    nodes.append(helper.make_node("Mul", ["z", "gain"], ["t"], name="scale"))
    t = builders.add_pair(inits, nodes, "t", 0.2, np.uint8(128))
    nodes.append(helper.make_node("Relu", [t], ["w"], name="relu"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None),
                                           helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 4, 6])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, None)], inits)
    q = tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), q)
    rng = np.random.default_rng(0)
    data = {"x": [rng.standard_normal(s).astype(np.float32) for s in ((1, 3, 4), (1, 3, 4), (1, 5))],
            "z": [rng.standard_normal((1, 4, 6)).astype(np.float32) for _ in range(3)]}
    folder = builders.save_folder(data, tmp_path / "calib")

    # axis 1: the gain's channels (inferred, the last axis would spread the outlier over every box)
    assert main(["runall", str(q), str(folder), "-s", str(tmp_path / "out"), "--axis", "1", "--quiet"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    ranks = [a.ndim for a in data["x"]]
    assert f"differ in rank ({ranks[0]} axes in one, {ranks[-1]} in another)" in summary["channelwise"]["x_Q"]["skipped"]
    box = summary["channelwise"]["t_Q"]
    runs = builders.run_model(builders.rewire(q, outputs=["t"]), [{"x": a, "z": b} for a, b in zip(data["x"], data["z"])])
    assert box["axis"] == 1
    values = np.concatenate([r["t"].transpose(1, 0, 2).reshape(4, -1) for r in runs], axis=1).astype(np.float64)
    np.testing.assert_allclose(box["min"], values.min(axis=1), rtol=1e-6)
    np.testing.assert_allclose(box["max"], values.max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(box["mean"], values.mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(box["median"], np.median(values, axis=1), rtol=1e-5)
    widest = np.abs(values).max(axis=1)
    assert box["outlier_channels"] == [int(k) for k in np.flatnonzero(widest > channelwise.OUTLIER_K * np.median(widest))]
    assert box["outlier_channels"]  # the gain's channel
    assert box["values_per_channel"] == values.shape[1]
    # alone, the command refuses it by name in one sentence, no internal error
    capsys.readouterr()
    assert main(["get-channelwise-data-distribution", str(q), str(folder), "-n", "x_Q", "-s", str(tmp_path / "box"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "input 'x' of 'x_Q': its samples differ in rank" in err and "Traceback" not in err, err

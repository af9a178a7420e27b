"""Cumulative and local error curves against rewired models and hand-built single nodes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import builders
from pytest_ptq import debug
from pytest_ptq.curves import configs_from, get_acc_error, plot_acc_error, running_mean
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
ROOT = Path(__file__).resolve().parents[1]
# Per-element difference between the engine and the rewired references at ORT_DISABLE_ALL
# (float32 summation order, measured <= 7.5e-8 in test_engine), doubled for two runs.
DELTA = 2e-7


def _cos(r, t):
    return float(r @ t / np.sqrt((r @ r) * (t @ t)))


def _mse(r, t):
    return float(((t - r) ** 2).mean())


def assert_cosine(got, r, t):
    """``got`` is cos(r, t) up to what DELTA per element can move it (|e|/|t| times the sine)."""
    __tracebackhide__ = True
    want = _cos(r, t)
    rms = min(np.sqrt((r * r).mean()), np.sqrt((t * t).mean()))
    tol = 2 * DELTA / rms * math.sqrt(max(2 * (1 - want), 0.0)) + 1e-12
    assert abs(got - want) <= tol, (got, want, tol)


class Setup:
    def __init__(self, zoo, variant="qdq_pc"):
        self.qpath, self.fpath = zoo.qdq(variant), zoo.float(variant)
        data = zoo.data(variant)
        self.data = data
        self.feeds = [{k: data[k][i] for k in data} for i in range(len(data["x"]))]
        self.engine = Engine(self.qpath, data, float_model=self.fpath, optimization="disable")
        self.model = onnx.load(str(self.qpath))
        self.pairs = builders.qdq_pairs(self.model)
        self.inits = {i.name: numpy_helper.to_array(i) for i in self.model.graph.initializer}
        self.normal = [n for n in self.model.graph.node if n.op_type not in QDQ_OPS]

    def kind(self, name):
        q, dqs = self.pairs[name]
        return "weight" if (q or dqs[0]).input[0] in self.inits else "activation"

    def outputs(self, keep, tensors):
        model = builders.rewire(self.qpath, keep=set(keep), float_model=self.fpath, outputs=tensors)
        return builders.run_model(model, self.feeds, "disable", tensors)

    def pooled(self, runs, tensor):
        return np.concatenate([o[tensor].ravel() for o in runs]).astype(np.float64)


@pytest.fixture(scope="module")
def setup(zoo):
    return Setup(zoo)


def test_cumulative_values_equal_rewired_models(setup):
    acts = [n for n in setup.pairs if setup.kind(n) == "activation"]
    configs = {"some": ["w1_QuantizeLinear", "r1_QuantizeLinear", "a2_QuantizeLinear"], "acts": acts}
    curves = get_acc_error(setup.engine, configs, "cosine-similarity", local=False, progress=False)
    assert curves.nodes == [n.name for n in setup.normal]
    # a node whose output only a pair writing a model output reads is compared after that
    # pair: the model output itself
    outputs = {o.name for o in setup.model.graph.output}
    delivered = {q.input[0]: dq.output[0] for q, dqs in setup.pairs.values() if q is not None for dq in dqs
                 if dq.output[0] in outputs}
    readers = [i for n in setup.normal for i in n.input]
    assert curves.tensors == [delivered.get(n.output[0], n.output[0]) if n.output[0] not in readers
                              else n.output[0] for n in setup.normal]
    assert curves.tensors[-1] in outputs
    assert curves.samples == len(setup.feeds) and curves.local is None
    ref = setup.outputs((), curves.tensors)
    for label, keep in configs.items():
        test = setup.outputs(keep, curves.tensors)
        assert len(curves.values[label]) == len(curves.nodes)
        for k, t in enumerate(curves.tensors):
            assert_cosine(curves.values[label][k], setup.pooled(ref, t), setup.pooled(test, t))
    # w1 is quantized, so the very first node already deviates
    assert curves.values["some"][0] < 1


def test_mse_curve_and_data_num(setup):
    curves = get_acc_error(setup.engine, {"one": ["c2_QuantizeLinear"]}, "mse", data_num=2,
                           local=False, progress=False)
    assert curves.samples == 2 and curves.metric == "mse"
    ref = setup.outputs((), curves.tensors)[:2]
    test = setup.outputs(["c2_QuantizeLinear"], curves.tensors)[:2]
    for k, t in enumerate(curves.tensors):
        r, q = setup.pooled(ref, t), setup.pooled(test, t)
        assert abs(math.sqrt(curves.values["one"][k]) - math.sqrt(_mse(r, q))) <= DELTA
    # nothing upstream of c2's pair changes
    before = curves.nodes.index("add2")
    assert all(v == 0 for v in curves.values["one"][:before]) and curves.values["one"][before] > 0


def test_config_forms(setup):
    engine = setup.engine
    weights = [n for n in engine.calib_names if setup.kind(n) == "weight"]
    acts = [n for n in engine.calib_names if setup.kind(n) == "activation"]
    assert len(weights) == 6 and len(acts) == 10
    assert configs_from(engine, ["weight", "activation"]) == {"weight only": weights, "activation only": acts}
    assert configs_from(engine, non_quantize_node=["weight"]) == {"all but weight": acts}
    assert configs_from(engine) == {"all quantized": list(engine.calib_names)}
    conv2_inputs = ["r1_QuantizeLinear", "w2_QuantizeLinear", "b2_DequantizeLinear"]
    one_each = configs_from(engine, ["c2_QuantizeLinear", "conv2"])
    assert list(one_each) == ["c2_QuantizeLinear", "conv2"]
    assert one_each["c2_QuantizeLinear"] == ["c2_QuantizeLinear"]
    assert sorted(one_each["conv2"]) == sorted(conv2_inputs)
    grouped = configs_from(engine, [["c2_QuantizeLinear", "conv2"], ["fc"]])
    assert sorted(grouped["c2_QuantizeLinear+conv2"]) == sorted(conv2_inputs + ["c2_QuantizeLinear"])
    assert sorted(grouped["fc"]) == ["bf_DequantizeLinear", "f_QuantizeLinear", "wf_QuantizeLinear"]
    inverted = configs_from(engine, non_quantize_node=[["conv2", "c2_QuantizeLinear"]])
    assert sorted(inverted["all but conv2+c2_QuantizeLinear"]) == sorted(
        set(engine.calib_names) - set(conv2_inputs) - {"c2_QuantizeLinear"})
    # configs keep the engine's order, so their labels and contents are reproducible
    assert all(v == [n for n in engine.calib_names if n in v] for v in grouped.values())
    with pytest.raises(PTQError, match="not both"):
        configs_from(engine, ["weight"], ["activation"])
    with pytest.raises(PTQError, match="unknown node 'conv_2'.*'conv2'"):
        configs_from(engine, ["conv_2"])
    # a model file, as every other function takes: it crashed on a str's missing attributes
    from_file = configs_from(str(engine.qmodel.path), ["weight", "activation"])
    assert from_file["activation only"] == acts  # without the float model the biases stay as stored
    assert from_file["weight only"] == [n for n in weights if not n.startswith("b")]
    with pytest.raises(PTQError, match="get_acc_error needs an Engine"):
        get_acc_error(str(engine.qmodel.path), {"w": weights})


def _fake_quant(x, scale, zp, axis=None):
    """QuantizeLinear then DequantizeLinear in numpy (round half to even, saturate)."""
    info = np.iinfo(zp.dtype)
    s, z = scale.astype(np.float32), zp.astype(np.float32)
    if s.size > 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    q = np.clip(np.rint(x / s) + z, info.min, info.max)
    return ((q - z) * s).astype(np.float32)


def _params(setup, name):
    q, dqs = setup.pairs[name]
    node = q or dqs[0]
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return setup.inits[node.input[1]], setup.inits[node.input[2]], axis


def test_local_error_equals_a_single_node_recomputed_by_hand(setup):
    curves = get_acc_error(setup.engine, {"all": list(setup.engine.calib_names)}, "cosine-similarity",
                           progress=False)
    k = curves.nodes.index("conv2")
    fed = {n.name for n in setup.normal if any(i in {d.output[0] for _, ds in setup.pairs.values() for d in ds}
                                               for i in n.input)}
    assert [v is not None for v in curves.local] == [n in fed for n in curves.nodes]

    # conv2 alone, fed its float input and weight fake-quantized with the model's own pairs
    conv = next(n for n in setup.normal if n.name == "conv2")
    floats = setup.outputs((), ["r1", "c2"])
    w = _fake_quant(setup.inits["w2"], *_params(setup, "w2_QuantizeLinear"))
    bq = setup.pairs["b2_DequantizeLinear"][1][0]
    b = (setup.inits[bq.input[0]].astype(np.float32) * setup.inits[bq.input[1]]).astype(np.float32)
    single = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], **{a.name: helper.get_attribute_value(a)
                                                            for a in conv.attribute})],
        "conv2", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("x", "w", "b")],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)])
    x_params = _params(setup, "r1_QuantizeLinear")
    local = [builders.run_model(single, {"x": _fake_quant(f["r1"], *x_params), "w": w, "b": b})["y"]
             for f in floats]
    r = np.concatenate([f["c2"].ravel() for f in floats]).astype(np.float64)
    t = np.concatenate([y.ravel() for y in local]).astype(np.float64)
    assert_cosine(curves.local[k], r, t)
    assert curves.local[k] < 1


def test_running_mean():
    values = [1.0, 0.5, 0.9, 0.2]
    assert running_mean(values) == pytest.approx(np.cumsum(values) / np.arange(1, 5))
    assert all(type(v) is float for v in running_mean(values))  # plain data, as the results promise


def test_plot_writes_a_png(setup, tmp_path):
    curves = plot_acc_error(tmp_path / "plots", setup.data, setup.engine,
                            quantize_node=["weight", "activation"], average_mode=True, progress=False)
    # the average of the default figure: a file of its own, not the default one overwritten
    png = tmp_path / "plots" / "acc_error_weight-only_activation-only_average.png"
    assert curves.png == str(png) and curves.average_mode
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert list(curves.values) == ["weight only", "activation only"]
    json.dumps(curves.to_dict())  # JSON-safe
    curves2 = plot_acc_error(tmp_path / "plots", setup.data, setup.engine,
                             non_quantize_node=[["conv2", "fc"]], local=False, progress=False,
                             filename="nq.png")
    assert (tmp_path / "plots" / "nq.png").stat().st_size > 10_000 and curves2.local is None
    curves3 = plot_acc_error(tmp_path / "plots", setup.data, setup.engine, quantize_node=["weight", "activation"],
                             metric="mse", local=False, progress=False)
    assert Path(curves3.png).name == "acc_error_weight-only_activation-only_mse.png"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "acc_error_weight-only_activation-only_average.png", "acc_error_weight-only_activation-only_mse.png",
        "nq.png"]


_MEMORY_SCRIPT = """
import resource, sys
from pytest_ptq.curves import configs_from, get_acc_error
from pytest_ptq.engine import Engine
engine = Engine(sys.argv[1], sys.argv[2], data_num=int(sys.argv[3]))
get_acc_error(engine, configs_from(engine, ["weight", "activation"]), progress=False)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_curve_memory_does_not_grow_with_data_num(tmp_path):
    fpath = builders.conv_net(tmp_path / "big.onnx", channels=32, size=128)
    data = builders.samples(32, size=128)
    qpath = builders.quantize(fpath, tmp_path / "big_q.onnx", {"x": data["x"][:4]})
    folder = builders.save_folder(data, tmp_path / "calib")

    def peak_kib(n):
        # a fresh interpreter per measurement: ru_maxrss never goes down within a process
        out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(qpath), str(folder), str(n)],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout.split()[-1])

    one, many = peak_kib(1), peak_kib(32)
    print(f"peak RSS of a cumulative curve: data_num=1 {one / 1024:.1f} MiB, data_num=32 {many / 1024:.1f} MiB, "
          f"ratio {many / one:.3f}")
    assert many <= 1.5 * one


def test_average_mode_plots_the_running_mean(setup, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    drawn = {}
    original = Axes.plot

    def record(self, x, y, *args, **kwargs):
        drawn[kwargs.get("label")] = list(y)
        return original(self, x, y, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", record)
    for average in (False, True):
        curves = plot_acc_error(tmp_path, setup.data, setup.engine, quantize_node=["activation"],
                                average_mode=average, local=False, progress=False, filename=f"{average}.png")
        values = curves.values["activation only"]
        want = np.cumsum(values) / np.arange(1, len(values) + 1) if average else values
        assert drawn["activation only"] == pytest.approx(list(want), rel=1e-12)
        # and returned: the seed's average mode outputs the average cumulative error
        assert (curves.means is not None) == average
        if average:
            assert curves.means["activation only"] == pytest.approx(list(want), rel=1e-12)
            assert json.loads(json.dumps(curves.to_dict()))["means"]["activation only"] == pytest.approx(list(want))


def test_marked_points_are_numbered_without_overlapping_labels():
    """The worst points of a curve often sit side by side (the last operators): their
    numbers must not pile onto each other, and the names go to the side panel."""
    from pytest_ptq.figures import mark_points, pyplot, with_side_panel

    plt = pyplot()
    fig, ax, side = with_side_panel(plt, (12.5, 5.5))
    x = np.arange(180)
    ax.plot(x, 1 - 0.001 * (x % 7))
    points = [(172, 0.96), (173, 0.9601), (174, 0.9602), (175, 0.9603)]
    assert mark_points(ax, points) == [1, 2, 3, 4]
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts]
    assert len(boxes) == 4
    for i in range(4):
        for j in range(i + 1, 4):
            assert not boxes[i].overlaps(boxes[j]), (i, j)
    plt.close(fig)


def test_a_long_legend_label_wraps_inside_the_side_panel():
    """suggest's "re-quantized with onnxruntime, on confirmation samples" ran off the figure's
    right edge; the text below the legend starts under its last line."""
    from pytest_ptq.figures import pyplot, side_legend, side_text, with_side_panel

    plt = pyplot()
    fig, ax, side = with_side_panel(plt, (11, 5.2), ratio=(3.0, 1.25))
    ax.plot([0, 1], [0, 1], label="greedy on the search samples (mixed)")
    ax.scatter([1], [1], label="re-quantized with onnxruntime, on confirmation samples, and then some more words")
    below = side_legend(side, ax)
    side_text(side, ["greedy additions, in order:", " 1 a_node 0.9999"], top=below)
    fig.canvas.draw()
    legend = side.get_legend().get_window_extent()
    text = side.texts[-1].get_window_extent()
    assert legend.x1 <= fig.bbox.width and text.x1 <= fig.bbox.width
    assert text.y1 <= legend.y0 and len(side.get_legend().get_texts()[1].get_text().splitlines()) >= 2
    plt.close(fig)


def test_side_panel_names_that_share_onnxruntimes_suffix_stay_apart():
    """``onnx::Conv_4202_DequantizeLinear`` and ``..._5868_...`` both read
    ``onnx::C~DequantizeLinear``: the end kept was the suffix they share."""
    from pytest_ptq.figures import fit_labels

    names = ["onnx::Conv_4202_DequantizeLinear", "onnx::Conv_5868_DequantizeLinear", "x_QuantizeLinear",
             "all but model/tf.math.maximum/Maximum:0_QuantizeLinear",
             "all but model/tf.math.maximum_4/Maximum:0_QuantizeLinear"]
    for width in (16, 24):
        labels = fit_labels(names, width)
        assert len(set(labels)) == len(names) and all(len(x) <= width for x in labels), labels
    assert fit_labels(names, 24)[:3] == ["onnx::Conv_4202~", "onnx::Conv_5868~", "x_QuantizeLinear"]
    assert fit_labels(["a", "b"], 24) == ["a", "b"]


def test_side_panel_names_that_differ_in_their_middle_stay_apart():
    """Names that share a long start and a long end read the same once cut
    ('/backbone/stage4/block10~' twice): what differs is kept, with what surrounds it."""
    from pytest_ptq.figures import fit_labels

    names = [f"/backbone/stage4/block{b}/attention/output/{part}/MatMul" for b in (10, 3) for part in ("dense", "proj")]
    names += [f"/backbone/stage{s}/block1/output/LayerNorm/{op}_output_0_QuantizeLinear" for s in (2, 3)
              for op in ("scale_Mul", "residual_Add")]
    names += names[:1] + ["/backbone/stage4/block1", "/backbone/stage4/block1" + "x" * 60]
    for width in (12, 16, 26):
        labels = fit_labels(names, width)
        # a name shown twice reads the same; different names differ, within the width
        assert len(set(labels)) == len(set(names)) and labels[0] == labels[len(names) - 3], (width, labels)
        assert all(len(x) <= width for x in labels), labels



def test_a_label_keeps_eight_characters_however_little_room_a_caller_leaves():
    """A narrow panel's 12 characters less a caller's index and value columns left a name one
    character or none ('/~', 'c~ #2'): a label keeps 8, each piece of it between cuts a piece of
    its name in order, the names told apart."""
    from pytest_ptq.figures import fit_labels

    names = ["/backbone/stage4/block10/attention/output/dense/MatMul",
             "/backbone/stage4/block3/attention/output/dense/MatMul",
             "conv1_weight_DequantizeLinear", "conv2_weight_DequantizeLinear"]
    for width in (-3, 0, 1, 5):
        labels = fit_labels(names, width)
        assert len(set(labels)) == len(names) and all(len(x) <= 8 for x in labels), (width, labels)
        for label, name in zip(labels, names):
            shown = label.split(" #")[0]
            assert len(shown.replace("~", "")) >= 4, (width, labels)  # '/~' showed one
            at = 0
            for piece in (p for p in shown.split("~") if p):
                at = name.index(piece, at) + len(piece)  # raises where a piece is not the name's, in order

def test_plot_names_the_worst_points_beside_the_axes(tmp_path):
    from pytest_ptq.curves import Curves, plot_curves

    nodes = [f"Conv@{k}" for k in range(30)]
    values = {"weight only": [1 - 0.001 * k for k in range(30)], "all quantized": [1 - 0.002 * k for k in range(30)]}
    curves = Curves(metric="cosine-similarity", nodes=nodes, tensors=nodes, values=values, configs={}, samples=1)
    png = plot_curves(curves, tmp_path / "c.png")
    assert png.exists()


def test_a_flat_curve_marks_no_worst_point():
    """Weights stored quantized without the float model: the weight-only curve is all 1 and
    its first points are no one's worst."""
    from pytest_ptq.curves import Curves, marked

    values = {"weight only": [1.0] * 6, "all quantized": [1.0, 0.99, 0.999, 0.98, 1.0, 0.995]}
    curves = Curves(metric="mse", nodes=list("abcdef"), tensors=list("abcdef"),
                    values={k: [1 - v for v in vals] for k, vals in values.items()}, configs={}, samples=1)
    for metric, vals in (("mse", curves.values), ("cosine-similarity", values)):
        curves.metric, curves.values = metric, vals
        points = marked(curves)
        assert sorted(points) == [1, 3, 5]
        assert all(p == [("all quantized", vals["all quantized"][i])] for i, p in points.items())


def test_points_without_a_value_are_no_worst_points_and_are_counted(tmp_path, monkeypatch):
    """NaN sorts worst: a transformer's curves with three or more operators of no finite float
    value (shape arithmetic, a -inf attention mask) marked nothing, the panel read "worst
    points:" and nothing under it."""
    from pytest_ptq import curves as module
    from pytest_ptq.curves import Curves, marked, plot_curves

    nan = float("nan")
    curves = Curves(metric="cosine-similarity", nodes=list("abcdefg"), tensors=list("abcdefg"),
                    values={"all": [nan, 0.99, nan, 0.95, nan, 0.999, nan]}, configs={}, samples=1)
    assert sorted(marked(curves)) == [1, 3]  # the best, 0.999, is no one's worst
    figures, save = [], module.save_figure
    monkeypatch.setattr(module, "save_figure", lambda fig, path, tight=True: figures.append(fig) or save(fig, path, tight))
    plot_curves(curves, tmp_path / "c.png")
    side = " ".join(t.get_text() for t in figures[0].axes[1].texts)
    assert "4 operator(s) without a value" in side and " d (#3)" in side, side


@pytest.mark.parametrize("segments,memory", [(2, "fast"), (64, "fast"), (64, "low")])
def test_segment_by_segment_equals_one_session_exposing_every_node(zoo, segments, memory):
    """Curves computed segment by segment (each exposing its own nodes; with 64 segments,
    one node each, so a local clone reads a float input computed segments before) equal
    those of one session exposing every node, local errors included, in either memory mode
    (low: weights quantized at run time)."""
    qpath, fpath, data = zoo.qdq("qdq_pc"), zoo.float("qdq_pc"), zoo.data("qdq_pc")
    whole = Engine(qpath, data, float_model=fpath, optimization="disable", segments=0)
    parted = Engine(qpath, data, float_model=fpath, optimization="disable", segments=segments, memory=memory)
    configs = {"none": [], "c2": ["c2_QuantizeLinear"], "late": ["f_QuantizeLinear", "wf_QuantizeLinear"],
               "all": list(whole.calib_names)}
    want = get_acc_error(whole, configs, "cosine-similarity", progress=False)
    got = get_acc_error(parted, configs, "cosine-similarity", progress=False)
    assert whole.probe_parts(got.tensors) == 1
    # parts: the segments, those computing more than a 16th of the bytes cut further
    parts = parted.probe_parts(got.tensors)
    assert parts >= len(parted.segments) >= min(segments, 10) and (segments > 2 or parts > 2)
    assert got.tensors == want.tensors and got.samples == want.samples
    for label in configs:
        np.testing.assert_allclose(got.values[label], want.values[label], rtol=0, atol=1e-6, err_msg=label)
    assert [v is None for v in got.local] == [v is None for v in want.local]
    np.testing.assert_allclose([v for v in got.local if v is not None], [v for v in want.local if v is not None],
                               rtol=0, atol=1e-6)
    assert min(want.values["all"]) < 1 - 1e-5 and want.values["none"] == [1.0] * len(want.nodes)


def test_arguments_that_would_draw_nothing_or_read_text_as_true_are_refused(setup, tmp_path):
    engine = setup.engine
    with pytest.raises(PTQError, match="quantize_node is empty; give 'weight', 'activation', node names"):
        plot_acc_error(tmp_path, model_or_file=engine, quantize_node=[], progress=False)
    with pytest.raises(PTQError, match="average_mode must be True or False, got 'no'"):
        plot_acc_error(tmp_path, model_or_file=engine, average_mode="no", progress=False)
    assert not any(tmp_path.iterdir())  # refused before anything was drawn
    for bad, words in ((dict(segments="x"), "segments must be a whole number"),
                       (dict(alternatives=5), "alternatives must map calibration nodes"),
                       (dict(check="no"), "check must be True or False"),
                       (dict(providers=["CPUExecutionProvider", 3]), "providers must be an execution provider's name")):
        with pytest.raises(PTQError, match=words):
            Engine(setup.qpath, setup.data, **bad)
    # one provider's name is that provider, not its letters
    assert Engine(setup.qpath, providers="CPUExecutionProvider").providers == ["CPUExecutionProvider"]


def test_average_mode_marks_the_nodes_the_command_line_names_and_labels_the_running_mean(tmp_path, monkeypatch):
    """--average numbered the running mean's first points (low only because they average few
    nodes) while the command line printed the node whose own value is worst, and the y label
    said plain "cosine-similarity"."""
    from pytest_ptq import curves as module
    from pytest_ptq.curves import Curves, marked, plot_curves

    figures, save = [], module.save_figure
    monkeypatch.setattr(module, "save_figure", lambda fig, path, tight=True: figures.append(fig) or save(fig, path, tight))
    raw = [0.98] + [1.0] * 28 + [0.9]  # the running mean is lowest at 0, the node at 29 is the worst
    nodes = [f"Conv@{k}" for k in range(30)]
    curves = Curves(metric="cosine-similarity", nodes=nodes, tensors=nodes, values={"all quantized": raw},
                    configs={}, samples=1, average_mode=True)
    assert [n for n, _ in curves.worst("all quantized", 2)] == ["Conv@29", "Conv@0"]
    assert marked(curves) == {29: [("all quantized", 0.9)], 0: [("all quantized", 0.98)]}
    plot_curves(curves, tmp_path / "c.png")
    ax, side = figures[0].axes
    assert ax.get_ylabel().startswith("running mean of cosine-similarity")
    numbers = {t.get_text(): t.xy for t in ax.texts}
    mean = running_mean(raw)
    assert numbers["1"] == (29, pytest.approx(mean[29])) and numbers["2"] == (0, pytest.approx(mean[0]))
    panel = side.texts[-1].get_text()
    assert "not the mean" in panel and "Conv@29 (#29)" in panel and " 0.9\n" in panel + "\n"


def test_characters_no_installed_font_has_are_escaped_so_names_stay_apart(tmp_path, monkeypatch):
    """Without a CJK font, /模型/卷积 and /模型/池化 drew as rows of the same empty boxes."""
    from pytest_ptq import curves as module
    from pytest_ptq.curves import Curves, plot_curves
    from pytest_ptq.figures import _advance, drawable

    figures, save = [], module.save_figure
    monkeypatch.setattr(module, "save_figure", lambda fig, path, tight=True: figures.append(fig) or save(fig, path, tight))
    names = ["/模型/卷积", "/模型/池化"]
    curves = Curves(metric="cosine-similarity", nodes=["a", "b", "c"], tensors=["a", "b", "c"],
                    values={f"all but {n}": [1.0, 0.99, 0.98] for n in names}, configs={}, samples=1)
    plot_curves(curves, tmp_path / "c.png")
    ax, side = figures[0].axes
    # wrapped to the panel at a space or between a name's parts, as its width has it: compared
    # without the white space (a break at a space drops it, one after a '/' adds none)
    shown = ["".join(t.get_text().split()) for t in side.get_legend().get_texts()]
    if _advance("卷") is None:  # no font has the glyph: escaped, as Python writes it
        assert shown == ["allbut/\\u6a21\\u578b/\\u5377\\u79ef", "allbut/\\u6a21\\u578b/\\u6c60\\u5316"]
    else:
        assert shown == [f"allbut{n}" for n in names]
    texts = [t.get_text() for t in figures[0].findobj(lambda a: hasattr(a, "get_text"))]
    assert all(_advance(ch) is not None for text in texts for ch in text if ch not in "\n\t")
    assert drawable("ß ñ é") == "ß ñ é"  # what DejaVu Sans has stays as it is


def test_node_names_with_dollar_signs_are_drawn_as_written(tmp_path, monkeypatch):
    """matplotlib reads text between two dollar signs as a formula: a node named ``price$_$``
    failed to draw (the plot, and the plugin's report with it, lost to a parse error), and
    ``conv$1$`` drew as an italic 1."""
    from matplotlib.text import Text

    from pytest_ptq import curves as module
    from pytest_ptq.curves import Curves, plot_curves

    figures, save = [], module.save_figure
    monkeypatch.setattr(module, "save_figure", lambda fig, path, tight=True: figures.append(fig) or save(fig, path, tight))
    names = ["price$_$", "conv$1$", "a$\\u$b"]
    curves = Curves(metric="cosine-similarity", nodes=names, tensors=names,
                    values={f"all but {n}": [1.0, 0.99, 0.98] for n in names}, configs={}, samples=1)
    assert plot_curves(curves, tmp_path / "c.png").stat().st_size > 10_000
    texts = [t for t in figures[0].findobj(Text) if "$" in t.get_text()]
    assert texts and not any(t.get_parse_math() for t in texts)
    shown = " ".join(" ".join(t.get_text().split()) for t in texts)
    assert all(n in shown for n in names), shown


def test_a_long_title_wraps_instead_of_widening_the_figure(tmp_path):
    from PIL import Image

    from pytest_ptq.curves import plot_curves

    data = builders.samples(2)
    engine = Engine(builders.quantize(builders.conv_net(tmp_path / "f.onnx"), tmp_path / "q.onnx", data), data)
    curves = get_acc_error(engine, configs_from(engine), progress=False)
    short = plot_curves(curves, tmp_path / "short.png", title="Cumulative cosine vs float, m.onnx")
    long = plot_curves(curves, tmp_path / "long.png", title="Cumulative cosine vs float, " +
                       "/a/long/path/to/the/models/" * 8 + "m.onnx, 2 sample(s)")
    with Image.open(short) as a, Image.open(long) as b:
        # as wide, to a few pixels (the one line ran 2000 px past the figure), and a few lines taller
        assert b.size[0] <= a.size[0] + 40 and b.size[1] > a.size[1]


def test_the_local_error_of_a_concatenated_output_is_its_worst_part_as_everywhere_else(tmp_path):
    """A detector head's Concat writes boxes in pixels beside class scores: its local error
    was the whole tensor's, which the boxes dominate (0.999998), while its curve point, the
    rankings and the verdict score the output by part (the classes). Read, like its point,
    after its own pair on the output: in pixels, that pair's one scale leaves the classes few
    codes."""
    f = builders.detector_head_net(tmp_path / "f.onnx")
    data = builders.samples(n=5, size=8, seed=5)
    q = builders.quantize(f, tmp_path / "q.onnx", data, keep_float=True)
    engine = Engine(str(q), data, float_model=str(f))
    curves = get_acc_error(engine, configs_from(engine), progress=False)
    head = engine.qmodel.normal["head_concat"]
    assert head.calibration_outputs  # quantize_static's pair on the model output: the Concat's own
    only = builders.rewire(q, keep=head.calibration_inputs + head.calibration_outputs, float_model=f)
    feeds = [{"x": x} for x in data["x"]]
    ref = [builders.run_model(f, fd)["out"] for fd in feeds]
    got = [builders.run_model(only, fd)["out"] for fd in feeds]
    parts = [builders.pooled_cosine([r[:, rows] for r in ref], [g[:, rows] for g in got])
             for rows in (slice(0, 4), slice(4, None))]
    whole = builders.pooled_cosine(ref, got)
    assert min(parts) < whole - 1e-5  # the parts tell apart what the whole does not
    assert curves.local[curves.nodes.index("head_concat")] == pytest.approx(min(parts), abs=1e-7)


def _conv_head(tmp_path, tail):
    """x -> Q/DQ -> Conv(W Q/DQ) -> c, then ``tail(inits, nodes)`` (returns the model outputs
    as value infos) on c; saved as q.onnx, with five samples."""
    from onnx import TensorProto

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W")]
    nodes = []
    w = builders.add_pair(inits, nodes, "W", 0.01, np.int8(0))
    x = builders.add_pair(inits, nodes, "x", 0.03, np.uint8(128))
    nodes.append(helper.make_node("Conv", [x, w], ["c"], pads=[1] * 4, name="conv"))
    outputs = tail(inits, nodes)
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "q.onnx"))
    data = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(5)]}
    return tmp_path / "q.onnx", data


def test_a_node_whose_pairs_write_several_outputs_is_read_at_each_as_the_rankings_credit_it(tmp_path, capsys):
    """A Split whose outputs each pass a pair to a model output: its point read the first
    output only, so its second pair, which the ranking credits to the Split, left its point at
    1.0; and a pair on c that writes a model output and feeds a Relu was said to be ranked on
    its own, where the ranking credits it to the Relu."""
    from onnx import TensorProto

    from pytest_ptq.cli import main
    from pytest_ptq.curves import unplotted_outputs
    from pytest_ptq.sensitivity import get_sensitivity_of_nodes

    def tail(inits, nodes):
        nodes.append(helper.make_node("Split", ["c"], ["s1", "s2"], axis=1, num_outputs=2, name="split"))
        builders.add_pair(inits, nodes, "s1", 0.05, np.int8(0), out="y1")
        builders.add_pair(inits, nodes, "s2", 0.3, np.int8(0), out="y2")
        builders.add_pair(inits, nodes, "c", 0.1, np.int8(0), out="yc")
        nodes.append(helper.make_node("Relu", ["yc"], ["z"], name="relu"))
        return [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 2 if t[1:] in "12" else 4, 8, 8])
                for t in ("y1", "y2", "yc", "z")]

    q, data = _conv_head(tmp_path, tail)
    engine = Engine(str(q), data, optimization="disable")
    ranking = get_sensitivity_of_nodes(engine, progress=False)
    pairs = list(builders.qdq_pairs(q))
    configs = {**{p: [p] for p in pairs}, "split's": ranking.details["split"]["calibration_nodes"], "all": pairs}
    curves = get_acc_error(engine, configs, local=False, progress=False)
    k = curves.nodes.index("split")
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(builders.rewire(q), feeds, outputs=["y1", "y2"])
    for label, keep in configs.items():
        got = builders.run_model(builders.rewire(q, keep=set(keep)), feeds, outputs=["y1", "y2"])
        assert curves.values[label][k] == pytest.approx(builders.worst_cosine(ref, got), abs=1e-6), label
    assert curves.read(k) == ["y1", "y2"] and curves.tensors[k] == "y1"
    assert "s2_Q" in ranking.details["split"]["calibration_nodes"] and curves.values["s2_Q"][k] < 1 - 1e-4
    assert curves.values["split's"][k] == pytest.approx(ranking["split"]["cosine-similarity"], abs=1e-9)
    # yc: no point reads it; its pair is the Relu's in the ranking, not a row of its own
    assert "c_Q" in ranking.details["relu"]["calibration_nodes"] and "c_Q" not in ranking
    notes = unplotted_outputs(engine, curves)
    assert notes == {"yc": "written by pair 'c_Q' on 'c', whose error the rankings credit to node 'relu', whose "
                           "input it quantizes"}
    builders.save_folder(data, tmp_path / "calib")
    assert main(["plot-acc-error", str(q), str(tmp_path / "calib"), "-s", str(tmp_path / "c"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"at the outputs y1 / y2 (the worst) {curves.values['all'][k]:.6g}" in out, out
    assert "no point for output 'yc': written by pair 'c_Q' on 'c', whose error the rankings credit to node " \
           "'relu'" in out, out


def test_an_output_cast_from_an_operators_is_that_operators_point(tmp_path):
    """Conv -> Cast(float16) -> Cast(float32) -> model output: the curves' note said no
    operator computes it; the Conv does, and its point reads that output, after the Casts,
    as the rankings score it."""
    from onnx import TensorProto

    from pytest_ptq.curves import unplotted_outputs

    def tail(inits, nodes):
        nodes.append(helper.make_node("Cast", ["c"], ["h"], to=TensorProto.FLOAT16, name="cast16"))
        nodes.append(helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT, name="cast32"))
        nodes.append(helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16, name="cast_in"))
        return [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
                helper.make_tensor_value_info("xh", TensorProto.FLOAT16, [1, 4, 8, 8])]

    q, data = _conv_head(tmp_path, tail)
    engine = Engine(str(q), data, optimization="disable")
    pairs = list(builders.qdq_pairs(q))
    curves = get_acc_error(engine, {"all": pairs}, local=False, progress=False)
    assert curves.nodes == ["conv"] and curves.tensors == ["y"]
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(builders.rewire(q), feeds, outputs=["y"])
    got = builders.run_model(builders.rewire(q, keep=set(pairs)), feeds, outputs=["y"])
    assert curves.values["all"][0] == pytest.approx(builders.worst_cosine(ref, got), abs=1e-6)
    assert unplotted_outputs(engine, curves) == {
        "xh": "a graph input passed through Cast 'cast_in' only, the same in every config"}


def test_an_operators_output_beside_its_own_pairs_names_that_operator(tmp_path):
    """Conv output c is a model output, and so is its pair's y: the Conv's point reads y (what
    its pair delivers); the note on c said no operator computes it."""
    from onnx import TensorProto

    from pytest_ptq.curves import unplotted_outputs

    def tail(inits, nodes):
        builders.add_pair(inits, nodes, "c", 0.2, np.int8(0), out="y")
        return [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4, 8, 8]) for t in ("c", "y")]

    q, data = _conv_head(tmp_path, tail)
    engine = Engine(str(q), data, optimization="disable")
    pairs = list(builders.qdq_pairs(q))
    curves = get_acc_error(engine, {"all": pairs}, local=False, progress=False)
    assert curves.tensors == ["y"]
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(builders.rewire(q), feeds, outputs=["y"])
    got = builders.run_model(builders.rewire(q, keep=set(pairs)), feeds, outputs=["y"])
    assert curves.values["all"][0] == pytest.approx(builders.worst_cosine(ref, got), abs=1e-6)
    assert unplotted_outputs(engine, curves) == {
        "c": "computed by node 'conv'; the curves read 'conv' at tensor 'y', after its pair 'c_Q'"}


@pytest.mark.parametrize("tail,segments", [(None, 0), (None, 64), ("cast", 0), ("cast_before", 64), ("constant", 64)])
def test_the_local_error_of_a_node_owning_an_output_pair_is_read_after_it(tmp_path, tail, segments):
    """Conv -> c -> its own pair -> model output y (a detector head's layout): the Conv's point
    reads y, its local error read c, before the pair (0.99989 against 0.99859 fully quantized,
    all of the difference its own pair's), so runall called its error inherited. Now its local
    error is y from its inputs quantized from float values through its own pair, in a plain
    session of the model keeping those pairs only, also through a Cast to float16 after or
    before the pair, with the pair's scale a Constant written after the Conv, and one node a
    segment (the pair in a later part than the Conv)."""
    q, data = builders.owned_output_net(tmp_path / "q.onnx", tail=tail)
    engine = Engine(str(q), data, optimization="disable", segments=segments)
    pairs = list(builders.qdq_pairs(q))
    curves = get_acc_error(engine, {"all": pairs}, progress=False)
    out = "yh" if tail == "cast" else "y"
    k = curves.nodes.index("conv2")
    assert curves.read(k) == [out]
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(builders.rewire(q), feeds, outputs=[out])
    own = builders.run_model(builders.rewire(q, keep={"c1_Q", "W2_Q", "c_Q"}), feeds, outputs=[out])
    inputs_only = builders.run_model(builders.rewire(q, keep={"c1_Q", "W2_Q"}), feeds, outputs=[out])
    every = builders.run_model(builders.rewire(q, keep=set(pairs)), feeds, outputs=[out])
    assert curves.local[k] == pytest.approx(builders.worst_cosine(ref, own), abs=1e-6)
    assert curves.values["all"][k] == pytest.approx(builders.worst_cosine(ref, every), abs=1e-6)
    # the output pair's loss is most of it: read before the pair, the local error left it out
    assert builders.worst_cosine(ref, own) < builders.worst_cosine(ref, inputs_only) - 5e-4
    # conv1 owns no output pair: still its output with its inputs quantized only
    c1 = builders.run_model(builders.rewire(q, keep={"x_Q", "W1_Q"}, outputs=["c1"]), feeds, outputs=["c1"])
    c1_ref = builders.run_model(builders.rewire(q, outputs=["c1"]), feeds, outputs=["c1"])
    assert curves.local[curves.nodes.index("conv1")] == pytest.approx(builders.worst_cosine(c1_ref, c1), abs=1e-6)


@pytest.mark.parametrize("tail,segments", [(None, 0), (None, 64), ("cast", 0), ("cast_before", 64), ("constant", 64)])
def test_a_node_with_float_inputs_owning_an_output_pair_has_that_pairs_local_error(tmp_path, tail, segments):
    """conv1 -> c1 -> conv2 (float input and weight) -> c -> its own pair -> model output: the
    pair's loss is conv2's own, yet conv2 had no local error (None, no marker, runall's
    origin blank), as it reads no pair. Its local error is now its output from float inputs
    through its own pair: a plain session of the model keeping that pair only (0.99878 against
    0.99871 fully quantized on the plain tail), through a Cast to float16 after or before the
    pair, a Constant scale, one node a segment."""
    q, data = builders.owned_output_net(tmp_path / "q.onnx", tail=tail, float_inputs=True)
    engine = debug.Engine(str(q), data, optimization="disable", segments=segments)
    pairs = list(builders.qdq_pairs(q))
    curves = debug.get_acc_error(engine, {"all": pairs}, progress=False)
    out = "yh" if tail == "cast" else "y"
    k = curves.nodes.index("conv2")
    assert curves.read(k) == [out]
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(builders.rewire(q), feeds, outputs=[out])
    own = builders.run_model(builders.rewire(q, keep={"c_Q"}), feeds, outputs=[out])
    every = builders.run_model(builders.rewire(q, keep=set(pairs)), feeds, outputs=[out])
    assert curves.local[k] == pytest.approx(builders.worst_cosine(ref, own), abs=1e-6)
    assert curves.values["all"][k] == pytest.approx(builders.worst_cosine(ref, every), abs=1e-6)
    assert builders.worst_cosine(ref, own) > builders.worst_cosine(ref, every) + 1e-5  # conv1's error not in it


@pytest.mark.parametrize("segments", [0, 64])
def test_an_operator_cast_to_a_float16_model_output_is_read_as_the_rankings_score_it(tmp_path, segments):
    """Conv -> c -> Cast(float16) -> model output: the Conv's point and local error read c,
    before the Cast (chebyshev 0.0703674), while its ranking scores the float16 output the model
    delivers (0.0703125). Both now read that output, the local error through a copy of the
    Cast: what a plain session gives there, keeping the Conv's pairs, and the ranking's value."""
    from onnx import TensorProto

    def tail(inits, nodes):
        nodes.append(helper.make_node("Cast", ["c"], ["yh"], to=TensorProto.FLOAT16, name="to16"))
        return [helper.make_tensor_value_info("yh", TensorProto.FLOAT16, [1, 4, 8, 8])]

    q, data = _conv_head(tmp_path, tail)
    engine = debug.Engine(str(q), data, optimization="disable", segments=segments)
    pairs = list(builders.qdq_pairs(q))
    curves = debug.get_acc_error(engine, {"all": pairs}, metric="chebyshev", progress=False)
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(builders.rewire(q), feeds)
    got = builders.run_model(builders.rewire(q, keep=set(pairs)), feeds)
    brute = max(float(np.abs(r["yh"].astype(np.float64) - g["yh"]).max()) for r, g in zip(ref, got))
    ranked = debug.get_sensitivity_of_nodes(engine, ["chebyshev"], node_type="node", progress=False)
    assert curves.tensors == ["yh"]
    assert curves.values["all"][0] == pytest.approx(brute, abs=1e-9)
    assert curves.local[0] == pytest.approx(brute, abs=1e-9)  # nothing upstream of the Conv
    assert ranked["conv"]["chebyshev"] == pytest.approx(brute, abs=1e-9)


def _drawn_curves(monkeypatch, tmp_path, curves):
    """The figure plot_curves draws, kept as it is saved."""
    import pytest_ptq.curves as curves_module
    from pytest_ptq.curves import plot_curves

    kept = []
    real_save = curves_module.save_figure

    def save(fig, path, tight=True):
        kept.append(fig)
        return real_save(fig, path, tight=tight)

    monkeypatch.setattr(curves_module, "save_figure", save)
    plot_curves(curves, tmp_path / "c.png")
    fig = kept[0]
    fig.canvas.draw()
    return fig


def test_side_panel_names_keep_what_tells_scoped_names_apart(monkeypatch, tmp_path):
    """ModelOpt-style names of a 500-node model ('/backbone/stage4/block3/conv1/Conv') read
    '/backbon~block3/conv1/Conv': the stage, where the worst points differ, was cut away, and the
    panel had room for more than it showed."""
    from pytest_ptq.curves import Curves

    nodes = [f"/backbone/stage{s}/block{b}/conv{c}/Conv" for s in range(1, 6) for b in range(1, 16) for c in range(1, 4)]
    nodes += [f"/backbone/stage{s}/block{b}/scale/Mul" for s in range(1, 6) for b in range(1, 16)]
    worst = [nodes.index(f"/backbone/stage{s}/block3/conv1/Conv") for s in (2, 4, 5)]
    values = {"weight only": [0.5 if k in worst else 1.0 - 1e-4 * (k % 5) for k in range(len(nodes))],
              "all but batch_norm_4.tmp_2_QuantizeLinear": [1.0 - 1e-4 * (k % 7) for k in range(len(nodes))]}
    curves = Curves(metric="cosine-similarity", nodes=nodes, tensors=nodes, values=values, configs={}, samples=1)
    fig = _drawn_curves(monkeypatch, tmp_path, curves)
    side = fig.axes[1]
    panel = side.get_window_extent()
    text = side.texts[-1]
    assert text.get_window_extent().x1 <= panel.x1 + 1, "the side text runs past the panel"
    lines = text.get_text().splitlines()
    for s in (2, 4, 5):  # each worst point's line says its stage and block, the part its name differs in
        assert any(f"stage{s}/block3/conv1/Conv" in line for line in lines), (s, lines)
    # a config's name uses the room the value lines have ('all but~ngLinear' said little)
    shown = [line.split()[:-1] for line in lines if line.startswith("   all")]
    assert shown and all(len(" ".join(words)) > 24 for words in shown), lines
    # the legend wraps a long name between its parts (after '_' or '.'), not inside a word
    legend = side.get_legend()
    assert legend.get_window_extent().x1 <= fig.bbox.x1
    label = next(t.get_text() for t in legend.get_texts() if "batch_norm" in t.get_text())
    assert label.replace("\n", "") == "all but batch_norm_4.tmp_2_QuantizeLinear"
    assert all(line[-1] in " _./" for line in label.splitlines()[:-1]), label


def test_a_shared_scope_is_cut_only_as_far_as_the_width_needs():
    """The worst points of one stage ('/backbone/stage4/block3/conv1/Conv', ...) lost their
    stage once the whole shared scope was cut; the parts cut are those that make them fit."""
    from pytest_ptq.figures import fit_labels

    names = [f"/backbone/stage4/block{b}/conv{c}/Conv" for b, c in ((3, 1), (2, 2), (2, 3))]
    labels = fit_labels(names, 29)
    for name, label in zip(names, labels):
        assert label.startswith("~") and name.endswith(label[1:]) and "stage4" in label, labels
        assert len(label) <= 29
    assert fit_labels(names, 40) == names

"""Half-precision models and data: float16 graphs, bfloat16 and float8 arrays.

A float16 graph's float path can leave float16's range where its quantized form, clipped by
its pairs, does not; data for a float16 input can hold float32 values float16 cannot; and
ml_dtypes' arrays are numbers numpy stores but does not compute on. Each is told in one
sentence naming what to do, and what can be read is read as the values it holds.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, TypeProto, helper, numpy_helper

import builders

from pytest_ptq import debug as dbg
from pytest_ptq.data import load_data
from pytest_ptq.datacheck import check_data
from pytest_ptq.errors import NotFloatEquivalent, PTQError
from pytest_ptq.model import QuantModel
from pytest_ptq.remedy.requantize import infer_quantize_options
from pytest_ptq.remedy.search import suggest_remedy
from pytest_ptq.remedy.terms import onnxruntime_settings


def half_net(path, dtype=TensorProto.FLOAT16, seed=0):
    """x -> Q/DQ -> MatMul(Q/DQ weight) -> Q/DQ -> y, every float tensor and scale of
    ``dtype``; the output pair clips at +-127 * 0.5, far inside float16's range."""
    np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((16, 16)) * 2.0).astype(np_dtype)
    inits = [numpy_helper.from_array(w, "w")]
    nodes = []

    def pair(t, scale, name):
        inits.extend([numpy_helper.from_array(np.asarray(scale, np_dtype), f"{name}_s"),
                      numpy_helper.from_array(np.asarray(0, np.int8), f"{name}_z")])
        nodes.extend([helper.make_node("QuantizeLinear", [t, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_Q"),
                      helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_d"],
                                       name=f"{name}_DQ")])
        return f"{name}_d"

    x = pair("x", 4.0 / 127, "x")
    wd = pair("w", float(np.abs(w).max()) / 127, "w")
    nodes.append(helper.make_node("MatMul", [x, wd], ["m"], name="mm"))
    y = pair("m", 0.5, "m")
    nodes.append(helper.make_node("Identity", [y], ["y"], name="out"))
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", dtype, [1, 16])],
                              [helper.make_tensor_value_info("y", dtype, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.save(model, path)
    return path


def _samples(n=4, scale=1.0, seed=1):
    rng = np.random.default_rng(seed)
    return [(np.clip(rng.standard_normal((1, 16)), -3, 3) * scale).astype(np.float32) for _ in range(n)]


def test_float16_overflow_in_float_is_named_not_blamed_on_a_folded_relu(tmp_path):
    """Inputs of 20000 take the float MatMul past 65504 (infinite in float16) while the output
    pair clips the quantized one: the float16 graph overflows, which no folded Relu or wrong
    float model explains (what the message said before)."""
    model = half_net(tmp_path / "q16.onnx")
    data = {"x": [x.astype(np.float16) for x in _samples(scale=20000.0)]}
    # independently: the float path overflows, the quantized one does not
    feeds = {"x": data["x"][0]}
    assert not np.isfinite(builders.run_model(builders.rewire(model), feeds)["y"]).all()
    assert np.isfinite(builders.run_model(str(model), feeds)["y"]).all()
    with pytest.raises(PTQError) as err:
        dbg.get_sensitivity_of_nodes(model, calibrated_data=data, node_type="activation", progress=False)
    text = str(err.value)
    assert not isinstance(err.value, NotFloatEquivalent)
    assert "float16 graph overflows" in text and "'y'" in text and "65504" in text
    assert "Relu" not in text and "float model given" not in text


def test_float32_data_beyond_a_float16_inputs_range_is_refused_by_value(tmp_path):
    """1e5 in a float32 sample for a float16 input became Inf on the cast, with numpy's
    RuntimeWarning and a message counting NaN/Inf values the file does not hold."""
    model = half_net(tmp_path / "q16.onnx")
    xs = _samples()
    xs[1][0, 3] = 1e5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = load_data({"x": xs}, QuantModel(model))
        data.sample(0)
        with pytest.raises(PTQError, match=r"holds values .*\.\.100000 \(float32\), beyond the float16 the model "
                                           r"takes \(-65504\.\.65504\)") as err:
            data.sample(1)
    assert "NaN" not in str(err.value)


def test_bfloat16_and_float8_arrays_are_read_as_the_values_they_hold(tmp_path):
    """ml_dtypes' arrays (kind 'V') were refused as "not numbers"; they rank exactly as the
    float32 arrays of the same values do, and check-data agrees that they convert."""
    model = half_net(tmp_path / "q32.onnx", dtype=TensorProto.FLOAT)
    for extended in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        narrow = [x.astype(extended) for x in _samples()]
        wide = [x.astype(np.float32) for x in narrow]
        got = dbg.get_sensitivity_of_nodes(model, calibrated_data={"x": narrow}, node_type="activation", progress=False)
        want = dbg.get_sensitivity_of_nodes(model, calibrated_data={"x": wide}, node_type="activation", progress=False)
        assert list(got) == list(want) and all(got[n] == want[n] for n in want)
        report = check_data(model, {"x": narrow})
        dtype = [f for f in report.findings if f.check == "dtype"]
        assert [f.severity for f in dtype] == ["info"], dtype


def test_a_bfloat16_array_saved_with_np_save_is_refused_naming_the_fix(tmp_path):
    """np.save writes ml_dtypes' bfloat16 as raw 2-byte records ('|V2'), which read back
    without their type: the message says so and names astype(np.float32)."""
    model = half_net(tmp_path / "q32.onnx", dtype=TensorProto.FLOAT)
    (tmp_path / "data" / "x").mkdir(parents=True)
    for i, x in enumerate(_samples()):
        np.save(tmp_path / "data" / "x" / f"{i}.npy", x.astype(ml_dtypes.bfloat16))
    with pytest.raises(PTQError, match=r"0\.npy' for input 'x' holds raw 2-byte values \(\|V2\), not numbers.*"
                                       r"astype\(np\.float32\)"):
        dbg.get_sensitivity_of_nodes(model, calibrated_data=tmp_path / "data", node_type="activation", progress=False)


def _mixed_precision(tmp_path, block=("Conv",)):
    """(float model, data, QDQ model): quantize_static's model converted to float16 with its
    ``block`` operators kept in float32, as onnxruntime's float16 converter does it: Casts
    between the float16 DequantizeLinears and each, and after it."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    float_path = builders.conv_net(tmp_path / "float.onnx")
    data = builders.samples(6)
    q = onnx.load(builders.quantize(float_path, tmp_path / "q32.onnx", data))
    half = convert_float_to_float16(q, keep_io_types=True, op_block_list=list(block))
    for o in half.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = 21  # Q/DQ of float16
    half.ir_version = 10
    onnx.save(half, tmp_path / "q16.onnx")
    return float_path, data, tmp_path / "q16.onnx"


def test_pairs_read_through_casts_are_the_nodes_they_quantize(tmp_path):
    """A Conv computed in float32 between float16 pairs reads them through Casts: it was
    taken for a node excluded on purpose (re-quantizing left it, here every Conv, in float,
    and the re-quantized "verification" measured another model), and a float remedy on its
    input named no node to exclude."""
    float_path, data, q16 = _mixed_precision(tmp_path)
    qm = QuantModel(q16, float_model=float_path)
    convs = [n for n in qm.normal.values() if n.op_type == "Conv"]
    assert convs and all(not n.calibration_inputs for n in convs)  # a Cast in between, every one
    assert infer_quantize_options(qm)["nodes_to_exclude"] == []
    feeding = qm.quantizers_through_casts("conv2")
    assert feeding and all(qm.calibration[c].kind in ("activation", "weight") for c in feeding)
    act = next(c for c in feeding if qm.calibration[c].kind == "activation")
    assert "conv2" in onnxruntime_settings(qm, "float", [act])["nodes_to_exclude"]
    # re-quantizing the float model as inferred quantizes as many tensors as the model given
    r = suggest_remedy(str(q16), data, target=0.999999, remedy="float", float_model=str(float_path),
                       save_dir=tmp_path / "out")
    again = QuantModel(tmp_path / "out" / "requantized_baseline.onnx")
    assert len(again.of_kind("activation")) == len(qm.of_kind("activation"))
    assert not [w for w in r.warnings if "quantizes only" in w], r.warnings


def test_an_operator_ranking_names_the_operators_pairs_reach_through_casts(tmp_path):
    """A node ranking of the same model named the Casts that read the pairs (the Convs, read
    through them, had no pairs of their own); each Conv now carries its pairs, with the value
    of a model that keeps only those, run in a plain onnxruntime session."""
    from test_plugin import keep_only, pooled_cosine

    _, data, q16 = _mixed_precision(tmp_path)
    qm = QuantModel(q16)
    sens = dbg.get_sensitivity_of_nodes(str(q16), calibrated_data=data, node_type="node", progress=False)
    ops = {name: qm.normal[name].op_type for name in sens}
    assert [n for n, op in ops.items() if op == "Conv"] and not [n for n in ops if "cast_to_fp32" in n], ops
    feeds = [{k: v[i] for k, v in data.items()} for i in range(6)]
    ref = builders.run_model(keep_only(q16), feeds)
    for conv in (n for n, op in ops.items() if op == "Conv"):
        pairs = {c for c in qm.quantizing(conv) if qm.calibration[c].role != "bias"}
        assert {qm.calibration[c].kind for c in pairs} == {"weight", "activation"}
        got = builders.run_model(keep_only(q16, pairs), feeds)
        want = pooled_cosine([r["prob"] for r in ref], [g["prob"] for g in got])
        assert sens[conv]["cosine-similarity"] == pytest.approx(want, abs=1e-5), conv
    cast = next(n for n in qm.normal if n.endswith("_Output_cast_to_fp32_node"))
    with pytest.raises(PTQError, match=r"is a Cast between float types; the ranking names the operators its pairs "
                                       r"quantize the inputs of \('conv"):
        dbg.get_sensitivity_of_nodes(str(q16), calibrated_data=data, node_type="node", interested_nodes=[cast],
                                     progress=False)


def test_pairs_behind_casts_belong_to_the_operators_they_quantize(tmp_path):
    """Conv and Relu computed in float32, the model output cast back to float32: the Relu read
    through a Cast was taken for one folded into its pair (every analysis refused the model),
    the output pair was the output Cast's (ranked and advised as a Cast, the Softmax without
    it), and a weight's feeds named a Cast."""
    from test_plugin import keep_only, pooled_cosine

    _, data, q16 = _mixed_precision(tmp_path, block=("Conv", "Relu"))
    qm = QuantModel(q16)
    assert qm.folded_activation_suspects() == []
    assert "prob_QuantizeLinear" in qm.quantizing("softmax")
    sens = dbg.get_sensitivity_of_nodes(str(q16), calibrated_data=data, node_type="node", progress=False)
    assert "relu1" in sens and not [n for n in sens if qm.normal[n].op_type == "Cast"], list(sens)
    feeds = [{k: v[i] for k, v in data.items()} for i in range(6)]
    ref = builders.run_model(keep_only(q16), feeds)
    got = builders.run_model(keep_only(q16, {"logits_QuantizeLinear", "prob_QuantizeLinear"}), feeds)
    want = pooled_cosine([r["prob"] for r in ref], [g["prob"] for g in got])
    assert sens["softmax"]["cosine-similarity"] == pytest.approx(want, abs=1e-5)
    weights = dbg.get_sensitivity_of_nodes(str(q16), calibrated_data=data, node_type="weight", progress=False)
    assert weights.details["w2_QuantizeLinear"]["feeds"] == ["conv2"]


def test_an_operator_behind_casts_has_its_own_local_error(tmp_path):
    """The local error of a Conv reading its pairs through Casts (it had none: only the Casts
    had clones, and the curves had a point for every Cast) equals the model cut from the activation pair's float input to the Conv's
    output, fed the float model's values, in a plain onnxruntime session."""
    from onnx.utils import Extractor

    from pytest_ptq.curves import get_acc_error
    from pytest_ptq.engine import Engine
    from test_plugin import keep_only

    _, data, q16 = _mixed_precision(tmp_path)
    engine = Engine(str(q16), data)
    qm = engine.qmodel
    curves = get_acc_error(engine, {"all": list(engine.calib_names)}, progress=False)
    act = next(c for c in qm.quantizers_through_casts("conv2") if qm.calibration[c].kind == "activation")
    x, y = qm.calibration[act].input, qm.normal["conv2"].outputs[0]
    ref_model = keep_only(q16)
    ref_model.graph.output.extend([helper.make_value_info(t, TypeProto()) for t in (x, y)])
    feeds = [{k: v[i] for k, v in data.items()} for i in range(6)]
    floats = builders.run_model(ref_model, feeds, outputs=[x, y, "prob"])
    cut = Extractor(onnx.load(str(q16))).extract_model([x], [y])
    local = builders.run_model(cut, [{x: f[x]} for f in floats])
    r = np.concatenate([f[y].ravel() for f in floats]).astype(np.float64)
    t = np.concatenate([v[y].ravel() for v in local]).astype(np.float64)
    want = r @ t / np.sqrt((r @ r) * (t @ t))
    got = curves.local[curves.nodes.index("conv2")]
    assert got is not None and got == pytest.approx(want, abs=1e-6) and got < 1
    assert all(v is not None for n, v in zip(curves.nodes, curves.local) if qm.normal[n].op_type == "Conv")
    # the Casts, which show their input's or their pair's error, are no points of the curve;
    # its last, the Softmax's, is what the model delivers, the output pair and Cast included
    assert not [n for n in curves.nodes if qm.normal[n].op_type == "Cast"], curves.nodes
    quantized = builders.run_model(q16, feeds)
    r = np.concatenate([f["prob"].ravel() for f in floats]).astype(np.float64)
    t = np.concatenate([q["prob"].ravel() for q in quantized]).astype(np.float64)
    # the model output itself; its value as plain onnxruntime runs the file, up to the float16
    # codes the engine's segments round otherwise (1.5e-5 with onnxruntime 1.28)
    assert curves.nodes[-1] == "softmax" and curves.tensors[-1] == "prob"
    assert curves.values["all"][-1] == pytest.approx(r @ t / np.sqrt((r @ r) * (t @ t)), abs=5e-5)


def test_a_requantization_that_quantizes_less_than_the_model_is_no_verification(tmp_path):
    """The model quantizes a Tanh's input, which quantize_static never does: re-quantizing
    its float model keeps two of its three activation pairs, and the remedy says its
    re-quantized figures measure another model."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 8)) * 0.5).astype(np.float32)

    def net(path, pairs):
        inits, nodes = [numpy_helper.from_array(w, "w")], []

        def pair(t, scale):
            if not pairs:
                return t
            inits.extend([numpy_helper.from_array(np.float32(scale), f"{t}_s"),
                          numpy_helper.from_array(np.int8(0), f"{t}_z")])
            nodes.extend([helper.make_node("QuantizeLinear", [t, f"{t}_s", f"{t}_z"], [f"{t}_q"], name=f"{t}_Q"),
                          helper.make_node("DequantizeLinear", [f"{t}_q", f"{t}_s", f"{t}_z"], [f"{t}_d"],
                                           name=f"{t}_DQ")])
            return f"{t}_d"

        nodes.append(helper.make_node("Tanh", [pair("x", 3.0 / 127)], ["t"], name="tanh"))
        nodes.append(helper.make_node("MatMul", [pair("t", 1.0 / 127), pair("w", float(np.abs(w).max()) / 127)],
                                      ["m"], name="mm"))
        nodes.append(helper.make_node("Identity", [pair("m", 8.0 / 127)], ["y"], name="out"))
        graph = helper.make_graph(nodes, "tanh", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
        return path

    float_path, model = net(tmp_path / "f.onnx", False), net(tmp_path / "q.onnx", True)
    data = {"x": _samples(8)}
    r = suggest_remedy(str(model), data, target=0.99999, remedy="float", float_model=str(float_path),
                       save_dir=tmp_path / "out")
    # quantize_static pairs the MatMul's input and output, not the Tanh's input
    kept = [c.input for c in QuantModel(tmp_path / "out" / "requantized_baseline.onnx").of_kind("activation")]
    assert "x" not in kept and len(kept) == 2
    told = [w for w in r.warnings if "quantizes only" in w]
    assert len(told) == 1 and "quantizes only 2 of its 3 activation tensor(s)" in told[0], r.warnings
    # a pair for each reader of a tensor (DedicatedQDQPair) re-quantized as one pair: no tensor is left out
    float_path = builders.conv_net(tmp_path / "conv.onnx")
    data = builders.samples(6)
    dedicated = builders.quantize(float_path, tmp_path / "dedicated.onnx", data,
                                  extra_options={"DedicatedQDQPair": True})
    r = suggest_remedy(str(dedicated), data, target=0.999999, remedy="float", float_model=str(float_path),
                       save_dir=tmp_path / "out2")
    pairs = QuantModel(dedicated).of_kind("activation")
    assert len(pairs) > len({c.input for c in pairs})  # r1 read by two nodes, a pair each
    assert not [w for w in r.warnings if "quantizes only" in w], r.warnings


def test_a_nan_among_small_float16_values_is_no_overflow(tmp_path):
    """A pair bypassed before a Sqrt gives NaN of values near 1: the float16 sentence said
    the graph overflowed, "reaching 1.14 of the 65504 float16 holds". Only an infinity, or
    values near float16's largest, are an overflow; this stays the bypass's own finding."""
    inits, nodes = [], []

    def pair(t, scale, zero):
        inits.extend([numpy_helper.from_array(np.asarray(scale, np.float16), f"{t}_s"),
                      numpy_helper.from_array(zero, f"{t}_z")])
        nodes.extend([helper.make_node("QuantizeLinear", [t, f"{t}_s", f"{t}_z"], [f"{t}_q"], name=f"{t}_Q"),
                      helper.make_node("DequantizeLinear", [f"{t}_q", f"{t}_s", f"{t}_z"], [f"{t}_d"],
                                       name=f"{t}_DQ")])
        return f"{t}_d"

    # uint8 with zero point 0 clips the negative inputs the bypass hands Sqrt
    nodes.append(helper.make_node("Sqrt", [pair("x", 3.0 / 255, np.asarray(0, np.uint8))], ["r"], name="sqrt"))
    nodes.append(helper.make_node("Identity", [pair("r", 2.0 / 127, np.asarray(0, np.int8))], ["y"], name="out"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), tmp_path / "m.onnx")
    data = {"x": [x.astype(np.float16) for x in _samples()]}
    with pytest.raises(NotFloatEquivalent) as err:
        dbg.get_sensitivity_of_nodes(tmp_path / "m.onnx", calibrated_data=data, node_type="activation",
                                     progress=False)
    assert "overflows" not in str(err.value) and "non-finite values in output 'y'" in str(err.value)


def test_check_data_reports_the_data_of_a_float16_model_that_overflows(tmp_path):
    """check-data with held-out data compares the model on both sets against its float
    reference; a float16 overflow there (a PTQError, not the bypass's NotFloatEquivalent)
    ended the whole report instead of skipping that comparison."""
    model = half_net(tmp_path / "q16.onnx")
    report = check_data(model, {"x": [x.astype(np.float16) for x in _samples(scale=20000.0)]},
                        heldout={"x": [x.astype(np.float16) for x in _samples(seed=5)]})
    checks = {f.check: f for f in report.findings}
    assert checks["range"].severity == "error"
    assert "float16 graph overflows" in checks["heldout-skipped"].message


def test_check_data_refuses_what_loading_refuses_beyond_a_float16_input(tmp_path):
    """check-data said float32 samples 'are converted to float16 on load' where loading them
    refuses a value float16 cannot hold: it now says so as an error, as loading does."""
    model = half_net(tmp_path / "q16.onnx")
    xs = _samples()
    xs[1][0, 3] = 1e5
    dtype = [f for f in check_data(model, {"x": xs}).findings if f.check == "dtype"]
    assert [f.severity for f in dtype] == ["error"], dtype
    assert "reach -" in dtype[0].message and "..100000, beyond the float16 the model takes (-65504..65504)" in \
        dtype[0].message
    narrow = [x.astype(ml_dtypes.bfloat16) for x in xs]  # read as float32, then refused alike
    dtype = [f for f in check_data(model, {"x": narrow}).findings if f.check == "dtype"]
    assert [f.severity for f in dtype] == ["error"] and "samples are bfloat16 and reach" in dtype[0].message, dtype
    fine = [f for f in check_data(model, {"x": _samples()}).findings if f.check == "dtype"]
    assert [f.severity for f in fine] == ["info"] and "converted to float16 on load" in fine[0].message


def test_a_tensor_a_float16_graph_casts_back_is_read_where_the_re_quantized_model_computes_it(tmp_path):
    """A Conv computed in float32 in a float16 graph: its output 'c1' is the Cast back to
    float16 of the Conv's, refused by the re-quantized check ("no counterpart") though it
    holds the float model's 'c1', which the float32 re-quantized models compute by that name."""
    float_path, data, q16 = _mixed_precision(tmp_path)
    cast = next(n for n in builders.load(q16).graph.node if "c1" in n.output)
    assert cast.op_type == "Cast"  # the rename this test is about
    r = suggest_remedy(str(q16), data, target=0.999999, remedy="float", output_node="c1",
                       float_model=str(float_path), save_dir=tmp_path / "out")
    assert r.nodes and r.measured, r.notes
    feeds = [{k: v[i] for k, v in data.items()} for i in range(6)]

    def c1(path):
        model = builders.load(path)
        model.graph.output.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, None))
        return np.concatenate([o["c1"].ravel() for o in builders.run_model(model, feeds, outputs=["c1"])])

    ref = c1(float_path).astype(np.float64)
    for key, path in (("value", r.measured["model"]), ("baseline_value", r.measured["baseline_model"])):
        got = c1(path).astype(np.float64)
        # the figures' reference is the float16 graph's own: its rounding moves them by 5e-8 here
        assert r.measured[key] == pytest.approx(ref @ got / np.sqrt((ref @ ref) * (got @ got)), abs=1e-7)

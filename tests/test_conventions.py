"""Other quantizers' QDQ conventions (tests/conventions.py), checked against plain
onnxruntime: the file run as stored, independently rewired copies, and the float model."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
import conventions
from pytest_ptq.curves import get_acc_error
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError
from pytest_ptq.model import QuantModel
from pytest_ptq.remedy.terms import float_tensor_name
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

CASES = [(name, base) for name in conventions.CONVENTIONS for base in ("conv", "mlp")
         if not (conventions.CONVENTIONS[name].block_size and base == "conv")]  # int4 weight-only: MatMul weights


def _cos(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


class Made:
    def __init__(self, root):
        self.root, self.cache = root, {}

    def __call__(self, name, base):
        key = (name, base)
        if key not in self.cache:
            if base == "conv":
                fpath, data = builders.conv_net(self.root / "conv.onnx"), builders.samples(3)
            else:
                fpath, data = conventions.mlp_net(self.root / "mlp.onnx"), conventions.mlp_samples(3)
            qpath = conventions.make(fpath, self.root / f"{name}_{base}.onnx", data, name)
            feeds = [{k: v[i] for k, v in data.items()} for i in range(3)]
            self.cache[key] = (qpath, fpath, data, feeds)
        return self.cache[key]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return Made(tmp_path_factory.mktemp("conventions"))


@pytest.mark.parametrize("level", ["disable", "all"])
@pytest.mark.parametrize("name,base", CASES)
def test_fully_quantized_equals_onnxruntime_running_the_file(made, name, base, level, tmp_path):
    """Every pair quantized is the file in a plain session at the same optimisation level,
    fp16 graphs included: onnxruntime computes their fp16 ops in float32 between the casts it
    inserts, and the engine runs that config as one session of the file's Q/DQ, so it does too."""
    qpath, fpath, data, feeds = made(name, base)
    engine = Engine(qpath, data, float_model=fpath, optimization=level, segments=3)
    # onnxruntime's ReluQuantRewrite deletes a Relu before a float8 Q as if fp8 had no negative
    # codes: the file's own arithmetic is the reference, so the plain session runs without it
    want = builders.run_model(builders.runnable(qpath, tmp_path / "runnable.onnx"), feeds, level,
                              disabled_optimizers=["ReluQuantRewrite"])
    for i in range(len(feeds)):
        got = engine.run(i, "all")
        for k, w in want[i].items():
            np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-5, err_msg=f"{name} {k}")


@pytest.mark.parametrize("name,base", CASES)
def test_bypassing_every_pair_with_the_float_model_is_the_float_model(made, name, base):
    qpath, fpath, data, feeds = made(name, base)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    want = builders.run_model(fpath, feeds)
    cosines = [min(_cos(engine.run(i, ())[k], want[i][k]) for k in want[i]) for i in range(len(feeds))]
    if conventions.CONVENTIONS[name].hardsigmoid and base == "mlp":
        # Sigmoid -> HardSigmoid changes the function: reported as the quantizer's rewrite,
        # with the cosine of the independent float and bypassed runs
        assert engine.rewrite is not None and "HardSigmoid" in engine.rewrite["changes"]
        assert engine.rewrite["cosine"] == pytest.approx(min(cosines), abs=1e-6)
        assert any("graph rewritten by the quantizer" in w for w in engine.warnings)
    else:
        assert min(cosines) > 1 - 1e-6, (name, cosines)
        assert engine.rewrite is None


# builders.rewire removes pairs but cannot put back a Relu the quantizer deleted; fp16 graphs
# cannot take its float32 weights: those are covered by the two tests above
@pytest.mark.parametrize("name,base", [c for c in CASES if not conventions.CONVENTIONS[c[0]].fp16
                                       and not conventions.CONVENTIONS[c[0]].fold_relu])
def test_one_node_quantized_matches_an_independently_rewired_model(made, name, base):
    qpath, fpath, data, feeds = made(name, base)
    engine = Engine(qpath, data, float_model=fpath, optimization="disable")
    picked = [c.name for c in engine.qmodel.calibration.values() if engine.is_gated(c.name)][::3][:4]
    for node in picked:
        want = builders.run_model(_true_float_weights(builders.rewire(qpath, keep={node}, float_model=fpath), fpath),
                                  feeds)
        for i in range(len(feeds)):
            got = engine.run(i, [node])
            for k, w in want[i].items():
                np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-5, err_msg=f"{name} {node} {k}")


@pytest.mark.parametrize("base", ["conv", "mlp"])
def test_fp16_graph_one_pair_quantized_through_segments_is_the_rewired_file(made, base):
    """In a 16-bit graph onnxruntime computes most ops in float32 and passes the values
    unrounded: through segments (16-bit tensors crossing as float32) and with no Q/DQ left in
    a config's form for the pairs it bypasses (a Q reading a tensor keeps its writer in
    16 bits), one pair's config is onnxruntime running the file with only that pair."""
    qpath, fpath, data, feeds = made("modelopt_int8_fp16", base)
    engine = Engine(qpath, data, optimization="all", segments=3)
    picked = [c.name for c in engine.qmodel.calibration.values() if engine.is_gated(c.name) and c.kind != "weight"]
    assert len(picked) >= 3
    for node in picked:
        want = builders.run_model(builders.rewire(qpath, keep={node}), feeds, "all")
        for i in range(len(feeds)):
            got = engine.run(i, [node])
            for k, w in want[i].items():
                np.testing.assert_allclose(got[k], w, rtol=0, atol=1e-6, err_msg=f"{base} {node} {k}")


@pytest.mark.parametrize("base", ["conv", "mlp"])
def test_fp16_graph_curves_read_the_file_with_those_pairs(made, base):
    """The error curves read every node's output under a config (weights only, activations
    only, any list of pairs): in a 16-bit graph the gated session every curve ran rounded
    the nodes writing a bypassed pair's tensor, float run included (2e-3 on a 0.3 output here);
    each config now runs in its own form, which is the file with only those pairs, its
    tensors exposed, run in a plain session."""
    qpath, fpath, data, feeds = made("modelopt_int8_fp16", base)
    engine = Engine(qpath, data, optimization="all", segments=3)
    assert engine.config_major
    gated = [c.name for c in engine.qmodel.calibration.values() if engine.is_gated(c.name)]
    configs = [gated[: len(gated) // 2], [c for c in gated if engine.qmodel.calibration[c].kind == "weight"]]
    tensors = list(engine.probe_tensors)

    def exposed(keep):  # independently: the rewired file, every probed tensor an output
        model = builders.rewire(qpath, keep=set(keep))
        types = {v.name: v.type.tensor_type.elem_type
                 for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
        have = {o.name for o in model.graph.output}
        model.graph.output.extend(onnx.helper.make_tensor_value_info(t, types[t], None) for t in tensors if t not in have)
        # as the engine compiles: a form with pairs inline keeps the plain layout, the float one not
        return builders.run_model(model, feeds, "all", disabled_optimizers=("NchwcTransformer",) if keep else ())

    want = [exposed(())] + [exposed(q) for q in configs]
    for i, parts in engine.probes(range(len(feeds)), configs, tensors):
        for ref, _, outs in parts:
            for k, got in enumerate([ref, *outs]):
                for t in tensors:
                    np.testing.assert_allclose(got[t], want[k][i][t], rtol=0, atol=1e-6, err_msg=f"{base} {k} {t}")


def test_a_float8_file_is_checked_as_onnxruntime_deploys_it(made, monkeypatch):
    """onnxruntime's default optimizations delete a Relu before a float8 QuantizeLinear as if
    zero were the grid's floor: the engine turns that rewrite off, and so did its check of
    the file as deployed, which read 1.0 where a plain session reads the file 0.64 off its
    simulation. The check now runs the file as a plain session does, and names the rewrite."""
    import onnxruntime as ort

    from pytest_ptq import stages
    from pytest_ptq.kernels import float8_rewrites
    from pytest_ptq.outputs import parse_outputs

    qpath, fpath, data, feeds = made("modelopt_fp8", "conv")
    engine = Engine(qpath, data, float_model=fpath)
    assert float8_rewrites(engine.qmodel)
    specs = parse_outputs(None, engine)
    try:
        plain = ort.InferenceSession(str(qpath), providers=["CPUExecutionProvider"])  # as a user deploys it
    except Exception:  # onnxruntime before 1.28 fuses a float8 Add it has no kernel for: said so
        (told,) = stages.simulation_warnings(engine, specs)
        assert "a plain onnxruntime session with its default options cannot run this file" in told
        return
    spread = [round(float(k)) for k in np.linspace(0, len(data["x"]) - 1, min(8, len(data["x"])))]
    samples = [{"x": data["x"][k]} for k in sorted(set(spread))]
    simulated = builders.run_model(qpath, samples, "all", disabled_optimizers=["ReluQuantRewrite"])
    want = min(_cos(plain.run(None, f)[0], s[next(iter(s))]) for f, s in zip(samples, simulated))
    assert stages.simulation_gap(engine, specs) == pytest.approx(want, abs=1e-6) and want < 0.9
    (told,) = stages.simulation_warnings(engine, specs)
    assert "onnxruntime's default optimizations ReluQuantRewrite and ClipQuantRewrite delete 2 Relu/Clip" in told
    assert "disabled_optimizers=['ReluQuantRewrite', 'ClipQuantRewrite'])) the file reads 1.000000" in told


def test_a_float8_file_a_plain_session_cannot_load_is_said_so(tmp_path, capfd):
    """ClipQuantRewrite fails a plain session on a Clip before a float8 QuantizeLinear (it
    cannot read a float8 zero point): the deployed check says that in one sentence, with the
    setting the file does run with, and onnxruntime's error log stays off stderr."""
    from pytest_ptq.stages import SIMULATION_WARNING, simulation_warnings

    fpath = builders.conv_clip_net(tmp_path / "clip.onnx")
    data = builders.samples(4, size=8)
    qpath = conventions.make(fpath, tmp_path / "clip_fp8.onnx", data, "modelopt_fp8")
    engine = Engine(qpath, data, float_model=fpath)
    capfd.readouterr()
    (told,) = simulation_warnings(engine)
    assert told.startswith(f"{SIMULATION_WARNING}: every figure simulates Q/DQ as float arithmetic, and a plain "
                           "onnxruntime session with its default options cannot run this file")
    assert "clip_quantizelinear" in told and "disabled_optimizers=['ReluQuantRewrite', 'ClipQuantRewrite']" in told
    assert "onnxruntime" not in capfd.readouterr().err


def _true_float_weights(model, fpath):
    """Weights that conventions.py stored behind pairs already rounded (``<w>_float``, aimet's
    habit) replaced by the float model's ``<w>``: what bypassing them should give."""
    floats = {i.name: i for i in onnx.load(str(fpath)).graph.initializer}
    for k, init in enumerate(model.graph.initializer):
        stem = init.name[: -len("_float")] if init.name.endswith("_float") else None
        if stem in floats:
            replacement = onnx.TensorProto()
            replacement.CopyFrom(floats[stem])
            replacement.name = init.name
            model.graph.initializer[k].CopyFrom(replacement)
    return model


@pytest.mark.parametrize("name,base,expect", [
    ("onnxruntime", "conv", "clean"), ("modelopt_int8_fp16", "conv", "clean"), ("modelopt_fp8", "mlp", "clean"),
    ("quark_xint8", "conv", "clean"), ("quark_a16w8", "mlp", "clean"),
    ("inc", "conv", "refused"),  # two Relus deleted: decisive value evidence
    ("inc", "mlp", "suspected"),  # one Relu deleted: a warning with the evidence
    ("aimet", "conv", "on grid"), ("modelopt_int4", "mlp", "nothing bypassable"),
])
def test_without_the_float_model(made, name, base, expect):
    qpath, fpath, data, feeds = made(name, base)
    if expect == "refused":
        with pytest.raises(PTQError, match=r"below its range floor.*float model"):
            Engine(qpath, data)
        return
    engine = Engine(qpath, data)
    text = " ".join(engine.warnings)
    if expect == "clean":
        assert "folded" not in text and "rewritten" not in text
    elif expect == "suspected":
        assert "folded activations suspected" in text and "below its range floor" in text
    elif expect == "on grid":
        assert "already rounded onto their grid" in text
        # which is why its weights read as harmless: bypassing them changes nothing
        s = get_sensitivity_of_nodes(engine, node_type="weight")
        assert all(v["cosine-similarity"] == pytest.approx(1.0, abs=1e-12) for v in s.values())
    else:
        assert not engine.calib_names and "lone DequantizeLinear" in text


def test_rankings_are_finite_and_weights_named_by_structure(made):
    qpath, fpath, data, feeds = made("inc", "conv")
    qm = QuantModel(qpath, float_model=fpath)
    # tensors and initializers were renamed: the float weights were found by structure
    weights = [c for c in qm.of_kind("weight")]
    assert weights and all(c.float_weight for c in weights)
    assert {c.folded for c in qm.of_kind("activation") if c.folded} == {("Relu", 0.0, np.inf)}
    engine = Engine(qm, data, optimization="disable")
    for kind in ("weight", "activation", "node"):
        s = get_sensitivity_of_nodes(engine, node_type=kind)
        assert s and all(np.isfinite(v["cosine-similarity"]) for v in s.values())


def test_a_graph_stored_out_of_order_is_sorted(made):
    qpath, _, data, _ = made("quark_xint8", "conv")
    stored = [n.name for n in onnx.load(str(qpath)).graph.node]
    qm = QuantModel(qpath)
    assert qm.resorted and any("topological order" in n for n in qm.notes)
    position = {n.name: k for k, n in enumerate(qm.model.graph.node)}
    producer = {o: n.name for n in qm.model.graph.node for o in n.output}
    for n in qm.model.graph.node:
        assert all(position[producer[i]] < position[n.name] for i in n.input if i in producer)
    assert onnx.load(str(qpath)).graph.node[0].name == stored[0]  # the file is untouched


def test_a_malformed_bias_axis_is_named_and_repaired_in_the_copy(made):
    qpath, fpath, data, _ = made("inc_per_channel", "conv")
    qm = QuantModel(qpath)
    note = next(n for n in qm.notes if "axis" in n)
    assert "b1_DequantizeLinear" in note and "axis 0" in note
    assert next(a.i for n in onnx.load(str(qpath)).graph.node if n.name == "b1_DequantizeLinear"
                for a in n.attribute if a.name == "axis") == 1


# -- grids: the numpy fake-quant against onnxruntime's QuantizeLinear/DequantizeLinear ----------
def _pair_model(qtype, scale, zp, shape, axis=None, block_size=0):
    inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "s")]
    names = ["x", "s"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "z"))
        names.append("z")
    attrs = {}
    if axis is not None:
        attrs["axis"] = axis
    if block_size:
        attrs["block_size"] = block_size
    if zp is None:
        attrs["output_dtype"] = qtype
    q_attrs = dict(attrs)
    dq_attrs = {k: v for k, v in attrs.items() if k != "output_dtype"}
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", names, ["q"], name="q", **q_attrs),
         helper.make_node("DequantizeLinear", ["q", *names[1:]], ["y"], name="dq", **dq_attrs)],
        "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


import ml_dtypes  # noqa: E402

GRID_CASES = [
    ("int8", TensorProto.INT8, 0.05, np.array(3, np.int8), None, 0),
    ("uint8", TensorProto.UINT8, 0.02, np.array(128, np.uint8), None, 0),
    ("int16", TensorProto.INT16, 1e-4, np.array(0, np.int16), None, 0),
    ("uint16", TensorProto.UINT16, 1e-4, np.array(30000, np.uint16), None, 0),
    ("int4 per block", TensorProto.INT4, np.full((2, 6), 0.3), np.zeros((2, 6), ml_dtypes.int4), 0, 4),
    ("uint4", TensorProto.UINT4, 0.4, np.array(8, ml_dtypes.uint4), None, 0),
    ("int8 per axis", TensorProto.INT8, np.linspace(0.01, 0.1, 6), np.zeros(6, np.int8), 1, 0),
    ("float8e4m3fn", TensorProto.FLOAT8E4M3FN, 0.01, None, None, 0),
    ("float8e5m2", TensorProto.FLOAT8E5M2, 0.01, None, None, 0),
]


@pytest.mark.parametrize("label,qtype,scale,zp,axis,block", GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_numpy_fake_quant_equals_onnxruntime(label, qtype, scale, zp, axis, block):
    shape = (8, 6)
    x = (np.random.default_rng(3).standard_normal(shape) * 8).astype(np.float32)
    model = _pair_model(qtype, scale, zp, shape, axis, block)
    want = builders.run_model(model, {"x": x})["y"]
    c = QuantModel(model).calibration["q"]
    np.testing.assert_array_equal(c.fake_quant(x), want)
    assert c.grid.name == label.split()[0]


def test_custom_qdq_ops_without_their_library_are_one_sentence(tmp_path, zoo):
    model = onnx.load(str(zoo.qdq("qdq")))
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            n.op_type, n.domain = "Extended" + n.op_type, "com.example.quant"
    model.opset_import.append(helper.make_opsetid("com.example.quant", 1))
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    assert len(QuantModel(path).calibration) == len(QuantModel(zoo.qdq("qdq")).calibration)
    with pytest.raises(PTQError, match=r"com\.example\.quant::ExtendedDequantizeLinear.*--custom-op-library"):
        Engine(path, zoo.data("qdq"))


def test_a_rewrite_by_the_quantizer_is_its_own_stage(made):
    from pytest_ptq.stages import localize_stages

    qpath, fpath, data, feeds = made("quark_xint8", "mlp")
    report = localize_stages(fpath, qpath, data, threshold=0.999)
    stages = [s["stage"] for s in report.stages]
    assert stages == ["optimized-float", "rewritten", "fake-quant", "integer"]
    # the stage's cosine is that of the float model against the rewired (every pair removed) file
    ref = builders.run_model(fpath, feeds)
    bypassed = builders.run_model(builders.rewire(qpath), feeds)
    y = [r["y"] for r in ref], [b["y"] for b in bypassed]
    want = _cos(np.concatenate(y[0]), np.concatenate(y[1]))
    assert report.value("rewritten") == pytest.approx(want, abs=1e-6)
    assert report.first_drop == "rewritten" and "HardSigmoid" in report.message
    clean = localize_stages(*made("onnxruntime", "mlp")[1::-1], made("onnxruntime", "mlp")[2])
    assert "rewritten" not in [s["stage"] for s in clean.stages]


def test_custom_op_library_reaches_onnxruntime_from_every_face(tmp_path, zoo, capsys, pytester):
    from pytest_ptq.cli import main

    model = onnx.load(str(zoo.qdq("qdq")))
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            n.op_type, n.domain = "Extended" + n.op_type, "com.example.quant"
    model.opset_import.append(helper.make_opsetid("com.example.quant", 1))
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    fake = tmp_path / "libnot_a_library.so"
    fake.write_bytes(b"not a shared object")
    data = str(zoo.folder("qdq"))
    held = tmp_path / "held"  # the calibration samples in another order
    for x in sorted(Path(data).rglob("*.npy")):
        (held / x.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(x, held / x.parent.name / f"{len(list(x.parent.glob('*.npy'))) - 1 - int(x.stem)}.npy")
    for extra, needle in (([], "--custom-op-library PATH"), (["--custom-op-library", str(fake)],
                                                              "cannot load the custom-op library")):
        for command in (["get-sensitivity-of-nodes", str(path), data], ["check-data", str(path), data, "--heldout", str(held)]):
            rc = main([*command, "--quiet", *extra])
            err = capsys.readouterr().err.strip().splitlines()
            assert rc == 2 and len(err) == 1 and needle in err[0] and "Traceback" not in err[0], (command, err)
    pytester.makefile(".ptq.yaml", custom=f"model: {path}\ndata: {data}\ncustom_op_library: {fake}\nbaseline: false\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*cannot load the custom-op library*libnot_a_library.so*"])


def test_the_producer_is_named_from_the_file(zoo, made):
    from pytest_ptq.model import detect

    assert detect(onnx.load(str(zoo.qdq("qdq")))).key == "onnxruntime"
    inc = onnx.load(str(made("inc", "conv")[0]))
    inc.producer_name, inc.producer_version = "onnx.quantize", "0.1.0"  # what both INC and onnxruntime write
    assert detect(inc).key == "neural-compressor"
    quark = onnx.load(str(made("quark_xint8", "conv")[0]))
    quark.producer_name, quark.producer_version = "quark.onnx", "0.13"
    assert detect(quark).label == "AMD Quark 0.13"
    aimet = onnx.load(str(made("aimet", "conv")[0]))
    aimet.producer_name = "PaddlePaddle"
    aimet.metadata_props.add(key="onnx.quant.pre_process", value="onnxruntime.quant")
    aimet.metadata_props.add(key="producer", value="aimet-onnx 2.42.0")
    assert detect(aimet).label == "Qualcomm aimet-onnx 2.42.0"
    assert detect(onnx.load(str(made("modelopt_int4", "mlp")[0]))).key == "modelopt"


def test_model_optimizer_with_an_fp32_graph_is_told_from_onnxruntime(made):
    """Its pairs share their scales as onnxruntime's do; IR 10 and symmetric int8 activations
    (its defaults) tell it, uint8 activations or the float model's IR do not."""
    from pytest_ptq.model import detect

    mo = onnx.load(str(made("modelopt_int8_fp32", "mlp")[0]))
    mo.producer_name, mo.producer_version, mo.ir_version = "onnx.quantize", "0.1.0", 10
    assert detect(mo).key == "modelopt"
    mo.ir_version = 8  # what onnxruntime keeps from an IR-8 float model
    assert detect(mo).key == "onnxruntime"
    ort = onnx.load(str(made("onnxruntime", "mlp")[0]))  # uint8 activations
    ort.producer_name, ort.producer_version, ort.ir_version = "onnx.quantize", "0.1.0", 10
    assert detect(ort).key == "onnxruntime"


def test_a_relu_before_a_float8_quantizer_is_kept(made, tmp_path):
    """onnxruntime's ReluQuantRewrite (ORT_ENABLE_EXTENDED and up) deletes a Relu feeding a
    QuantizeLinear whose zero point is the type's floor: exact for integers, not for float8,
    whose grid holds negative values. The engine keeps the model's arithmetic at every level."""
    qpath, fpath, data, feeds = made("modelopt_fp8", "conv")
    runnable = builders.runnable(qpath, tmp_path / "runnable.onnx")
    as_stored = builders.run_model(runnable, feeds, "disable")
    rewritten = builders.run_model(runnable, feeds, "all")
    assert any(not np.allclose(rewritten[i][k], w, atol=1e-3) for i in range(len(feeds)) for k, w in as_stored[i].items())
    engine = Engine(qpath, data, float_model=fpath, optimization="all", segments=3)
    for i in range(len(feeds)):
        for k, w in as_stored[i].items():
            np.testing.assert_allclose(engine.run(i, "all")[k], w, rtol=1e-5, atol=1e-5)


def test_a_symmetric_range_on_a_relu_output_asks_for_an_asymmetric_one_on_integer_grids_only(made):
    """Half of a symmetric range on a Relu's output goes unused; an integer grid can shift
    its zero point, a float8 one cannot (its zero point is 0)."""
    from pytest_ptq.distribution.gather import collect
    from pytest_ptq.distribution.readings import activation_reading

    for name, asked in (("modelopt_int8_fp32", True), ("modelopt_fp8", False)):
        qpath, fpath, data, _ = made(name, "conv")
        engine = Engine(qpath, data, float_model=fpath)
        dist, _ = collect(engine, ["r1_QuantizeLinear"], ())
        d = dist["r1_QuantizeLinear"]
        assert d["min"] >= 0 and d["range_lo"] < -0.9 * d["range_hi"], name  # a Relu's output, a symmetric range
        assert ("ActivationSymmetric=False" in activation_reading(d)) is asked, (name, activation_reading(d))


@pytest.mark.parametrize("name,base", CASES)
def test_fully_quantized_curve_is_onnxruntime_running_the_file(made, name, base, tmp_path):
    """The cumulative curve with every pair quantized: at each node, the metric between the
    engine's float run and the node's output in the file run by a plain session exposing
    every node's output, at the default optimisation level, so with the file's fusions
    (32-bit graphs run segment by segment, each exposing its own nodes; 16-bit ones whole)."""
    qpath, fpath, data, feeds = made(name, base)
    engine = Engine(qpath, data, float_model=fpath, optimization="all", segments=3)
    curves = get_acc_error(engine, {"all": list(engine.calib_names)}, "cosine-similarity", local=False,
                           progress=False)
    model = onnx.load(str(builders.runnable(qpath, tmp_path / "runnable.onnx")))
    model.graph.output.extend(helper.make_tensor_value_info(t, engine.qmodel.value_types[t], None)
                              for t in curves.tensors if t not in engine.model_outputs)
    want = builders.run_model(model, feeds, "all", curves.tensors, disabled_optimizers=["ReluQuantRewrite"])
    floats = [engine.run(i, (), curves.tensors, kind="probe") for i in range(len(feeds))]
    for k, t in enumerate(curves.tensors):
        ref = np.concatenate([f[t].ravel() for f in floats])
        got = np.concatenate([w[t].ravel() for w in want])
        assert curves.values["all"][k] == pytest.approx(_cos(ref, got), abs=2e-6), (name, t)
    parts = engine.probe_parts(curves.tensors)
    assert parts == 1 if conventions.CONVENTIONS[name].fp16 else parts >= 3


def test_contrib_domain_q_dq_leave_every_tensor_typed(made):
    """onnx's inference knows no op of onnxruntime's domain, where 16-bit Q/DQ live below
    opset 21: the tensors after them are typed all the same, so every node output can be
    probed and the graph cut into segments."""
    qpath, fpath, data, _ = made("quark_a16w8", "conv")
    engine = Engine(qpath, data, float_model=fpath, segments=3)
    assert {n.domain for n in onnx.load(str(qpath)).graph.node if "Linear" in n.op_type} == {"com.microsoft"}
    assert [t for n in engine.qmodel.normal.values() for t in n.outputs] == engine.probe_tensors


def test_a_float_model_before_the_quantizers_graph_optimizations_aligns(tmp_path):
    """Intel Neural Compressor, and quantize_static after quant_pre_process, quantize the
    float model as onnxruntime's basic optimizations leave it: a Mul and Add after a
    convolution and a BatchNormalization folded into its weight and bias, a 3-D MatMul and
    its Add made Reshape, Gemm, Reshape, two identical Shapes merged and the shape arithmetic
    folded. Given the model from before, the alignment folds the same chains into the float
    weights it compares with, so every weight and every folded Relu is found; bypassed is the
    float model, fully quantized is the file as onnxruntime runs it."""
    net = conventions.preprocessed_net(tmp_path)
    engine = Engine(net["qdq"], net["samples"], float_model=net["float"])
    alignment = engine.qmodel.alignment
    assert alignment.weights_fitted == alignment.weights_tried == 8 and not alignment.unmatched_weights
    # the Relus after conv1, bn2, conv3's scale and the MatMul's Add (its 2-D and 3-D pairs both)
    assert {"r1_QuantizeLinear", "r2a_QuantizeLinear", "r2_QuantizeLinear", "rp_QuantizeLinear"} <= set(
        alignment.folded)
    assert all(fold[0] == "Relu" for fold in alignment.folded.values())
    assert not alignment.rewrites and engine.rewrite is None
    # the fused nodes are told apart: a producer excludes them by the names its optimized graph
    # gave them ('proj/MatMulAddFusion'), and their outputs are the last fused op's
    assert alignment.fused == {"conv1": "conv1", "conv2": "conv2", "conv3": "conv3", "proj/MatMulAddFusion": "proj"}
    assert alignment.nodes == {"flatten": "flatten", "tokens": "tokens", "head": "head"}
    for i, x in enumerate(net["samples"]["x"]):
        np.testing.assert_allclose(engine.run(i, ())["y"], builders.run_model(net["float"], {"x": x})["y"],
                                   rtol=1e-4, atol=1e-5)
        want = builders.run_model(net["qdq"], {"x": x}, level="disable")["y"]
        assert _cos(engine.run(i, "all")["y"], want) > 0.999999


def test_a_float_model_before_inlining_folding_and_a_rewrite_aligns(tmp_path):
    """AMD Quark inlines HardSwish as its ONNX definition, folds a BatchNormalization and a
    bias Add behind an Identity into their convolutions, rewrites a Sigmoid as a
    HardSigmoid, corrects a bias and makes a Split two Slices. Given the model from before,
    the float HardSwish is compared as its definition, the Identity is seen through, a fold
    computed in float32 through a large mean still matches a 16-bit activation's fine bias
    step, after the rewrite the match picks up again by weight (the Relu folded after it is
    found), the corrected bias does not undo its convolution's match, and each Slice is the
    Split's output it takes: only the rewrite is reported, and bypassed is the rewritten
    graph but for the corrected bias, which stays as quantized."""
    net = conventions.inlined_net(tmp_path)
    engine = Engine(net["qdq"], net["samples"], float_model=net["float"])
    alignment = engine.qmodel.alignment
    assert alignment.weights_tried == 8 and alignment.weights_fitted == 7
    assert alignment.unmatched_weights == ["b4_DequantizeLinear"]
    assert set(alignment.folded) == {"r2_QuantizeLinear", "r4_QuantizeLinear"}
    assert alignment.fused == {"conv1": "conv1", "conv2": "conv2", "slice_y": "halve", "slice_z": "halve"}
    assert {"conv3": "conv3", "conv4": "conv4", "conv5": "conv5"}.items() <= alignment.nodes.items()
    assert sorted(engine.qmodel.node(n).op_type for n in alignment.nodes) == ["Conv"] * 3 + ["HardSigmoid", "Mul"]
    assert alignment.rewrites == ["the quantizer changed the graph beyond Q/DQ: float Sigmoid without counterpart, "
                                  "QDQ HardSigmoid not in the float model"]
    # a remedy quantizing the float model names a folded weight as the float model does
    calibration = engine.qmodel.calibration
    named = {c: float_tensor_name(engine.qmodel, calibration[c]) for c in alignment.weights}
    assert {c: named[c] for c in ("ConvBnFusion_W_w1_DequantizeLinear", "w2_DequantizeLinear", "w3_DequantizeLinear",
                                  "w4_DequantizeLinear", "w5_DequantizeLinear")} == {
        "ConvBnFusion_W_w1_DequantizeLinear": "w1", "w2_DequantizeLinear": "w2", "w3_DequantizeLinear": "w3",
        "w4_DequantizeLinear": "w4", "w5_DequantizeLinear": "w5"}
    assert not any("::fused::" in n for n in named.values())
    assert engine.rewrite is not None
    rewritten = onnx.load(str(net["rewritten"]))
    b4 = next(i for i in rewritten.graph.initializer if i.name == "b4")
    qdq = onnx.load(str(net["qdq"]))
    stored = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    q, scale, zero = (stored[t] for t in next(n for n in qdq.graph.node if n.name == "b4_DequantizeLinear").input)
    b4.CopyFrom(numpy_helper.from_array(((q.astype(np.float64) - zero) * scale).astype(np.float32), "b4"))
    for i, x in enumerate(net["samples"]["x"]):
        bypassed, want = engine.run(i, ()), builders.run_model(rewritten, {"x": x})
        quantized, file = engine.run(i, "all"), builders.run_model(net["qdq"], {"x": x}, level="disable")
        for t in "yz":
            np.testing.assert_allclose(bypassed[t], want[t], rtol=1e-4, atol=1e-5)
            assert _cos(quantized[t], file[t]) > 0.999999


def test_shape_arithmetic_is_told_apart_on_a_graph_deeper_than_the_recursion_limit():
    """Whether a tensor is computed from shapes only is followed back through its producers
    as deep as the graph goes, without recursion (20 000 ops here)."""
    from pytest_ptq.model.align import _Float

    depth = 20000
    nodes = [helper.make_node("Neg", [f"t{k}" if k else "x"], [f"t{k + 1}"], name=f"neg{k}") for k in range(depth)]
    nodes += [helper.make_node("Shape", [f"t{depth}"], ["s"], name="shape"),
              helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT, name="cast"),
              helper.make_node("Add", [f"t{depth}", "sf"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    f = _Float(helper.make_model(graph), {})
    assert f.shape_derived("sf") and not f.shape_derived("y") and not f.shape_derived(f"t{depth}")


@pytest.mark.parametrize("base", ["conv", "mlp"])
def test_a_renamed_tensor_is_named_in_remedies_as_the_float_model_names_it(made, base):
    """Neural Compressor renames what it quantizes ('*_QuantizeInput'): a remedy's overrides,
    and the check of what a re-quantization changed, name the float model's tensors, which the
    alignment with it found; the renamed ones are in no model onnxruntime re-quantizes."""
    qpath, fpath, data, _ = made("inc", base)
    qm = QuantModel(str(qpath), float_model=str(fpath))
    tensors = {t for n in onnx.load(str(fpath)).graph.node for t in list(n.input) + list(n.output)}
    acts = [c for c in qm.of_kind("activation")]
    assert any(c.input.endswith("_QuantizeInput") for c in acts)  # the case
    assert all(float_tensor_name(qm, c) in tensors for c in acts), [float_tensor_name(qm, c) for c in acts]


def test_weights_on_their_grid_without_the_float_model_are_said_unmeasured_in_the_verdict(tmp_path):
    """aimet writes float weights already rounded onto their grid: bypassing a pair changes
    nothing, so weights only read 1 and the verdict blamed activations with no word of it."""
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.verdict import WEIGHTS_UNSEEN, three_configs

    data = builders.samples(3)
    fp = builders.conv_net(tmp_path / "f.onnx")
    q = conventions.make(fp, tmp_path / "q.onnx", data, "aimet")
    alone = Engine(str(q), data)
    v = three_configs(alone, parse_outputs(None, alone))
    assert v.values["calibration"]["weight only"] == pytest.approx(1.0, abs=1e-7) and WEIGHTS_UNSEEN in v.text
    given = Engine(str(q), data, float_model=str(fp))
    v = three_configs(given, parse_outputs(None, given))
    assert v.values["calibration"]["weight only"] < 1.0 - 1e-7 and WEIGHTS_UNSEEN not in v.text
    # a model without weight pairs has no weight error to miss: it read "no float model was given"
    # beside the float model given
    acts = builders.quantize(fp, tmp_path / "a.onnx", data, nodes_to_exclude=["conv1", "conv2", "fc"])
    only = Engine(str(acts), data, float_model=str(fp))
    assert not only.qmodel.of_kind("weight")
    assert WEIGHTS_UNSEEN not in three_configs(only, parse_outputs(None, only)).text


@pytest.mark.parametrize("base", ["conv", "mlp"])
def test_fp16_graph_a_pair_raised_to_16_bits_is_simulated_in_float32(made, base):
    """A 16-bit remedy in a float16 graph: its unnamed If gave every inlined Where one name,
    which onnxruntime refused as the user's file, and its codes (up to 65535) do not fit
    float16, whose whole numbers stop at 2048. Independently: the file with only that pair,
    its scale and zero point those of the 16-bit grid (a real 16-bit QuantizeLinear and
    DequantizeLinear, opset 21), run in a plain session: the simulation lies nearer it than
    the 8-bit file does. Not to 1e-6: an engine that carries alternatives reads a float16
X
    pair as far (conv: 5.8e-5 of the 1.2e-4 that 16 bits change; mlp: 4.5e-4 of 1.0e-2)."""
    from pytest_ptq.engine.instrument import instrument
    from pytest_ptq.remedy.alternatives import alternatives_for

    qpath, fpath, data, feeds = made("modelopt_int8_fp16", base)
    engine = Engine(qpath, data, optimization="all", segments=3)
    picked = [c for c in engine.qmodel.calibration.values() if engine.is_gated(c.name) and c.kind == "activation"][:2]
    alts, _ = alternatives_for(engine, "int16", [c.name for c in picked], [0])
    sim = engine.with_alternatives(alts)
    # the grid's arithmetic in float32, on the float16 scale the file would hold
    graph = instrument(sim.qmodel, sim._gates).graph
    scales = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name.endswith("::scale")}
    assert len(scales) == len(picked) and all(v.dtype == np.float32 and v == np.float16(v) for v in scales.values())
    for c in picked:
        a = alts[c.name]
        assert a.qmax - a.qmin > 2048  # past float16's whole numbers
        model = builders.rewire(qpath, keep={c.name})
        eight = builders.run_model(model, feeds, "all")
        zp_type = np.int16 if a.qmin < 0 else np.uint16
        model.graph.initializer.extend([numpy_helper.from_array(np.asarray(a.scale, np.float16), "w16_scale"),
                                        numpy_helper.from_array(np.asarray(a.zero_point, zp_type), "w16_zp")])
        for node in model.graph.node:
            if node.name in {c.q_node.name, *(d.name for d in c.dq_nodes)}:
                node.input[1:] = ["w16_scale", "w16_zp"]
        sixteen = builders.run_model(model, feeds, "all")
        for i in range(len(feeds)):
            got = sim.run(i, [c.name], alternative=[c.name])
            for k in sixteen[i]:
                off = np.abs(got[k] - sixteen[i][k]).max()
                gain = np.abs(eight[i][k] - sixteen[i][k]).max()  # what 16 bits change in the file
                assert off < gain, (base, c.name, k, off, gain)


def test_blocked_weights_are_titled_per_block_not_per_tensor(made, tmp_path, monkeypatch):
    """Model Optimizer's int4 weights carry a scale per block of 32: list-nodes said so, the
    figures' titles said "per tensor" and drew one rounding bound from the largest scale."""
    from pytest_ptq import channelwise
    from pytest_ptq.distribution import get_channelwise_data_distribution, plot_distribution, plots

    qpath, fpath, data, feeds = made("modelopt_int4", "mlp")
    engine = Engine(qpath, data, float_model=fpath)
    [node, *_] = [c.name for c in engine.qmodel.calibration.values() if c.block_size]
    saved = []
    for module in (plots, channelwise):
        monkeypatch.setattr(module, "save_figure", lambda fig, path, tight=True, save=module.save_figure:
                            (saved.append(fig), save(fig, path, tight))[1])
    plot_distribution(tmp_path / "d", engine, nodes_list=[node])
    get_channelwise_data_distribution(tmp_path / "b", engine, nodes_list=[node])
    titles = [fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title() for fig in saved]
    assert len(titles) == 2 and all("per block of 32" in t and "per tensor" not in t for t in titles), titles
    legends = [t.get_text() for ax in saved[0].axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert not any("rounding bound" in t for t in legends), legends
    assert any(t.startswith("widest of the ranges [") for t in legends), legends


def test_negative_block_scales_are_a_flipped_grid_not_a_broken_calibration(made):
    """onnxruntime's symmetric 4-bit quantizer divides each block's signed extreme by -8, so a
    block whose extreme is positive has a negative scale (its code -8). Each such weight was
    read as 96-118% clipped ("recalibrate"), with a note that its scale changes sign and a
    threshold of the signed scale's."""
    from pytest_ptq.distribution.gather import collect
    from pytest_ptq.distribution.readings import weight_issue

    qpath, fpath, data, _ = made("onnxruntime_int4_symmetric", "mlp")
    model = onnx.load(str(qpath))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    engine = Engine(qpath, data, float_model=fpath)
    qm = engine.qmodel
    weights = [c for c in qm.calibration.values() if c.block_size]
    assert weights and any((c.scale < 0).any() for c in weights)
    assert not [n for n in qm.notes if "scale of -" in n or "change sign" in n], qm.notes
    float_model = onnx.load(str(fpath))
    floats = {i.name: numpy_helper.to_array(i) for i in float_model.graph.initializer}
    weight_of = {n.name: n.input[1] for n in float_model.graph.node if n.op_type == "MatMul"}
    dist, _ = collect(engine, [c.name for c in weights])
    for c in weights:
        dq = c.dq_nodes[0]
        scale = np.repeat(inits[dq.input[1]].astype(np.float64), c.block_size, axis=0)
        w = floats[weight_of[c.consumers[0]]].astype(np.float64)
        lo, hi = np.minimum(-8 * scale, 7 * scale)[:len(w)], np.maximum(-8 * scale, 7 * scale)[:len(w)]
        half = np.abs(scale[:len(w)]) / 2
        # the extreme's opposite side reaches past 7 steps in a few blocks: those are clipped
        clipped = np.count_nonzero((w < lo - half) | (w > hi + half)) / w.size
        d = dist[c.name]
        assert d["clipped_share"] == pytest.approx(clipped) and clipped < 0.05
        assert d["threshold"] == pytest.approx(8 * np.abs(scale).max(), rel=1e-6)
        assert "clipped" not in weight_issue(d)[1], weight_issue(d)


def test_a_weight_only_models_remedy_is_not_checked_by_a_quantizer_of_activations(made):
    """A block-wise weight-only model was re-quantized with quantize_static, which quantized its
    activations too: the 'check' measured another model (0.967 against 0.990 as given) and
    blamed the calibration. It says why it is not re-quantized, and which two quantizers
    write such a model (the producer was named as Model Optimizer alone)."""
    from pytest_ptq.remedy.search import suggest_remedy

    qpath, fpath, data, _ = made("onnxruntime_int4_symmetric", "mlp")
    assert "MatMulNBitsQuantizer" in QuantModel(qpath).made_by.label
    r = suggest_remedy(str(qpath), data, target=0.99999, float_model=str(fpath), progress=False)
    assert r.nodes and r.measured is None
    assert any("quantizes weights only" in n and "quantize_static would quantize the activations" in n
               for n in r.notes), r.notes
    # its settings speak to the weight-only quantizer, which takes nodes_to_exclude too
    assert r.python_snippet().startswith("MatMulNBitsQuantizer(..., nodes_to_exclude=["), r.python_snippet()


def _blocked_mlp(tmp_path, name, weight_nodes, inits, opset=23, extra_domains=()):
    """x [2, 64] -> MatMul(x, W) with W from ``weight_nodes`` (writing 'w'), as an exporter for
    TensorRT or a newer opset writes it; data beside it."""
    nodes = [*weight_nodes, helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    *(helper.make_opsetid(d, 1) for d in extra_domains)])
    model.ir_version = 11
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    builders.save_folder({"x": np.random.default_rng(0).standard_normal((4, 2, 64)).astype(np.float32)},
                         tmp_path / "calib")
    return path


def test_exports_for_tensorrt_and_types_onnxruntime_cannot_run_are_told_as_such(tmp_path):
    """Model Optimizer's NVFP4 export (a block scale dequantized from fp8 by a second
    DequantizeLinear) read "takes its scale from a computed tensor ... quantize_dynamic"; its
    TensorRT plugin ops read "register the library ... e.g. AMD Quark's"; a float4 DQ quoted
    onnxruntime's "Could not find an implementation" alone."""
    from pytest_ptq import debug as dbg

    codes = numpy_helper.from_array(np.zeros((64, 16), np.float32).astype(ml_dtypes.float4_e2m1fn), "w_codes")
    fp8 = numpy_helper.from_array(np.ones((4, 16), np.float32).astype(ml_dtypes.float8_e4m3fn), "w_fp8_scale")
    glob = numpy_helper.from_array(np.array(0.01, np.float32), "w_global")
    two_level = _blocked_mlp(tmp_path, "nvfp4", [
        helper.make_node("DequantizeLinear", ["w_fp8_scale", "w_global"], ["w_scale"], name="w_scale_dq"),
        helper.make_node("DequantizeLinear", ["w_codes", "w_scale"], ["w"], name="w_dq", axis=0, block_size=16)],
        [codes, fp8, glob])
    with pytest.raises(PTQError, match=r"takes its scale 'w_scale' from DequantizeLinear 'w_scale_dq': a two-level "
                                       r"block scale.*NVFP4") as exc:
        QuantModel(two_level)
    assert "quantize_dynamic" not in str(exc.value)
    scale = numpy_helper.from_array(np.full((4, 16), 0.5, np.float32), "w_block_scale")
    fp4 = _blocked_mlp(tmp_path, "fp4", [
        helper.make_node("DequantizeLinear", ["w_codes", "w_block_scale"], ["w"], name="w_dq", axis=0, block_size=16)],
        [codes, scale])
    if onnx_runs(fp4):
        pytest.skip("this onnxruntime runs float4 DequantizeLinear")
    with pytest.raises(PTQError, match=r"onnxruntime \S+ cannot load .*fp4.onnx: it has no kernel for one of its nodes "
                                       r"\(.*DequantizeLinear.*\); pytest-ptq runs models in onnxruntime"):
        dbg.get_sensitivity_of_nodes(str(fp4), calibrated_data=tmp_path / "calib", node_type="weight", progress=False)
    trt = _blocked_mlp(tmp_path, "trt", [
        helper.make_node("TRT_INT4DequantizeLinear", ["w_int4", "w_channel_scale"], ["w"], name="w_dq", domain="trt",
                         axis=1)],
        [numpy_helper.from_array(np.zeros((64, 16), ml_dtypes.int4), "w_int4"),
         numpy_helper.from_array(np.full(16, 0.5, np.float32), "w_channel_scale")], extra_domains=("trt",))
    with pytest.raises(PTQError, match=r"uses TensorRT plugin ops trt::TRT_INT4DequantizeLinear .*which no onnxruntime "
                                       r"library implements") as exc:
        dbg.get_sensitivity_of_nodes(str(trt), calibrated_data=tmp_path / "calib", node_type="weight", progress=False)
    assert "Quark" not in str(exc.value)


def onnx_runs(path):
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return True
    except Exception:  # noqa: BLE001 - any refusal to load
        return False


def test_runall_asks_a_weight_only_model_for_8_bits_in_its_quantizers_terms(made, tmp_path):
    """runall told a block-wise int4 weight-only model to "raise to int16 (TensorQuantOverrides
    with a 16-bit type)": 8 bits is the next step below 8, and a weight-only quantizer takes no
    TensorQuantOverrides."""
    from pytest_ptq.runall import runall

    qpath, fpath, data, _ = made("onnxruntime_int4_symmetric", "mlp")
    s = runall(str(qpath), data, save_dir=tmp_path / "out", top=1, float_model=str(fpath), progress=False)
    steps = " ".join(s["verdict"]["next_steps"])
    assert "to 8 bits or more (the weight-only quantizer's 8-bit setting" in steps, steps
    assert "TensorQuantOverrides" not in steps and "to int16" not in steps, steps

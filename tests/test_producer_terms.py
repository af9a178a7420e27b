"""A remedy in the producer's own terms, checked against the graph without any producer.

Models in each producer's conventions (tests/conventions.py) carry its marks, so that the
producer is detected as from the real files. What the terms name is checked independently:
the float tensor is the one the float model's node reads where the QDQ node reads the pair;
Model Optimizer's exclusions are replayed by the conventions quantizer (pairs on the inputs
of quantized ops, as Model Optimizer places them), Quark's and Neural Compressor's by
onnxruntime's quantize_static (whose placement both inherit). Each named node must be needed
and together they must be enough.
"""

from __future__ import annotations

import dataclasses

import importlib
import json
import re
import stat
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import pytest

import builders
import conventions
from pytest_ptq.errors import PTQError
from pytest_ptq.model import QuantModel
from pytest_ptq.remedy import check_producer_terms, producer_recipe, producer_terms, requantize_with_producer, \
    suggest_remedy
from pytest_ptq.remedy.result import producer_lines

HERE = Path(__file__).resolve().parent


def _made_by(fpath, qpath, data, convention, producer):
    """``fpath`` quantized in ``convention`` to ``qpath``, marked as ``producer`` writes it."""
    conventions.make(fpath, qpath, data, convention)
    model = onnx.load(str(qpath))
    _mark(model, producer)
    onnx.save(model, str(qpath))
    return qpath


def _mark(model, producer):
    """What each producer writes into the file (tests/producers/README.md, measured)."""
    if producer in ("modelopt", "inc"):
        model.producer_name, model.producer_version = "onnx.quantize", "0.1.0"
    elif producer == "quark":
        model.producer_name, model.producer_version = "quark.onnx", "0.13"
    elif producer == "aimet":
        model.metadata_props.add(key="producer", value="aimet-onnx 2.42.0")
    if producer == "modelopt":
        model.ir_version = 10


class Made:
    def __init__(self, root):
        self.root, self.cache = root, {}

    def float(self, base):
        if base == "conv":
            return builders.conv_net(self.root / "conv.onnx"), builders.samples(3)
        return conventions.mlp_net(self.root / "mlp.onnx"), conventions.mlp_samples(3)

    def __call__(self, convention, producer, base="conv", quant_suffix=False):
        key = (convention, producer, base, quant_suffix)
        if key not in self.cache:
            fpath, data = self.float(base)
            qpath = conventions.make(fpath, self.root / f"{convention}_{producer}_{base}_{quant_suffix}.onnx", data,
                                     convention)
            model = onnx.load(str(qpath))
            if quant_suffix:  # Neural Compressor renames the nodes it quantizes '<name>_quant'
                dq_out = {d.output[0] for d in model.graph.node if d.op_type == "DequantizeLinear"}
                for n in model.graph.node:
                    if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and set(n.input) & dq_out:
                        n.name += "_quant"
            _mark(model, producer)
            onnx.save(model, str(qpath))
            self.cache[key] = (qpath, fpath, data)
        return self.cache[key]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return Made(tmp_path_factory.mktemp("producer_terms"))


def _expected_tensor(qpath, fpath, c):
    """The float tensor of calibration node ``c``, read from the protos: what the float node of
    the same name (less a '_quant' suffix) reads where the QDQ node reads the pair."""
    q, f = onnx.load(str(qpath)), onnx.load(str(fpath))
    fnodes = {n.name: n for n in f.graph.node}
    dq_out = {d.output[0] for d in c.dq_nodes}
    for n in q.graph.node:
        for k, i in enumerate(n.input):
            if i in dq_out:
                return fnodes[n.name.removesuffix("_quant")].input[k]
    return None


def _pairs_on(path):
    """The float tensors quantized in a conventions-made or onnxruntime model: Q inputs and
    lone-DQ initializers, less the suffixes those quantizers give stored weights."""
    out = set()
    for q, dqs in builders.qdq_pairs(path).values():
        name = q.input[0] if q is not None else dqs[0].input[0]
        for suffix in ("_float", "_quantized"):
            name = name.removesuffix(suffix)
        out.add(name)
    return out


def _float_names(fpath):
    return [n.name for n in onnx.load(str(fpath)).graph.node]


def _modelopt_expand(fpath, settings):
    """Node names Model Optimizer excludes for these settings: its patterns are applied with
    ``re.match`` (graph_utils.expand_node_names_from_patterns), op types by op."""
    f = onnx.load(str(fpath))
    return [n.name for n in f.graph.node if any(re.match(p, n.name) for p in settings["nodes_to_exclude"])
            or n.op_type in settings["op_types_to_exclude"]]


@pytest.mark.parametrize("base", ["conv", "mlp"])
def test_model_optimizer_exclusions_are_exactly_the_nodes_that_read_the_pair(made, base, tmp_path):
    qpath, fpath, data = made("modelopt_int8_fp32", "modelopt", base)
    qm = QuantModel(str(qpath), float_model=str(fpath))
    assert qm.made_by.key == "modelopt"
    checked = 0
    for c in qm.calibration.values():
        terms = producer_terms(qm, "float", [c.name], float_model=str(fpath))
        tensor = terms["nodes"][c.name]["tensor"]
        assert tensor == _expected_tensor(qpath, fpath, c), c.name
        assert terms["expect"]["float"] == [tensor]
        names = _modelopt_expand(fpath, terms["settings"])
        assert names and set(names) <= set(_float_names(fpath))
        again = conventions.make(fpath, tmp_path / "all.onnx", data, "modelopt_int8_fp32", exclude=names)
        assert tensor not in _pairs_on(again), (c.name, names)
        for n in names:  # each one is needed
            fewer = conventions.make(fpath, tmp_path / "fewer.onnx", data, "modelopt_int8_fp32",
                                     exclude=[m for m in names if m != n])
            assert tensor in _pairs_on(fewer), (c.name, n)
        checked += 1
    assert checked >= 4


def test_model_optimizer_patterns_match_one_node_and_whole_op_types_go_by_type(made, tmp_path):
    fpath, data = made.float("conv")
    model = onnx.load(str(fpath))
    next(n for n in model.graph.node if n.name == "conv2").name = "conv1_b"  # 'conv1' now prefixes it
    renamed = tmp_path / "renamed.onnx"
    onnx.save(model, str(renamed))
    qpath = _made_by(renamed, tmp_path / "q.onnx", data, "modelopt_int8_fp32", "modelopt")
    qm = QuantModel(str(qpath), float_model=str(renamed))
    x = next(c.name for c in qm.calibration.values() if c.input == "x")
    terms = producer_terms(qm, "float", [x], float_model=str(renamed))
    assert terms["settings"]["nodes_to_exclude"] == ["conv1$"]
    assert _modelopt_expand(renamed, terms["settings"]) == ["conv1"]
    weights = [c.name for c in qm.of_kind("weight") if c.consumers[0] in ("conv1", "conv1_b")]
    both = producer_terms(qm, "float", weights, float_model=str(renamed))
    assert both["settings"] == {"nodes_to_exclude": [], "op_types_to_exclude": ["Conv"]}
    assert "--op_types_to_exclude Conv" in both["lines"][0]


def _ort_pairs(fpath, data, exclude, path):
    return _pairs_on(builders.quantize(fpath, path, data, nodes_to_exclude=exclude))


def test_quark_exclusions_are_onnxruntime_placements_producer_and_consumers(made, tmp_path):
    qpath, fpath, data = made("quark_xint8", "quark", "conv")
    qm = QuantModel(str(qpath), float_model=str(fpath))
    assert qm.made_by.key == "quark"
    checked = 0
    for c in qm.of_kind("activation"):
        terms = producer_terms(qm, "float", [c.name], float_model=str(fpath))
        tensor = terms["nodes"][c.name]["tensor"]
        assert tensor == _expected_tensor(qpath, fpath, c), c.name
        names = terms["settings"]["exclude"]
        assert set(names) <= set(_float_names(fpath))
        assert tensor not in _ort_pairs(fpath, data, names, tmp_path / "all.onnx"), (c.name, names)
        for n in names:
            fewer = [m for m in names if m != n]
            assert tensor in _ort_pairs(fpath, data, fewer, tmp_path / "fewer.onnx"), (c.name, n)
        checked += 1
    assert checked >= 3


def test_neural_compressor_names_lose_their_quant_suffix_and_take_the_folded_relu(made, tmp_path):
    qpath, fpath, data = made("inc", "inc", "conv", quant_suffix=True)
    qm = QuantModel(str(qpath), float_model=str(fpath))
    assert qm.made_by.key == "neural-compressor"
    folded = [c for c in qm.of_kind("activation") if c.folded]
    assert folded  # the convention deletes the Relu after conv1 and takes its range
    for c in qm.of_kind("activation"):
        terms = producer_terms(qm, "float", [c.name], float_model=str(fpath))
        tensor = terms["nodes"][c.name]["tensor"]
        assert tensor == _expected_tensor(qpath, fpath, c), c.name
        names = terms["settings"]["nodes_to_exclude"]
        assert set(names) <= set(_float_names(fpath)), names
        assert not any(n.endswith("_quant") for n in names)
        quantized = _ort_pairs(fpath, data, names, tmp_path / "all.onnx")
        assert tensor not in quantized, (c.name, names)
        if c.folded:  # the tensor before the folded Relu stays float as well
            relu = next(n for n in onnx.load(str(fpath)).graph.node if n.output[0] == tensor)
            assert relu.name in names and relu.input[0] not in quantized
    # without the float model: the QDQ graph's names, less '_quant', and a note saying so
    bare = QuantModel(str(qpath))
    c = folded[0]
    terms = producer_terms(bare, "float", [c.name])
    assert terms["names"] == "QDQ graph" and all(not n.endswith("_quant") for n in terms["settings"]["nodes_to_exclude"])
    assert any("pass the float model" in n for n in terms["notes"])


def test_aimet_terms_name_the_float_tensors_of_its_quantizers(made):
    qpath, fpath, _ = made("aimet", "aimet", "conv")
    qm = QuantModel(str(qpath), float_model=str(fpath))
    assert qm.made_by.key == "aimet"
    acts = [c for c in qm.calibration.values() if c.is_activation]
    weights = [c for c in qm.of_kind("weight")]
    kinds = {acts[0].name: "float", acts[1].name: "int16", weights[0].name: "per-channel"}
    terms = producer_terms(qm, "mixed", list(kinds), {weights[0].name: 0}, kinds, float_model=str(fpath))
    want = {n: _expected_tensor(qpath, fpath, qm.calibration[n]) for n in kinds}
    assert {n: e["tensor"] for n, e in terms["nodes"].items()} == want
    assert "w1" in want.values()  # the weight is named as in the float model, not as stored ('w1_float')
    assert terms["settings"] == {"disable": [want[acts[0].name]], "bitwidth": {want[acts[1].name]: 16},
                                 "per_channel": [want[weights[0].name]]}
    assert terms["expect"] == {"float": [want[acts[0].name]], "int16": [want[acts[1].name]],
                               "per-channel": [want[weights[0].name]]}


def test_aimet_terms_name_the_quantizer_a_pair_after_a_flatten_copies(tmp_path):
    """aimet's export puts a pair after a Flatten with the encoding of the pair before it: it
    has no quantizer of its own there ('f'), so its terms name the one it copies ('p'); a pair
    of its own encoding after a Flatten keeps its name."""
    from onnx import TensorProto, helper, numpy_helper

    def model(f_scale):
        inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z"),
                 numpy_helper.from_array(np.float32(f_scale), "sf"),
                 numpy_helper.from_array(np.ones((8, 2), np.float32), "w")]
        nodes = [helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"], name="p_q"),
                 helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["pd"], name="p_dq"),
                 helper.make_node("Flatten", ["pd"], ["f"], name="flatten"),
                 helper.make_node("QuantizeLinear", ["f", "sf", "z"], ["fq"], name="f_q"),
                 helper.make_node("DequantizeLinear", ["fq", "sf", "z"], ["fd"], name="f_dq"),
                 helper.make_node("MatMul", ["fd", "w"], ["y"], name="mm")]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 2, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        _mark(m, "aimet")
        onnx.save(m, str(tmp_path / "m.onnx"))
        return QuantModel(str(tmp_path / "m.onnx"))

    for f_scale, named in ((0.05, "p"), (0.07, "f")):
        qm = model(f_scale)
        terms = producer_terms(qm, "int16", ["f_q"])
        assert terms["settings"]["bitwidth"] == {named: 16}, terms


@pytest.mark.parametrize("convention,producer", [("modelopt_int8_fp32", "modelopt"), ("inc", "inc")])
def test_no_int16_term_where_the_producer_has_none_keeping_float_is_offered_instead(made, convention, producer):
    qpath, fpath, _ = made(convention, producer, "conv")
    qm = QuantModel(str(qpath), float_model=str(fpath))
    c = next(c for c in qm.of_kind("activation") if c.consumers and c.producer)
    raised = producer_terms(qm, "int16", [c.name], float_model=str(fpath))
    floated = producer_terms(qm, "float", [c.name], float_model=str(fpath))
    assert raised["expect"] == {"float": [], "int16": [], "per-channel": []}
    assert all(not v for v in raised["settings"].values())  # nothing emitted
    assert [u["node"] for u in raised["unsupported"]] == [c.name] and "int16" in raised["unsupported"][0]["why"]
    excluded = floated["settings"]["nodes_to_exclude"]
    assert raised["unsupported"][0]["instead"] == {"nodes_to_exclude": floated["nodes"][c.name]["nodes"]}
    assert all(n in raised["instead"] for n in excluded)
    text = "\n".join(producer_lines(raised))
    assert "no " in text and "to keep those in float instead" in text


@pytest.mark.parametrize("convention,producer,qtype", [("quark_xint8", "quark", "QInt16"),
                                                       ("quark_a16w8", "quark", "QUInt16")])
def test_quark_raises_a_tensor_to_16_bit_with_its_sign(made, convention, producer, qtype):
    qpath, fpath, _ = made(convention, producer, "conv")
    qm = QuantModel(str(qpath), float_model=str(fpath))
    c = next(c for c in qm.of_kind("activation") if c.producer)
    terms = producer_terms(qm, "int16", [c.name], float_model=str(fpath))
    tensor = _expected_tensor(qpath, fpath, c)
    assert terms["settings"]["TensorQuantOverrides"] == {tensor: [{"quant_type": qtype}]}
    assert f"ExtendedQuantType.{qtype}" in "\n".join(terms["lines"])


@pytest.mark.parametrize("convention,producer", [("modelopt_int8_fp32", "modelopt"), ("quark_xint8", "quark"),
                                                 ("inc", "inc"), ("aimet", "aimet")])
def test_activations_per_channel_have_no_term_anywhere(made, convention, producer):
    qpath, fpath, _ = made(convention, producer, "conv")
    qm = QuantModel(str(qpath), float_model=str(fpath))
    c = next(c for c in qm.of_kind("activation") if c.producer)
    terms = producer_terms(qm, "per-channel", [c.name], float_model=str(fpath))
    assert [u["node"] for u in terms["unsupported"]] == [c.name]
    assert not any(terms["expect"].values())


def test_onnxruntime_and_unknown_producers_get_no_second_block(zoo):
    qm = QuantModel(str(zoo.qdq()))
    assert producer_terms(qm, "float", ["r1_QuantizeLinear"]) is None


def test_bad_input_is_one_sentence(made):
    qpath, fpath, _ = made("modelopt_int8_fp32", "modelopt", "conv")
    qm = QuantModel(str(qpath))
    with pytest.raises(PTQError, match="calibration node"):
        producer_terms(qm, "float", ["no_such_node"])
    with pytest.raises(PTQError, match="remedy"):
        producer_terms(qm, "fp4", [next(iter(qm.calibration))])


def test_suggest_prints_the_producers_terms_and_says_how_to_check_them(made, monkeypatch, tmp_path):
    monkeypatch.delenv("PTQ_MODELOPT_PYTHON", raising=False)
    qpath, fpath, data = made("modelopt_int8_fp32", "modelopt", "conv")
    r = suggest_remedy(str(qpath), data, target=0.99999, remedy="float", float_model=str(fpath),
                       requantize_check=True)
    assert r.nodes and r.producer_terms["producer"] == "modelopt"
    text = r.summary()
    assert "in NVIDIA Model Optimizer's terms (names of the float model):" in text
    assert "--nodes_to_exclude" in text and "nodes_to_exclude=" in text  # beside onnxruntime's
    assert any("PTQ_MODELOPT_PYTHON" in n for n in r.notes) and r.producer_measured is None
    saved = json.loads(Path(r.save(tmp_path / "remedy.json")).read_text())
    assert saved["producer_terms"]["settings"] == r.producer_terms["settings"]
    for n, entry in r.producer_terms["nodes"].items():
        assert entry["tensor"] == _expected_tensor(qpath, fpath, QuantModel(str(qpath)).calibration[n])


FAKE = '''
"""A stand-in for Model Optimizer: the conventions quantizer with its exclusions."""
import json, re, sys
import numpy as np, onnx
sys.path.insert(0, {tests!r})
import conventions
spec = json.load(open(sys.argv[2]))  # argv[1]: the producer script, not needed here
if {fail!r}:
    sys.exit("ModuleNotFoundError: No module named 'modelopt'")
with np.load(spec["samples"]) as z:
    data = {{k: list(z[k]) for k in z.files}}
s = spec["settings"]
f = onnx.load(spec["float"])
names = [n.name for n in f.graph.node if any(re.match(p, n.name) for p in s.get("nodes_to_exclude", []))
         or n.op_type in s.get("op_types_to_exclude", [])]
if {ignore!r}:  # a producer that takes the terms and quantizes everything anyway
    names = []
conventions.make(spec["float"], spec["out"], data, "modelopt_int8_fp32", exclude=names)
'''


def _fake_python(tmp_path, fail=False, ignore=False):
    tag = "fail_" if fail else ("ignore_" if ignore else "")
    script = tmp_path / f"fake_{tag}modelopt.py"
    script.write_text(FAKE.format(tests=str(HERE), fail=fail, ignore=ignore))
    python = tmp_path / f"{tag}python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable!r} {str(script)!r} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return str(python)


def test_the_check_re_quantizes_and_reads_what_the_producer_did(made, monkeypatch, tmp_path):
    qpath, fpath, data = made("modelopt_int8_fp32", "modelopt", "conv")
    from pytest_ptq.engine import Engine

    engine = Engine(str(qpath), data, float_model=str(fpath))
    qm = engine.qmodel
    assert producer_recipe(qm) == {"quantize_mode": "int8", "high_precision_dtype": "fp32", "dq_only": False}
    c = next(c for c in qm.of_kind("activation") if len(c.consumers) > 1)
    terms = producer_terms(qm, "float", [c.name], float_model=str(fpath))
    monkeypatch.setenv("PTQ_MODELOPT_PYTHON", _fake_python(tmp_path))
    m = check_producer_terms(engine, terms, save_dir=tmp_path / "out")
    tensor = terms["nodes"][c.name]["tensor"]
    assert m["kept"]["float"] == {tensor: True} and m["applied"] and m["not_applied"] == []
    assert 0 < m["before"]["calibration"] <= 1 and 0 < m["after"]["calibration"] <= 1
    assert Path(m["model"]).exists() and Path(m["baseline_model"]).exists()
    # terms that leave the tensor quantized are caught
    short = dict(terms, settings={"nodes_to_exclude": terms["settings"]["nodes_to_exclude"][:1],
                                  "op_types_to_exclude": []})
    m = check_producer_terms(engine, short)
    assert m["kept"]["float"] == {tensor: False} and m["not_applied"] == [tensor]


def test_a_producer_that_fails_or_is_missing_is_one_sentence(made, monkeypatch, tmp_path):
    qpath, fpath, data = made("modelopt_int8_fp32", "modelopt", "conv")
    from pytest_ptq.data import load_data

    samples = load_data(data, None, None)
    monkeypatch.delenv("PTQ_MODELOPT_PYTHON", raising=False)
    with pytest.raises(PTQError, match="set PTQ_MODELOPT_PYTHON"):
        requantize_with_producer("modelopt", fpath, samples, tmp_path / "x.onnx")
    with pytest.raises(PTQError, match="does not exist"):
        requantize_with_producer("modelopt", fpath, samples, tmp_path / "x.onnx", python=str(tmp_path / "nope"))
    with pytest.raises(PTQError, match=r"could not re-quantize .*No module named 'modelopt'"):
        requantize_with_producer("modelopt", fpath, samples, tmp_path / "x.onnx", python=_fake_python(tmp_path, True))
    # the real script in a Python without the producer says what is missing, in one line
    with pytest.raises(PTQError, match="No module named"):
        requantize_with_producer("aimet", fpath, samples, tmp_path / "x.onnx", python=sys.executable)
    assert not (tmp_path / "x.onnx").exists()


STUB_AIMET = '''
"""A stand-in for aimet_onnx.quantsim: the model it is given, returned as the quantized one."""
import types


class QuantizationSimModel:
    def __init__(self, model, **kw):
        self.model, self.qc_quantize_op_dict = types.SimpleNamespace(model=model), {}

    def compute_encodings(self, samples):
        """Calibration: nothing to compute, the model goes back as it came."""

    def to_onnx_qdq(self, prequantize_constants=False):
        return self.model.model
'''


def test_the_producer_script_reads_a_binary_float_model_named_json(tmp_path):
    """The producer script reads the float model with onnx.load, which picks the format from
    the extension: a binary model named .json reaches it as the copy the caller reads by
    content and saves as float.onnx, so the producer is given that model, not a JSON error.
    The real script runs in a Python with an aimet_onnx stand-in that returns its input."""
    from pytest_ptq.data import load_data

    model = onnx.load(str(builders.conv_net(tmp_path / "conv.onnx")))
    fpath = tmp_path / "float.json"
    fpath.write_bytes(model.SerializeToString())  # binary: onnx.save would write JSON here
    (tmp_path / "stub" / "aimet_onnx").mkdir(parents=True)
    (tmp_path / "stub" / "aimet_onnx" / "__init__.py").write_text("")
    (tmp_path / "stub" / "aimet_onnx" / "quantsim.py").write_text(STUB_AIMET)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={str(tmp_path / 'stub')!r} exec {sys.executable!r} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    samples = load_data({"x": builders.samples(2)["x"]})
    out = requantize_with_producer("aimet", fpath, samples, tmp_path / "out.onnx", python=str(python))
    got = onnx.load(str(out))
    assert [(n.op_type, list(n.input), list(n.output)) for n in got.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    assert {i.name: i.raw_data for i in got.graph.initializer} == {i.name: i.raw_data for i in model.graph.initializer}


def test_recipes_follow_what_the_pairs_show(made):
    quark = QuantModel(str(made("quark_xint8", "quark", "conv")[0]))
    assert producer_recipe(quark) == {"config": "XINT8_QCONFIG"}  # power-of-two scales
    assert producer_recipe(QuantModel(str(made("quark_a16w8", "quark", "conv")[0]))) == {"config": "A16W8_QCONFIG"}
    assert producer_recipe(QuantModel(str(made("inc_per_channel", "inc", "conv")[0]))) == {"per_channel": True}
    aimet = producer_recipe(QuantModel(str(made("aimet", "aimet", "conv")[0])))
    assert aimet["activation_type"] == "int8" and aimet["per_channel"] is True
    # per-tensor weights, where aimet's default config is per channel: its re-run is told so
    fpath, data = made.float("conv")
    qpath = conventions.make(fpath, made.root / "aimet_per_tensor.onnx", data,
                             dataclasses.replace(conventions.CONVENTIONS["aimet"], per_channel=False))
    model = onnx.load(str(qpath))
    _mark(model, "aimet")
    onnx.save(model, str(qpath))
    assert producer_recipe(QuantModel(str(qpath)))["per_channel"] is False


@pytest.fixture(scope="module")
def side_modelopt(tmp_path_factory):
    """builders.side_net in Model Optimizer's conventions, calibrated on noise that hides the
    loss the smooth held-out data show (see tests/test_remedy_heldout.py); its ``side`` output
    passes a Mul by 1, so that a quantizer placing pairs on the inputs of quantized ops only
    quantizes (and clips) it."""
    root = tmp_path_factory.mktemp("side_modelopt")
    cal, held = builders.samples(16, size=16), builders.smooth_samples(16)
    model = onnx.load(str(builders.side_net(root / "float.onnx")))
    conv = next(n for n in model.graph.node if n.name == "conv_side")
    conv.output[0] = "side_raw"
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(1, np.float32), "one"))
    model.graph.node.append(onnx.helper.make_node("Mul", ["side_raw", "one"], ["side"], name="side_mul"))
    fpath = root / "float.onnx"
    onnx.save(model, str(fpath))
    qpath = _made_by(fpath, root / "qdq.onnx", cal, "modelopt_int8_fp32", "modelopt")
    return {"float": fpath, "qdq": qpath, "cal": cal, "held": held, "held_dir": builders.save_folder(held, root / "held")}


def _plain_cosine(m, path):
    """Worst output cosine of the model at ``path`` against the float model on the held-out data,
    both in plain onnxruntime sessions."""
    feeds = [{"x": x} for x in m["held"]["x"]]
    return builders.worst_cosine(builders.run_model(m["float"], feeds), builders.run_model(path, feeds))


def _suggest(m, tmp_path, monkeypatch, **fake):
    monkeypatch.setenv("PTQ_MODELOPT_PYTHON", _fake_python(tmp_path, **fake))
    return suggest_remedy(str(m["qdq"]), m["cal"], target=0.99, heldout=m["held_dir"], float_model=str(m["float"]),
                          save_dir=tmp_path / "out", progress=False)


def test_the_producers_re_quantization_is_judged_on_the_held_out_data(side_modelopt, monkeypatch, tmp_path):
    r = _suggest(side_modelopt, tmp_path, monkeypatch)
    assert r.met and r.judged_on == "held-out" and r.nodes and r.producer_terms["producer"] == "modelopt"
    m = r.producer_measured
    held = m["figures"]["held-out"]
    # independently: the producer's two files and the model as given, in plain sessions
    assert held["after"] == pytest.approx(_plain_cosine(side_modelopt, m["model"]), abs=1e-5)
    assert held["before"] == pytest.approx(_plain_cosine(side_modelopt, m["baseline_model"]), abs=1e-5)
    assert held["original"] == pytest.approx(_plain_cosine(side_modelopt, side_modelopt["qdq"]), abs=1e-5)
    assert held["before"] < 0.99 <= held["after"] and held["met"] and m["met"]
    assert r.requantized == ("ModelOpt", m) and r.failure() is None
    assert r.judged_by() == "simulated and re-quantized with ModelOpt"
    text = r.summary()
    assert f"on held-out data: cosine-similarity {held['after']:.6g}" in text
    assert "onnxruntime's quantizer, not ModelOpt's that made the model: reported, not part of the verdict" in text


def test_a_producer_that_misses_on_held_out_data_fails_the_remedy(side_modelopt, monkeypatch, tmp_path, capsys):
    r = _suggest(side_modelopt, tmp_path, monkeypatch, ignore=True)
    held = r.producer_measured["figures"]["held-out"]
    assert r.met and r.measured["met"]  # the simulation and onnxruntime's re-quantization both hold
    assert held["after"] == pytest.approx(_plain_cosine(side_modelopt, r.producer_measured["model"]), abs=1e-5)
    assert held["after"] < 0.99 and not r.producer_measured["met"]
    assert r.failure() == (f"re-quantized with ModelOpt, the model reaches cosine-similarity {held['after']:.6g} "
                           "on held-out data, short of the target 0.99")
    assert "re-quantized with ModelOpt it falls short (below)" in r.summary()
    last = [c.strip() for c in r.figures_table().splitlines()[-2].split("|")[1:-1]]
    assert last == ["held-out, re-quantized with ModelOpt", f"{held['before']:.6f}", f"{held['after']:.6f}",
                    "0.990000", "no"]
    assert any("did not come out as the remedy asks" in w for w in r.warnings)
    # the command line's exit status says the same
    from pytest_ptq.cli import main

    cal = builders.save_folder(side_modelopt["cal"], tmp_path / "calib")
    rc = main(["suggest", str(side_modelopt["qdq"]), str(cal), "--heldout", str(side_modelopt["held_dir"]),
               "--float-model", str(side_modelopt["float"]), "--no-save", "--quiet"])
    assert rc == 1 and capsys.readouterr().out.rstrip().endswith(f"exit 1: {r.failure()}")


def test_onnxruntime_missing_does_not_fail_a_third_party_models_remedy(side_modelopt, monkeypatch, tmp_path):
    rq = importlib.import_module("pytest_ptq.remedy.requantize")  # the package's name is its function
    real = rq.requantize
    # onnxruntime's re-quantization dropping the settings: its model misses on the held-out data
    monkeypatch.setattr(rq, "requantize", lambda f, out, data, options, settings=None, kept=None:
                        real(f, out, data, options, kept=kept))
    r = _suggest(side_modelopt, tmp_path, monkeypatch)
    assert not r.measured["met"] and r.producer_measured["met"] and r.failure() is None
    monkeypatch.delenv("PTQ_MODELOPT_PYTHON")
    r = suggest_remedy(str(side_modelopt["qdq"]), side_modelopt["cal"], target=0.99, heldout=side_modelopt["held_dir"],
                       float_model=str(side_modelopt["float"]), progress=False)
    assert not r.measured["met"] and r.producer_measured is None and r.failure() is None
    assert r.judged_by() == "simulated; not re-quantized with ModelOpt, which made the model (see the notes)"
    assert any("PTQ_MODELOPT_PYTHON" in n for n in r.notes)


@pytest.fixture(scope="module")
def quark_inlined(tmp_path_factory):
    """conventions.inlined_net marked as Quark writes it: ``(net, model as written, QuantModel)``."""
    net = conventions.inlined_net(tmp_path_factory.mktemp("quark_inlined"))
    model = onnx.load(str(net["qdq"]))
    _mark(model, "quark")
    onnx.save(model, str(net["qdq"]))
    return net, model, QuantModel(str(net["qdq"]), float_model=str(net["float"]))


def _touched_by_unnamed(model, qm):
    """Activation calibration nodes whose tensor a node unnamed in the file writes or reads,
    found from the file's Q/DQ wiring."""
    nodes = list(model.graph.node)
    writer = {o: n for n in nodes for o in n.output}
    readers = defaultdict(list)
    for n in nodes:
        for i in n.input:
            readers[i].append(n)
    out = {}
    for c in qm.of_kind("activation"):
        if c.producer not in qm.normal:
            continue
        q = next(n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] == c.input)
        dqs = [d for d in readers[q.output[0]] if d.op_type == "DequantizeLinear"]
        out[c.name] = [writer[c.input]] + [r for d in dqs for r in readers[d.output[0]]]
    return out


def test_quark_terms_use_the_names_of_its_own_graph_and_say_what_has_none(quark_inlined):
    # Quark inlines HardSwish as HardSigmoid (named) and Mul (unnamed) and quantizes between
    # them; its exclude matches node names, so a tensor that the unnamed Mul reads or writes
    # cannot be kept in float by it
    net, model, qm = quark_inlined
    touching = _touched_by_unnamed(model, qm)
    terms = producer_terms(qm, "float", list(touching), float_model=str(net["float"]))
    unsupported = {u["node"] for u in terms["unsupported"]}
    named = {n.name for n in model.graph.node if n.name} | {n.name for n in onnx.load(str(net["float"])).graph.node}
    assert set(terms["settings"]["exclude"]) <= named and terms["settings"]["exclude"]
    assert "HardSigmoid_0" not in terms["settings"]["exclude"]  # a name only the alignment's inlining gives
    nameless = 0
    for name, by in touching.items():
        if any(not n.name for n in by):
            nameless += 1
            assert name in unsupported and "has no name" in next(
                u["why"] for u in terms["unsupported"] if u["node"] == name)
        else:
            assert name not in unsupported
            assert {n.name for n in by} <= set(terms["settings"]["exclude"])
    assert nameless == 3  # the pairs on the HardSwish's input, its HardSigmoid's output and its own output


def test_the_search_keeps_in_float_only_what_the_producer_can_exclude(quark_inlined):
    net, model, qm = quark_inlined
    nameless = {n for n, by in _touched_by_unnamed(model, qm).items() if any(not b.name for b in by)}
    r = suggest_remedy(str(net["qdq"]), net["samples"], target=0.999999, remedy="float", float_model=str(net["float"]),
                       requantize_check=False, progress=False)
    ranked = {e["node"] for e in r.ranking}
    assert r.met and r.nodes and ranked and not ranked & nameless and not r.producer_terms["unsupported"]
    assert any(n.startswith("3 node(s) not kept in float by the search: Quark has no term") for n in r.notes)
    # named, they are searched (in simulation), and the terms say what Quark cannot do
    r = suggest_remedy(str(net["qdq"]), net["samples"], target=0.9999999, remedy="float",
                       float_model=str(net["float"]), candidates=sorted(nameless), requantize_check=False,
                       progress=False, full_curve=True)
    assert {e["node"] for e in r.ranking} == nameless
    assert not any("not kept in float by the search" in n for n in r.notes)


@pytest.fixture(scope="module")
def outlier_made(tmp_path_factory):
    """A conv net whose first weight has an outlier channel, in Neural Compressor's, Model
    Optimizer's and onnxruntime's conventions, and with 4-bit weights in Neural Compressor's
    (a model that fails), with its float model and data."""
    import dataclasses

    root = tmp_path_factory.mktemp("outlier_made")
    fpath = builders.conv_net(root / "float.onnx", outlier_channel=3)
    data = builders.samples(4, seed=1)
    builders.save_folder(data, root / "calib")
    made = {"onnxruntime": builders.quantize(fpath, root / "ort.onnx", data)}
    for convention, producer in (("inc", "inc"), ("modelopt_int8_fp32", "modelopt")):
        made[producer] = _made_by(fpath, root / f"{convention}.onnx", data, convention, producer)
    int4 = dataclasses.replace(conventions.CONVENTIONS["inc"], weight=onnx.TensorProto.INT4)
    made["inc int4"] = _made_by(fpath, root / "inc_int4.onnx", data, int4, "inc")
    return root, fpath, made


def _reading(fpath, weight):
    """The float model's node that reads initializer ``weight``, found in the proto."""
    return next(n.name for n in onnx.load(str(fpath)).graph.node if weight in n.input)


def test_runall_says_its_next_steps_in_the_producers_terms(outlier_made, tmp_path):
    """runall's next steps name onnxruntime's settings; for a model another quantizer made,
    a last step says them in that quantizer's terms (Neural Compressor's per-node per-channel
    weights on the float node that reads the outlier weight; no int16, which it has not);
    nothing more for onnxruntime's own model. The summary shows each step, its code as code."""
    from pytest_ptq.runall import runall

    root, fpath, made = outlier_made
    steps = {}
    for producer in ("onnxruntime", "inc", "modelopt"):
        s = runall(str(made[producer]), root / "calib", float_model=str(fpath), save_dir=tmp_path / producer, top=3,
                   progress=False)
        steps[producer] = s["verdict"]["next_steps"]
        md = (tmp_path / producer / "summary.md").read_text()
        for step in steps[producer]:
            first, *code = step.split("\n")
            assert first in md and all(f"       {line}" in md for line in code)
    assert not any("terms" in st for st in steps["onnxruntime"])
    inc = steps["inc"][-1].split("\n")
    assert inc[0] == "in Intel Neural Compressor's terms (names of the float model) (optional):"
    assert any("quantize weights per channel" in st for st in steps["inc"][:-1])
    assert any(f"set_local('{_reading(fpath, 'w1')}'" in line and "per_channel=True" in line for line in inc)
    if any("int16" in st for st in steps["inc"][:-1]):
        assert any(line.startswith("no Neural Compressor term") for line in inc)
    assert steps["modelopt"][-1].startswith("in NVIDIA Model Optimizer's terms")


def test_the_diagnosis_adds_the_producers_terms_to_its_fixes(outlier_made):
    """A failing model made by Neural Compressor: the fixes keep its 4-bit weights in float, in
    onnxruntime's terms and in Neural Compressor's, which exclude the float nodes reading them;
    onnxruntime's own model gets no second block."""
    from pytest_ptq.analysis import Analysis, AnalysisKey

    root, fpath, made = outlier_made
    shown = {producer: Analysis(AnalysisKey(str(made[producer]), str(root / "calib"), str(fpath)), root)
             .diagnosis("weight") for producer in ("onnxruntime", "inc int4")}
    assert shown["onnxruntime"].producer_terms == [] and shown["onnxruntime"].terms == "onnxruntime quantize_static"
    inc = shown["inc int4"]
    assert inc.source == "weight" and "Neural Compressor's own terms follow" in inc.terms
    floated = [n for f in inc.fixes if f["short"] == "keep nodes in float" for n in f["nodes"]]
    assert floated and inc.producer_terms[0] == "in Intel Neural Compressor's terms (names of the float model):"
    # the QDQ nodes reading each kept DQ, named as Neural Compressor's settings name them
    qdq = onnx.load(str(made["inc int4"])).graph.node
    outs = {d.output[0] for d in qdq if d.name in floated}
    excluded = {n.name.removesuffix("_quant") for n in qdq if set(n.input) & outs}
    assert excluded <= {n.name for n in onnx.load(str(fpath)).graph.node}
    line = next(line for line in inc.producer_terms if "nodes_to_exclude=" in line)
    assert set(re.search(r"nodes_to_exclude=(\[[^]]*\])", line).group(1).strip("[]").replace("'", "").split(", ")) \
        == excluded
    assert "\n".join("  " + line for line in inc.producer_terms) in "\n".join(inc.lines())


def test_terms_that_cannot_be_given_are_said_and_runall_finishes(outlier_made, tmp_path, monkeypatch):
    from pytest_ptq.runall import runall

    module = importlib.import_module("pytest_ptq.remedy.producer_terms")

    def fail(*args, **kwargs):
        raise PTQError("the float model's node 'conv1' has no counterpart")

    monkeypatch.setattr(module, "producer_terms", fail)
    root, fpath, made = outlier_made
    s = runall(str(made["inc"]), root / "calib", float_model=str(fpath), save_dir=tmp_path, top=3, progress=False)
    assert s["verdict"]["next_steps"][-1] == ("in Intel Neural Compressor's terms: none given (the float model's "
                                              "node 'conv1' has no counterpart)" + (" (optional)" if s["verdict"]["source"] == "neither" else ""))


def _listed(text, key="nodes_to_exclude"):
    """The list ``key=[...]`` a fix line or next step names, read back as Python."""
    import ast

    found = re.search(rf"{key}=(\[[^]]*\])", text)
    return ast.literal_eval(found.group(1)) if found else None


def _item(node, tries, kind="activation"):
    return {"node": node, "kind": kind, "badness": 0.2, "try": tries, "chosen": [node],
            "inputs": [{"node": node, "kind": kind, "try": tries, "reason": "coarse"}],
            "findings": [{"node": node, "kind": kind, "try": tries}]}


@pytest.mark.parametrize("tries", [["keep in float"], ["int16", "keep in float"]])
def test_model_optimizers_fix_snippet_and_next_step_exclude_what_its_terms_exclude(made, tries, tmp_path):
    """A Model Optimizer model's diagnosis wrote its fix (and its "all at once" snippet) as
    modelopt.onnx.quantization.quantize with quantize_static's list, the tensor's producer
    and readers (['conv2', 'add2'] for conv2's output, which add2 alone reads through the pair),
    beside its terms' ['add2']; runall's step named quantize_static's list, or for a node to
    raise to int16 TensorQuantOverrides, which Model Optimizer has not. Each names its terms'
    list now, and replayed with Model Optimizer's placement it leaves the same pairs the terms
    do, the tensor's gone."""

    from pytest_ptq.diagnosis import _fixes
    from pytest_ptq.runall import _plan

    qpath, fpath, data = made("modelopt_int8_fp32", "modelopt", "conv")
    qm = QuantModel(str(qpath), float_model=str(fpath))
    pairs = {}

    def replayed(names):
        key = tuple(sorted(names))
        if key not in pairs:
            excluded = _modelopt_expand(fpath, {"nodes_to_exclude": names, "op_types_to_exclude": []})
            pairs[key] = _pairs_on(conventions.make(fpath, tmp_path / f"{len(pairs)}.onnx", data, "modelopt_int8_fp32",
                                                    exclude=excluded))
        return pairs[key]

    checked = 0
    for c in qm.of_kind("activation"):
        if c.producer not in qm.normal:
            continue
        terms = producer_terms(qm, "float", [c.name], float_model=str(fpath))
        want, tensor = terms["settings"]["nodes_to_exclude"], terms["nodes"][c.name]["tensor"]
        assert want and not terms["settings"]["op_types_to_exclude"], terms["settings"]
        fixes, settings, call, _, _ = _fixes(qm, [_item(c.name, tries)], "activation", float_model=str(fpath))
        fix = next(f["text"] for f in fixes if f["short"] == "keep nodes in float")

        def check(text):
            assert "modelopt.onnx.quantization.quantize(" in text and "quantize_static" not in text, text
            listed = _listed(text)
            assert listed == want, (c.name, text)
            assert tensor not in replayed(listed) and replayed(listed) == replayed(want), (c.name, text)

        check(fix)
        check(call)
        assert settings["nodes_to_exclude"] == want
        steps = [s for s in _plan([_item(c.name, tries)], [_item(c.name, tries)], "activation", qm=qm,
                                  float_model=str(fpath))[0] if " in float" in s]
        assert len(steps) == 1, steps
        check(steps[0])
        checked += 1
    assert checked >= 3


def test_model_optimizers_next_step_for_per_tensor_weights_names_no_onnxruntime_switch(made):
    """runall's step for per-tensor weights in a Model Optimizer model named quantize_static's
    per_channel=True, where the diagnosis and Model Optimizer's terms say it has no such
    setting (int8 weights per channel always): the step says what the diagnosis says."""
    from pytest_ptq.diagnosis import _fixes
    from pytest_ptq.runall import _plan

    qpath, fpath, _ = made("modelopt_int8_fp32", "modelopt", "conv")
    qm = QuantModel(str(qpath), float_model=str(fpath))
    w = next(c for c in qm.of_kind("weight") if c.role != "bias")
    it = _item(w.name, ["per-channel"], "weight")
    terms = producer_terms(qm, "per-channel", [w.name], {w.name: 0}, float_model=str(fpath))
    assert terms["unsupported"] and not terms["lines"]  # no term: nothing to set

    def check(text):
        assert "per_channel=True" not in text and "quantize_static" not in text, text
        assert "Model Optimizer quantizes int8 weights per channel" in text, text

    check(_fixes(qm, [it], "weight", float_model=str(fpath))[0][0]["text"])
    check(_plan([it], [it], "weight", qm=qm, float_model=str(fpath))[0][0])

"""A requantize chain: a Q/DQ pair read straight by another pair (x -> Q/DQ coarse -> Q/DQ
fine -> Conv). onnxruntime's DoubleQDQPairsRemover (a level-1 rewrite, on whatever
session.disable_quant_qdq says) merges the two into one pair as it loads the file, which
computes neither pair's arithmetic. Every config is the file's Q/DQ as written: the
reference is a plain onnxruntime session without graph optimisations.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.model import QuantModel
from pytest_ptq.groups import group_sensitivity
from pytest_ptq.stages import localize_stages


def chain_net(path):
    """Conv -> a coarse int8 pair (scale 1.5) -> a fine one (scale 0.05) -> Conv, weights on a
    pair; the coarse pair alone costs a few hundredths of cosine, the merge almost nothing."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W")]
    nodes = []

    def pair(src, name, scale):
        return builders.add_pair(inits, nodes, src, scale, np.int8(0), name)

    w = pair("W", "wq", 0.01)
    nodes.append(helper.make_node("Conv", ["x", w], ["c"], name="conv0", pads=[1, 1, 1, 1]))
    fine = pair(pair("c", "coarse", 1.5), "fine", 0.05)
    nodes.append(helper.make_node("Conv", [fine, w], ["y"], name="conv1", pads=[1, 1, 1, 1]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("chain")
    rng = np.random.default_rng(2)
    data = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(4)]}
    builders.save_folder(data, root / "calib")
    path = chain_net(root / "model.onnx")
    onnx.save(builders.rewire(path), str(root / "float.onnx"))
    return {"model": path, "float": root / "float.onnx", "calib": root / "calib",
            "feeds": [{"x": a} for a in data["x"]]}


def _plain(model, chain):
    return [o["y"] for o in builders.run_model(model, chain["feeds"], level="disable")]


def test_every_config_is_the_chain_as_written(chain):
    model = chain["model"]
    engine = Engine(str(model), chain["calib"])
    ref = _plain(builders.rewire(model), chain)
    written = _plain(model, chain)
    # the chain costs what it costs, and onnxruntime's merge would hide it
    merged = [o["y"] for o in builders.run_model(model, chain["feeds"], level="all")]
    assert builders.pooled_cosine(ref, written) < 0.98 < builders.pooled_cosine(ref, merged)
    for i, want in enumerate(written):
        np.testing.assert_allclose(engine.run(i, "all")["y"], want, rtol=1e-5, atol=1e-5)
    groups = group_sensitivity(engine, [["coarse_Q", "fine_Q"], ["coarse_Q"]])
    for names in (("coarse_Q", "fine_Q"), ("coarse_Q",)):
        alone = _plain(builders.rewire(model, keep=names), chain)
        assert groups["+".join(names)]["cosine-similarity"] == pytest.approx(builders.pooled_cosine(ref, alone),
                                                                            abs=1e-6)


def test_stages_simulate_the_chain_and_name_the_merge_as_the_kernel_gap(chain):
    report = localize_stages(str(chain["float"]), str(chain["model"]), chain["calib"])
    ref = _plain(chain["float"], chain)
    assert report.value("fake-quant") == pytest.approx(builders.pooled_cosine(ref, _plain(chain["model"], chain)),
                                                       abs=1e-6)
    assert report.first_drop == "fake-quant"
    assert "DoubleQDQPairsRemover merges 1 requantize chain(s)" in report.kernel_cause
    assert "'fine_Q'" in report.kernel_cause


def test_causes_that_only_add_up_together_are_named_together(chain, tmp_path, monkeypatch):
    """On a classifier whose chains onnxruntime merges and whose float biases it quantizes as
    it loads the file, the merge alone off took the file further from the simulation (0.955
    from 0.975) and was dropped, the biases alone brought it to 0.989, and the sentence said
    the kernels depart 'in more', where both off read 0.999995: that pair is named together."""
    from pytest_ptq import stages

    model = onnx.load(str(chain["model"]))
    conv1 = next(n for n in model.graph.node if n.name == "conv1")
    conv1.input.append("B")
    conv1.output[0] = "yc"
    model.graph.initializer.extend([numpy_helper.from_array(np.full(4, 0.5, np.float32), "B"),
                                    numpy_helper.from_array(np.array(0.1, np.float32), "y_s"),
                                    numpy_helper.from_array(np.array(0, np.int8), "y_z")])
    model.graph.node.extend([helper.make_node("QuantizeLinear", ["yc", "y_s", "y_z"], ["y_q"], name="y_Q"),
                             helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_z"], ["y"], name="y_DQ")])
    path = tmp_path / "biased.onnx"
    onnx.save(model, str(path))
    engine = Engine(str(path), chain["calib"])
    readings = {(): 0.975005, ("WeightBiasQuantization",): 0.988506, ("DoubleQDQPairsRemover",): 0.955257,
                ("WeightBiasQuantization", "DoubleQDQPairsRemover"): 0.999995}
    monkeypatch.setattr(stages, "_without", lambda *args, disabled=(), **kw: readings[tuple(disabled)])
    monkeypatch.setattr(stages, "saturation_cause", lambda *args: None)
    told = stages.kernel_causes(engine, specs=None)
    assert len(told) == 1 and told[0].startswith("together (each alone moves it less): onnxruntime's default "
                                                 "optimizations WeightBiasQuantization quantizes "), told
    assert "DoubleQDQPairsRemover merges 1 requantize chain(s)" in told[0] and "'fine_Q'" in told[0]
    assert told[0].endswith("disabled_optimizers=['WeightBiasQuantization', 'DoubleQDQPairsRemover'])) the file "
                            "reads 0.999995 against the simulation"), told
    # where one alone brings it close, that one is named alone, as before
    readings[("DoubleQDQPairsRemover",)], readings[("WeightBiasQuantization", "DoubleQDQPairsRemover")] = 0.99999, 0.999991
    told = stages.kernel_causes(engine, specs=None)
    assert told[0].startswith("onnxruntime's default optimization DoubleQDQPairsRemover merges") and len(told) == 2
    # one alone at the simulation, the other moving nothing: that one alone, never the pair
    readings.update({("WeightBiasQuantization",): 0.99999, ("DoubleQDQPairsRemover",): 0.975005,
                     ("WeightBiasQuantization", "DoubleQDQPairsRemover"): 0.999996})
    told = stages.kernel_causes(engine, specs=None)
    assert len(told) == 1 and told[0].startswith("onnxruntime's default optimization WeightBiasQuantization"), told


def branched_chain_net(path):
    """Conv (weights on a pair) -> a coarse int8 pair (scale 1.5) read by a Relu (a model
    output) and by a fine pair (scale 0.05) -> Conv (its own weights on a pair) -> y: the
    coarse pair counts for the Relu it feeds and, through the fine pair, for the last Conv."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), w)
             for w in ("W0", "W1")]
    nodes = []

    def pair(src, name, scale):
        return builders.add_pair(inits, nodes, src, scale, np.int8(0), name)

    nodes.append(helper.make_node("Conv", ["x", pair("W0", "w0", 0.01)], ["c"], name="conv0", pads=[1, 1, 1, 1]))
    coarse = pair("c", "coarse", 1.5)
    nodes.append(helper.make_node("Relu", [coarse], ["r"], name="relu"))
    nodes.append(helper.make_node("Conv", [pair(coarse, "fine", 0.05), pair("W1", "w1", 0.01)], ["y"], name="conv1",
                                  pads=[1, 1, 1, 1]))
    value = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4, 8, 8]) for t in ("x", "y", "r")]
    return builders.save_model(helper.make_graph(nodes, "branched", value[:1], value[1:], inits), path, opset=13,
                               ir_version=None)


@pytest.fixture(scope="module")
def branched(tmp_path_factory):
    root = tmp_path_factory.mktemp("branched")
    rng = np.random.default_rng(4)
    data = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(4)]}
    builders.save_folder(data, root / "calib")
    return {"model": branched_chain_net(root / "model.onnx"), "calib": root / "calib", "root": root,
            "feeds": [{"x": a} for a in data["x"]]}


# each operator's own pairs, every pair of the chain it reads included (from the model above)
OWN = {"conv1": ("coarse_Q", "fine_Q", "w1_Q"), "relu": ("coarse_Q",), "conv0": ("w0_Q",)}
OUT = {"conv1": "y", "relu": "r", "conv0": "c"}


def _local(branched, n):
    """Operator ``n``'s local error by brute force: its output with only its own pairs kept
    (the whole chain it reads), everything upstream float, against its float output."""
    model = branched["model"]
    ref = builders.run_model(builders.rewire(model, outputs=[OUT[n]]), branched["feeds"])
    own = builders.run_model(builders.rewire(model, keep=OWN[n], outputs=[OUT[n]]), branched["feeds"])
    return builders.pooled_cosine([o[OUT[n]] for o in ref], [o[OUT[n]] for o in own])


def test_runall_local_error_counts_every_pair_of_the_chain(branched):
    """runall read conv1's local error with the fine pair alone (0.9999, "inherited"), beside
    a row whose "try" blamed the coarse pair that conv1's ranking counts: its local error
    holds the whole chain, and the coarse pair's row reads it at the operators it counts for."""
    from pytest_ptq.runall import runall

    s = runall(str(branched["model"]), branched["calib"], save_dir=branched["root"] / "out", top=5,
               node_type=["node", "activation"], progress=False)
    rows = {(it["kind"], it["node"]): it for it in s["verdict"]["nodes"]}
    for n in OWN:
        assert rows["node", n]["at"] == n
        assert rows["node", n]["local"] == pytest.approx(_local(branched, n), abs=1e-6), n
    assert _local(branched, "conv1") < 0.99 and rows["node", "conv1"]["origin"] == "local"
    coarse = rows["activation", "coarse_Q"]
    assert [coarse["at"], *(a["at"] for a in coarse["also"])] == ["relu", "conv1"]
    assert coarse["also"][0]["local"] == rows["node", "conv1"]["local"] and coarse["feeds"] == ["relu", "conv1"]
    assert rows["activation", "fine_Q"]["local"] == rows["node", "conv1"]["local"]
    line = next(r for r in (branched["root"] / "out" / "summary.md").read_text().splitlines() if "| `coarse_Q` |" in r)
    assert "own at `relu`" in line and "own at `conv1`" in line, line


@pytest.mark.parametrize("net, readers", [("chain", ["conv1"]), ("branched", ["relu", "conv1"])])
def test_a_chains_earlier_pair_is_named_with_the_operators_it_counts_for(net, readers, request, capsys, tmp_path):
    """list-nodes named no consumer of the coarse pair (a QuantizeLinear reads it), and the
    diagnosis of the activation ranking called it "activation on a model output": both name
    the operators whose ranking counts it."""
    import json

    from pytest_ptq.cli import main
    from pytest_ptq.diagnosis import diagnose
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.sensitivity import get_sensitivity_of_nodes
    from pytest_ptq.verdict import three_configs

    model = request.getfixturevalue(net)["model"]
    engine = Engine(str(model), request.getfixturevalue(net)["calib"])
    ranking = get_sensitivity_of_nodes(engine, node_type="node")
    counted = {c: [n for n in ranking if c in ranking.details[n]["calibration_nodes"]] for c in builders.qdq_pairs(model)}
    assert sorted(counted["coarse_Q"]) == sorted(readers)
    assert main(["list-nodes", str(model), "--json", str(tmp_path / "n.json")]) == 0
    listed = {r["name"]: r["counts_for"] for r in json.loads((tmp_path / "n.json").read_text())["calibration_nodes"]}
    assert {c: sorted(v) for c, v in listed.items()} == {c: sorted(v) for c, v in counted.items()}
    assert listed["coarse_Q"] == readers and ",".join(readers) in capsys.readouterr().out
    activations = get_sensitivity_of_nodes(engine, node_type="activation")
    assert activations.details["coarse_Q"]["feeds"] == readers
    diag = diagnose(engine, activations, three_configs(engine, parse_outputs(None, engine)), top=3)
    row = next(it for it in diag.nodes if it["node"] == "coarse_Q")
    told = "\n".join(diag.lines())
    assert row["op_type"] == ", ".join(engine.qmodel.normal[n].op_type for n in readers)
    assert "coarse_Q (activation into " in told and "on a model output" not in told, told


@pytest.mark.parametrize("segments,memory", [(0, "fast"), (64, "fast"), (64, "low")])
def test_local_errors_count_the_chain_segment_by_segment_too(branched, segments, memory):
    # one node a segment: conv1's local clone reads the coarse pair's float input from
    # segments before
    from pytest_ptq.curves import get_acc_error

    engine = Engine(str(branched["model"]), branched["calib"], segments=segments, memory=memory)
    assert (engine.segments is None) == (segments == 0)
    curves = get_acc_error(engine, {"all": list(engine.calib_names)}, progress=False)
    for n in OWN:
        assert curves.local[curves.nodes.index(n)] == pytest.approx(_local(branched, n), abs=1e-6), n


def _read_by(model, node, k=0):
    """The tensor ``node`` reads at input ``k`` in ``model``'s proto."""
    return next(n for n in builders.load(model).graph.node if n.name == node).input[k]


@pytest.fixture(scope="module")
def converted(branched):
    """The branched chain's float model quantized by onnxruntime's own mixed precision: conv0's
    output at uint8, converted to uint16 for conv1 (a 'convert' override writes the chain
    Q/DQ -> Q/DQ -> conv1 beside the uint8 pair the Relu reads)."""
    from onnxruntime.quantization import QuantType

    root = branched["root"]
    fpath = root / "converted_float.onnx"
    onnx.save(builders.rewire(branched["model"]), str(fpath))
    data = {"x": [f["x"] for f in branched["feeds"]]}
    tensor = _read_by(fpath, "conv1")
    convert = {tensor: [{"quant_type": QuantType.QUInt8,
                         "convert": {"quant_type": QuantType.QUInt16, "recv_nodes": {"conv1"}}}]}
    qpath = builders.quantize(fpath, root / "converted.onnx", data, extra_options={"TensorQuantOverrides": convert})
    return {"model": qpath, "float": fpath, "data": data, "tensor": tensor, "root": root}


def _quantized_tensors(path):
    """The float tensors a quantize_static model puts a QuantizeLinear on."""
    return {q.input[0] for q, _ in builders.qdq_pairs(path).values() if q is not None}


def _pairs_read(path):
    """``{(quantized tensor, zero point's type, scale, nodes reading the pair)}`` of a quantize_static model."""
    model = builders.load(path)
    inits = {i.name: i for i in model.graph.initializer}
    readers = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.name)
    return {(q.input[0], inits[q.input[2]].data_type, float(numpy_helper.to_array(inits[q.input[1]])),
             tuple(sorted(r for d in dqs for r in readers.get(d.output[0], ()))))
            for q, dqs in builders.qdq_pairs(model).values() if q is not None}


def test_keeping_a_chains_pair_in_float_excludes_every_operator_of_the_chain(converted):
    """onnxruntime's settings for keeping the chain's first pair in float named conv0 and the
    Relu but not conv1, which reads the chain (its later pair's only, as named for it: conv1),
    so re-quantizing with them still quantized the tensor: the first pair's producer and every
    operator reading the chain are excluded, whichever pair of it is kept. The Relu, which
    asks for no pair of its own, was named too; quantize_static writes the same model without it."""
    from pytest_ptq.model import QuantModel
    from pytest_ptq.remedy import float_tensor_name, onnxruntime_settings

    qm = QuantModel(str(converted["model"]), float_model=str(converted["float"]))
    chained = [c for c in qm.calibration if qm.requantizes(c) is not None]
    assert len(chained) == 1
    tensor, root = converted["tensor"], converted["root"]
    assert tensor in _quantized_tensors(converted["model"])
    # onnxruntime's placement: the tensor's producer and every reader of it in the float model
    # but the Relu, which quantizes its input only where a neighbour did
    fnodes = builders.load(converted["float"]).graph.node
    touching = [n.name for n in fnodes if tensor in [*n.input, *n.output] and n.op_type != "Relu"]
    relu = next(n.name for n in fnodes if n.op_type == "Relu" and tensor in n.input)
    for name in (qm.requantizes(chained[0]), chained[0]):
        assert float_tensor_name(qm, qm.calibration[name]) == tensor
        exclude = onnxruntime_settings(qm, "float", [name])["nodes_to_exclude"]
        assert sorted(exclude) == sorted(touching), name
        again = builders.quantize(converted["float"], root / "again.onnx", converted["data"], nodes_to_exclude=exclude)
        assert tensor not in _quantized_tensors(again), (name, exclude)
        # the settings named the Relu too: quantize_static writes the same pairs with it excluded
        with_relu = builders.quantize(converted["float"], root / "relu.onnx", converted["data"],
                                      nodes_to_exclude=[*exclude, relu])
        assert _pairs_read(with_relu) == _pairs_read(again), name
        for n in ("conv0", "conv1"):  # each Conv is needed (a Relu asks for no pair of its own)
            fewer = builders.quantize(converted["float"], root / "fewer.onnx", converted["data"],
                                      nodes_to_exclude=[m for m in exclude if m != n])
            assert tensor in _quantized_tensors(fewer), (name, n)


@pytest.mark.parametrize("producer", ["modelopt", "quark"])
def test_a_producers_terms_keep_a_chains_pairs_in_float(chain, producer, tmp_path):
    """Model Optimizer's terms for keeping the chain's coarse pair in float excluded no node
    (no operator reads that pair's own output) and Quark's only conv0, though conv1 reads the
    chain: each producer's exclusions, replayed on the float model by its placement (Model
    Optimizer's pairs on the inputs of quantized ops, Quark's onnxruntime's), leave the
    chain's tensor in float, and each named node is needed."""
    import conventions
    from test_producer_terms import _mark, _modelopt_expand, _pairs_on

    from pytest_ptq.model import QuantModel
    from pytest_ptq.remedy import producer_terms

    model = onnx.load(str(chain["model"]))
    _mark(model, producer)
    qpath = tmp_path / "marked.onnx"
    onnx.save(model, str(qpath))
    fpath, data = chain["float"], {"x": [f["x"] for f in chain["feeds"]]}
    tensor = _read_by(fpath, "conv1")

    def quantized(exclude, out):
        if producer == "modelopt":
            return tensor in _pairs_on(conventions.make(fpath, tmp_path / out, data, "modelopt_int8_fp32",
                                                        exclude=_modelopt_expand(fpath, {"nodes_to_exclude": [
                                                            f"{n}$" for n in exclude], "op_types_to_exclude": []})))
        return tensor in _pairs_on(builders.quantize(fpath, tmp_path / out, data, nodes_to_exclude=exclude))

    qm = QuantModel(str(qpath), float_model=str(fpath))
    assert qm.made_by.key == producer
    for name in ("coarse_Q", "fine_Q"):
        terms = producer_terms(qm, "float", [name], float_model=str(fpath))
        assert terms["nodes"][name]["tensor"] == tensor and terms["expect"]["float"] == [tensor]
        names = terms["nodes"][name]["nodes"]
        assert names and not quantized(names, "all.onnx"), (name, names)
        for n in names:
            assert quantized([m for m in names if m != n], "fewer.onnx"), (name, n)


def test_model_optimizers_terms_for_a_branched_chains_later_pair_say_how_they_depart(branched, tmp_path):
    """Model Optimizer's terms for keeping the branched chain's later pair in float excluded conv1 and
    expected the chain's tensor to come out float, though the Relu reads it through the earlier
    pair, in the file and in the simulated remedy alike, and said nothing of conv1 losing the
    earlier pair, which the simulation keeps: the tensor is not expected float and a note says both."""
    from pytest_ptq.remedy import producer_terms

    qpath, fpath, qm = _marked_by_modelopt(branched, tmp_path)
    tensor = _read_by(fpath, "conv1")
    terms = producer_terms(qm, "float", ["fine_Q"], float_model=str(fpath))
    # the simulated remedy: every pair but the later one kept; who still reads the tensor through a pair
    pairs = builders.qdq_pairs(qpath)
    simulated = builders.rewire(qpath, keep=[p for p in pairs if p != "fine_Q"])
    still = {r for r, bits in _chain_bits(simulated, tensor).items() if bits}
    assert still == {"relu", "conv1"}
    excluded = set(terms["nodes"]["fine_Q"]["nodes"])
    assert excluded == {"conv1"}
    assert (tensor in terms["expect"]["float"]) == (not still - excluded)
    note = next(n for n in terms["notes"] if n.startswith("fine_Q "))
    assert "coarse_Q" in note and all(r in note for r in still - excluded), note


def test_model_optimizers_diagnosis_for_a_chains_later_pair_kept_in_float_carries_its_own_note(branched, tmp_path):
    """A Model Optimizer file's diagnosis keeps the branched chain's later pair in float in Model
    Optimizer's terms and prints none of its producer terms, and its fix carried no note: not
    that excluding conv1 takes the earlier pair from conv1 too, nor that the Relu, reading the
    tensor through it in the simulated remedy, still does. It carries Model Optimizer's own note
    now, the sentence of its terms, and not onnxruntime's, whose placement is not Model Optimizer's."""
    from pytest_ptq.diagnosis import _fixes
    from pytest_ptq.remedy import onnxruntime_settings, producer_terms

    qpath, fpath, qm = _marked_by_modelopt(branched, tmp_path)
    # who reads the tensor through a pair in the simulated remedy (every pair but the later one)
    tensor = _read_by(fpath, "conv1")
    simulated = builders.rewire(qpath, keep=[p for p in builders.qdq_pairs(qpath) if p != "fine_Q"])
    still = {r for r, bits in _chain_bits(simulated, tensor).items() if bits}
    assert still == {"relu", "conv1"}
    terms = producer_terms(qm, "float", ["fine_Q"], float_model=str(fpath))
    excluded = set(terms["nodes"]["fine_Q"]["nodes"])
    item = _later_pair_item(["keep in float"])
    fix = next(f["text"] for f in _fixes(qm, [item], "activation", float_model=str(fpath))[0]
               if f["short"] == "keep nodes in float")
    assert fix.count("; note: ") == 1, fix
    note = fix.partition("; note: ")[2]
    assert note in terms["notes"], fix  # one sentence, Model Optimizer's terms' own
    assert note.startswith("fine_Q ") and "coarse_Q" in note and all(r in note for r in still - excluded), fix
    assert not set(onnxruntime_settings(qm, "float", ["fine_Q"]).get("notes", ())) & {note}, fix


def test_list_nodes_names_the_operator_each_pair_counts_for(converted, branched, capsys, tmp_path):
    """list-nodes showed no consumer for the pairs on the model outputs (the Relu's and conv1's,
    which onnxruntime quantizes) that the node ranking counts in those operators' entries: each
    pair names the operators whose ranking entry holds it, its owner for an output's pair."""
    import json

    from pytest_ptq.cli import main
    from pytest_ptq.sensitivity import get_sensitivity_of_nodes

    model = converted["model"]
    ranking = get_sensitivity_of_nodes(Engine(str(model), branched["calib"]), node_type="node")
    pairs = builders.qdq_pairs(model)
    counted = {c: [n for n in ranking if c in ranking.details[n]["calibration_nodes"]] for c in pairs}
    # the pairs a model output reads straight, from the proto: written by the node before them
    outputs = {o.name for o in builders.load(model).graph.output}
    on_outputs = {c for c, (q, dqs) in pairs.items() if q is not None and {d.output[0] for d in dqs} & outputs}
    assert len(on_outputs) == 2
    assert main(["list-nodes", str(model), "--json", str(tmp_path / "n.json")]) == 0
    table = capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads((tmp_path / "n.json").read_text())["calibration_nodes"]}
    for c in pairs:
        assert sorted(rows[c]["counts_for"]) == sorted(counted[c]), c
        assert (rows[c].get("owner") is not None) == (c in on_outputs), c
        assert rows[c]["owner"] in (None, *rows[c]["counts_for"]), c
    for c in on_outputs:
        line = next(r for r in table.splitlines() if r.startswith(c + " ") or f" {c} " in r)
        assert line.split("|")[-2].strip() == rows[c]["owner"], line


def remedy_chain_net(path, quantized=True):
    """Conv0 -> c -> a coarse pair -> a fine pair read by Conv1 and a Relu, whose sum runs
    through a second chain (two pairs) to the model output y; ``quantized=False``: the float
    model it stands for, the Add writing y itself (as onnxruntime's quantizer leaves it)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), w)
             for w in ("W0", "W1")]
    nodes = []

    def pair(src, name, scale):
        return builders.add_pair(inits, nodes, src, scale, np.int8(0), name) if quantized else src

    nodes.append(helper.make_node("Conv", ["x", pair("W0", "w0", 0.01)], ["c"], name="conv0", pads=[1, 1, 1, 1]))
    fine = pair(pair("c", "coarse", 1.5), "fine", 0.05)
    nodes.append(helper.make_node("Conv", [fine, pair("W1", "w1", 0.01)], ["c1"], name="conv1", pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Relu", [fine], ["r"], name="relu"))
    nodes.append(helper.make_node("Add", ["c1", "r"], ["a" if quantized else "y"], name="add"))
    if quantized:
        builders.add_pair(inits, nodes, pair("a", "oa", 0.5), 0.03, np.int8(0), "ob", out="y")
    value = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4, 8, 8]) for t in ("x", "y")]
    return builders.save_model(helper.make_graph(nodes, "chains", value[:1], value[1:], inits), path, opset=13,
                               ir_version=None)


@pytest.fixture(scope="module")
def remedy_chains(tmp_path_factory):
    root = tmp_path_factory.mktemp("remedy_chains")
    rng = np.random.default_rng(6)
    return {"model": remedy_chain_net(root / "model.onnx"), "float": remedy_chain_net(root / "float.onnx", False),
            "data": {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(4)]}}


def _chain_tensor(qpath, fpath, pair):
    """The float tensor a chain's pair quantizes, read from the protos: back through the
    pairs it re-quantizes to the head's QuantizeLinear input, and the output at that place
    of the float model's node of the head's producer's name."""
    q, f = onnx.load(str(qpath)), onnx.load(str(fpath))
    written = {o: (n, k) for n in q.graph.node for k, o in enumerate(n.output)}
    tensor = next(n for n in q.graph.node if n.name == pair).input[0]
    while written[tensor][0].op_type in ("QuantizeLinear", "DequantizeLinear"):
        tensor = written[tensor][0].input[0]
    node, k = written[tensor]
    return next(n for n in f.graph.node if n.name == node.name).output[k]


def _requantized_bits(fpath, data, settings, path):
    """``{tensor: bits}`` of the pairs quantize_static puts on the float model given these settings (a
    pair on a model output under that output's name: quantize_static renames its producer's output)."""
    from pytest_ptq.remedy import quantize_static_kwargs

    kwargs = quantize_static_kwargs(settings)
    out = builders.quantize(fpath, path, data, nodes_to_exclude=kwargs["nodes_to_exclude"],
                            extra_options=kwargs["extra_options"])
    model = onnx.load(str(out))
    zeros = {i.name: i.data_type for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    return {next((d.output[0] for d in dqs if d.output[0] in outputs), q.input[0]):
            16 if zeros[q.input[2]] in (TensorProto.INT16, TensorProto.UINT16) else 8
            for q, dqs in builders.qdq_pairs(model).values() if q is not None}


def _chain_bits(path, tensor, raise_pair=None):
    """``{reader: [bits of each pair from tensor on]}``: the pairs each operator (or model output)
    reading ``tensor`` through pairs reads it through, read from the proto; the pair whose Q is
    named ``raise_pair`` counted at 16 bit."""
    model = builders.load(path)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    readers = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    out = {}

    def walk(t, bits):
        for n in readers.get(t, ()):
            if n.op_type == "QuantizeLinear":
                b = 16 if n.name == raise_pair or inits[n.input[2]] in (TensorProto.INT16, TensorProto.UINT16) else 8
                for d in readers.get(n.output[0], ()):
                    walk(d.output[0], bits + [b])
                    if d.output[0] in outputs:
                        out[d.output[0]] = bits + [b]
            elif bits:
                out[n.name] = bits

    walk(tensor, [])
    return out


@pytest.mark.parametrize("net", ["converted", "branched"])
def test_a_chains_later_pair_raised_to_16_bit_leaves_its_first_pair(net, request, tmp_path):
    """int16 for a chain's later pair wrote a bare 16-bit type on the float tensor: quantize_static
    raised the first pair too, so the Relu reading the first pair read 16 bit ({relu: [16], conv1:
    [16]}). A 'convert' entry keeps the first pair and raises the later one for the readers of that
    pair, as the simulated remedy (the file with that pair at 16 bit) reads them."""
    from pytest_ptq.remedy import onnxruntime_settings, quantize_static_kwargs

    fixture = request.getfixturevalue(net)
    if net == "branched":
        fpath = fixture["root"] / "branched_float.onnx"
        onnx.save(builders.rewire(fixture["model"]), str(fpath))
        data = {"x": [f["x"] for f in fixture["feeds"]]}
    else:
        fpath, data = fixture["float"], fixture["data"]
    qpath = fixture["model"]
    qm = QuantModel(str(qpath), float_model=str(fpath))
    later = next(c for c in qm.calibration if qm.requantizes(c) is not None)
    tensor = _read_by(fpath, "conv1")
    head_input = qm.calibration[qm.requantizes(later)].input
    want = _chain_bits(qpath, head_input, raise_pair=later)
    assert want == {"relu": [8], "conv1": [8, 16]}
    settings = onnxruntime_settings(qm, "int16", [later])
    assert not settings["simulation_only"]
    out = builders.quantize(fpath, tmp_path / "int16.onnx", data, **quantize_static_kwargs(settings))
    assert _chain_bits(out, tensor) == want
    # the diagnosis's advice gives the same entry (it wrote the bare type on the tensor)
    from pytest_ptq.diagnosis import _overrides_text
    from pytest_ptq.remedy.result import override_text

    assert override_text(settings["TensorQuantOverrides"][tensor][0]) in _overrides_text(qm, [later])


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("pair", ["coarse_Q", "fine_Q", "oa_Q", "ob_Q"])
def test_a_chains_pair_kept_in_float_or_raised_to_16_bit_applies_to_the_float_tensor(remedy_chains, pair, aligned,
                                                                                      tmp_path):
    """Keeping a chain's later pair in float excluded nothing (the pair on the model output)
    or left the chain head's producer out, and raising it to 16 bit named the earlier pair's
    DequantizeLinear output, which no float model holds: quantize_static, given the settings
    on the float model, leaves the chain's tensor in float or quantizes it at 16 bit."""
    from pytest_ptq.remedy import onnxruntime_settings, quantize_static_kwargs

    m, fpath, data = remedy_chains["model"], remedy_chains["float"], remedy_chains["data"]
    qm = QuantModel(str(m), float_model=str(fpath) if aligned else None)
    tensor = _chain_tensor(m, fpath, pair)
    assert _requantized_bits(fpath, data, {}, tmp_path / "plain.onnx")[tensor] == 8
    settings = onnxruntime_settings(qm, "float", [pair])
    # the float model holds every node under its name (the relu reading the chain too)
    assert "not_in_float_model" not in settings
    excluded = settings["nodes_to_exclude"]
    assert tensor not in _requantized_bits(fpath, data, {"nodes_to_exclude": excluded}, tmp_path / "float.onnx")
    # the node writing the tensor is named, and needed: quantize_static quantizes a node's output
    producer = next(n.name for n in onnx.load(str(fpath)).graph.node if tensor in n.output)
    fewer = {"nodes_to_exclude": [e for e in excluded if e != producer]}
    assert producer in excluded and tensor in _requantized_bits(fpath, data, fewer, tmp_path / "fewer.onnx")
    settings = onnxruntime_settings(qm, "int16", [pair])
    assert list(settings["TensorQuantOverrides"]) == [tensor]
    # the head's pair raised, or the later one's alone: each reader's pairs from the tensor on
    out = builders.quantize(fpath, tmp_path / "int16.onnx", data,
                            **quantize_static_kwargs(settings))
    raised = [8, 16] if qm.requantizes(pair) is not None else [16, 8]
    written = next(n.output[0] for n in builders.load(out).graph.node if n.name == producer)  # y renamed on an output
    assert set(map(tuple, _chain_bits(out, written).values())) == {tuple(raised)}


def test_keeping_pairs_of_two_chains_in_float_excludes_for_both(remedy_chains):
    from pytest_ptq.remedy import onnxruntime_settings

    qm = QuantModel(str(remedy_chains["model"]))
    both = onnxruntime_settings(qm, "float", ["fine_Q", "ob_Q"])["nodes_to_exclude"]
    one = {p: onnxruntime_settings(qm, "float", [p])["nodes_to_exclude"] for p in ("fine_Q", "ob_Q")}
    assert set(both) == set(one["fine_Q"]) | set(one["ob_Q"]) and all(one.values())


def _branched_float(branched):
    fpath = branched["root"] / "branched_float.onnx"
    onnx.save(builders.rewire(branched["model"]), str(fpath))
    return fpath, {"x": [f["x"] for f in branched["feeds"]]}


def _later_pair_item(tries, reason="clips", found=("keep in float",)):
    """A diagnosis item for the branched chain's later pair, an activation to ``tries``."""
    return {"node": "fine_Q", "kind": "activation", "badness": 0.2, "try": list(tries), "chosen": ["fine_Q"],
            "inputs": [{"node": "fine_Q", "kind": "activation", "try": list(tries), "reason": reason}],
            "findings": [{"node": "fine_Q", "kind": "activation", "try": list(found)}]}


def _later_pair_kept_in_float_by_onnxruntime(branched, tmp_path):
    """The branched chain's QuantModel, onnxruntime's settings keeping its later pair in float,
    and the operators that lose the earlier pair when quantize_static replays their exclusion."""
    from pytest_ptq.remedy import onnxruntime_settings

    fpath, data = _branched_float(branched)
    qm = QuantModel(str(branched["model"]), float_model=str(fpath))
    settings = onnxruntime_settings(qm, "float", ["fine_Q"])
    out = builders.quantize(fpath, tmp_path / "float.onnx", data, nodes_to_exclude=settings["nodes_to_exclude"])
    lost = _losing_earlier_pair(branched, fpath, out)
    assert lost == {"relu", "conv1"}
    return qm, settings, lost


def _losing_earlier_pair(branched, fpath, requantized):
    """The operators that read the branched chain's tensor through its coarse pair in the simulated
    remedy (the file without its fine pair) and read it through no pair in ``requantized``."""
    qpath = branched["model"]
    simulated = builders.rewire(qpath, keep=[p for p in builders.qdq_pairs(qpath) if p != "fine_Q"])
    head_input = next(n for n in builders.load(qpath).graph.node if n.name == "coarse_Q").input[0]
    kept = {r for r, bits in _chain_bits(simulated, head_input).items() if bits == [8]}
    assert kept == {"relu", "conv1"}
    return kept - set(_chain_bits(requantized, _read_by(fpath, "conv1")))


def test_onnxruntimes_settings_for_a_chains_later_pair_kept_in_float_say_they_take_the_earlier_one(branched,
                                                                                                    tmp_path):
    """Keeping the branched chain's later pair in float excluded conv0 and conv1 and said nothing,
    though quantize_static then leaves the tensor float for the Relu and conv1 alike, which read
    the coarse pair in the simulated remedy: a note says so, shown in the remedy's summary, and
    the re-quantized check finds the tensor float as expected, nothing named 'not applied'."""
    from types import SimpleNamespace

    from pytest_ptq.remedy import onnxruntime_settings, quantize_static_kwargs
    from pytest_ptq.remedy.requantize import _effect
    from pytest_ptq.remedy.result import Remedy

    fpath, data = _branched_float(branched)
    qm = QuantModel(str(branched["model"]), float_model=str(fpath))
    settings = onnxruntime_settings(qm, "float", ["fine_Q"])
    out = builders.quantize(fpath, tmp_path / "float.onnx", data, **quantize_static_kwargs(settings))
    lost = _losing_earlier_pair(branched, fpath, out)
    assert lost == {"relu", "conv1"}
    note = next(n for n in settings.get("notes", ()) if n.startswith("fine_Q "))
    assert "coarse_Q" in note and all(r in note for r in lost) and "convert" in note, note
    remedy = Remedy(remedy="float", metric="cosine-similarity", target=0.99, met=True, nodes=["fine_Q"], value=0.999,
                    baseline=0.9, ceiling=None, curve=[], pruned=[], ranking=[], settings=settings)
    assert f"note: {note}" in remedy.summary()
    base = builders.quantize(fpath, tmp_path / "base.onnx", data)
    new = QuantModel(str(out)) if _quantized_tensors(out) else None  # None: the settings left nothing quantized
    found = _effect(qm, QuantModel(str(base)), new, SimpleNamespace(nodes=["fine_Q"], choices={}, remedy="float"))
    assert found["not_applied"] == [] and _read_by(fpath, "conv1") not in found["collateral"]


def test_the_diagnosis_and_runalls_steps_for_a_chains_later_pair_kept_in_float_carry_the_settings_note(branched,
                                                                                                      tmp_path):
    """The diagnosis's fix and runall's next steps that keep the branched chain's later pair in
    float named quantize_static's nodes_to_exclude and no more, though those exclusions leave
    the tensor float for the Relu and conv1 alike, which read the coarse pair in the simulated
    remedy: each carries the settings' note now, the sentence the remedy's summary prints."""
    from pytest_ptq.diagnosis import _fixes
    from pytest_ptq.runall import _plan

    qm, settings, lost = _later_pair_kept_in_float_by_onnxruntime(branched, tmp_path)
    severe, other = _later_pair_item(["keep in float"]), _later_pair_item(["per-channel", "keep in float"])  # other: no int16 to go to
    fix = next(f["text"] for f in _fixes(qm, [severe], "activation")[0] if f["short"] == "keep nodes in float")
    steps = [s for it in (severe, other) for s in _plan([it], [it], "activation", qm=qm)[0] if " in float" in s]
    assert len(steps) == 2 and "or fix the model there" in steps[1], steps
    for text in [fix, *steps]:
        assert str(settings["nodes_to_exclude"]) in text or "nodes_to_exclude" not in text, text
        note = text.partition("; note: ")[2]
        assert note.startswith("fine_Q ") and "coarse_Q" in note and all(r in note for r in lost), text
        assert note in settings["notes"], text  # one sentence, the settings' own


def test_runalls_raise_or_keep_in_float_step_for_a_chains_later_pair_carries_the_settings_note(branched, tmp_path):
    """runall's step that raises the branched chain's later pair to int16 'or keep them in float'
    advised the float half with no word of what quantize_static's exclusion then does (the
    tensor float for the Relu and conv1 alike, which read the coarse pair in the simulated
    remedy): it carries the settings' note now, the sentence the remedy's summary prints."""
    from pytest_ptq.runall import _plan

    qm, settings, lost = _later_pair_kept_in_float_by_onnxruntime(branched, tmp_path)
    tries = ["int16", "keep in float"]
    item = _later_pair_item(tries, reason="coarse", found=tries)
    steps = [s for s in _plan([item], [item], "activation", qm=qm)[0] if "or keep them in float" in s]
    assert len(steps) == 1, steps
    note = steps[0].partition("; note: ")[2]
    assert note.startswith("fine_Q ") and "coarse_Q" in note and all(r in note for r in lost), steps
    assert note in settings["notes"], steps  # one sentence, the settings' own


@pytest.mark.parametrize("producer", ["quark", "inc"])
def test_a_producers_terms_for_a_chains_later_pair_kept_in_float_say_they_take_the_earlier_one(branched, producer,
                                                                                                tmp_path):
    """Quark's and Neural Compressor's terms for keeping the branched chain's later pair in float
    exclude the chain's producer and readers, which with their placement (onnxruntime's, replayed
    by quantize_static) leaves the tensor float for every reader, the Relu and conv1 losing the
    coarse pair the simulated remedy kept; they said nothing of it: a note says so, and the tensor is
    expected float, as the re-quantized check finds it."""
    from pytest_ptq.remedy import producer_terms
    from pytest_ptq.remedy.producer_check import effect
    from pytest_ptq.remedy.result import producer_lines

    fpath, data = _branched_float(branched)
    _, qpath = _marked(branched, producer, tmp_path)
    qm = QuantModel(str(qpath), float_model=str(fpath))
    assert qm.made_by.key == {"inc": "neural-compressor"}.get(producer, producer)
    terms = producer_terms(qm, "float", ["fine_Q"], float_model=str(fpath))
    excluded = terms["settings"]["exclude" if producer == "quark" else "nodes_to_exclude"]
    out = builders.quantize(fpath, tmp_path / "float.onnx", data, nodes_to_exclude=excluded)
    tensor = _read_by(fpath, "conv1")
    lost = _losing_earlier_pair(branched, fpath, out)
    assert lost == {"relu", "conv1"}
    assert (tensor in terms["expect"]["float"]) == (not _chain_bits(out, tensor))
    note = next(n for n in terms["notes"] if n.startswith("fine_Q "))
    assert "coarse_Q" in note and all(r in note for r in lost), note
    assert f"  note: {note}" in producer_lines(terms)
    found = effect(terms, str(fpath), builders.quantize(fpath, tmp_path / "base.onnx", data), out)
    assert found["not_applied"] == [] and tensor not in found["collateral"]


def _pairs_on(path, tensor):
    """The Q/DQ pairs (by their Q's name) on ``tensor`` in the proto: those quantizing it and
    those re-quantizing what they dequantize, as far as the chain goes."""
    model = builders.load(path)
    readers = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    on, todo = [], [tensor]
    while todo:
        for q in [n for n in readers.get(todo.pop(), ()) if n.op_type == "QuantizeLinear"]:
            on.append(q.name)
            todo += [d.output[0] for d in readers.get(q.output[0], ()) if d.op_type == "DequantizeLinear"]
    return on


def test_aimets_terms_for_a_chains_later_pair_kept_in_float_say_they_take_the_earlier_one(branched, tmp_path):
    """aimet's terms for keeping the branched chain's later pair in float disable the quantizer
    of the chain's tensor, aimet's one quantizer of it for every reader: replayed on the file
    (every pair on the tensor removed), the Relu and conv1 lose the coarse pair the simulated
    remedy kept. Quark's and Neural Compressor's terms said so in a note; aimet's said nothing:
    its own note says so now."""
    from pytest_ptq.remedy import producer_terms
    from pytest_ptq.remedy.result import producer_lines

    fpath, _ = _branched_float(branched)
    _, qpath = _marked(branched, "aimet", tmp_path)
    qm = QuantModel(str(qpath), float_model=str(fpath))
    assert qm.made_by.key == "aimet"
    terms = producer_terms(qm, "float", ["fine_Q"], float_model=str(fpath))
    tensor = _chain_tensor(qpath, fpath, "fine_Q")
    assert terms["settings"]["disable"] == [tensor] and tensor in terms["expect"]["float"]
    assert f"for name in {[tensor]!r}: sim.qc_quantize_op_dict[name].enabled = False" in terms["lines"]
    # the tensor's quantizer disabled: no pair on it is left, the earlier one included
    gone = _pairs_on(qpath, _read_by(qpath, "coarse_Q"))
    assert set(gone) == {"coarse_Q", "fine_Q"}
    replayed = builders.rewire(qpath, keep=set(builders.qdq_pairs(qpath)) - set(gone))
    lost = _losing_earlier_pair(branched, fpath, replayed)
    assert lost == {"relu", "conv1"}
    note = next(n for n in terms["notes"] if n.startswith("fine_Q "))  # was: no note
    assert "coarse_Q" in note and all(r in note for r in lost) and "qc_quantize_op_dict" in note, note
    assert f"disabling the quantizer of {tensor} keeps {tensor} in float" in note, note
    assert terms["nodes"]["fine_Q"]["note"] == note
    assert f"  note: {note}" in producer_lines(terms)


@pytest.mark.parametrize("producer", ["quark", "inc", "aimet"])
def test_runalls_keep_in_float_step_for_another_quantizers_model_says_the_call_is_on_the_float_model(
        branched, producer, tmp_path):
    """runall's step keeping the branched chain's later pair in float, on a model Quark, Neural
    Compressor or aimet made, named quantize_static(..., nodes_to_exclude=[...]) with no word of
    where it runs (only the producer's block below said "names of the float model"): the
    exclusion names the float model's nodes, and it is on the float model that quantize_static
    leaves the tensor float, so the step says so."""
    import ast

    from pytest_ptq.runall import _plan

    fpath, data = _branched_float(branched)
    _, qpath = _marked(branched, producer, tmp_path)
    qm = QuantModel(str(qpath), float_model=str(fpath))
    item = _later_pair_item(["keep in float"])
    step = next(s for s in _plan([item], [item], "activation", qm=qm, float_model=str(fpath))[0] if " in float" in s)
    call = re.search(r"quantize_static\(\.\.\., nodes_to_exclude=(\[.*?\])\)( on the float model)?", step)
    assert call and call.group(2), step  # was: no " on the float model"
    excluded = ast.literal_eval(call.group(1))
    assert excluded and set(excluded) <= {n.name for n in onnx.load(str(fpath)).graph.node}, step
    out = builders.quantize(fpath, tmp_path / "float.onnx", data, nodes_to_exclude=excluded)
    assert not _chain_bits(out, _read_by(fpath, "conv1"))  # the tensor float there, as the step says


def _marked(branched, producer, tmp_path):
    """The branched chain's QDQ file marked as ``producer``'s (Neural Compressor's: its nodes
    renamed as it names them): the model and its path."""
    from test_producer_terms import _mark

    model = onnx.load(str(branched["model"]))
    _mark(model, producer)
    if producer == "inc":  # Neural Compressor renames the nodes it quantizes '<name>_quant'
        for n in model.graph.node:
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                n.name += "_quant"
    qpath = tmp_path / "marked.onnx"
    onnx.save(model, str(qpath))
    return model, qpath


def _marked_by_modelopt(branched, tmp_path):
    """The branched chain's QDQ file marked as Model Optimizer's, its float model (the file
    rewired) and its QuantModel aligned with that float model."""
    _, qpath = _marked(branched, "modelopt", tmp_path)
    fpath = tmp_path / "float.onnx"
    onnx.save(builders.rewire(qpath), str(fpath))
    qm = QuantModel(str(qpath), float_model=str(fpath))
    assert qm.made_by.key == "modelopt"
    return qpath, fpath, qm


def _marked_by_quark(branched, tmp_path):
    """The branched chain's float model and data, and its QDQ file marked as Quark's (model,
    path, QuantModel aligned with the float model)."""
    fpath, data = _branched_float(branched)
    model, qpath = _marked(branched, "quark", tmp_path)
    return fpath, data, model, qpath, QuantModel(str(qpath), float_model=str(fpath))


def test_quarks_int16_for_a_chains_later_pair_leaves_its_first_pair(branched, tmp_path):
    """Quark's int16 for the branched chain's later pair wrote a bare 16-bit type on the tensor, which
    raised the coarse pair the Relu reads too ({relu: [16], conv1: [16]}); its quantizer reads
    onnxruntime's 'convert' entry (replayed by quantize_static, whose QDQQuantizer Quark's extends):
    the Relu keeps 8 bit and conv1 reads the later pair at 16, as the file with that pair raised."""
    from pytest_ptq.remedy import producer_terms, quantize_static_kwargs
    from pytest_ptq.remedy.producer_check import effect

    fpath, data, model, qpath, qm = _marked_by_quark(branched, tmp_path)
    head_input = next(n for n in model.graph.node if n.name == "coarse_Q").input[0]
    want = _chain_bits(qpath, head_input, raise_pair="fine_Q")
    assert want == {"relu": [8], "conv1": [8, 16]}
    terms = producer_terms(qm, "int16", ["fine_Q"], float_model=str(fpath))
    assert not terms["unsupported"]
    overrides = terms["settings"]["TensorQuantOverrides"]
    out = builders.quantize(fpath, tmp_path / "int16.onnx", data,
                            **quantize_static_kwargs({"TensorQuantOverrides": overrides}))
    tensor = _read_by(fpath, "conv1")
    assert _chain_bits(out, tensor) == want
    assert "'recv_nodes': {'conv1'}" in "\n".join(terms["lines"]) and "'convert': {'quant_type': ExtendedQuantType." \
        in "\n".join(terms["lines"])
    found = effect(terms, str(fpath), builders.quantize(fpath, tmp_path / "base.onnx", data), out)
    assert found["not_applied"] == [] and terms["expect"]["int16"] == [tensor]


def _chain_position(qpath, pair):
    """How many pairs ``pair`` re-quantizes, read from the proto: the QuantizeLinear nodes
    behind it back to the float tensor."""
    model = builders.load(qpath)
    written = {o: n for n in model.graph.node for o in n.output}
    tensor, position = next(n for n in model.graph.node if n.name == pair).input[0], 0
    while tensor in written and written[tensor].op_type == "DequantizeLinear":
        tensor = written[written[tensor].input[0]].input[0]
        position += 1
    return position


def _raised_at(bits, at):
    """Whether the readers of the pair at position ``at`` of a chain (those whose chain reaches
    it; every reader where none does, reading the chain's last pair) read it at 16 bit, from
    :func:`_chain_bits`."""
    reaching = [b for b in bits.values() if len(b) > at] or list(bits.values())
    return bool(reaching) and all(b[min(at, len(b) - 1)] >= 16 for b in reaching)


def test_the_requantized_check_compares_the_chain_pair_the_remedy_names(remedy_chains, tmp_path):
    """The check keyed the re-quantized pairs by float tensor alone, so a chain's later pair
    hid its head: int16 for the head wrote the right file ({relu: [16, 8], conv1: [16, 8]})
    and read 'not applied ['c']', and given a file with only the later pair raised ([8, 16]) it
    read the head applied. It compares the pair at the position the remedy names now, and says
    not applied exactly where that position of every reader's chain is not at 16 bit."""
    from types import SimpleNamespace

    from pytest_ptq.remedy import onnxruntime_settings, quantize_static_kwargs
    from pytest_ptq.remedy.requantize import _effect

    m, fpath, data = remedy_chains["model"], remedy_chains["float"], remedy_chains["data"]
    qm = QuantModel(str(m), float_model=str(fpath))
    base = QuantModel(str(builders.quantize(fpath, tmp_path / "base.onnx", data)))
    producer = {p: next(n.name for n in builders.load(fpath).graph.node if _chain_tensor(m, fpath, p) in n.output)
                for p in ("coarse_Q", "fine_Q", "oa_Q", "ob_Q")}
    files = {}
    for pair in producer:
        settings = onnxruntime_settings(qm, "int16", [pair])
        files[pair] = builders.quantize(fpath, tmp_path / f"{pair}.onnx", data, **quantize_static_kwargs(settings))
    for pair, chained in (("coarse_Q", "fine_Q"), ("fine_Q", "coarse_Q"), ("oa_Q", "ob_Q"), ("ob_Q", "oa_Q")):
        at = _chain_position(m, pair)
        for path in (files[pair], files[chained]):  # the remedy's own file, and the one raising the other pair
            written = next(n.output[0] for n in builders.load(path).graph.node if n.name == producer[pair])
            bits = _chain_bits(path, written)
            applied = _raised_at(bits, at)
            assert applied == (path == files[pair]), (pair, path, bits)
            found = _effect(qm, base, QuantModel(str(path)), SimpleNamespace(nodes=[pair], choices={}, remedy="int16"))
            assert found["not_applied"] == ([] if applied else [_chain_tensor(m, fpath, pair)]), (pair, path, found)


def test_the_requantized_check_counts_a_chain_it_lengthened_as_collateral(remedy_chains, tmp_path):
    """A remedy naming no pair of 'c' whose re-quantization wrote [16, 8] on it where the
    baseline had [8]: keyed by tensor, the check compared the later 8-bit pair and said nothing;
    every tensor whose readers read other pairs than in the baseline is collateral now."""
    from types import SimpleNamespace

    from pytest_ptq.remedy import onnxruntime_settings, quantize_static_kwargs
    from pytest_ptq.remedy.requantize import _effect

    m, fpath, data = remedy_chains["model"], remedy_chains["float"], remedy_chains["data"]
    qm = QuantModel(str(m), float_model=str(fpath))
    base = builders.quantize(fpath, tmp_path / "base.onnx", data)
    out = builders.quantize(fpath, tmp_path / "int16.onnx", data,
                            **quantize_static_kwargs(onnxruntime_settings(qm, "int16", ["coarse_Q"])))
    fnodes = builders.load(fpath).graph.node

    def read(path):  # {float tensor: its readers' pairs}, by the node writing each quantized tensor
        model = builders.load(path)
        written = {o: n.name for n in model.graph.node for o in n.output}
        heads = {t for t in _quantized_tensors(path)
                 if t not in written or next(n for n in model.graph.node if n.name == written[t]).op_type
                 != "DequantizeLinear"}
        return {t if t not in written else next(n for n in fnodes if n.name == written[t]).output[0]:
                _chain_bits(path, t) for t in heads}

    was, now = read(base), read(out)
    changed = sorted(t for t in was if was[t] != now.get(t))
    assert changed == ["c"]
    nothing = SimpleNamespace(nodes=[], choices={}, remedy="int16")
    found = _effect(qm, QuantModel(str(base)), QuantModel(str(out)), nothing)
    assert found["collateral"] == changed and found["not_applied"] == []


def test_a_producers_check_compares_the_chain_pair_its_terms_name(branched, tmp_path):
    """Quark's int16 for the branched chain's head writes a 'convert' that raises the head and
    keeps conv1's later pair at 8 ({relu: [16], conv1: [16, 8]}); its check keyed the pairs by
    tensor and read the later 8-bit pair: 'not applied' (and the head 'applied' in a file raising
    only the later pair). It reads the pair at the position the terms name, as each reader of
    the file reads it."""
    from pytest_ptq.remedy import producer_terms, quantize_static_kwargs
    from pytest_ptq.remedy.producer_check import effect

    fpath, data, model, qpath, qm = _marked_by_quark(branched, tmp_path)
    tensor, base = _read_by(fpath, "conv1"), builders.quantize(fpath, tmp_path / "base.onnx", data)
    head_input = next(n for n in model.graph.node if n.name == "coarse_Q").input[0]
    terms, files = {}, {}
    for pair in ("coarse_Q", "fine_Q"):
        terms[pair] = producer_terms(qm, "int16", [pair], float_model=str(fpath))
        overrides = {"TensorQuantOverrides": terms[pair]["settings"]["TensorQuantOverrides"]}
        files[pair] = builders.quantize(fpath, tmp_path / f"{pair}.onnx", data, **quantize_static_kwargs(overrides))
        assert _chain_bits(files[pair], tensor) == _chain_bits(qpath, head_input, raise_pair=pair), pair
    for pair, other in (("coarse_Q", "fine_Q"), ("fine_Q", "coarse_Q")):
        at = _chain_position(qpath, pair)
        for path in (files[pair], files[other]):  # its own file, and the one raising the other pair
            applied = _raised_at(_chain_bits(path, tensor), at)
            assert applied == (path == files[pair]), (pair, path)
            found = effect(terms[pair], str(fpath), base, path)
            assert found["not_applied"] == ([] if applied else [tensor]), (pair, path, found)
            assert found["kept"]["int16"] == {tensor: applied}, (pair, path, found)


def test_model_optimizers_fix_and_next_step_for_a_chains_later_pair_exclude_what_its_terms_exclude(branched,
                                                                                                 tmp_path):
    """A Model Optimizer model's diagnosis kept the branched chain's later pair in float with
    modelopt.onnx.quantization.quantize(nodes_to_exclude=['conv0', 'conv1']), quantize_static's
    list, beside the note of Model Optimizer's terms, which exclude conv1 alone ('excluding conv1
    leaves its input ...'); runall's step named quantize_static with its own note. Replayed with
    Model Optimizer's placement, conv0 excluded took its weight's pair too, which no remedy asked
    for. The fix, its snippet and the step name the terms' list and carry its note."""
    import conventions
    from test_producer_terms import _listed, _modelopt_expand, _pairs_on

    from pytest_ptq.diagnosis import _fixes
    from pytest_ptq.remedy import producer_terms
    from pytest_ptq.runall import _plan

    qpath, fpath, qm = _marked_by_modelopt(branched, tmp_path)
    data = {"x": [f["x"] for f in branched["feeds"]]}
    terms = producer_terms(qm, "float", ["fine_Q"], float_model=str(fpath))
    want, note = terms["settings"]["nodes_to_exclude"], terms["nodes"]["fine_Q"]["note"]

    def replayed(names, out):
        excluded = _modelopt_expand(fpath, {"nodes_to_exclude": names, "op_types_to_exclude": []})
        return _pairs_on(conventions.make(fpath, tmp_path / out, data, "modelopt_int8_fp32", exclude=excluded))

    base = replayed([], "base.onnx")
    expected = replayed(want, "terms.onnx")
    weight = _read_by(fpath, "conv0", 1)  # conv0's weight: no remedy here touches it
    assert weight in base and weight in expected and _read_by(fpath, "conv1") in base
    item = _later_pair_item(["keep in float"])
    fixes, _, call, _, _ = _fixes(qm, [item], "activation", float_model=str(fpath))
    fix = next(f["text"] for f in fixes if f["short"] == "keep nodes in float")

    def check(text, k, noted=True):
        listed = _listed(text)
        assert listed == want, text
        assert replayed(listed, f"face{k}.onnx") == expected, text
        assert not noted or text.partition("; note: ")[2] == note, text  # the list's own terms' note

    check(fix, 0)
    check(call, 1, noted=False)
    check(next(s for s in _plan([item], [item], "activation", qm=qm, float_model=str(fpath))[0] if " in float" in s), 2)

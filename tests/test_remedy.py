"""Remedy search on models with a planted cause, checked against onnxruntime itself.

Two planted causes: a conv whose output channel 3 has 50x larger weights (per-tensor int8
weights then starve the other channels: per channel or float fixes it), and an activation
pair whose scale was made 64x too coarse (only more bits or float fix it; per-channel
weights cannot).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import builders
from pytest_ptq.remedy import scoring as remedy_mod
from pytest_ptq.cli import main
from pytest_ptq.errors import PTQError
from pytest_ptq.model import QuantModel
from pytest_ptq.remedy import Remedy, onnxruntime_settings, quantize_static_kwargs, suggest_remedy

N = 8
SLICE = "c1[:, 0:3]"  # conv1's channels beside the outlier: where the starved weights show


def _cosine(refs, tests):
    r = np.concatenate([a.ravel() for a in refs]).astype(np.float64)
    t = np.concatenate([a.ravel() for a in tests]).astype(np.float64)
    return float(r @ t / np.sqrt((r @ r) * (t @ t)))


def _feeds(data):
    return [{k: v[i] for k, v in data.items()} for i in range(N)]


@pytest.fixture(scope="module")
def outlier(tmp_path_factory):
    root = tmp_path_factory.mktemp("outlier")
    data = builders.samples(N)
    fpath = builders.conv_net(root / "float.onnx", outlier_channel=3)
    qpath = builders.quantize(fpath, root / "qdq.onnx", data)
    return {"float": fpath, "qdq": qpath, "data": data, "root": root}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The plain net with r1's activation scale 64x too coarse: 4 levels for its real range."""
    root = tmp_path_factory.mktemp("planted")
    data = builders.samples(N)
    fpath = builders.conv_net(root / "float.onnx")
    qpath = builders.quantize(fpath, root / "qdq.onnx", data)
    model = onnx.load(str(qpath))
    for init in model.graph.initializer:
        if init.name == "r1_scale":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 64, init.name))
    onnx.save(model, str(root / "planted.onnx"))
    return {"float": fpath, "qdq": root / "planted.onnx", "data": data, "root": root}


def _exposing_c1(path_or_model):
    """The model unchanged but for conv1's output added as a graph output."""
    model = path_or_model if isinstance(path_or_model, onnx.ModelProto) else onnx.load(str(path_or_model))
    model.graph.output.append(onnx.helper.make_tensor_value_info("c1", onnx.TensorProto.FLOAT, None))
    return model


def _without_pair(path, q_name):
    """The QDQ model with one Q/DQ pair removed: its readers read the Q's float input."""
    model = onnx.load(str(path))
    graph = model.graph
    q = next(n for n in graph.node if n.name == q_name)
    gone = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]}
    kept = [n for n in graph.node if n.name != q_name and n.output[0] not in gone]
    for n in kept:
        for k, i in enumerate(n.input):
            if i in gone:
                n.input[k] = q.input[0]
    del graph.node[:]
    graph.node.extend(kept)
    return model


def _sliced(outputs):
    return [o["c1"][:, 0:3] for o in outputs]


def test_per_channel_finds_the_outlier_weight_and_onnxruntime_agrees(outlier, tmp_path, capsys):
    r = suggest_remedy(str(outlier["qdq"]), outlier["data"], target=0.99, remedy="per-channel",
                       output_node=SLICE, float_model=str(outlier["float"]), save_dir=tmp_path, progress=True)
    # the re-quantizations say they run (on a large model they were a silent minute or two)
    said = capsys.readouterr().err
    assert "re-quantizing the float model without and with the remedy (quantize_static), then scoring both: " \
           "started" in said
    assert r.baseline < 0.99
    assert r.met and r.nodes == ["w1_QuantizeLinear"]
    assert r.settings["TensorQuantOverrides"] == {"w1": [{"axis": 0}]}
    assert r.settings["nodes_to_exclude"] == []
    # the re-quantized model really holds w1 per channel and nothing else changed
    pairs = builders.qdq_pairs(r.measured["model"])
    q = pairs["w1_QuantizeLinear"][0]
    scale = numpy_helper.to_array(next(i for i in onnx.load(r.measured["model"]).graph.initializer
                                       if i.name == q.input[1]))
    assert scale.shape == (8,)
    assert r.measured["collateral"] == [] and r.measured["not_applied"] == []
    # measured value, recomputed with plain sessions: re-quantized model vs float model
    feeds = _feeds(outlier["data"])
    ref = builders.run_model(_exposing_c1(outlier["float"]), feeds, outputs=["c1"])
    got = builders.run_model(_exposing_c1(r.measured["model"]), feeds, outputs=["c1"])
    assert r.measured["value"] == pytest.approx(_cosine(_sliced(ref), _sliced(got)), abs=1e-9)
    assert r.measured["met"]
    # onnxruntime's own per-channel quantizer and the simulation agree
    assert r.value == pytest.approx(r.measured["value"], abs=1e-4)
    assert r.measured["baseline_value"] == pytest.approx(r.baseline, abs=1e-6)
    assert (tmp_path / "remedy_per-channel.png").stat().st_size > 10_000
    assert "reproduces" not in r.measured and not any("does not reproduce" in n for n in r.notes)
    # tensors beyond the chosen ones that the settings reach: said to move the figure only where it moved
    r.measured["collateral"] = ["c2"]
    r.measured["value"] = r.value
    assert "which moves the re-quantized figure by nothing measurable" in r.summary()
    r.measured["value"] = r.value - 1e-3
    assert "so the re-quantized figure differs from the simulation" in r.summary()


def _grids(path):
    """``{tensor: (scale, zero point)}`` of every QuantizeLinear in the file at ``path``."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {q.input[0]: (inits[q.input[1]], inits[q.input[2]]) for q in model.graph.node if q.op_type == "QuantizeLinear"}


def _same_grids(got, given, tensors):
    for t in tensors:
        assert got[t][1].dtype == given[t][1].dtype and np.array_equal(got[t][1], given[t][1]), t
        assert got[t][0].dtype == given[t][0].dtype and np.array_equal(got[t][0], given[t][0]), t


def test_a_model_quantized_with_options_the_file_does_not_show_is_told_pair_by_pair(outlier, tmp_path):
    """A weight raised to int16 by TensorQuantOverrides came back int8 when the float model was
    re-quantized with the options read from the file: the note names the pair, and the check
    keeps the model's own grids, w2's 16 bits among them."""
    from onnxruntime.quantization import QuantType

    given = builders.quantize(outlier["float"], tmp_path / "w2_16.onnx", outlier["data"],
                              extra_options={"TensorQuantOverrides": {"w2": [{"quant_type": QuantType.QInt16}]}})
    assert QuantModel(str(given)).calibration["w2_QuantizeLinear"].bit == 16
    r = suggest_remedy(str(given), outlier["data"], target=0.9999, remedy="float", output_node=SLICE,
                       float_model=str(outlier["float"]), save_dir=tmp_path / "out")
    assert "reproduces" not in r.measured
    told = [n for n in r.notes if "does not reproduce the model given" in n]
    assert len(told) == 1 and "1 of its quantized tensors differ: 'w2': int8 per tensor against int16 per tensor " \
        "given" in told[0] and "kept the model's own scales and zero points" in told[0], told
    expected, again = _grids(given), _grids(r.measured["baseline_model"])
    assert set(again) == set(expected)
    _same_grids(again, expected, expected)
    assert r.measured["baseline_value"] == pytest.approx(r.baseline, abs=1e-9)


def test_a_model_of_quantize_statics_defaults_reproduces(outlier, tmp_path):
    """quantize_static's defaults fold each Relu into its output's pair; the check re-quantizes
    keeping them, which adds a pair on each Relu's input. That pair was counted against the
    model given: "does not reproduce the model given ... re-quantize with the data and options
    that made it", for the most common model of all, made exactly so."""
    given = builders.quantize(outlier["float"], tmp_path / "defaults.onnx", outlier["data"], keep_float=False)
    assert "Relu" not in {n.op_type for n in onnx.load(str(given)).graph.node}
    r = suggest_remedy(str(given), outlier["data"], target=0.99999, remedy="float", output_node="logits",
                       float_model=str(outlier["float"]), save_dir=tmp_path / "out")
    assert "reproduces" not in r.measured and not any("reproduce" in n for n in r.notes), r.notes
    # what is told still is: a model calibrated on other data, its Relus folded alike
    wide = {k: [16 * v for v in vs] for k, vs in outlier["data"].items()}
    other = builders.quantize(outlier["float"], tmp_path / "other.onnx", wide, keep_float=False)
    r = suggest_remedy(str(other), outlier["data"], target=0.99999, remedy="float", output_node="logits",
                       float_model=str(outlier["float"]), save_dir=tmp_path / "out2")
    told = [n for n in r.notes if "does not reproduce the model given" in n]
    assert len(told) == 1 and "quantized only re-quantized" not in told[0] and "'x': scale" in told[0], told


def test_a_model_calibrated_on_other_data_is_checked_on_its_own_grids(outlier, tmp_path):
    """Ranges from other data than the data given: re-quantizing with the options alone gives
    another model (its 'before' figure another), so the check keeps the model's own grids;
    the settings shown hold the remedy alone."""
    from pytest_ptq.data import load_data
    from pytest_ptq.remedy.requantize import infer_quantize_options, requantize

    wide = {k: [16 * v for v in vs] for k, vs in outlier["data"].items()}
    other = builders.quantize(outlier["float"], tmp_path / "other.onnx", wide)
    qm = QuantModel(str(other))
    alone = requantize(outlier["float"], tmp_path / "alone.onnx", load_data(outlier["data"], qm),
                       infer_quantize_options(qm))
    expected = _grids(other)
    assert not np.array_equal(_grids(alone)["x"][0], expected["x"][0])
    r = suggest_remedy(str(other), outlier["data"], target=0.9999, remedy="float", output_node=SLICE,
                       float_model=str(outlier["float"]), save_dir=tmp_path / "out")
    assert "reproduces" not in r.measured
    again = _grids(r.measured["baseline_model"])
    assert set(again) == set(expected)
    _same_grids(again, expected, expected)
    assert r.measured["baseline_value"] == pytest.approx(r.baseline, abs=1e-9)
    # the remedy excluded conv1: the tensors it still quantizes keep the given grids
    fixed = _grids(r.measured["model"])
    assert "w1" not in fixed and set(fixed) < set(expected)
    _same_grids(fixed, expected, fixed)
    told = [n for n in r.notes if "does not reproduce the model given" in n]
    assert len(told) == 1 and "'x': scale 0.02934 against 0.4694 given" in told[0], told
    assert "scale" not in r.python_snippet() and "TensorQuantOverrides" not in r.summary().split("note:")[0]


def test_float_remedy_excludes_the_node_reading_the_weight(outlier):
    r = suggest_remedy(str(outlier["qdq"]), outlier["data"], target=0.99, remedy="float",
                       output_node=SLICE, float_model=str(outlier["float"]))
    assert r.nodes == ["w1_QuantizeLinear"]
    assert r.settings["nodes_to_exclude"] == ["conv1"]
    # simulated value = the QDQ model with w1's pair removed by rewiring, and conv1's int32
    # bias float as onnxruntime leaves an excluded node's, run plainly
    model = onnx.load(str(outlier["qdq"]))
    conv1 = next(n for n in model.graph.node if n.name == "conv1")
    bias = next(n.name for n in model.graph.node if n.output[0] == conv1.input[2])
    keep = set(builders.qdq_pairs(model)) - {"w1_QuantizeLinear", bias}
    rewired = builders.rewire(model, keep=keep, float_model=outlier["float"], outputs=["c1"])
    assert not any(n.name == bias for n in rewired.graph.node)
    feeds = _feeds(outlier["data"])
    ref = builders.run_model(_exposing_c1(outlier["float"]), feeds, outputs=["c1"])
    got = builders.run_model(rewired, feeds, outputs=["c1"])
    assert r.value == pytest.approx(_cosine(_sliced(ref), _sliced(got)), abs=1e-9)
    assert r.measured["met"] and r.measured["value"] >= r.value - 1e-6
    # conv1 was x's only reader: its pair cannot survive the exclusion
    assert "x" in r.measured["collateral"]
    assert r.model.endswith("qdq.onnx") and r.samples == N


def test_int16_finds_exactly_the_coarse_activation(planted):
    r = suggest_remedy(str(planted["qdq"]), planted["data"], target=0.999, remedy="int16")
    assert r.baseline < 0.999
    assert r.met and r.nodes == ["r1_QuantizeLinear"]
    assert r.settings["TensorQuantOverrides"] == {"r1": [{"quant_type": "QUInt16"}]}
    # independent: r1's pair rewritten by hand as uint16 over the same range
    model = onnx.load(str(planted["qdq"]))
    inits = {i.name: i for i in model.graph.initializer}
    s8 = float(numpy_helper.to_array(inits["r1_scale"]))
    assert int(numpy_helper.to_array(inits["r1_zero_point"])) == 0
    model.graph.initializer.extend([numpy_helper.from_array(np.array(s8 * 255 / 65535, np.float32), "r1_s16"),
                                    numpy_helper.from_array(np.array(0, np.uint16), "r1_z16")])
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] == "r1_scale":
            n.input[1], n.input[2] = "r1_s16", "r1_z16"
            n.domain = "com.microsoft"  # uint16 Q/DQ below opset 21
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    feeds = _feeds(planted["data"])
    ref = builders.run_model(planted["float"], feeds)
    got = builders.run_model(model, feeds)
    assert r.value == pytest.approx(_cosine([o["prob"] for o in ref], [o["prob"] for o in got]), abs=1e-7)


def test_per_channel_cannot_fix_a_coarse_activation(planted):
    r = suggest_remedy(str(planted["qdq"]), planted["data"], target=0.999, remedy="per-channel")
    assert not r.met
    assert r.ceiling < 0.999
    assert any("short of" in n for n in r.notes)
    assert all(n.startswith("w") for n in r.nodes)  # weights only: activations need --per-channel-activations


def test_overrides_are_written_as_onnxruntime_names_and_turned_into_enums():
    from onnxruntime.quantization import QuantType

    kw = quantize_static_kwargs({"nodes_to_exclude": ["conv1"],
                                 "TensorQuantOverrides": {"r1": [{"quant_type": "QUInt16"}], "w1": [{"axis": 0}]}})
    assert kw["nodes_to_exclude"] == ["conv1"]
    assert kw["extra_options"]["TensorQuantOverrides"]["r1"][0]["quant_type"] is QuantType.QUInt16
    assert str(QuantType.QUInt16) == "QUInt16"  # the JSON form is onnxruntime's own
    assert kw["extra_options"]["TensorQuantOverrides"]["w1"] == [{"axis": 0}]


def test_keeping_a_tensor_float_needs_its_producer_and_all_consumers(zoo, tmp_path):
    qm = QuantModel(str(zoo.qdq()))
    settings = onnxruntime_settings(qm, "float", ["r1_QuantizeLinear"])
    assert settings["nodes_to_exclude"] == ["relu1", "conv2", "add2"]

    def quantized_tensors(exclude, name):
        path = builders.quantize(zoo.float(), tmp_path / name, zoo.data(), nodes_to_exclude=exclude)
        return {q.input[0] for q, _ in builders.qdq_pairs(path).values() if q is not None}

    assert "r1" not in quantized_tensors(settings["nodes_to_exclude"], "all.onnx")
    # the consumers alone are not enough: the producer still asks for its output's pair
    assert "r1" in quantized_tensors(["conv2", "add2"], "consumers.onnx")


def test_pruning_drops_members_the_target_does_not_need(outlier):
    r = suggest_remedy(str(outlier["qdq"]), outlier["data"], target=0.99, remedy="float", output_node=SLICE,
                       ranking=["x_QuantizeLinear", "w1_QuantizeLinear"], requantize_check=False)
    assert [p["added"] for p in r.curve] == [None, "x_QuantizeLinear", "w1_QuantizeLinear"]
    assert r.curve[1]["value"] < 0.99 <= r.curve[2]["value"]
    assert r.pruned == ["x_QuantizeLinear"]
    assert r.nodes == ["w1_QuantizeLinear"]
    assert r.needed_for(0.99) == 2 and r.needed_for(1.5) is None


def test_re_quantizing_writes_nothing_beside_the_float_model(outlier, tmp_path):
    """onnxruntime, given the float model's path, wrote <name>-inferred.onnx beside it and
    deleted it: a user's file of that name was lost, and a read-only folder failed the search."""
    import shutil

    folder = tmp_path / "models"
    folder.mkdir()
    fpath = folder / "float.onnx"
    shutil.copy(outlier["float"], fpath)
    (folder / "float-inferred.onnx").write_text("mine")
    r = suggest_remedy(str(outlier["qdq"]), outlier["data"], target=0.99, remedy="per-channel", output_node=SLICE,
                       float_model=str(fpath))
    assert r.measured and r.met
    assert sorted(p.name for p in folder.iterdir()) == ["float-inferred.onnx", "float.onnx"]
    assert (folder / "float-inferred.onnx").read_text() == "mine"


def test_a_given_ranking_of_normal_nodes_a_name_or_a_typo(outlier):
    """The default ranking (normal nodes) was refused as another model's; a str was read letter
    by letter; a misspelt name was dropped in silence."""
    from pytest_ptq.engine import Engine
    from pytest_ptq.sensitivity import get_sensitivity_of_nodes

    engine = Engine(str(outlier["qdq"]), outlier["data"])
    qm = engine.qmodel
    by_node = get_sensitivity_of_nodes(engine, output_node=SLICE)  # node_type "node": normal nodes
    r = suggest_remedy(engine, target=0.99, remedy="float", output_node=SLICE, ranking=by_node,
                       requantize_check=False)
    expected = [c for n in by_node for c in qm.normal[n].quantizers if qm.calibration[c].role != "bias"]
    assert [x["node"] for x in r.ranking] == list(dict.fromkeys(expected))
    r = suggest_remedy(engine, target=0.99, remedy="float", output_node=SLICE, ranking="w1_QuantizeLinear",
                       requantize_check=False)
    assert [x["node"] for x in r.ranking] == ["w1_QuantizeLinear"]
    with pytest.raises(PTQError, match="unknown node 'w1_QuantizeLinera'; did you mean 'w1_QuantizeLinear'"):
        suggest_remedy(engine, target=0.99, remedy="float", ranking=["x_QuantizeLinear", "w1_QuantizeLinera"],
                       requantize_check=False)


def test_a_budget_stop_keeps_the_best_result_so_far(outlier, monkeypatch):
    calls = []
    original = remedy_mod.Scorer.__call__

    def limited(self, chosen):
        calls.append(chosen)
        if len(calls) > 3:  # baseline, ceiling, first greedy step; then time is up
            raise remedy_mod.OutOfTime
        return original(self, chosen)

    monkeypatch.setattr(remedy_mod.Scorer, "__call__", limited)
    r = suggest_remedy(str(outlier["qdq"]), outlier["data"], target=0.99, remedy="float", output_node=SLICE,
                       full_curve=True, budget=3600, requantize_check=False)
    assert r.budget_exhausted
    assert r.met and r.nodes == ["w1_QuantizeLinear"]
    assert len(r.curve) == 2
    assert any("budget" in n for n in r.notes)


def test_the_set_a_budget_stop_keeps_is_still_re_quantized_and_measured(outlier, monkeypatch, tmp_path):
    """The re-quantized check comes after the budget (it was skipped, and the exit said
    "simulated only" with the float model given)."""
    calls = []
    original = remedy_mod.Scorer.__call__

    def limited(self, chosen):
        calls.append(chosen)
        if len(calls) > 3:
            raise remedy_mod.OutOfTime
        return original(self, chosen)

    monkeypatch.setattr(remedy_mod.Scorer, "__call__", limited)
    r = suggest_remedy(str(outlier["qdq"]), outlier["data"], target=0.99, remedy="float", output_node=SLICE,
                       full_curve=True, budget=3600, float_model=str(outlier["float"]), save_dir=tmp_path)
    assert r.budget_exhausted and r.nodes == ["w1_QuantizeLinear"] and r.measured
    feeds = _feeds(outlier["data"])
    ref = builders.run_model(_exposing_c1(outlier["float"]), feeds, outputs=["c1"])
    got = builders.run_model(_exposing_c1(r.measured["model"]), feeds, outputs=["c1"])
    assert r.measured["value"] == pytest.approx(_cosine(_sliced(ref), _sliced(got)), abs=1e-9)
    assert "w1_QuantizeLinear" not in builders.qdq_pairs(r.measured["model"])


def test_a_budget_too_short_for_anything_still_returns_a_result(outlier):
    """A budget spent before any set was scored reported nothing, not even the model as given
    (n/a, where that costs a few seconds on a 279-node detector)."""
    r = suggest_remedy(str(outlier["qdq"]), outlier["data"], target=0.99, output_node=SLICE, budget=1e-9)
    assert r.budget_exhausted and not r.met and r.nodes == []
    # the model as given, run plainly: float's c1 against the QDQ file's
    feeds = _feeds(outlier["data"])
    ref = builders.run_model(_exposing_c1(outlier["float"]), feeds, outputs=["c1"])
    got = builders.run_model(_exposing_c1(outlier["qdq"]), feeds, outputs=["c1"])
    assert r.value == r.baseline == pytest.approx(_cosine(_sliced(ref), _sliced(got)), abs=1e-5)
    assert r.failure().startswith("the budget ended before any remedy was scored (the model as given reads "
                                  "cosine-similarity ")
    assert any("no remedy was scored yet" in n for n in r.notes)


@pytest.mark.parametrize("kwargs, words", [
    ({"remedy": "int4"}, "unknown remedy"),
    ({"target": 1.5}, "[-1, 1]"),
    ({"candidates": ["nope"]}, "unknown node"),
    ({"metric": "cosin"}, "did you mean"),
    ({"budget": 0}, "positive"),
])
def test_bad_arguments_get_one_clear_sentence(outlier, kwargs, words):
    with pytest.raises(PTQError, match=None) as exc:
        suggest_remedy(str(outlier["qdq"]), outlier["data"], **kwargs)
    assert words in str(exc.value)


# -- command line ---------------------------------------------------------------------------
def test_cli_suggest_prints_and_writes_the_settings(outlier, tmp_path, capsys):
    folder = builders.save_folder(outlier["data"], tmp_path / "data")
    out = tmp_path / "out"
    rc = main(["suggest", str(outlier["qdq"]), str(folder), "--target-cosine", "0.99", "--remedy", "per-channel",
               "-o", SLICE, "--float-model", str(outlier["float"]), "-s", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0
    assert '{"w1": [{"axis": 0}]}' in text and "re-quantized with these settings" in text
    # the last line says why the status is 0, as it says why it is 1
    assert text.splitlines()[-1].startswith("exit 0: the target holds on ") and "re-quantized" in text.splitlines()[-1]
    settings = json.loads((out / "remedy_per-channel_settings.json").read_text())
    assert quantize_static_kwargs(settings)["extra_options"]["TensorQuantOverrides"] == {"w1": [{"axis": 0}]}
    saved = json.loads((out / "remedy_per-channel.json").read_text())
    assert saved["nodes"] == ["w1_QuantizeLinear"] and saved["met"] is True
    # every file written is said, the re-quantized models among them
    told = {line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("wrote ")}
    assert told == {str(p) for p in out.iterdir()}, told


def test_cli_suggest_exits_1_when_the_target_is_out_of_reach(planted, tmp_path, capsys):
    folder = builders.save_folder(planted["data"], tmp_path / "data")
    # a target of seven nines is printed as given, not rounded to 1 (which no cosine below 1 meets)
    rc = main(["suggest", str(planted["qdq"]), str(folder), "--target-cosine", "0.9999999", "--remedy", "per-channel",
               "--no-save", "--quiet"])
    assert rc == 1
    text = capsys.readouterr().out
    assert "not met" in text
    assert text.splitlines()[-1].startswith("exit 1: no set found meets the target 0.9999999 on ")


def test_cli_suggest_bad_input_exits_2(tmp_path, capsys):
    assert main(["suggest", str(tmp_path / "missing.onnx"), str(tmp_path), "--no-save"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["suggest", str(tmp_path / "m.onnx"), str(tmp_path), "--metric", "mse", "--no-save"]) == 2
    assert "--target" in capsys.readouterr().err


def test_cli_suggest_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["suggest", "-h"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--target-cosine", "--remedy", "--budget", "--float-model", "Default: 0.99"):
        assert option in text


def test_settings_onnxruntime_cannot_apply_leave_the_simulated_result_and_say_why(tmp_path):
    """Weights held as Constant nodes: quantize_static quantizes them per tensor, but refuses
    per-channel overrides on them. The search's simulated result stands, with a warning that
    names onnxruntime's reason, not advice to check the float model."""
    data = builders.samples(N)
    model = onnx.load(str(builders.conv_net(tmp_path / "init.onnx", outlier_channel=3)))
    weights = [i for i in model.graph.initializer if len(i.dims) == 4]
    for w in weights:
        model.graph.initializer.remove(w)
        model.graph.node.insert(0, onnx.helper.make_node("Constant", [], [w.name], name=f"const_{w.name}", value=w))
    fpath = tmp_path / "float.onnx"
    onnx.save(model, str(fpath))
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data, keep_float=False)
    # the logits: the softmax after them saturates on this net
    result = suggest_remedy(str(qpath), data, target=1.0, remedy="per-channel", float_model=str(fpath),
                            output_node="logits", candidates=["w1_QuantizeLinear"], save_dir=tmp_path / "out")
    assert result.nodes and result.measured is None
    warning = next(w for w in result.warnings if "cannot apply the suggested settings" in w)
    assert "not an initializer" in warning and "check that the float model" not in warning
    assert "simulated only" in result.judged_by()


def test_per_channel_advice_on_a_model_already_quantized_per_channel(zoo):
    """quantize_static(per_channel=True) on a model whose weights are per channel already
    changes nothing for the weights it left per tensor: the advice asks for their axis."""
    from pytest_ptq.remedy.terms import per_channel_weights

    assert per_channel_weights(QuantModel(zoo.qdq("qdq"))) == "quantize_static(..., per_channel=True)"
    advice = per_channel_weights(QuantModel(zoo.qdq("qdq_pc")))
    assert "these stayed per tensor" in advice and "TensorQuantOverrides" in advice and "'axis'" in advice
    # which of the two ways made the per-channel weights the file does not tell (it claimed
    # per_channel=True of a file whose axes came from TensorQuantOverrides)
    assert "left these" not in advice and "per_channel=True) or an axis in TensorQuantOverrides" in advice


def test_per_channel_advice_at_an_opset_below_13_says_to_convert_first(tmp_path):
    """quantize_static(per_channel=True) on an opset-12 model (PP-OCRv4's recogniser as
    pre-processed) writes DequantizeLinear axes that opset lacks: the model fails to load."""
    import onnxruntime as ort

    from pytest_ptq.remedy.terms import per_channel_weights

    model = onnx.load(str(builders.conv_net(tmp_path / "f17.onnx")))
    model.opset_import[0].version, model.ir_version = 12, 7  # its ops read the same at 12
    onnx.save(model, str(tmp_path / "f12.onnx"))
    data = builders.samples(4)
    with pytest.raises(Exception, match="INVALID_GRAPH"):
        ort.InferenceSession(str(builders.quantize(tmp_path / "f12.onnx", tmp_path / "pc.onnx", data,
                                                   per_channel=True)))
    advice = per_channel_weights(QuantModel(str(builders.quantize(tmp_path / "f12.onnx", tmp_path / "q.onnx", data))))
    assert "converted to opset 13 first" in advice and "at its opset 12" in advice


@pytest.mark.parametrize("options", [dict(reduce_range=True, per_channel=True),
                                     dict(extra_options={"WeightSymmetric": False}),
                                     dict(activation_type="QUInt16")], ids=["reduce_range", "asymmetric", "a16"])
def test_the_options_read_from_a_model_quantize_it_again_the_same(tmp_path, options):
    """suggest re-quantizes the float model with the options the calibrated model shows: they
    missed reduce_range (7-bit weights) and asymmetric int8 weights, and took a 16-bit model's
    Add constant for an asymmetric weight; every scale and zero point must come back."""
    from pytest_ptq.data import load_data
    from pytest_ptq.remedy import infer_quantize_options, requantize

    rng = np.random.default_rng(0)
    w = (0.1 * rng.standard_normal((16, 32)) + 0.05).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["m"]), onnx.helper.make_node("Add", ["m", "b"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 32])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    fp = tmp_path / "f.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10), fp)
    data = {"x": [rng.standard_normal((1, 4, 16)).astype(np.float32) for _ in range(4)]}
    given = builders.quantize(fp, tmp_path / "q.onnx", data, **options)
    qm = QuantModel(str(given))
    again = requantize(fp, tmp_path / "again.onnx", load_data(data, qm), infer_quantize_options(qm))

    def qparams(path):
        inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}
        return {n.input[0]: [inits[t] for t in n.input[1:3]] for n in onnx.load(str(path)).graph.node
                if n.op_type == "QuantizeLinear"}

    expected, got = qparams(given), qparams(again)
    assert set(got) == set(expected)
    for tensor, (scale, zp) in expected.items():
        assert got[tensor][1].dtype == zp.dtype and np.array_equal(got[tensor][1], zp), tensor
        np.testing.assert_allclose(got[tensor][0], scale, rtol=1e-6, err_msg=tensor)


def test_onnxruntime_settings_take_one_name_or_an_engine_and_refuse_unknown_nodes(tmp_path):
    from pytest_ptq.engine import Engine

    data = builders.samples(2)
    q = builders.quantize(builders.conv_net(tmp_path / "f.onnx"), tmp_path / "q.onnx", data)
    qm = QuantModel(q)
    name = next(c for c in qm.calibration.values() if c.kind == "activation").name
    listed = onnxruntime_settings(qm, "float", [name])
    # one name is that name, not its letters; an Engine stands for its model
    assert onnxruntime_settings(qm, "float", name) == listed == onnxruntime_settings(Engine(q, data), "float", [name])
    for bad in ("zz", "conv1"):  # no node, a node that is no calibration node
        with pytest.raises(PTQError, match=f"unknown calibration node '{bad}'"):
            onnxruntime_settings(qm, "float", [bad])
    for bad in (None, [1]):
        with pytest.raises(PTQError, match="remedy settings .* cannot be read"):
            quantize_static_kwargs(bad)


def test_a_search_takes_one_metric_and_a_target_in_its_range(tmp_path):
    data = builders.samples(2)
    q = builders.quantize(builders.conv_net(tmp_path / "f.onnx"), tmp_path / "q.onnx", data)
    for kw, words in ((dict(metric=["mse", "l1"], target=0.1), "a metric must be a name"),
                      (dict(metric="mse", target=-1), "target must be >= 0 for mse, an error"),
                      (dict(metric="cos", target=2), r"target must lie in \[-1, 1\] for cosine-similarity")):
        with pytest.raises(PTQError, match=words):
            suggest_remedy(q, data, progress=False, requantize_check=False, **kw)


@pytest.mark.parametrize("per_channel", [False, True])
def test_an_int16_weight_is_simulated_on_the_grid_quantize_static_gives_it(zoo, per_channel):
    """A weight raised to 16 bits: its grid is the weight's own range at 16 bits, per channel
    where it is, as quantize_static computes it; not the 8-bit range at more bits (a step
    wider), which a model that amplifies small changes reads otherwise."""
    from onnxruntime.quantization import QuantType

    from pytest_ptq.engine import Engine
    from pytest_ptq.remedy.alternatives import alternatives_for

    name = "qdq_pc" if per_channel else "qdq"
    fpath, data = zoo.float(name), zoo.data(name)
    engine = Engine(str(zoo.qdq(name)), data)
    n = "w2_QuantizeLinear"
    alts, _ = alternatives_for(engine, "int16", [n], [0])
    sim = engine.with_alternatives(alts)
    # the settings it gives: a per-channel weight keeps its axis (a type alone makes it per tensor)
    settings = onnxruntime_settings(engine.qmodel, "int16", [n])
    assert settings["TensorQuantOverrides"] == {"w2": [{"quant_type": "QInt16", **({"axis": 0} if per_channel else {})}]}
    extra = quantize_static_kwargs(settings)["extra_options"]
    assert extra["TensorQuantOverrides"]["w2"][0]["quant_type"] == QuantType.QInt16
    # independent: quantize_static with those settings, run in a plain session
    q16 = builders.quantize(fpath, zoo.root / f"{name}_w2_int16.onnx", data, per_channel=per_channel,
                            extra_options={"UseQDQContribOps": True, **extra})
    # conv2's own output, before any pair rounds the difference away
    # with the int32 bias as given: quantize_static re-rounds it on the new weight scale, which
    # the simulation leaves as it was (a shift of under half a bias step)
    model = onnx.load(str(q16))
    given = {i.name: i for i in onnx.load(str(zoo.qdq(name))).graph.initializer if i.name.startswith("b2_quantized")}
    for init in model.graph.initializer:
        if init.name in given:
            init.CopyFrom(given[init.name])
    for node in model.graph.node:  # a per-channel bias scale reads along the bias' one axis
        if node.op_type == "DequantizeLinear" and node.input[0] in given:
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("axis", 0))
    every = tuple(builders.qdq_pairs(model))
    want = builders.run_model(builders.rewire(model, keep=every, outputs=["c2"]), [{"x": x} for x in data["x"]],
                              "disable")
    for i, w in enumerate(want):
        got = sim.run(i, "all", tensors=["c2"], alternative=[n])["c2"]
        np.testing.assert_allclose(got, w["c2"], rtol=1e-6, atol=1e-6)


def test_unnamed_float_nodes_are_excluded_under_the_names_the_advice_gives(tmp_path):
    """quantize_static excludes nodes by name only: advice naming a float model's unnamed
    conv by the name pytest-ptq gave it was ignored, and the re-quantized check measured the
    model without the remedy as if with it."""
    data = builders.samples(N)
    fpath = builders.conv_net(tmp_path / "float.onnx", outlier_channel=3, unnamed=True)
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data)
    r = suggest_remedy(str(qpath), data, target=0.99, remedy="float", output_node=SLICE, float_model=str(fpath),
                       save_dir=tmp_path / "out")
    assert r.baseline < 0.99 and r.settings["nodes_to_exclude"] == ["Conv_0"]
    requantized = onnx.load(r.measured["model"])
    conv = next(n for n in requantized.graph.node if n.op_type == "Conv")
    assert "w1" in conv.input and "x" in conv.input  # the first conv reads its float weight and input
    feeds = _feeds(data)
    ref = builders.run_model(_exposing_c1(fpath), feeds, outputs=["c1"])
    got = builders.run_model(_exposing_c1(requantized), feeds, outputs=["c1"])
    assert r.measured["value"] == pytest.approx(_cosine(_sliced(ref), _sliced(got)), abs=1e-9)
    assert r.measured["value"] > 0.99 > r.measured["baseline_value"]
    assert any("['Conv_0'] have no name of their own in its file" in n for n in r.notes)
    assert onnx.load(str(fpath)).graph.node[0].name == ""  # the user's file is left as it was


def test_a_node_the_quantizer_inserted_is_not_named_for_the_float_model(outlier, tmp_path):
    """AMD Quark inserts ops the float model lacks (an AveragePool for a Split): excluding one
    by name from quantize_static on the float model does nothing, so the advice said nothing."""
    from pytest_ptq.engine import Engine

    model = onnx.load(str(outlier["qdq"]))
    graph = model.graph
    dq = next(n for n in graph.node if n.op_type == "DequantizeLinear" and n.output[0].startswith("r1"))
    graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    at = next(k for k, n in enumerate(graph.node) if n.name == "conv2")
    graph.node.insert(at, onnx.helper.make_node("Mul", [dq.output[0], "one"], ["r1_times_one"], name="inserted_mul"))
    graph.node[at + 1].input[0] = "r1_times_one"
    onnx.save(model, str(tmp_path / "inserted.onnx"))
    engine = Engine(str(tmp_path / "inserted.onnx"), outlier["data"], float_model=str(outlier["float"]))
    pair = next(c.name for c in engine.qmodel.calibration.values() if c.input == "r1")
    s = onnxruntime_settings(engine.qmodel, "float", [pair])
    assert s["not_in_float_model"] == ["inserted_mul"]
    assert set(s["nodes_to_exclude"]) == {"relu1", "add2"}


def test_an_override_names_the_tensor_onnxruntime_quantized_past_a_folded_relu(tmp_path):
    """quantize_static deletes the Relu after a Conv, quantizes the Relu's output and gives its
    name to the Conv's output: an int16 override named the Conv's float output, which
    onnxruntime does not quantize, so a re-quantization left the pair in 8 bits."""
    from onnxruntime.quantization import QuantType

    from pytest_ptq.remedy.terms import float_tensor_name, float_tensor_names

    data = builders.samples(4)
    fpath = builders.conv_net(tmp_path / "float.onnx")
    builders.quantize(fpath, tmp_path / "q.onnx", data, keep_float=False)
    qm = QuantModel(str(tmp_path / "q.onnx"), float_model=str(fpath))
    folded = [c for c in qm.of_kind("activation") if c.folded is not None]
    assert folded  # the case
    relu_outputs = {n.output[0] for n in onnx.load(str(fpath)).graph.node if n.op_type == "Relu"}
    producers = {n.output[0]: n for n in onnx.load(str(fpath)).graph.node}
    for c in folded:
        name = float_tensor_name(qm, c)
        assert name in relu_outputs
        names = float_tensor_names(qm, c)  # with the Relu kept, the tensor before it is quantized too
        assert names == [name, producers[name].input[0]]
        # independently: onnxruntime honours the overrides on those names, folding the Relu or
        # keeping it as pytest-ptq re-quantizes, and every pair there is 16-bit
        for keep in (False, True):
            out = builders.quantize(fpath, tmp_path / f"{c.name}{keep}.onnx", data, keep_float=keep, extra_options={
                "TensorQuantOverrides": {t: [{"quant_type": QuantType.QUInt16}] for t in names}})
            model = onnx.load(str(out))
            inits = {i.name: i for i in model.graph.initializer}
            qs = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in names]
            assert len(qs) == (2 if keep else 1)
            assert all(inits[q.input[2]].data_type == onnx.TensorProto.UINT16 for q in qs)


def test_a_node_onnxruntime_never_quantizes_is_not_excluded(tmp_path):
    """Keeping the pair before a Log in float excluded the Log too, which onnxruntime never
    quantizes: the same file, a longer list (openwakeword's melspectrogram)."""
    from onnx import helper

    rng = np.random.default_rng(0)
    w = np.diag(np.abs(rng.standard_normal(8)) + 0.5).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Log", ["m"], ["y"], name="log")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8])], [numpy_helper.from_array(w, "w")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [(np.abs(rng.standard_normal((1, 4, 8))) + 0.1).astype(np.float32) for _ in range(4)]}
    qm = QuantModel(str(builders.quantize(fp, tmp_path / "q.onnx", data, keep_float=False)), float_model=str(fp))
    pair = next(c.name for c in qm.of_kind("activation") if "log" in c.consumers)
    assert onnxruntime_settings(qm, "float", [pair])["nodes_to_exclude"] == ["mm"]
    # independently: onnxruntime writes the same file with the Log excluded or not
    files = [onnx.load(str(builders.quantize(fp, tmp_path / f"{k}.onnx", data, keep_float=False,
                                             nodes_to_exclude=names)))
             for k, names in enumerate((["mm"], ["mm", "log"]))]
    assert [(n.op_type, list(n.input)) for n in files[0].graph.node] == \
        [(n.op_type, list(n.input)) for n in files[1].graph.node]


def test_a_remedy_that_fails_re_quantized_is_false():
    from pytest_ptq.remedy.result import Remedy

    figures = {"held-out": {"samples": 4, "before": 0.99, "after": 0.9985, "target": 0.998, "met": True}}
    r = Remedy(remedy="float", metric="cosine-similarity", target=0.998, met=True, nodes=["a"], value=0.9985,
               baseline=0.99, ceiling=None, curve=[], pruned=[], ranking=[], settings={}, judged_on="held-out",
               figures=figures)
    assert r and r.failure() is None
    # simulated it meets the target; re-quantized from the float model it does not
    r.measured = {"met": False, "value": 0.997, "figures": {"held-out": dict(figures["held-out"], after=0.9972,
                                                                               met=False)}}
    assert r.met and not r
    assert r.failure() == ("re-quantized with onnxruntime, the model reaches cosine-similarity 0.9972 on held-out "
                           "data, short of the target 0.998")


def test_the_remedy_figure_says_when_the_judge_chose_and_shows_the_plain_session(tmp_path, monkeypatch):
    from pytest_ptq.remedy import plot
    from pytest_ptq.remedy.result import Remedy

    drawn = []
    monkeypatch.setattr(plot, "save_figure", lambda fig, path, tight=False: drawn.append(fig) or path)
    held = {"samples": 4, "before": 0.98, "after": 0.9934, "target": 0.99, "met": True, "deployed": 0.9852}
    curve = [{"nodes": k, "cost": k, "added": n, "kind": "float", "value": v}
             for k, (n, v) in enumerate([(None, 0.985), ("a", 0.989), ("b", 0.995)])]
    r = Remedy(remedy="float", metric="cosine-similarity", target=0.99, met=True, nodes=["a", "b"], value=0.995,
               baseline=0.985, ceiling=None, curve=curve, pruned=[], ranking=[], settings={}, judged_on="held-out",
               judge_chose=True, cost=2, model="m.onnx", samples=8, measured={"met": True, "figures": {"held-out": held}},
               figures={"held-out": held, "calibration": dict(held, after=0.995, before=0.985)})
    plot.plot_remedy(r, tmp_path / "r.png")
    labels = drawn[0].axes[0].get_legend_handles_labels()[1]
    assert "chosen, on held-out\n(which chose part of the set)" in labels
    assert "that file in a plain onnxruntime\nsession (this machine), on held-out" in labels
    # nothing needed: a unit axis, and the side text says the model meets the target as given
    alone = Remedy(remedy="float", metric="cosine-similarity", target=0.99, met=True, nodes=[], value=0.995,
                   baseline=0.995, ceiling=None, curve=curve[:1], pruned=[], ranking=[], settings={}, model="m.onnx")
    plot.plot_remedy(alone, tmp_path / "alone.png")
    ax, side = drawn[1].axes
    assert ax.get_xlim() == (-0.5, 1.5)
    assert "meets the target on the search" in " ".join(t.get_text() for t in side.texts)


def test_a_deployed_file_short_of_the_target_points_at_what_explains_it(outlier, tmp_path, monkeypatch):
    """The re-quantized file as a plain session runs it fell short of the target its
    simulation met, and the warning sent the user to a warning on how the file runs otherwise
    than its simulation, which the calibration samples had been too close to give: it now
    names the command that compares the two, with the file written."""
    import importlib

    from pytest_ptq import stages

    requantize = importlib.import_module("pytest_ptq.remedy.requantize")  # the package names a function so
    value = requantize._value

    def deployed_short(new, part, objective, *read):  # the file as deployed reads 0.5, its simulation what it reads
        return 0.5 if isinstance(new, requantize._Plain) else value(new, part, objective, *read)

    monkeypatch.setattr(requantize, "_value", deployed_short)
    monkeypatch.setattr(stages, "SIMULATION_CLOSE", 0.0)  # no gap is warned of
    # scored on a model output: a plain session returns no tensor inside the graph
    fpath = builders.conv_net(tmp_path / "float.onnx", outlier_channel=3, two_outputs=True)
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", outlier["data"])
    r = suggest_remedy(str(qpath), outlier["data"], target=0.9999, remedy="float", output_node="r2",
                       float_model=str(fpath), save_dir=tmp_path / "out")
    assert r.measured["met"]
    short = [w for w in r.warnings if "short of the target" in w]
    assert len(short) == 1 and "see the warning" not in short[0], r.warnings
    assert f"`ptq-debug stages FLOAT_MODEL {tmp_path / 'out' / 'requantized_float.onnx'} DATA`" in short[0]


def test_a_16_bit_activation_is_simulated_on_the_range_onnxruntime_calibrated(tmp_path):
    """A Softmax input calibrated on [-100, 0.05] holds [-99.8, 0] in uint8 codes (its zero
    point rounded up to 255): the 16-bit simulation on that grid cut the positive scores to 0,
    where onnxruntime's 16-bit grid, on the calibrated range, keeps them (a masked attention
    score's tail: the search rejected the 1-node fix and kept 23 nodes in float). Simulated
    and re-quantized by onnxruntime now read the same."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="sm")], "sm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    xs = []
    for _ in range(8):
        x = -100 * rng.random((1, 16)).astype(np.float32)
        x[0, :4] = rng.uniform(-0.05, 0.05, 4)
        x[0, 0] = 0.05
        xs.append(x)
    data = {"x": xs}
    builders.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", data)
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "q.onnx")).graph.initializer}
    assert int(inits["x_zero_point"]) == 255  # the grid ends at 0, below the data's 0.05
    r = suggest_remedy(str(tmp_path / "q.onnx"), data, target=0.99999, remedy="int16", candidates=["x_QuantizeLinear"],
                       float_model=str(tmp_path / "f.onnx"), save_dir=tmp_path / "out")
    assert r.nodes == ["x_QuantizeLinear"]
    assert r.value == pytest.approx(r.measured["value"], abs=1e-7)


@pytest.mark.parametrize("weight_type, extra", [("QUInt8", {}), ("QInt8", {"WeightSymmetric": False})])
def test_per_channel_settings_give_the_grid_the_search_scored(tmp_path, weight_type, extra):
    """The per-channel remedy scores an asymmetric grid for asymmetric weights (uint8, or int8
    with zero points), but its settings ({"axis": A}) made quantize_static write a symmetric
    one (zero points 128 where 135, 166, ... were scored): they now ask for it."""
    from pytest_ptq.engine import Engine
    from pytest_ptq.remedy.alternatives import alternatives_for
    from pytest_ptq.remedy.requantize import infer_quantize_options, requantize

    data = builders.samples(4)
    fpath = builders.conv_net(tmp_path / "float.onnx")
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data, weight_type=weight_type,
                              extra_options={"AddQDQPairToWeight": True, **extra})
    engine = Engine(str(qpath), data, float_model=str(fpath))
    qm = engine.qmodel
    alts, axes = alternatives_for(engine, "per-channel", ["w2_QuantizeLinear"], [0])
    settings = onnxruntime_settings(qm, "per-channel", ["w2_QuantizeLinear"], axes)
    assert settings["TensorQuantOverrides"]["w2"] == [{"axis": axes["w2_QuantizeLinear"], "symmetric": False}]
    out = requantize(str(fpath), tmp_path / "fixed.onnx", engine.data, infer_quantize_options(qm), settings)
    written = QuantModel(str(out)).calibration["w2_QuantizeLinear"]
    assert written.per_channel
    np.testing.assert_array_equal(written.zero_point.ravel(), np.asarray(alts["w2_QuantizeLinear"].zero_point).ravel())
    np.testing.assert_allclose(written.scale.ravel(), np.asarray(alts["w2_QuantizeLinear"].scale).ravel(), rtol=1e-6)


@pytest.mark.parametrize("options", [{"nodes_to_exclude": ["conv2"]}, {"extra_options": {"ActivationSymmetric": True}}])
def test_options_the_file_shows_are_read_back_and_reproduce_it(tmp_path, options):
    """A node excluded between quantized neighbours still reads their pair (only its weight
    stays float), and uint8 activations made symmetric sit on code 128: neither was read back,
    so re-quantizing 'without settings' gave another model (conv2's weight int8; scales twice
    as fine)."""
    from pytest_ptq.engine import Engine
    from pytest_ptq.remedy.requantize import infer_quantize_options, requantize

    data = builders.samples(4)
    fpath = builders.conv_net(tmp_path / "float.onnx")
    extra = {"AddQDQPairToWeight": True, **options.get("extra_options", {})}
    given = builders.quantize(fpath, tmp_path / "given.onnx", data, extra_options=extra,
                              nodes_to_exclude=options.get("nodes_to_exclude"))
    engine = Engine(str(given), data, float_model=str(fpath))
    inferred = infer_quantize_options(engine.qmodel)
    assert inferred["nodes_to_exclude"] == options.get("nodes_to_exclude", [])
    again = requantize(str(fpath), tmp_path / "again.onnx", engine.data, inferred)

    def grids(path):
        model = onnx.load(str(path))
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        return {q.input[0]: (inits[q.input[1]].tolist(), inits[q.input[2]].tolist(), inits[q.input[2]].dtype.name)
                for q in model.graph.node if q.op_type == "QuantizeLinear"}

    assert grids(again) == grids(given)


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_check_keeps_a_percentile_models_grids_and_the_remedy_wins_where_it_acts(tmp_path, per_channel):
    """Percentile calibration leaves no trace in the file: re-quantized with MinMax its
    activations get other scales. Given the model's own grids, quantize_static writes them back
    exactly, per channel too; the remedy's own overrides and exclusions replace them where they
    act (r2 at 16 bits on its MinMax range, not the 8-bit scale; w2 per channel; fc in float)."""
    from pytest_ptq.data import load_data
    from pytest_ptq.remedy.requantize import _differences, infer_quantize_options, own_grids, requantize

    data = builders.samples(8)
    fpath = builders.conv_net(tmp_path / "float.onnx")
    given = builders.quantize(fpath, tmp_path / "given.onnx", data, per_channel=per_channel,
                              calibrate_method="Percentile")
    qm = QuantModel(str(given))
    options, samples = infer_quantize_options(qm), load_data(data, qm)
    alone = requantize(fpath, tmp_path / "alone.onnx", samples, options)
    assert _differences(qm, QuantModel(str(alone)))
    expected = _grids(given)
    kept = requantize(fpath, tmp_path / "kept.onnx", samples, options, kept=own_grids(qm))
    assert set(_grids(kept)) == set(expected)
    _same_grids(_grids(kept), expected, expected)
    assert _differences(qm, QuantModel(str(kept))) == []

    overrides = {"r2": [{"quant_type": "QUInt16"}]}
    if not per_channel:
        overrides["w2"] = [{"axis": 0}]
    settings = {"nodes_to_exclude": ["fc"], "TensorQuantOverrides": overrides}
    got = _grids(requantize(fpath, tmp_path / "fixed.onnx", samples, options, settings, kept=own_grids(qm)))
    exposed = builders.load(fpath)
    exposed.graph.output.append(onnx.helper.make_tensor_value_info("r2", onnx.TensorProto.FLOAT, None))
    r2 = np.concatenate([o["r2"].ravel() for o in builders.run_model(exposed, _feeds_of(data), outputs=["r2"])])
    assert got["r2"][1].dtype == np.uint16 and int(got["r2"][1]) == 0
    np.testing.assert_allclose(got["r2"][0], r2.max() / 65535, rtol=1e-6)
    if not per_channel:
        w2 = numpy_helper.to_array(next(i for i in onnx.load(str(fpath)).graph.initializer if i.name == "w2"))
        np.testing.assert_allclose(got["w2"][0], np.abs(w2).reshape(8, -1).max(axis=1) / 127, rtol=1e-6)
    assert "wf" not in got and "wf" in expected
    _same_grids(got, expected, [t for t in got if t != "r2" and (t != "w2" or per_channel)])


def _feeds_of(data):
    return [{k: v[i] for k, v in data.items()} for i in range(len(next(iter(data.values()))))]


def test_what_a_re_quantization_changed_is_read_by_one_rule_for_every_kind():
    """The onnxruntime check counted a tensor left in float as collateral only where the
    remedy kept something in float, and a changed width only where it raised one: a
    neighbour's pair lost to an int16 remedy went unsaid. Both checks read it one way now."""
    from types import SimpleNamespace as Grid

    from pytest_ptq.remedy.effect import changes

    eight, sixteen, channels = Grid(bit=8, per_channel=False), Grid(bit=16, per_channel=False), \
        Grid(bit=8, per_channel=True)
    before = {(t, 0): eight for t in ("a", "b", "c", "d", "e", "w")}
    after = {("a", 0): sixteen, ("c", 0): channels, ("d", 0): eight, ("w", 0): eight}
    found = changes(before, after, {"int16": [("a", 0), ("d", 0)], "per-channel": [("w", 0)]})
    assert found["kept"] == {"float": {}, "int16": {"a": True, "d": False}, "per-channel": {"w": False}}
    assert found["not_applied"] == ["d", "w"]
    assert found["collateral"] == ["b", "c", "e"]  # left in float (b, e) or made per channel (c), unnamed
    assert found["in_float"] == []
    found = changes(before, {("c", 0): eight}, {"float": [("a", 0)], "int16": [("b", 0)]}, named=["d"])
    assert found["kept"]["float"] == {"a": True} and found["kept"]["int16"] == {"b": True}
    assert found["in_float"] == ["b"] and found["collateral"] == ["e", "w"]  # d named, c unchanged


def test_a_re_quantized_file_runs_in_the_layout_its_simulation_computed(tmp_path, monkeypatch):
    """A node the settings keep in float is a constant in the re-quantized file and a gated
    choice in the simulation; onnxruntime's NCHWc layout reordered the constant one's sums
    and flipped codes downstream: the classifier's 2 depthwise weights in float read 0.984960
    re-quantized on held-out against 0.985222 simulated, the same model (exit 1 for it)."""
    from pytest_ptq.engine import Engine, runtime
    from pytest_ptq.remedy.requantize import requantized_runner

    data = builders.samples(3)
    f = builders.conv_net(tmp_path / "f.onnx")
    q = builders.quantize(f, tmp_path / "q.onnx", data, nodes_to_exclude=["conv2"])
    made, real = [], runtime.make_session

    def recording(model, *args, **kwargs):
        made.append(kwargs.get("disabled_optimizers"))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(runtime, "make_session", recording)
    runner = requantized_runner(q, Engine(str(q), data, float_model=str(f)).data, Engine(str(q), data))
    made.clear()
    got = runner.run(0, "all")["prob"]
    assert made and all("NchwcTransformer" in d for d in made)
    np.testing.assert_allclose(got, builders.run_model(q, {"x": data["x"][0]})["prob"], rtol=0, atol=1e-6)


def _spliced(base, donor, names, out):
    """``base`` with the initializers ``names`` taken from ``donor`` (same graph, other options)."""
    m, given = onnx.load(str(base)), {i.name: i for i in onnx.load(str(donor)).graph.initializer}
    for i in m.graph.initializer:
        if i.name in names:
            i.CopyFrom(given[i.name])
    onnx.save(m, str(out))
    return out


@pytest.mark.parametrize("option", ["reduce_range", "ActivationSymmetric"])
def test_an_option_only_some_tensors_show_is_not_inferred(tmp_path, option):
    """reduce_range and ActivationSymmetric are whole-model options of quantize_static: a model
    where one weight (one activation) shows it and the others do not was not quantized with it,
    so infer_quantize_options must not claim it (the re-quantized model would differ)."""
    from pytest_ptq.remedy import infer_quantize_options

    data = builders.samples(4)
    fp = builders.conv_net(tmp_path / "f.onnx")
    plain = builders.quantize(fp, tmp_path / "plain.onnx", data)
    if option == "reduce_range":
        whole = builders.quantize(fp, tmp_path / "whole.onnx", data, reduce_range=True)
        names, base, donor = {"w1_scale"}, plain, whole  # w1 on 7 bits, w2 and wf on 8
    else:
        whole = builders.quantize(fp, tmp_path / "whole.onnx", data, extra_options={"ActivationSymmetric": True})
        names, base, donor = {"c2_scale", "c2_zero_point"}, whole, plain  # c2 asymmetric, the rest symmetric

    def told(path):
        o = infer_quantize_options(QuantModel(str(path)))
        return o["reduce_range"] if option == "reduce_range" else o["extra_options"].get(option, False)

    # the pure models read as quantized (the splice is what makes the difference)
    assert told(whole) is True and told(plain) is False
    mixed = _spliced(base, donor, names, tmp_path / "mixed.onnx")
    # the splice really mixes: the model shows the option on some tensors, not on others
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(mixed)).graph.initializer}
    if option == "reduce_range":
        codes = {w: np.rint(inits[w] / inits[f"{w}_scale"]) for w in ("w1", "w2", "wf")}
        assert np.abs(codes["w1"]).max() <= 64 and all(np.abs(codes[w]).max() > 64 for w in ("w2", "wf"))
    else:
        zps = [int(v) for k, v in inits.items() if k.endswith("_zero_point") and v.dtype == np.uint8]
        assert 128 in zps and any(z != 128 for z in zps)
    assert told(mixed) is False


def test_a_given_ranking_of_several_results_is_ordered_by_the_values_given(outlier):
    """A list of rankings (activations, then weights) is one ranking: ordered by the values the
    results give, most sensitive first, not listed result by result; a node ranked twice keeps
    the value of the first mention; a normal node's pairs carry no value of their own."""
    from pytest_ptq.engine import Engine
    from pytest_ptq.sensitivity import get_sensitivity_of_nodes

    engine = Engine(str(outlier["qdq"]), outlier["data"])
    acts = get_sensitivity_of_nodes(engine, output_node=SLICE, node_type="activation")
    weights = get_sensitivity_of_nodes(engine, output_node=SLICE, node_type="weight")
    # independently: w1 alone quantized, in a plain session, on conv1's channels beside the outlier
    fs = _feeds(outlier["data"])
    ref = builders.run_model(builders.rewire(outlier["qdq"], outputs=["c1"]), fs, outputs=["c1"])
    got = builders.run_model(builders.rewire(outlier["qdq"], keep={"w1_QuantizeLinear"}, outputs=["c1"]), fs,
                             outputs=["c1"])
    w1 = _cosine([o["c1"][:, 0:3] for o in ref], [o["c1"][:, 0:3] for o in got])
    assert weights["w1_QuantizeLinear"]["cosine-similarity"] == pytest.approx(w1, abs=1e-6)
    r = suggest_remedy(engine, target=0.99, remedy="float", output_node=SLICE, ranking=[acts, weights],
                       requantize_check=False)
    given = {**{n: v["cosine-similarity"] for n, v in weights.items()},
             **{n: v["cosine-similarity"] for n, v in acts.items()}}
    shown = [(x["node"], x["sensitivity"]) for x in r.ranking]
    assert shown and all(v == given[n] for n, v in shown)
    # entries downstream of c1 change nothing compared (no figure): last, the rest by value
    measured = [v for _, v in shown if v is not None]
    assert [v for _, v in shown] == sorted(measured) + [None] * (len(shown) - len(measured))
    assert shown[0] == ("w1_QuantizeLinear", pytest.approx(w1, abs=1e-6)) and w1 < min(
        v["cosine-similarity"] for v in acts.values() if v["cosine-similarity"] is not None)
    # a node named first with a value of its own keeps it over a later result's
    r = suggest_remedy(engine, target=0.99, remedy="float", output_node=SLICE, requantize_check=False,
                       ranking=[{"w2_QuantizeLinear": {"cosine-similarity": -0.5}}, weights])
    assert r.ranking[0] == {"node": "w2_QuantizeLinear", "sensitivity": -0.5}
    assert r.ranking[1]["node"] == "w1_QuantizeLinear"
    # a normal node stands for its pairs with no value: its own would read as theirs
    by_node = get_sensitivity_of_nodes(engine, output_node=SLICE)
    r = suggest_remedy(engine, target=0.99, remedy="float", output_node=SLICE, ranking=by_node,
                       requantize_check=False)
    assert r.ranking and all(x["sensitivity"] is None for x in r.ranking)


def test_a_16_bit_input_takes_its_nodes_int32_bias_to_the_finer_grid(tmp_path):
    """onnxruntime quantizes a Conv's bias on its input scale times its weight scale: a 16-bit
    input re-quantizes the bias 257x finer. Behind an input range an outlier widened, the
    simulation that kept the bias on its old grid read another model than the re-quantized
    one (0.984915 against 0.984480 on a random net)."""
    data = builders.samples(N)
    data["x"][0] = data["x"][0].copy()
    data["x"][0][0, 0, 0, 0] = 1000.0  # x's range, and conv1's bias grid with it, some 300x too wide
    fpath = builders.conv_net(tmp_path / "float.onnx")
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data)
    # judged on conv1's output, which its input, weight and bias decide
    r = suggest_remedy(str(qpath), data, target=0.99999, remedy="int16", float_model=str(fpath), output_node="c1",
                       save_dir=tmp_path / "out")
    assert "x_QuantizeLinear" in r.nodes
    assert r.measured["collateral"] == [] and r.measured["not_applied"] == []
    # the old grid's rounding moved the figure by 6e-8 here: the two now agree to the last digits
    assert r.measured["value"] == pytest.approx(r.value, abs=1e-8)


def _overflowing_bias_net(tmp_path, weight_type):
    """One Conv whose last two channels have weights near 1e-4 and biases of +-0.5: at a
    16-bit weight grid their int32 bias (input scale x weight scale) would leave int32."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 3, 3, 3)) * np.array([1, 1, 1e-4, 1e-4]).reshape(4, 1, 1, 1)).astype(np.float32)
    b = np.array([0.1, -0.1, 0.5, -0.5], np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    fpath = tmp_path / "float.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fpath)
    data = {"x": [rng.standard_normal((1, 3, 6, 6)).astype(np.float32) for _ in range(6)]}
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data, per_channel=True, weight_type=weight_type)
    return fpath, qpath, data


@pytest.mark.parametrize("weight_type", ["QUInt8", "QInt8"])
def test_a_bias_beyond_int32_at_a_16_bit_weight_is_simulated_as_onnxruntime_quantizes_it(tmp_path, weight_type):
    """onnxruntime clips an int32 bias that leaves int32 behind an unsigned weight grid, and
    widens a signed symmetric weight's grid until it fits: the simulation widened the bias's
    grid in both, and read 0.99997 where the re-quantized file reads 0.99914 (clipped)."""
    from pytest_ptq.engine import Engine
    from pytest_ptq.metrics import get_metrics
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.remedy.alternatives import alternatives_for
    from pytest_ptq.remedy.biases import with_biases
    from pytest_ptq.remedy.scoring import config, score
    from pytest_ptq.remedy.terms import onnxruntime_settings, quantize_static_kwargs

    fpath, qpath, data = _overflowing_bias_net(tmp_path, weight_type)
    engine = Engine(str(qpath), data, float_model=str(fpath))
    alts, _ = alternatives_for(engine, "int16", ["w_QuantizeLinear"], range(6))
    e16 = engine.with_alternatives(with_biases(engine, alts))
    quantized, alternative = config(e16, frozenset([("w_QuantizeLinear", "int16")]))
    simulated = score(e16, quantized, parse_outputs(["c"], e16), get_metrics("cosine-similarity")[0], range(6),
                      alternative=alternative)
    # independently: the float model re-quantized with the 16-bit override, run plainly
    kwargs = quantize_static_kwargs(onnxruntime_settings(engine.qmodel, "int16", ["w_QuantizeLinear"]))
    requantized = builders.quantize(fpath, tmp_path / "r.onnx", data, per_channel=True, weight_type=weight_type,
                                    extra_options=kwargs["extra_options"])
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(_exposing(fpath, "c"), feeds, outputs=["c"])
    got = builders.run_model(_exposing(requantized, "c"), feeds, outputs=["c"])
    assert simulated == pytest.approx(_cosine([o["c"] for o in ref], [o["c"] for o in got]), abs=1e-8)


def test_a_16_bit_activation_of_a_symmetric_model_is_centred_as_onnxruntime_centres_it(tmp_path):
    """Under ActivationSymmetric onnxruntime centres a 16-bit activation on code 32768; the
    simulated grid was asymmetric over the 8-bit grid's codes (zero point 32896), and clipped
    the top 0.4% of the range the re-quantized file keeps."""
    from onnx import numpy_helper as nh

    from pytest_ptq.engine import Engine
    from pytest_ptq.remedy.alternatives import alternatives_for
    from pytest_ptq.remedy.terms import onnxruntime_settings, quantize_static_kwargs

    data = builders.samples(N)
    fpath = builders.conv_net(tmp_path / "float.onnx")
    qpath = builders.quantize(fpath, tmp_path / "q.onnx", data, extra_options={"ActivationSymmetric": True})
    engine = Engine(str(qpath), data, float_model=str(fpath))
    assert engine.qmodel.symmetric_activations()
    alts, _ = alternatives_for(engine, "int16", ["r1_QuantizeLinear"], range(N))
    extra = quantize_static_kwargs(onnxruntime_settings(engine.qmodel, "int16", ["r1_QuantizeLinear"]))["extra_options"]
    requantized = onnx.load(str(builders.quantize(fpath, tmp_path / "r.onnx", data,
                                                  extra_options={**extra, "ActivationSymmetric": True})))
    inits = {i.name: nh.to_array(i) for i in requantized.graph.initializer}
    q = next(n for n in requantized.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "r1")
    assert inits[q.input[2]].dtype == np.uint16 and int(inits[q.input[2]]) == 32768
    assert float(alts["r1_QuantizeLinear"].zero_point) == 32768
    assert float(alts["r1_QuantizeLinear"].scale) == pytest.approx(float(inits[q.input[1]]), rel=1e-6)


def _exposing(path, tensor):
    """The model at ``path`` with ``tensor`` added as a graph output (where it is not one)."""
    model = onnx.load(str(path))
    if tensor not in {o.name for o in model.graph.output}:
        model.graph.output.append(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    return model


@pytest.mark.parametrize("named, given, computed", [
    # onnxruntime's defaults delete relu1 and give its name to conv1's output, the float 'c1';
    # re-quantizing keeps the Relu, so there 'r1' is the Relu's output and 'c1' the Conv's
    ("r1", "r1", "c1"),
    ("c2", "c2", "c2"),  # inside the graph, named alike everywhere
    ("prob", "prob", "prob"),  # a model output
])
def test_a_named_output_is_scored_on_the_same_tensor_in_the_re_quantized_models(tmp_path, named, given, computed):
    """The re-quantized check read 'r1' by name: the re-quantized file's Relu output against
    the calibrated file's Conv output (0.70 against 0.99995 for the file as given)."""
    data = builders.samples(N)
    fpath = builders.conv_net(tmp_path / "float.onnx")
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data, keep_float=False)
    producers = {o: n.op_type for n in onnx.load(str(qpath)).graph.node for o in n.output}
    assert named != "r1" or producers["r1"] == "Conv"  # the rename this test is about
    r = suggest_remedy(str(qpath), data, target=0.99999, remedy="float", output_node=named, float_model=str(fpath),
                       save_dir=tmp_path / "out")
    assert r.nodes and r.measured and r.figures["calibration"]["samples"] == N
    feeds = _feeds(data)
    ref = [o[computed] for o in builders.run_model(_exposing(fpath, computed), feeds, outputs=[computed])]

    def cosine(path, tensor):
        return _cosine(ref, [o[tensor] for o in builders.run_model(_exposing(path, tensor), feeds, outputs=[tensor])])

    assert r.figures["calibration"]["before"] == pytest.approx(cosine(qpath, given), abs=1e-7)
    # each re-quantized model read where it computes what the file's tensor computes
    assert r.measured["baseline_value"] == pytest.approx(cosine(r.measured["baseline_model"], computed), abs=1e-7)
    assert r.measured["value"] == pytest.approx(cosine(r.measured["model"], computed), abs=1e-7)
    assert r.measured["baseline_value"] == pytest.approx(r.baseline, abs=1e-6)
    assert not any("does not reproduce" in n for n in r.notes)
    assert any(f"{given!r} of " in n and f"is read as {computed!r}" in n for n in r.notes) == (given != computed)
    # the simulated figures read the file's 'r1', the Conv's output: said there too, not only
    # where the re-quantized models are read
    folded = [n for n in r.notes if f"holds what the float model names {computed!r}" in n]
    assert len(folded) == (given != computed) and all("folded the float model's Relu" in n for n in folded)
    # a plain session returns graph outputs only: a tensor inside is said to be left out, not
    # reported as a file that does not run
    assert not any("does not run in a plain onnxruntime session" in w for w in r.warnings)
    inner = named not in {o.name for o in onnx.load(str(qpath)).graph.output}
    assert inner == any("not scored as a plain onnxruntime session runs it" in n for n in r.notes)
    assert inner or "deployed" in r.measured["figures"][r.judged_on]


@pytest.mark.parametrize("ops, named, mapped", [
    (["Identity"], "c2_in", True),
    (["Cast"], "c2_in", True),  # float to float: c2's values
    (["Flatten", "Reshape"], "c2_in", True),  # c2's shape given back: its values, each in its place
    (["Flatten", "Reshape"], "c2_in_0", False),  # the Flatten's: c2's values laid out otherwise
    (["Transpose"], "c2_in", False),  # c2's shape (16 x 16), its values moved
])
def test_a_tensor_the_float_model_does_not_compute_is_not_scored_by_its_name_alone(tmp_path, ops, named, mapped):
    """Nodes the quantizer inserted before conv2's pair: an Identity, a Cast between float
    types and reshapes that give c2's shape back hold conv2's very values, read as 'c2' in the
    re-quantized models (the Cast and the reshapes were refused: "has no counterpart"); a
    tensor whose values a node moves (a Transpose) or lays out in another shape gets one
    sentence, not a score of whatever bears its name."""
    from onnx import helper

    data = builders.samples(N)
    fpath = builders.conv_net(tmp_path / "float.onnx")
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data, keep_float=False)
    model = onnx.load(str(qpath))
    nodes = list(model.graph.node)
    at = next(k for k, n in enumerate(nodes) if n.op_type == "QuantizeLinear" and n.input[0] == "c2")
    nodes[at].input[0] = "c2_in"
    chain, src = [], "c2"
    for k, op in enumerate(ops):
        out = "c2_in" if k == len(ops) - 1 else f"c2_in_{k}"
        extra = {"Cast": {"to": onnx.TensorProto.FLOAT}, "Transpose": {"perm": [0, 1, 3, 2]}}.get(op, {})
        inputs = [src, "c2_shape"] if op == "Reshape" else [src]
        chain.append(helper.make_node(op, inputs, [out], name=f"inserted{k}", **extra))
        src = out
    nodes[at:at] = chain
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 8, 16, 16], np.int64), "c2_shape"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(tmp_path / "inserted.onnx"))
    r = suggest_remedy(str(tmp_path / "inserted.onnx"), data, target=0.99999, remedy="float", output_node=named,
                       float_model=str(fpath), save_dir=tmp_path / "out")
    assert r.nodes
    said = [n for n in r.notes if "has no counterpart in the re-quantized model" in n]
    if not mapped:
        assert r.measured is None and len(said) == 1 and f"{named!r}" in said[0]
        return
    assert not said and r.measured
    feeds = _feeds(data)
    ref = [o["c2"] for o in builders.run_model(_exposing(fpath, "c2"), feeds, outputs=["c2"])]
    for key, path in (("value", r.measured["model"]), ("baseline_value", r.measured["baseline_model"])):
        got = [o["c2"] for o in builders.run_model(_exposing(path, "c2"), feeds, outputs=["c2"])]
        assert r.measured[key] == pytest.approx(_cosine(ref, got), abs=1e-7)


@pytest.mark.parametrize("dropped", ["c1_QuantizeLinear", "r2_QuantizeLinear"])
def test_what_the_settings_also_changed_is_read_against_the_baseline_re_quantized(outlier, tmp_path, dropped):
    """'also changed by onnxruntime' compared the remedy's re-quantized model with the file
    given, so where quantize_static quantizes otherwise than the file's producer it named
    tensors the settings do not reach (r2's pair missing from the file: 'p' listed) and left
    out tensors they do (c1's missing: excluding conv1 takes c1's pair away, unsaid). What the
    settings reach is what differs between the two re-quantized files."""
    given = tmp_path / "given.onnx"
    onnx.save(builders.rewire(outlier["qdq"], keep=set(builders.qdq_pairs(outlier["qdq"])) - {dropped}), given)
    r = suggest_remedy(str(given), outlier["data"], target=0.99999, remedy="float", output_node=SLICE,
                       float_model=str(outlier["float"]), save_dir=tmp_path / "out")
    assert r.nodes and r.measured

    def quantized(path):
        return {q.input[0]: q for q in onnx.load(str(path)).graph.node if q.op_type == "QuantizeLinear"}

    named = {q.input[0] for q in onnx.load(str(given)).graph.node if q.name in r.nodes}
    base, fixed = quantized(r.measured["baseline_model"]), quantized(r.measured["model"])
    expected = sorted(t for t in base if t not in named and t not in fixed)
    assert expected and r.measured["collateral"] == expected


@pytest.mark.parametrize("named", [["gemm_out"], ["gemm_out", "logits"]])
def test_a_tensor_inside_a_gemm_head_is_scored_in_a_re_quantized_model_left_all_float(tmp_path, named):
    """A classifier head exported as Reshape -> Gemm -> Reshape, scored on the Gemm's output
    (inside the graph) and the model output: keeping conv1's and the Gemm's inputs in float
    excludes both nodes, and onnxruntime then quantizes nothing (a Relu or Reshape alone takes
    no pair). The check refused such a model ("tensor 'gemm_out' is not in the re-quantized
    model"), though it computes 'gemm_out' under the float model's name."""
    data = builders.samples(N, size=8)
    fpath = builders.gemm_head_net(tmp_path / "float.onnx")
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data)
    chosen = ["wf_QuantizeLinear", "x_QuantizeLinear"]
    r = suggest_remedy(str(qpath), data, target=0.999999, remedy="float", output_node=named, float_model=str(fpath),
                       candidates=chosen, save_dir=tmp_path / "out")
    assert sorted(r.nodes) == chosen
    assert not any("not in the re-quantized model" in n for n in r.notes)
    fixed = onnx.load(r.measured["model"])
    assert not any(n.op_type == "QuantizeLinear" for n in fixed.graph.node)  # the case this test is about
    feeds = _feeds(data)
    ref = builders.run_model(_exposing(fpath, "gemm_out"), feeds, outputs=named)

    def worst(model):  # the worst output's cosine over the samples pooled, in numpy
        got = builders.run_model(model, feeds, outputs=named)
        return min(_cosine([o[t] for o in ref], [o[t] for o in got]) for t in named)

    # the simulation against the model given with the chosen pairs bypassed by hand, and the
    # int32 biases of conv1 and the Gemm (lone DQs on their input's and weight's scales) read
    # in float, as excluding both nodes leaves them
    keep = [p for p, (q, _) in builders.qdq_pairs(qpath).items() if p not in chosen and q is not None]
    bypassed = builders.rewire(qpath, keep=keep, float_model=fpath, outputs=["gemm_out"])
    assert r.figures["calibration"]["after"] == pytest.approx(worst(bypassed), abs=1e-7)
    assert r.figures["calibration"]["before"] == pytest.approx(worst(_exposing(qpath, "gemm_out")), abs=1e-7)
    # the re-quantized models, read on 'gemm_out' where each computes it
    assert r.measured["value"] == pytest.approx(worst(_exposing(r.measured["model"], "gemm_out")), abs=1e-7)
    assert r.measured["baseline_value"] == pytest.approx(
        worst(_exposing(r.measured["baseline_model"], "gemm_out")), abs=1e-7)


def test_an_output_that_stays_short_with_every_candidate_remedied_is_named_with_its_value(tmp_path):
    """Two outputs, one ('r2') that keeping every candidate in float cannot bring to the
    target (its own pairs are left out of the candidates), the other ('prob') met: the
    search said only that the worst output's figure stayed short, not which output, so a
    user could not tell which output to aim at (or to give a looser floor)."""
    data = builders.samples(N)
    fpath = builders.conv_net(tmp_path / "float.onnx", two_outputs=True, outlier_channel=3)
    narrow = {k: [a * 0.1 for a in v] for k, v in data.items()}
    # biases left float: bypassing a pair then touches that pair alone
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", narrow, extra_options={"QuantizeBias": False})
    pairs = builders.qdq_pairs(qpath)
    candidates = [p for p in pairs if p not in ("a2_QuantizeLinear", "r2_QuantizeLinear")]
    r = suggest_remedy(str(qpath), data, target=0.999, remedy="float", float_model=str(fpath),
                       candidates=candidates, requantize_check=False)
    search = r.split["search"]
    feeds = [{k: v[i] for k, v in data.items()} for i in search]
    ref = builders.run_model(fpath, feeds)
    every = builders.run_model(builders.rewire(qpath, keep=["a2_QuantizeLinear", "r2_QuantizeLinear"]), feeds)
    cos = {t: _cosine([o[t] for o in ref], [o[t] for o in every]) for t in ("prob", "r2")}
    assert cos["prob"] >= 0.999 > cos["r2"]  # the case this test is about
    assert not r.met and r.ceiling == pytest.approx(cos["r2"], abs=1e-6)
    assert list(r.ceiling_outputs) == ["r2"] and r.ceiling_outputs["r2"] == pytest.approx(cos["r2"], abs=1e-6)
    why = r.failure()
    assert "output 'r2' reaches only" in why and f"{cos['r2']:.6g}" in why and "'prob'" not in why
    note = next(n for n in r.notes if n.startswith("with every candidate kept in float"))
    assert f"output 'r2' {cos['r2']:.6g}" in note and f"'prob' reaches {cos['prob']:.6g}" in note


def test_per_output_targets_hold_each_output_to_its_own_and_find_a_smaller_set(tmp_path):
    """A contract's per-output floors ({prob: strict, r2: loose}) could only be searched at the
    strictest for every output, which sends the search after more than the contract asks:
    given as the output checks take them, each output meets its own target, with fewer
    nodes, checked by a plain onnxruntime session with the remedy's pairs bypassed."""
    data = builders.samples(N)
    fpath = builders.conv_net(tmp_path / "float.onnx", two_outputs=True)
    # biases left float: bypassing a pair then touches that pair alone
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data, extra_options={"QuantizeBias": False})
    targets = {"prob": 0.99998, "default": 0.9995}  # the contract's form: r2 takes the default
    own = {"prob": 0.99998, "r2": 0.9995}
    kw = dict(remedy="float", float_model=str(fpath), requantize_check=False)
    per = suggest_remedy(str(qpath), data, target=targets, **kw)
    strictest = suggest_remedy(str(qpath), data, target=max(own.values()), **kw)
    assert per.met and strictest.met
    assert per.objective["targets"] == own and per.outputs == ["prob", "r2"]
    assert 0 < len(per.nodes) < len(strictest.nodes), (per.nodes, strictest.nodes)
    # independently: the remedy's pairs bypassed (weights back to float), every output pooled
    # over the samples of each part against the float model, each against its own target
    pairs = builders.qdq_pairs(qpath)
    fixed = builders.rewire(qpath, keep=[p for p in pairs if p not in per.nodes], float_model=fpath)
    for part, indices in (("calibration", range(N)), (per.judged_on, per.split[per.judged_on])):
        feeds = [{k: v[i] for k, v in data.items()} for i in indices]
        ref, out = builders.run_model(fpath, feeds), builders.run_model(fixed, feeds)
        cos = {t: _cosine([o[t] for o in ref], [o[t] for o in out]) for t in own}
        assert all(cos[t] >= own[t] for t in own), (part, cos)
        assert per.figures[part]["outputs"]["after"] == pytest.approx(cos, abs=1e-6)
        assert per.figures[part]["after"] == pytest.approx(min(cos.values()), abs=1e-6)
    assert not per.failure() and "'prob' 0.99998, 'r2' 0.9995" in per.summary()
    # one bar for every output: the search as with that number
    same = suggest_remedy(str(qpath), data, target={"default": 0.99998}, **kw)
    assert same.nodes == strictest.nodes and "targets" not in same.objective
    with pytest.raises(PTQError, match="'r2' of output_node \\(-o\\) has no target"):
        suggest_remedy(str(qpath), data, target={"prob": 0.9}, output_node=["prob", "r2"], **kw)


def test_per_output_targets_on_the_command_line_and_an_output_that_stays_short_named_with_its_own(tmp_path, capsys):
    """--target-cosine takes OUTPUT=VALUE as --cost takes KIND=COST; where an output cannot
    reach its own target, the note and the exit sentence name it with that target."""
    data = builders.samples(N)
    fpath = builders.conv_net(tmp_path / "float.onnx", two_outputs=True, outlier_channel=3)
    narrow = {k: [a * 0.1 for a in v] for k, v in data.items()}
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", narrow, extra_options={"QuantizeBias": False})
    candidates = [p for p in builders.qdq_pairs(qpath) if p not in ("a2_QuantizeLinear", "r2_QuantizeLinear")]
    folder = builders.save_folder(data, tmp_path / "calib")
    rc = main(["suggest", str(qpath), str(folder), "--target-cosine", "prob=0.99", "r2=0.999", "--remedy", "float",
               "--candidates", *candidates, "--no-requantize", "--no-save", "--quiet",
               "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["objective"]["targets"] == {"prob": 0.99, "r2": 0.999}
    search = saved["split"]["search"]
    feeds = [{k: v[i] for k, v in data.items()} for i in search]
    ref = builders.run_model(fpath, feeds)
    every = builders.run_model(builders.rewire(qpath, keep=["a2_QuantizeLinear", "r2_QuantizeLinear"]), feeds)
    r2 = _cosine([o["r2"] for o in ref], [o["r2"] for o in every])
    assert r2 < 0.999 and rc == 1  # the case this test is about
    assert f"output 'r2' {r2:.6g} of its 0.999" in out and "'prob' 0.99, 'r2' 0.999" in out
    assert f"output 'r2' reaches only {r2:.6g} of its 0.999" in out.splitlines()[-1]


def test_a_target_given_before_the_model_says_where_the_model_goes(capsys):
    """--target-cosine takes every value after it (OUTPUT=VALUE ...): written before MODEL DATA,
    as a single value was, it says to put them first or to write --target-cosine=VALUE, which
    then reads MODEL and DATA as given."""
    from pytest_ptq.cli import build_parser

    qpath, folder = "qdq.onnx", "calib"  # parsed only: argparse reads no file
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["suggest", "--target-cosine", "0.999", qpath, folder])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"got {qpath!r}" in err and "give MODEL and DATA before it, or write --target-cosine=VALUE" in err
    args = build_parser().parse_args(["suggest", "--target-cosine=0.999", qpath, folder])
    assert (args.target_cosine, args.model, args.data) == ([(None, 0.999)], qpath, folder)


def _per_output_net(tmp_path):
    data = builders.samples(N)
    fpath = builders.conv_net(tmp_path / "float.onnx", two_outputs=True)
    # biases left float: bypassing a pair then touches that pair alone
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data, extra_options={"QuantizeBias": False})
    return data, fpath, qpath


def test_per_output_targets_are_recorded_per_output_in_every_figure_and_answer_needed_per_output(tmp_path):
    """With per-output targets, the figures' 'target', the re-quantized figures and needed_for
    held the strictest target only (and the re-quantized figures no per-output values): each
    record now carries each output's target and values, checked against plain onnxruntime
    sessions (the curve's sets bypassed; the re-quantized file as written). needed_for gave a
    dict here, and on a record read back without the curve's outputs {output: None} ("never"):
    it is one number (the strictest target), needed_per_output the dict, and a point without its
    outputs is judged as the search judges such a value, its worst output against the strictest."""
    data, fpath, qpath = _per_output_net(tmp_path)
    own = {"prob": 0.99998, "r2": 0.9995}
    r = suggest_remedy(str(qpath), data, target=own, remedy="float", float_model=str(fpath), full_curve=True,
                       save_dir=tmp_path / "out")
    assert r.targets == own
    for f in list(r.figures.values()) + list(r.measured["figures"].values()):
        assert f["targets"] == own and set(f["outputs"]) == {"before", "after"}
    # the re-quantized file, run in a plain session against the float model, output by output
    for part, indices in (("calibration", range(N)), (r.judged_on, r.split[r.judged_on])):
        feeds = [{k: v[i] for k, v in data.items()} for i in indices]
        ref, out = builders.run_model(fpath, feeds), builders.run_model(r.measured["model"], feeds)
        cos = {t: _cosine([o[t] for o in ref], [o[t] for o in out]) for t in own}
        assert r.measured["figures"][part]["outputs"]["after"] == pytest.approx(cos, abs=1e-6)
    # each curve point's outputs, the first k moves bypassed, on the search samples
    feeds = [{k: v[i] for k, v in data.items()} for i in r.split["search"]]
    ref = builders.run_model(fpath, feeds)
    pairs = builders.qdq_pairs(qpath)
    first, worst = {}, []
    for p in r.curve:
        added = [q["added"] for q in r.curve[1:p["nodes"] + 1]]
        out = builders.run_model(builders.rewire(qpath, keep=[q for q in pairs if q not in added], float_model=fpath),
                                 feeds)
        cos = {t: _cosine([o[t] for o in ref], [o[t] for o in out]) for t in own}
        assert p["outputs"] == pytest.approx(cos, abs=1e-6)
        worst.append((p["nodes"], min(cos.values())))
        for t in own:
            if cos[t] >= own[t]:
                first.setdefault(t, p["nodes"])
    # the worst output against the strictest target (a margin clear of the figures' rounding)
    strictest = max(own.values())
    assert all(abs(v - strictest) > 1e-6 for _, v in worst)
    by_worst = next((k for k, v in worst if v >= strictest), None)
    assert by_worst is not None  # else "never" would pass for the fallback below
    assert r.needed_per_output() == {t: first.get(t) for t in own}
    assert r.needed_for() == by_worst
    assert r.needed_for(own["prob"]) == next(p["nodes"] for p in r.curve if min(p["outputs"].values()) >= own["prob"])
    saved = json.loads(json.dumps(r.to_dict()))
    assert saved["figures"]["calibration"]["targets"] == own and saved["curve"][0]["outputs"].keys() == own.keys()
    # read back from a record without the curve's outputs: every output at the worst's first
    for p in saved["curve"]:
        del p["outputs"]
    back = Remedy(**saved)
    assert back.needed_per_output() == {t: by_worst for t in own}
    assert back.needed_for() == by_worst


def test_the_judged_re_quantized_line_gives_each_outputs_target():
    """producer_lines printed the judged part's strictest target for per-output targets."""
    from pytest_ptq.remedy.result import producer_lines

    terms = {"label": "Q", "short": "q", "names": "float model", "lines": ["x"], "unsupported": [], "notes": []}
    figure = {"before": 0.9, "after": 0.99, "original": 0.8, "target": 0.999, "targets": {"a": 0.999, "b": 0.99}}
    measured = {"kept": {}, "after": {"calibration": 0.99}, "before": {"calibration": 0.9},
                "original": {"calibration": 0.8}, "figures": {"held-out": figure}}
    line = producer_lines(terms, measured, judged_on="held-out")[-1]
    assert line.endswith("target 'a' 0.999, 'b' 0.99)"), line


def test_two_spellings_of_one_output_are_compared_once_at_the_stricter_target(tmp_path):
    """'r2[:, 0:2]' and 'r2[:, :2]' (or an output named twice, refused as a repeat) were
    two outputs compared twice, and a whole output named as 'r2[:]' was compared again under
    the default's target: each is one output now, held to the stricter of its targets, its
    figure the slice's cosine from a plain onnxruntime session."""
    from pytest_ptq.engine import engine_for
    from pytest_ptq.remedy.objective import objective_for

    data, fpath, qpath = _per_output_net(tmp_path)
    engine = engine_for(str(qpath), data)
    o = objective_for("cosine-similarity", {"r2[:, 0:2]": 0.99, "r2[:, :2]": 0.999, "prob": 0.99}, None, engine)
    assert [s.name for s in o.specs] == ["r2[:, 0:2]", "prob"] and o.targets == {"r2[:, 0:2]": 0.999, "prob": 0.99}
    o = objective_for("cosine-similarity", {"r2[:]": 0.9, "default": 0.999}, None, engine)
    assert [s.name for s in o.specs] == ["r2[:]", "prob"] and o.targets == {"r2[:]": 0.9, "prob": 0.999}
    o = objective_for("cosine-similarity", 0.99, ["r2", "r2", "r2[..., :]", "r2[:, 0:2, :, :]", "r2[0:1, :2]"],
                      engine)
    assert [(s.name, s.tensor) for s in o.specs] == [("r2", "r2"), ("r2[:, 0:2, :, :]", "r2")]
    r = suggest_remedy(str(qpath), data, target={"r2[:, 0:2]": 0.99, "r2[:, :2]": 0.9995, "prob": 0.99},
                       remedy="float", requantize_check=False)
    assert r.outputs == ["r2[:, 0:2]", "prob"] and r.targets == {"r2[:, 0:2]": 0.9995, "prob": 0.99}
    feeds = [{k: v[i] for k, v in data.items()} for i in range(N)]
    ref, out = builders.run_model(fpath, feeds), builders.run_model(qpath, feeds)
    before = {"r2[:, 0:2]": _cosine([a["r2"][:, :2] for a in ref], [b["r2"][:, :2] for b in out]),
              "prob": _cosine([a["prob"] for a in ref], [b["prob"] for b in out])}
    assert r.figures["calibration"]["outputs"]["before"] == pytest.approx(before, abs=1e-6)


def test_an_output_named_default_is_addressed_as_default_equals_default(tmp_path):
    """'default' is the outputs not named: a model's output of that name had no way to get a
    target of its own. It is 'default=default'; the bare key on such a model could mean
    either and is refused in one sentence; on the command line a value alone is the default."""
    from pytest_ptq.cli.remedy import _target, _targets
    from pytest_ptq import params
    from pytest_ptq.engine import engine_for
    from pytest_ptq.remedy.objective import objective_for

    data = builders.samples(N)
    model = onnx.load(builders.conv_net(tmp_path / "conv.onnx", two_outputs=True))
    for t in [n.output for n in model.graph.node] + [[o.name for o in model.graph.output]]:
        for k, name in enumerate(t):
            if name == "prob":
                t[k] = "default"
    model.graph.output[0].name = "default"
    fpath = tmp_path / "float.onnx"
    onnx.save(model, fpath)
    qpath = builders.quantize(fpath, tmp_path / "qdq.onnx", data)
    engine = engine_for(str(qpath), data)
    o = objective_for("cosine-similarity", {"default=default": 0.9999, "": 0.99}, None, engine)
    assert [(s.name, s.tensor) for s in o.specs] == [("default", "default"), ("r2", "r2")]
    assert o.targets == {"default": 0.9999, "r2": 0.99}
    # the model named by its file, not by the absolute path the engine was given
    with pytest.raises(PTQError, match=f"which {qpath.name!r} also has a tensor or node named: write "
                                       "'default=default' for its own and ''") as refused:
        objective_for("cosine-similarity", {"default": 0.99, "r2": 0.999}, None, engine)
    assert str(qpath.parent) not in str(refused.value)
    parse = _target(params.cosine, "--target-cosine")
    given = _targets([parse("0.99"), parse("default=default=0.9999")], "--target-cosine")
    assert objective_for("cosine-similarity", given, None, engine).targets == o.targets
    with pytest.raises(PTQError, match=r"^--target-cosine \(a value alone is the default ''\): the thresholds "
                                       r"\{'': 0.99, 'default': 0.9\} give the default twice \('default' and ''\)"):
        _targets([parse("0.99"), parse("default=0.9")], "--target-cosine")
    for twice, said in (("default=0.9", "'default' twice"), ("0.9", "two values alone")):
        with pytest.raises(PTQError, match=f"^--target-cosine gives {said}"):
            _targets([parse(twice), parse("r2=0.9"), parse(twice)], "--target-cosine")


def test_the_remedy_figure_names_nodes_as_wide_as_its_panel_allows(tmp_path, monkeypatch):
    """A fixed 24 characters read '~onv10_depthwise_weight~' in a panel that holds about 47;
    the names of the greedy additions and of a set chosen off the greedy path keep what tells
    them apart and stay inside the panel."""
    from pytest_ptq.remedy import plot
    from pytest_ptq.remedy.result import Remedy

    drawn = []
    monkeypatch.setattr(plot, "save_figure", lambda fig, path, tight=False: drawn.append(fig) or path)
    names = [f"/backbone/stage{s}/block3/conv1/Conv_output_0_QuantizeLinear" for s in (2, 4, 5)]
    curve = [{"nodes": k, "cost": k, "added": n, "kind": "float", "value": v}
             for k, (n, v) in enumerate([(None, 0.98), (names[0], 0.985), (names[1], 0.989), (names[2], 0.995)])]
    r = Remedy(remedy="float", metric="cosine-similarity", target=0.99, met=True, nodes=[names[2], names[0]],
               value=0.995, baseline=0.98, ceiling=None, curve=curve, pruned=[], ranking=[], settings={},
               model="m.onnx", samples=8)
    plot.plot_remedy(r, tmp_path / "r.png")
    fig = drawn[0]
    fig.canvas.draw()
    side = fig.axes[1]
    text = side.texts[-1]
    assert text.get_window_extent().x1 <= side.get_window_extent().x1 + 1, "the side text runs past the panel"
    lines = text.get_text().splitlines()
    chosen = lines[lines.index("chosen:") + 1:]
    added = [line.split()[1] for line in lines[1:lines.index("chosen:") - 1]]
    for s, name in zip((2, 4, 5), added):  # every addition's line names its stage, where the names differ
        assert f"stage{s}" in name and len(name) > 24, added
    shown = [line.split()[0] for line in chosen]
    assert [s for s in (5, 2) for name in shown if f"stage{s}" in name] == [5, 2] and min(map(len, shown)) > 24, lines

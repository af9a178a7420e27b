"""Group sensitivity and ranking confidence, against plain onnxruntime runs and numpy."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import builders
from pytest_ptq.cli import main
from pytest_ptq.engine import Engine, batching
from pytest_ptq.errors import PTQError
from pytest_ptq.confidence import ranking_confidence
from pytest_ptq.groups import Subgraph, group_sensitivity, subgraph_nodes
from pytest_ptq.model import QuantModel
from pytest_ptq.sensitivity import Sensitivity, get_sensitivity_of_nodes
from pytest_ptq.tables import fmt, listed

N = 8


def _only(path, keep):
    """The QDQ model with every Q/DQ pair outside ``keep`` (Q node names) removed by rewiring."""
    model = onnx.load(str(path))
    graph = model.graph
    replace, gone = {}, set()
    for q in graph.node:
        if q.op_type == "QuantizeLinear" and q.name not in keep:
            gone.add(q.name)
            for d in graph.node:
                if d.op_type == "DequantizeLinear" and d.input[0] == q.output[0]:
                    replace[d.output[0]] = q.input[0]
                    gone.add(d.name)
    kept = [n for n in graph.node if n.name not in gone]
    for n in kept:
        for k, i in enumerate(n.input):
            n.input[k] = replace.get(i, i)
    for o in graph.output:
        if o.name in replace:  # a graph output read through a removed pair keeps its name
            kept.append(onnx.helper.make_node("Identity", [replace[o.name]], [o.name]))
    del graph.node[:]
    graph.node.extend(kept)
    return model


def _per_sample_cosines(ref, got):
    out = []
    for r, t in zip(ref, got):
        r, t = r["prob"].ravel().astype(np.float64), t["prob"].ravel().astype(np.float64)
        out.append(float(r @ t / np.sqrt((r @ r) * (t @ t))))
    return out


def _pooled_cosine(ref, got):
    r = np.concatenate([o["prob"].ravel() for o in ref]).astype(np.float64)
    t = np.concatenate([o["prob"].ravel() for o in got]).astype(np.float64)
    return float(r @ t / np.sqrt((r @ r) * (t @ t)))


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    root = tmp_path_factory.mktemp("groups")
    data = builders.samples(N, seed=5)
    fpath = builders.conv_net(root / "float.onnx")
    qpath = builders.quantize(fpath, root / "qdq.onnx", data)
    feeds = [{"x": a} for a in data["x"]]
    return {"float": fpath, "qdq": qpath, "data": data, "feeds": feeds,
            "ref": builders.run_model(fpath, feeds), "engine": Engine(str(qpath), data)}


def test_subgraph_holds_the_pairs_between_two_tensors(net):
    qm = QuantModel(str(net["qdq"]))
    # r1 -> r2 is the residual block: conv2, add2, relu2 read r1's pair, w2, b2, c2's and a2's
    names = subgraph_nodes(qm, "r1", "r2")
    assert set(names) == {"r1_QuantizeLinear", "w2_QuantizeLinear", "b2_DequantizeLinear",
                          "c2_QuantizeLinear", "a2_QuantizeLinear"}
    assert set(subgraph_nodes(qm, "r1", "r2", weights=False)) == {"r1_QuantizeLinear", "c2_QuantizeLinear",
                                                                   "a2_QuantizeLinear"}
    # the model as every other function takes it: an Engine, a path
    assert subgraph_nodes(net["engine"], "r1", "r2") == subgraph_nodes(str(net["qdq"]), "r1", "r2") == names


def test_subgraph_errors_name_the_tensor(net):
    qm = QuantModel(str(net["qdq"]))
    with pytest.raises(PTQError, match="unknown tensor 'r3'.*'r1'|unknown tensor 'r3'.*'r2'"):
        subgraph_nodes(qm, "r3", "r2")
    with pytest.raises(PTQError, match="does not depend on"):
        subgraph_nodes(qm, "r2", "r1")
    with pytest.raises(PTQError, match=r"a subgraph's start must be one tensor name, got \['r1'\]"):
        subgraph_nodes(qm, ["r1"], "r2")


def test_group_value_equals_the_block_quantized_alone(net):
    blocks = {"block": Subgraph("r1", "r2"), "head": ["fc", "softmax"], "one": "conv1"}
    result = group_sensitivity(net["engine"], blocks)
    assert set(result) == {"block", "head", "one"}
    values = [v["cosine-similarity"] for v in result.values()]
    assert values == sorted(values)  # most sensitive (lowest cosine) first
    for label in result:
        keep = {n for n in result.details[label]["calibration_nodes"] if not n.endswith("DequantizeLinear")}
        got = builders.run_model(_only(net["qdq"], keep), net["feeds"])
        assert result[label]["cosine-similarity"] == pytest.approx(_pooled_cosine(net["ref"], got), abs=1e-6)
        assert result.details[label]["per_sample"]["cosine-similarity"] == pytest.approx(
            _per_sample_cosines(net["ref"], got), abs=1e-6)
    # a normal node stands for the pairs it reads, in input order, then a pair on a model output it writes
    assert result.details["head"]["calibration_nodes"] == ["f_QuantizeLinear", "wf_QuantizeLinear",
                                                           "logits_QuantizeLinear", "prob_QuantizeLinear"]
    assert result.node_type == "group" and "block" in result.table()


def test_group_labels_and_bad_groups(net):
    with pytest.raises(PTQError, match="empty"):
        group_sensitivity(net["engine"], [[]])
    with pytest.raises(PTQError, match="unknown node"):
        group_sensitivity(net["engine"], [["conv9"]])
    with pytest.raises(PTQError, match=r"unknown node 'conv1, conv2': node names are not joined by commas here; give "
                                       r"a list, \['conv1', 'conv2'\]"):
        group_sensitivity(net["engine"], ["conv1, conv2"])
    result = group_sensitivity(net["engine"], [["conv1", "conv2"], {"from": "r1", "to": "r2"}])
    assert set(result) == {"conv1+conv2", "r1->r2"}


def _sens(per_sample):
    """A Sensitivity whose per-sample cosines are given: {node: [value per sample]}."""
    s = Sensitivity(node_type="activation", metrics=["cosine-similarity"], samples=len(next(iter(per_sample.values()))))
    pooled = {n: float(np.mean(v)) for n, v in per_sample.items()}
    for n in sorted(pooled, key=pooled.get):
        dict.__setitem__(s, n, {"cosine-similarity": pooled[n]})
        s.details[n] = {"per_sample": {"cosine-similarity": list(per_sample[n])}}
    return s


def test_confidence_flags_a_top_k_that_depends_on_the_samples():
    # a is always worst; b and c trade places sample by sample with equal means; d is harmless
    s = _sens({"a": [0.5] * 10, "b": [0.90, 0.99] * 5, "c": [0.99, 0.90] * 5, "d": [0.9999] * 10})
    one = ranking_confidence(s, k=1, resamples=400)
    assert one.stable and one.top_k == ["a"] and one.top_k_set_frequency == 1.0
    two = ranking_confidence(s, k=2, resamples=400)
    assert not two.stable
    assert set(two.unstable_nodes) == {"b", "c"}
    # b beats c in a resample exactly when it drew more of its bad samples: about half the time
    assert 0.3 < two.nodes["b"]["top_k_frequency"] < 0.7
    assert two.nodes["b"]["top_k_frequency"] + two.nodes["c"]["top_k_frequency"] == pytest.approx(1.0)
    assert two.nodes["a"]["rank_low"] == two.nodes["a"]["rank_high"] == 1
    assert two.nodes["b"]["std"] == pytest.approx(np.std([0.90, 0.99] * 5))
    assert "do not trust" in two.message
    assert s.details["b"]["spread"] == pytest.approx(np.std([0.90, 0.99] * 5))


def test_confidence_on_a_real_ranking_uses_the_per_sample_values(net):
    s = get_sensitivity_of_nodes(net["engine"], ["cosine-similarity"], node_type="activation")
    conf = ranking_confidence(s, k=3, resamples=200)
    worst = next(iter(s))
    got = builders.run_model(_only(net["qdq"], {worst}), net["feeds"])
    values = _per_sample_cosines(net["ref"], got)
    assert conf.nodes[worst]["std"] == pytest.approx(np.std(values), abs=1e-6)
    assert conf.nodes[worst]["mean"] == pytest.approx(np.mean(values), abs=1e-6)
    assert conf.samples == N and len(conf.nodes) == len(s)
    assert isinstance(json.loads(json.dumps(conf.to_dict()))["stable"], bool)


def test_confidence_with_one_sample_says_nothing_can_be_judged():
    conf = ranking_confidence(_sens({"a": [0.5], "b": [0.9]}), k=1)
    assert conf.stable is None and not conf
    assert "only 1 sample" in conf.message
    assert conf.nodes["a"]["top_k_frequency"] is None


def test_confidence_needs_per_sample_values():
    s = Sensitivity(metrics=["cosine-similarity"])
    dict.__setitem__(s, "a", {"cosine-similarity": 0.9})
    with pytest.raises(PTQError, match="per-sample"):
        ranking_confidence(s)


def test_confidence_in_chunks_is_the_same_and_a_resample_count_that_fills_the_memory_is_refused():
    s = _sens({"a": [0.5] * 10, "b": [0.90, 0.99] * 5, "c": [0.99, 0.90] * 5, "d": [0.9999] * 10})
    # 1000 resamples run in chunks of 256: the same draws, so the frequencies of one array
    freq = ranking_confidence(s, k=2, resamples=1000).nodes["b"]["top_k_frequency"]
    rng = np.random.default_rng(0)
    picks = rng.integers(0, 10, size=(1000, 10))
    b, c = np.asarray([0.90, 0.99] * 5)[picks].mean(axis=1), np.asarray([0.99, 0.90] * 5)[picks].mean(axis=1)
    assert freq == np.mean(b <= c)  # a tie goes to b, listed first
    with pytest.raises(PTQError, match="resamples must be at most 20000"):
        ranking_confidence(s, resamples=10**9)


def test_a_ranking_from_anything_but_to_dict_is_one_sentence_and_a_table_limit_a_count():
    with pytest.raises(PTQError, match="not a saved sensitivity ranking .*Sensitivity.to_dict"):
        Sensitivity.from_dict({})
    with pytest.raises(PTQError, match="not a saved sensitivity ranking"):
        Sensitivity.from_dict(None)
    s = _sens({"a": [0.5, 0.6], "b": [0.9, 0.8]})
    assert Sensitivity.from_dict(s.to_dict()) == s
    for bad in (-1, "two", 1.5, "1"):  # a number as text is a mistake in Python, as in a contract
        with pytest.raises(PTQError, match="limit must be"):
            s.table(bad)
    assert "... 1 more" in s.table(1)


# -- command line -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folder(net, tmp_path_factory):
    return str(builders.save_folder(net["data"], tmp_path_factory.mktemp("groups_cli")))


def _tables(text):
    """Every printed table as a list of row dicts, in print order."""
    tables, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("| "):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif block and not line.startswith("+"):
            tables.append([dict(zip(block[0], r)) for r in block[1:]])
            block = []
    return tables


def test_cli_group_sensitivity_prints_the_api_values(net, folder, tmp_path, capsys):
    out = tmp_path / "groups.json"
    rc = main(["group-sensitivity", str(net["qdq"]), folder, "-g", "conv1,conv2", "fc", "--from", "r1", "--to", "r2",
               "-m", "cosine-similarity", "mse", "--json", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    api = group_sensitivity(Engine(str(net["qdq"]), folder), [["conv1", "conv2"], ["fc"], Subgraph("r1", "r2")],
                            metrics=["cosine-similarity", "mse"])
    [table] = _tables(captured.out)
    assert [r["group"] for r in table] == list(api) and set(api) == {"conv1+conv2", "fc", "r1->r2"}
    for row in table:
        label = row["group"]
        assert row["cosine-similarity"] == fmt(api[label]["cosine-similarity"])
        assert row["mse"] == fmt(api[label]["mse"])
        # the first three named (a transformer block holds dozens), every one in the JSON
        assert row["calibration nodes"] == listed(api.details[label]["calibration_nodes"])
    saved = json.loads(out.read_text())
    assert saved["ranking"] == list(api) and saved["values"] == {k: dict(v) for k, v in api.items()}
    # and the block's value is the model with only that block's pairs kept, in plain onnxruntime
    keep = {n for n in api.details["fc"]["calibration_nodes"] if not n.endswith("DequantizeLinear")}
    got = builders.run_model(_only(net["qdq"], keep), net["feeds"])
    assert saved["values"]["fc"]["cosine-similarity"] == pytest.approx(_pooled_cosine(net["ref"], got), abs=1e-6)


def test_cli_subgraph_without_weights(net, folder, capsys):
    assert main(["group-sensitivity", str(net["qdq"]), folder, "--from", "r1", "--to", "r2", "--no-weights",
                 "--quiet"]) == 0
    [table] = _tables(capsys.readouterr().out)
    assert table[0]["calibration nodes"] == listed(subgraph_nodes(QuantModel(str(net["qdq"])), "r1", "r2",
                                                                   weights=False))


def test_cli_confidence_prints_the_spread_and_the_verdict(net, folder, tmp_path, capsys, monkeypatch):
    # samples one at a time in both runs: a stacked run rounds differently, which may swap
    # two nodes whose values tie to 1e-7 (stacking is checked in test_batching.py)
    monkeypatch.setattr(batching, "MIN_GAIN", float("inf"))
    out = tmp_path / "sens.json"
    rc = main(["get-sensitivity-of-nodes", str(net["qdq"]), folder, "-t", "activation", "--confidence", "3",
               "--json", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    sens = get_sensitivity_of_nodes(Engine(str(net["qdq"]), folder), node_type="activation")
    conf = ranking_confidence(sens, k=3)
    ranking, spread = _tables(captured.out)
    assert [r["node"] for r in ranking] == list(sens)
    assert [r["node"] for r in spread] == list(conf.nodes)
    for row in spread:
        v = conf.nodes[row["node"]]
        assert row["spread (std)"] == fmt(v["std"]) and row["rank"] == str(v["rank"])
        assert row["in top 3"] == f"{v['top_k_frequency']:.0%}"
        assert row["rank 5-95%"] == f"{v['rank_low']:g}-{v['rank_high']:g}"
    assert conf.message in captured.out
    # the spread is numpy's std of the node's per-sample cosines, computed here from plain runs
    worst = next(iter(sens))
    got = builders.run_model(_only(net["qdq"], {worst}), net["feeds"])
    assert conf.nodes[worst]["std"] == pytest.approx(np.std(_per_sample_cosines(net["ref"], got)), abs=1e-6)
    saved = json.loads(out.read_text())
    assert saved["details"][worst]["spread"] == pytest.approx(conf.nodes[worst]["std"])


def test_cli_confidence_with_one_sample_says_it_cannot_judge(net, folder, capsys):
    assert main(["get-sensitivity-of-nodes", str(net["qdq"]), folder, "-t", "activation", "--data-num", "1",
                 "--confidence", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "only 1 sample(s): the ranking's stability cannot be judged" in out
    assert "rank 5-95%" not in out


@pytest.mark.parametrize("command", ["group-sensitivity", "get-sensitivity-of-nodes"])
def test_cli_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "-h"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--confidence [K]" in text
    if command == "group-sensitivity":
        assert "--from TENSOR" in text and "--to TENSOR" in text and "-g NODE[,NODE...]" in text


@pytest.mark.parametrize("args, message", [
    (["--from", "r1"], "--from and --to come in pairs, got 1 --from and 0 --to"),
    ([], "no group given"),
    (["-g", "conv1,"], "group 'conv1,' has an empty node name"),
    (["-g", "conv9"], "unknown node 'conv9'; did you mean"),
    (["--from", "r3", "--to", "r2"], "unknown tensor 'r3'"),
    (["--from", "r2", "--to", "r1"], "does not depend on tensor 'r2'"),
    (["-g", "conv1", "conv1"], "group 'conv1' is given twice; give each group once"),
    (["-g", "conv1", "--no-weights"], "--no-weights leaves the weights out of --from/--to blocks; give a block"),
])
def test_cli_bad_groups_exit_2_in_one_line(net, folder, args, message, capsys):
    assert main(["group-sensitivity", str(net["qdq"]), folder, "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ptq-debug group-sensitivity: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_confidence_needs_a_positive_k(net, folder, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["get-sensitivity-of-nodes", str(net["qdq"]), folder, "--confidence", "0"])
    assert exc.value.code == 2
    assert "--confidence: must be at least 1, got 0" in capsys.readouterr().err


def test_a_table_of_wide_characters_lines_up_on_a_terminal():
    import unicodedata

    from pytest_ptq.tables import format_table

    text = format_table([{"node": "卷积_1", "cosine": 0.5}, {"node": "conv_22", "cosine": 0.25}], ["node", "cosine"])
    # each line as wide in terminal columns (a CJK character takes two) and its bars aligned
    widths = {sum(1 + (unicodedata.east_asian_width(c) in "WF") for c in line) for line in text.splitlines()}
    assert len(widths) == 1
    bars = {tuple(i for i, c in enumerate(line.replace("卷", "卷 ").replace("积", "积 ")) if c in "|+")
            for line in text.splitlines()}
    assert len(bars) == 1


def test_a_table_keeps_one_line_per_row_and_runs_no_escape_sequence_of_a_name():
    import unicodedata

    from pytest_ptq.tables import format_table

    names = ["line1\nline2", "\x1b[31mred\x1b[0m\x07", "tab\there", "cafe\u0301"]
    text = format_table([{"node": n, "cosine": 0.5} for n in names], ["node", "cosine"])
    lines = text.splitlines()
    assert len(lines) == 4 + len(names)  # three rules, the header, one line a row
    assert not any(unicodedata.category(c) == "Cc" for c in text.replace("\n", ""))
    assert "line1\\nline2" in text and "\\x1b[31mred" in text
    # a combining accent takes no column: every line as wide as the rules
    assert len({sum(not unicodedata.combining(c) for c in line) for line in lines}) == 1


def test_a_block_holds_a_shared_weight_quantized_as_an_activation_that_it_reads(tmp_path):
    """An exporter shares a weight through an Identity; onnxruntime quantizes the Identity's
    output as an activation behind the weight's own pair: a block reading it missed it (a
    transformer block lost its LayerNorm scale)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(7)
    graph = helper.make_graph([
        helper.make_node("Mul", ["x", "w"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Identity", ["w"], ["g"], name="share"),
        helper.make_node("Mul", ["r", "g"], ["m"], name="second"),
        helper.make_node("Relu", ["m"], ["y"], name="out")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.uniform(0.5, 2, 16).astype(np.float32), "w")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [rng.standard_normal((1, 8, 16)).astype(np.float32) for _ in range(2)]}
    qm = QuantModel(str(builders.quantize(fp, tmp_path / "q.onnx", data)))
    [shared] = [c.name for c in qm.calibration.values() if c.input == "g"]
    assert qm.calibration[shared].is_activation  # behind the weight's own pair, read by the Identity
    assert shared in subgraph_nodes(qm, "r", "m")
    assert shared not in subgraph_nodes(qm, "r", "m", weights=False)


def test_a_list_in_a_table_cell_shows_its_first_names_and_how_many_more():
    # an input feeding 60 nodes made every row of the activation table 2400 characters wide
    from pytest_ptq.tables import format_table

    feeds = [f"conv{k}" for k in range(60)]
    text = format_table([{"node": "x_QuantizeLinear", "feeds": feeds}], ["node", "feeds"])
    assert "conv0,conv1,conv2 +57 more" in text and "conv3" not in text
    assert format_table([{"feeds": feeds[:3]}], ["feeds"]).splitlines()[3] == "| conv0,conv1,conv2 |"
    assert "1,3,224,224" in format_table([{"shape": [1, 3, 224, 224]}], ["shape"])  # a shape stays whole


def test_a_stable_top_on_few_samples_says_how_little_that_proves():
    """Ranked on 8 samples, the top 1 read "stable" in 90-100% of resamples, and disjoint sets
    of 8 then disagreed on it: resampling few samples cannot see how other samples rank. On
    20 the claim stands alone."""
    few = ranking_confidence(_sens({"a": [0.5] * 8, "b": [0.9] * 8}), k=1, resamples=200)
    assert few.stable and "understates how much other samples move it: rank on 20 or more" in few.message
    enough = ranking_confidence(_sens({"a": [0.5] * 20, "b": [0.9] * 20}), k=1, resamples=200)
    assert enough.stable and enough.message.endswith("of the 20 samples: stable")


def test_the_confidence_names_where_its_top_differs_from_the_ranking_shown():
    """The bootstrap ranks by the mean over samples, the ranking shown pools them: where their
    top sets differ, the message named a set the table did not show, without a word."""
    s = _sens({"b": [0.9] * 20, "a": [0.5] * 20})
    dict.clear(s)
    for name, value in (("b", 0.6), ("a", 0.95)):  # pooled: b first; by the mean: a first
        dict.__setitem__(s, name, {"cosine-similarity": value})
    conf = ranking_confidence(s, k=1, resamples=200)
    assert conf.top_k == ["a"] and conf.pooled_top_k == ["b"]
    assert "the ranking shown pools them, and its top 1 differs: b" in conf.message


def test_confidence_of_an_error_ranking_puts_the_largest_error_first(net):
    """mse is lower-is-better: its most sensitive node has the largest error, and leads both
    the Sensitivity (errors descending) and the confidence's mean ranking."""
    s = get_sensitivity_of_nodes(net["engine"], ["mse"], node_type="activation")
    conf = ranking_confidence(s, k=1, resamples=200)
    head = next(iter(s))
    assert conf.top_k == list(s)[:1] == [head]
    # ranks from numpy: the node of the largest mean per-sample mse is rank 1, and so on
    means = {n: np.mean(s.details[n]["per_sample"]["mse"]) for n in s}
    expected = sorted(means, key=lambda n: -means[n])
    assert expected[0] == head
    assert [n for n in sorted(conf.nodes, key=lambda n: conf.nodes[n]["rank"])] == expected
    assert conf.nodes[head]["rank"] == 1
    # the head's per-sample errors are those of the model with only its pair quantized
    got = builders.run_model(_only(net["qdq"], {head}), net["feeds"])
    errs = [float(np.mean((r["prob"].astype(np.float64) - t["prob"]) ** 2)) for r, t in zip(net["ref"], got)]
    assert conf.nodes[head]["mean"] == pytest.approx(np.mean(errs), rel=5e-3)  # float32 runs


def test_confidence_figures_match_a_bootstrap_computed_here():
    """Every figure of the bootstrap, recomputed with numpy from the same draws: ranks by
    counting the nodes whose resampled mean is lower, the top-k frequencies, their 5-95%
    interval, the share of resamples with the same top set, and stability at exactly that
    share; k past the number of nodes is the number of nodes; a NaN sample ranks a node first."""
    rng = np.random.default_rng(5)
    n, resamples, k = 12, 300, 2
    per_sample = {name: list(0.9 + 0.05 * rng.random(n) + shift) for name, shift in
                  (("a", 0.0), ("b", 0.01), ("c", 0.02), ("d", 0.04))}
    names = list(per_sample)
    values = np.array([per_sample[x] for x in names])
    picks = np.random.default_rng(0).integers(0, n, size=(resamples, n))
    boot = values[:, picks].mean(axis=2)  # [nodes, resamples]
    ranks = 1 + (boot[None, :, :] < boot[:, None, :]).sum(axis=1)
    top = set(np.argsort(values.mean(axis=1))[:k].tolist())
    in_top = ranks <= k
    share = float(np.mean([set(np.flatnonzero(in_top[:, r]).tolist()) == top for r in range(resamples)]))
    assert 0.2 < share < 0.95  # b and c trade places: the figures below are not all 0 or 1
    conf = ranking_confidence(_sens(per_sample), k=k, resamples=resamples, stable_at=share)
    assert conf.top_k_set_frequency == pytest.approx(share) and conf.stable is True
    assert ranking_confidence(_sens(per_sample), k=k, resamples=resamples, stable_at=share + 1e-9).stable is False
    freq = in_top.mean(axis=1)
    for i, x in enumerate(names):
        got = conf.nodes[x]
        assert got["top_k_frequency"] == pytest.approx(freq[i])
        assert got["rank_low"] == pytest.approx(np.percentile(ranks[i], 5))
        assert got["rank_high"] == pytest.approx(np.percentile(ranks[i], 95))
        assert got["std"] == pytest.approx(np.std(values[i]))
        assert got["rank"] == 1 + int((values.mean(axis=1) < values[i].mean()).sum())
    assert conf.unstable_nodes == [x for x in sorted(names, key=lambda x: conf.nodes[x]["rank"])
                                   if 1 - share < freq[names.index(x)] < share]
    assert ranking_confidence(_sens(per_sample), k=10, resamples=20).k == len(names)
    per_sample["e"] = [float("nan")] + [0.99] * (n - 1)
    assert ranking_confidence(_sens(per_sample), k=1, resamples=20).top_k == ["e"]

"""Interacting nodes and mixed remedies, checked with plain onnxruntime sessions.

Interaction (builders.cancel_net): two large convs a, b = 0.99 a whose difference feeds the
output; quantized alike, their errors cancel. The real loss is a third pair, v, planted
16 times too coarse. Alone, a, b and their weights are the most sensitive nodes, so the
greedy order remedies them first, and every one of them then needs its partner: no single
member can be pruned. Only dropping a pair at a time reaches the one node that matters.

Mixed (builders.conv_net with an outlier channel in conv1's weight and r1's activation
scale 64 times too coarse): per channel fixes the weight, 16 bit the activation; with the
default costs (per-channel 1, int16 2, float 4) the cheapest set is one of each.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import builders
from pytest_ptq.cli import main
from pytest_ptq.remedy import suggest_remedy

N = 12
TARGET = 0.999
PAIRS = ["wa_QuantizeLinear", "wb_QuantizeLinear", "a_QuantizeLinear", "b_QuantizeLinear"]


@pytest.fixture(scope="module")
def cancel(tmp_path_factory):
    root = tmp_path_factory.mktemp("cancel")
    data = builders.samples(N, size=8)
    fpath = builders.cancel_net(root / "float.onnx")
    qpath = builders.quantize(fpath, root / "qdq.onnx", data)
    return {"qdq": builders.scaled(qpath, root / "planted.onnx", "v_scale", 16), "data": data}


def rewired_cosine(qdq, remedied, data):
    pairs = set(builders.qdq_pairs(qdq))
    fs = [{"x": a} for a in data["x"]]
    ref = builders.run_model(builders.rewire(qdq), fs)
    return builders.worst_cosine(ref, builders.run_model(builders.rewire(qdq, keep=pairs - set(remedied)), fs))


def test_greedy_order_fails_where_refinement_succeeds(cancel):
    qdq, data = str(cancel["qdq"]), cancel["data"]
    # the interaction, independently: one of a cancelling pair remedied alone is worse than nothing
    nothing = rewired_cosine(qdq, [], data)
    assert nothing < TARGET <= rewired_cosine(qdq, ["v_QuantizeLinear"], data)
    for node in PAIRS:
        assert rewired_cosine(qdq, [node], data) < nothing - 0.01

    greedy = suggest_remedy(qdq, data, target=TARGET, search="greedy")
    assert greedy.met and set(greedy.nodes) == set(PAIRS) | {"v_QuantizeLinear"}
    assert greedy.curve[1]["value"] < greedy.curve[0]["value"] - 0.01  # the first addition hurts
    assert greedy.pruned == []  # every member needs its partner

    r = suggest_remedy(qdq, data, target=TARGET)
    assert r.met and r.nodes == ["v_QuantizeLinear"] and r.cost == 1
    assert [m["move"] for m in r.refinements] == ["drop pair", "drop pair"]
    assert {frozenset(m["removed"]) for m in r.refinements} == {
        frozenset(PAIRS[:2]), frozenset(PAIRS[2:])}
    assert r.curve == greedy.curve  # the same greedy path, then refined
    assert r.value == pytest.approx(rewired_cosine(qdq, r.nodes, data), abs=1e-6)
    assert r.baseline == pytest.approx(nothing, abs=1e-6)
    assert greedy.value == pytest.approx(rewired_cosine(qdq, greedy.nodes, data), abs=1e-6)


def test_a_budget_stop_in_refinement_keeps_the_best_set_so_far(cancel, monkeypatch):
    from pytest_ptq.remedy import scoring, strategy

    def out_of_time(self, cur):
        raise scoring.OutOfTime

    monkeypatch.setattr(strategy.Search, "_pairs", out_of_time)  # time runs out at the first pair move
    r = suggest_remedy(str(cancel["qdq"]), cancel["data"], target=TARGET, budget=3600)
    assert r.budget_exhausted and r.met and len(r.nodes) == 5
    assert r.value == pytest.approx(rewired_cosine(str(cancel["qdq"]), r.nodes, cancel["data"]), abs=1e-6)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    data = builders.samples(N)
    fpath = builders.conv_net(root / "float.onnx", outlier_channel=3)
    qpath = builders.quantize(fpath, root / "qdq.onnx", data)
    return {"float": fpath, "qdq": builders.scaled(qpath, root / "planted.onnx", "r1_scale", 64), "data": data,
            "root": root}


OUTPUTS = ["c1[:, 0:3]", "r2"]  # conv1's starved channels, and what the coarse r1 feeds


def remedied_by_hand(m, per_channel=(), uint16=()):
    """The planted QDQ model with weights' pairs rewritten per channel (symmetric int8 over
    each output channel's range) and activations' pairs as uint16 over the same range."""
    model = onnx.load(str(m["qdq"]))
    fweights = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(m["float"])).graph.initializer}
    inits = {i.name: i for i in model.graph.initializer}
    for name in per_channel:
        old = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == name).input[1]
        w = fweights[name]
        scale = (np.abs(w.reshape(w.shape[0], -1)).max(axis=1) / 127).astype(np.float32)
        model.graph.initializer.extend([numpy_helper.from_array(scale, f"{name}_pc_scale"),
                                        numpy_helper.from_array(np.zeros(w.shape[0], np.int8), f"{name}_pc_zp")])
        for n in model.graph.node:
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] == old:
                n.input[1], n.input[2] = f"{name}_pc_scale", f"{name}_pc_zp"
                n.attribute.append(helper.make_attribute("axis", 0))
    for name in uint16:
        s8 = float(numpy_helper.to_array(inits[f"{name}_scale"]))
        assert int(numpy_helper.to_array(inits[f"{name}_zero_point"])) == 0
        model.graph.initializer.extend([
            numpy_helper.from_array(np.array(s8 * 255 / 65535, np.float32), f"{name}_s16"),
            numpy_helper.from_array(np.array(0, np.uint16), f"{name}_z16")])
        for n in model.graph.node:
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] == f"{name}_scale":
                n.input[1], n.input[2] = f"{name}_s16", f"{name}_z16"
                n.domain = "com.microsoft"  # uint16 Q/DQ below opset 21
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def sliced_cosine(m, model):
    fs = [{"x": a} for a in m["data"]["x"]]
    ref = builders.run_model(builders.rewire(m["qdq"], float_model=m["float"], outputs=["c1", "r2"]), fs,
                             outputs=["c1", "r2"])
    got = builders.run_model(builders.rewire(model, keep=set(builders.qdq_pairs(model)), outputs=["c1", "r2"]), fs,
                             outputs=["c1", "r2"])
    return min(builders.pooled_cosine([o["c1"][:, 0:3] for o in ref], [o["c1"][:, 0:3] for o in got]),
               builders.pooled_cosine([o["r2"] for o in ref], [o["r2"] for o in got]))


def test_mixed_chooses_a_kind_per_node_at_the_stated_cost(mixed, tmp_path):
    r = suggest_remedy(str(mixed["qdq"]), mixed["data"], target=TARGET, remedy="mixed", output_node=OUTPUTS,
                       float_model=str(mixed["float"]), requantize_check=False, save_dir=tmp_path)
    assert r.met and r.choices == {"w1_QuantizeLinear": "per-channel", "r1_QuantizeLinear": "int16"}
    assert r.cost == 3 and r.costs == {"per-channel": 1, "int16": 2, "float": 4}
    assert r.settings["TensorQuantOverrides"] == {"w1": [{"axis": 0}], "r1": [{"quant_type": "QUInt16"}]}
    assert r.settings["nodes_to_exclude"] == []
    # independently: the two pairs rewritten by hand, run plainly
    by_hand = remedied_by_hand(mixed, per_channel=["w1"], uint16=["r1"])
    assert r.value == pytest.approx(sliced_cosine(mixed, by_hand), abs=1e-5)
    assert r.baseline < TARGET <= sliced_cosine(mixed, by_hand)
    # either alone falls short: the set is the smallest of its kinds
    for alone in (remedied_by_hand(mixed, per_channel=["w1"]), remedied_by_hand(mixed, uint16=["r1"])):
        assert sliced_cosine(mixed, alone) < TARGET
    assert "w1_QuantizeLinear (per-channel)" in r.summary() and "cost 3" in r.summary()
    assert (tmp_path / "remedy_mixed.png").stat().st_size > 10_000


@pytest.mark.parametrize("costs, expected", [
    ("nodes", {"w1_QuantizeLinear": "float", "r1_QuantizeLinear": "float"}),
    ({"int16": 1, "float": 3}, {"w1_QuantizeLinear": "int16", "r1_QuantizeLinear": "int16"}),
])
def test_the_cost_model_decides_the_kinds(mixed, costs, expected):
    r = suggest_remedy(str(mixed["qdq"]), mixed["data"], target=TARGET, remedy="mixed", output_node=OUTPUTS,
                       costs=costs, requantize_check=False)
    assert r.met and r.choices == expected and r.cost == 2


def test_cli_mixed_with_costs(mixed, capsys):
    folder = builders.save_folder(mixed["data"], mixed["root"] / "calib")
    rc = main(["suggest", str(mixed["qdq"]), str(folder), "--target-cosine", str(TARGET), "--remedy", "mixed",
               "--cost", "int16=1", "float=3", "-o", *OUTPUTS, "--no-save", "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0 and "r1_QuantizeLinear (int16)" in text and "cost 2 (float 3, int16 1 per node)" in text
    with pytest.raises(SystemExit) as exc:  # argparse rejects a bad cost at start-up
        main(["suggest", str(mixed["qdq"]), str(folder), "--remedy", "mixed", "--cost", "int8=1", "--no-save"])
    assert exc.value.code == 2 and "expected KIND=COST" in capsys.readouterr().err


@pytest.mark.parametrize("cost", [float("inf"), True, 0, "x"])
def test_a_cost_the_command_line_refuses_the_api_refuses_too(cost):
    """An infinite cost or True was taken by ``suggest_remedy(costs=...)`` (as inf and 1.0),
    where ``--cost float=inf`` was refused."""
    from pytest_ptq.errors import PTQError
    from pytest_ptq.remedy.search import costs_for

    with pytest.raises(PTQError, match="the cost of 'float' must be"):
        costs_for("mixed", {"float": cost, "int16": 1})


def test_the_ranking_before_the_search_shows_its_own_progress(mixed, capsys, monkeypatch):
    # every clock reading a second later, so that the bars (silent under two seconds) print
    from pytest_ptq import progress
    now = [0.0]

    def tick():
        now[0] += 1.0
        return now[0]
    monkeypatch.setattr(progress.time, "perf_counter", tick)
    r = suggest_remedy(str(mixed["qdq"]), mixed["data"], target=TARGET, remedy="mixed", output_node=OUTPUTS,
                       requantize_check=False, progress=True)
    lines = capsys.readouterr().err.splitlines()
    ranking = [x for x in lines if x.startswith("ranking ")]
    search = [k for k, x in enumerate(lines) if x.startswith("remedy search (mixed)")]
    # each candidate alone at int8 and on each alternative its menu has, on each search sample
    searched = len(r.split["search"]) if r.split else r.samples
    runs = sum(1 + sum(kind != "float" for kind in menu) for menu in _menus(mixed)) * searched
    assert any("left" in x for x in ranking)
    assert ranking[-1] == f"ranking {len(_menus(mixed))} nodes, each kind alone: {runs}/{runs} done, " + \
        ranking[-1].split("done, ")[1]
    assert lines.index(ranking[-1]) < search[0], lines


def _menus(m):
    from pytest_ptq.engine import engine_for
    from pytest_ptq.remedy.alternatives import menus_for
    return list(menus_for(engine_for(str(m["qdq"]), m["data"]), ["per-channel", "int16", "float"])[0].values())


def test_when_every_cheapest_remedy_together_falls_short_the_greedy_walks_the_strongest(mixed, tmp_path):
    # r1 4096 times too coarse: 16 bit (256 times finer) recovers most of it, so its cheap
    # move comes first, but only float meets the target; walking the cheap moves would add
    # every node and meet nothing, leaving refinement to drop members one round at a time
    planted = builders.scaled(mixed["qdq"], tmp_path / "coarse.onnx", "r1_scale", 64)  # 64 x 64
    r = suggest_remedy(str(planted), mixed["data"], target=TARGET, remedy="mixed", output_node=OUTPUTS,
                       costs={"int16": 1, "float": 20}, requantize_check=False)
    assert r.met and r.choices == {"r1_QuantizeLinear": "float", "w1_QuantizeLinear": "int16"} and r.cost == 21
    assert any(n.startswith("every candidate on its cheapest remedy reaches only 0.99") for n in r.notes)
    walked = [p for p in r.curve if p["added"]]
    assert walked[0] == {**walked[0], "added": "r1_QuantizeLinear", "kind": "float"}
    # the strongest walk met within a few nodes, then kinds got cheaper: far fewer runs than
    # a walk over all 13 candidates and a refinement from all of them in float (129 before)
    assert len(walked) < 5 and r.evaluations < 60


def test_the_overruled_search_set_says_what_pruning_dropped_from_the_curve():
    """The search curve ends where the search samples first met the target (2 nodes); pruning
    then kept 1, and the warning that held-out data overruled "the set chosen on the search
    samples (1 node)" read as contradicting the curve printed above it."""
    from types import SimpleNamespace

    from pytest_ptq.metrics import get_metrics
    from pytest_ptq.remedy.search import _warn_chosen

    def side(values, target):
        return SimpleNamespace(final=lambda s: values[s], meets=lambda v: v >= target, target=target, memo=values)

    a, b = ("a", "per-channel"), ("b", "per-channel")
    first, final = frozenset({b}), frozenset({a, b, ("c", "int16")})
    S = side({frozenset(): 0.986, first: 0.9901}, 0.99)
    J = side({frozenset(): 0.970, first: 0.9705, final: 0.9915}, 0.99)
    curve = [{"nodes": 0, "value": 0.986}, {"nodes": 1, "value": 0.987}, {"nodes": 2, "value": 0.9902}]
    result = SimpleNamespace(remedy="per-channel", judged_on="held-out", met=True, curve=curve, warnings=[],
                             notes=[], objective_metric=get_metrics("cosine-similarity")[0], objective={})
    _warn_chosen(result, SimpleNamespace(chosen=first, S=S, J=J), final)
    (told,) = result.warnings
    assert told.startswith("the set chosen on the search samples (1 node(s) quantized per channel: the search curve's first 2, "
                           "which pruning and refining on those samples made 1): 0.9901 on calibration, 0.9705 on "
                           "held-out: the gain does not hold"), told


def _mixed_moves(m, metric, outputs, costs):
    """``mixed_moves`` on the planted model, each kind's engine built as the search builds it."""
    from pytest_ptq.engine import Engine
    from pytest_ptq.metrics import get_metrics
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.remedy.alternatives import alternatives_for, menus_for
    from pytest_ptq.remedy.ranking import mixed_moves
    from pytest_ptq.remedy.clock import Clock

    engine = Engine(str(m["qdq"]), m["data"])
    menus, _ = menus_for(engine, list(costs))
    indices = list(range(N))
    engines = {}
    for kind in costs:
        if kind != "float":
            alts, _ = alternatives_for(engine, kind, [n for n, ks in menus.items() if kind in ks], indices)
            menus = {n: [k for k in ks if k != kind or n in alts] for n, ks in menus.items()}
            engines[kind] = engine.with_alternatives(alts)
    specs = parse_outputs(outputs, engine)
    return menus, mixed_moves(engine, engines, menus, costs, get_metrics(metric)[0], specs, indices, Clock(None))


def _w1_alone(m, metric):
    """conv1's starved channels with only w1's pair quantized, against float, in plain sessions."""
    fs = [{"x": a} for a in m["data"]["x"]]
    ref = builders.run_model(builders.rewire(m["qdq"], outputs=["c1"]), fs, outputs=["c1"])
    got = builders.run_model(builders.rewire(m["qdq"], keep={"w1_QuantizeLinear"}, outputs=["c1"]), fs,
                             outputs=["c1"])
    r = np.concatenate([o["c1"][:, 0:3].ravel() for o in ref]).astype(np.float64)
    t = np.concatenate([o["c1"][:, 0:3].ravel() for o in got]).astype(np.float64)
    if metric == "sqnr":
        return 10 * np.log10((r @ r) / ((t - r) @ (t - r)))
    return r @ t / np.sqrt((r @ r) * (t @ t))


COSTS = {"per-channel": 1.0, "int16": 2.0, "float": 4.0}


def test_mixed_moves_rank_kinds_by_what_each_recovers_per_cost(mixed):
    """Judged on conv1's starved channels: float recovers w1's whole loss (1 - its cosine
    alone, from a plain session), per channel nearly as much at a quarter of the cost, so that
    move leads; nodes past conv1 change nothing, and with every kind recovering nothing the
    cheaper alternative is theirs."""
    menus, (moves, kinds, gains) = _mixed_moves(mixed, "cosine-similarity", ["c1[:, 0:3]"], COSTS)
    w1 = "w1_QuantizeLinear"
    assert gains[(w1, "float")] == pytest.approx(1 - _w1_alone(mixed, "cosine"), abs=1e-6)
    assert kinds[w1] == "per-channel" and moves[0] == (w1, "per-channel")
    assert 0.9 * gains[(w1, "float")] < gains[(w1, "per-channel")] <= gains[(w1, "float")]
    # best gain per cost first, each node's float move and its one alternative
    ratios = [gains[mv] / COSTS[mv[1]] for mv in moves]
    assert ratios == sorted(ratios, reverse=True)
    assert set(moves) == {(n, "float") for n in menus if "float" in menus[n]} | set(kinds.items())
    downstream = ["w2_QuantizeLinear", "wf_QuantizeLinear"]
    for n in downstream:
        assert {"per-channel", "int16"} <= set(menus[n]) and gains[(n, "float")] == 0
        assert kinds[n] == "per-channel" and gains[(n, "per-channel")] == 0  # a tie goes to the cheaper kind
    # equal gains per cost: the cheaper move first
    tied = [mv for mv in moves if gains[mv] == 0]
    assert [COSTS[k] for _, k in tied] == sorted(COSTS[k] for _, k in tied)


def test_mixed_moves_in_sqnr_cap_the_float_gain_at_the_best_sqnr_seen(mixed):
    """An error-free output has an infinite SQNR: a node kept in float is worth the best finite
    SQNR any single run reached, no less than any alternative recovers for it. Nodes past
    conv1 change nothing judged (an infinite SQNR alone): they recover nothing, where their
    gains were NaN and left the moves unordered."""
    menus, (moves, kinds, gains) = _mixed_moves(mixed, "sqnr", ["c1[:, 0:3]"], COSTS)
    w1 = "w1_QuantizeLinear"
    assert all(np.isfinite(g) for g in gains.values()), gains
    for n, kind in kinds.items():
        assert gains[(n, "float")] >= gains[(n, kind)] - 1e-9, (n, kind)
    for n in ("w2_QuantizeLinear", "wf_QuantizeLinear"):
        assert gains[(n, "float")] == 0 and gains[(n, kinds[n])] == 0
    ratios = [gains[mv] / COSTS[mv[1]] for mv in moves]
    assert ratios == sorted(ratios, reverse=True) and moves[0][0] == w1
    # the cap, from w1's SQNR alone in a plain session, lies above every finite SQNR reached
    cap = gains[(w1, "float")] + _w1_alone(mixed, "sqnr")
    assert cap > _w1_alone(mixed, "sqnr") + gains[(w1, "per-channel")] - 1e-3
    assert gains[(w1, "per-channel")] > 0 and gains[(w1, "float")] > gains[(w1, "per-channel")]


def test_menus_list_every_pair_but_biases_in_graph_order(mixed):
    """A bias is requantized from its weight and input scales: no kind is offered for it; the
    menus keep the graph's order (the order the search lists and breaks ties in)."""
    from pytest_ptq.engine import engine_for
    from pytest_ptq.remedy.alternatives import menus_for

    engine = engine_for(str(mixed["qdq"]), mixed["data"])
    menus, skipped = menus_for(engine, ["per-channel", "int16", "float"])
    assert skipped == []  # nor said to be stored quantized: every weight here is float
    model = onnx.load(str(mixed["qdq"]))
    pairs = [n.name for n in model.graph.node if n.op_type == "QuantizeLinear"]
    biases = {n.name for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("b")}
    assert biases and not any(n in menus for n in biases)
    assert list(menus) == [n for n in engine.qmodel.calibration if n in menus]
    assert list(menus) == [n for n in pairs if n in menus] and list(menus) != sorted(menus)

"""Group sensitivity and ranking confidence, against plain onnxruntime runs and numpy."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError
from pytest_ptq.groups import Subgraph, group_sensitivity, ranking_confidence, subgraph_nodes
from pytest_ptq.model import QuantModel
from pytest_ptq.sensitivity import Sensitivity, get_sensitivity_of_nodes

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


def test_subgraph_errors_name_the_tensor(net):
    qm = QuantModel(str(net["qdq"]))
    with pytest.raises(PTQError, match="unknown tensor 'r3'.*'r1'|unknown tensor 'r3'.*'r2'"):
        subgraph_nodes(qm, "r3", "r2")
    with pytest.raises(PTQError, match="does not depend on"):
        subgraph_nodes(qm, "r2", "r1")


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
    # a normal node stands for the pairs it reads, in input order
    assert result.details["head"]["calibration_nodes"] == ["f_QuantizeLinear", "wf_QuantizeLinear",
                                                           "logits_QuantizeLinear"]
    assert result.node_type == "group" and "block" in result.table()


def test_group_labels_and_bad_groups(net):
    with pytest.raises(PTQError, match="empty"):
        group_sensitivity(net["engine"], [[]])
    with pytest.raises(PTQError, match="unknown node"):
        group_sensitivity(net["engine"], [["conv9"]])
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

"""Screening (pytest_ptq.screening): every node ranked on a few samples, the top confirmed on
all of them; the values against brute-force rewired models in plain onnxruntime sessions."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import builders
from pytest_ptq.engine import Engine
from pytest_ptq.metrics import get_metrics
from pytest_ptq.outputs import parse_outputs
from pytest_ptq.runall import runall
from pytest_ptq.screening import samples_within, screen
from pytest_ptq.sensitivity import Sensitivity
from test_plugin import independent_sensitivity

SAMPLES = 6


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    setup = builders.narrow_conv_setup(tmp_path_factory.mktemp("screening"), SAMPLES, seed=5)
    return {**setup, "model": setup["q"]}


def _screen(net, **kw):
    engine = Engine(net["model"], net["folder"])
    metrics = get_metrics(["cosine-similarity"])
    specs = parse_outputs(None, engine.qmodel)
    return screen(engine, ["activation"], metrics, specs, list(range(SAMPLES)), **kw)


def test_confirmed_nodes_carry_their_all_sample_values_and_the_rest_their_screening_ones(net):
    sens, how = _screen(net, rank_samples=2, confirm=2)
    s = sens["activation"]
    names = list(s)
    assert how.samples == 2 and how.of == SAMPLES and how.confirmed == 2 and len(names) > 2
    every = independent_sensitivity(net["model"], net["feeds"], names)
    # the screening samples spread over the data, the first and the last: the first of data
    # stored in order (crops of one page) may all miss what the rest shows
    assert how.indices == (0, SAMPLES - 1)
    screened = independent_sensitivity(net["model"], [net["feeds"][0], net["feeds"][-1]], names)
    assert s.confirmed == names[:2]
    for name in names[:2]:
        assert s[name]["cosine-similarity"] == pytest.approx(every[name], abs=1e-5), name
        assert s.details[name]["samples"] == SAMPLES
        assert len(s.details[name]["per_sample"]["cosine-similarity"]) == SAMPLES
    for name in names[2:]:
        assert s[name]["cosine-similarity"] == pytest.approx(screened[name], abs=1e-5), name
        assert s.details[name]["samples"] == 2
    # the confirmed are in their all-sample order; they were the top two on the screening samples
    assert every[names[0]] <= every[names[1]] + 1e-9
    assert set(names[:2]) == set(sorted(screened, key=screened.get)[:2])
    assert "(the top 2 confirmed on all 6; the rest ranked on 2)" in s.table()
    again = Sensitivity.from_dict(json.loads(json.dumps(s.to_dict(), default=float)))
    assert again.confirmed == s.confirmed and again.confirmed_samples == SAMPLES


def test_a_budget_of_four_samples_narrows_half_on_every_node_and_three_times_as_many_on_the_top(tmp_path,
                                                                                              monkeypatch):
    from pytest_ptq import screening

    n = 12
    setup = builders.narrow_conv_setup(tmp_path, n, seed=5)
    monkeypatch.setattr(screening, "DEFAULT_BUDGET_SAMPLES", 4)
    engine = Engine(setup["q"], setup["folder"])
    sens, how = screen(engine, ["weight", "activation"], get_metrics(["cosine-similarity"]),
                       parse_outputs(None, engine.qmodel), list(range(n)), confirm=1)
    s, names = sens["activation"], list(sens["activation"])
    assert len(names) > 3 and len(sens["weight"]) == 3
    # every node on 2 samples (half the budget's 4), the top 3 of each type (three times those
    # confirmed) on 6, spread over the data and holding the 2, the top 1 on all 12
    assert (how.samples, how.narrowed, how.narrowed_samples, how.confirmed) == (2, {"weight": 3, "activation": 3}, 6, 1)
    # all 3 weights are that top: their ranking is on 6 samples
    weights = sens["weight"]
    assert weights.samples == 6 and [weights.details[w]["samples"] for w in weights] == [12, 6, 6]
    assert "(the top 1 confirmed on all 12; the rest ranked on 6)" in weights.table()
    assert how.indices == (0, 11)
    feeds = setup["feeds"]
    first = independent_sensitivity(setup["q"], [feeds[0], feeds[11]], names)
    wide = independent_sensitivity(setup["q"], [feeds[i] for i in (0, 2, 4, 7, 9, 11)], names)
    every = independent_sensitivity(setup["q"], feeds, names)
    assert set(names[:3]) == set(sorted(first, key=first.get)[:3])
    assert names[0] == min(names[:3], key=wide.get)
    for group, values, samples in ((names[:1], every, n), (names[1:3], wide, 6), (names[3:], first, 2)):
        for name in group:
            assert s[name]["cosine-similarity"] == pytest.approx(values[name], abs=1e-5), name
            assert s.details[name]["samples"] == samples
    assert wide[names[1]] <= wide[names[2]] + 1e-9
    assert "(the top 1 confirmed on all 12, the next 2 on 6; the rest ranked on 2)" in s.table()
    assert how.text() == (f"rankings on 2 of 12 samples (what a {how.budget_s:.3g} s budget allows), the top 3 "
                          "weight and 3 activation nodes on 6, the top 1 of each confirmed on all 12")


def test_narrowing_that_would_cost_more_runs_than_the_budget_counted_is_not_done(tmp_path, monkeypatch):
    """Types of a few nodes each keep at least three times those confirmed on the wider
    samples: narrowing them would cost more runs than every node on the budget's samples
    (counted here as the runs made), so the budget's samples are every node's."""
    from pytest_ptq import screening, sensitivity

    n = 12
    setup = builders.narrow_conv_setup(tmp_path, n, seed=5)
    monkeypatch.setattr(screening, "DEFAULT_BUDGET_SAMPLES", 4)
    engine = Engine(setup["q"], setup["folder"])
    runs = []
    real = sensitivity.score_configs
    monkeypatch.setattr(screening, "score_configs",
                        lambda e, configs, *a, **kw: runs.append(len(configs) * len(a[2])) or real(e, configs, *a, **kw))
    _, how = screen(engine, ["weight", "activation"], get_metrics(["cosine-similarity"]),
                    parse_outputs(None, engine.qmodel), list(range(n)), confirm=3)
    # 3 weights and 10 activations: every node on 4 samples and the top 3 of each on the other 8
    # is 4 * 13 + 8 * 6 = 100 runs; narrowing (2, then 3 and 9 nodes on 6) would be 110
    assert (how.samples, how.narrowed, how.narrowed_samples) == (4, {}, 0)
    assert sum(runs) == 100


def test_ranking_on_every_sample_confirms_nothing(net):
    sens, how = _screen(net, rank_samples=SAMPLES)
    every = independent_sensitivity(net["model"], net["feeds"], list(sens["activation"]))
    assert how.samples == SAMPLES and how.confirmed == 0 and not sens["activation"].confirmed
    for name, value in every.items():
        assert sens["activation"][name]["cosine-similarity"] == pytest.approx(value, abs=1e-5)
    assert how.text() == f"rankings on all {SAMPLES} sample(s)"


def test_the_default_budget_is_counted_in_samples_and_capped_in_seconds(net, monkeypatch):
    """Without a budget, the rankings take the time of DEFAULT_BUDGET_SAMPLES samples as the
    first one measured it (so the same samples on any machine), at most DEFAULT_BUDGET_S."""
    from pytest_ptq import screening

    monkeypatch.setattr(screening, "DEFAULT_BUDGET_SAMPLES", 3.5)
    _, how = _screen(net, min_samples=1, confirm=0)
    assert how.samples == 3 and 0 < how.budget_s < screening.DEFAULT_BUDGET_S
    # what confirming the top on the other samples costs does not cut the ranking's samples
    # below the budget's count (on 96 samples it left 2, whose top missed the 3rd node)
    monkeypatch.setattr(screening, "DEFAULT_BUDGET_SAMPLES", 3)
    n = len(_screen(net, rank_samples=1, confirm=0)[0]["activation"])
    share = 2 / n
    assert screening.samples_within(3, 1, SAMPLES, 2, share) < 3  # the budget alone would rank on fewer
    _, how = _screen(net, confirm=2)
    assert how.samples == 3 and how.confirmed == 2
    monkeypatch.setattr(screening, "DEFAULT_BUDGET_S", 1e-9)
    _, how = _screen(net, min_samples=1, confirm=0)
    assert how.samples == 1 and how.budget_s == 1e-9


def test_a_tiny_budget_ranks_on_the_minimum_and_says_so(net):
    sens, how = _screen(net, budget_s=1e-9, min_samples=3, confirm=1)
    assert how.samples == 3 and how.budget_s == 1e-9 and how.confirmed == 1
    assert how.text().startswith(f"rankings on 3 of {SAMPLES} samples (what a 1e-09 s budget allows)")
    assert set(how.confidence) == set() or all(c.samples == SAMPLES for c in how.confidence.values())


@pytest.mark.parametrize("budget, first, total, share, expected", [
    (60, 10, 32, 0.05, 4),     # (6 - 1.6) / 0.95 = 4.6 samples of everything
    (60, 100, 32, 0.05, 2),    # one sample already beyond the budget: the minimum
    (60, 0.5, 32, 0.05, 32),   # everything fits
    (60, 10, 2, 0.05, 2),      # no more samples than the minimum: all of them
])
def test_samples_within_the_budget(budget, first, total, share, expected):
    assert samples_within(budget, first, total, 2, share) == expected


def test_runall_by_default_screens_within_its_budget_and_verdicts_on_every_sample(net, monkeypatch):
    from pytest_ptq import screening

    monkeypatch.setattr(screening, "DEFAULT_CONFIRM", 2)  # fewer than the net's nodes of each type
    summary = runall(net["model"], net["folder"], save_dir=net["root"] / "out", progress=False,
                     time_budget=1e-9, top=2)
    r = summary["ranking"]
    assert r["samples"] == 2 and r["of"] == SAMPLES and r["confirmed"] == 2
    assert summary["samples"] == 2 and summary["verdict"]["samples"]["calibration"] == SAMPLES
    saved = Sensitivity.load(summary["files"]["sensitivity"]["activation"])
    assert saved.confirmed and saved.confirmed_samples == SAMPLES
    md = Path(summary["files"]["summary_md"]).read_text()
    assert f"rankings on 2 of {SAMPLES} samples (what a 1e-09 s budget allows), the top 2 of each confirmed" in md


def test_where_the_top_of_each_ranking_is_every_node_every_node_ranks_on_every_sample(net):
    sens, how = _screen(net, budget_s=1e-9, confirm=100)
    assert how.samples == SAMPLES and how.confirmed == 0
    every = independent_sensitivity(net["model"], net["feeds"], list(sens["activation"]))
    for name, value in every.items():
        assert sens["activation"][name]["cosine-similarity"] == pytest.approx(value, abs=1e-5)


def test_runall_with_data_num_ranks_on_all_of_them(net):
    summary = runall(net["model"], net["folder"], save_dir=net["root"] / "out3", progress=False,
                     time_budget=1e-9, data_num=3, top=1)
    assert summary["ranking"]["samples"] == 3 and summary["ranking"]["of"] == 3


def test_progress_counts_what_the_screening_does(net, monkeypatch):
    import pytest_ptq.progress as progress_mod

    seen = []

    class Recording(progress_mod.Progress):
        def __exit__(self, *exc):
            seen.append((self.done, self.total))
            return super().__exit__(*exc)

    monkeypatch.setattr("pytest_ptq.screening.Progress", Recording)
    _screen(net, rank_samples=2, confirm=2, progress=io.StringIO())
    (done, total), = seen
    assert done == total


def test_a_config_major_engine_ranks_in_one_pass_compiling_each_form_once(tmp_path, monkeypatch):
    """A 16-bit float graph compiles each config's form (Engine.config_major): the ranking's
    first sample, timed apart, compiled every form, and the other samples compiled them all
    again (runall's ranking of Model Optimizer's fp16 PP-OCRv4 detector: 147 s, against 82 s
    for its two rankings run alone)."""
    import conventions
    from pytest_ptq.engine import segments

    data = builders.samples(8)
    fpath = builders.conv_net(tmp_path / "float.onnx")
    qpath = conventions.make(fpath, tmp_path / "fp16.onnx", data, "modelopt_int8_fp16")
    engine = Engine(str(qpath), data)
    assert engine.config_major
    compiled = []
    original = segments.make_session
    monkeypatch.setattr(segments, "make_session", lambda *a, **k: compiled.append(1) or original(*a, **k))
    metric = get_metrics("cosine-similarity")
    sens, screening = screen(engine, ["activation"], metric, parse_outputs(None, engine), list(range(8)))
    configs = len(sens["activation"])
    assert configs >= 3 and screening.samples == 8  # every node confirmed: ranked on every sample
    assert len(compiled) < 2 * configs  # each form once, beside a few float and trial sessions
    # the same ranking as each config run on every sample through the engine
    ref = [engine.run(i, ()) for i in range(8)]
    for name in list(sens["activation"])[:3]:
        got = [engine.run(i, [name]) for i in range(8)]
        want = independent_cosine(ref, got)
        assert sens["activation"][name]["cosine-similarity"] == pytest.approx(want, abs=1e-9)


def independent_cosine(refs, tests):
    import numpy as np

    r = np.concatenate([np.ravel(v) for d in refs for v in d.values()]).astype(np.float64)
    t = np.concatenate([np.ravel(v) for d in tests for v in d.values()]).astype(np.float64)
    return float(r @ t / np.sqrt((r @ r) * (t @ t)))


def _per_sample_brute_force(model, feeds, names):
    """Each sample's own output cosine with only one pair kept, per pair, in the order of
    ``feeds`` (plain onnxruntime sessions on rewired models, numpy cosine)."""
    from test_plugin import keep_only

    ref = builders.run_model(keep_only(model), feeds)
    out = {}
    for name in names:
        got = builders.run_model(keep_only(model, {name}), feeds)
        out[name] = [builders.pooled_cosine([r["prob"]], [g["prob"]]) for r, g in zip(ref, got)]
    return out


def _check_columns(s, expected, scored):
    """Each node's per-sample list is by sample index: its own sample's value where it was
    scored (``scored[name]``), None elsewhere."""
    n = len(next(iter(expected.values())))
    for name in sorted(expected, key=lambda name: -len(scored[name])):  # the confirmed first: all their values
        want, got = expected[name], s.details[name]["per_sample"]["cosine-similarity"]
        assert len(got) == n, name
        assert [v is not None for v in got] == [i in scored[name] for i in range(n)], name
        assert [v for v in got if v is not None] == pytest.approx([want[i] for i in scored[name]], abs=1e-5), name
        if len(scored[name]) < n:
            assert s.details[name]["scored_samples"] == sorted(scored[name]), name
        else:
            assert "scored_samples" not in s.details[name], name
    assert s.sample_indices == list(range(n))


def test_per_sample_values_of_a_screened_ranking_are_laid_by_sample_index(net):
    """Screened on samples 0 and 5, the top confirmed on the rest: their lists ran 0, 5, 1, 2,
    3, 4 beside the others' 0, 5, so a column was no sample the same for every node."""
    sens, how = _screen(net, rank_samples=2, confirm=2)
    s = sens["activation"]
    expected = _per_sample_brute_force(net["model"], net["feeds"], list(s))
    _check_columns(s, expected, {name: range(SAMPLES) if name in s.confirmed else how.indices for name in s})
    again = Sensitivity.from_dict(json.loads(json.dumps(s.to_dict(), default=float)))
    assert again.sample_indices == s.sample_indices
    rest = next(name for name in s if name not in s.confirmed)
    assert again.details[rest]["scored_samples"] == s.details[rest]["scored_samples"] == list(how.indices)


def test_per_sample_values_of_a_narrowed_ranking_are_laid_by_sample_index(tmp_path, monkeypatch):
    from pytest_ptq import screening

    n = 12
    setup = builders.narrow_conv_setup(tmp_path, n, seed=5)
    monkeypatch.setattr(screening, "DEFAULT_BUDGET_SAMPLES", 4)
    engine = Engine(setup["q"], setup["folder"])
    sens, how = screen(engine, ["activation"], get_metrics(["cosine-similarity"]),
                       parse_outputs(None, engine.qmodel), list(range(n)), confirm=1)
    s = sens["activation"]
    assert how.narrowed_samples == 6 and how.samples == 2
    wide = (0, 2, 4, 7, 9, 11)  # spread over the data, holding the screening's 0 and 11
    scored = {name: {n: range(n), 6: wide, 2: how.indices}[s.details[name]["samples"]] for name in s}
    assert sorted(map(len, scored.values()))[-1] == n and {len(v) for v in scored.values()} == {2, 6, n}
    _check_columns(s, _per_sample_brute_force(setup["q"], setup["feeds"], list(s)), scored)


def test_confidence_of_a_screened_ranking_compares_the_confirmed_on_the_same_samples(net):
    """ranking_confidence of a screened ranking refused it (lists of different lengths); it
    resamples the nodes scored on every sample, by sample, and names the others."""
    import numpy as np

    from pytest_ptq.confidence import ranking_confidence

    sens, how = _screen(net, rank_samples=2, confirm=3)
    s = sens["activation"]
    expected = _per_sample_brute_force(net["model"], net["feeds"], list(s))
    conf = ranking_confidence(s, k=2, resamples=200)
    assert list(conf.nodes) and set(conf.nodes) == set(s.confirmed)
    assert conf.unconfirmed == [n for n in s if n not in s.confirmed] and conf.samples == SAMPLES
    for name, v in conf.nodes.items():
        assert v["samples"] == SAMPLES
        assert v["mean"] == pytest.approx(np.mean(expected[name]), abs=1e-5), name
        assert (v["min"], v["max"]) == pytest.approx((min(expected[name]), max(expected[name])), abs=1e-5), name
    assert f"; {len(conf.unconfirmed)} left out, ranked on fewer of the {SAMPLES} samples than the rest" in conf.message
    # the screening's own bootstrap of the confirmed: the same samples' values
    for name, v in how.confidence["activation"].nodes.items():
        assert v["mean"] == pytest.approx(np.mean(expected[name]), abs=1e-5), name


def _pairs_by_kind(model):
    """``{"weight": n, "activation": n}``: the QuantizeLinear nodes of the model file reading
    an initializer, and the rest."""
    import onnx

    graph = onnx.load(str(model)).graph
    stored = {i.name for i in graph.initializer}
    quantizers = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    weights = sum(n.input[0] in stored for n in quantizers)
    return {"weight": weights, "activation": len(quantizers) - weights}


def _screen_both(net, **kw):
    engine = Engine(net["model"], net["folder"])
    return screen(engine, ["weight", "activation"], get_metrics(["cosine-similarity"]),
                  parse_outputs(None, engine.qmodel), list(range(SAMPLES)), **kw)


def test_the_screening_sentence_says_how_many_of_each_type_were_confirmed(net):
    pairs = _pairs_by_kind(net["model"])
    assert pairs["weight"] < 5 < pairs["activation"]  # the model is what the test is about
    sens, how = _screen_both(net, rank_samples=2, confirm=5)
    every = independent_sensitivity(net["model"], net["feeds"], [*sens["weight"], *sens["activation"]])
    for t, s in sens.items():  # those said confirmed carry their values on every sample
        assert len(s.confirmed) == min(5, pairs[t])
        for name in s.confirmed:
            assert s.details[name]["samples"] == SAMPLES
            assert s[name]["cosine-similarity"] == pytest.approx(every[name], abs=1e-5), name
    # was: "the top 5 of each confirmed on all 6", of 3 weight nodes
    assert how.text() == (f"rankings on 2 of {SAMPLES} samples, the top {pairs['weight']} weight and 5 activation "
                          f"nodes confirmed on all {SAMPLES}")
    assert how.to_dict()["top"] == {"weight": pairs["weight"], "activation": 5}


def test_confirming_none_says_none_was(net):
    sens, how = _screen_both(net, rank_samples=2, confirm=0)
    assert all(not s.confirmed and all(s.details[n]["samples"] == 2 for n in s) for s in sens.values())
    # was: "the top 0 of each confirmed on all 6" here and "(; the rest ranked on 2)" under each table
    assert how.text() == f"rankings on 2 of {SAMPLES} samples, none confirmed on all {SAMPLES}"
    for s in sens.values():
        assert f"(none confirmed on all {SAMPLES}; every node ranked on 2)" in s.table().splitlines()


def test_runall_says_how_many_of_each_type_were_confirmed_on_every_face(net, monkeypatch, capsys):
    from pytest_ptq import screening

    monkeypatch.setattr(screening, "DEFAULT_CONFIRM", 5)  # more than the net's weights, fewer than its activations
    pairs = _pairs_by_kind(net["model"])
    summary = runall(net["model"], net["folder"], save_dir=net["root"] / "out_confirmed", progress=True,
                     time_budget=1e-9, top=1)
    said = f"the top {min(5, pairs['weight'])} weight and 5 activation nodes confirmed on all {SAMPLES}"
    for t in ("weight", "activation"):  # what the rankings saved hold
        assert len(Sensitivity.load(summary["files"]["sensitivity"][t]).confirmed) == min(5, pairs[t])
    assert summary["ranking"]["text"].endswith(said)
    assert said in Path(summary["files"]["summary_md"]).read_text()
    assert f"runall: {summary['ranking']['text']}\n" in capsys.readouterr().err


def test_a_ranking_saved_before_sample_indices_reads_them_back_only_where_they_are_known(net, tmp_path):
    """Files of an earlier release have no sample_indices. A ranking on every sample scored
    them in order: its columns are samples 0..n-1 (read back as []). A screened one's lists ran
    in the order scored: not claimed by sample, its confirmed nodes still resampled alike."""
    import numpy as np

    from pytest_ptq.confidence import ranking_confidence
    from pytest_ptq.sensitivity import get_sensitivity_of_nodes

    def saved_without_indices(s, name):
        d = json.loads(Path(s.save(tmp_path / name)).read_text())
        assert d.pop("sample_indices")  # the case this test is about
        (tmp_path / name).write_text(json.dumps(d))
        return Sensitivity.load(tmp_path / name)

    plain = saved_without_indices(get_sensitivity_of_nodes(str(net["model"]), calibrated_data=net["folder"],
                                                           node_type="activation"), "plain.json")
    expected = _per_sample_brute_force(net["model"], net["feeds"], list(plain))
    assert plain.sample_indices == list(range(len(net["feeds"])))
    for name in plain:  # column j is sample j
        assert plain.details[name]["per_sample"]["cosine-similarity"] == pytest.approx(expected[name], abs=1e-5), name
    screened = saved_without_indices(_screen(net, rank_samples=2, confirm=2)[0]["activation"], "screened.json")
    assert screened.sample_indices == []
    conf = ranking_confidence(screened, k=1, resamples=50)
    assert set(conf.nodes) == set(screened.confirmed)
    for name, v in conf.nodes.items():
        assert v["mean"] == pytest.approx(np.mean(expected[name]), abs=1e-5), name


def test_a_screened_ranking_whose_samples_are_unknown_is_refused_in_true_words(net, tmp_path):
    """An earlier release saved a screened ranking without sample_indices, each node's list in
    the order it was scored, of unequal lengths: refused as 'scored on different numbers of
    samples; recompute it in one run', which it was. A file of this release with
    sample_indices deleted that confirmed none was said to have 'all its 0 samples'."""
    from pytest_ptq.confidence import ranking_confidence
    from pytest_ptq.errors import PTQError

    def edited(s, name, old_release):
        d = json.loads(Path(s.save(tmp_path / name)).read_text())
        assert d.pop("sample_indices")
        if old_release:  # lists of the samples each node was scored on, in no sample's place
            for det in d["details"].values():
                det.pop("scored_samples", None)
                det["per_sample"] = {m: [v for v in vals if v is not None] for m, vals in det["per_sample"].items()}
        (tmp_path / name).write_text(json.dumps(d))
        return d, Sensitivity.load(tmp_path / name)

    d, old = edited(_screen(net, rank_samples=2, confirm=2)[0]["activation"], "old.json", True)
    lengths = {len(det["per_sample"]["cosine-similarity"]) for det in d["details"].values()}
    assert len(lengths) > 1  # the case this test is about
    with pytest.raises(PTQError, match=rf"a screened ranking saved before per-sample values were laid by sample "
                                       rf"\(it has no sample_indices\): its nodes' lists hold {min(lengths)} to "
                                       rf"{max(lengths)} values .*rank it again with this release"):
        ranking_confidence(old, k=1, resamples=50)
    _, none = edited(_screen(net, rank_samples=2, confirm=0)[0]["activation"], "none.json", False)
    with pytest.raises(PTQError, match=rf"scored on all its {len(net['feeds'])} samples \(a screened ranking that "
                                       "confirmed none\\)"):
        ranking_confidence(none, k=1, resamples=50)

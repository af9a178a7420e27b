"""runall: the folder it writes, the numbers behind its verdict against brute-force rewired
models in plain onnxruntime sessions, one engine for every step, and its command line."""

from __future__ import annotations

import json
from pathlib import Path
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from pytest_ptq import cli, debug
from pytest_ptq.analysis import Analysis, AnalysisKey
from pytest_ptq.engine import Engine
from pytest_ptq.errors import PTQError
from pytest_ptq.runall import runall
from pytest_ptq.sensitivity import Sensitivity
from pytest_ptq.verdict import float_first

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("runall")
    data = builders.samples(4)
    fp = builders.conv_net(root / "float.onnx", outlier_channel=3)
    # calibrated on samples ten times too small: activation ranges clip, weights are untouched
    narrow = {k: [a * 0.1 for a in v] for k, v in data.items()}
    qa = builders.quantize(fp, root / "qa.onnx", narrow)
    folder = builders.save_folder(data, root / "calibration_data")
    out = root / "out"
    summary = runall(qa, folder, save_dir=out, top=2, output_node=["logits"], progress=False)
    return {"root": root, "data": data, "float": fp, "qa": qa, "folder": folder, "out": out,
            "summary": summary}


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def _bypassed(path, kinds):
    """The model with the Q/DQ pairs of ``kinds`` removed (their consumers read the float
    tensor); int32 bias DequantizeLinears stay, as they do in the engine without a float model."""
    model = onnx.load(str(path))
    g = model.graph
    inits = {i.name for i in g.initializer}
    rename, drop = {}, set()
    for q in g.node:
        if q.op_type != "QuantizeLinear":
            continue
        if ("weight" if q.input[0] in inits else "activation") not in kinds:
            continue
        drop.add(q.name)
        for dq in g.node:
            if dq.op_type == "DequantizeLinear" and dq.input[0] == q.output[0]:
                drop.add(dq.name)
                rename[dq.output[0]] = q.input[0]
    nodes = []
    for n in g.node:
        if n.name in drop:
            continue
        c = onnx.NodeProto()
        c.CopyFrom(n)
        for k, i in enumerate(c.input):
            c.input[k] = rename.get(i, i)
        nodes.append(c)
    nodes += [helper.make_node("Identity", [rename[o.name]], [o.name]) for o in g.output if o.name in rename]
    del g.node[:]
    g.node.extend(nodes)
    return model


def _outputs(model, data, tensor):
    model.graph.output.append(helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    n = len(data["x"])
    return np.concatenate([sess.run([tensor], {"x": data["x"][i]})[0] for i in range(n)]).astype(np.float64)


def _cos(a, b):
    a, b = a.ravel(), b.ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def test_folder_holds_what_it_promises(setup):
    s, out = setup["summary"], setup["out"]
    saved = json.loads((out / "summary.json").read_text())
    assert _named(saved, lambda p: str(out / p)) == json.loads(json.dumps(s))
    for key in ("verdict", "outputs", "sensitivity", "top_nodes", "distributions", "channelwise", "curves",
                "files", "timings_s", "samples"):
        assert key in saved
    assert _is_png(out / "acc_error.png")
    for node in s["top_nodes"]["weight"] + s["top_nodes"]["activation"]:
        assert _is_png(out / "distributions" / f"distribution_{node}.png")
        assert _is_png(out / "channelwise" / f"channelwise_{node}.png")
    assert sorted(s["files"]["distributions"]) == sorted(str(p) for p in (out / "distributions").iterdir())
    for kind in ("weight", "activation"):
        loaded = Sensitivity.load(out / f"sensitivity_{kind}.json")
        assert loaded.ranking[:2] == s["top_nodes"][kind]
        assert list(saved["sensitivity"][kind]["ranking"]) == loaded.ranking
    text = (out / "summary.md").read_text()
    for node in s["top_nodes"]["weight"] + s["top_nodes"]["activation"]:
        assert f"`{node}`" in text
    assert "## Verdict" in text and "## What to try next" in text


def _named(summary, name):
    """``summary`` with each file it names (``files`` and each plot's ``png``) as ``name(path)``."""
    def listed(files):
        if isinstance(files, dict):
            return {k: listed(v) for k, v in files.items()}
        return [listed(f) for f in files] if isinstance(files, list) else name(files)

    def drawn(plots):
        return {k: {**d, "png": name(d["png"])} if "png" in d else d for k, d in plots.items()}

    return {**summary, "files": listed(summary["files"]), "distributions": drawn(summary["distributions"]),
            "channelwise": drawn(summary["channelwise"]), "curves": {**summary["curves"],
                                                                      "png": name(summary["curves"]["png"])}}


def test_summary_json_names_its_files_from_its_own_folder(setup, tmp_path, monkeypatch):
    """Run from another folder with -s ../elsewhere/out, summary.json listed
    "../elsewhere/out/acc_error.png": a path from the folder runall ran in, which resolves from
    nowhere a CI artifact or a dashboard reads the summary (summary.md named them from its own)."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    s = runall(setup["qa"], setup["folder"], save_dir="../elsewhere/out", top=1, node_type="activation",
               progress=False)
    out = tmp_path / "elsewhere" / "out"
    saved = json.loads((out / "summary.json").read_text())
    named = []
    _named(saved, named.append)
    assert "acc_error.png" in named and "distributions/" + Path(s["files"]["distributions"][0]).name in named
    assert all(not Path(p).is_absolute() and (out / p).is_file() for p in named), named
    # the summary returned names them as written, from the current folder
    assert _named(saved, lambda p: str(Path("../elsewhere/out") / p)) == json.loads(json.dumps(s))


def test_output_numbers_match_rewired_models(setup):
    data, qa = setup["data"], setup["qa"]
    ref = _outputs(_bypassed(qa, {"weight", "activation"}), data, "logits")
    expected = {"weight only": _cos(ref, _outputs(_bypassed(qa, {"activation"}), data, "logits")),
                "activation only": _cos(ref, _outputs(_bypassed(qa, {"weight"}), data, "logits")),
                "all quantized": _cos(ref, _outputs(onnx.load(str(qa)), data, "logits"))}
    for label, value in expected.items():
        assert setup["summary"]["outputs"][label]["cosine-similarity"] == pytest.approx(value, abs=1e-6)


def test_verdict_blames_clipped_activations(setup):
    v = setup["summary"]["verdict"]
    assert v["source"] == "activation"
    assert v["activation only"] < v["weight only"]
    # the three configurations spelt one way: the verdict named them weight_only, ... beside
    # "weight only", ... in outputs and the verdict's values
    outputs = setup["summary"]["outputs"]
    assert set(v["values"]["calibration"]) == set(outputs) and all(
        v[label] == outputs[label][v["metric"]] for label in outputs)
    acts = [it for it in v["nodes"] if it["kind"] == "activation"]
    assert all("recalibrate" in it["try"] for it in acts)
    for it in acts:
        d = setup["summary"]["distributions"][it["node"]]
        assert d["effective_clipped_share"] > 0.01
    assert "recalibrate" in v["next_steps"][0]
    assert any(f"`{acts[0]['node']}`" in step for step in v["next_steps"])


def test_weight_verdict_points_to_per_channel(tmp_path):
    data = builders.samples(2)
    fp = builders.conv_net(tmp_path / "float.onnx", outlier_channel=3)
    # int4 per-tensor weights beside 16-bit activations: the planted channel starves the others
    qw = builders.quantize(fp, tmp_path / "qw.onnx", data, weight_type="QInt4", activation_type="QUInt16")
    s = runall(qw, data, save_dir=tmp_path / "out", top=3, output_node=["logits"], progress=False)
    v = s["verdict"]
    assert v["source"] == "weight" and v["weight only"] < v["activation only"]
    assert s["channelwise"]["w1_QuantizeLinear"]["outlier_channels"] == [3]
    tries = {it["node"]: it["try"][0] for it in v["nodes"] if it["kind"] == "weight"}
    # w1 is starved by its wide channel; the others are merely coarse at 4 bits
    assert tries == {"w1_QuantizeLinear": "per-channel", "w2_QuantizeLinear": "int16", "wf_QuantizeLinear": "int16"}
    assert v["next_steps"][0].startswith("quantize weights per channel") and "`w1_QuantizeLinear`" in v["next_steps"][0]
    assert "int16" in v["next_steps"][1] and "`wf_QuantizeLinear`" in v["next_steps"][1]


def test_a_model_close_to_float_gets_no_fix_for_its_top_nodes(tmp_path):
    data = builders.samples(2)
    fp = builders.conv_net(tmp_path / "float.onnx")
    q = builders.quantize(fp, tmp_path / "q16.onnx", data, weight_type="QInt16", activation_type="QUInt16",
                          extra_options={"UseQDQContribOps": True})
    s = runall(q, data, save_dir=tmp_path / "out", top=3, progress=False)
    v = s["verdict"]
    assert v["source"] == "neither" and 1 - v["all quantized"] < 1e-5
    assert {it["kind"] for it in v["nodes"]} == {"weight", "activation"}
    for it in v["nodes"]:  # the worst node too: it loses next to nothing
        assert not {"int16", "keep in float"} & set(it["try"]), it
        assert it["reasons"][-1] == "the model stays close to float with everything quantized: nothing to do"


def test_data_num_limits_the_verdict_too(setup, tmp_path):
    data, qa = {k: v[:2] for k, v in setup["data"].items()}, setup["qa"]
    s = runall(qa, setup["folder"], save_dir=tmp_path / "out", data_num=2, top=1, output_node=["logits"],
               progress=False)
    assert s["verdict"]["samples"] == {"calibration": 2}
    ref = _outputs(_bypassed(qa, {"weight", "activation"}), data, "logits")
    expected = {"weight only": _cos(ref, _outputs(_bypassed(qa, {"activation"}), data, "logits")),
                "all quantized": _cos(ref, _outputs(onnx.load(str(qa)), data, "logits"))}
    for label, value in expected.items():
        assert s["outputs"][label]["cosine-similarity"] == pytest.approx(value, abs=1e-6)


def test_one_engine_one_float_reference(setup, tmp_path, monkeypatch):
    engine = Engine(setup["qa"], setup["folder"])
    calls = []
    original = Engine.run

    def spy(self, sample, quantized=(), tensors=None, kind=None, alternative=()):
        calls.append((sample if isinstance(sample, (int, tuple)) else "feed", tuple(quantized) if not isinstance(quantized, str)
                      else quantized, kind, tuple(tensors or ())))
        return original(self, sample, quantized, tensors, kind, alternative)

    monkeypatch.setattr(Engine, "run", spy)
    s = runall(engine, save_dir=tmp_path / "out", data_num=2, top=1, progress=False)
    assert s["samples"] == 2 and s["curves"]["samples"] == 2
    # (stacked groups, a trial of whether grouping pays, are not counted)
    float_model_outputs = [c for c in calls if c[1] == () and c[2] in (None, "main") and not isinstance(c[0], tuple)]
    # the model outputs of the float model: once per sample, cached for every later step;
    # data_num limits every step, the weights/activations verdict too
    assert len(float_model_outputs) == 2 < len(engine.data)
    assert set(engine._sessions) <= {"main", "probe", "local"}


def test_node_type_node_plots_the_nodes_and_their_calibration_inputs(setup, tmp_path):
    s = runall(setup["qa"], setup["data"], save_dir=tmp_path / "out", node_type="node", top=1,
               output_node=["logits"], progress=False)
    (top,) = s["top_nodes"]["node"]
    assert s["distributions"][top]["kind"] == "node"
    feeds = [c for c in s["sensitivity"]["node"]["details"][top]["calibration_nodes"]
             if not c.startswith("b")]
    assert feeds and all(c in s["distributions"] and c in s["channelwise"] for c in feeds)
    md = (tmp_path / "out" / "summary.md").read_text()
    assert f"`{top}`" in md and "## Most sensitive operator nodes" in md  # not "node nodes"


def test_bad_arguments(setup, tmp_path):
    with pytest.raises(PTQError, match="top must be at least 1"):
        runall(setup["qa"], setup["data"], save_dir=tmp_path, top=0, progress=False)
    with pytest.raises(PTQError, match="unknown node_type 'weights'"):
        runall(setup["qa"], setup["data"], save_dir=tmp_path, node_type="weights", progress=False)
    # held-out data that cannot be read: said before the rankings, with nothing written
    with pytest.raises(PTQError, match="held-out data .*missing' does not exist"):
        runall(setup["qa"], setup["data"], save_dir=tmp_path / "out", heldout=tmp_path / "missing", progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_runall(setup, tmp_path, capsys):
    out = tmp_path / "cli"
    rc = cli.main(["runall", str(setup["qa"]), str(setup["folder"]), "-s", str(out), "--data-num", "1",
                   "--top", "1", "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "## Verdict" in text and f"wrote {out}" in text
    saved = json.loads((out / "summary.json").read_text())
    assert saved["samples"] == 1 and saved["top"] == 1
    assert all(f"`{n}`" in text for n in saved["top_nodes"]["activation"])


def test_cli_runall_errors_and_help(setup, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # refused as it is parsed, before the model compiles
        cli.main(["runall", str(setup["qa"]), str(setup["folder"]), "-s", str(tmp_path), "-m", "cosin", "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unknown metric 'cosin'" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exc:
        cli.main(["runall", "-h"])
    assert exc.value.code == 0
    assert "--top" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["runall", str(setup["qa"]), str(setup["folder"]), "--top", "0"])
    assert exc.value.code == 2


def test_a_severe_node_is_kept_in_float_first_and_once():
    # a well-shaped but severe node reads ["int16", "keep in float"] from its distribution
    assert float_first("cosine-similarity", 0.6, ["int16", "keep in float"]) == (["keep in float", "int16"], True)
    assert float_first("cosine-similarity", 0.01, ["int16", "keep in float"]) == (["int16", "keep in float"], False)
    assert float_first("mse", 5.0, ["int16"]) == (["int16"], False)


def test_a_mask_fill_is_kept_in_float_in_the_quantizers_terms_and_that_recovers_the_output(tmp_path):
    import ast
    import re

    data = builders.masked_samples()
    fp = builders.masked_attention_net(tmp_path / "float.onnx", -3.4028235e38)
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    s = runall(str(q), data, float_model=str(fp), save_dir=tmp_path / "out", top=2, progress=False)
    step = next(x for x in s["verdict"]["next_steps"] if "nodes_to_exclude=" in x)
    assert "`scores_QuantizeLinear`" in step
    exclude = ast.literal_eval(re.search(r"nodes_to_exclude=(\[.*?\])", step).group(1))
    # the scores' producer and reader, as the float model names them
    assert exclude == ["masked_scores", "attention"]
    fixed = builders.quantize(fp, tmp_path / "fixed.onnx", data, nodes_to_exclude=exclude)
    feeds = [{k: v[i] for k, v in data.items()} for i in range(len(data["x"]))]
    ref = [builders.run_model(fp, f)["out"] for f in feeds]
    before = builders.pooled_cosine(ref, [builders.run_model(q, f)["out"] for f in feeds])
    after = builders.pooled_cosine(ref, [builders.run_model(fixed, f)["out"] for f in feeds])
    assert before < 0.99 < after


@pytest.mark.parametrize("activation_type", ["QUInt8", "QUInt16"])
def test_a_16_bit_activation_is_not_advised_int16(tmp_path, activation_type):
    """An input channel 20000x the others under a per-tensor scale: at 8 bits int16 is one
    answer, at 16 bits (activation_type=QUInt16) the advice said "-> try per-channel or
    int16" and "raise them to int16" all the same."""
    rng = np.random.default_rng(0)
    w1 = (0.1 * rng.standard_normal((64, 32))).astype(np.float32)
    w1[0] = 0  # the net ignores the wide channel
    w2 = (0.1 * rng.standard_normal((32, 8))).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"), helper.make_node("MatMul", ["a", "w2"], ["y"], name="mm2")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), fp)
    gain = np.r_[20000, np.ones(63)].astype(np.float32)
    data = {"x": [(rng.standard_normal((1, 4, 64)) * gain).astype(np.float32) for _ in range(8)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", data, activation_type=activation_type)
    s = runall(q, data, float_model=fp, save_dir=tmp_path / "out", top=3, progress=False)
    v = s["verdict"]
    assert v["source"] == "activation"
    [x] = [it for it in v["nodes"] if it["node"] == "x_QuantizeLinear"]
    assert s["channelwise"]["x_QuantizeLinear"]["outlier_channels"] == [0]
    assert "per-channel" in x["try"]
    advice = " ".join(x["reasons"] + v["next_steps"])
    if activation_type == "QUInt8":
        assert "int16" in x["try"] and "raise them to int16" in advice
    else:
        assert not [t for it in v["nodes"] if it["kind"] == "activation" for t in it["try"] if t == "int16"]
        assert "int16" not in advice and "equalise the channel ranges" in advice


def test_cli_runall_with_names_the_terminal_cannot_encode(setup, tmp_path):
    """A model in a folder named in Chinese, on a terminal of the C locale: the summary is
    read back as the UTF-8 it was written in, and what the terminal lacks prints escaped."""
    import subprocess
    import sys

    folder = tmp_path / "模型"
    folder.mkdir()
    model = folder / "qa.onnx"
    model.write_bytes(setup["qa"].read_bytes())
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, "-m", "pytest_ptq", "runall", str(model), str(setup["folder"]), "-s",
                           str(tmp_path / "out"), "--data-num", "1", "--top", "1", "--quiet", "-t", "activation"],
                          capture_output=True, env=env, timeout=300)
    text = done.stdout.decode("ascii")
    assert done.returncode == 0, done.stderr.decode("ascii", "replace")[-2000:]
    assert "## Verdict" in text and "\\u6a21\\u578b" in text  # 模型, escaped
    assert "Traceback" not in done.stderr.decode("ascii", "replace")


def test_cli_runall_into_a_folder_whose_name_is_not_utf8(setup, tmp_path):
    """Everything was written, then reading the summary back raised UnicodeDecodeError (exit 3)."""
    import subprocess
    import sys

    folder = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/lat\xe9"))
    folder.mkdir()
    model = folder / "qa.onnx"  # the summary names the model by its path
    model.write_bytes(setup["qa"].read_bytes())
    out = str(folder / "out")
    done = subprocess.run([sys.executable, "-m", "pytest_ptq", "runall", str(model), str(setup["folder"]), "-s",
                           out, "--data-num", "1", "--top", "1", "--quiet", "-t", "activation"],
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")[-2000:]
    assert b"## Verdict" in done.stdout and (Path(out) / "summary.json").is_file()


def test_runall_keeps_results_in_a_folder_given_as_its_cache_and_refuses_other_values(setup, tmp_path, monkeypatch):
    from pytest_ptq.engine import batching
    from pytest_ptq.errors import PTQError

    kept = tmp_path / "kept"
    first = runall(setup["qa"], setup["folder"], save_dir=tmp_path / "a", top=1, progress=False, cache=str(kept))
    assert any(kept.rglob("*.ptq-cache"))
    # the rerun reads how the kept results ran their samples: timing a new choice cost a
    # trial of stacked passes and could report one the results were not computed with
    with monkeypatch.context() as m:
        m.setattr(batching, "decide", lambda *a, **k: pytest.fail("a cached rerun timed the samples' stacking"))
        again = runall(setup["qa"], setup["folder"], save_dir=tmp_path / "b", top=1, progress=False, cache=kept)
    assert again["verdict"] == first["verdict"] and again["top_nodes"] == first["top_nodes"]
    assert again["samples_per_run"] == first["samples_per_run"]
    # rankings computed again (another node type) report the stacking they ran with, not the kept one
    with monkeypatch.context() as m:
        m.setattr(batching, "decide", lambda *a, **k: batching.Batching(1, "the choice of this run"))
        other = runall(setup["qa"], setup["folder"], save_dir=tmp_path / "d", top=1, progress=False, cache=kept,
                       node_type="weight")
    assert other["samples_per_run"] == "the choice of this run"
    for bad in (True, 5):
        with pytest.raises(PTQError, match="cache must be a folder to keep results in or a ResultCache"):
            runall(setup["qa"], setup["folder"], save_dir=tmp_path / "c", progress=False, cache=bad)


def test_a_rerun_into_the_same_folder_leaves_only_its_own_figures(setup, tmp_path):
    """A rerun removes what the earlier run listed and it does not write (figures of a larger
    ``top``, the sensitivity of a node type it does not rank), and nothing of the user's, even
    under runall's own names."""
    out = tmp_path / "again"
    runall(setup["qa"], setup["folder"], save_dir=out, top=3, progress=False)
    mine = [out / "distributions" / "mine.png", out / "distributions" / "distribution_mine.png",
            out / "channelwise" / "channelwise_mine.png", out / "sensitivity_mine.json"]
    for p in mine:
        p.write_bytes(b"x")
    summary = runall(setup["qa"], setup["folder"], save_dir=out, top=1, node_type="activation", progress=False)
    for kind in ("distributions", "channelwise"):
        listed = {Path(p).name for p in summary["files"][kind]}
        drawn = {p.name for p in (out / kind).glob("*.png")} - {p.name for p in mine}
        assert drawn == listed
    assert sorted(p.name for p in out.glob("sensitivity_*.json")) == ["sensitivity_activation.json",
                                                                      "sensitivity_mine.json"]
    assert all(p.read_bytes() == b"x" for p in mine)


def test_a_folder_with_a_summary_runall_did_not_write_is_refused(setup, tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "summary.md").write_text("my notes")
    with pytest.raises(PTQError, match="holds a summary.md that runall did not write; give runall a folder of its own"):
        runall(setup["qa"], setup["folder"], save_dir=out, top=1, progress=False)
    assert (out / "summary.md").read_text() == "my notes" and sorted(out.iterdir()) == [out / "summary.md"]


def test_an_interrupted_run_leaves_a_summary_that_says_so_and_the_next_run_cleans_up(setup, tmp_path, monkeypatch):
    """Interrupted after its rankings, runall left the earlier run's summary beside the new
    rankings, a folder that looked whole. Its summary now says it did not finish; the next
    run still knows the earlier run's files and removes those it does not write."""
    import pytest_ptq.runall as module

    out = tmp_path / "cut"
    runall(setup["qa"], setup["folder"], save_dir=out, top=3, progress=False)
    three = {p for p in out.rglob("*.png")}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "collect", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runall(setup["qa"], setup["folder"], save_dir=out, top=1, metrics=["mse"], progress=False)
    assert "did not finish" in (out / "summary.md").read_text()
    assert json.loads((out / "summary.json").read_text())["unfinished"] is True
    monkeypatch.undo()
    summary = runall(setup["qa"], setup["folder"], save_dir=out, top=1, progress=False)
    drawn = set(out.rglob("*.png"))
    assert drawn == {Path(p) for k in ("distributions", "channelwise") for p in summary["files"][k]} | {
        Path(summary["files"]["acc_error"])} and drawn < three


def test_figures_an_interrupted_run_drew_are_listed_as_it_draws_them_and_go_on_the_next_run(setup, tmp_path,
                                                                                               monkeypatch):
    """Killed among its figures, runall left them beside a summary listing only the earlier
    run's files: the next run kept them, unlisted, for good."""
    import pytest_ptq.runall as module

    out = tmp_path / "cut"
    runall(setup["qa"], setup["folder"], save_dir=out, top=1, progress=False)
    first = set(out.rglob("*.png"))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "draw_channelwise", killed)  # after every distribution is drawn
    with pytest.raises(KeyboardInterrupt):
        runall(setup["qa"], setup["folder"], save_dir=out, top=3, progress=False)
    drawn = set((out / "distributions").glob("*.png"))
    listed = {out / p for p in json.loads((out / "summary.json").read_text())["files"]}
    assert drawn - first and drawn <= listed  # each as it was drawn
    monkeypatch.undo()
    summary = runall(setup["qa"], setup["folder"], save_dir=out, top=1, progress=False)
    assert set(out.rglob("*.png")) == {Path(p) for k in ("distributions", "channelwise") for p in summary["files"][k]} | {
        Path(summary["files"]["acc_error"])}


def test_a_folder_another_runall_is_writing_into_is_refused_until_it_ends(setup, tmp_path, monkeypatch):
    """Two runs into one folder mixed their files. A run holds a lock on the folder that the
    system drops when it ends, whichever way: an interrupted one (in a notebook that lives on)
    leaves the folder to the next."""
    import fcntl
    import os

    import pytest_ptq.runall as module

    out = tmp_path / "busy"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)  # another run, writing
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(PTQError, match="another runall is writing into .*; wait for it to end"):
            runall(setup["qa"], setup["folder"], save_dir=out, top=1, progress=False)
    finally:
        os.close(fd)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "collect", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runall(setup["qa"], setup["folder"], save_dir=out, top=1, progress=False)
    monkeypatch.undo()
    assert runall(setup["qa"], setup["folder"], save_dir=out, top=1, progress=False)["top"] == 1
    # a file system that locks no folder (NFS: EBADF, ENOLCK) runs unguarded, not "another runall"
    import errno

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert runall(setup["qa"], setup["folder"], save_dir=out, top=1, progress=False)["top"] == 1


def test_a_summary_names_the_first_of_many_outputs_and_how_many_more(setup, tmp_path):
    from pytest_ptq.runall import markdown

    summary = runall(setup["qa"], setup["folder"], save_dir=tmp_path / "many", top=1, progress=False)
    summary["outputs_compared"] = [f"out{k}" for k in range(60)]
    head = markdown(summary).splitlines()[2]
    assert "out0, out1, out2, out3, out4 and 55 more (summary.json lists them)." in head and "out5" not in head


def test_a_summarys_table_rows_keep_their_cells_whatever_the_node_names(setup, tmp_path):
    """A pipe splits a Markdown table row, a backtick ends its code span and a newline the
    row: names holding them (an exporter's, a hand-edited graph's) broke the table."""
    import re

    from pytest_ptq.runall import markdown

    summary = runall(setup["qa"], setup["folder"], save_dir=tmp_path / "odd", top=2, progress=False)
    odd = ["relu|`pipe`", "line\nbreak", "``twice`` ticks"]
    for it, name in zip(summary["verdict"]["nodes"], odd * 3):
        it["node"] = name
    text = markdown(summary)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert rows
    for row in rows:
        assert len(re.findall(r"(?<!\\)\|", row)) == 7, row  # six cells, none split
    assert "| `` relu\\|`pipe` `` |" in text and "`line\\nbreak`" in text and "``` ``twice`` ticks ```" in text


def test_a_node_that_costs_far_more_than_the_structural_fixes_comes_first_in_the_plan():
    """A mask's fill (keep in float) beside outlier channels (per channel): the plan put the
    channels first and the fill "if they still cost too much after that", though the fill
    cost ten times more."""
    from pytest_ptq.runall import _plan

    def item(node, bad, tries):
        return {"node": node, "kind": "activation", "badness": bad, "try": tries,
                "findings": [{"node": node, "kind": "activation", "try": tries}]}

    fill = item("scores_QuantizeLinear", 0.15, ["keep in float"])
    for channels_bad, fill_first in ((0.014, True), (0.1, False)):
        channels = item("ln_QuantizeLinear", channels_bad, ["per-channel", "int16"])
        steps, _ = _plan([fill, channels], [fill, channels], "activation")
        kept = next(i for i, s in enumerate(steps) if "`scores_QuantizeLinear` in float" in s)
        split = next(i for i, s in enumerate(steps) if "outlier channels" in s)
        assert (kept < split) == fill_first
        assert ("if they still cost too much after that" in steps[kept]) != fill_first


def test_a_weight_scale_that_clips_its_weights_is_read_as_such(tmp_path):
    """w2's scale cut to a tenth: most of its weights clip. Not "too few levels -> more bits":
    the scale does not fit the weights, and a re-quantization computes one that does."""
    data = builders.samples(2)
    fp = builders.conv_net(tmp_path / "float.onnx")
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    model = onnx.load(str(q))
    inits = {i.name: i for i in model.graph.initializer}
    s = onnx.numpy_helper.to_array(inits["w2_scale"]) / 10
    inits["w2_scale"].CopyFrom(onnx.numpy_helper.from_array(s, "w2_scale"))
    onnx.save(model, str(tmp_path / "clipped.onnx"))
    w = onnx.numpy_helper.to_array(next(i for i in onnx.load(str(fp)).graph.initializer if i.name == "w2"))
    z = float(onnx.numpy_helper.to_array(inits["w2_zero_point"]))
    share = float(np.mean((w < (-128 - z) * s - s / 2) | (w > (127 - z) * s + s / 2)))
    assert share > 0.5
    out = runall(tmp_path / "clipped.onnx", data, save_dir=tmp_path / "out", top=4, float_model=fp,
                 progress=False)
    v = out["verdict"]
    [it] = [it for it in v["nodes"] if it["node"] == "w2_QuantizeLinear"]
    assert it["try"][0] == "recalibrate", it
    assert f"{100 * share:.1f}% of the weights lie beyond the range their scale covers" in " ".join(it["reasons"])
    assert any(step.startswith("recalibrate `w2_QuantizeLinear`") for step in v["next_steps"]), v["next_steps"]
    # a failing contract's diagnosis names the same fix, in a weight's terms (no samples to add)
    d = Analysis(AnalysisKey(str(tmp_path / "clipped.onnx"), data, str(fp)), tmp_path).diagnosis("weight")
    [fix] = [f for f in d.fixes if f["short"] == "weight scales"]
    assert fix["nodes"] == ["w2_QuantizeLinear"] and "computed from the weights' range" in fix["text"]


def test_an_activation_range_that_clips_its_samples_is_recalibrated_on_them(tmp_path):
    """r2's range cut to a tenth of what the samples reach: the fix calibrates again on samples
    like these, and does not speak of held-out data the contract does not have."""
    data = builders.samples(2)
    fp = builders.conv_net(tmp_path / "float.onnx")
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    builders.scaled(q, tmp_path / "clipped.onnx", "r2_scale", 0.1)
    d = Analysis(AnalysisKey(str(tmp_path / "clipped.onnx"), data, str(fp)), tmp_path).diagnosis("activation")
    [fix] = [f for f in d.fixes if f["short"] == "recalibrate"]
    assert "r2_QuantizeLinear" in fix["nodes"], d.fixes
    assert "calibrate again on samples like these" in fix["text"] and "held-out" not in fix["text"]


WIDTH = 32


def _tanh_stack(fp, rng, depth):
    """``depth`` MatMul-Tanh layers on ``[1, 4, WIDTH]``, saved at ``fp``: ``(fp, output name)``."""
    nodes, inits, src = [], [], "x"
    for k in range(depth):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(w, f"w{k}"))
        nodes += [helper.make_node("MatMul", [src, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Tanh", [f"m{k}"], [f"t{k}"], name=f"tanh{k}")]
        src = f"t{k}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, WIDTH])],
                              [helper.make_tensor_value_info(src, onnx.TensorProto.FLOAT, [1, 4, WIDTH])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    return fp, src


def test_a_kind_loss_the_ranking_samples_do_not_show_is_said_so_on_their_own_figures(tmp_path):
    """Calibration samples that saturate every Tanh hide what activation quantization costs
    on held-out data nearer zero: the spread step set the held-out loss against the worst
    node's on the calibration samples (two data sets); it now gives both losses, each equal
    to the activation pairs alone run in a plain session on that data, and says the ranking's
    samples do not show the loss."""
    rng = np.random.default_rng(0)
    fp, src = _tanh_stack(tmp_path / "f.onnx", rng, 6)
    calib = {"x": [(50 * rng.standard_normal((1, 4, WIDTH))).astype(np.float32) for _ in range(4)]}
    held = {"x": [(0.5 * rng.standard_normal((1, 4, WIDTH))).astype(np.float32) for _ in range(4)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", calib)
    v = runall(q, calib, float_model=fp, heldout=held, save_dir=tmp_path / "out", top=3, progress=False)["verdict"]
    activations = [n for n in builders.qdq_pairs(q) if not n.startswith("w")]
    only = builders.rewire(q, keep=activations)

    def loss(data):
        feeds = [{"x": x} for x in data["x"]]
        return 1 - builders.pooled_cosine([builders.run_model(fp, f)[src] for f in feeds],
                                          [builders.run_model(only, f)[src] for f in feeds])

    step = v["next_steps"][0]
    assert step.startswith(f"activation quantization alone loses {loss(held):.3g} where the verdict was decided but "
                           f"only {loss(calib):.2g} on the 4 calibration sample(s) every node was ranked on"), step
    assert "those samples do not show the loss" in step


def test_an_activation_loss_spread_over_many_nodes_is_said_so_and_16_bit_activations_recover_it(tmp_path):
    """The verdict blamed activations, yet each activation node, far below a weight node,
    read "it costs little next to the worst node: nothing to do" and the next steps named
    weights only (PP-OCR's classifier: activations alone 0.9921, the worst activation node
    alone 0.99966)."""
    rng = np.random.default_rng(0)
    fp, src = _tanh_stack(tmp_path / "f.onnx", rng, 12)
    data = {"x": [(3 * rng.standard_normal((1, 4, WIDTH))).astype(np.float32) for _ in range(6)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", data, per_channel=True)
    s = runall(q, data, float_model=fp, save_dir=tmp_path / "out", top=3, progress=False)
    v = s["verdict"]
    assert v["source"] == "activation"
    assert v["next_steps"][0].startswith("activation quantization alone loses")
    assert "spread over many activation nodes" in v["next_steps"][0] and "activation_type=QuantType.QUInt16" in \
        v["next_steps"][0]
    for it in v["nodes"]:
        if it["kind"] == "activation":
            assert "nothing to do" not in " ".join(it["reasons"]), it
    # independently: 16-bit activations recover most of what the 8-bit ones lose
    feeds = [{"x": x} for x in data["x"]]
    ref = [builders.run_model(fp, f)[src] for f in feeds]

    def loss(path):
        return 1 - builders.pooled_cosine(ref, [builders.run_model(path, f)[src] for f in feeds])

    wide = builders.quantize(fp, tmp_path / "q16.onnx", data, per_channel=True, activation_type="QUInt16")
    assert loss(wide) < 0.5 * loss(q)
    # the search the step proposes asks this run's question: its data, held-out data, float model and sample limit
    calib, held = builders.save_folder(data, tmp_path / "calib"), builders.save_folder(
        {"x": [(3 * rng.standard_normal((1, 4, WIDTH))).astype(np.float32) for _ in range(4)]}, tmp_path / "held")
    v = runall(q, calib, float_model=fp, heldout=held, data_num=5, save_dir=tmp_path / "out2", top=3,
               progress=False)["verdict"]
    assert f"`ptq-debug suggest {q} {calib} --heldout {held} --float-model {fp} --data-num 5 --remedy int16`" in \
        v["next_steps"][0], v["next_steps"][0]


def test_a_local_error_gone_non_finite_names_the_op_that_made_it(tmp_path, capsys):
    """A Log reading a value rounded to 0 read "local nan" in runall's table and "(nan)" in
    plot-acc-error, its cause unsaid."""
    from pytest_ptq.cli import main

    rng = np.random.default_rng(0)
    w = np.diag(np.abs(rng.standard_normal(8)) + 0.5).astype(np.float32)  # each product reads one input
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Log", ["m"], ["y"], name="log")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8])], [onnx.numpy_helper.from_array(w, "w")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    # positive products, a few of them far below the range's step: they round to 0
    data = {"x": [(np.abs(rng.standard_normal((1, 4, 8))) * np.r_[1e-5, np.ones(7) * 50]).astype(np.float32)
                  for _ in range(4)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    assert not np.isfinite(builders.run_model(q, {"x": data["x"][0]})["y"]).all()  # the case
    builders.save_folder(data, tmp_path / "calib")
    s = runall(str(q), str(tmp_path / "calib"), float_model=str(fp), save_dir=tmp_path / "out", top=3, progress=False)
    assert "(local non-finite: Log 'log', which turns a value rounded to 0 or below into Inf or NaN" in \
        (tmp_path / "out" / "summary.md").read_text()
    assert any(it.get("pole") for it in s["verdict"]["nodes"])
    assert main(["plot-acc-error", str(q), str(tmp_path / "calib"), "-q", "activation", "--float-model", str(fp),
                 "-s", str(tmp_path / "curves"), "--quiet"]) == 0
    assert "log (nan: Log 'log', which turns a value rounded to 0 or below into Inf or NaN)" in capsys.readouterr().out


def test_operators_whose_weights_sit_on_their_grid_are_ranked_and_advised(tmp_path):
    """A float model whose weights are already on the int8 grid (a QAT export): those weights
    lose nothing and have nothing to try; runall's operator ranking crashed on them."""
    from onnx import numpy_helper

    data = builders.samples(3)
    fp = builders.conv_net(tmp_path / "f.onnx")
    first = onnx.load(str(builders.quantize(fp, tmp_path / "q1.onnx", data, per_channel=True)))
    scales = {i.name: numpy_helper.to_array(i) for i in first.graph.initializer}
    model = onnx.load(str(fp))
    for init in model.graph.initializer:
        if init.name + "_scale" in scales and init.name.startswith("w"):
            w, s = numpy_helper.to_array(init), scales[init.name + "_scale"]
            s = np.reshape(s, (-1,) + (1,) * (w.ndim - 1))
            init.CopyFrom(numpy_helper.from_array((np.clip(np.round(w / s), -127, 127) * s).astype(np.float32),
                                                  init.name))
    onnx.save(model, str(tmp_path / "snapped.onnx"))
    q = builders.quantize(tmp_path / "snapped.onnx", tmp_path / "q.onnx", data, per_channel=True)
    out = runall(q, data, save_dir=tmp_path / "out", node_type="node", float_model=tmp_path / "snapped.onnx",
                 progress=False)
    findings = [f for it in out["verdict"]["nodes"] for f in it["findings"] if f["kind"] == "weight"]
    assert findings and all(f["try"] == [] for f in findings)  # on the grid: nothing to try
    assert out["verdict"]["next_steps"]


def test_the_error_of_the_node_a_pair_feeds_is_own_inherited_or_not_measured(tmp_path):
    """runall's last column called a 2e-5 local loss "bad by itself", and a node whose float
    values hold -inf (an Add of an attention mask kept in float) "bad by itself" at local nan:
    now "own", "inherited", or "not measured" where the float values are not finite."""
    import warnings

    fpath = builders.inf_mask_net(tmp_path / "f.onnx")
    data = builders.inf_mask_samples(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = builders.quantize(fpath, tmp_path / "q.onnx", data, nodes_to_exclude=["masked_scores", "attention"])
    s = runall(str(q), data, save_dir=tmp_path / "out", top=2, float_model=str(fpath), node_type="activation",
               progress=False)
    items = {it["node"]: it for it in s["verdict"]["nodes"]}
    assert items["s_QuantizeLinear"]["origin"] == "unmeasured" and items["s_QuantizeLinear"]["at"] == "masked_scores"
    assert items["x_QuantizeLinear"]["origin"] in ("local", "inherited")
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "not measured at `masked_scores` (its float values are not finite)" in text
    assert "bad by itself" not in text and ("own at `score`" in text or "inherited at `score`" in text), text


def test_a_similarity_a_hair_below_one_keeps_its_digits_in_the_summary():
    # 0.9999999982 read "1" in summary.md, as the exact 1 of a pair stored exactly does
    from pytest_ptq.runall import _v

    assert [_v(0.9999999982), _v(1.0), _v(0.9911855012), _v(2e-5)] == ["0.9999999982", "1", "0.9911855", "2.000e-05"]


def test_every_step_of_runall_shows_its_progress_to_its_last_part(tmp_path):
    """The figures of step 2 were drawn after its bar said done (most of the step, silent), and
    step 4's three configurations on every sample showed no progress at all."""
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    data = builders.samples(3)
    held = builders.samples(2, seed=9)
    q = builders.quantize(builders.conv_net(tmp_path / "float.onnx"), tmp_path / "q.onnx", data)
    drawn = Terminal()
    s = runall(q, data, save_dir=tmp_path / "out", top=2, progress=drawn, heldout=held)
    figures = len(s["files"]["distributions"]) + len(s["files"]["channelwise"])
    finals = {line.split(":")[0]: line for line in drawn.getvalue().replace("\r", "\n").splitlines() if "/" in line}
    assert figures and finals["drawing the figures"].split()[3].startswith(f"{figures}/")
    assert re.search(r"^weights, activations, both: (\[#+\] )?5/5 ", finals["weights, activations, both"])


def _compensated_net(path, outlier=400.0, seed=0, C=8, size=16):
    """Conv-Relu-Conv-Relu-Pool-Gemm whose first conv's channel 3 is ``outlier`` times wider
    and the second conv reads it ``sqrt(outlier)`` times weaker: a per-tensor w1 loses its
    other channels while the activations stay comparable (a model whose weights and
    activations each cost a part)."""
    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((C, 3, 3, 3)) * 0.3).astype(np.float32)
    w1[3] *= outlier
    w2 = (rng.standard_normal((C, C, 3, 3)) * 0.2).astype(np.float32)
    w2[:, 3] /= outlier ** 0.5
    arrays = {"w1": w1, "b1": (rng.standard_normal(C) * 0.1).astype(np.float32), "w2": w2,
              "b2": (rng.standard_normal(C) * 0.1).astype(np.float32),
              "wf": (rng.standard_normal((10, C)) * 0.5).astype(np.float32),
              "bf": (rng.standard_normal(10) * 0.1).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def compensated(tmp_path_factory):
    """runall -t node on the first 5 of 6 samples of a model whose weights and activations
    each cost a part."""
    root = tmp_path_factory.mktemp("compensated")
    data = builders.samples(6, seed=1)
    q = builders.quantize(_compensated_net(root / "float.onnx"), root / "q.onnx", data)
    folder = builders.save_folder(data, root / "calibration_data")
    s = runall(q, folder, save_dir=root / "out", node_type="node", data_num=5, top=3, progress=False)
    return {"root": root, "data": data, "q": q, "folder": folder, "summary": s,
            "md": (root / "out" / "summary.md").read_text()}


def test_an_operators_tries_start_with_those_of_the_input_that_costs_it_more(compensated):
    """The try column listed conv1's inputs' tries in input order: its harmless input's
    "int16, keep in float" before its weight's "per-channel", where the plugin's diagnosis
    names the weight; measured here with each input alone kept in plain onnxruntime."""
    q, data = compensated["q"], compensated["data"]
    feeds = [{"x": data["x"][i]} for i in range(5)]
    ref = builders.run_model(builders.rewire(q), feeds)
    items = {it["node"]: it for it in compensated["summary"]["verdict"]["nodes"] if it["kind"] == "node"}
    conv1 = items["conv1"]
    cost = {f["node"]: 1 - builders.worst_cosine(ref, builders.run_model(builders.rewire(q, keep={f["node"]}), feeds))
            for f in conv1["findings"]}
    worse = max(cost, key=cost.get)
    assert worse == "w1_QuantizeLinear" and cost[worse] > 10 * min(cost.values()), cost
    first = next(f["try"] for f in conv1["findings"] if f["node"] == worse)
    assert conv1["try"][:len(first)] == first and conv1["try"][0] == "per-channel", conv1["try"]
    assert conv1["reasons"][0].startswith(f"{worse}: ")
    row = re.search(r"^\| \d+ \| `conv1` \|.*$", compensated["md"], re.M).group()
    assert f"| {', '.join(conv1['try'])} | {worse}: " in row


def test_runall_says_which_samples_it_ranked_on_and_suggests_ranking_operators_only_where_it_did_not(compensated,
                                                                                                    tmp_path):
    """``data_num=5`` of 6 read "rankings on all 5 sample(s)"; a "both" verdict suggested
    ranking operator nodes, in the API's spelling, above its own table of them."""
    s, md = compensated["summary"], compensated["md"]
    assert s["verdict"]["source"] == "both"
    assert "rankings on the first 5 of 6 sample(s)" in md and "all 5" not in md
    assert "add up" not in s["verdict"]["text"] and "node_type=" not in md
    other = runall(compensated["q"], compensated["folder"], save_dir=tmp_path / "out", top=1, progress=False)
    assert other["verdict"]["source"] == "both"
    assert other["verdict"]["text"].startswith("weights and activations each cause a comparable part of the loss")
    assert ": fix the worst nodes of each, or rank operator nodes (-t node) to see where they add up" in \
        other["verdict"]["text"]
    assert "rankings on all 6 sample(s)" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.parametrize("convs,pair,at", [(1, "x_Q", "conv1"), (2, "c1_Q", "conv2")])
def test_a_node_owning_its_output_pair_has_its_own_error_where_that_pair_is_its(tmp_path, convs, pair, at):
    """Conv -> c -> its own pair -> model output (a detector head's layout): runall said
    "inherited at conv (local 0.99990089, fully quantized 0.9964487)" with nothing upstream,
    the local error read before the Conv's own pair and the accumulated one after it. Both
    are read after it now: the local error that of a plain session keeping the Conv's input
    pairs and its output pair only, and the error the Conv's own."""
    q, data = builders.owned_output_net(tmp_path / "q.onnx", convs=convs)
    out = runall(str(q), data, save_dir=tmp_path / "out", node_type="activation", progress=False)
    item = next(it for it in out["verdict"]["nodes"] if it["node"] == pair)
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(builders.rewire(q), feeds, outputs=["y"])
    own = builders.run_model(builders.rewire(q, keep={pair, f"W{convs}_Q", "c_Q"}), feeds, outputs=["y"])
    every = builders.run_model(builders.rewire(q, keep=set(builders.qdq_pairs(q))), feeds, outputs=["y"])
    assert item["at"] == at and item["origin"] == "local", item
    assert item["local"] == pytest.approx(builders.worst_cosine(ref, own), abs=1e-6)
    assert item["accumulated"] == pytest.approx(builders.worst_cosine(ref, every), abs=1e-6)
    assert f"own at `{at}`" in (tmp_path / "out" / "summary.md").read_text()
    # and the output pair itself, which no operator reads, at the operator computing it (blank before)
    owned = next(it for it in out["verdict"]["nodes"] if it["node"] == "c_Q")
    assert (owned["at"], owned["origin"], owned["local"]) == (at, "local", item["local"]), owned


@pytest.mark.parametrize("node_type,row", [("node", "cat"), ("activation", "cat_Q")])
def test_a_concat_of_float_tensors_owning_its_output_pair_has_that_pairs_error_as_its_own(tmp_path, node_type, row):
    """Concat(x, conv's output) -> its own pair -> model output: the Concat reads no pair, so
    it had no local error and its row no origin (blank in summary.json and summary.md),
    though the pair's loss is its own. Its local error is now that of a plain session of the
    model keeping that pair only (0.99815, fully quantized 0.99808: the conv's error on top)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "W")]
    nodes = []
    x, w = builders.add_pair(inits, nodes, "x", 0.03, np.int8(0)), builders.add_pair(inits, nodes, "W", 0.01, np.int8(0))
    nodes += [helper.make_node("Conv", [x, w], ["c"], pads=[1] * 4, name="conv"),
              helper.make_node("Concat", ["x", "c"], ["cat"], axis=1, name="cat")]
    builders.add_pair(inits, nodes, "cat", 0.3, np.int8(0), out="y")
    graph = helper.make_graph(nodes, "cat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    q = builders.save_model(graph, tmp_path / "q.onnx")
    data = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(5)]}
    debug.runall(str(q), data, save_dir=tmp_path / "out", node_type=node_type, progress=False)
    item = next(it for it in json.loads((tmp_path / "out" / "summary.json").read_text())["verdict"]["nodes"]
                if it["node"] == row)
    feeds = [{"x": x} for x in data["x"]]
    ref = builders.run_model(builders.rewire(q), feeds)
    own = builders.run_model(builders.rewire(q, keep={"cat_Q"}), feeds)
    every = builders.run_model(builders.rewire(q, keep=set(builders.qdq_pairs(q))), feeds)
    assert item["at"] == "cat" and item["origin"] == "local", item
    assert item["local"] == pytest.approx(builders.worst_cosine(ref, own), abs=1e-6)
    assert item["accumulated"] == pytest.approx(builders.worst_cosine(ref, every), abs=1e-6)
    assert "own at `cat`" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.parametrize("sub", ["distributions", "channelwise"])
def test_a_data_folder_named_as_runalls_own_subfolder_is_refused_before_any_work(setup, tmp_path, sub):
    """Data in ``<save_dir>/distributions`` (runall -s . beside it) were refused only when the
    first figure went there, after the rankings, with summary and sensitivity files already
    written beside the data; now before anything is written."""
    data = builders.save_folder(setup["data"], tmp_path / sub)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(PTQError, match=f"'{re.escape(str(data))}' is the calibration data folder"):
        runall(setup["qa"], data, save_dir=tmp_path, top=1, progress=False)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_file_where_runall_makes_its_subfolder_is_refused_before_any_work(setup, tmp_path):
    """A file ``distributions`` in the folder given failed the run at its first figure, after
    the rankings had written their files; now before anything is written."""
    (tmp_path / "distributions").write_text("mine")
    with pytest.raises(PTQError, match="runall's folder '.*distributions' is a file; give a folder"):
        runall(setup["qa"], setup["folder"], save_dir=tmp_path, top=1, progress=False)
    assert sorted(tmp_path.iterdir()) == [tmp_path / "distributions"]
    assert (tmp_path / "distributions").read_text() == "mine"


def _dequantized_weights(dynamic, fp, out):
    """``fp`` with each MatMul's weight replaced by the codes, zero point and scale its
    MatMulInteger in ``dynamic`` reads, dequantized with numpy: the dynamic model's weights
    alone, its activations float."""
    q = onnx.load(str(dynamic))
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    scale_of = {}  # a DynamicQuantizeLinear's scale output -> the weight scale multiplied with it
    for n in q.graph.node:
        if n.op_type == "Mul":
            a, b = n.input
            if b in inits:
                scale_of[a] = inits[b]
    producer = {o: n for n in q.graph.node for o in n.output}
    weights = []
    for n in (n for n in q.graph.node if n.op_type == "MatMulInteger"):
        codes, zero = inits[n.input[1]].astype(np.float32), inits[n.input[3]].astype(np.float32)
        weights.append((codes - zero) * scale_of[producer[n.input[0]].output[1]])
    m = onnx.load(str(fp))
    by_name = {t.name: t for t in m.graph.initializer}
    matmuls = [n for n in m.graph.node if n.op_type == "MatMul"]
    assert len(matmuls) == len(weights)
    for n, w in zip(matmuls, weights):
        by_name[n.input[1]].CopyFrom(numpy_helper.from_array(w.astype(np.float32), n.input[1]))
    onnx.save(m, str(out))
    return out


def test_a_dynamic_models_spread_weight_loss_gets_the_step_with_a_search_suggest_accepts(tmp_path):
    """A quantize_dynamic model whose weight loss no single weight explains got no spread step
    (kinds no node of which can widen to int16 were skipped), and the step's search was always
    --remedy int16, which suggest refuses for a dynamic model ("no node ... can take the 'int16'
    remedy"): the step is said, with the loss of the dynamic weights alone as a plain session
    on the dequantized codes gives it, and its search keeps nodes in float, which the CLI runs."""
    import shlex

    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    fp, src = _tanh_stack(tmp_path / "f.onnx", rng, 12)
    m = onnx.load(str(fp))
    for t in m.graph.initializer:  # an outlier per weight: a coarse per-tensor int8 grid in every layer
        w = numpy_helper.to_array(t).copy()
        w[0, 0] = 30 * np.abs(w).max()
        t.CopyFrom(numpy_helper.from_array(w, t.name))
    onnx.save(m, str(fp))
    q = tmp_path / "q.onnx"
    quantize_dynamic(str(fp), str(q), weight_type=QuantType.QInt8)
    data = {"x": [(3 * rng.standard_normal((1, 4, WIDTH))).astype(np.float32) for _ in range(6)]}
    calib = builders.save_folder(data, tmp_path / "calib")
    v = runall(q, calib, float_model=fp, save_dir=tmp_path / "out", top=3, progress=False)["verdict"]
    assert v["source"] == "weight"
    [step] = [s for s in v["next_steps"] if "spread over many weight nodes" in s]
    only = _dequantized_weights(q, fp, tmp_path / "weights_only.onnx")
    feeds = [{"x": x} for x in data["x"]]
    loss = 1 - builders.pooled_cosine([builders.run_model(fp, f)[src] for f in feeds],
                                      [builders.run_model(only, f)[src] for f in feeds])
    assert step.startswith(f"weight quantization alone loses {loss:.3g} on the 6 calibration sample(s)"), step
    command = shlex.split(re.search(r"`(ptq-debug suggest [^`]*)`", step).group(1))
    assert command[-2:] == ["--remedy", "float"] and "to keep in float" in step
    assert cli.main(command[1:] + ["--quiet"]) == 0

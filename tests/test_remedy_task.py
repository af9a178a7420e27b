"""A task metric as the remedy's target, scored by a function that knows nothing of pytest_ptq.

Planted: the plain conv_net with r1's activation scale 64 times too coarse. The task is
top-1 accuracy against labels: the float model's class for three samples in four, a wrong
class for the fourth, so the float model scores 0.75 and a ratio target of 0.99 asks the
quantized model for 0.7425 (every sample the float model gets right), not 0.99.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import onnxruntime as ort
import pytest

import builders
from pytest_ptq.cli import main
from pytest_ptq.remedy import suggest_remedy

N = 24

EVALUATE = '''
import onnxruntime as ort

_float = {}


def top1(run, data):
    """Accuracy against labels: the float model's class, shifted by one for every fourth sample."""
    if "s" not in _float:
        _float["s"] = ort.InferenceSession(FLOAT, providers=["CPUExecutionProvider"])
    hits = 0
    for k, feeds in enumerate(data):
        label = int(_float["s"].run(["prob"], {"x": feeds["x"]})[0].argmax())
        if k % 4 == 3:
            label = (label + 1) % 10
        hits += int(int(run(feeds)["prob"].argmax()) == label)
    return hits / len(data)
'''


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("task")
    cal, held = builders.samples(N), builders.samples(N, seed=7)
    fpath = builders.conv_net(root / "float.onnx")
    qpath = builders.quantize(fpath, root / "qdq.onnx", cal)
    planted = builders.scaled(qpath, root / "planted.onnx", "r1_scale", 64)
    (root / "task.py").write_text(f"FLOAT = {str(fpath)!r}\n" + textwrap.dedent(EVALUATE))
    namespace = {}
    exec((root / "task.py").read_text(), namespace)
    return {"root": root, "float": fpath, "qdq": planted, "cal": cal, "held": held, "top1": namespace["top1"],
            "held_dir": builders.save_folder(held, root / "held"), "cal_dir": builders.save_folder(cal, root / "calib")}


def top1_of(t, model, data):
    """The task score of a model run in a plain session, Q/DQ as float arithmetic (fused into
    onnxruntime's uint8 x int8 kernels, they saturate on x86 CPUs without AVX-VNNI)."""
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    sess = ort.InferenceSession(model.SerializeToString() if hasattr(model, "SerializeToString") else str(model),
                                so, providers=["CPUExecutionProvider"])
    return t["top1"](lambda feeds: {"prob": sess.run(["prob"], feeds)[0]},
                     [{"x": a} for a in data["x"]])


def rewired(t, remedied):
    pairs = set(builders.qdq_pairs(t["qdq"]))
    return builders.rewire(t["qdq"], keep=pairs - set(remedied))


def test_a_ratio_task_target_is_judged_on_held_out_data(task):
    t = task
    assert top1_of(t, t["float"], t["held"]) == 0.75
    baseline = top1_of(t, rewired(t, []), t["held"])
    assert baseline < 0.99 * 0.75
    r = suggest_remedy(str(t["qdq"]), t["cal"], heldout=t["held"], evaluate=t["top1"], min_ratio=0.99)
    assert r.objective == {"metric": "top1", "kind": "task", "min_ratio": 0.99, "guide": "cosine-similarity"}
    held = r.figures["held-out"]
    assert held["float"] == 0.75 and held["target"] == pytest.approx(0.99 * 0.75)
    assert held["before"] == baseline
    assert r.met and r.nodes == ["r1_QuantizeLinear"]
    assert held["after"] == top1_of(t, rewired(t, r.nodes), t["held"]) >= held["target"]
    # the output metric that ranked the nodes is recorded beside the task score
    cos = held["cosine-similarity"]
    assert cos["before"] < cos["after"]
    assert r.failure() is None and "top1 0.75 on held-out data meets the target 0.99 x float" in r.summary()


def test_an_absolute_task_target(task):
    t = task
    r = suggest_remedy(str(t["qdq"]), t["cal"], heldout=t["held"], evaluate=t["top1"], target=0.7)
    assert r.met and r.figures["held-out"]["target"] == 0.7 and r.target_text == "0.7"
    assert r.figures["held-out"]["after"] == top1_of(t, rewired(t, r.nodes), t["held"])


def test_task_target_arguments_are_checked(task):
    from pytest_ptq.errors import PTQError

    t = task
    with pytest.raises(PTQError, match="not both"):
        suggest_remedy(str(t["qdq"]), t["cal"], evaluate=t["top1"], target=0.7, min_ratio=0.99)
    with pytest.raises(PTQError, match="give evaluate= with it"):
        suggest_remedy(str(t["qdq"]), t["cal"], min_ratio=0.99)
    # text that reads as a number and a bool were taken as scores by the search (the plugin's
    # accuracy check refused them): one rule for every face
    for returned in ("high", "0.5", True, 0.9 + 0j, np.complex64(0.9), np.timedelta64(1, "s")):
        with pytest.raises(PTQError, match="must return one number"):
            suggest_remedy(str(t["qdq"]), t["cal"], evaluate=lambda run, data, r=returned: r, min_ratio=0.5)


def test_cli_evaluate_with_a_ratio_and_its_exit_sentence(task, tmp_path, capsys, monkeypatch):
    t = task
    monkeypatch.chdir(t["root"])
    args = ["suggest", str(t["qdq"]), str(t["cal_dir"]), "--heldout", str(t["held_dir"]), "--evaluate",
            "task.py:top1", "--quiet"]
    assert main(args + ["--min-ratio", "0.99", "--json", str(tmp_path / "r.json")]) == 0
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["nodes"] == ["r1_QuantizeLinear"] and saved["figures"]["held-out"]["float"] == 0.75
    capsys.readouterr()
    # a score no set reaches: the sentence says where and how far
    assert main(args + ["--target", "0.8", "--candidates", "w1_QuantizeLinear", "--no-save"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("exit 1: no set found meets the target 0.8 on held-out data: the best, ")
    assert main(args + ["--target-cosine", "0.99", "--no-save"]) == 2
    assert "not --target-cosine" in capsys.readouterr().err
    assert main(["suggest", str(t["qdq"]), str(t["cal_dir"]), "--evaluate", "missing.py:top1", "--no-save"]) == 2
    assert "does not exist" in capsys.readouterr().err
    # named as the option it was given by, not as a contract's field
    assert main(["suggest", str(t["qdq"]), str(t["cal_dir"]), "--evaluate", "nomodule_here:top1", "--no-save"]) == 2
    assert "error: --evaluate module 'nomodule_here' cannot be imported" in capsys.readouterr().err
    # a function that raises: one sentence naming its line, no traceback through ours
    (t["root"] / "boom.py").write_text("def top1(run, data):\n    return 1 / 0\n")
    assert main(["suggest", str(t["qdq"]), str(t["cal_dir"]), "--evaluate", "boom.py:top1", "--no-save",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the evaluation function top1 raised ZeroDivisionError at boom.py:2: division by zero" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    # feeds it built that onnxruntime refuses: its line and what it passed, not the data's files
    (t["root"] / "cast.py").write_text("def top1(run, data):\n    outs = [run({'x': f['x'].astype(float)}) for f in "
                                       "data]\n    return 1.0\n")
    assert main(["suggest", str(t["qdq"]), str(t["cal_dir"]), "--evaluate", "cast.py:top1", "--no-save",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert ("the evaluation function top1 called run() at cast.py:2 with feeds onnxruntime refuses for " in err
            and "expected: (tensor(float))): it passed 'x' float64 [1, 3, 16, 16] where the model takes float32 "
                "[1, 3, 16, 16]; make the feeds it builds fit the model's inputs" in err), err
    assert "check the data's" not in err and len(err.strip().splitlines()) == 1

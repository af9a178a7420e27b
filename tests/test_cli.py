"""The ptq-debug command line: in-process through cli.main and as a real subprocess."""

from __future__ import annotations

import json
import os
import warnings
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ptq.cli import main
from pytest_ptq.engine import Engine
from pytest_ptq.sensitivity import get_sensitivity_of_nodes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paths(zoo):
    return {"model": str(zoo.qdq("qdq")), "data": str(zoo.folder("qdq")), "float": str(zoo.float("qdq")),
            "default": str(zoo.qdq("default"))}


def test_sensitivity_options_reach_the_analysis(paths, tmp_path, capsys):
    out = tmp_path / "sens.json"
    nodes = ["logits_QuantizeLinear", "r2_QuantizeLinear", "c2_QuantizeLinear"]
    rc = main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "-m", "cosine-similarity", "mse",
               "-t", "activation", "--output-node", "cls=prob[:, 4:]", "--data-num", "2",
               "-i", *nodes, "--json", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    saved = json.loads(out.read_text())
    assert (saved["metrics"], saved["node_type"], saved["outputs"], saved["samples"]) == (
        ["cosine-similarity", "mse"], "activation", ["cls"], 2)
    assert sorted(saved["ranking"]) == sorted(nodes)
    # the same call through the API gives the same numbers
    api = get_sensitivity_of_nodes(Engine(paths["model"], paths["data"], data_num=2),
                                   ["cosine-similarity", "mse"], output_node="cls=prob[:, 4:]",
                                   node_type="activation", interested_nodes=nodes)
    assert saved["ranking"] == list(api)
    assert saved["values"] == {k: dict(v) for k, v in api.items()}
    # the printed table is the seed's, in ranking order
    lines = [line for line in captured.out.splitlines() if line.startswith("| ")]
    assert "threshold" in lines[0] and "bit" in lines[0]
    assert [line.split("|")[1].strip() for line in lines[1:]] == saved["ranking"]
    assert f"wrote {out}" in captured.out


def test_json_dash_puts_the_json_alone_on_stdout(paths, tmp_path, capsys, monkeypatch):
    """``--json -``: standard output holds the JSON the file would (and nothing else, so a
    pipe can parse it), the table goes to standard error, and no file named '-' appears."""
    monkeypatch.chdir(tmp_path)
    args = ["get-sensitivity-of-nodes", paths["model"], paths["data"], "-t", "activation", "--data-num", "2"]
    assert main([*args, "--json", "file.json", "--quiet"]) == 0
    capsys.readouterr()
    assert main([*args, "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == json.loads((tmp_path / "file.json").read_text())
    assert "| " in captured.err and "wrote standard output" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.json"]


def test_memory_and_workers_reach_the_engine(paths, tmp_path, capsys, monkeypatch):
    """--memory / --workers build the engine that way; the ranking is the default's to
    float rounding (fast mode for this small net)."""
    built = []

    class Recording(Engine):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            built.append((self.shared.low_memory, self.workers))

    monkeypatch.setattr("pytest_ptq.engine.Engine", Recording)
    ranks = {}
    for extra in ([], ["--memory", "low", "--workers", "2"]):
        out = tmp_path / f"sens{len(extra)}.json"
        rc = main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "-t", "activation", "--json", str(out),
                   "--quiet", *extra])
        assert rc == 0, capsys.readouterr().err
        ranks[len(extra)] = json.loads(out.read_text())["values"]
    assert built == [(False, "auto"), (True, 2)]
    assert ranks[4].keys() == ranks[0].keys() and len(ranks[0]) >= 3
    for name, values in ranks[0].items():
        assert ranks[4][name]["cosine-similarity"] == pytest.approx(values["cosine-similarity"], abs=1e-6), name
    for bad, message in ((["--memory", "tiny"], "--memory: must be one of auto, low, fast, got 'tiny'"),
                         (["--workers", "none"], "--workers: must be 'auto' or a whole number >= 1, got 'none'")):
        with pytest.raises(SystemExit) as exit_:
            main(["runall", paths["model"], paths["data"], *bad])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err.splitlines()[-1]
    with pytest.raises(SystemExit):  # check-data builds no engine of its own settings
        main(["check-data", paths["model"], paths["data"], "--memory", "low"])
    assert "unrecognized arguments: --memory" in capsys.readouterr().err


def test_acc_error_options(paths, tmp_path, capsys):
    rc = main(["plot-acc-error", paths["model"], paths["data"], "-q", "weight", "activation", "--average",
               "-s", str(tmp_path / "plots"), "--json", str(tmp_path / "curves.json"), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    curves = json.loads((tmp_path / "curves.json").read_text())
    assert list(curves["values"]) == ["weight only", "activation only"] and curves["average_mode"]
    assert Path(curves["png"]).stat().st_size > 10_000
    # the figure at the model's output, wherever it sits in execution order
    import onnx

    [output] = [o.name for o in onnx.load(paths["model"]).graph.output]
    k = curves["tensors"].index(output)
    assert captured.out.splitlines()[0].startswith(
        f"weight only: cosine-similarity at the output {output} {curves['values']['weight only'][k]:.6g}; worst at ")

    rc = main(["plot-acc-error", paths["model"], paths["data"], "-nq", "conv2,fc", "r1_QuantizeLinear",
               "-s", str(tmp_path / "plots"), "--json", str(tmp_path / "nq.json"), "--quiet", "--no-local"])
    assert rc == 0
    curves = json.loads((tmp_path / "nq.json").read_text())
    assert list(curves["values"]) == ["all but conv2+fc", "all but r1_QuantizeLinear"]
    assert "r1_QuantizeLinear" not in curves["configs"]["all but r1_QuantizeLinear"]
    assert "w2_QuantizeLinear" not in curves["configs"]["all but conv2+fc"]
    assert curves["local"] is None


@pytest.mark.parametrize("words", [["[['conv2', 'fc'], ['r1_QuantizeLinear']]"],  # the seed's form, quoted
                                   ["[[conv2,", "fc],", "[r1_QuantizeLinear]]"]])  # and as the shell splits it
def test_the_seeds_bracketed_lists_are_taken(paths, tmp_path, words, capsys):
    """The seed writes -q ['weight', 'activation'] and -m ['cosine-similarity','mse']; they
    were read as node and metric names ('[weight')."""
    assert main(["plot-acc-error", paths["model"], paths["data"], "-nq", *words, "-s", str(tmp_path),
                 "--json", str(tmp_path / "nq.json"), "--quiet", "--no-local"]) == 0, capsys.readouterr().err
    curves = json.loads((tmp_path / "nq.json").read_text())
    assert list(curves["values"]) == ["all but conv2+fc", "all but r1_QuantizeLinear"]
    assert main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "-m", "[cosine-similarity,", "mse]",
                 "--json", str(tmp_path / "s.json"), "--quiet"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "s.json").read_text())["metrics"] == ["cosine-similarity", "mse"]


@pytest.mark.parametrize("words,expected", [
    # exporters' names: runs between their slashes and colons read as bare words were quoted inside the quotes
    (["[['/model/backbone/conv1/Conv', 'model/conv2d/BiasAdd:0'], ['a b']]"],
     [["/model/backbone/conv1/Conv", "model/conv2d/BiasAdd:0"], ["a b"]]),
    (['["/m/Conv",', "onnx::Conv_12]"], ["/m/Conv", "onnx::Conv_12"]),
    (["[[conv2,", "fc],", "[r1_QuantizeLinear]]"], [["conv2", "fc"], ["r1_QuantizeLinear"]]),
    (["/m/Conv"], ["/m/Conv"]),  # no list: the words as given
])
def test_a_bracketed_list_keeps_quoted_names_whole(words, expected):
    from pytest_ptq.cli.args import seed_list

    assert seed_list(words) == expected


@pytest.mark.parametrize("command,options", [
    ("get-sensitivity-of-nodes", ["--metrics", "--node-type", "--output-node", "--interested-nodes",
                                  "--data-num", "--json", "--float-model"]),
    ("plot-acc-error", ["--quantize-node", "--non-quantize-node", "--average", "--metric", "--save-dir",
                        "--data-num", "--float-model"]),
])
def test_help(command, options, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "-h"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in options:
        assert option in out, option


def _one_line_error(capsys, argv, *needles):
    __tracebackhide__ = True
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_bad_inputs_exit_2_with_one_line(paths, tmp_path, capsys):
    sens = ["get-sensitivity-of-nodes"]
    _one_line_error(capsys, sens + [str(tmp_path / "missing.onnx"), paths["data"]], "missing.onnx", "does not exist")
    _one_line_error(capsys, sens + [paths["float"], paths["data"]], "no QuantizeLinear/DequantizeLinear")
    _one_line_error(capsys, sens + [paths["model"], str(tmp_path / "nodata")], "nodata", "does not exist")
    _one_line_error(capsys, sens + [paths["model"], paths["data"], "-i", "conv_2"], "'conv2'")
    _one_line_error(capsys, sens + [paths["model"], paths["data"], "-o", "prob[:, a]"], "not an integer")
    line = _one_line_error(capsys, sens + [paths["default"], paths["data"]], "--float-model")
    assert "QDQKeepRemovableActivations" in line
    _one_line_error(capsys, ["plot-acc-error", paths["model"], paths["data"], "-q", "conv_2",
                             "-s", str(tmp_path / "p")], "unknown node 'conv_2'")


def test_argparse_errors_exit_2_without_traceback(paths, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "--data-num", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--data-num: must be at least 1, got 0" in err.splitlines()[-1]


def test_folded_model_works_with_float_model(paths, zoo, capsys):
    rc = main(["get-sensitivity-of-nodes", paths["default"], paths["data"], "--float-model",
               str(zoo.float("default")), "-t", "weight", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0 and "w2_DequantizeLinear" in out


def _run(*args):
    return subprocess.run([sys.executable, "-m", "pytest_ptq", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_real_subprocess(paths, tmp_path):
    out = tmp_path / "w.json"
    proc = _run("get-sensitivity-of-nodes", paths["model"], paths["data"], "-t", "weight", "--data-num", "2",
                "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(out.read_text())
    assert saved["node_type"] == "weight" and len(saved["ranking"]) == 3 and saved["samples"] == 2
    bad = _run("plot-acc-error", paths["model"], str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "nowhere" in bad.stderr


def test_version(capsys):
    from pytest_ptq import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"ptq-debug {__version__}"


def test_list_nodes_caps_the_consumers_of_a_shared_pair(tmp_path, capsys):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(128), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="x_Q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="x_DQ")]
    nodes += [helper.make_node("Relu", ["d"], [f"r{k}"], name=f"relu_block{k}") for k in range(5)]
    nodes.append(helper.make_node("Sum", [f"r{k}" for k in range(5)], ["y"], name="sum"))
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    path = tmp_path / "shared.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    assert main(["list-nodes", str(path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "| x_Q " in line)
    assert "relu_block0,relu_block1 (+3 more)" in row and "relu_block2" not in row


@pytest.mark.parametrize("reduce_range", [False, True])
def test_list_nodes_reads_a_reduce_range_weight_on_its_half_grid(tmp_path, capsys, reduce_range):
    """reduce_range stores int8 weights on codes [-64, 64]: the threshold was 127 steps, twice
    the weight's largest magnitude, and nothing said the weight had 7 bits."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import builders

    rng = np.random.default_rng(0)
    w = (0.1 * rng.standard_normal((16, 32))).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
                              [numpy_helper.from_array(w, "w")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(4)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", data, reduce_range=reduce_range, keep_float=False)
    assert main(["list-nodes", str(q)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| w_"))
    threshold = float(row.split("|")[4])
    assert threshold == pytest.approx(np.abs(w).max(), rel=0.01)  # the weight's own reach, either way
    assert ("int8 [-64, 64]" in row and "reduce_range" in out) == reduce_range
    # the distribution's range lines and threshold too
    from pytest_ptq.distribution import plot_distribution

    [d] = plot_distribution(tmp_path / "plots", Engine(str(q), data, float_model=str(fp)),
                            nodes_list=["w_DequantizeLinear"]).values()
    assert d["threshold"] == pytest.approx(np.abs(w).max(), rel=0.01)
    assert -d["range_lo"] == pytest.approx(np.abs(w).max(), rel=0.01)


def test_node_lists_take_exporters_names_whole_and_their_plots_stay_apart(zoo, tmp_path, capsys):
    """Names with brackets, commas, quotes, spaces, dots and slashes, as exporters write them:
    a value that is a node's name is that node; curves of two names that read alike on disk
    get files of their own."""
    import onnx

    names = {"relu1": "Relu,'quoted'", "conv2": "Conv2d[conv 2]", "conv1": "/m/conv_1", "fc": "/m/conv.1"}
    model = onnx.load(str(zoo.qdq("qdq")))
    for n in model.graph.node:
        n.name = names.get(n.name, n.name)
    onnx.save(model, str(tmp_path / "m.onnx"))
    args = [str(tmp_path / "m.onnx"), str(zoo.folder("qdq")), "--quiet", "-s", str(tmp_path / "out")]
    assert main(["plot-distribution", *args, "-n", "Conv2d[conv 2]", "Relu,'quoted'"]) == 0, capsys.readouterr().err
    shown = capsys.readouterr().out
    assert "| Conv2d[conv 2] " in shown and "| Relu,'quoted' " in shown
    pngs = set()
    for name in ("Relu,'quoted'", "/m/conv_1", "/m/conv.1"):
        assert main(["plot-acc-error", *args, "-q", name]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert out.startswith(f"{name}: cosine-similarity at the output"), out
        pngs.add(out.split("wrote ")[1].split()[0])
    assert len(pngs) == 3 and all(Path(p).is_file() for p in pngs)


def test_more_samples_asked_than_held_says_so_in_one_line(paths, capsys):
    """``--data-num`` above the data's count runs on every sample (the figures say how many)
    and says why in one line of standard error, on the CLI as through the API."""
    from pytest_ptq.data import PTQDataWarning

    held = len(os.listdir(Path(paths["data"]) / os.listdir(paths["data"])[0]))
    assert main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "-t", "weight", "--data-num", "500",
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    line = f"warning: 500 calibration samples were asked for, but {paths['data']!r} holds {held}; all {held} are used"
    assert [x for x in err.splitlines() if "warning: 500" in x] == [f"ptq-debug get-sensitivity-of-nodes: {line}"]
    # where warnings are errors (PYTHONWARNINGS=error) too: it was an "internal error", exit 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "-t", "weight", "--data-num", "500",
                     "--quiet"]) == 0
    assert f"ptq-debug get-sensitivity-of-nodes: {line}" in capsys.readouterr().err.splitlines()
    # an error filter for that warning alone: the user's choice, one sentence, not an "internal error"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="500 calibration", category=PTQDataWarning)
        assert main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "-t", "weight", "--data-num", "500",
                     "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"ptq-debug get-sensitivity-of-nodes: error: {line[len('warning: '):]} (warnings "
                                    "are errors in this run)") and "Traceback" not in err, err
    with warnings.catch_warnings():  # and silenced where asked
        warnings.simplefilter("ignore")
        assert main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "-t", "weight", "--data-num", "500",
                     "--quiet"]) == 0
    assert "warning: 500" not in capsys.readouterr().err
    with pytest.warns(PTQDataWarning, match=f"holds {held}; all {held} are used"):
        Engine(paths["model"], paths["data"], data_num=500)
    with pytest.warns(PTQDataWarning):
        get_sensitivity_of_nodes(Engine(paths["model"], paths["data"]), node_type="weight", data_num=500)


def _exits_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err, err
    return err


def test_no_option_is_taken_for_another_by_a_prefix(paths, tmp_path, capsys):
    """argparse took a prefix of a long option for the option (``--out`` as ``--output-node``),
    and a one-dash prefix whatever it was told: ``-n``, plot-distribution's node option, read
    as plot-acc-error's ``-nq``, the opposite configuration, with status 0."""
    _exits_2(capsys, ["plot-acc-error", paths["model"], paths["data"], "-n", "c2_QuantizeLinear", "-s",
                      str(tmp_path / "p")], "-n is not an option of plot-acc-error")
    _exits_2(capsys, ["get-sensitivity-of-nodes", paths["model"], paths["data"], "--interested", "c2_QuantizeLinear"],
             "unrecognized arguments: --interested")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("command, option, given, message", [
    ("plot-acc-error", "-q/--quantize-node", "[[]]", "must be a list of names or of lists of names, got []"),
    ("plot-acc-error", "-nq/--non-quantize-node", "[['c2_QuantizeLinear'], []]",
     "must be a list of names or of lists of names, got []"),
    # a group where names belong: a traceback (unhashable list) before
    ("plot-distribution", "-n/--nodes", "[['c2_QuantizeLinear']]", "must be a list of names, got ['c2_QuantizeLinear']"),
])
def test_a_seed_list_of_the_wrong_shape_names_the_option(paths, tmp_path, capsys, command, option, given, message):
    """The analysis named its Python parameter (``quantize_node must be ...``), which no
    command line has."""
    err = _exits_2(capsys, [command, paths["model"], paths["data"], option.split("/")[0], given, "-s",
                            str(tmp_path / "p")], f"argument {option}: {message}")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


def test_a_list_option_given_twice_joins_its_lists(paths, tmp_path):
    """``-i A -i B`` ranked B alone, ``-m cosine-similarity -m mse`` reported mse alone."""
    out = tmp_path / "twice.json"
    assert main(["get-sensitivity-of-nodes", paths["model"], paths["data"], "-t", "activation", "--data-num", "2",
                 "-i", "c2_QuantizeLinear", "-i", "r2_QuantizeLinear", "-m", "cosine-similarity", "-m", "mse",
                 "--json", str(out), "--quiet"]) == 0
    saved = json.loads(out.read_text())
    assert sorted(saved["ranking"]) == ["c2_QuantizeLinear", "r2_QuantizeLinear"]
    assert saved["metrics"] == ["cosine-similarity", "mse"]


def test_an_error_of_the_tool_itself_exits_3_apart_from_a_finding(paths, capsys, monkeypatch):
    """A bug exited 1 with a traceback, the status check-data, stages and suggest give a
    finding: CI could not tell them apart. Its traceback stays (for the report), then one line."""
    import pytest_ptq.cli.listing as listing

    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(listing, "format_table", broken)
    assert main(["list-nodes", paths["model"]]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith(
        "ptq-debug list-nodes: internal error (ZeroDivisionError: division by zero); this is a bug in pytest-ptq")


def test_check_data_refuses_a_threshold_without_held_out_data(paths, capsys):
    """--threshold and --metric judge only the held-out comparison: without --heldout they were
    ignored and the data read 'no problem found' against a threshold the model misses."""
    for extra in (["--threshold", "0.9999"], ["--metric", "mse"]):
        assert main(["check-data", paths["model"], paths["data"], "--quiet", *extra]) == 2
        assert "judge the held-out comparison alone; give held-out data (--heldout)" in capsys.readouterr().err


def test_an_empty_ranking_says_why(tmp_path, capsys):
    """A model whose only pair is a weight's, ranked by activation: an empty table alone."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).integers(-127, 128, (4, 3)).astype(np.int8)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], name="w_DQ"),
         helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(np.array(0.01, np.float32), "ws")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "w.onnx"))
    (tmp_path / "d" / "x").mkdir(parents=True)
    for i in range(2):
        np.save(tmp_path / "d" / "x" / f"{i}.npy", np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32))
    assert main(["get-sensitivity-of-nodes", str(tmp_path / "w.onnx"), str(tmp_path / "d"), "-t", "activation",
                 "--quiet"]) == 0
    assert ("no activation nodes to rank in this model (1 weight, 0 activation, 0 dynamic calibration nodes); try "
            "another -t") in capsys.readouterr().out


def test_an_output_named_like_another_output_of_the_command_is_refused(paths, tmp_path, capsys):
    """``--json`` given the name of a figure the command draws replaced the figure with the
    JSON and printed "wrote" twice."""
    figure = tmp_path / "pd" / "distribution_c2_QuantizeLinear.png"
    assert main(["plot-distribution", paths["model"], paths["data"], "--quiet", "-n", "c2_QuantizeLinear",
                 "-s", str(tmp_path / "pd"), "--json", str(figure)]) == 2
    assert "is written twice by this command, as two of its outputs" in capsys.readouterr().err
    assert figure.read_bytes().startswith(b"\x89PNG")


def test_list_nodes_writes_what_its_table_shows_as_json(paths, tmp_path, capsys):
    """Scripts had only the boxed table, whose cells are cut to fit."""
    from pytest_ptq.model import QuantModel

    assert main(["list-nodes", paths["model"], "--json", str(tmp_path / "n.json")]) == 0
    table = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    saved = json.loads((tmp_path / "n.json").read_text())
    qm = QuantModel(paths["model"])
    assert [n["name"] for n in saved["calibration_nodes"]] == table[1:] == list(qm.calibration)
    assert [n["consumers"] for n in saved["calibration_nodes"]] == [list(c.consumers) for c in qm.calibration.values()]
    assert saved["normal_nodes"] == list(qm.normal) and saved["format"] == "QDQ"


def test_metric_names_are_checked_and_made_canonical_as_they_are_parsed(paths, tmp_path, capsys):
    """``suggest --metric cos`` (a documented alias) read "needs --target VALUE", as did a
    misspelt metric; ``-m`` took a misspelt one until the model had compiled."""
    import argparse

    from pytest_ptq.cli.distribution import configure_distribution, node_names

    assert main(["suggest", paths["model"], paths["data"], "--metric", "cos", "--data-num", "2",
                 "--no-save", "--no-requantize", "--quiet", "--json", str(tmp_path / "r.json")]) in (0, 1)
    assert json.loads((tmp_path / "r.json").read_text())["metric"] == "cosine-similarity"
    capsys.readouterr()
    for argv in (["suggest", paths["model"], paths["data"], "--metric", "cosin"],
                 ["get-sensitivity-of-nodes", paths["model"], paths["data"], "-m", "cosine-similarity", "msee"]):
        with pytest.raises(SystemExit) as exc:  # argparse's, at start-up
            main(argv)
        assert exc.value.code == 2 and f"unknown metric {argv[-1]!r}" in capsys.readouterr().err
    # the seed's quoted list keeps names with spaces and commas whole, as -i and -q do
    p = argparse.ArgumentParser()
    configure_distribution(p)
    args = p.parse_args(["m.onnx", "calib", "-n", "['conv 1', 'relu,2']"])
    assert node_names(args.nodes, {"conv 1", "relu,2"}) == ["conv 1", "relu,2"]

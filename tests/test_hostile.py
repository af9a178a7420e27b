"""Hostile input: every case ends in one sentence, never a traceback, and touches no input.

Each case runs in a fresh copy of one project (a QDQ model, its float model, a model with
external data, calibration and held-out folders, and folders of broken samples) through the
CLI (in-process and as real processes), the API or the plugin, and asserts the exit code,
one line of message naming what is wrong, no traceback, the hash of every file that was
there before, and that nothing appeared or changed outside the outputs the case declares.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import builders
from test_plugin import run as run_pytest

from pytest_ptq import debug as dbg
from pytest_ptq.analysis import Analysis, AnalysisKey
from pytest_ptq.checks import check_accuracy, check_baseline, check_stages
from pytest_ptq.cli import BROKEN_PIPE, main
from pytest_ptq.errors import PTQError

ROOT = Path(__file__).resolve().parents[1]


class Payload:
    """Unpickling this creates the file ``pwned``: the tree check proves nothing unpickled it."""

    def __reduce__(self):
        return (open, ("pwned", "w"))


@pytest.fixture(scope="module")
def template(zoo, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_template")
    shutil.copy(zoo.qdq("qdq"), root / "m.onnx")
    shutil.copy(zoo.float("qdq"), root / "f.onnx")
    onnx.save_model(onnx.load(str(root / "m.onnx")), str(root / "ext.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="ext.onnx.data", size_threshold=0)
    shutil.copytree(zoo.folder("qdq"), root / "calib")
    builders.save_folder(builders.samples(2, seed=5), root / "held")
    sample = np.load(root / "calib" / "x" / "0.npy")
    for name, files in {"unnumbered": ["a", "2", "10"], "twice": ["1", "01"]}.items():
        (root / name / "x").mkdir(parents=True)
        for f in files:
            np.save(root / name / "x" / f"{f}.npy", sample)
    (root / "pickled" / "x").mkdir(parents=True)
    np.save(root / "pickled" / "x" / "0.npy", np.array([Payload()], dtype=object), allow_pickle=True)
    (root / "corrupt" / "x").mkdir(parents=True)
    (root / "corrupt" / "x" / "0.npy").write_bytes(b"\x93NUMPY garbage")
    (root / "notes.txt").write_text("notes\n")
    (root / "package.json").write_text('{"name": "web", "version": "1.0.0"}\n')
    (root / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (root / "outdir").mkdir()
    return root


@pytest.fixture
def project(template, tmp_path, monkeypatch):
    root = tmp_path / "project"
    shutil.copytree(template, root, symlinks=True)
    monkeypatch.chdir(root)
    return root


def tree(root):
    """``{relative path: sha256, "<dir>" or "-> target"}`` of everything under ``root``."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "<dir>"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_untouched(before, after, declared=()):
    """Every file there before is unchanged, and every new or changed path lies under a
    declared output."""
    __tracebackhide__ = True

    def declared_path(rel):
        return any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in declared)

    for rel, digest in before.items():
        assert after.get(rel) == digest or declared_path(rel), f"input {rel} changed or vanished"
    stray = [rel for rel in after if rel not in before and not declared_path(rel)]
    assert not stray, f"written outside the declared outputs: {stray}"


def one_line(text, *needles):
    """The one line of ``text``, holding every needle, without a traceback."""
    __tracebackhide__ = True
    assert "Traceback" not in text, text
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, text
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- the command line, in-process --------------------------------------------------------------
def _symlink(target, link):
    def make(root):
        os.symlink(target, root / link)
    return make


def _hardlink(target, link):
    def make(root):
        os.link(root / target, root / link)
    return make


def _copied(source, target):
    def make(root):
        shutil.copy(root / source, root / target)
    return make


def _suggest_setup(root):
    (root / "prev").mkdir()
    shutil.copy(root / "m.onnx", root / "prev" / "requantized_float.onnx")


def _edited(**values):
    """Write ``bad.onnx``: ``m.onnx`` with initializers replaced by ``values``."""
    def make(root):
        model = onnx.load(str(root / "m.onnx"))
        for init in model.graph.initializer:
            if init.name in values:
                init.CopyFrom(onnx.numpy_helper.from_array(values[init.name], init.name))
        onnx.save(model, str(root / "bad.onnx"))
    return make


def _external_at(location):
    """Write ``dev.onnx``: ``ext.onnx`` with its data named at ``location``."""
    def make(root):
        model = onnx.load(str(root / "ext.onnx"), load_external_data=False)
        for init in model.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save(model, str(root / "dev.onnx"))
    return make


def _external_outside(how):
    """Write ``sub/out.onnx``: ``ext.onnx`` with its data named outside ``sub/`` (by ``..``,
    an absolute path, a link in ``sub/`` to the file above, or a folder above), which onnx
    refuses to read."""
    def make(root):
        (root / "sub").mkdir()
        model = onnx.load(str(root / "ext.onnx"), load_external_data=False)
        for init in model.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    data = root / entry.value
                    entry.value = {"dots": f"../{data.name}", "absolute": str(data), "link": data.name,
                                   "folder": "../calib"}[how]
        if how == "link":
            (root / "sub" / data.name).symlink_to(data)
        onnx.save(model, str(root / "sub" / "out.onnx"))
    return make


def _outputs_added(*names, duplicate=False):
    """Write ``bad.onnx``: ``m.onnx`` with ``names`` also listed as outputs (or ``prob`` twice)."""
    def make(root):
        model = onnx.load(str(root / "m.onnx"))
        for name in names:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None))
        if duplicate:
            model.graph.output.append(model.graph.output[0])
        onnx.save(model, str(root / "bad.onnx"))
    return make


def _data_file(folder, write):
    def make(root):
        (root / folder).parent.mkdir(parents=True, exist_ok=True)
        write(root / folder)
    return make


def _damaged_deflate(path):
    """An .npz whose compressed member is damaged inside its deflate stream, where zlib
    fails (not the zip's directory): the first damage at which reading it raises zlib.error."""
    x = np.random.default_rng(0).standard_normal((2, 1, 3, 16, 16)).astype(np.float32)
    np.savez_compressed(path, x=x)
    whole = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("x.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for at in range(start + 10, start + info.compress_size - 20, 7):
        damaged = whole[:at] + b"\xff" * 8 + whole[at + 8:]
        try:
            np.load(io.BytesIO(damaged))["x"]
        except zlib.error:
            path.write_bytes(damaged)
            return
        except Exception:  # noqa: BLE001 - other damage: try the next place
            continue
    raise AssertionError("no damage made zlib fail")


def _per_channel_at_opset_10(root):
    """Write ``old.onnx``: the float model at opset 10 quantized per channel, which
    quantize_static writes with an axis its Q/DQ do not take there."""
    model = onnx.load(str(root / "f.onnx"))
    next(o for o in model.opset_import if o.domain in ("", "ai.onnx")).version = 10
    onnx.save(model, str(root / "f10.onnx"))
    data = {"x": [np.load(p) for p in sorted((root / "calib" / "x").glob("*.npy"))]}
    builders.quantize(root / "f10.onnx", root / "old.onnx", data, per_channel=True)


SENS = ["get-sensitivity-of-nodes", "m.onnx", "calib", "--quiet"]
RUNALL = ["runall", "m.onnx", "calib", "--quiet"]
CLI_CASES = [
    # (id, setup, argv, needles; every case exits 2 and writes nothing)
    ("json-onto-model", None, SENS + ["--json", "m.onnx"], ["--json 'm.onnx' is the model file"]),
    ("cost-twice", None, ["suggest", "m.onnx", "calib", "--remedy", "mixed", "--cost", "float=1", "float=2"],
     ["--cost prices 'float' twice; give each kind once"]),
    ("outlier-k-zero", None, ["get-channelwise-data-distribution", "m.onnx", "calib", "--outlier-k", "0"],
     ["argument --outlier-k: must be > 0, got 0"]),
    ("expect-std-zero", None, ["check-data", "m.onnx", "calib", "--expect-std", "1", "0"],
     ["argument --expect-std: must be > 0, got 0"]),
    *((f"{cmd}-missing-library", None, [cmd, "m.onnx", *(["calib"] if cmd != "list-nodes" else []),
                                        "--custom-op-library", "nosuch.so"],
       ["argument --custom-op-library: 'nosuch.so' does not exist"]) for cmd in ("list-nodes", "check-data")),
    ("json-onto-sample", None, SENS + ["--json", "calib/x/0.npy"], ["inside the calibration data folder 'calib'"]),
    ("json-new-file-in-data", None, SENS + ["--json", "calib/result.json"], ["inside the calibration data folder"]),
    ("json-symlink-to-model", _symlink("m.onnx", "link.json"), SENS + ["--json", "link.json"], ["is the model file"]),
    ("json-hardlink-to-model", _hardlink("m.onnx", "hard.json"), SENS + ["--json", "hard.json"],
     ["is the model file"]),
    ("json-dotdot-onto-model", None, SENS + ["--json", "outdir/../m.onnx"], ["is the model file"]),
    ("json-onto-float-model", None, SENS + ["--float-model", "f.onnx", "--json", "f.onnx"], ["is the float model"]),
    ("json-onto-external-data", None, ["get-sensitivity-of-nodes", "ext.onnx", "calib", "--json", "ext.onnx.data"],
     ["external data file 'ext.onnx.data' of the model file 'ext.onnx'"]),
    # onnx reads a binary model named .json as JSON text: the guard read no external data then
    ("json-onto-external-data-of-a-model-named-json", _copied("ext.onnx", "ext.json"),
     ["check-data", "ext.json", "calib", "--json", "ext.onnx.data"],
     ["external data file 'ext.onnx.data' of the model file 'ext.json'"]),
    ("save-dir-is-data", None, RUNALL + ["-s", "calib"], ["is the calibration data folder 'calib'"]),
    ("save-dir-inside-data", None, RUNALL + ["-s", "calib/out"], ["lies inside the calibration data folder"]),
    ("save-dir-dotdot-into-data", None, RUNALL + ["-s", "outdir/../calib/x/out"], ["inside the calibration data"]),
    ("save-dir-symlink-into-data", _symlink("calib", "linked"), RUNALL + ["-s", "linked/out"],
     ["inside the calibration data folder"]),
    ("save-dir-is-model", None, ["plot-acc-error", "m.onnx", "calib", "-s", "m.onnx"], ["is the model file"]),
    ("save-dir-is-a-file", None, RUNALL + ["-s", "notes.txt"], ["'notes.txt' is a file; give a folder"]),
    ("json-is-a-folder", None, SENS + ["--json", "outdir"], ["is a folder; give a file name"]),
    ("json-parent-is-a-file", None, SENS + ["--json", "notes.txt/r.json"], ["'notes.txt' is a file, not a folder"]),
    ("json-disk-full", None, SENS + ["--json", "/dev/full"], ["cannot write '/dev/full': no space left"]),
    ("json-name-too-long", None, SENS + ["--json", "x" * 300 + ".json"], ["the name is too long"]),
    ("json-nul", None, SENS + ["--json", "a\0b.json"], ["NUL character"]),
    ("heldout-json", None, ["check-data", "m.onnx", "calib", "--heldout", "held", "--json", "held/r.json"],
     ["inside the held-out data folder 'held'"]),
    ("stages-json-onto-float", None, ["stages", "f.onnx", "m.onnx", "calib", "--json", "f.onnx", "--quiet"],
     ["is the float model"]),
    # the model is the remedy's own output of an earlier run: analysing it again must not
    # overwrite it with the new re-quantization
    ("suggest-save-onto-its-model", _suggest_setup,
     ["suggest", "prev/requantized_float.onnx", "calib", "--float-model", "f.onnx", "-s", "prev", "--quiet"],
     ["'prev/requantized_float.onnx' is the model file"]),
    ("model-is-a-folder", None, ["get-sensitivity-of-nodes", "calib", "calib"], ["model 'calib' is a folder; pass the .onnx file"]),
    ("model-missing", None, ["list-nodes", "nope.onnx"], ["'nope.onnx' does not exist"]),
    ("model-not-onnx", None, ["list-nodes", "notes.txt"], ["is not a readable ONNX model"]),
    ("samples-without-numbers", None, ["get-sensitivity-of-nodes", "m.onnx", "unnumbered"],
     ["files without a sample number ('a.npy')"]),
    ("samples-numbered-twice", None, ["get-sensitivity-of-nodes", "m.onnx", "twice"], ["two files for sample 1"]),
    ("pickled-npy", None, ["get-sensitivity-of-nodes", "m.onnx", "pickled", "--quiet"],
     ["'pickled/x/0.npy' holds an object array", "pytest-ptq never loads"]),
    ("corrupt-npy", None, ["get-sensitivity-of-nodes", "m.onnx", "corrupt", "--quiet"], ["is not a readable .npy"]),
    ("data-num-text", None, SENS + ["--data-num", "abc"], ["--data-num: must be a whole number, got 'abc'"]),
    ("unknown-metric", None, SENS + ["-m", "cosin"], ["unknown metric 'cosin'"]),
    ("unknown-node", None, SENS + ["-i", "conv_2"], ["unknown node 'conv_2'", "'conv2'"]),
    ("zero-points-beside-one-scale", _edited(w1_zero_point=np.zeros(5, np.int8)), ["list-nodes", "bad.onnx"],
     ["'w1_QuantizeLinear'", "zero point of shape [5]", "beside a scale of shape []"]),
    ("scales-for-the-wrong-channel-count", _edited(w1_scale=np.full(5, 0.01, np.float32),
                                                   w1_zero_point=np.zeros(5, np.int8)),
     ["list-nodes", "bad.onnx"], ["'w1_QuantizeLinear'", "scale of shape [5] for axis 1", "which has 3 there"]),
    ("scale-nan", _edited(x_scale=np.array(np.nan, np.float32)), ["runall", "bad.onnx", "calib", "--quiet"],
     ["'x_QuantizeLinear'", "has a scale of nan ('x_scale')"]),
    ("npz-saved-as-npy", _data_file("zipped/x/0.npy", lambda p: np.savez(open(p, "wb"), x=np.zeros(3))),
     ["get-sensitivity-of-nodes", "m.onnx", "zipped", "--quiet"], ["is not a readable .npy array (it is an .npz"]),
    ("stacked-scalar", _data_file("scalar/x.npy", lambda p: np.save(p, np.float32(1))),
     ["get-sensitivity-of-nodes", "m.onnx", "scalar", "--quiet"], ["holds one value, not samples stacked"]),
    ("npz-deflate-damaged", _data_file("damaged.npz", _damaged_deflate),
     ["get-sensitivity-of-nodes", "m.onnx", "damaged.npz", "--quiet"],
     ["'damaged.npz' is not a readable .npz archive (its compressed data is damaged)"]),
    ("npy-named-npz", _data_file("one.npz", lambda p: np.save(open(p, "wb"), np.zeros((2, 1, 3, 16, 16), np.float32))),
     ["get-sensitivity-of-nodes", "m.onnx", "one.npz", "--quiet"], ["holds one array (a .npy file), not an .npz"]),
    ("npz-scalar", _data_file("d.npz", lambda p: np.savez(p, x=np.float32(1))),
     ["get-sensitivity-of-nodes", "m.onnx", "d.npz", "--quiet"], ["'d.npz', key 'x', holds one value"]),
    ("bins-beyond-a-plot", None, ["plot-distribution", "m.onnx", "calib", "-s", "out", "-n", "conv1", "--bins",
                                  "100000"], ["--bins: must be at most 4096"]),
    ("save-dir-dangling-link", _symlink("nowhere/at/all", "dangling"), RUNALL + ["-s", "dangling"],
     ["'dangling' is a link to 'nowhere/at/all', which does not exist"]),
    ("external-data-on-a-device", _external_at("/dev/zero"), ["get-sensitivity-of-nodes", "dev.onnx", "calib"],
     ["keeps its data in '/dev/zero'", "outside the model's folder"]),
    ("external-data-a-folder-beside-the-model", _external_at("calib"), ["get-sensitivity-of-nodes", "dev.onnx", "calib"],
     ["keeps its data in 'calib', which is not a regular file"]),
    # the file system's error for a name too long to be one (ENAMETOOLONG) was an internal error
    ("external-data-named-too-long", _external_at("a" * 300 + ".bin"), ["check-data", "dev.onnx", "calib"],
     ["which names no readable file (File name too long)"]),
    # realpath raised ValueError: an internal error
    *((f"external-data-named-with-a-nul-{argv[0]}", _external_at("w\0.bin"), argv,
       ["keeps its data in 'w\\x00.bin', a name holding a NUL character"])
      for argv in (["get-sensitivity-of-nodes", "dev.onnx", "calib"], ["list-nodes", "dev.onnx"])),
    # the folder's case said "not a regular file", though it lies outside the model's folder
    *((f"external-data-outside-the-model-folder-{how}", _external_outside(how),
       ["get-sensitivity-of-nodes", "sub/out.onnx", "calib"], ["keeps its data in", "outside the model's folder"])
      for how in ("dots", "absolute", "link", "folder")),
    *((f"output-written-by-nothing-{argv[0]}", _outputs_added("nowhere"), argv,
       ["output 'nowhere' of", "is written by no node, input or initializer"])
      for argv in (["get-sensitivity-of-nodes", "bad.onnx", "calib"], ["list-nodes", "bad.onnx"])),
    ("float-model-quantized", None, SENS + ["--float-model", "m.onnx"],
     ["the float model", "QuantizeLinear node(s), so it is a quantized model"]),
    ("expect-std-negative", None, ["check-data", "m.onnx", "calib", "--expect-std", "-1", "-1", "-1"],
     ["argument --expect-std: must be > 0, got -1"]),
    ("stages-threshold-beyond-cosine", None, ["stages", "f.onnx", "m.onnx", "calib", "--threshold", "2"],
     ["threshold must lie in [-1, 1] for cosine-similarity"]),
    ("data-overflowing-the-model", _data_file("huge/x/0.npy", lambda p: np.save(p, np.full((1, 3, 16, 16), 1e38,
                                                                                           np.float32))),
     ["get-sensitivity-of-nodes", "m.onnx", "huge", "--quiet"],
     ["gives non-finite values in output 'prob' on sample 0", "reach 1e+38 in magnitude", "check that sample"]),
    ("per-channel-at-opset-10", _per_channel_at_opset_10, ["get-sensitivity-of-nodes", "old.onnx", "calib"],
     ["'old.onnx' quantizes per channel at opset 10", "convert the float model to opset 13 first"]),
    ("slice-step-0", None, SENS + ["-o", "p=prob[::0]"], ["has a step of 0"]),
    ("slice-two-ellipses", None, SENS + ["-o", "p=prob[..., ...]"], ["has '...' twice"]),
    ("slice-index-out-of-range", None, SENS + ["-o", "p=prob[:, 10]"], ["takes index 10", "has 10 ([1, 10])"]),
    ("slice-empty", None, SENS + ["-o", "p=prob[:, 99:100]"], ["selects nothing of an axis of 'prob'"]),
    ("slice-too-many-axes", None, SENS + ["-o", "p=prob[0, 0, 0]"], ["indexes 3 axes of 'prob', which has 2"]),
]


@pytest.mark.parametrize("setup,argv,needles", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_in_one_sentence(project, capsys, setup, argv, needles):
    if setup:
        setup(project)
    before = tree(project)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    one_line(err, *needles)
    assert_untouched(before, tree(project))


@pytest.mark.parametrize("setup,note", [
    (_outputs_added("w1"), "model output 'w1' is an initializer"),
    (_outputs_added("r1_QuantizeLinear_Output"), "is the integer tensor inside pair 'r1_QuantizeLinear'"),
    (_outputs_added(duplicate=True), "model output 'prob' is listed twice: it is compared once"),
])
def test_outputs_nothing_changes_are_left_out_with_a_note(project, capsys, setup, note):
    setup(project)
    assert main(["runall", "bad.onnx", "calib", "--quiet", "-s", "out", "--top", "1"]) == 0, capsys.readouterr().err
    summary = (project / "out" / "summary.md").read_text()
    assert note in summary and "metric cosine-similarity on prob." in summary  # the output compared, once


def test_stages_name_data_that_overflows_the_float_model(project, capsys):
    (project / "huge" / "x").mkdir(parents=True)
    np.save(project / "huge" / "x" / "0.npy", np.full((1, 3, 16, 16), 1e38, np.float32))
    assert main(["stages", "f.onnx", "m.onnx", "huge", "--quiet"]) == 2
    # said by the engine's check of the model against the float one, before any stage runs
    one_line(capsys.readouterr().err, "'m.onnx' with every Q/DQ pair bypassed gives non-finite values in output "
             "'prob' on sample 0", "reach 1e+38 in magnitude: the model overflows on its data")


def test_an_infinite_scale_from_a_masked_tensor_names_the_nodes_to_keep_in_float(tmp_path):
    """quantize_static calibrates an attention mask filled with -inf to a scale of inf (with a
    numpy warning only); the refusal said "re-calibrate the model", which gives the same inf
    again. It names the nodes reading every such pair, and excluding them gives a model that
    loads."""
    import warnings

    from pytest_ptq.model import QuantModel

    builders.inf_mask_net(tmp_path / "f.onnx")
    data = builders.inf_mask_samples()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the quantizer's own RuntimeWarning on the infinite range
        q = builders.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", data)
        fixed = builders.quantize(tmp_path / "f.onnx", tmp_path / "fixed.onnx", data,
                                  nodes_to_exclude=["masked_scores", "attention"])
    # the Add's output holds -inf too: the Softmax's pair is named with it, not one run later
    with pytest.raises(PTQError, match=r"has a scale of inf \('bias_scale'\) \(and 1 more such pair\(s\)\): the range "
                                       r"of 'bias' .* calibrating again gives the same; "
                                       r".*nodes_to_exclude=\['masked_scores', 'attention'\]") as exc:
        QuantModel(q)
    assert "re-calibrate" not in str(exc.value)
    assert not [c for c in QuantModel(fixed).calibration.values() if not np.isfinite(c.scale).all()]


def test_a_scale_of_zero_is_a_warning_and_every_step_runs(project, capsys):
    _edited(x_scale=np.array(0, np.float32))(project)
    assert main(["runall", "bad.onnx", "calib", "--quiet", "-s", "out"]) == 0, capsys.readouterr().err
    summary = (project / "out" / "summary.md").read_text()
    assert "QuantizeLinear 'x_QuantizeLinear' of 'bad.onnx' has a scale of 0 ('x_scale')" in summary


@pytest.mark.filterwarnings("error::RuntimeWarning")  # numpy's division warnings are not the user's to read
def test_scales_of_zero_are_said_once_and_suspect_no_folded_relu(project, capsys):
    # c2 reads a Conv with no Relu after it: a range of no width "starts at 0" too
    _edited(w2_scale=np.zeros_like(_init(project, "w2_scale")), c2_scale=np.array(0, np.float32))(project)
    assert main(["runall", "bad.onnx", "calib", "--quiet", "-s", "out", "--top", "2"]) == 0
    err = capsys.readouterr().err
    summary = (project / "out" / "summary.md").read_text()
    for pair in ("w2", "c2"):
        assert f"QuantizeLinear '{pair}_QuantizeLinear' of 'bad.onnx' has a scale of 0 ('{pair}_scale')" in summary
    assert "folded" not in summary + err and "RuntimeWarning" not in err


def test_a_scale_below_the_smallest_normal_float_is_noted(project, capsys):
    _edited(c2_scale=np.array(1e-42, np.float32))(project)
    assert main(["get-sensitivity-of-nodes", "bad.onnx", "calib", "-t", "activation"]) == 0
    one_line(capsys.readouterr().err, "QuantizeLinear 'c2_QuantizeLinear' of 'bad.onnx' has a scale of 1.00053e-42 "
             "('c2_scale'), below float32's smallest normal number", "as with a scale of 0")


def test_a_negative_activation_scale_is_noted_and_its_threshold_said_to_be_its_magnitude(project, capsys):
    """A negated activation scale mirrors its grid (c2 ranked 0.000000 with a positive threshold)
    and was said nowhere; only the block-wise weights onnxruntime's quantizer flips on purpose
    stay silent (test_conventions)."""
    scale, zp = _init(project, "c2_scale"), _init(project, "c2_zero_point")
    _edited(c2_scale=-scale)(project)
    assert main(["get-sensitivity-of-nodes", "bad.onnx", "calib", "-t", "activation"]) == 0
    captured = capsys.readouterr()
    one_line(captured.err, f"QuantizeLinear 'c2_QuantizeLinear' of 'bad.onnx' has a scale of {-scale:g} "
             "('c2_scale'), below zero", "the threshold shown is of its magnitude")
    info = np.iinfo(zp.dtype)
    row = next(line for line in captured.out.splitlines() if line.startswith("| c2_QuantizeLinear "))
    assert float(row.split("|")[3]) == pytest.approx(
        float(scale) * max(info.max - int(zp), int(zp) - info.min), rel=1e-5)


def _init(root, name):
    model = onnx.load(str(root / "m.onnx"))
    return next(onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


@pytest.mark.parametrize("name", ["m.json", "m.prototxt", "m.textproto", "m.onnxtxt"])
def test_a_binary_model_is_read_whatever_its_extension(project, capsys, name):
    """onnx picks a format by the extension: a binary model named .json was read as JSON
    and refused, and its external data was neither protected nor hashed."""
    shutil.copy(project / "m.onnx", project / name)
    assert main(["list-nodes", "m.onnx"]) == 0
    expected = capsys.readouterr().out
    assert main(["list-nodes", name]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out == expected.replace("m.onnx", name)
    shutil.copy(project / "ext.onnx", project / ("ext" + Path(name).suffix))
    data = [project / e.value for t in onnx.load(str(project / "ext.onnx"), load_external_data=False).graph.initializer
            for e in t.external_data if e.key == "location"]
    from pytest_ptq import cache
    assert cache.model_files(project / ("ext" + Path(name).suffix))[1:] == [data[0].resolve()]


def test_cli_writes_only_its_declared_outputs(project, capsys):
    """The control case: the same command with a fresh output writes that and nothing else."""
    before = tree(project)
    assert main(SENS + ["--json", "out/deep/r.json"]) == 0, capsys.readouterr().err
    assert_untouched(before, tree(project), declared=["out"])
    assert (project / "out" / "deep" / "r.json").stat().st_size > 100


@pytest.mark.skipif(builders.AS_ROOT, reason="root writes into read-only folders")
def test_cli_read_only_folder(project, capsys):
    (project / "ro").mkdir(mode=0o500)
    before = tree(project)
    assert main(SENS + ["--json", "ro/r.json"]) == 2
    one_line(capsys.readouterr().err, "'ro' is read-only")
    assert_untouched(before, tree(project))


def test_cli_write_failure_mid_run_is_one_sentence(project, capsys, monkeypatch):
    """A disk error after the checks (simulated: the write itself fails) is one sentence too."""
    import errno

    def fail(self, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Path, "write_text", fail)
    before = tree(project)
    assert main(SENS + ["--json", "r.json"]) == 2
    one_line(capsys.readouterr().err, "cannot write 'r.json' (Input/output error)")
    assert_untouched(before, tree(project))


# -- the command line, as real processes ---------------------------------------------------------
def _process(*args):
    return subprocess.run([sys.executable, "-m", "pytest_ptq", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})


@pytest.mark.parametrize("argv,needles", [
    (["get-sensitivity-of-nodes", "m.onnx", "calib", "--json", "m.onnx"], ["is the model file"]),
    (["runall", "m.onnx", "calib", "-s", "calib/out"], ["inside the calibration data folder"]),
    (["get-sensitivity-of-nodes", "m.onnx", "calib", "--data-num", "0"], ["must be at least 1, got 0"]),
], ids=["json-onto-model", "save-dir-in-data", "argparse-error"])
def test_process_refuses_in_one_sentence(project, argv, needles):
    before = tree(project)
    proc = _process(*argv)
    assert proc.returncode == 2 and proc.stdout == ""
    one_line(proc.stderr, *needles)
    assert_untouched(before, tree(project))


def test_closed_pipe_ends_quietly(project):
    """``ptq-debug list-nodes m.onnx | head``: the reader is gone before the table is printed."""
    before = tree(project)
    proc = subprocess.Popen([sys.executable, "-m", "pytest_ptq", "list-nodes", "m.onnx"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                         "PYTHONDONTWRITEBYTECODE": "1"})
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == BROKEN_PIPE
    assert err == ""
    assert_untouched(before, tree(project))


@pytest.mark.parametrize("command", [["get-sensitivity-of-nodes", "-t", "weight"],
                                     ["plot-distribution", "-n", "w1_QuantizeLinear", "-s", "plots"]])
def test_closed_pipe_costs_no_file_asked_for(project, tmp_path, command):
    """``... --json s.json | true``: the table was printed before the file was written, and the
    reader gone, the command ended without it."""
    out = tmp_path / "s.json"
    proc = subprocess.Popen([sys.executable, "-m", "pytest_ptq", command[0], "m.onnx", "calib", *command[1:], "--json",
                             str(out), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})
    proc.stdout.close()
    proc.stderr.read()
    assert proc.wait(timeout=120) in (0, BROKEN_PIPE)
    assert json.loads(out.read_text())


# -- the API ---------------------------------------------------------------------------------
def _engine():
    return dbg.Engine("m.onnx", "calib")


def _json_file(text):
    """A file outside the project (which the case checks is untouched) holding ``text``."""
    import tempfile

    path = Path(tempfile.mkdtemp()) / "given.json"
    path.write_text(text)
    return str(path)


API_CASES = [
    ("runall-save-dir-in-data", lambda: dbg.runall("m.onnx", "calib", save_dir="calib/out", progress=False),
     "save_dir 'calib/out' lies inside the calibration data folder"),
    ("curves-save-dir-is-model", lambda: dbg.plot_acc_error("m.onnx", model_or_file=_engine(), progress=False),
     "save_dir 'm.onnx' is the model file"),
    ("curves-filename-escapes", lambda: dbg.plot_acc_error("out", model_or_file=_engine(), filename="../m.onnx",
                                                           progress=False), "filename must be a plain file name"),
    ("curves-save-dir-none", lambda: dbg.plot_acc_error(None, model_or_file=_engine(), progress=False),
     "save_dir must be a path, got None"),
    ("data-num-text", lambda: dbg.get_sensitivity_of_nodes(_engine(), data_num="abc"),
     "data_num must be a whole number, got 'abc'"),
    ("data-num-fraction", lambda: dbg.get_sensitivity_of_nodes(_engine(), data_num=1.5),
     "data_num must be a whole number, got 1.5"),
    ("metrics-number", lambda: dbg.get_sensitivity_of_nodes(_engine(), metrics=1.5), "metrics must be a metric name"),
    ("node-type-list", lambda: dbg.get_sensitivity_of_nodes(_engine(), node_type=["weight"]), "unknown node_type"),
    ("output-node-number", lambda: dbg.get_sensitivity_of_nodes(_engine(), output_node=3), "output_node must be"),
    ("interested-number", lambda: dbg.get_sensitivity_of_nodes(_engine(), interested_nodes=3),
     "interested_nodes must be a name or a list of names"),
    ("bins-text", lambda: dbg.plot_distribution("out", _engine(), nodes_list=["conv1"], bins="abc"),
     "bins must be a whole number, got 'abc'"),
    ("axis-text", lambda: dbg.get_channelwise_data_distribution("out", _engine(), nodes_list=["r1_QuantizeLinear"],
                                                                axis="abc"), "axis must be a whole number"),
    ("outlier-k-none", lambda: dbg.get_channelwise_data_distribution(
        "out", _engine(), nodes_list=["r1_QuantizeLinear"], outlier_k=None), "outlier_k must be a number"),
    ("runall-top-zero", lambda: dbg.runall(_engine(), save_dir="out", top=0), "top must be at least 1"),
    ("budget-text", lambda: dbg.suggest_remedy(_engine(), budget="abc"), "budget must be a number"),
    # what an evaluate function's run(feeds) hands the engine
    ("run-feeds-without-an-input", lambda: _engine().run({"y": np.zeros(3, np.float32)}),
     "the feeds lack model input 'x' of"),
    ("target-bool", lambda: dbg.suggest_remedy(_engine(), target=True), "target must be a number, got True"),
    ("confidence-k", lambda: dbg.ranking_confidence(dbg.get_sensitivity_of_nodes(_engine()), k="abc"),
     "k must be a whole number"),
    ("threshold-text", lambda: dbg.check_data(_engine(), threshold="high"), "threshold must be a number"),
    ("expect-mean-text", lambda: dbg.check_data(_engine(), expect_mean="abc"), "expect_mean must be a number"),
    ("groups-number", lambda: dbg.group_sensitivity(_engine(), 3), "groups must be a list of groups"),
    ("model-number", lambda: dbg.Engine(1.5, "calib"), "model must be the path of an .onnx file"),
    ("model-folder", lambda: dbg.Engine("calib", "calib"), "model 'calib' is a folder; pass the .onnx file"),
    ("data-number", lambda: dbg.Engine("m.onnx", 7), "calibration data must be a path, got 7"),
    ("compare-shapes", lambda: dbg.compare(np.zeros(3), np.zeros(4)), "(shapes [3] and [4])"),
    ("compare-text", lambda: dbg.compare("abc", "abd", ["mse"]), "compare needs two numeric arrays"),
    ("load-sensitivity-list", lambda: dbg.load_sensitivity(_json_file("[1, 2]")),
     "cannot be read"),
    ("load-sensitivity-unknown-metric", lambda: dbg.load_sensitivity(_json_file('{"a": {"foo": 0.9}}')),
     "cannot be used: unknown metric 'foo'"),
    ("load-sensitivity-missing-key", lambda: dbg.load_sensitivity(_json_file('{"ranking": [], "values": {}}')),
     "cannot be read (it has no 'metrics' entry)"),
    ("load-sensitivity-deep", lambda: dbg.load_sensitivity(_json_file("[" * 100000 + "]" * 100000)),
     "cannot be read (RecursionError"),
    # a saved ranking edited by hand: its per-sample values are what the confidence computes on
    *((f"confidence-of-a-file-whose-{what}", lambda details=details: dbg.ranking_confidence(dbg.load_sensitivity(
        _json_file(json.dumps({"ranking": ["a"], "values": {"a": {"cosine-similarity": 0.9}}, "node_type": "node",
                               "metrics": ["cosine-similarity"], "details": {"a": details}})))), needle)
      for what, details, needle in (
          ("per-sample-value-is-text", {"per_sample": {"cosine-similarity": ["abc", None]}},
           "the per-sample cosine-similarity values of node 'a' must be a list of numbers (null where no values"),
          ("per-sample-values-are-a-number", {"per_sample": {"cosine-similarity": 0.9}},
           "the per-sample cosine-similarity values of node 'a' must be a list of numbers"),
          ("per-sample-is-null", {"per_sample": None},
           "the per-sample values of node 'a' must be a mapping of metric names to lists, got None"),
          ("details-are-a-list", [1], "the details of node 'a' must be a mapping, got [1]"))),
    # '' and 'default' both name the default: one of them would win in silence
    ("suggest-targets-give-the-default-twice", lambda: dbg.suggest_remedy(_engine(), target={"": 0.9, "default": 0.99}),
     "give the default twice ('default' and ''); give it once"),
    ("accuracy-of-a-number", lambda: check_accuracy(Analysis(AnalysisKey("m.onnx", "calib"), "."), 3),
     "evaluate must be a function evaluate(run, data) -> float, got 3"),
    *((f"accuracy-min-ratio-{r}", lambda r=r: check_accuracy(Analysis(AnalysisKey("m.onnx", "calib"), "."),
                                                             lambda run, data: 1.0, min_ratio=r),
       "min_ratio must be a share of the float model's score in (0, 10] such as 0.99") for r in (0, -5, 11)),
    # a flag given as text: "no" would read as true
    ("runall-average-mode-text", lambda: dbg.runall("m.onnx", "calib", save_dir="out", average_mode="no"),
     "average_mode must be True or False, got 'no'"),
    ("sensitivity-verbose-text", lambda: dbg.get_sensitivity_of_nodes(_engine(), verbose="no"),
     "verbose must be True or False, got 'no'"),
    ("sensitivity-progress-text", lambda: dbg.get_sensitivity_of_nodes(_engine(), progress="no"),
     "progress must be True or False, got 'no'"),
    ("curves-local-text", lambda: dbg.get_acc_error(_engine(), {"all": []}, local="no"),
     "local must be True or False, got 'no'"),
    ("suggest-requantize-text", lambda: dbg.suggest_remedy(_engine(), requantize_check="no"),
     "requantize_check must be True or False, got 'no'"),
    ("subgraph-weights-text", lambda: dbg.subgraph_nodes("m.onnx", "x", "prob", weights="no"),
     "weights must be True or False, got 'no'"),
    ("sensitivity-no-nodes", lambda: dbg.get_sensitivity_of_nodes(_engine(), interested_nodes=[]),
     "interested_nodes is empty; name the nodes to rank"),
    ("sensitivity-empty-node-name", lambda: dbg.get_sensitivity_of_nodes(_engine(), interested_nodes=""),
     "unknown node ''"),
    ("stages-min-cosine-2", lambda: check_stages(Analysis(AnalysisKey("m.onnx", "calib", "f.onnx"), "."), "f.onnx",
                                                 min_cosine=2), "min_cosine must lie in [-1, 1], got 2"),
    ("curves-filename-txt", lambda: dbg.plot_acc_error("out", model_or_file=_engine(), filename="x.txt"),
     "filename must end in .png (the curves are a PNG image), got 'x.txt'"),
    ("check-data-missing-library", lambda: dbg.check_data("m.onnx", "calib", custom_op_libraries=["nosuch.so"]),
     "custom-op library 'nosuch.so' does not exist; give the path of the library file"),
    ("engine-library-list-in-a-list", lambda: dbg.Engine("m.onnx", "calib", custom_op_libraries=[["a.so"]]),
     "custom-op library must be a path, got"),
    ("metric-unknown", lambda: dbg.compare(np.zeros(3), np.ones(3), ["foo"]),
     "unknown metric 'foo'; use one of 'cosine-similarity', 'mse'"),
    ("curves-no-configs", lambda: dbg.get_acc_error(_engine(), {}), "configs must be a mapping {label: "),
    ("curves-config-number", lambda: dbg.get_acc_error(_engine(), 5), "configs must be a mapping"),
    ("curves-config-unknown-node", lambda: dbg.get_acc_error(_engine(), {"a": ["nosuch"]}),
     "unknown calibration node 'nosuch'"),
    ("curves-two-metrics", lambda: dbg.plot_acc_error("out", model_or_file=_engine(), metric=["mse", "cos"]),
     "metric must be one metric name, got ['mse', 'cos']"),
    # an option that the rest of the call makes meaningless is refused, not ignored
    ("suggest-costs-without-mixed", lambda: dbg.suggest_remedy(_engine(), costs={"float": 2}),
     "costs price the kinds of a mixed search; give remedy='mixed'"),
    ("suggest-per-channel-activations-for-float", lambda: dbg.suggest_remedy(_engine(), per_channel_activations=True),
     "a 'float' search has no per-channel remedy to give activations"),
    ("runall-budget-and-samples", lambda: dbg.runall("m.onnx", "calib", save_dir="out", time_budget=5, rank_samples=2),
     "give time_budget (--time-budget) or rank_samples (--rank-samples), not both"),
    ("runall-cache-empty", lambda: dbg.runall("m.onnx", "calib", save_dir="out", cache="", progress=False),
     "cache must be a path, got ''"),
    ("runall-cache-in-data", lambda: dbg.runall("m.onnx", "calib", save_dir="out", cache="calib/c", progress=False),
     "lies inside the calibration data folder"),
    ("suggest-min-ratio", lambda: dbg.suggest_remedy(_engine(), evaluate=lambda run, data: 1.0, min_ratio=0),
     "min_ratio must be a share of the float model's score in (0, 10]"),
    ("data-mapping-of-a-number", lambda: dbg.Engine("m.onnx", {"x": 5}),
     "calibration data for input 'x' must be a list of arrays, one per sample"),
    ("result-saved-onto-its-model", lambda: dbg.get_sensitivity_of_nodes("m.onnx", calibrated_data="calib").save(
        "m.onnx"), "output file 'm.onnx' is the model file"),
    ("result-saved-into-its-data", lambda: dbg.get_sensitivity_of_nodes(_engine()).save("calib/x/1.npy"),
     "output file 'calib/x/1.npy' lies inside the calibration data folder"),
    ("curves-saved-onto-its-model", lambda: dbg.get_acc_error(_engine(), {"all": []}, progress=False).save("m.onnx"),
     "output file 'm.onnx' is the model file"),
    ("result-saved-to-a-number", lambda: dbg.get_sensitivity_of_nodes(_engine()).save(5),
     "output file must be a path, got 5"),
    ("stages-save-dir-is-float", lambda: dbg.localize_stages("f.onnx", "m.onnx", "calib", save_dir="f.onnx"),
     "save_dir 'f.onnx' is the float model"),
]


@pytest.mark.parametrize("call,needle", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_api_refuses_with_a_ptq_error(project, call, needle):
    before = tree(project)
    with pytest.raises(PTQError) as exc:
        call()
    one_line(str(exc.value), needle)
    assert_untouched(before, tree(project))


# -- baselines -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def analysis(template):
    return Analysis(AnalysisKey(str(template / "m.onnx"), str(template / "calib")), template)


def _score(run, data):
    return 1.0


@pytest.mark.parametrize("method,key,value,given", [
    ("outputs", "threshold", 0.9, {}),
    ("nodes", "threshold", 0.9, {}),
    ("accuracy", "min_ratio", 0.9, {"evaluate": _score}),
    ("baseline", "tolerance", 0.1, {"path": "b.json"}),
    ("data", "threshold", 0.9, {"holdout": "held"}),
    ("stages", "min_cosine", 0.9, {"float_model": "f.onnx"}),
])
def test_the_fixture_refuses_a_number_given_as_text(analysis, template, method, key, value, given):
    """ptq.assert_outputs("0.9") passed: the threshold was read from the text, where a YAML
    contract's quoted '0.99' was refused as a mistake."""
    from pytest_ptq.checks import PTQ
    from pytest_ptq.settings import Settings

    given = {k: template / v if isinstance(v, str) else v for k, v in given.items()}
    ptq = PTQ(analysis, Settings(), lambda result: None, template / "b.json", base=template)
    getattr(ptq, f"check_{method}")(**given, **{key: value})  # the number itself is taken
    with pytest.raises(PTQError) as exc:
        getattr(ptq, f"assert_{method}")(**given, **{key: str(value)})
    one_line(str(exc.value), f"got the text '{value}'; write the number without quotes")


BAD_FIELDS = [
    ("outputs-text", {"outputs": "0.99"}, "has a malformed 'outputs': it must be a mapping of output names"),
    ("outputs-empty", {"outputs": {}}, "has a malformed 'outputs'"),
    ("value-text", {"outputs": {"prob": "high"}}, "has a malformed 'outputs.prob': it must be a number, got 'high'"),
    ("value-null", {"sensitivity": {"conv1": None}}, "has a malformed 'sensitivity.conv1'"),
    ("value-huge-integer", {"outputs": {"prob": 10**400}},
     "has a malformed 'outputs.prob': it must be a number within a float's range"),
    ("sensitivity-list", {"sensitivity": [1, 2]}, "has a malformed 'sensitivity'"),
    ("metric-unknown", {"metric": "cosin"}, "has a malformed 'metric': it must be one of cosine-similarity"),
    ("node-type", {"node_type": "layer"}, "has a malformed 'node_type'"),
    ("model-text", {"model": "m.onnx"}, "has a malformed 'model'"),
    ("tool-list", {"tool": [1]}, "has a malformed 'tool'"),
    ("format", {"format": 0}, "has a malformed 'format'"),
    ("unknown-key", {"sensitivty": {}}, "has an unknown key 'sensitivty' (did you mean 'sensitivity'?)"),
]


@pytest.mark.parametrize("change,needle", [c[1:] for c in BAD_FIELDS], ids=[c[0] for c in BAD_FIELDS])
def test_malformed_baseline_fails_naming_the_key_and_is_repaired(analysis, template, tmp_path, change, needle):
    import json

    before = tree(template)
    path = tmp_path / "b.json"
    assert check_baseline(analysis, path, update="failing").status == "created"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    result = check_baseline(analysis, path)
    assert not result and result.status == "unreadable"
    one_line(result.summary, f"baseline {path}", needle, "rewrite it with `pytest --ptq-update-baseline`")
    repaired = check_baseline(analysis, path, update="failing")
    assert repaired.status == "rewritten" and not repaired
    assert check_baseline(analysis, path).status == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]
    assert_untouched(before, tree(template))


@pytest.mark.parametrize("target,needle", [
    ("m.onnx", "is the model file"), ("calib/x/b.json", "inside the calibration data folder"),
    ("notes.txt", "must be a .json file"), ("notes.txt/b.json", "is a file, not a folder"),
    ("package.json", "is not a pytest-ptq baseline"), ("binary.json", "pytest-ptq only ever replaces its own"),
], ids=["onto-model", "into-data", "not-json", "parent-is-a-file", "other-json", "binary"])
def test_baseline_never_written_onto_an_input(analysis, template, target, needle):
    """Nor onto a file that is not a baseline: an update only ever replaces a baseline."""
    before = tree(template)
    with pytest.raises(PTQError) as exc:
        check_baseline(analysis, template / target, update="all")
    one_line(str(exc.value), needle)
    assert_untouched(before, tree(template))


def test_stale_temporary_files_are_removed(analysis, template, tmp_path):
    """A killed update leaves ``.NAME.PID.tmp``: removed once its process is gone and a minute
    has passed; a young one, or one of a live process, is kept (it may be being written)."""
    gone = []
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        gone.append(proc.pid)
    path = tmp_path / "b.json"
    stale, young, alive = (tmp_path / f".b.json.{gone[0]}.tmp", tmp_path / f".b.json.{gone[1]}.tmp",
                           tmp_path / f".b.json.{os.getppid()}.tmp")
    for f in (stale, young, alive):
        f.write_text("{")
    old = time.time() - 120
    os.utime(stale, (old, old))
    os.utime(alive, (old, old))
    check_baseline(analysis, path, update="failing")
    assert not stale.exists() and young.exists() and alive.exists() and path.exists()


def test_writes_of_one_file_from_threads_and_a_reader_never_see_half_a_file(tmp_path):
    """Atomic writes named their temporary file by the process alone: two threads writing
    one file (a cache entry) shared it and one write failed. --json files and saved results
    were written in place: a reader (or a second writer) saw half a file."""
    import threading

    from pytest_ptq import guard
    from pytest_ptq.results import write_json

    shared = tmp_path / "entry.bin"
    failed = []

    def write(k):
        try:
            for _ in range(200):
                guard.write_bytes(shared, bytes([k]) * 4096)
        except Exception as exc:  # noqa: BLE001 - the test reports what a thread raised
            failed.append(exc)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed and shared.read_bytes() in (bytes([0]) * 4096, bytes([1]) * 4096)
    assert not list(tmp_path.glob(".*.tmp"))
    out = tmp_path / "ranking.json"
    big = {"nodes": [{"node": f"n{k}", "cosine": k / 3} for k in range(20000)]}
    write_json(big, out)
    stop, torn = threading.Event(), []

    def read():
        while not stop.is_set():
            try:
                json.loads(out.read_text())
            except ValueError:
                torn.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(10):
        write_json(big, out)
    stop.set()
    reader.join()
    assert not torn
    assert str(write_json(big, os.devnull)) == os.devnull  # a device is written in place, not replaced


def test_an_atomic_write_falls_back_in_place_where_a_rename_cannot_replace_the_file(tmp_path, monkeypatch):
    """A --json file mounted on its own into a container cannot be replaced by a rename (EBUSY),
    and a file with a second name (a hard link) would part from it: both written in place."""
    import errno

    from pytest_ptq import guard
    from pytest_ptq.results import write_json

    linked, other = tmp_path / "out.json", tmp_path / "also.json"
    linked.write_text("{}")
    os.link(linked, other)
    write_json({"a": 1}, linked)
    assert json.loads(other.read_text()) == {"a": 1} and os.path.samefile(linked, other)

    def busy(tmp, path, tries=8):
        raise OSError(errno.EBUSY, "Device or resource busy")
    monkeypatch.setattr(guard, "replace", busy)
    mounted = tmp_path / "mounted.json"
    mounted.write_text("{}")
    write_json({"b": 2}, mounted)
    assert json.loads(mounted.read_text()) == {"b": 2} and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("links", [True, False])
def test_an_exclusive_write_never_replaces_a_file_made_meanwhile(tmp_path, monkeypatch, links):
    """A missing baseline is created exclusively (two xdist workers writing it: the second
    compares); on a file system without hard links (FAT, some shares) it is still written."""
    import errno

    from pytest_ptq import guard

    if not links:
        def refuse(src, dst):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(os, "link", refuse)
    path = tmp_path / "b.json"
    guard.write_text(path, "first", atomic=True, exclusive=True)
    with pytest.raises(FileExistsError):
        guard.write_text(path, "second", atomic=True, exclusive=True)
    assert path.read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["b.json"]


# -- the plugin --------------------------------------------------------------------------------
@pytest.fixture
def plugin_project(pytester, template, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # pytest's own __pycache__ is not ours
    for entry in template.iterdir():
        (shutil.copytree if entry.is_dir() else shutil.copy)(entry, pytester.path / entry.name)
    return pytester


def _billion_laughs():
    """The classic: 9 levels of 9 aliases, some 400 bytes that expand to 9**9 strings."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


BOMB = _billion_laughs()

MARKED = """
import pytest

@pytest.mark.ptq(model="m.onnx", data="calib", {marker})
def test_b(ptq):
    ptq.assert_baseline()
"""

PLUGIN_CASES = [
    # (id, files, args, exit code, needles on one output line, declared outputs)
    ("report-onto-model", {}, ["--ptq-model", "m.onnx", "--ptq-data", "calib", "--ptq-report", "m.onnx"], 4,
     ["--ptq-report", "is the model file"], []),
    ("report-onto-foreign-file", {}, ["--ptq-report", "notes.txt"], 4,
     ["--ptq-report", "exists and is not a pytest-ptq report"], []),
    ("report-inside-data", {}, ["--ptq-data", "calib", "--ptq-report", "calib/r.html"], 4,
     ["inside the calibration data folder"], []),
    # an ini key is named as the ini key, not as the option the user never passed
    *((f"ini-{key}-inside-data", {"pytest.ini": f"[pytest]\n{key} = calib/out\n"}, ["--ptq-data", "calib"], 4,
       [f"ini key {key} '", "inside the calibration data folder"], []) for key in ("ptq_report", "ptq_cache_dir")),
    ("report-parent-is-a-file", {}, ["--ptq-report", "notes.txt/r.html"], 4, ["is a file, not a folder"], []),
    ("baseline-dir-inside-data", {}, ["--ptq-data", "calib", "--ptq-baseline-dir", "calib/baselines"], 4,
     ["--ptq-baseline-dir", "inside the calibration data folder"], []),
    ("baseline-dir-parent-is-a-file", {}, ["--ptq-baseline-dir", "notes.txt/b", "--ptq-update-baseline"], 4,
     ["--ptq-baseline-dir", "notes.txt' is a file, not a folder"], []),
    *((f"marker-{key}-{kind}", {"test_m.py": MARKED.format(marker=f"{key}={value}")}, [], 1,
       [f"ptq marker {key}={shown}: must be a path, got {got}"], [])
      for key in ("holdout", "float_model") for kind, value, shown, got in (
          ("empty", '""', "''", "an empty string"), ("list", '["a", "b"]', "['a', 'b']", "['a', 'b']"))),
    ("marker-baseline-onto-model", {"test_m.py": MARKED.format(marker='baseline="m.onnx"')},
     ["--ptq-update-baseline"], 1, ["baseline", "m.onnx' is the model file"], []),
    ("marker-baseline-into-data", {"test_m.py": MARKED.format(marker='baseline="calib/x/b.json"')},
     ["--ptq-update-baseline"], 1, ["lies inside the calibration data folder"], []),
    ("marker-baseline-folder-is-a-file", {"test_m.py": MARKED.format(marker='baseline="notes.txt/b.json"')},
     ["--ptq-update-baseline"], 1, ["baseline '", "notes.txt' is a file, not a folder"], []),
    ("yaml-baseline-onto-model", {"c.ptq.yaml": "model: m.onnx\ndata: calib\nbaseline: m.onnx\n"}, [], 2,
     ["contract 'c.ptq.yaml'", "is the model file"], []),
    ("yaml-baseline-onto-itself", {"c.ptq.yaml": "model: m.onnx\ndata: calib\nbaseline: c.ptq.yaml\n"}, [], 2,
     ["is the contract file"], []),
    ("yaml-alias-bomb", {"bomb.ptq.yaml": BOMB}, [], 2,
     ["expands to more than", "aliases"], []),
    ("yaml-huge", {"big.ptq.yaml": "# " + "x" * (2 * 2**20) + "\nmodel: m.onnx\n"}, [], 2,
     ["is 2.0 MiB; a contract is a few lines"], []),
    ("yaml-not-utf8", {"bin.ptq.yaml": b"model: \xff\xfe\n"}, [], 2, ["is not UTF-8 text"], []),
    ("yaml-python-object", {"obj.ptq.yaml": "model: !!python/object/apply:os.system ['touch pwned']\n"}, [], 2,
     ["is not valid YAML", "could not determine a constructor"], []),
    ("yaml-long-value", {"long.ptq.yaml": "model: m.onnx\ndata: calib\nbaseline: false\noutputs: " + "9" * 500 + "x\n"},
     [], 2, ["'outputs' must be a number", "..."], []),
    ("yaml-outputs-default-twice", {"d.ptq.yaml": "model: m.onnx\ndata: calib\nbaseline: false\n"
                                                  "outputs: {'': 0.9, default: 0.5}\n"}, [], 2,
     ["contract 'd.ptq.yaml': 'outputs': the thresholds {'': 0.9, 'default': 0.5} give the default twice "
      "('default' and ''); give it once"], []),
    ("yaml-model-is-a-folder", {"d.ptq.yaml": "model: calib\ndata: calib\nbaseline: false\n"}, [], 1,
     ["check outputs: model", "is a folder; pass the .onnx file"], []),
    ("yaml-evaluate-broken", {"e.ptq.yaml": "model: m.onnx\ndata: calib\nbaseline: false\n"
                                            "accuracy: {evaluate: ev.py:top1}\n", "ev.py": "def top1(:\n"},
     ["-k", "accuracy"], 1, ["'accuracy.evaluate' file", "fails to import at line 1 (SyntaxError"], []),
    # a script that parses its own arguments on import exits: argparse's usage read as pytest's
    ("yaml-evaluate-exits-on-import", {"e.ptq.yaml": "model: m.onnx\ndata: calib\nbaseline: false\n"
                                                     "accuracy: {evaluate: ev.py:top1}\n",
                                       "ev.py": "import sys\nsys.exit(2)\n"},
     ["-k", "accuracy"], 1, ["'accuracy.evaluate' file", "fails to import at line 2 (SystemExit: 2)"], []),
    ("yaml-evaluate-one-argument", {"e.ptq.yaml": "model: m.onnx\ndata: calib\nbaseline: false\n"
                                                  "accuracy: {evaluate: ev.py:top1}\n",
                                    "ev.py": "def top1(run):\n    return 1.0\n"},
     ["-k", "accuracy"], 1, ["check accuracy: evaluate function top1(run) cannot be called as top1(run, data)"], []),
    # the check_* forms and suggest fail bad input in its sentence, as the assert_* forms do
    *((f"fixture-{call.split('(')[0]}-bad-argument", {"test_c.py": "import pytest\n\n"
                                                    "@pytest.mark.ptq(model='m.onnx', data='calib')\n"
                                                    f"def test_c(ptq):\n    ptq.{call}\n"},
       [], 1, [needle], [])
      for call, needle in (("check_nodes(node_type='op')", "unknown node_type 'op'"),
                           ("suggest(remedy='fp16')", "unknown remedy 'fp16'"),
                           ("check_accuracy(lambda run: 1.0)", "cannot be called as <lambda>(run, data)"))),
]


@pytest.mark.parametrize("files,args,code,needles,declared", [c[1:] for c in PLUGIN_CASES],
                         ids=[c[0] for c in PLUGIN_CASES])
def test_plugin_refuses_in_one_sentence(plugin_project, files, args, code, needles, declared):
    for name, content in files.items():
        path = plugin_project.path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    before = tree(plugin_project.path)
    start = time.perf_counter()
    result = run_pytest(plugin_project, *args)
    assert time.perf_counter() - start < 30
    out = result.outlines + result.errlines
    assert result.ret == code, "\n".join(out)
    text = "\n".join(out)
    assert "Traceback" not in text and not any(line.startswith(">  ") for line in out), text
    hits = [line for line in out if all(n in line for n in needles)]
    assert hits, text
    assert_untouched(before, tree(plugin_project.path), declared)


def test_unwritable_report_is_an_error_line_and_the_summary_prints(plugin_project):
    """The report's folder turns into a file during the run: the tests' results stand, the
    summary prints, and one line says why there is no report."""
    plugin_project.makepyfile(test_r="""
        import shutil
        from pathlib import Path

        def test_blocks_the_report():
            shutil.rmtree("out")  # the folder of the page the run wrote as it started
            Path("out").write_text("a file where the report's folder should be")
    """)
    before = tree(plugin_project.path)
    result = run_pytest(plugin_project, "--ptq-report", "out/r.html")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["ERROR: the ptq report was not written: --ptq-report '*out/r.html' cannot be "
                                 "written because '*out' is a file, not a folder; remove that file or choose another "
                                 "path", "*1 passed*"])
    assert "Traceback" not in result.stdout.str()
    assert_untouched(before, tree(plugin_project.path), declared=["out"])


def test_malformed_baseline_fails_and_update_repairs_it(plugin_project):
    plugin_project.makepyfile(test_m=MARKED.format(marker='baseline="b.json"'))
    plugin_project.path.joinpath("b.json").write_text('{"format": 1, "metric": "cosine-similarity", '
                                                      '"node_type": "node", "outputs": "0.99", "sensitivity": {}}')
    before = tree(plugin_project.path)
    failed = run_pytest(plugin_project)
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*baseline b.json has a malformed 'outputs': it must be a mapping of output names to "
                                 "numbers, got '0.99'; rewrite it with `pytest -p * test_m.py::test_b "
                                 "--ptq-update-baseline`"])
    # said once: no model block repeats it, as no diagnosis explains a malformed file (pytest's
    # own short summary repeats the exception line when the terminal is wide enough for it)
    details = failed.stdout.str().split("short test summary info")[0]
    assert details.count("has a malformed 'outputs'") == 1
    assert_untouched(before, tree(plugin_project.path))
    run_pytest(plugin_project, "--ptq-update-baseline").assert_outcomes(failed=1)
    run_pytest(plugin_project).assert_outcomes(passed=1)
    assert_untouched(before, tree(plugin_project.path), declared=["b.json"])


def test_baseline_outside_the_rootdir_is_warned_about(plugin_project, tmp_path):
    outside = tmp_path / "elsewhere" / "b.json"
    plugin_project.makepyfile(test_m=MARKED.format(marker=f"baseline={str(outside)!r}"))
    result = run_pytest(plugin_project, "--ptq-update-baseline")
    result.stdout.fnmatch_lines([f"*PTQPathWarning: baseline '{outside}' lies outside the rootdir*"])
    assert outside.exists()
    # at the test's line that asked for it, not the package's (a filterwarnings by module)
    result.stdout.fnmatch_lines(["*test_m.py:*: PTQPathWarning: baseline*"])


def test_bad_input_to_a_check_can_be_caught_as_a_ptq_error(plugin_project):
    """The check_* forms fail bad input in one sentence; a test that expects it still
    catches it as the PTQError it is."""
    plugin_project.makepyfile(test_c="""
        import pytest
        from pytest_ptq.errors import PTQError

        @pytest.mark.ptq(model="m.onnx", data="calib")
        def test_c(ptq):
            with pytest.raises(PTQError, match="unknown node_type 'op'"):
                ptq.check_nodes(node_type="op")
    """)
    run_pytest(plugin_project).assert_outcomes(passed=1)


def test_a_decorated_evaluate_function_is_taken_by_the_arguments_its_decorator_takes():
    import functools

    from pytest_ptq.params import evaluation_function

    def with_labels(fn):
        @functools.wraps(fn)
        def wrapped(run, data):
            return fn(run, data, labels=[1])
        return wrapped

    @with_labels
    def top1(run, data, labels):
        return 1.0

    assert evaluation_function(top1) is top1
    with pytest.raises(PTQError, match=r"function top1\(run, data, labels\) cannot be called as top1\(run, data\)"):
        evaluation_function(top1.__wrapped__)  # undecorated, it needs its labels


ASIDE = "ignore::pytest.PytestAssertRewriteWarning"


def test_report_outside_the_rootdir_is_written_without_a_warning(plugin_project, tmp_path):
    # an artifacts folder beside the checkout is a usual CI layout: nothing to keep with the project
    outside = tmp_path / "reports" / "r.html"
    result = run_pytest(plugin_project, f"--ptq-report={outside}")  # '=': not a path to test too
    result.stdout.fnmatch_lines([f"*ptq report: {outside}*"])
    result.stdout.no_fnmatch_line("*PTQPathWarning*")
    assert outside.read_text().startswith("<!DOCTYPE html>")
    # ... also where warnings are errors
    # (the in-process run's own warning that the plugin was imported before pytest asked aside)
    result = run_pytest(plugin_project, f"--ptq-report={outside}", "-W", "error", "-W", ASIDE)
    result.stdout.fnmatch_lines([f"*ptq report: {outside}*"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_a_baseline_folder_outside_the_rootdir_where_warnings_are_errors_is_one_usage_error(plugin_project, tmp_path):
    outside = tmp_path / "baselines"
    warned = run_pytest(plugin_project, f"--ptq-baseline-dir={outside}")
    warned.stdout.fnmatch_lines([f"*PTQPathWarning: --ptq-baseline-dir: the baseline folder '{outside}' lies outside "
                                 "the rootdir*"])
    plugin_project.makeini(f"[pytest]\nfilterwarnings =\n    error\n    {ASIDE}\n")
    refused = run_pytest(plugin_project, f"--ptq-baseline-dir={outside}")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines([f"*--ptq-baseline-dir: the baseline folder '{outside}' lies outside the rootdir*"
                                  "(warnings are errors in this run)"])
    assert "INTERNALERROR" not in refused.stdout.str() + refused.stderr.str()


@pytest.mark.parametrize("form", ["space", "equals"])
def test_a_model_outside_the_start_folder_that_moved_the_rootdir_is_said(plugin_project, monkeypatch, form):
    """pytest reads '--ptq-model ../m.onnx' as a path to test too: the rootdir moved up to the
    common parent, and the baselines with it. The '=' form leaves it where pytest starts."""
    start = plugin_project.path / "proj"
    start.mkdir()
    (start / "test_p.py").write_text("def test_p(ptq):\n    ptq.assert_outputs({'': 0.5})\n")
    (start / "pytest.ini").write_text("[pytest]\nptq_min_cosine = 0.5\n")  # the project's, which pytest then skips
    monkeypatch.chdir(start)
    args = ["--ptq-model", "../m.onnx", "--ptq-data", "../calib"] if form == "space" else [
        "--ptq-model=../m.onnx", "--ptq-data=../calib"]
    result = run_pytest(plugin_project, *args)
    result.assert_outcomes(passed=1)
    said = "*PTQPathWarning: --ptq-model ../m.onnx, --ptq-data ../calib: pytest read their values as paths to test " \
        f"too and moved the rootdir to '{plugin_project.path}', where baselines and relative outputs now go, and " \
        f"read no ini file (not '{start / 'pytest.ini'}': its ptq_ keys and baseline folder are not in force); " \
        "write --ptq-model=../m.onnx --ptq-data=../calib, or pin the rootdir*"
    if form == "space":
        result.stdout.fnmatch_lines([said])
    else:
        assert "PTQPathWarning" not in result.stdout.str()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_plugin_refuses_a_model_that_is_not_a_regular_file(plugin_project, kind):
    """With pytest's cache on (the default), the result cache hashes what the model names
    before anything reads it: a pipe blocked it, a device filled memory."""
    target = "/dev/zero"
    if kind == "fifo":
        os.mkfifo(plugin_project.path / "pipe.onnx")
        target = "pipe.onnx"
    result = plugin_project.runpytest_subprocess("--ptq-model", target, "--ptq-data", "calib", "-p", "no:xdist",
                                                 timeout=120)
    result.stdout.fnmatch_lines([f"*model file '*{target}' is not a regular file (a device or a pipe)*"])
    assert result.ret == 1


def test_pairs_inside_a_branch_are_named_as_not_analysed(project, capsys):
    """Q/DQ in an If's branches beside the main graph's pairs: the analyses see the main
    graph's only, and say so."""
    model = onnx.load(str(project / "m.onnx"))
    moved = [n for n in model.graph.node if n.name in ("relu1", "r1_QuantizeLinear", "r1_DequantizeLinear")]
    out = moved[-1].output[0]

    def branch(tag):
        nodes = [onnx.helper.make_node(n.op_type, list(n.input), list(n.output), name=n.name + tag) for n in moved]
        return onnx.helper.make_graph(nodes, tag, [], [onnx.helper.make_tensor_value_info(out, 1, None)])

    at = [k for k, n in enumerate(model.graph.node) if n.name == moved[0].name][0]
    for n in moved:
        model.graph.node.remove(n)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(True), "cond"))
    model.graph.node.insert(at, onnx.helper.make_node("If", ["cond"], [out], name="gate",
                                                      then_branch=branch("_t"), else_branch=branch("_e")))
    onnx.save(model, str(project / "branch.onnx"))
    assert main(["list-nodes", "branch.onnx"]) == 0
    assert ("4 quantized node(s) (2 QuantizeLinear, 2 DequantizeLinear) inside the subgraphs of If 'gate' are not "
            "analysed"
            in capsys.readouterr().out)


def test_a_sample_onnxruntime_refuses_is_named_and_a_wrong_float_model_is_suspected(tmp_path, capsys):
    """An index out of an embedding's range in one sample, and a float model of another net,
    both read "the model does not run as stored": neither named the sample nor the mismatch."""
    helper, rng = onnx.helper, np.random.default_rng(0)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"]),
                               helper.make_node("Relu", ["e"], ["y"])], "embed",
                              [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8])],
                              [onnx.numpy_helper.from_array(table, "table")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"ids": [rng.integers(0, 50, (1, 4)).astype(np.int64) for _ in range(4)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    data["ids"][2] = data["ids"][2].copy()
    data["ids"][2][0, 1] = 999
    folder = builders.save_folder(data, tmp_path / "calib")
    assert main(["get-sensitivity-of-nodes", str(q), str(folder), "--quiet", "--json", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert "idx=999" in err and "check the data's values: an index outside the range the model takes" in err
    assert f"(on calibration sample 2: {folder / 'ids' / '2.npy'})" in err
    other = builders.conv_net(tmp_path / "other.onnx")
    builders.save_folder({"ids": data["ids"][:2]}, tmp_path / "good")
    assert main(["get-sensitivity-of-nodes", str(q), str(tmp_path / "good"), "--float-model", str(other),
                 "--quiet", "--json", str(tmp_path / "s.json")]) == 2
    assert "check that it is the float model this model was quantized from" in capsys.readouterr().err
    # the quantized model's own failure (feeds of an evaluate function) is no float model's
    with pytest.raises(PTQError, match="check the data's shapes and dtypes against the model's inputs$"):
        dbg.Engine(q, tmp_path / "good").run({"ids": np.zeros((1, 4), np.float32)})


def test_token_ids_and_a_mask_of_other_lengths_are_told_to_fit_each_other(tmp_path, capsys):
    """Each input fits the model's dynamic shape alone, not together: the broadcast failed,
    and the sentence blamed the model ("does not run as stored")."""
    helper, rng = onnx.helper, np.random.default_rng(1)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"]),
                               helper.make_node("Unsqueeze", ["mask", "axis"], ["m"]),
                               helper.make_node("Cast", ["m"], ["mf"], to=onnx.TensorProto.FLOAT),
                               helper.make_node("Mul", ["e", "mf"], ["y"])], "masked",
                              [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, "n"]),
                               helper.make_tensor_value_info("mask", onnx.TensorProto.INT64, [1, "m"])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, "n", 8])],
                              [onnx.numpy_helper.from_array(table, "table"),
                               onnx.numpy_helper.from_array(np.array([2], np.int64), "axis")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"ids": [rng.integers(0, 50, (1, 6)) for _ in range(3)], "mask": [np.ones((1, 6), np.int64)] * 3}
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    data["mask"] = [np.ones((1, 6), np.int64), np.ones((1, 5), np.int64), np.ones((1, 6), np.int64)]
    folder = builders.save_folder(data, tmp_path / "calib")
    assert main(["get-sensitivity-of-nodes", str(q), str(folder), "--quiet", "--json", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert "check that the sample's inputs fit each other (token ids and their mask of one length" in err
    assert "does not run as stored" not in err and f"{folder / 'mask' / '1.npy'}" in err


def _fixed_inside(tmp_path, count, odd):
    """A net whose input leaves H and W open but whose Flatten -> Gemm takes 16x16 only, and
    ``count`` samples of 16x16 but for ``odd``, 16x20: (model, float model, data folder)."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    wf = (rng.standard_normal((10, 4 * 16 * 16)) * 0.05).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
                               helper.make_node("Gemm", ["f", "wf"], ["y"], transB=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(wf, "wf")])
    fp = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(count)]}
    q = builders.quantize(fp, tmp_path / "q.onnx", data)
    data["x"][odd] = rng.standard_normal((1, 3, 16, 20)).astype(np.float32)
    folder = builders.save_folder(data, tmp_path / "calib")
    # what a plain session says: every sample runs but the odd one, which fails in the Gemm
    for i in range(count):
        feeds = {"x": np.load(folder / "x" / f"{i}.npy")}
        if i == odd:
            with pytest.raises(Exception, match="Gemm"):
                builders.run_model(q, feeds)
        else:
            builders.run_model(q, feeds)
    return q, fp, folder


def _shape_sentence(folder, odd, others, ran=True):
    """The sentence the tool must say, from the files' own shapes."""
    mine = list(np.load(folder / "x" / f"{odd}.npy").shape)
    theirs = {str(list(np.load(folder / "x" / f"{i}.npy").shape)) for i in others}
    assert len(theirs) == 1 and str(mine) not in theirs
    where = "the samples that run are" if ran else "the other samples are"
    return (f"on calibration sample {odd} ({folder / 'x' / f'{odd}.npy'}), whose input 'x' is {mine} where {where} "
            f"{theirs.pop()}: the model's open axes {'are not' if ran else 'may not be'} free inside it (")


@pytest.mark.parametrize("count,odd", [(5, 3), (12, 1)], ids=["checked-first", "past-the-checks"])
@pytest.mark.parametrize("command", ["get-sensitivity-of-nodes", "stages", "runall", "plot-acc-error"])
def test_a_sample_of_a_size_the_model_fixes_inside_is_blamed_not_the_model(tmp_path, capsys, command, count, odd):
    """An open H and W in the declared input, a Gemm sized for 16x16 inside, one sample of
    16x20: every command blamed the model ("does not run as stored"), which runs the other
    samples; past the float-equivalence check's samples (12 samples, the odd one unchecked),
    the sentence did not even name the sample."""
    q, fp, folder = _fixed_inside(tmp_path, count, odd)
    args = {"get-sensitivity-of-nodes": [str(q), str(folder), "--quiet"],
            "stages": [str(fp), str(q), str(folder)],
            "runall": [str(q), str(folder), "--quiet", "-s", str(tmp_path / "out")],
            "plot-acc-error": [str(q), str(folder), "-s", str(tmp_path / "out")]}[command]
    assert main([command, *args]) == 2
    err = capsys.readouterr().err
    assert _shape_sentence(folder, odd, [i for i in range(count) if i != odd]) in err
    assert "GEMM: Dimension mismatch" in err and err.rstrip().endswith(
        "resize the sample or fix the model's declared shape")
    assert "does not run as stored" not in err


def test_a_first_sample_of_another_size_is_set_against_the_others_and_a_failure_of_like_shapes_blames_the_model(
        tmp_path, capsys):
    """Before any sample ran, the others' shapes (read from their headers) are what a failing
    sample's are set against; where the failing sample's shapes are those of the others, the
    model is blamed as before."""
    q, _, folder = _fixed_inside(tmp_path, 4, 0)
    assert main(["get-sensitivity-of-nodes", str(q), str(folder), "--quiet"]) == 2
    assert _shape_sentence(folder, 0, [1, 2, 3], ran=False) in capsys.readouterr().err
    # a Reshape to a shape one sample's values give: its shapes are the others', the model is blamed
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((16, 4)) * 0.3).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                                    helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(w, "w")])
    fp = tmp_path / "r.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp)
    data = {"x": [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(3)],
            "s": [np.array([1, 16], np.int64)] * 3}
    q = builders.quantize(fp, tmp_path / "rq.onnx", data)
    data["s"] = [np.array([1, 16], np.int64), np.array([2, 16], np.int64), np.array([1, 16], np.int64)]
    folder = builders.save_folder(data, tmp_path / "rcalib")
    with pytest.raises(Exception):
        builders.run_model(q, {k: v[1] for k, v in data.items()})
    assert main(["get-sensitivity-of-nodes", str(q), str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the model does not run as stored in onnxruntime; check it in a plain onnxruntime session (on calibration " \
           "sample 1: " in err and "whose" not in err
    assert f"{folder / 'x' / '1.npy'}" in err and f"{folder / 's' / '1.npy'}" in err


def test_plugin_blames_a_sample_of_a_size_the_model_fixes_inside(tmp_path, pytester):
    """The plugin's checks run the same engine: the failing test says which sample, and how
    its shape differs, in the one sentence."""
    q, _, folder = _fixed_inside(tmp_path, 5, 3)
    pytester.makepyfile("def test_outputs(ptq):\n    ptq.assert_outputs()\n")
    result = run_pytest(pytester, f"--ptq-model={q}", f"--ptq-data={folder}", "-p", "no:xdist")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert _shape_sentence(folder, 3, [0, 1, 2, 4]) in " ".join(out.split())
    assert "does not run as stored" not in out and "Traceback" not in out


def test_an_atomic_write_keeps_the_files_permissions(tmp_path):
    """A baseline rewritten by --ptq-update-baseline came back with the umask's mode, not its own."""
    from pytest_ptq import guard

    path = tmp_path / "model.baseline.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    guard.write_text(path, "new", atomic=True)
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o640


@pytest.mark.skipif(builders.AS_ROOT, reason="root writes read-only files")
def test_a_read_only_file_is_not_replaced(tmp_path):
    """An atomic write renames over the file, which its read-only mode does not stop: a
    baseline made read-only was replaced, and came back writable."""
    from pytest_ptq import guard

    path = tmp_path / "model.baseline.json"
    path.write_text("kept")
    os.chmod(path, 0o444)
    with pytest.raises(PTQError, match="is read-only; make it writable or choose another path"):
        guard.write_text(path, "new", atomic=True)
    with pytest.raises(PTQError, match="is read-only; choose another path or fix its permissions"):
        guard.check_writable(path, "baseline", atomic=True)
    assert path.read_text() == "kept"


def test_on_windows_a_process_is_asked_for_its_exit_code_never_sent_a_signal(monkeypatch):
    """``os.kill(pid, 0)`` is a Ctrl+C to a console process group on Windows, and fails with a
    plain OSError for other numbers: every process read as alive (a killed run's temporary
    folders never removed) and a live group could be interrupted. Windows is asked for the
    process's exit code instead."""
    import ctypes
    import types

    from pytest_ptq import guard

    processes = {11: 259, 12: 0}  # a live process (STILL_ACTIVE), one that exited
    state = {"error": 0}

    def open_process(access, inherit, pid):
        if pid in processes:
            return pid
        state["error"] = 5 if pid == 13 else 87  # 13: another user's (access denied)
        return 0

    def exit_code(handle, code):
        code._obj.value = processes[handle.value]
        return 1

    kernel32 = types.SimpleNamespace(OpenProcess=open_process, GetExitCodeProcess=exit_code,
                                     CloseHandle=lambda handle: 1)

    def kill(pid, sig):
        raise AssertionError("os.kill on Windows")

    monkeypatch.setattr(guard.sys, "platform", "win32")
    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(ctypes, "WinDLL", lambda name, use_last_error=False: kernel32, raising=False)
    monkeypatch.setattr(ctypes, "get_last_error", lambda: state["error"], raising=False)
    assert [guard.alive(pid) for pid in (11, 12, 13, 14, 2 ** 40)] == [True, False, True, False, False]


@pytest.mark.parametrize("platform", ["win32", "linux"])
def test_on_windows_a_file_another_process_holds_open_is_replaced_once_it_lets_go(tmp_path, monkeypatch, platform):
    """Windows refuses to replace a file another process has open (a reader, a virus scanner)
    for a moment: the write waits for it there, and says one sentence where it never lets go.
    Elsewhere a refusal is a permission, not a moment: no waiting."""
    from pytest_ptq import guard

    real, calls, held = os.replace, [], {"times": 2}

    def replace(src, dst):
        calls.append(dst)
        if len(calls) <= held["times"]:
            raise PermissionError(13, "The process cannot access the file", str(dst))
        return real(src, dst)

    monkeypatch.setattr(guard.sys, "platform", platform)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(guard.time, "sleep", lambda s: None)
    path = tmp_path / "baseline.json"
    path.write_text("old")
    if platform == "win32":
        guard.write_text(path, "new", atomic=True)
        assert (path.read_text(), len(calls)) == ("new", 3)
    calls.clear()
    held["times"] = 100  # never let go
    held_open = "close the program that has it open" if platform == "win32" else "fix its permissions"
    with pytest.raises(PTQError, match=f"cannot write .*baseline.json.*{held_open}"):
        guard.write_text(path, "newer", atomic=True, again=True)
    assert path.read_text() == ("new" if platform == "win32" else "old")
    assert len(calls) == (8 if platform == "win32" else 1)
    assert not list(tmp_path.glob(".*.tmp"))  # nothing left behind


def test_a_temporary_folder_a_killed_run_left_is_removed_by_the_next(tmp_path, monkeypatch):
    """suggest without a save folder re-quantizes into a temporary folder; a run killed there
    (kill -9, a CI limit) left it, a model's size, and no later run removed it. The folders
    carry their process's id: the next run removes those of processes gone (a minute old)."""
    import tempfile
    import time

    from pytest_ptq import guard

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = time.time() - 3600
    dead = 4194305  # past Linux's largest process id: no such process
    gone = tmp_path / f"ptq_remedy_{dead}_abc"
    just_made = tmp_path / f"ptq_remedy_{dead}_def"
    alive = tmp_path / f"ptq_remedy_{os.getppid()}_ghi"
    other = tmp_path / "ptq_remedy_notes"
    for folder in (gone, just_made, alive, other):
        folder.mkdir()
        (folder / "requantized_float.onnx").write_bytes(b"\0" * 16)
    for folder in (gone, alive, other):
        os.utime(folder, (old, old))
    out, temporary = guard.output_folder(None, "ptq_remedy_")
    try:
        assert out.name.startswith(f"ptq_remedy_{os.getpid()}_") and out.is_dir()
        assert not gone.exists() and just_made.exists() and alive.exists() and other.exists()
    finally:
        temporary.cleanup()


def test_non_finite_outputs_on_ordinary_inputs_point_at_the_model(tmp_path):
    # Log of a MatMul's output, negative for most values: the model's arithmetic, not its data
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                               helper.make_node("Log", ["h"], ["y"], name="log")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "f.onnx")
    data = {"x": [rng.normal(size=(1, 8)).astype(np.float32) for _ in range(4)]}
    q = builders.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", data)
    with pytest.raises(PTQError) as err:
        dbg.Engine(q, data)
    text = str(err.value)
    assert "with every Q/DQ pair quantized, and with every pair bypassed, gives non-finite values in output 'y'" in text
    assert "the model's own arithmetic gives them" in text and "overflows on its data" not in text


def test_a_long_name_of_escaped_characters_is_cut_once_in_messages():
    # reprlib cut the escaped text where the raw text would be cut: '..._QuantizeLinearizeLinear'
    from pytest_ptq.errors import shown

    said = shown("\x01" * 20 + "_QuantizeLinear")
    assert said.endswith("_QuantizeLinear'") and said.count("QuantizeLinear") == 1 and len(said) <= 80
    assert shown("conv1") == "'conv1'" and len(shown("a" * 500)) <= 80 and shown("a" * 500).count("...") == 1
    said = shown("it's " + "a" * 100 + "bc")  # quoted once, in the style the whole text takes
    assert said.startswith('"it\'s aaa') and said.endswith('aabc"') and said.count("...") == 1 and len(said) <= 80


def test_no_usable_temporary_folder_is_one_sentence(monkeypatch):
    # /tmp read-only and TMPDIR unset: the report's figures raised a bare FileNotFoundError
    import tempfile

    from pytest_ptq import guard

    def none_usable():
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(tempfile, "gettempdir", none_usable)
    with pytest.raises(PTQError, match=r"no temporary folder can be written \(No usable temporary directory .*\); "
                                       "set TMPDIR to a writable folder"):
        with guard.scratch("ptq-curves-"):
            pass


def test_an_array_in_a_message_stays_on_one_line():
    # numpy's repr breaks before the dtype: an error "in one sentence" spanned two lines
    import numpy as np

    from pytest_ptq.errors import shown

    for array in (np.zeros((2, 3, 4), np.float32), np.linspace(-1e-3, 2.0, 120, dtype=np.float32).reshape(2, 1, 3, 4, 5)):
        said = shown(array)
        assert "\n" not in said and len(said) <= 80


def test_node_names_holding_newlines_and_escapes_stay_on_their_line_in_the_log(pytester, tmp_path):
    """A model from a pull request named its nodes "...\\n::error file=README.md::INJECTED\\n
    \\x1b[32m3 passed": the failure's sentence and the ptq summary printed them raw, so the
    CI log got a GitHub workflow command and a fake green line of their own."""
    data = builders.samples(4)
    builders.save_folder(data, pytester.path / "calib")
    fp = builders.conv_net(pytester.path / "float.onnx", outlier_channel=3)
    builders.quantize(fp, tmp_path / "q.onnx", {k: [a * 0.1 for a in v] for k, v in data.items()})
    model = onnx.load(str(tmp_path / "q.onnx"))
    tail = "\n::error file=README.md,line=1::INJECTED\n\x1b[32m3 passed\x1b[0m"
    for node in model.graph.node:
        node.name += tail
    onnx.save(model, str(pytester.path / "q.onnx"))
    result = run_pytest(pytester, "--ptq-model=q.onnx", "--ptq-data=calib", "--ptq-float-model=float.onnx",
                        "-p", "no:xdist")
    result.assert_outcomes(failed=3)  # outputs, nodes and baseline of the built-in contract
    out = result.stdout.str() + result.stderr.str()
    assert "INJECTED" in out and "\\n::error file=README.md" in out  # the names, shown escaped
    assert not [line for line in out.splitlines() if line.lstrip("E ").startswith("::error") or "\x1b[32m" in line]


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges on Windows")
def test_no_output_is_written_through_a_symbolic_link(pytester, tmp_path):
    """A link committed as the report's path (or in an output folder) pointing outside the
    project, where no file is yet: the report was written through it, creating the file
    there."""
    data = builders.samples(4)
    builders.save_folder(data, pytester.path / "calib")
    builders.quantize(builders.conv_net(pytester.path / "float.onnx"), pytester.path / "q.onnx", data)
    outside = tmp_path / "outside"
    outside.mkdir()
    (pytester.path / "report.html").symlink_to(outside / "victim.html")
    result = run_pytest(pytester, "--ptq-model=q.onnx", "--ptq-data=calib", "--ptq-report=report.html")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*the report 'report.html' is a symbolic link (to '*victim.html'); pytest-ptq "
                                 "writes no file through a link: remove the link or give another path"])
    (pytester.path / "out").mkdir()
    (pytester.path / "out" / "summary.json").symlink_to(outside / "summary.json")
    run = subprocess.run([sys.executable, "-m", "pytest_ptq", "runall", "q.onnx", "calib", "-s", "out"],
                         cwd=pytester.path, capture_output=True, text=True)
    assert run.returncode == 2 and "'out/summary.json' is a symbolic link" in run.stderr, run.stderr
    (pytester.path / "out" / "summary.json").unlink()
    (outside / "figures").mkdir()
    (pytester.path / "out" / "distributions").symlink_to(outside / "figures")  # a folder runall makes itself
    run = subprocess.run([sys.executable, "-m", "pytest_ptq", "runall", "q.onnx", "calib", "-s", "out"],
                         cwd=pytester.path, capture_output=True, text=True)
    assert run.returncode == 2 and "runall's folder 'out/distributions' is a symbolic link" in run.stderr, run.stderr
    assert list(outside.iterdir()) == [outside / "figures"] and not list((outside / "figures").iterdir())


def test_a_baseline_failure_lists_names_from_the_model_and_the_baseline_escaped():
    """The failure's sentence was escaped but its details listed each moved node raw, and a
    name from the model or the committed baseline file wrote lines of its own into the log."""
    from pytest_ptq.baseline import Diff, Move
    from pytest_ptq.checks import BaselineResult

    evil = "conv\n::error file=x.py::all good\n\x1b[32m3 passed\x1b[0m"
    diff = Diff(metric="cosine-similarity", tolerance=0.001, nodes=[Move(evil, 0.99, 0.9, 0.09)], outputs=[],
                improved=[], removed=[evil], added=[evil], notes=[])
    text = BaselineResult(passed=False, status="degraded", path="b.json", diff=diff, tolerance=0.001,
                          model="q.onnx").text
    assert "\x1b" not in text and not [line for line in text.splitlines() if line.lstrip().startswith("::")]
    assert "  conv\\n::error file=x.py::all good\\n\\x1b[32m3 passed\\x1b[0m: 0.990000 -> 0.900000" in text


def test_names_in_a_baseline_files_notes_and_in_data_findings_stay_on_their_line():
    """A committed baseline's output name or tool version, and a model input's name in a data
    finding, holding a newline wrote lines of their own into the failure's details."""
    from pytest_ptq import baseline
    from pytest_ptq.checks import BaselineResult, DataResult

    old = baseline.Baseline("cosine-similarity", "node", {"out": 0.99, "gone\nPASSED everything ok": 0.9},
                            {"a": 0.9, "b": 0.8}, tool={"pytest_ptq": "0.1\nFAKE LINE"})
    new = baseline.Baseline("cosine-similarity", "node", {"out": 0.5}, {"a": 0.9, "b": 0.8},
                            tool={"pytest_ptq": "0.2"})
    text = BaselineResult(passed=False, status="degraded", path="b.json", diff=baseline.compare(old, new, 0.01),
                          tolerance=0.01, model="m.onnx").text
    finding = {"check": "nan", "severity": "error", "message": "2 sample(s) hold NaN", "fix": "",
               "input": "x\nPASSED all good", "dataset": "calibration", "samples": []}
    text += "\n" + DataResult(passed=False, max_severity="warning", findings=[finding], samples=4, model="m.onnx",
                              data="d").text
    assert not [line for line in text.splitlines() if line.startswith(("PASSED", "FAKE"))], text
    assert "gone\\nPASSED everything ok" in text and "0.1\\nFAKE LINE" in text and "x\\nPASSED all good" in text


# -- SIGTERM (a CI time limit's signal) -------------------------------------------------------
# Held in a temporary folder of the tool's own until the test sends SIGTERM: guard.scratch and
# guard.output_folder make every such folder, and the block waits inside the first one made.
_HOLD_IN_SCRATCH = """
import contextlib, os, sys, time
from pytest_ptq import guard
made = guard.output_folder
def held(save_dir, prefix):
    folder, temporary = made(save_dir, prefix)
    if temporary is not None:
        with open(os.environ["PTQ_TEST_READY"], "w") as fh:
            fh.write(str(folder))
        time.sleep(120)
    return folder, temporary
guard.output_folder = held
"""


def _terminated(argv, cwd, tmp_path):
    """Run ``argv`` (with :data:`_HOLD_IN_SCRATCH` run first) in a TMPDIR of its own, send SIGTERM
    once it holds a temporary folder: ``(process, stdout, stderr, what is left in TMPDIR)``."""
    import signal

    scratch, ready = tmp_path / "tmpdir", tmp_path / "ready"
    scratch.mkdir()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1",
                                 "TMPDIR": str(scratch), "PTQ_TEST_READY": str(ready)})
    deadline = time.time() + 120
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    assert Path(ready.read_text()).is_dir()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    # onnxruntime's own session id file (.ses), none of ours
    return proc, out, err, sorted(p.name for p in scratch.iterdir() if p.name != ".ses")


def test_sigterm_ends_a_command_as_ctrl_c_does_its_temporary_folders_removed(project, tmp_path):
    """A CI limit's SIGTERM killed ``suggest`` at once (exit -15, nothing said): its folder of
    re-quantized models stayed in the temporary folder. It now cleans up as after Ctrl-C, says
    so in one line and exits 143, as a shell reports SIGTERM."""
    before = tree(project)
    proc, out, err, left = _terminated(
        [sys.executable, "-c", _HOLD_IN_SCRATCH + "from pytest_ptq.cli import main; sys.exit(main())",
         "suggest", "m.onnx", "calib", "--float-model", "f.onnx", "--target-cosine", "0.99999999", "--no-save", "--quiet"],
        project, tmp_path)
    assert proc.returncode == 143, err
    one_line(err, "ptq-debug suggest: terminated (SIGTERM) before it finished")
    assert left == []
    assert_untouched(before, tree(project))


def test_sigterm_ends_a_pytest_run_as_ctrl_c_does_its_temporary_folders_removed(pytester, tmp_path):
    """Under pytest, SIGTERM ended the run at once (exit -15): the report's figure folder stayed
    and its page said the run had not finished. Now pytest ends it as after Ctrl-C (its
    interrupted status), the folder is gone and the page says the run was interrupted."""
    data = builders.samples(4)
    builders.save_folder(data, pytester.path / "calib")
    builders.quantize(builders.conv_net(pytester.path / "float.onnx"), pytester.path / "q.onnx", data)
    pytester.makeconftest(_HOLD_IN_SCRATCH)
    proc, out, err, left = _terminated(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--ptq-model=q.onnx", "--ptq-data=calib",
         "--ptq-report=r.html"], pytester.path, tmp_path)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out + err
    assert "Traceback" not in out + err and "Terminated: terminated by SIGTERM" in out
    assert left == []
    assert "interrupted before its tests finished" in (pytester.path / "r.html").read_text()


def test_sigterm_while_a_pytest_run_ends_is_one_line_not_a_traceback(pytester, tmp_path):
    """SIGTERM while any plugin's pytest_sessionfinish ran came out as a traceback through every
    hook wrapper; it is one line, with pytest's interrupted status and the page saying so."""
    builders.save_folder(builders.samples(2), pytester.path / "calib")
    builders.quantize(builders.conv_net(pytester.path / "float.onnx"), pytester.path / "q.onnx",
                      builders.samples(2))
    pytester.makeconftest("""
import os, time
def pytest_sessionfinish(session):
    with open(os.environ["PTQ_TEST_READY"], "w") as fh:
        fh.write(os.getcwd())
    time.sleep(120)
""")
    proc, out, err, _ = _terminated(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--ptq-model=q.onnx", "--ptq-data=calib",
         "--ptq-report=r.html"], pytester.path, tmp_path)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out + err
    assert "Traceback" not in out + err and err == ""
    assert "pytest-ptq: terminated (SIGTERM) while the session ended; run it again to the end" in out.splitlines()
    assert "interrupted before its tests finished" in (pytester.path / "r.html").read_text()


def test_sigterm_keeps_a_handler_someone_else_installed():
    """Only Python's default is replaced (it runs no clean-up), and only until the block ends."""
    import signal

    from pytest_ptq import termination

    def theirs(signum, frame):
        """Someone else's handler: it does nothing."""

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with termination.as_interrupt() as ours:
            assert ours and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        signal.signal(signal.SIGTERM, theirs)
        with termination.as_interrupt() as ours:
            assert not ours and signal.getsignal(signal.SIGTERM) is theirs
        assert signal.getsignal(signal.SIGTERM) is theirs
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_suite_that_does_not_use_the_plugin_keeps_pythons_sigterm(pytester):
    """The handler is the plugin's business only where an item checks a model: a suite of its
    own tests keeps Python's default (what its code under test may rely on)."""
    pytester.makepyfile("""
import signal
def test_default():
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
""")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_sigterm_while_a_failure_is_explained_ends_the_run_drawing_nothing(pytester, tmp_path):
    """SIGTERM (or Ctrl-C) during the ranking of a failing test (minutes on a large model) stops
    pytest after that test, interrupted; but the test was its model's last, so the report's
    data for the model was computed and drawn on the way out, for a page that holds none."""
    data = builders.samples(4)
    builders.save_folder(data, pytester.path / "calib")
    builders.quantize(builders.conv_net(pytester.path / "float.onnx"), pytester.path / "q.onnx", data)
    # held in the explanation until the signal; what the report draws for a model leaves a mark
    pytester.makeconftest("""
import os, time
from pytest_ptq import report
from pytest_ptq.session import PTQSession
explain, payload_of = PTQSession.explain, report.payload_of
def held(self, item):
    with open(os.environ["PTQ_TEST_READY"], "w") as fh:
        fh.write(os.getcwd())
    time.sleep(120)
    return explain(self, item)
def drawn(session, analysis):
    open("drawn", "a").close()
    return payload_of(session, analysis)
PTQSession.explain, report.payload_of = held, drawn
""")
    pytester.makepyfile(test_fails="""
import pytest

@pytest.mark.ptq(model="q.onnx", data="calib")
def test_fails(ptq):
    ptq.assert_outputs(1.0)

def test_never_run():
    raise AssertionError("the run stops before this test")
""")
    proc, out, err, left = _terminated(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "test_fails.py",
         "--ptq-report=r.html"], pytester.path, tmp_path)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out + err
    assert "Traceback" not in out + err and "test_never_run" not in out
    assert "interrupted while explaining why test_fails.py::test_fails failed" in out
    assert left == [] and not (pytester.path / "drawn").exists()
    page = (pytester.path / "r.html").read_text()
    assert "interrupted before its tests finished" in page and "test_fails" not in page

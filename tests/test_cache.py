"""Results kept on disk between runs (pytest_ptq.cache): read back only when every key part
matches and the entry is sound; computed again otherwise."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil

import numpy as np
import pytest

import builders
from pytest_ptq import cache
from pytest_ptq.engine import runtime
from pytest_ptq.analysis import Analysis, AnalysisKey
from test_plugin import N, independent_sensitivity, plugin_args


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache_models")
    data = builders.samples(N)
    builders.save_folder(data, root / "calib")
    builders.quantize(builders.conv_net(root / "float.onnx"), root / "q.onnx", data)
    return root


@pytest.fixture
def inputs(tmp_path, model_dir):
    """A private copy of the model and data (tests below edit them)."""
    shutil.copy(model_dir / "q.onnx", tmp_path / "q.onnx")
    shutil.copytree(model_dir / "calib", tmp_path / "calib")
    return tmp_path


def store(folder, inputs, data_num=None):
    return cache.ResultCache(folder, lambda: {"model": inputs / "q.onnx", "data": inputs / "calib"},
                             (("data_num", data_num),))


def never():
    raise AssertionError("computed although the cache holds the result")


def test_a_result_is_computed_once_and_read_back_in_a_new_cache(tmp_path, inputs):
    calls = []
    first = store(tmp_path / "c", inputs).get(("r", 1), lambda: calls.append(1) or {"x": np.arange(3)})
    again = store(tmp_path / "c", inputs).get(("r", 1), never)
    assert calls == [1] and np.array_equal(again["x"], first["x"])


@pytest.mark.parametrize("change", ["data", "model", "request", "data_num", "extra file", "cpu kernels"])
def test_any_change_of_a_key_part_computes_again(tmp_path, inputs, change, monkeypatch):
    extra = tmp_path / "holdout.npy"
    np.save(extra, np.zeros(3))
    store(tmp_path / "c", inputs).get(("r", 1), lambda: "old", files=(extra,))
    request, data_num = ("r", 1), None
    if change == "data":
        x = inputs / "calib" / "x" / "0.npy"
        np.save(x, np.load(x) + 1)
    elif change == "model":
        (inputs / "q.onnx").write_bytes((inputs / "q.onnx").read_bytes() + b"\0")
    elif change == "request":
        request = ("r", 2)
    elif change == "data_num":
        data_num = 2
    elif change == "cpu kernels":  # a cache shared with a machine whose uint8 x int8 kernels differ
        saturate = runtime.integer_kernels_saturate()
        monkeypatch.setattr(runtime, "integer_kernels_saturate", lambda: not saturate)
        cache.tool_versions.cache_clear()
    else:
        np.save(extra, np.ones(3))
    got = store(tmp_path / "c", inputs, data_num).get(request, lambda: "new", files=(extra,))
    cache.tool_versions.cache_clear()  # the next test's keys read this CPU's kernels again
    assert got == "new"


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "not ours", "empty"])
def test_a_damaged_entry_is_ignored_and_rewritten(tmp_path, inputs, damage):
    store(tmp_path / "c", inputs).get(("r",), lambda: "good")
    (entry,) = (tmp_path / "c").iterdir()
    blob = entry.read_bytes()
    entry.write_bytes({"truncated": blob[:-5], "flipped byte": blob[:-1] + bytes([blob[-1] ^ 1]),
                       "not ours": b"hello", "empty": b""}[damage])
    assert store(tmp_path / "c", inputs).get(("r",), lambda: "fresh") == "fresh"
    assert store(tmp_path / "c", inputs).get(("r",), never) == "fresh"


def test_a_sound_entry_under_another_keys_name_is_not_trusted(tmp_path, inputs):
    s = store(tmp_path / "c", inputs)
    s.get(("a",), lambda: "of a")
    (entry,) = (tmp_path / "c").iterdir()
    entry.rename(s.path(s.key(("b",))))  # as if two keys' names collided
    assert store(tmp_path / "c", inputs).get(("b",), lambda: "of b") == "of b"


def test_a_request_without_stable_text_is_computed_and_not_kept(tmp_path, inputs):
    s = store(tmp_path / "c", inputs)
    assert s.get(("remedy", print), lambda: 1) == 1 and s.get(("remedy", print), lambda: 2) == 2
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").iterdir())


def test_an_unwritable_cache_costs_the_cache_only(tmp_path, inputs):
    (tmp_path / "c").write_text("a file where the folder should be")
    s = store(tmp_path / "c", inputs)
    with pytest.warns(cache.PTQCacheWarning, match=r"not kept between runs \(the cache folder\): cannot write .*c'?: .*c'? is a file, not a folder"):
        assert s.get(("r",), lambda: 5) == 5
    assert s.get(("s",), lambda: 6) == 6  # warned once


def test_clear_removes_entries_only(tmp_path, inputs):
    store(tmp_path / "c", inputs).get(("r",), lambda: 1)
    (tmp_path / "c" / "notes.txt").write_text("mine")
    assert cache.clear(tmp_path / "c") == 1
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["notes.txt"]


def test_a_cached_sensitivity_equals_a_brute_force_one_without_compiling(tmp_path, inputs):
    key = AnalysisKey(str(inputs / "q.onnx"), str(inputs / "calib"))
    Analysis(key, tmp_path, cache_dir=tmp_path / "c").sensitivity("activation")
    again = Analysis(key, tmp_path, cache_dir=tmp_path / "c")
    sens = again.sensitivity("activation")
    assert again.store.hits == 1 and again.store.misses == 0
    data = builders.samples(N)
    feeds = [{k: v[i] for k, v in data.items()} for i in range(N)]
    expected = independent_sensitivity(inputs / "q.onnx", feeds, list(sens))
    for name, value in expected.items():
        assert sens[name]["cosine-similarity"] == pytest.approx(value, abs=1e-5), name


def test_the_float_equivalence_check_is_kept_and_its_warnings_come_back(tmp_path, inputs, monkeypatch):
    """The engine's check that bypassing every pair gives the float model reads only keyed
    inputs: a rerun takes its result, warnings and all, instead of running it."""
    from pytest_ptq.engine import sanity

    key = AnalysisKey(str(inputs / "q.onnx"), str(inputs / "calib"))
    first = Analysis(key, tmp_path, cache_dir=tmp_path / "c")
    computed = first.engine.float_equivalence()
    monkeypatch.setattr(sanity, "check", lambda engine: never())
    again = Analysis(key, tmp_path, cache_dir=tmp_path / "c")
    assert again.engine.warnings == first.engine.warnings
    assert again.store.hits == 1 and again.store.misses == 0
    assert again.engine.rewrite == computed.rewrite


def test_an_accuracy_function_runs_again_on_kept_model_outputs(tmp_path, inputs, monkeypatch):
    """A task metric is user code, so it runs on every rerun; the model outputs it asks for
    are kept per feeds' bytes, equal to what the engine computes, and a sample it has not
    fed before is computed."""
    from pytest_ptq.engine import Engine

    key = AnalysisKey(str(inputs / "q.onnx"), str(inputs / "calib"))
    seen = []

    def evaluate(run, data):
        outs = [run(feeds) for feeds in data]
        seen.append(outs)
        return float(np.mean([o["prob"].max() for o in outs]))

    first = Analysis(key, tmp_path, cache_dir=tmp_path / "c").accuracy(evaluate)
    engine = Analysis(key, tmp_path, cache_dir=tmp_path / "c").engine
    original = Engine.run
    ran = []
    monkeypatch.setattr(Engine, "run", lambda self, *a, **k: ran.append(a) or original(self, *a, **k))
    again = Analysis(key, tmp_path, cache_dir=tmp_path / "c")
    assert again.accuracy(evaluate) == first and ran == []
    for got, want in zip(seen[2:], seen[:2]):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g["prob"], w["prob"])
    fresh = engine.run(next(iter(again.dataset())), "all")
    np.testing.assert_array_equal(seen[3][0]["prob"], fresh["prob"])

    def shifted(run, data):
        return float(run({k: v + 1 for k, v in next(iter(data)).items()})["prob"].max())

    again.accuracy(shifted)
    assert len(ran) >= 2  # new feeds: float and quantized outputs computed


# -- the plugin ----------------------------------------------------------------------------

CONTRACT = "model: q.onnx\ndata: calib\nnodes: {threshold: 0.0}\nbaseline: false\n"
# a conftest that fails any sensitivity computed in this process: a test that passes with it
# read its ranking from the cache
NO_COMPUTE = """
import pytest_ptq.analysis as a
from pytest_ptq.errors import PTQError

_computing = a.get_sensitivity_of_nodes

def _refuse(*args, **kwargs):
    raise PTQError("sensitivity computed")

def pytest_configure(config):
    a.get_sensitivity_of_nodes = _refuse

def pytest_unconfigure(config):
    a.get_sensitivity_of_nodes = _computing
"""


def runp(pytester, *args):
    return pytester.runpytest_inprocess(*plugin_args(), *args)


def setup_project(pytester, inputs):
    shutil.copy(inputs / "q.onnx", pytester.path / "q.onnx")
    shutil.copytree(inputs / "calib", pytester.path / "calib")
    pytester.makefile(".ptq.yaml", c=CONTRACT)


def test_plugin_rerun_reads_the_default_cache_and_cache_clear_empties_it(pytester, inputs):
    setup_project(pytester, inputs)
    runp(pytester).assert_outcomes(passed=2)
    assert list((pytester.path / ".pytest_cache" / "d" / "ptq").glob("*" + cache.SUFFIX))
    pytester.makeconftest(NO_COMPUTE)
    runp(pytester).assert_outcomes(passed=2)  # read back
    runp(pytester, "--ptq-no-cache").assert_outcomes(passed=1, failed=1)
    runp(pytester, "--cache-clear").assert_outcomes(passed=1, failed=1)


COUNT_DRAWINGS = """
import matplotlib.figure as f

_save = f.Figure.savefig

def _counted(self, *args, **kwargs):
    with open("drawn.txt", "a") as out:
        out.write("x")
    return _save(self, *args, **kwargs)

def pytest_configure(config):
    f.Figure.savefig = _counted

def pytest_unconfigure(config):
    f.Figure.savefig = _save
"""


def test_plugin_rerun_draws_no_report_figure_and_shows_the_same(pytester, inputs):
    """The report's figures (curves, distributions) are kept with the results: an unchanged
    rerun draws none and embeds the same images; a changed model draws them again."""
    import re

    setup_project(pytester, inputs)
    pytester.makeconftest(COUNT_DRAWINGS)
    drawn = pytester.path / "drawn.txt"
    images = []
    for run in range(3):
        if run == 2:
            q, _ = next(iter(builders.qdq_pairs(inputs / "q.onnx").values()))
            builders.scaled(inputs / "q.onnx", pytester.path / "q.onnx", q.input[1], 1.5)
        drawn.unlink(missing_ok=True)
        runp(pytester, f"--ptq-report={pytester.path / 'r.html'}").assert_outcomes(passed=2)
        images.append(re.findall(r'src="data:image/png;base64,([^"]+)"', (pytester.path / "r.html").read_text()))
        assert images[-1]
        assert drawn.exists() != (run == 1), f"run {run}"
    assert images[1] == images[0]


def test_plugin_explicit_cache_dir_and_its_cache_clear(pytester, inputs, tmp_path):
    setup_project(pytester, inputs)
    folder = tmp_path / "shared-cache"
    runp(pytester, "-p", "no:cacheprovider", f"--ptq-cache-dir={folder}").assert_outcomes(passed=2)
    assert list(folder.glob("*" + cache.SUFFIX))
    pytester.makeconftest(NO_COMPUTE)
    runp(pytester, "-p", "no:cacheprovider", f"--ptq-cache-dir={folder}").assert_outcomes(passed=2)
    # without pytest's cache plugin nor a folder, nothing is kept
    runp(pytester, "-p", "no:cacheprovider").assert_outcomes(passed=1, failed=1)
    runp(pytester, f"--ptq-cache-dir={folder}", "--cache-clear").assert_outcomes(passed=1, failed=1)


def test_plugin_refuses_a_cache_dir_inside_the_session_data(pytester, inputs):
    setup_project(pytester, inputs)
    result = runp(pytester, "--ptq-data=calib", "--ptq-cache-dir=calib/cache")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--ptq-cache-dir" in result.stderr.str() and "calib" in result.stderr.str()
    assert not (pytester.path / "calib" / "cache").exists()


@pytest.mark.parametrize("errors", [False, True], ids=["warnings", "warnings-are-errors"])
def test_plugin_writes_no_cache_inside_a_contracts_data_and_says_so(pytester, inputs, errors):
    setup_project(pytester, inputs)
    # where warnings are errors a check that passed does not fail for a result not kept
    # (the in-process run's own warning that the plugin was imported before pytest asked aside)
    strict = ["-W", "error", "-W", "ignore::pytest.PytestAssertRewriteWarning"] if errors else []
    result = runp(pytester, "--ptq-cache-dir=calib/cache", *strict)
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count("PTQCacheWarning") == 1
    result.stdout.fnmatch_lines(["*PTQCacheWarning: results are not kept between runs (--ptq-cache-dir): "
                                 "*inside the calibration data folder*calib*"])
    assert not (pytester.path / "calib" / "cache").exists()


# -- the command line ------------------------------------------------------------------------

def test_cli_rerun_reads_its_cache_dir(tmp_path, inputs, monkeypatch, capsys):
    from pytest_ptq import cli

    common = [str(inputs / "q.onnx"), str(inputs / "calib"), "--quiet", "--cache-dir", str(tmp_path / "c")]
    assert cli.main(["runall", *common, "-s", str(tmp_path / "r1"), "--top", "1"]) == 0
    assert cli.main(["get-sensitivity-of-nodes", *common, "-t", "activation",
                     "--json", str(tmp_path / "s1.json")]) == 0
    import json

    def refuse(*args, **kwargs):
        raise AssertionError("computed although the cache holds the result")

    for where in ("pytest_ptq.runall.screen", "pytest_ptq.runall.collect", "pytest_ptq.runall.get_acc_error",
                  "pytest_ptq.runall.three_configs", "pytest_ptq.cli.sensitivity.get_sensitivity_of_nodes",
                  "pytest_ptq.engine.sanity.check",  # the float-equivalence check is kept too
                  "matplotlib.figure.Figure.savefig"):  # and the figures
        monkeypatch.setattr(where, refuse)
    assert cli.main(["runall", *common, "-s", str(tmp_path / "r2"), "--top", "1"]) == 0
    assert cli.main(["get-sensitivity-of-nodes", *common, "-t", "activation",
                     "--json", str(tmp_path / "s2.json")]) == 0
    first, again = (json.loads((tmp_path / r / "summary.json").read_text()) for r in ("r1", "r2"))
    for summary in (first, again):
        summary["curves"] = dict(summary["curves"], png=None)  # where each run wrote it
    for key in ("sensitivity", "verdict", "outputs", "ranking", "curves"):
        assert json.dumps(first[key], sort_keys=True) == json.dumps(again[key], sort_keys=True)
    assert (json.loads((tmp_path / "s1.json").read_text())["values"]
            == json.loads((tmp_path / "s2.json").read_text())["values"])
    # the figures, kept with the results, written where this run writes
    pngs = sorted(p.relative_to(tmp_path / "r1") for p in (tmp_path / "r1").rglob("*.png"))
    assert len(pngs) >= 3 and pngs == sorted(p.relative_to(tmp_path / "r2") for p in (tmp_path / "r2").rglob("*.png"))
    assert all((tmp_path / "r1" / p).read_bytes() == (tmp_path / "r2" / p).read_bytes() for p in pngs)
    assert again["files"]["acc_error"] == "acc_error.png"  # beside the summary
    # another option is another request
    capsys.readouterr()
    assert cli.main(["get-sensitivity-of-nodes", *common, "-t", "weight"]) == 3  # an error of ours: computed
    assert "computed although the cache holds the result" in capsys.readouterr().err


@pytest.mark.parametrize("when", ["before the hash", "after the hash"])
def test_a_model_rewritten_while_a_run_reads_it_keeps_no_result(tmp_path, inputs, monkeypatch, capsys, when):
    """A re-quantization writing q.onnx during a run: the old model's results were kept under
    the new bytes' key, and every later run of the new model read them."""
    from pytest_ptq import cli
    from pytest_ptq.engine import core

    other = tmp_path / "other.onnx"
    builders.quantize(builders.conv_net(tmp_path / "f2.onnx", seed=7), other, builders.samples(N))
    built = core.Engine.__init__

    def rewrite():
        shutil.copy(other, inputs / "q.onnx")
        os.utime(inputs / "q.onnx", ns=(1, 1))

    def swap_after_load(self, *args, **kwargs):  # between what the engine read and what is hashed
        built(self, *args, **kwargs)
        rewrite()

    if when == "before the hash":
        monkeypatch.setattr(core.Engine, "__init__", swap_after_load)
    else:
        hashed = cache.ResultCache.hash_of

        def swap_after_hash(self, path):
            digest = hashed(self, path)
            if str(path).endswith("q.onnx"):
                rewrite()
            return digest
        monkeypatch.setattr(cache.ResultCache, "hash_of", swap_after_hash)
    args = ["get-sensitivity-of-nodes", str(inputs / "q.onnx"), str(inputs / "calib"), "--quiet", "--cache-dir",
            str(tmp_path / "c")]
    assert cli.main(args + ["--json", str(tmp_path / "swapped.json")]) == 0
    assert "changed while this run read it" in capsys.readouterr().err
    assert not list((tmp_path / "c").glob("*" + cache.SUFFIX))
    monkeypatch.undo()
    assert cli.main(args + ["--json", str(tmp_path / "cached.json")]) == 0
    assert cli.main(args[:-2] + ["--json", str(tmp_path / "fresh.json")]) == 0
    values = [json.loads((tmp_path / f).read_text())["values"] for f in ("cached.json", "fresh.json")]
    assert values[0] == values[1]


def test_cli_refuses_a_cache_dir_inside_the_data(inputs, capsys):
    from pytest_ptq import cli

    code = cli.main(["get-sensitivity-of-nodes", str(inputs / "q.onnx"), str(inputs / "calib"), "--quiet",
                     "--cache-dir", str(inputs / "calib" / "c")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--cache-dir" in err and "inside the calibration data folder" in err
    assert not (inputs / "calib" / "c").exists()



class _Planted:
    """What a crafted entry would hold: unpickling it writes a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _memmap_pickle(path):
    """A pickle that creates ``numpy.memmap(path, "uint8", "w+", 0, (4,))`` the way pickle
    creates any object of a class (NEWOBJ: the class's ``__new__``), which creates the file."""
    import struct

    def text(s):
        return b"X" + struct.pack("<I", len(s.encode())) + s.encode()

    return (b"\x80\x02cnumpy\nmemmap\n(" + text(str(path)) + text("uint8") + text("w+") + b"K\x00K\x04\x85t\x81.")


def test_a_crafted_entry_runs_no_code_and_is_recomputed(tmp_path, inputs, capsys):
    import hashlib
    import pickle

    from pytest_ptq import cache, cli

    common = [str(inputs / "q.onnx"), str(inputs / "calib"), "--quiet", "--cache-dir", str(tmp_path / "c"),
              "-t", "activation"]
    assert cli.main(["get-sensitivity-of-nodes", *common, "--json", str(tmp_path / "s1.json")]) == 0
    marker = tmp_path / "planted"
    entries = list((tmp_path / "c").glob(f"*{cache.SUFFIX}"))
    assert entries
    for entry in entries:  # the right key and checksum, a payload that would open a file
        blob = entry.read_bytes()
        key = blob[len(cache.MAGIC):].partition(b"\n")[2].partition(b"\n")[0]
        for planted in (pickle.dumps(_Planted(str(marker))), pickle.dumps([1, _Planted(str(marker))]),
                        _memmap_pickle(marker)):
            payload = key + b"\n" + planted
            entry.write_bytes(cache.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            assert cli.main(["get-sensitivity-of-nodes", *common, "--json", str(tmp_path / "s2.json")]) == 0
            assert not marker.exists()
            assert (json.loads((tmp_path / "s1.json").read_text())["values"]
                    == json.loads((tmp_path / "s2.json").read_text())["values"])
            entry.write_bytes(blob)



def _forged(entry, pickled):
    """Replace ``entry``'s payload by the bytes ``pickled``, keeping its key, with a matching sha256."""
    import hashlib

    key = entry.read_bytes()[len(cache.MAGIC):].partition(b"\n")[2].partition(b"\n")[0]
    payload = key + b"\n" + pickled
    entry.write_bytes(cache.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def _listing_by_obj(folder):
    """A pickle whose OBJ opcode calls ``runall._Listing(Path(folder), [])`` (as protocol 1
    rebuilds an instance), which writes summary.md and summary.json into ``folder``."""
    import pickle
    import struct

    return (pickle.PROTO + b"\x02" + pickle.MARK + pickle.GLOBAL + b"pytest_ptq.runall\n_Listing\n"
            + pickle.GLOBAL + b"pathlib\nPosixPath\n" + pickle.BINUNICODE + struct.pack("<I", len(folder.encode()))
            + folder.encode() + pickle.TUPLE1 + pickle.REDUCE + pickle.EMPTY_LIST + pickle.OBJ + pickle.STOP)


@pytest.mark.parametrize("crafted", ["called", "created", "module"])
def test_a_crafted_entry_builds_no_object_of_another_class_and_imports_nothing(tmp_path, inputs, monkeypatch, crafted):
    """Any class of pytest-ptq's was taken: pickle's OBJ opcode called runall's _Listing on a
    folder of the entry's choosing, which wrote its summary.md there, an object of it was
    handed back as the result, and naming pytest_ptq.__main__ imported it, which runs the
    command line and exits. Only what results are made of is read; anything else is stale."""
    import pickle
    import sys

    from pytest_ptq import runall

    monkeypatch.delitem(sys.modules, "pytest_ptq.__main__", raising=False)
    store(tmp_path / "c", inputs).get(("r", 1), lambda: "kept")
    (entry,) = (tmp_path / "c").glob(f"*{cache.SUFFIX}")
    victim = tmp_path / "victim"
    victim.mkdir()
    _forged(entry, {"called": _listing_by_obj(str(victim)),
                    "created": pickle.dumps(runall._Listing.__new__(runall._Listing)),
                    "module": pickle.PROTO + b"\x02" + pickle.GLOBAL + b"pytest_ptq.__main__\nmain\n" + pickle.STOP}[crafted])
    assert store(tmp_path / "c", inputs).get(("r", 1), lambda: "computed again") == "computed again"
    assert not list(victim.iterdir()) and "pytest_ptq.__main__" not in sys.modules


def _crafted_dtype_entry():
    """Only names an entry may use (numpy's dtype, _reconstruct, ndarray): a dtype whose one
    field holds objects, its flags saying it holds none, then an array of it from raw bytes,
    which numpy reads as object pointers."""
    import pickle

    from numpy._core.multiarray import _reconstruct

    class Dtype:
        def __reduce__(self):
            return np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0)

    class Array:
        def __reduce__(self):
            return _reconstruct, (np.ndarray, (0,), b"b"), (1, (1,), Dtype(), False, b"\x41" * 8)

    return pickle.dumps({"result": Array()}, protocol=5)


@pytest.mark.parametrize("state", ["fields", "flags", "object bytes", "object byte order"])
def test_an_entry_filling_numpy_types_otherwise_than_numpy_does_is_refused(state):
    """An entry using only the names results are made of filled a dtype with an object field
    flagged as holding none, then an array of it from its bytes: numpy read pointers of the
    entry's choosing and the process died (no exception to catch)."""
    import io
    import pickle

    payload = _crafted_dtype_entry()
    if state == "flags":  # a plain float type flagged as holding objects
        class Dtype:
            def __reduce__(self):
                return np.dtype, ("f8", False, True), (3, "<", None, None, None, -1, -1, 63)
        payload = pickle.dumps(Dtype(), protocol=5)
    elif state == "object byte order":  # objects "big-endian": their pointers read swapped
        class Dtype:
            def __reduce__(self):
                return np.dtype, ("O8", False, True), (3, ">", None, None, None, -1, -1, 63)
        payload = pickle.dumps(Dtype(), protocol=5)
    elif state == "object bytes":  # an object array filled from bytes, not a list of values
        from numpy._core.multiarray import _reconstruct

        class Array:
            def __reduce__(self):
                return _reconstruct, (np.ndarray, (0,), b"b"), (1, (1,), np.dtype("O"), False, b"\x41" * 8)
        payload = pickle.dumps(Array(), protocol=5)
    with pytest.raises(pickle.UnpicklingError, match="is not filled so while reading a result"):
        cache._ResultUnpickler(io.BytesIO(payload)).load()


def test_each_kind_of_object_a_result_is_made_of_is_read_back(tmp_path, inputs):
    import collections
    from pathlib import Path, PurePosixPath

    from pytest_ptq import guard

    records = [cache._named(*name) for name, kind in cache._KINDS.items() if kind == "record"]
    assert all(isinstance(cls, type) for cls in records)  # none renamed or moved away
    made = []
    for cls in records:
        obj = cls.__new__(cls)
        obj.__dict__.update(values=np.arange(3))
        made.append(obj)
    value = {"records": made, "inputs": guard.Inputs().add(inputs / "q.onnx", "model file"),
             "arrays": [np.arange(6.0).reshape(2, 3).T, np.array(["a", None], object), np.float32(1.5),
                        np.dtype("f2")],
             "builtins": [{1}, frozenset({2}), 1 + 2j, slice(1, 2), range(3), bytearray(b"x"), b"y",
                          collections.OrderedDict(a=1), Path("a/b"), PurePosixPath("c")]}
    store(tmp_path / "c", inputs).get(("r", 1), lambda: value)
    again = store(tmp_path / "c", inputs).get(("r", 1), never)
    assert [type(r) for r in again["records"]] == records
    assert all(np.array_equal(r.values, np.arange(3)) for r in again["records"])
    assert again["inputs"].items == value["inputs"].items
    for got, want in zip(again["arrays"], value["arrays"]):
        assert type(got) is type(want) and (got == want if isinstance(got, np.dtype) else np.array_equal(got, want))
    assert again["builtins"] == value["builtins"]


READ_ONLY_CACHE = """
import pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    def refuse(name):
        raise PermissionError(1, "Operation not permitted", str(config.rootpath / "pytest-cache-files-x"))
    config.cache.mkdir = refuse  # as a read-only checkout answers
"""


def test_plugin_in_a_read_only_checkout_runs_without_its_cache_and_says_so_once(pytester, inputs):
    setup_project(pytester, inputs)
    pytester.makeconftest(READ_ONLY_CACHE)
    result = runp(pytester)
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count("PTQCacheWarning: results") == 1
    result.stdout.fnmatch_lines(["*PTQCacheWarning: results are not kept between runs: pytest's cache dir takes no "
                                 "folder for them (Operation not permitted: *pytest-cache-files-x); pass "
                                 "--ptq-cache-dir DIR*"])
    assert "Traceback" not in result.stdout.str()


def test_a_baselines_model_hash_covers_its_external_data(tmp_path, inputs):
    """A weight changed in the external data file only left the model's recorded hash as it
    was, so a degraded baseline did not say the model had changed."""
    import hashlib

    import onnx

    from pytest_ptq.analysis import Analysis, AnalysisKey

    def fingerprint(model):
        return Analysis(AnalysisKey(str(model), str(inputs / "calib")), tmp_path).fingerprint()["model_sha256"]

    inline = inputs / "q.onnx"
    assert fingerprint(inline) == hashlib.sha256(inline.read_bytes()).hexdigest()  # as recorded before
    ext = tmp_path / "ext" / "q.onnx"
    ext.parent.mkdir()
    onnx.save(onnx.load(str(inline)), str(ext), save_as_external_data=True, location="w.bin", size_threshold=0)
    before, graph = fingerprint(ext), ext.read_bytes()
    weights = bytearray((ext.parent / "w.bin").read_bytes())
    weights[-1] ^= 1
    (ext.parent / "w.bin").write_bytes(bytes(weights))
    assert fingerprint(ext) != before and ext.read_bytes() == graph  # the .onnx itself is unchanged


SLOW_CLOCK = """
import pytest_ptq.progress as p

class _Clock:  # every reading a second later: the bars (silent under two seconds) print
    now = 0.0
    @classmethod
    def perf_counter(cls):
        cls.now += 1.0
        return cls.now

_time = p.time

def pytest_configure(config):
    p.time = _Clock

def pytest_unconfigure(config):
    p.time = _time
"""


def test_plugin_shows_a_models_long_steps_around_the_capture_and_q_silences_them(pytester, inputs):
    """The first item of a detector's contract ran 83 s without a word."""
    setup_project(pytester, inputs)
    pytester.makeconftest(SLOW_CLOCK)
    result = runp(pytester, "--ptq-no-cache")
    result.assert_outcomes(passed=2)
    out = result.stdout.lines
    lines = [x for x in out if x.startswith("ptq q.onnx: sensitivity (node): ")]
    assert any(x.endswith("s left") for x in lines), result.stdout.str()
    assert lines[-1].startswith("ptq q.onnx: sensitivity (node): ") and " done, " in lines[-1]
    # each on a line of its own, and the tests' status line started again after them
    after = out[out.index(lines[-1]) + 1]
    assert after.startswith("c.ptq.yaml ") and "[" in after, out
    quiet = runp(pytester, "--ptq-no-cache", "-q")
    quiet.assert_outcomes(passed=2)
    assert "sensitivity (node)" not in quiet.stderr.str() + quiet.stdout.str()


@contextlib.contextmanager
def read_only(folder):
    """``folder`` read-only for the block: its mode, and for root (whom a mode does not stop)
    the immutable attribute; skips where neither holds."""
    import subprocess

    folder.chmod(0o555)
    immutable = builders.AS_ROOT and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("no way to make a folder read-only here")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_plugin_with_a_read_only_cache_dir_reads_it_keeps_nothing_and_says_so(pytester, inputs, tmp_path):
    """A --ptq-cache-dir (or ptq_cache_dir) it cannot write stopped the run at start-up, where
    pytest's own cache dir read-only only warns: keeping results only saves time. Then it was
    not read either: a cache shared read-only (a CI's) saved nothing."""
    setup_project(pytester, inputs)
    folder = tmp_path / "ro"
    runp(pytester, f"--ptq-cache-dir={folder}").assert_outcomes(passed=2)
    kept = sorted(folder.iterdir())
    pytester.makeconftest(NO_COMPUTE)
    with read_only(folder):
        result = runp(pytester, f"--ptq-cache-dir={folder}")
        # said on standard error, never raised (an error filter on it alone: a fresh install's
        # inner run also warns that its modules were imported before assertion rewriting)
        with pytest.warns(cache.PTQCacheWarning):
            strict = runp(pytester, f"--ptq-cache-dir={folder}", "-W", "error::pytest_ptq.cache.PTQCacheWarning")
        cleared = runp(pytester, f"--ptq-cache-dir={folder}", "--cache-clear")
    result.assert_outcomes(passed=2)  # read back
    strict.assert_outcomes(passed=2)
    # --cache-clear cannot empty it: then its entries are not read either (computing fails here)
    cleared.assert_outcomes(passed=1, failed=1)
    cleared.stdout.fnmatch_lines(["*--cache-clear cannot empty it, so those kept there are not read either"])
    result.stdout.fnmatch_lines(["*PTQCacheWarning: results are not kept between runs: the result cache "
                                 "(--ptq-cache-dir / ptq_cache_dir) * is a read-only folder*; those kept there "
                                 "already are read"])
    assert sorted(folder.iterdir()) == kept


def test_cli_with_a_read_only_cache_dir_reads_it(tmp_path, inputs, monkeypatch, capsys):
    from pytest_ptq import cli

    args = ["get-sensitivity-of-nodes", str(inputs / "q.onnx"), str(inputs / "calib"), "--quiet", "--cache-dir",
            str(tmp_path / "c")]
    assert cli.main(args + ["--json", str(tmp_path / "first.json")]) == 0
    monkeypatch.setattr("pytest_ptq.cli.sensitivity.get_sensitivity_of_nodes", never)
    with read_only(tmp_path / "c"):
        assert cli.main(args + ["--json", str(tmp_path / "again.json")]) == 0  # it was refused, exit 2
    assert "those kept there already are read" in capsys.readouterr().err
    assert (json.loads((tmp_path / "first.json").read_text())["values"]
            == json.loads((tmp_path / "again.json").read_text())["values"])


def test_paths_with_a_tilde_are_kept_like_any_other(tmp_path, inputs, monkeypatch, capsys):
    # the engine noted "~/calib" as unreadable and the cache its real version: every store
    # refused, saying the data changed while the run read them
    from pytest_ptq import cli

    monkeypatch.setenv("HOME", str(inputs))
    args = ["get-sensitivity-of-nodes", "~/q.onnx", "~/calib", "--quiet", "--cache-dir", str(tmp_path / "c")]
    assert cli.main(args) == 0
    assert "changed while this run read it" not in capsys.readouterr().err
    assert list((tmp_path / "c").glob("*" + cache.SUFFIX))


def test_a_data_folder_linked_in_per_input_is_hashed_through_its_links(tmp_path, inputs):
    """A data folder whose per-input folder is a symbolic link (a data set kept elsewhere)
    hashed as empty, so edited samples served the old results."""
    store_dir, linked = tmp_path / "store", tmp_path / "linked"
    shutil.copytree(inputs / "calib" / "x", store_dir / "x")
    linked.mkdir()
    (linked / "x").symlink_to(store_dir / "x", target_is_directory=True)
    (linked / "x" / "again").symlink_to(store_dir, target_is_directory=True)  # a loop back up: walked once
    # what the loader reads, by the same names: the samples once
    assert cache.file_hash(linked) == cache.file_hash(inputs / "calib")
    before = cache.file_hash(linked)
    x = store_dir / "x" / "0.npy"
    np.save(x, np.load(x) * 2)
    assert cache.file_hash(linked) != before


def _external(src, dst, location):
    import onnx

    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx.load(str(src)), str(dst), save_as_external_data=True, location=location, size_threshold=0)
    return dst


def _flip_last_byte(path):
    b = bytearray(path.read_bytes())
    b[-1] ^= 1
    path.write_bytes(bytes(b))


def test_a_float_models_external_data_is_part_of_every_key(tmp_path, inputs, model_dir, monkeypatch):
    """A float model saved with external data: a weight changed in its data file left the
    float-equivalence check and the stages served from the cache as they were."""
    fpath = _external(model_dir / "float.onnx", tmp_path / "f" / "float.onnx", "float.bin")
    key = AnalysisKey(str(inputs / "q.onnx"), str(inputs / "calib"), float_model=str(fpath))
    before = Analysis(key, tmp_path, cache_dir=tmp_path / "c").store.base()
    _flip_last_byte(fpath.parent / "float.bin")
    assert Analysis(key, tmp_path, cache_dir=tmp_path / "c").store.base() != before
    from pytest_ptq import stages

    calls = []
    monkeypatch.setattr(stages, "localize_stages", lambda *a, **k: calls.append(1) or len(calls))
    plain = AnalysisKey(str(inputs / "q.onnx"), str(inputs / "calib"))  # the float model named by the check
    assert Analysis(plain, tmp_path, cache_dir=tmp_path / "c").stages(fpath) == 1
    assert Analysis(plain, tmp_path, cache_dir=tmp_path / "c").stages(fpath) == 1  # kept
    _flip_last_byte(fpath.parent / "float.bin")
    assert Analysis(plain, tmp_path, cache_dir=tmp_path / "c").stages(fpath) == 2


def test_the_clis_cache_keys_a_float_models_external_data(tmp_path, inputs, model_dir):
    from pytest_ptq.engine import Engine

    fpath = _external(model_dir / "float.onnx", tmp_path / "f" / "float.onnx", "float.bin")
    engine = Engine(str(inputs / "q.onnx"), str(inputs / "calib"), float_model=str(fpath))
    before = cache.for_engine(tmp_path / "c", engine).base()
    _flip_last_byte(fpath.parent / "float.bin")
    assert cache.for_engine(tmp_path / "c", engine).base() != before



@pytest.mark.parametrize("target", ["file", "folder"])
def test_external_data_outside_the_models_folder_is_refused_before_anything_hashes_it(tmp_path, inputs, monkeypatch,
                                                                                        target):
    """The result cache hashed every file a model's external data named before the loader
    refused a location outside the model's folder: ../../../usr hashed all of /usr, and a
    file outside was read; a folder there was refused as "not a regular file"."""
    from pathlib import Path

    import onnx

    from pytest_ptq.errors import PTQError

    model = _external(inputs / "q.onnx", tmp_path / "m" / "q.onnx", "w.bin")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "m" / "w.bin").rename(outside / "weights.bin")  # the right bytes, of the right size
    location = {"file": "../outside/weights.bin", "folder": "../outside"}[target]
    proto = onnx.load(str(model), load_external_data=False)
    for init in proto.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(proto, str(model))
    hashed = []

    def spy(path):
        hashed.append(path)
        return "0" * 64

    monkeypatch.setattr(cache, "file_hash", spy)
    analysis = Analysis(AnalysisKey(str(model), str(inputs / "calib")), tmp_path, cache_dir=tmp_path / "c")
    for refused in (analysis.sensitivity, lambda: cache.model_hash(model, spy)):
        with pytest.raises(PTQError) as err:
            refused()
        assert re.fullmatch(rf"initializer '\w+' of '[^']+' keeps its data in '{location}', which resolves to "
                            rf"'{outside}[^']*', outside the model's folder '{tmp_path / 'm'}'; onnx and onnxruntime "
                            "refuse such a model: keep the external data file in the model's folder", str(err.value))
    assert not [p for p in hashed if Path(p).resolve().is_relative_to(outside)]


def test_entries_not_used_for_a_month_or_past_the_size_cap_go_on_the_next_write(tmp_path, inputs, monkeypatch):
    """Every model change leaves entries no run reads again, and a CI cache restored from job
    to job grew without bound: a write removes those unused for MAX_AGE_DAYS, then the least
    recently used past MAX_BYTES; a read marks an entry used."""
    import time

    from pytest_ptq import cache, cli

    folder = tmp_path / "c"
    common = [str(inputs / "q.onnx"), str(inputs / "calib"), "--quiet", "--cache-dir", str(folder)]
    assert cli.main(["get-sensitivity-of-nodes", *common, "-t", "activation"]) == 0
    used = list(folder.glob(f"*{cache.SUFFIX}"))
    day = 86400
    stale = folder / ("0" * 40 + cache.SUFFIX)
    stale.write_bytes(b"an entry of a model long gone")
    for p in (stale, *used):
        os.utime(p, (time.time() - 40 * day,) * 2)
    other = folder / "notes.txt"  # not an entry: never touched
    other.write_text("mine")
    os.utime(other, (time.time() - 40 * day,) * 2)
    # half an entry a killed write left (a process long gone): it stayed unless that very entry was written again
    half = folder / f".{'1' * 40}{cache.SUFFIX}.4194305.tmp"
    half.write_bytes(b"half an entry")
    os.utime(half, (time.time() - day,) * 2)
    # the rerun reads `used` (marking it used now), then writes the weight ranking
    assert cli.main(["get-sensitivity-of-nodes", *common, "-t", "activation"]) == 0
    assert cli.main(["get-sensitivity-of-nodes", *common, "-t", "weight"]) == 0
    assert all(p.exists() for p in used) and not stale.exists() and other.exists() and not half.exists()
    assert len(list(folder.glob(f"*{cache.SUFFIX}"))) > len(used)  # the weight ranking's too
    # past the size cap the least recently used go first
    entries = list(folder.glob(f"*{cache.SUFFIX}"))
    for k, p in enumerate(entries):
        os.utime(p, (time.time() - (k + 1) * day,) * 2)  # the first the most recently used
    monkeypatch.setattr(cache, "MAX_BYTES", entries[0].stat().st_size + entries[1].stat().st_size)
    assert cache.prune(folder) == len(entries) - 2
    assert sorted(folder.glob(f"*{cache.SUFFIX}")) == sorted(entries[:2])


def test_moved_data_computes_again_so_no_result_names_the_old_path(tmp_path, inputs):
    store(tmp_path / "c", inputs).get(("r",), lambda: "named calib")
    shutil.copytree(inputs, tmp_path / "moved")  # the same bytes under another name
    assert store(tmp_path / "c", tmp_path / "moved").get(("r",), lambda: "named moved") == "named moved"
    assert store(tmp_path / "c", inputs).get(("r",), never) == "named calib"


def test_the_engines_own_options_are_part_of_its_keys(tmp_path, inputs):
    from pytest_ptq.engine import Engine

    keys = [cache.for_engine(tmp_path / "c", Engine(inputs / "q.onnx", inputs / "calib", optimization=level)).key(("r",))
            for level in ("all", "disable", "all")]
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_with_a_key_set_an_entry_edited_with_its_sha256_redone_is_not_read(tmp_path, inputs, monkeypatch):
    import hashlib
    import pickle

    monkeypatch.setenv(cache.KEY_VARIABLE, "a CI secret")
    store(tmp_path / "c", inputs).get(("r",), lambda: "failed")
    (entry,) = (tmp_path / "c").iterdir()
    assert store(tmp_path / "c", inputs).get(("r",), never) == "failed"
    blob = entry.read_bytes()
    key = blob[len(cache.MAGIC):].partition(b"\n")[2].partition(b"\n")[0]
    payload = key + b"\n" + pickle.dumps("passed")
    forged = cache.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    entry.write_bytes(forged)
    assert store(tmp_path / "c", inputs).get(("r",), lambda: "recomputed") == "recomputed"
    # without the key the same forged entry is read: the docs say so
    entry.write_bytes(forged)
    monkeypatch.delenv(cache.KEY_VARIABLE)
    assert store(tmp_path / "c", inputs).get(("r",), never) == "passed"


def test_a_kept_figure_is_written_only_under_a_png_name_in_its_folder(tmp_path, inputs):
    from pytest_ptq.figures import kept_figure

    def draw(folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "f.png").write_bytes(b"\x89PNG drawn")
        return folder / "f.png"

    s = store(tmp_path / "c", inputs)
    assert kept_figure(s, ("fig",), tmp_path / "out1", draw) == str(tmp_path / "out1" / "f.png")
    (entry,) = (tmp_path / "c").iterdir()
    escaped = tmp_path / "escaped.png"
    for name in (str(escaped), "../escaped.png", "f.sh"):  # a crafted entry: the same key and checksum
        found, value = cache._read(entry, s.key(("fig", kept_figure.__globals__["drawn_by"]())))
        assert found and value[0] == "f.png"
        forged = _rewritten(entry, (name, b"#!/bin/sh"))
        out = kept_figure(store(tmp_path / "c", inputs), ("fig",), tmp_path / "out2", draw)
        assert out == str(tmp_path / "out2" / "f.png") and (tmp_path / "out2" / "f.png").read_bytes() == b"\x89PNG drawn"
        assert not escaped.exists() and not (tmp_path / "out2" / "f.sh").exists()
        entry.write_bytes(forged[1])


def _rewritten(entry, value):
    """Replace ``entry``'s result by ``value`` with its key and a matching sha256; returns
    ``(new bytes, old bytes)``."""
    import hashlib
    import pickle

    blob = entry.read_bytes()
    key = blob[len(cache.MAGIC):].partition(b"\n")[2].partition(b"\n")[0]
    payload = key + b"\n" + pickle.dumps(value)
    new = cache.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    entry.write_bytes(new)
    return new, blob


def test_the_report_takes_a_kept_figure_only_as_png_text():
    from pytest_ptq import report

    page = report._figure({"png": 'x" onerror="alert(1)', "title": "curves"})
    assert "onerror" not in page and "<img" not in page and "not shown" in page
    good = report._figure({"png": "iVBORw0KGgo=", "title": "curves"})
    assert '<img src="data:image/png;base64,iVBORw0KGgo="' in good


def test_a_kept_remedy_is_searched_again_when_the_producers_python_changes(tmp_path, inputs, monkeypatch):
    import pytest_ptq.remedy as remedy

    calls = []
    monkeypatch.setattr(remedy, "suggest_remedy", lambda *a, **k: calls.append(1) or "remedy")
    key = AnalysisKey(str(inputs / "q.onnx"), str(inputs / "calib"))
    monkeypatch.setenv("PTQ_MODELOPT_PYTHON", "")
    for python in ("", "/opt/modelopt/bin/python", "/opt/modelopt/bin/python"):
        monkeypatch.setenv("PTQ_MODELOPT_PYTHON", python)
        monkeypatch.setattr("pytest_ptq.remedy.producer_check.PYTHON_ENV", {"onnxruntime": "PTQ_MODELOPT_PYTHON"})
        assert Analysis(key, inputs, cache_dir=tmp_path / "c").suggest() == "remedy"
    assert len(calls) == 2


def test_the_clis_kept_results_name_the_file_given_not_a_copy_read_before(tmp_path, inputs):
    from pytest_ptq import cli

    shutil.copy(inputs / "q.onnx", inputs / "candidate.onnx")  # the same bytes under another name
    (inputs / "link.onnx").symlink_to(inputs / "q.onnx")  # the same file under another name
    for name in ("q.onnx", "candidate.onnx", "link.onnx"):
        assert cli.main(["get-sensitivity-of-nodes", str(inputs / name), str(inputs / "calib"), "--quiet",
                         "--cache-dir", str(tmp_path / "c"), "--json", str(tmp_path / f"{name}.json")]) == 0
        assert json.loads((tmp_path / f"{name}.json").read_text())["model"].endswith(name)


def test_a_diagnosis_is_kept_and_read_back_whole(tmp_path, inputs, monkeypatch):
    """A failing contract's diagnosis was computed again on every run (9 s of an unchanged
    rerun whose checks read their results back)."""
    import pytest_ptq.diagnosis as diagnosis

    key = AnalysisKey(str(inputs / "q.onnx"), str(inputs / "calib"))
    first = Analysis(key, tmp_path, cache_dir=tmp_path / "c").diagnosis("activation", top=3)
    monkeypatch.setattr(diagnosis, "diagnose", lambda *a, **k: never())
    again = Analysis(key, tmp_path, cache_dir=tmp_path / "c").diagnosis("activation", top=3)
    assert again.to_dict() == first.to_dict() and again.lines(3) == first.lines(3)


def test_a_result_after_progress_lines_is_shown_on_its_own_files_status_line(pytester, inputs):
    """Progress lines after an item's last report (its model's report figures, drawn when no
    later item needs it) left the status line they cut pending: the next file's first result
    was written after the name of the file before (``b.py a.py x``)."""
    setup_project(pytester, inputs)
    pytester.makeconftest("""
        import pytest

        streams = []

        @pytest.fixture
        def noisy(ptq):
            streams.append(ptq.analysis.progress)
            return ptq.analysis.progress

        def pytest_runtest_logfinish(nodeid, location):
            streams.pop().write("after the last report\\n")
        """)
    marker = "@pytest.mark.ptq(model='q.onnx', data='calib')\n"
    pytester.makepyfile(test_a=f"import pytest\n{marker}def test_a(noisy):\n    noisy.write('during a\\n')\n",
                        test_b=f"import pytest\n{marker}@pytest.mark.xfail(strict=True)\n"
                               "def test_b(noisy):\n    noisy.write('during b\\n')\n    assert 0\n")
    result = runp(pytester, "--ptq-no-cache", "-p", "no:xdist", "test_a.py", "test_b.py")
    result.assert_outcomes(passed=1, xfailed=1)
    results = [x for x in result.stdout.lines if re.match(r"test_[ab]\.py [.x]", x)]
    assert [x.split()[:2] for x in results] == [["test_a.py", "."], ["test_b.py", "x"]], result.stdout.str()


def test_a_path_pickled_as_python_3_13_names_it_is_read_back():
    """Python 3.13 pickles a Path as pathlib._local.PosixPath: every entry holding one (a
    ranking's details) was refused as stale and computed again on every run there, and an
    older Python sharing the cache (a CI matrix) refused what 3.13 wrote."""
    import io
    import pathlib
    import pickle

    payload = pickle.dumps({"p": pathlib.PurePosixPath("a/b")}, protocol=5)
    payload = payload.replace(b"\x8c\x07pathlib\x94", b"\x8c\x0epathlib._local\x94")
    assert b"pathlib._local" in payload
    assert cache._ResultUnpickler(io.BytesIO(payload)).load() == {"p": pathlib.PurePosixPath("a/b")}


class _Unlisted:
    """A record no entry may hold (not in cache._KINDS)."""


def test_a_result_the_cache_would_not_read_back_is_said_not_kept(tmp_path, inputs):
    """A result holding a class missing from the unpickler's list was written, refused on
    every read and computed again on every run, with nothing said: the cache silently never
    worked for it. It is read back before it is written now, and the one warning says so."""
    with pytest.warns(cache.PTQCacheWarning, match=r"_Unlisted is not part of a result.*computed again on every run"):
        store(tmp_path / "c", inputs).get(("r", 1), _Unlisted)
    assert not list((tmp_path / "c").glob("*" + cache.SUFFIX))
    kept = store(tmp_path / "c", inputs)
    kept.get(("r", 2), lambda: {"x": np.arange(3)})  # a result it reads back is kept as before
    assert kept.write_error is None and store(tmp_path / "c", inputs).get(("r", 2), never)["x"].tolist() == [0, 1, 2]

"""pytest-xdist: the items of one model run on one worker, so each worker compiles only the
models it checks."""

from __future__ import annotations

import os
from pathlib import Path
import re
import shutil

import pytest

import builders
from test_plugin import N, plugin_args, run


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("xdist_models")
    data = builders.samples(N)
    builders.save_folder(data, root / "calib")
    for k in (0, 1):
        builders.quantize(builders.conv_net(root / f"float{k}.onnx", seed=k), root / f"m{k}.onnx", data)
    return root


def _two_contracts(pytester, two_models):
    """Both models, their data and a contract each (c0, c1) in the pytester project."""
    for name in ("m0.onnx", "m1.onnx", "calib"):
        src = two_models / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, pytester.path / name)
    for k in (0, 1):
        pytester.makefile(".ptq.yaml", **{f"c{k}": f"model: m{k}.onnx\ndata: calib\nnodes: {{threshold: 0.0}}\n"
                                                   "baseline: false\n"})


def test_a_models_items_share_one_worker(pytester, two_models):
    _two_contracts(pytester, two_models)
    # Python tests of the same models, in another file, join their model's worker
    pytester.makepyfile(test_py="""
        import pytest

        @pytest.mark.ptq(model="m0.onnx", data="calib")
        def test_c0(ptq_analysis):
            assert ptq_analysis.engine

        @pytest.mark.ptq(model="m1.onnx", data="calib")
        def test_c1(ptq_analysis):
            assert ptq_analysis.engine

        def test_plain():
            pass
    """)
    result = run(pytester, "-n", "2", "-v")
    result.assert_outcomes(passed=7)
    workers = {}
    for line in result.stdout.lines:
        m = re.search(r"\[(gw\d)\] .*PASSED \S*(c\d)\b", line)
        if m:
            workers.setdefault(m.group(2), set()).add(m.group(1))
    assert set(workers) == {"c0", "c1"} and all(len(w) == 1 for w in workers.values()), workers


def test_baselines_keep_their_paths_under_xdist(pytester, two_models):
    shutil.copy(two_models / "m0.onnx", pytester.path / "m0.onnx")
    shutil.copytree(two_models / "calib", pytester.path / "calib")
    pytester.makepyfile(test_m="""
        import pytest

        @pytest.mark.ptq(model="m0.onnx", data="calib")
        def test_base(ptq):
            ptq.assert_baseline()
    """)
    run(pytester, "-n", "2", "--ptq-update-baseline").assert_outcomes(failed=1)
    written = sorted(p.relative_to(pytester.path).as_posix() for p in pytester.path.rglob("*.json"))
    assert written == ["ptq_baselines/test_m/test_base.json"]
    run(pytester, "-p", "no:xdist").assert_outcomes(passed=1)


RELEASE_PROBE = """
import json

import pytest

@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(config):  # after the report and the summary, which must not compile a freed model again
    from pytest_ptq import session as s
    ptq = config.stash[s.SESSION_KEY]
    state = {a.label: {"engine": a._engine is not None,
                       "segments": a._engine is not None and a._engine._segments is not None,
                       "early": a.key.id in ptq.early}
             for a in ptq.analyses.values()}
    open("released.json", "w").write(json.dumps(state))
"""


def test_a_models_sessions_are_freed_once_its_tests_ran(pytester, two_models):
    _two_contracts(pytester, two_models)
    pytester.makeconftest(RELEASE_PROBE)
    run(pytester, "--ptq-report=r.html").assert_outcomes(passed=4)
    import json

    state = json.loads((pytester.path / "released.json").read_text())
    assert set(state) == {"m0.onnx", "m1.onnx"}
    # the report page was computed model by model, before each was freed
    assert all(s == {"engine": False, "segments": False, "early": True} for s in state.values()), state
    page = (pytester.path / "r.html").read_text()
    assert "m0.onnx" in page and "m1.onnx" in page


def test_a_finished_models_engine_goes_and_its_warnings_stay(pytester, tmp_path):
    """A model's last item ran: its engine goes whole, not only its sessions (a kept one held
    ~10 MiB per finished model to the end, and a low-memory one kept glibc's mmap threshold
    fixed at 128 KiB, which made the user's later tests 18x slower); its warnings still reach
    the summary."""
    import conventions

    from pytest_ptq.engine import Engine

    data = conventions.mlp_samples(2, width=256)
    builders.save_folder(data, pytester.path / "calib")
    # weights past LARGE_BYTES, shared between sessions: low memory sets glibc's threshold for them
    builders.quantize(conventions.mlp_net(tmp_path / "f.onnx", width=256, hidden=256), pytester.path / "m.onnx", data,
                      extra_options={"AddQDQPairToWeight": False})
    expected = Engine(str(pytester.path / "m.onnx"), data, check=False).warnings
    assert expected  # weights stored quantized, no float model given
    # failing: the summary's diagnosis and search commands read the model after it was freed
    pytester.makefile(".ptq.yaml", m="model: m.onnx\ndata: calib\noutputs: {default: 0.9999999}\nbaseline: false\n")
    pytester.makeconftest(RELEASE_PROBE)
    pytester.makepyfile(test_m="""
        import gc
        import weakref

        import pytest

        from pytest_ptq.engine import runtime

        ENGINES = []

        @pytest.mark.ptq(model="m.onnx", data="calib")
        def test_model(ptq_analysis):
            ENGINES.append(weakref.ref(ptq_analysis.engine))
            assert ptq_analysis.sensitivity("activation")
            assert runtime._MALLOC_OWNERS  # low memory: glibc's threshold fixed while the engine lives

        def test_after():
            gc.collect()
            assert ENGINES[0]() is None
            assert not runtime._MALLOC_OWNERS  # so glibc's threshold is given back
    """)
    result = run(pytester, "--ptq-memory=low", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    out = " ".join(result.stdout.str().split())  # the summary wraps its lines
    for text in expected:
        assert f"warning: m.onnx: {text}" in out
    assert "ptq-debug suggest m.onnx calib" in out  # the failing model's explanation
    import json

    assert json.loads((pytester.path / "released.json").read_text())["m.onnx"]["engine"] is False


def test_a_model_known_only_at_run_time_keeps_every_session(pytester, two_models):
    for name in ("m0.onnx", "calib"):
        src = two_models / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, pytester.path / name)
    pytester.makeconftest(RELEASE_PROBE)
    pytester.makepyfile(test_m="""
        import pytest

        @pytest.mark.parametrize("ptq_model", ["m0.onnx"], indirect=True)
        @pytest.mark.ptq(data="calib")
        def test_it(ptq_analysis):
            assert ptq_analysis.sensitivity("activation")
    """)
    run(pytester).assert_outcomes(passed=1)
    import json

    state = json.loads((pytester.path / "released.json").read_text())
    assert list(state.values()) == [{"engine": True, "segments": True, "early": False}]


def test_a_model_known_at_collection_is_freed_beside_one_known_only_at_run_time(pytester, two_models):
    """The known models' sessions are freed once their items ran, though an item's model is
    known only at run time; that item, using a freed model, recompiles it and ranks."""
    _two_contracts(pytester, two_models)
    pytester.makeconftest(RELEASE_PROBE)
    pytester.makepyfile(test_z="""
        import pytest

        @pytest.mark.parametrize("ptq_model", ["m0.onnx"], indirect=True)
        @pytest.mark.ptq(data="calib")
        def test_again(ptq_analysis):
            assert ptq_analysis.engine._segments is None  # freed after c0's items ran
            ranking = ptq_analysis.sensitivity("activation")
            assert ranking and all(v == v for v in ranking.values())
    """)
    result = run(pytester, "-v")
    result.assert_outcomes(passed=5)
    import json

    state = json.loads((pytester.path / "released.json").read_text())
    # m1 freed once c1 ran; m0 freed after c0, then compiled again for test_again
    assert state["m1.onnx"] == {"engine": False, "segments": False, "early": False}, state
    assert state["m0.onnx"]["segments"] is True, state


def test_workers_share_the_cores(pytester, two_models, monkeypatch):
    """Two workers each running onnxruntime on every core would only take turns: each gets
    its share of the cores; one process keeps onnxruntime's default (0)."""
    shutil.copy(two_models / "m0.onnx", pytester.path / "m0.onnx")
    shutil.copytree(two_models / "calib", pytester.path / "calib")
    pytester.makepyfile(test_t="""
        import os
        import pytest

        @pytest.mark.ptq(model="m0.onnx", data="calib")
        def test_threads(ptq_analysis):
            threads = ptq_analysis.engine.session("main").get_session_options().intra_op_num_threads
            assert threads == int(os.environ["EXPECTED_THREADS"]), threads
    """)
    monkeypatch.setenv("EXPECTED_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))
    run(pytester, "-n", "2").assert_outcomes(passed=1)
    monkeypatch.setenv("EXPECTED_THREADS", "0")
    run(pytester, "-p", "no:xdist").assert_outcomes(passed=1)


def test_a_worker_left_alone_takes_the_cores_its_peers_gave_back(tmp_path, monkeypatch):
    """Processes sharing the cores each keep a file in one folder while they run: with two
    there, each may keep half the cores busy; once the other has left, all of them (those
    it may run on, not the machine's)."""
    from pytest_ptq.engine import runtime

    for name, value in (("_THREADS", 0), ("_PEERS", None), ("_SPARE", [0.0, 0])):
        monkeypatch.setattr(runtime, name, value)
    # four cores of the process's affinity (taskset, a cpuset) on a machine of sixteen
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(runtime, "SPARE_LOOKUP_S", 0)  # looked up on every call
    import subprocess
    import time

    folder = tmp_path / "cores"
    runtime.share_cores(2, folder)
    peer = subprocess.Popen(["sleep", "30"])
    try:
        (folder / str(peer.pid)).touch()
        assert runtime.cores() == 2 and runtime.all_cores() == 4 and runtime.spare_cores() == 2
        # a worker killed leaves its file: dead (reaped), or a zombie its parent has not reaped yet
        gone, zombie = subprocess.Popen(["true"]), subprocess.Popen(["true"])
        gone.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b") Z" not in Path(f"/proc/{zombie.pid}/stat").read_bytes():
            time.sleep(0.02)
        (folder / str(gone.pid)).touch()
        (folder / str(zombie.pid)).touch()
        assert runtime.spare_cores() == 2  # the living peer still counts, the dead do not
        (folder / str(peer.pid)).unlink()
        assert runtime.spare_cores() == 4
        zombie.wait()
        for p in (gone, zombie):
            (folder / str(p.pid)).unlink()
    finally:
        peer.kill()
        peer.wait()
    runtime.leave()
    assert not any(folder.iterdir()) and runtime.spare_cores() == runtime.cores() == 2


@pytest.mark.parametrize("limit", [1, 2])
def test_configs_in_flight_follow_the_limit_of_the_moment(limit):
    import threading
    import time

    from pytest_ptq.engine.workers import Workers

    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def work(i):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return i

    pool = Workers(3, limit=lambda: limit)
    assert list(pool.map(work, range(8))) == list(range(8))
    pool.close()
    assert state["most"] == limit


def test_a_run_removes_what_killed_runs_left_in_the_temporary_folder(pytester, two_models, monkeypatch, tmp_path):
    """An xdist controller killed (kill -9, a CI time limit) leaves its groups file and its
    cores folder; the next run, with a run id of its own, never removed them. The first worker's
    start sweeps those a day old; a run's own, and another's still going, stay."""
    import tempfile
    import time

    from pytest_ptq import spread

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    old = time.time() - 2 * spread.STALE_AFTER_S
    stale = [temp / "pytest-ptq-groups-dead.json", temp / "pytest-ptq-cores-dead"]
    stale[0].write_text("{}")
    stale[1].mkdir()
    (stale[1] / "123").write_text("")
    for p in (stale[1] / "123", *stale):
        os.utime(p, (old, old))
    going = temp / "pytest-ptq-groups-going.json"
    going.write_text("{}")
    mine = temp / "notes.txt"
    mine.write_text("not ours")
    os.utime(mine, (old, old))
    # workers whose temporary folder differs use the controller's, which it removes at its end
    theirs = tmp_path / "workers-temp"
    theirs.mkdir()
    monkeypatch.setenv("TMPDIR", str(theirs))
    _two_contracts(pytester, two_models)
    run(pytester, "-n", "2").assert_outcomes(passed=4)
    assert not any(p.exists() for p in stale) and going.exists() and mine.exists()
    assert not list(theirs.glob("pytest-ptq-*")) and not list(temp.glob("pytest-ptq-cores-*"))


def test_a_failing_contracts_one_line_reaches_the_controller(pytester, two_models):
    """Under -n the failure reached the controller as text, and its short summary line and
    JUnit message read the contract's heading ("contract c0 (c0.ptq.yaml), check outputs:
    FAILED") instead of what failed and by how much."""
    _two_contracts(pytester, two_models)
    (pytester.path / "c0.ptq.yaml").write_text("model: m0.onnx\ndata: calib\noutputs: {default: 1.0}\nbaseline: false\n")
    # in a process of its own, as CI runs it (an in-process run reads the workers' reports otherwise)
    result = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "-n", "2", "-rf", "c0.ptq.yaml",
                                           "--junitxml=j.xml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["contract c0 (c0.ptq.yaml), check outputs: FAILED",
                                 "output cosine-similarity fails for 1 of 1 output(s): *",
                                 "FAILED c0.ptq.yaml::outputs - output cosine-similarity fails*"])
    assert 'message="output cosine-similarity fails for 1 of 1 output(s)' in (pytester.path / "j.xml").read_text()

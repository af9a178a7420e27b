"""The progress bar in a log (no terminal): a line per 10% with the time left (at most every
ten seconds, none for a few seconds' work), one at the end."""

from __future__ import annotations

import io
import os

import pytest

from pytest_ptq import progress
from pytest_ptq.progress import Progress


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    return now


def _logged(clock, total, label, seconds, out=None):
    """What ``total`` steps of ``seconds`` each print on ``out`` (default: a log)."""
    out = io.StringIO() if out is None else out
    with Progress(total, label, stream=out) as bar:
        for _ in range(total):
            clock[0] += seconds
            bar.advance()
    return out.getvalue()


def test_a_log_gets_a_line_per_tenth_and_one_at_the_end(clock):
    lines = _logged(clock, 50, "work", 1.0).splitlines()
    # the first line once five seconds have passed, then one per tenth at most every ten
    # seconds (a line per tenth of every few-second step made two thirds of a suite's log), then the end
    assert lines[0] == "work: 6/50 (12%) 6.0s elapsed, ~44s left"
    assert lines[1] == "work: 16/50 (32%) 16.0s elapsed, ~34s left"
    assert len(lines) == 6 and lines[-1] == "work: 50/50 done, 50.0s elapsed"
    # a step of a few seconds says nothing
    assert _logged(clock, 10, "step", 0.4) == ""


def test_work_past_its_estimate_shows_no_time_left_and_a_line_a_minute(clock):
    out = io.StringIO()
    with Progress(10, "search", stream=out) as bar:
        for _ in range(400):
            clock[0] += 1.0
            if bar.done + 1 > bar.total:
                bar.extend()  # as a search that finds more to try
            bar.advance()
    lines = out.getvalue().splitlines()
    past = [x for x in lines if "past the first estimate of 10" in x]
    assert len(past) == 6 and "left" not in " ".join(past)  # a line a minute of the run
    assert past[0] == "search: 66 done, 66.0s elapsed (past the first estimate of 10; the work decides how much more)"
    assert lines[-1] == "search: 400/400 done, 400.0s elapsed"


def test_work_announced_at_its_start_says_when_it_is_done(clock):
    """An announced start ("...: started") of work under five seconds had no end."""
    out = io.StringIO()
    with Progress(4, "re-quantizing", stream=out, announce=True) as bar:
        for _ in range(4):
            clock[0] += 0.5
            bar.advance()
    assert out.getvalue().splitlines() == ["re-quantizing: started", "re-quantizing: 4/4 done, 2.0s elapsed"]


def test_short_runs_and_failures_print_nothing(clock):
    assert _logged(clock, 10, "quick", 0.1) == ""
    out = io.StringIO()
    with pytest.raises(RuntimeError), Progress(10, "broken", stream=out) as bar:
        clock[0] += 5
        raise RuntimeError("stop")
    assert out.getvalue() == ""


def test_time_spent_paused_does_not_count_towards_the_time_left(clock):
    out = io.StringIO()
    with Progress(10, "search", stream=out) as bar:
        with bar.paused():
            clock[0] += 500.0  # a ranking with its own bar
        for _ in range(10):
            clock[0] += 1.0
            bar.advance()
    lines = out.getvalue().splitlines()
    assert lines[0] == "search: 6/10 (60%) 6.0s elapsed, ~4s left"
    assert lines[-1] == "search: 10/10 done, 10.0s elapsed"


def test_work_of_unknown_size_is_counted_with_no_time_left(clock):
    out = io.StringIO()
    with Progress(None, "search", stream=out) as bar:
        for _ in range(130):
            clock[0] += 1.0
            if bar.done + 1 > bar.total:
                bar.extend()  # as the remedy search's scorer does
            bar.advance()
    lines = out.getvalue().splitlines()
    assert lines == ["search: 60 done, 60.0s elapsed", "search: 120 done, 120.0s elapsed", "search: 130 done, 130.0s elapsed"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_a_terminal_line_fits_its_width_and_is_redrawn_a_few_times_a_second(clock, monkeypatch, columns):
    # a line wider than the terminal wraps, and every redraw then adds a row
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(progress.shutil, "get_terminal_size", lambda *a, **k: os.terminal_size((columns, 24)))
    drawn = _logged(clock, 3000, "sensitivity (activation) of a long description", 0.001, _Terminal()).split("\r")[1:]
    assert drawn and all(len(d.rstrip("\n")) == columns - 1 for d in drawn)
    assert len(drawn) <= 3 / progress.REDRAW + 2  # a redraw per REDRAW seconds, and the last step
    assert "3000/3000" in drawn[-1]
    assert ("[#########################]" in drawn[-1]) == (columns >= 120)
    out = _Terminal()
    with Progress(None, "search", stream=out) as bar:  # work of unknown size
        for _ in range(50):
            clock[0] += 1.0
            bar.advance()
    drawn = out.getvalue().split("\r")[1:]
    assert all(len(d.rstrip("\n")) == columns - 1 for d in drawn) and "50 done" in drawn[-1]


def test_the_time_left_waits_for_a_tentative_total_and_a_slow_tenth_still_gets_a_line(clock):
    """runall's ranking started its bar at every sample of every node, a bound it replaces once
    the first sample is timed: it read "~616s left" for a step of 43 s; and a tenth of work
    taking more than ten minutes left a CI log silent long enough for the job to be killed."""
    out = io.StringIO()
    with Progress(1000, "ranking", stream=out, tentative=True) as bar:
        for step in range(300):
            clock[0] += 1.0
            if step == 100:
                bar.total, bar.tentative = 300, False  # what the work now knows it will do
            bar.advance()
    lines = out.getvalue().splitlines()
    assert lines[0] == "ranking: 6/1000 (0%) 6.0s elapsed"
    assert all(("left" in line) == ("/300 (" in line) for line in lines)
    assert lines[-1] == "ranking: 300/300 done, 300.0s elapsed" and "110/300 (36%) 110.0s elapsed, ~190s left" in lines[2]
    slow = _logged(clock, 1000, "slow", 3.0).splitlines()  # a tenth takes 300 s
    times = [float(line.split("s elapsed")[0].rsplit(" ", 1)[1]) for line in slow]
    assert max(b - a for a, b in zip([0.0, *times], times)) <= progress.HEARTBEAT + 3.0


def test_a_bar_on_a_narrow_terminal_fits_it_when_stdout_is_a_file(clock, monkeypatch):
    """With stdout redirected (--json - > out.json), the bar on a 50-column stderr read the
    size of stdout, which falls back to 80, and every redraw wrapped into a row of its own."""
    class Stderr(_Terminal):
        def fileno(self):
            return 99

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(progress.shutil, "get_terminal_size", lambda *a, **k: os.terminal_size((80, 24)))
    monkeypatch.setattr(progress.os, "get_terminal_size",
                        lambda fd: os.terminal_size((50, 24)) if fd == 99 else os.terminal_size((80, 24)))
    drawn = _logged(clock, 500, "sensitivity (node)", 0.01, Stderr()).split("\r")[1:]
    assert drawn and all(len(d.rstrip("\n")) == 49 for d in drawn)
    monkeypatch.setenv("COLUMNS", "60")  # the user's word stands, as it did
    drawn = _logged(clock, 500, "sensitivity (node)", 0.01, Stderr()).split("\r")[1:]
    assert drawn and all(len(d.rstrip("\n")) == 59 for d in drawn)


def test_a_step_that_alone_outlasts_the_heartbeat_still_gets_lines(monkeypatch):
    """The heartbeat came only with a step's end: one pass of a large model taking longer than
    a CI system's silence limit left the log silent until it ended."""
    import threading
    import time
    monkeypatch.setattr(progress, "HEARTBEAT", 0.2)
    out = io.StringIO()
    with Progress(10, "float pass", stream=out) as bar:
        time.sleep(0.7)
        lines = out.getvalue().splitlines()
        assert len(lines) >= 2 and all(line.startswith("float pass: still on step 1/10, ") for line in lines), lines
        with bar.paused():  # inner work with a bar of its own speaks for itself
            time.sleep(0.5)
        assert out.getvalue().splitlines() == lines
        bar.advance()
    assert out.getvalue().splitlines()[-1].startswith("float pass: 1/10 done, ")
    time.sleep(0.3)
    assert not [t for t in threading.enumerate() if t.name == "ptq-progress-heartbeat"]
    quiet = io.StringIO()
    with Progress(10, "off", enabled=False, stream=quiet):
        time.sleep(0.5)
    assert quiet.getvalue() == ""

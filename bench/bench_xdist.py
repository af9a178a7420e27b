"""Benchmark: a suite of several models run serially and with ``pytest -n N`` (pytest-xdist).

Runs ``pytest SUITE`` and ``pytest SUITE -n N`` alternately, each ``--repeat`` times, in
fresh processes, and prints the median wall time of each and their ratio (parallel /
serial; below 1 means the workers help). With pytest-ptq's scheduling one model's items
go to one worker, so each worker compiles only the models it checks.

The default suite is the example suite (its models prepared once before timing starts).

Usage: python bench/bench_xdist.py [SUITE] [-n 2] [--repeat 3] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(args):
    """Wall seconds of one pytest run in a fresh process; exits on a crash (rc >= 2)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # 1: a contract failed, which is the suite's business
        sys.exit(f"pytest {' '.join(args)} stopped with exit code {proc.returncode}:\n"
                 + proc.stdout[-3000:])
    return seconds, proc.stdout.strip().splitlines()[-1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite", nargs="?", default="example_suite")
    p.add_argument("-n", dest="workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("extra", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    base = [a.suite, "-q", "-p", "no:cacheprovider", *[x for x in a.extra if x != "--"]]
    print(f"warm-up (prepares the suite's models): {timed(base)[0]:.0f} s", flush=True)
    runs = {"serial": [], f"-n {a.workers}": []}
    for _ in range(a.repeat):
        for label, args in (("serial", base), (f"-n {a.workers}", [*base, "-n", str(a.workers)])):
            seconds, summary = timed(args)
            runs[label].append(seconds)
            print(f"  {label:>6}: {seconds:6.1f} s   {summary}", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    serial, parallel = med.values()
    print(f"median of {a.repeat}: serial {serial:.1f} s, -n {a.workers} {parallel:.1f} s, "
          f"ratio {parallel / serial:.2f}x")


if __name__ == "__main__":
    main()

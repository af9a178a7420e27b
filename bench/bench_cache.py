"""Benchmark: a contract's first run against its rerun with the on-disk result cache.

Runs ``pytest CONTRACT`` with a fresh ``--ptq-cache-dir`` (the first run computes and keeps
every result), then again with the same folder (an unchanged rerun reads them), each in a
fresh process, ``--repeat`` times, and prints the median wall times and their ratio
(target <= 0.2). The default contract is the example suite's detector (its models prepared
once before timing starts).

Usage: python bench/bench_cache.py [CONTRACT] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from bench_xdist import ROOT, timed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("contract", nargs="?", default="example_suite/ppocrv4_det.ptq.yaml")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    base = [a.contract, "-q", "-p", "no:cacheprovider"]
    print(f"warm-up (prepares the models): {timed([*base, '--ptq-no-cache'])[0]:.0f} s", flush=True)
    first, again = [], []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory() as cache:
            args = [*base, f"--ptq-cache-dir={cache}"]
            for runs, label in ((first, "first run"), (again, "rerun")):
                seconds, summary = timed(args)
                runs.append(seconds)
                print(f"  {label:>9}: {seconds:6.1f} s   {summary}", flush=True)
    f, r = statistics.median(first), statistics.median(again)
    print(f"median of {a.repeat}: first run {f:.1f} s, rerun {r:.1f} s, ratio {r / f:.2f}x (from {ROOT.name})")


if __name__ == "__main__":
    sys.exit(main())

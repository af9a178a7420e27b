"""Benchmark: how much of the all-sample top 10's loss runall's default rankings find, and in how many runs.

Scores every weight and activation node alone on every sample once (the slow part; kept
under ``bench/.cache/screening/``), then replays two ways of spending the default budget of
``DEFAULT_BUDGET_SAMPLES`` samples over ``--orders`` orders of the data (the first as stored,
the rest shuffled), each confirming its top ``DEFAULT_CONFIRM`` on every sample:

  every node   every node on the budget's samples, spread over the data;
  narrowing    every node on half of them, the top quarter of each ranking on three times
               as many, spread and holding the first (what screen() does).

For each it prints the runs it costs and, per node type, the share of the all-sample top
10's loss (1 - cosine, summed) that its confirmed top 10 holds (mean and worst over the
orders) and how many of the all-sample top 5 it confirms (mean).

Usage: python bench/bench_screening.py [MODEL DATA] [--orders 30]
(default: the PP-OCRv4 recogniser and 32 crops of bench_runall.py)
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def collect(model, data):
    """``{type: array [nodes, samples, outputs, 3]}``: each node's cosine sums per sample."""
    from pytest_ptq.engine import Engine
    from pytest_ptq.metrics import get_metrics
    from pytest_ptq.outputs import parse_outputs
    from pytest_ptq.progress import Progress
    from pytest_ptq.sensitivity import score_configs, targets_for

    key = hashlib.sha256(Path(model).read_bytes()).hexdigest()[:16]
    cached = ROOT / "bench" / ".cache" / "screening" / f"{key}_{sum(1 for _ in Path(data).rglob('*.npy'))}.npz"
    if cached.exists():
        return dict(np.load(cached))
    engine = Engine(model, data)
    metrics, specs = get_metrics(["cosine-similarity"]), parse_outputs(None, engine)
    out = {}
    for t in ("weight", "activation"):
        configs = targets_for(engine, t)
        per = np.zeros((len(configs), len(engine.data), len(specs), 3))
        with Progress(len(engine.data) * len(configs), f"every {t} node on every sample") as bar:
            for i in range(len(engine.data)):
                scores = score_configs(engine, configs, metrics, specs, [i], bar)
                for j, label in enumerate(configs):
                    per[j, i] = np.stack(list(scores[label][0].states.values()))  # the cosine pool's sums per output
        out[t] = per
    cached.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cached, **out)
    return out


def losses(per, samples):
    """1 - pooled cosine of each node over ``samples`` (worst output)."""
    s = per[:, list(samples)].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = s[..., 0] / np.sqrt(s[..., 1] * s[..., 2])
    return 1 - np.nan_to_num(np.minimum(cos, 1.0), nan=1.0).min(axis=1)


def replay(per, order, first, wide, keep, confirm):
    """(runs, confirmed nodes): every node on ``first`` samples, the top ``keep`` on ``wide``."""
    from pytest_ptq.engine.sanity import spread

    nodes, n = per.shape[:2]
    wider = [order[j] for j in spread(n, wide)]
    chosen = [wider[j] for j in spread(len(wider), first)]
    near = np.argsort(-losses(per, chosen), kind="stable")[:keep]
    top = near[np.argsort(-losses(per[near], wider), kind="stable")[:confirm]]
    return nodes * first + len(near) * (wide - first) + len(top) * (n - wide), top


def main(argv=None):
    from pytest_ptq import screening

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?")
    p.add_argument("data", nargs="?")
    p.add_argument("--orders", type=int, default=30)
    a = p.parse_args(argv)
    if a.model is None:
        import bench_runall

        a.model, a.data = bench_runall.prepare(32)
    per_type = collect(a.model, a.data)
    n = next(iter(per_type.values())).shape[1]
    k, confirm = screening.DEFAULT_BUDGET_SAMPLES, screening.DEFAULT_CONFIRM
    first = math.ceil(k / 2)
    rng = np.random.default_rng(0)
    orders = [list(range(n))] + [list(rng.permutation(n)) for _ in range(a.orders - 1)]
    print(f"{Path(a.model).name}: {n} samples, " + ", ".join(f"{len(v)} {t} nodes" for t, v in per_type.items()))
    for label, (lo, hi, share) in {"every node": (k, k, 1.0),
                                   "narrowing": (first, screening.NARROW_MORE * first, screening.NARROW_SHARE)}.items():
        runs, found = 0, {}
        for t, per in per_type.items():
            truth = losses(per, range(n))
            best = np.sort(truth)[::-1][:10]
            keep = min(len(per), max(screening.NARROW_MIN * confirm, math.ceil(share * len(per))))
            held, top5 = [], []
            for order in orders:
                cost, top = replay(per, order, lo, min(hi, n), keep, confirm)
                runs += cost / len(orders)
                picks = np.sort(truth[top])[::-1][:10]
                held.append(picks.sum() / best.sum())
                top5.append(len(set(top) & set(np.argsort(-truth)[:5])))
            found[t] = f"{t} {np.mean(held):.3f} (worst {min(held):.3f}), top 5: {np.mean(top5):.2f}"
        print(f"  {label:>10} ({lo} samples, {hi} for the top): {runs:6.0f} runs; loss held " + "; ".join(found.values()))


if __name__ == "__main__":
    main()

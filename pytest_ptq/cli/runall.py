"""``runall``: every analysis, one folder, a verdict."""

from __future__ import annotations

from pathlib import Path

from .. import params
from ..runall import runall
from ..screening import DEFAULT_BUDGET_S, DEFAULT_BUDGET_SAMPLES
from . import args as a


def run(args):
    engine, cache = a.engine_and_cache(args, told=True)  # the summary lists the warnings
    summary = runall(engine, save_dir=args.save_dir, metrics=args.metrics, output_node=args.output_node,
                     node_type=args.node_type, top=args.top, axis=args.axis, data_num=args.data_num,
                     heldout=args.heldout, progress=not args.quiet, rank_samples=args.rank_samples,
                     time_budget=args.time_budget, cache=cache)
    # as written: a name that came in undecoded (a non-UTF-8 path) goes back out as its bytes
    print(Path(summary["files"]["summary_md"]).read_text(encoding="utf-8", errors="surrogateescape"))
    print(f"wrote {args.save_dir}")


def configure(p):
    a.add_model(p)
    a.add_save_dir(p, "ptq_debug_runall")
    a.add_top(p, "nodes of each ranking that get distributions and box plots", 5)
    a.add_metrics(p, "the first sorts the rankings and draws the curves")
    p.add_argument("-t", "--node-type", nargs="+", action=a.Listed, default=None, choices=params.NODE_TYPES,
                   metavar="TYPE", help="rankings to compute: node, weight, activation. Default: weight activation")
    a.add_output_node(p)
    p.add_argument("--axis", type=a.axis, default=None, help="channel axis for the box plots. Default: inferred per node")
    p.add_argument("--rank-samples", type=a.argtype(params.rank_samples, "samples"), default=None,
                   metavar="N|all", help="samples the rankings score every node on. Default: as many as "
                   "--time-budget allows (at least 2), from 4 of them every node on half, the top quarter of each "
                   "ranking on three times as many, then the top 10 of each confirmed on every sample; "
                   "all the --data-num samples when --data-num is given")
    p.add_argument("--time-budget", type=a.seconds, default=None,
                   metavar="SECONDS", help=f"time the rankings may take when --rank-samples is not given. "
                   f"Default: what ranking {DEFAULT_BUDGET_SAMPLES} samples takes (measured on the first), "
                   f"at most {DEFAULT_BUDGET_S:.0f}")
    p.add_argument("--heldout", "--holdout", default=None, metavar="DIR",
                   help="held-out data: the weights/activations verdict is decided on it. Default: the calibration data")
    a.add_cache_dir(p)


COMMANDS = [a.Command("runall", "run every analysis (sensitivity, distributions, box plots, curves) and write a "
                      "folder with a verdict", configure, run)]

"""``suggest``: the fewest nodes to remedy so the output meets a target."""

from __future__ import annotations

from pathlib import Path

from ..errors import PTQError
from ..remedy import REMEDIES, suggest_remedy
from ..results import write_json
from ..tables import format_table
from . import args as a


def run(args):
    if args.target is None and args.metric != "cosine-similarity":
        raise PTQError(f"--metric {args.metric} needs --target VALUE (--target-cosine is for cosine similarity)")
    metric, target = ("cosine-similarity", args.target_cosine) if args.target is None else (args.metric, args.target)
    save_dir = None if args.no_save else args.save_dir
    result = suggest_remedy(a.engine(args), metric=metric, target=target, remedy=args.remedy,
                            output_node=args.output_node, data_num=args.data_num, budget=args.budget,
                            candidates=args.candidates, full_curve=args.full_curve,
                            per_channel_activations=args.per_channel_activations,
                            requantize_check=not args.no_requantize, save_dir=save_dir,
                            progress=not args.quiet)
    rows = [{"nodes": p["nodes"], "added": p["added"] or "(baseline)", result.metric: p["value"]}
            for p in result.curve]
    print(format_table(rows, ["nodes", "added", result.metric]))
    print(result.summary())
    if save_dir is not None:
        settings = write_json(result.settings, Path(save_dir) / f"remedy_{result.remedy}_settings.json")
        print(f"wrote {settings}")
        print(f"wrote {result.save(Path(save_dir) / f'remedy_{result.remedy}.json')}")
        if result.png:
            print(f"wrote {result.png}")
    if args.json:
        print(f"wrote {result.save(args.json)}")
    measured_ok = result.measured is None or result.measured.get("met", True)
    return 0 if result.met and measured_ok else 1


def configure(p):
    a.add_model(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--target-cosine", type=a.cosine, default=0.99, metavar="C",
                   help="cosine similarity the outputs must reach. Default: 0.99")
    g.add_argument("--target", type=a.number, default=None, metavar="V",
                   help="value of --metric the outputs must reach (instead of --target-cosine)")
    p.add_argument("--metric", default="cosine-similarity", help="metric for --target. Default: cosine-similarity")
    p.add_argument("--remedy", default="float", choices=REMEDIES,
                   help="keep nodes in float, raise them to 16 bit, or quantize them per channel. Default: float")
    p.add_argument("--budget", type=a.seconds, default=None, metavar="SECONDS",
                   help="stop after this long and report the best result so far. Default: no limit")
    a.add_output_node(p)
    p.add_argument("--candidates", nargs="+", default=None, metavar="NODE",
                   help="consider only these calibration or normal nodes. Default: every eligible node")
    p.add_argument("--full-curve", action="store_true",
                   help="keep adding nodes after the target is met, for the whole curve")
    p.add_argument("--per-channel-activations", action="store_true",
                   help="with --remedy per-channel, also simulate activations per channel (onnxruntime cannot "
                        "emit it)")
    p.add_argument("--no-requantize", action="store_true",
                   help="skip re-quantizing the float model to measure the settings")
    a.add_save_dir(p)
    p.add_argument("--no-save", action="store_true", help="write nothing")
    a.add_json(p)


COMMANDS = [a.Command("suggest", "find the fewest nodes to keep in float, raise to 16 bit or quantize per channel "
                      "so the output meets a target; print onnxruntime settings", configure, run)]

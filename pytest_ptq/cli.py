"""``ptq-debug``: the command line face of the analyses, mirroring the seed's hmct-debugger.

Bad input prints one sentence on stderr and exits 2, with no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .errors import PTQError
from .metrics import METRICS

SUBCOMMANDS = {}


def subcommand(name, help):
    """Register ``func(args)`` as ``ptq-debug NAME``; ``func.configure(parser)`` adds options."""

    def wrap(func):
        SUBCOMMANDS[name] = (func, help)
        return func

    return wrap


def _common(p, data=True):
    p.add_argument("model", help="calibrated QDQ model (.onnx)")
    if data:
        p.add_argument("data", help="calibration data: DIR/<input>/<i>.npy, DIR/<input>.npy or one .npz")
        p.add_argument("--data-num", type=_positive_int, default=None,
                       help="use the first N samples only. Default: all")
    p.add_argument("--float-model", default=None,
                   help="the original float model, to recover float weights and check the float reference")
    # '-q' belongs to the seed's --quantize-node, so quiet has only its long name
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _engine(args):
    from .engine import Engine

    return Engine(args.model, args.data, float_model=args.float_model, data_num=args.data_num)


# Modules that register more subcommands with @subcommand when imported.
_COMMAND_MODULES = ("runall", "distribution", "remedy", "stages", "datacheck", "groups")


def _load_command_modules():
    import importlib

    for name in _COMMAND_MODULES:
        try:
            importlib.import_module(f"pytest_ptq.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"pytest_ptq.{name}":
                raise


def build_parser():
    _load_command_modules()
    parser = argparse.ArgumentParser(
        prog="ptq-debug",
        description="Find why a post-training-quantized ONNX (QDQ) model lost accuracy.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (func, help) in SUBCOMMANDS.items():
        p = subs.add_parser(name, help=help, description=help)
        func.configure(p)
        p.set_defaults(func=func)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except PTQError as exc:
        print(f"ptq-debug {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# -- subcommands -------------------------------------------------------------------------
@subcommand("get-sensitivity-of-nodes", "rank nodes by the output error when only they are quantized")
def cmd_sensitivity(args):
    from .sensitivity import get_sensitivity_of_nodes

    engine = _engine(args)
    result = get_sensitivity_of_nodes(engine, args.metrics, output_node=args.output_node,
                                      node_type=args.node_type, interested_nodes=args.interested_nodes,
                                      progress=not args.quiet)
    print(result.table(limit=args.top))
    if args.confidence:
        from .groups import print_confidence

        print_confidence(result, args.confidence, args.top)
    if args.json:
        print(f"wrote {result.save(args.json)}")


def _configure_sensitivity(p):
    _common(p)
    p.add_argument("-m", "--metrics", nargs="+", default=["cosine-similarity"], metavar="METRIC",
                   help=f"metrics, the first sorts the ranking; one of {', '.join(METRICS)}. "
                        "Default: cosine-similarity")
    p.add_argument("-t", "--node-type", default="node", choices=["node", "weight", "activation"],
                   help="which nodes to rank. Default: node")
    p.add_argument("-o", "--output-node", nargs="+", default=None, metavar="OUTPUT",
                   help="outputs to compare (a tensor, a node, or a slice 'name=out[:, 0:4]'). "
                        "Default: every model output")
    p.add_argument("-i", "--interested-nodes", nargs="+", default=None, metavar="NODE",
                   help="rank only these nodes. Default: all of the node type")
    p.add_argument("--top", type=_positive_int, default=None, help="print only the top N rows. Default: all")
    p.add_argument("--json", default=None, metavar="OUT", help="also save the result as JSON")
    from .groups import add_confidence_option

    add_confidence_option(p)


cmd_sensitivity.configure = _configure_sensitivity


@subcommand("plot-acc-error", "plot cumulative error curves node by node under quantization configs")
def cmd_acc_error(args):
    from .curves import plot_acc_error

    q = _nested(args.quantize_node)
    nq = _nested(args.non_quantize_node)
    curves = plot_acc_error(args.save_dir, model_or_file=_engine(args), quantize_node=q,
                            non_quantize_node=nq, metric=args.metric, average_mode=args.average,
                            local=not args.no_local, progress=not args.quiet)
    for label in curves.values:
        worst = ", ".join(f"{n} ({v:.6g})" for n, v in curves.worst(label))
        print(f"{label}: final {curves.metric} {curves.values[label][-1]:.6g}; worst at {worst}")
    print(f"wrote {curves.png}")
    if args.json:
        Path(args.json).write_text(json.dumps(curves.to_dict(), indent=1))
        print(f"wrote {args.json}")


def _nested(values):
    """CLI form of the seed's list of lists: 'a,b' quantizes a and b together in one config."""
    if values is None:
        return None
    return [v.split(",") if "," in v else v for v in values]


def _configure_acc_error(p):
    _common(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quantize-node", nargs="+", default=None, metavar="NODE",
                   help="one config per entry with only it quantized: 'weight', 'activation', a node, "
                        "or 'a,b' for a group. Default: everything quantized")
    g.add_argument("-nq", "--non-quantize-node", nargs="+", default=None, metavar="NODE",
                   help="one config per entry with everything but it quantized")
    p.add_argument("--metric", default="cosine-similarity", help="Default: cosine-similarity")
    p.add_argument("--average", action="store_true", help="plot the running mean of each curve")
    p.add_argument("--no-local", action="store_true", help="skip the local error markers")
    p.add_argument("-s", "--save-dir", default="ptq_debug_output", help="Default: ptq_debug_output")
    p.add_argument("--json", default=None, metavar="OUT", help="also save the curves as JSON")


cmd_acc_error.configure = _configure_acc_error


@subcommand("list-nodes", "list calibration nodes (weight/activation) and normal nodes")
def cmd_list(args):
    from .model import QuantModel
    from .tables import format_table

    qm = QuantModel(args.model, float_model=args.float_model)
    rows = [c.summary() for c in qm.calibration.values()]
    print(format_table(rows, ["name", "kind", "dtype", "threshold", "per_channel", "consumers"]))
    print(f"{len(qm.of_kind('weight'))} weight and {len(qm.of_kind('activation'))} activation calibration "
          f"nodes, {len(qm.normal)} normal nodes")


def _configure_list(p):
    _common(p, data=False)


cmd_list.configure = _configure_list

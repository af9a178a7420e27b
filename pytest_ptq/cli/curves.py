"""``plot-acc-error``: cumulative error curves under the seed's config forms."""

from __future__ import annotations

import argparse

from ..curves import plot_acc_error, unplotted_outputs
from ..metrics import NO_VALUES
from ..verdict import pole_cause
from . import args as a


def nested(values, known):
    """CLI form of the seed's list of lists: 'a,b' quantizes a and b together in one config;
    a value in ``known`` (node names) is one name, commas and all."""
    if values is None:
        return None
    return [v.split(",") if isinstance(v, str) and "," in v and v not in known else v for v in values]


def run(args):
    engine = a.engine(args)
    known = engine.qmodel.names()
    curves = plot_acc_error(args.save_dir, model_or_file=engine, quantize_node=nested(args.quantize_node, known),
                            non_quantize_node=nested(args.non_quantize_node, known), metric=args.metric,
                            average_mode=args.average, data_num=args.data_num, local=not args.no_local,
                            progress=not args.quiet)
    # the model's outputs, not the last operator run (a side branch, as often as not)
    ends = [k for k in range(len(curves.nodes)) if set(curves.read(k)) & set(engine.model_outputs)] or \
        [len(curves.nodes) - 1]
    # a node whose pairs write several outputs has one point, the worst of them: named so
    named = {k: " / ".join(curves.read(k)) + (" (the worst)" if len(curves.read(k)) > 1 else "") for k in ends}
    several = sum(len(curves.read(k)) for k in ends) > 1

    def shown(node, v):  # a NaN where an op turns a value rounded to 0 into Inf (a Log): said, not bare
        cause = pole_cause(engine.qmodel, node) if v != v else ""
        return f"{node} ({v:.6g}{': ' + cause if cause else ''})"

    def value(v):
        return NO_VALUES if v is None else f"{v:.6g}"

    for label in curves.values:
        worst = ", ".join(shown(n, v) for n, v in curves.worst(label))
        at = ", ".join(f"{named[k]} {value(curves.values[label][k])}" for k in ends)
        print(f"{label}: {curves.metric} at the output{'s' if several else ''} {at}"
              + (f"; worst at {worst}" if worst else ""))
    for note in curves.notes():
        print(f"note: {note}")
    for t, why in unplotted_outputs(engine, curves).items():
        print(f"note: the curves have no point for output {t!r}: {why}")
    print(f"wrote {curves.png}")
    if args.json:
        print(f"wrote {curves.save(args.json)}")
    a.warn_of_blind_outputs(args, engine)
    a.warn_if_simulated_otherwise(args, engine)


class _NotAnOption(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("-n is not an option of plot-acc-error: -q NODE quantizes only NODE, -nq NODE everything but "
                     "NODE")


def configure(p):
    a.add_model(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quantize-node", nargs="+", action=a.SeedGroups, default=None, metavar="NODE",
                   help="one config per entry with only it quantized: 'weight', 'activation', a node, "
                        "or 'a,b' for a group (also the seed's \"[['a'], ['a', 'b']]\" form). Default: everything "
                        "quantized")
    g.add_argument("-nq", "--non-quantize-node", nargs="+", action=a.SeedGroups, default=None, metavar="NODE",
                   help="one config per entry with everything but it quantized (the same forms)")
    # argparse matches a prefix of a one-dash option whatever allow_abbrev says: -n (the node
    # option of plot-distribution) read as -nq, the opposite configuration, in silence
    p.add_argument("-n", nargs="*", action=_NotAnOption, help=argparse.SUPPRESS)
    a.add_metric(p, "the metric of the curves")
    p.add_argument("--average", action="store_true", help="plot the running mean of each curve")
    p.add_argument("--no-local", action="store_true", help="skip the local error markers")
    a.add_save_dir(p)
    a.add_json(p)


COMMANDS = [a.Command("plot-acc-error", "plot cumulative error curves node by node under quantization configs",
                      configure, run)]

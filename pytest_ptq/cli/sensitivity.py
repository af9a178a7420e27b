"""``get-sensitivity-of-nodes`` and ``group-sensitivity``: rankings, with their confidence."""

from __future__ import annotations

from .. import params
from ..cache import through
from ..confidence import confidence_rows, ranking_confidence
from ..errors import PTQError
from ..groups import Subgraph, group_sensitivity
from ..sensitivity import get_sensitivity_of_nodes
from ..tables import format_table, listed
from . import args as a


def print_confidence(conf, limit=None):
    """Print a :class:`~pytest_ptq.confidence.Confidence`: the spread of each node over
    samples and whether the top k holds."""
    rows = confidence_rows(conf)
    columns = list(rows[0]) if rows else ["node"]
    print(f"ranking confidence ({conf.metric} per sample, {conf.samples} sample(s), {conf.resamples} resamples):")
    print(format_table(rows, columns, limit))
    print(conf.message)


def _finish(args, result, table):
    # files first, then the text: a reader of the output that goes away (| head) cost the files
    conf = ranking_confidence(result, k=args.confidence) if args.confidence else None  # annotates result.details
    written = result.save(args.json) if args.json else None
    print(table)
    if conf is not None:
        print_confidence(conf, args.top)
    if written is not None:
        print(f"wrote {written}")


def run_sensitivity(args):
    engine, cache = a.engine_and_cache(args)
    request = ("sensitivity", tuple(args.metrics), _tuple(args.output_node), args.node_type, args.data_num,
               _tuple(args.interested_nodes))
    result = through(cache, request, lambda: get_sensitivity_of_nodes(
        engine, args.metrics, output_node=args.output_node, node_type=args.node_type, data_num=args.data_num,
        interested_nodes=args.interested_nodes, progress=not args.quiet))
    _finish(args, result, result.table(limit=args.top))
    if not result:  # an empty table alone read as a failure to rank
        counts = ", ".join(f"{len(engine.qmodel.of_kind(k))} {k}" for k in ("weight", "activation", "dynamic"))
        print(f"no {params.nodes_of_type(args.node_type)} to rank in this model ({counts} calibration nodes); "
              "try another -t")
    a.warn_of_blind_outputs(args, engine, cache)
    a.warn_if_simulated_otherwise(args, engine, cache)


def _tuple(values):
    return None if values is None else tuple(values)


def configure_sensitivity(p):
    a.add_model(p)
    a.add_metrics(p)
    p.add_argument("-t", "--node-type", default="node", choices=params.NODE_TYPES,
                   help="which nodes to rank. Default: node")
    a.add_output_node(p)
    p.add_argument("-i", "--interested-nodes", nargs="+", action=a.Listed, default=None, metavar="NODE",
                   help="rank only these nodes. Default: all of the node type")
    a.add_top(p)
    a.add_json(p)
    a.add_confidence(p)
    a.add_cache_dir(p)


def groups_of(args):
    """The groups of ``-g`` and ``--from/--to``, checked before any model is loaded."""
    groups = []
    for entry in args.group or []:
        members = [m.strip() for m in entry.split(",")]
        if not all(members):
            raise PTQError(f"group {entry!r} has an empty node name; separate node names with single commas")
        if members in groups:  # the API's labels by dict have no spelling here
            raise PTQError(f"group {entry!r} is given twice; give each group once")
        groups.append(members)
    starts, ends = args.start or [], args.end or []
    if len(starts) != len(ends):
        raise PTQError(f"--from and --to come in pairs, got {len(starts)} --from and {len(ends)} --to")
    if args.no_weights and not starts:  # it would be ignored: -g groups name their nodes themselves
        raise PTQError("--no-weights leaves the weights out of --from/--to blocks; give a block, or drop it "
                       "(a -g group holds the nodes it names)")
    groups += [Subgraph(s, e, not args.no_weights) for s, e in zip(starts, ends)]
    if not groups:
        raise PTQError("no group given; pass -g NODE[,NODE...] (one group per entry) or --from TENSOR --to TENSOR")
    return groups


def run_groups(args):
    groups = groups_of(args)
    engine = a.engine(args)
    result = group_sensitivity(engine, groups, metrics=args.metrics, output_node=args.output_node,
                               data_num=args.data_num, progress=not args.quiet)
    # a block of a transformer holds dozens of pairs: the first few named, all of them in --json
    rows = [{"group": label, **values, "size": result.details[label]["size"],
             "calibration nodes": listed(result.details[label]["calibration_nodes"])} for label, values in result.items()]
    _finish(args, result, format_table(rows, ["group", *result.metrics, "size", "calibration nodes"], args.top))
    a.warn_of_blind_outputs(args, engine)


def configure_groups(p):
    a.add_model(p)
    p.add_argument("-g", "--group", nargs="+", action="extend", default=None, metavar="NODE[,NODE...]",
                   help="one group per entry: calibration or normal nodes joined by commas, quantized together")
    p.add_argument("--from", dest="start", action="append", default=None, metavar="TENSOR",
                   help="a block's input tensor: the group is every calibration node between it and --to "
                        "(repeat --from/--to for several blocks)")
    p.add_argument("--to", dest="end", action="append", default=None, metavar="TENSOR",
                   help="a block's output tensor (the pair quantizing it belongs to the next block)")
    p.add_argument("--no-weights", action="store_true",
                   help="--from/--to blocks without the weights their nodes read")
    a.add_metrics(p)
    a.add_output_node(p)
    a.add_confidence(p)
    a.add_top(p)
    a.add_json(p)


COMMANDS = [
    a.Command("get-sensitivity-of-nodes", "rank nodes by the output error when only they are quantized",
              configure_sensitivity, run_sensitivity),
    a.Command("group-sensitivity", "rank blocks of nodes by the output error when only the block is quantized: "
              "nodes given together, or the subgraph between two tensors", configure_groups, run_groups),
]

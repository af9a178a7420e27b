"""``plot-distribution`` and ``get-channelwise-data-distribution``."""

from __future__ import annotations

import re

from ..channelwise import OUTLIER_K
from ..distribution import HIST_BINS, get_channelwise_data_distribution, plot_distribution
from ..results import write_json
from ..tables import format_table
from . import args as a


def node_names(values, known):
    """CLI node lists: ``-n a b``, ``-n a,b``, or the seed's ``-n "['a','b']"`` (read by
    :class:`.args.SeedList`); a value in ``known`` (the model's node names) is taken whole
    (exporters' names hold spaces, commas, brackets and quotes)."""
    out = []
    for v in values or []:
        if v in known:
            out.append(v)
            continue
        for part in re.split(r"[,\s]+", v.strip().strip("[]")):
            part = part.strip().strip("'\"")
            if part:
                out.append(part)
    return out


def _written(args, result, json_result=None, before=None):
    """Write the --json file, then print ``before`` (a table) and what was written: a reader
    of the output that goes away (| head) cost the file."""
    written = write_json(result if json_result is None else json_result, args.json) if args.json else None
    if before is not None:
        print(before)
    for d in result.values():
        print(f"wrote {d['png']}")
    if written is not None:
        print(f"wrote {written}")


def run_distribution(args):
    engine = a.engine(args)
    dist = plot_distribution(args.save_dir, engine, nodes_list=node_names(args.nodes, engine.qmodel.names()),
                             data_num=args.data_num, bins=args.bins, progress=not args.quiet)
    # the share that matters: values below the range that the Relu after the node zeroes anyway
    # are no loss, as the figure and runall say
    drawn = {k: d for k, d in dist.items() if "skipped" not in d}
    rows = [{"node": k, "kind": d["kind"], "tensor": d["tensor"], "max_abs": d["max_abs"],
             "threshold": d.get("threshold", ""),
             "clipped %": 100 * d.get("effective_clipped_share", d["clipped_share"])
             if d.get("clipped_share") is not None else "", "bit": d.get("bit", ""),
             "cosine": d.get("cosine-similarity", "")} for k, d in drawn.items()]
    lines = [format_table(rows, ["node", "kind", "tensor", "max_abs", "threshold", "clipped %", "bit", "cosine"])]
    lines += [f"skipped {k}: {d['skipped']}" for k, d in dist.items() if k not in drawn]
    _written(args, drawn, dist, before="\n".join(lines))


def configure_distribution(p):
    a.add_model(p)
    p.add_argument("-n", "--nodes", nargs="+", action=a.SeedList, required=True, metavar="NODE",
                   help="calibration or normal nodes to plot (also the seed's \"['a','b']\" form)")
    a.add_save_dir(p)
    p.add_argument("--bins", type=a.bins, default=HIST_BINS, help=f"histogram bins. Default: {HIST_BINS}")
    a.add_json(p)


def run_channelwise(args):
    engine = a.engine(args)
    nodes = node_names(args.nodes, engine.qmodel.names())
    boxes = get_channelwise_data_distribution(args.save_dir, engine, nodes_list=nodes,
                                              axis=args.axis, data_num=args.data_num, outlier_k=args.outlier_k,
                                              progress=not args.quiet)
    drawn = {k: d for k, d in boxes.items() if "skipped" not in d}
    rows = [{"node": k, "tensor": d["tensor"], "axis": d["axis"], "channels": d["channels"],
             "outlier channels": ",".join(map(str, d["outlier_channels"][:10])) or "-"}
            for k, d in drawn.items()]
    lines = [format_table(rows, ["node", "tensor", "axis", "channels", "outlier channels"])] if rows else []
    lines += [f"skipped {k}: {d['skipped']}" for k, d in boxes.items() if k not in drawn]
    _written(args, drawn, boxes, before="\n".join(lines) if lines else None)


def configure_channelwise(p):
    a.add_model(p)
    p.add_argument("-n", "--nodes", nargs="+", action=a.SeedList, required=True, metavar="NODE",
                   help="calibration nodes (also the seed's \"['a','b']\" form)")
    p.add_argument("--axis", type=a.axis, default=None,
                   help="channel axis of the input. Default: inferred (1 for NCHW, last for [B, T, C])")
    p.add_argument("--outlier-k", type=a.positive, default=OUTLIER_K,
                   help=f"a channel is an outlier when its max|x| exceeds K x the median channel's. "
                        f"Default: {OUTLIER_K:g}")
    a.add_save_dir(p)
    a.add_json(p)


COMMANDS = [
    a.Command("plot-distribution", "histogram a node's data: activation input vs its calibration range, float vs "
              "dequantized weight, or float vs quantized output", configure_distribution, run_distribution),
    a.Command("get-channelwise-data-distribution", "box plot per channel of a calibration node's input; names "
              "outlier channels", configure_channelwise, run_channelwise),
]

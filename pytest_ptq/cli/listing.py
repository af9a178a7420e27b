"""``list-nodes``: what the tool sees in a model."""

from __future__ import annotations

from ..model import QuantModel
from ..results import write_json
from ..tables import format_table
from . import args as a


def run(args):
    qm = QuantModel(args.model, float_model=args.float_model)
    print(f"{qm.source}: {qm.format_label} model, made by {qm.made_by.label} ({qm.made_by.evidence})")
    rows, reduced = [], 0
    for c in qm.calibration.values():
        # and the operators it counts for in the rankings: a requantize chain's earlier pair
        # is read by the next pair's QuantizeLinear only, and counts for the chain's readers
        row = {**c.summary(), "consumers": list(dict.fromkeys([*c.consumers, *qm.counts_for(c.name)]))}
        # a pair on a model output that no operator reads counts for the operator computing it
        row["owner"] = qm.owner(c.name)
        if qm.reduced_range(c) is not None:  # the codes it uses, and the range they reach: half the grid's
            reduced += 1
            row["dtype"], row["threshold"], _, _ = qm.shown_grid(c)
        rows.append(row)
    print(format_table([{**r, "consumers": _few(r["consumers"]) or _owned(r["owner"])} for r in rows],
                       ["name", "kind", "dtype", "threshold", "granularity", "consumers"]))
    for note in qm.notes:
        print(f"note: {note}")
    if reduced:
        print(f"note: {reduced} weight(s) keep to half their 8-bit grid, as onnxruntime's reduce_range quantizes "
              "them: 7 bits each")
    dynamic = len(qm.of_kind("dynamic"))
    of_which = f" ({dynamic} of them dynamic: ranges computed per run)" if dynamic else ""
    print(f"{len(qm.of_kind('weight'))} weight and {len(qm.of_kind('activation'))} activation calibration "
          f"nodes{of_which}, {len(qm.normal)} normal nodes")
    if args.json:  # what the table shows, for scripts (its cells are cut to fit)
        listing = {"model": qm.source, "format": qm.format_label, "made_by": qm.made_by.label,
                   "calibration_nodes": rows, "normal_nodes": list(qm.normal), "notes": list(qm.notes)}
        print(f"wrote {write_json(listing, args.json)}")


def _owned(owner):
    """The consumers cell of a pair on a model output: the operator it counts for, whose
    output it is (the rankings count it there), else empty."""
    return f"output of {owner}" if owner else ""


def _few(names, shown=2):
    """The first ``shown`` names and how many more: a constant shared by every block of a
    transformer (its attention scale, 24 Muls in a ViT-S) made one cell 600 characters wide."""
    names = list(names)
    more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
    return ",".join(names[:shown]) + more


def configure(p):
    a.add_model(p, data=False)
    a.add_json(p)


COMMANDS = [a.Command("list-nodes", "list calibration nodes (weight/activation) and count normal nodes (--json lists them)",
                      configure, run)]

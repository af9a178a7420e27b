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
        # the file's readers, and the operators whose ranking rows hold it, which differ: a
        # requantize chain's earlier pair is read by the next pair's QuantizeLinear only, a
        # pair read through Casts between float types counts for the operator after them, a
        # pair on a model output for the operator computing it (its owner); named as in the
        # file: a moved pair's input is a tensor of the tool's copy
        row = {**c.summary(), "input": qm.shown_name(c.input), "axis": qm.file_axis(c), "consumers": [n for n in c.consumers if n in qm.normal],
               "counts_for": [n for n in qm.credited(c.name) if n in qm.normal], "owner": qm.owner(c.name)}
        if qm.reduced_range(c) is not None:  # the codes it uses, and the range they reach: half the grid's
            reduced += 1
            row["dtype"], row["threshold"], _, _ = qm.shown_grid(c)
        rows.append(row)
    print(format_table([{**r, "consumers": _few(r["consumers"]), "counts for": _few(r["counts_for"])} for r in rows],
                       ["name", "kind", "dtype", "threshold", "granularity", "consumers", "counts for"]))
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

"""``list-nodes``: what the tool sees in a model."""

from __future__ import annotations

from ..model import QuantModel
from ..tables import format_table
from . import args as a


def run(args):
    qm = QuantModel(args.model, float_model=args.float_model)
    print(f"{qm.source}: {qm.format_label} model, made by {qm.made_by.label} ({qm.made_by.evidence})")
    rows = [c.summary() for c in qm.calibration.values()]
    print(format_table(rows, ["name", "kind", "dtype", "threshold", "granularity", "consumers"]))
    for note in qm.notes:
        print(f"note: {note}")
    dynamic = len(qm.of_kind("dynamic"))
    of_which = f" ({dynamic} of them dynamic: ranges computed per run)" if dynamic else ""
    print(f"{len(qm.of_kind('weight'))} weight and {len(qm.of_kind('activation'))} activation calibration "
          f"nodes{of_which}, {len(qm.normal)} normal nodes")


def configure(p):
    a.add_model(p, data=False)


COMMANDS = [a.Command("list-nodes", "list calibration nodes (weight/activation) and normal nodes", configure, run)]

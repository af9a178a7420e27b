"""Where a remedy is chosen and where it is judged.

The search scores many sets and so adapts to its samples; a set is accepted only on samples
it never saw. With held-out data those are the judge. Without, the calibration samples are
split: the samples beyond ``data_num`` when there are any, else every third one, confirm
what the others chose. The split is by position, so it is the same on every run.
"""

from __future__ import annotations

import dataclasses

from ..data import CalibrationData, load_data
from .biases import with_biases


@dataclasses.dataclass
class Part:
    """Samples that sets are scored on: ``engine.data`` holds them, ``indices`` picks them.

    ``name``: ``calibration``, ``search``, ``confirmation`` or ``held-out``; ``where``: the
    samples in words for messages.
    """

    name: str
    engine: object
    indices: list
    where: str

    def __len__(self):
        return len(self.indices)

    def data(self):
        """The samples as the accuracy check's ``data`` (``len``, ``sample(i)``, iteration)."""
        return self.engine.data.subset(self.indices)


@dataclasses.dataclass
class Layout:
    """The parts of one search: ``search`` (chosen on), ``judge`` (accepted on; the search
    part itself when nothing is left to confirm on) and ``calibration`` (every calibration
    sample either part used, for the figures)."""

    search: Part
    judge: Part
    calibration: Part
    note: str | None = None

    @property
    def confirms(self):
        """True when the judge holds samples the search did not see."""
        return self.judge is not self.search


def _span(indices):
    if not indices:
        return "none"
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])
    shown = ", ".join(str(i) for i in indices[:6])
    return shown + (", ..." if len(indices) > 6 else "")


# how each face takes held-out data: this note is shown by all of them (the CLI's suggest, the
# API's, and ptq.suggest in a test, where --heldout is no option)
_HELDOUT = "heldout=, --heldout, or under pytest --ptq-heldout"


def layout(engine, indices, heldout=None):
    """The :class:`Layout` for calibration samples ``indices`` of ``engine`` (the first
    ``data_num``) and optional held-out data (a path, a mapping or a CalibrationData)."""
    if heldout is not None:
        search = Part("calibration", engine, list(indices), f"{len(indices)} calibration sample(s)")
        data = load_data(heldout, engine.qmodel, role="held-out", calibration=engine.data)
        where = data.where if isinstance(data, CalibrationData) else "held-out data"
        judge = Part("held-out", heldout_engine(engine, data), list(range(len(data))),
                     f"{len(data)} held-out sample(s) of {where}")
        return Layout(search, judge, search)
    total = len(engine.data)
    used = set(indices)
    rest = [i for i in range(total) if i not in used]
    if rest:
        search, confirm = list(indices), rest
        how = (f"no held-out data: chose on calibration samples {_span(search)} (data_num) and confirmed on the "
               f"other {len(rest)}")
    elif len(indices) >= 2:
        confirm = [i for k, i in enumerate(indices) if k % 3 == 2] or [indices[-1]]
        search = [i for i in indices if i not in set(confirm)]
        how = (f"no held-out data: chose on {len(search)} calibration sample(s) and confirmed on the other "
               f"{len(confirm)} (every third: {_span(confirm)})")
    else:
        part = Part("calibration", engine, list(indices), f"{len(indices)} calibration sample(s)")
        return Layout(part, part, part, note="no held-out data and a single calibration sample: nothing is left to "
                                             "confirm on, so the set is judged on the sample it was chosen on; "
                                             f"pass held-out data ({_HELDOUT})")
    how += f"; pass held-out data ({_HELDOUT}) to judge on the data the model will meet"
    both = sorted(set(search) | set(confirm))
    return Layout(Part("search", engine, search, f"{len(search)} calibration sample(s)"),
                  Part("confirmation", engine, confirm, f"{len(confirm)} other calibration sample(s)"),
                  Part("calibration", engine, both, f"{len(both)} calibration sample(s)"), note=how)


def heldout_engine(engine, data, alternatives=None):
    """An engine on the same compiled model whose samples are ``data``: runs by index keep
    the float reference of each held-out sample cached, as for calibration samples."""
    return engine.on_data(data, alternatives)


def with_alternatives(layout_, alternatives):
    """The same layout with every engine able to run ``alternatives`` ({node: QParams})."""
    if not alternatives:
        return layout_
    alternatives = with_biases(layout_.search.engine, alternatives)
    cal = layout_.search.engine.with_alternatives(alternatives)

    def moved(part, engine):
        return Part(part.name, engine, part.indices, part.where)

    search = moved(layout_.search, cal)
    if layout_.judge is layout_.search:
        return Layout(search, search, search, layout_.note)
    if layout_.judge.engine is layout_.search.engine:
        judge = moved(layout_.judge, cal)
    else:
        judge = moved(layout_.judge, heldout_engine(layout_.judge.engine, layout_.judge.engine.data, alternatives))
    calibration = search if layout_.calibration is layout_.search else moved(layout_.calibration, cal)
    return Layout(search, judge, calibration, layout_.note)

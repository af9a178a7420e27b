"""Result objects as plain JSON: what every analysis returns and saves."""

from __future__ import annotations

import dataclasses
import json
import math
import os

from . import guard


def plain(obj):
    """numpy scalars as Python numbers and tuples as lists, infinities kept: results that
    analyses still compute with (an infinite SQNR is a number, not a string)."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, (str, bytes)):
        return plain(obj.item())
    return obj


def json_safe(obj):
    """:func:`plain`, with infinities and NaN as strings (JSON has none; browsers reject
    Python's ``Infinity``)."""
    obj = plain(obj)
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    return obj


def json_restore(obj):
    """The inverse of :func:`json_safe` for the special floats."""
    if isinstance(obj, str) and obj in ("inf", "-inf", "nan"):
        return float(obj)
    if isinstance(obj, dict):
        return {k: json_restore(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_restore(v) for v in obj]
    return obj


def write_json(data, path, sort_keys=False):
    """Write ``data`` (made JSON-safe), keys in their order unless ``sort_keys``; returns the path.
    Never onto a protected input; a failed write is one sentence (see :mod:`.guard`). ``path``
    may be an open text stream instead (the command line's ``--json -``): returns its name."""
    text = json.dumps(json_safe(data), indent=1, sort_keys=sort_keys)
    if hasattr(path, "write"):
        path.write(text + "\n")
        return getattr(path, "name", "standard output")
    path = guard.output_path(path, "output file")
    # atomic where it can be (a reader, or a second writer, never sees half a file); a device
    # or a named pipe is written in place
    return guard.write_text(path, text, atomic=path.is_file() or not os.path.lexists(path))


def read_from(result, inputs):
    """Note on ``result`` what it was computed from (:class:`~pytest_ptq.guard.Inputs`), so that
    saving it never overwrites those files; returns ``result``."""
    result._ptq_inputs = inputs  # not a field: to_dict() and the saved JSON do not carry it
    return result


def inputs_of(result):
    """What ``result`` was computed from (see :func:`read_from`), or None."""
    return getattr(result, "_ptq_inputs", None)


def save_result(result, data, path, sort_keys=False):
    """:func:`write_json` of a result's ``data``, never onto what it was computed from
    (:func:`read_from`, and its ``model``, ``data``, ``heldout`` and ``float_model`` paths)."""
    inputs = (guard.Inputs().add(getattr(result, "model", None), guard.MODEL_FILE)
              .add(getattr(result, "data", None), "calibration data")
              .add(getattr(result, "heldout", None), "held-out data")
              .add(getattr(result, "float_model", None), guard.FLOAT_MODEL)) | inputs_of(result)
    with guard.protecting(inputs):
        return write_json(data, path, sort_keys=sort_keys)


class JsonResult:
    """Mixin for dataclass results: ``to_dict()`` is JSON-safe, ``save(path)`` writes it."""

    def to_dict(self):
        return json_safe(dataclasses.asdict(self))

    def save(self, path):
        """Write the result as JSON; returns the path."""
        return save_result(self, self.to_dict(), path)

"""Result objects as plain JSON: what every analysis returns and saves."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path


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
    """Write ``data`` (made JSON-safe), keys in their order unless ``sort_keys``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(data), indent=1, sort_keys=sort_keys))
    return path


class JsonResult:
    """Mixin for dataclass results: ``to_dict()`` is JSON-safe, ``save(path)`` writes it."""

    def to_dict(self):
        return json_safe(dataclasses.asdict(self))

    def save(self, path):
        """Write the result as JSON; returns the path."""
        return write_json(self.to_dict(), path)

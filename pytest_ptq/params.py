"""One validator per parameter, shared by every face: the API, the CLI, ini keys and
markers, and YAML contracts.

Each takes the raw value (a Python value, or the text of a command line or ini file) and
returns the clean one, or raises a :class:`~pytest_ptq.errors.PTQError` saying what is
wrong with it; the faces only add where the value came from. This module imports no
onnx or onnxruntime, so pytest start-up stays cheap.
"""

from __future__ import annotations

import math
import numbers

from .errors import PTQError, unknown

NODE_TYPES = ("node", "weight", "activation")


def _fail(what, text):
    """The error for a bad value; with no ``what`` (argparse names the option) the sentence
    starts with the verb."""
    return PTQError(f"{what} {text}".strip())


def _text(value):
    return value.strip() if isinstance(value, str) else value


def whole(value, what, minimum=None):
    """An integer (``3``, ``"3"``, ``3.0``); bools, fractions and text are refused."""
    raw = _text(value)
    if isinstance(raw, bool):
        raise _fail(what, f"must be a whole number, got {value!r}")
    if isinstance(raw, str):
        try:
            raw = int(raw)
        except ValueError:
            raise _fail(what, f"must be a whole number, got {value!r}") from None
    if isinstance(raw, numbers.Integral) or isinstance(raw, numbers.Real) and math.isfinite(raw) and float(raw).is_integer():
        number = int(raw)
    else:
        raise _fail(what, f"must be a whole number, got {value!r}")
    if minimum is not None and number < minimum:
        raise _fail(what, f"must be at least {minimum}, got {number}")
    return number


def positive_int(value, what="a count"):
    """A whole number >= 1."""
    return whole(value, what, minimum=1)


def data_num(value, what="data_num"):
    """How many samples to use: None (all) or a whole number >= 1."""
    if value is None:
        return None
    return positive_int(value, what)


def number(value, what):
    """A finite real number (``0.99``, ``"0.99"``); bools and NaN are refused."""
    raw = _text(value)
    if isinstance(raw, bool):
        raise _fail(what, f"must be a number, got {value!r}")
    try:
        result = float(raw)
    except (TypeError, ValueError):
        raise _fail(what, f"must be a number, got {value!r}") from None
    if math.isnan(result):
        raise _fail(what, "must be a number, got NaN")
    return result


def cosine(value, what="a cosine threshold"):
    """A cosine similarity in [-1, 1]."""
    result = number(value, what)
    if not -1.0 <= result <= 1.0:
        raise _fail(what, f"must lie in [-1, 1], got {value}")
    return result


def non_negative(value, what="a tolerance"):
    """A number >= 0."""
    result = number(value, what)
    if result < 0:
        raise _fail(what, f"must be >= 0, got {value}")
    return result


def seconds(value, what="a time budget"):
    """A positive number of seconds."""
    result = number(value, what)
    if result <= 0:
        raise _fail(what, f"must be a positive number of seconds, got {value}")
    return result


def node_type(value, what="node_type"):
    """One of :data:`NODE_TYPES`."""
    if value not in NODE_TYPES:
        err = unknown(what, value, NODE_TYPES)
        raise PTQError(f"{err} (one of {', '.join(NODE_TYPES)})")
    return value


def metric(value):
    """The canonical name of one metric (aliases such as ``cos`` accepted)."""
    from .metrics import get_metrics

    if not isinstance(value, str):
        raise PTQError(f"a metric must be a name such as 'cosine-similarity', got {value!r}")
    return get_metrics(value)[0].name


def metrics(values):
    """Canonical metric names for a name or a list of names (None: cosine similarity)."""
    if values is None:
        return ["cosine-similarity"]
    if isinstance(values, str):
        values = [values]
    names = [metric(v) for v in values]
    if not names:
        raise PTQError("no metric given; name at least one, such as 'cosine-similarity'")
    return names


SEVERITIES = ("error", "warning", "info")  # most severe first


def severity(value, what="max_severity"):
    """One of :data:`SEVERITIES`."""
    if value not in SEVERITIES:
        raise _fail(what, f"must be one of {', '.join(SEVERITIES)}, got {value!r}")
    return value

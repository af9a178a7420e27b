"""One validator per parameter, shared by every face: the API, the CLI, ini keys and
markers, and YAML contracts.

Each takes the raw value (a Python value, or the text of a command line or ini file) and
returns the clean one, or raises a :class:`~pytest_ptq.errors.PTQError` saying what is
wrong with it; the faces only add where the value came from. A number is read from text
only where every value is text: a command line or an ini file, whose parsers name the
option or key themselves and so pass an empty ``what``. Elsewhere (a YAML contract's quoted
'0.99', an API's ``"0.9"``) text is a mistake and refused, as a value of any other type is. This module imports no
onnx or onnxruntime, so pytest start-up stays cheap.
"""

from __future__ import annotations

import errno
import inspect
import math
import numbers
import os
from pathlib import Path

import numpy as np

from .errors import PTQError, shown, unknown

NODE_TYPES = ("node", "weight", "activation")
# what the quantized model must keep where no threshold is given: its output cosine with the
# float model, and its task score as a share of the float model's
DEFAULT_MIN_COSINE = 0.99
DEFAULT_MIN_RATIO = 0.99

# One setting, two spellings: the CLI and the API say "heldout", the plugin's options, marker,
# contracts and ptq.* checks "holdout"; each face that takes a name here takes both (the
# advice a face prints names one spelling, which a user then gave to another face)
ALIASES = {"heldout": "holdout"}


def unaliased(given, where):
    """``given`` (keyword arguments, a contract's keys) with each alias of :data:`ALIASES`
    under the name it stands for; both spellings at once are refused in a sentence that names
    ``where``."""
    out = dict(given)
    for alias, name in ALIASES.items():
        if alias in out:
            if name in out:
                raise PTQError(f"{where} gives both {name!r} and {alias!r}, two spellings of one setting; keep one")
            out[name] = out.pop(alias)
    return out


# how a sentence names each node type: 'node' ranks the operators ("node nodes" read as a typo)
KIND_WORDS = {"weight": "weight", "activation": "activation", "node": "operator"}


def nodes_of_type(node_type):
    """"operator nodes", "weight nodes" or "activation nodes" (see :data:`KIND_WORDS`)."""
    return f"{KIND_WORDS[node_type]} nodes"


def _fail(what, text):
    """The error for a bad value; with no ``what`` (argparse names the option) the sentence
    starts with the verb."""
    return PTQError(f"{what} {text}".strip())


def _fail_value(what, must, value):
    return _fail(what, f"must be {must}, got {shown(value)}")


def _text(value):
    return value.strip() if isinstance(value, str) else value


def _refuse_text(value, what, must, integer=False):
    """Refuse a number written as text where values have types (``what`` given, see the
    module doc): YAML read '3' quoted as a string, which a check then compared as text.
    ``integer``: a whole number is asked, so text of another number is left to the validator's
    own sentence (without its quotes it would be refused all the same)."""
    if not isinstance(value, str) or not what:
        return
    try:
        number = float(value)
    except ValueError:
        return  # no number at all: the validator's own sentence says what to give
    if integer and not (math.isfinite(number) and number.is_integer()):
        return
    raise _fail(what, f"must be {must}, got the text {shown(value)}; write the number without quotes")


def whole(value, what, minimum=None):
    """An integer (``3``, ``3.0``; ``"3"`` from a command line); bools and fractions are refused."""
    _refuse_text(value, what, "a whole number", integer=True)
    raw = _text(value)
    if isinstance(raw, bool):
        raise _fail(what, f"must be a whole number, got {shown(value)}")
    if isinstance(raw, str):
        try:
            raw = int(raw)
        except ValueError:
            raise _fail(what, f"must be a whole number, got {shown(value)}") from None
    if isinstance(raw, numbers.Integral) or isinstance(raw, numbers.Real) and math.isfinite(raw) and float(raw).is_integer():
        number = int(raw)
    else:
        raise _fail(what, f"must be a whole number, got {shown(value)}")
    if minimum is not None and number < minimum:
        raise _fail(what, f"must be at least {minimum}, got {number}")
    return number


def positive_int(value, what="a count"):
    """A whole number >= 1."""
    return whole(value, what, minimum=1)


MAX_BINS = 4096  # a histogram's bars: more than a plot shows (and a bar per value of 1e8 never ends)


def bins(value, what="bins"):
    """Histogram bars: a whole number from 1 to :data:`MAX_BINS`."""
    number = positive_int(value, what)
    if number > MAX_BINS:
        raise _fail(what, f"must be at most {MAX_BINS} (a plot shows no more bars), got {number}")
    return number


def data_num(value, what="data_num"):
    """How many samples to use: None (all) or a whole number >= 1."""
    if value is None:
        return None
    return positive_int(value, what)


def rank_samples(value, what="rank_samples"):
    """How many samples a ranking scores every node on: None (chosen by the time budget),
    "all", or a whole number >= 1. Returns None, "all" or an int."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None if value is None else "all"
    _refuse_text(value, what, "a whole number >= 1 or 'all'", integer=True)
    try:
        return positive_int(value, what)
    except PTQError:
        raise _fail(what, f"must be a whole number >= 1 or 'all', got {_text(value)}") from None


MEMORY_MODES = ("auto", "low", "fast")
# the help of the memory and workers settings, the same in the plugin and the CLI
MEMORY_HELP = ("how the engine holds the model's weights: low (mapped from the file, shared by every session and "
               "handed back after each run: for models near the machine's memory), fast (a prepacked copy per "
               "session), auto (low for 64 MiB of weights or more, or mostly matrix-product weights); results agree to "
               "float rounding")
WORKERS_HELP = ("configurations the engine runs at once: auto (one per core, at most 8, fewer where their tensors "
                "would not fit, one in low-memory mode; under pytest-xdist the worker's share of the cores) or N")


def memory_mode(value, what="memory"):
    """How an engine holds weights: one of :data:`MEMORY_MODES` ("low": sessions share the
    mapped weights and hand their pages back; "fast": a copy per session, prepacked; "auto":
    chosen by the model's weights)."""
    raw = _text(value)
    if raw not in MEMORY_MODES:
        raise _fail(what, f"must be one of {', '.join(MEMORY_MODES)}, got {shown(value)}")
    return raw


def auto_count(value, what):
    """"auto" or a whole number >= 1 (``2``, ``"2"``). Returns "auto" or an int."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    _refuse_text(value, what, "'auto' or a whole number >= 1", integer=True)
    try:
        return positive_int(value, what)
    except PTQError:
        raise _fail(what, f"must be 'auto' or a whole number >= 1, got {shown(value)}") from None


def flag(value, what):
    """True or False (numpy's too); text such as "no" is refused rather than read as true."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise _fail(what, f"must be True or False, got {shown(value)}")


def providers(value, what="providers"):
    """None, or onnxruntime execution providers as a list of names: one name or a list of them
    (a string is one provider, not its letters)."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(p, str) and p for p in items):
        raise _fail(what, f"must be an execution provider's name such as 'CPUExecutionProvider' or a list of them, "
                    f"got {shown(value)}")
    return list(items)


def number(value, what):
    """A finite real number (``0.99``; ``"0.99"`` from a command line); bools and NaN are refused."""
    _refuse_text(value, what, "a number")
    raw = _text(value)
    if isinstance(raw, bool):
        raise _fail(what, f"must be a number, got {shown(value)}")
    try:
        result = float(raw)
    except (TypeError, ValueError):
        raise _fail(what, f"must be a number, got {shown(value)}") from None
    if not math.isfinite(result):
        raise _fail(what, f"must be a finite number, got {result}")
    return result


def cosine(value, what="a cosine threshold"):
    """A cosine similarity in [-1, 1]."""
    result = number(value, what)
    if not -1.0 <= result <= 1.0:
        raise _fail(what, f"must lie in [-1, 1], got {result:g}")
    return result


def non_negative(value, what="a tolerance"):
    """A number >= 0."""
    result = number(value, what)
    if result < 0:
        raise _fail(what, f"must be >= 0, got {result:g}")
    return result


def seconds(value, what="a time budget"):
    """A positive number of seconds."""
    result = number(value, what)
    if result <= 0:
        raise _fail(what, f"must be a positive number of seconds, got {result:g}")
    return result


def positive(value, what):
    """A number > 0."""
    result = number(value, what)
    if not result > 0:
        raise _fail(what, f"must be > 0, got {result:g}")
    return result


MAX_RATIO = 10.0  # a task score's share of float's: more than 10x is a typo, not a floor
# How many calibration samples the seed asks for: fewer give ranges (and rankings) that miss
# real data, more rarely help
FEW_SAMPLES, MANY_SAMPLES = 20, 100


def ratio(value, what="min_ratio"):
    """A share of the float model's task score such as 0.99: a number in (0, :data:`MAX_RATIO`]."""
    result = number(value, what)
    if not 0 < result <= MAX_RATIO:
        raise _fail(what, f"must be a share of the float model's score in (0, {MAX_RATIO:g}] such as 0.99, "
                          f"got {result:g}")
    return result


def fraction(value, what):
    """A number in (0, 1]."""
    result = number(value, what)
    if not 0 < result <= 1:
        raise _fail(what, f"must lie in (0, 1], got {result:g}")
    return result


def threshold(value, metric_name, what="threshold"):
    """A bound on ``metric_name``: a finite number, in [-1, 1] for a similarity of at most 1
    (cosine, correlation), at least 0 for an error (mse, chebyshev, ...)."""
    from .metrics import get_metrics

    m = get_metrics(metric_name)[0]
    result = number(value, what)
    if not math.isfinite(result):
        raise _fail(what, f"must be a finite number, got {result:g}")
    if m.unit and not -1.0 <= result <= 1.0:
        raise _fail(what, f"must lie in [-1, 1] for {m.name}, got {result:g}")
    if not m.higher_is_better and result < 0:
        raise _fail(what, f"must be >= 0 for {m.name}, an error, got {result:g}")
    return result


def thresholds(spec, clash=None):
    """Normalise a per-output threshold spec to ``{output or slice: value}``; ``""`` is the default
    (the one form of the output checks, contracts and the remedy search's targets).

    ``spec``: a number (every output), a mapping (``""`` or ``"default"`` for the rest: always;
    a model's own tensor named ``default`` is keyed ``default=default``), or None (nothing).
    ``clash``: the model (its file) where it has a tensor or node named ``default``: there the
    bare key could mean either, and is refused.
    """
    if spec is None:
        return {}
    if isinstance(spec, dict):
        out = {}
        for k, v in spec.items():
            if k == "default" and clash is not None:
                raise PTQError(f"the thresholds {shown(spec)} give 'default', which {clash!r} also has a tensor or node "
                               "named: write 'default=default' for its own and '' (on the command line a value "
                               "alone) for the outputs not named")
            key = "" if k in ("", "default", None) else str(k)
            if key in out:  # '' and 'default' both given: one would win in silence
                raise PTQError(f"the thresholds {shown(spec)} give the default twice ('default' and ''); give it "
                               "once")
            out[key] = number(v, f"threshold for {key or 'the default'!r}")
        return out
    return {"": number(spec, "threshold")}


def numbers_list(value, what, positive=False):
    """None, a number, or a list of numbers (per-channel statistics) as a list of floats;
    ``positive``: each above 0 (a standard deviation)."""
    items = _numbers_list(value, what)
    if positive and items is not None and any(not v > 0 for v in items):
        raise _fail(what, f"must be numbers above 0, got {shown(items)}")
    return items


def _numbers_list(value, what):
    if value is None:
        return None
    if isinstance(value, (str, numbers.Real)) and not isinstance(value, bool):
        return [number(value, what)]
    if not isinstance(value, (list, tuple)) and not hasattr(value, "tolist"):
        raise _fail_value(what, "a number or a list of numbers", value)
    items = list(value.tolist() if hasattr(value, "tolist") else value)
    if not items:
        raise _fail(what, "must hold at least one number, got an empty list")
    return [number(v, what) for v in items]


def axis(value, what="axis"):
    """None (inferred) or a whole number, negative counting from the end; the range is
    checked against each tensor's rank where it is used."""
    if value is None:
        return None
    return whole(value, what)


def names(value, what, nested=False):
    """None, a name, or a list of names (node, output or tensor names) as a list of str.

    With ``nested`` an entry may itself be a list of names (the seed's groups ``[["a", "b"]]``).
    """
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple, set, frozenset)) and not _is_sequence(value):
        raise _fail_value(what, "a name or a list of names", value)
    out = []
    for entry in value:
        if isinstance(entry, str):
            out.append(entry)
        elif nested and isinstance(entry, (list, tuple)) and entry and all(isinstance(e, str) for e in entry):
            out.append(list(entry))
        else:
            raise _fail_value(what, "a list of names" + (" or of lists of names" if nested else ""), entry)
    return out


def _is_sequence(value):
    # dict views, generators, numpy arrays of names: iterable, not a mapping, not text
    return hasattr(value, "__iter__") and not isinstance(value, (dict, bytes, str))


def node_types(value, what="node_type"):
    """None, one of :data:`NODE_TYPES`, or a list of them, as a list without repeats."""
    if value is None:
        return None
    types = names(value, what)
    if not types:
        raise _fail(what, f"must name at least one of {', '.join(NODE_TYPES)}, got an empty list")
    return list(dict.fromkeys(node_type(t, what) for t in types))


def libraries(value, what="custom-op library"):
    """onnxruntime custom-op libraries (a path, or a list of them) as a list of str: each an
    existing file (a list is not one path; a missing library is said before any work)."""
    items = [] if value is None else [value] if isinstance(value, (str, bytes, os.PathLike)) else value
    if not isinstance(items, (list, tuple)):
        raise _fail_value(what, "a path or a list of paths", value)
    out = []
    for item in items:
        path = input_path(item, what)
        if not path.is_file():
            raise _fail(what, f"{shown(str(path))} " + ("is a folder" if path.is_dir() else "does not exist")
                        + "; give the path of the library file (.so, .dll or .dylib) the model's custom ops need")
        out.append(str(path))
    return out


def input_path(value, what):
    """A path to read (str or PathLike) as a Path; whether it exists is the loader's to say,
    but a name the system cannot even look up (too long, not searchable) is refused here."""
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise _fail_value(what, "a path", value)
    text = os.fspath(value)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        raise _fail(what, "must be a path, got an empty string")
    if "\0" in text:
        raise _fail(what, f"{shown(text)} holds a NUL character; give a plain path")
    path = Path(os.path.expanduser(text))
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # missing is for the caller to judge (an output, say)
        pass
    except OSError as exc:
        reason = "the name is too long" if exc.errno == errno.ENAMETOOLONG else (exc.strerror or type(exc).__name__)
        raise PTQError(f"{what} {shown(text)} cannot be read ({reason}); check the path") from None
    return path


def data_path(value, what):
    """Calibration or held-out data on disk (see :func:`~pytest_ptq.data.load_data`): an
    existing folder, or an .npz file; anything else is refused before any model is read."""
    path = input_path(value, what)
    if path.is_dir() or path.is_file() and path.suffix == ".npz":
        return path
    wrong = "is neither a folder nor an .npz file" if path.exists() else "does not exist"
    raise _fail(what, f"{shown(str(path), 240)} {wrong}; give a folder with one sub-folder of .npy files per model input "
                      "(or <input>.npy stacks), or an .npz with one key per input")


def node_type(value, what="node_type"):
    """One of :data:`NODE_TYPES`."""
    if not isinstance(value, str) or value not in NODE_TYPES:
        raise unknown(what, value, NODE_TYPES)  # a short menu: it lists them
    return value


def metric(value):
    """The canonical name of one metric (aliases such as ``cos`` accepted)."""
    from .metrics import get_metrics

    if not isinstance(value, str):
        raise PTQError(f"a metric must be a name such as 'cosine-similarity', got {shown(value)}")
    return get_metrics(value)[0].name


def metrics(values):
    """Canonical metric names for a name or a list of names (None: cosine similarity)."""
    if values is None:
        return ["cosine-similarity"]
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)) and not _is_sequence(values):
        raise PTQError(f"metrics must be a metric name or a list of names such as ['cosine-similarity'], "
                       f"got {shown(values)}")
    names = [metric(v) for v in values]
    if not names:
        raise PTQError("no metric given; name at least one, such as 'cosine-similarity'")
    return names


def evaluation_function(value, what="evaluate"):
    """``value`` where it is a function that takes ``(run, data)``, the accuracy check's and
    the remedies' contract, else one sentence: a wrong signature fails before the user's code
    runs, where its traceback shows only the package's frames."""
    if not callable(value):
        raise PTQError(f"{what} must be a function evaluate(run, data) -> float, got {shown(value)}")
    try:
        signature = inspect.signature(value, follow_wrapped=False)  # a decorator may supply arguments
    except (TypeError, ValueError):  # a builtin or extension without one: let the call decide
        return value
    try:
        signature.bind(None, None)
    except TypeError:
        name = getattr(value, "__name__", None) or type(value).__name__
        raise PTQError(f"{what} function {name}{signature} cannot be called as {name}(run, data); it must take "
                       "two arguments: run (feeds -> outputs) and data (the samples)") from None
    return value


def task_score(value, function):
    """The float an evaluation function named ``function`` returned: one real number, not
    text that reads as one, a bool, a complex number or a duration (numpy's scalars and 0-d
    arrays are numbers)."""
    # dtype kinds: integers and floats (numpy's timedelta is an integer subtype, kind "m")
    number = not isinstance(value, (str, bytes)) and np.ndim(value) == 0 and np.asarray(value).dtype.kind in "iuf"
    if not number:
        raise PTQError(f"the evaluation function {function} returned {shown(value)}; it must return one number "
                       "(higher is better)")
    return float(value)


SEVERITIES = ("error", "warning", "info")  # most severe first


def severity(value, what="max_severity"):
    """One of :data:`SEVERITIES`."""
    if value not in SEVERITIES:
        raise _fail(what, f"must be one of {', '.join(SEVERITIES)}, got {shown(value)}")
    return value


def baseline_path(value, inputs=None, writable=True, what="baseline"):
    """The Path of a baseline file, checked before any work: a ``.json`` path, neither an
    input nor inside a data folder (``inputs``: :class:`~pytest_ptq.guard.Inputs`), and
    writable when it may be written. The suffix keeps an update from rewriting a file
    that was never a baseline (a model, a script, a README)."""
    from . import guard

    path = guard.output_path(value, what, inputs, atomic=True, writable=writable)
    if path.suffix.lower() != ".json":
        raise PTQError(f"{what} {shown(str(path), 240)} must be a .json file (baselines are JSON); "
                       f"name it like {shown(path.stem + '.json', 240)}")
    return path

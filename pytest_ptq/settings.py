"""The plugin's settings: command-line options, ini keys and the ``ptq`` marker.

A value comes from the closest ``ptq`` marker, else the command line, else the ini key in
``[tool.pytest.ini_options]``, else the default. A path is relative to what names it: the
command line to the current directory, an ini key to the ini file's folder, a marker to
the test module's folder (a contract's paths to its YAML file, see ``contract.py``).

Every value goes through the same parser wherever it comes from, so a bad threshold is
rejected at start-up (command line, ini) or when the test starts (marker), never mid-run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import pytest

from . import guard, params
from .errors import PTQError, shown, unknown
from .metrics import METRICS



class InputFailure(pytest.fail.Exception, PTQError):
    """A test failed on bad input (a PTQError): its one sentence is the whole report, with
    no ptq section of tables under it. Still a PTQError, which ``pytest.raises`` can catch."""


class PTQPathWarning(pytest.PytestWarning):
    """A baseline or report path outside the rootdir: legal, but rarely what a project wants
    (it is not committed with the tests that need it)."""


def below(path, root):
    """True when ``path`` lies inside the folder ``root`` (both resolved)."""
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(root))
        return True
    except ValueError:
        return False


# The numeric parsers read text of the command line and ini file (no ``what``: the option or
# key is named around the message); a marker's values are Python's, named ``what="it"`` after
# the key, where a number written as text is refused (see params).
def cosine(text, what=""):
    """A cosine similarity threshold in [-1, 1]."""
    return params.cosine(text, what)


def non_negative(text, what=""):
    """A tolerance: a number >= 0."""
    return params.non_negative(text, what)


def positive_int(text, what=""):
    """A count >= 1."""
    return params.positive_int(text, what)


def node_type(text):
    return params.node_type(text)


def metric(text):
    return params.metric(text)


def memory(text):
    """An engine's memory mode: auto, low or fast."""
    return params.memory_mode(text, "")


def workers(text, what=""):
    """Configurations an engine runs at once: auto or a count >= 1."""
    return params.auto_count(text, what)


def _path(text):
    return params.input_path(str(text), "path")


def existing_path(text):
    """A model or data path that exists (file or folder)."""
    path = _path(text)
    if not path.exists():
        raise PTQError(f"{shown(str(text), 240)} does not exist")
    return path.resolve()


def data_path(text):
    """Calibration or held-out data: an existing folder or .npz file, checked at start-up
    (a file of another kind failed every test that read it)."""
    return params.data_path(str(text), "").resolve()


def existing_file(text):
    """A model or library path: an existing file, not a folder."""
    path = existing_path(text)
    if path.is_dir():
        raise PTQError(f"{shown(str(text), 240)} is a folder; give the file")
    return path


def report_path(text):
    """Where the HTML report goes: not an existing folder (the session checks the rest)."""
    path = _path(text)
    if path.is_dir():
        raise PTQError(f"{shown(str(text), 240)} is a folder; give a file name such as ptq-report.html")
    guard.refuse_link(path, "the report")
    return path.resolve()


def folder(text):
    """A folder (for baselines): not an existing file."""
    path = _path(text)
    if path.exists() and not path.is_dir():
        raise PTQError(f"{shown(str(text), 240)} is a file; give a folder")
    return path.resolve()


def _argtype(parse):
    """``parse`` as an argparse ``type=``: argparse reports the option with its message."""

    def wrapped(text):
        try:
            return parse(text)
        except PTQError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    wrapped.__name__ = parse.__name__
    return wrapped


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting: ``--ptq-<flag>`` on the command line, ``ptq_<name>`` in the ini file,
    ``<name>=`` in the marker."""

    name: str
    parse: object
    default: object
    help: str
    metavar: str = "VALUE"
    is_path: bool = False
    shown: str | None = None  # the default as the help states it, when not the value itself
    alias: str | None = None  # another name for the flag: the one the CLI and the API use

    @property
    def flag(self):
        return "--ptq-" + self.name.replace("_", "-")

    @property
    def flags(self):
        return (self.flag,) + ((f"--ptq-{self.alias}",) if self.alias else ())

    @property
    def ini(self):
        return "ptq_" + self.name

    @property
    def ini_type(self):
        """What a TOML table may hold for it beside text: a count or a number."""
        return {positive_int: int, workers: int, cosine: float, non_negative: float}.get(self.parse)


OPTIONS = [
    Option("model", existing_file, None, "calibrated QDQ model (.onnx) that the ptq fixtures analyse; with "
           "no test using them, a built-in contract checks it (see --ptq-no-default-contract)", "PATH", True),
    Option("data", data_path, None, "calibration data: a folder DIR/<input>/<i>.npy, a folder of "
           "<input>.npy stacks, or an .npz", "PATH", True),
    Option("holdout", data_path, None, "held-out data for the output and accuracy checks and for "
           "accepting ptq.suggest's remedies (a YAML contract names its own), in the layouts of --ptq-data; "
           "node sensitivity and baselines stay on the calibration data", "PATH", True,
           shown="the calibration data", alias="heldout"),
    Option("float_model", existing_file, None, "float model the QDQ model came from (recovers float "
           "weights stored quantized)", "PATH", True),
    Option("custom_op_library", existing_file, None, "onnxruntime custom-op library (.so/.dll) that the model's "
           "custom Q/DQ ops need, e.g. AMD Quark's for its BF16/BFP16 models", "PATH", True),
    Option("data_num", positive_int, None, "use only the first N calibration samples", "N", shown="all samples"),
    Option("node_type", node_type, "node", "nodes ranked by sensitivity and baselines: "
           + ", ".join(params.NODE_TYPES), "TYPE"),
    Option("metric", metric, "cosine-similarity", "metric of node sensitivity and baselines: "
           + ", ".join(METRICS), "NAME"),
    Option("min_cosine", cosine, params.DEFAULT_MIN_COSINE, "lowest output cosine similarity (quantized vs float) that passes",
           "X"),
    Option("min_node_cosine", cosine, 0.999, "lowest output cosine with a single node quantized; "
           "a node below it is too sensitive", "X"),
    Option("tolerance", non_negative, 0.001, "how far (in metric units) a node's sensitivity or an output "
           "metric may move the wrong way before the baseline check fails", "T"),
    Option("baseline_dir", folder, "ptq_baselines", "folder of the baselines of Python tests and of the "
           "built-in contract (DIR/<model stem>.json); a YAML contract's sits beside its file", "DIR", True,
           shown="<rootdir>/ptq_baselines"),
    Option("report", report_path, None, "write one self-contained HTML page for the session: verdicts, "
           "tables and plots per model, failing models first", "PATH.html", True),
    Option("top", positive_int, 10, "rows of the sensitive-node table in failure reports", "N"),
    Option("cache_dir", folder, None, "folder of the results kept between runs (sensitivities, curves, verdicts, "
           "remedies), keyed by hashes of the model, data, float model, options and tool versions; "
           "--cache-clear empties it, --ptq-no-cache turns it off", "DIR", True,
           shown="<pytest's cache dir>/d/ptq"),
    Option("memory", memory, "auto", params.MEMORY_HELP, "MODE"),
    Option("workers", workers, "auto", params.WORKERS_HELP, "N"),
]
BY_NAME = {o.name: o for o in OPTIONS}
# Marker-only keys: a per-test allow-list and baseline file.
MARKER_ONLY = ("allow", "baseline")
# Session-wide keys a marker cannot change.
SESSION_ONLY = ("report", "baseline_dir", "cache_dir", "memory", "workers")


def _marker_signature():
    """The marker's signature, from the options it takes (every option but the session-wide
    ones, in their order) and its own keys: it cannot drift from what the marker accepts."""
    keys = [f"{o.name}={o.default!r}" for o in OPTIONS if o.name not in SESSION_ONLY + ("model", "data")]
    return f"ptq(model=None, data=None, *, {', '.join(keys)}, allow=(), baseline=None)"


MARKER_SIGNATURE = _marker_signature()
MARKER_HELP = (f"{MARKER_SIGNATURE}: the model, data and thresholds of this test's ptq fixtures; paths are "
               "relative to the test module; values override --ptq-* options and ptq_* ini keys.")


def add_options(parser):
    """Register the ``ptq`` option group and its ini keys on pytest's parser."""
    group = parser.getgroup("ptq", "post-training quantization accuracy contracts (pytest-ptq)")
    for o in OPTIONS:
        shown = o.shown or ("none" if o.default is None else o.default)
        group.addoption(*o.flags, dest="ptq_" + o.name, metavar=o.metavar, type=_argtype(o.parse), default=None,
                        help=f"{o.help}. Ini: {o.ini}. Default: {shown}.")
        _add_ini(parser, o, f"{o.help} (pytest-ptq; same as {o.flag}). Default: {shown}.")
    group.addoption("--ptq-update-baseline", action="store_true", dest="ptq_update_baseline", default=False,
                    help="write the baselines that are missing or failing (those tests still fail, so "
                    "a CI run never passes on new baselines). Default: off.")
    group.addoption("--ptq-update-all", action="store_true", dest="ptq_update_all", default=False,
                    help="rewrite every baseline a test reaches, and pass its baseline check. Default: off.")
    group.addoption("--ptq-no-default-contract", action="store_true", dest="ptq_no_default_contract",
                    default=False, help="do not add the built-in contract of --ptq-model (ptq_model): its items "
                    "ptq::MODEL.onnx::outputs, nodes and baseline, added only when no collected test uses the "
                    "ptq fixtures, the ptq marker or a *.ptq.yaml contract. Default: off.")
    group.addoption("--ptq-no-cache", action="store_true", dest="ptq_no_cache", default=False,
                    help="compute every result afresh and keep none on disk (see --ptq-cache-dir). Default: off.")


def _add_ini(parser, option, text):
    """``option``'s ini key; a numeric one may hold a TOML number (pytest 9's ``[tool.pytest]``
    table, where ``ptq_top = 5`` was refused as "expects a string, got int"), and text, which
    the option's own parser reads ("auto", or a sentence naming the key where it is wrong).
    pytest before 9.2 takes no such type: text only there."""
    if option.ini_type is not None and pytest.version_tuple[:2] >= (9, 2):
        parser.addini(option.ini, text, type=option.ini_type | str, default=None)
    else:
        parser.addini(option.ini, text, default=None)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The resolved values for one test (or one contract)."""

    model: Path | None = None
    data: Path | None = None
    float_model: Path | None = None
    custom_op_library: Path | None = None
    data_num: int | None = None
    holdout: Path | None = None
    node_type: str = "node"
    metric: str = "cosine-similarity"
    min_cosine: float = params.DEFAULT_MIN_COSINE
    min_node_cosine: float = 0.999
    tolerance: float = 0.001
    allow: tuple = ()
    baseline: Path | None = None
    baseline_dir: Path | None = None
    report: Path | None = None
    top: int = 10
    cache_dir: Path | None = None
    memory: str = "auto"
    workers: int | str = "auto"
    update: str = "none"  # "none" | "failing" | "all"

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def _parse(option, raw, where, base, marker=False):
    """Parse a raw ini/marker value; a path is made absolute against ``base``. ``marker``: the
    value is Python's, not an ini file's text (a number given as text is refused)."""
    try:
        if option.is_path and not isinstance(raw, Path):
            # a list or a number is no path, and "" is not the test's folder
            raw = str(params.input_path(raw, ""))
            raw = raw if os.path.isabs(raw) else str(base / raw)
        if marker and option.ini_type is not None:
            return option.parse(raw, "it")
        return option.parse(raw)
    except PTQError as exc:
        raise PTQError(f"{where}: {exc}") from None


def from_config(config):
    """Session-wide settings from the command line, the ini file and the defaults.

    Raises PTQError naming the ini key when an ini value is bad.
    """
    ini_base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    values = {}
    for o in OPTIONS:
        value = config.getoption("ptq_" + o.name)
        if value is None:
            raw = config.getini(o.ini)
            if raw not in (None, "", []):
                value = _parse(o, raw, f"ini key {o.ini} = {shown(raw)}", ini_base)
        if value is None and o.name == "baseline_dir":
            value = Path(config.rootpath) / o.default
        if value is None:
            value = o.default
        values[o.name] = value
    update = "all" if config.getoption("ptq_update_all") else (
        "failing" if config.getoption("ptq_update_baseline") else "none")
    return Settings(update=update, **values)


def given_as(config, name):
    """How the session setting ``name`` was given, for messages about its value: its
    option (``--ptq-cache-dir``), or ``ini key ptq_cache_dir`` where the command line left it
    out and the ini file holds it."""
    o = BY_NAME[name]
    if config.getoption("ptq_" + o.name) is None and config.getini(o.ini) not in (None, "", []):
        return f"ini key {o.ini}"
    return o.flag


def apply_marker(settings, args, kwargs, base):
    """``settings`` overridden by one ``ptq`` marker's arguments (paths against ``base``)."""
    if len(args) > 2:
        raise PTQError(f"ptq marker takes at most two positional arguments (model, data), got {len(args)}")
    given = dict(zip(("model", "data"), args))
    for key in given:
        if key in kwargs:
            raise PTQError(f"ptq marker got {key!r} both positionally and as a keyword")
    given.update(params.unaliased(kwargs, "ptq marker"))
    changes = {}
    for key, raw in given.items():
        if key in BY_NAME and key not in SESSION_ONLY:
            changes[key] = None if raw is None else _parse(BY_NAME[key], raw, f"ptq marker {key}={shown(raw)}", base,
                                                           marker=True)
        elif key == "baseline":
            if raw is not None and not isinstance(raw, (str, os.PathLike)):
                raise PTQError(f"ptq marker baseline= must be a path, got {shown(raw)}")
            changes[key] = None if raw is None else (base / params.input_path(raw, "ptq marker baseline=")).resolve()
        elif key == "allow":
            try:
                changes[key] = tuple(params.names(raw, "ptq marker allow=") or ())
            except PTQError as exc:
                raise PTQError(f"{exc}; give node names or patterns such as allow=['conv1*']") from None
        else:
            raise unknown("ptq marker argument", key, [o.name for o in OPTIONS if o.name not in SESSION_ONLY]
                          + list(MARKER_ONLY))
    return settings.replace(**changes)

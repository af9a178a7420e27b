"""Accuracy contracts as data: ``*.ptq.yaml`` files collected as pytest items.

A contract needs no Python::

    # resnet.ptq.yaml -- paths are relative to this file
    model: resnet_qdq.onnx
    data: calibration_data          # folder DIR/<input>/<i>.npy, <input>.npy stacks, or .npz
    float_model: resnet.onnx        # optional
    custom_op_library: libquark.so  # optional: onnxruntime library of custom Q/DQ ops
    holdout: holdout_data           # optional (heldout: too): output and accuracy checks run on it
    data_num: 16                    # optional: first N calibration samples
    metric: cosine-similarity       # optional: metric of every threshold below
    outputs:                        # floor (similarity) or ceiling (error) per output
      default: 0.99                 # every output not named ("" works too)
      # default=default: 0.999      # a model's own output named 'default' (were there one)
      "cls=prob[:, 4:]": 0.999      # an output slice
    nodes:                          # optional: no node more sensitive than this
      type: activation              # node | weight | activation
      threshold: 0.999
      allow: [conv1*]
      outputs: [prob]               # optional: judged on these outputs or slices; default:
                                    # those 'outputs' names if it gives no default, else all
    accuracy:                       # optional: task metric relative to float
      evaluate: evaluate.py:top1    # FILE.py:FUNCTION (relative) or package.module:FUNCTION
      min_ratio: 0.99
    data_check:                     # optional: the checks of ptq-debug check-data, held-out
                                    # data judged against the outputs floor
      max_severity: warning         # fail on findings this severe or worse: error, warning, info
    baseline: baselines/resnet.json # optional; default <name>.baseline.json beside this file;
                                    # false turns the baseline check off
    tolerance: 0.001                # optional: how far the baseline may be missed

Each contract gives the items ``outputs``, ``baseline`` (unless off), ``nodes``,
``accuracy`` and ``data_check`` (when given). A failing item prints plain lines, not a traceback; a schema
error names the key and the file. Output thresholds are cosine similarities unless the
contract sets ``metric``.

``--ptq-model`` (ini ``ptq_model``) alone is a contract too: with no test using the
plugin, the session gets the items ``ptq::<model file>::outputs``, ``nodes`` and
``baseline`` of :func:`from_settings`, so that ``pytest --ptq-model m.onnx --ptq-data
calib`` checks a model in a project with no test file.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import sys
import warnings
from pathlib import Path

import pluggy
import pytest
# pytest's own failure representations: what its short summary and --tb=line read a line from
from _pytest._code.code import ReprFileLocation, ReprTracebackNative, TerminalRepr

from . import params
from . import session as ptq_session
from . import guard
from .errors import PTQError, as_sentence, clip, closest, shown
from .metrics import COSINE, METRICS

# Files collected as contracts. This module loads no onnx: checks load with the first item run.
SUFFIXES = (".ptq.yaml", ".ptq.yml")
# A contract is a few lines; these bound what a hostile file can cost before the schema runs:
# its size, and the size of the document once aliases are expanded ("billion laughs").
MAX_BYTES = 1 * 2**20
MAX_NODES = 20_000
_KEYS = {"model", "data", "float_model", "custom_op_library", "holdout", "data_num", "metric", "outputs", "nodes", "accuracy",
         "data_check", "baseline", "tolerance"}
_NODE_KEYS = {"type", "threshold", "allow", "metric", "outputs"}
_ACCURACY_KEYS = {"evaluate", "min_ratio"}
_DATA_CHECK_KEYS = {"max_severity"}

# where pytest's and pluggy's own frames live: left out of a contract item's traceback
_RUNNER_DIRS = tuple(str(Path(m.__file__).parent) for m in (pytest, pluggy)) + (
    str(Path(pytest.__file__).parent.parent / "_pytest"), str(Path(__file__).parent))


class ContractError(PTQError):
    """A contract file that does not fit the schema; the message names the file and key."""


@dataclasses.dataclass(frozen=True)
class Contract:
    """A validated contract; paths are absolute."""

    path: Path
    name: str
    model: Path
    data: Path
    float_model: Path | None = None
    custom_op_library: Path | None = None
    holdout: Path | None = None
    data_num: int | None = None
    metric: str | None = None
    outputs: object = None  # number or {output: number}; None: the session's min_cosine
    nodes: dict | None = None  # {type, threshold, allow, metric, outputs}
    accuracy: dict | None = None  # {evaluate, min_ratio}
    data_check: dict | None = None  # {max_severity}
    baseline: Path | None = None  # None: no baseline check
    tolerance: float | None = None

    def inputs(self):
        """What the contract's checks read: the contract itself, its model, data, float model,
        held-out data and evaluation file (:class:`~pytest_ptq.guard.Inputs`)."""
        inputs = (guard.Inputs().add(self.path, "contract file").add(self.model, guard.MODEL_FILE)
                  .add(self.data, "calibration data").add(self.float_model, guard.FLOAT_MODEL)
                  .add(self.holdout, "held-out data").add(self.custom_op_library, "custom-op library"))
        target, _, _ = (self.accuracy or {}).get("evaluate", "").rpartition(":")
        if target.endswith(".py"):
            inputs.add(self.path.parent / target, "evaluation file")
        return inputs

    def node_outputs(self, given):
        """The outputs the nodes check judges: ``nodes.outputs`` (a name that ``outputs`` gives a
        slice, ``p`` of ``p=prob[:, 1:]``, read as that slice), else those ``outputs`` names when
        it gives no default (the only ones the contract holds to a floor), else None (every
        output). ``given``: ``outputs`` as read on the model (:func:`~pytest_ptq.outputs.thresholds`)."""
        if self.nodes is not None and self.nodes.get("outputs"):
            named = {k.partition("=")[0].strip(): k for k in given if "=" in k}
            return [named.get(o, o) for o in self.nodes["outputs"]]
        if given and "" not in given:
            return list(given)
        return None

    @property
    def checks(self):
        names = ["outputs"]
        if self.nodes is not None:
            names.append("nodes")
        if self.accuracy is not None:
            names.append("accuracy")
        if self.data_check is not None:
            names.append("data_check")
        if self.baseline is not None:
            names.append("baseline")
        return names


def _stem(path):
    name = path.name
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _loader():
    """PyYAML's safe loader, reading numbers as YAML 1.2 does: YAML 1.1 reads an unquoted
    ``1e-3`` (no dot, or no sign in the exponent) as text, which a threshold then refused as a
    number written in quotes."""
    import re

    import yaml

    # made per contract, not kept: pytest's in-process runs (pytester) import yaml afresh, whose
    # errors a loader of the module before would not raise as the new module's
    class Loader(yaml.SafeLoader):
        """SafeLoader with a resolver table of its own: SafeLoader's stays as it is."""

    Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
                                 list("-+.0123456789"))
    return Loader


def read_yaml(path, where):
    """The YAML document of ``path`` (safe types only), its size and its expanded size
    bounded before anything is built from it; raises :class:`ContractError`."""
    import yaml

    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ContractError(f"{where} ({path}) is {size / 2**20:.1f} MiB; a contract is a few lines of YAML "
                                f"(at most {MAX_BYTES // 2**20} MiB), so check that this is the right file")
        text = path.read_bytes().decode("utf-8")
    except ContractError:
        raise
    except OSError as exc:
        raise ContractError(f"{where} ({path}) cannot be read: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError as exc:
        raise ContractError(f"{where} ({path}) is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_size(node)
        if expanded > MAX_NODES:
            raise ContractError(f"{where} ({path}) expands to more than {MAX_NODES} YAML values through its "
                                "aliases (*name); write the contract out without aliases")
        twice = _repeated_key(node)
        if twice is not None:  # YAML keeps the last silently: a pasted line would loosen a threshold unseen
            raise ContractError(f"{where} ({path}) sets {twice.value!r} twice (again at line "
                                f"{twice.start_mark.line + 1}); keep one")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ContractError(f"{where} ({path}) is not valid YAML{at}: {clip(problem)}") from None
    except RecursionError:
        raise ContractError(f"{where} ({path}) nests too deeply to be a contract; flatten it") from None
    finally:
        loader.dispose()


def _repeated_key(root):
    """The first key node that repeats a key of its own mapping, in the YAML node graph
    ``root`` (each node visited once), else None."""
    import yaml

    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys = set()
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    if k.value in keys:
                        return k
                    keys.add(k.value)
                stack += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
    return None


def _expanded_size(root):
    """How many values the YAML node graph ``root`` holds once every alias is expanded,
    counted without expanding (each node's size once); a recursive alias counts as
    unbounded."""
    import yaml

    sizes, state, stack = {}, {}, [root]
    while stack:
        node = stack[-1]
        key = id(node)
        if key in sizes:
            stack.pop()
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        if state.get(key) is None:
            state[key] = "open"
            pending = [c for c in children if id(c) not in sizes]
            for c in pending:
                if state.get(id(c)) == "open":
                    return math.inf  # an alias inside its own anchor
            stack.extend(pending)
            if pending:
                continue
        total = 1 + sum(sizes[id(c)] for c in children)
        sizes[key] = min(total, MAX_NODES + 1)  # capped: only "too many" matters
        stack.pop()
    return sizes[id(root)]


def load(path):
    """Read and validate a contract file; raises :class:`ContractError`."""
    path = Path(path)
    where = f"contract {path.name!r}"
    doc = read_yaml(path, where)
    if not isinstance(doc, dict):
        raise ContractError(f"{where} ({path}) must be a mapping of keys such as 'model:' and 'data:', "
                            f"got {type(doc).__name__}")
    try:
        doc = params.unaliased(doc, where)
    except PTQError as exc:
        raise ContractError(str(exc)) from None
    _known(doc, _KEYS, "", where)
    base = path.parent

    def req_path(key):
        if key not in doc or doc[key] in (None, ""):
            raise ContractError(f"{where} has no {key!r} key; add '{key}: PATH' (relative to {path.name})")
        return opt_path(key)

    def opt_path(key):
        value = doc.get(key)
        if value in (None, ""):
            return None
        if not isinstance(value, str):
            raise ContractError(f"{where}: {key!r} must be a path string, got {shown(value)}")
        return _resolve(base, _valid(params.input_path, value, key, where))

    metric = doc.get("metric")
    if metric is not None:
        metric = _metric(metric, "metric", where)
    data_num = _valid(params.data_num, doc.get("data_num"), "data_num", where)
    outputs = doc.get("outputs")
    if outputs is not None:
        outputs = _outputs(outputs, metric or COSINE, where)
    elif metric not in (None, COSINE):  # only cosine has a default threshold (--ptq-min-cosine)
        raise ContractError(f"{where}: 'metric: {metric}' needs the {metric} the outputs must reach: add 'outputs: "
                            "VALUE' (or one per output); only cosine-similarity has a default threshold")
    nodes = doc.get("nodes")
    if nodes is not None:
        nodes = _nodes(nodes, metric, where)
    accuracy = doc.get("accuracy")
    if accuracy is not None:
        accuracy = _accuracy(accuracy, where)
    data_check = _data_check(doc.get("data_check"), where)
    baseline = doc.get("baseline", f"{_stem(path)}.baseline.json")
    if baseline is False:
        baseline = None
    elif isinstance(baseline, str) and baseline:
        baseline = _resolve(base, _valid(params.input_path, baseline, "baseline", where))
    else:
        raise ContractError(f"{where}: 'baseline' must be a path or false, got {shown(baseline)}")
    tolerance = doc.get("tolerance")
    if tolerance is not None:
        tolerance = _valid(params.non_negative, tolerance, "tolerance", where)
    contract = Contract(path=path.resolve(), name=_stem(path), model=req_path("model"), data=req_path("data"),
                        float_model=opt_path("float_model"), custom_op_library=opt_path("custom_op_library"),
                        holdout=opt_path("holdout"), data_num=data_num,
                        metric=metric, outputs=outputs, nodes=nodes, accuracy=accuracy, data_check=data_check,
                        baseline=baseline, tolerance=tolerance)
    if baseline is not None:
        # at collection, before any work: a baseline that names an input fails the contract
        try:
            params.baseline_path(baseline, contract.inputs(), writable=False, what="'baseline'")
        except PTQError as exc:
            raise ContractError(f"{where}: {exc}") from None
    return contract


def _resolve(base, path):
    """``path`` (relative to ``base``) made absolute, symlinks and ``..`` resolved."""
    return Path(os.path.realpath(base / path))


def from_settings(settings):
    """The built-in contract of the session's ``--ptq-model``: outputs cosine >= ``min_cosine``
    (on ``holdout`` when given), no ``node_type`` node below ``min_node_cosine``, and the
    baseline ``<baseline_dir>/<model stem>.json`` in ``metric`` within ``tolerance``."""
    model = Path(settings.model)
    return Contract(path=model, name=model.stem, model=model, data=settings.data,
                    float_model=settings.float_model, custom_op_library=settings.custom_op_library,
                    holdout=settings.holdout, data_num=settings.data_num,
                    outputs=settings.min_cosine,
                    nodes={"type": settings.node_type, "threshold": settings.min_node_cosine, "allow": [],
                           "metric": COSINE},
                    baseline=Path(settings.baseline_dir) / f"{model.stem}.json")


def _known(mapping, allowed, prefix, where):
    for key in mapping:
        if key not in allowed:
            near = closest(str(key), sorted(allowed))
            hint = f"; did you mean {near[0]!r}?" if near else f"; allowed keys: {', '.join(sorted(allowed))}"
            raise ContractError(f"{where}: unknown key {shown(prefix + str(key))}{hint}")


def _valid(validator, value, key, where):
    """``validator(value)`` of :mod:`~pytest_ptq.params`, its error naming the file and the key."""
    try:
        return validator(value, repr(key))
    except PTQError as exc:
        raise ContractError(f"{where}: {exc}") from None


def _num(value, key, where):
    return _valid(params.number, value, key, where)  # YAML's quoted '0.99' refused there, as text


def _metric(value, key, where):
    if not isinstance(value, str):
        raise ContractError(f"{where}: {key!r} must be a metric name ({', '.join(METRICS)}), got {shown(value)}")
    try:
        return params.metric(value)
    except PTQError as exc:
        raise ContractError(f"{where}: {key!r}: {exc}") from None


def _bound(value, key, metric, where):
    """A threshold on ``metric`` (see :func:`~pytest_ptq.params.threshold`)."""
    number = _num(value, key, where)
    return _valid(lambda v, what: params.threshold(v, metric, what), number, key, where)


def _outputs(value, metric, where):
    if isinstance(value, dict):
        # keys as written: 'default' is read against the model, which may have a tensor so named
        # (outputs.thresholds), when the check runs
        out = {"" if k is None else str(k): _bound(v, f"outputs.{k}", metric, where) for k, v in value.items()}
        try:  # its keys refused here, before the model is read ('default' and '' both, say)
            params.thresholds(out)
        except PTQError as exc:
            raise ContractError(f"{where}: 'outputs': {exc}") from None
        if not out:
            raise ContractError(f"{where}: 'outputs' is empty; give 'default: 0.99' or one threshold per output")
        return out
    if isinstance(value, (list, tuple, set)):  # a threshold per output is a mapping, not a list
        raise ContractError(f"{where}: 'outputs' must be a number, or a mapping {{output: value}} such as "
                            f"{{prob: 0.99, default: 0.9}} for one per output, got {shown(value)}")
    return _bound(value, "outputs", metric, where)


def _nodes(value, metric, where):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = {"threshold": value}
    if not isinstance(value, dict):
        raise ContractError(f"{where}: 'nodes' must be a mapping (type, threshold, allow) or a number, "
                            f"got {shown(value)}")
    _known(value, _NODE_KEYS, "nodes.", where)
    node_type = value.get("type", None)
    if node_type is not None:
        node_type = _valid(params.node_type, node_type, "nodes.type", where)
    allow = value.get("allow", [])
    if isinstance(allow, str):
        allow = [allow]
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise ContractError(f"{where}: 'nodes.allow' must be a list of node names or patterns, got {shown(allow)}")
    outputs = value.get("outputs")
    if isinstance(outputs, str):
        outputs = [outputs]
    if outputs is not None and (not isinstance(outputs, list) or not outputs
                                or not all(isinstance(o, str) and o for o in outputs)):
        raise ContractError(f"{where}: 'nodes.outputs' must be a list of output names or slices, got {shown(outputs)}")
    own = _metric(value["metric"], "nodes.metric", where) if "metric" in value else None
    threshold = None
    if "threshold" in value:  # checked here when the contract names the metric, else when it runs
        threshold = _num(value["threshold"], "nodes.threshold", where)
        if own or metric:
            threshold = _bound(threshold, "nodes.threshold", own or metric, where)
    return {"type": node_type, "threshold": threshold, "allow": list(allow), "metric": own, "outputs": outputs}


def _accuracy(value, where):
    if not isinstance(value, dict):
        raise ContractError(f"{where}: 'accuracy' must be a mapping with 'evaluate' and 'min_ratio', got {shown(value)}")
    _known(value, _ACCURACY_KEYS, "accuracy.", where)
    fn = value.get("evaluate")
    if not isinstance(fn, str) or ":" not in fn:
        raise ContractError(f"{where}: 'accuracy.evaluate' must be 'FILE.py:FUNCTION' or 'module:FUNCTION', "
                            f"got {shown(fn)}")
    ratio = _valid(params.ratio, _num(value.get("min_ratio", params.DEFAULT_MIN_RATIO), "accuracy.min_ratio", where),
                   "accuracy.min_ratio", where)
    return {"evaluate": fn, "min_ratio": ratio}


def _data_check(value, where):
    """``{max_severity}`` from ``data_check:`` (a mapping, or true for the defaults); None when
    absent or false."""
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ContractError(f"{where}: 'data_check' must be a mapping such as '{{max_severity: warning}}' or true, "
                            f"got {shown(value)}")
    _known(value, _DATA_CHECK_KEYS, "data_check.", where)
    return {"max_severity": _valid(params.severity, value.get("max_severity", "warning"), "data_check.max_severity",
                                   where)}


def load_function(spec, base, label):
    """The function named by ``FILE.py:NAME`` (relative to ``base``) or ``module:NAME``;
    ``label`` names where it was given in messages (a contract's field, an option)."""
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        file = (base / target).resolve()
        if not file.is_file():
            raise ContractError(f"{label} file {str(file)!r} does not exist; write the path of the .py file "
                                f"relative to {str(base)!r} (FILE.py:FUNCTION), or name an importable module "
                                "(module:FUNCTION)")
        mod_name = f"ptq_contract_{abs(hash(str(file)))}"
        module = sys.modules.get(mod_name)
        if module is None:
            spec_obj = importlib.util.spec_from_file_location(mod_name, file)
            module = importlib.util.module_from_spec(spec_obj)
            # no __pycache__ beside the user's file: nothing is written outside declared outputs
            dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
            try:
                spec_obj.loader.exec_module(module)
            # the user's file: its error, in one sentence with its line; SystemExit too (a script
            # that parses its own arguments on import would exit the run with argparse's usage)
            except (Exception, SystemExit) as exc:
                line = getattr(exc, "lineno", None)
                if line is None:
                    tb = exc.__traceback__
                    while tb is not None:
                        if tb.tb_frame.f_code.co_filename == str(file):
                            line = tb.tb_lineno
                        tb = tb.tb_next
                at = f" at line {line}" if line else ""
                raise ContractError(f"{label} file {str(file)!r} fails to import{at} "
                                    f"({type(exc).__name__}: {clip(str(exc).splitlines()[0] if str(exc) else '')}); "
                                    "fix the file") from None
            finally:
                sys.dont_write_bytecode = dont_write
            sys.modules[mod_name] = module
    else:
        try:
            module = importlib.import_module(target)
        except (Exception, SystemExit) as exc:  # ImportError, or whatever the module raises on import
            raise ContractError(f"{label} module {shown(target)} cannot be imported "
                                f"({type(exc).__name__}: {clip(str(exc))})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ContractError(f"{label} names {name!r}, which {target} does not define "
                            "as a function")
    return fn


class PTQContractWarning(pytest.PytestWarning):
    """A contract whose meaning depends on the command line (a threshold in --ptq-metric's units)."""


class ContractFile(pytest.File):
    """A ``*.ptq.yaml`` file: one item per check of its contract."""

    def collect(self):
        contract = load(self.path)
        for check in contract.checks:
            yield ContractItem.from_parent(self, name=check, contract=contract)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, ContractError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class _Lines(TerminalRepr):
    """A contract's failure as its plain lines, with the one line that pytest's short summary
    and ``--tb=line`` show (as a string, they showed its first 50 characters, or under -vv
    the whole report, tables included): the reason, not the heading."""

    def __init__(self, text, path):
        self.text = text
        lines = [line for line in text.splitlines() if line.strip()]
        reason = next((line for line in lines[1:] if not line.startswith(("+", "|", " "))), None) \
            if lines and lines[0].endswith(": FAILED") else None
        self.reprcrash = ReprFileLocation(str(path), 1, reason or (lines[0] if lines else ""))
        # as an exception's report too, so that pytest-xdist hands it to the controller whole,
        # its one line included (as text, the short summary and JUnit read its heading)
        self.reprtraceback = ReprTracebackNative([line + "\n" for line in text.splitlines()])
        self.sections = []

    def toterminal(self, tw):
        for line in self.text.splitlines():
            tw.line(line)


class DefaultContracts(pytest.Collector):
    """``ptq``: the built-in contract of the session's model, a child named after its file."""

    def __init__(self, *, settings, **kwargs):
        super().__init__(**kwargs)
        self.settings = settings

    def collect(self):
        contract = from_settings(self.settings)
        yield ModelContract.from_parent(self, name=contract.model.name, path=contract.model, contract=contract)


class ModelContract(pytest.Collector):
    """A contract that no file spells out: one item per check, located at the model file."""

    def __init__(self, *, contract, **kwargs):
        super().__init__(**kwargs)
        self.contract = contract

    def collect(self):
        for check in self.contract.checks:
            yield ContractItem.from_parent(self, name=check, contract=self.contract)


def contract_settings(settings, contract):
    """The session's settings with a contract's own values: what its checks default to."""
    nodes = contract.nodes or {}
    return settings.replace(
        model=contract.model, data=contract.data, float_model=contract.float_model, holdout=contract.holdout,
        custom_op_library=contract.custom_op_library or settings.custom_op_library,
        data_num=settings.data_num if contract.data_num is None else contract.data_num,
        metric=contract.metric or settings.metric,
        node_type=nodes.get("type") or settings.node_type, allow=tuple(nodes.get("allow") or ()),
        baseline=contract.baseline,
        tolerance=settings.tolerance if contract.tolerance is None else contract.tolerance)


class ContractItem(pytest.Item):
    """One check of a contract, run by the same checks as the ``ptq`` fixture; failures print
    the check's report as plain lines."""

    def __init__(self, *, contract, **kwargs):
        super().__init__(**kwargs)
        self.contract = contract

    def runtest(self):
        from .checks import PTQ, ContractFailed, check_data
        from .outputs import thresholds as output_thresholds

        session = ptq_session.get(self.config)
        c = self.contract
        settings = contract_settings(session.settings, c)
        analysis = session.analysis(c.model, c.data, c.float_model, settings.data_num, settings.custom_op_library)
        session.use(self, analysis)
        self.stash[ptq_session.SETTINGS_KEY] = settings
        ptq = PTQ(analysis, settings, lambda result: session.record(self, analysis, result), c.baseline,
                  inputs=c.inputs(), commands=session.commands(self), base=Path(self.path).parent,
                  written=session.baselines_written)
        if self.name == "outputs":
            # output thresholds are cosines unless the contract itself names a metric
            result = ptq.check_outputs(c.outputs, c.metric or COSINE)
        elif self.name == "nodes":
            if c.nodes["threshold"] is not None and not (c.nodes["metric"] or c.metric) and settings.metric != COSINE:
                # 0.999 written as a cosine floor passed as a 0.999 dB floor under --ptq-metric=sqnr
                warnings.warn(PTQContractWarning(
                    f"{self.path.name}: nodes.threshold {c.nodes['threshold']} is read in {settings.metric} (the "
                    "session's --ptq-metric), as the contract names no metric; name it (nodes: {metric: ...}) to "
                    "keep the threshold's meaning whatever the command line says"))
            result = ptq.check_nodes(c.nodes["threshold"], metric=c.nodes["metric"],
                                     outputs=c.node_outputs(output_thresholds(c.outputs, analysis)))
        elif self.name == "accuracy":
            fn = load_function(c.accuracy["evaluate"], c.path.parent, f"contract {self.path.name!r}: 'accuracy.evaluate'")
            result = ptq.check_accuracy(fn, c.accuracy["min_ratio"])
        elif self.name == "data_check":
            # the held-out comparison holds the figure to the floor the outputs item holds it to (a
            # fixed 0.99 failed a contract whose own floor of 0.98 passed the same figure)
            floor, source = ((c.outputs, "the contract's outputs floor") if c.outputs is not None else
                             (settings.min_cosine, "min_cosine (--ptq-min-cosine), as the contract sets no outputs floor"))
            result = check_data(analysis, c.data_check["max_severity"], c.holdout, floor, c.metric or COSINE, source)
            session.record(self, analysis, result)
        else:
            # the outputs its thresholds name (slices too) are kept beside the model's own
            result = ptq.check_baseline(outputs=[k for k in output_thresholds(c.outputs, analysis) if k])
        if not result:
            raise ContractFailed(result)

    def repr_failure(self, excinfo, style=None):
        """Plain lines: the check's report, or the one-sentence input error."""
        from .checks import ContractFailed

        if isinstance(excinfo.value, ContractFailed):
            return _Lines(f"contract {self.contract.name} ({self.path.name}), check {self.name}: FAILED\n"
                          + str(excinfo.value), self.path)
        if isinstance(excinfo.value, ContractError):
            return _Lines(str(excinfo.value), self.path)
        # bad input: a PTQError (the checks' InputFailure is one too), or one of our warnings as an error
        sentence = as_sentence(excinfo.value)
        if sentence is not None:
            return _Lines(f"contract {self.contract.name} ({self.path.name}), check {self.name}: {sentence}",
                          self.path)
        # an error in the user's own code (an evaluate function): its frames, not pytest's,
        # pluggy's (hundreds of lines a plain test's failure does not show either) and ours
        kept = excinfo.traceback.filter(lambda entry: not str(entry.path).startswith(_RUNNER_DIRS))
        if len(kept):
            excinfo.traceback = kept
        return super().repr_failure(excinfo, style=style or "short")

    def reportinfo(self):
        # a line number, not None: pytest (9.2) asserts one when a skip mark reports at the item
        return self.path, 0, f"ptq contract {self.contract.name}: {self.name}"

"""Arguments every subcommand shares: one definition, one help text each.

Argument values go through the validators of :mod:`pytest_ptq.params`, so a bad value is
rejected by argparse (exit 2) in the same words the API uses.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import sys

from .. import guard, params
from ..errors import PTQError
from ..metrics import METRICS
from ..tables import warning_lines

DATA_HELP = "calibration data: DIR/<input>/<i>.npy, DIR/<input>.npy or one .npz"


@dataclasses.dataclass(frozen=True)
class Command:
    """``ptq-debug NAME``: ``configure(parser)`` adds its options, ``run(args)`` returns the exit code."""

    name: str
    help: str
    configure: object
    run: object


# What a command reads and writes, by argparse dest. main() guards every command through
# these, so a command (also one added later) is covered by naming its options with them.
INPUT_DESTS = {"model": guard.MODEL_FILE, "float_model": guard.FLOAT_MODEL, "float_model_path": guard.FLOAT_MODEL,
               "data": "calibration data", "heldout": "held-out data", "evaluate": "evaluation file"}
STDOUT = "-"  # --json -: the JSON on standard output, everything else on standard error
OUTPUT_DESTS = {"json": ("--json", False), "save_dir": ("-s/--save-dir", True),  # dest: (label, folder)
                "cache_dir": ("--cache-dir", True)}


def inputs_of(args):
    """The :class:`~pytest_ptq.guard.Inputs` a parsed command line reads."""
    inputs = guard.Inputs()
    for dest, what in INPUT_DESTS.items():
        for value in _values(getattr(args, dest, None)):
            if dest == "evaluate":  # FILE.py:FUNCTION reads FILE.py; module:FUNCTION reads no file here
                target, sep, _ = value.rpartition(":")
                if not (sep and target.endswith(".py")):
                    continue
                value = target
            inputs.add(value, what)
    return inputs


def check_outputs(args):
    """Check every output path of a parsed command line against its inputs before any work
    (``--no-save`` turns the save folder off); returns the inputs, to protect while it runs."""
    inputs = inputs_of(args)
    for dest, (label, folder) in OUTPUT_DESTS.items():
        if dest == "save_dir" and getattr(args, "no_save", False):
            continue
        for value in _values(getattr(args, dest, None)):
            if not (dest == "json" and value == STDOUT):
                # a cache folder it cannot write is read all the same (cache.for_engine warns)
                guard.output_path(value, label, inputs, folder=folder, writable=dest != "cache_dir")
    return inputs


def _values(value):
    if value is None:
        return []
    return [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, str)]


def argtype(validator, name=None):
    """An argparse ``type=`` from a :mod:`~pytest_ptq.params` validator; argparse names the
    option, so the message starts with the verb."""

    def parse(text):
        try:
            return validator(text, "")
        except PTQError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name or validator.__name__
    return parse


positive_int = argtype(params.positive_int, "positive integer")
bins = argtype(params.bins, "number of bins")
cosine = argtype(params.cosine, "cosine")
seconds = argtype(params.seconds, "seconds")
number = argtype(params.number, "number")
positive = argtype(params.positive, "positive number")
library = argtype(lambda value, what: params.libraries(value, what)[0], "library")
ratio = argtype(params.ratio, "ratio")
metric = argtype(lambda value, what: params.metric(value), "metric")
axis = argtype(params.axis, "axis")  # canonical: 'cos' is cosine-similarity


def add_model(p, data=True, engine=None):
    """MODEL [DATA] [--data-num N] [--float-model F] [--quiet], and the engine's
    [--memory MODE] [--workers N] where it builds one (``engine``, by default with data)."""
    p.add_argument("model", help="calibrated QDQ model (.onnx)")
    if data:
        p.add_argument("data", help=DATA_HELP)
        add_data_num(p)
    p.add_argument("--float-model", default=None,
                   help="the original float model, to recover float weights and check the float reference")
    add_custom_op_library(p)
    builds_engine = data if engine is None else engine
    if builds_engine:
        add_resources(p)
    add_quiet(p)


def add_resources(p):
    p.add_argument("--memory", type=argtype(params.memory_mode, "memory mode"), default="auto", metavar="MODE",
                   help=f"{params.MEMORY_HELP}. Default: auto")
    p.add_argument("--workers", type=argtype(params.auto_count, "workers"), default="auto", metavar="N",
                   help=f"{params.WORKERS_HELP}. Default: auto")


def add_custom_op_library(p):
    p.add_argument("--custom-op-library", action="append", default=[], metavar="PATH", type=library,
                   help="onnxruntime custom-op library the model's custom Q/DQ ops need (repeatable), e.g. AMD "
                        "Quark's for its BF16/BFP16 models. Default: none")


def add_data_num(p):
    p.add_argument("--data-num", type=positive_int, default=None, metavar="N",
                   help="use the first N calibration samples only. Default: all")


def add_quiet(p):
    # '-q' belongs to the seed's --quantize-node, so quiet has only its long name
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_metrics(p, what="the first sorts the ranking"):
    p.add_argument("-m", "--metrics", nargs="+", action=Metrics, default=["cosine-similarity"], metavar="METRIC",
                   help=f"metrics, {what}; one of {', '.join(METRICS)} (also the seed's \"['a','b']\" form). "
                        "Default: cosine-similarity")


class Listed(argparse.Action):
    """A ``nargs="+"`` option that may be given more than once: its lists join (argparse's own
    keeps the last, so ``-i A -i B`` ranked B alone); the first replaces the default."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given", set())
        values = self.convert(values)
        if self.dest in given:
            values = [*getattr(namespace, self.dest), *values]
        given.add(self.dest)
        setattr(namespace, self.dest, values)

    def convert(self, values):
        return list(values)


class SeedList(Listed):
    """A :class:`Listed` option that also takes the seed's bracketed Python list, quoted
    (``-q "[['Conv_2'], ['Conv_2', 'Conv_90']]"``) or as the shell splits it unquoted
    (``-m [cosine-similarity, mse]``): stored as that list (of strings; of lists of strings
    too for :class:`SeedGroups`); other values as given. A list of another shape is refused
    naming the option (the analysis named its Python parameter, ``quantize_node``)."""

    nested = False

    def convert(self, values):
        value = seed_list(values)
        try:
            params.names(value, "", nested=self.nested)
        except PTQError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        return value


class SeedGroups(SeedList):
    """A :class:`SeedList` whose entries may be the seed's groups, lists of names quantized
    together (``-q "[['Conv_2'], ['Conv_2', 'Conv_90']]"``)."""

    nested = True


class Metrics(SeedList):
    """``-m``: metric names, checked and made canonical as given (a misspelt one was refused
    only after the model compiled)."""

    def convert(self, values):
        names = seed_list(values)
        if not all(isinstance(v, str) for v in names):
            raise argparse.ArgumentError(self, "a list of metric names, such as \"['cosine-similarity', 'mse']\"")
        try:
            return params.metrics(names)
        except PTQError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None


def seed_list(values):
    """``values`` (argv words), or the seed's list they spell (see :class:`SeedList`)."""
    text = " ".join(values).strip()
    if not (text.startswith("[") and text.endswith("]")):
        return values
    # bare words, as an unquoted list reaches us, quoted so that Python reads the list; the
    # strings already quoted kept whole (a PyTorch name such as '/model/conv1/Conv' holds
    # runs that read as bare words)
    parts = re.split(r"""('[^']*'|"[^"]*")""", text)
    quoted = "".join(part if i % 2 else re.sub(r"""([^\[\],'"\s]+)""", r"'\1'", part)
                     for i, part in enumerate(parts))
    try:
        value = ast.literal_eval(quoted)
    except (ValueError, SyntaxError):
        return values
    if not isinstance(value, list) or not value or not all(
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)) for v in value):
        return values
    return value


def add_metric(p, what):
    """``--metric``: one metric, for ``what``."""
    p.add_argument("--metric", type=metric, default="cosine-similarity", metavar="METRIC",
                   help=f"{what}; one of {', '.join(METRICS)}. Default: cosine-similarity")


def add_output_node(p):
    p.add_argument("-o", "--output-node", nargs="+", action=Listed, default=None, metavar="OUTPUT",
                   help="outputs to compare: a tensor, a node, or a slice 'name=out[:, 0:4]'. "
                        "Default: every float model output (a label or mask output is left out unless named; a "
                        "concatenation of parts whose magnitudes differ 10x or more, such as a detector's boxes "
                        "beside its scores, is compared part by part)")


def add_top(p, help="print only the top N rows", default=None):
    shown = "all" if default is None else default
    p.add_argument("--top", type=positive_int, default=default, metavar="N", help=f"{help}. Default: {shown}")


def add_json(p):
    p.add_argument("--json", default=None, metavar="OUT",
                   help="also write the result as JSON to OUT (-: to standard output, the tables to standard error)")


def add_save_dir(p, default="ptq_debug_output", writes="the files written"):
    shown = default or "write nothing"
    p.add_argument("-s", "--save-dir", default=default, metavar="DIR",
                   help=f"folder for {writes}. Default: {shown}")


def add_confidence(p):
    p.add_argument("--confidence", nargs="?", const=5, type=positive_int, default=None, metavar="K",
                   help="also resample the samples (bootstrap) to print each node's spread over the samples it "
                        "was judged on (a 'samples' column where some node was judged on fewer: on the others "
                        "the outputs it reaches held no values) and whether the top K (default 5) order is "
                        "stable; needs several samples")


def add_cache_dir(p):
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="keep the results in DIR between runs, keyed by hashes of the model, data, options and "
                        "tool versions: an unchanged rerun reads them. Default: compute afresh, keep nothing")


def engine_and_cache(args, told=False):
    """The :class:`~pytest_ptq.engine.Engine` of a subcommand's model and data, with every
    sample (``--data-num`` is applied by the analysis, once), and the
    :class:`~pytest_ptq.cache.ResultCache` of ``--cache-dir`` (None without one). The
    engine's float-equivalence check is a result like the others: an unchanged rerun reads
    it (it ran a few float passes on every sample it spreads over: 12 of the 16 s a cached
    rerun took on a 1 GiB model). The engine's warnings go to standard error, a line each,
    unless the subcommand's output carries them (``told``: runall's summary)."""
    from ..cache import for_engine, through
    from ..engine import Engine

    engine = Engine(args.model, args.data, float_model=args.float_model, custom_op_libraries=args.custom_op_library,
                    check=False, memory=args.memory, workers=args.workers)
    cache = for_engine(args.cache_dir, engine) if getattr(args, "cache_dir", None) else None
    if engine.data is not None:
        engine.check_float_equivalence(through(cache, ("float equivalence",), engine.float_equivalence))
    if not told:
        for warning in engine.warnings:
            print("\n".join(warning_lines(warning)), file=sys.stderr)
    return engine, cache


def engine(args):
    """The engine of :func:`engine_and_cache`, for subcommands that keep no results."""
    return engine_and_cache(args)[0]


def warn_of_blind_outputs(args, engine, cache=None):
    """On standard error, a warning per output a metric of the command cannot see errors in
    (:func:`~pytest_ptq.outputs.blind_warnings`: kl on one logit, a cosine far from zero), as
    runall, the checks and the plugin say: its figures there read perfect whatever happens."""
    from ..cache import through
    from ..metrics import get_metric
    from ..outputs import OFFSET_BLIND, blind_warnings, far_from_zero, parse_outputs
    from ..sensitivity import sample_indices

    outputs = getattr(args, "output_node", None)
    specs = parse_outputs(outputs, engine)
    names = tuple(dict.fromkeys(get_metric(m).name for m in getattr(args, "metrics", None) or [args.metric]))

    def told():  # the outputs scanned once; a sentence several metrics share said once
        # on the samples the command pools (--data-num), not the whole data: an output 0 on
        # those alone is undefined in every figure it prints
        samples = None if engine.data is None else sample_indices(engine, args.data_num)
        far = far_from_zero(engine, specs, samples) if {*names} & {*OFFSET_BLIND, "correlation"} else []
        return list(dict.fromkeys(w for m in names for w in blind_warnings(engine, specs, m, found=far)))

    request = ("blind warnings", names, None if outputs is None else tuple(outputs), args.data_num)
    for warning in through(cache, request, told):
        print("\n".join(warning_lines(warning)), file=sys.stderr)


def warn_if_simulated_otherwise(args, engine, cache=None):
    """On standard error, a warning where the file runs on onnxruntime's kernels otherwise
    than every figure simulates it (:func:`~pytest_ptq.stages.simulation_warnings`), as
    runall and the plugin say: the figures printed are the simulation's."""
    from ..cache import through
    from ..outputs import parse_outputs
    from ..stages import simulation_warnings

    outputs = getattr(args, "output_node", None)
    specs = parse_outputs(outputs, engine)
    request = ("simulation warnings", None if outputs is None else tuple(outputs), args.data_num)
    for warning in through(cache, request, lambda: simulation_warnings(engine, specs, args.data_num)):
        print("\n".join(warning_lines(warning)), file=sys.stderr)

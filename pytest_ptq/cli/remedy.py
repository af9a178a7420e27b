"""``suggest``: the cheapest set of nodes to remedy so the model meets a target on data the
search did not choose on."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import params
from ..errors import PTQError
from ..remedy import DEFAULT_COSTS, MIXED, REMEDIES, suggest_remedy
from ..results import write_json
from ..tables import format_table
from . import args as a


def _cost(text):
    """``KIND=COST`` (a kind of --remedy mixed and its positive cost) or ``nodes``."""
    if text == "nodes":
        return text
    kind, sep, value = text.partition("=")
    if not sep or kind not in REMEDIES:
        raise argparse.ArgumentTypeError(f"expected KIND=COST with KIND one of {', '.join(REMEDIES)}, or 'nodes'; "
                                         f"got {text!r}")
    try:
        return kind, params.positive(value, "")
    except PTQError as exc:
        raise argparse.ArgumentTypeError(f"{kind}: {exc}") from None


def _costs(values):
    if values is None:
        return None
    if "nodes" in values:
        if len(values) > 1:
            raise PTQError("--cost nodes counts every remedied node as 1; give it alone")
        return "nodes"
    kinds = [kind for kind, _ in values]
    twice = next((k for k in kinds if kinds.count(k) > 1), None)
    if twice is not None:  # the last would win in silence
        raise PTQError(f"--cost prices {twice!r} twice; give each kind once")
    return dict(values)


def _target(validator, option):
    """An argparse type of ``VALUE`` (every output) or ``OUTPUT=VALUE`` (an output or slice
    ``name=out[:, 4:]``, or ``default`` for the outputs not named; an output named ``default``
    is ``default=default``): ``(output or None, value)``.
    The value follows the last '=', which a slice's name has before it."""
    def parse(text):
        key, sep, value = text.rpartition("=")
        if sep and not key:
            raise argparse.ArgumentTypeError(f"expected VALUE or OUTPUT=VALUE, got {text!r}")
        try:
            return (key if sep else None), validator(value, "")
        except PTQError as exc:
            # the option takes every value after it, so MODEL and DATA written after it land here
            hint = "" if sep else ("; it takes every value that follows it: give MODEL and DATA before it, or write "
                                   f"{option}=VALUE")
            raise argparse.ArgumentTypeError(f"{key + ': ' if sep else ''}{exc}{hint}") from None
    return parse


def _targets(values, option):
    """The target the values of ``option`` give: one number, or ``{output: value}`` as the output
    checks take it (a value alone is the default of the outputs not named: ``""``, which
    unlike ``default`` no output of the model can be named)."""
    if values is None:
        return None
    if len(values) == 1 and values[0][0] is None:
        return values[0][1]
    keys = [key or "" for key, _ in values]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:  # the last would win in silence
        said = "two values alone (each the default)" if twice == "" else f"{twice!r} twice"
        raise PTQError(f"{option} gives {said}; give each output once")
    given = dict(zip(keys, (value for _, value in values)))
    try:  # its keys as the output checks refuse them ('default' beside a value alone, say)
        params.thresholds(given)
    except PTQError as exc:
        raise PTQError(f"{option} (a value alone is the default ''): {exc}") from None
    return given


def _evaluate(spec):
    """The function of ``--evaluate FILE.py:NAME`` (relative to the working folder) or
    ``module:NAME``."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise PTQError(f"--evaluate must be FILE.py:FUNCTION or module:FUNCTION, got {spec!r}")
    if target.endswith(".py") and not Path(target).is_file():
        raise PTQError(f"--evaluate file {target!r} does not exist; give FILE.py:FUNCTION relative to the working "
                       "folder")
    from ..contract import load_function

    return load_function(spec, Path.cwd(), "--evaluate")


def run(args):
    evaluate = _evaluate(args.evaluate) if args.evaluate else None
    if evaluate is None and args.min_ratio is not None:
        raise PTQError("--min-ratio is a share of the float model's task score; give --evaluate FILE.py:FUNCTION "
                       "with it")
    target_cosine, given = _targets(args.target_cosine, "--target-cosine"), _targets(args.target, "--target")
    if evaluate is not None and isinstance(given, dict):
        raise PTQError("with --evaluate, --target is one task score; per-output targets (OUTPUT=VALUE) are for an "
                       "output metric")
    if evaluate is None and args.target is None and args.metric != "cosine-similarity":
        raise PTQError(f"--metric {args.metric} needs --target VALUE (--target-cosine is for cosine similarity)")
    if evaluate is not None and args.target_cosine is not None:
        raise PTQError("with --evaluate the target is the task score: give --target SCORE or --min-ratio R, "
                       "not --target-cosine")
    if evaluate is None:
        metric = "cosine-similarity" if given is None else args.metric
        target = given if given is not None else (
            target_cosine if target_cosine is not None else params.DEFAULT_MIN_COSINE)
    else:
        metric, target = args.metric, given
    save_dir = None if args.no_save else args.save_dir
    result = suggest_remedy(a.engine(args), metric=metric, target=target, remedy=args.remedy,
                            output_node=args.output_node, data_num=args.data_num, budget=args.budget,
                            candidates=args.candidates, full_curve=args.full_curve,
                            per_channel_activations=args.per_channel_activations,
                            requantize_check=not args.no_requantize, save_dir=save_dir,
                            progress=not args.quiet, heldout=args.heldout, evaluate=evaluate,
                            min_ratio=args.min_ratio, costs=_costs(args.cost), search=args.search)
    name = result.objective.get("metric", result.metric)
    columns = ["nodes", "cost", "added", "kind", name] if result.remedy == MIXED else ["nodes", "added", name]
    rows = [{"nodes": p["nodes"], "cost": f"{p.get('cost', p['nodes']):g}", "added": p["added"] or "(baseline)",
             "kind": p.get("kind") or "", name: p["value"]} for p in result.curve]
    # files first, then the text: a reader of the output that goes away (| head) cost the files
    written = []
    if save_dir is not None:
        written += [write_json(result.settings, Path(save_dir) / f"remedy_{result.remedy}_settings.json"),
                    result.save(Path(save_dir) / f"remedy_{result.remedy}.json")] + ([result.png] if result.png else [])
        # the re-quantized models, with and without the settings: the fixed model is what a user wants next
        written += [m[k] for m in (result.measured, result.producer_measured) if m
                    for k in ("model", "baseline_model") if m.get(k)]
    if args.json:
        written.append(result.save(args.json))
    print("search curve on the search samples:")
    print(format_table(rows, columns))
    print(result.summary())
    for path in written:
        print(f"wrote {path}")
    why = result.failure()
    if why:
        print(f"exit 1: {why}")  # last, so that a log cut to its tail still says why
        return 1
    where = {"held-out": "the held-out data", "confirmation": "the confirmation samples"}.get(
        result.judged_on, "the calibration data")
    chose = (", which chose part of this set (nodes added and pruned on them): confirm it on data that chose "
             "nothing" if result.judge_chose else "")
    print(f"exit 0: the target holds on {where}{chose}; {result.judged_by()}")
    return 0


def configure(p):
    a.add_model(p)
    g = p.add_mutually_exclusive_group()
    per = ("; or per output, OUTPUT=VALUE for each (an output or a slice 'name=out[:, 4:]'; a value alone or "
           "default=VALUE for the outputs not named, which are left out without one; an output named 'default' is "
           "default=default=VALUE), as a contract's outputs: each output must reach its own")
    g.add_argument("--target-cosine", nargs="+", action=a.Listed, type=_target(params.cosine, "--target-cosine"),
                   default=None, metavar="[OUTPUT=]C", help=f"cosine similarity the outputs must reach{per}. Default: 0.99")
    g.add_argument("--target", nargs="+", action=a.Listed, type=_target(params.number, "--target"), default=None,
                   metavar="[OUTPUT=]V",
                   help=f"value of --metric the outputs must reach (instead of --target-cosine){per}; with "
                        "--evaluate, the task score the quantized model must reach")
    a.add_metric(p, "metric for --target; with --evaluate, the output metric that ranks nodes")
    p.add_argument("--heldout", "--holdout", default=None, metavar="DIR",
                   help="held-out data (layouts of DATA): a set is accepted only when it meets the target there. "
                        "Default: the calibration samples the search did not choose on (beyond --data-num, "
                        "else every third)")
    p.add_argument("--evaluate", default=None, metavar="FILE.py:FUNCTION",
                   help="task metric evaluate(run, data) -> float, higher is better (the accuracy check's "
                        "contract), called on the parts of the calibration data the search uses and on --heldout "
                        "(data.path and data.indices name the samples, for labels); the target is then --target "
                        "SCORE or --min-ratio. Default: none")
    p.add_argument("--min-ratio", type=a.ratio, default=None, metavar="R",
                   help="with --evaluate: the quantized score must reach R x the float model's on the same "
                        "samples. Default: 0.99 when --target is not given")
    p.add_argument("--remedy", default="float", choices=REMEDIES + (MIXED,),
                   help="keep nodes in float, raise them to 16 bit, quantize them per channel, or choose per node "
                        "(mixed, see --cost). Default: float")
    shown = " ".join(f"{k}={v:g}" for k, v in DEFAULT_COSTS.items())
    p.add_argument("--cost", nargs="+", action=a.Listed, type=_cost, default=None, metavar="KIND=COST",
                   help="with --remedy mixed: the kinds a node may take and the cost of each (bytes per element "
                        "by default), or 'nodes' for the fewest non-int8 nodes. Default: " + shown)
    p.add_argument("--search", default="refine", choices=("refine", "greedy"),
                   help="refine: greedy on the ranking, then local moves (drop, drop a pair, swap, cheaper kind) "
                        "that handle interacting nodes; greedy: the ranking order and pruning only. Default: refine")
    p.add_argument("--budget", type=a.seconds, default=None, metavar="SECONDS",
                   help="stop after this long and report the best result so far. Default: no limit")
    a.add_output_node(p)
    p.add_argument("--candidates", nargs="+", action=a.Listed, default=None, metavar="NODE",
                   help="consider only these calibration or normal nodes. Default: every eligible node that the "
                        "quantizer which made the model can remedy in its own terms")
    p.add_argument("--full-curve", action="store_true",
                   help="keep adding nodes after the target is met, for the whole curve")
    p.add_argument("--per-channel-activations", action="store_true",
                   help="with --remedy per-channel, also simulate activations per channel (onnxruntime cannot "
                        "emit it)")
    p.add_argument("--no-requantize", action="store_true",
                   help="skip re-quantizing the float model to measure the settings")
    a.add_save_dir(p)
    p.add_argument("--no-save", action="store_true", help="write nothing")
    a.add_json(p)


COMMANDS = [a.Command("suggest", "find the cheapest set of nodes to keep in float, raise to 16 bit or quantize per "
                      "channel so the model meets a target on held-out data; print onnxruntime settings",
                      configure, run)]

"""``ptq-debug``: the command line face of the analyses, mirroring the seed's hmct-debugger.

Each module of this package owns its subcommands (a list ``COMMANDS`` of
:class:`~pytest_ptq.cli.args.Command`); :mod:`.args` holds the options they share. No
analysis imports this package. Bad input prints one sentence on stderr and exits 2, with
no traceback; every output path is checked against every input before the command runs
(:func:`~pytest_ptq.cli.args.check_outputs`), and a closed pipe ends the command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
import warnings

from .. import __version__, guard, termination
from ..errors import PTQError, PTQWarning, as_sentence
from .args import STDOUT, check_outputs

# Exit status of a command whose reader went away, as a shell reports a tool SIGPIPE ended.
BROKEN_PIPE = 128 + 13
# Exit status of an error of this tool's own (a bug), apart from 1, which a check's finding
# takes (check-data, stages, suggest), so that CI can tell a finding from a crash.
INTERNAL_ERROR = 3
EXIT_STATUS = ("exit status: 0 done (runall, rankings and plots whatever they find); 1 a check found a problem "
               "(check-data an error, stages a stage below its threshold, suggest a target missed); 2 bad input or "
               "options; 3 an error of ptq-debug itself (please report it with its traceback); 130 interrupted; "
               "143 terminated (SIGTERM); 141 the reader of standard output went away")

# The modules whose COMMANDS make up ptq-debug, in the order `ptq-debug -h` lists them.
_MODULES = ("sensitivity", "curves", "distribution", "runall", "remedy", "stages", "datacheck", "listing")


def commands():
    """Every :class:`~pytest_ptq.cli.args.Command`, in help order."""
    out = []
    for name in _MODULES:
        out += importlib.import_module(f"{__name__}.{name}").COMMANDS
    return out


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, like every other error of ptq-debug."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} -h\n")


def build_parser():
    # allow_abbrev off: a prefix of a long option matched another one in silence (-n on
    # plot-acc-error read as -nq, the opposite configuration)
    parser = Parser(
        prog="ptq-debug", allow_abbrev=False, epilog=EXIT_STATUS,
        description="Find why a post-training-quantized ONNX (QDQ) model lost accuracy.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in commands():
        p = subs.add_parser(cmd.name, help=cmd.help, description=cmd.help, allow_abbrev=False, epilog=EXIT_STATUS)
        cmd.configure(p)
        p.set_defaults(func=cmd.run)
    return parser


def _action(category):
    """What the warning filters in force do with ``category`` (the first filter of any message
    and module that takes it)."""
    for action, message, cat, module, _line in warnings.filters:
        if issubclass(category, cat) and not getattr(message, "pattern", "") and not getattr(module, "pattern", ""):
            return action
    return warnings.defaultaction


def main(argv=None):
    for stream in (sys.stdout, sys.stderr):
        # a node or file name the terminal's encoding cannot show prints escaped, not as a traceback
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # SIGTERM (a CI time limit) cleans up as Ctrl-C does: its default left temporary folders
    with termination.as_interrupt():
        return _run(args)


def _run(args):
    try:
        inputs = check_outputs(args)
        with guard.protecting(inputs), guard.one_command(), warnings.catch_warnings():
            warnings.showwarning = _warning_printer(args.command)
            # the tool's own warnings are lines of its output: PYTHONWARNINGS=error made one an
            # "internal error" (ignoring them stays the user's choice)
            if _action(PTQWarning) == "error":
                warnings.simplefilter("default", PTQWarning)
            if getattr(args, "json", None) != STDOUT:
                return args.func(args) or 0
            return _json_to_stdout(args)
    except PTQError as exc:
        print(f"ptq-debug {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
    except termination.Terminated:
        print(f"ptq-debug {args.command}: terminated (SIGTERM) before it finished; run it again to the "
              "end", file=sys.stderr)
        return termination.EXIT_STATUS
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug of ours: its traceback, then one line, and a status of its own
        if isinstance(exc, Warning) and as_sentence(exc) is not None:  # one of ours, an error by a filter the user set
            print(f"ptq-debug {args.command}: error: {as_sentence(exc)}", file=sys.stderr)
            return 2
        import traceback

        traceback.print_exc()
        print(f"ptq-debug {args.command}: internal error ({type(exc).__name__}: {exc}); this is a bug in "
              f"pytest-ptq {__version__}: please report it with the traceback above", file=sys.stderr)
        return INTERNAL_ERROR


def _warning_printer(command):
    """Python's warning printer with this tool's own warnings as one line each, like its
    errors (the default adds a file, a line number and a line of our source)."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not category.__module__.startswith("pytest_ptq"):
            return default(message, category, filename, lineno, file, line)
        print(f"ptq-debug {command}: warning: {message}", file=sys.stderr)

    return show


def _json_to_stdout(args):
    """Run a command whose JSON goes to standard output (``--json -``): its tables and notes go
    to standard error, so that a pipe reads JSON alone, written once the command succeeded."""
    out, args.json = sys.stdout, io.StringIO()  # write_json names it "standard output"
    with contextlib.redirect_stdout(sys.stderr):
        code = args.func(args) or 0
    out.write(args.json.getvalue())
    return code


def _silence_stdout():
    """After the reader of stdout went away (``ptq-debug list-nodes m.onnx | head``): point
    stdout at /dev/null, so that the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # in-process (captured) stdout has no descriptor
        pass

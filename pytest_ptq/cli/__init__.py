"""``ptq-debug``: the command line face of the analyses, mirroring the seed's hmct-debugger.

Each module of this package owns its subcommands (a list ``COMMANDS`` of
:class:`~pytest_ptq.cli.args.Command`); :mod:`.args` holds the options they share. No
analysis imports this package. Bad input prints one sentence on stderr and exits 2, with
no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__
from ..errors import PTQError

# The modules whose COMMANDS make up ptq-debug, in the order `ptq-debug -h` lists them.
_MODULES = ("sensitivity", "curves", "distribution", "runall", "remedy", "stages", "datacheck", "listing")


def commands():
    """Every :class:`~pytest_ptq.cli.args.Command`, in help order."""
    out = []
    for name in _MODULES:
        out += importlib.import_module(f"{__name__}.{name}").COMMANDS
    return out


def build_parser():
    parser = argparse.ArgumentParser(
        prog="ptq-debug",
        description="Find why a post-training-quantized ONNX (QDQ) model lost accuracy.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in commands():
        p = subs.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.configure(p)
        p.set_defaults(func=cmd.run)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except PTQError as exc:
        print(f"ptq-debug {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

"""The ``gefen-conformance`` command: its parser, every command on it, and :func:`main`.

Each command module registers its commands with a ``register(subparsers)`` function that sets
``handler``, a function of the parsed arguments returning the exit status (:class:`ExitCode`); a
handler raises :class:`~gefen_conformance.cli.usage.UsageError` for a command line that cannot run
(one line, exit 4). A command that takes pytest arguments after ``--`` sets ``passthrough=True``;
they arrive as ``args.pytest_args``. Every usage error exits 4, argparse's included (SPEC 4.4.13).
"""

from __future__ import annotations

import argparse
import sys

from gefen_conformance.cli import certificates, certify, golden, repro, vectors
from gefen_conformance.cli.usage import PROG, Parser, UsageError, add_version, error
from gefen_conformance.exit_codes import ExitCode

#: the command modules, in the order ``--help`` lists their commands
COMMANDS = (certify, golden, certificates, repro, vectors)


def build_parser() -> argparse.ArgumentParser:
    """The ``gefen-conformance`` command's parser, every command and option on it."""
    parser = Parser(
        prog=PROG,
        description="The Gefen conformance suite: certify an implementation, render and "
        "compare certificates, golden checkpoints.",
        epilog=f"`{PROG} COMMAND --help` describes each command, its arguments and its exit statuses.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(parser)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(subparsers)
    return parser


def _unknown_options(parser, args, unknown: list[str]) -> None:
    """Words argparse did not take: TEST_IDs given between options join ``args.tests``; an option
    of a command that hands pytest its arguments is pointed to ``--``; anything else is the usual
    usage error (exit 4)."""
    options = [word for word in unknown if word.startswith("-")]
    if getattr(args, "options_for_pytest", False):
        if options:
            raise UsageError(
                f"unrecognized option {options[0]}: pytest's options go after `--` "
                f"({PROG} {args.command} [OPTIONS] [TEST_ID ...] -- {options[0]} ...)"
            )
        args.tests = list(args.tests) + unknown
        return
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")


def main(argv=None) -> int:
    """Run ``gefen-conformance`` on ``argv`` (default: this process's arguments); its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    try:
        _unknown_options(parser, args, unknown)
        if passthrough and not getattr(args, "passthrough", False):
            raise UsageError(f"arguments after `--` are only for `{PROG} certify`")
        args.pytest_args = passthrough
        return args.handler(args)
    except UsageError as refused:
        error(" ".join(filter(None, (args.command, getattr(args, "action", None)))), str(refused))
        return ExitCode.USAGE_ERROR

"""What every ``gefen-conformance`` command line shares (SPEC 4.4.13): a usage error is exit status 4
(argparse's own errors included), ``--version``, how a command is registered, and the exit-status
tables that ``--help`` prints.

The suite run's table is generated from :data:`gefen_conformance.certificate.build.EXIT_STATUS`
(:func:`suite_statuses`); docs/certificates.md shows the same table (:func:`suite_statuses_markdown`,
kept equal by ``tests/test_cli_help.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gefen_conformance.certificate.build import exit_status_rows
from gefen_conformance.exit_codes import ExitCode

PROG = "gefen-conformance"


class UsageError(Exception):
    """A command line that cannot run: one line on stderr naming the problem, exit status 4."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors exit with status 4, like every other refusal of
    the command line (SPEC 4.4.9): ``--nproc-per-node abc`` and ``--nproc-per-node 0`` alike."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE_ERROR, f"{self.prog}: error: {message}\n")


def add_command(subparsers, name: str, handler, *, statuses=None, raw: bool = True, **kwargs):
    """Register the command ``name`` (``help``, ``description`` ... as ``add_parser`` takes them)
    that ``handler`` runs; ``statuses``, ``(status, meaning)`` rows, become its epilog. ``raw``
    keeps the description's and epilog's line breaks. Returns the command's parser."""
    if statuses is not None:
        kwargs["epilog"] = statuses_text(statuses)
    if raw:
        kwargs["formatter_class"] = argparse.RawDescriptionHelpFormatter
    parser = subparsers.add_parser(name, **kwargs)
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser


def error(command: str, message: str) -> None:
    """One line on stderr: the command, then what stopped it."""
    print(f"{PROG} {command}: {message}" if command else f"{PROG}: {message}", file=sys.stderr)


def version() -> str:
    """``gefen-conformance 0.1.0 (PATH)``: the installed distribution and where it is loaded from."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        number = dist_version("gefen-conformance")
    except PackageNotFoundError:
        number = "(not installed)"
    return f"{PROG} {number} ({Path(__file__).resolve().parents[1]})"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=version(), help="print the version and exit")


def table(rows, width: int = 100) -> str:
    """``(status, meaning)`` rows as indented plain text for an epilog, wrapped at ``width``."""
    import textwrap

    return "\n".join(
        textwrap.fill(
            meaning,
            width,
            initial_indent=f"  {int(status):>2}  ",
            subsequent_indent=" " * 6,
            break_on_hyphens=False,
        )
        for status, meaning in rows
    )


def _verdicts(verdicts, code: bool) -> str:
    names = [f"`{v}`" if code else v for v in verdicts]
    return ", or ".join(names)


def suite_statuses(code: bool = False) -> list:
    """``(status, meaning)`` of a suite run (``certify``, ``pytest --impl``), from EXIT_STATUS."""
    rows = []
    for status, verdicts, meaning in exit_status_rows():
        text = _verdicts(verdicts, code)
        if meaning:
            text = f"{text}: {meaning}" if text else meaning
        rows.append((int(status), text))
    return rows


def suite_statuses_text() -> str:
    return "exit status (SPEC 4.4.9; the certificate records it as run.exit_status):\n" + table(
        suite_statuses()
    )


def suite_statuses_markdown() -> str:
    """The same table as Markdown, as docs/certificates.md shows it."""
    lines = ["| status | verdict |", "|---:|---|"]
    lines += [f"| {status} | {text} |" for status, text in suite_statuses(code=True)]
    return "\n".join(lines)


def statuses_text(rows) -> str:
    return "exit status:\n" + table(rows)

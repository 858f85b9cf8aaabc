"""What every ``gefen-conformance`` command line shares (SPEC 4.4.13): a usage error is exit status 4
(argparse's own errors included), ``--version``, and the exit-status tables that ``--help`` prints.

The suite run's table is generated from :data:`gefen_conformance.certificate.build.EXIT_STATUS`
(:func:`suite_statuses`); docs/certificates.md shows the same table (:func:`suite_statuses_markdown`,
kept equal by ``tests/test_cli_help.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gefen_conformance.certificate.build import USAGE_ERROR, exit_status_rows

PROG = "gefen-conformance"

#: ``report``'s exit statuses (SPEC 4.5.1)
REPORT_STATUSES = (
    (0, "the report was written"),
    (
        2,
        "the certificate cannot be read: not JSON, schema 1 or an unknown schema (one line, nothing written)",
    ),
    (
        USAGE_ERROR,
        "usage error: an unknown option, an --out that cannot be written or whose extension "
        "is not .md/.markdown/.html/.htm (refused before the certificate is read)",
    ),
)
#: ``diff``'s exit statuses (SPEC 4.5.4)
DIFF_STATUSES = (
    (0, "NEW did not regress"),
    (
        1,
        "NEW regressed: a new failure, a worse verdict, a margin grown past the factor or that reached "
        "the threshold",
    ),
    (2, "a certificate cannot be read: not JSON, schema 1 or an unknown schema"),
    (USAGE_ERROR, "usage error: an unknown option or a bad value"),
)
#: ``golden``'s exit statuses (SPEC 4.4.9, 4.4.10)
GOLDEN_STATUSES = (
    (0, "verified (check, compare) or written (generate)"),
    (1, "problems found"),
    (
        USAGE_ERROR,
        "usage error: an implementation that cannot be loaded, a DIR that is not there or "
        "cannot be written, an unknown option",
    ),
)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors exit with status 4, like every other refusal of
    the command line (SPEC 4.4.9): ``--nproc-per-node abc`` and ``--nproc-per-node 0`` alike."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def version() -> str:
    """``gefen-conformance 0.1.0 (PATH)``: the installed distribution and where it is loaded from."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        number = dist_version("gefen-conformance")
    except PackageNotFoundError:
        number = "(not installed)"
    return f"{PROG} {number} ({Path(__file__).resolve().parent})"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=version(), help="print the version and exit")


def table(rows, width: int = 100) -> str:
    """``(status, meaning)`` rows as indented plain text for an epilog, wrapped at ``width``."""
    import textwrap

    return "\n".join(
        textwrap.fill(
            meaning,
            width,
            initial_indent=f"  {status:>2}  ",
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
        rows.append((status, text))
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

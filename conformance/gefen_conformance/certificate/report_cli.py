"""``gefen-conformance report`` and ``gefen-conformance diff`` (SPEC 4.5).

    gefen-conformance report CERT [--format md|html] [--out PATH]
    gefen-conformance diff OLD NEW [--format text|md] [--margin-factor F] [--margin-floor F]
    [--margin-threshold F]

:func:`add_subcommands` registers both on ``gefen-conformance``'s subparsers; each sets
``args.handler``, a function of the parsed arguments returning the exit status. :func:`main` runs
them on their own (``python -m conformance.report_cli``).

``report`` writes the certificate as Markdown or one self-contained HTML page
(:mod:`gefen_conformance.certificate.report`) to PATH, or to stdout without ``--out``; PATH's
extension chooses the format (:data:`EXTENSIONS`), and a ``--format`` that disagrees with it, or
any other extension, is refused (SPEC 4.5.1). ``diff`` prints what changed from OLD to NEW
(:mod:`gefen_conformance.certificate.diff`). Exit status: 0 (report written; diff: no regression),
1 (diff: NEW regressed), 2 (a certificate that cannot be read, schema 1 or an unknown schema: one
line on stderr, nothing written), 4 (a usage error, argparse's included; ``--out`` that cannot be
written or has an unknown extension: refused before anything is read, SPEC 4.4.10, 4.4.13).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from gefen_conformance.certificate import diff as certificate_diff
from gefen_conformance.certificate import report
from gefen_conformance.certificate.read import CertificateError, load
from gefen_conformance.cli_usage import DIFF_STATUSES, PROG, REPORT_STATUSES, Parser, statuses_text

#: the format each ``--out`` extension holds
EXTENSIONS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html"}
USAGE_ERROR = 4


def _positive(minimum: float, *, strict: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or not (value > minimum if strict else value >= minimum):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'>' if strict else '>='} {minimum:g}, got {text}"
            )
        return value

    return parse


def add_subcommands(subparsers) -> None:
    """Register ``report`` and ``diff`` on an ``argparse`` subparsers object."""
    raw = argparse.RawDescriptionHelpFormatter
    rep = subparsers.add_parser(
        "report",
        help="render a certificate as Markdown or a self-contained HTML page",
        description="Render a certificate for people, what did not pass first (SPEC 4.5.1).",
        epilog=statuses_text(REPORT_STATUSES),
        formatter_class=raw,
    )
    rep.add_argument(
        "certificate", type=Path, metavar="CERT", help="a certificate (JSON) that a suite run wrote"
    )
    rep.add_argument(
        "--format",
        choices=("md", "html"),
        default=None,
        help="md (default) or html; with --out, its extension decides and --format must agree",
    )
    rep.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH",
        help="file to write: .md or .markdown (Markdown), .html or .htm (HTML); default: stdout",
    )
    rep.set_defaults(handler=run_report)
    dif = subparsers.add_parser(
        "diff",
        help="compare two certificates; exit 1 when NEW regressed",
        description="What changed from OLD to NEW, and whether NEW regressed (SPEC 4.5.3, 4.5.4).",
        epilog=statuses_text(DIFF_STATUSES),
        formatter_class=raw,
    )
    dif.add_argument("old", type=Path, metavar="OLD", help="the baseline certificate (the published one)")
    dif.add_argument("new", type=Path, metavar="NEW", help="the certificate of the run to judge")
    dif.add_argument(
        "--format",
        choices=("text", "md"),
        default="text",
        help="text (default) or md: for a pull-request comment",
    )
    dif.add_argument(
        "--margin-factor",
        type=_positive(1.0, strict=False),
        default=certificate_diff.DEFAULT_MARGIN_FACTOR,
        metavar="F",
        help="flag a margin that grew by more than this factor (default %(default)s)",
    )
    dif.add_argument(
        "--margin-floor",
        type=_positive(0.0, strict=False),
        default=certificate_diff.DEFAULT_MARGIN_FLOOR,
        metavar="F",
        help="margins under this share of their bound count as this much when judging growth "
        "(default %(default)s)",
    )
    dif.add_argument(
        "--margin-threshold",
        type=_positive(0.0, strict=True),
        default=certificate_diff.DEFAULT_MARGIN_THRESHOLD,
        metavar="F",
        help="flag a passing comparison using at least this share of its bound (default %(default)s)",
    )
    dif.set_defaults(handler=run_diff)


def output_format(out: Path | None, chosen: str | None) -> tuple[str, str]:
    """``(format, "")`` for ``report``'s ``--out`` and ``--format``, or ``("", why)`` when they
    are refused: an extension that is not one of :data:`EXTENSIONS`, or a ``--format`` that
    disagrees with it (a PDF or a .txt would silently hold Markdown)."""
    if out is None:
        return chosen or "md", ""
    implied = EXTENSIONS.get(out.suffix.lower())
    if implied is None:
        known = ", ".join(EXTENSIONS)
        return "", f"--out {out}: unknown extension {out.suffix or '(none)'!r}; report writes {known}"
    if chosen is not None and chosen != implied:
        return "", f"--out {out} holds {implied}, not --format {chosen}; name the file {out.stem}.{chosen}"
    return implied, ""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_report(args) -> int:
    fmt, why = output_format(args.out, args.format)
    if why:
        print(f"{PROG} report: {why}", file=sys.stderr)
        return USAGE_ERROR
    if args.out is not None:
        from gefen_conformance.certificate.outputs import problem

        why = problem(args.out)
        if why:  # refused before anything is read or rendered (SPEC 4.4.10)
            print(f"{PROG} report: --out {args.out}: {why}", file=sys.stderr)
            return USAGE_ERROR
    try:
        cert = load(args.certificate)
    except CertificateError as exc:
        print(f"gefen-conformance report: {exc}", file=sys.stderr)
        return 2
    text = report.render(cert, fmt, source=args.certificate.name)
    if args.out is None:
        sys.stdout.write(text)
    else:
        _write(args.out, text)
        print(f"wrote {args.out} ({fmt}, verdict {cert['verdict']})")
    return 0


def run_diff(args) -> int:
    try:
        old, new = load(args.old), load(args.new)
    except CertificateError as exc:
        print(f"gefen-conformance diff: {exc}", file=sys.stderr)
        return 2
    diff = certificate_diff.compare(
        old,
        new,
        margin_factor=args.margin_factor,
        margin_floor=args.margin_floor,
        margin_threshold=args.margin_threshold,
    )
    sys.stdout.write(certificate_diff.render(diff, old, new, args.format, str(args.old), str(args.new)))
    return 1 if diff.regressions else 0


def main(argv=None) -> int:
    parser = Parser(prog=PROG)
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())

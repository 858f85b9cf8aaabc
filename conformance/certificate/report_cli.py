"""``gefen-conformance report`` and ``gefen-conformance diff`` (SPEC 4.5).

    gefen-conformance report CERT [--format md|html] [--out PATH]
    gefen-conformance diff OLD NEW [--format text|md] [--margin-factor F] [--margin-floor F] [--margin-threshold F]

:func:`add_subcommands` registers both on ``gefen-conformance``'s subparsers; each sets
``args.handler``, a function of the parsed arguments returning the exit status. :func:`main` runs
them on their own (``python -m conformance.report_cli``).

``report`` writes the certificate as Markdown or one self-contained HTML page
(:mod:`conformance.report`) to PATH, or to stdout without ``--out``; the format defaults to
``html`` when PATH ends in ``.html``/``.htm``, else ``md``. ``diff`` prints what changed from OLD
to NEW (:mod:`conformance.certificate_diff`). Exit status: 0 (report written; diff: no
regression), 1 (diff: NEW regressed), 2 (a certificate that cannot be read, schema 1 or an unknown
schema: one line on stderr, nothing written), 4 (``--out`` cannot be written: refused before
anything is read, SPEC 4.4.10).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from gefen_conformance.certificate import diff as certificate_diff, report
from gefen_conformance.certificate.read import CertificateError, load


def _positive(minimum: float, *, strict: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or not (value > minimum if strict else value >= minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {minimum:g}, got {text}")
        return value

    return parse


def add_subcommands(subparsers) -> None:
    """Register ``report`` and ``diff`` on an ``argparse`` subparsers object."""
    rep = subparsers.add_parser("report", help="render a certificate as Markdown or a self-contained HTML page")
    rep.add_argument("certificate", type=Path, metavar="CERT")
    rep.add_argument("--format", choices=("md", "html"), default=None, help="default: html when --out ends in .html, else md")
    rep.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    rep.set_defaults(handler=run_report)
    dif = subparsers.add_parser("diff", help="compare two certificates; exit 1 when NEW regressed")
    dif.add_argument("old", type=Path, metavar="OLD")
    dif.add_argument("new", type=Path, metavar="NEW")
    dif.add_argument("--format", choices=("text", "md"), default="text", help="md: for a pull-request comment")
    dif.add_argument("--margin-factor", type=_positive(1.0, strict=False), default=certificate_diff.DEFAULT_MARGIN_FACTOR,
                     help="flag a margin that grew by more than this factor (default %(default)s)")
    dif.add_argument("--margin-floor", type=_positive(0.0, strict=False), default=certificate_diff.DEFAULT_MARGIN_FLOOR,
                     help="margins under this share of their bound count as this much when judging growth (default %(default)s)")
    dif.add_argument("--margin-threshold", type=_positive(0.0, strict=True), default=certificate_diff.DEFAULT_MARGIN_THRESHOLD,
                     help="flag a passing comparison using at least this share of its bound (default %(default)s)")
    dif.set_defaults(handler=run_diff)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_report(args) -> int:
    if args.out is not None:
        from gefen_conformance.certificate.outputs import problem

        why = problem(args.out)
        if why:  # refused before anything is read or rendered (SPEC 4.4.10)
            print(f"gefen-conformance report: --out {args.out}: {why}", file=sys.stderr)
            return 4
    try:
        cert = load(args.certificate)
    except CertificateError as exc:
        print(f"gefen-conformance report: {exc}", file=sys.stderr)
        return 2
    fmt = args.format or ("html" if args.out is not None and args.out.suffix.lower() in (".html", ".htm") else "md")
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
    diff = certificate_diff.compare(old, new, margin_factor=args.margin_factor, margin_floor=args.margin_floor,
                                    margin_threshold=args.margin_threshold)
    sys.stdout.write(certificate_diff.render(diff, old, new, args.format, str(args.old), str(args.new)))
    return 1 if diff.regressions else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gefen-conformance")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())

"""What a kernel team does with certificates after a run: ``report``, ``diff``, ``merge``, ``verify``
and ``expectations`` (SPEC 4.4.14-4.4.16, 4.5).

    gefen-conformance report CERT [--format md|html] [--out PATH]
    gefen-conformance diff OLD NEW [--format text|md] [--margin-factor F] [--margin-floor F]
    [--margin-threshold F]
    gefen-conformance merge A.json B.json ... --out C.json
    gefen-conformance verify CERT
    gefen-conformance expectations CERT [--out FILE]

``report`` writes the certificate as Markdown or one self-contained HTML page
(:mod:`gefen_conformance.certificate.report`) to PATH, or to stdout without ``--out``; PATH's
extension chooses the format (:data:`EXTENSIONS`), and a ``--format`` that disagrees with it, or
any other extension, is refused (SPEC 4.5.1). ``diff`` prints what changed from OLD to NEW
(:mod:`gefen_conformance.certificate.diff`). ``merge`` writes one certificate of several shards or
reruns (refused, exit 4, when they conflict: another suite, implementation, provenance, profile or
expectations file, or one test with two outcomes); its exit status is its verdict's, as
``certify``'s. ``verify`` re-derives a certificate's verdict from its records and checks its
integrity and suite hash: exit status its verdict's when it verifies, 3 when it does not.
``expectations`` writes a starting expectations file from a certificate's failures (to stdout
without ``--out``). Every command exits 2 for a certificate that cannot be read (schema 1 or an
unknown schema included: one line on stderr, nothing written) and 4 for a usage error; an
``--out`` that cannot be written is refused before anything is read (SPEC 4.4.10, 4.4.13).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gefen_conformance.certificate import build, rules
from gefen_conformance.certificate import diff as certificate_diff
from gefen_conformance.certificate.read import CertificateError, load
from gefen_conformance.cli.usage import add_command, error
from gefen_conformance.exit_codes import ExitCode

#: the format each ``--out`` extension holds
EXTENSIONS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html"}

#: ``report``'s exit statuses (SPEC 4.5.1)
REPORT_STATUSES = (
    (ExitCode.OK, "the report was written"),
    (
        ExitCode.UNREADABLE,
        "the certificate cannot be read: not JSON, schema 1 or an unknown schema (one line, nothing written)",
    ),
    (
        ExitCode.USAGE_ERROR,
        "usage error: an unknown option, an --out that cannot be written or whose extension "
        "is not .md/.markdown/.html/.htm (refused before the certificate is read)",
    ),
)
#: ``diff``'s exit statuses (SPEC 4.5.4)
DIFF_STATUSES = (
    (ExitCode.OK, "NEW did not regress"),
    (
        ExitCode.FAILED,
        "NEW regressed: a new failure, a worse verdict, a margin grown past the factor or that reached "
        "the threshold",
    ),
    (ExitCode.UNREADABLE, "a certificate cannot be read: not JSON, schema 1 or an unknown schema"),
    (ExitCode.USAGE_ERROR, "usage error: an unknown option or a bad value"),
)
#: ``diff``'s margin options: option, smallest value, whether the value must exceed it, default, help
MARGIN_OPTIONS = (
    (
        "--margin-factor",
        1.0,
        False,
        certificate_diff.DEFAULT_MARGIN_FACTOR,
        "flag a margin that grew by more than this factor (default %(default)s)",
    ),
    (
        "--margin-floor",
        0.0,
        False,
        certificate_diff.DEFAULT_MARGIN_FLOOR,
        "margins under this share of their bound count as this much when judging growth "
        "(default %(default)s)",
    ),
    (
        "--margin-threshold",
        0.0,
        True,
        certificate_diff.DEFAULT_MARGIN_THRESHOLD,
        "flag a passing comparison using at least this share of its bound (default %(default)s)",
    ),
)


def _at_least(minimum: float, *, strict: bool):
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


def register(subparsers) -> None:
    """``report`` and ``diff``, then ``merge``, ``verify`` and ``expectations``."""
    report = add_command(
        subparsers,
        "report",
        run_report,
        help="render a certificate as Markdown or a self-contained HTML page",
        description="Render a certificate for people, what did not pass first (SPEC 4.5.1).",
        statuses=REPORT_STATUSES,
    )
    report.add_argument(
        "certificate", type=Path, metavar="CERT", help="a certificate (JSON) that a suite run wrote"
    )
    report.add_argument(
        "--format",
        choices=("md", "html"),
        default=None,
        help="md (default) or html; with --out, its extension decides and --format must agree",
    )
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH",
        help="file to write: .md or .markdown (Markdown), .html or .htm (HTML); default: stdout",
    )
    diff = add_command(
        subparsers,
        "diff",
        run_diff,
        help="compare two certificates; exit 1 when NEW regressed",
        description="What changed from OLD to NEW, and whether NEW regressed (SPEC 4.5.3, 4.5.4).",
        statuses=DIFF_STATUSES,
    )
    diff.add_argument("old", type=Path, metavar="OLD", help="the baseline certificate (the published one)")
    diff.add_argument("new", type=Path, metavar="NEW", help="the certificate of the run to judge")
    diff.add_argument(
        "--format",
        choices=("text", "md"),
        default="text",
        help="text (default) or md: for a pull-request comment",
    )
    for option, minimum, strict, default, help_ in MARGIN_OPTIONS:
        diff.add_argument(
            option, type=_at_least(minimum, strict=strict), default=default, metavar="F", help=help_
        )
    _register_ci(subparsers)


def _register_ci(subparsers) -> None:
    merge = add_command(
        subparsers,
        "merge",
        run_merge,
        raw=False,
        help="merge shards or reruns of one certification into one certificate (SPEC 4.4.16)",
        description="One certificate of several: conformant only if together they cover the whole suite "
        "with one suite hash and one implementation provenance; anything else is partial, naming what is "
        "missing; a conflict (another suite, implementation, profile or expectations file, or one test with "
        "two outcomes) is refused. Exit status: the merged verdict's (0 conformant, 1 not-conformant, 2 "
        "incomplete, 6 partial, 7 inconclusive), 4 usage error or conflict.",
    )
    merge.add_argument("certificates", nargs="+", type=Path, metavar="CERT")
    merge.add_argument("--out", required=True, type=Path, metavar="PATH", help="the merged certificate")
    verify = add_command(
        subparsers,
        "verify",
        run_verify,
        raw=False,
        help="re-derive a certificate's verdict and check its integrity and suite (SPEC 4.4.15)",
        description="Re-derive the verdict, summary, rules section and clause table from the per-test "
        "records, check each record against its own margins, the integrity digest, and the suite hash "
        "against the installed suite; report the implementation's provenance (a dirty checkout "
        "named), the world sizes, launchers and devices run, and the expectations used. Exit status: "
        "the verdict's (as certify's) when it verifies, 3 when it does not, 2 unreadable, 4 usage error.",
    )
    verify.add_argument("certificate", type=Path, metavar="CERT")
    expectations = add_command(
        subparsers,
        "expectations",
        run_expectations,
        raw=False,
        help="write a starting expectations file from a certificate's failures (SPEC 4.4.14)",
        description="An xfail entry for every failed or errored test of CERT, with its reason, "
        "conditioned on the certificate's device, torch release, launcher and world size. Exit status: "
        "0 written, 2 unreadable, 4 usage error.",
    )
    expectations.add_argument("certificate", type=Path, metavar="CERT")
    expectations.add_argument(
        "--out", type=Path, default=None, metavar="FILE", help="where to write (default stdout)"
    )


# ------------------------------------------------------------------------------------ report, diff


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


def run_report(args) -> ExitCode:
    from gefen_conformance.certificate import outputs, report

    fmt, why = output_format(args.out, args.format)
    if not why and args.out is not None:
        why = outputs.problem(args.out)  # refused before anything is read or rendered (SPEC 4.4.10)
        why = why and f"--out {args.out}: {why}"
    if why:
        error("report", why)
        return ExitCode.USAGE_ERROR
    try:
        cert = load(args.certificate)
    except CertificateError as exc:
        error("report", str(exc))
        return ExitCode.UNREADABLE
    text = report.render(cert, fmt, source=args.certificate.name)
    if args.out is None:
        sys.stdout.write(text)
    else:
        outputs.write_text(args.out, text)
        print(f"wrote {args.out} ({fmt}, verdict {cert['verdict']})")
        print(rules.line(cert))
        print(build.tier_line(cert))
    return ExitCode.OK


def run_diff(args) -> ExitCode:
    try:
        old, new = load(args.old), load(args.new)
    except CertificateError as exc:
        error("diff", str(exc))
        return ExitCode.UNREADABLE
    diff = certificate_diff.compare(
        old,
        new,
        margin_factor=args.margin_factor,
        margin_floor=args.margin_floor,
        margin_threshold=args.margin_threshold,
    )
    sys.stdout.write(certificate_diff.render(diff, old, new, args.format, str(args.old), str(args.new)))
    return ExitCode.FAILED if diff.regressions else ExitCode.OK


# ----------------------------------------------------------------------- merge, verify, expectations


def _load(path: Path, reader=None):
    """The certificate at ``path`` (read by ``reader``, the checked reader by default), or None after
    one line on stderr saying why it cannot be read."""
    try:
        return (reader or load)(path)
    except CertificateError as unreadable:
        error("", str(unreadable))
        return None


def _refuse_output(path: Path) -> bool:
    from gefen_conformance.certificate import outputs

    why = outputs.problem(path)
    if why:
        error("", f"--out {path}: {why}")
    return bool(why)


def run_merge(args) -> int:
    from gefen_conformance.certificate.verify import MergeConflict, merge, write_merged

    if _refuse_output(args.out):
        return ExitCode.USAGE_ERROR
    certs = []
    for path in args.certificates:
        cert = _load(path)
        if cert is None:
            return ExitCode.UNREADABLE
        certs.append(cert)
    try:
        merged = merge(certs, args.certificates)
    except MergeConflict as conflict:
        error("merge", f"refused: {conflict}")
        return ExitCode.USAGE_ERROR
    write_merged(merged, args.out)
    print(
        f"merged {len(certs)} certificates into {args.out}: {merged['verdict']}: {merged['verdict_reason']}"
    )
    print(rules.line(merged))
    print(build.tier_line(merged))
    return merged["run"]["exit_status"]


def run_verify(args) -> ExitCode:
    from gefen_conformance.certificate import provenance
    from gefen_conformance.certificate.verify import load as unchecked
    from gefen_conformance.certificate.verify import verify

    cert = _load(args.certificate, unchecked)  # its structure is the schema's to judge
    if cert is None:
        return ExitCode.UNREADABLE
    problems, facts = verify(cert, provenance.content_sha256())
    for line in facts:
        print(line)
    if problems:
        for p in problems:
            print(f"does not verify: {p}")
        print(f"verdict: {args.certificate} does NOT verify ({len(problems)} problem(s))")
        return ExitCode.DOES_NOT_VERIFY
    print(f"verdict: {cert['verdict']}: {cert['verdict_reason']} (verified: re-derived from its records)")
    print(rules.line(cert))
    print(build.tier_line(cert))
    return build.EXIT_STATUS[build.Verdict(cert["verdict"])]


def run_expectations(args) -> ExitCode:
    from gefen_conformance.certificate.expectations import from_certificate

    if args.out is not None and _refuse_output(args.out):
        return ExitCode.USAGE_ERROR
    cert = _load(args.certificate)
    if cert is None:
        return ExitCode.UNREADABLE
    text = from_certificate(cert)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        n = text.count("[[expectation]]")
        print(f"wrote {n} expectation(s) to {args.out}")
    return ExitCode.OK

"""``gefen-conformance merge``, ``verify`` and ``expectations``: what a kernel team does with
certificates after a run (SPEC 4.4.14-4.4.16).

    gefen-conformance merge A.json B.json ... --out C.json
    gefen-conformance verify CERT
    gefen-conformance expectations CERT [--out FILE]

``merge`` writes one certificate of several shards or reruns (refused, exit 4, when they conflict:
another suite, implementation, provenance, profile or expectations file, or one test with two
outcomes); its exit status is its verdict's, as ``certify``'s. ``verify`` re-derives a
certificate's verdict from its records and checks its integrity and suite hash: exit status its
verdict's when it verifies, 3 when it does not. ``expectations`` writes a starting expectations
file from a certificate's failures (to stdout without ``--out``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOES_NOT_VERIFY = 3
UNREADABLE = 2
USAGE_ERROR = 4


def add_subcommands(subparsers) -> None:
    merge = subparsers.add_parser(
        "merge",
        help="merge shards or reruns of one certification into one certificate (SPEC 4.4.16)",
        description="One certificate of several: conformant only if together they cover the whole suite "
        "with one suite hash and one implementation provenance; anything else is partial, naming what is "
        "missing; a conflict (another suite, implementation, profile or expectations file, or one test with "
        "two outcomes) is refused. Exit status: the merged verdict's (0 conformant, 1 not-conformant, 2 "
        "incomplete, 6 partial, 7 inconclusive), 4 usage error or conflict.",
    )
    merge.add_argument("certificates", nargs="+", type=Path, metavar="CERT")
    merge.add_argument("--out", required=True, type=Path, metavar="PATH", help="the merged certificate")
    merge.set_defaults(handler=_merge)
    verify = subparsers.add_parser(
        "verify",
        help="re-derive a certificate's verdict and check its integrity and suite (SPEC 4.4.15)",
        description="Re-derive the verdict, summary and clause table from the per-test records, check "
        "each record against its own margins, the integrity digest, and the suite hash against the "
        "installed suite; report the implementation's provenance (a dirty checkout named), the world "
        "sizes, launchers and devices run, and the expectations used. Exit status: the verdict's (as "
        "certify's) when it verifies, 3 when it does not, 2 unreadable, 4 usage error.",
    )
    verify.add_argument("certificate", type=Path, metavar="CERT")
    verify.set_defaults(handler=_verify)
    exp = subparsers.add_parser(
        "expectations",
        help="write a starting expectations file from a certificate's failures (SPEC 4.4.14)",
        description="An xfail entry for every failed or errored test of CERT, with its reason, "
        "conditioned on the certificate's device, torch release, launcher and world size. Exit status: "
        "0 written, 2 unreadable, 4 usage error.",
    )
    exp.add_argument("certificate", type=Path, metavar="CERT")
    exp.add_argument("--out", type=Path, default=None, metavar="FILE", help="where to write (default stdout)")
    exp.set_defaults(handler=_expectations)


def _load(path: Path, load=None):
    from gefen_conformance.certificate.read import CertificateError
    from gefen_conformance.certificate.read import load as checked

    try:
        return (load or checked)(path)
    except CertificateError as error:
        print(f"gefen-conformance: {error}", file=sys.stderr)
        return None


def _refuse_output(path: Path) -> bool:
    from gefen_conformance.certificate import outputs

    why = outputs.problem(path)
    if why:
        print(f"gefen-conformance: --out {path}: {why}", file=sys.stderr)
    return bool(why)


def _merge(args) -> int:
    from gefen_conformance.certificate import build
    from gefen_conformance.certificate.verify import MergeConflict, merge

    if _refuse_output(args.out):
        return USAGE_ERROR
    certs = []
    for path in args.certificates:
        cert = _load(path)
        if cert is None:
            return UNREADABLE
        certs.append(cert)
    try:
        merged = merge(certs, args.certificates)
    except MergeConflict as conflict:
        print(f"gefen-conformance merge: refused: {conflict}", file=sys.stderr)
        return USAGE_ERROR
    out_dir = args.out.absolute().parent
    for t in merged["tests"]:
        if t.get("repro"):
            t["repro"] = Path(os.path.relpath(t["repro"], out_dir)).as_posix()
    build.write(merged, args.out)
    print(
        f"merged {len(certs)} certificates into {args.out}: {merged['verdict']}: {merged['verdict_reason']}"
    )
    return merged["run"]["exit_status"]


def _verify(args) -> int:
    from gefen_conformance.certificate import build, provenance
    from gefen_conformance.certificate.verify import load, verify

    cert = _load(args.certificate, load)  # its structure is the schema's to judge
    if cert is None:
        return UNREADABLE
    problems, facts = verify(cert, provenance.content_sha256())
    for line in facts:
        print(line)
    if problems:
        for p in problems:
            print(f"does not verify: {p}")
        print(f"verdict: {args.certificate} does NOT verify ({len(problems)} problem(s))")
        return DOES_NOT_VERIFY
    print(f"verdict: {cert['verdict']}: {cert['verdict_reason']} (verified: re-derived from its records)")
    return build.EXIT_STATUS[build.Verdict(cert["verdict"])]


def _expectations(args) -> int:
    from gefen_conformance.certificate.expectations import from_certificate

    if args.out is not None and _refuse_output(args.out):
        return USAGE_ERROR
    cert = _load(args.certificate)
    if cert is None:
        return UNREADABLE
    text = from_certificate(cert)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        n = text.count("[[expectation]]")
        print(f"wrote {n} expectation(s) to {args.out}")
    return 0

"""``gefen-conformance vectors export DIR`` and ``vectors check DIR RESULTS`` (SPEC 4.5.8).

``export`` writes the pinned steps as test vectors (:mod:`gefen_conformance.vectors`); ``check``
judges a kernel's results against them (:mod:`gefen_oracles.vector_check`, without torch).
"""

from __future__ import annotations

from pathlib import Path

from gefen_conformance.cli.usage import add_command, error
from gefen_conformance.exit_codes import ExitCode

EXPORT_STATUSES = (
    (ExitCode.OK, "the vectors and their manifest were written"),
    (
        ExitCode.USAGE_ERROR,
        "usage error: DIR holds files and is not a vectors directory, or cannot be written (refused "
        "before any work)",
    ),
)
CHECK_STATUSES = (
    (ExitCode.OK, "every vector passed"),
    (ExitCode.FAILED, "a vector failed: an element outside its bound, a missing or misshapen result"),
    (ExitCode.UNREADABLE, "the manifest, a vector or a result file cannot be read"),
    (ExitCode.USAGE_ERROR, "usage error: DIR or RESULTS is not a directory, an unknown vector"),
)


def register(subparsers) -> None:
    """``vectors export`` and ``vectors check``."""
    vectors = add_command(
        subparsers,
        "vectors",
        None,
        raw=False,
        help="export the pinned steps as test vectors, or check a kernel's outputs against them (SPEC 4.5.8)",
        description="Test vectors for a kernel's own unit tests: the suite's pinned steps as safetensors "
        "files with the tolerance profile's per-element bounds.",
    )
    actions = vectors.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = add_command(
        actions,
        "export",
        run_export,
        help="write every pinned step of the certify profile as a vector, and vectors.json",
        description="Write the pinned steps of test_optimizer.py (inputs, state before, the reference's "
        "state and parameters after, per-element bounds) as safetensors files and a JSON manifest.",
        statuses=EXPORT_STATUSES,
    )
    export.add_argument(
        "directory",
        type=Path,
        metavar="DIR",
        help="where to write: a new or empty directory, or one an earlier export wrote",
    )
    check = add_command(
        actions,
        "check",
        run_check,
        help="judge a kernel's outputs against the vectors, without torch or pytest",
        description="Judge each vector's results file in RESULTS element by element against the "
        "vector's bounds; print per vector PASS or FAIL and the first elements outside their bound.",
        statuses=CHECK_STATUSES,
    )
    check.add_argument("directory", type=Path, metavar="DIR", help="the vectors directory (vectors.json)")
    check.add_argument(
        "results",
        type=Path,
        metavar="RESULTS",
        help="a directory of safetensors files named as the vectors' files, holding the kernel's outputs",
    )
    check.add_argument(
        "--vector",
        action="append",
        default=None,
        metavar="ID",
        help="check only this vector (its id or file name; repeatable); default: every vector",
    )


def run_check(args) -> ExitCode:
    from gefen_oracles import vector_check

    for what, path in (("DIR", args.directory), ("RESULTS", args.results)):
        if not path.is_dir():
            error("vectors check", f"{what} {path} is not a directory")
            return ExitCode.USAGE_ERROR
    try:
        verdicts = vector_check.check(args.directory, args.results, args.vector)
    except vector_check.VectorError as unreadable:
        text = str(unreadable)
        error("vectors check", text)
        return ExitCode.USAGE_ERROR if text.startswith("no vector ") else ExitCode.UNREADABLE
    for verdict in verdicts:
        print("\n".join(verdict.lines()))
    failed = sum(not v.ok for v in verdicts)
    print(f"{len(verdicts) - failed} of {len(verdicts)} vectors passed")
    return ExitCode.FAILED if failed else ExitCode.OK


def run_export(args) -> ExitCode:
    from gefen_conformance import vectors

    why = vectors.refusal(args.directory)
    if why:
        error("vectors export", why)
        return ExitCode.USAGE_ERROR
    manifest = vectors.export(args.directory)
    print(f"{len(manifest['vectors'])} vectors written to {args.directory} ({manifest['suite']['version']})")
    return ExitCode.OK

"""``gefen-conformance repro CERT TEST_ID``: replay one failed comparison from its reproducer
(SPEC 4.5.6; the replay is :func:`gefen_conformance.repro.replay_test`).

Exit status: 1 when the comparison still fails, 0 when it passes now, 2 when the certificate or
the reproducer cannot be read, 4 for a usage error (a test the certificate or the suite does not
hold, a test without a reproducer, a test the implementation skips, an implementation or device that
cannot be loaded).
"""

from __future__ import annotations

from pathlib import Path

from gefen_conformance.cli.usage import add_command, error
from gefen_conformance.exit_codes import ExitCode


def register(subparsers) -> None:
    """``repro``."""
    command = add_command(
        subparsers,
        "repro",
        run,
        raw=False,
        help="replay a failed comparison from its reproducer (SPEC 4.5.6)",
        description="Replay the comparison a failed test made, from the reproducer written beside the "
        "certificate (a drawn case in this process, any other test run again by its id), and print its "
        "worst elements. Exit status: 1 still fails, 0 passes now, 2 a file that cannot be read, 4 usage "
        "error.",
    )
    command.add_argument(
        "certificate", type=Path, metavar="CERT", help="the certificate the failing run wrote"
    )
    command.add_argument("test_id", metavar="TEST_ID", help="a failed test's id as the certificate lists it")
    command.add_argument(
        "--impl",
        default=None,
        metavar="SPEC",
        help="replay against this implementation instead of the certificate's (a registered name or "
        "package.module:attribute)",
    )
    command.add_argument(
        "--device",
        default=None,
        metavar="NAME",
        help="where the implementation's tensors live (default: the failing run's device)",
    )
    command.add_argument(
        "--top", type=int, default=10, metavar="N", help="worst elements listed per comparison (default 10)"
    )


def run(args) -> ExitCode:
    from gefen_conformance import repro

    try:
        still_fails = repro.replay_test(
            args.certificate, args.test_id, impl=args.impl, device=args.device, top=args.top
        )
    except repro.ReproError as refused:
        error("repro", str(refused))
        return ExitCode.UNREADABLE if isinstance(refused, repro.Unreadable) else ExitCode.USAGE_ERROR
    return ExitCode.FAILED if still_fails else ExitCode.OK

"""``gefen-conformance golden``: the golden checkpoints (SPEC 5.5).

    gefen-conformance golden generate DIR [--impl NAME]   write every case and MANIFEST.json
    gefen-conformance golden check DIR                    verify DIR against its manifest
    gefen-conformance golden compare [--impl NAME] [DIR]  save with NAME, compare with the goldens

The catalogue, its generation and comparison are :mod:`gefen_conformance.golden`; the manifest's
check is :mod:`gefen_oracles.golden_manifest`.
"""

from __future__ import annotations

from pathlib import Path

from gefen_conformance.cli.usage import UsageError, add_command
from gefen_conformance.exit_codes import ExitCode

#: ``golden``'s exit statuses (SPEC 4.4.9, 4.4.10)
STATUSES = (
    (ExitCode.OK, "verified (check, compare) or written (generate)"),
    (ExitCode.FAILED, "problems found"),
    (
        ExitCode.USAGE_ERROR,
        "usage error: an implementation that cannot be loaded, a DIR that is not there or "
        "cannot be written, an unknown option",
    ),
)
#: ``golden``'s actions and what each does
ACTIONS = {
    "generate": "write the golden cases and their manifest into DIR",
    "check": "verify DIR against its MANIFEST.json",
    "compare": "save the cases with an implementation and compare with the goldens",
}
IMPL_HELP = (
    "the implementation that saves the cases: registered name or package.module:attribute "
    "(default: reference)"
)


def register(subparsers) -> None:
    """``golden generate``, ``golden check`` and ``golden compare``."""
    golden = add_command(
        subparsers,
        "golden",
        run,
        help="golden checkpoints: generate, check, compare (SPEC 5.5)",
        statuses=STATUSES,
    )
    actions = golden.add_subparsers(dest="action", required=True, metavar="ACTION")
    generate, check, compare = (
        add_command(actions, name, None, help=text, statuses=STATUSES) for name, text in ACTIONS.items()
    )
    generate.add_argument("dir", type=Path, metavar="DIR", help="directory to write (made if missing)")
    generate.add_argument("--impl", default="reference", metavar="NAME", help=IMPL_HELP)
    check.add_argument("dir", type=Path, metavar="DIR", help="a directory `golden generate` wrote")
    compare.add_argument(
        "dir",
        type=Path,
        nargs="?",
        default=None,
        metavar="DIR",
        help="goldens to compare with (default: the committed ones)",
    )
    compare.add_argument("--impl", default="reference", metavar="NAME", help=IMPL_HELP)


def _refusal(args) -> None:
    """``golden``'s refusals before anything runs (SPEC 4.4.10, 4.1.6): an implementation that
    cannot be loaded, a directory to read that is not there (or has no manifest), one to write
    that cannot be written."""
    from gefen_conformance.certificate import outputs
    from gefen_conformance.implementations import registry

    if args.action in ("generate", "compare"):
        try:
            registry.resolve(args.impl)
        except registry.ImplementationError as error:
            raise UsageError(f"--impl={args.impl}: {error}") from None
    if args.action == "generate":
        why = outputs.problem(args.dir, what="directory")
        if why:
            raise UsageError(f"{args.dir}: {why}")
        return
    directory = args.dir
    if directory is None:
        return  # compare: the committed goldens
    if not Path(directory).is_dir():
        raise UsageError(f"{directory}: no such directory")
    if not (Path(directory) / "MANIFEST.json").is_file():
        raise UsageError(
            f"{directory}: no MANIFEST.json (not a golden directory; `golden generate` writes one)"
        )


def run(args) -> ExitCode:
    _refusal(args)
    from gefen_conformance import golden
    from gefen_oracles import golden_manifest

    if args.action == "generate":
        path = golden.generate_into(args.dir, args.impl)
        print(f"wrote {len(golden.CASES)} cases and {path}")
        return ExitCode.OK
    if args.action == "check":
        problems = golden_manifest.check(args.dir)
    else:
        compared = golden.compare_goldens(args.impl, golden_root=args.dir or golden.GOLDEN_DIR)
        for note in compared.notes:
            print(f"note: {note}")
        problems = list(compared.problems)
    for line in problems:
        print(line)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return ExitCode.FAILED if problems else ExitCode.OK

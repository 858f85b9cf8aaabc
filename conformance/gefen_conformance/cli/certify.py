"""``gefen-conformance certify``: run the suite against an implementation and write its certificate
(SPEC 4.4, 4.7).

    gefen-conformance certify [--impl NAME] [--out PATH] [--device NAME] [TEST_ID ...] [-- PYTEST_ARGS...]
    gefen-conformance certify --launcher torchrun [--nproc-per-node N] [--nnodes M --rdzv-endpoint HOST:PORT
                              [--node-rank K]] [--checkpoint-dir DIR] ...   one torchrun job (SPEC 4.7)

The pool launcher runs ``python -m pytest --impl=NAME ...`` in a child process; torchrun runs one
job whose rank 0 runs pytest and reports its status in a result file. Every option the plugin
takes is checked here first, before anything runs (SPEC 4.4.10); the exit status is the run's
(SPEC 4.4.9).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gefen_conformance.cli.usage import UsageError, add_command, suite_statuses_text
from gefen_conformance.exit_codes import ExitCode

CERTIFY_DESCRIPTION = """\
Run the conformance suite against an implementation and write its JSON certificate (SPEC 4.4):
`python -m pytest --impl=NAME [--certificate=PATH] -p no:cacheprovider [TEST_ID ...] [PYTEST_ARGS ...]`."""

CERTIFY_EPILOG = """\
Test ids are those the suite prints (terminal, certificate, reports), accepted from any directory;
with them, or with pytest arguments that narrow the run, the verdict is `partial`:
  gefen-conformance certify --impl fast 'test_dcp_reshard.py::test_reshard_resaved_state_is_consistent[2->4]'
pytest's own options go after `--`:
  gefen-conformance certify --impl fast -- -n 4                 # 4 xdist workers
  gefen-conformance certify --impl fast -- -k reshard           # a partial run
  gefen-conformance certify --impl fast -- --hypothesis-profile=gefen-fuzz

--launcher torchrun runs one torchrun job (`python -m torch.distributed.run`, --standalone on one
node) of N ranks per node; every multi-rank scenario that fits the job's world runs on its ranks
and rank 0 writes the certificate (SPEC 4.7):
  gefen-conformance certify --impl fast --launcher torchrun --nproc-per-node 4 --out c.json
  gefen-conformance certify --impl fast --launcher torchrun --nproc-per-node 8 --device cuda \\
      --nnodes 2 --rdzv-endpoint node0:29400 --checkpoint-dir /shared/scratch --out c.json   # on each node

"""

TORCHRUN_ONLY = ("nproc_per_node", "nnodes", "rdzv_endpoint", "node_rank", "checkpoint_dir")


def register(subparsers) -> None:
    """``certify``, whose pytest arguments after ``--`` arrive as ``args.pytest_args``."""
    cert = add_command(
        subparsers,
        "certify",
        run,
        help="run the conformance suite against an implementation, write its certificate",
        description=CERTIFY_DESCRIPTION,
        epilog=CERTIFY_EPILOG + suite_statuses_text(),
    )
    cert.add_argument(
        "tests",
        nargs="*",
        metavar="TEST_ID",
        help="only these suite tests, as the suite prints them (test_module.py::test_name[params]), "
        "from any directory (SPEC 4.5.5); default: the whole suite",
    )
    cert.add_argument(
        "--impl",
        default=None,
        metavar="NAME",
        help="registered name or package.module:attribute (default: reference, or with --rerun-failed "
        "the certificate's; `pytest --impl-list` lists them)",
    )
    cert.add_argument(
        "--expectations",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML file of the tests expected to fail or be skipped, with conditions (SPEC 4.4.14)",
    )
    cert.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="run shard I of N: a deterministic partition of the suite by test id; the run is partial "
        "and `gefen-conformance merge` makes one certificate of the shards (SPEC 4.4.16)",
    )
    cert.add_argument(
        "--rerun-failed",
        type=Path,
        default=None,
        metavar="CERT",
        help="run only the tests that failed or errored in CERT (its implementation unless --impl)",
    )
    cert.add_argument(
        "--junit",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write JUnit XML, each test with its clauses and worst margin as properties",
    )
    cert.add_argument(
        "--certificate",
        "--out",
        dest="certificate",
        type=Path,
        default=None,
        metavar="PATH",
        help="certificate path (default ./gefen-certificate-<impl>.json)",
    )
    cert.add_argument(
        "--device",
        default=None,
        metavar="NAME",
        help="where the implementation's tensors live: cpu (default), cuda, cuda:N, ... (SPEC 4.6)",
    )
    cert.add_argument(
        "--deadline-scale",
        default=None,
        metavar="F",
        help="multiply every deadline by F > 0 (default 1; they already stretch with the machine's "
        "measured load, SPEC 4.2.10): for a much slower CPU, an emulator, a sanitizer build",
    )
    cert.add_argument(
        "--tier",
        choices=("default", "scale"),
        default=None,
        help="the suite's tier (SPEC 4.3.16): default, or scale (also parameters past 2^24 elements, "
        "20,000 parameters in a step, runs past 10^4 steps: minutes, a few GiB); default: scale with "
        "a non-CPU --device, else default",
    )
    cert.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="pytest's -q: no progress lines, a shorter report (SPEC 4.4.11)",
    )
    cert.add_argument(
        "--launcher",
        choices=("pool", "torchrun"),
        default="pool",
        help="pool: the local spawn pool (default); torchrun: one torchrun job (SPEC 4.7)",
    )
    job = cert.add_argument_group("torchrun (with --launcher torchrun)")
    job.add_argument(
        "--nproc-per-node", type=int, default=None, metavar="N", help="ranks per node (default 4)"
    )
    job.add_argument("--nnodes", type=int, default=None, metavar="M", help="nodes (default 1: --standalone)")
    job.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="the c10d rendezvous of a multi-node job (needed with --nnodes > 1)",
    )
    job.add_argument("--node-rank", type=int, default=None, metavar="K", help="this node's rank (optional)")
    job.add_argument(
        "--checkpoint-dir",
        default=None,
        metavar="DIR",
        help="where scenarios write checkpoints: a filesystem every node shares (needed with "
        "--nnodes > 1; default a temporary directory)",
    )
    # the usage line shows what argparse cannot: pytest's arguments after `--`
    usage = cert.format_usage().removeprefix("usage: ").rstrip("\n")
    cert.usage = usage + "\n" + " " * (len("usage: ") + len(cert.prog) + 1) + "[-- PYTEST_ARGS ...]"
    cert.set_defaults(passthrough=True, options_for_pytest=True)


def run_pytest(
    impl: str,
    certificate,
    pytest_args: list[str],
    device: str | None = None,
    deadline_scale: float | None = None,
) -> int:
    """``python -m pytest --impl=IMPL ...`` in a child process: the current directory is importable
    there (as with ``python -m pytest``), and nothing this process imported shadows the suite."""
    command = [sys.executable, "-m", "pytest", f"--impl={impl}", "-p", "no:cacheprovider"]
    if certificate is not None:
        command.append(f"--certificate={certificate}")
    if device is not None:
        command.append(f"--gefen-device={device}")
    if deadline_scale is not None:
        command.append(f"--gefen-deadline-scale={deadline_scale:g}")
    return _wait_for(command + list(pytest_args))


def _wait_for(command: list[str]) -> int:
    import subprocess

    child = subprocess.Popen(command)
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            continue  # Ctrl-C reached the child too (same process group); it stops and reports


def torchrun_command(args, pytest_args: list[str], result_file: str) -> list[str]:
    """The torchrun command line of ``certify --launcher torchrun`` (SPEC 4.7.2); raises
    :class:`UsageError` for options that do not fit together."""
    nproc = 4 if args.nproc_per_node is None else args.nproc_per_node
    nnodes = 1 if args.nnodes is None else args.nnodes
    if nproc < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, got {nproc}")
    if nnodes < 1:
        raise UsageError(f"--nnodes must be at least 1, got {nnodes}")
    if nnodes > 1 and not args.rdzv_endpoint:
        raise UsageError(
            f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the rendezvous every node joins)"
        )
    if nnodes > 1 and not args.checkpoint_dir:
        raise UsageError(f"--nnodes {nnodes} needs --checkpoint-dir DIR on a filesystem every node shares")
    if args.rdzv_endpoint and ":" not in args.rdzv_endpoint:
        raise UsageError(f"--rdzv-endpoint {args.rdzv_endpoint!r}: give HOST:PORT")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
    ]
    if nnodes == 1 and not args.rdzv_endpoint:
        command.append("--standalone")
    else:
        command += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
        if args.node_rank is not None:
            command += ["--node-rank", str(args.node_rank)]
    command += ["-m", "gefen_conformance.harness.torchrun", "--impl", args.impl, "--result-file", result_file]
    command += ["--prepare", "gefen_conformance.plugin.warmup:prepare_rank"]  # the suite's rank preparation
    if args.certificate is not None:
        command += ["--certificate", str(Path(args.certificate).absolute())]
    if args.checkpoint_dir is not None:
        command += ["--checkpoint-dir", str(Path(args.checkpoint_dir).absolute())]
    if args.device is not None:
        command += ["--device", args.device]
    return command + ["--pytest-args"] + list(pytest_args)  # torchrun's parser would swallow a `--`


def certify_torchrun(args, pytest_args: list[str]) -> int:
    """One torchrun job (SPEC 4.7); the exit status is rank 0's pytest's, read from a result file."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gefen-certify-") as scratch:
        result = Path(scratch) / "result.json"
        status = _wait_for(torchrun_command(args, pytest_args, str(result)))
        if result.exists():
            return int(json.loads(result.read_text())["exit_status"])
    if status == ExitCode.OK:
        print("gefen-conformance: rank 0 ran on another node; its node has the certificate", file=sys.stderr)
        return ExitCode.OK
    print(
        f"gefen-conformance: the torchrun job ended (exit status {status}) before rank 0 reported a result",
        file=sys.stderr,
    )
    return status


def _checked_outputs(args) -> float | None:
    """What certify checks before anything runs (SPEC 4.4.10): the deadline scale, and that the
    certificate can be written where it goes; returns the scale (exported to every process the
    run starts, torchrun's ranks included)."""
    from gefen_conformance.certificate import outputs
    from gefen_conformance.harness import deadlines

    scale = None
    if args.deadline_scale is not None:
        try:
            scale = deadlines.parse_scale(args.deadline_scale)
        except ValueError as error:
            raise UsageError(f"--deadline-scale {args.deadline_scale}: {error}") from None
        deadlines.set_scale(scale)
    if args.certificate is not None:
        why = outputs.problem(args.certificate)
        if why:
            raise UsageError(f"--out {args.certificate}: {why}")
    else:
        why = outputs.problem(Path.cwd() / "gefen-certificate.json")
        if why:
            raise UsageError(
                f"the certificate goes to the current directory ({Path.cwd()}) by default, and it "
                f"{why.replace('cannot write there', 'cannot be written there')} (give --out PATH)"
            )
    return scale


def _test_ids(args) -> list[str]:
    """``certify``'s TEST_IDs, each a suite test id (from any directory) or a path that exists here
    (SPEC 4.5.5); the plugin maps suite ids to the suite's files (:func:`selection.suite_path_for`)."""
    from gefen_conformance.plugin import selection

    for test_id in args.tests:
        target = test_id.partition("::")[0]
        if selection.suite_path_for(test_id, Path.cwd()) is None and not Path(target).exists():
            modules = sorted(p.name for p in selection.SUITE_DIR.glob("test_*.py"))
            raise UsageError(
                f"TEST_ID {test_id}: the suite has no module {target} and there is no such path here "
                f"(a suite test id is test_module.py::test_name[params]; modules: {', '.join(modules)})"
            )
    return list(args.tests)


def _rerun_failed(args) -> None:
    """``--rerun-failed CERT``: its failed and errored tests become the run's test ids, and its
    implementation the run's unless ``--impl`` names one."""
    if args.rerun_failed is None:
        return
    from gefen_conformance.certificate.read import CertificateError, load

    try:
        cert = load(args.rerun_failed)
    except CertificateError as error:
        raise UsageError(f"--rerun-failed {error}") from None
    failed = [t["id"] for t in cert["tests"] if t["outcome"] in ("failed", "error", "xpassed")]
    if not failed:
        raise UsageError(f"--rerun-failed {args.rerun_failed}: no test failed there ({cert['verdict']})")
    if args.tests:
        raise UsageError("--rerun-failed takes its tests from the certificate: give no TEST_ID")
    args.tests = failed
    if args.impl is None:
        args.impl = cert["implementation"].get("spec") or cert["implementation"]["name"]


def _plugin_options(args) -> list[str]:
    """certify's options that the plugin takes, checked here first (SPEC 4.4.10, 4.4.14)."""
    out = []
    if args.expectations is not None:
        from gefen_conformance.certificate import expectations

        try:
            expectations.load(args.expectations)
        except expectations.ExpectationsError as error:
            raise UsageError(f"--expectations {error}") from None
        out.append(f"--expectations={args.expectations.absolute()}")
    if args.tier is not None:
        out.append(f"--gefen-tier={args.tier}")
    if args.shard is not None:
        from gefen_conformance.plugin.options import parse_shard

        try:
            parse_shard(args.shard)
        except ValueError as error:
            raise UsageError(f"--shard {error}") from None
        out.append(f"--gefen-shard={args.shard}")
    if args.junit is not None:
        from gefen_conformance.certificate import outputs

        why = outputs.problem(args.junit)
        if why:
            raise UsageError(f"--junit {args.junit}: {why}")
        out.append(f"--gefen-junit={args.junit.absolute()}")
    return out


def run(args) -> int:
    """Run ``certify``; its exit status is the run's (SPEC 4.4.9)."""
    _rerun_failed(args)
    args.impl = args.impl or "reference"
    pytest_args = (
        _plugin_options(args) + _test_ids(args) + (["-q"] if args.quiet else []) + list(args.pytest_args)
    )
    if args.launcher == "pool":
        given = [f"--{name.replace('_', '-')}" for name in TORCHRUN_ONLY if getattr(args, name) is not None]
        if given:
            raise UsageError(
                f"{', '.join(given)} only {'applies' if len(given) == 1 else 'apply'} "
                "with --launcher torchrun"
            )
        scale = _checked_outputs(args)
        return run_pytest(args.impl, args.certificate, pytest_args, args.device, scale)
    _checked_outputs(args)
    if args.device not in (None, "cpu"):
        from gefen_conformance.harness import devices

        try:
            devices.parse(args.device)
        except devices.DeviceUnavailable as error:
            text = str(error)  # names the device; say which option it came from
            raise UsageError(text if text.startswith("--") else f"--device {text}") from None
    return certify_torchrun(args, pytest_args)

"""The torchrun job's entry point: what every rank runs (SPEC 4.7.2-4.7.6).

``gefen-conformance certify --launcher torchrun`` starts ``python -m
gefen_conformance.harness.torchrun`` on every rank of a torchrun job (the rank's command line:
``--impl``, ``--certificate``, ``--checkpoint-dir``, ``--device``, ``--result-file``, then the
pytest arguments after ``--pytest-args``). :func:`main` gives each process its role:

1. **Start-up** (bounded: :func:`~gefen_conformance.harness.torchrun.job.startup_timeout_s`).
   Every rank connects to the job's store, checks its device (one per rank) and says hello; rank
   0 makes the run directory (under ``--checkpoint-dir``, or a temporary one), and every rank
   proves it sees everyone's marker there; every serving rank prepares the implementation
   (SPEC 4.2.11). A problem is one clear error and exit status 4.
2. **Rank 0 runs pytest in-process** with a
   :class:`~gefen_conformance.harness.torchrun.launcher.TorchrunLauncher` installed and writes
   the one certificate; ranks 1..W-1 serve scenario calls
   (:mod:`~gefen_conformance.harness.torchrun.serve`), and so does the *rank-0 server*, a child
   that takes rank 0's part in them (the test process may hold a default group of its own, a
   ``WorldOfOne``, while it runs a scenario).
3. **The end.** Rank 0 posts ``exit`` after pytest returns and every rank leaves with
   ``os._exit``; Ctrl-C reaches every rank from torchrun, and a rank whose parent is gone leaves.

With ``--result-file`` rank 0 writes ``{"exit_status": N}`` (pytest's status, or 4 for a usage
error at start-up) and exits 0, so torchrun reports no worker failure for a failing test; the CLI
returns N.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gefen_conformance.exit_codes import ExitCode
from gefen_conformance.harness import launch, rank_side
from gefen_conformance.harness.rank_side import EXIT_PARENT_GONE, SINGLE_THREAD_ENV
from gefen_conformance.harness.torchrun.job import Job, command_key, dumps, leave, startup_timeout_s, wait
from gefen_conformance.harness.torchrun.launcher import StopWhenJobEnds, TorchrunLauncher
from gefen_conformance.harness.torchrun.serve import serve

__all__ = ["PYTEST_ARGS", "main", "pytest_arguments"]

#: what separates this module's options from pytest's (torchrun's own parser swallows a ``--``)
PYTEST_ARGS = "--pytest-args"
_SERVER_ROLE = "GEFEN_TORCHRUN_RANK0_SERVER"


def _device_facts(device_arg: str | None, job: Job):
    """(device of this rank, its name, error text or None)."""
    from gefen_conformance.harness import devices

    try:
        chosen = devices.parse(device_arg or "cpu")
        short = devices.shortage(chosen, job.local_world_size)
        if short is not None:
            raise devices.DeviceUnavailable(f"--device {device_arg}: {short}")
        device = devices.for_rank(chosen, job.local_rank)
        return chosen, device, devices.name_of(device), None
    except devices.DeviceUnavailable as exc:
        return None, None, "", str(exc)


def _check_run_dir(job: Job, control, run_dir: str) -> str | None:
    """Write this rank's marker, wait for everyone's, look for them; the problem seen, or None."""
    marker = Path(run_dir) / f".rank-{job.rank}"
    try:
        marker.write_text(socket.gethostname())
    except OSError as exc:
        problem = f"rank {job.rank} on {socket.gethostname()} cannot write in {run_dir}: {exc}"
        control.add("markers", 1)
        return problem
    if control.add("markers", 1) == job.world_size:
        control.set("markers-done", b"1")
    if not wait(control, ["markers-done"], startup_timeout_s()):
        return (
            f"rank {job.rank}: not every rank wrote its marker in {run_dir} within {startup_timeout_s():g} s"
        )
    missing = [r for r in range(job.world_size) if not (Path(run_dir) / f".rank-{r}").exists()]
    if missing:
        return (
            f"rank {job.rank} on {socket.gethostname()} does not see the markers of rank(s) "
            f"{', '.join(map(str, missing))} in {run_dir}: --checkpoint-dir must be one filesystem "
            "shared by every node"
        )
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gefen_conformance.harness.torchrun",
        description="one rank of a torchrun certification (see gefen_conformance.harness.torchrun)",
    )
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--certificate", default=None)
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--result-file", default=None)
    parser.add_argument(
        "--prepare",
        default=None,
        metavar="MODULE:FUNCTION",
        help="called as FUNCTION(implementation, device=device) once on every serving rank before any "
        "scenario call (the suite's plugin names its rank preparation here)",
    )
    return parser


def pytest_arguments(
    impl: str, certificate: str | None, device: str | None, run_dir: str, passthrough: Sequence[str]
) -> list[str]:
    """What rank 0 gives ``pytest.main``: the suite against ``impl``, no xdist (scenarios must run
    on this job's ranks, not in worker processes with a pool of their own), temp dirs in the run
    directory every rank sees."""
    args = [
        f"--impl={impl}",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        f"--basetemp={Path(run_dir) / 'pytest'}",
    ]
    if certificate:
        args.append(f"--certificate={certificate}")
    if device:
        args.append(f"--gefen-device={device}")
    return args + list(passthrough)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    for separator in (PYTEST_ARGS, "--"):
        if separator in argv:
            cut = argv.index(separator)
            argv, passthrough = argv[:cut], argv[cut + 1 :]
            break
    options = _parser().parse_args(argv)
    job = Job()
    faulthandler.register(
        signal.SIGUSR1, all_threads=True
    )  # `kill -USR1 <pid>`: this rank's stacks on stderr
    for name in SINGLE_THREAD_ENV:
        os.environ.setdefault(name, "1")
    # NCCL: tear down communicators on error without killing the process (SPEC 4.7.4; unverified here)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    if os.environ.get(_SERVER_ROLE) == "1":
        _rank_zero_server(job, options)
    elif job.rank == 0:
        return _rank_zero(job, options, passthrough, argv)
    else:
        _serving_rank(job, options)
    return 0  # not reached


def _startup(job: Job, options, *, serving: bool = True):
    import torch

    torch.set_num_threads(1)
    control = job.store_client(startup_timeout_s(), may_host=True)
    pg_store = job.store_client(startup_timeout_s()) if serving else None
    chosen, device, name, error = _device_facts(options.device, job)
    hello = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "node_rank": job.node_rank,
        "local_rank": job.local_rank,
        "device_name": name,
        "error": error,
    }
    control.set(f"hello/{job.rank}", dumps(hello))
    return control, pg_store, chosen, device


def _serving_process() -> None:
    """Ctrl-C and SIGTERM reach every rank's process group from torchrun: a server just leaves,
    and so does one whose parent is gone."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, f: leave(128 + s))
    rank_side.watch_parent(lambda: leave(EXIT_PARENT_GONE), name="torchrun-parent-watchdog")


def _serving_rank(job: Job, options) -> None:
    _serving_process()
    control, pg_store, _, device = _startup(job, options)
    if not wait(control, ["run-dir"], startup_timeout_s()):
        leave(EXIT_PARENT_GONE)
    run_dir = control.get("run-dir").decode()
    problem = _check_run_dir(job, control, run_dir) if run_dir else None
    control.set(f"seen/{job.rank}", (problem or "").encode())
    broken = _prepare(job, control, options, device) if device is not None and not problem else None
    _serve_until_exit(job, control, pg_store, device, broken)


def _rank_zero_server(job: Job, options) -> None:
    """Rank 0's part in scenario calls, in a child of the process that runs pytest."""
    _serving_process()
    import torch

    torch.set_num_threads(1)
    control = job.store_client(startup_timeout_s())
    pg_store = job.store_client(startup_timeout_s())
    _, device, _, _ = _device_facts(options.device, job)
    broken = _prepare(job, control, options, device)
    control.set("server-ready/0", str(os.getpid()).encode())
    _serve_until_exit(job, control, pg_store, device, broken)


def _prepare(job: Job, control, options, device) -> str | None:
    """This rank's preparation before any scenario call (SPEC 4.2.11: the scenario modules and
    torch's lazy imports, the implementation's ``prepare``), posted as ``prepared/<rank>`` with
    its time; what it raised, as text, or None."""
    from gefen_conformance.harness.exception_text import format_exception
    from gefen_conformance.implementations import registry

    started = time.monotonic()
    error = None
    try:
        if options.prepare:
            _named_function(options.prepare)(registry.resolve(options.impl), device=device)
    except Exception as exc:  # noqa: BLE001 - every call this rank takes part in reports it
        error = (
            f"rank {job.rank}: preparing the implementation failed before any call:\n{format_exception(exc)}"
        )
    control.set(f"prepared/{job.rank}", dumps({"seconds": time.monotonic() - started, "error": error}))
    return error


def _named_function(spec: str):
    """The function ``MODULE:FUNCTION`` names (``--prepare``)."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--prepare {spec!r}: expected MODULE:FUNCTION")
    return getattr(importlib.import_module(module), name)


def _serve_until_exit(job: Job, control, pg_store, device, broken: str | None = None) -> None:
    try:
        serve(job, control, pg_store, device, broken)
    except Exception as exc:  # noqa: BLE001 - the store (torchrun's agent) is gone: so is the job
        print(
            f"gefen-conformance rank {job.rank}: leaving, the job's store failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            file=sys.stderr,
        )
        leave(EXIT_PARENT_GONE)


def _write_result(path: str | None, status: int, detail: str = "") -> None:
    if path:
        Path(path).write_text(json.dumps({"exit_status": int(status), "detail": detail}))


def _make_run_dir(checkpoint_dir: str | None) -> str:
    if checkpoint_dir is None:
        return tempfile.mkdtemp(prefix="gefen-torchrun-")
    run_dir = Path(checkpoint_dir) / f"gefen-torchrun-{uuid.uuid4().hex[:12]}"
    run_dir.mkdir(parents=True)
    return str(run_dir)


def _start_server(argv: list[str]):
    """The rank-0 server: this module again, in a child process of the same process group (so
    torchrun's signals reach it), told its role by the environment."""
    import subprocess

    return subprocess.Popen(
        [sys.executable, "-m", "gefen_conformance.harness.torchrun", *argv],
        env=dict(os.environ, **{_SERVER_ROLE: "1"}),
    )


def _rank_zero(job: Job, options, passthrough: list[str], argv: list[str]) -> int:
    def parent_gone() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # pytest stops and writes an incomplete certificate
        time.sleep(60)
        leave(EXIT_PARENT_GONE)

    rank_side.watch_parent(parent_gone, name="torchrun-parent-watchdog")
    control, _, chosen, device = _startup(job, options, serving=False)
    status, detail, run_dir, server = int(ExitCode.USAGE_ERROR), "", "", None
    try:
        try:
            run_dir = _make_run_dir(options.checkpoint_dir)
            control.set("run-dir", run_dir.encode())
        except OSError as exc:
            control.set("run-dir", b"")
            raise _StartupError(
                f"--checkpoint-dir {options.checkpoint_dir}: cannot make the run directory there: {exc}"
            ) from None
        hellos = _gather(control, "hello", job.world_size)
        control.set("seen/0", (_check_run_dir(job, control, run_dir) or "").encode())
        seen = _gather(control, "seen", job.world_size, raw=True)
        errors = [h["error"] for _, h in sorted(hellos.items()) if h["error"]]
        errors += [text for _, text in sorted(seen.items()) if text]
        if errors:
            raise _StartupError(
                errors[0] + (f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else "")
            )
        server = _start_server(argv)
        if not wait(control, ["server-ready/0"], startup_timeout_s()):
            raise _StartupError(f"the rank-0 server did not start within {startup_timeout_s():g} s")
        from gefen_conformance.harness import devices

        launcher = TorchrunLauncher(job, control, server, device, devices.backend_for(chosen), hellos)
        prepared = _gather(control, "prepared", job.world_size)
        launcher.preparation_s = max((p["seconds"] for p in prepared.values()), default=0.0)
        launch.set_launcher(launcher)
        import pytest

        args = pytest_arguments(options.impl, options.certificate, options.device, run_dir, passthrough)
        status = int(pytest.main(args, plugins=[StopWhenJobEnds(launcher)]))
        if launcher.ended is not None:
            print(f"gefen-conformance: the torchrun job ended early: {launcher.ended}", file=sys.stderr)
    except _StartupError as error:
        detail = str(error)
        print(f"gefen-conformance certify --launcher torchrun: {detail}", file=sys.stderr)
    finally:
        try:
            control.set(command_key(_next_free_command(control)), dumps(("exit", None)))
        except Exception:  # noqa: BLE001 - the store is gone: the other ranks are too
            pass
        if server is not None:
            _reap(server)
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        _write_result(options.result_file, status, detail)
    leave(ExitCode.OK if options.result_file else status)
    return status  # not reached


def _reap(server, grace: float = 5.0) -> None:
    """Wait for the rank-0 server to take its ``exit``; kill it if it does not (a hung call)."""
    try:
        server.wait(grace)
    except Exception:  # noqa: BLE001 - TimeoutExpired, or interrupted
        server.kill()
        server.wait()


class _StartupError(Exception):
    pass


def _gather(control, what: str, world_size: int, *, raw: bool = False) -> dict[int, Any]:
    keys = [f"{what}/{r}" for r in range(world_size)]
    if not wait(control, keys, startup_timeout_s()):
        absent = [k for k in keys if not control.check([k])]
        raise _StartupError(
            f"{', '.join(absent)} did not arrive within {startup_timeout_s():g} s of start-up"
        )
    return {r: (control.get(k).decode() if raw else pickle.loads(control.get(k))) for r, k in enumerate(keys)}


def _next_free_command(control) -> int:
    """The first ``cmd/<n>`` not yet posted (where the serving ranks will look next)."""
    launcher = launch.active()
    if isinstance(launcher, TorchrunLauncher):
        return launcher.next_command()
    return 1

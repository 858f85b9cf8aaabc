"""The suite under torchrun: one job whose world runs every multi-rank scenario that fits it (SPEC 4.7).

Every rank of the job runs ``python -m gefen_conformance.harness.torchrun`` (``gefen-conformance certify
--launcher torchrun`` builds the torchrun command line). Then:

1. **Start-up** (bounded: :data:`STARTUP_TIMEOUT_S`). Each rank connects two clients to the job's
   TCPStore (torchrun's ``MASTER_ADDR:MASTER_PORT``): one for control messages, one for the
   process groups of scenario calls. Each rank checks its device (``--device``, one per rank:
   ``conformance.devices.for_rank``) and says hello. Rank 0 makes the run directory (under
   ``--checkpoint-dir``, a filesystem every node must share; a temporary directory by default);
   every rank writes a marker there and must see every other rank's marker, so a directory that
   is not shared is one clear error before the first scenario.
2. **Rank 0 runs pytest in-process** with a :class:`TorchrunLauncher` installed
   (``gefen_conformance.harness.launch.set_launcher``), the test temp dirs (``--basetemp``) in the run
   directory, and writes the one certificate. The other ranks serve scenario calls, and so does
   the *rank-0 server*, a child process that rank 0 starts for its own part in them: the test
   process never forms a scenario's process group, because a test may hold a group of its own
   there (``conformance.sharding.WorldOfOne``, a session fixture) while it runs a scenario, and
   torch has one default group per process.
3. **A call** ``launch.run(fn, k, ...)`` runs ``fn`` on global ranks ``0..k-1``: rank 0 posts the
   call on the store (``cmd/<n>``), every participant forms a fresh ``k``-rank default process
   group for it (:mod:`gefen_conformance.harness.torchrun_rank`) and posts its outcome; ranks ``>= k`` skip it.
   A rank-0 server that exits during a call is reported "died" with its exit code.
   Every wait is bounded: rank 0 polls the outcomes against the call's deadline and
   ``failure_grace``, then posts ``call/<n>/abort``; a participant still running then dumps every
   thread's stack and reports "hung". A hung rank cannot be stopped (its thread is stuck), so the
   job ends: the launcher refuses later calls and tells pytest to stop after the current test
   (the run is then never complete: "stopped early", and the failed test makes it not-conformant).
4. **The end.** Rank 0 posts ``exit`` after pytest returns; every rank leaves with ``os._exit``
   (a stuck thread cannot hold a process). Ctrl-C reaches torchrun, which forwards SIGINT to every
   rank's process group: rank 0's pytest writes an ``incomplete`` certificate, the other ranks
   exit at once. A rank whose parent (the torchrun agent) disappears exits too.

With ``--result-file`` rank 0 writes ``{"exit_status": N}`` (pytest's status, or 4 for a usage
error at start-up) and exits 0, so torchrun reports no worker failure for a failing test; the CLI
returns N.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import itertools
import json
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from gefen_conformance.harness import launch
from gefen_conformance.harness.torchrun_rank import Participation, hung_report
from gefen_conformance.harness.deadlines import Deadline, wall_bound
from gefen_conformance.harness.pool import RankFailure, RankOutcome

__all__ = ["TorchrunLauncher", "TorchrunJobEnded", "main"]

#: bound on connecting, saying hello and checking the run directory
STARTUP_TIMEOUT_S = float(os.environ.get("GEFEN_TORCHRUN_STARTUP_TIMEOUT", "300"))
#: how long rank 0 waits for the "hung" reports (with their stack dumps) after posting an abort
REPORT_WAIT_S = 10.0
#: how often rank 0 looks at the outcomes of a running call
POLL_S = 0.05
#: how much of what a rank printed during a call its outcome keeps (the end of it)
OUTPUT_TAIL_BYTES = 64 * 1024
#: how long a serving rank waits between two looks for the next call
IDLE_POLL_S = 0.1
#: what separates this module's options from pytest's (torchrun's own parser swallows a ``--``)
PYTEST_ARGS = "--pytest-args"
#: exit status of a usage error (SPEC 4.1.6), as pytest's ExitCode.USAGE_ERROR
USAGE_ERROR = 4
EXIT_PARENT_GONE = 70
_PREFIX = "gefen-conformance/"
_SERVER_ROLE = "GEFEN_TORCHRUN_RANK0_SERVER"


class TorchrunJobEnded(RuntimeError):
    """A scenario call after the job ended (a rank hung, or the run was interrupted)."""


# --------------------------------------------------------------------------------------------
# The job as torchrun describes it to each rank
# --------------------------------------------------------------------------------------------


class Job:
    """This rank's view of the torchrun job, from the environment torchrun sets."""

    def __init__(self, environ=os.environ) -> None:
        missing = [n for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if n not in environ]
        if missing:
            raise RuntimeError(f"gefen_conformance.harness.torchrun must be started by torchrun: {', '.join(missing)} not set")
        self.rank = int(environ["RANK"])
        self.world_size = int(environ["WORLD_SIZE"])
        self.local_rank = int(environ["LOCAL_RANK"])
        self.local_world_size = int(environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.node_rank = int(environ.get("GROUP_RANK", "0"))
        self.master_addr = environ["MASTER_ADDR"]
        self.master_port = int(environ["MASTER_PORT"])
        # torchrun's agent hosts the store; anything else that sets MASTER_* leaves it to rank 0
        self.agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"

    def store_client(self, timeout: float, *, may_host: bool = False):
        """A client of the job's store; with ``may_host`` (rank 0's first client only), the store
        itself when torchrun's agent does not host it."""
        import torch.distributed as dist

        host_it = may_host and self.rank == 0 and not self.agent_store
        store = dist.TCPStore(self.master_addr, self.master_port, self.world_size, host_it,
                              timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
        return dist.PrefixStore(_PREFIX, store)


def _dumps(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _wait(store, keys: list[str], seconds: float, poll: float = 0.1) -> bool:
    """Wait until every key exists or ``seconds`` quiet seconds pass (a load-clock
    :class:`~gefen_conformance.harness.deadlines.Deadline`, SPEC 4.2.10); True if they all exist.

    Polls with ``check`` rather than blocking in ``store.wait``: a Python signal handler (Ctrl-C,
    SIGTERM) runs within ``poll`` seconds, and an expired wait does not log a C++ warning."""
    deadline = Deadline(seconds)
    while not store.check(keys):
        if deadline.expired():
            return False
        time.sleep(poll)
    return True


# --------------------------------------------------------------------------------------------
# Rank 0: the launcher the suite's scenarios call
# --------------------------------------------------------------------------------------------


class TorchrunLauncher:
    """``gefen_conformance.harness.launch`` launcher over the ranks of this torchrun job (SPEC 4.7.3).

    Lives in rank 0, the process that runs pytest. ``hellos`` are every rank's start-up facts
    (rank -> dict with ``host``, ``pid``, ``node_rank``, ``device_name``).
    """

    def __init__(self, job: Job, control, server, device, backend: str, hellos: dict[int, dict]) -> None:
        self.job = job
        self.control = control
        self.server = server  # the rank-0 server (a Popen), or None where it cannot be watched
        self.device = device
        self.backend = backend
        self.hellos = hellos
        self.ended: str | None = None
        self.session = None  # the pytest session, told to stop when the job ends
        self.preparation_s = 0.0  # the slowest serving rank's preparation at start-up (SPEC 4.2.11)
        self._calls = itertools.count(1)
        self._lock = threading.Lock()

    # -- what the certificate says --------------------------------------------------------

    def execution(self) -> launch.Execution:
        nodes = len({h["node_rank"] for h in self.hellos.values()}) or 1
        if nodes > 1:
            names = {f"node{h['node_rank']}/{h['device_name']}" for h in self.hellos.values()}
        else:
            names = {h["device_name"] for h in self.hellos.values()}
        return launch.Execution(launcher="torchrun", nodes=nodes, world_size=self.job.world_size,
                                max_world_size=self.job.world_size, backend=self.backend,
                                device_type=self.device.type, device_names=tuple(sorted(names)))

    # -- one call -------------------------------------------------------------------------

    def next_command(self) -> int:
        return next(self._calls)

    def end_job(self, why: str) -> None:
        """No further calls; pytest stops after the current test."""
        if self.ended is None:
            self.ended = why
        if self.session is not None:
            # shouldfail rather than shouldstop: pytest then reports a failed, stopped run naming
            # this reason (shouldstop would read as a Ctrl-C in the certificate)
            self.session.shouldfail = f"the torchrun job ended: {why}"

    def run(self, fn: Callable[..., Any], world_size: int, args: Sequence[Any], kwargs: dict[str, Any], *,
            timeout: float, allow_failure: bool, pg_timeout: float | None, failure_grace: float) -> list:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if pg_timeout is None:
            pg_timeout = max(timeout / 2.0, timeout - 10.0)
        if not pg_timeout > 0:
            raise ValueError(f"pg_timeout must be positive, got {pg_timeout!r}")
        if world_size > self.job.world_size:
            raise launch.WorldTooLarge(f"needs {world_size} ranks; the torchrun job has {self.job.world_size}")
        try:
            payload = _dumps((fn, tuple(args), dict(kwargs or {})))
        except Exception as exc:
            raise TypeError("a scenario call needs a picklable fn (a module-level function of an importable "
                            f"module) and picklable args/kwargs: {type(exc).__name__}: {exc}") from exc
        with self._lock:  # one call at a time: the ranks serve calls in order
            if self.ended is not None:
                raise TorchrunJobEnded(f"no scenario call runs after the torchrun job ended: {self.ended}")
            call_id = self.next_command()
            task = {"call_id": call_id, "world_size": world_size, "backend": self.backend,
                    "pg_timeout": wall_bound(float(pg_timeout)), "sys_path": list(sys.path), "cwd": os.getcwd(),
                    "payload": payload}
            self.control.set(f"cmd/{call_id}", _dumps(("run", task)))
            outcomes = self._supervise(call_id, world_size, float(timeout), float(failure_grace))
        _echo_output(outcomes)
        if allow_failure:
            return outcomes
        if any(not o.ok for o in outcomes):
            name = getattr(fn, "__qualname__", repr(fn))
            raise RankFailure(outcomes, f"torchrun, world_size={world_size} of {self.job.world_size}, {name}, "
                                        f"timeout {timeout:g} s")
        return [o.value for o in outcomes]

    def _outcome(self, rank: int, report: dict) -> RankOutcome:
        pid = report.get("pid", self.hellos.get(rank, {}).get("pid"))
        status = report["status"]
        if status == "ok":
            try:
                value = pickle.loads(report["value"])
            except BaseException as exc:  # noqa: BLE001
                from gefen_conformance.harness.exception_text import format_exception, qualified_name

                return RankOutcome(rank=rank, status="raised", exc_type=qualified_name(type(exc)),
                                   message=f"the return value could not be unpickled on rank 0: {exc}",
                                   traceback=format_exception(exc), pid=pid, exception=exc)
            return RankOutcome(rank=rank, status="ok", value=value, pid=pid, output=report.get("output", ""))
        exception = None
        if report.get("exc_bytes") is not None:
            try:
                exception = pickle.loads(report["exc_bytes"])
            except BaseException:  # noqa: BLE001
                exception = None
        return RankOutcome(rank=rank, status=status, exc_type=report.get("exc_type"),
                           message=report.get("message", ""), traceback=report.get("traceback", ""),
                           exitcode=report.get("exitcode"), pid=pid, exception=exception,
                           output=report.get("output", ""))

    def _supervise(self, call_id: int, world_size: int, timeout: float, failure_grace: float) -> list[RankOutcome]:
        outcomes: list[RankOutcome | None] = [None] * world_size
        pending = set(range(world_size))
        deadline = Deadline(timeout)
        grace: Deadline | None = None
        first_failure: int | None = None
        aborted: Deadline | None = None  # REPORT_WAIT_S from the abort
        why = ""

        def settle(rank: int, report: dict) -> None:
            nonlocal first_failure, grace
            outcomes[rank] = outcome = self._outcome(rank, report)
            pending.discard(rank)
            if not outcome.ok and first_failure is None:
                first_failure = rank
                grace = Deadline(failure_grace)

        try:
            while pending:
                for rank in sorted(pending):
                    key = f"call/{call_id}/outcome/{rank}"
                    if self.control.check([key]):
                        settle(rank, pickle.loads(self.control.get(key)))
                if 0 in pending and self.server is not None and self.server.poll() is not None:
                    code = self.server.returncode
                    settle(0, {"status": "died", "exitcode": code, "pid": self.server.pid,
                               "message": f"the rank-0 server (pid {self.server.pid}) ended during the call",
                               "traceback": f"rank 0: the rank-0 server (pid {self.server.pid}) ended during "
                                            f"call {call_id} with exit code {code} (its stderr is torchrun's)"})
                if not pending:
                    break
                if aborted is None:
                    if deadline.expired() or (grace is not None and grace.expired()):
                        if grace is not None and grace.expired() and not deadline.expired():
                            why = (f"still running {deadline.wall_elapsed():.1f} s into the call, {failure_grace:g} s "
                                   f"after rank {first_failure} failed")
                        else:
                            why = f"did not finish within {deadline.describe()}"
                        aborted = Deadline(REPORT_WAIT_S)
                        self.control.set(f"call/{call_id}/abort", why.encode())
                elif aborted.expired():
                    for rank in sorted(pending):
                        settle(rank, {"status": "hung", "message": f"{why}; the rank sent no report (its stack "
                                      f"could not be dumped) within {REPORT_WAIT_S:g} s of the abort",
                                      "traceback": f"rank {rank}: {why}; no report, no stack dump"})
                    break
                time.sleep(POLL_S)
        except BaseException:
            # Ctrl-C (or anything else) while a call runs: the participants stop at once.
            try:
                self.control.set(f"call/{call_id}/abort", b"interrupted")
            except Exception:  # noqa: BLE001
                pass
            self.end_job("interrupted during a scenario call")
            raise
        hung = [o for o in outcomes if o is not None and o.status == "hung"]
        if hung:
            self.end_job(f"rank(s) {', '.join(str(o.rank) for o in hung)} hung in call {call_id} and cannot be "
                         "stopped")
        return outcomes  # type: ignore[return-value]


def _echo_output(outcomes: list[RankOutcome]) -> None:
    """What the ranks printed, into this process's stdout (pytest captures it per test, as under
    the pool)."""
    for outcome in outcomes:
        if outcome.output:
            sys.stdout.write("".join(f"[rank {outcome.rank}] {line}\n" for line in outcome.output.splitlines()))
    sys.stdout.flush()


class _StopWhenJobEnds:
    """pytest plugin (rank 0): gives the launcher the session it stops when the job ends."""

    def __init__(self, launcher: TorchrunLauncher) -> None:
        self.launcher = launcher

    def pytest_sessionstart(self, session) -> None:
        self.launcher.session = session


# --------------------------------------------------------------------------------------------
# Ranks other than 0: serve calls
# --------------------------------------------------------------------------------------------


def serve(job: Job, control, pg_store, device, broken: str | None = None) -> None:
    """Serve scenario calls until rank 0 posts ``exit``; never returns (``os._exit``). ``broken``:
    why this rank cannot take part (its preparation failed), reported as its outcome of every call."""
    # ``broken`` is also set once a call of ours hung: the thread is still stuck in it
    for call_id in itertools.count(1):
        key = f"cmd/{call_id}"
        while not _wait(control, [key], 3600.0, IDLE_POLL_S):
            pass
        kind, task = pickle.loads(control.get(key))
        if kind == "exit":
            _leave(0)
        if job.rank >= task["world_size"]:
            continue
        outcome_key = f"call/{call_id}/outcome/{job.rank}"
        if broken is not None:
            control.set(outcome_key, _dumps({"status": "raised", "exc_type": "RuntimeError", "message": broken,
                                             "traceback": broken, "exc_bytes": None, "pid": os.getpid()}))
            continue
        with CapturedOutput() as output:
            report = _take_part(job, control, pg_store, device, task)
        report["output"] = output.text
        control.set(outcome_key, _dumps(report))
        if report["status"] == "hung":
            broken = f"rank {job.rank} is still stuck in call {call_id}, which hung"


def _take_part(job: Job, control, pg_store, device, task: dict) -> dict:
    """Run this rank's part in a call; its report, or "hung" (stacks dumped) once rank 0 aborts."""
    part = Participation(task, job.rank, device, pg_store).start()
    abort_key = f"call/{task['call_id']}/abort"
    while True:
        part.thread.join(0.1)
        if not part.finished() and control.check([abort_key]):
            why = control.get(abort_key).decode()
            if why == "interrupted":
                _leave(0)  # rank 0 writes the incomplete certificate; a failed exit here would cut it short
            if not part.finished():  # (one that ended just now: its own report is the truth)
                return dict(hung_report(job.rank, why), pid=os.getpid())
        if part.finished():
            return dict(part.report(), pid=os.getpid())


class CapturedOutput:
    """What this process writes to its stdout and stderr (Python or C level) during a call, kept
    (the last :data:`OUTPUT_TAIL_BYTES`) for the rank's outcome, as the pool keeps a rank's output;
    the descriptors are restored afterwards."""

    def __init__(self) -> None:
        self.text = ""

    def __enter__(self) -> "CapturedOutput":
        _flush()
        self._file = tempfile.TemporaryFile()
        self._saved = [os.dup(1), os.dup(2)]
        os.dup2(self._file.fileno(), 1)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc_info) -> None:
        _flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        size = self._file.seek(0, os.SEEK_END)
        self._file.seek(max(0, size - OUTPUT_TAIL_BYTES))
        self.text = self._file.read().decode("utf-8", "replace")
        self._file.close()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _leave(code: int) -> None:
    _flush()
    os._exit(code)


def _watch_parent(parent: int, on_gone: Callable[[], None]) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            on_gone()
            return


# --------------------------------------------------------------------------------------------
# Start-up
# --------------------------------------------------------------------------------------------


def _device_facts(device_arg: str | None, job: Job):
    """(device of this rank, its name, error text or None)."""
    import torch

    from gefen_conformance.harness import devices

    try:
        chosen = devices.parse(device_arg or "cpu")
        short = devices.shortage(chosen, job.local_world_size)
        if short is not None:
            raise devices.DeviceUnavailable(f"--device {device_arg}: {short}")
        device = devices.for_rank(chosen, job.local_rank)
        return chosen, device, _device_name(torch, device), None
    except devices.DeviceUnavailable as exc:
        return None, None, "", str(exc)


def _device_name(torch, device) -> str:
    """``type:index`` and the hardware's name where torch reports one (``"cuda:0 NVIDIA H200"``,
    as the pool's ``execution`` names devices, SPEC 4.6.5); ``cpu`` for CPU."""
    if device.type == "cpu":
        return "cpu"
    getter = getattr(getattr(torch, device.type, None), "get_device_name", None)
    try:
        return f"{device} {getter(device)}" if getter is not None else str(device)
    except Exception:  # noqa: BLE001 - a name is a nicety; the device itself was checked
        return str(device)


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
    if not _wait(control, ["markers-done"], STARTUP_TIMEOUT_S):
        return f"rank {job.rank}: not every rank wrote its marker in {run_dir} within {STARTUP_TIMEOUT_S:g} s"
    missing = [r for r in range(job.world_size) if not (Path(run_dir) / f".rank-{r}").exists()]
    if missing:
        return (f"rank {job.rank} on {socket.gethostname()} does not see the markers of rank(s) "
                f"{', '.join(map(str, missing))} in {run_dir}: --checkpoint-dir must be one filesystem "
                "shared by every node")
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gefen_conformance.harness.torchrun",
                                     description="one rank of a torchrun certification (see gefen_conformance.harness.torchrun)")
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--certificate", default=None)
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--result-file", default=None)
    return parser


def pytest_arguments(impl: str, certificate: str | None, device: str | None, run_dir: str,
                     passthrough: Sequence[str]) -> list[str]:
    """What rank 0 gives ``pytest.main``: the suite against ``impl``, no xdist (scenarios must run
    on this job's ranks, not in worker processes with a pool of their own), temp dirs in the run
    directory every rank sees."""
    args = [f"--impl={impl}", "-p", "no:cacheprovider", "-p", "no:xdist", f"--basetemp={Path(run_dir) / 'pytest'}"]
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
            argv, passthrough = argv[:cut], argv[cut + 1:]
            break
    options = _parser().parse_args(argv)
    job = Job()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: this rank's stacks on stderr
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
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
    control = job.store_client(STARTUP_TIMEOUT_S, may_host=True)
    pg_store = job.store_client(STARTUP_TIMEOUT_S) if serving else None
    chosen, device, name, error = _device_facts(options.device, job)
    hello = {"host": socket.gethostname(), "pid": os.getpid(), "node_rank": job.node_rank,
             "local_rank": job.local_rank, "device_name": name, "error": error}
    control.set(f"hello/{job.rank}", _dumps(hello))
    return control, pg_store, chosen, device


def _serving_process() -> None:
    """Ctrl-C and SIGTERM reach every rank's process group from torchrun: a server just leaves,
    and so does one whose parent is gone."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, f: _leave(128 + s))
    threading.Thread(target=_watch_parent, args=(os.getppid(), lambda: _leave(EXIT_PARENT_GONE)),
                     daemon=True, name="torchrun-parent-watchdog").start()


def _serving_rank(job: Job, options) -> None:
    _serving_process()
    control, pg_store, _, device = _startup(job, options)
    if not _wait(control, ["run-dir"], STARTUP_TIMEOUT_S):
        _leave(EXIT_PARENT_GONE)
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
    control = job.store_client(STARTUP_TIMEOUT_S)
    pg_store = job.store_client(STARTUP_TIMEOUT_S)
    _, device, _, _ = _device_facts(options.device, job)
    broken = _prepare(job, control, options, device)
    control.set("server-ready/0", str(os.getpid()).encode())
    _serve_until_exit(job, control, pg_store, device, broken)


def _prepare(job: Job, control, options, device) -> str | None:
    """This rank's preparation before any scenario call (SPEC 4.2.11: the scenario modules and
    torch's lazy imports, the implementation's ``prepare``), posted as ``prepared/<rank>`` with
    its time; what it raised, as text, or None."""
    from gefen_conformance.plugin import warmup
    from gefen_conformance.harness.exception_text import format_exception

    started = time.monotonic()
    error = None
    try:
        warmup.prepare_rank(options.impl, device=device)
    except Exception as exc:  # noqa: BLE001 - every call this rank takes part in reports it
        error = f"rank {job.rank}: preparing the implementation failed before any call:\n{format_exception(exc)}"
    control.set(f"prepared/{job.rank}", _dumps({"seconds": time.monotonic() - started, "error": error}))
    return error


def _serve_until_exit(job: Job, control, pg_store, device, broken: str | None = None) -> None:
    try:
        serve(job, control, pg_store, device, broken)
    except Exception as exc:  # noqa: BLE001 - the store (torchrun's agent) is gone: so is the job
        print(f"gefen-conformance rank {job.rank}: leaving, the job's store failed: {type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        _leave(EXIT_PARENT_GONE)


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

    return subprocess.Popen([sys.executable, "-m", "gefen_conformance.harness.torchrun", *argv],
                            env=dict(os.environ, **{_SERVER_ROLE: "1"}))


def _rank_zero(job: Job, options, passthrough: list[str], argv: list[str]) -> int:
    def parent_gone() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # pytest stops and writes an incomplete certificate
        time.sleep(60)
        _leave(EXIT_PARENT_GONE)

    threading.Thread(target=_watch_parent, args=(os.getppid(), parent_gone), daemon=True,
                     name="torchrun-parent-watchdog").start()
    control, _, chosen, device = _startup(job, options, serving=False)
    status, detail, run_dir, server = USAGE_ERROR, "", "", None
    try:
        try:
            run_dir = _make_run_dir(options.checkpoint_dir)
            control.set("run-dir", run_dir.encode())
        except OSError as exc:
            control.set("run-dir", b"")
            raise _StartupError(f"--checkpoint-dir {options.checkpoint_dir}: cannot make the run directory "
                                f"there: {exc}") from None
        hellos = _gather(control, "hello", job.world_size)
        control.set("seen/0", (_check_run_dir(job, control, run_dir) or "").encode())
        seen = _gather(control, "seen", job.world_size, raw=True)
        errors = [h["error"] for _, h in sorted(hellos.items()) if h["error"]]
        errors += [text for _, text in sorted(seen.items()) if text]
        if errors:
            raise _StartupError(errors[0] + (f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""))
        server = _start_server(argv)
        if not _wait(control, ["server-ready/0"], STARTUP_TIMEOUT_S):
            raise _StartupError(f"the rank-0 server did not start within {STARTUP_TIMEOUT_S:g} s")
        from gefen_conformance.harness import devices

        launcher = TorchrunLauncher(job, control, server, device, devices.backend_for(chosen), hellos)
        prepared = _gather(control, "prepared", job.world_size)
        launcher.preparation_s = max((p["seconds"] for p in prepared.values()), default=0.0)
        launch.set_launcher(launcher)
        import pytest

        args = pytest_arguments(options.impl, options.certificate, options.device, run_dir, passthrough)
        status = int(pytest.main(args, plugins=[_StopWhenJobEnds(launcher)]))
        if launcher.ended is not None:
            print(f"gefen-conformance: the torchrun job ended early: {launcher.ended}", file=sys.stderr)
    except _StartupError as error:
        detail = str(error)
        print(f"gefen-conformance certify --launcher torchrun: {detail}", file=sys.stderr)
    finally:
        try:
            control.set(f"cmd/{_next_free_command(control)}", _dumps(("exit", None)))
        except Exception:  # noqa: BLE001 - the store is gone: the other ranks are too
            pass
        if server is not None:
            _reap(server)
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        _write_result(options.result_file, status, detail)
    _leave(0 if options.result_file else status)
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
    if not _wait(control, keys, STARTUP_TIMEOUT_S):
        absent = [k for k in keys if not control.check([k])]
        raise _StartupError(f"{', '.join(absent)} did not arrive within {STARTUP_TIMEOUT_S:g} s of start-up")
    return {r: (control.get(k).decode() if raw else pickle.loads(control.get(k))) for r, k in enumerate(keys)}


def _next_free_command(control) -> int:
    """The first ``cmd/<n>`` not yet posted (where the serving ranks will look next)."""
    launcher = launch.active()
    if isinstance(launcher, TorchrunLauncher):
        return launcher.next_command()
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""The pool's worker processes, seen from the caller: starting, keeping and stopping them
(SPEC 4.2.2-4.2.3, 4.2.8).

A :class:`Worker` is one rank process (:func:`gefen_conformance.harness.pool.worker.worker_main`)
with its pipe, its stack-dump file and its output file. A :class:`Pool` is one flat set of warm
workers of this process, regrouped per call: :meth:`Pool.checkout` hands out idle workers first
and starts the rest (a bounded start-up, supervised as a call is), :meth:`Pool.release` keeps at
most ``GEFEN_RANKS_POOL_MAX`` (default 8) idle, :meth:`Pool.discard` asks workers to leave and
then kills and reaps them. Workers are forked from multiprocessing's fork server with torch
preloaded (see :func:`start_fork_server` for why); ``GEFEN_RANKS_START_METHOD=spawn`` spawns them
instead (slower; for debugging; there ``PR_SET_PDEATHSIG`` follows the caller's thread that
started a worker, so call the harness from one long-lived thread). The environment variables are
read when a pool starts or a worker is started, not at import.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from gefen_conformance.harness.outcomes import RankFailure, RankOutcome
from gefen_conformance.harness.pool import worker as pool_worker
from gefen_conformance.harness.pool.supervision import supervise
from gefen_conformance.harness.rank_side import SINGLE_THREAD_ENV

__all__ = [
    "Pool",
    "Worker",
    "fork_server_pid",
    "remove_stale_pool_dirs",
    "start_fork_server",
    "startup_timeout_s",
]

#: modules the fork server imports before any preparation asks for more
BASE_PRELOAD = ("torch", "torch.distributed")

_POOL_DIR_PREFIX = "gefen-ranks-"
_DUMP_SETTLE_S = 0.05
_REAP_S = 5.0
_EXIT_WAIT_S = 1.0


def startup_timeout_s() -> float:
    """The bound on starting or preparing a worker, in quiet seconds (``GEFEN_RANKS_STARTUP_TIMEOUT``,
    default 120; SPEC 4.2.8)."""
    return float(os.environ.get("GEFEN_RANKS_STARTUP_TIMEOUT", "120"))


# --------------------------------------------------------------------------------------------
# One worker process
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Worker:
    """One rank worker process of the pool, with its pipe and its dump and output files."""

    ident: int
    process: Any
    conn: Any
    dump_path: str
    output_path: str
    preload: tuple = ()
    pid: int | None = None  # the process's, until the worker reports its own
    dump_offset: int = 0
    output_offset: int = 0
    own_group: bool = False

    def __post_init__(self) -> None:
        if self.pid is None:
            self.pid = self.process.pid

    def alive(self) -> bool:
        return self.process.is_alive() and not self.conn.closed

    def mark_offsets(self) -> None:
        self.dump_offset = _file_size(self.dump_path)
        self.output_offset = _file_size(self.output_path)

    def read_dump(self) -> str:
        return _read_from(self.dump_path, self.dump_offset)

    def read_output(self) -> str:
        text = _read_from(self.output_path, self.output_offset)
        self.output_offset += len(text.encode("utf-8", "surrogateescape"))
        return text

    def signal_dump(self) -> None:
        """Ask the worker to dump every thread's stack into its dump file (SIGUSR1)."""
        try:
            if self.pid is not None and self.process.is_alive():
                os.kill(self.pid, signal.SIGUSR1)
        except (OSError, ValueError):
            pass

    def wait_dump(self, deadline: float) -> None:
        """Wait until the stack dump has been written (size grew, then stopped growing)."""
        last = self.dump_offset
        stable_since = None
        while time.monotonic() < deadline:
            size = _file_size(self.dump_path)
            if size > self.dump_offset:
                if size == last:
                    if stable_since is None:
                        stable_since = time.monotonic()
                    elif time.monotonic() - stable_since >= _DUMP_SETTLE_S:
                        return
                else:
                    last, stable_since = size, None
            if not self.process.is_alive():
                return
            time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL the worker and, if it leads its own process group, everything in that group
        (processes the scenario started). Safe to call on a dead worker."""
        if self.own_group and self.pid is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            if self.process.is_alive():
                self.process.kill()
        except (OSError, ValueError, AttributeError):
            pass

    def reap(self, timeout: float = _REAP_S) -> None:
        try:
            self.process.join(timeout)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join(timeout)
        except (OSError, ValueError, AssertionError):
            pass
        try:
            self.conn.close()
        except OSError:
            pass

    def remove_files(self) -> None:
        for path in (self.dump_path, self.output_path):
            try:
                os.unlink(path)
            except OSError:
                pass


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", "surrogateescape")
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------
# The pool of warm workers
# --------------------------------------------------------------------------------------------


def remove_stale_pool_dirs() -> None:
    """Remove the temp dirs of pools whose owning process is gone (it was killed: a process that
    exits normally removes its own dir at exit)."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if not name.startswith(_POOL_DIR_PREFIX):
            continue
        owner, dash, _ = name[len(_POOL_DIR_PREFIX) :].partition("-")
        if not dash or not owner.isdigit() or int(owner) == os.getpid():
            continue  # not a "<prefix><pid>-<random>" dir made by this module, or our own
        try:
            os.kill(int(owner), 0)
            continue  # the owner (or a process that reused its pid) is alive: leave it
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)


_ENV_LOCK = threading.Lock()


def start_fork_server() -> None:
    """Start multiprocessing's fork server (if not yet running) with single-threaded BLAS/OpenMP.

    Why a fork server: starting a Python process that imports torch costs 1-2 s, which would
    dominate every scenario, and plain ``fork`` of the caller is unsafe: the caller (pytest)
    may hold threads (OpenBLAS's pool, which ``import torch`` starts, and whatever else the test
    process started), and a forked child inherits their locks but not the threads. ``"spawn"``
    is safe but pays a full interpreter start and torch import per worker, at first use and
    again after every failure. The fork server imports torch once, in a process with exactly
    one thread, and forks each worker from that clean state, so a replacement worker is ready
    in about 0.1 s. Forking is done by the server, so workers do not depend on which of the
    caller's threads asked for them (``PR_SET_PDEATHSIG`` is tied to the forking thread).

    ``import torch`` imports numpy, whose OpenBLAS starts a worker thread per core at load time
    unless told otherwise: hence the thread variables, set to 1 while the server starts. The
    fork server is multiprocessing's per-process singleton: it exits with the caller, and if
    other code started it before this module did, workers still work but import torch
    themselves.
    """
    from multiprocessing import forkserver

    with _ENV_LOCK:
        saved = {name: os.environ.get(name) for name in SINGLE_THREAD_ENV}
        try:
            for name in SINGLE_THREAD_ENV:
                os.environ[name] = "1"
            forkserver.ensure_running()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _accept_ready(rank: int, worker: Worker, message: tuple) -> RankOutcome | None:
    if message[0] != "ready":
        return None
    worker.pid = message[1]
    worker.own_group = bool(message[2])
    return RankOutcome(rank=rank, status="ok", pid=worker.pid)


class Pool:
    """One flat pool of warm workers, regrouped per call (see the module docstring). ``preload``:
    the modules the fork server imports when this pool starts it."""

    def __init__(self, preload: tuple = ()) -> None:
        self.owner_pid = os.getpid()
        self.lock = threading.Lock()
        self.idle: list[Worker] = []
        self.live: dict[int, Worker] = {}
        self.counter = 0
        remove_stale_pool_dirs()
        self.tmpdir = tempfile.mkdtemp(prefix=f"{_POOL_DIR_PREFIX}{os.getpid()}-")
        method = os.environ.get("GEFEN_RANKS_START_METHOD", "forkserver")
        self.context = multiprocessing.get_context(method)
        if method == "forkserver":
            # honoured only by a fork server that is not running yet (it is one per process)
            self.context.set_forkserver_preload(list(dict.fromkeys(BASE_PRELOAD + tuple(preload))))
            start_fork_server()
        self.closed = False

    # -- starting -------------------------------------------------------------------------

    def _start_one(self, preload: tuple) -> Worker:
        with self.lock:
            self.counter += 1
            ident = self.counter
        dump_path = os.path.join(self.tmpdir, f"worker-{ident}.stacks")
        output_path = os.path.join(self.tmpdir, f"worker-{ident}.out")
        parent_conn, child_conn = self.context.Pipe(duplex=True)
        process = self.context.Process(
            target=pool_worker.worker_main,
            args=(child_conn, os.getpid(), dump_path, output_path, preload),
            name=f"gefen-rank-worker-{ident}",
            daemon=False,
        )
        process.start()
        child_conn.close()
        worker = Worker(ident, process, parent_conn, dump_path, output_path, tuple(preload))
        with self.lock:
            self.live[ident] = worker
        return worker

    def checkout(self, count: int, preload: tuple = ()) -> list[Worker]:
        """``count`` ready workers started with ``preload``: idle ones first, then new ones (bounded
        start-up); idle ones started with another ``preload`` are discarded."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the rank worker pool has been shut down")
            taken: list[Worker] = []
            stale = [w for w in self.idle if w.preload != preload]
            self.idle = [w for w in self.idle if w.preload == preload]
            while self.idle and len(taken) < count:
                worker = self.idle.pop()
                if worker.alive():
                    taken.append(worker)
                else:
                    stale.append(worker)
        if stale:
            self.discard(stale)
        fresh: list[Worker] = []
        try:
            for _ in range(count - len(taken)):
                fresh.append(self._start_one(preload))
            started = supervise(
                fresh,
                _accept_ready,
                timeout=startup_timeout_s(),
                failure_grace=math.inf,  # workers start independently: wait for each
                overdue="did not become ready within {startup}",
                silent="ended during start-up, before reporting ready (its output so far went "
                "to the caller's stderr)",
            )
        except BaseException:
            self.discard(taken + fresh)
            raise
        if any(not outcome.ok for outcome in started):
            self.discard(taken + fresh)
            raise RankFailure(started, "rank worker processes failed to start")
        return taken + fresh

    # -- returning --------------------------------------------------------------------------

    def release(self, workers: list[Worker]) -> None:
        surplus: list[Worker] = []
        keep = int(os.environ.get("GEFEN_RANKS_POOL_MAX", "8"))
        with self.lock:
            for worker in workers:
                if self.closed or len(self.idle) >= keep:
                    surplus.append(worker)
                else:
                    self.idle.append(worker)
        if surplus:
            self.discard(surplus)

    def discard(self, workers: list[Worker], *, ask_first: bool = True) -> None:
        """Stop and reap workers: ask politely, then SIGKILL whatever is left."""
        if ask_first:
            for worker in workers:
                try:
                    if worker.alive():
                        worker.conn.send(("exit",))
                except (OSError, ValueError, BrokenPipeError):
                    pass
            deadline = time.monotonic() + _EXIT_WAIT_S
            for worker in workers:
                try:
                    worker.process.join(max(0.0, deadline - time.monotonic()))
                except (OSError, ValueError, AssertionError):
                    pass
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.reap()
            worker.remove_files()
            with self.lock:
                self.live.pop(worker.ident, None)

    def shutdown(self, *, now: bool = False) -> None:
        with self.lock:
            self.closed = True
            workers = list(self.live.values())
            self.idle.clear()
        self.discard(workers, ask_first=not now)
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def kill_all(self) -> None:
        """SIGKILL every worker (and what each started in its process group) and the fork server,
        without waiting for them to be reaped; the pool is closed."""
        with self.lock:
            self.closed = True
            workers = list(self.live.values())
        for worker in workers:
            worker.kill()
        server = fork_server_pid()
        if server:
            try:
                os.kill(server, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def idle_pids(self) -> list[int]:
        with self.lock:
            return [worker.pid for worker in self.idle if worker.pid is not None]


def fork_server_pid() -> int | None:
    """Pid of multiprocessing's fork server, if this process has one."""
    try:
        from multiprocessing import forkserver

        return forkserver._forkserver._forkserver_pid  # noqa: SLF001
    except Exception:
        return None

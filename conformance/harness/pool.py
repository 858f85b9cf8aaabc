"""Multi-rank harness: run one function on N local processes joined in a process group: gloo on
CPU (the default), or one accelerator per rank with its backend (NCCL for CUDA) under
``--gefen-device`` (SPEC 4.6.3).

Contract
========

``run_on_ranks(fn, world_size, args=(), kwargs=None, *, timeout=60.0)`` runs
``fn(*args, **kwargs)`` once on each of ``world_size`` worker processes and returns the list of
their return values, index = rank.

Inside ``fn``:

* the default process group is initialised with backend ``"gloo"`` (``devices.backend_for``
  of the call's device: NCCL for CUDA), ``rank`` r of
  ``world_size``, by rendezvous on a ``FileStore`` that is new for every call (a fresh file in
  the pool's private temporary directory, removed after the call); every rank has its group
  before any rank enters ``fn``. ``torch.distributed.get_rank()``, ``new_group``, device
  meshes and friends all work. ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``MASTER_ADDR`` (127.0.0.1) and ``MASTER_PORT`` (a port that was free when the call started,
  for code that builds its own rendezvous from the environment) are set as well;
* ``gefen_conformance.harness.world.current()`` is this rank's :class:`~gefen_conformance.harness.world.World`: ``rank`` r of
  ``size`` ``world_size``, ``group`` the default group, ``device`` cpu (or rank r's
  accelerator, ``devices.for_rank(device, r)``, made the process's current one), ``mesh`` a 1-D mesh
  over the group, and ``die(code)`` leaves the process with ``os._exit(code)`` (reported "died");
* ``torch.get_num_threads() == 1``, SIGINT is ignored (Ctrl-C is handled by the caller, which
  then kills the ranks), and stdout/stderr (Python and C level) are captured per rank;
* the process group is destroyed by the harness after ``fn`` returns. A rank is "ok" only if
  ``fn`` returned, the group was destroyed cleanly and the return value pickled.

``fn`` must be picklable by reference (a module-level function of an importable module), and so
must ``args`` and ``kwargs``; this is checked in the caller before any rank starts (``TypeError``).
The caller's current ``sys.path`` and working directory are applied in the ranks for each call.

Outcomes
--------

Each rank ends in exactly one :class:`RankOutcome` ``status``:

``"ok"``      ``fn`` returned; ``value`` holds the return value.
``"raised"``  ``fn`` (or the group set-up/teardown, or pickling the result) raised; ``exc_type``
              is the exception's qualified name, ``message`` its ``str``, ``traceback`` the full
              formatted traceback, ``exception`` the exception object itself when it survived
              pickling (``None`` otherwise: an unpicklable exception still reports type, message
              and traceback as text).
``"died"``    the process ended without reporting (``os._exit``, a signal, a segfault);
              ``exitcode`` is its exit code (negative: the signal number), ``traceback`` holds
              the faulthandler dump of a fatal signal when there is one.
``"hung"``    the rank was still running at the deadline (or ``failure_grace`` seconds after
              another rank failed); every thread's Python stack was dumped with faulthandler
              into ``traceback`` and the process was then killed (``exitcode`` -9).

When any rank is not "ok", ``run_on_ranks`` raises :class:`RankFailure`, whose ``outcomes`` is
the list of all ranks' outcomes and whose ``str`` shows every rank's status and traceback. With
``allow_failure=True`` it returns that outcome list instead, failed or not, so a scenario can
assert which error each rank got.

Bounds
------

* ``timeout`` is the deadline of the call, counted from the moment the (already started and
  prepared) workers receive the task; starting workers has its own bound (120 s, or
  ``GEFEN_RANKS_STARTUP_TIMEOUT``). Every bound here is a :class:`~gefen_conformance.harness.deadlines.Deadline`:
  seconds of a quiet machine, times the run's deadline scale, on a clock that the machine's
  load slows down (at most 20x), so a slow rank is not taken for a hung one (SPEC 4.2.10). Ranks
  still running at the deadline are stack-dumped and killed, so on a quiet machine the call
  returns within ``timeout`` plus at most 2 s of waiting for the dumps plus the time to reap the
  processes (milliseconds), and on a loaded one within ``MAX_STRETCH`` times that.
* The gloo timeout (``pg_timeout``, used for the rendezvous and every collective) defaults to
  ``max(timeout / 2, timeout - 10)``, shorter than the deadline, so a rank blocked on a peer that
  hangs gets a gloo error and reports it before the deadline. gloo counts it in wall time, so it
  is scaled and stretched by the load when the call starts (``deadlines.wall_bound``).
* A rank that raised reports and then exits at once without a collective teardown. Its gloo
  sockets close, so peers blocked in a collective with it, or with a rank that died, get
  "Connection closed/reset by peer" within milliseconds and report "raised" instead of hanging.
  After the first failure the other ranks get ``failure_grace`` seconds (default 5, never past
  the deadline) to report; stragglers are then handled as hung.
* No worker process outlives its usefulness: failed, died and hung workers are killed and reaped
  before the call returns or raises; if the caller is interrupted (``KeyboardInterrupt`` or any
  other exception while waiting) every worker of the call is killed before the exception
  propagates; if the calling process dies, every worker notices (Linux ``PR_SET_PDEATHSIG``
  relative to its forking parent, plus a watchdog thread that polls both its parent and the
  test process every 0.5 s) and exits; idle workers are shut down by :func:`shutdown_pool`,
  which also runs at interpreter exit.

Warm workers
------------

Workers are pooled: idle processes with torch already imported, regrouped per call (a 4-rank
call after a 2-rank call starts only two new processes); each call makes a new store,
initialises a fresh process group and destroys it again. Workers that reported "ok" go back to
the pool even if a peer failed (their group was torn down cleanly); all others are discarded,
and replacements are started on the next call. Before every call a worker gets the caller's
current environment variables, ``sys.path`` and working directory, and its default dtype, grad
mode, deterministic-algorithms flag and thread count are reset. The torch, ``random`` and (if
imported) numpy global generators are reseeded from ``os.urandom`` for every call, as a freshly
started process would be: ranks never share a random stream, warm or not, and a scenario that
needs reproducible numbers must seed explicitly. Module globals of the scenario's own modules do
persist between calls, as in any long-lived worker. At most ``GEFEN_RANKS_POOL_MAX`` (default
8) idle workers are kept.

One-time costs stay out of every deadline (SPEC 4.2.11): :func:`prepare_workers` names modules
every worker imports before it reports ready (the fork server imports them once when it starts
after the call) and a preparation each worker runs the first time a call reaches it on a device;
a call's deadline starts only when every one of its ranks has reported ``prepared``.
:func:`start_workers` starts idle workers ahead of the first call. Workers are forked from a single-threaded fork server that has torch
preloaded (see :func:`_start_fork_server` for why); ``GEFEN_RANKS_START_METHOD=spawn`` uses
``"spawn"`` instead (slower; for debugging; there ``PR_SET_PDEATHSIG`` follows the caller's
thread that started a worker, so call the harness from one long-lived thread).
"""

from __future__ import annotations

import atexit
import itertools
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from gefen_conformance.harness import pool_worker as _rank_worker
from gefen_conformance.harness.deadlines import Deadline, wall_bound
from gefen_conformance.harness.exception_text import format_exception, qualified_name

__all__ = ["DEFAULT_FAILURE_GRACE_S", "RankFailure", "RankOutcome", "prepare_workers", "run_on_ranks", "shutdown_pool",
           "start_workers"]

STATUSES = ("ok", "raised", "died", "hung")

#: seconds the other ranks get to report after the first rank failed (``failure_grace``)
DEFAULT_FAILURE_GRACE_S = 5.0

_HOST = "127.0.0.1"
_STARTUP_TIMEOUT_S = float(os.environ.get("GEFEN_RANKS_STARTUP_TIMEOUT", "120"))
_POOL_MAX_IDLE = int(os.environ.get("GEFEN_RANKS_POOL_MAX", "8"))
_START_METHOD = os.environ.get("GEFEN_RANKS_START_METHOD", "forkserver")
_DUMP_SETTLE_S = 0.05
_DUMP_WAIT_S = 2.0
_REAP_S = 5.0
_EXIT_WAIT_S = 1.0
_OUTPUT_TAIL_CHARS = 4000


@dataclass
class _Preparation:
    """What every worker does before it serves calls (see :func:`prepare_workers`)."""

    preload: tuple = ()
    payload: bytes | None = None  # pickled (key, fn, args), or None
    key: int = 0


_PREPARATION = _Preparation()
_PREPARATION_KEYS = itertools.count(1)
_BASE_PRELOAD = ("torch", "torch.distributed")


def prepare_workers(preload: Sequence[str] = (), prepare: Callable[..., Any] | None = None,
                    args: Sequence[Any] = ()) -> None:
    """Say what every rank worker does before a call's deadline starts (SPEC 4.2.11).

    ``preload``: modules imported once, before a worker reports ready: by the fork server itself
    when it has not started yet (so every worker forked from it has them for free; they must not
    start threads or touch an accelerator), else by each new worker. ``prepare(*args,
    device=...)``: a picklable module-level function run once per worker and device, when a call
    first reaches that worker on that device, before the call's deadline starts (the start-up
    bound applies); its exception is that rank's "raised" outcome and the call does not start.
    Idle workers started with another ``preload`` are replaced; ``prepare_workers()`` clears both.
    """
    global _PREPARATION
    payload = None
    if prepare is not None:
        try:
            payload = pickle.dumps((next(_PREPARATION_KEYS), prepare, tuple(args)), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise TypeError(f"prepare_workers needs a picklable prepare function and args: {type(exc).__name__}: "
                            f"{exc}") from exc
    _PREPARATION = _Preparation(tuple(preload), payload)


def start_workers(count: int) -> None:
    """Start (and prepare the imports of) ``count`` idle workers now, outside any call, so that
    the first calls find them warm; bounded like any start-up (``RankFailure`` when one fails)."""
    pool = _pool()
    pool.release(pool.checkout(count))


@dataclass
class RankOutcome:
    """How one rank of one call ended. ``status`` is one of "ok", "raised", "died", "hung"."""

    rank: int
    status: str
    value: Any = None
    exc_type: str | None = None
    message: str = ""
    traceback: str = ""
    exitcode: int | None = None
    pid: int | None = None
    output: str = ""
    exception: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def headline(self) -> str:
        if self.status == "ok":
            return f"rank {self.rank}: ok"
        if self.status == "raised":
            return f"rank {self.rank}: raised {self.exc_type}: {_first_line(self.message)}"
        if self.status == "died":
            return f"rank {self.rank}: died ({_describe_exitcode(self.exitcode)})"
        return f"rank {self.rank}: hung ({_first_line(self.message)})"

    def __repr__(self) -> str:  # the dataclass repr would print whole tracebacks
        extra = f", exc_type={self.exc_type!r}" if self.exc_type else ""
        return (
            f"RankOutcome(rank={self.rank}, status={self.status!r}{extra}, "
            f"exitcode={self.exitcode!r}, pid={self.pid!r})"
        )


class RankFailure(Exception):
    """At least one rank raised, died or hung; ``outcomes`` has a :class:`RankOutcome` per rank."""

    def __init__(self, outcomes: Sequence[RankOutcome], context: str = "") -> None:
        self.outcomes = list(outcomes)
        self.context = context
        super().__init__(self.outcomes, context)

    def __reduce__(self):
        return (type(self), (self.outcomes, self.context))

    @property
    def failed(self) -> list[RankOutcome]:
        return [outcome for outcome in self.outcomes if not outcome.ok]

    def __str__(self) -> str:
        failed = self.failed
        head = f"{len(failed)} of {len(self.outcomes)} ranks failed"
        if self.context:
            head += f" ({self.context})"
        lines = [head + ":"]
        lines += ["  " + outcome.headline() for outcome in self.outcomes]
        for outcome in self.outcomes:
            if outcome.ok:
                continue
            lines.append("")
            lines.append(f"---- {outcome.headline()} [pid {outcome.pid}] ----")
            lines.append(outcome.traceback.rstrip("\n") or "(no traceback)")
            if outcome.output.strip():
                tail = outcome.output[-_OUTPUT_TAIL_CHARS:]
                lines.append(f"---- rank {outcome.rank} output (last {len(tail)} chars) ----")
                lines.append(tail.rstrip("\n"))
        return "\n".join(lines)


def _first_line(text: str) -> str:
    text = (text or "").strip()
    return text.splitlines()[0] if text else ""


def _describe_exitcode(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}, exit code {code}"
        except ValueError:
            return f"killed by signal {-code}, exit code {code}"
    return f"exit code {code}"


# --------------------------------------------------------------------------------------------
# One worker process, seen from the caller
# --------------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, ident: int, process, conn, dump_path: str, output_path: str, preload: tuple = ()) -> None:
        self.ident = ident
        self.preload = preload
        self.process = process
        self.conn = conn
        self.dump_path = dump_path
        self.output_path = output_path
        self.pid: int | None = process.pid
        self.dump_offset = 0
        self.output_offset = 0
        self.own_group = False

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
# Supervision: wait, dump stacks, kill, reap, report
# --------------------------------------------------------------------------------------------

#: turns a message from worker ``rank`` into its outcome, or None when the message does not settle it
Accept = Callable[[int, _Worker, tuple], "RankOutcome | None"]


def _supervise(
    workers: list[_Worker],
    accept: Accept,
    *,
    timeout: float,
    failure_grace: float,
    overdue: str,
    silent: str,
) -> list[RankOutcome]:
    """Wait until every worker is settled; the one routine behind worker start-up and a call.

    A worker is settled by a message ``accept`` turns into its outcome. One that exits first is
    "died" (``silent`` says what it failed to do: "ended without reporting a result"). One still
    unsettled ``timeout`` seconds after the start, or ``failure_grace`` seconds after the first
    failed outcome (never past the deadline), has every thread's Python stack dumped, is killed
    and reaped, and is "hung" (``overdue`` words the deadline: ``{deadline}`` or ``{startup}``
    become its description). Both bounds are :class:`~gefen_conformance.harness.deadlines.Deadline` s:
    quiet seconds, scaled, on the clock the machine's load slows down (SPEC 4.2.10). Returns one
    outcome per worker, in order; no worker that is not "ok" is left running.
    """
    count = len(workers)
    outcomes: list[RankOutcome | None] = [None] * count
    pending = set(range(count))
    deadline = Deadline(timeout)
    grace: Deadline | None = None  # counted from the first failure
    first_failure: int | None = None
    at_eof: set[int] = set()  # pipe closed: from then on only the worker's exit is waited for

    def settle(rank: int, outcome: RankOutcome) -> None:
        nonlocal first_failure, grace
        outcomes[rank] = outcome
        pending.discard(rank)
        if not outcome.ok and first_failure is None:
            first_failure = rank
            if math.isfinite(failure_grace):
                grace = Deadline(failure_grace)

    def collect(rank: int) -> None:
        """Read whatever worker ``rank`` has to say; decide "died" if it exited unsettled."""
        worker = workers[rank]
        try:
            while rank not in at_eof and worker.conn.poll(0):
                outcome = accept(rank, worker, worker.conn.recv())
                if outcome is not None:
                    settle(rank, outcome)
                    return
        except (EOFError, OSError):
            at_eof.add(rank)
        if not worker.process.is_alive():
            worker.reap()
            code = worker.process.exitcode
            dump = worker.read_dump().strip()
            text = f"rank {rank} (pid {worker.pid}) {silent}: {_describe_exitcode(code)}"
            traceback = text + ("\n" + dump if dump else "\n(no Python stack was dumped)")
            settle(
                rank,
                RankOutcome(
                    rank=rank,
                    status="died",
                    message=text,
                    traceback=traceback,
                    exitcode=code,
                    pid=worker.pid,
                ),
            )

    while pending:
        if deadline.expired() or (grace is not None and grace.expired()):
            break
        wait = deadline.wait_s() if grace is None else min(deadline.wait_s(), grace.wait_s())
        waitables = {}
        for rank in pending:
            if rank not in at_eof:
                waitables[workers[rank].conn] = rank
            waitables[workers[rank].process.sentinel] = rank
        ready = multiprocessing.connection.wait(list(waitables), wait)
        for rank in sorted({waitables[obj] for obj in ready}):
            if rank in pending:
                collect(rank)
    for rank in sorted(pending):  # a last look: a report may have arrived just now
        collect(rank)
    if not pending:
        return outcomes

    if grace is not None and grace.expired() and not deadline.expired():
        why = (
            f"still running {deadline.wall_elapsed():.1f} s into the call, {failure_grace:g} s after "
            f"rank {first_failure} failed"
        )
        if grace.wall_elapsed() > grace.quiet * 1.05:
            why += f" ({grace.wall_elapsed():.1f} s of wall time on the loaded machine)"
    else:
        why = overdue.format(deadline=deadline.describe(), startup=deadline.describe("start-up bound"))
    message = f"{why}; stacks dumped, process killed"
    stragglers = sorted(pending)
    for rank in stragglers:
        workers[rank].signal_dump()
    dump_deadline = time.monotonic() + wall_bound(_DUMP_WAIT_S)
    for rank in stragglers:
        workers[rank].wait_dump(dump_deadline)
    for rank in stragglers:
        workers[rank].kill()
    for rank in stragglers:
        worker = workers[rank]
        worker.reap()
        dump = worker.read_dump().strip() or "(no stack dump was written)"
        outcomes[rank] = RankOutcome(
            rank=rank,
            status="hung",
            message=message,
            traceback=f"rank {rank} (pid {worker.pid}) {message}\n{dump}",
            exitcode=worker.process.exitcode,
            pid=worker.pid,
        )
    return outcomes


# --------------------------------------------------------------------------------------------
# The pool of warm workers
# --------------------------------------------------------------------------------------------

_POOL_DIR_PREFIX = "gefen-ranks-"


def _remove_stale_pool_dirs() -> None:
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


def _start_fork_server() -> None:
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
        saved = {name: os.environ.get(name) for name in _rank_worker.SINGLE_THREAD_ENV}
        try:
            for name in _rank_worker.SINGLE_THREAD_ENV:
                os.environ[name] = "1"
            forkserver.ensure_running()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _accept_ready(rank: int, worker: _Worker, message: tuple) -> RankOutcome | None:
    if message[0] != "ready":
        return None
    worker.pid = message[1]
    worker.own_group = bool(message[2])
    return RankOutcome(rank=rank, status="ok", pid=worker.pid)


class _Pool:
    """One flat pool of warm workers, regrouped per call (see "Warm workers" above)."""

    def __init__(self) -> None:
        self.owner_pid = os.getpid()
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []
        self.live: dict[int, _Worker] = {}
        self.counter = 0
        _remove_stale_pool_dirs()
        self.tmpdir = tempfile.mkdtemp(prefix=f"{_POOL_DIR_PREFIX}{os.getpid()}-")
        self.context = multiprocessing.get_context(_START_METHOD)
        if _START_METHOD == "forkserver":
            # honoured only by a fork server that is not running yet (it is one per process)
            self.context.set_forkserver_preload(list(dict.fromkeys(_BASE_PRELOAD + _PREPARATION.preload)))
            _start_fork_server()
        self.closed = False

    # -- starting -------------------------------------------------------------------------

    def _start_one(self) -> _Worker:
        with self.lock:
            self.counter += 1
            ident = self.counter
        dump_path = os.path.join(self.tmpdir, f"worker-{ident}.stacks")
        output_path = os.path.join(self.tmpdir, f"worker-{ident}.out")
        parent_conn, child_conn = self.context.Pipe(duplex=True)
        preload = _PREPARATION.preload
        process = self.context.Process(
            target=_rank_worker.worker_main,
            args=(child_conn, os.getpid(), dump_path, output_path, preload),
            name=f"gefen-rank-worker-{ident}",
            daemon=False,
        )
        process.start()
        child_conn.close()
        worker = _Worker(ident, process, parent_conn, dump_path, output_path, preload)
        with self.lock:
            self.live[ident] = worker
        return worker

    def checkout(self, count: int) -> list[_Worker]:
        """``count`` ready workers: idle ones first, then new ones (bounded start-up)."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the rank worker pool has been shut down")
            taken: list[_Worker] = []
            stale = [w for w in self.idle if w.preload != _PREPARATION.preload]
            self.idle = [w for w in self.idle if w.preload == _PREPARATION.preload]
            while self.idle and len(taken) < count:
                worker = self.idle.pop()
                if worker.alive():
                    taken.append(worker)
                else:
                    stale.append(worker)
        if stale:
            self.discard(stale)
        fresh: list[_Worker] = []
        try:
            for _ in range(count - len(taken)):
                fresh.append(self._start_one())
            started = _supervise(
                fresh,
                _accept_ready,
                timeout=_STARTUP_TIMEOUT_S,
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

    def release(self, workers: list[_Worker]) -> None:
        surplus: list[_Worker] = []
        with self.lock:
            for worker in workers:
                if self.closed or len(self.idle) >= _POOL_MAX_IDLE:
                    surplus.append(worker)
                else:
                    self.idle.append(worker)
        if surplus:
            self.discard(surplus)

    def discard(self, workers: list[_Worker], *, ask_first: bool = True) -> None:
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

    def idle_pids(self) -> list[int]:
        with self.lock:
            return [worker.pid for worker in self.idle if worker.pid is not None]


def _discard_quietly(worker: _Worker) -> None:
    worker.kill()
    worker.reap(1.0)
    worker.remove_files()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.closed or _POOL.owner_pid != os.getpid():
            # a forked copy of the caller must not drive the original's workers
            _POOL = _Pool()
        return _POOL


def shutdown_pool(*, now: bool = False) -> None:
    """Stop every worker this process started (idle or busy) and remove the pool's temp files;
    with ``now``, SIGKILL them without asking them to leave first (an interrupted run, SPEC 4.4.6).

    Runs at interpreter exit; safe to call at any time and more than once. A later
    :func:`run_on_ranks` starts a new pool.
    """
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.owner_pid == os.getpid():
        pool.shutdown(now=now)


atexit.register(shutdown_pool)


def kill_all() -> None:
    """SIGKILL every worker of this process's pool (and what each started in its process group)
    and the fork server, without waiting for them to be reaped: an interrupted run that is about to
    leave (SPEC 4.4.6). The fork server would leave by itself when this process ends, but it holds
    torch and the scenario modules, and a Python that exits normally spends seconds (more on a
    loaded machine) tearing those down."""
    pool = _POOL
    if pool is None or pool.owner_pid != os.getpid():
        return
    with pool.lock:
        pool.closed = True
        workers = list(pool.live.values())
    for worker in workers:
        worker.kill()
    server = _fork_server_pid()
    if server:
        try:
            os.kill(server, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(pool.tmpdir, ignore_errors=True)


def _idle_worker_pids() -> list[int]:
    """Pids of the warm idle workers (for tests and diagnostics)."""
    pool = _POOL
    return pool.idle_pids() if pool is not None and pool.owner_pid == os.getpid() else []


def _fork_server_pid() -> int | None:
    """Pid of multiprocessing's fork server, if this process has one (for tests)."""
    try:
        from multiprocessing import forkserver

        return forkserver._forkserver._forkserver_pid  # noqa: SLF001
    except Exception:
        return None


# --------------------------------------------------------------------------------------------
# One call
# --------------------------------------------------------------------------------------------


def _decode_report(rank: int, worker: _Worker, report: dict) -> RankOutcome:
    if report.get("status") == "ok":
        try:
            value = pickle.loads(report["value"])
        except BaseException as exc:  # noqa: BLE001
            return RankOutcome(
                rank=rank,
                status="raised",
                exc_type=qualified_name(type(exc)),
                message=f"the return value could not be unpickled in the caller: {exc}",
                traceback=format_exception(exc),
                pid=worker.pid,
                exception=exc,
            )
        return RankOutcome(rank=rank, status="ok", value=value, pid=worker.pid)
    exception = None
    if report.get("exc_bytes") is not None:
        try:
            exception = pickle.loads(report["exc_bytes"])
        except BaseException:  # noqa: BLE001 - e.g. a custom __init__ that breaks unpickling
            exception = None
    return RankOutcome(
        rank=rank,
        status="raised",
        exc_type=report.get("exc_type"),
        message=report.get("message", ""),
        traceback=report.get("traceback", ""),
        pid=worker.pid,
        exception=exception,
    )


_CALL_IDS = itertools.count(1)  # next() on a count is atomic: no lock needed


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    timeout: float = 60.0,
    allow_failure: bool = False,
    pg_timeout: float | None = None,
    failure_grace: float = DEFAULT_FAILURE_GRACE_S,
    device: Any = None,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` gloo ranks; see the module docstring.

    ``device`` (default: the run's, :func:`conformance.devices.selected`) is where the ranks'
    tensors live: on CPU every rank is a gloo rank on ``cpu``; on an accelerator rank r gets
    ``devices.for_rank(device, r)`` and the group that device's backend (NCCL for CUDA), and a
    machine with fewer such devices than ranks is a ``ValueError`` naming the shortage before any
    rank starts (SPEC 4.6.3).

    Returns the per-rank return values (index = rank), or with ``allow_failure=True`` the list
    of :class:`RankOutcome`. Raises :class:`RankFailure` when a rank raised, died or hung (unless
    ``allow_failure``), ``TypeError`` when ``fn``/``args``/``kwargs`` cannot be pickled and
    ``ValueError`` for a bad ``world_size`` or timeout.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    import torch

    from gefen_conformance.harness import devices

    device = devices.selected() if device is None else torch.device(device)
    short = devices.shortage(device, world_size)
    if short is not None:
        raise ValueError(f"run_on_ranks({world_size} ranks on {device}): {short}")
    if pg_timeout is None:
        pg_timeout = max(timeout / 2.0, timeout - 10.0)
    if not 0 < pg_timeout:
        raise ValueError(f"pg_timeout must be positive, got {pg_timeout!r}")
    try:
        payload = pickle.dumps(
            (fn, tuple(args), dict(kwargs or {})), protocol=pickle.HIGHEST_PROTOCOL
        )
    except Exception as exc:
        raise TypeError(
            "run_on_ranks needs a picklable fn (a module-level function of an importable module) "
            f"and picklable args/kwargs: {type(exc).__name__}: {exc}"
        ) from exc

    import torch.distributed as dist

    backend = devices.backend_for(device)
    if not dist.is_available() or not dist.is_backend_available(backend):
        raise RuntimeError(f"run_on_ranks on {device} needs torch.distributed with the {backend} backend")

    pool = _pool()
    workers = pool.checkout(world_size)
    call_id = next(_CALL_IDS)
    store_path = os.path.join(pool.tmpdir, f"store-{call_id}")

    def accept_prepared(rank: int, worker: _Worker, message: tuple) -> RankOutcome | None:
        if message[0] == "prepared" and message[1] == call_id:
            return RankOutcome(rank=rank, status="ok", pid=worker.pid)
        if message[0] == "result" and message[1] == call_id:
            return _decode_report(rank, worker, message[2])
        return None

    def accept_result(rank: int, worker: _Worker, message: tuple) -> RankOutcome | None:
        if message[0] == "result" and message[1] == call_id:
            return _decode_report(rank, worker, message[2])
        return None

    try:
        base_task = {
            "call_id": call_id,
            "world_size": world_size,
            "device": str(device),
            "store_path": store_path,
            "master_addr": _HOST,
            "master_port": _free_port(),
            "pg_timeout": wall_bound(float(pg_timeout)),
            "sys_path": list(sys.path),
            "environ": dict(os.environ),
            "cwd": os.getcwd(),
            "payload": payload,
            "prepare": _PREPARATION.payload,
        }
        for rank, worker in enumerate(workers):
            worker.mark_offsets()
            worker.conn.send(("run", dict(base_task, rank=rank)))
        # The call's deadline counts from the moment every rank is prepared (SPEC 4.2.11): a
        # rank's first call on a device runs the implementation's preparation first, under the
        # start-up bound.
        prepared = _supervise(
            workers,
            accept_prepared,
            timeout=_STARTUP_TIMEOUT_S,
            failure_grace=math.inf,  # each rank prepares on its own: wait for each
            overdue="did not finish preparing for the call within {startup}",
            silent="ended while preparing for the call, before it started",
        )
        if all(outcome.ok for outcome in prepared):
            for worker in workers:
                _send_quietly(worker, ("go", call_id))
            outcomes = _supervise(
                workers,
                accept_result,
                timeout=float(timeout),
                failure_grace=float(failure_grace),
                overdue="did not finish within {deadline}",
                silent="ended without reporting a result",
            )
            reusable = [outcome.ok for outcome in outcomes]
        else:
            first = next(o.rank for o in prepared if not o.ok)
            for worker, outcome in zip(workers, prepared):
                if outcome.ok:
                    _send_quietly(worker, ("cancel", call_id))
            reusable = [outcome.ok for outcome in prepared]
            outcomes = [
                o if not o.ok else RankOutcome(
                    rank=o.rank, status="raised", exc_type="gefen_conformance.harness.pool.CallNotStarted",
                    message=f"the call did not start: rank {first} failed while preparing for it",
                    traceback=f"rank {o.rank}: the call did not start: rank {first} failed while preparing for it",
                    pid=o.pid)
                for o in prepared
            ]
    except BaseException:
        # KeyboardInterrupt, a broken pipe, anything: no worker of this call may survive it.
        pool.discard(workers, ask_first=False)
        raise
    finally:
        try:
            os.unlink(store_path)
        except OSError:
            pass

    for outcome, worker in zip(outcomes, workers):
        outcome.output = worker.read_output()
    pool.release([w for w, keep in zip(workers, reusable) if keep])
    pool.discard([w for w, keep in zip(workers, reusable) if not keep])
    for outcome, worker in zip(outcomes, workers):
        if not outcome.ok and outcome.exitcode is None and not worker.process.is_alive():
            outcome.exitcode = worker.process.exitcode
    _echo_output(outcomes)

    if allow_failure:
        return outcomes
    if any(not outcome.ok for outcome in outcomes):
        name = getattr(fn, "__qualname__", repr(fn))
        raise RankFailure(outcomes, f"world_size={world_size}, {name}, timeout {timeout:g} s")
    return [outcome.value for outcome in outcomes]


def _send_quietly(worker: _Worker, message: tuple) -> None:
    """Send to a worker that may have just died (its death is then seen by the supervision)."""
    try:
        worker.conn.send(message)
    except (OSError, ValueError):
        pass


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for ``MASTER_PORT`` only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((_HOST, 0))
        return probe.getsockname()[1]


def _echo_output(outcomes: list[RankOutcome]) -> None:
    """Forward what the ranks printed to this process's stdout (pytest captures it per test)."""
    for outcome in outcomes:
        if outcome.output:
            text = "".join(
                f"[rank {outcome.rank}] {line}\n" for line in outcome.output.splitlines()
            )
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except (OSError, ValueError):
                pass

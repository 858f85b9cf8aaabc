"""The pool launcher: run one function on N local processes joined in a fresh process group per
call (SPEC 4.2.1-4.2.3, 4.2.8, 4.2.11; devices 4.6.3).

:func:`run_on_ranks` runs ``fn(*args, **kwargs)`` once on each of ``world_size`` warm worker
processes, each bound to its :class:`~gefen_conformance.harness.world.World` (the call's whole
default group: gloo on CPU, or rank r's accelerator and its backend under ``--gefen-device``), and
returns their values, index = rank; a rank that raised, died or hung makes it raise
:class:`RankFailure` with every rank's :class:`RankOutcome` (or, with ``allow_failure``, return
the outcomes). The arguments and bounds are those of
:class:`~gefen_conformance.harness.call.Call`; the deadline counts on the load clock of
:mod:`~gefen_conformance.harness.deadlines` from the moment every rank is prepared. No worker
outlives a failed call, an interrupted caller or the calling process. Inside a rank, besides
the World: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` are set, torch runs one thread, SIGINT is ignored (the caller handles Ctrl-C),
stdout and stderr are captured per rank and echoed into the caller's, the caller's environment,
``sys.path`` and directory apply, and the random generators are freshly seeded for every call;
module globals of the scenario's own modules persist between calls of a warm worker.

This module is the caller's side: it holds the process's pool (started by the first call or
:func:`start_workers`, ended by :func:`shutdown_pool`, also at interpreter exit) and the
preparation set by :func:`prepare_workers`, and runs each call. Where the rest lives:
:mod:`~gefen_conformance.harness.pool.processes` starts, keeps and stops the workers;
:mod:`~gefen_conformance.harness.pool.supervision` waits for them and dumps and kills hung ones;
:mod:`~gefen_conformance.harness.pool.worker` is the rank side.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import pickle
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gefen_conformance.harness.call import Call
from gefen_conformance.harness.deadlines import wall_bound
from gefen_conformance.harness.outcomes import RankOutcome, from_report
from gefen_conformance.harness.pool.processes import Pool, Worker, fork_server_pid, startup_timeout_s
from gefen_conformance.harness.pool.supervision import supervise

_HOST = "127.0.0.1"


# --------------------------------------------------------------------------------------------
# This process's pool and what its workers prepare
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Preparation:
    """What every worker does before it serves calls (see :func:`prepare_workers`)."""

    preload: tuple = ()
    payload: bytes | None = None  # pickled (key, fn, args), or None


_PREPARATION = _Preparation()
_PREPARATION_KEYS = itertools.count(1)
_POOL: Pool | None = None
_POOL_LOCK = threading.Lock()


def prepare_workers(
    preload: Sequence[str] = (), prepare: Callable[..., Any] | None = None, args: Sequence[Any] = ()
) -> None:
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
            payload = pickle.dumps(
                (next(_PREPARATION_KEYS), prepare, tuple(args)), protocol=pickle.HIGHEST_PROTOCOL
            )
        except Exception as exc:
            raise TypeError(
                f"prepare_workers needs a picklable prepare function and args: {type(exc).__name__}: {exc}"
            ) from exc
    _PREPARATION = _Preparation(tuple(preload), payload)


def _pool() -> Pool:
    """This process's pool, started on first use (a forked copy of the caller starts its own:
    it must not drive the original's workers)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.closed or _POOL.owner_pid != os.getpid():
            _POOL = Pool(_PREPARATION.preload)
        return _POOL


def _own_pool() -> Pool | None:
    """This process's pool if it has started one, without starting it."""
    pool = _POOL
    return pool if pool is not None and pool.owner_pid == os.getpid() else None


def start_server() -> None:
    """Start this process's pool without starting a worker: its fork server begins importing torch
    and the preloaded modules in its own process (seconds of CPU) while the caller goes on; the
    first worker asked for waits for it."""
    _pool()


def start_workers(count: int) -> None:
    """Start (and prepare the imports of) ``count`` idle workers now, outside any call, so that
    the first calls find them warm; bounded like any start-up (``RankFailure`` when one fails)."""
    pool = _pool()
    pool.release(pool.checkout(count, _PREPARATION.preload))


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
    pool = _own_pool()
    if pool is not None:
        pool.kill_all()


def _idle_worker_pids() -> list[int]:
    """Pids of the warm idle workers (for tests and diagnostics)."""
    pool = _own_pool()
    return pool.idle_pids() if pool is not None else []


def _fork_server_pid() -> int | None:
    """Pid of multiprocessing's fork server, if this process has one (for tests)."""
    return fork_server_pid()


# --------------------------------------------------------------------------------------------
# One call
# --------------------------------------------------------------------------------------------

_CALL_IDS = itertools.count(1)  # next() on a count is atomic: no lock needed


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    device: Any = None,
    **bounds: Any,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` local ranks; see the module docstring.

    ``bounds`` are the keyword fields of :class:`~gefen_conformance.harness.call.Call`
    (``timeout``, ``allow_failure``, ``pg_timeout``, ``failure_grace``). ``device`` (default: the
    run's, :func:`gefen_conformance.harness.devices.selected`) is where the ranks' tensors live:
    on CPU every rank is a gloo rank on ``cpu``; on an accelerator rank r gets
    ``devices.for_rank(device, r)`` and the group that device's backend (NCCL for CUDA), and a
    machine with fewer such devices than ranks is a ``ValueError`` naming the shortage before any
    rank starts (SPEC 4.6.3).

    Returns the per-rank return values (index = rank), or with ``allow_failure=True`` the list
    of :class:`RankOutcome`. Raises :class:`RankFailure` when a rank raised, died or hung (unless
    ``allow_failure``), ``TypeError`` when ``fn``/``args``/``kwargs`` cannot be pickled and
    ``ValueError`` for a bad ``world_size`` or bound.
    """
    call = Call(fn, world_size, args, kwargs, **bounds)
    import torch
    import torch.distributed as dist

    from gefen_conformance.harness import devices

    device = devices.selected() if device is None else torch.device(device)
    short = devices.shortage(device, world_size)
    if short is not None:
        raise ValueError(f"run_on_ranks({world_size} ranks on {device}): {short}")
    payload = call.payload()
    backend = devices.backend_for(device)
    if not dist.is_available() or not dist.is_backend_available(backend):
        raise RuntimeError(f"run_on_ranks on {device} needs torch.distributed with the {backend} backend")
    return call.finish(_run(call, payload, device), f"world_size={world_size}")


def _run(call: Call, payload: bytes, device) -> list[RankOutcome]:
    """The call on checked-out workers, in two phases: every rank prepares (under the start-up
    bound), then runs (under the call's deadline, SPEC 4.2.11); the outcomes, workers released."""
    pool = _pool()
    workers = pool.checkout(call.world_size, _PREPARATION.preload)
    call_id = next(_CALL_IDS)
    store_path = os.path.join(pool.tmpdir, f"store-{call_id}")

    def accept_prepared(rank: int, worker: Worker, message: tuple) -> RankOutcome | None:
        if message[0] == "prepared" and message[1] == call_id:
            return RankOutcome(rank=rank, status="ok", pid=worker.pid)
        return accept_result(rank, worker, message)

    def accept_result(rank: int, worker: Worker, message: tuple) -> RankOutcome | None:
        if message[0] == "result" and message[1] == call_id:
            return from_report(rank, message[2], pid=worker.pid, where="in the caller")
        return None

    try:
        base_task = {
            "call_id": call_id,
            "world_size": call.world_size,
            "device": str(device),
            "store_path": store_path,
            "master_addr": _HOST,
            "master_port": _free_port(),
            "pg_timeout": wall_bound(float(call.pg_timeout)),
            "sys_path": list(sys.path),
            "environ": dict(os.environ),
            "cwd": os.getcwd(),
            "payload": payload,
            "prepare": _PREPARATION.payload,
        }
        for rank, worker in enumerate(workers):
            worker.mark_offsets()
            worker.conn.send(("run", dict(base_task, rank=rank)))
        prepared = supervise(
            workers,
            accept_prepared,
            timeout=startup_timeout_s(),
            failure_grace=math.inf,  # each rank prepares on its own: wait for each
            overdue="did not finish preparing for the call within {startup}",
            silent="ended while preparing for the call, before it started",
        )
        if all(outcome.ok for outcome in prepared):
            for worker in workers:
                _send_quietly(worker, ("go", call_id))
            outcomes = supervise(
                workers,
                accept_result,
                timeout=float(call.timeout),
                failure_grace=float(call.failure_grace),
                overdue="did not finish within {deadline}",
                silent="ended without reporting a result",
            )
            reusable = [outcome.ok for outcome in outcomes]
        else:
            for worker, outcome in zip(workers, prepared):
                if outcome.ok:
                    _send_quietly(worker, ("cancel", call_id))
            reusable = [outcome.ok for outcome in prepared]
            outcomes = _not_started(prepared)
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
    return outcomes


def _not_started(prepared: list[RankOutcome]) -> list[RankOutcome]:
    """The outcomes of a call that did not start because a rank failed to prepare for it (SPEC
    4.2.8): that rank's own, and "raised" for the ranks that were ready."""
    first = next(o.rank for o in prepared if not o.ok)
    why = f"the call did not start: rank {first} failed while preparing for it"
    return [
        o
        if not o.ok
        else RankOutcome(
            rank=o.rank,
            status="raised",
            exc_type="gefen_conformance.harness.pool.CallNotStarted",
            message=why,
            traceback=f"rank {o.rank}: {why}",
            pid=o.pid,
        )
        for o in prepared
    ]


def _send_quietly(worker: Worker, message: tuple) -> None:
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

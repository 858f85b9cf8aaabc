"""The thread launcher: a scenario's ranks as threads of one process, on torch's threaded process
group (SPEC 4.2.12; 4.2.1-4.2.2, 4.2.10), for worlds larger than a machine has processes for.

:func:`run_on_threads` has the contract of :func:`gefen_conformance.harness.pool.run_on_ranks`
(the same rank bodies, the same :class:`~gefen_conformance.harness.call.Call` bounds, the same
values and :class:`~gefen_conformance.harness.outcomes.RankOutcome` s) for up to
:data:`MAX_THREAD_RANKS` ranks, on CPU. :class:`ThreadLauncher` is it as a
:class:`~gefen_conformance.harness.launch.Launcher`.

How a call runs: the whole world is hosted by ONE pool worker (a one-rank pool call of
:func:`host`), so everything that bounds a pool call bounds it too: the worker is killed when it
outlives the call's deadline plus :data:`HOST_MARGIN_S` (its every thread's stack dumped), an
interrupted caller kills it, and it never outlives the caller. Inside it, ``world_size`` threads
each join the call's threaded default group (``torch.testing._internal.distributed.
multi_threaded_pg``: real collectives, object collectives and DCP included, between threads), bind
their own :class:`~gefen_conformance.harness.world.World` for their thread
(``world.scope(world, thread=True)``) and run ``fn``. The host's main thread supervises them:

* a rank that raises (or calls ``World.die``, reported "died" with its exit code) aborts the
  group at once: its peers' pending and later collectives raise, as a gloo peer's would when the
  failed process closed its sockets;
* the threaded group has no timeout of its own: a collective that has waited ``pg_timeout`` (on
  the load clock, SPEC 4.2.10) for ranks that never joined aborts the group, naming those ranks;
* a rank still running at the call's deadline, or ``failure_grace`` after the first failure, is
  "hung" with its own thread's stack. A thread cannot be stopped: the host then reports every
  rank and its worker exits, taking the hung threads with it.

Every rank's report (value, or exception with its traceback) reaches the caller. What the ranks
print is captured per rank at the Python level (``sys.stdout`` and ``sys.stderr`` of each rank's
thread); output written at the C level goes to the host's, echoed as the pool echoes a worker's.

Differences from a process per rank, which a rank body must allow for: the ranks share one
interpreter (the GIL: they compute one at a time), torch's global state (default dtype,
deterministic algorithms, the global random generator: draw from seeded generators), module
globals, and the DTensor sharding caches; autograd runs single-threaded in each rank; and threads
a rank body starts see the host's World, not their rank's. An implementation that is not safe to
run from several threads at once says so (``Implementation.thread_safe``); scenarios then run it
on the active launcher instead. The threaded group is a private torch testing module: the
launcher runs only on the torch versions it is checked on (:data:`CHECKED_TORCH`).
"""

from __future__ import annotations

import datetime
import io
import pickle
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from gefen_conformance.harness import pool
from gefen_conformance.harness.call import Call
from gefen_conformance.harness.deadlines import Deadline
from gefen_conformance.harness.launch import Execution
from gefen_conformance.harness.outcomes import RankOutcome, from_report
from gefen_conformance.harness.rank_side import exception_report, value_report
from gefen_conformance.harness.world import World, scope

__all__ = [
    "CHECKED_TORCH",
    "HOST_MARGIN_S",
    "MAX_THREAD_RANKS",
    "ThreadLauncher",
    "ThreadRanksFailed",
    "host",
    "run_on_threads",
    "unfit",
]

#: the most ranks one call runs as threads
MAX_THREAD_RANKS = 256
#: the torch (major, minor) versions whose threaded process group this launcher is checked on
CHECKED_TORCH = ((2, 13),)
#: quiet seconds the hosting worker gets past the call's deadline to collect and send every
#: rank's report (stacks of hung ranks included) before the pool kills it
HOST_MARGIN_S = 10.0
#: how often the host looks at its ranks and the pending collectives (wall seconds, at most)
_LOOK_S = 0.1
_BACKEND = "threaded"


class ThreadRanksFailed(Exception):
    """Raised by :func:`host` when a rank did not end "ok"; carries every rank's report dict, so the
    hosting worker reports them and then exits (with whatever threads still run)."""

    def __init__(self, reports: list) -> None:
        self.reports = list(reports)
        failed = sum(1 for report in self.reports if report.get("status") != "ok")
        super().__init__(f"{failed} of {len(self.reports)} thread ranks failed")

    def __reduce__(self):
        return (type(self), (self.reports,))


class _RankDied(BaseException):
    """``World.die(exitcode)`` on a thread rank: ends the rank's thread as a crash ends a process."""

    def __init__(self, exitcode: int) -> None:
        super().__init__(exitcode)
        self.exitcode = exitcode


def _die(exitcode: int):
    raise _RankDied(exitcode)


# --------------------------------------------------------------------------------------------
# The caller's side
# --------------------------------------------------------------------------------------------


def unfit(world_size: int) -> str | None:
    """Why this launcher cannot run ``world_size`` thread ranks here, or None."""
    if world_size > MAX_THREAD_RANKS:
        return f"needs {world_size} ranks; the thread launcher runs at most {MAX_THREAD_RANKS}"
    import torch

    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version not in CHECKED_TORCH:
        checked = ", ".join(f"{major}.{minor}" for major, minor in CHECKED_TORCH)
        return (
            f"the thread launcher uses torch's private threaded process group, checked on torch "
            f"{checked} only; this is torch {torch.__version__}"
        )
    return None


def run_on_threads(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    **bounds: Any,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` thread ranks; see the module docstring.

    ``bounds`` are the keyword fields of :class:`~gefen_conformance.harness.call.Call`. Returns
    the values (index = rank), or the outcomes with ``allow_failure``; raises
    :class:`~gefen_conformance.harness.outcomes.RankFailure` when a rank raised, died or hung, and
    ``ValueError`` when :func:`unfit` gives a reason.
    """
    call = Call(fn, world_size, args, kwargs, **bounds)
    reason = unfit(world_size)
    if reason is not None:
        raise ValueError(f"run_on_threads({world_size} ranks): {reason}")
    hosted = pool.run_on_ranks(
        host,
        1,
        (call.payload(), world_size, call.timeout, call.pg_timeout, call.failure_grace),
        device="cpu",
        timeout=call.timeout + HOST_MARGIN_S,
        failure_grace=HOST_MARGIN_S,
        allow_failure=True,
    )[0]
    return call.finish(_outcomes(hosted, world_size), f"{world_size} thread ranks")


def _outcomes(hosted: RankOutcome, world_size: int) -> list[RankOutcome]:
    """Every rank's outcome from the hosting worker's."""
    reports = None
    if hosted.ok:
        reports = hosted.value
    elif isinstance(hosted.exception, ThreadRanksFailed):
        reports = hosted.exception.reports
    if reports is not None:
        return [
            from_report(rank, report, pid=hosted.pid, where="in the caller")
            for rank, report in enumerate(reports)
        ]
    # The host itself failed: before its ranks started (its traceback says where), or it died or
    # hung as a whole (a rank that never lets go of the GIL); its stack dump has every thread's.
    what = hosted.headline().split(": ", 1)[1]
    why = f"the process hosting the {world_size} thread ranks (pid {hosted.pid}) {what}"
    return [
        RankOutcome(
            rank=rank,
            status=hosted.status,
            exc_type=hosted.exc_type,
            message=why,
            traceback=f"rank {rank}: {why}\n{hosted.traceback}",
            exitcode=hosted.exitcode,
            pid=hosted.pid,
            exception=hosted.exception,
        )
        for rank in range(world_size)
    ]


class ThreadLauncher:
    """:class:`~gefen_conformance.harness.launch.Launcher` of :func:`run_on_threads`: one process
    per call, up to :data:`MAX_THREAD_RANKS` thread ranks, on CPU."""

    run = staticmethod(run_on_threads)

    def execution(self) -> Execution:
        return Execution(
            launcher="threads",
            nodes=1,
            world_size=None,
            max_world_size=MAX_THREAD_RANKS,
            backend=_BACKEND,
            device_type="cpu",
            device_names=("cpu",),
        )

    def unfit(self, world_size: int) -> str | None:
        return unfit(world_size)


# --------------------------------------------------------------------------------------------
# The host: one pool worker running every rank as a thread
# --------------------------------------------------------------------------------------------


class _RankStreams(io.TextIOBase):
    """``sys.stdout`` (or ``sys.stderr``) while thread ranks run: what a rank's thread writes goes
    to that rank's buffer, anything else to the stream it replaced."""

    def __init__(self, original, ranks: dict) -> None:
        self.original = original
        self.ranks = ranks  # thread ident -> list of the rank's written strings

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        own = self.ranks.get(threading.get_ident())
        if own is None:
            return self.original.write(text)
        own.append(text)
        return len(text)

    def flush(self) -> None:
        if threading.get_ident() not in self.ranks:
            self.original.flush()


class _Ranks:
    """One call's thread ranks and their supervision (see the module docstring)."""

    def __init__(self, world_size: int, timeout: float, pg_timeout: float, failure_grace: float) -> None:
        self.size = world_size
        self.timeout = timeout
        self.pg_timeout = pg_timeout
        self.failure_grace = failure_grace
        self.reports: list = [None] * world_size
        self.output: dict = {}  # thread ident -> the rank's output
        self.threads: list[threading.Thread] = []
        self.changed = threading.Condition()
        self.first_failure: int | None = None
        self.aborted: str | None = None  # why the group was aborted

    # -- the rank threads -------------------------------------------------------------------

    def rank_main(self, rank: int, payload: bytes, store) -> None:
        import torch
        import torch.distributed as dist

        self.output[threading.get_ident()] = []
        stage = "unpickling fn/args/kwargs"
        try:
            fn, args, kwargs = pickle.loads(payload)
            stage = "joining the threaded process group"
            dist.init_process_group(
                _BACKEND,
                rank=rank,
                world_size=self.size,
                store=store,
                timeout=datetime.timedelta(seconds=self.pg_timeout),
            )
            here = World(
                rank=rank, size=self.size, group=dist.group.WORLD, device=torch.device("cpu"), die_hook=_die
            )
            stage = "running fn"
            with scope(here, thread=True):
                value = fn(*args, **kwargs)
            report = value_report(value)
        except _RankDied as died:
            report = {
                "status": "died",
                "message": f"rank {rank} ended itself with World.die({died.exitcode})",
                "traceback": f"rank {rank} ended itself with World.die({died.exitcode}):\n"
                + "".join(traceback.format_tb(died.__traceback__)),
                "exitcode": died.exitcode,
            }
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, none escapes
            prefix = "" if stage == "running fn" else f"[while {stage}] "
            if self.aborted is not None and isinstance(exc, SystemExit):
                prefix += f"[the threaded group was aborted: {self.aborted}] "
            report = exception_report(exc, prefix)
        finally:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except BaseException:  # noqa: BLE001 - the report already says what went wrong
                pass
        if report["status"] != "ok":
            self.abort(f"rank {rank} failed", first=rank)
        report["output"] = "".join(self.output.get(threading.get_ident(), ()))
        with self.changed:
            self.reports[rank] = report
            self.changed.notify_all()

    def abort(self, why: str, *, first: int | None = None) -> None:
        """Abort the threaded group once (every waiting and later collective raises)."""
        from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

        with self.changed:
            if first is not None and self.first_failure is None:
                self.first_failure = first
            if self.aborted is not None:
                return
            self.aborted = why
        for _ in range(3):  # the rank threads change the pending collectives while it iterates them
            try:
                ProcessLocalGroup.exception_handle(RuntimeError(why))
                return
            except RuntimeError:
                continue

    # -- the supervisor (the host's main thread) ----------------------------------------------

    def run(self, payload: bytes) -> list:
        import torch
        import torch.distributed as dist
        from torch.testing._internal.distributed import multi_threaded_pg as threaded

        isolation = torch._C._distributed_c10d._set_thread_isolation_mode
        if "torch.distributed.tensor" in sys.modules:
            # keyed on meshes that compare their thread: a thread of this call may reuse the ident
            # of an earlier call's thread that served another rank
            from gefen_conformance.harness.sharding import forget_dtensor_caches

            forget_dtensor_caches()
        threaded.ProcessLocalGroup.reset()
        isolation(True)
        threaded._install_threaded_pg()
        streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = (_RankStreams(stream, self.output) for stream in streams)
        try:
            store = dist.HashStore()
            self.threads = [
                threading.Thread(
                    target=self.rank_main,
                    args=(rank, payload, store),
                    name=f"gefen-thread-rank-{rank}",
                    daemon=True,
                )
                for rank in range(self.size)
            ]
            for thread in self.threads:
                thread.start()
            self.supervise()
        finally:
            sys.stdout, sys.stderr = streams
            if all(report is not None for report in self.reports):
                threaded.ProcessLocalGroup.reset()
            threaded._uninstall_threaded_pg()
            isolation(False)
        return self.reports

    def supervise(self) -> None:
        from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

        deadline = Deadline(self.timeout)
        grace: Deadline | None = None
        waiting: dict = {}  # a pending collective -> its Deadline of pg_timeout
        while True:
            with self.changed:
                if all(report is not None for report in self.reports):
                    return
                if self.first_failure is not None and grace is None:
                    grace = Deadline(self.failure_grace)
            if deadline.expired() or (grace is not None and grace.expired()):
                break
            with ProcessLocalGroup._coll_lock:
                pending = list(ProcessLocalGroup._cur_coll_on_pgs.items())
            waiting = {coll: waiting.get(coll) or Deadline(self.pg_timeout) for _, coll in pending}
            if self.aborted is None:
                for name, coll in pending:
                    if waiting[coll].expired():
                        absent = [rank for rank, data in enumerate(coll._data) if data is None]
                        self.abort(
                            f"a collective on group {name!r} waited the {self.pg_timeout:g} s process-group "
                            f"timeout for rank(s) {_ranks_text(absent)}"
                        )
                        break
            waits = [deadline.wait_s()] + ([grace.wait_s()] if grace is not None else [])
            with self.changed:
                self.changed.wait(max(0.01, min([_LOOK_S, *waits])))
        if grace is not None and grace.expired() and not deadline.expired():
            why = f"still running {grace.wall_elapsed():.1f} s after rank {self.first_failure} failed"
        else:
            why = f"did not finish within {deadline.describe()}"
        frames = sys._current_frames()
        with self.changed:
            for rank, thread in enumerate(self.threads):
                if self.reports[rank] is not None:
                    continue
                frame = frames.get(thread.ident)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)\n"
                message = f"{why}; its thread cannot be stopped, its process is ended"
                self.reports[rank] = {
                    "status": "hung",
                    "message": message,
                    "traceback": f"rank {rank} ({thread.name}) {message}\nMost recent call last:\n{stack}",
                    "output": "".join(self.output.get(thread.ident, ())),
                }


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) <= 12:
        return ", ".join(map(str, ranks))
    return ", ".join(map(str, ranks[:12])) + f", ... ({len(ranks)} in all)"


def host(payload: bytes, world_size: int, timeout: float, pg_timeout: float, failure_grace: float) -> list:
    """The body of the pool worker that hosts a call's ``world_size`` thread ranks: every rank's
    report dict (index = rank); raises :class:`ThreadRanksFailed` carrying them when one is not
    "ok", so that the worker leaves afterwards (with any thread that still runs)."""
    reports = _Ranks(world_size, timeout, pg_timeout, failure_grace).run(payload)
    if any(report["status"] != "ok" for report in reports):
        raise ThreadRanksFailed(reports)
    return reports

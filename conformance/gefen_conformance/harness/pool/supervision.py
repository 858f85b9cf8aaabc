"""Supervising the pool's workers: wait for each to settle, and stop the ones that do not
(SPEC 4.2.2, 4.2.8, 4.2.10).

One routine, :func:`supervise`, waits for worker start-up, for a call's preparation and for the
call itself. A worker settles with a message (its outcome); one that exits first is "died", with
the faulthandler dump of a fatal signal when there is one; one still unsettled at the deadline,
or ``failure_grace`` after the first failure, has every thread's Python stack dumped (SIGUSR1,
which the worker's faulthandler writes to its dump file), is killed and reaped, and is "hung".
The workers are :class:`gefen_conformance.harness.pool.processes.Worker` s.
"""

from __future__ import annotations

import math
import multiprocessing.connection
import time
from collections.abc import Callable
from typing import Any

from gefen_conformance.harness.deadlines import Deadline, wall_bound
from gefen_conformance.harness.outcomes import RankOutcome, describe_exitcode

__all__ = ["Accept", "DUMP_WAIT_S", "supervise"]

#: quiet seconds the stragglers get to write their stack dumps before they are killed
DUMP_WAIT_S = 2.0

#: turns a message from worker ``rank`` into its outcome, or None when the message does not settle it
Accept = Callable[[int, Any, tuple], "RankOutcome | None"]


def supervise(
    workers: list,
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
            text = f"rank {rank} (pid {worker.pid}) {silent}: {describe_exitcode(code)}"
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
    dump_deadline = time.monotonic() + wall_bound(DUMP_WAIT_S)
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

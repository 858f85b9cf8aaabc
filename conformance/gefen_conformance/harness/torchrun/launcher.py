"""The torchrun launcher: scenario calls on part of one torchrun job, made from rank 0 (SPEC 4.7.3-4.7.4).

:class:`TorchrunLauncher` lives in rank 0, the process that runs pytest, installed with
:func:`gefen_conformance.harness.launch.set_launcher`. A call of ``k`` ranks is posted on the
job's store (``cmd/<n>``, :mod:`~gefen_conformance.harness.torchrun.job`); global ranks
``0..k-1`` take part (rank 0's part in the rank-0 server, a child process,
:mod:`~gefen_conformance.harness.torchrun.serve`) and post their outcomes, which the launcher
polls against the call's deadline and ``failure_grace``. When either passes it posts an abort;
participants still running report "hung" with their stacks, and since a hung thread cannot be
stopped the job ends: later calls raise :class:`TorchrunJobEnded` and pytest stops after the
current test.
"""

from __future__ import annotations

import itertools
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gefen_conformance.harness import launch
from gefen_conformance.harness.call import Call
from gefen_conformance.harness.deadlines import Deadline, wall_bound
from gefen_conformance.harness.outcomes import RankOutcome, from_report
from gefen_conformance.harness.torchrun.job import Job, command_key, dumps

__all__ = ["REPORT_WAIT_S", "StopWhenJobEnds", "TorchrunJobEnded", "TorchrunLauncher"]

#: how long rank 0 waits for the "hung" reports (with their stack dumps) after posting an abort
REPORT_WAIT_S = 10.0
#: how often rank 0 looks at the outcomes of a running call
POLL_S = 0.05


class TorchrunJobEnded(RuntimeError):
    """A scenario call after the job ended (a rank hung, or the run was interrupted)."""


class TorchrunLauncher:
    """:class:`gefen_conformance.harness.launch.Launcher` over the ranks of this torchrun job.

    ``control`` is rank 0's store client, ``server`` the rank-0 server (a Popen, or None where it
    cannot be watched), ``hellos`` every rank's start-up facts (rank -> dict with ``host``,
    ``pid``, ``node_rank``, ``device_name``).
    """

    def __init__(self, job: Job, control, server, device, backend: str, hellos: dict[int, dict]) -> None:
        self.job = job
        self.control = control
        self.server = server
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
        return launch.Execution(
            launcher="torchrun",
            nodes=nodes,
            world_size=self.job.world_size,
            max_world_size=self.job.world_size,
            backend=self.backend,
            device_type=self.device.type,
            device_names=tuple(sorted(names)),
        )

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

    def run(self, fn: Callable[..., Any], world_size: int, args, kwargs, **bounds: Any) -> list:
        call = Call(fn, world_size, args, kwargs, **bounds)
        if world_size > self.job.world_size:
            raise launch.WorldTooLarge(
                f"needs {world_size} ranks; the torchrun job has {self.job.world_size}"
            )
        payload = call.payload()
        with self._lock:  # one call at a time: the ranks serve calls in order
            if self.ended is not None:
                raise TorchrunJobEnded(f"no scenario call runs after the torchrun job ended: {self.ended}")
            call_id = self.next_command()
            task = {
                "call_id": call_id,
                "world_size": world_size,
                "backend": self.backend,
                "pg_timeout": wall_bound(float(call.pg_timeout)),
                "sys_path": list(sys.path),
                "cwd": os.getcwd(),
                "payload": payload,
            }
            self.control.set(command_key(call_id), dumps(("run", task)))
            outcomes = self._supervise(call_id, world_size, float(call.timeout), float(call.failure_grace))
        return call.finish(outcomes, f"torchrun, world_size={world_size} of {self.job.world_size}")

    def _outcome(self, rank: int, report: dict) -> RankOutcome:
        return from_report(rank, report, pid=self.hellos.get(rank, {}).get("pid"), where="on rank 0")

    def _supervise(
        self, call_id: int, world_size: int, timeout: float, failure_grace: float
    ) -> list[RankOutcome]:
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
                    settle(
                        0,
                        {
                            "status": "died",
                            "exitcode": code,
                            "pid": self.server.pid,
                            "message": f"the rank-0 server (pid {self.server.pid}) ended during the call",
                            "traceback": f"rank 0: the rank-0 server (pid {self.server.pid}) ended during "
                            f"call {call_id} with exit code {code} (its stderr is torchrun's)",
                        },
                    )
                if not pending:
                    break
                if aborted is None:
                    if deadline.expired() or (grace is not None and grace.expired()):
                        if grace is not None and grace.expired() and not deadline.expired():
                            why = (
                                f"still running {deadline.wall_elapsed():.1f} s into the call, "
                                f"{failure_grace:g} s "
                                f"after rank {first_failure} failed"
                            )
                        else:
                            why = f"did not finish within {deadline.describe()}"
                        aborted = Deadline(REPORT_WAIT_S)
                        self.control.set(f"call/{call_id}/abort", why.encode())
                elif aborted.expired():
                    for rank in sorted(pending):
                        settle(
                            rank,
                            {
                                "status": "hung",
                                "message": f"{why}; the rank sent no report (its stack "
                                f"could not be dumped) within {REPORT_WAIT_S:g} s of the abort",
                                "traceback": f"rank {rank}: {why}; no report, no stack dump",
                            },
                        )
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
            self.end_job(
                f"rank(s) {', '.join(str(o.rank) for o in hung)} hung in call {call_id} and cannot be stopped"
            )
        return outcomes  # type: ignore[return-value]


class StopWhenJobEnds:
    """pytest plugin (rank 0): gives the launcher the session it stops when the job ends."""

    def __init__(self, launcher: TorchrunLauncher) -> None:
        self.launcher = launcher

    def pytest_sessionstart(self, session) -> None:
        self.launcher.session = session

"""The serve loop of a torchrun rank: take part in scenario calls until rank 0 says ``exit``
(SPEC 4.7.3-4.7.4, 4.7.6).

Ranks 1..W-1 and the rank-0 server run :func:`serve`: read ``cmd/<n>`` in order from the job's
store (:mod:`~gefen_conformance.harness.torchrun.job`), skip calls of fewer ranks than their own
rank, run their part in the others in a thread
(:class:`~gefen_conformance.harness.torchrun.rank.Participation`) while watching for rank 0's
abort, and post the outcome with what the rank printed during the call (the last
:data:`OUTPUT_TAIL_BYTES`). A rank whose part hung, or whose preparation failed, reports that as
its outcome of every later call it is asked to take part in.
"""

from __future__ import annotations

import itertools
import os
import pickle
import tempfile

from gefen_conformance.harness.rank_side import flush_streams
from gefen_conformance.harness.torchrun.job import Job, command_key, dumps, leave, wait
from gefen_conformance.harness.torchrun.rank import Participation, hung_report

__all__ = ["CapturedOutput", "OUTPUT_TAIL_BYTES", "serve"]

#: how much of what a rank printed during a call its outcome keeps (the end of it)
OUTPUT_TAIL_BYTES = 64 * 1024
#: how long a serving rank waits between two looks for the next call
IDLE_POLL_S = 0.1


def serve(job: Job, control, pg_store, device, broken: str | None = None) -> None:
    """Serve scenario calls until rank 0 posts ``exit``; never returns (``os._exit``). ``broken``:
    why this rank cannot take part (its preparation failed), reported as its outcome of every call."""
    # ``broken`` is also set once a call on this rank hung: the thread is still stuck in it
    for call_id in itertools.count(1):
        key = command_key(call_id)
        while not wait(control, [key], 3600.0, IDLE_POLL_S):
            pass
        kind, task = pickle.loads(control.get(key))
        if kind == "exit":
            leave(0)
        if job.rank >= task["world_size"]:
            continue
        outcome_key = f"call/{call_id}/outcome/{job.rank}"
        if broken is not None:
            control.set(
                outcome_key,
                dumps(
                    {
                        "status": "raised",
                        "exc_type": "RuntimeError",
                        "message": broken,
                        "traceback": broken,
                        "exc_bytes": None,
                        "pid": os.getpid(),
                    }
                ),
            )
            continue
        with CapturedOutput() as output:
            report = _take_part(job, control, pg_store, device, task)
        report["output"] = output.text
        control.set(outcome_key, dumps(report))
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
                leave(0)  # rank 0 writes the incomplete certificate; a failed exit here would cut it short
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

    def __enter__(self) -> CapturedOutput:
        flush_streams()
        self._file = tempfile.TemporaryFile()
        self._saved = [os.dup(1), os.dup(2)]
        os.dup2(self._file.fileno(), 1)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc_info) -> None:
        flush_streams()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        size = self._file.seek(0, os.SEEK_END)
        self._file.seek(max(0, size - OUTPUT_TAIL_BYTES))
        self.text = self._file.read().decode("utf-8", "replace")
        self._file.close()

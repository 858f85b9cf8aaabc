"""How the ranks of a scenario call ended, as every launcher reports it (SPEC 4.2.1-4.2.2, 4.7.4).

A rank ends in one :class:`RankOutcome` (``ok``, ``raised``, ``died`` or ``hung``, with its
traceback and what it printed); a call that is not ``ok`` on every rank raises
:class:`RankFailure` carrying them all. The rank side of either launcher sends its outcome as a
plain report dict (:mod:`gefen_conformance.harness.rank_side`); :func:`from_report` turns it back
into a :class:`RankOutcome` in the process that made the call. Cheap to import (no torch).
"""

from __future__ import annotations

import pickle
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gefen_conformance.harness.exception_text import format_exception, qualified_name

__all__ = ["RankFailure", "RankOutcome", "describe_exitcode", "echo_output", "from_report"]

#: how much of a failed rank's output ``str(RankFailure)`` shows (the end of it)
_OUTPUT_TAIL_CHARS = 4000


@dataclass
class RankOutcome:
    """How one rank of one call ended. ``status`` is one of "ok", "raised", "died", "hung".

    ``value``: the return value ("ok"); ``exc_type`` (qualified name), ``message`` and
    ``traceback``: what went wrong, and ``exception`` the exception itself when it survived
    pickling ("raised"); ``exitcode``: the process's ("died", "hung"; negative: the signal);
    ``output``: what the rank printed during the call.
    """

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
            return f"rank {self.rank}: died ({describe_exitcode(self.exitcode)})"
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


def from_report(rank: int, report: dict, *, pid: int | None, where: str) -> RankOutcome:
    """The outcome of a rank from the report dict its rank side sent (``status`` and the
    :class:`RankOutcome` fields; ``value`` and ``exc_bytes`` pickled). A value that cannot be
    unpickled here (``where``: "in the caller", "on rank 0") makes the rank "raised"."""
    pid = report.get("pid", pid)
    output = report.get("output", "")
    if report.get("status") == "ok":
        try:
            value = pickle.loads(report["value"])
        except BaseException as exc:  # noqa: BLE001
            return RankOutcome(
                rank=rank,
                status="raised",
                exc_type=qualified_name(type(exc)),
                message=f"the return value could not be unpickled {where}: {exc}",
                traceback=format_exception(exc),
                pid=pid,
                exception=exc,
                output=output,
            )
        return RankOutcome(rank=rank, status="ok", value=value, pid=pid, output=output)
    exception = None
    if report.get("exc_bytes") is not None:
        try:
            exception = pickle.loads(report["exc_bytes"])
        except BaseException:  # noqa: BLE001 - e.g. a custom __init__ that breaks unpickling
            exception = None
    return RankOutcome(
        rank=rank,
        status=report.get("status", "raised"),
        exc_type=report.get("exc_type"),
        message=report.get("message", ""),
        traceback=report.get("traceback", ""),
        exitcode=report.get("exitcode"),
        pid=pid,
        exception=exception,
        output=output,
    )


def echo_output(outcomes: Sequence[RankOutcome]) -> None:
    """Forward what the ranks printed to this process's stdout, each line prefixed with its rank
    (pytest captures it per test)."""
    for outcome in outcomes:
        if outcome.output:
            text = "".join(f"[rank {outcome.rank}] {line}\n" for line in outcome.output.splitlines())
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except (OSError, ValueError):
                pass


def describe_exitcode(code: int | None) -> str:
    """ "exit code 3", "killed by SIGKILL, exit code -9", "exit code unknown"."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}, exit code {code}"
        except ValueError:
            return f"killed by signal {-code}, exit code {code}"
    return f"exit code {code}"


def _first_line(text: str) -> str:
    text = (text or "").strip()
    return text.splitlines()[0] if text else ""

"""One scenario call, checked once for every launcher (SPEC 4.2.1-4.2.2, 4.2.5).

A :class:`Call` is ``fn(*args, **kwargs)`` on ``world_size`` ranks with its bounds: ``timeout``
(the call's deadline), ``allow_failure``, ``pg_timeout`` (the process group's timeout, by default
shorter than the deadline so that peers of a failed rank error out first) and ``failure_grace``
(how long the other ranks get to report after the first failure). Its fields are the keyword
arguments of :func:`gefen_conformance.harness.launch.run` and
:func:`gefen_conformance.harness.pool.run_on_ranks`, their defaults are stated here only, and a
bad value is refused here (``ValueError``; ``TypeError`` for what cannot be pickled) before any
rank starts. An :class:`~gefen_conformance.implementations.contract.Implementation` among the
arguments reaches each rank as that rank process's own, resolved there once
(:func:`gefen_conformance.implementations.registry.resolve`), so a rank body takes the
implementation itself rather than its name. :meth:`Call.finish` turns the ranks' outcomes into the
call's result, the same way under every launcher. Cheap to import (no torch).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gefen_conformance.harness.outcomes import RankFailure, RankOutcome, echo_output

__all__ = ["Call", "DEFAULT_FAILURE_GRACE_S", "DEFAULT_TIMEOUT_S"]

#: a call's deadline unless it says otherwise (quiet seconds, SPEC 4.2.10)
DEFAULT_TIMEOUT_S = 60.0
#: seconds the other ranks get to report after the first rank failed (``failure_grace``)
DEFAULT_FAILURE_GRACE_S = 5.0


@dataclass(frozen=True)
class Call:
    """``fn(*args, **kwargs)`` on ``world_size`` ranks, with its bounds (see the module docstring).

    ``pg_timeout`` None means ``max(timeout / 2, timeout - 10)``; the instance holds the value.
    """

    fn: Callable[..., Any]
    world_size: int
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    allow_failure: bool = False
    pg_timeout: float | None = None
    failure_grace: float = DEFAULT_FAILURE_GRACE_S

    def __post_init__(self) -> None:
        size = self.world_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"world_size must be a positive int, got {size!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive, got {self.timeout!r}")
        pg_timeout = self.pg_timeout
        if pg_timeout is None:
            pg_timeout = max(self.timeout / 2.0, self.timeout - 10.0)
        if not pg_timeout > 0:
            raise ValueError(f"pg_timeout must be positive, got {pg_timeout!r}")
        object.__setattr__(self, "pg_timeout", pg_timeout)
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "kwargs", dict(self.kwargs or {}))

    def options(self) -> dict[str, Any]:
        """The bounds, as the keyword arguments of a launcher's ``run`` (SPEC 4.2.5)."""
        return {
            "timeout": self.timeout,
            "allow_failure": self.allow_failure,
            "pg_timeout": self.pg_timeout,
            "failure_grace": self.failure_grace,
        }

    def payload(self) -> bytes:
        """``(fn, args, kwargs)`` pickled for the ranks; ``TypeError`` naming what is not picklable."""
        try:
            return pickle.dumps((self.fn, self.args, self.kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise TypeError(
                "a scenario call needs a picklable fn (a module-level function of an importable "
                f"module) and picklable args/kwargs: {type(exc).__name__}: {exc}"
            ) from exc

    def finish(self, outcomes: list[RankOutcome], where: str) -> list:
        """The call's result from its ranks' outcomes: what they printed is echoed to this
        process's stdout; then the outcomes (``allow_failure``), or the values (index = rank), or
        :class:`RankFailure` (``where`` names the launcher and world in its message)."""
        echo_output(outcomes)
        if self.allow_failure:
            return outcomes
        if any(not outcome.ok for outcome in outcomes):
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            raise RankFailure(outcomes, f"{where}, {name}, timeout {self.timeout:g} s")
        return [outcome.value for outcome in outcomes]

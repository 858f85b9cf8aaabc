"""The pool launcher: run one function on N local processes joined in a fresh process group per
call (SPEC 4.2.1-4.2.3, 4.2.8, 4.2.11; devices 4.6.3).

:func:`run_on_ranks` runs a module-level function once on each of ``world_size`` warm worker
processes and returns their values, index = rank, or raises :class:`RankFailure`;
:func:`prepare_workers` says what every worker imports and prepares before a call's deadline
starts; :func:`start_server`, :func:`start_workers`, :func:`shutdown_pool` and :func:`kill_all`
start and end this process's pool. ``caller`` is the caller's side (the pool and each call),
``processes`` starts and keeps the workers, ``supervision`` waits for them, ``worker`` is the rank
side.
"""

from gefen_conformance.harness.call import DEFAULT_FAILURE_GRACE_S
from gefen_conformance.harness.outcomes import RankFailure, RankOutcome
from gefen_conformance.harness.pool.caller import (
    kill_all,
    prepare_workers,
    run_on_ranks,
    shutdown_pool,
    start_server,
    start_workers,
)

__all__ = [
    "DEFAULT_FAILURE_GRACE_S",
    "RankFailure",
    "RankOutcome",
    "kill_all",
    "prepare_workers",
    "run_on_ranks",
    "shutdown_pool",
    "start_server",
    "start_workers",
]

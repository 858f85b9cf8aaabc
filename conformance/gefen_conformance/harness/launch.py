"""Run a scenario's rank body on the active launcher: the one launcher contract (SPEC 4.2.5-4.2.7).

A scenario calls :func:`run` with the arguments of a
:class:`~gefen_conformance.harness.call.Call`, checked there once, and gets the same values,
:class:`~gefen_conformance.harness.outcomes.RankOutcome` s and
:class:`~gefen_conformance.harness.outcomes.RankFailure` under every launcher. A
:class:`Launcher` is an object with ``run`` and ``execution()``: :class:`PoolLauncher` (the
default, :mod:`gefen_conformance.harness.pool`) or torchrun's
(:mod:`gefen_conformance.harness.torchrun.launcher`). :func:`execution` describes the active one
for the certificate, :func:`unfit_reason` says why a scenario is too large for it (the caller
skips it, :func:`skip_unless_fits`), and :func:`drain_world_sizes` hands over the sizes of the
calls made since it was last asked (SPEC 4.6.5).

Process state, only through these functions: the active launcher (:func:`active`; replaced
process-wide with :func:`set_launcher`, for a block with :func:`using`) and the world sizes run
(:func:`drain_world_sizes`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from gefen_conformance.harness import devices, pool
from gefen_conformance.harness.call import Call

__all__ = [
    "Execution",
    "Launcher",
    "PoolLauncher",
    "WorldTooLarge",
    "active",
    "drain_world_sizes",
    "execution",
    "run",
    "run_on",
    "set_launcher",
    "skip_unless_fits",
    "unfit_reason",
    "using",
]


@dataclass(frozen=True)
class Execution:
    """Where a launcher runs scenarios (the certificate's ``execution``, SPEC 4.4.1).

    ``world_size`` is the number of ranks launched together (None for the pool: every call starts
    a world of its own size); ``max_world_size`` the largest scenario it can run (None: no limit).
    """

    launcher: str
    nodes: int
    world_size: int | None
    max_world_size: int | None
    backend: str
    device_type: str
    device_names: tuple[str, ...]

    def as_dict(self) -> dict:
        record = asdict(self)
        record["device_names"] = list(self.device_names)
        return record


class WorldTooLarge(ValueError):
    """A scenario asked the active launcher for more ranks than it can run (more than its world,
    or more than this machine has devices for, one per rank)."""


@runtime_checkable
class Launcher(Protocol):
    """What :func:`run` needs of a launcher.

    ``run`` has the contract of ``gefen_conformance.harness.pool.run_on_ranks`` (SPEC 4.2.1-4.2.2): it binds a
    :class:`gefen_conformance.harness.world.World` around every rank's call of ``fn``, returns the values
    (index
    = rank), or the outcomes with ``allow_failure``, and raises ``RankFailure`` otherwise.
    """

    def run(
        self, fn: Callable[..., Any], world_size: int, args: tuple, kwargs: dict[str, Any], **bounds: Any
    ) -> list:
        """``bounds``: the keyword fields of :class:`~gefen_conformance.harness.call.Call`, every
        one given (``timeout``, ``allow_failure``, ``pg_timeout``, ``failure_grace``)."""
        ...

    def execution(self) -> Execution: ...


class PoolLauncher:
    """The local pool of :mod:`gefen_conformance.harness.pool`, one fresh world per call, on the run's device
    (:func:`gefen_conformance.harness.devices.selected`): gloo ranks on CPU; on an accelerator one device per
    rank (rank r on ``type:index+r``) and that device's backend (NCCL for CUDA, SPEC 4.6.3)."""

    run = staticmethod(pool.run_on_ranks)

    def execution(self) -> Execution:
        device = devices.selected()
        return Execution(
            launcher="pool",
            nodes=1,
            world_size=None,
            max_world_size=None,
            backend=devices.backend_for(device),
            device_type=device.type,
            device_names=devices.names(device),
        )

    def unfit(self, world_size: int) -> str | None:
        """Why this machine cannot give each of ``world_size`` ranks a device of its own, or None."""
        return devices.shortage(devices.selected(), world_size)


_LOCK = threading.Lock()
_ACTIVE: Launcher = PoolLauncher()


def active() -> Launcher:
    """The launcher :func:`run` dispatches to."""
    return _ACTIVE


def set_launcher(launcher: Launcher) -> Launcher:
    """Install ``launcher`` process-wide (torchrun's entry point does this once); returns the
    launcher it replaces."""
    global _ACTIVE
    if not isinstance(launcher, Launcher):
        raise TypeError(
            f"set_launcher() takes an object with run() and execution(), got {type(launcher).__name__}"
        )
    with _LOCK:
        previous, _ACTIVE = _ACTIVE, launcher
    return previous


@contextlib.contextmanager
def using(launcher: Launcher) -> Iterator[Launcher]:
    """Use ``launcher`` for the block, then put the previous one back."""
    previous = set_launcher(launcher)
    try:
        yield launcher
    finally:
        set_launcher(previous)


_SIZES_RUN: set[int] = set()


def drain_world_sizes() -> list[int]:
    """The world sizes of the calls :func:`run` passed to a launcher since the last drain (sorted),
    and forget them: the plugin drains after every test and sends them with the test's report."""
    with _LOCK:
        sizes = sorted(_SIZES_RUN)
        _SIZES_RUN.clear()
    return sizes


def execution() -> Execution:
    """The active launcher's description."""
    return _ACTIVE.execution()


def unfit_reason(world_size: int) -> str | None:
    """Why the active launcher cannot run a ``world_size``-rank scenario, or None if it can."""
    return _unfit(_ACTIVE, world_size)


#: the attribute that marks a skip as "did not run here" (SPEC 4.2.7, 4.4.2)
NOT_RUN_HERE = "gefen_not_run_here"


def skip_unless_fits(world_size: int) -> None:
    """Skip the calling test with :func:`unfit_reason` when the active launcher cannot run
    ``world_size`` ranks (too few ranks, too few devices). The skip is marked as a scenario that did
    not run here, which makes the run ``partial`` (SPEC 4.4.2): unlike a missing capability, it
    is not the implementation's choice."""
    reason = unfit_reason(world_size)
    if reason is None:
        return
    import pytest

    skip = pytest.skip.Exception(reason)
    setattr(skip, NOT_RUN_HERE, True)
    raise skip


def _unfit(launcher: Launcher, world_size: int) -> str | None:
    """The world-size limit of :meth:`Launcher.execution`, then the launcher's own ``unfit``
    (optional: the pool's device shortage, say)."""
    own = getattr(launcher, "unfit", None)
    reason = own(world_size) if callable(own) else None
    if reason is not None:
        return reason
    described = launcher.execution()
    limit = described.max_world_size
    if limit is None or world_size <= limit:
        return None
    return (
        f"needs {world_size} ranks; the {described.launcher} launcher runs at most {limit} "
        f"({described.nodes} node(s), world size {described.world_size})"
    )


def run(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    **bounds: Any,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks of the active launcher.

    ``bounds`` are the keyword fields of :class:`~gefen_conformance.harness.call.Call`
    (``timeout``, ``allow_failure``, ``pg_timeout``, ``failure_grace``), checked there. Same
    contract as :func:`gefen_conformance.harness.pool.run_on_ranks`; in addition raises
    :class:`WorldTooLarge` (a ``ValueError``) naming the reason when the launcher cannot run that
    many ranks.
    """
    return run_on(_ACTIVE, fn, world_size, args, kwargs, **bounds)


def run_on(
    launcher: Launcher,
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    **bounds: Any,
) -> list:
    """:func:`run` on ``launcher`` rather than the active one (the scenarios at scale run on the
    thread launcher, :mod:`gefen_conformance.harness.threads`, whichever launcher is active); the
    call's world size is recorded all the same (:func:`drain_world_sizes`)."""
    call = Call(fn, world_size, args, kwargs, **bounds)
    reason = _unfit(launcher, world_size)
    if reason is not None:
        raise WorldTooLarge(reason)
    with _LOCK:
        _SIZES_RUN.add(world_size)
    return launcher.run(call.fn, call.world_size, call.args, call.kwargs, **call.options())

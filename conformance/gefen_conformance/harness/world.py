"""What a rank body sees of its ranks: the :class:`World` of the running scenario call (SPEC 4.2.4).

A multi-rank scenario is a rank body plus a check on the values the ranks return, written once
and run by whichever launcher is active (:mod:`gefen_conformance.harness.launch`): the local pool of
:mod:`gefen_conformance.harness.pool`, or a torchrun job. The body learns everything launcher-specific from
``world.current()``, never from ``torch.distributed``'s defaults:

* ``rank`` and ``size``: its rank within the scenario and the scenario's number of ranks;
* ``group``: the process group to run collectives on and to pass to DCP as ``process_group=``
  (the call's own default group under either launcher, SPEC 4.2.9);
* ``device``: the torch device of this rank's tensors (cpu, or the rank's accelerator, SPEC 4.6.3);
* ``mesh``: a 1-D ``DeviceMesh`` over ``group`` in rank order, for ``Shard(0)`` parameters;
* ``die(exitcode)``: end this rank as if it crashed mid-operation; the caller reports the rank
  "died" with that exit code.

A launcher binds a World around each call with :func:`scope`: process-wide where a rank is a
process (the pool, torchrun), for one thread where ranks are threads of one process
(:mod:`gefen_conformance.harness.threads`, ``scope(world, thread=True)``); a thread's own binding
wins over the process's. These bindings are this module's only state, read through
:func:`current` and :func:`bound`. This module imports no torch at import time (the pool's worker
imports it before torch is loaded).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

__all__ = ["NoCurrentWorld", "World", "bound", "current", "scope", "thread_bound"]


class NoCurrentWorld(RuntimeError):
    """``current()`` was called where no launcher has bound a World."""


@dataclass(frozen=True)
class World:
    """The ranks of one scenario call, as one rank sees them (see the module docstring).

    ``die_hook(exitcode)`` is the launcher's way of ending the rank and must not return; a
    scenario calls :meth:`die` instead.
    """

    rank: int
    size: int
    group: Any  # torch.distributed.ProcessGroup
    device: Any  # torch.device
    die_hook: Callable[[int], NoReturn] = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"World rank {self.rank} is outside a world of size {self.size}")

    @functools.cached_property
    def mesh(self):
        """A 1-D ``DeviceMesh`` over ``group`` (built once per call, without a collective, so
        it works on a subgroup that only some ranks of a larger job belong to)."""
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(self.group, self.device.type)

    def die(self, exitcode: int) -> NoReturn:
        """End this rank now, as a crash would, without reporting a result or tearing the group
        down; the launcher reports it as "died" with ``exitcode`` (an int from 1 to 255)."""
        if isinstance(exitcode, bool) or not isinstance(exitcode, int) or not 1 <= exitcode <= 255:
            raise ValueError(f"die() takes an exit code from 1 to 255, got {exitcode!r}")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream must not keep the rank alive
                pass
        self.die_hook(exitcode)
        raise RuntimeError(f"the launcher's die hook returned instead of ending rank {self.rank}")


_CURRENT: World | None = None
_THREAD = threading.local()  # .world: the World bound for this thread only, if any


def current() -> World:
    """The World of the scenario call running in this process.

    Raises :class:`NoCurrentWorld` outside one: a rank body must be run through
    :func:`gefen_conformance.harness.launch.run` (or ``gefen_conformance.harness.pool.run_on_ranks``), or
    in-process inside
    a ``gefen_conformance.harness.sharding.WorldOfOne``.
    """
    here = bound()
    if here is None:
        raise NoCurrentWorld(
            "gefen_conformance.harness.world.current() was called outside a scenario call: no launcher has "
            "bound a World in this process (run the rank body through gefen_conformance.harness.launch.run, "
            "or in-process inside a gefen_conformance.harness.sharding.WorldOfOne)"
        )
    return here


def bound() -> World | None:
    """The World bound for this thread, else the one bound in this process, or None (for code that
    also runs outside a call)."""
    own = getattr(_THREAD, "world", None)
    return _CURRENT if own is None else own


def thread_bound() -> bool:
    """Whether the calling thread has a World bound for itself (a rank that is a thread)."""
    return getattr(_THREAD, "world", None) is not None


@contextlib.contextmanager
def scope(world: World, *, thread: bool = False) -> Iterator[World]:
    """Bind ``world`` as the current World for the duration of the block (launchers only).

    By default a process-wide binding: threads a rank body starts (an async save's writer, say)
    see the same World. With ``thread``, a binding for the calling thread only, which wins over
    the process-wide one there (a rank that is a thread); threads that rank starts see the
    process's binding, not its. Scopes nest; the previous World is restored on exit.
    """
    global _CURRENT
    if not isinstance(world, World):
        raise TypeError(f"scope() takes a World, got {type(world).__name__}")
    if thread:
        previous = getattr(_THREAD, "world", None)
        _THREAD.world = world
        try:
            yield world
        finally:
            _THREAD.world = previous
        return
    previous, _CURRENT = _CURRENT, world
    try:
        yield world
    finally:
        _CURRENT = previous

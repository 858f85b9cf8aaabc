"""Saving and loading through an implementation's DCP adapter (SPEC 4.3.2-4.3.6).

:func:`save` and :func:`load` run ``dcp.save`` / ``dcp.load`` of the optimizer (and the model, when
given) through ``impl.dcp_state`` on the current World's group (:func:`group`); :func:`trained`
gives a DCP scenario's trained state to save.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable

import torch

from gefen_conformance.harness import world
from gefen_conformance.workload.models import DCP_STEPS, Model, param_groups, parameters, train

__all__ = ["dying_writer", "group", "killing_writer", "load", "save", "trained"]


def group():
    """The process group of the current scenario call (None, the default group, outside one)."""
    here = world.bound()
    return None if here is None else here.group


@contextlib.contextmanager
def _dcp_options(dcp_collectives: bool):
    """DCP's ``no_dist`` for :func:`save` and :func:`load`, with the warning DCP gives each time
    it is used (the choice is deliberate here) kept out of the run's report."""
    if dcp_collectives:
        yield {"no_dist": False}
        return
    size = torch.distributed.get_world_size(group()) if torch.distributed.is_initialized() else 1
    if size != 1:
        raise ValueError(f"DCP without collectives is for a World of one; this one has {size} ranks")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield {"no_dist": True}


def save(
    impl,
    optimizer,
    path=None,
    *,
    params: dict | None = None,
    planner: bool = True,
    writer=None,
    dcp_collectives: bool = True,
) -> None:
    """``dcp.save`` of the optimizer through ``impl.dcp_state`` (and the model when ``params`` is
    given) to ``path`` or ``writer``, with ``impl.save_planner()`` when ``planner`` (DCP's
    default otherwise), on the current World's group. Without ``dcp_collectives`` (a World of one
    only), DCP plans in this process without exchanging its plans over the group (its
    ``no_dist``); the adapter's own collectives still run on the group."""
    import torch.distributed.checkpoint as dcp

    state = {"optimizer": impl.dcp_state(optimizer)}
    if params is not None:
        state = {"model": dict(params), **state}
    target = {"storage_writer": writer} if writer is not None else {"checkpoint_id": str(path)}
    chosen = impl.save_planner() if planner and impl.save_planner is not None else None
    with _dcp_options(dcp_collectives) as options:
        dcp.save(state, planner=chosen, process_group=group(), **options, **target)


def load(
    impl, optimizer, path=None, *, params: dict | None = None, reader=None, dcp_collectives: bool = True
) -> None:
    """``dcp.load`` of ``path`` or ``reader`` into the optimizer through ``impl.dcp_state`` (and
    into the model when ``params`` is given), on the current World's group; ``dcp_collectives``
    as for :func:`save`."""
    import torch.distributed.checkpoint as dcp

    state = {"optimizer": impl.dcp_state(optimizer)}
    if params is not None:
        state = {"model": dict(params), **state}
    source = {"storage_reader": reader} if reader is not None else {"checkpoint_id": str(path)}
    with _dcp_options(dcp_collectives) as options:
        dcp.load(state, process_group=group(), **options, **source)


def trained(impl, model: Model, mesh, *, steps: Iterable[int] = range(1, DCP_STEPS + 1), **options):
    """``(params, optimizer)``: ``model`` sharded on ``mesh``, the implementation's optimizer over
    it (the model's hyperparameters, ``factored_v_2d=False`` unless given), trained ``steps``."""
    params = parameters(model, mesh=mesh)
    optimizer = impl.make_optimizer(param_groups(model, params), **dict({"factored_v_2d": False}, **options))
    train(model, optimizer, params, steps)
    return params, optimizer


def dying_writer(path: str, victim: int, exitcode: int):
    """A DCP ``FileSystemWriter`` of ``path`` whose rank ``victim`` writes its payload, then dies
    (``World.die(exitcode)``) before reporting its write results, i.e. before any rank can commit
    ``.metadata`` (SPEC 4.3.3)."""
    return _dying_writer_class()(path, victim, exitcode)


def killing_writer(victim: int, exitcode: int):
    """``writer_for(path)`` giving :func:`dying_writer` of ``path`` (picklable, for rank bodies)."""
    return functools.partial(dying_writer, victim=victim, exitcode=exitcode)


@functools.cache
def _dying_writer_class():
    import torch.distributed.checkpoint as dcp

    class DyingWriter(dcp.FileSystemWriter):
        def __init__(self, path: str, victim: int, exitcode: int):
            super().__init__(path)
            self.victim, self.exitcode = victim, exitcode

        def write_data(self, plan, planner):
            future = super().write_data(plan, planner)
            here = world.current()
            if here.rank == self.victim:
                future.wait()
                here.die(self.exitcode)
            return future

    return DyingWriter

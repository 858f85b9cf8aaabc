"""Building FSDP2-style sharded parameters inside a rank: ``Shard(0)`` DTensors on the current
World's 1-D mesh (SPEC 4.2.4), and :class:`WorldOfOne`, a World in this process."""

from __future__ import annotations

import contextlib
import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from gefen_conformance.harness import devices, world


def forget_dtensor_caches() -> None:
    """Drop torch's cached DTensor sharding decisions.

    They are keyed on meshes compared without their rank, so a warm worker that served as
    another rank before could otherwise get DTensors on that earlier mesh and coordinate.
    """
    clear = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear is not None:
        clear()
    propagator = DTensor._op_dispatcher.sharding_propagator
    for cached in (
        getattr(propagator.propagate_op_sharding, "cache", None),
        getattr(propagator, "_propagate_tensor_meta_cached", None),
    ):
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


def world_mesh():
    """The current World's 1-D mesh (SPEC 4.2.4), with torch's DTensor caches dropped first (see
    :func:`forget_dtensor_caches`). Raises ``gefen_conformance.harness.world.NoCurrentWorld`` outside a
    scenario call or a :class:`WorldOfOne`.

    A rank that is a thread (the thread launcher) drops nothing: its launcher dropped them once
    before the call's threads started, and the caches tell one thread's mesh from another's (a
    mesh compares its thread), so a rank dropping them would only make its peers recompute."""
    if not world.thread_bound():
        forget_dtensor_caches()
    return world.current().mesh


def shard(full: torch.Tensor, mesh) -> torch.Tensor:
    """``full`` split along dim 0 across ``mesh`` (torch's even-then-short split, as
    ``distribute_tensor`` splits it), each rank keeping a copy of its own rows.

    Every rank passes the same ``full`` (the workload's tensors are seeded), so no rank's rows need
    to be sent: no collective runs, where ``distribute_tensor`` scatters from rank 0.
    """
    rank, size = mesh.get_local_rank(), mesh.size()
    chunks = full.chunk(size, dim=0)
    local = chunks[rank] if rank < len(chunks) else full[:0]
    return DTensor.from_local(
        local.to(mesh.device_type, copy=True),
        mesh,
        [Shard(0)],
        run_check=False,
        shape=full.shape,
        stride=full.stride(),
    )


def shard_like(full: torch.Tensor, like) -> torch.Tensor:
    """``full`` as a DTensor laid out like ``like`` (``Shard(0)`` on its mesh), from this rank's rows
    alone: no collective, so it may run while another thread's collectives are under way."""
    from torch.distributed.tensor import DTensor

    here = world.current()
    chunks = full.chunk(here.size, dim=0)
    local = chunks[here.rank] if here.rank < len(chunks) else full[:0]
    return DTensor.from_local(
        local.to(like.device),
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=full.shape,
        stride=full.stride(),
    )


def sharded_parameter(full: torch.Tensor, mesh) -> torch.nn.Parameter:
    p = torch.nn.Parameter(shard(full, mesh))
    if p.device_mesh.get_coordinate() != mesh.get_coordinate():
        raise RuntimeError("a sharded parameter landed on a stale mesh; DTensor caches were not cleared")
    return p


def _no_dying_in_process(exitcode: int):
    raise RuntimeError(
        f"World.die({exitcode}) in a WorldOfOne would end the calling process; simulate a dying "
        "rank in a launched scenario (gefen_conformance.harness.launch.run)"
    )


class WorldOfOne:
    """A gloo process group of one in this process (file store, no port), with its mesh and a
    scratch directory for checkpoints; ``close()`` destroys the group if it made it.

    While open, a group it made is also the process's current World (rank 0 of 1, on the run's
    device, :func:`gefen_conformance.harness.devices.selected`: ``cpu`` unless ``--gefen-device`` chose
    another, whose
    backend the group then uses, SPEC 4.6.3), so a rank body runs in-process as it does under a
    launcher; ``die()`` raises there instead. In a
    process that already has a default group, it uses the current World, which must then be a
    World of one (a launcher's); anything else is refused with a ``RuntimeError``.
    """

    def __init__(self):
        self.owned = not dist.is_initialized()
        if not self.owned:
            bound = world.bound()
            if bound is None or bound.size != 1:
                raise RuntimeError(
                    "WorldOfOne: this process already has a default process group and the current "
                    f"World is {'none' if bound is None else f'of size {bound.size}'}; run in-process "
                    "checks in a process without a group, or bind a World of one first"
                )
        self.tmp = tempfile.TemporaryDirectory(prefix="gefen-staging-")
        self._scope = contextlib.ExitStack()
        if self.owned:
            device = devices.selected()
            if device.type == "cuda":
                torch.cuda.set_device(device)
            store = dist.FileStore(os.path.join(self.tmp.name, "store"), 1)
            dist.init_process_group(devices.backend_for(device), store=store, rank=0, world_size=1)
            one = world.World(0, 1, dist.group.WORLD, device, _no_dying_in_process)
            self._scope.enter_context(world.scope(one))
        self.mesh = world_mesh()
        self.count = 0

    def path(self) -> str:
        self.count += 1
        return os.path.join(self.tmp.name, f"ckpt{self.count}")

    def close(self):
        self._scope.close()
        if self.owned and dist.is_initialized():
            dist.destroy_process_group()
        self.tmp.cleanup()

"""Which parameters become checkpoint slots, and the layout rules they must meet.

A *slot* is one parameter, numbered from 0 across all groups in registration
order. Every check here reads only this rank's optimizer, so callers inside a
collective must run it inside the failure-agreement region (see agreement.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import optimizer_view, schema


@dataclass(frozen=True)
class SlotRef:
    index: int
    group_index: int
    name: str
    parameter: torch.Tensor

    def identity(self) -> dict:
        return schema.identity_entry(self.name, self.group_index, self.parameter.shape)


def _looks_like_dtensor(value) -> bool:
    return all(hasattr(value, attr) for attr in ("to_local", "placements", "device_mesh"))


def local_part(parameter) -> torch.Tensor:
    """This rank's shard of a DTensor parameter (the tensor itself otherwise)."""
    return parameter.to_local() if hasattr(parameter, "to_local") else parameter


def _check_optimizer_flags(optimizer) -> None:
    if optimizer_view.capturable_of(optimizer):
        raise RuntimeError(
            "GefenDCPState cannot save an optimizer in capturable mode: its counters "
            "live on the device and have no host-side checkpoint form. Use "
            "capturable=False."
        )
    if optimizer_view.factored_v_2d_of(optimizer):
        raise RuntimeError(
            "GefenDCPState cannot save factored_v_2d=True state: a row/column "
            "factored second moment has no per-element shard to write. Build the "
            "optimizer with factored_v_2d=False to use resharding checkpoints."
        )


def _check_parameter(slot_index: int, name: str, parameter, world: int) -> None:
    if not _looks_like_dtensor(parameter):
        raise RuntimeError(
            f"GefenDCPState needs every parameter to be a DTensor (slot {slot_index}, {name!r} "
            "is a plain tensor)"
        )
    mesh = parameter.device_mesh
    if len(mesh.shape) != 1 or mesh.size() != world:
        raise RuntimeError(
            "GefenDCPState handles only a one-dimensional DeviceMesh that spans the "
            f"whole default world (slot {slot_index}, {name!r} has mesh shape "
            f"{tuple(mesh.shape)}, world size {world})"
        )
    if mesh.mesh.flatten().tolist() != list(range(world)):
        raise RuntimeError(
            f"GefenDCPState needs the mesh ranks in canonical order 0..{world - 1}; slot "
            f"{slot_index} ({name!r}) uses the reordered mesh {mesh.mesh.flatten().tolist()}"
        )
    placements = tuple(parameter.placements)
    if len(placements) != 1:
        raise RuntimeError(
            "GefenDCPState needs exactly one DTensor placement per parameter "
            f"(slot {slot_index}, {name!r} has {len(placements)})"
        )
    placement = placements[0]
    if type(placement).__name__ != "Shard" or getattr(placement, "dim", None) != 0:
        raise RuntimeError(
            f"GefenDCPState handles only Shard(0) parameters (slot {slot_index}, {name!r} is "
            f"placed as {placement!r})"
        )


def collect_slots(optimizer) -> tuple:
    """Number every parameter as a slot, refusing any layout the format cannot carry."""
    _check_optimizer_flags(optimizer)
    world = dist.get_world_size()
    slots = []
    for group_index, group in enumerate(optimizer.param_groups):
        if group.get("sharded_mode") is not None:
            raise RuntimeError(
                f"GefenDCPState does not handle groups in a Muon sharded mode (group {group_index})"
            )
        params = group["params"]
        names = group.get("param_names")
        if names is None or len(names) != len(params):
            raise RuntimeError(
                "GefenDCPState needs stable param_names given by the caller on every "
                f"group: group {group_index} has {0 if names is None else len(names)} name(s) "
                f"for {len(params)} parameter(s). Pass named parameters so a resharded slot is "
                "matched by name, not by position."
            )
        for position, (name, parameter) in enumerate(zip(names, params)):
            index = len(slots)
            if optimizer_view.name_is_synthesized(group, position):
                raise RuntimeError(
                    f"GefenDCPState needs names given by the caller, but slot {index} is "
                    f"called {str(name)!r}, a positional name the optimizer synthesized for "
                    "an unnamed parameter. Build the optimizer from named parameters."
                )
            _check_parameter(index, str(name), parameter, world)
            slots.append(SlotRef(index, group_index, str(name), parameter))
    if not slots:
        raise RuntimeError("GefenDCPState needs at least one parameter to save")
    return tuple(slots)


def reject_name_collisions(slots) -> None:
    """A name must pick out one parameter across all groups.

    The saved identity carries a positional group index, so two equally shaped
    parameters sharing a name would stay indistinguishable after the groups are
    rebuilt in another order, and each could receive the other's state.
    """
    first_slot = {}
    for slot in slots:
        if slot.name in first_slot:
            raise RuntimeError(
                "GefenDCPState needs parameter names that are unique across every "
                f"group, but {slot.name!r} is used by slots {first_slot[slot.name]} and "
                f"{slot.index}"
            )
        first_slot[slot.name] = slot.index

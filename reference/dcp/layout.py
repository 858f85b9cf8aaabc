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
            "GefenDCPState needs every parameter to be a DTensor (slot %d, %r is a "
            "plain tensor)" % (slot_index, name)
        )
    mesh = parameter.device_mesh
    if len(mesh.shape) != 1 or mesh.size() != world:
        raise RuntimeError(
            "GefenDCPState handles only a one-dimensional DeviceMesh that spans the "
            "whole default world (slot %d, %r has mesh shape %s, world size %d)"
            % (slot_index, name, tuple(mesh.shape), world)
        )
    if mesh.mesh.flatten().tolist() != list(range(world)):
        raise RuntimeError(
            "GefenDCPState needs the mesh ranks in canonical order 0..%d; slot %d "
            "(%r) uses the reordered mesh %s"
            % (world - 1, slot_index, name, mesh.mesh.flatten().tolist())
        )
    placements = tuple(parameter.placements)
    if len(placements) != 1:
        raise RuntimeError(
            "GefenDCPState needs exactly one DTensor placement per parameter "
            "(slot %d, %r has %d)" % (slot_index, name, len(placements))
        )
    placement = placements[0]
    if type(placement).__name__ != "Shard" or getattr(placement, "dim", None) != 0:
        raise RuntimeError(
            "GefenDCPState handles only Shard(0) parameters (slot %d, %r is placed "
            "as %r)" % (slot_index, name, placement)
        )


def collect_slots(optimizer) -> tuple:
    """Number every parameter as a slot, refusing any layout the format cannot carry."""
    _check_optimizer_flags(optimizer)
    world = dist.get_world_size()
    slots = []
    for group_index, group in enumerate(optimizer.param_groups):
        if group.get("sharded_mode") is not None:
            raise RuntimeError(
                "GefenDCPState does not handle groups in a Muon sharded mode "
                "(group %d)" % group_index
            )
        params = group["params"]
        names = group.get("param_names")
        if names is None or len(names) != len(params):
            raise RuntimeError(
                "GefenDCPState needs stable param_names given by the caller on every "
                "group: group %d has %d name(s) for %d parameter(s). Pass named "
                "parameters so a resharded slot is matched by name, not by position."
                % (group_index, 0 if names is None else len(names), len(params))
            )
        for position, (name, parameter) in enumerate(zip(names, params)):
            index = len(slots)
            if optimizer_view.name_is_synthesized(group, position):
                raise RuntimeError(
                    "GefenDCPState needs names given by the caller, but slot %d is "
                    "called %r, a positional name the optimizer synthesized for an "
                    "unnamed parameter. Build the optimizer from named parameters."
                    % (index, str(name))
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
                "group, but %r is used by slots %d and %d"
                % (slot.name, first_slot[slot.name], slot.index)
            )
        first_slot[slot.name] = slot.index

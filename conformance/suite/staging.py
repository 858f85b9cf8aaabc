"""Drive hyperparameter staging through an implementation's public DCP load path (SPEC 3.5).

One example = one checkpoint written by the reference with chosen saved hyperparameters, loaded
(world size 1, in this process) into a fresh optimizer of the implementation under test and into
one of the reference, whose groups were given the same chosen *destinations* (Python numbers or
one-element tensors, possibly aliased across groups and keys). The outcomes are then compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed.checkpoint as dcp

from conformance import registry
from conformance.sharding import WorldOfOne, sharded_parameter

KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay")


@dataclass(frozen=True)
class Destination:
    """A group's live entry for one key before the load: a number or a one-element tensor."""

    dtype: Optional[torch.dtype]  # None: a Python float
    value: float
    shape: tuple = ()
    requires_grad: bool = False
    alias: Optional[str] = None  # destinations with the same alias tag are one tensor object

    def build(self, shared: dict) -> Any:
        if self.dtype is None:
            return self.value
        if self.alias is not None and self.alias in shared:
            return shared[self.alias]
        t = torch.full(self.shape, self.value, dtype=self.dtype)
        if self.requires_grad:
            t.requires_grad_(True)
        if self.alias is not None:
            shared[self.alias] = t
        return t


@dataclass
class Outcome:
    accepted: bool
    error: Optional[BaseException]
    values: list  # per group, per key: ("float", hex) or ("tensor", dtype, shape, bits, requires_grad)
    identities_kept: bool
    versions: list


def _optimizer(impl, world: WorldOfOne):
    params = [sharded_parameter(torch.zeros(4, 2), world.mesh), sharded_parameter(torch.zeros(2, 2), world.mesh)]
    return impl.make_optimizer(
        [{"params": [("a.weight", params[0])]}, {"params": [("b.weight", params[1])]}], factored_v_2d=False
    )


def write_checkpoint(world: WorldOfOne, saved: list) -> str:
    """A reference checkpoint whose two groups carry ``saved[g][key]`` (Python floats)."""
    ref = registry.resolve("reference")
    opt = _optimizer(ref, world)
    for group, values in zip(opt.param_groups, saved):
        group.update(values)
    path = world.path()
    dcp.save({"optimizer": ref.dcp_state(opt)}, checkpoint_id=path)
    return path


def _describe(value: Any):
    if torch.is_tensor(value):
        flat = value.detach().reshape(-1)
        bits = flat.tolist() if value.dtype == torch.bool else flat.view(torch.uint8).tolist()
        return ("tensor", str(value.dtype), tuple(value.shape), tuple(bits), bool(value.requires_grad))
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, repr(value))


def load_outcome(impl, world: WorldOfOne, path: str, destinations: list) -> Outcome:
    """Load ``path`` into a fresh optimizer of ``impl`` whose groups hold ``destinations``."""
    opt = _optimizer(impl, world)
    shared: dict = {}
    live = []
    for group, dests in zip(opt.param_groups, destinations):
        row = {}
        for key in KEYS:
            row[key] = group[key] = dests[key].build(shared)
        live.append(row)
    versions_before = [[v._version if torch.is_tensor(v) else None for v in row.values()] for row in live]
    before = [[_describe(v) for v in row.values()] for row in live]
    error = None
    try:
        dcp.load({"optimizer": impl.dcp_state(opt)}, checkpoint_id=path)
    except Exception as exc:  # the property compares acceptance, so every failure is data
        error = exc
    identities = all(
        (group[key] is row[key]) for group, row in zip(opt.param_groups, live) for key in KEYS if torch.is_tensor(row[key])
    )
    values = [[_describe(group[key]) for key in KEYS] for group in opt.param_groups]
    if error is not None:
        # a rejected load must leave every destination as it was
        versions = [[v._version if torch.is_tensor(v) else None for v in row.values()] for row in live]
        identities = identities and values == before and versions == versions_before
    return Outcome(error is None, error, values, identities, versions_before)


def ulps_below_one(n: int) -> float:
    x = 1.0
    for _ in range(n):
        x = math.nextafter(x, 0.0)
    return x

"""Mutants that only the real training stack catches (FSDP2 ``fully_shard``, mixed precision, a
real GradScaler, schedulers, an app-state checkpoint resumed on another world size), in the
catalogue of tests/mutants.py.

``ENTRIES`` maps a mutant's name to its :class:`tests.mutants.Entry`; tests/mutants.py adds them to
``CATALOGUE`` (and their ``--impl`` spec strings); ``SLOW`` names those whose selections are slow.

Each has one bug whose trigger the hand-built DTensors of the other DCP scenarios and the plain
tensors of the input space lack: FSDP2 keeps every shard in a padded buffer of its own and hands
each block's gradients out as views of one reduce-scatter buffer, and a scheduler owns the lr of
the groups it drives (``initial_lr``).
"""

from __future__ import annotations

import torch

import gefen_reference.dcp.hyper_staging as hyper_staging
import gefen_reference.dcp.restore as restore
import gefen_reference.steps as steps
from gefen_reference.native_state import is_dtensor, local_tensor
from gefen_reference.steps import block_vmean_step

from .mutant_tools import clone
from .mutants import Entry, _Backend, _backend, _dcp_mutant, _state_with

_STACK = "test_stack_resumes_like_the_reference"


class _ShardedGradientFromStorageStart(_Backend):
    """The sharded path hands the kernel a DTensor gradient's local storage from its start (the
    storage pointer, not the tensor's): right for a gradient that owns its storage, another
    parameter's gradient under FSDP2, whose gradients are views of one reduce-scatter buffer."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if is_dtensor(p) and grad.storage_offset():
            grad = torch.as_strided(grad, grad.shape, grad.stride(), 0)
        super().update_parameter(p, grad, state, hyper, factored)


class _ShardedParameterRebound(_Backend):
    """The sharded path writes the new local shard into a fresh buffer and rebinds the DTensor to
    it: the optimizer's view of the parameter moves, FSDP2's padded buffer (what its next
    all-gather reads) keeps the old values."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if not is_dtensor(p) or factored:
            return super().update_parameter(p, grad, state, hyper, factored)
        fresh = local_tensor(p).detach().clone()
        block_vmean_step(fresh, grad, state, self.codebook, hyper)
        p._local_tensor = fresh


class _ShardsRoutedByTheirLocalShape(_Backend):
    """Routing: the backend takes the factored second moment for every parameter whose *local*
    tensor is 2-D, so under FSDP2 with the default ``factored_v_2d=True`` a 2-D DTensor's shard gets
    row and column statistics of its own rows (the Adafactor-under-FSDP class of bug); SPEC 1.9.1
    keeps DTensors on the block path."""

    def update_parameters(self, updates):
        rest = []
        for u in updates:
            if not (self.factored_v_2d and u.param.ndim == 2 and is_dtensor(u.param)):
                rest.append(u)
                continue
            local = local_tensor(u.param)
            if u.state.get("vmean_step", 1) == 0:  # the block moment the step just created
                u.state.pop("vmean", None)
                u.state.pop("vmean_step", None)
            if "v_row" not in u.state:
                steps.new_factored_second_moment(u.state, tuple(local.shape), local.device)
            steps.factored_step(local, u.grad, u.state, self.codebook, u.hyper)
        super().update_parameters(rest)


def _commit_leaving_lr_to_the_scheduler(param_groups, staged_groups):
    """SPEC 3.5.5's commit, but a group a scheduler drives (it holds ``initial_lr``) keeps its live
    ``lr``: the scheduler is taken to own it. A resumed run's first step then uses the fresh
    scheduler's first lr, not the checkpoint's."""
    for group, staged in zip(param_groups, staged_groups):
        for key in hyper_staging.HYPER_KEYS:
            if key == "lr" and "initial_lr" in group:
                continue
            hyper_staging.apply(group, staged[key])


_LR_LEFT = _state_with(
    restore=clone(restore, hyper_staging=clone(hyper_staging, commit=_commit_leaving_lr_to_the_scheduler))
)

ENTRIES: dict = {
    "sharded-gradient-from-storage-start": Entry(
        _backend("sharded-gradient-from-storage-start", _ShardedGradientFromStorageStart),
        "4.3.14",
        _STACK,
        "a DTensor gradient read from its storage's start (FSDP2's are views of one buffer)",
    ),
    "sharded-parameter-rebound": Entry(
        _backend("sharded-parameter-rebound", _ShardedParameterRebound),
        "4.3.14",
        _STACK,
        "a DTensor parameter's new shard written to a fresh buffer and rebound, FSDP2's left stale",
    ),
    "shards-routed-by-their-local-shape": Entry(
        _backend("shards-routed-by-their-local-shape", _ShardsRoutedByTheirLocalShape),
        "1.9.1",
        "default_flags",
        "under the default factored_v_2d=True a 2-D DTensor's shard takes the factored path",
    ),
    "lr-left-to-the-scheduler": Entry(
        _dcp_mutant("lr-left-to-the-scheduler", _LR_LEFT),
        "4.3.14",
        _STACK,
        "a restore keeps the live lr of a group a scheduler drives (initial_lr) instead of the saved one",
    ),
}
#: The stack's resume paths train a transformer under FSDP2 on up to 4 ranks: seconds per mutant.
SLOW: frozenset = frozenset(ENTRIES)

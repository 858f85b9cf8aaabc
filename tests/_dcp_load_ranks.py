"""Rank bodies and fixtures for the DCP load tests (tests/test_dcp_load_*.py).

Every public function is module level and picklable, so it runs on launched gloo ranks
(``gefen_conformance.harness.launch.run``) and, at world size 1, in-process inside a
``gefen_conformance.harness.sharding.WorldOfOne``. Rank, mesh and group come from
``gefen_conformance.harness.world.current()``; the model, optimizers and saves are those of ``tests.support``
and ``gefen_conformance.workload`` (``tests.support.DCP_MODEL``: on 3 and 4 ranks "dec.weight" splits
unevenly and "tiny.weight" has empty shards; "head.weight" stays fresh).
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp

import gefen_reference as reference
import gefen_reference.dcp as rdcp
from gefen_conformance.harness import world
from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations import registry
from gefen_conformance.workload import models, saving
from gefen_reference.dcp import layout
from tests.support import (
    COMPACT_KEYS,
    DCP_MODEL,
    DCP_SAVE_STEPS,
    DCP_SAVED_HYPERS,
    DCP_TARGET_OPTIONS,
    TINY,
    dcp_optimizer,
    dcp_trained,
)

CONTINUE_TOL = 5e-3  # the published bound on one continuation step (SPEC 3.7.3)


def model(tiny: bool = True) -> models.Model:
    """The DCP tests' model, with or without the two-row parameter."""
    return DCP_MODEL if tiny else DCP_MODEL.without(TINY)


def state_of(optimizer, param) -> dict:
    return optimizer.state.get(param, {})


def codebook_of(optimizer):
    return optimizer.codebook if isinstance(optimizer, reference.Gefen) else optimizer._gefen_codebook


def global_step_of(optimizer):
    return optimizer.global_step if isinstance(optimizer, reference.Gefen) else optimizer._gefen_global_step


def compact_report(optimizer, params) -> dict:
    """This rank's restored compact state, per parameter, plus the codebook and counters."""
    slots = {}
    for name, p in params.items():
        state = state_of(optimizer, p)
        slots[name] = {
            "keys": sorted(k for k in state if not k.startswith("_")),
            "local_numel": layout.local_part(p).numel(),
            **{
                k: (state[k].clone() if torch.is_tensor(state[k]) else state[k])
                for k in COMPACT_KEYS
                if k in state
            },
        }
    codebook = codebook_of(optimizer)
    return {
        "slots": slots,
        "codebook": None if codebook is None else codebook.clone(),
        "global_step": global_step_of(optimizer),
        "hypers": [{k: float(g[k]) for k in DCP_SAVED_HYPERS[0]} for g in optimizer.param_groups],
    }


# ---------------------------------------------------------------------------- saving


def save_checkpoints(root: str, jobs) -> dict:
    """Train and save one checkpoint per job ``(directory, implementation, tiny)``; collective.

    Each checkpoint holds ``{"model": parameters, "optimizer": adapter}`` (the reference's with
    its planner). Returns the saved global parameter values per directory (on every rank).
    """
    saved = {}
    for directory, impl, tiny in jobs:
        optimizer, params = dcp_trained(impl, model(tiny))
        saving.save(
            registry.resolve(impl),
            optimizer,
            os.path.join(root, directory),
            params=params,
            planner=impl == "reference",
        )
        saved[directory] = models.full_params(params)
    return saved


# --------------------------------------------------------------------------- loading


def load(root: str, directory: str, impl: str = "reference", tiny: bool = True, **overrides):
    """A fresh optimizer (target hyperparameters) restored from a checkpoint; collective."""
    layout_model = model(tiny)
    params = models.parameters(layout_model, mesh=world_mesh())
    optimizer = dcp_optimizer(impl, params, layout_model, **dict(DCP_TARGET_OPTIONS, **overrides))
    saving.load(registry.resolve(impl), optimizer, os.path.join(root, directory), params=params)
    return optimizer, params


def restore_and_continue(root: str, directories, compact_jobs=(), refused=()) -> dict:
    """At this world size, restore each checkpoint and take one continuation step; collective.

    For every directory in ``directories`` (reference checkpoints of the full
    model): restore into a reference Gefen, report its compact state and global
    parameters, overwrite its parameters with those of a native run trained here
    on the same gradients, take one step on both with the same gradient, and
    report the largest difference per parameter (SPEC 3.7.3).

    ``compact_jobs`` are ``(directory, implementation, tiny)`` restores whose compact state
    is only reported (interop, SPEC 3.8). ``refused`` are directories expected to
    fail; their ``(type, message)`` is reported.
    """
    next_step = [DCP_SAVE_STEPS]
    native, native_params = dcp_trained()
    before = {n: layout.local_part(p).detach().clone() for n, p in native_params.items()}
    models.train(DCP_MODEL, native, native_params, next_step)
    after = {n: layout.local_part(p).detach().clone() for n, p in native_params.items()}
    native_periods = {n: state_of(native, p).get("automatic_period") for n, p in native_params.items()}

    report = {"native_periods": native_periods, "restored": {}, "compact": {}, "refused": {}}
    for directory in directories:
        optimizer, params = load(root, directory)
        entry = compact_report(optimizer, params)
        entry["full_params"] = models.full_params(params)
        with torch.no_grad():
            for name, p in params.items():
                layout.local_part(p).copy_(before[name])
        models.train(DCP_MODEL, optimizer, params, next_step)
        entry["continuation_error"] = {
            name: float((layout.local_part(p).detach() - after[name]).abs().max())
            if before[name].numel()
            else 0.0
            for name, p in params.items()
        }
        report["restored"][directory] = entry
    for directory, impl, tiny in compact_jobs:
        optimizer, params = load(root, directory, impl, tiny)
        report["compact"][(directory, impl)] = compact_report(optimizer, params)
    for directory in refused:
        try:
            load(root, directory)
            report["refused"][directory] = None
        except Exception as exc:  # the outcome is the result
            report["refused"][directory] = (type(exc).__name__, str(exc))
    return report


# ------------------------------------------------------------------ fail-atomic loads


def live_signature(optimizer) -> dict:
    """Everything a load may change, captured by value and by identity."""
    state = {}
    for p, entries in optimizer.state.items():
        state[id(p)] = {k: (v, v.clone()) if torch.is_tensor(v) else (v, v) for k, v in entries.items()}
    groups = []
    for g in optimizer.param_groups:
        groups.append(
            {
                k: (v, v.clone() if torch.is_tensor(v) else (list(v) if isinstance(v, list) else v))
                for k, v in g.items()
            }
        )
    codebook = codebook_of(optimizer)
    return {
        "state_object": optimizer.state,
        "state": state,
        "groups_object": optimizer.param_groups,
        "groups": groups,
        "codebook": (codebook, None if codebook is None else codebook.clone()),
        "global_step": global_step_of(optimizer),
        "deterministic": getattr(optimizer, "deterministic", None),
    }


def _same(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(x is y or _same(x, y) for x, y in zip(a, b))
    return a == b


def unchanged_since(optimizer, signature) -> list:
    """The ways the optimizer differs from ``signature`` (empty when it is unchanged)."""
    problems = []
    if (
        optimizer.state is not signature["state_object"]
        or optimizer.param_groups is not signature["groups_object"]
    ):
        problems.append("state or param_groups object replaced")
    now = {id(p): entries for p, entries in optimizer.state.items()}
    if set(now) != set(signature["state"]):
        problems.append("state keys changed")
    for pid, entries in signature["state"].items():
        live = now.get(pid, {})
        if set(live) != set(entries):
            problems.append("state entries changed")
            continue
        for key, (obj, copy) in entries.items():
            if live[key] is not obj or not _same(live[key], copy):
                problems.append(f"state {key} changed")
    if len(optimizer.param_groups) != len(signature["groups"]):
        problems.append("group count changed")
    for g, saved in zip(optimizer.param_groups, signature["groups"]):
        if set(g) != set(saved):
            problems.append("group keys changed")
            continue
        for key, (obj, copy) in saved.items():
            if key == "params":
                if g[key] is not obj or any(x is not y for x, y in zip(g[key], copy)):
                    problems.append("group params changed")
            elif g[key] is not obj or not _same(g[key], copy):
                problems.append(f"group {key} changed")
    codebook, copy = signature["codebook"]
    live_codebook = codebook_of(optimizer)
    if live_codebook is not codebook or (copy is not None and not torch.equal(live_codebook, copy)):
        problems.append("codebook changed")
    if global_step_of(optimizer) != signature["global_step"]:
        problems.append("global step changed")
    if getattr(optimizer, "deterministic", None) != signature["deterministic"]:
        problems.append("deterministic changed")
    return problems


class Corrupting:
    """A DCP Stateful around ``GefenDCPState`` that damages the loaded dict before delegating."""

    def __init__(self, inner, corrupt):
        self.inner = inner
        self.corrupt = corrupt

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict):
        if self.corrupt is not None:
            self.corrupt(state_dict)
        self.inner.load_state_dict(state_dict)


def _set_entry(key, value):
    def corrupt(sd):
        sd[key] = value(sd[key]) if callable(value) else value

    return corrupt


def _drop_entry(key):
    def corrupt(sd):
        del sd[key]

    return corrupt


def _negative_second_moment(sd):
    from gefen_reference.dcp import restore

    dense = restore.dense_value(sd["slot_00000000.second_moment"])
    dense.view(-1)[0] = -1.0


def _nan_momentum(sd):
    from gefen_reference.dcp import restore

    dense = restore.dense_value(sd["slot_00000000.momentum"])
    dense.view(-1)[-1] = float("nan")


def _int_lr(optimizer):
    optimizer.param_groups[0]["lr"] = torch.tensor(0, dtype=torch.int64)


def _aliased_lr(optimizer):
    shared = torch.tensor(1e-3)
    optimizer.param_groups[0]["lr"] = shared
    optimizer.param_groups[1]["lr"] = shared


def _not_deterministic(optimizer):
    optimizer.deterministic = False


class _InjectedReblockFailure(RuntimeError):
    pass


def _failing_reblock(*args, **kwargs):
    raise _InjectedReblockFailure("injected re-blocking failure")


# (scenario, SPEC clause, corrupt the loaded dict, corrupt the live target, patch reblock, type, message part)
FAILURE_SCENARIOS = (
    ("missing_key", "3.3.1", _drop_entry("group_count"), None, False, "ValueError", "incomplete"),
    (
        "format_version",
        "3.3.2",
        _set_entry("format_version", torch.tensor(3)),
        None,
        False,
        "ValueError",
        "format version 3",
    ),
    (
        "identities",
        "3.3.5",
        _set_entry("param_identities", lambda ids: [dict(ids[0], name="other")] + ids[1:]),
        None,
        False,
        "ValueError",
        "parameter identities",
    ),
    (
        "hyper_not_finite",
        "3.5.1",
        _set_entry("param_group_hypers", lambda h: [dict(h[0], lr=float("nan")), h[1]]),
        None,
        False,
        "ValueError",
        "not finite",
    ),
    (
        "beta_out_of_range",
        "3.5.1",
        _set_entry("param_group_hypers", lambda h: [h[0], dict(h[1], beta1=1.0)]),
        None,
        False,
        "ValueError",
        "invalid beta1",
    ),
    ("deterministic", "3.3.7", None, _not_deterministic, False, "ValueError", "deterministic"),
    (
        "initialized_zero_step",
        "3.4.4",
        _set_entry("slot_00000000.step", torch.tensor(0)),
        None,
        False,
        "ValueError",
        "initialized but carries step=0",
    ),
    (
        "fresh_with_counters",
        "3.4.4",
        _set_entry("slot_00000003.vmean_step", torch.tensor(2)),
        None,
        False,
        "ValueError",
        "uninitialized but carries nonzero counters",
    ),
    ("negative_second_moment", "3.4.3", _negative_second_moment, None, False, "ValueError", "nonnegative"),
    ("non_finite_momentum", "3.4.3", _nan_momentum, None, False, "ValueError", "non-finite"),
    ("integral_lr_destination", "3.5.2", None, _int_lr, False, "ValueError", "would truncate"),
    ("aliased_lr_destination", "3.5.4", None, _aliased_lr, False, "ValueError", "aliased"),
    ("reblock", "3.6.4", None, None, True, "_InjectedReblockFailure", "injected re-blocking failure"),
)
FAILURE_IDS = tuple(s[0] for s in FAILURE_SCENARIOS)


def failing_loads(root: str, directory: str, failing_rank: int, scenario_ids=FAILURE_IDS) -> list:
    """Run each failure scenario through ``dcp.load`` with the damage on ``failing_rank`` only.

    The target is a reference Gefen trained one step of its own, so it has live
    state to protect. Returns ``(scenario, outcome, problems)`` per scenario, where
    outcome is ``(type, message, names of the type and its bases)`` or None, and problems lists how the live
    optimizer differs from before the load (empty when unchanged).
    """
    from gefen_reference.dcp import reblock

    mesh = world_mesh()
    results = []
    for scenario, _clause, corrupt_dict, corrupt_live, patch, _type, _part in FAILURE_SCENARIOS:
        if scenario not in scenario_ids:
            continue
        params = models.parameters(DCP_MODEL, mesh=mesh)
        optimizer = dcp_optimizer("reference", params, **DCP_TARGET_OPTIONS)
        models.train(DCP_MODEL, optimizer, params, [7])
        here = world.current().rank == failing_rank
        if here and corrupt_live is not None:
            corrupt_live(optimizer)
        signature = live_signature(optimizer)
        original = reblock.reblock
        if here and patch:
            reblock.reblock = _failing_reblock
        error = None
        try:
            dcp.load(
                {"optimizer": Corrupting(rdcp.GefenDCPState(optimizer), corrupt_dict if here else None)},
                checkpoint_id=os.path.join(root, directory),
                process_group=saving.group(),
            )
        except Exception as exc:  # the outcome is the result
            error = (type(exc).__name__, str(exc), tuple(c.__name__ for c in type(exc).__mro__))
        finally:
            reblock.reblock = original
        results.append((scenario, error, unchanged_since(optimizer, signature)))
    return results


# ------------------------------------------------------------- slot scalar agreement


def save_with_one_rank_fresh(root: str, fresh_rank: int):
    """Save after ``fresh_rank`` forgot its state for "enc.weight"; collective (SPEC 2.4.5).

    Both ranks hold rows of "enc.weight", so they disagree on its scalars.
    Returns ``(type, message)`` of the error, or None.
    """
    optimizer, params = dcp_trained()
    if world.current().rank == fresh_rank:
        optimizer.state[params["enc.weight"]] = {"name": "enc.weight"}
    try:
        saving.save(registry.resolve("reference"), optimizer, os.path.join(root, "disagree"))
    except Exception as exc:  # the outcome is the result
        return (type(exc).__name__, str(exc))
    return None

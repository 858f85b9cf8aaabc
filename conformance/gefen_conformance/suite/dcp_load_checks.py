"""Checks of the rules a DCP load states, one example at a time (SPEC 3.1-3.7), in one process: the
suite's tests call them with the implementation under test, and the project's rule mutants prove
each can fail. A check raises AssertionError whose message starts with the rule id and the example
(``SPEC 3.3.4 (one-group-more): ...``); it returns None when the rule holds.

The checks are exact in every numeric profile, except the re-saved dense state, which SPEC 5.6.14
judges by the same rules in both (and SPEC 3.8.2 bit for bit the reference's, for an implementation
that claims ``cpu-bit-exact``): a refusal is the error the rule names and changes nothing; a
restore re-saved at once holds the checkpoint's header, identities, hyperparameters and counters
(:func:`gefen_conformance.suite.restore_checks.resaved_state`). The examples are in
:mod:`gefen_conformance.suite.dcp_load_examples`.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from gefen_conformance.harness.sharding import WorldOfOne, world_mesh
from gefen_conformance.implementations import registry
from gefen_conformance.implementations.contract import CPU_BIT_EXACT
from gefen_conformance.suite import hostile, restore_checks
from gefen_conformance.suite.dcp_load_examples import (
    LIVE,
    LIVE_STEPS,
    MODEL,
    SAVED_STEPS,
    DcpLoadRefused,
    DcpRestored,
)
from gefen_conformance.workload import saving
from gefen_oracles import checkpoint_compare
from gefen_oracles.checkpoint_reader import read_nested


def _fail(example, problem: str) -> None:
    raise AssertionError(f"SPEC {example.rule} ({example.what}): {problem}")


@functools.lru_cache(maxsize=1)
def reference_checkpoint(one_rank: WorldOfOne) -> tuple:
    """``(path, optimizer dict)``: the reference's checkpoint of :data:`MODEL` trained
    :data:`SAVED_STEPS`, written once per World, and its optimizer dict as the oracle reads it."""
    reference = registry.resolve("reference")
    _, opt = saving.trained(reference, MODEL, world_mesh(), steps=SAVED_STEPS)
    path = one_rank.path()
    saving.save(reference, opt, path, planner=False)
    return path, read_nested(path)["optimizer"]


def _live(impl, example):
    """``(params, optimizer)`` of ``impl`` trained on :data:`LIVE_STEPS`, with the example's live
    destinations."""
    params, opt = saving.trained(impl, LIVE, world_mesh(), steps=LIVE_STEPS)
    if example.live is not None:
        example.live(opt)
    return params, opt


def _given(saved: dict, example, params: dict) -> dict:
    """A deep copy of the checkpoint dict with the example's change, its dense shards on the
    parameters' device (where ``dcp.load`` would hand them over)."""
    checkpoint = copy.deepcopy(saved)
    if example.change is not None:
        example.change(checkpoint)
    device = next(iter(params.values())).device
    for key, value in checkpoint.items():
        if key.endswith((".momentum", ".second_moment")) and torch.is_tensor(value):
            checkpoint[key] = value.to(device)
    return checkpoint


def _tensor_destinations(opt) -> list:
    return [(g, k, v) for g in opt.param_groups for k, v in g.items() if k != "params" and torch.is_tensor(v)]


def check(impl, example: DcpLoadRefused | DcpRestored, one_rank: WorldOfOne) -> None:
    """:func:`check_refused` or :func:`check_restored`, by the example's kind. An example of SPEC
    3.8.2 is skipped for an implementation without ``cpu-bit-exact``: its restore is judged by SPEC
    5.6.11 (the re-save of every other restored example, and the reshards)."""
    if getattr(example, "like_reference", False) and not impl.has(CPU_BIT_EXACT):
        pytest.skip(
            f"SPEC {example.rule} binds the torch-exact profile: {impl.name} does not claim "
            f"{CPU_BIT_EXACT}, and its restores are judged by SPEC 5.6.11"
        )
    if isinstance(example, DcpLoadRefused):
        check_refused(impl, example, one_rank)
    else:
        check_restored(impl, example, one_rank)


def check_refused(impl, example: DcpLoadRefused, one_rank: WorldOfOne) -> None:
    """The changed checkpoint given to ``load_state_dict()`` is refused with the example's error
    naming its words, and the live optimizer (state, groups, tensor identities and versions, model
    parameters) is as it was (SPEC 3.2.2, 3.2.5)."""
    _, saved = reference_checkpoint(one_rank)
    params, opt = _live(impl, example)
    checkpoint = _given(saved, example, params)
    before = hostile.snapshot(params, opt)
    try:
        impl.dcp_state(opt).load_state_dict(checkpoint)
    except Exception as exc:  # what was raised is the finding
        if not isinstance(exc, example.error):
            _fail(example, f"raised {type(exc).__name__}: {exc}; expected {example.error.__name__}")
        if example.words is not None and example.words not in str(exc):
            _fail(example, f"the {example.error.__name__} does not name {example.words!r}: {exc}")
    else:
        _fail(example, f"loaded; expected {example.error.__name__} naming {example.words!r}")
    if not hostile.same(before, hostile.snapshot(params, opt)):
        _fail(example, "the refused load changed the live optimizer (SPEC 3.2.5)")


def check_restored(impl, example: DcpRestored, one_rank: WorldOfOne) -> None:
    """The checkpoint restored (``dcp.load`` or a direct ``load_state_dict()`` of its changed dict):
    every tensor destination of a group kept (filled in place), and the state re-saved at once
    found by :func:`restore_checks.resaved_state` to hold the checkpoint's content."""
    path, saved = reference_checkpoint(one_rank)
    params, opt = _live(impl, example)
    destinations = _tensor_destinations(opt)
    try:
        if example.through_dcp:
            saving.load(impl, opt, path)
        else:
            impl.dcp_state(opt).load_state_dict(_given(saved, example, params))
    except Exception as exc:  # a refusal is the finding
        _fail(example, f"refused with {type(exc).__name__}: {exc}")
    replaced = [k for g, k, v in destinations if g[k] is not v]
    if replaced:
        _fail(example, f"tensor destinations {replaced} replaced instead of filled in place (SPEC 3.5.5)")
    again = one_rank.path()
    try:
        saving.save(impl, opt, again, planner=False)
    except Exception as exc:  # the restored state must save again
        _fail(example, f"re-saving the restored state raised {type(exc).__name__}: {exc}")
    resaved = read_nested(again)["optimizer"]
    found = restore_checks.resaved_state(saved, resaved, 1)
    if found.problems:
        _fail(example, "the state re-saved after the restore: " + "; ".join(found.problems[:5]))
    if example.like_reference:
        expected = _restored_and_resaved_by_the_reference(example, path, one_rank)
        compared = checkpoint_compare.compare_restores(expected, resaved, bitwise=True)
        if compared.problems:
            _fail(
                example, "the re-saved restore against the reference's: " + "; ".join(compared.problems[:5])
            )


def _restored_and_resaved_by_the_reference(example, path: str, one_rank: WorldOfOne) -> dict:
    """The optimizer dict the reference re-saves after restoring ``path`` into its own live optimizer."""
    reference = registry.resolve("reference")
    _, opt = _live(reference, example)
    saving.load(reference, opt, path)
    again = one_rank.path()
    saving.save(reference, opt, again, planner=False)
    return read_nested(again)["optimizer"]


__all__ = ["check", "check_refused", "check_restored", "reference_checkpoint"]

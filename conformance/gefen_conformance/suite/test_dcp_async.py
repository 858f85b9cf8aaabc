"""Asynchronous save (SPEC 4.3.7, 2.6) on 2 ranks: of a small model with a step before the
background write starts, and of large slots (over 64Ki elements) with steps taken while it runs.

``dcp.async_save`` with ``impl.async_writer(path)``; an optimizer step is taken after the call
returns and before the background write may start (the writer is held until then). The
checkpoint must hold the state as of the call: its content digests equal those of a synchronous
save taken just before that step (the payload layout may differ, SPEC 2.6.1). Both are saves of one
state by one implementation, so the comparison is exact in both numeric profiles (SPEC 5.6.11). With DCP's
default
``FileSystemWriter``, which cannot snapshot the adapter's deferred slots, the save is refused
before any byte is written (SPEC 2.6.2).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

import pytest
import torch.distributed.checkpoint as dcp

from gefen_conformance.harness import deadlines, world
from gefen_conformance.harness.sharding import shard_like, world_mesh
from gefen_conformance.implementations.contract import DCP_ASYNC_SAVE, DCP_RESHARD, Implementation
from gefen_conformance.suite import checkpoints
from gefen_conformance.workload import models, saving
from gefen_oracles.digests import content_digests

WORLD = 2
GATE_S = 30.0  # how long the held writer waits for the step before giving up
#: Large slots (over 64Ki elements each: the adapter's chunked re-blocking and the writer's item
#: sizes both change there) and a small one, two groups; every one gets structured gradients.
LARGE = models.Model(
    shapes={"emb.weight": (512, 384), "proj.weight": (256, 320), "norm.weight": (96,)},
    groups=(("emb.weight", "norm.weight"), ("proj.weight",)),
    init=models.per_name,
    salt="init",
    seed=models.crc32_seed("{name}:large{step}"),
    hypers=models.GROUP_HYPERS,
    structured=frozenset({"emb.weight", "proj.weight"}),
)
#: Steps the optimizer takes while the background write is under way.
STEPS_DURING_WRITE = 2


def _wait(response):
    """The async save's result, waited for within the scenario's bound on the load clock (SPEC 4.2.10)."""
    future = getattr(response, "upload_completion", response)

    def finished(seconds: float) -> bool:
        try:
            future.result(timeout=seconds)  # the save's own error propagates
        except (TimeoutError, concurrent.futures.TimeoutError):
            return False
        return True

    if not deadlines.wait_until(finished, checkpoints.TIMEOUT):
        raise TimeoutError(f"the async save did not complete within {checkpoints.TIMEOUT:g} s")
    return future.result()


def _async_save_while(impl: Implementation, optimizer, writer, steps, release: threading.Event) -> None:
    """``dcp.async_save`` of the adapter's state through ``writer``, with the implementation's
    planner (when it has one), on the scenario's group; then ``steps()`` while the writer holds
    the background write, ``release`` set when they are done (or raised) so that the write goes
    on, and the save waited for."""
    planner = impl.save_planner() if impl.save_planner is not None else None
    response = dcp.async_save(
        {"optimizer": impl.dcp_state(optimizer)},
        storage_writer=writer,
        planner=planner,
        process_group=world.current().group,
    )
    try:
        steps()
    finally:
        release.set()
    _wait(response)


def async_snapshot(impl: Implementation, root: str) -> dict:
    """Rank body (SPEC 2.6.1): a synchronous save, then ``dcp.async_save`` with
    ``impl.async_writer``, an optimizer step before the background write may start, the wait, and
    a synchronous save after the step (collective). The background write is held until the step
    is done."""
    model = models.BASE
    params, optimizer = saving.trained(impl, model, world_mesh())
    saving.save(impl, optimizer, os.path.join(root, "sync_before"))
    writer = impl.async_writer(os.path.join(root, "async"))
    gate = threading.Event()
    write_data = writer.write_data
    gated = []

    def gated_write_data(plan, planner):
        gated.append(gate.is_set())
        if not deadlines.wait_until(gate.wait, GATE_S):
            raise RuntimeError("the test never opened the gate")
        return write_data(plan, planner)

    writer.write_data = gated_write_data
    # The next gradients are sharded now: sharding is a collective, and the background save runs
    # its own collectives on the scenario's group while the step is taken.
    models.set_gradients(model, params, models.DCP_STEPS + 1)
    _async_save_while(impl, optimizer, writer, optimizer.step, gate)
    saving.save(impl, optimizer, os.path.join(root, "sync_after"))
    return {"write_data_calls": len(gated)}


def async_snapshot_while_stepping(impl: Implementation, root: str) -> dict:
    """Rank body (SPEC 2.6.1) at scale: large slots, a synchronous save, then ``dcp.async_save``
    whose background write is held after its first item until the optimizer has taken
    ``STEPS_DURING_WRITE`` steps (so they run while the write is under way), and a synchronous
    save after those steps (collective)."""
    params, optimizer = saving.trained(impl, LARGE, world_mesh())
    saving.save(impl, optimizer, os.path.join(root, "sync_before"))
    writer = impl.async_writer(os.path.join(root, "async"))
    writing, stepped = threading.Event(), threading.Event()
    write_data = writer.write_data
    resolved = []

    def write_data_while_stepping(plan, planner):
        resolve_data = planner.resolve_data

        def resolve_one(item):
            resolved.append(item)
            if len(resolved) == 2:  # one item is out: the steps run now, the rest after them
                writing.set()
                if not deadlines.wait_until(stepped.wait, GATE_S):
                    raise RuntimeError("the steps during the write never finished")
            return resolve_data(item)

        planner.resolve_data = resolve_one
        return write_data(plan, planner)

    writer.write_data = write_data_while_stepping
    grads = [models.DCP_STEPS + k for k in range(1, STEPS_DURING_WRITE + 1)]

    def steps_during_the_write():
        if not deadlines.wait_until(writing.wait, GATE_S):
            raise RuntimeError("the background write never started")
        for step in grads:
            # each gradient is set on this thread: no collective runs beside the background write's
            for name, p in params.items():
                g = models.gradient(LARGE, name, step, dtype=p.dtype)
                p.grad = None if g is None else shard_like(g, p)
            optimizer.step()

    _async_save_while(impl, optimizer, writer, steps_during_the_write, stepped)
    saving.save(impl, optimizer, os.path.join(root, "sync_after"))
    return {"items_resolved": len(resolved)}


def async_with_default_writer(impl: Implementation, path: str):
    """Rank body (SPEC 2.6.2): ``dcp.async_save`` of the adapter with DCP's default
    ``FileSystemWriter``; the error on this rank (None if it was accepted)."""
    _, optimizer = saving.trained(impl, models.BASE, world_mesh())
    try:
        _wait(
            dcp.async_save(
                {"optimizer": impl.dcp_state(optimizer)},
                storage_writer=dcp.FileSystemWriter(path),
                process_group=world.current().group,
            )
        )
    except Exception as exc:  # the outcome is the result
        return checkpoints.RaisedError.of(exc)
    return None


def _held_the_state_at_the_call(judge, root, what: str) -> list:
    """The async checkpoint under ``root`` against the synchronous save at the call, by content
    digest (exact in both profiles: one state of one implementation, SPEC 5.6.11); returns the keys
    the steps after the call changed (the synchronous save after them)."""
    before, landed, after = (content_digests(root / d) for d in ("sync_before", "async", "sync_after"))
    assert set(landed) == set(before), sorted(set(landed) ^ set(before))
    differs = sorted(k for k in before if landed[k] != before[k])
    problem = f"the async checkpoint differs from the state at the call in {differs}"
    judge.assert_exact(what, len(differs), len(before), [problem])
    return [k for k in before if after.get(k) != before[k]]


@pytest.mark.gefen_clause("4.3.7", "2.6.1", "5.2.3")
@pytest.mark.gefen_requires(DCP_RESHARD, DCP_ASYNC_SAVE)
def test_async_checkpoint_holds_the_state_as_of_the_call(gefen_impl, gefen_checkpoints, gefen_judge):
    root = gefen_checkpoints.scratch("async")
    reports = checkpoints.run(async_snapshot, WORLD, (gefen_impl, str(root)))
    assert all(r["write_data_calls"] == 1 for r in reports), f"the held writer was not used: {reports}"
    what = "async save against a synchronous save at the call (content digests)"
    moved = _held_the_state_at_the_call(gefen_judge, root, what)
    # the step after the call did change the state, so the comparison above can tell
    assert "optimizer.global_step" in moved and any(k.endswith(".momentum") for k in moved), moved


@pytest.mark.gefen_clause("4.3.7", "2.6.1", "5.2.3")
@pytest.mark.gefen_requires(DCP_RESHARD, DCP_ASYNC_SAVE)
def test_async_checkpoint_of_large_slots_holds_the_state_while_steps_run(
    gefen_impl, gefen_checkpoints, gefen_judge
):
    """Slots over 64Ki elements, and optimizer steps taken while the background write is under way:
    the checkpoint holds the state as of the call, exactly (one state of one implementation)."""
    root = gefen_checkpoints.scratch("async-large")
    reports = checkpoints.run(
        async_snapshot_while_stepping, WORLD, (gefen_impl, str(root)), timeout=3 * checkpoints.TIMEOUT
    )
    assert all(r["items_resolved"] > 2 for r in reports), f"the write did not outlast the steps: {reports}"
    what = (
        "async save of large slots while stepping, against a synchronous save at the call (content digests)"
    )
    moved = _held_the_state_at_the_call(gefen_judge, root, what)  # and the keys the steps changed
    assert "optimizer.global_step" in moved and sum(k.endswith(".momentum") for k in moved) == 3, moved


@pytest.mark.gefen_clause("4.3.7", "2.6.2")
@pytest.mark.gefen_requires(DCP_RESHARD, DCP_ASYNC_SAVE)
def test_async_save_with_the_default_writer_is_refused_before_writing(gefen_impl, gefen_checkpoints):
    path = gefen_checkpoints.scratch("async-default-writer") / "checkpoint"
    errors = checkpoints.run(async_with_default_writer, WORLD, (gefen_impl, str(path)))
    for rank, error in enumerate(errors):
        assert error is not None, f"rank {rank}: async_save with the default writer succeeded"
        assert error.is_a(RuntimeError) and "GefenFileSystemWriter" in error.message, (rank, error)
        assert "GefenSavePlanner" not in error.message, (rank, error)
    written = sorted(p.name for p in path.iterdir()) if path.exists() else []
    assert written == [], written

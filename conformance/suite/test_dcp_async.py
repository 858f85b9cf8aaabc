"""Asynchronous save (SPEC 4.3.7, 2.6) on 2 ranks.

``dcp.async_save`` with ``impl.async_writer(path)``; an optimizer step is taken after the call
returns and before the background write may start (the writer is held until then). The
checkpoint must hold the state as of the call: its content digests equal those of a synchronous
save taken just before that step (the payload layout may differ, SPEC 2.6.1). Both are saves of one
state by one implementation, so the comparison is exact in both numeric profiles (SPEC 5.6.11). With DCP's default
``FileSystemWriter``, which cannot snapshot the adapter's deferred slots, the save is refused
before any byte is written (SPEC 2.6.2).
"""

from __future__ import annotations

import pytest

from conformance.implementation import DCP_ASYNC_SAVE, DCP_RESHARD
from conformance.ranks import run_on_ranks
from oracles.digests import content_digests

from . import dcp_checks, dcp_ranks, margins

WORLD = 2


@pytest.mark.clause("4.3.7", "2.6.1", "5.2.3")
@pytest.mark.requires(DCP_RESHARD, DCP_ASYNC_SAVE)
def test_async_checkpoint_holds_the_state_as_of_the_call(request, saved):
    root = saved.scratch("async")
    reports = run_on_ranks(dcp_ranks.async_snapshot, WORLD, args=(request.config.getoption("--impl"), str(root)),
                           timeout=dcp_checks.TIMEOUT)
    assert all(r["write_data_calls"] == 1 for r in reports), f"the held writer was not used: {reports}"
    before, landed, after = (content_digests(root / d) for d in ("sync_before", "async", "sync_after"))
    assert set(landed) == set(before), sorted(set(landed) ^ set(before))
    differs = sorted(k for k in before if landed[k] != before[k])
    margins.exact("async save against a synchronous save at the call (content digests)", len(differs), len(before))
    assert not differs, f"the async checkpoint differs from the state at the call in {differs}"
    # the step after the call did change the state, so the comparison above can tell
    moved = [k for k in before if after.get(k) != before[k]]
    assert "optimizer.global_step" in moved and any(k.endswith(".momentum") for k in moved), moved


@pytest.mark.clause("4.3.7", "2.6.2")
@pytest.mark.requires(DCP_RESHARD, DCP_ASYNC_SAVE)
def test_async_save_with_the_default_writer_is_refused_before_writing(request, saved):
    path = saved.scratch("async-default-writer") / "checkpoint"
    errors = run_on_ranks(dcp_ranks.async_with_default_writer, WORLD, args=(request.config.getoption("--impl"), str(path)),
                          timeout=dcp_checks.TIMEOUT)
    for rank, error in enumerate(errors):
        assert error is not None, f"rank {rank}: async_save with the default writer succeeded"
        assert "RuntimeError" in error["mro"] and "GefenFileSystemWriter" in error["message"], (rank, error)
        assert "GefenSavePlanner" not in error["message"], (rank, error)
    written = sorted(p.name for p in path.iterdir()) if path.exists() else []
    assert written == [], written

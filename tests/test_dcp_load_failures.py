"""Fail-atomic, collective loads of the reference DCP adapter (SPEC 3.2-3.6).

Each scenario damages the loaded dict, the live target or the re-blocking on one
rank, loads through ``dcp.load`` and checks that every rank raised -- the
failing rank its own error, the others the abort error -- and that no rank's
optimizer changed (state, state and group objects, hyperparameter values and
tensor identities, codebook, global step, deterministic flag).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from gefen_reference.dcp import agreement
from tests import _dcp_load_ranks as L

pytest.importorskip("gefen")
from gefen_conformance.harness import launch  # noqa: E402
from tests.support import DCP_SAVE_STEPS, checkpoint_files, world_of_one  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

BY_ID = {s[0]: s for s in L.FAILURE_SCENARIOS}


@pytest.fixture(scope="module")
def world1(tmp_path_factory):
    """An in-process gloo group of one rank and a one-rank reference checkpoint."""
    with world_of_one():
        root = str(tmp_path_factory.mktemp("dcp-load-fail-w1"))
        L.save_checkpoints(root, [("ref_w1", "reference", True)])
        yield root


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dcp-load-fail-w2"))
    launch.run(L.save_checkpoints, 2, args=(root, [("ref_w2", "reference", True)]), timeout=120)
    return root


def _assert_own_error(scenario_id, outcome):
    _, clause, _, _, _, error_type, part = BY_ID[scenario_id]
    assert outcome is not None, f"{scenario_id} (SPEC {clause}): the load succeeded"
    assert error_type in outcome[2] and part in outcome[1], (scenario_id, clause, outcome)


@pytest.mark.parametrize("scenario", L.FAILURE_IDS)
def test_rejected_load_at_world_one_changes_nothing(world1, scenario):
    """SPEC 3.2.2, 3.2.5 with the clause of each scenario (3.3-3.6): the load raises the scenario's
    error and the live optimizer is exactly as before."""
    [(got, outcome, problems)] = L.failing_loads(world1, "ref_w1", 0, (scenario,))
    assert got == scenario
    _assert_own_error(scenario, outcome)
    assert problems == [], problems


@pytest.mark.parametrize("failing_rank", [0, 1])
def test_one_rank_failure_aborts_every_rank_before_commit(two_rank_checkpoint, failing_rank):
    """SPEC 3.2.3, 3.2.5: with the damage on one rank of two, that rank raises its own error, the
    other raises the abort error naming another rank, and neither rank's optimizer changed."""
    results = launch.run(L.failing_loads, 2, args=(two_rank_checkpoint, "ref_w2", failing_rank), timeout=90)
    for rank, per_rank in enumerate(results):
        assert [r[0] for r in per_rank] == list(L.FAILURE_IDS)
        for scenario, outcome, problems in per_rank:
            assert problems == [], (rank, scenario, problems)
            if rank == failing_rank:
                _assert_own_error(scenario, outcome)
            else:
                assert outcome[:2] == ("RuntimeError", agreement.LOAD_ABORT_MESSAGE), (
                    rank,
                    scenario,
                    outcome,
                )
                assert "another rank" in outcome[1]


def test_healthy_load_after_aborted_ones_commits(two_rank_checkpoint):
    """SPEC 3.2.5: the same checkpoint restores once nothing is damaged (the failures above are
    caused by the damage, not by the checkpoint)."""
    reports = launch.run(L.restore_and_continue, 2, args=(two_rank_checkpoint, ["ref_w2"]), timeout=90)
    for report in reports:
        assert report["restored"]["ref_w2"]["global_step"] == DCP_SAVE_STEPS


@pytest.mark.parametrize("fresh_rank", [0, 1])
def test_save_refuses_ranks_that_disagree_on_a_slot(tmp_path, fresh_rank):
    """SPEC 2.4.5: ranks that both hold rows of a parameter but disagree on its (initialized, step,
    vmean_step) make every rank raise the same error, and nothing is written."""
    outcomes = launch.run(L.save_with_one_rank_fresh, 2, args=(str(tmp_path), fresh_rank), timeout=60)
    assert outcomes[0] == outcomes[1]
    kind, message = outcomes[0]
    assert kind == "RuntimeError" and "slot 0 disagree" in message, message
    assert checkpoint_files(str(tmp_path / "disagree")) == []

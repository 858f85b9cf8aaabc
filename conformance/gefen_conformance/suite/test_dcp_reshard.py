"""Resharding: save on N ranks, restore on M (SPEC 4.3.2, Part 3).

Each path trains the implementation on ``gefen_conformance.workload.models.BASE`` (or ``EMPTY``,
``MANY``) at N ranks and saves model and optimizer; at M ranks a fresh optimizer (other
hyperparameters, other parameter values) is restored with ``dcp.load``, its state saved again at
once, and one step taken (:meth:`gefen_conformance.suite.checkpoints.Checkpoints.restored`). Each
checkpoint and each restore is made once per session and judged by both tests. Two tests per
path:

* the restore: model parameters exact, and one continuation step within 5e-3 max-abs of a
  native run of the same implementation at M ranks on the same gradients (SPEC 3.7.3);
* the restored state, saved again at once with the implementation's adapter and read back with
  the independent reader: global step, per-slot counters, identities and hyperparameters exact,
  both checkpoints schema-clean, dense momentum and second moment within the bounds documented
  in ``checkpoints`` (SPEC 3.7.1, 3.7.2).

``dec.weight`` (7 rows) splits unevenly on every path; ``empty`` adds a 2-row parameter whose
shard is empty on ranks 2-3 of 4 (on the target of 2->4, on the source of 4->2); ``many``
(``gefen_conformance.workload.models.MANY``) holds 14 slots, each with its own gradient scale
(1e-4 to 1e2) and shape, split unevenly on 2, 3 and 4 ranks.
"""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite import restore_checks

PATHS = [
    *(pytest.param("base", n, m, id=f"{n}->{m}") for n, m in ((2, 4), (4, 2), (2, 1), (1, 2), (3, 2))),
    pytest.param(
        "empty", 2, 4, id="2->4-empty-target-shards", marks=pytest.mark.gefen_clause("3.4.5", "3.6.3")
    ),
    pytest.param(
        "empty", 4, 2, id="4->2-empty-source-shards", marks=pytest.mark.gefen_clause("2.4.5", "3.4.4")
    ),
    pytest.param("many", 4, 3, id="4->3-many-slots", marks=pytest.mark.gefen_clause("3.6.3", "3.6.4")),
]


def _every_path(test):
    """Needs DCP; once per path of :data:`PATHS`."""
    for mark in (
        pytest.mark.parametrize("model,source,target", PATHS),
        pytest.mark.gefen_requires(DCP_RESHARD),
    ):
        test = mark(test)
    return test


@pytest.mark.gefen_clause("4.3.2", "3.1.2", "3.7.1", "3.7.3", "5.3.3")
@_every_path
def test_reshard_restores_model_and_continues_within_bound(
    gefen_impl, gefen_checkpoints, gefen_judge, model, source, target
):
    saved = gefen_checkpoints.trained_and_saved(gefen_impl, model, ranks=source)
    restore = gefen_checkpoints.restored(saved, by=gefen_impl, ranks=target)
    compared = restore_checks.restored(restore)  # the model exact, the next step within its bound
    gefen_judge.assert_comparisons(compared, inputs=restore.describe())


@pytest.mark.gefen_clause("4.3.2", "3.6.4", "3.6.5", "3.7.1", "3.7.2", "2.1", "5.1.3", "5.6.14")
@_every_path
def test_reshard_resaved_state_is_consistent(
    gefen_impl, gefen_checkpoints, gefen_judge, model, source, target
):
    saved = gefen_checkpoints.trained_and_saved(gefen_impl, model, ranks=source)
    restore = gefen_checkpoints.restored(saved, by=gefen_impl, ranks=target)
    compared = restore_checks.resaved(restore)  # the re-save against the checkpoint it restored
    gefen_judge.assert_comparisons(compared, inputs=restore.describe())

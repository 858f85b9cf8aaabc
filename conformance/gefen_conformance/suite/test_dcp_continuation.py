"""DCP restores of a bf16 model with a slot above 64Ki elements into optimizers that have already
stepped, across world sizes, each followed by several steps (SPEC 4.3.11 items 3 and 5, 3.6, 3.7,
2.3.6 item 4, 5.6.11, 5.6.22).

Each test runs both sides (:func:`gefen_conformance.suite.continuation.run_both`, each step made
once per session): the reference trains :data:`gefen_conformance.workload.models.WIDE` in bf16 on
two ranks and saves it; on the target world size the implementation, then the reference, each build an
optimizer over other parameter values with other hyperparameters, step it twice on another
gradient stream, the large slot joining at the second (its codebook, counters and anything derived
from them are then stale), restore the checkpoint with ``dcp.load`` (model and optimizer), re-save
at once, and take three steps on the checkpoint's gradient stream, re-saving after each; then the
two runs are compared. Everything is read back by the independent reader (SPEC 5.1). Two more
paths (:data:`gefen_conformance.suite.continuation.VARIANTS`): a target built with the
force-period-one options, whose restore must re-derive periods by its own rules (SPEC 3.6.2), and a
checkpoint saved before any step, whose restore leaves no codebook, so that the next step learns
one from the gradients (SPEC 3.6.3; under the tolerance profile judged by the codewords in use,
SPEC 5.6.23).

* the restore: model parameters exact; the implementation's re-save against the reference's re-save
  of the same restore (bitwise under ``cpu-bit-exact``, SPEC 3.8.2; otherwise SPEC 5.6.11);
* the continuation: the header, identities, hyperparameters and every slot's counters of each
  re-save equal the reference's (both profiles); under ``cpu-bit-exact`` every re-save and the
  model bit for bit; otherwise each step judged from the implementation's own re-saved state before
  it (SPEC 5.6.22: the pinned step's bounds on the dense form, the periods the reference's rule
  gives for the restored shards).
"""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite import continuation
from gefen_conformance.suite.continuation import DTYPES, Target

PATHS = [
    pytest.param(Target("stepped", 1), id="2->1"),
    pytest.param(Target("stepped", 3), id="2->3"),
    pytest.param(
        Target("forced-periods", 3),
        id="2->3-forced-periods",
        marks=pytest.mark.gefen_clause("3.6.2", "1.5.1"),
    ),
    pytest.param(
        Target("never-stepped", 1), id="2->1-never-stepped", marks=pytest.mark.gefen_clause("3.6.3", "5.6.23")
    ),
]


def _every_restore(test):
    """Needs DCP; once per restore path and dtype."""
    for mark in (
        pytest.mark.parametrize("dtype", list(DTYPES)),
        pytest.mark.parametrize("target", PATHS),
        pytest.mark.gefen_requires(DCP_RESHARD),
    ):
        test = mark(test)
    return test


@pytest.mark.gefen_clause("4.3.11", "3.6.4", "3.7.1", "2.3.6", "1.12.12", "5.6.11")
@_every_restore
def test_restore_into_a_stepped_optimizer(
    gefen_impl, gefen_reference, gefen_checkpoints, gefen_judge, dtype, target
):
    reference, impl = continuation.run_both(
        gefen_checkpoints, gefen_reference, gefen_impl, dtype=dtype, target=target
    )
    compared = continuation.restore_comparisons(gefen_checkpoints, reference, impl, gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=impl.describe())


@pytest.mark.gefen_clause("4.3.11", "3.6.5", "3.7.1", "2.3.6", "1.12.12", "5.6.22")
@_every_restore
def test_steps_after_the_restore(gefen_impl, gefen_reference, gefen_checkpoints, gefen_judge, dtype, target):
    reference, impl = continuation.run_both(
        gefen_checkpoints, gefen_reference, gefen_impl, dtype=dtype, target=target
    )
    compared = continuation.steps_comparisons(gefen_checkpoints, reference, impl, gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=impl.describe())

"""Cross-implementation loads: saved by the implementation and restored by the reference, and the
reverse (SPEC 4.3.6, 3.8.1), across world sizes.

The restoring side is checked exactly as a reshard (``checkpoints``): model parameters exact, one
continuation step within 5e-3 of a native run of the restoring implementation at the target
world size, and the restored state saved again by the restoring side consistent with the
checkpoint it restored. The model has no empty shards on 4 ranks (SPEC 2.4.5 is covered by the
reshard module).

A restore's arithmetic is nearly exact (SPEC 3.6), so a reference checkpoint restored by the
implementation and re-saved at once is also compared with the reference's own restore and re-save
of it: bitwise under ``cpu-bit-exact`` (SPEC 3.8.2), otherwise by SPEC 5.6.11.
"""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite import restore_checks


@pytest.mark.gefen_clause("4.3.6", "3.8.1", "3.7.1", "3.7.3")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("source,target", [(2, 4), (4, 2)], ids=["2->4", "4->2"])
@pytest.mark.parametrize("direction", ["impl-to-reference", "reference-to-impl"])
def test_cross_implementation_restore(
    gefen_impl, gefen_reference, gefen_checkpoints, gefen_judge, direction, source, target
):
    saver, loader = (
        (gefen_impl, gefen_reference) if direction == "impl-to-reference" else (gefen_reference, gefen_impl)
    )
    saved = gefen_checkpoints.trained_and_saved(saver, "base", ranks=source)
    restore = gefen_checkpoints.restored(saved, by=loader, ranks=target)
    # the re-saved state is the loader's, judged against its own input (SPEC 5.6.14)
    compared = restore_checks.restored_and_resaved(restore)
    gefen_judge.assert_comparisons(compared, inputs=restore.describe())


@pytest.mark.gefen_clause("4.3.6", "3.6.4", "2.1.6", "3.8.2", "5.6.11")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("source,target", [(2, 4), (4, 2)], ids=["2->4", "4->2"])
def test_restore_and_resave_match_the_reference(
    gefen_impl, gefen_reference, gefen_checkpoints, gefen_judge, source, target
):
    saved = gefen_checkpoints.trained_and_saved(gefen_reference, "base", ranks=source)
    reference = gefen_checkpoints.restored(saved, by=gefen_reference, ranks=target)
    impl = gefen_checkpoints.restored(saved, by=gefen_impl, ranks=target)
    compared = restore_checks.restores_agree(reference, impl, gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=impl.describe())

"""Resharding at scale: save on tens of ranks, restore on another count (SPEC 4.3.2, Part 3).

The paths of ``test_dcp_reshard`` at the sizes users run: 64 -> 7 (sizes with no common factor;
every shard of the 7-rank world spans about nine of the 64), each rank a thread of one process
(the thread launcher, ``gefen_conformance.harness.threads``; an implementation that is not
thread-safe runs on the active launcher instead, where it fits).
The model is ``gefen_conformance.workload.models.SCALE``: every parameter of ``BASE`` has fewer
rows than 48 or 64 ranks, so most ranks hold empty shards of every parameter on both sides, and
``wide.weight`` (211 rows) divides by none of the worlds. Each checkpoint and restore is made once
per session and judged by the tests below, with the checks of the reshard tests
(:mod:`gefen_conformance.suite.restore_checks`):

* the restore: model parameters exact, one continuation step within its bound of a native run
  of the same implementation at the target size on the same gradients (SPEC 3.7.3);
* the restored state saved again at once, read back by the independent reader: counters,
  identities and hyperparameters exact, dense state within the bounds of ``checkpoints``
  (SPEC 3.7.1, 3.7.2);
* the saved checkpoint against the reference's, trained on the same gradients at the same size:
  the payload md5 of every ``.distcp`` file and the metadata digest under ``cpu-bit-exact``
  (SPEC 4.3.4, 5.2), the content by the rules of SPEC 5.6.11 in either profile (the reference's
  codebooks at this size are not recorded: the momentum bound takes the whole codeword range).

The same paths at 64 -> 48, 7 -> 64, 48 -> 64 and 256 -> 100 ranks run in the project's slow
tests (``tests/test_dcp_scale.py``).
"""

from __future__ import annotations

import pytest
import torch

from gefen_conformance.implementations import registry
from gefen_conformance.implementations.contract import CPU_BIT_EXACT, DCP_RESHARD
from gefen_conformance.suite import restore_checks
from gefen_oracles import checkpoint_compare
from gefen_oracles.checkpoint_reader import read_nested
from gefen_oracles.digests import metadata_digest, payload_md5s

MODEL = "scale"
#: source and target worlds. 64 -> 48, 7 -> 64, 48 -> 64 and 256 -> 100 run in the project's slow
#: tests (``tests/test_dcp_scale.py``): every thread rank costs its share of one core, and a save
#: or restore on 48 or 64 ranks takes about ten seconds of a 2-core machine
PATHS = [pytest.param(n, m, id=f"{n}->{m}") for n, m in ((64, 7),)]
SOURCES = [pytest.param(n, id=f"w{n}") for n in (64, 7)]
#: every path has empty shards on both sides: slot scalars agree (2.4.5), a source's empty shards
#: restore (3.4.4), a target's empty shards restore (3.4.5, 3.6.3), as the reshard tests name them
EMPTY_SHARDS = ("2.4.5", "3.4.4", "3.4.5", "3.6.3")


def _every_path(test):
    """Needs DCP; once per path of :data:`PATHS`."""
    for mark in (pytest.mark.parametrize("source,target", PATHS), pytest.mark.gefen_requires(DCP_RESHARD)):
        test = mark(test)
    return test


def _restore(checkpoints, impl, source: int, target: int):
    saved = checkpoints.trained_and_saved(impl, MODEL, ranks=source, at_scale=True)
    return checkpoints.restored(saved, by=impl, ranks=target, at_scale=True)


@pytest.mark.gefen_clause("4.3.2", "3.1.2", "3.7.1", "3.7.3", "5.3.3", *EMPTY_SHARDS)
@_every_path
def test_reshard_at_scale_restores_model_and_continues_within_bound(
    gefen_impl, gefen_checkpoints, gefen_judge, source, target
):
    restore = _restore(gefen_checkpoints, gefen_impl, source, target)
    gefen_judge.assert_comparisons(restore_checks.restored(restore), inputs=restore.describe())


@pytest.mark.gefen_clause(
    "4.3.2", "3.6.4", "3.6.5", "3.7.1", "3.7.2", "2.1", "5.1.3", "5.6.14", *EMPTY_SHARDS
)
@_every_path
def test_reshard_at_scale_resaved_state_is_consistent(
    gefen_impl, gefen_checkpoints, gefen_judge, source, target
):
    restore = _restore(gefen_checkpoints, gefen_impl, source, target)
    gefen_judge.assert_comparisons(restore_checks.resaved(restore), inputs=restore.describe())


def _beside_the_reference(checkpoints, impl, world: int):
    """The implementation's checkpoint at ``world`` ranks and the reference's (the same one when
    the implementation is the reference)."""
    saved = checkpoints.trained_and_saved(impl, MODEL, ranks=world, at_scale=True)
    reference = checkpoints.trained_and_saved(
        registry.resolve("reference"), MODEL, ranks=world, at_scale=True
    )
    return saved.path, reference.path


@pytest.mark.gefen_clause("4.3.4", "2.2.5", "5.2.1", "5.2.2")
@pytest.mark.gefen_requires(DCP_RESHARD, CPU_BIT_EXACT)
@pytest.mark.parametrize("world", SOURCES)
def test_payload_at_scale_matches_the_reference(gefen_impl, gefen_checkpoints, gefen_judge, world):
    """Every ``.distcp`` file byte for byte (md5) and the metadata digest, against the reference's."""
    actual, expected = _beside_the_reference(gefen_checkpoints, gefen_impl, world)
    mine, theirs = payload_md5s(actual), payload_md5s(expected)
    names = sorted(set(mine) | set(theirs))
    problems = [
        f"{n}: md5 {mine.get(n)} vs the reference's {theirs.get(n)}"
        for n in names
        if mine.get(n) != theirs.get(n)
    ]
    if not theirs:
        problems.append("the reference's checkpoint has no payload files")
    gefen_judge.assert_exact("payload against the reference (md5)", len(problems), len(names), problems)
    digests = metadata_digest(actual), metadata_digest(expected)
    gefen_judge.assert_exact(
        "metadata against the reference (digest)",
        int(digests[0] != digests[1]),
        1,
        [f"metadata digest {digests[0]} vs the reference's {digests[1]}"],
    )


@pytest.mark.gefen_clause("4.3.4", "2.1", "5.6.11")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("world", SOURCES)
def test_payload_content_at_scale_matches_the_reference(gefen_impl, gefen_checkpoints, gefen_judge, world):
    """The optimizer state saved at ``world`` ranks against the reference's, read back by the
    independent reader: non-float values exactly, float state bitwise under ``cpu-bit-exact``,
    otherwise within the free-running bounds (SPEC 5.6.11)."""
    actual, expected = _beside_the_reference(gefen_checkpoints, gefen_impl, world)
    compared = checkpoint_compare.compare(
        read_nested(expected)["optimizer"],
        read_nested(actual)["optimizer"],
        bitwise=gefen_judge.bitwise,
        param_dtype=torch.float32,
    )
    gefen_judge.assert_comparisons(compared)

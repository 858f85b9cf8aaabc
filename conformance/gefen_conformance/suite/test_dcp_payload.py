"""Payload identity (SPEC 4.3.4, 2.2.5): the same state saved twice, with and without the
implementation's planner, and the implementation's payload against the reference's for the same
compact state, compared by the md5 of every ``.distcp`` file and the canonical metadata digest
(SPEC 5.2). Optimizer-only saves, as in the golden catalogue.

Saves of *one* state by *one* implementation are compared byte for byte in both profiles: the
dense form of a compact state is one fp32 multiply per element (SPEC 2.1.6), which every IEEE
implementation rounds the same way, so byte identity is a legitimate demand of any kernel
(SPEC 5.6.11). For the comparison with the reference, both are trained on identical gradients
from identical parameters; under ``cpu-bit-exact`` their compact states are then bitwise equal, so
their payloads must be too; otherwise the metadata (structure) stays exact and the content is
compared by the rules of SPEC 5.6.11. ``w4-empty-shards`` holds a parameter with empty shards on ranks 2-3,
the
one case where SPEC 2.2.5 lets the three scalars of that slot differ from gefen-x 0.5.0's.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations import registry
from gefen_conformance.implementations.contract import (
    CPU_BIT_EXACT,
    DCP_RESHARD,
    DCP_SAVE_PLANNER,
    Implementation,
)
from gefen_conformance.suite import checkpoints
from gefen_conformance.workload import models, saving
from gefen_oracles import checkpoint_compare, codebook_quality, kernel_bounds
from gefen_oracles.checkpoint_reader import read_nested
from gefen_oracles.digests import content_digests, metadata_digest, payload_md5s
from gefen_oracles.numeric import Comparisons

WORLDS = [
    pytest.param("base", 1, id="w1"),
    pytest.param("base", 2, id="w2"),
    pytest.param("base", 4, id="w4"),
    pytest.param("empty", 4, id="w4-empty-shards", marks=pytest.mark.gefen_clause("2.4.5")),
]
#: Pairs of saves of one state by the implementation (:func:`payload_saves`) that must be byte
#: identical, and what the comparison is called: the same save twice, and with and without its planner.
SAVED_TWICE = ("impl_planned", "impl_planned_again", "one state saved twice")
PLANNED_AND_DEFAULT = ("impl_planned", "impl_default", "planned and default saves of one state")


def payload_saves(impl: Implementation, model: str, root: str) -> float:
    """Rank body: save one trained state several ways under ``root`` (collective; optimizer only).

    ``impl_planned`` and ``impl_planned_again`` with ``impl.save_planner()``, ``impl_default``
    with DCP's default planner, and ``reference`` from the reference trained on identical
    gradients and saved with its own adapter and planner. Returns the largest gap between
    adjacent codewords of the reference's codebook on this rank (a checkpoint carries no
    codebook; SPEC 5.6.11 needs it).
    """
    layout, mesh = models.DCP_MODELS[model], world_mesh()
    _, optimizer = saving.trained(impl, layout, mesh)
    saving.save(impl, optimizer, os.path.join(root, "impl_planned"))
    saving.save(impl, optimizer, os.path.join(root, "impl_planned_again"))
    saving.save(impl, optimizer, os.path.join(root, "impl_default"), planner=False)
    reference = registry.resolve("reference")
    _, reference_optimizer = saving.trained(reference, layout, mesh)
    saving.save(reference, reference_optimizer, os.path.join(root, "reference"))
    return codebook_quality.largest_gap(reference_optimizer.codebook)


def _payloads(saved, impl: Implementation, model: str, world: int):
    """The directory of :func:`payload_saves` for ``model`` at ``world`` ranks (made once)."""
    root = saved.directory("payloads", impl, model, f"w{world}")

    def make():
        gaps = checkpoints.run(payload_saves, world, (impl, model, str(root)))
        (root / "reference_codebook_gaps.json").write_text(json.dumps(gaps))
        return root

    return saved.once(("payloads", impl.spec, model, world), make)


def _payload_differences(a, b, what: str) -> Comparisons:
    """The payload md5s of two checkpoints, exact; a content digest says where they differ."""
    ma, mb = payload_md5s(a), payload_md5s(b)
    names = sorted(set(ma) | set(mb))
    problems = [] if ma else [f"{a.name}: no payload files"]
    if sorted(ma) != sorted(mb):
        problems.append(f"payload files differ: {sorted(ma)} vs {sorted(mb)}")
    problems += [
        f"{name}: md5 {ma[name]} ({a.name}) vs {mb[name]} ({b.name})"
        for name in sorted(set(ma) & set(mb))
        if ma[name] != mb[name]
    ]
    if problems:
        ca, cb = content_digests(a), content_digests(b)
        keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        problems.append(
            f"content differs in: {keys}" if keys else "the content is the same; only the bytes differ"
        )
    out = Comparisons()
    out.exact(what, sum(ma.get(n) != mb.get(n) for n in names), len(names), problems)
    return out


def _metadata_differences(a, b, what: str) -> Comparisons:
    da, db = metadata_digest(a), metadata_digest(b)
    out = Comparisons()
    out.exact(
        what, int(da != db), 1, [] if da == db else [f"metadata digest {da} ({a.name}) vs {db} ({b.name})"]
    )
    return out


def _byte_identical(
    checkpoints, impl: Implementation, model: str, world: int, first: str, second: str, what: str
):
    """Two saves of one state: payload md5s and metadata digest, both exact."""
    root = _payloads(checkpoints, impl, model, world)
    out = _payload_differences(root / first, root / second, f"{what} (payload md5)")
    out.merge(_metadata_differences(root / first, root / second, f"{what} (metadata digest)"))
    return out


def retained_adapter_saves(impl: Implementation, root: str) -> None:
    """Rank body (SPEC 2.3.3): one ``impl.dcp_state(optimizer)`` kept across saves, as a trainer
    keeps its app state, saved with DCP's default planner after a step and after
    ``add_param_group`` and a step; each time a fresh adapter saves the same state beside it
    (collective)."""
    from gefen_conformance.harness.sharding import shard, sharded_parameter

    model = models.BASE
    mesh = world_mesh()
    params, optimizer = saving.trained(impl, model, mesh)
    kept = impl.dcp_state(optimizer)

    def save_both(tag: str) -> None:
        for name, adapter in (("kept", kept), ("fresh", impl.dcp_state(optimizer))):
            dcp.save(
                {"optimizer": adapter},
                checkpoint_id=os.path.join(root, f"{tag}-{name}"),
                process_group=saving.group(),
            )

    save_both("first")
    models.train(model, optimizer, params, [models.DCP_STEPS + 1])
    save_both("stepped")
    late = sharded_parameter(torch.linspace(-1.0, 1.0, 6 * 4).reshape(6, 4), mesh)
    optimizer.add_param_group({"params": [("late.weight", late)], "lr": 3e-3, "weight_decay": 0.0})
    models.set_gradients(model, params, models.DCP_STEPS + 2)
    late.grad = shard(torch.linspace(0.5, -0.5, 6 * 4).reshape(6, 4), mesh)
    optimizer.step()
    save_both("group-added")


@pytest.mark.gefen_clause("4.3.4", "2.3.3", "5.2.2")
@pytest.mark.gefen_requires(DCP_RESHARD)
def test_retained_adapter_saves_the_live_state(gefen_impl, gefen_checkpoints, gefen_judge):
    """An adapter kept across saves (a trainer's app state) writes what a fresh one writes: after a
    step, and after ``add_param_group`` and a step (every value, by content digest: exact)."""
    root = gefen_checkpoints.scratch("retained-adapter")
    checkpoints.run(retained_adapter_saves, 2, (gefen_impl, str(root)))
    for tag in ("first", "stepped", "group-added"):
        kept, fresh = content_digests(root / f"{tag}-kept"), content_digests(root / f"{tag}-fresh")
        differs = sorted(k for k in set(kept) | set(fresh) if kept.get(k) != fresh.get(k))
        gefen_judge.assert_exact(
            f"a retained adapter's save against a fresh one's ({tag})",
            len(differs),
            len(fresh),
            [f"{tag}: the retained adapter's checkpoint differs from a fresh adapter's in {differs}"],
        )


@pytest.mark.gefen_clause("4.3.4", "2.2.5", "5.2.1", "5.2.2")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", WORLDS)
def test_same_state_saved_twice_is_byte_identical(gefen_impl, gefen_checkpoints, gefen_judge, model, world):
    gefen_judge.assert_comparisons(_byte_identical(gefen_checkpoints, gefen_impl, model, world, *SAVED_TWICE))


@pytest.mark.gefen_clause("4.3.4", "2.2.5", "2.5.2")
@pytest.mark.gefen_requires(DCP_RESHARD, DCP_SAVE_PLANNER)
@pytest.mark.parametrize("model,world", WORLDS)
def test_planner_does_not_change_the_bytes(gefen_impl, gefen_checkpoints, gefen_judge, model, world):
    gefen_judge.assert_comparisons(
        _byte_identical(gefen_checkpoints, gefen_impl, model, world, *PLANNED_AND_DEFAULT)
    )


@pytest.mark.gefen_clause("4.3.4", "2.2.5", "5.2.1")
@pytest.mark.gefen_requires(DCP_RESHARD, CPU_BIT_EXACT)
@pytest.mark.parametrize("model,world", WORLDS)
def test_payload_md5s_match_the_reference(gefen_impl, gefen_checkpoints, gefen_judge, model, world):
    root = _payloads(gefen_checkpoints, gefen_impl, model, world)
    what = "payload against the reference (md5)"
    gefen_judge.assert_comparisons(_payload_differences(root / "impl_planned", root / "reference", what))


@pytest.mark.gefen_clause("4.3.4", "2.1", "5.6.11")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", WORLDS)
def test_payload_content_matches_the_reference(gefen_impl, gefen_checkpoints, gefen_judge, model, world):
    """The checkpoint's content against the reference's trained on the same gradients, read back by
    the independent reader: every non-float value exactly; float state bitwise under
    ``cpu-bit-exact``, otherwise within the free-running bounds (SPEC 5.6.11)."""
    root = _payloads(gefen_checkpoints, gefen_impl, model, world)
    expected = read_nested(root / "reference")["optimizer"]
    actual = read_nested(root / "impl_planned")["optimizer"]
    gaps = [g for g in json.loads((root / "reference_codebook_gaps.json").read_text()) if g is not None]
    # without a measured gap, the whole codeword range
    gap = max(gaps, default=kernel_bounds.RESTORE_MOMENTUM_RANGE)
    compared = checkpoint_compare.compare(
        expected, actual, bitwise=gefen_judge.bitwise, param_dtype=torch.float32, largest_gap=gap
    )
    gefen_judge.assert_comparisons(compared)


@pytest.mark.gefen_clause("4.3.4", "2.2.5", "5.2.2")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", WORLDS)
def test_metadata_digest_matches_the_reference(gefen_impl, gefen_checkpoints, gefen_judge, model, world):
    root = _payloads(gefen_checkpoints, gefen_impl, model, world)
    what = "metadata against the reference (digest)"
    gefen_judge.assert_comparisons(_metadata_differences(root / "impl_planned", root / "reference", what))

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
compared by the rules of SPEC 5.6.11. ``w4-empty-shards`` holds a parameter with empty shards on ranks 2-3, the
one case where SPEC 2.2.5 lets the three scalars of that slot differ from gefen-x 0.5.0's.
"""

from __future__ import annotations

import json

import pytest
import torch

from conformance.implementation import CPU_BIT_EXACT, DCP_RESHARD, DCP_SAVE_PLANNER
from oracles import checkpoint_compare
from oracles.checkpoint_reader import read_nested
from oracles.digests import content_digests, metadata_digest, payload_md5s

from . import margins


WORLDS = [
    pytest.param("base", 1, id="w1"),
    pytest.param("base", 2, id="w2"),
    pytest.param("base", 4, id="w4"),
    pytest.param("empty", 4, id="w4-empty-shards", marks=pytest.mark.clause("2.4.5")),
]


def _payload_differences(a, b, what: str) -> list[str]:
    ma, mb = payload_md5s(a), payload_md5s(b)
    names = sorted(set(ma) | set(mb))
    margins.exact(what, sum(ma.get(n) != mb.get(n) for n in names), len(names))
    problems = []
    if not ma:
        problems.append(f"{a.name}: no payload files")
    if sorted(ma) != sorted(mb):
        problems.append(f"payload files differ: {sorted(ma)} vs {sorted(mb)}")
    problems += [f"{name}: md5 {ma[name]} ({a.name}) vs {mb[name]} ({b.name})"
                 for name in sorted(set(ma) & set(mb)) if ma[name] != mb[name]]
    if problems:
        ca, cb = content_digests(a), content_digests(b)
        keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        problems.append(f"content differs in: {keys}" if keys else "the content is the same; only the bytes differ")
    return problems


def _metadata_differences(a, b, what: str) -> list[str]:
    da, db = metadata_digest(a), metadata_digest(b)
    margins.exact(what, int(da != db), 1)
    return [] if da == db else [f"metadata digest {da} ({a.name}) vs {db} ({b.name})"]


@pytest.mark.clause("4.3.4", "2.2.5", "5.2.1", "5.2.2")
@pytest.mark.requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", WORLDS)
def test_same_state_saved_twice_is_byte_identical(request, saved, model, world):
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    a, b = root / "impl_planned", root / "impl_planned_again"
    problems = (_payload_differences(a, b, "one state saved twice (payload md5)")
                + _metadata_differences(a, b, "one state saved twice (metadata digest)"))
    assert not problems, "\n".join(problems)


@pytest.mark.clause("4.3.4", "2.2.5", "2.5.2")
@pytest.mark.requires(DCP_RESHARD, DCP_SAVE_PLANNER)
@pytest.mark.parametrize("model,world", WORLDS)
def test_planner_does_not_change_the_bytes(request, saved, model, world):
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    a, b = root / "impl_planned", root / "impl_default"
    problems = (_payload_differences(a, b, "planned and default saves of one state (payload md5)")
                + _metadata_differences(a, b, "planned and default saves of one state (metadata digest)"))
    assert not problems, "\n".join(problems)


@pytest.mark.clause("4.3.4", "2.2.5", "5.2.1")
@pytest.mark.requires(DCP_RESHARD, CPU_BIT_EXACT)
@pytest.mark.parametrize("model,world", WORLDS)
def test_payload_md5s_match_the_reference(request, saved, model, world):
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    problems = _payload_differences(root / "impl_planned", root / "reference", "payload against the reference (md5)")
    assert not problems, "\n".join(problems)


@pytest.mark.clause("4.3.4", "2.1", "5.6.11")
@pytest.mark.requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", WORLDS)
def test_payload_content_matches_the_reference(impl, request, saved, model, world):
    """The checkpoint's content against the reference's trained on the same gradients, read back by
    the independent reader: every non-float value exactly; float state bitwise under
    ``cpu-bit-exact``, otherwise within the free-running bounds (SPEC 5.6.11)."""
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    expected = read_nested(root / "reference")["optimizer"]
    actual = read_nested(root / "impl_planned")["optimizer"]
    gaps = [g for g in json.loads((root / "reference_codebook_gaps.json").read_text()) if g is not None]
    comparisons = checkpoint_compare.compare(expected, actual, bitwise=impl.has(CPU_BIT_EXACT),
                                             param_dtype=torch.float32, largest_gap=max(gaps, default=2.0))
    problems = margins.record(comparisons)
    assert not problems, "\n".join(problems)


@pytest.mark.clause("4.3.4", "2.2.5", "5.2.2")
@pytest.mark.requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", WORLDS)
def test_metadata_digest_matches_the_reference(request, saved, model, world):
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    problems = _metadata_differences(root / "impl_planned", root / "reference", "metadata against the reference (digest)")
    assert not problems, "\n".join(problems)

"""Payload identity (SPEC 4.3.4, 2.2.5): the same state saved twice, with and without the
implementation's planner, and the implementation's payload against the reference's for the same
compact state, compared by the md5 of every ``.distcp`` file and the canonical metadata digest
(SPEC 5.2). Optimizer-only saves, as in the golden catalogue.

For the comparison with the reference, both are trained on identical gradients from identical
parameters; under ``cpu-bit-exact`` their compact states are then bitwise equal, so their
payloads must be too. ``w4-empty-shards`` holds a parameter with empty shards on ranks 2-3, the
one case where SPEC 2.2.5 lets the three scalars of that slot differ from gefen-x 0.5.0's.
"""

from __future__ import annotations

import pytest

from conformance.implementation import CPU_BIT_EXACT, DCP_RESHARD, DCP_SAVE_PLANNER
from oracles.digests import content_digests, metadata_digest, payload_md5s


WORLDS = [
    pytest.param("base", 1, id="w1"),
    pytest.param("base", 2, id="w2"),
    pytest.param("base", 4, id="w4"),
    pytest.param("empty", 4, id="w4-empty-shards", marks=pytest.mark.clause("2.4.5")),
]


def _payload_differences(a, b) -> list[str]:
    ma, mb = payload_md5s(a), payload_md5s(b)
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


def _metadata_differences(a, b) -> list[str]:
    da, db = metadata_digest(a), metadata_digest(b)
    return [] if da == db else [f"metadata digest {da} ({a.name}) vs {db} ({b.name})"]


@pytest.mark.clause("4.3.4", "2.2.5", "5.2.1", "5.2.2")
@pytest.mark.requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", WORLDS)
def test_same_state_saved_twice_is_byte_identical(request, saved, model, world):
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    a, b = root / "impl_planned", root / "impl_planned_again"
    problems = _payload_differences(a, b) + _metadata_differences(a, b)
    assert not problems, "\n".join(problems)


@pytest.mark.clause("4.3.4", "2.2.5", "2.5.2")
@pytest.mark.requires(DCP_RESHARD, DCP_SAVE_PLANNER)
@pytest.mark.parametrize("model,world", WORLDS)
def test_planner_does_not_change_the_bytes(request, saved, model, world):
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    a, b = root / "impl_planned", root / "impl_default"
    problems = _payload_differences(a, b) + _metadata_differences(a, b)
    assert not problems, "\n".join(problems)


@pytest.mark.clause("4.3.4", "2.2.5", "5.2.1")
@pytest.mark.requires(DCP_RESHARD, CPU_BIT_EXACT)
@pytest.mark.parametrize("model,world", WORLDS)
def test_payload_md5s_match_the_reference(request, saved, model, world):
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    problems = _payload_differences(root / "impl_planned", root / "reference")
    assert not problems, "\n".join(problems)


@pytest.mark.clause("4.3.4", "2.2.5", "5.2.2")
@pytest.mark.requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", WORLDS)
def test_metadata_digest_matches_the_reference(request, saved, model, world):
    root = saved.payloads(request.config.getoption("--impl"), model, world)
    problems = _metadata_differences(root / "impl_planned", root / "reference")
    assert not problems, "\n".join(problems)

"""Hostile checkpoints are refused with a clear error on every rank, and change nothing (SPEC 3.10).

The catalogue is :mod:`gefen_conformance.suite.hostile`: a valid checkpoint written by the
reference at world size 1 (in this process), each variant derived from it at the byte level or by
re-saving its decoded content with one entry changed; a load attempt trains a live optimizer of
the implementation, tries the variant and compares the live state with itself, bit for bit, in
both numeric profiles (SPEC 5.6.11)."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite.hostile import CASES, RULES, craft_all, load_attempt, load_attempt_on_rank


def _cases():
    for case in CASES:
        rule, _ = RULES.get(case, (None, None))
        yield pytest.param(case, id=case, marks=[pytest.mark.gefen_clause(rule)] if rule else [])


@pytest.fixture(scope="module")
def variants(tmp_path_factory, gefen_one_rank):
    return craft_all(str(tmp_path_factory.mktemp("hostile")))


@pytest.mark.gefen_clause("3.10.1")
@pytest.mark.gefen_requires(DCP_RESHARD)
def test_the_valid_checkpoint_loads(gefen_impl, variants):
    outcome = load_attempt(gefen_impl, variants["valid"])
    assert outcome["error"] is None, outcome["error"]


@pytest.mark.gefen_clause("3.10.1")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("case", _cases())
def test_refused_without_mutation(gefen_impl, gefen_judge, variants, case):
    outcome = load_attempt(gefen_impl, variants[case])
    assert outcome["error"] is not None, f"{case}: the load was accepted"
    rule, words = RULES.get(case, (None, None))
    if rule is not None:
        named = f"ValueError naming {words!r}" if words else "ValueError"
        assert outcome["value_error"] and (words or "") in outcome["error"], (
            f"{case} (SPEC {rule}): raised {outcome['error']}; expected {named}"
        )
    gefen_judge.assert_exact(
        "live state after a refused hostile load",
        int(not outcome["unchanged"]),
        1,
        [f"{case}: refused, but live state changed ({outcome['error']})"],
    )


@pytest.mark.gefen_clause("3.10.1", "3.2.3")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize(
    "case", ["aborted-save-no-metadata", "flipped-archive-header", "nan-momentum", "renamed-parameter"]
)
def test_refused_on_every_rank(gefen_impl, gefen_ranks, gefen_judge, variants, case):
    outcomes = gefen_ranks(
        load_attempt_on_rank, 2, (gefen_impl, variants[case]), timeout=30.0, allow_failure=True
    )
    for o in outcomes:
        assert o.status == "ok", f"rank {o.rank} {o.status}: {o.message}\n{o.traceback}"
        assert o.value["error"] is not None, f"rank {o.rank} accepted {case}"
        gefen_judge.assert_exact(
            "live state after a refused hostile load",
            int(not o.value["unchanged"]),
            1,
            [f"rank {o.rank}: refused {case}, but live state changed"],
        )

"""Property-based certification of hyperparameter staging on load (SPEC 3.5).

One example = one checkpoint written by the reference with chosen saved hyperparameters, loaded
(world size 1, in this process) into a fresh optimizer of the implementation under test and into
one of the reference, whose groups were given the same chosen *destinations* (Python numbers or
one-element tensors, possibly aliased across groups and keys). The outcomes are then compared.
The checkpoint is held in memory (:mod:`gefen_conformance.workload.checkpoint_in_memory`) and DCP plans in
this process (SPEC 4.3.9): ``dcp.save`` and ``dcp.load`` call the adapters as always, without a
file or an exchange of plans per example.

Property: for any saved hyperparameters and any live destinations, the implementation accepts
exactly when the reference accepts; on acceptance it commits the same values bit for bit and
keeps every destination tensor's identity; on rejection it raises ValueError and changes
nothing. Each property first runs its explicit examples (:data:`LIMITS`, :data:`OPEN_LIMITS`: one
destination at each boundary the strategies draw from), then one third of the profile's examples
(:data:`EXAMPLE_SHARE`): ``gefen-certify`` (the default: derandomized, no example database) 100 of
its 300, ``gefen-fuzz`` (random) 1666 of its 5000 (SPEC 4.3.9).
"""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite.properties import share_of_profile, with_examples
from gefen_conformance.suite.staging import StagingCase, staging_comparisons
from gefen_conformance.suite.staging_examples import LIMITS, OPEN_LIMITS, REGRESSIONS
from gefen_conformance.suite.staging_strategies import destination_groups, saved_group

#: Each property runs this share of the hypothesis profile's examples (``gefen-certify``: 300 -> 100;
#: ``gefen-fuzz``: 5000 -> 1666) after its explicit examples (:data:`LIMITS`, :data:`OPEN_LIMITS`),
#: which pin every boundary the strategies draw from (SPEC 4.3.9).
EXAMPLE_SHARE = 3


def _drawn(*, open_cases: bool):
    """Two saved groups and two groups of live destinations (``open_cases``: with the cases gefen-x
    leaves open, SPEC 3.5.3, 3.5.4)."""
    return given(
        saved=st.lists(saved_group, min_size=2, max_size=2),
        dests=destination_groups(open_cases=open_cases),
    )


def _check(impl, judge, one_rank, saved, dests):
    """One checkpoint saved with ``saved``, loaded by the reference and by ``impl`` into groups
    holding ``dests``; their outcomes compared. Returns the reference's outcome."""
    case = StagingCase(saved, dests)
    expected, actual = case.outcomes(impl, one_rank)
    judge.assert_comparisons(staging_comparisons(impl, expected, actual), case=case)
    return expected


def _check_and_tally(impl, judge, one_rank, saved, dests) -> None:
    """:func:`_check`, then a hypothesis event saying which way the reference went."""
    expected = _check(impl, judge, one_rank, saved, dests)
    event("reference accepted" if expected.accepted else "reference rejected")


#: The regressions that check a destination's dtype (SPEC 3.5.2: truncation, a beta rounding to
#: 1, overflow, underflow) name that rule as well.
_DTYPE_REGRESSIONS = frozenset(
    {"lr-into-int64", "beta2-rounds-to-one-in-bf16", "lr-overflows-fp16", "eps-underflows-fp16"}
)
_DESTINATION_DTYPE = pytest.mark.gefen_clause("3.5.2")


@pytest.mark.gefen_clause("3.5", "4.3.9")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, id=case, marks=_DESTINATION_DTYPE if case in _DTYPE_REGRESSIONS else ())
        for case in sorted(REGRESSIONS)
    ],
)
def test_staging_regression(gefen_impl, gefen_judge, gefen_one_rank, case):
    _check(gefen_impl, gefen_judge, gefen_one_rank, *REGRESSIONS[case])


@pytest.mark.gefen_clause("3.5.1", "3.5.2", "3.5.5", "4.3.9")
@pytest.mark.gefen_requires(DCP_RESHARD)
@share_of_profile(EXAMPLE_SHARE)
@with_examples(LIMITS, "saved", "dests")
@_drawn(open_cases=False)
def test_staging_matches_reference(gefen_impl, gefen_judge, gefen_one_rank, saved, dests):
    """Numbers and one-element tensors of every dtype, each group and key with its own tensor."""
    _check_and_tally(gefen_impl, gefen_judge, gefen_one_rank, saved, dests)


@pytest.mark.gefen_clause("3.5.3", "3.5.4", "4.3.9")
@pytest.mark.gefen_requires(DCP_RESHARD)
@share_of_profile(EXAMPLE_SHARE)
@with_examples(OPEN_LIMITS, "saved", "dests")
@_drawn(open_cases=True)
def test_staging_matches_reference_with_autograd_and_aliased_destinations(
    gefen_impl, gefen_judge, gefen_one_rank, saved, dests
):
    """Adds destinations that require grad and tensors shared across groups and keys."""
    _check_and_tally(gefen_impl, gefen_judge, gefen_one_rank, saved, dests)

"""Parameters and runs the size of real models (SPEC 4.3.16): the ``scale`` tier's cases, and long
runs in every tier. Each case is stepped by the reference and by the implementation, every call
compared as the input space compares (SPEC 4.3.10, 5.6.13). The cases are in
:mod:`gefen_conformance.suite.scale_examples`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import FACTORED_V, NATIVE_STATE_DICT
from gefen_conformance.suite.scale_examples import EVERY_TIER, SCALE, long_life_problems
from gefen_conformance.suite.space_checks import InputSpaceCase


def _check(impl, judge, case) -> None:
    """The case (on the block path where the implementation has no factored second moment) run by
    the reference and by ``impl``, every call compared."""
    if case.factored and not impl.has(FACTORED_V):
        case = case.without_factored()
    drawn = InputSpaceCase(case)
    judge.assert_comparisons(drawn.comparisons(impl, bitwise=judge.bitwise), case=drawn)


@pytest.mark.gefen_tier("scale")
@pytest.mark.gefen_clause("4.3.16", "4.3.10", "1.5", "1.6", "1.8", "1.9", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("name", sorted(SCALE))
def test_scale_matches_reference(gefen_impl, gefen_judge, name):
    """Parameters past 2^24 elements on each path, first steps that must read a whole large
    parameter, and more than 20,000 parameters in one step."""
    _check(gefen_impl, gefen_judge, SCALE[name])


@pytest.mark.gefen_clause("4.3.16", "4.3.10", "1.6", "1.8", "1.9", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("name", sorted(EVERY_TIER))
def test_long_runs_and_launch_ends_match_reference(gefen_impl, gefen_judge, name):
    """Every step across 1000, 1024, 4096 and 10^4 (where a kernel keeps a schedule), from a
    synthesized state at the count before; an empty tensor last in its group."""
    _check(gefen_impl, gefen_judge, EVERY_TIER[name])


@pytest.mark.gefen_tier("scale")
@pytest.mark.gefen_clause("4.3.16", "1.6.1", "1.10.6", "1.8.4")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_a_long_life_keeps_its_codebook_and_counters(gefen_impl, gefen_judge):
    """10,050 steps from construction (not from a synthesized state: a schedule a kernel keeps by
    its own count since construction shows only here): the codebook learned at the first step never
    changes (SPEC 1.6.1), and the global and per-parameter counters count every step."""
    problems = long_life_problems(gefen_impl)
    gefen_judge.assert_exact("codebook and counters after a long life", len(problems), 1, problems)

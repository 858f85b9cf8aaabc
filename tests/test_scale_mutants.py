"""The scale tier's and the long runs' power (SPEC 4.3.16): every mutant of tests/mutants_scale.py
is failed by the case it names, in each profile it names, and the reference passes every case.

A mutant is judged in-process against its one case, as the suite's test of that case judges it.
The cheap ones run here in every run; those whose case is the scale tier's (2^25 elements: about a
minute each on a 2-core machine) carry the ``scale`` marker: benchmarks/scale_mutants.py runs them
and commits their results."""

from __future__ import annotations

import pytest

from gefen_conformance import judging
from gefen_conformance.implementations import registry
from gefen_conformance.implementations.contract import CPU_BIT_EXACT
from gefen_conformance.suite.scale_examples import EVERY_TIER, long_life_problems
from gefen_conformance.suite.space_checks import InputSpaceCase

from .mutants_scale import CHEAP, LARGE, SCALE_MUTANTS, case_of, implementation


def problems(impl, case) -> list:
    """What the suite's judge finds wrong with ``impl`` on ``case`` (empty: it passes)."""
    if case == "long_life":
        return long_life_problems(impl)
    judge = judging.Judge(impl, bitwise=CPU_BIT_EXACT in impl.capabilities)
    drawn = InputSpaceCase(case)
    return list(judge.record(drawn.comparisons(impl, bitwise=judge.bitwise), case=drawn))


def _cases(names):
    return [
        pytest.param(name, profile, id=f"{name}-{profile}")
        for name in names
        for profile in SCALE_MUTANTS[name][3]
    ]


@pytest.mark.proof
@pytest.mark.parametrize("name,profile", _cases(CHEAP))
def test_a_long_run_mutant_is_failed_by_its_case(name, profile):
    _, _, case, _, bug = SCALE_MUTANTS[name]
    assert problems(implementation(name, profile), case_of(name)), f"{name} ({bug}) passes {case} [{profile}]"


@pytest.mark.scale
@pytest.mark.parametrize("name,profile", _cases(LARGE))
def test_a_scale_mutant_is_failed_by_its_case(name, profile):
    _, _, case, _, bug = SCALE_MUTANTS[name]
    assert problems(implementation(name, profile), case_of(name)), f"{name} ({bug}) passes {case} [{profile}]"


@pytest.mark.parametrize("case", sorted(EVERY_TIER))
def test_the_reference_passes_every_long_run(case):
    assert problems(registry.resolve("reference"), EVERY_TIER[case]) == []

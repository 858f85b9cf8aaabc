"""Proving the suite: every mutant in the catalogue fails the clause it breaks, in both numeric
profiles, and the reference passes the same selections (SPEC 4.3, 5.6; the mutation score).

Mutants are judged by the failing clauses, the reference by the certificate's failure counts
(zero failed, zero errors), never by the verdict string.

Every mutant runs under the tolerance profile, the one kernel backends certify under: a partial
certification in a subprocess, a ``proof`` (the README's test command leaves them out, ``.ci/run``
runs them). Under torch-exact every result the suite compares with the reference is compared
bitwise (SPEC 5.3.1), on the same tests and the same inputs (the two declarations differ only in
``cpu-bit-exact``, which no test requires the absence of), so a test that fails under tolerance
fails under torch-exact too: a mutant whose torch-exact clause and selection are its tolerance
ones is run under torch-exact as ``exhaustive`` only (``python -m pytest -m exhaustive``, and
benchmarks/mutation_score.py, which prints both profiles' results with timings); the mutants whose
torch-exact catch is another test's are proofs in both profiles."""

from __future__ import annotations

import pytest

from .mutant_tools import caught_by, failed_clauses, failed_tests, failures, run_suite

# through tests.mutants, which builds the catalogue modules on its own names first
from .mutants import (
    CATALOGUE,
    INPUT_SPACE_MUTANTS,
    PROFILES,
    STATE_OVER_TIME,
    TOLERANCE,
    TORCH_EXACT,
    mutants_edges,
    mutants_protocol,
    mutants_space,
    mutants_stack,
    spec,
)

#: Mutants whose selections run long trajectories, loads over several steps or multi-rank restores,
#: or the input space with its 2^20-element boundary examples: the reference's run of their
#: selections is slow.
SLOW_IN_BOTH = (
    frozenset(STATE_OVER_TIME)
    | frozenset(INPUT_SPACE_MUTANTS)
    | mutants_edges.SLOW
    | mutants_protocol.SLOW
    | mutants_space.SLOW
    | mutants_stack.SLOW
)


def _implied(name: str) -> bool:
    """Whether the mutant's torch-exact catch is its tolerance catch (same clause, same selection)."""
    entry = CATALOGUE[name]
    same_clause = entry.clause_in(TORCH_EXACT) == entry.clause_in(TOLERANCE)
    return same_clause and entry.select_in(TORCH_EXACT) == entry.select_in(TOLERANCE)


def _cases():
    for name in sorted(CATALOGUE):
        profiles = (TOLERANCE,) if _implied(name) else (TORCH_EXACT, TOLERANCE)
        for profile in profiles:
            yield pytest.param(name, profile, id=f"{name}-{profile}")


@pytest.mark.proof
@pytest.mark.parametrize("name,profile", list(_cases()))
def test_suite_catches_mutant(name, profile, tmp_path):
    _assert_caught(name, profile, tmp_path)


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", [n for n in sorted(CATALOGUE) if _implied(n)])
def test_suite_catches_mutant_under_torch_exact_too(name, tmp_path):
    _assert_caught(name, TORCH_EXACT, tmp_path)


def test_the_torch_exact_declaration_runs_every_test_the_tolerance_one_runs():
    """The premise of the implied torch-exact catches: each mutant's two declarations differ in
    ``cpu-bit-exact`` alone (a test is skipped only for a capability its implementation lacks, so
    the torch-exact declaration runs every test the tolerance one runs), and the same code."""
    from gefen_conformance.implementations import registry
    from gefen_conformance.implementations.contract import CPU_BIT_EXACT

    for name in CATALOGUE:
        exact, tolerant = (registry.resolve(spec(name, p)) for p in (TORCH_EXACT, TOLERANCE))
        assert exact.capabilities - tolerant.capabilities == {CPU_BIT_EXACT}, name
        assert not tolerant.capabilities - exact.capabilities, name
        assert exact.make_optimizer is tolerant.make_optimizer, name


def _assert_caught(name: str, profile: str, tmp_path) -> None:
    entry = CATALOGUE[name]
    cert = run_suite(spec(name, profile), entry.select_in(profile), tmp_path)
    assert failures(cert) > 0, f"{name} ({entry.bug}) survived the {profile} profile: {cert['summary']}"
    clause = entry.clause_in(profile)
    assert caught_by(cert, clause), (
        f"{name} [{profile}] failed {sorted(failed_clauses(cert))}, not clause {clause}"
    )


def _selections():
    """(profile, slow) of each run of the reference over the catalogue's selections: under
    torch-exact the selections CI runs mutants on are the default ones (``exhaustive`` the rest)."""
    for profile in PROFILES:
        for slow in (False, True):
            if profile == TORCH_EXACT and slow:
                marks = [pytest.mark.exhaustive]
            else:
                marks = [pytest.mark.proof, *([pytest.mark.slow] if slow else [])]
            yield pytest.param(profile, slow, id=f"{profile}-{'slow' if slow else 'default'}", marks=marks)


@pytest.mark.parametrize("profile,slow_selections", _selections())
def test_reference_passes_every_selection(profile, slow_selections, tmp_path):
    entries = [e for n, e in CATALOGUE.items() if (n in SLOW_IN_BOTH) == slow_selections]
    selection = " or ".join(sorted({f"({e.select_in(profile)})" for e in entries}))
    impl = "tests.benign:reference_as_kernel" if profile == TOLERANCE else "reference"
    cert = run_suite(impl, selection, tmp_path)
    assert failures(cert) == 0, failed_tests(cert)
    assert cert["summary"]["passed"] > (4 if slow_selections else 20)


def test_the_documentation_counts_the_catalogues_as_they_are():
    """docs/index.md names the size of the mutant catalogue and of the benign one."""
    from pathlib import Path

    from . import benign

    index = (Path(__file__).resolve().parents[1] / "docs" / "index.md").read_text(encoding="utf-8")
    assert f"a catalogue of {len(CATALOGUE)} mutants" in index
    assert f"a catalogue of {len(benign.CATALOGUE)} benign kernel variants" in index

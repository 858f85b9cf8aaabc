"""Proving the suite: every mutant in the catalogue fails the clause it breaks, in both numeric
profiles, and the reference passes the same selections (SPEC 4.3, 5.6; the mutation score).

Mutants are judged by the failing clauses, the reference by the certificate's failure counts
(zero failed, zero errors), never by the verdict string.

Every case is a ``proof`` (a partial certification in a subprocess): the README's test command
leaves them out and ``.ci/run`` runs them all, every mutant in both profiles;
benchmarks/mutation_score.py prints the same score with timings."""

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

pytestmark = pytest.mark.proof


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


def _cases():
    for name in sorted(CATALOGUE):
        for profile in (TORCH_EXACT, TOLERANCE):
            yield pytest.param(name, profile, id=f"{name}-{profile}")


@pytest.mark.parametrize("name,profile", list(_cases()))
def test_suite_catches_mutant(name, profile, tmp_path):
    entry = CATALOGUE[name]
    cert = run_suite(spec(name, profile), entry.select_in(profile), tmp_path)
    assert failures(cert) > 0, f"{name} ({entry.bug}) survived the {profile} profile: {cert['summary']}"
    clause = entry.clause_in(profile)
    assert caught_by(cert, clause), (
        f"{name} [{profile}] failed {sorted(failed_clauses(cert))}, not clause {clause}"
    )


@pytest.mark.parametrize(
    "slow_selections",
    [pytest.param(False, id="default"), pytest.param(True, id="slow", marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("profile", PROFILES)
def test_reference_passes_every_selection(profile, slow_selections, tmp_path):
    entries = [e for n, e in CATALOGUE.items() if (n in SLOW_IN_BOTH) == slow_selections]
    selection = " or ".join(sorted({f"({e.select_in(profile)})" for e in entries}))
    impl = "tests.benign:reference_as_kernel" if profile == TOLERANCE else "reference"
    cert = run_suite(impl, selection, tmp_path)
    assert failures(cert) == 0, failed_tests(cert)
    assert cert["summary"]["passed"] > (4 if slow_selections else 20)

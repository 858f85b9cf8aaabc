"""Proving the suite: every mutant in the catalogue fails the clause it breaks, and the reference
passes the same selections (SPEC 4.3; issue 7's mutation score)."""

from __future__ import annotations

import pytest

from .mutant_tools import caught_by, failed_clauses, run_suite
from .mutants import CATALOGUE, spec


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_suite_catches_mutant(name, tmp_path):
    entry = CATALOGUE[name]
    cert = run_suite(spec(name), entry.select, tmp_path)
    assert cert["verdict"] == "not-conformant", f"{name} ({entry.bug}) passed: {cert['summary']}"
    assert caught_by(cert, entry.clause), f"{name} failed {sorted(failed_clauses(cert))}, not clause {entry.clause}"


def test_reference_passes_every_selection(tmp_path):
    selection = " or ".join(sorted({f"({e.select})" for e in CATALOGUE.values()}))
    cert = run_suite("reference", selection, tmp_path)
    assert cert["verdict"] == "conformant", [t for t in cert["tests"] if t["outcome"] != "passed"]
    assert cert["summary"]["passed"] > 20

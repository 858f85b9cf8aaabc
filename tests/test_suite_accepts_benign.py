"""Proving the suite does not reject correct kernels: every variant of the benign catalogue
(tests/benign.py: the reference with one stage rounded as a kernel backend rounds it, declaring
every capability but ``cpu-bit-exact``) passes the FULL suite (no ``-k``) under the tolerance
profile with zero failed and zero errored tests (SPEC 5.6). A rejected benign variant
is a suite defect, exactly as a surviving mutant is.

Each run is a whole certification (about a minute of CPU), so every case is a ``proof``: the
README's test command leaves them out and ``.ci/run`` runs them all; benchmarks/mutation_score.py
prints the same results with timings.
"""

from __future__ import annotations

import pytest

from .benign import CATALOGUE, spec
from .mutant_tools import failed_tests, failures, run_suite

pytestmark = pytest.mark.proof


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_suite_accepts_benign_variant(name, tmp_path):
    variant = CATALOGUE[name]
    cert = run_suite(spec(name), None, tmp_path)
    assert (
        cert["implementation"]["capabilities"]
        and "cpu-bit-exact" not in cert["implementation"]["capabilities"]
    )
    rejected = [(t["id"], t["reason"]) for t in failed_tests(cert)]
    assert failures(cert) == 0, f"{name} ({variant.reason}) was rejected by: {rejected}"
    assert cert["summary"]["passed"] >= 100, cert["summary"]

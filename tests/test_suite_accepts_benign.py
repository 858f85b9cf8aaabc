"""Proving the suite does not reject correct kernels: every variant of the benign catalogue
(tests/benign.py: the reference with one stage rounded as a kernel backend rounds it, declaring
every capability but ``cpu-bit-exact``) passes the FULL suite (no ``-k``) under the tolerance
profile with zero failed and zero errored tests (SPEC 5.6). A rejected benign variant
is a suite defect, exactly as a surviving mutant is.

Each run is a whole certification (three to four minutes of a 2-core machine beside other proofs).
:data:`IN_CI` are ``proof`` s: the README's test command leaves them out and ``.ci/run`` runs them,
beside the example backends' whole certifications (gefen-fast and gefen-triton, also conformant
under this profile). The others are ``exhaustive``, run outside CI (``python -m pytest -m
exhaustive``), to keep ``.ci/run`` within its time on two cores; benchmarks/mutation_score.py prints
every variant's result with timings.
"""

from __future__ import annotations

import pytest

from .benign import CATALOGUE, spec
from .mutant_tools import failed_tests, failures, run_suite

#: the variants every CI run certifies: the reciprocal one ulp off for every divisor (step,
#: histogram, restore), reciprocal-multiply in normalization and bias corrections, float64 sums of
#: squares, and fp32 master math for 16-bit parameters
IN_CI = ("approximate-reciprocal", "reciprocal-multiply", "float64-block-sums", "fp32-master-math")


def _variants():
    for name in sorted(CATALOGUE):
        yield pytest.param(name, marks=pytest.mark.proof if name in IN_CI else pytest.mark.exhaustive)


@pytest.mark.parametrize("name", _variants())
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

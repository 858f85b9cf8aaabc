"""Mutation score of the conformance suite, in both numeric profiles, and its acceptance of the
benign catalogue.

* every mutant of tests/mutants.py is run through the suite tests selected for its clause, once as
  declared (``torch-exact`` when its base declares ``cpu-bit-exact``) and once declared as a kernel
  backend would (without ``cpu-bit-exact``: the tolerance profile); a mutant is caught when a test
  naming its clause (for that profile) fails;
* every variant of tests/benign.py (legitimate kernels, one rounding change each) is run through the
  FULL suite under the tolerance profile; it is accepted when no test failed or errored (judged by
  the certificate's counts).

Prints one row per mutant and per variant, and the scores. Run from the repository root:

    python benchmarks/mutation_score.py [--jobs N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import benign  # noqa: E402
from tests.mutant_tools import caught_by, failed_clauses, failed_tests, failures, run_suite  # noqa: E402
from tests.mutants import CATALOGUE, PROFILES, spec  # noqa: E402


def _timed(impl_spec: str, select):
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        cert = run_suite(impl_spec, select, tmp)
        return cert, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="suite runs in parallel (default 1)")
    args = parser.parse_args()
    jobs = [("mutant", name, profile) for name in CATALOGUE for profile in PROFILES]
    jobs += [("benign", name, "tolerance") for name in benign.CATALOGUE]

    def run(job):
        kind, name, profile = job
        if kind == "mutant":
            return _timed(spec(name, profile), CATALOGUE[name].select_in(profile))
        return _timed(benign.spec(name), None)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = dict(zip(jobs, pool.map(run, jobs)))

    caught = {p: 0 for p in PROFILES}
    print(f"{'mutant':24} {'profile':11} {'clause':7} {'caught':6} {'seconds':>7}  failing clauses / bug")
    for name, entry in CATALOGUE.items():
        for profile in PROFILES:
            cert, seconds = results[("mutant", name, profile)]
            clause = entry.clause_in(profile)
            hit = caught_by(cert, clause)
            caught[profile] += hit
            clauses = ",".join(sorted(failed_clauses(cert))) or "-"
            print(
                f"{name:24} {profile:11} {clause:7} {'yes' if hit else 'NO':6} {seconds:7.1f}  "
                f"{clauses} / {entry.bug}"
            )
    accepted = 0
    print(
        f"\n{'benign variant':28} {'accepted':8} {'passed':>6} {'skipped':>7} {'seconds':>7}  rejected "
        "by / stage"
    )
    for name, variant in benign.CATALOGUE.items():
        cert, seconds = results[("benign", name, "tolerance")]
        ok = failures(cert) == 0
        accepted += ok
        s = cert["summary"]
        rejected = ",".join(t["id"] for t in failed_tests(cert)) or "-"
        print(
            f"{name:28} {'yes' if ok else 'NO':8} {s['passed']:6} {s['skipped']:7} {seconds:7.1f}  "
            f"{rejected} / {variant.stage}"
        )
    n = len(CATALOGUE)
    for profile in PROFILES:
        print(f"mutation score ({profile}): {caught[profile]}/{n} = {100.0 * caught[profile] / n:.0f}%")
    print(f"benign variants accepted (tolerance): {accepted}/{len(benign.CATALOGUE)}")
    return 0 if all(c == n for c in caught.values()) and accepted == len(benign.CATALOGUE) else 1


if __name__ == "__main__":
    raise SystemExit(main())

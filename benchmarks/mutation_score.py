"""Mutation score of the conformance suite over the mutant catalogue (tests/mutants.py).

Runs the suite (the tests selected for each mutant's clause) against every mutant and prints, per
mutant, the bug, the clause meant to catch it, whether that clause failed, every failing clause and
the time taken. Run from the repository root:  python benchmarks/mutation_score.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.mutant_tools import caught_by, failed_clauses, run_suite  # noqa: E402
from tests.mutants import CATALOGUE, spec  # noqa: E402


def main() -> int:
    caught = 0
    print(f"{'mutant':26} {'clause':7} {'caught':6} {'seconds':>7}  failing clauses / bug")
    for name, entry in CATALOGUE.items():
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            cert = run_suite(spec(name), entry.select, tmp)
            seconds = time.perf_counter() - start
        hit = caught_by(cert, entry.clause)
        caught += hit
        clauses = ",".join(sorted(failed_clauses(cert))) or "-"
        print(f"{name:26} {entry.clause:7} {'yes' if hit else 'NO':6} {seconds:7.1f}  {clauses} / {entry.bug}")
    print(f"mutation score: {caught}/{len(CATALOGUE)} = {100.0 * caught / len(CATALOGUE):.0f}%")
    return 0 if caught == len(CATALOGUE) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""How long ``gefen-conformance repro`` takes to replay a mutant's failure (SPEC 4.5.6; target: under 5 s).

For each mutant of tests/test_repro.py: certify it on the one suite test it fails (``pytest
--impl=... -k ...`` in a subprocess, as tests/mutant_tools.run_suite does), then run
``python -m gefen_conformance.cli repro CERT TEST_ID`` ``--runs`` times and print, side by side,
the failing suite run's wall time, the test's duration in the certificate, the repro command's wall
time (interpreter start, imports, implementation import and the replay), the replay alone as the
command prints it, and whether it reproduced bit for bit.

    python benchmarks/repro_time.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.mutant_tools import failed_tests, run_suite  # noqa: E402

CASES = [
    ("tests.mutants:tolerant_lr_half_percent_high", "test_pinned_block_step and plain and float32 and pinned-after-3"),
    ("tests.mutants:mutant_lr_half_percent_high", "test_block_step_matches_reference and plain and float32"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print("| mutant | failing test | suite run (s) | test duration (s) | repro wall (s), each run | replay (s) | bit for bit |")
    print("|---|---|---:|---:|---|---:|:---:|")
    for spec, select in CASES:
        with tempfile.TemporaryDirectory(prefix="gefen-repro-bench-") as scratch:
            started = time.monotonic()
            cert = run_suite(spec, select, scratch)
            suite_s = time.monotonic() - started
            (failed,) = failed_tests(cert)
            walls, replay, same = [], "", True
            for _ in range(args.runs):
                began = time.monotonic()
                result = subprocess.run([sys.executable, "-m", "gefen_conformance.cli", "repro",
                                         str(Path(scratch) / "certificate.json"), failed["id"]],
                                        cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
                walls.append(time.monotonic() - began)
                same &= "verdict: reproduced bit for bit" in result.stdout
                found = re.search(r"replayed in ([0-9.]+) s", result.stdout)
                replay = found.group(1) if found else "?"
            print(f"| {spec.split(':')[1]} | {failed['id']} | {suite_s:.1f} | {failed['duration_s']:.2f} | "
                  f"{', '.join(f'{w:.2f}' for w in walls)} | {replay} | {'yes' if same else 'NO'} |")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()

"""How long ``gefen-conformance repro`` takes to replay a mutant's failure (SPEC 4.5.6; target: under 5 s).

For each mutant of tests/test_repro.py (the catalogue's ``lr-half-percent-high``, named from
tests/optimizer_mutants.py, whose import pulls in no DCP code): certify it on the one suite test it fails
(``pytest
--impl=... -k ...`` in a subprocess, as tests/mutant_tools.run_suite does), then run
``python -m gefen_conformance.cli repro CERT TEST_ID`` ``--runs`` times and print, side by side,
the failing suite run's wall time, the test's duration in the certificate, the repro command's wall
time (interpreter start, imports, implementation import and the replay) and its CPU time (user +
system: what a loaded machine's wall time hides), the replay alone as the command prints it, and
whether it reproduced bit for bit. ``--workdir DIR`` keeps the certificates in ``DIR/<n>/`` and
reuses one found there (the certification is not what is timed).

    python benchmarks/repro_time.py [--runs 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.mutant_tools import failed_tests, run_suite  # noqa: E402

CASES = [
    (
        "tests.optimizer_mutants:tolerant_lr_half_percent_high",
        "test_pinned_block_step and plain and float32 and pinned-after-3",
    ),
    (
        "tests.optimizer_mutants:mutant_lr_half_percent_high",
        "test_block_step_matches_reference and plain and float32",
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f} at start"
    )
    print(
        "| mutant | failing test | suite run (s) | test duration (s) | repro wall (s), each run | "
        "repro CPU (s), each run "
        "| replay (s) | bit for bit |"
    )
    print("|---|---|---:|---:|---|---|---:|:---:|")
    with tempfile.TemporaryDirectory(prefix="gefen-repro-bench-") as scratch:
        root = args.workdir or Path(scratch)
        for n, (spec, select) in enumerate(CASES):
            workdir = root / str(n)
            workdir.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            if (workdir / "certificate.json").exists():
                import json

                cert, suite = json.loads((workdir / "certificate.json").read_text()), "reused"
            else:
                cert = run_suite(spec, select, workdir)
                suite = f"{time.monotonic() - started:.1f}"
            (failed,) = failed_tests(cert)
            walls, cpus, replay, same = [], [], "", True
            for _ in range(args.runs):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                began = time.monotonic()
                result = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "gefen_conformance.cli",
                        "repro",
                        str(workdir / "certificate.json"),
                        failed["id"],
                    ],
                    cwd=workdir,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                walls.append(time.monotonic() - began)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
                same &= "verdict: reproduced bit for bit" in result.stdout
                found = re.search(r"replayed in ([0-9.]+) s", result.stdout)
                replay = found.group(1) if found else "?"
            print(
                f"| {spec.split(':')[1]} | {failed['id']} | {suite} | {failed['duration_s']:.2f} | "
                f"{', '.join(f'{w:.2f}' for w in walls)} | {', '.join(f'{c:.2f}' for c in cpus)} | "
                f"{replay} | "
                f"{'yes' if same else 'NO'} |",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()

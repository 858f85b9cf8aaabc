"""Wall time of a default certification run and the harness overhead per scenario (SPEC 4.2.3).

Runs ``pytest --pyargs gefen_conformance --impl=NAME`` in a subprocess (default: the reference), prints its
wall time, the slowest tests from the certificate, and the warm overhead of one ``run_on_ranks``
call at world sizes 1, 2 and 4 (what each multi-rank scenario pays beyond its own work).

    python benchmarks/suite_time.py [--impl NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gefen_conformance.ranks import run_on_ranks, shutdown_pool


def _noop():
    return None


def harness_overhead(world_size: int, calls: int = 10) -> float:
    run_on_ranks(_noop, world_size, timeout=60)  # warm the pool
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run_on_ranks(_noop, world_size, timeout=60)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", default="reference")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cert_path = Path(tmp) / "certificate.json"
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--pyargs", "gefen_conformance", f"--impl={args.impl}", "-q",
             "-p", "no:cacheprovider", f"--certificate={cert_path}"],
            cwd=tmp, capture_output=True, text=True,
        )
        wall = time.perf_counter() - start
        cert = json.loads(cert_path.read_text())
    s = cert["summary"]
    print(f"certification of {args.impl}: {wall:.1f} s wall, exit {proc.returncode}, verdict {cert['verdict']}")
    print(f"  {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped, {s['xfailed']} expected failures")
    print("slowest tests:")
    for t in sorted(cert["tests"], key=lambda t: -t["duration_s"])[:8]:
        print(f"  {t['duration_s']:7.2f} s  {t['id']}")
    print("run_on_ranks warm overhead per call (median of 10):")
    for world in (1, 2, 4):
        print(f"  world {world}: {1000 * harness_overhead(world):.1f} ms")
    shutdown_pool()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

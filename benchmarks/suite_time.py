"""Wall time of a default certification run and the harness overhead per scenario (SPEC 4.2.3).

Runs ``pytest --pyargs gefen_conformance --impl=NAME`` in a subprocess (default: the reference), prints its
wall time, the CPU time of the run (the test process and its rank workers) and the load average
around it, the slowest tests from the certificate, the summed duration of the tests whose id
contains one of ``--sum`` (for example the modules a change added), and the warm overhead of one
``run_on_ranks`` call at world sizes 1, 2 and 4 (what each multi-rank scenario pays beyond its own
work). The suite measured is the one the running interpreter imports, so running this script with
another environment's python measures that environment's suite, side by side.

    python benchmarks/suite_time.py [--impl NAME] [--sum TEXT ...] [--no-overhead]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
    parser.add_argument("--sum", nargs="*", default=[], help="sum the durations of tests whose id contains one of these")
    parser.add_argument("--no-overhead", action="store_true", help="skip the run_on_ranks overhead measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cert_path = Path(tmp) / "certificate.json"
        load_before = os.getloadavg()[0]
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--pyargs", "gefen_conformance", f"--impl={args.impl}", "-q",
             "-p", "no:cacheprovider", f"--certificate={cert_path}"],
            cwd=tmp, capture_output=True, text=True,
        )
        wall = time.perf_counter() - start
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_after = os.getloadavg()[0]
        cert = json.loads(cert_path.read_text())
    s = cert["summary"]
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    print(f"certification of {args.impl}: {wall:.1f} s wall, exit {proc.returncode}, verdict {cert['verdict']}")
    suite = cert.get("suite", {})
    commit = (suite.get("git") or {}).get("commit") or "no git"
    print(f"  suite {suite.get('content_sha256', '?')[:12]} ({str(commit)[:12]}); CPU {cpu:.1f} s "
          f"(test process and rank workers); load average {load_before:.1f} before, {load_after:.1f} after")
    if args.sum:
        chosen = [t for t in cert["tests"] if any(text in t["id"] for text in args.sum)]
        print(f"  {len(chosen)} tests matching {args.sum}: {sum(t['duration_s'] for t in chosen):.1f} s summed")
    print(f"  {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped, {s['xfailed']} expected failures")
    print("slowest tests:")
    for t in sorted(cert["tests"], key=lambda t: -t["duration_s"])[:8]:
        print(f"  {t['duration_s']:7.2f} s  {t['id']}")
    if args.no_overhead:
        return 0
    print("run_on_ranks warm overhead per call (median of 10):")
    for world in (1, 2, 4):
        print(f"  world {world}: {1000 * harness_overhead(world):.1f} ms")
    shutdown_pool()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Wall time of a default certification run and the harness overhead per scenario (SPEC 4.2.3).

Runs ``pytest --pyargs gefen_conformance --impl=NAME`` in a subprocess (default: the reference), prints its
wall time, the slowest tests from the certificate, and the warm overhead of one ``run_on_ranks``
call at world sizes 1, 2 and 4 (what each multi-rank scenario pays beyond its own work).

With ``--baseline PYTHON`` it compares instead: the same certification by ``PYTHON`` (an environment
with another checkout of the suite installed, such as main) and by this interpreter, alternated
``--rounds`` times in one sitting, each run with the 1-minute load average at its start, its wall
time and the CPU time of the run (user + system of every process it started); then the medians,
their differences and ratios, and the tests that only one side has. On a shared machine the CPU
time is the steadier figure; the wall-time ratio of runs made side by side is the one to report.

    python benchmarks/suite_time.py [--impl NAME] [--sum TEXT ...] [--no-overhead]
    python benchmarks/suite_time.py --baseline /path/to/main-venv/bin/python [--rounds 3] [--impl NAME]
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


def _noop():
    return None


def harness_overhead(world_size: int, calls: int = 10) -> float:
    from gefen_conformance.harness.pool import run_on_ranks

    run_on_ranks(_noop, world_size, timeout=60)  # warm the pool
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run_on_ranks(_noop, world_size, timeout=60)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def certify(python: str, impl: str) -> dict:
    """One certification by ``python`` from an empty directory: wall and CPU seconds, load average
    at the start, exit status and the certificate."""
    with tempfile.TemporaryDirectory() as tmp:
        cert_path = Path(tmp) / "certificate.json"
        load = os.getloadavg()[0]
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(
            [
                python,
                "-m",
                "pytest",
                "--pyargs",
                "gefen_conformance",
                f"--impl={impl}",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--certificate={cert_path}",
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
        if not cert_path.exists():
            raise SystemExit(
                f"{python}: no certificate (exit "
                f"{proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )
        cert = json.loads(cert_path.read_text())
    return {"wall": wall, "cpu": cpu, "load": load, "exit": proc.returncode, "cert": cert}


def _module_sums(cert: dict) -> dict:
    """Summed test durations per suite module (``test_x.py``) of one certificate."""
    sums: dict = {}
    for t in cert["tests"]:
        module = t["id"].partition("::")[0]
        sums[module] = sums.get(module, 0.0) + t["duration_s"]
    return sums


def _describe(run: dict) -> str:
    s = run["cert"]["summary"]
    return (
        f"{run['wall']:6.1f} s wall, {run['cpu']:6.1f} s CPU, load {run['load']:4.1f} at start, exit "
        f"{run['exit']}, "
        f"{run['cert']['verdict']}, {s['passed']} passed, {s['failed']} failed"
    )


def single(impl: str, sums=(), overhead: bool = True) -> int:
    from gefen_conformance.harness.pool import shutdown_pool

    run = certify(sys.executable, impl)
    cert, s = run["cert"], run["cert"]["summary"]
    print(f"certification of {impl}: {run['wall']:.1f} s wall, exit {run['exit']}, verdict {cert['verdict']}")
    suite = cert.get("suite", {})
    commit = (suite.get("git") or {}).get("commit") or "no git"
    print(
        f"  suite {suite.get('content_sha256', '?')[:12]} ({str(commit)[:12]}); CPU {run['cpu']:.1f} s "
        f"(test process and rank workers); load average {run['load']:.1f} at start"
    )
    if sums:
        chosen = [t for t in cert["tests"] if any(text in t["id"] for text in sums)]
        print(
            f"  {len(chosen)} tests matching {list(sums)}: {sum(t['duration_s'] for t in chosen):.1f} "
            "s summed"
        )
    print(
        f"  {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped, {s['xfailed']} "
        "expected failures"
    )
    print(f"  warm-up {cert.get('execution', {}).get('warm_up_s')} s; summed test durations per module:")
    for module, seconds in sorted(_module_sums(cert).items(), key=lambda kv: -kv[1]):
        print(f"    {seconds:7.2f} s  {module}")
    print("slowest tests:")
    for t in sorted(cert["tests"], key=lambda t: -t["duration_s"])[:8]:
        print(f"  {t['duration_s']:7.2f} s  {t['id']}")
    if not overhead:
        return 0
    print("run_on_ranks warm overhead per call (median of 10):")
    for world in (1, 2, 4):
        print(f"  world {world}: {1000 * harness_overhead(world):.1f} ms")
    shutdown_pool()
    return 0


def compare(impl: str, baseline: str, rounds: int) -> int:
    sides = {"baseline": baseline, "this": sys.executable}
    runs = {name: [] for name in sides}
    print(f"certification of {impl}, alternated {rounds} times: baseline {baseline}, this {sys.executable}")
    for r in range(rounds):
        for name, python in sides.items():
            run = certify(python, impl)
            runs[name].append(run)
            print(f"  round {r + 1} {name:8s} {_describe(run)}")
    medians = {
        name: {k: statistics.median(run[k] for run in rs) for k in ("wall", "cpu")}
        for name, rs in runs.items()
    }
    for k in ("wall", "cpu"):
        b, t = medians["baseline"][k], medians["this"][k]
        print(f"median {k}: baseline {b:.1f} s, this {t:.1f} s: {t - b:+.1f} s, ratio {t / b:.3f}")
    modules = {name: [_module_sums(run["cert"]) for run in rs] for name, rs in runs.items()}
    print("summed test durations per suite module, median over the rounds (baseline -> this):")
    for module in sorted(
        set().union(*(m for ms in modules.values() for m in ms)),
        key=lambda m: -statistics.median(ms.get(m, 0.0) for ms in modules["baseline"]),
    ):
        b, t = (
            statistics.median(ms.get(module, 0.0) for ms in modules[name]) for name in ("baseline", "this")
        )
        print(f"  {module:32s} {b:7.1f} s -> {t:7.1f} s")
    for name, rs in runs.items():
        warm = [run["cert"].get("execution", {}).get("warm_up_s") for run in rs]
        print(f"warm-up ({name}): " + ", ".join("-" if w is None else f"{w:.1f} s" for w in warm))
    tests = {name: {t["id"]: t["duration_s"] for t in rs[-1]["cert"]["tests"]} for name, rs in runs.items()}
    added = sorted(set(tests["this"]) - set(tests["baseline"]))
    removed = sorted(set(tests["baseline"]) - set(tests["this"]))
    for name, ids in (("only in this suite", added), ("only in the baseline", removed)):
        if ids:
            print(f"{name} (durations in each round):")
            for i in ids:
                side = "this" if name.startswith("only in this") else "baseline"
                durations = ", ".join(
                    f"{next(t['duration_s'] for t in run['cert']['tests'] if t['id'] == i):.2f}"
                    for run in runs[side]
                )
                print(f"  {i}: {durations} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", default="reference")
    parser.add_argument(
        "--baseline", metavar="PYTHON", help="compare with the certification by this interpreter"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs per side with --baseline")
    parser.add_argument(
        "--sum", nargs="*", default=[], help="sum the durations of tests whose id contains one of these"
    )
    parser.add_argument(
        "--no-overhead", action="store_true", help="skip the run_on_ranks overhead measurement"
    )
    args = parser.parse_args()
    if args.baseline:
        return compare(args.impl, args.baseline, args.rounds)
    return single(args.impl, args.sum, not args.no_overhead)


if __name__ == "__main__":
    raise SystemExit(main())

"""Certify under oversubscription and compare with a quiet run (SPEC 4.2.10, 4.2.11, 4.4.6).

    python benchmarks/load_proof.py --per-core 0 4 8 --impl reference fast [--tests] [--out DIR]

For each load (``--per-core`` busy processes per core, from ``benchmarks/load.py``, on top of
whatever else the machine runs), and each implementation: ``gefen-conformance certify --impl
IMPL`` of the whole suite, timed. Printed per run: the load averages before and after, the wall
time, the warm-up, the verdict, the outcome counts, and how many margins (every tolerance
comparison's share of its bound, every bitwise comparison's count of differing elements) differ
from the first load's run of the same implementation. With ``--tests``, also the harness's own
proofs under the same load: ``tests/test_ranks.py`` (a hung rank, an aborting rank),
``tests/test_plugin_interrupt.py`` and ``tests/test_torchrun.py``, slow ones included, with their
pass/fail counts and wall time. Certificates and logs go to ``--out`` (default: a temporary
directory, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import Oversubscribed, usable_cpus  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_ranks.py", "tests/test_plugin_interrupt.py", "tests/test_torchrun.py"]


def machine() -> str:
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model}, {usable_cpus()} usable CPUs ({os.cpu_count()} online), Python {platform.python_version()}"
    )


def loadavg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def margins(cert: dict) -> dict:
    """(test, what) -> the margin's share of its bound (tolerance) or differing count (bitwise)."""
    found = {}
    for test in cert["tests"]:
        for m in test.get("margins") or []:
            key = (test["id"], m.get("what"), m.get("kind"))
            found[key] = m.get("used") if m.get("kind") == "tolerance" else m.get("differing")
    return found


def certify(impl: str, out: Path, tag: str) -> dict:
    cert_path = out / f"{impl}-{tag}.json"
    log = out / f"{impl}-{tag}.log"
    before = loadavg()
    started = time.monotonic()
    with open(log, "w") as handle:
        code = subprocess.call(
            [
                sys.executable,
                "-m",
                "gefen_conformance.cli",
                "certify",
                "--impl",
                impl,
                "--out",
                str(cert_path),
                "--",
                "-q",
            ],
            cwd=out,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    wall = time.monotonic() - started
    found = cert_path if cert_path.exists() else cert_path.with_name(cert_path.stem + ".partial.json")
    cert = json.loads(found.read_text()) if found.exists() else None
    return {
        "impl": impl,
        "tag": tag,
        "exit": code,
        "wall_s": wall,
        "load_before": before,
        "load_after": loadavg(),
        "cert": cert,
    }


def run_tests(out: Path, tag: str) -> dict:
    log = out / f"tests-{tag}.log"
    before = loadavg()
    started = time.monotonic()
    with open(log, "w") as handle:
        code = subprocess.call(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "slow or not slow",
                *TESTS,
            ],
            cwd=REPO,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    wall = time.monotonic() - started
    tail = log.read_text().strip().splitlines()[-1] if log.read_text().strip() else ""
    return {
        "tag": tag,
        "exit": code,
        "wall_s": wall,
        "load_before": before,
        "load_after": loadavg(),
        "summary": tail,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-core", type=float, nargs="+", default=[0, 4, 8])
    parser.add_argument("--impl", nargs="*", default=["reference", "fast"], help="none: only --tests")
    parser.add_argument(
        "--tests", action="store_true", help="also run the harness's own proofs under each load"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--bound-s", type=float, default=4 * 3600, help="bound on the busy processes (default 4 h)"
    )
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="gefen-load-proof-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}; results in {out}", flush=True)
    quiet: dict = {}
    worst = 0
    for per_core in args.per_core:
        tag = f"{per_core:g}x"
        with Oversubscribed(per_core, args.bound_s) as load:
            print(f"\n== load: {load.describe()}", flush=True)
            time.sleep(5.0 if load.count else 0.0)
            for impl in args.impl:
                r = certify(impl, out, tag)
                cert = r["cert"]
                if cert is None:
                    print(
                        f"{impl:10} {tag:4} exit {r['exit']}: no certificate (see {impl}-{tag}.log)",
                        flush=True,
                    )
                    worst = 1
                    continue
                found = margins(cert)
                base = quiet.setdefault(impl, found)
                moved = sum(1 for k, v in found.items() if base.get(k) != v) + len(set(base) - set(found))
                s = cert["summary"]
                print(
                    f"{impl:10} {tag:4} load {r['load_before']} -> {r['load_after']}  wall "
                    f"{r['wall_s']:7.1f} s  "
                    f"warm-up {cert['execution'].get('warm_up_s')} s  verdict {cert['verdict']} (exit "
                    f"{r['exit']})  "
                    f"{s['passed']} passed {s['failed']} failed {s['error']} errors {s['skipped']} skipped "
                    f"{s['xfailed']} xfailed  margins {len(found)}, {moved} differ from the first load's",
                    flush=True,
                )
                if s["failed"] or s["error"] or moved:
                    worst = 1
            if args.tests:
                t = run_tests(out, tag)
                print(
                    f"{'tests':10} {tag:4} load {t['load_before']} -> {t['load_after']}  wall "
                    f"{t['wall_s']:7.1f} s  "
                    f"exit {t['exit']}: {t['summary']}",
                    flush=True,
                )
                worst = worst or int(t["exit"] != 0)
            if load.count and load.alive() != load.count:
                print(
                    f"   (only {load.alive()} of {load.count} busy processes were still running at the end)"
                )
    return worst


if __name__ == "__main__":
    sys.exit(main())

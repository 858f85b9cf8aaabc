"""The scale tier's cost and power (SPEC 4.3.16), side by side in one run.

    python benchmarks/scale_tier.py [--out benchmarks/scale_tier.results.txt] [--only NAME ...]

For every case of the scale tier (gefen_conformance.suite.scale_examples.SCALE, and the long life of
10,050 steps from construction): the wall time and
peak memory of the reference judged against itself, as `certify --tier scale` judges an
implementation; then every scale mutant of tests/mutants_scale.py against its case, in each profile
it names: caught or not, and its time. Each item runs in a fresh process, so that its peak
resident memory is its own (a case holds the reference's and the implementation's optimizers and
the float64 recomputation of every element).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_ONE = r"""
import json, sys, time
sys.path.insert(0, {repo!r})
from gefen_conformance.implementations import registry
from gefen_conformance.suite.scale_examples import SCALE
from tests.mutants_scale import implementation
from tests.test_scale_mutants import problems
kind, name, profile = sys.argv[1:4]
start = time.perf_counter()
if kind == "case":
    found = problems(registry.resolve("reference"), "long_life" if name == "long_life" else SCALE[name])
else:
    from tests.mutants_scale import case_of
    found = problems(implementation(name, profile), case_of(name))
print(json.dumps({{"seconds": time.perf_counter() - start, "problems": found[:2], "count": len(found)}}))
"""


def _run(kind: str, name: str, profile: str) -> dict:
    """One item in a fresh process: its result, with its own peak resident memory (``peak_mib``)."""
    process = subprocess.Popen(
        [sys.executable, "-c", _ONE.format(repo=str(REPO)), kind, name, profile],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    result = json.loads(out.strip().splitlines()[-1]) if process.returncode == 0 else {"error": status}
    result["peak_mib"] = usage.ru_maxrss // 1024
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="case or mutant names")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from gefen_conformance.suite.scale_examples import SCALE
    from tests.mutants_scale import LARGE, SCALE_MUTANTS

    lines = [
        f"# benchmarks/scale_tier.py: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{platform.machine()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start, "
        f"Python {platform.python_version()}",
        "",
        "| case (reference vs reference) | seconds | peak RSS (MiB) | problems |",
        "|---|---:|---:|---:|",
    ]
    total = 0.0
    for name in [*sorted(SCALE), "long_life"]:
        if args.only and name not in args.only:
            continue
        result = _run("case", name, "torch-exact")
        peak = result["peak_mib"]
        total += result.get("seconds", 0.0)
        lines.append(
            f"| {name} | {result.get('seconds', float('nan')):.1f} | {peak} | {result.get('count', '?')} |"
        )
        print(lines[-1], flush=True)
    lines += ["", f"scale tier, the reference's cases in all: {total:.0f} s", ""]
    lines += [
        "| mutant | case | profile | caught | seconds | first problem |",
        "|---|---|---|:---:|---:|---|",
    ]
    for name in LARGE:
        if args.only and name not in args.only:
            continue
        _, _, case, profiles, _ = SCALE_MUTANTS[name]
        for profile in profiles:
            result = _run("mutant", name, profile)
            caught = "error" if "error" in result else "yes" if result.get("count") else "NO"
            first = (result.get("problems") or [""])[0].replace("|", "/")[:100]
            seconds = result.get("seconds", float("nan"))
            lines.append(f"| {name} | {case} | {profile} | {caught} | {seconds:.1f} | {first} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

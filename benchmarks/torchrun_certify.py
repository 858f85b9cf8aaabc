"""Certify one implementation with the pool and under torchrun, and interrupt a torchrun run (SPEC 4.7).

    python benchmarks/torchrun_certify.py [--impl reference] [--nproc-per-node 4] [--interrupt-at 30]

Prints one table row per run: launcher, exit status, wall time, verdict, tests passed / expected
failures / failed, the certificate's execution, and how many of the processes the run started
(every descendant of the command, sampled while it ran: torchrun's agent, its ranks, the rank-0
server, pool workers) were still alive 10 s after it ended. The interrupted run gets SIGINT in
its process group, as a terminal's Ctrl-C, ``--interrupt-at`` seconds after it started.
Results and the machine: benchmarks/README.md ("Certifying under torchrun").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(parent, []).append(int(name))
    return tree


def _descendants(root: int) -> set[int]:
    tree, found, todo = _children(), set(), [root]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _run(command: list[str], interrupt_at: float | None) -> tuple[int, float, set[int]]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    started = time.monotonic()
    child = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen: set[int] = set()
    interrupted = False
    while child.poll() is None:
        seen |= _descendants(child.pid)
        if interrupt_at is not None and not interrupted and time.monotonic() - started >= interrupt_at:
            os.killpg(child.pid, signal.SIGINT)
            interrupted = True
        time.sleep(0.25)
    return child.returncode, time.monotonic() - started, seen


def _row(launcher: str, code: int, seconds: float, seen: set[int], cert_path: Path) -> str:
    time.sleep(10)
    left = sum(_alive(pid) for pid in seen)
    if not cert_path.exists():
        partial = cert_path.with_name(cert_path.stem + ".partial.json")
        cert_path = partial if partial.exists() else cert_path
    if cert_path.exists():
        cert = json.loads(cert_path.read_text())
        s = cert["summary"]
        counts = f"{s['passed']} / {s['xfailed']} / {s['failed']}"
        execution = cert["execution"]
        where = (
            f"{execution.get('launcher')}, world size {execution.get('world_size')}, "
            f"{execution.get('backend')}"
        )
        verdict = cert["verdict"]
    else:
        counts, where, verdict = "-", "-", "no certificate"
    return (
        f"| {launcher} | {code} | {seconds:.0f} s | {verdict} | {counts} | {where} | {len(seen)} | {left} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--nproc-per-node", type=int, default=4)
    parser.add_argument("--interrupt-at", type=float, default=30.0)
    options = parser.parse_args()
    base = [sys.executable, "-m", "gefen_conformance.cli", "certify", "--impl", options.impl]
    torchrun = ["--launcher", "torchrun", "--nproc-per-node", str(options.nproc_per_node)]
    print(f"load average at start: {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs")
    print(
        "| run | exit | wall | verdict | passed / expected failures / failed | execution "
        "| processes started | left 10 s later |"
    )
    print("|---|---:|---:|---|---|---|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        runs = [
            ("pool", [], None),
            ("torchrun", torchrun, None),
            (f"torchrun, SIGINT at {options.interrupt_at:g} s", torchrun, options.interrupt_at),
        ]
        for index, (name, extra, interrupt_at) in enumerate(runs):
            cert = Path(scratch) / f"c{index}.json"
            code, seconds, seen = _run(base + extra + ["--out", str(cert), "--", "-q"], interrupt_at)
            print(_row(name, code, seconds, seen, cert), flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

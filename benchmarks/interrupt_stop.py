"""Ctrl-C a certification at given times and report how it stopped (SPEC 4.4.6).

    python benchmarks/interrupt_stop.py [SECONDS | PERCENT% ...]     (default: 5 25% 60%)

Each run is ``pytest --impl=reference`` in a fresh empty directory, started in its own session;
SIGINT goes to its process group (as Ctrl-C does) SECONDS after the start, or once the run's
progress lines say PERCENT of its tests have finished. Printed per run: exit
status, seconds from the signal to the exit, output lines, the certificate written and its
verdict, executed tests, and the processes of the run still alive 10 s after it exited.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.interrupt_probe import interrupt_run  # noqa: E402


def main(argv=None) -> int:
    points = list(argv if argv is not None else sys.argv[1:]) or ["5", "25%", "60%"]
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    print(
        "at    at_s  exit  stopped_after_s  lines  certificate                                  "
        "verdict     executed  left"
    )
    worst = 0
    for at in points:
        with tempfile.TemporaryDirectory(prefix="gefen-interrupt-") as tmp:
            if at.endswith("%"):
                r = interrupt_run(Path(tmp), None, after_tests=float(at[:-1]) / 100)
            else:
                r = interrupt_run(Path(tmp), float(at))
        executed = r["run"]["executed_tests"] if r["run"] else "-"
        cert = ",".join(r["certificates"]) or "(none: no test had finished)"
        print(
            f"{at:>4}  {r['signalled_at_s']:4.1f}  {r['exit']!s:4}  {r['stopped_after_s']:15.1f}  "
            f"{r['lines']:5d}  {cert:43}  "
            f"{r['verdict']!s:10}  {executed!s:8}  {len(r['left'])}"
        )
        for pid, cmd in r["left"]:
            print(f"      left: {pid} {cmd[:120]}")
        if r["exit"] in (0, None) or r["left"] or r["verdict"] not in (None, "incomplete"):
            worst = 1
    return worst


if __name__ == "__main__":
    sys.exit(main())

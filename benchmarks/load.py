"""Oversubscribe this machine's CPUs on purpose: N busy processes per core, bounded in time.

    python benchmarks/load.py --per-core 4 --seconds 900 -- COMMAND [ARGS...]   # COMMAND under load
    python benchmarks/load.py --per-core 8 --seconds 60                         # only the load

Each busy process spins in pure Python (one thread, no I/O) and is bounded three ways, so none
outlives what started it: it stops at its own deadline (``--seconds`` after the start, checked
every few milliseconds), when its parent is gone (Linux ``PR_SET_PDEATHSIG`` plus a parent check
in the loop), and when :class:`Oversubscribed` (or this script) ends, which SIGKILLs and reaps
them on every exit path (a normal end, an exception, Ctrl-C, SIGTERM). They run in a session of
their own, so a Ctrl-C aimed at COMMAND's process group does not reach them.

With COMMAND the script prints the load it applied and the load averages before and after, and
exits with COMMAND's status. :class:`Oversubscribed` is the same as a context manager, for the
project's slow tests and for ``benchmarks/load_proof.py``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

_SPIN = r"""
import ctypes, os, sys, time
deadline, parent = float(sys.argv[1]), int(sys.argv[2])
try:
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    pass
x = 0
while time.time() < deadline and os.getppid() == parent:
    for _ in range(20000):
        x += 1
"""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class Oversubscribed:
    """``per_core`` busy processes per usable CPU for at most ``seconds`` (see the module docstring)."""

    def __init__(self, per_core: float, seconds: float, cpus: int | None = None) -> None:
        if per_core < 0 or not seconds > 0:
            raise ValueError(f"per_core must be >= 0 and seconds > 0, got {per_core}, {seconds}")
        self.cpus = cpus or usable_cpus()
        self.count = int(round(per_core * self.cpus))
        self.per_core = per_core
        self.seconds = seconds
        self.processes: list[subprocess.Popen] = []

    def describe(self) -> str:
        return (
            f"{self.count} busy processes ({self.per_core:g} per core on {self.cpus} CPUs), "
            f"each bounded to {self.seconds:g} s"
        )

    def __enter__(self) -> Oversubscribed:
        deadline = time.time() + self.seconds
        try:
            for _ in range(self.count):
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _SPIN, repr(deadline), str(os.getpid())],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                try:
                    process.kill()
                except OSError:
                    pass
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.processes = []


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-core", type=float, required=True, help="busy processes per usable CPU")
    parser.add_argument(
        "--seconds", type=float, default=900.0, help="bound on every busy process (default 900)"
    )
    args = parser.parse_args(argv)

    def stop_on(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop_on)
    load = Oversubscribed(args.per_core, args.seconds)
    print(f"load: {load.describe()}; load average before: {_loadavg()}", flush=True)
    started = time.monotonic()
    with load:
        if command:
            child = subprocess.Popen(command)
            try:
                status = child.wait()
            except KeyboardInterrupt:
                status = child.wait()
        else:
            try:
                time.sleep(args.seconds)
            except KeyboardInterrupt:
                pass
            status = 0
        print(
            f"load: {load.alive()} of {load.count} busy processes still running after "
            f"{time.monotonic() - started:.1f} s; load average: {_loadavg()}",
            flush=True,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())

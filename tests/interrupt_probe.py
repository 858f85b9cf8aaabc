"""Interrupt a certification the way a user does, and report what was left behind.

Used by tests/test_plugin_interrupt.py and benchmarks/interrupt_stop.py. The run (``python -m pytest``) is
started in
a session of its own (so every process it starts can be found by session id), with SIGINT and
SIGTERM at their defaults (a background shell starts children with SIGINT ignored), and the signal
goes to its whole process group, as Ctrl-C in a terminal does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def default_signals() -> None:
    """In the child before it execs: Ctrl-C and SIGTERM as a terminal's program gets them (a shell
    that runs this in the background starts its children with SIGINT ignored, and Python keeps an
    ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process in session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != sid:
                continue
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie is already dead; its parent has not reaped it yet
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ProcessLookupError):
            continue
        found.append((int(entry.name), cmd))
    return found


# the plugin's line after each module: "gefen: test_x.py done, 4 tests in 0.6 s; 10 of 141 tests in 3.6 s,
# ..."
PROGRESS = re.compile(r"^gefen: .* done, .*; (\d+) of (\d+) tests in ", re.MULTILINE)


def tests_done(text: str) -> float:
    """The fraction of the run's tests its progress lines say have finished (0.0 before the first)."""
    last = None
    for last in PROGRESS.finditer(text):  # noqa: B007 - the last match is wanted
        pass
    return int(last[1]) / int(last[2]) if last else 0.0


def interrupt_run(
    workdir: Path,
    at_s: float | None,
    args=("--impl=reference",),
    signum=signal.SIGINT,
    to_group: bool = True,
    stop_within_s: float = 120.0,
    env=None,
    after_tests: float | None = None,
) -> dict:
    """Start ``pytest ARGS`` in ``workdir``, send ``signum`` ``at_s`` seconds later (or, with
    ``after_tests``, once the run's progress lines say that fraction of its tests has finished: a
    point inside the run however fast the machine is), and report: exit status, seconds from the
    signal to the exit and to the moment no process of the run was left, output lines, the
    certificate's verdict, and the processes of the run still alive 10 s after it exited (each is
    then killed)."""
    if (at_s is None) == (after_tests is None):
        raise ValueError("interrupt_run: give exactly one of at_s and after_tests")
    workdir = Path(workdir)
    log = workdir / "output.txt"
    # unbuffered, so whatever the run printed before the signal is in the log however it left
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            preexec_fn=default_signals,
        )
        sid = proc.pid
        try:
            while proc.poll() is None:
                if at_s is not None and time.monotonic() - started >= at_s:
                    break
                if after_tests is not None and tests_done(log.read_text(errors="replace")) >= after_tests:
                    break
                time.sleep(0.05)
            signalled = time.monotonic()
            finished_first = proc.poll() is not None
            if not finished_first:
                (os.killpg if to_group else os.kill)(proc.pid, signum)
            try:
                code = proc.wait(timeout=stop_within_s)
            except subprocess.TimeoutExpired:
                code = None
            stopped_after = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    left = session_processes(sid)
    deadline = time.monotonic() + 10.0
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = session_processes(sid)
    gone_after = time.monotonic() - signalled if not left else None
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    certificates = sorted(workdir.glob("gefen-certificate-*.json"))
    cert = json.loads(certificates[-1].read_text()) if certificates else None
    text = log.read_text(errors="replace")
    return {
        "at_s": at_s,
        "after_tests": after_tests,
        "signalled_at_s": round(signalled - started, 1),
        "exit": code,
        "finished_before_signal": finished_first,
        "stopped_after_s": round(stopped_after, 1),
        "gone_after_s": None if gone_after is None else round(gone_after, 1),
        "lines": len(text.splitlines()),
        "left": left,
        "certificates": [c.name for c in certificates],
        "verdict": cert["verdict"] if cert else None,
        "run": cert["run"] if cert else None,
        "output": text,
    }

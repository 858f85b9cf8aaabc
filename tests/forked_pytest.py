"""Partial certifications in forks of a warm interpreter, for the proofs.

A proof runs the suite in a fresh pytest process (``mutant_tools.run_suite``), a few hundred times
in ``.ci/run``. Most of a short run is the interpreter importing torch, numpy and hypothesis
(about 5 of 8 seconds on a 2-core machine). :class:`ForkedPytest` keeps one process that has
imported those libraries and nothing of this project, and forks it once per run: the child is a
fresh pytest session (the project's modules, the suite and the implementation under test are
imported by the child, with pytest's assertion rewriting, as a new process imports them), its
output goes to files, and its exit status comes back. Nothing a child does reaches the next one.

A run falls back to a plain subprocess where forking cannot stand in for one: another interpreter
than this one, an environment that differs in what the preloaded libraries read at import
(``TORCH*``, ``OMP_*``, ``MKL_*``, ``CUDA*``, ``HYPOTHESIS*``, ``PYTHON*`` but ``PYTHONPATH``), a
platform without ``fork``, or ``GEFEN_TEST_NO_FORK=1``.

Bounds: a run past its timeout has its process group killed and raises
:class:`subprocess.TimeoutExpired`, as ``subprocess.run`` does. The server dies with the test
process that started it (Linux's parent-death signal) and each child with the server; a server
that breaks is replaced by plain subprocesses for the rest of the session.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Environment prefixes the preloaded libraries read when they are imported.
_IMPORT_TIME_ENV = ("TORCH", "OMP_", "MKL_", "CUDA", "HYPOTHESIS", "PYTHON")
_PRELOADED = ("numpy", "torch", "torch.distributed.checkpoint", "hypothesis", "pytest", "safetensors")

_SERVER = r"""
import ctypes, json, os, signal, sys
try:  # die with the test process that started this server
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except OSError:
    pass
import importlib
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
import gc
gc.freeze()  # the preloaded objects: a child's collections (pytest runs several at exit) skip them
sys.stdout.write("ready\n"); sys.stdout.flush()
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.path[:0] = request["path"]
            for fd, name in ((1, "out"), (2, "err")):
                target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            sys.argv = ["pytest", *request["args"]]
            import pytest
            code = pytest.main(request["args"])
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(int(code))
    sys.stdout.write(json.dumps({"pid": pid}) + "\n"); sys.stdout.flush()
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n"); sys.stdout.flush()
"""


def _import_time_env(env: dict) -> dict:
    return {
        k: v
        for k, v in env.items()
        if k.startswith(_IMPORT_TIME_ENV) and k not in ("PYTHONPATH", "PYTHONHASHSEED")
    }


class ForkedPytest:
    """``pytest ARGS`` in a fork of a warm interpreter: see the module's docstring."""

    def __init__(self) -> None:
        self._server: subprocess.Popen | None = None
        self._env: dict | None = None
        self._broken = os.environ.get("GEFEN_TEST_NO_FORK") == "1" or not hasattr(os, "fork")

    def _start(self) -> subprocess.Popen | None:
        if self._broken:
            return None
        if self._server is not None and self._server.poll() is None:
            return self._server
        self._env = dict(os.environ)
        try:
            server = subprocess.Popen(
                [sys.executable, "-c", _SERVER, json.dumps(_PRELOADED)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            if not _readline(server, 120.0) == "ready":
                raise RuntimeError("the fork server did not start")
        except (OSError, RuntimeError, ValueError):
            self._broken = True
            return None
        self._server = server
        return server

    def run(self, args: list[str], *, cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
        server = self._start()
        if server is None or _import_time_env(env) != _import_time_env(self._env or {}):
            return _subprocess(args, cwd=cwd, env=env, timeout=timeout)
        with tempfile.TemporaryDirectory(prefix="forked-pytest-") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            request = {
                "args": args,
                "cwd": str(cwd),
                "env": env,
                "path": path,
                "out": str(out),
                "err": str(err),
            }
            try:
                server.stdin.write(json.dumps(request) + "\n")
                server.stdin.flush()
                pid = json.loads(_readline(server, 30.0))["pid"]
            except (OSError, ValueError, RuntimeError):
                self._broken = True
                return _subprocess(args, cwd=cwd, env=env, timeout=timeout)
            try:
                status = json.loads(_readline(server, timeout))["status"]
            except RuntimeError:
                _kill_group(pid)
                _readline(server, 30.0)  # the server reaps the killed child
                raise subprocess.TimeoutExpired(args, timeout, out.read_text(), err.read_text()) from None
            except KeyboardInterrupt:
                _kill_group(pid)
                raise
            return subprocess.CompletedProcess(args, status, out.read_text(), err.read_text())


def _readline(server: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"no answer from the fork server in {timeout} s")
        ready, _, _ = select.select([server.stdout], [], [], left)
        if ready:
            line = server.stdout.readline()
            if not line:
                raise RuntimeError("the fork server exited")
            return line.strip()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _subprocess(args: list[str], *, cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: One server per test process (each xdist worker has its own).
FORKED = ForkedPytest()

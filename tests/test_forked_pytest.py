"""The proofs' forked pytest runs (tests/forked_pytest.py) stand in for subprocesses: the same exit
status and output, a fresh session each time, a bound that kills the run, and a fallback."""

from __future__ import annotations

import os
import subprocess

import pytest

from .forked_pytest import ForkedPytest

SAMPLE = """
import os, sys
SEEN = []

def test_fresh_session():
    SEEN.append(1)
    assert SEEN == [1]  # a module imported by an earlier run would remember
    assert os.environ["FORKED_SAMPLE"] == "yes"

def test_fails():
    assert 1 + 1 == 3

def test_hangs():
    if os.environ.get("FORKED_HANG"):
        import time
        open(os.environ["FORKED_HANG"], "w").write(str(os.getpid()))
        time.sleep(600)
"""


@pytest.fixture(scope="module")
def runner():
    forked = ForkedPytest()
    yield forked
    if forked._server is not None:
        forked._server.kill()


def test_a_forked_run_is_a_fresh_pytest_session(runner, tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = dict(os.environ, FORKED_SAMPLE="yes")
    args = ["-q", "-p", "no:cacheprovider", "test_sample.py"]
    for _ in range(2):
        result = runner.run(args, cwd=tmp_path, env=env, timeout=120)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "1 failed, 2 passed" in result.stdout
        assert "assert (1 + 1) == 3" in result.stdout  # rewritten by pytest in the child
    assert runner._server is not None and runner._server.poll() is None  # it was forked, not spawned


def test_a_run_past_its_bound_is_killed(runner, tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    pid_file = tmp_path / "pid"
    env = dict(os.environ, FORKED_SAMPLE="yes", FORKED_HANG=str(pid_file))
    with pytest.raises(subprocess.TimeoutExpired):
        runner.run(["-q", "-p", "no:cacheprovider", "test_sample.py"], cwd=tmp_path, env=env, timeout=8)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # the server still serves
    result = runner.run(
        ["-q", "-p", "no:cacheprovider", "test_sample.py", "-k", "fresh"],
        cwd=tmp_path,
        env=dict(os.environ, FORKED_SAMPLE="yes"),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout


def test_an_environment_the_preloaded_libraries_read_gets_a_subprocess(runner, tmp_path, monkeypatch):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    spawned = []
    monkeypatch.setattr(
        "tests.forked_pytest._subprocess",
        lambda args, **kw: spawned.append(args) or subprocess.CompletedProcess(args, 0, "", ""),
    )
    runner.run(["-q", "test_sample.py"], cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="7"), timeout=60)
    assert spawned == [["-q", "test_sample.py"]]

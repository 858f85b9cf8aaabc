"""Tests of the multi-rank harness ``gefen_conformance.harness.pool``.

Scenario functions are module-level so that the worker processes can unpickle them by reference.
Every failure test also checks that no process of the failed call survives it.
"""

from __future__ import annotations

import ctypes
import multiprocessing.resource_tracker
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gefen_conformance.harness import deadlines
from gefen_conformance.harness.pool import RankFailure, RankOutcome, run_on_ranks
from gefen_conformance.harness.pool import caller as pool_caller
from gefen_conformance.harness.pool import processes as pool_processes

from .interrupt_probe import default_signals
from .support import deadline_wall_s

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()) or not sys.platform.startswith("linux"),
    reason="the rank harness needs torch.distributed with gloo, on Linux",
)

REPO_ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# process bookkeeping (no psutil here: /proc is enough on Linux)
# --------------------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _descendants(root: int | None = None) -> set[int]:
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] not in ("Z", "X"):
                children.setdefault(stat[1], []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _assert_no_strays(before: set[int], outcomes: list[RankOutcome]) -> None:
    """After a failed call: its failed ranks' processes are gone, and every process that
    appeared during the call is a warm idle worker or one of multiprocessing's own helpers (the
    fork server and the resource tracker, started with the first call of the process)."""
    for outcome in outcomes:
        if not outcome.ok:
            assert outcome.pid is not None
            assert not _alive(outcome.pid), f"rank {outcome.rank} (pid {outcome.pid}) survived"
    tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    allowed = set(pool_caller._idle_worker_pids()) | {pool_caller._fork_server_pid(), tracker}
    strays = _descendants() - before - allowed
    assert not strays, f"stray processes after the call: {sorted(strays)}"


def _outcomes(fn, world_size, **kwargs) -> list[RankOutcome]:
    """``run_on_ranks(..., allow_failure=True)``, then the no-strays check."""
    before = _descendants()
    outcomes = run_on_ranks(fn, world_size, allow_failure=True, **kwargs)
    _assert_no_strays(before, outcomes)
    return outcomes


def _expect_failure(fn, world_size, **kwargs) -> tuple[RankFailure, float]:
    before = _descendants()
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_on_ranks(fn, world_size, **kwargs)
    elapsed = time.monotonic() - start
    _assert_no_strays(before, info.value.outcomes)
    return info.value, elapsed


# --------------------------------------------------------------------------------------------
# scenario functions (run inside the ranks)
# --------------------------------------------------------------------------------------------


def _identity_and_sum(tag):
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    gathered = [None] * world
    dist.all_gather_object(gathered, rank * 10)
    dist.barrier()
    return {
        "rank": rank,
        "world": world,
        "sum": total.item(),
        "gathered": gathered,
        "threads": torch.get_num_threads(),
        "env": (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"]),
        "backend": dist.get_backend(),
        "tag": tag,
    }


def _pid():
    return os.getpid()


def _echo(*args, **kwargs):
    return dist.get_rank(), args, kwargs, os.environ.get("GEFEN_RANKS_TEST_CALLER")


def _print_and_return():
    print(f"hello from rank {dist.get_rank()}")
    return dist.get_rank()


def _mutate_state():
    before = {
        "env": os.environ.get("GEFEN_RANKS_TEST_MARK"),
        "dtype": str(torch.get_default_dtype()),
        "grad": torch.is_grad_enabled(),
        "rand": torch.rand(3).tolist(),  # unseeded: a fresh random stream per rank and call
    }
    os.environ["GEFEN_RANKS_TEST_MARK"] = "dirty"
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.rand(100)
    return before


def _rank1_raises_rank0_in_collective():
    if dist.get_rank() == 1:
        raise ValueError("rank one is broken")
    dist.all_reduce(torch.ones(1))
    return "unreachable"


def _failure_agreement():
    """The collective-failure-agreement pattern: every rank learns that some rank failed."""
    local_error = ValueError("bad shard on rank 1") if dist.get_rank() == 1 else None
    flag = torch.tensor([int(local_error is not None)], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if local_error is not None:
        raise local_error
    if flag.item():
        raise RuntimeError("another rank failed")
    return "ok"


def _exit_mid_collective():
    value = torch.ones(8)
    dist.all_reduce(value)
    if dist.get_rank() == 1:
        os._exit(3)
    dist.all_reduce(value)
    dist.all_reduce(value)
    return "unreachable"


def _nap_forever_on_rank_1():
    if dist.get_rank() == 1:
        _gefen_test_nap()
    dist.all_reduce(torch.ones(1))  # rank 0 waits for rank 1 until the gloo timeout
    return "unreachable"


def _gefen_test_nap():
    time.sleep(600)


def _rank1_raises_rank0_sleeps():
    if dist.get_rank() == 1:
        # a process the scenario started itself must not outlive the failed call either
        child = subprocess.Popen(["sleep", "600"])
        raise KeyError(f"rank 1 gave up; grandchild {child.pid}")
    _gefen_test_nap()


def _segfault():
    ctypes.string_at(0)


class _UnpicklableError(Exception):
    def __init__(self, code, detail):  # unpickling calls cls(*args) with one arg: it breaks
        super().__init__(f"code {code}: {detail}")
        self.code = code


def _unpicklable_outcomes():
    if dist.get_rank() == 0:
        raise _UnpicklableError(7, "custom exception that cannot be unpickled")
    return lambda: None  # a return value that cannot be pickled


# --------------------------------------------------------------------------------------------
# happy paths
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_results_per_rank_and_collectives(world_size):
    results = run_on_ranks(_identity_and_sum, world_size, args=("t",))
    expected_sum = world_size * (world_size + 1) / 2
    assert [r["rank"] for r in results] == list(range(world_size))
    for rank, result in enumerate(results):
        assert result["world"] == world_size
        assert result["sum"] == expected_sum
        assert result["gathered"] == [10 * r for r in range(world_size)]
        assert result["threads"] == 1
        assert result["env"] == (str(rank), str(world_size), "127.0.0.1")
        assert result["backend"] == "gloo"
        assert result["tag"] == "t"


def test_args_kwargs_environment_and_outcomes_on_success(monkeypatch):
    monkeypatch.setenv("GEFEN_RANKS_TEST_CALLER", "seen")  # the caller's env as of the call
    assert run_on_ranks(_echo, 2, args=(1, "a"), kwargs={"k": [3]}) == [
        (0, (1, "a"), {"k": [3]}, "seen"),
        (1, (1, "a"), {"k": [3]}, "seen"),
    ]
    outcomes = run_on_ranks(_print_and_return, 2, allow_failure=True)
    assert [(o.rank, o.status, o.value) for o in outcomes] == [(0, "ok", 0), (1, "ok", 1)]
    assert "hello from rank 1" in outcomes[1].output


def test_warm_workers_are_reused_and_reset():
    first = run_on_ranks(_pid, 2)
    start = time.monotonic()
    second = run_on_ranks(_pid, 2)
    overhead = time.monotonic() - start
    print(f"warm 2-rank call overhead: {overhead * 1000:.1f} ms")
    assert set(second) == set(first), "warm workers were not reused"
    assert overhead < 5.0  # generous on purpose; benchmarks/rank_harness.py measures the figure

    one = run_on_ranks(_mutate_state, 2)
    two = run_on_ranks(_mutate_state, 2)
    clean = {"env": None, "dtype": "torch.float32", "grad": True}
    for result in one + two:  # env, dtype and grad mode were reset between the calls
        assert {k: v for k, v in result.items() if k != "rand"} == clean
    draws = [tuple(result["rand"]) for result in one + two]
    assert len(set(draws)) == 4  # no two ranks, or calls, share a random stream


def test_bad_arguments_fail_in_the_caller():
    with pytest.raises(TypeError, match="picklable"):
        run_on_ranks(lambda: 1, 2)
    with pytest.raises(ValueError, match="world_size"):
        run_on_ranks(_pid, 0)
    with pytest.raises(ValueError, match="timeout"):
        run_on_ranks(_pid, 1, timeout=0)


# --------------------------------------------------------------------------------------------
# failures
# --------------------------------------------------------------------------------------------


def test_one_rank_raises():
    failure, elapsed = _expect_failure(_rank1_raises_rank0_in_collective, 2, timeout=30)
    rank0, rank1 = failure.outcomes
    assert rank1.status == "raised"
    assert rank1.exc_type == "ValueError"
    assert rank1.message == "rank one is broken"
    assert "_rank1_raises_rank0_in_collective" in rank1.traceback
    assert "ValueError: rank one is broken" in rank1.traceback
    assert isinstance(rank1.exception, ValueError)
    # rank 0 was blocked in all_reduce with rank 1; it fails fast instead of hanging
    assert rank0.status == "raised"
    assert "all_reduce" in rank0.traceback
    assert elapsed < 10
    text = str(failure)
    assert "rank 0: raised" in text and "rank 1: raised ValueError: rank one is broken" in text
    assert text.count("Traceback (most recent call last)") == 2

    # the failed workers were discarded: the next call runs on other processes
    fresh = run_on_ranks(_pid, 2)
    assert not set(fresh) & {rank0.pid, rank1.pid}


def test_allow_failure_reports_each_ranks_error():
    outcomes = _outcomes(_failure_agreement, 2, timeout=30)
    assert [o.status for o in outcomes] == ["raised", "raised"]
    assert (outcomes[0].exc_type, outcomes[0].message) == ("RuntimeError", "another rank failed")
    assert (outcomes[1].exc_type, outcomes[1].message) == ("ValueError", "bad shard on rank 1")


def test_rank_exit_mid_collective_is_reported_as_died():
    failure, elapsed = _expect_failure(_exit_mid_collective, 3, timeout=20)
    statuses = {o.rank: o.status for o in failure.outcomes}
    assert statuses == {0: "raised", 1: "died", 2: "raised"}  # nobody hung
    died = failure.outcomes[1]
    assert died.exitcode == 3
    assert "exit code 3" in died.message
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert "rank 1: died (exit code 3)" in str(failure)


def test_hung_rank_is_dumped_and_killed_at_the_deadline():
    timeout = 5.0  # gloo timeout 2.5 s: rank 0 reports well before the deadline, even on a busy machine
    failure, elapsed = _expect_failure(_nap_forever_on_rank_1, 2, timeout=timeout)
    rank0, rank1 = failure.outcomes
    # rank 0 gives up at the gloo timeout, which is shorter than the deadline
    assert rank0.status == "raised", str(failure)
    assert rank1.status == "hung"
    assert "deadline" in rank1.message
    assert "_gefen_test_nap" in rank1.traceback  # the faulthandler dump names the sleeper
    assert "_nap_forever_on_rank_1" in rank1.traceback
    assert rank1.exitcode == -signal.SIGKILL
    # the stated bound (SPEC 4.2.10): the deadline, stretched by the machine's load at most
    # MAX_STRETCH times, then at most the dump wait (2 s, stretched alike) and the reaping
    wall = deadline_wall_s(rank1.message, timeout)
    assert timeout <= wall <= timeout * deadlines.MAX_STRETCH * 1.05, rank1.message
    assert timeout <= elapsed < wall + 2 * deadlines.settled_stretch() + 3, (
        f"took {elapsed:.1f} s: {rank1.message}"
    )
    assert "rank 1: hung" in str(failure) and "_gefen_test_nap" in str(failure)


def test_stragglers_are_killed_after_the_failure_grace():
    failure, elapsed = _expect_failure(_rank1_raises_rank0_sleeps, 2, timeout=30, failure_grace=0.5)
    rank0, rank1 = failure.outcomes
    assert (rank1.status, rank1.exc_type) == ("raised", "KeyError")
    grandchild = int(rank1.message.rstrip("'").rsplit(" ", 1)[1])
    assert _wait_gone([grandchild], 2.0) == []
    assert rank0.status == "hung"
    assert "after rank 1 failed" in rank0.message
    assert "_gefen_test_nap" in rank0.traceback
    assert elapsed < 10, f"took {elapsed:.1f} s"


def test_segfault_is_reported_as_died_with_a_stack():
    failure, _ = _expect_failure(_segfault, 1, timeout=20)
    (outcome,) = failure.outcomes
    assert outcome.status == "died"
    assert outcome.exitcode == -signal.SIGSEGV
    assert "Segmentation fault" in outcome.traceback
    assert "_segfault" in outcome.traceback


def test_unpicklable_exception_and_result_still_report_text():
    rank0, rank1 = _outcomes(_unpicklable_outcomes, 2, timeout=30)
    assert rank0.status == "raised"
    assert rank0.exc_type.endswith("_UnpicklableError")
    assert rank0.message == "code 7: custom exception that cannot be unpickled"
    assert "raise _UnpicklableError" in rank0.traceback
    assert rank0.exception is None
    assert rank1.status == "raised"
    assert "not picklable" in rank1.message


# --------------------------------------------------------------------------------------------
# the caller is interrupted, then dies
# --------------------------------------------------------------------------------------------

_CALLER_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from gefen_conformance.harness.pool import run_on_ranks

    def sleeper(pid_dir):
        import torch.distributed as dist
        path = os.path.join(pid_dir, f"{dist.get_rank()}.pid")
        with open(path + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(600)

    def getpid():
        return os.getpid()

    if __name__ == "__main__":
        first, second = sys.argv[1], sys.argv[2]
        try:
            run_on_ranks(sleeper, 2, args=(first,), timeout=120)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        print("WARM", *run_on_ranks(getpid, 3), flush=True)
        run_on_ranks(sleeper, 2, args=(second,), timeout=120)
    """
)


# Waits for something the test needs to happen (ranks started, a line printed), not bounds under test:
# generous, since on an oversubscribed machine spawning ranks that import torch takes minutes.
WAIT_S = 600.0


def _wait_for_pids(directory: Path, count: int, proc, limit: float = WAIT_S) -> list[int]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        files = sorted(directory.glob("*.pid"))
        if len(files) == count:
            return [int(f.read_text()) for f in files]
        assert proc.poll() is None, f"caller exited early with {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"ranks did not start within {limit} s")


class _LineReader:
    """Collects a subprocess's stdout lines in a thread, so waiting for one can time out."""

    def __init__(self, stream) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def wait_for(self, prefix: str, limit: float = WAIT_S) -> str:
        deadline = time.monotonic() + limit
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} line within {limit} s; got {self.seen}") from None
            self.seen.append(line)
            if line.startswith(prefix):
                return line.strip()


def _wait_gone(pids, limit: float) -> list[int]:
    """The pids still alive after ``limit`` quiet seconds on the load clock (SPEC 4.2.10): a busy
    machine delays a dying process's exit, not the property."""
    deadline = deadlines.Deadline(limit, scaled=False)
    while not deadline.expired() and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def test_interrupted_or_killed_caller_leaves_no_workers(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(_CALLER_SCRIPT)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    pythonpath = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    # the killed caller cannot remove its pool's temp dir: keep it inside tmp_path
    env = dict(os.environ, PYTHONPATH=pythonpath, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(first), str(second)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as a terminal's program gets it, even when this run's SIGINT is ignored
        preexec_fn=default_signals,
    )
    reader = _LineReader(proc.stdout)
    try:
        # 1. Ctrl-C while two ranks sleep: both are killed before KeyboardInterrupt propagates
        busy = _wait_for_pids(first, 2, proc)
        proc.send_signal(signal.SIGINT)
        reader.wait_for("INTERRUPTED")
        assert _wait_gone(busy, 1.0) == []
        # 2. the caller dies (SIGKILL) while one warm worker idles and two ranks sleep
        warm = [int(pid) for pid in reader.wait_for("WARM ").split()[1:]]
        busy = _wait_for_pids(second, 2, proc)
        server = {pid for pid in _descendants(proc.pid) if pid not in warm + busy}
        proc.kill()
        proc.wait(10)
        assert _wait_gone(set(warm) | set(busy) | server, 10.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_stale_pool_dirs_of_dead_owners_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(pool_processes.tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid now belongs to no process
    stale = tmp_path / f"gefen-ranks-{dead.pid}-abc"
    alive = tmp_path / f"gefen-ranks-{os.getpid()}-abc"
    foreign = tmp_path / "gefen-ranks-abc123"  # no owner pid in the name: never touched
    for path in (stale, alive, foreign):
        path.mkdir()
    pool_processes.remove_stale_pool_dirs()
    assert not stale.exists() and alive.exists() and foreign.exists()

"""Tests of the thread launcher ``gefen_conformance.harness.threads`` (SPEC 4.2.12): N ranks as threads of one
hosting pool worker, on torch's threaded process group.

Rank bodies are module-level so that the hosting worker can unpickle them by reference.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gefen_conformance.harness import deadlines, launch, threads, world
from gefen_conformance.harness.outcomes import RankFailure
from gefen_conformance.implementations.contract import Implementation

from .interrupt_probe import default_signals
from .support import deadline_wall_s

REPO_ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    threads.unfit(2) is not None or not sys.platform.startswith("linux"),
    reason=f"the thread launcher does not run here: {threads.unfit(2)}",
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")


def _wait_gone(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


# ------------------------------------------------------------------------------ rank bodies


def _identity_and_sum(tag: str):
    here = world.current()
    total = torch.tensor([float(here.rank)])
    dist.all_reduce(total, group=here.group)
    gathered = [None] * here.size
    dist.all_gather_object(gathered, here.rank, group=here.group)
    print(f"rank {here.rank} says {tag}")
    return {
        "rank": here.rank,
        "size": here.size,
        "sum": float(total),
        "gathered": gathered,
        "coordinate": here.mesh.get_coordinate(),
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
    }


def _gefen_thread_raiser():
    raise ValueError("rank 3 is broken on purpose")


def _rank3_raises_others_reduce():
    here = world.current()
    if here.rank == 3:
        _gefen_thread_raiser()
    dist.all_reduce(torch.ones(1), group=here.group)
    return os.getpid()


def _gefen_thread_nap():
    while True:
        time.sleep(0.05)


def _rank1_naps_others_reduce():
    here = world.current()
    if here.rank == 1:
        _gefen_thread_nap()
    dist.all_reduce(torch.ones(1), group=here.group)


def _rank2_dies():
    here = world.current()
    if here.rank == 2:
        here.die(3)
    dist.barrier(group=here.group)


def _gefen_thread_backtrack():
    # exponential backtracking inside the re module, which never releases the GIL
    return re.match(r"(a|aa)+$", "a" * 64 + "b")


def _rank1_holds_the_gil():
    here = world.current()
    if here.rank == 1:
        _gefen_thread_backtrack()
    dist.barrier(group=here.group)


def _write_pid_and_nap(path: str):
    if world.current().rank == 0:
        Path(path).write_text(str(os.getpid()))
    _gefen_thread_nap()


def _thread_name():
    return threading.current_thread().name


_INTERRUPTED_CALLER = """
import sys
from gefen_conformance.harness import threads
from tests.test_thread_launcher import _write_pid_and_nap

if __name__ == "__main__":
    try:
        threads.run_on_threads(_write_pid_and_nap, 4, (sys.argv[1],), timeout=300)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
"""


# ------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("world_size", [1, 8, 64])
def test_n_thread_ranks_run_real_collectives_in_one_process(world_size, capsys):
    values = threads.run_on_threads(_identity_and_sum, world_size, ("hello",))
    assert [v["rank"] for v in values] == list(range(world_size))
    expected_sum = float(sum(range(world_size)))
    for rank, value in enumerate(values):
        assert value["size"] == world_size
        assert value["sum"] == expected_sum
        assert value["gathered"] == list(range(world_size))
        assert list(value["coordinate"]) == [rank]  # each thread's World and mesh are its own
        assert value["thread"] == f"gefen-thread-rank-{rank}"
    assert len({v["pid"] for v in values}) == 1 and values[0]["pid"] != os.getpid()
    echoed = capsys.readouterr().out
    assert f"[rank {world_size - 1}] rank {world_size - 1} says hello" in echoed  # output per rank


def test_a_ranks_traceback_reaches_the_report_and_its_peers_are_released():
    start = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        threads.run_on_threads(_rank3_raises_others_reduce, 6, timeout=60)
    elapsed = time.monotonic() - start
    failure = caught.value
    rank3 = failure.outcomes[3]
    assert (rank3.status, rank3.exc_type) == ("raised", "ValueError")
    assert "_gefen_thread_raiser" in rank3.traceback and "broken on purpose" in rank3.message
    # the peers blocked in all_reduce are released at once by the aborted group, not at a timeout
    for outcome in failure.outcomes:
        if outcome.rank != 3:
            assert outcome.status == "raised", str(failure)
            assert "aborted: rank 3 failed" in outcome.message, outcome.message
            assert "all_reduce" in outcome.traceback
    assert "rank 3: raised ValueError" in str(failure) and "_gefen_thread_raiser" in str(failure)
    assert elapsed < 20, f"took {elapsed:.1f} s"
    host = rank3.pid
    assert host is not None and _wait_gone(host, 5.0), "the hosting worker outlived a failed call"


def test_a_hung_rank_is_reported_with_its_stack_and_its_process_ended_within_the_bound():
    timeout, pg_timeout = 6.0, 2.0
    start = time.monotonic()
    outcomes = threads.run_on_threads(
        _rank1_naps_others_reduce,
        4,
        timeout=timeout,
        pg_timeout=pg_timeout,
        failure_grace=1.0,
        allow_failure=True,
    )
    elapsed = time.monotonic() - start
    hung = outcomes[1]
    assert hung.status == "hung", outcomes
    assert "_gefen_thread_nap" in hung.traceback and "_rank1_naps_others_reduce" in hung.traceback
    # the others waited in all_reduce for rank 1 and gave up at the process-group timeout
    for outcome in (outcomes[0], outcomes[2], outcomes[3]):
        assert outcome.status == "raised", outcome.message
        assert "process-group timeout for rank(s) 1" in outcome.message, outcome.message
    # the bound: rank 1 stays "hung" only until the others failed plus the failure grace, never
    # past the deadline stretched by the load; then the host reports and its worker exits
    wall = deadline_wall_s(hung.message, timeout)
    assert elapsed < wall * 1.05 + 3 * deadlines.settled_stretch() + 5, (
        f"took {elapsed:.1f} s: {hung.message}"
    )
    assert _wait_gone(hung.pid, 5.0), "the hung rank's process was not ended"


def test_a_rank_that_dies_is_reported_as_died_with_its_exit_code():
    outcomes = threads.run_on_threads(_rank2_dies, 3, timeout=30, allow_failure=True)
    assert (outcomes[2].status, outcomes[2].exitcode) == ("died", 3)
    assert [o.status for o in (outcomes[0], outcomes[1])] == ["raised", "raised"]


def test_too_many_ranks_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="at most 256"):
        threads.run_on_threads(_identity_and_sum, threads.MAX_THREAD_RANKS + 1, ("x",))
    with launch.using(threads.ThreadLauncher()):
        assert launch.execution().launcher == "threads"
        assert launch.unfit_reason(threads.MAX_THREAD_RANKS + 1) is not None
        values = launch.run(_identity_and_sum, 2, ("via launch",))
    assert [v["rank"] for v in values] == [0, 1]


def test_thread_safety_is_a_boolean_flag_of_an_implementation():
    def make(params, **hypers):
        return None

    assert Implementation(name="x", version="0", make_optimizer=make).thread_safe
    assert not Implementation(name="x", version="0", make_optimizer=make, thread_safe=False).thread_safe
    with pytest.raises(TypeError, match="thread_safe"):
        Implementation(name="x", version="0", make_optimizer=make, thread_safe="no")


@pytest.mark.slow  # the deadline, the host's margin and the dump wait, stretched by the load
def test_a_rank_that_never_lets_go_of_the_gil_has_its_host_killed_and_every_rank_reported():
    start = time.monotonic()
    outcomes = threads.run_on_threads(_rank1_holds_the_gil, 3, timeout=2.0, allow_failure=True)
    elapsed = time.monotonic() - start
    # the host could not report: the pool killed it after the deadline and its margin, with every
    # thread's stack dumped, and each rank carries that dump
    assert [o.status for o in outcomes] == ["hung"] * 3, outcomes
    assert all("_gefen_thread_backtrack" in o.traceback for o in outcomes)
    assert outcomes[0].message.startswith("the process hosting the 3 thread ranks")
    bound = (2.0 + threads.HOST_MARGIN_S) * deadlines.MAX_STRETCH
    assert elapsed < bound, f"took {elapsed:.1f} s"
    assert _wait_gone(outcomes[0].pid, 5.0)


def test_ctrl_c_in_the_caller_ends_the_hosting_process(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(_INTERRUPTED_CALLER)
    pid_file = tmp_path / "host.pid"
    pythonpath = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, str(script), str(pid_file)],
        env=dict(os.environ, PYTHONPATH=pythonpath, TMPDIR=str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_signals,  # Ctrl-C as a terminal's program gets it
    )
    try:
        end = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert proc.poll() is None and time.monotonic() < end, proc.stdout.read() if proc.poll() else ""
            time.sleep(0.1)
        host = int(pid_file.read_text())
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert "INTERRUPTED" in output, output
        assert _wait_gone(host, 5.0), "the hosting worker outlived an interrupted caller"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_scenario_at_scale_runs_an_implementation_that_is_not_thread_safe_on_the_active_launcher(capsys):
    from gefen_conformance.suite import checkpoints

    def make(params, **hypers):
        return None

    safe = Implementation(name="safe", version="0", make_optimizer=make)
    unsafe = Implementation(name="unsafe", version="0", make_optimizer=make, thread_safe=False)
    assert checkpoints.run_at_scale(_thread_name, 2, (), impl=safe) == [
        "gefen-thread-rank-0",
        "gefen-thread-rank-1",
    ]
    assert checkpoints.run_at_scale(_thread_name, 2, (), impl=unsafe) == ["MainThread", "MainThread"]
    said = capsys.readouterr().out
    assert "2 ranks on the pool launcher, not as threads: unsafe declares that it is not thread-safe" in said

"""Tests of the launcher-agnostic scenario layer: ``gefen_conformance.harness.world`` and
``gefen_conformance.harness.launch``
(SPEC 4.2.4-4.2.7), and of the pool's bounded worker start-up.

Rank bodies are module-level so that pool workers can unpickle them by reference.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch
import torch.distributed as dist

from gefen_conformance.harness import deadlines, launch, world
from gefen_conformance.harness import pool as ranks
from gefen_conformance.harness.pool import RankFailure
from gefen_conformance.harness.pool import worker as pool_worker
from gefen_conformance.harness.sharding import WorldOfOne, world_mesh
from tests import _fake_workers
from tests.support import deadline_wall_s

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()) or not sys.platform.startswith("linux"),
    reason="the rank harness needs torch.distributed with gloo, on Linux",
)


# --------------------------------------------------------------------------------------------
# rank bodies
# --------------------------------------------------------------------------------------------


def _describe_world(tag):
    here = world.current()
    total = torch.tensor([float(here.rank + 1)])
    dist.all_reduce(total, group=here.group)
    return {
        "rank": here.rank,
        "size": here.size,
        "torch_rank": dist.get_rank(here.group),
        "default_group": here.group is dist.group.WORLD,
        "device": str(here.device),
        "mesh_ranks": here.mesh.mesh.tolist(),
        "mesh_device": here.mesh.device_type,
        "coordinate": here.mesh.get_coordinate(),
        "mesh_is_world_mesh": world_mesh() is here.mesh,
        "sum": total.item(),
        "tag": tag,
    }


def _dies_on_rank_1(code):
    here = world.current()
    dist.all_reduce(torch.ones(1), group=here.group)
    if here.rank == 1:
        print("rank 1 about to die", flush=False)  # die() flushes what was printed
        here.die(code)
    dist.all_reduce(torch.ones(1), group=here.group)  # the peer's sockets close: fails fast
    return "unreachable"


def _dies_with(code):
    world.current().die(code)


def _world_size_only():
    return world.current().size


# --------------------------------------------------------------------------------------------
# World under the pool
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 4])
def test_world_fields_inside_a_pool_call(size):
    results = launch.run(_describe_world, size, args=("t",), timeout=60)
    expected_mesh = list(range(size))
    for rank, result in enumerate(results):
        assert result == {
            "rank": rank,
            "size": size,
            "torch_rank": rank,
            "default_group": True,
            "device": "cpu",
            "mesh_ranks": expected_mesh,
            "mesh_device": "cpu",
            "coordinate": (rank,),
            "mesh_is_world_mesh": True,
            "sum": size * (size + 1) / 2,
            "tag": "t",
        }


def test_die_is_reported_as_died_with_its_exit_code():
    launch.run(_world_size_only, 2)  # warm workers: the bound below is the failing call's own
    start = time.monotonic()
    outcomes = launch.run(_dies_on_rank_1, 2, args=(23,), timeout=30, allow_failure=True)
    elapsed = time.monotonic() - start
    survivor, dead = outcomes
    assert (dead.status, dead.exitcode) == ("died", 23)
    assert "exit code 23" in dead.message
    assert "rank 1 about to die" in dead.output
    assert survivor.status == "raised"  # its collective with the dead rank failed, no hang
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert not any(_running(outcome.pid) for outcome in outcomes)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")


@pytest.mark.parametrize("code", [0, 256, True, "1"])
def test_die_rejects_exit_codes_outside_1_to_255(code):
    (outcome,) = launch.run(_dies_with, 1, args=(code,), timeout=30, allow_failure=True)
    assert (outcome.status, outcome.exc_type) == ("raised", "ValueError")
    assert "exit code from 1 to 255" in outcome.message


def test_current_outside_a_call_raises_naming_the_problem(monkeypatch):
    monkeypatch.setattr(world, "_CURRENT", None)
    with pytest.raises(world.NoCurrentWorld, match="outside a scenario call"):
        world.current()
    assert world.bound() is None


def test_world_rejects_a_rank_outside_its_size():
    with pytest.raises(ValueError, match="rank 2 is outside a world of size 2"):
        world.World(2, 2, None, torch.device("cpu"), os._exit)


def test_world_of_one_binds_a_world_in_process(monkeypatch):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    monkeypatch.setattr(world, "_CURRENT", None)
    one = WorldOfOne()
    try:
        here = world.current()
        assert (here.rank, here.size, str(here.device)) == (0, 1, "cpu")
        assert one.mesh is here.mesh and world_mesh() is here.mesh
        with pytest.raises(RuntimeError, match="would end the calling process"):
            here.die(3)
    finally:
        one.close()
    assert world.bound() is None


# --------------------------------------------------------------------------------------------
# launchers
# --------------------------------------------------------------------------------------------


class _InProcessLauncher:
    """A second launcher: runs the ranks one after the other in this process, no collectives."""

    def __init__(self, limit):
        self.limit = limit
        self.calls = []

    def run(self, fn, world_size, args, kwargs, *, timeout, allow_failure, pg_timeout, failure_grace):
        self.calls.append((fn.__name__, world_size, args, kwargs, timeout, allow_failure))
        values = []
        for rank in range(world_size):
            here = world.World(rank, world_size, None, torch.device("cpu"), os._exit)
            with world.scope(here):
                values.append(fn(*args, **kwargs))
        return values

    def execution(self):
        return launch.Execution("in-process", 1, self.limit, self.limit, "none", "cpu", ("cpu",))


def _rank_and_args(*args, **kwargs):
    here = world.current()
    return here.rank, here.size, args, kwargs


def test_a_second_launcher_is_installed_used_and_removed():
    assert isinstance(launch.active(), launch.PoolLauncher)
    fake = _InProcessLauncher(limit=3)
    with launch.using(fake):
        assert launch.active() is fake
        values = launch.run(_rank_and_args, 2, args=(1,), kwargs={"k": 2}, timeout=5)
        assert values == [(0, 2, (1,), {"k": 2}), (1, 2, (1,), {"k": 2})]
        assert fake.calls == [("_rank_and_args", 2, (1,), {"k": 2}, 5, False)]
        assert launch.execution().as_dict() == {
            "launcher": "in-process",
            "nodes": 1,
            "world_size": 3,
            "max_world_size": 3,
            "backend": "none",
            "device_type": "cpu",
            "device_names": ["cpu"],
        }
        assert launch.unfit_reason(3) is None
        reason = launch.unfit_reason(4)
        assert "needs 4 ranks" in reason and "at most 3" in reason
        with pytest.raises(launch.WorldTooLarge, match="needs 4 ranks"):
            launch.run(_rank_and_args, 4)
        assert len(fake.calls) == 1  # the too-large call never reached the launcher
    assert isinstance(launch.active(), launch.PoolLauncher)
    assert launch.run(_world_size_only, 2) == [2, 2]  # the pool again


def test_set_launcher_returns_the_previous_one_and_rejects_non_launchers():
    fake = _InProcessLauncher(limit=1)
    previous = launch.set_launcher(fake)
    try:
        assert isinstance(previous, launch.PoolLauncher)
        assert launch.run(_world_size_only, 1) == [1]
    finally:
        assert launch.set_launcher(previous) is fake
    with pytest.raises(TypeError, match="run\\(\\) and execution\\(\\)"):
        launch.set_launcher(object())


def test_the_pool_launcher_keeps_run_on_ranks_semantics():
    assert launch.execution().as_dict() == {
        "launcher": "pool",
        "nodes": 1,
        "world_size": None,
        "max_world_size": None,
        "backend": "gloo",
        "device_type": "cpu",
        "device_names": ["cpu"],
    }
    assert launch.unfit_reason(64) is None
    with pytest.raises(RankFailure) as info:
        launch.run(_dies_with, 1, args=(9,), timeout=30)
    assert [o.status for o in info.value.outcomes] == ["died"]
    with pytest.raises(ValueError, match="world_size"):
        launch.run(_world_size_only, 0)
    with pytest.raises(TypeError, match="picklable"):
        launch.run(lambda: 1, 1)


# --------------------------------------------------------------------------------------------
# bounded start-up: the same supervision as a call
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_pool():
    ranks.shutdown_pool()  # no idle workers: the next call starts new ones
    yield
    ranks.shutdown_pool()  # and the one after that starts real ones again


def test_a_worker_that_dies_during_start_up_is_reported(fresh_pool, monkeypatch):
    monkeypatch.setattr(pool_worker, "worker_main", _fake_workers.dies_before_ready)
    with pytest.raises(RankFailure, match="failed to start") as info:
        ranks.run_on_ranks(_world_size_only, 2, timeout=30)
    assert [(o.status, o.exitcode) for o in info.value.outcomes] == [("died", 5), ("died", 5)]
    assert "before reporting ready" in info.value.outcomes[0].message


def test_a_worker_that_never_becomes_ready_is_dumped_and_killed(fresh_pool, monkeypatch):
    monkeypatch.setattr(pool_worker, "worker_main", _fake_workers.never_ready)
    # Long enough for the forked stand-in to install its dump handler on a busy machine.
    monkeypatch.setenv("GEFEN_RANKS_STARTUP_TIMEOUT", "4")
    start = time.monotonic()
    with pytest.raises(RankFailure, match="failed to start") as info:
        ranks.run_on_ranks(_world_size_only, 1, timeout=30)
    (outcome,) = info.value.outcomes
    # the start-up bound as the machine's load stretched it (SPEC 4.2.10), then the dump and reaping
    assert (
        time.monotonic() - start < deadline_wall_s(outcome.message, 4.0) + 2 * deadlines.settled_stretch() + 3
    )
    assert (outcome.status, outcome.exitcode) == ("hung", -signal.SIGKILL)
    assert "start-up bound" in outcome.message
    assert "never_ready" in outcome.traceback
    assert not _running(outcome.pid)

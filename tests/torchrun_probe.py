"""Scenario calls that tests/test_torchrun.py runs under ``certify --launcher torchrun`` (not
collected by the default run: the name does not start with ``test_``).

Each test writes what it saw as JSON into ``$GEFEN_TORCHRUN_PROBE_OUT/<test name>.json``, so the
outer test can check outcomes and that no rank process outlived the job.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import torch.distributed as dist

from gefen_conformance.harness import launch, world
from gefen_conformance.harness.pool import RankFailure

OUT = os.environ.get("GEFEN_TORCHRUN_PROBE_OUT", "")
VICTIM = 1
DIE_CODE = 17


def _record(name: str, **facts) -> None:
    if OUT:
        with open(os.path.join(OUT, f"{name}.json"), "w") as handle:
            json.dump(facts, handle)


# ------------------------------------------------------------------------------ rank bodies


def describe_rank() -> dict:
    here = world.current()
    total = torch.tensor([here.rank + 1])
    dist.all_reduce(total, group=here.group)
    return {
        "rank": here.rank,
        "size": here.size,
        "pid": os.getpid(),
        "sum": int(total),
        "group_size": dist.get_world_size(here.group),
        "device": str(here.device),
        "mesh": list(here.mesh.mesh.tolist()),
    }


def raise_on(victim: int) -> str:
    here = world.current()
    if here.rank == victim:
        print(f"rank {victim} is about to raise", flush=True)
        raise ValueError(f"boom on rank {victim}")
    dist.barrier(group=here.group)  # the victim never comes: its closed sockets end this
    return "survived"


def die_on(victim: int, code: int) -> str:
    here = world.current()
    if here.rank == victim:
        try:
            here.die(code)
        except Exception:  # noqa: BLE001 - a body's ``except Exception`` must not undo a death
            return "still alive"
    dist.barrier(group=here.group)
    return "survived"


def hang_on(victim: int) -> str:
    if world.current().rank == victim:
        time.sleep(3600)
    return "done"


# ------------------------------------------------------------------------------------ tests


def test_every_size_runs_on_the_first_ranks_of_the_job():
    size = launch.execution().world_size
    pids = set()
    for k in range(1, size + 1):
        values = launch.run(describe_rank, k, timeout=60)
        assert [v["rank"] for v in values] == list(range(k))
        assert {v["size"] for v in values} == {k} and {v["group_size"] for v in values} == {k}
        assert {v["sum"] for v in values} == {k * (k + 1) // 2}
        assert values[0]["pid"] != os.getpid()  # rank 0's part runs in the rank-0 server, not here
        assert len({v["pid"] for v in values}) == k
        assert all(v["mesh"] == list(range(k)) for v in values)
        pids |= {v["pid"] for v in values}
    _record("sizes", pids=sorted(pids), execution=launch.execution().as_dict())


def test_a_raising_rank_is_reported_and_its_peer_released():
    started = time.monotonic()
    outcomes = launch.run(raise_on, 2, (VICTIM,), timeout=60, allow_failure=True)
    elapsed = time.monotonic() - started
    assert [o.status for o in outcomes] == ["raised", "raised"], [o.headline() for o in outcomes]
    assert outcomes[VICTIM].exc_type == "ValueError" and "boom on rank 1" in outcomes[VICTIM].message
    assert "raise_on" in outcomes[VICTIM].traceback
    assert "rank 1 is about to raise" in outcomes[VICTIM].output  # what a rank prints reaches its outcome
    with pytest.raises(RankFailure, match="boom on rank 1"):
        launch.run(raise_on, 2, (VICTIM,), timeout=60)
    _record("raised", elapsed=elapsed, headlines=[o.headline() for o in outcomes])


def test_a_dying_rank_is_reported_died_with_its_code():
    started = time.monotonic()
    outcomes = launch.run(die_on, 2, (VICTIM, DIE_CODE), timeout=60, allow_failure=True)
    elapsed = time.monotonic() - started
    assert [o.status for o in outcomes] == ["raised", "died"], [o.headline() for o in outcomes]
    assert outcomes[VICTIM].exitcode == DIE_CODE
    _record("died", elapsed=elapsed, headlines=[o.headline() for o in outcomes])


def test_calls_run_again_after_failures():
    values = launch.run(describe_rank, launch.execution().world_size, timeout=60)
    assert [v["rank"] for v in values] == list(range(len(values)))


def test_a_scenario_larger_than_the_job_is_unfit():
    size = launch.execution().world_size
    assert launch.unfit_reason(size) is None
    assert f"runs at most {size}" in launch.unfit_reason(size + 1)


def test_a_hung_rank_is_dumped_and_ends_the_job():
    outcomes = launch.run(hang_on, 2, (VICTIM,), timeout=4, allow_failure=True)
    _record(
        "hung",
        statuses=[o.status for o in outcomes],
        traceback=outcomes[VICTIM].traceback,
        message=outcomes[VICTIM].message,
    )
    assert [o.status for o in outcomes] == ["ok", "hung"]


def test_zz_nothing_runs_after_a_hang():
    _record("after-hang", ran=True)


def sleep_for(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def test_long_call_to_interrupt():
    """Only run when selected (tests/test_torchrun.py interrupts it): every rank's pid is
    recorded, then a 2-rank call sleeps until the job is interrupted."""
    values = launch.run(describe_rank, launch.execution().world_size, timeout=60)
    _record("ready", pids=[v["pid"] for v in values])
    launch.run(sleep_for, 2, (120.0,), timeout=180)

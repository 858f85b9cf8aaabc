"""The suite's real scenario bodies on part of one larger world, as torchrun will run them
(SPEC 4.2.4-4.2.7).

Two stand-in launchers run every call inside one 4-rank pool call:

* :class:`RegroupingLauncher` re-forms the default process group over the first ``n`` ranks for
  the scenario (the others wait), then over all four again. The DCP adapters of the reference
  and of gefen-x 0.5.0 run their agreement collectives on the default group whatever
  ``process_group`` DCP was given, so this is how a scenario's DCP saves and loads can run on
  part of a world: a reshard saved by 2 ranks and restored by 3 of the same 4 passes the suite's
  own restore checks, and the saved bytes equal the pool's.
* :class:`SubgroupLauncher` binds a World over a ``new_group`` of the first ``n`` ranks. Rank
  bodies' own collectives, meshes and ``dcp.save(process_group=...)`` follow ``World.group``
  (shown with a model-only save), but an adapter that reduces over the default group cannot run
  there (shown too: the adapter's save does not complete).
"""

from __future__ import annotations

import datetime
import itertools
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from gefen_conformance.harness import launch, world
from gefen_conformance.harness import pool as ranks
from gefen_conformance.harness.pool import RankFailure
from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations import registry
from gefen_conformance.suite import checkpoints, restore_checks
from gefen_conformance.workload import models, saving
from gefen_oracles.checkpoint_reader import read_nested
from gefen_oracles.digests import payload_md5s

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()) or not sys.platform.startswith("linux"),
    reason="the rank harness needs torch.distributed with gloo, on Linux",
)

POOL_WORLD = 4
GROUP_TIMEOUT = datetime.timedelta(seconds=30)
_calls = itertools.count()


# ----------------------------------------------------------------------------------- launchers


def _regroup(store_path: str, rank: int, size: int) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(
        "gloo", store=dist.FileStore(store_path, size), rank=rank, world_size=size, timeout=GROUP_TIMEOUT
    )


def _on_regrouped_ranks(fn, size, args, kwargs, store_dir):
    """Pool body: ``fn`` on the first ``size`` ranks with the default group re-formed over them."""
    outer = world.current()
    if outer.rank < size:
        _regroup(os.path.join(store_dir, "scenario"), outer.rank, size)
    else:
        dist.destroy_process_group()
    try:
        if outer.rank < size:
            with world.scope(world.World(outer.rank, size, dist.group.WORLD, outer.device, outer.die_hook)):
                return fn(*args, **kwargs)
        return None
    finally:
        _regroup(os.path.join(store_dir, "rejoin"), outer.rank, outer.size)


def _on_subgroup(fn, size, args, kwargs):
    """Pool body: ``fn`` on the first ``size`` ranks, their World's group a ``new_group``."""
    outer = world.current()
    group = dist.new_group(list(range(size)), timeout=GROUP_TIMEOUT)
    try:
        if outer.rank < size:
            with world.scope(world.World(outer.rank, size, group, outer.device, outer.die_hook)):
                return fn(*args, **kwargs)
        return None
    finally:
        dist.barrier(group=outer.group)


class _OneWorld:
    """A launcher whose every call runs inside one ``POOL_WORLD``-rank pool call."""

    name = "one-world"

    def __init__(self, root):
        self.root = root
        self.calls = []

    def _pool_call(self, fn, world_size, args, kwargs):
        raise NotImplementedError

    def run(self, fn, world_size, args, kwargs, *, timeout, allow_failure, pg_timeout, failure_grace):
        self.calls.append((fn.__name__, world_size))
        body, body_args = self._pool_call(fn, world_size, args, kwargs)
        outcomes = ranks.run_on_ranks(
            body, POOL_WORLD, args=body_args, timeout=timeout, allow_failure=True, failure_grace=failure_grace
        )
        ours = outcomes[:world_size]
        if allow_failure:
            return ours
        if any(o.status != "ok" for o in outcomes):
            raise RankFailure(outcomes)
        return [o.value for o in ours]

    def execution(self):
        return launch.Execution(self.name, 1, POOL_WORLD, POOL_WORLD, "gloo", "cpu", ("cpu",))


class RegroupingLauncher(_OneWorld):
    name = "regrouping"

    def _pool_call(self, fn, world_size, args, kwargs):
        store_dir = os.path.join(self.root, f"stores-{next(_calls)}")
        os.makedirs(store_dir)
        return _on_regrouped_ranks, (fn, world_size, args, kwargs, store_dir)


class SubgroupLauncher(_OneWorld):
    name = "subgroup"

    def _pool_call(self, fn, world_size, args, kwargs):
        return _on_subgroup, (fn, world_size, args, kwargs)


# --------------------------------------------------------------------------------- rank bodies


def _save_model(path: str) -> dict:
    """The DCP model's parameters on this World's mesh, saved with no adapter on its group."""
    params = models.parameters(models.BASE, mesh=world_mesh())
    dcp.save({"model": dict(params)}, checkpoint_id=path, process_group=saving.group())
    here = world.current()
    return {
        "rank": here.rank,
        "size": here.size,
        "coordinate": here.mesh.get_coordinate(),
        "full": models.full_params(params),
    }


# --------------------------------------------------------------------------------------- tests


def test_a_reshard_on_part_of_one_world_passes_the_suites_checks(tmp_path):
    """2 -> 3 inside one 4-rank world with the suite's own bodies (save_trained, restore_report)
    and checks; the 2-rank save is byte-identical to the pool's."""
    fake = RegroupingLauncher(str(tmp_path))
    with launch.using(fake):
        cache = checkpoints.Checkpoints(tmp_path / "one-world")
        reference = registry.resolve("reference")
        saved = cache.trained_and_saved(reference, "base", ranks=2)
        restore = cache.restored(saved, by=reference, ranks=3)
    assert fake.calls == [("save_trained", 2), ("restore_report", 3)]
    assert len(restore.reports) == 3
    compared = restore_checks.restored_and_resaved(restore)
    assert compared.ok, "\n".join(compared.problems)
    pool = checkpoints.Checkpoints(tmp_path / "pool").trained_and_saved(reference, "base", ranks=2)
    assert payload_md5s(restore.saved.path) == payload_md5s(pool.path)
    assert all(torch.equal(restore.saved.params[n], v) for n, v in pool.params.items())


def test_a_scenario_larger_than_the_world_is_skipped_with_the_launchers_reason(tmp_path):
    with launch.using(RegroupingLauncher(str(tmp_path))):
        with pytest.raises(
            pytest.skip.Exception, match="needs 5 ranks; the regrouping launcher runs at most 4"
        ):
            checkpoints.run(_save_model, 5, (str(tmp_path / "never"),))


def test_a_subgroup_world_carries_rank_mesh_and_group_to_the_body(tmp_path):
    """World.group reaches meshes, collectives and ``dcp.save(process_group=...)``: a model saved
    by ranks 0-1 of 4 equals the same save by a 2-rank pool."""
    with launch.using(SubgroupLauncher(str(tmp_path))):
        ours = launch.run(_save_model, 2, (str(tmp_path / "subgroup"),), timeout=60)
    pool = launch.run(_save_model, 2, (str(tmp_path / "pool"),), timeout=60)
    assert [(r["rank"], r["size"], r["coordinate"]) for r in ours] == [(0, 2, (0,)), (1, 2, (1,))]
    for a, b in zip(ours, pool):
        assert all(torch.equal(a["full"][n], b["full"][n]) for n in b["full"])
    assert payload_md5s(tmp_path / "subgroup") == payload_md5s(tmp_path / "pool")
    assert sorted(read_nested(tmp_path / "subgroup")["model"]) == sorted(models.BASE.shapes)


@pytest.mark.slow
def test_an_adapter_that_reduces_over_the_default_group_cannot_save_on_a_subgroup(tmp_path):
    """Why the regrouping launcher: the reference adapter's agreement all-reduce runs on the
    default group, which the two idle ranks never enter, so the save fails at the gloo timeout."""
    with launch.using(SubgroupLauncher(str(tmp_path))):
        outcomes = launch.run(
            checkpoints.save_trained,
            2,
            (registry.resolve("reference"), "base", str(tmp_path / "ckpt")),
            timeout=60,
            allow_failure=True,
        )
    assert [o.status for o in outcomes] != ["ok", "ok"]
    assert not (tmp_path / "ckpt" / ".metadata").exists()

"""``gefen_fast.Gefen`` through the reference DCP adapter (its declared state layout, SPEC 2.3.6)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import distribute_tensor

import gefen_fast
import gefen_reference as reference
import gefen_reference.dcp as rdcp
from gefen_conformance.harness.sharding import WorldOfOne, sharded_parameter

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


@pytest.fixture(scope="module")
def world():
    w = WorldOfOne()
    yield w
    w.close()


def _optimizer(cls, mesh, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = {
        "enc.weight": sharded_parameter(torch.randn(16, 24, generator=g), mesh),
        "enc.bias": sharded_parameter(torch.randn(24, generator=g), mesh),
    }
    return cls(list(params.items()), factored_v_2d=False), params


def _train(optimizer, params, steps):
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        for p in params.values():
            p.grad = distribute_tensor(torch.randn(p.shape, generator=g), p.device_mesh, p.placements)
        optimizer.step()


def test_fast_checkpoint_restores_into_fast_and_reference_alike(world):
    fast, fast_params = _optimizer(gefen_fast.Gefen, world.mesh)
    _train(fast, fast_params, 3)
    path = world.path()
    dcp.save({"optimizer": rdcp.GefenDCPState(fast)}, checkpoint_id=path, planner=rdcp.GefenSavePlanner())
    into_fast, fast_restored = _optimizer(gefen_fast.Gefen, world.mesh, seed=1)
    into_ref, ref_restored = _optimizer(reference.Gefen, world.mesh, seed=1)
    dcp.load({"optimizer": rdcp.GefenDCPState(into_fast)}, checkpoint_id=path)
    dcp.load({"optimizer": rdcp.GefenDCPState(into_ref)}, checkpoint_id=path)
    assert into_fast.global_step == into_ref.global_step == 3
    assert torch.equal(into_fast.codebook, into_ref.codebook)
    for name, p in fast_restored.items():
        for key in ("m_codebook", "m_magnitude", "vmean"):
            assert torch.equal(into_fast.state[p][key], into_ref.state[ref_restored[name]][key]), (name, key)
    # and the restored fast optimizer keeps stepping on the restored codebook
    _train(into_fast, fast_restored, 1)
    assert into_fast.global_step == 4


def test_subclass_must_declare_again(world):
    class Tweaked(gefen_fast.Gefen):
        pass

    optimizer, _ = _optimizer(Tweaked, world.mesh)
    with pytest.raises(TypeError, match="reference.Gefen"):
        rdcp.GefenDCPState(optimizer)

"""SPEC 2.3.1, 2.3.6: which optimizer classes ``gefen_reference.dcp.GefenDCPState`` accepts.

``gefen_reference.Gefen`` always; another class only when it declares the reference's state layout
(``gefen_state_layout = reference.dcp.STATE_LAYOUT``) in its own class body. A declared class
is then saved and restored by the adapter exactly as the reference is.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import gefen_reference as reference
import gefen_reference.dcp as rdcp
from gefen_conformance.harness.sharding import WorldOfOne, sharded_parameter
from gefen_reference.dcp import optimizer_view

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


class Declared(reference.Gefen):
    """Keeps the reference's layout and says so."""

    gefen_state_layout = rdcp.STATE_LAYOUT


class Undeclared(reference.Gefen):
    """A subclass that says nothing: it might have changed the layout."""


class InheritsDeclaration(Declared):
    """Inherits the attribute but does not declare it itself: refused (SPEC 2.3.6)."""


class WrongVersion(reference.Gefen):
    gefen_state_layout = "gefen-reference-state-layout/0"


@pytest.fixture(scope="module")
def world():
    w = WorldOfOne()
    yield w
    w.close()


def _optimizer(cls, mesh, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = {
        "enc.weight": sharded_parameter(torch.randn(8, 16, generator=g), mesh),
        "enc.bias": sharded_parameter(torch.randn(16, generator=g), mesh),
    }
    return cls(list(params.items()), factored_v_2d=False), params


def _train(optimizer, params, steps, first=0):
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(100 + step)
        for p in params.values():
            p.grad = torch.distributed.tensor.distribute_tensor(
                torch.randn(p.shape, generator=g), p.device_mesh, p.placements
            )
        optimizer.step()


@pytest.mark.parametrize("cls", [reference.Gefen, Declared], ids=["reference", "declared"])
def test_accepted_classes(cls):
    assert optimizer_view.is_supported(object.__new__(cls))


@pytest.mark.parametrize(
    "cls", [Undeclared, InheritsDeclaration, WrongVersion], ids=["undeclared", "inherited", "other-version"]
)
def test_refused_classes(world, cls):
    optimizer, _ = _optimizer(cls, world.mesh)
    with pytest.raises(TypeError, match="reference.Gefen"):
        rdcp.GefenDCPState(optimizer)


def test_declared_class_round_trips_like_the_reference(world):
    """A declared class saves the reference's bytes and restores into the reference (and back)."""
    ours, ours_params = _optimizer(Declared, world.mesh)
    theirs, theirs_params = _optimizer(reference.Gefen, world.mesh)
    _train(ours, ours_params, 3)
    _train(theirs, theirs_params, 3)
    a, b = world.path(), world.path()
    dcp.save({"optimizer": rdcp.GefenDCPState(ours)}, checkpoint_id=a)
    dcp.save({"optimizer": rdcp.GefenDCPState(theirs)}, checkpoint_id=b)

    def payload(path):
        return {
            n: open(os.path.join(path, n), "rb").read() for n in os.listdir(path) if n.endswith(".distcp")
        }

    assert payload(a) == payload(b)

    # A restore re-learns the codebook from the restored momentum (SPEC 3.6): compare with
    # the reference restoring the same checkpoint.
    restored, restored_params = _optimizer(Declared, world.mesh, seed=1)
    expected, expected_params = _optimizer(reference.Gefen, world.mesh, seed=1)
    dcp.load({"optimizer": rdcp.GefenDCPState(restored)}, checkpoint_id=b)
    dcp.load({"optimizer": rdcp.GefenDCPState(expected)}, checkpoint_id=b)
    assert type(restored) is Declared and restored.global_step == expected.global_step == 3
    assert torch.equal(restored.codebook, expected.codebook)
    for name, p in restored_params.items():
        mine, ref = restored.state[p], expected.state[expected_params[name]]
        assert set(mine) == set(ref)
        for key in ("m_codebook", "m_magnitude", "vmean"):
            assert torch.equal(mine[key], ref[key]), (name, key)

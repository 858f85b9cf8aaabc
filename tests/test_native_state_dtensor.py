"""Native state dicts when the parameters are DTensors (SPEC 1.12.11, 1.14 D13-D14).

A never-stepped checkpoint carries no tensors to reshard and loads, as in gefen-x 0.5.0; one
with per-parameter state or a codebook is refused without mutation; a native save is refused
in favour of the DCP adapter. Runs in-process on a gloo group of one.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor

import gefen_reference as reference

from .support import assert_same_snapshot, deep_equal, silence_gefenx_warnings, snapshot, world_of_one

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

NAMES = ("w", "b", "c")
SHAPES = [(32, 24), (64,), (8, 3, 3)]


@pytest.fixture(scope="module")
def mesh():
    with world_of_one() as world:
        yield world.mesh


def full_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in SHAPES]


def plain_optimizer(**hypers):
    params = [torch.nn.Parameter(t) for t in full_tensors(0)]
    return params, reference.Gefen(list(zip(NAMES, params)), **hypers)


def sharded_optimizer(mesh, cls=reference.Gefen, names=NAMES, **hypers):
    params = [torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)])) for t in full_tensors(1)]
    return params, cls(list(zip(names, params)), **hypers)


def feed(params, step, mesh=None):
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        grad = torch.randn(p.shape, generator=g) * (1 + torch.arange(p.shape[-1]) % 3)
        p.grad = grad if mesh is None else distribute_tensor(grad, mesh, [Shard(0)])


def stepped_checkpoint(codebook_only=False):
    params, source = plain_optimizer(lr=1e-2)
    for step in range(2):
        feed(params, step)
        source.step()
    sd = copy.deepcopy(source.state_dict())
    if codebook_only:  # per-param state stripped, the learned codebook kept
        sd["state"] = {index: {"name": entry["name"]} for index, entry in sd["state"].items()}
    return sd


@pytest.mark.parametrize("idle_steps", [0, 2], ids=["fresh", "stepped-without-grads"])
def test_a_never_stepped_checkpoint_loads_and_then_steps_as_a_fresh_optimizer(mesh, idle_steps):
    _, source = plain_optimizer(lr=1e-2, weight_decay=0.1)
    for _ in range(idle_steps):
        source.step()  # no gradient: global_step moves, no per-param state appears
    sd = copy.deepcopy(source.state_dict())
    sd["param_groups"][0]["param_names"] = ["x", "y", "z"]
    pristine = copy.deepcopy(sd)

    params, target = sharded_optimizer(mesh, lr=1e-3)
    target.load_state_dict(sd)
    assert deep_equal(sd, pristine)
    (group,) = target.param_groups
    assert (group["lr"], group["weight_decay"]) == (1e-2, 0.1)
    assert group["param_names"] == ["x", "y", "z"]
    assert group["param_names_synthesized"] == [False, False, False]
    assert [target.state[p] for p in params] == [{"name": "x"}, {"name": "y"}, {"name": "z"}]
    assert (target.global_step, target.codebook) == (idle_steps, None)

    # From here on it is a fresh optimizer with the checkpoint's hyperparameters and names.
    expected_params, expected = sharded_optimizer(mesh, names=("x", "y", "z"), lr=1e-2, weight_decay=0.1)
    for step in range(2):
        feed(params, step, mesh)
        feed(expected_params, step, mesh)
        target.step()
        expected.step()
    for got, want in zip(params, expected_params):
        assert torch.equal(got.to_local(), want.to_local())
        assert target.state[got]["automatic_period"] == expected.state[want]["automatic_period"]
    assert torch.equal(target.codebook, expected.codebook)
    assert target.global_step == idle_steps + 2


@pytest.mark.parametrize(
    "codebook_only, carried",
    [(False, "m_codebook"), (True, "a codebook")],
    ids=["with-state", "codebook-only"],
)
def test_a_checkpoint_with_state_is_refused_without_mutation(mesh, codebook_only, carried):
    sd = stepped_checkpoint(codebook_only)
    pristine = copy.deepcopy(sd)
    params, target = sharded_optimizer(mesh)
    for step in range(2):
        feed(params, step + 10, mesh)
        target.step()
    before = snapshot(target)
    with pytest.raises(ValueError, match=f"DTensor.*carries.*{carried}"):
        target.load_state_dict(sd)
    assert_same_snapshot(before, snapshot(target))
    assert deep_equal(sd, pristine)


def test_a_native_save_of_dtensor_params_points_to_the_dcp_adapter(mesh):
    _, optimizer = sharded_optimizer(mesh)
    with pytest.raises(ValueError, match="DTensor.*gefen_reference.GefenDCPState"):
        optimizer.state_dict()
    # The name the message gives exists, without `import reference` paying for DCP.
    probe = (
        "import sys\n"
        "import gefen_reference as reference\n"
        "assert 'torch.distributed.checkpoint' not in sys.modules\n"
        "import gefen_reference.dcp\n"
        "assert reference.GefenDCPState is reference.dcp.GefenDCPState\n"
        "assert reference.GefenSavePlanner is reference.dcp.GefenSavePlanner\n"
        "assert 'GefenDCPState' in reference.__all__\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)
    with pytest.raises(AttributeError, match="no attribute 'GefenNothing'"):
        reference.GefenNothing  # noqa: B018


@pytest.mark.gefenx
def test_gefenx_draws_the_same_line(mesh):
    """gefen-x 0.5.0 accepts the never-stepped checkpoint and refuses the one with state."""
    gefen = pytest.importorskip("gefen")
    silence_gefenx_warnings()
    _, source = plain_optimizer(lr=1e-2)
    _, accepting = sharded_optimizer(mesh, cls=gefen.Gefen, fused=False)
    accepting.load_state_dict(copy.deepcopy(source.state_dict()))
    assert accepting.param_groups[0]["lr"] == 1e-2
    _, refusing = sharded_optimizer(mesh, cls=gefen.Gefen, fused=False)
    with pytest.raises(ValueError, match="untagged/full"):
        refusing.load_state_dict(stepped_checkpoint())

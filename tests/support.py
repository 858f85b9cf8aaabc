"""Shared builders for the project's own tests: their models (in the vocabulary of
``gefen_conformance.workload``), optimizers over them, state snapshots, an in-process world of one."""

from __future__ import annotations

import contextlib
import re
import warnings
import zlib

import pytest
import torch

from gefen_conformance.workload import models


def _parity_seed(name: str, index: int, step: int) -> int:
    return 1000 + step * 37 + zlib.crc32(name.encode()) % 997


#: The parity model (tests/test_optimizer_parity.py): periods come out searched (``weight``,
#: ``conv``, ``vector``: structured gradients; ``weight`` has a zero-gradient block), by
#: fallback (``prime``: prime numel, i.i.d. gradients) and 1 (``big_prime``: prime numel above
#: the fallback cap; ``scalar``); ``narrow`` is (n, 3); ``late`` gets its first gradient at step 3.
PARITY = models.Model(
    shapes={
        "weight": (96, 40),
        "vector": (256,),
        "conv": (16, 3, 3, 3),
        "prime": (37,),
        "big_prime": (4099,),
        "narrow": (48, 3),
        "late": (7, 11),
        "scalar": (1,),
    },
    groups=(("weight", "vector", "conv", "prime"), ("big_prime", "narrow", "late", "scalar")),
    init=models.one_stream,
    seed=_parity_seed,
    structured=frozenset({"weight", "conv", "vector"}),
    zero_rows={"weight": 2},
    first_step={"late": 3},
)
LATE_START = PARITY.first_step["late"]


def parity_hypers(*, tensor_lr: bool, weight_decay: float) -> tuple:
    lr = torch.tensor(3e-3) if tensor_lr else 3e-3
    return ({"lr": lr, "weight_decay": weight_decay}, {"lr": 1e-3, "betas": (0.8, 0.99), "weight_decay": 0.0})


def _dcp_seed(name: str, index: int, step: int) -> int:
    return 1000 * step + sum(map(ord, name))


FRESH = "head.weight"
TINY = "tiny.weight"
#: The DCP tests' model (tests/test_dcp_*.py): a searched-period matrix, a vector, a matrix whose
#: first dimension does not divide evenly over 3 or 4 ranks (4/4/2, 3/3/3/1), a parameter that
#: never receives a gradient (a fresh slot), and a two-row matrix whose shard is empty on rank 2
#: of 3 and ranks 2-3 of 4.
DCP_MODEL = models.Model(
    shapes={"enc.weight": (64, 48), "enc.bias": (48,), "dec.weight": (10, 8), FRESH: (16, 8), TINY: (2, 8)},
    groups=(("enc.weight", "enc.bias"), ("dec.weight", FRESH, TINY)),
    hypers=({}, dict(lr=2e-3, weight_decay=0.01)),
    init=models.linspace(-0.8, 0.7),
    seed=_dcp_seed,
    frozen=frozenset({FRESH}),
)
#: Constructor keywords of the DCP tests' optimizers (group 1 overrides lr and weight decay).
DCP_OPTIONS = dict(
    lr=2.5e-3,
    betas=(0.8, 0.97),
    eps=2e-8,
    weight_decay=0.03,
    fused=False,
    factored_v_2d=False,
    deterministic=True,
)
#: What the DCP tests' checkpoints carry per group.
DCP_SAVED_HYPERS = [
    {"lr": 2.5e-3, "beta1": 0.8, "beta2": 0.97, "eps": 2e-8, "weight_decay": 0.03},
    {"lr": 2e-3, "beta1": 0.8, "beta2": 0.97, "eps": 2e-8, "weight_decay": 0.01},
]
#: Deliberately different, so a restore that forgot the hyperparameters shows.
DCP_TARGET_OPTIONS = dict(lr=9.9e-9, betas=(0.1, 0.2), eps=7e-7, weight_decay=0.5)
DCP_SAVE_STEPS = 3
#: The entries of a stepped slot's compact state (a fresh slot holds only its name).
COMPACT_KEYS = ("automatic_period", "step", "m_codebook", "m_magnitude", "vmean", "vmean_step")


def dcp_optimizer(impl: str, params: dict, model: models.Model = DCP_MODEL, **overrides):
    """The optimizer of implementation ``impl`` ("reference" or "gefenx") over ``params``."""
    from gefen_conformance.implementations import registry

    options = dict(DCP_OPTIONS, **overrides)
    return registry.resolve(impl).make_optimizer(models.param_groups(model, params), **options)


def dcp_trained(impl: str = "reference", model: models.Model = DCP_MODEL, mesh=None, **overrides):
    """``(optimizer, params)``: ``model`` sharded on ``mesh`` (default: the World's), trained
    ``DCP_SAVE_STEPS`` steps (indices 0..2) by ``impl``."""
    from gefen_conformance.harness.sharding import world_mesh

    params = models.parameters(model, mesh=world_mesh() if mesh is None else mesh)
    optimizer = dcp_optimizer(impl, params, model, **overrides)
    models.train(model, optimizer, params, range(DCP_SAVE_STEPS))
    return optimizer, params


def checkpoint_files(path) -> list:
    """Every ``.metadata`` or ``.distcp`` file (possibly partial) under ``path``."""
    import os

    if not os.path.isdir(path):
        return []
    return sorted(e for e in os.listdir(path) if e == ".metadata" or e.endswith(".distcp"))


def silence_gefenx_warnings():
    warnings.filterwarnings("ignore", message=".*fused.*", category=UserWarning)


def snapshot(optimizer, codebook_attr: str = "codebook", step_attr: str = "global_step") -> dict:
    """A deep, comparable copy of everything a load could change, plus tensor identities and versions."""
    state = {}
    for p, entry in optimizer.state.items():
        state[id(p)] = {
            k: (v.clone(), id(v), v._version) if torch.is_tensor(v) else v for k, v in entry.items()
        }
    groups = [
        {
            k: ([id(p) for p in v] if k == "params" else (v.clone() if torch.is_tensor(v) else v))
            for k, v in g.items()
        }
        for g in optimizer.param_groups
    ]
    cb = getattr(optimizer, codebook_attr)
    return {
        "state": state,
        "groups": groups,
        "codebook": None if cb is None else (cb.clone(), id(cb)),
        "global_step": getattr(optimizer, step_attr),
        "state_obj": id(optimizer.state),
    }


def assert_same_snapshot(before: dict, after: dict) -> None:
    assert before["state_obj"] == after["state_obj"]
    assert before["global_step"] == after["global_step"]
    assert before["state"].keys() == after["state"].keys()
    for pid, entry in before["state"].items():
        other = after["state"][pid]
        assert entry.keys() == other.keys()
        for k, v in entry.items():
            w = other[k]
            if isinstance(v, tuple):
                assert torch.equal(v[0], w[0]) and v[1:] == w[1:], k
            else:
                assert v == w, k
    assert len(before["groups"]) == len(after["groups"])
    for g, h in zip(before["groups"], after["groups"]):
        assert g.keys() == h.keys()
        for k in g:
            if torch.is_tensor(g[k]):
                assert torch.equal(g[k], h[k])
            else:
                assert g[k] == h[k], k
    if before["codebook"] is None:
        assert after["codebook"] is None
    else:
        assert torch.equal(before["codebook"][0], after["codebook"][0])
        assert before["codebook"][1] == after["codebook"][1]


def deep_equal(a, b) -> bool:
    """Structural equality of nested dicts/lists/tuples with tensors compared by dtype, shape and value."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@contextlib.contextmanager
def world_of_one():
    """An in-process gloo group of one (``gefen_conformance.harness.sharding.WorldOfOne``, closed on exit);
    skips the test when this process already has a default group."""
    import torch.distributed as dist

    from gefen_conformance.harness.sharding import WorldOfOne

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    world = WorldOfOne()
    try:
        yield world
    finally:
        world.close()


def deadline_wall_s(message: str, quiet_s: float) -> float:
    """The wall seconds a hung rank's deadline took, as its "hung" message states it (SPEC 4.2.10):
    ``quiet_s`` when the machine's load did not stretch it."""
    found = re.search(r"stretched to ([0-9.]+) s of wall time", message)
    return float(found.group(1)) if found else quiet_s

"""Shared builders for the project's own tests: small models, gradient streams, state snapshots."""

from __future__ import annotations

import contextlib
import warnings
import zlib

import pytest
import torch

#: Shapes whose periods come out searched, by fallback and 1 (see test_optimizer_parity).
SHAPES = {
    "weight": (96, 40),      # 2-D, structured gradients -> searched period
    "vector": (256,),        # 1-D
    "conv": (16, 3, 3, 3),   # conv-like 4-D
    "prime": (37,),          # prime numel, i.i.d. gradients -> fallback (one block)
    "big_prime": (4099,),    # prime numel above the fallback cap -> period 1
    "narrow": (48, 3),       # an (n, 3) parameter
    "late": (7, 11),         # first gradient arrives at step 3
    "scalar": (1,),          # one element -> period 1
}
LATE_START = 3
STRUCTURED = {"weight", "conv", "vector"}


def initial_tensors(dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g).to(dtype) for name, shape in SHAPES.items()}


def gradient(name: str, shape: tuple, step: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    """A deterministic gradient; structured ones repeat a per-column scale, one block is all zero."""
    g = torch.Generator().manual_seed(seed * 1000 + step * 37 + zlib.crc32(name.encode()) % 997)
    x = torch.randn(shape, generator=g)
    if name in STRUCTURED:
        last = shape[-1]
        x = x * (1.0 + torch.arange(last, dtype=torch.float32) % 5)
    if name == "weight":
        x[:2] = 0.0  # a zero-gradient block
    return x.to(dtype)


def gradients_for_step(names, shapes, step: int, dtype: torch.dtype) -> dict:
    return {
        n: None if (n == "late" and step < LATE_START) else gradient(n, shapes[n], step, dtype)
        for n in names
    }


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
        {k: ([id(p) for p in v] if k == "params" else (v.clone() if torch.is_tensor(v) else v)) for k, v in g.items()}
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
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@contextlib.contextmanager
def world_of_one():
    """An in-process gloo group of one (``conformance.sharding.WorldOfOne``, closed on exit);
    skips the test when this process already has a default group."""
    import torch.distributed as dist

    from conformance.sharding import WorldOfOne

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    world = WorldOfOne()
    try:
        yield world
    finally:
        world.close()

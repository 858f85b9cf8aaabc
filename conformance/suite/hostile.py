"""Hostile checkpoints: damaged or inconsistent variants of a valid checkpoint (SPEC 3.10).

A valid checkpoint is written by the reference at world size 1 (in this process); each variant
is derived from it either at the byte level (files removed, truncated, bytes flipped) or by
re-saving its decoded content with one entry changed. Variants load at any world size, so the
same directory serves the one-process and the multi-rank checks.
"""

from __future__ import annotations

import copy
import math
import os
import shutil

import torch
import torch.distributed.checkpoint as dcp

from conformance import registry
from conformance.sharding import shard, sharded_parameter, world_mesh
from oracles.checkpoint_reader import read_nested

SHAPES = {"a.weight": (8, 8), "b.weight": (4, 3), "c.scale": (1,)}  # c.scale: a period-1 slot
STEPS = 2


def build(impl, mesh):
    params = {n: sharded_parameter(torch.linspace(-1, 1, math.prod(s)).reshape(s), mesh) for n, s in SHAPES.items()}
    opt = impl.make_optimizer(
        [{"params": [("a.weight", params["a.weight"])]},
         {"params": [("b.weight", params["b.weight"]), ("c.scale", params["c.scale"])], "lr": 2e-3}],
        factored_v_2d=False,
    )
    return params, opt


def train(params, opt, mesh, steps=STEPS, first=0):
    for step in range(first, first + steps):
        for i, (name, p) in enumerate(params.items()):
            g = torch.Generator().manual_seed(100 * step + i)
            p.grad = shard(torch.randn(p.shape, generator=g), mesh)
        opt.step()


def _payload(path):
    (name,) = [f for f in os.listdir(path) if f.endswith(".distcp")]
    return os.path.join(path, name)


def _flip_sign_in_second_moment(nested):
    target = nested["slot_00000000.second_moment"].numpy().tobytes()

    def damage(path):
        f = _payload(path)
        data = bytearray(open(f, "rb").read())
        at = bytes(data).find(target)
        if at < 0:
            raise RuntimeError("second moment bytes not found in the payload")
        data[at + 3] ^= 0x80  # the sign bit of the first little-endian float32
        open(f, "wb").write(bytes(data))

    return damage


def _set(key, make):
    def change(d):
        d[key] = make(d)

    return change


def _poke(key, index, value):
    def change(d):
        d[key] = d[key].clone()
        d[key][index] = value

    return change


BYTE_LEVEL = {
    "aborted-save-no-metadata": lambda nested: (lambda p: os.remove(os.path.join(p, ".metadata"))),
    "truncated-payload": lambda nested: (lambda p: open(_payload(p), "r+b").truncate(1000)),
    "missing-payload": lambda nested: (lambda p: os.remove(_payload(p))),
    "flipped-archive-header": lambda nested: (lambda p: open(_payload(p), "r+b").write(b"XX")),
    "flipped-sign-bit-in-second-moment": _flip_sign_in_second_moment,
}

CONTENT_LEVEL = {
    "missing-key": lambda d: d.pop("slot_00000000.momentum"),
    "wrong-format-version": _set("format_version", lambda d: torch.tensor(3)),
    "wrong-dense-shape": _set("slot_00000000.momentum", lambda d: torch.zeros(4, 8)),
    "extra-slot": _set("slot_count", lambda d: torch.tensor(int(d["slot_count"]) + 1)),
    "renamed-parameter": lambda d: d["param_identities"][0].__setitem__("name", "z.weight"),
    "nan-momentum": _poke("slot_00000000.momentum", (0, 0), float("nan")),
    "inf-second-moment": _poke("slot_00000001.second_moment", (1, 1), float("inf")),
    "negative-second-moment": _poke("slot_00000000.second_moment", (0, 0), -1.0),
    "initialized-with-zero-step": _set("slot_00000000.step", lambda d: torch.tensor(0)),
    "fresh-with-counters": _set("slot_00000001.initialized", lambda d: torch.tensor(0, dtype=torch.uint8)),
    "initialized-flag-two": _set("slot_00000001.initialized", lambda d: torch.tensor(2, dtype=torch.uint8)),
    "deterministic-flag-set": _set("deterministic", lambda d: torch.tensor(1, dtype=torch.uint8)),
    "negative-lr": lambda d: d["param_group_hypers"][1].__setitem__("lr", -1.0),
    "beta-of-one": lambda d: d["param_group_hypers"][0].__setitem__("beta2", 1.0),
}

CASES = sorted(BYTE_LEVEL) + sorted(CONTENT_LEVEL)


def craft_all(root: str, mesh) -> dict:
    """Write the valid checkpoint and every variant under ``root``; return ``{case: path}``."""
    reference = registry.resolve("reference")
    params, opt = build(reference, mesh)
    train(params, opt, mesh)
    base = os.path.join(root, "valid")
    dcp.save({"optimizer": reference.dcp_state(opt)}, checkpoint_id=base)
    nested = read_nested(base)["optimizer"]
    paths = {"valid": base}
    for name, make in BYTE_LEVEL.items():
        path = os.path.join(root, name)
        shutil.copytree(base, path)
        make(nested)(path)
        paths[name] = path
    for name, change in CONTENT_LEVEL.items():
        content = copy.deepcopy(nested)
        change(content)
        path = os.path.join(root, name)
        dcp.save({"optimizer": content}, checkpoint_id=path)
        paths[name] = path
    return paths


def snapshot(params, opt) -> list:
    """Everything a load could change, with tensor identities and versions."""
    out = []
    for name, p in params.items():
        out.append(("param", name, p.to_local().clone()))
    for p, entry in opt.state.items():
        for key, value in sorted(entry.items()):
            if torch.is_tensor(value):
                out.append(("state", key, value.clone(), id(value), value._version))
            else:
                out.append(("state", key, value))
    for group in opt.param_groups:
        out.append(("group", sorted((k, v if not torch.is_tensor(v) else ("t", v.item(), id(v))) for k, v in group.items() if k != "params")))
    return out


def same(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if len(x) != len(y):
            return False
        for u, v in zip(x, y):
            if torch.is_tensor(u):
                if not (torch.is_tensor(v) and u.dtype == v.dtype and torch.equal(u, v)):
                    return False
            elif u != v:
                return False
    return True


def load_attempt(impl, path: str, mesh) -> dict:
    """Train a live optimizer, try to load ``path`` into it; report the error and whether anything changed."""
    params, opt = build(impl, mesh)
    train(params, opt, mesh, first=50)
    before = snapshot(params, opt)
    error = None
    try:
        dcp.load({"optimizer": impl.dcp_state(opt)}, checkpoint_id=path)
    except BaseException as exc:  # DCP's CheckpointException derives from BaseException
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "unchanged": same(before, snapshot(params, opt))}


def load_attempt_on_rank(impl_spec: str, path: str) -> dict:
    """Rank body: the same attempt at the spawned world size."""
    return load_attempt(registry.resolve(impl_spec), path, world_mesh())

"""Deterministic small workloads the suite replays on an implementation and on the reference."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

import reference
from oracles.numeric import Mismatch, bitwise_mismatch, tolerance_mismatch

#: name -> shape; chosen so that searched, fallback and period-1 blocks all occur.
SHAPES = {
    "weight": (48, 40),
    "vector": (256,),
    "conv": (8, 3, 3, 3),
    "prime": (37,),
    "big_prime": (2053,),
    "narrow": (24, 3),
    "late": (7, 11),
    "scalar": (1,),
}
LATE_START = 3
STRUCTURED = ("weight", "vector", "conv")


def initial(dtype: torch.dtype, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(dtype) for n, s in SHAPES.items()}


def gradient(name: str, step: int, dtype: torch.dtype) -> torch.Tensor | None:
    if name == "late" and step < LATE_START:
        return None
    shape = SHAPES[name]
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}:{step}".encode()))
    x = torch.randn(shape, generator=g)
    if name in STRUCTURED:
        x = x * (1.0 + torch.arange(shape[-1], dtype=torch.float32) % 5)
    if name == "weight":
        x[:2] = 0.0
    return x.to(dtype)


@dataclass
class Trained:
    params: dict
    optimizer: object


def groups(params: dict, *, tensor_lr: bool, weight_decay: float) -> list:
    names = list(params)
    lr = torch.tensor(3e-3) if tensor_lr else 3e-3
    return [
        {"params": [(n, params[n]) for n in names[:4]], "lr": lr, "weight_decay": weight_decay},
        {"params": [(n, params[n]) for n in names[4:]], "lr": 1e-3, "betas": (0.8, 0.99)},
    ]


def train(make_optimizer, dtype, steps, *, tensor_lr=False, weight_decay=0.0, **options) -> Trained:
    params = {n: torch.nn.Parameter(t) for n, t in initial(dtype).items()}
    opt = make_optimizer(groups(params, tensor_lr=tensor_lr, weight_decay=weight_decay), **options)
    for step in range(steps):
        for n, p in params.items():
            p.grad = gradient(n, step, dtype)
        opt.step()
    return Trained(params, opt)


def train_reference(dtype, steps, **kw) -> Trained:
    return train(lambda g, **o: reference.Gefen(g, **o), dtype, steps, **kw)


def compare(what: str, expected, actual, bitwise: bool) -> Mismatch | None:
    if not torch.is_tensor(expected):
        return None if (type(expected) is type(actual) and expected == actual) else Mismatch(what, f"{actual!r}, expected {expected!r}")
    if bitwise:
        return bitwise_mismatch(what, expected, actual)
    return tolerance_mismatch(what, expected, actual)


def state_mismatches(expected_sd: dict, actual_sd: dict, bitwise: bool) -> list:
    """Differences between two native state dicts of the same layout."""
    out = []
    for key in ("gefen_global_step", "gefen_deterministic"):
        m = compare(key, expected_sd.get(key), actual_sd.get(key), True)
        if m:
            out.append(m)
    m = compare("gefen_codebook", expected_sd["gefen_codebook"], actual_sd.get("gefen_codebook"), bitwise)
    if m:
        out.append(m)
    for pid, entry in expected_sd["state"].items():
        other = actual_sd["state"].get(pid, {})
        scratch = {"stepsize", "_h_buf"}
        if set(entry) != set(other) - scratch:
            out.append(Mismatch(f"state[{pid}] keys", f"{sorted(set(other) - scratch)}, expected {sorted(entry)}"))
            continue
        for k, v in entry.items():
            m = compare(f"state[{entry.get('name', pid)}].{k}", v, other[k], bitwise or not torch.is_tensor(v) or v.dtype == torch.uint8)
            if m:
                out.append(m)
    return out

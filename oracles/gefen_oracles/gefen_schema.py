"""Validation of a Gefen v2 checkpoint against SPEC Part 2, key by key (SPEC 5.1.3).

Written from the SPEC, independently of any adapter: the vocabulary below is restated here on
purpose, so a drift in an implementation's own constants cannot make its checkpoints pass.
"""

from __future__ import annotations

import math
from typing import Any

import torch

FORMAT_VERSION = 2
HEADER_KEYS = (
    "format_version",
    "global_step",
    "deterministic",
    "slot_count",
    "group_count",
    "param_identities",
    "param_group_hypers",
)
HYPER_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay")
SLOT_FIELDS = ("initialized", "step", "vmean_step", "momentum", "second_moment")


def slot_key(index: int, field: str) -> str:
    return f"slot_{index:08d}.{field}"


def _scalar(problems: list, state: dict, key: str, dtype: torch.dtype):
    value = state.get(key)
    if not torch.is_tensor(value) or value.dtype != dtype or value.dim() != 0:
        got = f"{value.dtype} of shape {tuple(value.shape)}" if torch.is_tensor(value) else repr(value)
        problems.append(f"{key}: must be a 0-dim {dtype} tensor, got {got}")
        return None
    return value.item()


def problems(state: dict) -> list[str]:
    """Every way ``state`` (one adapter's nested dict, e.g. ``read_nested(dir)["optimizer"]``)
    departs from the v2 schema; empty when it conforms. Each message starts with the key."""
    out: list[str] = []
    version = _scalar(out, state, "format_version", torch.int64)
    if version is not None and version != FORMAT_VERSION:
        out.append(f"format_version: {version}, expected {FORMAT_VERSION}")
    step = _scalar(out, state, "global_step", torch.int64)
    if step is not None and step < 0:
        out.append(f"global_step: negative ({step})")
    flag = _scalar(out, state, "deterministic", torch.uint8)
    if flag is not None and flag not in (0, 1):
        out.append(f"deterministic: must be 0 or 1, got {flag}")
    slot_count = _scalar(out, state, "slot_count", torch.int64)
    group_count = _scalar(out, state, "group_count", torch.int64)
    identities, hypers = state.get("param_identities"), state.get("param_group_hypers")
    if not isinstance(identities, list):
        out.append(f"param_identities: must be a list, got {type(identities).__name__}")
        return out
    if not isinstance(hypers, list):
        out.append(f"param_group_hypers: must be a list, got {type(hypers).__name__}")
        return out
    if slot_count is not None and slot_count != len(identities):
        out.append(f"slot_count: {slot_count} but {len(identities)} identities")
    if group_count is not None and group_count != len(hypers):
        out.append(f"group_count: {group_count} but {len(hypers)} hyperparameter entries")
    for g, entry in enumerate(hypers):
        if not isinstance(entry, dict) or set(entry) != set(HYPER_KEYS):
            out.append(f"param_group_hypers.{g}: must have exactly the keys {', '.join(HYPER_KEYS)}")
            continue
        for key, value in entry.items():
            if type(value) is not float or not math.isfinite(value):
                out.append(f"param_group_hypers.{g}.{key}: must be a finite Python float, got {value!r}")
    seen = set()
    for i, ident in enumerate(identities):
        where = f"param_identities.{i}"
        if not isinstance(ident, dict) or set(ident) != {"name", "group", "shape"}:
            out.append(f"{where}: must have exactly the keys name, group, shape")
            continue
        if type(ident["name"]) is not str or ident["name"] in seen:
            out.append(f"{where}.name: must be a unique str, got {ident['name']!r}")
        seen.add(ident["name"])
        if type(ident["group"]) is not int or not 0 <= ident["group"] < len(hypers):
            out.append(f"{where}.group: must be a group index, got {ident['group']!r}")
        shape = ident["shape"]
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            out.append(f"{where}.shape: must be a list of non-negative ints, got {shape!r}")
            continue
        out.extend(_slot_problems(state, i, shape))
    expected = set(HEADER_KEYS) | {slot_key(i, f) for i in range(len(identities)) for f in SLOT_FIELDS}
    for key in sorted(set(state) - expected):
        out.append(f"{key}: unexpected key")
    for key in sorted(expected - set(state)):
        if key not in {p.split(":")[0] for p in out}:
            out.append(f"{key}: missing")
    return out


def _slot_problems(state: dict, i: int, shape: list) -> list[str]:
    out: list[str] = []
    initialized = _scalar(out, state, slot_key(i, "initialized"), torch.uint8)
    step = _scalar(out, state, slot_key(i, "step"), torch.int64)
    vmean_step = _scalar(out, state, slot_key(i, "vmean_step"), torch.int64)
    dense: dict[str, Any] = {}
    for field in ("momentum", "second_moment"):
        key = slot_key(i, field)
        value = state.get(key)
        if not torch.is_tensor(value) or value.dtype != torch.float32 or list(value.shape) != shape:
            got = f"{value.dtype} {list(value.shape)}" if torch.is_tensor(value) else type(value).__name__
            out.append(f"{key}: must be float32 of global shape {shape}, got {got}")
            continue
        if not bool(torch.isfinite(value).all()):
            out.append(f"{key}: not finite")
        dense[field] = value
    if None in (initialized, step, vmean_step) or len(dense) != 2:
        return out
    if initialized not in (0, 1):
        out.append(f"{slot_key(i, 'initialized')}: must be 0 or 1, got {initialized}")
    if initialized == 1 and (step < 1 or vmean_step < 1):
        out.append(f"{slot_key(i, 'step')}: initialized slot with step {step}, vmean_step {vmean_step}")
    if initialized == 0 and (
        step or vmean_step or bool(dense["momentum"].any()) or bool(dense["second_moment"].any())
    ):
        out.append(f"{slot_key(i, 'initialized')}: fresh slot carries counters or dense history")
    if bool((dense["second_moment"] < 0).any()):
        out.append(f"{slot_key(i, 'second_moment')}: negative entries")
    return out

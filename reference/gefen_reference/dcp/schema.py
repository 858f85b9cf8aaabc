"""The v2 checkpoint vocabulary: key names, counter parsing, replicated entries.

SPEC.md Part 2 (clauses 2.1.x) is the normative description; this module is the
single place the adapter spells any of it.
"""

from __future__ import annotations

import math

import torch

FORMAT_VERSION = 2

# Per-group hyperparameters, in the order they are written. The optimizer keeps
# the two betas as separate group keys, so there is no "betas" entry.
HYPER_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay")

# Per-slot entries, in the order they are written.
SLOT_FIELDS = ("initialized", "step", "vmean_step", "momentum", "second_moment")

# Top-level replicated entries, in the order they are written.
HEADER_KEYS = (
    "format_version",
    "global_step",
    "deterministic",
    "slot_count",
    "group_count",
    "param_identities",
    "param_group_hypers",
)


def slot_key(index: int, field: str) -> str:
    """``slot_00000007.momentum`` style key for slot ``index``."""
    return f"slot_{index:08d}.{field}"


def as_counter(value, what: str) -> int:
    """Read a nonnegative integer counter.

    Accepts a Python int, an integral Python float, or a one-element tensor
    holding one of those. Refuses bools (``True`` is not a count), negatives
    and fractions.
    """
    if torch.is_tensor(value):
        if value.numel() != 1:
            raise ValueError(f"{what} must be a single number, got {value.numel()} elements")
        value = value.item()
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0 or int(value) != value:
        raise ValueError(f"{what} must be a nonnegative integer, got {value!r}")
    return int(value)


def int64_scalar(value: int) -> torch.Tensor:
    return torch.tensor(int(value), dtype=torch.int64)


def uint8_flag(value: bool) -> torch.Tensor:
    return torch.tensor(1 if value else 0, dtype=torch.uint8)


def identity_entry(name: str, group_index: int, global_shape) -> dict:
    """One ``param_identities`` entry. ``shape`` is a list (not a tuple) of ints."""
    return {
        "name": str(name),
        "group": int(group_index),
        "shape": [int(extent) for extent in global_shape],
    }


def hyper_entry(group) -> dict:
    """One ``param_group_hypers`` entry: each hyperparameter as a Python float."""
    entry = {}
    for key in HYPER_KEYS:
        value = group[key]
        if torch.is_tensor(value):
            value = value.item()
        entry[key] = float(value)
    return entry

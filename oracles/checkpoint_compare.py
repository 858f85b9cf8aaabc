"""Two Gefen DCP checkpoints of the same training, compared by the rules of SPEC 5.6.11.

Used where a checkpoint written by the implementation is compared with one written by the
reference from the same gradients (the goldens, SPEC 5.5.3; the payload against the reference's,
SPEC 4.3.4). Both are nested optimizer dicts as :func:`oracles.checkpoint_reader.read_nested`
assembles them.

* exact in both profiles: the key set, every non-tensor value (identities, hyperparameters),
  every integer or flag tensor (format version, counters, ``initialized``, ``deterministic``),
  every tensor's dtype and shape, and the dense state of a fresh slot (zeros);
* bitwise profile: every float tensor bit for bit too;
* tolerance profile: a slot's dense second moment relative to the reference's at the free-running
  bound (SPEC 5.6.10, with the slot's element count bounding its period), and its dense momentum
  within ``tau`` of the slot's largest reference magnitude, where ``tau`` is the free-running
  momentum factor for the slot's step count and group ``beta1`` with the codebook gap
  :data:`oracles.kernel_bounds.CHECKPOINT_LARGEST_GAP` (a checkpoint carries no codebook).
"""

from __future__ import annotations

import re

import torch

from . import free_running
from . import kernel_bounds as kb
from .numeric import Comparison, Comparisons, bitwise_comparison
from .pinned_step import DTYPE_NAMES

_DENSE = re.compile(r"^slot_(\d+)\.(momentum|second_moment)$")


def _plain(value):
    return value.item() if torch.is_tensor(value) and value.numel() == 1 else value


def compare(expected: dict, actual: dict, *, bitwise: bool, param_dtype: torch.dtype, where: str = "") -> Comparisons:
    """Every rule of SPEC 5.6.11 for two nested optimizer dicts; ``where`` prefixes messages."""
    out = Comparisons()
    prefix = f"{where}: " if where else ""
    if set(expected) != set(actual):
        out.problem(f"{prefix}keys differ: missing {sorted(set(expected) - set(actual))}, extra "
                    f"{sorted(set(actual) - set(expected))}")
    hypers = expected.get("param_group_hypers") or []
    identities = expected.get("param_identities") or []
    dtype_name = DTYPE_NAMES.get(param_dtype, str(param_dtype))
    for key in sorted(set(expected) & set(actual)):
        e, a = expected[key], actual[key]
        label = f"{prefix}{key}"
        if not torch.is_tensor(e):
            if e != a:
                out.problem(f"{label}: {a!r}, expected {e!r}")
            continue
        if not torch.is_tensor(a) or a.dtype != e.dtype or tuple(a.shape) != tuple(e.shape):
            form = f"{a.dtype} {tuple(a.shape)}" if torch.is_tensor(a) else type(a).__name__
            out.problem(f"{label}: {form}, expected {e.dtype} {tuple(e.shape)}")
            continue
        dense = _DENSE.match(key)
        if dense is None or not e.is_floating_point():
            out.add(bitwise_comparison("saved state: counters and flags", e, a, label=label))
            continue
        if not bool(e.any()):
            out.add(bitwise_comparison("saved state: fresh slots (zeros)", e, a, label=label))
            continue
        if bitwise:
            kind = "momentum" if dense.group(2) == "momentum" else "second moment"
            out.add(bitwise_comparison(f"saved state: {kind} ({dtype_name}, bitwise)", e, a, label=label))
            continue
        slot = int(dense.group(1))
        group = identities[slot]["group"] if slot < len(identities) else 0
        beta1 = float(hypers[group]["beta1"]) if group < len(hypers) else 0.9
        beta2 = float(hypers[group]["beta2"]) if group < len(hypers) else 0.999
        steps = int(_plain(expected.get(f"slot_{dense.group(1)}.step", 1)))
        if dense.group(2) == "momentum":
            factor = free_running.momentum_factor(steps, beta1, kb.CHECKPOINT_LARGEST_GAP, param_dtype)
            top = e.detach().double().abs().max()
            out.add(free_running.dense_momentum(f"saved state: momentum ({dtype_name})", label, e, a,
                                                top.reshape(1), factor))
        else:
            vsteps = int(_plain(expected.get(f"slot_{dense.group(1)}.vmean_step", steps)))
            out.add(free_running.second_moment(f"saved state: second moment ({dtype_name})", label, e, a,
                                               e.numel(), param_dtype, beta2, vsteps))
    return out


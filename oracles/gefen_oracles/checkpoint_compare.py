"""Two Gefen DCP checkpoints of the same training, compared by the rules of SPEC 5.6.11.

Used where a checkpoint written by the implementation is compared with one written by the
reference from the same gradients (the goldens, SPEC 5.5.3; the payload against the reference's,
SPEC 4.3.4). Both are nested optimizer dicts as :func:`gefen_oracles.checkpoint_reader.read_nested`
assembles them.

* exact in both profiles: the key set, every non-tensor value (identities, hyperparameters),
  every integer or flag tensor (format version, counters, ``initialized``, ``deterministic``),
  every tensor's dtype and shape, and the dense state of a fresh slot (zeros);
* bitwise profile: every float tensor bit for bit too;
* tolerance profile: a slot's dense second moment relative to the reference's at the free-running
  bound (SPEC 5.6.10, with the slot's element count bounding its period), and its dense momentum
  within ``tau`` of the slot's largest reference magnitude, where ``tau`` is the free-running
  momentum factor for the slot's step count and group ``beta1`` and the largest gap of the
  reference's codebook (a checkpoint carries no codebook: the caller measures it).
"""

from __future__ import annotations

import re

import torch

from . import free_running
from . import kernel_bounds as kb
from .numeric import Comparison, Comparisons, bitwise_comparison, relative_comparison
from .pinned_step import DTYPE_NAMES

_DENSE = re.compile(r"^slot_(\d+)\.(momentum|second_moment)$")


def _plain(value):
    return value.item() if torch.is_tensor(value) and value.numel() == 1 else value


def _alike_tensors(expected: dict, actual: dict, out: Comparisons, where: str):
    """Walk the keys of two nested optimizer dicts: record in ``out`` a different key set, any
    non-tensor value that differs and any tensor of another dtype or shape; yield
    ``(key, label, expected, actual)`` for the tensors left to compare."""
    prefix = f"{where}: " if where else ""
    if set(expected) != set(actual):
        out.problem(
            f"{prefix}keys differ: missing {sorted(set(expected) - set(actual))}, extra "
            f"{sorted(set(actual) - set(expected))}"
        )
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
        yield key, label, e, a


def compare(
    expected: dict,
    actual: dict,
    *,
    bitwise: bool,
    param_dtype: torch.dtype,
    where: str = "",
    largest_gap: float = 2.0,
) -> Comparisons:
    """Every rule of SPEC 5.6.11 for two nested optimizer dicts; ``where`` prefixes messages.
    ``largest_gap``: the largest gap between adjacent codewords of the codebook(s) the reference
    trained with (2.0, the whole range, when unknown)."""
    out = Comparisons()
    hypers = expected.get("param_group_hypers") or []
    identities = expected.get("param_identities") or []
    dtype_name = DTYPE_NAMES.get(param_dtype, str(param_dtype))
    for key, label, e, a in _alike_tensors(expected, actual, out, where):
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
            factor = free_running.momentum_factor(steps, beta1, largest_gap, param_dtype)
            top = e.detach().double().abs().max()
            out.add(
                free_running.dense_momentum(
                    f"saved state: momentum ({dtype_name})", label, e, a, top.reshape(1), factor
                )
            )
        else:
            vsteps = int(_plain(expected.get(f"slot_{dense.group(1)}.vmean_step", steps)))
            out.add(
                free_running.second_moment(
                    f"saved state: second moment ({dtype_name})",
                    label,
                    e,
                    a,
                    e.numel(),
                    param_dtype,
                    beta2,
                    vsteps,
                )
            )
    return out


def compare_restores(expected: dict, actual: dict, *, bitwise: bool, where: str = "") -> Comparisons:
    """Two re-saves of one checkpoint restored at one world size (SPEC 3.6.4, 5.6.11): by the
    reference (``expected``) and by the implementation (``actual``), nested optimizer dicts.

    A restore's arithmetic is exact except for a block mean and one division per element: periods
    come from identical float64 inputs, magnitudes are maxima, and the dense momentum of the
    re-save is one multiply. So, beyond the exact values: the second moment within a block mean's
    bound; each momentum element within RESTORE_ROUNDING (relative) of the reference's, except
    where a nearest-codeword choice sat within rounding of a decision boundary (or the relearned
    codebook moved a codeword): at most RESTORE_FLIP_SHARE of a slot's elements, and never fewer than
    RESTORE_MIN_FLIPS (:func:`gefen_oracles.kernel_bounds.restore_flips_allowed`; a flip moves an
    element to a neighbouring codeword, by at most the codebook's range, which is not bounded
    further: the restore's codebook is not saved). Bitwise profile: every bit.
    """
    out = Comparisons()
    for key, label, e, a in _alike_tensors(expected, actual, out, where):
        dense = _DENSE.match(key)
        if bitwise or dense is None or not e.is_floating_point() or not bool(e.any()):
            what = "restored state: counters and flags" if dense is None else "restored state (bitwise)"
            out.add(bitwise_comparison(what, e, a, label=label))
            continue
        ed, ad = e.detach().double().reshape(-1), a.detach().double().reshape(-1)
        if dense.group(2) == "second_moment":
            out.add(
                relative_comparison(
                    "restored state: second moment", ed, ad, kb.restore_second_moment(e.numel()), label=label
                )
            )
            continue
        top = float(ed.abs().max())
        err = (ad - ed).abs()
        beyond = err > kb.RESTORE_ROUNDING * ed.abs()
        share = int(beyond.sum()) / beyond.numel()
        out.add(
            _share(
                "restored state: momentum elements beyond rounding",
                label,
                share,
                kb.restore_flips_allowed(e.numel()),
            )
        )
        worst = float(err.max()) / top
        c = Comparison(
            "restored state: momentum (of the slot's largest magnitude)",
            "tolerance",
            worst,
            kb.RESTORE_MOMENTUM_RANGE,
        )
        if not worst <= kb.RESTORE_MOMENTUM_RANGE:
            c.problems.append(f"{label}: an element deviates by {worst:.3e} of the slot's largest magnitude")
        out.add(c)
    return out


def _share(what: str, label: str, share: float, bound: float) -> Comparison:
    c = Comparison(what, "tolerance", share, bound)
    if not share <= bound:
        c.problems.append(
            f"{label}: {share:.2%} of the elements deviate beyond rounding (at most {bound:.2%} may, "
            "where a nearest-codeword choice sat within rounding of a boundary)"
        )
    return c

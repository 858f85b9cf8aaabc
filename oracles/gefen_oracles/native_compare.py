"""Two native optimizer state dicts (SPEC 1.11) of the same training, compared by Part 5's rules.

:func:`exact_problems` is the part that is exact in both profiles (SPEC 5.6.11): top-level keys,
global step and flag, every group's hyperparameters, names and provenance, every state entry's key
set, counters, periods and names, and every state tensor's dtype and shape. :func:`compare` adds
the float state: bitwise in the torch-exact profile; otherwise the codebook by SPEC 5.6.7, the
second moments relative at the free-running bound and the momentum, reconstructed as
``codebook[index] * magnitude`` with each dict's own codebook, within the free-running factor of
its block magnitude (SPEC 5.6.10).
"""

from __future__ import annotations

import torch

from . import codebook_quality, free_running
from .numeric import Comparisons, bitwise_comparison
from .pinned_step import DTYPE_NAMES

COUNTERS = ("step", "vmean_step", "factored_step", "automatic_period")
HYPERPARAMETERS = ("lr", "beta1", "beta2", "eps", "weight_decay")
GROUP_METADATA = "_gefen_checkpoint_metadata"


def _same_value(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    return type(a) is type(b) and a == b


def group_of(sd: dict) -> dict:
    """``{param id: group dict}``."""
    return {pid: g for g in sd["param_groups"] for pid in g["params"]}


def exact_problems(expected: dict, actual: dict, *, codebook_exact: bool) -> list[str]:
    problems = []
    if set(expected) != set(actual):
        problems.append(f"state dict keys {sorted(actual)}, expected {sorted(expected)}")
    for key in ("gefen_global_step", "gefen_deterministic"):
        if not _same_value(expected.get(key), actual.get(key)):
            problems.append(f"{key}: {actual.get(key)!r}, expected {expected.get(key)!r}")
    if codebook_exact and not _same_value(expected.get("gefen_codebook"), actual.get("gefen_codebook")):
        problems.append(
            "gefen_codebook differs from the pinned one (a loaded codebook is frozen, SPEC 1.6.1)"
        )
    eg, ag = expected.get("param_groups", []), actual.get("param_groups", [])
    if len(eg) != len(ag):
        problems.append(f"{len(ag)} param groups, expected {len(eg)}")
    for i, (e, a) in enumerate(zip(eg, ag)):
        for key in sorted((set(e) | set(a)) - {"params", GROUP_METADATA}):
            if not _same_value(e.get(key), a.get(key)):
                problems.append(f"param_groups[{i}].{key}: {a.get(key)!r}, expected {e.get(key)!r}")
        if len(e["params"]) != len(a.get("params", [])):
            problems.append(
                f"param_groups[{i}] holds {len(a.get('params', []))} params, expected {len(e['params'])}"
            )
    es, as_ = expected.get("state", {}), actual.get("state", {})
    if set(es) != set(as_):
        problems.append(f"state ids {sorted(as_)}, expected {sorted(es)}")
    for pid in sorted(set(es) & set(as_)):
        e, a = es[pid], as_[pid]  # scratch buffers included: a state dict strips them (SPEC 1.8.12)
        name = e.get("name", pid)
        if set(e) != set(a):
            problems.append(f"state[{name}] keys {sorted(a)}, expected {sorted(e)}")
            continue
        for key, value in e.items():
            if torch.is_tensor(value):
                other = a[key]
                if not torch.is_tensor(other) or other.dtype != value.dtype or other.shape != value.shape:
                    form = (
                        f"{other.dtype} {tuple(other.shape)}"
                        if torch.is_tensor(other)
                        else type(other).__name__
                    )
                    problems.append(
                        f"state[{name}].{key}: {form}, expected {value.dtype} {tuple(value.shape)}"
                    )
            elif not _same_value(value, a[key]):
                problems.append(f"state[{name}].{key}: {a[key]!r}, expected {value!r}")
    return problems


def compare(
    expected: dict,
    actual: dict,
    *,
    bitwise: bool,
    grad_dtype: torch.dtype,
    histogram: torch.Tensor | None = None,
) -> Comparisons:
    """Exact rules, then the float state (bitwise, or SPEC 5.6.7 / 5.6.10). ``histogram``: the
    reference's step-1 histogram (:func:`gefen_oracles.codebook_quality.histogram`), needed only when
    the codebooks differ."""
    out = Comparisons()
    for p in exact_problems(expected, actual, codebook_exact=False):
        out.problem(p)
    if not out.ok:
        return out
    dtype_name = DTYPE_NAMES.get(grad_dtype, str(grad_dtype))
    ecb, acb = expected.get("gefen_codebook"), actual.get("gefen_codebook")
    if bitwise:
        if ecb is not None:
            out.add(bitwise_comparison("codebook", ecb, acb, label="gefen_codebook"))
        for pid, entry in expected["state"].items():
            for key, value in entry.items():
                if torch.is_tensor(value):
                    kind = "momentum" if key.startswith("m_") else "second moment"
                    out.add(
                        bitwise_comparison(
                            f"free-running: {kind} ({dtype_name})",
                            value,
                            actual["state"][pid][key],
                            label=f"state[{entry.get('name', pid)}].{key}",
                        )
                    )
        return out
    if ecb is None:
        return out
    out.add(codebook_quality.compare("codebook", ecb, acb, histogram))
    if not out.ok:
        return out
    gap = max(codebook_quality.largest_gap(ecb), codebook_quality.largest_gap(acb))
    groups = group_of(expected)
    for pid, entry in expected["state"].items():
        other = actual["state"][pid]
        group = groups.get(pid, {})
        beta1, beta2 = float(group.get("beta1", 0.9)), float(group.get("beta2", 0.999))
        name = entry.get("name", pid)
        if "m_codebook" in entry:
            period = entry["automatic_period"]
            m_e = ecb.double()[entry["m_codebook"].long()] * entry["m_magnitude"].double()
            m_a = acb.double()[other["m_codebook"].long()] * other["m_magnitude"].double()
            scale = torch.maximum(entry["m_magnitude"].double(), other["m_magnitude"].double()).expand(
                -1, period
            )
            factor = free_running.momentum_factor(entry["step"], beta1, gap, grad_dtype)
            out.add(
                free_running.dense_momentum(
                    free_running.label("momentum", grad_dtype),
                    f"state[{name}] momentum",
                    m_e,
                    m_a,
                    scale,
                    factor,
                )
            )
        if "vmean" in entry:
            out.add(
                free_running.second_moment(
                    free_running.label("second moment", grad_dtype),
                    f"state[{name}].vmean",
                    entry["vmean"],
                    other["vmean"],
                    entry["automatic_period"],
                    grad_dtype,
                    beta2,
                    entry.get("vmean_step", entry.get("step", 1)),
                )
            )
        for key in ("v_row", "v_col"):
            if key in entry:
                count = entry["v_col" if key == "v_row" else "v_row"].numel()
                out.add(
                    free_running.second_moment(
                        free_running.label("second moment", grad_dtype),
                        f"state[{name}].{key}",
                        entry[key],
                        other[key],
                        count,
                        torch.float32,
                        beta2,
                        entry.get("factored_step", 1),
                    )
                )
    return out

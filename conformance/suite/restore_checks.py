"""The checks run in the test process on a restore (SPEC 3.7, 4.3.2-4.3.6): restored model
parameters exact, one continuation step within its bound of a native run, and the state re-saved
right after the restore consistent with the checkpoint it restored; used by the reshard, interop,
schema and continuation scenarios.

Everything is read back through the independent oracles only (``oracles.checkpoint_reader``,
``oracles.gefen_schema``, ``oracles.checkpoint_compare``), never through an implementation's loader.
"""

from __future__ import annotations

import torch

from gefen_conformance.plugin import observations
from gefen_conformance.suite import margins
from gefen_conformance.suite.checkpoints import Restore
from gefen_oracles import checkpoint_compare, gefen_schema
from gefen_oracles import kernel_bounds as kb
from gefen_oracles.checkpoint_reader import read_nested


def load_failures(restore: Restore) -> list[str]:
    return [
        f"rank {r}: the load raised {rep.load_error}"
        for r, rep in enumerate(restore.reports)
        if rep.load_error is not None
    ]


def model_problems(restore: Restore) -> list[str]:
    """Restored model parameters (gathered) against those saved and those the oracle reads."""
    problems = []
    on_disk = read_nested(restore.source)["model"]
    differing = total = 0
    for rank, report in enumerate(restore.reports):
        for name, value in report.full_params.items():
            for what, expected in (("saved", restore.saved_params[name]), ("checkpoint", on_disk[name])):
                total += expected.numel()
                if value.dtype != expected.dtype or value.shape != expected.shape:
                    differing += expected.numel()
                    problems.append(f"rank {rank}: restored parameter {name} differs from the {what} one")
                elif not torch.equal(value, expected):
                    differing += int((value != expected).sum())
                    problems.append(f"rank {rank}: restored parameter {name} differs from the {what} one")
    # DCP copies the parameters' bytes: exact in every profile (SPEC 3.7.1)
    margins.exact("restored model parameters", differing, total)
    return problems


def continuation_problems(restore: Restore) -> list[str]:
    problems = []
    worst = max(e for rep in restore.reports for e in rep.continuation.values())
    observations.margin("continuation after reshard (max-abs)", error=worst, bound=kb.CONTINUATION_MAX_ABS)
    if not worst <= kb.CONTINUATION_MAX_ABS:
        where = [
            (r, n, e)
            for r, rep in enumerate(restore.reports)
            for n, e in rep.continuation.items()
            if e > kb.CONTINUATION_MAX_ABS
        ]
        problems.append(
            f"continuation max-abs error {worst:.3e} exceeds {kb.CONTINUATION_MAX_ABS} at (rank, param, "
            f"error) {where}"
        )
    blank = max(e for rep in restore.reports for e in rep.unrestored.values())
    if not blank > kb.CONTINUATION_MAX_ABS:
        problems.append(
            f"workload too weak: an optimizer that restored nothing is within the bound too ({blank:.3e})"
        )
    return problems


def _scalar(value) -> int:
    return int(value.item()) if torch.is_tensor(value) else value


HEADER_SCALARS = ("format_version", "global_step", "deterministic", "slot_count", "group_count")
SLOT_SCALARS = ("initialized", "step", "vmean_step")


def resave_problems(original: dict, resaved: dict, bit_exact: bool) -> list[str]:
    """A checkpoint saved right after a restore, against the one restored (both nested optimizer
    dicts read by the oracle). Counters, identities and hyperparameters exact; dense state within
    the bounds of SPEC 5.6.14 (``kernel_bounds.RESHARD_*``); both schema-clean."""
    problems = [f"original: {p}" for p in gefen_schema.problems(original)]
    problems += [f"re-saved: {p}" for p in gefen_schema.problems(resaved)]
    before = len(problems)
    for key in HEADER_SCALARS:
        if _scalar(original.get(key)) != _scalar(resaved.get(key)):
            problems.append(
                f"{key}: {_scalar(resaved.get(key))} after the restore, {_scalar(original.get(key))} saved"
            )
    for key in ("param_identities", "param_group_hypers"):
        if original.get(key) != resaved.get(key):
            problems.append(f"{key}: {resaved.get(key)!r} after the restore, {original.get(key)!r} saved")
    identities = original.get("param_identities") or []
    for i, identity in enumerate(identities):
        slot = f"slot {i} ({identity['name']})"
        for field in SLOT_SCALARS:
            key = gefen_schema.slot_key(i, field)
            a, b = _scalar(original.get(key)), _scalar(resaved.get(key))
            if a != b:
                problems.append(f"{slot}: {field} {b} after the restore, {a} saved")
    margins.exact(
        "re-save after restore: header, identities, hyperparameters, counters",
        len(problems) - before,
        len(HEADER_SCALARS) + 2 + len(SLOT_SCALARS) * len(identities),
    )
    for i, identity in enumerate(identities):
        slot = f"slot {i} ({identity['name']})"
        m0, m1 = (
            original.get(gefen_schema.slot_key(i, "momentum")),
            resaved.get(gefen_schema.slot_key(i, "momentum")),
        )
        v0, v1 = (
            original.get(gefen_schema.slot_key(i, "second_moment")),
            resaved.get(gefen_schema.slot_key(i, "second_moment")),
        )
        if not all(torch.is_tensor(t) and t.shape == m0.shape for t in (m0, m1, v0, v1)):
            continue  # reported by the schema check
        problems += _dense_problems(slot, m0.double(), m1.double(), v0.double(), v1.double(), bit_exact)
    return problems


def _dense_problems(slot, m0, m1, v0, v1, bit_exact) -> list[str]:
    out = []
    if m0.numel() == 0:
        return out
    top = float(m0.abs().max())
    if top == 0.0 and float(v0.abs().max()) == 0.0:
        if bool(m1.any()) or bool(v1.any()):
            out.append(f"{slot}: fresh when saved, carries dense history after the restore")
        return out
    error = float((m1 - m0).abs().max())
    observations.margin(
        "re-save after restore: momentum re-quantization (of max|m|)",
        error=error / top,
        bound=kb.RESHARD_MOMENTUM_REQUANTIZATION,
    )
    if error > kb.RESHARD_MOMENTUM_REQUANTIZATION * top:
        out.append(
            f"{slot}: momentum re-quantization error {error:.3e} exceeds "
            f"{kb.RESHARD_MOMENTUM_REQUANTIZATION:.3e} x max|m| = "
            f"{kb.RESHARD_MOMENTUM_REQUANTIZATION * top:.3e}"
        )
    new_top = float(m1.abs().max())
    if bit_exact:
        margins.exact("re-save after restore: largest momentum magnitude", int(new_top != top), 1)
    else:
        observations.margin(
            "re-save after restore: largest momentum magnitude (relative)",
            error=abs(new_top - top) / top,
            bound=kb.RESHARD_RANGE_RTOL,
        )
    if (new_top != top) if bit_exact else abs(new_top - top) > kb.RESHARD_RANGE_RTOL * top:
        out.append(
            f"{slot}: largest momentum magnitude {new_top!r} after the restore, {top!r} saved "
            "(a block's largest element is the codeword +-1 times the block magnitude)"
        )
    s0, s1 = float(v0.sum()), float(v1.sum())
    observations.margin(
        "re-save after restore: second-moment sum (relative)",
        error=abs(s1 - s0) / abs(s0) if s0 else abs(s1),
        bound=kb.RESHARD_SECOND_MOMENT_SUM_RTOL,
    )
    if abs(s1 - s0) > kb.RESHARD_SECOND_MOMENT_SUM_RTOL * abs(s0):
        out.append(
            f"{slot}: second-moment sum {s1!r} after the restore, {s0!r} saved (block means keep block sums)"
        )
    lo, hi = float(v0.min()), float(v0.max())
    outside = max(lo - float(v1.min()), float(v1.max()) - hi, 0.0) / max(hi, torch.finfo(torch.float64).tiny)
    observations.margin(
        "re-save after restore: second moment within the saved range (relative)",
        error=outside,
        bound=kb.RESHARD_RANGE_RTOL,
    )
    if float(v1.min()) < lo * (1 - kb.RESHARD_RANGE_RTOL) or float(v1.max()) > hi * (
        1 + kb.RESHARD_RANGE_RTOL
    ):
        out.append(
            f"{slot}: second moment leaves the saved range [{lo!r}, {hi!r}]: "
            f"[{float(v1.min())!r}, {float(v1.max())!r}]"
        )
    return out


def restore_problems(restore: Restore, bit_exact: bool, resave: bool = True) -> list[str]:
    """Everything checked after a restore; the load error alone when the load failed."""
    failures = load_failures(restore)
    if failures:
        return failures
    problems = model_problems(restore) + continuation_problems(restore)
    if resave:
        problems += resave_only_problems(restore, bit_exact)
    return problems


def resave_failures(restore: Restore) -> list[str]:
    """Why ``restore`` has no re-save to compare: its load failures, else each rank whose re-save raised."""
    return load_failures(restore) or [
        f"rank {r}: re-saving the restored state raised {rep.resave_error}"
        for r, rep in enumerate(restore.reports)
        if rep.resave_error is not None
    ]


def resave_only_problems(restore: Restore, bit_exact: bool) -> list[str]:
    failures = resave_failures(restore)
    if failures:
        return failures
    original = read_nested(restore.source)
    resaved = read_nested(restore.resave)
    problems = resave_problems(original["optimizer"], resaved["optimizer"], bit_exact)
    return problems + model_resave_problems(
        original, resaved, "re-save after restore", "re-saved value differs from the restored checkpoint's"
    )


def model_resave_problems(checkpoint: dict, resaved: dict, what: str, differs: str) -> list[str]:
    """Every model parameter of ``resaved`` bit for bit the checkpoint's (SPEC 3.7.1), recorded as
    the exact margin ``"<what>: model parameters"``; one problem line per parameter that ``differs``."""
    differing, problems = 0, []
    for name, value in checkpoint["model"].items():
        again = resaved.get("model", {}).get(name)
        if not torch.is_tensor(again) or again.dtype != value.dtype or not torch.equal(again, value):
            differing += 1
            problems.append(f"model parameter {name}: {differs}")
    margins.exact(f"{what}: model parameters", differing, len(checkpoint["model"]))
    return problems


def restores_agree(reference_restore: Restore, impl_restore: Restore, bitwise: bool) -> list[str]:
    """One reference checkpoint restored at one world size by the reference and by the
    implementation, both re-saved at once: the two re-saves by SPEC 5.6.11
    (:func:`oracles.checkpoint_compare.compare_restores`)."""
    failures = resave_failures(impl_restore)
    if failures:
        return failures
    expected = read_nested(reference_restore.resave)["optimizer"]
    actual = read_nested(impl_restore.resave)["optimizer"]
    return margins.record(checkpoint_compare.compare_restores(expected, actual, bitwise=bitwise))

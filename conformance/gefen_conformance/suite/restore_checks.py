"""The checks run in the test process on a restore (SPEC 3.7, 4.3.2-4.3.6, 5.6.14): restored model
parameters exact, one continuation step within its bound of a native run, and the state re-saved
right after the restore consistent with the checkpoint it restored; used by the reshard, interop,
schema and continuation scenarios.

Each check returns :class:`~gefen_oracles.numeric.Comparisons` for the test's judge
(:mod:`gefen_conformance.judging`); a failed load or re-save is its one problem. Everything is read
back through the independent oracles only (:mod:`gefen_oracles.checkpoint_reader`,
:mod:`gefen_oracles.gefen_schema`, :mod:`gefen_oracles.checkpoint_compare`), never through an
implementation's loader.
"""

from __future__ import annotations

import torch

from gefen_conformance.suite.checkpoints import Restore
from gefen_oracles import checkpoint_compare, gefen_schema, shadowing
from gefen_oracles import kernel_bounds as kb
from gefen_oracles.checkpoint_reader import read_nested
from gefen_oracles.numeric import Comparison, Comparisons

HEADER_SCALARS = ("format_version", "global_step", "deterministic", "slot_count", "group_count")
SLOT_SCALARS = ("initialized", "step", "vmean_step")


def _failed(problems: list[str]) -> Comparisons:
    out = Comparisons()
    for p in problems:
        out.problem(p)
    return out


def load_failures(restore: Restore) -> list[str]:
    return [
        f"rank {r}: the load raised {rep.load_error}"
        for r, rep in enumerate(restore.reports)
        if rep.load_error
    ]


def resave_failures(restore: Restore) -> list[str]:
    """Why ``restore`` has no re-save to compare: its load failures, else each rank whose re-save raised."""
    return load_failures(restore) or [
        f"rank {r}: re-saving the restored state raised {rep.resave_error}"
        for r, rep in enumerate(restore.reports)
        if rep.resave_error is not None
    ]


def model(restore: Restore) -> Comparisons:
    """Restored model parameters (gathered) against those saved and those the oracle reads: DCP
    copies the parameters' bytes, exact in every profile (SPEC 3.7.1)."""
    on_disk = read_nested(restore.saved.path)["model"]
    differing = total = 0
    problems = []
    for rank, report in enumerate(restore.reports):
        for name, value in report.full_params.items():
            for what, expected in (("saved", restore.saved.params[name]), ("checkpoint", on_disk[name])):
                total += expected.numel()
                if value.dtype != expected.dtype or value.shape != expected.shape:
                    differing += expected.numel()
                elif not torch.equal(value, expected):
                    differing += int((value != expected).sum())
                else:
                    continue
                problems.append(f"rank {rank}: restored parameter {name} differs from the {what} one")
    out = Comparisons()
    out.exact("restored model parameters", differing, total, problems)
    return out


def continuation(restore: Restore) -> Comparisons:
    """One step after the restore against a native run at the target world size, max-abs within
    ``CONTINUATION_MAX_ABS`` (SPEC 3.7.3, 5.3.3), and the bound's teeth: an optimizer that restored
    nothing must miss it."""
    bound = kb.CONTINUATION_MAX_ABS
    worst = max(e for rep in restore.reports for e in rep.continuation.values())
    c = Comparison("continuation after reshard (max-abs)", "tolerance", worst, bound)
    if not worst <= bound:
        where = [
            (r, n, e)
            for r, rep in enumerate(restore.reports)
            for n, e in rep.continuation.items()
            if e > bound
        ]
        c.problems.append(
            f"continuation max-abs error {worst:.3e} exceeds {bound} at (rank, param, error) {where}"
        )
    out = Comparisons([c])
    blank = max(e for rep in restore.reports for e in rep.unrestored.values())
    if not blank > bound:
        out.problem(
            f"workload too weak: an optimizer that restored nothing is within the bound too ({blank:.3e})"
        )
    return out


def restored(restore: Restore) -> Comparisons:
    """The restored model parameters exact and one step after the restore within its bound
    (:func:`model`, :func:`continuation`); the load's error alone when the load failed."""
    failures = load_failures(restore)
    if failures:
        return _failed(failures)
    out = model(restore)
    out.merge(continuation(restore))
    return out


def restored_and_resaved(restore: Restore) -> Comparisons:
    """:func:`restored`, and the state re-saved right after the restore (:func:`resaved`); the
    load's error alone when the load failed."""
    out = restored(restore)
    if not load_failures(restore):
        out.merge(resaved(restore))
    return out


def resaved(restore: Restore) -> Comparisons:
    """The state re-saved right after ``restore`` against the checkpoint it restored (SPEC 5.6.14:
    one implementation against its own input, so the same rules in both profiles), and its model
    parameters bit for bit (SPEC 3.7.1)."""
    failures = resave_failures(restore)
    if failures:
        return _failed(failures)
    original = read_nested(restore.saved.path)
    again = read_nested(restore.resave)
    out = resaved_state(original["optimizer"], again["optimizer"], len(restore.reports))
    out.merge(
        model_resaved(
            original, again, "re-save after restore", "re-saved value differs from the restored checkpoint's"
        )
    )
    return out


def _scalar(value) -> int:
    return int(value.item()) if torch.is_tensor(value) else value


def resaved_state(original: dict, resaved: dict, world: int) -> Comparisons:
    """A checkpoint saved right after a restore at ``world`` ranks against the one restored (both
    nested optimizer dicts read by the oracle): both schema-clean; header, identities,
    hyperparameters and slot counters exact; the dense state by SPEC 5.6.14."""
    out = Comparisons()
    for p in gefen_schema.problems(original):
        out.problem(f"original: {p}")
    for p in gefen_schema.problems(resaved):
        out.problem(f"re-saved: {p}")
    problems = []
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
        for field in SLOT_SCALARS:
            key = gefen_schema.slot_key(i, field)
            a, b = _scalar(original.get(key)), _scalar(resaved.get(key))
            if a != b:
                problems.append(f"slot {i} ({identity['name']}): {field} {b} after the restore, {a} saved")
    out.exact(
        "re-save after restore: header, identities, hyperparameters, counters",
        len(problems),
        len(HEADER_SCALARS) + 2 + len(SLOT_SCALARS) * len(identities),
        problems,
    )
    for i, identity in enumerate(identities):
        m0, m1 = (d.get(gefen_schema.slot_key(i, "momentum")) for d in (original, resaved))
        v0, v1 = (d.get(gefen_schema.slot_key(i, "second_moment")) for d in (original, resaved))
        if not all(torch.is_tensor(t) and t.shape == m0.shape for t in (m0, m1, v0, v1)):
            continue  # reported by the schema check
        out.merge(_dense(f"slot {i} ({identity['name']})", identity, m0, m1, v0, v1, world))
    return out


def local_rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s rows of ``t`` under ``Shard(0)`` on ``world`` ranks (torch's chunking)."""
    chunks = torch.chunk(t, world, dim=0)
    return chunks[rank] if rank < len(chunks) else t[:0]


def _dense(slot: str, identity: dict, m0, m1, v0, v1, world: int) -> Comparisons:
    """SPEC 5.6.14 on one slot's dense momentum (``m``) and second moment (``v``), saved (0) and
    re-saved (1) after a restore at ``world`` ranks: each rank re-blocks its rows at the period the
    reference's rule gives for its dense second moment (SPEC 3.6.2), and re-quantizes them
    (:func:`gefen_oracles.shadowing.requantized`); a block mean keeps its block's sum and lies within
    the range of what it averages."""
    from gefen_reference.dcp.reblock import period_for
    from gefen_reference.periods import PeriodRules

    out = Comparisons()
    if m0.numel() == 0:
        return out
    if float(m0.abs().max()) == 0.0 and float(v0.abs().max()) == 0.0:
        if bool(m1.any()) or bool(v1.any()):
            out.problem(f"{slot}: fresh when saved, carries dense history after the restore")
        return out
    for rank in range(world):
        second = local_rows(v0, rank, world)
        if second.numel() == 0:
            continue
        period = period_for(PeriodRules(False, False, ()), identity["name"], identity["shape"], second)
        out.merge(
            shadowing.requantized(
                "re-save after restore: momentum re-quantization",
                f"{slot} rank {rank}",
                local_rows(m0, rank, world),
                local_rows(m1, rank, world),
                period,
            )
        )
    m0, m1, v0, v1 = (t.double() for t in (m0, m1, v0, v1))
    s0, s1 = float(v0.sum()), float(v1.sum())
    rel = abs(s1 - s0) / abs(s0) if s0 else abs(s1)
    out.add(
        Comparison(
            "re-save after restore: second-moment sum (relative)",
            "tolerance",
            rel,
            kb.RESHARD_SECOND_MOMENT_SUM_RTOL,
            problems=[
                f"{slot}: second-moment sum {s1!r} after the restore, {s0!r} saved "
                "(block means keep block sums)"
            ]
            if abs(s1 - s0) > kb.RESHARD_SECOND_MOMENT_SUM_RTOL * abs(s0)
            else [],
        )
    )
    lo, hi = float(v0.min()), float(v0.max())
    outside = max(lo - float(v1.min()), float(v1.max()) - hi, 0.0) / max(hi, torch.finfo(torch.float64).tiny)
    out.add(
        Comparison(
            "re-save after restore: second moment within the saved range (relative)",
            "tolerance",
            outside,
            kb.RESHARD_RANGE_RTOL,
            problems=[
                f"{slot}: second moment leaves the saved range [{lo!r}, {hi!r}]: "
                f"[{float(v1.min())!r}, {float(v1.max())!r}]"
            ]
            if float(v1.min()) < lo * (1 - kb.RESHARD_RANGE_RTOL)
            or float(v1.max()) > hi * (1 + kb.RESHARD_RANGE_RTOL)
            else [],
        )
    )
    return out


def model_resaved(checkpoint: dict, resaved: dict, what: str, differs: str) -> Comparisons:
    """Every model parameter of ``resaved`` bit for bit the checkpoint's (SPEC 3.7.1), as the exact
    comparison ``"<what>: model parameters"``; one problem per parameter that ``differs``."""
    problems = []
    for name, value in checkpoint["model"].items():
        again = resaved.get("model", {}).get(name)
        if not torch.is_tensor(again) or again.dtype != value.dtype or not torch.equal(again, value):
            problems.append(f"model parameter {name}: {differs}")
    out = Comparisons()
    out.exact(f"{what}: model parameters", len(problems), len(checkpoint["model"]), problems)
    return out


def restores_agree(reference_restore: Restore, impl_restore: Restore, bitwise: bool) -> Comparisons:
    """One reference checkpoint restored at one world size by the reference and by the
    implementation, both re-saved at once: the two re-saves by SPEC 5.6.11
    (:func:`gefen_oracles.checkpoint_compare.compare_restores`)."""
    failures = resave_failures(impl_restore)
    if failures:
        return _failed(failures)
    expected = read_nested(reference_restore.resave)["optimizer"]
    actual = read_nested(impl_restore.resave)["optimizer"]
    return checkpoint_compare.compare_restores(expected, actual, bitwise=bitwise)

"""Long runs judged step by step from the implementation's own state ("shadowing", SPEC 5.6.20-5.6.22).

Under the tolerance profile two correct implementations drift apart as rounding flips codewords
(SPEC 5.6.10), so after hundreds of steps their end states cannot be compared sharply. Each step
can: given the state an implementation reports *before* a step (its native state dict, SPEC 1.11),
the parameters and the gradient, the step's exact result is the pinned step of SPEC 5.6.1-5.6.9,
with nothing accumulated. This module applies :mod:`gefen_oracles.pinned_step` to every step of a
recorded run at once: the steps of one parameter are stacked along the block dimension (blocks
are independent in every stage of SPEC 1.8), so a run of ``T`` steps costs a few tensor operations,
not ``T`` oracle calls. Only the bias corrections differ from step to step; they are formed per
stacked block from each step's own counters.

Two kinds of input:

* :class:`ParamRun`: native state entries before and after each step (implementations with
  ``native-state-dict``), checked by :func:`check_runs`;
* :func:`dense_steps`: checkpoints re-saved by the implementation before and after each step
  (the DCP form of SPEC 2.1.6: dense momentum ``codeword x magnitude`` and the block second
  moment repeated), for sharded optimizers whose compact state no public API shows (SPEC 5.6.22).

Besides the arithmetic, every step must keep the exact rules (:func:`exact_problems`): counters
advance by one, the active second moment's counter by one, the inactive moment is untouched
(SPEC 1.10.8), periods and names never change. The module never imports an implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import kernel_bounds as kb
from . import pinned_step as ps
from .numeric import Comparison, Comparisons

#: State keys of each second moment: (tensors, counter).
MOMENTS = {"block": (("vmean",), "vmean_step"), "factored": (("v_row", "v_col"), "factored_step")}


@dataclass
class ParamRun:
    """The steps one parameter took, in order: for step ``t``, its value ``p0[t]`` and native state
    entry ``before[t]`` (SPEC 1.11.3; may be fresh, only a name) before the step, ``p1[t]`` and
    ``after[t]`` after it, and its gradient ``grads[t]``. Between two listed steps the parameter had
    no gradient, so its state did not change. Hyperparameters are the group's, as Python floats,
    constant over the run; ``steps`` the step indices, for messages."""

    name: str
    p0: list
    p1: list
    grads: list
    before: list
    after: list
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    factored: bool
    steps: list = field(default_factory=list)

    def step_label(self, t: int) -> str:
        return str(self.steps[t]) if t < len(self.steps) else str(t)


# ------------------------------------------------------------------------------ exact rules


def _same_tensor(a, b) -> bool:
    return (
        torch.is_tensor(a)
        and torch.is_tensor(b)
        and a.dtype == b.dtype
        and a.shape == b.shape
        and bool(torch.equal(a.detach().cpu(), b.detach().cpu()))
    )


def exact_problems(run: ParamRun) -> tuple[list[str], int]:
    """The exact rules of every step (SPEC 1.8.4, 1.9.3 step 1, 1.10.8, 1.5): ``(problems, checked)``."""
    problems, checked = [], 0
    active = "factored" if run.factored else "block"
    inactive = "block" if run.factored else "factored"
    period = None
    for t in range(len(run.grads)):
        before, after = run.before[t], run.after[t]
        where = f"{run.name} at step {run.step_label(t)}"
        checked += 4
        got = after.get("step")
        if got != before.get("step", 0) + 1:
            problems.append(
                f"{where}: step {got!r} after the step, {before.get('step', 0)!r} before (SPEC 1.8.4)"
            )
        key = MOMENTS[active][1]
        expected = ps.moment_counter(before, key) + 1
        if after.get(key) != expected:
            problems.append(
                f"{where}: {key} {after.get(key)!r} after the step, expected {expected} (SPEC 1.8.2, "
                "1.9.2, 1.10.8: a moment created by the step starts at 0)"
            )
        p = after.get("automatic_period")
        if period is None:
            period = before.get("automatic_period", p)
        if p != period:
            problems.append(f"{where}: period {p!r}, {period!r} before (a period never changes, SPEC 1.5)")
        if after.get("name") != before.get("name"):
            problems.append(f"{where}: name {after.get('name')!r}, {before.get('name')!r} before")
        tensors, counter = MOMENTS[inactive]
        for k in tensors + (counter,):
            if k in before or k in after:
                checked += 1
                same = (
                    _same_tensor(before.get(k), after.get(k))
                    if k in tensors
                    else before.get(k) == after.get(k)
                )
                if not same:
                    problems.append(f"{where}: the inactive {k} changed (SPEC 1.10.8 keeps it untouched)")
    return problems, checked


# ------------------------------------------------------------------------- stacked arithmetic


def _stack(run: ParamRun) -> tuple[ps.ParamStep, torch.Tensor, torch.Tensor]:
    """The run as one :class:`gefen_oracles.pinned_step.ParamStep` over ``T x blocks`` blocks (factored
    moments stacked as ``(T, rows)`` and ``(T, cols)``), and each step's ``step`` and
    active-moment counters before it (float64, one per step). A tensor missing before a step
    (a fresh state, or a moment the step creates) is zero, as the step creates it (SPEC 1.8.1,
    1.8.2, 1.9.2)."""
    period = run.after[-1]["automatic_period"]
    tensors, counter_key = MOMENTS["factored" if run.factored else "block"]
    keys = ("m_codebook", "m_magnitude") + tensors
    before_parts, after_parts = {k: [] for k in keys}, {k: [] for k in keys}
    steps, counters = [], []
    for t in range(len(run.grads)):
        before, after = run.before[t], run.after[t]
        for key in keys:
            value = before.get(key)
            before_parts[key].append(
                (torch.zeros_like(after[key]) if value is None else value).detach().cpu()
            )
            after_parts[key].append(after[key].detach().cpu())
        steps.append(before.get("step", 0))
        counters.append(ps.moment_counter(before, counter_key))

    def join(parts: dict) -> dict:
        joined = {k: torch.stack(v) if k in ("v_row", "v_col") else torch.cat(v) for k, v in parts.items()}
        # present, so that the pinned checks read the stacked tensors (never a fresh state)
        return dict(joined, automatic_period=period, step=1)

    stacked = ps.ParamStep(
        name=run.name,
        p0=torch.stack([p.detach().cpu() for p in run.p0]),
        p1=torch.stack([p.detach().cpu() for p in run.p1]),
        grad=torch.stack([g.detach().cpu() for g in run.grads]),
        before=join(before_parts),
        after=join(after_parts),
        lr=run.lr,
        beta1=run.beta1,
        beta2=run.beta2,
        eps=run.eps,
        weight_decay=run.weight_decay,
        factored=run.factored,
    )
    return stacked, torch.tensor(steps, dtype=torch.float64), torch.tensor(counters, dtype=torch.float64)


def _bias_corrections(s: ps.ParamStep, steps: torch.Tensor, counters: torch.Tensor):
    """Per step: ``1 - beta1^(step+1)`` and ``1 - beta2^(counter+1)`` in float64 (SPEC 1.8.5)."""
    return 1.0 - s.beta1 ** (steps + 1.0), 1.0 - s.beta2 ** (counters + 1.0)


def _block_moment(s: ps.ParamStep, steps, counters, out: Comparisons):
    period = s.after["automatic_period"]
    g = ps._d(s.grad).reshape(-1, period)
    rows = g.shape[0]
    v = s.beta2 * ps._d(s.before["vmean"]).reshape(rows, 1) + (1.0 - s.beta2) * (g * g).mean(
        dim=1, keepdim=True
    )
    error = kb.second_moment(period, s.grad.dtype, s.beta2)
    out.add(
        ps._relative(ps._label("second moment", s.grad.dtype), f"{s.name}.vmean", v, s.after["vmean"], error)
    )
    per_step = rows // steps.numel()
    bc1, bc2 = (b.repeat_interleave(per_step).reshape(rows, 1) for b in _bias_corrections(s, steps, counters))
    stepsize = (1.0 / bc1) / ((v / bc2).sqrt() + s.eps)
    return stepsize.expand(rows, period).reshape(-1), kb.stepsize(error)


def _factored_moment(s: ps.ParamStep, steps, counters, out: Comparisons):
    count, rows, cols = s.p0.shape
    g2 = ps._d(s.grad).reshape(count, rows, cols) ** 2
    v_row = s.beta2 * ps._d(s.before["v_row"]).reshape(count, rows) + (1.0 - s.beta2) * g2.mean(dim=2)
    v_col = s.beta2 * ps._d(s.before["v_col"]).reshape(count, cols) + (1.0 - s.beta2) * g2.mean(dim=1)
    row_error = kb.second_moment(cols, torch.float32, s.beta2)
    col_error = kb.second_moment(rows, torch.float32, s.beta2)
    what = ps._label("factored second moment", s.grad.dtype)
    out.add(ps._relative(what, f"{s.name}.v_row", v_row, s.after["v_row"], row_error))
    out.add(ps._relative(what, f"{s.name}.v_col", v_col, s.after["v_col"], col_error))
    mean = v_row.mean(dim=1).clamp_min(torch.finfo(torch.float32).tiny).reshape(count, 1, 1)
    v_hat = v_row.reshape(count, rows, 1) * v_col.reshape(count, 1, cols) / mean
    bc1, bc2 = (b.reshape(count, 1, 1) for b in _bias_corrections(s, steps, counters))
    stepsize = (1.0 / bc1) / ((v_hat / bc2).sqrt() + s.eps)
    v_hat_error = kb.factored_v_hat(rows, row_error, col_error)
    return stepsize.reshape(-1), kb.stepsize(v_hat_error)


def check_runs(runs: list[ParamRun], codebook: torch.Tensor) -> Comparisons:
    """Every step of every run against exact arithmetic from the state before it (SPEC 5.6.20):
    the pinned step's stage bounds (SPEC 5.6.2-5.6.8) and update bias (SPEC 5.6.9, over all steps of
    a dtype), and the exact rules of :func:`exact_problems` (a bitwise comparison named
    ``shadowed steps: counters, periods, inactive moments``)."""
    out = Comparisons()
    cb = ps._d(codebook).reshape(-1)
    bias = {}
    differing = total = 0
    for run in runs:
        if not run.grads:
            continue
        problems, checked = exact_problems(run)
        differing, total = differing + len(problems), total + checked
        for p in problems:
            out.problem(p)
        if problems:
            continue
        stacked, steps, counters = _stack(run)
        structure = ps._structure_problems(stacked)
        if structure:
            for p in structure:
                out.problem(p)
            continue
        if run.factored:
            stepsize, error = _factored_moment(stacked, steps, counters, out)
        else:
            stepsize, error = _block_moment(stacked, steps, counters, out)
        q_new = ps._momentum(stacked, cb, out)
        rows = ps._update(stacked, stepsize, error, q_new, out)
        if rows is not None:
            bias.setdefault(stacked.grad.dtype, []).append(rows)
    for dtype, parts in bias.items():
        ps._bias(dtype, parts, out)
    out.add(
        Comparison(
            "shadowed steps: counters, periods, inactive moments", "bitwise", differing=differing, total=total
        )
    )
    return out


# ------------------------------------------------------------------------- dense (DCP) form


def codewords_in_use(momenta: list, periods: list) -> tuple[torch.Tensor, list[str]]:
    """The normalized codeword values seen in dense momenta ``codeword x magnitude`` (SPEC 2.1.6):
    each block's elements divided by its largest magnitude, merged where they agree to the
    rounding of one fp32 multiply and one division (8U relative). A block's largest element is the
    codeword +-1 exactly, so the values are codewords of the one codebook the rank used; they are
    a subset of it, which is all :func:`dense_steps` needs. Returns the sorted values (float64) and
    the problems: more than 256 distinct values, or a block whose largest element is not
    +-magnitude."""
    values, problems = [], []
    for m, period in zip(momenta, periods):
        blocks = m.detach().double().reshape(-1, period)
        magnitude = blocks.abs().amax(dim=1, keepdim=True)
        live = magnitude.reshape(-1) > 0
        if bool(live.any()):
            values.append((blocks[live] / magnitude[live]).reshape(-1))
    if not values:
        return torch.tensor([-1.0, 1.0], dtype=torch.float64), problems
    merged = []
    for v in torch.cat(values).unique(sorted=True).tolist():
        if merged and abs(v - merged[-1]) <= kb.CODEWORDS_IN_USE_MERGE * max(abs(v), abs(merged[-1])):
            continue
        merged.append(v)
    if len(merged) > 256:
        problems.append(
            f"the dense momenta use {len(merged)} distinct normalized values; one codebook has 256 "
            "(SPEC 2.1.6: momentum is codeword x block magnitude)"
        )
    return torch.tensor(merged, dtype=torch.float64), problems


def compact_from_dense(
    momentum: torch.Tensor, second: torch.Tensor, period: int, codewords: torch.Tensor, where: str
) -> tuple[dict, list[str]]:
    """Native-form state (``m_codebook`` into ``codewords``, ``m_magnitude``, ``vmean``) of one
    dense shard at ``period``; problems when the second moment is not constant over a block (the
    shard is not blocked at ``period``) or a value is no codeword."""
    problems = []
    blocks = momentum.detach().double().reshape(-1, period)
    magnitude = blocks.abs().amax(dim=1, keepdim=True)
    normalized = torch.where(
        magnitude > 0, blocks / magnitude.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(blocks)
    )
    index = torch.searchsorted(codewords, normalized.reshape(-1)).clamp(0, codewords.numel() - 1)
    lower = (index - 1).clamp(0, codewords.numel() - 1)
    closer = (normalized.reshape(-1) - codewords[lower]).abs() < (
        normalized.reshape(-1) - codewords[index]
    ).abs()
    index = torch.where(closer, lower, index)
    tiny = torch.finfo(torch.float64).tiny
    off = (codewords[index] - normalized.reshape(-1)).abs() > (
        kb.CODEWORDS_IN_USE_MERGE * normalized.reshape(-1).abs() + tiny
    )
    zero = (magnitude.reshape(-1, 1).expand_as(blocks) == 0).reshape(-1)
    if bool((off & ~zero).any()):
        problems.append(
            f"{where}: {int((off & ~zero).sum())} momentum elements are not a codeword times the block's "
            "largest magnitude (SPEC 2.1.6)"
        )
    v = second.detach().float().reshape(-1, period)
    if not bool((v == v[:, :1]).all()):
        problems.append(
            f"{where}: the dense second moment is not constant over blocks of the period {period} "
            "(SPEC 2.1.6, 3.6.2: the period is an exact obligation)"
        )
    state = {
        "automatic_period": period,
        "m_codebook": index.clamp(0, 255).to(torch.uint8).reshape(-1, period),
        "m_magnitude": magnitude.float(),
        "vmean": v[:, :1].contiguous(),
    }
    return state, problems


def dense_steps(slots: list[dict], codewords: torch.Tensor) -> Comparisons:
    """One step of sharded slots judged from dense re-saves before and after it (SPEC 5.6.22).

    ``slots``: per slot ``name``, ``period``, local ``p0``, ``p1``, ``grad``, dense ``m0``, ``v0``,
    ``m1``, ``v1`` (this rank's rows), counters ``step`` and ``vmean_step`` before the step, and the
    group's hyperparameters. Each is turned into a pinned step (:func:`compact_from_dense`, the
    rank's codewords in use standing in for its codebook) and checked by
    :func:`gefen_oracles.pinned_step.check_step`: second moment, magnitude, codeword choice among the
    codewords in use (a necessary condition: the true nearest codeword is at least as close), the
    update and its bias."""
    out = Comparisons()
    steps = []
    for slot in slots:
        where = f"{slot['name']}"
        before, p_before = compact_from_dense(
            slot["m0"], slot["v0"], slot["period"], codewords, where + " before the step"
        )
        after, p_after = compact_from_dense(
            slot["m1"], slot["v1"], slot["period"], codewords, where + " after the step"
        )
        for p in p_before + p_after:
            out.problem(p)
        if p_before or p_after:
            continue
        before.update(step=slot["step"], vmean_step=slot["vmean_step"], name=slot["name"])
        after.update(step=slot["step"] + 1, vmean_step=slot["vmean_step"] + 1, name=slot["name"])
        steps.append(
            ps.ParamStep(
                name=slot["name"],
                p0=slot["p0"],
                p1=slot["p1"],
                grad=slot["grad"],
                before=before,
                after=after,
                lr=slot["lr"],
                beta1=slot["beta1"],
                beta2=slot["beta2"],
                eps=slot["eps"],
                weight_decay=slot["weight_decay"],
                factored=False,
            )
        )
    out.merge(ps.check_step(steps, codewords))
    return out


__all__ = [
    "ParamRun",
    "check_runs",
    "codewords_in_use",
    "compact_from_dense",
    "dense_steps",
    "exact_problems",
]


def requantized(
    what: str, label: str, original: torch.Tensor, resaved: torch.Tensor, period: int
) -> Comparisons:
    """SPEC 5.6.14: a dense momentum shard re-blocked at ``period`` and re-quantized by a restore
    (``resaved``) against the dense momentum it restored (``original``). Each block's largest
    magnitude is the original block's largest (a maximum is exact; the re-save multiplies the
    codeword +-1 by it), and each element is the original one's nearest codeword among the
    codewords in use (:func:`codewords_in_use` of the re-save: a subset of the restore's codebook,
    so the condition is necessary, whatever codebook the restore learned), up to
    ``RESHARD_REQUANTIZATION_ROUNDING`` (the rule's fp32 distances and the normalization)."""
    out = Comparisons()
    m0 = original.detach().double().reshape(-1, period)
    m1 = resaved.detach().double().reshape(-1, period)
    top0, top1 = m0.abs().amax(dim=1, keepdim=True), m1.abs().amax(dim=1, keepdim=True)
    scale = float(top0.max()) if top0.numel() else 0.0
    if scale == 0.0:
        return out
    moved = float(((top1 - top0).abs() / top0.clamp_min(torch.finfo(torch.float64).tiny)).max())
    c = out.add(Comparison(f"{what}: block magnitude (relative)", "tolerance", moved, kb.RESHARD_RANGE_RTOL))
    if moved > kb.RESHARD_RANGE_RTOL:
        c.problems.append(
            f"{label}: a block's largest magnitude moved by {moved:.3e} of itself in the restore"
        )
    codewords, problems = codewords_in_use([resaved], [period])
    for p in problems:
        out.problem(f"{label}: {p}")
    live = (top1 > 0).expand_as(m1)
    u = torch.where(live, m0 / top1.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(m0))
    chosen = torch.where(live, m1 / top1.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(m1))
    nearest = (codewords.reshape(1, -1) - u.reshape(-1, 1)).abs().amin(dim=1).reshape(u.shape)
    excess = torch.where(live, (chosen - u).abs() - nearest, torch.zeros_like(u))
    worst = float(excess.max())
    c = out.add(
        Comparison(
            f"{what}: nearest codeword in use",
            "tolerance",
            max(worst, 0.0),
            kb.RESHARD_REQUANTIZATION_ROUNDING,
        )
    )
    if worst > kb.RESHARD_REQUANTIZATION_ROUNDING:
        i = int(excess.reshape(-1).argmax())
        c.problems.append(
            f"{label}: element {i} re-quantized to {float(chosen.reshape(-1)[i]):.6g} of its block's "
            f"magnitude, {worst:.3e} farther from the restored value {float(u.reshape(-1)[i]):.6g} than "
            "a codeword in use"
        )
    return out

"""Free-running comparisons: an implementation trained on the same gradients as the reference,
compared after several steps without pinning its state (SPEC 5.6.10).

Without pinning, rounding differences propagate: a nearest-codeword choice that rounding may flip
(SPEC 5.6.6) moves one momentum element by up to one codeword gap ``G`` times its block magnitude,
and the EMA carries that into later steps with weight ``beta1`` per step; every later step can add
another such flip. After ``T`` steps an element's momentum may therefore differ by up to

    tau(T, beta1, G) = (G + 4 (rho_G + 1e-5)) (1 - beta1^T) / (1 - beta1)

of its block magnitude (:func:`momentum_factor`), and a parameter by ``tau`` times its accumulated
update scale plus one parameter ulp per step. These per-element bounds catch gross errors only;
the sharp checks are the pinned step's (SPEC 5.6.2-5.6.9). What does not wash out under
flips is a *bias*: the mean signed relative error of the displacement is held to the pinned
step's systematic update bound plus four standard errors (:func:`gefen_oracles.pinned_step.update_bias`).
Second moments do not depend on the momentum: a (block or row/column) mean of squares and its EMA
keep their relative error, so they stay at the pinned bound plus three ``U`` per step.
"""

from __future__ import annotations

import math

import torch

from . import kernel_bounds as kb
from .numeric import Comparison, relative_comparison, worst_elements
from .pinned_step import DTYPE_NAMES, update_bias


def momentum_factor(steps: int, beta1: float, largest_gap: float, grad_dtype: torch.dtype) -> float:
    """SPEC 5.6.10: the largest relative momentum deviation ``T`` free-running steps can build up."""
    per_step = kb.free_running_momentum_per_step(largest_gap, grad_dtype)
    return per_step * (1.0 - beta1**steps) / (1.0 - beta1) if beta1 < 1.0 else math.inf


def label(kind: str, dtype) -> str:
    """A stable comparison name: ``free-running: <kind> (<dtype>)``."""
    return f"free-running: {kind} ({DTYPE_NAMES.get(dtype, str(dtype))})"


def dense_momentum(
    what: str, label: str, expected: torch.Tensor, actual: torch.Tensor, scale: torch.Tensor, factor: float
) -> Comparison:
    """``|actual - expected| <= factor * scale`` per element (``scale``: the block magnitude, or a
    slot's largest magnitude when blocks are unknown)."""
    if not torch.is_tensor(actual) or actual.shape != expected.shape:
        return Comparison(what, "tolerance", math.inf, factor, problems=[f"{label}: shape differs"])
    e, a = expected.detach().double().reshape(-1), actual.detach().double().reshape(-1)
    s = (
        scale.detach().double().reshape(-1).expand_as(e)
        if scale.numel() == 1
        else scale.detach().double().reshape(-1)
    )
    s = s.clamp_min(torch.finfo(torch.float64).tiny)
    rel = (a - e).abs() / s
    if rel.numel() == 0:
        return Comparison(what, "tolerance", 0.0, factor)
    worst = float(rel.max())
    out = Comparison(what, "tolerance", worst, factor)
    if not worst <= factor:
        i = int(rel.argmax())
        out.problems.append(
            f"{label}: {int((rel > factor).sum())} of {rel.numel()} elements deviate by more than "
            f"{factor:.3e} of their scale; worst {worst:.3e} at flat index {i} ({a[i].item()!r} vs "
            f"{e[i].item()!r})"
        )
        out.offenders = worst_elements(label, e, a, factor * s, shape=expected.shape)
    return out


def second_moment(
    what: str,
    label: str,
    expected: torch.Tensor,
    actual: torch.Tensor,
    count: int,
    grad_dtype: torch.dtype,
    beta2: float,
    steps: int,
) -> Comparison:
    """SPEC 5.6.10: relative, at the pinned bound for means of ``count`` squares plus 3U per step."""
    rtol = kb.free_running_second_moment(count, grad_dtype, beta2, steps)
    if torch.is_tensor(actual) and actual.dtype != expected.dtype:
        return Comparison(
            what,
            "tolerance",
            math.inf,
            rtol,
            problems=[f"{label}: dtype {actual.dtype}, expected {expected.dtype}"],
        )
    return relative_comparison(what, expected, actual, rtol, label=label)


def trajectory(name: str, dtype: torch.dtype, expected: list, actual: torch.Tensor, factor: float):
    """A parameter after ``T`` free-running steps. ``expected`` holds the reference's values after
    steps 0..T (``expected[0]`` the common start); ``actual`` the implementation's after step T.

    Returns ``(comparison, displacements)``: the per-element comparison (within ``factor`` times the
    accumulated largest update of the parameter plus one parameter ulp per step), and
    ``(actual - start, expected[T] - start, start)`` of the elements whose reference displacement
    is at least VISIBLE_UPDATE_FACTOR times that rounding, for :func:`displacement_bias`.
    """
    steps = len(expected) - 1
    reference = [t.detach().double().reshape(-1) for t in expected]
    impl = actual.detach().double().reshape(-1)
    what = label("parameters", dtype)
    if impl.numel() == 0:
        return Comparison(what, "tolerance", 0.0, factor), (impl, impl, impl)
    accumulated = sum(float((reference[t + 1] - reference[t]).abs().max()) for t in range(steps))
    rounding = (steps + 1) * kb.ulp(reference[-1], dtype)
    allowed = factor * accumulated + rounding
    err = (impl - reference[-1]).abs()
    scale = max(accumulated, torch.finfo(torch.float64).tiny)
    i = int((err / allowed).argmax())
    c = Comparison(what, "tolerance", float(err[i]) / scale, float(allowed[i]) / scale)
    bad = ~(err <= allowed)
    if bool(bad.any()):
        c.problems.append(
            f"parameter {name}: {int(bad.sum())} of {impl.numel()} elements deviate from the reference "
            f"by more than {factor:.3e} x the accumulated update {accumulated:.3e} plus {steps + 1} ulp; "
            f"worst at flat index {i}: {impl[i].item()!r} vs {reference[-1][i].item()!r}"
        )
        c.offenders = worst_elements(f"parameter {name}", reference[-1], impl, allowed, shape=actual.shape)
    moved = reference[-1] - reference[0]
    visible = moved.abs() >= kb.VISIBLE_UPDATE_FACTOR * rounding
    return c, ((impl - reference[0])[visible], moved[visible], reference[0][visible])


def displacement_bias(dtype: torch.dtype, displacements: list, systematic: float):
    """SPEC 5.6.10: the bias statistic of SPEC 5.6.9 over the visible displacements of every
    parameter (``displacements``: the third values :func:`trajectory` returns)."""
    if not displacements:
        return None
    observed, expected, start = (torch.cat([d[i] for d in displacements]) for i in range(3))
    return update_bias(
        label("displacement bias", dtype), "parameter displacements", observed, expected, systematic, start
    )

"""One optimizer step from a pinned state, against exact arithmetic (SPEC 5.6.2-5.6.9).

The suite loads one state (codebook, periods, indices, magnitudes, second moments, counters) into
the implementation, sets the same parameters and gradient, and takes one step. This module
recomputes that step in float64 from the same inputs, by the formulas of SPEC 1.8 and 1.9 without
any rounding, and checks each result the implementation reports (its native state dict and its
parameters) within the stage bounds of :mod:`gefen_oracles.kernel_bounds`:

* second moment (block ``vmean``, factored ``v_row``/``v_col``): relative, per block / row / column;
* momentum magnitude: within the block's worst pre-quantization error;
* codeword choice: the chosen codeword may be farther from the exact normalized momentum than
  the nearest one by at most twice the normalized value's error bound (the only way rounding can
  change a nearest-codeword choice); every other choice is a bug;
* parameter update: against ``p0 * (1 - lr*wd) - lr * stepsize * codeword * magnitude`` with the
  implementation's own new codeword and magnitude (both checked above) and the exact stepsize;
* update bias: the mean signed relative update error, so that a systematic bias cannot hide
  under the per-element bounds.

Because the state is pinned, no error accumulates: every bound is one step's. The module never
imports an implementation (the reference included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import kernel_bounds as kb
from .numeric import Comparison, Comparisons, bound_text, nonfinite_text, relative_comparison, worst_elements

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


@dataclass
class ParamStep:
    """One parameter's pinned step: inputs, and what the implementation reported after it.

    ``before``/``after`` are native state entries (SPEC 1.11.3); ``before`` may be a fresh entry
    (no ``step``). Hyperparameters are the user's (the pinned state dict's), as Python floats.
    """

    name: str
    p0: torch.Tensor
    p1: torch.Tensor
    grad: torch.Tensor
    before: dict
    after: dict
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    factored: bool


def _label(kind: str, dtype: torch.dtype) -> str:
    return f"pinned step: {kind} ({DTYPE_NAMES.get(dtype, str(dtype))})"


def _d(t) -> torch.Tensor:
    return t.detach().cpu().double()


def check_step(steps: list[ParamStep], codebook: torch.Tensor) -> Comparisons:
    """Every comparison of SPEC 5.6.2-5.6.9 for one pinned step of the given parameters."""
    out = Comparisons()
    cb = _d(codebook).reshape(-1)
    bias = {}
    for s in steps:
        problems = _structure_problems(s)
        if problems:
            for p in problems:
                out.problem(p)
            continue
        stepsize, stepsize_error = _moment(s, out)
        q_new = _momentum(s, cb, out)
        if q_new is None:
            continue
        rows = _update(s, stepsize, stepsize_error, q_new, out)
        if rows is not None:
            bias.setdefault(s.grad.dtype, []).append(rows)
    for dtype, parts in bias.items():
        _bias(dtype, parts, out)
    return out


def _structure_problems(s: ParamStep) -> list[str]:
    need = ["automatic_period", "step", "m_codebook", "m_magnitude"] + (
        ["v_row", "v_col"] if s.factored else ["vmean"]
    )
    missing = [k for k in need if k not in s.after]
    if missing:
        return [f"{s.name}: state after the step lacks {missing}"]
    n = s.grad.numel()
    period = s.after["automatic_period"]
    if type(period) is not int or period < 1 or n % period:
        return [f"{s.name}: period {period!r} does not divide {n}"]
    idx, mag = s.after["m_codebook"], s.after["m_magnitude"]
    if idx.dtype != torch.uint8 or tuple(idx.shape) != (n // period, period):
        return [
            f"{s.name}: m_codebook {idx.dtype} {tuple(idx.shape)}, expected uint8 {(n // period, period)}"
        ]
    if mag.dtype != torch.float32 or tuple(mag.shape) != (n // period, 1):
        return [f"{s.name}: m_magnitude {mag.dtype} {tuple(mag.shape)}, expected float32 {(n // period, 1)}"]
    if s.p1.dtype != s.p0.dtype or s.p1.shape != s.p0.shape:
        return [
            f"{s.name}: parameter {s.p1.dtype} {tuple(s.p1.shape)} after the step, {s.p0.dtype} "
            f"{tuple(s.p0.shape)} before"
        ]
    return []


def _previous(s: ParamStep, key: str, shape) -> torch.Tensor:
    """The pinned value of ``key``, or zeros for a fresh (or lazily repaired) state (SPEC 1.8.1, 1.8.2)."""
    value = s.before.get(key)
    return _d(value).reshape(shape) if torch.is_tensor(value) else torch.zeros(shape, dtype=torch.float64)


def moment_counter(before: dict, key: str) -> int:
    """The counter of the second moment ``key`` (``vmean_step`` or ``factored_step``) as the step
    finds it after the lazy repairs (SPEC 1.8.2, 1.9.2, 1.10.8): 0 when the moment itself is missing
    (a fresh state, or a state of the other mode: the moment is created with counter 0 and re-warms);
    for a block state without ``vmean_step`` (legacy), its ``step``."""
    if key == "vmean_step":
        if "vmean" not in before:
            return 0
        return before.get("vmean_step", before.get("step", 0))
    return before.get("factored_step", 0) if "v_row" in before else 0


def _bias_corrections(s: ParamStep, moment_counter_key: str) -> tuple[float, float]:
    step = s.before.get("step", 0) + 1
    counter = moment_counter(s.before, moment_counter_key) + 1
    return 1.0 - s.beta1**step, 1.0 - s.beta2**counter


@dataclass
class _Moment:
    """A step's exact second moment: ``{state key: (exact value, relative bound)}``, the exact
    stepsize per element (flat) and its relative bound, and the bias corrections."""

    values: dict
    stepsize: torch.Tensor
    stepsize_error: float
    bc1: float
    bc2: float


def _moment_exact(s: ParamStep) -> _Moment:
    """SPEC 1.8.3-1.8.5 (block) or 1.9.3-1.9.5 (factored) in float64, with the bounds of SPEC
    5.6.2, 5.6.3 and 5.6.5."""
    if s.factored:
        rows, cols = s.p0.shape
        g2 = _d(s.grad).reshape(rows, cols) ** 2
        v_row = s.beta2 * _previous(s, "v_row", (rows,)) + (1.0 - s.beta2) * g2.mean(dim=1)
        v_col = s.beta2 * _previous(s, "v_col", (cols,)) + (1.0 - s.beta2) * g2.mean(dim=0)
        row_error = kb.second_moment(cols, torch.float32, s.beta2)
        col_error = kb.second_moment(rows, torch.float32, s.beta2)
        mean = max(float(v_row.mean()), torch.finfo(torch.float32).tiny)
        v_hat = torch.outer(v_row, v_col) / mean
        bc1, bc2 = _bias_corrections(s, "factored_step")
        stepsize = (1.0 / bc1) / ((v_hat / bc2).sqrt() + s.eps)
        v_hat_error = kb.factored_v_hat(rows, row_error, col_error)
        values = {"v_row": (v_row, row_error), "v_col": (v_col, col_error)}
        return _Moment(values, stepsize.reshape(-1), kb.stepsize(v_hat_error), bc1, bc2)
    period = s.after["automatic_period"]
    g = _d(s.grad).reshape(-1, period)
    blocks = g.shape[0]
    v = s.beta2 * _previous(s, "vmean", (blocks, 1)) + (1.0 - s.beta2) * (g * g).mean(dim=1, keepdim=True)
    error = kb.second_moment(period, s.grad.dtype, s.beta2)
    bc1, bc2 = _bias_corrections(s, "vmean_step")
    stepsize = (1.0 / bc1) / ((v / bc2).sqrt() + s.eps)
    return _Moment(
        {"vmean": (v, error)}, stepsize.expand(blocks, period).reshape(-1), kb.stepsize(error), bc1, bc2
    )


def _moment(s: ParamStep, out: Comparisons):
    """Second-moment checks; returns the exact stepsize per element and its relative bound."""
    moment = _moment_exact(s)
    what = _label("factored second moment" if s.factored else "second moment", s.grad.dtype)
    for key, (exact, error) in moment.values.items():
        out.add(_relative(what, f"{s.name}.{key}", exact, s.after[key], error))
    return moment.stepsize, moment.stepsize_error


def _relative(what: str, label: str, expected: torch.Tensor, actual, rtol: float) -> Comparison:
    if not torch.is_tensor(actual) or actual.dtype != torch.float32:
        kind = actual.dtype if torch.is_tensor(actual) else type(actual).__name__
        return Comparison(what, "tolerance", math.inf, rtol, problems=[f"{label}: {kind}, expected float32"])
    return relative_comparison(what, expected.reshape(actual.shape), actual, rtol, label=label)


@dataclass
class _Momentum:
    """A step's exact new momentum, judged: its magnitude per block with the bound (SPEC 5.6.4)
    and the scale it is divided by, the normalized momentum (blocks x period), its distance to the
    nearest codeword, how much farther the chosen codeword may lie (SPEC 5.6.6; inf where the
    magnitude's bound leaves the normalization open), and the blocks whose momentum is zero (every
    element exactly 0: the previous momentum and the gradient are zero there, so the momentum is
    zero in any arithmetic, its row normalizes to 0 and its codewords are the nearest to 0, SPEC
    1.8.8 step 4, within the distances' rounding alone)."""

    magnitude: torch.Tensor
    magnitude_error: torch.Tensor
    scale: torch.Tensor
    normalized: torch.Tensor
    nearest: torch.Tensor
    allowed: torch.Tensor
    zero: torch.Tensor


def _momentum_exact(s: ParamStep, cb: torch.Tensor) -> _Momentum:
    period = s.after["automatic_period"]
    g = _d(s.grad).reshape(-1, period)
    blocks = g.shape[0]
    beta1, w = s.beta1, 1.0 - s.beta1
    if "m_codebook" in s.before:
        current = cb[s.before["m_codebook"].long().reshape(blocks, period)] * _d(
            s.before["m_magnitude"]
        ).reshape(blocks, 1)
    else:
        current = torch.zeros_like(g)
    exact = beta1 * current + w * g
    upd_error = kb.momentum(s.grad.dtype, beta1) * (current.abs() + w * g.abs())
    magnitude = exact.abs().amax(dim=1, keepdim=True)
    magnitude_error = upd_error.amax(dim=1, keepdim=True) + kb.MAGNITUDE_ROUNDING * magnitude
    scale = magnitude.clamp_min(torch.finfo(torch.float64).tiny)
    room = magnitude - magnitude_error
    safe = room > 0
    normalized = torch.where(magnitude > 0, exact / scale, torch.zeros_like(exact))
    normalized_error = torch.where(
        safe,
        (upd_error + normalized.abs() * magnitude_error) / room.clamp_min(torch.finfo(torch.float64).tiny)
        + kb.NORMALIZATION_ROUNDING,
        torch.full_like(exact, math.inf),
    )
    nearest = _nearest_distance(cb, normalized)
    zero = ((current == 0) & (g == 0)).all(dim=1, keepdim=True)
    allowed = torch.where(
        zero, kb.CODEWORD_DISTANCE_ROUNDING, 2 * normalized_error + kb.CODEWORD_DISTANCE_ROUNDING
    )
    return _Momentum(magnitude, magnitude_error, scale, normalized, nearest, allowed, zero)


def _momentum(s: ParamStep, cb: torch.Tensor, out: Comparisons):
    """Magnitude and codeword checks; returns the implementation's new dense momentum (float64)."""
    period = s.after["automatic_period"]
    blocks = s.grad.numel() // period
    m = _momentum_exact(s, cb)
    magnitude, magnitude_error, scale = m.magnitude, m.magnitude_error, m.scale
    normalized, nearest, allowed = m.normalized, m.nearest, m.allowed
    got_magnitude = _d(s.after["m_magnitude"]).reshape(blocks, 1)
    out.add(
        _worst(
            _label("momentum magnitude", s.grad.dtype),
            f"{s.name}.m_magnitude",
            (got_magnitude - magnitude).abs() / scale,
            magnitude_error / scale,
            values=(magnitude, got_magnitude, magnitude_error),
            shape=s.after["m_magnitude"].shape,
        )
    )

    idx = s.after["m_codebook"].long().reshape(blocks, period)
    chosen = cb[idx]
    excess = (chosen - normalized).abs() - nearest
    judged = ((got_magnitude > 0) | (m.zero & (got_magnitude == 0))).expand(blocks, period)
    excess = torch.where(judged, excess.clamp_min(0.0), torch.zeros_like(excess))
    # as elements: the chosen codeword against the exact normalized momentum, which it may miss by
    # the nearest codeword's distance plus the allowance (unjudged blocks allow anything)
    reach = torch.where(judged, nearest + allowed, torch.full_like(allowed, math.inf))
    out.add(
        _worst(
            _label("codeword choice", s.grad.dtype),
            f"{s.name}.m_codebook",
            excess,
            torch.where(judged, allowed, torch.ones_like(allowed)),
            unit="beyond the nearest codeword's distance",
            values=(normalized, chosen, reach),
        )
    )
    return (chosen * got_magnitude).reshape(-1)


def _nearest_distance(cb: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    flat = values.reshape(-1)
    upper = torch.searchsorted(cb, flat).clamp(0, cb.numel() - 1)
    lower = (upper - 1).clamp(0, cb.numel() - 1)
    return torch.minimum((flat - cb[lower]).abs(), (flat - cb[upper]).abs()).reshape(values.shape)


def _update(
    s: ParamStep, stepsize: torch.Tensor, stepsize_error: float, q_new: torch.Tensor, out: Comparisons
):
    p0, p1 = _d(s.p0).reshape(-1), _d(s.p1).reshape(-1)
    decayed, decay = _decay(s)
    delta = s.lr * stepsize * q_new
    expected = p0 * decay - delta
    magnitude = _d(s.after["m_magnitude"]).reshape(-1, 1).expand(-1, s.after["automatic_period"]).reshape(-1)
    update_scale = (s.lr * stepsize * magnitude).clamp_min(torch.finfo(torch.float64).tiny)
    rel = kb.update(s.grad.dtype, stepsize_error)
    rounding = kb.parameter_rounding(p0, expected, s.p0.dtype, decayed)
    allowed = rel * delta.abs() + rounding
    # The last rounding into the parameter dtype (half an ulp) is part of `allowed`, and every
    # correct implementation, the reference too, incurs up to all of it at some element: subtracted
    # from error and bound alike, the verdict is unchanged and the margin shows how much of the
    # kernel's own allowance is used (SPEC 5.6.8), not 100% for every 16-bit parameter.
    final = 0.5 * kb.ulp(expected, s.p0.dtype)
    beyond = ((p1 - expected).abs() - final).clamp_min(0.0)
    out.add(
        _worst(
            _label("parameter update", s.grad.dtype),
            s.name,
            beyond / update_scale,
            (allowed - final) / update_scale,
            unit="of the block's update scale lr*stepsize*magnitude, beyond the final half ulp",
            values=(expected, p1, allowed),
            shape=s.p0.shape,
        )
    )
    observed = p0 * decay - p1
    visible = delta.abs() >= kb.VISIBLE_UPDATE_FACTOR * rounding
    # A decay smaller than the decayed parameter's rounding is lost to it, always in the same
    # direction (the reference rounds a 16-bit p0*(1 - lr*wd) back to p0): one-signed, so its mean
    # belongs to the systematic bound of the bias statistic (SPEC 5.6.9).
    lost_decay = (
        torch.minimum((p0 - p0 * decay).abs(), kb.decay_rounding(p0, s.p0.dtype)) if decayed else None
    )
    return (
        observed[visible],
        delta[visible],
        rel,
        p0[visible],
        None if lost_decay is None else lost_decay[visible],
    )


def _decay(s: ParamStep) -> tuple[bool, float]:
    """Whether the step decays the parameter, and by which factor (SPEC 1.8.7)."""
    decayed = s.weight_decay > 0.0
    return decayed, (1.0 - s.lr * s.weight_decay if decayed else 1.0)


@dataclass
class ElementBounds:
    """One parameter's pinned step as per-element targets that do not depend on the
    implementation judged (SPEC 4.5.8), from the same float64 arithmetic and bounds as
    :func:`check_step`. Each ``(expected, allowed)`` pair is float64, ``allowed`` the largest
    ``|observed - expected|`` admitted per element:

    * ``moments``: ``{state key: (exact, allowed)}`` for ``vmean`` or ``v_row``/``v_col``, shaped
      as the state entry (SPEC 5.6.2, 5.6.3);
    * ``magnitude``: per block, ``(blocks, 1)`` (SPEC 5.6.4);
    * ``codeword``: the exact normalized momentum, ``(blocks, period)``, and how far from it the
      chosen codeword ``codebook[index]`` may lie (inf where the magnitude's bound leaves it open;
      SPEC 5.6.6);
    * the update (SPEC 5.6.8), which depends on the implementation's own codewords and magnitudes:
      ``p1 = decayed - rate * codeword * magnitude`` within
      ``update_rtol * |rate * codeword * magnitude| + rounding``, with ``rate = lr * stepsize``
      and ``decayed = p0 (1 - lr wd)`` exact and flat, and ``rounding`` the parameter's rounding
      allowance at the largest ``|p1|`` any codeword and magnitude within their bounds aim at (so
      never less than :func:`check_step` allows the implementation, whichever of them it chose;
      equal to it wherever one codeword is admitted, as at nearly every element).

    ``bc1``/``bc2`` are the step's bias corrections (SPEC 1.8.5)."""

    name: str
    moments: dict
    magnitude: tuple
    codeword: tuple
    rate: torch.Tensor
    decayed: torch.Tensor
    update_rtol: float
    rounding: torch.Tensor
    bc1: float
    bc2: float


def element_bounds(s: ParamStep, codebook: torch.Tensor) -> ElementBounds:
    """The per-element targets of ``s`` 's pinned step (``s.after`` supplies only the period, an
    exact rule); ValueError when its structure is not a valid step's."""
    problems = _structure_problems(s)
    if problems:
        raise ValueError("; ".join(problems))
    cb = _d(codebook).reshape(-1)
    moment = _moment_exact(s)
    m = _momentum_exact(s, cb)
    period = s.after["automatic_period"]
    decayed, decay = _decay(s)
    rate = s.lr * moment.stepsize
    start = _d(s.p0).reshape(-1) * decay
    safe = ((m.magnitude - m.magnitude_error > 0) | m.zero).expand(-1, period)
    codeword_allowed = torch.where(safe, m.nearest + m.allowed, torch.full_like(m.allowed, math.inf))
    low, high = _momentum_range(cb, m, codeword_allowed)
    largest = torch.maximum((start - rate * low).abs(), (start - rate * high).abs())
    rounding = kb.parameter_rounding(_d(s.p0).reshape(-1), largest, s.p0.dtype, decayed)
    return ElementBounds(
        name=s.name,
        moments={
            key: (exact.reshape(s.after[key].shape), (error * exact.abs()).reshape(s.after[key].shape))
            for key, (exact, error) in moment.values.items()
        },
        magnitude=(m.magnitude, m.magnitude_error),
        codeword=(m.normalized, codeword_allowed),
        rate=rate,
        decayed=start,
        update_rtol=kb.update(s.grad.dtype, moment.stepsize_error),
        rounding=rounding,
        bc1=moment.bc1,
        bc2=moment.bc2,
    )


def _momentum_range(cb: torch.Tensor, m: _Momentum, codeword_allowed: torch.Tensor):
    """The least and the largest new momentum ``c M'`` (flat) a step within the bounds can have:
    ``c`` any codeword within ``codeword_allowed`` of the normalized momentum (a contiguous run of
    the sorted codebook, the nearest one always among them), ``M'`` any magnitude within its
    bound. The update is linear in it, so the parameters such steps aim at lie between the ends."""
    u, reach = m.normalized.reshape(-1), codeword_allowed.reshape(-1)
    last = cb.numel() - 1
    upper = torch.searchsorted(cb, u).clamp(0, last)
    lower = (upper - 1).clamp(0, last)
    nearest = torch.where((u - cb[lower]).abs() <= (cb[upper] - u).abs(), lower, upper)
    first = torch.minimum(torch.searchsorted(cb, u - reach).clamp(0, last), nearest)
    final = torch.maximum((torch.searchsorted(cb, u + reach, right=True) - 1).clamp(0, last), nearest)
    period = m.normalized.shape[1]
    least = (m.magnitude - m.magnitude_error).clamp_min(0.0).expand(-1, period).reshape(-1)
    most = (m.magnitude + m.magnitude_error).expand(-1, period).reshape(-1)
    corners = torch.stack([cb[first] * least, cb[first] * most, cb[final] * least, cb[final] * most])
    return corners.amin(dim=0), corners.amax(dim=0)


def _bias(dtype, parts, out: Comparisons) -> None:
    observed = torch.cat([p[0] for p in parts])
    delta = torch.cat([p[1] for p in parts])
    rel = max(p[2] for p in parts)
    start = torch.cat([p[3] for p in parts])
    lost_decay = torch.cat([torch.zeros_like(p[1]) if p[4] is None else p[4] for p in parts])
    comparison = update_bias(_label("update bias", dtype), "updates", observed, delta, rel, start, lost_decay)
    if comparison is not None:
        out.add(comparison)


def update_bias(
    what: str,
    label: str,
    observed: torch.Tensor,
    expected: torch.Tensor,
    systematic: float,
    start: torch.Tensor,
    one_sided: torch.Tensor | None = None,
):
    """SPEC 5.6.9: the mean signed relative error ``mean((obs - exp) sign(exp)) / mean|exp|`` must be
    within ``systematic`` (plus the mean of ``one_sided``, per-element errors that rounding may make
    in one direction only, relative to the same ``mean|exp|``) plus BIAS_STANDARD_ERRORS standard
    errors of that mean.

    The standard error models the parameter's final rounding as independent from element to
    element, which holds for distinct inputs only: elements with the same start value and the same
    expected change round identically, so each such input counts once. None when fewer than
    ``BIAS_MIN_INPUTS`` distinct inputs are available."""
    if expected.numel():
        first = torch.from_numpy(
            _first_of_each_pair(start.double().reshape(-1).numpy(), expected.double().reshape(-1).numpy())
        )
        observed, expected = observed.reshape(-1)[first], expected.reshape(-1)[first]
    if observed.numel() < kb.BIAS_MIN_INPUTS:
        return None
    signed = (observed - expected) * expected.sign()
    scale = float(expected.abs().mean())
    if scale == 0.0:
        return None
    mean = float(signed.mean()) / scale
    standard_error = float(signed.std()) / math.sqrt(signed.numel()) / scale
    if one_sided is not None:
        systematic = systematic + float(one_sided.double().reshape(-1)[first].mean()) / scale
    bound = systematic + kb.BIAS_STANDARD_ERRORS * standard_error
    problems = []
    if not abs(mean) <= bound:
        problems.append(
            f"{label}: mean signed relative error {mean:+.3e} over {signed.numel()} elements exceeds "
            f"{bound:.3e} (systematic {systematic:.3e} + {kb.BIAS_STANDARD_ERRORS:g} standard errors "
            f"{standard_error:.3e})"
        )
    return Comparison(what, "tolerance", abs(mean), bound, problems=problems)


def _first_of_each_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Index of the first occurrence of each distinct pair ``(a[i], b[i])`` (a stable sort by both
    keys; linear after it, where ``torch.unique(dim=0)`` is slow on long inputs)."""
    order = np.lexsort((b, a))
    sa, sb = a[order], b[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])
    return order[new]


def _worst(
    what: str,
    label: str,
    error: torch.Tensor,
    allowed: torch.Tensor,
    unit: str = "relative",
    values=None,
    shape=None,
) -> Comparison:
    """The comparison ``error <= allowed`` per element (both in one unit). ``values``: the same
    check as ``(expected, observed, allowed |observed - expected|)`` in the result's own units, for
    the worst elements of a failing comparison; ``shape``: the compared tensor's (default
    ``error``'s)."""
    shape = tuple(error.shape if shape is None else shape)
    error, allowed = error.reshape(-1), allowed.reshape(-1)
    if error.numel() == 0:
        return Comparison(what, "tolerance", 0.0, 0.0)
    bad = ~(error <= allowed)
    ratio = torch.where(
        allowed > 0,
        error / allowed,
        torch.where(error > 0, torch.full_like(error, math.inf), torch.zeros_like(error)),
    )
    i = int(ratio.argmax())
    e, b = float(error[i]), float(allowed[i])
    problems, offenders = [], []
    if bool(bad.any()):
        nonfinite = nonfinite_text(values[0], values[1]) if values is not None else None
        undefined = int(torch.isnan(error).sum())
        if nonfinite is None and undefined:
            nonfinite = (
                f"{undefined} of {error.numel()} elements NaN (the result, or the state it was computed "
                "from, is not finite)"
            )
        problems.append(
            f"{label}: {nonfinite}"
            if nonfinite
            else f"{label}: {int(bad.sum())} of {error.numel()} elements outside the bound; worst at flat "
            f"index {i}: error {e:.3e} {unit}, {bound_text(b)}"
        )
        if values is not None:
            offenders = worst_elements(label, *values, shape=shape)
    return Comparison(what, "tolerance", e, b, problems=problems, offenders=offenders)

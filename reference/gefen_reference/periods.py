"""Block-period selection (SPEC 1.5).

A parameter's momentum and second moment are stored per *block*: ``period``
consecutive elements of the flattened (logical row-major) local tensor. The
period is chosen once, from the first non-empty gradient, and never changes
afterwards (the DCP adapter re-derives it from a restored second moment).

Contract (torch-exact profile): the search squares the gradient in float32,
widens to float64 and scores every proper divisor with numpy's two-pass
population variance, so near-ties resolve exactly as in the published package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

#: The smallest period the search keeps and the fallback returns (SPEC 1.5.5-1.5.6).
SMALLEST_SEARCHED_PERIOD = 8
#: The memory-safe fallback never picks a capped divisor above this (SPEC 1.5.6).
FALLBACK_PERIOD_CAP = 2048
#: Score of the first candidate (period 1), a fixed positive sentinel (SPEC 1.5.5).
FIRST_CANDIDATE_SCORE = 1e-12


def proper_divisors(n: int) -> list[int]:
    """The candidates: every divisor of ``n`` except ``n`` itself, ascending (SPEC 1.5.4)."""
    if n < 1:
        raise ValueError(f"proper_divisors needs a positive integer, got {n}")
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    large = [n // d for d in reversed(small) if n // d != d]
    return [d for d in small + large if d != n]


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is <= ``cap``; ``n`` itself counts."""
    return max(d for d in proper_divisors(n) + [n] if d <= cap)


def block_spread(squared: np.ndarray, period: int) -> float:
    """E(p): sqrt of the mean over blocks of each block's population variance, float64 (SPEC 1.5.4)."""
    blocks = squared.reshape(-1, period)
    return float(np.sqrt(blocks.var(axis=1).mean()))


def search_period(squared: np.ndarray) -> int:
    """The searched period for a float64 vector of squared gradients, before any fallback (SPEC 1.5.5).

    Candidates are the proper divisors in ascending order. Each candidate's score is
    the increase of E over the previous candidate (the first gets a tiny positive
    sentinel); the lowest ``(score, period)`` pair wins, and a winner below 8 becomes 1.
    """
    candidates = proper_divisors(len(squared))
    if not candidates:
        raise ValueError("period search needs at least two elements")
    scored = []
    previous = None
    for p in candidates:
        spread = block_spread(squared, p)
        score = FIRST_CANDIDATE_SCORE if previous is None else spread - previous
        previous = spread
        scored.append((score, p))
    best = min(scored)[1]
    return 1 if best < SMALLEST_SEARCHED_PERIOD else best


def fallback_period(n: int, global_shape: Sequence[int]) -> int:
    """The memory-safe fallback applied when the search returns 1 (SPEC 1.5.6).

    The larger of: the trailing dimension (when the parameter is at least 2-D, that
    dimension is >= 8 and divides ``n``) and the largest divisor of ``n`` not above 2048
    (``n`` itself included) when that is >= 8. Returns 1 when neither qualifies.
    """
    if n < SMALLEST_SEARCHED_PERIOD:
        return 1
    options = []
    if len(global_shape) >= 2:
        in_features = int(global_shape[-1])
        if in_features >= SMALLEST_SEARCHED_PERIOD and n % in_features == 0:
            options.append(in_features)
    capped = largest_divisor_at_most(n, FALLBACK_PERIOD_CAP)
    if capped >= SMALLEST_SEARCHED_PERIOD:
        options.append(capped)
    return max(options, default=1)


def period_from_squares(squared: np.ndarray, global_shape: Sequence[int]) -> int:
    """Search, then the fallback when the search found no structure (SPEC 1.5.5 step 4)."""
    period = search_period(squared)
    if period == 1:
        return fallback_period(len(squared), global_shape)
    return period


def squared_gradient(local_grad: torch.Tensor) -> np.ndarray:
    """Square in float32 (torch), flatten in logical order, widen to float64 (SPEC 1.5.3)."""
    return local_grad.detach().float().square().reshape(-1).cpu().numpy().astype(np.float64)


@dataclass(frozen=True)
class PeriodRules:
    """The constructor options that force period 1 (SPEC 1.5.2 rows 2-4)."""

    force_1d_period_one: bool = False
    force_2d_period_one: bool = False
    period_one_substrings: tuple[str, ...] = ()

    def forces_period_one(self, name: str, ndim: int) -> bool:
        if self.force_1d_period_one and ndim == 1:
            return True
        if self.force_2d_period_one and ndim == 2:
            return True
        lowered = name.lower()
        return any(sub in lowered for sub in self.period_one_substrings)


def choose_period(rules: PeriodRules, name: str, global_shape: Sequence[int], squared: np.ndarray) -> int:
    """Route one parameter to its period (SPEC 1.5.2).

    ``global_shape`` is the parameter's (global) shape; ``squared`` the local shard's
    squared values in float64. Single-element shards get 1; forced rules come next;
    otherwise search with fallback. Empty shards must not reach this function.
    """
    n = len(squared)
    if n == 0:
        raise ValueError(f"parameter {name!r}: an empty shard has no period")
    if n == 1 or rules.forces_period_one(name, len(global_shape)):
        return 1
    return period_from_squares(squared, global_shape)


def check_period_divides(name: str, numel: int, period: int) -> None:
    """A period that does not divide the local numel is an error (SPEC 1.5.8)."""
    if type(period) is not int or period < 1 or numel % period != 0:
        raise ValueError(
            f"period {period!r} of parameter {name!r} does not divide its {numel} local elements"
        )


__all__ = [
    "PeriodRules",
    "block_spread",
    "check_period_divides",
    "choose_period",
    "fallback_period",
    "largest_divisor_at_most",
    "period_from_squares",
    "proper_divisors",
    "search_period",
    "squared_gradient",
]

"""The period search of SPEC 1.5, exact, with the block statistics computed by the C kernels.

SPEC 1.5.4 scores each proper divisor ``p`` of ``n`` by ``E(p)``, numpy's float64
``sqrt(x.reshape(-1, p).var(axis=1).mean())`` of ``x = widen64(r32(r32(g)**2))``, and the period
is an exact obligation in every profile (SPEC 1.5.9, 5.6.11): near-ties between scores decide it.
This module does not reproduce numpy's summation order. It computes each ``E(p)`` another way and
bounds, rigorously, how far numpy's value can be from it; the period is decided only when those
bounds prove numpy's choice. Otherwise (near-ties, nearly constant gradients, non-finite values)
it runs the reference's numpy search, so the result is always the reference's.

The other way: ``E(p)**2 = (T - G(p) / p) / n`` exactly, with ``T = sum x**2`` and ``G(p)`` the sum of
the squared block sums (:mod:`csrc/period_search.c`, one pass over the gradient per prime
factor of ``n``, the other levels from the block sums of a divisor).

The bound. Let ``Q = T / n`` and ``u = 2**-53``. Whatever the summation order (all terms are
non-negative), our ``V = (T - G/p)/n`` is within ``1.02 (n + 2p + nb + 6) u Q`` of the exact
variance mean, and numpy's two-pass value (block mean rounded, deviations squared, summed,
divided; then the mean over the ``nb = n/p`` blocks) is within ``1.03 (p + nb + 3) u Q + 1.1 (pu)**2 Q``
of it (the rounded block mean adds ``p (m - m')**2`` to a block's sum of squared deviations, and
``m**2 <= mean of x**2``). Twice their sum bounds ``|V - V_numpy|``; the square root, numpy's
difference of consecutive scores and our own arithmetic widen the intervals by a few ``u``. Float64
never underflows here (nonzero ``x >= 2**-149 squared``) nor overflows (``x <= 2**256``).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from gefen_reference.periods import (
    FIRST_CANDIDATE_SCORE,
    SMALLEST_SEARCHED_PERIOD,
    PeriodRules,
    fallback_period,
    proper_divisors,
    search_period as reference_search_period,
    squared_gradient,
)

from . import kernels, native

_U = 2.0 ** -53
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
#: How each search was decided, for tests and profiles: "bounds" or "reference".
decisions = {"bounds": 0, "reference": 0}


def choose_period(rules: PeriodRules, name: str, global_shape: Sequence[int], local_grad: torch.Tensor) -> int:
    """SPEC 1.5.2's routing with the search below: the reference's ``choose_period`` for the same gradient."""
    n = local_grad.numel()
    if n == 0:
        raise ValueError(f"parameter {name!r}: an empty shard has no period")
    if n == 1 or rules.forces_period_one(name, len(global_shape)):
        return 1
    period = search_period(local_grad)
    return fallback_period(n, global_shape) if period == 1 else period


def _kernel_input(grad: torch.Tensor) -> Optional[torch.Tensor]:
    """The gradient as the kernels read it (flat, contiguous, fp32/bf16/fp16), or None."""
    if grad.device.type != "cpu" or not torch.is_floating_point(grad) or not kernels.available():
        return None
    flat = grad.detach().reshape(-1)
    if flat.dtype not in _SUFFIX:
        flat = flat.float()  # SPEC 1.5.3 rounds to fp32 first: the same input
    if flat.dtype == torch.float16 and not native.capabilities() & native.CAP_HALF:
        flat = flat.float()
    return flat.contiguous()


#: The longest tile whose levels are summed in registers (MAX_TILE in csrc/period_search.c).
_MAX_TILE = 256


def _plan(periods: list[int]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The order the kernel computes the periods in and where each one's block sums come from.

    First the chain q, q^2, ... (q the smallest period, each dividing the next, up to 256) summed
    tile by tile in one pass (source -2: no level array for them but the last); then the others
    ascending, each from the largest earlier period that divides it and has a level array (source
    index), else from the gradient (-1). ``last_use[i]`` is the last period deriving from ``i``.
    Returns ``(order, sources, last_use)``.
    """
    chain = []
    if periods:
        q = periods[0]
        power = q
        while power in periods and power <= _MAX_TILE:
            chain.append(power)
            power *= q
    rest = [p for p in periods if p not in chain]
    order = chain + rest
    sources = np.full(len(order), -1, dtype=np.int32)
    last_use = np.full(len(order), -1, dtype=np.int32)
    sources[: len(chain)] = -2
    usable = [len(chain) - 1] if chain else []
    for i in range(len(chain), len(order)):
        p = order[i]
        for j in sorted(usable, key=lambda j: -order[j]):
            if p % order[j] == 0:
                sources[i] = j
                last_use[j] = i
                break
        usable.append(i)
    return order, sources, last_use


def statistics(flat: torch.Tensor, periods: list[int]) -> Optional[tuple[np.ndarray, float]]:
    """``(G, T)`` for the periods (each dividing ``flat.numel()``), or None for a non-finite gradient."""
    lib = native.library()
    order, sources, last_use = _plan(periods)
    p = np.asarray(order, dtype=np.int64)
    g_out = np.zeros(len(periods), dtype=np.float64)
    t_out = np.zeros(1, dtype=np.float64)
    status = getattr(lib, f"gefen_period_statistics_{_SUFFIX[flat.dtype]}")(
        flat.data_ptr(), flat.numel(), p.ctypes.data, sources.ctypes.data, last_use.ctypes.data,
        len(periods), g_out.ctypes.data, t_out.ctypes.data, torch.get_num_threads(),
    )
    if status == -2:
        return None
    if status != 0:
        raise MemoryError("gefen_fast: the period search could not allocate its block sums") if status == -1 \
            else RuntimeError(f"gefen_fast: period statistics failed with status {status}")
    by_period = dict(zip(order, g_out))
    return np.asarray([by_period[q] for q in periods]), float(t_out[0])


def decide(n: int, candidates: list[int], G: np.ndarray, T: float) -> Optional[int]:
    """The search's winner (SPEC 1.5.5 steps 1-2) if the error bounds prove numpy picks it, else None.

    ``candidates`` are all proper divisors of ``n`` ascending (the first is 1); ``G`` holds G(p)
    for ``candidates[1:]``.
    """
    Q = T / n
    lo_e, hi_e = [0.0], [0.0]  # E(1) = 0 exactly, in numpy too
    for p, g in zip(candidates[1:], G):
        nb = n // p
        v = (T - float(g) / p) / n
        radius = 2.0 * (((n + 2 * p + nb + 6) * 1.02 + (p + nb + 3) * 1.03) * _U * Q + 1.1 * (p * _U) ** 2 * Q)
        lo_e.append(math.sqrt(max(v - radius, 0.0)) * (1.0 - 4 * _U))
        hi_e.append(math.sqrt(max(v + radius, 0.0)) * (1.0 + 4 * _U))
    # numpy's scores: w(c_0) = 1e-12, w(c_i) = fl(E_i - E_{i-1})
    lo_w, hi_w = [FIRST_CANDIDATE_SCORE], [FIRST_CANDIDATE_SCORE]
    for i in range(1, len(candidates)):
        slack = 4 * _U * (hi_e[i] + hi_e[i - 1])
        lo_w.append(lo_e[i] - hi_e[i - 1] - slack)
        hi_w.append(hi_e[i] - lo_e[i - 1] + slack)
    best = min(range(len(candidates)), key=lambda i: (hi_w[i], i))
    for j in range(len(candidates)):
        if j < best and not lo_w[j] > hi_w[best]:
            return None  # a smaller period could score as low (a tie goes to it)
        if j > best and not lo_w[j] >= hi_w[best]:
            return None
    return candidates[best]


def search_period(local_grad: torch.Tensor) -> int:
    """The searched period before any fallback (SPEC 1.5.5), equal to ``reference.periods.search_period``."""
    n = local_grad.numel()
    candidates = proper_divisors(n)
    if not candidates:
        raise ValueError("period search needs at least two elements")
    flat = _kernel_input(local_grad)
    best = None
    if flat is not None and len(candidates) > 1:
        stats = statistics(flat, candidates[1:])
        if stats is not None:
            best = decide(n, candidates, *stats)
    elif len(candidates) == 1:
        best = 1  # only p = 1: its sentinel score wins
    if best is None:
        decisions["reference"] += 1
        return reference_search_period(squared_gradient(local_grad))
    decisions["bounds"] += 1
    return 1 if best < SMALLEST_SEARCHED_PERIOD else best

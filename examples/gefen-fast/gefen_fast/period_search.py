"""The period search of SPEC 1.5, exact, with the block statistics computed by the C kernels.

SPEC 1.5.4 scores each proper divisor ``p`` of ``n`` by ``E(p)``, numpy's float64
``sqrt(x.reshape(-1, p).var(axis=1).mean())`` of ``x = widen64(r32(r32(g)**2))``, and the period
is an exact obligation in every profile (SPEC 1.5.9, 5.6.11): near-ties between scores decide it.
This module does not reproduce numpy's summation order. It computes each ``E(p)`` another way and
bounds, rigorously, how far numpy's value can be from it; the period is decided only when those
bounds prove numpy's choice. Otherwise (near-ties: the largest periods of big matrices, whose scores
differ by less than the bound, which grows with ``n``; nearly constant gradients) it evaluates numpy's
own score, the reference's ``block_spread``, for the contested candidates only, until the winner is
proven; non-finite gradients run the reference's whole numpy search. The result is always the
reference's.

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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from gefen_reference.periods import (
    FIRST_CANDIDATE_SCORE,
    SMALLEST_SEARCHED_PERIOD,
    PeriodRules,
    block_spread,
    fallback_period,
    proper_divisors,
    squared_gradient,
)
from gefen_reference.periods import (
    search_period as reference_search_period,
)

from . import kernels, native

_U = 2.0**-53
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
#: How each search was decided, for tests and profiles: "bounds" (the enclosures alone), "refined"
#: (numpy's own scores for the contested candidates, "refined_scores" of them in all) or "reference"
#: (non-finite gradients or no kernels: the reference's whole numpy search).
decisions = {"bounds": 0, "refined": 0, "refined_scores": 0, "reference": 0}


def choose_period(
    rules: PeriodRules, name: str, global_shape: Sequence[int], local_grad: torch.Tensor
) -> int:
    """SPEC 1.5.2's routing with the search below: the reference's ``choose_period`` for the same gradient."""
    n = local_grad.numel()
    if n == 0:
        raise ValueError(f"parameter {name!r}: an empty shard has no period")
    if n == 1 or rules.forces_period_one(name, len(global_shape)):
        return 1
    period = search_period(local_grad)
    return fallback_period(n, global_shape) if period == 1 else period


def _kernel_input(grad: torch.Tensor) -> torch.Tensor | None:
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


def statistics(flat: torch.Tensor, periods: list[int]) -> tuple[np.ndarray, float] | None:
    """``(G, T)`` for the periods (each dividing ``flat.numel()``), or None for a non-finite gradient."""
    lib = native.library()
    order, sources, last_use = _plan(periods)
    p = np.asarray(order, dtype=np.int64)
    g_out = np.zeros(len(periods), dtype=np.float64)
    t_out = np.zeros(1, dtype=np.float64)
    status = getattr(lib, f"gefen_period_statistics_{_SUFFIX[flat.dtype]}")(
        flat.data_ptr(),
        flat.numel(),
        p.ctypes.data,
        sources.ctypes.data,
        last_use.ctypes.data,
        len(periods),
        g_out.ctypes.data,
        t_out.ctypes.data,
        torch.get_num_threads(),
    )
    if status == -2:
        return None
    if status != 0:
        raise (
            MemoryError("gefen_fast: the period search could not allocate its block sums")
            if status == -1
            else RuntimeError(f"gefen_fast: period statistics failed with status {status}")
        )
    by_period = dict(zip(order, g_out))
    return np.asarray([by_period[q] for q in periods]), float(t_out[0])


def intervals(n: int, candidates: list[int], G: np.ndarray, T: float) -> tuple[list[float], list[float]]:
    """Rigorous enclosures ``[lo, hi]`` of numpy's ``E(p)`` for every candidate (``E(1) = 0`` exactly).

    ``candidates`` are all proper divisors of ``n`` ascending (the first is 1); ``G`` holds G(p)
    for ``candidates[1:]``.
    """
    Q = T / n
    lo_e, hi_e = [0.0], [0.0]  # E(1) = 0 exactly, in numpy too
    for p, g in zip(candidates[1:], G):
        nb = n // p
        v = (T - float(g) / p) / n
        radius = 2.0 * (
            ((n + 2 * p + nb + 6) * 1.02 + (p + nb + 3) * 1.03) * _U * Q + 1.1 * (p * _U) ** 2 * Q
        )
        lo_e.append(math.sqrt(max(v - radius, 0.0)) * (1.0 - 4 * _U))
        hi_e.append(math.sqrt(max(v + radius, 0.0)) * (1.0 + 4 * _U))
    return lo_e, hi_e


def _winner(
    candidates: list[int], lo_e: list[float], hi_e: list[float], exact: frozenset = frozenset()
) -> tuple[int | None, list[int]]:
    """``(index of the winner, [])`` if the enclosures prove numpy's choice, else ``(None, contested)``.

    Indices in ``exact`` hold numpy's own ``E`` (``lo_e[i] == hi_e[i]``): a score of two exact
    neighbours is numpy's float64 difference itself. ``contested``: the provisional winner and every
    index whose score might beat it (SPEC 1.5.5: the lowest score wins, a tie goes to the smaller period).
    """
    lo_w, hi_w = (
        [FIRST_CANDIDATE_SCORE],
        [FIRST_CANDIDATE_SCORE],
    )  # numpy: w(c_0) = 1e-12, w(c_i) = fl(E_i - E_{i-1})
    for i in range(1, len(candidates)):
        if i in exact and (i - 1) in exact:
            w = hi_e[i] - hi_e[i - 1]
            lo_w.append(w)
            hi_w.append(w)
            continue
        slack = 4 * _U * (hi_e[i] + hi_e[i - 1])
        lo_w.append(lo_e[i] - hi_e[i - 1] - slack)
        hi_w.append(hi_e[i] - lo_e[i - 1] + slack)
    best = min(range(len(candidates)), key=lambda i: (hi_w[i], i))
    contested = [
        j
        for j in range(len(candidates))
        if (j < best and not lo_w[j] > hi_w[best]) or (j > best and not lo_w[j] >= hi_w[best])
    ]
    return (None, [best] + contested) if contested else (best, [])


def decide(n: int, candidates: list[int], G: np.ndarray, T: float) -> int | None:
    """The search's winner (SPEC 1.5.5 steps 1-2) if the error bounds prove numpy picks it, else None."""
    index, _ = _winner(candidates, *intervals(n, candidates, G, T))
    return None if index is None else candidates[index]


def refine(
    squared: np.ndarray, candidates: list[int], lo_e: list[float], hi_e: list[float]
) -> tuple[int, int]:
    """The winner when the bounds cannot decide: numpy's own ``E(p)`` for the contested candidates only.

    Each round replaces the enclosures of the contested scores' two ends by the reference's
    ``block_spread`` (the very expression the reference's search evaluates, so the same float64),
    until the winner is proven; every round makes at least one more value exact, and with all of
    them exact it is the reference's comparison itself. Returns ``(winner index, values computed)``.
    """
    lo_e, hi_e = list(lo_e), list(hi_e)
    lo_e[0] = hi_e[0] = 0.0  # E(1) = 0 exactly, in numpy too
    exact = {0}
    while True:
        index, contested = _winner(candidates, lo_e, hi_e, frozenset(exact))
        if index is not None:
            return index, len(exact) - 1
        needed = sorted({k for i in contested for k in (i - 1, i) if k >= 0} - exact)
        if not needed:  # cannot happen (exact scores always decide); the reference's search is the answer
            return candidates.index(reference_search_period(squared)), len(exact) - 1
        for k, value in zip(needed, _spreads(squared, [candidates[k] for k in needed])):
            lo_e[k] = hi_e[k] = value
            exact.add(k)


def _spreads(squared: np.ndarray, periods: list[int]) -> list[float]:
    """``block_spread`` for each period, on up to torch's thread count at once (numpy drops the GIL)."""
    workers = min(len(periods), torch.get_num_threads())
    if workers <= 1 or squared.size < (1 << 20):
        return [block_spread(squared, p) for p in periods]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda p: block_spread(squared, p), periods))


def _squared_gradient(local_grad: torch.Tensor) -> np.ndarray:
    """The reference's ``squared_gradient`` (SPEC 1.5.3), the same float64 values: fp32 square in torch,
    flattened in logical order, widened in torch (exact, and on torch's threads) rather than by numpy."""
    return local_grad.detach().float().square().reshape(-1).to(torch.float64).cpu().numpy()


def search_period(local_grad: torch.Tensor) -> int:
    """The searched period before any fallback (SPEC 1.5.5), equal to
    ``gefen_reference.periods.search_period``."""
    n = local_grad.numel()
    candidates = proper_divisors(n)
    if not candidates:
        raise ValueError("period search needs at least two elements")
    if len(candidates) == 1:
        best = 1  # only p = 1: its sentinel score wins
    else:
        flat = _kernel_input(local_grad)
        stats = statistics(flat, candidates[1:]) if flat is not None else None
        if stats is None:  # no kernels, or a non-finite gradient: the reference's numpy search
            decisions["reference"] += 1
            return reference_search_period(squared_gradient(local_grad))
        lo_e, hi_e = intervals(n, candidates, *stats)
        index, _ = _winner(candidates, lo_e, hi_e)
        if index is None:  # a near-tie: numpy's own scores where it is contested
            index, computed = refine(_squared_gradient(local_grad), candidates, lo_e, hi_e)
            decisions["refined"] += 1
            decisions["refined_scores"] += computed
        else:
            decisions["bounds"] += 1
        best = candidates[index]
    return 1 if best < SMALLEST_SEARCHED_PERIOD else best

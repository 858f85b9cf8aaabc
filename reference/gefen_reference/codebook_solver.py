"""Exact optimal 1-D quantizer that turns the active histogram bins into the codebook.

Contract: SPEC 1.6 (codebook learning), clauses 1.6.6 to 1.6.8, which restate gefen-x
0.5.0's exact DP with forced endpoints. Notation follows the SPEC.

* Input: the active bins in ascending bin order, ``centers`` C[1..m] and ``counts``
  W[1..m] (all > 0). Both are rounded to float32 first, as gefen-x does, then widened to
  float64. K = ``k`` (256 for Gefen).
* Output: K float32 codewords, sorted ascending.
* Padding, m < K (1.6.7): the m centers fill the front, the largest center fills the
  rest, slot 0 becomes -1 (so the smallest active center is lost), the last slot +1,
  then the array is sorted. Duplicates are expected; there is no DP.
* DP, K <= m (1.6.8): cut the bins into K non-empty runs minimising the weighted squared
  error; run 1 is pinned to -1, run K to +1, any other run takes its weighted mean. Every
  operation is float64 and specified to the bit:

  - prefix sums ``PW``, ``PX``, ``PXX`` are sequential running sums of ``W``, ``W*C`` and
    ``W*(C*C)``, each with a leading 0; run [s..e] (1-based, inclusive) has
    ``Sw = PW[e] - PW[s-1]`` and likewise ``Sx``, ``Sxx``;
  - run cost: run 1 ``Sxx - (2*(-1))*Sx + ((-1)*(-1))*Sw``, run K
    ``Sxx - (2*1)*Sx + (1*1)*Sw`` (both evaluated left to right), other runs
    ``Sxx - (Sx*Sx)/Sw``;
  - ``D[0][0] = 0``, ``D[e][j] = min over s = j..e of D[s-1][j-1] + cost(s, e, j)``, the
    minimum taken by an upward scan with strict ``<``, so an exact tie goes to the
    smallest s;
  - backtracking from (m, K) gives the runs; an interior codeword is ``Sx/Sw`` in float64,
    stored as float32.

Two solvers, one contract, the same bits:

* :func:`solve_codebook_plain` writes the recurrence out, O(K*m^2). The fast solver is checked against it.
* :func:`solve_codebook` is the default. It finds the same minima with a divide-and-conquer
  search over monotone argmins whose window cuts are backed by rounding-error bounds, so
  it provably picks the same (leftmost) start as the full scan (see
  :func:`_interior_layer`). When the premises of that proof fail it runs the plain solver.

Failure modes. An empty histogram, a count <= 0 (after float32 rounding), arrays that are
not 1-D or differ in length, non-finite values and ``k < 1`` raise ``ValueError`` (gefen-x
checks only the first two). When K >= 3 and some count is lost in the float64 running sum
(``PW[i] == PW[i-1]``, possible only when counts span a ratio beyond 2**53) a single-bin
run has ``Sw == 0``; gefen-x's solver then raises ``ZeroDivisionError``, and so do these.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NUM_CODEWORDS", "solve_codebook", "solve_codebook_plain"]

NUM_CODEWORDS = 256

# Unit roundoff of float64.
_U = 2.0**-53


# ---------------------------------------------------------------------------
# Shared pieces of the contract
# ---------------------------------------------------------------------------


def _validated(centers, counts, k) -> tuple[np.ndarray, np.ndarray, int]:
    """Return ``(c, w, k)``: float32-rounded inputs widened to float64, checked."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    c = np.asarray(centers)
    w = np.asarray(counts)
    if c.ndim != 1 or w.ndim != 1:
        raise ValueError("centers and counts must be 1-D arrays")
    if c.shape != w.shape:
        raise ValueError(f"centers and counts differ in length ({c.shape[0]} != {w.shape[0]})")
    if c.shape[0] == 0:
        raise ValueError("empty histogram: no active bins")
    c = c.astype(np.float32).astype(np.float64)
    w = w.astype(np.float32).astype(np.float64)
    if not np.isfinite(c).all():
        raise ValueError("centers must be finite")
    if not (w > 0).all():  # also catches NaN
        raise ValueError("every count must be > 0")
    if not np.isfinite(w).all():
        raise ValueError("counts must be finite")
    return c, w, int(k)


def _padded_codebook(c: np.ndarray, k: int) -> np.ndarray:
    """The K > m case: no DP, endpoints forced, duplicates kept."""
    m = c.shape[0]
    cb = np.empty(k, dtype=np.float32)
    cb[:m] = c
    cb[m:] = c[-1]
    cb[0] = -1.0  # overwrites the smallest active center on purpose
    cb[-1] = 1.0
    return np.sort(cb)


def _prefix_sums(c: np.ndarray, w: np.ndarray):
    """Sequential float64 prefix sums of w, w*c and w*(c*c), each with a leading 0."""

    def cumulative(x):
        out = np.zeros(x.shape[0] + 1, dtype=np.float64)
        np.cumsum(x, out=out[1:])
        return out

    return cumulative(w), cumulative(w * c), cumulative(w * (c * c))


def _refuse_lost_counts(PW: np.ndarray, k: int) -> None:
    """Raise ZeroDivisionError where the recurrence would divide by ``Sw == 0``.

    With K >= 3 the interior layers evaluate every single-bin run [i..i], i >= 2, so a
    count swallowed by the running sum always leads to a division by zero.
    """
    if k >= 3:
        lost = np.flatnonzero(PW[2:] == PW[1:-1])
        if lost.size:
            raise ZeroDivisionError(
                f"count of active bin {int(lost[0]) + 2} (1-based) vanishes in the float64 "
                "running sum, so its single-bin run has Sw == 0"
            )


def _prepared(centers, counts, k):
    """What both solvers start from: the validated bins and codeword count ``(c, w, k)`` and the
    prefix sums ``(PW, PX, PXX)`` of the bins; None for the sums when there are fewer bins than
    codewords, whose codebook is the bins padded (:func:`_padded_codebook`)."""
    c, w, k = _validated(centers, counts, k)
    if k > c.shape[0]:
        return c, w, k, None
    sums = _prefix_sums(c, w)
    _refuse_lost_counts(sums[0], k)
    return c, w, k, sums


def _fixed_center_cost(center: float, sxx, sx, sw):
    """Cost of a segment pinned to ``center`` (+-1), evaluated left to right."""
    return sxx - (2.0 * center) * sx + (center * center) * sw


def _free_center_cost(sxx, sx, sw):
    """Cost of a segment quantized to its own weighted mean."""
    return sxx - (sx * sx) / sw


def _segment_cost(cluster: int, k: int, sxx, sx, sw):
    if cluster == 1:
        return _fixed_center_cost(-1.0, sxx, sx, sw)
    if cluster == k:
        return _fixed_center_cost(1.0, sxx, sx, sw)
    return _free_center_cost(sxx, sx, sw)


def _backtrack(start_of, PW, PX, k: int) -> np.ndarray:
    """Walk ``start_of[cluster][end]`` back from (m, K); return the sorted codebook."""
    cb = np.empty(k, dtype=np.float32)
    end = PW.shape[0] - 1
    for cluster in range(k, 0, -1):
        start = int(start_of[cluster][end])
        if cluster == 1:
            cb[0] = -1.0
        elif cluster == k:
            cb[k - 1] = 1.0
        else:
            cb[cluster - 1] = (PX[end] - PX[start - 1]) / (PW[end] - PW[start - 1])
        end = start - 1
    return np.sort(cb)


# ---------------------------------------------------------------------------
# The plain solver: the recurrence as written
# ---------------------------------------------------------------------------


def solve_codebook_plain(centers, counts, k: int = NUM_CODEWORDS) -> np.ndarray:
    """Solve the SPEC 1.6.7/1.6.8 codebook problem by the literal O(K*m^2) recurrence.

    ``centers`` and ``counts`` are the active bins (ascending centers, counts > 0); they
    are rounded to float32 and widened to float64. Returns float32 of shape ``[k]``,
    sorted. Raises ``ValueError`` on an empty histogram, a count <= 0, arrays of
    different lengths, non-finite values or ``k < 1``, and ``ZeroDivisionError`` when a
    count is lost in the running sum (see the module docstring).

    The scan over the start index s is vectorised; ``np.argmin`` returns the first
    minimum, which is what the strict-``<`` upward scan of the contract keeps. Every
    candidate is finite here, so no NaN can take part.
    """
    c, w, k, sums = _prepared(centers, counts, k)
    if sums is None:
        return _padded_codebook(c, k)
    m = c.shape[0]
    PW, PX, PXX = sums
    dp = np.full((k + 1, m + 1), np.inf)
    dp[0, 0] = 0.0
    start_of = np.full((k + 1, m + 1), -1, dtype=np.int64)

    for cluster in range(1, k + 1):
        for end in range(cluster, m + 1):
            # Candidate starts s = cluster..end; s - 1 runs over cluster-1..end-1.
            before = slice(cluster - 1, end)
            sw = PW[end] - PW[before]
            sx = PX[end] - PX[before]
            sxx = PXX[end] - PXX[before]
            candidate = dp[cluster - 1, before] + _segment_cost(cluster, k, sxx, sx, sw)
            j = int(np.argmin(candidate))
            dp[cluster, end] = candidate[j]
            start_of[cluster, end] = cluster + j

    return _backtrack(start_of, PW, PX, k)


# ---------------------------------------------------------------------------
# The default solver: same minima, found by monotone divide and conquer
# ---------------------------------------------------------------------------


def _monotone_search_applies(PW, PX) -> bool:
    """Check the premises of the error-bounded monotone search (see _interior_layer).

    The cost of the free-center segments, taken in exact arithmetic on the float64 prefix
    sums, satisfies the quadrangle inequality when the per-bin weights ``PW[i]-PW[i-1]`` are
    positive (guaranteed by :func:`_refuse_lost_counts`) and the per-bin means
    ``(PX[i]-PX[i-1])/(PW[i]-PW[i-1])`` are non-decreasing. Each computed mean is within
    3.01*u (relative) of its exact value, so a computed gap above 8*u*(|a|+|b|) proves
    the exact means are ordered. Real histograms pass; counts spanning ~1e12 may not.
    """
    mean = np.diff(PX) / np.diff(PW)
    gap = np.diff(mean)
    margin = 8.0 * _U * (np.abs(mean[1:]) + np.abs(mean[:-1]))
    return bool((gap > margin).all())


def _cost_scale(PW, PX, PXX) -> float:
    """Upper bound on ``|Sxx| + Sx^2/Sw`` over all segments (exact arithmetic).

    ``Sxx <= PXX[m]``; by Cauchy-Schwarz ``Sx^2/Sw`` is at most the largest squared
    per-bin mean times ``PW[m]``; the computed means are inflated by their error bound.
    """
    biggest_mean = float(np.max(np.abs(np.diff(PX) / np.diff(PW)))) * (1.0 + 8.0 * _U)
    return float(PXX[-1]) + biggest_mean**2 * float(PW[-1])


def _interior_layer(prev, PW, PX, PXX, cost_scale: float, cluster: int, last_end: int):
    """One interior layer: ``dp[e]`` and its leftmost argmin for e in cluster..last_end.

    Search: classic divide and conquer on the end index, run breadth-first so that all
    the end indices of one recursion level are evaluated in a single vectorised pass.
    For a middle end index ``mid`` every start in its window is scanned; the window of the
    ends left of ``mid`` is then capped at the largest start whose computed candidate is
    within ``tol`` of the minimum, and the window of the ends right of ``mid`` is floored
    at the smallest such start.

    Why this returns exactly what the full scan returns: let ``delta`` bound the error of
    any computed candidate against the same formula in exact arithmetic on the same
    float64 inputs (prefix sums and ``prev``). Then an exact minimiser s1 at ``mid`` has a
    computed value within 2*delta of the computed minimum, so it stays inside the window.
    A start s2 > s1 that is cut off for an end e' < mid is worse than s1 at ``mid`` by more
    than tol - 2*delta in exact arithmetic; by the quadrangle inequality it is worse by at
    least as much at e', hence its computed value exceeds s1's at e' by more than
    tol - 4*delta >= 0. So a cut start is never even tied with the minimum at e', and the
    leftmost minimiser of the window is the leftmost minimiser of the full range. The
    mirror argument covers the right side.

    ``delta`` is ``16*u*(max |prev| + cost_scale)``: a candidate's error is below
    ``u*(|prev| + 3.1*|Sxx| + 7.1*Sx^2/Sw)``, and ``cost_scale`` bounds the two segment
    terms (see :func:`_cost_scale`).
    """
    m = PW.shape[0] - 1
    dp = np.full(m + 1, np.inf)
    start_of = np.full(m + 1, -1, dtype=np.int64)

    delta = 16.0 * _U * (float(np.max(np.abs(prev[cluster - 1 : last_end]))) + cost_scale)
    tol = 5.0 * delta  # 4*delta is needed; the rest absorbs the rounding of min + tol

    end_lo = np.array([cluster])
    end_hi = np.array([last_end])
    s_lo = np.array([cluster])
    s_hi = np.array([last_end])
    while end_lo.size:
        mid = (end_lo + end_hi) >> 1
        top = np.minimum(s_hi, mid)
        length = top - s_lo + 1
        first = np.cumsum(length) - length
        n = int(first[-1] + length[-1])

        s = np.arange(n) + np.repeat(s_lo - first, length)
        before = s - 1
        e = np.repeat(mid, length)
        sw = PW[e] - PW[before]
        sx = PX[e] - PX[before]
        sxx = PXX[e] - PXX[before]
        candidate = prev[before] + _free_center_cost(sxx, sx, sw)

        best = np.minimum.reduceat(candidate, first)
        best_each = np.repeat(best, length)
        leftmost = np.minimum.reduceat(np.where(candidate == best_each, s, n + m), first)
        near = candidate <= best_each + tol
        near_lo = np.minimum.reduceat(np.where(near, s, n + m), first)
        near_hi = np.maximum.reduceat(np.where(near, s, -1), first)

        dp[mid] = best
        start_of[mid] = leftmost

        left = end_lo < mid
        right = mid < end_hi
        end_lo = np.concatenate([end_lo[left], mid[right] + 1])
        end_hi = np.concatenate([mid[left] - 1, end_hi[right]])
        s_lo = np.concatenate([s_lo[left], near_lo[right]])
        s_hi = np.concatenate([near_hi[left], s_hi[right]])
    return dp, start_of


def solve_codebook(centers, counts, k: int = NUM_CODEWORDS) -> np.ndarray:
    """Solve the SPEC 1.6.7/1.6.8 codebook problem; bit-identical to :func:`solve_codebook_plain`.

    Same inputs, output and errors as the plain solver. Only the end indices that can lie
    on a path to (m, K) are computed (layer j needs e in j..m-K+j), which changes none of
    the values on that path. The first layer has a single possible start (s = 1), the last
    needs only e = m and is scanned in full, and the interior layers use the error-bounded
    monotone search of :func:`_interior_layer`. If its premises fail (see
    :func:`_monotone_search_applies`) the plain solver runs.
    """
    c, w, k, sums = _prepared(centers, counts, k)
    if sums is None:
        return _padded_codebook(c, k)
    m = c.shape[0]
    PW, PX, PXX = sums
    if k > 2 and not _monotone_search_applies(PW, PX):
        return solve_codebook_plain(c, w, k)

    span = m - k  # layer j needs ends j..j+span
    start_of = np.full((k + 1, m + 1), -1, dtype=np.int64)

    # Layer 1: D[s-1][0] is finite only for s = 1, so every end starts at 1.
    ends = np.arange(1, 2 + span)
    prev = np.full(m + 1, np.inf)
    prev[ends] = 0.0 + _fixed_center_cost(-1.0, PXX[ends] - PXX[0], PX[ends] - PX[0], PW[ends] - PW[0])
    start_of[1, ends] = 1

    scale = _cost_scale(PW, PX, PXX) if k > 2 else 0.0
    for cluster in range(2, k):
        prev, start_of[cluster] = _interior_layer(prev, PW, PX, PXX, scale, cluster, cluster + span)

    if k > 1:
        before = np.arange(k - 1, m)
        candidate = prev[before] + _fixed_center_cost(
            1.0, PXX[m] - PXX[before], PX[m] - PX[before], PW[m] - PW[before]
        )
        start_of[k, m] = k + int(np.argmin(candidate))

    return _backtrack(start_of, PW, PX, k)

"""The nearest-codeword rule of SPEC 1.7 as a small table the kernels index in O(1).

SPEC 1.7.1 defines the index of a value ``u`` by a lower-bound search over the sorted
codebook followed by one fp32 distance comparison (ties to the lower index). As a function
of ``u`` that rule is piecewise constant. It changes only at

* the fp32 *decision threshold* between two consecutive distinct codewords ``cL < cR``:
  the largest fp32 ``u`` with ``|r32(u - cL)| <= |r32(u - cR)|`` (the predicate is
  monotone in ``u``, so a binary search over the fp32 values in between finds it exactly);
* the value ``t`` of a run of duplicate codewords at indices ``a < b``: ``u <= t`` picks
  ``a`` and ``u > t`` picks ``b`` (SPEC 1.7.3).

So with the sorted change points ``T[0] < T[1] < ...`` and the results ``R[0], R[1], ...``
between them, ``index(u) = R[number of T below u]``. The kernels find that count from the
cell of ``u``: [-1, 1] is cut into ``CELLS`` equal cells and ``first[cell]`` is the number of
change points below the cell; then at most two comparisons finish it:
``index = R[j + (u > T[j]) + (u > T[j + 1])]`` with ``j = first[cell]``. That is exact as long
as no cell holds more than two change points. Codebooks learned by SPEC 1.6 always satisfy
this (distinct codewords are at least one histogram bin, 2**-11, apart, so change points are
about 2**-12 apart or more, and a cell is 2**-12 wide). A codebook that does not (a loaded
one can be anything sorted with endpoints -1 and +1) gets ``exact=False`` and the kernels
use the plain lower-bound search. Everything fits in 24 KiB, so lookups hit the L1 cache.

The table is checked against the rule itself at every change point and its fp32
neighbours before it is used (:func:`build`), so a wrong table is never used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

CODEBOOK_SIZE = 256
#: Cells over [-1, 1]; a value's cell is ``int(r32(u + 1) * CELLS / 2)`` (CELLS + 1 entries, u = 1 included).
CELLS = 1 << 13
#: Change points a cell may hold for the table to be exact (the comparisons the kernels make).
POINTS_PER_CELL = 2
#: Room for every change point of 256 codewords (at most 2 per run boundary and duplicate run).
MAX_POINTS = 2 * CODEBOOK_SIZE
CELL_SCALE = np.float32(CELLS // 2)
#: Slack added to each cell's range when collecting change points, far above the rounding of ``u + 1``.
_CELL_SLACK = 2.0 ** -20


@dataclass(frozen=True)
class CodewordTable:
    """Everything a kernel needs to quantize against one codebook."""

    codebook: np.ndarray    # fp32[256], the search codebook
    first: np.ndarray       # uint16[CELLS + 1]: change points below each cell
    points: np.ndarray      # fp32[MAX_POINTS + 2]: the change points, padded with +inf
    results: np.ndarray     # int32[MAX_POINTS + 3]: the index between consecutive points
    exact: bool             # False: the kernels must use the lower-bound search

    def indices(self, values: np.ndarray) -> np.ndarray:
        """The table's answer for fp32 ``values`` in [-1, 1], as the kernels compute it."""
        v = np.asarray(values, dtype=np.float32)
        cell = np.clip(((v + np.float32(1.0)) * CELL_SCALE).astype(np.int64), 0, CELLS)
        j = self.first[cell].astype(np.int64)
        j = j + (v > self.points[j]) + (v > self.points[j + 1])
        return self.results[j].astype(np.uint8)


def rule_indices(codebook: np.ndarray, values: np.ndarray) -> np.ndarray:
    """SPEC 1.7.1 evaluated literally in numpy fp32 (lower bound, then one comparison)."""
    cb = np.asarray(codebook, dtype=np.float32)
    v = np.asarray(values, dtype=np.float32)
    upper = np.searchsorted(cb, v, side="left")
    left = np.clip(upper - 1, 0, CODEBOOK_SIZE - 1)
    right = np.clip(upper, 0, CODEBOOK_SIZE - 1)
    left_wins = np.abs(v - cb[left]) <= np.abs(v - cb[right])
    return np.where(left_wins, left, right).astype(np.uint8)


def _ordered(x: np.float32) -> int:
    """An integer that orders like the fp32 value (``-0.0`` and ``+0.0`` adjacent)."""
    bits = int(np.asarray(x, dtype=np.float32).view(np.int32))
    return bits if bits >= 0 else -(bits & 0x7FFFFFFF) - 1


def _from_ordered(k: int) -> np.float32:
    bits = k if k >= 0 else (-(k + 1)) | -0x80000000
    return np.asarray(bits, dtype=np.int32).view(np.float32)[()]


def _decision_threshold(c_left: np.float32, c_right: np.float32) -> np.float32:
    """The largest fp32 ``u`` in [cL, cR] whose distance to cL does not exceed that to cR.

    The predicate is monotone in ``u`` (both fp32 subtractions are), true at cL and false
    at cR, so a binary search over the fp32 values in between finds the threshold exactly.
    """
    def left_wins(u):
        return abs(np.float32(u - c_left)) <= abs(np.float32(u - c_right))

    lo, hi = _ordered(c_left), _ordered(c_right)  # left_wins(lo) holds, left_wins(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if left_wins(_from_ordered(mid)):
            lo = mid
        else:
            hi = mid
    return _from_ordered(lo)


def change_points(codebook: np.ndarray) -> tuple[list, list]:
    """``(thresholds, results)``: the rule gives ``results[j]`` for ``thresholds[j-1] < u <= thresholds[j]``."""
    cb = np.asarray(codebook, dtype=np.float32)
    runs = []  # (value, first index, last index)
    start = 0
    for i in range(1, CODEBOOK_SIZE + 1):
        if i == CODEBOOK_SIZE or cb[i] != cb[start]:
            runs.append((cb[start], start, i - 1))
            start = i
    thresholds, results = [], []
    for d, (value, first, last) in enumerate(runs):
        results.append(first)
        if last != first:
            thresholds.append(value)
            results.append(last)
        if d + 1 < len(runs):
            thresholds.append(_decision_threshold(value, runs[d + 1][0]))
    return thresholds, results


def build(codebook: torch.Tensor) -> CodewordTable:
    """The table for a sorted fp32[256] codebook (SPEC 1.6.2), verified against the rule."""
    cb = codebook.detach().to("cpu", torch.float32).numpy().copy()
    if cb.shape != (CODEBOOK_SIZE,):
        raise ValueError(f"a codebook has {CODEBOOK_SIZE} fp32 codewords, got shape {cb.shape}")
    thresholds, results = change_points(cb)
    t = np.asarray(thresholds, dtype=np.float64)
    lows = -1.0 + np.arange(CELLS + 1, dtype=np.float64) / float(CELL_SCALE) - _CELL_SLACK
    highs = lows + 1.0 / float(CELL_SCALE) + 2 * _CELL_SLACK
    first = np.searchsorted(t, lows, side="left")  # change points strictly below the cell (with slack)
    inside = np.searchsorted(t, highs, side="left") - first
    points = np.full(MAX_POINTS + 2, np.inf, dtype=np.float32)
    points[: len(thresholds)] = thresholds
    padded = np.full(MAX_POINTS + 3, results[-1], dtype=np.int32)
    padded[: len(results)] = results
    table = CodewordTable(cb, first.astype(np.uint16), points, padded,
                          bool(inside.max(initial=0) <= POINTS_PER_CELL))
    if table.exact:
        probes = [np.float32(-1.0), np.float32(0.0), np.float32(1.0)]
        for x in thresholds:
            probes += [np.nextafter(x, np.float32(-2), dtype=np.float32), x, np.nextafter(x, np.float32(2), dtype=np.float32)]
        probes = np.clip(np.asarray(probes, dtype=np.float32), -1.0, 1.0)
        if not np.array_equal(table.indices(probes), rule_indices(cb, probes)):
            table = CodewordTable(cb, table.first, points, padded, False)
    return table


def dequantization_table(codebook: torch.Tensor, grad_dtype: torch.dtype) -> np.ndarray:
    """fp32[256] codewords rounded to the gradient dtype (SPEC 1.8.8 steps 1 and 6, SPEC 1.13.5)."""
    return codebook.detach().to("cpu", torch.float32).to(grad_dtype).to(torch.float32).numpy().copy()

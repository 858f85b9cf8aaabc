"""The nearest-codeword rule of SPEC 1.7 as a table the kernels index in O(1).

SPEC 1.7.1 defines the index of a value ``u`` by a lower-bound search over the sorted
codebook followed by one fp32 distance comparison (ties to the lower index). As a function
of ``u`` that rule is piecewise constant: it changes only at

* the fp32 *decision threshold* between two consecutive distinct codewords ``cL < cR``:
  the largest fp32 ``u`` with ``|r32(u - cL)| <= |r32(u - cR)|`` (the predicate is
  monotone in ``u``, so the threshold is well defined and found exactly by stepping over
  fp32 neighbours), and
* the value ``t`` of a run of duplicate codewords at indices ``a < b``: ``u <= t`` picks
  ``a`` and ``u > t`` picks ``b`` (SPEC 1.7.3).

The table cuts [-1, 1] into ``CELLS`` equal cells. For each cell it stores a threshold and
two indices: ``index = low if u <= threshold else high``. That is exact as long as no cell
holds two change points. Codebooks learned by SPEC 1.6 always satisfy this: distinct
codewords are at least one histogram bin (2**-11) apart, so change points are at least
2**-12 apart and a cell is 2**-13 wide. A codebook that does not (one loaded from a
checkpoint can be anything sorted with endpoints -1 and +1) gets ``exact=False`` and the
kernels fall back to the plain lower-bound search.

The table is checked against the rule itself at every change point and its fp32
neighbours before it is used (:func:`build`), so a wrong table can never be used silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

CODEBOOK_SIZE = 256
#: Cells over [-1, 1]; a value's cell is ``int(r32(u + 1) * CELLS / 2)`` (CELLS + 1 entries, u = 1 included).
CELLS = 1 << 14
CELL_SCALE = np.float32(CELLS // 2)
#: Slack added to each cell's range when collecting change points, far above the rounding of ``u + 1``.
_CELL_SLACK = 2.0 ** -20


@dataclass(frozen=True)
class CodewordTable:
    """Everything a kernel needs to quantize against one codebook."""

    codebook: np.ndarray    # fp32[256], the search codebook
    threshold: np.ndarray   # fp32[CELLS + 1]
    pair: np.ndarray        # int32[CELLS + 1]: low index | high index << 8
    exact: bool             # False: the kernels must use the lower-bound search

    def indices(self, values: np.ndarray) -> np.ndarray:
        """The table's answer for fp32 ``values`` in [-1, 1] (numpy, for checks and tests)."""
        v = np.asarray(values, dtype=np.float32)
        cell = np.clip(((v + np.float32(1.0)) * CELL_SCALE).astype(np.int64), 0, CELLS)
        pair = self.pair[cell]
        return np.where(v <= self.threshold[cell], pair & 0xFF, pair >> 8).astype(np.uint8)


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
    first = np.searchsorted(t, lows, side="left")  # the first change point at or above the cell's low end
    count = np.searchsorted(t, highs, side="left") - first
    exact = bool(count.max(initial=0) <= 1)
    r = np.asarray(results + [results[-1]], dtype=np.int32)
    low = r[first]
    high = np.where(count == 1, r[np.minimum(first + 1, len(r) - 1)], low)
    pair = (low | (high << 8)).astype(np.int32)
    padded = np.asarray(list(thresholds) + [np.inf], dtype=np.float32)
    threshold = np.where(count == 1, padded[first], np.float32(np.inf)).astype(np.float32)
    table = CodewordTable(cb, threshold, pair, exact)
    if exact:
        probes = [np.float32(-1.0), np.float32(0.0), np.float32(1.0)]
        for x in thresholds:
            probes += [np.nextafter(x, np.float32(-2), dtype=np.float32), x, np.nextafter(x, np.float32(2), dtype=np.float32)]
        probes = np.clip(np.asarray(probes, dtype=np.float32), -1.0, 1.0)
        if not np.array_equal(table.indices(probes), rule_indices(cb, probes)):
            table = CodewordTable(cb, threshold, pair, False)
    return table


def dequantization_table(codebook: torch.Tensor, grad_dtype: torch.dtype) -> np.ndarray:
    """fp32[256] codewords rounded to the gradient dtype (SPEC 1.8.8 steps 1 and 6, SPEC 1.13.5)."""
    return codebook.detach().to("cpu", torch.float32).to(grad_dtype).to(torch.float32).numpy().copy()

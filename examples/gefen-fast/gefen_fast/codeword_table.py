"""The nearest-codeword rule of SPEC 1.7 as a table the kernels index in O(1), one comparison per value.

SPEC 1.7.1 defines the index of a value ``u`` by a lower-bound search over the sorted
codebook followed by one fp32 distance comparison (ties to the lower index). As a function
of ``u`` that rule is piecewise constant. It changes only at

* the fp32 *decision threshold* between two consecutive distinct codewords ``cL < cR``:
  the largest fp32 ``u`` with ``|r32(u - cL)| <= |r32(u - cR)|`` (the predicate is
  monotone in ``u``, so a binary search over the fp32 values in between finds it exactly);
* the value ``t`` of a run of duplicate codewords at indices ``a < b``: ``u <= t`` picks
  ``a`` and ``u > t`` picks ``b`` (SPEC 1.7.3).

The kernels cut [-1, 1] into ``CELLS`` cells by ``cell(u) = int(r32(u + 1) * 4096)`` (monotone in
``u``; NaN has its own cell) and read one 16-byte entry per value: the change point ``t`` inside
the cell (``+inf`` if none), the codes ``lo`` and ``hi`` on either side of it and their decoded
values (the codewords rounded to the gradient dtype, SPEC 1.8.8). So ``index(u) = hi if u > t
else lo``, exact as long as no cell holds two change points. Codebooks learned by SPEC 1.6 in
the DP case always satisfy this: distinct codewords are at least one histogram bin (2**-11)
apart, so their decision thresholds are too, and a cell is 2**-12 wide. Codebooks that do not (a
padding codebook whose duplicated top centre sits next to +1, or any loaded codebook: anything
sorted with endpoints -1 and +1) get ``use_cells=False`` and the kernels use the plain
lower-bound search.

The table is checked against the rule itself at every change point, every cell boundary and
their fp32 neighbours before it is used (:func:`build`), so a wrong table is never used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

CODEBOOK_SIZE = 256
#: Cells over [-1, 1]; u = 1 has cell CELLS, NaN has NAN_CELL.
CELLS = 1 << 13
NAN_CELL = CELLS + 1
CELL_SCALE = np.float32(CELLS // 2)
#: One kernel table entry (``Cell`` in csrc/gefen_common.h).
CELL_DTYPE = np.dtype([("t", "<f4"), ("lo_val", "<f4"), ("hi_val", "<f4"), ("codes", "<i4")])


def cell_of(values: np.ndarray) -> np.ndarray:
    """The kernels' cell of fp32 ``values`` in [-1, 1] (NaN: ``NAN_CELL``)."""
    v = np.asarray(values, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        x = (v + np.float32(1.0)) * CELL_SCALE
        cells = np.clip(np.nan_to_num(x, nan=0.0), 0, CELLS).astype(np.int64)
    return np.where(np.isnan(v), NAN_CELL, cells)


@dataclass(frozen=True)
class CodewordTable:
    """The structure of one codebook's cell table (the decoded values depend on the gradient dtype)."""

    codebook: np.ndarray  # fp32[256], the search codebook
    threshold: np.ndarray  # fp32[CELLS + 2]: the change point inside each cell, +inf if none
    lo: np.ndarray  # int32[CELLS + 2]: the code at or below the change point
    hi: np.ndarray  # int32[CELLS + 2]: the code above it
    use_cells: bool  # False: some cell holds two change points, the kernels must search

    def indices(self, values: np.ndarray) -> np.ndarray:
        """The table's answer for fp32 ``values`` in [-1, 1], as the kernels compute it."""
        v = np.asarray(values, dtype=np.float32)
        cell = cell_of(v)
        with np.errstate(invalid="ignore"):
            above = v > self.threshold[cell]
        return np.where(above, self.hi[cell], self.lo[cell]).astype(np.uint8)

    def cells(self, decode: np.ndarray) -> np.ndarray:
        """The kernel entries for the decoded codewords ``decode`` (fp32[256], SPEC 1.8.8 step 1)."""
        entries = np.empty(CELLS + 2, dtype=CELL_DTYPE)
        entries["t"] = self.threshold
        entries["lo_val"] = decode[self.lo]
        entries["hi_val"] = decode[self.hi]
        entries["codes"] = self.lo | ((self.hi - self.lo) << 16)
        return entries


def rule_indices(codebook: np.ndarray, values: np.ndarray) -> np.ndarray:
    """SPEC 1.7.1 evaluated literally in numpy fp32 (lower bound, then one comparison)."""
    cb = np.asarray(codebook, dtype=np.float32)
    v = np.asarray(values, dtype=np.float32)
    upper = np.searchsorted(cb, v, side="left")
    left = np.clip(upper - 1, 0, CODEBOOK_SIZE - 1)
    right = np.clip(upper, 0, CODEBOOK_SIZE - 1)
    with np.errstate(invalid="ignore"):
        left_wins = np.abs(v - cb[left]) <= np.abs(v - cb[right])
    return np.where(left_wins, left, right).astype(np.uint8)


def _ordered(x: np.ndarray) -> np.ndarray:
    """int64 keys that order like the fp32 values (``-0.0`` and ``+0.0`` adjacent)."""
    bits = np.asarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(bits >= 0, bits, -(bits & 0x7FFFFFFF) - 1)


def _from_ordered(k: np.ndarray) -> np.ndarray:
    bits = np.where(k >= 0, k, (-(k + 1)) | -0x80000000)
    return bits.astype(np.int32).view(np.float32)


def decision_thresholds(c_left: np.ndarray, c_right: np.ndarray) -> np.ndarray:
    """For each pair ``cL < cR``: the largest fp32 ``u`` in [cL, cR] whose distance to cL does not
    exceed that to cR.

    The predicate is monotone in ``u`` (both fp32 subtractions are), true at cL and false at cR,
    so a binary search over the fp32 values in between finds each threshold exactly; all pairs
    are searched at once.
    """
    c_left = np.asarray(c_left, dtype=np.float32)
    c_right = np.asarray(c_right, dtype=np.float32)
    lo, hi = _ordered(c_left), _ordered(c_right)  # left wins at lo, loses at hi
    while True:
        open_ = hi - lo > 1
        if not open_.any():
            return _from_ordered(lo)
        mid = (lo + hi) // 2
        u = _from_ordered(mid)
        left_wins = np.abs(u - c_left) <= np.abs(u - c_right)
        lo = np.where(open_ & left_wins, mid, lo)
        hi = np.where(open_ & ~left_wins, mid, hi)


def change_points(codebook: np.ndarray) -> tuple[list, list]:
    """``(thresholds, results)``: the rule gives ``results[j]`` for ``thresholds[j-1] < u <=
    thresholds[j]``."""
    cb = np.asarray(codebook, dtype=np.float32)
    starts = np.flatnonzero(np.concatenate([[True], cb[1:] != cb[:-1]]))
    ends = np.concatenate([starts[1:], [CODEBOOK_SIZE]]) - 1
    values = cb[starts]
    between = decision_thresholds(values[:-1], values[1:]) if len(values) > 1 else []
    thresholds, results = [], []
    for d in range(len(starts)):
        first, last = int(starts[d]), int(ends[d])
        results.append(first)
        if last != first:
            thresholds.append(values[d])
            results.append(last)
        if d + 1 < len(starts):
            thresholds.append(between[d])
    return thresholds, results


def _probes(thresholds: np.ndarray) -> np.ndarray:
    """Every change point and cell boundary with its fp32 neighbours, and the special values."""
    boundaries = (np.arange(CELLS + 1, dtype=np.float32) / CELL_SCALE - np.float32(1.0)).astype(np.float32)
    points = np.concatenate([thresholds.astype(np.float32), boundaries])
    near = [points]
    for direction in (np.float32(-2.0), np.float32(2.0)):
        step = points
        for _ in range(2):
            step = np.nextafter(step, direction, dtype=np.float32)
            near.append(step)
    special = np.asarray([-1.0, -0.0, 0.0, 1.0, np.nan], dtype=np.float32)
    return np.concatenate(near + [special]).clip(-1.0, 1.0)


def build(codebook: torch.Tensor) -> CodewordTable:
    """The cell table for a sorted fp32[256] codebook (SPEC 1.6.2), verified against the rule."""
    cb = codebook.detach().to("cpu", torch.float32).numpy().copy()
    if cb.shape != (CODEBOOK_SIZE,):
        raise ValueError(f"a codebook has {CODEBOOK_SIZE} fp32 codewords, got shape {cb.shape}")
    thresholds, results = change_points(cb)
    t = np.asarray(thresholds, dtype=np.float32)
    r = np.asarray(results, dtype=np.int32)
    at = cell_of(t)
    after = cell_of(np.nextafter(t, np.float32(2.0), dtype=np.float32))
    internal = at == after  # the answer changes between t and its successor, inside one cell
    # the answer at the first value of each cell: every switch that happened by then
    switch_cell = np.where(internal, at + 1, after)
    before = np.cumsum(np.bincount(switch_cell, minlength=CELLS + 3))[: CELLS + 2]
    threshold = np.full(CELLS + 2, np.inf, dtype=np.float32)
    lo = r[before].astype(np.int32)
    hi = lo.copy()
    per_cell = np.bincount(at[internal], minlength=CELLS + 2)
    inside = np.flatnonzero(internal)
    threshold[at[inside]] = t[inside]
    hi[at[inside]] = r[np.minimum(before[at[inside]] + 1, len(r) - 1)]
    threshold[NAN_CELL], lo[NAN_CELL], hi[NAN_CELL] = np.inf, CODEBOOK_SIZE - 1, CODEBOOK_SIZE - 1
    use_cells = bool(per_cell.max(initial=0) <= 1)
    table = CodewordTable(cb, threshold, lo, hi, use_cells)
    if use_cells:
        probes = _probes(t)
        if not np.array_equal(table.indices(probes), rule_indices(cb, probes)):
            table = CodewordTable(cb, threshold, lo, hi, False)
    return table


def dequantization_table(codebook: torch.Tensor, grad_dtype: torch.dtype) -> np.ndarray:
    """fp32[256] codewords rounded to the gradient dtype (SPEC 1.8.8 steps 1 and 6, SPEC 1.13.5)."""
    return codebook.detach().to("cpu", torch.float32).to(grad_dtype).to(torch.float32).numpy().copy()


def byte_planes(decode: np.ndarray) -> np.ndarray:
    """uint8[4, 256]: byte ``b`` of the little-endian bit pattern of ``decode[k]`` at ``[b, k]``.

    The AVX-512 loops decode 64 old indices at once with byte permutes over these planes (four
    registers per plane), then interleave the four bytes back into floats."""
    words = np.ascontiguousarray(decode, dtype="<f4")
    if words.shape != (256,):
        raise ValueError(f"decode must hold 256 codewords, got shape {words.shape}")
    return np.ascontiguousarray(words.view(np.uint8).reshape(256, 4).T)

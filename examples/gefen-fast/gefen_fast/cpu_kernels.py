"""Fused CPU kernels (numba) for the Gefen block-vmean step (SPEC 1.8) and factored step (SPEC 1.9).

One kernel call updates one parameter. Blocks are independent (every step of SPEC 1.8.8 is
row-local), so blocks are spread over the threads; a block is read from memory once and
stays in cache for its passes:

1. (block mode) the block's mean square, its vmean and its stepsize (SPEC 1.8.3, 1.8.7);
2. decode the old momentum, lerp, absolute maximum -> the new magnitude (SPEC 1.8.8 1-3);
3. decode and lerp again, normalise, nearest codeword (:mod:`gefen_fast.codeword_table`),
   write the index, decode it, update the parameter (SPEC 1.8.8 4-7).

Arithmetic is fp32 with one rounding per operation in the order the SPEC states; the lerp
is a true fused multiply-add. What differs from the reference (tolerance profile, SPEC
0.4.2): the order of the fp32 sums (block mean squares, factored row and column sums) and
the square root, which here is the correctly rounded IEEE one. The momentum (indices and
magnitudes) depends on neither, so it is the reference's bit for bit.

Parameters and gradients are flat buffers: fp32, or bf16 as uint16 bit patterns
(:mod:`gefen_fast.numba_primitives`). State buffers are the live state tensors' memory, so
the step is in place (SPEC 5.4.3).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .numba_primitives import f32_bits, f32_from_bits, fma32, load, round_bf16, round_like, store

ONE = np.float32(1.0)
ZERO = np.float32(0.0)
CELL_SCALE = np.float32(8192.0)  # codeword_table.CELL_SCALE
LAST_CELL = 16384                 # codeword_table.CELLS
ABS_MASK = np.uint32(0x7FFFFFFF)
#: Independent partial sums per reduction: they let the fp32 sums vectorize without reassociation.
LANES = 16

_JIT = dict(cache=True, fastmath=False, error_model="numpy")


@njit(inline="always", **_JIT)
def _lerp(cur, target, w, one_minus_w, small_weight):
    """torch ``lerp(cur, target, w)`` on CPU (SPEC 1.8.8 step 2, SPEC 1.13.3)."""
    d = target - cur
    if small_weight:
        return fma32(w, d, cur)
    return fma32(-one_minus_w, d, target)


@njit(inline="always", **_JIT)
def _nearest(u, codebook, threshold, pair, table_exact):
    """SPEC 1.7.1: by the table when it is exact for this codebook, else by a lower-bound search."""
    if table_exact:
        cell = np.int32((u + ONE) * CELL_SCALE)
        cell = min(max(cell, 0), LAST_CELL)
        both = pair[cell]
        return np.uint8(both & 0xFF) if u <= threshold[cell] else np.uint8(both >> 8)
    if u != u:
        return np.uint8(255)
    lo, hi = 0, 256
    while lo < hi:
        mid = (lo + hi) >> 1
        if codebook[mid] < u:
            lo = mid + 1
        else:
            hi = mid
    left = max(lo - 1, 0)
    right = min(lo, 255)
    return np.uint8(left) if abs(u - codebook[left]) <= abs(u - codebook[right]) else np.uint8(right)


@njit(inline="always", **_JIT)
def _block_sum_of_squares(grad, base, period, bf16_squares):
    """fp32 sum of g^2 over one block (SPEC 1.8.3); bf16 squares are rounded to bf16 first."""
    lanes = np.zeros(LANES, dtype=np.float32)
    full = period - period % LANES
    for j0 in range(0, full, LANES):
        for lane in range(LANES):
            x = load(grad, base + j0 + lane)
            square = x * x
            if bf16_squares:
                square = round_bf16(square)
            lanes[lane] += square
    total = ZERO
    for lane in range(LANES):
        total += lanes[lane]
    for j in range(full, period):
        x = load(grad, base + j)
        square = x * x
        if bf16_squares:
            square = round_bf16(square)
        total += square
    return total


@njit(inline="always", **_JIT)
def _block_magnitude(grad, idx, decode, base, period, old_magnitude, w, one_minus_w, small_weight):
    """max_j |lerp(decoded old momentum, g)| (SPEC 1.8.8 step 3), exactly.

    The maximum of non-negative fp32 values is the maximum of their bit patterns, which
    vectorizes; a NaN has the largest pattern, so it propagates as torch's amax does.
    """
    top = np.uint32(0)
    for j in range(period):
        i = base + j
        upd = _lerp(decode[idx[i]] * old_magnitude, load(grad, i), w, one_minus_w, small_weight)
        top = max(top, f32_bits(upd) & ABS_MASK)
    return f32_from_bits(top)


@njit(inline="always", **_JIT)
def _requantize_and_update(param, grad, idx, decode, codebook, threshold, pair, table_exact,
                           base, count, old_magnitude, magnitude, stepsize, w, one_minus_w,
                           small_weight, lr, decay, apply_decay):
    """SPEC 1.8.8 steps 4-7 for ``count`` elements from ``base`` that share one stepsize."""
    positive = magnitude > ZERO
    for j in range(count):
        i = base + j
        x = load(grad, i)
        upd = _lerp(decode[idx[i]] * old_magnitude, x, w, one_minus_w, small_weight)
        u = upd / magnitude if positive else ZERO
        k = _nearest(u, codebook, threshold, pair, table_exact)
        idx[i] = k
        delta = (decode[k] * magnitude * stepsize) * lr
        p = load(param, i)
        if apply_decay:
            p = round_like(param, p * decay)
        store(param, i, p - delta)


@njit(parallel=True, **_JIT)
def block_step(param, grad, idx, magnitude, vmean, decode, codebook, threshold, pair, table_exact,
               period, w, beta2, one_minus_beta2, sqrt_bias2, eps, inv_bias1, lr, decay, apply_decay,
               bf16_squares):
    """One block-vmean step (SPEC 1.8) of a flat parameter, in place.

    Scalars are fp32 values computed by the caller exactly as SPEC 1.8.5-1.8.7 rounds them:
    ``w = r32(1 - beta1)``, ``beta2 = r32(beta2)``, ``one_minus_beta2 = r32(1 - beta2)``,
    ``sqrt_bias2 = r32(sqrt(bc2))``, ``eps = r32(eps)``, ``inv_bias1 = r32(1 / bc1)``,
    ``lr = r32(lr)``, ``decay = r32(1 - lr * wd)``.
    """
    blocks = magnitude.shape[0]
    one_minus_w = ONE - w
    small_weight = abs(w) < np.float32(0.5)
    period32 = np.float32(period)
    for b in prange(blocks):
        base = b * period
        mean_square = _block_sum_of_squares(grad, base, period, bf16_squares) / period32
        if bf16_squares:
            mean_square = round_bf16(mean_square)
        v = fma32(one_minus_beta2, mean_square, vmean[b] * beta2)
        vmean[b] = v
        stepsize = (ONE / ((np.sqrt(v) / sqrt_bias2) + eps)) * inv_bias1
        old = magnitude[b]
        new = _block_magnitude(grad, idx, decode, base, period, old, w, one_minus_w, small_weight)
        magnitude[b] = new
        _requantize_and_update(param, grad, idx, decode, codebook, threshold, pair, table_exact,
                               base, period, old, new, stepsize, w, one_minus_w, small_weight,
                               lr, decay, apply_decay)


@njit(parallel=True, **_JIT)
def factored_second_moment(grad, rows, cols, v_row, v_col, beta2, one_minus_beta2):
    """SPEC 1.9.3 steps 3-5: row/column mean squares, their EMAs; returns mu = max(mean(v_row), tiny).

    Squares are fp32 for every dtype. Rows are split over chunks; each chunk keeps its own
    column partial sums, added in chunk order afterwards (a fixed order: deterministic).
    """
    chunks = min(rows, 64)
    col_parts = np.zeros((chunks, cols), dtype=np.float32)
    row_sums = np.zeros(rows, dtype=np.float32)
    for c in prange(chunks):
        r0 = c * rows // chunks
        r1 = (c + 1) * rows // chunks
        part = col_parts[c]
        lanes = np.zeros(LANES, dtype=np.float32)
        full = cols - cols % LANES
        for r in range(r0, r1):
            base = r * cols
            lanes[:] = ZERO
            for j0 in range(0, full, LANES):
                for lane in range(LANES):
                    x = load(grad, base + j0 + lane)
                    square = x * x
                    part[j0 + lane] += square
                    lanes[lane] += square
            total = ZERO
            for lane in range(LANES):
                total += lanes[lane]
            for j in range(full, cols):
                x = load(grad, base + j)
                square = x * x
                part[j] += square
                total += square
            row_sums[r] = total
    inv_cols = np.float32(cols)
    inv_rows = np.float32(rows)
    for r in range(rows):
        v_row[r] = fma32(one_minus_beta2, row_sums[r] / inv_cols, v_row[r] * beta2)
    for j in range(cols):
        total = ZERO
        for c in range(chunks):
            total += col_parts[c, j]
        v_col[j] = fma32(one_minus_beta2, total / inv_rows, v_col[j] * beta2)
    lanes = np.zeros(LANES, dtype=np.float32)
    for r in range(rows - rows % LANES):
        lanes[r % LANES] += v_row[r]
    mean = ZERO
    for lane in range(LANES):
        mean += lanes[lane]
    for r in range(rows - rows % LANES, rows):
        mean += v_row[r]
    mean = mean / inv_rows
    tiny = np.float32(np.finfo(np.float32).tiny)
    return mean if mean > tiny else tiny


@njit(parallel=True, **_JIT)
def factored_momentum_step(param, grad, idx, magnitude, decode, codebook, threshold, pair, table_exact,
                           period, cols, v_row, v_col, mu, w, bias2, eps, inv_bias1, lr, decay,
                           apply_decay):
    """SPEC 1.9.3 steps 6-10 for a flat ``rows x cols`` parameter, in place (``bias2 = r32(bc2)``).

    The per-element stepsize ``r32(r32(1 / den) * inv_bias1)`` with
    ``den = r32(sqrt(r32(r32(r32(v_row[r] * v_col[c]) / mu) / bias2)) + eps)`` is formed where
    the element is updated; a block may span rows, so it is walked row segment by segment.
    """
    blocks = magnitude.shape[0]
    one_minus_w = ONE - w
    small_weight = abs(w) < np.float32(0.5)
    for b in prange(blocks):
        base = b * period
        old = magnitude[b]
        new = _block_magnitude(grad, idx, decode, base, period, old, w, one_minus_w, small_weight)
        magnitude[b] = new
        positive = new > ZERO
        r = base // cols
        c = base - r * cols
        done = 0
        while done < period:
            count = min(cols - c, period - done)
            vr = v_row[r]
            start = base + done
            for j in range(count):
                i = start + j
                x = load(grad, i)
                upd = _lerp(decode[idx[i]] * old, x, w, one_minus_w, small_weight)
                u = upd / new if positive else ZERO
                k = _nearest(u, codebook, threshold, pair, table_exact)
                idx[i] = k
                v_hat = (vr * v_col[c + j]) / mu
                stepsize = (ONE / (np.sqrt(v_hat / bias2) + eps)) * inv_bias1
                delta = (decode[k] * new * stepsize) * lr
                p = load(param, i)
                if apply_decay:
                    p = round_like(param, p * decay)
                store(param, i, p - delta)
            done += count
            r += 1
            c = 0

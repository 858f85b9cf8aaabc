"""The Triton kernels of one Gefen step (SPEC 1.8 block step, 1.9 factored step).

Every kernel is a multi-tensor kernel: its program ids index a flat work list of tiles, and each
tile names its tensor by a slot of two tables built by :mod:`gefen_triton.launch` for the whole
step: ``ints`` (int64, :data:`NI` fields per tensor: the addresses of the parameter, gradient and
state tensors, their geometry and the step's flags) and ``floats`` (fp32, :data:`NF` fields per
tensor: the step's scalars, each rounded once from Python double on the host, SPEC 1.8.5-1.8.7,
1.9.3). A tensor's memory is reached through the address its slot holds, so one launch covers
every parameter of a dtype, whatever their shapes.

The arithmetic is the reference's, operation by operation, in fp32, with the rounding made
explicit so that the compiled kernel and Triton's interpreter compute the same bits (the host
launches with floating-point contraction off): ``tl.fma`` where the reference's ``lerp`` and
``add_(alpha=)`` are fused multiply-adds (SPEC 1.13.3), ``tl.div_rn`` and ``tl.sqrt_rn`` for the
IEEE division and square root, and an integer round-to-nearest-even for fp32 to bf16 (the
interpreter's own conversion truncates). What differs from the reference is what SPEC 5.6.1
allows: the order of the fp32 sums (tree or chunked), fp32 squares and means for bf16 blocks
(finer than the reference's bf16 rounding, SPEC 1.8.3), the decayed 16-bit parameter kept in fp32
until the update (finer than its separate rounding, SPEC 1.8.6), and, in the factored step, the
row's ``v_row / mean / bc2`` formed once per row (three fp32 roundings, as the reference's three,
in another order, SPEC 1.9.3 steps 5-6).

Kernels:

* :func:`tile_step`: blocks of a period up to :data:`MAX_TILE_PERIOD` elements, ``ROWS`` whole
  blocks per program, everything in one pass (each byte of parameter, gradient and state read
  and written once): block mean of squares and ``vmean`` (block parameters), the momentum
  (decode, lerp, block magnitude, nearest codeword), the stepsize and the update;
* :func:`split_stats`, :func:`split_blocks`, :func:`split_apply`: longer blocks, cut into chunks
  of ``CHUNK`` elements: per-chunk partial sums of squares and magnitudes, then per block the
  magnitude, ``vmean`` and stepsize, then the momentum and update per chunk;
* :func:`factored_squares`, :func:`factored_moments`: the factored second moment, row and column
  sums of squares per rectangular tile, then per parameter the ``v_row``/``v_col`` EMA, the
  clamped row mean and the per-row scale the update kernels use.
"""

from __future__ import annotations

import triton
import triton.language as tl

# -- the ints table: one row of NI int64 per tensor -----------------------------------------------
NI = tl.constexpr(20)
I_PARAM = tl.constexpr(0)  # address of the parameter (contiguous, its dtype)
I_GRAD = tl.constexpr(1)  # address of the gradient (contiguous, the parameter's dtype)
I_INDEX = tl.constexpr(2)  # address of m_codebook (uint8, nb x P)
I_MAGNITUDE = tl.constexpr(3)  # address of m_magnitude (fp32, nb)
I_V = tl.constexpr(4)  # address of vmean (block) or v_row (factored), fp32
I_VCOL = tl.constexpr(5)  # address of v_col (factored), fp32
I_BLOCKS = tl.constexpr(6)  # nb
I_PERIOD = tl.constexpr(7)  # P
I_ROWS = tl.constexpr(8)  # R (factored)
I_COLS = tl.constexpr(9)  # Cn (factored)
I_FROM_GRAD = tl.constexpr(10)  # 1: lerp as FMA(-(1 - w), d, g); 0: FMA(w, d, cur) (SPEC 1.8.8 step 2)
I_FACTORED = tl.constexpr(11)  # 1: factored stepsize (SPEC 1.9.3), 0: block stepsize (SPEC 1.8.7)
I_ROW_SCALE = tl.constexpr(12)  # scratch index of the factored per-row scale (R floats)
I_CHUNK0 = tl.constexpr(13)  # split: work-list index of the tensor's first chunk
I_CHUNKS = tl.constexpr(14)  # split: chunks per block
I_BLOCK0 = tl.constexpr(15)  # split: scratch row of the tensor's first block
I_ROW_PART = tl.constexpr(16)  # factored: scratch index of the row partial sums (R x ncb)
I_COL_PART = tl.constexpr(17)  # factored: scratch index of the column partial sums (nrb x Cn)
I_COL_TILES = tl.constexpr(18)  # factored: ncb, column tiles of the squares kernel
I_ROW_TILES = tl.constexpr(19)  # factored: nrb, row tiles of the squares kernel

# -- the floats table: one row of NF fp32 per tensor ----------------------------------------------
NF = tl.constexpr(8)
F_LERP = tl.constexpr(0)  # w = r32(1 - beta1), or -r32(1 - w) when w >= 0.5
F_BETA2 = tl.constexpr(1)  # r32(beta2)
F_ONE_MINUS_BETA2 = tl.constexpr(2)  # r32(1 - beta2)
F_BC2 = tl.constexpr(3)  # r32(sqrt(bc2)) (block) or r32(bc2) (factored)
F_EPS = tl.constexpr(4)  # r32(eps)
F_INV_BC1 = tl.constexpr(5)  # r32(1 / bc1)
F_LR = tl.constexpr(6)  # r32(lr)
F_DECAY = tl.constexpr(7)  # r32(1 - lr * wd), 1.0 without weight decay

#: The longest period :func:`tile_step` takes (one block per program); longer ones are split.
MAX_TILE_PERIOD = 8192
#: float32's smallest normal number, the clamp of the factored row mean (SPEC 1.9.3 step 5).
TINY = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def _round_to(x, DT: tl.constexpr):
    """fp32 ``x`` rounded to nearest even in the dtype ``DT`` (bf16 by integer rounding)."""
    if DT == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif DT == tl.float16:
        return x.to(tl.float16)
    else:
        return x


@triton.jit
def _widen(x, DT: tl.constexpr):
    """fp32 ``x`` rounded to ``DT`` and widened back to fp32: a codeword decoded at the gradient
    dtype's precision (SPEC 1.8.8 steps 1 and 6, 1.13.5)."""
    return _round_to(x, DT).to(tl.float32)


@triton.jit
def _nearest(cb_ptr, u):
    """Index and fp32 value of the codeword nearest ``u`` in the sorted fp32 codebook of 256 (SPEC
    1.7.1): ``i`` = how many entries are below ``u`` (a branchless lower bound), then the nearer of
    entries ``i - 1`` and ``i`` by their fp32 distances, the lower index on a tie."""
    pos = tl.zeros(u.shape, dtype=tl.int32)
    for k in tl.static_range(8):
        probe = tl.load(cb_ptr + pos + ((128 >> k) - 1))
        pos = tl.where(probe < u, pos + (128 >> k), pos)
    pos = tl.where(tl.load(cb_ptr + pos) < u, pos + 1, pos)
    left = tl.maximum(pos - 1, 0)
    right = tl.minimum(pos, 255)
    left_value = tl.load(cb_ptr + left)
    right_value = tl.load(cb_ptr + right)
    take_left = tl.abs(u - left_value) <= tl.abs(u - right_value)
    return tl.where(take_left, left, right), tl.where(take_left, left_value, right_value)


@triton.jit
def _momentum(g, old, old_magnitude, lerp, from_grad, cb_ptr, DT: tl.constexpr):
    """The new momentum before quantization (SPEC 1.8.8 steps 1-2): the old codeword, decoded at
    the gradient dtype's rounding, times the old block magnitude, then torch's lerp towards the
    fp32 gradient as one fused multiply-add."""
    cur = _widen(tl.load(cb_ptr + old), DT) * old_magnitude
    return tl.fma(lerp, g - cur, tl.where(from_grad, g, cur))


@triton.jit
def _requantize(upd, magnitude, cb_ptr, DT: tl.constexpr):
    """The nearest codeword of ``upd / magnitude`` (SPEC 1.8.8 steps 4-5; 0 where the block's
    magnitude is not positive) and the quantized momentum ``codeword * magnitude`` (step 6)."""
    positive = magnitude > 0
    u = tl.div_rn(upd, tl.where(positive, magnitude, 1.0))
    index, codeword = _nearest(cb_ptr, tl.where(positive, u, 0.0))
    return index, _widen(codeword, DT) * magnitude


@triton.jit
def _block_stepsize(v, bc2, eps, inv_bc1):
    """``r32(r32(1 / (sqrt(v) / r32(sqrt(bc2)) + eps)) * r32(1 / bc1))`` (SPEC 1.8.7)."""
    h = tl.div_rn(tl.sqrt_rn(v), bc2) + eps
    return tl.div_rn(tl.full(h.shape, 1.0, tl.float32), h) * inv_bc1


@triton.jit
def _factored_stepsize(scratch_ptr, v_col_ptr, row_scale0, flat, columns, ok, eps, inv_bc1):
    """Per element ``1 / (sqrt(v_row / mean / bc2 * v_col) + eps) / bc1`` (SPEC 1.9.3 steps 5-7)
    from the per-row scale :func:`factored_moments` left in the scratch buffer."""
    row = flat // columns
    col = flat - row * columns
    scale = tl.load(scratch_ptr + row_scale0 + row, mask=ok, other=0.0)
    v = scale * tl.load(v_col_ptr + col, mask=ok, other=0.0)
    den = tl.sqrt_rn(v) + eps
    return tl.div_rn(tl.full(den.shape, 1.0, tl.float32), den) * inv_bc1


@triton.jit
def _update(p_ptr, offsets, ok, qm, stepsize, lr, decay, DT: tl.constexpr):
    """``p <- rP(r32(p) * decay - r32(r32(qm * stepsize) * lr))`` (SPEC 1.8.6, 1.8.8 step 7); the
    decayed parameter stays fp32 (``decay`` is 1.0 without weight decay: exact)."""
    p = tl.load(p_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    p = tl.where(ok, p * decay - (qm * stepsize) * lr, 0.0)
    tl.store(p_ptr + offsets, _round_to(p, DT), mask=ok)


@triton.jit
def tile_step(
    tiles_ptr,
    ints_ptr,
    floats_ptr,
    scratch_ptr,
    cb_ptr,
    DT: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    EVEN: tl.constexpr,
):
    """One program: ``ROWS`` whole blocks (``COLS`` >= the period, a power of two) of one tensor,
    the tile ``(slot, first block)``. ``EVEN``: every tensor of the launch has period ``COLS`` and
    16-byte aligned memory (vector loads)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(tiles_ptr + 2 * t)
    first = tl.load(tiles_ptr + 2 * t + 1)
    ints = ints_ptr + slot * NI
    floats = floats_ptr + slot * NF
    p_ptr = tl.load(ints + I_PARAM).to(tl.pointer_type(DT))
    g_ptr = tl.load(ints + I_GRAD).to(tl.pointer_type(DT))
    i_ptr = tl.load(ints + I_INDEX).to(tl.pointer_type(tl.uint8))
    m_ptr = tl.load(ints + I_MAGNITUDE).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(ints + I_V).to(tl.pointer_type(tl.float32))
    blocks = tl.load(ints + I_BLOCKS)
    period = tl.load(ints + I_PERIOD)
    from_grad = tl.load(ints + I_FROM_GRAD) != 0
    factored = tl.load(ints + I_FACTORED) != 0

    rows = first + tl.arange(0, ROWS)
    row_ok = rows < blocks
    cols = tl.arange(0, COLS)
    if EVEN:
        p_ptr = tl.multiple_of(p_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        i_ptr = tl.multiple_of(i_ptr, 16)
        offsets = rows[:, None] * COLS + cols[None, :]
        ok = row_ok[:, None] & (cols < COLS)[None, :]
    else:
        offsets = rows[:, None] * period + cols[None, :]
        ok = row_ok[:, None] & (cols < period)[None, :]

    g = tl.load(g_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    old = tl.load(i_ptr + offsets, mask=ok, other=0).to(tl.int32)
    old_magnitude = tl.load(m_ptr + rows, mask=row_ok, other=0.0)
    upd = _momentum(g, old, old_magnitude[:, None], tl.load(floats + F_LERP), from_grad, cb_ptr, DT)
    upd = tl.where(ok, upd, 0.0)
    magnitude = tl.max(tl.abs(upd), axis=1)
    tl.store(m_ptr + rows, magnitude, mask=row_ok)
    new, qm = _requantize(upd, magnitude[:, None], cb_ptr, DT)
    tl.store(i_ptr + offsets, new.to(tl.uint8), mask=ok)

    eps = tl.load(floats + F_EPS)
    inv_bc1 = tl.load(floats + F_INV_BC1)
    if factored:
        v_col_ptr = tl.load(ints + I_VCOL).to(tl.pointer_type(tl.float32))
        stepsize = _factored_stepsize(
            scratch_ptr,
            v_col_ptr,
            tl.load(ints + I_ROW_SCALE),
            offsets,
            tl.load(ints + I_COLS),
            ok,
            eps,
            inv_bc1,
        )
    else:
        # SPEC 1.8.3: fp32 squares and mean (finer than bf16's), the EMA as one FMA
        mean_square = tl.div_rn(tl.sum(g * g, axis=1), period.to(tl.float32))
        v = tl.load(v_ptr + rows, mask=row_ok, other=0.0)
        v = tl.fma(tl.load(floats + F_ONE_MINUS_BETA2), mean_square, v * tl.load(floats + F_BETA2))
        tl.store(v_ptr + rows, v, mask=row_ok)
        stepsize = tl.broadcast_to(
            _block_stepsize(v, tl.load(floats + F_BC2), eps, inv_bc1)[:, None], (ROWS, COLS)
        )
    _update(p_ptr, offsets, ok, qm, stepsize, tl.load(floats + F_LR), tl.load(floats + F_DECAY), DT)


@triton.jit
def split_stats(
    items_ptr,
    ints_ptr,
    floats_ptr,
    scratch_ptr,
    parts0,
    cb_ptr,
    DT: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One program: chunk ``c`` of block ``b`` of one tensor (item ``(slot, b, c)``): the chunk's
    largest new momentum magnitude and sum of squares, into the scratch pair of the chunk's number
    among all split chunks of the step (the tensor's first chunk ``I_CHUNK0`` + ``b * chunks + c``)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(items_ptr + 3 * t)
    block = tl.load(items_ptr + 3 * t + 1)
    chunk = tl.load(items_ptr + 3 * t + 2)
    ints = ints_ptr + slot * NI
    g_ptr = tl.load(ints + I_GRAD).to(tl.pointer_type(DT))
    i_ptr = tl.load(ints + I_INDEX).to(tl.pointer_type(tl.uint8))
    m_ptr = tl.load(ints + I_MAGNITUDE).to(tl.pointer_type(tl.float32))
    period = tl.load(ints + I_PERIOD)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = cols < period
    offsets = block * period + cols
    g = tl.load(g_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    old = tl.load(i_ptr + offsets, mask=ok, other=0).to(tl.int32)
    upd = _momentum(
        g,
        old,
        tl.load(m_ptr + block),
        tl.load(floats_ptr + slot * NF + F_LERP),
        tl.load(ints + I_FROM_GRAD) != 0,
        cb_ptr,
        DT,
    )
    item = tl.load(ints + I_CHUNK0) + block * tl.load(ints + I_CHUNKS) + chunk
    tl.store(scratch_ptr + parts0 + 2 * item, tl.max(tl.abs(tl.where(ok, upd, 0.0)), axis=0))
    tl.store(scratch_ptr + parts0 + 2 * item + 1, tl.sum(g * g, axis=0))


@triton.jit
def split_blocks(
    blocks_ptr,
    ints_ptr,
    floats_ptr,
    scratch_ptr,
    parts0,
    block_scratch0,
    REDUCE: tl.constexpr,
):
    """One program: one split block ``(slot, b)``: its magnitude from the chunks' partials (written
    to ``m_magnitude``, the old one kept in the scratch pair ``block_scratch0 + 2 * (block0 + b)``
    for :func:`split_apply`), and for block parameters ``vmean`` and the block's stepsize (the
    pair's second entry)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(blocks_ptr + 2 * t)
    block = tl.load(blocks_ptr + 2 * t + 1)
    ints = ints_ptr + slot * NI
    floats = floats_ptr + slot * NF
    m_ptr = tl.load(ints + I_MAGNITUDE).to(tl.pointer_type(tl.float32))
    chunks = tl.load(ints + I_CHUNKS)
    first = tl.load(ints + I_CHUNK0) + block * chunks
    magnitude = tl.zeros([REDUCE], dtype=tl.float32)
    square_sum = tl.zeros([REDUCE], dtype=tl.float32)
    for c0 in range(0, chunks, REDUCE):
        c = c0 + tl.arange(0, REDUCE)
        items = parts0 + 2 * (first + c)
        magnitude = tl.maximum(magnitude, tl.load(scratch_ptr + items, mask=c < chunks, other=0.0))
        square_sum += tl.load(scratch_ptr + items + 1, mask=c < chunks, other=0.0)
    pair = scratch_ptr + block_scratch0 + 2 * (tl.load(ints + I_BLOCK0) + block)
    tl.store(pair, tl.load(m_ptr + block))
    tl.store(m_ptr + block, tl.max(magnitude, axis=0))
    if tl.load(ints + I_FACTORED) == 0:
        v_ptr = tl.load(ints + I_V).to(tl.pointer_type(tl.float32))
        mean_square = tl.div_rn(tl.sum(square_sum, axis=0), tl.load(ints + I_PERIOD).to(tl.float32))
        v = tl.fma(
            tl.load(floats + F_ONE_MINUS_BETA2),
            mean_square,
            tl.load(v_ptr + block) * tl.load(floats + F_BETA2),
        )
        tl.store(v_ptr + block, v)
        stepsize = _block_stepsize(
            v, tl.load(floats + F_BC2), tl.load(floats + F_EPS), tl.load(floats + F_INV_BC1)
        )
        tl.store(pair + 1, stepsize)


@triton.jit
def split_apply(
    items_ptr,
    ints_ptr,
    floats_ptr,
    scratch_ptr,
    block_scratch0,
    cb_ptr,
    DT: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One program: chunk ``c`` of block ``b`` (the items of :func:`split_stats`): the momentum
    again from the old indices and the old magnitude, its nearest codewords under the block's new
    magnitude, and the update."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(items_ptr + 3 * t)
    block = tl.load(items_ptr + 3 * t + 1)
    chunk = tl.load(items_ptr + 3 * t + 2)
    ints = ints_ptr + slot * NI
    floats = floats_ptr + slot * NF
    p_ptr = tl.load(ints + I_PARAM).to(tl.pointer_type(DT))
    g_ptr = tl.load(ints + I_GRAD).to(tl.pointer_type(DT))
    i_ptr = tl.load(ints + I_INDEX).to(tl.pointer_type(tl.uint8))
    m_ptr = tl.load(ints + I_MAGNITUDE).to(tl.pointer_type(tl.float32))
    period = tl.load(ints + I_PERIOD)
    pair = scratch_ptr + block_scratch0 + 2 * (tl.load(ints + I_BLOCK0) + block)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = cols < period
    offsets = block * period + cols
    g = tl.load(g_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    old = tl.load(i_ptr + offsets, mask=ok, other=0).to(tl.int32)
    from_grad = tl.load(ints + I_FROM_GRAD) != 0
    upd = _momentum(g, old, tl.load(pair), tl.load(floats + F_LERP), from_grad, cb_ptr, DT)
    magnitude = tl.load(m_ptr + block)
    new, qm = _requantize(upd, magnitude, cb_ptr, DT)
    tl.store(i_ptr + offsets, new.to(tl.uint8), mask=ok)
    eps = tl.load(floats + F_EPS)
    inv_bc1 = tl.load(floats + F_INV_BC1)
    if tl.load(ints + I_FACTORED) != 0:
        v_col_ptr = tl.load(ints + I_VCOL).to(tl.pointer_type(tl.float32))
        stepsize = _factored_stepsize(
            scratch_ptr,
            v_col_ptr,
            tl.load(ints + I_ROW_SCALE),
            offsets,
            tl.load(ints + I_COLS),
            ok,
            eps,
            inv_bc1,
        )
    else:
        stepsize = tl.full([CHUNK], 1.0, tl.float32) * tl.load(pair + 1)
    _update(p_ptr, offsets, ok, qm, stepsize, tl.load(floats + F_LR), tl.load(floats + F_DECAY), DT)


@triton.jit
def factored_squares(
    tiles_ptr,
    ints_ptr,
    scratch_ptr,
    DT: tl.constexpr,
    TR: tl.constexpr,
    TC: tl.constexpr,
):
    """One program: the ``TR x TC`` tile ``(slot, row tile, column tile)`` of a factored gradient:
    its fp32 squares summed along each row (scratch ``row_part[row, column tile]``) and down each
    column (``col_part[row tile, column]``) (SPEC 1.9.3 step 3, in another order)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(tiles_ptr + 3 * t)
    row_tile = tl.load(tiles_ptr + 3 * t + 1)
    col_tile = tl.load(tiles_ptr + 3 * t + 2)
    ints = ints_ptr + slot * NI
    g_ptr = tl.load(ints + I_GRAD).to(tl.pointer_type(DT))
    n_rows = tl.load(ints + I_ROWS)
    n_cols = tl.load(ints + I_COLS)
    rows = row_tile * TR + tl.arange(0, TR)
    cols = col_tile * TC + tl.arange(0, TC)
    ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    g = tl.load(g_ptr + rows[:, None] * n_cols + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    squares = g * g
    row_part = scratch_ptr + tl.load(ints + I_ROW_PART)
    tl.store(
        row_part + rows * tl.load(ints + I_COL_TILES) + col_tile, tl.sum(squares, axis=1), mask=rows < n_rows
    )
    col_part = scratch_ptr + tl.load(ints + I_COL_PART)
    tl.store(col_part + row_tile * n_cols + cols, tl.sum(squares, axis=0), mask=cols < n_cols)


@triton.jit
def factored_moments(
    slots_ptr,
    ints_ptr,
    floats_ptr,
    scratch_ptr,
    RT: tl.constexpr,
    KT: tl.constexpr,
):
    """One program: one factored parameter: ``v_row`` and ``v_col`` from the partial sums (mean,
    then the EMA as one FMA, SPEC 1.9.3 steps 3-4), the clamped row mean ``mu`` (step 5) and the
    per-row scale ``r32(r32(v_row / mu) / r32(bc2))`` the update kernels multiply by ``v_col``."""
    slot = tl.load(slots_ptr + tl.program_id(0))
    ints = ints_ptr + slot * NI
    floats = floats_ptr + slot * NF
    v_row_ptr = tl.load(ints + I_V).to(tl.pointer_type(tl.float32))
    v_col_ptr = tl.load(ints + I_VCOL).to(tl.pointer_type(tl.float32))
    n_rows = tl.load(ints + I_ROWS)
    n_cols = tl.load(ints + I_COLS)
    col_tiles = tl.load(ints + I_COL_TILES)
    row_tiles = tl.load(ints + I_ROW_TILES)
    row_part = scratch_ptr + tl.load(ints + I_ROW_PART)
    col_part = scratch_ptr + tl.load(ints + I_COL_PART)
    beta2 = tl.load(floats + F_BETA2)
    one_minus_beta2 = tl.load(floats + F_ONE_MINUS_BETA2)
    total = tl.zeros([RT], dtype=tl.float32)
    for r0 in range(0, n_rows, RT):
        rows = r0 + tl.arange(0, RT)
        acc = tl.zeros([RT], dtype=tl.float32)
        for k0 in range(0, col_tiles, KT):
            k = k0 + tl.arange(0, KT)
            ok = (rows < n_rows)[:, None] & (k < col_tiles)[None, :]
            acc += tl.sum(
                tl.load(row_part + rows[:, None] * col_tiles + k[None, :], mask=ok, other=0.0), axis=1
            )
        mean_square = tl.div_rn(acc, n_cols.to(tl.float32))
        v = tl.load(v_row_ptr + rows, mask=rows < n_rows, other=0.0)
        v = tl.fma(one_minus_beta2, mean_square, v * beta2)
        tl.store(v_row_ptr + rows, v, mask=rows < n_rows)
        total += tl.where(rows < n_rows, v, 0.0)
    for c0 in range(0, n_cols, RT):
        cols = c0 + tl.arange(0, RT)
        acc = tl.zeros([RT], dtype=tl.float32)
        for k0 in range(0, row_tiles, KT):
            k = k0 + tl.arange(0, KT)
            ok = (k < row_tiles)[:, None] & (cols < n_cols)[None, :]
            acc += tl.sum(tl.load(col_part + k[:, None] * n_cols + cols[None, :], mask=ok, other=0.0), axis=0)
        mean_square = tl.div_rn(acc, n_rows.to(tl.float32))
        v = tl.load(v_col_ptr + cols, mask=cols < n_cols, other=0.0)
        v = tl.fma(one_minus_beta2, mean_square, v * beta2)
        tl.store(v_col_ptr + cols, v, mask=cols < n_cols)
    mu = tl.maximum(tl.div_rn(tl.sum(total, axis=0), n_rows.to(tl.float32)), TINY)
    bc2 = tl.load(floats + F_BC2)
    row_scale = scratch_ptr + tl.load(ints + I_ROW_SCALE)
    for r0 in range(0, n_rows, RT):
        rows = r0 + tl.arange(0, RT)
        v = tl.load(v_row_ptr + rows, mask=rows < n_rows, other=0.0)
        tl.store(
            row_scale + rows,
            tl.div_rn(tl.div_rn(v, tl.full([RT], 1.0, tl.float32) * mu), bc2),
            mask=rows < n_rows,
        )

"""Scalar primitives the CPU kernels need and numba does not offer (SPEC 1.13.3, 1.8.3).

* :func:`f32_bits`: the bit pattern of an fp32 value as uint32 (for exact max reductions).
* :func:`fma32`: a correctly rounded fp32 fused multiply-add (LLVM ``llvm.fma.f32``), the
  arithmetic of torch's ``lerp`` on CPU. ``a*b + c`` in numba would round twice.
* :func:`load` / :func:`store`: read or write one element of a parameter or gradient buffer
  as fp32. fp32 buffers are used as they are; bf16 buffers are passed as their uint16 bit
  patterns (numba has no bf16 type), widened exactly and rounded to nearest-even on store.
* :func:`round_bf16`: an fp32 value rounded to the nearest bf16 (ties to even), kept as fp32;
  :func:`round_like` rounds to whatever a buffer stores.

NaN payloads are outside the conformance domain (SPEC 0.4.4); a NaN stays a NaN.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload


@intrinsic
def fma32(typingctx, a, b, c):
    """``r32(a*b + c)`` with a single rounding."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def f32_from_bits(typingctx, bits):
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def f32_bits(typingctx, value):
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@njit(inline="always", cache=True)
def bf16f32_from_bits(bits):
    return f32_from_bits(np.uint32(bits) << np.uint32(16))


@njit(inline="always", cache=True)
def f32_to_bf16_bits(value):
    bits = f32_bits(value)
    if value != value:  # keep NaN a (quiet) NaN instead of rounding it into an infinity
        return np.uint16((bits >> np.uint32(16)) | np.uint32(0x40))
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return np.uint16((bits + rounding) >> np.uint32(16))


@njit(inline="always", cache=True)
def round_bf16(value):
    return bf16f32_from_bits(f32_to_bf16_bits(value))


def load(buffer, i):  # pragma: no cover - replaced by the overload inside jitted code
    raise NotImplementedError


def store(buffer, i, value):  # pragma: no cover - replaced by the overload inside jitted code
    raise NotImplementedError


@overload(load, inline="always")
def _load(buffer, i):
    if buffer.dtype == types.float32:
        return lambda buffer, i: buffer[i]
    if buffer.dtype == types.uint16:
        return lambda buffer, i: bf16f32_from_bits(buffer[i])
    return None


@overload(store, inline="always")
def _store(buffer, i, value):
    if buffer.dtype == types.float32:
        def store_f32(buffer, i, value):
            buffer[i] = value
        return store_f32
    if buffer.dtype == types.uint16:
        def store_bf16(buffer, i, value):
            buffer[i] = f32_to_bf16_bits(value)
        return store_bf16
    return None


def round_like(buffer, value):  # pragma: no cover - replaced by the overload inside jitted code
    raise NotImplementedError


@overload(round_like, inline="always")
def _round_like(buffer, value):
    """``value`` rounded to the dtype the buffer stores (rP of SPEC 0.3), as fp32."""
    if buffer.dtype == types.float32:
        return lambda buffer, value: value
    if buffer.dtype == types.uint16:
        return lambda buffer, value: round_bf16(value)
    return None

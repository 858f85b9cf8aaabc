"""From torch tensors and a group's hyperparameters to one call of a C kernel (:mod:`gefen_fast.native`).

This module rounds every scalar once, as SPEC 1.8.5-1.8.7 and 1.9.3 say (Python double,
then fp32), advances the counters, and hands the kernels the live tensors' memory, so
parameters and state are updated in place (SPEC 5.4.3). The kernels read fp32, bf16 and fp16
parameters directly (fp16 through an fp32 copy where the library was built without fp16
support). A parameter or gradient that is not contiguous goes through a contiguous copy; a
parameter the kernels cannot take safely (another device or dtype, a gradient of another dtype,
memory shared between the parameter and its gradient, state of an unexpected size) is left to
the reference's torch step (:func:`handles`).
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import torch

from . import codeword_table, native

#: Parameter dtypes the CPU kernels handle; anything else uses the reference's torch path.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether the C kernels could be loaded; if not, say why once and use torch."""
    try:
        native.library()
    except native.BuildError as exc:
        warnings.warn(f"gefen_fast: C kernels unavailable, using the reference's torch step instead: {exc}",
                      RuntimeWarning, stacklevel=3)
        return False
    return True


@lru_cache(maxsize=1)
def native_half() -> bool:
    """Whether the library has fp16 kernels (else fp16 is staged through fp32 copies)."""
    return bool(native.capabilities() & native.CAP_HALF)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of two tensors intersect."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    def span(t):
        start = t.data_ptr()
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
        return start, start + (last + 1) * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def handles(param: torch.Tensor, grad: torch.Tensor) -> bool:
    """True when a CPU kernel updates this (local) parameter."""
    return (
        param.device.type == "cpu" and grad.device.type == "cpu"
        and param.dtype in KERNEL_DTYPES and grad.dtype == param.dtype
        and param.numel() == grad.numel()
        and available()
        and not _overlap(param, grad)
    )


class CodewordTables:
    """One optimizer's codeword tables, rebuilt whenever its codebook is another tensor or was
    modified in place (a load replaces it, SPEC 2.3.6 item 4)."""

    def __init__(self):
        self._codebook = None
        self._version = None
        self._table = None
        self._structs = {}

    def get(self, codebook: torch.Tensor, grad_dtype: torch.dtype) -> native.Table:
        if codebook is not self._codebook or codebook._version != self._version:
            self._table = codeword_table.build(codebook)
            self._codebook, self._version = codebook, codebook._version
            self._structs = {}
        entry = self._structs.get(grad_dtype)
        if entry is None:
            decode = codeword_table.dequantization_table(codebook, grad_dtype)
            cells = self._table.cells(decode)
            search = self._table.codebook
            struct = native.Table(cells.ctypes.data, decode.ctypes.data, search.ctypes.data,
                                  int(self._table.use_cells))
            entry = self._structs[grad_dtype] = (struct, cells, decode, search)  # arrays live with the struct
        return entry[0]


def _state(state: dict, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A live state tensor, made contiguous in place of the original if it is not; its size and
    dtype checked, because the kernels write ``numel`` elements through its pointer."""
    t = state[key]
    if t.numel() != numel or t.dtype != dtype or t.device.type != "cpu":
        raise _Unsuitable(f"state {key!r}: {t.dtype}[{t.numel()}] on {t.device}, expected {dtype}[{numel}]")
    if not t.is_contiguous():
        t = state[key] = t.contiguous()
    return t


class _Unsuitable(Exception):
    """The state does not have the layout the kernels write through; the torch step takes it."""


def _hyper(hyper, bias2_operand: float, bias1: float, decay: float, apply_decay: bool) -> native.Hyper:
    return native.Hyper(
        w=1 - hyper.beta1, beta2=hyper.beta2, one_minus_beta2=1 - hyper.beta2, bias2=bias2_operand,
        eps=hyper.eps, inv_bias1=1.0 / bias1, lr=hyper.lr, decay=decay, apply_decay=int(apply_decay),
        threads=torch.get_num_threads(),
    )


class _Buffers:
    """The parameter and gradient as kernel buffers; ``finish()`` writes a staged parameter back.

    Contiguous fp32/bf16 (and fp16 with native fp16 kernels) tensors are used in place; a
    non-contiguous one goes through a contiguous copy, and fp16 without native kernels through
    fp32 copies with the weight decay applied first in fp16 (SPEC 1.8.6).
    """

    def __init__(self, param: torch.Tensor, grad: torch.Tensor, decay: float):
        self.param = param
        self.work = param.detach() if param.is_contiguous() else param.detach().contiguous()
        self.grad = grad.detach() if grad.is_contiguous() else grad.detach().contiguous()
        self.staged = self.work
        self.apply_decay = decay != 1.0
        if param.dtype == torch.float16 and not native_half():
            if self.apply_decay:
                self.work.mul_(decay)  # rP(r32(p) * r32(1 - lr*wd)), SPEC 1.8.6
            self.staged = self.work.float()
            self.grad = self.grad.float()
            self.apply_decay = False
        self.suffix = _SUFFIX[self.staged.dtype]

    def finish(self) -> None:
        if self.staged is not self.work:
            self.work.copy_(self.staged)
        if self.work.data_ptr() != self.param.data_ptr():
            self.param.detach().copy_(self.work)


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("gefen_fast: a kernel could not allocate its scratch memory")


def _decay(hyper) -> float:
    return 1 - hyper.lr * hyper.weight_decay if hyper.weight_decay > 0.0 else 1.0


def block_update(param: torch.Tensor, grad: torch.Tensor, state: dict, tables: CodewordTables,
                 codebook: torch.Tensor, hyper) -> bool:
    """SPEC 1.8 for one CPU parameter (its local tensor); ``state`` already initialised.
    Returns False (nothing changed) when the state's layout does not fit the kernel."""
    n = grad.numel()
    period = int(state["automatic_period"])
    if period < 1 or n % period:
        return False
    try:
        indices = _state(state, "m_codebook", n, torch.uint8)
        magnitude = _state(state, "m_magnitude", n // period, torch.float32)
        vmean = _state(state, "vmean", n // period, torch.float32)
    except _Unsuitable:
        return False
    table = tables.get(codebook, grad.dtype)
    state["step"] += 1
    state["vmean_step"] += 1
    bias1 = 1 - hyper.beta1 ** state["step"]
    bias2 = 1 - hyper.beta2 ** state["vmean_step"]
    decay = _decay(hyper)
    buffers = _Buffers(param, grad, decay)
    kernel = getattr(native.library(), f"gefen_block_step_{buffers.suffix}")
    _check(kernel(
        buffers.staged.data_ptr(), buffers.grad.data_ptr(), indices.data_ptr(), magnitude.data_ptr(),
        vmean.data_ptr(), n // period, period, table,
        _hyper(hyper, math.sqrt(bias2), bias1, decay, buffers.apply_decay),
    ))
    buffers.finish()
    return True


def factored_update(param: torch.Tensor, grad: torch.Tensor, state: dict, tables: CodewordTables,
                    codebook: torch.Tensor, hyper) -> bool:
    """SPEC 1.9 for one plain 2-D CPU parameter; ``state`` already initialised.
    Returns False (nothing changed) when the state's layout does not fit the kernel."""
    rows, cols = param.shape
    n = rows * cols
    period = int(state["automatic_period"])
    if period < 1 or n % period or n == 0:
        return False
    try:
        indices = _state(state, "m_codebook", n, torch.uint8)
        magnitude = _state(state, "m_magnitude", n // period, torch.float32)
        v_row = _state(state, "v_row", rows, torch.float32)
        v_col = _state(state, "v_col", cols, torch.float32)
    except _Unsuitable:
        return False
    table = tables.get(codebook, grad.dtype)
    state["step"] += 1
    state["factored_step"] += 1
    bias1 = 1 - hyper.beta1 ** state["step"]
    bias2 = 1 - hyper.beta2 ** state["factored_step"]
    decay = _decay(hyper)
    buffers = _Buffers(param, grad, decay)
    lib = native.library()
    h = _hyper(hyper, bias2, bias1, decay, buffers.apply_decay)
    mu = getattr(lib, f"gefen_factored_moments_{buffers.suffix}")(
        buffers.grad.data_ptr(), rows, cols, v_row.data_ptr(), v_col.data_ptr(), h
    )
    _check(0 if mu >= 0 else -1)
    _check(getattr(lib, f"gefen_factored_step_{buffers.suffix}")(
        buffers.staged.data_ptr(), buffers.grad.data_ptr(), indices.data_ptr(), magnitude.data_ptr(),
        n // period, period, cols, v_row.data_ptr(), v_col.data_ptr(), mu, table, h,
    ))
    buffers.finish()
    return True

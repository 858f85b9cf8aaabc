"""From torch tensors and a group's hyperparameters to the C step kernels (:mod:`gefen_fast.native`).

:func:`prepare` turns one parameter's step into a work item: every scalar rounded once, as SPEC
1.8.5-1.8.7 and 1.9.3 say (Python double, then fp32), with the bias corrections of the next
counters, and the live tensors' memory, so parameters and state are updated in place (SPEC
5.4.3). :func:`run` hands all items of a step to one kernel call and then commits them (counters
advanced, staged copies written back); until then nothing has changed. The kernels read fp32, bf16 and fp16
parameters directly (fp16 through an fp32 copy where the library was built without fp16
support). A parameter or gradient that is not contiguous goes through a contiguous copy; a
parameter the kernels cannot take safely (another device or dtype, a gradient of another dtype,
memory shared between the parameter and its gradient, state of an unexpected size) is left to
the reference's torch step (:func:`handles`).
"""

from __future__ import annotations

import ctypes
import math
import struct
import warnings
from functools import lru_cache

import torch

from . import codeword_table, native

#: Parameter dtypes the CPU kernels handle; anything else uses the reference's torch path.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether the C kernels could be loaded; if not, say why once and use torch."""
    try:
        native.library()
    except native.BuildError as exc:
        warnings.warn(
            f"gefen_fast: C kernels unavailable, using the reference's torch step instead: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


@lru_cache(maxsize=1)
def native_half() -> bool:
    """Whether the library has fp16 kernels (else fp16 is staged through fp32 copies)."""
    return bool(native.capabilities() & native.CAP_HALF)


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.numel() * t.element_size()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
    return start, start + (last + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of two tensors intersect."""
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def handles(param: torch.Tensor, grad: torch.Tensor) -> bool:
    """True when a CPU kernel updates this (local) parameter."""
    return (
        param.is_cpu
        and grad.is_cpu
        and param.dtype in KERNEL_DTYPES
        and grad.dtype == param.dtype
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
        return self._entry(codebook, grad_dtype)[0]

    def address(self, codebook: torch.Tensor, grad_dtype: torch.dtype) -> int:
        """The address of :meth:`get`'s struct (alive as long as this table is current)."""
        return self._entry(codebook, grad_dtype)[4]

    def _entry(self, codebook: torch.Tensor, grad_dtype: torch.dtype) -> tuple:
        if codebook is not self._codebook or codebook._version != self._version:
            self._table = codeword_table.build(codebook)
            self._codebook, self._version = codebook, codebook._version
            self._structs = {}
        entry = self._structs.get(grad_dtype)
        if entry is None:
            decode = codeword_table.dequantization_table(codebook, grad_dtype)
            cells = self._table.cells(decode)
            search = self._table.codebook
            planes = codeword_table.byte_planes(decode)
            struct = native.Table(
                cells.ctypes.data,
                decode.ctypes.data,
                search.ctypes.data,
                planes.ctypes.data,
                int(self._table.use_cells),
            )
            # arrays live with the struct
            entry = self._structs[grad_dtype] = (
                struct,
                cells,
                decode,
                search,
                ctypes.addressof(struct),
                planes,
            )
        return entry


def _state(state: dict, key: str, numel: int, dtype: torch.dtype) -> int:
    """The address of a live state tensor, made contiguous in place of the original if it is not;
    its size and dtype checked, because the kernels write ``numel`` elements through it."""
    t = state[key]
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.numel() != numel or not t.is_cpu:
        raise _Unsuitable(key)
    if not t.is_contiguous():
        t = state[key] = t.contiguous()
    return t.data_ptr()


class _Unsuitable(Exception):
    """The state does not have the layout the kernels write through; the torch step takes it."""


class _Buffers:
    """The parameter and gradient as kernel buffers; ``finish()`` writes a staged parameter back.

    Contiguous fp32/bf16/fp16 tensors are used in place; a non-contiguous one goes through a
    contiguous copy, and fp16 without native kernels through fp32 copies with the weight decay
    applied first in fp16 (SPEC 1.8.6).
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
        self.dtype_code = _DTYPE_CODE[self.staged.dtype]

    def finish(self) -> None:
        if self.staged is not self.work:
            self.work.copy_(self.staged)
        if self.work.data_ptr() != self.param.data_ptr():
            self.param.detach().copy_(self.work)


_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class Pending:
    """One parameter's prepared step: the kernel's work item (a packed ``native.Work``) and what to
    commit after it ran."""

    __slots__ = ("work", "buffers", "state", "counter")

    def __init__(self, work, buffers, state, counter):
        self.work, self.buffers, self.state, self.counter = work, buffers, state, counter

    def commit(self) -> None:
        self.buffers.finish()
        self.state["step"] += 1
        self.state[self.counter] += 1


def _decay(hyper) -> float:
    return 1 - hyper.lr * hyper.weight_decay if hyper.weight_decay > 0.0 else 1.0


def prepare(
    param: torch.Tensor,
    grad: torch.Tensor,
    state: dict,
    tables: CodewordTables,
    codebook: torch.Tensor,
    hyper,
    factored: bool,
):
    """The kernel work for SPEC 1.8 (block) or 1.9 (factored) of one CPU parameter (its local
    tensor, state initialised), or None when the state's layout does not fit the kernels (then
    the torch step takes it). Nothing changes until :func:`run` commits it."""
    n = grad.numel()
    period = int(state["automatic_period"])
    if period < 1 or n == 0 or n % period:
        return None
    blocks = n // period
    try:
        indices = _state(state, "m_codebook", n, torch.uint8)
        magnitude = _state(state, "m_magnitude", blocks, torch.float32)
        if factored:
            rows, cols = param.shape
            v_row = _state(state, "v_row", rows, torch.float32)
            v_col = _state(state, "v_col", cols, torch.float32)
            vmean = 0
            counter = "factored_step"
        else:
            rows = cols = v_row = v_col = 0
            vmean = _state(state, "vmean", blocks, torch.float32)
            counter = "vmean_step"
    except _Unsuitable:
        return None
    bc1 = 1 - hyper.beta1 ** (state["step"] + 1)
    bc2 = 1 - hyper.beta2 ** (state[counter] + 1)
    decay = _decay(hyper)
    buffers = _Buffers(param, grad, decay)
    fields = (
        buffers.staged.data_ptr(),
        buffers.grad.data_ptr(),
        indices,
        magnitude,
        vmean,
        v_row,
        v_col,
        tables.address(codebook, grad.dtype),
        blocks,
        period,
        rows,
        cols,
        1 - hyper.beta1,
        hyper.beta2,
        1 - hyper.beta2,
        bc2 if factored else math.sqrt(bc2),
        hyper.eps,
        1.0 / bc1,
        hyper.lr,
        decay,
        int(buffers.apply_decay),
        buffers.dtype_code,
        int(factored),
    )
    return Pending(_pack_work(fields), buffers, state, counter)


#: ``native.Work`` as packed bytes: building a ctypes structure per parameter and step cost more
#: than the kernels' Python side needs (measured at 4.2M parameters, 8 tensors: benchmarks/README.md).
_WORK = struct.Struct("=8Q4q8f3i4x")


def _check_layout() -> None:
    """The packed layout is ``native.Work``'s, field by field (else the ctypes structure is used)."""
    names = [name for name, _ in native.Work._fields_ if name != "h"]
    offsets = [getattr(native.Work, name).offset for name in names]
    hyper = native.Work.h.offset
    expected = [8 * i for i in range(8)] + [64 + 8 * i for i in range(4)] + [hyper + 36, hyper + 40]
    hyper_offsets = [getattr(native.Hyper, name).offset for name, _ in native.Hyper._fields_]
    if (
        _WORK.size != ctypes.sizeof(native.Work)
        or offsets != expected
        or hyper != 96
        or hyper_offsets != [4 * i for i in range(9)]
    ):
        raise AssertionError("gefen_fast: native.Work does not have the packed layout")


_check_layout()


def _pack_work(fields: tuple) -> bytes:
    """The bytes of one ``native.Work``: the same fp32 roundings as ctypes' (a C cast of the double);
    a value beyond fp32's range, which struct refuses, goes through the ctypes structure (infinity)."""
    try:
        return _WORK.pack(*fields)
    except (struct.error, OverflowError):
        (p, g, idx, mag, vmean, v_row, v_col, tab, blocks, period, rows, cols, *hyper, dtype, factored) = (
            fields
        )
        work = native.Work(
            p,
            g,
            idx,
            mag,
            vmean,
            v_row,
            v_col,
            ctypes.cast(tab, ctypes.POINTER(native.Table)),
            blocks,
            period,
            rows,
            cols,
            native.Hyper(*hyper),
            dtype,
            factored,
        )
        return bytes(work)


def run(batch: list) -> None:
    """Run prepared steps in one kernel call, then commit them (parameters, counters).
    If the kernels cannot allocate their scratch memory, nothing has changed."""
    if not batch:
        return
    items = (native.Work * len(batch)).from_buffer_copy(b"".join(pending.work for pending in batch))
    status = native.library().gefen_step_batch(items, len(batch), torch.get_num_threads())
    if status == -1:
        raise MemoryError("gefen_fast: the step kernels could not allocate their scratch memory")
    if status != 0:
        raise RuntimeError(f"gefen_fast: the step kernels rejected their input (status {status})")
    for pending in batch:
        pending.commit()

"""From torch tensors and a group's hyperparameters to one call of a C kernel (:mod:`gefen_fast.native`).

This module rounds every scalar once, as SPEC 1.8.5-1.8.7 and 1.9.3 say (Python double,
then fp32), advances the counters, and hands the kernels the live tensors' memory, so
parameters and state are updated in place (SPEC 5.4.3). fp16 tensors take an fp32 copy
(the C kernels handle fp32 and bf16): the gradient widens exactly, and the parameter is
rounded back once, after weight decay was applied in its own dtype as SPEC 1.8.6 says.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import torch

from . import codeword_table, native

#: Parameter dtypes the CPU kernels handle; anything else uses the reference's torch path.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether the C kernels could be built and loaded; if not, say why once and use torch."""
    try:
        native.library()
    except native.BuildError as exc:
        warnings.warn(f"gefen_fast: C kernels unavailable, using the reference's torch step instead: {exc}",
                      RuntimeWarning, stacklevel=3)
        return False
    return True


def handles(param: torch.Tensor, grad: torch.Tensor) -> bool:
    """True when a CPU kernel updates this (local) parameter."""
    return (
        param.device.type == "cpu" and grad.device.type == "cpu"
        and param.dtype in KERNEL_DTYPES and grad.dtype == param.dtype
        and available()
    )


class CodewordTables:
    """One optimizer's codeword tables, rebuilt whenever its codebook is another tensor or was
    modified in place (a load replaces it, SPEC 2.3.6 item 4)."""

    def __init__(self):
        self._codebook = None
        self._version = None
        self._table = None
        self._decode = {}

    def get(self, codebook: torch.Tensor, grad_dtype: torch.dtype):
        if codebook is not self._codebook or codebook._version != self._version:
            self._table = codeword_table.build(codebook)
            self._codebook, self._version = codebook, codebook._version
            self._decode = {}
        if grad_dtype not in self._decode:
            decode = codeword_table.dequantization_table(codebook, grad_dtype)
            t = self._table
            struct = native.Table(decode.ctypes.data, t.codebook.ctypes.data, t.first.ctypes.data,
                                  t.points.ctypes.data, t.results.ctypes.data, int(t.exact))
            self._decode[grad_dtype] = (struct, decode)  # the arrays stay alive with the struct
        return self._decode[grad_dtype][0]


def _pointer(t: torch.Tensor) -> int:
    return t.data_ptr()


def _state(state: dict, key: str) -> torch.Tensor:
    """A live state tensor, made contiguous in place of the original if it is not."""
    if not state[key].is_contiguous():
        state[key] = state[key].contiguous()
    return state[key]


def _hyper(hyper, bias2_operand: float, bias1: float, decay: float, apply_decay: bool) -> native.Hyper:
    return native.Hyper(
        w=1 - hyper.beta1, beta2=hyper.beta2, one_minus_beta2=1 - hyper.beta2, bias2=bias2_operand,
        eps=hyper.eps, inv_bias1=1.0 / bias1, lr=hyper.lr, decay=decay, apply_decay=int(apply_decay),
        threads=torch.get_num_threads(),
    )


class _Buffers:
    """The parameter and gradient as kernel buffers; ``finish()`` writes a staged parameter back."""

    def __init__(self, param: torch.Tensor, grad: torch.Tensor, decay: float):
        self.param = param
        self.work = param.detach() if param.is_contiguous() else param.detach().contiguous()
        if param.dtype == torch.float16:
            if decay != 1.0:
                self.work.mul_(decay)  # rP(r32(p) * r32(1 - lr*wd)), SPEC 1.8.6
            self.staged = self.work.float()
            self.grad = grad.detach().float().contiguous()
            self.apply_decay = False
        else:
            self.staged = self.work
            self.grad = grad.detach().contiguous()
            self.apply_decay = decay != 1.0
        self.suffix = "bf16" if self.staged.dtype == torch.bfloat16 else "f32"

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
                 codebook: torch.Tensor, hyper) -> None:
    """SPEC 1.8 for one CPU parameter (its local tensor); ``state`` already initialised."""
    table = tables.get(codebook, grad.dtype)
    state["step"] += 1
    state["vmean_step"] += 1
    bias1 = 1 - hyper.beta1 ** state["step"]
    bias2 = 1 - hyper.beta2 ** state["vmean_step"]
    decay = _decay(hyper)
    buffers = _Buffers(param, grad, decay)
    magnitude = _state(state, "m_magnitude")
    period = int(state["automatic_period"])
    kernel = getattr(native.library(), f"gefen_block_step_{buffers.suffix}")
    status = kernel(
        _pointer(buffers.staged), _pointer(buffers.grad), _pointer(_state(state, "m_codebook")),
        _pointer(magnitude), _pointer(_state(state, "vmean")), magnitude.numel(), period,
        table, _hyper(hyper, math.sqrt(bias2), bias1, decay, buffers.apply_decay),
    )
    _check(status)
    buffers.finish()


def factored_update(param: torch.Tensor, grad: torch.Tensor, state: dict, tables: CodewordTables,
                    codebook: torch.Tensor, hyper) -> None:
    """SPEC 1.9 for one plain 2-D CPU parameter; ``state`` already initialised."""
    table = tables.get(codebook, grad.dtype)
    rows, cols = param.shape
    state["step"] += 1
    state["factored_step"] += 1
    bias1 = 1 - hyper.beta1 ** state["step"]
    bias2 = 1 - hyper.beta2 ** state["factored_step"]
    decay = _decay(hyper)
    buffers = _Buffers(param, grad, decay)
    lib = native.library()
    h = _hyper(hyper, bias2, bias1, decay, buffers.apply_decay)
    v_row, v_col = _state(state, "v_row"), _state(state, "v_col")
    mu = getattr(lib, f"gefen_factored_moments_{buffers.suffix}")(
        _pointer(buffers.grad), rows, cols, _pointer(v_row), _pointer(v_col), h
    )
    _check(0 if mu >= 0 else -1)
    magnitude = _state(state, "m_magnitude")
    status = getattr(lib, f"gefen_factored_step_{buffers.suffix}")(
        _pointer(buffers.staged), _pointer(buffers.grad), _pointer(_state(state, "m_codebook")),
        _pointer(magnitude), magnitude.numel(), int(state["automatic_period"]), cols,
        _pointer(v_row), _pointer(v_col), mu, table, h,
    )
    _check(status)
    buffers.finish()

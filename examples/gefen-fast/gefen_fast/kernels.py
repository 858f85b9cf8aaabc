"""From torch tensors and a group's hyperparameters to one call of a CPU kernel.

This module rounds every scalar once, as SPEC 1.8.5-1.8.7 and 1.9.3 say (Python double,
then fp32), advances the counters, and hands the kernels flat numpy views of the live
tensors, so parameters and state are updated in place. fp16 tensors take an fp32 copy
(numba has no fp16): the gradient widens exactly, and the parameter is rounded back once.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import codeword_table, cpu_kernels

#: Parameter dtypes the CPU kernels handle; anything else uses the reference's torch path.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def handles(param: torch.Tensor, grad: torch.Tensor) -> bool:
    """True when a CPU kernel updates this (local) parameter."""
    return (
        param.device.type == "cpu" and grad.device.type == "cpu"
        and param.dtype in KERNEL_DTYPES and grad.dtype == param.dtype
    )


class _Tables:
    """Codeword tables for the optimizer's current codebook, rebuilt when the codebook changes."""

    def __init__(self):
        self._codebook = None
        self._version = None
        self._table = None
        self._decode = {}

    def get(self, codebook: torch.Tensor, grad_dtype: torch.dtype):
        if codebook is not self._codebook or codebook._version != self._version:
            self._codebook, self._version = codebook, codebook._version
            self._table = codeword_table.build(codebook)
            self._decode = {}
        if grad_dtype not in self._decode:
            self._decode[grad_dtype] = codeword_table.dequantization_table(codebook, grad_dtype)
        return self._table, self._decode[grad_dtype]


_TABLES = _Tables()


def _f32(x: float) -> np.float32:
    return np.float32(x)


def _flat(t: torch.Tensor) -> np.ndarray:
    """A flat numpy view of a contiguous CPU tensor (bf16 as its uint16 bit patterns)."""
    t = t.detach().reshape(-1)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _contiguous_state(state: dict, key: str) -> np.ndarray:
    if not state[key].is_contiguous():
        state[key] = state[key].contiguous()
    return state[key].view(-1).numpy()


class _Buffers:
    """The parameter and gradient as kernel buffers; ``finish()`` writes a staged parameter back."""

    def __init__(self, param: torch.Tensor, grad: torch.Tensor, decay: float):
        self.param = param
        self.work = param if param.is_contiguous() else param.contiguous()
        if param.dtype == torch.float16:
            if decay != 1.0:
                self.work.mul_(decay)  # rP(r32(p) * r32(1 - lr*wd)), SPEC 1.8.6
            self.staged = self.work.float()
            self.grad = _flat(grad.detach().float().contiguous())
            self.apply_decay = False
        else:
            self.staged = self.work
            self.grad = _flat(grad.contiguous())
            self.apply_decay = decay != 1.0
        self.flat_param = _flat(self.staged)

    def finish(self) -> None:
        if self.staged is not self.work:
            self.work.copy_(self.staged)
        if self.work is not self.param:
            self.param.copy_(self.work)


def block_update(param: torch.Tensor, grad: torch.Tensor, state: dict, codebook: torch.Tensor, hyper) -> None:
    """SPEC 1.8 for one CPU parameter (its local tensor); ``state`` already initialised."""
    table, decode = _TABLES.get(codebook, grad.dtype)
    state["step"] += 1
    state["vmean_step"] += 1
    bias1 = 1 - hyper.beta1 ** state["step"]
    bias2 = 1 - hyper.beta2 ** state["vmean_step"]
    decay = 1 - hyper.lr * hyper.weight_decay if hyper.weight_decay > 0.0 else 1.0
    buffers = _Buffers(param, grad, decay)
    cpu_kernels.block_step(
        buffers.flat_param, buffers.grad,
        _contiguous_state(state, "m_codebook"), _contiguous_state(state, "m_magnitude"),
        _contiguous_state(state, "vmean"),
        decode, table.codebook, table.threshold, table.pair, table.exact,
        int(state["automatic_period"]),
        _f32(1 - hyper.beta1), _f32(hyper.beta2), _f32(1 - hyper.beta2), _f32(math.sqrt(bias2)),
        _f32(hyper.eps), _f32(1.0 / bias1), _f32(hyper.lr), _f32(decay), buffers.apply_decay,
        grad.dtype == torch.bfloat16,
    )
    buffers.finish()


def factored_update(param: torch.Tensor, grad: torch.Tensor, state: dict, codebook: torch.Tensor, hyper) -> None:
    """SPEC 1.9 for one plain 2-D CPU parameter; ``state`` already initialised."""
    table, decode = _TABLES.get(codebook, grad.dtype)
    rows, cols = param.shape
    state["step"] += 1
    state["factored_step"] += 1
    bias1 = 1 - hyper.beta1 ** state["step"]
    bias2 = 1 - hyper.beta2 ** state["factored_step"]
    decay = 1 - hyper.lr * hyper.weight_decay if hyper.weight_decay > 0.0 else 1.0
    buffers = _Buffers(param, grad, decay)
    v_row, v_col = _contiguous_state(state, "v_row"), _contiguous_state(state, "v_col")
    mu = cpu_kernels.factored_second_moment(
        buffers.grad, rows, cols, v_row, v_col, _f32(hyper.beta2), _f32(1 - hyper.beta2)
    )
    cpu_kernels.factored_momentum_step(
        buffers.flat_param, buffers.grad,
        _contiguous_state(state, "m_codebook"), _contiguous_state(state, "m_magnitude"),
        decode, table.codebook, table.threshold, table.pair, table.exact,
        int(state["automatic_period"]), cols, v_row, v_col, np.float32(mu),
        _f32(1 - hyper.beta1), _f32(bias2), _f32(hyper.eps), _f32(1.0 / bias1), _f32(hyper.lr),
        _f32(decay), buffers.apply_decay,
    )
    buffers.finish()

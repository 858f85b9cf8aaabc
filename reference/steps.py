"""Per-parameter update arithmetic (SPEC 1.8 block-vmean step, SPEC 1.9 factored step).

Each function updates one parameter and its state in place. The order of torch
operations *is* the specification in the torch-exact profile: fp32 reductions,
sqrt and the fused multiply-adds of ``lerp``/``add_(alpha=)`` are whatever torch's
CPU kernels compute, so the same primitives are called in the same order.

State tensors are always fp32 (indices uint8), whatever the parameter dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .codewords import dequantize, nearest_codeword_indices


@dataclass(frozen=True)
class StepHyper:
    """A group's hyperparameters resolved for one step (lr already a float, SPEC 1.4)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float


def new_momentum_state(state: dict, numel: int, period: int, device: torch.device) -> None:
    """Zero momentum for a param's first step: indices 0 (codeword -1) with magnitude 0."""
    blocks = numel // period
    state["step"] = 0
    state["m_codebook"] = torch.zeros((blocks, period), dtype=torch.uint8, device=device)
    state["m_magnitude"] = torch.zeros((blocks, 1), dtype=torch.float32, device=device)


def new_block_second_moment(state: dict, device: torch.device) -> None:
    state["vmean"] = torch.zeros_like(state["m_magnitude"])
    state["vmean_step"] = 0


def new_factored_second_moment(state: dict, shape: tuple[int, int], device: torch.device) -> None:
    state["v_row"] = torch.zeros(shape[0], dtype=torch.float32, device=device)
    state["v_col"] = torch.zeros(shape[1], dtype=torch.float32, device=device)
    state["factored_step"] = 0


def requantized_momentum(state: dict, codebook: torch.Tensor, grad_blocks: torch.Tensor, beta1: float) -> torch.Tensor:
    """Advance the quantized momentum by one step and return it dequantized (SPEC 1.8.7).

    ``m = lerp(dequant(old), g, 1 - beta1)``; the new block magnitude is ``max|m|``;
    the new indices are the nearest codewords of ``m / magnitude`` (0 where the
    magnitude is not positive). The returned momentum is the *re-quantized* value
    ``codeword (rounded to the grad dtype) * magnitude``, which drives the update.
    """
    period = grad_blocks.shape[1]
    current = dequantize(codebook, state["m_codebook"], grad_blocks.dtype) * state["m_magnitude"]
    updated = current.lerp(grad_blocks.to(current.dtype), 1 - beta1)
    magnitude = state["m_magnitude"]
    magnitude.copy_(updated.abs().reshape(-1, period).amax(dim=1, keepdim=True))
    updated.div_(magnitude)
    updated.masked_fill_(~(magnitude > 0), 0.0)
    indices = nearest_codeword_indices(codebook, updated)
    state["m_codebook"].copy_(indices)
    return dequantize(codebook, indices, grad_blocks.dtype) * magnitude


def block_mean_square(grad_blocks: torch.Tensor) -> torch.Tensor:
    """Per-block mean of g^2: fp16 is promoted to fp32 first, bf16 squares and means in bf16."""
    g = grad_blocks.float() if grad_blocks.dtype == torch.float16 else grad_blocks
    return torch.mean(g * g, dim=1, keepdim=True)


def block_vmean_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    state: dict,
    codebook: torch.Tensor,
    hyper: StepHyper,
) -> None:
    """One block-vmean update of ``param`` (its local tensor) from ``grad`` (SPEC 1.8)."""
    period = state["automatic_period"]
    grad_blocks = grad.reshape(-1).view(-1, period)

    state["vmean"].mul_(hyper.beta2).add_(block_mean_square(grad_blocks), alpha=1 - hyper.beta2)
    state["step"] += 1
    state["vmean_step"] += 1
    bias1 = 1 - hyper.beta1 ** state["step"]
    bias2 = 1 - hyper.beta2 ** state["vmean_step"]

    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)

    denom = torch.sqrt(state["vmean"]).div_(math.sqrt(bias2)).add_(hyper.eps)
    stepsize = torch.reciprocal(denom).mul_(1.0 / bias1)

    momentum = requantized_momentum(state, codebook, grad_blocks, hyper.beta1)
    update = momentum.mul_(stepsize).mul_(hyper.lr)
    _subtract_flat(param, update)


def factored_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    state: dict,
    codebook: torch.Tensor,
    hyper: StepHyper,
) -> None:
    """One factored-second-moment update of a plain 2-D ``param`` (SPEC 1.9)."""
    period = state["automatic_period"]
    rows, cols = param.shape
    state["step"] += 1
    state["factored_step"] += 1
    bias1 = 1 - hyper.beta1 ** state["step"]
    bias2 = 1 - hyper.beta2 ** state["factored_step"]

    row_ms, col_ms = row_and_column_mean_squares(grad.detach())
    state["v_row"].mul_(hyper.beta2).add_(row_ms, alpha=1 - hyper.beta2)
    state["v_col"].mul_(hyper.beta2).add_(col_ms, alpha=1 - hyper.beta2)
    row_scale = state["v_row"].mean().clamp_(min=torch.finfo(torch.float32).tiny)
    v_hat = torch.outer(state["v_row"], state["v_col"]).div_(row_scale)
    denom = v_hat.div_(bias2).sqrt_().add_(hyper.eps)
    stepsize = denom.reciprocal_().mul_(1.0 / bias1)

    momentum = requantized_momentum(state, codebook, grad.reshape(-1).view(-1, period), hyper.beta1)
    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)
    update = momentum.view(param.shape).mul_(stepsize).mul_(hyper.lr)
    param.add_(-update)


#: Rows per chunk of the factored column sums: ``max(1, 2**20 // cols)`` (SPEC 1.9.3).
FACTORED_CHUNK_ELEMENTS = 1 << 20


def row_and_column_mean_squares(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 row and column means of g^2 for a 2-D gradient (SPEC 1.9.3).

    Squares are taken in fp32 for every dtype. Column sums accumulate one row chunk at
    a time (chunks of ``max(1, 2**20 // cols)`` rows), which is observable in the last
    bit, so the chunking is part of the contract.
    """
    rows, cols = grad.shape
    row_sums = torch.empty(rows, dtype=torch.float32, device=grad.device)
    col_sums = torch.zeros(cols, dtype=torch.float32, device=grad.device)
    chunk_rows = max(1, FACTORED_CHUNK_ELEMENTS // max(1, cols))
    for r0 in range(0, rows, chunk_rows):
        chunk = grad[r0 : r0 + chunk_rows]
        squares = chunk.square() if chunk.dtype == torch.float32 else chunk.float().square_()
        row_sums[r0 : r0 + chunk_rows] = squares.sum(dim=1)
        col_sums += squares.sum(dim=0)
    return row_sums.div_(cols), col_sums.div_(rows)


def _subtract_flat(param: torch.Tensor, update: torch.Tensor) -> None:
    """``param -= update`` in logical order; a non-contiguous param goes through a contiguous copy."""
    work = param if param.is_contiguous() else param.contiguous()
    work.view(-1).add_(update.reshape(-1), alpha=-1)
    if work is not param:
        param.copy_(work)

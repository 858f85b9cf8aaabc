"""Per-parameter update arithmetic (SPEC 1.8 block-vmean step, SPEC 1.9 factored step).

Each function updates one parameter and its state in place. The order of torch
operations *is* the specification in the torch-exact profile: fp32 reductions,
sqrt and the fused multiply-adds of ``lerp``/``add_(alpha=)`` are whatever torch's
CPU kernels compute, so the same primitives are called in the same order.
``# SPEC x.y.z`` comments mark where each numbered stage of the specification begins,
so the code reads side by side with SPEC.md.

State tensors are always fp32 (indices uint8), whatever the parameter dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

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
    """Zero momentum for a first step: indices 0 (codeword -1), magnitude 0 (SPEC 1.8.1)."""
    blocks = numel // period
    state["step"] = 0
    state["m_codebook"] = torch.zeros((blocks, period), dtype=torch.uint8, device=device)
    state["m_magnitude"] = torch.zeros((blocks, 1), dtype=torch.float32, device=device)


def new_block_second_moment(state: dict) -> None:
    """Zero block second moment beside the block magnitudes (same device), counter 0 (SPEC 1.8.1;
    after factored steps, the 1.8.2 repair)."""
    state["vmean"] = torch.zeros_like(state["m_magnitude"])
    state["vmean_step"] = 0


def new_factored_second_moment(state: dict, shape: tuple[int, int], device: torch.device) -> None:
    """Zero row and column second moments, counter 0 (SPEC 1.9.2)."""
    state["v_row"] = torch.zeros(shape[0], dtype=torch.float32, device=device)
    state["v_col"] = torch.zeros(shape[1], dtype=torch.float32, device=device)
    state["factored_step"] = 0


def requantized_momentum(state: dict, codebook: Tensor, grad_blocks: Tensor, beta1: float) -> Tensor:
    """Advance the quantized momentum by one step and return it dequantized (SPEC 1.8.8 steps 1-6).

    ``m = lerp(dequant(old), g, 1 - beta1)``; the new block magnitude is ``max|m|``;
    the new indices are the nearest codewords of ``m / magnitude`` (0 where the
    magnitude is not positive). The returned momentum is the *re-quantized* value
    ``codeword (rounded to the grad dtype) * magnitude``, which drives the update.
    """
    period = grad_blocks.shape[1]
    # SPEC 1.8.8 step 1: dequantize the previous momentum
    current = dequantize(codebook, state["m_codebook"], grad_blocks.dtype) * state["m_magnitude"]
    # SPEC 1.8.8 step 2: lerp towards the gradient (torch lerp semantics, 1.13.3)
    updated = current.lerp(grad_blocks.to(current.dtype), 1 - beta1)
    # SPEC 1.8.8 step 3: the new block magnitude
    magnitude = state["m_magnitude"]
    magnitude.copy_(updated.abs().reshape(-1, period).amax(dim=1, keepdim=True))
    # SPEC 1.8.8 step 4: normalise; a block whose magnitude is not positive becomes 0
    updated.div_(magnitude)
    updated.masked_fill_(~(magnitude > 0), 0.0)
    # SPEC 1.8.8 step 5: requantise (nearest codeword, 1.7)
    indices = nearest_codeword_indices(codebook, updated)
    state["m_codebook"].copy_(indices)
    # SPEC 1.8.8 step 6: the quantised momentum that drives the update
    return dequantize(codebook, indices, grad_blocks.dtype) * magnitude


def block_mean_square(grad_blocks: Tensor) -> Tensor:
    """Per-block mean of g^2 (SPEC 1.8.3): fp16 is promoted to fp32 first, bf16 stays bf16."""
    g = grad_blocks.float() if grad_blocks.dtype == torch.float16 else grad_blocks
    return torch.mean(g * g, dim=1, keepdim=True)


def block_vmean_step(param: Tensor, grad: Tensor, state: dict, codebook: Tensor, hyper: StepHyper) -> None:
    """One block-vmean update of ``param`` (its local tensor) from ``grad`` (SPEC 1.8)."""
    period = state["automatic_period"]
    grad_blocks = grad.reshape(-1).view(-1, period)

    # SPEC 1.8.3: second-moment update, before the counters move
    state["vmean"].mul_(hyper.beta2).add_(block_mean_square(grad_blocks), alpha=1 - hyper.beta2)
    # SPEC 1.8.4: counters
    state["step"] += 1
    state["vmean_step"] += 1
    # SPEC 1.8.5: bias corrections in Python double
    bc1 = 1 - hyper.beta1 ** state["step"]
    bc2 = 1 - hyper.beta2 ** state["vmean_step"]

    # SPEC 1.8.6: decoupled weight decay, before the update
    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)

    # SPEC 1.8.7: stepsize per block, each operation rounded to fp32
    denom = torch.sqrt(state["vmean"]).div_(math.sqrt(bc2)).add_(hyper.eps)
    stepsize = torch.reciprocal(denom).mul_(1.0 / bc1)

    # SPEC 1.8.8: quantised momentum (steps 1-6), then the update in logical order (step 7)
    momentum = requantized_momentum(state, codebook, grad_blocks, hyper.beta1)
    update = momentum.mul_(stepsize).mul_(hyper.lr)
    _subtract_flat(param, update)


def factored_step(param: Tensor, grad: Tensor, state: dict, codebook: Tensor, hyper: StepHyper) -> None:
    """One factored-second-moment update of a plain 2-D ``param`` (SPEC 1.9)."""
    period = state["automatic_period"]
    # SPEC 1.9.3 step 1: counters
    state["step"] += 1
    state["factored_step"] += 1
    # SPEC 1.9.3 step 2: bias corrections in Python double
    bc1 = 1 - hyper.beta1 ** state["step"]
    bc2 = 1 - hyper.beta2 ** state["factored_step"]

    # SPEC 1.9.3 step 3: row and column mean squares, in row chunks
    row_ms, col_ms = row_and_column_mean_squares(grad.detach())
    # SPEC 1.9.3 step 4: second-moment update
    state["v_row"].mul_(hyper.beta2).add_(row_ms, alpha=1 - hyper.beta2)
    state["v_col"].mul_(hyper.beta2).add_(col_ms, alpha=1 - hyper.beta2)
    # SPEC 1.9.3 step 5: the rank-one estimate over the clamped row mean
    row_scale = state["v_row"].mean().clamp_(min=torch.finfo(torch.float32).tiny)
    v_hat = torch.outer(state["v_row"], state["v_col"]).div_(row_scale)
    # SPEC 1.9.3 step 6: divide by bc2 (not its square root) before the square root (1.9.4)
    denom = v_hat.div_(bc2).sqrt_().add_(hyper.eps)
    # SPEC 1.9.3 step 7: stepsize per element
    stepsize = denom.reciprocal_().mul_(1.0 / bc1)

    # SPEC 1.9.3 step 8: quantised momentum as in 1.8.8 steps 1-6
    momentum = requantized_momentum(state, codebook, grad.reshape(-1).view(-1, period), hyper.beta1)
    # SPEC 1.9.3 step 9: weight decay, after the momentum but still before the update
    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)
    # SPEC 1.9.3 step 10: the update
    update = momentum.view(param.shape).mul_(stepsize).mul_(hyper.lr)
    param.add_(-update)


#: Rows per chunk of the factored column sums: ``max(1, 2**20 // cols)`` (SPEC 1.9.3).
FACTORED_CHUNK_ELEMENTS = 1 << 20


def row_and_column_mean_squares(grad: Tensor) -> tuple[Tensor, Tensor]:
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


def _subtract_flat(param: Tensor, update: Tensor) -> None:
    """``param -= update`` in logical order; a non-contiguous param goes through a contiguous copy."""
    work = param if param.is_contiguous() else param.contiguous()
    work.view(-1).add_(update.reshape(-1), alpha=-1)
    if work is not param:
        param.copy_(work)

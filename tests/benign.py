"""The benign catalogue: legitimate kernel variants of the reference, each differing only in rounding.

A kernel backend is never bit-exact with the reference: it contracts multiply-adds, sums in
another order, forms ``1 - beta`` from fp32-rounded betas, multiplies by reciprocals, keeps
16-bit parameters' math in fp32. Each variant below does exactly one such thing, at one stage
of the step (SPEC 5.6 lists the stages and what each may change), and declares every capability
except ``cpu-bit-exact``: the suite must certify every one of them **conformant** under the
tolerance profile (tests/test_suite_accepts_benign.py). A benign variant the suite rejects is a
suite defect, exactly as a surviving mutant (tests/mutants.py) is.

Variants are built like mutants, from module clones of the reference (tests/mutant_tools.py).
The reference's block and factored steps are written once below over :class:`Stages`, a frozen
set of stage functions (second-moment EMA, block mean square, momentum requantization, block and
factored denominators, stepsize, decay and update) whose defaults are exactly the reference's
arithmetic; a variant names only the stages it replaces, and each replacement marks its changed
line ``# kernel:``. Where a variant's change lies in one reference function outside the steps
(the sums of squares, the codebook's block normalization), that function is replaced in the clone,
marked the same way. The DCP adapter is the reference's, cloned so that it accepts the variant's
optimizer class (it accepts exactly ``gefen_reference.Gefen`` otherwise, SPEC 2.3.1); where a variant's
rounding change also applies to the restore's re-blocking (SPEC 3.6.4), the re-blocking is
cloned with it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

import gefen_reference as reference
import gefen_reference.codebook as codebook_module
import gefen_reference.dcp as reference_dcp
import gefen_reference.dcp.optimizer_view as optimizer_view
import gefen_reference.dcp.reblock as reblock_module
import gefen_reference.dcp.restore as restore_module
import gefen_reference.dcp.state as state_module
import gefen_reference.optimizer as optimizer_module
import gefen_reference.steps as steps
from gefen_conformance.implementations import reference as reference_impl
from gefen_conformance.implementations.contract import CPU_BIT_EXACT, KNOWN_CAPABILITIES, Implementation
from gefen_reference.codewords import dequantize, nearest_codeword_indices
from gefen_reference.native_state import local_tensor

from .mutant_tools import clone, proxy

#: What a kernel backend declares: everything but bit-exactness (the tolerance profile).
KERNEL_CAPS = KNOWN_CAPABILITIES - {CPU_BIT_EXACT}


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32).item())


# ------------------------------------------------- the reference's steps, written over stages


def _ema(moment, beta, fresh):
    """Second-moment EMA in place: ``moment <- beta*moment + (1-beta)*fresh`` (SPEC 1.8.3, 1.9.3 step 4)."""
    moment.mul_(beta).add_(fresh, alpha=1 - beta)


def _block_denominator(vmean, bc2, eps):
    """``sqrt(vmean) / sqrt(bc2) + eps`` per block (SPEC 1.8.7)."""
    return torch.sqrt(vmean).div_(math.sqrt(bc2)).add_(eps)


def _factored_denominator(v_row, v_col, bc2, eps):
    """``sqrt(outer(v_row, v_col) / max(mean(v_row), tiny) / bc2) + eps`` (SPEC 1.9.3 steps 5-6)."""
    row_scale = v_row.mean().clamp_(min=torch.finfo(torch.float32).tiny)
    v_hat = torch.outer(v_row, v_col).div_(row_scale)
    return v_hat.div_(bc2).sqrt_().add_(eps)


def _stepsize(denom, bc1):
    """``(1 / denom) * (1 / bc1)`` (SPEC 1.8.7, 1.9.3 step 7)."""
    return torch.reciprocal(denom).mul_(1.0 / bc1)


def _decay_and_update(param, subtract, hyper):
    """Decoupled weight decay of ``param`` in its dtype, then ``subtract(param)`` (SPEC 1.8.6, 1.9.3 steps
    9-10)."""
    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)
    subtract(param)


@dataclass(frozen=True)
class Stages:
    """The stage functions of one step; every default is exactly the reference's arithmetic
    (reference/gefen_reference/steps.py), so ``Stages()`` steps bit for bit as the reference does. A variant
    replaces only the stages whose rounding it changes."""

    ema: Callable = _ema  # (moment, beta, fresh), in place
    block_mean_square: Callable = steps.block_mean_square  # (grad_blocks) -> (blocks, 1)
    momentum: Callable = steps.requantized_momentum  # (state, codebook, grad_blocks, beta1) -> dequantized
    block_denominator: Callable = _block_denominator  # (vmean, bc2, eps) -> (blocks, 1)
    factored_denominator: Callable = _factored_denominator  # (v_row, v_col, bc2, eps) -> (rows, cols)
    stepsize: Callable = _stepsize  # (denom, bc1) -> stepsize, denom's shape
    decay_and_update: Callable = _decay_and_update  # (param, subtract, hyper), in place


def _block_step(stages: Stages, param, grad, state, codebook, hyper):
    """``gefen_reference.steps.block_vmean_step`` over ``stages`` (the decay, which touches only
    ``param``, moves after the momentum, as in the factored step)."""
    period = state["automatic_period"]
    grad_blocks = grad.reshape(-1).view(-1, period)
    stages.ema(state["vmean"], hyper.beta2, stages.block_mean_square(grad_blocks))
    state["step"] += 1
    state["vmean_step"] += 1
    bc1 = 1 - hyper.beta1 ** state["step"]
    bc2 = 1 - hyper.beta2 ** state["vmean_step"]
    stepsize = stages.stepsize(stages.block_denominator(state["vmean"], bc2, hyper.eps), bc1)
    momentum = stages.momentum(state, codebook, grad_blocks, hyper.beta1)
    update = momentum.mul_(stepsize).mul_(hyper.lr)
    stages.decay_and_update(param, lambda target: steps._subtract_flat(target, update), hyper)


def _factored_step(stages: Stages, param, grad, state, codebook, hyper):
    """``gefen_reference.steps.factored_step`` over ``stages``."""
    period = state["automatic_period"]
    state["step"] += 1
    state["factored_step"] += 1
    bc1 = 1 - hyper.beta1 ** state["step"]
    bc2 = 1 - hyper.beta2 ** state["factored_step"]
    row_ms, col_ms = steps.row_and_column_mean_squares(grad.detach())
    stages.ema(state["v_row"], hyper.beta2, row_ms)
    stages.ema(state["v_col"], hyper.beta2, col_ms)
    denom = stages.factored_denominator(state["v_row"], state["v_col"], bc2, hyper.eps)
    stepsize = stages.stepsize(denom, bc1)
    momentum = stages.momentum(state, codebook, grad.reshape(-1).view(-1, period), hyper.beta1)
    update = momentum.view(param.shape).mul_(stepsize).mul_(hyper.lr)
    stages.decay_and_update(param, lambda target: target.add_(-update), hyper)


def _staged(stages: Stages) -> dict:
    """Step overrides of a steps clone that run both steps over ``stages``."""
    return dict(
        block_vmean_step=functools.partial(_block_step, stages),
        factored_step=functools.partial(_factored_step, stages),
    )


# ------------------------------------------------------------------ 1. fp32-rounded betas


def _ema_fp32_betas(moment, beta, fresh):
    moment.mul_(beta).add_(fresh, alpha=1 - _f32(beta))  # kernel: 1.0f - float(beta2)


def _momentum_fp32_betas(state, codebook, grad_blocks, beta1):
    return steps.requantized_momentum(
        state, codebook, grad_blocks, _f32(beta1)
    )  # kernel: 1.0f - float(beta1)


FP32_BETAS = Stages(ema=_ema_fp32_betas, momentum=_momentum_fp32_betas)


# -------------------------------------------------------- 2. separate multiply and add (no FMA)


def _momentum_without_fma(state, codebook, grad_blocks, beta1):
    period = grad_blocks.shape[1]
    current = dequantize(codebook, state["m_codebook"], grad_blocks.dtype) * state["m_magnitude"]
    updated = current.mul(beta1).add_(grad_blocks.to(current.dtype).mul(1 - beta1))  # kernel: two roundings
    magnitude = state["m_magnitude"]
    magnitude.copy_(updated.abs().reshape(-1, period).amax(dim=1, keepdim=True))
    updated.div_(magnitude)
    updated.masked_fill_(~(magnitude > 0), 0.0)
    indices = nearest_codeword_indices(codebook, updated)
    state["m_codebook"].copy_(indices)
    return dequantize(codebook, indices, grad_blocks.dtype) * magnitude


def _ema_without_fma(moment, beta, fresh):
    moment.mul_(beta).add_(fresh.float().mul(1 - beta))  # kernel: beta*v + (1-beta)*q, rounded separately


WITHOUT_FMA = Stages(ema=_ema_without_fma, momentum=_momentum_without_fma)


# ------------------------------------------------------------ 3. float64 accumulation of sums


def _squares_as_reference(grad_blocks):
    g = grad_blocks.float() if grad_blocks.dtype == torch.float16 else grad_blocks
    return g * g  # bf16 squares round to bf16, as the reference's


def _block_mean_square_float64(grad_blocks):
    squares = _squares_as_reference(grad_blocks)
    mean = squares.double().sum(dim=1, keepdim=True).div_(grad_blocks.shape[1])  # kernel: float64 accumulator
    return mean.to(squares.dtype)


def _row_and_column_mean_squares_float64(grad):
    rows, cols = grad.shape
    squares = grad.float().square().double()  # kernel: fp32 squares, float64 sums, no chunking
    return squares.sum(dim=1).div_(cols).float(), squares.sum(dim=0).div_(rows).float()


# ---------------------------------------------------------------- 4. multiply by reciprocals


def _momentum_by_reciprocal(state, codebook, grad_blocks, beta1):
    period = grad_blocks.shape[1]
    current = dequantize(codebook, state["m_codebook"], grad_blocks.dtype) * state["m_magnitude"]
    updated = current.lerp(grad_blocks.to(current.dtype), 1 - beta1)
    magnitude = state["m_magnitude"]
    magnitude.copy_(updated.abs().reshape(-1, period).amax(dim=1, keepdim=True))
    updated.mul_(torch.reciprocal(magnitude))  # kernel: x * (1/m) instead of x / m
    updated.masked_fill_(~(magnitude > 0), 0.0)
    indices = nearest_codeword_indices(codebook, updated)
    state["m_codebook"].copy_(indices)
    return dequantize(codebook, indices, grad_blocks.dtype) * magnitude


def _block_denominator_by_reciprocal(vmean, bc2, eps):
    inverse_sqrt_bc2 = _f32(1.0 / _f32(math.sqrt(bc2)))  # kernel: h * (1/sqrt(bc2)), as torch on CUDA
    return torch.sqrt(vmean).mul_(inverse_sqrt_bc2).add_(eps)


def _factored_denominator_by_reciprocal(v_row, v_col, bc2, eps):
    row_scale = v_row.mean().clamp_(min=torch.finfo(torch.float32).tiny)
    v_hat = torch.outer(v_row, v_col).mul_(torch.reciprocal(row_scale))  # kernel
    return v_hat.mul_(_f32(1.0 / _f32(bc2))).sqrt_().add_(eps)  # kernel


BY_RECIPROCAL = Stages(
    momentum=_momentum_by_reciprocal,
    block_denominator=_block_denominator_by_reciprocal,
    factored_denominator=_factored_denominator_by_reciprocal,
)


def _block_normalised_by_reciprocal(flat, period):
    blocks = flat.float().reshape(-1, period)
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    return torch.where(absmax > 0, blocks * torch.reciprocal(absmax), torch.zeros_like(blocks))  # kernel


def _reblock_by_reciprocal(codebook, momentum, second, period):
    table = codebook.to(device=momentum.device, dtype=torch.float32)
    blocks = momentum.detach().float().reshape(-1).view(-1, period)
    magnitude = blocks.abs().amax(dim=1, keepdim=True)
    scaled = torch.where(
        magnitude > 0, blocks * torch.reciprocal(magnitude), torch.zeros_like(blocks)
    )  # kernel
    indices = nearest_codeword_indices(table, scaled)
    vmean = second.detach().float().reshape(-1).view(-1, period).mean(dim=1, keepdim=True)
    return indices, magnitude, vmean


def _approximate_reciprocal(magnitude):
    """``1/m`` as an approximate-reciprocal instruction (``rcp.approx.f32``) returns it: one ulp
    toward zero for every divisor but a power of two, whose reciprocal it returns exactly (SPEC
    5.6.7)."""
    exact = torch.reciprocal(magnitude)
    mantissa, _ = torch.frexp(magnitude)
    return torch.where(mantissa.abs() == 0.5, exact, torch.nextafter(exact, torch.zeros_like(exact)))


def _momentum_by_approximate_reciprocal(
    state, codebook, grad_blocks, beta1, reciprocal=_approximate_reciprocal
):
    period = grad_blocks.shape[1]
    current = dequantize(codebook, state["m_codebook"], grad_blocks.dtype) * state["m_magnitude"]
    updated = current.lerp(grad_blocks.to(current.dtype), 1 - beta1)
    magnitude = state["m_magnitude"]
    magnitude.copy_(updated.abs().reshape(-1, period).amax(dim=1, keepdim=True))
    updated.mul_(reciprocal(magnitude))  # kernel: x * rcp.approx(m)
    updated.masked_fill_(~(magnitude > 0), 0.0)
    indices = nearest_codeword_indices(codebook, updated)
    state["m_codebook"].copy_(indices)
    return dequantize(codebook, indices, grad_blocks.dtype) * magnitude


def _block_normalised_by_approximate_reciprocal(flat, period, reciprocal=_approximate_reciprocal):
    blocks = flat.float().reshape(-1, period)
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    scaled = blocks * reciprocal(absmax)  # kernel
    return torch.where(absmax > 0, scaled, torch.zeros_like(blocks))


def _reblock_by_approximate_reciprocal(
    codebook, momentum, second, period, reciprocal=_approximate_reciprocal
):
    table = codebook.to(device=momentum.device, dtype=torch.float32)
    blocks = momentum.detach().float().reshape(-1).view(-1, period)
    magnitude = blocks.abs().amax(dim=1, keepdim=True)
    scaled = torch.where(magnitude > 0, blocks * reciprocal(magnitude), torch.zeros_like(blocks))
    indices = nearest_codeword_indices(table, scaled)
    vmean = second.detach().float().reshape(-1).view(-1, period).mean(dim=1, keepdim=True)
    return indices, magnitude, vmean


def _approximate_reciprocal_kernel(name: str, reciprocal=_approximate_reciprocal) -> Implementation:
    """The reference normalizing every block by ``reciprocal(m)`` (step, histogram and restore)."""
    return _kernel(
        name,
        step_overrides=_staged(
            Stages(momentum=functools.partial(_momentum_by_approximate_reciprocal, reciprocal=reciprocal))
        ),
        codebook_overrides=dict(
            block_normalised=functools.partial(
                _block_normalised_by_approximate_reciprocal, reciprocal=reciprocal
            )
        ),
        reblock_overrides=dict(
            reblock=functools.partial(_reblock_by_approximate_reciprocal, reciprocal=reciprocal)
        ),
    )


# ------------------------------------------------- 5. fp32 master math for 16-bit parameters


#: The dtypes the fused kernels handle in fp32; fp64 (and fp32) parameters keep the reference's
#: arithmetic, as gefen-x's torch path serves them (rounding an fp64 parameter's math to fp32 would
#: be coarser than the reference, which SPEC 5.6.1 does not allow).
_HALF = (torch.bfloat16, torch.float16)


def _block_mean_square_fp32(grad_blocks):
    if grad_blocks.dtype not in _HALF:
        return steps.block_mean_square(grad_blocks)
    g = grad_blocks.float()  # kernel: squares and mean in fp32 for 16-bit dtypes
    return torch.mean(g * g, dim=1, keepdim=True)


def _momentum_fp32(state, codebook, grad_blocks, beta1):
    if grad_blocks.dtype in _HALF:
        grad_blocks = grad_blocks.float()  # kernel: fp32 math
    return steps.requantized_momentum(state, codebook, grad_blocks, beta1)


def _decay_and_update_in_fp32(param, subtract, hyper):
    """``p <- rP(fp32(p) * (1 - lr*wd) - update)``: one rounding to the parameter dtype at the end."""
    if param.dtype not in _HALF:
        return _decay_and_update(param, subtract, hyper)
    work = param.float()
    if hyper.weight_decay > 0.0:
        work.mul_(1 - hyper.lr * hyper.weight_decay)  # kernel: decay and update in fp32
    subtract(work)
    param.copy_(work)


FP32_MASTER = Stages(
    block_mean_square=_block_mean_square_fp32,
    momentum=_momentum_fp32,
    decay_and_update=_decay_and_update_in_fp32,
)


# ------------------------------------------------------------ 6. another reduction order


def _sequential_sum(x, dim):
    """fp32 left-to-right sum along ``dim`` (cumsum's last element), not torch's cascade."""
    return x.cumsum(dim=dim).select(dim, -1)


def _block_mean_square_sequential(grad_blocks):
    squares = _squares_as_reference(grad_blocks)
    total = _sequential_sum(squares.float(), 1).unsqueeze(1)  # kernel: sequential order
    return total.div_(grad_blocks.shape[1]).to(squares.dtype)


def _row_and_column_mean_squares_sequential(grad):
    rows, cols = grad.shape
    squares = grad.float().square()
    return _sequential_sum(squares, 1).div_(cols), _sequential_sum(squares, 0).div_(rows)  # kernel


# ------------------------------------------------------ 7. stepsize as a single division


def _stepsize_one_division(denom, bc1):
    return torch.full_like(denom, 1.0 / bc1).div_(denom)  # kernel: (1/bc1) / h in one division


ONE_DIVISION = Stages(stepsize=_stepsize_one_division)


# ------------------------------------------------------------------------------ assembly


@dataclass(frozen=True)
class Variant:
    implementation: Implementation
    stage: str  # the SPEC 5.6 stage whose rounding it changes
    reason: str  # why this is a legitimate kernel, not a bug


def _kernel(name, *, step_overrides=None, codebook_overrides=None, reblock_overrides=None) -> Implementation:
    """The reference with some step / codebook / re-blocking functions replaced, and a DCP adapter
    that accepts its optimizer class."""
    mutated_steps = clone(steps, **(step_overrides or {}))
    mutated_codebook = clone(codebook_module, **codebook_overrides) if codebook_overrides else codebook_module
    optimizer_class = clone(
        optimizer_module,
        block_vmean_step=mutated_steps.block_vmean_step,
        factored_step=mutated_steps.factored_step,
        learn_codebook=mutated_codebook.learn_codebook,
    ).Gefen
    reblock = clone(
        reblock_module, learn_codebook=mutated_codebook.learn_codebook, **(reblock_overrides or {})
    )
    view = proxy(optimizer_view, is_supported=lambda optimizer: type(optimizer) is optimizer_class)
    adapter = clone(
        state_module, optimizer_view=view, restore=clone(restore_module, reblock=reblock, optimizer_view=view)
    )
    return Implementation(
        name=name,
        version="benign",
        make_optimizer=lambda params, **hp: optimizer_class(params, **hp),
        dcp_state=lambda optimizer: adapter.GefenDCPState(optimizer),
        save_planner=reference_impl.IMPLEMENTATION.save_planner,
        async_writer=reference_impl.IMPLEMENTATION.async_writer,
        capabilities=KERNEL_CAPS,
    )


class _MultiTensorBatch(reference.Gefen):
    """A multi-tensor kernel: the block-path parameters of one step that share their dtypes, period,
    counters and hyperparameters are stepped as one batch (flat parameters, gradients and state
    concatenated block after block, one pass, written back), lists of at most 64 tensors."""

    BATCH = 64

    def update_parameters(self, updates):
        single, batches = [], {}
        for u in updates:
            st = u.state
            if u.factored or "vmean" not in st or not local_tensor(u.param).is_contiguous():
                single.append(u)
                continue
            key = (
                local_tensor(u.param).dtype,
                u.grad.dtype,
                st["automatic_period"],
                st["step"],
                st["vmean_step"],
                u.hyper,
            )
            batches.setdefault(key, []).append(u)
        for u in single:
            self.update_parameter(u.param, u.grad, u.state, u.hyper, u.factored)
        for (_, _, period, step, vmean_step, hyper), batch in batches.items():
            for start in range(0, len(batch), self.BATCH):
                self._batched(batch[start : start + self.BATCH], period, step, vmean_step, hyper)

    def _batched(self, batch, period, step, vmean_step, hyper):
        params = [local_tensor(u.param) for u in batch]
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        combined = {
            "automatic_period": period,
            "step": step,
            "vmean_step": vmean_step,
            "vmean": torch.cat([u.state["vmean"] for u in batch]),
            "m_codebook": torch.cat([u.state["m_codebook"].reshape(-1, period) for u in batch]),
            "m_magnitude": torch.cat([u.state["m_magnitude"] for u in batch]),
        }
        grads = torch.cat([u.grad.reshape(-1) for u in batch])
        steps.block_vmean_step(flat, grads, combined, self.codebook, hyper)
        at = blocks = 0
        with torch.no_grad():
            for u, p in zip(batch, params):
                n, b = p.numel(), p.numel() // period
                p.copy_(flat[at : at + n].view(p.shape))
                for key in ("vmean", "m_magnitude"):
                    u.state[key].copy_(combined[key][blocks : blocks + b])
                u.state["m_codebook"].copy_(
                    combined["m_codebook"][blocks : blocks + b].view(u.state["m_codebook"].shape)
                )
                u.state["step"], u.state["vmean_step"] = combined["step"], combined["vmean_step"]
                at, blocks = at + n, blocks + b


class _ReverseOrder(reference.Gefen):
    """The step's parameters updated last to first (SPEC 4.1.8 item 1: they are independent)."""

    def update_parameters(self, updates):
        super().update_parameters(list(updates)[::-1])


def _declared(name: str, cls) -> Implementation:
    """``cls`` declared as a kernel backend declares itself (the reference's state layout, in its own
    class, and every capability but ``cpu-bit-exact``)."""
    cls.gefen_state_layout = reference_dcp.STATE_LAYOUT
    return Implementation(
        name=name,
        version="benign",
        make_optimizer=lambda params, **hp: cls(params, **hp),
        dcp_state=reference_impl.IMPLEMENTATION.dcp_state,
        save_planner=reference_impl.IMPLEMENTATION.save_planner,
        async_writer=reference_impl.IMPLEMENTATION.async_writer,
        capabilities=KERNEL_CAPS,
    )


CATALOGUE = {
    "fp32-betas-in-ema": Variant(
        _kernel("fp32-betas-in-ema", step_overrides=_staged(FP32_BETAS)),
        "EMA weights",
        "gefen-x's CUDA kernels form 1 - beta as 1.0f - float(beta); the groups keep and checkpoint the "
        "user's betas exactly. Was once a mutant ('beta-rounding'): under the tolerance profile it "
        "changes the second moment by 1.3e-5 relative at beta2 = 0.999, which is rounding, not a bug.",
    ),
    "separate-multiply-add": Variant(
        _kernel("separate-multiply-add", step_overrides=_staged(WITHOUT_FMA)),
        "EMA (momentum and second moment)",
        "beta*m + (1-beta)*g with two roundings where torch's lerp and add_(alpha=) fuse one; nvcc may "
        "contract either way.",
    ),
    "float64-block-sums": Variant(
        _kernel(
            "float64-block-sums",
            step_overrides=dict(
                block_mean_square=_block_mean_square_float64,
                row_and_column_mean_squares=_row_and_column_mean_squares_float64,
            ),
        ),
        "block mean of squares",
        "block, row and column sums of squares accumulated in float64 and rounded once; more accurate "
        "than torch's fp32 cascade.",
    ),
    "reciprocal-multiply": Variant(
        _kernel(
            "reciprocal-multiply",
            step_overrides=_staged(BY_RECIPROCAL),
            codebook_overrides=dict(block_normalised=_block_normalised_by_reciprocal),
            reblock_overrides=dict(reblock=_reblock_by_reciprocal),
        ),
        "normalization by the block magnitude; bias correction",
        "x * (1/m) instead of x / m for the momentum normalization (step, histogram and restore) and "
        "the bias corrections, as torch's CUDA kernels and gefen-x's __frcp_rn do (up to 2 ulp).",
    ),
    "approximate-reciprocal": Variant(
        _approximate_reciprocal_kernel("approximate-reciprocal"),
        "normalization by the block magnitude (approximate reciprocal)",
        "x * rcp.approx(m): a reciprocal one ulp off for every divisor but a power of two, which the "
        "instruction returns exactly (SPEC 5.6.7), in the step, the histogram and the restore.",
    ),
    "fp32-master-math": Variant(
        _kernel("fp32-master-math", step_overrides=_staged(FP32_MASTER)),
        "16-bit parameters: codewords, squares, decay and update",
        "for bf16/fp16 parameters everything in fp32 with the fp32 codebook, rounded once to the "
        "parameter dtype, as gefen-x's fused kernels do; fp32 parameters are unchanged.",
    ),
    "sequential-reduction-order": Variant(
        _kernel(
            "sequential-reduction-order",
            step_overrides=dict(
                block_mean_square=_block_mean_square_sequential,
                row_and_column_mean_squares=_row_and_column_mean_squares_sequential,
            ),
        ),
        "block mean of squares (order)",
        "fp32 sums of squares in plain left-to-right order instead of torch's cascade, as a "
        "one-thread-per-block kernel sums.",
    ),
    "stepsize-one-division": Variant(
        _kernel("stepsize-one-division", step_overrides=_staged(ONE_DIVISION)),
        "stepsize",
        "(1/bc1) / h in one division instead of a reciprocal then a multiply.",
    ),
    "multi-tensor-batch": Variant(
        _declared("multi-tensor-batch", _MultiTensorBatch),
        "every stage, batched",
        "blocks are independent in every stage (SPEC 1.8): stepping many parameters' blocks as one "
        "batch of at most 64 tensors is how multi-tensor kernels run a step.",
    ),
    "reverse-order": Variant(
        _declared("reverse-order", _ReverseOrder),
        "the step's parameter order",
        "parameters are independent (SPEC 4.1.8 item 1): a kernel may update them in any order, "
        "as a backward-order launch does.",
    ),
}

# Spec strings for --impl: tests.benign:<attribute>
for _name, _variant in CATALOGUE.items():
    globals()["benign_" + _name.replace("-", "_")] = _variant.implementation


def spec(name: str) -> str:
    return "tests.benign:benign_" + name.replace("-", "_")


#: The reference itself declared as a kernel backend (the tolerance profile): the baseline every
#: benign variant and every tolerance-profile mutant run is measured against.
reference_as_kernel = Implementation(
    name="reference-as-kernel",
    version="benign",
    make_optimizer=reference_impl.IMPLEMENTATION.make_optimizer,
    dcp_state=reference_impl.IMPLEMENTATION.dcp_state,
    save_planner=reference_impl.IMPLEMENTATION.save_planner,
    async_writer=reference_impl.IMPLEMENTATION.async_writer,
    capabilities=KERNEL_CAPS,
)

"""Mutants of the input space's sizes, counts, layouts and codebook edges, in the catalogue of
tests/mutants.py.

``ENTRIES`` maps a mutant's name to its :class:`tests.mutants.Entry`; tests/mutants.py adds them to
``CATALOGUE`` (and their ``--impl`` spec strings); ``SLOW`` names those whose selections are slow.

Each is a kernel backend written as examples/gefen-fast is (a ``gefen_reference.Gefen`` subclass
declaring the reference's state layout; every capability, so the catalogue judges it in both
profiles) with one bug real kernels have had, which fires only past a size or count the suite's
small cases never reach (a block longer than one reduction tile, a search past its largest
candidate, more groups than a table holds, more tensors than one launch), on a layout whose inner
stride is 1 without the tensor being contiguous, on a dense gradient in another memory order
than its parameter, on a codebook with a run of equal codewords, or on a first step whose
histogram has values at +1. Only the input space (SPEC 4.3.10) and lifecycle (SPEC 4.3.12)
properties catch them, through their explicit examples.
"""

from __future__ import annotations

from dataclasses import replace

import torch

import gefen_reference.codebook as codebook_module
import gefen_reference.periods as periods
import gefen_reference.steps as steps
from gefen_reference.codewords import dequantize, nearest_codeword_indices
from gefen_reference.hyperparameters import scalar_lr
from gefen_reference.native_state import local_tensor
from gefen_reference.steps import StepHyper

from .mutant_tools import clone
from .mutants import _Backend, _backend_entries

_INPUTS = "inputs_match_reference"
_LIFECYCLE = "lifecycle_matches_reference or group_added_after_steps"

# ---------------------------------------------------------------- sizes: one reduction tile

#: The elements one thread block's reduction covers (blockDim x items per thread).
_REDUCTION_TILE = 65536


def _mean_square_first_tile(grad_blocks):
    """A block's sum of squares over its first :data:`_REDUCTION_TILE` elements only (the
    remainder loop is missing), divided by the whole period."""
    g = grad_blocks.float() if grad_blocks.dtype == torch.float16 else grad_blocks
    head = g[:, :_REDUCTION_TILE]
    return (head * head).float().sum(dim=1, keepdim=True).div_(grad_blocks.shape[1]).to(g.dtype)


def _momentum_first_tile(state, codebook, grad_blocks, beta1):
    """``gefen_reference.steps.requantized_momentum`` whose block magnitude is the largest of the
    first :data:`_REDUCTION_TILE` elements only."""
    current = dequantize(codebook, state["m_codebook"], grad_blocks.dtype) * state["m_magnitude"]
    updated = current.lerp(grad_blocks.to(current.dtype), 1 - beta1)
    magnitude = state["m_magnitude"]
    magnitude.copy_(updated[:, :_REDUCTION_TILE].abs().amax(dim=1, keepdim=True))
    updated.div_(magnitude)
    updated.masked_fill_(~(magnitude > 0), 0.0)
    indices = nearest_codeword_indices(codebook, updated)
    state["m_codebook"].copy_(indices)
    return dequantize(codebook, indices, grad_blocks.dtype) * magnitude


class _ReductionTileWithoutRemainder(_Backend):
    """Periods past 65536: the per-block reductions (the momentum's largest magnitude, the sum of
    squares) run in one thread block covering 65536 elements, without the grid-stride remainder
    loop: a longer block's tail is left out of both (right for every period up to 65536)."""

    _kernels = clone(
        steps, block_mean_square=_mean_square_first_tile, requantized_momentum=_momentum_first_tile
    )

    def update_parameter(self, p, grad, state, hyper, factored):
        if factored:
            self._kernels.factored_step(p, grad, state, self.codebook, hyper)
        else:
            self._kernels.block_vmean_step(local_tensor(p), grad, state, self.codebook, hyper)


# ---------------------------------------------------------------- sizes: the search's candidates

#: The largest candidate period the search kernel scores (one thread block holds a block).
_SEARCH_CAP = 65536


def _search_up_to_the_cap(squared) -> int:
    """SPEC 1.5.4-1.5.5 over the candidates up to :data:`_SEARCH_CAP` only."""
    scored, previous = [], None
    for p in (d for d in periods.proper_divisors(len(squared)) if d <= _SEARCH_CAP):
        spread = periods.block_spread(squared, p)
        scored.append((periods.FIRST_CANDIDATE_SCORE if previous is None else spread - previous, p))
        previous = spread
    best = min(scored)[1]
    return 1 if best < periods.SMALLEST_SEARCHED_PERIOD else best


class _SearchCappedAt65536(_Backend):
    """Periods past 65536: the period search scores each candidate in one thread block holding a
    block, so it scans candidates up to 65536 only; a parameter whose searched period is larger
    gets the best one up to 65536 (SPEC 1.5.5: no cap)."""

    def choose_period(self, name, global_shape, local_grad):
        squared = periods.squared_gradient(local_grad)
        if len(squared) == 1 or self.period_rules.forces_period_one(name, len(global_shape)):
            return 1
        period = _search_up_to_the_cap(squared)
        return periods.fallback_period(len(squared), tuple(global_shape)) if period == 1 else period


# ---------------------------------------------------------------- groups: a table of four


class _GroupTableOfFour(_Backend):
    """Groups: the multi-tensor kernel reads each tensor's hyperparameters from a table of 4 group
    entries indexed by ``group % 4``: from the fifth group on, a parameter steps with the lr,
    betas, eps and weight decay of the group four before it."""

    TABLE = 4

    def update_parameters(self, updates):
        table = [
            StepHyper(scalar_lr(g["lr"]), g["beta1"], g["beta2"], g["eps"], g["weight_decay"])
            for g in self.param_groups[: self.TABLE]
        ]
        group_of = {id(p): g for g, group in enumerate(self.param_groups) for p in group["params"]}
        for u in updates:
            hyper = table[group_of[id(u.param)] % self.TABLE]
            self.update_parameter(u.param, u.grad, u.state, hyper, u.factored)


# ---------------------------------------------------------------- counts: one launch


class _LaunchOf512(_Backend):
    """Parameter count: the fused multi-tensor launch packs at most 512 tensors, and the host
    launches no second batch: the parameters past the 512th are not updated, nor their moments,
    while the host's bookkeeping still advances their counters."""

    LAUNCH = 512

    def update_parameters(self, updates):
        updates = list(updates)
        super().update_parameters(updates[: self.LAUNCH])
        for u in updates[self.LAUNCH :]:
            u.state["step"] += 1
            u.state["factored_step" if u.factored else "vmean_step"] += 1


class _MetadataTableOf1024(_Backend):
    """Parameter count: the multi-tensor launch carries a per-tensor table of 1024 entries (its
    group's lr, betas, eps and decay) that the host does not check: tensor ``i`` of a step reads
    entry ``i % 1024``, so from the 1025th on each takes the hyperparameters of the one 1024 before."""

    TABLE = 1024

    def update_parameters(self, updates):
        updates = list(updates)
        super().update_parameters(
            [
                u if i < self.TABLE else replace(u, hyper=updates[i % self.TABLE].hyper)
                for i, u in enumerate(updates)
            ]
        )


class _UnfusedPathCouplesDecay(_Backend):
    """Options: the ``fused=False`` fallback (the path taken where the fused kernel is unavailable)
    folds weight decay into the gradient, Adam's L2 (``g + wd * p``), instead of the decoupled decay
    of SPEC 1.8.6; ``fused`` has no effect on the reference (SPEC 1.1.5)."""

    def __init__(self, params, *args, fused=True, **kwargs):
        super().__init__(params, *args, fused=fused, **kwargs)
        self._unfused = not fused

    def update_parameter(self, p, grad, state, hyper, factored):
        if self._unfused and hyper.weight_decay > 0.0:
            grad = grad + hyper.weight_decay * local_tensor(p).detach().to(grad.dtype)
            hyper = replace(hyper, weight_decay=0.0)
        super().update_parameter(p, grad, state, hyper, factored)


class _DecayFactorClampedAtZero(_Backend):
    """Weight decay: the kernel forms the decoupled decay factor as ``max(0, 1 - lr * wd)``, a
    guard against a sign flip that SPEC 1.8.6 does not have (it multiplies by the factor as it is)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if hyper.weight_decay > 0.0 and 1.0 - hyper.lr * hyper.weight_decay < 0.0:
            local_tensor(p).mul_(0.0)
            hyper = replace(hyper, weight_decay=0.0)
        super().update_parameter(p, grad, state, hyper, factored)


class _CodebookFromTrainableOnly(_Backend):
    """Codebook learning: the kernel's input list holds the trainable parameters only
    (``p.requires_grad and p.grad is not None``), so a frozen parameter holding a gradient at the
    learning step gets its period but adds nothing to the histogram (SPEC 1.6.3: every parameter
    with a gradient contributes; SPEC 1.2.6: ``requires_grad`` plays no role)."""

    def learn_codebook(self, pieces, device):
        trainable = [
            p.requires_grad
            for _, _, p in self.named_params()
            if p.grad is not None and local_tensor(p.grad).numel()
        ]
        pieces = list(pieces)
        if len(trainable) == len(pieces):
            pieces = [piece for piece, keep in zip(pieces, trainable) if keep]
        return super().learn_codebook(pieces, device)


# ---------------------------------------------------------------- layouts: unit inner stride


def _row_major_from_data_pointer(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a kernel walking ``numel`` consecutive elements from its data pointer sees it."""
    strides = torch.empty(t.shape, device="meta").stride()
    return torch.as_strided(t.detach(), t.shape, strides, t.storage_offset())


def _fits_its_storage(t: torch.Tensor) -> bool:
    """Whether ``numel`` elements from ``t`` 's data pointer lie inside its storage (the kernel's
    walk does not fault)."""
    return (t.storage_offset() + t.numel()) * t.element_size() <= t.untyped_storage().nbytes()


class _InnerStrideTakenForContiguity(_Backend):
    """Layouts: the kernel's fast path tests ``stride(-1) == 1`` instead of ``is_contiguous()`` and
    then walks ``numel`` consecutive elements from the data pointer: a parameter or gradient with
    padded rows (a column slice ``w[:, :k]`` of a fused buffer, every other row ``w[::2]``) is
    read, and a parameter written, at the wrong addresses (SPEC 1.13.8: logical order)."""

    @staticmethod
    def _as_kernel_sees(t: torch.Tensor) -> torch.Tensor:
        if t.dim() >= 2 and t.stride(-1) == 1 and not t.is_contiguous() and _fits_its_storage(t):
            return _row_major_from_data_pointer(t)
        return t

    def update_parameter(self, p, grad, state, hyper, factored):
        local = self._as_kernel_sees(local_tensor(p))
        grad = self._as_kernel_sees(grad)
        if factored:
            steps.factored_step(local, grad, state, self.codebook, hyper)
        else:
            steps.block_vmean_step(local, grad, state, self.codebook, hyper)


# ---------------------------------------------------------------- layouts: dense, another order


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill ``numel`` consecutive slots in some order."""
    sizes_strides = sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1)
    expected = 1
    for stride, size in sizes_strides:
        if stride != expected:
            return False
        expected *= size
    return True


class _DenseGradientInMemoryOrder(_Backend):
    """Layouts: a contiguous parameter whose gradient is dense (non-overlapping, no gaps) is handed
    to the kernel as raw memory, taking the gradient's memory order for the parameter's: a
    transposed or channels_last gradient of a contiguous parameter is applied element-permuted."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if local_tensor(p).is_contiguous() and not grad.is_contiguous() and grad.dim() >= 2 and _dense(grad):
            grad = _row_major_from_data_pointer(grad)
        super().update_parameter(p, grad, state, hyper, factored)


# ---------------------------------------------------------------- codebooks: a run of equal codewords


def _nearest_by_argmin(codebook, values):
    """``argmin_k |v - cb[k]|`` over all codewords, the first minimum: the rule's nearest value at
    the lowest index holding it (the nearest codeword is a neighbour of ``v``, and equal distances
    to two different codewords go to the lower one in both)."""
    chosen = nearest_codeword_indices(codebook, values).long()
    run_start = torch.searchsorted(codebook, codebook, side="left").clamp_(0, codebook.numel() - 1)
    return run_start[chosen].to(torch.uint8)


class _ArgminLowestOfRun(_Backend):
    """Codebooks: the nearest codeword by brute-force argmin over the 256 codewords (first
    minimum): a value above a run of equal codewords that selects the run gets the run's lowest
    index, not its highest (SPEC 1.7.3). The decoded value is the same; the stored index is not."""

    _kernels = clone(steps, nearest_codeword_indices=_nearest_by_argmin)

    def update_parameter(self, p, grad, state, hyper, factored):
        if factored:
            self._kernels.factored_step(p, grad, state, self.codebook, hyper)
        else:
            self._kernels.block_vmean_step(local_tensor(p), grad, state, self.codebook, hyper)


# ---------------------------------------------------------------- codebooks: the histogram's top bin


def _histogram_guarding_the_top(pieces):
    """SPEC 1.6.4's counts with ``k < 4096`` guarded instead of clamped to 4095: every normalized
    value of exactly +1 (each block's largest element when it is positive) is dropped."""
    counts = torch.zeros(codebook_module.HISTOGRAM_BINS, dtype=torch.int64)
    seen = 0
    for flat, period in pieces:
        if flat.numel() == 0:
            continue
        u = codebook_module.block_normalised(flat, period).reshape(-1)
        bins = torch.floor((u + 1.0) / codebook_module.BIN_WIDTH).to(torch.long)
        bins = bins[(bins >= 0) & (bins < codebook_module.HISTOGRAM_BINS)]
        counts += torch.bincount(bins.cpu(), minlength=codebook_module.HISTOGRAM_BINS)
        seen += u.numel()
    if not seen:
        return None
    return counts if int(counts.sum()) else codebook_module.histogram_counts(pieces)


class _HistogramGuardsTheTopBin(_Backend):
    """Codebooks: the histogram kernel computes ``floor((u + 1) * 2048)`` and guards ``k < 4096``
    where SPEC 1.6.4 clamps to 4095, so every ``u = +1`` is dropped from the counts: the learned
    codebook then differs wherever bin 4095 held only those (a padded codebook loses its top
    centre, a solved one its segmentation near +1)."""

    _learner = clone(codebook_module, histogram_counts=_histogram_guarding_the_top)

    def learn_codebook(self, pieces, device):
        return self._learner.learn_codebook(pieces, device)


#: name -> (class, clause, selection, bug)
_SPACE_MUTANTS = {
    "reduction-tile-without-remainder": (
        _ReductionTileWithoutRemainder,
        "4.3.12",
        _LIFECYCLE,
        "a block's largest magnitude and sum of squares cover its first 65536 elements only",
    ),
    "search-capped-at-65536": (
        _SearchCappedAt65536,
        "1.5.4",
        _LIFECYCLE,
        "the period search scores candidates up to 65536 only",
    ),
    "group-table-of-four": (
        _GroupTableOfFour,
        "4.3.10",
        _INPUTS,
        "hyperparameters read from a table of four groups indexed by group % 4",
    ),
    "launch-of-512": (
        _LaunchOf512,
        "4.3.12",
        _LIFECYCLE,
        "parameters past the 512th of a step are not updated (their counters advance)",
    ),
    "metadata-table-of-1024": (
        _MetadataTableOf1024,
        "4.3.12",
        _LIFECYCLE,
        "tensor i of a launch reads the hyperparameters of entry i % 1024",
    ),
    "unfused-path-couples-decay": (
        _UnfusedPathCouplesDecay,
        "4.3.12",
        _LIFECYCLE,
        "fused=False folds weight decay into the gradient (L2) instead of decoupling it",
    ),
    "decay-factor-clamped-at-zero": (
        _DecayFactorClampedAtZero,
        "4.3.12",
        _LIFECYCLE,
        "the decay factor 1 - lr*wd clamped at 0 when lr*wd > 1",
    ),
    "codebook-from-trainable-only": (
        _CodebookFromTrainableOnly,
        "1.6.3",
        _LIFECYCLE,
        "a frozen parameter's gradient is left out of the codebook's histogram",
    ),
    "inner-stride-taken-for-contiguity": (
        _InnerStrideTakenForContiguity,
        "1.13.8",
        _INPUTS,
        "a tensor with stride(-1) == 1 and padded rows walked as contiguous memory",
    ),
    "dense-gradient-in-memory-order": (
        _DenseGradientInMemoryOrder,
        "1.13.8",
        _INPUTS,
        "a dense gradient in another memory order than its contiguous parameter read in memory order",
    ),
    "argmin-lowest-of-run": (
        _ArgminLowestOfRun,
        "1.7.3",
        _INPUTS,
        "a value above a run of equal codewords gets the run's lowest index (argmin)",
    ),
    "histogram-guards-the-top-bin": (
        _HistogramGuardsTheTopBin,
        "1.6.4",
        _INPUTS,
        "the histogram drops every normalized value of +1 instead of counting it in bin 4095",
    ),
}

ENTRIES: dict = _backend_entries(_SPACE_MUTANTS)
#: Every selection runs the input space's or the lifecycle's explicit examples, whose 2^20-element,
#: 600-parameter and period-70000 cases make the reference's run of them slow.
SLOW: frozenset = frozenset(ENTRIES)

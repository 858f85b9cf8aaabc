"""The codebook learned at step 1, judged by its purpose (SPEC 5.6.7).

Under the tolerance profile a kernel whose block normalization rounds differently may move a few
gradient values across histogram bin edges, and the optimal codebook of its histogram may then
differ from the reference's. The structure stays exact (fp32, 256 finite entries, sorted, -1 and
+1 at the ends); the codewords are judged by their quantization cost on the *reference's*
histogram: at most :func:`gefen_oracles.kernel_bounds.codebook_cost_allowance` above the reference
codebook's cost on it (the reference's is optimal there, SPEC 1.6.8).

The histogram is restated from SPEC 1.6.4 (independently of the reference's code): each block of
the fp32 gradient divided by its largest magnitude, binned into 4096 bins over [-1, 1].
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from . import kernel_bounds as kb
from .numeric import Comparison, bitwise_comparison

BINS = 4096


def histogram(pieces: Iterable[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """int64 counts of SPEC 1.6.4 for ``(gradient, period)`` pieces."""
    counts = torch.zeros(BINS, dtype=torch.int64)
    for grad, period in pieces:
        flat = grad.detach().cpu().float().reshape(-1)
        if flat.numel() == 0:
            continue
        blocks = flat.reshape(-1, period)
        top = blocks.abs().amax(dim=1, keepdim=True)
        u = torch.where(top > 0, blocks / top, torch.zeros_like(blocks)).reshape(-1)
        bins = torch.floor((u + 1.0) * (BINS // 2)).to(torch.int64).clamp(0, BINS - 1)
        counts += torch.bincount(bins, minlength=BINS)
    return counts


def centers() -> torch.Tensor:
    return -1.0 + (2.0 * torch.arange(BINS, dtype=torch.float64) + 1.0) / BINS


def cost(codebook: torch.Tensor, counts: torch.Tensor) -> float:
    """Sum over bins of ``count * (centre - nearest codeword)^2`` (counts rounded to fp32, SPEC 1.6.5)."""
    cb = codebook.detach().cpu().double().reshape(-1)
    weights = counts.to(torch.float32).double()
    c = centers()
    upper = torch.searchsorted(cb, c).clamp(0, cb.numel() - 1)
    lower = (upper - 1).clamp(0, cb.numel() - 1)
    distance = torch.minimum((c - cb[lower]).abs(), (c - cb[upper]).abs())
    return float((weights * distance * distance).sum())


def largest_gap(codebook: torch.Tensor) -> float:
    cb = codebook.detach().cpu().double().reshape(-1)
    return float((cb[1:] - cb[:-1]).max()) if cb.numel() > 1 else 2.0


def structure_problems(codebook) -> list[str]:
    """SPEC 1.6.2 / 5.6.7: the exact part of a learned codebook."""
    if not torch.is_tensor(codebook):
        return [f"codebook: {type(codebook).__name__}, expected a float32 tensor of 256"]
    problems = []
    if codebook.dtype != torch.float32 or tuple(codebook.shape) != (256,):
        problems.append(f"codebook: {codebook.dtype} {tuple(codebook.shape)}, expected torch.float32 (256,)")
        return problems
    cb = codebook.detach().cpu()
    if not bool(torch.isfinite(cb).all()):
        problems.append("codebook: not finite")
    elif not bool((cb[1:] >= cb[:-1]).all()):
        problems.append("codebook: not sorted")
    if float(cb[0]) != -1.0 or float(cb[-1]) != 1.0:
        problems.append(f"codebook: ends {float(cb[0])!r}, {float(cb[-1])!r}, expected -1.0, 1.0")
    return problems


def compare(what: str, expected: torch.Tensor, actual, counts: torch.Tensor | None) -> Comparison:
    """The implementation's codebook against the reference's: bitwise equal, or structurally exact
    and within the cost allowance on ``counts`` (the reference's step-1 histogram)."""
    problems = structure_problems(actual)
    if problems:
        return Comparison(what, "tolerance", float("inf"), 0.0, problems=problems)
    same = bitwise_comparison(what, expected, actual)
    if same.ok:
        return Comparison(what, "tolerance", 0.0, 0.0)
    if counts is None:
        return Comparison(
            what,
            "tolerance",
            float("inf"),
            0.0,
            problems=[f"{what}: differs from the reference's and no histogram is known to judge it"],
        )
    reference_cost, actual_cost = cost(expected, counts), cost(actual, counts)
    elements = int(counts.sum())
    allowance = kb.codebook_cost_allowance(elements, largest_gap(expected))
    excess = actual_cost - reference_cost
    out = Comparison(what, "tolerance", max(excess, 0.0) / elements, allowance / elements)
    if excess > allowance:
        out.problems.append(
            f"{what}: quantization cost {actual_cost:.6e} on the reference's histogram of {elements} "
            f"elements exceeds the reference codebook's {reference_cost:.6e} by {excess:.3e}, more than "
            f"the {allowance:.3e} that rounding across bin edges can explain"
        )
    return out


def compare_in_use(
    what: str, expected: torch.Tensor, actual: torch.Tensor, counts: torch.Tensor
) -> Comparison:
    """SPEC 5.6.23: the codewords a rank's dense momenta use after it learned a codebook
    (``actual``), against the reference's codewords in use (``expected``), by their cost on
    ``counts``, the histogram of the step's gradients."""
    elements = int(counts.sum())
    if elements == 0:
        return Comparison(what, "tolerance", 0.0, 0.0)
    allowance = kb.codewords_in_use_cost_allowance(elements, largest_gap(expected))
    excess = cost(actual, counts) - cost(expected, counts)
    out = Comparison(what, "tolerance", max(excess, 0.0) / elements, allowance / elements)
    if excess > allowance:
        out.problems.append(
            f"{what}: the codewords in use cost {excess:.3e} more than the reference's on the histogram "
            f"of the step's {elements} gradient elements, more than the {allowance:.3e} that rounding "
            "across bin edges explains (SPEC 3.6.3, 5.6.23)"
        )
    return out

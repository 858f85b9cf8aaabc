"""From a restored dense shard back to compact block state (SPEC 3.6).

The checkpoint holds momentum and second moment as dense fp32 shards, cut along
the *source* ranks' boundaries. On the target, each rank turns its own dense
shard back into the optimizer's compact form:

1. a period per slot, chosen by the optimizer's own period rules
   (:func:`gefen_reference.periods.choose_period`) with the dense second moment standing
   in for the squared gradient;
2. one codebook per rank, learned by the optimizer's own codebook learner
   (:func:`gefen_reference.codebook.learn_codebook`) from the momentum cut at those
   periods;
3. per block: the momentum's largest magnitude, each element's nearest codeword
   after dividing by it, and the mean of the second moment.

Nothing here touches an optimizer; every function returns new tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gefen_reference.codebook import learn_codebook
from gefen_reference.codewords import nearest_codeword_indices
from gefen_reference.periods import PeriodRules, check_period_divides, choose_period


def period_for(rules: PeriodRules, name: str, global_shape, second: torch.Tensor) -> int:
    """The block period of a non-empty restored shard (SPEC 3.6.2).

    The dense second moment is already an average of squared gradients, so it
    enters the search as the squares themselves: fp32 values widened to float64,
    in logical row-major order. ``global_shape`` is the parameter's global shape,
    as on the first native step.
    """
    squares = second.detach().reshape(-1).float().cpu().numpy().astype(np.float64)
    period = choose_period(rules, name, tuple(global_shape), squares)
    check_period_divides(name, second.numel(), period)
    return period


def relearn_codebook(pieces: Sequence[tuple], device) -> torch.Tensor | None:
    """One codebook for this rank from ``(momentum, period)`` pieces, in slot order (SPEC 3.6.3).

    Returns None when there is no piece (the rank holds no initialized, non-empty
    slot); the optimizer then learns one from gradients on its next step.
    """
    return learn_codebook([(momentum.reshape(-1), period) for momentum, period in pieces], device)


def reblock(codebook: torch.Tensor, momentum: torch.Tensor, second: torch.Tensor, period: int):
    """Compact ``(m_codebook, m_magnitude, vmean)`` of one dense shard at ``period`` (SPEC 3.6.4).

    * ``m_magnitude[b] = max |momentum|`` over block ``b``, shape ``(nb, 1)``, fp32;
    * ``m_codebook[b, j]`` = the uint8 index of the codeword nearest to
      ``momentum[b, j] / m_magnitude[b]`` (0 where the block is all zero), by the
      optimizer's nearest-codeword rule, shape ``(nb, period)``;
    * ``vmean[b]`` = the fp32 mean of the second moment over block ``b``, ``(nb, 1)``.

    The codebook is copied to the momentum's device; the caller's stays where it is.
    """
    table = codebook.to(device=momentum.device, dtype=torch.float32)
    blocks = momentum.detach().float().reshape(-1).view(-1, period)
    magnitude = blocks.abs().amax(dim=1, keepdim=True)
    scaled = torch.where(magnitude > 0, blocks / magnitude, torch.zeros_like(blocks))
    indices = nearest_codeword_indices(table, scaled)
    vmean = second.detach().float().reshape(-1).view(-1, period).mean(dim=1, keepdim=True)
    return indices, magnitude, vmean


__all__ = ["period_for", "reblock", "relearn_codebook"]

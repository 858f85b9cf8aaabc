"""Codeword lookup: the nearest-codeword rule and dequantization (SPEC 1.7).

Indices are uint8 positions in the optimizer's sorted fp32 codebook of 256 entries.
"""

from __future__ import annotations

import torch


def nearest_codeword_indices(codebook: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """uint8 index of the codeword nearest each value, ties to the lower index (SPEC 1.7.1).

    ``i = lower_bound(codebook, v)``; the two neighbours ``L = clamp(i-1)`` and
    ``R = clamp(i)`` are compared by ``|v - cb|`` computed in fp32, and ``L`` wins ties. A run of
    duplicate codewords therefore maps a value at or below it to its lowest index and a value
    above it to its highest (SPEC 1.7.3).
    """
    if codebook.device != values.device:
        raise ValueError(
            f"codebook on {codebook.device} but values on {values.device}: they must share a device"
        )
    k = codebook.numel()
    if k <= 1:
        return torch.zeros(values.shape, dtype=torch.uint8, device=values.device)
    v = values.float()
    upper = torch.searchsorted(codebook, v.reshape(-1)).reshape(v.shape)
    left = (upper - 1).clamp(0, k - 1)
    right = upper.clamp(0, k - 1)
    left_wins = (v - codebook[left]).abs() <= (v - codebook[right]).abs()
    return torch.where(left_wins, left, right).to(torch.uint8)


def dequantize(codebook: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Codewords for ``indices``, rounded to ``dtype`` (the gradient's dtype, SPEC 1.8.8 steps 1 and 6)."""
    if codebook.device != indices.device:
        raise ValueError(
            f"codebook on {codebook.device} but indices on {indices.device}: they must share a device"
        )
    return codebook[indices.long()].to(dtype)

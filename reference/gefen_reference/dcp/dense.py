"""Expanding one slot's compact state into the dense fp32 tensors the checkpoint holds.

Formulas (SPEC.md 2.1.6): for element ``i`` of the local shard, in block
``b = i // period``,

* momentum ``m[i] = fp32(codebook[index[i]]) * fp32(m_magnitude[b])`` -- one fp32
  multiply, nothing else rounded;
* second moment ``v[i] = fp32(vmean[b])`` -- a repeat of the block value in
  freshly allocated memory, never a view of the live ``vmean``.

A fresh (never stepped) slot expands to zeros shaped and strided like the shard.
"""

from __future__ import annotations

import torch

from . import schema

# Indices are widened to int64 for the gather this many at a time, so the
# scratch beyond the fp32 result stays bounded whatever the shard size.
GATHER_CHUNK = 1 << 22


def momentum(codebook: torch.Tensor, local: torch.Tensor, state) -> torch.Tensor:
    indices = state["m_codebook"].reshape(-1)
    magnitude = state["m_magnitude"].reshape(-1).float()
    period = schema.as_counter(state["automatic_period"], "automatic_period")
    if period < 1 or indices.numel() != magnitude.numel() * period:
        raise ValueError("Gefen momentum block geometry is invalid")
    table = codebook.detach().to(device=indices.device, dtype=torch.float32)
    out = torch.empty(indices.numel(), dtype=torch.float32, device=indices.device)
    for start in range(0, indices.numel(), GATHER_CHUNK):
        stop = min(start + GATHER_CHUNK, indices.numel())
        out[start:stop] = table.index_select(0, indices[start:stop].long())
    out.view(-1, period).mul_(magnitude.view(-1, 1))
    return out.view(local.shape)


def second_moment(local: torch.Tensor, state) -> torch.Tensor:
    period = schema.as_counter(state["automatic_period"], "automatic_period")
    block_means = state["vmean"].reshape(-1).float()
    if period < 1 or block_means.numel() * period != local.numel():
        raise ValueError("Gefen second-moment block geometry is invalid")
    out = torch.empty(local.numel(), dtype=torch.float32, device=block_means.device)
    out.view(-1, period).copy_(block_means.view(-1, 1))
    return out.view(local.shape)


def zeros(local: torch.Tensor) -> torch.Tensor:
    # zeros_like keeps the shard's memory format; the writer records strides.
    return torch.zeros_like(local, dtype=torch.float32)

"""Codebook learning (SPEC 1.6) with the histogram and the optimal-codebook DP in C, bit for bit.

The histogram counts are exact integers, so the C kernel's equal the reference's whatever the
order (``csrc/histogram.c``); the DP of SPEC 1.6.8 is the reference's default solver in C
(``csrc/codebook_dp.c``), every float64 operation the one the SPEC fixes. So the codebook is the
reference's bit for bit, which is more than the tolerance profile asks (SPEC 5.6.7).
The reference's own functions take over where the kernels do not apply: a gradient that is not
finite or not on the CPU (its histogram), fewer active bins than codewords (the padding case,
no DP), histograms outside the monotone search's premise or with a count lost in the float64
running sum (the reference solver decides, or raises as the reference does).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

import gefen_reference.codebook as reference_codebook

from . import kernels, native

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_NOT_FINITE = -2


def _kernel_input(flat: torch.Tensor) -> torch.Tensor | None:
    if flat.device.type != "cpu" or not torch.is_floating_point(flat) or not kernels.available():
        return None
    if flat.dtype not in _SUFFIX or (flat.dtype == torch.float16 and not kernels.native_half()):
        flat = flat.float()  # SPEC 1.6.4 normalises r32(g): the same values
    return flat.contiguous()


def histogram_counts(pieces: Iterable[tuple[torch.Tensor, int]]) -> torch.Tensor | None:
    """int64 counts over the 4096 bins for ``(flat local gradient, period)`` pieces (SPEC 1.6.3-1.6.5);
    None when no element was seen. Equal to ``gefen_reference.codebook.histogram_counts``."""
    counts = np.zeros(reference_codebook.HISTOGRAM_BINS, dtype=np.int64)
    seen = 0
    for flat, period in pieces:
        n = flat.numel()
        if n == 0:
            continue
        seen += n
        data = _kernel_input(flat)
        if data is not None:
            status = getattr(native.library(), f"gefen_histogram_{_SUFFIX[data.dtype]}")(
                data.data_ptr(), n, int(period), counts.ctypes.data, torch.get_num_threads()
            )
            if status == 0:
                continue
            if status != _NOT_FINITE:
                raise MemoryError("gefen_fast: the histogram could not allocate its counters")
        counts += reference_codebook.histogram_counts([(flat, period)]).numpy()
    return torch.from_numpy(counts) if seen else None


def codebook_from_counts(counts: torch.Tensor) -> torch.Tensor:
    """The codebook of SPEC 1.6.5-1.6.8 for int64 bin counts;
    ``gefen_reference.codebook.codebook_from_counts``'s
    bits."""
    weights = counts.to(torch.float32)
    active = weights > 0
    m = int(active.sum())
    k = reference_codebook.CODEBOOK_SIZE
    if m < k or not kernels.available():
        return reference_codebook.codebook_from_counts(counts)
    centers = np.ascontiguousarray(reference_codebook.bin_centers()[active].numpy().astype(np.float64))
    w = np.ascontiguousarray(weights[active].numpy().astype(np.float64))
    out = np.empty(k, dtype=np.float32)
    status = native.library().gefen_codebook_dp(
        centers.ctypes.data, w.ctypes.data, m, k, out.ctypes.data, torch.get_num_threads()
    )
    if status != 0:
        return reference_codebook.codebook_from_counts(counts)
    return torch.from_numpy(out)


def learn_codebook(
    pieces: Iterable[tuple[torch.Tensor, int]], device: torch.device | str = "cpu"
) -> torch.Tensor | None:
    """The fp32[256] codebook for the gradient pieces, or None when they are all empty (SPEC 1.6.2)."""
    counts = histogram_counts(pieces)
    if counts is None:
        return None
    return codebook_from_counts(counts).to(device)

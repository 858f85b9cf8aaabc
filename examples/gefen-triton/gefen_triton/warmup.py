"""``prepare(device)``: every kernel variant this backend launches, run once on a tiny input.

Compiled, each variant (a kernel specialised to a dtype and a tile shape) is compiled on its first
launch and cached on disk by Triton; under the interpreter there is nothing to compile and one
small step per dtype imports and exercises everything. Either way no later step pays a one-time
cost, so the suite's rank deadlines never see one (SPEC 4.2.11).
"""

from __future__ import annotations

import torch

from . import kernels as K
from . import launch

DTYPES = launch.KERNEL_DTYPES


def _periods(compiled: bool) -> list[int]:
    """Periods that reach every tile width (``P == width``: the aligned vector variant; one less:
    the masked one) and the split path; under the interpreter a few, since nothing compiles."""
    if not compiled:
        return [1, 15, 64, K.MAX_TILE_PERIOD + 5]
    widths = sorted({launch.tile_columns(p) for p in range(1, K.MAX_TILE_PERIOD + 1)})
    periods = {1, K.MAX_TILE_PERIOD + 5}
    for w in widths:
        if w >= 16:
            periods |= {w, w - 1}
    return sorted(periods)


def _factored_shapes(compiled: bool) -> list[tuple[int, int]]:
    """Matrices whose column counts reach every column width of the squares kernel."""
    if not compiled:
        return [(4, 24)]
    widths = sorted({launch.square_tile_columns(c) for c in range(1, 1025)})
    return [(3, w) for w in widths]


def exercise(device: torch.device, dtype: torch.dtype) -> None:
    """Two steps of an optimizer holding one parameter per variant, block and factored."""
    from .optimizer import Gefen

    compiled = device.type != "cpu"
    params, periods = [], {}
    for period in _periods(compiled):
        blocks = 2 if period <= K.MAX_TILE_PERIOD // 2 else 1
        p = torch.nn.Parameter(torch.zeros(blocks * period, dtype=dtype, device=device))
        params.append(p)
        periods[p] = period
    for shape in _factored_shapes(compiled):
        p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=device))
        params.append(p)
        periods[p] = shape[1]
    for factored in (False, True):
        opt = Gefen(
            [p.detach().clone().requires_grad_() for p in params], factored_v_2d=factored, weight_decay=0.1
        )
        fresh = [p for group in opt.param_groups for p in group["params"]]
        for p, q in zip(fresh, params):
            opt.state[p]["automatic_period"] = periods[q]
        generator = torch.Generator(device=device).manual_seed(0)
        for _ in range(2):
            for p in fresh:
                p.grad = torch.randn(p.shape, generator=generator, device=device).to(dtype)
            opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepare(device) -> None:
    """Refuse a device the current mode cannot reach (naming the fix), then run every variant."""
    prepare_dtypes(device, DTYPES)


def prepare_dtypes(device, dtypes) -> None:
    """:func:`prepare` for the variants of these parameter dtypes only (a compile split across
    processes, as ``benchmarks/gpu_check.py`` does)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    launch.check_device(device, "the device")
    for dtype in dtypes:
        exercise(device, dtype)

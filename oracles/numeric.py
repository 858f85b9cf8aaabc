"""Numeric comparison with a written-down tolerance policy (SPEC 5.3).

Two regimes: *bitwise* for implementations that claim CPU bit-exactness (every element's bit
pattern equal, dtype and shape equal, NaNs compared by bits), and *tolerance* otherwise, with
per-dtype bounds from :data:`TOLERANCES`. Functions return a :class:`Mismatch` describing the
first difference (or None) so that callers can build messages that name what differed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

#: (rtol, atol) per parameter dtype for the tolerance regime, after at most 8 steps
#: (the published non-fused CPU-vs-CUDA parity bounds).
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-4, 1e-5),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-2, 2e-2),
}


@dataclass(frozen=True)
class Mismatch:
    what: str
    detail: str

    def __str__(self) -> str:
        return f"{self.what}: {self.detail}"


def _bits(t: torch.Tensor) -> torch.Tensor:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().contiguous().view(view) if t.is_floating_point() else t.detach()


def bitwise_mismatch(what: str, expected: torch.Tensor, actual: torch.Tensor) -> Optional[Mismatch]:
    """None when ``actual`` has the dtype, shape and exact bits of ``expected``."""
    if not torch.is_tensor(actual):
        return Mismatch(what, f"expected a tensor, got {type(actual).__name__}")
    if expected.dtype != actual.dtype:
        return Mismatch(what, f"dtype {actual.dtype}, expected {expected.dtype}")
    if tuple(expected.shape) != tuple(actual.shape):
        return Mismatch(what, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    eb, ab = _bits(expected.cpu()), _bits(actual.cpu())
    differs = eb != ab
    if bool(differs.any()):
        n = int(differs.sum())
        i = int(differs.reshape(-1).nonzero()[0])
        e, a = expected.reshape(-1)[i].item(), actual.reshape(-1)[i].item()
        return Mismatch(what, f"{n} of {expected.numel()} elements differ; first at flat index {i}: {a!r} vs expected {e!r}")
    return None


def tolerance_mismatch(
    what: str, expected: torch.Tensor, actual: torch.Tensor, rtol: Optional[float] = None, atol: Optional[float] = None
) -> Optional[Mismatch]:
    """None when ``actual`` is within (rtol, atol) of ``expected`` (defaults by dtype)."""
    if not torch.is_tensor(actual):
        return Mismatch(what, f"expected a tensor, got {type(actual).__name__}")
    if tuple(expected.shape) != tuple(actual.shape):
        return Mismatch(what, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    default_rtol, default_atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    e, a = expected.detach().double().cpu(), actual.detach().double().cpu()
    bad = ~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if bool(bad.any()):
        err = (a - e).abs()
        i = int(err.reshape(-1).argmax())
        return Mismatch(what, f"{int(bad.sum())} elements outside rtol={rtol}, atol={atol}; max abs error {err.max().item():.3e} at flat index {i}")
    return None


def max_abs_error(expected: torch.Tensor, actual: torch.Tensor) -> float:
    return float((expected.detach().double() - actual.detach().double()).abs().max()) if expected.numel() else 0.0


def profile_description(profile: str) -> dict:
    """The numeric profile ``profile`` ("torch-exact" or "tolerance") as the certificate states it:
    what is compared how, with every bound applied (SPEC 0.4, 5.3)."""
    if profile == "torch-exact":
        return {"name": profile, "comparison": "bitwise: dtype, shape and every element's bits (SPEC 5.3.1)"}
    if profile == "tolerance":
        return {
            "name": profile,
            "comparison": "within per-dtype (rtol, atol) after at most 8 steps (SPEC 5.3.2)",
            "parameters": {str(dtype).replace("torch.", ""): {"rtol": r, "atol": a} for dtype, (r, a) in TOLERANCES.items()},
            "continuation_after_reshard": {"max_abs": 5e-3},
        }
    raise ValueError(f"unknown numeric profile {profile!r} (known: torch-exact, tolerance)")

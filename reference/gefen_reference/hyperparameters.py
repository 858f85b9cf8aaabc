"""Validation of per-group hyperparameters (SPEC 1.1.3).

The same rules apply at construction, to every added group and to every group
restored by a native load (SPEC 1.12.6).
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: Keys a stored group holds besides ``params`` and the naming lists.
HYPERPARAMETER_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay")


def _number(value: Any) -> float:
    if torch.is_tensor(value):
        return float(value.detach().reshape(-1)[0].item())
    return float(value)


def validate_hyperparameters(lr: Any, beta1: Any, beta2: Any, eps: Any, weight_decay: Any) -> None:
    """Raise ValueError naming the first invalid value, in the published order.

    lr: a real number or a 1-element tensor, ``>= 0`` (inf allowed, NaN not);
    betas: ``0 <= beta < 1``; weight_decay: ``>= 0``; eps: finite and ``> 0``.
    """
    if torch.is_tensor(lr) and lr.numel() != 1:
        raise ValueError(f"lr as a Tensor must be 1-element, got numel={lr.numel()}")
    for key, value in (
        ("lr", lr),
        ("beta1", beta1),
        ("beta2", beta2),
        ("eps", eps),
        ("weight_decay", weight_decay),
    ):
        if isinstance(value, (bool, str)) or not (torch.is_tensor(value) or isinstance(value, (int, float))):
            raise ValueError(f"Invalid {key}: expected a real number, got {value!r}")
        if torch.is_tensor(value) and (value.is_complex() or value.numel() != 1):
            raise ValueError(f"Invalid {key}: expected a real 1-element tensor, got {value!r}")
    if not 0.0 <= _number(lr):
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= _number(beta1) < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {beta1}")
    if not 0.0 <= _number(beta2) < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {beta2}")
    if not 0.0 <= _number(weight_decay):
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    e = _number(eps)
    if not math.isfinite(e) or e <= 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}; eps must be finite and > 0")


def split_betas(betas: Any) -> tuple[Any, Any]:
    """``betas`` must be a pair; the group stores it as ``beta1``/``beta2`` (SPEC 1.2.3-1.2.4)."""
    try:
        beta1, beta2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}") from None
    return beta1, beta2


def scalar_lr(lr: Any) -> float:
    """The learning rate as a Python float: a tensor lr gives its own rounded value (SPEC 1.4.2)."""
    return lr.item() if torch.is_tensor(lr) else lr

"""``gefen_fast.Gefen``: the Gefen optimizer with fused CPU kernels (SPEC Part 1, tolerance profile).

Everything except the arithmetic of a step is the reference's, reused through its public
API: the constructor and its validation, parameter groups and names, the native state dict
and its validating load (SPEC 1.1-1.3, 1.11, 1.12) are inherited from ``reference.Gefen``;
periods and the codebook are chosen with ``reference.periods`` and ``reference.codebook``
(identical float64 and integer math, SPEC 0.4.2). The per-parameter update runs in the
kernels of :mod:`gefen_fast.cpu_kernels` for CPU fp32/bf16/fp16 tensors, and in the
reference's torch operations elsewhere (CUDA, fp64), so the state layout is the same in
every case and the reference's DCP adapter serves this class through its declared state
layout (``reference.dcp.STATE_LAYOUT``, SPEC 2.3.6).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

import reference
from reference.codebook import learn_codebook
from reference.dcp import STATE_LAYOUT
from reference.hyperparameters import scalar_lr
from reference.native_state import local_tensor
from reference.periods import check_period_divides, choose_period, squared_gradient
from reference.steps import (
    StepHyper,
    block_vmean_step,
    factored_step,
    new_block_second_moment,
    new_factored_second_moment,
    new_momentum_state,
)

from . import kernels


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "placements") and hasattr(t, "to_local")


class Gefen(reference.Gefen):
    """Gefen with fused kernels; the reference's constructor, state format and checkpoint rules."""

    #: Declares the reference's state layout protocol, so ``reference.dcp.GefenDCPState`` accepts it.
    gefen_state_layout = STATE_LAYOUT

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One optimizer step, in the order of SPEC 1.10.1."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._preflight()
        if not self._grad_scaler_allows_step():
            return loss
        if self.codebook is None:
            self._learn()
        for group in self.param_groups:
            hyper = StepHyper(
                lr=scalar_lr(group["lr"]), beta1=group["beta1"], beta2=group["beta2"],
                eps=group["eps"], weight_decay=group["weight_decay"],
            )
            for name, p in zip(group["param_names"], group["params"]):
                if p.grad is None:
                    continue
                grad = local_tensor(p.grad)
                if grad.numel() == 0:
                    continue
                factored = self.factored_v_2d and p.ndim == 2 and not _is_dtensor(p)
                state = self.state[p]
                self._initialise(name, p, grad, state, factored)
                self._update(p, grad, state, hyper, factored)
        self.global_step += 1
        return loss

    # -------------------------------------------------------------------- the update
    def _update(self, p, grad, state, hyper: StepHyper, factored: bool) -> None:
        local = local_tensor(p)
        if kernels.handles(local, grad):
            tables = self.__dict__.setdefault("_codeword_tables", kernels.CodewordTables())
            if factored:
                kernels.factored_update(local, grad, state, tables, self.codebook, hyper)
            else:
                kernels.block_update(local, grad, state, tables, self.codebook, hyper)
        elif factored:
            factored_step(p, grad, state, self.codebook, hyper)
        else:
            block_vmean_step(local, grad, state, self.codebook, hyper)

    # ------------------------------------------------------------ step orchestration
    def _preflight(self) -> None:
        """SPEC 1.10.2: every gradient is checked before anything changes."""
        for group in self.param_groups:
            for name, p in zip(group["param_names"], group["params"]):
                g = p.grad
                if g is None:
                    continue
                if getattr(g, "is_sparse", False) or g.layout != torch.strided:
                    raise RuntimeError(f"Gefen does not support sparse gradients (parameter {name!r}, layout {g.layout})")
                if torch.is_complex(g):
                    raise RuntimeError(f"Gefen does not support complex gradients (parameter {name!r})")
                if tuple(g.shape) != tuple(p.shape):
                    raise RuntimeError(
                        f"gradient shape {tuple(g.shape)} of {name!r} does not match parameter shape {tuple(p.shape)}"
                    )
                if not _is_dtensor(p) and not _is_dtensor(g) and g.device != p.device:
                    raise RuntimeError(f"parameter {name!r} and its gradient must live on the same device")

    def _grad_scaler_allows_step(self) -> bool:
        """SPEC 1.10.3-1.10.4: False on ``found_inf``; otherwise unscale every gradient in place."""
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        for label, value in (("found_inf", found_inf), ("grad_scale", grad_scale)):
            if torch.is_tensor(value) and value.numel() != 1:
                raise RuntimeError(f"GradScaler attribute {label} must hold one element, got {value.numel()}")
        if found_inf is not None and bool(found_inf.item() if torch.is_tensor(found_inf) else found_inf):
            return False
        if grad_scale is None:
            return True
        scale = float(grad_scale.item() if torch.is_tensor(grad_scale) else grad_scale)
        if not math.isfinite(scale) or scale <= 0.0:
            raise RuntimeError("GradScaler supplied a non-finite or non-positive grad_scale")
        inverse = torch.tensor(scale, dtype=torch.float64).reciprocal().float()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    local_tensor(p.grad).mul_(inverse)
        return True

    def _learn(self) -> None:
        """SPEC 1.6: periods for every param with a gradient, then the codebook; both or neither."""
        periods, pieces = {}, []
        for group in self.param_groups:
            for name, p in zip(group["param_names"], group["params"]):
                if p.grad is None:
                    continue
                flat = local_tensor(p.grad).detach().reshape(-1)
                if flat.numel() == 0:
                    continue
                period = self.state[p].get("automatic_period")
                if period is None:
                    period = choose_period(self.period_rules, name, tuple(p.shape), squared_gradient(flat))
                check_period_divides(name, flat.numel(), period)
                periods[p] = period
                pieces.append((flat, period))
        first = self.param_groups[0]["params"][0]
        device = local_tensor(first.grad if first.grad is not None else first).device
        codebook = learn_codebook(pieces, device)
        if codebook is None:
            return
        for p, period in periods.items():
            self.state[p]["automatic_period"] = period
        self.codebook = codebook

    def _initialise(self, name: str, p, grad, state: dict, factored: bool) -> None:
        """SPEC 1.8.1, 1.8.2, 1.9.2: state on a param's first step; a missing second moment after a switch."""
        if "step" not in state:
            period = state.get("automatic_period")
            if period is None:
                period = choose_period(self.period_rules, name, tuple(p.shape), squared_gradient(grad))
            check_period_divides(name, grad.numel(), period)
            state["automatic_period"] = period
            new_momentum_state(state, grad.numel(), period, grad.device)
        if factored:
            if "v_row" not in state:
                new_factored_second_moment(state, tuple(p.shape), grad.device)
        elif "vmean" not in state:
            new_block_second_moment(state, grad.device)
        elif "vmean_step" not in state:
            state["vmean_step"] = state["step"]

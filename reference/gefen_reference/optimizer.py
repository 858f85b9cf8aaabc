"""``gefen_reference.Gefen``: the readable, strict reference of the Gefen optimizer (SPEC Part 1).

Public surface mirrors gefen-x 0.5.0's ``Gefen`` constructor, ``step``,
``state_dict`` and ``load_state_dict``. Optimizer-level state is public:

* ``codebook``: fp32[256] sorted codewords, or None before the first learn;
* ``global_step``: completed ``step()`` calls (SPEC 1.10.6);
* ``deterministic``, ``factored_v_2d``: the constructor flags.

Per-parameter state keys follow the published layout (SPEC 1.11). On the CPU the
reference is bit-exact with gefen-x's non-fused path (torch-exact profile).

A kernel backend subclasses ``Gefen`` and overrides only its three extension hooks (SPEC 4.1.8):
:meth:`Gefen.choose_period`, :meth:`Gefen.learn_codebook` and :meth:`Gefen.update_parameters`
(or its per-parameter default, :meth:`Gefen.update_parameter`). Everything around them (the
constructor, groups and names, the step's order, state creation, the state dicts) stays the
reference's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import native_state
from .codebook import learn_codebook
from .hyperparameters import scalar_lr, split_betas, validate_hyperparameters
from .naming import name_group_params
from .native_state import is_dtensor, local_tensor
from .periods import PeriodRules, check_period_divides, choose_period, squared_gradient
from .steps import (
    StepHyper,
    block_vmean_step,
    factored_step,
    new_block_second_moment,
    new_factored_second_moment,
    new_momentum_state,
)

_IMPLICIT_GROUP = "_gefen_implicit_group"
#: Group keys the optimizer interprets; anything else a caller puts in a group is kept.
_CONSUMED_GROUP_KEYS = (
    "params",
    "name",
    "lr",
    "betas",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "param_names",
    "param_names_synthesized",
    _IMPLICIT_GROUP,
)


@dataclass(frozen=True)
class ParameterUpdate:
    """One parameter's update in a step, as :meth:`Gefen.update_parameters` receives it (SPEC 4.1.8 item 1).

    ``param`` is the parameter as registered (a DTensor's local shard is ``local_tensor(param)``),
    ``grad`` its local gradient (unscaled, non-empty), ``state`` its state dict, prepared for this
    step (periods chosen, momentum and the active second moment created, SPEC 1.8.1, 1.9.2) and
    updated in place, ``hyper`` its group's hyperparameters resolved for this step, ``factored``
    whether the factored second moment applies (SPEC 1.9.1).
    """

    name: str
    param: torch.Tensor
    grad: torch.Tensor
    state: dict
    hyper: StepHyper
    factored: bool


class Gefen(torch.optim.Optimizer):
    """Gefen: 8-bit codebook momentum with per-block magnitudes and a per-block second moment.

    Extension hooks for kernel backends (SPEC 4.1.8), each with the reference's arithmetic as its
    default: :meth:`choose_period`, :meth:`learn_codebook`, :meth:`update_parameters` and
    :meth:`update_parameter`.
    """

    def __init__(
        self,
        params: Any,
        lr: Any = 1e-3,
        betas: Any = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        fused: bool = True,
        force_1d_period_one: bool = False,
        force_2d_period_one: bool = False,
        period_one_substrings: Iterable[str] = (),
        factored_v_2d: bool = True,
        codebook_refresh_every: int = 0,
        stochastic_round: bool = False,
        deterministic: bool = False,
        capturable: bool = False,
        verbose: bool = False,
    ):
        if not isinstance(deterministic, bool):
            raise TypeError("deterministic must be a bool")
        if deterministic and factored_v_2d and stochastic_round:
            raise ValueError("deterministic=True with factored_v_2d=True cannot honour stochastic_round=True")
        if capturable:
            raise ValueError("capturable=True is not supported by the reference (SPEC 1.1.2)")
        if stochastic_round:
            raise ValueError("stochastic_round=True is not supported by the reference (SPEC 1.1.2)")
        if isinstance(codebook_refresh_every, bool) or not isinstance(codebook_refresh_every, int):
            raise ValueError(f"codebook_refresh_every must be an int, got {codebook_refresh_every!r}")
        if codebook_refresh_every < 0:
            raise ValueError(f"codebook_refresh_every must be >= 0, got {codebook_refresh_every}")
        if codebook_refresh_every > 0:
            raise ValueError("codebook_refresh_every>0 is not supported by the reference (SPEC 1.1.2)")
        if isinstance(period_one_substrings, str):
            raise TypeError(
                "period_one_substrings must be a collection of strings, not a bare str "
                f"(did you mean ({period_one_substrings!r},)?)"
            )
        substrings = tuple(period_one_substrings)
        if not all(isinstance(s, str) for s in substrings):
            raise TypeError("period_one_substrings must hold only strings")
        beta1, beta2 = split_betas(betas)
        validate_hyperparameters(lr, beta1, beta2, eps, weight_decay)

        # ``fused`` and ``verbose`` are accepted for gefen-x's signature and mean nothing here: the
        # reference has one path and prints nothing
        self.factored_v_2d = bool(factored_v_2d)
        self.deterministic = deterministic
        self.period_rules = PeriodRules(
            bool(force_1d_period_one), bool(force_2d_period_one), tuple(s.lower() for s in substrings)
        )
        self.codebook: torch.Tensor | None = None
        self.global_step = 0
        defaults = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        super().__init__(self._as_groups(params), defaults)

    # ----------------------------------------------------------------- registration
    @staticmethod
    def _as_groups(params: Any) -> list:
        items = [params] if isinstance(params, torch.Tensor) else list(params)
        if not items:
            raise ValueError("optimizer got an empty parameter list")
        if isinstance(items[0], dict):
            return items
        return [{"params": items, _IMPLICIT_GROUP: True}]

    def add_param_group(self, param_group: dict) -> None:
        """Register one group, all-or-nothing (SPEC 1.2): every check runs before any change."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("parameter group is missing the 'params' key")
        d = self.defaults
        lr = param_group.get("lr", d["lr"])
        if "betas" in param_group:
            beta1, beta2 = split_betas(param_group["betas"])
        else:
            beta1, beta2 = param_group.get("beta1", d["beta1"]), param_group.get("beta2", d["beta2"])
        eps = param_group.get("eps", d["eps"])
        weight_decay = param_group.get("weight_decay", d["weight_decay"])
        validate_hyperparameters(lr, beta1, beta2, eps, weight_decay)

        raw = param_group["params"]
        if isinstance(raw, set):
            raise TypeError("parameters must be an ordered collection, not a set")
        raw = [raw] if isinstance(raw, torch.Tensor) else list(raw)
        if not raw:
            raise ValueError("optimizer got an empty parameter list")
        given, params = [], []
        for item in raw:
            name, p = item if isinstance(item, tuple) else (None, item)
            if not isinstance(p, torch.Tensor):
                raise TypeError(
                    f"Gefen can only optimize Tensors, but one of the params is {type(p).__name__}"
                )
            if torch.is_complex(p):
                raise ValueError(f"Gefen does not support complex parameters (dtype {p.dtype})")
            if not (p.is_leaf or p.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")
            given.append(name)
            params.append(p)
        registered = {p for g in self.param_groups for p in g["params"]}
        if len(set(params)) != len(params) or not registered.isdisjoint(params):
            raise ValueError("some parameters appear in more than one parameter group")

        names, flags = name_group_params(
            given,
            group_name=param_group.get("name"),
            implicit_group=bool(param_group.get(_IMPLICIT_GROUP, False)),
            group_index=len(self.param_groups),
            registered_count=len(registered),
            taken={n for g in self.param_groups for n in g["param_names"]},
        )
        group = {k: v for k, v in param_group.items() if k not in _CONSUMED_GROUP_KEYS}
        if param_group.get("name") is not None:
            group["name"] = str(param_group["name"]).lower()
        elif len(names) == 1:
            group["name"] = names[0]
        group.update(
            params=params,
            param_names=names,
            param_names_synthesized=flags,
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            eps=eps,
            weight_decay=weight_decay,
        )
        self.param_groups.append(group)
        for p, name in zip(params, names):
            self.state[p]["name"] = name

    def named_params(self):
        """``(group, name, param)`` in group order then param order: the order every pass uses."""
        for group in self.param_groups:
            for name, p in zip(group["param_names"], group["params"]):
                yield group, name, p

    # ------------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimizer step (SPEC 1.10). The closure runs first, before any optimizer work."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_gradients()
        if not self._apply_grad_scaler():
            return loss
        if self.codebook is None:
            self._learn_codebook()
        updates = []
        try:
            for group, name, p in self.named_params():
                if p.grad is None:
                    continue
                grad = local_tensor(p.grad)
                if grad.numel() == 0:
                    continue
                state = self.state[p]
                factored = self.factored_v_2d and p.ndim == 2 and not is_dtensor(p)
                self._prepare_state(name, p, grad, state, factored)
                hyper = StepHyper(
                    lr=scalar_lr(group["lr"]),
                    beta1=group["beta1"],
                    beta2=group["beta2"],
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                )
                updates.append(ParameterUpdate(name, p, grad, state, hyper, factored))
        finally:
            # parameters are independent: the ones prepared before a failure are still updated
            # (SPEC 4.1.8 item 1), as one parameter at a time would have done
            self.update_parameters(updates)
        self.global_step += 1
        return loss

    # ---------------------------------------------------------- extension hooks (SPEC 4.1.8)
    def update_parameters(self, updates: Sequence[ParameterUpdate]) -> None:
        """Apply one step's updates, in group then parameter order (SPEC 4.1.8 item 1). Called once per
        ``step()`` after every parameter's state is prepared, also with an empty list. The
        parameters are independent, so a backend may run them in any order or all at once (a
        batched or multi-tensor kernel); the default calls :meth:`update_parameter` for each."""
        for u in updates:
            self.update_parameter(u.param, u.grad, u.state, u.hyper, u.factored)

    def update_parameter(
        self, p: torch.Tensor, grad: torch.Tensor, state: dict, hyper: StepHyper, factored: bool
    ) -> None:
        """One parameter's update from its prepared state (SPEC 1.8.3-1.8.8, 1.9, 4.1.8 item 1): the
        block step, or the factored step when ``factored``. A backend that updates one parameter
        at a time overrides this one."""
        if factored:
            factored_step(p, grad, state, self.codebook, hyper)
        else:
            block_vmean_step(local_tensor(p), grad, state, self.codebook, hyper)

    def choose_period(self, name: str, global_shape: tuple, local_grad: torch.Tensor) -> int:
        """The period of parameter ``name`` (SPEC 1.5.2, 4.1.8) from its local gradient: forced 1,
        the searched period, or the fallback. An exact obligation in every profile: an override
        must return the reference's period for the same gradient (a faster search of the same
        rule)."""
        # the module's choose_period (tests/benign.py clones this module and may replace it)
        return choose_period(self.period_rules, name, tuple(global_shape), squared_gradient(local_grad))

    def learn_codebook(
        self, pieces: Sequence[tuple[torch.Tensor, int]], device: torch.device
    ) -> torch.Tensor | None:
        """The codebook learned from ``pieces``, ``(flat local gradient, period)`` of every parameter
        with a gradient at the first step (SPEC 1.6, 4.1.8), on ``device``; None when nothing can
        be learned (every gradient zero). Exact in every profile, as :meth:`choose_period`."""
        # the module's learn_codebook (tests/benign.py clones this module and may replace it)
        return learn_codebook(pieces, device)

    def _check_gradients(self) -> None:
        """Structural preflight over every gradient before anything changes (SPEC 1.10.2)."""
        for _, name, p in self.named_params():
            g = p.grad
            if g is None:
                continue
            if getattr(g, "is_sparse", False) or g.layout != torch.strided:
                raise RuntimeError(
                    f"Gefen does not support sparse gradients (parameter {name!r}, layout {g.layout})"
                )
            if torch.is_complex(g):
                raise RuntimeError(f"Gefen does not support complex gradients (parameter {name!r})")
            if tuple(g.shape) != tuple(p.shape):
                raise RuntimeError(
                    f"gradient shape {tuple(g.shape)} of {name!r} does not match parameter shape "
                    f"{tuple(p.shape)}"
                )
            if not is_dtensor(p) and not is_dtensor(g) and g.device != p.device:
                raise RuntimeError(f"parameter {name!r} and its gradient must live on the same device")

    def _apply_grad_scaler(self) -> bool:
        """GradScaler protocol (SPEC 1.10.3): False to skip the step on overflow; else unscale in place."""
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        if found_inf is not None and bool(found_inf.item() if torch.is_tensor(found_inf) else found_inf):
            return False
        if grad_scale is None:
            return True
        scale = float(grad_scale.item() if torch.is_tensor(grad_scale) else grad_scale)
        if not math.isfinite(scale) or scale <= 0.0:
            raise RuntimeError("GradScaler supplied a non-finite or non-positive grad_scale")
        inverse = torch.tensor(scale, dtype=torch.float64).reciprocal().float()
        for _, _, p in self.named_params():
            if p.grad is not None:
                local_tensor(p.grad).mul_(inverse)
        return True

    def _learn_codebook(self) -> None:
        """Choose every period and learn the codebook from this step's gradients (SPEC 1.6.1).

        Periods are staged and committed only with the codebook, so a failure here
        leaves the optimizer as it was. A step without any gradient learns nothing.
        """
        periods, pieces = {}, []
        for _, name, p in self.named_params():
            if p.grad is None:
                continue
            flat = local_tensor(p.grad).detach().reshape(-1)
            if flat.numel() == 0:
                continue
            period = self.state[p].get("automatic_period")
            if period is None:
                period = self.choose_period(name, tuple(p.shape), flat)
            check_period_divides(name, flat.numel(), period)
            periods[p] = period
            pieces.append((flat, period))
        first = self.param_groups[0]["params"][0]
        device = local_tensor(first.grad if first.grad is not None else first).device
        codebook = self.learn_codebook(pieces, device)
        if codebook is None:
            return
        for p, period in periods.items():
            self.state[p]["automatic_period"] = period
        self.codebook = codebook

    def _prepare_state(
        self, name: str, p: torch.Tensor, grad: torch.Tensor, state: dict, factored: bool
    ) -> None:
        """Create state on a param's first step (SPEC 1.8.1, 1.9.2); add a missing second moment
        after a mode switch (SPEC 1.10.8) or a legacy ``vmean_step`` (SPEC 1.8.2)."""
        if "step" not in state:
            period = state.get("automatic_period")
            if period is None:
                period = self.choose_period(name, tuple(p.shape), grad)
            check_period_divides(name, grad.numel(), period)
            state["automatic_period"] = period
            new_momentum_state(state, grad.numel(), period, grad.device)
        if factored:
            if "v_row" not in state:
                new_factored_second_moment(state, tuple(p.shape), grad.device)
        elif "vmean" not in state:
            new_block_second_moment(state)
        elif "vmean_step" not in state:
            state["vmean_step"] = state["step"]

    # --------------------------------------------------------------- state dicts
    def state_dict(self) -> dict:
        """The native state dict (SPEC 1.11). Tensors are the live ones, as torch optimizers do.

        Refused for DTensor parameters (SPEC 1.12.11, 1.14 D13): their state is saved with
        the DCP adapter.
        """
        if any(is_dtensor(p) for _, _, p in self.named_params()):
            raise ValueError(
                "native state_dict of DTensor parameters is not supported by the reference; "
                "use gefen_reference.GefenDCPState with torch.distributed.checkpoint"
            )
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        sd = native_state.pack_state_dict(self)
        for hook in self._optimizer_state_dict_post_hooks.values():
            result = hook(self, sd)
            if result is not None:
                sd = result
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Validate, stage, then commit a native state dict (SPEC 1.12).

        A rejected load raises ValueError and leaves state, groups, codebook and
        counters exactly as they were; the caller's dict is never modified, and the
        restored tensors are copies in their saved dtypes. Into DTensor parameters only a
        never-stepped checkpoint loads (SPEC 1.12.11).
        """
        sd = state_dict.copy() if isinstance(state_dict, dict) else state_dict
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = hook(self, sd)
            if result is not None:
                sd = result
        staged = native_state.stage_load(self, sd)
        self.param_groups[:] = staged.param_groups
        self.state = staged.state
        self.codebook = staged.codebook
        self.global_step = staged.global_step
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

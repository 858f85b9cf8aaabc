"""Deterministic small workloads the suite replays on an implementation and on the reference.

* :func:`trajectory`: free-running training from common parameters on a fixed gradient stream
  (SPEC 5.6.10), every parameter recorded after every step;
* :func:`pinned_state` and :func:`pinned_step`: the reference's native state after some steps,
  loaded into an implementation with chosen parameters, and one step on the next gradient
  (SPEC 5.6.2-5.6.9).

The parameters of a pinned step are chosen so that every comparison can see something: half of
them start at 1e-3 of unit scale, so that 16-bit parameters show the update above their rounding,
half at unit scale, so that weight decay shows in fp32; ``faint`` gets gradients at the scale of
its group's ``eps`` (1e-6, representable in fp16), so that ``eps`` changes the stepsize.
"""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass

import torch

import reference
from oracles.pinned_step import ParamStep

#: name -> shape; chosen so that searched, fallback and period-1 blocks all occur.
SHAPES = {
    "weight": (48, 40),
    "vector": (256,),
    "conv": (8, 3, 3, 3),
    "prime": (37,),
    "faint": (64,),
    "big_prime": (2053,),
    "narrow": (24, 3),
    "late": (7, 11),
    "scalar": (1,),
}
GROUPS = (("weight", "vector", "conv", "prime"), ("faint", "big_prime", "narrow", "late", "scalar"))
LATE_START = 3
STRUCTURED = ("weight", "vector", "conv")
FAINT_SCALE = 1e-6
#: Starting scale of each parameter in a pinned step (see the module docstring).
PINNED_START_SCALE = {"weight": 1e-3, "vector": 1.0, "conv": 1e-3, "prime": 1.0, "faint": 1e-3,
                      "big_prime": 1e-3, "narrow": 1.0, "late": 1e-3, "scalar": 1.0}


def initial(dtype: torch.dtype, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(dtype) for n, s in SHAPES.items()}


def gradient(name: str, step: int, dtype: torch.dtype) -> torch.Tensor | None:
    if name == "late" and step < LATE_START:
        return None
    shape = SHAPES[name]
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}:{step}".encode()))
    x = torch.randn(shape, generator=g)
    if name in STRUCTURED:
        x = x * (1.0 + torch.arange(shape[-1], dtype=torch.float32) % 5)
    if name == "weight":
        x[:2] = 0.0
    if name == "faint":
        x = x * FAINT_SCALE
    return x.to(dtype)


def groups(params: dict, *, tensor_lr: bool, weight_decay: float) -> list:
    lr = torch.tensor(3e-3) if tensor_lr else 3e-3
    return [
        {"params": [(n, params[n]) for n in GROUPS[0]], "lr": lr, "weight_decay": weight_decay},
        {"params": [(n, params[n]) for n in GROUPS[1]], "lr": 1e-3, "betas": (0.8, 0.99), "eps": 1e-6},
    ]


@dataclass
class Trained:
    params: dict
    optimizer: object
    history: dict  # name -> [value after step 0 (the start), after step 1, ...] (detached copies)


def _reference(params, **options):
    return reference.Gefen(params, **options)


def trajectory(make_optimizer, dtype, steps, *, tensor_lr=False, weight_decay=0.0, **options) -> Trained:
    params = {n: torch.nn.Parameter(t) for n, t in initial(dtype).items()}
    opt = make_optimizer(groups(params, tensor_lr=tensor_lr, weight_decay=weight_decay), **options)
    history = {n: [p.detach().clone()] for n, p in params.items()}
    for step in range(steps):
        for n, p in params.items():
            p.grad = gradient(n, step, dtype)
        opt.step()
        for n, p in params.items():
            history[n].append(p.detach().clone())
    return Trained(params, opt, history)


def train(make_optimizer, dtype, steps, **kw) -> Trained:
    return trajectory(make_optimizer, dtype, steps, **kw)


def train_reference(dtype, steps, **kw) -> Trained:
    return trajectory(_reference, dtype, steps, **kw)


def first_step_pieces(state_dict: dict, dtype: torch.dtype) -> list:
    """``(gradient, period)`` of every parameter that had a gradient at step 1 (codebook learning)."""
    names = {pid: name for g in state_dict["param_groups"] for pid, name in zip(g["params"], g["param_names"])}
    pieces = []
    for pid, entry in state_dict["state"].items():
        grad = gradient(names[pid], 0, dtype)
        if grad is not None and "automatic_period" in entry:
            pieces.append((grad, entry["automatic_period"]))
    return pieces


# ------------------------------------------------------------------------------ pinned steps


def pinned_state(dtype: torch.dtype, pin_at: int, *, tensor_lr=False, weight_decay=0.0, **options) -> dict:
    """The reference's native state dict after ``pin_at`` steps (a deep copy). ``pin_at == 0``: the
    codebook the reference learned at its first step, every parameter's state fresh."""
    trained = train_reference(dtype, max(pin_at, 1), tensor_lr=tensor_lr, weight_decay=weight_decay, **options)
    sd = copy.deepcopy(trained.optimizer.state_dict())
    if pin_at == 0:
        sd["state"] = {pid: {"name": entry["name"]} for pid, entry in sd["state"].items()}
    return sd


@dataclass
class PinnedStep:
    start: dict  # name -> parameter before the step
    after: dict  # name -> parameter after the step
    grads: dict  # name -> gradient of the step
    state_dict: dict  # the optimizer's native state dict after the step (deep copy)


def pinned_start(dtype: torch.dtype) -> dict:
    return {n: (t.double() * PINNED_START_SCALE[n]).to(dtype) for n, t in initial(dtype, seed=7).items()}


def pinned_step(make_optimizer, dtype, pin_at: int, state_dict: dict, *, tensor_lr=False, weight_decay=0.0,
                **options) -> PinnedStep:
    """Load ``state_dict`` into an optimizer built by ``make_optimizer`` over :func:`pinned_start`
    parameters, set gradient ``pin_at`` and take one step."""
    start = pinned_start(dtype)
    params = {n: torch.nn.Parameter(t.clone()) for n, t in start.items()}
    opt = make_optimizer(groups(params, tensor_lr=tensor_lr, weight_decay=weight_decay), **options)
    opt.load_state_dict(copy.deepcopy(state_dict))
    grads = {n: gradient(n, pin_at, dtype) for n in params}
    for n, p in params.items():
        p.grad = None if grads[n] is None else grads[n].clone()
    opt.step()
    return PinnedStep(start, {n: p.detach().clone() for n, p in params.items()}, grads,
                      copy.deepcopy(opt.state_dict()))


def param_steps(pinned_sd: dict, result: PinnedStep, *, factored: bool) -> list:
    """The oracle's view (:class:`oracles.pinned_step.ParamStep`) of every parameter that stepped."""
    out = []
    for group in pinned_sd["param_groups"]:
        lr = group["lr"]
        hyper = dict(lr=float(lr.item()) if torch.is_tensor(lr) else float(lr), beta1=float(group["beta1"]),
                     beta2=float(group["beta2"]), eps=float(group["eps"]), weight_decay=float(group["weight_decay"]))
        for pid, name in zip(group["params"], group["param_names"]):
            if result.grads[name] is None:
                continue
            out.append(ParamStep(
                name=name, p0=result.start[name], p1=result.after[name], grad=result.grads[name],
                before=pinned_sd["state"].get(pid, {}), after=result.state_dict["state"].get(pid, {}),
                factored=factored and result.start[name].ndim == 2, **hyper))
    return out

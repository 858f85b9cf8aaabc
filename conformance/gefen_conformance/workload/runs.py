"""The optimizer comparisons' runs (SPEC 5.6, 4.3.11): the same inputs given to the reference and
to an implementation, every parameter and state recorded.

* :func:`trajectory` (free-running training of :data:`~gefen_conformance.workload.models.OPTIMIZER`,
  SPEC 5.6.10) and :func:`pinned_step` (one step from the reference's state, SPEC 5.6.1), each with
  a ``_from`` form taking explicit inputs (a reproducer's, SPEC 4.5.6);
* :func:`run_steps` and :func:`built` (any model, the native state recorded per step), with
  :func:`param_runs` and :func:`param_steps`, the oracles' views of a run and of a pinned step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from gefen_conformance.workload.models import (
    OPTIMIZER,
    REFERENCE,
    Model,
    device_for,
    gradient,
    group_hypers,
    initial,
    param_groups,
    parameters,
    set_gradients,
    state_to_cpu,
    to_cpu,
)

__all__ = [
    "PINNED_SALT",
    "PINNED_START_SCALE",
    "PinnedStep",
    "TrainingRun",
    "Trained",
    "built",
    "built_from",
    "first_step_pieces",
    "native_state",
    "optimizer_hypers",
    "param_runs",
    "param_steps",
    "pinned_from",
    "pinned_start",
    "pinned_state",
    "pinned_step",
    "pinned_step_from",
    "run_steps",
    "run_steps_from",
    "trajectory",
    "trajectory_from",
    "trajectory_gradients",
]


#: Starting scale of each parameter in a pinned step: half at 1e-3 of unit scale, so that 16-bit
#: parameters show the update above their rounding, half at unit scale, so that weight decay
#: shows in fp32.
PINNED_START_SCALE = {
    "weight": 1e-3,
    "vector": 1.0,
    "conv": 1e-3,
    "prime": 1.0,
    "faint": 1e-3,
    "big_prime": 1e-3,
    "narrow": 1.0,
    "late": 1e-3,
    "scalar": 1.0,
}
PINNED_SALT = 7


def optimizer_hypers(*, tensor_lr: bool = False, weight_decay: float = 0.0) -> tuple:
    """:data:`OPTIMIZER`'s two groups: lr 3e-3 (a one-element tensor when ``tensor_lr``) with
    ``weight_decay``; lr 1e-3, betas (0.8, 0.99), eps 1e-6."""
    lr = torch.tensor(3e-3) if tensor_lr else 3e-3
    return ({"lr": lr, "weight_decay": weight_decay}, {"lr": 1e-3, "betas": (0.8, 0.99), "eps": 1e-6})


@dataclass
class Trained:
    params: dict
    optimizer: object
    history: dict  # name -> [CPU copy at the start, after step 1, ...]
    states: dict = field(default_factory=dict)  # k -> deep copy of the native state dict after k steps


def trajectory(
    make_optimizer, dtype, steps: int, *, tensor_lr=False, weight_decay=0.0, states_after=(), **options
) -> Trained:
    """Free-running training of :data:`OPTIMIZER` (SPEC 5.6.10): the optimizer ``make_optimizer``
    builds (:data:`REFERENCE` for the reference's side) over the common start, ``steps`` steps
    (indices 0..steps-1), every parameter recorded after every step, and a deep copy of the
    native state dict after each step count in ``states_after`` (``Trained.states``)."""
    return trajectory_from(
        make_optimizer,
        initial(OPTIMIZER, dtype=dtype),
        trajectory_gradients(dtype, steps),
        optimizer_hypers(tensor_lr=tensor_lr, weight_decay=weight_decay),
        states_after=states_after,
        **options,
    )


def trajectory_gradients(dtype: torch.dtype, steps: int, model: Model = OPTIMIZER) -> list:
    """``[{name: gradient or None}]`` of ``model`` for steps 0..steps-1, in ``dtype`` (on CPU)."""
    return [{n: gradient(model, n, step, dtype=dtype) for n in model.shapes} for step in range(steps)]


def trajectory_from(
    make_optimizer, start: dict, grads: list, hypers, *, model: Model = OPTIMIZER, states_after=(), **options
) -> Trained:
    """:func:`trajectory` from explicit inputs (a reproducer's, SPEC 4.5.6): parameters ``start``
    (``{name: value}``, copied to the side's device), one ``{name: gradient or None}`` per step,
    the groups of ``model`` with ``hypers`` (copied: the two sides never share a tensor)."""
    params, opt = built_from(make_optimizer, model, start, hypers, **options)
    history = {n: [to_cpu(p)] for n, p in params.items()}
    states = {}
    for step, step_grads in enumerate(grads):
        _set_gradients(params, step_grads)
        opt.step()
        for n, p in params.items():
            history[n].append(to_cpu(p))
        if step + 1 in states_after:
            states[step + 1] = copy.deepcopy(opt.state_dict())
    return Trained(params, opt, history, states)


def first_step_pieces(state_dict: dict, dtype: torch.dtype, first_grads: dict | None = None) -> list:
    """``(gradient, period)`` of every parameter that had a gradient at step 1 (codebook learning);
    ``first_grads`` (``{name: gradient}``) the gradients of that step, by default :data:`OPTIMIZER`'s."""
    names = {
        pid: name for g in state_dict["param_groups"] for pid, name in zip(g["params"], g["param_names"])
    }
    pieces = []
    for pid, entry in state_dict["state"].items():
        grad = (
            gradient(OPTIMIZER, names[pid], 0, dtype=dtype)
            if first_grads is None
            else first_grads.get(names[pid])
        )
        if grad is not None and "automatic_period" in entry:
            pieces.append((grad, entry["automatic_period"]))
    return pieces


def pinned_state(dtype: torch.dtype, pin_at: int, *, tensor_lr=False, weight_decay=0.0, **options) -> dict:
    """The reference's native state dict after ``pin_at`` steps (a deep copy). ``pin_at == 0``: the
    codebook the reference learned at its first step, every parameter's state fresh."""
    steps = max(pin_at, 1)
    ran = trajectory(
        REFERENCE,
        dtype,
        steps,
        tensor_lr=tensor_lr,
        weight_decay=weight_decay,
        states_after=(steps,),
        **options,
    )
    return pinned_from(ran.states[steps], pin_at)


def pinned_from(state_dict: dict, pin_at: int) -> dict:
    """The pinned state of :func:`pinned_state` from the reference's native state dict after
    ``max(pin_at, 1)`` steps of :func:`trajectory` (a deep copy; ``pin_at == 0``: every parameter's
    state fresh, the codebook kept)."""
    sd = copy.deepcopy(state_dict)
    if pin_at == 0:
        sd["state"] = {pid: {"name": entry["name"]} for pid, entry in sd["state"].items()}
    return sd


@dataclass
class PinnedStep:
    start: dict  # name -> parameter before the step
    after: dict  # name -> parameter after the step (CPU copy)
    grads: dict  # name -> gradient of the step
    state_dict: dict  # the optimizer's native state dict after the step (deep copy, every tensor on CPU)


def pinned_start(dtype: torch.dtype) -> dict:
    """The parameters a pinned step starts from (``PINNED_START_SCALE`` of the salt-7 start)."""
    start = initial(OPTIMIZER, dtype=dtype, salt=PINNED_SALT)
    return {n: (t.double() * PINNED_START_SCALE[n]).to(dtype) for n, t in start.items()}


def pinned_step(
    make_optimizer, dtype, pin_at: int, state_dict: dict, *, tensor_lr=False, weight_decay=0.0, **options
) -> PinnedStep:
    """Load ``state_dict`` into an optimizer built by ``make_optimizer`` over :func:`pinned_start`
    parameters, set gradient ``pin_at`` and take one step."""
    grads = {n: gradient(OPTIMIZER, n, pin_at, dtype=dtype) for n in OPTIMIZER.shapes}
    return pinned_step_from(
        make_optimizer,
        state_dict,
        pinned_start(dtype),
        grads,
        optimizer_hypers(tensor_lr=tensor_lr, weight_decay=weight_decay),
        **options,
    )


def pinned_step_from(
    make_optimizer, state_dict: dict, start: dict, grads: dict, hypers, *, model: Model = OPTIMIZER, **options
) -> PinnedStep:
    """:func:`pinned_step` from explicit inputs (a reproducer's, SPEC 4.5.6): the optimizer over
    parameters ``start`` in the groups of ``model`` with ``hypers`` (copied: the two sides never
    share a tensor), ``state_dict`` loaded, gradients ``grads`` (``{name: gradient or None}``), one step."""
    params, opt = built_from(make_optimizer, model, start, hypers, **options)
    opt.load_state_dict(copy.deepcopy(state_dict))
    _set_gradients(params, grads)
    opt.step()
    return PinnedStep(
        start,
        {n: to_cpu(p) for n, p in params.items()},
        {n: grads.get(n) for n in params},
        state_to_cpu(opt.state_dict()),
    )


def param_steps(pinned_sd: dict, result: PinnedStep, *, factored: bool) -> list:
    """The oracle's view (:class:`gefen_oracles.pinned_step.ParamStep`) of every parameter that stepped."""
    from gefen_oracles.pinned_step import ParamStep

    out = []
    for g in pinned_sd["param_groups"]:
        hyper = group_hypers(g)
        for pid, name in zip(g["params"], g["param_names"]):
            if result.grads[name] is None:
                continue
            out.append(
                ParamStep(
                    name=name,
                    p0=result.start[name],
                    p1=result.after[name],
                    grad=result.grads[name],
                    before=pinned_sd["state"].get(pid, {}),
                    after=result.state_dict["state"].get(pid, {}),
                    factored=factored and result.start[name].ndim == 2,
                    **hyper,
                )
            )
    return out


@dataclass
class TrainingRun:
    """Steps recorded one by one: ``history[name]`` the parameter before the first step and after
    each (CPU copies), ``grads[name]`` its gradient at each step (CPU, or None), ``states`` the
    native state dict before the first step and after each (CPU deep copies; empty when not
    recorded), ``steps`` the step indices."""

    params: dict
    optimizer: object
    history: dict
    grads: dict
    states: list
    steps: list


def native_state(optimizer) -> dict:
    """A deep CPU copy of the optimizer's native state dict (SPEC 1.11)."""
    return state_to_cpu(optimizer.state_dict())


def _stepped(
    optimizer, params: dict, steps: list, give_gradients: Callable[[int], None], record_states: bool
) -> TrainingRun:
    """Step once per entry of ``steps`` after ``give_gradients(i)`` set the ``i``-th step's
    gradients, recording every parameter and gradient (and the native state, when asked)."""
    history = {n: [to_cpu(p)] for n, p in params.items()}
    grads = {n: [] for n in params}
    states = [native_state(optimizer)] if record_states else []
    for i in range(len(steps)):
        give_gradients(i)
        for n, p in params.items():
            grads[n].append(None if p.grad is None else to_cpu(p.grad))
        optimizer.step()
        for n, p in params.items():
            history[n].append(to_cpu(p))
        if record_states:
            states.append(native_state(optimizer))
    return TrainingRun(params, optimizer, history, grads, states, steps)


def run_steps(
    model: Model, optimizer, params: dict, steps: Iterable[int], *, record_states: bool
) -> TrainingRun:
    """Set the gradients and step for each index in ``steps``, recording every parameter (and the
    native state, when ``record_states``) before the first step and after each."""
    steps = list(steps)
    return _stepped(optimizer, params, steps, lambda i: set_gradients(model, params, steps[i]), record_states)


def run_steps_from(
    optimizer, params: dict, grads: list, steps: Iterable[int], *, record_states: bool
) -> TrainingRun:
    """:func:`run_steps` from explicit gradients (a reproducer's, SPEC 4.5.6): one ``{name: gradient
    or None}`` per step (copied to each parameter's device); ``steps`` the step indices they belong to."""
    steps = list(steps)
    if len(steps) != len(grads):
        raise ValueError(f"{len(grads)} steps of gradients for {len(steps)} step indices")

    return _stepped(optimizer, params, steps, lambda i: _set_gradients(params, grads[i]), record_states)


def _set_gradients(params: dict, grads: dict) -> None:
    """Each parameter's ``.grad``: a copy of ``grads[name]`` on the parameter's device, or None."""
    for n, p in params.items():
        g = grads.get(n)
        p.grad = None if g is None else g.clone().to(p.device)


def built_from(make_optimizer, model: Model, start: dict, hypers, **options) -> tuple:
    """:func:`built` from explicit starting values ``start`` (copied to the side's device; the
    hyperparameters copied too: the two sides never share a tensor)."""
    device = device_for(make_optimizer)
    params = {n: torch.nn.Parameter(t.clone().to(device)) for n, t in start.items()}
    return params, make_optimizer(param_groups(model, params, copy.deepcopy(hypers)), **options)


def built(make_optimizer, model: Model, dtype: torch.dtype, hypers, *, salt=None, **options) -> tuple:
    """``(params, optimizer)``: ``model``'s parameters in ``dtype`` on the side's device
    (:func:`device_for`) and the optimizer ``make_optimizer`` builds over its groups."""
    params = parameters(model, dtype=dtype, salt=salt, device=device_for(make_optimizer))
    return params, make_optimizer(param_groups(model, params, hypers), **options)


def param_runs(run: TrainingRun, *, factored_v_2d: bool) -> list:
    """The oracle's view (:class:`gefen_oracles.shadowing.ParamRun`) of every parameter of a recorded
    run with native states: the steps in which it had a gradient, with its group's hyperparameters
    and routing (SPEC 1.9.1) as the state dict after the last step records them."""
    from gefen_oracles.shadowing import ParamRun

    last = run.states[-1]
    out = []
    for g in last["param_groups"]:
        hyper = group_hypers(g)
        for pid, name in zip(g["params"], g["param_names"]):
            taken = [t for t, grad in enumerate(run.grads[name]) if grad is not None]
            out.append(
                ParamRun(
                    name=name,
                    p0=[run.history[name][t] for t in taken],
                    p1=[run.history[name][t + 1] for t in taken],
                    grads=[run.grads[name][t] for t in taken],
                    before=[run.states[t]["state"].get(pid, {}) for t in taken],
                    after=[run.states[t + 1]["state"].get(pid, {}) for t in taken],
                    factored=bool(factored_v_2d) and run.history[name][0].ndim == 2,
                    steps=[run.steps[t] for t in taken],
                    **hyper,
                )
            )
    return out

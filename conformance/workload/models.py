"""One workload vocabulary for the suite, the goldens and the project's tests (SPEC 4.2.4, 4.3).

A :class:`Model` names its parameters (shape, group, default hyperparameters per group) and the
deterministic rules that give their initial values and their gradient at each step. Every
function below takes a Model and does the one thing its name says, on plain tensors or, given a
mesh, on ``Shard(0)`` DTensors:

* models: :func:`initial` (full initial values), :func:`parameters` (``nn.Parameter`` s);
* gradients: :func:`gradient` (one full gradient), :func:`set_gradients` (every parameter's
  ``.grad`` for one step, sharded like its parameter);
* groups: :func:`param_groups` (the optimizer's groups of ``(name, parameter)`` pairs);
* training: :func:`train` (set gradients, step, for each step index), :func:`trajectory` and
  :func:`pinned_step` (the optimizer comparisons of SPEC 5.6);
* saving: :func:`save` and :func:`load` (``dcp.save`` / ``dcp.load`` through an implementation's
  adapter, on the current World's group).

Where tensors live is decided in one place, :func:`device_for`: the implementation's parameters
and gradients on the current World's device (the run's ``--gefen-device`` outside a scenario call),
the reference's side of an optimizer comparison (:data:`REFERENCE`) on CPU; comparisons take CPU
copies (:func:`to_cpu`, :func:`state_to_cpu`).

The numbers are part of the contract: the goldens, the mutant catalogue and the project's tests
depend on every seed below. A model's rules are module-level functions (or partials of them),
so a model pickles by reference.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

import torch

from gefen_conformance.harness import devices, world
from gefen_conformance.harness.sharding import shard, sharded_parameter

__all__ = [
    "BASE", "DCP_MODELS", "DCP_STEPS", "EMPTY", "FRESH", "GROUP_HYPERS", "OPTIMIZER", "PINNED_SALT",
    "PINNED_START_SCALE", "REFERENCE", "SAVED_HYPERS", "TARGET_HYPERS", "Model", "PinnedStep", "Trained",
    "crc32_seed", "device_for", "first_step_pieces", "full_params", "gradient", "group", "initial", "linspace", "load", "one_stream", "optimizer_hypers",
    "param_groups", "param_steps", "parameters", "per_name", "pinned_from", "pinned_start", "pinned_state",
    "pinned_step", "pinned_step_from", "save", "set_gradients", "state_to_cpu", "to_cpu", "train", "trained",
    "trajectory", "trajectory_from", "trajectory_gradients", "zeros",
]


# ------------------------------------------------------------------------------------ models


@dataclass(frozen=True, eq=False)
class Model:
    """A named set of parameters and the rules that drive them.

    ``shapes`` lists the parameters in registration order; ``groups`` the names of each
    optimizer group; ``hypers`` each group's hyperparameters (constructor keywords). ``init(model,
    salt)`` returns every full initial value (float32); ``seed(name, index, step)`` the seed of
    the generator that draws the gradient of ``name`` (the ``index`` -th parameter) at ``step``.
    A gradient is ``randn`` of the shape, times ``1 + column % column_period`` when ``structured``
    (structure for the period search), its first ``zero_rows`` rows zeroed, times ``scales``,
    rounded to a multiple of ``quantum`` when one is given (few distinct values); ``frozen`` parameters never get one (a fresh slot), nor does a parameter before its
    ``first_step``.
    """

    shapes: Mapping[str, tuple]
    groups: tuple
    init: Callable[["Model", Any], dict]
    seed: Callable[[str, int, int], int] = None  # default (set below): crc32_seed("{name}:{step}")
    hypers: tuple = ()
    salt: Any = 0  # the init salt when none is given
    structured: frozenset = frozenset()
    column_period: int = 5
    zero_rows: Mapping[str, int] = field(default_factory=dict)
    scales: Mapping[str, float] = field(default_factory=dict)
    quantum: float = 0.0
    first_step: Mapping[str, int] = field(default_factory=dict)
    frozen: frozenset = frozenset()

    def __post_init__(self):
        if self.seed is None:
            object.__setattr__(self, "seed", crc32_seed("{name}:{step}"))
        grouped = [n for names in self.groups for n in names]
        if sorted(grouped) != sorted(self.shapes):
            raise ValueError(f"a model's groups must list each parameter once: {self.groups} vs {list(self.shapes)}")

    def without(self, *names: str) -> "Model":
        """The same model without ``names`` (every other number unchanged)."""
        return replace(self, shapes={n: s for n, s in self.shapes.items() if n not in names},
                       groups=tuple(tuple(n for n in g if n not in names) for g in self.groups))


def one_stream(model: Model, salt: int) -> dict:
    """Initial values drawn in order from one generator seeded with ``salt``."""
    g = torch.Generator().manual_seed(salt)
    return {n: torch.randn(s, generator=g) for n, s in model.shapes.items()}


def per_name(model: Model, salt) -> dict:
    """Initial values from one generator per parameter, seeded by ``crc32("name:salt")``."""
    return {n: torch.randn(s, generator=torch.Generator().manual_seed(_crc32(f"{n}:{salt}")))
            for n, s in model.shapes.items()}


def zeros(model: Model, salt) -> dict:
    """Initial values all zero (no salt)."""
    return {n: torch.zeros(s) for n, s in model.shapes.items()}


def _linspace(low: float, high: float, model: Model, salt) -> dict:
    return {n: torch.linspace(low, high, torch.Size(s).numel()).reshape(s) for n, s in model.shapes.items()}


def linspace(low: float, high: float) -> Callable:
    """Initial values evenly spaced from ``low`` to ``high`` in every parameter (no salt)."""
    return functools.partial(_linspace, low, high)


def _crc32(text: str) -> int:
    return zlib.crc32(text.encode())


def _crc32_seed(template: str, name: str, index: int, step: int) -> int:
    return _crc32(template.format(name=name, step=step))


def crc32_seed(template: str) -> Callable:
    """Gradient seeds ``crc32(template.format(name=..., step=...))``."""
    return functools.partial(_crc32_seed, template)


# ---------------------------------------------------------------------------------- devices


class _Reference:
    """The oracle's optimizer (``reference.Gefen``), as the reference side of a comparison."""

    def __call__(self, groups, **options):
        import gefen_reference as reference

        return reference.Gefen(groups, **options)

    def __repr__(self) -> str:
        return "workload.REFERENCE"


#: Pass as ``make_optimizer`` for the reference's side of a comparison: it stays on CPU.
REFERENCE = _Reference()


def device_for(make_optimizer=None) -> torch.device:
    """Where the tensors of the side that ``make_optimizer`` builds live: the reference's
    (:data:`REFERENCE`) on CPU, an implementation's on the current World's device, or outside a
    scenario call on the run's device (``--gefen-device``, :func:`conformance.devices.selected`; CPU
    unless a suite run chose another). The one place that decides it (SPEC 4.6.2)."""
    if make_optimizer is REFERENCE:
        return torch.device("cpu")
    here = world.bound()
    return devices.selected() if here is None else here.device


def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy, for comparisons (never a view of live state)."""
    return tensor.detach().to("cpu", copy=True)


def state_to_cpu(value):
    """``value`` (a state dict, or any nest of dicts, lists and tuples) with every tensor replaced
    by a detached CPU copy (:func:`to_cpu`); everything else as it is. For comparing an
    implementation's state on another device with the reference's."""
    if torch.is_tensor(value):
        return to_cpu(value)
    if isinstance(value, dict):
        return {k: state_to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [state_to_cpu(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(state_to_cpu(v) for v in value)
    return value


# ----------------------------------------------------------------------- values and gradients


def initial(model: Model, *, dtype: torch.dtype = torch.float32, salt=None) -> dict:
    """``{name: full initial value}`` in ``dtype`` (on CPU)."""
    values = model.init(model, model.salt if salt is None else salt)
    return {n: v.to(dtype) for n, v in values.items()}


def parameters(model: Model, *, dtype: torch.dtype = torch.float32, salt=None, mesh=None,
               device: torch.device | None = None) -> dict:
    """``{name: nn.Parameter}``: plain, or ``Shard(0)`` DTensors on ``mesh``; on ``device``
    (default: the implementation's, :func:`device_for`)."""
    device = device_for() if device is None else device
    out = {}
    for name, value in initial(model, dtype=dtype, salt=salt).items():
        value = value.to(device)
        out[name] = torch.nn.Parameter(value) if mesh is None else sharded_parameter(value, mesh)
    return out


def gradient(model: Model, name: str, step: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The full gradient of ``name`` at ``step`` (on CPU), or None when it gets none."""
    if name in model.frozen or step < model.first_step.get(name, step):
        return None
    shape = model.shapes[name]
    seed = model.seed(name, list(model.shapes).index(name), step)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    if name in model.structured:
        x = x * (1.0 + torch.arange(shape[-1], dtype=torch.float32) % model.column_period)
    if name in model.zero_rows:
        x[: model.zero_rows[name]] = 0.0
    if name in model.scales:
        x = x * model.scales[name]
    if model.quantum:
        x = torch.round(x / model.quantum) * model.quantum
    return x.to(dtype)


def set_gradients(model: Model, params: dict, step: int) -> None:
    """Every parameter's ``.grad`` for ``step``: in its dtype, on its device, sharded like it (a
    collective for DTensors)."""
    from torch.distributed.tensor import DTensor

    for name, p in params.items():
        g = gradient(model, name, step, dtype=p.dtype)
        if g is not None:
            g = shard(g, p.device_mesh) if isinstance(p, DTensor) else g.to(p.device)
        p.grad = g


def param_groups(model: Model, params: dict, hypers=None) -> list:
    """The optimizer's groups: ``(name, parameter)`` pairs of each of the model's groups that are
    in ``params``, with ``hypers`` (default: the model's) per group."""
    hypers = model.hypers if hypers is None else hypers
    hypers = tuple(hypers) + ({},) * (len(model.groups) - len(hypers))
    return [dict(h, params=[(n, params[n]) for n in names if n in params]) for names, h in zip(model.groups, hypers)]


def train(model: Model, optimizer, params: dict, steps: Iterable[int]) -> None:
    """For each step index in ``steps``: set the gradients, then ``optimizer.step()``."""
    for step in steps:
        set_gradients(model, params, step)
        optimizer.step()


def full_params(params: dict) -> dict:
    """Every parameter's global value as a CPU tensor (a collective for DTensors)."""
    from torch.distributed.tensor import DTensor

    return {n: to_cpu(p.full_tensor() if isinstance(p, DTensor) else p) for n, p in params.items()}


# ------------------------------------------------------------------------------------ saving


def group():
    """The process group of the current scenario call (None, the default group, outside one)."""
    here = world.bound()
    return None if here is None else here.group


@contextlib.contextmanager
def _dcp_options(dcp_collectives: bool):
    """DCP's ``no_dist`` for :func:`save` and :func:`load`, with the warning DCP gives each time
    it is used (the choice is deliberate here) kept out of the run's report."""
    if dcp_collectives:
        yield {"no_dist": False}
        return
    size = torch.distributed.get_world_size(group()) if torch.distributed.is_initialized() else 1
    if size != 1:
        raise ValueError(f"DCP without collectives is for a World of one; this one has {size} ranks")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield {"no_dist": True}


def save(impl, optimizer, path=None, *, params: dict | None = None, planner: bool = True, writer=None,
         dcp_collectives: bool = True) -> None:
    """``dcp.save`` of the optimizer through ``impl.dcp_state`` (and the model when ``params`` is
    given) to ``path`` or ``writer``, with ``impl.save_planner()`` when ``planner`` (DCP's
    default otherwise), on the current World's group. Without ``dcp_collectives`` (a World of one
    only), DCP plans in this process without exchanging its plans over the group (its
    ``no_dist``); the adapter's own collectives still run on the group."""
    import torch.distributed.checkpoint as dcp

    state = {"optimizer": impl.dcp_state(optimizer)}
    if params is not None:
        state = {"model": dict(params), **state}
    target = {"storage_writer": writer} if writer is not None else {"checkpoint_id": str(path)}
    chosen = impl.save_planner() if planner and impl.save_planner is not None else None
    with _dcp_options(dcp_collectives) as options:
        dcp.save(state, planner=chosen, process_group=group(), **options, **target)


def load(impl, optimizer, path=None, *, params: dict | None = None, reader=None, dcp_collectives: bool = True) -> None:
    """``dcp.load`` of ``path`` or ``reader`` into the optimizer through ``impl.dcp_state`` (and
    into the model when ``params`` is given), on the current World's group; ``dcp_collectives``
    as for :func:`save`."""
    import torch.distributed.checkpoint as dcp

    state = {"optimizer": impl.dcp_state(optimizer)}
    if params is not None:
        state = {"model": dict(params), **state}
    source = {"storage_reader": reader} if reader is not None else {"checkpoint_id": str(path)}
    with _dcp_options(dcp_collectives) as options:
        dcp.load(state, process_group=group(), **options, **source)


# ------------------------------------------------------------------ the DCP scenarios' model

#: Saved hyperparameters per group, and deliberately different ones for restore targets, so a
#: restore that forgot the checkpoint's hyperparameters shows.
GROUP_HYPERS = (
    dict(lr=5e-3, betas=(0.8, 0.97), eps=2e-8, weight_decay=0.03),
    dict(lr=4e-3, betas=(0.85, 0.99), eps=1e-8, weight_decay=0.01),
)
TARGET_HYPERS = (
    dict(lr=9.9e-9, betas=(0.1, 0.2), eps=7e-7, weight_decay=0.5),
    dict(lr=8.8e-9, betas=(0.3, 0.4), eps=6e-7, weight_decay=0.25),
)
SAVED_HYPERS = [
    {"lr": g["lr"], "beta1": g["betas"][0], "beta2": g["betas"][1], "eps": g["eps"], "weight_decay": g["weight_decay"]}
    for g in GROUP_HYPERS
]
#: Training steps 1..DCP_STEPS make a DCP scenario's saved state.
DCP_STEPS = 3
FRESH = "head.weight"

#: The DCP scenarios' model: ``enc.weight`` (8, 24) with per-column gradient scales (structure
#: for the period search), ``enc.bias`` (24,), ``dec.weight`` (7, 12), which splits unevenly on
#: 2, 3 and 4 ranks (4/3, 3/3/1, 2/2/2/1) without ever leaving a shard empty, and ``head.weight``
#: (16, 8), which never gets a gradient (a fresh slot).
BASE = Model(
    shapes={"enc.weight": (8, 24), "enc.bias": (24,), "dec.weight": (7, 12), "head.weight": (16, 8)},
    groups=(("enc.weight", "enc.bias"), ("dec.weight", "head.weight")),
    init=per_name,
    salt="init",
    seed=crc32_seed("{name}:grad{step}"),
    hypers=GROUP_HYPERS,
    structured=frozenset({"enc.weight"}),
    column_period=4,
    frozen=frozenset({FRESH}),
)
#: ``BASE`` plus ``tiny.weight`` (2, 8), whose shard is empty on ranks 2-3 of 4.
EMPTY = replace(BASE, shapes=dict(BASE.shapes, **{"tiny.weight": (2, 8)}),
                groups=(BASE.groups[0], BASE.groups[1] + ("tiny.weight",)))
DCP_MODELS = {"base": BASE, "empty": EMPTY}


def trained(impl, model: Model, mesh, *, steps: Iterable[int] = range(1, DCP_STEPS + 1), **options):
    """``(params, optimizer)``: ``model`` sharded on ``mesh``, the implementation's optimizer over
    it (the model's hyperparameters, ``factored_v_2d=False`` unless given), trained ``steps``."""
    params = parameters(model, mesh=mesh)
    optimizer = impl.make_optimizer(param_groups(model, params), **dict({"factored_v_2d": False}, **options))
    train(model, optimizer, params, steps)
    return params, optimizer


# ------------------------------------------------------------- the optimizer comparisons' model

#: The optimizer comparisons' model (SPEC 5.6): shapes chosen so that searched, fallback and
#: period-1 blocks all occur; ``faint`` gets gradients at the scale of its group's ``eps``
#: (1e-6, representable in fp16), so that ``eps`` changes the stepsize; ``late`` gets its first
#: gradient at step 3.
OPTIMIZER = Model(
    shapes={"weight": (48, 40), "vector": (256,), "conv": (8, 3, 3, 3), "prime": (37,), "faint": (64,),
            "big_prime": (2053,), "narrow": (24, 3), "late": (7, 11), "scalar": (1,)},
    groups=(("weight", "vector", "conv", "prime"), ("faint", "big_prime", "narrow", "late", "scalar")),
    init=one_stream,
    seed=crc32_seed("{name}:{step}"),
    structured=frozenset({"weight", "vector", "conv"}),
    zero_rows={"weight": 2},
    scales={"faint": 1e-6},
    first_step={"late": 3},
)
#: Starting scale of each parameter in a pinned step: half at 1e-3 of unit scale, so that 16-bit
#: parameters show the update above their rounding, half at unit scale, so that weight decay
#: shows in fp32.
PINNED_START_SCALE = {"weight": 1e-3, "vector": 1.0, "conv": 1e-3, "prime": 1.0, "faint": 1e-3,
                      "big_prime": 1e-3, "narrow": 1.0, "late": 1e-3, "scalar": 1.0}
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


def trajectory(make_optimizer, dtype, steps: int, *, tensor_lr=False, weight_decay=0.0, states_after=(),
               **options) -> Trained:
    """Free-running training of :data:`OPTIMIZER` (SPEC 5.6.10): the optimizer ``make_optimizer``
    builds (:data:`REFERENCE` for the reference's side) over the common start, ``steps`` steps
    (indices 0..steps-1), every parameter recorded after every step, and a deep copy of the
    native state dict after each step count in ``states_after`` (``Trained.states``)."""
    return trajectory_from(make_optimizer, initial(OPTIMIZER, dtype=dtype), trajectory_gradients(dtype, steps),
                           optimizer_hypers(tensor_lr=tensor_lr, weight_decay=weight_decay), states_after=states_after,
                           **options)


def trajectory_gradients(dtype: torch.dtype, steps: int, model: Model = OPTIMIZER) -> list:
    """``[{name: gradient or None}]`` of ``model`` for steps 0..steps-1, in ``dtype`` (on CPU)."""
    return [{n: gradient(model, n, step, dtype=dtype) for n in model.shapes} for step in range(steps)]


def trajectory_from(make_optimizer, start: dict, grads: list, hypers, *, model: Model = OPTIMIZER, states_after=(),
                    **options) -> Trained:
    """:func:`trajectory` from explicit inputs (a reproducer's, SPEC 4.5.6): parameters ``start``
    (``{name: value}``, copied to the side's device), one ``{name: gradient or None}`` per step,
    the groups of ``model`` with ``hypers`` (copied: the two sides never share a tensor)."""
    device = device_for(make_optimizer)
    params = {n: torch.nn.Parameter(t.clone().to(device)) for n, t in start.items()}
    opt = make_optimizer(param_groups(model, params, copy.deepcopy(hypers)), **options)
    history = {n: [to_cpu(p)] for n, p in params.items()}
    states = {}
    for step, step_grads in enumerate(grads):
        for n, p in params.items():
            g = step_grads.get(n)
            p.grad = None if g is None else g.clone().to(device)
        opt.step()
        for n, p in params.items():
            history[n].append(to_cpu(p))
        if step + 1 in states_after:
            states[step + 1] = copy.deepcopy(opt.state_dict())
    return Trained(params, opt, history, states)


def first_step_pieces(state_dict: dict, dtype: torch.dtype, first_grads: dict | None = None) -> list:
    """``(gradient, period)`` of every parameter that had a gradient at step 1 (codebook learning);
    ``first_grads`` (``{name: gradient}``) the gradients of that step, by default :data:`OPTIMIZER`'s."""
    names = {pid: name for g in state_dict["param_groups"] for pid, name in zip(g["params"], g["param_names"])}
    pieces = []
    for pid, entry in state_dict["state"].items():
        grad = gradient(OPTIMIZER, names[pid], 0, dtype=dtype) if first_grads is None else first_grads.get(names[pid])
        if grad is not None and "automatic_period" in entry:
            pieces.append((grad, entry["automatic_period"]))
    return pieces


def pinned_state(dtype: torch.dtype, pin_at: int, *, tensor_lr=False, weight_decay=0.0, **options) -> dict:
    """The reference's native state dict after ``pin_at`` steps (a deep copy). ``pin_at == 0``: the
    codebook the reference learned at its first step, every parameter's state fresh."""
    steps = max(pin_at, 1)
    ran = trajectory(REFERENCE, dtype, steps, tensor_lr=tensor_lr, weight_decay=weight_decay, states_after=(steps,),
                     **options)
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


def pinned_step(make_optimizer, dtype, pin_at: int, state_dict: dict, *, tensor_lr=False, weight_decay=0.0,
                **options) -> PinnedStep:
    """Load ``state_dict`` into an optimizer built by ``make_optimizer`` over :func:`pinned_start`
    parameters, set gradient ``pin_at`` and take one step."""
    grads = {n: gradient(OPTIMIZER, n, pin_at, dtype=dtype) for n in OPTIMIZER.shapes}
    return pinned_step_from(make_optimizer, state_dict, pinned_start(dtype), grads,
                            optimizer_hypers(tensor_lr=tensor_lr, weight_decay=weight_decay), **options)


def pinned_step_from(make_optimizer, state_dict: dict, start: dict, grads: dict, hypers, *,
                     model: Model = OPTIMIZER, **options) -> PinnedStep:
    """:func:`pinned_step` from explicit inputs (a reproducer's, SPEC 4.5.6): the optimizer over
    parameters ``start`` in the groups of ``model`` with ``hypers`` (copied: the two sides never
    share a tensor), ``state_dict`` loaded, gradients ``grads`` (``{name: gradient or None}``), one step."""
    device = device_for(make_optimizer)
    params = {n: torch.nn.Parameter(t.clone().to(device)) for n, t in start.items()}
    opt = make_optimizer(param_groups(model, params, copy.deepcopy(hypers)), **options)
    opt.load_state_dict(copy.deepcopy(state_dict))
    for n, p in params.items():
        p.grad = None if grads.get(n) is None else grads[n].clone().to(device)
    opt.step()
    return PinnedStep(start, {n: to_cpu(p) for n, p in params.items()}, {n: grads.get(n) for n in params},
                      state_to_cpu(copy.deepcopy(opt.state_dict())))


def _group_hypers(group: dict) -> dict:
    """A state dict's param group's hyperparameters as floats (a tensor lr included)."""
    lr = group["lr"]
    return dict(lr=float(lr.item()) if torch.is_tensor(lr) else float(lr), beta1=float(group["beta1"]),
                beta2=float(group["beta2"]), eps=float(group["eps"]), weight_decay=float(group["weight_decay"]))


def param_steps(pinned_sd: dict, result: PinnedStep, *, factored: bool) -> list:
    """The oracle's view (:class:`oracles.pinned_step.ParamStep`) of every parameter that stepped."""
    from gefen_oracles.pinned_step import ParamStep

    out = []
    for g in pinned_sd["param_groups"]:
        hyper = _group_hypers(g)
        for pid, name in zip(g["params"], g["param_names"]):
            if result.grads[name] is None:
                continue
            out.append(ParamStep(
                name=name, p0=result.start[name], p1=result.after[name], grad=result.grads[name],
                before=pinned_sd["state"].get(pid, {}), after=result.state_dict["state"].get(pid, {}),
                factored=factored and result.start[name].ndim == 2, **hyper))
    return out


# ------------------------------------------------- state across time and loads (SPEC 4.3.11)

#: Long trajectories (SPEC 4.3.11): three small parameters, a searched period (``w``, structured),
#: a fallback period (``v``) and period 1 (``s``, fewer than 8 elements), in two groups with the
#: hyperparameters of :func:`optimizer_hypers`; ``w`` is 2-D, so a factored optimizer routes it to
#: SPEC 1.9. They start at 1e-2 of unit scale, so that bf16 parameters show their updates.
def _scaled(init, scale: float, model: Model, salt) -> dict:
    return {n: v * scale for n, v in init(model, salt).items()}


def scaled(init: Callable, scale: float) -> Callable:
    """Initial values of ``init`` times ``scale`` (a 16-bit parameter near 0 shows its update above
    its own rounding, SPEC 5.6.1)."""
    return functools.partial(_scaled, init, scale)


LONG = Model(
    shapes={"w": (16, 48), "v": (96,), "s": (5,)},
    groups=(("w", "v"), ("s",)),
    init=scaled(one_stream, 1e-2),
    salt=11,
    seed=crc32_seed("{name}:long{step}"),
    structured=frozenset({"w"}),
)
#: Steps of a long trajectory: past 256 (where an 8-bit or bf16 counter stops counting) and long
#: enough for the bias corrections to move well away from their first values.
LONG_STEPS = 300


def other_stream(model: Model) -> Model:
    """The same model driven by another gradient stream (other seeds): what an optimizer steps on
    before it loads a checkpoint of ``model``'s training, so that its codebook, periods' inputs and
    counters differ from the checkpoint's (SPEC 4.3.11)."""
    return replace(model, seed=functools.partial(_other_seed, model.seed))


def _other_seed(seed, name: str, index: int, step: int) -> int:
    return _crc32(f"other:{seed(name, index, step)}")


@dataclass
class Run:
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
    return state_to_cpu(copy.deepcopy(optimizer.state_dict()))


def _stepped(optimizer, params: dict, steps: list, give_gradients: Callable[[int], None], record_states: bool) -> Run:
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
    return Run(params, optimizer, history, grads, states, steps)


def run_steps(model: Model, optimizer, params: dict, steps: Iterable[int], *, record_states: bool) -> Run:
    """Set the gradients and step for each index in ``steps``, recording every parameter (and the
    native state, when ``record_states``) before the first step and after each."""
    steps = list(steps)
    return _stepped(optimizer, params, steps, lambda i: set_gradients(model, params, steps[i]), record_states)


def run_steps_from(optimizer, params: dict, grads: list, steps: Iterable[int], *, record_states: bool) -> Run:
    """:func:`run_steps` from explicit gradients (a reproducer's, SPEC 4.5.6): one ``{name: gradient
    or None}`` per step (copied to each parameter's device); ``steps`` the step indices they belong to."""
    steps = list(steps)
    if len(steps) != len(grads):
        raise ValueError(f"{len(grads)} steps of gradients for {len(steps)} step indices")

    def give(i: int) -> None:
        for n, p in params.items():
            g = grads[i].get(n)
            p.grad = None if g is None else g.clone().to(p.device)

    return _stepped(optimizer, params, steps, give, record_states)


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


def param_runs(run: Run, *, factored_v_2d: bool) -> list:
    """The oracle's view (:class:`oracles.shadowing.ParamRun`) of every parameter of a recorded
    run with native states: the steps in which it had a gradient, with its group's hyperparameters
    and routing (SPEC 1.9.1) as the state dict after the last step records them."""
    from gefen_oracles.shadowing import ParamRun

    last = run.states[-1]
    out = []
    for g in last["param_groups"]:
        hyper = _group_hypers(g)
        for pid, name in zip(g["params"], g["param_names"]):
            taken = [t for t, grad in enumerate(run.grads[name]) if grad is not None]
            out.append(ParamRun(
                name=name, p0=[run.history[name][t] for t in taken], p1=[run.history[name][t + 1] for t in taken],
                grads=[run.grads[name][t] for t in taken],
                before=[run.states[t]["state"].get(pid, {}) for t in taken],
                after=[run.states[t + 1]["state"].get(pid, {}) for t in taken],
                factored=bool(factored_v_2d) and run.history[name][0].ndim == 2,
                steps=[run.steps[t] for t in taken], **hyper))
    return out


#: DCP restores of a slot above 64Ki elements (SPEC 4.3.11): ``big.weight`` (264, 256) holds 67584
#: elements (a local shard above 64Ki on one rank; 132 rows on two, 88 on three), beside
#: :data:`BASE`'s small parameters, in :data:`BASE`'s groups and hyperparameters; ``head.weight``
#: never gets a gradient (a fresh slot).
WIDE = replace(
    BASE,
    shapes={"big.weight": (264, 256), "enc.weight": (8, 24), "enc.bias": (24,), "head.weight": (16, 8)},
    groups=(("big.weight", "enc.bias"), ("enc.weight", "head.weight")),
    structured=frozenset({"big.weight"}),
)

__all__ += ["LONG", "LONG_STEPS", "Run", "WIDE", "built", "built_from", "native_state", "other_stream", "param_runs",
            "run_steps", "run_steps_from", "scaled"]

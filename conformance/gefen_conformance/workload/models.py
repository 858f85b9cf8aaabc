"""The suite's named models and their deterministic inputs (SPEC 4.2.4, 4.3).

A :class:`Model` names its parameters (shape, group, default hyperparameters per group) and the
deterministic rules that give their initial values and their gradient at each step. Every
function below takes a Model and does the one thing its name says, on plain tensors or, given a
mesh, on ``Shard(0)`` DTensors: :func:`initial` (full initial values), :func:`parameters`
(``nn.Parameter`` s), :func:`gradient` and :func:`set_gradients` (sharded like its parameter),
:func:`param_groups` (the optimizer's groups of ``(name, parameter)`` pairs), :func:`train` (set
gradients, step, for each step index). The named models: :data:`BASE` and :data:`EMPTY` (the DCP
scenarios), :data:`OPTIMIZER` (the optimizer comparisons), :data:`LONG` and :data:`WIDE` (state
across time and loads).

Where tensors live is decided in one place, :func:`device_for`: the implementation's parameters
and gradients on the current World's device (the run's ``--gefen-device`` outside a scenario call),
the reference's side of an optimizer comparison (:data:`REFERENCE`) on CPU; comparisons take CPU
copies (:func:`to_cpu`, :func:`state_to_cpu`).

The numbers are part of the contract: the goldens, the mutant catalogue and the project's tests
depend on every seed below. A model's rules are module-level functions (or partials of them),
so a model pickles by reference.
"""

from __future__ import annotations

import copy
import functools
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gefen_conformance.harness import devices, world

__all__ = [
    "BASE",
    "DCP_MODELS",
    "DCP_STEPS",
    "EMPTY",
    "FRESH",
    "GROUP_HYPERS",
    "LONG",
    "LONG_STEPS",
    "MANY",
    "OPTIMIZER",
    "REFERENCE",
    "SAVED_HYPERS",
    "SCALE",
    "TARGET_HYPERS",
    "WIDE",
    "Model",
    "crc32_seed",
    "device_for",
    "full_params",
    "gradient",
    "group_hypers",
    "initial",
    "linspace",
    "one_stream",
    "other_stream",
    "param_groups",
    "parameters",
    "per_name",
    "scaled",
    "set_gradients",
    "state_to_cpu",
    "to_cpu",
    "train",
    "zeros",
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
    rounded to a multiple of ``quantum`` when one is given (few distinct values); ``frozen`` parameters never
    get one (a fresh slot), nor does a parameter before its
    ``first_step``.
    """

    shapes: Mapping[str, tuple]
    groups: tuple
    init: Callable[[Model, Any], dict]
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
            raise ValueError(
                f"a model's groups must list each parameter once: {self.groups} vs {list(self.shapes)}"
            )

    def without(self, *names: str) -> Model:
        """The same model without ``names`` (every other number unchanged)."""
        return replace(
            self,
            shapes={n: s for n, s in self.shapes.items() if n not in names},
            groups=tuple(tuple(n for n in g if n not in names) for g in self.groups),
        )


def one_stream(model: Model, salt: int) -> dict:
    """Initial values drawn in order from one generator seeded with ``salt``."""
    g = torch.Generator().manual_seed(salt)
    return {n: torch.randn(s, generator=g) for n, s in model.shapes.items()}


def per_name(model: Model, salt) -> dict:
    """Initial values from one generator per parameter, seeded by ``crc32("name:salt")``."""
    return {
        n: torch.randn(s, generator=torch.Generator().manual_seed(_crc32(f"{n}:{salt}")))
        for n, s in model.shapes.items()
    }


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
    """The oracle's optimizer (``gefen_reference.Gefen``), as the reference side of a comparison."""

    def __call__(self, groups, **options):
        import gefen_reference as reference

        return reference.Gefen(groups, **options)

    def __repr__(self) -> str:
        return "workload.models.REFERENCE"


#: Pass as ``make_optimizer`` for the reference's side of a comparison: it stays on CPU.
REFERENCE = _Reference()


def device_for(make_optimizer=None) -> torch.device:
    """Where the tensors of the side that ``make_optimizer`` builds live: the reference's
    (:data:`REFERENCE`) on CPU, an implementation's on the current World's device, or outside a
    scenario call on the run's device (``--gefen-device``, :func:`gefen_conformance.harness.devices.selected`;
    CPU
    unless a suite run chose another). The one place that decides it (SPEC 4.6.2)."""
    if make_optimizer is REFERENCE:
        return torch.device("cpu")
    here = world.bound()
    return devices.selected() if here is None else here.device


def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy, for comparisons (never a view of live state)."""
    return tensor.detach().to("cpu", copy=True)


_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def group_hypers(group: dict) -> dict:
    """A param group's hyperparameters as floats (a tensor lr or beta by its value), as the pinned
    step's oracle takes them (:class:`gefen_oracles.pinned_step.ParamStep`)."""
    lr = group["lr"]
    return dict(
        lr=float(lr.item()) if torch.is_tensor(lr) else float(lr),
        beta1=float(group["beta1"]),
        beta2=float(group["beta2"]),
        eps=float(group["eps"]),
        weight_decay=float(group["weight_decay"]),
    )


def state_to_cpu(value):
    """A deep copy of ``value`` (a state dict, or any nest of dicts, lists and tuples) with every
    tensor replaced by a detached CPU copy (:func:`to_cpu`), every container rebuilt and any other
    mutable leaf deep-copied. For comparing an implementation's state on another device with the
    reference's, and for snapshots of live state: about twenty times cheaper than
    ``copy.deepcopy`` per tensor, which matters for states of hundreds of parameters."""
    if torch.is_tensor(value):
        return to_cpu(value)
    if isinstance(value, dict):
        return {k: state_to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [state_to_cpu(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(state_to_cpu(v) for v in value)
    return value if isinstance(value, _ATOMS) else copy.deepcopy(value)


# ----------------------------------------------------------------------- values and gradients


def initial(model: Model, *, dtype: torch.dtype = torch.float32, salt=None) -> dict:
    """``{name: full initial value}`` in ``dtype`` (on CPU)."""
    values = model.init(model, model.salt if salt is None else salt)
    return {n: v.to(dtype) for n, v in values.items()}


def parameters(
    model: Model,
    *,
    dtype: torch.dtype = torch.float32,
    salt=None,
    mesh=None,
    device: torch.device | None = None,
) -> dict:
    """``{name: nn.Parameter}``: plain, or ``Shard(0)`` DTensors on ``mesh``; on ``device``
    (default: the implementation's, :func:`device_for`)."""
    device = device_for() if device is None else device
    if mesh is not None:
        # torch.distributed.tensor takes seconds to import: only sharded parameters pay for it
        from gefen_conformance.harness.sharding import sharded_parameter
    out = {}
    for name, value in initial(model, dtype=dtype, salt=salt).items():
        value = value.to(device)
        out[name] = torch.nn.Parameter(value) if mesh is None else sharded_parameter(value, mesh)
    return out


def gradient(
    model: Model, name: str, step: int, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor | None:
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
    """Every parameter's ``.grad`` for ``step``: in its dtype, on its device, sharded like it
    (each rank cuts its own rows: no collective)."""
    from torch.distributed.tensor import DTensor

    from gefen_conformance.harness.sharding import shard

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
    return [
        dict(h, params=[(n, params[n]) for n in names if n in params])
        for names, h in zip(model.groups, hypers)
    ]


def train(model: Model, optimizer, params: dict, steps: Iterable[int]) -> None:
    """For each step index in ``steps``: set the gradients, then ``optimizer.step()``."""
    for step in steps:
        set_gradients(model, params, step)
        optimizer.step()


def full_params(params: dict) -> dict:
    """Every parameter's global value as a CPU tensor (a collective for DTensors)."""
    from torch.distributed.tensor import DTensor

    return {n: to_cpu(p.full_tensor() if isinstance(p, DTensor) else p) for n, p in params.items()}


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
    {
        "lr": g["lr"],
        "beta1": g["betas"][0],
        "beta2": g["betas"][1],
        "eps": g["eps"],
        "weight_decay": g["weight_decay"],
    }
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
EMPTY = replace(
    BASE,
    shapes=dict(BASE.shapes, **{"tiny.weight": (2, 8)}),
    groups=(BASE.groups[0], BASE.groups[1] + ("tiny.weight",)),
)


def _splits_without_empty_shards(rows: int) -> bool:
    """Whether ``Shard(0)`` of ``rows`` rows gives every one of 2, 3 and 4 ranks a row (torch.chunk
    makes fewer chunks than ranks for some sizes: 9 rows on 4 ranks is 3, 3, 3 and nothing)."""
    return all(len(range(0, rows, -(-rows // w))) == w for w in (2, 3, 4))


def _many_shapes() -> dict:
    """14 slots (two of each of the seven gradient scales) whose first dimension (4 to 44) splits
    unevenly on 2, 3 and 4 ranks, never empty."""
    out = {}
    for k in range(14):
        rows = 4 + (7 * k) % 37
        while not _splits_without_empty_shards(rows):
            rows += 1
        out[f"layer{k}.weight" if k % 3 else f"layer{k}.bias"] = (rows, 4 + (k % 5) * 4) if k % 3 else (rows,)
    return out


_MANY = _many_shapes()
#: Many slots, each with its own gradient distribution: gradients scaled from 1e-4 to 1e2 (a
#: decade per slot, cycling), some with column structure, two groups. A restore must re-block and
#: re-quantize every slot by its own statistics (SPEC 3.6).
MANY = Model(
    shapes=_MANY,
    groups=(
        tuple(n for k, n in enumerate(_MANY) if k % 2 == 0),
        tuple(n for k, n in enumerate(_MANY) if k % 2),
    ),
    init=per_name,
    salt="init",
    seed=crc32_seed("{name}:many{step}"),
    hypers=GROUP_HYPERS,
    structured=frozenset(n for k, n in enumerate(_MANY) if k % 4 == 1),
    column_period=4,
    scales={n: 10.0 ** ((k % 7) - 4) for k, n in enumerate(_MANY)},
)
#: The scenarios at scale (tens of ranks), kept small because every rank of such a world is a
#: thread of one process: ``enc.weight`` (8, 24) and ``dec.weight`` (7, 12) of ``BASE``, which
#: have fewer rows than such a world has ranks (most ranks hold empty shards), and ``wide.weight``
#: (211, 6), whose rows divide by none of the worlds (7, 48, 64, 100, 256: 211 is prime; 5 rows a
#: shard on 48 ranks, 4 on 64, the last shards short or empty). With 2-3 rows a shard (101 rows on
#: 48 or 64 ranks) the reference's continuation after a reshard reaches 4.5e-3 of the 5e-3 bound
#: (SPEC 3.7.3), too close to judge other kernels by; with 211 rows it measures 1.4e-3 to 2.6e-3.
SCALE = replace(
    BASE,
    shapes={"enc.weight": (8, 24), "dec.weight": (7, 12), "wide.weight": (211, 6)},
    groups=(("enc.weight",), ("dec.weight", "wide.weight")),
    frozen=frozenset(),
)
DCP_MODELS = {"base": BASE, "empty": EMPTY, "many": MANY, "scale": SCALE}


# ------------------------------------------------------------- the optimizer comparisons' model

#: The optimizer comparisons' model (SPEC 5.6): shapes chosen so that searched, fallback and
#: period-1 blocks all occur; ``faint`` gets gradients at the scale of its group's ``eps``
#: (1e-6, representable in fp16), so that ``eps`` changes the stepsize; ``late`` gets its first
#: gradient at step 3.
OPTIMIZER = Model(
    shapes={
        "weight": (48, 40),
        "vector": (256,),
        "conv": (8, 3, 3, 3),
        "prime": (37,),
        "faint": (64,),
        "big_prime": (2053,),
        "narrow": (24, 3),
        "late": (7, 11),
        "scalar": (1,),
    },
    groups=(("weight", "vector", "conv", "prime"), ("faint", "big_prime", "narrow", "late", "scalar")),
    init=one_stream,
    seed=crc32_seed("{name}:{step}"),
    structured=frozenset({"weight", "vector", "conv"}),
    zero_rows={"weight": 2},
    scales={"faint": 1e-6},
    first_step={"late": 3},
)


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

"""The optimizer's input space (SPEC 4.3.10): cases, and how one side is driven through a case.

An :class:`InputCase` names everything an optimizer's step may see: each parameter's shape,
dtype, memory layout, group, gradient pattern and whether it is frozen (:class:`ParamCase`); each
group's hyperparameters (:class:`GroupCase`); the optimizer's routing options; the state the
first step starts from (a synthesized native state at a step counter, or a fresh state with only
the codebook); how many ``step()`` calls follow, how the hyperparameters change between them
(schedules) and by which protocol each call is made (plain, a closure that zeroes and recomputes
the gradients, the GradScaler attributes ``grad_scale`` and ``found_inf``).

:func:`starting_state` builds the native state dict both sides load (from the reference's own
``state_dict()`` of the case's groups, so names and hyperparameters are the reference's);
:func:`run` drives one side (an implementation's ``make_optimizer``, or
:data:`gefen_conformance.workload.models.REFERENCE`) through the case and records, per call, the
parameters before and after, the gradients the step had to use (unscaled, CPU), the native state
dict after, and the hyperparameters the groups held. The suite (``test_input_space.py``) judges
the records with the oracles: bitwise against the reference's run, or each call as a pinned step
from the implementation's own state (SPEC 5.6.1), so nothing accumulates however long the
counter.

Every value is a deterministic function of the case (its ``seed``), so both sides see the same
inputs; an implementation's tensors live on its device (:func:`gefen_conformance.workload.models.device_for`),
the records are CPU copies. Nothing here imports hypothesis: the strategies over this space are
the suite's.
"""

from __future__ import annotations

import copy
import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from gefen_conformance.workload.models import REFERENCE, device_for, state_to_cpu, to_cpu

__all__ = [
    "CODEBOOK", "DTYPES", "GRADIENTS", "LAYOUTS", "OPTIONS", "PROTOCOLS", "SCHEDULES", "Call", "GroupCase",
    "InputCase", "ParamCase", "Run", "codebook", "divisors", "factored", "grad_scale", "gradient", "initial",
    "layouts_for", "run",
    "starting_state",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
#: Memory layouts (SPEC 4.3.10): a standalone contiguous tensor; the transpose of a contiguous
#: tensor (2-D); channels_last (4-D); a view into one flat buffer shared by every such parameter of
#: its dtype, at a storage offset, whose gradient is a view into a flat gradient buffer the same
#: way (how FSDP1 and Megatron lay out parameters and gradients); a contiguous parameter whose
#: gradient is not contiguous (every stride doubled).
LAYOUTS = ("contiguous", "transposed", "channels-last", "flat-view", "strided-grad")
#: Gradient patterns: standard normal values with column structure (so the period search finds
#: structure); all zero; zero on half of the elements, the other half at the next call (blocks
#: whose gradient goes to zero after being nonzero); tiny (eps dominates the stepsize) and huge
#: scales; none at all (the parameter never gets a gradient); none at the first call only.
GRADIENTS = ("normal", "zero", "zero-half", "tiny", "huge", "none", "late")
#: How each call is made: ``opt.step()``; ``opt.step(closure)`` whose closure calls
#: ``zero_grad(set_to_none=True)`` and then sets the gradients (stale gradients are present
#: before the call); the GradScaler attributes with every call (``grad_scale`` set, gradients
#: scaled by it, ``found_inf`` 0); the same with ``found_inf`` 1 at the second-to-last call.
PROTOCOLS = ("plain", "closure", "grad-scale", "found-inf")
#: What changes before every call after the first: nothing; each group's lr (a float replaced by a
#: float, a tensor by a new tensor); a tensor lr scaled in place (a float lr replaced); every
#: hyperparameter (lr, betas, eps and weight decay replaced).
SCHEDULES = ("constant", "lr", "lr-in-place", "all")
#: Routing options (SPEC 1.5.2, 1.1.5) a case may set, besides ``factored_v_2d``.
OPTIONS = ("force_1d_period_one", "force_2d_period_one", "period_one_substrings")
#: ``period_one_substrings`` of a case that sets it: the name of its parameter 1.
PERIOD_ONE_SUBSTRING = "p1."

#: Gradient scales of the tiny and huge patterns. Tiny: where ``eps`` (1e-8 to 1e-3) dominates or
#: matters, at fp16's subnormal end. Huge: ``1e6`` (fp16: ``1e2``, below its overflow with the
#: column structure). Larger second moments are outside the domain the factored step computes
#: (SPEC 1.9.3 step 5 forms ``v_row * v_col`` in fp32 before dividing by their mean: it overflows
#: beyond about 1.8e19 per factor, in the reference too; SPEC 4.3.10).
_SCALES = {"tiny": {}, "huge": {torch.float16: 1e2}}
_DEFAULT_SCALES = {"tiny": 1e-6, "huge": 1e6}
#: The largest power of two the GradScaler protocols scale gradients by (less when a gradient
#: would overflow its dtype).
GRAD_SCALE = 2.0 ** 10


@dataclass(frozen=True)
class ParamCase:
    """One parameter. ``period``: the period of its synthesized state (a divisor of its numel),
    or None for a fresh state (the implementation chooses the period at its first step, SPEC
    1.5). ``frozen``: registered with ``requires_grad=False`` (it steps whenever it has a
    gradient, SPEC 1.2.6)."""

    shape: tuple
    dtype: str = "fp32"
    group: int = 0
    layout: str = "contiguous"
    gradient: str = "normal"
    frozen: bool = False
    period: Optional[int] = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class GroupCase:
    """One group's hyperparameters (SPEC 1.2.3); ``tensor_lr``: lr as a one-element tensor (SPEC 1.4)."""

    lr: float = 1e-3
    tensor_lr: bool = False
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass(frozen=True)
class InputCase:
    """One point of the input space. ``counter``: the step counter of every synthesized state (0:
    no state at all, only the codebook); ``moment_counter``: the second moment's own counter when
    it differs (a second moment re-warmed after a mode switch, SPEC 1.9.5); ``calls``: how many
    ``step()`` calls are made."""

    params: tuple
    groups: tuple = (GroupCase(),)
    factored: bool = False
    options: tuple = ()
    counter: int = 0
    moment_counter: Optional[int] = None
    calls: int = 1
    schedule: str = "constant"
    protocol: str = "plain"
    seed: int = 0

    def __post_init__(self):
        used = {p.group for p in self.params}
        if used != set(range(len(self.groups))):
            raise ValueError(f"every group needs a parameter: groups {len(self.groups)}, used {sorted(used)}")
        for p in self.params:
            if p.layout not in layouts_for(p.shape):
                raise ValueError(f"layout {p.layout} does not apply to shape {p.shape}")
            if p.period is not None and (self.counter < 1 or p.numel == 0 or p.numel % p.period):
                raise ValueError(f"period {p.period} for shape {p.shape} at counter {self.counter}")
        if self.protocol == "found-inf" and self.calls < 2:
            raise ValueError("found-inf needs a call after the skipped one")

    def order(self) -> list:
        """Parameter indices in registration order: group by group, in case order within a group."""
        return [i for g in range(len(self.groups)) for i, p in enumerate(self.params) if p.group == g]

    def name(self, i: int) -> str:
        return f"p{i}.weight" if len(self.params[i].shape) >= 2 else f"p{i}.bias"

    def without_factored(self) -> "InputCase":
        return replace(self, factored=False)


def layouts_for(shape: tuple) -> tuple:
    """The layouts that apply to a shape: transposed needs 2-D, channels_last 4-D, a strided
    gradient at least one dimension."""
    out = ["contiguous", "flat-view"]
    if len(shape) == 2:
        out.append("transposed")
    if len(shape) == 4:
        out.append("channels-last")
    if len(shape) >= 1:
        out.append("strided-grad")
    return tuple(out)


def divisors(n: int) -> list:
    """Every divisor of ``n`` (a valid period of a parameter with ``n`` elements)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def factored(case: InputCase, i: int) -> bool:
    """Whether parameter ``i`` takes the factored step (SPEC 1.9.1)."""
    return case.factored and len(case.params[i].shape) == 2


def _generator(case: InputCase, *parts) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(":".join(map(str, (case.seed,) + parts)).encode()))


def codebook() -> torch.Tensor:
    """The codebook every case loads: ``x|x|`` over 256 evenly spaced ``x`` in ``[-1, 1]`` (dense
    near 0, like a learned one), fp32, ``-1`` and ``+1`` at the ends (SPEC 1.6.2)."""
    x = torch.linspace(-1.0, 1.0, 256, dtype=torch.float64)
    return (x * x.abs()).float()


CODEBOOK = codebook()


# ------------------------------------------------------------------------------------ values


def _scale(p: ParamCase) -> float:
    if p.gradient in _DEFAULT_SCALES:
        return _SCALES[p.gradient].get(p.torch_dtype, _DEFAULT_SCALES[p.gradient])
    return 1.0


def gradient(case: InputCase, i: int, call: int, *, stale: bool = False) -> Optional[torch.Tensor]:
    """Parameter ``i`` 's gradient at ``call`` (1-based; CPU, its dtype), or None. ``stale``: the
    different gradient a closure protocol leaves in place before the call."""
    p = case.params[i]
    if p.gradient == "none" or (p.gradient == "late" and call == 1 and not stale):
        return None
    g = torch.randn(p.shape, generator=_generator(case, "grad", i, call, stale), dtype=torch.float64)
    if len(p.shape) >= 1 and p.shape[-1] > 0:
        g = g * (1.0 + torch.arange(p.shape[-1], dtype=torch.float64) % 5)
    g = g * _scale(p)
    if p.gradient == "zero":
        g = torch.zeros_like(g)
    elif p.gradient == "zero-half":
        flat = g.reshape(-1)
        half = (flat.numel() + 1) // 2
        if call % 2:
            flat[:half] = 0.0
        else:
            flat[half:] = 0.0
    return g.to(p.torch_dtype)


def initial(case: InputCase, i: int) -> torch.Tensor:
    """Parameter ``i`` 's value before the first call (CPU, its dtype): unit scale for fp32 and
    fp64 parameters of even index, ``1e-3`` otherwise (a 16-bit parameter then shows its update
    above its own rounding)."""
    p = case.params[i]
    start = 1.0 if p.torch_dtype in (torch.float32, torch.float64) and i % 2 == 0 else 1e-3
    return (torch.randn(p.shape, generator=_generator(case, "init", i), dtype=torch.float64) * start).to(p.torch_dtype)


def _synthesized_entry(case: InputCase, i: int) -> dict:
    """Parameter ``i`` 's native state entry after ``case.counter`` steps (SPEC 1.11.3): random
    indices, magnitudes and second moments at the scale of its gradients."""
    p = case.params[i]
    gen = _generator(case, "state", i)
    blocks = p.numel // p.period
    scale = _scale(p)
    entry = {
        "name": case.name(i), "automatic_period": p.period, "step": case.counter,
        "m_codebook": torch.randint(0, 256, (blocks, p.period), generator=gen, dtype=torch.uint8),
        "m_magnitude": (torch.rand(blocks, 1, generator=gen, dtype=torch.float64) * 1.3 + 0.2).mul(scale).float(),
    }
    moment = case.counter if case.moment_counter is None else case.moment_counter

    def second(*shape):
        return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 1.5 + 0.5).mul(scale * scale).float()

    if factored(case, i):
        rows, cols = p.shape
        entry.update(v_row=second(rows), v_col=second(cols), factored_step=moment)
    else:
        entry.update(vmean=second(blocks, 1), vmean_step=moment)
    return entry


# --------------------------------------------------------------------------------- building


def _lr(group: GroupCase, device):
    return torch.tensor(group.lr, device=device) if group.tensor_lr else group.lr


def _options(case: InputCase) -> dict:
    options = {"factored_v_2d": case.factored}
    for name in case.options:
        options[name] = (PERIOD_ONE_SUBSTRING,) if name == "period_one_substrings" else True
    return options


@dataclass
class _Built:
    params: dict  # i -> nn.Parameter
    grad_buffers: dict  # dtype -> flat buffer for the flat-view layout's gradients
    offsets: dict  # i -> storage offset in its dtype's flat buffers
    optimizer: Any = None


def _build(case: InputCase, make_optimizer, device) -> _Built:
    flat_sizes: dict = {}
    offsets = {}
    for i, p in enumerate(case.params):
        if p.layout == "flat-view":
            start = flat_sizes.get(p.torch_dtype, 3)  # never at offset 0, with gaps between views
            offsets[i] = start
            flat_sizes[p.torch_dtype] = start + p.numel + 5
    buffers = {dtype: torch.zeros(size, dtype=dtype, device=device) for dtype, size in flat_sizes.items()}
    grad_buffers = {dtype: torch.zeros(size, dtype=dtype, device=device) for dtype, size in flat_sizes.items()}
    params = {}
    for i, p in enumerate(case.params):
        value = initial(case, i).to(device)
        if p.layout == "transposed":
            param = torch.nn.Parameter(value.t().contiguous().t())
        elif p.layout == "channels-last":
            param = torch.nn.Parameter(value.contiguous(memory_format=torch.channels_last))
        elif p.layout == "flat-view":
            view = buffers[p.torch_dtype][offsets[i]:offsets[i] + p.numel].view(p.shape)
            view.copy_(value)
            param = torch.nn.Parameter(view)
        else:
            param = torch.nn.Parameter(value.clone())
        param.requires_grad_(not p.frozen)
        params[i] = param
    built = _Built(params, grad_buffers, offsets)
    groups = []
    for g, group in enumerate(case.groups):
        groups.append({"params": [(case.name(i), params[i]) for i in case.order() if case.params[i].group == g],
                       "lr": _lr(group, device), "betas": group.betas, "eps": group.eps,
                       "weight_decay": group.weight_decay})
    built.optimizer = make_optimizer(groups, **_options(case))
    return built


def _placed(case: InputCase, built: _Built, i: int, value: torch.Tensor, device) -> torch.Tensor:
    """A gradient in parameter ``i`` 's layout: strides like its parameter's, a view into the flat
    gradient buffer, or doubled strides."""
    p, param = case.params[i], built.params[i]
    value = value.to(device)
    if p.layout == "flat-view":
        buffer = built.grad_buffers[p.torch_dtype]
        return buffer[built.offsets[i]:built.offsets[i] + p.numel].view(p.shape).copy_(value)
    if p.layout == "strided-grad":
        wide = torch.zeros(*p.shape, 2, dtype=value.dtype, device=device)
        return wide[..., 0].copy_(value)
    out = torch.empty_strided(param.shape, param.stride(), dtype=value.dtype, device=device)
    return out.copy_(value)


def starting_state(case: InputCase) -> dict:
    """The native state dict both sides load before the first call (SPEC 1.11): the reference's
    ``state_dict()`` of the case's groups with the codebook :data:`CODEBOOK`, global step
    ``case.counter``, and a synthesized entry for every parameter with a period."""
    built = _build(case, REFERENCE, torch.device("cpu"))
    sd = built.optimizer.state_dict()
    ids = {i: pid for pid, i in enumerate(case.order())}
    sd["state"] = {ids[i]: (_synthesized_entry(case, i) if p.period is not None else {"name": case.name(i)})
                   for i, p in enumerate(case.params)}
    sd["gefen_codebook"] = CODEBOOK.clone()
    sd["gefen_global_step"] = case.counter
    for group in sd["param_groups"]:
        group.pop("_gefen_checkpoint_metadata", None)
    return copy.deepcopy(sd)


# ---------------------------------------------------------------------------------- driving


@dataclass
class Call:
    """One ``step()`` call of a run. ``grads[i]``: the (unscaled) gradient parameter ``i`` had to
    step with, or None; ``hypers[g]``: group ``g`` 's values as Python floats (lr by SPEC 1.4.2)
    when the call was made; ``skipped``: ``found_inf`` was set; ``loss``: what ``step`` returned
    (the closure protocol's loss, else None)."""

    before: dict
    after: dict
    grads: dict
    state_dict: dict
    hypers: list
    skipped: bool = False
    loss: Any = None
    expected_loss: Any = None


@dataclass
class Run:
    case: InputCase
    loaded: dict  # the native state dict right after the load (CPU copy)
    calls: list = field(default_factory=list)


def _apply_schedule(case: InputCase, optimizer, device) -> None:
    """SPEC 1.4.2: what a scheduler does between steps (in place for a tensor lr where the case says so)."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if case.schedule == "lr-in-place" and torch.is_tensor(lr):
            lr.mul_(0.5)
        elif torch.is_tensor(lr):
            group["lr"] = torch.tensor(float(lr.item()) * 0.5, device=lr.device)
        else:
            group["lr"] = lr * 0.5
        if case.schedule == "all":
            group["beta1"], group["beta2"] = (0.8, 0.99) if group["beta1"] != 0.8 else (0.9, 0.999)
            group["eps"] = group["eps"] * 10.0
            group["weight_decay"] = 0.1 if group["weight_decay"] == 0.0 else 0.0


def _hypers(optimizer) -> list:
    out = []
    for group in optimizer.param_groups:
        lr = group["lr"]
        out.append(dict(lr=float(lr.item()) if torch.is_tensor(lr) else float(lr), beta1=float(group["beta1"]),
                        beta2=float(group["beta2"]), eps=float(group["eps"]),
                        weight_decay=float(group["weight_decay"])))
    return out


def grad_scale(case: InputCase, call: int) -> float:
    """The GradScaler protocols' scale at ``call``: :data:`GRAD_SCALE`, halved until every scaled
    gradient is finite in its dtype (a power of two, so unscaling is exact)."""
    scale = GRAD_SCALE
    for i in range(len(case.params)):
        g = gradient(case, i, call)
        while g is not None and scale > 1.0 and not bool(torch.isfinite((g.double() * scale).to(g.dtype)).all()):
            scale /= 2.0
    return scale


def _skipped(case: InputCase, call: int) -> bool:
    return case.protocol == "found-inf" and call == case.calls - 1


def run(make_optimizer, case: InputCase, state_dict: dict) -> Run:
    """Drive one side through ``case`` from ``state_dict`` (:func:`starting_state`)."""
    device = device_for(make_optimizer)
    built = _build(case, make_optimizer, device)
    opt, params = built.optimizer, built.params
    opt.load_state_dict(copy.deepcopy(state_dict))
    out = Run(case, state_to_cpu(copy.deepcopy(opt.state_dict())))
    for call in range(1, case.calls + 1):
        if call > 1 and case.schedule != "constant":
            _apply_schedule(case, opt, device)
        grads = {i: gradient(case, i, call) for i in params}
        before = {i: to_cpu(p) for i, p in params.items()}
        hypers = _hypers(opt)
        record = Call(before, {}, grads, {}, hypers, skipped=_skipped(case, call))
        scale = grad_scale(case, call) if case.protocol in ("grad-scale", "found-inf") else 1.0

        def assign():
            for i, p in params.items():
                g = grads[i]
                p.grad = None if g is None else _placed(case, built, i, (g.double() * scale).to(g.dtype), device)

        if case.protocol == "closure":
            for i, p in params.items():  # what a previous iteration left behind
                stale = gradient(case, i, call, stale=True)
                p.grad = None if stale is None else _placed(case, built, i, stale, device)
            record.expected_loss = torch.tensor(float(call))

            def closure():
                opt.zero_grad(set_to_none=True)
                assign()
                return record.expected_loss

            record.loss = opt.step(closure)
        else:
            assign()
            if case.protocol in ("grad-scale", "found-inf"):
                opt.grad_scale = torch.tensor(scale, device=device)
                opt.found_inf = torch.tensor(1.0 if record.skipped else 0.0, device=device)
            opt.step()
        record.after = {i: to_cpu(p) for i, p in params.items()}
        record.state_dict = state_to_cpu(copy.deepcopy(opt.state_dict()))
        out.calls.append(record)
    return out

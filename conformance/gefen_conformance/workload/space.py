"""The optimizer's input space (SPEC 4.3.10): cases and the values they give.

An :class:`InputCase` names everything an optimizer's step may see: each parameter's shape,
dtype, memory layout, group, gradient pattern and whether it is frozen (:class:`ParamCase`); each
group's hyperparameters (:class:`GroupCase`); the optimizer's routing options; the state the
first step starts from (a synthesized native state at a step counter, or a fresh state with only
the codebook); how many ``step()`` calls follow, how the hyperparameters change between them
(schedules) and by which protocol each call is made (plain, a closure that zeroes and recomputes
the gradients, the GradScaler attributes ``grad_scale`` and ``found_inf``); what happens to the
optimizer between calls besides (groups added, parameter storage replaced: the lifecycle
``events``); how the gradients lie in memory (``grad_order``); and the constructor's flags.

Every value (:func:`initial`, :func:`gradient`, the synthesized state) is a deterministic function
of the case (its ``seed``), so both sides see the same inputs;
:mod:`gefen_conformance.workload.space_driver` drives one side through a case. Nothing here
imports hypothesis: the strategies over this space are the suite's.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import torch

__all__ = [
    "CODEBOOK",
    "CODEBOOKS",
    "CODEWORD_TABLE",
    "DTYPES",
    "EVENTS",
    "GRAD_ORDERS",
    "GRADIENTS",
    "SCALE_GRADIENTS",
    "LAYOUTS",
    "OPTIONS",
    "PROTOCOLS",
    "SCHEDULES",
    "STATE_FORMS",
    "GroupCase",
    "InputCase",
    "ParamCase",
    "codebook",
    "divisors",
    "padded_codebook",
    "starting_codebook",
    "late_group",
    "factored",
    "gradient",
    "initial",
    "layouts_for",
    "synthesized_entry",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
#: Memory layouts (SPEC 4.3.10): a standalone contiguous tensor; the transpose of a contiguous
#: tensor (2-D); channels_last (4-D); a view into one flat buffer shared by every such parameter of
#: its dtype, at a storage offset, whose gradient is a view into a flat gradient buffer the same
#: way (how FSDP1 and Megatron lay out parameters and gradients); a contiguous parameter whose
#: gradient is not contiguous (every stride doubled); a contiguous parameter whose gradient is a
#: view into one flat gradient bucket per dtype, laid out in the case's ``grad_order`` (DDP's
#: ``gradient_as_bucket_view``: buckets are filled in reverse registration order); a column slice
#: ``w[..., :k]`` of a buffer wider in its last dimension, with its gradient a slice of a wider
#: gradient buffer the same way (one of q, k, v sliced out of a fused QKV projection: unit inner
#: stride, padded rows); a contiguous parameter whose gradient is every other row ``w[::2]`` of a
#: buffer twice as tall (unit inner stride, padded rows); a contiguous parameter whose gradient is
#: dense in another memory order (2-D transposed, 4-D channels_last, 3-D dimensions reversed).
LAYOUTS = (
    "contiguous",
    "transposed",
    "channels-last",
    "flat-view",
    "strided-grad",
    "bucket-grad",
    "column-slice",
    "padded-rows-grad",
    "permuted-grad",
)
#: The columns a column-slice layout's buffer has beyond the slice (SPEC 4.3.10).
COLUMN_PADDING = 3
#: How the bucket-grad layout's gradients lie in their bucket: in registration order, or reversed.
GRAD_ORDERS = ("registration", "reverse")
#: Gradient patterns: standard normal values with column structure (so the period search finds
#: structure); all zero; zero on half of the elements, the other half at the next call (blocks
#: whose gradient goes to zero after being nonzero); tiny (eps dominates the stepsize) and huge
#: scales; none at all (the parameter never gets a gradient); none at the first call only; a
#: gradient at odd calls only, or at even calls only (parameters of one shape taking turns, as
#: experts of a mixture do); a large mean with small noise (near-constant: the period search's
#: variances are small differences of large numbers); standard normal rows scaled alternately by 1
#: and 3 (the search finds the row, however long: SPEC 1.5.5 has no cap); random signs at one
#: magnitude (every square equal: the search finds no structure and falls back, SPEC 1.5.6);
#: powers of two (every element 0 or +-2^-j, j in 0..4: every block's largest magnitude is a power
#: of two, so its normalization is exact in any arithmetic, SPEC 5.6.6, 5.6.7). Built for one rule
#: each (the rules' examples name them; the strategies never draw them): the magnitudes 4093 to
#: 4096 repeating with random signs (fp32 gradients: squares of period 4 just below 2^24, every
#: variance exact in float64, so from 8 on each candidate scores exactly 0 and the smallest, 8,
#: wins the tie, SPEC 1.5.5, while variances in fp32 round the scores apart, SPEC 1.5.9); 1 plus
#: ``0.75 * 2^-24`` on odd rows (one value in fp32, so every square is 1 and the search falls back;
#: apart in float64, where a square not rounded to fp32 shows the rows, SPEC 1.5.3); zero at the
#: first call (a fresh case learns the all-zero padding codebook ``[-1, 2^-12 (x254), +1]``, SPEC
#: 1.6.7) and SPEC 1.7.2's values after it (:data:`CODEWORD_TABLE`); +-1 at even positions and, at
#: odd ones, the centres of 255 bins 4 apart around 0 in turn (every block of two or more elements
#: has largest magnitude 1, so it normalizes exactly; with the two ends, 257 active bins of equal
#: interior counts: the codebook's dynamic program has one merge to make, every adjacent interior
#: pair costs exactly the same, and the tie rule decides which, SPEC 1.6.8).
GRADIENTS = (
    "normal",
    "zero",
    "zero-half",
    "tiny",
    "huge",
    "none",
    "late",
    "odd-calls",
    "even-calls",
    "near-constant",
    "row-scaled",
    "signs",
    "powers-of-two",
    "four-cycle",
    "below-fp32",
    "codeword-table",
    "bin-ladder",
)
#: Gradient patterns of the scale tier (SPEC 4.3.16), never drawn: one value (1) on all but every
#: 64th element, those uniform in (-1, 1) (one histogram bin holds 63/64 of a parameter: past
#: 2^24 counts in a parameter of 2^25 elements, SPEC 1.6.5); and statistics that change along the
#: parameter (drifting: the first half standard normal, the second half uniform in runs of 4096
#: elements scaled alternately by 1 and 4), so that a period search or a histogram of a prefix
#: differs from one of the whole (SPEC 1.5.3, 1.6.5).
SCALE_GRADIENTS = ("one-bin", "drifting")
#: The codebook a case starts from (SPEC 4.3.10): loaded, :data:`CODEBOOK` (dense near 0, as a
#: learned one is); loaded, :func:`padded_codebook` (what a small or sparse first step learns: a
#: run of equal codewords, SPEC 1.6.7); or learned by the implementation at the first call from
#: the case's gradients (a fresh case: the state it loads has no codebook, SPEC 1.6.1).
CODEBOOKS = ("loaded", "padded", "learned")
#: What happens to the optimizer before a call (``InputCase.events``): the case's last group is
#: registered by ``add_param_group`` (its parameters fresh); every parameter's ``.data`` is replaced
#: by a copy (new storage, same values, as ``module.to(...)`` does); every 4-D parameter's ``.data``
#: is replaced by a ``channels_last`` copy (``module.to(memory_format=torch.channels_last)``).
EVENTS = ("add-group", "replace-storage", "channels-last")
#: How each call is made: ``opt.step()``; ``opt.step(closure)`` whose closure calls
#: ``zero_grad(set_to_none=True)`` and then sets the gradients (stale gradients are present
#: before the call); the GradScaler attributes with every call (``grad_scale`` set, gradients
#: scaled by it, ``found_inf`` 0); the same with ``found_inf`` 1 at the second-to-last call.
PROTOCOLS = ("plain", "closure", "grad-scale", "found-inf")
#: What changes before every call after the first: nothing; each group's lr (a float replaced by a
#: float, a tensor by a new tensor); a tensor lr scaled in place (a float lr replaced); every
#: hyperparameter (lr, betas, eps and weight decay replaced); a warm-up from zero (each group's lr
#: is 0 at the first call and its ``lr`` times ``(call - 1) / (calls - 1)`` after, in place for a
#: tensor lr).
SCHEDULES = ("constant", "lr", "lr-in-place", "all", "warmup")
#: The form of a synthesized state (``InputCase.state_form``): as the case's path writes it; a legacy
#: block state, without ``vmean_step`` (SPEC 1.8.2: the step takes it as ``step``); the second
#: moment of the other path (a state saved with the other ``factored_v_2d``, resumed across a mode
#: switch: SPEC 1.8.2, 1.9.2, 1.10.8, the active moment starts from zeros with counter 0).
STATE_FORMS = ("current", "legacy", "other-mode")
#: Constructor options (SPEC 1.5.2, 1.1.5) a case may set, besides ``factored_v_2d``: the routing
#: flags, and ``unfused`` (``fused=False``: no effect on the reference, another code path in a
#: backend that keeps a fallback beside its fused kernel).
OPTIONS = ("force_1d_period_one", "force_2d_period_one", "period_one_substrings", "unfused")
#: ``period_one_substrings`` of a case that sets it: the name of its parameter 1 (the constructor
#: lowers it, SPEC 1.1.4; a case may give it in upper case).
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
GRAD_SCALE = 2.0**10
#: The near-constant pattern: this mean (its dtype's share of it: 16-bit gradients keep their
#: noise visible) plus standard normal noise of unit scale.
_NEAR_CONSTANT_MEAN = {torch.float16: 64.0, torch.bfloat16: 16.0}
_DEFAULT_NEAR_CONSTANT_MEAN = 4096.0
#: The values of the codeword-table pattern after its first call, repeating (SPEC 1.7.2 with the
#: padding codebook ``[-1, t (x254), +1]``, ``t = 2^-12``): 1 (the block's largest, index 255), 0
#: and ``t`` (the run's lowest index, 1), ``2^-11`` and 0.5 (above the run: its highest index,
#: 254), -0.5 (index 0), ``0.5 + 2^-12`` (nearer +1 than ``t`` by less than a bf16 rounding of the
#: distances) and -1. Every value is exact in fp32 and normalizes exactly.
CODEWORD_TABLE = (1.0, 0.0, 2.0**-12, 2.0**-11, 0.5, -0.5, 0.5 + 2.0**-12, -1.0)
#: The below-fp32 pattern's offset on odd rows: under half an fp32 ulp of 1 (it rounds away), while
#: twice it, in the square, is above half an ulp.
_BELOW_FP32 = 0.75 * 2.0**-24
#: The bin-ladder pattern's bins: ``first + step * i`` for ``i < rungs``, far from both ends.
_LADDER_FIRST, _LADDER_STEP, _LADDER_RUNGS = 1536, 4, 255


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
    period: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class GroupCase:
    """One group's hyperparameters (SPEC 1.2.3). ``tensor_lr``: lr as a one-element tensor (SPEC
    1.4) of this dtype (``True``: fp32), or a Python float (``False``)."""

    lr: float = 1e-3
    tensor_lr: bool | str = False
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass(frozen=True)
class InputCase:
    """One point of the input space. ``counter``: the step counter of every synthesized state (0:
    no state at all, only the codebook); ``moment_counter``: the second moment's own counter when
    it differs (a second moment re-warmed after a mode switch, SPEC 1.9.5); ``calls``: how many
    ``step()`` calls are made; ``events``: ``(call, event)`` pairs of :data:`EVENTS`, each done
    just before that call; ``grad_order``: of :data:`GRAD_ORDERS`; ``deterministic``: the
    constructor's flag; ``substring``: the ``period_one_substrings`` entry when the option is set;
    ``codebook``: of :data:`CODEBOOKS` (``learned`` only for a fresh case, ``counter`` 0);
    ``state_form``: of :data:`STATE_FORMS` (``other-mode`` only for 2-D parameters with state)."""

    params: tuple
    groups: tuple = (GroupCase(),)
    factored: bool = False
    options: tuple = ()
    counter: int = 0
    moment_counter: int | None = None
    calls: int = 1
    schedule: str = "constant"
    protocol: str = "plain"
    seed: int = 0
    events: tuple = ()
    grad_order: str = "registration"
    deterministic: bool = False
    substring: str = PERIOD_ONE_SUBSTRING
    codebook: str = "loaded"
    state_form: str = "current"

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
        for call, event in self.events:
            if event not in EVENTS or not 2 <= call <= self.calls:
                raise ValueError(f"event {event!r} before call {call} of {self.calls}")
        late = late_group(self)
        if late is not None:
            if len(self.groups) < 2:
                raise ValueError("add-group needs a group registered at construction")
            if any(p.period is not None for p in self.params if p.group == late):
                raise ValueError("the parameters of a group added later start fresh (no period)")
        if self.grad_order not in GRAD_ORDERS:
            raise ValueError(f"grad_order {self.grad_order!r} (known: {GRAD_ORDERS})")
        if self.codebook not in CODEBOOKS:
            raise ValueError(f"codebook {self.codebook!r} (known: {CODEBOOKS})")
        if self.codebook == "learned" and self.counter:
            raise ValueError("a learned codebook needs a fresh case (counter 0): periods come with it")
        if self.state_form not in STATE_FORMS:
            raise ValueError(f"state_form {self.state_form!r} (known: {STATE_FORMS})")
        if self.state_form == "other-mode" and any(
            p.period is not None and len(p.shape) != 2 for p in self.params
        ):
            raise ValueError("only a 2-D parameter's state can be of either path")
        for p in self.params:
            if p.gradient not in GRADIENTS + SCALE_GRADIENTS:
                raise ValueError(f"gradient pattern {p.gradient!r} (known: {GRADIENTS + SCALE_GRADIENTS})")

    def order(self) -> list:
        """Parameter indices in registration order: group by group, in case order within a group."""
        return [i for g in range(len(self.groups)) for i, p in enumerate(self.params) if p.group == g]

    def name(self, i: int) -> str:
        return f"p{i}.weight" if len(self.params[i].shape) >= 2 else f"p{i}.bias"

    def without_factored(self) -> InputCase:
        return replace(self, factored=False)


def late_group(case: InputCase) -> int | None:
    """The group an ``add-group`` event registers (the case's last), or None."""
    return len(case.groups) - 1 if any(event == "add-group" for _, event in case.events) else None


def added_at(case: InputCase) -> int | None:
    """The call before which the late group is registered, or None."""
    calls = [call for call, event in case.events if event == "add-group"]
    return min(calls) if calls else None


def registered(case: InputCase, i: int, call: int) -> bool:
    """Whether parameter ``i`` is in the optimizer at ``call`` (1-based)."""
    late = late_group(case)
    return late is None or case.params[i].group != late or call >= added_at(case)


def layouts_for(shape: tuple) -> tuple:
    """The layouts that apply to a shape: transposed needs 2-D, channels_last 4-D, a strided
    gradient at least one dimension, the padded-row and permuted layouts at least two (a
    permuted gradient also two dimensions above 1, or its memory order is the logical one)."""
    out = ["contiguous", "flat-view"]
    if len(shape) == 2:
        out.append("transposed")
    if len(shape) == 4:
        out.append("channels-last")
    if len(shape) >= 1:
        out.append("strided-grad")
    out.append("bucket-grad")
    if len(shape) >= 2:
        out += ["column-slice", "padded-rows-grad"]
        if sum(size > 1 for size in shape) >= 2:
            out.append("permuted-grad")
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


def padded_codebook() -> torch.Tensor:
    """The codebook a first step with four active histogram bins learns (SPEC 1.6.7): bins
    ``0`` (lost to ``-1``), ``1024``, ``2048`` and ``2560``, the last one's centre ``0.25 + 2^-12``
    repeated 252 times (a run of equal codewords, indices 3 to 254), then ``+1``. Every value in
    ``(0.25 + 2^-12, 0.625)`` is nearest to the run and above it: SPEC 1.7.3 gives it the run's
    highest index; a normalized momentum of ``0.5`` is one."""
    centres = [-1.0 + (2 * k + 1) / 4096 for k in (0, 1024, 2048, 2560)]
    values = centres + [centres[-1]] * (256 - len(centres))
    values[0], values[-1] = -1.0, 1.0
    return torch.tensor(sorted(values), dtype=torch.float32)


def starting_codebook(case: InputCase) -> torch.Tensor | None:
    """The codebook the case's state carries: :data:`CODEBOOK`, :func:`padded_codebook`, or None
    (learned at the first call with gradients)."""
    return {"loaded": CODEBOOK, "padded": padded_codebook(), "learned": None}[case.codebook]


# ------------------------------------------------------------------------------------ values


def _scale(p: ParamCase) -> float:
    if p.gradient in _DEFAULT_SCALES:
        return _SCALES[p.gradient].get(p.torch_dtype, _DEFAULT_SCALES[p.gradient])
    return 1.0


def gradient(case: InputCase, i: int, call: int, *, stale: bool = False) -> torch.Tensor | None:
    """Parameter ``i`` 's gradient at ``call`` (1-based; CPU, its dtype), or None. ``stale``: the
    different gradient a closure protocol leaves in place before the call."""
    p = case.params[i]
    if p.gradient == "none" or (p.gradient == "late" and call == 1 and not stale):
        return None
    if not stale and (
        (p.gradient == "odd-calls" and call % 2 == 0) or (p.gradient == "even-calls" and call % 2)
    ):
        return None
    gen = _generator(case, "grad", i, call, stale)
    g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
    if p.gradient == "near-constant":
        return (g + _NEAR_CONSTANT_MEAN.get(p.torch_dtype, _DEFAULT_NEAR_CONSTANT_MEAN)).to(p.torch_dtype)
    if p.gradient == "row-scaled":
        if len(p.shape) >= 1:
            rows = 1.0 + 2.0 * (torch.arange(p.shape[0], dtype=torch.float64) % 2)
            g = g * rows.reshape(-1, *(1,) * (g.dim() - 1))
        return g.to(p.torch_dtype)
    if p.gradient == "signs":
        return torch.where(g < 0, -1.0, 1.0).to(p.torch_dtype)
    if p.gradient == "one-bin":
        flat = torch.ones(p.numel, dtype=torch.float64)
        spread = torch.rand(flat[::64].shape, generator=gen, dtype=torch.float64) * 2.0 - 1.0
        flat[::64] = spread
        return flat.reshape(p.shape).to(p.torch_dtype)
    if p.gradient == "drifting":
        flat = g.reshape(-1).clone()
        half = flat.numel() // 2
        tail = flat.numel() - half
        uniform = torch.rand(tail, generator=gen, dtype=torch.float64) * 2.0 - 1.0
        runs = 1.0 + 3.0 * ((torch.arange(tail, dtype=torch.float64) // 4096) % 2)
        flat[half:] = uniform * runs
        return flat.reshape(p.shape).to(p.torch_dtype)
    if p.gradient == "four-cycle":
        magnitudes = 4093.0 + torch.arange(p.numel, dtype=torch.float64) % 4
        return (torch.where(g < 0, -1.0, 1.0) * magnitudes.reshape(p.shape)).to(p.torch_dtype)
    if p.gradient == "below-fp32":
        row = torch.arange(p.numel) // max(1, p.numel // max(1, p.shape[0] if p.shape else 1))
        return (1.0 + _BELOW_FP32 * (row % 2).double()).reshape(p.shape).to(p.torch_dtype)
    if p.gradient == "codeword-table":
        if call == 1:
            return torch.zeros(p.shape, dtype=p.torch_dtype)
        table = torch.tensor(CODEWORD_TABLE, dtype=torch.float64)
        return table[torch.arange(p.numel) % len(CODEWORD_TABLE)].reshape(p.shape).to(p.torch_dtype)
    if p.gradient == "bin-ladder":
        j = torch.arange(p.numel)
        bins = _LADDER_FIRST + _LADDER_STEP * ((j // 2) % _LADDER_RUNGS)
        centres = (-1.0 + (2.0 * bins.double() + 1.0) / 4096).reshape(p.shape)
        return torch.where((j % 2 == 0).reshape(p.shape), torch.where(g < 0, -1.0, 1.0), centres).to(
            p.torch_dtype
        )
    if p.gradient == "powers-of-two":
        exponents = torch.randint(0, 5, p.shape, generator=gen).double()
        zeros = torch.randint(0, 6, p.shape, generator=gen) == 0
        return torch.where(zeros, 0.0, torch.sign(g) * 2.0**-exponents).to(p.torch_dtype)
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
    return (torch.randn(p.shape, generator=_generator(case, "init", i), dtype=torch.float64) * start).to(
        p.torch_dtype
    )


def synthesized_entry(case: InputCase, i: int) -> dict:
    """Parameter ``i`` 's native state entry after ``case.counter`` steps (SPEC 1.11.3): random
    indices, magnitudes and second moments at the scale of its gradients."""
    p = case.params[i]
    gen = _generator(case, "state", i)
    blocks = p.numel // p.period
    scale = _scale(p)
    entry = {
        "name": case.name(i),
        "automatic_period": p.period,
        "step": case.counter,
        "m_codebook": torch.randint(0, 256, (blocks, p.period), generator=gen, dtype=torch.uint8),
        "m_magnitude": (torch.rand(blocks, 1, generator=gen, dtype=torch.float64) * 1.3 + 0.2)
        .mul(scale)
        .float(),
    }
    moment = case.counter if case.moment_counter is None else case.moment_counter

    def second(*shape):
        return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 1.5 + 0.5).mul(scale * scale).float()

    if factored(case, i) != (case.state_form == "other-mode"):
        rows, cols = p.shape
        entry.update(v_row=second(rows), v_col=second(cols), factored_step=moment)
    else:
        entry.update(vmean=second(blocks, 1), vmean_step=moment)
        if case.state_form == "legacy":
            del entry["vmean_step"]
    return entry

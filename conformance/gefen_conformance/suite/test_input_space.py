"""The optimizer over its input space (SPEC 4.3.10), judged by the pinned-step oracle (SPEC 5.6).

One example is one :class:`gefen_conformance.workload.space.InputCase`: parameters of any shape,
dtype and memory layout in any group structure, a synthesized native state at any step counter
(or a fresh one), a few ``step()`` calls with hyperparameter schedules between them, made by
plain calls, through a closure or under the GradScaler protocol. The reference's native state
dict of the case is loaded into the implementation and into the reference, both are driven
through the calls, and each call is compared:

* exact in both profiles (SPEC 5.6.11): counters, periods, names, hyperparameters, key sets,
  dtypes and shapes of the state, the loaded (frozen) codebook and the global step, against the
  reference's same call; a closure's loss returned; a parameter without a gradient, and every
  parameter and state entry under a ``found_inf`` call, bit for bit unchanged (SPEC 1.10.3);
* under ``cpu-bit-exact`` on CPU: every parameter and state tensor bitwise against the reference,
  except fp64 parameters, which every profile judges by tolerance (SPEC 0.4.2);
* otherwise: each call as a pinned step (SPEC 5.6.1-5.6.9) from the implementation's own state
  and parameters before it, against float64 arithmetic of SPEC 1.8 / 1.9 with the hyperparameters
  the reference's groups held at that call. Nothing accumulates, so a counter of 2^31 is judged
  as sharply as a counter of 1, and a free-running divergence of quantized momentum never enters.

``test_inputs_match_reference`` draws plain calls, ``test_protocols_match_reference`` closures
and GradScaler calls with frozen parameters anywhere. Under ``gefen-certify`` both run their
explicit examples (every boundary SPEC 4.3.10 names: sizes at the tile limits 2048, 16384, 65536
and 2^20, counters 1, 255, 256, 1000 and beyond, each layout, dtype mix, group shape, schedule,
gradient pattern and protocol) and then a share of the profile's derandomized examples (small
cases only; :data:`EXAMPLE_SHARE`); ``gefen-fuzz`` draws the same share of its random examples.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gefen_conformance.implementations.contract import FACTORED_V, NATIVE_STATE_DICT
from gefen_conformance.suite.space_checks import InputSpaceCase, compare_case  # noqa: F401 - the checks
from gefen_conformance.workload.space import (
    DTYPES,
    GRAD_ORDERS,
    OPTIONS,
    GroupCase,
    InputCase,
    ParamCase,
    divisors,
    layouts_for,
)

#: Each property runs this share of the hypothesis profile's examples (``gefen-certify``: 300 -> 25;
#: ``gefen-fuzz``: 5000 -> 416), after its explicit examples: one example drives two optimizers
#: through up to three calls and recomputes each call in float64, about a hundred times the work of
#: a staging example (SPEC 4.3.10).
EXAMPLE_SHARE = 12


#: The lifecycle properties run this share (``gefen-certify``: 300 -> 12): their explicit examples
#: hold the large counts, the draws cover the combinations.
LIFECYCLE_SHARE = 25


def _share_of_profile(share: int = EXAMPLE_SHARE):
    """The share of the profile's examples, sharing the test's judge across them (it keeps each
    comparison's worst margin over every example)."""
    return settings(
        max_examples=max(1, settings.default.max_examples // share),
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


# ------------------------------------------------------------------------------- strategies

SHAPES = [
    (),
    (1,),
    (2,),
    (7,),
    (8,),
    (37,),
    (64,),
    (100,),
    (256,),
    (1024,),
    (2047,),
    (2048,),
    (2049,),
    (1, 1),
    (1, 16),
    (16, 1),
    (1, 300),
    (300, 1),
    (4, 4),
    (3, 24),
    (24, 3),
    (7, 11),
    (48, 40),
    (64, 32),
    (2, 3, 4, 5),
    (8, 3, 3, 3),
    (4, 2, 1, 6),
    (0,),
    (0, 4),
    (3, 0, 2),
]
COUNTERS = [1, 2, 3, 10, 254, 255, 256, 257, 999, 1000, 4096, 65535, 65536, 10**6, 2**31 - 1, 2**32]
LRS = [1e-3, 3e-3, 1e-2, 1e-4]
BETAS = [(0.9, 0.999), (0.8, 0.99), (0.5, 0.9), (0.95, 0.9999), (0.0, 0.999)]
EPS = [1e-8, 1e-6, 1e-3]
WEIGHT_DECAYS = [0.0, 0.0, 0.01, 0.1]
#: Gradient patterns drawn for a parameter: mostly ordinary values.
_GRADIENT_DRAWS = ["normal"] * 5 + [
    "zero",
    "zero-half",
    "tiny",
    "huge",
    "none",
    "late",
    "powers-of-two",
    "signs",
]

_shape = st.sampled_from(SHAPES)
_dtype = st.sampled_from(list(DTYPES))
_gradient = st.sampled_from(_GRADIENT_DRAWS)
_group = st.builds(
    GroupCase,
    lr=st.sampled_from(LRS),
    tensor_lr=st.booleans(),
    betas=st.sampled_from(BETAS),
    eps=st.sampled_from(EPS),
    weight_decay=st.sampled_from(WEIGHT_DECAYS),
)


@st.composite
def param_cases(draw, group: int, counter: int, frozen_share: int):
    shape = draw(_shape)
    n = ParamCase(shape).numel
    period = None
    if counter > 0 and n > 0 and draw(st.integers(0, 3)) > 0:
        period = draw(st.sampled_from(divisors(n)))
    frozen = draw(st.integers(0, frozen_share - 1)) == 0
    gradient = "none" if frozen and draw(st.integers(0, 3)) > 0 else draw(_gradient)
    return ParamCase(
        shape, draw(_dtype), group, draw(st.sampled_from(layouts_for(shape))), gradient, frozen, period
    )


@st.composite
def input_cases(draw, protocols=("plain",), frozen_share: int = 8):
    """Small cases anywhere in the space (SPEC 4.3.10): 1-5 parameters in 1-5 groups, every
    parameter's shape, dtype, layout, gradient pattern and group drawn, in any order, from any
    codebook (a learned one only in a fresh case)."""
    groups = draw(st.integers(1, 5))
    count = draw(st.integers(groups, 5))
    counter = draw(st.sampled_from([0] * len(COUNTERS) + COUNTERS))
    codebook = draw(st.sampled_from(["loaded"] * 4 + ["padded"] + (["learned"] * 2 if counter == 0 else [])))
    params = [
        draw(param_cases(i if i < groups else draw(st.integers(0, groups - 1)), counter, frozen_share))
        for i in range(count)
    ]
    params = [params[i] for i in draw(st.permutations(range(count)))]
    protocol = draw(st.sampled_from(protocols))
    calls = draw(st.integers(2 if protocol == "found-inf" else 1, 3))
    moment = draw(st.sampled_from([None, None, None, 1, counter // 2])) if counter > 1 else None
    return InputCase(
        params=tuple(params),
        groups=tuple(draw(_group) for _ in range(groups)),
        factored=draw(st.booleans()),
        options=tuple(o for o in OPTIONS if draw(st.integers(0, 5)) == 0),
        counter=counter,
        moment_counter=moment or None,
        calls=calls,
        schedule=draw(st.sampled_from(["constant", "lr", "lr-in-place", "all"])) if calls > 1 else "constant",
        protocol=protocol,
        seed=draw(st.integers(0, 2**16)),
        codebook=codebook,
    )


#: Small shapes a lifecycle case repeats (cheap even a hundred times over).
_REPEATED = [(8,), (37,), (16, 8), (2, 3, 4, 5), (1,), (64,)]
_LIFECYCLE_GRADIENTS = ["normal"] * 4 + [
    "odd-calls",
    "even-calls",
    "near-constant",
    "row-scaled",
    "signs",
    "none",
]


@st.composite
def lifecycle_cases(draw, add_group: bool = False):
    """Cases across the lifecycle dimensions of SPEC 4.3.12: up to 65 parameters of a few repeated
    shapes in any dtype order, gradients taking turns, in reverse buckets or flat views, a group
    added after steps, storage replaced, lr warm-ups from zero and tensor lrs of every dtype,
    deterministic steps, the period-one substring in either case, near-constant gradients. With
    ``add_group`` the last of two or three groups is registered by ``add_param_group`` before a
    later call."""
    count = draw(st.sampled_from([2, 3, 5, 9, 17, 33, 65]))
    shapes = draw(st.lists(st.sampled_from(_REPEATED), min_size=1, max_size=3))
    groups = draw(st.integers(2 if add_group else 1, min(3, count)))
    counter = draw(st.sampled_from([0, 0, 1, 3, 300]))
    calls = draw(st.integers(2, 3))
    params = []
    for k in range(count):
        shape, group = shapes[k % len(shapes)], k % groups
        fresh = counter == 0 or (add_group and group == groups - 1) or draw(st.booleans())
        period = None if fresh else draw(st.sampled_from(divisors(ParamCase(shape).numel)))
        layout = draw(st.sampled_from(["contiguous", "bucket-grad", "bucket-grad", "flat-view"]))
        params.append(
            ParamCase(
                shape, draw(_dtype), group, layout, draw(st.sampled_from(_LIFECYCLE_GRADIENTS)), False, period
            )
        )
    events = []
    if add_group:
        events.append((draw(st.integers(2, calls)), "add-group"))
    if draw(st.integers(0, 2)) == 0:
        events.append(
            (draw(st.integers(2, calls)), draw(st.sampled_from(["replace-storage", "channels-last"])))
        )
    group_cases = tuple(
        GroupCase(
            lr=draw(st.sampled_from([0.0, 1e-3, 3e-3])),
            tensor_lr=draw(st.sampled_from([False, True, "fp64", "bf16", "fp16"])),
            weight_decay=draw(st.sampled_from(WEIGHT_DECAYS)),
        )
        for _ in range(groups)
    )
    substrings = draw(st.booleans())
    return InputCase(
        params=tuple(params),
        groups=group_cases,
        factored=draw(st.booleans()),
        options=("period_one_substrings",) if substrings else (),
        substring=draw(st.sampled_from(["p1.", "P1."])),
        counter=counter,
        calls=calls,
        schedule=draw(st.sampled_from(["constant", "lr", "lr-in-place", "warmup"])),
        events=tuple(events),
        grad_order=draw(st.sampled_from(GRAD_ORDERS)),
        deterministic=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


# -------------------------------------------------------------------- explicit examples

P = ParamCase
#: Every dtype in one optimizer, bf16 first (a per-dtype table a kernel builds once must not be
#: the first parameter's).
_MIX = (
    P((256,), "bf16", 0, period=64),
    P((48, 40), "fp32", 0, period=40),
    P((24, 3), "fp16", 0, period=8),
    P((7, 11), "fp64", 0, period=7),
)


def _case(*params, **kw) -> InputCase:
    return InputCase(params=tuple(params), **kw)


#: One parameter per group of ``groups-nine-distinct``: (shape, dtype, period of its state).
_NINE = (
    ((64,), "fp32", 16),
    ((48, 40), "bf16", 40),
    ((24, 3), "fp16", 3),
    ((37,), "fp32", 37),
    ((16, 8), "fp32", 8),
    ((256,), "bf16", 64),
    ((7, 11), "fp32", 11),
    ((8, 3, 3, 3), "fp16", 27),
    ((100,), "fp32", 20),
)
#: A group with ``beta1 = 0``: the new momentum is the gradient itself in any arithmetic, so a
#: gradient of powers of two normalizes exactly (SPEC 5.6.6).
_NO_MOMENTUM = GroupCase(betas=(0.0, 0.999))


#: Every boundary SPEC 4.3.10 names, each an explicit example of the certify profile (ids name them
#: in failure reports). Sizes at the tile limits are one call from a synthesized state or a fresh
#: one; nothing large steps twice.
BOUNDARIES = {
    # shapes and routing: just under and over each tile limit, fresh (the period is searched,
    # falls back or is 1: SPEC 1.5) and from synthesized state
    "sizes-2048-16384-65536-fresh": _case(
        P((2047,)),
        P((2049,)),
        P((16383,)),
        P((16385,)),
        P((128, 512)),
        P((65535,)),
        P((65537,)),
        P((257, 256), "bf16"),
    ),
    "sizes-past-65536-state": _case(
        P((65537,), period=1),
        P((67584,), "bf16", period=2048),
        P((257, 256), "fp16", period=256),
        counter=7,
        factored=True,
    ),
    "size-past-2^20-block": _case(P((1050624,), period=2048), counter=1000),
    "size-past-2^20-factored": _case(P((1025, 1024), "bf16", period=1024), counter=3, factored=True),
    "routing-options": _case(
        P((64,)),
        P((48, 40)),
        P((1,)),
        P((37,)),
        P((16, 8), group=1),
        P((8, 3, 3, 3), group=1),
        groups=(GroupCase(), GroupCase()),
        factored=True,
        options=("force_1d_period_one", "period_one_substrings"),
    ),
    "routing-2d-period-one": _case(P((48, 40)), P((64,)), P((0, 4)), P(()), options=("force_2d_period_one",)),
    # layouts: every one, two views sharing one flat buffer, fresh and from state
    "layouts-state": _case(
        P((48, 40), layout="transposed", period=40),
        P((8, 3, 3, 3), layout="channels-last", period=27),
        P((64,), layout="flat-view", period=16),
        P((7, 11), layout="flat-view", period=11),
        P((24, 3), layout="strided-grad", period=3),
        P((37,), layout="strided-grad", period=37),
        counter=5,
        calls=2,
    ),
    "layouts-fresh-factored": _case(
        P((40, 48), layout="transposed"),
        P((4, 6, 5, 5), "bf16", layout="channels-last"),
        P((16, 8), layout="flat-view"),
        P((64,), layout="flat-view"),
        P((48, 40), "fp16", layout="strided-grad"),
        factored=True,
    ),
    # unit inner stride with padded rows (a column slice of a fused buffer, every other row of a
    # gradient buffer) and dense gradients in another memory order than their parameters'
    "layouts-padded-rows-and-permuted-state": _case(
        P((48, 40), layout="column-slice", period=40),
        P((24, 3), layout="padded-rows-grad", period=3),
        P((7, 11), "bf16", layout="permuted-grad", period=11),
        P((8, 3, 3, 3), layout="permuted-grad", period=27),
        P((2, 3, 4), "fp16", layout="column-slice", period=4),
        P((4, 6, 5), layout="permuted-grad", period=30),
        counter=5,
        calls=2,
    ),
    "layouts-padded-rows-and-permuted-fresh-factored": _case(
        P((40, 48), layout="column-slice"),
        P((48, 40), "bf16", layout="padded-rows-grad"),
        P((16, 8), layout="permuted-grad"),
        P((4, 6, 5, 5), "fp16", layout="permuted-grad"),
        P((3, 4, 16), layout="padded-rows-grad"),
        factored=True,
    ),
    # dtypes: all four in one group, and one per group
    "dtype-mix-one-group": _case(*_MIX, counter=4),
    "dtype-mix-per-group": _case(
        *(P(p.shape, p.dtype, i, period=p.period) for i, p in enumerate(_MIX)),
        groups=(
            GroupCase(),
            GroupCase(lr=3e-3),
            GroupCase(betas=(0.8, 0.99), eps=1e-6),
            GroupCase(weight_decay=0.1),
        ),
        counter=4,
        factored=True,
    ),
    # groups: grad-less first and in the middle, weight decay only in a later group, per-group
    # betas / eps / lr, 2-D parameters with a dimension of 1
    "groups-gradless-anywhere": _case(
        P((64,), gradient="none", period=16),
        P((48, 40), period=40),
        P((24, 3), group=1),
        P((37,), group=1, gradient="none"),
        P((7, 11), group=1),
        groups=(GroupCase(), GroupCase(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
        counter=3,
        calls=2,
    ),
    "groups-decay-later-only": _case(
        P((256,), period=64),
        P((48, 40), group=1, period=40),
        P((64,), group=2),
        groups=(
            GroupCase(),
            GroupCase(weight_decay=0.1, tensor_lr=True),
            GroupCase(lr=1e-2, betas=(0.5, 0.9), weight_decay=0.01),
        ),
        counter=3,
    ),
    # more groups than a kernel's small per-group table holds (4 or 8 entries), every one with
    # its own hyperparameters
    "groups-nine-distinct": _case(
        *(P(shape, dtype, g, period=period) for g, (shape, dtype, period) in enumerate(_NINE)),
        groups=tuple(
            GroupCase(
                lr=(1e-3, 3e-3, 1e-2, 1e-4, 2e-3, 5e-3, 3e-4, 7e-3, 1.5e-3)[g],
                tensor_lr=g % 3 == 1,
                betas=BETAS[g % len(BETAS)],
                eps=EPS[g % len(EPS)],
                weight_decay=(0.0, 0.01, 0.1, 0.05)[g % 4],
            )
            for g in range(len(_NINE))
        ),
        counter=3,
        calls=2,
    ),
    "groups-dimension-of-one": _case(
        P((1, 64), period=16),
        P((64, 1), period=8),
        P((1, 1), period=1),
        P((1, 300), "bf16"),
        P((300, 1), "fp16"),
        counter=2,
        factored=True,
    ),
    # schedules: lr replaced, a tensor lr scaled in place, every hyperparameter replaced
    "schedule-lr-replaced": _case(
        P((256,), period=64),
        P((48, 40), group=1, period=40),
        groups=(GroupCase(), GroupCase(tensor_lr=True)),
        counter=10,
        calls=3,
        schedule="lr",
    ),
    "schedule-tensor-lr-in-place": _case(
        P((256,), period=64),
        P((24, 3), "bf16", period=3),
        groups=(GroupCase(tensor_lr=True, weight_decay=0.1),),
        counter=10,
        calls=3,
        schedule="lr-in-place",
    ),
    "schedule-every-hyperparameter": _case(
        P((256,), period=64), P((48, 40), period=40), counter=10, calls=2, schedule="all", factored=True
    ),
    # step counters: 1, 255 -> 256, 256, 1000 and past 16 and 32 bits; a re-warmed second moment
    **{
        f"counter-{c}": _case(
            P((256,), period=64),
            P((48, 40), "bf16", period=40),
            P((37,), "fp16", period=1),
            counter=c,
            factored=True,
        )
        for c in (1, 255, 256, 1000, 32767, 65535, 65536, 2**31 - 1, 2**32)
    },
    "counter-1000-moment-rewarmed": _case(
        P((256,), period=64), P((48, 40), period=40), counter=1000, moment_counter=1, factored=True
    ),
    # gradient patterns: a block whose gradient goes to zero after being nonzero, all-zero 2-D
    # gradients (fresh and from state), tiny and huge scales
    "gradient-zero-blocks": _case(
        P((256,), gradient="zero-half", period=16),
        P((48, 40), gradient="zero-half", period=40),
        P((64,), gradient="zero-half"),
        counter=5,
        calls=2,
    ),
    "gradient-all-zero-2d": _case(
        P((48, 40), gradient="zero"),
        P((24, 3), gradient="zero", period=3),
        P((1, 16), gradient="zero"),
        counter=4,
        factored=True,
        calls=2,
    ),
    # codebooks: a padded one (a run of equal codewords) with exactly normalized momenta above
    # and below the run; one learned at the first call from exactly normalized gradients (every
    # block's largest magnitude a power of two) and from ordinary ones, from all-zero gradients
    "codebook-padded-exact-values": _case(
        P((64,), gradient="powers-of-two", period=16),
        P((48, 40), "bf16", gradient="powers-of-two", period=40),
        P((37,), "fp16", gradient="powers-of-two"),
        P((24, 3), gradient="powers-of-two", group=1, period=3),
        P((7, 11), gradient="signs", group=1),
        groups=(_NO_MOMENTUM, GroupCase(betas=(0.0, 0.99), weight_decay=0.01)),
        counter=4,
        calls=2,
        codebook="padded",
    ),
    "codebook-padded-fresh-factored": _case(
        P((48, 40), gradient="powers-of-two"),
        P((256,), "bf16"),
        P((16, 8), "fp16", gradient="powers-of-two"),
        groups=(_NO_MOMENTUM,),
        factored=True,
        calls=2,
        codebook="padded",
    ),
    "codebook-learned-exact-first-step": _case(
        P((64,), gradient="powers-of-two"),
        P((48, 40), "bf16", gradient="powers-of-two"),
        P((37,), "fp16", gradient="powers-of-two"),
        P((24, 3), gradient="zero", group=1),
        P((7, 11), gradient="signs", group=1),
        groups=(_NO_MOMENTUM, GroupCase(weight_decay=0.01)),
        calls=2,
        codebook="learned",
    ),
    "codebook-learned-ordinary-first-step": _case(
        P((256,)),
        P((48, 40), "bf16"),
        P((24, 3), "fp16", gradient="late"),
        P((64,), gradient="powers-of-two"),
        calls=2,
        factored=True,
        codebook="learned",
    ),
    "codebook-learned-all-zero-first-step": _case(
        P((64,), gradient="zero"), P((16, 8), gradient="zero"), calls=2, codebook="learned"
    ),
    "gradient-tiny-and-huge": _case(
        P((256,), gradient="tiny", period=64),
        P((48, 40), gradient="huge", period=40),
        P((64,), "fp16", gradient="tiny"),
        P((24, 3), "bf16", gradient="huge"),
        counter=3,
        factored=True,
    ),
}

#: Parameter counts (SPEC 4.3.10, "the optimizer's lifecycle"): multi-tensor kernels launch lists
#: of a bounded length and chunk, sort, bucket and cache them, so a step carries hundreds of
#: parameters, shapes repeating, dtypes interleaved in every order. One call from a synthesized
#: state (nothing accumulates, so one call is the check); small shapes keep them cheap.
_MANY_SHAPES = ((64,), (16, 8), (37,), (8, 3, 3, 3), (1,), (128,))
_DTYPE_CYCLE = ("fp32", "bf16", "fp16", "bf16", "fp32", "fp16", "fp16", "fp32")


def _many(count: int, *, fresh: bool = False, group_of=lambda k: 0) -> tuple:
    """``count`` parameters cycling :data:`_MANY_SHAPES` and the dtype order :data:`_DTYPE_CYCLE`
    (co-prime cycles, so every shape meets every dtype), periods a divisor of each size."""
    out = []
    for k in range(count):
        shape = _MANY_SHAPES[k % len(_MANY_SHAPES)]
        n = ParamCase(shape).numel
        period = None if fresh else divisors(n)[k % len(divisors(n))]
        out.append(P(shape, _DTYPE_CYCLE[k % len(_DTYPE_CYCLE)], group_of(k), period=period))
    return tuple(out)


#: Experts taking turns: parameters of one shape and dtype whose gradients come at odd calls and at
#: even calls, so every call steps another half of a same-shape list.
_EXPERTS = tuple(
    P((32, 16), dtype, 0, gradient="odd-calls" if k % 2 else "even-calls", period=16)
    for k, dtype in enumerate(("fp32", "fp32", "bf16", "bf16", "fp32", "fp32"))
)
LIFECYCLE = {
    # past a launch's per-tensor table of 1024 entries, parameter i and i - 1024 in other groups
    "count-1100-repeated-shapes-three-groups": _case(
        *_many(1100, group_of=lambda k: k % 3),
        groups=(GroupCase(), GroupCase(lr=3e-3, weight_decay=0.1), GroupCase(lr=1e-2, betas=(0.8, 0.99))),
        counter=12,
    ),
    "count-130-three-groups-fresh": _case(
        *_many(130, fresh=True, group_of=lambda k: k % 3),
        groups=(GroupCase(), GroupCase(lr=3e-3, weight_decay=0.1), GroupCase(tensor_lr=True)),
    ),
    "experts-taking-turns": _case(*_EXPERTS, P((64,), period=16), counter=9, calls=3, factored=True),
    # gradients in another order than the parameters: flat buckets filled in reverse
    "gradients-bucketed-in-reverse": _case(
        *(
            P(shape, dtype, layout="bucket-grad", period=period)
            for shape, dtype, period in (
                ((48, 40), "fp32", 40),
                ((64,), "fp32", 16),
                ((24, 3), "bf16", 3),
                ((37,), "fp32", 37),
                ((7, 11), "fp16", 11),
                ((256,), "bf16", 64),
            )
        ),
        counter=5,
        calls=2,
        grad_order="reverse",
    ),
    "gradients-bucketed-in-order-fresh": _case(
        P((48, 40), layout="bucket-grad"),
        P((64,), layout="bucket-grad"),
        P((24, 3), "bf16", layout="bucket-grad"),
        calls=2,
        factored=True,
    ),
    # lifecycle events between steps: storage replaced (a group added: GROUPS_ADDED)
    "storage-replaced-between-steps": _case(
        P((48, 40), period=40),
        P((4, 6, 5, 5), "bf16", period=25),
        P((64,), layout="flat-view", period=16),
        P((8, 3, 3, 3), period=27),
        counter=3,
        calls=3,
        events=((2, "replace-storage"), (3, "channels-last")),
    ),
    # hyperparameters at their edges
    "lr-warmup-from-zero": _case(
        P((256,), period=64),
        P((48, 40), period=40),
        P((24, 3), "bf16", group=1, period=3),
        groups=(GroupCase(), GroupCase(tensor_lr=True, weight_decay=0.1)),
        counter=3,
        calls=3,
        schedule="warmup",
    ),
    "tensor-lr-every-dtype-in-place": _case(
        *(P((64,), group=g, period=16) for g in range(4)),
        groups=tuple(
            GroupCase(lr=3e-3, tensor_lr=d, weight_decay=0.01) for d in ("fp64", "bf16", "fp16", "fp32")
        ),
        counter=3,
        calls=3,
        schedule="lr-in-place",
    ),
    # lr * weight_decay above 1: the decay factor 1 - lr*wd is negative (SPEC 1.8.6 takes it as is)
    "decay-factor-below-zero": _case(
        P((64,), period=16),
        P((48, 40), period=40),
        groups=(GroupCase(lr=0.5, weight_decay=4.0),),
        counter=3,
    ),
    "unfused-with-weight-decay": _case(
        P((48, 40), period=40),
        P((64,), period=16),
        P((24, 3), "bf16", period=3),
        groups=(GroupCase(lr=1e-2, weight_decay=0.1),),
        counter=3,
        calls=2,
        options=("unfused",),
    ),
    # a frozen parameter holding a gradient at the step that learns the codebook (SPEC 1.2.6, 1.6.3)
    "codebook-learned-with-a-frozen-parameter": _case(
        P((4096,), frozen=True),
        P((64,), gradient="signs"),
        P((16, 8), "bf16", frozen=True),
        codebook="learned",
    ),
    "deterministic-steps": _case(
        P((48, 40)),
        P((64,), period=16),
        P((24, 3), "fp16"),
        groups=(GroupCase(weight_decay=0.05),),
        counter=2,
        calls=2,
        deterministic=True,
    ),
    "period-one-substrings-upper-case": _case(
        P((64,)),
        P((48, 40)),
        P((37,), period=37),
        counter=2,
        options=("period_one_substrings",),
        substring="P1.",
    ),
    # the period search's own inputs: near-constant gradients, and periods above the fallback cap
    "near-constant-gradients-fresh": _case(
        P((256,), gradient="near-constant"),
        P((48, 40), gradient="near-constant"),
        P((64, 32), "bf16", gradient="near-constant"),
        P((1024,), "fp16", gradient="near-constant"),
    ),
    "periods-above-the-cap-fresh": _case(P((4, 4096)), P((2, 8192), "bf16"), P((3, 2560))),
    "periods-above-the-cap-state": _case(
        P((8, 4096), period=4096),
        P((16384,), period=16384),
        P((2, 6144), "bf16", period=6144),
        counter=6,
        calls=2,
    ),
    # periods past 65536 (a block larger than one thread block's reduction tile, or than a
    # search kernel's largest candidate): searched (rows of alternating scale), the fallback's
    # trailing dimension (equal squares: no structure), synthesized; one call each
    "periods-past-65536-fresh": _case(
        P((4, 70000), gradient="row-scaled"), P((2, 70000), "bf16", gradient="signs")
    ),
    "periods-past-65536-state": _case(
        P((2, 70000), period=70000), P((140000,), "bf16", period=70000), counter=6
    ),
}

#: A group registered by ``add_param_group`` after steps (SPEC 1.2.7, 1.10.7): its parameters start
#: fresh beside stepped ones, with their own hyperparameters.
GROUPS_ADDED = {
    "group-added-after-steps": _case(
        P((48, 40), period=40),
        P((64,), period=16),
        P((24, 3), "bf16", group=1),
        P((37,), group=1),
        groups=(GroupCase(), GroupCase(lr=3e-3, weight_decay=0.05, tensor_lr=True)),
        counter=4,
        calls=3,
        events=((2, "add-group"),),
        factored=True,
    ),
    "group-added-third-of-three": _case(
        *_many(24, group_of=lambda k: k % 2),
        P((16, 8), "bf16", group=2),
        P((37,), "fp16", group=2),
        groups=(GroupCase(), GroupCase(weight_decay=0.1), GroupCase(lr=1e-2, tensor_lr="fp64")),
        counter=7,
        calls=3,
        events=((3, "add-group"),),
    ),
}

#: Protocols (SPEC 1.10.1, 1.10.3, 1.10.4, 1.2.6): each with frozen parameters first, in the middle
#: and last, in every group, with and without synthesized state.
_FROZEN = (
    P((64,), frozen=True, gradient="none", period=16),
    P((48, 40), period=40),
    P((7, 11), frozen=True, gradient="none"),
    P((24, 3), group=1, frozen=True, gradient="none", period=3),
    P((256,), "bf16", group=1, period=64),
    P((37,), "fp16", group=1, frozen=True, gradient="none"),
)
_TWO_GROUPS = (GroupCase(), GroupCase(lr=3e-3, eps=1e-6, weight_decay=0.05))
PROTOCOL_BOUNDARIES = {
    "closure-zero-grad-inside": _case(*_FROZEN, groups=_TWO_GROUPS, counter=3, calls=2, protocol="closure"),
    "closure-fresh": _case(
        P((48, 40)),
        P((64,), frozen=True, gradient="none"),
        P((256,), "bf16"),
        calls=2,
        protocol="closure",
        factored=True,
    ),
    "grad-scale-unscales": _case(*_FROZEN, groups=_TWO_GROUPS, counter=3, calls=2, protocol="grad-scale"),
    "grad-scale-eps-scale-gradients": _case(
        P((256,), gradient="tiny", period=64),
        P((64,), "fp16", gradient="tiny"),
        P((48, 40), period=40),
        counter=3,
        protocol="grad-scale",
    ),
    "found-inf-changes-nothing": _case(
        *_FROZEN, groups=_TWO_GROUPS, counter=3, calls=2, protocol="found-inf"
    ),
    "found-inf-fresh": _case(P((48, 40)), P((256,), "bf16"), calls=3, protocol="found-inf", factored=True),
    "frozen-with-a-gradient": _case(
        P((64,), frozen=True, period=16),
        P((48, 40), frozen=True),
        P((24, 3), group=1, frozen=True, gradient="none"),
        P((37,), group=1),
        groups=_TWO_GROUPS,
        counter=3,
        calls=2,
    ),
    "frozen-first-in-each-group": _case(
        P((256,), frozen=True, gradient="none", period=64),
        P((48, 40), period=40),
        P((64,), group=1, frozen=True, gradient="none"),
        P((24, 3), group=1, period=3),
        groups=_TWO_GROUPS,
        counter=3,
        calls=2,
    ),
}


def _with_examples(cases: dict):
    def decorate(test):
        for case in reversed(list(cases.values())):
            test = example(case=case)(test)
        return test

    return decorate


def _check(impl, judge, case: InputCase) -> None:
    if case.factored and not impl.has(FACTORED_V):
        case = case.without_factored()
    replay = InputSpaceCase(case)
    judge.assert_comparisons(replay.replay(impl, bitwise=judge.bitwise), case=replay)


# ------------------------------------------------------------------------------------- tests


@pytest.mark.gefen_clause(
    "4.3.10", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "1.10.7", "1.13.8", "5.6", "5.6.13"
)
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@_share_of_profile()
@_with_examples(BOUNDARIES)
@given(case=input_cases())
def test_inputs_match_reference(gefen_impl, gefen_judge, case):
    """Shapes and routing, layouts, dtype mixes, group structures, schedules, step counters and
    gradient patterns, by plain ``step()`` calls."""
    _check(gefen_impl, gefen_judge, case)


@pytest.mark.gefen_clause(
    "4.3.10", "1.10.1", "1.10.3", "1.10.4", "1.10.6", "1.10.11", "1.10.12", "1.2.6", "5.6", "5.6.13"
)
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@_share_of_profile()
@_with_examples(PROTOCOL_BOUNDARIES)
@given(case=input_cases(protocols=("closure", "grad-scale", "found-inf"), frozen_share=3))
def test_protocols_match_reference(gefen_impl, gefen_judge, case):
    """``step(closure)`` with ``zero_grad(set_to_none=True)`` inside the closure, the GradScaler
    protocol (``grad_scale`` unscales; ``found_inf`` changes nothing), frozen parameters anywhere."""
    _check(gefen_impl, gefen_judge, case)


@pytest.mark.gefen_clause("4.3.12", "4.3.10", "1.2", "1.4", "1.5", "1.10.7", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@_share_of_profile(LIFECYCLE_SHARE)
@_with_examples(LIFECYCLE)
@given(case=lifecycle_cases())
def test_lifecycle_matches_reference(gefen_impl, gefen_judge, case):
    """Hundreds of parameters in one step, gradients taking turns and bucketed in reverse, a group
    added and storage replaced between steps, hyperparameters at their edges, the period search's
    own inputs and periods above its fallback cap."""
    _check(gefen_impl, gefen_judge, case)


@pytest.mark.gefen_clause("4.3.12", "1.2.7", "1.10.7", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@_share_of_profile(LIFECYCLE_SHARE)
@_with_examples(GROUPS_ADDED)
@given(case=lifecycle_cases(add_group=True))
def test_group_added_after_steps_matches_reference(gefen_impl, gefen_judge, case):
    """``add_param_group`` between steps: the new group's parameters start fresh beside stepped
    ones and step with the new group's hyperparameters."""
    _check(gefen_impl, gefen_judge, case)

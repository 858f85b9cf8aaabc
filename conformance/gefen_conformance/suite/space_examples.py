"""The explicit examples of the input-space properties (SPEC 4.3.10, 4.3.12): every boundary the
space names, one :class:`~gefen_conformance.workload.space.InputCase` each, by name (the names
show in failure reports). ``test_input_space.py`` runs each table before the drawn examples:

* :data:`BOUNDARIES` (plain calls): sizes at the tile limits, routing options, layouts, dtype
  mixes, group structures, schedules, step counters, gradient patterns and codebooks;
* :data:`PROTOCOL_BOUNDARIES`: closures, ``grad_scale`` and ``found_inf`` with frozen parameters
  anywhere;
* :data:`LIFECYCLE`: parameter counts past a launch's tables, experts taking turns, gradients
  bucketed in reverse, storage replaced, hyperparameters at their edges, the period search's
  inputs;
* :data:`GROUPS_ADDED`: a group registered by ``add_param_group`` after steps.

Sizes at the tile limits are one call from a synthesized state or a fresh one; nothing large
steps twice.
"""

from __future__ import annotations

from gefen_conformance.suite.space_strategies import BETAS, EPS
from gefen_conformance.workload.space import GroupCase, InputCase, ParamCase, divisors

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

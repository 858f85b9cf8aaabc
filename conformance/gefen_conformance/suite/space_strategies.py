"""The strategies of the input-space properties (SPEC 4.3.10, 4.3.12): what hypothesis draws for
``test_input_space.py``, over the case model of :mod:`gefen_conformance.workload.space`.

:func:`input_cases` draws small cases anywhere in the space (plain calls, or the closure and
GradScaler protocols); :func:`lifecycle_cases` draws across the lifecycle's dimensions (many
parameters, gradients taking turns, a group added, storage replaced). The tables of values they
draw from are the module's constants; the explicit examples are in
:mod:`gefen_conformance.suite.space_examples`.
"""

from __future__ import annotations

from hypothesis import strategies as st

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
_GRADIENT_DRAWS = ["normal"] * 5 + "zero zero-half tiny huge none late powers-of-two signs".split()

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
_LIFECYCLE_GRADIENTS = ["normal"] * 4 + "odd-calls even-calls near-constant row-scaled signs none".split()


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

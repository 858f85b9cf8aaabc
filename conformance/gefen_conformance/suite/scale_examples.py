"""The cases of the scale tier and of long runs (SPEC 4.3.16): parameters the size of real models'
embeddings, a step of more than 20,000 parameters, and step counters across the counts where
kernels keep schedules. Each is an input-space case (SPEC 4.3.10), judged as the input space
judges (call by call, SPEC 5.6.13).

* :data:`SCALE` (the ``scale`` tier only): block-path and factored parameters of 2^25 elements (an
  element index formed in fp32 is exact below 2^24 only; a bf16 path and a factored path each
  over the whole), first steps of 2^25 elements whose period search and codebook learning must
  read the whole parameter (one histogram bin past 2^24 counts; statistics that change along the
  parameter), and 20,480 parameters in one step, a zero-element one last.
* :func:`long_life` (the ``scale`` tier only): 10,050 steps from construction.
* :data:`EVERY_TIER` (every tier; small): every step across 1000, 1024, 4096 and 10^4, from a
  synthesized state at the count before; and a zero-element parameter last in its group (an empty
  tensor ending a launch).
"""

from __future__ import annotations

import torch

from gefen_conformance.workload import models, runs
from gefen_conformance.workload.space import GroupCase, InputCase, ParamCase, divisors
from gefen_oracles import native_compare

P = ParamCase
#: Steps of the scale tier's long life from construction: past 1000, 1024, 4096 and 10^4.
LONG_LIFE_STEPS = 10_050
#: Elements of one scale-tier parameter: past 2^24, where fp32 stops counting by one.
LARGE = 1 << 25
#: Parameters in the tier's many-parameter step: past the 16,384 entries of a kernel's handle or
#: metadata table, near the 21,000 that exhausted one (SPEC 4.3.16).
MANY = 20480
_SHAPES = ((64,), (16, 8), (37,), (8, 3, 3, 3), (1,), (128,))
_DTYPES = ("fp32", "bf16", "fp16", "bf16", "fp32", "fp16", "fp16", "fp32")


def _many(count: int) -> tuple:
    """``count`` small parameters of repeating shapes and interleaved dtypes, each from a state of
    its own period, over two groups; a zero-element parameter last."""
    out = []
    for k in range(count - 1):
        shape = _SHAPES[k % len(_SHAPES)]
        n = P(shape).numel
        period = divisors(n)[k % len(divisors(n))]
        out.append(P(shape, _DTYPES[k % len(_DTYPES)], k % 2, period=period))
    out.append(P((0,), "fp32", 1))
    return tuple(out)


SCALE = {
    "block-2^25-bf16-from-state": InputCase(params=(P((LARGE,), "bf16", 0, period=2048),), counter=3),
    "block-2^25-fp32-from-state": InputCase(params=(P((LARGE,), "fp32", 0, period=2048),), counter=3),
    "factored-8192x4096-from-state": InputCase(
        params=(P((8192, 4096), "fp32", 0, period=4096),), factored=True, counter=3
    ),
    "fresh-2^25-one-bin-past-2^24": InputCase(
        params=(P((LARGE,), "fp32", 0, gradient="one-bin"),), codebook="learned"
    ),
    "fresh-2^25-drifting": InputCase(
        params=(P((LARGE,), "fp32", 0, gradient="drifting"),), codebook="learned"
    ),
    "count-20480-last-empty": InputCase(
        params=_many(MANY), groups=(GroupCase(), GroupCase(lr=3e-3, weight_decay=0.1)), counter=5
    ),
}

_SMALL = (
    P((64,), "fp32", 0, period=16),
    P((24, 16), "bf16", 0, period=16),
    P((12, 10), "fp32", 0, period=10),
)
EVERY_TIER = {
    **{
        f"across-{count}": InputCase(
            params=_SMALL, groups=(GroupCase(weight_decay=0.01),), factored=True, counter=count - 2, calls=3
        )
        for count in (1000, 1024, 4096, 10_000)
    },
    "zero-element-last-of-its-group": InputCase(
        params=(*_SMALL, P((0,), "fp32", 0), P((32,), "bf16", 1, period=8), P((0,), "bf16", 1)),
        groups=(GroupCase(), GroupCase(lr=3e-3)),
        counter=4,
        calls=2,
    ),
}


def long_life(make_optimizer, device) -> dict:
    """A fresh optimizer over a 64-element and a 16 x 8 parameter, stepped :data:`LONG_LIFE_STEPS`
    times from construction with power-of-two gradients (every block normalizes exactly, so the
    codebook learned at the first step is exact in every profile) whose exponents' range changes
    every 1000 steps (a codebook learned again at 1000, 4096 or 10^4 steps differs); its native state
    at the end."""
    generator = torch.Generator().manual_seed(7)
    params = [torch.nn.Parameter(torch.zeros(shape, device=device)) for shape in ((64,), (16, 8))]
    optimizer = make_optimizer([("life.bias", params[0]), ("life.weight", params[1])], lr=1e-3)
    for step in range(LONG_LIFE_STEPS):
        widest = 5 + (step // 1000) % 3  # the exponents' range: 5 at the first step, 6 at step 10^4
        for p in params:
            exponents = torch.randint(0, widest, p.shape, generator=generator).float()
            signs = torch.randint(0, 2, p.shape, generator=generator).float() * 2 - 1
            p.grad = (signs * 2.0**-exponents).to(device)
        optimizer.step()
    return runs.native_state(optimizer)


def long_life_problems(impl) -> list:
    """What differs in the exact parts of the native state (counters, periods, the codebook, SPEC
    5.6.11) between the reference's :func:`long_life` and ``impl`` 's."""
    expected = long_life(models.REFERENCE, "cpu")
    observed = long_life(impl.make_optimizer, models.device_for(impl.make_optimizer))
    return native_compare.exact_problems(expected, observed, codebook_exact=True)

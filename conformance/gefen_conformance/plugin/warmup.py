"""The warm-up phase: one-time costs are paid before any scenario and outside every deadline
(SPEC 4.2.11).

A kernel backend pays once per process for things that have nothing to do with its correctness: a C
build or load, a Triton or inductor compile, an autotune, the first import of torch's DTensor
and DCP machinery. Paid inside a rank's timed call, they read as a hang on a busy machine. So a
suite run, before its first test:

* in the test process (each xdist worker): calls the implementation's ``prepare(device)`` hook,
  then runs every optimizer code path the scenarios use once (:data:`CODE_PATHS`: fp32, bf16
  and fp16 parameters, block and, with ``factored-v``, factored second moments; two steps
  each, a tensor lr and weight decay, and the native state dict where declared), and times it
  (the certificate's ``execution.warm_up_s``);
* for the pool's rank processes: has the fork server import the scenario modules and torch's
  lazily imported parts (:mod:`gefen_conformance.plugin.rank_preload`; it is started first, so
  its imports overlap the test process's code paths above), starts the workers the
  largest scenario needs (none when no selected test runs rank bodies: :func:`runs_rank_bodies`),
  and has every rank run :func:`prepare_rank` (the implementation, resolved once in the rank
  process, has its ``prepare`` called on the rank's device) before its first call's deadline starts
  (``gefen_conformance.harness.pool.prepare_workers``);
* torchrun ranks run :func:`prepare_rank` at start-up, before rank 0 starts pytest.

A warm-up that raises does not stop the run: the tests that use the failing code path report
the error; the certificate's notes say what the warm-up hit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

#: (dtype, factored) of every optimizer code path the scenarios use
CODE_PATHS = tuple(
    (dtype, factored)
    for dtype in (torch.float32, torch.bfloat16, torch.float16)
    for factored in (False, True)
)
#: the module the rank processes preload (see :mod:`gefen_conformance.plugin.rank_preload`)
RANK_PRELOAD = ("gefen_conformance.plugin.rank_preload",)
#: the largest scenario of the suite, in ranks: the pool starts this many workers in the warm-up
LARGEST_SCENARIO = 4
#: the fixture every suite test that runs rank bodies takes (a rank resolves the implementation from
#: its spec); a run whose tests take none of these starts no rank worker in the warm-up
RANK_FIXTURES = ("gefen_ranks",)


def runs_rank_bodies(item) -> bool:
    """Whether the suite test ``item`` may run rank bodies (it takes one of :data:`RANK_FIXTURES`)."""
    return any(name in RANK_FIXTURES for name in getattr(item, "fixturenames", ()))


@dataclass
class WarmUp:
    seconds: float = 0.0
    notes: list = field(default_factory=list)


def prepare_hook(impl, device) -> None:
    """The implementation's declared preparation (``Implementation.prepare``), if any."""
    if impl.prepare is not None:
        impl.prepare(torch.device(device))


def _model():
    """A small model with the scenarios' kinds of parameter: a matrix with structured gradients (a
    searched period), a prime-sized vector (the fallback) and a scalar (period 1), in two groups."""
    from gefen_conformance.workload import models

    return models.Model(
        shapes={"matrix": (16, 12), "prime": (37,), "scalar": (1,)},
        groups=(("matrix", "prime"), ("scalar",)),
        init=models.one_stream,
        structured=frozenset({"matrix"}),
        column_period=4,
    )


def exercise(impl) -> list[str]:
    """Run each of :data:`CODE_PATHS` the implementation supports once, two steps (the first
    creates the state), with a tensor lr and weight decay, on the run's device; returns a note per
    code path that raised (the tests that use it report it)."""
    from gefen_conformance.implementations.contract import FACTORED_V, NATIVE_STATE_DICT
    from gefen_conformance.workload import models

    model = _model()
    notes = []
    for dtype, factored in CODE_PATHS:
        if factored and not impl.has(FACTORED_V):
            continue
        label = f"{str(dtype).replace('torch.', '')} {'factored' if factored else 'block'}"
        try:
            params = models.parameters(model, dtype=dtype)
            hypers = ({"lr": torch.tensor(3e-3), "weight_decay": 0.01}, {"lr": 1e-3})
            optimizer = impl.make_optimizer(
                models.param_groups(model, params, hypers), factored_v_2d=factored
            )
            models.train(model, optimizer, params, range(2))
            if impl.has(NATIVE_STATE_DICT):
                optimizer.load_state_dict(optimizer.state_dict())
        except Exception as exc:  # noqa: BLE001 - the scenarios report it with their own checks
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            notes.append(f"warm-up: {impl.name}'s {label} steps raised {type(exc).__name__}: {first}")
    return notes


def warm_up_process(impl, device) -> WarmUp:
    """The test process's warm-up: the hook, then every code path (see the module docstring)."""
    started = time.monotonic()
    notes = []
    try:
        prepare_hook(impl, device)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"warm-up: {impl.name}'s prepare() raised {type(exc).__name__}: {exc}"[:400])
    notes += exercise(impl)
    return WarmUp(time.monotonic() - started, notes)


def begin_pool(impl, workers: int) -> None:
    """Have the pool's rank processes preload the scenario modules and prepare the implementation
    (an ``Implementation``, or its spec, resolved here once) before their first call's deadline;
    with ``workers``, start the pool's fork server now, so that its imports run in its own process
    while this one warms up (:func:`warm_up_process`)."""
    from gefen_conformance.harness import pool
    from gefen_conformance.implementations import registry

    if isinstance(impl, str):
        impl = registry.resolve(impl)
    pool.prepare_workers(RANK_PRELOAD, prepare_rank, (impl,))
    if workers:
        pool.start_server()


def start_workers(workers: int) -> None:
    """Start ``workers`` prepared rank workers now (after :func:`begin_pool`)."""
    from gefen_conformance.harness import pool

    pool.start_workers(workers)


def prepare_rank(impl, *, device) -> None:
    """One rank process's preparation (the pool runs it before the rank's first call on a
    device; a torchrun rank at start-up): the scenario modules imported, then the implementation's
    ``prepare``. ``impl`` arrives as the rank's own resolution of the run's implementation (an
    ``Implementation`` pickles as its spec and is resolved once per process)."""
    import importlib

    for name in RANK_PRELOAD:
        importlib.import_module(name)
    prepare_hook(impl, device)

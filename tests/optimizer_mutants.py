"""The catalogue's optimizer-only mutant ``lr-half-percent-high``, in a module that imports no DCP
code (tests/mutants.py builds its DCP mutants when it is imported, which pulls in
torch.distributed.checkpoint). tests/mutants.py holds the same objects in its catalogue; the
reproducer proofs (tests/test_repro.py, benchmarks/repro_time.py) name them here, so that a replay
imports what an optimizer backend whose DCP adapter loads on first use would, as the reference's does.
"""

from __future__ import annotations

from dataclasses import replace

import gefen_reference as reference
from gefen_conformance.implementations.contract import (
    CPU_BIT_EXACT,
    FACTORED_V,
    NATIVE_STATE_DICT,
    Implementation,
)

OPTIMIZER_CAPS = {NATIVE_STATE_DICT, CPU_BIT_EXACT, FACTORED_V}


def optimizer_mutant(name, make_optimizer) -> Implementation:
    return Implementation(
        name=name, version="mutant", make_optimizer=make_optimizer, capabilities=OPTIMIZER_CAPS
    )


def as_kernel(implementation: Implementation) -> Implementation:
    """The same implementation declared as a kernel backend would: without ``cpu-bit-exact``."""
    return replace(implementation, capabilities=implementation.capabilities - {CPU_BIT_EXACT})


def stepping_with(key: str, change):
    """A reference optimizer whose every step sees ``change(value)`` for each group's ``key``
    (the stored value stays the user's)."""

    def make(params, **hp):
        opt = reference.Gefen(params, **hp)
        original = opt.step

        def step(closure=None):
            saved = [g[key] for g in opt.param_groups]
            for g in opt.param_groups:
                g[key] = change(g[key])
            try:
                return original(closure)
            finally:
                for g, value in zip(opt.param_groups, saved):
                    g[key] = value

        opt.step = step
        return opt

    return make


def _lr_up_half_percent(lr):
    return lr * 1.005


#: Every step applies 1.005 x the group's lr.
mutant_lr_half_percent_high = optimizer_mutant(
    "lr-half-percent-high", stepping_with("lr", _lr_up_half_percent)
)
tolerant_lr_half_percent_high = as_kernel(mutant_lr_half_percent_high)

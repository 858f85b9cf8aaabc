"""Broken implementations derived from the reference, each reintroducing one specific bug.

The suite must fail each of them on the clause its docstring names (tests/test_suite_catches_mutants.py).
They wrap or subclass the reference without patching it, so the reference stays intact in the
same process.
"""

from __future__ import annotations

import math

import torch

import reference
from conformance.implementation import CPU_BIT_EXACT, FACTORED_SECOND_MOMENT, NATIVE_STATE_DICT, Implementation

CAPS = {NATIVE_STATE_DICT, CPU_BIT_EXACT, FACTORED_SECOND_MOMENT}


def _mutant(name, make_optimizer, **kw):
    return Implementation(name=name, version="mutant", make_optimizer=make_optimizer,
                          capabilities=kw.pop("capabilities", CAPS), **kw)


def _betas_rounded_to_fp32(params, **hp):
    """SPEC 1.8.3, 1.8.8: the EMA weights formed as ``1 - fp32(beta)`` (as fused kernels do)
    instead of ``fp32(1 - beta)`` in double."""
    b1, b2 = hp.pop("betas", (0.9, 0.999))
    return reference.Gefen(params, betas=(float(torch.tensor(b1).item()), float(torch.tensor(b2).item())), **hp)


class _StepCountsOnlyGradientSteps(reference.Gefen):
    """SPEC 1.10.6: global step not advanced by a step() without gradients."""

    def step(self, closure=None):
        had = any(p.grad is not None for _, _, p in self.named_params())
        before = self.global_step
        loss = super().step(closure)
        if not had:
            self.global_step = before
        return loss


def _accepts_zero_eps(params, **hp):
    """SPEC 1.1.3: eps=0 silently replaced instead of rejected."""
    if hp.get("eps", 1.0) <= 0 or not math.isfinite(hp.get("eps", 1.0)):
        hp["eps"] = 1e-8
    return reference.Gefen(params, **hp)


beta_rounding = _mutant("beta-rounding", _betas_rounded_to_fp32)
global_step = _mutant("global-step", lambda params, **hp: _StepCountsOnlyGradientSteps(params, **hp))
zero_eps = _mutant("zero-eps", _accepts_zero_eps)

#: A correct implementation that declares fewer capabilities and carries expected failures,
#: one of them stale, to exercise the plugin's bookkeeping.
partial = Implementation(
    name="partial",
    version="1",
    make_optimizer=lambda params, **hp: reference.Gefen(params, **hp),
    capabilities={CPU_BIT_EXACT},
    expected_failures={
        "test_optimizer.py::test_global_step_counts_every_step_call": "pretend known bug (it passes: strict xfail fails)",
        "test_optimizer.py::test_no_such_test": "stale entry",
    },
)

"""The tolerance profile's oracles against the reference itself and the assumptions they rest on
(SPEC 5.6): the reference passes every pinned step of the suite's workload within its bounds, and
a pinned step catches update errors and rounding beyond the allowed precision."""

from __future__ import annotations

import pytest
import torch

import gefen_reference as reference
import gefen_reference.optimizer as optimizer_module
import gefen_reference.steps as steps
from gefen_conformance.workload import runs
from gefen_oracles import pinned_step

from .mutant_tools import clone

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CONFIGS = [
    (0, dict(weight_decay=0.0, tensor_lr=False, factored_v_2d=False)),
    (3, dict(weight_decay=0.05, tensor_lr=True, factored_v_2d=False)),
    (3, dict(weight_decay=0.05, tensor_lr=False, factored_v_2d=True)),
]


def _check(make, dtype, pin_at, kw):
    sd = runs.pinned_state(dtype, pin_at, **kw)
    result = runs.pinned_step(make, dtype, pin_at, sd, **kw)
    return pinned_step.check_step(
        runs.param_steps(sd, result, factored=kw["factored_v_2d"]), sd["gefen_codebook"]
    )


@pytest.mark.parametrize("pin_at,kw", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_passes_its_pinned_steps(dtype, pin_at, kw):
    checks = _check(lambda g, **o: reference.Gefen(g, **o), dtype, pin_at, kw)
    assert checks.ok, checks.problems
    names = {c.what for c in checks}
    for kind in ("second moment", "momentum magnitude", "codeword choice", "parameter update"):
        assert any(kind in n for n in names), (kind, names)
    # every element's update is within its bound (rounding can use all of it, never more)
    assert all(c.error <= c.bound for c in checks)


def _update_times(factor):
    changed = clone(steps, _subtract_flat=lambda param, update: steps._subtract_flat(param, update * factor))
    cls = clone(optimizer_module, block_vmean_step=changed.block_vmean_step).Gefen
    return lambda g, **o: cls(g, **o)


@pytest.mark.parametrize(
    "dtype,factor,caught",
    [
        (torch.float32, 1.005, True),
        (torch.float32, 1.0001, True),
        (torch.float16, 1.005, True),
        (torch.bfloat16, 1.05, True),
        (torch.float32, 1.0 + 2**-22, False),
    ],
)
def test_pinned_step_detects_update_errors_above_its_bound(dtype, factor, caught):
    checks = _check(_update_times(factor), dtype, 3, CONFIGS[1][1])
    assert checks.ok is not caught, checks.problems


def test_pinned_step_rejects_bf16_codewords_for_fp32():
    def codewords_in_bf16(codebook, indices, dtype):
        return codebook[indices.long()].to(torch.bfloat16).to(dtype)

    changed = clone(steps, dequantize=codewords_in_bf16)
    cls = clone(optimizer_module, block_vmean_step=changed.block_vmean_step).Gefen
    checks = _check(lambda g, **o: cls(g, **o), torch.float32, 3, CONFIGS[1][1])
    assert any("codeword choice" in p or "m_codebook" in p or "parameter" in p for p in checks.problems), (
        checks.problems
    )

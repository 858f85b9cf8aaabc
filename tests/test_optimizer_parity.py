"""Differential parity: reference.Gefen vs gefen-x 0.5.0, bit for bit on CPU (SPEC 1.8, 1.9, 1.10, 1.13).

Both optimizers start from identical parameters and see identical gradients; after
every configuration's steps, parameters, every state tensor and counter, the
codebook and the global step must be *bitwise* equal.
"""

from __future__ import annotations

import pytest
import torch

import gefen_reference as reference
from gefen_conformance.workload import models
from gefen_reference.periods import search_period, squared_gradient

from .support import LATE_START, PARITY, parity_hypers, silence_gefenx_warnings

gefen = pytest.importorskip("gefen")
pytestmark = pytest.mark.gefenx

STEPS = 8


def build(cls, dtype, *, tensor_lr, weight_decay, factored, **extra):
    params = models.parameters(PARITY, dtype=dtype)
    if cls is gefen.Gefen:
        extra["fused"] = False
    groups = models.param_groups(
        PARITY, params, parity_hypers(tensor_lr=tensor_lr, weight_decay=weight_decay)
    )
    return params, cls(groups, factored_v_2d=factored, **extra)


def run_pair(dtype, *, factored, weight_decay, tensor_lr, steps=STEPS, **extra):
    silence_gefenx_warnings()
    options = dict(tensor_lr=tensor_lr, weight_decay=weight_decay, factored=factored, **extra)
    pa, theirs = build(gefen.Gefen, dtype, **options)
    pb, ours = build(reference.Gefen, dtype, **options)
    for step in range(steps):
        for params, optimizer in ((pa, theirs), (pb, ours)):
            models.set_gradients(PARITY, params, step)
            optimizer.step()
    return pa, theirs, pb, ours


def assert_bitwise_equal(pa, theirs, pb, ours):
    for n in pa:
        assert pa[n].dtype == pb[n].dtype
        assert torch.equal(pa[n], pb[n]), (
            f"parameter {n} differs (max {(pa[n].float() - pb[n].float()).abs().max()})"
        )
        a, b = theirs.state[pa[n]], ours.state[pb[n]]
        assert set(a) - {"stepsize", "_h_buf"} == set(b), n
        for key, va in a.items():
            if key in ("stepsize", "_h_buf"):
                continue
            vb = b[key]
            if torch.is_tensor(va):
                assert va.dtype == vb.dtype and va.shape == vb.shape, (n, key)
                assert torch.equal(va, vb), f"state {n}.{key} differs"
            else:
                assert type(va) is type(vb) and va == vb, (n, key, va, vb)
    assert theirs._gefen_codebook.dtype == ours.codebook.dtype == torch.float32
    assert torch.equal(theirs._gefen_codebook.view(torch.int32), ours.codebook.view(torch.int32))
    assert theirs._gefen_global_step == ours.global_step == STEPS


def _matrix():
    """Every dtype, path and hyperparameter form: float32 whole and, of the half dtypes, each path
    with each form once in the default run (bf16 with one, fp16 with the other); .ci/run runs the
    rest."""
    forms = [(0.0, False, "wd0-floatlr"), (0.05, True, "wd-tensorlr")]
    for weight_decay, tensor_lr, form in forms:
        for factored, path in ((False, "block"), (True, "factored")):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                default = dtype == torch.float32 or (dtype == torch.bfloat16) == (factored == tensor_lr)
                yield pytest.param(
                    dtype,
                    factored,
                    weight_decay,
                    tensor_lr,
                    id=f"{form}-{path}-{dtype}",
                    marks=() if default else pytest.mark.slow,
                )


@pytest.mark.parametrize("dtype,factored,weight_decay,tensor_lr", list(_matrix()))
def test_bitwise_parity(dtype, factored, weight_decay, tensor_lr):
    assert_bitwise_equal(*run_pair(dtype, factored=factored, weight_decay=weight_decay, tensor_lr=tensor_lr))


def test_parity_covers_searched_fallback_and_period_one():
    """The parity model must exercise every period route, or the parity test proves less than it claims."""
    pa, theirs, pb, ours = run_pair(
        torch.float32, factored=False, weight_decay=0.0, tensor_lr=False, steps=LATE_START + 1
    )
    periods = {n: ours.state[p]["automatic_period"] for n, p in pb.items()}
    grads = {n: models.gradient(PARITY, n, 0) for n in PARITY.shapes}
    first = {n: squared_gradient(g) for n, g in grads.items() if g is not None}
    searched = [n for n, sq in first.items() if len(sq) > 1 and search_period(sq) > 1]
    fallback = [n for n, sq in first.items() if len(sq) > 1 and search_period(sq) == 1 and periods[n] > 1]
    assert searched and fallback, (searched, fallback)
    assert periods["big_prime"] == 1 and periods["scalar"] == 1
    assert "step" in ours.state[pb["late"]] and ours.state[pb["late"]]["step"] == 1


def test_parity_with_forced_period_one_rules():
    pa, theirs, pb, ours = run_pair(
        torch.float32,
        factored=False,
        weight_decay=0.0,
        tensor_lr=False,
        force_1d_period_one=True,
        period_one_substrings=("NARROW",),
    )
    assert ours.state[pb["vector"]]["automatic_period"] == 1
    assert ours.state[pb["narrow"]]["automatic_period"] == 1
    assert_bitwise_equal(pa, theirs, pb, ours)


def test_parity_float64_and_noncontiguous_parameter():
    silence_gefenx_warnings()
    base = torch.randn(24, 16, dtype=torch.float64)
    pa = torch.nn.Parameter(base.clone().t())  # non-contiguous
    pb = torch.nn.Parameter(base.clone().t())
    theirs = gefen.Gefen([pa], fused=False, factored_v_2d=False, weight_decay=0.1)
    ours = reference.Gefen([pb], factored_v_2d=False, weight_decay=0.1)
    gen = torch.Generator().manual_seed(5)
    for _ in range(4):
        g = torch.randn(16, 24, generator=gen, dtype=torch.float64)
        pa.grad, pb.grad = g.clone(), g.clone()
        theirs.step()
        ours.step()
    assert torch.equal(pa, pb)
    for key in ("m_codebook", "m_magnitude", "vmean"):
        assert torch.equal(theirs.state[pa][key], ours.state[pb][key])


def test_global_step_counts_steps_without_gradients():
    p = torch.nn.Parameter(torch.zeros(8))
    opt = reference.Gefen([p])
    opt.step()
    opt.step()
    assert opt.global_step == 2 and opt.codebook is None and "step" not in opt.state[p]
    p.grad = torch.ones(8)
    opt.step()
    assert opt.global_step == 3 and opt.codebook is not None and opt.state[p]["step"] == 1

"""The optimizer against the reference (SPEC Part 1), compared by SPEC 5.3 / 5.6.

* pinned step (``native-state-dict``): the reference's state loaded into the implementation, one
  step on the same parameters and gradient; under ``cpu-bit-exact`` on CPU bitwise against the reference's
  same step, otherwise against exact arithmetic within the stage bounds of SPEC 5.6 (no error
  accumulates, so these are the sharp checks);
* free-running trajectories and state after six steps: bitwise under ``cpu-bit-exact``, otherwise
  at the free-running bounds of SPEC 5.6.10 (every implementation, with or without a native state
  dict, gets these).

The implementation's tensors live on the run's device (``--gefen-device``, SPEC 4.6.2), the
reference's on CPU; every comparison takes CPU copies. Bitwise means ``cpu-bit-exact`` declared
*and* a CPU device (:func:`gefen_conformance.certificate.numeric_profile.bitwise`); the test's judge
(``gefen_judge``) knows which.
"""

from __future__ import annotations

import pytest
import torch

from gefen_conformance.implementations.contract import FACTORED_V, NATIVE_STATE_DICT
from gefen_conformance.suite import optimizer_cases, pinned_steps, reference_side
from gefen_conformance.workload import models
from gefen_oracles import pinned_step
from gefen_oracles.numeric import bitwise_comparison

STEPS = reference_side.STEPS
DTYPES = pinned_steps.DTYPES


@pytest.mark.gefen_clause("1.8", "1.10.1", "1.4", "5.6.10")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "weight_decay,tensor_lr", [(0.0, False), (0.05, True)], ids=["plain", "wd-tensor-lr"]
)
def test_block_step_matches_reference(gefen_impl, gefen_judge, dtype, weight_decay, tensor_lr):
    case = optimizer_cases.trajectory(
        dtype, STEPS, tensor_lr=tensor_lr, weight_decay=weight_decay, factored_v_2d=False
    )
    compared = case.compare(gefen_impl.make_optimizer, bitwise=gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=case.describe())


@pytest.mark.gefen_clause("1.9", "5.6.10")
@pytest.mark.gefen_requires(FACTORED_V)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_factored_step_matches_reference(gefen_impl, gefen_judge, dtype):
    case = optimizer_cases.trajectory(dtype, STEPS, weight_decay=0.05, factored_v_2d=True)
    compared = case.compare(gefen_impl.make_optimizer, bitwise=gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=case.describe())


@pytest.mark.gefen_clause(*pinned_steps.CLAUSES["test_pinned_block_step"])
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("pinned", pinned_steps.of_test("test_pinned_block_step"))
def test_pinned_block_step(gefen_impl, gefen_judge, pinned):
    case = pinned.case()
    compared = case.compare(gefen_impl.make_optimizer, bitwise=gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=case.describe())


@pytest.mark.gefen_clause(*pinned_steps.CLAUSES["test_pinned_factored_step"])
@pytest.mark.gefen_requires(NATIVE_STATE_DICT, FACTORED_V)
@pytest.mark.parametrize("pinned", pinned_steps.of_test("test_pinned_factored_step"))
def test_pinned_factored_step(gefen_impl, gefen_judge, pinned):
    case = pinned.case()
    compared = case.compare(gefen_impl.make_optimizer, bitwise=gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=case.describe())


@pytest.mark.gefen_clause(
    "1.5", "1.6", "1.7", "1.8.8", "1.10.7", "1.11", "1.2.4", "5.6.7", "5.6.10", "1.5.5#4"
)
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize(
    "factored",
    [
        pytest.param(False, id="block"),
        pytest.param(True, id="factored", marks=pytest.mark.gefen_requires(FACTORED_V)),
    ],
)
def test_state_matches_reference(gefen_impl, gefen_judge, factored):
    """Six free-running bf16 steps: the exact rules (periods, counters, names, hyperparameters), the
    codebook (bitwise, or by SPEC 5.6.7 on the reference's step-1 histogram), and the float state."""
    case = optimizer_cases.trajectory(torch.bfloat16, STEPS, judge="state", factored_v_2d=factored)
    compared = case.compare(gefen_impl.make_optimizer, bitwise=gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=case.describe())


@pytest.mark.gefen_clause("1.10.6")
def test_global_step_counts_every_step_call(gefen_impl):
    device = models.device_for(gefen_impl.make_optimizer)
    p = torch.nn.Parameter(torch.zeros(16, device=device))
    opt = gefen_impl.make_optimizer([p], factored_v_2d=False)
    opt.step()
    p.grad = torch.ones(16, device=device)
    opt.step()
    p.grad = None
    opt.step()
    if gefen_impl.has(NATIVE_STATE_DICT):
        sd = opt.state_dict()
        assert sd["gefen_global_step"] == 3
        assert sd["state"][0]["step"] == 1


@pytest.mark.gefen_clause("1.1.2", "1.1.3")
@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": -1.0},
        {"lr": float("nan")},
        {"betas": (1.0, 0.9)},
        {"betas": (0.9, -0.5)},
        {"eps": 0.0},
        {"eps": float("inf")},
        {"weight_decay": -1.0},
        {"lr": torch.tensor([1.0, 2.0])},
    ],
    ids=["lr-neg", "lr-nan", "beta1-one", "beta2-neg", "eps-zero", "eps-inf", "wd-neg", "lr-two-elements"],
)
def test_invalid_hyperparameters_are_rejected(gefen_impl, kwargs):
    device = models.device_for(gefen_impl.make_optimizer)
    with pytest.raises(ValueError):
        gefen_impl.make_optimizer([torch.nn.Parameter(torch.zeros(4, device=device))], **kwargs)


@pytest.mark.gefen_clause("1.3")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_names_and_provenance(gefen_impl):
    device = models.device_for(gefen_impl.make_optimizer)
    a, b, c, d, e = (torch.nn.Parameter(torch.zeros(4, device=device)) for _ in range(5))
    opt = gefen_impl.make_optimizer(
        [
            {"params": [a, b]},
            {"params": [("A", c)], "lr": 1e-4},
            {"params": [d], "name": "Emb"},
            {"params": [e], "name": "emb"},
        ]
    )
    groups = opt.state_dict()["param_groups"]
    assert [g["param_names"] for g in groups] == [
        ["group_0_param_0", "group_0_param_1"],
        ["a"],
        ["emb"],
        ["emb_1"],
    ]
    assert [g["param_names_synthesized"] for g in groups] == [[True, True], [False], [False], [True]]


@pytest.mark.gefen_clause("1.7", "1.8.8", "1.12", "5.6.6", "1.7.1#4")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_nearest_codeword_ties_follow_the_rule(gefen_impl, gefen_judge):
    """With the codebook ``linspace(-1, 1, 256)`` a normalised momentum of exactly 0 lies halfway
    between codewords 127 and 128; the rule sends it to 127, which decides the update's sign.

    The indices are compared exactly in both profiles: every value here is exact in any
    arithmetic (a zero gradient and a zero momentum give exactly 0, a block's one nonzero element
    normalizes to exactly 1), so no rounding can excuse another choice (SPEC 5.6.6)."""

    def run(make):
        device = models.device_for(make)
        p = torch.nn.Parameter(torch.ones(4, 8, device=device))
        opt = make([("w", p)], factored_v_2d=False)
        state = {
            "name": "w",
            "automatic_period": 8,
            "step": 1,
            "vmean_step": 1,
            "m_codebook": torch.zeros(4, 8, dtype=torch.uint8),
            "m_magnitude": torch.zeros(4, 1),
            "vmean": torch.full((4, 1), 1e-4),
        }
        sd = opt.state_dict()
        sd["state"] = {0: state}
        sd["gefen_codebook"] = torch.linspace(-1, 1, 256)
        sd["gefen_global_step"] = 1
        for group in sd["param_groups"]:
            group.pop("_gefen_checkpoint_metadata", None)
        opt.load_state_dict(sd)
        grad = torch.zeros(4, 8)
        grad[:, 0] = 1.0  # one nonzero per block: the other seven normalise to exactly 0
        p.grad = grad.to(device)
        opt.step()
        after = models.state_to_cpu(opt.state_dict())
        hyper = {
            k: float(after["param_groups"][0][k]) for k in ("lr", "beta1", "beta2", "eps", "weight_decay")
        }
        step = pinned_step.ParamStep(
            "w", torch.ones(4, 8), models.to_cpu(p), grad, state, after["state"][0], factored=False, **hyper
        )
        return step, after["state"][0]["m_codebook"].clone()

    reference, reference_indices = run(models.REFERENCE)
    impl, impl_indices = run(gefen_impl.make_optimizer)
    assert int(reference_indices[0, 1]) == 127
    differing = (
        int((impl_indices != reference_indices).sum())
        if impl_indices.shape == reference_indices.shape
        else reference_indices.numel()
    )
    gefen_judge.assert_exact(
        "nearest-codeword ties (indices)",
        differing,
        reference_indices.numel(),
        ["indices differ from the tie rule (ties go to the lower index)"],
    )
    if gefen_judge.bitwise:
        label = "pinned step: parameter update (fp32)"
        gefen_judge.assert_comparisons(bitwise_comparison(label, reference.p1, impl.p1, label="parameter"))
    else:
        gefen_judge.assert_comparisons(pinned_step.check_step([impl], torch.linspace(-1, 1, 256)))

"""The optimizer against the reference, step by step (SPEC Part 1)."""

from __future__ import annotations

import pytest
import torch

from conformance.implementation import CPU_BIT_EXACT, FACTORED_SECOND_MOMENT, NATIVE_STATE_DICT
from oracles.numeric import bitwise_mismatch, tolerance_mismatch

from .workloads import SHAPES, state_mismatches, train, train_reference

STEPS = 6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _parameters_match(impl, ours, theirs):
    bitwise = impl.has(CPU_BIT_EXACT)
    problems = []
    for n in SHAPES:
        check = bitwise_mismatch if bitwise else tolerance_mismatch
        m = check(f"parameter {n}", ours.params[n].detach(), theirs.params[n].detach())
        if m:
            problems.append(str(m))
    return problems


@pytest.mark.clause("1.8", "1.10.1", "1.4")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_decay,tensor_lr", [(0.0, False), (0.05, True)], ids=["plain", "wd-tensor-lr"])
def test_block_step_matches_reference(impl, dtype, weight_decay, tensor_lr):
    kw = dict(tensor_lr=tensor_lr, weight_decay=weight_decay, factored_v_2d=False)
    ours = train_reference(dtype, STEPS, **kw)
    theirs = train(impl.make_optimizer, dtype, STEPS, **kw)
    assert not _parameters_match(impl, ours, theirs), "\n".join(_parameters_match(impl, ours, theirs))


@pytest.mark.clause("1.9")
@pytest.mark.requires(FACTORED_SECOND_MOMENT)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_factored_step_matches_reference(impl, dtype):
    kw = dict(weight_decay=0.05, factored_v_2d=True)
    ours = train_reference(dtype, STEPS, **kw)
    theirs = train(impl.make_optimizer, dtype, STEPS, **kw)
    problems = _parameters_match(impl, ours, theirs)
    assert not problems, "\n".join(problems)


@pytest.mark.clause("1.5", "1.6", "1.7", "1.8.8", "1.10.7", "1.11")
@pytest.mark.requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
def test_state_matches_reference(impl, factored):
    if factored and not impl.has(FACTORED_SECOND_MOMENT):
        pytest.skip(f"{impl.name} lacks capability {FACTORED_SECOND_MOMENT}")
    ours = train_reference(torch.bfloat16, STEPS, factored_v_2d=factored)
    theirs = train(impl.make_optimizer, torch.bfloat16, STEPS, factored_v_2d=factored)
    problems = state_mismatches(ours.optimizer.state_dict(), theirs.optimizer.state_dict(), impl.has(CPU_BIT_EXACT))
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.clause("1.10.6")
def test_global_step_counts_every_step_call(impl):
    p = torch.nn.Parameter(torch.zeros(16))
    opt = impl.make_optimizer([p], factored_v_2d=False)
    opt.step()
    p.grad = torch.ones(16)
    opt.step()
    p.grad = None
    opt.step()
    if impl.has(NATIVE_STATE_DICT):
        sd = opt.state_dict()
        assert sd["gefen_global_step"] == 3
        assert sd["state"][0]["step"] == 1


@pytest.mark.clause("1.1.2", "1.1.3")
@pytest.mark.parametrize(
    "kwargs",
    [{"lr": -1.0}, {"lr": float("nan")}, {"betas": (1.0, 0.9)}, {"betas": (0.9, -0.5)}, {"eps": 0.0},
     {"eps": float("inf")}, {"weight_decay": -1.0}, {"lr": torch.tensor([1.0, 2.0])}],
    ids=["lr-neg", "lr-nan", "beta1-one", "beta2-neg", "eps-zero", "eps-inf", "wd-neg", "lr-two-elements"],
)
def test_invalid_hyperparameters_are_rejected(impl, kwargs):
    with pytest.raises(ValueError):
        impl.make_optimizer([torch.nn.Parameter(torch.zeros(4))], **kwargs)


@pytest.mark.clause("1.3")
@pytest.mark.requires(NATIVE_STATE_DICT)
def test_names_and_provenance(impl):
    a, b, c, d, e = (torch.nn.Parameter(torch.zeros(4)) for _ in range(5))
    opt = impl.make_optimizer(
        [{"params": [a, b]}, {"params": [("A", c)], "lr": 1e-4}, {"params": [d], "name": "Emb"}, {"params": [e], "name": "emb"}]
    )
    groups = opt.state_dict()["param_groups"]
    assert [g["param_names"] for g in groups] == [["group_0_param_0", "group_0_param_1"], ["a"], ["emb"], ["emb_1"]]
    assert [g["param_names_synthesized"] for g in groups] == [[True, True], [False], [False], [True]]


@pytest.mark.clause("1.7", "1.8.8", "1.12")
@pytest.mark.requires(NATIVE_STATE_DICT)
def test_nearest_codeword_ties_follow_the_rule(impl):
    """With the codebook ``linspace(-1, 1, 256)`` a normalised momentum of exactly 0 lies halfway
    between codewords 127 and 128; the rule sends it to 127, which decides the update's sign."""
    import reference

    def run(make):
        p = torch.nn.Parameter(torch.ones(4, 8))
        opt = make([("w", p)], factored_v_2d=False)
        state = {"name": "w", "automatic_period": 8, "step": 1, "vmean_step": 1,
                 "m_codebook": torch.zeros(4, 8, dtype=torch.uint8), "m_magnitude": torch.zeros(4, 1),
                 "vmean": torch.full((4, 1), 1e-4)}
        sd = opt.state_dict()
        sd["state"] = {0: state}
        sd["gefen_codebook"] = torch.linspace(-1, 1, 256)
        sd["gefen_global_step"] = 1
        for group in sd["param_groups"]:
            group.pop("_gefen_checkpoint_metadata", None)
        opt.load_state_dict(sd)
        grad = torch.zeros(4, 8)
        grad[:, 0] = 1.0  # one nonzero per block: the other seven normalise to exactly 0
        p.grad = grad
        opt.step()
        return p.detach().clone(), opt.state_dict()["state"][0]["m_codebook"].clone()

    ours_p, ours_idx = run(lambda params, **hp: reference.Gefen(params, **hp))
    theirs_p, theirs_idx = run(impl.make_optimizer)
    assert int(ours_idx[0, 1]) == 127
    assert torch.equal(theirs_idx, ours_idx), "indices differ from the tie rule (ties go to the lower index)"
    m = bitwise_mismatch("parameter", ours_p, theirs_p) if impl.has(CPU_BIT_EXACT) else tolerance_mismatch("parameter", ours_p, theirs_p)
    assert m is None, str(m)

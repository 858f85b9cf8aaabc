"""The step-by-step oracles of SPEC 5.6.20-5.6.22 (``gefen_oracles.shadowing``) and the restore
comparison's flip allowance (SPEC 5.6.11): a correct run passes, each kind of wrong step fails."""

from __future__ import annotations

import copy

import pytest
import torch

from gefen_conformance.workload import models, runs
from gefen_oracles import checkpoint_compare, kernel_bounds, pinned_step, shadowing

STEPS = 12


@pytest.fixture(scope="module")
def reference_run():
    params, optimizer = runs.built(
        models.REFERENCE,
        models.LONG,
        torch.bfloat16,
        runs.optimizer_hypers(weight_decay=0.05),
        factored_v_2d=True,
    )
    return runs.run_steps(models.LONG, optimizer, params, range(STEPS), record_states=True)


def _check(run):
    return shadowing.check_runs(runs.param_runs(run, factored_v_2d=True), run.states[-1]["gefen_codebook"])


def test_a_correct_run_is_within_every_bound(reference_run):
    out = _check(reference_run)
    assert out.ok, out.problems
    kinds = {c.what for c in out}
    assert {
        "pinned step: factored second moment (bf16)",
        "pinned step: second moment (bf16)",
        "pinned step: parameter update (bf16)",
        "shadowed steps: counters, periods, inactive moments",
    } <= kinds
    assert all(c.error <= c.bound for c in out if c.kind == "tolerance")


def test_a_wrong_update_at_one_step_is_caught(reference_run):
    run = copy.copy(reference_run)
    run.history = {n: list(h) for n, h in reference_run.history.items()}
    t = STEPS - 3
    moved = run.history["v"][t + 1] - run.history["v"][t]
    run.history["v"][t + 1] = (run.history["v"][t] + 1.02 * moved.double()).to(torch.bfloat16)
    out = _check(run)
    assert any("v:" in p and "outside the bound" in p for p in out.problems), out.problems


def test_a_counter_that_does_not_advance_is_caught(reference_run):
    run = copy.copy(reference_run)
    run.states = copy.deepcopy(reference_run.states)
    run.states[5]["state"][1]["step"] -= 1
    out = _check(run)
    assert any("step" in p and "SPEC 1.8.4" in p for p in out.problems), out.problems


@pytest.mark.parametrize(
    "before,key,expected",
    [
        ({}, "vmean_step", 0),
        (
            {"step": 7, "v_row": 1, "factored_step": 7},
            "vmean_step",
            0,
        ),  # factored state: the block moment is created
        ({"step": 7, "vmean": 1}, "vmean_step", 7),  # legacy state without vmean_step
        ({"step": 7, "vmean": 1, "vmean_step": 3}, "vmean_step", 3),
        (
            {"step": 7, "vmean": 1, "vmean_step": 7},
            "factored_step",
            0,
        ),  # block state: the factored moment is created
        ({"step": 7, "v_row": 1, "factored_step": 2}, "factored_step", 2),
    ],
)
def test_moment_counters_after_the_lazy_repairs(before, key, expected):
    assert pinned_step.moment_counter(before, key) == expected


def _restored(momentum: torch.Tensor) -> dict:
    return {
        "slot_00000000.momentum": momentum,
        "slot_00000000.second_moment": momentum.abs(),
        "slot_00000000.step": torch.tensor(3),
    }


@pytest.mark.parametrize(
    "elements,flipped,ok",
    [(192, 2, True), (192, 8, True), (192, 9, False), (4096, 40, True), (4096, 42, False)],
)
def test_restore_flips_allowed(elements, flipped, ok):
    expected = torch.linspace(0.1, 1.0, elements)
    actual = expected.clone()
    actual[:flipped] += 0.01
    out = checkpoint_compare.compare_restores(_restored(expected), _restored(actual), bitwise=False)
    problems = [p for p in out.problems if "beyond rounding" in p]
    assert (not problems) == ok, problems
    assert kernel_bounds.restore_flips_allowed(elements) == max(0.01, 8 / elements)


def _dense(state: dict, codebook: torch.Tensor):
    period = state["automatic_period"]
    m = (codebook[state["m_codebook"].long()] * state["m_magnitude"]).reshape(-1)
    v = state["vmean"].expand(-1, period).reshape(-1).clone()
    return m, v


def test_dense_steps_of_a_correct_block_step_pass_and_a_wrong_block_fails():
    params, optimizer = runs.built(
        models.REFERENCE,
        models.LONG,
        torch.float32,
        runs.optimizer_hypers(weight_decay=0.05),
        factored_v_2d=False,
    )
    run = runs.run_steps(models.LONG, optimizer, params, range(4), record_states=True)
    codebook = run.states[-1]["gefen_codebook"]
    groups = {name: g for g in run.states[-1]["param_groups"] for name in g["param_names"]}
    slots = []
    for pid, name in enumerate(("w", "v", "s")):
        before, after = run.states[2]["state"][pid], run.states[3]["state"][pid]
        m0, v0 = _dense(before, codebook)
        m1, v1 = _dense(after, codebook)
        g = groups[name]
        slots.append(
            dict(
                name=name,
                period=after["automatic_period"],
                p0=run.history[name][2],
                p1=run.history[name][3],
                grad=run.grads[name][2],
                m0=m0,
                v0=v0,
                m1=m1,
                v1=v1,
                step=before["step"],
                vmean_step=before["vmean_step"],
                lr=float(g["lr"]),
                beta1=g["beta1"],
                beta2=g["beta2"],
                eps=g["eps"],
                weight_decay=g["weight_decay"],
            )
        )
    codewords, problems = shadowing.codewords_in_use(
        [s["m0"] for s in slots] + [s["m1"] for s in slots], [s["period"] for s in slots] * 2
    )
    assert not problems and len(codewords) <= 256
    nearest = (codewords.reshape(-1, 1) - codebook.double().reshape(1, -1)).abs().min(dim=1).values
    assert bool(
        (nearest <= 8 * kernel_bounds.U * codewords.abs()).all()
    )  # the codewords in use are codewords
    assert shadowing.dense_steps(slots, codewords).ok
    wrong = [dict(s) for s in slots]
    wrong[1]["v1"] = wrong[1]["v1"] * 1.001  # a second moment off by 0.1%
    assert any("vmean" in p for p in shadowing.dense_steps(wrong, codewords).problems)
    wrong = [dict(s) for s in slots]
    wrong[0]["step"] += 5  # bias corrections from another counter
    assert not shadowing.dense_steps(wrong, codewords).ok

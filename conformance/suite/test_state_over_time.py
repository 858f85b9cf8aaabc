"""State across time (SPEC 4.3.11 items 1-2, 5.6.20, 5.6.21): long trajectories and large counters.

* **Long trajectories.** :data:`gefen_conformance.workload.models.LONG` trained ``LONG_STEPS`` steps in
  bf16 (past 256, where a counter kept in bf16 or in 8 bits stops counting); its 2-D parameter
  takes the factored path when the implementation claims ``factored-v`` (one run then covers both
  paths), the block path otherwise. Under ``cpu-bit-exact`` every step's parameters and the final native state are compared with the
  reference's bit for bit. Otherwise trajectories legitimately drift apart (SPEC 5.6.10), so every
  step is judged from the implementation's own state before it ("shadowing", SPEC 5.6.20): the
  pinned step's stage bounds and update bias, counters, periods and inactive moments exact; the
  final exact rules (counters, periods, names, hyperparameters, global step) against the
  reference; the codebook learned at the first step by SPEC 5.6.7 and frozen afterwards. Without
  ``native-state-dict`` (no state to shadow from) the run is in fp32 and the parameters are held
  to the free-running bounds of SPEC 5.6.10 at ``LONG_STEPS`` steps and their displacement bias
  (SPEC 5.6.21).
* **Synthesized counters.** The pinned step of SPEC 5.6.1 from the reference's fp32 state after three
  steps with its counters replaced by large values (``native-state-dict``): where a counter kept
  in fp32 stops counting (2^24), where an int32 one overflows (2^31), and a block second moment
  whose counter lags the step counter (after a mode switch, SPEC 1.10.8) or is missing (legacy,
  SPEC 1.8.2). Bitwise against the reference's same step, or against exact arithmetic.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from gefen_conformance.certificate import numeric_profile
from gefen_conformance.workload import models as workload
from gefen_conformance.implementations.contract import FACTORED_V, NATIVE_STATE_DICT
from gefen_oracles import codebook_quality, free_running, kernel_bounds, native_compare, pinned_step, shadowing
from gefen_oracles.numeric import Comparisons, bitwise_comparison

from gefen_conformance.suite import margins

DTYPE = torch.bfloat16
UNSHADOWED_DTYPE = torch.float32
HYPERS = workload.optimizer_hypers(weight_decay=0.05)

#: ``(step, vmean_step)`` written into every state of the pinned state after three steps; None
#: removes ``vmean_step`` (a legacy state, repaired to ``step``, SPEC 1.8.2).
COUNTERS = [
    pytest.param((2 ** 24, 2 ** 24), id="fp32-exact-limit"),
    pytest.param((2 ** 31 - 1, 2 ** 31 - 1), id="int32-limit"),
    pytest.param((1000, 3), id="second-moment-lags"),
    pytest.param((1000, None), id="legacy-without-vmean-step"),
]


def _long_run(make_optimizer, factored: bool, record_states: bool, dtype: torch.dtype = DTYPE) -> workload.Run:
    params, optimizer = workload.built(make_optimizer, workload.LONG, dtype, HYPERS, factored_v_2d=factored)
    return workload.run_steps(workload.LONG, optimizer, params, range(workload.LONG_STEPS),
                              record_states=record_states)


def _bitwise_problems(ours: workload.Run, theirs: workload.Run, native: bool) -> list[str]:
    comparisons = Comparisons()
    for name, history in ours.history.items():
        comparisons.add(bitwise_comparison("long trajectory: parameters (bf16, every step)", torch.stack(history),
                                           torch.stack(theirs.history[name]), label=f"{name} (step, element)"))
    if native:
        comparisons.merge(native_compare.compare(workload.native_state(ours.optimizer),
                                                 workload.native_state(theirs.optimizer), bitwise=True,
                                                 grad_dtype=DTYPE))
    return margins.record(comparisons)


def _first_step_histogram(run: workload.Run, state_dict: dict) -> torch.Tensor:
    """The reference's step-1 histogram (SPEC 1.6.4) of the run's first gradients at the periods."""
    names = {pid: name for g in state_dict["param_groups"] for pid, name in zip(g["params"], g["param_names"])}
    pieces = [(run.grads[names[pid]][0], entry["automatic_period"]) for pid, entry in state_dict["state"].items()
              if run.grads[names[pid]][0] is not None and "automatic_period" in entry]
    return codebook_quality.histogram(pieces)


def _shadow_problems(ours: workload.Run, theirs: workload.Run, factored: bool) -> list[str]:
    comparisons = Comparisons()
    expected = workload.native_state(ours.optimizer)
    for p in native_compare.exact_problems(expected, theirs.states[-1], codebook_exact=False):
        comparisons.problem(f"after {workload.LONG_STEPS} steps: {p}")
    codebook = theirs.states[1]["gefen_codebook"]
    comparisons.add(codebook_quality.compare("codebook", expected["gefen_codebook"], codebook,
                                             _first_step_histogram(ours, expected)))
    changed = sum(not native_compare._same_value(codebook, sd["gefen_codebook"]) for sd in theirs.states[2:])
    margins.exact("long trajectory: codebook frozen after the first step", changed, len(theirs.states) - 2)
    if changed:
        comparisons.problem(f"the codebook changed in {changed} of {len(theirs.states) - 2} steps after the first "
                            "(SPEC 1.6.1: it is learned once and frozen)")
    if comparisons.ok:
        comparisons.merge(shadowing.check_runs(workload.param_runs(theirs, factored_v_2d=factored), codebook))
    return margins.record(comparisons)


def _free_running_problems(ours: workload.Run, theirs: workload.Run, dtype: torch.dtype) -> list[str]:
    """SPEC 5.6.21: without a native state, the parameters at the free-running bounds after the run."""
    comparisons = Comparisons()
    gap = codebook_quality.largest_gap(ours.optimizer.codebook)
    groups = {name: g for g in ours.optimizer.param_groups for name in g["param_names"]}
    displacements, systematic = [], 0.0
    for name, history in ours.history.items():
        beta1, beta2 = groups[name]["beta1"], groups[name]["beta2"]
        factor = free_running.momentum_factor(workload.LONG_STEPS, beta1, gap, dtype)
        comparison, moved = free_running.trajectory(name, dtype, history, theirs.history[name][-1], factor)
        comparisons.add(comparison)
        displacements.append(moved)
        bound = kernel_bounds.second_moment(history[0].numel(), dtype, beta2)
        systematic = max(systematic, kernel_bounds.update(dtype, kernel_bounds.stepsize(bound)))
    bias = free_running.displacement_bias(dtype, displacements, systematic)
    if bias is not None:
        comparisons.add(bias)
    return margins.record(comparisons)


@pytest.mark.gefen_clause("4.3.11", "1.8.4", "1.8.5", "1.9.3", "1.10.6", "5.6.20", "5.6.21")
def test_long_trajectory(gefen_impl):
    factored = gefen_impl.has(FACTORED_V)
    native = gefen_impl.has(NATIVE_STATE_DICT)
    bitwise = numeric_profile.bitwise(gefen_impl)
    # without a state to shadow from, fp32: bf16 rounding allows one ulp per step, which over the
    # run would leave no displacement visible to the bias statistic (SPEC 5.6.21)
    dtype = DTYPE if native or bitwise else UNSHADOWED_DTYPE
    ours = _long_run(workload.REFERENCE, factored, record_states=False, dtype=dtype)
    theirs = _long_run(gefen_impl.make_optimizer, factored, record_states=native and not bitwise, dtype=dtype)
    if bitwise:
        problems = _bitwise_problems(ours, theirs, native)
    elif native:
        problems = _shadow_problems(ours, theirs, factored)
    else:
        problems = _free_running_problems(ours, theirs, dtype)
    assert not problems, "\n".join(problems[:20])


@functools.lru_cache(maxsize=1)
def _pinned_after_three() -> dict:
    """The reference's fp32 state after three steps of the pinned workload (made once)."""
    return workload.pinned_state(torch.float32, 3, weight_decay=0.05, factored_v_2d=False)


def _with_counters(state_dict: dict, step: int, vmean_step) -> dict:
    """``state_dict`` (deep-copied) with every stepped state's counters, and the global step, replaced."""
    sd = copy.deepcopy(state_dict)
    for entry in sd["state"].values():
        if "step" not in entry:
            continue
        entry["step"] = step
        if vmean_step is None:
            entry.pop("vmean_step", None)
        else:
            entry["vmean_step"] = vmean_step
    sd["gefen_global_step"] = step
    for group in sd["param_groups"]:
        group.get("_gefen_checkpoint_metadata", {})["global_step"] = step
    return sd


@pytest.mark.gefen_clause("4.3.11", "1.8.2", "1.8.5", "1.12.4", "5.6.1", "5.6.20")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("counters", COUNTERS)
def test_pinned_step_at_synthesized_counters(gefen_impl, counters):
    dtype = torch.float32
    kw = dict(weight_decay=0.05, factored_v_2d=False)
    sd = _with_counters(_pinned_after_three(), *counters)
    theirs = workload.pinned_step(gefen_impl.make_optimizer, dtype, 3, sd, **kw)
    ours = workload.pinned_step(workload.REFERENCE, dtype, 3, sd, **kw)
    if numeric_profile.bitwise(gefen_impl):
        comparisons = native_compare.compare(ours.state_dict, theirs.state_dict, bitwise=True, grad_dtype=dtype)
        for n in workload.OPTIMIZER.shapes:
            comparisons.add(bitwise_comparison(f"pinned step: parameter update ({pinned_step.DTYPE_NAMES[dtype]})",
                                               ours.after[n], theirs.after[n], label=f"parameter {n}"))
    else:
        comparisons = Comparisons()
        for p in native_compare.exact_problems(ours.state_dict, theirs.state_dict, codebook_exact=True):
            comparisons.problem(p)
        if comparisons.ok:
            comparisons.merge(pinned_step.check_step(workload.param_steps(sd, theirs, factored=False),
                                                     sd["gefen_codebook"]))
    problems = margins.record(comparisons)
    assert not problems, "\n".join(problems)

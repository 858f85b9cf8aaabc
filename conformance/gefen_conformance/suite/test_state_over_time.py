"""State across time (SPEC 4.3.11 items 1-2, 5.6.20, 5.6.21): long trajectories and large counters.

* **Long trajectories.** :data:`gefen_conformance.workload.models.LONG` trained ``LONG_STEPS`` steps in
  bf16 (past 256, where a counter kept in bf16 or in 8 bits stops counting); its 2-D parameter
  takes the factored path when the implementation claims ``factored-v`` (one run then covers both
  paths), the block path otherwise. Under ``cpu-bit-exact`` every step's parameters and the final native state
  are compared with the
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

from gefen_conformance.implementations.contract import FACTORED_V, NATIVE_STATE_DICT
from gefen_conformance.suite import optimizer_cases
from gefen_conformance.workload import runs

DTYPE = torch.bfloat16
UNSHADOWED_DTYPE = torch.float32
HYPERS = runs.optimizer_hypers(weight_decay=0.05)

#: ``(step, vmean_step)`` written into every state of the pinned state after three steps; None
#: removes ``vmean_step`` (a legacy state, repaired to ``step``, SPEC 1.8.2).
COUNTERS = [
    pytest.param((2**24, 2**24), id="fp32-exact-limit"),
    pytest.param((2**31 - 1, 2**31 - 1), id="int32-limit"),
    pytest.param((1000, 3), id="second-moment-lags"),
    pytest.param((1000, None), id="legacy-without-vmean-step"),
]


@pytest.mark.gefen_clause("4.3.11", "1.8.4", "1.8.5", "1.9.3", "1.10.6", "5.6.20", "5.6.21")
def test_long_trajectory(gefen_impl, gefen_judge):
    factored = gefen_impl.has(FACTORED_V)
    native = gefen_impl.has(NATIVE_STATE_DICT)
    bitwise = gefen_judge.bitwise
    # without a state to shadow from, fp32: bf16 rounding allows one ulp per step, which over the
    # run would leave no displacement visible to the bias statistic (SPEC 5.6.21)
    dtype = DTYPE if native or bitwise else UNSHADOWED_DTYPE
    case = optimizer_cases.long_trajectory(dtype, HYPERS, native=native, factored_v_2d=factored)
    compared = case.compare(gefen_impl.make_optimizer, bitwise=bitwise)
    gefen_judge.assert_comparisons(compared, inputs=case.describe())


@functools.lru_cache(maxsize=1)
def _pinned_after_three() -> dict:
    """The reference's fp32 state after three steps of the pinned workload (made once)."""
    return runs.pinned_state(torch.float32, 3, weight_decay=0.05, factored_v_2d=False)


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
def test_pinned_step_at_synthesized_counters(gefen_impl, gefen_judge, counters):
    dtype = torch.float32
    kw = dict(weight_decay=0.05, factored_v_2d=False)
    case = optimizer_cases.pinned(dtype, 3, _with_counters(_pinned_after_three(), *counters), **kw)
    compared = case.compare(gefen_impl.make_optimizer, bitwise=gefen_judge.bitwise)
    gefen_judge.assert_comparisons(compared, inputs=case.describe())

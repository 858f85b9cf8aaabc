"""Native loads into optimizers that have already stepped, and migrations between block and
factored second moments (SPEC 4.3.11 items 3-4, 1.12.12, 1.10.8, 1.8.2, 1.9.2).

Every case is judged over several steps after the load, in two ways (SPEC 5.6.20):

* right after the load, the implementation's native state dict is the loaded one bit for bit in
  both profiles (a load copies; the codebook is frozen, SPEC 1.12.8, 5.6.7): whatever it cached
  from before the load must not show;
* each later step: under ``cpu-bit-exact`` the reference's same procedure bit for bit (states and
  every step's parameters); otherwise every step against exact arithmetic from the
  implementation's own state before it (:mod:`gefen_oracles.shadowing`), plus the exact rules
  (counters, periods, names, hyperparameters, global step) against the reference's same
  procedure.

``test_load_into_a_stepped_optimizer``: an optimizer trained two steps on another gradient stream
with other hyperparameters (so its codebook, counters and every table or counter a kernel derived
from them are stale) loads the reference's state after three steps of
:data:`gefen_conformance.workload.models.OPTIMIZER` and continues three steps.

``test_mode_migration``: the reference's state of one mode (block or factored second moments,
SPEC 1.8, 1.9) loads into an optimizer of the other mode, which steps twice (its 2-D parameters
create the other moment at zero with counter 0 and keep the loaded one untouched, SPEC 1.10.8,
1.8.2, 1.9.2); that state loads back into an optimizer of the first mode, which steps twice
(the first moment resumes from its stored value and counter).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from gefen_conformance.implementations.contract import FACTORED_V, NATIVE_STATE_DICT
from gefen_conformance.judging import assert_no_problems
from gefen_conformance.suite import step_checks
from gefen_conformance.workload import models, runs
from gefen_oracles import native_compare, shadowing
from gefen_oracles.numeric import Comparisons, bitwise_comparison

DTYPE = torch.float32
#: The checkpoint: the reference after steps 0-2 of the pinned workload, weight decay 0.05.
CHECKPOINT_STEPS = 3
CHECKPOINT_HYPERS = dict(weight_decay=0.05)
#: What the live optimizer is built with (:func:`_live`: other hyperparameters, a tensor lr) and
#: steps on before it loads (another gradient stream).
LIVE_STEPS = range(2)
CONTINUATION = 3
PHASE_STEPS = 2
MIGRATIONS = [
    pytest.param(False, id="block-to-factored-and-back"),
    pytest.param(True, id="factored-to-block-and-back"),
]


@functools.lru_cache(maxsize=2)
def _checkpoint(factored: bool) -> dict:
    """The reference's native state after ``CHECKPOINT_STEPS`` steps in one mode (made once)."""
    return runs.pinned_state(DTYPE, CHECKPOINT_STEPS, factored_v_2d=factored, **CHECKPOINT_HYPERS)


def _live(make_optimizer, factored: bool, params=None):
    """``(params, optimizer)`` over the pinned workload's start (or ``params``' values), the live
    hyperparameters."""
    values = runs.pinned_start(DTYPE) if params is None else params
    device = models.device_for(make_optimizer)
    params = {n: torch.nn.Parameter(models.to_cpu(t).to(device)) for n, t in values.items()}
    hypers = runs.optimizer_hypers(tensor_lr=True, weight_decay=0.0)
    return params, make_optimizer(
        models.param_groups(models.OPTIMIZER, params, hypers), factored_v_2d=factored
    )


def _loaded_exactly(judge, label: str, loaded: dict, observed: dict) -> list[str]:
    """SPEC 1.12.8, 1.12.12: the state dict right after a load is the loaded one, bit for bit (every
    profile: a load copies)."""
    comparisons = Comparisons()
    for p in native_compare.exact_problems(loaded, observed, codebook_exact=True):
        comparisons.problem(p)
    step_checks.same_tensors(comparisons, "state dict right after a load (bitwise)", loaded, observed)
    return [f"right after the {label}: {p}" for p in judge.record(comparisons)]


def _load(optimizer, state_dict: dict) -> None:
    optimizer.load_state_dict(copy.deepcopy(state_dict))


def _judge(
    judge, reference: runs.TrainingRun, impl: runs.TrainingRun, factored: bool, label: str
) -> list[str]:
    """One continuation after a load: bitwise against the reference's, or shadowed (SPEC 5.6.20)
    with the exact rules against the reference's."""
    expected = runs.native_state(reference.optimizer)
    observed = impl.states[-1] if impl.states else runs.native_state(impl.optimizer)
    if judge.bitwise:
        comparisons = native_compare.compare(expected, observed, bitwise=True, grad_dtype=DTYPE)
        for name, history in reference.history.items():
            comparisons.add(
                bitwise_comparison(
                    "continuation after a load: parameters (fp32, every step)",
                    torch.stack(history),
                    torch.stack(impl.history[name]),
                    label=f"{label}: {name} (step, element)",
                )
            )
        return [f"{label}: {p}" for p in judge.record(comparisons)]
    comparisons = Comparisons()
    for p in native_compare.exact_problems(expected, observed, codebook_exact=True):
        comparisons.problem(f"after {len(impl.steps)} steps: {p}")
    if comparisons.ok:
        comparisons.merge(
            shadowing.check_runs(
                runs.param_runs(impl, factored_v_2d=factored), impl.states[0]["gefen_codebook"]
            )
        )
    return [f"{label}: {p}" for p in judge.record(comparisons)]


@pytest.mark.gefen_clause("4.3.11", "1.12.8", "1.12.12", "2.3.6", "5.6.20")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_load_into_a_stepped_optimizer(gefen_impl, gefen_judge):
    checkpoint = _checkpoint(False)
    shadow = not gefen_judge.bitwise
    problems, trained = [], {}
    for side, make in (("reference", models.REFERENCE), ("impl", gefen_impl.make_optimizer)):
        params, optimizer = _live(make, False)
        models.train(models.other_stream(models.OPTIMIZER), optimizer, params, LIVE_STEPS)
        _load(optimizer, checkpoint)
        if side == "impl":
            problems += _loaded_exactly(
                gefen_judge, "load into a stepped optimizer", checkpoint, runs.native_state(optimizer)
            )
        steps = range(CHECKPOINT_STEPS, CHECKPOINT_STEPS + CONTINUATION)
        trained[side] = runs.run_steps(
            models.OPTIMIZER, optimizer, params, steps, record_states=shadow and side == "impl"
        )
    if not problems:
        label = "after the load"
        problems += _judge(gefen_judge, trained["reference"], trained["impl"], False, label)
    assert_no_problems(problems)


@pytest.mark.gefen_clause("4.3.11", "1.10.8", "1.8.2", "1.9.2", "1.12.8", "5.6.20")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT, FACTORED_V)
@pytest.mark.parametrize("first_mode_factored", MIGRATIONS)
def test_mode_migration(gefen_impl, gefen_judge, first_mode_factored):
    shadow = not gefen_judge.bitwise
    problems = []
    start = {side: _checkpoint(first_mode_factored) for side in ("reference", "impl")}
    values = {side: runs.pinned_start(DTYPE) for side in start}
    step = CHECKPOINT_STEPS
    for phase, factored in enumerate((not first_mode_factored, first_mode_factored)):
        label = f"phase {phase + 1} ({'factored' if factored else 'block'} optimizer)"
        trained = {}
        for side, make in (("reference", models.REFERENCE), ("impl", gefen_impl.make_optimizer)):
            params, optimizer = _live(make, factored, values[side])
            _load(optimizer, start[side])
            if side == "impl":
                problems += _loaded_exactly(
                    gefen_judge, f"load of {label}", start[side], runs.native_state(optimizer)
                )
            trained[side] = runs.run_steps(
                models.OPTIMIZER,
                optimizer,
                params,
                range(step, step + PHASE_STEPS),
                record_states=shadow and side == "impl",
            )
            start[side] = runs.native_state(optimizer)
            values[side] = {n: models.to_cpu(p) for n, p in params.items()}
        if problems:
            break
        problems += _judge(gefen_judge, trained["reference"], trained["impl"], factored, label)
        step += PHASE_STEPS
    assert_no_problems(problems)

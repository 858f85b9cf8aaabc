"""The optimizer's calling protocol (SPEC 4.3.13): how training loops call ``step``, ``zero_grad``,
``state_dict`` and ``load_state_dict``, and change hyperparameters between steps.

Each test is one scenario: a function of one side (:class:`gefen_conformance.suite.protocol.Side`:
parameters and an optimizer over :data:`gefen_conformance.workload.models.OPTIMIZER`, fp32, block
path, the pinned workload's start, SPEC 5.6.1, from the reference's state after three steps or
fresh) that makes the calls. The reference (on CPU) and the implementation (on the run's device)
each run it, and every call of the implementation is judged against the reference's same call
(SPEC 5.6.13; :func:`~gefen_conformance.suite.protocol.compared`):

* exact in both profiles: counters, periods, names, hyperparameters, key sets, dtypes and shapes of
  the state, the codebook and the global step; a parameter that must not step (no gradient, or a
  ``found_inf`` call), its state entry with it, bit for bit unchanged;
* under ``cpu-bit-exact`` on CPU every parameter and state tensor bitwise; otherwise each call as
  a pinned step from the implementation's own state before it, with the hyperparameters the
  reference's groups held at that call.

Besides, each scenario records what the protocol itself promises on the implementation's side
(``side.seen``, exact in both profiles): a closure's loss returned, gradients unscaled in place or
set to None, compact state dict tensors, a load that copies. Every value is a deterministic
function of the scenario and its variant: a failing test's reproducer runs the test again.
"""

from __future__ import annotations

import copy

import pytest
import torch

from gefen_conformance.implementations.contract import NATIVE_STATE_DICT
from gefen_conformance.suite import protocol, step_checks
from gefen_conformance.suite.protocol import SCALE, Side
from gefen_conformance.suite.protocol_variants import (
    CHANGED,
    FOUND_INF,
    GRAD_SCALE_FORMS,
    HYPERPARAMETER_CHANGES,
    LOADED_FORMS,
    LR_WRITES,
    ROUTED,
    TENSOR_HYPERPARAMETERS,
)
from gefen_conformance.workload import runs
from gefen_oracles.numeric import bitwise_comparison, relative_comparison


@pytest.mark.gefen_clause("4.3.13", "1.6.1", "1.6.7", "1.10.1", "5.6.7", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_all_zero_first_gradients_learn_the_padding_codebook(gefen_impl, gefen_judge):
    """All-zero gradients are data: the first step learns the padding codebook, chooses every
    period, creates the state and steps (weight decay applies, counters advance); the next step
    uses that codebook."""

    def zero_then_real_gradients(side: Side) -> None:
        side.step(protocol.zero_grads())
        side.step(protocol.grads(1))

    reference, impl = protocol.run_both(gefen_impl, zero_then_real_gradients, load=False)
    compared = protocol.padding_codebook(reference, impl, gefen_judge.bitwise)
    compared.merge(protocol.compare(reference, impl, gefen_judge.bitwise, codebook_exact=False))
    gefen_judge.assert_comparisons(compared)


@pytest.mark.gefen_clause("4.3.13", "1.10.3", "1.10.6", "1.10.11", "1.10.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", list(FOUND_INF))
def test_found_inf_skips_the_step(gefen_impl, gefen_judge, variant):
    """Any nonzero ``found_inf`` (a sum over devices), with ``grad_scale`` or with None after the
    caller unscaled: nothing changes, the closure ran and its loss is returned; the next call steps."""
    found_inf, scale = FOUND_INF[variant]

    def overflowed_call_then_a_clean_one(side: Side) -> None:
        opt, grads = side.optimizer, protocol.grads(1)
        overflowed = dict(
            grads, vector=grads["vector"].clone().index_fill_(0, torch.tensor([0]), float("inf"))
        )
        loss, ran = torch.tensor(1.5), []

        def closure():
            ran.append(1)
            side.assign(overflowed, scale or 1.0)
            return loss

        opt.grad_scale = None if scale is None else side.tensor(scale)
        opt.found_inf = side.tensor(found_inf)
        returned = side.call(grads, lambda: opt.step(closure), skipped=True)
        side.seen.exact(
            "found_inf: the closure's loss returned",
            int(returned is not loss or len(ran) != 1),
            1,
            [
                f"step(closure) with found_inf {found_inf} ran the closure {len(ran)} time(s) and returned "
                f"{returned!r}, not the closure's loss (SPEC 1.10.11)"
            ],
        )
        later = protocol.grads(2)
        side.assign(later, scale or 1.0)
        opt.found_inf = side.tensor(0.0)
        side.call(later, opt.step)
        del opt.grad_scale, opt.found_inf

    gefen_judge.assert_comparisons(
        protocol.compared(gefen_impl, overflowed_call_then_a_clean_one, gefen_judge.bitwise)
    )


@pytest.mark.gefen_clause("4.3.13", "1.10.3", "1.10.4", "1.10.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", GRAD_SCALE_FORMS)
def test_grad_scale_unscales_the_gradients_in_place(gefen_impl, gefen_judge, variant):
    """After a call under ``grad_scale`` (a tensor, or a Python float) each ``.grad`` is the
    caller's tensor, unscaled (exact: the scale is a power of two)."""

    def call_under_grad_scale(side: Side) -> None:
        opt, grads = side.optimizer, protocol.grads(1)
        given = side.assign(grads, SCALE)
        if variant == "python-float":
            opt.grad_scale, opt.found_inf = SCALE, 0.0
        else:
            opt.grad_scale, opt.found_inf = side.tensor(SCALE), side.tensor(0.0)
        side.call(grads, opt.step)
        del opt.grad_scale, opt.found_inf
        for n, p in side.params.items():
            if p.grad is not given[n]:
                side.seen.problem(f"{n}: .grad after the step is not the tensor the caller set (SPEC 1.10.4)")
            what = "grad_scale: gradients unscaled in place"
            side.seen.add(bitwise_comparison(what, grads[n], given[n], label=f"{n}.grad after the step"))

    gefen_judge.assert_comparisons(protocol.compared(gefen_impl, call_under_grad_scale, gefen_judge.bitwise))


@pytest.mark.gefen_clause("4.3.13", "1.10.4", "1.10.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_a_scale_that_is_no_power_of_two_unscales_by_its_fp32_inverse(gefen_impl, gefen_judge):
    """GradScaler takes any ``init_scale`` and growth factor: under ``grad_scale = 3 * 2^9`` each
    ``.grad`` becomes ``grad * r32(1 / S)`` in place (SPEC 1.10.4), the gradient the step uses.
    Bitwise under torch-exact; under tolerance within one fp32 rounding of it (a kernel that
    divides by ``S``), never an inverse formed in a narrower type."""
    scale = 3.0 * 2.0**9
    inverse = torch.tensor(1.0 / scale, dtype=torch.float64).float()

    def call_under_an_odd_scale(side: Side) -> None:
        opt, grads = side.optimizer, protocol.grads(1)
        given = side.assign(grads, scale)
        unscaled = {n: None if g is None else (g * scale) * inverse for n, g in grads.items()}
        opt.grad_scale, opt.found_inf = side.tensor(scale), side.tensor(0.0)
        side.call(unscaled, opt.step)
        del opt.grad_scale, opt.found_inf
        what = "grad_scale 1536: gradients unscaled by r32(1/S)"
        for n, g in unscaled.items():
            if g is None:
                continue
            if gefen_judge.bitwise:
                side.seen.add(bitwise_comparison(what, g, given[n], label=f"{n}.grad after the step"))
            else:
                side.seen.add(
                    relative_comparison(what, g, given[n], 2.0**-23, label=f"{n}.grad after the step")
                )

    gefen_judge.assert_comparisons(
        protocol.compared(gefen_impl, call_under_an_odd_scale, gefen_judge.bitwise)
    )


@pytest.mark.gefen_clause("4.3.13", "1.10.11", "1.2.6", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", ["set-to-none", "zeros-in-place"])
def test_zero_grad_then_some_parameters_get_no_gradient(gefen_impl, gefen_judge, variant):
    """``zero_grad()`` leaves no gradient, so a parameter that gets none afterwards does not step;
    ``zero_grad(set_to_none=False)`` leaves zeros, and a zero gradient steps."""
    to_none = variant == "set-to-none"

    def step_zero_grad_then_some_gradients(side: Side) -> None:
        side.step(protocol.grads(1))
        if to_none:
            side.optimizer.zero_grad()
            wrong = [n for n, p in side.params.items() if p.grad is not None]
            what, held = "zero_grad()", "a gradient, not None"
        else:
            side.optimizer.zero_grad(set_to_none=False)
            wrong = [n for n, p in side.params.items() if p.grad is None or bool(p.grad.any())]
            what, held = "zero_grad(set_to_none=False)", "no zero gradient"
        side.seen.exact(what, len(wrong), len(side.params), [f"after {what} {', '.join(wrong)} hold {held}"])
        later = {
            n: g if n in ROUTED else (None if to_none else torch.zeros_like(g))
            for n, g in protocol.grads(2).items()
        }
        for n in ROUTED:
            side.params[n].grad = later[n].to(side.params[n].device)
        side.call(later, side.optimizer.step)

    gefen_judge.assert_comparisons(
        protocol.compared(gefen_impl, step_zero_grad_then_some_gradients, gefen_judge.bitwise)
    )


@pytest.mark.gefen_clause("4.3.13", "1.10.1", "1.10.11", "5.6.13", "1.10.1#1")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", ["top-level", "inside-no-grad"])
def test_closure_runs_forward_and_backward(gefen_impl, gefen_judge, variant):
    """The closure runs under ``enable_grad`` whatever the caller's grad mode; the step uses the
    gradients its ``backward()`` made and returns its loss (``sum(p * w)``: the gradient is ``w``
    exactly)."""

    def step_with_a_closure(side: Side) -> None:
        opt, params, grads = side.optimizer, side.params, protocol.grads(1)
        weights = {n: g.to(params[n].device) for n, g in grads.items()}
        losses = []

        def closure():
            opt.zero_grad()
            loss = sum((p * weights[n]).sum() for n, p in params.items())
            loss.backward()
            losses.append(loss)
            return loss

        def call():
            if variant == "inside-no-grad":
                with torch.no_grad():
                    return opt.step(closure), torch.is_grad_enabled()
            return opt.step(closure), torch.is_grad_enabled()

        returned, enabled_after = side.call(grads, call)
        wrong = []
        if len(losses) != 1 or returned is not losses[0]:
            wrong.append(f"step(closure) returned {returned!r}, not the closure's loss")
        if enabled_after != (variant != "inside-no-grad"):
            wrong.append(f"grad mode after step is {enabled_after}, not the caller's")
        side.seen.exact("closure: forward and backward inside step", len(wrong), 2, wrong)

    gefen_judge.assert_comparisons(protocol.compared(gefen_impl, step_with_a_closure, gefen_judge.bitwise))


@pytest.mark.gefen_clause("4.3.13", "1.10.13", "1.12.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", list(HYPERPARAMETER_CHANGES))
def test_hyperparameter_change_alone_takes_effect(gefen_impl, gefen_judge, variant):
    """beta1, beta2, eps or weight decay changed in every group (or other betas loaded) with the
    lr unchanged: the next step uses the new values."""

    def step_change_step(side: Side) -> None:
        side.step(protocol.grads(1))
        HYPERPARAMETER_CHANGES[variant](side.optimizer)
        side.step(protocol.grads(2))

    gefen_judge.assert_comparisons(protocol.compared(gefen_impl, step_change_step, gefen_judge.bitwise))


@pytest.mark.gefen_clause("4.3.13", "1.4.2", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", list(LR_WRITES))
def test_tensor_lr_written_through_an_alias_takes_effect(gefen_impl, gefen_judge, variant):
    """A tensor lr halved through ``.data`` or a DLPack alias (its version counter unchanged) is
    the next step's lr (gefen-x 0.5.0 keeps the old one: SPEC 1.14 D16)."""

    def step_halve_the_lr_step(side: Side) -> None:
        side.step(protocol.grads(1))
        LR_WRITES[variant](side.optimizer.param_groups[0]["lr"])
        side.step(protocol.grads(2))

    gefen_judge.assert_comparisons(protocol.compared(gefen_impl, step_halve_the_lr_step, gefen_judge.bitwise))


@pytest.mark.gefen_clause("4.3.13", "1.11.5", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_state_dict_tensors_are_compact(gefen_impl, gefen_judge):
    """Every tensor ``state_dict()`` returns owns its storage: no view into a larger buffer."""

    def two_steps_each_inspected(side: Side) -> None:
        for call in (1, 2):
            side.step(protocol.grads(call))
            protocol.compact(side.seen, f"after call {call}", side.optimizer.state_dict())

    gefen_judge.assert_comparisons(
        protocol.compared(gefen_impl, two_steps_each_inspected, gefen_judge.bitwise)
    )


@pytest.mark.gefen_clause("4.3.13", "1.12.8", "1.12.9", "1.12.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_load_copies_the_callers_state(gefen_impl, gefen_judge):
    """After a load, changing the caller's dict leaves the optimizer as loaded, and steps leave the
    caller's dict as it was (gefen-x 0.5.0 keeps the caller's tensors: SPEC 1.14 D17)."""

    def load_change_the_dict_step(side: Side) -> None:
        sd, kept = protocol.checkpoint(), protocol.checkpoint()
        side.optimizer.load_state_dict(sd)
        for t in protocol.state_tensors(sd):
            t.add_(1)
        what = "the state after a load, the caller's dict changed since"
        step_checks.same_tensors(side.seen, what, kept, runs.native_state(side.optimizer))
        for t, k in zip(protocol.state_tensors(sd), protocol.state_tensors(kept)):
            t.copy_(k)
        side.step(protocol.grads(1))
        step_checks.same_tensors(side.seen, "the caller's dict after a load and a step", kept, sd)

    gefen_judge.assert_comparisons(
        protocol.compared(gefen_impl, load_change_the_dict_step, gefen_judge.bitwise, load=False)
    )


@pytest.mark.gefen_clause("4.3.13", "1.10.13", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", TENSOR_HYPERPARAMETERS)
def test_tensor_hyperparameter_changed_in_place_takes_effect(gefen_impl, gefen_judge, variant):
    """A beta, eps or weight decay held as a tensor and changed in place between steps: the next
    step uses the new value (a cache keyed on the tensor's identity does not)."""

    def step_fill_step(side: Side) -> None:
        groups = side.optimizer.param_groups
        for group in groups:
            group[variant] = torch.tensor(float(group[variant]), dtype=torch.float64)
        side.step(protocol.grads(1))
        for group in groups:
            group[variant].fill_(CHANGED[variant](float(group[variant])))
        side.step(protocol.grads(2))

    gefen_judge.assert_comparisons(protocol.compared(gefen_impl, step_fill_step, gefen_judge.bitwise))


@pytest.mark.gefen_clause("4.3.13", "1.11.2", "1.12.3", "1.12.4", "1.12.8", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", list(LOADED_FORMS))
def test_load_of_another_checkpoint_form(gefen_impl, gefen_judge, variant):
    """Counters as one-element tensors become Python ints; renumbered ids and named groups map by
    position; column-major state tensors load by value; caller keys in groups are kept. The
    counters are inspected after the load and after each of two steps."""

    def load_the_form_then_two_steps(side: Side) -> None:
        for k, group in enumerate(side.optimizer.param_groups):
            group["name"] = f"group{k}"
        side.optimizer.load_state_dict(LOADED_FORMS[variant](protocol.checkpoint()))
        protocol.int_counters(side.seen, "after the load", side.optimizer.state_dict())
        for call in (1, 2):
            side.step(protocol.grads(call))
            protocol.int_counters(side.seen, f"after call {call}", side.optimizer.state_dict())

    gefen_judge.assert_comparisons(
        protocol.compared(gefen_impl, load_the_form_then_two_steps, gefen_judge.bitwise, load=False)
    )


@pytest.mark.gefen_clause("4.3.13", "1.12.13", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_load_pre_hook_result_is_loaded(gefen_impl, gefen_judge):
    """A load pre-hook that returns a changed dict (torch's ``Optimizer`` hook contract: the returned
    dict is the one loaded; here group 0's lr halved): that dict is the one loaded."""

    def lr_halved(optimizer, state_dict: dict) -> dict:
        changed = copy.copy(state_dict)
        changed["param_groups"] = [dict(g) for g in state_dict["param_groups"]]
        lr = changed["param_groups"][0]["lr"]
        changed["param_groups"][0]["lr"] = (
            lr * 0.5 if not torch.is_tensor(lr) else lr.detach().clone().mul_(0.5)
        )
        return changed

    def load_through_the_hook_then_two_steps(side: Side) -> None:
        side.optimizer.register_load_state_dict_pre_hook(lr_halved)
        side.optimizer.load_state_dict(protocol.checkpoint())
        for call in (1, 2):
            side.step(protocol.grads(call))

    gefen_judge.assert_comparisons(
        protocol.compared(gefen_impl, load_through_the_hook_then_two_steps, gefen_judge.bitwise, load=False)
    )

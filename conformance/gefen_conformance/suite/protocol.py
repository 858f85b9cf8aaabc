"""What the calling-protocol scenarios share (SPEC 4.3.13, 5.6.13): each side of a scenario, the
record of its calls, and the comparison of the implementation's calls with the reference's.

A scenario is a function of one :class:`Side` (its parameters and optimizer over
:data:`gefen_conformance.workload.models.OPTIMIZER`, fp32, block path, at the pinned start, SPEC
5.6.1, with the reference's state after three steps loaded or fresh) that makes its calls through
:meth:`Side.call` or :meth:`Side.step`; :func:`run_both` runs it on the reference's side (CPU) and
on the implementation's (the run's device), and :func:`compare` judges the implementation's side
(:func:`compared` does both):

* what that side observed of the protocol itself (``Side.seen``: a closure's loss returned,
  gradients unscaled in place, compact state dict tensors, a load that copies; exact in both
  profiles);
* every call against the reference's same call (:func:`compare_calls`): exact in both profiles
  the counters, periods, names, hyperparameters, key sets, dtypes and shapes of the state, the
  codebook and the global step, and a parameter that must not step (no gradient, or a
  ``found_inf`` call) bit for bit unchanged with its state entry; under ``cpu-bit-exact`` on CPU
  every parameter and state tensor bitwise, otherwise each call as a pinned step from the
  implementation's own state before it, with the hyperparameters the reference's groups held at
  that call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gefen_conformance.implementations.contract import Implementation
from gefen_conformance.suite import reference_side, step_checks
from gefen_conformance.workload import models, runs
from gefen_oracles import codebook_quality, pinned_step
from gefen_oracles.numeric import Comparisons, bitwise_comparison

DTYPE = torch.float32
#: The reference's state after these steps of the pinned workload is what most scenarios load.
CHECKPOINT_STEPS = 3
#: The pinned workload's hyperparameters: a tensor lr and weight decay in group 0, float lr, betas
#: (0.8, 0.99) and eps 1e-6 in group 1.
HYPERS = dict(tensor_lr=True, weight_decay=0.05)
OPTIONS = {"factored_v_2d": False}
#: GradScaler's scale: a power of two, so unscaling is exact in any arithmetic (SPEC 1.10.12).
SCALE = 2.0**10
#: The counters of a native state dict (SPEC 1.12.4 item 1).
COUNTERS = ("step", "vmean_step", "factored_step")


def checkpoint() -> dict:
    """The reference's native state after ``CHECKPOINT_STEPS`` steps (a fresh deep copy)."""
    return reference_side.pinned_state(DTYPE, CHECKPOINT_STEPS, **HYPERS, **OPTIONS)


def grads(call: int) -> dict:
    """``{name: gradient}`` of the workload for ``call`` (1, 2, ...) after the checkpoint (CPU)."""
    step = CHECKPOINT_STEPS + call - 1
    return {n: models.gradient(models.OPTIMIZER, n, step, dtype=DTYPE) for n in models.OPTIMIZER.shapes}


def zero_grads() -> dict:
    """``{name: zeros}`` of every parameter of the workload (CPU)."""
    return {n: torch.zeros(shape, dtype=DTYPE) for n, shape in models.OPTIMIZER.shapes.items()}


@dataclass
class Call:
    """One ``step()`` call: ``grads[name]`` the unscaled gradient it must step with (CPU, or None),
    the parameters and native state before and after it (CPU copies), the groups' values when it
    was made, whether ``found_inf`` was set."""

    grads: dict
    before: dict
    after: dict
    state_before: dict
    state_after: dict
    hypers: list
    skipped: bool = False


@dataclass
class Side:
    """One side of a scenario: its parameters and optimizer on ``device``, its calls, what it
    observed of the protocol itself (``seen``), and what it raised (the implementation's side:
    the scenario stopped there)."""

    params: dict
    optimizer: Any
    device: torch.device
    calls: list = field(default_factory=list)
    seen: Comparisons = field(default_factory=Comparisons)
    raised: str | None = None

    @classmethod
    def build(cls, make_optimizer, *, load: bool = True) -> Side:
        """The workload's parameters at the pinned start and an optimizer over them, the checkpoint
        loaded (``load``) or fresh."""
        params, optimizer = runs.built_from(
            make_optimizer,
            models.OPTIMIZER,
            runs.pinned_start(DTYPE),
            runs.optimizer_hypers(**HYPERS),
            **OPTIONS,
        )
        if load:
            optimizer.load_state_dict(checkpoint())
        return cls(params, optimizer, models.device_for(make_optimizer))

    def tensor(self, value: float) -> torch.Tensor:
        """A one-element tensor of ``value`` on this side's device (as GradScaler hands them)."""
        return torch.tensor(value, device=self.device)

    def assign(self, grads: dict, scale: float = 1.0) -> dict:
        """Every parameter's ``.grad``: ``grads[name] * scale`` on its device, or None; returns them."""
        for n, p in self.params.items():
            g = grads.get(n)
            p.grad = None if g is None else (g * scale).to(p.device)
        return {n: p.grad for n, p in self.params.items()}

    def call(self, grads: dict, make: Callable[[], Any], *, skipped: bool = False) -> Any:
        """Make one call (``make()`` calls ``step``), recording it; returns what ``make`` returned."""
        before = {n: models.to_cpu(p) for n, p in self.params.items()}
        state_before = runs.native_state(self.optimizer)
        hypers = [models.group_hypers(g) for g in self.optimizer.param_groups]
        returned = make()
        after = {n: models.to_cpu(p) for n, p in self.params.items()}
        self.calls.append(
            Call(grads, before, after, state_before, runs.native_state(self.optimizer), hypers, skipped)
        )
        return returned

    def step(self, grads: dict) -> None:
        """A plain call with ``grads``."""
        self.assign(grads)
        self.call(grads, self.optimizer.step)


def run_both(impl: Implementation, scenario: Callable[[Side], Any], *, load: bool = True) -> tuple:
    """``(reference, impl)``: the sides of ``scenario`` run by the reference and by the
    implementation ``impl``, each from :meth:`Side.build`. An exception on the implementation's side
    is its finding (``raised``); one on the reference's is the suite's own failure."""
    reference = Side.build(models.REFERENCE, load=load)
    scenario(reference)
    side = None
    try:
        side = Side.build(impl.make_optimizer, load=load)
        scenario(side)
    except Exception as exc:  # the protocol failed outright: that is the finding
        side = side or Side({}, None, models.device_for(impl.make_optimizer))
        side.raised = f"{type(exc).__name__}: {exc}"
    return reference, side


def compare(reference: Side, impl: Side, bitwise: bool, *, codebook_exact: bool = True) -> Comparisons:
    """What the implementation's side observed of the protocol, then each of its calls against the
    reference's (:func:`compare_calls`); the implementation's exception alone when it raised."""
    out = Comparisons()
    if impl.raised is not None:
        out.problem(f"the implementation raised {impl.raised}")
        return out
    out.merge(impl.seen)
    out.merge(compare_calls(reference, impl, bitwise, codebook_exact=codebook_exact))
    return out


def compared(
    impl: Implementation, scenario: Callable[[Side], Any], bitwise: bool, *, load: bool = True
) -> Comparisons:
    """``scenario`` run by the reference and by the implementation ``impl`` (:func:`run_both`), the
    implementation's side judged against the reference's (:func:`compare`)."""
    reference, side = run_both(impl, scenario, load=load)
    return compare(reference, side, bitwise)


def compare_calls(reference: Side, impl: Side, bitwise: bool, *, codebook_exact: bool = True) -> Comparisons:
    """Each call of the implementation against the reference's same call (SPEC 5.6.13); the first
    call whose exact rules differ ends the comparison."""
    out = Comparisons()
    if len(impl.calls) != len(reference.calls):
        out.problem(f"{len(impl.calls)} calls recorded, expected {len(reference.calls)}")
    for k, (reference_call, impl_call) in enumerate(zip(reference.calls, impl.calls), 1):
        _, exact = step_checks.exact_rules(
            out,
            k,
            len(reference.calls),
            reference_call.skipped,
            reference_call.state_after,
            impl_call.state_after,
            codebook_exact=codebook_exact,
        )
        if exact:
            break
        steps = []
        for g, group in enumerate(reference_call.state_after["param_groups"]):
            for pid, name in zip(group["params"], group["param_names"]):
                entry_before = impl_call.state_before["state"].get(pid, {"name": name})
                entry_after = impl_call.state_after["state"][pid]
                grad = None if reference_call.skipped else reference_call.grads.get(name)
                if grad is None:
                    what = (
                        "found_inf: nothing changes" if reference_call.skipped else "no gradient: no change"
                    )
                    before, after = impl_call.before[name], impl_call.after[name]
                    step_checks.unchanged(out, what, name, before, after, entry_before, entry_after)
                elif bitwise:
                    what = "calling protocol: parameters and state (fp32)"
                    step_checks.same_step(
                        out,
                        what,
                        name,
                        reference_call.after[name],
                        impl_call.after[name],
                        reference_call.state_after["state"][pid],
                        entry_after,
                    )
                else:
                    hypers = reference_call.hypers[g]
                    steps.append(
                        step_checks.pinned(
                            impl_call, name, name, grad, entry_before, entry_after, hypers, factored=False
                        )
                    )
        if steps:
            out.merge(pinned_step.check_step(steps, impl_call.state_after["gefen_codebook"]))
    return out


# ------------------------------------------------------------------ what the protocol promises


def padding_codebook(reference: Side, impl: Side, bitwise: bool) -> Comparisons:
    """The codebook the first call learned from all-zero gradients: the padding codebook of SPEC
    1.6.7 (the reference's), judged bitwise or by SPEC 5.6.7 on the zero gradients' histogram,
    then frozen (SPEC 1.6.1)."""
    out = Comparisons()
    if impl.raised is not None:
        return out
    learned = reference.calls[0].state_after["gefen_codebook"]
    impl_learned = [c.state_after["gefen_codebook"] for c in impl.calls]
    if learned is None or float(learned[1]) != 1.0 / 4096:
        out.problem("the reference did not learn the padding codebook of SPEC 1.6.7")
    what = "codebook learned from all-zero gradients"
    if bitwise:
        out.add(bitwise_comparison(what, learned, impl_learned[0], label=f"{what} (SPEC 1.6.7)"))
    else:
        shapes = models.OPTIMIZER.shapes
        pieces = [
            (torch.zeros(shapes[e["name"]], dtype=DTYPE).reshape(-1), e["automatic_period"])
            for e in reference.calls[0].state_after["state"].values()
        ]
        compared = codebook_quality.compare(
            what, learned, impl_learned[0], codebook_quality.histogram(pieces)
        )
        compared.problems = [f"{p} (SPEC 1.6.7)" for p in compared.problems]
        out.add(compared)
    if out.ok:
        out.add(bitwise_comparison("codebook frozen after it was learned", impl_learned[0], impl_learned[-1]))
    return out


def compact(out: Comparisons, label: str, sd: dict) -> None:
    """SPEC 1.11.5: every state tensor and the codebook of ``sd`` own their storage."""
    loose = []
    tensors = [("gefen_codebook", sd.get("gefen_codebook"))] + [
        (f"state[{e.get('name', pid)}].{k}", v) for pid, e in sd["state"].items() for k, v in e.items()
    ]
    tensors = [(where, t) for where, t in tensors if torch.is_tensor(t)]
    for where, t in tensors:
        if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            loose.append(f"{label}: {where} is a view into {t.untyped_storage().nbytes()} bytes of storage")
    out.exact("state_dict(): compact tensors", len(loose), len(tensors), loose)


def int_counters(out: Comparisons, label: str, sd: dict) -> None:
    """SPEC 1.12.4 item 1: every counter of the state dict ``sd`` a Python int."""
    found = [
        (f"state[{e.get('name', pid)}].{k}", e[k])
        for pid, e in sd["state"].items()
        for k in COUNTERS
        if k in e
    ]
    found.append(("gefen_global_step", sd.get("gefen_global_step")))
    wrong = [
        f"{label}: {where} is {type(v).__name__} {v!r}, not a Python int"
        for where, v in found
        if type(v) is not int
    ]
    out.exact("counters are Python ints", len(wrong), len(found), wrong)


def state_tensors(sd: dict) -> list:
    """The codebook and every state tensor of a native state dict, in a fixed order."""
    return [sd["gefen_codebook"]] + [
        v for e in sd["state"].values() for v in e.values() if torch.is_tensor(v)
    ]

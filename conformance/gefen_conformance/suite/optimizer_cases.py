"""The optimizer comparisons of the suite: each case holds its inputs and judges both sides on them
(SPEC 5.6).

A case holds every input of one comparison of an implementation with the reference: the pinned
native state (a pinned step), the parameters it starts from, the gradients of each step, the
groups and their hyperparameters, the constructor's other keywords. :meth:`compare` runs both
sides on those inputs (the implementation's on the run's device, the reference's on CPU) and
judges them, bitwise or by the stage bounds of SPEC 5.6, returning the oracles'
:class:`~gefen_oracles.numeric.Comparisons`; :meth:`describe` says the inputs in words (a failed
test's ``input`` in the certificate). The suite tests build their cases from the workload
(:func:`pinned`, :func:`trajectory`, :func:`long_trajectory`) and judge them with the test's judge
(:meth:`gefen_conformance.judging.Judge.assert_comparisons`). The inputs are deterministic, so a
failing test's reproducer names the test and ``gefen-conformance repro`` runs it again (SPEC
4.5.6).

* :class:`PinnedCase` (SPEC 5.6.1-5.6.9): one step from a loaded state; bitwise against the
  reference's same step, or against exact arithmetic, with the exact rules in both profiles;
* :class:`TrajectoryCase` (SPEC 5.6.10): free-running steps from a common start, judged on the
  parameters after the last step (``judge="parameters"``) or on the native state
  (``judge="state"``);
* :class:`LongCase` (SPEC 4.3.11, 5.6.20, 5.6.21): a long trajectory, bitwise, shadowed step by
  step, or at the free-running bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gefen_conformance.workload import models, runs
from gefen_oracles import (
    codebook_quality,
    free_running,
    kernel_bounds,
    native_compare,
    pinned_step,
    shadowing,
)
from gefen_oracles.numeric import Comparison, Comparisons, bitwise_comparison

__all__ = [
    "LongCase",
    "PinnedCase",
    "TrajectoryCase",
    "long_trajectory",
    "pinned",
    "trajectory",
]


def _model(start: dict, groups) -> models.Model:
    """A model of the case's parameters and groups (only the groups and names are used)."""
    return models.Model(
        shapes={n: tuple(t.shape) for n, t in start.items()},
        groups=tuple(tuple(g) for g in groups),
        init=models.zeros,
    )


@dataclass
class PinnedCase:
    """One pinned step (SPEC 5.6.1): ``state_dict`` loaded into an optimizer over ``start`` in
    ``groups`` with ``hypers`` and ``options``, gradients ``grads``, one step."""

    dtype: torch.dtype
    state_dict: dict
    start: dict
    grads: dict
    hypers: tuple
    options: dict = field(default_factory=dict)
    groups: tuple = models.OPTIMIZER.groups
    about: str = ""

    def run(self, make_optimizer) -> runs.PinnedStep:
        """The step of the optimizer ``make_optimizer`` builds (the reference's:
        :data:`gefen_conformance.workload.models.REFERENCE`) from this case's inputs."""
        return runs.pinned_step_from(
            make_optimizer,
            self.state_dict,
            self.start,
            self.grads,
            self.hypers,
            model=_model(self.start, self.groups),
            **self.options,
        )

    @property
    def factored(self) -> bool:
        return bool(self.options.get("factored_v_2d", False))

    def compare(self, make_optimizer, *, bitwise: bool) -> Comparisons:
        impl = self.run(make_optimizer)
        reference = self.run(models.REFERENCE)
        if bitwise:
            comparisons = native_compare.compare(
                reference.state_dict, impl.state_dict, bitwise=True, grad_dtype=self.dtype
            )
            for n in self.start:
                comparisons.add(
                    bitwise_comparison(
                        f"pinned step: parameter update ({_short(self.dtype)})",
                        reference.after[n],
                        impl.after[n],
                        label=f"parameter {n}",
                    )
                )
            return comparisons
        comparisons = Comparisons()
        for p in native_compare.exact_problems(reference.state_dict, impl.state_dict, codebook_exact=True):
            comparisons.problem(p)
        if comparisons.ok:
            comparisons.merge(
                pinned_step.check_step(
                    runs.param_steps(self.state_dict, impl, factored=self.factored),
                    self.state_dict["gefen_codebook"],
                )
            )
        return comparisons

    def describe(self) -> str:
        return (
            f"pinned step ({_short(self.dtype)}{', ' + self.about if self.about else ''}; {_options(self)})"
        )


@dataclass
class TrajectoryCase:
    """Free-running steps (SPEC 5.6.10): both optimizers over ``start`` in ``groups`` with
    ``hypers`` and ``options``, one step per entry of ``grads``; judged on the parameters after
    the last step (``judge="parameters"``) or the native state (``judge="state"``)."""

    dtype: torch.dtype
    start: dict
    grads: list
    hypers: tuple
    options: dict = field(default_factory=dict)
    judge: str = "parameters"
    groups: tuple = models.OPTIMIZER.groups

    def compare(self, make_optimizer, *, bitwise: bool) -> Comparisons:
        model = _model(self.start, self.groups)
        reference = runs.trajectory_from(
            models.REFERENCE, self.start, self.grads, self.hypers, model=model, **self.options
        )
        impl = runs.trajectory_from(
            make_optimizer, self.start, self.grads, self.hypers, model=model, **self.options
        )
        if self.judge == "state":
            return self._state(reference, impl, bitwise)
        return self._parameters(reference, impl, bitwise)

    def _parameters(self, reference, impl, bitwise: bool) -> Comparisons:
        """Bitwise, or SPEC 5.6.10 per element and the displacement bias."""
        comparisons = Comparisons()
        if bitwise:
            for n in self.start:
                comparisons.add(
                    bitwise_comparison(
                        f"free-running: parameters ({_short(self.dtype)})",
                        reference.history[n][-1],
                        impl.history[n][-1],
                        label=f"parameter {n}",
                    )
                )
            return comparisons
        return _free_running(self.dtype, len(self.grads), list(self.start), reference, impl)

    def _state(self, reference, impl, bitwise: bool) -> Comparisons:
        """The exact rules, the codebook (bitwise, or SPEC 5.6.7 on the reference's step-1
        histogram) and the float state."""
        expected = reference.optimizer.state_dict()
        first = self.grads[0] if self.grads else {}
        histogram = codebook_quality.histogram(runs.first_step_pieces(expected, self.dtype, first))
        return native_compare.compare(
            expected,
            models.state_to_cpu(impl.optimizer.state_dict()),
            bitwise=bitwise,
            grad_dtype=self.dtype,
            histogram=histogram,
        )

    def describe(self) -> str:
        return (
            f"free-running trajectory ({_short(self.dtype)}, {len(self.grads)} steps, judged on the "
            f"{'native state' if self.judge == 'state' else 'parameters'}; {_options(self)})"
        )


@dataclass
class LongCase:
    """A long trajectory (SPEC 4.3.11, 5.6.20, 5.6.21): both optimizers over ``start`` in ``groups``
    with ``hypers`` and ``options``, one step per entry of ``grads`` (step indices ``steps``).
    Judged bitwise (every step's parameters and the final native state when ``native``), by
    shadowing every step from the implementation's own state before it (``native``, tolerance),
    or at the free-running bounds after the run (no native state)."""

    dtype: torch.dtype
    start: dict
    grads: list
    hypers: tuple
    options: dict = field(default_factory=dict)
    native: bool = True
    steps: list = field(default_factory=list)
    groups: tuple = models.LONG.groups

    def compare(self, make_optimizer, *, bitwise: bool) -> Comparisons:
        model = _model(self.start, self.groups)
        steps = self.steps or list(range(len(self.grads)))
        shadowed = self.native and not bitwise
        sides = []
        for make, record in ((models.REFERENCE, False), (make_optimizer, shadowed)):
            params, optimizer = runs.built_from(make, model, self.start, self.hypers, **self.options)
            sides.append(runs.run_steps_from(optimizer, params, self.grads, steps, record_states=record))
        reference, impl = sides
        if bitwise:
            return self._bitwise(reference, impl)
        if self.native:
            return self._shadowed(reference, impl)
        return self._free_running(reference, impl)

    def _bitwise(self, reference, impl) -> Comparisons:
        comparisons = Comparisons()
        for name, history in reference.history.items():
            comparisons.add(
                bitwise_comparison(
                    f"long trajectory: parameters ({_short(self.dtype)}, every step)",
                    torch.stack(history),
                    torch.stack(impl.history[name]),
                    label=f"{name} (step, element)",
                )
            )
        if self.native:
            comparisons.merge(
                native_compare.compare(
                    runs.native_state(reference.optimizer),
                    runs.native_state(impl.optimizer),
                    bitwise=True,
                    grad_dtype=self.dtype,
                )
            )
        return comparisons

    def _shadowed(self, reference, impl) -> Comparisons:
        """SPEC 5.6.20: the final exact rules against the reference, the codebook learned at the
        first step (SPEC 5.6.7) and frozen afterwards, every step from the implementation's own state."""
        comparisons = Comparisons()
        expected = runs.native_state(reference.optimizer)
        last = len(impl.states) - 1
        for p in native_compare.exact_problems(expected, impl.states[-1], codebook_exact=False):
            comparisons.problem(f"after {last} steps: {p}")
        codebook = impl.states[1]["gefen_codebook"]
        comparisons.add(
            codebook_quality.compare(
                "codebook", expected["gefen_codebook"], codebook, _first_step_histogram(reference, expected)
            )
        )
        changed = sum(
            not native_compare._same_value(codebook, sd["gefen_codebook"]) for sd in impl.states[2:]
        )
        frozen = Comparison(
            "long trajectory: codebook frozen after the first step",
            "bitwise",
            differing=changed,
            total=len(impl.states) - 2,
        )
        if changed:
            frozen.problems.append(
                f"the codebook changed in {changed} of {len(impl.states) - 2} steps after the "
                "first (SPEC 1.6.1: it is learned once and frozen)"
            )
        comparisons.add(frozen)
        if comparisons.ok:
            factored = bool(self.options.get("factored_v_2d", False))
            comparisons.merge(shadowing.check_runs(runs.param_runs(impl, factored_v_2d=factored), codebook))
        return comparisons

    def _free_running(self, reference, impl) -> Comparisons:
        """SPEC 5.6.21: without a native state, the parameters at the free-running bounds after the run."""
        return _free_running(self.dtype, len(self.grads), list(reference.history), reference, impl)

    def describe(self) -> str:
        how = "shadowed step by step" if self.native else "at the free-running bounds"
        return (
            f"long trajectory ({_short(self.dtype)}, {len(self.grads)} steps, {how} under tolerance; "
            f"{_options(self)})"
        )


def _free_running(dtype: torch.dtype, steps: int, names: list, reference, impl) -> Comparisons:
    """SPEC 5.6.10: each parameter of ``names`` after ``steps`` free-running steps of both runs, per
    element within the momentum-amplified bound and, over all of them, the displacement bias."""
    comparisons = Comparisons()
    gap = codebook_quality.largest_gap(reference.optimizer.codebook)
    groups = {name: g for g in reference.optimizer.param_groups for name in g["param_names"]}
    displacements, systematic = [], 0.0
    for name in names:
        history = reference.history[name]
        beta1, beta2 = groups[name]["beta1"], groups[name]["beta2"]
        factor = free_running.momentum_factor(steps, beta1, gap, dtype)
        comparison, moved = free_running.trajectory(name, dtype, history, impl.history[name][-1], factor)
        comparisons.add(comparison)
        displacements.append(moved)
        bound = kernel_bounds.second_moment(history[0].numel(), dtype, beta2)
        systematic = max(systematic, kernel_bounds.update(dtype, kernel_bounds.stepsize(bound)))
    bias = free_running.displacement_bias(dtype, displacements, systematic)
    if bias is not None:
        comparisons.add(bias)
    return comparisons


def _first_step_histogram(run, state_dict: dict) -> torch.Tensor:
    """The reference's step-1 histogram (SPEC 1.6.4) of the run's first gradients at the periods."""
    names = {
        pid: name for g in state_dict["param_groups"] for pid, name in zip(g["params"], g["param_names"])
    }
    pieces = [
        (run.grads[names[pid]][0], entry["automatic_period"])
        for pid, entry in state_dict["state"].items()
        if run.grads[names[pid]][0] is not None and "automatic_period" in entry
    ]
    return codebook_quality.histogram(pieces)


def _short(dtype: torch.dtype) -> str:
    return pinned_step.DTYPE_NAMES.get(dtype, str(dtype))


def _options(case) -> str:
    hypers = "; ".join(", ".join(f"{k}={_value(v)}" for k, v in h.items()) for h in case.hypers)
    extra = ", ".join(f"{k}={v!r}" for k, v in case.options.items())
    return f"groups [{hypers}]" + (f", {extra}" if extra else "")


def _value(v) -> str:
    return f"tensor({v.item()!r})" if torch.is_tensor(v) and v.numel() == 1 else repr(v)


def pinned(
    dtype: torch.dtype,
    pin_at: int,
    state_dict: dict,
    *,
    tensor_lr: bool = False,
    weight_decay: float = 0.0,
    **options,
) -> PinnedCase:
    """The pinned step of :func:`gefen_conformance.workload.runs.pinned_step` as a case."""
    return PinnedCase(
        dtype,
        state_dict,
        runs.pinned_start(dtype),
        {n: models.gradient(models.OPTIMIZER, n, pin_at, dtype=dtype) for n in models.OPTIMIZER.shapes},
        runs.optimizer_hypers(tensor_lr=tensor_lr, weight_decay=weight_decay),
        dict(options),
        about=f"gradient of step {pin_at}",
    )


def trajectory(
    dtype: torch.dtype,
    steps: int,
    *,
    judge: str = "parameters",
    tensor_lr: bool = False,
    weight_decay: float = 0.0,
    **options,
) -> TrajectoryCase:
    """The free-running training of :func:`gefen_conformance.workload.runs.trajectory` as a case."""
    return TrajectoryCase(
        dtype,
        models.initial(models.OPTIMIZER, dtype=dtype),
        runs.trajectory_gradients(dtype, steps),
        runs.optimizer_hypers(tensor_lr=tensor_lr, weight_decay=weight_decay),
        dict(options),
        judge=judge,
    )


def long_trajectory(
    dtype: torch.dtype,
    hypers,
    *,
    native: bool,
    model: models.Model = models.LONG,
    steps: int = models.LONG_STEPS,
    **options,
) -> LongCase:
    """``model`` trained ``steps`` steps in ``dtype`` with ``hypers`` as a case (SPEC 4.3.11)."""
    return LongCase(
        dtype,
        models.initial(model, dtype=dtype),
        runs.trajectory_gradients(dtype, steps, model),
        tuple(hypers),
        dict(options),
        native=native,
        steps=list(range(steps)),
        groups=model.groups,
    )

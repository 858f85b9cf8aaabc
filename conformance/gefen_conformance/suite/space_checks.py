"""The input space's checks (SPEC 4.3.10, 4.3.12, 5.6.13) and its replayable case.

:func:`compare_case` judges one :class:`~gefen_conformance.workload.space.InputCase` run by the
implementation against the reference's run of it, call by call; :class:`InputSpaceCase` is the
drawn case as a reproducer holds it (kind ``input-space``, SPEC 4.5.6): its payload is the case's
fields alone (every value is a deterministic function of them),
:meth:`InputSpaceCase.comparisons` runs both sides and judges them in one process, and
:meth:`InputSpaceCase.describe` says the input in words.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

from gefen_conformance.suite import step_checks
from gefen_conformance.suite.replayable import replayable
from gefen_conformance.workload.models import REFERENCE
from gefen_conformance.workload.space import (
    GroupCase,
    InputCase,
    ParamCase,
    factored,
    registered,
)
from gefen_conformance.workload.space_driver import run, starting_state
from gefen_oracles import codebook_quality, native_compare, pinned_step
from gefen_oracles.numeric import Comparisons, bitwise_comparison

__all__ = ["InputSpaceCase", "compare_case"]


def normalizes_exactly(grad: torch.Tensor, period: int) -> torch.Tensor:
    """Per block of ``period``: whether dividing the fp32 gradient by the block's largest magnitude
    is exact in any arithmetic (SPEC 5.6.6, 5.6.7): the largest magnitude is zero or a power of
    two (its reciprocal is exact, so a division and a reciprocal multiply agree), every quotient
    a multiple of ``2^-23`` (so ``u + 1`` and its histogram bin are exact too), and the gradient
    exact in fp32."""
    g = grad.detach().cpu()
    blocks = g.float().double().reshape(-1, period)
    top = blocks.abs().amax(dim=1, keepdim=True)
    mantissa, _ = torch.frexp(top)
    quotient = torch.where(top > 0, blocks / top.clamp_min(torch.finfo(torch.float64).tiny), 0.0) * 2.0**23
    return (
        ((top == 0) | (mantissa == 0.5))
        & (quotient == quotient.round()).all(dim=1, keepdim=True)
        & (blocks == g.double().reshape(-1, period)).all(dim=1, keepdim=True)
    ).reshape(-1)


def _learned_codebook(
    comparisons: Comparisons,
    case: InputCase,
    k: int,
    reference_call,
    impl_call,
    learned: torch.Tensor | None,
    bitwise: bool,
) -> torch.Tensor | None:
    """SPEC 1.6, 5.6.7, for a case whose codebook is learned: the codebook the implementation holds
    after call ``k`` against the reference's. At the call that learns it: bitwise under the
    torch-exact profile, and under the tolerance profile when every contributing block of that
    call's gradients normalizes exactly (:func:`normalizes_exactly`: nothing can move an element
    across a bin edge), else by its cost on the reference's histogram; after it: unchanged (frozen,
    SPEC 1.6.1). Returns the codebook learned so far."""
    reference = reference_call.state_dict.get("gefen_codebook")
    impl = impl_call.state_dict.get("gefen_codebook")
    where = f"call {k} of {case.calls}"
    if learned is not None:
        what = "input space: codebook frozen once learned"
        comparisons.add(bitwise_comparison(what, learned, impl, label="gefen_codebook"))
        return learned
    if reference is None or impl is None:
        if (reference is None) != (impl is None):
            comparisons.problem(
                f"{where}: gefen_codebook is {'None' if impl is None else 'learned'}, the reference's "
                f"{'None' if reference is None else 'learned'} (SPEC 1.6.1)"
            )
        return None
    ids = {i: pid for pid, i in enumerate(case.order())}
    pieces = []
    for i, grad in impl_call.grads.items():
        if grad is None or grad.numel() == 0 or not registered(case, i, k):
            continue
        pieces.append((grad, reference_call.state_dict["state"][ids[i]]["automatic_period"]))
    if bitwise:
        what = "input space: learned codebook"
        comparisons.add(bitwise_comparison(what, reference, impl, label="gefen_codebook"))
    elif all(bool(normalizes_exactly(grad, period).all()) for grad, period in pieces):
        what = "input space: codebook learned from exactly normalized gradients"
        comparisons.add(bitwise_comparison(what, reference, impl, label="gefen_codebook"))
    else:
        histogram = codebook_quality.histogram(pieces)
        comparisons.add(codebook_quality.compare("input space: learned codebook", reference, impl, histogram))
    return impl


def _run_indices(comparisons: Comparisons, name: str, grad, period: int, codebook, reference, impl) -> None:
    """SPEC 1.7.3 and 5.6.6 under the tolerance profile: with ``beta1 = 0`` the new momentum is the
    gradient in any arithmetic, so in a block that normalizes exactly (:func:`normalizes_exactly`)
    each normalized value is exact, and which index of a run of equal codewords it takes (the
    run's lowest from at or below the run's value, its highest from above) is an exact comparison:
    an index of the same codeword value as the reference's but another index differs from the rule.
    Elsewhere equal codewords are not told apart under this profile (the decoded value, every later
    step and every checkpoint are the same)."""
    impl, reference = impl.long().reshape(-1, period), reference.long().reshape(-1, period)
    exact = normalizes_exactly(grad, period).unsqueeze(1).expand_as(impl)
    cb = codebook.detach().cpu()
    differing = exact & (impl != reference) & (cb[impl] == cb[reference])
    count = int(differing.sum())
    problems = []
    if count:
        block, j = (int(v) for v in differing.nonzero()[0])
        got, rule = int(impl[block, j]), int(reference[block, j])
        problems.append(
            f"state[{name}].m_codebook: {count} exactly normalized values take another index of a run of "
            f"equal codewords than SPEC 1.7.3 gives (first at block {block}, element {j}: index {got}, "
            f"the rule's {rule}, codeword {float(cb[rule])!r})"
        )
    comparisons.exact(
        "input space: index within a run of equal codewords (exact values)", count, int(exact.sum()), problems
    )


def compare_case(case: InputCase, start: dict, reference, impl, bitwise: bool) -> Comparisons:
    """Every comparison of SPEC 4.3.10 for one case run by the reference (``reference``) and the
    implementation (``impl``) from the state ``start``."""
    comparisons = Comparisons()
    ids = {i: pid for pid, i in enumerate(case.order())}
    # a loaded codebook is frozen (exact in both profiles); a learned one is exact under the
    # torch-exact profile and judged by SPEC 5.6.7 under the tolerance profile
    codebook_exact = case.codebook != "learned"
    for problem in native_compare.exact_problems(reference.loaded, impl.loaded, codebook_exact=True):
        comparisons.problem(f"after the load: {problem}")
    before_sd = start
    learned = None
    for k, (reference_call, impl_call) in enumerate(zip(reference.calls, impl.calls), 1):
        where, exact = step_checks.exact_rules(
            comparisons,
            k,
            case.calls,
            impl_call.skipped,
            reference_call.state_dict,
            impl_call.state_dict,
            codebook_exact=codebook_exact,
        )
        if case.protocol == "closure" and not (
            torch.is_tensor(impl_call.loss) and torch.equal(impl_call.loss, impl_call.expected_loss)
        ):
            comparisons.problem(f"{where}: step(closure) returned {impl_call.loss!r}, not the closure's loss")
        if exact:
            break
        if not codebook_exact:
            learned = _learned_codebook(comparisons, case, k, reference_call, impl_call, learned, bitwise)
        codebook = impl_call.state_dict.get("gefen_codebook")
        same_codebook = codebook is not None and torch.equal(
            codebook, reference_call.state_dict.get("gefen_codebook")
        )
        steps = []
        for i in range(len(case.params)):
            name, pid = case.name(i), ids[i]
            if not registered(case, i, k):  # not in the optimizer yet: it must not move
                what = "input space: not registered yet, no change"
                comparisons.add(
                    bitwise_comparison(
                        what, impl_call.before[i], impl_call.after[i], label=f"parameter {name}"
                    )
                )
                continue
            # a group added before this call starts fresh
            entry_before = before_sd["state"].get(pid, {"name": name})
            entry_after = impl_call.state_dict["state"][pid]
            grad = impl_call.grads[i]
            if case.params[i].numel == 0:  # no elements: skipped entirely, no state (SPEC 1.5.2 row 0)
                if entry_after != {"name": name}:
                    comparisons.problem(
                        f"{where}: state[{name}] of an empty parameter is {sorted(entry_after)}"
                    )
                continue
            if impl_call.skipped or grad is None:
                what = (
                    "found_inf: nothing changes"
                    if impl_call.skipped
                    else "input space: no gradient, no change"
                )
                before, after = impl_call.before[i], impl_call.after[i]
                step_checks.unchanged(comparisons, what, name, before, after, entry_before, entry_after)
                continue
            if bitwise and case.params[i].dtype != "fp64":
                what = f"input space: parameters and state ({case.params[i].dtype})"
                step_checks.same_step(
                    comparisons,
                    what,
                    name,
                    reference_call.after[i],
                    impl_call.after[i],
                    reference_call.state_dict["state"][pid],
                    entry_after,
                )
                continue
            hypers = reference_call.hypers[case.params[i].group]
            if same_codebook and hypers["beta1"] == 0.0:
                indices = reference_call.state_dict["state"][pid]["m_codebook"], entry_after["m_codebook"]
                if torch.is_tensor(indices[1]) and indices[1].shape == indices[0].shape:
                    period = entry_after["automatic_period"]
                    _run_indices(comparisons, name, grad, period, codebook, *indices)
            steps.append(
                step_checks.pinned(
                    impl_call, i, name, grad, entry_before, entry_after, hypers, factored=factored(case, i)
                )
            )
        if steps and codebook is None:
            comparisons.problem(f"{where}: parameters stepped without a codebook in the state dict")
        elif steps:
            comparisons.merge(pinned_step.check_step(steps, codebook))
        before_sd = impl_call.state_dict
    return comparisons


@replayable("input-space")
class InputSpaceCase:
    """One input-space case, drawn or explicit, as a replayable case."""

    def __init__(self, case: InputCase):
        self.case = case

    def comparisons(self, impl, *, bitwise: bool) -> Comparisons:
        """The reference and ``impl`` driven through the case from its starting state, compared."""
        start = starting_state(self.case)
        reference_run = run(REFERENCE, self.case, start)
        impl_run = run(impl.make_optimizer, self.case, start)
        return compare_case(self.case, start, reference_run, impl_run, bitwise)

    def payload(self) -> dict:
        return {"kind": self.kind, "case": dataclasses.asdict(self.case)}

    @classmethod
    def from_payload(cls, payload: dict) -> InputSpaceCase:
        fields = dict(payload["case"])
        fields["params"] = tuple(ParamCase(**dict(p, shape=tuple(p["shape"]))) for p in fields["params"])
        fields["groups"] = tuple(GroupCase(**dict(g, betas=tuple(g["betas"]))) for g in fields["groups"])
        fields["options"] = tuple(fields.get("options") or ())
        fields["events"] = tuple(tuple(e) for e in fields.get("events") or ())
        return cls(InputCase(**fields))

    def describe(self) -> str:
        """The case in words: its parameters (grouped where they repeat), groups, state, calls,
        protocol, lifecycle events and options."""
        c = self.case
        kinds = Counter(
            (tuple(p.shape), p.dtype, p.layout, p.gradient, p.frozen, p.period is not None) for p in c.params
        )
        params = []
        for (shape, dtype, layout, gradient, frozen, stated), n in kinds.items():
            words = ["x".join(map(str, shape)) or "scalar", dtype]
            words += [layout] if layout != "contiguous" else []
            words += [f"gradient {gradient}"] if gradient != "normal" else []
            words += ["frozen"] if frozen else []
            words += ["from state"] if stated else []
            params.append(f"{n} x " + " ".join(words) if n > 1 else " ".join(words))
        groups = []
        for g in c.groups:
            lr = f"lr {g.lr:g}" + (
                f" ({'fp32' if g.tensor_lr is True else g.tensor_lr} tensor)" if g.tensor_lr else ""
            )
            extra = [f"betas {g.betas[0]:g}/{g.betas[1]:g}", f"eps {g.eps:g}"]
            extra += [f"weight decay {g.weight_decay:g}"] if g.weight_decay else []
            groups.append(", ".join([lr, *extra]))
        state = f"synthesized state at step {c.counter}" if c.counter else "fresh state"
        if c.codebook != "loaded":
            state += f", codebook {c.codebook}"
        if c.moment_counter is not None:
            state += f" (second moment at {c.moment_counter})"
        if c.state_form == "legacy":
            state += ", legacy (no vmean_step)"
        elif c.state_form == "other-mode":
            state += ", second moment of the other path"
        parts = [
            f"{len(c.params)} parameters: {'; '.join(params)}",
            f"{len(c.groups)} group(s): {' | '.join(groups)}",
            ("factored" if c.factored else "block second moment"),
            state,
            f"{c.calls} call(s), schedule {c.schedule}, protocol {c.protocol}",
        ]
        if c.events:
            parts.append("events " + ", ".join(f"{event} before call {call}" for call, event in c.events))
        if c.grad_order != "registration":
            parts.append(f"gradient buckets in {c.grad_order} order")
        if c.options:
            opts = [
                o if o != "period_one_substrings" else f"period_one_substrings=({c.substring!r},)"
                for o in c.options
            ]
            parts.append("options " + ", ".join(opts))
        if c.deterministic:
            parts.append("deterministic")
        parts.append(f"seed {c.seed}")
        return "input-space case: " + "; ".join(parts)

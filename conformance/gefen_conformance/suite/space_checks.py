"""The input space's checks (SPEC 4.3.10, 4.3.12, 5.6.13) and its replayable case.

:func:`compare_case` judges one :class:`~gefen_conformance.workload.space.InputCase` run by the
implementation against the reference's run of it, call by call; :class:`InputSpaceCase` is the
case as a reproducer holds it (SPEC 4.5.6): its payload is the case's fields alone (every value is
a deterministic function of them), :meth:`InputSpaceCase.replay` runs both sides and judges them
in one process, and :meth:`InputSpaceCase.describe` says the input in words.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

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


def _unchanged(
    comparisons: Comparisons, what: str, name: str, before_p, after_p, before_entry, after_entry
) -> None:
    """A parameter that did not step: value and state entry bit for bit as before (both profiles)."""
    comparisons.add(bitwise_comparison(what, before_p, after_p, label=f"parameter {name}"))
    for key, value in before_entry.items():
        if torch.is_tensor(value):
            comparisons.add(
                bitwise_comparison(what, value, after_entry.get(key), label=f"state[{name}].{key}")
            )
        elif after_entry.get(key) != value:
            comparisons.problem(
                f"state[{name}].{key}: {after_entry.get(key)!r}, expected {value!r} (unchanged)"
            )


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
    comparisons: Comparisons, case: InputCase, k: int, t, o, learned: torch.Tensor | None, bitwise: bool
) -> torch.Tensor | None:
    """SPEC 1.6, 5.6.7, for a case whose codebook is learned: the codebook the implementation holds
    after call ``k`` against the reference's. At the call that learns it: bitwise under the
    torch-exact profile, and under the tolerance profile when every contributing block of that
    call's gradients normalizes exactly (:func:`normalizes_exactly`: nothing can move an element
    across a bin edge), else by its cost on the reference's histogram; after it: unchanged (frozen,
    SPEC 1.6.1). Returns the codebook learned so far."""
    ours, theirs = o.state_dict.get("gefen_codebook"), t.state_dict.get("gefen_codebook")
    where = f"call {k} of {case.calls}"
    if learned is not None:
        what = "input space: codebook frozen once learned"
        comparisons.add(bitwise_comparison(what, learned, theirs, label="gefen_codebook"))
        return learned
    if ours is None or theirs is None:
        if (ours is None) != (theirs is None):
            comparisons.problem(
                f"{where}: gefen_codebook is {'None' if theirs is None else 'learned'}, the reference's "
                f"{'None' if ours is None else 'learned'} (SPEC 1.6.1)"
            )
        return None
    ids = {i: pid for pid, i in enumerate(case.order())}
    pieces = []
    for i, grad in t.grads.items():
        if grad is None or grad.numel() == 0 or not registered(case, i, k):
            continue
        pieces.append((grad, o.state_dict["state"][ids[i]]["automatic_period"]))
    if bitwise:
        what = "input space: learned codebook"
        comparisons.add(bitwise_comparison(what, ours, theirs, label="gefen_codebook"))
    elif all(bool(normalizes_exactly(grad, period).all()) for grad, period in pieces):
        what = "input space: codebook learned from exactly normalized gradients"
        comparisons.add(bitwise_comparison(what, ours, theirs, label="gefen_codebook"))
    else:
        histogram = codebook_quality.histogram(pieces)
        comparisons.add(codebook_quality.compare("input space: learned codebook", ours, theirs, histogram))
    return theirs


def _run_indices(comparisons: Comparisons, name: str, grad, period: int, codebook, ours, theirs) -> None:
    """SPEC 1.7.3 and 5.6.6 under the tolerance profile: with ``beta1 = 0`` the new momentum is the
    gradient in any arithmetic, so in a block that normalizes exactly (:func:`normalizes_exactly`)
    each normalized value is exact, and which index of a run of equal codewords it takes (the
    run's lowest from at or below the run's value, its highest from above) is an exact comparison:
    an index of the same codeword value as the reference's but another index differs from the rule.
    Elsewhere equal codewords are not told apart under this profile (the decoded value, every later
    step and every checkpoint are the same)."""
    t_idx, o_idx = theirs.long().reshape(-1, period), ours.long().reshape(-1, period)
    exact = normalizes_exactly(grad, period).unsqueeze(1).expand_as(t_idx)
    cb = codebook.detach().cpu()
    differing = exact & (t_idx != o_idx) & (cb[t_idx] == cb[o_idx])
    count = int(differing.sum())
    problems = []
    if count:
        block, j = (int(v) for v in differing.nonzero()[0])
        got, rule = int(t_idx[block, j]), int(o_idx[block, j])
        problems.append(
            f"state[{name}].m_codebook: {count} exactly normalized values take another index of a run of "
            f"equal codewords than SPEC 1.7.3 gives (first at block {block}, element {j}: index {got}, "
            f"the rule's {rule}, codeword {float(cb[rule])!r})"
        )
    comparisons.exact(
        "input space: index within a run of equal codewords (exact values)", count, int(exact.sum()), problems
    )


def compare_case(case: InputCase, start: dict, theirs, ours, bitwise: bool) -> Comparisons:
    """Every comparison of SPEC 4.3.10 for one case run by the implementation (``theirs``) and the
    reference (``ours``) from the state ``start``."""
    comparisons = Comparisons()
    ids = {i: pid for pid, i in enumerate(case.order())}
    # a loaded codebook is frozen (exact in both profiles); a learned one is exact under the
    # torch-exact profile and judged by SPEC 5.6.7 under the tolerance profile
    codebook_exact = case.codebook != "learned"
    for problem in native_compare.exact_problems(ours.loaded, theirs.loaded, codebook_exact=True):
        comparisons.problem(f"after the load: {problem}")
    before_sd = start
    learned = None
    for k, (t, o) in enumerate(zip(theirs.calls, ours.calls), 1):
        where = f"call {k} of {case.calls}" + (" (found_inf set)" if t.skipped else "")
        exact = native_compare.exact_problems(o.state_dict, t.state_dict, codebook_exact=codebook_exact)
        for problem in exact:
            comparisons.problem(f"{where}: {problem}")
        if case.protocol == "closure" and not (
            torch.is_tensor(t.loss) and torch.equal(t.loss, t.expected_loss)
        ):
            comparisons.problem(f"{where}: step(closure) returned {t.loss!r}, not the closure's loss")
        if exact:
            break
        if not codebook_exact:
            learned = _learned_codebook(comparisons, case, k, t, o, learned, bitwise)
        codebook = t.state_dict.get("gefen_codebook")
        same_codebook = codebook is not None and torch.equal(codebook, o.state_dict.get("gefen_codebook"))
        steps = []
        for i in range(len(case.params)):
            name, pid = case.name(i), ids[i]
            if not registered(case, i, k):  # not in the optimizer yet: it must not move
                what = "input space: not registered yet, no change"
                comparisons.add(bitwise_comparison(what, t.before[i], t.after[i], label=f"parameter {name}"))
                continue
            # a group added before this call starts fresh
            entry_before = before_sd["state"].get(pid, {"name": name})
            entry_after = t.state_dict["state"][pid]
            grad = t.grads[i]
            if case.params[i].numel == 0:  # no elements: skipped entirely, no state (SPEC 1.5.2 row 0)
                if entry_after != {"name": name}:
                    comparisons.problem(
                        f"{where}: state[{name}] of an empty parameter is {sorted(entry_after)}"
                    )
                continue
            if t.skipped or grad is None:
                what = "found_inf: nothing changes" if t.skipped else "input space: no gradient, no change"
                _unchanged(comparisons, what, name, t.before[i], t.after[i], entry_before, entry_after)
                continue
            if bitwise and case.params[i].dtype != "fp64":
                what = f"input space: parameters and state ({case.params[i].dtype})"
                comparisons.add(bitwise_comparison(what, o.after[i], t.after[i], label=f"parameter {name}"))
                for key, value in o.state_dict["state"][pid].items():
                    if torch.is_tensor(value):
                        comparisons.add(
                            bitwise_comparison(what, value, entry_after[key], label=f"state[{name}].{key}")
                        )
                continue
            hypers = o.hypers[case.params[i].group]
            if same_codebook and hypers["beta1"] == 0.0:
                ours_idx, theirs_idx = o.state_dict["state"][pid]["m_codebook"], entry_after["m_codebook"]
                if torch.is_tensor(theirs_idx) and theirs_idx.shape == ours_idx.shape:
                    period = entry_after["automatic_period"]
                    _run_indices(comparisons, name, grad, period, codebook, ours_idx, theirs_idx)
            steps.append(
                pinned_step.ParamStep(
                    name=name,
                    p0=t.before[i],
                    p1=t.after[i],
                    grad=grad,
                    before=entry_before,
                    after=entry_after,
                    factored=factored(case, i),
                    **hypers,
                )
            )
        if steps and codebook is None:
            comparisons.problem(f"{where}: parameters stepped without a codebook in the state dict")
        elif steps:
            comparisons.merge(pinned_step.check_step(steps, codebook))
        before_sd = t.state_dict
    return comparisons


class InputSpaceCase:
    """One input-space case as a replayable case (kind ``input-space``)."""

    kind = "input-space"

    def __init__(self, case: InputCase):
        self.case = case

    def replay(self, impl, *, bitwise: bool) -> Comparisons:
        start = starting_state(self.case)
        ours = run(REFERENCE, self.case, start)
        theirs = run(impl.make_optimizer, self.case, start)
        return compare_case(self.case, start, theirs, ours, bitwise)

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

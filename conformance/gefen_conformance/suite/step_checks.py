"""Checks of one ``step()`` call, shared by the calling protocol (SPEC 4.3.13), the input space
(SPEC 4.3.10) and the loads into stepped optimizers (SPEC 4.3.11): each adds to a
:class:`~gefen_oracles.numeric.Comparisons` what it compared; :func:`pinned` gives a stepped
parameter to the pinned step's oracle instead.
"""

from __future__ import annotations

import torch

from gefen_oracles import native_compare, pinned_step
from gefen_oracles.numeric import Comparisons, bitwise_comparison


def exact_rules(
    out: Comparisons,
    k: int,
    calls: int,
    skipped: bool,
    expected: dict,
    observed: dict,
    *,
    codebook_exact: bool,
) -> tuple[str, bool]:
    """Call ``k`` of ``calls`` by the rules exact in every profile
    (:func:`gefen_oracles.native_compare.exact_problems`): the native state dict ``observed`` after
    it against the reference's ``expected``, each problem added to ``out`` under where it stands.
    Returns that place (the call, and whether ``found_inf`` was set) and whether any problem was
    found (the calls after it are then not comparable)."""
    where = f"call {k} of {calls}" + (" (found_inf set)" if skipped else "")
    problems = native_compare.exact_problems(expected, observed, codebook_exact=codebook_exact)
    for problem in problems:
        out.problem(f"{where}: {problem}")
    return where, bool(problems)


def unchanged(
    out: Comparisons, what: str, name: str, before, after, entry_before: dict, entry_after: dict
) -> None:
    """A parameter that must not step (no gradient, a ``found_inf`` call): its value and its state
    entry bit for bit as before (every profile)."""
    out.add(bitwise_comparison(what, before, after, label=f"parameter {name}"))
    for key, value in entry_before.items():
        if torch.is_tensor(value):
            out.add(bitwise_comparison(what, value, entry_after.get(key), label=f"state[{name}].{key}"))
        elif entry_after.get(key) != value:
            out.problem(f"state[{name}].{key}: {entry_after.get(key)!r}, expected {value!r} (unchanged)")


def same_step(
    out: Comparisons, what: str, name: str, reference, impl, reference_entry: dict, impl_entry: dict
) -> None:
    """A parameter the implementation stepped, bit for bit as the reference's same step: its value
    and every state tensor of the reference's entry (the torch-exact profile)."""
    out.add(bitwise_comparison(what, reference, impl, label=f"parameter {name}"))
    for key, value in reference_entry.items():
        if torch.is_tensor(value):
            out.add(bitwise_comparison(what, value, impl_entry.get(key), label=f"state[{name}].{key}"))


def pinned(
    impl_call, key, name: str, grad, entry_before: dict, entry_after: dict, hypers: dict, *, factored: bool
) -> pinned_step.ParamStep:
    """A parameter the implementation stepped, as the pinned step's oracle judges it (the tolerance
    profile): its value before and after the call (``impl_call.before[key]``,
    ``impl_call.after[key]``), the gradient, its state entry before and after, and the
    hyperparameters ``hypers`` its group held at the call."""
    return pinned_step.ParamStep(
        name=name,
        p0=impl_call.before[key],
        p1=impl_call.after[key],
        grad=grad,
        before=entry_before,
        after=entry_after,
        factored=factored,
        **hypers,
    )


def same_tensors(out: Comparisons, what: str, expected: dict, observed: dict) -> None:
    """The codebook and every state tensor of the native state dict ``expected`` bit for bit in
    ``observed`` (a load copies, SPEC 1.12.8: every profile)."""
    out.add(
        bitwise_comparison(
            what, expected["gefen_codebook"], observed.get("gefen_codebook"), label="gefen_codebook"
        )
    )
    for pid, entry in expected["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                out.add(
                    bitwise_comparison(
                        what,
                        value,
                        observed["state"].get(pid, {}).get(key),
                        label=f"state[{entry.get('name', pid)}].{key}",
                    )
                )

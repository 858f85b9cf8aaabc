"""The examples of the rules a DCP load states that one process can show (SPEC 3.1-3.7): one row
per rule example, each making exactly one thing invalid, or showing one input a rule accepts.
:mod:`gefen_conformance.suite.dcp_load_checks` runs them.

Every example starts from one checkpoint the reference writes at world size 1 from :data:`MODEL`
trained two steps; its optimizer dict as the independent reader decodes it (plain tensors, which
at world size 1 are the local shards) is what a direct ``load_state_dict()`` is given (SPEC
3.1.3), with the example's change. The live optimizer of the implementation is built from
:data:`LIVE` (the same parameters, other hyperparameters) and trained three steps on other
gradients, so that nothing a load should restore already holds the checkpoint's value; an
example may then give one of its groups a chosen destination (``live(optimizer)``, SPEC 3.5.3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gefen_conformance.suite.rule_examples import Example
from gefen_conformance.workload import models

#: ``c.scale`` is a slot of period 1; ``d.late`` never gets a gradient: a fresh slot.
MODEL = models.Model(
    shapes={"a.weight": (8, 8), "b.weight": (4, 3), "c.scale": (1,), "d.late": (4,)},
    groups=(("a.weight",), ("b.weight", "c.scale", "d.late")),
    hypers=({}, {"lr": 2e-3}),
    init=models.linspace(-1, 1),
    frozen=frozenset({"d.late"}),
)
#: The live optimizer's model: the same identities, every group's hyperparameters other than saved.
LIVE = dataclasses.replace(
    MODEL, hypers=({"lr": 5e-3, "weight_decay": 0.01}, {"lr": 1e-3, "eps": 1e-6, "betas": (0.8, 0.99)})
)
SAVED_STEPS = range(1, 3)
LIVE_STEPS = range(50, 53)


@dataclass(frozen=True)
class DcpLoadRefused(Example):
    """A checkpoint dict the rule refuses, given straight to the adapter's ``load_state_dict()``:
    ``error`` naming ``words`` (SPEC 0.2.3), and the live optimizer unchanged (SPEC 3.2.5)."""

    change: Callable | None  # change(checkpoint) in place
    words: str | None
    error: type = ValueError
    live: Callable | None = None  # live(optimizer): a destination set before the load


@dataclass(frozen=True)
class DcpRestored(Example):
    """A checkpoint the rule accepts, restored and re-saved at once: the re-save holds the
    checkpoint's header, identities, hyperparameters and counters exactly and its dense state
    re-quantized (SPEC 3.7.1, 5.6.14). ``change`` rewrites the dict into another form of the same
    content, given straight to ``load_state_dict()``; ``through_dcp`` restores the checkpoint as
    written with ``dcp.load`` instead. A tensor destination of a group keeps its identity (SPEC
    3.5.5)."""

    change: Callable | None = None
    through_dcp: bool = False
    live: Callable | None = None  # live(optimizer): a destination set before the load
    #: the re-save also bit for bit the reference's restore and re-save of the same checkpoint into
    #: the same live optimizer (SPEC 3.8.2; an implementation that claims ``cpu-bit-exact`` only)
    like_reference: bool = False


def _slot(index: int, field: str) -> str:
    return f"slot_{index:08d}.{field}"


def _drop(key: str) -> Callable:
    return lambda sd: sd.pop(key)


def _set(key: str, make: Callable) -> Callable:
    def change(sd: dict) -> None:
        sd[key] = make(sd[key])

    return change


def _hypers_of_group_0_only(sd: dict) -> None:
    sd["param_group_hypers"] = sd["param_group_hypers"][:1]


def _poke_nan(key: str) -> Callable:
    def change(sd: dict) -> None:
        sd[key] = sd[key].clone()
        sd[key].view(-1)[0] = float("nan")

    return change


def _both(*changes: Callable) -> Callable:
    def change(sd: dict) -> None:
        for c in changes:
            c(sd)

    return change


def _non_leaf_lr(optimizer) -> None:
    """Group 0's lr an autograd intermediate: a view of a leaf that requires grad."""
    leaf = torch.tensor([5e-3], dtype=torch.float64, requires_grad=True)
    optimizer.param_groups[0]["lr"] = leaf[0]


def _inference_lr(optimizer) -> None:
    """Group 0's lr an inference tensor (float64: the saved value is stored exactly)."""
    with torch.inference_mode():
        optimizer.param_groups[0]["lr"] = torch.tensor(5e-3, dtype=torch.float64)


def _lrs_viewing(first: int, second: int) -> Callable:
    """Both groups' lr views of one float64 tensor: of its elements ``first`` and ``second``."""

    def live(optimizer) -> None:
        shared = torch.zeros(2, dtype=torch.float64)
        optimizer.param_groups[0]["lr"] = shared[first]
        optimizer.param_groups[1]["lr"] = shared[second : second + 1]

    return live


def _counters_in_other_forms(sd: dict) -> None:
    """Every counter in another form the counter rule reads (SPEC 2.4.2): a Python int, an integral
    Python float, a one-element 1-D tensor."""
    sd["format_version"] = int(sd["format_version"])
    sd["global_step"] = float(sd["global_step"])
    sd["slot_count"] = sd["slot_count"].reshape(1)
    sd["group_count"] = float(sd["group_count"])
    sd[_slot(0, "step")] = int(sd[_slot(0, "step")])
    sd[_slot(1, "vmean_step")] = float(sd[_slot(1, "vmean_step")])
    sd[_slot(2, "initialized")] = sd[_slot(2, "initialized")].reshape(1)


DCP_LOAD = [
    # 3.1 how dcp.load drives the adapter
    DcpRestored("3.1.2", "dense-state-copied-into-kept-buffers", through_dcp=True),
    DcpRestored("3.1.3", "plain-local-shards"),
    # 3.2 staging stops at the first problem, in the order of 3.3-3.6
    DcpLoadRefused(
        "3.2.2",
        "header-before-slots",
        _both(_set("slot_count", lambda v: torch.tensor(9)), _poke_nan(_slot(0, "momentum"))),
        "parameter count differs",
    ),
    # 3.3 checkpoint metadata
    DcpLoadRefused("3.3.1", "group-count-missing", _drop("group_count"), "metadata is incomplete"),
    DcpLoadRefused("3.3.1", "hypers-missing", _drop("param_group_hypers"), "metadata is incomplete"),
    DcpLoadRefused(
        "3.3.4", "one-group-more", _set("group_count", lambda v: v + 1), "parameter-group count differs"
    ),
    DcpLoadRefused("3.3.6", "hypers-of-one-group", _hypers_of_group_0_only, "differ in count"),
    DcpLoadRefused(
        "3.3.8",
        "negative-global-step",
        _set("global_step", lambda v: torch.tensor(-1)),
        "nonnegative integer",
    ),
    DcpLoadRefused("3.3.8", "fractional-step", _set(_slot(0, "step"), lambda v: 2.5), "nonnegative integer"),
    DcpLoadRefused("3.3.8", "bool-slot-count", _set("slot_count", lambda v: True), "nonnegative integer"),
    DcpRestored("3.3.8", "counters-in-other-forms", _counters_in_other_forms),
    # 3.4 per-slot checks
    DcpLoadRefused("3.4.1", "vmean-step-missing", _drop(_slot(1, "vmean_step")), "missing state for slot"),
    DcpLoadRefused("3.4.1", "momentum-missing", _drop(_slot(0, "momentum")), "missing state for slot"),
    DcpRestored("3.4.5", "fresh-slot-by-name-only"),
    # 3.5 hyperparameter staging: destinations gefen-x 0.5.0 leaves open
    DcpLoadRefused("3.5.3", "non-leaf-lr-destination", None, "non-leaf", live=_non_leaf_lr),
    DcpRestored("3.5.3", "inference-lr-destination", live=_inference_lr),
    # the saved lrs differ (1e-3, 2e-3): one element cannot hold both; two elements can
    DcpLoadRefused("3.5.4", "lrs-view-one-element", None, "aliased", live=_lrs_viewing(0, 0)),
    DcpRestored("3.5.4", "lrs-view-two-elements", live=_lrs_viewing(0, 1)),
    # 3.6 re-blocking
    DcpRestored("3.6.1", "fresh-slot-not-reblocked"),
    DcpRestored("3.6.5", "counters-and-global-step-copied"),
    # 3.7 what a restore preserves
    DcpRestored("3.7.1", "hyperparameters-and-counters-exact"),
    # 3.8 one format: on the CPU the load arithmetic is the reference's
    DcpRestored("3.8.2", "restore-arithmetic-the-references", through_dcp=True, like_reference=True),
]

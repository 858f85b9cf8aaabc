"""The examples of the rules the constructor and a native load state (SPEC 1.1.2, 1.1.6, 1.12):
one row per rule example, each making exactly one thing invalid (SPEC 1.1.4) or showing one input
a rule accepts. :mod:`gefen_conformance.suite.rule_checks` runs them. The example types of the
step's rules (:class:`Stepped`, :class:`StepRefused`) are here too; their tables are in
:mod:`gefen_conformance.suite.step_rule_examples`.

A constructor example builds its call from the device (``call(device) -> (params, kwargs)``); a load
example changes a deep copy of the reference's native checkpoint in place
(``change(checkpoint)``, the checkpoint of :func:`gefen_conformance.suite.protocol.checkpoint`: two
groups, a tensor ``lr`` in group 0, nine parameters of the block path, ``late`` without state).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Example:
    """One example of the rule ``rule`` (SPEC 0.2.4), named ``what`` within its test."""

    rule: str
    what: str


@dataclass(frozen=True)
class Refused(Example):
    """A call the rule refuses: ``error`` naming ``words`` (SPEC 0.2.3), before anything is built."""

    call: Callable
    error: type = ValueError
    words: str | None = None


@dataclass(frozen=True)
class Built(Example):
    """A call the rule accepts, and what it builds: ``holds(optimizer, params)`` returns what is
    wrong, or None."""

    call: Callable
    holds: Callable


@dataclass(frozen=True)
class Stepped(Example):
    """Steps the rule governs: ``case`` (an input-space case, SPEC 4.3.10) run from its starting
    state by the reference and by the implementation, every call compared under the run's numeric
    profile (SPEC 5.6). The case is built so that the rule decides its outcome: an implementation
    wrong in that rule alone steps differently beyond the profile's bounds."""

    case: object  # gefen_conformance.workload.space.InputCase


def _p(device, *shape, dtype=torch.float32) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.zeros(shape or (4,), dtype=dtype, device=device))


def _one(**kwargs) -> Callable:
    """One valid parameter and ``kwargs``."""
    return lambda device: ([_p(device)], kwargs)


def _params(make: Callable) -> Callable:
    """``make(device)`` as the parameter list, default hyperparameters."""
    return lambda device: (make(device), {})


def _same_twice(device):
    a = _p(device)
    return [a, a]


def _same_in_two_groups(device):
    a = _p(device)
    return [{"params": [a]}, {"params": [a]}]


def _groups_then_tensor(device):
    return [{"params": [_p(device)]}, _p(device)]


def _one_group_of(count: int) -> Callable:
    def holds(optimizer, params) -> str | None:
        groups = optimizer.param_groups
        if len(groups) != 1 or len(groups[0]["params"]) != count:
            sizes = [len(g["params"]) for g in groups]
            return f"groups of {sizes} params, expected one group of {count}"
        if any(a is not b for a, b in zip(groups[0]["params"], params)):
            return "the group does not hold the tensors given, in order"
        return None

    return holds


#: SPEC 1.1.2 (rows 8-10 bind the reference only) and 1.1.6: each row's examples.
CONSTRUCTOR = [
    Refused("1.1.2#1", "deterministic-int", _one(deterministic=1), TypeError, "deterministic"),
    Refused("1.1.2#1", "deterministic-str", _one(deterministic="yes"), TypeError, "deterministic"),
    Refused("1.1.2#2", "lr-negative", _one(lr=-1.0), ValueError, "learning rate"),
    Refused("1.1.2#2", "lr-nan", _one(lr=float("nan")), ValueError, "learning rate"),
    Refused(
        "1.1.2#2",
        "lr-two-elements",
        lambda d: ([_p(d)], {"lr": torch.tensor([1e-3, 2e-3])}),
        ValueError,
        "lr",
    ),
    Refused("1.1.2#3", "betas-three", _one(betas=(0.9, 0.999, 0.5)), ValueError, "betas"),
    Refused("1.1.2#3", "betas-one", _one(betas=(0.9,)), ValueError, "betas"),
    Refused("1.1.2#4", "beta1-one", _one(betas=(1.0, 0.999)), ValueError, "beta"),
    Refused("1.1.2#4", "beta2-negative", _one(betas=(0.9, -0.5)), ValueError, "beta"),
    Refused("1.1.2#4", "beta2-nan", _one(betas=(0.9, float("nan"))), ValueError, "beta"),
    Refused("1.1.2#5", "weight-decay-negative", _one(weight_decay=-1.0), ValueError, "weight_decay"),
    Refused("1.1.2#5", "weight-decay-nan", _one(weight_decay=float("nan")), ValueError, "weight_decay"),
    Refused("1.1.2#6", "eps-zero", _one(eps=0.0), ValueError, "eps"),
    Refused("1.1.2#6", "eps-inf", _one(eps=float("inf")), ValueError, "eps"),
    Refused("1.1.2#6", "eps-negative", _one(eps=-1e-8), ValueError, "eps"),
    Refused(
        "1.1.2#7", "refresh-negative", _one(codebook_refresh_every=-1), ValueError, "codebook_refresh_every"
    ),
    Refused(
        "1.1.2#11", "substrings-str", _one(period_one_substrings="emb"), TypeError, "period_one_substrings"
    ),
    Refused(
        "1.1.2#11", "substrings-bytes", _one(period_one_substrings=b"emb"), TypeError, "period_one_substrings"
    ),
    Refused(
        "1.1.2#11",
        "substrings-non-str",
        _one(period_one_substrings=("emb", 3)),
        TypeError,
        "period_one_substrings",
    ),
    Built("1.1.6#1", "bare-tensor", lambda d: (_p(d), {}), lambda opt, p: _one_group_of(1)(opt, [p])),
    Refused("1.1.6#2", "empty", _params(lambda d: []), ValueError, "empty parameter list"),
    Refused("1.1.6#3", "dict-then-tensor", _params(_groups_then_tensor), TypeError),
    Built("1.1.6#4", "tensors", lambda d: ([_p(d), _p(d, 3)], {}), _one_group_of(2)),
    Refused("1.1.6#5", "not-a-tensor", _params(lambda d: [_p(d), 3.0]), TypeError),
    Refused("1.1.6#5", "named-non-tensor", _params(lambda d: [("a", _p(d)), ("b", [1.0])]), TypeError),
    Refused("1.1.6#6", "triple", _params(lambda d: [("a", _p(d), 1)]), ValueError),
    Refused("1.1.6#7", "complex", _params(lambda d: [_p(d, dtype=torch.complex64)]), ValueError, "complex"),
    Refused("1.1.6#8", "twice-in-a-group", _params(_same_twice), ValueError, "more than one parameter group"),
    Refused(
        "1.1.6#8",
        "twice-across-groups",
        _params(_same_in_two_groups),
        ValueError,
        "more than one parameter group",
    ),
    Refused("1.1.6#9", "group-without-params", _params(lambda d: [{"lr": 1e-3}]), ValueError, "params"),
    Refused(
        "1.1.6#10", "group-of-none", _params(lambda d: [{"params": []}]), ValueError, "empty parameter list"
    ),
]


# ------------------------------------------------------------------------------ native loads


@dataclass(frozen=True)
class LoadRefused(Example):
    """A checkpoint the rule refuses: ValueError (or ``error``), and nothing changed (SPEC 1.12.9)."""

    change: Callable[[dict], None]
    error: type = ValueError
    words: str | None = None


@dataclass(frozen=True)
class LoadAccepted(Example):
    """A checkpoint the rule accepts: it loads as the reference loads it, exactly (every profile),
    into an optimizer built with ``options``."""

    change: Callable[[dict], None]
    options: tuple = ()


def _metadata(sd: dict) -> list:
    """Each group's metadata, made the group's own dict first (a saved checkpoint may share one
    dict between its groups, and a change to one group's must not reach the others')."""
    for g in sd["param_groups"]:
        g["_gefen_checkpoint_metadata"] = dict(g["_gefen_checkpoint_metadata"])
    return [g["_gefen_checkpoint_metadata"] for g in sd["param_groups"]]


def _every_metadata(key: str, value) -> Callable:
    def change(sd):
        for m in _metadata(sd):
            m[key] = value() if callable(value) else value

    return change


def _top(key: str, value) -> Callable:
    def change(sd):
        sd[key] = value

    return change


def _drop_top(key: str) -> Callable:
    return lambda sd: sd.pop(key)


def _group(index: int, key: str, value) -> Callable:
    def change(sd):
        sd["param_groups"][index][key] = value

    return change


def _state(pid: int, key: str, value) -> Callable:
    """State entry ``pid``'s ``key`` set to ``value(entry)`` (a function of the entry) or ``value``."""

    def change(sd):
        entry = sd["state"][pid]
        entry[key] = value(entry) if callable(value) else value

    return change


def _drop_state(pid: int, *keys: str) -> Callable:
    def change(sd):
        for key in keys:
            del sd["state"][pid][key]

    return change


def _poked(key: str, index, value) -> Callable:
    """A copy of the entry's ``key`` with ``[index] = value``."""

    def make(entry):
        t = entry[key].clone()
        t[index] = value
        return t

    return make


def _codebook(edit: Callable) -> Callable:
    """The resolved codebook, at the top and in every group's metadata, replaced by ``edit(cb)``."""

    def change(sd):
        cb = edit(sd["gefen_codebook"].clone())
        sd["gefen_codebook"] = cb
        for m in _metadata(sd):
            m["codebook"] = None if cb is None else cb.clone()

    return change


def _disagreeing(top: str, key: str, value) -> Callable:
    """The groups' metadata disagree on ``key`` (group 1 holds ``value``) and the top level holds
    none of it, so that only the groups' agreement is broken."""

    def change(sd):
        sd.pop(top)
        _metadata(sd)[1][key] = value

    return change


def _global_step(value) -> Callable:
    """The global step ``value`` at the top and in every group's metadata."""

    def change(sd):
        sd["gefen_global_step"] = value
        for m in _metadata(sd):
            m["global_step"] = value

    return change


def _no_global_step(sd: dict) -> None:
    """No global step at the top level nor in any group's metadata: it is 0 (SPEC 1.12.2#6)."""
    sd.pop("gefen_global_step")
    for m in _metadata(sd):
        m.pop("global_step")


def _no_metadata_on_group(index: int) -> Callable:
    return lambda sd: sd["param_groups"][index].pop("_gefen_checkpoint_metadata")


def _untagged(sd: dict) -> None:
    sd.pop("gefen_deterministic")
    for m in _metadata(sd):
        m.pop("deterministic")


def _tagged_true(sd: dict) -> None:
    sd["gefen_deterministic"] = True
    for m in _metadata(sd):
        m["deterministic"] = True


def _param_moved_to_group_0(sd: dict) -> None:
    g0, g1 = sd["param_groups"]
    g0["params"].append(g1["params"].pop(0))
    g0["param_names"].append(g1["param_names"].pop(0))
    g0["param_names_synthesized"].append(g1["param_names_synthesized"].pop(0))


def legacy(sd: dict, *, differ: bool = False) -> None:
    """``sd`` as a legacy checkpoint (SPEC 1.12.7): one group per parameter, each with its group's
    hyperparameters and its name as the group's ``name``, no ``param_names``. ``differ``: the
    second parameter of group 1 saved with another ``eps`` (which packing refuses)."""
    groups = []
    for group in sd["param_groups"]:
        for k, (pid, name) in enumerate(zip(group["params"], group["param_names"])):
            single = {
                key: (value.clone() if torch.is_tensor(value) else value)
                for key, value in group.items()
                if key
                not in ("params", "param_names", "param_names_synthesized", "_gefen_checkpoint_metadata")
            }
            single.update(params=[pid], name=name.upper())
            single["_gefen_checkpoint_metadata"] = dict(group["_gefen_checkpoint_metadata"])
            if differ and group is sd["param_groups"][1] and k == 1:
                single["eps"] = group["eps"] * 2
            groups.append(single)
    sd["param_groups"] = groups


#: SPEC 1.12.2-1.12.7: each rule's examples; ``p0`` is the parameter ``weight`` (24 x 80 blocks),
#: ``p7`` is ``late`` (no state).
NATIVE_LOAD = [
    LoadRefused("1.12.2#1", "deterministic-tag-int", _top("gefen_deterministic", 0)),
    LoadRefused("1.12.2#2", "metadata-on-one-group", _no_metadata_on_group(1)),
    LoadRefused("1.12.2#3", "format-version-7", _every_metadata("format_version", 7)),
    LoadRefused("1.12.2#3", "format-version-3", _every_metadata("format_version", 3)),
    LoadAccepted("1.12.2#3", "format-version-2", _every_metadata("format_version", 2)),
    LoadRefused("1.12.2#4", "metadata-deterministic-int", _every_metadata("deterministic", 0)),
    LoadRefused(
        "1.12.2#5", "groups-disagree-on-global-step", _disagreeing("gefen_global_step", "global_step", 4)
    ),
    LoadRefused(
        "1.12.2#5",
        "groups-disagree-on-codebook",
        _disagreeing("gefen_codebook", "codebook", torch.linspace(-1, 1, 256)),
    ),
    LoadRefused("1.12.2#6", "top-global-step-disagrees", _top("gefen_global_step", 5)),
    LoadAccepted("1.12.2#6", "global-step-from-metadata", _drop_top("gefen_global_step")),
    LoadAccepted("1.12.2#6", "global-step-absent-everywhere", _no_global_step),
    LoadRefused("1.12.2#7", "deterministic-differs", _tagged_true),
    LoadAccepted("1.12.2#7", "untagged-keeps-live-setting", _untagged, (("deterministic", True),)),
    LoadRefused("1.12.2#8", "momentum-without-codebook", _codebook(lambda cb: None)),
    LoadRefused("1.12.3#2", "group-sizes-differ", _param_moved_to_group_0),
    LoadRefused("1.12.3#3", "group-without-eps", lambda sd: sd["param_groups"][1].pop("eps")),
    LoadRefused("1.12.3#4", "param-names-short", lambda sd: sd["param_groups"][0]["param_names"].pop()),
    LoadRefused("1.12.4#1", "counter-float", _state(0, "step", 3.0)),
    LoadRefused("1.12.4#1", "counter-bool", _state(0, "step", True)),
    LoadRefused("1.12.4#1", "counter-numpy", _state(0, "step", np.int64(3))),
    LoadRefused("1.12.4#1", "global-step-negative", _global_step(-1)),
    LoadRefused("1.12.4#1", "counter-fractional-tensor", _state(0, "step", torch.tensor(2.5))),
    LoadRefused("1.12.4#1", "global-step-negative-tensor", _global_step(torch.tensor(-1))),
    LoadRefused("1.12.4#1", "counter-two-element-tensor", _state(0, "step", torch.tensor([3, 3]))),
    LoadRefused("1.12.4#1", "global-step-float", _top("gefen_global_step", 3.0)),
    LoadAccepted("1.12.4#1", "counter-one-element-1d-tensor", _state(0, "step", torch.tensor([3]))),
    LoadAccepted("1.12.4#1", "counter-0d-tensor", _state(0, "vmean_step", torch.tensor(3))),
    LoadRefused("1.12.4#2", "period-not-dividing", _state(0, "automatic_period", 7)),
    LoadRefused("1.12.4#2", "period-bool", _state(8, "automatic_period", True)),
    LoadRefused("1.12.4#2", "period-numpy", _state(0, "automatic_period", np.int64(80))),
    LoadRefused("1.12.4#2", "period-zero", _state(0, "automatic_period", 0)),
    LoadRefused("1.12.4#3", "step-without-momentum", _state(7, "step", 3)),
    LoadRefused("1.12.4#4", "indices-int64", _state(0, "m_codebook", lambda e: e["m_codebook"].long())),
    LoadRefused(
        "1.12.4#4",
        "indices-transposed",
        _state(0, "m_codebook", lambda e: e["m_codebook"].reshape(80, 24).clone()),
    ),
    LoadRefused(
        "1.12.4#4", "magnitude-negative", _state(0, "m_magnitude", _poked("m_magnitude", (5, 0), -0.5))
    ),
    LoadRefused(
        "1.12.4#4", "magnitude-nan", _state(0, "m_magnitude", _poked("m_magnitude", (23, 0), float("nan")))
    ),
    LoadRefused("1.12.4#4", "momentum-at-step-0", _state(0, "step", 0)),
    LoadRefused("1.12.4#4", "momentum-without-magnitude", _drop_state(0, "m_magnitude")),
    LoadRefused("1.12.4#5", "vmean-negative", _state(2, "vmean", _poked("vmean", (7, 0), -0.5))),
    LoadRefused("1.12.4#5", "vmean-shape", _state(2, "vmean", lambda e: e["vmean"].reshape(1, 24).clone())),
    LoadRefused("1.12.4#5", "vmean-step-without-vmean", _drop_state(2, "vmean")),
    LoadRefused("1.12.4#5", "vmean-step-zero", _state(2, "vmean_step", 0)),
    LoadAccepted("1.12.4#5", "vmean-without-its-step", _drop_state(2, "vmean_step")),
    LoadRefused("1.12.4#6", "unknown-key", _state(0, "momentum_buffer", lambda e: e["m_magnitude"].clone())),
    LoadAccepted("1.12.4#6", "scratch-keys", _state(0, "_capt_lr", lambda e: torch.ones(1))),
    LoadAccepted(
        "1.12.4#6", "legacy-shape-key", _state(0, "m_codebook_shape", lambda e: list(e["m_codebook"].shape))
    ),
    LoadRefused(
        "1.12.5",
        "codebook-first-not-minus-one",
        _codebook(lambda cb: cb.index_fill_(0, torch.tensor([0]), -1.5)),
    ),
    LoadRefused(
        "1.12.5", "codebook-unsorted", _codebook(lambda cb: cb.index_fill_(0, torch.tensor([100]), 0.9))
    ),
    LoadRefused("1.12.5", "codebook-float64", _codebook(lambda cb: cb.double())),
    LoadRefused("1.12.5", "codebook-255", _codebook(lambda cb: torch.cat([cb[:128], cb[129:]]))),
    LoadRefused("1.12.6", "eps-zero", _group(1, "eps", 0.0)),
    LoadRefused("1.12.6", "lr-negative", _group(1, "lr", -1.0)),
    LoadRefused("1.12.6", "beta1-one", _group(0, "beta1", 1.0)),
    LoadAccepted("1.12.7", "legacy-packed", legacy),
    LoadRefused(
        "1.12.7", "legacy-hyperparameters-differ", lambda sd: legacy(sd, differ=True), ValueError, "legacy"
    ),
]


# ------------------------------------------------------------------------------ refused steps


@dataclass(frozen=True)
class StepRefused(Example):
    """A ``step()`` call the rule refuses: ``error`` naming ``words`` (SPEC 0.2.3), and nothing
    changed (SPEC 1.10.5). The call is the calling protocol's (:mod:`gefen_conformance.suite.protocol`:
    its workload, the reference's checkpoint loaded, or none when ``fresh``, so that the call
    learns the codebook) with every gradient set, then ``spoil(params)`` (``{name: parameter}``)
    makes it invalid; ``attributes``: the GradScaler attributes set on the optimizer for the call,
    ``((name, value), ...)``, each value a one-element tensor on the run's device."""

    spoil: Callable[[dict], None]
    error: type = RuntimeError
    words: str | None = None
    attributes: tuple = ()
    fresh: bool = False


def sparse_grad(name: str) -> Callable:
    """Parameter ``name`` 's gradient as a sparse COO tensor (its values unchanged)."""

    def spoil(params):
        params[name].grad = params[name].grad.to_sparse()

    return spoil


def complex_grad(name: str) -> Callable:
    """Parameter ``name`` 's gradient data replaced by its complex64 copy (``.grad.data``: torch
    refuses to assign a complex ``.grad`` to a real parameter, not to replace its data)."""

    def spoil(params):
        grad = params[name].grad
        grad.data = grad.to(torch.complex64)

    return spoil


def transposed_grad(name: str) -> Callable:
    """Parameter ``name`` 's (2-D) gradient data replaced by its transpose: the same elements in
    another shape (torch refuses a ``.grad`` of another shape, not replacing its data)."""

    def spoil(params):
        grad = params[name].grad
        grad.data = grad.t().contiguous()

    return spoil


def valid(params) -> None:
    """Nothing spoiled (the call is refused by its GradScaler attributes alone)."""

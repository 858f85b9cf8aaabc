"""The examples of the rules the constructor, a native state dict and a native load state (SPEC
1.1-1.4, 1.11, 1.12): one row per rule example, each making exactly one thing invalid (SPEC 1.1.4)
or showing one input a rule accepts and what it builds. :mod:`gefen_conformance.suite.rule_checks`
runs them.

The tables: :data:`CONSTRUCTOR` (its validation, signature, groups, names and a tensor ``lr``, as
``defaults`` and ``param_groups`` show them), :data:`NATIVE_STATE` (what ``state_dict()`` shows,
after at most two seeded steps, and a round trip), :data:`NATIVE_LOAD` and :data:`SHARDED_LOAD`
(loads into DTensor parameters). The example types of the step's rules (:class:`Stepped`,
:class:`StepRefused`) are here too; their tables are in
:mod:`gefen_conformance.suite.step_rule_examples`.

A constructor example builds its call from the device (``call(device) -> (params, kwargs)``); a load
example changes a deep copy of the reference's native checkpoint in place
(``change(checkpoint)``, the checkpoint of :func:`gefen_conformance.suite.protocol.checkpoint`: two
groups, a tensor ``lr`` in group 0, nine parameters of the block path, ``late`` without state).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gefen_conformance.implementations.contract import FACTORED_V


@dataclass(frozen=True)
class Example:
    """One example of the rule ``rule`` (SPEC 0.2.4), named ``what`` within its test."""

    rule: str
    what: str


@dataclass(frozen=True)
class Refused(Example):
    """A call the rule refuses: ``error`` naming ``words`` (SPEC 0.2.3), before anything is built.
    ``unless``: an extended option (SPEC 1.1.5) whose declaration by the implementation lifts the
    refusal, or None."""

    call: Callable
    error: type = ValueError
    words: str | None = None
    unless: str | None = None


@dataclass(frozen=True)
class Built(Example):
    """A call the rule accepts, and what it builds: ``holds(optimizer, params, kwargs)`` (the call's
    arguments as given) returns what is wrong, or None. ``requires``: the capability the example
    needs (SPEC 4.1.3), or None."""

    call: Callable
    holds: Callable
    requires: object = None


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
    def holds(optimizer, params, kwargs) -> str | None:
        groups = optimizer.param_groups
        if len(groups) != 1 or len(groups[0]["params"]) != count:
            sizes = [len(g["params"]) for g in groups]
            return f"groups of {sizes} params, expected one group of {count}"
        if any(a is not b for a, b in zip(groups[0]["params"], params)):
            return "the group does not hold the tensors given, in order"
        return None

    return holds


#: SPEC 1.1.2 (rows 8-10 bind the reference only) and 1.1.6: each row's examples.
VALIDATION = [
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
        "1.1.2#8",
        "refresh-positive",
        _one(codebook_refresh_every=100),
        ValueError,
        "codebook_refresh_every",
        unless="codebook_refresh_every",
    ),
    Refused("1.1.2#9", "capturable", _one(capturable=True), ValueError, "capturable", unless="capturable"),
    Refused(
        "1.1.2#10",
        "stochastic-round",
        _one(stochastic_round=True),
        ValueError,
        "stochastic_round",
        unless="stochastic_round",
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
    Built("1.1.6#1", "bare-tensor", lambda d: (_p(d), {}), lambda opt, p, kw: _one_group_of(1)(opt, [p], kw)),
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


def _groups(*sizes: int) -> Callable:
    """Group dicts of ``sizes`` fresh parameters each, default hyperparameters."""
    return _params(lambda d: [{"params": [_p(d) for _ in range(n)]} for n in sizes])


def _all(*holds: Callable) -> Callable:
    """Every one of ``holds``, the first problem found."""

    def check(optimizer, params, kwargs) -> str | None:
        for h in holds:
            problem = h(optimizer, params, kwargs)
            if problem:
                return problem
        return None

    return check


def _given_groups(optimizer, params, kwargs) -> str | None:
    """One stored group per group dict given, in order, each holding the tensors given, in order
    (SPEC 1.2.2)."""
    stored = [list(g["params"]) for g in optimizer.param_groups]
    given = [list(g["params"]) for g in params]
    sizes = ([len(g) for g in given], [len(g) for g in stored])
    if sizes[0] != sizes[1]:
        return f"groups of {sizes[1]} params, expected the caller's {sizes[0]}"
    if any(a is not b for s, g in zip(stored, given) for a, b in zip(s, g)):
        return "a stored group does not hold the tensors given to it, in order"
    return None


def _defaults(**expected) -> Callable:
    """``optimizer.defaults`` is ``expected``: the same keys, values of the same type and value."""

    def holds(optimizer, params, kwargs) -> str | None:
        got = dict(optimizer.defaults)
        if set(got) != set(expected):
            return f"defaults keys {sorted(got)}, expected {sorted(expected)}"
        wrong = [k for k, v in expected.items() if type(got[k]) is not type(v) or got[k] != v]
        return f"defaults {got}, expected {expected}" if wrong else None

    return holds


#: The constructor's defaults (SPEC 1.1.1, 1.1.7: ``betas`` stored as ``beta1``, ``beta2``).
DEFAULTS = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}

#: Every keyword of the signature, at its default (SPEC 1.1.1).
KEYWORDS = {
    "lr": 1e-3,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "factored_v_2d": True,
    "deterministic": False,
    "force_1d_period_one": False,
    "force_2d_period_one": False,
    "period_one_substrings": (),
    "fused": True,
    "capturable": False,
    "stochastic_round": False,
    "codebook_refresh_every": 0,
    "verbose": False,
}

#: A group's keys when the caller gave none of its own and it has no ``name`` (SPEC 1.2.4).
GROUP_KEYS = {
    "params",
    "param_names",
    "param_names_synthesized",
    "lr",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
}


def _fused_not_stored(optimizer, params, kwargs) -> str | None:
    where = ["defaults"] if "fused" in optimizer.defaults else []
    where += [f"group {i}" for i, g in enumerate(optimizer.param_groups) if "fused" in g]
    return f"fused stored in {', '.join(where)} (SPEC 1.1.5)" if where else None


def _group_keys(optimizer, params, kwargs) -> str | None:
    """The implicit group holds the keys an explicit group of the same params would, no more."""
    (group,) = optimizer.param_groups
    keys = set(group)
    return None if keys == GROUP_KEYS else f"the implicit group's keys {sorted(map(str, keys))}"


def _hypers(*expected: dict) -> Callable:
    """Each stored group's hyperparameters are ``expected[i]`` (values and types)."""

    def holds(optimizer, params, kwargs) -> str | None:
        for i, (group, want) in enumerate(zip(optimizer.param_groups, expected)):
            got = {k: group.get(k) for k in want}
            if any(type(got[k]) is not type(v) or got[k] != v for k, v in want.items()):
                return f"group {i} resolved {got}, expected {want}"
        return None

    return holds


def _group_names(*expected) -> Callable:
    """Each stored group's ``name`` is ``expected[i]`` (None: no ``name`` key)."""

    def holds(optimizer, params, kwargs) -> str | None:
        got = [g.get("name") for g in optimizer.param_groups]
        has = ["name" in g for g in optimizer.param_groups]
        if got != list(expected) or has != [e is not None for e in expected]:
            shown = [g["name"] if "name" in g else "<none>" for g in optimizer.param_groups]
            return f"group names {shown!r}, expected {list(expected)!r}"
        return None

    return holds


def _names(*expected: tuple) -> Callable:
    """Each stored group's ``(param_names, param_names_synthesized)`` is ``expected[i]``, a pair of
    a list of names and a string of flags (``"TF"``: synthesized, caller-named)."""

    def holds(optimizer, params, kwargs) -> str | None:
        got = [
            (list(g["param_names"]), "".join("T" if f else "F" for f in g["param_names_synthesized"]))
            for g in optimizer.param_groups
        ]
        types = {type(f) for g in optimizer.param_groups for f in g["param_names_synthesized"]}
        types |= {type(n) for g in optimizer.param_groups for n in g["param_names"]}
        if got != [(list(n), f) for n, f in expected] or not types <= {str, bool}:
            return f"names and flags {got}, expected {list(expected)}"
        return None

    return holds


def _added(group: Callable, holds: Callable) -> Callable:
    """``holds`` after ``add_param_group(group(device))`` on the built optimizer."""

    def check(optimizer, params, kwargs) -> str | None:
        first = optimizer.param_groups[0]["params"][0]
        optimizer.add_param_group(group(first.device))
        return holds(optimizer, params, kwargs)

    return check


def _lr_as_given(optimizer, params, kwargs) -> str | None:
    """``defaults["lr"]`` is the constructor's tensor; each group's ``lr`` is its own tensor as given,
    or the default's object where the group gave none (SPEC 1.2.8, 1.4.1)."""
    given = kwargs["lr"]
    if optimizer.defaults["lr"] is not given:
        return f"defaults['lr'] is not the tensor given: {optimizer.defaults['lr']!r}"
    for i, (group, caller) in enumerate(zip(optimizer.param_groups, params)):
        want = caller.get("lr", given)
        if group["lr"] is not want:
            whose = "its own" if "lr" in caller else "the default's"
            return f"group {i}'s lr {group['lr']!r} is not {whose} tensor {want!r}"
        if tuple(group["lr"].shape) != tuple(want.shape) or not torch.equal(group["lr"], want):
            return f"group {i}'s lr changed to {group['lr']!r}"
    return None


#: SPEC 1.1.1 (the signature), 1.1.2 row 12 (the parameter list checked after rows 2-6, the order
#: SPEC 1.1.4 lets the suite certify) and 1.1.5 (option semantics).
SIGNATURE = [
    Built("1.1.1", "every-keyword-at-its-default", _one(**KEYWORDS), _defaults(**DEFAULTS)),
    Built("1.1.1", "defaults", _one(), _defaults(**DEFAULTS)),
    Refused("1.1.2#12", "eps-before-an-empty-list", lambda d: ([], {"eps": 0.0}), ValueError, "eps"),
    Refused("1.1.2#12", "lr-before-an-empty-list", lambda d: ([], {"lr": -1.0}), ValueError, "learning rate"),
    Built("1.1.5", "fused-not-stored", _one(fused=False), _fused_not_stored),
]

#: SPEC 1.2: parameter groups.
GROUPS = [
    Built(
        "1.2.1",
        "implicit-group",
        lambda d: ([_p(d), ("b", _p(d, 3))], {}),
        _all(lambda opt, p, kw: _one_group_of(2)(opt, [p[0], p[1][1]], kw), _group_keys),
    ),
    Built("1.2.2", "caller-groups-kept", _groups(2, 1, 3), _given_groups),
    Built(
        "1.2.3",
        "resolution",
        lambda d: (
            [
                {"params": [_p(d)], "betas": (0.5, 0.6), "beta1": 0.7},
                {"params": [_p(d)], "beta2": 0.95},
                {"params": [_p(d)], "lr": 0.5, "eps": 1e-7, "weight_decay": 0.2},
            ],
            {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.1},
        ),
        _hypers(
            {"lr": 0.01, "beta1": 0.5, "beta2": 0.6, "eps": 1e-6, "weight_decay": 0.1},
            {"lr": 0.01, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6, "weight_decay": 0.1},
            {"lr": 0.5, "beta1": 0.8, "beta2": 0.9, "eps": 1e-7, "weight_decay": 0.2},
        ),
    ),
    Refused(
        "1.2.3",
        "group-eps-before-its-params",
        _params(lambda d: [{"params": [_p(d), 3.0], "eps": 0.0}]),
        ValueError,
        "eps",
    ),
    Built(
        "1.2.5",
        "group-names",
        _params(
            lambda d: [
                {"params": [_p(d)], "name": "Emb"},
                {"params": [_p(d), _p(d)], "name": 7},
                {"params": [("X.Y", _p(d))]},
                {"params": [_p(d), _p(d)]},
                {"params": [_p(d)], "name": None},
            ]
        ),
        _group_names("emb", "7", "x.y", None, "group_4_param_0"),
    ),
    Built(
        "1.2.8",
        "tensor-lr-shared",
        lambda d: (
            [
                {"params": [_p(d)]},
                {"params": [_p(d)], "lr": torch.tensor(0.5, device=d)},
                {"params": [_p(d)]},
            ],
            {"lr": torch.tensor(0.01, device=d)},
        ),
        _lr_as_given,
    ),
]

#: SPEC 1.3: parameter names and their provenance (1.3.4's worked examples, one row each).
NAMES = [
    Built(
        "1.3.2",
        "caller-names",
        _params(lambda d: [("W", _p(d)), ("w", _p(d)), (3, _p(d)), ("Layer.Weight", _p(d))]),
        _names((["w", "w", "3", "layer.weight"], "FFFF")),
    ),
    Built(
        "1.3.3",
        "taken-within-the-group",
        _params(lambda d: [("param_1", _p(d)), _p(d)]),
        _names((["param_1", "param_1_1"], "FT")),
    ),
    Built(
        "1.3.3",
        "taken-across-groups",
        _params(
            lambda d: [
                {"params": [("group_1_param_0", _p(d)), ("Emb", _p(d))]},
                {"params": [_p(d)]},
                {"params": [_p(d)], "name": "EMB"},
                {"params": [_p(d)], "name": "Other"},
            ]
        ),
        _names(
            (["group_1_param_0", "emb"], "FF"),
            (["group_1_param_0_1"], "T"),
            (["emb_1"], "T"),
            (["other"], "F"),
        ),
    ),
    Built(
        "1.3.3",
        "added-group",
        _params(lambda d: [_p(d)]),
        _added(
            lambda d: {"params": [_p(d), ("Param_0", _p(d)), _p(d)]},
            _names((["param_0"], "T"), (["group_1_param_0", "param_0", "group_1_param_2"], "TFT")),
        ),
    ),
    Built("1.3.4", "two-tensors", _params(lambda d: [_p(d), _p(d)]), _names((["param_0", "param_1"], "TT"))),
    Built(
        "1.3.4",
        "named-then-not",
        _params(lambda d: [("Layer.Weight", _p(d)), _p(d)]),
        _names((["layer.weight", "param_1"], "FT")),
    ),
    Built(
        "1.3.4",
        "same-name-thrice",
        _params(lambda d: [("w", _p(d)), ("w", _p(d)), ("W", _p(d))]),
        _names((["w", "w", "w"], "FFF")),
    ),
    Built("1.3.4", "int-name", _params(lambda d: [(3, _p(d))]), _names((["3"], "F"))),
    Built("1.3.4", "bare-tensor-named", lambda d: (_p(d), {}), _names((["param_0"], "T"))),
    Built(
        "1.3.4",
        "four-groups",
        _params(
            lambda d: [
                {"params": [_p(d), _p(d)]},
                {"params": [("A", _p(d))], "lr": 1e-4},
                {"params": [_p(d)], "name": "Emb"},
                {"params": [_p(d)], "name": "emb"},
            ]
        ),
        _all(
            _names(
                (["group_0_param_0", "group_0_param_1"], "TT"), (["a"], "F"), (["emb"], "F"), (["emb_1"], "T")
            ),
            _group_names(None, "a", "emb", "emb"),
        ),
    ),
]

#: SPEC 1.4: a tensor learning rate.
TENSOR_LR = [
    Built(
        "1.4.1",
        "tensor-lr-any-shape",
        lambda d: (
            [{"params": [_p(d)]}, {"params": [_p(d)], "lr": torch.full((1, 1, 1), 0.5, device=d)}],
            {"lr": torch.full((1, 1), 0.01, device=d)},
        ),
        _lr_as_given,
    ),
]

CONSTRUCTOR = VALIDATION + SIGNATURE + GROUPS + NAMES + TENSOR_LR


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


def _flags(change: Callable) -> Callable:
    """Group 0's saved ``param_names`` and ``param_names_synthesized`` (a list, or None to drop it)
    replaced by ``change(names, flags)``; the live names are the checkpoint's, all caller-given."""

    def edit(sd):
        group = sd["param_groups"][0]
        names, flags = change(list(group["param_names"]), list(group["param_names_synthesized"]))
        group["param_names"] = names
        if flags is None:
            del group["param_names_synthesized"]
        else:
            group["param_names_synthesized"] = flags

    return edit


def _late_defect(sd: dict) -> None:
    """Group 1 saved with other hyperparameters, scratch keys in the first entry, and a defect in
    the last entry with momentum, found only by Stage C after everything before it passed: a
    refusal that changes nothing must not commit the hyperparameters, nor drop the caller's keys."""
    group = sd["param_groups"][1]
    group.update(lr=0.5, eps=1e-6, weight_decay=0.25)
    sd["state"][0]["stepsize"] = torch.ones(1)
    last = max(pid for pid, e in sd["state"].items() if "m_magnitude" in e)
    magnitude = sd["state"][last]["m_magnitude"].clone()
    magnitude[-1, 0] = float("nan")
    sd["state"][last]["m_magnitude"] = magnitude


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
    LoadAccepted("1.12.3#1", "legacy-packed-before-the-group-count", legacy),
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
    LoadRefused("1.12.1", "without-param-groups", _drop_top("param_groups")),
    LoadRefused("1.12.9", "late-defect", _late_defect),
    LoadAccepted("1.3.6", "same-name-keeps-the-live-flag", _flags(lambda n, f: (n, [True] + f[1:]))),
    LoadAccepted(
        "1.3.6", "renamed-takes-the-saved-flag", _flags(lambda n, f: (["renamed"] + n[1:], [True] + f[1:]))
    ),
    LoadAccepted(
        "1.3.6", "renamed-without-flags-fails-closed", _flags(lambda n, f: (["renamed"] + n[1:], None))
    ),
]


# ------------------------------------------------------------------------------ native state dicts


@dataclass(frozen=True)
class RoundTrip(Example):
    """``load_state_dict(state_dict())`` into a fresh optimizer built the same way (``call``, whose
    parameters are ``(name, tensor)`` pairs) after ``before`` steps, then ``after`` identical steps
    of both: the two MUST stay bitwise identical (SPEC 1.12.10), in every profile (an implementation
    is compared with itself)."""

    call: Callable
    before: int = 2
    after: int = 2


def feed(optimizer, step: int, skip: tuple = (), zero: tuple = ()) -> None:
    """Seeded gradients for every parameter of ``optimizer`` (by its position across groups) but
    those in ``skip`` (no gradient) and ``zero`` (a zero gradient), then one step."""
    g = torch.Generator().manual_seed(1000 + step)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        values = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if i in skip:
            p.grad = None
        else:
            p.grad = (torch.zeros_like(values) if i in zero else values).to(p.device, p.dtype)
    optimizer.step()


def _stepped(steps: int, holds: Callable, **feeding) -> Callable:
    """``holds`` after ``steps`` steps with :func:`feed`'s gradients."""

    def check(optimizer, params, kwargs) -> str | None:
        for i in range(steps):
            feed(optimizer, i, **feeding)
        return holds(optimizer, params, kwargs)

    return check


def _saved(check: Callable) -> Callable:
    """``check(state_dict, optimizer)`` on the optimizer's native state dict."""
    return lambda optimizer, params, kwargs: check(optimizer.state_dict(), optimizer)


def _entries(expected: dict) -> Callable:
    """The saved per-param entries are exactly ``expected`` (``{id: {"name": ...}}``)."""

    def check(sd, optimizer) -> str | None:
        got = {k: dict(v) for k, v in sd["state"].items()}
        return None if got == expected else f"state entries {got!r:.200}, expected {expected!r}"

    return _saved(check)


def _names_everywhere(sd, optimizer) -> str | None:
    """Every parameter has one lowercase name, the same in its group's ``param_names`` and its state
    entry (SPEC 1.3.1)."""
    for group in sd["param_groups"]:
        if len(group["param_names"]) != len(group["params"]):
            return f"param_names {group['param_names']} for {len(group['params'])} params"
        for pid, name in zip(group["params"], group["param_names"]):
            if type(name) is not str or name != name.lower():
                return f"parameter {pid}'s name {name!r} is not a lowercase str"
            entry = sd["state"].get(pid, {})
            if entry.get("name") != name:
                return f"parameter {pid}'s state name {entry.get('name')!r}, its group's {name!r}"
    return None


TOP_LEVEL = {"state", "param_groups", "gefen_global_step", "gefen_deterministic", "gefen_codebook"}


def _top_level(step: int, deterministic: bool, codebook: bool) -> Callable:
    def check(sd, optimizer) -> str | None:
        if set(sd) != TOP_LEVEL:
            return f"top-level keys {sorted(map(str, sd))}, expected {sorted(TOP_LEVEL)}"
        got = (sd["gefen_global_step"], sd["gefen_deterministic"])
        if type(got[0]) is not int or got[0] != step or type(got[1]) is not bool or got[1] != deterministic:
            return (
                f"gefen_global_step, gefen_deterministic {got!r}, expected int {step}, bool {deterministic}"
            )
        cb = sd["gefen_codebook"]
        if not codebook:
            return None if cb is None else f"gefen_codebook {cb!r:.60} before the first learn, expected None"
        if not torch.is_tensor(cb) or cb.dtype != torch.float32 or tuple(cb.shape) != (256,):
            return f"gefen_codebook {cb!r:.60}, expected an fp32 tensor [256]"
        return None

    return _saved(check)


def _is_int(value, low: int = 1) -> bool:
    return type(value) is int and value >= low


def _tensor(t, dtype, shape) -> bool:
    return torch.is_tensor(t) and t.dtype == dtype and tuple(t.shape) == tuple(shape)


def _entry_problem(entry: dict, shape: tuple, factored: bool | None) -> str | None:
    """What is wrong with one saved entry of a parameter of ``shape`` (SPEC 1.11.3): ``factored``
    None for a parameter that never had a gradient."""
    keys = {"name"}
    if factored is not None:
        keys |= {"automatic_period", "step", "m_codebook", "m_magnitude"}
        keys |= {"v_row", "v_col", "factored_step"} if factored else {"vmean", "vmean_step"}
    if set(entry) != keys:
        return f"keys {sorted(entry)}, expected {sorted(keys)}"
    if type(entry["name"]) is not str or entry["name"] != entry["name"].lower():
        return f"name {entry['name']!r}"
    if factored is None:
        return None
    period, n = entry["automatic_period"], math.prod(shape)
    if not _is_int(period) or n % period:
        return f"automatic_period {period!r}"
    if not _is_int(entry["step"]):
        return f"step {entry['step']!r}"
    if not _tensor(entry["m_codebook"], torch.uint8, (n // period, period)):
        return f"m_codebook {entry['m_codebook']!r:.60}, expected uint8 [{n // period}, {period}]"
    magnitude = entry["m_magnitude"]
    if not _tensor(magnitude, torch.float32, (n // period, 1)) or not bool(
        (torch.isfinite(magnitude) & (magnitude >= 0)).all()
    ):
        return f"m_magnitude {magnitude!r:.60}, expected finite, >= 0, fp32 [{n // period}, 1]"
    if factored:
        if not _tensor(entry["v_row"], torch.float32, shape[:1]) or not _tensor(
            entry["v_col"], torch.float32, shape[1:]
        ):
            return f"v_row, v_col {entry['v_row']!r:.40}, {entry['v_col']!r:.40}, expected fp32 [R], [Cn]"
        return None if _is_int(entry["factored_step"]) else f"factored_step {entry['factored_step']!r}"
    if not _tensor(entry["vmean"], torch.float32, (n // period, 1)):
        return f"vmean {entry['vmean']!r:.60}, expected fp32 [{n // period}, 1]"
    return None if _is_int(entry["vmean_step"]) else f"vmean_step {entry['vmean_step']!r}"


def _entries_typed(*kinds) -> Callable:
    """Saved entry ``i`` is of ``kinds[i]``: ``"block"``, ``"factored"`` or ``"none"`` (never stepped)."""

    def check(sd, optimizer) -> str | None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, (p, kind) in enumerate(zip(params, kinds)):
            factored = {"block": False, "factored": True, "none": None}[kind]
            problem = _entry_problem(sd["state"].get(i, {}), tuple(p.shape), factored)
            if problem:
                return f"parameter {i} ({kind}): {problem}"
        return None

    return _saved(check)


def _momentum_stepped(sd, optimizer) -> str | None:
    """Every saved momentum has ``step >= 1`` (SPEC 1.11.6)."""
    for pid, entry in sd["state"].items():
        if "m_codebook" in entry and not _is_int(entry.get("step")):
            return f"parameter {pid} saved momentum with step {entry.get('step')!r}"
    return None


def _period(pid: int, period: int) -> Callable:
    def check(sd, optimizer) -> str | None:
        got = sd["state"][pid].get("automatic_period")
        return None if got == period else f"parameter {pid}'s automatic_period {got!r}, expected {period}"

    return _saved(check)


def _frozen_stepped(optimizer, params, kwargs) -> str | None:
    """The parameter with ``requires_grad=False`` stepped like the other (SPEC 1.2.6)."""
    frozen = params[0][1]
    before = frozen.detach().clone()
    feed(optimizer, 0)
    entry = optimizer.state_dict()["state"][0]
    if entry.get("step") != 1 or torch.equal(before, frozen.detach()):
        return f"the parameter without requires_grad did not step: its entry {sorted(entry)}"
    return None


def _frozen(device) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(16, device=device), requires_grad=False)


def _option_defaults(sd, optimizer) -> str | None:
    """With no option given: the 2-D parameter factored, neither period forced to 1, untagged."""
    w, b = sd["state"][0], sd["state"][1]
    if "v_row" not in w or "vmean" in w:
        return f"the 2-D parameter's entry {sorted(w)}: not factored (factored_v_2d defaults to True)"
    periods = (w["automatic_period"], b["automatic_period"])
    if 1 in periods:
        return f"periods {periods}: one forced to 1 (the options default to False)"
    return None if sd["gefen_deterministic"] is False else "deterministic is not False by default"


#: SPEC 1.1.1 (the options' defaults), 1.1.5 (what an option means), 1.1.7 (after construction),
#: 1.2.6, 1.3.1, 1.3.5 and 1.11:
#: what the native state dict shows, and a native round trip (SPEC 1.12.10).
NATIVE_STATE = [
    Built(
        "1.1.1",
        "option-defaults",
        lambda d: ([("w", _p(d, 8, 16)), ("b", _p(d, 64))], {}),
        _stepped(1, _saved(_option_defaults)),
        requires=FACTORED_V,
    ),
    Built(
        "1.1.5",
        "period-one-substrings-lowercased",
        lambda d: (
            [("Emb.Weight", _p(d, 8, 16))],
            {"period_one_substrings": ("EMB",), "factored_v_2d": False},
        ),
        _stepped(1, _period(0, 1)),
    ),
    Built(
        "1.1.7",
        "after-construction",
        lambda d: ([("A", _p(d)), _p(d, 3)], {"betas": (0.8, 0.9)}),
        _all(
            _defaults(lr=1e-3, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.0),
            _top_level(0, False, codebook=False),
            _entries({0: {"name": "a"}, 1: {"name": "param_1"}}),
        ),
    ),
    Built(
        "1.2.6",
        "frozen-parameter-steps",
        lambda d: ([("frozen", _frozen(d)), ("b", _p(d, 16))], {}),
        _frozen_stepped,
    ),
    Built(
        "1.3.1",
        "one-lowercase-name",
        _params(lambda d: [{"params": [("Layer.Weight", _p(d)), _p(d)]}, {"params": [("X", _p(d))]}]),
        _saved(_names_everywhere),
    ),
    Built(
        "1.3.5",
        "names-before-any-step",
        _params(lambda d: [{"params": [("A", _p(d)), _p(d)]}, {"params": [_p(d)]}]),
        _entries({0: {"name": "a"}, 1: {"name": "group_0_param_1"}, 2: {"name": "group_1_param_0"}}),
    ),
    Built(
        "1.11.1",
        "top-level-keys-fresh",
        _one(),
        _top_level(0, False, codebook=False),
    ),
    Built(
        "1.11.1",
        "top-level-keys-stepped",
        lambda d: ([_p(d, 32)], {"deterministic": True}),
        _stepped(2, _top_level(2, True, codebook=True)),
    ),
    Built(
        "1.11.3",
        "block-entries",
        lambda d: ([("w", _p(d, 8, 16)), ("b", _p(d, 16)), ("c", _p(d))], {"factored_v_2d": False}),
        _stepped(1, _entries_typed("block", "block", "none"), skip=(2,)),
    ),
    Built(
        "1.11.3",
        "factored-entries",
        lambda d: ([("w", _p(d, 8, 16)), ("b", _p(d, 16))], {"factored_v_2d": True}),
        _stepped(1, _entries_typed("factored", "block")),
        requires=FACTORED_V,
    ),
    Built(
        "1.11.4",
        "never-stepped",
        lambda d: ([("a", _p(d, 16)), ("b", _p(d, 16))], {}),
        _stepped(2, _entries_typed("block", "none"), skip=(1,)),
    ),
    Built(
        "1.11.6",
        "zero-gradient-first-step",
        lambda d: ([("a", _p(d, 32)), ("b", _p(d, 32))], {}),
        _stepped(1, _saved(_momentum_stepped), zero=(1,)),
    ),
    RoundTrip(
        "1.12.10",
        "continued-after-a-round-trip",
        lambda d: (
            [("w", _p(d, 8, 16)), ("b", _p(d, 16)), ("c", _p(d, 4, 6))],
            {"lr": torch.tensor(0.01, device=d), "weight_decay": 0.1, "factored_v_2d": False},
        ),
    ),
]


# ------------------------------------------------------------------------------ DTensor parameters


@dataclass(frozen=True)
class ShardedLoad(Example):
    """A native load into an optimizer over DTensor parameters (SPEC 1.12.11), in the process group
    of one the caller holds: the checkpoint is the reference's over plain parameters of the same
    shapes (:data:`SHARDED`), stepped ``steps`` times, its group 0 saved with ``lr = 0.5`` and other
    names. Never stepped, it loads: its hyperparameters and names replace the live ones, and the next
    step is a fresh optimizer's. Stepped, it is refused with ValueError naming ``DTensor`` and
    nothing changes. ``save``: the example is the optimizer's own native ``state_dict()`` after
    ``steps`` steps instead, refused with ValueError naming ``DTensor`` (item 1)."""

    steps: int
    save: bool = False


#: The parameters of a sharded-load example: ``(caller name, shape)``.
SHARDED = (("w", (8, 16)), ("b", (16,)))

#: SPEC 1.12.11: native loads into DTensor parameters.
SHARDED_LOAD = [
    ShardedLoad("1.12.11#1", "state-dict-refused", 1, save=True),
    ShardedLoad("1.12.11#1", "fresh-state-dict-refused", 0, save=True),
    ShardedLoad("1.12.11#2", "never-stepped-loads", 0),
    ShardedLoad("1.12.11#2", "stepped-refused", 1),
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

"""The examples of the rules a DCP save states that one process observes (SPEC 2.1-2.6): one row
per rule example, each an optimizer built on a group of one (``Shard(0)`` DTensors on its 1-D mesh)
and handed to the implementation's adapter, with what the rule says of its ``state_dict()``, of the
placeholders in it, of the save planner and of the default writer's staging; or a save the rule
refuses, with its error and words. :func:`gefen_conformance.suite.rule_checks.check_save` runs them.

Every example starts from :func:`trained`: two groups (a tensor ``lr`` in group 0), three
parameters whose registration order is not their names' order, two steps on the first two, the
third never stepped (a fresh slot). An example that changes the live state does it through the
public per-parameter ``state`` of SPEC 1.11.3, or, for the codebook and the global step, the public
attributes a declared class carries (SPEC 2.3.6#1): an implementation without them skips it.

The promises of a declared state layout (SPEC 2.3.6) bind a class that declares one: their
examples run for an optimizer class that declares the reference's layout in its own body
(``gefen_state_layout = gefen_reference.dcp.STATE_LAYOUT``, the one declaration the suite knows), as
a kernel backend on the reference's adapter does, and skip for any other class.

What needs several ranks (SPEC 2.3.4, 2.3.5, 2.4.5, the world-size half of 2.3.2 and the
cross-rank half of 2.4.4) is not here: at world size 1 no collective runs.
"""

from __future__ import annotations

import gc
import io
import math
import pickle
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gefen_conformance.implementations.contract import DCP_ASYNC_SAVE, DCP_RESHARD, DCP_SAVE_PLANNER
from gefen_conformance.suite.rule_examples import Example

#: ``(name, global shape, group)`` in registration order: sorted by name, slot 0 and 1 swap.
PARAMS = (("enc.weight", (4, 8), 0), ("enc.bias", (6,), 0), ("head.weight", (3, 2), 1))
STEPS = 2
LR = (torch.tensor(1e-2), 2e-3)  # group 0's lr is a tensor (SPEC 2.1.5)
BETAS, EPS, WEIGHT_DECAY = (0.9, 0.99), 1e-8, 0.01
HEADER = (
    "format_version",
    "global_step",
    "deterministic",
    "slot_count",
    "group_count",
    "param_identities",
    "param_group_hypers",
)
SLOT_FIELDS = ("initialized", "step", "vmean_step", "momentum", "second_moment")
DENSE = ("momentum", "second_moment")
HYPER_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay")


@dataclass(frozen=True)
class Saved(Example):
    """A save the rule governs: ``build(impl, mesh)`` makes the optimizer, and
    ``holds(saved)`` (a :class:`Save`) returns what is wrong, or None."""

    build: Callable
    holds: Callable
    requires: tuple = (DCP_RESHARD,)


@dataclass(frozen=True)
class SaveRefused(Example):
    """A save the rule refuses with ``error`` naming ``words`` (and not ``not_words``), at ``at``:
    ``construct`` (the adapter's constructor), ``state_dict`` (the constructor or ``state_dict()``),
    ``no-group`` (the constructor while no default process group is initialized) or ``stage`` (the
    default ``FileSystemWriter``'s staging of the state dict, which then writes nothing)."""

    build: Callable
    error: type = RuntimeError
    words: str | None = None
    at: str = "state_dict"
    not_words: str | None = None
    requires: tuple = (DCP_RESHARD,)


@dataclass(frozen=True)
class PlannerRefused(Example):
    """The save planner's class (``type(impl.save_planner())``) called with ``args`` and ``kwargs``
    refuses with ``error`` naming each of ``words``."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    error: type = ValueError
    words: tuple = ()
    requires: tuple = (DCP_RESHARD, DCP_SAVE_PLANNER)


@dataclass
class Save:
    """What a :class:`Saved` example's ``holds`` reads: the implementation, the optimizer, its
    parameters by name, and the adapter's ``state_dict()``."""

    impl: object
    optimizer: object
    params: dict
    state: dict
    world: object  # the WorldOfOne: its mesh, and scratch paths for a checkpoint


class NoAttribute(Exception):
    """The optimizer has no public attribute of that name to change (SPEC 2.3.6#1)."""


class NotDeclared(Exception):
    """The optimizer's class declares no state layout the suite knows (SPEC 2.3.6)."""


# ------------------------------------------------------------------------------ building


def _full(name: str, shape, salt: int = 0) -> torch.Tensor:
    seed = sum(map(ord, name)) + 1000 * salt
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _own(value):
    """A tensor hyperparameter of its own: a load may fill it in place (SPEC 3.5)."""
    return value.clone() if torch.is_tensor(value) else value


def trained(impl, mesh, *, steps: int = STEPS, seed: int = 0, **options):
    """``(optimizer, params)``: :data:`PARAMS` sharded on ``mesh``, the implementation's optimizer
    over them (``factored_v_2d=False`` unless given) and ``steps`` steps on all but the last, on
    gradients drawn from ``seed``."""
    from gefen_conformance.harness.sharding import shard, sharded_parameter

    params = {name: sharded_parameter(_full(name, shape), mesh) for name, shape, _ in PARAMS}
    groups = [
        {"params": [(n, params[n]) for n, _, g in PARAMS if g == index], "lr": _own(lr)}
        for index, lr in enumerate(LR)
    ]
    kwargs = {"betas": BETAS, "eps": EPS, "weight_decay": WEIGHT_DECAY, "factored_v_2d": False, **options}
    optimizer = impl.make_optimizer(groups, **kwargs)
    stepped = [n for n, _, _ in PARAMS[:-1]]
    for step in range(steps):
        for name in stepped:
            params[name].grad = shard(_full(name, params[name].shape, salt=step + 1 + 100 * seed), mesh)
        optimizer.step()
    return optimizer, params


def _built(**options) -> Callable:
    return lambda impl, mesh: trained(impl, mesh, **options)


def _slot_state(index: int, change: Callable) -> Callable:
    """:func:`trained`, then ``change(state)`` on slot ``index``'s live state (SPEC 1.11.3)."""

    def build(impl, mesh):
        optimizer, params = trained(impl, mesh)
        change(optimizer.state[params[PARAMS[index][0]]])
        return optimizer, params

    return build


def _put(key: str, value) -> Callable:
    def change(state):
        state[key] = value(state[key]) if callable(value) else value

    return change


def _drop(*keys: str) -> Callable:
    def change(state):
        for key in keys:
            del state[key]

    return change


def _only(key: str, value) -> Callable:
    def change(state):
        state.clear()
        state[key] = value

    return change


def _attribute(name: str, value: Callable) -> Callable:
    """:func:`trained`, then the optimizer's public attribute ``name`` set to ``value(itself)``."""

    def build(impl, mesh):
        optimizer, params = trained(impl, mesh)
        if name not in dir(optimizer):
            raise NoAttribute(f"{type(optimizer).__name__} has no public {name} attribute")
        setattr(optimizer, name, value(getattr(optimizer, name)))
        return optimizer, params

    return build


def _codebook(value: Callable) -> Callable:
    return _attribute("codebook", value)


def _both(first: Callable, second: Callable) -> Callable:
    def change(state):
        first(state)
        second(state)

    return change


def _codebook_and_indices(impl, mesh):
    optimizer, params = _codebook(lambda cb: None)(impl, mesh)
    _put("m_codebook", lambda t: t.long())(optimizer.state[params[PARAMS[0][0]]])
    return optimizer, params


def _group(key: str, value) -> Callable:
    def build(impl, mesh):
        optimizer, params = trained(impl, mesh)
        optimizer.param_groups[1][key] = value
        return optimizer, params

    return build


def _declared(impl, mesh):
    """:func:`trained`, for a class that declares the reference's state layout only."""
    from gefen_reference.dcp.optimizer_view import declares_state_layout

    optimizer, params = trained(impl, mesh)
    if not declares_state_layout(type(optimizer)):
        raise NotDeclared(type(optimizer).__name__)
    return optimizer, params


def _undeclared_subclass(impl, mesh):
    """The implementation's optimizer re-classed as a subclass that declares nothing (SPEC 2.3.1)."""
    optimizer, params = trained(impl, mesh, steps=0)
    optimizer.__class__ = type(f"Undeclared{type(optimizer).__name__}", (type(optimizer),), {})
    return optimizer, params


def _plain_tensor_param(impl, mesh):
    param = torch.nn.Parameter(_full("w", (4, 8)))
    return impl.make_optimizer([("w", param)], factored_v_2d=False), {"w": param}


def _name_in_two_groups(impl, mesh):
    from gefen_conformance.harness.sharding import sharded_parameter

    a, b = (sharded_parameter(_full("w", (4, 8), salt), mesh) for salt in (0, 1))
    groups = [{"params": [("w", a)]}, {"params": [("w", b)]}]
    return impl.make_optimizer(groups, factored_v_2d=False), {"w": a}


# ------------------------------------------------------------------------------ reading


def slot_key(index: int, field_: str) -> str:
    return f"slot_{index:08d}.{field_}"


def expected_keys(slots: int = len(PARAMS)) -> list:
    return list(HEADER) + [slot_key(i, f) for i in range(slots) for f in SLOT_FIELDS]


def _dense(save: Save):
    for index, (name, _, _) in enumerate(PARAMS):
        for f in DENSE:
            yield index, name, slot_key(index, f), save.state.get(slot_key(index, f))


def _key_order(save: Save) -> str | None:
    expected = expected_keys()
    missing = [k for k in expected if k not in save.state]
    if missing:
        return f"keys {missing[:4]} missing"
    order = [k for k in save.state if k in expected]
    if order != expected:
        at = next(i for i, (a, b) in enumerate(zip(order, expected)) if a != b)
        return (
            f"key {at} is {order[at]!r}, expected {expected[at]!r} (order {order[max(0, at - 2) : at + 3]})"
        )
    return None


def _nothing_else(save: Save) -> str | None:
    extra = [k for k in save.state if k not in expected_keys()]
    if extra:
        return f"keys {extra} beyond the format's"
    for i, identity in enumerate(save.state["param_identities"]):
        if not isinstance(identity, dict) or set(identity) != {"name", "group", "shape"}:
            return f"param_identities[{i}] is {identity!r}, expected exactly name, group and shape"
    return None


def _eight_digits(save: Save) -> str | None:
    slots = [k for k in save.state if k.startswith("slot_") and k not in HEADER]
    wrong = [k for k in slots if not re.fullmatch(r"slot_\d{8}\.[a-z_]+", k)]
    if wrong or len(slots) != len(PARAMS) * len(SLOT_FIELDS):
        return f"slot keys {wrong or slots} are not slot_<8 digits>.<field> for {len(PARAMS)} slots"
    return None


def _registration_order(save: Save) -> str | None:
    """Slot ``i`` is the ``i``-th parameter registered: its identity, its dense entries' shape, and
    its ``initialized`` flag (the last parameter is never stepped)."""
    names = [identity.get("name") for identity in save.state["param_identities"]]
    if names != [n for n, _, _ in PARAMS]:
        return f"slots name {names}, registered {[n for n, _, _ in PARAMS]}"
    for _, name, key, value in _dense(save):
        if not torch.is_tensor(value) or tuple(value.shape) != tuple(save.params[name].shape):
            return f"{key} is not shaped as {name} {tuple(save.params[name].shape)}"
    flags = [int(save.state[slot_key(i, "initialized")]) for i in range(len(PARAMS))]
    if flags != [1, 1, 0]:
        return f"initialized flags {flags}, expected [1, 1, 0] (the last parameter was never stepped)"
    return None


def _scalar(save: Save, key: str, dtype: torch.dtype, value: int) -> str | None:
    got = save.state.get(key)
    if not torch.is_tensor(got):
        return f"{key} is {type(got).__name__}, expected a tensor"
    if got.dim() != 0 or got.dtype != dtype or got.device.type != "cpu":
        return (
            f"{key} is {got.dtype} of shape {tuple(got.shape)} on {got.device}, expected 0-dim {dtype} on cpu"
        )
    if int(got) != value:
        return f"{key} is {int(got)}, expected {value}"
    return None


def _replicated(deterministic: bool) -> Callable:
    expected = {
        "format_version": (torch.int64, 2),
        "global_step": (torch.int64, STEPS),
        "deterministic": (torch.uint8, int(deterministic)),
        "slot_count": (torch.int64, len(PARAMS)),
        "group_count": (torch.int64, len(LR)),
    }

    def holds(save: Save) -> str | None:
        return next((p for p in (_scalar(save, k, *e) for k, e in expected.items()) if p), None)

    return holds


def _identities(save: Save) -> str | None:
    got = save.state["param_identities"]
    if type(got) is not list:
        return f"param_identities is a {type(got).__name__}, expected a list"
    expected = [{"name": n, "group": g, "shape": list(s)} for n, s, g in PARAMS]
    for i, (identity, want) in enumerate(zip(got, expected)):
        if not isinstance(identity, dict):
            return f"param_identities[{i}] is {identity!r}"
        shape = identity.get("shape")
        if type(shape) is not list or any(type(e) is not int for e in shape):
            return (
                f"param_identities[{i}]['shape'] is {type(shape).__name__} {shape!r}, expected a list of ints"
            )
        if type(identity.get("name")) is not str or type(identity.get("group")) is not int:
            return f"param_identities[{i}] is {identity!r}: name a str and group an int expected"
        if {k: identity.get(k) for k in want} != want:
            return f"param_identities[{i}] is {identity!r}, expected {want!r}"
    if len(got) != len(expected):
        return f"{len(got)} identities for {len(expected)} slots"
    return None


def _written(key: str, value: float) -> Callable:
    """Group 1's ``key`` is written as set, unchecked (SPEC 2.4.4)."""

    def holds(save: Save) -> str | None:
        entry = save.state["param_group_hypers"][1]
        if entry.get(key) != value:
            return f"param_group_hypers[1][{key!r}] is {entry.get(key)!r}, expected {value!r} as set"
        return None

    return holds


def _hypers(save: Save) -> str | None:
    got = save.state["param_group_hypers"]
    if type(got) is not list or len(got) != len(LR):
        return f"param_group_hypers is {got!r:.120}, expected a list of {len(LR)} dicts"
    for g, (entry, lr) in enumerate(zip(got, LR)):
        want = {
            "lr": float(lr.item()) if torch.is_tensor(lr) else float(lr),
            "beta1": float(BETAS[0]),
            "beta2": float(BETAS[1]),
            "eps": float(EPS),
            "weight_decay": float(WEIGHT_DECAY),
        }
        if not isinstance(entry, dict) or list(entry) != list(HYPER_KEYS):
            return f"param_group_hypers[{g}] is {entry!r}, expected the keys {list(HYPER_KEYS)} in order"
        for key, value in entry.items():
            if type(value) is not float:
                return f"param_group_hypers[{g}][{key!r}] is {type(value).__name__} {value!r}, not a float"
            if value != want[key]:
                return f"param_group_hypers[{g}][{key!r}] is {value!r}, expected {want[key]!r}"
    return None


def _placeholders(save: Save) -> str | None:
    """Every dense entry is a storage-free placeholder with the write item of SPEC 2.2.1."""
    from torch.distributed.checkpoint.metadata import TensorProperties
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.tensor import DTensor

    for _, name, key, value in _dense(save):
        param = save.params[name]
        local = param.to_local()
        if not torch.is_tensor(value) or type(value) is torch.Tensor or isinstance(value, DTensor):
            return f"{key} is a {type(value).__name__}, expected a storage-free torch.Tensor subclass"
        hooks = ("__create_write_items__", "__create_chunk_list__", "__get_tensor_shard__")
        missing = [h for h in hooks if not callable(getattr(value, h, None))]
        if missing:
            return f"{key} lacks DCP's checkpointable hooks {missing}"
        reported = (tuple(value.shape), value.dtype, value.device, value.requires_grad)
        expected = (tuple(param.shape), torch.float32, local.device, False)
        if reported != expected:
            return f"{key} reports (shape, dtype, device, requires_grad) {reported}, expected {expected}"
        contiguous = torch.empty(param.shape, device="meta").stride()
        if tuple(value.stride()) != tuple(contiguous):
            return f"{key} has strides {value.stride()}, expected the global shape's contiguous {contiguous}"
        items = value.__create_write_items__(key, value)
        chunk = param.__create_chunk_list__()[0]
        if len(items) != 1 or items[0].type != WriteItemType.SHARD:
            return f"{key} gives write items {[i.type for i in items]}, expected one SHARD item"
        data = items[0].tensor_data
        if (tuple(data.chunk.offsets), tuple(data.chunk.sizes)) != (tuple(chunk.offsets), tuple(chunk.sizes)):
            return f"{key}'s chunk {data.chunk}, expected the parameter's {chunk}"
        if tuple(data.size) != tuple(param.size()):
            return f"{key}'s write item has size {tuple(data.size)}, expected {tuple(param.size())}"
        properties = TensorProperties(
            dtype=torch.float32,
            layout=torch.strided,
            requires_grad=False,
            memory_format=torch.contiguous_format,
            pin_memory=False,
        )
        if data.properties != properties:
            return f"{key}'s write item has properties {data.properties}, expected {properties}"
    return None


def _index(value, key: str):
    from torch.distributed.checkpoint.metadata import MetadataIndex

    return MetadataIndex(key, value.__create_chunk_list__()[0].offsets)


def _same_buffer(save: Save) -> str | None:
    """DCP's hook builds once and hands out the same tensor on every later call (SPEC 2.2.2#1)."""
    for _, _, key, value in _dense(save):
        first = value.__get_tensor_shard__(_index(value, key))
        again = value.__get_tensor_shard__(_index(value, key))
        if first is not again:
            return f"{key}: __get_tensor_shard__ built a new tensor on its second call"
    return None


def _planner(save: Save):
    """The implementation's save planner set up with ``{"optimizer": state}`` and its local plan."""
    planner = save.impl.save_planner()
    planner.set_up_planner({"optimizer": save.state}, None, True)
    return planner, {i.index.fqn: i for i in planner.create_local_plan().items}


def _collected(ref: weakref.ref) -> bool:
    """Whether nothing keeps the referent (a cycle too is collected before it counts as kept)."""
    if ref() is not None:
        gc.collect()
    return ref() is None


def _private_copies(save: Save) -> str | None:
    """Through the planner, a placeholder expands to a private CPU tensor nothing keeps: two
    resolutions are two tensors, neither is the hook's buffer, and both are freed once dropped."""
    planner, items = _planner(save)
    for _, _, key, value in _dense(save):
        item = items[f"optimizer.{key}"]
        first, again = planner.resolve_data(item), planner.resolve_data(item)
        if first is again or first.untyped_storage().data_ptr() == again.untyped_storage().data_ptr():
            return f"{key}: two resolutions share one tensor"
        if first.device.type != "cpu":
            return f"{key} resolved on {first.device}, expected the CPU"
        kept = value.__get_tensor_shard__(_index(value, key))
        if kept is first or kept is again:
            return f"{key}: DCP's caching hook hands out a tensor the planner returned"
        refs = weakref.ref(first), weakref.ref(again)
        del first, again, kept
        if not all(_collected(r) for r in refs):
            return f"{key}: a resolved tensor is still referenced after the planner returned it"
    return None


def _planner_path(save: Save) -> str | None:
    """The planner expands a placeholder on the CPU, equal to DCP's hook's buffer but not it, and
    keeps nothing; every other item resolves as DefaultSavePlanner resolves it (SPEC 2.5.2)."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner, items = _planner(save)
    default = DefaultSavePlanner()
    default.set_up_planner({"optimizer": save.state}, None, True)
    for fqn, item in items.items():
        key = fqn.removeprefix("optimizer.")
        value = save.state.get(key)
        if not any(key.endswith(f".{f}") for f in DENSE):
            mine, theirs = planner.resolve_data(item), default.resolve_data(item)
            if torch.is_tensor(theirs):
                same = torch.is_tensor(mine) and torch.equal(mine, theirs) and mine.dtype == theirs.dtype
            else:
                same = not torch.is_tensor(mine) and mine.getvalue() == theirs.getvalue()
            if not same:
                return f"{fqn} resolved unlike DefaultSavePlanner"
            continue
        resolved = planner.resolve_data(item)
        if type(resolved) is not torch.Tensor or resolved.device.type != "cpu":
            return (
                f"{fqn} resolved to a {type(resolved).__name__} on {resolved.device}, expected a CPU tensor"
            )
        kept = value.__get_tensor_shard__(_index(value, key))
        if resolved is kept:
            return f"{fqn}: the planner returned the buffer of DCP's caching hook"
        if resolved.shape != kept.shape or not torch.equal(resolved, kept.cpu()):
            return f"{fqn}: the planner's expansion differs from the hook's"
        ref = weakref.ref(resolved)
        del resolved, kept
        if not _collected(ref):
            return f"{fqn}: the expansion the planner returned is still referenced"
    return None


def _misuse(probe: Callable, error: type | tuple, words: str | None) -> Callable:
    """``probe(placeholder)`` on every dense entry raises ``error`` naming ``words``."""

    def holds(save: Save) -> str | None:
        for _, _, key, value in _dense(save):
            try:
                probe(value)
            except error as exc:
                if words and words not in str(exc):
                    return f"{key}: the {type(exc).__name__} does not name {words!r}: {str(exc)[:200]}"
                continue
            except Exception as exc:  # the class raised is the finding
                return f"{key}: raised {type(exc).__name__}: {str(exc)[:200]}"
            return f"{key}: the placeholder allowed it"
        return None

    return holds


def _is_pinned_false(save: Save) -> str | None:
    for _, _, key, value in _dense(save):
        try:
            pinned = value.is_pinned()
        except Exception as exc:  # the error is the finding
            return f"{key}.is_pinned() raised {type(exc).__name__}: {str(exc)[:160]}"
        if pinned is not False:
            return f"{key}.is_pinned() is {pinned!r}, expected False"
    return None


def _describes(save: Save) -> str | None:
    for _, _, key, value in _dense(save):
        for how, text in (("repr", repr), ("str", str), ("format", format)):
            try:
                got = text(value)
            except Exception as exc:  # the error is the finding
                return f"{how}({key}) raised {type(exc).__name__}: {str(exc)[:160]}"
            if not isinstance(got, str) or not got:
                return f"{how}({key}) is {got!r}"
    return None


def _public_attributes(save: Save) -> str | None:
    """SPEC 2.3.6#1 after two steps: the codebook learned, the counters and flags as declared."""
    from gefen_reference.periods import PeriodRules

    opt = save.optimizer
    codebook = getattr(opt, "codebook", None)
    if not torch.is_tensor(codebook) or (codebook.dtype, tuple(codebook.shape)) != (torch.float32, (256,)):
        return f"codebook is {type(codebook).__name__} {getattr(codebook, 'dtype', '')}, expected fp32 [256]"
    if type(getattr(opt, "global_step", None)) is not int or opt.global_step != STEPS:
        return f"global_step is {getattr(opt, 'global_step', None)!r}, expected the int {STEPS}"
    if type(getattr(opt, "deterministic", None)) is not bool:
        return f"deterministic is {getattr(opt, 'deterministic', None)!r}, expected a bool"
    missing = [a for a in ("factored_v_2d", "period_rules") if not hasattr(opt, a)]
    if missing:
        return f"no public {missing}"
    if not isinstance(opt.period_rules, PeriodRules):
        return f"period_rules is a {type(opt.period_rules).__name__}, not the reference's PeriodRules"
    return None


def _group_keys(save: Save) -> str | None:
    """SPEC 2.3.6#2: every group carries its names, their provenance and the hyperparameters."""
    for g, group in enumerate(save.optimizer.param_groups):
        count = len(group["params"])
        names, flags = group.get("param_names"), group.get("param_names_synthesized")
        if not isinstance(names, list) or len(names) != count or not all(isinstance(n, str) for n in names):
            return f"group {g}: param_names is {names!r}, expected {count} names"
        if not isinstance(flags, list) or len(flags) != count or not all(type(f) is bool for f in flags):
            return f"group {g}: param_names_synthesized is {flags!r}, expected {count} bools"
        missing = [k for k in HYPER_KEYS if k not in group]
        if missing:
            return f"group {g} lacks {missing}"
    return None


def _state_entries(save: Save) -> str | None:
    """SPEC 2.3.6#3: a stepped parameter's state as SPEC 1.11.3 lays it out; a fresh one's empty."""
    for index, (name, _, _) in enumerate(PARAMS):
        param = save.params[name]
        local = param.to_local()
        state = save.optimizer.state.get(param, {})
        if index == len(PARAMS) - 1:
            stepped = sorted(set(state) - {"name"})
            if stepped:
                return f"{name} never stepped but its state holds {stepped}"
            continue
        for key in ("automatic_period", "step", "vmean_step"):
            if type(state.get(key)) is not int or state[key] < 1:
                return f"{name}: {key} is {state.get(key)!r}, expected an int >= 1"
        period = state["automatic_period"]
        blocks = local.numel() // period
        expected = {
            "m_codebook": (torch.uint8, (blocks, period)),
            "m_magnitude": (torch.float32, (blocks, 1)),
            "vmean": (torch.float32, (blocks, 1)),
        }
        for key, (dtype, shape) in expected.items():
            got = state.get(key)
            if not torch.is_tensor(got) or (got.dtype, tuple(got.shape), got.device) != (
                dtype,
                shape,
                local.device,
            ):
                seen = (
                    getattr(got, "dtype", None),
                    tuple(getattr(got, "shape", ())),
                    getattr(got, "device", None),
                )
                return f"{name}: {key} is {seen}, expected {(dtype, shape, local.device)}"
    return None


def _restored_state_used(save: Save) -> str | None:
    """SPEC 2.3.6#4: an optimizer that stepped on other gradients, then loaded a checkpoint, steps
    bit for bit as a fresh one of the same class that loaded it: nothing of its earlier state (its
    codebook, counters, hyperparameters) outlives the load."""
    from gefen_conformance.harness.sharding import shard
    from gefen_conformance.workload import saving

    path = save.world.path()
    saving.save(save.impl, save.optimizer, path, planner=False)
    mesh = save.world.mesh
    sides = {"stepped": trained(save.impl, mesh, seed=1), "fresh": trained(save.impl, mesh, steps=0)}
    for optimizer, params in sides.values():
        saving.load(save.impl, optimizer, path)
        with torch.no_grad():
            for name, param in params.items():
                param.to_local().copy_(save.params[name].to_local())
                param.grad = shard(_full(name, param.shape, salt=50), mesh)
        optimizer.step()
    for name, _, _ in PARAMS:
        a, b = (params[name].to_local() for _, params in sides.values())
        if not torch.equal(a.view(torch.int32), b.view(torch.int32)):
            return (
                f"{name} after the next step differs from a fresh optimizer's that loaded the same checkpoint"
            )
    return None


def _counter(key: str, value: int) -> Callable:
    def holds(save: Save) -> str | None:
        return _scalar(save, slot_key(0, key), torch.int64, value)

    return holds


def _second_moment_negative(save: Save) -> str | None:
    value = save.state[slot_key(0, "second_moment")]
    dense = value.__get_tensor_shard__(_index(value, slot_key(0, "second_moment")))
    if not bool((dense < 0).all()):
        return "the second moment written is not the negative block means the state holds"
    return None


# ------------------------------------------------------------------------------ the tables

#: SPEC 2.1: the checkpoint dict.
FORMAT = [
    Saved("2.1.1", "key-order", _built(), _key_order),
    Saved("2.1.2", "registration-order", _built(), _registration_order),
    Saved("2.1.2", "eight-digit-slots", _built(), _eight_digits),
    Saved("2.1.3", "replicated-scalars", _built(), _replicated(False)),
    Saved("2.1.3", "deterministic-uint8", _built(deterministic=True), _replicated(True)),
    Saved("2.1.4", "identities", _built(), _identities),
    Saved("2.1.5", "hypers-tensor-lr", _built(), _hypers),
    Saved("2.1.7", "nothing-else", _built(), _nothing_else),
]

#: SPEC 2.2: the placeholders.
PLACEHOLDERS = [
    Saved("2.2.1", "storage-free-placeholders", _built(), _placeholders),
    Saved("2.2.2#1", "hook-builds-once", _built(), _same_buffer),
    Saved("2.2.2#2", "planner-private-copies", _built(), _private_copies, (DCP_RESHARD, DCP_SAVE_PLANNER)),
    Saved("2.2.3", "to-same-device", _built(), _misuse(lambda p: p.to(p.device), Exception, None)),
    Saved("2.2.3", "cpu", _built(), _misuse(lambda p: p.cpu(), Exception, None)),
    Saved("2.2.3", "operator", _built(), _misuse(lambda p: p + 1, RuntimeError, "GefenFileSystemWriter")),
    Saved("2.2.3", "pickle", _built(), _misuse(pickle.dumps, TypeError, "cannot be pickled")),
    Saved(
        "2.2.3",
        "torch-save",
        _built(),
        _misuse(lambda p: torch.save({"m": p}, io.BytesIO()), TypeError, "cannot be pickled"),
    ),
    Saved("2.2.3", "is-pinned", _built(), _is_pinned_false),
    Saved("2.2.3", "repr-str-format", _built(), _describes),
]

#: SPEC 2.3: the adapter's construction.
CONSTRUCTION = [
    SaveRefused("2.3.1", "undeclared-subclass", _undeclared_subclass, TypeError, at="construct"),
    SaveRefused(
        "2.3.1",
        "no-process-group",
        _built(),
        RuntimeError,
        "initialized distributed process group",
        "no-group",
    ),
    SaveRefused(
        "2.3.2", "factored-at-construction", _built(factored_v_2d=True), words="factored_v_2d", at="construct"
    ),
    SaveRefused(
        "2.3.2", "plain-tensor-at-construction", _plain_tensor_param, words="DTensor", at="construct"
    ),
    SaveRefused(
        "2.3.2",
        "name-in-two-groups-at-construction",
        _name_in_two_groups,
        words="unique across every group",
        at="construct",
    ),
]

#: SPEC 2.3.6: what a class that declares the reference's state layout promises.
DECLARED = [
    Saved("2.3.6#1", "public-attributes", _declared, _public_attributes),
    Saved("2.3.6#2", "group-keys", _declared, _group_keys),
    Saved("2.3.6#3", "state-entries", _declared, _state_entries),
    Saved("2.3.6#4", "restored-state-used", _declared, _restored_state_used),
]

#: SPEC 2.4.2-2.4.4: the slot state, counters and expansion proofs.
CHECKS = [
    SaveRefused(
        "2.4.2",
        "partial-no-indices",
        _slot_state(0, _drop("m_codebook")),
        ValueError,
        "partial optimizer state",
    ),
    SaveRefused(
        "2.4.2",
        "partial-no-period",
        _slot_state(0, _drop("automatic_period")),
        ValueError,
        "partial optimizer state",
    ),
    SaveRefused(
        "2.4.2",
        "vmean-step-alone",
        _slot_state(2, _only("vmean_step", 1)),
        ValueError,
        "partial optimizer state",
    ),
    SaveRefused("2.4.2", "step-bool", _slot_state(0, _put("step", True)), ValueError, "nonnegative integer"),
    SaveRefused(
        "2.4.2", "step-negative", _slot_state(0, _put("step", -1)), ValueError, "nonnegative integer"
    ),
    SaveRefused(
        "2.4.2", "step-fractional", _slot_state(0, _put("step", 1.5)), ValueError, "nonnegative integer"
    ),
    SaveRefused(
        "2.4.2",
        "global-step-negative",
        _attribute("global_step", lambda _: -1),
        ValueError,
        "nonnegative integer",
    ),
    SaveRefused(
        "2.4.2",
        "global-step-bool",
        _attribute("global_step", lambda _: True),
        ValueError,
        "nonnegative integer",
    ),
    SaveRefused(
        "2.4.2",
        "period-bool-tensor",
        _slot_state(0, _put("automatic_period", torch.tensor(True))),
        ValueError,
        "nonnegative integer",
    ),
    Saved(
        "2.4.2", "step-integral-float", _slot_state(0, _put("step", float(STEPS))), _counter("step", STEPS)
    ),
    Saved(
        "2.4.2",
        "step-one-element-tensor",
        _slot_state(0, _put("step", torch.tensor([STEPS]))),
        _counter("step", STEPS),
    ),
    Saved(
        "2.4.2", "legacy-no-vmean-step", _slot_state(0, _drop("vmean_step")), _counter("vmean_step", STEPS)
    ),
    SaveRefused("2.4.3", "no-codebook", _codebook(lambda cb: None), RuntimeError, "initialized codebook"),
    SaveRefused(
        "2.4.3", "codebook-short", _codebook(lambda cb: cb[:128].clone()), ValueError, "codebook geometry"
    ),
    SaveRefused(
        "2.4.3",
        "codebook-2d",
        _codebook(lambda cb: cb.reshape(16, 16).clone()),
        ValueError,
        "codebook geometry",
    ),
    SaveRefused(
        "2.4.3",
        "indices-int64",
        _slot_state(0, _put("m_codebook", lambda t: t.long())),
        ValueError,
        "index dtype",
    ),
    SaveRefused(
        "2.4.3",
        "vmean-on-meta",
        _slot_state(0, _put("vmean", lambda t: t.to("meta"))),
        ValueError,
        "device is inconsistent",
    ),
    SaveRefused(
        "2.4.3",
        "magnitudes-short",
        _slot_state(0, _put("m_magnitude", lambda t: t.reshape(-1)[:-1].clone())),
        ValueError,
        "momentum block geometry",
    ),
    SaveRefused(
        "2.4.3",
        "indices-short",
        _slot_state(0, _put("m_codebook", lambda t: t.reshape(-1)[:-1].clone())),
        ValueError,
        "momentum block geometry",
    ),
    SaveRefused(
        "2.4.3",
        "period-zero",
        _slot_state(0, _put("automatic_period", 0)),
        ValueError,
        "momentum block geometry",
    ),
    SaveRefused(
        "2.4.3",
        "vmean-short",
        _slot_state(0, _put("vmean", lambda t: t.reshape(-1)[:-1].clone())),
        ValueError,
        "second-moment block geometry",
    ),
    SaveRefused(
        "2.4.3",
        "nan-magnitude",
        _slot_state(0, _put("m_magnitude", lambda t: torch.full_like(t, math.nan))),
        ValueError,
        "non-finite",
    ),
    SaveRefused(
        "2.4.3",
        "inf-vmean",
        _slot_state(1, _put("vmean", lambda t: torch.full_like(t, math.inf))),
        ValueError,
        "non-finite",
    ),
    SaveRefused(
        "2.4.3",
        "index-dtype-before-geometry",
        _slot_state(0, _both(_put("m_codebook", lambda t: t.long()), _put("m_magnitude", lambda t: t[:-1]))),
        ValueError,
        "index dtype",
    ),
    SaveRefused(
        "2.4.3",
        "geometry-before-finiteness",
        _slot_state(
            1,
            _both(
                _put("vmean", lambda t: t[:-1].clone()),
                _put("m_magnitude", lambda t: torch.full_like(t, math.nan)),
            ),
        ),
        ValueError,
        "second-moment block geometry",
    ),
    SaveRefused(
        "2.4.3", "codebook-before-index-dtype", _codebook_and_indices, RuntimeError, "initialized codebook"
    ),
    SaveRefused(
        "2.4.3", "inf-codebook", _codebook(lambda cb: cb.clone().fill_(math.inf)), ValueError, "non-finite"
    ),
    Saved(
        "2.4.4",
        "negative-vmean",
        _slot_state(0, _put("vmean", lambda t: -t.abs() - 1.0)),
        _second_moment_negative,
    ),
    Saved("2.4.4", "lr-negative", _group("lr", -1.0), _written("lr", -1.0)),
    Saved("2.4.4", "beta1-above-one", _group("beta1", 1.5), _written("beta1", 1.5)),
]

#: SPEC 2.5 and 2.6: the save planner, and staging by a writer that does not snapshot.
PLANNING = [
    PlannerRefused(
        "2.5.1",
        "flatten-false-keyword",
        (),
        {"flatten_state_dict": False},
        words=("flatten_state_dict=True", "placeholder"),
    ),
    PlannerRefused(
        "2.5.1", "flatten-false-positional", (False,), {}, words=("flatten_state_dict=True", "placeholder")
    ),
    Saved("2.5.2", "planner-expands-on-cpu", _built(), _planner_path, (DCP_RESHARD, DCP_SAVE_PLANNER)),
    SaveRefused(
        "2.6.2",
        "default-writer-staging",
        _built(),
        RuntimeError,
        "GefenFileSystemWriter",
        "stage",
        "GefenSavePlanner",
        (DCP_RESHARD, DCP_ASYNC_SAVE),
    ),
]

SAVES = FORMAT + PLACEHOLDERS + CONSTRUCTION + DECLARED + CHECKS + PLANNING

"""The optimizer's calling protocol (SPEC 4.3.13): how training loops call ``step``, ``zero_grad``,
``state_dict`` and ``load_state_dict``, and change hyperparameters between steps.

Each scenario drives the reference (on CPU) and the implementation (on the run's device) through
the same calls over :data:`gefen_conformance.workload.models.OPTIMIZER` (fp32, block path, the
pinned workload's start, SPEC 5.6.1), from the reference's state after three steps (or from a
fresh optimizer), and judges every call against the reference's same call (SPEC 5.6.13):

* exact in both profiles: counters, periods, names, hyperparameters, key sets, dtypes and shapes of
  the state, the codebook and the global step; a parameter that must not step (no gradient, or a
  ``found_inf`` call), its state entry with it, bit for bit unchanged;
* under ``cpu-bit-exact`` on CPU every parameter and state tensor bitwise; otherwise each call as
  a pinned step from the implementation's own state before it, with the hyperparameters the
  reference's groups held at that call.

Besides, each scenario records what the protocol itself promises on the implementation's side
(exact in both profiles): a closure's loss returned, gradients unscaled in place or set to None,
compact state dict tensors, a load that copies. Every value is a deterministic function of the
scenario and its variant, which is all a failing test's reproducer holds (:class:`ProtocolCase`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from gefen_conformance.implementations.contract import NATIVE_STATE_DICT
from gefen_conformance.suite import reference_side
from gefen_conformance.workload import models, runs
from gefen_oracles import codebook_quality, native_compare, pinned_step
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
#: The parameters that get a new gradient after ``zero_grad`` (a routed expert, an unfrozen layer);
#: the others get none.
ROUTED = ("weight", "prime", "big_prime", "late")


# ------------------------------------------------------------------------------------ driver


def _checkpoint() -> dict:
    """The reference's native state after ``CHECKPOINT_STEPS`` steps (a fresh deep copy)."""
    return reference_side.pinned_state(DTYPE, CHECKPOINT_STEPS, **HYPERS, **OPTIONS)


def _grads(call: int) -> dict:
    """``{name: gradient}`` of the workload for ``call`` (1, 2, ...) after the checkpoint (CPU)."""
    step = CHECKPOINT_STEPS + call - 1
    return {n: models.gradient(models.OPTIMIZER, n, step, dtype=DTYPE) for n in models.OPTIMIZER.shapes}


def _floats(group: dict) -> dict:
    lr = group["lr"]
    return dict(
        lr=float(lr.item()) if torch.is_tensor(lr) else float(lr),
        beta1=float(group["beta1"]),
        beta2=float(group["beta2"]),
        eps=float(group["eps"]),
        weight_decay=float(group["weight_decay"]),
    )


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
    """One side of a scenario: its parameters and optimizer, its calls, and what it observed of the
    protocol itself (``seen``)."""

    params: dict
    optimizer: Any
    calls: list = field(default_factory=list)
    seen: Comparisons = field(default_factory=Comparisons)

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
        hypers = [_floats(g) for g in self.optimizer.param_groups]
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


def _side(make_optimizer, *, load: bool = True) -> Side:
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
        optimizer.load_state_dict(_checkpoint())
    return Side(params, optimizer)


# ------------------------------------------------------------------------------------ checks


def _unchanged(out: Comparisons, what: str, name: str, call: Call, entry_before: dict, entry_after: dict):
    """A parameter that must not step: its value and state entry bit for bit as before."""
    out.add(bitwise_comparison(what, call.before[name], call.after[name], label=f"parameter {name}"))
    for key, value in entry_before.items():
        if torch.is_tensor(value):
            out.add(bitwise_comparison(what, value, entry_after.get(key), label=f"state[{name}].{key}"))
        elif entry_after.get(key) != value:
            out.problem(f"state[{name}].{key}: {entry_after.get(key)!r}, expected {value!r} (unchanged)")


def compare_calls(ours: Side, theirs: Side, bitwise: bool, *, codebook_exact: bool = True) -> Comparisons:
    """Each call of the implementation (``theirs``) against the reference's same call (SPEC 5.6.13);
    the first call whose exact rules differ ends the comparison."""
    out = Comparisons()
    if len(theirs.calls) != len(ours.calls):
        out.problem(f"{len(theirs.calls)} calls recorded, expected {len(ours.calls)}")
    for k, (o, t) in enumerate(zip(ours.calls, theirs.calls), 1):
        where = f"call {k} of {len(ours.calls)}" + (" (found_inf set)" if o.skipped else "")
        exact = native_compare.exact_problems(o.state_after, t.state_after, codebook_exact=codebook_exact)
        for problem in exact:
            out.problem(f"{where}: {problem}")
        if exact:
            break
        steps = []
        for g, group in enumerate(o.state_after["param_groups"]):
            for pid, name in zip(group["params"], group["param_names"]):
                entry_before = t.state_before["state"].get(pid, {"name": name})
                entry_after = t.state_after["state"][pid]
                grad = None if o.skipped else o.grads.get(name)
                if grad is None:
                    what = "found_inf: nothing changes" if o.skipped else "no gradient: no change"
                    _unchanged(out, what, name, t, entry_before, entry_after)
                elif bitwise:
                    what = "calling protocol: parameters and state (fp32)"
                    out.add(bitwise_comparison(what, o.after[name], t.after[name], label=f"parameter {name}"))
                    for key, value in o.state_after["state"][pid].items():
                        if torch.is_tensor(value):
                            out.add(
                                bitwise_comparison(
                                    what, value, entry_after.get(key), label=f"state[{name}].{key}"
                                )
                            )
                else:
                    steps.append(
                        pinned_step.ParamStep(
                            name=name,
                            p0=t.before[name],
                            p1=t.after[name],
                            grad=grad,
                            before=entry_before,
                            after=entry_after,
                            factored=False,
                            **o.hypers[g],
                        )
                    )
        if steps:
            out.merge(pinned_step.check_step(steps, t.state_after["gefen_codebook"]))
    return out


def _same_tensors(out: Comparisons, what: str, expected: dict, observed: dict) -> None:
    """Every state tensor and the codebook of ``expected`` bitwise in ``observed`` (native state dicts)."""
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


# --------------------------------------------------------------------------------- scenarios


def _zero_first_gradients(make_optimizer, variant: str) -> Side:
    """A fresh optimizer whose first gradients are all zero, then a step with the workload's."""
    side = _side(make_optimizer, load=False)
    side.step({n: torch.zeros(shape, dtype=DTYPE) for n, shape in models.OPTIMIZER.shapes.items()})
    side.step(_grads(1))
    return side


def _zero_first_compared(ours: Side, theirs: Side, bitwise: bool) -> Comparisons:
    """The calls, and the codebook the first call learned: the padding codebook of SPEC 1.6.7 (the
    reference's), judged bitwise or by SPEC 5.6.7 on the zero gradients' histogram, then frozen
    (SPEC 1.6.1)."""
    out = Comparisons()
    learned = ours.calls[0].state_after["gefen_codebook"]
    theirs_learned = [c.state_after["gefen_codebook"] for c in theirs.calls]
    if learned is None or float(learned[1]) != 1.0 / 4096:
        out.problem("the reference did not learn the padding codebook of SPEC 1.6.7")
    what = "codebook learned from all-zero gradients"
    if bitwise:
        out.add(bitwise_comparison(what, learned, theirs_learned[0], label=f"{what} (SPEC 1.6.7)"))
    else:
        shapes = models.OPTIMIZER.shapes
        pieces = [
            (torch.zeros(shapes[e["name"]], dtype=DTYPE).reshape(-1), e["automatic_period"])
            for e in ours.calls[0].state_after["state"].values()
        ]
        compared = codebook_quality.compare(
            what, learned, theirs_learned[0], codebook_quality.histogram(pieces)
        )
        compared.problems = [f"{p} (SPEC 1.6.7)" for p in compared.problems]
        out.add(compared)
    if out.ok:
        out.add(
            bitwise_comparison("codebook frozen after it was learned", theirs_learned[0], theirs_learned[-1])
        )
    out.merge(compare_calls(ours, theirs, bitwise, codebook_exact=False))
    return out


#: ``found_inf`` as GradScaler passes it: the sum of its per-device flags (2.0 with infs on two
#: devices), with ``grad_scale`` its scale, or None after the caller's ``scaler.unscale_(opt)``.
FOUND_INF = {
    "one-device": (1.0, SCALE),
    "two-devices": (2.0, SCALE),
    "unscaled-by-caller": (1.0, None),
    "two-devices-unscaled-by-caller": (2.0, None),
}


def _found_inf(make_optimizer, variant: str) -> Side:
    """A call through a closure whose gradients overflowed (``found_inf`` set), then a clean call."""
    found_inf, scale = FOUND_INF[variant]
    side = _side(make_optimizer)
    opt, device = side.optimizer, models.device_for(make_optimizer)
    grads = _grads(1)
    overflowed = dict(grads, vector=grads["vector"].clone().index_fill_(0, torch.tensor([0]), float("inf")))
    loss, ran = torch.tensor(1.5), []

    def closure():
        ran.append(1)
        side.assign(overflowed, scale or 1.0)
        return loss

    opt.grad_scale = None if scale is None else torch.tensor(scale, device=device)
    opt.found_inf = torch.tensor(found_inf, device=device)
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
    later = _grads(2)
    side.assign(later, scale or 1.0)
    opt.found_inf = torch.tensor(0.0, device=device)
    side.call(later, opt.step)
    del opt.grad_scale, opt.found_inf
    return side


#: How a caller hands the scale: as GradScaler does (one-element tensors), or as Python numbers (a
#: hand-written loss scaler; SPEC 1.10.3 takes either).
GRAD_SCALE_FORMS = ("tensor", "python-float")


def _grad_scale_in_place(make_optimizer, variant: str) -> Side:
    """A call under ``grad_scale`` with gradients scaled by it; then each ``.grad`` must be the tensor
    the caller set, holding the unscaled gradient (exact: the scale is a power of two)."""
    side = _side(make_optimizer)
    opt, device = side.optimizer, models.device_for(make_optimizer)
    grads = _grads(1)
    given = side.assign(grads, SCALE)
    if variant == "python-float":
        opt.grad_scale, opt.found_inf = SCALE, 0.0
    else:
        opt.grad_scale, opt.found_inf = torch.tensor(SCALE, device=device), torch.tensor(0.0, device=device)
    side.call(grads, opt.step)
    del opt.grad_scale, opt.found_inf
    for n, p in side.params.items():
        if p.grad is not given[n]:
            side.seen.problem(f"{n}: .grad after the step is not the tensor the caller set (SPEC 1.10.4)")
        side.seen.add(
            bitwise_comparison(
                "grad_scale: gradients unscaled in place",
                grads[n],
                given[n],
                label=f"{n}.grad after the step",
            )
        )
    return side


def _zero_grad(make_optimizer, variant: str) -> Side:
    """A step, ``zero_grad()`` (the default ``set_to_none=True``) or ``zero_grad(set_to_none=False)``,
    then new gradients for the :data:`ROUTED` parameters only, and a step."""
    side = _side(make_optimizer)
    side.step(_grads(1))
    to_none = variant == "set-to-none"
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
        n: g if n in ROUTED else (None if to_none else torch.zeros_like(g)) for n, g in _grads(2).items()
    }
    for n in ROUTED:
        side.params[n].grad = later[n].to(side.params[n].device)
    side.call(later, side.optimizer.step)
    return side


def _closure_backward(make_optimizer, variant: str) -> Side:
    """``step(closure)`` whose closure runs a forward pass and ``backward()`` (``sum(p * w)``: the
    gradient is ``w`` exactly), called at top level or inside ``torch.no_grad()``."""
    side = _side(make_optimizer)
    opt, params = side.optimizer, side.params
    grads = _grads(1)
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
    return side


#: The new value of each hyperparameter a scenario changes (lr is never changed), from its old one.
CHANGED = {
    "beta1": lambda v: 0.8 if v != 0.8 else 0.9,
    "beta2": lambda v: 0.99 if v != 0.99 else 0.999,
    "eps": lambda v: v * 10.0,
    "weight_decay": lambda v: 0.1 if v == 0.0 else 0.0,
}


def _set_every_group(key: str) -> Callable[[Any], None]:
    """The change of ``key`` in every group, lr untouched."""
    change = CHANGED[key]

    def apply(optimizer):
        for group in optimizer.param_groups:
            group[key] = change(group[key])

    return apply


def _loaded_betas(optimizer) -> None:
    """A load of the optimizer's own state with other betas (the same lr)."""
    sd = copy.deepcopy(optimizer.state_dict())
    for group in sd["param_groups"]:
        group["beta1"], group["beta2"] = (0.8, 0.99) if group["beta1"] != 0.8 else (0.9, 0.999)
    optimizer.load_state_dict(sd)


HYPERPARAMETER_CHANGES = {
    "beta1": _set_every_group("beta1"),
    "beta2": _set_every_group("beta2"),
    "eps": _set_every_group("eps"),
    "weight_decay": _set_every_group("weight_decay"),
    "loaded-betas": _loaded_betas,
}


def _hyperparameter_change(make_optimizer, variant: str) -> Side:
    """A step; one hyperparameter of every group changed (lr untouched); a step."""
    side = _side(make_optimizer)
    side.step(_grads(1))
    HYPERPARAMETER_CHANGES[variant](side.optimizer)
    side.step(_grads(2))
    return side


#: Hyperparameters held as one-element tensors and written in place between steps (a beta2 warm-up,
#: a weight-decay schedule kept in tensors): each call must use the values the groups hold.
TENSOR_HYPERPARAMETERS = tuple(CHANGED)


def _tensor_hyperparameter_in_place(make_optimizer, variant: str) -> Side:
    """Every group's ``variant`` made a one-element fp64 tensor of its value; a step; the tensor
    changed in place (``fill_``); a step."""
    side = _side(make_optimizer)
    groups = side.optimizer.param_groups
    for group in groups:
        group[variant] = torch.tensor(float(group[variant]), dtype=torch.float64)
    side.step(_grads(1))
    for group in groups:
        group[variant].fill_(CHANGED[variant](float(group[variant])))
    side.step(_grads(2))
    return side


#: Writes to group 0's tensor lr that bypass its version counter (SPEC 1.4.2).
LR_WRITES = {
    "data": lambda lr: lr.data.mul_(0.5),
    "dlpack": lambda lr: torch.from_dlpack(lr).mul_(0.5),
}


def _tensor_lr_alias(make_optimizer, variant: str) -> Side:
    """A step; group 0's tensor lr halved through an alias; a step."""
    side = _side(make_optimizer)
    side.step(_grads(1))
    LR_WRITES[variant](side.optimizer.param_groups[0]["lr"])
    side.step(_grads(2))
    return side


def _compact(out: Comparisons, label: str, sd: dict) -> None:
    """SPEC 1.11.5: every state tensor and the codebook own their storage."""
    loose = []
    tensors = [("gefen_codebook", sd.get("gefen_codebook"))] + [
        (f"state[{e.get('name', pid)}].{k}", v) for pid, e in sd["state"].items() for k, v in e.items()
    ]
    tensors = [(where, t) for where, t in tensors if torch.is_tensor(t)]
    for where, t in tensors:
        if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            loose.append(f"{label}: {where} is a view into {t.untyped_storage().nbytes()} bytes of storage")
    out.exact("state_dict(): compact tensors", len(loose), len(tensors), loose)


def _compact_state_dict(make_optimizer, variant: str) -> Side:
    """Two steps, the state dict's tensors inspected after each."""
    side = _side(make_optimizer)
    for call in (1, 2):
        side.step(_grads(call))
        _compact(side.seen, f"after call {call}", side.optimizer.state_dict())
    return side


def _state_tensors(sd: dict) -> list:
    """The codebook and every state tensor of a native state dict, in a fixed order."""
    return [sd["gefen_codebook"]] + [
        v for e in sd["state"].values() for v in e.values() if torch.is_tensor(v)
    ]


def _load_copies(make_optimizer, variant: str) -> Side:
    """A load, then every tensor of the caller's dict changed (the optimizer must not see it), put
    back, and a step (the caller's dict must not see it)."""
    side = _side(make_optimizer, load=False)
    sd, kept = _checkpoint(), _checkpoint()
    side.optimizer.load_state_dict(sd)
    for t in _state_tensors(sd):
        t.add_(1)
    what = "the state after a load, the caller's dict changed since"
    _same_tensors(side.seen, what, kept, runs.native_state(side.optimizer))
    for t, k in zip(_state_tensors(sd), _state_tensors(kept)):
        t.copy_(k)
    side.step(_grads(1))
    _same_tensors(side.seen, "the caller's dict after a load and a step", kept, sd)
    return side


#: The counters of a native state dict (SPEC 1.12.4 item 1).
COUNTERS = ("step", "vmean_step", "factored_step")


def _counters_as_tensors(sd: dict) -> dict:
    """Every parameter's counters one-element int64 tensors, as torch.optim checkpoints carry their
    ``step`` (SPEC 1.12.4 item 1: accepted, and they become Python ints). The global step stays
    as saved: the groups' metadata repeats it, and the two must agree (SPEC 1.12.2)."""
    for entry in sd["state"].values():
        for key in COUNTERS:
            if key in entry:
                entry[key] = torch.tensor(entry[key])
    return sd


def _ids_permuted(sd: dict) -> dict:
    """The parameter ids renumbered: offset, with gaps, descending (a checkpoint merged or converted
    by a tool); saved group ``j``, position ``i`` still maps to live group ``j``, position ``i``
    (SPEC 1.12.3 item 2)."""
    ids = [i for group in sd["param_groups"] for i in group["params"]]
    new = {old: 100 + 7 * (len(ids) - 1 - k) for k, old in enumerate(ids)}
    for group in sd["param_groups"]:
        group["params"] = [new[i] for i in group["params"]]
    sd["state"] = {new[i]: entry for i, entry in sd["state"].items()}
    return sd


def _state_strided(sd: dict) -> dict:
    """Every index and magnitude tensor dense but column-major (a checkpoint written from
    transposed views, or converted by a tool): a load copies values, whatever the strides
    (SPEC 1.12.8)."""
    for entry in sd["state"].values():
        for key in ("m_codebook", "m_magnitude", "vmean"):
            value = entry.get(key)
            if torch.is_tensor(value) and value.dim() == 2:
                entry[key] = value.t().contiguous().t()
    return sd


def _extra_group_keys(sd: dict) -> dict:
    """Caller keys in every saved group (a scheduler's ``initial_lr``, a layer-wise decay's
    ``layer_id``): kept by the load and by every ``state_dict()`` after it (SPEC 1.11.2)."""
    for k, group in enumerate(sd["param_groups"]):
        group["initial_lr"], group["layer_id"] = 1e-3 * (k + 1), k
    return sd


def _groups_named_in_reverse(sd: dict) -> dict:
    """Every saved group named, in the reverse of the live groups' names (:func:`_loaded_form`
    names them ``group0``, ``group1``, ...): groups pair by position, never by name (SPEC 1.12.3
    item 2), and the saved names replace the live ones."""
    count = len(sd["param_groups"])
    for k, group in enumerate(sd["param_groups"]):
        group["name"] = f"group{count - 1 - k}"
    return sd


LOADED_FORMS = {
    "tensor-counters": _counters_as_tensors,
    "permuted-ids": _ids_permuted,
    "strided-state": _state_strided,
    "extra-group-keys": _extra_group_keys,
    "groups-named-in-reverse": _groups_named_in_reverse,
}


def _int_counters(out: Comparisons, label: str, sd: dict) -> None:
    """SPEC 1.12.4 item 1: every counter of the state dict a Python int."""
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


def _loaded_form(make_optimizer, variant: str) -> Side:
    """The checkpoint loaded in another form a native state dict may take (:data:`LOADED_FORMS`),
    then two steps; the counters inspected after the load and after each step."""
    side = _side(make_optimizer, load=False)
    for k, group in enumerate(side.optimizer.param_groups):
        group["name"] = f"group{k}"
    side.optimizer.load_state_dict(LOADED_FORMS[variant](_checkpoint()))
    _int_counters(side.seen, "after the load", side.optimizer.state_dict())
    for call in (1, 2):
        side.step(_grads(call))
        _int_counters(side.seen, f"after call {call}", side.optimizer.state_dict())
    return side


def _lr_by_pre_hook(optimizer, state_dict: dict) -> dict:
    """A load pre-hook that returns a changed copy (torch's ``Optimizer`` hook contract: the
    returned dict is the one loaded): group 0's lr halved."""
    changed = copy.copy(state_dict)
    changed["param_groups"] = [dict(g) for g in state_dict["param_groups"]]
    lr = changed["param_groups"][0]["lr"]
    changed["param_groups"][0]["lr"] = lr * 0.5 if not torch.is_tensor(lr) else lr.detach().clone().mul_(0.5)
    return changed


def _load_pre_hook(make_optimizer, variant: str) -> Side:
    """A load with a pre-hook that returns a changed copy of the checkpoint; two steps."""
    side = _side(make_optimizer, load=False)
    side.optimizer.register_load_state_dict_pre_hook(_lr_by_pre_hook)
    side.optimizer.load_state_dict(_checkpoint())
    for call in (1, 2):
        side.step(_grads(call))
    return side


@dataclass(frozen=True)
class Scenario:
    run: Callable  # (make_optimizer, variant) -> Side
    words: str
    compare: Callable = compare_calls  # (ours, theirs, bitwise) -> Comparisons


SCENARIOS = {
    "zero-first-gradients": Scenario(
        _zero_first_gradients, "all-zero first gradients, then the workload's", _zero_first_compared
    ),
    "found-inf": Scenario(_found_inf, "step(closure) with found_inf set, then a clean call"),
    "grad-scale": Scenario(_grad_scale_in_place, "a call under grad_scale"),
    "zero-grad": Scenario(_zero_grad, "a step, zero_grad, gradients for some parameters, a step"),
    "closure-backward": Scenario(_closure_backward, "step(closure) with a forward and backward"),
    "hyperparameter-change": Scenario(_hyperparameter_change, "a step, a hyperparameter changed, a step"),
    "tensor-lr-alias": Scenario(_tensor_lr_alias, "a step, the tensor lr written through an alias, a step"),
    "compact-state-dict": Scenario(_compact_state_dict, "two steps, the state dict inspected"),
    "load-copies": Scenario(_load_copies, "a load, the caller's dict changed, a step"),
    "tensor-hyperparameter": Scenario(
        _tensor_hyperparameter_in_place, "a step, a tensor hyperparameter changed in place, a step"
    ),
    "loaded-form": Scenario(_loaded_form, "a load of the checkpoint in another form, two steps"),
    "load-pre-hook": Scenario(_load_pre_hook, "a load through a pre-hook that changes it, two steps"),
}


@dataclass(frozen=True)
class ProtocolCase:
    """One scenario and its variant as a replayable case (kind ``calling-protocol``, SPEC 4.5.6)."""

    scenario: str
    variant: str = ""
    kind = "calling-protocol"

    def replay(self, impl, *, bitwise: bool) -> Comparisons:
        scenario = SCENARIOS[self.scenario]
        ours = scenario.run(models.REFERENCE, self.variant)
        try:
            theirs = scenario.run(impl.make_optimizer, self.variant)
        except Exception as exc:  # the protocol failed outright: that is the finding
            out = Comparisons()
            out.problem(f"{self.describe()}: the implementation raised {type(exc).__name__}: {exc}")
            return out
        out = Comparisons()
        out.merge(theirs.seen)
        out.merge(scenario.compare(ours, theirs, bitwise))
        return out

    def payload(self) -> dict:
        return {"kind": self.kind, "scenario": self.scenario, "variant": self.variant}

    @classmethod
    def from_payload(cls, payload: dict) -> ProtocolCase:
        if payload.get("scenario") not in SCENARIOS:
            raise ValueError(f"unknown calling-protocol scenario {payload.get('scenario')!r}")
        return cls(payload["scenario"], str(payload.get("variant", "")))

    def describe(self) -> str:
        variant = f" ({self.variant})" if self.variant else ""
        return f"calling-protocol case: {SCENARIOS[self.scenario].words}{variant}"


def _judge(gefen_impl, gefen_judge, scenario: str, variant: str = "") -> None:
    case = ProtocolCase(scenario, variant)
    gefen_judge.assert_comparisons(case.replay(gefen_impl, bitwise=gefen_judge.bitwise), case=case)


# ------------------------------------------------------------------------------------- tests


@pytest.mark.gefen_clause("4.3.13", "1.6.1", "1.6.7", "1.10.1", "5.6.7", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_all_zero_first_gradients_learn_the_padding_codebook(gefen_impl, gefen_judge):
    """All-zero gradients are data: the first step learns the padding codebook, chooses every
    period, creates the state and steps (weight decay applies, counters advance); the next step
    uses that codebook."""
    _judge(gefen_impl, gefen_judge, "zero-first-gradients")


@pytest.mark.gefen_clause("4.3.13", "1.10.3", "1.10.6", "1.10.11", "1.10.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", list(FOUND_INF))
def test_found_inf_skips_the_step(gefen_impl, gefen_judge, variant):
    """Any nonzero ``found_inf`` (a sum over devices), with ``grad_scale`` or with None after the
    caller unscaled: nothing changes, the closure ran and its loss is returned; the next call steps."""
    _judge(gefen_impl, gefen_judge, "found-inf", variant)


@pytest.mark.gefen_clause("4.3.13", "1.10.3", "1.10.4", "1.10.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", GRAD_SCALE_FORMS)
def test_grad_scale_unscales_the_gradients_in_place(gefen_impl, gefen_judge, variant):
    """After a call under ``grad_scale`` (a tensor, or a Python float) each ``.grad`` is the
    caller's tensor, unscaled."""
    _judge(gefen_impl, gefen_judge, "grad-scale", variant)


@pytest.mark.gefen_clause("4.3.13", "1.10.11", "1.2.6", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", ["set-to-none", "zeros-in-place"])
def test_zero_grad_then_some_parameters_get_no_gradient(gefen_impl, gefen_judge, variant):
    """``zero_grad()`` leaves no gradient, so a parameter that gets none afterwards does not step;
    ``zero_grad(set_to_none=False)`` leaves zeros, and a zero gradient steps."""
    _judge(gefen_impl, gefen_judge, "zero-grad", variant)


@pytest.mark.gefen_clause("4.3.13", "1.10.1", "1.10.11", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", ["top-level", "inside-no-grad"])
def test_closure_runs_forward_and_backward(gefen_impl, gefen_judge, variant):
    """The closure runs under ``enable_grad`` whatever the caller's grad mode; the step uses the
    gradients its ``backward()`` made and returns its loss."""
    _judge(gefen_impl, gefen_judge, "closure-backward", variant)


@pytest.mark.gefen_clause("4.3.13", "1.10.13", "1.12.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", list(HYPERPARAMETER_CHANGES))
def test_hyperparameter_change_alone_takes_effect(gefen_impl, gefen_judge, variant):
    """beta1, beta2, eps or weight decay changed in every group (or other betas loaded) with the
    lr unchanged: the next step uses the new values."""
    _judge(gefen_impl, gefen_judge, "hyperparameter-change", variant)


@pytest.mark.gefen_clause("4.3.13", "1.4.2", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", list(LR_WRITES))
def test_tensor_lr_written_through_an_alias_takes_effect(gefen_impl, gefen_judge, variant):
    """A tensor lr halved through ``.data`` or a DLPack alias (its version counter unchanged) is
    the next step's lr (gefen-x 0.5.0 keeps the old one: SPEC 1.14 D16)."""
    _judge(gefen_impl, gefen_judge, "tensor-lr-alias", variant)


@pytest.mark.gefen_clause("4.3.13", "1.11.5", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_state_dict_tensors_are_compact(gefen_impl, gefen_judge):
    """Every tensor ``state_dict()`` returns owns its storage: no view into a larger buffer."""
    _judge(gefen_impl, gefen_judge, "compact-state-dict")


@pytest.mark.gefen_clause("4.3.13", "1.12.8", "1.12.9", "1.12.12", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_load_copies_the_callers_state(gefen_impl, gefen_judge):
    """After a load, changing the caller's dict leaves the optimizer as loaded, and steps leave the
    caller's dict as it was (gefen-x 0.5.0 keeps the caller's tensors: SPEC 1.14 D17)."""
    _judge(gefen_impl, gefen_judge, "load-copies")


@pytest.mark.gefen_clause("4.3.13", "1.10.13", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", TENSOR_HYPERPARAMETERS)
def test_tensor_hyperparameter_changed_in_place_takes_effect(gefen_impl, gefen_judge, variant):
    """A beta, eps or weight decay held as a tensor and changed in place between steps: the next
    step uses the new value (a cache keyed on the tensor's identity does not)."""
    _judge(gefen_impl, gefen_judge, "tensor-hyperparameter", variant)


@pytest.mark.gefen_clause("4.3.13", "1.11.2", "1.12.3", "1.12.4", "1.12.8", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("variant", list(LOADED_FORMS))
def test_load_of_another_checkpoint_form(gefen_impl, gefen_judge, variant):
    """Counters as one-element tensors become Python ints; renumbered ids and named groups map by
    position; column-major state tensors load by value; caller keys in groups are kept."""
    _judge(gefen_impl, gefen_judge, "loaded-form", variant)


@pytest.mark.gefen_clause("4.3.13", "1.12.13", "5.6.13")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_load_pre_hook_result_is_loaded(gefen_impl, gefen_judge):
    """A load pre-hook that returns a changed dict: that dict is the one loaded."""
    _judge(gefen_impl, gefen_judge, "load-pre-hook")

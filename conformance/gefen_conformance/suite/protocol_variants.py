"""The variants of the calling-protocol scenarios (SPEC 4.3.13), by name (the names are the tests'
parameter ids): how a caller hands ``found_inf`` and ``grad_scale``, which hyperparameter it
changes and how, how it writes a tensor lr, and the forms a native checkpoint it loads may take.
"""

from __future__ import annotations

import copy

import torch

from gefen_conformance.suite.protocol import COUNTERS, SCALE

#: ``found_inf`` as GradScaler passes it: the sum of its per-device flags (2.0 with infs on two
#: devices), with ``grad_scale`` its scale, or None after the caller's ``scaler.unscale_(opt)``.
FOUND_INF = {
    "one-device": (1.0, SCALE),
    "two-devices": (2.0, SCALE),
    "unscaled-by-caller": (1.0, None),
    "two-devices-unscaled-by-caller": (2.0, None),
}

#: How a caller hands the scale: as GradScaler does (one-element tensors), or as Python numbers (a
#: hand-written loss scaler; SPEC 1.10.3 takes either).
GRAD_SCALE_FORMS = ("tensor", "python-float")

#: The parameters that get a new gradient after ``zero_grad`` (a routed expert, an unfrozen layer);
#: the others get none.
ROUTED = ("weight", "prime", "big_prime", "late")

#: The new value of each hyperparameter a scenario changes (lr is never changed), from its old one.
CHANGED = {
    "beta1": lambda v: 0.8 if v != 0.8 else 0.9,
    "beta2": lambda v: 0.99 if v != 0.99 else 0.999,
    "eps": lambda v: v * 10.0,
    "weight_decay": lambda v: 0.1 if v == 0.0 else 0.0,
}


def _set_every_group(key: str):
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


#: One hyperparameter of every group changed between two steps, lr untouched (SPEC 1.10.13).
HYPERPARAMETER_CHANGES = {
    "beta1": _set_every_group("beta1"),
    "beta2": _set_every_group("beta2"),
    "eps": _set_every_group("eps"),
    "weight_decay": _set_every_group("weight_decay"),
    "loaded-betas": _loaded_betas,
}

#: Hyperparameters held as one-element tensors and written in place between steps (a beta2 warm-up,
#: a weight-decay schedule kept in tensors): each call must use the values the groups hold.
TENSOR_HYPERPARAMETERS = tuple(CHANGED)

#: Writes to group 0's tensor lr that bypass its version counter (SPEC 1.4.2).
LR_WRITES = {
    "data": lambda lr: lr.data.mul_(0.5),
    "dlpack": lambda lr: torch.from_dlpack(lr).mul_(0.5),
}


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
    """Every saved group named, in the reverse of the live groups' names (the scenario names them
    ``group0``, ``group1``, ...): groups pair by position, never by name (SPEC 1.12.3 item 2), and
    the saved names replace the live ones."""
    count = len(sd["param_groups"])
    for k, group in enumerate(sd["param_groups"]):
        group["name"] = f"group{count - 1 - k}"
    return sd


#: Other forms a native checkpoint may take, each a change of a fresh copy of it.
LOADED_FORMS = {
    "tensor-counters": _counters_as_tensors,
    "permuted-ids": _ids_permuted,
    "strided-state": _state_strided,
    "extra-group-keys": _extra_group_keys,
    "groups-named-in-reverse": _groups_named_in_reverse,
}

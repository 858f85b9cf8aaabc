"""Putting checkpointed hyperparameters back into live parameter groups (SPEC 3.5).

A restore happens in two phases, and this module keeps them apart:

1. **stage** -- read the saved value, check that it is a legal hyperparameter, and
   check that the group's current entry (the *destination*) can hold it. A tensor
   destination is filled in place later (so that anything holding a reference to
   it, such as a scheduler, keeps seeing the live value), which means its dtype
   must represent the saved value faithfully. Staging raises
   :class:`HyperparameterRejected` (a ``ValueError``) and changes nothing.
2. **commit** -- apply staged values. Committing a value that staging produced
   cannot raise, so a restore never stops half-way through the groups.

Everything here is a pure function of its arguments (no optimizer object, no
process group), so a property-based fuzzer can drive it directly::

    staged = stage_hyperparameter(group["lr"], 3e-5, key="lr")
    apply(group, staged)

    staged_groups = stage_groups(optimizer.param_groups, saved_entries)
    commit(optimizer.param_groups, staged_groups)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .schema import HYPER_KEYS

BETA_KEYS = ("beta1", "beta2")


class HyperparameterRejected(ValueError):
    """A saved hyperparameter, or the live destination meant to receive it, is refused."""


@dataclass(frozen=True)
class StagedValue:
    """One hyperparameter ready to commit.

    ``value`` is the checkpoint's value as a Python float. ``destination`` is the
    live tensor that will be filled in place, or None when the group entry is
    simply replaced by ``value``. ``stored`` is what reading the entry back will
    give after the commit: ``value`` itself, or its rounding to the tensor's dtype.
    """

    key: str
    value: float
    destination: torch.Tensor | None = None
    stored: float = 0.0

    @property
    def in_place(self) -> bool:
        return self.destination is not None


# ----------------------------------------------------------------------------- the value


def read_saved_value(saved: Any, *, key: str) -> float:
    """The saved hyperparameter as a finite Python float in its legal range.

    Accepted forms: a Python int or float, or a one-element real tensor holding
    one. Refused: bools (``True`` is not a learning rate), strings and anything
    else that is not a number, NaN and infinities, and values outside the range
    the optimizer accepts at construction (``lr >= 0``, ``0 <= beta < 1``,
    ``eps > 0``, ``weight_decay >= 0``).
    """
    if key not in HYPER_KEYS:
        raise HyperparameterRejected(f"unknown hyperparameter key {key!r}")
    number = saved
    if torch.is_tensor(number):
        if number.numel() != 1 or number.is_complex() or number.dtype == torch.bool:
            raise HyperparameterRejected(
                f"saved {key} must be a real scalar, got a {number.dtype} tensor of "
                f"{number.numel()} element(s)"
            )
        number = number.item()
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise HyperparameterRejected(
            f"saved {key} is non-numeric ({saved!r}); a checkpoint stores hyperparameters as floats"
        )
    value = float(number)
    if not math.isfinite(value):
        raise HyperparameterRejected(f"saved {key} is not finite ({value!r})")
    if key in BETA_KEYS:
        legal = 0.0 <= value < 1.0
    elif key == "eps":
        legal = value > 0.0
    else:  # lr, weight_decay
        legal = value >= 0.0
    if not legal:
        required = {"eps": "> 0", "beta1": "in [0, 1)", "beta2": "in [0, 1)"}.get(key, ">= 0")
        raise HyperparameterRejected(f"invalid {key} {value!r} (must be {required})")
    return value


# ----------------------------------------------------------------------- the destination


def _value_in_dtype(value: float, dtype: torch.dtype) -> float:
    """What a tensor of ``dtype`` holds after ``fill_(value)``, read back as a float."""
    return float(torch.empty((), dtype=dtype).fill_(value).item())


def _refuse(key: str, value: float, destination: torch.Tensor, why: str) -> HyperparameterRejected:
    return HyperparameterRejected(
        f"the live {key} tensor ({destination.dtype}) cannot represent the saved value "
        f"{value!r}: {why}. Give the group a tensor of a wider dtype (or a plain number) "
        "before loading."
    )


def stage_hyperparameter(destination: Any, saved_value: Any, *, key: str) -> StagedValue:
    """Check that ``saved_value`` may be restored into ``destination`` (a group's current entry).

    A non-tensor destination is replaced by the saved float at commit. A tensor
    destination is filled in place and must:

    * hold exactly one real element, and not be an autograd intermediate (a
      non-leaf that requires grad: filling it would corrupt the graph it belongs
      to). A leaf that requires grad is accepted; the fill runs under
      ``torch.no_grad()`` and leaves ``requires_grad`` and ``.grad`` alone;
    * integral or bool dtype: receive an integral value (no truncation) inside
      the dtype's range (``[0, 1]`` for bool);
    * floating dtype: receive a value whose magnitude is at most the dtype's
      largest finite value (no overflow to inf; values that would round down to
      the maximum are refused too), that does not round to zero unless it is
      zero (no underflow), and -- for a beta -- that still lies in ``[0, 1)``
      after rounding (a beta of 1 makes the next bias correction divide by zero).

    Ordinary rounding is accepted; ``stored`` reports the rounded value.
    """
    value = read_saved_value(saved_value, key=key)
    if not torch.is_tensor(destination):
        return StagedValue(key, value, None, value)
    if destination.numel() != 1:
        raise HyperparameterRejected(
            f"the live {key} tensor has {destination.numel()} elements; a hyperparameter "
            "tensor must hold exactly one"
        )
    if destination.is_complex():
        raise HyperparameterRejected(f"the live {key} tensor is complex ({destination.dtype})")
    if destination.requires_grad and not destination.is_leaf:
        raise HyperparameterRejected(
            f"the live {key} tensor is a non-leaf that requires grad (an autograd intermediate); "
            "filling it in place would corrupt the graph that produced it"
        )
    dtype = destination.dtype
    if dtype == torch.bool or not dtype.is_floating_point:
        if value != math.floor(value):
            why = f"the in-place fill would truncate it to {int(value)}"
            raise _refuse(key, value, destination, why)
        low, high = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
        if not low <= value <= high:
            why = f"outside the representable range [{low}, {high}]"
            raise _refuse(key, value, destination, why)
        stored = float(int(value))
    else:
        largest = torch.finfo(dtype).max
        if abs(value) > largest:
            raise _refuse(
                key,
                value,
                destination,
                f"outside the representable range [-{largest!r}, {largest!r}]; the in-place "
                "fill would overflow to inf",
            )
        stored = _value_in_dtype(value, dtype)
        if value != 0.0 and stored == 0.0:
            raise _refuse(key, value, destination, "the in-place fill would underflow to 0")
    if key in BETA_KEYS and not 0.0 <= stored < 1.0:
        raise _refuse(
            key,
            value,
            destination,
            f"it rounds to {stored!r}, outside [0, 1); a beta of 1 would make the next bias "
            "correction 1 - beta**t divide by zero",
        )
    return StagedValue(key, value, destination, stored)


# ------------------------------------------------------------------------------ groups


def stage_group(group: Mapping, entry: Any, *, group_index: int) -> dict:
    """Stage every key of one saved group entry against the live ``group``."""
    if not isinstance(entry, Mapping):
        raise HyperparameterRejected(
            f"group {group_index} hyperparameters must be a mapping, got {type(entry).__name__}"
        )
    staged = {}
    for key in HYPER_KEYS:
        if key not in entry:
            raise HyperparameterRejected(f"group {group_index} is missing hyperparameter {key!r}")
        try:
            staged[key] = stage_hyperparameter(group.get(key), entry[key], key=key)
        except HyperparameterRejected as exc:
            raise HyperparameterRejected(f"group {group_index}: {exc}") from None
    return staged


def _memory_of(tensor: torch.Tensor):
    """Where a one-element tensor's value lives; tensors with equal keys are aliases."""
    try:
        address = tensor.data_ptr()
    except RuntimeError:  # a wrapper subclass without storage of its own
        address = 0
    if address == 0:  # no storage (meta, wrappers): only the object itself can alias
        return ("object", id(tensor))
    return (str(tensor.device), address)


def check_aliases(staged_groups: Sequence[Mapping[str, StagedValue]]) -> None:
    """Refuse a live tensor shared by several groups or keys that would receive different values.

    Filling one tensor twice keeps only the last value, so every group sharing it
    would silently read another group's hyperparameter. Shared tensors receiving
    the same saved value are fine.
    """
    first_seen = {}
    for group_index, staged in enumerate(staged_groups):
        for key, item in staged.items():
            if not item.in_place:
                continue
            where = _memory_of(item.destination)
            if where not in first_seen:
                first_seen[where] = (group_index, key, item.value)
                continue
            other_group, other_key, other_value = first_seen[where]
            if item.value != other_value:
                raise HyperparameterRejected(
                    f"one live tensor is aliased by group {other_group} {other_key} and group "
                    f"{group_index} {key}, which the checkpoint gives different values "
                    f"({other_value!r} and {item.value!r}); filling it in place cannot restore "
                    "both. Give each group its own tensor before loading."
                )


def stage_groups(param_groups: Sequence[Mapping], entries: Any) -> list:
    """Stage every group's saved entry, then the aliasing rule; returns one dict per group."""
    if not isinstance(entries, (list, tuple)) or len(entries) != len(param_groups):
        count = len(entries) if isinstance(entries, (list, tuple)) else type(entries).__name__
        raise HyperparameterRejected(
            f"checkpoint hyperparameters differ in count: {count} entries for "
            f"{len(param_groups)} parameter groups"
        )
    staged_groups = [
        stage_group(group, entry, group_index=index)
        for index, (group, entry) in enumerate(zip(param_groups, entries))
    ]
    check_aliases(staged_groups)
    return staged_groups


# ------------------------------------------------------------------------------ commit


def apply(group: dict, staged: StagedValue) -> None:
    """Write one staged value into ``group``; cannot raise for a value staging produced."""
    if not staged.in_place:
        group[staged.key] = staged.value
        return
    destination = staged.destination
    if destination.is_inference():
        # An inference tensor may only be updated inside inference mode.
        with torch.inference_mode():
            destination.fill_(staged.value)
    else:
        # The fill restores a value; it is not part of any autograd graph.
        with torch.no_grad():
            destination.fill_(staged.value)


def commit(param_groups: Sequence[dict], staged_groups: Sequence[Mapping[str, StagedValue]]) -> None:
    """Apply every staged value, group by group, key by key."""
    for group, staged in zip(param_groups, staged_groups):
        for key in HYPER_KEYS:
            apply(group, staged[key])


__all__ = [
    "BETA_KEYS",
    "HyperparameterRejected",
    "StagedValue",
    "apply",
    "check_aliases",
    "commit",
    "read_saved_value",
    "stage_group",
    "stage_groups",
    "stage_hyperparameter",
]

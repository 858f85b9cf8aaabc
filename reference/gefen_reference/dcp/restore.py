"""The rank-local half of ``GefenDCPState.load_state_dict()``: stage everything, then commit.

:func:`stage` reads a loaded checkpoint dict and prepares the complete new
optimizer state -- per-slot compact state, codebook, global step, hyperparameters
-- without changing anything live. It raises on the first problem it finds.
:func:`commit` installs a staged :class:`RestorePlan` and cannot fail. Between the
two, ``GefenDCPState`` makes every rank agree that every rank staged successfully
(SPEC 3.2), so either all ranks commit or none does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import hyper_staging, layout, optimizer_view, placeholder, reblock, schema

TORN_SLOT_HINT = (
    " A saver that lets each rank write its own copy of a slot's replicated scalars "
    "produces this when a parameter's first dimension is smaller than the world size "
    "(gefen-x 0.5.0 does; SPEC 2.4.5): the flag and the counters then come from "
    "different ranks. Which of them is right cannot be told from the file, so the "
    "checkpoint is refused rather than guessed at."
)


@dataclass(frozen=True)
class SlotReading:
    """One slot as read from the checkpoint, validated, not yet re-blocked."""

    slot: layout.SlotRef
    initialized: bool
    step: int
    vmean_step: int
    momentum: torch.Tensor  # fp32, this rank's local shape
    second: torch.Tensor

    @property
    def materialized(self) -> bool:
        # An initialized slot whose shard is empty on this rank is restored by
        # name only: there is nothing to hold, and a fresh native optimizer never
        # creates state for an empty shard either.
        return self.initialized and self.momentum.numel() > 0


@dataclass(frozen=True)
class RestorePlan:
    """Everything a commit installs; built by :func:`stage`."""

    slots: tuple
    identities: list
    new_state: dict  # parameter -> its complete new state dict
    hypers: list  # one {key: StagedValue} per group
    global_step: int
    codebook: torch.Tensor | None


# ------------------------------------------------------------------------- header


def _check_header(state_dict, optimizer, slots) -> None:
    """SPEC 3.3.1-3.3.5: keys, version, group topology and identities."""
    if not isinstance(state_dict, dict):
        raise ValueError(f"Gefen DCP checkpoint must be a dict, got {type(state_dict).__name__}")
    missing = [key for key in schema.HEADER_KEYS if key not in state_dict]
    if missing:
        raise ValueError(f"Gefen DCP checkpoint metadata is incomplete: missing {', '.join(missing)}")
    version = schema.as_counter(state_dict["format_version"], "format_version")
    if version != schema.FORMAT_VERSION:
        raise ValueError(
            f"Unsupported Gefen DCP checkpoint format version {version} (this adapter reads "
            f"version {schema.FORMAT_VERSION})"
        )
    slot_count = schema.as_counter(state_dict["slot_count"], "slot_count")
    if slot_count != len(slots):
        raise ValueError(
            f"Gefen DCP checkpoint parameter count differs: it holds {slot_count} slot(s), this "
            f"optimizer has {len(slots)}"
        )
    group_count = schema.as_counter(state_dict["group_count"], "group_count")
    if group_count != len(optimizer.param_groups):
        raise ValueError(
            f"Gefen DCP checkpoint parameter-group count differs: it holds {group_count} "
            f"group(s), this optimizer has {len(optimizer.param_groups)}"
        )
    saved = state_dict["param_identities"]
    expected = [slot.identity() for slot in slots]
    if not isinstance(saved, list) or saved != expected:
        where = ""
        if isinstance(saved, list):
            for index, (got, want) in enumerate(zip(saved, expected)):
                if got != want:
                    where = f" (first difference at slot {index}: checkpoint {got!r}, optimizer {want!r})"
                    break
            else:
                where = f" ({len(saved)} saved identities for {len(expected)} slots)"
        raise ValueError(
            "Gefen DCP checkpoint parameter identities (name/group/shape) do not match this "
            f"optimizer{where}; state is addressed by slot number, so loading it could hand one "
            "parameter's momentum to another"
        )


def _check_deterministic(state_dict, optimizer) -> None:
    """SPEC 3.3.7: the flag must match; it is never changed by a load."""
    saved = schema.as_counter(state_dict["deterministic"], "deterministic")
    if saved not in (0, 1):
        raise ValueError(f"Gefen DCP checkpoint deterministic flag must be 0 or 1, got {saved}")
    live = optimizer_view.deterministic_of(optimizer)
    if bool(saved) != live:
        raise ValueError(
            f"Gefen DCP checkpoint was saved with deterministic={bool(saved)!r}, but this "
            f"optimizer was built with deterministic={live!r}; a load does not change the flag, so "
            "build the optimizer with the checkpoint's setting"
        )


# -------------------------------------------------------------------------- slots


def dense_value(value) -> torch.Tensor:
    """This rank's dense shard from a checkpoint entry.

    Through ``dcp.load`` the entry is the placeholder ``state_dict()`` returned,
    whose kept buffer DCP has filled with the checkpoint's data. A dict passed
    straight from ``state_dict()`` to ``load_state_dict()`` holds placeholders
    that build the live state's dense form. A plain tensor or DTensor is read as is.
    """
    if placeholder.is_placeholder(value):
        return value.__get_tensor_shard__(None)
    if not torch.is_tensor(value):
        raise ValueError(f"expected a tensor, got {type(value).__name__}")
    return layout.local_part(value)


def _read_slot(state_dict, slot) -> SlotReading:
    """SPEC 3.4: one slot's entries, checked on their own and against each other."""
    keys = {field: schema.slot_key(slot.index, field) for field in schema.SLOT_FIELDS}
    absent = [key for key in keys.values() if key not in state_dict]
    if absent:
        raise ValueError(
            f"Gefen DCP checkpoint is missing state for slot {slot.index} ({slot.name}): {', '.join(absent)}"
        )
    flag = schema.as_counter(state_dict[keys["initialized"]], keys["initialized"])
    if flag not in (0, 1):
        raise ValueError(f"Gefen DCP slot {slot.index} initialized flag must be 0 or 1, got {flag}")
    step = schema.as_counter(state_dict[keys["step"]], keys["step"])
    vmean_step = schema.as_counter(state_dict[keys["vmean_step"]], keys["vmean_step"])
    try:
        momentum = dense_value(state_dict[keys["momentum"]]).detach().float()
        second = dense_value(state_dict[keys["second_moment"]]).detach().float()
    except ValueError as exc:
        raise ValueError(f"Gefen DCP slot {slot.index} dense state: {exc}") from None
    local = layout.local_part(slot.parameter)
    if momentum.shape != local.shape or second.shape != local.shape:
        raise ValueError(
            f"Gefen DCP checkpoint local shape differs for slot {slot.index} ({slot.name}): "
            f"momentum {tuple(momentum.shape)}, second moment {tuple(second.shape)}, "
            f"shard {tuple(local.shape)}"
        )
    if not bool(torch.isfinite(momentum).all()) or not bool(torch.isfinite(second).all()):
        raise ValueError(f"Gefen DCP checkpoint contains non-finite state in slot {slot.index} ({slot.name})")
    if bool((second < 0).any()):
        raise ValueError(
            f"Gefen DCP second moment must be nonnegative, but slot {slot.index} ({slot.name}) "
            "holds a negative value"
        )
    initialized = flag == 1
    if initialized and (step < 1 or vmean_step < 1):
        raise ValueError(
            f"Gefen DCP slot {slot.index} ({slot.name}) is initialized but carries step={step}, "
            f"vmean_step={vmean_step}; initialized state requires both counters >= 1."
            f"{TORN_SLOT_HINT}"
        )
    if not initialized and (step != 0 or vmean_step != 0):
        raise ValueError(
            f"Gefen DCP slot {slot.index} ({slot.name}) is uninitialized but carries nonzero counters "
            f"(step={step}, vmean_step={vmean_step}).{TORN_SLOT_HINT}"
        )
    if not initialized and (bool(momentum.any()) or bool(second.any())):
        raise ValueError(
            f"Gefen DCP slot {slot.index} ({slot.name}) is uninitialized but carries nonzero "
            "momentum or second-moment history, which a fresh slot would silently discard."
            f"{TORN_SLOT_HINT}"
        )
    return SlotReading(slot, initialized, step, vmean_step, momentum, second)


def _compact_state(optimizer, readings):
    """SPEC 3.6: periods, this rank's codebook, then every slot's new state."""
    rules = optimizer_view.period_rules_of(optimizer)
    periods = {
        r.slot.index: reblock.period_for(rules, r.slot.name, r.slot.parameter.shape, r.second)
        for r in readings
        if r.materialized
    }
    device = layout.local_part(readings[0].slot.parameter).device
    codebook = reblock.relearn_codebook(
        [(r.momentum, periods[r.slot.index]) for r in readings if r.materialized], device
    )
    new_state = {}
    for r in readings:
        if not r.materialized:
            new_state[r.slot.parameter] = {"name": r.slot.name}
            continue
        period = periods[r.slot.index]
        indices, magnitude, vmean = reblock.reblock(codebook, r.momentum, r.second, period)
        new_state[r.slot.parameter] = {
            "name": r.slot.name,
            "automatic_period": period,
            "step": r.step,
            "m_codebook": indices,
            "m_magnitude": magnitude,
            "vmean": vmean,
            "vmean_step": r.vmean_step,
        }
    return new_state, codebook


# ------------------------------------------------------------------- stage, commit


def stage(optimizer, state_dict) -> RestorePlan:
    """Validate ``state_dict`` against ``optimizer`` and build the complete new state.

    Reads, never writes, the optimizer. Raises on the first problem (SPEC 3.3-3.6).
    """
    slots = layout.collect_slots(optimizer)
    layout.reject_name_collisions(slots)
    _check_header(state_dict, optimizer, slots)
    hypers = hyper_staging.stage_groups(optimizer.param_groups, state_dict["param_group_hypers"])
    _check_deterministic(state_dict, optimizer)
    readings = [_read_slot(state_dict, slot) for slot in slots]
    global_step = schema.as_counter(state_dict["global_step"], "global_step")
    new_state, codebook = _compact_state(optimizer, readings)
    return RestorePlan(
        slots=slots,
        identities=[slot.identity() for slot in slots],
        new_state=new_state,
        hypers=hypers,
        global_step=global_step,
        codebook=codebook,
    )


def commit(optimizer, plan: RestorePlan) -> None:
    """Install ``plan``. Only assignments and validated in-place fills: it cannot fail.

    The whole per-parameter state is replaced, so keys the plan does not hold
    (scratch buffers, anything a caller parked there) are dropped.
    """
    optimizer_view.replace_state(optimizer, plan.new_state)
    hyper_staging.commit(optimizer.param_groups, plan.hypers)
    optimizer_view.set_global_step(optimizer, plan.global_step)
    optimizer_view.set_codebook(optimizer, plan.codebook)


__all__ = ["RestorePlan", "SlotReading", "TORN_SLOT_HINT", "commit", "dense_value", "stage"]

"""Reading a slot's compact (block-quantized) state before it is expanded.

Everything here inspects metadata and the small per-block tensors only; nothing
dense is allocated. The checks exist so that every way the deferred dense
expansion could fail is found before the first byte of a checkpoint is written.
"""

from __future__ import annotations

import torch

from . import schema

# A slot holding all of these has been stepped and is saved as initialized.
REQUIRED_FIELDS = ("automatic_period", "step", "m_codebook", "m_magnitude", "vmean")

# Any one of these shows the slot was stepped at least partly. ``vmean_step``
# is not required (older state backfills it from ``step``), but finding it alone
# means the state is damaged, not fresh.
STEPPED_MARKERS = REQUIRED_FIELDS + ("vmean_step",)

# Block tensors that must live on the shard's own device.
BLOCK_TENSORS = ("m_codebook", "m_magnitude", "vmean")


def is_initialized(slot, state) -> bool:
    """True for fully stepped state, False for a fresh slot; partial state raises."""
    if not state:
        return False
    if not any(key in state for key in STEPPED_MARKERS):
        return False
    missing = [key for key in REQUIRED_FIELDS if key not in state]
    if missing:
        raise ValueError(
            f"Gefen DCP slot {slot.index} ({slot.name}) has partial optimizer state: "
            f"{', '.join(missing)} missing. Saving it as a fresh slot would silently zero its "
            "history, so the save is refused."
        )
    return True


def step_counters(state) -> tuple:
    """``(step, vmean_step)`` as written; fresh slots are ``(0, 0)``."""
    if not state:
        return 0, 0
    step = schema.as_counter(state.get("step", 0), "step")
    vmean_step = schema.as_counter(state.get("vmean_step", state.get("step", 0)), "vmean_step")
    return step, vmean_step


def check_expandable(codebook, local: torch.Tensor, state) -> None:
    """Prove that an initialized slot's dense expansion cannot fail mid-write."""
    if codebook is None:
        raise RuntimeError("Gefen DCP save requires an initialized codebook, but this rank has none")
    # Indices are uint8, so a one-dimensional codebook with at least 256 entries
    # can address every index that can occur; no pass over the indices is needed.
    if codebook.dim() != 1 or codebook.numel() < 256:
        raise ValueError(
            "Gefen momentum codebook geometry is invalid: need a 1-D codebook of at "
            f"least 256 entries, got shape {tuple(codebook.shape)}"
        )
    indices = state["m_codebook"]
    if indices.dtype != torch.uint8:
        raise ValueError(
            f"Gefen momentum index dtype is invalid: m_codebook must be uint8, got {indices.dtype}"
        )
    for key in BLOCK_TENSORS:
        if state[key].device != local.device:
            raise ValueError(
                f"Gefen optimizer state device is inconsistent: {key} is on "
                f"{state[key].device} but the parameter shard is on {local.device}"
            )
    period = schema.as_counter(state["automatic_period"], "automatic_period")
    n_local = local.numel()
    n_indices = indices.numel()
    if period < 1 or n_indices != state["m_magnitude"].numel() * period or n_indices != n_local:
        raise ValueError(
            f"Gefen momentum block geometry is invalid: period {period}, {n_indices} indices, "
            f"{state['m_magnitude'].numel()} magnitudes, {n_local} shard elements"
        )
    if state["vmean"].numel() * period != n_local:
        raise ValueError(
            f"Gefen second-moment block geometry is invalid: period {period}, "
            f"{state['vmean'].numel()} block means, {n_local} shard elements"
        )
    for label, tensor in (
        ("codebook", codebook),
        ("m_magnitude", state["m_magnitude"]),
        ("vmean", state["vmean"]),
    ):
        # In fp32, as written: a finite fp64 value can still overflow there.
        if not bool(torch.isfinite(tensor.float()).all()):
            raise ValueError(f"Gefen optimizer state is non-finite ({label}); refusing to write")

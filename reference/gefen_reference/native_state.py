"""The native (non-DTensor) state-dict format and its load validation (SPEC 1.11, 1.12).

``pack_state_dict`` builds the published layout; ``stage_load`` turns a state dict
into a complete replacement (groups, per-param state, codebook, global step)
*without touching the live optimizer*, raising ValueError naming the first
problem. The optimizer commits the staged result only when staging succeeded,
so a rejected load mutates nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from .hyperparameters import HYPERPARAMETER_KEYS, validate_hyperparameters
from .naming import reconcile_flags

FORMAT_VERSION = 1
#: Versions whose group metadata the native loader understands (SPEC 1.12.2 item 3).
ACCEPTED_FORMAT_VERSIONS = (1, 2)
METADATA_KEY = "_gefen_checkpoint_metadata"
COUNTER_KEYS = ("step", "vmean_step", "factored_step")
#: Per-step buffers that some implementations keep in state; never serialized.
SCRATCH_KEYS = ("stepsize", "_h_buf")
#: Keys a load drops silently: scratch and the legacy index-shape hint (SPEC 1.12.4 item 6, 1.14 D9).
DROPPED_KEYS = SCRATCH_KEYS + ("m_codebook_shape",)
#: Capturable scratch keys begin so (``_capt_scalars``, ``_capt_row``, ...): a load drops them too.
DROPPED_PREFIX = "_capt_"
#: Every per-parameter key a native state may carry (SPEC 1.11.3).
STATE_KEYS = (
    "name",
    "automatic_period",
    "step",
    "m_codebook",
    "m_magnitude",
    "vmean",
    "vmean_step",
    "v_row",
    "v_col",
    "factored_step",
)
CODEBOOK_SIZE = 256


def is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "placements") and hasattr(t, "to_local")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, or the tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def _compact(value: Any) -> Any:
    """A tensor that views a larger storage is cloned so a checkpoint never drags its base along."""
    if torch.is_tensor(value) and (
        value.storage_offset() != 0
        or value.untyped_storage().nbytes() != value.numel() * value.element_size()
    ):
        return value.detach().clone()
    return value


def pack_state_dict(optimizer) -> dict:
    """The native state dict (SPEC 1.11): per-param state keyed by position, groups, run extras."""
    index_of = {}
    groups = []
    for group in optimizer.param_groups:
        packed = {k: v for k, v in group.items() if k != "params"}
        packed["params"] = []
        for p in group["params"]:
            index_of.setdefault(p, len(index_of))
            packed["params"].append(index_of[p])
        groups.append(packed)
    state = {
        index_of[p]: {k: _compact(v) for k, v in entry.items() if k not in SCRATCH_KEYS}
        for p, entry in optimizer.state.items()
        if p in index_of
    }
    first = optimizer.param_groups[0]["params"][0]
    metadata = {
        "format_version": FORMAT_VERSION,
        "global_step": optimizer.global_step,
        "codebook": optimizer.codebook,
        "deterministic": optimizer.deterministic,
        "device_anchor": torch.zeros(1, dtype=torch.uint8, device=local_tensor(first).device),
    }
    for group in groups:
        group[METADATA_KEY] = metadata
    return {
        "state": state,
        "param_groups": groups,
        "gefen_global_step": optimizer.global_step,
        "gefen_deterministic": optimizer.deterministic,
        "gefen_codebook": optimizer.codebook,
    }


@dataclass
class StagedLoad:
    """Everything a native load replaces, built aside from the live optimizer."""

    param_groups: list
    state: defaultdict = field(default_factory=lambda: defaultdict(dict))
    codebook: torch.Tensor | None = None
    global_step: int = 0


def counter_value(key: str, value: Any) -> int:
    """A counter must be a non-negative integral int or 1-element tensor; floats are refused (SPEC 1.12.4 item
    1)."""
    if torch.is_tensor(value):
        if value.numel() != 1 or value.dtype == torch.bool or not bool(torch.isfinite(value).all()):
            raise ValueError(f"counter {key} must be a finite scalar, got {value!r}")
        number = float(value.detach().cpu().item())
    elif type(value) is int:
        number = float(value)
    else:
        raise ValueError(f"counter {key} must be an int, got {type(value).__name__} {value!r}")
    if number < 0 or not number.is_integer():
        raise ValueError(f"counter {key} must be a non-negative integer, got {value!r}")
    return int(number)


def validate_codebook(codebook: Any, *, required: bool) -> None:
    """fp32, 1-D, 256 entries, finite, sorted non-decreasing, endpoints exactly -1 and +1 (SPEC 1.12.5)."""
    if codebook is None:
        if required:
            raise ValueError("checkpoint has quantized momentum but no codebook")
        return
    if (
        not torch.is_tensor(codebook)
        or codebook.dtype != torch.float32
        or codebook.dim() != 1
        or codebook.numel() != CODEBOOK_SIZE
    ):
        raise ValueError("codebook must be a 1-D fp32 tensor of 256 codewords")
    cb = codebook.detach().cpu()
    if not bool(torch.isfinite(cb).all()):
        raise ValueError("codebook must be finite")
    if not bool((cb[1:] >= cb[:-1]).all()):
        raise ValueError("codebook must be sorted in non-decreasing order")
    if cb[0].item() != -1.0 or cb[-1].item() != 1.0:
        raise ValueError("codebook must keep its endpoints -1 and +1")


def _check_tensor(key: str, t: Any, dtype: torch.dtype, shape: tuple, *, non_negative: bool) -> None:
    if not torch.is_tensor(t) or t.dtype != dtype or tuple(t.shape) != shape:
        got = f"{t.dtype} {tuple(t.shape)}" if torch.is_tensor(t) else type(t).__name__
        raise ValueError(f"state {key} must be {dtype} of shape {shape}, got {got}")
    if non_negative and not (bool(torch.isfinite(t).all()) and bool((t >= 0).all())):
        raise ValueError(f"state {key} must be finite and non-negative")


def validate_param_state(name: str, shape: tuple, entry: dict) -> bool:
    """Validate one parameter's restored state (SPEC 1.12.4); True when it carries momentum."""
    where = f"parameter {name!r}: "
    try:
        counters = {k: counter_value(k, entry[k]) for k in COUNTER_KEYS if k in entry}
        numel = math.prod(shape)
        period = entry.get("automatic_period")
        if period is not None and (type(period) is not int or period <= 0 or numel == 0 or numel % period):
            raise ValueError(f"automatic_period {period!r} must be a positive int dividing {numel}")
        has_momentum = "m_codebook" in entry or "m_magnitude" in entry
        initialized = any(
            k in entry for k in ("step", "vmean", "vmean_step", "v_row", "v_col", "factored_step")
        )
        if initialized and not has_momentum:
            raise ValueError("initialized state is missing its quantized momentum")
        if period is not None and not has_momentum:
            raise ValueError("automatic_period is present without quantized momentum")
        if has_momentum:
            if "m_codebook" not in entry or "m_magnitude" not in entry or period is None:
                raise ValueError("quantized momentum needs m_codebook, m_magnitude and automatic_period")
            if counters.get("step", 0) < 1:
                raise ValueError("quantized momentum needs step >= 1")
            blocks = numel // period
            _check_tensor(
                "m_codebook", entry["m_codebook"], torch.uint8, (blocks, period), non_negative=False
            )
            _check_tensor("m_magnitude", entry["m_magnitude"], torch.float32, (blocks, 1), non_negative=True)
            if "vmean" in entry:
                _check_tensor("vmean", entry["vmean"], torch.float32, (blocks, 1), non_negative=True)
            if "vmean_step" in entry and "vmean" not in entry:
                raise ValueError("vmean_step without vmean")
            if "v_row" in entry or "v_col" in entry:
                if counters.get("factored_step", 0) < 1:
                    raise ValueError("factored second moment needs factored_step >= 1")
            elif "vmean" not in entry:
                raise ValueError("quantized momentum has no second moment")
            elif counters.get("vmean_step", 1) < 1:
                raise ValueError("vmean needs vmean_step >= 1")
        if ("v_row" in entry) != ("v_col" in entry) or ("factored_step" in entry) != ("v_row" in entry):
            raise ValueError("factored second moment needs v_row, v_col and factored_step together")
        if "v_row" in entry:
            if len(shape) != 2:
                raise ValueError("factored second moment needs a 2-D parameter")
            _check_tensor("v_row", entry["v_row"], torch.float32, (shape[0],), non_negative=True)
            _check_tensor("v_col", entry["v_col"], torch.float32, (shape[1],), non_negative=True)
    except ValueError as error:
        raise ValueError(f"{where}{error}") from None
    return has_momentum


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b)
    return a == b


def _read_run_metadata(sd: dict, groups: list, live_deterministic: bool) -> tuple[Any, Any]:
    """Reconcile top-level and per-group run metadata (SPEC 1.12.2 items 1-7).

    Returns ``(global_step, codebook)``.
    """
    metadata = [g.pop(METADATA_KEY) for g in groups if METADATA_KEY in g]
    step = sd.pop("gefen_global_step", None)
    codebook = sd.pop("gefen_codebook", None)
    has_flag = "gefen_deterministic" in sd
    deterministic = sd.pop("gefen_deterministic", None)
    if has_flag and type(deterministic) is not bool:
        raise ValueError(f"gefen_deterministic must be a bool, got {deterministic!r}")
    if metadata:
        if len(metadata) != len(groups):
            raise ValueError("checkpoint metadata is present on only some parameter groups")
        first = metadata[0]
        if first.get("format_version") not in ACCEPTED_FORMAT_VERSIONS:
            raise ValueError(f"unsupported checkpoint format_version {first.get('format_version')!r}")
        for m in metadata:
            if "deterministic" in m and type(m["deterministic"]) is not bool:
                raise ValueError(f"group metadata deterministic must be a bool, got {m['deterministic']!r}")
            if not (
                _same(m.get("global_step"), first.get("global_step"))
                and _same(m.get("codebook"), first.get("codebook"))
                and m.get("deterministic") == first.get("deterministic")
            ):
                raise ValueError("parameter groups carry inconsistent optimizer metadata")
        if step is None:
            step = first.get("global_step", 0)
        elif not _same(step, first.get("global_step", 0)):
            raise ValueError("top-level and group metadata global steps disagree")
        if codebook is None:
            codebook = first.get("codebook")
        elif not _same(codebook, first.get("codebook")):
            raise ValueError("top-level and group metadata codebooks disagree")
        if deterministic is None:
            deterministic = first.get("deterministic")
        elif first.get("deterministic") is not None and deterministic != first.get("deterministic"):
            raise ValueError("top-level and group metadata deterministic policies disagree")
    if deterministic is not None and deterministic != live_deterministic:
        raise ValueError(
            f"checkpoint deterministic={deterministic!r} but this optimizer has "
            f"deterministic={live_deterministic!r}; "
            "changing the replica-determinism policy needs an intentional state migration"
        )
    return (0 if step is None else step), codebook


def _pack_legacy_groups(saved_groups: list, live_groups: list) -> list:
    """Map one-param-per-group checkpoints onto the live grouping (SPEC 1.12.7)."""
    if not saved_groups or len(saved_groups) == len(live_groups):
        return saved_groups
    if not all(len(g.get("params", ())) == 1 for g in saved_groups):
        return saved_groups
    sizes = [len(g["params"]) for g in live_groups]
    if sum(sizes) != len(saved_groups):
        return saved_groups
    ignored = {"params", "name", "param_names", "param_names_synthesized"}
    packed, cursor = [], 0
    for live, size in zip(live_groups, sizes):
        chunk = saved_groups[cursor : cursor + size]
        shared = {k: v for k, v in chunk[0].items() if k not in ignored}
        for legacy in chunk[1:]:
            other = {k: v for k, v in legacy.items() if k not in ignored}
            if set(other) != set(shared) or not all(_same(other[k], shared[k]) for k in shared):
                raise ValueError(
                    "cannot load a legacy checkpoint with per-parameter hyperparameters into a "
                    "multi-parameter group"
                )
        names = [str(g.get("name", f"param_{cursor + i}")).lower() for i, g in enumerate(chunk)]
        group = dict(shared)
        if "name" in live:
            group["name"] = live["name"]
        elif len(names) == 1:
            group["name"] = names[0]
        group["params"] = [g["params"][0] for g in chunk]
        group["param_names"] = names
        packed.append(group)
        cursor += size
    return packed


def _refuse_tensor_state_for_dtensors(saved_state: dict, codebook: Any) -> None:
    """Into DTensor parameters only a never-stepped checkpoint loads (SPEC 1.12.11).

    Per-parameter state and the codebook are rank-local: a native checkpoint holds one
    unsharded copy, which no rank of a sharded optimizer may take as its own.
    """
    carried = sorted(
        {key for entry in saved_state.values() if isinstance(entry, dict) for key in entry if key != "name"}
    )
    if codebook is not None:
        carried.append("a codebook")
    if carried:
        raise ValueError(
            "a native load into DTensor parameters accepts only a never-stepped checkpoint (no "
            f"per-parameter state, no codebook), but this one carries {', '.join(carried)}; "
            "restore sharded optimizer state with gefen_reference.GefenDCPState and "
            "torch.distributed.checkpoint"
        )


def stage_load(optimizer, state_dict: dict) -> StagedLoad:
    """Validate ``state_dict`` against ``optimizer`` and build the replacement (SPEC 1.12)."""
    if not isinstance(state_dict, dict) or "param_groups" not in state_dict or "state" not in state_dict:
        raise ValueError("a native state dict needs 'state' and 'param_groups'")
    sd = dict(state_dict)
    saved_groups = [dict(g) for g in sd["param_groups"]]
    global_step, codebook = _read_run_metadata(sd, saved_groups, optimizer.deterministic)
    saved_state = sd.get("state") or {}
    if not isinstance(saved_state, dict):
        raise ValueError("'state' must be a dict keyed by parameter position")
    if any(isinstance(e, dict) and "m_codebook" in e for e in saved_state.values()) and codebook is None:
        raise ValueError(
            "checkpoint has quantized momentum indices but no codebook; loading it would reinterpret "
            "the indices"
        )
    if any(is_dtensor(p) for group in optimizer.param_groups for p in group["params"]):
        _refuse_tensor_state_for_dtensors(saved_state, codebook)
    saved_groups = _pack_legacy_groups(saved_groups, optimizer.param_groups)
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    if any(
        len(s.get("params", ())) != len(g["params"]) for s, g in zip(saved_groups, optimizer.param_groups)
    ):
        raise ValueError(
            "loaded state dict contains a parameter group that doesn't match the size of optimizer's group"
        )

    position = {}
    staged = StagedLoad(param_groups=[])
    for saved, live in zip(saved_groups, optimizer.param_groups):
        group = dict(saved)
        group["params"] = live["params"]
        live_names = list(live.get("param_names", ()))
        names = list(saved.get("param_names", live_names))
        if len(names) != len(live["params"]):
            raise ValueError(
                f"param_names of a saved group has {len(names)} entries for {len(live['params'])} parameters"
            )
        names = [str(n).lower() for n in names]
        group["param_names"] = names
        group["param_names_synthesized"] = reconcile_flags(
            names,
            live_names,
            list(live.get("param_names_synthesized", ())),
            saved.get("param_names_synthesized"),
        )
        missing = [k for k in HYPERPARAMETER_KEYS if k not in group]
        if missing:
            raise ValueError(f"a saved parameter group lacks {', '.join(missing)}")
        validate_hyperparameters(*(group[k] for k in HYPERPARAMETER_KEYS))
        staged.param_groups.append(group)
        for saved_id, p, name in zip(saved["params"], live["params"], names):
            position[saved_id] = (p, name)

    unknown = [k for k in saved_state if k not in position]
    if unknown:
        raise ValueError(f"state for parameter ids {unknown} that no parameter group lists")
    carries_momentum = False
    for saved_id, (p, name) in position.items():
        entry = {}
        for key, value in (saved_state.get(saved_id) or {}).items():
            if key in DROPPED_KEYS or (isinstance(key, str) and key.startswith(DROPPED_PREFIX)):
                continue
            if key not in STATE_KEYS:
                raise ValueError(f"parameter {name!r}: unknown state key {key!r}")
            if torch.is_tensor(value):
                value = value.detach().to(device=local_tensor(p).device, copy=True)
            entry[key] = value
        entry["name"] = name
        carries_momentum |= validate_param_state(name, tuple(p.shape), entry)
        for key in COUNTER_KEYS:
            if key in entry:
                entry[key] = counter_value(key, entry[key])
        staged.state[p] = entry
    validate_codebook(codebook, required=carries_momentum)
    staged.codebook = None if codebook is None else codebook.detach().to(copy=True)
    staged.global_step = counter_value("gefen_global_step", global_step)
    return staged

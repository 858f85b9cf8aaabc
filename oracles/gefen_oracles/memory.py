"""Memory accounting on CPU: peak of live tensor storage and in-place state updates (SPEC 5.4).

:class:`StorageTracker` is a dispatch mode that sees every tensor produced by a torch operator
while it is active and counts the bytes of each *new* storage until that storage is freed (a
finalizer on the storage object, which torch keeps alive exactly as long as the storage). Views
share their base's storage and in-place results their input's, so neither is counted twice;
storages that existed before tracking started (the resident state) are never counted. So
``peak_bytes`` is the peak of memory allocated *on top of* what was resident. Storages created
without a torch operator (``torch.from_numpy``) are invisible to it.

:func:`pointer_reuse` compares the addresses of state tensors before and after an operation and
reports the bytes-weighted share that stayed in place, in the spirit of buffer-donation checks:
an optimizer step that reallocates its state instead of updating it shows a share below 1.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class StorageTracker(TorchDispatchMode):
    """Counts live bytes of storages created while active; ``peak_bytes`` is their high-water mark."""

    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.allocations = 0
        self._known: set[int] = set()
        self._resident: set[int] = set()

    def mark_resident(self, tensors) -> None:
        """Declare storages that already exist (so an op that returns them is not a new allocation)."""
        for t in tensors:
            if torch.is_tensor(t):
                self._resident.add(t.untyped_storage()._cdata)

    def _release(self, key: int, nbytes: int) -> None:
        self._known.discard(key)
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if torch.is_tensor(t)}
        for t in tree_flatten(out)[0]:
            if not torch.is_tensor(t) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self._known or key in self._resident or key in inputs:
                continue
            nbytes = storage.nbytes()
            self._known.add(key)
            self.allocations += 1
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(storage, self._release, key, nbytes)
        return out


def peak_extra_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn`` under a :class:`StorageTracker`; return its result and the peak extra bytes."""
    tracker = StorageTracker()
    with tracker:
        result = fn()
    return result, tracker.peak_bytes


@dataclass
class InPlaceReport:
    """Share of state bytes whose storage address survived an operation, and what moved."""

    share: float
    total_bytes: int
    moved: list = field(default_factory=list)


def state_addresses(state: Mapping[Any, Mapping[str, Any]]) -> dict:
    """``{(owner, key): (data_ptr, nbytes)}`` for every tensor in a per-parameter state mapping."""
    out = {}
    for owner, entry in state.items():
        for key, value in entry.items():
            if torch.is_tensor(value) and value.numel():
                out[(owner, key)] = (value.untyped_storage().data_ptr(), value.untyped_storage().nbytes())
    return out


def pointer_reuse(before: dict, after: dict) -> InPlaceReport:
    """Compare two :func:`state_addresses` snapshots (entries present in both)."""
    total = kept = 0
    moved = []
    for slot, (ptr, nbytes) in before.items():
        if slot not in after:
            continue
        total += nbytes
        if after[slot][0] == ptr:
            kept += nbytes
        else:
            moved.append(slot)
    return InPlaceReport(share=(kept / total) if total else 1.0, total_bytes=total, moved=moved)

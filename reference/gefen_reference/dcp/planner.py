"""``GefenSavePlanner``: a ``DefaultSavePlanner`` that expands one placeholder at a time."""

from __future__ import annotations

import threading

from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from .placeholder import is_placeholder


class GefenSavePlanner(DefaultSavePlanner):
    """Bounds a ``GefenDCPState`` save to one slot's dense form on the device.

    Everything that is not a Gefen placeholder goes through ``DefaultSavePlanner``
    unchanged. A placeholder is read straight from the flattened state dict --
    not through ``lookup_object``, whose checkpointable path would keep the
    expanded buffer -- and expanded under a lock into a CPU tensor the planner
    does not keep. The lock serializes expansion across the writer's threads,
    and since what it returns is already on the host, the device never holds
    more than one slot's dense form, whatever ``thread_count`` is.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.flatten_state_dict:
            raise ValueError(
                "GefenSavePlanner needs flatten_state_dict=True (the default). "
                "Unflattened, DCP would write the whole optimizer mapping as one "
                "pickled item, and a Gefen DCP placeholder (the storage-free value of a "
                "deferred dense slot) cannot be pickled; flattened, each slot becomes "
                "its own write item that this planner expands on demand."
            )
        self._expansion_lock = threading.Lock()

    def resolve_data(self, write_item):
        entry = self.state_dict.get(write_item.index.fqn)
        if is_placeholder(entry):
            with self._expansion_lock:
                return entry.fresh_host_copy()
        return super().resolve_data(write_item)

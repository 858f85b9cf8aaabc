"""``GefenFileSystemWriter``: a ``FileSystemWriter`` whose staging can snapshot Gefen slots."""

from __future__ import annotations

from torch.distributed.checkpoint.filesystem import FileSystemWriter

from .placeholder import is_placeholder


def _split_off_placeholders(tree):
    """Return ``(rest, snapshots)`` for a nested dict.

    ``rest`` is a copy of ``tree`` without any placeholder leaves; ``snapshots``
    mirrors the dicts that held placeholders, with each placeholder replaced by
    its CPU snapshot. The caller's dicts are not modified.
    """
    rest, snapshots = {}, {}
    for key, value in tree.items():
        if is_placeholder(value):
            snapshots[key] = value.snapshot()
        elif isinstance(value, dict):
            sub_rest, sub_snapshots = _split_off_placeholders(value)
            rest[key] = sub_rest
            if sub_snapshots:
                snapshots[key] = sub_snapshots
        else:
            rest[key] = value
    return rest, snapshots


def _merge_back(original, staged, snapshots):
    """Rebuild ``staged`` with the snapshots re-inserted, in ``original``'s key order."""
    merged = {}
    for key in original:
        if key not in snapshots:
            merged[key] = staged[key]
        elif isinstance(snapshots[key], dict):
            merged[key] = _merge_back(original[key], staged[key], snapshots[key])
        else:
            merged[key] = snapshots[key]
    return merged


class GefenFileSystemWriter(FileSystemWriter):
    """Required for ``dcp.async_save`` of a ``GefenDCPState``.

    ``async_save`` returns once the state dict is *staged* (copied to the CPU) and
    writes it in the background. Torch's own staging would ask each placeholder
    to copy itself, which it refuses. This writer expands each slot to a CPU
    snapshot one at a time (so the device holds one slot's dense form at a time)
    and hands everything else to ``FileSystemWriter.stage``. Because the
    snapshots are taken during the call, optimizer steps taken after
    ``async_save`` returns do not change what is written. The host holds the
    full dense snapshot until the background write finishes.
    """

    def stage(self, state_dict):
        rest, snapshots = _split_off_placeholders(state_dict)
        staged = super().stage(rest)
        if not snapshots:
            return staged
        return _merge_back(state_dict, staged, snapshots)

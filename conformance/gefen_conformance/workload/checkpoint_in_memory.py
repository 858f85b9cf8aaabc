"""A DCP checkpoint held in this process's memory: a storage writer and a storage reader over it.

For in-process checks that save and load many small checkpoints (the staging property of SPEC
3.5 saves one and loads it twice per example): DCP's planning, the implementation's
``state_dict``/``load_state_dict`` and every byte the planner serializes run exactly as with
the filesystem, but no item goes through ``torch.save``/``torch.load`` or a file. What a
filesystem checkpoint adds (files, offsets, the ``.metadata`` pickle) is the subject of the DCP
scenarios, which keep using ``FileSystemWriter``/``FileSystemReader``.

World size 1 only: the writer and the reader hold one rank's items.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future


def _done(result=None) -> Future:
    future: Future = Future()
    future.set_result(result)
    return future


class InMemoryCheckpoint:
    """One checkpoint: ``writer()`` fills it (once), ``reader()`` reads it (any number of times)."""

    def __init__(self) -> None:
        self.metadata: bytes | None = (
            None  # pickled, as the filesystem keeps it: every reader gets its own copy
        )
        self.items: dict[int, Any] = {}  # storage key -> bytes (BYTE_IO) or a CPU tensor of its own

    def writer(self) -> StorageWriter:
        if self.metadata is not None:
            raise RuntimeError("this in-memory checkpoint was already written; make a new one")
        return _Writer(self)

    def reader(self) -> StorageReader:
        if self.metadata is None:
            raise RuntimeError("this in-memory checkpoint was never written (or its save failed)")
        return _Reader(self)


class _Writer(StorageWriter):
    def __init__(self, checkpoint: InMemoryCheckpoint):
        super().__init__()
        self.checkpoint = checkpoint
        self.items: dict[int, Any] = {}

    def reset(self, checkpoint_id=None) -> None:
        self.items = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        results = []
        for item in plan.items:
            data = planner.resolve_data(item)
            key = len(self.items)
            if item.type == WriteItemType.BYTE_IO:
                self.items[key] = bytes(data.getbuffer())
                size = len(self.items[key])
            else:
                # a copy: what the optimizer does after the save must not reach the checkpoint
                self.items[key] = data.detach().to("cpu", copy=True)
                size = data.numel() * data.element_size()
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=key))
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        self.checkpoint.items = self.items
        self.checkpoint.metadata = pickle.dumps(metadata)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False

    def storage_meta(self) -> StorageMeta | None:
        return None


class _Reader(StorageReader):
    def __init__(self, checkpoint: InMemoryCheckpoint):
        super().__init__()
        self.checkpoint = checkpoint
        self.storage_data: dict = {}

    def reset(self, checkpoint_id=None) -> None:
        self.storage_data = {}

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = pickle.loads(self.checkpoint.metadata)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        for request in plan.items:
            stored = self.checkpoint.items[self.storage_data[request.storage_index]]
            if request.type == LoadItemType.BYTE_IO:
                planner.load_bytes(request, io.BytesIO(stored))
                continue
            piece = stored
            for dim, (offset, length) in enumerate(zip(request.storage_offsets, request.lengths)):
                piece = piece.narrow(dim, offset, length)
            target = planner.resolve_tensor(request).detach()
            if target.size() != piece.size():
                raise RuntimeError(
                    f"{request.storage_index}: stored piece {tuple(piece.size())} does not fit "
                    f"the target {tuple(target.size())}"
                )
            target.copy_(piece)
            planner.commit_tensor(request, target)
        return _done()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False

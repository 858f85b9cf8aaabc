"""The in-memory DCP checkpoint (conformance.checkpoint_in_memory) restores what a filesystem
checkpoint of the same save restores, keeps what was saved, and refuses misuse."""

from __future__ import annotations

import pytest
import torch

from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations.registry import resolve
from gefen_conformance.workload import models, saving
from gefen_conformance.workload.checkpoint_in_memory import InMemoryCheckpoint

from .support import DCP_MODEL, DCP_TARGET_OPTIONS, dcp_optimizer, dcp_trained, world_of_one


@pytest.fixture(scope="module")
def world():
    with world_of_one() as w:
        yield w


def _contents(optimizer) -> list:
    """Every state entry and group value, in parameter order, comparable with ``==`` after ``_same``."""
    rows = []
    for group in optimizer.param_groups:
        rows.append({k: v for k, v in group.items() if k != "params"})
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            rows.append({k: (_local(v).clone() if torch.is_tensor(v) else v) for k, v in state.items()})
    return rows


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).detach()


def _same(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _restored(reader=None, path=None) -> list:
    params = models.parameters(DCP_MODEL, mesh=world_mesh())
    target = dcp_optimizer("reference", params, **DCP_TARGET_OPTIONS)
    saving.load(resolve("reference"), target, path, reader=reader)
    return _contents(target)


def test_restores_what_the_filesystem_checkpoint_of_the_same_save_restores(world, tmp_path):
    optimizer, _ = dcp_trained("reference")
    reference = resolve("reference")
    in_memory = InMemoryCheckpoint()
    saving.save(reference, optimizer, writer=in_memory.writer())
    saving.save(reference, optimizer, tmp_path / "fs")
    from_memory, from_files = _restored(reader=in_memory.reader()), _restored(path=tmp_path / "fs")
    assert _same(from_memory, from_files)
    assert [from_memory[0]["lr"], from_memory[3]["lr"]] == [2.5e-3, 2e-3]  # the saved, not the target's


def test_what_happens_to_a_tensor_after_the_save_does_not_reach_the_checkpoint(world):
    import torch.distributed.checkpoint as dcp

    live = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    checkpoint = InMemoryCheckpoint()
    dcp.save({"x": live, "note": {"kept": [1, 2]}}, storage_writer=checkpoint.writer())
    live.mul_(-1)
    for _ in range(2):  # a reader leaves the checkpoint as it was
        target = {"x": torch.zeros(3, 4), "note": {"kept": None}}
        dcp.load(target, storage_reader=checkpoint.reader())
        assert torch.equal(target["x"], torch.arange(12, dtype=torch.float32).reshape(3, 4))
        assert target["note"] == {"kept": [1, 2]}


def test_refuses_a_read_before_the_write_and_a_second_write():
    checkpoint = InMemoryCheckpoint()
    with pytest.raises(RuntimeError, match="never written"):
        checkpoint.reader()
    checkpoint.metadata = b"written"
    with pytest.raises(RuntimeError, match="already written"):
        checkpoint.writer()


def test_dcp_without_collectives_is_refused_beyond_a_world_of_one_before_anything_is_written(
    world, monkeypatch
):
    optimizer, _ = dcp_trained("reference")
    checkpoint = InMemoryCheckpoint()
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    with pytest.raises(ValueError, match="World of one; this one has 2 ranks"):
        saving.save(resolve("reference"), optimizer, writer=checkpoint.writer(), dcp_collectives=False)
    assert checkpoint.metadata is None and not checkpoint.items

"""The checkpoint reader, schema validator and digests catch crafted bad inputs (SPEC 5.1, 5.2)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

from gefen_oracles import gefen_schema
from gefen_oracles.checkpoint_reader import CheckpointError, list_entries, read_flat, read_nested
from gefen_oracles.digests import content_digests, metadata_digest, payload_md5s, tensor_digest


@pytest.fixture
def plain_checkpoint(tmp_path):
    """A one-process DCP checkpoint of plain tensors and objects (no Gefen code involved)."""
    state = {
        "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.tensor(7, dtype=torch.int64),
        "obj": {"name": "w", "shape": [3, 4]},
    }
    path = tmp_path / "ckpt"
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return path, state


def test_reads_back_what_was_saved(plain_checkpoint):
    path, state = plain_checkpoint
    entries = list_entries(path)
    assert (
        entries["a"].kind == "tensor" and entries["a"].dtype == torch.float32 and entries["a"].shape == (3, 4)
    )
    flat = read_flat(path)
    assert torch.equal(flat["a"], state["a"]) and flat["b"].item() == 7
    assert read_nested(path)["obj"] == {"name": "w", "shape": [3, 4]}


def test_missing_metadata_is_an_uncommitted_checkpoint(plain_checkpoint):
    path, _ = plain_checkpoint
    os.remove(path / ".metadata")
    with pytest.raises(CheckpointError, match="did not commit"):
        read_flat(path)


def test_truncated_and_missing_payloads_name_the_key(plain_checkpoint):
    path, _ = plain_checkpoint
    (payload,) = list(path.glob("*.distcp"))
    data = payload.read_bytes()
    payload.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated|deserialize"):
        read_flat(path)
    payload.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        read_flat(path)


def test_digests_detect_one_flipped_byte_and_metadata_changes(plain_checkpoint, tmp_path):
    path, state = plain_checkpoint
    before_md5, before_meta, before_content = payload_md5s(path), metadata_digest(path), content_digests(path)
    again = tmp_path / "again"
    dcp.save(state, checkpoint_id=str(again), no_dist=True)
    assert payload_md5s(again) == before_md5  # deterministic payloads
    assert metadata_digest(again) == before_meta  # save ids and path are excluded
    assert content_digests(again) == before_content

    (payload,) = list(path.glob("*.distcp"))
    data = bytearray(payload.read_bytes())
    at = bytes(data).find(state["a"].numpy().tobytes())
    assert at >= 0
    data[at + 5] ^= 0x01  # inside the tensor's element bytes
    payload.write_bytes(bytes(data))
    assert payload_md5s(path) != before_md5
    assert content_digests(path)["a"] != before_content["a"]

    changed = dict(state, a=state["a"].double())
    other = tmp_path / "changed"
    dcp.save(changed, checkpoint_id=str(other), no_dist=True)
    assert metadata_digest(other) != before_meta


def test_tensor_digest_covers_dtype_shape_and_bits():
    x = torch.tensor([0.0, 1.0])
    assert tensor_digest(x) == tensor_digest(x.clone())
    assert tensor_digest(x) != tensor_digest(torch.tensor([-0.0, 1.0]))
    assert tensor_digest(x) != tensor_digest(x.double())
    assert tensor_digest(x) != tensor_digest(x.reshape(2, 1))


def _valid_state():
    f32 = torch.float32
    return {
        "format_version": torch.tensor(2),
        "global_step": torch.tensor(3),
        "deterministic": torch.tensor(0, dtype=torch.uint8),
        "slot_count": torch.tensor(1),
        "group_count": torch.tensor(1),
        "param_identities": [{"name": "w", "group": 0, "shape": [2, 3]}],
        "param_group_hypers": [{"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}],
        "slot_00000000.initialized": torch.tensor(1, dtype=torch.uint8),
        "slot_00000000.step": torch.tensor(3),
        "slot_00000000.vmean_step": torch.tensor(3),
        "slot_00000000.momentum": torch.ones(2, 3, dtype=f32),
        "slot_00000000.second_moment": torch.ones(2, 3, dtype=f32),
    }


@pytest.mark.parametrize(
    "mutate,key",
    [
        (lambda s: s.__setitem__("format_version", torch.tensor(3)), "format_version"),
        (lambda s: s.__setitem__("deterministic", torch.tensor(False)), "deterministic"),
        (
            lambda s: s.__setitem__("slot_00000000.momentum", torch.ones(2, 3, dtype=torch.float16)),
            "slot_00000000.momentum",
        ),
        (
            lambda s: s.__setitem__("slot_00000000.second_moment", -torch.ones(2, 3)),
            "slot_00000000.second_moment",
        ),
        (lambda s: s.__setitem__("slot_00000000.step", torch.tensor(0)), "slot_00000000.step"),
        (lambda s: s.pop("slot_00000000.vmean_step"), "slot_00000000.vmean_step"),
        (lambda s: s.__setitem__("extra", torch.tensor(1)), "extra"),
        (lambda s: s["param_group_hypers"][0].__setitem__("lr", 1), "param_group_hypers.0.lr"),
        (lambda s: s.__setitem__("slot_count", torch.tensor(2)), "slot_count"),
    ],
)
def test_schema_violations_name_the_key(mutate, key):
    state = _valid_state()
    assert gefen_schema.problems(state) == []
    mutate(state)
    found = gefen_schema.problems(state)
    assert any(p.startswith(key) for p in found), found


def test_a_missing_shard_is_reported_as_uncovered_elements(plain_checkpoint):
    """A tensor whose metadata claims more rows than its chunks hold has a missing shard."""
    import dataclasses
    import pickle

    path, _ = plain_checkpoint
    meta_file = path / ".metadata"
    meta = pickle.loads(meta_file.read_bytes())
    meta.state_dict_metadata["a"] = dataclasses.replace(
        meta.state_dict_metadata["a"], size=torch.Size([6, 4])
    )
    meta_file.write_bytes(pickle.dumps(meta))
    with pytest.raises(CheckpointError, match="a: chunks leave 12 elements uncovered"):
        read_flat(path)

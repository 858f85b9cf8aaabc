"""An independent reader for DCP checkpoint directories (SPEC 5.1).

It works from the files alone: ``.metadata`` is unpickled directly and every payload item is
read from its byte range in its ``.distcp`` file with ``torch.load(weights_only=True)``. It
never calls an implementation's loader, nor DCP's load planner, so a checkpoint that only
loads through the code that wrote it is caught here.

Every failure is a :class:`CheckpointError` naming the key or file concerned.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

METADATA_FILE = ".metadata"


class CheckpointError(ValueError):
    """The directory is not a readable, complete DCP checkpoint."""


@dataclass(frozen=True)
class Chunk:
    offsets: tuple
    sizes: tuple
    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class Entry:
    """One key of a checkpoint: ``kind`` is "tensor" (sharded or whole) or "bytes" (a pickled object)."""

    key: str
    kind: str
    dtype: torch.dtype | None
    shape: tuple | None
    chunks: tuple


def read_metadata(path: os.PathLike) -> Any:
    """The unpickled ``.metadata`` object. A missing file means the save never committed."""
    meta = Path(path) / METADATA_FILE
    if not meta.is_file():
        raise CheckpointError(
            f"{path}: no {METADATA_FILE}; the save did not commit (torn or aborted checkpoint)"
        )
    try:
        with open(meta, "rb") as handle:
            return pickle.load(handle)
    except Exception as error:  # any unpickling failure is a corrupt commit marker
        raise CheckpointError(f"{meta}: unreadable metadata ({type(error).__name__}: {error})") from error


def _location(storage: dict, key: str, offsets) -> tuple[str, int, int]:
    for index, info in storage.items():
        if index.fqn == key and tuple(index.offset or ()) == tuple(offsets or ()):
            return info.relative_path, info.offset, info.length
    raise CheckpointError(f"{key}: no storage location for chunk at offsets {tuple(offsets or ())}")


def list_entries(path: os.PathLike) -> dict[str, Entry]:
    """Every key with its kind, dtype, global shape and chunks (file, byte range)."""
    metadata = read_metadata(path)
    storage = metadata.storage_data or {}
    entries = {}
    for key, item in metadata.state_dict_metadata.items():
        if hasattr(item, "chunks"):
            chunks = tuple(
                Chunk(tuple(c.offsets), tuple(c.sizes), *_location(storage, key, c.offsets))
                for c in item.chunks
            )
            entries[key] = Entry(key, "tensor", item.properties.dtype, tuple(item.size), chunks)
        else:
            entries[key] = Entry(key, "bytes", None, None, (Chunk((), (), *_location(storage, key, None)),))
    return entries


def _blob(path: Path, chunk: Chunk, key: str) -> bytes:
    file = path / chunk.file
    if not file.is_file():
        raise CheckpointError(f"{key}: payload file {chunk.file} is missing")
    with open(file, "rb") as handle:
        handle.seek(chunk.offset)
        data = handle.read(chunk.length)
    if len(data) != chunk.length:
        raise CheckpointError(
            f"{key}: payload file {chunk.file} is truncated ({len(data)} of {chunk.length} bytes)"
        )
    return data


def _load(data: bytes, key: str) -> Any:
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"{key}: payload bytes do not deserialize ({type(error).__name__}: {error})"
        ) from error


def read_value(path: os.PathLike, entry: Entry) -> Any:
    """Assemble one key: a tensor at its global shape from every chunk, or the pickled object.

    The chunks must tile the global shape exactly (no gap, no overlap) and each piece must
    have its chunk's dtype and sizes.
    """
    path = Path(path)
    if entry.kind == "bytes":
        return _load(_blob(path, entry.chunks[0], entry.key), entry.key)
    whole = torch.empty(entry.shape, dtype=entry.dtype)
    covered = torch.zeros(entry.shape, dtype=torch.int32)
    for chunk in entry.chunks:
        piece = _load(_blob(path, chunk, entry.key), entry.key)
        if not torch.is_tensor(piece) or piece.dtype != entry.dtype or tuple(piece.shape) != chunk.sizes:
            got = f"{piece.dtype} {tuple(piece.shape)}" if torch.is_tensor(piece) else type(piece).__name__
            raise CheckpointError(
                f"{entry.key}: chunk at {chunk.offsets} holds {got}, metadata says {entry.dtype} "
                f"{chunk.sizes}"
            )
        region = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))
        whole[region] = piece
        covered[region] += 1
    if entry.shape and not bool((covered == 1).all()):
        gaps, overlaps = int((covered == 0).sum()), int((covered > 1).sum())
        raise CheckpointError(
            f"{entry.key}: chunks leave {gaps} elements uncovered and cover {overlaps} twice"
        )
    return whole


def read_flat(path: os.PathLike) -> dict[str, Any]:
    """``{key: value}`` for every key of the checkpoint (flattened DCP keys)."""
    return {key: read_value(path, entry) for key, entry in list_entries(path).items()}


def read_nested(path: os.PathLike) -> dict:
    """The checkpoint in the caller's nesting: DCP's flattening undone, integer-keyed levels as lists."""
    metadata = read_metadata(path)
    flat = read_flat(path)
    routes = metadata.planner_data or {key: (key,) for key in flat}
    root: dict = {}
    for key, value in flat.items():
        node = root
        route = routes.get(key, (key,))
        for step in route[:-1]:
            node = node.setdefault(step, {})
        node[route[-1]] = value
    return _as_lists(root)


def _as_lists(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    node = {k: _as_lists(v) for k, v in node.items()}
    if node and all(isinstance(k, int) for k in node) and sorted(node) == list(range(len(node))):
        return [node[i] for i in range(len(node))]
    return node

"""Digests that identify checkpoint content across saves and torch versions (SPEC 5.2).

* :func:`payload_md5s`: md5 of each ``.distcp`` file. Byte identity is only meaningful for
  one torch version, because ``torch.save`` framing has changed across releases.
* :func:`metadata_digest`: sha256 of a canonical form of the parsed ``.metadata``: every key's
  kind, dtype, size and chunks, the storage locations and the planner routes, sorted, with the
  per-save random ids and the path left out (they change on every save).
* :func:`tensor_digest` / :func:`content_digests`: sha256 of dtype, shape and the little-endian
  element bytes of each value, which stays valid across torch versions.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from .checkpoint_reader import list_entries, read_metadata, read_value


def _file_digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_md5(path: os.PathLike) -> str:
    return _file_digest(Path(path), "md5")


def file_sha256(path: os.PathLike) -> str:
    return _file_digest(Path(path), "sha256")


def payload_md5s(path: os.PathLike) -> dict[str, str]:
    """``{file name: md5}`` for every ``.distcp`` payload in the directory."""
    return {p.name: file_md5(p) for p in sorted(Path(path).glob("*.distcp"))}


def canonical_metadata(path: os.PathLike) -> dict:
    """The parsed metadata as plain JSON-able data, without save ids and path."""
    meta = read_metadata(path)
    items = {}
    for key, item in sorted(meta.state_dict_metadata.items()):
        if hasattr(item, "chunks"):
            p = item.properties
            items[key] = {
                "kind": "tensor",
                "dtype": str(p.dtype),
                "size": list(item.size),
                "layout": str(p.layout),
                "requires_grad": bool(p.requires_grad),
                "memory_format": str(p.memory_format),
                "pin_memory": bool(p.pin_memory),
                "chunks": sorted([list(c.offsets), list(c.sizes)] for c in item.chunks),
            }
        else:
            items[key] = {"kind": "bytes"}
    storage = sorted(
        [index.fqn, list(index.offset or []), info.relative_path, info.offset, info.length]
        for index, info in (meta.storage_data or {}).items()
    )
    routes = {k: [str(s) for s in v] for k, v in sorted((meta.planner_data or {}).items())}
    return {"items": items, "storage": storage, "planner_data": routes}


def metadata_digest(path: os.PathLike) -> str:
    canonical = json.dumps(canonical_metadata(path), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 over ``dtype|shape|`` and the element bytes in little-endian, row-major order."""
    t = t.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    data = raw.numpy().tobytes()
    if sys.byteorder == "big" and t.element_size() > 1:
        import numpy as np

        data = np.frombuffer(data, dtype=f">u{t.element_size()}").astype(f"<u{t.element_size()}").tobytes()
    h = hashlib.sha256(f"{str(t.dtype)}|{list(t.shape)}|".encode())
    h.update(data)
    return h.hexdigest()


def value_digest(value: Any) -> str:
    if torch.is_tensor(value):
        return tensor_digest(value)
    return hashlib.sha256(("object|" + json.dumps(value, sort_keys=True, default=repr)).encode()).hexdigest()


def content_digests(path: os.PathLike) -> dict[str, str]:
    """``{key: digest}`` of every assembled value of the checkpoint."""
    return {key: value_digest(read_value(path, entry)) for key, entry in sorted(list_entries(path).items())}

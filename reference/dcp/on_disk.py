"""Reading a written checkpoint back without the adapter, and checking it against the v2 schema.

This works from the files alone (``.metadata`` and the ``.distcp`` payloads), so
it applies equally to checkpoints written by the reference and by any other
implementation. Dense slots are reassembled at their global shape from every
rank's chunk.
"""

from __future__ import annotations

import io
import math
import os

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

from . import schema


def read_metadata(path):
    return FileSystemReader(path).read_metadata()


def _blob(path, info) -> bytes:
    with open(os.path.join(path, info.relative_path), "rb") as handle:
        handle.seek(info.offset)
        return handle.read(info.length)


def read_flat(path) -> dict:
    """``{fqn: value}`` for every item in the checkpoint at ``path``."""
    metadata = read_metadata(path)
    storage = metadata.storage_data
    flat = {}
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, BytesStorageMetadata):
            blob = _blob(path, storage[MetadataIndex(fqn)])
            flat[fqn] = torch.load(io.BytesIO(blob), weights_only=True)
            continue
        whole = torch.empty(item.size, dtype=item.properties.dtype)
        for chunk in item.chunks:
            blob = _blob(path, storage[MetadataIndex(fqn, chunk.offsets)])
            piece = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
            region = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))
            whole[region] = piece.reshape(chunk.sizes)
        flat[fqn] = whole
    return flat


def read_nested(path) -> dict:
    """The checkpoint rebuilt into the caller's nesting (lists restored)."""
    metadata = read_metadata(path)
    flat = read_flat(path)
    mapping = metadata.planner_data or {fqn: (fqn,) for fqn in flat}
    root = {}
    for fqn, value in flat.items():
        route = mapping[fqn]
        node = root
        for step in route[:-1]:
            node = node.setdefault(step, {})
        node[route[-1]] = value
    return _lists_from_int_keys(root)


def _lists_from_int_keys(node):
    if not isinstance(node, dict):
        return node
    rebuilt = {key: _lists_from_int_keys(value) for key, value in node.items()}
    if rebuilt and all(isinstance(key, int) for key in rebuilt):
        return [rebuilt[i] for i in range(len(rebuilt))]
    return rebuilt


def _scalar(problems, state, key, dtype):
    value = state.get(key)
    if not torch.is_tensor(value) or value.dtype != dtype or value.dim() != 0:
        problems.append("%s must be a 0-dim %s tensor, got %r" % (key, dtype, value))
        return None
    return value.item()


def schema_problems(state) -> list:
    """Every way ``state`` (one adapter's nested dict) departs from the v2 schema."""
    problems = []
    version = _scalar(problems, state, "format_version", torch.int64)
    if version is not None and version != schema.FORMAT_VERSION:
        problems.append("format_version is %r, expected %d" % (version, schema.FORMAT_VERSION))
    global_step = _scalar(problems, state, "global_step", torch.int64)
    if global_step is not None and global_step < 0:
        problems.append("global_step is negative")
    flag = _scalar(problems, state, "deterministic", torch.uint8)
    if flag is not None and flag not in (0, 1):
        problems.append("deterministic must be 0 or 1")
    slot_count = _scalar(problems, state, "slot_count", torch.int64)
    group_count = _scalar(problems, state, "group_count", torch.int64)
    identities = state.get("param_identities")
    hypers = state.get("param_group_hypers")
    if not isinstance(identities, list) or not isinstance(hypers, list):
        problems.append("param_identities and param_group_hypers must be lists")
        return problems
    if slot_count is not None and len(identities) != slot_count:
        problems.append("slot_count %r but %d identities" % (slot_count, len(identities)))
    if group_count is not None and len(hypers) != group_count:
        problems.append("group_count %r but %d hyperparameter entries" % (group_count, len(hypers)))
    for g, entry in enumerate(hypers):
        if not isinstance(entry, dict) or set(entry) != set(schema.HYPER_KEYS):
            problems.append("group %d hyperparameters must have exactly the keys %s" % (g, schema.HYPER_KEYS))
            continue
        for key, value in entry.items():
            if type(value) is not float or not math.isfinite(value):
                problems.append("group %d %s must be a finite Python float, got %r" % (g, key, value))
    names = set()
    for i, ident in enumerate(identities):
        if not isinstance(ident, dict) or set(ident) != {"name", "group", "shape"}:
            problems.append("identity %d must have keys name, group, shape" % i)
            continue
        if type(ident["name"]) is not str or ident["name"] in names:
            problems.append("identity %d name must be a unique str" % i)
        names.add(ident["name"])
        if type(ident["group"]) is not int or not 0 <= ident["group"] < len(hypers):
            problems.append("identity %d group must be an int group index" % i)
        shape = ident["shape"]
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            problems.append("identity %d shape must be a list of ints" % i)
            continue
        problems.extend(_slot_problems(state, i, shape))
    expected = set(schema.HEADER_KEYS) | {
        schema.slot_key(i, field) for i in range(len(identities)) for field in schema.SLOT_FIELDS
    }
    if set(state) != expected:
        problems.append(
            "unexpected keys %s / missing keys %s"
            % (sorted(set(state) - expected), sorted(expected - set(state)))
        )
    return problems


def _slot_problems(state, i, shape) -> list:
    problems = []
    initialized = _scalar(problems, state, schema.slot_key(i, "initialized"), torch.uint8)
    step = _scalar(problems, state, schema.slot_key(i, "step"), torch.int64)
    vmean_step = _scalar(problems, state, schema.slot_key(i, "vmean_step"), torch.int64)
    dense = {}
    for field in ("momentum", "second_moment"):
        key = schema.slot_key(i, field)
        value = state.get(key)
        if not torch.is_tensor(value) or value.dtype != torch.float32 or list(value.shape) != shape:
            problems.append("%s must be float32 of global shape %s" % (key, shape))
            continue
        if not bool(torch.isfinite(value).all()):
            problems.append("%s is not finite" % key)
        dense[field] = value
    if None in (initialized, step, vmean_step) or len(dense) != 2:
        return problems
    if initialized not in (0, 1):
        problems.append("slot %d initialized flag must be 0 or 1" % i)
    if initialized == 1 and (step < 1 or vmean_step < 1):
        problems.append("slot %d is initialized with step %d, vmean_step %d" % (i, step, vmean_step))
    if initialized == 0 and (step or vmean_step or dense["momentum"].any() or dense["second_moment"].any()):
        problems.append("slot %d is fresh but carries counters or dense history" % i)
    if bool((dense["second_moment"] < 0).any()):
        problems.append("slot %d second moment is negative somewhere" % i)
    return problems

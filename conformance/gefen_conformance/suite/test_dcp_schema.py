"""Schema (SPEC 4.3.5): what the implementation wrote, read back through the independent reader
of SPEC 5.1 (never the implementation's loader), validated key by key against Part 2 and against
what was trained: identities, hyperparameters, counters, dense slots at their global shapes, and
the model saved alongside; and the items DCP wrote for them (SPEC 2.2.4): each 0-dim scalar one
``TENSOR`` item written once, each leaf of the two lists a pickled ``BYTE_IO`` item, each dense
slot chunked as the model's ``Shard(0)`` parameter it belongs to, in ``__<rank>_<n>.distcp`` files.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite import restore_checks
from gefen_conformance.workload import models
from gefen_oracles import gefen_schema
from gefen_oracles.checkpoint_reader import list_entries, read_nested
from gefen_oracles.numeric import Comparisons

CHECKPOINTS = [
    pytest.param("base", 1, id="w1"),
    pytest.param("base", 2, id="w2"),
    pytest.param("base", 3, id="w3"),
    pytest.param("base", 4, id="w4"),
    pytest.param("empty", 4, id="w4-empty-shards", marks=pytest.mark.gefen_clause("2.4.5")),
]


def _expected_values(model: str, state: dict) -> list[str]:
    problems = []
    layout = models.DCP_MODELS[model]
    group_of = {n: g for g, names in enumerate(layout.groups) for n in names}
    identities = [{"name": n, "group": group_of[n], "shape": list(s)} for n, s in layout.shapes.items()]
    if state.get("param_identities") != identities:
        problems.append(f"param_identities: {state.get('param_identities')!r}, trained {identities!r}")
    if state.get("param_group_hypers") != models.SAVED_HYPERS:
        problems.append(
            f"param_group_hypers: {state.get('param_group_hypers')!r}, trained {models.SAVED_HYPERS!r}"
        )
    expected = {
        "format_version": 2,
        "global_step": models.DCP_STEPS,
        "deterministic": 0,
        "slot_count": len(layout.shapes),
        "group_count": 2,
    }
    for key, value in expected.items():
        got = state.get(key)
        if not torch.is_tensor(got) or got.item() != value:
            problems.append(f"{key}: {got!r}, expected {value}")
    for i, name in enumerate(layout.shapes):
        fresh = name in layout.frozen
        for field, value in zip(
            restore_checks.SLOT_SCALARS, (0, 0, 0) if fresh else (1, models.DCP_STEPS, models.DCP_STEPS)
        ):
            got = state.get(gefen_schema.slot_key(i, field))
            if not torch.is_tensor(got) or got.item() != value:
                problems.append(f"{gefen_schema.slot_key(i, field)} ({name}): {got!r}, expected {value}")
        momentum = state.get(gefen_schema.slot_key(i, "momentum"))
        if torch.is_tensor(momentum) and bool(momentum.any()) == fresh:
            problems.append(
                f"{gefen_schema.slot_key(i, 'momentum')} ({name}): "
                f"{'non-zero for a fresh slot' if fresh else 'all zero for a trained slot'}"
            )
    return problems


#: A payload file's name, ``__<rank>_<n>.distcp`` (SPEC 2.2.4); the rank is the writer's.
PAYLOAD_FILE = re.compile(r"__(\d+)_(\d+)\.distcp")


def _writer(file: str) -> str:
    """The rank a payload file's name gives (the name itself when it is not one)."""
    match = PAYLOAD_FILE.fullmatch(file)
    return match.group(1) if match else file


def _chunks(entry) -> set:
    """An entry's non-empty chunks as (offsets, sizes, the rank that wrote it); an empty shard's
    chunk holds nothing, and DCP keeps one of those written at the same offset."""
    return {(c.offsets, c.sizes, _writer(c.file)) for c in entry.chunks if all(c.sizes)}


def _item_problems(path, model: str, world: int) -> list[str]:
    """SPEC 2.2.4, from ``.metadata`` and the directory: what DCP made of the optimizer's dict under
    the caller key ``optimizer``."""
    problems = []
    entries = list_entries(path)
    names = list(models.DCP_MODELS[model].shapes)
    scalars = [f"optimizer.{k}" for k in restore_checks.HEADER_SCALARS] + [
        f"optimizer.{gefen_schema.slot_key(i, f)}"
        for i in range(len(names))
        for f in restore_checks.SLOT_SCALARS
    ]
    leaves = [
        f"optimizer.param_identities.{i}.{field}"
        for i in range(len(names))
        for field in ("name", "group", "shape")
    ] + [
        f"optimizer.param_group_hypers.{g}.{key}"
        for g in range(len(models.SAVED_HYPERS))
        for key in gefen_schema.HYPER_KEYS
    ]
    dense = {
        f"optimizer.{gefen_schema.slot_key(i, f)}": name
        for i, name in enumerate(names)
        for f in ("momentum", "second_moment")
    }
    for key in scalars:
        entry = entries.get(key)
        if entry is None:
            problems.append(f"{key}: no item")
        elif entry.kind != "tensor" or entry.shape != ():
            what = "a pickled BYTE_IO item" if entry.kind == "bytes" else f"a tensor of shape {entry.shape}"
            problems.append(f"{key}: {what}; a 0-dim tensor is a TENSOR item")
        elif len(entry.chunks) != 1:
            problems.append(f"{key}: {len(entry.chunks)} copies recorded; a replicated item is written once")
    for key in leaves:
        entry = entries.get(key)
        if entry is None or entry.kind != "bytes":
            problems.append(
                f"{key}: {'no item' if entry is None else 'a tensor item'}; a list's leaf is a BYTE_IO item"
            )
    for key, name in dense.items():
        entry, parameter = entries.get(key), entries.get(f"model.{name}")
        if entry is None or entry.kind != "tensor":
            problems.append(f"{key}: {'no item' if entry is None else 'a pickled BYTE_IO item'}")
        elif parameter is not None and _chunks(entry) != _chunks(parameter):
            written, sharded = _chunks(entry), _chunks(parameter)
            problems.append(
                f"{key}: {len(written)} chunks, the Shard(0) parameter {name} {len(sharded)} (one per "
                f"rank); (offsets, sizes, rank) {sorted(written - sharded)[:2]} are not the "
                "parameter's"
            )
    known = set(scalars) | set(leaves) | set(dense)
    problems += [
        f"{key}: unexpected item"
        for key in sorted(entries)
        if key.startswith("optimizer.") and key not in known
    ]
    for file in sorted(os.listdir(path)):
        match = PAYLOAD_FILE.fullmatch(file)
        if file != ".metadata" and (match is None or int(match.group(1)) >= world):
            problems.append(
                f"{file}: not a payload file __<rank>_<n>.distcp of {world} rank(s), nor .metadata"
            )
    return problems


@pytest.mark.gefen_clause("4.3.5", "2.1", "2.2.1", "2.2.4", "5.1.1", "5.1.3")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("model,world", CHECKPOINTS)
def test_checkpoint_schema_from_the_files(gefen_impl, gefen_checkpoints, gefen_judge, model, world):
    saved = gefen_checkpoints.trained_and_saved(gefen_impl, model, ranks=world)
    nested = read_nested(saved.path)  # CheckpointError when unreadable, incomplete or badly tiled
    optimizer = nested.get("optimizer", {})
    checked = Comparisons()
    for problem in gefen_schema.problems(optimizer) + _expected_values(model, optimizer):
        checked.problem(problem)
    for problem in _item_problems(saved.path, model, world):
        checked.problem(f"SPEC 2.2.4: {problem}")
    extra = sorted(set(nested) - {"model", "optimizer"})
    if extra:
        checked.problem(f"unexpected top-level keys {extra}")
    # the saved model parameters are the implementation's own bytes: exact in every profile (SPEC 5.6.11)
    differs = [
        f"model.{name}: differs from the trained parameter"
        for name, value in saved.params.items()
        if not _same(nested.get("model", {}).get(name), value)
    ]
    checked.exact("saved model parameters against the trained ones", len(differs), len(saved.params), differs)
    gefen_judge.assert_comparisons(checked)


def _same(on_disk, value) -> bool:
    return torch.is_tensor(on_disk) and on_disk.dtype == value.dtype and torch.equal(on_disk, value)

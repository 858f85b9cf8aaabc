"""Schema (SPEC 4.3.5): what the implementation wrote, read back through the independent reader
of SPEC 5.1 (never the implementation's loader), validated key by key against Part 2 and against
what was trained: identities, hyperparameters, counters, dense slots at their global shapes, and
the model saved alongside.
"""

from __future__ import annotations

import pytest
import torch

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite import restore_checks
from gefen_conformance.workload import models
from gefen_oracles import gefen_schema
from gefen_oracles.checkpoint_reader import read_nested
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

"""The pinned steps the suite certifies (SPEC 5.6.1), as a table: ``test_optimizer.py`` runs them
(``test_pinned_block_step``, ``test_pinned_factored_step``), and ``gefen-conformance vectors
export`` writes the same cases as test vectors (SPEC 4.5.8).

Each :class:`PinnedStep` names its test and parameter id, and holds the inputs of its case: the
dtype, after how many steps of the pinned workload the reference's state is taken (0: the codebook
just learned) and the case's options. :data:`CLAUSES` are the clauses each test's
``gefen_clause`` mark names.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gefen_conformance.suite import optimizer_cases, reference_side

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: ``(id, steps)``: the reference's state after ``steps`` steps of the pinned workload.
PIN_POINTS = (("pinned-codebook", 0), ("pinned-after-3", 3))
#: The block path's variants: ``(id, options)``.
BLOCK_VARIANTS = (
    ("plain", (("tensor_lr", False), ("weight_decay", 0.0))),
    ("wd-tensor-lr", (("tensor_lr", True), ("weight_decay", 0.05))),
)
#: The clauses of each pinned test's ``gefen_clause`` mark (a vector carries its test's).
CLAUSES = {
    "test_pinned_block_step": ("1.8", "1.7", "1.4", "1.10.7", "1.12.8", "5.6", "1.8.6", "1.8.7#3"),
    "test_pinned_factored_step": ("1.9", "1.7", "5.6"),
}


def pinned(dtype: torch.dtype, pin_at: int, **options) -> optimizer_cases.PinnedCase:
    """One pinned step from the reference's state after ``pin_at`` steps (SPEC 5.6): bitwise
    against the reference's same step, or against exact arithmetic; the exact rules (counters,
    periods, names, hyperparameters, the frozen codebook) in both profiles."""
    state = reference_side.pinned_state(dtype, pin_at, **options)
    return optimizer_cases.pinned(dtype, pin_at, state, **options)


@dataclass(frozen=True)
class PinnedStep:
    """One pinned step the suite certifies: its test, its parameter id and its case's inputs."""

    test: str
    id: str
    dtype: torch.dtype
    pin_at: int
    options: tuple

    @property
    def test_id(self) -> str:
        return f"test_optimizer.py::{self.test}[{self.id}]"

    def case(self) -> optimizer_cases.PinnedCase:
        return pinned(self.dtype, self.pin_at, **dict(self.options))


#: Every pinned step, in collection order.
PINNED_STEPS = (
    *(
        PinnedStep(
            "test_pinned_block_step",
            f"{variant}-{dtype}-{pin}",
            dtype,
            pin_at,
            (*options, ("factored_v_2d", False)),
        )
        for variant, options in BLOCK_VARIANTS
        for dtype in DTYPES
        for pin, pin_at in PIN_POINTS
    ),
    *(
        PinnedStep(
            "test_pinned_factored_step",
            str(dtype),
            dtype,
            3,
            (("weight_decay", 0.05), ("factored_v_2d", True)),
        )
        for dtype in DTYPES
    ),
)


def of_test(test: str) -> list:
    """The pinned steps of ``test``, as its parametrization (ids: the steps' ids)."""
    return [pytest.param(step, id=step.id) for step in PINNED_STEPS if step.test == test]

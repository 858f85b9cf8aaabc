"""The reference's side of the optimizer comparisons, computed once per process (SPEC 5.6).

Not collected. Several tests of ``test_optimizer.py`` compare the implementation with the same
reference computation: the free-running trajectory of one dtype and set of hyperparameters, and
the pinned states after 1 and 3 of its steps (SPEC 5.6.1). The reference is deterministic, so each
is computed once here and shared:

* :func:`trajectory`: :func:`gefen_conformance.workload.runs.trajectory` of
  :data:`~gefen_conformance.workload.models.REFERENCE`, cached by everything that determines it
  (dtype, steps, hyperparameters, constructor options), with the native state dict kept after
  every step;
* :func:`pinned_state`: :func:`gefen_conformance.workload.runs.pinned_state`, taken from that
  trajectory's state after ``max(pin_at, 1)`` steps (the first steps of a trajectory do not depend
  on the later ones), a fresh deep copy for every caller.

What is cached is the reference's own: it runs on CPU over its own parameters, and nothing of it
is handed to an implementation (a pinned state is deep-copied for each caller, and the
implementation loads a deep copy of that). A cached :class:`Trained` is read-only to its callers.
"""

from __future__ import annotations

import functools

import torch

from gefen_conformance.workload import models, runs

#: Steps of the free-running comparisons (``test_optimizer.STEPS``)
STEPS = 6


@functools.cache
def _trajectory(dtype: torch.dtype, steps: int, options: tuple) -> runs.Trained:
    return runs.trajectory(models.REFERENCE, dtype, steps, states_after=range(1, steps + 1), **dict(options))


def trajectory(dtype: torch.dtype, steps: int = STEPS, **options) -> runs.Trained:
    """The reference's free-running trajectory (read-only: shared by every caller)."""
    options = dict(
        {"tensor_lr": False, "weight_decay": 0.0}, **options
    )  # the defaults of workload.runs.trajectory
    return _trajectory(dtype, steps, tuple(sorted(options.items())))


def pinned_state(dtype: torch.dtype, pin_at: int, **options) -> dict:
    """:func:`gefen_conformance.workload.runs.pinned_state` (a fresh deep copy), from the cached
    trajectory of the same dtype and options."""
    ran = trajectory(dtype, max(STEPS, pin_at, 1), **options)
    return runs.pinned_from(ran.states[max(pin_at, 1)], pin_at)

"""Mutants of per-parameter rules that kernels get wrong at their edges, in the catalogue of
tests/mutants.py.

``ENTRIES`` maps a mutant's name to its :class:`tests.mutants.Entry`; tests/mutants.py adds them to
``CATALOGUE`` (and their ``--impl`` spec strings); ``SLOW`` names those whose selections are slow.

Each is a kernel backend built on the reference (as examples/gefen-fast is) with one bug that
real fused, multi-tensor or Adafactor-style kernels have shipped: a trainer's heuristic baked into
the kernel (no decay on 1-D tensors), one step counter per tensor list, a later group's missing
keys taken from the first group, 0-element tensors kept in the lists, every tensor of two or more
dimensions factored, the fallback period taken from the leading dimension, the inactive second
moment freed after a mode switch. Each steps an ordinary small model bit for bit like the
reference; they differ only where the rule's edge is reached.
"""

from __future__ import annotations

import dataclasses

from gefen_reference.native_state import is_dtensor
from gefen_reference.steps import (
    factored_step,
    new_block_second_moment,
    new_factored_second_moment,
    new_momentum_state,
)

from .mutants import _Backend, _backend_entries
from .mutants_space import _INPUTS, _LIFECYCLE

_PROTOCOL = "test_calling_protocol"
_MIGRATION = "mode_migration"


class _DecaySkipsOneDimensional(_Backend):
    """Weight decay applied only to tensors of two or more dimensions, the trainers' "no decay
    on biases and norms" rule moved into the kernel (SPEC 1.8.6 decays every parameter of the
    group)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if p.ndim <= 1 and hyper.weight_decay > 0.0:
            hyper = dataclasses.replace(hyper, weight_decay=0.0)
        super().update_parameter(p, grad, state, hyper, factored)


class _GroupMaxStep(_Backend):
    """One step counter per group's tensor list: the launch takes the largest counter of the
    group's parameters, so a parameter that joined late or skipped steps is bias-corrected with,
    and stores, the group's count (SPEC 1.8.4, 1.8.5: counters are per parameter)."""

    def step(self, closure=None):
        self._group_of = {id(p): i for i, g in enumerate(self.param_groups) for p in g["params"]}
        return super().step(closure)

    def update_parameters(self, updates):
        lists: dict = {}
        for u in updates:
            lists.setdefault(self._group_of[id(u.param)], []).append(u)
        for members in lists.values():
            top = max(u.state["step"] for u in members)
            for u in members:
                lag = top - u.state["step"]
                if lag > 0:
                    u.state["step"] += lag
                    moment = "factored_step" if u.factored else "vmean_step"
                    if moment in u.state:
                        u.state[moment] += lag
        super().update_parameters(updates)


class _LaterGroupFirstDefaults(_Backend):
    """A group added after the first takes each hyperparameter it lacks from ``param_groups[0]``
    (``setdefault(key, self.param_groups[0][key])``) instead of the constructor's defaults
    (SPEC 1.2.3)."""

    def add_param_group(self, param_group):
        if isinstance(param_group, dict) and self.param_groups:
            first = self.param_groups[0]
            param_group = dict(param_group)
            for key in ("lr", "eps", "weight_decay"):
                param_group.setdefault(key, first[key])
            if "betas" not in param_group:
                param_group.setdefault("beta1", first["beta1"])
                param_group.setdefault("beta2", first["beta2"])
        super().add_param_group(param_group)


class _EmptyTensorsKeepState(_Backend):
    """0-element parameters left in the foreach lists: one with a gradient gets a period-1 state
    whose counters advance, where SPEC 1.5.2 and 1.10.1 skip it and create nothing."""

    def step(self, closure=None):
        before = self.global_step
        loss = super().step(closure)
        if self.global_step != before:
            for _, _, p in self.named_params():
                if p.grad is None or p.numel() != 0:
                    continue
                state = self.state[p]
                if "step" not in state:
                    state["automatic_period"] = 1
                    new_momentum_state(state, 0, 1, p.grad.device)
                    new_block_second_moment(state)
                state["step"] += 1
                state["vmean_step"] += 1
        return loss


class _FactoredBeyondTwoDimensions(_Backend):
    """Every plain tensor of two or more dimensions on the factored path, a conv weight
    ``(O, I, kh, kw)`` factored as ``(O, I*kh*kw)``, as Adafactor kernels do (SPEC 1.9.1: only
    two-dimensional parameters)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if not (self.factored_v_2d and p.ndim >= 3 and not is_dtensor(p)):
            return super().update_parameter(p, grad, state, hyper, factored)
        if state.get("vmean_step") == 0:  # the block moment the shared preparation just made
            state.pop("vmean")
            state.pop("vmean_step")
        matrix = (p.shape[0], p.numel() // p.shape[0])
        if "v_row" not in state:
            new_factored_second_moment(state, matrix, grad.device)
        work = p if p.is_contiguous() else p.contiguous()
        factored_step(work.view(matrix), grad.reshape(matrix), state, self.codebook, hyper)
        if work is not p:
            p.copy_(work)


class _FallbackFromLeadingDimension(_Backend):
    """The memory-safe fallback period's first candidate from the leading dimension, the
    (out, in) confusion (SPEC 1.5.6 item 2): the reference's rule handed the shape reversed, which
    only the fallback reads past its length."""

    def choose_period(self, name, global_shape, local_grad):
        return super().choose_period(name, tuple(reversed(tuple(global_shape))), local_grad)


class _InactiveMomentFreed(_Backend):
    """The inactive second moment freed once a state steps on the other path after a mode
    switch, to save memory (SPEC 1.10.8 keeps it untouched for a switch back)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        for key in ("vmean", "vmean_step") if factored else ("v_row", "v_col", "factored_step"):
            state.pop(key, None)
        super().update_parameter(p, grad, state, hyper, factored)


_EDGE_MUTANTS = {
    "decay-skips-one-dimensional": (
        _DecaySkipsOneDimensional,
        "4.3.13",
        _PROTOCOL,
        "weight decay skipped on 1-D parameters (biases, norms)",
    ),
    "group-max-step": (
        _GroupMaxStep,
        "4.3.13",
        _PROTOCOL,
        "one step counter per group: the largest of its parameters' counters",
    ),
    "later-group-first-defaults": (
        _LaterGroupFirstDefaults,
        "4.3.13",
        _PROTOCOL,
        "a later group's missing hyperparameters taken from the first group, not the defaults",
    ),
    "empty-tensors-keep-state": (
        _EmptyTensorsKeepState,
        "4.3.10",
        _INPUTS,
        "a 0-element parameter with a gradient gets a state whose counters advance",
    ),
    "factored-beyond-two-dimensions": (
        _FactoredBeyondTwoDimensions,
        "4.3.12",
        _LIFECYCLE,
        "tensors of three or more dimensions factored as (shape[0], rest)",
    ),
    "fallback-from-leading-dimension": (
        _FallbackFromLeadingDimension,
        "1.5.6#2",
        _LIFECYCLE,
        "the fallback period's first candidate read from shape[0] instead of shape[-1]",
    ),
    "inactive-moment-freed": (
        _InactiveMomentFreed,
        "4.3.11",
        _MIGRATION,
        "the inactive second moment dropped after a mode switch",
    ),
}

ENTRIES: dict = _backend_entries(_EDGE_MUTANTS)
#: The input space's and the lifecycle's selections run their large explicit examples.
SLOW: frozenset = frozenset(
    {"empty-tensors-keep-state", "factored-beyond-two-dimensions", "fallback-from-leading-dimension"}
)

"""Hyperparameter staging on load, one example at a time (SPEC 3.5, 4.3.9): the saved values, the
live destinations, both sides' outcomes and their comparison, and the example as a replayable case.

One example is one checkpoint written by the reference with chosen saved hyperparameters
(:func:`write_checkpoint`, held in memory: :mod:`gefen_conformance.workload.checkpoint_in_memory`),
loaded (world size 1, in this process) into a fresh optimizer of the implementation and into one
of the reference whose groups hold the same chosen :class:`Destination` s (:func:`load_outcome`);
:func:`staging_comparisons` compares the two :class:`StagingOutcome` s. :class:`StagingCase` is
the example as a reproducer holds it (kind ``staging``, SPEC 4.5.6).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from gefen_conformance.harness.sharding import WorldOfOne
from gefen_conformance.implementations import registry
from gefen_conformance.suite.replayable import replayable
from gefen_conformance.workload import models, saving
from gefen_conformance.workload.checkpoint_in_memory import InMemoryCheckpoint
from gefen_oracles.numeric import Comparisons

KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay")
#: Two groups of one parameter each; the optimizer never steps.
MODEL = models.Model(
    shapes={"a.weight": (4, 2), "b.weight": (2, 2)},
    groups=(("a.weight",), ("b.weight",)),
    init=models.zeros,
)
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]


# ----------------------------------------------------------------------- driving one example


@dataclass(frozen=True)
class Destination:
    """A group's live entry for one key before the load: a number or a one-element tensor."""

    dtype: torch.dtype | None  # None: a Python float
    value: float
    shape: tuple = ()
    requires_grad: bool = False
    alias: str | None = None  # destinations with the same alias tag are one tensor object

    def build(self, shared: dict) -> Any:
        if self.dtype is None:
            return self.value
        if self.alias is not None and self.alias in shared:
            return shared[self.alias]
        t = torch.full(self.shape, self.value, dtype=self.dtype)
        if self.requires_grad:
            t.requires_grad_(True)
        if self.alias is not None:
            shared[self.alias] = t
        return t


@dataclass
class StagingOutcome:
    accepted: bool
    error: BaseException | None
    values: list  # per group, per key: ("float", hex) or ("tensor", dtype, shape, bits, requires_grad)
    identities_kept: bool
    versions: list


def _optimizer(impl, world: WorldOfOne, reference_side: bool = False):
    """A fresh optimizer of ``impl``: on the reference's side of a comparison over the parameters
    the reference's optimizers share (:func:`_reference_parameters`), otherwise over new ones."""
    params = _reference_parameters(world) if reference_side else models.parameters(MODEL, mesh=world.mesh)
    return impl.make_optimizer(models.param_groups(MODEL, params), factored_v_2d=False)


@functools.cache
def _reference():
    return registry.resolve("reference")


@functools.lru_cache(maxsize=1)
def _reference_parameters(world: WorldOfOne) -> dict:
    """The parameters of every reference optimizer here, made once per World: the optimizers never
    step and a checkpoint here holds only the optimizer, so nothing writes them (a DTensor made
    by a scatter over the World, several milliseconds each). Never handed to the implementation."""
    return models.parameters(MODEL, mesh=world.mesh)


def write_checkpoint(world: WorldOfOne, saved: list) -> InMemoryCheckpoint:
    """A reference checkpoint whose two groups carry ``saved[g][key]`` (Python floats), in memory:
    staging reads the saved entries DCP hands to ``load_state_dict``, whatever the storage."""
    reference = _reference()
    opt = _optimizer(reference, world, reference_side=True)
    for group, values in zip(opt.param_groups, saved):
        group.update(values)
    checkpoint = InMemoryCheckpoint()
    saving.save(reference, opt, planner=False, writer=checkpoint.writer(), dcp_collectives=False)
    return checkpoint


def _describe(value: Any):
    if torch.is_tensor(value):
        flat = value.detach().reshape(-1)
        bits = flat.tolist() if value.dtype == torch.bool else flat.view(torch.uint8).tolist()
        return ("tensor", str(value.dtype), tuple(value.shape), tuple(bits), bool(value.requires_grad))
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, repr(value))


def load_outcome(
    impl, world: WorldOfOne, checkpoint: InMemoryCheckpoint, destinations: list, reference_side: bool = False
) -> StagingOutcome:
    """Load ``checkpoint`` into a fresh optimizer of ``impl`` whose groups hold ``destinations``
    (``reference_side``: the reference's side of the comparison, see :func:`_optimizer`)."""
    opt = _optimizer(impl, world, reference_side)
    shared: dict = {}
    live = []
    for group, dests in zip(opt.param_groups, destinations):
        row = {}
        for key in KEYS:
            row[key] = group[key] = dests[key].build(shared)
        live.append(row)
    versions_before = [[v._version if torch.is_tensor(v) else None for v in row.values()] for row in live]
    before = [[_describe(v) for v in row.values()] for row in live]
    error = None
    try:
        saving.load(impl, opt, reader=checkpoint.reader(), dcp_collectives=False)
    except Exception as exc:  # the property compares acceptance, so every failure is data
        error = exc
    identities = all(
        (group[key] is row[key])
        for group, row in zip(opt.param_groups, live)
        for key in KEYS
        if torch.is_tensor(row[key])
    )
    values = [[_describe(group[key]) for key in KEYS] for group in opt.param_groups]
    if error is not None:
        # a rejected load must leave every destination as it was
        versions = [[v._version if torch.is_tensor(v) else None for v in row.values()] for row in live]
        identities = identities and values == before and versions == versions_before
    return StagingOutcome(error is None, error, values, identities, versions_before)


def staging_comparisons(impl, expected: StagingOutcome, actual: StagingOutcome) -> Comparisons:
    """SPEC 3.5: the implementation accepts exactly when the reference does; on acceptance it commits
    the reference's values bit for bit and keeps every destination tensor; on rejection it raises
    ValueError and changes nothing (all exact, in both profiles)."""
    out = Comparisons()

    def verdict(o: StagingOutcome, who: str) -> str:
        return f"{who} {'accepted' if o.accepted else 'rejected: ' + repr(o.error)}"

    same = actual.accepted == expected.accepted
    out.exact(
        "staging: acceptance as the reference's",
        int(not same),
        1,
        [f"{verdict(expected, 'reference')}; {verdict(actual, impl.name)}"],
    )
    if not same:
        return out
    if expected.accepted:
        differing = [
            f"group {g} {KEYS[k]}: {a!r}, the reference committed {e!r}"
            for g, (row_e, row_a) in enumerate(zip(expected.values, actual.values))
            for k, (e, a) in enumerate(zip(row_e, row_a))
            if e != a
        ]
        out.exact("staging: committed values", len(differing), sum(map(len, expected.values)), differing)
        kept = ["a destination tensor was replaced instead of filled in place"]
    else:
        wrong = not isinstance(actual.error, ValueError)
        out.exact(
            "staging: a rejection is a ValueError",
            int(wrong),
            1,
            [f"rejection must be a ValueError, got {actual.error!r}"],
        )
        kept = ["a rejected load changed a destination"]
    out.exact("staging: destinations kept", int(not actual.identities_kept), 1, kept)
    return out


def _destination(d: Destination) -> dict:
    return {
        "dtype": None if d.dtype is None else str(d.dtype).removeprefix("torch."),
        "value": d.value,
        "shape": list(d.shape),
        "requires_grad": d.requires_grad,
        "alias": d.alias,
    }


def _from_destination(d: dict) -> Destination:
    dtype = None if d["dtype"] is None else getattr(torch, d["dtype"])
    return Destination(dtype, d["value"], tuple(d["shape"]), d["requires_grad"], d["alias"])


@replayable("staging")
class StagingCase:
    """One staging example as a replayable case: the saved hyperparameters and the live
    destinations; run in one process, in a group of one."""

    def __init__(self, saved: list, dests: list):
        self.saved, self.dests = saved, dests

    def outcomes(self, impl, world) -> tuple[StagingOutcome, StagingOutcome]:
        """``(the reference's outcome, impl's outcome)`` of one checkpoint loaded by each."""
        checkpoint = write_checkpoint(world, self.saved)
        expected = load_outcome(_reference(), world, checkpoint, self.dests, reference_side=True)
        return expected, load_outcome(impl, world, checkpoint, self.dests)

    def comparisons(self, impl, *, bitwise: bool, world=None) -> Comparisons:
        """:func:`staging_comparisons` of the two outcomes (exact: ``bitwise`` changes nothing), in
        ``world`` or in a group of one opened for the call."""
        own = world is None
        world = WorldOfOne() if own else world
        try:
            return staging_comparisons(impl, *self.outcomes(impl, world))
        finally:
            if own:
                world.close()

    def payload(self) -> dict:
        return {
            "kind": self.kind,
            "saved": [dict(g) for g in self.saved],
            "dests": [{k: _destination(d) for k, d in g.items()} for g in self.dests],
        }

    @classmethod
    def from_payload(cls, payload: dict) -> StagingCase:
        dests = [{k: _from_destination(d) for k, d in g.items()} for g in payload["dests"]]
        return cls([dict(g) for g in payload["saved"]], dests)

    def describe(self) -> str:
        def dest(d: Destination) -> str:
            if d.dtype is None:
                return f"{d.value!r}"
            text = f"{str(d.dtype).removeprefix('torch.')}{list(d.shape) or ''} {d.value!r}"
            return (
                text
                + (" requires_grad" if d.requires_grad else "")
                + (f" alias {d.alias}" if d.alias else "")
            )

        saved = "; ".join(", ".join(f"{k} {v!r}" for k, v in g.items()) for g in self.saved)
        live = "; ".join(", ".join(f"{k} {dest(d)}" for k, d in g.items()) for g in self.dests)
        return f"staging case: saved groups [{saved}]; live destinations [{live}]"

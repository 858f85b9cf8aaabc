"""Property-based certification of hyperparameter staging on load (SPEC 3.5).

One example = one checkpoint written by the reference with chosen saved hyperparameters, loaded
(world size 1, in this process) into a fresh optimizer of the implementation under test and into
one of the reference, whose groups were given the same chosen *destinations* (Python numbers or
one-element tensors, possibly aliased across groups and keys). The outcomes are then compared.
The checkpoint is held in memory (:mod:`gefen_conformance.workload.checkpoint_in_memory`) and DCP plans in
this process (SPEC 4.3.9): ``dcp.save`` and ``dcp.load`` call the adapters as always, without a
file or an exchange of plans per example.

Property: for any saved hyperparameters and any live destinations, the implementation accepts
exactly when the reference accepts; on acceptance it commits the same values bit for bit and
keeps every destination tensor's identity; on rejection it raises ValueError and changes
nothing. Each property first runs its explicit examples (:data:`LIMITS`, :data:`OPEN_LIMITS`: one
destination at each boundary the strategies draw from), then one third of the profile's examples
(:data:`EXAMPLE_SHARE`): ``gefen-certify`` (the default: derandomized, no example database) 100 of
its 300, ``gefen-fuzz`` (random) 1666 of its 5000 (SPEC 4.3.9).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from gefen_conformance.harness.sharding import WorldOfOne
from gefen_conformance.implementations import registry
from gefen_conformance.implementations.contract import DCP_RESHARD
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
    ref = _reference()
    opt = _optimizer(ref, world, reference_side=True)
    for group, values in zip(opt.param_groups, saved):
        group.update(values)
    checkpoint = InMemoryCheckpoint()
    saving.save(ref, opt, planner=False, writer=checkpoint.writer(), dcp_collectives=False)
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


def ulps_below_one(n: int) -> float:
    x = 1.0
    for _ in range(n):
        x = math.nextafter(x, 0.0)
    return x


# ------------------------------------------------------------------------------- strategies


ordinary = st.floats(1e-6, 1.0)
tiny = st.sampled_from([5e-324, 1e-310, 1e-45, 1.4e-45, 1e-40, 6e-8, 5.96e-8, 1e-30, 1e-8])
huge = st.sampled_from([65504.0, 65520.0, 70000.0, 3.4e38, 3.5e38, 1e39, 1e300])
integral = st.sampled_from(
    [0.0, 1.0, 2.0, 3.0, 127.0, 128.0, 255.0, 256.0, 32767.0, 32768.0, 2.0**31, 2.0**63]
)
fractional = st.sampled_from([0.5, 1.5, 2.25, 1e-3, 0.1, 3e-4])
near_one = st.integers(1, 12).map(ulps_below_one) | st.sampled_from(
    [0.9999, 0.99951, 0.9995, 0.999, 0.996, 0.998]
)


def _edge_value(key):
    if key in ("beta1", "beta2"):
        return near_one | tiny | st.just(0.0)
    if key == "eps":
        return tiny | huge | integral.filter(lambda x: x > 0)
    return tiny | huge | integral | fractional


def _plain_value(key):
    if key in ("beta1", "beta2"):
        return st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99, 0.999]) | st.floats(0.0, 0.99)
    if key == "eps":
        return st.sampled_from([1e-8, 1e-6, 1e-3]) | st.floats(1e-6, 1e-2)
    return ordinary | st.just(0.0)


# built once: a strategy built inside a draw is built (and validated) again for every example
_EDGE = {key: _edge_value(key) for key in KEYS}
_PLAIN = {key: _plain_value(key) for key in KEYS}


def saved_value(key):
    """Mostly ordinary values, one draw in eight at an edge, so both verdicts are common."""
    edge, plain = _EDGE[key], _PLAIN[key]
    return st.integers(0, 7).flatmap(lambda i: edge if i == 0 else plain)


saved_group = st.fixed_dictionaries({k: saved_value(k) for k in KEYS})


_KIND = st.sampled_from(["float"] * 3 + ["float-tensor"] * 4 + ["int-tensor"])
_DTYPE = {"float-tensor": st.sampled_from(FLOAT_DTYPES), "int-tensor": st.sampled_from(INT_DTYPES)}
_SHAPE = st.sampled_from([(), (1,)])


@st.composite
def destination(draw, key, open_cases: bool):
    """A live entry; ``open_cases`` adds the two cases gefen-x leaves open (SPEC 3.5.3, 3.5.4):
    destinations that require grad, and one tensor aliased by several keys or groups."""
    kind = draw(_KIND)
    default = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}[key]
    if kind == "float":
        return Destination(None, default)
    dtype = draw(_DTYPE[kind])
    value = default if dtype.is_floating_point else 0.0
    shape = draw(_SHAPE)
    requires_grad = open_cases and dtype.is_floating_point and draw(st.booleans())
    alias = draw(st.sampled_from([None, None, f"{dtype}-{shape}-{requires_grad}"])) if open_cases else None
    return Destination(dtype, value, shape, requires_grad, alias)


def destination_groups(open_cases: bool):
    return st.lists(
        st.fixed_dictionaries({k: destination(k, open_cases) for k in KEYS}), min_size=2, max_size=2
    )


def _lr_group(lr):
    return {"lr": lr, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}


_FLOAT_DESTS = {k: Destination(None, 0.0) for k in KEYS}


#: Examples that pin the rules the published pull request found one review at a time, plus
#: failing examples found while building the suite. Each runs as its own test, so one known
#: failure cannot hide the others.
REGRESSIONS = {
    # an lr restored into an integer tensor would truncate to 0 and freeze training
    "lr-into-int64": (
        [_lr_group(3e-4), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, lr=Destination(torch.int64, 0.0)), _FLOAT_DESTS],
    ),
    # a beta that rounds to 1.0 in bf16 divides by zero at the next bias correction
    "beta2-rounds-to-one-in-bf16": (
        [dict(_lr_group(1e-3), beta2=0.9999), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, beta2=Destination(torch.bfloat16, 0.999)), _FLOAT_DESTS],
    ),
    # one tensor aliased by two groups that the checkpoint gives different values
    "aliased-lr-different-values": (
        [_lr_group(1e-3), _lr_group(2e-3)],
        [
            dict(_FLOAT_DESTS, lr=Destination(torch.float32, 1e-3, alias="x")),
            dict(_FLOAT_DESTS, lr=Destination(torch.float32, 1e-3, alias="x")),
        ],
    ),
    # the same aliased tensor receiving equal values is fine
    "aliased-lr-same-value": (
        [_lr_group(1e-3), _lr_group(1e-3)],
        [
            dict(_FLOAT_DESTS, lr=Destination(torch.float32, 5e-3, alias="x")),
            dict(_FLOAT_DESTS, lr=Destination(torch.float32, 5e-3, alias="x")),
        ],
    ),
    # a leaf tensor that requires grad is filled under no_grad
    "lr-requires-grad": (
        [_lr_group(1e-3), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, lr=Destination(torch.float32, 5e-3, requires_grad=True)), _FLOAT_DESTS],
    ),
    # a huge lr overflows float16
    "lr-overflows-fp16": (
        [_lr_group(7e4), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, lr=Destination(torch.float16, 1e-3)), _FLOAT_DESTS],
    ),
    # a tiny eps underflows to zero in bf16? (bf16 shares fp32's exponent: it does not) and in fp16 (it does)
    "eps-underflows-fp16": (
        [dict(_lr_group(1e-3), eps=1e-8), _lr_group(1e-3)],
        [dict(_FLOAT_DESTS, eps=Destination(torch.float16, 1e-3)), _FLOAT_DESTS],
    ),
}


#: The boundaries of SPEC 3.5 the properties' explicit examples pin, one destination at a limit
#: each, every other entry a plain Python number (so that this destination decides): for each
#: float dtype its largest finite value and the next float above it (overflow), its smallest
#: subnormal and a quarter of it (underflow), the largest value below 1 and one that rounds to 1
#: (a beta); for each integer dtype and bool its largest value, the next integer (out of range)
#: and a fraction (truncation); one-element tensors of shape () and (1,).
_BELOW_ONE = {
    torch.float16: 1 - 2.0**-11,
    torch.bfloat16: 1 - 2.0**-8,
    torch.float32: 1 - 2.0**-24,
    torch.float64: 1 - 2.0**-53,
}
_SMALLEST = {
    torch.float16: 2.0**-24,
    torch.bfloat16: 2.0**-133,
    torch.float32: 2.0**-149,
    torch.float64: 2.0**-1074,
}
_LARGEST_INT = {
    torch.int8: 127.0,
    torch.int16: 32767.0,
    torch.int32: 2.0**31 - 1,
    torch.int64: 2.0**63 - 1024,
    torch.uint8: 255.0,
    torch.bool: 1.0,
}
_PLAIN_GROUP = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


def _at_limit(key: str, value: float, dtype: torch.dtype, shape: tuple = (), group: int = 0) -> tuple:
    saved = [dict(_PLAIN_GROUP), dict(_PLAIN_GROUP)]
    saved[group][key] = value
    dests = [dict(_FLOAT_DESTS), dict(_FLOAT_DESTS)]
    dests[group] = dict(
        dests[group], **{key: Destination(dtype, 1.0 if dtype.is_floating_point else 0.0, shape)}
    )
    return saved, dests


def _limits() -> dict:
    cases = {}
    for i, dtype in enumerate(FLOAT_DTYPES):
        name, shape, group = str(dtype).replace("torch.", ""), ((), (1,))[i % 2], i % 2
        largest = torch.finfo(dtype).max
        cases[f"{name}-largest"] = _at_limit("lr", largest, dtype, shape, group)
        if dtype != torch.float64:  # above fp64's largest is not a finite saved value
            cases[f"{name}-above-largest"] = _at_limit(
                "weight_decay", math.nextafter(largest, math.inf), dtype, shape
            )
            cases[f"{name}-quarter-subnormal"] = _at_limit("eps", _SMALLEST[dtype] / 4, dtype, (), 1 - group)
            cases[f"{name}-beta-rounds-to-one"] = _at_limit(
                "beta2", 1 - (1 - _BELOW_ONE[dtype]) / 4, dtype, shape
            )
        cases[f"{name}-smallest-subnormal"] = _at_limit("eps", _SMALLEST[dtype], dtype, shape, group)
        cases[f"{name}-beta-below-one"] = _at_limit("beta1", _BELOW_ONE[dtype], dtype, (), 1 - group)
    for i, dtype in enumerate(INT_DTYPES):
        name, shape, group = str(dtype).replace("torch.", ""), ((), (1,))[i % 2], i % 2
        largest = _LARGEST_INT[dtype]
        cases[f"{name}-largest"] = _at_limit("weight_decay", largest, dtype, shape, group)
        cases[f"{name}-past-largest"] = _at_limit(
            "lr", 2.0**63 if dtype == torch.int64 else largest + 1, dtype, shape
        )
        cases[f"{name}-fraction"] = _at_limit("lr", 0.5, dtype, (), 1 - group)
    return cases


#: The cases SPEC 3.5.3 and 3.5.4 leave open (the second property): one tensor aliased by keys of
#: one group or by both groups, saved equal or different; leaf destinations that require grad.
def _open_limits() -> dict:
    shared = Destination(torch.float32, 1e-3, alias="shared")
    grad = Destination(torch.float32, 1e-3, requires_grad=True)
    plain = [dict(_PLAIN_GROUP), dict(_PLAIN_GROUP)]
    return {
        "alias-two-keys-equal": (
            [dict(_PLAIN_GROUP, weight_decay=1e-3), dict(_PLAIN_GROUP)],
            [dict(_FLOAT_DESTS, lr=shared, weight_decay=shared), _FLOAT_DESTS],
        ),
        "alias-two-keys-different": (
            plain,
            [dict(_FLOAT_DESTS, lr=shared, weight_decay=shared), _FLOAT_DESTS],
        ),
        "alias-two-groups-equal": (plain, [dict(_FLOAT_DESTS, eps=shared), dict(_FLOAT_DESTS, eps=shared)]),
        "alias-two-groups-different": (
            [dict(_PLAIN_GROUP), dict(_PLAIN_GROUP, beta1=0.8)],
            [dict(_FLOAT_DESTS, beta1=shared), dict(_FLOAT_DESTS, beta1=shared)],
        ),
        "requires-grad-every-key": (plain, [{k: grad for k in KEYS}, {k: grad for k in KEYS}]),
        "requires-grad-aliased": (
            plain,
            [
                dict(_FLOAT_DESTS, lr=Destination(torch.bfloat16, 1.0, (1,), True, "g")),
                dict(_FLOAT_DESTS, lr=Destination(torch.bfloat16, 1.0, (1,), True, "g")),
            ],
        ),
    }


LIMITS = _limits()
OPEN_LIMITS = _open_limits()


#: Each property runs this share of the hypothesis profile's examples (``gefen-certify``: 300 -> 100;
#: ``gefen-fuzz``: 5000 -> 1666) after its explicit examples (:data:`LIMITS`, :data:`OPEN_LIMITS`),
#: which pin every boundary the strategies draw from (SPEC 4.3.9).
EXAMPLE_SHARE = 3


def _staging_property(cases: dict, *, open_cases: bool):
    """A staging property over two saved groups and drawn destinations: needs DCP, runs a third of
    the profile's examples after the explicit ``cases`` (the boundaries), each an ``@example``."""

    def decorate(test):
        test = given(
            saved=st.lists(saved_group, min_size=2, max_size=2),
            dests=destination_groups(open_cases=open_cases),
        )(test)
        for saved, dests in reversed(list(cases.values())):
            test = example(saved=saved, dests=dests)(test)
        test = settings(
            max_examples=max(1, settings.default.max_examples // EXAMPLE_SHARE),
            suppress_health_check=[HealthCheck.function_scoped_fixture],  # the judge spans the examples
        )(test)
        return pytest.mark.gefen_requires(DCP_RESHARD)(test)

    return decorate


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


class StagingCase:
    """One staging example as a replayable case (kind ``staging``, SPEC 4.5.6): the saved
    hyperparameters and the live destinations; replayed in one process, in a group of one."""

    kind = "staging"

    def __init__(self, saved: list, dests: list):
        self.saved, self.dests = saved, dests

    def outcomes(self, impl, world) -> tuple[StagingOutcome, StagingOutcome]:
        checkpoint = write_checkpoint(world, self.saved)
        expected = load_outcome(_reference(), world, checkpoint, self.dests, reference_side=True)
        return expected, load_outcome(impl, world, checkpoint, self.dests)

    def replay(self, impl, *, bitwise: bool, world=None) -> Comparisons:
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


def _check(impl, judge, one_rank, saved, dests):
    case = StagingCase(saved, dests)
    expected, actual = case.outcomes(impl, one_rank)
    judge.assert_comparisons(staging_comparisons(impl, expected, actual), case=case)
    return expected


def _check_and_tally(impl, judge, one_rank, saved, dests) -> None:
    """:func:`_check`, then a hypothesis event saying which way the reference went."""
    expected = _check(impl, judge, one_rank, saved, dests)
    event("reference accepted" if expected.accepted else "reference rejected")


@pytest.mark.gefen_clause("3.5", "4.3.9")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("case", sorted(REGRESSIONS))
def test_staging_regression(gefen_impl, gefen_judge, gefen_one_rank, case):
    _check(gefen_impl, gefen_judge, gefen_one_rank, *REGRESSIONS[case])


@pytest.mark.gefen_clause("3.5.1", "3.5.2", "3.5.5", "4.3.9")
@_staging_property(LIMITS, open_cases=False)
def test_staging_matches_reference(gefen_impl, gefen_judge, gefen_one_rank, saved, dests):
    """Numbers and one-element tensors of every dtype, each group and key with its own tensor."""
    _check_and_tally(gefen_impl, gefen_judge, gefen_one_rank, saved, dests)


@pytest.mark.gefen_clause("3.5.3", "3.5.4", "4.3.9")
@_staging_property(OPEN_LIMITS, open_cases=True)
def test_staging_matches_reference_with_autograd_and_aliased_destinations(
    gefen_impl, gefen_judge, gefen_one_rank, saved, dests
):
    """Adds destinations that require grad and tensors shared across groups and keys."""
    _check_and_tally(gefen_impl, gefen_judge, gefen_one_rank, saved, dests)

"""Checks of the rules, one example at a time: the constructor's, the native state dict's and the
native load's, the step's and the refused step's, and a DCP save's in a group of one (each example
names its rule id): the suite's tests call them with the implementation under test, and the
project's rule mutants prove each can fail. A check raises AssertionError whose message starts with
the rule id and the example
(``SPEC 1.12.4#4 (indices-int64): ...``); it returns None when the rule holds.

Errors, state dicts and loads are exact in every numeric profile: a refusal names its problem and
changes nothing (SPEC 1.12.9, 1.10.5), an accepted checkpoint loads exactly as the reference loads
it, and what a state dict shows (keys, types, dtypes, shapes, names, counters) is what its rule
states. Steps are judged as the input space judges them (SPEC 4.3.10): what is exact in every
profile (periods, counters, codebooks, indices where blocks normalize exactly) exactly, the rest
under the profile.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

from gefen_conformance import judging
from gefen_conformance.implementations.contract import CPU_BIT_EXACT, FACTORED_V
from gefen_conformance.suite import protocol
from gefen_conformance.suite import save_rule_examples as saves
from gefen_conformance.suite.rule_examples import (
    SHARDED,
    Built,
    LoadAccepted,
    LoadRefused,
    Refused,
    RoundTrip,
    ShardedLoad,
    Stepped,
    StepRefused,
    feed,
)
from gefen_conformance.suite.space_checks import InputSpaceCase
from gefen_conformance.workload import models, runs


def params(examples: list) -> list:
    """``examples`` as pytest parameters, each marked with the rule it checks."""
    return [pytest.param(e, id=e.what, marks=pytest.mark.gefen_clause(e.rule)) for e in examples]


def _fail(example, problem: str) -> None:
    raise AssertionError(f"SPEC {example.rule} ({example.what}): {problem}")


def check_constructor(impl, example: Refused | Built) -> None:
    """The constructor refuses ``example`` with its error naming its words, or builds it as the rule says."""
    if isinstance(example, Built) and example.requires is not None and not impl.has(example.requires):
        pytest.skip(f"SPEC {example.rule}: needs {example.requires}")
    if isinstance(example, Refused) and example.unless in impl.extended_options:
        pytest.skip(
            f"SPEC {example.rule}: {impl.name} implements {example.unless} (its extended_options), "
            "which the suite does not certify (SPEC 1.1.5)"
        )
    device = models.device_for(impl.make_optimizer)
    given, kwargs = example.call(device)
    try:
        optimizer = impl.make_optimizer(given, **kwargs)
    except Exception as exc:  # what was raised is the finding
        if isinstance(example, Built):
            _fail(example, f"refused with {type(exc).__name__}: {exc}")
        if not isinstance(exc, example.error):
            _fail(example, f"raised {type(exc).__name__}: {exc}; expected {example.error.__name__}")
        if example.words is not None and example.words not in str(exc):
            _fail(example, f"the {example.error.__name__} does not name {example.words!r}: {exc}")
        return
    if isinstance(example, Refused):
        _fail(example, f"accepted; expected {example.error.__name__}" + _naming(example.words))
    problem = example.holds(optimizer, given, kwargs)
    if problem:
        _fail(example, problem)


def check_native_state(impl, example: Built | RoundTrip) -> None:
    """What the implementation's native state dict shows (a :class:`Built` example), or a native
    round trip (:func:`check_round_trip`)."""
    if isinstance(example, RoundTrip):
        check_round_trip(impl, example)
    else:
        check_constructor(impl, example)


def check_round_trip(impl, example: RoundTrip) -> None:
    """Two optimizers of ``impl`` built by the example's call: the first steps ``before`` times, the
    second loads a deep copy of its state dict over parameters holding the same values; then both
    step ``after`` times with the same gradients and MUST stay bitwise identical (SPEC 1.12.10)."""
    device = models.device_for(impl.make_optimizer)
    params, kwargs = example.call(device)
    original = impl.make_optimizer(params, **kwargs)
    for i in range(example.before):
        feed(original, i)
    again, kwargs_again = example.call(device)
    with torch.no_grad():
        for (_, a), (_, b) in zip(params, again):
            b.copy_(a)
    restored = impl.make_optimizer(again, **kwargs_again)
    restored.load_state_dict(copy.deepcopy(original.state_dict()))
    for i in range(example.before, example.before + example.after):
        feed(original, i)
        feed(restored, i)
        differences = _differences(runs.native_state(original), runs.native_state(restored), "state_dict()")
        differences += _differences(
            [a.detach().cpu() for _, a in params], [b.detach().cpu() for _, b in again], "parameters"
        )
        if differences:
            _fail(
                example, f"after step {i + 1}, the restored optimizer differs: " + "; ".join(differences[:5])
            )


def check_sharded_load(impl, example: ShardedLoad) -> None:
    """A native load into ``impl``'s optimizer over DTensor parameters (SPEC 1.12.11 item 2), in the
    caller's process group of one (the suite's ``gefen_one_rank``). What it shows goes through
    ``param_groups`` and the steps (a native ``state_dict()`` of DTensor parameters is refused,
    item 1): accepted, the saved ``lr`` and names are the live ones and the next step equals a fresh
    optimizer's built with that ``lr``, bit for bit (the implementation against itself); refused,
    ValueError naming ``DTensor``, and the groups' values and the state's tensors unchanged."""
    from gefen_conformance.harness.sharding import shard as sharded
    from gefen_conformance.harness.sharding import world_mesh

    mesh = world_mesh()
    checkpoint = _sharded_checkpoint(example.steps)

    def build(seed: int, **options):
        g = torch.Generator().manual_seed(seed)
        params = [torch.nn.Parameter(sharded(torch.randn(shape, generator=g), mesh)) for _, shape in SHARDED]
        named = [(name.upper(), p) for (name, _), p in zip(SHARDED, params)]
        return params, impl.make_optimizer(named, **options)

    def step(params, optimizer, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for p in params:
            p.grad = sharded(torch.randn(p.shape, generator=g), mesh)
        optimizer.step()

    params, optimizer = build(1)
    if example.save:
        for i in range(example.steps):
            step(params, optimizer, 10 + i)
        try:
            optimizer.state_dict()
        except Exception as exc:  # what was raised is the finding
            if not isinstance(exc, ValueError) or "DTensor" not in str(exc):
                _fail(example, f"raised {type(exc).__name__}: {exc}; expected ValueError naming 'DTensor'")
            return
        _fail(
            example,
            "returned a native state dict of DTensor parameters (this rank's shards as if they were "
            "the whole); expected ValueError naming 'DTensor'",
        )
    if example.steps:
        step(params, optimizer, 10)
        before = _sharded_live(optimizer)
        try:
            optimizer.load_state_dict(checkpoint)
        except Exception as exc:  # what was raised is the finding
            if not isinstance(exc, ValueError) or "DTensor" not in str(exc):
                _fail(example, f"raised {type(exc).__name__}: {exc}; expected ValueError naming 'DTensor'")
        else:
            _fail(example, "loaded a stepped checkpoint into DTensor parameters; expected ValueError")
        if _sharded_live(optimizer) != before:
            _fail(example, "the refused load changed the optimizer's groups or state (SPEC 1.12.9)")
        return
    try:
        optimizer.load_state_dict(checkpoint)
    except Exception as exc:  # a refusal is the finding
        _fail(example, f"refused with {type(exc).__name__}: {exc}")
    group = optimizer.param_groups[0]
    lr, names = group["lr"], list(group["param_names"])
    if type(lr) is not float or lr != 0.5 or names != [f"{n}_saved" for n, _ in SHARDED]:
        _fail(
            example, f"after the load, lr {lr!r} and names {names}; expected the checkpoint's 0.5 and names"
        )
    fresh_params, fresh = build(1, lr=0.5)
    step(params, optimizer, 11)
    step(fresh_params, fresh, 11)
    for (name, _), a, b in zip(SHARDED, params, fresh_params):
        if not torch.equal(a.to_local().cpu(), b.to_local().cpu()):
            _fail(example, f"the step after the load moved {name} unlike a fresh optimizer's first step")


def _sharded_checkpoint(steps: int) -> dict:
    """The reference's native checkpoint over plain parameters of :data:`SHARDED`, after
    ``steps`` steps, group 0 saved with ``lr = 0.5`` and every name suffixed ``_saved``."""
    g = torch.Generator().manual_seed(0)
    plain = [torch.nn.Parameter(torch.randn(shape, generator=g)) for _, shape in SHARDED]
    source = models.REFERENCE([(name, p) for (name, _), p in zip(SHARDED, plain)])
    for _ in range(steps):
        for p in plain:
            p.grad = torch.randn(p.shape, generator=g)
        source.step()
    checkpoint = copy.deepcopy(source.state_dict())
    group = checkpoint["param_groups"][0]
    group["lr"] = 0.5
    group["param_names"] = [f"{n}_saved" for n in group["param_names"]]
    return checkpoint


def _sharded_live(optimizer) -> tuple:
    """The groups' values (by value and identity) and the state's keys, tensor identities and versions."""
    groups = [
        sorted((str(k), repr(v), id(v)) for k, v in g.items() if k != "params")
        for g in optimizer.param_groups
    ]
    state = [
        sorted((str(k), id(v), getattr(v, "_version", None)) for k, v in entry.items())
        for entry in optimizer.state.values()
    ]
    return groups, state


def _naming(words) -> str:
    return f" naming {words!r}" if words else ""


def checkpoint_of(example: LoadRefused | LoadAccepted) -> dict:
    """The reference's native checkpoint (:func:`protocol.checkpoint`) with the example's change."""
    checkpoint = protocol.checkpoint()
    example.change(checkpoint)
    return checkpoint


def check_native_load(impl, example: LoadRefused | LoadAccepted) -> None:
    """A refused checkpoint: the error, and the live optimizer and the caller's dict unchanged.
    An accepted one: the optimizer's state after the load as the reference's after the same load."""
    checkpoint = checkpoint_of(example)
    kept = copy.deepcopy(checkpoint)
    if isinstance(example, LoadAccepted):
        options = dict(example.options)
        loaded = {}
        for name, make in (("reference", models.REFERENCE), ("impl", impl.make_optimizer)):
            optimizer = _built(make, **options)
            try:
                optimizer.load_state_dict(copy.deepcopy(checkpoint))
            except Exception as exc:  # noqa: BLE001 - a refusal is the finding
                if name == "reference":
                    raise
                _fail(example, f"refused with {type(exc).__name__}: {exc}")
            loaded[name] = runs.native_state(optimizer)
        differences = _differences(loaded["reference"], loaded["impl"], "state_dict()")
        if differences:
            _fail(example, "loaded unlike the reference: " + "; ".join(differences[:5]))
        return
    side = protocol.Side.build(impl.make_optimizer)  # the valid checkpoint loaded, then one step
    side.step(protocol.grads(1))
    before = _live(side.optimizer)
    try:
        side.optimizer.load_state_dict(checkpoint)
    except Exception as exc:  # what was raised is the finding
        if not isinstance(exc, example.error):
            _fail(example, f"raised {type(exc).__name__}: {exc}; expected {example.error.__name__}")
        if example.words is not None and example.words not in str(exc):
            _fail(example, f"the {example.error.__name__} does not name {example.words!r}: {exc}")
    else:
        _fail(example, f"loaded; expected {example.error.__name__}" + _naming(example.words))
    changed = _live_differences(before, _live(side.optimizer))
    changed += _differences(kept, checkpoint, "the caller's checkpoint")
    if changed:
        _fail(example, "the refused load changed " + "; ".join(changed[:5]) + " (SPEC 1.12.9)")


def check_stepped(impl, example: Stepped, judge: judging.Judge | None = None) -> None:
    """The example's case stepped by the reference and by ``impl``, every call compared under
    ``impl``'s numeric profile (``judge``: the suite test's, which records the comparisons and the
    reproducer; by default one of the profile ``impl`` declares on CPU). A case of the factored
    path is skipped for an implementation without it (a capability, SPEC 4.1.3). The cases are in
    the conformance domain, so a step that raises fails the rule (a one-element parameter whose
    period is searched has no candidate)."""
    if example.case.factored and not impl.has(FACTORED_V):
        pytest.skip(f"SPEC {example.rule}: the factored second moment is not implemented ({FACTORED_V})")
    judge = judge or judging.Judge(impl, bitwise=impl.has(CPU_BIT_EXACT))
    drawn = InputSpaceCase(example.case)
    try:
        comparisons = drawn.comparisons(impl, bitwise=judge.bitwise)
    except Exception as exc:  # what was raised is the finding
        _fail(example, f"the case raised {type(exc).__name__}: {exc}")
    judge.assert_comparisons(
        comparisons,
        case=drawn,
        prefix=f"SPEC {example.rule} ({example.what}): ",
    )


def check_step_refused(impl, example: StepRefused) -> None:
    """The example's call raises its error naming its words, and changes nothing: every parameter
    bit for bit, and the optimizer's state, codebook, global step and groups by value and by the
    identity and version of their tensors (SPEC 1.10.5)."""
    side = protocol.Side.build(impl.make_optimizer, load=not example.fresh)
    side.assign(protocol.grads(1))
    example.spoil(side.params)
    for name, value in example.attributes:
        setattr(side.optimizer, name, torch.tensor(value, device=side.device))
    before = _live(side.optimizer), _values(side.params)
    try:
        side.optimizer.step()
    except Exception as exc:  # what was raised is the finding
        if not isinstance(exc, example.error):
            _fail(example, f"raised {type(exc).__name__}: {exc}; expected {example.error.__name__}")
        if example.words is not None and example.words not in str(exc):
            _fail(example, f"the {example.error.__name__} does not name {example.words!r}: {exc}")
    else:
        _fail(example, f"stepped; expected {example.error.__name__}" + _naming(example.words))
    changed = _live_differences(before[0], _live(side.optimizer))
    changed += _differences(before[1], _values(side.params), "the parameters")
    if changed:
        _fail(example, "the refused step changed " + "; ".join(changed[:5]) + " (SPEC 1.10.5)")


def _values(params: dict) -> dict:
    """``{name: CPU copy}`` of the parameters."""
    return {name: models.to_cpu(p) for name, p in params.items()}


def check_save(impl, example, world) -> None:
    """A save example (:mod:`gefen_conformance.suite.save_rule_examples`) in ``world``, a
    :class:`~gefen_conformance.harness.sharding.WorldOfOne`: what the rule says of the adapter's
    ``state_dict()``, or the refusal, its error and its words. Exact in every numeric profile."""
    missing = impl.lacks(example.requires)
    if missing:
        pytest.skip(f"SPEC {example.rule}: needs {', '.join(map(str, missing))}")
    if isinstance(example, saves.PlannerRefused):
        _check_planner_refused(impl, example)
        return
    try:
        optimizer, params = example.build(impl, world.mesh)
    except saves.NoAttribute as absent:
        pytest.skip(f"SPEC {example.rule} ({example.what}): {absent}")
    except saves.NotDeclared as undeclared:
        pytest.skip(f"SPEC {example.rule}: {undeclared} declares no state layout (it binds declared classes)")
    if isinstance(example, saves.Saved):
        try:
            state = impl.dcp_state(optimizer).state_dict()
        except Exception as exc:  # a refusal is the finding
            _fail(example, f"refused with {type(exc).__name__}: {exc}")
        try:
            problem = example.holds(saves.Save(impl, optimizer, params, state, world))
        except Exception as exc:  # an implementation the check cannot read fails it
            _fail(example, f"checking the save raised {type(exc).__name__}: {exc}")
        if problem:
            _fail(example, problem)
        return
    path = world.path() if example.at == "stage" else None
    try:
        _refused_save(impl, example, optimizer, path)
    except Exception as exc:  # what was raised is the finding
        if not isinstance(exc, example.error):
            _fail(example, f"raised {type(exc).__name__}: {exc}; expected {example.error.__name__}")
        if example.words is not None and example.words not in str(exc):
            _fail(example, f"the {example.error.__name__} does not name {example.words!r}: {exc}")
        if example.not_words is not None and example.not_words in str(exc):
            _fail(example, f"the {example.error.__name__} names {example.not_words!r}: {exc}")
    else:
        _fail(
            example,
            f"saved; expected {example.error.__name__}" + _naming(example.words) + f" at {example.at}",
        )
    written = sorted(os.listdir(path)) if path is not None and os.path.isdir(path) else []
    if written:
        _fail(example, f"the refused staging wrote {written}")


def _refused_save(impl, example, optimizer, path) -> None:
    """What ``example.at`` names, which the example expects to raise (``path``: where a staging
    writer would write)."""
    if example.at == "no-group":
        with _no_default_group():
            impl.dcp_state(optimizer)
        return
    if example.at == "construct":
        impl.dcp_state(optimizer)
        return
    state = impl.dcp_state(optimizer).state_dict()
    if example.at == "state_dict":
        return
    from torch.distributed.checkpoint import FileSystemWriter

    FileSystemWriter(path).stage({"optimizer": state})


class _no_default_group:
    """The default process group hidden while the block runs (``dist.is_initialized()`` is False),
    then put back: the adapter's constructor then meets a process without one (SPEC 2.3.1)."""

    def __enter__(self):
        from torch.distributed import distributed_c10d

        self.world = distributed_c10d._world
        self.saved = self.world.default_pg
        self.world.default_pg = None

    def __exit__(self, *exc):
        self.world.default_pg = self.saved


def _check_planner_refused(impl, example) -> None:
    planner_class = type(impl.save_planner())
    try:
        planner_class(*example.args, **example.kwargs)
    except Exception as exc:  # what was raised is the finding
        if not isinstance(exc, example.error):
            _fail(example, f"raised {type(exc).__name__}: {exc}; expected {example.error.__name__}")
        missing = [w for w in example.words if w not in str(exc)]
        if missing:
            _fail(example, f"the {example.error.__name__} does not name {missing}: {exc}")
        return
    _fail(example, f"{planner_class.__name__} was built; expected {example.error.__name__}")


def _built(make_optimizer, **options):
    _, optimizer = runs.built_from(
        make_optimizer,
        models.OPTIMIZER,
        runs.pinned_start(protocol.DTYPE),
        runs.optimizer_hypers(**protocol.HYPERS),
        **{**protocol.OPTIONS, **options},
    )
    return optimizer


def _live(optimizer) -> tuple:
    """The optimizer's state by value, and its tensors' and group values' identities and versions."""
    tensors = [
        (key, id(t), t._version)
        for entry in optimizer.state.values()
        for key, t in sorted(entry.items())
        if torch.is_tensor(t)
    ]
    groups = [sorted((str(k), id(v)) for k, v in g.items() if k != "params") for g in optimizer.param_groups]
    return runs.native_state(optimizer), tensors, groups


def _live_differences(before: tuple, after: tuple) -> list:
    out = _differences(before[0], after[0], "state_dict()")
    if before[1] != after[1]:
        out.append("the identity or version of a state tensor")
    if before[2] != after[2]:
        out.append("a param group's values (by identity)")
    return out


def _differences(expected, observed, where: str) -> list:
    """Where ``observed`` differs from ``expected``: keys, types, tensor dtypes, shapes and bits."""
    if isinstance(expected, dict):
        if not isinstance(observed, dict):
            return [f"{where}: {type(observed).__name__}, expected a dict"]
        out = [f"{where}: keys {sorted(map(str, expected))} != {sorted(map(str, observed))}"]
        if set(expected) != set(observed):
            return out
        return [d for k in expected for d in _differences(expected[k], observed[k], f"{where}[{k!r}]")]
    if isinstance(expected, (list, tuple)):
        if type(observed) is not type(expected) or len(observed) != len(expected):
            return [f"{where}: {observed!r:.80} != {expected!r:.80}"]
        return [
            d for i, (e, o) in enumerate(zip(expected, observed)) for d in _differences(e, o, f"{where}[{i}]")
        ]
    if torch.is_tensor(expected):
        if not torch.is_tensor(observed):
            return [f"{where}: {type(observed).__name__}, expected a tensor"]
        if (expected.dtype, expected.shape) != (observed.dtype, observed.shape):
            shapes = (
                f"{observed.dtype} {tuple(observed.shape)}, expected {expected.dtype} {tuple(expected.shape)}"
            )
            return [f"{where}: {shapes}"]
        bits = (expected.cpu().reshape(-1), observed.cpu().reshape(-1))
        if expected.is_floating_point():  # NaN payloads compare by their bits
            bits = tuple(t.view(torch.uint8) for t in bits)
        same = torch.equal(*bits)
        return [] if same else [f"{where}: values differ"]
    if type(expected) is not type(observed):
        return [f"{where}: {type(observed).__name__} {observed!r:.40}, expected {type(expected).__name__}"]
    if isinstance(expected, float) and math.isnan(expected) and math.isnan(observed):
        return []
    return [] if expected == observed else [f"{where}: {observed!r:.60}, expected {expected!r:.60}"]

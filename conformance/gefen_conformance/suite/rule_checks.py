"""Checks of the rules, one example at a time: the constructor's and the native load's (SPEC 1.1.2,
1.1.6, 1.12), the step's (SPEC 1.5-1.10, 1.13) and a DCP save's (SPEC 2.1-2.6, in a group of one):
the suite's tests call them with the implementation under test, and the project's rule mutants
prove each can fail. A check raises
AssertionError whose message starts with the rule id and the example
(``SPEC 1.12.4#4 (indices-int64): ...``); it returns None when the rule holds.

Errors and loads are exact in every numeric profile: a refusal names its problem and changes
nothing (SPEC 1.12.9), and an accepted checkpoint loads exactly as the reference loads it. Steps are
judged as the input space judges them (SPEC 4.3.10): what is exact in every profile (periods,
counters, codebooks, indices where blocks normalize exactly) exactly, the rest under the profile.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

from gefen_conformance import judging
from gefen_conformance.certificate import numeric_profile
from gefen_conformance.implementations.contract import FACTORED_V
from gefen_conformance.suite import protocol
from gefen_conformance.suite import save_rule_examples as saves
from gefen_conformance.suite.rule_examples import Built, LoadAccepted, LoadRefused, Refused, Stepped
from gefen_conformance.suite.space_checks import InputSpaceCase
from gefen_conformance.workload import models, runs


def params(examples: list) -> list:
    """``examples`` as pytest parameters, each marked with the rule it checks."""
    return [pytest.param(e, id=e.what, marks=pytest.mark.gefen_clause(e.rule)) for e in examples]


def _fail(example, problem: str) -> None:
    raise AssertionError(f"SPEC {example.rule} ({example.what}): {problem}")


def check_constructor(impl, example: Refused | Built) -> None:
    """The constructor refuses ``example`` with its error naming its words, or builds it as the rule says."""
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
    problem = example.holds(optimizer, given)
    if problem:
        _fail(example, problem)


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
    reproducer; by default one of the profile's own). A case of the factored path is skipped for an
    implementation without it (SPEC 4.2)."""
    if example.case.factored and not impl.has(FACTORED_V):
        pytest.skip(f"SPEC {example.rule}: the factored second moment is not implemented ({FACTORED_V})")
    judge = judge or judging.Judge(impl, bitwise=numeric_profile.bitwise(impl))
    drawn = InputSpaceCase(example.case)
    judge.assert_comparisons(
        drawn.comparisons(impl, bitwise=judge.bitwise),
        case=drawn,
        prefix=f"SPEC {example.rule} ({example.what}): ",
    )


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

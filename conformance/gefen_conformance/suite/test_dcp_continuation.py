"""DCP restores of a bf16 model with a slot above 64Ki elements into optimizers that have already
stepped, across world sizes, each followed by several steps (SPEC 4.3.11 items 3 and 5, 3.6, 3.7,
2.3.6 item 4, 5.6.11, 5.6.22).

The reference trains :data:`gefen_conformance.workload.models.WIDE` in bf16 on ``SOURCE`` ranks and saves
it. On each target world size, the implementation and the reference each build an optimizer over
other parameter values with other hyperparameters, step it twice on another gradient stream, the
large slot joining at the second (its codebook, counters and anything derived from them are then
stale), restore the checkpoint with
``dcp.load`` (model and optimizer), re-save at once, and take ``CONTINUATION`` steps on the
checkpoint's gradient stream, re-saving after each. Everything is read back by the independent
reader (SPEC 5.1). Two more paths (:data:`VARIANTS`): a target built with the force-period-one
options, whose restore must re-derive periods by its own rules (SPEC 3.6.2), and a checkpoint saved
before any step, whose restore leaves no codebook, so that the next step learns one from the
gradients (SPEC 3.6.3; under the tolerance profile judged by the codewords in use, SPEC 5.6.23).

* the restore: model parameters exact; the implementation's re-save against the reference's re-save
  of the same restore (bitwise under ``cpu-bit-exact``, SPEC 3.8.2; otherwise SPEC 5.6.11);
* the continuation: the header, identities, hyperparameters and every slot's counters of each
  re-save equal the reference's (both profiles); under ``cpu-bit-exact`` every re-save and the
  model bit for bit; otherwise each step judged from the implementation's own re-saved state before
  it (SPEC 5.6.22: the pinned step's bounds on the dense form, the periods the reference's rule
  gives for the restored shards).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations.contract import DCP_RESHARD, Implementation
from gefen_conformance.judging import assert_no_problems
from gefen_conformance.suite import checkpoints, restore_checks
from gefen_conformance.workload import models, saving
from gefen_oracles import checkpoint_compare, shadowing
from gefen_oracles.checkpoint_reader import read_nested
from gefen_oracles.gefen_schema import slot_key
from gefen_oracles.numeric import Comparison, Comparisons, bitwise_comparison

MODEL = "wide"
MODELS = {MODEL: models.WIDE}
DTYPES = {"bf16": torch.bfloat16}
SOURCE = 2


@dataclass(frozen=True)
class Variant:
    """What the target restores and how it is built: the steps the reference trained the checkpoint
    for (0: saved before any step) and the constructor options of the target optimizer."""

    source_steps: int
    options: tuple = ()  # (keyword, value) pairs

    @property
    def rules(self):
        """The period rules the target's options give (SPEC 1.5.1, 3.6.2)."""
        from gefen_reference.periods import PeriodRules

        kw = dict(self.options)
        return PeriodRules(
            bool(kw.get("force_1d_period_one", False)),
            bool(kw.get("force_2d_period_one", False)),
            tuple(kw.get("period_one_substrings", ())),
        )


VARIANTS = {
    "stepped": Variant(models.DCP_STEPS),
    # a restore re-derives periods with the target's own rules (SPEC 3.6.2): 1 for the 1-D slot and
    # for every slot named by a substring
    "forced-periods": Variant(
        models.DCP_STEPS, (("force_1d_period_one", True), ("period_one_substrings", ("enc.weight",)))
    ),
    # no rank has a materialized slot: the restore leaves no codebook and the next step learns one
    # from gradients (SPEC 3.6.3, 1.12.12)
    "never-stepped": Variant(0),
}


@dataclass(frozen=True)
class Target:
    """A restore path: the variant and the world size restored on."""

    variant: str
    world: int

    def __str__(self) -> str:
        suffix = "" if self.variant == "stepped" else f"-{self.variant}"
        return f"{SOURCE}->{self.world}{suffix}"


PATHS = [
    pytest.param(Target("stepped", 1), id="2->1"),
    pytest.param(Target("stepped", 3), id="2->3"),
    pytest.param(
        Target("forced-periods", 3),
        id="2->3-forced-periods",
        marks=pytest.mark.gefen_clause("3.6.2", "1.5.1"),
    ),
    pytest.param(
        Target("never-stepped", 1), id="2->1-never-stepped", marks=pytest.mark.gefen_clause("3.6.3", "5.6.23")
    ),
]
#: Steps the target optimizer takes on another stream before it loads.
STEPPED_BEFORE = range(1, 3)
#: That stream: ``big.weight`` gets its first gradient at the second step, so the target's
#: codebook is learned from the small slots alone (a few hundred values, no optimal-quantizer
#: search over thousands of bins on every rank of every path) and the large slot's stale state is
#: quantized with it, one step behind the others' counters.
BEFORE_THE_LOAD = {MODEL: replace(models.other_stream(models.WIDE), first_step={"big.weight": 2})}
CONTINUATION = 3
#: Bound of each rank call (SPEC 4.2.2): a first step or a restore of the 67584-element slot learns
#: periods and a codebook from it (about a second on a quiet 2-core machine, several times the small
#: scenarios' work), so these calls get three times the shared bound.
TIMEOUT = 3 * checkpoints.TIMEOUT
HYPERPARAMETERS = ("lr", "beta1", "beta2", "eps", "weight_decay")


# ------------------------------------------------------------------------------ rank bodies


def save_reference(impl: Implementation, model: str, dtype: str, path: str, steps: int) -> None:
    """The reference ``impl`` trains ``model`` in ``dtype`` for steps 1..``steps`` and saves model and
    optimizer."""
    layout = MODELS[model]
    params = models.parameters(layout, dtype=DTYPES[dtype], mesh=world_mesh())
    optimizer = impl.make_optimizer(models.param_groups(layout, params), factored_v_2d=False)
    models.train(layout, optimizer, params, range(1, steps + 1))
    saving.save(impl, optimizer, path, params=params)


@dataclass(frozen=True)
class ContinuationReport:
    """One rank's account of :func:`restore_and_continue`: the load's error, or the first re-save's
    error and after how many continuation steps it came (all None: everything succeeded)."""

    load_error: checkpoints.RaisedError | None = None
    save_error: checkpoints.RaisedError | None = None
    save_error_after: int | None = None


@dataclass(frozen=True)
class Continued:
    """A restore of ``source`` and its continuation, re-saved under ``out/after<k>``; a
    :class:`ContinuationReport` per rank."""

    source: Path
    out: Path
    reports: list


def restore_and_continue(
    impl: Implementation, model: str, dtype: str, path: str, out: str, variant: str = "stepped"
) -> ContinuationReport:
    """A stepped optimizer of ``impl`` (built with the variant's options) restores ``path``, re-saves
    to ``out/after0``, then steps ``CONTINUATION`` times on the checkpoint's stream, re-saving to
    ``out/after<k>`` (collective)."""
    layout = MODELS[model]
    params = models.parameters(layout, dtype=DTYPES[dtype], mesh=world_mesh(), salt="target")
    optimizer = impl.make_optimizer(
        models.param_groups(layout, params, models.TARGET_HYPERS),
        factored_v_2d=False,
        **dict(VARIANTS[variant].options),
    )
    models.train(BEFORE_THE_LOAD[model], optimizer, params, STEPPED_BEFORE)
    try:
        saving.load(impl, optimizer, path, params=params)
    except Exception as exc:  # the outcome is the result
        return ContinuationReport(load_error=checkpoints.RaisedError.of(exc))
    for k in range(CONTINUATION + 1):
        if k:
            models.train(layout, optimizer, params, [models.DCP_STEPS + k])
        try:
            saving.save(impl, optimizer, os.path.join(out, f"after{k}"), params=params)
        except Exception as exc:  # reported; later re-saves are not attempted
            return ContinuationReport(save_error=checkpoints.RaisedError.of(exc), save_error_after=k)
    return ContinuationReport()


# -------------------------------------------------------------------------------- the cache


def _checkpoint(saved: checkpoints.Checkpoints, reference: Implementation, dtype: str, steps: int):
    path = saved.directory("reference-saved", MODEL, dtype, f"w{SOURCE}", f"steps{steps}")

    def make():
        args = (reference, MODEL, dtype, str(path), steps)
        checkpoints.run(save_reference, SOURCE, args, timeout=TIMEOUT)
        return path

    return saved.once(("reference-saved", MODEL, dtype, SOURCE, steps), make)


def _continued(
    saved: checkpoints.Checkpoints,
    impl: Implementation,
    reference: Implementation,
    dtype: str,
    target: Target,
) -> Continued:
    source = _checkpoint(saved, reference, dtype, VARIANTS[target.variant].source_steps)
    out = saved.directory("continued", impl, MODEL, dtype, f"w{SOURCE}", f"w{target.world}", target.variant)

    def make():
        args = (impl, MODEL, dtype, str(source), str(out), target.variant)
        reports = checkpoints.run(restore_and_continue, target.world, args, timeout=TIMEOUT)
        return Continued(source, out, reports)

    return saved.once(("continued", impl.spec, MODEL, dtype, SOURCE, target), make)


def _failures(continued: Continued) -> list[str]:
    out = []
    for rank, report in enumerate(continued.reports):
        if report.load_error is not None:
            out.append(f"rank {rank}: the load raised {report.load_error}")
        elif report.save_error is not None:
            out.append(
                f"rank {rank}: the re-save after {report.save_error_after} steps raised {report.save_error}"
            )
    return out


def _session_reader(saved: checkpoints.Checkpoints):
    """Checkpoints read by the independent reader (SPEC 5.1), each once per session."""
    return lambda path: saved.once(("read", str(path)), lambda: read_nested(path))


def _after(read, continued: Continued, k: int) -> dict:
    """The re-save after ``k`` continuation steps."""
    return read(continued.out / f"after{k}")


# ------------------------------------------------------------------------------------ checks


def _model(checkpoint: dict, resaved: dict) -> Comparisons:
    return restore_checks.model_resaved(
        checkpoint,
        resaved,
        "restore into a stepped optimizer",
        "restored value differs from the checkpoint's (SPEC 3.7.1)",
    )


def _exact_entries(expected: dict, actual: dict, where: str, out: Comparisons) -> None:
    """Every non-float entry of two re-saves (header, identities, hyperparameters, slot flags and
    counters) exactly equal (both profiles, SPEC 5.6.11)."""
    differing = total = 0
    for key in sorted(set(expected) | set(actual)):
        e, a = expected.get(key), actual.get(key)
        if torch.is_tensor(e) and e.is_floating_point() and e.dim() > 0:
            continue
        total += 1
        same = (
            (
                torch.is_tensor(a)
                and torch.is_tensor(e)
                and a.dtype == e.dtype
                and a.shape == e.shape
                and torch.equal(a, e)
            )
            if torch.is_tensor(e)
            else e == a
        )
        if not same:
            differing += 1
            out.problem(f"{where}: {key} is {a!r}, the reference's restore-then-step has {e!r}")
    out.add(
        Comparison(
            "continuation: header, identities, hyperparameters, counters",
            "bitwise",
            differing=differing,
            total=total,
        )
    )


def _periods(checkpoint: dict, target: Target, dtype: torch.dtype) -> dict:
    """``{(rank, slot): period}`` of every slot a rank steps with momentum (periods are exact,
    SPEC 5.6.11), by the reference's rule with the target's options: for a restored slot on the
    checkpoint's dense second moment (SPEC 3.6.2); for a checkpoint saved before any step, on the
    gradient of the first step after the restore, as a fresh optimizer chooses (SPEC 1.5, 3.6.3)."""
    from gefen_reference.dcp.reblock import period_for
    from gefen_reference.periods import choose_period, squared_gradient

    layout, variant = MODELS[MODEL], VARIANTS[target.variant]
    optimizer = checkpoint["optimizer"]
    out = {}
    for i, identity in enumerate(optimizer["param_identities"]):
        name, shape = identity["name"], tuple(identity["shape"])
        for rank in range(target.world):
            if variant.source_steps == 0:
                if name in layout.frozen:
                    continue
                grad = models.gradient(layout, name, models.DCP_STEPS + 1, dtype=dtype)
                local = restore_checks.local_rows(grad, rank, target.world)
                if local.numel():
                    out[rank, i] = choose_period(variant.rules, name, shape, squared_gradient(local))
            elif int(optimizer[slot_key(i, "initialized")]) == 1:
                second = restore_checks.local_rows(
                    optimizer[slot_key(i, "second_moment")], rank, target.world
                )
                if second.numel():
                    out[rank, i] = period_for(variant.rules, name, shape, second)
    return out


def _local(save: dict, part: str, key, rank: int, world: int) -> torch.Tensor:
    return restore_checks.local_rows(save[part][key], rank, world)


def _first_codebook(saves, reference_saves, periods, target: Target, dtype, comparisons) -> None:
    """After a restore that left no codebook, the first step learns one from this rank's gradients
    (SPEC 3.6.3). The dense re-save shows the codewords in use; they are judged as SPEC 5.6.7 judges
    a learned codebook, by their quantization cost on the histogram of the step's gradients at the
    reference's periods, against the reference's codewords in use on the same rank (SPEC 5.6.23)."""
    from gefen_oracles import codebook_quality

    layout = MODELS[MODEL]
    for rank in range(target.world):
        mine = sorted(i for r, i in periods if r == rank)
        if not mine:
            continue
        names = [saves[1]["optimizer"]["param_identities"][i]["name"] for i in mine]
        rank_periods = [periods[rank, i] for i in mine]
        grads = [
            restore_checks.local_rows(
                models.gradient(layout, n, models.DCP_STEPS + 1, dtype=dtype), rank, target.world
            )
            for n in names
        ]
        counts = codebook_quality.histogram(zip(grads, rank_periods))

        def in_use(save):
            momenta = [_local(save, "optimizer", slot_key(i, "momentum"), rank, target.world) for i in mine]
            return shadowing.codewords_in_use(momenta, rank_periods)

        theirs, problems = in_use(saves[1])
        ours, _ = in_use(reference_saves[1])
        for p in problems:
            comparisons.problem(f"rank {rank}: {p}")
        what = f"continuation: rank {rank}'s codebook learned at the first step after the restore"
        compared = codebook_quality.compare_in_use(what, ours, theirs, counts)
        comparisons.add(compared)


def _shadowed(read, continued: Continued, ours: Continued, target: Target, dtype: torch.dtype) -> Comparisons:
    """SPEC 5.6.22: each continuation step of each rank from the re-saves before and after it (after
    a checkpoint saved before any step, the first step learns the codebook and is judged by it)."""
    layout = MODELS[MODEL]
    world = target.world
    saves = [_after(read, continued, k) for k in range(CONTINUATION + 1)]
    periods = _periods(read(continued.source), target, dtype)
    comparisons = Comparisons()
    first = 1
    if VARIANTS[target.variant].source_steps == 0:
        reference_saves = [_after(read, ours, k) for k in range(2)]
        _first_codebook(saves, reference_saves, periods, target, dtype, comparisons)
        first = 2
    for rank in range(world):
        mine = sorted(i for r, i in periods if r == rank)
        momenta = [
            _local(s, "optimizer", slot_key(i, "momentum"), rank, world)
            for s in saves[first - 1 :]
            for i in mine
        ]
        codewords, problems = shadowing.codewords_in_use(
            momenta, [periods[rank, i] for s in saves[first - 1 :] for i in mine]
        )
        for p in problems:
            comparisons.problem(f"rank {rank}: {p}")
        for k in range(first, CONTINUATION + 1):
            before, after = saves[k - 1], saves[k]
            slots = []
            for i in mine:
                identity = before["optimizer"]["param_identities"][i]
                name = identity["name"]
                hypers = before["optimizer"]["param_group_hypers"][identity["group"]]
                grad = models.gradient(layout, name, models.DCP_STEPS + k, dtype=dtype)
                slots.append(
                    dict(
                        name=f"rank {rank} step {k} {name}",
                        period=periods[rank, i],
                        p0=_local(before, "model", name, rank, world),
                        p1=_local(after, "model", name, rank, world),
                        grad=restore_checks.local_rows(grad, rank, world),
                        m0=_local(before, "optimizer", slot_key(i, "momentum"), rank, world),
                        v0=_local(before, "optimizer", slot_key(i, "second_moment"), rank, world),
                        m1=_local(after, "optimizer", slot_key(i, "momentum"), rank, world),
                        v1=_local(after, "optimizer", slot_key(i, "second_moment"), rank, world),
                        step=int(before["optimizer"][slot_key(i, "step")]),
                        vmean_step=int(before["optimizer"][slot_key(i, "vmean_step")]),
                        **{key: float(hypers[key]) for key in HYPERPARAMETERS},
                    )
                )
            comparisons.merge(shadowing.dense_steps(slots, codewords))
    return comparisons


def _every_restore(test):
    """Needs DCP; once per restore path and dtype."""
    for mark in (
        pytest.mark.parametrize("dtype", list(DTYPES)),
        pytest.mark.parametrize("target", PATHS),
        pytest.mark.gefen_requires(DCP_RESHARD),
    ):
        test = mark(test)
    return test


def _continued_by_both(checkpoints, impl: Implementation, reference: Implementation, dtype, target):
    """The implementation's restore-and-continue, then (if it ran) the reference's: ``(theirs, ours,
    problems)``, ``ours`` None when the implementation's own run already failed."""
    theirs = _continued(checkpoints, impl, reference, dtype, target)
    problems = _failures(theirs)
    ours = None
    if not problems:
        ours = _continued(checkpoints, reference, reference, dtype, target)
        problems = _failures(ours)
    return theirs, ours, problems


def restore_comparisons(read, theirs: Continued, ours: Continued, bitwise: bool) -> Comparisons:
    """The restore into a stepped optimizer (SPEC 4.3.11 item 3): the model exact, the
    implementation's re-save against the reference's re-save of the same restore (SPEC 5.6.11)."""
    resaved = _after(read, theirs, 0)
    compared = _model(read(theirs.source), resaved)
    expected = _after(read, ours, 0)["optimizer"]
    compared.merge(checkpoint_compare.compare_restores(expected, resaved["optimizer"], bitwise=bitwise))
    return compared


def steps_comparisons(
    read, theirs: Continued, ours: Continued, bitwise: bool, dtype: str, target: Target
) -> Comparisons:
    """The steps after it (SPEC 4.3.11 item 5): every non-float entry of each re-save exact against
    the reference's; bitwise every re-save and the model, otherwise each step shadowed (SPEC 5.6.22)."""
    compared = Comparisons()
    for k in range(1, CONTINUATION + 1):
        expected, actual = _after(read, ours, k), _after(read, theirs, k)
        where = f"after {k} steps"
        _exact_entries(expected["optimizer"], actual["optimizer"], where, compared)
        if bitwise:  # every re-save and the model bit for bit (SPEC 3.8.2)
            compared.merge(
                checkpoint_compare.compare_restores(
                    expected["optimizer"], actual["optimizer"], bitwise=True, where=where
                )
            )
            for name, value in expected["model"].items():
                what = f"continuation: model parameters ({dtype})"
                compared.add(
                    bitwise_comparison(what, value, actual["model"].get(name), label=f"{where}: {name}")
                )
    if compared.ok and not bitwise:
        compared.merge(_shadowed(read, theirs, ours, target, DTYPES[dtype]))
    return compared


class ContinuationCase:
    """A restore into a stepped optimizer and its continuation as a replayable case (kind
    ``continuation``, SPEC 4.5.6): the reference's checkpoint (its files), the dtype, the restore path
    (variant and world size) and the check (``restore`` or ``steps``); replayed on the active
    launcher, both sides restoring and continuing again."""

    kind = "continuation"
    ranks = True

    def __init__(self, check: str, dtype: str, target: Target, files: dict | None = None, source=None):
        if check not in ("restore", "steps") or dtype not in DTYPES or target.variant not in VARIANTS:
            raise ValueError(
                f"continuation case: check {check!r}, dtype {dtype!r}, variant {target.variant!r}"
            )
        self.check, self.dtype, self.target, self._files, self._source = check, dtype, target, files, source

    def payload(self) -> dict:
        files = self._files if self._files is not None else restore_checks.pack(self._source)
        return {
            "kind": self.kind,
            "check": self.check,
            "dtype": self.dtype,
            "target": self.target.world,
            "variant": self.target.variant,
            "files": files,
        }

    @classmethod
    def from_payload(cls, payload: dict) -> ContinuationCase:
        target = Target(str(payload.get("variant", "stepped")), int(payload["target"]))
        return cls(payload["check"], payload["dtype"], target, files=dict(payload["files"]))

    def describe(self) -> str:
        variant = VARIANTS[self.target.variant]
        options = ", ".join(f"{k}={v!r}" for k, v in variant.options)
        return (
            f"continuation case ({self.check}): model {MODEL!r} in {self.dtype} saved by the reference on "
            f"{SOURCE} ranks after {variant.source_steps} steps, restored on {self.target.world} into an "
            f"optimizer{' built with ' + options if options else ''} stepped {len(STEPPED_BEFORE)} times, "
            f"then {CONTINUATION} steps"
        )

    def replay(self, impl, *, bitwise: bool) -> Comparisons:
        import functools
        import tempfile

        from gefen_conformance.harness import launch
        from gefen_conformance.implementations import registry

        reference = registry.resolve("reference")
        with tempfile.TemporaryDirectory(prefix="gefen-repro-continuation-") as scratch:
            source = restore_checks.unpack(self._files, Path(scratch) / "checkpoint")

            def continued(by, name):
                out = Path(scratch) / name
                args = (by, MODEL, self.dtype, str(source), str(out), self.target.variant)
                return Continued(
                    source, out, launch.run(restore_and_continue, self.target.world, args, timeout=TIMEOUT)
                )

            theirs = continued(impl, "implementation")
            failures = _failures(theirs)
            ours = None if failures else continued(reference, "reference")
            failures = failures or _failures(ours)
            if failures:
                out = Comparisons()
                for f in failures:
                    out.problem(f)
                return out
            read = functools.lru_cache(maxsize=None)(read_nested)
            if self.check == "restore":
                return restore_comparisons(read, theirs, ours, bitwise)
            return steps_comparisons(read, theirs, ours, bitwise, self.dtype, self.target)


@pytest.mark.gefen_clause("4.3.11", "3.6.4", "3.7.1", "2.3.6", "1.12.12", "5.6.11")
@_every_restore
def test_restore_into_a_stepped_optimizer(
    gefen_impl, gefen_reference, gefen_checkpoints, gefen_judge, dtype, target
):
    theirs, ours, problems = _continued_by_both(gefen_checkpoints, gefen_impl, gefen_reference, dtype, target)
    assert_no_problems(problems)
    read = _session_reader(gefen_checkpoints)
    case = ContinuationCase("restore", dtype, target, source=theirs.source)
    gefen_judge.assert_comparisons(restore_comparisons(read, theirs, ours, gefen_judge.bitwise), case=case)


@pytest.mark.gefen_clause("4.3.11", "3.6.5", "3.7.1", "2.3.6", "1.12.12", "5.6.22")
@_every_restore
def test_steps_after_the_restore(gefen_impl, gefen_reference, gefen_checkpoints, gefen_judge, dtype, target):
    theirs, ours, problems = _continued_by_both(gefen_checkpoints, gefen_impl, gefen_reference, dtype, target)
    assert_no_problems(problems)
    read = _session_reader(gefen_checkpoints)
    case = ContinuationCase("steps", dtype, target, source=theirs.source)
    compared = steps_comparisons(read, theirs, ours, gefen_judge.bitwise, dtype, target)
    gefen_judge.assert_comparisons(compared, case=case)

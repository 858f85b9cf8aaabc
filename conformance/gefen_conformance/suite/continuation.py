"""DCP restores into optimizers that have already stepped, and the steps after them (SPEC 4.3.11
items 3 and 5): what ``test_dcp_continuation.py`` runs and checks.

* the rank bodies: :func:`save_reference` (the reference trains :data:`MODEL` and saves it) and
  :func:`restore_and_continue` (a stepped optimizer restores a checkpoint, re-saves at once and
  after each of ``CONTINUATION`` steps);
* the steps, each made once per session in the ``gefen_checkpoints`` cache:
  :func:`trained_and_saved` (the reference's checkpoint on ``SOURCE`` ranks), then
  :func:`restored_and_continued` (one side's restore and continuation on a :class:`Target`; a
  rank that raised fails the test there); a test calls :func:`run_both`, which takes them for
  both sides;
* the checks: :func:`restore_comparisons` (the restore, SPEC 5.6.11) and
  :func:`steps_comparisons` (the steps after it, SPEC 5.6.22).

Everything written is read back by the independent reader (SPEC 5.1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations.contract import Implementation
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

    @property
    def source_steps(self) -> int:
        """The steps the reference trained the checkpoint this path restores for."""
        return VARIANTS[self.variant].source_steps


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
    """A restore of ``source`` by ``by`` on ``target`` in ``dtype`` and its continuation, re-saved
    under ``out/after<k>``; a :class:`ContinuationReport` per rank."""

    source: Path
    by: Implementation
    dtype: str
    target: Target
    out: Path
    reports: list

    def describe(self) -> str:
        """The restore and its continuation in words (a failed test's ``input``)."""
        variant = VARIANTS[self.target.variant]
        options = ", ".join(f"{k}={v!r}" for k, v in variant.options)
        return (
            f"model {MODEL!r} in {self.dtype} saved by the reference on {SOURCE} ranks after "
            f"{variant.source_steps} steps, restored by {self.by.name} on {self.target.world} into an "
            f"optimizer{' built with ' + options if options else ''} stepped {len(STEPPED_BEFORE)} times, "
            f"then {CONTINUATION} steps"
        )


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


# ---------------------------------------------------------------------------- the session's runs


def trained_and_saved(
    cache: checkpoints.Checkpoints, reference: Implementation, dtype: str, *, steps: int
) -> Path:
    """The reference's checkpoint of :data:`MODEL` in ``dtype`` after ``steps`` steps, trained and
    saved on ``SOURCE`` ranks (:func:`save_reference`; once per session)."""
    path = cache.directory("reference-saved", MODEL, dtype, f"w{SOURCE}", f"steps{steps}")

    def make():
        args = (reference, MODEL, dtype, str(path), steps)
        checkpoints.run(save_reference, SOURCE, args, timeout=TIMEOUT)
        return path

    return cache.once(("reference-saved", MODEL, dtype, SOURCE, steps), make)


def restored_and_continued(
    cache: checkpoints.Checkpoints, checkpoint: Path, *, by: Implementation, dtype: str, target: Target
) -> Continued:
    """``checkpoint`` restored by ``by`` on ``target`` into a stepped optimizer, re-saved at once and
    after each continuation step (:func:`restore_and_continue`; once per session). A rank whose
    load or re-save raised fails the test here: the run has nothing to compare."""
    out = cache.directory("continued", by, MODEL, dtype, f"w{SOURCE}", f"w{target.world}", target.variant)

    def make():
        args = (by, MODEL, dtype, str(checkpoint), str(out), target.variant)
        reports = checkpoints.run(restore_and_continue, target.world, args, timeout=TIMEOUT)
        return Continued(checkpoint, by, dtype, target, out, reports)

    continued = cache.once(("continued", by.spec, MODEL, dtype, SOURCE, target), make)
    assert_no_problems(failures(continued))
    return continued


def run_both(
    cache: checkpoints.Checkpoints,
    reference: Implementation,
    impl: Implementation,
    *,
    dtype: str,
    target: Target,
) -> tuple[Continued, Continued]:
    """``(reference, impl)``: the reference's checkpoint for ``target`` (:func:`trained_and_saved`)
    restored and continued by the implementation ``impl``, then by the reference
    (:func:`restored_and_continued`)."""
    checkpoint = trained_and_saved(cache, reference, dtype, steps=target.source_steps)
    by_impl = restored_and_continued(cache, checkpoint, by=impl, dtype=dtype, target=target)
    by_reference = restored_and_continued(cache, checkpoint, by=reference, dtype=dtype, target=target)
    return by_reference, by_impl


def failures(continued: Continued) -> list[str]:
    """Each rank whose load or re-save raised (the run's outcome then has nothing to compare)."""
    out = []
    for rank, report in enumerate(continued.reports):
        if report.load_error is not None:
            out.append(f"rank {rank}: the load raised {report.load_error}")
        elif report.save_error is not None:
            out.append(
                f"rank {rank}: the re-save after {report.save_error_after} steps raised {report.save_error}"
            )
    return out


def _session_reader(cache: checkpoints.Checkpoints):
    """Checkpoints read by the independent reader (SPEC 5.1), each once per session."""
    return lambda path: cache.once(("read", str(path)), lambda: read_nested(path))


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


def _first_codebook(impl_saves, reference_saves, periods, target: Target, dtype, comparisons) -> None:
    """After a restore that left no codebook, the first step learns one from this rank's gradients
    (SPEC 3.6.3). The dense re-save shows the codewords in use; they are judged as SPEC 5.6.7 judges
    a learned codebook, by their quantization cost on the histogram of the step's gradients at the
    reference's periods, against the reference's codewords in use on the same rank (SPEC 5.6.23)."""
    from gefen_oracles import codebook_quality

    layout = MODELS[MODEL]
    for rank in range(target.world):
        held = sorted(i for r, i in periods if r == rank)
        if not held:
            continue
        names = [impl_saves[1]["optimizer"]["param_identities"][i]["name"] for i in held]
        rank_periods = [periods[rank, i] for i in held]
        grads = [
            restore_checks.local_rows(
                models.gradient(layout, n, models.DCP_STEPS + 1, dtype=dtype), rank, target.world
            )
            for n in names
        ]
        counts = codebook_quality.histogram(zip(grads, rank_periods))

        def in_use(save):
            momenta = [_local(save, "optimizer", slot_key(i, "momentum"), rank, target.world) for i in held]
            return shadowing.codewords_in_use(momenta, rank_periods)

        impl, problems = in_use(impl_saves[1])
        reference, _ = in_use(reference_saves[1])
        for p in problems:
            comparisons.problem(f"rank {rank}: {p}")
        what = f"continuation: rank {rank}'s codebook learned at the first step after the restore"
        compared = codebook_quality.compare_in_use(what, reference, impl, counts)
        comparisons.add(compared)


def _shadowed(read, reference: Continued, impl: Continued) -> Comparisons:
    """SPEC 5.6.22: each continuation step of each rank of the implementation's run from its
    re-saves before and after it (after a checkpoint saved before any step, the first step learns
    the codebook and is judged by it, against the reference's)."""
    layout = MODELS[MODEL]
    target, dtype = impl.target, DTYPES[impl.dtype]
    world = target.world
    saves = [_after(read, impl, k) for k in range(CONTINUATION + 1)]
    periods = _periods(read(impl.source), target, dtype)
    comparisons = Comparisons()
    first = 1
    if target.source_steps == 0:
        reference_saves = [_after(read, reference, k) for k in range(2)]
        _first_codebook(saves, reference_saves, periods, target, dtype, comparisons)
        first = 2
    for rank in range(world):
        held = sorted(i for r, i in periods if r == rank)
        momenta = [
            _local(s, "optimizer", slot_key(i, "momentum"), rank, world)
            for s in saves[first - 1 :]
            for i in held
        ]
        codewords, problems = shadowing.codewords_in_use(
            momenta, [periods[rank, i] for s in saves[first - 1 :] for i in held]
        )
        for p in problems:
            comparisons.problem(f"rank {rank}: {p}")
        for k in range(first, CONTINUATION + 1):
            before, after = saves[k - 1], saves[k]
            slots = []
            for i in held:
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


def restore_comparisons(
    cache: checkpoints.Checkpoints, reference: Continued, impl: Continued, bitwise: bool
) -> Comparisons:
    """The restore into a stepped optimizer (SPEC 4.3.11 item 3): the model exact, the
    implementation's re-save against the reference's re-save of the same restore (SPEC 5.6.11)."""
    read = _session_reader(cache)
    resaved = _after(read, impl, 0)
    compared = _model(read(impl.source), resaved)
    expected = _after(read, reference, 0)["optimizer"]
    compared.merge(checkpoint_compare.compare_restores(expected, resaved["optimizer"], bitwise=bitwise))
    return compared


def steps_comparisons(
    cache: checkpoints.Checkpoints, reference: Continued, impl: Continued, bitwise: bool
) -> Comparisons:
    """The steps after it (SPEC 4.3.11 item 5): every non-float entry of each re-save exact against
    the reference's; bitwise every re-save and the model, otherwise each step shadowed (SPEC 5.6.22)."""
    read = _session_reader(cache)
    compared = Comparisons()
    for k in range(1, CONTINUATION + 1):
        expected, actual = _after(read, reference, k), _after(read, impl, k)
        where = f"after {k} steps"
        _exact_entries(expected["optimizer"], actual["optimizer"], where, compared)
        if bitwise:  # every re-save and the model bit for bit (SPEC 3.8.2)
            compared.merge(
                checkpoint_compare.compare_restores(
                    expected["optimizer"], actual["optimizer"], bitwise=True, where=where
                )
            )
            for name, value in expected["model"].items():
                what = f"continuation: model parameters ({impl.dtype})"
                compared.add(
                    bitwise_comparison(what, value, actual["model"].get(name), label=f"{where}: {name}")
                )
    if compared.ok and not bitwise:
        compared.merge(_shadowed(read, reference, impl))
    return compared

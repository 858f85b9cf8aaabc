"""DCP restores of a bf16 model with a slot above 64Ki elements into optimizers that have already
stepped, across world sizes, each followed by several steps (SPEC 4.3.11 items 3 and 5, 3.6, 3.7,
2.3.6 item 4, 5.6.11, 5.6.22).

The reference trains :data:`gefen_conformance.workload.models.WIDE` in bf16 on ``SOURCE`` ranks and saves
it. On each target world size, the implementation and the reference each build an optimizer over
other parameter values with other hyperparameters, step it twice on another gradient stream (its
codebook, counters and anything derived from them are then stale), restore the checkpoint with
``dcp.load`` (model and optimizer), re-save at once, and take ``CONTINUATION`` steps on the
checkpoint's gradient stream, re-saving after each. Everything is read back by the independent
reader (SPEC 5.1).

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
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from gefen_conformance import workload
from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations.contract import DCP_RESHARD, Implementation
from gefen_conformance.judging import assert_no_problems
from gefen_conformance.suite import checkpoints, restore_checks
from gefen_oracles import checkpoint_compare, shadowing
from gefen_oracles.checkpoint_reader import read_nested
from gefen_oracles.gefen_schema import slot_key
from gefen_oracles.numeric import Comparison, Comparisons, bitwise_comparison

MODEL = "wide"
MODELS = {MODEL: workload.WIDE}
DTYPES = {"bf16": torch.bfloat16}
SOURCE = 2
PATHS = [pytest.param(1, id="2->1"), pytest.param(3, id="2->3")]
#: Steps the target optimizer takes on another stream before it loads.
STEPPED_BEFORE = range(1, 3)
CONTINUATION = 3
#: Bound of each rank call (SPEC 4.2.2): a first step or a restore of the 67584-element slot learns
#: periods and a codebook from it (about a second on a quiet 2-core machine, several times the small
#: scenarios' work), so these calls get three times the shared bound.
TIMEOUT = 3 * checkpoints.TIMEOUT
HYPERPARAMETERS = ("lr", "beta1", "beta2", "eps", "weight_decay")


# ------------------------------------------------------------------------------ rank bodies


def save_reference(impl: Implementation, model: str, dtype: str, path: str) -> None:
    """The reference ``impl`` trains ``model`` in ``dtype`` for steps 1..DCP_STEPS and saves model and
    optimizer."""
    layout = MODELS[model]
    params = workload.parameters(layout, dtype=DTYPES[dtype], mesh=world_mesh())
    optimizer = impl.make_optimizer(workload.param_groups(layout, params), factored_v_2d=False)
    workload.train(layout, optimizer, params, range(1, workload.DCP_STEPS + 1))
    workload.save(impl, optimizer, path, params=params)


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
    impl: Implementation, model: str, dtype: str, path: str, out: str
) -> ContinuationReport:
    """A stepped optimizer of ``impl`` restores ``path``, re-saves to ``out/after0``, then steps
    ``CONTINUATION`` times on the checkpoint's stream, re-saving to ``out/after<k>`` (collective)."""
    layout = MODELS[model]
    params = workload.parameters(layout, dtype=DTYPES[dtype], mesh=world_mesh(), salt="target")
    optimizer = impl.make_optimizer(
        workload.param_groups(layout, params, workload.TARGET_HYPERS), factored_v_2d=False
    )
    workload.train(workload.other_stream(layout), optimizer, params, STEPPED_BEFORE)
    try:
        workload.load(impl, optimizer, path, params=params)
    except Exception as exc:  # the outcome is the result
        return ContinuationReport(load_error=checkpoints.RaisedError.of(exc))
    for k in range(CONTINUATION + 1):
        if k:
            workload.train(layout, optimizer, params, [workload.DCP_STEPS + k])
        try:
            workload.save(impl, optimizer, os.path.join(out, f"after{k}"), params=params)
        except Exception as exc:  # reported; later re-saves are not attempted
            return ContinuationReport(save_error=checkpoints.RaisedError.of(exc), save_error_after=k)
    return ContinuationReport()


# -------------------------------------------------------------------------------- the cache


def _checkpoint(saved: checkpoints.Checkpoints, reference: Implementation, dtype: str):
    path = saved.directory("reference-saved", MODEL, dtype, f"w{SOURCE}")

    def make():
        checkpoints.run(save_reference, SOURCE, (reference, MODEL, dtype, str(path)), timeout=TIMEOUT)
        return path

    return saved.once(("reference-saved", MODEL, dtype, SOURCE), make)


def _continued(
    saved: checkpoints.Checkpoints, impl: Implementation, reference: Implementation, dtype: str, target: int
) -> Continued:
    source = _checkpoint(saved, reference, dtype)
    out = saved.directory("continued", impl, MODEL, dtype, f"w{SOURCE}", f"w{target}")

    def make():
        reports = checkpoints.run(
            restore_and_continue, target, (impl, MODEL, dtype, str(source), str(out)), timeout=TIMEOUT
        )
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


def _periods(checkpoint: dict, target: int) -> dict:
    """``{(rank, slot): period}`` of every slot a rank restores with momentum, by the reference's
    rule on the checkpoint's dense second moment (SPEC 3.6.2; periods are exact, SPEC 5.6.11)."""
    from gefen_reference.dcp.reblock import period_for
    from gefen_reference.periods import PeriodRules

    rules = PeriodRules(False, False, ())
    optimizer = checkpoint["optimizer"]
    out = {}
    for i, identity in enumerate(optimizer["param_identities"]):
        if int(optimizer[slot_key(i, "initialized")]) != 1:
            continue
        for rank in range(target):
            second = restore_checks.local_rows(optimizer[slot_key(i, "second_moment")], rank, target)
            if second.numel():
                out[rank, i] = period_for(rules, identity["name"], identity["shape"], second)
    return out


def _shadowed(read, continued: Continued, target: int, dtype: torch.dtype) -> Comparisons:
    """SPEC 5.6.22: each continuation step of each rank from the re-saves before and after it."""
    layout = MODELS[MODEL]
    saves = [_after(read, continued, k) for k in range(CONTINUATION + 1)]
    periods = _periods(read(continued.source), target)
    comparisons = Comparisons()
    for rank in range(target):
        mine = sorted(i for r, i in periods if r == rank)
        momenta = [
            restore_checks.local_rows(s["optimizer"][slot_key(i, "momentum")], rank, target)
            for s in saves
            for i in mine
        ]
        codewords, problems = shadowing.codewords_in_use(
            momenta, [periods[rank, i] for s in saves for i in mine]
        )
        for p in problems:
            comparisons.problem(f"rank {rank}: {p}")
        for k in range(1, CONTINUATION + 1):
            before, after = saves[k - 1], saves[k]
            slots = []
            for i in mine:
                identity = before["optimizer"]["param_identities"][i]
                name = identity["name"]
                hypers = before["optimizer"]["param_group_hypers"][identity["group"]]
                grad = workload.gradient(layout, name, workload.DCP_STEPS + k, dtype=dtype)
                slots.append(
                    dict(
                        name=f"rank {rank} step {k} {name}",
                        period=periods[rank, i],
                        p0=restore_checks.local_rows(before["model"][name], rank, target),
                        p1=restore_checks.local_rows(after["model"][name], rank, target),
                        grad=restore_checks.local_rows(grad, rank, target),
                        m0=restore_checks.local_rows(
                            before["optimizer"][slot_key(i, "momentum")], rank, target
                        ),
                        v0=restore_checks.local_rows(
                            before["optimizer"][slot_key(i, "second_moment")], rank, target
                        ),
                        m1=restore_checks.local_rows(
                            after["optimizer"][slot_key(i, "momentum")], rank, target
                        ),
                        v1=restore_checks.local_rows(
                            after["optimizer"][slot_key(i, "second_moment")], rank, target
                        ),
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
    read, theirs: Continued, ours: Continued, bitwise: bool, dtype: str, target: int
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
        compared.merge(_shadowed(read, theirs, target, DTYPES[dtype]))
    return compared


class ContinuationCase:
    """A restore into a stepped optimizer and its continuation as a replayable case (kind
    ``continuation``, SPEC 4.5.6): the reference's checkpoint (its files), the dtype and target world
    size, and the check (``restore`` or ``steps``); replayed on the active launcher, both sides
    restoring and continuing again."""

    kind = "continuation"
    ranks = True

    def __init__(self, check: str, dtype: str, target: int, files: dict | None = None, source=None):
        if check not in ("restore", "steps") or dtype not in DTYPES:
            raise ValueError(f"continuation case: check {check!r}, dtype {dtype!r}")
        self.check, self.dtype, self.target, self._files, self._source = check, dtype, target, files, source

    def payload(self) -> dict:
        files = self._files if self._files is not None else restore_checks.pack(self._source)
        return {
            "kind": self.kind,
            "check": self.check,
            "dtype": self.dtype,
            "target": self.target,
            "files": files,
        }

    @classmethod
    def from_payload(cls, payload: dict) -> ContinuationCase:
        return cls(payload["check"], payload["dtype"], int(payload["target"]), files=dict(payload["files"]))

    def describe(self) -> str:
        return (
            f"continuation case ({self.check}): model {MODEL!r} in {self.dtype} saved by the reference on "
            f"{SOURCE} ranks, restored on {self.target} into an optimizer stepped {len(STEPPED_BEFORE)} "
            f"times, then {CONTINUATION} steps"
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
                args = (by, MODEL, self.dtype, str(source), str(out))
                return Continued(
                    source, out, launch.run(restore_and_continue, self.target, args, timeout=TIMEOUT)
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

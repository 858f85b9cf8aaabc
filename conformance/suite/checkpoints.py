"""The trained checkpoints and restore checks shared by the DCP scenarios (SPEC 4.3.2-4.3.6, 3.7).

Not collected. Several scenario modules use what is here, by name:

* :func:`run`: a rank body on the active launcher (``gefen_conformance.harness.launch``), the test skipped
  with the launcher's reason when the scenario needs more ranks than it runs (SPEC 4.2.7);
* the rank bodies :func:`save_trained` (train the DCP model and save it) and
  :func:`restore_report` (restore a checkpoint at another world size, re-save, continue);
* :class:`Checkpoints`, the session's cache of their results (the ``gefen_checkpoints`` fixture): a
  checkpoint is trained and saved once per session and read by every module that needs it;
* the checks run in the test process on a restore: model parameters, continuation, re-save
  (reshard and interop).

Everything written is read back through the independent oracles only
(``oracles.checkpoint_reader``, ``oracles.gefen_schema``, ``oracles.digests``), never through
an implementation's loader. Rank bodies receive the implementation itself (it travels to a rank
as its ``--impl`` spec and is resolved there once per process, SPEC 4.2.5) and take their mesh and
group from ``gefen_conformance.harness.world.current()``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from gefen_conformance.harness import launch
from gefen_conformance.plugin import observations
from gefen_conformance.implementations.contract import Implementation
from gefen_conformance import workload
from gefen_conformance.harness.pool import RankFailure
from gefen_conformance.harness.sharding import world_mesh
from gefen_oracles import checkpoint_compare
from gefen_oracles import gefen_schema
from gefen_oracles.checkpoint_reader import read_nested

from gefen_conformance.suite import margins

TIMEOUT = 60.0
CONTINUATION_BOUND = 5e-3  # SPEC 3.7.3, 5.3.3
# Re-quantized momentum (SPEC 3.7.2): the restore learns a new codebook from the momentum it
# restores, so each element moves to its nearest codeword times its new block's magnitude. We
# assert at most half of the mean gap of 256 levels over [-1, 1] (1/255 ~ 2^-8) of the slot's
# largest magnitude; measured on this workload: at most 2.5e-4 of it.
MOMENTUM_BOUND = 1.0 / 255.0
# The second moment is re-aggregated into block means (SPEC 3.6.4): elementwise it is exact only
# in the aligned and coarsening regimes (SPEC 3.7.2, lossy otherwise, measured up to 0.66
# relative here), but in every regime a block mean keeps its block's sum, and lies within the
# range of the values it averages. Asserted: each slot's sum within this relative bound, and
# every element within the original slot's [min, max] (up to fp32 rounding).
SECOND_MOMENT_SUM_RTOL = 1e-5
FP32_RTOL = 1e-6


def run(fn, world_size: int, args=(), *, timeout: float = TIMEOUT, **options) -> list:
    """``launch.run(fn, world_size, args)``; skips the calling test, with the launcher's reason and
    marked as not run here (the run is then ``partial``), when the active launcher cannot run
    ``world_size`` ranks."""
    launch.skip_unless_fits(world_size)
    return launch.run(fn, world_size, args, timeout=timeout, **options)


@dataclass(frozen=True)
class RaisedError:
    """An exception a rank body expected, returned as its result: picklable whatever the exception
    was, and checked by class name (``is_a``), since the class may not exist in the test process."""

    type: str
    classes: tuple  # the names of the exception's class and its bases (its MRO)
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> "RaisedError":
        return cls(type(exc).__name__, tuple(c.__name__ for c in type(exc).__mro__), str(exc))

    def is_a(self, kind: type) -> bool:
        """True when the exception was a ``kind`` (or a subclass of it)."""
        return kind.__name__ in self.classes

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


@dataclass
class RestoreReport:
    """One rank's account of :func:`restore_report`. ``load_error`` set: the load failed and
    nothing else was done; otherwise the restored full parameters, the re-save's error (None when
    it succeeded) and the continuation's max-abs difference from the native run per parameter,
    with that of an optimizer that restored nothing (``unrestored``, the bound's teeth)."""

    load_error: Optional[RaisedError] = None
    full_params: dict = field(default_factory=dict)
    resave_error: Optional[RaisedError] = None
    continuation: dict = field(default_factory=dict)
    unrestored: dict = field(default_factory=dict)


@dataclass
class Restore:
    """A checkpoint saved at one world size (``source``, with the ``saved_params`` it was saved
    from) restored at another: each rank's :class:`RestoreReport` and where the restored state was
    saved again (``resave``)."""

    source: Path
    saved_params: dict
    resave: Path
    reports: list


# ------------------------------------------------------------------------------ rank bodies


def save_trained(impl: Implementation, model: str, path: str) -> dict:
    """Train ``model`` with ``impl`` and save model and optimizer; the saved full params."""
    params, optimizer = workload.trained(impl, workload.DCP_MODELS[model], world_mesh())
    workload.save(impl, optimizer, path, params=params)
    return workload.full_params(params)


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if b.numel() else 0.0


def restore_report(impl: Implementation, model: str, path: str, resave_path: str) -> RestoreReport:
    """Restore ``path`` at this world size with ``impl`` and report (collective).

    1. A native run: the same implementation trained from scratch here on the same gradient
       stream for steps 1..K, its local parameters recorded, then step K+1.
    2. A fresh optimizer (other hyperparameters, other parameter values) restored with
       ``dcp.load`` of model and optimizer; its full parameters are reported.
    3. The restored state saved again at once with the implementation's adapter to
       ``resave_path`` (read back by the test through the independent reader).
    4. The continuation: the restored parameters are set to the native run's after step K and
       one step is taken on gradient K+1; the max-abs difference from the native run after step
       K+1 is reported per parameter (SPEC 3.7.3).
    A failed load is reported (type, message) instead of 2-4.
    """
    layout = workload.DCP_MODELS[model]
    mesh = world_mesh()
    next_step = [workload.DCP_STEPS + 1]
    native_params, native = workload.trained(impl, layout, mesh)
    before = {n: p.detach().to_local().clone() for n, p in native_params.items()}
    workload.train(layout, native, native_params, next_step)
    after = {n: workload.to_cpu(p.to_local()) for n, p in native_params.items()}

    params = workload.parameters(layout, mesh=mesh, salt="target")
    optimizer = impl.make_optimizer(workload.param_groups(layout, params, workload.TARGET_HYPERS),
                                    factored_v_2d=False)
    try:
        workload.load(impl, optimizer, path, params=params)
    except Exception as exc:  # the outcome is the result
        return RestoreReport(load_error=RaisedError.of(exc))
    report = RestoreReport(full_params=workload.full_params(params))
    try:
        workload.save(impl, optimizer, resave_path, params=params)
    except Exception as exc:  # reported; the continuation still runs
        report.resave_error = RaisedError.of(exc)

    def continue_from_native(stepping, stepped_params) -> dict:
        with torch.no_grad():
            for n, p in stepped_params.items():
                p.to_local().copy_(before[n])
        workload.train(layout, stepping, stepped_params, next_step)
        return {n: _max_abs(workload.to_cpu(p.to_local()), after[n]) for n, p in stepped_params.items()}

    report.continuation = continue_from_native(optimizer, params)
    # Teeth of the bound: the same step from the same parameters by an optimizer that restored
    # nothing (only its hyperparameters set to the saved ones).
    blank_params = workload.parameters(layout, mesh=mesh, salt="blank")
    blank = impl.make_optimizer(workload.param_groups(layout, blank_params), factored_v_2d=False)
    report.unrestored = continue_from_native(blank, blank_params)
    return report


# ------------------------------------------------------------------------------------ cache


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text)


class Checkpoints:
    """Trained checkpoints and restore reports, each made once and shared by the DCP modules."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._made: dict = {}

    def once(self, key, make):
        """``make()`` the first time ``key`` is asked for; its value (or its failure on the ranks,
        raised again for every test that uses it) afterwards."""
        if key not in self._made:
            try:
                self._made[key] = (make(), None)
            except RankFailure as failure:
                self._made[key] = (None, failure)
        value, failure = self._made[key]
        if failure is not None:
            error = RuntimeError(f"{key} failed on the ranks (made once, reported by every test using it):\n{failure}")
            error.rank_failure = failure  # where each rank failed, for the certificate (SPEC 4.4.8)
            raise error
        return value

    def saved(self, impl: Implementation, model: str, world: int) -> tuple[Path, dict]:
        """``(directory, full params)`` of ``model`` trained and saved by ``impl`` on ``world`` ranks."""
        path = self.root / f"{_safe(impl.spec)}-{model}-w{world}"

        def make():
            values = run(save_trained, world, (impl, model, str(path)))
            return path, values[0]

        return self.once(("saved", impl.spec, model, world), make)

    def restored(self, loader: Implementation, saver: Implementation, model: str, source: int, target: int) -> Restore:
        """A checkpoint of ``saver`` at ``source`` ranks restored by ``loader`` at ``target`` ranks
        (see :func:`restore_report`)."""
        path, saved_params = self.saved(saver, model, source)
        resave = self.root / f"restore-{_safe(loader.spec)}-from-{path.name}-w{target}"

        def make():
            reports = run(restore_report, target, (loader, model, str(path), str(resave)))
            return Restore(path, saved_params, resave, reports)

        return self.once(("restored", loader.spec, saver.spec, model, source, target), make)

    def directory(self, *parts) -> Path:
        """A directory under the cache's root for ``parts`` (strings, or implementations by their
        spec; the same path every time)."""
        return self.root / "-".join(_safe(p.spec if isinstance(p, Implementation) else p) for p in parts)

    def scratch(self, name: str) -> Path:
        path = self.root / "scratch" / name
        path.mkdir(parents=True, exist_ok=False)
        return path


# ---------------------------------------------------------------------------- restore checks


def load_failures(restore: Restore) -> list[str]:
    return [f"rank {r}: the load raised {rep.load_error}"
            for r, rep in enumerate(restore.reports) if rep.load_error is not None]


def model_problems(restore: Restore) -> list[str]:
    """Restored model parameters (gathered) against those saved and those the oracle reads."""
    problems = []
    on_disk = read_nested(restore.source)["model"]
    differing = total = 0
    for rank, report in enumerate(restore.reports):
        for name, value in report.full_params.items():
            for what, expected in (("saved", restore.saved_params[name]), ("checkpoint", on_disk[name])):
                total += expected.numel()
                if value.dtype != expected.dtype or value.shape != expected.shape:
                    differing += expected.numel()
                    problems.append(f"rank {rank}: restored parameter {name} differs from the {what} one")
                elif not torch.equal(value, expected):
                    differing += int((value != expected).sum())
                    problems.append(f"rank {rank}: restored parameter {name} differs from the {what} one")
    # DCP copies the parameters' bytes: exact in every profile (SPEC 3.7.1)
    margins.exact("restored model parameters", differing, total)
    return problems


def continuation_problems(restore: Restore) -> list[str]:
    problems = []
    worst = max(e for rep in restore.reports for e in rep.continuation.values())
    observations.margin("continuation after reshard (max-abs)", error=worst, bound=CONTINUATION_BOUND)
    if not worst <= CONTINUATION_BOUND:
        where = [(r, n, e) for r, rep in enumerate(restore.reports) for n, e in rep.continuation.items()
                 if e > CONTINUATION_BOUND]
        problems.append(f"continuation max-abs error {worst:.3e} exceeds {CONTINUATION_BOUND} at (rank, param, error) {where}")
    blank = max(e for rep in restore.reports for e in rep.unrestored.values())
    if not blank > CONTINUATION_BOUND:
        problems.append(f"workload too weak: an optimizer that restored nothing is within the bound too ({blank:.3e})")
    return problems


def _scalar(value) -> int:
    return int(value.item()) if torch.is_tensor(value) else value


HEADER_SCALARS = ("format_version", "global_step", "deterministic", "slot_count", "group_count")
SLOT_SCALARS = ("initialized", "step", "vmean_step")


def resave_problems(original: dict, resaved: dict, bit_exact: bool) -> list[str]:
    """A checkpoint saved right after a restore, against the one restored (both nested optimizer
    dicts read by the oracle). Counters, identities and hyperparameters exact; dense state within
    the documented bounds (``MOMENTUM_BOUND``, ``SECOND_MOMENT_SUM_RTOL``); both schema-clean."""
    problems = [f"original: {p}" for p in gefen_schema.problems(original)]
    problems += [f"re-saved: {p}" for p in gefen_schema.problems(resaved)]
    before = len(problems)
    for key in HEADER_SCALARS:
        if _scalar(original.get(key)) != _scalar(resaved.get(key)):
            problems.append(f"{key}: {_scalar(resaved.get(key))} after the restore, {_scalar(original.get(key))} saved")
    for key in ("param_identities", "param_group_hypers"):
        if original.get(key) != resaved.get(key):
            problems.append(f"{key}: {resaved.get(key)!r} after the restore, {original.get(key)!r} saved")
    identities = original.get("param_identities") or []
    for i, identity in enumerate(identities):
        slot = f"slot {i} ({identity['name']})"
        for field in SLOT_SCALARS:
            key = gefen_schema.slot_key(i, field)
            a, b = _scalar(original.get(key)), _scalar(resaved.get(key))
            if a != b:
                problems.append(f"{slot}: {field} {b} after the restore, {a} saved")
    margins.exact("re-save after restore: header, identities, hyperparameters, counters", len(problems) - before,
                  len(HEADER_SCALARS) + 2 + len(SLOT_SCALARS) * len(identities))
    for i, identity in enumerate(identities):
        slot = f"slot {i} ({identity['name']})"
        m0, m1 = original.get(gefen_schema.slot_key(i, "momentum")), resaved.get(gefen_schema.slot_key(i, "momentum"))
        v0, v1 = (original.get(gefen_schema.slot_key(i, "second_moment")),
                  resaved.get(gefen_schema.slot_key(i, "second_moment")))
        if not all(torch.is_tensor(t) and t.shape == m0.shape for t in (m0, m1, v0, v1)):
            continue  # reported by the schema check
        problems += _dense_problems(slot, m0.double(), m1.double(), v0.double(), v1.double(), bit_exact)
    return problems


def _dense_problems(slot, m0, m1, v0, v1, bit_exact) -> list[str]:
    out = []
    if m0.numel() == 0:
        return out
    top = float(m0.abs().max())
    if top == 0.0 and float(v0.abs().max()) == 0.0:
        if bool(m1.any()) or bool(v1.any()):
            out.append(f"{slot}: fresh when saved, carries dense history after the restore")
        return out
    error = float((m1 - m0).abs().max())
    observations.margin("re-save after restore: momentum re-quantization (of max|m|)", error=error / top,
                        bound=MOMENTUM_BOUND)
    if error > MOMENTUM_BOUND * top:
        out.append(f"{slot}: momentum re-quantization error {error:.3e} exceeds {MOMENTUM_BOUND:.3e} x max|m| = "
                   f"{MOMENTUM_BOUND * top:.3e}")
    new_top = float(m1.abs().max())
    if bit_exact:
        margins.exact("re-save after restore: largest momentum magnitude", int(new_top != top), 1)
    else:
        observations.margin("re-save after restore: largest momentum magnitude (relative)",
                            error=abs(new_top - top) / top, bound=FP32_RTOL)
    if (new_top != top) if bit_exact else abs(new_top - top) > FP32_RTOL * top:
        out.append(f"{slot}: largest momentum magnitude {new_top!r} after the restore, {top!r} saved "
                   "(a block's largest element is the codeword +-1 times the block magnitude)")
    s0, s1 = float(v0.sum()), float(v1.sum())
    observations.margin("re-save after restore: second-moment sum (relative)",
                        error=abs(s1 - s0) / abs(s0) if s0 else abs(s1), bound=SECOND_MOMENT_SUM_RTOL)
    if abs(s1 - s0) > SECOND_MOMENT_SUM_RTOL * abs(s0):
        out.append(f"{slot}: second-moment sum {s1!r} after the restore, {s0!r} saved (block means keep block sums)")
    lo, hi = float(v0.min()), float(v0.max())
    outside = max(lo - float(v1.min()), float(v1.max()) - hi, 0.0) / max(hi, torch.finfo(torch.float64).tiny)
    observations.margin("re-save after restore: second moment within the saved range (relative)", error=outside,
                        bound=FP32_RTOL)
    if float(v1.min()) < lo * (1 - FP32_RTOL) or float(v1.max()) > hi * (1 + FP32_RTOL):
        out.append(f"{slot}: second moment leaves the saved range [{lo!r}, {hi!r}]: "
                   f"[{float(v1.min())!r}, {float(v1.max())!r}]")
    return out


def restore_problems(restore: Restore, bit_exact: bool, resave: bool = True) -> list[str]:
    """Everything checked after a restore; the load error alone when the load failed."""
    failures = load_failures(restore)
    if failures:
        return failures
    problems = model_problems(restore) + continuation_problems(restore)
    if resave:
        problems += resave_only_problems(restore, bit_exact)
    return problems


def resave_failures(restore: Restore) -> list[str]:
    """Why ``restore`` has no re-save to compare: its load failures, else each rank whose re-save raised."""
    return load_failures(restore) or [f"rank {r}: re-saving the restored state raised {rep.resave_error}"
                                      for r, rep in enumerate(restore.reports) if rep.resave_error is not None]


def resave_only_problems(restore: Restore, bit_exact: bool) -> list[str]:
    failures = resave_failures(restore)
    if failures:
        return failures
    original = read_nested(restore.source)
    resaved = read_nested(restore.resave)
    problems = resave_problems(original["optimizer"], resaved["optimizer"], bit_exact)
    return problems + model_resave_problems(original, resaved, "re-save after restore",
                                            "re-saved value differs from the restored checkpoint's")


def model_resave_problems(checkpoint: dict, resaved: dict, what: str, differs: str) -> list[str]:
    """Every model parameter of ``resaved`` bit for bit the checkpoint's (SPEC 3.7.1), recorded as
    the exact margin ``"<what>: model parameters"``; one problem line per parameter that ``differs``."""
    differing, problems = 0, []
    for name, value in checkpoint["model"].items():
        again = resaved.get("model", {}).get(name)
        if not torch.is_tensor(again) or again.dtype != value.dtype or not torch.equal(again, value):
            differing += 1
            problems.append(f"model parameter {name}: {differs}")
    margins.exact(f"{what}: model parameters", differing, len(checkpoint["model"]))
    return problems


def restores_agree(reference_restore: Restore, impl_restore: Restore, bitwise: bool) -> list[str]:
    """One reference checkpoint restored at one world size by the reference and by the
    implementation, both re-saved at once: the two re-saves by SPEC 5.6.11
    (:func:`oracles.checkpoint_compare.compare_restores`)."""
    failures = resave_failures(impl_restore)
    if failures:
        return failures
    expected = read_nested(reference_restore.resave)["optimizer"]
    actual = read_nested(impl_restore.resave)["optimizer"]
    return margins.record(checkpoint_compare.compare_restores(expected, actual, bitwise=bitwise))

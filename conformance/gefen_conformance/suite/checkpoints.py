"""The trained checkpoints and restore checks shared by the DCP scenarios (SPEC 4.3.2-4.3.6, 3.7).

Not collected. Several scenario modules use what is here, by name:

* :func:`run`: a rank body on the active launcher (``gefen_conformance.harness.launch``), the test skipped
  with the launcher's reason when the scenario needs more ranks than it runs (SPEC 4.2.7);
  :func:`run_at_scale`: on the thread launcher (``gefen_conformance.harness.threads``), for worlds
  of tens or hundreds of ranks;
* the rank bodies :func:`save_trained` (train the DCP model and save it) and
  :func:`restore_report` (restore a checkpoint at another world size, re-save, continue);
* :class:`Checkpoints`, the session's cache of their results (the ``gefen_checkpoints`` fixture),
  whose steps a test calls in order: :meth:`Checkpoints.trained_and_saved` (a :class:`Saved`
  checkpoint, trained and saved once per session and read by every module that needs it), then
  :meth:`Checkpoints.restored` (a :class:`Restore` of it at another world size);
* the checks run in the test process on a restore live in
  :mod:`gefen_conformance.suite.restore_checks`.

Everything written is read back through the independent oracles only
(``gefen_oracles.checkpoint_reader``, ``gefen_oracles.gefen_schema``, ``gefen_oracles.digests``), never
through
an implementation's loader. Rank bodies receive the implementation itself (it travels to a rank
as its ``--impl`` spec and is resolved there once per process, SPEC 4.2.4) and take their mesh and
group from ``gefen_conformance.harness.world.current()``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gefen_conformance.harness import launch, threads
from gefen_conformance.harness.pool import RankFailure
from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations.contract import Implementation
from gefen_conformance.workload import models, saving

TIMEOUT = 60.0


def run(fn, world_size: int, args=(), *, timeout: float = TIMEOUT, **options) -> list:
    """``launch.run(fn, world_size, args)``; skips the calling test, with the launcher's reason and
    marked as not run here (the run is then ``partial``), when the active launcher cannot run
    ``world_size`` ranks."""
    launch.skip_unless_fits(world_size)
    return launch.run(fn, world_size, args, timeout=timeout, **options)


#: the deadline of a call at scale (quiet seconds; 64 thread ranks save or restore in about 5)
SCALE_TIMEOUT = 120.0


def run_at_scale(fn, world_size: int, args, *, impl: Implementation, timeout: float = SCALE_TIMEOUT) -> list:
    """``fn`` on ``world_size`` ranks as threads of one process (the thread launcher), with
    ``impl`` among ``args``. When ``impl`` is not thread-safe (``Implementation.thread_safe``) or
    the thread launcher cannot run here, on the active launcher instead (:func:`run`: skipped when
    that one cannot run ``world_size`` ranks either), and the test's output says why."""
    why = threads.unfit(world_size)
    if not impl.thread_safe:
        why = f"{impl.name} declares that it is not thread-safe (Implementation.thread_safe)"
    if why is None:
        return launch.run_on(threads.ThreadLauncher(), fn, world_size, args, timeout=timeout)
    print(f"{world_size} ranks on the {launch.execution().launcher} launcher, not as threads: {why}")
    return run(fn, world_size, args, timeout=timeout)


@dataclass(frozen=True)
class RaisedError:
    """An exception a rank body expected, returned as its result: picklable whatever the exception
    was, and checked by class name (``is_a``), since the class may not exist in the test process."""

    type: str
    classes: tuple  # the names of the exception's class and its bases (its MRO)
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> RaisedError:
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

    load_error: RaisedError | None = None
    full_params: dict = field(default_factory=dict)
    resave_error: RaisedError | None = None
    continuation: dict = field(default_factory=dict)
    unrestored: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Saved:
    """A checkpoint of ``model`` trained and saved by ``saver`` on ``ranks`` ranks, at ``path``, with
    the full parameters it saved."""

    saver: Implementation
    model: str
    ranks: int
    path: Path
    params: dict


@dataclass
class Restore:
    """A :class:`Saved` checkpoint restored by ``loader`` on ``ranks`` ranks: each rank's
    :class:`RestoreReport` and where the restored state was saved again (``resave``)."""

    saved: Saved
    loader: Implementation
    ranks: int
    resave: Path
    reports: list

    def describe(self) -> str:
        """The restore in words (a failed test's ``input``)."""
        saved = self.saved
        return (
            f"model {saved.model!r} trained and saved by {saved.saver.name} on {saved.ranks} rank(s), "
            f"restored by {self.loader.name} on {self.ranks}"
        )


# ------------------------------------------------------------------------------ rank bodies


def save_trained(impl: Implementation, model: str, path: str) -> dict:
    """Train ``model`` with ``impl`` and save model and optimizer; the saved full params."""
    params, optimizer = saving.trained(impl, models.DCP_MODELS[model], world_mesh())
    saving.save(impl, optimizer, path, params=params)
    return models.full_params(params)


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
    layout = models.DCP_MODELS[model]
    mesh = world_mesh()
    next_step = [models.DCP_STEPS + 1]
    native_params, native = saving.trained(impl, layout, mesh)
    before = {n: p.detach().to_local().clone() for n, p in native_params.items()}
    models.train(layout, native, native_params, next_step)
    after = {n: models.to_cpu(p.to_local()) for n, p in native_params.items()}

    params = models.parameters(layout, mesh=mesh, salt="target")
    optimizer = impl.make_optimizer(
        models.param_groups(layout, params, models.TARGET_HYPERS), factored_v_2d=False
    )
    try:
        saving.load(impl, optimizer, path, params=params)
    except Exception as exc:  # the outcome is the result
        return RestoreReport(load_error=RaisedError.of(exc))
    report = RestoreReport(full_params=models.full_params(params))
    try:
        saving.save(impl, optimizer, resave_path, params=params)
    except Exception as exc:  # reported; the continuation still runs
        report.resave_error = RaisedError.of(exc)

    def continue_from_native(stepping, stepped_params) -> dict:
        with torch.no_grad():
            for n, p in stepped_params.items():
                p.to_local().copy_(before[n])
        models.train(layout, stepping, stepped_params, next_step)
        return {n: _max_abs(models.to_cpu(p.to_local()), after[n]) for n, p in stepped_params.items()}

    report.continuation = continue_from_native(optimizer, params)
    # Teeth of the bound: the same step from the same parameters by an optimizer that restored
    # nothing (only its hyperparameters set to the saved ones).
    blank_params = models.parameters(layout, mesh=mesh, salt="blank")
    blank = impl.make_optimizer(models.param_groups(layout, blank_params), factored_v_2d=False)
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
            error = RuntimeError(
                f"{key} failed on the ranks (made once, reported by every test using it):\n{failure}"
            )
            error.rank_failure = failure  # where each rank failed, for the certificate (SPEC 4.4.8)
            raise error
        return value

    def trained_and_saved(
        self, saver: Implementation, model: str, *, ranks: int, at_scale: bool = False
    ) -> Saved:
        """``model`` trained and saved by ``saver`` on ``ranks`` ranks (:func:`save_trained`); with
        ``at_scale``, by :func:`run_at_scale`."""
        path = self.root / f"{_safe(saver.spec)}-{model}-w{ranks}"

        def make():
            if at_scale:
                values = run_at_scale(save_trained, ranks, (saver, model, str(path)), impl=saver)
            else:
                values = run(save_trained, ranks, (saver, model, str(path)))
            return Saved(saver, model, ranks, path, values[0])

        return self.once(("saved", saver.spec, model, ranks), make)

    def restored(self, saved: Saved, *, by: Implementation, ranks: int, at_scale: bool = False) -> Restore:
        """``saved`` restored by ``by`` on ``ranks`` ranks, re-saved at once and continued one step
        (:func:`restore_report`); with ``at_scale``, by :func:`run_at_scale`."""
        resave = self.root / f"restore-{_safe(by.spec)}-from-{saved.path.name}-w{ranks}"

        def make():
            args = (by, saved.model, str(saved.path), str(resave))
            if at_scale:
                reports = run_at_scale(restore_report, ranks, args, impl=by)
            else:
                reports = run(restore_report, ranks, args)
            return Restore(saved, by, ranks, resave, reports)

        return self.once(("restored", by.spec, saved.saver.spec, saved.model, saved.ranks, ranks), make)

    def directory(self, *parts) -> Path:
        """A directory under the cache's root for ``parts`` (strings, or implementations by their
        spec; the same path every time)."""
        return self.root / "-".join(_safe(p.spec if isinstance(p, Implementation) else p) for p in parts)

    def scratch(self, name: str) -> Path:
        path = self.root / "scratch" / name
        path.mkdir(parents=True, exist_ok=False)
        return path

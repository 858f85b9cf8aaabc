"""One suite run inside a pytest session: what it selected, what ran, and its certificate (SPEC 4.4).

Created by the plugin only when the suite is being run. It owns the run's side effects and undoes
them in :meth:`SuiteRun.close`: the hypothesis profile (:mod:`.hypothesis_profiles`), the signal
handlers (:mod:`.interrupts`) and the census process (:mod:`.selection`).
"""

from __future__ import annotations

import gc
import logging
import shlex
import time
from pathlib import Path

import pytest

from gefen_conformance.certificate import build as certificate
from gefen_conformance.exit_codes import ExitCode
from gefen_conformance.implementations.contract import Implementation
from gefen_conformance.plugin import options, selection
from gefen_conformance.plugin.hypothesis_profiles import HypothesisProfile
from gefen_conformance.plugin.interrupts import InterruptGuard, leave_process


class SuiteRun:
    """State of the suite run in this process (the controller's, or a worker's under xdist)."""

    def __init__(self, config: pytest.Config, impl: Implementation, guard: InterruptGuard):
        self.config = config
        self.impl = impl
        self.is_worker = hasattr(config, "workerinput")
        self.guard = guard  # installed already
        self.hypothesis_profile = HypothesisProfile(config.getoption("hypothesis_profile", None))
        self.tier = options.tier(config)
        self.census = selection.SuiteCensus(self.tier)
        # spec: the --impl value as given, so that the rerun commands of the reports name it (SPEC 4.5.5)
        self.record = certificate.RunRecord(
            implementation={
                "name": impl.name,
                "version": impl.version,
                "capabilities": sorted(c.value for c in impl.capabilities),
                "extended_options": sorted(impl.extended_options),
                "spec": str(config.option.impl or impl.name),
            }
        )
        self.collected_ids: list[str] | None = None  # suite items before deselection (this process)
        self.deselected = 0
        self.written: tuple[Path, Path | None, dict] | None = None
        self._quieted: list = []
        self.warm_up_report: dict | None = None  # this process's warm-up, until a test report carries it
        self.exit_status: int | None = None  # the verdict's exit status, once the certificate is built
        self._progress: object | None = None
        self._progress_decided = False
        self._frozen = False

    @property
    def progress(self):
        """The run's progress lines (SPEC 4.4.11), or None: written by the process that reports the
        tests (not an xdist worker), not under ``-q`` or ``--collect-only``, and only to a terminal
        reporter. Decided on first use, once pytest's terminal reporter exists (after configure)."""
        if not self._progress_decided:
            self._progress_decided = True
            self._progress = self._make_progress()
        return self._progress

    def _make_progress(self):
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if (
            self.is_worker
            or reporter is None
            or self.config.option.collectonly
            or int(getattr(self.config.option, "verbose", 0) or 0) < 0
        ):
            return None
        from gefen_conformance.plugin.progress import Progress

        def write(text: str) -> None:
            if reporter.currentfspath:
                reporter.ensure_newline()
            elif getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")  # xdist's dots carry no path: end their line first
            reporter.write_line(text, cyan=True)

        return Progress(write)

    # -- lifetime ----------------------------------------------------------------------------

    def open(self) -> None:
        self.hypothesis_profile.enter()
        if not self.is_worker and not self.config.option.collectonly:
            # the suite's identity (file hashes, git state: seconds of git on a loaded machine) is
            # taken as the run starts, off the main thread, so that finishing, interrupted or not,
            # does not wait for it
            import threading

            self._suite_facts_thread = threading.Thread(
                target=self._take_suite_facts, daemon=True, name="gefen-suite-facts"
            )
            self._suite_facts_thread.start()

    def _take_suite_facts(self) -> None:
        try:
            self._suite_facts = certificate.suite_facts()
        except Exception as exc:  # noqa: BLE001 - the certificate says it could not be taken
            self._suite_facts_error = f"{type(exc).__name__}: {exc}"

    def suite_facts(self, interrupted: bool) -> dict:
        """The suite's identity taken at the start; an interrupted run waits for it at most 1 s
        and then records the content hash alone (the git state as unknown)."""
        thread = getattr(self, "_suite_facts_thread", None)
        if thread is not None:
            thread.join(1.0 if interrupted else None)
        facts = getattr(self, "_suite_facts", None)
        if facts is not None:
            return facts
        from gefen_conformance.certificate import provenance

        provenance.kill_running()
        error = getattr(self, "_suite_facts_error", None)
        self.record.notes.append(
            f"the suite's git state could not be determined ({error})"
            if error
            else "the suite's git state was not determined before the run was interrupted"
        )
        return {**certificate.suite_facts(git=False), "git": None}

    def freeze_heap(self) -> None:
        """Every object alive before the first test (torch, the suite's modules, the collected
        items) moved out of the cyclic garbage collector's reach (``gc.freeze``): its full
        collections during the run, and pytest's five at the session's end, then traverse only what
        the tests made, not torch's heap again each time (seconds of a certification). Undone by
        :meth:`close`."""
        gc.freeze()
        self._frozen = True

    def close(self) -> None:
        if self._frozen and self.guard.signum is None:  # an interrupted run leaves at once, frozen
            gc.unfreeze()
            self._frozen = False
            # what the run left as cyclic garbage among the frozen objects is freed now, before the
            # interpreter's end (pytest's own collections at the session's end ran while frozen):
            # objects of extension modules left alive to the end are reported there as leaks
            gc.collect()
        if getattr(self.config.option, "gefen_deadline_scale", None) is not None:
            from gefen_conformance.harness import deadlines

            deadlines.set_scale(None)
        self.guard.uninstall()
        self.census.cancel()
        self.hypothesis_profile.exit()
        for logger, level in self._quieted:
            logger.setLevel(level)
        self._quieted = []

    def leave_now(self) -> None:
        """An interrupted run, once its certificate is written and its summary printed: stop every
        process it started and leave at once with the run's exit status (SPEC 4.4.6). pytest's
        remaining clean-up and the interpreter's finalization (full garbage collections of a heap
        holding torch, seconds on a loaded machine) are skipped: a Ctrl-C'd run is gone within
        seconds of the signal, also at load."""
        import sys

        status = self.exit_status if self.exit_status is not None else int(ExitCode.INTERRUPTED)
        try:
            self.close()
            ranks = sys.modules.get("gefen_conformance.harness.pool")
            if ranks is not None:
                ranks.kill_all()
            provenance = sys.modules.get("gefen_conformance.certificate.provenance")
            if provenance is not None:  # never imported: no git of it runs (leaving imports nothing)
                provenance.kill_running()
        finally:
            leave_process(status, is_worker=self.is_worker)

    def quiet_torch_loggers(self) -> None:
        """Keep torch.distributed's own loggers at WARNING while the suite runs.

        torch sets its c10d loggers (DCP's among them) to DEBUG and gives them a NullHandler;
        pytest 9.1 and newer also attach their capture to loggers that do not propagate, so every
        in-process save and load would add its start and end records to the report of a failing
        test (thousands of lines once a property test shrinks)."""
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if (
                name.startswith("c10d-")
                and isinstance(logger, logging.Logger)
                and logger.level < logging.WARNING
            ):
                self._quieted.append((logger, logger.level))
                logger.setLevel(logging.WARNING)

    def warm_up(self, session) -> None:
        """Prepare the implementation before the first test of this process (SPEC 4.2.11): the
        xdist controller runs no test and leaves it to its workers."""
        from gefen_conformance.harness import devices, launch
        from gefen_conformance.implementations.contract import DCP_RESHARD
        from gefen_conformance.plugin import warmup
        from gefen_conformance.plugin.markers import required
        from gefen_conformance.plugin.selection import in_suite

        if self.config.option.collectonly or self.config.pluginmanager.has_plugin("dsession"):
            return
        items = [item for item in session.items if in_suite(item.path)]
        if not items:
            return
        started = time.monotonic()
        ranked = self.impl.has(DCP_RESHARD) and any(DCP_RESHARD in required(item) for item in items)
        active = launch.active()
        pool_notes, workers = [], None
        if ranked and isinstance(active, launch.PoolLauncher):
            workers = next(
                (n for n in range(warmup.LARGEST_SCENARIO, 0, -1) if launch.unfit_reason(n) is None), 0
            )
            if not any(warmup.runs_rank_bodies(item) for item in items):
                # in-process DCP tests only (a World of one): prepared workers start when a call
                # needs them, their preparation still before its deadline
                workers = 0
            try:
                # the fork server imports in its own process while this one runs its code paths
                warmup.begin_pool(self.impl, workers)  # resolved once, in this process
            except Exception as exc:  # noqa: BLE001 - a scenario that needs the workers reports it
                pool_notes.append(
                    f"warm-up: starting the rank workers' server failed: {certificate.cut(str(exc), 300)}"
                )
                workers = None
        result = warmup.warm_up_process(self.impl, devices.selected())
        if workers:
            try:
                warmup.start_workers(workers)
            except Exception as exc:  # noqa: BLE001 - a scenario that needs the workers reports it
                pool_notes.append(
                    f"warm-up: starting {workers} rank workers failed: {certificate.cut(str(exc), 300)}"
                )
        result.notes += pool_notes
        result.seconds = time.monotonic() - started
        result.seconds += float(getattr(active, "preparation_s", 0.0) or 0.0)  # torchrun ranks, at start-up
        self.warm_up_report = {"seconds": result.seconds, "notes": result.notes}
        self.record.warmed_up(result.seconds, result.notes)

    def take_warm_up_report(self) -> dict | None:
        report, self.warm_up_report = self.warm_up_report, None
        return report

    # -- selection ---------------------------------------------------------------------------

    def _args(self) -> list[str]:
        return list(self.config.args)

    def narrower_args(self) -> list[str]:
        return selection.narrower_args(
            self._args(), self.config.invocation_params.dir, self.config.option.pyargs
        )

    def after_collection(self, collected_ids: list[str], selected_ids: list[str]) -> None:
        """Single-process run: start the census unless the run is already known to be narrowed."""
        self.collected_ids = collected_ids
        self.deselected = len(set(collected_ids) - set(selected_ids))
        if self.progress is not None:
            self.progress.expect(selected_ids)
        if self.is_worker or self.config.option.collectonly or not selection.SuiteCensus.wanted():
            return
        if self.deselected and not self.narrower_args():
            return  # partial already; the suite tests collected before deselection are the whole suite
        self.census.start()

    def start_census(self) -> None:
        """Under xdist the controller sees no collection: always count the suite."""
        if not self.is_worker and not self.config.option.collectonly and selection.SuiteCensus.wanted():
            self.census.start()

    # -- results -----------------------------------------------------------------------------

    def add(self, rec: certificate.TestRecord) -> None:
        self.record.add(rec)

    def _expected_ids(self, interrupted: bool) -> tuple[set | None, str | None]:
        if interrupted:
            self.census.cancel()
            ids = None
        else:
            ids = self.census.finish()
        if ids is not None:
            return set(ids), None
        whole_args = not self.narrower_args()
        if self.collected_ids is not None and whole_args:
            return set(self.collected_ids), None
        return None, self.census.error

    def _narrowed_by(self, missing: set, expected_known: bool, session, interrupted: bool) -> list[str]:
        from gefen_conformance.plugin import hypothesis_profiles as profiles

        opt = self.config.option
        why = []
        hyp = profiles.narrowing()
        if hyp:
            why.append(hyp)
        if not missing and expected_known:
            return why
        if getattr(opt, "gefen_shard", None):
            why.append(f"--shard {opt.gefen_shard}")
        if opt.keyword:
            why.append(f"-k {shlex.quote(opt.keyword)}")
        if opt.markexpr and (self.deselected or self.collected_ids is None):
            why.append(f"-m {shlex.quote(opt.markexpr)}")
        if getattr(opt, "deselect", None):
            why.append("--deselect " + " ".join(opt.deselect))
        if getattr(opt, "lf", False):
            why.append("--lf")
        if getattr(opt, "stepwise", False) or getattr(opt, "stepwise_skip", False):
            why.append("--stepwise")
        narrower = self.narrower_args()
        if narrower:
            why.append(
                "node ids " + " ".join(selection.display_id(a, self.config.option.pyargs) for a in narrower)
            )
        if session.shouldfail or session.shouldstop:
            why.append(f"stopped early ({session.shouldfail or session.shouldstop})")
        if interrupted:
            pass  # the tests it did not reach are the interruption's, said by the verdict
        elif not expected_known:
            why.append(f"the whole suite's size is unknown ({self.census.error or 'no census'})")
        elif len(why) == (1 if hyp else 0):
            example = sorted(missing)[0]
            why.append(f"{len(missing)} suite tests not collected or not run (e.g. {example})")
        return why

    def finish(self, session, exitstatus: int) -> None:
        """Build and write the certificate (controller or single process, after at least one test)."""
        from gefen_conformance.plugin import hypothesis_profiles as profiles

        self.guard.acknowledge()
        interrupted = self.guard.signal_name
        if interrupted is None and int(exitstatus) == int(ExitCode.INTERRUPTED):
            interrupted = "KeyboardInterrupt"
        if not self.record.records and not interrupted:
            self.census.cancel()  # nothing ran (--collect-only, an empty selection): nothing to certify
            return
        expected, _ = self._expected_ids(interrupted is not None)
        executed = set(self.record.records)
        missing = (expected - executed) if expected is not None else set()
        not_run = [
            {"id": r.nodeid, "reason": r.reason}
            for r in sorted(self.record.records.values(), key=lambda r: r.nodeid)
            if r.not_run
        ]
        facts = certificate.RunFacts(
            started=self.record.started,
            finished=certificate.now(),
            interrupted=interrupted,
            narrowed_by=self._narrowed_by(missing, expected is not None, session, interrupted is not None),
            expected_tests=len(expected) if expected is not None else None,
            executed_tests=len(executed),
            hypothesis=profiles.describe(),
            exit_status=int(exitstatus),
            not_run=not_run,
        )
        if interrupted is None and "provenance" not in self.record.implementation:
            from gefen_conformance.certificate import provenance

            self.record.implementation["provenance"] = provenance.implementation_facts(self.impl)
        cert = certificate.build(
            self.record,
            facts,
            profile=certificate.profile_facts(self.impl.capabilities),
            suite=self.suite_facts(interrupted is not None),
            platform_=certificate.platform_facts(),
            execution=certificate.execution_facts(
                self.record.world_sizes, self.record.warm_up_s, tier=self.tier
            ),
        )
        # the run exits with its verdict's status (SPEC 4.4.9); the certificate records it
        cert["run"]["exit_status"] = self.exit_status = int(certificate.EXIT_STATUS[cert["verdict"]])
        explicit = self.config.getoption("certificate")
        requested = Path(explicit) if explicit else Path.cwd() / f"gefen-certificate-{self.impl.name}.json"
        if explicit and interrupted is None:
            target = certificate.destination(requested, cert)
        elif explicit:
            target = certificate.partial_path(requested)  # interrupted: never the path asked for (SPEC 4.4.5)
        else:
            target = requested if cert["run"]["complete"] else certificate.partial_path(requested)
        from gefen_conformance.certificate import repro_files

        repro_files.write_beside(
            cert, target, {r.nodeid: r.repro for r in self.record.records.values() if r.repro}
        )
        if expected is not None:
            cert["run"]["suite_tests"] = sorted(expected)  # what a merge of shards must cover
        certificate.write(cert, target)
        junit = self.config.getoption("gefen_junit", None)
        if junit:
            from gefen_conformance.certificate import junit as junit_xml

            junit_xml.write(cert, junit, str(target))
        self.written = (target, requested if target != requested else None, cert)

    # -- terminal ----------------------------------------------------------------------------

    def summary(self, tr) -> None:
        """The "gefen conformance" section, failure first
        (:mod:`gefen_conformance.plugin.terminal_summary`)."""
        if self.written is None:
            if self.guard.signum is not None and not self.is_worker:
                tr.ensure_newline()
                tr.section("gefen conformance")
                tr.write_line(f"interrupted by {self.guard.signal_name}: no certificate written", yellow=True)
            return
        from gefen_conformance.plugin import terminal_summary

        path, instead_of, cert = self.written
        tr.ensure_newline()
        tr.section("gefen conformance")
        for text, markup in terminal_summary.lines(cert, path, instead_of):
            tr.write_line(text, **markup)
        replayable = [t["id"] for t in cert["tests"] if t.get("repro")]
        if replayable:
            from gefen_conformance.certificate import repro_files

            tr.write_line(
                f"reproducers of {len(replayable)} failed tests in {repro_files.directory_for(path)}: "
                f"gefen-conformance repro {shlex.quote(str(path))} {shlex.quote(replayable[0])}  (SPEC 4.5.6)"
            )

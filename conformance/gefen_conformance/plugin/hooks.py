"""The pytest plugin (entry point ``pytest11``): ``--impl``, capability skips, expected failures,
and the certificate (SPEC 4.1-4.4).

``pytest --impl=NAME`` with no paths runs the suite (``conformance/gefen_conformance/suite``) against the
implementation NAME (a registered name or ``package.module:attribute``), from any directory,
whatever ``testpaths`` the directory's own pytest configuration names; with paths, only those run.
``pytest --pyargs gefen_conformance`` runs it against ``reference``.

The plugin is inert unless the suite is being run, that is ``--impl`` was given, the command line
names the suite, or suite modules were collected: otherwise it imports nothing beyond pytest and
the standard library, loads no hypothesis profile, installs no signal handler, registers no
fixture or marker and writes no file (SPEC 4.1.5). The suite's fixtures and its ``gefen_clause``
and ``gefen_requires`` markers are registered by ``gefen_conformance.plugin.fixtures`` when the
first suite module is collected.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gefen_conformance.exit_codes import ExitCode
from gefen_conformance.plugin import options
from gefen_conformance.plugin.selection import SUITE_DIR, in_suite, item_id, names_the_suite

if TYPE_CHECKING:
    from gefen_conformance.plugin.recorder import SuiteRun

_RUN_KEY = pytest.StashKey["SuiteRun"]()
_IMPL_KEY = pytest.StashKey[object]()
#: the capabilities a suite item requires and the implementation lacks (SPEC 4.1.3): the item is
#: skipped, and its report carries them to the certificate's ``capability_skips``
_MISSING_KEY = pytest.StashKey[list]()
#: a suite item the expectations file skips: reported as not run here, so the run is partial
_EXPECTED_SKIP_KEY = pytest.StashKey[bool]()


def pytest_addoption(parser):
    options.add(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """``--impl`` without paths means the suite, whatever ``testpaths`` the rootdir configures; and
    the implementation is resolved now, so that a broken one is a usage error before anything else
    (the suite's conftest included) is imported."""
    namespace = early_config.known_args_namespace
    if not getattr(namespace, "impl", None) or namespace.help or getattr(namespace, "impl_list", False):
        return
    if not namespace.file_or_dir:
        args.append(str(SUITE_DIR))
        namespace.file_or_dir = [str(SUITE_DIR)]
    else:
        options.suite_ids_as_paths(args, namespace, early_config.invocation_params.dir)
    early_config.stash[_IMPL_KEY], _ = options.prepare(  # selecting the device imports torch
        early_config,
        impl=namespace.impl,
        deadline_scale=getattr(namespace, "gefen_deadline_scale", None),
        certificate=getattr(namespace, "certificate", None),
        device=getattr(namespace, "gefen_device", "cpu"),
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    chosen = config.getoption("hypothesis_profile", None)
    if chosen and str(chosen).startswith("gefen-"):
        from gefen_conformance.plugin import (
            hypothesis_profiles as profiles,
        )  # registered before hypothesis's own plugin loads the chosen one

        profiles.register()
    config.pluginmanager.register(_SessionHooks(config), "gefen-conformance-session")
    if getattr(config.option, "help", False) or getattr(config.option, "impl_list", False):
        return
    if config.option.impl is not None or names_the_suite(
        config.args, config.invocation_params.dir, config.option.pyargs
    ):
        _activate(config)


def pytest_cmdline_main(config):
    if config.getoption("--impl-list"):
        from gefen_conformance.implementations import registry

        names = registry.registered()
        if not names:
            print("no implementations are registered")
        for name, target in sorted(names.items()):
            why = registry.unavailable(name)  # loads each: an entry is listed as usable only if it is
            print(f"{name}\t{target}" + (f"\tnot loadable here: {why}" if why else ""))
        return 0
    return None


def _run(config) -> SuiteRun | None:
    return config.stash.get(_RUN_KEY, None)


def _activate(config) -> SuiteRun:
    """Start the suite run of this session (once): resolve the implementation, load the profile,
    guard against interrupts. Every way the implementation fails to load is a usage error."""
    run = _run(config)
    if run is not None:
        return run
    from gefen_conformance.plugin.recorder import SuiteRun

    if config.option.impl is None:
        config.option.impl = "reference"
    impl, guard = options.prepare(
        config,
        impl=config.option.impl,
        deadline_scale=config.option.gefen_deadline_scale,
        certificate=config.option.certificate,
        device=config.option.gefen_device,
        resolved=config.stash.get(_IMPL_KEY, None),
    )
    run = SuiteRun(config, impl, guard)
    config.stash[_RUN_KEY] = run
    run.open()
    config.add_cleanup(run.close)
    return run


def implementation_for(config):
    """The implementation under test (activates the suite run if needed)."""
    return _activate(config).impl


_FIXTURES = "gefen_conformance.plugin.fixtures"


def pytest_pycollect_makemodule(module_path, parent):
    """A suite module's fixtures come with it: the plugin's fixtures module is registered before
    the first suite module is collected. pytest then imports the module by its package path,
    ``gefen_conformance.suite.<module>``, the name the ranks unpickle its rank bodies by."""
    if not in_suite(module_path):
        return None
    config = parent.config
    if not config.pluginmanager.has_plugin(_FIXTURES):
        config.pluginmanager.import_plugin(_FIXTURES)
    return None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    suite_items = [item for item in items if in_suite(item.path)]
    if not suite_items:
        return (yield)
    from gefen_conformance.plugin import markers

    run = _activate(config)
    tier = options.tier(config)
    outside = [i for i in suite_items if not options.in_tier(markers.tier(i), tier)]
    if outside:  # not part of this tier's suite: not collected, as the census does not collect them
        dropped = {id(i) for i in outside}
        items[:] = [i for i in items if id(i) not in dropped]
        suite_items = [i for i in suite_items if id(i) not in dropped]
    impl = run.impl
    # an expected failure of a test of another tier matches a suite test, only not this run's
    matched = {item_id(i) for i in outside} & set(impl.expected_failures)
    expected = config.stash.get(options.EXPECTATIONS_KEY, None)
    environment = _environment(config) if expected is not None else None
    for item in suite_items:
        if not markers.clauses(item):
            raise pytest.UsageError(f"conformance test {item.nodeid} names no SPEC clause")
        missing = impl.lacks(markers.required(item))
        off_device = None if missing else markers.off_device(item)
        if missing:
            item.stash[_MISSING_KEY] = missing
            item.add_marker(pytest.mark.skip(reason=f"{impl.name} lacks capability {', '.join(missing)}"))
        elif off_device:
            item.add_marker(pytest.mark.skip(reason=off_device))
        sid = item_id(item)
        if sid in impl.expected_failures:
            matched.add(sid)
            item.add_marker(pytest.mark.xfail(reason=impl.expected_failures[sid], strict=True))
        entry = expected.for_test(sid, environment) if expected is not None and not missing else None
        if entry is not None and entry.kind == "xfail":
            item.add_marker(pytest.mark.xfail(reason=entry.describe(), strict=True))
        elif entry is not None:
            item.stash[_EXPECTED_SKIP_KEY] = True  # not run: the run cannot be conformant (SPEC 4.4.14)
            item.add_marker(pytest.mark.skip(reason=f"expected to be skipped: {entry.describe()}"))
    run.record.stale_expected_failures = sorted(set(impl.expected_failures) - matched)
    shard = config.getoption("gefen_shard", None)
    if shard is not None:
        index, count = options.parse_shard(shard)
        kept = [i for i in items if not in_suite(i.path) or in_shard(item_id(i), index, count)]
        left = [i for i in items if i not in kept]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = kept
    if expected is not None:
        run.record.expectations = expected.report(environment)
    result = yield
    run.after_collection([item_id(i) for i in suite_items], [item_id(i) for i in items if in_suite(i.path)])
    return result


def in_shard(test_id: str, index: int, count: int) -> bool:
    """Whether ``test_id`` belongs to shard ``index`` of ``count``: a partition by a stable hash of the
    suite id, the same in every process, session and machine."""
    import zlib

    return zlib.crc32(test_id.encode()) % count == index - 1


def _environment(config):
    """What an expectations entry's conditions are matched against: this run's device type, torch,
    launcher and world size."""
    import torch

    from gefen_conformance.certificate.expectations import Environment
    from gefen_conformance.harness import devices, launch

    execution = launch.execution()
    return Environment(
        devices.selected().type, str(torch.__version__), execution.launcher, execution.world_size
    )


def pytest_sessionstart(session):
    run = _run(session.config)
    if run is not None and session.config.pluginmanager.has_plugin("dsession"):
        run.start_census()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    run = _run(session.config)
    if run is not None:
        run.quiet_torch_loggers()  # every suite module (and torch.distributed.checkpoint) is imported by now
        run.warm_up(session)  # before the first test, outside every deadline (SPEC 4.2.11)
        run.freeze_heap()


def _reason(report, call) -> str:
    from gefen_conformance.certificate.build import cut

    if hasattr(report, "wasxfail"):
        return cut(report.wasxfail)
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
        return cut(text[len("Skipped: ") :] if text.startswith("Skipped: ") else text)
    if not report.failed:
        return ""
    error = call.excinfo.value if call.excinfo is not None else None
    if error is None:
        lines = (report.longreprtext or "").strip().splitlines()
        return cut(lines[-1]) if lines else ""
    while isinstance(getattr(error, "exceptions", None), tuple) and error.exceptions:  # an ExceptionGroup
        error = error.exceptions[0]
    from gefen_conformance.harness.pool import RankFailure

    if isinstance(error, RankFailure):
        failed = error.failed
        head = f"RankFailure: {len(failed)} of {len(error.outcomes)} ranks failed"
        return cut(head + ": " + "; ".join(o.headline() for o in failed))
    text = str(error).strip()
    return cut(f"{type(error).__name__}: {text}" if text else type(error).__name__)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    run = _run(item.config)
    if run is None or not in_suite(item.path):
        return report
    from gefen_conformance import judging
    from gefen_conformance.harness import launch
    from gefen_conformance.plugin import markers
    from gefen_conformance.plugin.report_record import REPRO, ReportRecord

    judge = item.stash.get(judging.JUDGE, None)
    observed = judge.observations.drain() if judge is not None else {"margins": [], "notes": []}
    record = ReportRecord(
        item_id(item),
        markers.clauses(item),
        _reason(report, call),
        observed["margins"],
        observed["notes"],
        launch.drain_world_sizes(),
    )
    missing = item.stash.get(_MISSING_KEY, None)
    if missing and report.skipped:
        record.missing = [c.value for c in missing]
    if report.failed and call.excinfo is not None:
        from gefen_conformance.plugin.rank_locations import where

        record.where = where(call.excinfo.value)  # the failed ranks' lines (SPEC 4.4.8)
    if call.excinfo is not None and getattr(call.excinfo.value, launch.NOT_RUN_HERE, False):
        record.not_run_here = True  # too few ranks or devices here (SPEC 4.4.2)
    if report.skipped and item.stash.get(_EXPECTED_SKIP_KEY, False):
        record.not_run_here = True  # skipped by the expectations file: not judged here
    record.warm_up = run.take_warm_up_report()  # this process's warm-up travels with its first report
    if report.when == "call" and judge is not None:
        failed = report.failed and not hasattr(report, "wasxfail")
        record.input = judge.failing_input if failed else None
        blob = _reproducer(item, judge, run) if failed else None
        judge.forget_reproducers()
        if blob is not None:
            setattr(report, REPRO, blob)  # rides on the report, also from an xdist worker
    record.attach(report)
    return report


def _reproducer(item, judge, run) -> bytes | None:
    """A failed test's reproducer (SPEC 4.5.6), when its judge recorded a failing comparison."""
    from gefen_conformance.harness import devices

    clauses = [str(c) for m in item.iter_markers("gefen_clause") for c in m.args]
    impl = {"name": run.impl.name, "version": run.impl.version, "spec": item.config.option.impl}
    return judge.reproducer(item_id(item), clauses, impl, str(devices.selected()))


def _outcome(report):
    """The report's :class:`~gefen_conformance.certificate.outcomes.Outcome`."""
    from gefen_conformance.certificate.outcomes import Outcome

    if hasattr(report, "wasxfail"):
        return Outcome.XFAILED if report.skipped else Outcome.XPASSED
    if report.failed:
        return Outcome.FAILED if report.when == "call" else Outcome.ERROR
    return Outcome(report.outcome)


class _SessionHooks:
    """The hooks pytest calls without a config or an item; registered per config, idle unless the
    suite runs in this session."""

    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        from gefen_conformance.plugin.report_record import REPRO, ReportRecord

        record = ReportRecord.of(report)
        if record is None:
            return
        run = _activate(self.config)  # under xdist the controller learns here that the suite runs
        if run.is_worker:
            return
        run.record.world_sizes.update(record.world_sizes)
        if record.warm_up:  # an xdist worker's warm-up (a single process recorded its own already)
            run.record.warmed_up(record.warm_up["seconds"], record.warm_up.get("notes", ()))
        if report.when != "call" and report.outcome == "passed" and not (record.margins or record.notes):
            return
        from gefen_conformance.certificate.build import TestRecord
        from gefen_conformance.certificate.outcomes import Outcome

        outcome = (
            _outcome(report) if (report.when == "call" or report.outcome != "passed") else Outcome.PASSED
        )
        skipped = outcome == Outcome.SKIPPED
        run.add(
            TestRecord(
                record.id,
                record.clauses,
                outcome,
                report.duration,
                record.reason,
                list(record.margins),
                list(record.notes),
                list(record.missing) if skipped else [],
                not_run=record.not_run_here and skipped,
                where=list(record.where),
                repro=getattr(report, REPRO, None) if outcome == Outcome.FAILED else None,
                input=record.input if outcome == Outcome.FAILED else None,
            )
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        """The xdist controller learns the run's selection from its workers (progress, SPEC 4.4.11)."""
        run = _run(self.config)
        if run is not None and run.progress is not None:
            # node ids are relative to the rootdir or to the path given (the suite's directory itself)
            root = self.config.rootpath
            run.progress.expect(
                i
                for i in ids
                if in_suite(root / i.partition("::")[0])
                or (SUITE_DIR / Path(i.partition("::")[0]).name).is_file()
            )

    def pytest_runtest_logstart(self, nodeid, location):
        run = _run(self.config)
        if run is not None and run.progress is not None:
            run.progress.started_test(nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid, location):
        run = _run(self.config)
        if run is not None and run.progress is not None:
            run.progress.finished_test(nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo):
        if self.config.pluginmanager.get_plugin("terminalreporter") is None:
            # the interrupt landed in a configure hook that ran before pytest's terminal existed:
            # nobody else would say why the run ended (SPEC 4.4.6)
            from gefen_conformance.plugin.interrupts import say_interrupted

            say_interrupted("before the suite's session started")
        run = _run(self.config)
        if run is not None:
            run.guard.acknowledge()
            if not self.config.option.fulltrace:
                # pytest renders the interrupt's whole traceback (parsing the source of every frame,
                # seconds on a loaded machine) to print its last line: give it only that line's frame
                try:
                    excinfo.traceback = excinfo.traceback[-1:]
                except Exception:  # noqa: BLE001 - a longer report, never a failure
                    pass

    def pytest_sessionfinish(self, session, exitstatus):
        run = _run(self.config)
        if run is None or run.is_worker:
            return
        clean = (ExitCode.OK, ExitCode.FAILED, ExitCode.NO_TESTS_COLLECTED)
        if run.guard.signum is not None and int(session.exitstatus) in clean:
            # interrupted, yet the last test ended before the interrupt surfaced: still not a clean run
            session.exitstatus = ExitCode.INTERRUPTED
        run.finish(session, session.exitstatus)
        if run.exit_status is not None:
            session.exitstatus = run.exit_status  # the verdict's (SPEC 4.4.9)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        run = _run(self.config)
        if run is not None:
            run.summary(terminalreporter)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        run = _run(self.config)
        if run is not None and run.guard.signum is not None:
            run.leave_now()  # interrupted: gone within seconds, whatever the load (SPEC 4.4.6)
        elif run is None and getattr(config.stash.get(options.GUARD_KEY, None), "signum", None) is not None:
            # interrupted before the suite run existed: nothing of it to stop, and the interpreter's
            # finalization of a heap holding torch takes seconds on a loaded machine
            from gefen_conformance.plugin.interrupts import leave_process

            leave_process(int(ExitCode.INTERRUPTED), is_worker=hasattr(config, "workerinput"))

"""The pytest plugin (entry point ``pytest11``): ``--impl``, capability skips, expected failures,
and the certificate (SPEC 4.1-4.4).

``pytest --impl=NAME`` with no paths runs the suite (``conformance/suite``) against the
implementation NAME (a registered name or ``package.module:attribute``), from any directory,
whatever ``testpaths`` the directory's own pytest configuration names; with paths, only those run.
``pytest --pyargs gefen_conformance`` runs it against ``reference``.

The plugin is inert unless the suite is being run, that is ``--impl`` was given, the command line
names the suite, or suite modules were collected: otherwise it imports nothing beyond pytest and
the standard library, loads no hypothesis profile, installs no signal handler, registers no
fixture or marker and writes no file (SPEC 4.1.5). The suite's fixtures and its ``gefen_clause``
and ``gefen_requires`` markers are registered by ``gefen_conformance.suite.fixtures`` when the
first suite module is collected.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import pytest

from gefen_conformance.plugin.selection import SUITE_DIR, in_suite, item_id, names_the_suite

_RUN_KEY = pytest.StashKey["SuiteRun"]()
_IMPL_KEY = pytest.StashKey[object]()
_GUARD_KEY = pytest.StashKey[object]()
_CLAUSES = "gefen_conformance_clauses"
_SUITE_ID = "gefen_conformance_id"
_OBSERVED = "gefen_conformance_observations"
_REASON = "gefen_conformance_reason"
_WORLDS = "gefen_conformance_world_sizes"
_WARM_UP = "gefen_conformance_warm_up"
_NOT_RUN = "gefen_conformance_not_run_here"
_MISSING = "gefen_conformance_missing_capabilities"
#: the capabilities a suite item requires and the implementation lacks (SPEC 4.1.3): the item is
#: skipped, and its report carries them to the certificate's ``capability_skips``
_MISSING_KEY = pytest.StashKey[list]()
_WHERE = "gefen_conformance_where"
# a report attribute, not a user property: the bytes of a reproducer stay out of junit XML and logs
_REPRO = "gefen_conformance_repro"


def pytest_addoption(parser):
    group = parser.getgroup("gefen-conformance", "Gefen conformance suite")
    group.addoption("--impl", default=None,
                    help="run the conformance suite against this implementation: a registered name or "
                         "package.module:attribute (without paths: the whole suite, from any directory)")
    group.addoption("--impl-list", action="store_true", help="list the registered implementations and exit")
    group.addoption("--golden-regen", action="store_true",
                    help="rewrite the committed golden checkpoints from the reference, then fail the run")
    # not plain --device: this plugin loads in every pytest session of its environment, and a
    # project whose conftest adds its own --device would then not start (argparse conflict)
    group.addoption("--gefen-device", dest="gefen_device", default="cpu", metavar="NAME",
                    help="where the implementation's tensors live: cpu (default), cuda, cuda:N or any torch "
                         "device type; the reference runs on CPU, and a non-CPU device is judged by the "
                         "tolerance profile (gefen-conformance certify --device NAME passes it on)")
    group.addoption("--gefen-deadline-scale", dest="gefen_deadline_scale", default=None, metavar="F",
                    help="multiply every deadline of the rank harness by F (> 0; default 1). Deadlines already "
                         "stretch with the machine's measured load (SPEC 4.2.10); F is for what load does not "
                         "show: a much slower CPU, an emulator, a sanitizer build")
    group.addoption("--certificate", default=None, metavar="PATH",
                    help="where to write the JSON certificate (default: ./gefen-certificate-<impl>.json; "
                         "a run that is not complete never replaces a complete certificate)")


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
        _suite_ids_as_paths(args, namespace, early_config.invocation_params.dir)
    guard = _guard(early_config)
    _select_deadline_scale(getattr(namespace, "gefen_deadline_scale", None), guard)
    _check_certificate_path(early_config, getattr(namespace, "certificate", None), guard)
    _select_device(getattr(namespace, "gefen_device", "cpu"), guard)  # imports torch
    early_config.stash[_IMPL_KEY] = _resolve(namespace.impl, guard)


def _suite_ids_as_paths(args, namespace, invocation_dir) -> None:
    """A test id as the suite prints it (``test_dcp_async.py::test_x[p]``, SPEC 4.5.5) names that
    suite test from any directory: rewritten to the suite module's path, unless the current
    directory holds a file of that name."""
    from gefen_conformance.plugin.selection import suite_path_for

    for i, arg in enumerate(namespace.file_or_dir):
        path = suite_path_for(arg, Path(invocation_dir))
        if path is not None:
            args[:] = [path if a == arg else a for a in args]
            namespace.file_or_dir[i] = path


def _guard(config):
    """The run's interrupt guard, installed before anything heavy is imported: a Ctrl-C that lands
    in a callback of an import (hypothesis registers a garbage-collector callback) is not lost."""
    from gefen_conformance.plugin.interrupts import InterruptGuard

    guard = config.stash.get(_GUARD_KEY, None)
    if guard is None:
        guard = config.stash[_GUARD_KEY] = InterruptGuard()
        guard.install()
    return guard


def _select_device(name: str, guard) -> None:
    """``--gefen-device NAME`` checked on this machine and made the run's device (SPEC 4.6.1); a
    device it does not have is a usage error naming it."""
    from gefen_conformance.harness import devices

    try:
        devices.select(devices.parse(name))
    except devices.DeviceUnavailable as error:
        guard.uninstall()
        raise pytest.UsageError(f"--gefen-device {error}") from None


def _check_certificate_path(config, path, guard) -> None:
    """A certificate that could not be written is refused before anything runs (SPEC 4.4.10): one
    line, exit 4. xdist workers write none."""
    if hasattr(config, "workerinput"):
        return
    from gefen_conformance.certificate import outputs

    target = Path(path) if path else Path.cwd() / "gefen-certificate.json"
    why = outputs.problem(target)
    if why:
        guard.uninstall()
        where = f"--certificate {path}" if path else f"the certificate (default: in {Path.cwd()})"
        raise pytest.UsageError(f"{where}: {why}")


def _select_deadline_scale(text, guard) -> None:
    """``--gefen-deadline-scale F`` checked and made this process's (SPEC 4.2.10)."""
    if text is None:
        return
    from gefen_conformance.harness import deadlines

    try:
        deadlines.set_scale(deadlines.parse_scale(text))
    except ValueError as error:
        guard.uninstall()
        raise pytest.UsageError(f"--gefen-deadline-scale {text}: {error}") from None


def _resolve(spec: str, guard):
    from gefen_conformance.implementations import registry

    try:
        return registry.resolve(spec)
    except registry.ImplementationError as error:
        guard.uninstall()
        raise pytest.UsageError(f"--impl={spec}: {error}") from None
    except KeyboardInterrupt:
        guard.uninstall()
        # before the session exists pytest would print the whole import traceback
        sys.stderr.write(f"interrupted while loading the implementation {spec!r}\n")
        raise SystemExit(int(pytest.ExitCode.INTERRUPTED)) from None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    chosen = config.getoption("hypothesis_profile", None)
    if chosen and str(chosen).startswith("gefen-"):
        from gefen_conformance.plugin import hypothesis_profiles as profiles  # registered before hypothesis's own plugin loads the chosen one

        profiles.register()
    config.pluginmanager.register(_SessionHooks(config), "gefen-conformance-session")
    if getattr(config.option, "help", False) or getattr(config.option, "impl_list", False):
        return
    if config.option.impl is not None or names_the_suite(config.args, config.invocation_params.dir,
                                                          config.option.pyargs):
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


def _run(config) -> Optional["SuiteRun"]:
    return config.stash.get(_RUN_KEY, None)


def _activate(config) -> "SuiteRun":
    """Start the suite run of this session (once): resolve the implementation, load the profile,
    guard against interrupts. Every way the implementation fails to load is a usage error."""
    run = _run(config)
    if run is not None:
        return run
    from gefen_conformance.plugin.recorder import SuiteRun

    if config.option.impl is None:
        config.option.impl = "reference"
    guard = _guard(config)
    _select_deadline_scale(config.option.gefen_deadline_scale, guard)
    if config.stash.get(_IMPL_KEY, None) is None:
        _check_certificate_path(config, config.option.certificate, guard)
    _select_device(config.option.gefen_device, guard)
    impl = config.stash.get(_IMPL_KEY, None) or _resolve(config.option.impl, guard)
    run = SuiteRun(config, impl, guard)
    config.stash[_RUN_KEY] = run
    run.open()
    config.add_cleanup(run.close)
    return run


def implementation_for(config):
    """The implementation under test (activates the suite run if needed)."""
    return _activate(config).impl


#: The suite's modules are imported under these names, whatever directory pytest runs from.
SUITE_PACKAGE = "gefen_conformance.suite"
_FIXTURES = f"{SUITE_PACKAGE}.fixtures"


class _SuiteModule(pytest.Module):
    """A suite module imported by its installed name (``gefen_conformance.suite.test_x``), never
    by pytest's path-derived one: in an editable install that would be ``conformance.suite.test_x``
    with the checkout put on ``sys.path``, which collides with a user's own ``conformance``
    package and makes rank bodies unpicklable in the ranks (SPEC 4.1.7)."""

    def _getobj(self):
        import importlib

        name = f"{SUITE_PACKAGE}.{self.path.stem}"
        try:
            module = importlib.import_module(name)
        except Exception:
            raise self.CollectError(f"the suite module {name} failed to import:\n"
                                    f"{_exception_text()}") from None
        if Path(module.__file__).resolve() != self.path.resolve():
            raise self.CollectError(f"{name} was imported from {module.__file__}, not from {self.path}: "
                                    "another gefen_conformance shadows this one")
        self.config.pluginmanager.consider_module(module)
        return module


def _exception_text() -> str:
    import traceback

    return traceback.format_exc(limit=-3)


def pytest_collect_directory(path, parent):
    """The suite's directory is a plain directory to pytest: its ``__init__.py`` is never imported
    by path (it is a package of the installed distribution, imported by name)."""
    if Path(path).resolve() == SUITE_DIR:
        return pytest.Dir.from_parent(parent, path=Path(path))
    return None


def pytest_pycollect_makemodule(module_path, parent):
    if not in_suite(module_path):
        return None
    config = parent.config
    if not config.pluginmanager.has_plugin(_FIXTURES):
        config.pluginmanager.import_plugin(_FIXTURES)
    return _SuiteModule.from_parent(parent, path=module_path)


def _missing(item, impl) -> list:
    """The capabilities ``item`` requires that ``impl`` does not declare (``Capability`` members)."""
    from gefen_conformance.plugin import markers

    return impl.lacks(markers.required(item))


def _not_on_device(item) -> Optional[str]:
    """Why a test that requires ``cpu-bit-exact`` does not run on the run's device (SPEC 4.6.4),
    or None: bitwise claims are judged on CPU only."""
    from gefen_conformance.harness import devices
    from gefen_conformance.implementations.contract import CPU_BIT_EXACT
    from gefen_conformance.plugin import markers

    device = devices.selected()
    if device.type == "cpu" or CPU_BIT_EXACT not in markers.required(item):
        return None
    return f"{CPU_BIT_EXACT} is judged on CPU only; device {device} is judged by tolerance (SPEC 4.6.4)"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    suite_items = [item for item in items if in_suite(item.path)]
    if not suite_items:
        return (yield)
    from gefen_conformance.plugin import markers

    run = _activate(config)
    impl = run.impl
    matched = set()
    for item in suite_items:
        if not markers.clauses(item):
            raise pytest.UsageError(f"conformance test {item.nodeid} names no SPEC clause")
        missing = _missing(item, impl)
        off_device = None if missing else _not_on_device(item)
        if missing:
            item.stash[_MISSING_KEY] = missing
            item.add_marker(pytest.mark.skip(reason=f"{impl.name} lacks capability {', '.join(missing)}"))
        elif off_device:
            item.add_marker(pytest.mark.skip(reason=off_device))
        sid = item_id(item)
        if sid in impl.expected_failures:
            matched.add(sid)
            item.add_marker(pytest.mark.xfail(reason=impl.expected_failures[sid], strict=True))
    run.run.stale_expected_failures = sorted(set(impl.expected_failures) - matched)
    result = yield
    run.after_collection([item_id(i) for i in suite_items], [item_id(i) for i in items if in_suite(i.path)])
    return result


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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _run(item.config) is not None and in_suite(item.path):
        from gefen_conformance.plugin import observations, reproducers

        observations.drain()  # whatever an earlier test left behind is not this test's
        reproducers.clear()


def _reason(report, call) -> str:
    from gefen_conformance.certificate.build import cut

    if hasattr(report, "wasxfail"):
        return cut(report.wasxfail)
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
        return cut(text[len("Skipped: "):] if text.startswith("Skipped: ") else text)
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
    from gefen_conformance.harness import launch
    from gefen_conformance.plugin import markers, observations

    # user_properties travel with the report, also from xdist workers to the controller
    report.user_properties.append((_CLAUSES, markers.clauses(item)))
    report.user_properties.append((_SUITE_ID, item_id(item)))
    report.user_properties.append((_OBSERVED, observations.drain()))
    report.user_properties.append((_REASON, _reason(report, call)))
    report.user_properties.append((_WORLDS, launch.drain_world_sizes()))
    missing = item.stash.get(_MISSING_KEY, None)
    if missing and report.skipped:
        report.user_properties.append((_MISSING, [c.value for c in missing]))
    if report.failed and call.excinfo is not None:
        from gefen_conformance.plugin.rank_locations import where

        report.user_properties.append((_WHERE, where(call.excinfo.value)))  # the failed ranks' lines (SPEC 4.4.8)
    if report.when == "call":
        _attach_reproducer(item, report, run)
    if call.excinfo is not None and getattr(call.excinfo.value, launch.NOT_RUN_HERE, False):
        report.user_properties.append((_NOT_RUN, True))  # too few ranks or devices here (SPEC 4.4.2)
    warm_up = run.take_warm_up_report()
    if warm_up is not None:  # this process's warm-up travels with its first report
        report.user_properties.append((_WARM_UP, warm_up))
    return report


def _attach_reproducer(item, report, run) -> None:
    """A failed test's reproducer (SPEC 4.5.6) rides on its report, also from an xdist worker."""
    from gefen_conformance.harness import devices
    from gefen_conformance.plugin import reproducers

    clauses = [str(c) for m in item.iter_markers("gefen_clause") for c in m.args]
    impl = {"name": run.impl.name, "version": run.impl.version, "spec": item.config.option.impl}
    blob = reproducers.drain(item_id(item), clauses, impl, str(devices.selected()),
                             keep=report.failed and not hasattr(report, "wasxfail"))
    if blob is not None:
        setattr(report, _REPRO, blob)


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
        props = dict(report.user_properties)
        if _CLAUSES not in props:
            return
        run = _activate(self.config)  # under xdist the controller learns here that the suite runs
        if run.is_worker:
            return
        run.run.world_sizes.update(props.get(_WORLDS) or ())
        warm_up = props.get(_WARM_UP)
        if warm_up:  # an xdist worker's warm-up (a single process recorded its own already)
            run.run.warmed_up(warm_up["seconds"], warm_up.get("notes", ()))
        observed = props.get(_OBSERVED) or {}
        if report.when != "call" and report.outcome == "passed" and not any(observed.values()):
            return
        from gefen_conformance.certificate.build import TestRecord
        from gefen_conformance.certificate.outcomes import Outcome

        outcome = _outcome(report) if (report.when == "call" or report.outcome != "passed") else Outcome.PASSED
        skipped = outcome == Outcome.SKIPPED
        run.record(TestRecord(props[_SUITE_ID], props[_CLAUSES], outcome, report.duration, props.get(_REASON, ""),
                              list(observed.get("margins", [])), list(observed.get("notes", [])),
                              list(props.get(_MISSING) or []) if skipped else [],
                              not_run=bool(props.get(_NOT_RUN)) and skipped,
                              where=list(props.get(_WHERE) or ()),
                              repro=getattr(report, _REPRO, None) if outcome == Outcome.FAILED else None))


    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        """The xdist controller learns the run's selection from its workers (progress, SPEC 4.4.11)."""
        run = _run(self.config)
        if run is not None and run.progress is not None:
            # node ids are relative to the rootdir or to the path given (the suite's directory itself)
            root = self.config.rootpath
            run.progress.expect(i for i in ids if in_suite(root / i.partition("::")[0])
                                or (SUITE_DIR / Path(i.partition("::")[0]).name).is_file())

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
        if run.guard.signum is not None and int(session.exitstatus) in (0, 1, 5):
            # interrupted, yet the last test ended before the interrupt surfaced: still not a clean run
            session.exitstatus = pytest.ExitCode.INTERRUPTED
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

"""The pytest plugin (entry point ``pytest11``): ``--impl``, capability skips, expected failures,
and the certificate (SPEC 4.1-4.4).

``pytest --pyargs conformance --impl=NAME`` runs the suite in ``conformance/suite`` against the
implementation NAME (a registered name or ``package.module:attribute``; default ``reference``).
Only tests under ``conformance/suite`` are touched by this plugin; other test trees that happen
to run with it installed are left alone, and no certificate is written for them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import certificate, registry
from .implementation import Implementation

SUITE_DIR = Path(__file__).resolve().parent / "suite"
_IMPL_KEY = pytest.StashKey[Implementation]()
_CLAUSES = "gefen_conformance_clauses"
_SUITE_ID = "gefen_conformance_id"


def pytest_addoption(parser):
    group = parser.getgroup("gefen-conformance", "Gefen conformance suite")
    group.addoption("--impl", default="reference",
                    help="implementation to certify: a registered name or package.module:attribute (default: reference)")
    group.addoption("--impl-list", action="store_true", help="list the registered implementations and exit")
    group.addoption("--golden-regen", action="store_true",
                    help="rewrite the committed golden checkpoints from the reference, then fail the run")
    group.addoption("--certificate", default=None, metavar="PATH",
                    help="where to write the JSON certificate (default: ./gefen-certificate-<impl>.json)")


def _register_hypothesis_profiles(config) -> None:
    """``gefen-certify`` (bounded, reproducible; the default) and ``gefen-fuzz`` (random, large)."""
    from hypothesis import HealthCheck, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("gefen-certify", derandomize=True, database=None, max_examples=300,
                              deadline=None, suppress_health_check=quiet, print_blob=True)
    settings.register_profile("gefen-fuzz", derandomize=False, max_examples=5000, deadline=None,
                              suppress_health_check=quiet, print_blob=True)
    if not config.getoption("--hypothesis-profile", None):
        settings.load_profile("gefen-certify")


def pytest_configure(config):
    _register_hypothesis_profiles(config)
    config.addinivalue_line("markers", "clause(*ids): the SPEC clauses a conformance test checks")
    config.addinivalue_line("markers", "requires(*capabilities): skip unless the implementation declares them")
    config.pluginmanager.register(CertificateRecorder(config), "gefen-conformance-certificate")


def pytest_cmdline_main(config):
    if config.getoption("--impl-list"):
        names = registry.registered()
        if not names:
            print("no implementations are registered")
        for name, target in sorted(names.items()):
            print(f"{name}\t{target}")
        return 0
    return None


def implementation_for(config) -> Implementation:
    """The implementation named by ``--impl``, resolved once per session."""
    impl = config.stash.get(_IMPL_KEY, None)
    if impl is None:
        spec = config.getoption("--impl")
        try:
            impl = registry.resolve(spec)
        except (LookupError, ImportError, TypeError, AttributeError) as error:
            raise pytest.UsageError(f"--impl={spec}: {error}") from error
        config.stash[_IMPL_KEY] = impl
    return impl


def _in_suite(item) -> bool:
    return Path(str(item.path)).resolve().is_relative_to(SUITE_DIR)


def _suite_id(item) -> str:
    """``test_module.py::test_name[params]``: the id expected-failure lists use."""
    return item.nodeid.split("/")[-1]


@pytest.fixture(scope="session")
def impl(request) -> Implementation:
    """The implementation under test."""
    return implementation_for(request.config)


def pytest_collection_modifyitems(session, config, items):
    suite_items = [item for item in items if _in_suite(item)]
    if not suite_items:
        return
    impl = implementation_for(config)
    matched = set()
    for item in suite_items:
        if not list(item.iter_markers("clause")):
            raise pytest.UsageError(f"conformance test {item.nodeid} names no SPEC clause")
        for marker in item.iter_markers("requires"):
            missing = [c for c in marker.args if not impl.has(c)]
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"{impl.name} lacks capability {', '.join(missing)}"))
        sid = _suite_id(item)
        if sid in impl.expected_failures:
            matched.add(sid)
            item.add_marker(pytest.mark.xfail(reason=impl.expected_failures[sid], strict=True))
    config.pluginmanager.get_plugin("gefen-conformance-certificate").stale = sorted(set(impl.expected_failures) - matched)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if _in_suite(item):
        # user_properties travel with the report, also from xdist workers to the controller
        report.user_properties.append((_CLAUSES, [str(c) for m in item.iter_markers("clause") for c in m.args]))
        report.user_properties.append((_SUITE_ID, _suite_id(item)))
    return report


class CertificateRecorder:
    """Collects suite outcomes (in the controller under xdist) and writes the certificate."""

    def __init__(self, config):
        self.config = config
        self.run = None
        self.stale = None
        self.written = None

    def _outcome(self, report) -> tuple[str, str]:
        if hasattr(report, "wasxfail"):
            return ("xfailed" if report.skipped else "xpassed"), str(report.wasxfail)
        if report.failed:
            lines = (report.longreprtext or "").strip().splitlines()
            return ("failed" if report.when == "call" else "error"), (lines[-1][:500] if lines else "")
        if report.skipped and isinstance(report.longrepr, tuple):
            return "skipped", str(report.longrepr[2])
        return report.outcome, ""

    def pytest_runtest_logreport(self, report):
        props = dict(report.user_properties)
        if _CLAUSES not in props or (report.when != "call" and report.outcome == "passed"):
            return
        if self.run is None:
            impl = implementation_for(self.config)
            self.run = certificate.Run(
                implementation={"name": impl.name, "version": impl.version, "capabilities": sorted(impl.capabilities)}
            )
        outcome, reason = self._outcome(report)
        self.run.record(certificate.TestRecord(props[_SUITE_ID], props[_CLAUSES], outcome, report.duration, reason))

    def pytest_sessionfinish(self, session, exitstatus):
        if self.run is None or hasattr(self.config, "workerinput"):
            return
        if self.stale is not None:
            self.run.stale_expected_failures = self.stale
        path = self.config.getoption("--certificate") or Path.cwd() / f"gefen-certificate-{self.run.implementation['name']}.json"
        self.written = (path, certificate.write(self.run, path))

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if self.written is None:
            return
        path, cert = self.written
        tr = terminalreporter
        tr.section("gefen conformance")
        if cert["stale_expected_failures"]:
            tr.write_line("stale expected failures (match no test): " + ", ".join(cert["stale_expected_failures"]), yellow=True)
        s = cert["summary"]
        tr.write_line(
            f"{cert['implementation']['name']} {cert['implementation']['version']}: {cert['verdict']} "
            f"({s['passed']} passed, {s['failed']} failed, {s['error']} errors, {s['skipped']} skipped, "
            f"{s['xfailed']} expected failures)"
        )
        for clause, counts in cert["clauses"].items():
            if counts.get("failed") or counts.get("error") or counts.get("xfailed"):
                detail = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                tr.write_line(f"  SPEC {clause}: {detail}")
        passing = sum(1 for c in cert["clauses"].values() if not (c.get("failed") or c.get("error")))
        tr.write_line(f"clauses: {passing} of {len(cert['clauses'])} without failures")
        tr.write_line(f"certificate: {path}")

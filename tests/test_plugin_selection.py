"""What a run selects, and what its certificate may claim (SPEC 4.1.2, 4.4.2, 4.4.5).

``pytest --impl=NAME`` without paths runs the suite even inside a repository with its own
``testpaths``; explicit paths run only themselves; any narrowing makes the run ``partial``, and a
run that is not complete never replaces a complete certificate.
"""

from __future__ import annotations

import json

import pytest

from gefen_conformance.plugin.selection import SuiteCensus

COMPLETE = {"schema": "gefen-conformance-certificate/2", "run": {"complete": True}, "verdict": "conformant"}


def _backend_repository(pytester):
    """A kernel author's repository: its own pytest.ini, testpaths and a failing test of its own."""
    pytester.makeini("[pytest]\ntestpaths = tests\naddopts = -p no:cacheprovider\n")
    tests = pytester.mkdir("tests")
    (tests / "test_own.py").write_text(
        "def test_own_failing():\n    assert False\n\ndef test_own_ok():\n    pass\n"
    )
    return pytester


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_impl_without_paths_runs_the_suite_not_the_repositorys_testpaths(pytester):
    repo = _backend_repository(pytester)
    default = repo.path / "gefen-certificate-reference.json"
    default.write_text(json.dumps(COMPLETE))
    result = repo.runpytest_subprocess("--impl=reference", "-k", "test_dcp_names")
    out = result.stdout.str()
    assert result.ret == 6, out  # partial (SPEC 4.4.9)
    assert "test_own" not in out and "test_dcp_names.py .." in out
    # narrowed by -k: partial, and the complete certificate at the default path is left alone
    assert json.loads(default.read_text()) == COMPLETE
    cert = json.loads((repo.path / "gefen-certificate-reference.partial.json").read_text())
    assert cert["verdict"] == "partial" and not cert["run"]["complete"]
    assert cert["run"]["narrowed_by"] == ["-k test_dcp_names"]
    assert cert["run"]["executed_tests"] == 2 and cert["run"]["expected_tests"] > 100
    assert "not a complete run, so not written to" in out and "verdict: partial" in out


def test_explicit_paths_run_only_themselves(pytester):
    repo = _backend_repository(pytester)
    result = repo.runpytest_subprocess("--impl=reference", "tests/test_own.py::test_own_ok")
    result.assert_outcomes(passed=1)
    assert not list(repo.path.glob("gefen-certificate*"))  # no suite test ran: no certificate


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_a_suite_module_by_path_is_partial_against_the_census(pytester):
    cert_path = pytester.path / "c.json"
    # by module name: the child resolves it in its own import system (a path from this process could
    # name a second copy of the suite, e.g. a source tree next to an installed one)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "gefen_conformance.suite.test_dcp_names",
        f"--certificate={cert_path}",
    )
    assert result.ret == 6, result.stdout.str()  # partial (SPEC 4.4.9)
    cert = json.loads(cert_path.read_text())
    assert cert["implementation"]["name"] == "reference"  # collected without --impl: the reference
    assert cert["verdict"] == "partial"
    assert any(n.startswith("node ids") and "test_dcp_names.py" in n for n in cert["run"]["narrowed_by"])
    assert cert["run"]["expected_tests"] > 100 and cert["run"]["executed_tests"] == 2


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_another_hypothesis_profile_is_partial(pytester):
    cert_path = pytester.path / "c.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "gefen_conformance",
        "--impl=reference",
        "-k",
        "test_staging_regression and fp16",
        "--hypothesis-profile=gefen-fuzz",
        f"--certificate={cert_path}",
    )
    assert result.ret == 6, result.stdout.str()  # partial (SPEC 4.4.9)
    cert = json.loads(cert_path.read_text())
    assert cert["verdict"] == "partial"
    assert cert["run"]["hypothesis"]["profile"] == "gefen-fuzz"
    assert cert["run"]["hypothesis"]["settings"]["max_examples"] == 5000
    assert any(n.startswith("hypothesis profile gefen-fuzz") for n in cert["run"]["narrowed_by"])


def test_the_census_counts_the_whole_suite_with_or_without_plugin_autoloading(monkeypatch):
    """The census of a run whose pytest loads the plugin by its entry point, and of one that loads
    it with ``-p`` (autoloading off, or no installed entry point): the same whole suite."""
    census = SuiteCensus()
    census.start()
    ids = census.finish()
    assert ids is not None, census.error
    assert len(ids) == len(set(ids)) > 100
    assert all("::" in i and "/" not in i.partition("::")[0] for i in ids)
    assert any(i.startswith("test_dcp_names.py::") for i in ids)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    without = SuiteCensus()
    without.start()
    assert without.finish() == ids, without.error


LOG_PROBE = """
import logging

def pytest_runtest_call(item):
    with open("levels.txt", "a") as out:
        out.write(f"{logging.getLogger('c10d-NullHandler-dcp_logger').level}\\n")
"""


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_torch_distributed_loggers_stay_quiet_while_the_suite_runs(pytester):
    """DCP's logger is at DEBUG with a NullHandler; pytest >= 9.1 captures non-propagating loggers,
    so each in-process save and load would flood a failing test's report (SPEC 4.4.6)."""
    pytester.makepyfile(log_probe=LOG_PROBE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "log_probe", "--impl=reference", "-k", "test_dcp_names"
    )
    assert result.ret == 6, result.stdout.str()  # partial: -k
    levels = {int(x) for x in (pytester.path / "levels.txt").read_text().split()}
    assert levels and min(levels) >= 30, levels


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_a_printed_test_id_reruns_that_test_from_any_directory(pytester):
    """SPEC 4.5.5: the id the terminal, certificate and reports print is a valid argument."""
    repo = _backend_repository(pytester)
    test_id = "test_optimizer.py::test_pinned_block_step[plain-torch.float16-pinned-after-3]"
    result = repo.runpytest_subprocess(
        "--impl=reference",
        test_id,
        "test_dcp_names.py::test_caller_name_that_looks_positional_saves_and_loads",
    )
    assert result.ret == 6, result.stdout.str()  # partial: two tests of the suite (SPEC 4.4.9)
    cert = json.loads((repo.path / "gefen-certificate-reference.partial.json").read_text())
    assert sorted(t["id"] for t in cert["tests"]) == sorted(
        [test_id, "test_dcp_names.py::test_caller_name_that_looks_positional_saves_and_loads"]
    )
    # a file of that name where pytest runs is the user's, not the suite's
    (repo.path / "test_dcp_names.py").write_text("def test_mine():\n    pass\n")
    result = repo.runpytest_subprocess("--impl=reference", "test_dcp_names.py")
    result.assert_outcomes(passed=1)

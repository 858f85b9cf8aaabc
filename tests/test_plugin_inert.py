"""Installed into an environment, the plugin leaves other projects' pytest sessions alone
(SPEC 4.1.5): no heavy imports, no hypothesis profile, no signal handlers, no files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

INERT = """\
from hypothesis import settings
def test_profile(): assert settings.default.max_examples == 100 and not settings.default.derandomize
"""

UNRELATED = """\
import signal
import sys

from hypothesis import given, settings, strategies as st

SEEN = []


@given(st.integers())
def test_default_number_of_random_examples(x):
    SEEN.append(x)


def test_the_property_ran_the_profile_hypothesis_chose_itself():
    assert len(SEEN) == 100
    # hypothesis picks its "ci" profile on a CI machine and "default" elsewhere; the plugin picks neither
    assert settings.default == settings.get_profile("@PROFILE@")


def test_nothing_heavy_was_imported_and_no_handler_installed():
    modules = ("torch", "numpy", "conformance.recorder", "gefen_conformance.implementations.registry",
               "oracles", "reference")
    heavy = sorted(m for m in modules if m in sys.modules)
    assert not heavy, heavy
    # whatever this process inherited (a background job starts with SIGINT ignored), not ours
    assert signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_IGN)
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.SIG_IGN)
"""


def _ci_variables() -> tuple[str, ...]:
    """The environment variables by which hypothesis recognises a CI machine (and loads its "ci" profile)."""
    from hypothesis import _settings

    return tuple(getattr(_settings, "_CI_VARS", ("CI", "TF_BUILD", "GITHUB_ACTIONS")))


def _pytest(cwd: Path, *args: str, ci: bool = False) -> subprocess.CompletedProcess:
    """Run pytest in ``cwd`` as on a developer's machine or, with ``ci``, as on a CI machine."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    env.pop("PYTEST_ADDOPTS", None)
    for name in _ci_variables():
        env.pop(name, None)
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


LOADED = """\
def test_the_plugin_is_loaded(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("gefen_conformance")
"""


def test_an_unrelated_projects_hypothesis_test_keeps_the_default_profile(tmp_path):
    """The check the project's before-stop hook runs, verbatim (on a machine hypothesis does not take for
    CI)."""
    (tmp_path / "test_inert.py").write_text(INERT)
    (tmp_path / "test_loaded.py").write_text(LOADED)
    result = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "test_inert.py")
    assert result.returncode == 0, result.stdout + result.stderr
    result = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "test_loaded.py")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("ci", [False, True], ids=["developer-machine", "ci-machine"])
def test_an_unrelated_session_imports_nothing_heavy_and_writes_nothing(tmp_path, ci):
    (tmp_path / "test_unrelated.py").write_text(UNRELATED.replace("@PROFILE@", "ci" if ci else "default"))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", ci=ci)
    assert result.returncode == 0, result.stdout + result.stderr
    written = sorted(
        p.name
        for p in tmp_path.iterdir()
        if p.name.startswith("gefen-certificate") or p.name == ".pytest_cache"
    )
    assert not written
    if not ci:
        # hypothesis's example database is the other project's business (on by default, off in its
        # "ci" profile): written where hypothesis always writes it, not redirected by the plugin
        assert (tmp_path / ".hypothesis").exists()


THEIR_CONFTEST = """\
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "clause(name): their own marker, nothing to do with Gefen")


@pytest.fixture
def impl():
    return "their impl"
"""

THEIR_TESTS = """\
import pytest


@pytest.mark.clause("theirs")
def test_their_fixture_and_marker_are_theirs(impl, request, pytestconfig):
    assert impl == "their impl"
    assert request.node.get_closest_marker("clause").args == ("theirs",)
    lines = pytestconfig.getini("markers")
    assert not [line for line in lines if line.startswith(("gefen_", "requires"))], lines
    for name in ("gefen_impl", "gefen_reference", "gefen_ranks", "gefen_checkpoints", "gefen_one_rank"):
        with pytest.raises(pytest.FixtureLookupError):
            request.getfixturevalue(name)
"""

THEIR_UNREGISTERED = """\
import pytest


@pytest.mark.requires("anything")
def test_unregistered_marker():
    pass
"""


def test_another_projects_impl_fixture_and_clause_marker_are_left_alone(tmp_path):
    """A project with its own ``impl`` fixture and ``clause`` marker sees exactly its own (SPEC 4.1.5):
    the suite's fixtures and markers carry the ``gefen_`` prefix and exist only where the suite runs."""
    (tmp_path / "conftest.py").write_text(THEIR_CONFTEST)
    (tmp_path / "test_theirs.py").write_text(THEIR_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "--strict-markers", "test_theirs.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("gefen-certificate")]


def test_an_unregistered_requires_marker_is_refused_as_without_the_plugin(tmp_path):
    """``--strict-markers`` refuses another project's ``@pytest.mark.requires`` with or without the
    plugin: the plugin registers no marker outside the suite."""
    (tmp_path / "test_unregistered.py").write_text(THEIR_UNREGISTERED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    with_plugin = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "--strict-markers")
    without = _pytest(
        tmp_path, "-q", "-p", "no:cacheprovider", "-p", "no:gefen_conformance", "--strict-markers"
    )
    assert without.returncode != 0 and "'requires' not found in `markers`" in without.stdout + without.stderr
    assert with_plugin.returncode == without.returncode, with_plugin.stdout + with_plugin.stderr
    assert "'requires' not found in `markers`" in with_plugin.stdout + with_plugin.stderr

"""Installed into an environment, the plugin leaves other projects' pytest sessions alone
(SPEC 4.1.5): no heavy imports, no hypothesis profile, no signal handlers, no files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_the_property_ran_100_examples_at_random():
    assert len(SEEN) == 100
    assert settings.default.max_examples == 100 and not settings.default.derandomize
    assert settings.default.database is not None


def test_nothing_heavy_was_imported_and_no_handler_installed():
    heavy = sorted(m for m in ("torch", "numpy", "conformance.recorder", "conformance.registry", "oracles", "reference")
                   if m in sys.modules)
    assert not heavy, heavy
    # whatever this process inherited (a background job starts with SIGINT ignored), not ours
    assert signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_IGN)
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.SIG_IGN)
"""


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


LOADED = """\
def test_the_plugin_is_loaded(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("gefen_conformance")
"""


def test_an_unrelated_projects_hypothesis_test_keeps_the_default_profile(tmp_path):
    """The check the project's before-stop hook runs, verbatim."""
    (tmp_path / "test_inert.py").write_text(INERT)
    (tmp_path / "test_loaded.py").write_text(LOADED)
    result = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "test_inert.py")
    assert result.returncode == 0, result.stdout + result.stderr
    result = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "test_loaded.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_unrelated_session_imports_nothing_heavy_and_writes_nothing(tmp_path):
    (tmp_path / "test_unrelated.py").write_text(UNRELATED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "-p", "no:randomly")
    assert result.returncode == 0, result.stdout + result.stderr
    written = sorted(p.name for p in tmp_path.iterdir()
                     if p.name.startswith("gefen-certificate") or p.name == ".pytest_cache")
    assert not written
    # hypothesis's own example database is this project's business (it is on by default): it is
    # written where hypothesis always writes it, not redirected by the plugin
    assert (tmp_path / ".hypothesis").exists()

"""``gefen-conformance certify``: the pytest options under the same names, pytest arguments after
``--`` (SPEC 4.4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    return subprocess.run(
        [sys.executable, "-m", "gefen_conformance.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_help_says_pytest_arguments_go_after_the_double_dash(tmp_path):
    result = _cli(tmp_path, "certify", "--help")
    assert result.returncode == 0
    assert "after `--`" in result.stdout and "--certificate PATH, --out PATH" in result.stdout
    assert "--impl" in result.stdout


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
@pytest.mark.parametrize("spelling", ["--out", "--certificate"])
def test_both_spellings_of_the_certificate_path_and_pytest_args_after_the_double_dash(tmp_path, spelling):
    result = _cli(
        tmp_path, "certify", "--impl", "reference", spelling, "c.json", "--", "-k", "test_dcp_names"
    )
    assert result.returncode == 6, result.stdout[-2000:] + result.stderr[-2000:]  # partial (SPEC 4.4.9)
    cert = json.loads((tmp_path / "c.json").read_text())
    assert cert["verdict"] == "partial" and cert["run"]["executed_tests"] == 2
    assert not (tmp_path / ".pytest_cache").exists()


def test_pytest_arguments_without_the_double_dash_are_refused(tmp_path):
    result = _cli(tmp_path, "certify", "--impl", "reference", "-k", "names")
    assert (
        result.returncode == 4 and "unrecognized option -k: pytest's options go after `--`" in result.stderr
    )

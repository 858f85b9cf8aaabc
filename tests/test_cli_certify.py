"""``gefen-conformance certify --impl NAME [TEST_ID ...] [-- PYTEST_ARGS]`` (SPEC 4.5.5, 4.4.13), and
what ``--impl-list`` and ``--impl`` say of an implementation that cannot be loaded here,
tried it: the ids the suite prints could not be rerun; ``--impl-list`` showed ``gefenx`` without
gefen-x installed, and ``--impl gefenx`` then said "No module named 'gefen'".
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gefen_conformance import cli
from gefen_conformance.cli import certify

REPO = Path(__file__).resolve().parents[1]
RESHARD = "test_dcp_reshard.py::test_reshard_restores_model_and_continues_within_bound[2->4]"
GLOBAL_STEP = "test_optimizer.py::test_global_step_counts_every_step_call"


@pytest.fixture
def started(monkeypatch, tmp_path):
    """The pytest command lines certify would start (nothing starts)."""
    monkeypatch.chdir(tmp_path)
    commands = []

    def wait_for(command):
        commands.append(command)
        return 0

    monkeypatch.setattr(certify, "_wait_for", wait_for)
    return commands


def test_test_ids_between_options_go_to_pytest_before_the_passthrough(started):
    assert (
        cli.main(
            ["certify", RESHARD, "--impl", "fast", "--out", "c.json", GLOBAL_STEP, "-q", "--", "-n", "2"]
        )
        == 0
    )
    command = started[0]
    assert (
        command[:4] == [sys.executable, "-m", "pytest", "--impl=fast"] and "--certificate=c.json" in command
    )
    assert command[-5:] == [RESHARD, GLOBAL_STEP, "-q", "-n", "2"]


def test_test_ids_reach_rank_0_of_a_torchrun_job(started):
    assert (
        cli.main(["certify", "--impl", "fast", "--launcher", "torchrun", "--nproc-per-node", "2", RESHARD])
        == 0
    )
    command = started[0]
    assert command[command.index("--pytest-args") + 1 :] == [RESHARD]


def test_a_test_id_of_no_suite_module_is_a_usage_error_naming_the_modules(started, capsys):
    assert cli.main(["certify", "--impl", "reference", "test_nosuch.py::test_x"]) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not started
    assert err.startswith(
        "gefen-conformance certify: TEST_ID test_nosuch.py::test_x: the suite has no module test_nosuch.py"
    )
    assert "test_dcp_reshard.py" in err


def _env() -> dict:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_the_rerun_command_the_summary_prints_reruns_exactly_that_test_from_another_directory(tmp_path):
    """A mutant fails one test; the summary's rerun command, run elsewhere through certify, runs that test
    only."""
    first = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--impl=tests.mutants:global_step",
            f"--certificate={tmp_path / 'c.json'}",
            "-k",
            "test_global_step_counts_every_step_call",
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    rerun = next(
        line.strip()[len("rerun: ") :]
        for line in first.stdout.splitlines()
        if line.strip().startswith("rerun: ")
    )
    assert rerun == f"pytest --impl=tests.mutants:global_step {GLOBAL_STEP}"
    words = shlex.split(rerun)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert words[:2] == ["pytest", "--impl=tests.mutants:global_step"]
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "gefen_conformance.cli",
            "certify",
            "--impl",
            "tests.mutants:global_step",
            "--out",
            "again.json",
            *words[2:],
            "--",
            "-q",
        ],
        cwd=elsewhere,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    cert = json.loads((elsewhere / "again.json").read_text())
    assert [t["id"] for t in cert["tests"]] == [GLOBAL_STEP] and cert["tests"][0]["outcome"] == "failed"
    assert cert["implementation"]["spec"] == "tests.mutants:global_step"


FAKE_GEFEN = "raise ModuleNotFoundError(\"No module named 'gefen'\", name='gefen')\n"


def test_impl_list_marks_an_entry_that_cannot_be_loaded_and_impl_says_what_to_install(pytester, monkeypatch):
    """``pytest --impl-list`` lists every registered implementation, exit 0, and marks the one that
    cannot load here; ``--impl`` then says what to install."""
    hidden = pytester.path / "hidden"
    hidden.mkdir()
    (hidden / "gefen.py").write_text(FAKE_GEFEN)  # gefen-x as if it were not installed
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))
    )
    listed = pytester.runpytest_subprocess("--impl-list", "-p", "no:cacheprovider")
    lines = dict(line.split("\t", 1) for line in listed.stdout.lines if "\t" in line)
    assert listed.ret == 0
    assert lines["gefenx"].endswith(
        "not loadable here: needs the package gefen-x==0.5.0, which is not installed here "
        "(module 'gefen'): pip install gefen-x==0.5.0"
    )
    assert "not loadable" not in lines["reference"]
    refused = pytester.runpytest_subprocess("--impl=gefenx", "-p", "no:cacheprovider")
    assert refused.ret == 4
    assert (
        "--impl=gefenx: implementation 'gefenx' (module gefen_conformance.implementations.gefenx): needs the "
        "package gefen-x==0.5.0" in refused.stderr.str()
    )
    assert "pip install gefen-x==0.5.0" in refused.stderr.str()

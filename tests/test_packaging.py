"""The installed distribution holds every file the suite needs: a normal (non-editable) install
certifies exactly as the checkout does (SPEC 4.4.3: the suite's identity covers these files)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: each folder holds one package under its installed name (conformance/gefen_conformance, ...)
PACKAGES = ("conformance", "oracles", "reference")


def installed_name(rel: str) -> str:
    """Where a tracked file of a package folder lies in the wheel: below the folder."""
    return rel.partition("/")[2]


def tracked_files(*paths: str) -> set[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", *paths], cwd=REPO, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return {line for line in listed.stdout.splitlines() if line and (REPO / line).is_file()}


def test_the_wheel_holds_every_tracked_file_of_the_packages(tmp_path):
    # built from a copy of the tracked files: the checkout's build/ directory would hide a missing file
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    for rel in tracked_files("pyproject.toml", "README.md", *PACKAGES):
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, source / rel)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("gefen_conformance-*.whl")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(rel for rel in tracked_files(*PACKAGES) if installed_name(rel) not in in_wheel)
    # the goldens' .metadata files are what a glob pattern silently skips
    assert not missing, f"{len(missing)} tracked file(s) not installed: {missing[:10]}"

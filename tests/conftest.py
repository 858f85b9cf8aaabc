"""Fixtures shared by the project's tests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    # the project's own tests import suite modules directly (their markers are applied at import),
    # outside a session that collects the suite, where the plugin registers them
    from gefen_conformance.plugin import markers

    markers.register(config)


@pytest.fixture(scope="session")
def narrow_certification(tmp_path_factory):
    """``narrow_certification(impl, select, *extra)``: ``pytest --pyargs gefen_conformance
    --impl=IMPL -k SELECT EXTRA...`` in a subprocess from an empty directory (``tests``
    importable, for the mutants), run once per test session and shared by every test that asks
    for the same one, across xdist workers (a lock file in their common temporary directory).
    Returns ``(exit status, path of the certificate)``; the certificate is read-only to its users."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # every worker's base temp lies in one directory of the run
    root = root / "narrow-certifications"
    root.mkdir(exist_ok=True)

    def certify(impl: str, select: str, *extra: str) -> tuple[int, Path]:
        key = hashlib.sha256(json.dumps([impl, select, *extra]).encode()).hexdigest()[:16]
        where = root / key
        done = where / "exit-status"
        with FileLock(str(root / f"{key}.lock")):
            if not done.exists():
                where.mkdir(exist_ok=True)
                env = dict(
                    os.environ,
                    PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                )
                env.pop("PYTEST_XDIST_WORKER", None)
                env.pop("PYTEST_ADDOPTS", None)
                run = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pytest",
                        "--pyargs",
                        "gefen_conformance",
                        f"--impl={impl}",
                        f"--certificate={where / 'certificate.json'}",
                        "-p",
                        "no:cacheprovider",
                        "-q",
                        "-k",
                        select,
                        *extra,
                    ],
                    cwd=where,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                (where / "output.txt").write_text(run.stdout + run.stderr)
                done.write_text(str(run.returncode))
        return int(done.read_text()), where / "certificate.json"

    return certify

"""The suite's identity in a certificate: a content hash of its files, and git state only from the
suite's own checkout, never from the current directory (SPEC 4.4.3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gefen_conformance.certificate import provenance

REPO = Path(__file__).resolve().parents[1]
DESCRIBE = (
    "import json, os, sys; sys.path.insert(0, os.environ['SUITE_PARENT']); "
    "from gefen_conformance.certificate import provenance; print(json.dumps(provenance.describe()))"
)


def _describe(packages_parent: Path, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["SUITE_PARENT"] = str(packages_parent)  # ahead of the current directory, which python -c puts first
    out = subprocess.run(
        [sys.executable, "-c", DESCRIBE],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def _copy_suite(into: Path) -> None:
    for name in provenance.SUITE_PACKAGES:
        shutil.copytree(
            provenance.package_dirs()[name],
            into / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )


def _git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_files_hashed_are_the_installed_ones():
    files = [rel for rel, _ in provenance.suite_files()]
    assert (
        "gefen_conformance/plugin/hooks.py" in files
        and "gefen_oracles/numeric.py" in files
        and "gefen_reference/optimizer.py" in files
    )
    assert "gefen_conformance/golden/MANIFEST.json" in files
    assert "gefen_conformance/certificate/certificate.schema.json" in files
    assert "gefen_conformance/certificate/templates/report.html.j2" in files
    assert "gefen_conformance/certificate/rules.json" in files  # what a certificate's rules count against
    assert any(rel.endswith(".distcp") for rel in files)
    assert not any("__pycache__" in rel or rel.endswith(".pyc") for rel in files)
    assert provenance.content_sha256() == provenance.content_sha256()


def test_the_rule_register_is_part_of_the_suites_identity(tmp_path, monkeypatch):
    """Another register counts the same tests' rules differently: it is another suite (SPEC 4.4.3)."""
    _copy_suite(tmp_path)
    copied = {name: tmp_path / name for name in provenance.SUITE_PACKAGES}
    monkeypatch.setattr(provenance, "package_dirs", lambda: copied)
    before = provenance.content_sha256()
    register = tmp_path / "gefen_conformance" / "certificate" / "rules.json"
    register.write_text(register.read_text().replace('"id": "1.12.9"', '"id": "1.12.99"', 1))
    assert provenance.content_sha256() != before


def test_a_copy_outside_git_has_the_same_hash_and_no_git_state_even_inside_a_repository(tmp_path):
    """An installed suite: same content hash; the current directory's repository is not the suite's."""
    installed = tmp_path / "site"
    installed.mkdir()
    _copy_suite(installed)
    here = _describe(installed, cwd=REPO)  # the current directory is a git checkout: irrelevant
    assert here["git"] is None
    assert here["content_sha256"] == provenance.content_sha256()


def test_a_checkout_reports_its_commit_and_local_edits(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _copy_suite(checkout)
    # as the suite's own repository does: the bytecode an import writes is no local edit
    (checkout / ".gitignore").write_text("__pycache__/\n")
    _git(checkout, "init", "-q")
    _git(checkout, "add", ".")
    _git(checkout, "commit", "-q", "-m", "suite")
    head = _git(checkout, "rev-parse", "HEAD")
    clean = _describe(checkout, cwd=tmp_path)
    assert clean["git"] == {"commit": head, "dirty": False}
    with open(checkout / "gefen_oracles" / "numeric.py", "a") as f:
        f.write("\n# a local edit\n")
    edited = _describe(checkout, cwd=tmp_path)
    assert edited["git"] == {"commit": head, "dirty": True}
    assert edited["content_sha256"] != clean["content_sha256"]


def test_a_suite_installed_in_a_virtualenv_inside_someone_elses_repository_has_no_git_state(tmp_path):
    project = tmp_path / "project"
    (project / ".venv" / "site").mkdir(parents=True)
    (project / "README").write_text("their project\n")
    (project / ".gitignore").write_text(".venv/\n")
    _git(project, "init", "-q")
    _git(project, "add", ".")
    _git(project, "commit", "-q", "-m", "theirs")
    _copy_suite(project / ".venv" / "site")
    assert _describe(project / ".venv" / "site", cwd=project)["git"] is None

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


def _modules_of(folder: str) -> list[str]:
    """Every module and package of a folder's package, by the dotted name its file path spells."""
    root = REPO / folder
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("folder", PACKAGES)
def test_every_module_is_found_at_its_dotted_path(folder):
    """An import of ``a.b.c`` resolves to ``<folder>/a/b/c.py`` (or ``c/__init__.py``): an editor's
    go-to-definition and an import graph read the same tree the interpreter does."""
    import importlib.util

    names = _modules_of(folder)
    assert len(names) > 5, names
    misplaced = []
    for name in names:
        spec = importlib.util.find_spec(name)
        path = Path(spec.origin).resolve() if spec and spec.origin else None
        expected = REPO / folder / Path(*name.split("."))
        if path not in (expected.with_suffix(".py"), expected / "__init__.py"):
            misplaced.append(f"{name} -> {path}")
    assert not misplaced, misplaced
    # nothing outside the package's own folder: the folder holds one package under its installed name
    assert {n.split(".")[0] for n in names} == {f"gefen_{folder}"}


def test_a_module_found_elsewhere_is_reported(tmp_path, monkeypatch):
    """The check above can fail: a package that shadows the installed one is found first."""
    import importlib.util

    shadow = tmp_path / "gefen_oracles"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "gefen_oracles"}
    for name in saved:
        del sys.modules[name]
    try:
        spec = importlib.util.find_spec("gefen_oracles")
        assert Path(spec.origin).resolve() == (shadow / "__init__.py").resolve()
        with pytest.raises(AssertionError, match="gefen_oracles -> "):
            test_every_module_is_found_at_its_dotted_path("oracles")
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "gefen_oracles"]:
            del sys.modules[name]
        sys.modules.update(saved)

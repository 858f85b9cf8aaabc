"""Which suite produced a certificate: a content hash of its files, and its git state (SPEC 4.4.3).

The suite is the three packages a certificate's verdict depends on: ``conformance`` (plugin,
harness, suite modules, the committed goldens, and the certificate's JSON Schema, report templates
and rule register, ``rules.json``), ``oracles`` and ``reference``. Its identity is
:func:`content_sha256`, computed from the files as they are loaded in this process, so an
installed wheel and a checkout of the same commit give the same hash, and a local edit changes it.

:func:`git_state` adds the commit and a dirty flag only when those packages sit in a git checkout
that tracks them (the suite's own repository). It never looks at the current directory: a suite
installed into a virtual environment inside somebody else's repository has no git state.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path

SUITE_PACKAGES = ("gefen_conformance", "gefen_oracles", "gefen_reference")
# what an install carries: the packages' Python modules and their package data (the goldens, and the
# certificate's JSON Schema, report templates and rule register, which verify, report and build read)
_DATA_DIRS = (("gefen_conformance", "golden"), ("gefen_conformance", "certificate"))


def package_dirs() -> dict[str, Path]:
    """The directory each suite package is loaded from (found without importing it)."""
    dirs = {}
    for name in SUITE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"the suite package {name!r} cannot be found on sys.path")
        dirs[name] = Path(list(spec.submodule_search_locations)[0]).resolve()
    return dirs


def suite_files() -> list[tuple[str, Path]]:
    """``(posix path relative to the packages' parent, absolute path)`` of every suite file, sorted."""
    found = []
    for name, root in package_dirs().items():
        data_dirs = [root.joinpath(*parts[1:]) for parts in _DATA_DIRS if parts[0] == name]
        for path in root.rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix == ".py" or any(path.is_relative_to(d) for d in data_dirs):
                found.append((f"{name}/{path.relative_to(root).as_posix()}", path))
    return sorted(found)


def content_sha256() -> str:
    """SHA-256 over the sorted list of ``relative path NUL sha256(file)`` lines of :func:`suite_files`."""
    outer = hashlib.sha256()
    for rel, path in suite_files():
        outer.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return outer.hexdigest()


_RUNNING: set = set()  # git processes running now (an interrupted run kills them: SPEC 4.4.6)


def _git(cwd: Path, *args: str) -> str | None:
    from gefen_conformance.harness.deadlines import wall_bound

    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        child = subprocess.Popen(
            ["git", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    except OSError:
        return None
    _RUNNING.add(child)
    try:
        out, _ = child.communicate(timeout=wall_bound(10))  # git status is slow on a loaded machine
    except subprocess.SubprocessError:
        child.kill()
        child.wait()
        return None
    finally:
        _RUNNING.discard(child)
    return out if child.returncode == 0 else None


def kill_running() -> None:
    """Kill the git processes still running (an interrupted run leaves nothing behind)."""
    for child in list(_RUNNING):
        try:
            child.kill()
        except OSError:
            pass


def git_state() -> dict | None:
    """``{"commit": sha, "dirty": bool}`` when the suite packages are tracked files of a git
    checkout; None otherwise (an installed suite, or git missing).

    ``dirty`` is True when any file under the suite packages differs from the commit or is
    untracked (ignored files such as ``__pycache__`` aside).
    """
    dirs = package_dirs()
    here = dirs["gefen_conformance"]
    top = _git(here, "rev-parse", "--show-toplevel")
    if not top:
        return None
    top_path = Path(top.strip()).resolve()
    rels = []
    for root in dirs.values():
        if not root.is_relative_to(top_path):
            return None
        rels.append(root.relative_to(top_path).as_posix())
    # the checkout must track the suite itself (not merely contain a virtualenv holding it)
    if not _git(top_path, "ls-files", "--", f"{rels[0]}/__init__.py"):
        return None
    commit = _git(top_path, "rev-parse", "HEAD")
    status = _git(top_path, "status", "--porcelain", "--untracked-files=all", "--", *rels)
    if commit is None or status is None:
        return None
    return {"commit": commit.strip(), "dirty": bool(status.strip())}


def describe() -> dict:
    """The certificate's ``suite`` entry (without name and version)."""
    return {"content_sha256": content_sha256(), "git": git_state()}


def implementation_facts(impl) -> dict:
    """Where the implementation under test comes from (SPEC 4.4.3): the module that defines its
    ``make_optimizer``, the file it was loaded from, the installed distribution that holds it (with
    its version) and, when that file is tracked by a git checkout, the commit and whether the
    package's directory differs from it (``dirty``: a certificate of uncommitted code says so)."""
    import importlib.metadata
    import inspect

    out: dict = {"module": None, "file": None, "distribution": None, "git": None}
    module = inspect.getmodule(getattr(impl, "make_optimizer", None))
    if module is None:
        return out
    out["module"] = module.__name__
    path = getattr(module, "__file__", None)
    if not path:
        return out
    path = Path(path).resolve()
    out["file"] = str(path)
    top = module.__name__.partition(".")[0]
    names = importlib.metadata.packages_distributions().get(top) or []
    if names:
        try:
            out["distribution"] = {"name": names[0], "version": importlib.metadata.version(names[0])}
        except importlib.metadata.PackageNotFoundError:
            pass
    root = _git(path.parent, "rev-parse", "--show-toplevel")
    if root and _git(Path(root.strip()), "ls-files", "--", str(path)):
        top_path = Path(root.strip()).resolve()
        package = path.parent
        while package.parent != package and (package.parent / "__init__.py").is_file():
            package = package.parent
        commit = _git(top_path, "rev-parse", "HEAD")
        status = _git(top_path, "status", "--porcelain", "--untracked-files=all", "--", str(package))
        if commit is not None and status is not None:
            out["git"] = {
                "root": str(top_path),
                "commit": commit.strip(),
                "dirty": bool(status.strip()),
                "package": package.relative_to(top_path).as_posix(),
            }
    return out

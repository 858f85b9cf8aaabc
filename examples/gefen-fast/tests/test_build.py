"""The kernel library is built at install time; a runtime build is atomic, locked, and only where needed.

What this proves: a fresh kernel cache must not put a C compiler call inside a
rank's timed call (the installed library is loaded, no compiler runs); ranks that start together
build a missing library once and never see a half-written one; a failed build is a clear error;
without a compiler the optimizer says so once and uses the reference's torch step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import gefen_reference as reference
from gefen_fast import _build, kernels, native

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """The loader with no installed library and an empty cache; restored afterwards."""
    monkeypatch.setattr(_build, "INSTALLED_DIR", tmp_path / "installed")
    monkeypatch.setenv("GEFEN_FAST_CACHE", str(tmp_path / "cache"))
    native.library.cache_clear()
    kernels.available.cache_clear()
    kernels.native_half.cache_clear()
    yield tmp_path
    native.library.cache_clear()
    kernels.available.cache_clear()
    kernels.native_half.cache_clear()


def _counting_compiler(tmp_path: Path, log: Path, fail: bool = False) -> str:
    """A $CC that records each call (and sleeps, so concurrent builds overlap), then runs cc or fails."""
    script = tmp_path / "cc-wrapper"
    body = (
        "echo 'error: this compiler always fails' >&2; exit 1" if fail else f'exec {shutil.which("cc")} "$@"'
    )
    script.write_text(f'#!/bin/sh\necho "$$" >> {log}\nsleep 0.5\n{body}\n')
    script.chmod(0o755)
    return str(script)


def test_install_built_the_library_for_this_machine():
    """pip install ran setup.py's build: the library of the current key is in the package, and
    loading it runs no compiler (so no rank ever compiles inside a deadline)."""
    installed = native.installed_path()
    assert installed.exists(), f"{installed} missing: was gefen-fast installed with `pip install`?"
    assert native.library_path() == installed
    assert native.library()._name == str(installed)


def test_key_follows_sources_and_flags(monkeypatch):
    key = _build.build_key()
    monkeypatch.setattr(_build, "FLAGS", _build.FLAGS + ("-DGEFEN_SOMETHING_ELSE",))
    assert _build.build_key() != key


def test_missing_installed_library_is_built_once_in_the_cache(fresh_loader, monkeypatch):
    log = fresh_loader / "calls.log"
    monkeypatch.setenv("CC", _counting_compiler(fresh_loader, log))
    with pytest.warns(RuntimeWarning, match="do not match these sources or this CPU"):
        path = native.library_path()
    assert path.parent == fresh_loader / "cache" and path.exists()
    assert native.library_path() == path  # a second process or call loads it
    assert len(log.read_text().split()) <= 2  # one build (a second call only if OpenMP were missing)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_ranks_starting_together_build_once(fresh_loader, monkeypatch):
    """Four processes ask for the same missing library at the same moment: one compiles, all load it."""
    log = fresh_loader / "calls.log"
    cache = fresh_loader / "cache"
    cc = _counting_compiler(fresh_loader, log)
    start = time.time() + 1.5
    program = textwrap.dedent(f"""
        import ctypes, sys, time
        sys.path.insert(0, {str(PACKAGE_ROOT)!r})
        import importlib.util
        spec = importlib.util.spec_from_file_location("b", {str(PACKAGE_ROOT / "gefen_fast" / "_build.py")!r})
        b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
        time.sleep(max(0.0, {start} - time.time()))
        path, built = b.cached_library(b.Path({str(cache)!r}), b.build_key())
        ctypes.CDLL(str(path)).gefen_abi_version()
        print("built" if built else "loaded")
    """)
    env = dict(os.environ, CC=cc)
    procs = [
        subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert sorted(outputs) == ["built", "loaded", "loaded", "loaded"]
    assert len(log.read_text().split()) == 1
    libraries = list(cache.glob("gefen_kernels-*.so"))
    assert len(libraries) == 1
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_failed_build_is_a_clear_error_and_leaves_nothing(fresh_loader, monkeypatch):
    monkeypatch.setenv("CC", _counting_compiler(fresh_loader, fresh_loader / "calls.log", fail=True))
    with pytest.raises(_build.BuildError, match="this compiler always fails"):
        native.library_path()
    cache = fresh_loader / "cache"
    assert not list(cache.glob("gefen_kernels-*")) and not [
        p for p in cache.iterdir() if p.name.endswith(".tmp")
    ]


def test_without_a_compiler_the_torch_step_is_used(fresh_loader, monkeypatch):
    """No C compiler and no installed library: one RuntimeWarning, then the reference's torch step."""
    monkeypatch.setenv("CC", str(fresh_loader / "no-such-compiler"))

    def run(cls):
        g = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(32, 48, generator=g))
        opt = cls([("w", p)], factored_v_2d=False)
        for _ in range(2):
            p.grad = torch.randn(32, 48, generator=g)
            opt.step()
        return p.detach()

    import gefen_fast

    with pytest.warns(RuntimeWarning, match="C kernels unavailable"):
        fast = run(gefen_fast.Gefen)
    assert torch.equal(fast, run(reference.Gefen))


def _package_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "gefen-fast"
    shutil.copytree(
        PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__", "build", "*.egg-info")
    )
    return copy


def test_setup_build_fails_clearly_when_the_compiler_fails(tmp_path):
    copy = _package_copy(tmp_path)
    cc = _counting_compiler(tmp_path, tmp_path / "calls.log", fail=True)
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=copy,
        env=dict(os.environ, CC=cc),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "gefen-fast" in result.stderr and "this compiler always fails" in result.stderr
    assert not list((copy / "gefen_fast").glob("gefen_kernels-*.so"))


def test_setup_build_without_a_compiler_warns_and_installs(tmp_path):
    copy = _package_copy(tmp_path)
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=copy,
        env=dict(os.environ, CC=str(tmp_path / "no-such-cc")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "no C compiler" in result.stderr

"""Compile the C kernel library. Standard library only: ``setup.py`` loads this file by path at
install time (before torch or this package can be imported), and :mod:`gefen_fast.native` uses
it when the installed library does not fit the sources or the CPU.

The library's file name carries its *build key*: a hash of the sources, the compiler flags and the
host CPU (``-march=native``). A library is only ever loaded under the key computed from the files
and the CPU at hand, so a stale or foreign binary is never used. Writes are atomic (a temporary
file in the same directory, renamed into place) and, for the runtime cache, serialised by a lock
file, so processes that start together (the ranks of one job) build once and never see a
half-written library.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "csrc"
SOURCES = ("step_kernels.c", "period_search.c", "histogram.c", "codebook_dp.c")
HEADERS = ("gefen_common.h",)
#: Where the install-time build puts the library (inside the package).
INSTALLED_DIR = PACKAGE_DIR
#: ``-ffp-contract=off``: no multiply-add is fused except the explicit ones (SPEC 1.13.3);
#: ``-fno-math-errno`` only lets sqrtf vectorize (it changes no result); no -ffast-math.
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared")
OPENMP_FLAG = "-fopenmp"
#: The longest a process waits for another one's build of the same library.
LOCK_TIMEOUT_S = 600.0


class BuildError(RuntimeError):
    """The C kernels could not be compiled."""


class NoCompiler(BuildError):
    """No C compiler was found."""


def compiler() -> list[str]:
    """``$CC``, else ``cc``, as an argument list."""
    return shlex.split(os.environ.get("CC", "cc")) or ["cc"]


def compiler_available() -> bool:
    cc = compiler()
    return shutil.which(cc[0]) is not None


def cpu_identity() -> str:
    """What ``-march=native`` depends on: the CPU model and its feature flags."""
    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    lines.append(line.strip())
                if len(lines) >= 2:
                    break
    except OSError:
        pass
    return "\n".join(lines) or f"{platform.machine()} {platform.processor()}"


def build_key() -> str:
    """The hash of everything that determines the binary: sources, flags, CPU."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes() + b"\0")
    h.update(" ".join(FLAGS + (OPENMP_FLAG,)).encode() + b"\0")
    h.update(platform.machine().encode() + b"\0" + cpu_identity().encode())
    return h.hexdigest()[:20]


def library_name(key: str | None = None) -> str:
    return f"gefen_kernels-{key or build_key()}.so"


def _run(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        raise NoCompiler(f"no C compiler: {command[0]!r} not found (set $CC)") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"running {command[0]!r} failed: {exc}") from None


def compile_library(target: Path, extra_flags: tuple = ()) -> dict:
    """Compile the sources into ``target`` (atomically); returns what was done.

    OpenMP is used when the compiler supports it; without it the kernels are single-threaded
    (reported in the result). Raises :class:`NoCompiler` or :class:`BuildError` (with the
    compiler's output) on failure; a failed build leaves nothing behind.
    """
    cc = compiler()
    if shutil.which(cc[0]) is None:
        raise NoCompiler(f"no C compiler: {cc[0]!r} not found (set $CC)")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    sources = [str(SOURCE_DIR / name) for name in SOURCES]
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    started = time.perf_counter()
    try:
        flags = list(FLAGS) + list(extra_flags)
        result = _run(cc + flags + [OPENMP_FLAG] + sources + ["-o", tmp, "-lm"])
        openmp = result.returncode == 0
        if not openmp:
            first_error = result.stderr
            result = _run(cc + flags + sources + ["-o", tmp, "-lm"])
            if result.returncode != 0:
                raise BuildError(
                    f"compiling the gefen-fast kernels with {' '.join(cc)} failed:\n"
                    f"{first_error[-3000:]}\n(and without {OPENMP_FLAG}:)\n{result.stderr[-3000:]}"
                )
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {
        "path": str(target),
        "openmp": openmp,
        "seconds": time.perf_counter() - started,
        "compiler": " ".join(cc),
    }


def remove_other_builds(directory: Path, keep: str) -> None:
    """Delete libraries of other keys in ``directory`` (an in-place rebuild leaves the old one)."""
    for old in Path(directory).glob("gefen_kernels-*.so"):
        if old.name != keep:
            try:
                old.unlink()
            except OSError:
                pass


class _Lock:
    """An exclusive ``flock`` on ``path`` with a deadline; released when the process ends anyway."""

    def __init__(self, path: Path, timeout: float):
        self.path, self.timeout, self.fd = path, timeout, None

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise BuildError(
                        f"waited {self.timeout:.0f} s for another process's build ({self.path})"
                    ) from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def cached_library(cache: Path, key: str) -> tuple[Path, dict | None]:
    """The library of ``key`` in the cache directory, built under a lock if absent.

    Returns ``(path, build)`` with ``build`` None when the library was already there (built by
    an earlier process, or by a concurrent one while this one waited for the lock).
    """
    cache = Path(cache)
    target = cache / library_name(key)
    if target.exists():
        return target, None
    cache.mkdir(parents=True, exist_ok=True)
    with _Lock(cache / f".{target.name}.lock", LOCK_TIMEOUT_S):
        if target.exists():
            return target, None
        return target, compile_library(target)

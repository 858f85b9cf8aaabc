"""Build (once) and load the C kernels of ``csrc/gefen_kernels.c``.

The source is compiled with the system C compiler into a shared library kept in a cache
directory, keyed by a hash of everything that determines the binary: the source, the
compiler command and its version, and the host CPU (``-march=native``). Later processes
(every rank of a multi-rank run, every later session) load the cached library; a build
takes about a second. Builds are atomic (a temporary file renamed into place), so
processes that start together never see a half-written library.

Cache directory: ``$GEFEN_FAST_CACHE``, else ``$XDG_CACHE_HOME/gefen-fast``, else
``~/.cache/gefen-fast``. Compiler: ``$CC``, else ``cc``.

Flags that matter for the numbers: ``-ffp-contract=off`` (no multiply-add is fused except
the explicit ``fmaf`` of the lerp), no ``-ffast-math``; ``-fno-math-errno`` only lets
``sqrtf`` vectorize (it changes no result).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

SOURCE = Path(__file__).with_name("csrc") / "gefen_kernels.c"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared")


class BuildError(RuntimeError):
    """The C kernels could not be compiled or loaded."""


class Table(ctypes.Structure):
    _fields_ = [
        ("decode", ctypes.c_void_p), ("codebook", ctypes.c_void_p), ("first", ctypes.c_void_p),
        ("points", ctypes.c_void_p), ("results", ctypes.c_void_p), ("exact", ctypes.c_int32),
    ]


class Hyper(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_float), ("beta2", ctypes.c_float), ("one_minus_beta2", ctypes.c_float),
        ("bias2", ctypes.c_float), ("eps", ctypes.c_float), ("inv_bias1", ctypes.c_float),
        ("lr", ctypes.c_float), ("decay", ctypes.c_float), ("apply_decay", ctypes.c_int32),
        ("threads", ctypes.c_int32),
    ]


def cache_dir() -> Path:
    if os.environ.get("GEFEN_FAST_CACHE"):
        return Path(os.environ["GEFEN_FAST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gefen-fast"


def _cpu_identity() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def _build_key(compiler: list[str]) -> str:
    try:
        version = subprocess.run(compiler + ["--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"no C compiler ({' '.join(compiler)}): {exc}") from None
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(compiler + list(FLAGS)).encode(), version.encode(),
                 platform.machine().encode(), _cpu_identity().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:24]


def library_path() -> Path:
    """The cached library for this source, compiler and CPU, built if absent."""
    compiler = _compiler()
    target = cache_dir() / f"gefen_kernels-{_build_key(compiler)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(compiler + list(FLAGS) + [str(SOURCE), "-o", tmp, "-lm"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise BuildError(f"compiling {SOURCE.name} failed:\n{result.stderr[-4000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_VOID_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_TABLE_P = ctypes.POINTER(Table)
_HYPER_P = ctypes.POINTER(Hyper)


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded kernels with their signatures declared."""
    # torch is imported first and ships the OpenMP runtime under the same soname, so the
    # kernels run on torch's own thread pool (no second pool competing for the cores).
    try:
        lib = ctypes.CDLL(str(library_path()))
    except OSError as exc:
        raise BuildError(f"loading the compiled kernels failed: {exc}") from None
    for suffix in ("f32", "bf16"):
        fn = getattr(lib, f"gefen_block_step_{suffix}")
        fn.argtypes = [_VOID_P, _VOID_P, _VOID_P, _VOID_P, _VOID_P, _I64, _I64, _TABLE_P, _HYPER_P]
        fn.restype = ctypes.c_int
        fn = getattr(lib, f"gefen_factored_moments_{suffix}")
        fn.argtypes = [_VOID_P, _I64, _I64, _VOID_P, _VOID_P, _HYPER_P]
        fn.restype = ctypes.c_float
        fn = getattr(lib, f"gefen_factored_step_{suffix}")
        fn.argtypes = [_VOID_P, _VOID_P, _VOID_P, _VOID_P, _I64, _I64, _I64, _VOID_P, _VOID_P,
                       ctypes.c_float, _TABLE_P, _HYPER_P]
        fn.restype = ctypes.c_int
    return lib

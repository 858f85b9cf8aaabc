"""Load the C kernel library (``csrc/``) with ctypes.

The library is built when the package is installed (``setup.py`` -> :mod:`gefen_fast._build`)
into ``gefen_fast/gefen_kernels-<key>.so``, ``<key>`` a hash of the sources, the flags and
the CPU (``-march=native``). At run time:

1. the installed library of the current key is loaded (no compiler runs);
2. if there is none (the sources changed since an editable install, or the package was installed
   on a machine with another CPU) and a C compiler exists, the library is built once into the
   cache directory (``$GEFEN_FAST_CACHE``, else ``$XDG_CACHE_HOME/gefen-fast``, else
   ``~/.cache/gefen-fast``), under a lock so that ranks starting together build it once, and
   written atomically; a RuntimeWarning says so;
3. without a compiler, :class:`BuildError` is raised and the optimizer uses the reference's torch
   step (``gefen_fast.kernels.available``).

:func:`prepare` does all of this eagerly, for a warm-up phase or an installation check.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from functools import lru_cache
from pathlib import Path

from . import _build

BuildError = _build.BuildError
#: The structure layout and signatures below; the library must report the same.
ABI_VERSION = 5
#: CAP_BYTE_DECODE: the 16-lane loops decode old indices by byte permutes (AVX512_VBMI).
CAP_AVX2, CAP_HALF, CAP_AVX512, CAP_BYTE_DECODE = 1, 2, 4, 8


class Table(ctypes.Structure):
    _fields_ = [
        ("cells", ctypes.c_void_p),
        ("decode", ctypes.c_void_p),
        ("codebook", ctypes.c_void_p),
        ("planes", ctypes.c_void_p),
        ("use_cells", ctypes.c_int32),
    ]


class Hyper(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("one_minus_beta2", ctypes.c_float),
        ("bias2", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("inv_bias1", ctypes.c_float),
        ("lr", ctypes.c_float),
        ("decay", ctypes.c_float),
        ("apply_decay", ctypes.c_int32),
    ]


class Work(ctypes.Structure):
    """One parameter's step (``Work`` in csrc/step_kernels.c)."""

    _fields_ = [
        ("p", ctypes.c_void_p),
        ("g", ctypes.c_void_p),
        ("idx", ctypes.c_void_p),
        ("magnitude", ctypes.c_void_p),
        ("vmean", ctypes.c_void_p),
        ("v_row", ctypes.c_void_p),
        ("v_col", ctypes.c_void_p),
        ("tab", ctypes.POINTER(Table)),
        ("blocks", ctypes.c_int64),
        ("period", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("h", Hyper),
        ("dtype", ctypes.c_int32),
        ("factored", ctypes.c_int32),
    ]


def cache_dir() -> Path:
    if os.environ.get("GEFEN_FAST_CACHE"):
        return Path(os.environ["GEFEN_FAST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gefen-fast"


def installed_path(key: str | None = None) -> Path:
    """Where the install-time build put the library for ``key`` (the current one by default)."""
    return _build.INSTALLED_DIR / _build.library_name(key)


def library_path() -> Path:
    """The library for the current sources and CPU: the installed one, else one built in the cache."""
    key = _build.build_key()
    installed = installed_path(key)
    if installed.exists():
        return installed
    if not _build.compiler_available():
        raise _build.NoCompiler(
            f"no C compiler ({' '.join(_build.compiler())}) and no installed kernels for this CPU and "
            f"these sources ({installed}); reinstall gefen-fast where a C compiler exists"
        )
    path, built = _build.cached_library(cache_dir(), key)
    if built is not None:
        warnings.warn(
            f"gefen_fast: the installed kernels do not match these sources or this CPU; built "
            f"{path} in {built['seconds']:.1f} s (reinstall gefen-fast to build them at install time)",
            RuntimeWarning,
            stacklevel=3,
        )
    return path


_VOID_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_I32 = ctypes.c_int32
_TABLE_P = ctypes.POINTER(Table)


def _declare(lib: ctypes.CDLL) -> None:
    lib.gefen_abi_version.restype = ctypes.c_int
    lib.gefen_capabilities.restype = ctypes.c_int
    lib.gefen_step_batch.argtypes = [ctypes.POINTER(Work), _I32, _I32]
    lib.gefen_step_batch.restype = ctypes.c_int
    lib.gefen_last_scratch_bytes.restype = _I64
    lib.gefen_profile_read.argtypes = [_VOID_P, _I32]
    lib.gefen_profile_read.restype = ctypes.c_int
    suffixes = ("f32", "bf16", "f16") if lib.gefen_capabilities() & CAP_HALF else ("f32", "bf16")
    for s in suffixes:
        fn = getattr(lib, f"gefen_period_statistics_{s}")
        fn.argtypes = [_VOID_P, _I64, _VOID_P, _VOID_P, _VOID_P, _I32, _VOID_P, _VOID_P, _I32]
        fn.restype = ctypes.c_int
        fn = getattr(lib, f"gefen_histogram_{s}")
        fn.argtypes = [_VOID_P, _I64, _I64, _VOID_P, _I32]
        fn.restype = ctypes.c_int
    lib.gefen_nearest_codes.argtypes = [_VOID_P, _I64, _TABLE_P, _VOID_P, _VOID_P]
    lib.gefen_nearest_codes.restype = None
    lib.gefen_codebook_dp.argtypes = [_VOID_P, _VOID_P, _I64, _I64, _VOID_P, _I32]
    lib.gefen_codebook_dp.restype = ctypes.c_int


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded kernels with their signatures declared."""
    # torch is imported first and ships the OpenMP runtime under the same soname, so the
    # kernels run on torch's own thread pool (no second pool competing for the cores).
    path = library_path()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise BuildError(f"loading the compiled kernels {path} failed: {exc}") from None
    try:
        lib.gefen_abi_version.restype = ctypes.c_int
        version = lib.gefen_abi_version()
    except AttributeError:
        version = None
    if version != ABI_VERSION:
        raise BuildError(f"{path} has kernel ABI {version}, this gefen_fast needs {ABI_VERSION}")
    _declare(lib)
    return lib


def capabilities() -> int:
    return library().gefen_capabilities()


def prepare() -> Path:
    """Load (building if needed) the kernels now; returns the library's path. Raises BuildError."""
    library()
    return library_path()

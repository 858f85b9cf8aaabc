"""The tests never write into the user's kernel cache: a runtime build (tests/test_build.py) goes to a private
one.
Kernel variants built with extra compiler flags (narrower CPUs, test hooks) are built once per session."""

from __future__ import annotations

import ctypes
import os

import pytest

from gefen_fast import _build, native


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory):
    previous = os.environ.get("GEFEN_FAST_CACHE")
    os.environ["GEFEN_FAST_CACHE"] = str(tmp_path_factory.mktemp("gefen-fast-cache"))
    yield
    if previous is None:
        os.environ.pop("GEFEN_FAST_CACHE", None)
    else:
        os.environ["GEFEN_FAST_CACHE"] = previous


@pytest.fixture(scope="session")
def kernel_variant(tmp_path_factory):
    """``kernel_variant(*flags)``: the kernel library compiled with these extra flags, declared
    like the installed one; each set of flags is built once per session."""
    built = {}

    def build(*flags):
        if flags not in built:
            target = tmp_path_factory.mktemp("variant") / "gefen_kernels-variant.so"
            _build.compile_library(target, extra_flags=flags)
            lib = ctypes.CDLL(str(target))
            native._declare(lib)
            built[flags] = lib
        return built[flags]

    return build

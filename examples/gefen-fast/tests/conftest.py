"""Build the C kernels once per test session in a private cache, so the tests also prove a cold build works."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory):
    if "GEFEN_FAST_TEST_SHARED_CACHE" in os.environ:
        yield
        return
    previous = os.environ.get("GEFEN_FAST_CACHE")
    os.environ["GEFEN_FAST_CACHE"] = str(tmp_path_factory.mktemp("gefen-fast-cache"))
    from gefen_fast import native

    native.library.cache_clear()
    yield
    native.library.cache_clear()
    if previous is None:
        os.environ.pop("GEFEN_FAST_CACHE", None)
    else:
        os.environ["GEFEN_FAST_CACHE"] = previous

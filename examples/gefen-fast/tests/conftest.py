"""The tests never write into the user's kernel cache: a runtime build (tests/test_build.py) goes to a private one."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory):
    previous = os.environ.get("GEFEN_FAST_CACHE")
    os.environ["GEFEN_FAST_CACHE"] = str(tmp_path_factory.mktemp("gefen-fast-cache"))
    yield
    if previous is None:
        os.environ.pop("GEFEN_FAST_CACHE", None)
    else:
        os.environ["GEFEN_FAST_CACHE"] = previous

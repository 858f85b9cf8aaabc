"""Fixtures shared by the suite's modules.

A plugin module, not a ``conftest.py``: the plugin registers it when it collects the first suite
module (SPEC 4.1.7), so these fixtures exist only in a session that runs the suite, and pytest never
imports anything of the suite under a name of the user's repository.
"""

from __future__ import annotations

import pytest

from gefen_conformance.plugin.hooks import implementation_for
from gefen_conformance.harness.sharding import WorldOfOne

from gefen_conformance.suite import checkpoints


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test."""
    return implementation_for(request.config)


@pytest.fixture(scope="session")
def impl_spec(request) -> str:
    """The ``--impl`` spec string of the implementation under test: what rank bodies take as
    their first argument and resolve inside each rank (``gefen_conformance.implementations.registry.resolve``)."""
    return request.config.getoption("--impl")


@pytest.fixture(scope="session")
def saved(tmp_path_factory) -> checkpoints.Checkpoints:
    """The session's cache of multi-rank checkpoints, shared by every DCP scenario module."""
    return checkpoints.Checkpoints(tmp_path_factory.mktemp("dcp-checkpoints"))


@pytest.fixture(scope="session")
def one_rank():
    """A gloo group of one in this process, for in-process DCP saves and loads; it is the
    process's current World while the session lasts (``gefen_conformance.harness.world.current()``)."""
    w = WorldOfOne()
    yield w
    w.close()

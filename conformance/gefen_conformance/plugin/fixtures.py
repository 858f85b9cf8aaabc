"""Fixtures and markers shared by the suite's modules.

A plugin module, not a ``conftest.py``: the plugin registers it when it collects the first suite
module (SPEC 4.1.7), so these fixtures and the suite's markers (``gefen_clause``,
``gefen_requires``) exist only in a session that runs the suite, and pytest never imports anything
of the suite under a name of the user's repository. Every name carries the ``gefen_`` prefix, so
that none meets another plugin's or project's (SPEC 4.1.5).
"""

from __future__ import annotations

import pytest

from gefen_conformance import judging
from gefen_conformance.certificate import numeric_profile
from gefen_conformance.harness.sharding import WorldOfOne
from gefen_conformance.implementations import registry
from gefen_conformance.plugin import markers
from gefen_conformance.plugin.hooks import implementation_for
from gefen_conformance.suite import checkpoints


def pytest_configure(config):
    """Registered after the session configured: pytest calls this at registration."""
    markers.register(config)


@pytest.fixture(scope="session")
def gefen_impl(request):
    """The implementation under test."""
    return implementation_for(request.config)


@pytest.fixture
def gefen_judge(request, gefen_impl) -> judging.Judge:
    """This test's :class:`~gefen_conformance.judging.Judge`: it records the test's comparisons
    (margins, notes, a reproducer) under the run's numeric profile and raises with the problems; the
    plugin takes what it recorded into the test's report."""
    judge = judging.Judge(gefen_impl, bitwise=numeric_profile.bitwise(gefen_impl))
    request.node.stash[judging.JUDGE] = judge
    return judge


@pytest.fixture(scope="session")
def gefen_reference():
    """The reference implementation: the other side of every comparison with the reference."""
    return registry.resolve("reference")


@pytest.fixture(scope="session")
def gefen_ranks():
    """``gefen_ranks(body, world_size, args, timeout=..., **options)``: run a rank body on the active
    launcher (:func:`gefen_conformance.suite.checkpoints.run`). Implementations among ``args``
    reach each rank as themselves. The warm-up starts and prepares the rank processes before
    the first test that asks for this fixture, directly or through another (SPEC 4.2.11)."""
    return checkpoints.run


@pytest.fixture(scope="session")
def gefen_checkpoints(tmp_path_factory, gefen_ranks) -> checkpoints.Checkpoints:
    """The session's cache of multi-rank checkpoints, shared by every DCP scenario module."""
    return checkpoints.Checkpoints(tmp_path_factory.mktemp("dcp-checkpoints"))


@pytest.fixture(scope="session")
def gefen_one_rank():
    """A gloo group of one in this process, for in-process DCP saves and loads; it is the
    process's current World while the session lasts (``gefen_conformance.harness.world.current()``)."""
    w = WorldOfOne()
    yield w
    w.close()

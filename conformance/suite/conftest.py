"""Fixtures shared by the suite's modules."""

from __future__ import annotations

import pytest

from conformance.sharding import WorldOfOne

from . import dcp_checks


@pytest.fixture(scope="session")
def saved(tmp_path_factory) -> dcp_checks.Checkpoints:
    """The session's cache of multi-rank checkpoints, shared by every DCP scenario module."""
    return dcp_checks.Checkpoints(tmp_path_factory.mktemp("dcp-checkpoints"))


@pytest.fixture(scope="session")
def one_rank():
    """A gloo group of one in this process, for in-process DCP saves and loads."""
    w = WorldOfOne()
    yield w
    w.close()

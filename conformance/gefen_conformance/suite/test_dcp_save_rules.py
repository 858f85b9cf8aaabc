"""The rules a DCP save states that one process observes, one example per rule and input (SPEC
2.1-2.6): in a gloo group of one, the implementation's optimizer over ``Shard(0)`` DTensors is
handed to its adapter, and the rule is checked on the ``state_dict()`` it returns, on the
placeholders in it, on its save planner and on the default writer's staging; or the save is
refused with the rule's error and words. Every check is exact, in every numeric profile.

What needs several ranks (agreement, the layout digest, slot scalars across ranks) is in
``test_dcp_failures``, ``test_dcp_layout_rules`` and the payload scenarios. The examples are in
:mod:`gefen_conformance.suite.save_rule_examples`; the check is
:func:`gefen_conformance.suite.rule_checks.check_save`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.save_rule_examples import SAVES


@pytest.mark.gefen_clause("2.1", "2.2", "2.3", "2.4", "2.5", "2.6")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("example", rule_checks.params(SAVES))
def test_save_rule(gefen_impl, gefen_one_rank, example):
    rule_checks.check_save(gefen_impl, example, gefen_one_rank)

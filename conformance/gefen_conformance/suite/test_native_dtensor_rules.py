"""The native state of an optimizer over DTensor parameters (SPEC 1.12.11), in the session's process
group of one: its own ``state_dict()``, stepped or not, is refused with ValueError naming ``DTensor``
(item 1: a native state dict would hold one rank's shards as if they were the whole); a native load
of a never-stepped checkpoint loads (its hyperparameters and names replace the live ones, and the
next step is a fresh optimizer's), a stepped one is refused with ValueError naming ``DTensor`` and
changes nothing (item 2).

The examples are :data:`gefen_conformance.suite.rule_examples.SHARDED_LOAD`; the check is
:func:`gefen_conformance.suite.rule_checks.check_sharded_load`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import NATIVE_STATE_DICT
from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.rule_examples import SHARDED_LOAD


@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("example", rule_checks.params(SHARDED_LOAD))
def test_native_state_of_dtensor_parameters(gefen_impl, gefen_one_rank, example):
    rule_checks.check_sharded_load(gefen_impl, example)

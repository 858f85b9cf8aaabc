"""A native load into an optimizer over DTensor parameters (SPEC 1.12.11 item 2), in the session's
process group of one: a never-stepped checkpoint loads (its hyperparameters and names replace the
live ones, and the next step is a fresh optimizer's), a stepped one is refused with ValueError naming
``DTensor`` and changes nothing.

Item 1 (a native ``state_dict()`` of DTensor parameters refused) is a documented difference from
gefen-x 0.5.0 (SPEC 1.14 D13) that this module does not test yet. The examples are
:data:`gefen_conformance.suite.rule_examples.SHARDED_LOAD`; the check is
:func:`gefen_conformance.suite.rule_checks.check_sharded_load`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import NATIVE_STATE_DICT
from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.rule_examples import SHARDED_LOAD


@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("example", rule_checks.params(SHARDED_LOAD))
def test_native_load_into_dtensor_parameters(gefen_impl, gefen_one_rank, example):
    rule_checks.check_sharded_load(gefen_impl, example)

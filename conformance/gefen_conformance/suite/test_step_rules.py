"""The rules a step states, one example per rule and input (SPEC 1.4-1.10, 1.13): each example is
an input-space case built so that its rule decides the outcome, stepped by the reference and by the
implementation and compared under the run's numeric profile (SPEC 4.3.10, 5.6).

The examples are in :mod:`gefen_conformance.suite.step_rule_examples`; the check is
:func:`gefen_conformance.suite.rule_checks.check_stepped`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import NATIVE_STATE_DICT
from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.step_rule_examples import STEPPED


@pytest.mark.gefen_clause("4.3.10", "5.6")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("example", rule_checks.params(STEPPED))
def test_step_rule(gefen_impl, gefen_judge, example):
    rule_checks.check_stepped(gefen_impl, example, gefen_judge)

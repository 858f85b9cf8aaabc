"""The constructor's validation and parameter-list rules, one example per row and input (SPEC
1.1.2, 1.1.6): each example makes exactly one argument invalid (SPEC 1.1.4) and expects the row's
error naming the row's words, or shows a parameter list the rule accepts and what it builds.

Rows 8-10 of §1.1.2 bind the reference only and are not certified (SPEC 0.2.4). The examples are
in :mod:`gefen_conformance.suite.rule_examples`; the check is
:func:`gefen_conformance.suite.rule_checks.check_constructor`."""

from __future__ import annotations

import pytest

from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.rule_examples import CONSTRUCTOR


@pytest.mark.gefen_clause("1.1.2", "1.1.6")
@pytest.mark.parametrize("example", rule_checks.params(CONSTRUCTOR))
def test_constructor_rule(gefen_impl, example):
    rule_checks.check_constructor(gefen_impl, example)

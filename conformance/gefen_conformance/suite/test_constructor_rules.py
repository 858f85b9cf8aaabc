"""The constructor's rules, one example per row and input: its validation and parameter-list rules
(SPEC 1.1.2, 1.1.6), each example making exactly one argument invalid (SPEC 1.1.4) and expecting
the row's error naming the row's words, or showing a parameter list the rule accepts and what it
builds; the order SPEC 1.1.4 lets the suite certify (rows 2-6 before row 12); the signature and its
defaults (SPEC 1.1.1, 1.1.5); groups (SPEC 1.2), names and their provenance (SPEC 1.3) and a tensor
learning rate (SPEC 1.4.1), as the built optimizer's ``defaults`` and ``param_groups`` show them.

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

"""What the native state dict shows (SPEC 1.11), from construction on (SPEC 1.1.5, 1.1.7, 1.2.6,
1.3.1, 1.3.5), and a native round trip (SPEC 1.12.10): each example builds a small optimizer,
steps it at most twice with seeded gradients and checks what the rule states in its
``state_dict()``, exactly in every profile (keys, types, dtypes, shapes, names and counters; the
round trip compares the implementation with itself, bit for bit).

The examples are :data:`gefen_conformance.suite.rule_examples.NATIVE_STATE`; the check is
:func:`gefen_conformance.suite.rule_checks.check_native_state`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import NATIVE_STATE_DICT
from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.rule_examples import NATIVE_STATE


@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("example", rule_checks.params(NATIVE_STATE))
def test_native_state_rule(gefen_impl, example):
    rule_checks.check_native_state(gefen_impl, example)

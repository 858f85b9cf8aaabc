"""The calls a step refuses before anything changes (SPEC 1.10.1 items 2-4, 1.10.2, 1.10.5): each
example spoils one call of the calling protocol's workload (a gradient of another layout, dtype or
shape, or invalid GradScaler attributes); the implementation must raise the rule's error naming its
words and leave every parameter, its state, codebook and global step as they were. Exact in every
numeric profile. Most calls start from the reference's checkpoint, loaded natively.

The examples are :data:`gefen_conformance.suite.step_rule_examples.REFUSED_CALLS`; the check is
:func:`gefen_conformance.suite.rule_checks.check_step_refused`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import NATIVE_STATE_DICT
from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.step_rule_examples import REFUSED_CALLS


@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("example", rule_checks.params(REFUSED_CALLS))
def test_step_refused(gefen_impl, example):
    rule_checks.check_step_refused(gefen_impl, example)

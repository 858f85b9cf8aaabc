"""A native load's rules, stage by stage (SPEC 1.12.2-1.12.7): the reference's checkpoint with
exactly one defect is refused with ValueError and changes nothing, neither the live optimizer
(values, tensor identities and versions) nor the caller's dict (SPEC 1.12.1, 1.12.9); a checkpoint
a rule accepts (format version 2, a global step only in the metadata, an untagged checkpoint,
one-element counter tensors, scratch keys, a legacy one-param-per-group checkpoint) loads exactly
as the reference loads it, in every profile.

The examples are in :mod:`gefen_conformance.suite.rule_examples`; the check is
:func:`gefen_conformance.suite.rule_checks.check_native_load`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import NATIVE_STATE_DICT
from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.rule_examples import NATIVE_LOAD


@pytest.mark.gefen_clause("1.12.1", "1.12.9")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
@pytest.mark.parametrize("example", rule_checks.params(NATIVE_LOAD))
def test_native_load_rule(gefen_impl, example):
    rule_checks.check_native_load(gefen_impl, example)

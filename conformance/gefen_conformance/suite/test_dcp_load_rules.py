"""A DCP load's rules that one process can show, one example at a time (SPEC 3.1-3.7): the
reference's checkpoint with exactly one defect, given to the adapter's ``load_state_dict()``, is
refused with the error its rule names and changes nothing; a checkpoint a rule accepts (plain
local shards, counters in every form the counter rule reads, a fresh slot, ``dcp.load`` itself)
restores so that the state re-saved at once holds the checkpoint's header, identities,
hyperparameters and counters exactly, and its dense state re-quantized.

The examples are in :mod:`gefen_conformance.suite.dcp_load_examples`; the checks are
:mod:`gefen_conformance.suite.dcp_load_checks`."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.suite import dcp_load_checks, rule_checks
from gefen_conformance.suite.dcp_load_examples import DCP_LOAD


@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("example", rule_checks.params(DCP_LOAD))
def test_dcp_load_rule(gefen_impl, gefen_one_rank, example):
    dcp_load_checks.check(gefen_impl, example, gefen_one_rank)

"""Hostile checkpoints are refused with a clear error on every rank, and change nothing (SPEC 3.10).

"Nothing changed" compares one implementation's live state with itself, bit for bit (tensor
values, identities and versions), in both numeric profiles (SPEC 5.6.11)."""

from __future__ import annotations

import pytest

from conformance.implementation import DCP_RESHARD
from conformance.ranks import run_on_ranks

from . import hostile, margins


@pytest.fixture(scope="module")
def variants(tmp_path_factory, one_rank):
    return one_rank, hostile.craft_all(str(tmp_path_factory.mktemp("hostile")), one_rank.mesh)


@pytest.mark.clause("3.10.1")
@pytest.mark.requires(DCP_RESHARD)
def test_the_valid_checkpoint_loads(impl, variants):
    world, paths = variants
    outcome = hostile.load_attempt(impl, paths["valid"], world.mesh)
    assert outcome["error"] is None, outcome["error"]


@pytest.mark.clause("3.10.1", "3.10.2")
@pytest.mark.requires(DCP_RESHARD)
@pytest.mark.parametrize("case", hostile.CASES)
def test_refused_without_mutation(impl, variants, case):
    world, paths = variants
    outcome = hostile.load_attempt(impl, paths[case], world.mesh)
    assert outcome["error"] is not None, f"{case}: the load was accepted"
    margins.exact("live state after a refused hostile load", int(not outcome["unchanged"]), 1)
    assert outcome["unchanged"], f"{case}: refused, but live state changed ({outcome['error']})"


@pytest.mark.clause("3.10.1", "3.10.2", "3.2.3")
@pytest.mark.requires(DCP_RESHARD)
@pytest.mark.parametrize("case", ["aborted-save-no-metadata", "flipped-archive-header", "nan-momentum", "renamed-parameter"])
def test_refused_on_every_rank(impl, variants, case, request):
    _, paths = variants
    outcomes = run_on_ranks(hostile.load_attempt_on_rank, 2, args=(request.config.getoption("--impl"), paths[case]),
                            timeout=30.0, allow_failure=True)
    for o in outcomes:
        assert o.status == "ok", f"rank {o.rank} {o.status}: {o.message}\n{o.traceback}"
        assert o.value["error"] is not None, f"rank {o.rank} accepted {case}"
        margins.exact("live state after a refused hostile load", int(not o.value["unchanged"]), 1)
        assert o.value["unchanged"], f"rank {o.rank} changed live state"

"""Stable caller names are accepted by provenance, not by spelling (SPEC 2.4, 1.3.6)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conformance.implementation import DCP_RESHARD
from conformance.sharding import sharded_parameter


def _trained(impl, one_rank, named):
    opt = impl.make_optimizer([{"params": named}], factored_v_2d=False)
    for step in range(2):
        for i, (_, p) in enumerate(named):
            p.grad = sharded_parameter(torch.randn(p.shape, generator=torch.Generator().manual_seed(step * 10 + i)),
                                       one_rank.mesh).detach()
        opt.step()
    return opt


@pytest.mark.clause("2.4", "1.3.6")
@pytest.mark.requires(DCP_RESHARD)
def test_caller_name_that_looks_positional_saves_and_loads(impl, one_rank):
    """A model may really call a parameter ``param_0``: the caller gave it, so it is a stable identity."""
    named = [("param_0", sharded_parameter(torch.linspace(-1, 1, 32).reshape(8, 4), one_rank.mesh)),
             ("group_0_param_1", sharded_parameter(torch.linspace(-1, 1, 12).reshape(4, 3), one_rank.mesh))]
    opt = _trained(impl, one_rank, named)
    path = one_rank.path()
    dcp.save({"optimizer": impl.dcp_state(opt)}, checkpoint_id=path)
    fresh = [(n, sharded_parameter(torch.zeros(p.shape), one_rank.mesh)) for n, p in named]
    target = impl.make_optimizer([{"params": fresh}], factored_v_2d=False)
    dcp.load({"optimizer": impl.dcp_state(target)}, checkpoint_id=path)


@pytest.mark.clause("2.4", "1.3.6")
@pytest.mark.requires(DCP_RESHARD)
def test_synthesized_names_are_refused(impl, one_rank):
    """Names the optimizer made up depend on registration order: saving against them is refused."""
    params = [sharded_parameter(torch.linspace(-1, 1, 32).reshape(8, 4), one_rank.mesh)]
    opt = impl.make_optimizer(params, factored_v_2d=False)
    with pytest.raises(BaseException) as info:
        dcp.save({"optimizer": impl.dcp_state(opt)}, checkpoint_id=one_rank.path())
    assert not isinstance(info.value, (KeyboardInterrupt, SystemExit))

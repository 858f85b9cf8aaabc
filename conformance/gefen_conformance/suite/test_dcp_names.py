"""Stable caller names are accepted by provenance, not by spelling (SPEC 2.4, 1.3.6)."""

from __future__ import annotations

import pytest

from gefen_conformance.implementations.contract import DCP_RESHARD
from gefen_conformance.workload import models, saving


def _gradient_seed(name: str, index: int, step: int) -> int:
    return 10 * step + index


#: A model whose caller really named its parameters like the optimizer's synthesized names.
POSITIONAL_LOOKING = models.Model(
    shapes={"param_0": (8, 4), "group_0_param_1": (4, 3)},
    groups=(("param_0", "group_0_param_1"),),
    init=models.linspace(-1, 1),
    seed=_gradient_seed,
)


@pytest.mark.gefen_clause("2.4", "1.3.6", "2.4.1")
@pytest.mark.gefen_requires(DCP_RESHARD)
def test_caller_name_that_looks_positional_saves_and_loads(gefen_impl, gefen_one_rank):
    """A model may really call a parameter ``param_0``: the caller gave it, so it is a stable identity."""
    _, opt = saving.trained(gefen_impl, POSITIONAL_LOOKING, gefen_one_rank.mesh, steps=range(2))
    path = gefen_one_rank.path()
    saving.save(gefen_impl, opt, path, planner=False)
    fresh = models.parameters(POSITIONAL_LOOKING, mesh=gefen_one_rank.mesh)
    target = gefen_impl.make_optimizer(models.param_groups(POSITIONAL_LOOKING, fresh), factored_v_2d=False)
    saving.load(gefen_impl, target, path)


@pytest.mark.gefen_clause("2.4", "1.3.6")
@pytest.mark.gefen_requires(DCP_RESHARD)
def test_synthesized_names_are_refused(gefen_impl, gefen_one_rank):
    """Names the optimizer made up depend on registration order: saving against them is refused."""
    params = models.parameters(POSITIONAL_LOOKING, mesh=gefen_one_rank.mesh)
    opt = gefen_impl.make_optimizer(list(params.values())[:1], factored_v_2d=False)
    with pytest.raises(BaseException) as info:
        saving.save(gefen_impl, opt, gefen_one_rank.path(), planner=False)
    assert not isinstance(info.value, (KeyboardInterrupt, SystemExit))

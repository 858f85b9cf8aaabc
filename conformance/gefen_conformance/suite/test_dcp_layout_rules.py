"""The layouts a DCP save refuses before its first byte, one rule at a time (SPEC 2.4.1): on 2
ranks, every rank builds the same optimizer with exactly one defect of layout and calls the
adapter's ``state_dict()``; every rank raises RuntimeError naming the rule's words, and a valid
layout saves. One job of the launcher tries every layout in turn (each attempt is collective).

Rules 2.4.1#1 (capturable mode) and #9 (a second placement) are not certified (SPEC 0.2.4).
"""

from __future__ import annotations

import pytest
import torch

from gefen_conformance.harness import world
from gefen_conformance.harness.sharding import shard, world_mesh
from gefen_conformance.implementations.contract import DCP_RESHARD, Implementation
from gefen_conformance.judging import assert_no_problems
from gefen_conformance.suite import checkpoints

WORLD = 2
ROWS, COLUMNS = 8, 16

#: ``(rule, layout, words the RuntimeError names or None)``: the valid layout first.
LAYOUTS = [
    (None, "valid", None),
    ("2.4.1#2", "factored", "factored_v_2d"),
    ("2.4.1#3", "sharded-mode", None),
    ("2.4.1#4", "no-param-names", "stable param_names"),
    ("2.4.1#4", "param-names-short", "stable param_names"),
    ("2.4.1#5", "synthesized-name", "synthesized"),
    ("2.4.1#6", "plain-tensor", "DTensor"),
    ("2.4.1#7", "two-dimensional-mesh", "one-dimensional"),
    ("2.4.1#8", "reordered-mesh", "canonical"),
    ("2.4.1#10", "replicated", None),
    ("2.4.1#10", "shard-1", None),
    ("2.4.1#11", "no-parameter", None),
    ("2.4.1#12", "name-in-two-groups", "unique across every group"),
]


# ------------------------------------------------------------------------------ rank body


def _full(seed: int) -> torch.Tensor:
    return torch.randn(ROWS, COLUMNS, generator=torch.Generator().manual_seed(seed))


def _placed(full: torch.Tensor, mesh, placements) -> torch.Tensor:
    from torch.distributed.tensor import DTensor, Shard

    here = world.current()
    if placements == [Shard(1)]:
        local = full.chunk(here.size, dim=1)[here.rank]
    elif len(placements) == 1 and placements[0].is_replicate():
        local = full
    else:
        local = full.chunk(here.size, dim=0)[here.rank]
    return DTensor.from_local(
        local.clone(), mesh, placements, run_check=False, shape=full.shape, stride=full.stride()
    )


def _optimizer(impl: Implementation, layout: str):
    """The optimizer over one or two 8 x 16 parameters with ``layout``'s one defect."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    mesh = world_mesh()
    here = world.current()
    param = torch.nn.Parameter(shard(_full(1), mesh))
    options = {"factored_v_2d": layout == "factored"}
    if layout == "synthesized-name":
        return impl.make_optimizer([param], **options)
    if layout == "plain-tensor":
        return impl.make_optimizer([("w", torch.nn.Parameter(_full(1)))], **options)
    if layout == "two-dimensional-mesh":
        two = init_device_mesh(mesh.device_type, (1, here.size), mesh_dim_names=("replicate", "shard"))
        param = torch.nn.Parameter(_placed(_full(1), two, [Replicate(), Shard(0)]))
    elif layout == "reordered-mesh":
        reordered = DeviceMesh(mesh.device_type, list(reversed(range(here.size))))
        param = torch.nn.Parameter(_placed(_full(1), reordered, [Shard(0)]))
    elif layout in ("replicated", "shard-1"):
        placement = Replicate() if layout == "replicated" else Shard(1)
        param = torch.nn.Parameter(_placed(_full(1), mesh, [placement]))
    if layout == "name-in-two-groups":
        other = torch.nn.Parameter(shard(_full(2), mesh))
        return impl.make_optimizer([{"params": [("w", param)]}, {"params": [("w", other)]}], **options)
    optimizer = impl.make_optimizer([("w", param)], **options)
    group = optimizer.param_groups[0]
    if layout == "sharded-mode":
        group["sharded_mode"] = "rows"
    elif layout == "no-param-names":
        del group["param_names"]
    elif layout == "param-names-short":
        group["param_names"] = []
    elif layout == "no-parameter":
        group["params"], group["param_names"], group["param_names_synthesized"] = [], [], []
    return optimizer


def save_each_layout(impl: Implementation) -> dict:
    """Rank body (collective): ``{layout: the RaisedError of its state_dict() call, or None}``."""
    raised = {}
    for _, layout, _ in LAYOUTS:
        try:
            impl.dcp_state(_optimizer(impl, layout)).state_dict()
        except Exception as exc:  # the outcome is the result
            raised[layout] = checkpoints.RaisedError.of(exc)
        else:
            raised[layout] = None
    return raised


# ------------------------------------------------------------------------------ the test

_RESULTS: dict = {}


def _results(impl: Implementation) -> list:
    """Every rank's results of :func:`save_each_layout`, one job per implementation and session."""
    key = (impl.name, impl.version, id(impl.make_optimizer))
    if key not in _RESULTS:
        _RESULTS[key] = checkpoints.run(save_each_layout, WORLD, (impl,))
    return _RESULTS[key]


def _params():
    for rule, layout, words in LAYOUTS[1:]:
        yield pytest.param(layout, words, id=layout, marks=pytest.mark.gefen_clause(rule))


@pytest.mark.gefen_clause("2.4", "4.3.3")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("layout,words", _params())
def test_layout_refused_on_every_rank(gefen_impl, layout, words):
    results = _results(gefen_impl)
    problems = [
        f"rank {r}: the valid layout was refused: {res['valid']}"
        for r, res in enumerate(results)
        if res["valid"]
    ]
    for rank, result in enumerate(results):
        error = result[layout]
        if error is None:
            problems.append(
                f"rank {rank}: saved the {layout} layout; expected RuntimeError"
                + (f" naming {words!r}" if words else "")
            )
        elif not error.is_a(RuntimeError) or (words and words not in error.message):
            expected = "RuntimeError" + (f" naming {words!r}" if words else "")
            problems.append(f"rank {rank}: raised {error.type}: {error.message!r}; expected {expected}")
    assert_no_problems(problems)

"""The layouts a DCP save refuses before its first byte, one rule at a time (SPEC 2.4.1): on 2
ranks, every rank builds the same optimizer with exactly one defect of layout and calls the
adapter's ``state_dict()``; every rank raises RuntimeError naming the rule's words, and a valid
layout saves. One job of the launcher tries every layout in turn (each attempt is collective).

The same job shows what several ranks add: no layout is refused by the adapter's constructor
there, only by the synchronized ``state_dict()`` (SPEC 2.3.2), and hyperparameters that differ
across ranks are not checked at save (SPEC 2.4.4).

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

#: ``(rule, layout)``: saves that differ across ranks in what a save does not check.
ACCEPTED = [("2.4.4", "hypers-differ-across-ranks")]


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
    elif layout == "hypers-differ-across-ranks":
        group["lr"], group["weight_decay"] = 1e-3 * (here.rank + 1), 0.01 * here.rank
    return optimizer


def save_each_layout(impl: Implementation) -> dict:
    """Rank body (collective): ``{layout: the RaisedError of its save, or None}`` for every layout
    (the adapter's constructor, then its ``state_dict()``), and under ``"constructed"`` ``{layout:
    the RaisedError of the constructor alone, or None}``."""
    raised, constructed = {}, {}
    for layout in [layout for _, layout, _ in LAYOUTS] + [layout for _, layout in ACCEPTED]:
        optimizer = _optimizer(impl, layout)
        try:
            adapter = impl.dcp_state(optimizer)
        except Exception as exc:  # the outcome is the result
            raised[layout] = constructed[layout] = checkpoints.RaisedError.of(exc)
            continue
        constructed[layout] = None
        try:
            adapter.state_dict()
        except Exception as exc:  # the outcome is the result
            raised[layout] = checkpoints.RaisedError.of(exc)
        else:
            raised[layout] = None
    return {**raised, "constructed": constructed}


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


@pytest.mark.gefen_clause("2.3.2", "4.3.3")
@pytest.mark.gefen_requires(DCP_RESHARD)
def test_no_layout_refused_by_the_constructor_on_several_ranks(gefen_impl):
    """A rank-conditional layout error at construction would leave the other ranks blocked in the
    first collective of ``state_dict()``: with peers, every layout error comes from there."""
    problems = [
        f"rank {rank}: the adapter's constructor raised for the {layout} layout: {error}"
        for rank, result in enumerate(_results(gefen_impl))
        for layout, error in result["constructed"].items()
        if error is not None
    ]
    assert_no_problems(problems)


@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(layout, id=layout, marks=pytest.mark.gefen_clause(rule, "4.3.3"))
        for rule, layout in ACCEPTED
    ],
)
def test_saved_although_ranks_differ(gefen_impl, layout):
    problems = [
        f"rank {rank}: refused the {layout} layout: {result[layout]}"
        for rank, result in enumerate(_results(gefen_impl))
        if result[layout] is not None
    ]
    assert_no_problems(problems)

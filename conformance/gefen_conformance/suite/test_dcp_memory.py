"""Memory accounting on the CPU (SPEC 5.4): a bounded save with the implementation's planner and
an in-place optimizer step.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

from gefen_conformance.harness import world
from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations.contract import (
    DCP_RESHARD,
    DCP_SAVE_PLANNER,
    FACTORED_V,
    Implementation,
)
from gefen_conformance.suite import checkpoints
from gefen_conformance.workload import models, saving
from gefen_oracles import kernel_bounds
from gefen_oracles.digests import content_digests
from gefen_oracles.memory import StorageTracker, pointer_reuse, state_addresses

_LAYERS = tuple(f"layer{i}.weight" for i in range(8))
#: Eight equal slots, large enough that a save holding all of them at once exceeds the bound;
#: gradients are multiples of 1/8 so codebook learning sees few distinct values (cheap).
MEMORY = models.Model(
    shapes={n: (64, 64) for n in _LAYERS},
    groups=(_LAYERS[:2], _LAYERS[2:]),
    init=models.per_name,
    salt="init",
    seed=models.crc32_seed("{name}:grad{step}"),
    hypers=models.GROUP_HYPERS,
    quantum=1 / 8,
)

#: A 2-D parameter (block or factored second moment) and a 1-D one, plain tensors.
IN_PLACE = models.Model(
    shapes={"w": (64, 32), "b": (96,)}, groups=(("w", "b"),), init=models.one_stream, salt=5403
)


def planned_save_peak(impl: Implementation, root: str) -> dict:
    """Rank body (SPEC 5.4.2, world size 1): the peak extra bytes
    (``gefen_oracles.memory.StorageTracker``) of a save of the adapter with ``impl.save_planner()``, and
    the same with DCP's default planner.

    DCP's ``FileSystemWriter`` keeps every tensor it wrote until the file it wrote it to is closed
    (SPEC 2.5.3), so with one payload file per rank it would hold every slot whatever the planner
    does. The measured saves use ``single_file_per_rank=False`` (one file per item): the writer
    then holds one item at a time and the peak is the planner's. A standard save of the same
    state is written too, for the test to compare contents.
    """
    _, optimizer = saving.trained(impl, MEMORY, world_mesh(), steps=(1, 2))
    saving.save(impl, optimizer, os.path.join(root, "standard"))
    peaks = {}
    for name, planner in (("planned", impl.save_planner() if impl.save_planner else None), ("default", None)):
        writer = dcp.FileSystemWriter(os.path.join(root, name), single_file_per_rank=False)
        state = {"optimizer": impl.dcp_state(optimizer)}
        tracker = StorageTracker()
        with tracker:
            dcp.save(state, storage_writer=writer, planner=planner, process_group=world.current().group)
        del state, writer
        peaks[name] = tracker.peak_bytes
    return peaks


@pytest.mark.gefen_clause("5.4.2", "2.5.2", "5.4.1")
@pytest.mark.gefen_requires(DCP_RESHARD, DCP_SAVE_PLANNER)
def test_planned_save_holds_one_slot_at_a_time(gefen_impl, gefen_checkpoints, gefen_judge):
    """At world size 1, the peak extra bytes of a save with ``impl.save_planner()`` stay within the
    twice the largest slot's dense momentum and second moment plus the slack. The slots are large enough
    that a save holding all of them at once would exceed the bound; a save with DCP's default
    planner (placeholders keep their expansions until the save ends, SPEC 2.5.3) is measured
    alongside for the record. The measured saves write one file per item (see
    :func:`planned_save_peak`) and must hold the same content as a standard save."""
    root = gefen_checkpoints.scratch("memory")
    [peaks] = checkpoints.run(planned_save_peak, 1, (gefen_impl, str(root)))
    slots = [2 * 4 * torch.Size(s).numel() for s in MEMORY.shapes.values()]
    bound = kernel_bounds.save_memory_bound(max(slots))  # SPEC 5.4.2
    assert sum(slots) > bound, "the workload cannot tell a bounded save from one holding every slot"
    standard = content_digests(root / "standard")
    for name in ("planned", "default"):
        digests = content_digests(root / name)
        # one state saved three ways by one implementation: byte identity in every profile (SPEC 5.6.11)
        gefen_judge.assert_exact(
            "one state saved with a file per item (content digests)",
            sum(digests.get(k) != v for k, v in standard.items()) + len(set(digests) - set(standard)),
            len(standard),
            [f"the {name} save's content differs from a standard save"],
        )
    gefen_judge.assert_within(
        "planned save: peak extra bytes",
        peaks["planned"],
        bound,
        f"peak extra bytes {peaks['planned']} with the planner exceed {bound} = "
        f"{kernel_bounds.SAVE_MEMORY_SLOTS} x {max(slots)} (the largest slot's dense form) + "
        f"{kernel_bounds.SAVE_MEMORY_SLACK_BYTES} (all slots: {sum(slots)}; with DCP's default planner: "
        f"{peaks['default']})",
    )


@pytest.mark.gefen_clause("5.4.3", "5.4.1")
@pytest.mark.parametrize(
    "factored",
    [
        pytest.param(False, id="block"),
        pytest.param(True, id="factored", marks=pytest.mark.gefen_requires(FACTORED_V)),
    ],
)
def test_step_updates_state_in_place(gefen_impl, factored):
    """After the first step, a second step keeps every state tensor's storage (share 1.0). Plain
    (non-DTensor) parameters: this is the optimizer's own step, no DCP capability is involved."""
    params = models.parameters(IN_PLACE)
    optimizer = gefen_impl.make_optimizer(models.param_groups(IN_PLACE, params), factored_v_2d=factored)
    models.train(IN_PLACE, optimizer, params, [0])
    before = state_addresses(optimizer.state)
    models.train(IN_PLACE, optimizer, params, [1])
    report = pointer_reuse(before, state_addresses(optimizer.state))
    assert report.total_bytes > 0, "no state tensors to compare"
    assert report.share == 1.0, f"state reallocated by the step: {report.moved}"

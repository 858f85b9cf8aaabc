"""The training stack's model, data and schedule (SPEC 4.3.14), checked without ranks: the shards
``fully_shard`` makes of its shapes, the token stream, the schedule and the configurations."""

from __future__ import annotations

import pytest
import torch

from gefen_conformance.workload import stack


def _chunks(rows: int, world: int) -> list[int]:
    """Rows per rank of FSDP2's ``Shard(0)`` (torch.chunk's split; ranks past the chunks hold none)."""
    sizes = [len(c) for c in torch.arange(rows).chunk(world)]
    return sizes + [0] * (world - len(sizes))


@pytest.mark.parametrize("tied", [False, True])
def test_shards_are_uneven_and_empty_on_every_world(tied):
    model = stack.TinyLM(tied)
    rows = {n: p.shape[0] for n, p in model.named_parameters()}
    for world in (2, 3, 4):
        uneven = [n for n, r in rows.items() if len(set(_chunks(r, world))) > 1]
        assert "embed.weight" in uneven, (world, uneven)
    empty = [n for n, r in rows.items() if 0 in _chunks(r, 4)]
    norms = [f"blocks.{b}.{k}_norm.weight" for b in range(stack.BLOCKS) for k in "kq"]
    assert sorted(empty) == sorted(norms + ["logit_scale"])
    for world in (2, 3):
        assert [n for n, r in rows.items() if 0 in _chunks(r, world)] == ["logit_scale"]


def test_tied_output_projection_is_one_parameter():
    tied, untied = stack.TinyLM(True), stack.TinyLM(False)
    assert tied.out.weight is tied.embed.weight
    assert len(list(untied.parameters())) == len(list(tied.parameters())) + 1


def test_tokens_are_the_same_for_every_world_and_split_evenly():
    assert torch.equal(stack.tokens(3), stack.tokens(3))
    assert not torch.equal(stack.tokens(3), stack.tokens(4))
    assert all(stack.BATCH % world == 0 for world in (1, 2, 3, 4))
    assert int(stack.tokens(1).max()) < stack.VOCAB


def test_schedule_warms_up_then_decays_to_its_floor():
    total = stack.StackConfig().total
    factors = [stack.schedule(s, total) for s in range(total + 2)]
    assert factors[: stack.WARMUP] == [(s + 1) / stack.WARMUP for s in range(stack.WARMUP)]
    assert factors[stack.WARMUP] == 1.0
    decay = factors[stack.WARMUP :]
    assert all(a > b for a, b in zip(decay[: total - stack.WARMUP], decay[1:])), decay
    assert factors[total] == pytest.approx(stack.FLOOR) and factors[-1] == pytest.approx(stack.FLOOR)


def test_configurations_overflow_before_the_save_and_resume_after_it():
    for name, config in stack.STACK_CONFIGS.items():
        assert 1 < config.overflow_at <= config.train, name
        assert config.resume >= 2, name

"""Period selection (SPEC 1.5), histogram (SPEC 1.6) and the nearest-codeword rule (SPEC 1.7)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gefen_reference.codebook import bin_centers, histogram_counts
from gefen_reference.codewords import nearest_codeword_indices
from gefen_reference.periods import PeriodRules, choose_period, fallback_period, proper_divisors

CERTIFY = settings(
    derandomize=True,
    database=None,
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize(
    "shape,expected",
    [
        ((4096, 4096), 4096),
        ((11008, 4096), 4096),
        ((4096, 11008), 11008),
        ((151936, 1024), 2048),
        ((1024,), 1024),
        ((4096,), 2048),
        ((3000,), 1500),
        ((7,), 1),
        ((4099,), 1),
        ((768, 3), 1152),
        ((64, 3, 7, 7), 1568),
        ((100, 64), 1600),
        ((3, 2048), 2048),
    ],
)
def test_fallback_table(shape, expected):
    assert fallback_period(math.prod(shape), shape) == expected


def test_proper_divisors_exclude_n():
    assert proper_divisors(12) == [1, 2, 3, 4, 6]
    assert proper_divisors(13) == [1] and proper_divisors(1) == [] and proper_divisors(16) == [1, 2, 4, 8]


def test_routing_rules():
    sq = np.ones(64)
    rules = PeriodRules(force_1d_period_one=True, period_one_substrings=("norm",))
    assert choose_period(rules, "x", (64,), sq) == 1
    assert choose_period(rules, "layer.NORM.w", (8, 8), sq) == 1
    assert choose_period(PeriodRules(), "x", (8, 8), np.ones(1)) == 1
    with pytest.raises(ValueError, match="empty"):
        choose_period(PeriodRules(), "x", (0,), np.ones(0))


@pytest.mark.gefenx
@CERTIFY
@given(
    n_blocks=st.integers(1, 24),
    width=st.sampled_from([1, 2, 3, 5, 8, 9, 12, 16]),
    scale_seed=st.integers(0, 2**31 - 1),
    structured=st.booleans(),
)
def test_search_matches_gefenx(n_blocks, width, scale_seed, structured):
    from gefen.partitioning import find_period_by_block_variance

    rng = np.random.default_rng(scale_seed)
    x = rng.standard_normal((n_blocks, width)).astype(np.float32)
    if structured:
        x = x * (1 + np.arange(width, dtype=np.float32) % 4)
    sq = torch.from_numpy(x).square().reshape(-1).numpy().astype(np.float64)
    if len(sq) < 2:
        return
    shape = (n_blocks, width)
    ours = choose_period(PeriodRules(), "p", shape, sq)
    theirs = find_period_by_block_variance(sq, print_results=False, parameter_shape=shape)
    assert ours == theirs


def test_histogram_bins_zero_blocks_at_2048_and_clamps_plus_one():
    counts = histogram_counts([(torch.zeros(8), 4), (torch.tensor([-1.0, 1.0, 0.5, -0.25]), 4)])
    assert counts[2048] == 8 + 0  # all-zero blocks count in bin 2048 (center +1/4096)
    assert counts[0] == 1 and counts[4095] == 1
    assert counts.sum() == 12 and counts.dtype == torch.int64
    centers = bin_centers()
    assert centers[2048].item() == 1 / 4096 and centers[0].item() == -1 + 1 / 4096
    assert histogram_counts([(torch.zeros(0), 1)]) is None


def test_nearest_codeword_ties_go_to_the_lower_index():
    cb = torch.linspace(-1, 1, 256)
    assert nearest_codeword_indices(cb, torch.tensor([0.0])).item() == 127
    dup = torch.tensor([-1.0, 0.0, 0.0, 0.0, 1.0])
    # A value on a run of duplicates maps to the run's first index; a value just above it
    # compares only the run's last member with the next codeword, so it maps to the last.
    assert nearest_codeword_indices(dup, torch.tensor([0.0, 0.1, -0.6, 0.6])).tolist() == [1, 3, 0, 4]
    idx = nearest_codeword_indices(cb, torch.tensor([-2.0, 2.0, float("nan")]))
    assert idx.tolist() == [0, 255, 255] and idx.dtype == torch.uint8


@pytest.mark.gefenx
@CERTIFY
@given(seed=st.integers(0, 2**31 - 1))
def test_nearest_codeword_matches_gefenx(seed):
    from gefen.gefen import gefen_nearest_codebook_indices

    g = torch.Generator().manual_seed(seed)
    cb = torch.sort(torch.rand(256, generator=g) * 2 - 1).values
    cb[0], cb[-1] = -1.0, 1.0
    cb[100:104] = cb[100]  # duplicates
    values = torch.cat([torch.rand(500, generator=g) * 2.2 - 1.1, cb, (cb[1:] + cb[:-1]) / 2])
    assert torch.equal(nearest_codeword_indices(cb, values), gefen_nearest_codebook_indices(cb, values))

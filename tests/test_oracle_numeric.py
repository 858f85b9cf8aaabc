"""The numeric oracles catch what they claim to and accept what they must (SPEC 5.3, 5.6)."""

from __future__ import annotations

import math

import pytest
import torch

from gefen_oracles import codebook_quality, free_running, kernel_bounds, numeric, pinned_step
from gefen_oracles.numeric import Comparisons, bitwise_comparison, bitwise_mismatch, relative_comparison


def test_bitwise_catches_one_ulp_signed_zero_dtype_and_shape():
    x = torch.randn(100)
    y = x.clone()
    y[37] = torch.nextafter(y[37], torch.tensor(10.0))
    m = bitwise_mismatch("p", x, y)
    assert m is not None and "flat index 37" in str(m)
    assert bitwise_mismatch("z", torch.tensor([0.0]), torch.tensor([-0.0])) is not None
    assert bitwise_mismatch("d", x, x.double()) is not None
    assert bitwise_mismatch("s", x, x.reshape(10, 10)) is not None
    assert bitwise_mismatch("same", x, x.clone()) is None
    nan = torch.tensor([float("nan")])
    assert bitwise_mismatch("nan", nan, nan.clone()) is None
    c = bitwise_comparison("p", x, y)
    assert (c.differing, c.total, c.ok) == (1, 100, False)


def test_relative_comparison_reports_the_worst_place():
    x = torch.ones(10)
    ok = relative_comparison("v", x, x * (1 + 1e-6), 2e-6)
    assert ok.ok and ok.error == pytest.approx(1e-6, rel=0.1) and ok.bound == pytest.approx(2e-6)
    bad = relative_comparison("v", x, torch.where(torch.arange(10) == 4, x * 1.01, x), 1e-3)
    assert not bad.ok and "flat index 4" in bad.problems[0]


def test_comparisons_keep_the_worst_per_name_and_every_problem():
    out = Comparisons()
    out.add(numeric.Comparison("a", "tolerance", 1.0, 4.0))
    out.add(numeric.Comparison("a", "tolerance", 3.0, 4.0))
    out.add(numeric.Comparison("a", "tolerance", 5.0, 4.0, problems=["too far"]))
    out.problem("exact rule broken")
    [a] = list(out)
    assert (a.error, a.bound) == (5.0, 4.0)
    assert out.problems == ["too far", "exact rule broken"]


def test_ulp_and_parameter_rounding():
    assert float(kernel_bounds.ulp(torch.tensor([1.0]), torch.bfloat16)) == 2.0**-7
    assert float(kernel_bounds.ulp(torch.tensor([1.5]), torch.float32)) == 2.0**-23
    assert float(kernel_bounds.ulp(torch.tensor([0.0]), torch.float16)) == 2.0**-24
    r = kernel_bounds.parameter_rounding(
        torch.tensor([1.0]), torch.tensor([1.0]), torch.bfloat16, decayed=True
    )
    assert float(r) > 2.0**-7  # half an ulp twice, plus the fp32 terms


def test_stage_bounds_follow_the_error_analysis():
    assert kernel_bounds.ema_weight(0.999) == pytest.approx(2**-24 * 999 + 2**-24)
    fp32 = kernel_bounds.second_moment(64, torch.float32, 0.999)
    bf16 = kernel_bounds.second_moment(64, torch.bfloat16, 0.999)
    assert bf16 - fp32 == pytest.approx(2 * 2**-8)
    assert kernel_bounds.update(torch.float32, kernel_bounds.stepsize(fp32)) < 5e-5  # 0.5% lr shows in fp32
    assert kernel_bounds.codeword_rounding(torch.float16) == 2**-11


def test_update_bias_counts_identical_inputs_once_and_catches_a_bias():
    g = torch.Generator().manual_seed(0)
    expected = torch.rand(4000, generator=g, dtype=torch.float64) + 0.5
    noise = (torch.rand(4000, generator=g, dtype=torch.float64) - 0.5) * 1e-3
    start = torch.rand(4000, generator=g, dtype=torch.float64)
    fair = pinned_step.update_bias("b", "u", expected + noise, expected, 1e-4, start)
    assert fair.ok
    biased = pinned_step.update_bias("b", "u", expected * 1.005 + noise, expected, 1e-4, start)
    assert not biased.ok
    repeated = torch.ones(64, dtype=torch.float64)
    assert pinned_step.update_bias("b", "u", repeated * 1.01, repeated, 1e-4, repeated) is None


def _blocks(seed=0, n=4096, period=64):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=g) * (1 + torch.arange(n) % 7), period)]


def test_codebook_quality_accepts_a_rounding_neighbour_and_rejects_a_worse_codebook():
    import gefen_reference.codebook as rc

    pieces = _blocks()
    counts = codebook_quality.histogram(pieces)
    assert torch.equal(counts, rc.histogram_counts(pieces))  # the restated histogram is SPEC 1.6.4's
    best = rc.codebook_from_counts(counts)
    assert codebook_quality.compare("cb", best, best.clone(), counts).ok
    moved = counts.clone()
    nonzero = torch.nonzero(moved[1:-1]).reshape(-1)[:5] + 1
    moved[nonzero] -= 1
    moved[nonzero + 1] += 1  # five elements one bin up: what a rounding difference can do
    neighbour = rc.codebook_from_counts(moved)
    assert codebook_quality.compare("cb", best, neighbour, counts).ok
    uniform = torch.linspace(-1, 1, 256)
    worse = codebook_quality.compare("cb", best, uniform, counts)
    assert not worse.ok and "quantization cost" in worse.problems[0]
    broken = best.clone()
    broken[0] = -0.5
    assert not codebook_quality.compare("cb", best, broken, counts).ok


def test_free_running_momentum_factor():
    tau = free_running.momentum_factor(6, 0.9, 0.042, torch.float32)
    assert tau == pytest.approx((0.042 + 4e-5) * (1 - 0.9**6) / 0.1)
    assert free_running.momentum_factor(1, 0.9, 0.042, torch.bfloat16) == pytest.approx(
        0.042 + 4 * (2**-8 + 1e-5)
    )
    assert math.isinf(free_running.momentum_factor(3, 1.0, 0.04, torch.float32))


@pytest.mark.parametrize("profile", ["torch-exact", "tolerance"])
def test_profile_description_states_its_bounds(profile):
    d = numeric.profile_description(profile)
    assert d["name"] == profile and d["continuation_after_reshard"]["max_abs"] == 5e-3
    if profile == "tolerance":
        assert {"rule", "exact", "pinned_step", "codebook", "free_running", "checkpoints"} <= set(d)
    with pytest.raises(ValueError):
        numeric.profile_description("fuzzy")

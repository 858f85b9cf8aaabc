"""The C histogram and codebook DP give the reference's counts and codebook bit for bit (SPEC 1.6)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gefen_reference as reference
import gefen_reference.codebook as rc
from gefen_fast import codebook_learning, native
from gefen_reference.codebook_solver import solve_codebook_plain

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _gradient(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * (1.0 + torch.arange(n) % 5)


@pytest.mark.parametrize(
    "n,period",
    [
        (2048, 2048),
        (2048 * 7, 2048),
        (16384, 8),
        (16384, 16384),
        (65536, 256),
        (65536, 32768),
        ((1 << 20), 2048),
        ((1 << 20), 1 << 19),
        (37, 37),
        (12, 3),
        (4096, 1),
    ],
)
def test_histogram_equals_the_reference(n, period):
    for dtype in DTYPES:
        grad = _gradient(n, n + period).to(dtype)
        pieces = [(grad, period), (torch.zeros(64, dtype=dtype), 8)]  # an all-zero piece lands in bin 2048
        assert torch.equal(codebook_learning.histogram_counts(pieces), rc.histogram_counts(pieces)), dtype


def test_histogram_of_special_values():
    """Zero blocks, a block whose maximum is negative, values at +-max, subnormals; empty pieces."""
    x = torch.zeros(8 * 512)
    x[512:1024] = -torch.rand(512) * 3  # maximum magnitude on the negative side
    x[1024] = 1e-40  # a subnormal block maximum
    x[1536:2048] = torch.tensor([5.0, -5.0] * 256)  # u = +-1 exactly: bins 0 and 4095 (clamped)
    pieces = [(x, 512), (torch.zeros(0), 1)]
    assert torch.equal(codebook_learning.histogram_counts(pieces), rc.histogram_counts(pieces))
    assert codebook_learning.histogram_counts([(torch.zeros(0), 1)]) is None


def test_non_finite_gradient_takes_the_reference_histogram():
    for bad in (float("inf"), float("nan")):
        x = _gradient(4096, 1)
        x[100] = bad
        pieces = [(x, 512)]
        assert torch.equal(codebook_learning.histogram_counts(pieces), rc.histogram_counts(pieces))


def _histograms():
    """Histograms the DP sees: learned from gradients, random counts, a wide range of counts, ties."""
    g = torch.Generator().manual_seed(11)
    out = []
    for n, period in ((1 << 20, 2048), (1 << 18, 1 << 17), (4096, 4096), (300_000, 3000)):
        out.append(rc.histogram_counts([(_gradient(n, period), period)]))
    for active in (256, 257, 300, 1000, 4096):
        counts = torch.zeros(4096, dtype=torch.int64)
        bins = torch.randperm(4096, generator=g)[:active]
        counts[bins] = torch.randint(1, 10_000, (active,), generator=g)
        out.append(counts)
    symmetric = torch.zeros(4096, dtype=torch.int64)  # mirror-image counts: equal-cost choices
    symmetric[1024:3072] = 5
    out.append(symmetric)
    uniform = torch.full((4096,), 7, dtype=torch.int64)
    out.append(uniform)
    wide = torch.randint(1, 100, (4096,), generator=g)
    wide[2048] = 1 << 40  # counts above 2**24 round to fp32 (SPEC 1.6.5)
    out.append(wide)
    return out


def test_codebook_equals_the_reference():
    for counts in _histograms():
        assert torch.equal(codebook_learning.codebook_from_counts(counts), rc.codebook_from_counts(counts))


def _dp(lib, counts: torch.Tensor, threads: int) -> np.ndarray:
    """The C DP's codebook for ``counts`` (at least 256 active bins, inside the search's premise)."""
    weights = counts.to(torch.float32)
    active = weights > 0
    centers = np.ascontiguousarray(rc.bin_centers()[active].numpy().astype(np.float64))
    w = np.ascontiguousarray(weights[active].numpy().astype(np.float64))
    out = np.empty(256, dtype=np.float32)
    assert (
        lib.gefen_codebook_dp(
            centers.ctypes.data, w.ctypes.data, int(active.sum()), 256, out.ctypes.data, threads
        )
        == 0
    )
    return out


def _dp_histograms():
    """The histograms of ``_histograms`` that reach the DP: not the padding case (fewer than 256
    active bins), not counts above 2**24 (outside the search's premise)."""
    return [c for c in _histograms() if int((c > 0).sum()) >= 256 and c.max() <= 1 << 24]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_codebook_from_any_number_of_threads(threads):
    """The layers split between the caller and a helper thread: the same codebook, bit for bit."""
    for counts in _dp_histograms():
        assert np.array_equal(_dp(native.library(), counts, threads), rc.codebook_from_counts(counts).numpy())


@pytest.fixture(scope="module")
def late_helper_library(kernel_variant):
    """The kernels with a helper thread that sleeps 400 us on every third layer it claims."""
    return kernel_variant("-DGEFEN_DP_LATE_HELPER=400")


def test_codebook_with_a_late_helper(late_helper_library):
    """A helper descheduled mid-layer: the caller solves that half itself and waits before reusing
    the row the helper still reads; the codebook is still the reference's."""
    for counts in _dp_histograms():
        assert np.array_equal(_dp(late_helper_library, counts, 2), rc.codebook_from_counts(counts).numpy())


@pytest.fixture(scope="module")
def four_lane_library(kernel_variant):
    """The kernels without the AVX-512 loops, as on CPUs without them: the DP scans its last ends
    four to a register instead of eight."""
    if not native.capabilities() & native.CAP_AVX512:
        pytest.skip("the default build has no AVX-512 loops: the default tests run the four-lane scan")
    return kernel_variant("-DGEFEN_NO_AVX512=1")


@pytest.mark.parametrize("threads", [1, 2])
def test_codebook_from_the_four_lane_scan(four_lane_library, threads):
    """Where the default build scans eight ends at once, the four-lane scan (other CPUs) is checked here."""
    for counts in _dp_histograms():
        assert np.array_equal(
            _dp(four_lane_library, counts, threads), rc.codebook_from_counts(counts).numpy()
        )


def test_codebook_equals_the_plain_recurrence():
    """Against the literal O(K m^2) recurrence on a small histogram (SPEC 1.6.8 ties included)."""
    g = torch.Generator().manual_seed(2)
    for active in (256, 280, 400):
        counts = torch.zeros(4096, dtype=torch.int64)
        counts[torch.randperm(4096, generator=g)[:active]] = torch.randint(1, 4, (active,), generator=g)
        weights = counts.to(torch.float32)
        mask = weights > 0
        plain = solve_codebook_plain(
            rc.bin_centers()[mask].numpy().astype(np.float64), weights[mask].numpy().astype(np.float64), 256
        )
        assert np.array_equal(codebook_learning.codebook_from_counts(counts).numpy(), plain)


def test_padding_and_premise_cases_use_the_reference():
    """Fewer active bins than codewords: the padding rule; counts the monotone search cannot prove: the plain
    DP."""
    few = torch.zeros(4096, dtype=torch.int64)
    few[[5, 900, 2048, 2049, 4000]] = torch.tensor([3, 1, 50, 2, 9])
    assert torch.equal(codebook_learning.codebook_from_counts(few), rc.codebook_from_counts(few))
    lost = torch.ones(4096, dtype=torch.int64)
    lost[0] = 1 << 62  # later counts vanish in the float64 running sum: the reference raises
    with pytest.raises(ZeroDivisionError):
        rc.codebook_from_counts(lost)
    with pytest.raises(ZeroDivisionError):
        codebook_learning.codebook_from_counts(lost)


def test_optimizer_codebook_equals_the_reference():
    """Through the optimizer's first step, fp32 and bf16 parameters, block and factored."""
    import gefen_fast

    for dtype in (torch.float32, torch.bfloat16):
        for factored in (False, True):
            books = []
            for cls in (reference.Gefen, gefen_fast.Gefen):
                g = torch.Generator().manual_seed(4)
                params = [
                    (f"p{i}", torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)))
                    for i, s in enumerate([(128, 96), (4096,), (3, 5, 7)])
                ]
                for _, p in params:
                    p.grad = (torch.randn(p.shape, generator=g) * (1.0 + torch.arange(p.shape[-1]) % 5)).to(
                        dtype
                    )
                opt = cls(params, factored_v_2d=factored)
                opt.step()
                books.append(opt.codebook)
            assert torch.equal(books[0], books[1]), (dtype, factored)

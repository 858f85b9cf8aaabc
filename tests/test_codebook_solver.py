"""Codebook solver (SPEC 1.6.7, 1.6.8): the fast solver against the plain recurrence and gefen-x.

Every comparison is bitwise on the float32 codebook. The histograms are built from the
4096 exact bin centres and positive integer counts rounded to float32, as in SPEC 1.6.5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gefen_reference.codebook_solver as solver
from gefen_reference.codebook import bin_centers, histogram_counts
from gefen_reference.codebook_solver import solve_codebook, solve_codebook_plain

CENTERS = bin_centers().numpy()  # float32, exact


def ci_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (got, want)


def both(centers, counts, k: int = 256) -> np.ndarray:
    """Solve with both solvers, check they agree bit for bit, return the codebook."""
    plain = solve_codebook_plain(centers, counts, k)
    assert_same_bits(solve_codebook(centers, counts, k), plain)
    return plain


def active(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The active bins of a 4096-bin count vector: (float64 centers, float64 float32-counts)."""
    w = np.asarray(counts).astype(np.float32)
    on = w > 0
    return CENTERS[on].astype(np.float64), w[on].astype(np.float64)


def gradient_histogram(numel: int, period: int, spike: float, seed: int):
    """Active bins of the SPEC 1.6.4 histogram of normal gradient blocks.

    One element per block is set to ``spike`` (when > 0), so the rest of the block is
    normalised into about [-4/spike, 4/spike]: a smaller spike leaves more bins active.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel // period, period, generator=g)
    if spike > 0:
        x[:, 0] = spike
    return active(histogram_counts([(x.reshape(-1), period)]).numpy())


# ---------------------------------------------------------------------------
# Generated histograms
# ---------------------------------------------------------------------------


@st.composite
def histograms(draw, max_bins: int = 600):
    """(centers, counts) with 1..max_bins active bins of assorted layouts and count ranges."""
    m = draw(st.integers(1, max_bins))
    layout = draw(st.sampled_from(["random", "run", "even", "mirror"]))
    scale = draw(st.sampled_from(["tiny", "equal", "moderate", "bell", "wide"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    if layout == "random":
        idx = np.sort(rng.choice(4096, m, replace=False))
    elif layout == "run":
        idx = int(rng.integers(0, 4096 - m + 1)) + np.arange(m)
    elif layout == "even":
        idx = np.arange(m) * int(rng.integers(1, 4096 // m + 1))
    else:  # mirror: bins symmetric about 0
        half = np.sort(rng.choice(2048, (m + 1) // 2, replace=False))
        idx = np.concatenate([half, 4095 - half[::-1]])

    n = idx.size
    if scale == "tiny":
        w = rng.integers(1, 4, n)
    elif scale == "equal":
        w = np.full(n, rng.integers(1, 2**31))
    elif scale == "moderate":
        w = rng.integers(1, 10**6, n)
    elif scale == "bell":  # gradient-like: a dense middle, tails of single counts
        x = CENTERS[idx].astype(np.float64)
        w = np.floor(10.0 ** rng.uniform(3, 11) * np.exp(-0.5 * (x / rng.uniform(0.05, 0.4)) ** 2)) + 1
    else:  # wide: counts up to ~1e13, rounded to float32
        w = np.floor(np.exp(rng.uniform(0.0, 30.0, n))) + 1
    if layout == "mirror":
        w[n // 2 :] = w[: n - n // 2][::-1]
    return CENTERS[idx].astype(np.float64), w.astype(np.float32).astype(np.float64)


@ci_settings(100)
@given(hist=histograms(), k=st.sampled_from([1, 2, 3, 4, 7, 16, 48]))
def test_fast_equals_plain_for_any_k(hist, k):
    both(*hist, k)


# k = 256 costs the plain solver up to ~1 s per example at 600 bins, hence fewer examples than above,
# and a proof (.ci/run) rather than a default-run test.
@pytest.mark.proof
@ci_settings(50)
@given(hist=histograms())
def test_fast_equals_plain_for_256_codewords(hist):
    cb = both(*hist)
    assert cb[0] == -1.0 and cb[-1] == 1.0
    assert np.all(np.diff(cb) >= 0)


# ---------------------------------------------------------------------------
# Ties and near-ties
# ---------------------------------------------------------------------------


def test_exact_tie_in_last_layer_goes_to_smallest_start():
    # [-1] [-0.5] [0.5, 1] and [-1, -0.5] [0.5] [1] both cost exactly 0.25; the scan keeps
    # s = 3 for the last run, so the middle run is {-0.5}.
    cb = both([-1.0, -0.5, 0.5, 1.0], [1, 1, 1, 1], k=3)
    assert cb.tolist() == [-1.0, -0.5, 1.0]


def test_exact_tie_in_an_interior_layer_goes_to_smallest_start():
    # Nine points 1/4 apart, eight runs: one pair merges. Every interior pair costs exactly
    # 1/32 (all sums are exact in float64). Backtracking takes the smallest start at each
    # step, which here merges the last interior pair {0.5, 0.75}.
    x = np.arange(-4, 5) / 4.0
    cb = both(x, np.ones(9), k=8)
    assert cb.tolist() == [-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.625, 1.0]


@pytest.mark.parametrize("extra", [1, 2, 5])
def test_exact_ties_on_evenly_spaced_bins_with_equal_counts(extra):
    # 256 + extra bins 15 apart with count 1: `extra` interior merges, all exact ties.
    idx = 7 + 15 * np.arange(256 + extra)
    cb = both(CENTERS[idx], np.ones(idx.size))
    if extra == 1:
        lone = CENTERS[idx].astype(np.float64)
        merged = np.float32((lone[-3] + lone[-2]) / 2)
        assert cb.tolist() == [-1.0, *lone[1:-3].astype(np.float32).tolist(), merged, 1.0]


@pytest.mark.parametrize(
    "name",
    ["mirror-equal", "mirror-random", "pattern-3", "pattern-7", "equal-dense", "big-equal"],
)
def test_near_tie_constructions(name):
    rng = np.random.default_rng(len(name))
    if name.startswith("mirror"):
        half = np.sort(rng.choice(2048, 150, replace=False))
        idx = np.concatenate([half, 4095 - half[::-1]])
        w_half = np.ones(150) if name == "mirror-equal" else rng.integers(1, 50, 150)
        w = np.concatenate([w_half, w_half[::-1]])
    elif name.startswith("pattern"):
        period = int(name.split("-")[1])
        idx = np.arange(0, 4096, 13)[:290]
        w = np.resize(rng.integers(1, 9, period), idx.size)
    elif name == "equal-dense":
        idx = 1700 + np.arange(320)
        w = np.full(idx.size, 5)
    else:
        idx = np.arange(0, 4096, 11)
        w = np.full(idx.size, 2.0**27 + 1)  # rounds to 2**27 in float32
    both(CENTERS[idx], w.astype(np.float32))


def _full_scan_layer(prev, PW, PX, PXX, cluster, last_end):
    m = PW.size - 1
    dp, start = np.full(m + 1, np.inf), np.full(m + 1, -1)
    for e in range(cluster, last_end + 1):
        before = slice(cluster - 1, e)
        cand = prev[before] + solver._free_center_cost(
            PXX[e] - PXX[before], PX[e] - PX[before], PW[e] - PW[before]
        )
        j = int(np.argmin(cand))
        dp[e], start[e] = cand[j], cluster + j
    return dp, start


def test_interior_layers_match_full_scan_where_rounding_breaks_monotonicity():
    """Counts spanning ~1e13 make rounding reorder near-tied candidates, so the computed
    argmin is sometimes not monotone in the end index. The windowed search must still
    return every layer's minima and leftmost argmins exactly (a plain divide and conquer
    does not, on these very cases)."""
    inversions = layers = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        m, k = int(rng.integers(40, 160)), int(rng.integers(3, 24))
        idx = np.sort(rng.choice(4096, m, replace=False))
        w = np.floor(np.exp(rng.uniform(0, 30, m))).astype(np.float32).astype(np.float64)
        PW, PX, PXX = solver._prefix_sums(CENTERS[idx].astype(np.float64), w)
        if not solver._monotone_search_applies(PW, PX):
            continue
        scale = solver._cost_scale(PW, PX, PXX)
        span = m - k
        prev = np.full(m + 1, np.inf)
        ends = np.arange(1, 2 + span)
        prev[ends] = solver._fixed_center_cost(-1.0, PXX[ends], PX[ends], PW[ends])
        for cluster in range(2, k):
            fast = solver._interior_layer(prev, PW, PX, PXX, scale, cluster, cluster + span)
            full = _full_scan_layer(prev, PW, PX, PXX, cluster, cluster + span)
            np.testing.assert_array_equal(fast[0], full[0])
            np.testing.assert_array_equal(fast[1], full[1])
            inversions += int(np.sum(np.diff(full[1][cluster : cluster + span + 1]) < 0))
            layers += 1
            prev = full[0]
    assert layers > 50 and inversions > 0  # the cases really are hard


# After a count of 1e15, unit counts move the running sum of W*C by less than its rounding
# error, so the per-bin means read off the prefix sums come out of order.
UNORDERED = (CENTERS[2000:2037], [1e15] + [1, 2, 1, 3, 1, 1, 2, 1, 1, 1, 5, 1] * 3, 8)
# A count of 1 after 1e20 vanishes in the float64 running sum: a single-bin run has Sw == 0.
LOST = (CENTERS[100 + 300 * np.arange(12)], [1e20, 1, 1, 1, 7, 1e20, 3, 1, 1, 1, 1, 2])


def test_fallback_to_plain_when_bin_means_are_unordered():
    centers, counts, k = UNORDERED
    c, w, _ = solver._validated(centers, counts, k)
    assert not solver._monotone_search_applies(*solver._prefix_sums(c, w)[:2])
    both(centers, counts, k)


@pytest.mark.parametrize("solve", [solve_codebook, solve_codebook_plain])
def test_lost_count_divides_by_zero_like_gefenx(solve):
    with pytest.raises(ZeroDivisionError, match="Sw == 0"):
        solve(*LOST, 5)
    # With K = 2 no run takes its mean, nothing divides, and the DP runs.
    assert solve(*LOST, 2).tolist() == [-1.0, 1.0]


# ---------------------------------------------------------------------------
# Padding and size boundaries
# ---------------------------------------------------------------------------


def test_padding_replaces_the_smallest_center_and_keeps_duplicates():
    a, b, c = CENTERS[[10, 2000, 3000]]
    cb = both([a, b, c], [5, 1, 2])
    assert cb.tolist() == [-1.0, b, *[c] * 253, 1.0]


def test_padding_single_bin():
    cb = both(CENTERS[[2048]], [7])
    assert cb.tolist() == [-1.0, *[1 / 4096] * 254, 1.0]


@pytest.mark.parametrize("m", [100, 255])
def test_padding_random_sizes(m):
    rng = np.random.default_rng(m)
    idx = np.sort(rng.choice(4096, m, replace=False))
    w = rng.integers(1, 1000, m)
    cb = both(CENTERS[idx], w)
    want = np.sort(np.concatenate([[-1.0], CENTERS[idx[1:]], [CENTERS[idx[-1]]] * (255 - m), [1.0]]))
    assert_same_bits(cb, want.astype(np.float32))


@pytest.mark.parametrize("m", [256, 257])
def test_boundary_sizes(m):
    rng = np.random.default_rng(m)
    idx = np.sort(rng.choice(4096, m, replace=False))
    cb = both(CENTERS[idx], rng.integers(1, 10**7, m))
    if m == 256:  # one bin per run: interior codewords are Sx/Sw of single bins
        assert np.array_equal(cb[1:-1], CENTERS[idx[1:-1]])


@pytest.mark.proof
def test_realistic_gradient_histogram_fast_equals_plain():
    c, w = gradient_histogram(1 << 18, 64, 24.0, seed=5)
    assert 500 <= c.size <= 1000
    both(c, w)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("solve", [solve_codebook, solve_codebook_plain])
@pytest.mark.parametrize(
    "centers, counts, k, match",
    [
        ([], [], 256, "empty"),
        ([0.1, 0.2], [1, 0], 256, "> 0"),
        ([0.1, 0.2], [1, -3], 256, "> 0"),
        ([0.1, 0.2], [1, np.nan], 256, "> 0"),
        ([0.1, 0.2], [1, 1e-46], 256, "> 0"),  # rounds to 0 in float32
        ([0.1, 0.2], [1, np.inf], 256, "finite"),
        ([0.1, np.nan], [1, 1], 256, "finite"),
        ([0.1, 0.2, 0.3], [1, 1], 256, "length"),
        ([[0.1, 0.2]], [[1, 1]], 256, "1-D"),
        ([0.1, 0.2], [1, 1], 0, "k must be"),
        ([0.1, 0.2], [1, 1], 2.0, "k must be"),
    ],
)
def test_validation(solve, centers, counts, k, match):
    with pytest.raises(ValueError, match=match):
        solve(np.asarray(centers, dtype=np.float64), np.asarray(counts, dtype=np.float64), k)


# ---------------------------------------------------------------------------
# Parity with gefen-x's own solver
# ---------------------------------------------------------------------------


def gefenx_codebook(centers, counts, k: int = 256) -> np.ndarray:
    quantization = pytest.importorskip("gefen.quantization")
    stats = {
        "active_centers": torch.as_tensor(np.asarray(centers, dtype=np.float32)),
        "active_counts": torch.as_tensor(np.asarray(counts, dtype=np.float32)),
    }
    return quantization.exact_dp(stats, k).numpy()


def _small_parity_cases():
    rng = np.random.default_rng(7)
    idx600 = np.sort(rng.choice(4096, 600, replace=False))
    return {
        "one-bin": (CENTERS[[2048]], [3], 256),
        "padding-100": (CENTERS[np.arange(100) * 40], rng.integers(1, 99, 100), 256),
        "ties-257": (CENTERS[7 + 15 * np.arange(257)], np.ones(257), 256),
        "exact-256": (CENTERS[np.arange(256) * 16], rng.integers(1, 10**6, 256), 256),
        "random-600": (CENTERS[idx600], rng.integers(1, 2**30, 600), 256),
        "interior-tie": (np.arange(-4, 5) / 4.0, np.ones(9), 8),
        "unordered-means": UNORDERED,
        "lost-count-k2": (*LOST, 2),
    }


@pytest.mark.gefenx
@pytest.mark.parametrize("name", list(_small_parity_cases()))
def test_matches_gefenx_small(name):
    centers, counts, k = _small_parity_cases()[name]
    want = gefenx_codebook(centers, counts, k)
    assert_same_bits(solve_codebook(centers, counts, k), want)
    assert_same_bits(solve_codebook_plain(centers, counts, k), want)


@pytest.mark.gefenx
def test_gefenx_also_divides_by_zero_on_a_lost_count():
    with pytest.raises(ZeroDivisionError):
        gefenx_codebook(*LOST, 5)


@pytest.mark.gefenx
def test_matches_gefenx_on_realistic_gradient_histogram():
    c, w = gradient_histogram(1 << 20, 64, 8.0, seed=11)
    assert 2000 <= c.size <= 3000
    assert_same_bits(solve_codebook(c, w), gefenx_codebook(c, w))


@pytest.mark.gefenx
@pytest.mark.slow
def test_all_4096_bins_active_fast_plain_and_gefenx():
    c, w = gradient_histogram(1 << 22, 8, 0.0, seed=13)
    assert c.size == 4096
    fast = solve_codebook(c, w)
    assert_same_bits(fast, gefenx_codebook(c, w))
    assert_same_bits(fast, solve_codebook_plain(c, w))


# ---------------------------------------------------------------------------
# The kept solutions of codebook_from_counts (a solve is a pure function of the counts)
# ---------------------------------------------------------------------------


def _counts(seed: int, active_bins: int = 300) -> torch.Tensor:
    """Bin counts with ``active_bins`` active bins (more than 256: the DP runs)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(4096, dtype=torch.int64)
    counts[torch.randperm(4096, generator=g)[:active_bins]] = torch.randint(
        1, 1000, (active_bins,), generator=g
    )
    return counts


def test_a_kept_codebook_is_the_solved_one_in_a_fresh_tensor(monkeypatch):
    import gefen_reference.codebook as codebook

    codebook.forget_solved()
    calls = []
    monkeypatch.setattr(codebook, "solve_codebook", lambda *a: calls.append(1) or solve_codebook(*a))
    counts = _counts(0)
    first = codebook.codebook_from_counts(counts)
    first.fill_(0.0)  # a caller that writes into its codebook changes nobody else's
    again = codebook.codebook_from_counts(counts.clone())
    c, w = active(counts.numpy())
    assert_same_bits(again.numpy(), solve_codebook(c, w, 256))
    assert calls == [1]  # solved once
    codebook.codebook_from_counts(_counts(1))
    assert calls == [1, 1]  # other counts: solved


def test_kept_codebooks_are_bounded_and_a_failed_solve_keeps_nothing(monkeypatch):
    import gefen_reference.codebook as codebook

    codebook.forget_solved()
    for seed in range(codebook.SOLVED_KEPT + 3):
        codebook.codebook_from_counts(_counts(seed, active_bins=40))  # padded: no DP
    assert len(codebook._solved) == codebook.SOLVED_KEPT
    codebook.forget_solved()

    def failing(*_):
        raise ZeroDivisionError("lost count")

    monkeypatch.setattr(codebook, "solve_codebook", failing)
    with pytest.raises(ZeroDivisionError):
        codebook.codebook_from_counts(_counts(0))
    assert len(codebook._solved) == 0

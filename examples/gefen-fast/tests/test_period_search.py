"""The C period search picks the reference's period (SPEC 1.5, an exact obligation in every profile)."""

from __future__ import annotations

import pytest
import torch

import gefen_reference as reference
from gefen_fast import period_search
from gefen_reference.periods import PeriodRules, choose_period, search_period, squared_gradient

SIZES = [
    2,
    3,
    7,
    8,
    37,
    2047,
    2048,
    2049,
    4096 * 3,
    16383,
    16384,
    16385,
    65535,
    65536,
    65537,
    45045,
    720720 // 8,
    (1 << 20) - 1,
    1 << 20,
    (1 << 20) + 4,
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _gradient(kind: str, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(n)
    if kind == "randn":
        return torch.randn(n, generator=g)
    if kind == "columns":  # per-column scale, as the conformance workloads: the search finds structure
        return torch.randn(n, generator=g) * (1.0 + i % 5)
    if kind == "rows":  # blocks of very different scale
        return torch.randn(n, generator=g) * torch.exp(((i // 512) % 7).float())
    if kind == "zeros":
        return torch.zeros(n)
    if kind == "constant":  # every variance is rounding noise: numpy decides by it
        return torch.full((n,), 0.3)
    if kind == "sparse":
        return torch.where(i % 97 == 3, torch.randn(n, generator=g), torch.zeros(n))
    if kind == "periodic":  # exact periodic structure: near-ties between multiples of the period
        return torch.sin(i.float() * 0.7) * (1.0 + (i % 64 == 0).float())
    if kind == "tiny":  # squares below fp32's normal range
        return torch.randn(n, generator=g) * 1e-22
    if kind == "huge":
        return torch.randn(n, generator=g) * 1e18
    raise ValueError(kind)


KINDS = ["randn", "columns", "rows", "zeros", "constant", "sparse", "periodic", "tiny", "huge"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("n", SIZES)
def test_search_equals_the_reference(n):
    large = n > 100_000  # the reference's numpy search takes a while there: fewer combinations
    for seed, kind in enumerate(("columns", "zeros", "periodic", "tiny") if large else KINDS):
        for dtype in (torch.float32, torch.bfloat16) if large else DTYPES:
            grad = _gradient(kind, n, seed).to(dtype)
            expected = search_period(squared_gradient(grad))
            assert period_search.search_period(grad) == expected, (n, kind, dtype)


def test_ordinary_gradients_are_decided_by_the_bounds():
    """The fast path is the one taken for real gradients: the reference's numpy search is the exception."""
    before = dict(period_search.decisions)
    for seed, n in enumerate([2048, 16384, 65536, 1 << 20]):
        for kind in ("randn", "columns", "rows"):
            period_search.search_period(_gradient(kind, n, seed))
    assert period_search.decisions["bounds"] - before["bounds"] == 12
    assert period_search.decisions["reference"] == before["reference"]


def test_near_ties_are_decided_by_numpys_own_scores():
    """A constant gradient has all variances at rounding noise: the bounds cannot decide, numpy's scores
    do."""
    before = dict(period_search.decisions)
    grad = _gradient("constant", 4096, 0)
    assert period_search.search_period(grad) == search_period(squared_gradient(grad))
    assert period_search.decisions["refined"] == before["refined"] + 1
    assert period_search.decisions["bounds"] == before["bounds"]
    assert period_search.decisions["reference"] == before["reference"]


@pytest.mark.parametrize("kind", ["randn", "columns", "rows", "periodic", "constant"])
def test_refinement_from_no_knowledge_is_the_reference(kind):
    """With enclosures that say nothing, the refinement computes numpy's scores until the winner is proven."""
    grad = _gradient(kind, 4096 * 3, 7)
    x = squared_gradient(grad)
    candidates = period_search.proper_divisors(len(x))
    lo_e, hi_e = [0.0] * len(candidates), [1e300] * len(candidates)
    index, computed = period_search.refine(x, candidates, lo_e, hi_e)
    expected = search_period(x)
    assert (1 if candidates[index] < 8 else candidates[index]) == expected
    assert computed >= 1


def test_big_matrices_are_refined_on_the_contested_scores_only():
    """At 4096 x 4096 the largest periods' scores differ by less than the bound: a few numpy scores decide."""
    g = torch.Generator().manual_seed(100)
    grad = torch.randn(4096, 4096, generator=g) * 1e-3 * (1.0 + torch.arange(4096) % 5)
    before = dict(period_search.decisions)
    period = period_search.search_period(grad)
    assert period_search.decisions["refined"] == before["refined"] + 1
    assert period_search.decisions["refined_scores"] - before["refined_scores"] <= 4  # of 24 candidates
    assert period == search_period(squared_gradient(grad))


@pytest.mark.parametrize("layout", ["transposed", "strided", "channels_last", "view_of_flat_buffer"])
def test_non_contiguous_gradients_follow_logical_order(layout):
    g = torch.Generator().manual_seed(5)
    if layout == "transposed":
        grad = (torch.randn(256, 384, generator=g) * (1.0 + torch.arange(384) % 5)).t()
    elif layout == "strided":
        grad = torch.randn(512, 96, generator=g)[:, ::2] * (1.0 + torch.arange(48) % 3)
    elif layout == "channels_last":
        grad = torch.randn(16, 32, 8, 8, generator=g).to(memory_format=torch.channels_last)
    else:
        flat = torch.randn(5000, generator=g)
        grad = flat[904 : 904 + 4096].view(64, 64) * (1.0 + torch.arange(64) % 4)
    rules = PeriodRules()
    shape = tuple(grad.shape)
    assert period_search.choose_period(rules, "w", shape, grad) == choose_period(
        rules, "w", shape, squared_gradient(grad)
    )


def test_routing_rules_match_the_reference():
    """SPEC 1.5.2: single elements, the forcing options and the substring rule; fallback after a search of
    1."""
    grad = torch.randn(64, 48)
    for rules in (
        PeriodRules(),
        PeriodRules(force_2d_period_one=True),
        PeriodRules(period_one_substrings=("w",)),
        PeriodRules(force_1d_period_one=True),
    ):
        for name, g in (
            ("w", grad),
            ("bias", torch.randn(48)),
            ("one", torch.randn(1)),
            ("prime", torch.randn(4099)),
        ):
            shape = tuple(g.shape)
            assert period_search.choose_period(rules, name, shape, g) == choose_period(
                rules, name, shape, squared_gradient(g)
            )
    with pytest.raises(ValueError, match="empty shard"):
        period_search.choose_period(PeriodRules(), "e", (0,), torch.zeros(0))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_gradients_go_to_the_reference():
    """Outside the conformance domain (SPEC 0.4.4), but never a silent wrong answer: numpy decides."""
    for bad in (float("inf"), float("nan")):
        grad = torch.randn(4096)
        grad[17] = bad
        assert period_search.search_period(grad) == search_period(squared_gradient(grad))
    overflow = torch.randn(4096)
    overflow[5] = 3e19  # finite, but its fp32 square is not
    assert period_search.search_period(overflow) == search_period(squared_gradient(overflow))


def test_statistics_are_the_block_sums():
    """G(p) and T as defined, against float64 numpy (a check of the kernel, not of the decision)."""
    grad = torch.randn(3 * 4096) * (1.0 + torch.arange(3 * 4096) % 7)
    x = squared_gradient(grad)
    periods = [p for p in range(2, len(x)) if len(x) % p == 0]
    G, T = period_search.statistics(grad.contiguous(), periods)
    assert T == pytest.approx(float((x * x).sum()), rel=1e-12)
    for p, got in zip(periods, G):
        assert got == pytest.approx(float((x.reshape(-1, p).sum(axis=1) ** 2).sum()), rel=1e-12), p


def test_optimizer_periods_equal_the_reference():
    """Through the optimizer: every parameter's period (codebook step and a late parameter) is the
    reference's."""
    import gefen_fast

    def run(cls):
        g = torch.Generator().manual_seed(3)
        params = {
            "a.weight": torch.nn.Parameter(torch.randn(96, 160, generator=g)),
            "b.weight": torch.nn.Parameter(torch.randn(4096, generator=g)),
            "late": torch.nn.Parameter(torch.randn(45, 7, generator=g)),
        }
        opt = cls(list(params.items()), factored_v_2d=False)
        for step in range(3):
            for name, p in params.items():
                p.grad = (
                    None
                    if (name == "late" and step == 0)
                    else torch.randn(p.shape, generator=g) * (1.0 + torch.arange(p.shape[-1]) % 5)
                )
            opt.step()
        return {n: opt.state[p]["automatic_period"] for n, p in params.items()}

    assert run(gefen_fast.Gefen) == run(reference.Gefen)

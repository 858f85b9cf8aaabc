"""The Triton kernels against the reference, one step at a time.

Each case is a *pinned step*: the reference is trained a few steps (or not at all), its native
state is loaded into ``gefen_triton.Gefen``, and both take one step from the same parameters and
gradient. Then:

* the momentum (``m_codebook`` indices and ``m_magnitude``) must be the reference's **bit for bit**:
  the kernels decode, lerp, normalise and choose codewords with the reference's fp32 operations
  (SPEC 1.8.8), and a maximum does not depend on the order;
* the second moments and the parameters are held to float64 arithmetic of SPEC 1.8 / 1.9 from the
  same inputs (with the fp32-rounded constants both use), within the rounding an fp32 kernel
  may add (SPEC 5.6.2-5.6.8): the sums' order, the square root, the products, the parameter's
  own rounding. The bounds are those of fp32 squares and means, which these kernels use for
  every dtype (the reference rounds bf16 squares to bf16; the kernels are finer).

Periods are pinned so that each case lands where it means to: around the tile widths (1, 16,
17, 8191, 8192), across the split path's chunks (8193, 16384), a partial last tile of many
blocks, unaligned memory, column vectors and matrices wider than the squares kernel's tiles.
"""

from __future__ import annotations

import math

import gefen_triton
import pytest
import torch
import triton
import triton.language as tl
from gefen_triton import kernels as K
from gefen_triton import launch

import gefen_reference as reference

U = 2.0**-24
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


# ----------------------------------------------------------------------------- workload
def gradient(shape, seed, dtype, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * (1.0 + torch.arange(shape[-1], dtype=torch.float32) % 5)
    return (x * scale).to(dtype)


def start_values(shape, seed, dtype):
    """Parameters at 1e-3 of unit scale, so that a 16-bit parameter shows its update (lr 1e-2)."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    return (torch.randn(shape, generator=gen) * 1e-3).to(dtype)


def pinned_step(
    cases,
    *,
    device,
    factored=False,
    warm=3,
    groups=None,
    codebook=None,
    grads=None,
    place=None,
    grad_layout=None,
    **options,
):
    """Reference trained ``warm`` steps from pinned periods; its state loaded into ours; one step of
    each from the same parameters and gradient. ``cases``: ``{name: (shape, dtype, period)}``.
    Returns ``(cases, before, ref, ours)``: the state and parameters before the step, and per
    side ``(params, optimizer)``."""
    groups = groups or [{"names": list(cases), "lr": 1e-2, "weight_decay": 0.0}]
    ref_params = {
        n: torch.nn.Parameter(start_values(s, i, dt)) for i, (n, (s, dt, _)) in enumerate(cases.items())
    }

    def build(cls, params):
        return cls(
            [
                {
                    **{k: v for k, v in g.items() if k != "names"},
                    "params": [(n, params[n]) for n in g["names"]],
                }
                for g in groups
            ],
            factored_v_2d=factored,
            **options,
        )

    ref = build(reference.Gefen, ref_params)
    for n, (_, _, period) in cases.items():
        ref.state[ref_params[n]]["automatic_period"] = period
    if codebook is not None:
        ref.codebook = codebook.clone()
    for step in range(warm):
        for i, p in enumerate(ref_params.values()):
            p.grad = gradient(p.shape, 100 * step + i, p.dtype)
        ref.step()
    place = place or (lambda name, value: torch.nn.Parameter(value))
    grad_layout = grad_layout or (lambda name, g: g)
    ours_params = {n: place(n, p.detach().clone().to(device)) for n, p in ref_params.items()}
    ours = build(gefen_triton.Gefen, ours_params)
    if warm:
        ours.load_state_dict(ref.state_dict())
    else:
        for n, (_, _, period) in cases.items():
            ours.state[ours_params[n]]["automatic_period"] = period
        if codebook is not None:
            ours.codebook = codebook.clone().to(device)
    before = {
        n: (
            {k: (v.clone() if torch.is_tensor(v) else v) for k, v in ref.state[p].items()},
            p.detach().clone(),
        )
        for n, p in ref_params.items()
    }
    for i, n in enumerate(cases):
        g = grads[n] if grads is not None else gradient(ref_params[n].shape, 7_000 + i, ref_params[n].dtype)
        ref_params[n].grad = g.clone()
        ours_params[n].grad = grad_layout(n, g.clone().to(device))
    ref.step()
    ours.step()
    return before, (ref_params, ref), (ours_params, ours)


# ---------------------------------------------------------------------- float64 oracle
def r32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def half_ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    e = torch.floor(torch.log2(x.abs().clamp(min=info.tiny)))
    return 2.0**e * info.eps / 2


def check_step(name, before, ref_side, ours_side, group, factored):
    """The comparisons of the module docstring for parameter ``name``; every failure names it."""
    (ref_params, ref), (ours_params, ours) = ref_side, ours_side
    p_ref, p_ours = ref_params[name], ours_params[name]
    s_ref, s_ours = ref.state[p_ref], ours.state[p_ours]
    s0, p0 = before[name]
    dtype = p_ref.dtype
    assert set(s_ours) == set(s_ref), name
    for key, value in s_ref.items():
        if not torch.is_tensor(value):
            assert s_ours[key] == value, (name, key)
    idx = s_ours["m_codebook"].cpu()
    mag = s_ours["m_magnitude"].cpu()
    assert torch.equal(idx, s_ref["m_codebook"]), f"{name}: m_codebook differs from the reference's"
    assert torch.equal(mag, s_ref["m_magnitude"]), f"{name}: m_magnitude differs from the reference's"

    g = p_ref.grad.double().reshape(-1)
    period = s_ref["automatic_period"]
    beta1, beta2 = group.get("betas", (0.9, 0.999))
    eps, lr, wd = group.get("eps", 1e-8), group["lr"], group.get("weight_decay", 0.0)
    b2, omb2 = r32(beta2), r32(1 - beta2)
    bc1 = 1 - beta1 ** s_ref["step"]
    if factored:
        rows, cols = p_ref.shape
        sq = (g * g).view(rows, cols)
        v_row = b2 * s0.get("v_row", torch.zeros(rows)).double() + omb2 * sq.mean(dim=1)
        v_col = b2 * s0.get("v_col", torch.zeros(cols)).double() + omb2 * sq.mean(dim=0)
        for key, exact, terms in (("v_row", v_row, cols), ("v_col", v_col, rows)):
            got = s_ours[key].cpu().double()
            bound = (terms + 8) * U * exact.abs() + 1e-38
            assert ((got - exact).abs() <= bound).all(), f"{name}: {key} beyond fp32 rounding of exact"
        bc2 = 1 - beta2 ** s_ref["factored_step"]
        mu = max(v_row.mean().item(), torch.finfo(torch.float32).tiny)
        den = torch.sqrt(torch.outer(v_row, v_col) / mu / r32(bc2)) + r32(eps)
        stepsize = (r32(1.0 / bc1) / den).reshape(-1)
        ss_rtol = (cols + 2 * rows + 24) * U / 2 + 12 * U
    else:
        q = (g * g).view(-1, period).mean(dim=1, keepdim=True)
        vmean = b2 * s0.get("vmean", torch.zeros_like(q)).double() + omb2 * q
        got = s_ours["vmean"].cpu().double()
        assert ((got - vmean).abs() <= (period + 8) * U * vmean.abs() + 1e-38).all(), (
            f"{name}: vmean beyond fp32 rounding of exact"
        )
        bc2 = 1 - beta2 ** s_ref["vmean_step"]
        den = torch.sqrt(vmean) / r32(math.sqrt(bc2)) + r32(eps)
        stepsize = (r32(1.0 / bc1) / den).expand(-1, period).reshape(-1)
        ss_rtol = (period + 8) * U / 2 + 12 * U
    codewords = ref.codebook.to(dtype).double()[idx.long()].reshape(-1)
    qm = codewords * mag.double().expand(-1, period).reshape(-1)
    delta = r32(lr) * stepsize * qm
    decay = r32(1 - lr * wd) if wd > 0 else 1.0
    start = p0.double().reshape(-1)
    expected = start * decay - delta
    got = p_ours.detach().cpu().double().reshape(-1)
    allowed = (
        (ss_rtol + 6 * U) * delta.abs() + 2 * U * (expected.abs() + start.abs()) + half_ulp(expected, dtype)
    )
    worst = ((got - expected).abs() - allowed).max().item()
    assert worst <= 0, f"{name}: parameter beyond the allowed rounding by {worst:.3g}"
    # the update is visible at this scale: a parameter the kernels skipped would fail above
    assert (delta.abs() > 4 * half_ulp(expected, dtype)).float().mean() > 0.5, name


def run_and_check(cases, device, *, factored=False, groups=None, **kw):
    groups = groups or [{"names": list(cases), "lr": 1e-2, "weight_decay": 0.0}]
    before, ref_side, ours_side = pinned_step(cases, device=device, factored=factored, groups=groups, **kw)
    for g in groups:
        for name in g["names"]:
            shape = cases[name][0]
            check_step(name, before, ref_side, ours_side, g, factored and len(shape) == 2)
    return ref_side, ours_side


# ------------------------------------------------------------------------------ cases
#: (shape, period): around the tile widths, the tiles' row counts and the split path
BLOCK_CASES = {
    "one": ((1,), 1),
    "period-one": ((300,), 1),
    "prime": ((37,), 37),
    "odd": ((3, 17), 17),
    "width-16": ((2048,), 16),
    "rows-over-a-tile": ((1025 * 16,), 16),
    "prime-8191": ((8191,), 8191),
    "widest-tile": ((2, 8192), 8192),
    "split-8193": ((2 * 8193,), 8193),
    "split-16384": ((16384,), 16384),
    "split-prime": ((3, 16411), 16411),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_block_step(case, dtype, device):
    shape, period = BLOCK_CASES[case]
    wd = 0.1 if case in ("odd", "widest-tile", "split-8193", "period-one") else 0.0
    run_and_check(
        {case: (shape, dtype, period)}, device, groups=[{"names": [case], "lr": 1e-2, "weight_decay": wd}]
    )


#: (shape, period) of factored 2-D parameters: one element, a row, a column vector, wider than
#: the squares kernel's tiles (256 columns), blocks across rows, split blocks
FACTORED_CASES = {
    "one": ((1, 1), 1),
    "row": ((1, 17), 17),
    "column": ((17, 1), 17),
    "wide": ((3, 300), 300),
    "tall": ((300, 3), 900),
    "blocks-across-rows": ((48, 40), 8),
    "aligned": ((64, 64), 4096),
    "split": ((5, 8193), 8193),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(FACTORED_CASES))
def test_factored_step(case, dtype, device):
    shape, period = FACTORED_CASES[case]
    wd = 0.1 if case in ("wide", "split") else 0.0
    run_and_check(
        {case: (shape, dtype, period)},
        device,
        factored=True,
        groups=[{"names": [case], "lr": 1e-2, "weight_decay": wd}],
    )


@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_first_step_from_fresh_state(dtype, factored, device):
    """Step 1: zero momentum (index 0, magnitude 0: ``cur = -0.0``), zero second moments, the codebook
    learned by both sides from the same gradients."""
    cases = {"w": ((24, 40), dtype, 40), "v": ((100,), dtype, 100), "s": ((1,), dtype, 1)}
    run_and_check(cases, device, factored=factored, warm=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ties_go_to_the_lower_index_in_a_step(dtype, device):
    """A block with one nonzero gradient element at step 1: that element normalises to exactly 1
    and every other to exactly 0, halfway between codewords 127 and 128 of ``linspace(-1, 1, 256)``
    (SPEC 1.7.2): index 127, exact in every profile (SPEC 5.6.6)."""
    codebook = torch.linspace(-1, 1, 256)
    grad = torch.zeros(4, 64, dtype=dtype)
    grad[:, 5] = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=dtype)
    cases = {"w": ((4, 64), dtype, 64)}
    _, (ours_params, ours) = run_and_check(cases, device, warm=0, codebook=codebook, grads={"w": grad})
    idx = ours.state[ours_params["w"]]["m_codebook"].cpu()
    assert (idx[:, 5] == torch.tensor([255, 0, 255, 255], dtype=torch.uint8)).all()
    assert (idx[:, torch.arange(64) != 5] == 127).all()


def test_unaligned_and_non_contiguous(device):
    """A parameter viewing a flat buffer at an odd offset (no vector loads), a transposed one with a
    transposed gradient (staged through contiguous copies): the same results, and nothing written
    outside the view."""
    flat = torch.zeros(1 + 4 * 64, device=device)

    def place(name, value):
        if name == "view":
            view = flat[1:].view(4, 64)
            view.copy_(value)
            return torch.nn.Parameter(view)
        return torch.nn.Parameter(value.t().contiguous().t())

    def grad_layout(name, g):
        return g.t().contiguous().t() if name == "t" else g

    cases = {"view": ((4, 64), torch.float32, 64), "t": ((32, 24), torch.bfloat16, 32)}
    _, (ours_params, _) = run_and_check(cases, device, place=place, grad_layout=grad_layout)
    assert ours_params["view"].data_ptr() % 16 != 0 and not ours_params["t"].is_contiguous()
    assert flat[0].item() == 0.0


def test_many_tensors_in_few_launches(monkeypatch, device):
    """Many parameters of mixed shapes, dtypes, groups and kinds in one step: each matches the
    reference, and the step takes one launch per (dtype, tile width) group, not one per tensor."""
    launches = []

    class Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            launches.append((self.kernel.fn.__name__ if hasattr(self.kernel, "fn") else "?", grid[0]))
            return self.kernel[grid]

    for name in (
        "tile_step",
        "split_stats",
        "split_blocks",
        "split_apply",
        "factored_squares",
        "factored_moments",
    ):
        monkeypatch.setattr(K, name, Spy(getattr(K, name)))
    shapes = [
        ((16, 24), 24),
        ((96,), 96),
        ((5,), 5),
        ((40, 40), 8),
        ((7, 11), 77),
        ((1,), 1),
        ((2, 9000), 9000),
    ]
    cases, groups = {}, []
    for dtype, lr, wd, betas in (
        (torch.float32, 1e-2, 0.1, (0.9, 0.999)),
        (torch.bfloat16, 2e-2, 0.0, (0.3, 0.99)),  # beta1 < 0.5: the lerp's other form
        (torch.float16, 1e-2, 0.05, (0.9, 0.95)),
    ):
        names = []
        for i, (shape, period) in enumerate(shapes):
            name = f"{str(dtype)[6:]}.{i}"
            cases[name] = (shape, dtype, period)
            names.append(name)
        groups.append({"names": names, "lr": lr, "weight_decay": wd, "betas": betas, "eps": 1e-6})
    launches.clear()
    run_and_check(cases, device, factored=True, groups=groups)
    tiles = [grid for name, grid in launches if name == "tile_step"]
    widths = {
        (dt, launch.tile_columns(period)) for _, dt, period in cases.values() if period <= K.MAX_TILE_PERIOD
    }
    # the reference steps first, then ours: only ours launches
    assert len(tiles) <= len(widths) + 3, launches  # + aligned/unaligned splits of a width
    assert len(tiles) < len([c for c in cases.values() if c[2] <= K.MAX_TILE_PERIOD])
    assert [n for n, _ in launches].count("factored_moments") == 1
    assert [n for n, _ in launches].count("split_blocks") == 1
    assert [n for n, _ in launches].count("split_stats") == 3  # one per dtype


def test_a_loaded_codebook_replaces_the_one_in_use(device):
    """Steps after ``load_state_dict`` use the loaded codebook, and steps after an in-place change
    of the codebook the changed one, not a copy the kernels kept."""
    cases = {"w": ((8, 32), torch.float32, 32)}
    _, (ref_params, ref), (ours_params, ours) = pinned_step(cases, device=device)
    state = ref.state_dict()
    other = torch.linspace(-1, 1, 256)
    state["gefen_codebook"] = other
    for group in state["param_groups"]:
        for key, value in group.items():
            if isinstance(value, dict) and "codebook" in value:
                group[key] = {**value, "codebook": other}
    for side in (ref, ours):
        side.load_state_dict(state)
        assert torch.equal(side.codebook.cpu(), other)
    for step in range(2):
        if step == 1:  # in place: the same tensor, a new version
            for side in (ref, ours):
                side.codebook.mul_(0.5)
                side.codebook[0], side.codebook[-1] = -1.0, 1.0
        for p in (ref_params["w"], ours_params["w"]):
            p.grad = gradient((8, 32), 99 + step, torch.float32).to(p.device)
        ref.step()
        ours.step()
        got, expected = ours.state[ours_params["w"]]["m_codebook"], ref.state[ref_params["w"]]["m_codebook"]
        assert torch.equal(got.cpu(), expected), f"step {step}"


def test_fp64_takes_the_reference_step(device):
    """fp64 parameters are not the kernels' (SPEC 1.8.11): the reference's own step, bit for bit."""
    if device.type != "cpu":
        pytest.skip("compares with the reference's CPU step bit for bit")
    p_ref = torch.nn.Parameter(torch.randn(6, 10, dtype=torch.float64))
    p_ours = torch.nn.Parameter(p_ref.detach().clone())
    ref, ours = reference.Gefen([p_ref], weight_decay=0.1), gefen_triton.Gefen([p_ours], weight_decay=0.1)
    for step in range(3):
        for p in (p_ref, p_ours):
            p.grad = gradient((6, 10), step, torch.float64)
        ref.step()
        ours.step()
    assert torch.equal(p_ref, p_ours)


# ------------------------------------------------------------------- the codeword rule
@triton.jit
def _nearest_kernel(cb_ptr, u_ptr, out_ptr, value_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    index, value = K._nearest(cb_ptr, tl.load(u_ptr + offs, mask=ok, other=0.0))
    tl.store(out_ptr + offs, index, mask=ok)
    tl.store(value_ptr + offs, value, mask=ok)


def _codebooks():
    linspace = torch.linspace(-1, 1, 256)
    padding = torch.cat([torch.tensor([-1.0]), torch.full((254,), 1 / 4096), torch.tensor([1.0])])
    gen = torch.Generator().manual_seed(3)
    # dyadic entries with runs of duplicates: every midpoint is exact in fp32
    inner = torch.sort(torch.randint(-2048, 2049, (254,), generator=gen).float() / 2048).values
    dyadic = torch.cat([torch.tensor([-1.0]), inner, torch.tensor([1.0])])
    return {"linspace": linspace, "padding": padding, "dyadic-duplicates": dyadic}


@pytest.mark.parametrize("book", list(_codebooks()))
def test_nearest_codeword_matches_the_rule(book, device):
    """Every codeword, every exact midpoint between neighbours (a tie: the lower index, SPEC 1.7.1),
    the values one fp32 step either side of it, the ends and random values: the reference's index
    for each, and the codeword's value."""
    from gefen_reference.codewords import nearest_codeword_indices

    cb = _codebooks()[book]
    mid = (cb[:-1] + cb[1:]) / 2  # exact: dyadic, or linspace's symmetric pairs (checked below)
    values = torch.cat(
        [
            cb,
            mid,
            torch.nextafter(mid, torch.tensor(2.0)),
            torch.nextafter(mid, torch.tensor(-2.0)),
            torch.tensor([-1.0, 1.0, 0.0, -0.0, 1 / 4096, 0.0003, 0.5, -0.5]),
            torch.rand(20000, generator=torch.Generator().manual_seed(1)) * 2 - 1,
        ]
    ).contiguous()
    expected = nearest_codeword_indices(cb, values).long()
    out = torch.empty(values.numel(), dtype=torch.int32, device=device)
    got_value = torch.empty(values.numel(), dtype=torch.float32, device=device)
    block = 16384
    _nearest_kernel[(triton_cdiv(values.numel(), block),)](
        cb.to(device), values.to(device), out, got_value, values.numel(), BLOCK=block
    )
    assert torch.equal(out.cpu().long(), expected), f"{(out.cpu().long() != expected).sum()} indices differ"
    assert torch.equal(got_value.cpu(), cb[expected])
    # the ties are there: a midpoint strictly between two distinct codewords goes to the lower one
    distinct = cb[:-1] < cb[1:]
    exact = ((mid - cb[:-1]) == (cb[1:] - mid)) & distinct
    assert exact.sum() >= (10 if book == "dyadic-duplicates" else 2)
    lower = torch.arange(255)[exact]
    tie_indices = out.cpu().long()[256 : 256 + 255][exact]
    # the run of the lower codeword ends at ``lower``: its highest index (SPEC 1.7.3)
    assert torch.equal(tie_indices, lower)


def triton_cdiv(a, b):
    return -(-a // b)


def test_linspace_zero_is_index_127(device):
    """SPEC 1.7.2's worked example: 0.0 ties between 127 and 128 of linspace(-1, 1, 256): 127."""
    out = torch.empty(1, dtype=torch.int32, device=device)
    value = torch.empty(1, dtype=torch.float32, device=device)
    _nearest_kernel[(1,)](
        torch.linspace(-1, 1, 256).to(device), torch.zeros(1, device=device), out, value, 1, BLOCK=16
    )
    assert out.item() == 127

"""``gefen_fast.Gefen`` against ``gefen_reference.Gefen``: same state, numbers within rounding.

The momentum (indices, magnitudes) does not depend on any sum or square root, so the kernels
reproduce it bit for bit; the second moments and the parameters differ from the reference by
the order of fp32 sums and the IEEE square root only, a few ulp.
"""

from __future__ import annotations

import pytest
import torch

import gefen_fast
import gefen_reference as reference
from gefen_fast import kernels, native

STEPS = 6
SHAPES = {
    "weight": (48, 40),  # searched or fallback period, factored in factored mode
    "wide": (6, 1000),  # blocks that span rows (factored segments)
    "vector": (256,),
    "conv": (8, 3, 3, 3),
    "prime": (37,),  # one block
    "scalar": (1,),  # period 1
    "late": (7, 11),  # first gradient at step 3
}
#: Parameters within rounding of the reference after STEPS steps (rtol, atol) per dtype.
CLOSE = {
    torch.float32: (1e-5, 1e-7),
    torch.float64: (0.0, 0.0),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (2e-3, 1e-4),
}


def _gradient(name, shape, step, dtype):
    if name == "late" and step < 3:
        return None
    g = torch.Generator().manual_seed(1000 * step + sum(map(ord, name)))
    x = torch.randn(shape, generator=g) * (1.0 + torch.arange(shape[-1], dtype=torch.float32) % 5)
    return x.to(dtype)


def _run(cls, dtype, steps=STEPS, shapes=SHAPES, periods=None, codebook=None, params_fn=None, **options):
    g = torch.Generator().manual_seed(0)
    params = {n: torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for n, s in shapes.items()}
    if params_fn is not None:
        params = params_fn(params)
    named = list(params.items())
    groups = [{"params": named[:3], "weight_decay": 0.05, "lr": torch.tensor(3e-3)}]
    if named[3:]:
        groups.append({"params": named[3:], "lr": 1e-3})
    opt = cls(groups, **options)
    for n, period in (periods or {}).items():
        opt.state[params[n]]["automatic_period"] = period
    if codebook is not None:
        opt.codebook = codebook.clone()
    for step in range(steps):
        for n, p in params.items():
            p.grad = _gradient(n, tuple(p.shape), step, dtype)
        opt.step()
    return params, opt


def _compare(ours, theirs, dtype):
    (p_ref, o_ref), (p_fast, o_fast) = ours, theirs
    assert o_fast.global_step == o_ref.global_step
    assert torch.equal(o_fast.codebook, o_ref.codebook)
    rtol, atol = CLOSE[dtype]
    for n in p_ref:
        ref_state, fast_state = o_ref.state[p_ref[n]], o_fast.state[p_fast[n]]
        assert set(fast_state) == set(ref_state), n
        for key, value in ref_state.items():
            got = fast_state[key]
            if not torch.is_tensor(value):
                assert got == value, (n, key)
                continue
            assert got.dtype == value.dtype and got.shape == value.shape, (n, key)
            if key in ("m_codebook", "m_magnitude"):
                assert torch.equal(got, value), f"{n}.{key} is not the reference's bit for bit"
            else:
                torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-12, msg=f"{n}.{key}")
        torch.testing.assert_close(p_fast[n].detach(), p_ref[n].detach(), rtol=rtol, atol=atol, msg=n)


@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_matches_reference(dtype, factored):
    ref = _run(reference.Gefen, dtype, factored_v_2d=factored)
    fast = _run(gefen_fast.Gefen, dtype, factored_v_2d=factored)
    _compare(ref, fast, dtype)


#: Builds for CPUs with less than this one, and the capability each must lack.
NARROWER_BUILDS = {
    "8-lane": (("-DGEFEN_NO_AVX512=1",), native.CAP_AVX512),
    "16-lane-without-vbmi": (("-mno-avx512vbmi",), native.CAP_BYTE_DECODE),
}


@pytest.fixture(scope="module", params=list(NARROWER_BUILDS))
def narrower_library(request, kernel_variant):
    """The kernels as built on a CPU with less than this one: the 8-lane (AVX2) loops alone, as
    without AVX-512; the 16-lane loops decoding the old indices by float permutes, as without
    AVX512_VBMI. Skipped where the default build is already that one."""
    flags, lacks = NARROWER_BUILDS[request.param]
    if not native.capabilities() & lacks:
        pytest.skip(f"the default build is already {request.param}: the default tests run it")
    lib = kernel_variant(*flags)
    assert not lib.gefen_capabilities() & lacks
    return lib


@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_narrower_builds_match_reference(narrower_library, monkeypatch, dtype, factored):
    """Where the default build runs wider loops, the narrower ones (other CPUs) are checked here."""
    monkeypatch.setattr(native, "library", lambda: narrower_library)
    kw = dict(
        factored_v_2d=factored, shapes={**SHAPES, "big": (2, 65536 + 512)}, periods={"big": 65536 + 512}
    )
    _compare(_run(reference.Gefen, dtype, **kw), _run(gefen_fast.Gefen, dtype, **kw), dtype)


@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
def test_small_beta1_takes_the_other_lerp_branch(factored):
    """beta1 < 0.5 makes the lerp weight >= 0.5: torch's second formula (SPEC 1.8.8 step 2)."""
    kw = dict(betas=(0.3, 0.99), factored_v_2d=factored)
    _compare(
        _run(reference.Gefen, torch.float32, **kw), _run(gefen_fast.Gefen, torch.float32, **kw), torch.float32
    )


@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
def test_blocks_larger_than_the_kept_scratch(factored):
    """Blocks above the per-thread scratch (KEEP_MAX elements) take the large-block path: cut into
    pieces over the threads, a maximum and a sum across the pieces between the passes."""
    shapes = {"big": (2, 65536 + 512), "other": (64,)}
    kw = dict(shapes=shapes, periods={"big": 65536 + 512, "other": 64}, steps=2, factored_v_2d=factored)
    _compare(
        _run(reference.Gefen, torch.float32, **kw), _run(gefen_fast.Gefen, torch.float32, **kw), torch.float32
    )


@pytest.fixture(scope="module", params=["default", *NARROWER_BUILDS])
def recomputing_library(request, kernel_variant):
    """The kernels built to keep at most 4096 lerps of a large block, so pass B recomputes the lerp
    of the rest from the gradient and the old indices, as it does at the default (LARGE_KEEP, 1Mi
    elements) only for blocks of millions of elements; for this CPU and the narrower builds."""
    flags = ("-DLARGE_KEEP=4096",)
    if request.param != "default":
        narrower, lacks = NARROWER_BUILDS[request.param]
        if not native.capabilities() & lacks:
            pytest.skip(f"the default build is already {request.param}")
        flags += narrower
    return kernel_variant(*flags)


@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_large_blocks_recompute_the_lerp(recomputing_library, monkeypatch, dtype, factored):
    """Pass B's recomputed lerps (the old indices decoded again) give the reference's momentum."""
    monkeypatch.setattr(native, "library", lambda: recomputing_library)
    shapes = {"big": (2, 65536 + 560), "other": (64,)}
    kw = dict(shapes=shapes, periods={"big": 65536 + 560, "other": 64}, steps=3, factored_v_2d=factored)
    _compare(_run(reference.Gefen, dtype, **kw), _run(gefen_fast.Gefen, dtype, **kw), dtype)


def test_crowded_codebook_uses_the_search():
    """A codebook the table cannot represent exactly still gives the reference's indices."""
    crowded = torch.linspace(-1, 1, 256)
    crowded[120:136] = crowded[120] + torch.arange(16) * 1e-5
    kw = dict(codebook=crowded, factored_v_2d=False)
    _compare(
        _run(reference.Gefen, torch.float32, **kw), _run(gefen_fast.Gefen, torch.float32, **kw), torch.float32
    )


def test_non_contiguous_parameter():
    def transpose(params):
        params["weight"] = torch.nn.Parameter(params["weight"].detach().t().contiguous().t())
        return params

    shapes = {"weight": (48, 40), "vector": (256,)}
    for factored in (False, True):
        kw = dict(shapes=shapes, params_fn=transpose, factored_v_2d=factored)
        ref, fast = _run(reference.Gefen, torch.float32, **kw), _run(gefen_fast.Gefen, torch.float32, **kw)
        assert not fast[0]["weight"].is_contiguous()
        _compare(ref, fast, torch.float32)


def test_state_is_updated_in_place():
    """SPEC 5.4.3: after the first step the compact state keeps its storage."""
    p = torch.nn.Parameter(torch.randn(64, 32))
    opt = gefen_fast.Gefen([("w", p)], factored_v_2d=False)
    p.grad = torch.randn(64, 32)
    opt.step()
    before = {k: v.data_ptr() for k, v in opt.state[p].items() if torch.is_tensor(v)}
    p.grad = torch.randn(64, 32)
    opt.step()
    assert {k: v.data_ptr() for k, v in opt.state[p].items() if torch.is_tensor(v)} == before


def test_kernels_handle_cpu_float_types_only():
    x, y = torch.zeros(4), torch.zeros(4)
    assert (
        kernels.handles(x, y)
        and kernels.handles(x.bfloat16(), y.bfloat16())
        and kernels.handles(x.half(), y.half())
    )
    assert not kernels.handles(x.double(), y.double())
    assert not kernels.handles(x, y.bfloat16())


def test_aliased_parameter_and_gradient_are_left_to_torch():
    """A gradient sharing memory with its parameter cannot be read while the parameter is written."""
    flat = torch.zeros(64)
    assert not kernels.handles(flat[:32], flat[16:48])
    assert kernels.handles(flat[:32], flat[32:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
def test_large_blocks_in_16_bit(dtype, factored):
    """Blocks above the kept scratch, split over the threads, in bf16 and fp16."""
    shapes = {"big": (2, 65536 + 512), "other": (64,)}
    kw = dict(shapes=shapes, periods={"big": 65536 + 512, "other": 64}, steps=2, factored_v_2d=factored)
    _compare(_run(reference.Gefen, dtype, **kw), _run(gefen_fast.Gefen, dtype, **kw), dtype)


def test_parameters_that_are_views_of_one_flat_buffer():
    """FSDP-style flat parameters: each parameter a contiguous view at an offset of one buffer."""

    def views(params):
        flat = torch.cat([p.detach().reshape(-1) for p in params.values()])
        out, at = {}, 0
        for name, p in params.items():
            out[name] = torch.nn.Parameter(flat[at : at + p.numel()].view(p.shape))
            at += p.numel()
        return out

    for factored in (False, True):
        kw = dict(params_fn=views, factored_v_2d=factored)
        _compare(
            _run(reference.Gefen, torch.float32, **kw),
            _run(gefen_fast.Gefen, torch.float32, **kw),
            torch.float32,
        )


def test_non_contiguous_gradients():
    """Gradients that are transposed views or strided slices are read in logical order."""

    class Strided(gefen_fast.Gefen):
        pass

    def run(cls):
        g = torch.Generator().manual_seed(8)
        params = {
            "w": torch.nn.Parameter(torch.randn(40, 48, generator=g)),
            "v": torch.nn.Parameter(torch.randn(96, generator=g)),
        }
        opt = cls(list(params.items()), factored_v_2d=True)
        for _step in range(4):
            params["w"].grad = torch.randn(48, 40, generator=g).t()
            params["v"].grad = torch.randn(192, generator=g)[::2]
            opt.step()
        return params, opt

    ref, fast = run(reference.Gefen), run(Strided)
    assert not fast[0]["w"].grad.is_contiguous()
    _compare(ref, fast, torch.float32)


def test_zero_frozen_and_non_finite_gradients():
    """An all-zero gradient (zero magnitude: the whole block normalises to 0), a frozen parameter,
    and an infinite gradient (outside the conformance domain, but the momentum still follows the
    reference: SPEC 1.8.8 step 4 on a NaN or infinite magnitude)."""

    def run(cls):
        g = torch.Generator().manual_seed(9)
        params = {
            "zero": torch.nn.Parameter(torch.randn(64, 32, generator=g)),
            "frozen": torch.nn.Parameter(torch.randn(16, generator=g), requires_grad=False),
            "inf": torch.nn.Parameter(torch.randn(128, generator=g)),
        }
        opt = cls(list(params.items()), factored_v_2d=False)
        for step in range(3):
            params["zero"].grad = torch.zeros(64, 32) if step else torch.randn(64, 32, generator=g)
            params["inf"].grad = torch.randn(128, generator=g)
            if step == 2:
                params["inf"].grad[5] = float("inf")
            opt.step()
        return params, opt

    (p_ref, o_ref), (p_fast, o_fast) = run(reference.Gefen), run(gefen_fast.Gefen)
    assert "step" not in o_fast.state[p_fast["frozen"]]
    for name in ("zero", "inf"):
        for key in ("m_codebook", "m_magnitude"):
            assert torch.equal(o_fast.state[p_fast[name]][key], o_ref.state[p_ref[name]][key]), (name, key)
    torch.testing.assert_close(p_fast["zero"].detach(), p_ref["zero"].detach(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_counts_give_the_reference_momentum(threads):
    """Any thread count: the momentum is the reference's bit for bit (only sums may reassociate)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        shapes = {"big": (4, 65536), "mid": (256, 512), "small": (300,)}
        kw = dict(
            shapes=shapes, periods={"big": 131072, "mid": 2048, "small": 300}, steps=2, factored_v_2d=True
        )
        _compare(
            _run(reference.Gefen, torch.float32, **kw),
            _run(gefen_fast.Gefen, torch.float32, **kw),
            torch.float32,
        )
    finally:
        torch.set_num_threads(previous)


def test_a_failed_orchestration_still_updates_the_parameters_it_reached():
    """The kernels run after the reference's orchestration; if it raises part-way, the parameters
    it had reached are updated, as the reference would have left them."""

    def run(cls):
        g = torch.Generator().manual_seed(10)
        a = torch.nn.Parameter(torch.randn(64, generator=g))
        b = torch.nn.Parameter(torch.randn(64, generator=g))
        opt = cls([("a", a), ("b", b)], factored_v_2d=False)
        a.grad, b.grad = torch.randn(64, generator=g), torch.randn(64, generator=g)
        opt.step()
        opt.state[b]["step"] = 5  # as if restored
        del opt.state[b]["m_codebook"]  # b's state is now malformed: the orchestration fails on it
        a.grad, b.grad = torch.randn(64, generator=g), torch.randn(64, generator=g)
        with pytest.raises(Exception):  # noqa: B017 - whichever error the orchestration raises
            opt.step()
        return a.detach().clone(), opt.state[a]["step"]

    assert run(gefen_fast.Gefen)[1] == run(reference.Gefen)[1]
    torch.testing.assert_close(run(gefen_fast.Gefen)[0], run(reference.Gefen)[0], rtol=1e-5, atol=1e-7)


def test_results_do_not_depend_on_the_thread_count():
    """Work is split in fixed pieces and partial sums are added in piece order: parameters and
    state are bitwise the same with 1, 2 or 3 threads (block and factored, small and large blocks)."""
    previous = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            shapes = {"big": (4, 65536), "mid": (256, 512), "small": (300,)}
            for factored in (False, True):
                results.append(
                    (
                        threads,
                        factored,
                        _run(
                            gefen_fast.Gefen,
                            torch.float32,
                            shapes=shapes,
                            steps=2,
                            periods={"big": 131072, "mid": 2048, "small": 300},
                            factored_v_2d=factored,
                        ),
                    )
                )
    finally:
        torch.set_num_threads(previous)
    for factored in (False, True):
        runs = [r for t, f, r in results if f == factored]
        (p1, o1) = runs[0]
        for params, opt in runs[1:]:
            for name in p1:
                assert torch.equal(params[name], p1[name]), name
                for key, value in o1.state[p1[name]].items():
                    if torch.is_tensor(value):
                        assert torch.equal(opt.state[params[name]][key], value), (name, key)


@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
def test_subnormal_bf16_values_round_as_the_reference(factored):
    """bf16 parameters and updates below fp32's normal range (2^-126), and squared gradients there
    too, round as the reference rounds them (rbf16 and rP of SPEC 1.8.3 and 1.8.8), not flushed to
    zero as a conversion instruction with DAZ/FTZ semantics would: each parameter within 2 bf16
    subnormal steps of the reference's, and the second moments within 1% with no absolute slack."""
    step_2_133 = 2.0**-133  # bf16's subnormal spacing

    def run(cls):
        g = torch.Generator().manual_seed(5)
        shapes = {"weight": (48, 40), "vector": (4096,)}
        params = {
            n: torch.nn.Parameter((torch.randn(s, generator=g) * 2.0**-129).to(torch.bfloat16))
            for n, s in shapes.items()
        }
        opt = cls(list(params.items()), lr=1e-39, factored_v_2d=factored)
        for _step in range(4):
            for n, p in params.items():
                scale = 3e-20 if n == "vector" else 1e-3  # the vector's squares are subnormal
                p.grad = (torch.randn(p.shape, generator=g) * scale).to(torch.bfloat16)
            opt.step()
        return params, opt

    (p_ref, o_ref), (p_fast, o_fast) = run(reference.Gefen), run(gefen_fast.Gefen)
    for n in p_ref:
        ref, fast = p_ref[n].detach().float(), p_fast[n].detach().float()
        assert (ref.abs() < 2.0**-126).float().mean() > 0.9 and (ref != 0).any(), n  # the test's premise
        assert torch.equal(o_fast.state[p_fast[n]]["m_codebook"], o_ref.state[p_ref[n]]["m_codebook"]), n
        torch.testing.assert_close(fast, ref, rtol=0.0, atol=2 * step_2_133, msg=n)
        for key in ("vmean", "v_row", "v_col"):
            if key in o_ref.state[p_ref[n]]:
                want, got = o_ref.state[p_ref[n]][key], o_fast.state[p_fast[n]][key]
                assert (want > 0).any(), (n, key)
                torch.testing.assert_close(got, want, rtol=1e-2, atol=0.0, msg=f"{n}.{key}")

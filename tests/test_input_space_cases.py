"""The input space's cases are what SPEC 4.3.10 says they are (``gefen_conformance.workload.space`` and the
explicit examples of ``gefen_conformance.suite.space_examples``): the layouts have the strides and storage
they claim, the GradScaler scale keeps gradients finite and unscales exactly, and the explicit
examples cover every boundary the clause names. The suite's verdicts on these cases are proven by
the mutant catalogue (tests/mutants.py, its input-space section) and the benign catalogue."""

from __future__ import annotations

import torch

from gefen_conformance.suite.space_examples import BOUNDARIES, GROUPS_ADDED, LIFECYCLE, PROTOCOL_BOUNDARIES
from gefen_conformance.workload import space, space_driver
from gefen_conformance.workload.models import REFERENCE

P = space.ParamCase


def _every_param(cases):
    return [(case, p) for case in cases for p in case.params]


def test_layouts_have_the_strides_and_storage_they_claim():
    case = space.InputCase(
        params=(
            P((6, 4), layout="transposed"),
            P((2, 3, 4, 5), layout="channels-last"),
            P((5,), layout="flat-view"),
            P((3, 4), layout="flat-view"),
            P((3, 4), layout="strided-grad"),
            P((7,), "bf16", layout="flat-view"),
        )
    )
    built = space_driver.build(case, REFERENCE, torch.device("cpu"))
    p = built.params
    assert p[0].shape == (6, 4) and p[0].stride() == (1, 6)
    assert p[1].is_contiguous(memory_format=torch.channels_last) and not p[1].is_contiguous()
    # two fp32 views share one storage, each at a nonzero offset, and do not overlap
    assert p[2].untyped_storage().data_ptr() == p[3].untyped_storage().data_ptr()
    assert 0 < p[2].storage_offset() and p[2].storage_offset() + 5 < p[3].storage_offset()
    assert p[5].untyped_storage().data_ptr() != p[2].untyped_storage().data_ptr()  # one buffer per dtype
    for i, value in built.params.items():
        torch.testing.assert_close(value.detach(), space.initial(case, i), rtol=0, atol=0)
        g = space_driver.placed(case, built, i, space.gradient(case, i, 1), torch.device("cpu"))
        assert torch.equal(g, space.gradient(case, i, 1)) and g.shape == value.shape
        if case.params[i].layout == "strided-grad":
            assert not g.is_contiguous() and value.is_contiguous()
        elif case.params[i].layout == "flat-view":
            assert g.storage_offset() == value.storage_offset() > 0
        else:
            assert g.stride() == value.stride()


def test_grad_scale_keeps_gradients_finite_and_unscales_exactly():
    case = space.InputCase(
        params=(P((64, 32), "fp16", gradient="huge"), P((64,), "fp16", gradient="tiny"), P((48,), "bf16")),
        calls=2,
        protocol="grad-scale",
    )
    scale = space_driver.grad_scale(case, 1)
    assert (
        scale < space.GRAD_SCALE
        and scale >= 1.0
        and scale == 2.0 ** round(torch.log2(torch.tensor(scale)).item())
    )
    for i in range(len(case.params)):
        g = space.gradient(case, i, 1)
        scaled = (g.double() * scale).to(g.dtype)
        assert bool(torch.isfinite(scaled).all())
        assert torch.equal(scaled.mul_(torch.tensor(1.0 / scale)), g)


def test_synthesized_state_is_a_valid_native_state():
    case = BOUNDARIES["dtype-mix-per-group"]
    sd = space_driver.starting_state(case)
    built = space_driver.build(case, REFERENCE, torch.device("cpu"))
    built.optimizer.load_state_dict(sd)  # the reference validates every entry (SPEC 1.12)
    entry = sd["state"][0]
    assert entry["step"] == case.counter and entry["m_codebook"].dtype == torch.uint8
    assert bool((entry["m_magnitude"] > 0).all())
    assert (
        torch.equal(sd["gefen_codebook"], space.CODEBOOK)
        and space.CODEBOOK[0] == -1
        and space.CODEBOOK[-1] == 1
    )


def test_explicit_examples_cover_every_boundary_of_the_clause():
    """SPEC 4.3.10: one derandomized example at least per boundary."""
    cases = list(BOUNDARIES.values()) + list(PROTOCOL_BOUNDARIES.values())
    cases += list(LIFECYCLE.values()) + list(GROUPS_ADDED.values())
    params = _every_param(cases)
    sizes = {p.numel for _, p in params}
    for limit in (2048, 16384, 65536):
        assert {limit - 1, limit + 1} <= sizes, limit
    assert any(p.numel > 2**20 and not case.factored for case, p in params)
    assert any(p.numel > 2**20 and case.factored and len(p.shape) == 2 for case, p in params)
    assert {1, 255, 256, 1000, 2**31 - 1, 2**32} <= {c.counter for c in cases}
    assert any(c.moment_counter is not None for c in cases)
    assert set(space.LAYOUTS) <= {p.layout for _, p in params}
    assert any(sum(p.layout == "flat-view" and p.dtype == "fp32" for p in c.params) >= 2 for c in cases)
    dtypes_in_one_group = [{p.dtype for p in c.params if p.group == 0} for c in cases]
    assert any(set(space.DTYPES) <= d for d in dtypes_in_one_group)
    assert any(len({p.dtype for p in c.params}) == 4 and len(c.groups) == 4 for c in cases)
    assert any(c.params[0].gradient == "none" for c in cases)  # grad-less first
    assert any(
        c.groups[0].weight_decay == 0.0 and any(g.weight_decay > 0 for g in c.groups[1:]) for c in cases
    )
    assert any(1 in p.shape and len(p.shape) == 2 and case.factored for case, p in params)
    assert {"lr", "lr-in-place", "all"} <= {c.schedule for c in cases}
    assert any(c.schedule == "lr-in-place" and all(g.tensor_lr for g in c.groups) for c in cases)
    assert {"zero", "zero-half", "tiny", "huge", "none"} <= {p.gradient for _, p in params}
    assert any(p.gradient == "zero" and len(p.shape) == 2 and case.factored for case, p in params)
    assert any(p.gradient == "zero-half" and p.period is not None for _, p in params)
    assert set(space.PROTOCOLS) - {"plain"} <= {c.protocol for c in PROTOCOL_BOUNDARIES.values()}
    for protocol in ("closure", "grad-scale", "found-inf"):  # frozen parameters first and in a later group
        assert any(
            c.protocol == protocol and c.params[0].frozen and any(p.frozen for p in c.params if p.group > 0)
            for c in PROTOCOL_BOUNDARIES.values()
        ), protocol
    assert any(p.frozen and p.gradient != "none" for _, p in params)  # requires_grad=False with a gradient
    assert set(space.OPTIONS) <= {o for c in cases for o in c.options}


def test_explicit_examples_cover_every_lifecycle_boundary():
    """SPEC 4.3.12: one derandomized example at least per dimension of the lifecycle."""
    cases = list(LIFECYCLE.values()) + list(GROUPS_ADDED.values())
    params = _every_param(cases)
    assert max(len(c.params) for c in cases) >= 300
    assert any(len(c.params) > 100 and c.counter == 0 and len(c.groups) == 3 for c in cases)
    assert {"odd-calls", "even-calls", "near-constant"} <= {p.gradient for _, p in params}
    assert set(space.GRAD_ORDERS) <= {
        c.grad_order for c in cases if any(p.layout == "bucket-grad" for p in c.params)
    }
    assert set(space.EVENTS) <= {e for c in cases for _, e in c.events}
    assert any(c.schedule == "warmup" for c in cases)
    assert {"fp64", "bf16", "fp16"} <= {g.tensor_lr for c in cases for g in c.groups}
    assert any(c.deterministic and any(g.weight_decay for g in c.groups) for c in cases)
    assert any(c.substring != c.substring.lower() for c in cases if "period_one_substrings" in c.options)
    assert any(p.period is not None and p.period > 2048 for _, p in params)
    assert any(
        p.period is None and p.numel > 2048 and len(p.shape) == 2 and p.shape[1] > 2048 for _, p in params
    )


def test_a_group_added_later_and_replaced_storage_happen_as_the_case_says():
    case = LIFECYCLE["storage-replaced-between-steps"]
    built = space_driver.build(case, REFERENCE, torch.device("cpu"))
    before = {i: p.untyped_storage().data_ptr() for i, p in built.params.items()}
    space_driver._lifecycle(case, built, 2)
    assert all(p.untyped_storage().data_ptr() != before[i] for i, p in built.params.items())
    space_driver._lifecycle(case, built, 3)
    assert (
        built.params[3].is_contiguous(memory_format=torch.channels_last)
        and not built.params[3].is_contiguous()
    )
    case = GROUPS_ADDED["group-added-after-steps"]
    built = space_driver.build(case, REFERENCE, torch.device("cpu"))
    assert len(built.optimizer.param_groups) == 1
    space_driver._lifecycle(case, built, 2)
    assert len(built.optimizer.param_groups) == 2 and built.optimizer.param_groups[1]["lr"] == 3e-3


def test_a_reverse_bucket_lays_gradients_out_backwards():
    case = LIFECYCLE["gradients-bucketed-in-reverse"]
    built = space_driver.build(case, REFERENCE, torch.device("cpu"))
    order = case.order()
    fp32 = [i for i in order if case.params[i].dtype == "fp32"]
    offsets = [built.bucket_offsets[i] for i in fp32]
    assert offsets == sorted(offsets, reverse=True) and min(offsets) == 0
    g = space_driver.placed(case, built, fp32[0], space.gradient(case, fp32[0], 1), torch.device("cpu"))
    assert g.untyped_storage().data_ptr() == built.buckets[torch.float32].untyped_storage().data_ptr()

"""Hyperparameter staging for DCP loads (SPEC 3.5), through its pure API.

No optimizer and no process group: ``gefen_reference.dcp.hyper_staging`` is driven
directly, as the later property-based fuzzer will drive it.
"""

from __future__ import annotations

import math

import pytest
import torch

from gefen_reference.dcp import hyper_staging as H
from gefen_reference.dcp.schema import HYPER_KEYS

SAVED = {"lr": 2.5e-3, "beta1": 0.8, "beta2": 0.97, "eps": 2e-8, "weight_decay": 0.03}


def _group(**entries):
    group = dict(SAVED)
    group.update(entries)
    return group


# ------------------------------------------------------------------------ acceptance


def test_plain_destination_is_replaced_by_the_saved_float():
    """SPEC 3.5.5: a non-tensor entry becomes the saved value as a Python float."""
    group = {"lr": 1}
    staged = H.stage_hyperparameter(group["lr"], 3, key="lr")
    assert not staged.in_place and staged.stored == 3.0
    H.apply(group, staged)
    assert type(group["lr"]) is float and group["lr"] == 3.0


def test_tensor_destination_is_filled_in_place_keeping_identity():
    """SPEC 3.5.2, 3.5.5: a float32 tensor lr keeps its identity and receives the value."""
    live = torch.tensor(1.0)
    group = {"lr": live}
    staged = H.stage_hyperparameter(live, 2.5e-3, key="lr")
    assert staged.in_place and staged.destination is live
    H.apply(group, staged)
    assert group["lr"] is live and live.item() == pytest.approx(2.5e-3, abs=1e-9)
    assert staged.stored == live.item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_small_lr_rounds_ordinarily_into_low_precision(dtype):
    """SPEC 3.5.2: 3e-5 into fp16/bf16 is accepted (ordinary rounding, within 1e-6)."""
    live = torch.tensor(1.0, dtype=dtype)
    staged = H.stage_hyperparameter(live, 3e-5, key="lr")
    H.apply({"lr": live}, staged)
    assert live.dtype == dtype and abs(live.item() - 3e-5) < 1e-6
    assert staged.stored == live.item() and staged.value == 3e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ordinary_beta_rounds_ordinarily_into_low_precision(dtype):
    """SPEC 3.5.2: beta 0.9 into fp16/bf16 is accepted (within 1e-2) and stays below 1."""
    live = torch.tensor(0.5, dtype=dtype)
    staged = H.stage_hyperparameter(live, 0.9, key="beta1")
    H.apply({"beta1": live}, staged)
    assert abs(live.item() - 0.9) < 1e-2 and live.item() < 1.0


def test_integral_value_into_integer_and_bool_tensors_is_accepted():
    """SPEC 3.5.2: an integral value inside the dtype's range is exact."""
    for dtype, value in ((torch.int64, 3.0), (torch.int8, 127.0), (torch.bool, 1.0), (torch.bool, 0.0)):
        live = torch.zeros((), dtype=dtype)
        staged = H.stage_hyperparameter(live, value, key="weight_decay")
        H.apply({"weight_decay": live}, staged)
        assert float(live.item()) == value and staged.stored == value


def test_requires_grad_leaf_is_filled_without_autograd():
    """SPEC 3.5.3: a leaf tensor that requires grad is accepted; the fill runs outside autograd and
    leaves requires_grad, .grad and identity as they were."""
    live = torch.tensor(1.0, requires_grad=True)
    live.grad = torch.tensor(7.0)
    staged = H.stage_hyperparameter(live, 2.5e-3, key="lr")
    H.apply({"lr": live}, staged)
    assert live.requires_grad and live.is_leaf and live.grad.item() == 7.0
    assert live.item() == pytest.approx(2.5e-3)


def test_inference_tensor_is_filled_inside_inference_mode():
    """SPEC 3.5.3: an inference tensor (which refuses in-place updates outside inference mode)
    is accepted and filled."""
    with torch.inference_mode():
        live = torch.tensor(1.0)
    staged = H.stage_hyperparameter(live, 0.5, key="lr")
    H.apply({"lr": live}, staged)
    assert live.item() == 0.5


def test_aliased_tensor_receiving_the_same_value_is_accepted():
    """SPEC 3.5.4: one tensor shared by two groups whose saved values agree."""
    shared = torch.tensor(1.0)
    groups = [_group(lr=shared), _group(lr=shared)]
    staged = H.stage_groups(groups, [dict(SAVED), dict(SAVED)])
    H.commit(groups, staged)
    assert groups[0]["lr"] is shared and groups[1]["lr"] is shared
    assert shared.item() == pytest.approx(2.5e-3)


def test_commit_applies_every_key_of_every_group():
    """SPEC 3.5.5: every key is restored; tensors in place, the rest replaced."""
    lr = torch.tensor(9.0, dtype=torch.float64)
    groups = [{"lr": lr, "beta1": 0.1, "beta2": 0.2, "eps": 1.0, "weight_decay": 0.5}]
    staged = H.stage_groups(groups, [dict(SAVED)])
    H.commit(groups, staged)
    assert groups[0]["lr"] is lr and lr.item() == 2.5e-3
    assert {k: groups[0][k] for k in HYPER_KEYS if k != "lr"} == {
        k: SAVED[k] for k in HYPER_KEYS if k != "lr"
    }


def test_saved_value_as_one_element_tensor_is_read():
    """SPEC 3.5.1: a one-element real tensor is read as its value."""
    assert H.read_saved_value(torch.tensor([0.25], dtype=torch.float64), key="lr") == 0.25


# ------------------------------------------------------------------------- rejection


@pytest.mark.parametrize(
    "key, saved, part",
    [
        ("lr", float("nan"), "not finite"),
        ("lr", float("inf"), "not finite"),
        ("lr", -1e-3, "invalid lr"),
        ("beta1", 1.0, "invalid beta1"),
        ("beta2", -0.1, "invalid beta2"),
        ("eps", 0.0, "invalid eps"),
        ("eps", -1e-8, "invalid eps"),
        ("weight_decay", -0.1, "invalid weight_decay"),
        ("lr", "0.1", "non-numeric"),
        ("lr", True, "non-numeric"),
        ("lr", None, "non-numeric"),
        ("lr", torch.tensor([1e-3, 2e-3]), "real scalar"),
        ("lr", torch.tensor(True), "real scalar"),
    ],
)
def test_saved_value_rules(key, saved, part):
    """SPEC 3.5.1: the saved value must be a finite real number in the optimizer's legal range."""
    with pytest.raises(H.HyperparameterRejected, match=part):
        H.stage_hyperparameter(None, saved, key=key)
    assert issubclass(H.HyperparameterRejected, ValueError)


@pytest.mark.parametrize(
    "rule, dtype, key, saved, part",
    [
        ("integral_truncation", torch.int64, "lr", 1e-3, "would truncate"),
        ("integer_out_of_range", torch.int8, "lr", 128.0, "representable range"),
        ("integer_out_of_range_int16", torch.int16, "weight_decay", 40000.0, "representable range"),
        ("bool_out_of_range", torch.bool, "lr", 128.0, "representable range"),
        ("bool_two", torch.bool, "weight_decay", 2.0, "representable range"),
        ("bool_truncation", torch.bool, "lr", 0.5, "would truncate"),
        ("float_overflow", torch.float16, "lr", 1e10, "overflow to inf"),
        ("float_overflow_bf16", torch.bfloat16, "weight_decay", 1e39, "overflow to inf"),
        ("float_underflow", torch.float16, "lr", 1e-10, "underflow to 0"),
        ("eps_underflow", torch.bfloat16, "eps", 1e-45, "underflow to 0"),
        ("beta_rounds_to_one_fp16", torch.float16, "beta2", 0.9999, "divide by zero"),
        ("beta_rounds_to_one_bf16", torch.bfloat16, "beta2", 0.999, "divide by zero"),
        ("beta_truncates_in_int", torch.int32, "beta1", 0.9, "would truncate"),
    ],
)
def test_destination_rules_reject_before_any_change(rule, dtype, key, saved, part):
    """SPEC 3.5.2: a tensor destination whose dtype cannot hold the saved value is rejected, and
    staging leaves it untouched."""
    live = torch.zeros((), dtype=dtype)
    before = live.clone()
    with pytest.raises(H.HyperparameterRejected, match=part):
        H.stage_hyperparameter(live, saved, key=key)
    assert torch.equal(live, before)


def test_non_leaf_tensor_requiring_grad_is_rejected():
    """SPEC 3.5.3: an autograd intermediate is not filled in place."""
    base = torch.tensor(2.0, requires_grad=True)
    derived = base * 1e-3
    with pytest.raises(H.HyperparameterRejected, match="non-leaf"):
        H.stage_hyperparameter(derived, 2.5e-3, key="lr")


@pytest.mark.parametrize(
    "live, part",
    [(torch.zeros(2), "exactly one"), (torch.zeros((), dtype=torch.complex64), "complex")],
)
def test_multi_element_and_complex_destinations_are_rejected(live, part):
    """SPEC 3.5.2: a hyperparameter tensor holds exactly one real element."""
    with pytest.raises(H.HyperparameterRejected, match=part):
        H.stage_hyperparameter(live, 1e-3, key="lr")


@pytest.mark.parametrize("shared_keys", [(("lr", 0), ("lr", 1)), (("beta1", 0), ("beta2", 0))])
def test_aliased_tensor_receiving_different_values_is_rejected(shared_keys):
    """SPEC 3.5.4: one tensor shared by groups or keys that the checkpoint gives different values
    is rejected while staging; nothing is filled."""
    shared = torch.tensor(0.5)
    groups = [_group(), _group()]
    for key, index in shared_keys:
        groups[index][key] = shared
    entries = [dict(SAVED), dict(SAVED, lr=2e-3)]
    with pytest.raises(H.HyperparameterRejected, match="aliased"):
        H.stage_groups(groups, entries)
    assert shared.item() == 0.5


def test_views_of_one_storage_count_as_aliases():
    """SPEC 3.5.4: aliasing is a property of memory, not of the Python object."""
    base = torch.tensor([0.5])
    groups = [_group(lr=base.view(())), _group(lr=base[0])]
    with pytest.raises(H.HyperparameterRejected, match="aliased"):
        H.stage_groups(groups, [dict(SAVED), dict(SAVED, lr=2e-3)])


@pytest.mark.parametrize(
    "entries, part",
    [
        ([dict(SAVED)], "differ in count"),
        ([dict(SAVED), "lr=1"], "must be a mapping"),
        ([dict(SAVED), {k: v for k, v in SAVED.items() if k != "eps"}], "missing hyperparameter 'eps'"),
    ],
)
def test_group_entries_must_match_the_groups(entries, part):
    """SPEC 3.3.6, 3.5.1: one mapping per group, holding every key."""
    with pytest.raises(H.HyperparameterRejected, match=part):
        H.stage_groups([_group(), _group()], entries)


# ---------------------------------------------------------------------------- property

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int64, torch.bool)


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    key=st.sampled_from(HYPER_KEYS),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(min_value=-1e-3, max_value=1.0),
        st.integers(min_value=-300, max_value=300),
    ),
)
def test_staging_either_refuses_untouched_or_commits_exactly_what_it_promised(dtype, key, value):
    """SPEC 3.5.1, 3.5.2, 3.5.5: a refused value leaves the destination untouched; an accepted one
    commits without raising, in place, to ``stored`` -- finite, zero only for a zero value, and in
    [0, 1) for a beta."""
    live = torch.ones((), dtype=dtype)
    group = {key: live}
    try:
        staged = H.stage_hyperparameter(live, value, key=key)
    except H.HyperparameterRejected:
        assert group[key] is live and live.item() == 1
        return
    H.apply(group, staged)
    assert group[key] is live
    assert float(live.item()) == staged.stored
    assert math.isfinite(staged.stored)
    assert (staged.stored == 0.0) == (staged.value == 0.0)
    if key in H.BETA_KEYS:
        assert 0.0 <= staged.stored < 1.0

"""Native state dicts: cross-loading with gefen-x and fail-atomic rejection (SPEC 1.11, 1.12)."""

from __future__ import annotations

import copy

import pytest
import torch

import gefen_reference as reference

from .support import assert_same_snapshot, deep_equal, silence_gefenx_warnings, snapshot

SHAPES = [(32, 24), (64,), (8, 3, 3)]


def params_from(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]


def feed(params, step, seed=3):
    g = torch.Generator().manual_seed(seed + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * (1 + torch.arange(p.shape[-1]) % 3)).to(p.dtype)


def trained_reference(steps=3, **kw):
    params = params_from()
    opt = reference.Gefen(
        [("w", params[0]), ("b", params[1]), ("c", params[2])], lr=1e-2, factored_v_2d=False, **kw
    )
    for s in range(steps):
        feed(params, s)
        opt.step()
    return params, opt


def test_state_dict_layout():
    params, opt = trained_reference()
    sd = opt.state_dict()
    assert set(sd) == {"state", "param_groups", "gefen_global_step", "gefen_deterministic", "gefen_codebook"}
    assert sd["gefen_global_step"] == 3 and sd["gefen_deterministic"] is False
    assert sd["gefen_codebook"].dtype == torch.float32 and sd["gefen_codebook"].shape == (256,)
    (group,) = sd["param_groups"]
    assert group["params"] == [0, 1, 2] and group["param_names"] == ["w", "b", "c"]
    assert group["param_names_synthesized"] == [False, False, False]
    meta = group["_gefen_checkpoint_metadata"]
    assert (
        meta["format_version"] == 1 and meta["global_step"] == 3 and meta["codebook"] is sd["gefen_codebook"]
    )
    entry = sd["state"][0]
    assert entry["name"] == "w" and type(entry["step"]) is int and type(entry["vmean_step"]) is int
    assert entry["m_codebook"].dtype == torch.uint8 and entry["m_codebook"].dim() == 2
    assert entry["m_magnitude"].dtype == entry["vmean"].dtype == torch.float32
    assert "stepsize" not in entry and "_h_buf" not in entry


def test_unstepped_params_carry_their_names():
    p, q = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))
    sd = reference.Gefen([p, ("Q", q)]).state_dict()
    assert sd["state"] == {0: {"name": "param_0"}, 1: {"name": "q"}}
    assert sd["gefen_codebook"] is None


@pytest.mark.gefenx
@pytest.mark.parametrize("direction", ["reference->gefenx", "gefenx->reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cross_load_and_bitwise_continuation(direction, dtype):
    gefen = pytest.importorskip("gefen")
    silence_gefenx_warnings()

    def make(kind, params):
        named = [("w", params[0]), ("b", params[1]), ("c", params[2])]
        if kind == "gefenx":
            return gefen.Gefen(named, lr=1e-2, fused=False, factored_v_2d=False)
        return reference.Gefen(named, lr=1e-2, factored_v_2d=False)

    src_kind, dst_kind = direction.split("->")
    src_params = params_from(dtype=dtype)
    src = make(src_kind, src_params)
    for s in range(3):
        feed(src_params, s)
        src.step()
    sd = copy.deepcopy(src.state_dict())
    dst_params = [torch.nn.Parameter(p.detach().clone()) for p in src_params]
    dst = make(dst_kind, dst_params)
    dst.load_state_dict(sd)
    for s in range(3, 6):
        feed(src_params, s)
        feed(dst_params, s)
        src.step()
        dst.step()
    for a, b in zip(src_params, dst_params):
        assert torch.equal(a, b)
        sa, sb = src.state[a], dst.state[b]
        for key in ("m_codebook", "m_magnitude", "vmean"):
            assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key
        assert sa["step"] == sb["step"] == 6


def test_roundtrip_keeps_saved_dtypes_on_bf16_params():
    params = params_from(dtype=torch.bfloat16)
    opt = reference.Gefen(params, factored_v_2d=False)
    feed(params, 0)
    opt.step()
    fresh = reference.Gefen([torch.nn.Parameter(p.detach().clone()) for p in params], factored_v_2d=False)
    fresh.load_state_dict(opt.state_dict())
    for p in fresh.param_groups[0]["params"]:
        st = fresh.state[p]
        assert st["m_codebook"].dtype == torch.uint8 and st["m_magnitude"].dtype == torch.float32
        assert st["vmean"].dtype == torch.float32


def test_checkpoint_hyperparameters_and_names_replace_live_ones():
    params, opt = trained_reference()
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["lr"] = 0.5
    sd["param_groups"][0]["param_names"] = ["x", "y", "z"]
    fresh = reference.Gefen(
        [torch.nn.Parameter(p.detach().clone()) for p in params], lr=1e-3, factored_v_2d=False
    )
    fresh.load_state_dict(sd)
    group = fresh.param_groups[0]
    assert group["lr"] == 0.5 and group["param_names"] == ["x", "y", "z"]
    assert group["param_names_synthesized"] == [
        False,
        False,
        False,
    ]  # changed names take the checkpoint's flags
    assert [fresh.state[p]["name"] for p in group["params"]] == ["x", "y", "z"]


def _everywhere(sd, top_key, meta_key, value):
    """Set ``sd[top_key]`` and the copy every group's checkpoint metadata carries of it."""
    sd[top_key] = value
    for g in sd["param_groups"]:
        g["_gefen_checkpoint_metadata"][meta_key] = value


def _corrupt(key):
    """Each corruption names the message fragment the rejection must carry."""

    def period_not_dividing(sd):
        sd["state"][0]["automatic_period"] = 7
        return "automatic_period"

    def wrong_index_dtype(sd):
        sd["state"][0]["m_codebook"] = sd["state"][0]["m_codebook"].to(torch.int16)
        return "m_codebook"

    def wrong_magnitude_dtype(sd):
        sd["state"][1]["m_magnitude"] = sd["state"][1]["m_magnitude"].double()
        return "m_magnitude"

    def short_codebook(sd):
        _everywhere(sd, "gefen_codebook", "codebook", sd["gefen_codebook"][:128].clone())
        return "256"

    def unsorted_codebook(sd):
        cb = sd["gefen_codebook"].clone()
        cb[10], cb[11] = cb[11].item(), cb[10].item()
        _everywhere(sd, "gefen_codebook", "codebook", cb)
        return "sorted"

    def float_counter(sd):
        sd["state"][2]["step"] = 1.0
        return "step"

    def negative_vmean(sd):
        sd["state"][0]["vmean"] = -sd["state"][0]["vmean"] - 1
        return "vmean"

    def momentum_without_codebook(sd):
        _everywhere(sd, "gefen_codebook", "codebook", None)
        return "codebook"

    def deterministic_mismatch(sd):
        _everywhere(sd, "gefen_deterministic", "deterministic", True)
        return "deterministic"

    def bad_beta(sd):
        sd["param_groups"][0]["beta2"] = 1.0
        return "beta"

    def missing_group(sd):
        sd["param_groups"] = []
        return "number of parameter groups"

    def unknown_state_id(sd):
        sd["state"][99] = {"name": "ghost"}
        return "99"

    def wrong_param_names_length(sd):
        sd["param_groups"][0]["param_names"] = ["w"]
        return "param_names"

    def unknown_state_key(sd):
        sd["state"][0]["exp_avg"] = torch.zeros(3)
        return "exp_avg"

    def rank_local_format(sd):
        for g in sd["param_groups"]:
            g["_gefen_checkpoint_metadata"]["format_version"] = 3
        return "format_version"

    def missing_hyperparameter(sd):
        del sd["param_groups"][0]["eps"]
        return "eps"

    return locals()[key]


CORRUPTIONS = [
    "period_not_dividing",
    "wrong_index_dtype",
    "wrong_magnitude_dtype",
    "short_codebook",
    "unsorted_codebook",
    "float_counter",
    "negative_vmean",
    "momentum_without_codebook",
    "deterministic_mismatch",
    "bad_beta",
    "missing_group",
    "unknown_state_id",
    "wrong_param_names_length",
    "unknown_state_key",
    "rank_local_format",
    "missing_hyperparameter",
]


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_malformed_checkpoint_is_rejected_without_mutation(corruption):
    params, opt = trained_reference()
    sd = copy.deepcopy(opt.state_dict())
    fragment = _corrupt(corruption)(sd)
    pristine = copy.deepcopy(sd)
    target_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    target = reference.Gefen(
        [("w", target_params[0]), ("b", target_params[1]), ("c", target_params[2])], factored_v_2d=False
    )
    for s in range(2):
        feed(target_params, s + 10)
        target.step()
    before = snapshot(target)
    with pytest.raises(ValueError, match=fragment):
        target.load_state_dict(sd)
    assert_same_snapshot(before, snapshot(target))
    # The caller's dict is untouched, too.
    assert deep_equal(sd, pristine)


@pytest.mark.gefenx
@pytest.mark.parametrize(
    "corruption",
    ["period_not_dividing", "wrong_index_dtype", "short_codebook", "unsorted_codebook", "float_counter"],
)
def test_gefenx_rejects_the_same_corruptions(corruption):
    """The rejections the reference makes are the published package's, not inventions of ours."""
    gefen = pytest.importorskip("gefen")
    silence_gefenx_warnings()
    params, opt = trained_reference()
    sd = copy.deepcopy(opt.state_dict())
    _corrupt(corruption)(sd)
    target = gefen.Gefen(
        [
            ("w", torch.nn.Parameter(params[0].detach().clone())),
            ("b", torch.nn.Parameter(params[1].detach().clone())),
            ("c", torch.nn.Parameter(params[2].detach().clone())),
        ],
        fused=False,
        factored_v_2d=False,
    )
    with pytest.raises(ValueError):
        target.load_state_dict(sd)

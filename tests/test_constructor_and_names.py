"""Constructor validation, parameter groups, names and provenance (SPEC 1.1, 1.2, 1.3)."""

from __future__ import annotations

import math

import pytest
import torch

import gefen_reference as reference


def P(n=4):
    return torch.nn.Parameter(torch.zeros(n))


@pytest.mark.parametrize(
    "kwargs,error,fragment",
    [
        ({"lr": -1.0}, ValueError, "learning rate"),
        ({"lr": math.nan}, ValueError, "learning rate"),
        ({"lr": torch.tensor([1e-3, 2e-3])}, ValueError, "1-element"),
        ({"betas": (1.0, 0.999)}, ValueError, "index 0"),
        ({"betas": (0.9, -0.1)}, ValueError, "index 1"),
        ({"betas": (0.9,)}, ValueError, "pair"),
        ({"eps": 0.0}, ValueError, "epsilon"),
        ({"eps": math.inf}, ValueError, "epsilon"),
        ({"weight_decay": -0.1}, ValueError, "weight_decay"),
        ({"deterministic": 1}, TypeError, "deterministic"),
        ({"capturable": True}, ValueError, "capturable"),
        ({"stochastic_round": True}, ValueError, "stochastic_round"),
        ({"codebook_refresh_every": 5}, ValueError, "codebook_refresh_every"),
        ({"codebook_refresh_every": -1}, ValueError, "codebook_refresh_every"),
        ({"period_one_substrings": "embed"}, TypeError, "bare str"),
    ],
)
def test_constructor_rejects(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        reference.Gefen([P()], **kwargs)


def test_accepted_edge_values():
    reference.Gefen([P()], lr=math.inf, weight_decay=math.inf, fused=True)
    opt = reference.Gefen([P()], lr=torch.tensor([[1e-3]]))
    assert opt.param_groups[0]["lr"].numel() == 1


@pytest.mark.parametrize(
    "params,error",
    [([], ValueError), ([1.0], TypeError), ([torch.zeros(2, dtype=torch.complex64)], ValueError)],
)
def test_bad_parameter_lists(params, error):
    with pytest.raises(error):
        reference.Gefen(params)


def test_duplicate_parameter_across_groups():
    p = P()
    with pytest.raises(ValueError, match="more than one parameter group"):
        reference.Gefen([{"params": [p]}, {"params": [p]}])


def test_add_param_group_is_all_or_nothing():
    opt = reference.Gefen([P()])
    q, bad = P(), torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(ValueError):
        opt.add_param_group({"params": [q, bad]})
    assert len(opt.param_groups) == 1 and q not in opt.state
    with pytest.raises(ValueError, match="'params'"):
        opt.add_param_group({"lr": 1.0})
    with pytest.raises(TypeError):
        opt.add_param_group([q])


def test_group_storage_and_names_worked_example():
    """The SPEC 1.3 worked example: caller, group and positional names with their flags."""
    a, b, c, d, e = (P() for _ in range(5))
    opt = reference.Gefen(
        [
            {"params": [a, b]},
            {"params": [("A", c)], "lr": 1e-4},
            {"params": [d], "name": "Emb"},
            {"params": [e], "name": "emb"},
        ]
    )
    names = [g["param_names"] for g in opt.param_groups]
    flags = [g["param_names_synthesized"] for g in opt.param_groups]
    assert names == [["group_0_param_0", "group_0_param_1"], ["a"], ["emb"], ["emb_1"]]
    assert flags == [[True, True], [False], [False], [True]]
    assert [g.get("name") for g in opt.param_groups] == [None, "a", "emb", "emb"]
    g0 = opt.param_groups[0]
    assert "betas" not in g0 and (g0["beta1"], g0["beta2"]) == (0.9, 0.999)
    assert opt.state[c]["name"] == "a"


def test_implicit_group_names_and_no_dedup_of_caller_names():
    p0, p1, p2, p3 = (P() for _ in range(4))
    opt = reference.Gefen([("Layer.Weight", p0), p1, ("w", p2), ("W", p3)])
    assert opt.param_groups[0]["param_names"] == ["layer.weight", "param_1", "w", "w"]
    assert opt.param_groups[0]["param_names_synthesized"] == [False, True, False, False]
    q = P()
    opt.add_param_group({"params": [q]})
    assert opt.param_groups[1]["param_names"] == ["group_1_param_0"]


def test_frozen_params_are_registered():
    frozen = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    opt = reference.Gefen([frozen])
    assert opt.param_groups[0]["params"] == [frozen]


def test_extra_group_keys_are_kept():
    opt = reference.Gefen([{"params": [P()], "tag": "decoder"}])
    assert opt.param_groups[0]["tag"] == "decoder"


@pytest.mark.gefenx
def test_names_match_gefenx():
    gefen = pytest.importorskip("gefen")
    import warnings

    warnings.simplefilter("ignore")
    layouts = [
        lambda ps: [ps[0], ("X", ps[1]), ps[2]],
        lambda ps: [
            {"params": ps[:2]},
            {"params": [ps[2]], "name": "Head"},
            {"params": [ps[3]], "name": "head"},
        ],
        lambda ps: [{"params": [("group_0_param_0", ps[0])]}, {"params": ps[1:3]}],
    ]
    for layout in layouts:
        ours = reference.Gefen(layout([P() for _ in range(4)]))
        theirs = gefen.Gefen(layout([P() for _ in range(4)]), fused=False)
        for g, h in zip(ours.param_groups, theirs.param_groups):
            assert g["param_names"] == h["param_names"]
            assert g["param_names_synthesized"] == h["param_names_synthesized"]
            assert g.get("name") == h.get("name")

"""The reference's extension hooks for kernel backends (SPEC 4.1.8): what each receives, when it is
called, and that a backend overriding them changes nothing but what it computes."""

from __future__ import annotations

import pytest
import torch

import gefen_reference as reference
from gefen_reference import periods
from gefen_reference.optimizer import ParameterUpdate
from gefen_reference.steps import StepHyper


def _params(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.nn.Parameter(torch.randn(16, 24, generator=g)),
        "b": torch.nn.Parameter(torch.randn(24, generator=g)),
        "frozen": torch.nn.Parameter(torch.randn(8, generator=g)),
        "v": torch.nn.Parameter(torch.randn(40, generator=g)),
    }


def _gradients(params, step: int):
    g = torch.Generator().manual_seed(100 + step)
    for name, p in params.items():
        p.grad = None if name == "frozen" else torch.randn(p.shape, generator=g)


def _groups(params):
    return [
        {"params": [("w", params["w"]), ("b", params["b"])], "weight_decay": 0.1},
        {"params": [("frozen", params["frozen"]), ("v", params["v"])], "lr": 2e-3},
    ]


def _run(cls, steps: int = 3, **kw):
    params = _params()
    opt = cls(_groups(params), **kw)
    for step in range(steps):
        _gradients(params, step)
        opt.step()
    return params, opt


class Recording(reference.Gefen):
    """Records every hook call and delegates to the reference's defaults."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def update_parameters(self, updates):
        self.calls.append(("update_parameters", [u.name for u in updates]))
        for u in updates:
            assert isinstance(u, ParameterUpdate) and isinstance(u.hyper, StepHyper)
            assert u.grad is u.param.grad and isinstance(u.hyper.lr, float)
            assert "automatic_period" in u.state and "m_codebook" in u.state  # prepared
            assert ("v_row" in u.state) if u.factored else ("vmean" in u.state)
        super().update_parameters(updates)

    def choose_period(self, name, global_shape, local_grad):
        self.calls.append(("choose_period", name))
        return super().choose_period(name, global_shape, local_grad)

    def learn_codebook(self, pieces, device):
        self.calls.append(("learn_codebook", len(pieces)))
        return super().learn_codebook(pieces, device)


@pytest.mark.parametrize("factored", [False, True], ids=["block", "factored"])
def test_hooks_are_called_once_per_step_in_order_with_prepared_state(factored):
    """SPEC 4.1.8: periods and the codebook at the first step, then one batch per step in group then
    parameter order (the frozen parameter has no gradient, so no update); the results are the
    reference's bit for bit."""
    params, opt = _run(Recording, factored_v_2d=factored)
    chosen = [c for c in opt.calls if c[0] == "choose_period"]
    assert sorted(name for _, name in chosen) == ["b", "v", "w"]
    assert opt.calls[len(chosen)] == ("learn_codebook", 3)
    batches = [c for c in opt.calls if c[0] == "update_parameters"]
    assert batches == [("update_parameters", ["w", "b", "v"])] * 3
    factored_names = {"w"} if factored else set()
    assert all(("v_row" in opt.state[params[n]]) == (n in factored_names) for n in ("w", "b", "v"))
    ref_params, ref = _run(reference.Gefen, factored_v_2d=factored)
    assert torch.equal(opt.codebook, ref.codebook)
    for name in params:
        assert torch.equal(params[name], ref_params[name]), name


def test_a_skipped_step_calls_no_hook():
    """A GradScaler step with ``found_inf`` set is skipped before any hook (SPEC 1.10.3)."""
    params = _params()
    opt = Recording(_groups(params))
    _gradients(params, 0)
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    assert opt.calls == [] and opt.global_step == 0


def test_a_batched_override_sees_every_update_and_gives_the_same_result():
    """An override may run the updates in any order (here: reversed), since parameters are independent."""

    class Reversed(reference.Gefen):
        def update_parameters(self, updates):
            for u in reversed(list(updates)):
                self.update_parameter(u.param, u.grad, u.state, u.hyper, u.factored)

    ours, _ = _run(Reversed)
    theirs, _ = _run(reference.Gefen)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_period_and_codebook_overrides_are_used():
    """``choose_period`` and ``learn_codebook`` decide what the step uses (a backend computes the
    reference's values faster; here they are observably different, to show they are the ones used)."""
    uniform = torch.linspace(-1.0, 1.0, 256, dtype=torch.float32)

    class Forced(reference.Gefen):
        def choose_period(self, name, global_shape, local_grad):
            return 1 if name == "v" else super().choose_period(name, global_shape, local_grad)

        def learn_codebook(self, pieces, device):
            assert [period for _, period in pieces][-1] == 1  # v's period, from choose_period
            return uniform.clone()

    params, opt = _run(Forced, steps=1)
    assert opt.state[params["v"]]["automatic_period"] == 1
    assert torch.equal(opt.codebook, uniform)
    ref_params, ref = _run(reference.Gefen, steps=1)
    assert ref.state[ref_params["v"]]["automatic_period"] != 1 and not torch.equal(ref.codebook, uniform)


def test_the_default_period_is_the_reference_rule():
    opt = reference.Gefen([torch.nn.Parameter(torch.zeros(64))])
    grad = torch.randn(64, generator=torch.Generator().manual_seed(3))
    expected = periods.choose_period(opt.period_rules, "x", (64,), periods.squared_gradient(grad))
    assert opt.choose_period("x", (64,), grad) == expected


def test_a_failure_while_preparing_still_updates_the_parameters_prepared_before_it():
    """SPEC 4.1.8 item 1: when preparing a parameter raises, the ones prepared before it are still
    updated (as one parameter at a time would have done), then the error propagates."""

    class FailsOnV(Recording):
        def choose_period(self, name, global_shape, local_grad):
            if name == "v" and self.codebook is not None:
                raise ValueError("no period for v")
            return super().choose_period(name, global_shape, local_grad)

    params = _params()
    opt = FailsOnV(_groups(params))
    _gradients(params, 0)
    opt.step()
    del opt.state[params["v"]]["step"]  # v is prepared again at the next step, and fails there
    opt.state[params["v"]].pop("automatic_period")
    before = {n: p.detach().clone() for n, p in params.items()}
    _gradients(params, 1)
    with pytest.raises(ValueError, match="no period for v"):
        opt.step()
    assert opt.calls[-1] == ("update_parameters", ["w", "b"])
    assert not torch.equal(params["w"], before["w"]) and not torch.equal(params["b"], before["b"])
    assert torch.equal(params["v"], before["v"]) and opt.global_step == 1

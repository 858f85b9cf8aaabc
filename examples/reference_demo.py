"""Train a tiny model with reference.Gefen and, when gefen-x is installed, check bitwise parity.

Run: python examples/reference_demo.py
"""

from __future__ import annotations

import warnings

import torch

import gefen_reference as reference


def train(opt_factory, steps=20, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = opt_factory(list(model.named_parameters()))
    data = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    target = data[:, :1] * 2.0 - data[:, 1:2]
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, opt, losses


def main() -> int:
    model, opt, losses = train(lambda named: reference.Gefen(named, lr=1e-2, factored_v_2d=False))
    print(f"reference.Gefen: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
    periods = {n: opt.state[p]["automatic_period"] for n, p in model.named_parameters()}
    print(f"block periods: {periods}")
    try:
        import gefen
    except ImportError:
        print("gefen-x not installed: parity check skipped")
        return 0
    warnings.simplefilter("ignore")
    other, other_opt, other_losses = train(
        lambda named: gefen.Gefen(named, lr=1e-2, fused=False, factored_v_2d=False)
    )
    same = all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    same_cb = torch.equal(opt.codebook, other_opt._gefen_codebook)
    print(
        f"bitwise equal to gefen-x {gefen.__version__ if hasattr(gefen, '__version__') else ''}: "
        f"parameters={same} codebook={same_cb}"
    )
    return 0 if (same and same_cb and losses == other_losses) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The Python side of a steady step, fast against AdamW fused, with the caches cold and warm.

    python benchmarks/python_side.py [--sizes 4.2M] [--dtypes bf16,fp32] [--steps 200]

Each optimizer's compute is replaced by a function that does nothing (``gefen_step_batch`` of fast's
kernel library returns 0, ``torch._fused_adamw_`` returns None), so what is timed is everything
``optimizer.step()`` does around it: torch.optim's step wrapper, for fast the reference's
orchestration (gradient preflight, state checks, hyperparameters) and the preparation and commit of
the kernel's work items, for AdamW its grouping of the tensors and state. Timing only: no parameter
changes once the compute is stubbed out.

Steps are taken in rounds, one of each optimizer per round, the order alternating; ``cold``: 64 MiB
written just before each timed step (as ``step_time.py --cache dirty``, so the interpreter's and
torch's code and the optimizer's objects start out of the caches, as after a backward pass);
``warm``: nothing written, only the other optimizer's stubbed step in between. The first five
steps of each are left out. Models of ``step_time.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import step_time  # noqa: E402


class _StubbedKernels:
    """fast's kernel library with the step call doing nothing (the other functions unchanged)."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    @staticmethod
    def gefen_step_batch(*args):
        return 0


def measure(size: str, dtype_name: str, steps: int) -> None:
    import gefen_fast
    from gefen_fast import native

    dtype = step_time.DTYPES[dtype_name]
    subjects = {
        "fast/block": step_time.Subject(
            lambda p: gefen_fast.Gefen(list(p.items()), factored_v_2d=False), size, dtype
        ),
        "AdamW fused=True": step_time.Subject(
            lambda p: torch.optim.AdamW(list(p.values()), fused=True), size, dtype
        ),
    }
    for subject in subjects.values():  # state created and the codebook learned with the real compute
        for k in range(3):
            subject.step(k)
    installed, fused = native.library, torch._fused_adamw_
    lib = installed()
    native.library = lambda: _StubbedKernels(lib)
    torch._fused_adamw_ = lambda *args, **kwargs: None
    names = list(subjects)
    times = {(name, cache): [] for name in names for cache in ("cold", "warm")}
    try:
        for cache in ("cold", "warm"):
            step_time.EVICT = torch.empty(16 << 20) if cache == "cold" else None
            for k in range(steps):
                for name in names[k % 2 :] + names[: k % 2]:
                    times[name, cache].append(subjects[name].step(k))
    finally:
        native.library, torch._fused_adamw_ = installed, fused
        step_time.EVICT = None
    medians = {key: statistics.median(values[5:]) for key, values in times.items()}
    print(
        f"\n{size} {dtype_name}: Python side of a steady step, compute stubbed out ({steps} steps "
        f"each; {step_time.load()})"
    )
    print(f"  {'optimizer':20s} {'cache':6s} {'median':>9s} {'min':>9s}")
    for (name, cache), values in times.items():
        print(f"  {name:20s} {cache:6s} {medians[name, cache] * 1e6:7.0f}us {min(values[5:]) * 1e6:7.0f}us")
    for cache in ("cold", "warm"):
        ratio = medians["fast/block", cache] / medians["AdamW fused=True", cache]
        print(f"  fast / AdamW fused, {cache}: {ratio:.2f}x (medians)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4.2M")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    print(step_time.machine())
    print("at start:", step_time.load())
    for size in args.sizes.split(","):
        for dtype_name in args.dtypes.split(","):
            measure(size, dtype_name, args.steps)
    print("at end:", step_time.load())
    return 0


if __name__ == "__main__":
    sys.exit(main())

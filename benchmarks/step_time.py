"""Step time of Gefen implementations against AdamW, with a memory roofline measured in the same run.

    python benchmarks/step_time.py [--sizes 4.2M,16.8M] [--steps 20] [--slow-steps 5] [--only NAME,...]

Models: 4.2M parameters (4 x 1024x1024 + 4 x 4096) and 16.8M (4 x 2048x2048 + 4 x 8192), fp32,
named parameters, two fixed gradient sets used alternately (so no step pays for generating
gradients). Gradients have a per-column scale (1 + column % 5), like the conformance workloads,
so the period search finds structure; the chosen periods are printed.

Optimizers: ``reference.Gefen``, gefen-x 0.5.0 ``fused=False`` (skipped if not installed), the
``fast`` backend (``gefen_fast``, skipped if not installed), each in block mode
(``factored_v_2d=False``) and factored mode (``True``); ``torch.optim.AdamW`` with
``foreach=True`` and with ``fused=True``.

For each: the first step of a fresh optimizer (period search, codebook learning and anything
else done once; kernels of ``fast`` already built and cached, the build is timed separately),
then the steady step: median and minimum over the timed steps after two warm-up steps; and the
optimizer state in bytes per parameter (every tensor in ``optimizer.state``, scalars included).
The timed steps run in rounds, one step of every optimizer per round (the reference and gefen-x
only in the first ``--slow-steps`` rounds), so that a change in the machine's load during the run
affects every optimizer alike.

Roofline: a ``copy_`` of 64 MiB measured in the same run gives the copy bandwidth (bytes read
plus bytes written per second); a Gefen step must move at least 14 bytes per fp32 parameter
(parameter read and written, gradient read, one-byte index read and written), AdamW 28 (also
both fp32 moments read and written). Only ratios from one run count: the machine is shared.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gefen_reference as reference  # noqa: E402

SIZES = {
    "4.2M": ((1024, 1024), 4, (4096,), 4),
    "16.8M": ((2048, 2048), 4, (8192,), 4),
}
GEFEN_BYTES_PER_PARAM = 14
ADAMW_BYTES_PER_PARAM = 28


def machine() -> str:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{model}, {os.cpu_count()} logical CPUs, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), python {platform.python_version()}")


def load() -> str:
    try:
        return "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "load average unknown"


def model(size: str):
    matrix, matrices, vector, vectors = SIZES[size]
    g = torch.Generator().manual_seed(0)
    params = {}
    for i in range(matrices):
        params[f"layer{i}.weight"] = torch.nn.Parameter(torch.randn(matrix, generator=g) * 0.02)
    for i in range(vectors):
        params[f"layer{i}.bias"] = torch.nn.Parameter(torch.zeros(vector))
    return params


def gradient_sets(params, count=2):
    sets = []
    for k in range(count):
        g = torch.Generator().manual_seed(100 + k)
        grads = {}
        for name, p in params.items():
            x = torch.randn(p.shape, generator=g) * 1e-3
            grads[name] = x * (1.0 + torch.arange(p.shape[-1], dtype=torch.float32) % 5)
        sets.append(grads)
    return sets


def state_bytes(optimizer) -> int:
    total = 0
    for entry in optimizer.state.values():
        for value in entry.values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total


def copy_bandwidth() -> float:
    """Bytes moved (read + written) per second by ``copy_`` of 64 MiB, best of 20."""
    src = torch.randn(16 << 20)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * src.element_size() / best


def optimizers(only):
    makers = {}
    makers["reference/block"] = lambda p: reference.Gefen(list(p.items()), factored_v_2d=False)
    makers["reference/factored"] = lambda p: reference.Gefen(list(p.items()), factored_v_2d=True)
    try:
        import gefen

        def gefenx(p, factored):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return gefen.Gefen(list(p.items()), fused=False, factored_v_2d=factored)

        makers["gefen-x fused=False/block"] = lambda p: gefenx(p, False)
        makers["gefen-x fused=False/factored"] = lambda p: gefenx(p, True)
    except ImportError:
        print("gefen-x not installed: skipped")
    try:
        import gefen_fast

        makers["fast/block"] = lambda p: gefen_fast.Gefen(list(p.items()), factored_v_2d=False)
        makers["fast/factored"] = lambda p: gefen_fast.Gefen(list(p.items()), factored_v_2d=True)
    except ImportError:
        print("gefen_fast not installed (pip install -e examples/gefen-fast): skipped")
    makers["AdamW foreach=True"] = lambda p: torch.optim.AdamW(list(p.values()), foreach=True)
    makers["AdamW fused=True"] = lambda p: torch.optim.AdamW(list(p.values()), fused=True)
    if only:
        makers = {k: v for k, v in makers.items() if any(o in k for o in only)}
    return makers


class Subject:
    """One optimizer on its own copy of the model, with the two gradient sets."""

    def __init__(self, make, size):
        self.params = model(size)
        self.sets = gradient_sets(self.params)
        self.optimizer = make(self.params)
        self.first = None
        self.times = []

    def step(self, k: int) -> float:
        for name, p in self.params.items():
            p.grad = self.sets[k % len(self.sets)][name]
        t = time.perf_counter()
        self.optimizer.step()
        return time.perf_counter() - t

    def summary(self):
        numel = sum(p.numel() for p in self.params.values())
        periods = sorted({int(e["automatic_period"]) for e in self.optimizer.state.values() if "automatic_period" in e})
        return (self.first, statistics.median(self.times), min(self.times),
                state_bytes(self.optimizer) / numel, numel, periods)


def first_steps(makers, size, repeats):
    """The best of ``repeats`` first steps of fresh optimizers, taken in rounds like the steady steps."""
    best = {}
    for _ in range(repeats):
        for name, make in makers.items():
            subject = Subject(make, size)
            best[name] = min(best.get(name, float("inf")), subject.step(0))
            del subject
            gc.collect()
    return best


def measure_all(makers, size, steps, slow_steps, is_slow, first_repeats=1):
    """First steps, two warm-up steps each, then the timed steps in rounds: one step of every
    optimizer per round, so a change of machine load hits them all alike."""
    subjects = {}
    earlier = first_steps(makers, size, first_repeats - 1) if first_repeats > 1 else {}
    gc.collect()
    gc.disable()
    try:
        for name, make in makers.items():
            subject = Subject(make, size)
            subject.first = min(subject.step(0), earlier.get(name, float("inf")))
            for k in (1, 2):
                subject.step(k)
            subjects[name] = subject
        for k in range(steps):
            for name, subject in subjects.items():
                if is_slow(name) and k >= slow_steps:
                    continue
                subject.times.append(subject.step(k))
    finally:
        gc.enable()
    return {name: subject.summary() for name, subject in subjects.items()}


def build_time() -> str:
    try:
        from gefen_fast import native
    except ImportError:
        return "n/a"
    saved = os.environ.get("GEFEN_FAST_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GEFEN_FAST_CACHE"] = tmp
        t = time.perf_counter()
        native.library_path()
        elapsed = time.perf_counter() - t
    if saved is None:
        os.environ.pop("GEFEN_FAST_CACHE")
    else:
        os.environ["GEFEN_FAST_CACHE"] = saved
    native.library()  # the ordinary cache: built here if absent, so no first step below pays for it
    return f"{elapsed:.2f} s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4.2M,16.8M")
    parser.add_argument("--steps", type=int, default=20, help="timed steps for fast and AdamW")
    parser.add_argument("--slow-steps", type=int, default=5, help="timed steps for the reference and gefen-x")
    parser.add_argument("--only", default="", help="comma-separated substrings of optimizer names")
    parser.add_argument("--first-repeats", type=int, default=1,
                        help="first step: best of this many fresh optimizers, in rounds")
    args = parser.parse_args(argv)
    print(machine())
    print("at start:", load())
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + write, torch copy_ of 64 MiB, best of 20)")
    print(f"gefen-fast kernel build (cold cache, compiler included): {build_time()}")
    makers = optimizers([o for o in args.only.split(",") if o])
    for size in args.sizes.split(","):
        print(f"\n{size} parameters")
        header = (f"{'optimizer':30s} {'first step':>11s} {'steady median':>14s} {'steady min':>11s} "
                  f"{'roofline':>9s} {'x roofline':>11s} {'state B/param':>14s}  periods")
        print(header)
        print("-" * len(header))
        results = {}
        measured = measure_all(makers, size, args.steps, args.slow_steps,
                               lambda n: n.startswith(("reference", "gefen-x")), args.first_repeats)
        for name, (first, median, best, per_param, numel, periods) in measured.items():
            moved = (ADAMW_BYTES_PER_PARAM if name.startswith("AdamW") else GEFEN_BYTES_PER_PARAM) * numel
            roof = moved / bandwidth
            results[name] = median
            print(f"{name:30s} {first * 1e3:9.1f}ms {median * 1e3:12.2f}ms {best * 1e3:9.2f}ms "
                  f"{roof * 1e3:7.2f}ms {median / roof:10.1f}x {per_param:14.3f}  {periods or ''}", flush=True)
        adamw = results.get("AdamW foreach=True")
        for mode in ("block", "factored"):
            fast = results.get(f"fast/{mode}")
            gefenx = results.get(f"gefen-x fused=False/{mode}")
            ref = results.get(f"reference/{mode}")
            if fast is None:
                continue
            parts = []
            if adamw:
                parts.append(f"fast/AdamW-foreach {fast / adamw:.2f}")
            if gefenx:
                parts.append(f"gefen-x/fast {gefenx / fast:.1f}x")
            if ref:
                parts.append(f"reference/fast {ref / fast:.1f}x")
            print(f"  {mode}: " + ", ".join(parts))
        print("after", size + ":", load())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

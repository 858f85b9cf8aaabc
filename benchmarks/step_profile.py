"""Where the time of fast's step goes: a per-stage profile with a roofline per kernel stage.

    python benchmarks/step_profile.py [--sizes 4.2M,16.8M] [--dtypes fp32,bf16] [--steps 20]
                                      [--cache dirty|as-left]

Builds the kernel library once more with ``-DGEFEN_PROFILE`` (stage clocks inside
``gefen_step_batch``; the installed library has none) into a temporary directory and runs the
benchmark models of ``step_time.py`` through it. Per steady step:

* ``python``: the step's Python side (the reference's orchestration, preparing each parameter's
  work item, committing the counters): the wall time of ``optimizer.step()`` minus the kernel call;
* ``kernel call``: the wall time of the one ``gefen_step_batch`` call, split per stage as the
  threads spent it (seconds summed over threads, divided by the thread count): ``moments`` (the
  factored row and column means: reads the gradient), ``pass A`` (reads the gradient and the old
  indices; decode, lerp, block maximum, block sum of squares, stepsize), ``pass B`` (normalise,
  cell lookup, store the index, update the parameter: reads and writes the parameter, writes the
  indices), ``large A``/``large B`` (the same for blocks above 65536 elements, split over the
  threads; large B reads the gradient and indices again), ``wait`` (barriers of the factored and
  large-block phases); the remainder up to the call's wall time is the end-of-region barrier and
  the scratch allocation.

Each stage's bytes are the memory it must touch; ``x roofline`` is its (median) time over bytes /
copy bandwidth (measured in the same run, as in step_time.py); ``min`` is the least of the steps,
the figure least disturbed by other processes on a shared machine. Then the first step, split into
its parts (best of 3).

``--cache`` as in step_time.py: ``dirty`` (the default) writes 64 MiB
before every timed steady step (the first-step profile is unchanged), so the step starts with caches full of
other data, the Python side's
code and objects included, as after a backward pass; ``as-left`` starts each
step from the cache the previous step left, so the Python side runs warm.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import step_time  # noqa: E402

STAGES = ["moments", "pass A", "pass B", "large A", "large B", "wait", "call"]


def profiling_library(directory: Path):
    from gefen_fast import _build, native

    target = directory / "gefen_kernels-profile.so"
    _build.compile_library(target, extra_flags=("-DGEFEN_PROFILE",))
    lib = ctypes.CDLL(str(target))
    native._declare(lib)
    return lib


def stage_bytes(stage: str, size: int, factored: bool, large_share: float, numel: int) -> float:
    """Bytes a stage must touch per step (parameter/gradient element size ``size``)."""
    small, large = numel * (1 - large_share), numel * large_share
    return {
        "moments": (numel * size) if factored else 0.0,
        "pass A": small * (size + 1),
        "pass B": small * (2 * size + 1),
        "large A": large * (size + 1),
        "large B": large * (size + 1 + 2 * size + 1),
    }.get(stage, 0.0)


def steady_profile(lib, size, dtype_name, factored, steps, bandwidth):
    import gefen_fast

    dtype = step_time.DTYPES[dtype_name]
    params = step_time.model(size, dtype)
    sets = step_time.gradient_sets(params)
    opt = gefen_fast.Gefen(list(params.items()), factored_v_2d=factored)
    for k in range(3):
        for n, p in params.items():
            p.grad = sets[k % 2][n]
        opt.step()
    numel = sum(p.numel() for p in params.values())
    large = sum(p.numel() for p in params.values() if opt.state[p]["automatic_period"] > 65536)
    clock = (ctypes.c_double * 8)()
    lib.gefen_profile_read(clock, 8)
    walls, stages = [], {s: [] for s in STAGES}
    threads = torch.get_num_threads()
    for k in range(steps):
        for n, p in params.items():
            p.grad = sets[k % 2][n]
        step_time.dirty_the_cache(k)
        t = time.perf_counter()
        opt.step()
        walls.append(time.perf_counter() - t)
        lib.gefen_profile_read(clock, 8)
        for i, s in enumerate(STAGES):
            stages[s].append(clock[i] if s == "call" else clock[i] / threads)
    wall = statistics.median(walls)
    call = statistics.median(stages["call"])
    mode = "factored" if factored else "block"
    print(
        f"\n{size} {dtype_name} fast/{mode}: step {wall * 1e3:.2f} ms (median of {steps}), "
        f"{threads} threads, {large / numel:.0%} of the elements in blocks > 65536"
    )
    print(
        f"  {'stage':12s} {'ms/step':>8s} {'min':>8s} {'share':>6s} {'ns/elem':>8s} {'MB/step':>8s} "
        f"{'GB/s':>6s} {'x roofline':>10s}"
    )
    element = torch.tensor([], dtype=dtype).element_size()
    python = [w - c for w, c in zip(walls, stages["call"])]
    rows = [("python", statistics.median(python), min(python), 0.0)]
    accounted = 0.0
    for s in STAGES[:-1]:
        t = statistics.median(stages[s])
        accounted += t
        rows.append((s, t, min(stages[s]), stage_bytes(s, element, factored, large / numel, numel)))
    rows.append(("other", max(call - accounted, 0.0), None, 0.0))
    for name, t, least, moved in rows:
        if t < 1e-6 and moved == 0:
            continue
        gbs = f"{moved / t / 1e9:6.1f}" if moved and t > 0 else f"{'':>6s}"
        roof = f"{t / (moved / bandwidth):9.2f}x" if moved else f"{'':>10s}"
        low = f"{least * 1e3:8.3f}" if least is not None else f"{'':>8s}"
        print(
            f"  {name:12s} {t * 1e3:8.3f} {low} {t / wall:6.1%} {t / numel * 1e9:8.3f} "
            f"{moved / 1e6:8.1f} {gbs} {roof}"
        )
    total_bytes = (3 * element + 2) * numel
    print(
        f"  whole step: {total_bytes / 1e6:.1f} MB minimum, {wall / (total_bytes / bandwidth):.2f}x "
        "the copy roofline"
    )


def first_step_profile(size, factored):
    """The first step's parts: period search, histogram, codebook DP, cell table, the update."""
    import gefen_fast
    from gefen_fast import codebook_learning, kernels, optimizer

    params = step_time.model(size)
    sets = step_time.gradient_sets(params)
    clocks = {}

    def timed(owner, attr, key):
        original = getattr(owner, attr)

        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                clocks[key] = clocks.get(key, 0.0) + time.perf_counter() - t

        setattr(owner, attr, wrapper)
        return owner, attr, original

    patches = [
        timed(optimizer.period_search, "choose_period", "period search"),
        timed(codebook_learning, "histogram_counts", "histogram"),
        timed(codebook_learning, "codebook_from_counts", "codebook DP"),
        timed(kernels.codeword_table, "build", "cell table"),
        timed(optimizer.kernels, "run", "update kernels"),
    ]
    try:
        best = None
        for _ in range(3):
            fresh = {n: torch.nn.Parameter(p.detach().clone()) for n, p in params.items()}
            opt = gefen_fast.Gefen(list(fresh.items()), factored_v_2d=factored)
            for n, p in fresh.items():
                p.grad = sets[0][n]
            clocks.clear()
            t = time.perf_counter()
            opt.step()
            total = time.perf_counter() - t
            if best is None or total < best[0]:
                best = (total, dict(clocks))
    finally:
        for owner, attr, original in patches:
            setattr(owner, attr, original)
    total, parts = best
    mode = "factored" if factored else "block"
    rest = total - sum(parts.values())
    cells = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in parts.items())
    print(
        f"  {size} fast/{mode}: first step {total * 1e3:.1f} ms (best of 3) = {cells}, other "
        f"{rest * 1e3:.1f} ms"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4.2M,16.8M")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--cache",
        choices=("dirty", "as-left"),
        default="dirty",
        help="before each timed step: write 64 MiB (dirty), or nothing (as-left)",
    )
    args = parser.parse_args(argv)
    step_time.EVICT = torch.empty(16 << 20) if args.cache == "dirty" else None
    from gefen_fast import native

    print(step_time.machine())
    print("at start:", step_time.load())
    print(
        "cache before each timed step:",
        "64 MiB just written" if step_time.EVICT is not None else "as the step before left it",
    )
    bandwidth = step_time.copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + write, torch copy_ of 64 MiB, best of 20)")
    with tempfile.TemporaryDirectory() as tmp:
        lib = profiling_library(Path(tmp))
        installed = native.library
        native.library = lambda: lib
        try:
            for size in args.sizes.split(","):
                for dtype_name in args.dtypes.split(","):
                    for factored in (False, True):
                        steady_profile(lib, size, dtype_name, factored, args.steps, bandwidth)
            print(f"\nFirst step (fp32; {step_time.load()})")
            for size in args.sizes.split(","):
                for factored in (False, True):
                    first_step_profile(size, factored)
        finally:
            native.library = installed
    print("at end:", step_time.load())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time the codebook solvers on realistic gradient histograms.

Run from the repository root:

    python benchmarks/codebook_solver.py [--plain-max-bins N] [--repeat R]

For each histogram (normal gradient blocks normalised by their absolute maximum and
binned as SPEC 1.6.4 says, tuned to about 512, 1024, 2048 and 4096 active bins) it
prints the time of ``solve_codebook`` (best of R), ``solve_codebook_plain`` (one run, only
up to --plain-max-bins active bins) and, when gefen-x imports, gefen-x's numba solver
(best of R, after a warm-up call whose time, JIT compile included, is reported apart),
and whether the codebooks are bit-identical to the fast solver's.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

# Compile gefen-x's numba kernel from scratch (unless NUMBA_CACHE_DIR is already set), so the
# warm-up time is a real JIT time rather than a load from a cache an earlier run left behind.
os.environ.setdefault("NUMBA_CACHE_DIR", tempfile.mkdtemp(prefix="numba-bench-"))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from gefen_reference.codebook import bin_centers, histogram_counts  # noqa: E402
from gefen_reference.codebook_solver import solve_codebook, solve_codebook_plain  # noqa: E402

# (elements, period, spike): one element per block is set to `spike`, which squeezes the
# rest of the block into about [-4/spike, 4/spike]; spike 0 leaves the blocks as drawn.
HISTOGRAMS = [(1 << 20, 64, 35.0), (1 << 20, 64, 16.5), (1 << 20, 64, 8.0), (1 << 21, 8, 0.0)]


def gradient_histogram(numel: int, period: int, spike: float, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel // period, period, generator=g)
    if spike > 0:
        x[:, 0] = spike
    counts = histogram_counts([(x.reshape(-1), period)]).to(torch.float32).numpy()
    on = counts > 0
    return bin_centers().numpy()[on].astype(np.float64), counts[on].astype(np.float64)


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def best_of(repeat: int, fn, *args):
    times, out = [], None
    for _ in range(repeat):
        t, out = timed(fn, *args)
        times.append(t)
    return min(times), out


def same_bits(a, b) -> str:
    if a is None or b is None:
        return "-"
    return "yes" if np.array_equal(a.view(np.uint32), b.view(np.uint32)) else "NO"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain-max-bins", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    try:
        import numba
        from gefen import quantization
    except ImportError:
        quantization = None

    def gefenx(c, w):
        stats = {
            "active_centers": torch.from_numpy(c.astype(np.float32)),
            "active_counts": torch.from_numpy(w.astype(np.float32)),
        }
        return quantization.exact_dp(stats, 256).numpy()

    print(
        f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}"
        + (f", numba {numba.__version__}" if quantization else "")
        + f", cpus {os.cpu_count()}"
    )
    cases = [gradient_histogram(*h) for h in HISTOGRAMS]

    if quantization is not None:
        jit, _ = timed(gefenx, *cases[0])
        print(f"gefen-x warm-up call ({cases[0][0].size} bins, JIT compile included): {jit:.2f} s")

    print()
    print(
        "| active bins | solve_codebook (s) | solve_codebook_plain (s) | gefen-x numba (s) "
        "| plain == fast | gefen-x == fast |"
    )
    print("|---:|---:|---:|---:|:---:|:---:|")
    for c, w in cases:
        t_fast, fast = best_of(args.repeat, solve_codebook, c, w)
        t_plain = plain = t_gx = gx = None
        if c.size <= args.plain_max_bins:
            t_plain, plain = timed(solve_codebook_plain, c, w)
        if quantization is not None:
            t_gx, gx = best_of(args.repeat, gefenx, c, w)
        fmt = lambda t: "-" if t is None else f"{t:.3f}"  # noqa: E731
        print(
            f"| {c.size} | {fmt(t_fast)} | {fmt(t_plain)} | {fmt(t_gx)} "
            f"| {same_bits(plain, fast)} | {same_bits(gx, fast)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Old against new codebook DP of the ``fast`` backend, in one process.

    python benchmarks/codebook_ab.py [--against REV] [--sizes 4.2M,16.8M] [--rounds 20]

Builds the kernel library from the sources of git revision REV (default ``main``) and from the
working tree (``kernel_ab.build``), takes the histogram of each ``step_time.py`` model's first
gradient set (the periods ``gefen_fast`` chooses for it), and calls each library's
``gefen_codebook_dp`` on it in interleaved rounds, the order rotating every round: the old library
(kernel ABI 3 and before: one thread, no thread argument; from ABI 4 with 1 and 2 threads) and the
new one with 1 and 2 threads. Reported: wall minimum and median per call, and new / old of the
medians (against the old library with as many threads where it takes a thread count). Every call's codebook
must equal the reference's (``gefen_reference.codebook.codebook_from_counts``), or the script stops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernel_ab  # noqa: E402
import step_time  # noqa: E402


def dp_input(size: str):
    """(centers, weights, m, counts) of the active bins of one model's first-step histogram."""
    import gefen_fast
    import gefen_reference.codebook as rc
    from gefen_fast import codebook_learning

    params = step_time.model(size)
    grads = step_time.gradient_sets(params)[0]
    chooser = gefen_fast.Gefen(list(params.items()))
    pieces = []
    for name, p in params.items():
        flat = grads[name].reshape(-1)
        pieces.append((flat, chooser.choose_period(name, tuple(p.shape), flat)))
    counts = codebook_learning.histogram_counts(pieces)
    weights = counts.to(torch.float32)
    active = weights > 0
    centers = np.ascontiguousarray(rc.bin_centers()[active].numpy().astype(np.float64))
    w = np.ascontiguousarray(weights[active].numpy().astype(np.float64))
    return centers, w, int(active.sum()), counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="main")
    parser.add_argument("--sizes", default="4.2M,16.8M")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    import gefen_reference.codebook as rc

    print(step_time.machine())
    print(
        f"old: {args.against}; new: the working tree; {args.rounds} interleaved rounds; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "old").mkdir()
        old = kernel_ab.build(kernel_ab.export(args.against, tmp / "old"), tmp / "old.so")
        new = kernel_ab.build(kernel_ab.ROOT / kernel_ab.CSRC, tmp / "new.so")
        # kernel ABI 3 and before: no thread argument
        old_threads = () if old.gefen_abi_version() < 4 else (1,)
        if not old_threads:
            old.gefen_codebook_dp.argtypes = old.gefen_codebook_dp.argtypes[:5]
        for size in args.sizes.split(","):
            centers, w, m, counts = dp_input(size)
            expected = rc.codebook_from_counts(counts).numpy()
            calls = {
                "old": lambda out: old.gefen_codebook_dp(
                    centers.ctypes.data, w.ctypes.data, m, 256, out.ctypes.data, *old_threads
                ),
                "new, 1 thread": lambda out: new.gefen_codebook_dp(
                    centers.ctypes.data, w.ctypes.data, m, 256, out.ctypes.data, 1
                ),
                "old, 2 threads": lambda out: old.gefen_codebook_dp(
                    centers.ctypes.data, w.ctypes.data, m, 256, out.ctypes.data, 2
                ),
                "new, 2 threads": lambda out: new.gefen_codebook_dp(
                    centers.ctypes.data, w.ctypes.data, m, 256, out.ctypes.data, 2
                ),
            }
            if not old_threads:
                del calls["old, 2 threads"]
            names = list(calls)
            times = {name: [] for name in names}
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    out = np.empty(256, dtype=np.float32)
                    t = time.perf_counter()
                    status = calls[name](out)
                    times[name].append(time.perf_counter() - t)
                    if status != 0 or not np.array_equal(out, expected):
                        sys.exit(f"{name}: status {status}, or a codebook other than the reference's")
            print(f"\n{size} ({m} active bins)")
            for name in names:
                med = statistics.median(times[name])
                paired = (
                    "old, 2 threads" if name.endswith("2 threads") and "old, 2 threads" in times else "old"
                )
                base = statistics.median(times[paired])
                print(
                    f"  {name:15s} min {min(times[name]) * 1e3:6.2f} ms  median {med * 1e3:6.2f} ms  "
                    f"new/old {med / base:5.2f}x"
                )
    print(f"\nat end: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

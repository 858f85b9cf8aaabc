"""Measure the overhead of ``gefen_conformance.harness.pool.run_on_ranks`` with a trivial scenario.

Run from the repository root:

    python benchmarks/rank_harness.py [--warm-calls N]

The scenario returns ``os.getpid()`` and does nothing else, so every figure is harness overhead:

* ``cold start``: the very first call of the process, which also starts multiprocessing's fork
  server (a Python interpreter that imports torch once);
* for each world size 1, 2 and 4, starting from an empty pool (``shutdown_pool()``):
  ``first call`` (forks and sets up the workers, then runs), ``warm call`` (median, 90th
  percentile and max of N calls on the warm pool: new store, init_process_group, destroy) and
  ``after failure`` (a call right after one rank raised, which replaces the failed workers).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gefen_conformance.harness.pool import run_on_ranks, shutdown_pool  # noqa: E402


def trivial():
    return os.getpid()


def rank_one_raises():
    if dist.get_rank() == 1 or dist.get_world_size() == 1:
        raise RuntimeError("planned failure")
    return os.getpid()


def _timed(fn, world_size, **kwargs) -> float:
    start = time.perf_counter()
    run_on_ranks(fn, world_size, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-calls", type=int, default=30)
    options = parser.parse_args()

    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    print(f"cold start (fork server + 1 worker, world_size 1): {_timed(trivial, 1):.3f} s")
    print()
    print(
        f"{'world':>5}  {'first call':>10}  {'warm median':>11}  {'warm p90':>8}  "
        f"{'warm max':>8}  {'after failure':>13}"
    )
    for world_size in (1, 2, 4):
        shutdown_pool()
        first = _timed(trivial, world_size)
        warm = sorted(_timed(trivial, world_size) for _ in range(options.warm_calls))
        p90 = warm[min(len(warm) - 1, int(round(0.9 * (len(warm) - 1))))]
        run_on_ranks(rank_one_raises, world_size, allow_failure=True)
        after_failure = _timed(trivial, world_size)
        print(
            f"{world_size:>5}  {first:>9.3f}s  {statistics.median(warm) * 1e3:>9.1f}ms  "
            f"{p90 * 1e3:>6.1f}ms  {warm[-1] * 1e3:>6.1f}ms  {after_failure:>12.3f}s"
        )
    shutdown_pool()


if __name__ == "__main__":
    main()

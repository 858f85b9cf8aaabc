"""Peak extra memory of a Gefen DCP save on the CPU, in bytes per parameter (SPEC 2.5, 5.4.2).

World size 1 (a gloo group of one in this process). A model of SLOTS parameters of SIZE elements
is trained one step with the reference, then saved with ``gefen_reference.dcp.GefenDCPState`` with
DCP's default planner and with ``GefenSavePlanner``, at ``thread_count`` 1 and 4, with the default
writer (one file per rank) and with ``single_file_per_rank=False``. The peak is measured by
the kernel's resident-set high-water mark (reset before each save; every thread counts) and by
``gefen_oracles.memory.StorageTracker`` (storages created by the calling thread during the save, on top
of the resident state), both printed per parameter.

    python benchmarks/save_memory.py            # 32 slots of 2M params, then 1 slot of 64M
    python benchmarks/save_memory.py --small    # 8 slots of 64K, for a quick look
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

import gefen_reference as reference
from gefen_conformance.harness.sharding import WorldOfOne, shard, sharded_parameter
from gefen_oracles.memory import StorageTracker
from gefen_reference.dcp import GefenDCPState, GefenSavePlanner


def build(slots: int, size: int, mesh):
    rows = size // 1024
    params = [(f"layer{i}.weight", sharded_parameter(torch.randn(rows, 1024), mesh)) for i in range(slots)]
    opt = reference.Gefen([{"params": params}], factored_v_2d=False)
    for _, p in params:
        p.grad = shard(torch.randn(p.shape), mesh)
    opt.step()
    for _, p in params:
        p.grad = None
    return opt


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(opt, root: str, planned: bool, threads: int, one_file: bool) -> tuple[int, int, float]:
    """(tracker peak, resident-set peak over the start, seconds). The tracker sees only the
    calling thread's allocations (writer threads are invisible to a dispatch mode); the
    resident-set figure sees every thread, via the kernel's high-water mark reset before the save."""
    path = tempfile.mkdtemp(dir=root)
    writer = FileSystemWriter(path, thread_count=threads, single_file_per_rank=one_file)
    tracker = StorageTracker()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset VmHWM to the current resident set
    rss_before = _status_kib("VmRSS")
    start = time.perf_counter()
    with tracker:
        dcp.save(
            {"optimizer": GefenDCPState(opt)},
            storage_writer=writer,
            planner=GefenSavePlanner() if planned else None,
        )
    seconds = time.perf_counter() - start
    rss_peak = (_status_kib("VmHWM") - rss_before) * 1024
    shutil.rmtree(path)
    return tracker.peak_bytes, rss_peak, seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="gefen-save-memory-")
    one = WorldOfOne()  # a gloo group of one, bound as the current World
    mesh = one.mesh
    models = [(8, 1 << 16), (1, 1 << 19)] if args.small else [(32, 1 << 21), (1, 1 << 26)]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores; bytes per parameter of peak extra memory "
        "during dcp.save"
    )
    print(
        f"{'model':>16} {'planner':>8} {'threads':>7} {'writer':>16} {'RSS B/param':>11} {'RSS MiB':>8} "
        f"{'tracker B/param':>15} {'seconds':>7}"
    )
    for slots, size in models:
        opt = build(slots, size, mesh)
        total = slots * size
        for one_file in (True, False):
            for planned in (False, True):
                for threads in (1, 4):
                    peak, rss, seconds = measure(opt, tmp, planned, threads, one_file)
                    writer = "one file/rank" if one_file else "file per item"
                    label = f"{slots} x {size >> 20}M" if size >> 20 else f"{slots} x {size >> 10}K"
                    print(
                        f"{label:>16} "
                        f"{'Gefen' if planned else 'default':>8} {threads:>7} {writer:>16} "
                        f"{rss / total:11.2f} {rss / 2**20:8.1f} {peak / total:15.2f} {seconds:7.2f}"
                    )
        del opt
    one.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

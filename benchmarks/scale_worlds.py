"""DCP save and load as the world grows, on the thread launcher (SPEC 4.2.12), side by side in one run.

    python benchmarks/scale_worlds.py [--worlds 1 8 16 64 256] [--out benchmarks/scale_worlds.results.txt]

For each world size N: the reference trains the suite's scale model
(``gefen_conformance.workload.models.SCALE``: most ranks hold empty shards past 8 ranks) for the
DCP scenarios' steps on N thread ranks, saves model and optimizer with its adapter, and loads the
checkpoint into a fresh optimizer on the same N ranks: the wall time of the save and of the load
(the slowest rank's), the checkpoint's size, and the hosting process's resident memory after
start-up and at its peak, with the peak's growth per rank. Each world runs in a fresh process
(one thread-launcher call, hosted by one pool worker), so that its peak is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_ONE = r"""
import json, sys
sys.path.insert(0, {repo!r})
from benchmarks.scale_worlds import measure_world
print(json.dumps(measure_world(int(sys.argv[1]), sys.argv[2])))
"""


def _rss_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of this process, in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def save_and_load(path: str) -> dict:
    """Rank body: train the scale model, save it, load it into a fresh optimizer; rank-local times
    and, on rank 0, the host's memory before and after."""
    import time

    import torch.distributed as dist

    from gefen_conformance.harness.sharding import world_mesh
    from gefen_conformance.implementations import registry
    from gefen_conformance.workload import models, saving

    impl = registry.resolve("reference")
    layout = models.DCP_MODELS["scale"]
    rank = dist.get_rank()
    before = _rss_mib("VmRSS") if rank == 0 else None
    params, optimizer = saving.trained(impl, layout, world_mesh())
    dist.barrier()
    start = time.perf_counter()
    saving.save(impl, optimizer, path, params=params)
    dist.barrier()
    saved = time.perf_counter() - start
    target = models.parameters(layout, mesh=world_mesh(), salt="target")
    fresh = impl.make_optimizer(
        models.param_groups(layout, target, models.TARGET_HYPERS), factored_v_2d=False
    )
    dist.barrier()
    start = time.perf_counter()
    saving.load(impl, fresh, path, params=target)
    dist.barrier()
    loaded = time.perf_counter() - start
    return {
        "save_s": saved,
        "load_s": loaded,
        "rss_before_mib": before,
        "rss_peak_mib": _rss_mib("VmHWM") if rank == 0 else None,
    }


def measure_world(world: int, path: str) -> dict:
    from gefen_conformance.harness import launch, threads

    start = time.perf_counter()
    reports = launch.run_on(threads.ThreadLauncher(), save_and_load, world, (path,), timeout=600.0)
    wall = time.perf_counter() - start
    size = sum(f.stat().st_size for f in Path(path).iterdir())
    return {
        "world": world,
        "call_s": wall,
        "save_s": max(r["save_s"] for r in reports),
        "load_s": max(r["load_s"] for r in reports),
        "rss_before_mib": reports[0]["rss_before_mib"],
        "rss_peak_mib": reports[0]["rss_peak_mib"],
        "checkpoint_kib": size / 1024,
        "files": len(list(Path(path).iterdir())),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 8, 16, 64, 256])
    parser.add_argument("--out", type=Path, help="also append the table to this file")
    args = parser.parse_args(argv)
    import tempfile

    import torch

    rows = []
    for world in args.worlds:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [sys.executable, "-c", _ONE.format(repo=str(REPO)), str(world), str(Path(tmp) / "ck")],
                capture_output=True,
                text=True,
                cwd=REPO,
            )
        if proc.returncode != 0:
            rows.append(f"{world:>6} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        growth = (r["rss_peak_mib"] - r["rss_before_mib"]) / world
        rows.append(
            f"{world:>6} {r['call_s']:>7.1f} {r['save_s']:>7.2f} {r['load_s']:>7.2f} {r['files']:>6} "
            f"{r['checkpoint_kib']:>9.0f} {r['rss_before_mib']:>9.0f} {r['rss_peak_mib']:>9.0f}"
            f" {growth:>11.2f}"
        )
        print(rows[-1], flush=True)
    load = os.getloadavg()
    header = [
        f"# python benchmarks/scale_worlds.py --worlds {' '.join(map(str, args.worlds))}",
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, load average {load[0]:.1f} at the end",
        "# reference, scale model, one thread-launcher call per world (save N, load N);"
        " times are the slowest rank's",
        " world  call s  save s  load s  files  ckpt KiB  RSS0 MiB  peak MiB  MiB / rank",
    ]
    text = "\n".join(header + rows) + "\n"
    print(text)
    if args.out:
        with args.out.open("a") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

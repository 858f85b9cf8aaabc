"""Old against new step kernels of the ``fast`` backend, in one process.

    python benchmarks/kernel_ab.py [--against REV|worktree] [--define NAME=VALUE ...] [--old-define NAME=VALUE
    ...]
                                   [--sizes 4.2M,16.8M]
                                   [--dtypes fp32,bf16] [--modes block,factored] [--rounds 30] [--threads 1]
                                   [--evict]

Builds the kernel library twice, from the sources of git revision REV (default ``main``) and from
the working tree (with ``-DNAME=VALUE`` for each ``--define``, to try a compile-time setting), with
the flags of ``gefen_fast._build`` (``--against worktree``: both from the working tree, the old one
with ``-DNAME=VALUE`` for each ``--old-define``). For each model of ``step_time.py`` (same parameters and
gradients), runs three steps of ``gefen_fast.Gefen`` to capture one steady step's work items, then
calls each library's ``gefen_step_batch`` on those items in interleaved rounds, the order rotating
every round, so a change of machine load hits both alike. Reported per library: the call's CPU time
(the thread's with one thread, the process's otherwise) as minimum, lower quartile and median, the
wall median, and new / old. Each call steps the same state once more; both libraries must give
the same momentum (the tests of examples/gefen-fast check that), so only time differs.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import step_time  # noqa: E402

CSRC = "examples/gefen-fast/gefen_fast/csrc"


def build(source: Path, target: Path, defines=()):
    from gefen_fast import _build, native

    sources = [str(source / name) for name in _build.SOURCES]
    flags = [*_build.FLAGS, *(f"-D{d}" for d in defines), _build.OPENMP_FLAG]
    subprocess.run(_build.compiler() + flags + sources + ["-o", str(target), "-lm"], check=True)
    lib = ctypes.CDLL(str(target))
    native._declare(lib)
    return lib


def export(rev: str, directory: Path) -> Path:
    """The kernel sources of ``rev`` in ``directory``."""
    from gefen_fast import _build

    for name in _build.SOURCES + _build.HEADERS:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{CSRC}/{name}"], check=True, capture_output=True
        ).stdout
        (directory / name).write_bytes(text)
    return directory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="main", help="git revision of the old kernels (default main)")
    ap.add_argument("--define", action="append", default=[], help="NAME=VALUE for the new build (repeatable)")
    ap.add_argument(
        "--old-define",
        action="append",
        default=[],
        help="NAME=VALUE for the old build (repeatable); with --against worktree, two settings of the "
        "working tree",
    )
    ap.add_argument("--sizes", default="4.2M,16.8M")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--modes", default="block,factored")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--evict",
        action="store_true",
        help="write 64 MiB before every call, so each call starts from memory, not the cache (as in a "
        "training loop)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import gefen_fast
    from gefen_fast import kernels, native

    with tempfile.TemporaryDirectory(prefix="kernel-ab-") as tmp:
        tmp = Path(tmp)
        (tmp / "old").mkdir()
        old_src = ROOT / CSRC if args.against == "worktree" else export(args.against, tmp / "old")
        libs = {
            "old": build(old_src, tmp / "old.so", args.old_define),
            "new": build(ROOT / CSRC, tmp / "new.so", args.define),
        }
        captured = []
        run = kernels.run

        def capture(batch):
            items = (native.Work * len(batch)).from_buffer_copy(b"".join(p.work for p in batch))
            captured.append((items, len(batch), list(batch)))
            return run(batch)

        kernels.run = capture
        evict = torch.empty(16 << 20) if args.evict else None
        clock = time.thread_time if args.threads == 1 else time.process_time
        print(
            f"old: {args.against} {' '.join('-D' + d for d in args.old_define)}, new: working tree "
            f"{' '.join('-D' + d for d in args.define)}; "
            f"threads {args.threads}, rounds "
            f"{args.rounds}{', evicting 64 MiB before each call' if evict is not None else ''}; "
            f"{step_time.load()}",
            flush=True,
        )
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        try:
            for size in args.sizes.split(","):
                for dtype_name in args.dtypes.split(","):
                    params = step_time.model(size, dtypes[dtype_name])
                    sets = step_time.gradient_sets(params)
                    for mode in args.modes.split(","):
                        opt = gefen_fast.Gefen(list(params.items()), factored_v_2d=(mode == "factored"))
                        for k in range(3):
                            for name, p in params.items():
                                p.grad = sets[k % 2][name]
                            opt.step()
                        items, count, _alive = captured[-1]
                        names = list(libs)
                        cpu = {n: [] for n in names}
                        wall = {n: [] for n in names}
                        for k in range(args.rounds + 2):
                            for n in names[k % 2 :] + names[: k % 2]:
                                if evict is not None:
                                    evict.fill_(float(k))
                                t0, c0 = time.perf_counter(), clock()
                                status = libs[n].gefen_step_batch(items, count, args.threads)
                                c1, t1 = clock(), time.perf_counter()
                                if status != 0:
                                    raise RuntimeError(f"{n}: gefen_step_batch returned {status}")
                                if k >= 2:
                                    cpu[n].append((c1 - c0) * 1e3)
                                    wall[n].append((t1 - t0) * 1e3)
                        quartile = {n: sorted(cpu[n])[len(cpu[n]) // 4] for n in names}
                        line = f"{size:>5} {dtype_name} {mode:8}"
                        for n in names:
                            line += (
                                f" | {n} cpu min {min(cpu[n]):7.2f} q1 {quartile[n]:7.2f} med "
                                f"{statistics.median(cpu[n]):7.2f} wall med {statistics.median(wall[n]):7.2f}"
                            )
                        line += (
                            f" | new/old cpu min {min(cpu['new']) / min(cpu['old']):.3f} q1 "
                            f"{quartile['new'] / quartile['old']:.3f} med "
                            f"{statistics.median(cpu['new']) / statistics.median(cpu['old']):.3f}"
                        )
                        print(line, flush=True)
                        captured.clear()
        finally:
            kernels.run = run
    print(step_time.load())


if __name__ == "__main__":
    main()

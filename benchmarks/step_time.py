"""Step time of Gefen implementations against AdamW, with the copy roofline, in one run.

    python benchmarks/step_time.py [--sizes 4.2M,16.8M] [--dtypes fp32,bf16] [--steps 20] [--slow-steps 3]
                                   [--scaling 4.2M,16.8M,67M] [--threads 1,2] [--only NAME,...]
                                   [--cache dirty|as-left]

Models: 4.2M parameters (4 x 1024x1024 + 4 x 4096), 16.8M (4 x 2048x2048 + 4 x 8192) and, for the
first-step scaling, 67M (4 x 4096x4096 + 4 x 16384); named parameters, two fixed gradient sets used
alternately (no step pays for generating gradients), with a per-column scale (1 + column % 5) like
the conformance workloads so the period search finds structure. Parameters in fp32 and in bf16
(gradients in the parameter's dtype).

Optimizers, side by side: ``gefen_reference.Gefen``, gefen-x 0.5.0 ``fused=False`` (skipped if not
installed), the ``fast`` backend (``gefen_fast``), each in block mode (``factored_v_2d=False``) and
factored mode; ``torch.optim.AdamW`` with ``foreach=True`` and ``fused=True``.

Per model and dtype: the first step of a fresh optimizer (period search, codebook, state creation;
fast's kernels were built at install time), then the steady step: median and minimum of the timed
steps after two warm-up steps, taken in rounds (one step of every optimizer per round, the
reference and gefen-x only in the first ``--slow-steps`` rounds) so a change of machine load hits
all alike. What the cache holds when a timed step starts is the same for every optimizer
(``--cache dirty``, the default): 64 MiB are written just before each timed step (not timed), as
a training loop's backward pass leaves the cache full of its own dirty lines, and the order of the
optimizers rotates every round, so no optimizer's step always follows the same other one.
``--cache as-left``: a fixed order, each step starting with whatever the step before it left
(its dirty lines, written back during the next step, and at 4.2M part of its data). The results
file holds the two methods side by side. The roofline: bytes a step must move / copy bandwidth, the bandwidth
measured in the
same run (``copy_`` of 64 MiB, read + write); a Gefen step moves 3 bytes-per-parameter-dtype + 2
per parameter (parameter read and written, gradient read, uint8 index read and written: 14 for
fp32, 8 for bf16), AdamW 7 (parameter, gradient, both moments in the parameter's dtype: 28, 14).
Factored mode must read the gradient once more (its column means need every row first): its
algorithmic minimum is one parameter-dtype more, but it is held to the same figure here.
Peak extra memory of one steady step: every torch storage it creates (oracles.memory.StorageTracker)
plus, for fast, the C kernels' scratch (they report it), per parameter.

Then the first step's scaling with model size (fast, fp32, best of ``--first-repeats``, split into
period search, codebook learning and the rest), and the steady step with 1 and 2 threads (fast and
AdamW fused, rounds alternating the thread count). Only ratios from one run count: the machine is
shared; the load average is printed before and after each part.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gefen_reference as reference  # noqa: E402
from gefen_oracles.memory import StorageTracker  # noqa: E402
from gefen_reference.codebook import forget_solved  # noqa: E402

SIZES = {
    "4.2M": ((1024, 1024), 4, (4096,), 4),
    "16.8M": ((2048, 2048), 4, (8192,), 4),
    "67M": ((4096, 4096), 4, (16384,), 4),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TARGET_VS_FUSED = 0.8
TARGET_ROOFLINE = 2.5
TARGET_FIRST_S = 1.0
TARGET_FIRST_X = 10.0


def machine() -> str:
    model, cores = platform.processor(), os.cpu_count()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        model = fields.get("Model name", model).strip()
        cores = (
            f"{fields.get('CPU(s)', cores).strip()} CPUs "
            f"({fields.get('Core(s) per socket', '?').strip()} cores/socket, "
            f"{fields.get('Thread(s) per core', '?').strip()} thread/core), L3 "
            f"{fields.get('L3 cache', '?').strip()}"
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return (
        f"{model}, {cores}; torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"python {platform.python_version()}"
    )


def load() -> str:
    try:
        return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "load average unknown"


def model(size: str, dtype: torch.dtype = torch.float32):
    matrix, matrices, vector, vectors = SIZES[size]
    g = torch.Generator().manual_seed(0)
    params = {}
    for i in range(matrices):
        params[f"layer{i}.weight"] = torch.nn.Parameter((torch.randn(matrix, generator=g) * 0.02).to(dtype))
    for i in range(vectors):
        params[f"layer{i}.bias"] = torch.nn.Parameter(torch.zeros(vector, dtype=dtype))
    return params


def gradient_sets(params, count=2):
    sets = []
    for k in range(count):
        g = torch.Generator().manual_seed(100 + k)
        grads = {}
        for name, p in params.items():
            x = torch.randn(p.shape, generator=g) * 1e-3
            grads[name] = (x * (1.0 + torch.arange(p.shape[-1], dtype=torch.float32) % 5)).to(p.dtype)
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


def bytes_per_param(name: str, dtype: torch.dtype) -> int:
    size = torch.tensor([], dtype=dtype).element_size()
    return 7 * size if name.startswith("AdamW") else 3 * size + 2


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


def is_slow(name: str) -> bool:
    return name.startswith(("reference", "gefen-x"))


def fast_scratch_bytes() -> int:
    try:
        from gefen_fast import native

        return int(native.library().gefen_last_scratch_bytes())
    except Exception:
        return 0


#: Written before every timed step (``--cache dirty``), or None (``--cache as-left``).
EVICT = None


def dirty_the_cache(k: int) -> None:
    """Fill the cache with 64 MiB of freshly written lines, the same before every timed step."""
    if EVICT is not None:
        EVICT.fill_(float(k))


def rotated(items: list, k: int) -> list:
    """``items`` starting at position ``k`` (round ``k``'s order), unless the cache is as left."""
    if EVICT is None or not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


class Subject:
    """One optimizer on its own copy of the model, with the two gradient sets."""

    def __init__(self, make, size, dtype):
        self.params = model(size, dtype)
        self.sets = gradient_sets(self.params)
        self.optimizer = make(self.params)
        self.first = None
        self.times = []
        self.extra = None

    def step(self, k: int) -> float:
        for name, p in self.params.items():
            p.grad = self.sets[k % len(self.sets)][name]
        dirty_the_cache(k)
        t = time.perf_counter()
        self.optimizer.step()
        return time.perf_counter() - t

    def measure_extra(self, k: int, fast: bool) -> None:
        """Peak bytes allocated by one step on top of what is resident (torch storages + C scratch)."""
        for name, p in self.params.items():
            p.grad = self.sets[k % len(self.sets)][name]
        tracker = StorageTracker()
        tracker.mark_resident([t for t in self.params.values()] + [g for s in self.sets for g in s.values()])
        with tracker:
            self.optimizer.step()
        self.extra = tracker.peak_bytes + (fast_scratch_bytes() if fast else 0)

    def numel(self) -> int:
        return sum(p.numel() for p in self.params.values())


def measure_all(makers, size, dtype, steps, slow_steps):
    """First steps, two warm-up steps each, then the timed steps in rounds."""
    subjects = {}
    gc.collect()
    gc.disable()
    try:
        for name, make in makers.items():
            try:
                subject = Subject(make, size, dtype)
                forget_solved()  # every first step solves its codebook (the reference keeps the last few)
                subject.first = subject.step(0)
            except Exception as exc:  # an optimizer that does not support this dtype
                print(f"  {name}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
                continue
            for k in (1, 2):
                subject.step(k)
            subjects[name] = subject
        for k in range(steps):
            for name, subject in rotated(list(subjects.items()), k):
                if is_slow(name) and k >= slow_steps:
                    continue
                subject.times.append(subject.step(k))
        for name, subject in subjects.items():
            subject.measure_extra(steps + 1, name.startswith("fast"))
    finally:
        gc.enable()
    return subjects


def steady_tables(args, makers, bandwidth, summary):
    for size in args.sizes.split(","):
        for dtype_name in args.dtypes.split(","):
            dtype = DTYPES[dtype_name]
            print(f"\n{size} parameters, {dtype_name}   ({load()})")
            header = (
                f"{'optimizer':30s} {'first step':>10s} {'steady med':>11s} {'steady min':>10s} "
                f"{'roofline':>9s} {'x roofline':>10s} {'/AdamW fused':>12s} {'state B/p':>9s} "
                f"{'extra B/p':>9s}  periods"
            )
            print(header)
            print("-" * len(header))
            subjects = measure_all(makers, size, dtype, args.steps, args.slow_steps)
            fused = subjects.get("AdamW fused=True")
            fused_median = statistics.median(fused.times) if fused else None
            for name, s in subjects.items():
                numel = s.numel()
                median, best = statistics.median(s.times), min(s.times)
                roof = bytes_per_param(name, dtype) * numel / bandwidth
                vs = f"{median / fused_median:11.2f}x" if fused_median else f"{'':>12s}"
                periods = sorted(
                    {
                        int(e["automatic_period"])
                        for e in s.optimizer.state.values()
                        if isinstance(e, dict) and "automatic_period" in e
                    }
                )
                print(
                    f"{name:30s} {s.first * 1e3:8.1f}ms {median * 1e3:9.2f}ms {best * 1e3:8.2f}ms "
                    f"{roof * 1e3:7.2f}ms {median / roof:9.2f}x {vs} {state_bytes(s.optimizer) / numel:9.3f} "
                    f"{s.extra / numel:9.3f}  {periods or ''}",
                    flush=True,
                )
                summary.setdefault((size, dtype_name), {})[name] = (
                    s.first,
                    median,
                    roof,
                    s.extra / numel,
                    best,
                )
            foreach = subjects.get("AdamW foreach=True")
            for mode in ("block", "factored"):
                fast = subjects.get(f"fast/{mode}")
                if fast is None:
                    continue
                m = statistics.median(fast.times)
                parts = []
                if fused_median:
                    parts.append(f"/AdamW fused {m / fused_median:.2f}")
                if foreach:
                    parts.append(f"/AdamW foreach {m / statistics.median(foreach.times):.2f}")
                for other in (f"gefen-x fused=False/{mode}", f"reference/{mode}"):
                    if other in subjects:
                        parts.append(
                            f"{other.split('/')[0].split(' ')[0]}/fast "
                            f"{statistics.median(subjects[other].times) / m:.1f}x"
                        )
                parts.append(f"first/steady {fast.first / m:.1f}x")
                print(f"  fast/{mode}: " + ", ".join(parts))
            del subjects
            gc.collect()


def first_step_scaling(args, summary):
    """fast's first step at each size: total and its parts (period search, codebook, the rest)."""
    try:
        import gefen_fast
        from gefen_fast import codebook_learning, period_search
        from gefen_fast import optimizer as fast_optimizer
    except ImportError:
        return
    print(f"\nFirst step of fast with model size (fp32, best of {args.first_repeats}; {load()})")
    header = (
        f"{'size':>6s} {'mode':9s} {'first step':>10s} {'periods':>9s} {'codebook':>9s} {'rest':>8s} "
        f"{'steady med':>10s} {'first/steady':>12s} {'per 1M params':>13s}"
    )
    print(header)
    print("-" * len(header))
    clocks = {}

    def timed(fn, key):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                clocks[key] = clocks.get(key, 0.0) + time.perf_counter() - t

        return wrapper

    original = (period_search.choose_period, codebook_learning.learn_codebook)
    fast_optimizer.period_search.choose_period = timed(original[0], "periods")
    fast_optimizer.codebook_learning.learn_codebook = timed(original[1], "codebook")
    try:
        for size in args.scaling.split(","):
            params = model(size)
            sets = gradient_sets(params)
            numel = sum(p.numel() for p in params.values())
            for factored in (False, True):
                best = None
                for _ in range(args.first_repeats):
                    fresh = {n: torch.nn.Parameter(p.detach().clone()) for n, p in params.items()}
                    opt = gefen_fast.Gefen(list(fresh.items()), factored_v_2d=factored)
                    for n, p in fresh.items():
                        p.grad = sets[0][n]
                    clocks.clear()
                    forget_solved()
                    dirty_the_cache(0)
                    t = time.perf_counter()
                    opt.step()
                    total = time.perf_counter() - t
                    if best is None or total < best[0]:
                        best = (total, clocks.get("periods", 0.0), clocks.get("codebook", 0.0))
                steady = []
                for k in range(1, 8):
                    for n, p in fresh.items():
                        p.grad = sets[k % 2][n]
                    dirty_the_cache(k)
                    t = time.perf_counter()
                    opt.step()
                    steady.append(time.perf_counter() - t)
                med = statistics.median(steady[2:])
                total, periods, codebook = best
                mode = "factored" if factored else "block"
                print(
                    f"{size:>6s} {mode:9s} {total * 1e3:8.1f}ms {periods * 1e3:7.1f}ms "
                    f"{codebook * 1e3:7.1f}ms "
                    f"{(total - periods - codebook) * 1e3:6.1f}ms {med * 1e3:8.2f}ms {total / med:11.1f}x "
                    f"{total / numel * 1e9:10.1f} ms",
                    flush=True,
                )
                summary.setdefault(("scaling", size), {})[mode] = (total, med)
                del opt, fresh
                gc.collect()
            del params, sets
            gc.collect()
    finally:
        fast_optimizer.period_search.choose_period, fast_optimizer.codebook_learning.learn_codebook = original


def thread_scaling(args, makers, summary):
    names = [n for n in makers if n.startswith("fast") or n == "AdamW fused=True"]
    counts = [int(c) for c in args.threads.split(",")]
    previous = torch.get_num_threads()
    for size in args.sizes.split(","):
        for dtype_name in args.dtypes.split(","):
            dtype = DTYPES[dtype_name]
            print(
                f"\nThreads, {size} {dtype_name} (steady median; rounds alternate the thread count; {load()})"
            )
            subjects = {n: Subject(makers[n], size, dtype) for n in names}
            times = {(n, c): [] for n in names for c in counts}
            for k in range(3):
                for s in subjects.values():
                    s.step(k)
            for k in range(args.steps):
                for c in counts:
                    torch.set_num_threads(c)
                    for n, s in rotated(list(subjects.items()), k):
                        times[(n, c)].append(s.step(k))
            torch.set_num_threads(previous)
            for n in names:
                medians = [statistics.median(times[(n, c)]) for c in counts]
                cells = "  ".join(
                    f"{c} thread{'s' if c > 1 else ''} {m * 1e3:7.2f}ms" for c, m in zip(counts, medians)
                )
                speedup = medians[0] / medians[-1]
                print(f"  {n:22s} {cells}   speedup {counts[0]}->{counts[-1]}: {speedup:.2f}x")
                summary.setdefault(("threads", size, dtype_name), {})[n] = speedup
            del subjects
            gc.collect()


def print_targets(summary):
    print(
        "\nTargets in this run (steady medians; in brackets by steady minima, the steps least "
        "disturbed by other processes):"
    )
    for key, rows in summary.items():
        if key[0] in ("scaling", "threads") or "fast/block" not in rows:
            continue
        size, dtype_name = key
        fused = rows.get("AdamW fused=True")
        for mode in ("block", "factored"):
            row = rows.get(f"fast/{mode}")
            if row is None:
                continue
            first, median, roof, extra, best = row
            verdicts = []
            if fused:
                r = median / fused[1]
                verdicts.append(
                    f"{r:.2f}x AdamW fused [{best / fused[4]:.2f}x] "
                    f"({'met' if r <= TARGET_VS_FUSED else 'MISSED'} <= {TARGET_VS_FUSED})"
                )
            r = median / roof
            verdicts.append(
                f"{r:.2f}x roofline [{best / roof:.2f}x] "
                f"({'met' if r <= TARGET_ROOFLINE else 'MISSED'} <= {TARGET_ROOFLINE})"
            )
            if size == "16.8M":
                verdicts.append(
                    f"first step {first:.2f} s ({'met' if first <= TARGET_FIRST_S else 'MISSED'} <= 1 s)"
                )
            if size == "4.2M":
                x = first / median
                verdicts.append(
                    f"first step {x:.1f}x steady ({'met' if x <= TARGET_FIRST_X else 'MISSED'} <= 10x)"
                )
            verdicts.append(f"extra {extra:.3f} B/param")
            print(f"  {size:>5s} {dtype_name} fast/{mode:8s}: " + "; ".join(verdicts))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4.2M,16.8M")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=20, help="timed steps for fast and AdamW")
    parser.add_argument("--slow-steps", type=int, default=3, help="timed steps for the reference and gefen-x")
    parser.add_argument(
        "--scaling", default="4.2M,16.8M,67M", help="sizes for fast's first-step scaling ('' to skip)"
    )
    parser.add_argument("--first-repeats", type=int, default=3, help="first-step scaling: best of this many")
    parser.add_argument("--threads", default="1,2", help="thread counts compared ('' to skip)")
    parser.add_argument("--only", default="", help="comma-separated substrings of optimizer names")
    parser.add_argument(
        "--cache",
        choices=("dirty", "as-left"),
        default="dirty",
        help="before each timed step: write 64 MiB and rotate the order (dirty), or nothing (as-left)",
    )
    args = parser.parse_args(argv)
    global EVICT
    EVICT = torch.empty(16 << 20) if args.cache == "dirty" else None
    print(machine())
    print("at start:", load())
    print(
        "cache before each timed step: "
        + (
            "64 MiB just written, optimizer order rotating every round"
            if EVICT is not None
            else "as the previous step left it, fixed order"
        )
    )
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + write, torch copy_ of 64 MiB, best of 20)")
    try:
        from gefen_fast import native

        print(f"gefen-fast kernels: {native.prepare()} (built at install time)")
    except Exception as exc:  # noqa: BLE001 - report and go on without fast
        print(f"gefen-fast kernels unavailable: {exc}")
    makers = optimizers([o for o in args.only.split(",") if o])
    summary = {}
    steady_tables(args, makers, bandwidth, summary)
    if args.scaling:
        first_step_scaling(args, summary)
    if args.threads:
        thread_scaling(args, makers, summary)
    print_targets(summary)
    print("at end:", load())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

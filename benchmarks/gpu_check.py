"""The measured parts of ``benchmarks/gpu_check.sh``: Triton's compile, and the step's time and memory.

Subcommands (each prints a section of the results file on stdout; the driver appends it):

``compile``  Triton's cold compile of every kernel variant of gefen-triton (``prepare``, one process
             per dtype, side by side, into an empty ``TRITON_CACHE_DIR``), then the warm
             ``prepare`` of one fresh process from that cache: what each certification worker and
             rank pays. On the CPU (the interpreter) nothing compiles; the same is timed.

``bench``    per size (16.8M, 134M, 1B parameters: 1, 8 and 64 matrices of 4096 x 4096), dtype
             (fp32, bf16) and second moment (block, factored): gefen-triton's first and steady
             step against ``torch.optim.AdamW(fused=True)`` and ``AdamW(foreach=True)``, peak
             device memory per parameter, and a device-to-device copy of the bytes each optimizer
             must move at least (its roofline), measured in the same run; every time is also
             stated as a multiple of its roofline. Stops, saying so, when its time budget is
             spent.

The first step includes what a first step does: the reference's codebook learning (a histogram
and the exact solver on the host, SPEC 1.6) and state creation, with the periods pinned to the
fallback's 4096 for these matrices (SPEC 1.5.7) so that the host's period search (float64 over
every divisor) stays out of it; it is reported whole and split into its codebook learning and
its kernel launches (``update_parameters``), the latter against the steady step.

Usage: ``python benchmarks/gpu_check.py compile|bench [--device cuda] [--budget-s S] [--sizes ...]``
(the driver sets ``PYTHONPATH`` to the checkout; under ``--device cpu`` set ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

SIZES = {"16.8M": 1, "134M": 8, "1B": 64}  # matrices of SHAPE
SHAPE = (4096, 4096)
PERIOD = 4096  # the fallback's period of a 4096 x 4096 matrix (SPEC 1.5.7)
SMOKE_SHAPE = (64, 64)
SMOKE_SIZES = {"4K": 1, "16K": 4}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODES = ("block", "factored")


# ----------------------------------------------------------------------------------- timing
class Clock:
    """Device time on CUDA (events), wall time on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time(self, fn, repeats: int) -> list[float]:
        """Seconds of each of ``repeats`` calls of ``fn``."""
        out = []
        for _ in range(repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
        return out


def copy_seconds(clock: Clock, nbytes: int, repeats: int) -> float:
    """Median time of a device-to-device copy that reads ``nbytes / 2`` and writes ``nbytes / 2``."""
    half = max(1, nbytes // 2)
    src = torch.empty(half, dtype=torch.uint8, device=clock.device).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    clock.sync()
    return statistics.median(clock.time(lambda: dst.copy_(src), repeats))


def floor_bytes(optimizer: str, dtype: torch.dtype) -> float:
    """Bytes per parameter an optimizer's step must move at least: parameter read and written,
    gradient read, state read and written (Gefen: the uint8 index; its per-block scalars are
    2 x 8 bytes per 4096 elements). AdamW: two moments in the parameter dtype."""
    s = torch.tensor([], dtype=dtype).element_size()
    if optimizer == "gefen":
        return 3 * s + 2 + 16 / PERIOD
    return 7 * s


# --------------------------------------------------------------------------------- the runs
def make_params(count: int, shape, dtype, device, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    params = [
        torch.nn.Parameter((torch.randn(shape, generator=gen, device=device) * 0.02).to(dtype))
        for _ in range(count)
    ]
    for p in params:
        p.grad = (torch.randn(shape, generator=gen, device=device) * 1e-3).to(dtype)
    return params


def peak_extra(clock: Clock, baseline: int) -> int | None:
    if not clock.cuda:
        return None
    return torch.cuda.max_memory_allocated(clock.device) - baseline


def run_gefen(params, mode: str, clock: Clock, repeats: int) -> dict:
    import gefen_triton

    import gefen_reference.codebook as codebook

    opt = gefen_triton.Gefen(params, lr=1e-4, weight_decay=0.01, factored_v_2d=(mode == "factored"))
    for p in params:
        opt.state[p]["automatic_period"] = PERIOD
    spent = {"learn_codebook": 0.0, "update_parameters": 0.0}

    def timed(name, fn):
        def call(*args, **kwargs):
            clock.sync()
            t0 = time.perf_counter()
            result = fn(*args, **kwargs)
            clock.sync()
            spent[name] += time.perf_counter() - t0
            return result

        return call

    opt.learn_codebook = timed("learn_codebook", opt.learn_codebook)
    opt.update_parameters = timed("update_parameters", opt.update_parameters)
    codebook.forget_solved()  # a first step solves its codebook: none kept from an earlier run
    baseline = torch.cuda.memory_allocated(clock.device) if clock.cuda else 0
    if clock.cuda:
        torch.cuda.reset_peak_memory_stats(clock.device)
    clock.sync()
    t0 = time.perf_counter()
    opt.step()
    clock.sync()
    first = time.perf_counter() - t0
    first_update = spent["update_parameters"]
    learn = spent["learn_codebook"]
    del opt.update_parameters, opt.learn_codebook
    # the second step: the first with the state in place (work lists built, kernels loaded)
    second = clock.time(opt.step, 1)[0]
    for _ in range(2):
        opt.step()
    steady = statistics.median(clock.time(opt.step, repeats))
    n = sum(p.numel() for p in params)
    state_bytes = sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t)
    )
    return {
        "first_s": first,
        "first_learn_codebook_s": learn,
        "first_update_s": first_update,
        "second_s": second,
        "steady_s": steady,
        "state_bytes_per_param": state_bytes / n,
        "peak_extra_bytes_per_param": None if not clock.cuda else peak_extra(clock, baseline) / n,
    }


def run_adamw(params, kind: str, clock: Clock, repeats: int) -> dict:
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **{kind: True})
    baseline = torch.cuda.memory_allocated(clock.device) if clock.cuda else 0
    if clock.cuda:
        torch.cuda.reset_peak_memory_stats(clock.device)
    clock.sync()
    t0 = time.perf_counter()
    opt.step()
    clock.sync()
    first = time.perf_counter() - t0
    for _ in range(2):
        opt.step()
    steady = statistics.median(clock.time(opt.step, repeats))
    n = sum(p.numel() for p in params)
    state_bytes = sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t)
    )
    return {
        "first_s": first,
        "steady_s": steady,
        "state_bytes_per_param": state_bytes / n,
        "peak_extra_bytes_per_param": None if not clock.cuda else peak_extra(clock, baseline) / n,
    }


def bench(args) -> int:
    device = torch.device(args.device)
    clock = Clock(device)
    deadline = time.monotonic() + args.budget_s
    sizes = SMOKE_SIZES if device.type == "cpu" else SIZES
    shape = SMOKE_SHAPE if device.type == "cpu" else SHAPE
    if args.sizes:
        sizes = {k: v for k, v in sizes.items() if k in args.sizes}
    repeats = 5 if device.type == "cpu" else 20
    print(f"== step time and memory ({device}, matrices of {shape[0]} x {shape[1]}, period {PERIOD})")
    if device.type == "cpu":
        print("   smoke mode: tiny sizes, Triton's interpreter, wall-clock times (not a benchmark)")
    print(
        f"{'size':>6} {'':>4} {'optimizer':<16} {'steady ms':>10} {'x copy':>7} {'x fused':>8} "
        f"{'first ms':>10} {'x steady':>8} {'codebook':>9} {'kernels':>9} {'x steady':>7} {'2nd x':>7} "
        f"{'state B':>7} {'peak B':>7}"
    )
    rows, records = [], []
    copy_cache: dict[int, float] = {}
    copy_seconds(clock, 1 << 20, 3)  # the device's first copy pays its start-up
    for size, count in sizes.items():
        for dname, dtype in DTYPES.items():
            if time.monotonic() > deadline:
                rows.append(
                    f"{size:>6} {dname}: not run, the part's time budget ({args.budget_s:.0f} s) is spent"
                )
                continue
            n = count * shape[0] * shape[1]
            floors = {}
            for name in ("gefen", "adamw"):
                nbytes = int(floor_bytes(name, dtype) * n)
                if nbytes not in copy_cache:
                    copy_cache[nbytes] = copy_seconds(clock, nbytes, repeats)
                floors[name] = copy_cache[nbytes]
            results = {}
            try:
                for kind in ("fused", "foreach"):
                    params = make_params(count, shape, dtype, device, seed=1)
                    results[f"adamw-{kind}"] = run_adamw(params, kind, clock, repeats)
                    del params
                for mode in MODES:
                    if time.monotonic() > deadline:
                        break
                    params = make_params(count, shape, dtype, device, seed=1)
                    results[f"triton-{mode}"] = run_gefen(params, mode, clock, repeats)
                    del params
            except Exception as exc:  # noqa: BLE001 - reported in the results, the other sizes still run
                rows.append(f"{size:>6} {dname}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            if clock.cuda:
                torch.cuda.empty_cache()
            fused = results.get("adamw-fused", {}).get("steady_s")
            for name, r in results.items():
                floor = floors["gefen" if name.startswith("triton") else "adamw"]
                kernels = r.get("first_update_s")
                peak = r["peak_extra_bytes_per_param"]
                rows.append(
                    f"{size:>6} {dname:>4} {name:<16} {r['steady_s'] * 1e3:10.3f} "
                    f"{r['steady_s'] / floor:7.2f} "
                    + (f"{r['steady_s'] / fused:8.2f}" if fused else f"{'-':>8}")
                    + f" {r['first_s'] * 1e3:10.2f} {r['first_s'] / r['steady_s']:8.1f}"
                    + (
                        f" {r['first_learn_codebook_s'] * 1e3:9.1f} {kernels * 1e3:9.2f} "
                        f"{kernels / r['steady_s']:7.2f} {r['second_s'] / r['steady_s']:7.2f}"
                        if kernels is not None
                        else f" {'-':>9} {'-':>9} {'-':>7} {'-':>7}"
                    )
                    + f" {r['state_bytes_per_param']:7.3f} "
                    + (f"{peak:7.3f}" if peak is not None else f"{'-':>7}")
                )
            records.append(
                {"size": size, "params": n, "dtype": dname, "copy_floor_s": floors, "results": results}
            )
            print("\n".join(rows), flush=True)
            rows = []
    print("\n".join(rows))
    print(
        "   columns: steady step (median), as a multiple of the copy roofline and of fused AdamW's "
        "steady step; "
        "first step, and for triton its codebook learning (ms), its kernels' first launch (ms, and as a "
        "multiple of the steady step) and the second step over the steady one; optimizer state and peak "
        "device memory above parameters and gradients during the first step, bytes per parameter"
    )
    print(
        "   copy: a device-to-device copy moving (read + write) the optimizer's least bytes per step: "
        f"Gefen {floor_bytes('gefen', torch.float32):.3f} (fp32) / "
        f"{floor_bytes('gefen', torch.bfloat16):.3f} (bf16) B/param, "
        f"AdamW {floor_bytes('adamw', torch.float32):.0f} / {floor_bytes('adamw', torch.bfloat16):.0f}"
    )
    print(
        "   target (issue): triton steady <= 0.60x fused AdamW at 134M and 1B in every configuration; "
        "the kernels' first launch within 5x the steady step once Triton's cache is warm"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


# -------------------------------------------------------------------------------- compile
PREPARE = """
import sys, time, torch
import triton
from gefen_triton import warmup
device = torch.device(sys.argv[1])
dtypes = [getattr(torch, d) for d in sys.argv[2].split(",")]
t0 = time.perf_counter()
warmup.prepare_dtypes(device, dtypes)
print(f"{time.perf_counter() - t0:.2f}")
"""


def _prepare_in_process(device: str, dtypes: list[str], timeout: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PREPARE, device, ",".join(dtypes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _seconds(proc: subprocess.Popen, timeout: float) -> tuple[float | None, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return None, f"timed out after {timeout:.0f} s"
    lines = out.strip().splitlines()
    try:
        return float(lines[-1]), ""
    except (IndexError, ValueError):
        return None, out.strip()[-400:]


def compile_part(args) -> int:
    import triton

    cache = os.environ.get("TRITON_CACHE_DIR", "(Triton's default)")
    print(f"== Triton compile (triton {triton.__version__}, device {args.device}, cache {cache})")
    dtypes = ["float32", "bfloat16", "float16"]
    t0 = time.perf_counter()
    procs = [_prepare_in_process(args.device, [d], args.budget_s) for d in dtypes]
    cold = [_seconds(p, max(1.0, args.budget_s - (time.perf_counter() - t0))) for p in procs]
    wall = time.perf_counter() - t0
    for d, (s, why) in zip(dtypes, cold):
        print(f"   cold prepare, {d:<8}: " + (f"{s:.2f} s" if s is not None else f"failed: {why}"))
    total = sum(s for s, _ in cold if s is not None)
    print(
        f"   cold compile of every variant: {wall:.2f} s wall, one process per dtype side by side "
        f"({total:.2f} s in all)"
    )
    left = args.budget_s - (time.perf_counter() - t0)
    warm, why = _seconds(_prepare_in_process(args.device, dtypes, left), max(1.0, left))
    print(
        "   warm prepare (a fresh process, every variant from the cache): "
        + (f"{warm:.2f} s" if warm is not None else f"failed: {why}")
    )
    if args.device == "cpu":
        print("   (the interpreter compiles nothing: these are the prepare steps' own times)")
    return 0 if warm is not None and all(s is not None for s, _ in cold) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("compile", "bench"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--sizes", nargs="*", help="a subset of the sizes (16.8M 134M 1B)")
    parser.add_argument("--json", help="also write the bench's numbers here")
    args = parser.parse_args(argv)
    return compile_part(args) if args.part == "compile" else bench(args)


if __name__ == "__main__":
    sys.exit(main())

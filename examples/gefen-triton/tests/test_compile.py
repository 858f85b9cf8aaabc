"""The kernels compile for a GPU, here, without one: Triton builds Hopper (sm_90) machine code ahead
of time from the same source the interpreter runs. A subprocess without ``TRITON_INTERPRET``
compiles one variant of every kernel (the widest and narrowest tiles, aligned and masked, each
dtype) and checks that none spills registers to local memory and that the aligned tile loads
16 bytes at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

COMPILE = r"""
import json, os, subprocess, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gefen_triton import kernels as K

target = GPUTarget("cuda", 90, 32)
types = {"tiles_ptr": "*i64", "items_ptr": "*i64", "blocks_ptr": "*i64", "slots_ptr": "*i64",
         "ints_ptr": "*i64", "floats_ptr": "*fp32", "scratch_ptr": "*fp32", "cb_ptr": "*fp32",
         "parts0": "i64", "block_scratch0": "i64"}
variants = [
    (K.tile_step, {"DT": tl.bfloat16, "ROWS": 1, "COLS": 4096, "EVEN": True}, 8),
    (K.tile_step, {"DT": tl.float32, "ROWS": 1, "COLS": 8192, "EVEN": True}, 16),
    (K.tile_step, {"DT": tl.float16, "ROWS": 1, "COLS": 8192, "EVEN": False}, 16),
    (K.tile_step, {"DT": tl.bfloat16, "ROWS": 256, "COLS": 16, "EVEN": False}, 8),
    (K.tile_step, {"DT": tl.float32, "ROWS": 4096, "COLS": 1, "EVEN": False}, 8),
    (K.split_stats, {"DT": tl.bfloat16, "CHUNK": 8192}, 16),
    (K.split_blocks, {"REDUCE": 256}, 4),
    (K.split_apply, {"DT": tl.float16, "CHUNK": 8192}, 16),
    (K.factored_squares, {"DT": tl.float32, "TR": 16, "TC": 256}, 8),
    (K.factored_moments, {"RT": 512, "KT": 16}, 4),
]
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
report = []
for fn, constexprs, warps in variants:
    signature = {n: ("constexpr" if n in constexprs else types[n]) for n in fn.arg_names}
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs),
        target=target,
        options={"num_warps": warps, "enable_fp_fusion": False},
    )
    path = os.path.join(sys.argv[1], f"{len(report)}.cubin")
    with open(path, "wb") as f:
        f.write(compiled.asm["cubin"])
    usage = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True).stdout
    ptx = compiled.asm["ptx"]
    report.append({
        "kernel": fn.__name__,
        "constexprs": {k: str(v) for k, v in constexprs.items()},
        "usage": " ".join(line.strip() for line in usage.splitlines() if "REG:" in line),
        "vector_loads": sum("ld.global.v4" in line for line in ptx.splitlines()),
    })
print(json.dumps(report))
"""


def test_every_kernel_compiles_for_sm90(tmp_path):
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("this triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "0")  # the launches pass enable_fp_fusion=False anyway
    run = subprocess.run(
        [sys.executable, "-c", COMPILE, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(report) == 10
    for entry in report:
        assert "REG:" in entry["usage"], entry
        assert "LOCAL:0" in entry["usage"], f"spills to local memory: {entry}"
    aligned = [e for e in report if e["kernel"] == "tile_step" and e["constexprs"].get("EVEN") == "True"]
    assert all(e["vector_loads"] > 0 for e in aligned), aligned

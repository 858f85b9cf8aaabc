#!/usr/bin/env bash
# GPU check of the device path (SPEC 4.6) and of the Triton backend, in one command on one CUDA
# machine, within one lease (about 8 minutes):
#   1. Triton's cold compile of every gefen-triton kernel variant (into a fresh cache), then the
#      warm prepare of a fresh process from it          (benchmarks/gpu_check.py compile)
#   2. whole-suite certifications with --gefen-device cuda, side by side:
#        reference     gefen_conformance.implementations.reference:IMPLEMENTATION
#        triton        gefen_triton.conformance:IMPLEMENTATION   (examples/gefen-triton; after 1)
#        fast          gefen_fast.conformance:IMPLEMENTATION     (examples/gefen-fast)
#        gefenx-fused  gefen_conformance.implementations.gefenx:fused_implementation (gefen-x fused=True)
#   3. the step's time and memory: triton against torch.optim.AdamW(fused=True) and (foreach=True)
#      at 16.8M, 134M and 1B parameters, fp32 and bf16, block and factored, each time also as a
#      multiple of a device-to-device copy of the same bytes     (benchmarks/gpu_check.py bench)
#   4. with 4 GPUs or more: the 4-rank NCCL torchrun certification of triton; with fewer it says
#      so (the certifications of 2 then ran the scenarios that fit: one rank per GPU)
# Everything measured goes into ONE file, OUTDIR/results.txt; beside it the certificates
# (NAME.json, torchrun-triton.json) and every part's log, concatenated into OUTDIR/logs.txt
# (8 files at most).
#
# usage: benchmarks/gpu_check.sh [OUTDIR]     (default: $OUT if set, else ./gpu-check)
# env:   GPU_CHECK_DEVICE   the device (default cuda); cpu runs every part on the CPU, the kernels
#                           under Triton's interpreter (TRITON_INTERPRET=1) with tiny benchmark
#                           sizes and a narrowed torchrun part: a smoke test of this script
#        GPU_CHECK_BUDGET_S everything ends this many seconds after the start (default 450)
#        GPU_CHECK_LIMIT_S  wall-clock limit of each certification (default 300)
#        GPU_CHECK_COMPILE_S limit of the compile part (default 150)
#        GPU_CHECK_BENCH_S  limit of the benchmark part (default 150)
#        GPU_CHECK_TORCHRUN_S limit of the torchrun part (default 120)
#        GPU_CHECK_WORKERS  xdist workers per certification (default 4; they run side by side)
#        GPU_CHECK_CERTIFY  which certifications (default "reference triton fast gefenx-fused")
#        GPU_CHECK_ARGS     extra pytest arguments of the certifications (a narrowed run is partial)
#        GEFENX_WHEELS      a folder of wheels (gefen-x and its needs) installed into a private
#                           target when `import gefen` fails; without gefen-x, gefenx-fused is
#                           reported as not run
#
# Works whether or not the project is pip-installed: the checkout's packages are put on PYTHONPATH
# under their installed names (a folder of links), the plugin is loaded by name when no pytest11
# entry point is registered, and implementations are named by module (nothing is installed from
# an index). Needs python3 with a CUDA build of torch, triton, pytest, pytest-xdist and hypothesis.
# Never resets or reconfigures the GPU: it only reads nvidia-smi. Triton's cache goes to a fresh
# folder of its own (TRITON_CACHE_DIR, for this script's processes only).
# Exit status: 0 when every certificate that ran was written and none is not-conformant,
# incomplete or inconclusive; 1 otherwise; 2 when there is no usable CUDA device.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${OUT:-$PWD/gpu-check}}
device=${GPU_CHECK_DEVICE:-cuda}
if [ "$device" = cpu ]; then  # the smoke test: a small machine, no lease
    budget=${GPU_CHECK_BUDGET_S:-900}
    limit=${GPU_CHECK_LIMIT_S:-600}
    workers=${GPU_CHECK_WORKERS:-1}
    read -r -a wanted <<<"${GPU_CHECK_CERTIFY:-reference triton}"
else
    budget=${GPU_CHECK_BUDGET_S:-450}
    limit=${GPU_CHECK_LIMIT_S:-300}
    workers=${GPU_CHECK_WORKERS:-4}
    read -r -a wanted <<<"${GPU_CHECK_CERTIFY:-reference triton fast gefenx-fused}"
fi
compile_limit=${GPU_CHECK_COMPILE_S:-150}
bench_limit=${GPU_CHECK_BENCH_S:-150}
torchrun_limit=${GPU_CHECK_TORCHRUN_S:-120}
read -r -a extra <<<"${GPU_CHECK_ARGS:-}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root" || exit 2
py=${PYTHON:-python3}
results="$out/results.txt"
work=$(mktemp -d /tmp/gpu-check.XXXXXX)
logs="$work/logs"
certs="$work/certs"  # copied into OUTDIR at the end, without a failing test's reproducer folders
mkdir -p "$logs" "$certs"
began=$(date +%s)
deadline=$(( began + budget ))

# the checkout's packages under their installed names, ahead of any installed copy
mkdir -p "$work/names"
ln -s "$root/conformance" "$work/names/gefen_conformance"
ln -s "$root/reference" "$work/names/gefen_reference"
ln -s "$root/oracles" "$work/names/gefen_oracles"
export PYTHONPATH="$work/names:$root/examples/gefen-triton:$root/examples/gefen-fast${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$work/triton-cache"
if [ "$device" = cpu ]; then
    export TRITON_INTERPRET=1
fi

left() {  # seconds left before the deadline, at most $1
    local l=$(( deadline - $(date +%s) ))
    [ "$l" -gt "$1" ] && l=$1
    echo "$l"
}
section() { printf '\n%s\n' "$*" >>"$results"; }

{
    echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), device $device, checkout $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (dirty)')"
    "$py" - <<'EOF'
import os, platform, sys
import torch
try:
    import triton
    triton_version = triton.__version__
except Exception as exc:  # noqa: BLE001
    triton_version = f"not importable ({exc})"
print(f"python {platform.python_version()}, torch {torch.__version__}, triton {triton_version}, {os.cpu_count()} CPUs")
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
else:
    print("no CUDA device visible to torch")
EOF
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader 2>/dev/null \
        || echo "nvidia-smi: not available"
} >"$results" 2>&1
cat "$results"

gpus=0
if [ "$device" != cpu ]; then
    gpus=$("$py" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
    if [ "$gpus" -lt 1 ]; then
        echo "gpu_check: torch sees no CUDA device; nothing ran" | tee -a "$results"
        exit 2
    fi
fi

if ! "$py" -c 'import gefen' 2>/dev/null && [ -n "${GEFENX_WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/gefenx-site" \
        "$GEFENX_WHEELS"/*.whl && export PYTHONPATH="$PYTHONPATH:$work/gefenx-site"
fi

# The plugin comes from the pytest11 entry point when the project is installed. When it is not,
# the checkout's distribution metadata (its entry points, read from pyproject.toml) goes into the
# folder of links, so that importlib.metadata finds the plugin and the built-in implementations in
# this process and in every pytest the suite starts itself (loading the plugin with -p would not
# reach those: the suite's own census of the whole suite would fail and every run be partial).
plugin=()
has_plugin() {  # from /, as the suite's own pytest processes see it (not through this directory)
    (cd / && "$py" - <<'EOF'
import sys
from importlib.metadata import entry_points
sys.exit(0 if any(e.value == "gefen_conformance.plugin.hooks" for e in entry_points(group="pytest11")) else 1)
EOF
    )
}
if ! has_plugin; then
    "$py" - "$root/pyproject.toml" "$work/names" <<'EOF'
import re, sys
from pathlib import Path
text = Path(sys.argv[1]).read_text()
version = re.search(r'^version = "([^"]+)"', text, re.M).group(1)
info = Path(sys.argv[2]) / f"gefen_conformance-{version}.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gefen-conformance\nVersion: {version}\n")
lines = []
for group, body in re.findall(r'^\[project\.entry-points\."?([\w.]+)"?\]\n((?:[^\[\n].*\n)+)', text, re.M):
    lines.append(f"[{group}]")
    lines += [line.replace('"', "").replace(" = ", "=") for line in body.splitlines() if "=" in line]
(info / "entry_points.txt").write_text("\n".join(lines) + "\n")
EOF
    has_plugin || plugin=(-p gefen_conformance.plugin.hooks)
fi

declare -A specs=(
    [reference]="gefen_conformance.implementations.reference:IMPLEMENTATION"
    [triton]="gefen_triton.conformance:IMPLEMENTATION"
    [fast]="gefen_fast.conformance:IMPLEMENTATION"
    [gefenx-fused]="gefen_conformance.implementations.gefenx:fused_implementation"
)
order=()
for name in "${wanted[@]}"; do
    if [ -z "${specs[$name]:-}" ]; then
        echo "gpu_check: unknown certification $name (known: ${!specs[*]})" | tee -a "$results"
        continue
    fi
    if [ "$name" = gefenx-fused ] && ! "$py" -c 'import gefen' 2>/dev/null; then
        echo "gefenx-fused: not run: gefen-x is not importable (set GEFENX_WHEELS)" >>"$logs/gefenx-fused.log"
        continue
    fi
    order+=("$name")
done

certify() {  # NAME: one whole-suite certification, within the time left before the deadline
    local name=$1 l
    l=$(left "$limit")
    if [ "$l" -lt 30 ]; then
        echo "$name: not run, only ${l} s left" >>"$logs/$name.log"
        return 124
    fi
    rm -f "$out/$name.json" "$certs/$name.json" "$certs/$name.partial.json"
    # -o addopts=: this project's own pytest options (-m 'not slow') must not narrow the suite
    timeout --kill-after=20 "$l" "$py" -m pytest "${plugin[@]}" "--impl=${specs[$name]}" --gefen-device "$device" \
        "--certificate=$certs/$name.json" -n "$workers" -o addopts= -p no:cacheprovider -q -rfE "${extra[@]}" \
        >>"$logs/$name.log" 2>&1
}

build_gefenx() {  # gefen-x builds its CUDA kernels on first use: once, before its xdist workers start
    [ "$device" = cpu ] && return 0
    local t0 rc
    t0=$(date +%s)
    timeout "$(left 180)" "$py" - >>"$logs/gefenx-fused.log" 2>&1 <<'EOF'
import torch, gefen
p = torch.nn.Parameter(torch.randn(64, 48, device="cuda"))
opt = gefen.Gefen([("w", p)], fused=True)
for _ in range(2):
    p.grad = torch.randn_like(p)
    opt.step()
torch.cuda.synchronize()
print("gefen-x fused kernels built and stepped on", torch.cuda.get_device_name())
EOF
    rc=$?
    echo "gefen-x kernel build: rc $rc in $(( $(date +%s) - t0 )) s" >>"$logs/gefenx-fused.log"
    return $rc
}

compile_triton() {  # part 1, then the triton certification on the warm cache
    local rc
    timeout --kill-after=10 "$(left "$compile_limit")" "$py" benchmarks/gpu_check.py compile --device "$device" \
        --budget-s "$(left "$compile_limit")" >"$work/compile.txt" 2>"$logs/compile.log"
    rc=$?
    echo "compile part: exit $rc after $(( $(date +%s) - began )) s" >>"$logs/compile.log"
    return $rc
}

# -- parts 1 and 2: the compile, and the certifications beside it --------------------------------
pids=()
for name in "${order[@]}"; do
    case $name in
        triton) ( compile_triton; certify triton ) & ;;
        gefenx-fused) ( build_gefenx && certify gefenx-fused ) & ;;
        *) certify "$name" & ;;
    esac
    pids+=("$!:$name")
done
if [[ " ${order[*]} " != *" triton "* ]]; then
    compile_triton
fi
for entry in "${pids[@]}"; do
    wait "${entry%%:*}"
    echo "${entry#*:}: exit $? after $(( $(date +%s) - began )) s" | tee -a "$logs/parts.log"
done
cat "$work/compile.txt" >>"$results" 2>/dev/null || section "== Triton compile: no output (see logs.txt)"

section "== certifications (--gefen-device $device, pool launcher, $workers xdist workers each)"
"$py" - "$certs" "${wanted[@]}" >>"$results" 2>&1 <<'EOF'
import json, sys
from pathlib import Path

out, names = Path(sys.argv[1]), sys.argv[2:]
for name in names:
    path = out / f"{name}.json"
    if not path.exists():
        partial = out / f"{name}.partial.json"
        path = partial if partial.exists() else None
    if path is None:
        print(f"{name}: NO CERTIFICATE (see logs.txt)")
        continue
    c = json.loads(path.read_text())
    ex, s = c["execution"], c["summary"]
    print(f"{name}: {c['verdict']}: {c['verdict_reason']}")
    print(f"  {', '.join(f'{v} {k}' for k, v in s.items() if v)}; profile {c['profile']['name']} ({c['profile']['reason']})")
    print(f"  execution {ex.get('launcher')} {ex.get('backend')} {ex.get('device_type')} {ex.get('device_names')} "
          f"world sizes {ex.get('world_sizes')}; warm-up {ex.get('warm_up_s', 0):.1f} s; torch {c['platform']['torch']}")
    for t in c["tests"]:
        if t["outcome"] in ("failed", "error", "xpassed"):
            print(f"  {t['outcome']}: {t['id']}: {t['reason'][:300]}")
    not_run = c.get("run", {}).get("not_run") or []
    if not_run:
        print(f"  not run here: {len(not_run)} (first: {str(not_run[0])[:200]})")
EOF

# -- part 3: the step's time and memory, alone on the device --------------------------------------
l=$(left "$bench_limit")
if [ "$l" -ge 20 ]; then
    timeout --kill-after=10 "$l" "$py" benchmarks/gpu_check.py bench --device "$device" --budget-s $(( l - 15 )) \
        >>"$results" 2>"$logs/bench.log"
    echo "bench part: exit $? after $(( $(date +%s) - began )) s" >>"$logs/bench.log"
else
    section "== step time and memory: not run, only ${l} s left"
fi

# -- part 4: the 4-rank torchrun certification ----------------------------------------------------
if [ "$device" = cpu ]; then
    nproc=4
    reshard="test_dcp_reshard.py::test_reshard_restores_model_and_continues_within_bound"
    torchrun_args=("$reshard[2->4]" "$reshard[4->2]")
    section "== torchrun, 4 gloo ranks on the CPU (smoke: narrowed to two reshards, so partial)"
elif [ "$gpus" -ge 4 ]; then
    nproc=4
    torchrun_args=()
    section "== torchrun, 4 NCCL ranks on cuda:0-3"
else
    nproc=0
    section "== torchrun: not run: the 4-rank NCCL certification needs 4 GPUs and this machine has $gpus; the pool certifications above ran what fits (one-rank scenarios; the others are in their run.not_run)"
fi
if [ "$nproc" -gt 0 ]; then
    l=$(left "$torchrun_limit")
    if [ "$l" -ge 30 ]; then
        rm -f "$out/torchrun-triton.json"
        timeout --kill-after=20 "$l" "$py" -m gefen_conformance.cli certify --impl "${specs[triton]}" \
            --launcher torchrun --nproc-per-node "$nproc" --device "$device" --out "$certs/torchrun-triton.json" \
            "${torchrun_args[@]}" -- -q "${plugin[@]}" >"$logs/torchrun-triton.log" 2>&1
        rc=$?
        echo "torchrun part: exit $rc after $(( $(date +%s) - began )) s" >>"$logs/torchrun-triton.log"
        "$py" - "$certs" "$rc" >>"$results" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
out, rc = Path(sys.argv[1]), sys.argv[2]
for path in (out / "torchrun-triton.json", out / "torchrun-triton.partial.json"):
    if path.exists():
        c = json.loads(path.read_text())
        ex = c["execution"]
        print(f"triton under torchrun: {c['verdict']}: {c['verdict_reason']} (exit {rc})")
        print(f"  {', '.join(f'{v} {k}' for k, v in c['summary'].items() if v)}; {ex.get('launcher')} "
              f"world size {ex.get('world_size')} {ex.get('backend')} {ex.get('device_names')}")
        for t in c["tests"]:
            if t["outcome"] in ("failed", "error", "xpassed"):
                print(f"  {t['outcome']}: {t['id']}: {t['reason'][:300]}")
        break
else:
    print(f"triton under torchrun: NO CERTIFICATE (exit {rc}; see logs.txt)")
EOF
    else
        section "torchrun: not run, only ${l} s left"
    fi
fi

section "gpu_check: done in $(( $(date +%s) - began )) s"
for f in "$logs"/*.log; do
    [ -f "$f" ] || continue
    printf '\n===== %s\n' "$(basename "$f")"
    tail -c 200000 "$f"
done >"$out/logs.txt"
cp "$certs"/*.json "$out"/ 2>/dev/null
cat "$results"

"$py" - "$certs" "${order[@]}" <<'EOF'
import json, sys
from pathlib import Path
out, names = Path(sys.argv[1]), sys.argv[2:]
bad = 0
for name in names:
    path = out / f"{name}.json"
    if not path.exists():
        partial = out / f"{name}.partial.json"
        path = partial if partial.exists() else None
    if path is None:
        bad += 1
        continue
    bad += json.loads(path.read_text())["verdict"] in ("not-conformant", "incomplete", "inconclusive")
sys.exit(1 if bad else 0)
EOF

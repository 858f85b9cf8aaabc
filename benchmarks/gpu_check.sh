#!/usr/bin/env bash
# GPU check of the device path (SPEC 4.6): certify, on one CUDA machine, with --gefen-device cuda
#   1. the reference                  (gefen_conformance.implementations.reference:IMPLEMENTATION)
#   2. the fast example backend       (gefen_fast.conformance:IMPLEMENTATION, from examples/gefen-fast)
#   3. gefen-x with its CUDA kernels  (gefen_conformance.implementations.gefenx:fused_implementation, fused=True)
# and write one certificate and one log per implementation, plus summary.txt, into OUTDIR
# (7 files at most).
#
# usage: benchmarks/gpu_check.sh [OUTDIR]     (default: $OUT if set, else ./gpu-check)
# env:   GPU_CHECK_WORKERS  xdist workers per certification (default 4; the three run side by side)
#        GPU_CHECK_LIMIT_S  wall-clock limit of each certification (default 400)
#        GPU_CHECK_BUDGET_S everything ends this many seconds after the first certification starts
#                           (default 450, so the script stays under 8 minutes)
#        GPU_CHECK_BUILD_S  limit of gefen-x's one-off kernel build (default 180); it runs while the
#                           reference and fast are certified, and gefen-x's certification after it
#        GPU_CHECK_DEVICE   the --gefen-device (default cuda; cpu only to smoke-test this script)
#        GPU_CHECK_ARGS     extra pytest arguments (e.g. "-k optimizer"; a narrowed run is partial)
#        GEFENX_WHEELS      a folder of wheels (gefen-x and its needs) installed into a private
#                           target when `import gefen` fails; without gefen-x step 3 is reported
#                           as not run
#
# Runs from the repository root (or any directory: it finds the root from its own path). Needs
# python3 with a CUDA build of torch, pytest, pytest-xdist and hypothesis; works whether or not
# this project is pip-installed. Never resets or reconfigures the GPU: it only reads nvidia-smi.
# Exit status: 0 when every certificate was written and none is not-conformant, incomplete or
# missing; 1 otherwise; 2 when there is no usable CUDA device.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${OUT:-$PWD/gpu-check}}
workers=${GPU_CHECK_WORKERS:-4}
limit=${GPU_CHECK_LIMIT_S:-400}
budget=${GPU_CHECK_BUDGET_S:-450}
build_limit=${GPU_CHECK_BUILD_S:-180}
device=${GPU_CHECK_DEVICE:-cuda}
read -r -a extra <<<"${GPU_CHECK_ARGS:-}"
mkdir -p "$out"
cd "$root" || exit 2
export PYTHONPATH="$root:$root/examples/gefen-fast${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
if [ "$device" != cpu ] && ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: torch $("$py" -c 'import torch; print(torch.__version__)' 2>&1) sees no CUDA device" | tee "$out/summary.txt"
    exit 2
fi

if ! "$py" -c 'import gefen' 2>/dev/null && [ -n "${GEFENX_WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu-check-site \
        "$GEFENX_WHEELS"/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/gpu-check-site"
fi

# The plugin comes from the pytest11 entry point when the project is installed, else by name.
plugin=()
if ! "$py" - <<'EOF'
import sys
from importlib.metadata import entry_points
sys.exit(0 if any(e.value == "gefen_conformance.plugin.hooks" for e in entry_points(group="pytest11")) else 1)
EOF
then
    plugin=(-p gefen_conformance.plugin.hooks)
fi

declare -A specs=(
    [reference]="gefen_conformance.implementations.reference:IMPLEMENTATION"
    [fast]="gefen_fast.conformance:IMPLEMENTATION"
    [gefenx-fused]="gefen_conformance.implementations.gefenx:fused_implementation"
)
order=(reference fast gefenx-fused)
began=$(date +%s)
deadline=$(( began + budget ))

certify() {  # NAME: one whole-suite certification, within the time left before the deadline
    local name=$1 left
    left=$(( deadline - $(date +%s) ))
    [ "$left" -gt "$limit" ] && left=$limit
    if [ "$left" -lt 30 ]; then
        echo "$name: not run, only ${left} s left" >>"$out/$name.log"
        return 124
    fi
    rm -f "$out/$name.json" "$out/$name.partial.json"
    # -o addopts=: this project's own pytest options (-m 'not slow') must not narrow the suite
    timeout --kill-after=20 "$left" "$py" -m pytest "${plugin[@]}" "--impl=${specs[$name]}" --gefen-device "$device" \
        "--certificate=$out/$name.json" -n "$workers" -o addopts= -p no:cacheprovider -q -rfE "${extra[@]}" \
        >>"$out/$name.log" 2>&1
}

build_gefenx() {  # gefen-x builds its CUDA kernels on first use: once, before its xdist workers start
    [ "$device" = cpu ] && return 0
    local t0 rc
    t0=$(date +%s)
    timeout "$build_limit" "$py" - >>"$out/gefenx-fused.log" 2>&1 <<'EOF'
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
    echo "gefen-x kernel build: rc $rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/gefenx-fused.log"
    return $rc
}

for name in "${order[@]}"; do rm -f "$out/$name.log"; done
if ! "$py" -c 'import gefen' 2>/dev/null; then
    unset 'specs[gefenx-fused]'
    echo "gefen-x is not importable (set GEFENX_WHEELS): gefenx-fused is not certified" | tee "$out/gefenx-fused.log"
fi
pids=()
for name in "${order[@]}"; do
    [ -n "${specs[$name]:-}" ] || continue
    if [ "$name" = gefenx-fused ]; then
        ( build_gefenx && certify "$name" ) &
    else
        certify "$name" &
    fi
    pids+=("$!:$name")
done
for entry in "${pids[@]}"; do
    wait "${entry%%:*}"
    echo "${entry#*:}: exit $? after $(( $(date +%s) - began )) s"
done

"$py" - "$out" "${order[@]}" <<'EOF' | tee "$out/summary.txt"
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
        print(f"{name}: NO CERTIFICATE (see {name}.log)")
        bad += 1
        continue
    c = json.loads(path.read_text())
    ex, s = c["execution"], c["summary"]
    print(f"{name}: {c['verdict']}: {c['verdict_reason']}")
    print(f"  {', '.join(f'{v} {k}' for k, v in s.items() if v)}; profile {c['profile']['name']} ({c['profile']['reason']})")
    print(f"  execution {ex.get('launcher')} {ex.get('backend')} {ex.get('device_type')} {ex.get('device_names')} "
          f"world sizes {ex.get('world_sizes')}; torch {c['platform']['torch']}")
    for t in c["tests"]:
        if t["outcome"] in ("failed", "error", "xpassed"):
            print(f"  {t['outcome']}: {t['id']}: {t['reason'][:300]}")
    bad += c["verdict"] in ("not-conformant", "incomplete", "inconclusive")
sys.exit(1 if bad else 0)
EOF

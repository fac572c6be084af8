#!/bin/bash
# The sm90 grouped kernels' GPU check in one run (~8 minutes on an H200 from a warm build; sections time-boxed):
# build (sm_90a), their tests, compute-sanitizer memcheck and racecheck over the grouped cases (the item ring
# included), then the MoE layer bench: select's pick on Qwen3-30B-A3B and DeepSeek-V3 at 1 / 16 / 64 / 256 tokens,
# and each config forced where the rows per group sit near select's thresholds.
# Run from the repository root: bash benchmarks/diagnostics/sm90_grouped_gpu_check.sh   (logs under $OUT if set)
set -u
LOG=${OUT:-/tmp}/sm90_grouped_check
mkdir -p "$LOG"
export NVFP4_GEMM_CUDA_ARCHS=9.0a MAX_JOBS=${MAX_JOBS:-16}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }

stamp build
if ! python3 setup.py build_ext --inplace >"$LOG/build.log" 2>&1; then
  tail -40 "$LOG/build.log"
  exit 1
fi

stamp tests
timeout 240 python3 -m pytest tests/test_sm90_grouped.py tests/test_sm90_host.py -q 2>&1 | tail -6

S=benchmarks/diagnostics/sm90_grouped_sanitize_cases.py
stamp memcheck
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $S --ring 2>&1 | tail -3
stamp racecheck
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $S 2>&1 | tail -3
stamp "racecheck, item ring"
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $S --ring-only --configs 0,1 --a bf16 2>&1 | tail -3

B=benchmarks/diagnostics/sm90_grouped_bench.py
stamp "bench: select's pick"
timeout 150 python3 $B --shapes qwen3,dsv3 --tokens 1,16,64,256 --a bf16 2>&1 | grep -E "copy|gate_up|down|layer"
stamp "bench: each config"
timeout 150 python3 $B --shapes qwen3,dsv3 --tokens 64,256 --a bf16 --configs 0,1 2>&1 | grep layer
timeout 60 python3 $B --shapes qwen3 --tokens 1024 --a bf16,e2m1 --configs 0,1 2>&1 | grep layer
stamp done

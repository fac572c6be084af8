#!/bin/bash
# One device call: build the sm90 module, run the sm90 tests, time the targets. Logs go to $OUT.
# Usage (repo root, cutlass wheel in .whl/):
#   bash benchmarks/diagnostics/sm90_device.sh [build|diagbuild|smoke|test|bench|trace|profile|ncu|sanitize]...
# diagbuild: a diagnostics build (NVFP4_GEMM_DIAGNOSTICS=1), which `trace` needs; build again after it.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NVFP4_GEMM_CUDA_ARCHS=9.0a MAX_JOBS=16
for step in "$@"; do
  case $step in
    build) rm -rf build nvfp4_gemm/*.so  # a reused machine keeps objects whose mtimes can beat the sources'
           (time python3 setup.py build_ext --inplace) >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
           grep -E "spill|error" "$OUT/build.log" | sort | uniq -c | head; python3 -c "import nvfp4_gemm, json; print(json.dumps(nvfp4_gemm.configs()))" ;;
    diagbuild) (time NVFP4_GEMM_DIAGNOSTICS=1 python3 setup.py build_ext --inplace) >"$OUT/build_diag.log" 2>&1 || { tail -60 "$OUT/build_diag.log"; exit 1; } ;;
    smoke) python3 - <<'PY'
import os, torch, nvfp4_gemm
os.environ["NVFP4_GEMM_BACKEND"] = "sm90"
for m, n, k in [(1, 8, 32), (128, 256, 1024), (300, 136, 544), (128, 7168, 2048)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    sf = lambda r: nvfp4_gemm.to_blocked(((torch.randint(1, 11, (r, k // 16), device="cuda", generator=g) << 3) | torch.randint(0, 8, (r, k // 16), device="cuda", generator=g)).to(torch.uint8).view(torch.float8_e4m3fn))
    sfa, sfb = sf(m), sf(n)
    out = nvfp4_gemm.mm(a, b, sfa, sfb).float()
    ref = nvfp4_gemm.dequantize(a, sfa, k, torch.float64) @ nvfp4_gemm.dequantize(b, sfb, k, torch.float64).T
    print("smoke", (m, n, k), "rel err", float((out - ref).abs().max() / ref.abs().max()), "nan", int(out.isnan().sum()))
PY
    ;;
    test) NVFP4_GEMM_TEST_BACKENDS=sm90 timeout 200 python3 -m pytest -q -rs tests/test_sm90.py tests/test_mm.py > "$OUT/pytest.log" 2>&1; tail -4 "$OUT/pytest.log"
          echo "== whole suite, NVFP4_GEMM_BACKEND=sm90 ==" >> "$OUT/pytest.log"
          NVFP4_GEMM_BACKEND=sm90 timeout 150 python3 -m pytest -q -rs tests >> "$OUT/pytest.log" 2>&1; tail -6 "$OUT/pytest.log" ;;
    bench) timeout 240 python3 benchmarks/bench_sm90.py --out "$OUT" ${BENCH_ARGS} > "$OUT/bench.log" 2>&1; tail -14 "$OUT/bench.log" ;;
    trace) timeout 120 python3 benchmarks/diagnostics/sm90_trace.py ${TRACE_SHAPES} 2>&1 | tee "$OUT/trace.log" ;;
    profile) timeout 150 python3 benchmarks/diagnostics/sm90_profile.py auto ${PROFILE_SPLITS} 2>&1 | grep -v -i warn | tee "$OUT/profile.log" ;;
    ncu) for shape in ${NCU_SHAPES:-128,7168,2048}; do echo "=== ncu $shape" >> "$OUT/profile.log"
           NVFP4_GEMM_BACKEND=sm90 timeout 90 ncu --clock-control none -k regex:gemm_kernel -s 2 -c 1 --section SpeedOfLight \
             --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
             --section ComputeWorkloadAnalysis --metrics ${NCU_METRICS:-sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum} \
             python3 benchmarks/diagnostics/sm90_profile.py --once ${shape//,/ } >> "$OUT/profile.log" 2>&1
           echo "=== ncu stalls $shape" >> "$OUT/profile.log"  # per-issue stall ratios of every reason
           NVFP4_GEMM_BACKEND=sm90 timeout 90 ncu --clock-control none -k regex:gemm_kernel -s 2 -c 1 \
             --metrics "regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$" \
             python3 benchmarks/diagnostics/sm90_profile.py --once ${shape//,/ } >> "$OUT/profile.log" 2>&1; done
         grep -E "=== ncu|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput|Issued Warp|No Eligible|Warp Cycles Per Issued|Stall|hmma|lts__|Pipe" "$OUT/profile.log" | head -60 ;;
    sanitize) for tool in memcheck racecheck; do
        echo "=== $tool" >> "$OUT/sanitize.log"
        timeout 120 compute-sanitizer --tool $tool --print-limit 10 python3 benchmarks/diagnostics/sm90_sanitize_cases.py >> "$OUT/sanitize.log" 2>&1; echo "$tool rc=$?"; done
        grep -E "===|ERROR SUMMARY|RACECHECK SUMMARY|sanitize cases ran" "$OUT/sanitize.log"; grep -A4 -m2 "Race reported" "$OUT/sanitize.log" ;;
  esac
done

#!/bin/bash
# Issue 14 on a GPU machine (H100 for the speed target), from the repo root, after building
# (`NVFP4_GEMM_CUDA_ARCHS=9.0a python setup.py build_ext --inplace`):
#   NVFP4_GEMM_COMMIT=<commit> bash benchmarks/device_methods.sh
# 1. tests/test_methods.py: the mse search on CUDA bit for bit equal to the CPU's and to the PyTorch
#    definition (test_mse_cpu_and_cuda_bitwise_equal), and every CPU test of the methods;
#    tests/test_quantize.py, since the quantize kernel now shares its block loads with the search kernel;
# 2. compute-sanitizer memcheck over the CUDA mse tests;
# 3. benchmarks/bench_methods.py: rtn vs mse time on the 8B-shaped stack (target: mse <= 2x rtn).
# Logs, JSON and the Markdown table under $OUT (default /tmp/nvfp4_out).
set -o pipefail
OUT=${OUT:-/tmp/nvfp4_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
step() { echo "== $1 ($(date +%T))"; }

python3 -c "import torch, nvfp4_gemm; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.cuda.get_device_name(), 'nvfp4_gemm from', nvfp4_gemm.__file__)" || exit 1

step "tests: methods (CPU and CUDA mse bitwise), quantize"
timeout 400 python3 -m pytest tests/test_methods.py tests/test_quantize.py -q -rs -p no:cacheprovider > "$OUT/pytest_methods.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|^SKIPPED|passed|failed" "$OUT/pytest_methods.log" | tail -15

step "compute-sanitizer memcheck, CUDA mse tests"
timeout 300 compute-sanitizer --tool memcheck --print-limit 10 python3 -m pytest tests/test_methods.py -q -p no:cacheprovider \
  -k "cuda and not large" > "$OUT/sanitize_mse.log" 2>&1
echo "rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitize_mse.log" | tail -3

step "bench_methods.py: rtn vs mse on the 8B-shaped stack"
timeout 400 python3 benchmarks/bench_methods.py --json "$OUT/bench_methods.json" --record "$OUT/bench_methods.md" \
  2>&1 | tee "$OUT/bench_methods.log"

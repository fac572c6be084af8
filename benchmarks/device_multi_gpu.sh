#!/bin/bash
# One call on a two-GPU machine (device kind nvidia-h200-x2): clean build for sm_90a, the two-GPU test
# (every dispatch entry, weight-only and linear on each device, threads on both devices, errors on one),
# then the whole single-GPU suite on cuda:0. Logs under $OUT.
#   bash benchmarks/device_multi_gpu.sh        (repo root; wheels in .whl/)
set -o pipefail
OUT=${OUT:-/tmp/nvfp4_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
export NVFP4_GEMM_CUDA_ARCHS=${NVFP4_GEMM_CUDA_ARCHS:-9.0a} MAX_JOBS=${MAX_JOBS:-32}
step() { echo "== $1 ($(date +%T))"; }

step devices
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
git log -1 --format=%h 2>/dev/null
step build
rm -rf build nvfp4_gemm/*.so
(time python3 setup.py build_ext --inplace) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
grep -E "^real" "$OUT/build.log"

step "two-GPU test"
timeout 240 python3 -m pytest -v -rs -p no:cacheprovider tests/test_multi_gpu.py -s > "$OUT/multi_gpu.log" 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|not run" "$OUT/multi_gpu.log" | tail -20

step "single-GPU suite"
timeout ${SUITE_TIMEOUT:-300} python3 -m pytest tests -q -rs -p no:cacheprovider --deselect tests/test_sm100_host.py \
  --ignore=tests/test_perplexity.py --ignore=tests/test_sm100_build.py --ignore=tests/test_multi_gpu.py > "$OUT/pytest.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest.log" | tail -15

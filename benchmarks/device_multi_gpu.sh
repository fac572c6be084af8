#!/bin/bash
# One call on a two-GPU machine (device kind nvidia-h200-x2): clean build for sm_90a, the two-GPU test
# (every dispatch entry, weight-only and linear on each device, threads on both devices, errors on one),
# then the whole single-GPU suite on cuda:0. Logs under $OUT.
#   bash benchmarks/device_multi_gpu.sh        (repo root; wheels in .whl/)
MAX_JOBS=${MAX_JOBS:-32}
source benchmarks/_device_common.sh

step devices
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
clean_build || exit 1

step "two-GPU test"
timeout 240 python3 -m pytest -v -rs -p no:cacheprovider tests/test_multi_gpu.py -s > "$OUT/multi_gpu.log" 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|not run" "$OUT/multi_gpu.log" | tail -20

step "single-GPU suite"
timeout ${SUITE_TIMEOUT:-300} python3 -m pytest tests -q -rs -p no:cacheprovider --deselect tests/test_sm100_host.py \
  --ignore=tests/test_perplexity.py --ignore=tests/test_sm100_build.py --ignore=tests/test_multi_gpu.py > "$OUT/pytest.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest.log" | tail -15

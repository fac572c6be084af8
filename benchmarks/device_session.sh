#!/bin/bash
# One H100 call for a session's merged work: build for sm_90a, the GPU suites of the sm90 weight-only /
# fused-quantize kernels, the linear op (bitwise, launches, no host sync), the weight methods and quantize,
# then bench_linear_host.py (host time, launches), bench_methods.py (rtn vs mse) and bench_model.py (8B
# stack). Logs and JSON under $OUT.   bash benchmarks/device_session.sh   (repo root; wheels in .whl/)
source benchmarks/_device_common.sh

clean_build || exit 1

step "GPU suites"
timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -q -rs -p no:cacheprovider tests/test_sm90_weight_only.py \
  tests/test_linear_op.py tests/test_linear_launches.py tests/test_nn_modes.py tests/test_methods.py \
  tests/test_quantize.py -s -k "not large" > "$OUT/pytest.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed| launches per forward" "$OUT/pytest.log" | tail -24

step bench_linear_host
for m in 1 128; do timeout 40 python3 benchmarks/bench_linear_host.py --m $m 2>&1 | tail -16; done > "$OUT/bench_linear_host.log"
cat "$OUT/bench_linear_host.log"
step bench_methods
timeout 90 python3 benchmarks/bench_methods.py --json "$OUT/bench_methods.json" > "$OUT/bench_methods.log" 2>&1
echo "rc=$?"; tail -14 "$OUT/bench_methods.log"
step bench_model
timeout 170 python3 benchmarks/bench_model.py --stacks 8b --variants fp16,static,dynamic,wo_fp16,wo_bf16,humming \
  --json "$OUT/bench_model.json" > "$OUT/bench_model.log" 2>&1
echo "rc=$?"; grep -A12 "^| graph_us" "$OUT/bench_model.log"; grep -A12 "^| host_us" "$OUT/bench_model.log"

#!/bin/bash
# One call on the H100 for the sm90 weight-only kernels: build for sm_90a, the weight-only and sm90
# suites and compute-sanitizer on the sm90 cases (STAGE=test), bench_mm.py and bench_model.py (STAGE=bench);
# both by default.
#   bash benchmarks/device_wo.sh            (repo root; wheels in .whl/)
source benchmarks/_device_common.sh

clean_build || exit 1

STAGE=${STAGE:-all}  # test, bench or all
if [ "$STAGE" != bench ]; then
  step "weight-only + sm90 suites"
  timeout ${PYTEST_TIMEOUT:-330} python3 -m pytest -q -rs -p no:cacheprovider tests/test_sm90_weight_only.py tests/test_weight_only.py \
    tests/test_sm90.py tests/test_mm.py tests/test_linear_op.py tests/test_nn_modes.py > "$OUT/pytest.log" 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|Error" "$OUT/pytest.log" | tail -15
  [ "${SANITIZE:-1}" = 1 ] && step sanitizer && for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --print-limit 10 python3 benchmarks/diagnostics/sm90_sanitize_cases.py > "$OUT/sanitize_$tool.log" 2>&1
    echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize cases ran" "$OUT/sanitize_$tool.log" | head -4
  done
fi
if [ "$STAGE" != test ]; then
  step bench_mm
  timeout 330 python3 benchmarks/bench_mm.py --variants ours,wo_fp16,wo_bf16,cublas,humming,read --json "$OUT/bench_mm.json" > "$OUT/bench_mm.log" 2>&1
  echo "rc=$?"; tail -40 "$OUT/bench_mm.log"
  [ "${MODEL:-1}" = 1 ] && step bench_model && timeout 200 python3 benchmarks/bench_model.py --stacks 8b --variants fp16,bf16,static,dynamic,wo_fp16,wo_bf16,humming --json "$OUT/bench_model.json" > "$OUT/bench_model.log" 2>&1
  [ "${MODEL:-1}" = 1 ] && tail -30 "$OUT/bench_model.log"
fi

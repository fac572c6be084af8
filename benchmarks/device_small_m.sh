#!/bin/bash
# One H100 call for a small-M kernel change: clean build for sm_90a, the suites that run it (sm90 small-M
# sweep and config selection, weight-only, the linear op and its launch counts, graphs and
# streams), then benchmarks/diagnostics/small_m_chain.py (the 8B stack's shapes at M = 1 and 16) and, with
# BENCH_MODEL_M=1,16,..., bench_model.py on the 8B stack; with NCU_SHAPE="M N K", one ncu pass (speed of
# light, warp states, scheduler) over the small-M kernel of that shape.
#   bash benchmarks/device_small_m.sh        (repo root; wheels in .whl/)
# Narrower test runs: PYTEST_FILES (default: the list below), PYTEST_K (a -k expression).
source benchmarks/_device_common.sh

clean_build || exit 1

step tests
PYTEST_FILES=${PYTEST_FILES:-tests/test_sm90.py tests/test_sm90_weight_only.py tests/test_linear_op.py \
  tests/test_linear_launches.py tests/test_op.py tests/test_mm.py}
timeout ${PYTEST_TIMEOUT:-240} python3 -m pytest -q -rs -p no:cacheprovider $PYTEST_FILES ${PYTEST_K:+-k "$PYTEST_K"} -x \
  > "$OUT/pytest.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|Error" "$OUT/pytest.log" | tail -12

step small_m_chain
timeout ${CHAIN_TIMEOUT:-200} python3 benchmarks/diagnostics/small_m_chain.py --m ${CHAIN_M:-1,16} --splits ${CHAIN_SPLITS:-0,4,8} \
  ${CHAIN_ARGS:-} 2>&1 | grep -v -i warn | tee "$OUT/chain.log"

if [ -n "${BENCH_MODEL_M:-}" ]; then
  step bench_model
  timeout ${BENCH_MODEL_TIMEOUT:-200} python3 benchmarks/bench_model.py --stacks 8b --m "$BENCH_MODEL_M" \
    --variants ${BENCH_MODEL_VARIANTS:-fp16,static,dynamic,wo_fp16,humming} --json "$OUT/bench_model.json" > "$OUT/bench_model.log" 2>&1
  echo "rc=$?"; grep -A12 "^| graph_us" "$OUT/bench_model.log"
fi

if [ -n "${NCU_SHAPE:-}" ]; then
  step ncu
  timeout ${NCU_TIMEOUT:-120} ncu --kernel-name regex:small_m_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
    python3 benchmarks/diagnostics/sm90_profile.py --once $NCU_SHAPE > "$OUT/ncu.log" 2>&1
  echo "rc=$?"; grep -E "DRAM Throughput|Memory Throughput|Duration|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Stall|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Grid Size" "$OUT/ncu.log" | head -30
fi

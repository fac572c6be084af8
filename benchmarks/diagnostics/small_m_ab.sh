#!/bin/bash
# One H100 call for an A/B of small-M configs: clean sm_90a build, the small-M correctness tests (every
# config forced), small_m_chain.py over CONFIGS (comma list, forced in turn, same run), and with NCU="cfg M N K;..."
# one ncu pass per entry (speed of light, memory, warp states) of that config on that shape.
#   CONFIGS=<config>,<config> bash benchmarks/diagnostics/small_m_ab.sh      (repo root; wheels in .whl/)
# Knobs: PYTEST_K, PYTEST_TIMEOUT, CLUSTER_MAXES, CHAIN_M, CHAIN_SPLITS, SHAPES, CHAIN_EXTRA, CHAIN_TIMEOUT.
# The build, the other suites and benchmarks: benchmarks/device.sh.
source benchmarks/_device_common.sh
clean_build || exit 1
step tests
timeout "${PYTEST_TIMEOUT:-200}" python3 -m pytest -q -rs -p no:cacheprovider tests/test_sm90.py tests/test_sm90_weight_only.py \
  -k "${PYTEST_K:-small_m or every_config or forced or deterministic or graph}" -x > "$OUT/pytest.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed|Error" "$OUT/pytest.log" | tail -12
for cm in ${CLUSTER_MAXES:-8}; do  # the ring configs' cluster-reduction bound (NVFP4_GEMM_SM90_CLUSTER_MAX)
  step "small_m_chain, cluster max $cm"
  # shellcheck disable=SC2086  # CHAIN_EXTRA holds several arguments
  NVFP4_GEMM_SM90_CLUSTER_MAX=$cm timeout "${CHAIN_TIMEOUT:-300}" python3 benchmarks/diagnostics/small_m_chain.py \
    --m "${CHAIN_M:-1,16}" --splits "${CHAIN_SPLITS:-0}" --shapes "${SHAPES:-1024x4096,6144x4096,28672x4096,4096x14336}" \
    --configs "$CONFIGS" ${CHAIN_EXTRA:-} 2>&1 | grep -v -i warn | sed -e 's/ kernels\/call:.*//' | tee -a "$OUT/chain.log"
done
IFS=';' read -ra runs <<< "${NCU:-}"
for r in "${runs[@]}"; do
  read -r cfg m n k <<< "$r"
  step "ncu $cfg $m $n $k"
  NVFP4_GEMM_CONFIG=$cfg timeout 120 ncu --kernel-name regex:small_m_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
    python3 benchmarks/diagnostics/sm90_profile.py --once "$m" "$n" "$k" > "$OUT/ncu_${m}_${n}.log" 2>&1
  grep -E "DRAM Throughput|Duration|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Grid Size|Stall|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu_${m}_${n}.log" | head -24
done

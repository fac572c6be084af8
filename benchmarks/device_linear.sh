#!/bin/bash
# The linear op on a GPU (issue 12, item 1): the input-scales kernel against the ATen composite bit for
# bit, launches per NVFP4Linear forward, no host sync, CUDA-graph replay, eager host time against F.linear,
# quantize's bandwidth (its kernel gained the static-scale path) and compute-sanitizer on the new kernel.
#   bash benchmarks/device_linear.sh       (repo root, after `python setup.py build_ext --inplace`)
# Logs under $OUT; each step prints its summary.
set -o pipefail
OUT=${OUT:-/tmp/nvfp4_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
step() { echo "== $1 ($(date +%T))"; }
python3 -c "import torch, nvfp4_gemm; print(torch.cuda.get_device_name(), nvfp4_gemm.__file__, nvfp4_gemm.configs())" \
  || exit 1

TESTS="tests/test_linear_op.py tests/test_linear_launches.py tests/test_quantize.py tests/test_nn.py tests/test_nn_modes.py tests/test_errors.py"
step "tests: linear op, launches, quantize, NVFP4Linear, errors (every backend through the fixture)"
timeout 400 python3 -m pytest $TESTS -q -rs -p no:cacheprovider > "$OUT/linear_pytest.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/linear_pytest.log" | tail -15
for be in generic sm90; do
  step "the same with NVFP4_GEMM_BACKEND=$be"
  NVFP4_GEMM_BACKEND=$be NVFP4_GEMM_TEST_BACKENDS=$be timeout 300 python3 -m pytest $TESTS -q -p no:cacheprovider \
    > "$OUT/linear_pytest_$be.log" 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/linear_pytest_$be.log" | tail -8
done

step "launches per forward (ours + mm's own), automatic dispatch"
timeout 200 python3 -m pytest tests/test_linear_launches.py -q -s -p no:cacheprovider -k launches_per_forward 2>&1 \
  | grep -E "launches per forward|passed|failed|Error"

step "host time per forward vs F.linear / nn.Linear (K = N = 4096), and launches"
for dt in float16 bfloat16; do
  for m in 1 16 128; do
    timeout 120 python3 benchmarks/bench_linear_host.py --device cuda --m $m --dtype $dt 2>&1 | tee -a "$OUT/linear_host.log"
  done
done

step "quantize bandwidth (the kernel gained the static-scale path)"
timeout 90 python3 benchmarks/bench_quantize.py > "$OUT/bench_quantize.log" 2>&1; tail -7 "$OUT/bench_quantize.log"

step "compute-sanitizer on the input-scales kernel and the linear op"
cat > "$OUT/linear_sanitize_cases.py" <<'EOF'
import torch, nvfp4_gemm
from torch import nn
torch.manual_seed(0)
ws2 = torch.full((1,), 0.3, device="cuda")
for dt in (torch.float16, torch.bfloat16, torch.float32):
    for rows, k in ((0, 64), (1, 32), (7, 48), (300, 512), (2049, 256)):
        x = torch.randn(rows, k, device="cuda").to(dt)
        torch.ops.nvfp4_gemm._input_scales(x, ws2)
        torch.ops.nvfp4_gemm._input_scales(x, ws2, torch.full((1,), 0.01, device="cuda"))
    base = torch.randn(40, 256, device="cuda").to(dt)
    torch.ops.nvfp4_gemm._input_scales(base[:, 64:192], ws2)
lin = nn.Linear(256, 128).cuda()
for mode in ("dynamic", "static", "weight_only"):
    layer = nvfp4_gemm.NVFP4Linear.from_linear(lin, weight_only=mode == "weight_only",
                                               input_amax=8.0 if mode == "static" else None)
    for m in (1, 40):
        layer(torch.randn(m, 256, device="cuda", dtype=torch.float16))
torch.cuda.synchronize()
print("sanitize cases done")
EOF
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool --print-limit 10 python3 "$OUT/linear_sanitize_cases.py" \
    > "$OUT/linear_sanitize_$tool.log" 2>&1
  echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Race|cases done" "$OUT/linear_sanitize_$tool.log" | head -4
done

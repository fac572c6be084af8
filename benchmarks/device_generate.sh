#!/bin/bash
# The whole-model benchmark of record (issue 26) on an H100, in device calls of at most 10 minutes; the machine
# keeps the build between calls. Logs and JSON under $OUT. From the repository root, wheels in .whl/:
#   PART=build bash benchmarks/device_generate.sh   # build for sm_90a, tests/test_fused.py, the SiLU-mul probe
#   PART=wo      bash benchmarks/device_generate.sh   # bench_generate: fp16, wo, wo_unfused
#   PART=humming bash benchmarks/device_generate.sh   # bench_generate: fp16, wo, humming
#   PART=dynamic bash benchmarks/device_generate.sh   # bench_generate: fp16, dynamic, dynamic_unfused
#   PART=static  bash benchmarks/device_generate.sh   # bench_generate: fp16, static, static_unfused
# (each variant compiles the 32-layer model twice, batch 1 and 16: three variants per call fit 10 minutes)
# LAYERS=8 (say) shortens a part that does not fit (every figure then covers 8 decoder layers).
# transformers must be importable there; where it is not, carry its wheels with the others (the versions CI
# installs), e.g. pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#   --platform manylinux_2_28_x86_64 -d .whl transformers==5.23.0 huggingface-hub==2.4.0 tokenizers==0.23.3 regex
source benchmarks/_device_common.sh
python3 -c "import transformers" 2>/dev/null || { echo "transformers is not importable here: carry its wheels in .whl/ (header)"; exit 3; }

run_bench() {
  step "bench_generate $1"
  timeout ${BENCH_TIMEOUT:-540} python3 benchmarks/bench_generate.py --variants "$1" --layers ${LAYERS:-32} \
    --json "$OUT/gen_$2.json" > "$OUT/gen_$2.log" 2>&1
  echo "rc=$?"; sed -n '/^### bench_generate/,$p' "$OUT/gen_$2.log"; grep -E "Error|error:" "$OUT/gen_$2.log" | head -5
}

case "${PART:-build}" in
  build)
    clean_build || exit 1
    step "tests/test_fused.py"
    timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_fused.py > "$OUT/pytest_fused.log" 2>&1
    echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest_fused.log" | tail -12
    step "diagnostics/silu_mul.py"
    timeout 120 python3 benchmarks/diagnostics/silu_mul.py 2>&1 | tail -8
    ;;
  wo) run_bench fp16,wo,wo_unfused wo ;;
  humming) run_bench fp16,wo,humming humming ;;
  dynamic) run_bench fp16,dynamic,dynamic_unfused dynamic ;;
  static) run_bench fp16,static,static_unfused static ;;
  *) echo "PART must be build, wo, humming, dynamic or static, got '$PART'"; exit 2 ;;
esac

#!/bin/bash
# One H100 call for a session's merged work (fit to 10 minutes): a clean sm_90a build, then the parts named in
# PARTS (default: all, in this order), each under its own timeout, logs and JSON under $OUT:
#   tests     the GPU suites of what this session changed: the small-M kernels (forced configs, grids, graphs),
#             weight-only, the linear op, fused projections, autograd / peft on CUDA, the producers' GPU
#             comparison, the hostile-input tests (PYTEST_FILES / PYTEST_K narrow it)
#   sanitize  compute-sanitizer memcheck over the CUDA mse quantizer and the op-boundary tests
#   generate  benchmarks/bench_generate.py (GEN_VARIANTS, GEN_LAYERS decoder layers)
#   train     benchmarks/bench_train.py (TRAIN_LAYERS layers of the 8B shapes, seq 2048; TRAIN_ARGS="--breakdown
#             --profile" adds where the NVFP4 step's time goes)
#   bash benchmarks/device_session.sh   (repo root; wheels in .whl/: nvidia-cutlass, humming-kernels, and
#   transformers / peft / modelopt where the image's versions differ)
source benchmarks/_device_common.sh

clean_build || exit 1
PARTS=${PARTS:-tests sanitize generate train}

for part in $PARTS; do
  case $part in
    tests)
      step "GPU suites"
      timeout ${PYTEST_TIMEOUT:-240} python3 -m pytest -q -rs -p no:cacheprovider ${PYTEST_FILES:-tests/test_sm90.py \
        tests/test_sm90_weight_only.py tests/test_linear_op.py tests/test_fused.py tests/test_autograd.py \
        tests/test_peft.py tests/test_producers.py tests/test_errors.py} ${PYTEST_K:+-k "$PYTEST_K"} \
        > "$OUT/pytest.log" 2>&1
      echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest.log" | tail -16 ;;
    sanitize)
      step "compute-sanitizer memcheck: mse quantizer, op boundary"
      timeout ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q \
        -p no:cacheprovider tests/test_methods.py tests/test_errors.py -k "mse or meta or names or linear" \
        > "$OUT/sanitize.log" 2>&1
      echo "rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitize.log" | tail -4 ;;
    generate)
      step "bench_generate ${GEN_VARIANTS:-default} x ${GEN_LAYERS:-32} layers"
      timeout ${GEN_TIMEOUT:-240} python3 benchmarks/bench_generate.py ${GEN_VARIANTS:+--variants $GEN_VARIANTS} \
        --layers ${GEN_LAYERS:-32} ${GEN_ARGS:-} --json "$OUT/bench_generate.json" > "$OUT/bench_generate.log" 2>&1
      echo "rc=$?"; sed -n '/^### bench_generate/,$p' "$OUT/bench_generate.log" | head -60
      grep -E "Error|error:" "$OUT/bench_generate.log" | head -5 ;;
    train)
      step "bench_train ${TRAIN_LAYERS:-4} layers"
      timeout ${TRAIN_TIMEOUT:-150} python3 benchmarks/bench_train.py --layers ${TRAIN_LAYERS:-4} ${TRAIN_ARGS:-} \
        --json "$OUT/bench_train.json" > "$OUT/bench_train.log" 2>&1
      echo "rc=$?"; sed -n '/^### bench_train/,$p' "$OUT/bench_train.log" | head -60
      grep -E "Error|error:" "$OUT/bench_train.log" | head -5 ;;
    *) echo "unknown part '$part' (tests, sanitize, generate, train)"; exit 2 ;;
  esac
done

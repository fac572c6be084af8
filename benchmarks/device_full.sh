#!/bin/bash
# One call on a GPU machine: clean build, the whole test suite (auto dispatch, then each backend forced),
# the selftest and the first-use self-check, the main job, the Hopper / quantize / model benchmarks and
# compute-sanitizer. Logs under $OUT. The model-facing benchmarks (bench_mm.py, bench_model.py) take a call
# of their own: benchmarks/README.md.
#   bash benchmarks/device_full.sh            (repo root; CUTLASS wheel in .whl/ if pip has no network;
#                                              the MiniLM model package under .model/ if not installed)
source benchmarks/_device_common.sh
export PYTHONPATH=$PWD/.model:$PYTHONPATH HF_HUB_OFFLINE=1

clean_build || exit 1

step "tests, automatic dispatch + every backend through the fixture"
timeout 300 python3 -m pytest tests -q -rs -p no:cacheprovider --deselect tests/test_sm100_host.py > "$OUT/pytest.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest.log" | tail -15
for be in generic sm90; do
  step "tests, NVFP4_GEMM_BACKEND=$be for every CUDA call"
  NVFP4_GEMM_BACKEND=$be NVFP4_GEMM_TEST_BACKENDS=$be timeout 200 python3 -m pytest tests -q -p no:cacheprovider \
    --deselect tests/test_sm100_host.py > "$OUT/pytest_$be.log" 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest_$be.log" | tail -8
done

step "selftest (and the first-use self-check, exercised on the sm90 configs with NVFP4_GEMM_SELFCHECK=1)"
python3 -m nvfp4_gemm --selftest > "$OUT/selftest.log" 2>&1; echo "rc=$?"; tail -14 "$OUT/selftest.log"
NVFP4_GEMM_SELFCHECK=1 timeout 120 python3 -m pytest tests/test_mm.py tests/test_weight_only.py -q -p no:cacheprovider \
  -W error::UserWarning > "$OUT/pytest_selfcheck.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest_selfcheck.log" | tail -6

step "main job"
python3 -m nvfp4_gemm --json "$OUT/main.json" 2>&1 | tee "$OUT/main.log"
NVFP4_GEMM_BACKEND=generic python3 -m nvfp4_gemm 2>&1 | tee "$OUT/main_generic.log"

step "benchmarks"
timeout 240 python3 benchmarks/bench_sm90.py --out "$OUT" --shapes targets > "$OUT/bench_sm90.log" 2>&1; tail -14 "$OUT/bench_sm90.log"
timeout 90 python3 benchmarks/bench_quantize.py > "$OUT/bench_quantize.log" 2>&1; tail -7 "$OUT/bench_quantize.log"
timeout 120 python3 examples/minilm_embeddings.py --device cuda --dtype float16 --record benchmarks/RESULTS.md > "$OUT/minilm.log" 2>&1
tail -4 "$OUT/minilm.log"

step sanitizer
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --print-limit 10 python3 benchmarks/diagnostics/sm90_sanitize_cases.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Race" "$OUT/sanitize_$tool.log" | head -4
done
cp benchmarks/RESULTS.md "$OUT/RESULTS.md"

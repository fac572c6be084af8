#!/bin/bash
# The GPU-machine driver: runs the steps named on its command line, in that order, from the repository root,
# each run under its own timeout, logs and JSON under $OUT (default /tmp/nvfp4_out). Nothing is built unless
# a step says so: a fresh machine starts with `build`; a warm one keeps the build between calls.
#
#   bash benchmarks/device.sh build tests sanitize
#   GEN_VARIANTS=fp16,wo,humming bash benchmarks/device.sh generate
#   bash benchmarks/device.sh --help                 (this text)
#
# Steps (knobs are environment variables; *_TIMEOUT is in seconds, per run):
#   build      clean in-place build for NVFP4_GEMM_CUDA_ARCHS (9.0a) with MAX_JOBS jobs (one per core), then
#              the device and the built configs; a failed build stops the driver
#   diagbuild  the same with NVFP4_GEMM_DIAGNOSTICS=1 (kernel timeline traces, for `diag` with sm90_trace.py or
#              wk_trace.py); not for timing: `build` again before the other steps
#   tests      pytest over PYTEST_FILES (default: tests/ less tests/test_sm100_host.py), -k PYTEST_K, more
#              PYTEST_ARGS (e.g. -x); then once per backend of PYTEST_BACKENDS (e.g. "generic sm90") with
#              every CUDA call forced to it. PYTEST_TIMEOUT (300)
#   selftest   python -m nvfp4_gemm --selftest (every dispatch entry here), then tests/test_mm.py and
#              test_weight_only.py with the first-use self-check on, its warnings as errors. SELFTEST_TIMEOUT (180)
#   main       python -m nvfp4_gemm (the GPU MODE shapes, checked and timed) under automatic dispatch, then
#              with NVFP4_GEMM_BACKEND=generic. MAIN_TIMEOUT (120)
#   sanitize   compute-sanitizer: each tool of SANITIZE_TOOLS (memcheck racecheck) over each script of
#              SANITIZE_CASES (diagnostics/sm90_sanitize_cases.py and linear_sanitize_cases.py; the grouped cases,
#              diagnostics/grouped_sanitize_cases.py and sm90_grouped_sanitize_cases.py, when named), then memcheck
#              over the CUDA mse quantizer and op-boundary tests: SANITIZE_FILES (tests/test_methods.py
#              tests/test_errors.py), -k SANITIZE_K. SANITIZE_CASES= or SANITIZE_FILES= leaves a part out.
#              SANITIZE_TIMEOUT (150)
#   mm         bench_mm.py MM_ARGS. MM_TIMEOUT (330)
#   model      bench_model.py MODEL_ARGS (--stacks 8b), a chart beside the JSON. MODEL_TIMEOUT (240)
#   generate   bench_generate.py, GEN_VARIANTS (default: all eight; three fit one 10-minute call) on GEN_LAYERS
#              (32) decoder layers, more GEN_ARGS; needs transformers. GEN_TIMEOUT (540)
#   moe        bench_moe.py (one MoE layer's gate_up + down beside bf16 grouped_mm, humming and the read floor) with
#              MOE_ARGS (default --quick), its tables from $OUT/bench_moe.md. MOE_TIMEOUT (300)
#   moe_model  bench_moe_model.py (a transformers Qwen3-MoE with Qwen3-30B-A3B's shapes, decode steps and prefill)
#              with MOE_MODEL_ARGS (default --quick); needs transformers. MOE_MODEL_TIMEOUT (400)
#   train      tests/test_decode_op.py, test_autograd.py and test_peft.py on the CUDA backends; bench_train.py
#              on TRAIN_LAYERS (4) layers with TRAIN_ARGS (--profile --breakdown; TRAIN_ARGS= for none);
#              examples/lora_finetune.py (8B-shaped, 2 layers, 30 steps); with TRAIN_CKPT=1, bench_train.py
#              with activation checkpointing; needs peft (and accelerate). TRAIN_TIMEOUT (180)
#   methods    tests/test_methods.py and test_quantize.py (the mse search on CUDA bit for bit against the CPU's),
#              memcheck over the CUDA mse tests, bench_methods.py (rtn vs mse). METHODS_TIMEOUT (400)
#   quantize   bench_quantize.py. QUANTIZE_TIMEOUT (90)
#   linear     NVFP4Linear's kernel launches per forward, then bench_linear_host.py (host time per forward
#              against F.linear) for each dtype of LINEAR_DTYPES (float16 bfloat16) and M of LINEAR_M
#              (1 16 128). LINEAR_TIMEOUT (200)
#   minilm     examples/minilm_embeddings.py on CUDA in fp16 (the model package from .model/ where not
#              installed). MINILM_TIMEOUT (120)
#   small_m    diagnostics/small_m_chain.py: the 8B stack's shapes at CHAIN_M (1,16) tokens, forced splits
#              CHAIN_SPLITS (0,4,8), more CHAIN_ARGS. CHAIN_TIMEOUT (200)
#   multi_gpu  the GPUs, then tests/test_multi_gpu.py (needs two). MULTI_GPU_TIMEOUT (240)
#   sm90       diagnostics/bench_sm90.py (do_bench, sm90 against cuBLAS) SM90_ARGS (--shapes targets); JSON,
#              Markdown and chart in $OUT. SM90_TIMEOUT (240)
#   ncu        Nsight Compute over the sm90 GEMM kernel (NCU_KERNEL, a regex) of each shape of NCU_SHAPES
#              ("M,N,K ...", default 128,7168,2048): speed of light, memory, compute, warp states, scheduler,
#              launch, occupancy; more NCU_ARGS (e.g. "--clock-control none"); NCU_STALLS=1 adds a pass for
#              every stall reason per issued instruction, NCU_SOURCE=1 one for the warp stall samples of each SASS
#              instruction (its CSV and the hottest instructions, diagnostics/ncu_source_top.py). NCU_CMD runs a
#              diagnostics script instead of the shapes and profiles the first matching kernel it launches, e.g.
#              NCU_KERNEL=gemm_kernel NCU_CMD="sm90_grouped_bench.py --tokens 1024 --shapes qwen3 --a bf16
#              --configs 4" (the grouped wgmma form on Qwen3's gate_up). NCU_TIMEOUT (120)
#   diag       each ';'-separated command of DIAG as `python3 benchmarks/diagnostics/COMMAND`, e.g.
#              DIAG="silu_mul.py; sm90_profile.py auto 2 4; sm90_grouped_bench.py --tokens 1,16". DIAG_TIMEOUT (150)
#
# Tables meant for benchmarks/RESULTS.md (bench_quantize, bench_methods, minilm) are appended to
# $OUT/record.md. The device's copy of the tree has no .git: NVFP4_GEMM_COMMIT=<commit> names the commit in
# the benchmarks' metadata. Wheels the machine lacks (nvidia-cutlass for the build; humming-kernels,
# transformers, peft, accelerate where a step needs them) are carried in .whl/ (benchmarks/README.md).
# Exit status: 2 for a bad command line (nothing runs), 1 if the build or any run failed, else 0.

# The knobs that hold several arguments (*_ARGS, *_FILES, the lists) are split on spaces on purpose.
# shellcheck disable=SC2086
STEPS=(build diagbuild tests selftest main sanitize mm model generate moe moe_model train methods quantize linear minilm
       small_m multi_gpu sm90 ncu diag)

usage() { sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; }
if [ $# = 0 ]; then usage >&2; exit 2; fi
case $1 in -h|--help) usage; exit 0 ;; esac
for s in "$@"; do
  [[ " ${STEPS[*]} " == *" $s "* ]] || { echo "device.sh: unknown step '$s'; the steps are: ${STEPS[*]}" >&2; exit 2; }
done
[[ " $* " != *" diag "* || -n ${DIAG:-} ]] || { echo "device.sh: the diag step needs DIAG (see --help)" >&2; exit 2; }

source benchmarks/_device_common.sh
case $1 in
  build|diagbuild) ;;
  *) ls nvfp4_gemm/*.so > /dev/null 2>&1 || { echo "device.sh: nvfp4_gemm is not built here: start with the build step"; exit 1; } ;;
esac

failed=()  # the runs that returned non-zero

# run NAME LIMIT CMD...: CMD under `timeout LIMIT`, its output in $OUT/NAME.log; prints and returns its rc.
run() {
  local name=$1 limit=$2 rc; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "rc=$rc"; [ $rc = 0 ] || failed+=("$name")
  return $rc
}

# pytest_run NAME LIMIT ARGS...: pytest ARGS, then its failures, errors, skips and counts.
pytest_run() {
  local name=$1 limit=$2; shift 2
  run "$name" "$limit" python3 -m pytest -q -rsfE -p no:cacheprovider "$@"
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|no tests ran" "$OUT/$name.log" | tail -15
}

# sanitize_run NAME TOOL LIMIT CMD...: CMD under compute-sanitizer TOOL, then the sanitizer's summary.
sanitize_run() {
  local name=$1 tool=$2 limit=$3; shift 3
  echo -n "$tool "; run "$name" "$limit" compute-sanitizer --tool "$tool" --print-limit 10 --error-exitcode 9 "$@"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize cases ran|passed|failed" "$OUT/$name.log" | tail -4
  grep -A4 -m2 "Race reported" "$OUT/$name.log"
}

# report NAME SCRIPT: the log's Markdown report (from SCRIPT's "### " heading on) and its first error lines.
report() {
  sed -n "/^### $2/,\$p" "$OUT/$1.log" | head -60
  grep -E "Error|error:" "$OUT/$1.log" | head -5
}

# need MODULE: whether MODULE imports here; says how to carry it if not.
need() {
  python3 -c "import $1" > /dev/null 2>&1 && return
  echo "$1 is not importable here: carry its wheels in .whl/ (benchmarks/README.md)"; failed+=("$step_name:$1"); return 1
}

# ncu_run NAME M N K NCU_OPTIONS...: one Nsight Compute pass over the third of three calls of shape M N K, or, with
# NCU_CMD (a script of benchmarks/diagnostics/ and its arguments), over the first matching kernel that command runs.
ncu_run() {
  local name=$1 m=$2 n=$3 k=$4; shift 4
  local skip=2 target=(benchmarks/diagnostics/sm90_profile.py --once "$m" "$n" "$k")
  if [ -n "${NCU_CMD:-}" ]; then
    read -ra target <<< "$NCU_CMD"; target[0]=benchmarks/diagnostics/${target[0]}; skip=0
  fi
  run "$name" "${NCU_TIMEOUT:-120}" ncu --kernel-name "regex:${NCU_KERNEL:-gemm_kernel|small_m_kernel|wk_kernel}" \
    --launch-skip "$skip" --launch-count 1 "$@" ${NCU_ARGS:-} python3 "${target[@]}"
}

for step_name in "$@"; do
  case $step_name in
    build)
      clean_build || exit 1
      python3 -c "import json, torch, nvfp4_gemm; print(torch.cuda.get_device_name(), json.dumps(nvfp4_gemm.configs()))" ;;
    diagbuild)
      NVFP4_GEMM_DIAGNOSTICS=1 clean_build build_diag || exit 1 ;;
    tests)
      files=${PYTEST_FILES:-tests --deselect tests/test_sm100_host.py}
      step "tests: $files${PYTEST_K:+ -k $PYTEST_K}"
      pytest_run pytest "${PYTEST_TIMEOUT:-300}" $files ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-}
      for be in ${PYTEST_BACKENDS:-}; do
        step "the same with NVFP4_GEMM_BACKEND=$be for every CUDA call"
        NVFP4_GEMM_BACKEND=$be NVFP4_GEMM_TEST_BACKENDS=$be pytest_run "pytest_$be" "${PYTEST_TIMEOUT:-300}" \
          $files ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-}
      done ;;
    selftest)
      step selftest
      run selftest "${SELFTEST_TIMEOUT:-180}" python3 -m nvfp4_gemm --selftest; tail -14 "$OUT/selftest.log"
      step "first-use self-check (NVFP4_GEMM_SELFCHECK=1): tests/test_mm.py, tests/test_weight_only.py"
      NVFP4_GEMM_SELFCHECK=1 pytest_run pytest_selfcheck "${SELFTEST_TIMEOUT:-180}" tests/test_mm.py \
        tests/test_weight_only.py -W error::UserWarning ;;
    main)
      step "main job, automatic dispatch"
      run main "${MAIN_TIMEOUT:-120}" python3 -m nvfp4_gemm --json "$OUT/main.json"; cat "$OUT/main.log"
      step "main job, NVFP4_GEMM_BACKEND=generic"
      NVFP4_GEMM_BACKEND=generic run main_generic "${MAIN_TIMEOUT:-120}" python3 -m nvfp4_gemm; cat "$OUT/main_generic.log" ;;
    sanitize)
      cases_scripts=${SANITIZE_CASES-benchmarks/diagnostics/sm90_sanitize_cases.py benchmarks/diagnostics/linear_sanitize_cases.py}
      for cases in $cases_scripts; do
        for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
          step "compute-sanitizer $tool: $cases"
          sanitize_run "sanitize_${tool}_$(basename "$cases" .py)" "$tool" "${SANITIZE_TIMEOUT:-150}" python3 "$cases"
        done
      done
      files=${SANITIZE_FILES-tests/test_methods.py tests/test_errors.py}
      if [ -n "$files" ]; then
        step "compute-sanitizer memcheck: mse quantizer, op boundary ($files)"
        sanitize_run sanitize_tests memcheck "${SANITIZE_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider $files \
          -k "${SANITIZE_K:-mse or meta or names or linear}"
      fi ;;
    mm)
      step bench_mm
      run bench_mm "${MM_TIMEOUT:-330}" python3 benchmarks/bench_mm.py ${MM_ARGS:-} --json "$OUT/bench_mm.json"
      tail -40 "$OUT/bench_mm.log" ;;
    model)
      step bench_model
      run bench_model "${MODEL_TIMEOUT:-240}" python3 benchmarks/bench_model.py ${MODEL_ARGS:---stacks 8b} \
        --json "$OUT/bench_model.json" --png "$OUT/bench_model.png"
      tail -30 "$OUT/bench_model.log" ;;
    generate)
      step "bench_generate ${GEN_VARIANTS:-(every variant)} x ${GEN_LAYERS:-32} layers"
      need transformers || continue
      run bench_generate "${GEN_TIMEOUT:-540}" python3 benchmarks/bench_generate.py ${GEN_VARIANTS:+--variants "$GEN_VARIANTS"} \
        --layers "${GEN_LAYERS:-32}" ${GEN_ARGS:-} --json "$OUT/bench_generate.json"
      report bench_generate bench_generate ;;
    moe)
      step "bench_moe ${MOE_ARGS:---quick}"
      run bench_moe "${MOE_TIMEOUT:-300}" python3 benchmarks/bench_moe.py ${MOE_ARGS:---quick} --out "$OUT"
      grep -E "^\||^\*\*" "$OUT/bench_moe.md" 2>/dev/null | head -80 || tail -20 "$OUT/bench_moe.log" ;;
    moe_model)
      step "bench_moe_model ${MOE_MODEL_ARGS:---quick}"
      need transformers || continue
      run bench_moe_model "${MOE_MODEL_TIMEOUT:-400}" python3 benchmarks/bench_moe_model.py ${MOE_MODEL_ARGS:---quick} \
        --json "$OUT/bench_moe_model.json"
      grep -E "^\||^- |profile" "$OUT/bench_moe_model.log" | tail -30 ;;
    train)
      step "tests: decode op, autograd, peft (CUDA backends)"
      need peft || continue
      NVFP4_GEMM_TEST_BACKENDS=${NVFP4_GEMM_TEST_BACKENDS:-generic,sm90} pytest_run pytest_train "${TRAIN_TIMEOUT:-180}" \
        tests/test_decode_op.py tests/test_autograd.py tests/test_peft.py
      step "bench_train: 8B-shaped x ${TRAIN_LAYERS:-4} layers, seq 2048, batch 1"
      run bench_train "${TRAIN_TIMEOUT:-180}" python3 benchmarks/bench_train.py --layers "${TRAIN_LAYERS:-4}" \
        ${TRAIN_ARGS---profile --breakdown} --json "$OUT/bench_train.json"
      report bench_train bench_train
      step "examples/lora_finetune.py: 8B-shaped, 2 layers"
      run lora_finetune "${TRAIN_TIMEOUT:-180}" python3 examples/lora_finetune.py --model llama8b --layers 2 --device cuda \
        --dtype bfloat16 --steps 30 --seq-len 512 --batch 1 --lr 1e-3 --log-every 10 --no-progress \
        --json "$OUT/lora_finetune.json"
      tail -8 "$OUT/lora_finetune.log"
      if [ "${TRAIN_CKPT:-0}" = 1 ]; then
        step "bench_train with activation checkpointing"
        run bench_train_ckpt "${TRAIN_TIMEOUT:-180}" python3 benchmarks/bench_train.py --layers "${TRAIN_LAYERS:-4}" \
          --grad-checkpointing --json "$OUT/bench_train_ckpt.json"
        report bench_train_ckpt bench_train
      fi ;;
    methods)
      step "tests: methods (CPU and CUDA mse bitwise), quantize"
      pytest_run pytest_methods "${METHODS_TIMEOUT:-400}" tests/test_methods.py tests/test_quantize.py
      step "compute-sanitizer memcheck: CUDA mse tests"
      sanitize_run sanitize_mse memcheck "${METHODS_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider \
        tests/test_methods.py -k "cuda and not large"
      step "bench_methods: rtn vs mse on the 8B-shaped stack"
      run bench_methods "${METHODS_TIMEOUT:-400}" python3 benchmarks/bench_methods.py --json "$OUT/bench_methods.json" \
        --record "$OUT/record.md"
      cat "$OUT/bench_methods.log" ;;
    quantize)
      step bench_quantize
      run bench_quantize "${QUANTIZE_TIMEOUT:-90}" python3 benchmarks/bench_quantize.py --record "$OUT/record.md"
      tail -7 "$OUT/bench_quantize.log" ;;
    linear)
      step "launches per forward (ours + mm's own), automatic dispatch"
      pytest_run linear_launches "${LINEAR_TIMEOUT:-200}" tests/test_linear_launches.py -s -k launches_per_forward
      grep "launches per forward" "$OUT/linear_launches.log"
      step "host time per forward against F.linear / nn.Linear (K = N = 4096), and launches"
      for dt in ${LINEAR_DTYPES:-float16 bfloat16}; do
        for m in ${LINEAR_M:-1 16 128}; do
          run "linear_host_${dt}_m$m" "${LINEAR_TIMEOUT:-200}" python3 benchmarks/bench_linear_host.py --device cuda \
            --m "$m" --dtype "$dt"
          cat "$OUT/linear_host_${dt}_m$m.log"
        done
      done ;;
    minilm)
      step "examples/minilm_embeddings.py, CUDA, fp16"
      run minilm "${MINILM_TIMEOUT:-120}" python3 examples/minilm_embeddings.py --device cuda --dtype float16 \
        --record "$OUT/record.md"
      tail -4 "$OUT/minilm.log" ;;
    small_m)
      step "small_m_chain, M = ${CHAIN_M:-1,16}, splits ${CHAIN_SPLITS:-0,4,8}"
      run small_m_chain "${CHAIN_TIMEOUT:-200}" python3 benchmarks/diagnostics/small_m_chain.py --m "${CHAIN_M:-1,16}" \
        --splits "${CHAIN_SPLITS:-0,4,8}" ${CHAIN_ARGS:-}
      grep -v -i warn "$OUT/small_m_chain.log" ;;
    multi_gpu)
      step "two-GPU test"
      nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
      run multi_gpu "${MULTI_GPU_TIMEOUT:-240}" python3 -m pytest -v -rsfE -p no:cacheprovider -s tests/test_multi_gpu.py
      grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|not run" "$OUT/multi_gpu.log" | tail -20 ;;
    sm90)
      step "diagnostics/bench_sm90.py ${SM90_ARGS:---shapes targets}"
      run bench_sm90 "${SM90_TIMEOUT:-240}" python3 benchmarks/diagnostics/bench_sm90.py --out "$OUT" ${SM90_ARGS:---shapes targets}
      tail -14 "$OUT/bench_sm90.log" ;;
    ncu)
      for shape in ${NCU_SHAPES:-128,7168,2048}; do
        read -r m n k <<< "${shape//,/ }"
        tag=${m}_${n}_$k what="M = $m, N = $n, K = $k"  # the logs' names and the steps' words
        [ -z "${NCU_CMD:-}" ] || tag=cmd what=$NCU_CMD
        step "ncu, $what"
        ncu_run "ncu_$tag" "$m" "$n" "$k" --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats \
          --section Occupancy
        grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|L2 Hit|Mem Busy|Max Bandwidth|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|Registers Per|Achieved Occupancy|Grid Size" \
          "$OUT/ncu_$tag.log" | head -40
        if [ "${NCU_STALLS:-0}" = 1 ]; then
          step "ncu, stall reasons per issued instruction, $what"
          ncu_run "ncu_stalls_$tag" "$m" "$n" "$k" \
            --metrics "regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$"
          grep "stalled" "$OUT/ncu_stalls_$tag.log" | head -30
        fi
        if [ "${NCU_SOURCE:-0}" = 1 ]; then
          step "ncu, warp stall samples per SASS instruction, $what"
          ncu_run "ncu_source_$tag" "$m" "$n" "$k" --section SourceCounters --section WarpStateStats \
            --export "$OUT/ncu_source_$tag" --force-overwrite
          ncu --import "$OUT/ncu_source_$tag.ncu-rep" --page source --csv --print-source sass \
            > "$OUT/ncu_source_$tag.csv" 2>&1 || echo "ncu --page source failed (see the .csv)"
          python3 benchmarks/diagnostics/ncu_source_top.py "$OUT/ncu_source_$tag.csv" | head -40
        fi
        [ -z "${NCU_CMD:-}" ] || break  # NCU_CMD names its own problem: one pass
      done ;;
    diag)
      i=0
      IFS=';' read -ra commands <<< "$DIAG"
      for command in "${commands[@]}"; do
        read -ra words <<< "$command"
        [ ${#words[@]} -gt 0 ] || continue
        i=$((i + 1)); name=diag${i}_$(basename "${words[0]}" .py)
        step "diagnostics/${words[*]}"
        run "$name" "${DIAG_TIMEOUT:-150}" python3 "benchmarks/diagnostics/${words[0]}" "${words[@]:1}"
        grep -v -i warn "$OUT/$name.log" | tail -80
      done ;;
  esac
done

if [ ${#failed[@]} -gt 0 ]; then echo "== failed: ${failed[*]}"; exit 1; fi
echo "== done, every run returned 0"

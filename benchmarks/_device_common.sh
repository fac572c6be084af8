# Sourced (from the repository root) by the one-call device scripts benchmarks/device_*.sh: the set-up they
# share. Wheels the machine lacks, carried in .whl/, go to /tmp/site; the build is for NVFP4_GEMM_CUDA_ARCHS
# (default sm_90a) with MAX_JOBS jobs (default 16); logs go under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/nvfp4_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
export NVFP4_GEMM_CUDA_ARCHS=${NVFP4_GEMM_CUDA_ARCHS:-9.0a} MAX_JOBS=${MAX_JOBS:-16}

step() { echo "== $1 ($(date +%T))"; }

# A clean in-place build (a reused machine keeps old objects whose mtimes can beat the sources'); prints
# its wall time, or the log's tail and returns 1 if it failed.
clean_build() {
  step build
  rm -rf build nvfp4_gemm/*.so
  (time python3 setup.py build_ext --inplace) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; return 1; }
  grep -E "nvfp4_gemm build|^real" "$OUT/build.log"
}

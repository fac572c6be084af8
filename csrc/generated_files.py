"""What the arch generators (csrc/sm90, sm100, sm120 /generate.py) share: writing their rendered files into their
generated/ folder, or checking that it is current, and their command line.

    python csrc/<arch>/generate.py           # rewrite generated/
    python csrc/<arch>/generate.py --check   # exit 1 if generated/ is stale
"""
from __future__ import annotations

import argparse
import os

# (file suffix, CUTLASS element, OutDtype enumerator): the output dtypes of the CUTLASS generators' kernels.
OUT_DTYPES = (
    ("f16", "cutlass::half_t", "kFloat16"),
    ("bf16", "cutlass::bfloat16_t", "kBFloat16"),
    ("f32", "float", "kFloat32"),
)


def sync(want: dict[str, str], out_dir: str, check: bool) -> int:
    """Makes out_dir hold exactly `want` (file name -> text), touching only what differs; with check, changes
    nothing and returns 1 (naming the stale files) where out_dir differs from it."""
    have = {f: open(os.path.join(out_dir, f)).read() for f in (os.listdir(out_dir) if os.path.isdir(out_dir) else [])}
    script = os.path.join(os.path.relpath(os.path.dirname(out_dir)), "generate.py")
    if check:
        stale = sorted(f for f in set(want) | set(have) if want.get(f) != have.get(f))
        if stale:
            print(f"{os.path.relpath(out_dir)} is stale (run python {script}): " + ", ".join(stale))
            return 1
        return 0
    os.makedirs(out_dir, exist_ok=True)
    for f in set(have) - set(want):
        os.remove(os.path.join(out_dir, f))
    for f, text in want.items():
        if have.get(f) != text:
            with open(os.path.join(out_dir, f), "w") as fh:
                fh.write(text)
    print(f"{len(want)} files in {os.path.relpath(out_dir)}")
    return 0


def main(doc: str, render, out_dir: str, argv: list[str] | None = None) -> int:
    """A generator's command line: render() -> {file: text}, synced into out_dir (or checked, --check)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if generated/ differs from a fresh render")
    args = ap.parse_args(argv)
    return sync(render(), out_dir, args.check)

"""The hottest SASS instructions of one kernel from Nsight Compute's source page, and the warp stall samples summed
per opcode: where a kernel's warps wait, instruction by instruction (device.sh's ncu step with NCU_SOURCE=1 writes
the CSV: `ncu --import REPORT --page source --csv --print-source sass`).

    python benchmarks/diagnostics/ncu_source_top.py REPORT.csv [--top 25]
"""
import argparse
import csv
import sys
from collections import defaultdict


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if "Source" in r and any("Sampling" in c for c in r)), None)
    if head is None:
        print(f"{args.csv}: no header with 'Source' and a 'Warp Stall Sampling' column; its first lines:")
        for r in rows[:5]:
            print("  ", r[:12])
        return 1
    cols = rows[head]
    src = cols.index("Source")
    sampling = [i for i, c in enumerate(cols) if "Sampling" in c]  # "Warp Stall Sampling (All Samples)" first
    samples = next((i for i in sampling if "(All" in cols[i]), sampling[0])
    addr = cols.index("Address") if "Address" in cols else None
    body = [r for r in rows[head + 1:] if len(r) == len(cols)]
    total = sum(number(r[samples]) for r in body) or 1.0
    per_op = defaultdict(float)
    for r in body:
        words = r[src].split()
        op = next((w for w in words if not w.startswith("@")), "?").split(".")[0]
        per_op[op] += number(r[samples])
    print(f"{len(body)} instructions, {total:.0f} warp stall samples; per opcode (share of samples):")
    for op, v in sorted(per_op.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {op:12s} {100 * v / total:5.1f}%")
    print(f"hottest {args.top} instructions:")
    for r in sorted(body, key=lambda r: -number(r[samples]))[:args.top]:
        where = r[addr] if addr is not None else ""
        print(f"  {100 * number(r[samples]) / total:5.1f}%  {where:>8s}  {r[src][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Sums kernel times per kernel name over one prefill of a `kiln bench model` run profiled by
Nsight Compute with a single metric, so every kernel (cuBLASLt's included) is timed alone:

  ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
      kiln bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights \\
      --batch-sizes 1 --decode-steps 1 --prompt-len 8000 [--activation-dtype bf16] > k.csv
  scripts/ncu-kernel-sum.py k.csv

A prefill starts at an embedding kernel; the bench runs a warm-up prefill, then the measured one,
and its decode steps replay CUDA graphs, whose kernels Nsight Compute does not list. So the last
segment (--segment -1, the default) is the measured prefill; --segment all sums everything from the
first prefill on (a run with --no-warmup --enforce-eager, as scripts/gpu-check.sh profiles; the
weight fills and other set-up before it are left out). The kernel times are
serialised (Nsight Compute runs one kernel at a time), so their sum is an upper bound of the GPU time.

Usage: scripts/ncu-kernel-sum.py K.csv [--segment -1|all] [--top 30] [--json OUT]
"""
import argparse
import csv
import json
import re
from collections import defaultdict


def short_name(name):
    if name.startswith("void "):
        name = name[len("void ") :]
    name = re.sub(r"kiln::|ops::|cuda::|moe_detail::|\(anonymous namespace\)::|<unnamed>::", "", name)
    depth, out = 0, []
    for ch in name:  # drop the argument list, keep template arguments
        if ch == "(" and depth == 0 and out and out[-1] != "<":
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    return "".join(out)[:90]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--segment", default="-1", help="which prefill (segments start at embedding kernels), or all")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", help="write the per-kernel table here")
    args = ap.parse_args()

    with open(args.csv) as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    kernels = []
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        units = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
        scale = units.get(r["Metric Unit"])
        if scale is None:
            raise SystemExit(f"unknown unit {r['Metric Unit']!r}")
        kernels.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale))
    starts = [i for i, (n, _) in enumerate(kernels) if short_name(n) == "embedding_kernel"]
    if args.segment == "all":
        # From the first prefill on: what runs before it (the random weights' fill kernels, 24 ms of a
        # Moonlight run on H200, more than a 2k prefill) is set-up, not the work being profiled.
        seg = kernels[starts[0] :] if starts else kernels
    else:
        if not starts:
            raise SystemExit("no embedding kernel: not a kiln bench model profile")
        if not -len(starts) <= int(args.segment) < len(starts):
            raise SystemExit(f"--segment {args.segment}: the file has {len(starts)} prefills")
        seg_start = starts[int(args.segment)]
        later = [s for s in starts if s > seg_start]
        seg = kernels[seg_start : later[0] if later else len(kernels)]

    total, count = defaultdict(float), defaultdict(int)
    for name, us in seg:
        total[short_name(name)] += us
        count[short_name(name)] += 1
    all_us = sum(total.values()) or 1.0  # shares of an all-zero table print as 0
    print(f"{len(seg)} kernels, {all_us:.0f} us in all (serialised)")
    print(f"{'us':>10} {'share':>6} {'calls':>5} {'us/call':>9}  kernel")
    table = []
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        table.append({"kernel": name, "us": us, "calls": count[name]})
        if len(table) <= args.top:
            print(f"{us:10.0f} {100 * us / all_us:5.1f}% {count[name]:5d} {us / count[name]:9.1f}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernels": len(seg), "us": all_us, "table": table}, f, indent=1)


if __name__ == "__main__":
    main()

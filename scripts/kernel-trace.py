#!/usr/bin/env python3
"""Reads a KILN_KERNEL_TRACE file (src/ops/cuda/kernel_trace.h) and prints where a step's
critical path goes: each kernel's cost is the time from its release (the kernel before it done)
to the next kernel's release. Kernels that never call pdl_wait are not in the trace; their time
lands on the traced kernel before them. A kernel followed by a gap longer than --gap-us (host work
between steps: each step's last traced kernel, the sampler's) has no cost and is left out, so the
totals are sums over the traced kernels, not whole steps; eager launches (a prefill) are in them
too. trace_phase() stamps print as times after their kernel's release. "early" is how long before
its release CTA 0 reached its wait.

Usage: scripts/kernel-trace.py TRACE.csv [--gap-us 400] [--json OUT] [--step]
"""
import argparse
import csv
import json
import statistics
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--gap-us", type=float, default=400.0, help="costs above this are host gaps, left out")
    ap.add_argument("--json", help="write the per-kernel table here")
    ap.add_argument("--step", action="store_true", help="also print the last step's chain, kernel by kernel")
    args = ap.parse_args()

    rows, phases = [], defaultdict(dict)  # phases: grid_id -> {phase: ns} (trace_phase stamps)
    with open(args.trace) as f:
        for r in csv.DictReader(f):
            if int(r["ctas"]) == 0:
                phases[r["grid_id"]][int(r["threads"])] = int(r["enter_ns"])
                continue
            rows.append((int(r["release_ns"]), int(r["enter_ns"]), r["kernel"], int(r["ctas"]), int(r["threads"]),
                         r["grid_id"]))
    rows.sort()
    if len(rows) < 2:
        raise SystemExit(f"{args.trace}: fewer than two kernels traced")

    by_kernel = defaultdict(lambda: {"cost": [], "early": [], "phases": defaultdict(list)})
    chain = []  # (kernel, ctas, threads, cost_us, early_us) of the last uninterrupted run
    total = 0.0
    for (rel, ent, name, ctas, threads, gid), nxt in zip(rows, rows[1:]):
        cost = (nxt[0] - rel) / 1e3
        early = (rel - ent) / 1e3
        if cost > args.gap_us:
            chain = []
            continue
        key = f"{name} [{ctas}x{threads}]"
        by_kernel[key]["cost"].append(cost)
        by_kernel[key]["early"].append(early)
        for ph, t in phases.get(gid, {}).items():
            by_kernel[key]["phases"][ph].append((t - rel) / 1e3)
        total += cost
        chain.append((name, ctas, threads, cost, early))

    table = []
    for key, v in by_kernel.items():
        s = sum(v["cost"])
        table.append({
            "kernel": key, "launches": len(v["cost"]), "total_us": s, "share": s / total,
            "median_us": statistics.median(v["cost"]),
            "waiting_before_release_us": statistics.median(v["early"]),
            "phase_median_us": {ph: statistics.median(t) for ph, t in sorted(v["phases"].items())},
        })
    table.sort(key=lambda t: -t["total_us"])
    print(f"{'kernel [ctas x threads]':60s} {'launches':>8s} {'total ms':>9s} {'share':>6s} "
          f"{'median us':>9s} {'early us':>8s}")
    for t in table:
        print(f"{t['kernel'][:60]:60s} {t['launches']:8d} {t['total_us'] / 1e3:9.3f} {100 * t['share']:5.1f}% "
              f"{t['median_us']:9.2f} {t['waiting_before_release_us']:8.2f}")
    for t in table:
        if t["phase_median_us"]:
            stamps = ", ".join(f"phase {ph} at {us:.2f}" for ph, us in t["phase_median_us"].items())
            print(f"  {t['kernel'][:60]}: after its release, {stamps} us (median)")
    print(f"sum over the traced kernels: {total / 1e3:.3f} ms, {sum(t['launches'] for t in table)} launches")
    if args.step:
        print("\nlast uninterrupted chain (cost us = release to next release; early us = at its wait before release):")
        for name, ctas, threads, cost, early in chain:
            print(f"  {name[:48]:48s} {ctas:6d}x{threads:<4d} {cost:8.2f} {early:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "kernels": table, "critical_path_us": total}, f, indent=1)


if __name__ == "__main__":
    main()

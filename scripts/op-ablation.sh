#!/usr/bin/env bash
# Where a decode step's time goes inside its CUDA graph: the step is timed whole, then once without
# each op (KILN_OP_SKIP), and an op's cost is the difference. Unlike Nsight's kernel-by-kernel
# times or KILN_OP_PROFILE's events (which turn graphs off), this is each op's cost where it runs
# overlapped with its neighbours (programmatic dependent launch), which is what a step pays.
# The outputs of a skipped op are wrong. A skipped router is replaced by one small launch writing
# fixed choices (k distinct experts per token), so the MoE still reads as many experts; its row is
# the router's cost less that launch's.
#
# Usage: scripts/op-ablation.sh [--kiln PATH] [--out FILE.json] [--repeats N] [--ops 'a;b;...'] -- <kiln bench model arguments>
#   e.g. scripts/op-ablation.sh -- --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights \
#          --batch-sizes 1 --prompt-len 128 --decode-steps 64
# Op names are prefixes of the names KILN_OP_PROFILE prints: "linear " is every projection (the
# space keeps linear_heads out), "linear m<=1 2048x2048" one shape at one row. The CUDA backend
# honours KILN_OP_SKIP (and, at exit, names any prefix that matched no op: the script then fails);
# on the CPU every cost reads about zero.
set -euo pipefail
KILN=${KILN:-build/src/cli/kiln}
OUT=""
REPEATS=2
OPS="mla_absorbed;mla_prepare;linear_heads;linear ;router;moe"
usage() { echo "op-ablation: $1" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --kiln | --out | --repeats | --ops)
      [ $# -ge 2 ] || usage "$1 needs a value"
      case "$1" in
        --kiln) KILN=$2 ;;
        --out) OUT=$2 ;;
        --repeats) REPEATS=$2 ;;
        --ops) OPS=$2 ;;
      esac
      shift 2
      ;;
    --) shift; break ;;
    *) usage "unknown argument $1 (bench arguments go after --)" ;;
  esac
done
[ $# -gt 0 ] || usage "give the kiln bench model arguments after --"
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || usage "--repeats $REPEATS is not a positive count"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
run() {  # run <tag> <skip list> <bench args>: one bench per repeat, JSON in $TMP/<tag>.<i>.json
  local tag=$1 skip=$2 i
  shift 2
  for ((i = 0; i < REPEATS; i++)); do
    echo "op-ablation: ${skip:-whole step} (run $((i + 1)) of ${REPEATS})" >&2
    if ! KILN_OP_SKIP="$skip" "$KILN" --log-level warn bench model "$@" --json "$TMP/${tag}.${i}.json" \
      >/dev/null 2>"$TMP/log"; then
      cat "$TMP/log" >&2
      echo "op-ablation: the bench failed (above)" >&2
      exit 1
    fi
    # A prefix that names no op would read as a free op: the backend says so when it exits.
    if grep -q "matched no op" "$TMP/log"; then
      grep "matched no op" "$TMP/log" >&2
      echo "op-ablation: --ops entry '$skip' names no op of this run" >&2
      exit 1
    fi
  done
}
IFS=';' read -r -a OP_LIST <<<"$OPS"
for op in "${OP_LIST[@]}"; do [ -n "$op" ] || usage "--ops '$OPS' has an empty entry"; done
BENCH=("$@")
run_all() {
  run whole "" "${BENCH[@]}"
  local n=0
  for op in "${OP_LIST[@]}"; do
    run "skip$n" "$op" "${BENCH[@]}"
    n=$((n + 1))
  done
}
run_all
python3 - "$TMP" "$REPEATS" "$OUT" "${OP_LIST[@]}" <<'PY'
import json, statistics, sys
tmp, repeats, out, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def steps(tag):  # batch size -> median ms per decode step over the repeats
    runs = [json.load(open(f"{tmp}/{tag}.{i}.json")) for i in range(repeats)]
    by = {}
    for r in runs:
        for row in r["results"]:
            by.setdefault(row["batch_size"], []).append(row["decode_ms_per_step"])
    return {b: statistics.median(v) for b, v in by.items()}, runs[0]
whole, meta = steps("whole")
rows = []
for n, op in enumerate(ops):
    s, _ = steps(f"skip{n}")
    rows.append({"op": op, "ms_per_step_without": s,
                 "ms_per_step_cost": {b: whole[b] - s[b] for b in whole}})
print(f"device: {meta['device']}, activations {meta['activation_dtype']}, prompt {meta['prompt_len']}, "
      f"{meta['decode_steps']} decode steps, median of {repeats}")
for b in sorted(whole):
    print(f"\nbatch {b}: whole step {whole[b]:.3f} ms")
    print(f"  {'op (prefix)':<32} {'without':>10} {'cost':>10} {'share':>7}")
    for r in sorted(rows, key=lambda r: -r["ms_per_step_cost"][b]):
        c = r["ms_per_step_cost"][b]
        print(f"  {r['op']:<32} {r['ms_per_step_without'][b]:>8.3f}ms {c:>8.3f}ms {100 * c / whole[b]:>6.1f}%")
if out:
    json.dump({"device": meta["device"], "activation_dtype": meta["activation_dtype"],
               "prompt_len": meta["prompt_len"], "decode_steps": meta["decode_steps"], "repeats": repeats,
               "aggregate": "median", "whole_ms_per_step": whole, "ops": rows}, open(out, "w"), indent=2)
    open(out, "a").write("\n")
PY

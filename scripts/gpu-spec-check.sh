#!/usr/bin/env bash
# Speculative decoding on the GPU machine (issue 41), from the kiln binary scripts/gpu-build.sh
# stages in .gpu/ (pack it with `scripts/gpu-build.sh --pack kiln`). Writes under $OUT.
#   1. greedy ids of kiln-tiny on CUDA with and without kiln-tiny-draft (K 1..5) must be the same
#      (prints "spec greedy K=k: same" or the first differing index);
#   2. kiln bench model with and without the draft model at batch 1, 4, 16, 64 (figures, not tests):
#      decode tok/s, acceptance per position, mean accepted length, draft and verify seconds; K 2
#      and 4 with the fixed policy (every step verifies K), then K 4 with the adaptive one (its
#      speculative / plain step counts per batch), whose tok/s should be no lower than plain's.
# Usage there: bash scripts/gpu-spec-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
OUT=${OUT:-/tmp/spec-out}
mkdir -p "$OUT"
status=0
K=.gpu/kiln
DRAFT=(--speculative-algorithm draft --speculative-model models/kiln-tiny-draft)
PROMPT=$(python3 -c "import json; h=json.load(open('models/kiln-tiny/heldout.json')); print(','.join(map(str, h['ids'][:48])))")
gen() { "$K" --log-level warn generate --model models/kiln-tiny --device cuda --prompt-ids "$PROMPT" --max-tokens 64 \
  --temperature 0 --json "$@"; }
gen > "$OUT/spec_plain.json" || status=1
for k in 1 2 3 4 5; do
  gen "${DRAFT[@]}" --speculative-num-tokens "$k" > "$OUT/spec_k$k.json" || status=1
  python3 - "$OUT/spec_plain.json" "$OUT/spec_k$k.json" "$k" <<'PY' || status=1
import json, sys
a = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["output_ids"]
b = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["output_ids"]
k = sys.argv[3]
if a == b:
    print(f"spec greedy K={k}: same ({len(a)} tokens)")
else:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"spec greedy K={k}: DIFFERENT from index {i}: plain {a[i:i+4]} spec {b[i:i+4]}")
    sys.exit(1)
PY
done
BM=("$K" bench model --device cuda --model models/kiln-tiny --batch-sizes 1,4,16,64 --prompt-len 128 --decode-steps 128)
"${BM[@]}" --json "$OUT/spec_bench_plain.json" 2>&1 | grep -v '\[info\]' | tee "$OUT/spec_bench_plain.log" || status=1
for k in 2 4; do
  "${BM[@]}" "${DRAFT[@]}" --speculative-num-tokens $k --speculative-policy fixed --json "$OUT/spec_bench_k$k.json" 2>&1 |
    grep -v '\[info\]' | tee "$OUT/spec_bench_k$k.log" || status=1
done
"${BM[@]}" "${DRAFT[@]}" --speculative-num-tokens 4 --speculative-policy adaptive --json "$OUT/spec_bench_adaptive.json" \
  2>&1 | grep -v 'loading' | tee "$OUT/spec_bench_adaptive.log" || status=1
exit $status

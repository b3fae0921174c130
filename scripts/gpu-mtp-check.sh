#!/usr/bin/env bash
# The MTP drafter on the GPU machine (issue 41), from the kiln binary scripts/gpu-build.sh stages in
# .gpu/ (pack it with `scripts/gpu-build.sh --pack kiln`). Writes under $OUT.
#   1. greedy ids of kiln-tiny on CUDA with and without its MTP layer (K 1..5) must be the same
#      (prints "mtp greedy K=k: same" or the first differing index), on two held-out prompts;
#   2. kiln bench model with and without MTP at batch 1, 4, 16, 64 (figures, not tests).
# Usage there: bash scripts/gpu-mtp-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
OUT=${OUT:-/tmp/mtp-out}
mkdir -p "$OUT"
status=0
K=.gpu/kiln
for p in 0 1; do
  PROMPT=$(python3 -c "import json; h=json.load(open('models/kiln-tiny/heldout.json')); print(','.join(map(str, h['acceptance']['prompt_ids'][$p])))")
  gen() { "$K" --log-level warn generate --model models/kiln-tiny --device cuda --prompt-ids "$PROMPT" --max-tokens 64 \
    --temperature 0 --json "$@"; }
  gen > "$OUT/mtp_plain_p$p.json" || status=1
  for k in 1 2 3 4 5; do
    gen --speculative-algorithm mtp --speculative-num-tokens "$k" > "$OUT/mtp_p${p}_k$k.json" || status=1
    python3 - "$OUT/mtp_plain_p$p.json" "$OUT/mtp_p${p}_k$k.json" "$k" "$p" <<'PY' || status=1
import json, sys
a = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["output_ids"]
b = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["output_ids"]
k, p = sys.argv[3], sys.argv[4]
if a == b:
    print(f"mtp greedy prompt {p} K={k}: same ({len(a)} tokens)")
else:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"mtp greedy prompt {p} K={k}: DIFFERENT from index {i}: plain {a[i:i+4]} mtp {b[i:i+4]}")
    sys.exit(1)
PY
  done
done
BM=("$K" bench model --device cuda --model models/kiln-tiny --batch-sizes 1,4,16,64 --prompt-len 128 --decode-steps 128)
"${BM[@]}" --json "$OUT/mtp_bench_plain.json" 2>&1 | grep -v '\[info\]' | tee "$OUT/mtp_bench_plain.log" || status=1
for k in 2 4; do
  "${BM[@]}" --speculative-algorithm mtp --speculative-num-tokens $k --json "$OUT/mtp_bench_k$k.json" 2>&1 |
    grep -v '\[info\]' | tee "$OUT/mtp_bench_k$k.log" || status=1
done
exit $status

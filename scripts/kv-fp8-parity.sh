#!/usr/bin/env bash
# The logprob cost of the FP8 latent KV cache on the bundled trained model: `kiln score` over the
# first N held-out ids of models/kiln-tiny with --kv-cache-dtype fp8_e4m3, bf16 (for scale) and f32
# (CPU, the reference), then the mean and max |Δ logprob| against f32 over positions 1..
# (docs/results.md).
# Usage: scripts/kv-fp8-parity.sh [KILN_BINARY] [N ...]   (default build/src/cli/kiln, N = 512 2048)
set -euo pipefail
kiln=${1:-build/src/cli/kiln}
shift || true
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(512 2048)
model=models/kiln-tiny
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in "${lengths[@]}"; do
  ids=$(python3 -c "import json; print(','.join(map(str, json.load(open('$model/heldout.json'))['ids'][:$n])))")
  for kv in f32 bf16 fp8_e4m3; do
    "$kiln" score --model "$model" --device cpu --kv-cache-dtype "$kv" --ids "$ids" --json 2>/dev/null |
      grep '^{' >"$tmp/$kv.json"
  done
  python3 - "$tmp" "$n" <<'PY'
import json, sys
lp = {kv: json.load(open(f"{sys.argv[1]}/{kv}.json"))["logprobs"][1:] for kv in ("f32", "bf16", "fp8_e4m3")}
for kv in ("fp8_e4m3", "bf16"):
    d = [abs(x - y) for x, y in zip(lp[kv], lp["f32"])]
    print(f"kiln-tiny, {sys.argv[2]} ids, {kv} vs f32 cache: mean |dlogprob| {sum(d) / len(d):.5f}, max {max(d):.5f}, "
          f"mean logprob {sum(lp[kv]) / len(d):.4f} (f32 {sum(lp['f32']) / len(d):.4f})")
PY
done

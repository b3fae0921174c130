#!/usr/bin/env bash
# Issue 39's sharded forward on CUDA (one GPU per rank over NCCL) against one GPU, on a machine of
# two or more GPUs (the device tool's nvidia-h100-x2). Needs .gpu/kiln from scripts/gpu-build.sh
# and, for the op tests, .gpu/ops_parallel_test (cp build-gpu/tests/ops/ops_parallel_test .gpu/
# after building that target; add it to the --pack names).
# Usage there: bash scripts/gpu-tp-check.sh      Prints one OK/FAIL line per check; exit 1 on a FAIL.
# What it should print: ops_parallel_test "[  PASSED  ] 3 tests."; for each fixture and split
# "OK score ... worst |dlogprob| <= 2e-3" (f32 cache and activations on both sides: only the
# summation order differs) and "OK generate ..." (the same greedy tokens, eager and with graphs).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f scripts/gpu-env.sh ] && source scripts/gpu-env.sh
status=0
K=(.gpu/kiln --log-level warn)
if [ -x .gpu/ops_parallel_test ]; then
  echo "== expert_slice, attention_merge (CUDA vs CPU)"
  .gpu/ops_parallel_test 2>&1 | tail -3 || status=1
fi
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== $ngpu GPUs"
[ "$ngpu" -ge 2 ] || { echo "FAIL: needs two GPUs (one per rank)"; exit 1; }
PREC=(--device cuda --kv-cache-dtype f32 --activation-dtype f32)
worst() {  # worst |Δ logprob| between two `kiln score --json` outputs
  python3 -c "import json,sys; a=json.loads(sys.argv[1])['logprobs']; b=json.loads(sys.argv[2])['logprobs']
print(max(abs(x-y) for x,y in zip(a[1:],b[1:])))" "$1" "$2"
}
for fx in h12_qlora_grouped_yarn h12_qlora_grouped_yarn_fp8 h24_kimi_k2_style h12_mla512_moonlight_widths; do
  dir=tests/data/fixtures/$fx
  ids=$(python3 -c "import json; print(','.join(map(str, json.load(open('$dir/expected.json'))['ids'])))")
  one=$("${K[@]}" score "${PREC[@]}" --model "$dir" --ids "$ids" --json | grep '^{')
  for flags in "--tp 2" "--tp 2 --enable-expert-parallel"; do
    # shellcheck disable=SC2086
    got=$("${K[@]}" score "${PREC[@]}" $flags --model "$dir" --ids "$ids" --json | grep '^{')
    w=$(worst "$one" "$got" 2>/dev/null || echo nan)
    if python3 -c "import sys; sys.exit(0 if float('$w') <= 2e-3 else 1)"; then
      echo "OK score $fx $flags: worst |dlogprob| $w"
    else
      echo "FAIL score $fx $flags: worst |dlogprob| $w"
      status=1
    fi
  done
  prompt=$(python3 -c "import json; print(','.join(map(str, json.load(open('$dir/expected.json'))['ids'][:12])))")
  gen() {  # greedy output ids
    # shellcheck disable=SC2068
    "${K[@]}" generate "${PREC[@]}" $@ --model "$dir" --prompt-ids "$prompt" --max-tokens 16 --temperature 0 \
      --ignore-eos --json | grep '^{' | python3 -c "import json,sys; print(json.load(sys.stdin)['output_ids'])"
  }
  want=$(gen)
  for flags in "--tp 2" "--tp 2 --enforce-eager" "--tp 2 --enable-expert-parallel"; do
    # shellcheck disable=SC2086
    got=$(gen $flags)
    if [ "$got" = "$want" ]; then echo "OK generate $fx $flags"; else
      echo "FAIL generate $fx $flags: $got vs one GPU $want"
      status=1
    fi
  done
done
echo "== kiln bench model --tp 2 (Moonlight shape, random weights; no timing is asserted)"
"${K[@]}" bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights --tp 2 \
  --batch-sizes 1,16 --prompt-len 256 --decode-steps 32 || status=1
exit $status

#!/usr/bin/env bash
# One call on the GPU machine: run the GPU tests and benchmarks from binaries built on the
# development machine (scripts/gpu-build.sh puts them and their shared libraries in .gpu/), and
# write everything under $OUT. Usage there: bash scripts/gpu-check.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
# The device tool carries .gpuz/gpu.tar.xz (made by scripts/gpu-build.sh --pack) when .gpu is too big.
[ -d .gpu ] || tar -xJf .gpuz/gpu.tar.xz
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}"
# The binaries carry the paths they were built with (the lead worktree): recreate them here.
BUILT=$(cat .gpu/built_at)
mkdir -p "$BUILT/build-gpu/src/cli" && cp .gpu/kiln "$BUILT/build-gpu/src/cli/kiln"
[ -e "$BUILT/tests" ] || ln -s "$PWD/tests" "$BUILT/tests"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
status=0
echo "== op parity (CUDA vs CPU)"
.gpu/ops_parity_test --gtest_output=json:"$OUT/ops_parity.json" 2>&1 | tee "$OUT/ops_parity.log" | tail -40 || status=1
echo "== model parity on the fixtures (CUDA)"
.gpu/model_test --gtest_filter='*Cuda*' --gtest_output=json:"$OUT/model_cuda.json" 2>&1 | tee "$OUT/model_cuda.log" | grep -v '\[info\]' | tail -40 || status=1
grep 'mean |dlogprob|' "$OUT/model_cuda.log" || true
echo "== engine on CUDA: bundled model, greedy, same tokens as the CPU"
PROMPT=$(python3 -c "import json; h=json.load(open('models/kiln-tiny/heldout.json')); print(','.join(map(str, h['ids'][:48])))")
.gpu/kiln --log-level warn generate --model models/kiln-tiny --device cpu --prompt-ids "$PROMPT" --max-tokens 32 --temperature 0 --json > "$OUT/gen_cpu.json"
.gpu/kiln --log-level info generate --model models/kiln-tiny --device cuda --prompt-ids "$PROMPT" --max-tokens 32 --temperature 0 --json > "$OUT/gen_cuda.json" 2> "$OUT/gen_cuda.log"
.gpu/kiln --log-level info generate --model models/kiln-tiny --device cuda --enforce-eager --prompt-ids "$PROMPT" --max-tokens 32 --temperature 0 --json > "$OUT/gen_cuda_eager.json" 2> "$OUT/gen_cuda_eager.log"
python3 - "$OUT" <<'PY' || status=1
import json, sys
o = sys.argv[1]
a = json.load(open(o + "/gen_cpu.json"))
ok = True
for name in ("gen_cuda", "gen_cuda_eager"):
    b = json.load(open(f"{o}/{name}.json"))
    n = next((i for i, (x, y) in enumerate(zip(a["output_ids"], b["output_ids"])) if x != y), len(a["output_ids"]))
    d = max((abs(x - y) for x, y in zip(a["logprobs"][:n], b["logprobs"][:n])), default=0.0)
    print(f"{name}: greedy tokens equal to the CPU's for {n}/{len(a['output_ids'])} steps, max |dlogprob| {d:.2e}")
    ok &= n == len(a["output_ids"])
sys.exit(0 if ok else 1)
PY
echo "== engine throughput on CUDA (kiln bench model, Moonlight shape, random weights)"
.gpu/kiln bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights \
  --batch-sizes 1,8,32,128,256 --prompt-len 128 --decode-steps 32 --json "$OUT/bench_model.json" 2>&1 | tail -12 || status=1
.gpu/kiln bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights --enforce-eager \
  --batch-sizes 1,32 --prompt-len 128 --decode-steps 32 --json "$OUT/bench_model_eager.json" 2>&1 | tail -6 || status=1
echo "== benchmarks"
.gpu/kiln-gpu-bench --out "$OUT/gpu_bench.json" "$@" 2>&1 | tee "$OUT/gpu_bench.log" || status=1
echo "== op profile: where a decode step's GPU time goes (eager, events around every op)"
KILN_OP_PROFILE=1 .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json \
  --random-weights --batch-sizes 1 --prompt-len 128 --decode-steps 32 --no-warmup 2>&1 | grep -A 25 "op profile" | tee "$OUT/op_profile_b1.log"
KILN_OP_PROFILE=1 .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json \
  --random-weights --batch-sizes 64 --prompt-len 128 --decode-steps 32 --no-warmup 2>&1 | grep -A 25 "op profile" | tee "$OUT/op_profile_b64.log"
# The device tool brings back at most 8 files: everything travels in one archive.
tar -czf /tmp/kiln-results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/kiln-results.tgz "$OUT/results.tgz"
exit $status

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
mkdir -p "$BUILT/build-cuda/src/cli" && cp .gpu/kiln "$BUILT/build-cuda/src/cli/kiln"
[ -e "$BUILT/tests" ] || ln -s "$PWD/tests" "$BUILT/tests"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
status=0
echo "== op parity (CUDA vs CPU)"
.gpu/ops_parity_test --gtest_output=json:"$OUT/ops_parity.json" 2>&1 | tee "$OUT/ops_parity.log" | tail -40 || status=1
echo "== model parity on the fixtures (CUDA)"
.gpu/model_test --gtest_filter='*Cuda*' --gtest_output=json:"$OUT/model_cuda.json" 2>&1 | tee "$OUT/model_cuda.log" | tail -20 || status=1
echo "== engine on CUDA: bundled model, greedy, same tokens as the CPU"
PROMPT=$(python3 -c "import json; h=json.load(open('models/kiln-tiny/heldout.json')); print(','.join(map(str, h['ids'][:48])))")
.gpu/kiln --log-level warn generate --model models/kiln-tiny --device cpu --prompt-ids "$PROMPT" --max-tokens 32 --temperature 0 --json > "$OUT/gen_cpu.json"
.gpu/kiln --log-level info generate --model models/kiln-tiny --device cuda --prompt-ids "$PROMPT" --max-tokens 32 --temperature 0 --json > "$OUT/gen_cuda.json" 2> "$OUT/gen_cuda.log"
python3 - "$OUT" <<'PY' || status=1
import json, sys
o = sys.argv[1]
a = json.load(open(o + "/gen_cpu.json"))["output_ids"]; b = json.load(open(o + "/gen_cuda.json"))["output_ids"]
n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
print(f"greedy tokens equal for {n}/{len(a)} steps"); sys.exit(0 if n == len(a) else 1)
PY
echo "== engine throughput on CUDA (kiln bench model, Moonlight shape, random weights)"
.gpu/kiln bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights \
  --batch-sizes 1,8,32,128 --prompt-len 128 --decode-steps 16 --json "$OUT/bench_model.json" 2>&1 | tail -12 || status=1
echo "== benchmarks"
.gpu/kiln-gpu-bench --out "$OUT/gpu_bench.json" "$@" 2>&1 | tee "$OUT/gpu_bench.log" || status=1
exit $status

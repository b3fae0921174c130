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
echo "== benchmarks"
.gpu/kiln-gpu-bench --out "$OUT/gpu_bench.json" "$@" 2>&1 | tee "$OUT/gpu_bench.log" || status=1
exit $status

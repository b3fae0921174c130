#!/usr/bin/env bash
# The README's main command: set up a fresh Debian 12 machine, build Kiln, start `kiln serve` on
# the bundled model (models/kiln-tiny, on the CPU), send one chat request, print the answer.
# It builds only what it runs: the `kiln` binary, CPU-only (no CUDA kernels even where nvcc is
# installed), unless asked for CUDA: `scripts/demo.sh --device cuda` (the flags go to `kiln serve`)
# or KILN_CUDA=ON. The binary lands at build/src/cli/kiln; scripts/install.sh puts it on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cuda=${KILN_CUDA:-OFF}
prev=""
for arg in "$@"; do
  if [ "$arg" = --device=cuda ] || { [ "$prev" = --device ] && [ "$arg" = cuda ]; }; then cuda=ON; fi
  prev=$arg
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA="$cuda" >/dev/null
cmake --build build -j "$(nproc)" --target kiln
KILN=build/src/cli/kiln
echo
echo "== kiln model-info --model models/kiln-tiny: the bundled model's size and KV cache per token"
"$KILN" model-info --model models/kiln-tiny
echo
bash scripts/serve-demo.sh "$KILN" "$@"
echo
echo "== kiln is built at $PWD/$KILN"
echo "   bash scripts/install.sh puts it on PATH (a link in ~/.local/bin); the README goes on from there."

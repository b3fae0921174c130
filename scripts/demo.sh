#!/usr/bin/env bash
# The README's main command: set up a fresh Debian 12 machine, build Kiln, start `kiln serve` on
# the bundled model (models/kiln-tiny, on the CPU), send one chat request, print the answer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target kiln
./build/src/cli/kiln model-info --model models/kiln-tiny
bash scripts/serve-demo.sh build/src/cli/kiln "$@"

#!/usr/bin/env bash
# The README's main command: set up a fresh Debian 12 machine, build Kiln, and run it on the
# bundled default model. Extra arguments go to `kiln generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target kiln
MODEL=${KILN_MODEL:-models/kiln-tiny}
DEVICE=cpu
if [ ! -f "$MODEL/config.json" ]; then
  echo "demo: $MODEL is missing; using the parity fixture model instead" >&2
  MODEL=tests/data/fixtures/h12_qlora_grouped_yarn
fi
./build/src/cli/kiln model-info --model "$MODEL"
if [ -f "$MODEL/tokenizer.json" ] && ./build/src/cli/kiln --help | grep -q tokenize; then
  ./build/src/cli/kiln generate --model "$MODEL" --device "$DEVICE" --prompt "${KILN_PROMPT:-The function returns}" \
    --max-tokens 48 --temperature 0 "$@"
else
  ./build/src/cli/kiln generate --model "$MODEL" --device "$DEVICE" --prompt-ids 2,5,7,11,13 --max-tokens 16 \
    --temperature 0 --json "$@"
fi

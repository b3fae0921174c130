#!/usr/bin/env bash
# The README demo: start `kiln serve` on the bundled model (on the CPU unless --device says
# otherwise), wait for /health, send one chat request with curl, print the answer, stop the server.
# Usage: scripts/serve-demo.sh [path/to/kiln] [extra serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
KILN=${1:-build/src/cli/kiln}
shift || true
PORT=${PORT:-8123}
LOG=$(mktemp)
DEVICE=(--device cpu)  # unless the flags name one
for arg in "$@"; do case "$arg" in --device | --device=*) DEVICE=() ;; esac; done
"$KILN" serve --model models/kiln-tiny --port "$PORT" "${DEVICE[@]}" "$@" >"$LOG" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 $PID 2>/dev/null; then echo "kiln serve failed to start:" >&2; cat "$LOG" >&2; exit 1; fi
  sleep 0.2
done
PROMPT="Tell me a story."
echo "== POST /v1/chat/completions to kiln serve on port $PORT: \"$PROMPT\" (40 tokens, greedy)"
echo "   kiln-tiny is a toy (10 M parameters) trained for minutes on software documentation, so its"
echo "   answers read like documentation, whatever the question. Its answer:"
echo
curl -sf "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"kiln-tiny","messages":[{"role":"user","content":"'"$PROMPT"'"}],"max_tokens":40,"temperature":0}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"].strip())'

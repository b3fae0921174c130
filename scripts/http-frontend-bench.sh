#!/usr/bin/env bash
# The HTTP front end alone (issue 38): kiln_fake_serve (the event-loop front end before a fake
# engine, one token per stream per step, no model) under `kiln bench serve`, on this machine's CPU.
# Per run: what the client measured, and the server's CPU seconds, threads and peak RSS from /proc.
#
#   scripts/http-frontend-bench.sh BUILD_DIR OUT_DIR
#
# Runs (each a few tens of seconds):
#   held:   10,000 streams at once, 1 token/s each for 20 s (streams held, threads, memory)
#   rps:    8-token streams answered at once (step 0), 64 at a time (requests/s)
#   tokens: 500 streams at 50 tokens/s, 200 tokens each (server CPU per 1,000 streamed tokens)
set -euo pipefail
BUILD=${1:?build dir}
OUT=${2:?output dir}
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
KILN=$BUILD/src/cli/kiln
FAKE=$BUILD/tests/server/kiln_fake_serve
ulimit -n "$(ulimit -Hn)"

cpu_s() {  # utime + stime of a process, in seconds
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat"
}

run() {  # name step_ms output_len concurrency num_prompts
  local name=$1 step=$2 olen=$3 conc=$4 num=$5 port=$((18300 + RANDOM % 500))
  "$FAKE" --port "$port" --step-ms "$step" --http-threads 2 >"$OUT/$name.server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  local c0 threads=0 rss
  c0=$(cpu_s "$pid")
  # Threads sampled every 0.5 s while the run lasts (the most seen is reported).
  (while kill -0 "$pid" 2>/dev/null; do awk '/^Threads/ {print $2}' "/proc/$pid/status"; sleep 0.5; done) \
    >"$OUT/$name.threads" 2>/dev/null &
  local sampler=$!
  "$KILN" bench serve --base-url "http://127.0.0.1:$port" --model fake --input-len 16 --output-len "$olen" \
    --concurrency "$conc" --num-prompts "$num" --warmup 0 --no-progress --request-timeout 120 \
    --out "$TMP/$name.json" >"$OUT/$name.client.log" 2>&1 || echo "bench serve failed: see $OUT/$name.client.log"
  # The per-request records are megabytes: only the summary is kept.
  python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"], indent=1))' \
    "$TMP/$name.json" >"$OUT/$name.summary.json"
  local c1
  c1=$(cpu_s "$pid")
  rss=$(awk '/^VmHWM/ {print $2 / 1024 " MiB"}' "/proc/$pid/status")
  threads=$(sort -n "$OUT/$name.threads" | tail -1)
  kill "$pid" 2>/dev/null || true
  kill "$sampler" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local tokens=$((olen * num))
  {
    echo "run $name: step ${step} ms, ${olen} tokens x ${num} requests, concurrency ${conc}"
    echo "  server CPU: $(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }') s" \
      "($(awk -v a="$c0" -v b="$c1" -v t="$tokens" 'BEGIN { printf "%.3f", (b - a) * 1000 / t }') s per 1,000 streamed tokens," \
      "$(awk -v a="$c0" -v b="$c1" -v n="$num" 'BEGIN { printf "%.3f", (b - a) * 1000 / n }') ms per request)"
    echo "  server threads (most seen): $threads, peak RSS: $rss"
    python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); s = s[0] if isinstance(s, list) else s
print("  client: %d completed, %d failed in %.1f s: %.0f req/s" % (s["completed"], s["failed"], s["duration_s"], s["request_throughput"]))' \
      "$OUT/$name.summary.json"
    grep -A2 '^| concurrency' "$OUT/$name.client.log" | sed 's/^/  /'
  } | tee -a "$OUT/summary.txt"
}

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  echo "commit $(git rev-parse --short HEAD), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/summary.txt"
run held 1000 20 10000 10000
run rps 0 8 64 10000
run tokens 20 200 500 1000
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.txt"

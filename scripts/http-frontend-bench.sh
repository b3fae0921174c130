#!/usr/bin/env bash
# The HTTP front end alone (issue 38): kiln_fake_serve (the event-loop front end before a fake
# engine, one token per stream per step, no model) under `kiln bench serve`, on this machine's CPU.
# Per run: what the client measured, and the server's CPU seconds, threads and peak RSS from /proc.
#
#   scripts/http-frontend-bench.sh [--old] BUILD_DIR OUT_DIR
#
# BUILD_DIR must hold kiln and kiln_fake_serve (`cmake --build BUILD_DIR --target kiln kiln_fake_serve`);
# its kiln is the client in both modes.
# --old: the front end before commit 98572c9 instead (cpp-httplib, a thread per connection, with
# old `kiln serve`'s defaults: 1,100 threads, 503 past 1,024 requests), before the same fake engine:
# scripts/frontend-ab/build-old.sh builds it into BUILD_DIR/frontend-ab/ from a temporary worktree
# of 98572c9^. scripts/http-frontend-ab.sh runs both modes and tabulates them.
#
# Runs (each a few tens of seconds):
#   held:   10,000 streams at once, 1 token/s each for 20 s (streams held, threads, memory)
#   rps:    8-token streams answered at once (step 0), 64 at a time (requests/s)
#   tokens: 500 streams at 50 tokens/s, 200 tokens each (server CPU per 1,000 streamed tokens)
# Per run OUT_DIR gets NAME.summary.json (the client's summary), NAME.result.json (the figures of
# summary.txt, for tables), NAME.threads, NAME.server.log and NAME.client.log.
#
# Environment (defaults: the full runs above):
#   FRONTEND_BENCH_RUNS="held rps tokens"  the runs to do
#   FRONTEND_BENCH_SCALE=1     scales every run's request count (concurrency at most that) and the
#                              held run's 20 tokens; 0.1 gives a quick check
#   FRONTEND_BENCH_TIMEOUT=150 seconds a run's client may take; then it is interrupted (SIGINT: it
#                              still writes what it measured) and unfinished requests count as
#                              interrupted. Requests themselves time out at 120 s.
set -euo pipefail
OLD=0
if [ "${1:-}" = "--old" ]; then
  OLD=1
  shift
fi
BUILD=${1:?build dir}
OUT=${2:?output dir}
RUNS=${FRONTEND_BENCH_RUNS:-held rps tokens}
SCALE=${FRONTEND_BENCH_SCALE:-1}
LIMIT=${FRONTEND_BENCH_TIMEOUT:-150}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
KILN=$BUILD/src/cli/kiln
if [ "$OLD" = 1 ]; then
  FAKE=$BUILD/frontend-ab/kiln_fake_serve_old
  # Rebuilt when its source or recipe is newer than it.
  if [ ! -x "$FAKE" ] || [ "$HERE/frontend-ab/old_fake_serve.cc" -nt "$FAKE" ] ||
    [ "$HERE/frontend-ab/build-old.sh" -nt "$FAKE" ]; then
    "$HERE/frontend-ab/build-old.sh" "$FAKE"
  fi
  FAKE_ARGS=()  # old `kiln serve`'s defaults: --http-threads 1100, --max-pending-requests 1024
  FRONT="old: cpp-httplib 0.11, thread per connection (98572c9^)"
else
  FAKE=$BUILD/tests/server/kiln_fake_serve
  FAKE_ARGS=(--http-threads 2)
  FRONT="new: event loop (src/server/http)"
fi
for f in "$KILN" "$FAKE"; do
  [ -x "$f" ] || {
    echo "missing $f: cmake --build $BUILD --target kiln kiln_fake_serve" >&2
    exit 1
  }
done
ulimit -n "$(ulimit -Hn)"

cpu_s() {  # utime + stime of a process, in seconds
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat"
}

run() {  # name step_ms output_len concurrency num_prompts
  local name=$1 step=$2 olen=$3 conc=$4 num=$5 port=$((18300 + RANDOM % 500))
  case " $RUNS " in *" $name "*) ;; *) return 0 ;; esac
  rm -f "$OUT/$name".*  # a failed run must not leave an earlier run's figures in place
  num=$(awk -v n="$num" -v s="$SCALE" 'BEGIN { n = int(n * s + 0.5); print n < 1 ? 1 : n }')
  conc=$((conc < num ? conc : num))
  if [ "$name" = held ]; then olen=$(awk -v n="$olen" -v s="$SCALE" 'BEGIN { n = int(n * s + 0.5); print n < 2 ? 2 : n }'); fi
  "$FAKE" --port "$port" --step-ms "$step" "${FAKE_ARGS[@]}" >"$OUT/$name.server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  local c0 threads=0 rss
  c0=$(cpu_s "$pid")
  # Threads sampled every 0.5 s while the run lasts (the most seen is reported).
  (while kill -0 "$pid" 2>/dev/null; do awk '/^Threads/ {print $2}' "/proc/$pid/status"; sleep 0.5; done) \
    >"$OUT/$name.threads" 2>/dev/null &
  local sampler=$!
  # A front end that cannot keep up must end the run as figures, not hang it: the client is
  # interrupted at the limit (and killed 15 s later if that did not stop it).
  timeout -s INT -k 15 "$LIMIT" "$KILN" bench serve --base-url "http://127.0.0.1:$port" --model fake \
    --input-len 16 --output-len "$olen" --concurrency "$conc" --num-prompts "$num" --warmup 0 --no-progress \
    --request-timeout 120 --out "$TMP/$name.json" >"$OUT/$name.client.log" 2>&1 ||
    echo "bench serve exited with $?: see $OUT/$name.client.log"
  local c1
  c1=$(cpu_s "$pid" 2>/dev/null) || {
    echo "  the server exited during run $name: see $OUT/$name.server.log" | tee -a "$OUT/summary.txt"
    c1=$c0
  }
  # (A server that exited has no /proc entry: under set -e a bare awk would end the script here; None in the JSON.)
  rss=$(awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status" 2>/dev/null) || rss=None
  threads=$(sort -n "$OUT/$name.threads" | tail -1)
  kill "$pid" 2>/dev/null || true
  kill "$sampler" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # The per-request records are megabytes: only the summary is kept, with the most streams open
  # at once (first token received, last not yet) worked out from them.
  python3 - "$TMP/$name.json" "$OUT/$name.summary.json" "$OUT/$name.result.json" <<EOF || echo "  no client summary: see $OUT/$name.client.log"
import json, sys
d = json.load(open(sys.argv[1]))
s = d["summary"]
s = s[0] if isinstance(s, list) else s
edges = []
for r in d.get("requests", []):
    if r.get("token_events", 0) > 0:
        edges += [(r["start_s"] + r["ttft_ms"] / 1000, 1), (r["start_s"] + r["e2e_ms"] / 1000, -1)]
held = now = 0
for _, e in sorted(edges, key=lambda x: (x[0], x[1])):
    now += e
    held = max(held, now)
s["streams_held"] = held
json.dump(s, open(sys.argv[2], "w"), indent=1)
cpu = $c1 - $c0
tokens = s["total_output_tokens"]
json.dump({"run": "$name", "front_end": "$FRONT", "step_ms": $step, "output_len": $olen, "concurrency": $conc,
           "num_prompts": $num, "completed": s["completed"], "failed": s["failed"], "interrupted": s["interrupted"],
           "errors": s["errors"], "streams_held": held, "duration_s": s["duration_s"],
           "request_throughput": s["request_throughput"], "output_tokens": tokens, "server_cpu_s": cpu,
           "server_cpu_s_per_1k_tokens": cpu * 1000 / tokens if tokens else None,
           "server_cpu_ms_per_completed_request": cpu * 1000 / s["completed"] if s["completed"] else None,
           "peak_threads": ${threads:-0}, "peak_rss_mib": ${rss:-0}}, open(sys.argv[3], "w"), indent=1)
EOF
  # Tokens the client received (all asked for when every request completed).
  local tokens=$((olen * num))
  [ -f "$OUT/$name.summary.json" ] &&
    tokens=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["total_output_tokens"])' "$OUT/$name.summary.json")
  {
    echo "run $name: step ${step} ms, ${olen} tokens x ${num} requests, concurrency ${conc}"
    echo "  server CPU: $(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }') s" \
      "($(awk -v a="$c0" -v b="$c1" -v t="$tokens" 'BEGIN { printf "%.3f", t ? (b - a) * 1000 / t : 0 }') s per 1,000 streamed tokens," \
      "$(awk -v a="$c0" -v b="$c1" -v n="$num" 'BEGIN { printf "%.3f", (b - a) * 1000 / n }') ms per request)"
    echo "  server threads (most seen): $threads, peak RSS: $rss MiB"
    [ -f "$OUT/$name.summary.json" ] && python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))
print("  client: %d completed, %d failed in %.1f s: %.0f req/s" % (s["completed"], s["failed"], s["duration_s"], s["request_throughput"]))
print("  streams held (most streaming at once): %d; %d interrupted at the run limit%s" % (s["streams_held"], s["interrupted"],
      "; errors: " + ", ".join("%s %d" % kv for kv in sorted(s["errors"].items())) if s["errors"] else ""))' \
      "$OUT/$name.summary.json"
    grep -A2 '^| concurrency' "$OUT/$name.client.log" | sed 's/^/  /' || true
  } | tee -a "$OUT/summary.txt"
}

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  echo "front end $FRONT; commit $(git -C "$HERE" rev-parse --short HEAD), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  [ "$SCALE" = 1 ] || echo "FRONTEND_BENCH_SCALE=$SCALE: not the full runs"
} | tee "$OUT/summary.txt"
run held 1000 20 10000 10000
run rps 0 8 64 10000
run tokens 20 200 500 1000
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.txt"

#!/usr/bin/env bash
# Old front end against new, the HTTP layer alone (issue 38, docs/results.md "HTTP front end"):
# scripts/http-frontend-bench.sh's three runs against kiln_fake_serve (the event loop, this tree)
# and then against kiln_fake_serve_old (cpp-httplib, thread per connection, as before commit
# 98572c9; built by scripts/frontend-ab/build-old.sh), both before the same fake engine, with this
# tree's `kiln bench serve` as the client. Then a markdown table of the two.
#
#   cmake --build BUILD_DIR --target kiln kiln_fake_serve -j2
#   scripts/http-frontend-ab.sh BUILD_DIR OUT_DIR
#
# OUT_DIR/new and OUT_DIR/old get http-frontend-bench.sh's files; OUT_DIR/table.md the table.
# FRONTEND_BENCH_SCALE, FRONTEND_BENCH_RUNS and FRONTEND_BENCH_TIMEOUT pass through (see
# http-frontend-bench.sh); at full size the old front end's held run takes up to its 150 s limit.
set -euo pipefail
BUILD=${1:?build dir}
OUT=${2:?output dir}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
"$HERE/http-frontend-bench.sh" "$BUILD" "$OUT/new"
# The old server's idle keep-alive connections close only after its 30 s timeout; a pause lets the
# machine settle between the two.
sleep 5
"$HERE/http-frontend-bench.sh" --old "$BUILD" "$OUT/old"
python3 - "$OUT" <<'EOF' | tee "$OUT/table.md"
import json, os, sys
out = sys.argv[1]
print("| run | front end | streams held / completed | requests/s | server CPU s per 1,000 tokens | peak threads | peak RSS |")
print("|---|---|---|---|---|---|---|")
for run in ["held", "rps", "tokens"]:
    for side in ["new", "old"]:
        p = os.path.join(out, side, run + ".result.json")
        if not os.path.exists(p):
            continue
        r = json.load(open(p))
        done = "%s / %s of %s" % (format(r["streams_held"], ","), format(r["completed"], ","), format(r["num_prompts"], ","))
        bad = ["%s %s" % (format(n, ","), k.replace("http_", "HTTP ")) for k, n in sorted(r["errors"].items())]
        if bad:
            done += " (" + ", ".join(bad) + ")"
        cpu = r["server_cpu_s_per_1k_tokens"]
        print("| %s | %s | %s | %s | %s | %s | %s MiB |" % (
            run, r["front_end"].split(":")[0], done, format(round(r["request_throughput"]), ","),
            "%.3f" % cpu if cpu is not None else "-", format(r["peak_threads"], ","), r["peak_rss_mib"]))
EOF

#!/usr/bin/env bash
# Builds Kiln and runs every test on a fresh Debian 12 machine: packages, npm reference
# packages, the release build (with CUDA when nvcc is present: compile only, CI has no GPU), the
# ASan+UBSan build of the CPU code, and the format check. Ends with the verdict of both test runs
# and their total ("tests: P passed, F failed, S skipped"); exits non-zero when a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
bash scripts/setup.sh
if [ ! -d tests/npm/node_modules ] || [ tests/npm/package-lock.json -nt tests/npm/node_modules ]; then
  (cd tests/npm && npm ci --no-audit --no-fund --loglevel=error)
fi
bash scripts/format.sh --check

echo "== release build"
# KILN_CUDA=AUTO given explicitly: a build folder that scripts/demo.sh configured CPU-only gets CUDA
# back when nvcc is present.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=AUTO >/dev/null
cmake --build build -j "$JOBS"
SUMMARY=$(mktemp)
trap 'rm -f "$SUMMARY"' EXIT
CTEST_SUMMARY_OUT=$SUMMARY bash scripts/ctest-summary.sh --test-dir build --output-on-failure -j "$JOBS"

echo "== sanitizer build (ASan + UBSan, CPU only)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON -DKILN_CUDA=OFF >/dev/null
cmake --build build-asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 CTEST_SUMMARY_OUT=$SUMMARY \
  bash scripts/ctest-summary.sh --test-dir build-asan --output-on-failure -j "$JOBS" -LE no_sanitize

echo "== all tests (release, then sanitizer)"
read -r p1 f1 s1 <<<"$(sed -n 1p "$SUMMARY")"
read -r p2 f2 s2 <<<"$(sed -n 2p "$SUMMARY")"
echo "release: $p1 passed, $f1 failed, $s1 skipped; sanitizer: $p2 passed, $f2 failed, $s2 skipped"
echo "tests: $((p1 + p2)) passed, $((f1 + f2)) failed, $((s1 + s2)) skipped"

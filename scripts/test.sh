#!/usr/bin/env bash
# Builds Kiln and runs every test on a fresh Debian 12 machine: packages, npm reference
# packages, the release build (with CUDA when nvcc is present: compile only, CI has no GPU), the
# ASan+UBSan build of the CPU code, and the format check.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
bash scripts/setup.sh
if [ ! -d tests/npm/node_modules ] || [ tests/npm/package-lock.json -nt tests/npm/node_modules ]; then
  (cd tests/npm && npm ci --no-audit --no-fund --loglevel=error)
fi
bash scripts/format.sh --check

echo "== release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS"

echo "== sanitizer build (ASan + UBSan, CPU only)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON -DKILN_CUDA=OFF >/dev/null
cmake --build build-asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$JOBS" -LE no_sanitize

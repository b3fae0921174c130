#!/usr/bin/env bash
# Builds the GPU binaries here (sm_90a) and stages them in .gpu/ with the shared libraries the GPU
# machine lacks, for scripts/gpu-check.sh. Run from a checkout; the device tool carries .gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -G Ninja -DKILN_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DKILN_SKIP_MODULES= >/dev/null
cmake --build build-gpu --target kiln ops_parity_test model_test kiln-gpu-bench kiln-load-pattern-bench
rm -rf .gpu && mkdir -p .gpu/lib
cp build-gpu/src/cli/kiln build-gpu/tests/ops/ops_parity_test build-gpu/tests/model/model_test \
  build-gpu/bench/kiln-gpu-bench build-gpu/bench/kiln-load-pattern-bench .gpu/
pwd > .gpu/built_at
# Non-CUDA shared libraries from this machine's packages (spdlog, fmt, OpenBLAS, gomp, ...).
for b in .gpu/kiln .gpu/ops_parity_test .gpu/model_test .gpu/kiln-gpu-bench .gpu/kiln-load-pattern-bench; do
  ldd "$b" | awk '/=> \// {print $3}' | grep -vE 'libcuda|libcudart|libcublas|libc\.so|libm\.so|ld-linux|libpthread|libdl|librt' || true
done | sort -u | xargs -r -I{} cp -L {} .gpu/lib/
du -sh .gpu

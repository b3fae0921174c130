#!/usr/bin/env bash
# Builds the GPU binaries here (sm_90a) and stages them in .gpu/ with the shared libraries the GPU
# machine lacks, for scripts/gpu-check.sh. Run from a checkout.
# Usage: scripts/gpu-build.sh [--pack [BINARY...]]
#   --pack also writes .gpuz/gpu.tar.xz, what the device tool carries (.gpu itself, ~120 MB, is
#   over its limit): the named binaries of .gpu (default: all), stripped, and the libraries they
#   load, xz with the x86 filter and a 256 MiB window so the binaries' shared code is stored once
#   (~15 MB for all, ~3 MB less than plain `tar -cJf`). The tree that travels plus the carry must
#   stay under 64 MiB; the script prints both. scripts/gpu-check.sh needs the first five binaries; fewer
#   suit a command of your own.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=0
if [ "${1:-}" = "--pack" ]; then
  pack=1
  shift
elif [ $# -gt 0 ]; then
  echo "usage: scripts/gpu-build.sh [--pack [BINARY...]]" >&2
  exit 2
fi
cmake -S . -B build-gpu -G Ninja -DKILN_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DKILN_SKIP_MODULES= >/dev/null
cmake --build build-gpu --target kiln ops_parity_test model_test kiln-gpu-bench kiln-load-pattern-bench dist_test kiln-quant-bench
rm -rf .gpu && mkdir -p .gpu/lib
cp build-gpu/src/cli/kiln build-gpu/tests/ops/ops_parity_test build-gpu/tests/model/model_test \
  build-gpu/bench/kiln-gpu-bench build-gpu/bench/kiln-load-pattern-bench build-gpu/tests/dist/dist_test \
  build-gpu/bench/kiln-quant-bench .gpu/
pwd > .gpu/built_at
# The non-CUDA shared libraries the given binaries load from this machine's packages (spdlog, fmt,
# OpenBLAS, gomp, ...), one path a line.
needed_libs() {
  for b in "$@"; do
    ldd "$b" | awk '/=> \// {print $3}' | grep -vE 'libcuda|libcudart|libcublas|libnccl|libc\.so|libm\.so|ld-linux|libpthread|libdl|librt' || true
  done | sort -u
}
needed_libs .gpu/kiln .gpu/ops_parity_test .gpu/model_test .gpu/kiln-gpu-bench .gpu/kiln-load-pattern-bench .gpu/dist_test \
  .gpu/kiln-quant-bench |
  xargs -r -I{} cp -L {} .gpu/lib/
du -sh .gpu
if [ "$pack" = 1 ]; then
  names=("$@")
  [ ${#names[@]} -gt 0 ] || names=(kiln ops_parity_test model_test kiln-gpu-bench kiln-load-pattern-bench dist_test kiln-quant-bench)
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/.gpu/lib" .gpuz
  cp .gpu/built_at "$stage/.gpu/"
  # Only the libraries the named binaries load: without kiln, libcurl's chain (~3 MB packed) stays.
  needed_libs "${names[@]/#/.gpu/}" | xargs -r -n1 basename | xargs -r -I{} cp .gpu/lib/{} "$stage/.gpu/lib/"
  for n in "${names[@]}"; do strip -o "$stage/.gpu/$n" ".gpu/$n"; done
  tar -C "$stage" -cf - .gpu | xz --x86 --lzma2=preset=9e,dict=256MiB -T1 > .gpuz/gpu.tar.xz
  carry=$(stat -c %s .gpuz/gpu.tar.xz)
  tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null || true) |
    awk '{s += $1} END {print s + 0}')
  awk -v c="$carry" -v t="$tree" 'BEGIN {
    printf "pack: .gpuz/gpu.tar.xz %.1f MiB + tree %.1f MiB = %.1f MiB of the device tool'"'"'s 64\n",
      c / 1048576, t / 1048576, (c + t) / 1048576 }'
fi

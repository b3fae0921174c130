#!/usr/bin/env bash
# Installs every Debian package that building, running and testing Kiln needs on a fresh
# Debian 12 machine. Safe to run again. CUDA is optional: when /usr/local/cuda/bin/nvcc exists the
# build adds the CUDA backend, otherwise it builds CPU-only.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
PKGS=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  clang-14 clang-format-14 libclang-rt-14-dev        # format check, libFuzzer, sanitizer runtime
  libgtest-dev libgmock-dev libbenchmark-dev          # tests and microbenchmarks
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libpcre2-dev libutf8proc-dev                         # tokenizer regex + unicode normalisation
  libopenblas-dev libomp-dev                           # CPU reference speed
  libboost-dev libssl-dev zlib1g-dev                   # HTTP server (Boost.Asio + Beast, header-only)
  libcurl4-openssl-dev                                 # kiln bench serve: HTTP client (multi-socket API)
  curl                                                 # scripts/serve-demo.sh (the README demo)
  openmpi-bin                                          # mpirun: the multi-process launch tests (tests/dist)
  python3
)
missing=()
# Node.js ships npm itself when it comes from NodeSource; Debian splits it out.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all packages present"

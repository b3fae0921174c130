# Sourced by the GPU machine's scripts (gpu-check.sh, gpu-serve-bench.sh) from the repository
# root: unpacks the carried binaries, sets OUT and the library path, and records the GPU.
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
# The device tool carries .gpuz/gpu.tar.xz (made by scripts/gpu-build.sh --pack): .gpu is too big.
# A warm machine keeps the .gpu an earlier call unpacked (ignored outputs stay), so the archive,
# when there is one, replaces it every time.
if [ -f .gpuz/gpu.tar.xz ]; then rm -rf .gpu && tar -xJf .gpuz/gpu.tar.xz; fi
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}"
# The binaries carry the paths they were built with (the lead worktree): recreate them here.
BUILT=$(cat .gpu/built_at)
mkdir -p "$BUILT/build-gpu/src/cli" && cp .gpu/kiln "$BUILT/build-gpu/src/cli/kiln"
[ -e "$BUILT/tests" ] || ln -s "$PWD/tests" "$BUILT/tests"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"

#!/usr/bin/env bash
# Puts `kiln` on PATH: a symbolic link PREFIX/bin/kiln to the built binary build/src/cli/kiln (so a
# rebuild updates it). PREFIX defaults to ~/.local; /usr/local needs root.
# Usage: scripts/install.sh [PREFIX]    (build first: scripts/demo.sh, or cmake --build build --target kiln)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:-$HOME/.local}
BIN=$PWD/build/src/cli/kiln
if [ ! -x "$BIN" ]; then
  echo "install: $BIN is not built yet: run scripts/demo.sh (or cmake --build build --target kiln) first" >&2
  exit 1
fi
mkdir -p "$PREFIX/bin"
ln -sfn "$BIN" "$PREFIX/bin/kiln"
echo "install: $PREFIX/bin/kiln -> $BIN"
case ":$PATH:" in
  *":$PREFIX/bin:"*) ;;
  *) echo "install: $PREFIX/bin is not on PATH; add it: export PATH=\"$PREFIX/bin:\$PATH\"" ;;
esac

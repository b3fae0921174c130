#!/usr/bin/env bash
# Builds kiln_fake_serve_old (old_fake_serve.cc beside this script): the cpp-httplib front end that
# `kiln serve` had before commit 98572c9, before a fake engine, for scripts/http-frontend-ab.sh.
# Kept out of the CMake build on purpose: the old front end is gone from the product.
#
#   scripts/frontend-ab/build-old.sh OUT_BINARY [COMMIT]     (COMMIT: default 98572c9^)
#
# A temporary git worktree of COMMIT supplies src/engine/stream.{h,cc} (the engine -> front end
# hand-off of the time); the fake is compiled against them with the project's Release flags and
# linked with cpp-httplib through pkg-config, as that tree's src/server/CMakeLists.txt did. The
# headers come from Debian's libcpp-httplib-dev, as that tree's scripts/setup.sh installed them;
# it is installed here when missing (apt-get, as root or with sudo).
set -euo pipefail
OUT=${1:?output binary path}
COMMIT=${2:-98572c9^}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(git -C "$HERE" rev-parse --show-toplevel)

if ! pkg-config --exists cpp-httplib; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  echo "build-old: installing libcpp-httplib-dev (the old tree's scripts/setup.sh did)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libcpp-httplib-dev >/dev/null
fi

TMP=$(mktemp -d)
cleanup() {
  git -C "$REPO" worktree remove --force "$TMP/old" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
git -C "$REPO" worktree add --quiet --detach "$TMP/old" "$COMMIT"
# The old server's code must still be there: a wrong COMMIT would measure nothing old.
grep -q "httplib::ThreadPool" "$TMP/old/src/server/server.cc" || {
  echo "build-old: $COMMIT has no cpp-httplib server (src/server/server.cc)" >&2
  exit 1
}
cp "$HERE/old_fake_serve.cc" "$TMP/old/src/server/old_fake_serve.cc"

CXX=${CXX:-c++}
LAUNCHER=()
if command -v ccache >/dev/null; then LAUNCHER=(ccache); fi
mkdir -p "$(dirname "$OUT")"
# -O3 -DNDEBUG -std=c++20 (-Wno-unused-parameter): the project's Release flags (both trees).
# shellcheck disable=SC2046  # pkg-config's flags are meant to be split
"${LAUNCHER[@]}" "$CXX" -O3 -DNDEBUG -std=c++20 -Wall -Wextra -Wno-unused-parameter -pthread -I"$TMP/old/src" \
  $(pkg-config --cflags cpp-httplib) -c "$TMP/old/src/server/old_fake_serve.cc" -o "$TMP/fake.o"
"${LAUNCHER[@]}" "$CXX" -O3 -DNDEBUG -std=c++20 -Wall -Wextra -Wno-unused-parameter -pthread -I"$TMP/old/src" \
  -c "$TMP/old/src/engine/stream.cc" -o "$TMP/stream.o"
# shellcheck disable=SC2046
"$CXX" -pthread "$TMP/fake.o" "$TMP/stream.o" $(pkg-config --libs cpp-httplib) -o "$OUT"
echo "build-old: $OUT (front end of $(git -C "$REPO" rev-parse --short "$COMMIT"), cpp-httplib $(pkg-config --modversion cpp-httplib))"

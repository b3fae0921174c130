#!/usr/bin/env bash
# clang-format over our C++/CUDA sources. `--check` fails (listing the files) instead of rewriting.
set -euo pipefail
cd "$(dirname "$0")/.."
CF=$(command -v clang-format-14 || command -v clang-format)
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- 'src/*.h' 'src/*.cc' 'src/*.cu' 'src/*.cuh' \
  'tests/*.h' 'tests/*.cc' 'tests/*.cu' 'bench/*.cc' 'bench/*.cu' 'fuzz/*.cc' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    if ! "$CF" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
  done
  if [ "${#bad[@]}" -gt 0 ]; then
    echo "format: these files need scripts/format.sh:"; printf '  %s\n' "${bad[@]}"; exit 1
  fi
  echo "format: ${#files[@]} files clean"
else
  "$CF" --style=file -i "${files[@]}"
fi

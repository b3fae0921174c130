#!/usr/bin/env bash
# Runs ctest with the given arguments and ends its output with the verdict instead of ctest's list
# of skipped tests (30 lines of GPU tests on a machine without a GPU read like failures): that list
# becomes "N GPU tests skipped (no GPU)", tests skipped for any other reason are still named, and the
# last line is "tests: P passed, F failed, S skipped". The exit status is ctest's (non-zero when a
# test failed), or 1 when the summary says a test failed and ctest did not.
# Usage: scripts/ctest-summary.sh --test-dir BUILD [more ctest arguments]
# CTEST_SUMMARY_OUT=FILE appends "P F S" to FILE, for a caller that totals several runs.
set -uo pipefail

dir=.
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  if [ "${args[i]}" = --test-dir ]; then dir=${args[i + 1]}; fi
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# ctest's own output, live, without the "did not run" list (a tab or spaces, "N - name (Skipped)").
ctest "$@" 2>&1 | tee "$log" | awk '
  /^The following tests did not run:$/ { in_list = 1; next }
  in_list && /^[ \t]+[0-9]+ - / { next }
  { in_list = 0; print; fflush() }'
rc=${PIPESTATUS[0]}

# "100% tests passed, 0 tests failed out of 334"
total=$(sed -n 's/^[0-9]*% tests passed, [0-9]* tests* failed out of \([0-9]*\)$/\1/p' "$log" | tail -n 1)
failed=$(sed -n 's/^[0-9]*% tests passed, \([0-9]*\) tests* failed out of [0-9]*$/\1/p' "$log" | tail -n 1)
if [ -z "$total" ]; then
  echo "tests: ctest ended (exit $rc) before its summary"
  [ "$rc" -ne 0 ] && exit "$rc"
  exit 1
fi
skipped_names=$(awk '/^The following tests did not run:$/ { in_list = 1; next }
  in_list && /^[ \t]+[0-9]+ - / {
    sub(/^[ \t]+[0-9]+ - /, ""); sub(/ \([A-Za-z ]+\)$/, ""); sub(/ +# GetParam\(\) = .*$/, ""); print; next }
  { in_list = 0 }' "$log")
# Which skipped tests said they need a GPU: their output in ctest's log holds the GPU tests' reason.
gpu_names=$(awk '/^[0-9]+\/[0-9]+ Test: / { name = $3 }
  /no CUDA GPU|needs [0-9]+ CUDA GPU/ && name != "" { print name; name = "" }' \
  "$dir/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u)
skipped=0 gpu=0
other=()
while IFS= read -r name; do
  [ -z "$name" ] && continue
  skipped=$((skipped + 1))
  if grep -qxF -- "$name" <<<"$gpu_names"; then gpu=$((gpu + 1)); else other+=("$name"); fi
done <<<"$skipped_names"
passed=$((total - failed - skipped))

[ "$gpu" -gt 0 ] && echo "$gpu GPU tests skipped (no GPU)"
if [ "${#other[@]}" -gt 0 ]; then
  echo "${#other[@]} test(s) skipped for another reason (their output says why: ctest -R NAME -V):"
  printf '  %s\n' "${other[@]}"
fi
[ -n "${CTEST_SUMMARY_OUT:-}" ] && echo "$passed $failed $skipped" >>"$CTEST_SUMMARY_OUT"
echo "tests: $passed passed, $failed failed, $skipped skipped"
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
[ "$failed" -eq 0 ]

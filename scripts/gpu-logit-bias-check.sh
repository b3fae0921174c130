#!/usr/bin/env bash
# logit_bias on the CUDA backend (issue 38): such rows are sampled on the host beside the device-
# sampled rows of the same step. Serves the bundled model on CUDA and checks, through the HTTP API:
#   1. +100 on token 501 makes it every greedy token, and the logprob reported with it is the raw
#      model's (the same token scored as part of the prompt, within 2e-3);
#   2. batched with plain greedy requests (rows sampled on the device in the same steps), the biased
#      one still gives only that token and the others complete.
# Prints "logit_bias on CUDA: OK" and exits 0, or says what differed and exits 1.
# Usage on the GPU machine (after scripts/gpu-build.sh --pack kiln here): bash scripts/gpu-logit-bias-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
LOG=$(mktemp)
.gpu/kiln serve --model models/kiln-tiny --device cuda --port 8012 >"$LOG" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 1 300); do
  env -u LD_LIBRARY_PATH curl -sf http://127.0.0.1:8012/health >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "kiln serve exited:"; tail -20 "$LOG"; exit 1; }
  sleep 0.5
done
python3 - <<'PY'
import json, sys, threading, urllib.request

def post(body):
    req = urllib.request.Request("http://127.0.0.1:8012/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))

prefix, X = [10, 20, 30], 501
scored = post({"prompt": prefix + [X], "max_tokens": 0, "echo": True, "logprobs": 0})["choices"][0]["logprobs"]
raw, text = scored["token_logprobs"][-1], scored["tokens"][-1]
biased = post({"prompt": prefix, "max_tokens": 3, "temperature": 0, "logprobs": 0, "logit_bias": {str(X): 100}})
got = biased["choices"][0]
ok = True
if got["text"] != text * 3:
    print(f"biased text {got['text']!r}, expected {text * 3!r}"); ok = False
if abs(got["logprobs"]["token_logprobs"][0] - raw) > 2e-3:
    print(f"biased logprob {got['logprobs']['token_logprobs'][0]} is not the raw {raw}"); ok = False

# Batched with plain greedy requests (device-sampled rows beside the host-sampled one): the
# biased one still gives only X, the others complete with all their tokens.
plain = [{"prompt": [7 + i, 40, 41], "max_tokens": 8, "temperature": 0, "ignore_eos": True} for i in range(6)]
out = [None] * (len(plain) + 1)
def run(i, body):
    out[i] = post(body)
bodies = plain + [{"prompt": prefix, "max_tokens": 8, "temperature": 0, "logit_bias": {str(X): 100}}]
threads = [threading.Thread(target=run, args=(i, b)) for i, b in enumerate(bodies)]
for t in threads: t.start()
for t in threads: t.join()
if any(o is None or o["usage"]["completion_tokens"] != 8 for o in out[:-1]):
    print(f"plain requests batched with a biased one: {out[:-1]}"); ok = False
if out[-1] is None or out[-1]["choices"][0]["text"] != text * 8:
    print(f"the batched biased request: {out[-1]}"); ok = False
print("logit_bias on CUDA: OK" if ok else "logit_bias on CUDA: FAILED")
sys.exit(0 if ok else 1)
PY

#!/usr/bin/env python3
"""A second, dependency-free implementation of the block drafter's math (stdlib only), for checking
the C++ forward where torch is not installed. It writes a fixture in reference.py's format at a
small shape, computed with plain Python lists (the expanded MLA form, explicit loops):

    python3 tools/dspark/crosscheck_nodeps.py tests/data/fixtures/dspark_tiny [--no-q-lora] [--neox]
    build/tests/spec/spec_block_drafter_test --gtest_filter='*Parity*'

The committed fixture (default flags) is this script's until tools/dspark/reference.py (PyTorch)
has run on a machine with torch; the two are independent implementations of the same architecture.
"""

import json
import math
import os
import random
import struct
import sys


def config(q_lora, interleave):
    return {
        "architectures": ["DeepseekV3DSparkModel"], "model_type": "deepseek_v3", "vocab_size": 97,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2,
        "q_lora_rank": 16 if q_lora else None, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8, "v_head_dim": 8, "first_k_dense_replace": 2, "moe_intermediate_size": 16,
        "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "rope_interleave": interleave,
        "num_target_layers": 4, "target_layer_ids": [0, 2], "block_size": 4, "mask_token_id": 96,
        "markov_rank": 8, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True,
    }


def weights(c, rng):
    H, V, nh, r, d = c["hidden_size"], c["vocab_size"], c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    nope, vd, I, R, L = c["qk_nope_head_dim"], c["v_head_dim"], c["intermediate_size"], c["markov_rank"], 2
    qk, ql = nope + d, c["q_lora_rank"]

    def mat(n, k, s=None):
        s = k ** -0.5 if s is None else s
        return [[rng.gauss(0, 1) * s for _ in range(k)] for _ in range(n)]

    def norm(n):
        return [1 + 0.1 * rng.gauss(0, 1) for _ in range(n)]

    w = {"embed_tokens.weight": mat(V, H, 1.0), "lm_head.weight": mat(V, H), "fc.weight": mat(H, L * H),
         "hidden_norm.weight": norm(H), "norm.weight": norm(H), "markov_head.markov_w1.weight": mat(V, R, 1.0),
         "markov_head.markov_w2.weight": mat(V, R), "confidence_head.proj.weight": mat(1, H + R),
         "confidence_head.proj.bias": [0.1 * rng.gauss(0, 1)]}
    for l in range(c["num_hidden_layers"]):
        p = f"layers.{l}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = norm(H), norm(H)
        if ql:
            w[p + "self_attn.q_a_proj.weight"] = mat(ql, H)
            w[p + "self_attn.q_a_layernorm.weight"] = norm(ql)
            w[p + "self_attn.q_b_proj.weight"] = mat(nh * qk, ql)
        else:
            w[p + "self_attn.q_proj.weight"] = mat(nh * qk, H)
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = mat(r + d, H)
        w[p + "self_attn.kv_a_layernorm.weight"] = norm(r)
        w[p + "self_attn.kv_b_proj.weight"] = mat(nh * (nope + vd), r)
        w[p + "self_attn.o_proj.weight"] = mat(H, nh * vd)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = mat(I, H), mat(I, H)
        w[p + "mlp.down_proj.weight"] = mat(H, I)
    return w


def mv(W, x):
    return [sum(a * b for a, b in zip(row, x)) for row in W]


def rms(x, g, eps):
    s = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * s * gi for v, gi in zip(x, g)]


def rope(x, pos, theta, interleave):
    d, out = len(x), list(x)
    for i in range(d // 2):
        a = pos / theta ** (2 * i / d)
        cs, sn = math.cos(a), math.sin(a)
        e, o = (2 * i, 2 * i + 1) if interleave else (i, i + d // 2)
        out[e], out[o] = x[e] * cs - x[o] * sn, x[e] * sn + x[o] * cs
    return out


def layer(w, c, l, X, ctx, anchor_pos):
    p, eps, th, il = f"layers.{l}.", c["rms_norm_eps"], c["rope_theta"], c["rope_interleave"]
    nh, nope, d, vd, r = (c[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                         "v_head_dim", "kv_lora_rank"))
    qk, B = nope + d, len(X)
    hn = [rms(x, w[p + "input_layernorm.weight"], eps) for x in X]

    def latent(src, pos):  # -> (k_nope, v) per head, roped k_pe
        kva = mv(w[p + "self_attn.kv_a_proj_with_mqa.weight"], src)
        kvb = mv(w[p + "self_attn.kv_b_proj.weight"], rms(kva[:r], w[p + "self_attn.kv_a_layernorm.weight"], eps))
        heads = [(kvb[h * (nope + vd):h * (nope + vd) + nope], kvb[h * (nope + vd) + nope:(h + 1) * (nope + vd)])
                 for h in range(nh)]
        return heads, rope(kva[r:], pos, th, il)

    # Context rows strictly before the anchor (no input norm), then every block row.
    keys = [latent(ctx[j], j) for j in range(anchor_pos)] + [latent(hn[b], anchor_pos + b) for b in range(B)]
    out = []
    for b in range(B):
        if c["q_lora_rank"]:
            qa = rms(mv(w[p + "self_attn.q_a_proj.weight"], hn[b]), w[p + "self_attn.q_a_layernorm.weight"], eps)
            q = mv(w[p + "self_attn.q_b_proj.weight"], qa)
        else:
            q = mv(w[p + "self_attn.q_proj.weight"], hn[b])
        o = []
        for h in range(nh):
            qn, qp = q[h * qk:h * qk + nope], rope(q[h * qk + nope:(h + 1) * qk], anchor_pos + b, th, il)
            s = [(sum(x * y for x, y in zip(qn, kh[h][0])) + sum(x * y for x, y in zip(qp, pe))) * qk ** -0.5
                 for kh, pe in keys]
            m = max(s)
            e = [math.exp(v - m) for v in s]
            z = sum(e)
            o += [sum(e[j] / z * keys[j][0][h][1][i] for j in range(len(keys))) for i in range(vd)]
        x = [a + b2 for a, b2 in zip(X[b], mv(w[p + "self_attn.o_proj.weight"], o))]
        h2 = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g, u = mv(w[p + "mlp.gate_proj.weight"], h2), mv(w[p + "mlp.up_proj.weight"], h2)
        act = [gi / (1 + math.exp(-gi)) * ui for gi, ui in zip(g, u)]
        out.append([a + b2 for a, b2 in zip(x, mv(w[p + "mlp.down_proj.weight"], act))])
    return out


def draft(w, c, feats, anchor, anchor_pos, prev=None):
    eps, B = c["rms_norm_eps"], c["block_size"]
    ctx = [rms(mv(w["fc.weight"], f), w["hidden_norm.weight"], eps) for f in feats]
    X = [list(w["embed_tokens.weight"][t]) for t in [anchor] + [c["mask_token_id"]] * (B - 1)]
    for l in range(c["num_hidden_layers"]):
        X = layer(w, c, l, X, ctx, anchor_pos)
    hs = [rms(x, w["norm.weight"], eps) for x in X]
    base = [mv(w["lm_head.weight"], h) for h in hs]
    toks, logits, conf, p = [], [], [], anchor
    for k in range(B):
        if prev is not None:
            p = prev[k]
        e = w["markov_head.markov_w1.weight"][p]
        lg = [a + b for a, b in zip(base[k], mv(w["markov_head.markov_w2.weight"], e))]
        zc = mv(w["confidence_head.proj.weight"], hs[k] + e)[0] + w["confidence_head.proj.bias"][0]
        p = max(range(len(lg)), key=lambda i: lg[i])
        toks.append(p), logits.append(lg), conf.append(1 / (1 + math.exp(-zc)))
    return toks, logits, base, conf


def flat(v):
    return [y for x in v for y in flat(x)] if isinstance(v, list) else [v]


def shape(v):
    return [len(v)] + shape(v[0]) if isinstance(v, list) else []


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        kind, v = tensors[name]
        data = struct.pack(f"<{len(flat(v))}{'i' if kind == 'I32' else 'f'}", *flat(v))
        header[name] = {"dtype": kind, "shape": shape(v), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    c = config("--no-q-lora" not in sys.argv, "--neox" not in sys.argv)
    rng = random.Random(41)
    w = weights(c, rng)
    n_ctx, a, L, H, B = 8, 6, 2, c["hidden_size"], c["block_size"]
    feats = [[rng.gauss(0, 2) for _ in range(L * H)] for _ in range(n_ctx)]
    anchor = 17
    toks, logits, base, conf = draft(w, c, feats, anchor, a)
    prev = [anchor] + [rng.randrange(c["vocab_size"]) for _ in range(B - 1)]
    _, s_logits, _, s_conf = draft(w, c, feats, anchor, a, prev)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    write_safetensors(os.path.join(out, "model.safetensors"), {k: ("F32", v) for k, v in w.items()})
    write_safetensors(os.path.join(out, "io.safetensors"), {
        "context_features": ("F32", feats), "expected_tokens": ("I32", toks), "expected_logits": ("F32", logits),
        "expected_base_logits": ("F32", base), "expected_confidence": ("F32", conf),
        "score_prev": ("I32", prev), "score_logits": ("F32", s_logits), "score_confidence": ("F32", s_conf)})
    with open(os.path.join(out, "io.json"), "w") as f:
        json.dump({"anchor_token": anchor, "anchor_position": a, "n_context": n_ctx,
                   "command": "python3 tools/dspark/crosscheck_nodeps.py " + " ".join(sys.argv[1:])}, f, indent=2)
    print(f"wrote {out}: tokens {toks}, confidence {[round(x, 4) for x in conf]}")


if __name__ == "__main__":
    main()

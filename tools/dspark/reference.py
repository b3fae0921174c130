#!/usr/bin/env python3
"""PyTorch reference of Kiln's DSpark-style block drafter (src/spec/block_drafter_model.h).

Writes the parity fixture that tests/spec/block_drafter_test.cc compares the C++ forward against:

    python3 tools/dspark/reference.py tests/data/fixtures/dspark_tiny

Needs only torch (CPU is enough; about a second). Everything lands in the one directory given:
  config.json        the draft's config (DeepSeek-V3 family fields + DeepSpec's DSpark fields)
  model.safetensors  deterministic random weights in DeepSpec's tensor names (f32)
  io.safetensors     context_features [n_ctx, L*H]; greedy: expected_tokens [B], expected_logits
                     [B, V] (with the Markov bias), expected_base_logits [B, V], expected_confidence
                     [B]; teacher-forced: score_prev [B], score_logits [B, V], score_confidence [B]
  io.json            anchor token and position, sizes, the command that wrote it

The architecture, as DeepSpec's DSpark defines it (deepseek-ai/DeepSpec, MIT), with MLA layers of
the DeepSeek-V3 family in place of Qwen3's attention; this is our own code, written from its
description, in the plain expanded MLA form (the C++ runs the absorbed form, so the two meet only
in the math):
  * context = hidden_norm(fc(concat of target layers' hidden states)), at positions 0..n_ctx-1;
    every draft layer projects these same features (no input_layernorm) into its keys/values.
  * block = embed([anchor, MASK x (B-1)]) at positions a..a+B-1; block rows attend to context rows
    at positions < a and to every block row (non-causal inside the block).
  * logits_k = lm_head(norm(h_k)) + markov_w2 @ markov_w1[prev_k], prev_0 = anchor, prev_k = the
    token drafted at k-1 (greedy: argmax of logits_{k-1}); position k predicts token a+k+1.
  * confidence_k = sigmoid(proj([norm(h_k) ; markov_w1[prev_k]]) + bias).
"""

import ctypes
import json
import os
import struct
import sys

import torch

CONFIG = {
    # The target family's fields: the draft layers' shapes (DeepSpec copies the target's config).
    "architectures": ["DeepseekV3DSparkModel"],
    "model_type": "deepseek_v3",
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,  # draft layers
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "first_k_dense_replace": 2,  # every draft layer is dense (DeepSpec's draft layers have an MLP)
    # kiln-tiny's MoE fields, unused here, keep this a well-formed config of the family (the
    # parallel-layout tests read every config.json under tests/data/fixtures).
    "moe_intermediate_size": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rope_interleave": True,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    # DeepSpec's DSpark fields.
    "num_target_layers": 5,
    "target_layer_ids": [1, 3],
    "block_size": 4,
    "mask_token_id": 1023,
    "num_anchors": 512,
    "markov_rank": 32,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
}
N_CTX = 11  # context feature rows given; only those before the anchor may be seen
ANCHOR_POS = 9
SEED = 20261206


def weights(cfg, gen):
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, qk = cfg["num_attention_heads"], cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    ql, r, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, vd, inter = cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["intermediate_size"]
    L, R = len(cfg["target_layer_ids"]), cfg["markov_rank"]

    def proj(n, k):  # unit-variance outputs for unit-variance inputs
        return torch.randn(n, k, generator=gen) * k**-0.5

    def norm(n):  # near 1, so that a swapped norm weight shows
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    w = {
        "embed_tokens.weight": torch.randn(V, H, generator=gen),
        "lm_head.weight": proj(V, H),
        "fc.weight": proj(H, L * H),
        "hidden_norm.weight": norm(H),
        "norm.weight": norm(H),
        "markov_head.markov_w1.weight": torch.randn(V, R, generator=gen),
        "markov_head.markov_w2.weight": proj(V, R),
        "confidence_head.proj.weight": proj(1, H + R),
        "confidence_head.proj.bias": 0.1 * torch.randn(1, generator=gen),
    }
    for l in range(cfg["num_hidden_layers"]):
        p = f"layers.{l}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_a_proj.weight"] = proj(ql, H)
        w[p + "self_attn.q_a_layernorm.weight"] = norm(ql)
        w[p + "self_attn.q_b_proj.weight"] = proj(nh * qk, ql)
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = proj(r + rope, H)
        w[p + "self_attn.kv_a_layernorm.weight"] = norm(r)
        w[p + "self_attn.kv_b_proj.weight"] = proj(nh * (nope + vd), r)
        w[p + "self_attn.o_proj.weight"] = proj(H, nh * vd)
        w[p + "mlp.gate_proj.weight"] = proj(inter, H)
        w[p + "mlp.up_proj.weight"] = proj(inter, H)
        w[p + "mlp.down_proj.weight"] = proj(H, inter)
    return w


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x, pos, theta):
    """Interleaved (GPT-J) rotary embedding: pairs (2i, 2i+1) turn by pos * theta^(-2i/d)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]  # [n, d/2]
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = ang.cos().float().view(shape), ang.sin().float().view(shape)
    xe, xo = x[..., 0::2], x[..., 1::2]
    return torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], dim=-1).flatten(-2)


def latent(w, p, cfg, src, pos):
    """A layer's latent rows of `src` [n, H]: kv_a_layernorm(c_kv) [n, r] and roped k_pe [n, rope]."""
    r, eps = cfg["kv_lora_rank"], cfg["rms_norm_eps"]
    kva = src @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
    c = rms_norm(kva[:, :r], w[p + "self_attn.kv_a_layernorm.weight"], eps)
    return c, rope(kva[:, r:], pos, cfg["rope_theta"])


def draft_layer(w, l, cfg, x, ctx, pos_ctx, pos_blk, anchor_pos):
    p, eps = f"layers.{l}.", cfg["rms_norm_eps"]
    nh, nope, rope_d, vd = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                             "v_head_dim"))
    B = x.shape[0]
    hn = rms_norm(x, w[p + "input_layernorm.weight"], eps)
    qa = rms_norm(hn @ w[p + "self_attn.q_a_proj.weight"].T, w[p + "self_attn.q_a_layernorm.weight"], eps)
    q = (qa @ w[p + "self_attn.q_b_proj.weight"].T).view(B, nh, nope + rope_d)
    q = torch.cat([q[..., :nope], rope(q[..., nope:], pos_blk, cfg["rope_theta"])], dim=-1)
    # Keys/values: the context features as they are, the block rows through input_layernorm.
    c_ctx, pe_ctx = latent(w, p, cfg, ctx, pos_ctx)
    c_blk, pe_blk = latent(w, p, cfg, hn, pos_blk)
    c, pe = torch.cat([c_ctx, c_blk]), torch.cat([pe_ctx, pe_blk])  # [n_ctx + B, ...]
    n = c.shape[0]
    kvb = (c @ w[p + "self_attn.kv_b_proj.weight"].T).view(n, nh, nope + vd)
    k = torch.cat([kvb[..., :nope], pe[:, None, :].expand(n, nh, rope_d)], dim=-1)  # [n, nh, qk]
    v = kvb[..., nope:]  # [n, nh, v]
    scores = torch.einsum("bhd,nhd->hbn", q, k) * (nope + rope_d) ** -0.5
    # DeepSpec's mask: context keys strictly before the anchor, every key of the block.
    allowed = torch.cat([pos_ctx < anchor_pos, torch.ones(B, dtype=torch.bool)])
    scores = scores.masked_fill(~allowed[None, None, :], float("-inf"))
    o = torch.einsum("hbn,nhd->bhd", scores.softmax(-1), v).reshape(B, nh * vd)
    x = x + o @ w[p + "self_attn.o_proj.weight"].T
    hn = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
    g, u = hn @ w[p + "mlp.gate_proj.weight"].T, hn @ w[p + "mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T


def backbone(w, cfg, features, anchor, anchor_pos):
    """h [B, H] (after the final norm) and base logits [B, V]."""
    B, eps = cfg["block_size"], cfg["rms_norm_eps"]
    ctx = rms_norm(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    pos_ctx = torch.arange(features.shape[0])
    pos_blk = anchor_pos + torch.arange(B)
    ids = torch.tensor([anchor] + [cfg["mask_token_id"]] * (B - 1))
    x = w["embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        x = draft_layer(w, l, cfg, x, ctx, pos_ctx, pos_blk, anchor_pos)
    h = rms_norm(x, w["norm.weight"], eps)
    return h, h @ w["lm_head.weight"].T


def heads(w, h, base, k, prev):
    """Position k's logits with the Markov bias of `prev`, and its confidence."""
    e = w["markov_head.markov_w1.weight"][prev]
    logits = base[k] + w["markov_head.markov_w2.weight"] @ e
    z = w["confidence_head.proj.weight"][0] @ torch.cat([h[k], e]) + w["confidence_head.proj.bias"][0]
    return logits, torch.sigmoid(z)


def draft(w, cfg, features, anchor, anchor_pos, prev=None):
    """Greedy block (prev None) or teacher-forced (prev [B], prev[0] = anchor)."""
    h, base = backbone(w, cfg, features, anchor, anchor_pos)
    tokens, logits, conf, p = [], [], [], anchor
    for k in range(cfg["block_size"]):
        if prev is not None:
            p = prev[k]
        lg, c = heads(w, h, base, k, p)
        p = int(lg.argmax())
        tokens.append(p), logits.append(lg), conf.append(c)
    return torch.tensor(tokens, dtype=torch.int32), torch.stack(logits), base, torch.stack(conf)


def margin(logits):
    top = logits.topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    names = {torch.float32: "F32", torch.int32: "I32"}
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        n = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        blobs.append(ctypes.string_at(t.data_ptr(), n))  # raw little-endian bytes, no numpy needed
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_grad_enabled(False)
    torch.set_default_dtype(torch.float32)
    cfg = CONFIG
    gen = torch.Generator().manual_seed(SEED)
    w = weights(cfg, gen)
    L, H, B = len(cfg["target_layer_ids"]), cfg["hidden_size"], cfg["block_size"]
    features = torch.randn(N_CTX, L * H, generator=gen) * 2.0
    anchor = int(torch.randint(0, cfg["vocab_size"] - 1, (1,), generator=gen))
    tokens, logits, base, conf = draft(w, cfg, features, anchor, ANCHOR_POS)
    prev = [anchor] + torch.randint(0, cfg["vocab_size"], (B - 1,), generator=gen).tolist()
    _, score_logits, _, score_conf = draft(w, cfg, features, anchor, ANCHOR_POS, prev)
    # Greedy tokens must not hinge on rounding: the top two logits of every row stay apart.
    m = min(margin(logits), margin(score_logits))
    assert m > 1e-3, f"greedy margin {m} too small for a parity fixture; change SEED"

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out, "model.safetensors"), w)
    write_safetensors(
        os.path.join(out, "io.safetensors"),
        {
            "context_features": features,
            "expected_tokens": tokens,
            "expected_logits": logits,
            "expected_base_logits": base,
            "expected_confidence": conf,
            "score_prev": torch.tensor(prev, dtype=torch.int32),
            "score_logits": score_logits,
            "score_confidence": score_conf,
        },
    )
    io = {
        "anchor_token": anchor,
        "anchor_position": ANCHOR_POS,
        "n_context": N_CTX,
        "greedy_margin": m,
        "torch": torch.__version__,
        "command": "python3 tools/dspark/reference.py tests/data/fixtures/dspark_tiny",
    }
    with open(os.path.join(out, "io.json"), "w") as f:
        json.dump(io, f, indent=2)
        f.write("\n")
    print(f"wrote {out}: tokens {tokens.tolist()}, confidence {[round(float(c), 4) for c in conf]}, margin {m:.4f}")


if __name__ == "__main__":
    main()

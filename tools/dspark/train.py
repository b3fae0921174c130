#!/usr/bin/env python3
"""Train `models/kiln-tiny-dspark`: a DSpark-style block drafter for the bundled kiln-tiny (issue 41).

Run from the repository root on the GPU machine (no network; torch, transformers, tokenizers, safetensors):
    PYTHONUNBUFFERED=1 python3 tools/dspark/train.py --out-dir models --total-seconds 480

NOT YET RUN: written without a GPU; expect to fix small things on its first run.

What it does:
 1. corpus: the same prose tools/train_small_models.py trains kiln-tiny on (its gather_corpus, same
    held-out split), encoded with kiln-tiny's own tokenizer.
 2. target: kiln-tiny in float32 (train_small_models.load_eval: the bundled bf16 weights, checked
    against Kiln's layout); hooks keep the residual stream after each decoder layer.
 3. draft (architecture of src/spec/block_drafter_model.h and tools/dspark/reference.py): MLA +
    SwiGLU layers of kiln-tiny's widths reading target layers --target-layer-ids through fc +
    hidden_norm; block [anchor, MASK x (B-1)]; vanilla Markov head; confidence head on
    [h ; markov_w1[prev]]. Embedding and lm_head are kiln-tiny's, frozen, and not saved.
 4. loss, as DeepSpec's DSpark recipe (deepseek-ai/DeepSpec, config/dspark): per sequence, random
    anchors; for block position k (predicting token a+k+1, weight exp(-k/4), supervised while the
    positions stay inside the sequence), 0.1 * CE(draft, next token) + 0.9 * L1(p_draft, p_target)
    + 1.0 * BCE(confidence, 1 - L1/2), the last detached: the expected acceptance of position k.
    The Markov head is teacher-forced with the true previous tokens.
 5. evaluation on held-out prompts continued greedily by kiln-tiny: mean accepted length of greedy
    blocks (K = 1..B) and acceptance per position, DeepSpec's probabilistic tau on held-out text.
 6. export: $OUT (or --out-dir)/kiln-tiny-dspark: config.json (DeepSpec's fields on kiln-tiny's),
    model.safetensors (bf16, DeepSpec's tensor names, no embed_tokens / lm_head), README.md (the
    model card with the metrics), metrics.json; plus train_log.txt.
"""
from __future__ import annotations

import argparse, json, math, os, random, struct, sys, time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_small_models as tsm  # noqa: E402  (the corpus, the target's loader, Log)

TARGET_DIR = Path("models/kiln-tiny")
MASK_ID = 2  # <|pad|>: never in a stream, its embedding untouched by training (DeepSpec adds a token)


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Norm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return rms(x, self.weight)


def rope(x, pos, d, theta=10000.0):
    """Interleaved pairs (2i, 2i+1), as the checkpoints' rope_interleave (Kiln's RopeParams)."""
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos.float()[..., None] * inv  # [..., d/2]
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(-2)
    cos, sin = ang.cos(), ang.sin()
    xe, xo = x[..., 0::2], x[..., 1::2]
    return torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], -1).flatten(-2)


class Attn(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        H, nh, qk = c["hidden_size"], c["num_attention_heads"], c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        self.q_a_proj = nn.Linear(H, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = Norm(c["q_lora_rank"])
        self.q_b_proj = nn.Linear(c["q_lora_rank"], nh * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, c["kv_lora_rank"] + c["qk_rope_head_dim"], bias=False)
        self.kv_a_layernorm = Norm(c["kv_lora_rank"])
        self.kv_b_proj = nn.Linear(c["kv_lora_rank"], nh * (c["qk_nope_head_dim"] + c["v_head_dim"]), bias=False)
        self.o_proj = nn.Linear(nh * c["v_head_dim"], H, bias=False)

    def latent(self, src, pos):
        r, d = self.c["kv_lora_rank"], self.c["qk_rope_head_dim"]
        kva = self.kv_a_proj_with_mqa(src)
        return self.kv_a_layernorm(kva[..., :r]), rope(kva[..., r:], pos, d)

    def forward(self, hn, ctx, pos_q, pos_ctx, allowed):
        """hn [N, Q, H] (normed block rows), ctx [N, S, H]; allowed [N, Q, S + Q]."""
        c = self.c
        nh, nope, d, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        N, Q, _ = hn.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hn))).view(N, Q, nh, nope + d)
        q = torch.cat([q[..., :nope], rope(q[..., nope:], pos_q, d)], -1)
        c_ctx, pe_ctx = self.latent(ctx, pos_ctx)
        c_blk, pe_blk = self.latent(hn, pos_q)
        lat, pe = torch.cat([c_ctx, c_blk], 1), torch.cat([pe_ctx, pe_blk], 1)  # [N, S + Q, ...]
        kvb = self.kv_b_proj(lat).view(N, lat.shape[1], nh, nope + vd)
        k = torch.cat([kvb[..., :nope], pe[:, :, None, :].expand(-1, -1, nh, -1)], -1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), kvb[..., nope:].transpose(1, 2),
                                           attn_mask=allowed[:, None], scale=(nope + d) ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(N, Q, nh * vd))


class Mlp(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(H, inter, bias=False), nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = Norm(c["hidden_size"]), Norm(c["hidden_size"])
        self.self_attn, self.mlp = Attn(c), Mlp(c["hidden_size"], c["intermediate_size"])

    def forward(self, x, ctx, pos_q, pos_ctx, allowed):
        x = x + self.self_attn(self.input_layernorm(x), ctx, pos_q, pos_ctx, allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class Draft(nn.Module):
    """Parameter names are DeepSpec's (what BlockDrafterModel::load reads)."""

    def __init__(self, c, embed, lm_head):
        super().__init__()
        H, V, R, L = c["hidden_size"], c["vocab_size"], c["markov_rank"], len(c["target_layer_ids"])
        self.c = c
        self.fc = nn.Linear(L * H, H, bias=False)
        self.hidden_norm, self.norm = Norm(H), Norm(H)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.markov_head = nn.Module()
        self.markov_head.markov_w1 = nn.Embedding(V, R)
        self.markov_head.markov_w2 = nn.Linear(R, V, bias=False)
        self.confidence_head = nn.Module()
        self.confidence_head.proj = nn.Linear(H + R, 1)
        self.register_buffer("embed", embed, persistent=False)  # the target's, frozen, not saved
        self.register_buffer("lm_head", lm_head, persistent=False)

    def backbone(self, feats, ids_q, pos_q, allowed):
        """feats [N, S, L*H] -> h [N, Q, H] (after norm), base logits [N, Q, V]."""
        ctx = self.hidden_norm(self.fc(feats))
        pos_ctx = torch.arange(feats.shape[1], device=feats.device).expand(feats.shape[0], -1)
        x = F.embedding(ids_q, self.embed)
        for layer in self.layers:
            x = layer(x, ctx, pos_q, pos_ctx, allowed)
        h = self.norm(x)
        return h, h @ self.lm_head.T

    def heads(self, h, base, prev):
        e = self.markov_head.markov_w1(prev)
        return base + self.markov_head.markov_w2(e), self.confidence_head.proj(torch.cat([h, e], -1)).squeeze(-1)


def block_inputs(ids, anchors, B, mask_id):
    """ids [N, S], anchors [N, A] -> block ids, positions [N, A*B], attention mask [N, A*B, S + A*B]."""
    N, S = ids.shape
    A = anchors.shape[1]
    k = torch.arange(B, device=ids.device)
    pos = (anchors[..., None] + k).reshape(N, A * B)
    blk = torch.full((N, A, B), mask_id, device=ids.device, dtype=ids.dtype)
    blk[..., 0] = ids.gather(1, anchors)
    qa = anchors[..., None].expand(N, A, B).reshape(N, A * B)  # each query's anchor
    ctx_ok = torch.arange(S, device=ids.device)[None, None, :] < qa[..., None]  # strictly before the anchor
    qb = torch.arange(A * B, device=ids.device) // B
    blk_ok = (qb[:, None] == qb[None, :]).expand(N, -1, -1)  # the whole own block, nothing else
    return blk.reshape(N, A * B), pos, torch.cat([ctx_ok, blk_ok], -1)


def dspark_loss(draft, feats, ids, tgt_logits, anchors, args):
    """DeepSpec's loss over the blocks at `anchors` (teacher-forced Markov head). -> loss, stats."""
    B, N, S = args.block_size, ids.shape[0], ids.shape[1]
    A = anchors.shape[1]
    blk, pos, allowed = block_inputs(ids, anchors, B, MASK_ID)
    h, base = draft.backbone(feats, blk, pos, allowed)
    lab = anchors[..., None] + torch.arange(1, B + 1, device=ids.device)  # [N, A, B]: a+k+1
    valid = lab < S
    labc = lab.clamp(max=S - 1)
    target = ids.gather(1, labc.view(N, -1)).view(N, A, B)
    prev = torch.cat([ids.gather(1, anchors)[..., None], target[..., :-1]], -1).view(N, A * B)
    logits, conf = draft.heads(h, base, prev)
    logits, conf = logits.view(N, A, B, -1).float(), conf.view(N, A, B).float()
    p_t = tgt_logits.gather(1, (labc - 1).view(N, -1, 1).expand(-1, -1, tgt_logits.shape[-1])).view_as(logits)
    p_t, p_d = p_t.softmax(-1), logits.softmax(-1)
    l1 = (p_d - p_t).abs().sum(-1)  # [N, A, B]
    ce = F.cross_entropy(logits.flatten(0, 2), target.flatten(), reduction="none").view(N, A, B)
    accept = (1 - 0.5 * l1).clamp(0, 1).detach()
    bce = F.binary_cross_entropy_with_logits(conf, accept, reduction="none")
    w = valid.float().cumprod(-1) * torch.exp(-torch.arange(B, device=ids.device) / args.loss_decay_gamma)
    den = w.sum().clamp_min(1e-6)
    loss = (args.ce_alpha * ce + args.l1_alpha * l1 + args.conf_alpha * bce).mul(w).sum() / den
    with torch.no_grad():
        tau = (accept * valid).cumprod(-1).sum(-1).mean() + 1
    return loss, {"ce": float((ce * w).sum() / den), "l1": float((l1 * w).sum() / den),
                  "bce": float((bce * w).sum() / den), "tau": float(tau)}


class Target:
    """kiln-tiny, float32, with the residual stream after each decoder layer kept by hooks."""

    def __init__(self, args, dev):
        ns = argparse.Namespace(experts_impl=args.experts_impl)
        self.model, _, _ = tsm.load_eval(TARGET_DIR, tsm.TARGET, ns, dev)
        self.model.requires_grad_(False)
        self.out = {}
        for i, layer in enumerate(self.model.model.layers):
            layer.register_forward_hook(lambda m, a, o, i=i: self.out.__setitem__(i, o[0] if isinstance(o, tuple) else o))

    @torch.no_grad()
    def __call__(self, ids, layer_ids):
        """-> features [N, S, L*H] (layer -1: the embeddings), logits [N, S, V]."""
        logits, _, _ = tsm.fwd(self.model, ids)
        emb = self.model.model.embed_tokens(ids)
        return torch.cat([emb if i == -1 else self.out[i] for i in layer_ids], -1), logits


@torch.no_grad()
def greedy_block(draft, feats, ids, a, B):
    """Greedy block after the anchor at position a of one sequence (context: positions < a): [B] tokens."""
    dev = ids.device
    blk = torch.tensor([[int(ids[a])] + [MASK_ID] * (B - 1)], device=dev)
    pos = (a + torch.arange(B, device=dev))[None]
    allowed = torch.ones(1, B, a + B, dtype=torch.bool, device=dev)  # all of the context and the block
    h, base = draft.backbone(feats[None, :a], blk, pos, allowed)
    out, prev = [], ids[a]
    for k in range(B):  # the Markov head walks the block: prev is the token just drafted
        lg, _ = draft.heads(h[0, k], base[0, k], prev)
        prev = lg.argmax()
        out.append(int(prev))
    return out


@torch.no_grad()
def evaluate(draft, target, test, args, dev, log):
    """Greedy acceptance on kiln-tiny's own greedy continuations (then teacher forcing = real decoding)."""
    B, ids_l = args.block_size, args.target_layer_ids
    accepted, per_pos, n = [0.0] * (B + 1), [0] * B, 0
    starts = torch.randperm(test.numel() - 2 * args.prompt_len, generator=torch.Generator().manual_seed(7))
    for s in starts[: args.eval_prompts].tolist():
        seq = test[s : s + args.prompt_len].long().to(dev)
        for _ in range(args.new_tokens):  # kiln-tiny's greedy continuation (no cache: tiny)
            _, logits = target(seq[None], ids_l)
            seq = torch.cat([seq, logits[0, -1].argmax()[None]])
        feats, _ = target(seq[None], ids_l)
        for a in range(args.prompt_len, seq.numel() - B - 1, args.eval_stride):
            d = greedy_block(draft, feats[0], seq, a, B)
            run = 0
            while run < B and d[run] == int(seq[a + run + 1]):
                run += 1
            for K in range(1, B + 1):
                accepted[K] += min(run, K)
            for k in range(run):
                per_pos[k] += 1
            n += 1
    res = {"blocks": n, "mean_accepted_drafts": {K: round(accepted[K] / max(n, 1), 4) for K in range(1, B + 1)},
           "accept_rate_by_position": [round(c / max(n, 1), 4) for c in per_pos]}
    log("greedy acceptance:", json.dumps(res))
    return res


def export(draft, cfg, folder: Path, metrics):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in draft.state_dict().items()}
    from safetensors.torch import save_file

    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str) + "\n")
    acc = metrics.get("eval", {}).get("mean_accepted_drafts", {})
    (folder / "README.md").write_text(
        "# kiln-tiny-dspark\n\nA DSpark-style block drafter for `models/kiln-tiny` (issue 41), trained by "
        "`tools/dspark/train.py` against kiln-tiny's own outputs with DeepSpec's loss (0.1 CE + 0.9 L1 + BCE of "
        "the confidence head; position weights exp(-k/4)).\n\n"
        f"- {cfg['num_hidden_layers']} MLA draft layers of kiln-tiny's widths reading target layers "
        f"{cfg['target_layer_ids']}; block size {cfg['block_size']}; MASK = token {cfg['mask_token_id']}; "
        f"Markov rank {cfg['markov_rank']}; confidence head with the Markov row.\n"
        "- Embedding and lm_head are kiln-tiny's and are not stored here: load with the target "
        "(`BlockDrafterModel::load(dir, backend, &target_weights)`).\n"
        f"- {metrics['params'] / 1e6:.2f}M parameters, bf16; {metrics['steps']} steps in {metrics['train_seconds']:.0f} s.\n"
        f"- Greedy mean accepted drafts by K (held-out prompts continued greedily by kiln-tiny): {acc}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default="models")
    ap.add_argument("--total-seconds", type=float, default=480)
    ap.add_argument("--eval-seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--block-size", type=int, default=7)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--target-layer-ids", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--num-anchors", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--ce-alpha", type=float, default=0.1)
    ap.add_argument("--l1-alpha", type=float, default=0.9)
    ap.add_argument("--conf-alpha", type=float, default=1.0)
    ap.add_argument("--loss-decay-gamma", type=float, default=4.0)
    ap.add_argument("--eval-prompts", type=int, default=24)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--eval-stride", type=int, default=3)
    ap.add_argument("--experts-impl", default="eager")
    # gather_corpus's knobs (train_small_models.py's defaults: the same split kiln-tiny saw)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--corpus-seconds", type=float, default=75)
    ap.add_argument("--max-chars", type=int, default=48_000_000)
    ap.add_argument("--min-prose-chars", type=int, default=8_000_000)
    ap.add_argument("--heldout-permille", type=int, default=10)
    args = ap.parse_args()
    outp = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(args.out_dir)
    log = tsm.Log(outp / "train_log.txt")
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    from tokenizers import Tokenizer

    train_docs, test_docs, _ = tsm.gather_corpus(args, log)  # before CUDA: it forks
    tok = Tokenizer.from_file(str(TARGET_DIR / "tokenizer.json"))
    train_ids, _ = tsm.encode_stream(tok, [t for _, t in train_docs])
    test_ids, _ = tsm.encode_stream(tok, [t for _, t in test_docs])
    log(f"tokens: train {train_ids.numel()}, test {test_ids.numel()}")
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    target = Target(args, dev)
    tc = json.loads((TARGET_DIR / "config.json").read_text())
    cfg = dict(tc)
    cfg.update({"architectures": ["DeepseekV3DSparkModel"], "num_hidden_layers": args.draft_layers,
                "first_k_dense_replace": args.draft_layers, "num_nextn_predict_layers": 0,
                "num_target_layers": tc["num_hidden_layers"], "target_layer_ids": args.target_layer_ids,
                "block_size": args.block_size, "mask_token_id": MASK_ID, "num_anchors": args.num_anchors,
                "markov_rank": args.markov_rank, "markov_head_type": "vanilla", "enable_confidence_head": True,
                "confidence_head_with_markov": True})
    m = target.model
    draft = Draft(cfg, m.model.embed_tokens.weight.detach().float(), m.lm_head.weight.detach().float()).to(dev)
    params = [p for p in draft.parameters() if p.requires_grad]
    metrics = {"args": vars(args), "params": sum(p.numel() for p in params)}
    log(f"draft: {metrics['params'] / 1e6:.2f}M trainable parameters")
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    data, S = train_ids.to(dev), args.seq_len
    budget = args.total_seconds - args.eval_seconds - (time.time() - tsm.T0)
    t0, step = time.time(), 0
    while time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        for g in opt.param_groups:  # 4% warm-up, then cosine
            g["lr"] = args.lr * min(1.0, frac / 0.04) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        off = torch.randint(0, data.numel() - S, (args.batch,), device=dev)
        ids = data[off[:, None] + torch.arange(S, device=dev)].long()
        feats, tlog = target(ids, args.target_layer_ids)
        anchors = torch.stack([torch.randperm(S - 1, device=dev)[: args.num_anchors] for _ in range(args.batch)])
        anchors = anchors.sort(-1).values
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, st = dspark_loss(draft, feats, ids, tlog, anchors, args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            log(f"step {step}: loss {loss.item():.4f} " + " ".join(f"{k} {v:.4f}" for k, v in st.items()))
    metrics.update(steps=step, train_seconds=time.time() - t0)
    draft.eval()
    metrics["eval"] = evaluate(draft, target, test_ids, args, dev, log)
    export(draft, cfg, outp / "kiln-tiny-dspark", metrics)
    log(f"wrote {outp / 'kiln-tiny-dspark'}")


if __name__ == "__main__":
    main()

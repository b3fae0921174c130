#!/usr/bin/env python3
"""Reference fixtures for Kiln's DeepSeek-V3 forward, made with Hugging Face transformers.

Runs on the GPU machine (PyTorch + transformers 5.x; the GPU is optional). For each small
random-weight config it writes, under OUT/<name>/:
  config.json        as a checkpoint would ship it (spelling chosen per fixture)
  model.safetensors  float32 weights in the published DeepSeek-V3 tensor names
  expected.json      teacher-forced logprobs of ids (with each token's routing margin), and a greedy
                     continuation with top-2 margins
Some fixtures are also written quantized (QUANTIZED below), each with expectations computed from
its dequantised weights: FP8 e4m3 block-scaled as DeepSeek-V3 ships (`weight` + `weight_scale_inv`),
and compressed-tensors pack-quantized INT4 routed experts as Kimi K2-Thinking ships (`weight_packed`,
`weight_scale`, `weight_shape`; docs/quantization.md).

Usage: python3 tools/make_fixtures.py --out DIR [--only NAME ...]
"""
import argparse
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

FIXTURES = {
    # 12 heads (96 / TP8), q LoRA, grouped routing, YaRN in the newer rope_parameters spelling.
    "h12_qlora_grouped_yarn": dict(
        spelling="rope_parameters", model_type="deepseek_v3",
        cfg=dict(vocab_size=160, hidden_size=64, intermediate_size=96, moe_intermediate_size=24,
                 num_hidden_layers=3, num_attention_heads=12, num_key_value_heads=12, n_shared_experts=1,
                 n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1,
                 routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=48, kv_lora_rank=32,
                 qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24, max_position_embeddings=2560,
                 rms_norm_eps=1e-6, rope_interleave=True, tie_word_embeddings=False),
        rope=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=64,
                  beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)),
    # Kimi K2 style: 24 heads, one group, theta 50000, YaRN beta 1/1, published rope_scaling spelling.
    "h24_kimi_k2_style": dict(
        spelling="rope_scaling", model_type="kimi_k2",
        cfg=dict(vocab_size=200, hidden_size=96, intermediate_size=160, moe_intermediate_size=32,
                 num_hidden_layers=2, num_attention_heads=24, num_key_value_heads=24, n_shared_experts=1,
                 n_routed_experts=12, num_experts_per_tok=4, n_group=1, topk_group=1, first_k_dense_replace=1,
                 routed_scaling_factor=2.827, norm_topk_prob=True, q_lora_rank=40, kv_lora_rank=48,
                 qk_rope_head_dim=8, qk_nope_head_dim=24, v_head_dim=16, max_position_embeddings=4096,
                 rms_norm_eps=1e-6, rope_interleave=True, tie_word_embeddings=False),
        rope=dict(type="yarn", rope_theta=50000.0, factor=32.0, original_max_position_embeddings=128,
                  beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)),
    # No q LoRA, odd sizes, 5 heads, two dense layers, NeoX-style rope halves, tied embeddings.
    "h5_noqlora_dense2_odd": dict(
        spelling="rope_scaling", model_type="deepseek_v3",
        cfg=dict(vocab_size=151, hidden_size=90, intermediate_size=100, moe_intermediate_size=36,
                 num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=5, n_shared_experts=2,
                 n_routed_experts=6, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=2,
                 routed_scaling_factor=1.5, norm_topk_prob=False, q_lora_rank=None, kv_lora_rank=40,
                 qk_rope_head_dim=6, qk_nope_head_dim=12, v_head_dim=20, max_position_embeddings=512,
                 rms_norm_eps=1e-5, rope_interleave=False, tie_word_embeddings=True),
        rope=None, rope_theta=10000.0),
    # Moonlight's and DeepSeek-V3's attention widths (latent 512, rope 64, nope 128, v 128, no q
    # LoRA) at 12 heads (96 / TP8): the shapes the CUDA MLA fast paths serve (the tensor-core
    # prefill and the absorbed decode over 576-wide cache rows), which the small fixtures above
    # reach only through the general kernels. One MoE layer (no dense one) and small elsewhere: the
    # 512-wide kv_b of 12 heads alone is 3.1 MB of bf16, and device runs carry the tree (64 MiB).
    "h12_mla512_moonlight_widths": dict(
        spelling="rope_scaling", model_type="deepseek_v3",
        cfg=dict(vocab_size=256, hidden_size=128, intermediate_size=192, moe_intermediate_size=32,
                 num_hidden_layers=1, num_attention_heads=12, num_key_value_heads=12, n_shared_experts=2,
                 n_routed_experts=8, num_experts_per_tok=3, n_group=1, topk_group=1, first_k_dense_replace=0,
                 routed_scaling_factor=2.446, norm_topk_prob=True, q_lora_rank=None, kv_lora_rank=512,
                 qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, max_position_embeddings=8192,
                 rms_norm_eps=1e-5, rope_interleave=True, tie_word_embeddings=False),
        rope=None, rope_theta=50000.0),
}
# Quantized copies written beside a fixture: (suffix, format, block or group size). The 128 x 128
# FP8 and group-32 INT4 copies of the Moonlight-width fixture are the production formats at the
# production attention widths (issue 40).
QUANTIZED = {
    "h12_qlora_grouped_yarn": [("_fp8", "fp8", [16, 16])],
    "h12_mla512_moonlight_widths": [("_fp8", "fp8", [128, 128]), ("_int4", "int4", 32)],
}
PROMPT_LEN, CONT_LEN, GREEDY_STEPS = 24, 16, 16


def make_config(spec):
    cfg = dict(spec["cfg"])
    rope = spec.get("rope")
    file_cfg = dict(cfg, model_type=spec["model_type"], architectures=["DeepseekV3ForCausalLM"],
                    hidden_act="silu", scoring_func="sigmoid", topk_method="noaux_tc", torch_dtype="float32",
                    bos_token_id=0, eos_token_id=1, num_nextn_predict_layers=0, attention_bias=False)
    if spec["spelling"] == "rope_parameters":
        file_cfg["rope_parameters"] = rope
    else:
        file_cfg["rope_theta"] = (rope or {}).get("rope_theta", spec.get("rope_theta", 10000.0))
        file_cfg["rope_scaling"] = None if rope is None else {k: v for k, v in rope.items() if k != "rope_theta"}
    hf_dict = dict(file_cfg, model_type="deepseek_v3")
    hf_dict.pop("architectures")
    hf_cfg = DeepseekV3Config(**hf_dict)
    hf_cfg._attn_implementation = "eager"
    if hasattr(hf_cfg, "_experts_implementation"):
        hf_cfg._experts_implementation = "eager"
    return file_cfg, hf_cfg


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / math.sqrt(fan_in)))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(torch.rand(b.shape, generator=gen) * 0.15 - 0.05)
        # Checkpoints ship bf16: make every weight exactly representable in bf16 (and store it as
        # BF16), so a bf16 backend holds the very weights the reference ran with.
        for p in model.parameters():
            p.copy_(p.bfloat16().float())


def expert_tensors(model, cfg):
    """Per-expert (gate, up, down) weights of every MoE layer, whichever layout transformers uses."""
    out = {}
    H, I, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    for l, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        if not hasattr(mlp, "experts"):
            continue
        ex = mlp.experts
        if isinstance(ex, torch.nn.ModuleList):
            out[l] = [(e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight) for e in ex]
            continue
        gu, dn = ex.gate_up_proj, ex.down_proj
        if gu.shape == (E, H, 2 * I):
            gu = gu.transpose(1, 2)
        if dn.shape == (E, I, H):
            dn = dn.transpose(1, 2)
        assert gu.shape == (E, 2 * I, H) and dn.shape == (E, H, I), (gu.shape, dn.shape)
        out[l] = [(gu[e, :I], gu[e, I:], dn[e]) for e in range(E)]
        # Check the assumed gate-then-up split against the module itself.
        x = torch.randn(5, H, dtype=gu.dtype, device=gu.device)
        idx = torch.full((5, 1), 3, dtype=torch.long, device=gu.device)
        w = torch.ones(5, 1, dtype=gu.dtype, device=gu.device)
        got = ex(x, idx, w)
        g, u, d = out[l][3]
        ref = (torch.nn.functional.silu(x @ g.T) * (x @ u.T)) @ d.T
        assert torch.allclose(got, ref, atol=1e-4), "fused expert layout is not gate-then-up"
    return out


def export_state(model, cfg, dtype=torch.bfloat16):
    sd = {}
    experts = expert_tensors(model, cfg)
    for name, t in model.state_dict().items():
        if ".mlp.experts." in name:
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        keep_f32 = "e_score_correction_bias" in name
        sd[name] = t.detach().contiguous().cpu().float() if keep_f32 else t.detach().contiguous().cpu().to(dtype)
    for l, lst in experts.items():
        for e, (g, u, d) in enumerate(lst):
            p = f"model.layers.{l}.mlp.experts.{e}."
            sd[p + "gate_proj.weight"] = g.detach().contiguous().cpu().to(dtype)
            sd[p + "up_proj.weight"] = u.detach().contiguous().cpu().to(dtype)
            sd[p + "down_proj.weight"] = d.detach().contiguous().cpu().to(dtype)
    return sd


def fp8_quantize(w, block):
    """e4m3 weight + per-block f32 scale_inv with w ≈ q * scale_inv. Scales are powers of two so
    the dequantised weights are exact in bf16 (a bf16 backend then holds the reference's weights)."""
    n, k = w.shape
    bn, bk = block
    q = torch.empty_like(w)
    scale = torch.empty(((n + bn - 1) // bn, (k + bk - 1) // bk), dtype=torch.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            blk = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            s = torch.exp2(torch.ceil(torch.log2(blk.abs().max().clamp(min=1e-12) / 448.0)))
            scale[i, j] = s
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = blk / s
    return q.to(torch.float8_e4m3fn), scale


def int4_quantize(w, group):
    """compressed-tensors pack-quantized INT4, symmetric: q = clamp(round(w / s), -8, 7) with s the
    group's amax / 7 rounded to bf16 (one scale per `group` inputs of a row); q + 8 packed eight to an
    int32 along k, column 8c + i in bits 4i..4i+3 (pack_to_int32). Returns (packed, scale, dequantised)."""
    n, k = w.shape
    assert k % group == 0 and group % 8 == 0, (k, group)
    g = w.reshape(n, k // group, group)
    scale = (g.abs().amax(-1).clamp(min=1e-12) / 7.0).bfloat16()
    q = torch.clamp(torch.round(g / scale.float()[..., None]), -8, 7).to(torch.int64)
    deq = (q.float() * scale.float()[..., None]).reshape(n, k)
    u = (q.reshape(n, k) + 8).reshape(n, k // 8, 8)
    packed = torch.zeros(n, k // 8, dtype=torch.int64)
    for i in range(8):
        packed |= u[:, :, i] << (4 * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed, scale, deq


def quantize_state(state, fmt, block):
    """The checkpoint tensors of `state` in `fmt`, and the dequantised f32 value of every quantized
    weight. FP8: every 2-D projection but embeddings, router and lm_head (DeepSeek-V3). INT4: the
    routed experts only; every other projection is listed in `ignore` (Kimi K2-Thinking)."""
    q_state, deq, ignore = {}, {}, ["lm_head"]
    for k, t in state.items():
        is_proj = t.dim() == 2 and "embed_tokens" not in k and "mlp.gate.weight" not in k and k != "lm_head.weight"
        if fmt == "fp8" and is_proj:
            q, sc = fp8_quantize(t.float(), block)
            q_state[k], q_state[k + "_scale_inv"] = q, sc
            deq[k] = (q.float() * sc.repeat_interleave(block[0], 0)[: t.shape[0]]
                      .repeat_interleave(block[1], 1)[:, : t.shape[1]])
        elif fmt == "int4" and is_proj and ".mlp.experts." in k:
            base = k[: -len(".weight")]
            packed, sc, deq[k] = int4_quantize(t.float(), block)
            q_state[base + ".weight_packed"], q_state[base + ".weight_scale"] = packed, sc
            q_state[base + ".weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int64)
        else:
            if fmt == "int4" and is_proj:
                ignore.append(k[: -len(".weight")])
            q_state[k] = t
    if fmt == "fp8":
        qcfg = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": block}
    else:
        qcfg = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "ignore": ignore, "kv_cache_scheme": None,
                "config_groups": {"group_0": {
                    "targets": ["Linear"], "input_activations": None, "output_activations": None,
                    "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                "group_size": block, "dynamic": False, "actorder": None, "observer": "minmax",
                                "observer_kwargs": {}, "block_structure": None}}}}
    return q_state, deq, qcfg


@torch.no_grad()
def set_weights(model, cfg, state, deq, dev):
    """Puts every 2-D weight of `state` into the model (the dequantised value where `deq` has one,
    else the original), through the export mapping inverted, and checks that it arrived."""
    vals = {k: deq[k] if k in deq else state[k].float() for k, t in state.items() if t.dim() == 2}
    params = dict(model.named_parameters())
    for k, v in vals.items():
        if k in params:
            params[k].copy_(v.to(dev))
    experts = expert_tensors(model, cfg)
    for l, lst in experts.items():
        for e, (g, u, dn) in enumerate(lst):
            p = f"model.layers.{l}.mlp.experts.{e}."
            g.copy_(vals[p + "gate_proj.weight"].to(dev))
            u.copy_(vals[p + "up_proj.weight"].to(dev))
            dn.copy_(vals[p + "down_proj.weight"].to(dev))
    # In f32: INT4 values times bf16 scales need more than bf16's 8 bits (FP8's power-of-two scales do not).
    st2 = export_state(model, cfg, torch.float32)
    worst = max((st2[k].float() - vals[k]).abs().max().item() for k in deq)
    assert worst == 0.0, f"dequantised weights did not reach the model ({worst})"


def route_margin(gate, x, cfg):
    """Per token, the gap between the top_k-th and the next expert's choice score (sigmoid + bias,
    non-selected groups masked to 0 as transformers does), and between the topk_group-th and the
    next group's score: how far the reference's routing is from a tie."""
    logits = torch.nn.functional.linear(x.reshape(-1, x.shape[-1]).float(), gate.weight.float())
    choice = (logits.sigmoid() + gate.e_score_correction_bias.float()).cpu()
    T, E, G, k = choice.shape[0], choice.shape[1], cfg.n_group, cfg.num_experts_per_tok
    margin = torch.full((T,), float("inf"))
    if G > 1:
        groups = choice.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)
        top = groups.topk(min(cfg.topk_group + 1, G), dim=-1)
        if cfg.topk_group < G:
            margin = top.values[:, cfg.topk_group - 1] - top.values[:, cfg.topk_group]
        mask = torch.zeros(T, G, dtype=torch.bool).scatter_(1, top.indices[:, :cfg.topk_group], True)
        choice = choice.masked_fill(~mask.repeat_interleave(E // G, dim=1), 0.0)
    top = choice.topk(k + 1, dim=-1).values
    return torch.minimum(margin, top[:, k - 1] - top[:, k])


@torch.no_grad()
def expectations(model, vocab, gen):
    ids = torch.randint(2, vocab, (PROMPT_LEN + CONT_LEN,), generator=gen)
    # Routing margins of the teacher-forced pass, the smallest over MoE layers: the CUDA score test
    # leaves out tokens whose routing is a near tie (tests/model/fixture_parity_test.cc).
    cfg = model.config
    margins = torch.full((len(ids),), float("inf"))
    hooks = []
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            def hook(mod, args, _out, cfg=cfg):
                margins.copy_(torch.minimum(margins, route_margin(mod, args[0], cfg)))
            hooks.append(gate.register_forward_hook(hook))
    logits = model(ids[None].to(model.device)).logits[0].float().cpu()
    for h in hooks:
        h.remove()
    lp = torch.log_softmax(logits, dim=-1)
    teacher = [None] + [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    seq = ids[:PROMPT_LEN].tolist()
    prompt = list(seq)
    out, greedy_margins = [], []
    for _ in range(GREEDY_STEPS):
        lg = model(torch.tensor([seq], device=model.device)).logits[0, -1].float().cpu()
        lps = torch.log_softmax(lg, dim=-1)
        top = torch.topk(lps, 2)
        tok = int(torch.argmax(lps))
        out.append(tok)
        greedy_margins.append((top.values[0] - top.values[1]).item())
        seq.append(tok)
    return {"ids": ids.tolist(), "logprobs": teacher,
            "greedy": {"prompt_ids": prompt, "output_ids": out, "top2_margins": greedy_margins},
            "route_margins": [float(f"{m:.6g}") for m in margins.tolist()]}


def write_fixture(out_dir, name, file_cfg, state, model, gen):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(file_cfg, f, indent=2)
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    exp = expectations(model, file_cfg["vocab_size"], gen)
    exp["transformers_version"] = transformers.__version__
    exp["torch_version"] = torch.__version__
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f)
    print(f"{name}: {len(state)} tensors, greedy {exp['greedy']['output_ids']}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="write only these fixtures (repeatable; each keeps its seed)")
    args = ap.parse_args()
    unknown = [n for n in args.only if n not in FIXTURES]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {list(FIXTURES)} "
                 f"(quantized copies are written with their base: {QUANTIZED})")
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # The CPU keeps float32 exact and takes every shape (the GPU grouped GEMM wants 16-byte strides).
    dev = "cpu"
    for i, (name, spec) in enumerate(FIXTURES.items()):
        if args.only and name not in args.only:
            continue
        gen = torch.Generator().manual_seed(1234 + i)
        file_cfg, hf_cfg = make_config(spec)
        print(name, "rope:", getattr(hf_cfg, "rope_parameters", None) or getattr(hf_cfg, "rope_scaling", None),
              flush=True)
        model = DeepseekV3ForCausalLM(hf_cfg).float().eval()
        randomize(model, gen)
        model.to(dev)
        state = export_state(model, hf_cfg)
        write_fixture(args.out, name, file_cfg, state, model, gen)
        # Each quantized copy: the dequantised weights go into the model (the others back to their
        # originals), so its expectations describe exactly the quantized checkpoint.
        for suffix, fmt, block in QUANTIZED.get(name, []):
            q_state, deq, qcfg = quantize_state(state, fmt, block)
            set_weights(model, hf_cfg, state, deq, dev)
            write_fixture(args.out, name + suffix, dict(file_cfg, quantization_config=qcfg), q_state, model,
                          torch.Generator().manual_seed(99))
    return 0


if __name__ == "__main__":
    sys.exit(main())

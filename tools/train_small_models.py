#!/usr/bin/env python3
"""Train Kiln's bundled small DeepSeek-V3-architecture models (issue 4) in one GPU run of < 9 minutes.

Run from the repository root on the GPU machine (no network needed):
    PYTHONUNBUFFERED=1 python3 tools/train_small_models.py --out-dir models

Phases (each logs to stdout and, as it goes, to $OUT/train_log.txt):
 1. corpus: English prose found on the machine (docstrings of the Python stdlib and of every installed
    package, via `ast`; package METADATA/READMEs; /usr/share/doc; man pages; licenses), deduplicated by
    paragraph; ~1% of documents, chosen by a hash of their path, are the held-out test split.
 2. tokenizer: byte-level BPE (HF `tokenizers`, Llama-3 split regex), 8192 ids, special tokens 0..5.
 3. target `kiln-tiny` (MLA with q LoRA, MoE with a shared expert, grouped noaux_tc routing, one MTP
    layer trained jointly: loss = main + 0.3 * mtp), then draft `kiln-tiny-draft` (same family, no MTP).
    Training length is set by wall clock (steps are logged; --target-steps/--draft-steps fix them).
 4. export in the published DeepSeek-V3 naming (per-expert tensors; MTP as model.layers.{L}.*), bf16
    except e_score_correction_bias (f32), shards <= 14 MB; verified by reloading into a fresh
    transformers model (exact round trip) and against an independent plain-torch forward (semantics).
 5. float32 evaluation from the saved bf16 weights: held-out NLL, MTP accuracy, greedy acceptance
    (draft->target and MTP->target, k=1..4), samples.
 6. $OUT: models.tar.partNN (the model folders, <= 15 MB parts; `cat models.tar.part* | tar x`),
    metrics.json, train_log.txt.

Conventions Kiln must reproduce (also in models/README.md):
 * scoring: heldout.json `ids` cut into non-overlapping windows of `window` ids; each window is run on
   its own from position 0; every id but the first of a window is predicted; NLL is averaged over all.
 * MTP step 1 at position t: h' = eh_proj([enorm(embed(x[t+1])); hnorm(h[t])]), the decoder layer
   (causal, RoPE position t), logits = lm_head(shared_head.norm(out)) predict x[t+2]. h[t] is the main
   model's final hidden state AFTER model.norm (what lm_head sees; as SGLang and vLLM feed DeepSeek's
   MTP). Step s>1 chains: h = the previous step's shared_head.norm output, the token = its own guess,
   position t+s-1, attending to the true-input MTP rows <= t plus its own chain (SGLang's convention).
   --mtp-hidden pre_norm switches both to the un-normed vectors.
 * acceptance: greedy; after the target emits token j, the drafter proposes k tokens, accepted = the
   longest prefix equal to the target's greedy tokens, then the target's next token; rate =
   accepted / proposed. Teacher forcing over the target's greedy continuation gives exactly this.
"""
from __future__ import annotations

import time

T0 = time.time()  # before the heavy imports: the budget is wall clock for the whole run

import argparse, array, ast, gzip, hashlib, inspect, json, math, multiprocessing, os, random, re, site
import sys, sysconfig, tarfile, tempfile, traceback, warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdv3

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
BOS, EOS, PAD = 0, 1, 2
SPLIT_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # Llama-3's pre-tokenizer split
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content']"
                 " + eos_token + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")
ROPE_THETA = 10000.0
EPS = 1e-6
FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


@dataclass(frozen=True)
class Spec:
    name: str
    hidden: int
    layers: int  # main decoder layers (the MTP layer is model.layers.{layers})
    dense_layers: int  # first_k_dense_replace
    heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v: int
    dense_inter: int
    moe_inter: int
    experts: int
    n_group: int
    topk_group: int
    top_k: int
    shared: int = 1
    nextn: int = 0
    vocab: int = 8192
    max_pos: int = 2048
    scale: float = 2.5


# moe_inter must differ from hidden and hidden/2 so fused expert tensors have unambiguous orientation.
TARGET = Spec("kiln-tiny", 256, 5, 1, 8, 128, 128, 32, 16, 32, 512, 160, 8, 4, 2, 2, nextn=1)
DRAFT = Spec("kiln-tiny-draft", 128, 2, 1, 4, 64, 64, 32, 16, 32, 384, 96, 8, 4, 2, 2, nextn=0)


class Log:
    def __init__(self, path: Path | None):
        self.f = open(path, "a", encoding="utf-8") if path else None

    def __call__(self, *a: object) -> None:
        line = f"[{time.time() - T0:6.1f}s] " + " ".join(str(x) for x in a)
        print(line, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()


# ----------------------------------------------------------------------------------------- corpus
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", "test", "tests", "testing", "node_modules", ".git"}
DOC_NAMES = ("readme", "license", "licence", "copying", "notice", "news", "changelog", "changes", "history",
             "authors", "copyright", "metadata", "faq", "description")
NOT_DOCS = ("entry_points", "top_level", "dependency_links", "requires", "sources", "cmakelists", "requirements",
            "vocab", "merges", "record", "installer", "wheel")


def walk(root: str, keep) -> list[str]:
    out: list[str] = []
    for dp, dns, fns in os.walk(root):
        dns[:] = sorted(d for d in dns if d not in SKIP_DIRS)  # sorted: a deterministic order
        out += [os.path.join(dp, f) for f in sorted(fns) if keep(f)]
    return out


def doc_ok(fn: str) -> bool:
    n = fn.lower().removesuffix(".gz")
    if n.startswith(NOT_DOCS):
        return False
    return n.startswith(DOC_NAMES) or n.endswith((".md", ".rst", ".txt"))


def discover() -> list[tuple[str, str]]:
    """(kind, path) candidates, best prose first: docstrings, package docs, system docs, man pages."""
    paths = sysconfig.get_paths()
    roots = []
    for r in [*site.getsitepackages(), paths["purelib"], paths["platlib"], "/usr/lib/python3/dist-packages"]:
        if os.path.isdir(r) and os.path.realpath(r) not in roots:
            roots.append(os.path.realpath(r))
    items = [("py", f) for f in walk(paths["stdlib"], lambda f: f.endswith(".py"))]
    for r in roots:
        items += [("py", f) for f in walk(r, lambda f: f.endswith(".py"))]
    for r in roots:
        items += [("pkgdoc", f) for f in walk(r, doc_ok)]
    for r in ["/usr/share/doc", "/usr/local/share/doc", "/usr/share/common-licenses"]:
        items += [("doc", f) for f in walk(r, doc_ok if "licenses" not in r else lambda f: True)]
    for sec in ("1", "5", "7", "8"):
        items += [("man", f) for f in walk(f"/usr/share/man/man{sec}", lambda f: True)]
    seen, out = set(), []
    for kind, p in items:
        rp = os.path.realpath(p)
        if rp not in seen:
            seen.add(rp)
            out.append((kind, p))
    return out


def docstrings(src: str) -> str:
    tree = ast.parse(src)
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            d = ast.get_docstring(node, clean=True)
            if d and len(d) >= 40:
                parts.append(d)
    return "\n\n".join(parts)


def strip_troff(t: str) -> str:
    out = []
    for line in t.splitlines():
        if line.startswith((".\\\"", "'\\\"")):
            continue
        if line.startswith((".", "'")):
            m = re.match(r"[.'](\w+)\s*(.*)", line)
            if not m:
                continue
            mac, rest = m.groups()
            if mac in ("SH", "SS"):
                out.append("\n" + rest.replace('"', "").title())
            elif mac in ("PP", "LP", "P", "TP", "IP"):
                out.append("")  # paragraph breaks; their arguments are indents and bullets
            elif mac in ("B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB") and rest:
                out.append(rest.replace('"', ""))
            continue
        out.append(line)
    t = "\n".join(out)
    for a, b in (("\\-", "-"), ("\\(aq", "'"), ("\\(dq", '"'), ("\\(em", "--"), ("\\(en", "-"), ("\\e", "\\"),
                 ("\\&", ""), ("\\ ", " "), ("\\|", ""), ("\\^", "")):
        t = t.replace(a, b)
    t = re.sub(r"\\f(\[[^\]]*\]|\(..|.)|\\\(..|\\\[[^\]]*\]|\\[*n](\(..|\[[^\]]*\]|.)|\\.", "", t)
    return re.sub(r"\n{3,}", "\n\n", t)


def extract(item: tuple[str, str]) -> tuple[str, str, str]:
    """Runs in a worker process: one file -> cleaned prose ('' when it has none)."""
    kind, path = item
    warnings.simplefilter("ignore")
    try:
        if os.path.getsize(path) > 4_000_000:
            return kind, path, ""
        raw = gzip.open(path).read(8_000_000) if path.endswith(".gz") else open(path, "rb").read()
        if b"\x00" in raw[:8192]:
            return kind, path, ""
        text = raw.decode("utf-8", errors="ignore")
        if kind == "py":
            text = docstrings(text)
        elif kind == "man" or re.match(r"^\.(TH|\\\")", text):
            text = strip_troff(text)
    except Exception:  # SyntaxError, RecursionError, bad gzip, permissions: skip the file
        return kind, path, ""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    for t in SPECIAL:  # a literal special-token string in the corpus would encode as that token
        text = text.replace(t, "")
    text = text.strip()[: 1_000_000 if kind in ("py", "src") else 200_000]  # changelogs: the recent part
    if kind != "src":
        letters = sum(c.isalpha() or c == " " for c in text)
        if len(text) < 200 or letters < 0.65 * len(text):
            return kind, path, ""
    return kind, path, text


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def gather_corpus(args, log: Log) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict]:
    items = discover()
    log(f"corpus: {len(items)} candidate files; extracting with {args.workers} processes")
    docs, seen_par, chars, stats = [], set(), 0, {}
    t0 = time.time()

    def consume(results) -> None:
        nonlocal chars
        for kind, path, text in results:
            if time.time() - t0 > args.corpus_seconds:
                raise TimeoutError
            if not text:
                continue
            keep = []
            for par in re.split(r"\n[ \t]*\n", text):  # paragraph dedupe: licenses and copied docstrings
                par = par.strip("\n")
                norm = " ".join(par.split())
                if not norm:
                    continue
                if len(norm) >= 60:
                    h = hashlib.blake2b(norm.encode(), digest_size=12).digest()
                    if h in seen_par:
                        continue
                    seen_par.add(h)
                keep.append(par)
            text = "\n\n".join(keep)
            if len(text) >= 200:
                docs.append((kind, path, text))
                chars += len(text)
                stats[kind] = stats.get(kind, 0) + len(text)

    ctx = multiprocessing.get_context("fork")  # before any CUDA use; workers need no re-import
    for batch in (items, [("src", p) for k, p in items if k == "py"][:20000]):
        with ProcessPoolExecutor(max_workers=args.workers, mp_context=ctx) as ex:
            try:
                consume(ex.map(extract, batch, chunksize=32))
            except TimeoutError:
                log(f"corpus: time cap {args.corpus_seconds}s reached; keeping what was read")
                ex.shutdown(wait=False, cancel_futures=True)
        if chars >= args.min_prose_chars:
            break
        log(f"corpus: only {chars} chars of prose; adding Python source code")
    # Fill the budget by source, best prose first, each source capped; within one, a hash order
    # (a deterministic sample); the original order is kept.
    caps = {"py": 1.0, "pkgdoc": 0.3, "doc": 0.15, "man": 0.1, "src": 1.0}
    keep, tot = set(), 0
    for kind, cap in caps.items():
        kt = 0
        for _, path, text in sorted((d for d in docs if d[0] == kind), key=lambda d: key_hash(d[1])):
            if tot + len(text) <= args.max_chars and kt + len(text) <= cap * args.max_chars:
                keep.add((kind, path))
                tot, kt = tot + len(text), kt + len(text)
        stats[kind] = {"read_chars": stats.get(kind, 0), "kept_chars": kt}
    docs = [(p, t) for k, p, t in docs if (k, p) in keep]
    permille = args.heldout_permille
    while True:
        test = [d for d in docs if key_hash(d[0]) % 1000 < permille]
        if sum(len(t) for _, t in test) >= 300_000 or permille >= 100:
            break
        permille += 5
    train = [d for d in docs if key_hash(d[0]) % 1000 >= permille]
    info = {"documents": len(docs), "chars": sum(len(t) for _, t in docs), "chars_by_source": stats,
            "train_documents": len(train), "test_documents": len(test), "heldout_permille": permille,
            "test_chars": sum(len(t) for _, t in test), "seconds": round(time.time() - t0, 1)}
    log("corpus:", json.dumps(info))
    return train, test, info


# -------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert [tok.token_to_id(t) for t in SPECIAL] == list(range(len(SPECIAL))), "special tokens must be ids 0..5"
    assert tok.get_vocab_size() <= vocab
    return tok


def encode_stream(tok, texts: list[str]) -> tuple[torch.Tensor, list[int]]:
    """[BOS] doc [EOS] [BOS] doc [EOS] ...; also the start offset of every document."""
    buf, starts = array.array("i"), []
    for i in range(0, len(texts), 4096):
        for enc in tok.encode_batch(texts[i:i + 4096], add_special_tokens=False):
            starts.append(len(buf))
            buf.append(BOS)
            buf.extend(enc.ids)
            buf.append(EOS)
    return torch.frombuffer(buf, dtype=torch.int32).clone(), starts


def tokenizer_config() -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[BOS], "eos_token": SPECIAL[EOS],
            "pad_token": SPECIAL[PAD], "unk_token": None, "add_bos_token": False, "add_eos_token": False,
            "clean_up_tokenization_spaces": False, "model_max_length": 2048, "chat_template": CHAT_TEMPLATE,
            "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True} for i, t in enumerate(SPECIAL)}}


# ------------------------------------------------------------------------------- model definition
def config_json(s: Spec) -> dict:
    """config.json in the published DeepSeek-V3 spelling (rope_theta + rope_scaling)."""
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": s.vocab,
            "hidden_size": s.hidden, "intermediate_size": s.dense_inter, "moe_intermediate_size": s.moe_inter,
            "num_hidden_layers": s.layers, "num_nextn_predict_layers": s.nextn, "num_attention_heads": s.heads,
            "num_key_value_heads": s.heads, "n_shared_experts": s.shared, "n_routed_experts": s.experts,
            "routed_scaling_factor": s.scale, "kv_lora_rank": s.kv_lora, "q_lora_rank": s.q_lora,
            "qk_rope_head_dim": s.rope, "v_head_dim": s.v, "qk_nope_head_dim": s.nope, "n_group": s.n_group,
            "topk_group": s.topk_group, "num_experts_per_tok": s.top_k, "first_k_dense_replace": s.dense_layers,
            "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
            "hidden_act": "silu", "max_position_embeddings": s.max_pos, "initializer_range": 0.02,
            "rms_norm_eps": EPS, "rope_theta": ROPE_THETA, "rope_scaling": None, "rope_interleave": True,
            "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False, "bos_token_id": BOS,
            "eos_token_id": EOS, "pad_token_id": PAD, "use_cache": True, "torch_dtype": "bfloat16",
            "transformers_version": transformers.__version__}


def hf_config(s: Spec, attn: str, extra_layers: int = 0) -> DeepseekV3Config:
    drop = {"architectures", "model_type", "torch_dtype", "transformers_version", "scoring_func", "topk_method",
            "moe_layer_freq", "rope_theta", "rope_scaling", "num_nextn_predict_layers"}
    kw = {k: v for k, v in config_json(s).items() if k not in drop}
    kw.update(num_hidden_layers=s.layers + extra_layers, use_cache=False)
    if "rope_parameters" in inspect.signature(DeepseekV3Config.__init__).parameters:  # transformers 5.x
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": ROPE_THETA}
    else:
        kw.update(rope_theta=ROPE_THETA, rope_scaling=None)
    try:
        return DeepseekV3Config(attn_implementation=attn, **kw)
    except TypeError:
        return DeepseekV3Config(**kw)


def set_impl(root: nn.Module, attn: str, experts: str) -> None:
    """Pin the attention / experts implementation on every config object the modules read at run time."""
    for m in root.modules():
        c = getattr(m, "config", None)
        if c is None or not hasattr(c, "to_dict"):
            continue
        for attr, val in (("_attn_implementation", attn), ("_experts_implementation", experts)):
            if attr == "_experts_implementation" and not hasattr(c, attr):
                continue  # transformers 4.x: per-expert modules, nothing to choose
            try:
                setattr(c, attr, val)
            except Exception:
                setattr(c, attr + "_internal", val)
    for m in root.modules():
        if isinstance(m, mdv3.DeepseekV3Attention):
            assert m.config._attn_implementation == attn, (m.config._attn_implementation, attn)


class MTPHead(nn.Module):
    """DeepSeek-V3 NextN layer built from transformers' own DecoderLayer / RMSNorm / RotaryEmbedding.
    The embedding and output head are the main model's (saved as copies under model.layers.{L})."""

    def __init__(self, s: Spec, experts_impl: str):
        super().__init__()
        cfg = hf_config(s, "eager", extra_layers=1)  # eager: it honours our explicit float mask
        self.enorm = mdv3.DeepseekV3RMSNorm(s.hidden, eps=EPS)
        self.hnorm = mdv3.DeepseekV3RMSNorm(s.hidden, eps=EPS)
        self.eh_proj = nn.Linear(2 * s.hidden, s.hidden, bias=False)
        self.layer = mdv3.DeepseekV3DecoderLayer(cfg, layer_idx=s.layers)
        self.shared_head = nn.Module()
        self.shared_head.norm = mdv3.DeepseekV3RMSNorm(s.hidden, eps=EPS)
        self.rotary = mdv3.DeepseekV3RotaryEmbedding(config=cfg)
        self.config = cfg
        set_impl(self, "eager", experts_impl)

    def forward(self, h: torch.Tensor, emb: torch.Tensor, pos: torch.Tensor, allowed: torch.Tensor):
        """h, emb: [B,T,H]; pos: [B,T]; allowed: [T,T] bool (query, key). Returns (normed, raw) [B,T,H]."""
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], dim=-1))
        mask = torch.zeros(allowed.shape, device=x.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
        out = self.layer(hidden_states=x, attention_mask=mask[None, None], position_ids=pos,
                         position_embeddings=self.rotary(x, pos))
        out = out[0] if isinstance(out, tuple) else out
        return self.shared_head.norm(out), out


def build(s: Spec, attn: str, experts_impl: str, dev: torch.device):
    model = DeepseekV3ForCausalLM(hf_config(s, attn))
    set_impl(model, attn, experts_impl)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "lm_head must be untied"
    # h before model.norm, for --mtp-hidden pre_norm (output_hidden_states differs between versions)
    model.model.norm.register_forward_pre_hook(lambda mod, args: setattr(model, "_prenorm", args[0]))
    mtp = MTPHead(s, experts_impl) if s.nextn else None
    return model.to(dev), (mtp.to(dev) if mtp is not None else None)


@torch.no_grad()
def init_weights(roots: list[nn.Module], n_layers: int) -> None:
    """Own init (not the library's) so that runs do not depend on the transformers version."""
    for root in roots:
        for name, p in root.named_parameters():
            if "e_score_correction_bias" in name:
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)  # RMSNorm gains: this architecture has no biases
            else:
                out_proj = re.search(r"(o_proj|down_proj)(\.weight)?$", name)
                p.normal_(0.0, 0.02 / math.sqrt(2 * n_layers) if out_proj else 0.02)
        for name, b in root.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()


def fwd(model, ids: torch.Tensor):
    """-> logits, h after model.norm, h before model.norm."""
    h = model.model(input_ids=ids, use_cache=False).last_hidden_state
    return model.lm_head(h), h, model._prenorm


def select_experts(scores: torch.Tensor, bias: torch.Tensor, s: Spec) -> torch.Tensor:
    """transformers' grouped routing: groups ranked by the sum of their top-2 biased scores, keep
    topk_group groups (dropped ones filled with 0.0), top-k experts; scores [T,E] sigmoid, fp32."""
    T, E = scores.shape
    sb = scores + bias
    gs = sb.view(T, s.n_group, E // s.n_group).topk(2, dim=-1).values.sum(-1)
    gmask = torch.zeros_like(gs).scatter_(1, gs.topk(s.topk_group, dim=-1, sorted=False).indices, 1.0)
    smask = gmask.unsqueeze(-1).expand(T, s.n_group, E // s.n_group).reshape(T, E)
    return sb.masked_fill(smask == 0, 0.0).topk(s.top_k, dim=-1, sorted=False).indices


# ----------------------------------------------------------------------------- published naming
def expected_layout(s: Spec) -> dict[str, tuple]:
    """Python twin of src/model/weight_layout.cc: every tensor name and shape Kiln's loader expects."""
    H, V, E, qk = s.hidden, s.vocab, s.experts, s.nope + s.rope
    out: dict[str, tuple] = {"model.embed_tokens.weight": (V, H)}

    def layer(l: int) -> None:
        p = f"model.layers.{l}."
        out.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                    p + "self_attn.q_a_proj.weight": (s.q_lora, H), p + "self_attn.q_a_layernorm.weight": (s.q_lora,),
                    p + "self_attn.q_b_proj.weight": (s.heads * qk, s.q_lora),
                    p + "self_attn.kv_a_proj_with_mqa.weight": (s.kv_lora + s.rope, H),
                    p + "self_attn.kv_a_layernorm.weight": (s.kv_lora,),
                    p + "self_attn.kv_b_proj.weight": (s.heads * (s.nope + s.v), s.kv_lora),
                    p + "self_attn.o_proj.weight": (H, s.heads * s.v)})
        mlps = [("mlp.", s.dense_inter)] if l < s.dense_layers else \
            [(f"mlp.experts.{e}.", s.moe_inter) for e in range(E)] + [("mlp.shared_experts.", s.moe_inter * s.shared)]
        if l >= s.dense_layers:
            out.update({p + "mlp.gate.weight": (E, H), p + "mlp.gate.e_score_correction_bias": (E,)})
        for q, I in mlps:
            out.update({p + q + "gate_proj.weight": (I, H), p + q + "up_proj.weight": (I, H),
                        p + q + "down_proj.weight": (H, I)})

    for l in range(s.layers):
        layer(l)
    out.update({"model.norm.weight": (H,), "lm_head.weight": (V, H)})
    for l in range(s.layers, s.layers + s.nextn):
        layer(l)
        p = f"model.layers.{l}."
        out.update({p + "embed_tokens.weight": (V, H), p + "enorm.weight": (H,), p + "hnorm.weight": (H,),
                    p + "eh_proj.weight": (H, 2 * H), p + "shared_head.norm.weight": (H,),
                    p + "shared_head.head.weight": (V, H)})
    return out


def hf_tensors(model, mtp, s: Spec) -> dict[str, torch.Tensor]:
    """Every trained tensor keyed by its published name (fused expert tensors still fused)."""
    out: dict[str, torch.Tensor] = {}
    roots = [(model, "")] + ([(mtp, f"model.layers.{s.layers}.")] if mtp is not None else [])
    for root, prefix in roots:
        items = list(root.named_parameters()) + [(n, b) for n, b in root.named_buffers()
                                                  if n.endswith("e_score_correction_bias")]
        for n, t in items:
            name = prefix + (n[len("layer."):] if prefix and n.startswith("layer.") else n)
            assert name not in out, f"two tensors map to {name}"
            out[name] = t
    return out


def export_sd(model, mtp, s: Spec, concat: bool) -> dict[str, torch.Tensor]:
    E, I, H = s.experts, s.moe_inter, s.hidden
    out: dict[str, torch.Tensor] = {}
    for name, t in hf_tensors(model, mtp, s).items():
        t = t.detach()
        m = FUSED.match(name)
        if m is None:
            out[name] = t
            continue
        base, kind = m.groups()
        want = (E, 2 * I, H) if kind == "gate_up_proj" else (E, H, I)
        w = t if tuple(t.shape) == want else t.transpose(1, 2)
        assert tuple(w.shape) == want, (name, tuple(t.shape), want)
        for e in range(E):
            if kind == "down_proj":
                out[f"{base}.{e}.down_proj.weight"] = w[e]
            else:  # [gate; up] concatenated (DeepSeek/transformers default) or interleaved rows
                out[f"{base}.{e}.gate_proj.weight"] = w[e, :I] if concat else w[e, 0::2]
                out[f"{base}.{e}.up_proj.weight"] = w[e, I:] if concat else w[e, 1::2]
    if mtp is not None:  # DeepSeek's NextN layer carries its own copies of the shared embedding and head
        p = f"model.layers.{s.layers}."
        out[p + "embed_tokens.weight"], out[p + "shared_head.head.weight"] = out["model.embed_tokens.weight"], \
            out["lm_head.weight"]
    exp = expected_layout(s)
    assert set(out) == set(exp), f"missing {sorted(set(exp) - set(out))[:6]} extra {sorted(set(out) - set(exp))[:6]}"
    for k, shape in exp.items():
        assert tuple(out[k].shape) == shape, (k, tuple(out[k].shape), shape)
    return {k: (out[k].float() if k.endswith("e_score_correction_bias") else out[k].to(torch.bfloat16))
            .cpu().contiguous().clone() for k in exp}


@torch.no_grad()
def import_sd(sd: dict[str, torch.Tensor], model, mtp, s: Spec, concat: bool) -> None:
    """The reverse of export_sd; every saved tensor must be used exactly once."""
    E, I, H = s.experts, s.moe_inter, s.hidden
    used: set[str] = set()
    for name, t in hf_tensors(model, mtp, s).items():
        m = FUSED.match(name)
        if m is None:
            val = sd[name]
            used.add(name)
        else:
            base, kind = m.groups()
            parts = ["down_proj"] if kind == "down_proj" else ["gate_proj", "up_proj"]
            ws = [torch.stack([sd[f"{base}.{e}.{q}.weight"] for e in range(E)]) for q in parts]
            used.update(f"{base}.{e}.{q}.weight" for e in range(E) for q in parts)
            if kind == "down_proj":
                val = ws[0]
            else:
                val = torch.cat(ws, 1) if concat else torch.stack(ws, 2).reshape(E, 2 * I, H)
            val = val if val.shape == t.shape else val.transpose(1, 2)
        assert val.shape == t.shape, (name, tuple(val.shape), tuple(t.shape))
        t.copy_(val.to(t.device, t.dtype))
    if mtp is not None:
        p = f"model.layers.{s.layers}."
        assert torch.equal(sd[p + "embed_tokens.weight"], sd["model.embed_tokens.weight"])
        assert torch.equal(sd[p + "shared_head.head.weight"], sd["lm_head.weight"])
        used.update([p + "embed_tokens.weight", p + "shared_head.head.weight"])
    assert used == set(sd), f"unused saved tensors: {sorted(set(sd) - used)[:6]}"


def expert_layout(model) -> bool:
    """True when fused gate_up_proj rows are [gate; up] (transformers' default)."""
    for m in model.modules():
        if hasattr(m, "gate_up_proj"):
            return bool(getattr(m, "is_concatenated", True))
    return True


# ---------------------------------------------------- independent reference forward (plain torch)
def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def _rope(x: torch.Tensor, pos: torch.Tensor, d: int) -> torch.Tensor:
    """Rotate adjacent pairs (2i, 2i+1) by pos * theta^(-2i/d): DeepSeek's interleaved RoPE."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv[None]
    c, sn = ang.cos(), ang.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * sn, a * sn + b * c], -1).flatten(-2)


def ref_layer(sd, s: Spec, l: int, x, pos, allowed):
    p = f"model.layers.{l}."
    W = lambda n: sd[p + n].float()  # noqa: E731
    T, nh = x.shape[0], s.heads
    hx = _rms(x, W("input_layernorm.weight"))
    q = _rms(hx @ W("self_attn.q_a_proj.weight").T, W("self_attn.q_a_layernorm.weight")) @ W("self_attn.q_b_proj.weight").T
    qn, qp = q.view(T, nh, s.nope + s.rope).transpose(0, 1).split([s.nope, s.rope], -1)
    ckv, kpe = (hx @ W("self_attn.kv_a_proj_with_mqa.weight").T).split([s.kv_lora, s.rope], -1)
    kv = _rms(ckv, W("self_attn.kv_a_layernorm.weight")) @ W("self_attn.kv_b_proj.weight").T
    kn, v = kv.view(T, nh, s.nope + s.v).transpose(0, 1).split([s.nope, s.v], -1)
    sc = (qn @ kn.transpose(1, 2) + _rope(qp, pos, s.rope) @ _rope(kpe, pos, s.rope).T) / math.sqrt(s.nope + s.rope)
    att = sc.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    x = x + att.transpose(0, 1).reshape(T, nh * s.v) @ W("self_attn.o_proj.weight").T
    hx = _rms(x, W("post_attention_layernorm.weight"))
    mlp = lambda q_: (F.silu(hx @ W(q_ + "gate_proj.weight").T) * (hx @ W(q_ + "up_proj.weight").T)) \
        @ W(q_ + "down_proj.weight").T  # noqa: E731
    if l < s.dense_layers:
        return x + mlp("mlp.")
    scores = (hx @ W("mlp.gate.weight").T).sigmoid()
    idx = select_experts(scores, W("mlp.gate.e_score_correction_bias"), s)
    wts = scores.gather(1, idx)
    wts = wts / (wts.sum(-1, keepdim=True) + 1e-20) * s.scale
    y = mlp("mlp.shared_experts.")
    for e in range(s.experts):  # every expert on every token, weighted 0 where not chosen: same value
        y = y + (wts * (idx == e)).sum(-1, keepdim=True) * mlp(f"mlp.experts.{e}.")
    return x + y


def ref_forward(sd, s: Spec, ids: torch.Tensor):
    T = ids.numel()
    pos, causal = torch.arange(T, device=ids.device), torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    x = sd["model.embed_tokens.weight"].float()[ids]
    for l in range(s.layers):
        x = ref_layer(sd, s, l, x, pos, causal)
    hp = _rms(x, sd["model.norm.weight"].float())
    return hp @ sd["lm_head.weight"].float().T, hp, x


def ref_mtp(sd, s: Spec, h, next_ids):
    p, T = f"model.layers.{s.layers}.", next_ids.numel()
    e = sd[p + "embed_tokens.weight"].float()[next_ids]
    x = torch.cat([_rms(e, sd[p + "enorm.weight"].float()), _rms(h, sd[p + "hnorm.weight"].float())], -1)
    x = ref_layer(sd, s, s.layers, x @ sd[p + "eh_proj.weight"].float().T, torch.arange(T, device=h.device),
                  torch.ones(T, T, dtype=torch.bool, device=h.device).tril())
    return _rms(x, sd[p + "shared_head.norm.weight"].float()) @ sd[p + "shared_head.head.weight"].float().T


# ------------------------------------------------------------------------------ save, load, verify
def save_folder(folder: Path, s: Spec, sd: dict[str, torch.Tensor], tok, max_bytes: int) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    (folder / "config.json").write_text(json.dumps(config_json(s), indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False}, indent=2) + "\n")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    shards, size = [[]], 0
    for n, t in sd.items():
        b = t.numel() * t.element_size()
        if shards[-1] and size + b > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(n)
        size += b
    if len(shards) == 1:
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    wmap = {}
    for i, names in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: sd[n] for n in names}, str(folder / fn), metadata={"format": "pt"})
        wmap.update({n: fn for n in names})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}, indent=2) + "\n")


def load_folder(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    idx = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() else ["model.safetensors"]
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(folder / f)))
    return sd


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def load_eval(folder: Path, s: Spec, args, dev):
    """Fresh float32 eager models holding the saved bf16 weights; also returns the saved tensors."""
    sd = {k: v.to(dev) for k, v in load_folder(folder).items()}
    exp = expected_layout(s)
    assert {k: tuple(v.shape) for k, v in sd.items()} == exp, "saved names/shapes differ from Kiln's layout"
    for k, v in sd.items():
        assert v.dtype == (torch.float32 if k.endswith("e_score_correction_bias") else torch.bfloat16), k
    model, mtp = build(s, "eager", args.experts_impl, dev)
    import_sd(sd, model, mtp, s, expert_layout(model))
    model.eval()
    if mtp is not None:
        mtp.eval()
    return model, mtp, sd


@torch.no_grad()
def verify(folder: Path, s: Spec, ids: torch.Tensor, args, dev, log: Log, trained=None, hub=False) -> dict:
    """Round trip (export of the reloaded model == the files) and semantics (vs ref_forward)."""
    model, mtp, sd = load_eval(folder, s, args, dev)
    back = export_sd(model, mtp, s, expert_layout(model))
    rep: dict = {"roundtrip_exact": all(torch.equal(back[k].to(dev), sd[k]) for k in sd)}
    logits, hpost, hpre = fwd(model, ids)
    rep["ref_rel_diff"] = max(rel(logits[b], ref_forward(sd, s, ids[b])[0]) for b in range(ids.shape[0]))
    if mtp is not None:
        T = ids.shape[1] - 1
        pos = torch.arange(T, device=dev)[None].expand(ids.shape[0], T)
        h = hpost if args.mtp_hidden == "post_norm" else hpre
        normed, _ = mtp(h[:, :T], model.model.embed_tokens(ids[:, 1:]), pos,
                        torch.ones(T, T, dtype=torch.bool, device=dev).tril())
        ml = model.lm_head(normed)
        rep["mtp_ref_rel_diff"] = max(rel(ml[b], ref_mtp(sd, s, h[b, :T], ids[b, 1:])) for b in range(ids.shape[0]))
    if trained is not None:  # information: how far bf16 rounding moved the logits
        tm = trained.training
        trained.eval()
        rep["bf16_rounding_rel_diff"] = rel(fwd(trained, ids)[0].float(), logits)
        trained.train(tm)
    if hub:  # information: does transformers itself load the per-expert checkpoint?
        try:
            kw = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else \
                {"torch_dtype": torch.float32}
            hfm = DeepseekV3ForCausalLM.from_pretrained(str(folder), attn_implementation="eager", **kw).to(dev).eval()
            rep["from_pretrained_rel_diff"] = rel(hfm(input_ids=ids).logits, logits)
            del hfm
        except Exception as e:  # noqa: BLE001
            rep["from_pretrained_rel_diff"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    ok = rep["roundtrip_exact"] and rep["ref_rel_diff"] < 1e-3 and rep.get("mtp_ref_rel_diff", 0.0) < 1e-3
    rep["ok"] = bool(ok)
    log(f"verify {s.name}: {json.dumps(rep)}")
    return rep


# ---------------------------------------------------------------------------------------- training
class Balancer:
    """DeepSeek's auxiliary-loss-free balancing: after each step, bias_e += gamma * sign(mean_load - load_e).
    Biases are then shifted so that min = 0: a common shift never changes which experts win, and
    non-negative biased scores make transformers' 0.0 fill of dropped groups act like -inf."""

    def __init__(self, roots: list[nn.Module], s: Spec, gamma: float):
        self.routers = [m for r in roots for m in r.modules()
                        if hasattr(m, "e_score_correction_bias") and isinstance(getattr(m, "weight", None), torch.Tensor)]
        dev = self.routers[0].weight.device
        self.step_counts = [torch.zeros(s.experts, device=dev) for _ in self.routers]
        self.window = [torch.zeros(s.experts, device=dev) for _ in self.routers]
        self.s, self.gamma, self.enabled = s, gamma, True
        for i, r in enumerate(self.routers):
            r.register_forward_hook(self._hook(i))

    def _hook(self, i: int):
        def fn(mod, inp, out) -> None:
            if not self.enabled:
                return
            outs = out if isinstance(out, (tuple, list)) else (out,)
            idx = next((o for o in outs if torch.is_tensor(o) and not o.is_floating_point()), None)
            if idx is None:  # transformers 5.x: the router returns logits; routing happens in the MoE block
                lg = next(o for o in outs if torch.is_tensor(o) and o.shape[-1] == self.s.experts)
                idx = select_experts(lg.detach().float().view(-1, self.s.experts).sigmoid(),
                                     mod.e_score_correction_bias.float(), self.s)
            self.step_counts[i] += torch.bincount(idx.reshape(-1), minlength=self.s.experts).float()
        return fn

    @torch.no_grad()
    def update(self) -> None:
        for r, c, w in zip(self.routers, self.step_counts, self.window):
            b = r.e_score_correction_bias
            b += self.gamma * torch.sign(c.mean() - c)
            b -= b.min()
            w += c
            c.zero_()

    def report(self) -> str:
        imb = [(w.max() / w.mean().clamp_min(1)).item() for w in self.window]
        for w in self.window:
            w.zero_()
        bmax = max(r.e_score_correction_bias.max().item() for r in self.routers)
        return f"max/mean expert load {max(imb):.2f} (worst router), bias max {bmax:.3f}"


def smoke(model, mtp, s: Spec) -> None:
    """Tiny CPU forward/backward before the corpus phase: API mismatches fail in seconds, not minutes."""
    bal = Balancer([model, mtp], s, 1e-3)
    B, T = 2, 16
    ids = torch.randint(0, s.vocab, (B, T))
    logits, h, hpre = fwd(model, ids)
    assert logits.shape == (B, T, s.vocab) and h.shape == hpre.shape == (B, T, s.hidden)
    assert not torch.equal(h, hpre), "pre-norm capture failed"
    normed, raw = mtp(h[:, :T - 1], model.model.embed_tokens(ids[:, 1:]), torch.arange(T - 1)[None].expand(B, -1),
                      torch.ones(T - 1, T - 1, dtype=torch.bool).tril())
    (logits.float().logsumexp(-1).mean() + model.lm_head(normed).float().logsumexp(-1).mean()).backward()
    routed = sum(c.sum().item() for c in bal.step_counts)
    want = ((s.layers - s.dense_layers) * B * T + B * (T - 1)) * s.top_k
    assert routed == want, f"router hooks counted {routed} expert choices, expected {want}"
    bal.enabled = False
    model.zero_grad(set_to_none=True)
    mtp.zero_grad(set_to_none=True)


def lr_at(step: int, total: int, base: float, warm: int) -> float:
    if step < warm:
        return base * (step + 1) / warm
    p = min(1.0, (step - warm) / max(1, total - warm))
    return base * (0.1 + 0.45 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def quick_val(model, val: torch.Tensor) -> float:
    model.eval()
    with torch.autocast(val.device.type, dtype=torch.bfloat16):
        lg = fwd(model, val)[0]
    model.train()
    return F.cross_entropy(lg[:, :-1].float().flatten(0, 1), val[:, 1:].flatten()).item()


def train(model, mtp, s: Spec, data: torch.Tensor, val: torch.Tensor, budget: float, fixed_steps: int | None,
          args, log: Log) -> dict:
    dev, S, B = data.device, args.seq_len, args.batch
    named = list(model.named_parameters()) + (list(mtp.named_parameters()) if mtp is not None else [])
    for n, p in named:
        if "e_score_correction_bias" in n:
            p.requires_grad_(False)  # some versions make it a Parameter; it is only moved by Balancer
    params = [p for _, p in named if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    except Exception:  # noqa: BLE001
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    bal = Balancer([model] + ([mtp] if mtp is not None else []), s, args.bias_gamma)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + (0 if mtp is not None else 1))
    ar, causal = torch.arange(S + 2, device=dev), torch.ones(S, S, dtype=torch.bool, device=dev).tril()
    pos = torch.arange(S, device=dev)[None].expand(B, S)
    total, warm, step, marks, hist = fixed_steps or 10**9, 150, 0, {}, []
    acc = torch.zeros(3, device=dev)
    model.train()
    t0 = time.time()
    while step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args.lr, warm)
        w = data[torch.randint(0, data.numel() - S - 2, (B,), device=dev, generator=gen)[:, None] + ar].long()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits, h, hpre = fwd(model, w[:, :S])
            lmain = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:S + 1].flatten())
            loss, lmtp = lmain, torch.zeros((), device=dev)
            if mtp is not None:  # DeepSeek-V3: MTP trained jointly, gradients reach the main model
                normed, _ = mtp(h if args.mtp_hidden == "post_norm" else hpre,
                                model.model.embed_tokens(w[:, 1:S + 1]), pos, causal)
                lmtp = F.cross_entropy(model.lm_head(normed).float().flatten(0, 1), w[:, 2:S + 2].flatten())
                loss = lmain + args.mtp_weight * lmtp
        loss.backward()
        if step == 0:
            for n, p in named:
                if n.endswith("mlp.gate.weight") and (p.grad is None or p.grad.abs().sum().item() == 0):
                    log(f"WARNING: router {n} got no gradient (routing weights detached in this transformers)")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        bal.update()
        acc += torch.stack([lmain.detach(), lmtp.detach(), torch.ones((), device=dev)])
        step += 1
        el = time.time() - t0
        if fixed_steps is None and step in (10, 100):
            marks[step] = el
        if fixed_steps is None and step in (40, 400):  # fit the cosine schedule to the time budget
            a = 10 if step == 40 else 100
            per = (el - marks[a]) / (step - a)
            total = max(step + 1, step + int((budget - el) / per))
            log(f"{s.name}: {per * 1000:.1f} ms/step -> schedule of {total} steps")
        if step % args.log_every == 0 or step == total:
            lm, lt, n = (acc / acc[2]).tolist()
            acc.zero_()
            bal.enabled = False  # validation batches must not count as expert load
            val_loss = quick_val(model, val) if step % (5 * args.log_every) == 0 or step == total else None
            bal.enabled = True
            hist.append({"step": step, "loss": round(lm, 4), "mtp_loss": round(lt, 4) if mtp is not None else None,
                         "val_loss": None if val_loss is None else round(val_loss, 4)})
            log(f"{s.name} step {step}/{total} loss {lm:.4f}" + (f" mtp {lt:.4f}" if mtp is not None else "")
                + (f" val {val_loss:.4f}" if val_loss is not None else "")
                + f" lr {opt.param_groups[0]['lr']:.2e} {step * B * S / el / 1e3:.0f}k tok/s; {bal.report()}")
        if fixed_steps is None and el > budget * 1.05:
            log(f"{s.name}: stopping at step {step}: time budget {budget:.0f}s exceeded")
            break
    bal.enabled = False
    model.eval()
    return {"steps": step, "scheduled_steps": total, "tokens": step * B * S, "seconds": round(time.time() - t0, 1),
            "batch": B, "seq_len": S, "lr": args.lr, "history": hist,
            "router_bias": {f"router{i}": [round(x, 4) for x in r.e_score_correction_bias.tolist()]
                            for i, r in enumerate(bal.routers)}}


# -------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def heldout(model, mtp, ids: torch.Tensor, S: int, args, bf16: bool = False) -> dict:
    """Non-overlapping windows of S ids, each scored alone; every id but a window's first is predicted."""
    win = ids[: ids.numel() // S * S].view(-1, S).long()
    dev = win.device
    nll = n = mnll = mok = mn = 0.0
    for chunk in win.split(16):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logits, h, hpre = fwd(model, chunk)
            nll += F.cross_entropy(logits[:, :-1].float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
            n += chunk[:, 1:].numel()
            if mtp is not None:  # MTP at t (t <= S-3) predicts x[t+2] from h[t] and x[t+1]
                T = S - 2
                hin = (h if args.mtp_hidden == "post_norm" else hpre)[:, :T]
                normed, _ = mtp(hin, model.model.embed_tokens(chunk[:, 1:T + 1]),
                                torch.arange(T, device=dev)[None].expand(chunk.shape[0], T),
                                torch.ones(T, T, dtype=torch.bool, device=dev).tril())
                ml = model.lm_head(normed).float()
                mnll += F.cross_entropy(ml.flatten(0, 1), chunk[:, 2:].flatten(), reduction="sum").item()
                mok += (ml.argmax(-1) == chunk[:, 2:]).sum().item()
                mn += chunk[:, 2:].numel()
    out = {"windows": win.shape[0], "window": S, "tokens_scored": int(n), "nll_per_token": nll / n,
           "ppl": math.exp(nll / n)}
    if mtp is not None:
        out.update(mtp_nll_per_token=mnll / mn, mtp_top1_accuracy=mok / mn)
    return out


def simulate(M: torch.Tensor, P: int, N: int, k: int) -> dict:
    """M[s-1, b, j]: the s-th proposal made right after the target emitted x[j] equals x[j+s]
    (given the earlier ones did). Greedy speculative decoding over x[P:N]."""
    Mc = M.cpu().tolist()
    acc = drafted = cycles = 0
    for b in range(len(Mc[0])):
        j = P
        while j + k <= N - 1:
            a = 0
            while a < k and Mc[a][b][j]:
                a += 1
            acc, drafted, cycles, j = acc + a, drafted + k, cycles + 1, j + a + 1
    return {"k": k, "acceptance_rate": round(acc / drafted, 4), "mean_accepted": round(acc / cycles, 4),
            "tokens_per_target_pass": round((acc + cycles) / cycles, 4)}


@torch.no_grad()
def acceptance(tgt, mtp, draft, stream: torch.Tensor, args, dev) -> dict:
    P, G, B, K = args.accept_prompt_len, args.accept_new_tokens, args.accept_prompts, 4
    stride = (stream.numel() - P) // B
    x = torch.stack([stream[b * stride: b * stride + P] for b in range(B)]).long().to(dev)
    prompts = x.clone()
    for _ in range(G):  # the target's greedy continuation (full recompute each step: plain reference)
        x = torch.cat([x, fwd(tgt, x)[0][:, -1].argmax(-1, keepdim=True)], 1)
    N = P + G
    logits, hpost, hpre = fwd(tgt, x)
    consistency = (logits[:, P - 1:N - 1].argmax(-1) == x[:, P:]).float().mean().item()
    dpred = fwd(draft, x)[0].argmax(-1)  # dpred[j] guesses x[j+1] from x[:j+1]
    Md = torch.zeros(K, B, N, dtype=torch.bool, device=dev)
    for si in range(1, K + 1):
        Md[si - 1, :, :N - si] = dpred[:, si - 1:N - 1] == x[:, si:]
    # MTP chain: true rows t = 0..N-2 (h[t], x[t+1]); chain step s for origin o = j-1 sits at position
    # o+s-1, eats the previous step's output and x[o+s], sees true rows <= o and its own chain.
    post = args.mtp_hidden == "post_norm"
    T1, org = N - 1, torch.arange(P - 1, N - 1, device=dev)
    hs, es = [(hpost if post else hpre)[:, :T1]], [x[:, 1:N]]
    poss, orgs, steps = [torch.arange(T1, device=dev)], [torch.arange(T1, device=dev)], [torch.ones(T1, device=dev)]
    Mm = torch.zeros(K, B, N, dtype=torch.bool, device=dev)
    prev = None
    for si in range(1, K + 1):
        if si > 1:
            hs.append(prev)
            es.append(x[:, (org + si).clamp(max=N - 1)])
            poss.append(org + si - 1)
            orgs.append(org)
            steps.append(torch.full((G,), float(si), device=dev))
        po, og, st = torch.cat(poss), torch.cat(orgs), torch.cat(steps)
        allowed = ((st[None] == 1) & (og[None] <= og[:, None])) | \
                  ((st[None] >= 2) & (og[None] == og[:, None]) & (st[None] <= st[:, None]))
        normed, raw = mtp(torch.cat(hs, 1), tgt.model.embed_tokens(torch.cat(es, 1)), po[None].expand(B, -1), allowed)
        sel = org if si == 1 else torch.arange(normed.shape[1] - G, normed.shape[1], device=dev)
        pred = tgt.lm_head(normed[:, sel]).argmax(-1)  # guesses x[o+si+1]
        prev = (normed if post else raw)[:, sel]
        ok = org + si + 1 <= N - 1
        Mm[si - 1][:, (org + 1)[ok]] = pred[:, ok] == x[:, (org + si + 1)[ok]]
    return {"prompts": B, "prompt_len": P, "new_tokens": G, "target_self_consistency": round(consistency, 4),
            "draft_model": [simulate(Md, P, N, k) for k in range(1, K + 1)],
            "mtp": [simulate(Mm, P, N, k) for k in range(1, K + 1)],
            "prompt_ids": prompts.tolist(), "target_greedy_ids": x[:, P:].tolist()}


@torch.no_grad()
def generate(model, tok, prompt: str, n: int, dev, gen: torch.Generator | None) -> str:
    x = torch.tensor([[BOS] + tok.encode(prompt, add_special_tokens=False).ids], device=dev)
    for _ in range(n):
        lg = fwd(model, x)[0][0, -1].float()
        if gen is None:
            nx = lg.argmax()
        else:  # temperature 0.8, top-k 40
            v, i = (lg / 0.8).topk(40)
            nx = i[torch.multinomial(v.softmax(-1), 1, generator=gen)[0]]
        if nx.item() == EOS:
            break
        x = torch.cat([x, nx.view(1, 1)], 1)
    return tok.decode(x[0, 1:].tolist())


# ------------------------------------------------------------------------------------------- main
def package(out_dir: Path, names: list[str], outp: Path | None, log: Log) -> None:
    if outp is None:
        return
    tar_path = Path(tempfile.gettempdir()) / "kiln_models.tar"
    with tarfile.open(tar_path, "w") as tf:
        for n in names:
            p = (out_dir / n).resolve()
            arc = os.path.relpath(p, Path.cwd()) if str(p).startswith(str(Path.cwd())) else f"models/{n}"
            tf.add(str(p), arcname=arc)
    data = tar_path.read_bytes()
    for old in outp.glob("models.tar.part*"):
        old.unlink()
    parts = math.ceil(len(data) / 15_000_000)
    assert parts <= 6, f"tar of {len(data)} bytes needs {parts} parts; $OUT takes at most 8 files"
    for i in range(parts):
        (outp / f"models.tar.part{i:02d}").write_bytes(data[i * 15_000_000:(i + 1) * 15_000_000])
    log(f"packaged {len(data)} bytes into {parts} part(s), sha256 {hashlib.sha256(data).hexdigest()[:16]}")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default="models")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--total-seconds", type=float, default=520, help="wall-clock budget of the whole run")
    ap.add_argument("--reserve-seconds", type=float, default=80, help="kept for saving, verifying, evaluating")
    ap.add_argument("--target-share", type=float, default=0.68, help="share of the training time for the target")
    ap.add_argument("--target-steps", type=int, help="train exactly this many steps instead of by time")
    ap.add_argument("--draft-steps", type=int)
    ap.add_argument("--corpus-seconds", type=float, default=75)
    ap.add_argument("--max-chars", type=int, default=48_000_000)
    ap.add_argument("--min-prose-chars", type=int, default=8_000_000)
    ap.add_argument("--heldout-permille", type=int, default=10)
    ap.add_argument("--tokenizer-chars", type=int, default=30_000_000)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--bias-gamma", type=float, default=1e-3, help="aux-loss-free balancing step")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--mtp-hidden", choices=["post_norm", "pre_norm"], default="post_norm")
    ap.add_argument("--experts-impl", default="eager", help="transformers 5.x experts implementation")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=16, help="windows of --seq-len saved in heldout.json")
    ap.add_argument("--accept-prompts", type=int, default=50)
    ap.add_argument("--accept-prompt-len", type=int, default=64)
    ap.add_argument("--accept-new-tokens", type=int, default=64)
    ap.add_argument("--max-shard-bytes", type=int, default=14_000_000)
    return ap.parse_args()


def main() -> None:
    args = parse()
    outp = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    log = Log(outp / "train_log.txt" if outp else None)
    try:
        run(args, outp, log)
    except BaseException:
        log("FAILED:\n" + traceback.format_exc())
        raise


def run(args, outp: Path | None, log: Log) -> None:
    out_dir = Path(args.out_dir)
    metrics: dict = {"args": vars(args), "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                                                      "transformers": transformers.__version__}}

    def dump() -> None:  # rewritten after every phase, so a run cut short still reports what it did
        path = outp / "metrics.json" if outp else out_dir / "train_metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(metrics, indent=1, default=str))

    log("versions:", metrics["versions"])
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    m0, mtp0 = build(TARGET, "sdpa", args.experts_impl, torch.device("cpu"))  # CPU: before the fork
    log(f"transformers parameter names ({'fused' if any(FUSED.match(n) for n, _ in m0.named_parameters()) else 'per-expert'} experts):")
    for n, p in m0.named_parameters():
        log(f"  {n} {tuple(p.shape)}")
    smoke(m0, mtp0, TARGET)
    log("smoke test (CPU forward/backward, router hooks, MTP layer) passed")
    train_docs, test_docs, metrics["corpus"] = gather_corpus(args, log)
    random.Random(args.seed).shuffle(train_docs)
    tok_texts, n = [], 0
    for _, t in train_docs:
        if n > args.tokenizer_chars:
            break
        tok_texts.append(t)
        n += len(t)
    tok = train_tokenizer(tok_texts, TARGET.vocab)
    log(f"tokenizer: {tok.get_vocab_size()} ids trained on {n} chars")
    train_ids, _ = encode_stream(tok, [t for _, t in train_docs])
    test_ids, test_starts = encode_stream(tok, [t for _, t in test_docs])
    metrics["tokens"] = {"train": train_ids.numel(), "test": test_ids.numel(),
                         "chars_per_token": round(metrics["corpus"]["chars"] / (train_ids.numel() + test_ids.numel()), 3)}
    log("tokens:", metrics["tokens"])
    S = args.seq_len
    assert test_ids.numel() >= args.eval_windows * S, "held-out split too small"
    dump()

    dev = torch.device(args.device)  # CUDA is touched only now, after the corpus workers were forked
    log("device:", torch.cuda.get_device_name(0) if dev.type == "cuda" else dev)
    torch.set_float32_matmul_precision("highest")  # float32 evaluation means float32
    data, test = train_ids.to(dev), test_ids.to(dev)
    val = test[: 8 * S].view(8, S).long()
    probe = test[: 2 * 64].view(2, 64).long()
    specs = [TARGET, DRAFT]
    for s in specs:
        assert s.moe_inter not in (s.hidden, s.hidden // 2) and s.experts % s.n_group == 0
        cnt = expected_layout(s)
        main_p = sum(math.prod(v) for k, v in cnt.items() if not k.startswith(f"model.layers.{s.layers}."))
        metrics[s.name] = {"spec": asdict(s), "params_main": main_p, "params_total_saved": sum(math.prod(v) for v in
                                                                                               cnt.values())}
        log(f"{s.name}: {main_p / 1e6:.2f}M parameters (main), {metrics[s.name]['params_total_saved'] / 1e6:.2f}M saved")

    # Check the export/import and the naming semantics on a random model before spending the budget.
    m0, mtp0 = m0.to(dev), mtp0.to(dev)
    init_weights([m0, mtp0], TARGET.layers)
    with torch.no_grad():  # non-zero biases so the check covers them
        for n, b in hf_tensors(m0, mtp0, TARGET).items():
            if n.endswith("e_score_correction_bias"):
                b.uniform_(0.0, 0.1)
    tmp = Path(tempfile.mkdtemp()) / "precheck"
    save_folder(tmp, TARGET, export_sd(m0, mtp0, TARGET, expert_layout(m0)), tok, args.max_shard_bytes)
    pre = verify(tmp, TARGET, probe, args, dev, log)
    metrics["precheck"] = pre
    assert pre["ok"], f"export/import check failed before training: {pre}"
    del m0, mtp0

    remain = args.total_seconds - (time.time() - T0) - args.reserve_seconds
    budgets = {TARGET.name: remain * args.target_share, DRAFT.name: remain * (1 - args.target_share)}
    log(f"training budgets: {json.dumps({k: round(v) for k, v in budgets.items()})} seconds")
    for s, fixed in ((TARGET, args.target_steps), (DRAFT, args.draft_steps)):
        torch.manual_seed(args.seed + (0 if s.nextn else 1))
        model, mtp = build(s, "sdpa", args.experts_impl, dev)
        init_weights([model] + ([mtp] if mtp is not None else []), s.layers)
        if s is DRAFT:  # the draft may use what the target left unused
            budgets[s.name] = max(30.0, args.total_seconds - (time.time() - T0) - args.reserve_seconds)
        metrics[s.name]["train"] = train(model, mtp, s, data, val, budgets[s.name], fixed, args, log)
        save_folder(out_dir / s.name, s, export_sd(model, mtp, s, expert_layout(model)), tok, args.max_shard_bytes)
        metrics[s.name]["verify"] = verify(out_dir / s.name, s, probe, args, dev, log, trained=model, hub=True)
        dump()
        del model, mtp
        torch.cuda.empty_cache() if dev.type == "cuda" else None
    names = [s.name for s in specs]
    package(out_dir, names, outp, log)  # early copy in case evaluation overruns the time limit

    # ---- evaluation in float32 from the saved bf16 weights
    try:
        ev = {s.name: load_eval(out_dir / s.name, s, args, dev)[:2] for s in specs}
        sub = test[: args.eval_windows * S]
        full = test[: min(test.numel(), 256 * S)]
        first_doc = max(i for i, st in enumerate(test_starts) if st <= sub.numel() - 1)
        docs = [t for _, t in test_docs[: first_doc + 1]]
        docs[-1] = docs[-1][: (sub.numel() - test_starts[first_doc]) * 8 + 200]  # >= 8 chars/id of margin
        for s in specs:
            model, mtp = ev[s.name]
            r = {"subset": heldout(model, mtp, sub, S, args), "subset_bf16": heldout(model, None, sub, S, args, True),
                 "full": heldout(model, mtp, full, S, args)}
            metrics[s.name]["heldout"] = r
            log(f"{s.name} held-out: {json.dumps(r)}")
            hj = {"ids": sub.tolist(), "window": S, "num_windows": args.eval_windows,
                  "scoring": f"non-overlapping windows of {S} ids, each scored alone from position 0; every id but "
                             "a window's first is predicted; mean NLL over all predicted ids",
                  "pytorch_nll_per_token": r["subset"]["nll_per_token"], "pytorch_ppl": r["subset"]["ppl"],
                  "pytorch_bf16_autocast_nll_per_token": r["subset_bf16"]["nll_per_token"],
                  "compute": "float32 from the saved bf16 weights (transformers eager attention)",
                  "docs_note": "ids = concat over docs of [BOS] + encode(doc) + [EOS], cut to len(ids) "
                               "(the last doc's text is cut well past the last id)",
                  "docs": docs}
            if mtp is not None:
                hj["mtp_nll_per_token"] = r["subset"]["mtp_nll_per_token"]
            (out_dir / s.name / "heldout.json").write_text(json.dumps(hj) + "\n")
        dump()
        acc = acceptance(ev[TARGET.name][0], ev[TARGET.name][1], ev[DRAFT.name][0], test, args, dev)
        metrics["acceptance"] = {k: v for k, v in acc.items() if not k.endswith("_ids")}
        hj = json.loads((out_dir / TARGET.name / "heldout.json").read_text())
        hj["acceptance"] = acc
        (out_dir / TARGET.name / "heldout.json").write_text(json.dumps(hj) + "\n")
        table = ["| k | draft->target acceptance | MTP->target acceptance |", "|---|---|---|"]
        for d, m in zip(acc["draft_model"], acc["mtp"]):
            table.append(f"| {d['k']} | {d['acceptance_rate']:.3f} ({d['tokens_per_target_pass']:.2f} tok/pass) "
                         f"| {m['acceptance_rate']:.3f} ({m['tokens_per_target_pass']:.2f} tok/pass) |")
        log("acceptance (greedy, %d prompts):\n%s" % (acc["prompts"], "\n".join(table)))
        gen = torch.Generator(device=dev)
        gen.manual_seed(args.seed)
        prompts = ["The function returns", "This module provides", "In this example, we"]
        metrics["samples"] = {
            "greedy": [generate(ev[TARGET.name][0], tok, p, 64, dev, None) for p in prompts],
            "sampled_t0.8_top40": [generate(ev[TARGET.name][0], tok, p, 64, dev, gen) for p in prompts],
            "draft_greedy": [generate(ev[DRAFT.name][0], tok, prompts[0], 48, dev, None)]}
        for kind, texts in metrics["samples"].items():
            for t in texts:
                log(f"sample [{kind}]: {t!r}")
        try:  # information: transformers reads the tokenizer and renders the chat template
            from transformers import AutoTokenizer
            ht = AutoTokenizer.from_pretrained(str(out_dir / TARGET.name))
            chat = ht.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
            same = ht.encode("The function returns 3 values.", add_special_tokens=False) == \
                tok.encode("The function returns 3 values.", add_special_tokens=False).ids
            metrics["tokenizer_check"] = {"chat": chat, "same_ids": same}
            log(f"tokenizer check: {metrics['tokenizer_check']}")
        except Exception as e:  # noqa: BLE001
            log(f"tokenizer check failed: {e}")
    except Exception:  # noqa: BLE001
        log("EVALUATION FAILED (models are saved):\n" + traceback.format_exc())
    sizes = {str(p.relative_to(out_dir)): p.stat().st_size for n in names for p in sorted((out_dir / n).iterdir())}
    metrics["files"] = sizes
    log(f"model files: {sum(sizes.values()) / 1e6:.2f} MB total, largest {max(sizes.values()) / 1e6:.2f} MB")
    if sum(sizes.values()) > 40e6 or max(sizes.values()) > 16e6:
        log("WARNING: over the 40 MB total / 16 MB per file limit")
    dump()
    package(out_dir, names, outp, log)
    summary = {s.name: {"params_main": metrics[s.name]["params_main"], "steps": metrics[s.name]["train"]["steps"],
                        "tokens": metrics[s.name]["train"]["tokens"],
                        "heldout": metrics[s.name].get("heldout", {}).get("full")} for s in specs}
    log("SUMMARY " + json.dumps(summary))
    log("done")


if __name__ == "__main__":
    main()

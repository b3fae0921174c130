// A DSpark-style block drafter (issue 41, drafter 3; the architecture of deepseek-ai/DeepSpec's
// DSpark, with MLA draft layers of the DeepSeek-V3 family). One forward proposes a whole block:
//
//   context  : the target's hidden states after layers target_layer_ids (-1: the embedding output),
//              concatenated [n, L * H] -> fc (no bias) -> hidden_norm (RMSNorm): [n, H]. The same
//              features are every draft layer's context; each layer projects them through its own
//              kv_a_proj_with_mqa into latent rows (kv_a_layernorm'd c_kv ‖ roped k_pe) at the
//              context's own positions, exactly as a target layer caches its tokens.
//   block    : [anchor, MASK x (B - 1)] embedded with the target's table at positions a .. a+B-1,
//              where a is the anchor's position and the context is positions [0, a).
//   layers   : MLA + dense SwiGLU, pre-norm. Every block row attends to all context rows and to all
//              B block rows (non-causal inside the block): the absorbed form over one latent pool
//              that holds the context rows then the block rows.
//   heads    : norm -> the target's lm_head: base logits [B, V]; block position k predicts token
//              a + k + 1. The vanilla Markov head adds markov_w2 · markov_w1[prev_k] to position k,
//              prev_0 = anchor and prev_k = the token drafted at k - 1, so drafting is sequential
//              over the block (cheap: one [r] row and one [V, r] GEMV per position). The optional
//              confidence head is sigmoid(proj · [h_k ; markov_w1[prev_k]] + bias), the predicted
//              chance that position k is accepted.
//
// The context lives in a BlockDrafterContext: per draft layer, a latent pool like the target's KV
// cache, appended as the target verifies tokens and truncated on rejection, so a step projects
// only the new context rows. All math goes through the op interface, so the CPU reference and
// CUDA run the same code.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace kiln::spec {

// config.json of a DSpark draft: the target family's fields (hidden size, MLA widths, RoPE, eps:
// the draft layers' shapes; num_hidden_layers counts draft layers) plus DeepSpec's own.
struct BlockDrafterConfig {
  ModelConfig layers;                     // shapes of the draft layers (dense MLP: intermediate_size)
  int64_t num_target_layers = 0;          // the target's layer count (validates target_layer_ids)
  std::vector<int64_t> target_layer_ids;  // strictly increasing, in {-1} ∪ [0, num_target_layers)
  int64_t block_size = 0;                 // B: tokens proposed per forward
  int64_t mask_token_id = 0;              // embedded at block positions 1 .. B-1
  int64_t markov_rank = 0;                // r of markov_w1 [V, r] and markov_w2 [V, r]; 0: no Markov head
  std::string markov_head_type = "vanilla";
  bool enable_confidence_head = false;
  bool confidence_head_with_markov = false;  // the head reads [h ; markov_w1[prev]] rather than h

  int64_t hidden() const { return layers.hidden_size; }
  int64_t vocab() const { return layers.vocab_size; }
  // Width of one context feature row: the chosen target layers' hidden states side by side.
  int64_t feature_dim() const { return static_cast<int64_t>(target_layer_ids.size()) * layers.hidden_size; }
};

BlockDrafterConfig parse_block_drafter_config(const nlohmann::json& j, const std::string& source);
BlockDrafterConfig load_block_drafter_config(const std::string& path);

struct BlockDrafterLayer {
  OwnedTensor input_norm, post_attn_norm;  // [H]
  Weight q_a;                              // [q_lora, H] (q LoRA) or q_proj [nh * qk, H]
  OwnedTensor q_a_norm;                    // [q_lora]
  Weight q_b;                              // [nh * qk, q_lora]
  Weight kv_a;                             // [kv_lora + rope, H]: kv_a_proj_with_mqa
  OwnedTensor kv_a_norm;                   // [kv_lora]
  Weight kv_b;                             // [nh * (nope + v), kv_lora]: per head W_uk rows then W_uv rows
  OwnedTensor w_uk_t;                      // [nh, kv_lora, nope]: the absorbed form's fold
  Weight o_proj;                           // [H, nh * v]
  Weight gate_up, down;                    // [2 * inter, H] (gate rows then up rows), [H, inter]
};

struct BlockDrafterWeights {
  OwnedTensor embed, lm_head;  // [V, H] each: the target's (shared memory) or the checkpoint's copies
  Weight fc;                   // [H, L * H]
  OwnedTensor hidden_norm;     // [H]
  std::vector<BlockDrafterLayer> layers;
  OwnedTensor norm;       // [H]
  OwnedTensor markov_w1;  // [V, r] (an embedding table)
  Weight markov_w2;       // [V, r]
  // The confidence head with its bias folded in as the weight of a constant-1 feature:
  // [1, H (+ r when with_markov) + 1].
  Weight confidence;
};

// The context of one sequence: per draft layer a latent pool [capacity + B rounded up to whole
// blocks, kv_lora + rope] whose rows [0, length) are the context at positions 0 .. length-1. Rows
// [length, length + B) are scratch for the block a forward drafts.
struct BlockDrafterContext {
  std::vector<OwnedTensor> pools;  // [layers] x [num_blocks * kBlock, kv_lora + rope] of kv_dtype
  DType dtype = DType::F32;
  int64_t capacity = 0;  // context rows it can hold
  int64_t length = 0;    // context rows held: positions [0, length)
};

// One drafted block, on the host.
struct BlockDraft {
  int64_t block_size = 0, vocab = 0;
  std::vector<int32_t> tokens;     // [B]: tokens[k] is the draft for position a + k + 1
  std::vector<float> logits;       // [B, V]: base + Markov bias, the distribution tokens[k] came from
  std::vector<float> base_logits;  // [B, V]: lm_head(norm(h_k)) alone
  std::vector<float> confidence;   // [B]: sigmoid of the confidence head; empty without one
};

class BlockDrafterModel {
 public:
  // The pool's tokens a block (the latent pool's page size; any size works).
  static constexpr int64_t kBlock = 64;

  BlockDrafterModel(BlockDrafterConfig config, BlockDrafterWeights weights, ops::Backend& backend);
  // Loads config.json and the safetensors checkpoint of `dir` in DeepSpec's tensor names. With
  // `target` the embedding and lm_head are the target's own (shared, not copied) and the
  // checkpoint's embed_tokens / lm_head, if any, are ignored; without it the checkpoint must hold
  // them. A missing or mis-shaped tensor is an error naming it.
  static std::unique_ptr<BlockDrafterModel> load(const std::string& dir, ops::Backend& backend,
                                                 const ModelWeights* target = nullptr);

  const BlockDrafterConfig& config() const { return c_; }
  ops::Backend& backend() const { return be_; }

  BlockDrafterContext new_context(int64_t capacity) const;
  // Appends n context rows at positions [ctx.length, ctx.length + n): features [n, L * H] f32 on
  // this backend (the target's hidden states as the engine keeps them) or on the host.
  void append_context(BlockDrafterContext& ctx, const Tensor& features);
  void append_context(BlockDrafterContext& ctx, std::span<const float> features_host);
  // Drops context rows past `length` (rejected tokens).
  void truncate_context(BlockDrafterContext& ctx, int64_t length) const;

  // Drafts the block after `anchor`, whose position is ctx.length (the context is every position
  // before it): greedy over the Markov-corrected logits, position by position.
  BlockDraft propose(BlockDrafterContext& ctx, int32_t anchor);
  // The same forward with the previous tokens given (teacher forcing, as DeepSpec trains):
  // prev [B], prev[0] = anchor, prev[k] = the token taken for position k - 1. `tokens` are then
  // each position's argmax.
  BlockDraft score(BlockDrafterContext& ctx, std::span<const int32_t> prev);

 private:
  // One forward's index arrays on the backend, in one upload.
  struct Step {
    OwnedTensor idx;
    const int32_t* ids;      // [B]: anchor, MASK x (B - 1)
    const int32_t* pos;      // [B]: a .. a + B - 1, also the block rows' pool slots
    const int32_t* cu_q;     // [B + 1]: 0 .. B, every block row its own one-query "sequence"
    const int32_t* kv_lens;  // [B]: a + B each, so that every row sees the whole context and block
    const int32_t* table;    // [B, num_blocks]: every row reads the same pool pages 0 .. num_blocks - 1
    int64_t num_blocks;
  };
  Step upload_step(const BlockDrafterContext& ctx, int32_t anchor);
  // The backbone over the block: writes h [B, H] = norm(last layer's output) and base logits [B, V].
  void backbone(BlockDrafterContext& ctx, int32_t anchor, float* h, float* base);
  // Context rows of layer l: kv_a(x [n, H]) -> norm(c_kv) ‖ rope(k_pe) into the pool at rows pos.
  void context_rows(int64_t l, const float* x, int64_t n, const int32_t* pos, void* pool, DType pool_dtype);
  // x [B, H] -> out [B, H] = x + attention over the context and the block.
  void attention(int64_t l, const float* x, const BlockDrafterContext& ctx, const Step& st, float* out);
  // x [B, H] -> out [B, H] = x + SwiGLU MLP.
  void mlp(int64_t l, const float* x, float* out);
  // Greedy tokens of `rows` rows of logits [rows, V] into tokens [rows] on the backend.
  void argmax(const float* logits, int64_t rows, int32_t* tokens);
  // The confidence head over h [B, H] and the Markov rows e [B, r] (null without): [B] on the host.
  std::vector<float> confidence(const float* h, const float* e);
  BlockDraft finish(const OwnedTensor& h, const OwnedTensor& base, const float* logits, const int32_t* tokens,
                    const float* e);
  OwnedTensor scratch(int64_t rows, int64_t cols) { return be_.alloc(DType::F32, {rows, cols}); }
  OwnedTensor ints(std::span<const int32_t> v);

  BlockDrafterConfig c_;
  BlockDrafterWeights w_;
  ops::Backend& be_;
  OwnedTensor inv_freq_;  // [rope / 2]
  float rope_factor_, scale_;
  // Greedy sampling parameters of B rows on the backend (ops::SampleParams), and a constant 1.
  OwnedTensor sample_f32_, sample_i32_, sample_u64_, ones_;
};

}  // namespace kiln::spec

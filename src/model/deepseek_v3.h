// The DeepSeek-V3 forward, written once against the op interface (DESIGN.md §4), over a batch
// of sequences whose latent KV (one row of kv_lora + rope values per token per layer: normalised
// c_kv ‖ roped k_pe) lives in a paged pool.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/forward_batch.h"
#include "model/model_shard.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace kiln {

struct RankGroup;  // model/rank_group.h

// Which MLA form attention runs in.
// Auto chooses per sequence: absorbed over the latent cache for one new token (decode), expanded
// over the sequence's own context for a prompt chunk. Tests force one form for every sequence.
enum class MlaForm { Auto, Expanded, Absorbed };

// One sequence with a private pool whose blocks are simply 0, 1, 2, ...: for `kiln score`,
// `kiln generate` and tests, without the engine's allocator.
struct SequenceCache {
  LatentKvPool pool;
  int64_t capacity = 0;
  int64_t length = 0;  // tokens already cached
};

class DeepseekV3Model {
 public:
  DeepseekV3Model(ModelConfig config, ModelWeights weights, ops::Backend& backend);
  // One rank of a split model: `weights` hold the rank's slices (dist/sharded_weights.h) and the
  // forward sums partial results over shard.comm.
  DeepseekV3Model(ModelConfig config, ModelWeights weights, ops::Backend& backend, ModelShard shard);
  ~DeepseekV3Model();
  // Loads config.json and the safetensors checkpoint of `dir` (quant: load_weights).
  static std::unique_ptr<DeepseekV3Model> load(const std::string& dir, ops::Backend& backend,
                                               WeightQuant quant = WeightQuant::None);

  const ModelConfig& config() const { return c_; }
  const ModelShard& shard() const { return shard_; }
  // The weights (rank 0's slices when split): a block drafter shares the embedding and lm_head.
  const ModelWeights& weights() const { return w_; }
  // Makes this model (rank 0) the front of a split model: every step, new pool, KV type and graph
  // call from now on runs on every rank of `group` too (dist/rank_group.h builds one).
  void attach_group(std::unique_ptr<RankGroup> group);
  int world_size() const;
  // Every rank's backend, rank 0's (backend()) first: settings such as the activation type apply to all.
  std::vector<ops::Backend*> rank_backends() const;
  ops::Backend& backend() const { return be_; }
  // A pool of `num_blocks` blocks of `block_size` tokens on this model's backend.
  LatentKvPool new_pool(int64_t num_blocks, int64_t block_size) const;
  // The latent cache's storage type for pools made from now on (default: the backend's choice,
  // bf16 on CUDA; f32 keeps the reference's precision at twice the bytes; F8E4M3 stores the FP8
  // rows of core/kv_fp8.h, 656 bytes a token a layer at DeepSeek-V3's widths, and throws on
  // backends whose kernels cannot read them yet: CUDA).
  void set_kv_dtype(DType t);
  DType kv_dtype() const { return kv_dtype_; }
  SequenceCache new_cache(int64_t capacity, int64_t block_size = 64) const;

  // One step over a batch: writes the new tokens' latent rows to their slots and returns the
  // logits of batch.logit_rows, [logit_rows.size(), vocab], on the host.
  std::vector<float> forward(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form = MlaForm::Auto);
  // The same step, leaving the logits on the backend: [logit_rows.size(), vocab] f32, valid
  // until the next step.
  Tensor forward_logits(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form = MlaForm::Auto);

  // The last step's hidden states of batch.hidden_rows: [hidden_rows, hidden_taps, hidden] f32 on
  // the backend (empty when none were asked), valid until the next step.
  Tensor hidden_states() const { return last_hidden_.t; }

  // Replays pure decode steps (one new token per sequence, every row's logits) of up to
  // max_batch sequences on `pool` from CUDA graphs, captured the first time each padded batch
  // size runs. Block tables up to max_blocks wide. No-op on backends without graphs.
  void enable_decode_graphs(LatentKvPool& pool, int64_t max_batch, int64_t max_blocks);
  // Captures the graph of every padded batch size up to max_batch now rather than the first time
  // each size runs while serving (a capture takes tens of milliseconds). The warm-up steps write
  // slot 0 of the pool, which no sequence may hold yet. Returns the number of graphs.
  int64_t capture_decode_graphs();
  // Drops the captured graphs (only those captured on `pool`, when given).
  void disable_decode_graphs(const LatentKvPool* pool = nullptr);

  // Single-sequence convenience: runs `tokens` at positions cache.length.. and appends them.
  // Returns every token's logits when all_logits, else the last token's.
  std::vector<float> forward(const std::vector<int32_t>& tokens, SequenceCache& cache, bool all_logits,
                             MlaForm form = MlaForm::Auto);

 private:
  struct StepInputs;  // the batch's index arrays on the backend
  Tensor forward_local(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form);
  void check_batch(const ForwardBatch& batch, const LatentKvPool& pool) const;
  void upload_dcp(const ForwardBatch& batch, const LatentKvPool& pool, const std::vector<int64_t>& order,
                  StepInputs& in);
  // Sums `n` f32 values over the ranks in place (a no-op on one rank).
  void all_reduce(float* buf, int64_t n);
  struct DecodeGraphs;  // captured decode steps
  // Validates and uploads the batch, its sequences ordered by attention form, padded to pad_to
  // sequences, into `buffer` (a graph's static inputs) or a fresh one.
  StepInputs upload_inputs(const ForwardBatch& batch, const LatentKvPool& pool, MlaForm form, int64_t pad_to,
                           OwnedTensor* buffer);
  void compute(const StepInputs& in, LatentKvPool& pool, const int32_t* logit_rows, int64_t rows, float* logits);
  // Writes tap `tap` of the hidden rows: x + pending (normed by the final norm when `norm`).
  void tap_hidden(const StepInputs& in, const float* x, const float* pending, int64_t tap, bool norm);
  bool graph_eligible(const ForwardBatch& batch, const LatentKvPool& pool, MlaForm form) const;
  std::shared_ptr<void> capture(const StepInputs& in, LatentKvPool& pool, float* logits);
  // The sub-layers over the residual stream x + pending (pending [T, H]: outputs not yet added to x;
  // null: none): each reads its norm of x + pending (fused into its first op) and writes
  // out [T, H] = pending + its output (the addend fused into its last op). x is never written.
  void attention(int64_t layer, const float* x, const float* pending, float* out, const StepInputs& in,
                 LatentKvPool& pool);
  void ffn(int64_t layer, const float* x, const float* pending, float* out, int64_t T);
  // The MoE combine by all-to-all (moe_alltoall.cc): h [T, H] the normed input, ids and wts [T, k]
  // the router's choices (global expert ids), out [T, H] = pending + shared + routed experts.
  void moe_alltoall(int64_t layer, const float* h, const Tensor& ids, const Tensor& wts, const float* pending,
                    float* out, int64_t T);
  // Decode context parallelism's two collectives parts of attention (mla_attention.cc).
  void absorbed_dcp(const float* qa, float* lat, const StepInputs& in, LatentKvPool& pool, int64_t layer);
  void gather_dcp(float* kv, const StepInputs& in, LatentKvPool& pool, int64_t layer);

  OwnedTensor scratch(int64_t rows, int64_t cols);

  ModelConfig c_;
  ModelWeights w_;
  ops::Backend& be_;
  ModelShard shard_;
  int64_t nh_;            // attention heads this rank runs (all of them on one rank)
  OwnedTensor inv_freq_;  // [rope / 2] f32
  float rope_factor_;
  float scale_;
  DType kv_dtype_;
  std::unique_ptr<DecodeGraphs> graphs_;
  OwnedTensor last_logits_;           // the eager path's logits, kept until the next step
  OwnedTensor last_hidden_;           // the last step's hidden-state taps (hidden_states())
  std::unique_ptr<RankGroup> group_;  // ranks 1..N-1 when this is rank 0 of a split model
};

}  // namespace kiln

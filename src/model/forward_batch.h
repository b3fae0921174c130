// ForwardBatch: the plain data of one model step (DESIGN.md §3), built by the scheduler (or by
// the single-sequence helper) and consumed by the forward. LatentKvPool: the paged latent KV
// memory the forward reads and writes; which blocks belong to whom is kv/'s business.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/backend.h"

namespace kiln {

// A hidden-state tap (ForwardBatch::hidden_taps): a decoder layer index l in [0, num_hidden_layers)
// is the residual stream after layer l; kHiddenFinalNorm is the last layer's output after the
// model's final norm (what lm_head sees, and what DeepSeek-V3's MTP layer is fed).
constexpr int32_t kHiddenFinalNorm = -1;

struct ForwardBatch {
  std::vector<int32_t> tokens;        // [T]: every sequence's new tokens, sequence after sequence
  std::vector<int32_t> positions;     // [T]: absolute position of each token in its sequence
  std::vector<int32_t> cu_q;          // [B + 1]: sequence b's tokens are [cu_q[b], cu_q[b+1])
  std::vector<int32_t> kv_lens;       // [B]: context length of sequence b after this step
  std::vector<int32_t> block_tables;  // [B, max_blocks]: pool blocks of each sequence, in order
  int64_t max_blocks = 0;
  std::vector<int32_t> slot_mapping;  // [T]: pool slot (block * block_size + offset) for each token
  std::vector<int32_t> logit_rows;    // rows of T whose logits the caller wants, in order
  // Tokens the step before sampled and has not told the host yet (the overlapped engine loop):
  // token t is prev_tokens[token_from[t]] where token_from[t] >= 0 (tokens[t] is then a stand-in).
  // Empty: every token is in `tokens`.
  std::vector<int32_t> token_from;       // [T] or empty
  const int32_t* prev_tokens = nullptr;  // on the backend: the earlier step's sampled tokens
  // [B] or empty: 1 where a multi-token row verifies speculative drafts. Under MlaForm::Auto it
  // attends in the absorbed form, as the one-token decode rows it stands in for do, so verifying
  // computes what plain decoding would (the expanded form rounds differently).
  std::vector<uint8_t> verify_rows;
  // Hidden states for a drafter (spec/): the taps (kHiddenFinalNorm or layer indices) of rows of T,
  // returned by DeepseekV3Model::hidden_states() as [hidden_rows, hidden_taps, hidden]. Empty: none
  // are computed, so a step without speculating rows pays nothing.
  std::vector<int32_t> hidden_rows, hidden_taps;
  // On the backend, [T, hidden] in this batch's token order: the layers' input instead of the
  // embedding lookup (an MTP layer's projected inputs). Null: embed `tokens`.
  const float* input_embeds = nullptr;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(kv_lens.size()); }
};

struct LatentKvPool {
  // Per layer [num_blocks * block_size, kv_lora + rope] of dtype; F8E4M3: U8 [slots, row_bytes],
  // rows in the FP8 layout of core/kv_fp8.h (scales inside the row, so a block's bytes are its own).
  std::vector<ops::OwnedTensor> layers;
  int64_t num_blocks = 0, block_size = 0, row_dim = 0;  // row_dim: values (kv_lora + rope), whatever the dtype
  int64_t kv_lora = 0;
  DType dtype = DType::F32;  // the backend's kv_dtype(), or what set_kv_dtype chose
  // A split model's pool is rank 0's; ranks 1..N-1 keep their own copies of the latent rows (the
  // latent KV is replicated over TP ranks), one pool each, on their own devices.
  std::shared_ptr<std::vector<LatentKvPool>> peers;
  // A multi-process run's pool on rank 0: the id the other processes' copies go by (RemoteRanks).
  std::shared_ptr<const int64_t> remote;

  int64_t num_slots() const { return num_blocks * block_size; }
};

}  // namespace kiln

// Internal to the model: the step's index arrays on the backend (DeepseekV3Model::StepInputs),
// the captured decode graphs and the packed layout both share. Included by the model's .cc files only.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <vector>

#include "model/deepseek_v3.h"

namespace kiln {

// The batch's index arrays on the backend: views into one buffer, uploaded in one copy.
// Sequences are reordered so that those attending in the absorbed form come first (sequences
// [0, Ba), tokens [0, Ta)) and the expanded ones after them; the expanded part has its own
// cu_q / cu_kv rebased to zero, so it runs as a batch of its own over its own context only.
struct DeepseekV3Model::StepInputs {
  int64_t T = 0, B = 0;
  int64_t Ta = 0, Ba = 0;       // the absorbed part
  int64_t total_kv_x = 0;       // context rows of the expanded part (cu_kv_x[B - Ba])
  OwnedTensor buffer;           // [ids | pos | slots | from | cu_q | kv_lens | block_tables | cu_q_x | cu_kv_x] int32
  OwnedTensor ids, pos, slots;  // [T] each, in the reordered token order
  OwnedTensor cu_q, kv_lens;    // [B + 1], [B]
  OwnedTensor block_tables;     // [B, stride]
  OwnedTensor cu_q_x, cu_kv_x;  // [B - Ba + 1] each: the expanded part's, from 0
  std::vector<int32_t> logit_rows;   // the caller's logit rows in the reordered token order
  std::vector<int32_t> hidden_rows;  // the caller's hidden rows in the reordered token order
  std::vector<int32_t> hidden_taps;  // the batch's
  // batch.input_embeds and where each sequence's rows go: {batch row, reordered row, rows}.
  const float* input_embeds = nullptr;
  std::vector<std::array<int64_t, 3>> embed_runs;
  // Decode context parallelism (ModelShard::dcp > 1): this rank's slot of each token (the spare
  // row for other ranks' tokens), its own row count of each sequence, and the expanded part's
  // cumulative own rows; x_kv_lens holds the expanded sequences' kv_lens on the host.
  OwnedTensor dcp_buffer, dcp_slots, dcp_kv_lens, dcp_cu_kv_x;  // [T], [B], [B - Ba + 1]
  std::vector<int32_t> x_kv_lens;

  // The paged cache of `layer` as sequences [first_seq, B) see it.
  // own_rows: this DCP rank's rows only.
  ops::PagedKv paged(const LatentKvPool& pool, int64_t layer, int64_t first_seq = 0, bool own_rows = false) const {
    const int64_t stride = block_tables.t.shape[1];
    return {pool.layers[static_cast<size_t>(layer)].t.data,
            pool.dtype,
            block_tables.t.as<int32_t>() + first_seq * stride,
            (own_rows ? dcp_kv_lens : kv_lens).t.as<int32_t>() + first_seq,
            pool.block_size,
            stride,
            pool.kv_lora};
  }
};

// A pure decode step of up to max_batch sequences replayed from a CUDA graph. Batches are
// padded up to a captured size by repeating their last sequence: the copies compute exactly what
// it computes and write the same bits to the same KV slot, so padding needs no kernel support.
struct DeepseekV3Model::DecodeGraphs {
  int64_t max_batch = 0, max_blocks = 0;
  LatentKvPool* pool = nullptr;                       // the pool the graphs were captured on
  OwnedTensor inputs;                                 // StepInputs buffer laid out for max_batch, max_blocks
  OwnedTensor logits;                                 // [max_batch, vocab]: every graph's output rows
  std::map<int64_t, std::shared_ptr<void>> captured;  // padded batch -> graph (null: not capturable)

  static int64_t bucket(int64_t b) {  // 1, 2, 4, 8, then multiples of 16
    if (b <= 8) return b <= 1 ? 1 : b <= 2 ? 2 : b <= 4 ? 4 : 8;
    return (b + 15) / 16 * 16;
  }
};

// Rows of a context of kv_len tokens that DCP rank `r` of `dcp` holds (positions r, r + dcp, ...).
int64_t dcp_rows(int64_t kv_len, int64_t r, int64_t dcp);

// Offsets of each array in the packed StepInputs buffer, for T tokens, B sequences and block
// tables `stride` entries wide.
struct StepInputLayout {
  int64_t ids, pos, slots, from, cu_q, kv_lens, tables, cu_q_x, cu_kv_x, total;
  StepInputLayout(int64_t T, int64_t B, int64_t stride)
      : ids(0),
        pos(T),
        slots(2 * T),
        from(3 * T),
        cu_q(4 * T),
        kv_lens(cu_q + B + 1),
        tables(kv_lens + B),
        cu_q_x(tables + B * stride),
        cu_kv_x(cu_q_x + B + 1),
        total(cu_kv_x + B + 1) {}
};

}  // namespace kiln

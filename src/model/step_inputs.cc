// DeepseekV3Model::upload_inputs: checks a ForwardBatch, orders its sequences by attention form
// and uploads every index array of the step in one copy.
#include <algorithm>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/step_inputs.h"

namespace kiln {

void DeepseekV3Model::check_batch(const ForwardBatch& batch, const LatentKvPool& pool) const {
  const int64_t T = batch.num_tokens(), B = batch.num_seqs(), V = c_.vocab_size;
  KILN_CHECK(T > 0 && B > 0, "forward needs at least one token");
  KILN_CHECK(static_cast<int64_t>(batch.cu_q.size()) == B + 1 && batch.cu_q.front() == 0 && batch.cu_q.back() == T &&
                 static_cast<int64_t>(batch.positions.size()) == T &&
                 static_cast<int64_t>(batch.slot_mapping.size()) == T &&
                 static_cast<int64_t>(batch.block_tables.size()) == B * batch.max_blocks,
             "malformed ForwardBatch: {} tokens, {} sequences", T, B);
  for (int32_t id : batch.tokens) KILN_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
  KILN_CHECK(batch.token_from.empty() || (static_cast<int64_t>(batch.token_from.size()) == T && batch.prev_tokens),
             "malformed ForwardBatch: token_from has {} entries for {} tokens", batch.token_from.size(), T);
  for (int32_t s : batch.slot_mapping)
    KILN_CHECK(s >= 0 && s < pool.num_slots(), "slot {} is outside the KV pool ({} slots)", s, pool.num_slots());
  for (int32_t tap : batch.hidden_taps)
    KILN_CHECK(tap == kHiddenFinalNorm || (tap >= 0 && tap < c_.num_hidden_layers),
               "hidden-state tap {} is neither a layer of {} nor the final norm", tap, c_.num_hidden_layers);
  KILN_CHECK(batch.hidden_rows.empty() || !batch.hidden_taps.empty(), "hidden rows asked with no tap");
  for (int32_t p : batch.positions)
    KILN_CHECK(p >= 0 && p < c_.max_position_embeddings, "position {} exceeds max_position_embeddings {}", p,
               c_.max_position_embeddings);
}

DeepseekV3Model::StepInputs DeepseekV3Model::upload_inputs(const ForwardBatch& batch, const LatentKvPool& pool,
                                                           MlaForm form, int64_t pad_to, OwnedTensor* buffer) {
  check_batch(batch, pool);
  const int64_t T = batch.num_tokens(), B = batch.num_seqs();
  const bool take = !batch.token_from.empty();
  auto q_len = [&](int64_t b) { return batch.cu_q[static_cast<size_t>(b + 1)] - batch.cu_q[static_cast<size_t>(b)]; };
  bool all_single = true;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t kv_len = batch.kv_lens[static_cast<size_t>(b)];
    KILN_CHECK(q_len(b) >= 1 && kv_len >= q_len(b) && kv_len <= batch.max_blocks * pool.block_size,
               "malformed ForwardBatch: sequence {} has {} new tokens and {} in context", b, q_len(b), kv_len);
    all_single &= q_len(b) == 1;
  }

  // Each sequence's form: decode rows (one new token) attend over the latent cache in the absorbed
  // form; prompt chunks expand their own context only. A forced form applies to every sequence.
  // Speculative verify rows (several new tokens at the end of a decoding sequence) count as decode rows.
  KILN_CHECK(batch.verify_rows.empty() || static_cast<int64_t>(batch.verify_rows.size()) == B,
             "malformed ForwardBatch: verify_rows has {} entries for {} sequences", batch.verify_rows.size(), B);
  auto verify = [&](int64_t b) { return !batch.verify_rows.empty() && batch.verify_rows[static_cast<size_t>(b)]; };
  auto absorbed = [&](int64_t b) {
    return form == MlaForm::Absorbed || (form == MlaForm::Auto && (q_len(b) == 1 || verify(b)));
  };
  std::vector<int64_t> order;  // new sequence index -> the batch's
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t b = 0; b < B; ++b)
      if (absorbed(b) == (pass == 0)) order.push_back(b);
  StepInputs in;
  for (int64_t b = 0; b < B; ++b)
    if (absorbed(b)) ++in.Ba, in.Ta += q_len(b);

  // Padding (graphs): sequences B..pad_to-1 repeat the last one. Only pure decode steps pad.
  const int64_t Bp = std::max(pad_to, B), Tp = T + (Bp - B);
  KILN_CHECK(Bp == B || (all_single && in.Ba == B), "internal: only absorbed decode steps are padded");
  if (Bp > B) in.Ba = Bp, in.Ta = Tp;
  const int64_t stride = buffer ? graphs_->max_blocks : batch.max_blocks;
  KILN_CHECK(batch.max_blocks <= stride, "internal: block tables wider than the graph's");
  const StepInputLayout lay(buffer ? graphs_->max_batch : Tp, buffer ? graphs_->max_batch : Bp, stride);
  // A graph's buffer is laid out for its largest batch: only the rows this step uses go up (a
  // graph step is all absorbed: the expanded part's arrays, last, stay empty).
  const int64_t used = buffer ? lay.tables + Bp * stride : lay.total;
  std::vector<int32_t> host(static_cast<size_t>(used), 0);
  auto at = [&](int64_t off, int64_t i) -> int32_t& { return host[static_cast<size_t>(off + i)]; };
  std::vector<int32_t> new_start(static_cast<size_t>(B));  // the batch's sequence -> its first new token row
  int32_t t_new = 0, kv_x = 0;
  for (int64_t i = 0; i < Bp; ++i) {
    const int64_t src = i < B ? order[static_cast<size_t>(i)] : B - 1;
    const auto sb = static_cast<size_t>(src);
    if (i < B) new_start[sb] = t_new;
    for (int32_t t = batch.cu_q[sb]; t < batch.cu_q[sb + 1]; ++t, ++t_new) {
      at(lay.ids, t_new) = batch.tokens[static_cast<size_t>(t)];
      at(lay.pos, t_new) = batch.positions[static_cast<size_t>(t)];
      at(lay.slots, t_new) = batch.slot_mapping[static_cast<size_t>(t)];
      at(lay.from, t_new) = take ? batch.token_from[static_cast<size_t>(t)] : -1;
    }
    at(lay.cu_q, i + 1) = t_new;
    at(lay.kv_lens, i) = batch.kv_lens[sb];
    for (int64_t j = 0; j < batch.max_blocks; ++j)
      at(lay.tables, i * stride + j) = batch.block_tables[static_cast<size_t>(src * batch.max_blocks + j)];
    if (i >= in.Ba) {
      kv_x += batch.kv_lens[sb];
      at(lay.cu_q_x, i - in.Ba + 1) = t_new - static_cast<int32_t>(in.Ta);
      at(lay.cu_kv_x, i - in.Ba + 1) = kv_x;
    }
  }
  auto reordered = [&](int32_t r) {
    const auto b =
        static_cast<size_t>(std::upper_bound(batch.cu_q.begin(), batch.cu_q.end(), r) - batch.cu_q.begin() - 1);
    return new_start[b] + (r - batch.cu_q[b]);
  };
  for (int32_t r : batch.logit_rows) in.logit_rows.push_back(reordered(r));
  for (int32_t r : batch.hidden_rows) {
    KILN_CHECK(r >= 0 && r < T, "hidden row {} is outside the batch of {} tokens", r, T);
    in.hidden_rows.push_back(reordered(r));
  }
  in.hidden_taps = batch.hidden_taps;
  if (batch.input_embeds) {
    KILN_CHECK(!buffer, "internal: a graph step takes no input embeddings");
    in.input_embeds = batch.input_embeds;
    for (int64_t b = 0; b < B; ++b)
      in.embed_runs.push_back({batch.cu_q[static_cast<size_t>(b)], new_start[static_cast<size_t>(b)], q_len(b)});
  }
  in.T = Tp;
  in.B = Bp;
  in.total_kv_x = kv_x;
  in.buffer = buffer ? *buffer : be_.alloc(DType::I32, {lay.total});
  be_.upload(Tensor{in.buffer.t.data, DType::I32, {used}, in.buffer.t.device}, host.data());
  auto view = [&](int64_t off, Shape shape) {
    OwnedTensor v;
    v.mem = in.buffer.mem;
    v.t = Tensor{in.buffer.t.as<int32_t>() + off, DType::I32, std::move(shape), in.buffer.t.device};
    return v;
  };
  in.ids = view(lay.ids, {Tp});
  // The earlier step's sampled tokens, still on the device, replace their stand-ins.
  // On a split model they are on rank 0's device: rank 0 takes them and hands every rank the ids.
  if (take && shard_.rank == 0)
    be_.take_tokens({in.ids.t.as<int32_t>(), in.buffer.t.as<int32_t>() + lay.from, batch.prev_tokens, Tp});
  if (take && shard_.sharded()) shard_.comm->broadcast(in.ids.t.data, static_cast<size_t>(Tp), DType::I32, 0);
  in.pos = view(lay.pos, {Tp});
  in.slots = view(lay.slots, {Tp});
  in.cu_q = view(lay.cu_q, {Bp + 1});
  in.kv_lens = view(lay.kv_lens, {Bp});
  in.block_tables = view(lay.tables, {Bp, stride});
  in.cu_q_x = view(lay.cu_q_x, {Bp - in.Ba + 1});
  in.cu_kv_x = view(lay.cu_kv_x, {Bp - in.Ba + 1});
  if (shard_.dcp > 1) upload_dcp(batch, pool, order, in);
  return in;
}

// Rows of a context of kv_len tokens that DCP rank `r` of `dcp` holds (positions r, r + dcp, ...).
int64_t dcp_rows(int64_t kv_len, int64_t r, int64_t dcp) {
  return kv_len > r ? (kv_len - r + dcp - 1) / dcp : 0;
}

void DeepseekV3Model::upload_dcp(const ForwardBatch& batch, const LatentKvPool& pool, const std::vector<int64_t>& order,
                                 StepInputs& in) {
  const int64_t B = in.B, T = in.T, d = shard_.dcp, me = shard_.dcp_rank, bs = pool.block_size;
  for (int64_t i = 0; i < in.Ba; ++i) {
    const auto b = static_cast<size_t>(order[static_cast<size_t>(i)]);
    KILN_CHECK(batch.cu_q[b + 1] - batch.cu_q[b] == 1,
               "decode context parallelism: sequence {} has {} new tokens in the absorbed form (one a step)", b,
               batch.cu_q[b + 1] - batch.cu_q[b]);
  }
  std::vector<int32_t> host(static_cast<size_t>(T + B + (B - in.Ba) + 1), 0);
  int32_t* slots = host.data();
  int32_t* lens = slots + T;
  int32_t* cu_x = lens + B;
  int64_t t = 0;
  for (int64_t i = 0; i < B; ++i) {
    const auto b = static_cast<size_t>(order[static_cast<size_t>(i)]);
    for (int32_t k = batch.cu_q[b]; k < batch.cu_q[b + 1]; ++k, ++t) {
      const int64_t pos = batch.positions[static_cast<size_t>(k)], local = pos / d;
      slots[t] = pos % d != me
                     ? static_cast<int32_t>(pool.num_slots())  // the spare row
                     : static_cast<int32_t>(batch.block_tables[b * batch.max_blocks + local / bs] * bs + local % bs);
    }
    lens[i] = static_cast<int32_t>(dcp_rows(batch.kv_lens[b], me, d));
    if (i >= in.Ba) {
      in.x_kv_lens.push_back(batch.kv_lens[b]);
      cu_x[i - in.Ba + 1] = cu_x[i - in.Ba] + lens[i];
    }
  }
  in.dcp_buffer = be_.alloc(DType::I32, {static_cast<int64_t>(host.size())});
  be_.upload(in.dcp_buffer.t, host.data());
  auto view = [&](int64_t off, Shape shape) {
    OwnedTensor v;
    v.mem = in.dcp_buffer.mem;
    v.t = Tensor{in.dcp_buffer.t.as<int32_t>() + off, DType::I32, std::move(shape), in.dcp_buffer.t.device};
    return v;
  };
  in.dcp_slots = view(0, {T});
  in.dcp_kv_lens = view(T, {B});
  in.dcp_cu_kv_x = view(T + B, {B - in.Ba + 1});
}

}  // namespace kiln

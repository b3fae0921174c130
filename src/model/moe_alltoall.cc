// Expert parallelism's all-to-all combine (model/ep_dispatch.h has the plan). Against the
// all-reduce of every rank's dense [T, H] partial, each rank sends only the rows of tokens its
// experts serve, and only to the token's owner; the all-gather of the owners' blocks then gives
// every rank the whole [T, H] again for attention TP. The shared experts are replicated under this
// layout (ParallelLayout) so each owner runs them over its own tokens and no rank produces a dense
// partial that would need summing.
#include <algorithm>
#include <vector>

#include "dist/communicator.h"
#include "model/deepseek_v3.h"
#include "model/ep_dispatch.h"

namespace kiln {

void DeepseekV3Model::moe_alltoall(int64_t l, const float* h, const Tensor& ids_t, const Tensor& wts_t,
                                   const float* pending, float* out, int64_t T) {
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const int64_t H = c_.hidden_size, k = c_.num_experts_per_tok, El = shard_.experts;
  const int W = shard_.world;
  // The routing is replicated: every rank plans every rank's traffic from the same ids.
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(static_cast<size_t>(T * k));
  be_.download(ids.data(), ids_t);
  be_.download(wts.data(), wts_t);
  const EpDispatchPlan plan = plan_ep_dispatch(ids, T, k, shard_.rank, W, shard_.ep, El);
  const int64_t M = static_cast<int64_t>(plan.mine.size());

  // This rank's experts over the rows they serve: partial [M, H], rows in `mine` order (grouped by
  // owner, as all_to_all sends them). Choices of other ranks' experts get weight 0.
  OwnedTensor part = scratch(std::max<int64_t>(M, 1), H);
  if (M > 0) {
    OwnedTensor hm = scratch(M, H), lid = be_.alloc(DType::I32, {M, k}), lw = scratch(M, k);  // [M, H], [M, k]
    std::vector<int32_t> local_ids(static_cast<size_t>(M * k), 0);
    std::vector<float> local_w(static_cast<size_t>(M * k), 0.0f);
    for (int64_t i = 0; i < M;) {  // gather the served rows, one copy per run of consecutive tokens
      int64_t j = i + 1;
      while (j < M && plan.mine[static_cast<size_t>(j)] == plan.mine[static_cast<size_t>(j - 1)] + 1) ++j;
      be_.copy({h + plan.mine[static_cast<size_t>(i)] * H, H, hm.f32() + i * H, H, j - i, H});
      i = j;
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const size_t src = static_cast<size_t>(plan.mine[static_cast<size_t>(i)] * k + j),
                     dst = static_cast<size_t>(i * k + j);
        const int64_t local = ids[src] - shard_.expert_begin;
        if (local < 0 || local >= El) continue;
        local_ids[dst] = static_cast<int32_t>(local), local_w[dst] = wts[src];
      }
    be_.upload(lid.t, local_ids.data());
    be_.upload(lw.t, local_w.data());
    ops::MoeParams moe{hm.f32(),
                       lid.t.as<int32_t>(),
                       lw.f32(),
                       w.experts_gate_up.t.data,
                       w.experts_down.t.data,
                       w.experts_gate_up.t.dtype,
                       part.f32(),
                       M,
                       H,
                       w.experts_gate_up.t.shape[1] / 2,  // this rank's slice of moe_intermediate_size
                       El,
                       k};
    moe.w_gate_up_scales = w.experts_gate_up.scales(), moe.w_down_scales = w.experts_down.scales();
    be_.moe(moe);
  }

  // Combine: each owner receives, in rank order, the partial sums for its tokens.
  std::vector<size_t> send(static_cast<size_t>(W)), recv(static_cast<size_t>(W));
  int64_t received = 0;
  for (size_t s = 0; s < static_cast<size_t>(W); ++s) {
    send[s] = static_cast<size_t>(plan.send_rows[s] * H), recv[s] = static_cast<size_t>(plan.recv_rows[s] * H);
    received += plan.recv_rows[s];
  }
  OwnedTensor got = scratch(std::max<int64_t>(received, 1), H);  // [received, H]
  shard_.comm->all_to_all(part.f32(), send, got.f32(), recv, DType::F32);

  // The owner's block [per, H] (rows past the last token are padding for the gather): residual +
  // shared experts over its own tokens, then every rank's routed partials added in rank order.
  const int64_t per = std::max<int64_t>(plan.per, 1), n = plan.own_end - plan.own_begin;
  OwnedTensor block = scratch(per, H);
  const float* own_pending = pending ? pending + plan.own_begin * H : nullptr;
  if (n > 0 && c_.n_shared_experts > 0) {
    const int64_t S = w.shared_gate_up.t.shape[0] / 2;
    OwnedTensor gu = scratch(n, 2 * S), act = scratch(n, S);  // [n, 2S], [n, S]
    ops::LinearParams gate_up{
        h + plan.own_begin * H, 0, w.shared_gate_up.t.data, w.shared_gate_up.t.dtype, gu.f32(), 0, n, 2 * S, H};
    gate_up.w_scales = w.shared_gate_up.scales();
    be_.linear(gate_up);
    be_.swiglu({gu.f32(), act.f32(), n, S});
    ops::LinearParams down{act.f32(), 0, w.shared_down.t.data, w.shared_down.t.dtype, block.f32(), 0, n, H, S};
    down.w_scales = w.shared_down.scales();
    down.add = own_pending;
    be_.linear(down);
  } else if (n > 0 && own_pending) {
    be_.copy({own_pending, H, block.f32(), H, n, H});
  } else if (n > 0) {
    const std::vector<float> zeros(static_cast<size_t>(n * H), 0.0f);
    be_.upload(Tensor{block.t.data, DType::F32, {n, H}, block.t.device}, zeros.data());
  }
  int64_t row = 0;
  for (size_t s = 0; s < static_cast<size_t>(W); ++s)
    for (int32_t t : plan.recv_tokens[s]) {
      float* dst = block.f32() + (t - plan.own_begin) * H;
      be_.add({dst, got.f32() + row++ * H, dst, H});
    }

  // Every rank needs every token's row for the next layer's attention (TP): gather the blocks.
  OwnedTensor all = scratch(W * per, H);  // [W, per, H]
  shard_.comm->all_gather(block.f32(), all.f32(), static_cast<size_t>(per * H), DType::F32);
  be_.copy({all.f32(), H, out, H, T, H});
}

}  // namespace kiln

// kiln-gpu-bench: GPU figures beside the ceilings measured in the same run (DESIGN.md §10).
//   1. ceilings: HBM copy bandwidth, bf16 GEMM rate
//   2. MLA decode kernel alone (absorbed, paged, bf16 pool) at 16 and 128 heads, 128-32k contexts,
//      batches 1-128 (2 and 4 at 16 heads only: where the cluster form's choice lies), against the
//      copy ceiling
//   3. whole model with random weights (Moonlight-16B-A3B shape and its 129,280-vocab variant):
//      prefill tok/s at 1k, 8 x 1k (one step) and 8k, decode tok/s at batch 1..256, each against
//      its ceiling; then prefill and the grouped decode batches (> 8) again with bf16 activations,
//      and with f32 activations but bf16 experts (--expert-activation-dtype bf16)
// Writes a JSON report (--out) and prints a table. Figures, not tests: nothing here asserts.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <utility>
#include <vector>

#include "gpu_ceilings.h"
#include "model/deepseek_v3.h"
#include "model/weight_layout.h"
#include "ops/backend.h"
#include "plan/planner.h"

using json = nlohmann::json;
using namespace kiln;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call of op(i), i = 0..reps-1, after one warm-up call op(0) (scratch growth, kernel
// attributes), with the device drained before and after the timed calls.
template <typename Op>
double seconds_per_call(ops::Backend& be, int reps, Op&& op) {
  op(0);
  be.synchronize();
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) op(i);
  be.synchronize();
  return (now_s() - t0) / reps;
}

const char* kMoonlight = R"({"model_type":"deepseek_v3","vocab_size":163840,"hidden_size":2048,
  "intermediate_size":11264,"moe_intermediate_size":1408,"num_hidden_layers":27,"num_attention_heads":16,
  "n_shared_experts":2,"n_routed_experts":64,"num_experts_per_tok":6,"routed_scaling_factor":2.446,
  "kv_lora_rank":512,"q_lora_rank":null,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"v_head_dim":128,
  "n_group":1,"topk_group":1,"first_k_dense_replace":1,"norm_topk_prob":true,"scoring_func":"sigmoid",
  "rope_theta":50000,"max_position_embeddings":8192,"rms_norm_eps":1e-5})";

// Bytes one decode step over B sequences of context `ctx` must read: every weight once, routed
// experts only as many as B tokens touch (expected distinct), embedding rows only, KV rows.
double decode_bytes(const ModelConfig& c, int64_t B, int64_t ctx, int64_t kv_bytes_per_value) {
  const double distinct =
      plan::expected_distinct_experts(c.n_routed_experts, c.num_experts_per_tok, static_cast<double>(B));
  double bytes = 0;
  for (const auto& w : weight_layout(c)) {
    if (w.mtp) continue;
    const double el = (w.role == WeightRole::Router) ? 4.0 : 2.0;
    if (w.role == WeightRole::Embedding)
      bytes += static_cast<double>(B * c.hidden_size) * el;
    else if (w.role == WeightRole::RoutedExpert)
      bytes += static_cast<double>(w.numel()) * el * distinct / static_cast<double>(c.n_routed_experts);
    else
      bytes += static_cast<double>(w.numel()) * el;
  }
  bytes += static_cast<double>(B * ctx * c.num_hidden_layers * c.kv_row_dim() * kv_bytes_per_value);
  return bytes;
}

// FLOPs of a prefill of T tokens: 2 x active params per token (lm_head on the last row only)
// + causal attention in the expanded form.
double prefill_flops(const ModelConfig& c, int64_t T) {
  const ParamCounts p = count_params(c);
  const double per_token = 2.0 * static_cast<double>(p.active - 2 * c.vocab_size * c.hidden_size);
  const double attn = 2.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads) *
                      static_cast<double>(c.qk_head_dim() + c.v_head_dim) * static_cast<double>(T) *
                      static_cast<double>(T) / 2.0;
  return per_token * static_cast<double>(T) + attn + 2.0 * static_cast<double>(c.vocab_size * c.hidden_size);
}

// The absorbed decode kernel alone over the backend's KV pool (bf16 on CUDA). Bytes counted:
// every sequence reads its kv_len rows once (kv_len * 576 * 2 B), plus q (f32 in) and out (f32
// out). Small pools would sit in the 50 MB L2 between repetitions and overstate HBM bandwidth, so
// the repetitions rotate over copies of the pool spanning >= 512 MB.
json bench_mla_kernel(ops::Backend& be, double copy_gbps, bool quick) {
  json rows = json::array();
  const int64_t kLora = 512, kRope = 64, row = kLora + kRope, bs = 64;
  const DType kv = be.kv_dtype();
  const int64_t kv_bytes = static_cast<int64_t>(dtype_size(kv));
  std::printf("mla decode kernel, %s latent pool\n", dtype_name(kv));
  const std::vector<int64_t> contexts =
      quick ? std::vector<int64_t>{128, 1024, 8192, 32768} : std::vector<int64_t>{128, 1024, 4096, 8192, 16384, 32768};
  for (int64_t heads : {16, 128}) {
    for (int64_t ctx : contexts) {
      for (int64_t B : {1, 2, 4, 8, 32, 128}) {
        if (heads > 16 && (B == 2 || B == 4)) continue;
        const int64_t blocks_per = (ctx + bs - 1) / bs, blocks = B * blocks_per;
        const double kv_read = static_cast<double>(B * ctx * row * kv_bytes);
        const int64_t copies = std::max<int64_t>(1, static_cast<int64_t>((512.0 * (1 << 20)) / kv_read + 1));
        auto pool = be.alloc(kv, {copies * blocks * bs, row});
        be.fill_random(pool.t, 1, 1.0f);
        auto q = be.alloc(DType::F32, {B, heads * row});
        be.fill_random(q.t, 2, 0.1f);
        auto out = be.alloc(DType::F32, {B, heads * kLora});
        std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(ctx)), cu;
        for (int64_t b = 0; b <= B; ++b) cu.push_back(static_cast<int32_t>(b));
        auto tl = be.alloc(DType::I32, {B}), tc = be.alloc(DType::I32, {B + 1});
        be.upload(tl.t, lens.data());
        be.upload(tc.t, cu.data());
        std::vector<ops::OwnedTensor> tables;
        std::vector<ops::MlaAbsorbedParams> params;
        for (int64_t c = 0; c < copies; ++c) {
          std::vector<int32_t> table(static_cast<size_t>(blocks));
          for (int64_t i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(c * blocks + i);
          tables.push_back(be.alloc(DType::I32, {blocks}));
          be.upload(tables.back().t, table.data());
          params.push_back({q.f32(),
                            {pool.t.data, kv, tables.back().t.as<int32_t>(), tl.t.as<int32_t>(), bs, blocks_per},
                            tc.t.as<int32_t>(),
                            B,
                            B,
                            out.f32(),
                            heads,
                            kLora,
                            kRope,
                            0.07f});
        }
        for (const auto& p : params) be.mla_absorbed(p);  // every copy's first call (attributes, scratch)
        const int reps = static_cast<int>(std::max<int64_t>(20, 2 * copies));
        const double sec =
            seconds_per_call(be, reps, [&](int i) { be.mla_absorbed(params[static_cast<size_t>(i % copies)]); });
        const double bytes = kv_read + static_cast<double>(B * heads * (row + kLora) * 4);
        const double gbps = bytes / sec / 1e9;
        rows.push_back({{"heads", heads},
                        {"context", ctx},
                        {"batch", B},
                        {"kv_dtype", dtype_name(kv)},
                        {"us", sec * 1e6},
                        {"bytes", bytes},
                        {"gbps", gbps},
                        {"fraction_of_copy_bw", gbps / copy_gbps}});
        std::printf("mla decode  heads %3lld ctx %6lld batch %3lld: %9.1f us  %7.0f GB/s  %5.1f%% of copy\n",
                    static_cast<long long>(heads), static_cast<long long>(ctx), static_cast<long long>(B), sec * 1e6,
                    gbps, 100 * gbps / copy_gbps);
      }
    }
  }
  return rows;
}

// The sample op alone at Moonlight/Kimi's vocabulary: greedy (one pass) and sampled
// (temperature 1, top-k 50 + top-p 0.9: radix-select cuts), logits uniform(-8, 8).
json bench_sample(ops::Backend& be, double copy_gbps) {
  json rows_out = json::array();
  const int64_t V = 163840;
  for (int64_t R : {1, 8, 32, 128, 256}) {
    auto logits = be.alloc(DType::F32, {R, V});
    be.fill_random(logits.t, 3, 8.0f);
    auto put = [&](DType dt, const void* src) {
      auto t = be.alloc(dt, {R});
      be.upload(t.t, src);
      return t;
    };
    for (bool greedy : {true, false}) {
      const auto n = static_cast<size_t>(R);
      const std::vector<float> temp(n, greedy ? 0.0f : 1.0f), top_p(n, greedy ? 1.0f : 0.9f), zeros(n, 0.0f),
          ones(n, 1.0f);
      const std::vector<int32_t> top_k(n, greedy ? 0 : 50);
      std::vector<uint64_t> seed(n), counter(n, 5);
      for (size_t r = 0; r < n; ++r) seed[r] = r * 7919;
      auto tt = put(DType::F32, temp.data()), tp = put(DType::F32, top_p.data()), tz = put(DType::F32, zeros.data()),
           to = put(DType::F32, ones.data()), tk = put(DType::I32, top_k.data()), ts = put(DType::I64, seed.data()),
           tc = put(DType::I64, counter.data());
      auto tok = be.alloc(DType::I32, {R}), lp = be.alloc(DType::F32, {R});
      auto top_ids = be.alloc(DType::I32, {R, 5}), top_lp = be.alloc(DType::F32, {R, 5});
      const ops::SampleParams p{logits.f32(),
                                0,
                                R,
                                V,
                                tt.f32(),
                                tk.t.as<int32_t>(),
                                tp.f32(),
                                tz.f32(),
                                to.f32(),
                                tz.f32(),
                                tz.f32(),
                                ts.t.as<uint64_t>(),
                                tc.t.as<uint64_t>(),
                                nullptr,
                                nullptr,
                                nullptr,
                                5,
                                tok.t.as<int32_t>(),
                                lp.f32(),
                                top_ids.t.as<int32_t>(),
                                top_lp.f32()};
      const double sec = seconds_per_call(be, 20, [&](int) { be.sample(p); });
      const double pass_gbps = static_cast<double>(R * V * 4) / sec / 1e9;  // one read of the logits
      rows_out.push_back({{"rows", R},
                          {"vocab", V},
                          {"mode", greedy ? "greedy_top5" : "top_k50_top_p0.9_top5"},
                          {"us", sec * 1e6},
                          {"one_pass_fraction_of_copy", pass_gbps / copy_gbps}});
      std::printf("sample  rows %3lld vocab %lld %-20s: %9.1f us  (one logits pass = %5.1f%% of copy bw)\n",
                  static_cast<long long>(R), static_cast<long long>(V), greedy ? "greedy" : "top-k 50, top-p 0.9",
                  sec * 1e6, 100 * pass_gbps / copy_gbps);
    }
  }
  return rows_out;
}

// A batch of B fresh sequences, each `len` tokens, laid out in consecutive pool blocks.
ForwardBatch make_batch(int64_t B, int64_t start, int64_t len, int64_t blocks_per_seq, int64_t bs, int64_t vocab,
                        bool all_logits) {
  ForwardBatch fb;
  fb.max_blocks = blocks_per_seq;
  fb.cu_q = {0};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < blocks_per_seq; ++i)
      fb.block_tables.push_back(static_cast<int32_t>(b * blocks_per_seq + i));
    for (int64_t i = 0; i < len; ++i) {
      const int64_t pos = start + i;
      if (all_logits || i == len - 1) fb.logit_rows.push_back(static_cast<int32_t>(fb.tokens.size()));
      fb.tokens.push_back(static_cast<int32_t>((b * 7919 + pos * 104729) % vocab));
      fb.positions.push_back(static_cast<int32_t>(pos));
      fb.slot_mapping.push_back(static_cast<int32_t>((b * blocks_per_seq + pos / bs) * bs + pos % bs));
    }
    fb.cu_q.push_back(static_cast<int32_t>(fb.tokens.size()));
    fb.kv_lens.push_back(static_cast<int32_t>(start + len));
  }
  return fb;
}

json bench_model(ops::Backend& be, const std::string& name, const ModelConfig& c, double copy_gbps, double gemm_tflops,
                 const std::vector<int64_t>& batches, bool quick, bool prefill_8k_first) {
  std::printf("== %s: random weights\n", name.c_str());
  auto model = std::make_unique<DeepseekV3Model>(c, random_weights(c, be, 7), be);
  json out = {{"model", name}, {"config", model_config_to_json(c)}};
  const int64_t bs = 64;
  auto run_prefills = [&] {
    json prefill = json::array();
    // {prompts, tokens each}: one 1k prompt, eight 1k prompts in one step (what a loaded server's
    // 8,192-token step budget takes from a queue of 1k prompts: every weight read once for 8k
    // tokens), one 8k prompt. Session 25's run (H200) put the 8k rows 7-11% below session 23's
    // with no change to prefill code in between: whether the batched row run just before them
    // costs them (power, clocks) or the machine was slower is not measured; --prefill-8k-first
    // runs the 8k prompt before the batched row, for that A/B.
    std::vector<std::pair<int64_t, int64_t>> shapes{{1, 1024}, {8, 1024}, {1, 8192}};
    if (prefill_8k_first) std::swap(shapes[1], shapes[2]);
    for (const auto& [P, T] : shapes) {
      if (quick && P * T > 1024) continue;
      const int64_t bps = (T + bs - 1) / bs;
      LatentKvPool pool = model->new_pool(P * bps, bs);
      ForwardBatch fb = make_batch(P, 0, T, bps, bs, c.vocab_size, false);
      model->forward(fb, pool);  // warm-up (allocator, cuBLASLt heuristics)
      const int reps = P * T > 2048 ? 2 : 4;
      const double t0 = now_s();
      for (int i = 0; i < reps; ++i) model->forward(fb, pool);
      const double sec = (now_s() - t0) / reps;
      const double tokens = static_cast<double>(P * T);
      const double tflops = static_cast<double>(P) * prefill_flops(c, T) / sec / 1e12;
      prefill.push_back({{"prompt", T},
                         {"prompts", P},
                         {"seconds", sec},
                         {"tok_s", tokens / sec},
                         {"tflops", tflops},
                         {"fraction_of_bf16_gemm", tflops / gemm_tflops}});
      std::printf(
          "prefill %lld x %5lld tokens: %8.1f ms  %8.0f tok/s  %6.1f TFLOP/s  %5.1f%% of bf16 GEMM (%s activations, "
          "%s experts)\n",
          static_cast<long long>(P), static_cast<long long>(T), sec * 1e3, tokens / sec, tflops,
          100 * tflops / gemm_tflops, dtype_name(be.activation_dtype()), dtype_name(be.expert_activation_dtype()));
    }
    return prefill;
  };
  const int64_t ctx = 128, steps = quick ? 4 : 12;
  auto run_decodes = [&](const std::vector<int64_t>& sizes) {
    json decode = json::array();
    for (int64_t B : sizes) {
      const int64_t bps = (ctx + steps + 2 + bs - 1) / bs;
      LatentKvPool pool = model->new_pool(B * bps, bs);
      model->forward(make_batch(B, 0, ctx, bps, bs, c.vocab_size, false), pool);
      // Steps leave their logits on the GPU (the engine samples there): timing is the forward alone,
      // op by op (eager) and replayed from a CUDA graph.
      auto time_steps = [&](int64_t first) {
        model->forward_logits(make_batch(B, first, 1, bps, bs, c.vocab_size, true), pool);  // warm-up / capture
        be.synchronize();
        const double t0 = now_s();
        for (int64_t s = 0; s < steps; ++s)
          model->forward_logits(make_batch(B, first + 1 + s, 1, bps, bs, c.vocab_size, true), pool);
        be.synchronize();
        return (now_s() - t0) / static_cast<double>(steps);
      };
      const double eager = time_steps(ctx);
      model->enable_decode_graphs(pool, B, bps);
      const double sec = time_steps(ctx);  // rewrites the same positions: same work, same bytes
      model->disable_decode_graphs();
      const double bytes = decode_bytes(c, B, ctx + 1 + steps / 2, static_cast<int64_t>(dtype_size(be.kv_dtype())));
      const double ceiling_step = bytes / (copy_gbps * 1e9);
      decode.push_back({{"batch", B},
                        {"step_ms", sec * 1e3},
                        {"step_ms_eager", eager * 1e3},
                        {"tok_s_per_stream", 1.0 / sec},
                        {"tok_s_aggregate", static_cast<double>(B) / sec},
                        {"bytes_per_step", bytes},
                        {"ceiling_tok_s_aggregate", static_cast<double>(B) / ceiling_step},
                        {"fraction_of_ceiling", ceiling_step / sec}});
      std::printf(
          "decode batch %3lld: %7.2f ms/step (eager %7.2f)  %7.1f tok/s/stream  %8.0f tok/s aggregate  ceiling %8.0f  "
          "(%4.1f%%, %s activations, %s experts)\n",
          static_cast<long long>(B), sec * 1e3, eager * 1e3, 1.0 / sec, B / sec, B / ceiling_step,
          100 * ceiling_step / sec, dtype_name(be.activation_dtype()), dtype_name(be.expert_activation_dtype()));
    }
    return decode;
  };
  out["prefill"] = run_prefills();
  out["decode"] = run_decodes(batches);
  // The same with bf16-rounded GEMM activations (--activation-dtype bf16): prefill, and the decode
  // batches that reach the grouped tensor-core experts (> 8 tokens).
  be.set_activation_dtype(DType::BF16);
  std::vector<int64_t> grouped;
  for (int64_t B : batches)
    if (B > 8) grouped.push_back(B);
  out["prefill_bf16_activations"] = run_prefills();
  out["decode_bf16_activations"] = run_decodes(grouped);
  // f32 activations with bf16-rounded experts, routed and shared (--expert-activation-dtype bf16).
  be.set_activation_dtype(DType::F32);
  be.set_expert_activation_dtype(DType::BF16);
  out["prefill_bf16_experts"] = run_prefills();
  out["decode_bf16_experts"] = run_decodes(grouped);
  be.set_activation_dtype(DType::F32);
  return out;
}

// The MoE op alone (ops::moe, routed + shared experts) at the Moonlight shape: hidden 2048, inter
// 1408, 64 experts, top-6, random distinct routing, two shared experts. Weight bytes = (experts
// the batch touches + the shared ones) x 3 x inter x hidden bf16 (the floor at small T); FLOPs =
// 2 x T x (k + 2) x 3 x inter x hidden useful (the grouped tensor-core path executes twice the
// routed part: f32 activations run as bf16 hi + lo parts).
json bench_moe_layer(ops::Backend& be, double copy_gbps, double gemm_tflops) {
  const int64_t H = 2048, I = 1408, E = 64, k = 6, S = 2 * I;  // S: Moonlight's two shared experts
  auto wgu = be.alloc(DType::BF16, {E, 2 * I, H}), wd = be.alloc(DType::BF16, {E, H, I});
  auto sgu = be.alloc(DType::BF16, {2 * S, H}), sd = be.alloc(DType::BF16, {H, S});
  be.fill_random(wgu.t, 11, 0.02f);
  be.fill_random(wd.t, 12, 0.02f);
  be.fill_random(sgu.t, 14, 0.02f);
  be.fill_random(sd.t, 15, 0.02f);
  json rows = json::array();
  uint64_t z = 88172645463325252ull;  // xorshift64 state
  for (DType act : {DType::F32, DType::BF16}) {
    be.set_activation_dtype(act);
    for (int64_t T : {1, 4, 8, 16, 32, 128, 256, 512, 1024, 2048, 4096, 8192}) {
      if (act == DType::BF16 && T <= 8) continue;  // decode GEMVs read f32 activations either way
      std::vector<int32_t> ids;
      std::vector<char> touched(static_cast<size_t>(E), 0);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < k;) {
          z ^= z << 13, z ^= z >> 7, z ^= z << 17;
          const auto e = static_cast<int32_t>(z % static_cast<uint64_t>(E));
          if (std::find(ids.end() - j, ids.end(), e) != ids.end()) continue;
          ids.push_back(e);
          touched[static_cast<size_t>(e)] = 1;
          ++j;
        }
      }
      std::vector<float> w(ids.size(), 1.0f / static_cast<float>(k));
      auto x = be.alloc(DType::F32, {T, H}), out = be.alloc(DType::F32, {T, H});
      auto ti = be.alloc(DType::I32, {T, k}), tw = be.alloc(DType::F32, {T, k});
      be.fill_random(x.t, 13, 1.0f);
      be.upload(ti.t, ids.data());
      be.upload(tw.t, w.data());
      ops::MoeParams p{x.f32(), ti.t.as<int32_t>(), tw.f32(), wgu.t.data, wd.t.data, DType::BF16, out.f32(), T, H, I, E,
                       k};
      p.w_shared_gate_up = sgu.t.data, p.w_shared_down = sd.t.data, p.shared_inter = S;
      const double sec = seconds_per_call(be, T >= 4096 ? 5 : 20, [&](int) { be.moe(p); });
      const double distinct = static_cast<double>(std::count(touched.begin(), touched.end(), 1));
      const double bytes = (distinct * 3.0 * static_cast<double>(I * H) + 3.0 * static_cast<double>(S * H)) * 2.0;
      const double flops = 2.0 * static_cast<double>(T) * 3.0 * static_cast<double>((k * I + S) * H);
      const double gbps = bytes / sec / 1e9, tflops = flops / sec / 1e12;
      rows.push_back({{"tokens", T},
                      {"activation_dtype", dtype_name(act)},
                      {"experts_touched", distinct},
                      {"us", sec * 1e6},
                      {"weight_bytes", bytes},
                      {"gbps", gbps},
                      {"fraction_of_copy_bw", gbps / copy_gbps},
                      {"tflops", tflops},
                      {"fraction_of_bf16_gemm", tflops / gemm_tflops}});
      std::printf(
          "moe layer (2048/1408, 64 experts top-6 + 2 shared) T %5lld: %9.1f us  %2.0f experts  %6.0f GB/s (%4.1f%% of "
          "copy)"
          "  %6.1f TFLOP/s (%4.1f%% of bf16 GEMM) %s activations\n",
          static_cast<long long>(T), sec * 1e6, distinct, gbps, 100 * gbps / copy_gbps, tflops,
          100 * tflops / gemm_tflops, dtype_name(act));
    }
  }
  be.set_activation_dtype(DType::F32);
  return rows;
}

// Expanded MLA prefill attention alone (qk 192 / v 128, one causal sequence of T tokens): causal
// FLOPs = 2 x heads x (192 + 128) x T^2 / 2, against the bf16 GEMM ceiling.
json bench_mla_prefill(ops::Backend& be, double gemm_tflops) {
  json rows = json::array();
  const int64_t nope = 128, rope = 64, qk = nope + rope, vd = 128, lora = 512;
  for (int64_t heads : {16, 128}) {
    for (int64_t T : {1024, 8192, 16384}) {
      // The model's layout: kv_b = kv_b_proj output (per head k_nope ‖ v), k_pe the last 64 columns
      // of the 576-wide gathered latent rows.
      auto q = be.alloc(DType::F32, {T, heads * qk}), kv_b = be.alloc(DType::F32, {T, heads * (nope + vd)});
      auto latent = be.alloc(DType::F32, {T, lora + rope}), out = be.alloc(DType::F32, {T, heads * vd});
      be.fill_random(q.t, 21, 0.5f);
      be.fill_random(kv_b.t, 22, 0.5f);
      be.fill_random(latent.t, 23, 0.5f);
      const std::vector<int32_t> cu = {0, static_cast<int32_t>(T)};
      auto tq = be.alloc(DType::I32, {2}), tk = be.alloc(DType::I32, {2});
      be.upload(tq.t, cu.data());
      be.upload(tk.t, cu.data());
      const ops::MlaExpandedParams p{.q = q.f32(),
                                     .kv_b = kv_b.f32(),
                                     .k_pe = latent.f32() + lora,
                                     .out = out.f32(),
                                     .seqs = {tq.t.as<int32_t>(), tk.t.as<int32_t>(), 1},
                                     .total_q = T,
                                     .total_kv = T,
                                     .num_heads = heads,
                                     .qk_dim = qk,
                                     .v_dim = vd,
                                     .nope_dim = nope,
                                     .scale = 0.07f,
                                     .q_stride = 0,
                                     .kv_b_stride = 0,
                                     .k_pe_stride = lora + rope};
      const double sec = seconds_per_call(be, T >= 8192 ? 5 : 20, [&](int) { be.mla_expanded(p); });
      const double flops = 2.0 * static_cast<double>(heads * (qk + vd)) * static_cast<double>(T) * T / 2.0;
      const double tflops = flops / sec / 1e12;
      rows.push_back({{"heads", heads},
                      {"tokens", T},
                      {"ms", sec * 1e3},
                      {"tflops", tflops},
                      {"fraction_of_bf16_gemm", tflops / gemm_tflops}});
      std::printf(
          "mla prefill attention (qk 192 / v 128) %3lld heads T %5lld: %8.2f ms  %6.1f TFLOP/s (%4.1f%% of bf16 "
          "GEMM)\n",
          static_cast<long long>(heads), static_cast<long long>(T), sec * 1e3, tflops, 100 * tflops / gemm_tflops);
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln GPU benchmarks"};
  std::string out_path = "gpu_bench.json";
  bool quick = false, skip_model = false, models_only = false, prefill_8k_first = false;
  app.add_option("--out", out_path, "JSON report");
  app.add_flag("--quick", quick, "fewer shapes and steps");
  app.add_flag("--skip-model", skip_model, "kernels and ceilings only");
  app.add_flag("--models-only", models_only, "ceilings and the whole models only");
  app.add_flag("--prefill-8k-first", prefill_8k_first, "prefill the 8k prompt before the eight 1k prompts");
  CLI11_PARSE(app, argc, argv);
  try {
    auto be = ops::make_cuda_backend();
    json report = {{"device", be->name()}};
    const double copy = bench::measure_copy_gbps(4.0);
    const double gemm = bench::measure_bf16_gemm_tflops(8192, 8192, 8192);
    std::printf("device %s\nceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", be->name().c_str(), copy, gemm);
    report["ceilings"] = {{"copy_gbps", copy}, {"bf16_gemm_tflops", gemm}};
    if (!models_only) {
      report["mla_decode_kernel"] = bench_mla_kernel(*be, copy, quick);
      report["moe_layer"] = bench_moe_layer(*be, copy, gemm);
      report["mla_prefill_kernel"] = bench_mla_prefill(*be, gemm);
      report["sample_kernel"] = bench_sample(*be, copy);
    }
    if (!skip_model) {
      ModelConfig moon = parse_model_config(json::parse(kMoonlight), "moonlight-16b-a3b");
      report["models"].push_back(
          bench_model(*be, "moonlight-16b-a3b", moon, copy, gemm, {1, 8, 32, 128, 256}, quick, prefill_8k_first));
      ModelConfig v129 = moon;
      v129.vocab_size = 129280;
      report["models"].push_back(
          bench_model(*be, "moonlight-16b-a3b-vocab129280", v129, copy, gemm, {1, 128}, quick, prefill_8k_first));
    }
    std::ofstream(out_path) << report.dump(2);
    std::printf("wrote %s\n", out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-gpu-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

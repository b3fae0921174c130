// kiln-gpu-bench: GPU figures beside the ceilings measured in the same run (DESIGN.md §10).
//   1. ceilings: HBM copy bandwidth, bf16 GEMM rate
//   2. MLA decode kernel alone (absorbed, paged) at 1k-32k contexts
//   3. whole model with random weights (Moonlight-16B-A3B shape and its 129,280-vocab variant):
//      prefill tok/s at 1k and 8k, decode tok/s at batch 1..256, each against its ceiling
// Writes a JSON report (--out) and prints a table. Figures, not tests: nothing here asserts.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>

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

json bench_mla_kernel(ops::Backend& be, double copy_gbps) {
  json rows = json::array();
  const int64_t kLora = 512, kRope = 64, row = kLora + kRope, bs = 64;
  for (int64_t heads : {16, 128, 12}) {
    for (int64_t ctx : {1024, 8192, 32768}) {
      for (int64_t B : {1, 8, 32}) {
        const int64_t blocks_per = (ctx + bs - 1) / bs, blocks = B * blocks_per;
        auto pool = be.alloc(DType::F32, {blocks * bs, row});
        be.fill_random(pool.t, 1, 1.0f);
        auto q = be.alloc(DType::F32, {B, heads * row});
        be.fill_random(q.t, 2, 0.1f);
        auto out = be.alloc(DType::F32, {B, heads * kLora});
        std::vector<int32_t> table(static_cast<size_t>(blocks)),
            lens(static_cast<size_t>(B), static_cast<int32_t>(ctx)), cu;
        for (int64_t i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
        for (int64_t b = 0; b <= B; ++b) cu.push_back(static_cast<int32_t>(b));
        auto tt = be.alloc(DType::I32, {blocks}), tl = be.alloc(DType::I32, {B}), tc = be.alloc(DType::I32, {B + 1});
        be.upload(tt.t, table.data());
        be.upload(tl.t, lens.data());
        be.upload(tc.t, cu.data());
        ops::MlaAbsorbedParams p{q.f32(),
                                 {pool.f32(), tt.t.as<int32_t>(), tl.t.as<int32_t>(), bs, blocks_per},
                                 tc.t.as<int32_t>(),
                                 B,
                                 B,
                                 out.f32(),
                                 heads,
                                 kLora,
                                 kRope,
                                 0.07f};
        be.mla_absorbed(p);
        be.synchronize();
        const int reps = 20;
        const double t0 = now_s();
        for (int i = 0; i < reps; ++i) be.mla_absorbed(p);
        be.synchronize();
        const double sec = (now_s() - t0) / reps;
        const double bytes = static_cast<double>(B * ctx * row * 4 + B * heads * (row + kLora) * 4);
        const double gbps = bytes / sec / 1e9;
        rows.push_back({{"heads", heads},
                        {"context", ctx},
                        {"batch", B},
                        {"us", sec * 1e6},
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
                 const std::vector<int64_t>& batches, bool quick) {
  std::printf("== %s: random weights\n", name.c_str());
  auto model = std::make_unique<DeepseekV3Model>(c, random_weights(c, be, 7), be);
  json out = {{"model", name}, {"config", model_config_to_json(c)}};
  const int64_t bs = 64;
  json prefill = json::array();
  for (int64_t T : {1024, 8192}) {
    if (quick && T > 1024) break;
    const int64_t bps = (T + bs - 1) / bs;
    LatentKvPool pool = model->new_pool(bps, bs);
    ForwardBatch fb = make_batch(1, 0, T, bps, bs, c.vocab_size, false);
    model->forward(fb, pool);  // warm-up (allocator, cuBLASLt heuristics)
    const int reps = T > 2048 ? 2 : 4;
    const double t0 = now_s();
    for (int i = 0; i < reps; ++i) model->forward(fb, pool);
    const double sec = (now_s() - t0) / reps;
    const double tflops = prefill_flops(c, T) / sec / 1e12;
    prefill.push_back({{"prompt", T},
                       {"seconds", sec},
                       {"tok_s", T / sec},
                       {"tflops", tflops},
                       {"fraction_of_bf16_gemm", tflops / gemm_tflops}});
    std::printf("prefill %5lld tokens: %8.1f ms  %8.0f tok/s  %6.1f TFLOP/s  %5.1f%% of bf16 GEMM\n",
                static_cast<long long>(T), sec * 1e3, T / sec, tflops, 100 * tflops / gemm_tflops);
  }
  out["prefill"] = prefill;
  json decode = json::array();
  const int64_t ctx = 128, steps = quick ? 4 : 12;
  for (int64_t B : batches) {
    const int64_t bps = (ctx + steps + 2 + bs - 1) / bs;
    LatentKvPool pool = model->new_pool(B * bps, bs);
    model->forward(make_batch(B, 0, ctx, bps, bs, c.vocab_size, false), pool);
    model->forward(make_batch(B, ctx, 1, bps, bs, c.vocab_size, true), pool);  // warm-up step
    be.synchronize();
    const double t0 = now_s();
    for (int64_t s = 0; s < steps; ++s)
      model->forward(make_batch(B, ctx + 1 + s, 1, bps, bs, c.vocab_size, true), pool);
    const double sec = (now_s() - t0) / static_cast<double>(steps);
    const double bytes = decode_bytes(c, B, ctx + 1 + steps / 2, 4);
    const double ceiling_step = bytes / (copy_gbps * 1e9);
    decode.push_back({{"batch", B},
                      {"step_ms", sec * 1e3},
                      {"tok_s_per_stream", 1.0 / sec},
                      {"tok_s_aggregate", static_cast<double>(B) / sec},
                      {"bytes_per_step", bytes},
                      {"ceiling_tok_s_aggregate", static_cast<double>(B) / ceiling_step},
                      {"fraction_of_ceiling", ceiling_step / sec}});
    std::printf(
        "decode batch %3lld: %7.2f ms/step  %7.1f tok/s/stream  %8.0f tok/s aggregate  ceiling %8.0f  (%4.1f%%)\n",
        static_cast<long long>(B), sec * 1e3, 1.0 / sec, B / sec, B / ceiling_step, 100 * ceiling_step / sec);
  }
  out["decode"] = decode;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln GPU benchmarks"};
  std::string out_path = "gpu_bench.json";
  bool quick = false, skip_model = false;
  app.add_option("--out", out_path, "JSON report");
  app.add_flag("--quick", quick, "fewer shapes and steps");
  app.add_flag("--skip-model", skip_model, "kernels and ceilings only");
  CLI11_PARSE(app, argc, argv);
  try {
    auto be = ops::make_cuda_backend();
    json report = {{"device", be->name()}};
    const double copy = bench::measure_copy_gbps(4.0);
    const double gemm = bench::measure_bf16_gemm_tflops(8192, 8192, 8192);
    std::printf("device %s\nceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", be->name().c_str(), copy, gemm);
    report["ceilings"] = {{"copy_gbps", copy}, {"bf16_gemm_tflops", gemm}};
    report["mla_decode_kernel"] = bench_mla_kernel(*be, copy);
    if (!skip_model) {
      ModelConfig moon = parse_model_config(json::parse(kMoonlight), "moonlight-16b-a3b");
      report["models"].push_back(bench_model(*be, "moonlight-16b-a3b", moon, copy, gemm, {1, 8, 32, 128, 256}, quick));
      ModelConfig v129 = moon;
      v129.vocab_size = 129280;
      report["models"].push_back(bench_model(*be, "moonlight-16b-a3b-vocab129280", v129, copy, gemm, {1, 128}, quick));
    }
    std::ofstream(out_path) << report.dump(2);
    std::printf("wrote %s\n", out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-gpu-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

// `kiln bench model (--model DIR | --config FILE.json --random-weights) [--batch-sizes 1,8,32]
// [--prompt-len N] [--decode-steps N] [--json FILE]`: offline throughput of the engine itself
// (no HTTP): for each batch size, B random prompts go in together, prefill, then decode in
// lockstep. Prefill tok/s counts the steps that held prompt tokens; decode tok/s the pure decode
// steps (per stream: one token per step; aggregate: B per step).
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/speculative.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "kv/kv_sizing.h"
#include "model/weights.h"

namespace kiln::cli {
namespace {

struct BenchModelArgs {
  std::string model, config, device = "cpu", batch_sizes = "1,8,32", json_out, kv_cache_memory;
  Precision precision;
  Parallel parallel;
  bool random = false, warmup = true, enforce_eager = false;
  bool no_overlap = false;
  SpeculativeFlags speculative;
  int64_t prompt_len = 128, decode_steps = 32, block_size = 64, max_batched_tokens = 8192, prefill_chunk = 0;
  uint64_t seed = 0;
  std::string weight_dtype = "auto";
};

struct Row {
  int64_t batch = 0;
  double prefill_tps = 0, decode_tps_stream = 0, decode_tps = 0, step_ms = 0, wall_s = 0;
  int64_t prefill_tokens = 0, decode_steps = 0;
  SpecDecodeStats spec;  // this batch's speculation (verifies 0 without it)
};

// b - a, counter by counter.
SpecDecodeStats spec_delta(const SpecDecodeStats& b, const SpecDecodeStats& a) {
  SpecDecodeStats d = b;
  d.verifies -= a.verifies, d.draft_tokens -= a.draft_tokens, d.accepted_tokens -= a.accepted_tokens;
  for (size_t i = 0; i < a.proposed_at.size() && i < d.proposed_at.size(); ++i)
    d.proposed_at[i] -= a.proposed_at[i], d.accepted_at[i] -= a.accepted_at[i];
  d.draft_seconds -= a.draft_seconds, d.verify_seconds -= a.verify_seconds;
  d.policy.speculate_steps -= a.policy.speculate_steps, d.policy.plain_steps -= a.policy.plain_steps;
  d.policy.probe_speculate -= a.policy.probe_speculate, d.policy.probe_plain -= a.policy.probe_plain;
  d.policy.switches -= a.policy.switches;
  return d;
}

Row run_batch(Engine& engine, int64_t B, const BenchModelArgs& a, int64_t vocab, std::mt19937_64& rng) {
  const EngineStats before = engine.stats();
  std::vector<RequestStream> streams;
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < B; ++b) {
    Request r;
    for (int64_t i = 0; i < a.prompt_len; ++i) r.prompt.push_back(tok(rng));
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = a.decode_steps;
    streams.push_back(engine.submit(std::move(r)));
  }
  for (auto& s : streams) {
    while (auto c = s.next()) KILN_CHECK(c->error.empty(), "request failed: {}", c->error);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats after = engine.stats();
  Row r;
  r.batch = B;
  r.wall_s = wall;
  r.prefill_tokens = after.prefill_tokens - before.prefill_tokens;
  const double ps = after.prefill_seconds - before.prefill_seconds;
  const double ds = after.decode_seconds - before.decode_seconds;
  r.decode_steps = after.decode_steps - before.decode_steps;
  const int64_t dt = after.decode_tokens - before.decode_tokens;
  if (ps > 0) r.prefill_tps = static_cast<double>(r.prefill_tokens) / ps;
  r.spec = spec_delta(after.spec, before.spec);
  if (ds > 0 && r.decode_steps > 0) {
    r.decode_tps_stream = static_cast<double>(r.decode_steps) / ds;
    r.decode_tps = static_cast<double>(dt) / ds;
    r.step_ms = 1e3 * ds / static_cast<double>(r.decode_steps);
    if (r.spec.verifies > 0) {  // a decode step emits several tokens per stream: count the output
      const auto out = static_cast<double>(after.generated_tokens - before.generated_tokens - B);  // less the prefill's
      r.decode_tps = out / ds;
      r.decode_tps_stream = r.decode_tps / static_cast<double>(B);
    }
  }
  return r;
}

int run_bench_model(const BenchModelArgs& a) {
  KILN_CHECK(!a.model.empty() || !a.config.empty(), "bench model needs --model DIR or --config FILE --random-weights");
  KILN_CHECK(a.config.empty() || a.random, "--config needs --random-weights (a config alone has no weights)");
  KILN_CHECK(a.prompt_len > 0 && a.decode_steps > 0, "--prompt-len and --decode-steps must be > 0");
  // Past a model's context anyway; bounded here so that the prompts are not built first.
  KILN_CHECK(a.prompt_len <= (int64_t{1} << 24) && a.decode_steps <= (int64_t{1} << 24),
             "--prompt-len and --decode-steps must be at most 16777216");
  KILN_CHECK(a.block_size > 0, "--block-size must be > 0, got {}", a.block_size);
  const std::vector<int64_t> batches = parse_counts(a.batch_sizes, "--batch-sizes");
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  if (!a.json_out.empty()) require_output_file(a.json_out, "--json", {a.config});

  check_speculative_flags(a.speculative);
  // --weight-dtype picks the random weights' format; --quantization fp8 quantizes either kind at load.
  WeightQuant quant = parse_quantization(a.precision.quantization);
  KILN_CHECK(a.weight_dtype == "auto" || a.random,
             "--weight-dtype needs --random-weights (a checkpoint's weights are "
             "as it ships them, or --quantization fp8)");
  if (a.weight_dtype != "auto") {
    KILN_CHECK(a.weight_dtype == "bf16" || a.weight_dtype == "fp8" || a.weight_dtype == "int4",
               "--weight-dtype must be auto, bf16, fp8 or int4, got \"{}\"", a.weight_dtype);
    const WeightQuant w = parse_weight_quant(a.weight_dtype, "--weight-dtype");
    KILN_CHECK(quant == WeightQuant::None || w == quant, "--weight-dtype {} and --quantization {} disagree",
               a.weight_dtype, a.precision.quantization);
    quant = w;
  }
  LoadedModel loaded;
  std::string source;
  if (a.random) {
    source = a.config.empty() ? (std::filesystem::path(a.model) / "config.json").string() : a.config;
    spdlog::info("random weights for {} (seed {}, {})", source, a.seed, a.weight_dtype);
    loaded = random_model(load_model_config(source), a.device, a.seed, a.parallel, quant);
    apply_precision(a.precision, *loaded.backend, *loaded.model);
  } else {
    source = a.model;
    loaded = load_model(a.model, a.device, a.precision, "auto", a.parallel);  // applies the precision
  }
  std::unique_ptr<ops::Backend> backend = std::move(loaded.backend);  // declared first: outlives the model
  std::unique_ptr<DeepseekV3Model> model = std::move(loaded.model);
  const ModelConfig& c = model->config();

  EngineConfig cfg;
  cfg.block_size = a.block_size;
  cfg.prefix_caching = false;  // random prompts share nothing; keep the cache out of the numbers
  cfg.cuda_graphs = !a.enforce_eager;
  cfg.overlap_schedule = !a.no_overlap;
  cfg.scheduler.max_num_seqs = max_batch;
  cfg.scheduler.max_batched_tokens = a.max_batched_tokens;
  cfg.scheduler.max_prefill_chunk = a.prefill_chunk;
  if (!a.kv_cache_memory.empty())
    cfg.kv.memory_bytes = kv::parse_memory_size(a.kv_cache_memory, "--kv-cache-memory");
  else  // exactly what the largest batch needs: no preemption, no waste
    cfg.kv.num_blocks = max_batch * kv::blocks_for(a.prompt_len + a.decode_steps, a.block_size);
  cfg.spec_policy = spec_policy_config(a.speculative);
  cfg.speculator = make_speculator(a.speculative, a.model, *model);
  Engine engine(*model, cfg);

  std::mt19937_64 rng(a.seed);
  std::vector<Row> rows;
  for (int64_t B : batches) {
    if (a.warmup) {
      // A short run of the same shape: first-use costs (graph capture, algorithm searches, scratch
      // growth, side streams) stay out of the figures. Full-length prompts, so the measured
      // prefill is a warm one too (other random tokens: no prefix-cache hits).
      BenchModelArgs w = a;
      w.decode_steps = std::min<int64_t>(a.decode_steps, 3);
      run_batch(engine, B, w, c.vocab_size, rng);
    }
    spdlog::info("batch {}: {} prompts of {} tokens, {} decode steps", B, B, a.prompt_len, a.decode_steps);
    rows.push_back(run_batch(engine, B, a, c.vocab_size, rng));
  }
  if (engine.stats().preemptions > 0)
    spdlog::warn("{} preemptions: the KV cache was too small for the largest batch", engine.stats().preemptions);

  std::printf("kiln bench model: %s on %s, prompt %lld tokens, %lld decode steps\n", source.c_str(),
              backend->name().c_str(), static_cast<long long>(a.prompt_len), static_cast<long long>(a.decode_steps));
  std::printf("%6s  %14s  %18s  %18s  %12s\n", "batch", "prefill tok/s", "decode tok/s/strm", "decode tok/s total",
              "decode ms/step");
  for (const Row& r : rows)
    std::printf("%6lld  %14.1f  %18.2f  %18.1f  %12.2f\n", static_cast<long long>(r.batch), r.prefill_tps,
                r.decode_tps_stream, r.decode_tps, r.step_ms);
  if (cfg.speculator) {
    std::printf("speculative decoding (%s, K %lld, %s policy): decode tok/s counts every token a step emits\n",
                cfg.speculator->name(), static_cast<long long>(a.speculative.num_tokens), a.speculative.policy.c_str());
    std::printf("%6s  %10s  %10s  %10s  %10s  %11s  %s\n", "batch", "accepted", "mean len", "draft s", "verify s",
                "spec/plain", "acceptance per draft position");
    for (const Row& r : rows) {
      std::string per;
      for (size_t i = 0; i < r.spec.proposed_at.size(); ++i)
        per += fmt::format("{}{:.3f}", i ? " " : "",
                           r.spec.proposed_at[i]
                               ? static_cast<double>(r.spec.accepted_at[i]) / static_cast<double>(r.spec.proposed_at[i])
                               : 0.0);
      const std::string steps = fmt::format("{}/{}", r.spec.policy.speculate_steps, r.spec.policy.plain_steps);
      std::printf("%6lld  %10.3f  %10.3f  %10.3f  %10.3f  %11s  %s\n", static_cast<long long>(r.batch),
                  r.spec.acceptance_rate(), r.spec.mean_accepted_length(), r.spec.draft_seconds, r.spec.verify_seconds,
                  steps.c_str(), per.c_str());
    }
  }

  if (!a.json_out.empty()) {
    nlohmann::json j = {{"model", source},
                        {"random_weights", a.random},
                        {"tp", a.parallel.tp},
                        {"expert_parallel", a.parallel.expert_parallel},
                        {"weight_dtype", a.weight_dtype},
                        {"quantization", a.precision.quantization},
                        {"device", backend->name()},
                        {"kv_cache_dtype", dtype_name(model->kv_dtype())},
                        {"activation_dtype", dtype_name(backend->activation_dtype())},
                        {"expert_activation_dtype", dtype_name(backend->expert_activation_dtype())},
                        {"prompt_len", a.prompt_len},
                        {"decode_steps", a.decode_steps},
                        {"block_size", a.block_size},
                        {"max_batched_tokens", a.max_batched_tokens},
                        {"results", nlohmann::json::array()}};
    for (const Row& r : rows)
      j["results"].push_back({{"batch_size", r.batch},
                              {"prefill_tokens_per_s", r.prefill_tps},
                              {"decode_tokens_per_s_per_stream", r.decode_tps_stream},
                              {"decode_tokens_per_s", r.decode_tps},
                              {"decode_ms_per_step", r.step_ms},
                              {"prefill_tokens", r.prefill_tokens},
                              {"decode_steps", r.decode_steps},
                              {"wall_seconds", r.wall_s}});
    if (cfg.speculator) {
      j["speculative"] = {{"algorithm", a.speculative.algorithm},
                          {"model", a.speculative.model},
                          {"num_tokens", a.speculative.num_tokens},
                          {"policy", a.speculative.policy}};
      for (size_t i = 0; i < rows.size(); ++i) {
        const SpecDecodeStats& sd = rows[i].spec;
        j["results"][i]["speculative"] = {{"verifies", sd.verifies},
                                          {"draft_tokens", sd.draft_tokens},
                                          {"accepted_tokens", sd.accepted_tokens},
                                          {"acceptance_rate", sd.acceptance_rate()},
                                          {"mean_accepted_length", sd.mean_accepted_length()},
                                          {"proposed_at", sd.proposed_at},
                                          {"accepted_at", sd.accepted_at},
                                          {"draft_seconds", sd.draft_seconds},
                                          {"verify_seconds", sd.verify_seconds},
                                          {"policy_speculate_steps", sd.policy.speculate_steps},
                                          {"policy_plain_steps", sd.policy.plain_steps},
                                          {"policy_probe_steps", sd.policy.probe_speculate + sd.policy.probe_plain}};
      }
    }
    std::ofstream f(a.json_out);
    f << j.dump(2) << "\n";
    KILN_CHECK(f.good(), "--json {}: cannot write the file", a.json_out);
  }
  return 0;
}

KILN_SUBCOMMAND("bench", "model", "Offline engine throughput of a model (prefill and decode tok/s)", [](CLI::App& sub) {
  auto a = std::make_shared<BenchModelArgs>();
  sub.add_option("--model", a->model, "checkpoint directory");
  sub.add_option("--config", a->config, "config.json (with --random-weights)");
  sub.add_flag("--random-weights", a->random, "random weights of the config's shapes instead of a checkpoint");
  sub.add_option("--weight-dtype", a->weight_dtype,
                 "random weights' format: auto (the backend's plain dtype), bf16, fp8 (e4m3 + 128x128 block scales, "
                 "every projection but lm_head, as DeepSeek-V3 ships) or int4 (routed experts int4 + bf16 scale per "
                 "32 inputs, the rest plain, as Kimi K2-Thinking ships)")
      ->capture_default_str();
  sub.add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  sub.add_option("--batch-sizes", a->batch_sizes, "comma-separated batch sizes")->capture_default_str();
  sub.add_option("--prompt-len", a->prompt_len, "prompt tokens per request")->capture_default_str();
  sub.add_option("--decode-steps", a->decode_steps, "tokens generated per request")->capture_default_str();
  sub.add_option("--max-batched-tokens", a->max_batched_tokens, "token budget per step")->capture_default_str();
  sub.add_option("--prefill-chunk", a->prefill_chunk, "prompt tokens of one request per step (0: the budget)");
  sub.add_option("--block-size", a->block_size, "tokens per KV block")->capture_default_str();
  sub.add_option("--kv-cache-memory", a->kv_cache_memory, "KV cache size (default: what the largest batch needs)");
  sub.add_option("--seed", a->seed, "seed of the prompts and random weights")->capture_default_str();
  sub.add_flag("!--no-warmup", a->warmup, "skip the warm-up run before each batch size");
  sub.add_flag("--enforce-eager", a->enforce_eager, "run decode steps op by op (no CUDA graphs)");
  sub.add_flag("--disable-overlap-schedule", a->no_overlap,
               "read each step's tokens before scheduling the next (default: the next step is queued first)");
  add_speculative_options(sub, a->speculative);
  add_precision_options(sub, a->precision);
  add_parallel_options(sub, a->parallel);
  sub.add_option("--json", a->json_out, "also write the results as JSON to this file");
  return [a] { return run_bench_model(*a); };
});

}  // namespace
}  // namespace kiln::cli

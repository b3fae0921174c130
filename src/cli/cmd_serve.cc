// `kiln serve --model DIR [--host 127.0.0.1] [--port 8000] [--device cpu|cuda] [--api-key KEY] ...`:
// the OpenAI-compatible server (src/server/, docs/serving.md).
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/speculative.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "kv/kv_sizing.h"
#include "server/server.h"
#include "server/tool_format.h"

namespace kiln::cli {
namespace {

struct ServeArgs {
  std::string model, tokenizer, load_format = "auto", device = "auto", served_name, kv_cache_memory,
                                tool_parser = "auto", reasoning = "auto";
  Precision precision;
  server::ServerConfig cfg;
  Parallel parallel;
  int64_t max_num_seqs = 256, max_batched_tokens = 8192, max_model_len = 0, num_kv_blocks = 0, block_size = 64;
  double kv_fraction = 0.9;
  bool no_prefix_caching = false;
  bool enforce_eager = false;
  bool no_overlap = false;
  SpeculativeFlags speculative;
};

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int s = sig;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &s, sizeof s);
}

// Each streaming connection is a socket: lift the soft descriptor limit to the hard one.
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

int run_serve(ServeArgs a) {
  KILN_CHECK(a.cfg.port >= 0 && a.cfg.port < 65536, "--port must be in [0, 65535], got {}", a.cfg.port);
  KILN_CHECK(a.num_kv_blocks >= 0, "--num-kv-blocks must be >= 0 (0: sized from memory), got {}", a.num_kv_blocks);
  // A size_t flag reads "-1" as 2^64 - 1: no limit at all.
  KILN_CHECK(a.cfg.max_body_bytes >= 1024 && a.cfg.max_body_bytes <= (size_t{1} << 32),
             "--max-body-bytes must be 1 KiB to 4 GiB, got {}", a.cfg.max_body_bytes);
  KILN_CHECK(a.cfg.threads >= 2 && a.cfg.threads <= 65536, "--http-threads must be 2 to 65536, got {}", a.cfg.threads);
  if (a.cfg.api_key.empty())
    if (const char* k = std::getenv("KILN_API_KEY")) a.cfg.api_key = k;
  // SIGTERM / SIGINT: the handler only writes to a pipe (async-signal-safe) and a thread waiting
  // on it drains the server. A handler rather than a blocked mask, because threads started before
  // this point (OpenMP, BLAS) would otherwise take the signal's default action and kill us.
  // SIGPIPE from a vanished client must not kill the process either.
  KILN_CHECK(pipe(g_signal_pipe) == 0, "pipe() failed");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  raise_fd_limit();

  const std::string& tokenizer_dir = a.tokenizer.empty() ? a.model : a.tokenizer;
  tok::Tokenizer tokenizer = tok::Tokenizer::load(tokenizer_dir);
  std::optional<tok::ChatTemplate> tmpl;
  try {
    tmpl = tok::ChatTemplate::load(tokenizer_dir);
  } catch (const Error& e) {
    spdlog::warn("no chat template ({}); /v1/chat/completions will answer 400", e.what());
  }
  auto has = [&](std::string_view t) { return tokenizer.token_to_id(std::string(t)).has_value(); };
  nlohmann::json model_config;  // null when unreadable: load_model() below says why
  if (std::ifstream in(std::filesystem::path(a.model) / "config.json"); in)
    model_config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const server::ToolFormatChoice tools = server::choose_tool_format(a.tool_parser, model_config, has);
  a.cfg.tool_format = tools.format;
  spdlog::info("tool calls: {} ({})", server::tool_format_name(tools.format), tools.reason);
  KILN_CHECK(a.reasoning == "auto" || a.reasoning == "on" || a.reasoning == "off",
             "--reasoning-parser must be auto, on or off, got '{}'", a.reasoning);
  a.cfg.reasoning = a.reasoning == "on" || (a.reasoning == "auto" && has("</think>"));

  check_speculative_flags(a.speculative);
  LoadedModel m = load_model(a.model, a.device, a.precision, a.load_format, a.parallel);
  if (static_cast<int64_t>(tokenizer.vocab_size()) > m.model->config().vocab_size)  // such prompts get a 400
    spdlog::warn("the tokenizer in {} has {} tokens, more than the model's vocabulary of {}", tokenizer_dir,
                 tokenizer.vocab_size(), m.model->config().vocab_size);
  EngineConfig ec;
  ec.block_size = a.block_size;
  ec.scheduler.max_num_seqs = a.max_num_seqs;
  ec.scheduler.max_batched_tokens = a.max_batched_tokens;
  ec.max_model_len = a.max_model_len;
  ec.prefix_caching = !a.no_prefix_caching;
  ec.cuda_graphs = !a.enforce_eager;
  ec.overlap_schedule = !a.no_overlap;
  if (a.num_kv_blocks > 0)
    ec.kv.num_blocks = a.num_kv_blocks;
  else if (!a.kv_cache_memory.empty())
    ec.kv.memory_bytes = kv::parse_memory_size(a.kv_cache_memory, "--kv-cache-memory");
  else if (m.backend->device() == Device::CPU)  // host memory is shared with everything else: a modest default
    ec.kv.memory_bytes = int64_t{256} << 20;
  else
    ec.kv.memory_fraction = a.kv_fraction;
  ec.spec_policy = spec_policy_config(a.speculative);
  ec.speculator = make_speculator(a.speculative, a.model, *m.model);
  Engine engine(*m.model, ec);

  if (a.served_name.empty()) a.served_name = std::filesystem::path(a.model).filename().string();
  if (a.served_name.empty()) a.served_name = std::filesystem::path(a.model).parent_path().filename().string();
  a.cfg.model_name = a.served_name;
  a.cfg.model_aliases = {a.model};
  server::Server srv(engine, tokenizer, std::move(tmpl), a.cfg);
  srv.metrics().set_kernel_plan(with_speculation(m.backend->kernel_plan(), ec.speculator.get()));
  KILN_CHECK(srv.bind(), "cannot listen on {}:{} (in use, or not an address of this machine)", a.cfg.host, a.cfg.port);
  std::thread signals([&] {
    int sig = 0;
    while (read(g_signal_pipe[0], &sig, sizeof sig) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // run() ended by itself
    spdlog::info("signal {}: draining (up to {}s), then exiting", sig, a.cfg.shutdown_timeout_s);
    srv.shutdown();
  });
  spdlog::info("serving '{}' on http://{}:{} ({}, tool calls: {}, reasoning: {}, auth: {})", a.served_name, a.cfg.host,
               srv.port(), m.backend->name(), server::tool_format_name(a.cfg.tool_format),
               a.cfg.reasoning ? "on" : "off", a.cfg.api_key.empty() ? "off" : "on");
  std::fflush(stdout);
  srv.run();
  // run() returns after shutdown() (signal thread) or on a listener failure: wake the signal
  // thread in the second case so it can be joined.
  const int zero = 0;
  if (write(g_signal_pipe[1], &zero, sizeof zero) < 0) spdlog::warn("cannot wake the signal thread");
  signals.join();
  spdlog::info("stopped");
  return 0;
}

KILN_COMMAND("serve", "OpenAI-compatible HTTP server (see docs/serving.md)", [](CLI::App& sub) {
  auto a = std::make_shared<ServeArgs>();
  server::ServerConfig& c = a->cfg;
  sub.add_option("--model", a->model, "checkpoint directory")->required();
  sub.add_option("--host", c.host, "address to bind (0.0.0.0 to expose)")->capture_default_str();
  sub.add_option("--port", c.port, "port (0: any free port)")->capture_default_str();
  sub.add_option("--tokenizer", a->tokenizer, "tokenizer and chat template directory (default: --model)");
  sub.add_option("--load-format", a->load_format,
                 "auto (the checkpoint) or dummy (random weights of config.json's shapes, for benchmarks)")
      ->capture_default_str();
  sub.add_option("--device", a->device, "cpu, cuda, or auto (cuda when a GPU is present)")->capture_default_str();
  add_precision_options(sub, a->precision);
  add_parallel_options(sub, a->parallel);
  sub.add_option("--api-key", c.api_key, "require 'Authorization: Bearer KEY' (or set KILN_API_KEY)");
  sub.add_option("--served-model-name", a->served_name, "model id clients use (default: the directory name)");
  sub.add_option("--max-model-len", a->max_model_len, "longest sequence (default: the model's)");
  sub.add_option("--max-num-seqs", a->max_num_seqs, "sequences run at once")->capture_default_str();
  sub.add_option("--max-num-batched-tokens", a->max_batched_tokens, "tokens per engine step")->capture_default_str();
  sub.add_option("--block-size", a->block_size, "tokens per KV block")->capture_default_str();
  sub.add_option("--kv-cache-memory", a->kv_cache_memory, "KV cache size, e.g. 4GiB (CPU default: 256MiB)");
  sub.add_option("--num-kv-blocks", a->num_kv_blocks, "KV cache size in blocks (wins over --kv-cache-memory)");
  sub.add_option("--gpu-memory-utilization", a->kv_fraction, "KV share of free GPU memory")->capture_default_str();
  sub.add_flag("--no-prefix-caching", a->no_prefix_caching, "disable the radix prefix cache");
  sub.add_flag("--enforce-eager", a->enforce_eager, "run decode steps op by op (no CUDA graphs)");
  sub.add_flag("--disable-overlap-schedule", a->no_overlap,
               "read each step's tokens before scheduling the next (default: the next step is queued first)");
  add_speculative_options(sub, a->speculative);
  sub.add_option("--max-pending-requests", c.max_pending_requests, "requests in flight; more get 503")
      ->capture_default_str();
  sub.add_option("--http-threads", c.threads, "HTTP I/O threads, shared by every connection")->capture_default_str();
  sub.add_option("--max-body-bytes", c.max_body_bytes, "largest request body; larger get 413")->capture_default_str();
  sub.add_option("--shutdown-timeout", c.shutdown_timeout_s, "seconds in-flight requests get after SIGTERM")
      ->capture_default_str();
  sub.add_option("--tool-call-parser", a->tool_parser,
                 "none, deepseek_v3, deepseek_v31 or kimi_k2; auto: from config.json's model_type")
      ->capture_default_str();
  sub.add_option("--reasoning-parser", a->reasoning, "split <think> text into reasoning_content: auto, on, off")
      ->capture_default_str();
  return [a] { return run_serve(*a); };
});

}  // namespace
}  // namespace kiln::cli

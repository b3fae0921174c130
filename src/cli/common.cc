#include "cli/common.h"

#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "dist/nccl_communicator.h"
#include "dist/nccl_rank_comm.h"
#include "dist/process_ranks.h"
#include "dist/sharded_model.h"
#include "dist/tcp_communicator.h"

namespace kiln::cli {

namespace {

// The comma-separated items of s, trimmed of spaces; an empty item stays, as "" (none for "").
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; !s.empty() && i <= s.size();) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    out.push_back(std::move(item));
    i = j + 1;
  }
  return out;
}

// The whole of `item` as an integer in [lo, hi].
template <typename T>
bool parse_whole(const std::string& item, T lo, T hi, T& v) {
  auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
  return !item.empty() && ec == std::errc() && p == item.data() + item.size() && v >= lo && v <= hi;
}

}  // namespace

std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  for (const std::string& item : split_list(s)) {
    int32_t v = 0;
    KILN_CHECK(parse_whole<int32_t>(item, 0, INT32_MAX, v),
               "{}: \"{}\" is not a non-negative token id (expected a list like 1,2,3)", flag, item);
    ids.push_back(v);
  }
  KILN_CHECK(!ids.empty(), "{}: no token ids given", flag);
  return ids;
}

std::vector<int64_t> parse_counts(const std::string& s, const std::string& flag) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(s)) {
    int64_t v = 0;
    KILN_CHECK(parse_whole<int64_t>(item, 1, int64_t{1} << 20, v),
               "{}: \"{}\" is not a count from 1 to 1048576 (expected a list like 1,8,32)", flag, item);
    out.push_back(v);
  }
  KILN_CHECK(!out.empty(), "{}: no counts given", flag);
  return out;
}

void require_output_file(const std::string& path, const std::string& flag, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  KILN_CHECK(!path.empty(), "{}: no file given", flag);
  KILN_CHECK(!fs::is_directory(path, ec), "{} {}: is a folder, not a file", flag, path);
  for (const std::string& in : inputs)
    KILN_CHECK(!fs::equivalent(path, in, ec), "{} {}: is an input of this run; writing it would destroy it", flag,
               path);
  const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  // An existing file (or /dev/stdout) needs only itself writable; a new one, its folder.
  const bool exists = fs::exists(path, ec);
  KILN_CHECK(exists || fs::is_directory(dir, ec), "{} {}: the folder {} does not exist", flag, path, dir.string());
  KILN_CHECK(::access(exists ? path.c_str() : dir.c_str(), W_OK) == 0, "{} {}: cannot write there ({})", flag, path,
             std::strerror(errno));
}

std::unique_ptr<ops::Backend> make_backend(const std::string& device) {
  if (device == "cpu" || (device == "auto" && !ops::cuda_available())) return ops::make_cpu_backend();
  KILN_CHECK(device == "cuda" || device == "auto", "--device must be cpu, cuda or auto, got \"{}\"", device);
  return ops::make_cuda_backend();
}

void add_precision_options(CLI::App& sub, Precision& p) {
  sub.add_option("--kv-cache-dtype", p.kv_dtype,
                 "latent KV cache: auto (bf16 on CUDA, f32 on the CPU), bf16, f32 or fp8_e4m3 (alias fp8: c_kv in "
                 "e4m3 with a scale per 128 values, k_pe in bf16, 656 B a token a layer at DeepSeek-V3's widths; "
                 "CPU only for now, docs/architecture.md)")
      ->capture_default_str();
  sub.add_option("--activation-dtype", p.activation_dtype,
                 "activations of the tensor-core GEMMs (prefill-sized layers and experts), CUDA: auto (bf16), "
                 "bf16 (rounded once, as vLLM and SGLang) or f32 (split into bf16 hi + lo parts: the reference's "
                 "precision at twice the tensor work)")
      ->capture_default_str();
  sub.add_option("--expert-activation-dtype", p.expert_activation_dtype,
                 "the same for the MoE experts' GEMMs (routed and shared) alone, CUDA: auto (as "
                 "--activation-dtype), f32 or bf16 (with --activation-dtype f32: most of bf16's prefill speed, a "
                 "third of its logprob drift on the bundled model with the f32 cache; docs/results.md)")
      ->capture_default_str();
  sub.add_option("--quantization", p.quantization,
                 "none (weights as the checkpoint ships them: FP8 and INT4 checkpoints stay quantized) or fp8 "
                 "(block-quantize a bf16/f32 checkpoint's projections to e4m3 with 128x128 scales at load, as "
                 "DeepSeek-V3 ships them; docs/quantization.md)")
      ->capture_default_str();
}

std::optional<DType> parse_kv_cache_dtype(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s == "bf16") return DType::BF16;
  if (s == "f32") return DType::F32;
  if (s == "fp8_e4m3" || s == "fp8") return DType::F8E4M3;  // vLLM's spellings
  fail("--kv-cache-dtype must be auto, bf16, f32 or fp8_e4m3 (fp8), got \"{}\"", s);
}

void apply_precision(const Precision& p, ops::Backend& backend, DeepseekV3Model& model) {
  const std::optional<DType> kv = parse_kv_cache_dtype(p.kv_dtype);
  KILN_CHECK(p.activation_dtype == "auto" || p.activation_dtype == "f32" || p.activation_dtype == "bf16",
             "--activation-dtype must be auto, f32 or bf16, got \"{}\"", p.activation_dtype);
  KILN_CHECK(p.activation_dtype != "bf16" || backend.device() == Device::CUDA,
             "--activation-dtype bf16 needs --device cuda (the CPU reference keeps f32 activations)");
  KILN_CHECK(
      p.expert_activation_dtype == "auto" || p.expert_activation_dtype == "f32" || p.expert_activation_dtype == "bf16",
      "--expert-activation-dtype must be auto, f32 or bf16, got \"{}\"", p.expert_activation_dtype);
  KILN_CHECK(p.expert_activation_dtype != "bf16" || backend.device() == Device::CUDA,
             "--expert-activation-dtype bf16 needs --device cuda (the CPU reference keeps f32 activations)");
  if (kv) model.set_kv_dtype(*kv);  // refuses fp8_e4m3 on CUDA (no kernels read it yet)
  // auto: bf16 on CUDA as vLLM and SGLang run (the logprob cost is in docs/results.md); the CPU
  // reference keeps f32.
  const bool bf16 = p.activation_dtype == "bf16" || (p.activation_dtype == "auto" && backend.device() == Device::CUDA);
  for (ops::Backend* b : model.rank_backends()) {  // the caller's backend is rank 0's
    b->set_activation_dtype(bf16 ? DType::BF16 : DType::F32);
    if (p.expert_activation_dtype != "auto")
      b->set_expert_activation_dtype(p.expert_activation_dtype == "bf16" ? DType::BF16 : DType::F32);
  }
}

void add_parallel_options(CLI::App& sub, Parallel& p) {
  sub.add_option("--tp", p.tp,
                 "tensor-parallel ranks (devices) in this process: attention heads, dense and shared "
                 "MLPs, the vocabulary and (without --enable-expert-parallel) every expert split")
      ->capture_default_str();
  sub.add_flag("--enable-expert-parallel", p.expert_parallel,
               "whole routed experts per rank (expert parallelism over the --tp ranks) instead of a slice of each");
  sub.add_option("--ep-combine", p.ep_combine,
                 "how expert parallelism combines the experts' outputs: alltoall (rows only to the tokens' owners, "
                 "shared experts replicated) or allreduce (every rank's dense partial summed)")
      ->check(CLI::IsMember({"alltoall", "allreduce"}))
      ->capture_default_str();
  sub.add_option("--dcp", p.dcp,
                 "decode context parallelism: each sequence's latent KV split by token over the ranks (for now "
                 "equal to --tp, CPU backend)")
      ->capture_default_str();
  sub.add_option("--nnodes", p.launch.nnodes,
                 "processes the --tp ranks span, one per node (default: what mpirun, srun or torchrun started)");
  sub.add_option("--node-rank", p.launch.node_rank, "this process's rank among them, 0..nnodes-1 (0 schedules)");
  sub.add_option("--dist-init-addr", p.launch.init_addr,
                 "rank 0's rendezvous address host:port (default: MASTER_ADDR and MASTER_PORT)");
  sub.add_option("--dist-timeout", p.dist_timeout_s, "seconds the processes wait for one another to start")
      ->capture_default_str();
}

namespace {

bool split(const Parallel& p) {
  return p.tp != 1 || p.expert_parallel || p.dcp != 1;
}

// The processes the run spans: one unless a launcher started several or the flags say so. Looked
// up only for a split model or when a launch flag is given, so that a stray RANK in a one-device
// run's environment changes nothing.
dist::LaunchInfo processes(const Parallel& p) {
  const bool flags = p.launch.nnodes > 0 || p.launch.node_rank >= 0 || !p.launch.init_addr.empty();
  if (!split(p) && !flags) return {};
  const dist::LaunchInfo info = dist::resolve_launch(p.launch, dist::process_environment());
  KILN_CHECK(info.nnodes == 1 || split(p),
             "{} processes ({}) with --tp 1: a run over several processes splits the model; give --tp {} or more",
             info.nnodes, info.launcher == "flags" ? "--nnodes" : info.launcher, info.nnodes);
  KILN_CHECK(p.tp % info.nnodes == 0,
             "--tp {} over {} processes ({}): every process drives the same number of ranks, so --tp must be a "
             "multiple of the process count",
             p.tp, info.nnodes, info.launcher == "flags" ? "--nnodes" : info.launcher);
  KILN_CHECK(p.dist_timeout_s > 0, "--dist-timeout must be positive, got {}", p.dist_timeout_s);
  return info;
}

// --tp N > 1: N ranks, rank 0 the model the caller holds; with several processes this one's
// share of them (in every process but rank 0's, the worker loop runs here and ends the command
// with WorkerDone). Empty dir: random weights.
LoadedModel load_split(const ModelConfig& c, const std::string& dir, const std::string& device,
                       const Parallel& parallel, uint64_t seed) {
  KILN_CHECK(parallel.tp >= 1 && parallel.tp <= 1024, "--tp must be 1 to 1024, got {}", parallel.tp);
  const dist::LaunchInfo launch = processes(parallel);
  const bool cuda = make_backend(device)->device() == Device::CUDA;  // resolves "auto" the same way
  const int procs = launch.nnodes, local = parallel.tp / procs, first = launch.node_rank * local;
  dist::ShardedModelOptions o;
  o.parallel.world_size = o.parallel.tp = parallel.tp;
  o.parallel.ep = parallel.expert_parallel ? parallel.tp : 1;
  o.parallel.ep_alltoall = parallel.ep_combine == "alltoall" && o.parallel.ep > 1;
  o.parallel.dcp = parallel.dcp;
  o.make_backend = [device](int) { return make_backend(device); };
  std::optional<dist::NcclId> nccl_id;
  if (procs > 1) {
    spdlog::info("{}: ranks {}..{} of {}", dist::describe(launch), first, first + local - 1, parallel.tp);
    dist::TcpOptions to = dist::tcp_options(launch, parallel.dist_timeout_s);
    o.process_comm = dist::connect_tcp(to);
    spdlog::info("process {}: the group of {} processes formed", launch.node_rank, procs);
    o.first_rank = first;
    o.local_ranks = local;
    if (launch.node_rank == 0)
      o.on_peer_lost = [](int, const std::string& why) {
        // A serving rank 0 may sit idle while a worker dies: end the run rather than keep a front
        // end whose every step would fail. (A step in flight fails first, with its own message.)
        spdlog::error("{}: the model cannot run without it; exiting", why);
        std::fprintf(stderr, "kiln: error: %s\n", why.c_str());
        std::fflush(nullptr);
        std::_Exit(1);
      };
    if (cuda) {
      nccl_id = dist::share_nccl_id(*o.process_comm);  // one id for every rank of every process
      o.watch_process_peers = true;
    } else if (local == 1) {
      // One rank per process: the process group carries the model's collectives too.
      o.make_comm = [pc = o.process_comm](int, dist::Communicator&, ops::Backend&) {
        return dist::borrow_communicator(*pc);
      };
    } else {
      // Several ranks per process on the CPU: a TCP group of every rank, on the next port.
      to.world_size = parallel.tp;
      to.port += 1;
      o.make_comm = [to](int rank, dist::Communicator&, ops::Backend&) {
        dist::TcpOptions mine = to;
        mine.rank = rank;
        return dist::connect_tcp(mine);
      };
    }
  }
  if (cuda) {                                    // one GPU per rank, NCCL between them
    const int base = launch.local_rank * local;  // GPUs of the processes before this one on its machine
    o.thread_init = [base](int i) { ops::set_cuda_device(base + i); };
    if (nccl_id)
      o.make_comm = [world = parallel.tp, id = *nccl_id, base, first](int rank, dist::Communicator&, ops::Backend& be) {
        return dist::make_nccl_rank_comm(rank, world, id, base + rank - first, be);
      };
    else
      o.make_comm = [world = parallel.tp](int rank, dist::Communicator& host, ops::Backend& be) {
        return dist::make_nccl_rank_comm(rank, world, host, be);
      };
  }
  o.random_weights = dir.empty();
  o.seed = seed;
  dist::ShardedModel s = dist::load_sharded_model(c, dir, o);
  if (procs > 1 && launch.node_rank != 0) {
    dist::run_rank_worker(*s.model, *o.process_comm);
    throw WorkerDone{};
  }
  return {std::move(s.backend), std::move(s.model)};
}

}  // namespace

LoadedModel random_model(const ModelConfig& config, const std::string& device, uint64_t seed, const Parallel& parallel,
                         WeightQuant quant) {
  if (split(parallel) || processes(parallel).nnodes > 1) {
    KILN_CHECK(quant == WeightQuant::None,
               "quantized random weights (--weight-dtype) are not built for a split model yet (--tp {})", parallel.tp);
    return load_split(config, "", device, parallel, seed);
  }
  LoadedModel m;
  m.backend = make_backend(device);
  ModelWeights w = random_weights(config, *m.backend, seed, quant);
  m.model = std::make_unique<DeepseekV3Model>(config, std::move(w), *m.backend);
  return m;
}

WeightQuant parse_quantization(const std::string& s) {
  KILN_CHECK(s == "none" || s == "fp8", "--quantization must be none or fp8, got \"{}\"", s);
  return parse_weight_quant(s, "--quantization");
}

LoadedModel load_model(const std::string& dir, const std::string& device, const Precision& precision,
                       const std::string& load_format, const Parallel& parallel) {
  KILN_CHECK(load_format == "auto" || load_format == "dummy", "--load-format must be auto or dummy, got \"{}\"",
             load_format);
  const WeightQuant quant = parse_quantization(precision.quantization);
  // Before any weights load (set_kv_dtype refuses it again later, for every other caller).
  KILN_CHECK(parse_kv_cache_dtype(precision.kv_dtype) != DType::F8E4M3 || device == "cpu" ||
                 (device == "auto" && !ops::cuda_available()),
             "--kv-cache-dtype fp8_e4m3: the CUDA kernels for the FP8 latent KV cache are not built yet (the CPU "
             "backend runs it: --device cpu); use --kv-cache-dtype bf16 or f32 on the GPU");
  LoadedModel m;
  if (split(parallel) || processes(parallel).nnodes > 1) {
    // The ranks' slices are read plain (an FP8 checkpoint's slices dequantized at load).
    KILN_CHECK(quant == WeightQuant::None, "--quantization {} is not built for a split model yet (--tp {})",
               precision.quantization, parallel.tp);
    const std::string config = (std::filesystem::path(dir) / "config.json").string();
    if (load_format == "dummy") spdlog::info("--load-format dummy: random weights of {}'s shapes", config);
    m = load_split(load_model_config(config), load_format == "dummy" ? "" : dir, device, parallel, 0);
  } else if (load_format == "dummy") {
    m.backend = make_backend(device);
    const std::string config = (std::filesystem::path(dir) / "config.json").string();
    ModelConfig c = load_model_config(config);
    spdlog::info("--load-format dummy: random weights of {}'s shapes", config);
    ModelWeights w = random_weights(c, *m.backend, /*seed=*/0, quant);
    m.model = std::make_unique<DeepseekV3Model>(std::move(c), std::move(w), *m.backend);
  } else {
    m.backend = make_backend(device);
    m.model = DeepseekV3Model::load(dir, *m.backend, quant);
  }
  apply_precision(precision, *m.backend, *m.model);
  spdlog::info("loaded {} ({} layers, {} heads) on {}", dir, m.model->config().num_hidden_layers,
               m.model->config().num_attention_heads, m.backend->name());
  spdlog::info("kernel plan ({} heads per GPU):", m.model->config().num_attention_heads / parallel.tp);
  for (const auto& [op, impl] : m.backend->kernel_plan()) spdlog::info("  {:<14} {}", op, impl);
  return m;
}

}  // namespace kiln::cli

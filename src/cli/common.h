// Helpers the subcommands share: id lists, device choice, model loading.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/launch.h"
#include "model/deepseek_v3.h"
#include "ops/backend.h"

namespace kiln::cli {

// "1,2,3" -> {1, 2, 3}; anything else is an error naming `flag`.
std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag);

// "1,8,32" -> {1, 8, 32}: a list of positive counts (batch sizes), errors naming `flag`.
std::vector<int64_t> parse_counts(const std::string& s, const std::string& flag);

// Fails, naming `flag`, unless `path` can be written as a file: its folder exists and is writable
// and it is not a folder, nor any of `inputs`. Checked before a long run, not after it.
void require_output_file(const std::string& path, const std::string& flag, const std::vector<std::string>& inputs = {});

// "cpu", "cuda", or "auto" (CUDA when a GPU is present, else the CPU).
std::unique_ptr<ops::Backend> make_backend(const std::string& device);

// One backend and the model on it.
struct LoadedModel {
  std::unique_ptr<ops::Backend> backend;
  std::unique_ptr<DeepseekV3Model> model;
};
// Number formats a run chooses (the same flags on generate, score, serve and bench model).
struct Precision {
  std::string kv_dtype = "auto";          // latent KV cache: auto (the backend's), bf16, f32 or fp8_e4m3 (fp8)
  std::string activation_dtype = "auto";  // tensor-core GEMM activations: auto (bf16 on CUDA), f32 (hi/lo split), bf16
  std::string expert_activation_dtype = "auto";  // the MoE experts' alone: auto (as above), f32 or bf16
  std::string quantization = "none";             // none (as the checkpoint ships) or fp8 (block-quantized at load)
};
void add_precision_options(CLI::App& sub, Precision& p);
// --kv-cache-dtype's value: none for auto (the backend's choice); throws on an unknown one.
std::optional<DType> parse_kv_cache_dtype(const std::string& s);
// Checks the flags (a clear error naming the bad one) and sets them on the backend and model.
void apply_precision(const Precision& p, ops::Backend& backend, DeepseekV3Model& model);

// How a run splits the model over devices (DESIGN.md §7): --tp N ranks, one backend and thread
// each (CPU: a thread communicator; CUDA: one GPU per rank over NCCL), and
// --enable-expert-parallel for whole routed experts per rank instead of a slice of every expert.
// The ranks may span processes (one per node, started by mpirun, srun or --nnodes/--node-rank):
// each drives tp / processes of them, over TCP (CPU) or NCCL (CUDA) between processes.
struct Parallel {
  int tp = 1;
  bool expert_parallel = false;
  // Under --enable-expert-parallel: "alltoall" sends each rank's expert outputs only for the tokens
  // its experts serve (model/ep_dispatch.h); "allreduce" sums every rank's dense partial (the
  // reference it is tested against).
  std::string ep_combine = "allreduce";
  int dcp = 1;  // decode context parallelism (so far --dcp equal to --tp, CPU backend)
  dist::LaunchFlags launch;
  double dist_timeout_s = 300;  // how long the processes wait for one another to start
};

// Thrown in every process but rank 0's of a multi-process run once rank 0 has ended the run: the
// process followed rank 0's steps inside load_model and has nothing of its own to print or serve.
// main() ends the process with exit code 0 on it.
struct WorkerDone {};
void add_parallel_options(CLI::App& sub, Parallel& p);
// --quantization: none or fp8 (an error naming the flag otherwise).
WeightQuant parse_quantization(const std::string& s);

// load_format: "auto" reads the checkpoint's safetensors; "dummy" gives random weights of the
// shapes in dir/config.json (vLLM's spelling), for serving benchmarks at any model shape.
LoadedModel load_model(const std::string& dir, const std::string& device, const Precision& precision = {},
                       const std::string& load_format = "auto", const Parallel& parallel = {});
// Random weights of `config`'s shapes (seed), split as `parallel` says (one device when tp is 1).
LoadedModel random_model(const ModelConfig& config, const std::string& device, uint64_t seed,
                         const Parallel& parallel = {}, WeightQuant quant = WeightQuant::None);

}  // namespace kiln::cli

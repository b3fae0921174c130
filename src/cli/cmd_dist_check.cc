// `kiln dist-check`: forms the process group the way serve will (mpirun or srun variables,
// torchrun-style variables, or --nnodes/--node-rank/--dist-init-addr), runs every collective on
// known data and prints one digest line, the same for any way of splitting the same ranks: N
// processes, or one process with --threads N. With --config/--model it also prints each rank's
// share of that model under --tp/--ep/--dcp. A launch check for a cluster before a real run.
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/command.h"
#include "core/dtype.h"
#include "core/error.h"
#include "dist/launch.h"
#include "dist/parallel_layout.h"
#include "dist/tcp_communicator.h"
#include "dist/thread_communicator.h"

namespace kiln::cli {
namespace {

struct DistCheckArgs {
  dist::LaunchFlags launch;
  int threads = 0;  // ranks as threads of this process instead of processes
  double rendezvous_timeout_s = 300, op_timeout_s = 300;
  int count = 1001;
  int64_t repeat = 1;  // rounds of every collective: a soak test of the links
  std::string model_dir, config_file;
  int tp = 0, ep = 1, dcp = 1;
};

// FNV-1a over bytes: a short fingerprint of a result, equal on every rank that holds the same bits.
uint64_t digest(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

float value(int rank, size_t i) {
  return static_cast<float>((rank * 7919 + static_cast<int64_t>(i) * 104729) % 1000) / 7.0f - 70.0f;
}

// Every collective once; results that differ by rank (reduce-scatter, all-to-all) are gathered so
// that the line is the same on every rank.
std::string check_collectives(dist::Communicator& c, size_t n) {
  const int rank = c.rank(), world = c.world_size();
  std::vector<float> in(n * world);
  for (size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i);
  std::vector<float> sum(n), gathered(n * world), scattered(n);
  c.all_reduce(in.data(), sum.data(), n, DType::F32);
  std::vector<uint16_t> in16(n), sum16(n);
  for (size_t i = 0; i < n; ++i) in16[i] = f32_to_bf16(in[i]);
  c.all_reduce(in16.data(), sum16.data(), n, DType::BF16);
  c.all_gather(in.data(), gathered.data(), n, DType::F32);
  c.reduce_scatter(in.data(), scattered.data(), n, DType::F32);
  std::vector<size_t> send_counts(world), recv_counts(world);
  std::vector<int32_t> send;
  size_t received = 0;
  for (int r = 0; r < world; ++r) {
    send_counts[r] = static_cast<size_t>((rank + 2 * r) % 3);
    recv_counts[r] = static_cast<size_t>((r + 2 * rank) % 3);
    received += recv_counts[r];
    for (size_t i = 0; i < send_counts[r]; ++i) send.push_back(rank * 1000 + r * 10 + static_cast<int32_t>(i));
  }
  std::vector<int32_t> exchanged(received);
  c.all_to_all(send.data(), send_counts, exchanged.data(), recv_counts, DType::I32);
  std::vector<float> from_last(n);
  if (rank == world - 1) from_last = std::vector<float>(in.begin(), in.begin() + static_cast<ptrdiff_t>(n));
  c.broadcast(from_last.data(), n, DType::F32, world - 1);
  uint64_t mine[2] = {digest(scattered.data(), n * 4), digest(exchanged.data(), exchanged.size() * 4)};
  std::vector<uint64_t> all(2 * world);
  c.all_gather(mine, all.data(), 2, DType::I64);
  c.barrier();
  return fmt::format(
      "dist-check: {} ranks, all_reduce f32 {:016x} bf16 {:016x}, all_gather {:016x}, reduce_scatter+all_to_all "
      "{:016x}, broadcast {:016x}",
      world, digest(sum.data(), n * 4), digest(sum16.data(), n * 2), digest(gathered.data(), gathered.size() * 4),
      digest(all.data(), all.size() * 8), digest(from_last.data(), n * 4));
}

int run_dist_check(const DistCheckArgs& a) {
  KILN_CHECK(a.count >= 1, "--count {}: needs at least 1", a.count);
  KILN_CHECK(a.repeat >= 1, "--repeat {}: needs at least 1", a.repeat);
  KILN_CHECK(a.threads >= 0, "--threads {}: needs at least 1", a.threads);
  std::optional<dist::ParallelLayout> layout;
  const int world_for_layout = a.threads > 0 ? a.threads : 0;
  std::optional<ModelConfig> model;
  if (!a.model_dir.empty() || !a.config_file.empty()) {
    KILN_CHECK(a.model_dir.empty() != a.config_file.empty(), "dist-check takes one of --model DIR or --config FILE");
    model = load_model_config(a.config_file.empty() ? (std::filesystem::path(a.model_dir) / "config.json").string()
                                                    : a.config_file);
  }
  auto print_layout = [&](int world, int rank_begin, int rank_end) {
    if (!model) return;
    dist::ParallelConfig p;
    p.world_size = world;
    p.tp = a.tp > 0 ? a.tp : world;
    p.ep = a.ep;
    p.dcp = a.dcp;
    const dist::ParallelLayout l(p, *model);
    for (int r = rank_begin; r < rank_end; ++r) std::printf("%s\n", l.describe(r).c_str());
  };

  if (a.threads > 0) {
    KILN_CHECK(a.launch.nnodes <= 1 && a.launch.init_addr.empty(), "--threads runs one process: drop --nnodes");
    print_layout(world_for_layout, 0, world_for_layout);
    auto comms = dist::make_thread_communicators(a.threads);
    std::vector<std::string> lines(a.threads), errors(a.threads);
    std::vector<std::thread> threads;
    for (int r = 0; r < a.threads; ++r)
      threads.emplace_back([&, r] {
        try {
          for (int64_t i = 0; i < a.repeat; ++i) lines[r] = check_collectives(*comms[r], static_cast<size_t>(a.count));
        } catch (const std::exception& e) {
          errors[r] = e.what();
          comms[r]->abort(e.what());
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < a.threads; ++r) KILN_CHECK(errors[r].empty(), "rank {}: {}", r, errors[r]);
    for (int r = 1; r < a.threads; ++r) KILN_CHECK(lines[r] == lines[0], "rank {} disagrees with rank 0", r);
    std::printf("%s\n", lines[0].c_str());
    return 0;
  }

  const dist::LaunchInfo info = dist::resolve_launch(a.launch, dist::process_environment());
  std::fprintf(stderr, "kiln dist-check: %s\n", dist::describe(info).c_str());
  dist::TcpOptions o = dist::tcp_options(info, a.rendezvous_timeout_s);
  o.op_timeout_s = a.op_timeout_s;
  auto comm = dist::connect_tcp(o);
  std::fprintf(stderr, "kiln dist-check: rank %d: the group of %d formed\n", info.node_rank, info.nnodes);
  print_layout(info.nnodes, info.node_rank, info.node_rank + 1);
  std::string line;
  for (int64_t i = 0; i < a.repeat; ++i) line = check_collectives(*comm, static_cast<size_t>(a.count));
  if (info.node_rank == 0) std::printf("%s\n", line.c_str());
  return 0;
}

std::function<int()> setup_dist_check(CLI::App& sub) {
  auto a = std::make_shared<DistCheckArgs>();
  sub.add_option("--nnodes", a->launch.nnodes,
                 "processes in the run (one per node); default from mpirun/srun/torchrun");
  sub.add_option("--node-rank", a->launch.node_rank, "this process's rank, 0..nnodes-1");
  sub.add_option("--dist-init-addr", a->launch.init_addr,
                 "rank 0's rendezvous address host:port (or MASTER_ADDR/PORT)");
  sub.add_option("--threads", a->threads, "run N ranks as threads of this one process instead");
  sub.add_option("--rendezvous-timeout", a->rendezvous_timeout_s, "seconds to wait for every rank")
      ->capture_default_str();
  sub.add_option("--op-timeout", a->op_timeout_s, "seconds a collective waits for a peer (0: no limit)")
      ->capture_default_str();
  sub.add_option("--count", a->count, "elements per collective")->capture_default_str();
  sub.add_option("--repeat", a->repeat, "rounds of every collective (a soak test)")->capture_default_str();
  sub.add_option("--model", a->model_dir, "model folder: also print each rank's share of it");
  sub.add_option("--config", a->config_file, "config.json: also print each rank's share of it");
  sub.add_option("--tp", a->tp, "attention tensor parallelism for the printed layout (default: all ranks)");
  sub.add_option("--ep", a->ep, "expert-parallel groups for the printed layout")->capture_default_str();
  sub.add_option("--dcp", a->dcp, "decode context parallelism for the printed layout")->capture_default_str();
  return [a] { return run_dist_check(*a); };
}

KILN_COMMAND("dist-check", "Form the multi-process group (mpirun, srun or --nnodes) and check every collective",
             setup_dist_check);

}  // namespace
}  // namespace kiln::cli

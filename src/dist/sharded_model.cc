#include "dist/sharded_model.h"

#include "core/error.h"
#include "core/log.h"
#include "dist/process_ranks.h"
#include "dist/sharded_weights.h"
#include "dist/tcp_communicator.h"
#include "dist/thread_communicator.h"
#include "model/rank_group.h"

namespace kiln::dist {

ShardedModel load_sharded_model(const ModelConfig& c, const std::string& dir, const ShardedModelOptions& o) {
  KILN_CHECK(o.make_backend, "internal: a sharded model needs a backend factory");
  const ParallelLayout layout(o.parallel, c);  // refuses a split that does not fit, naming it
  const int world = o.parallel.world_size;
  const int first = o.first_rank, local = o.local_ranks > 0 ? o.local_ranks : world;
  KILN_CHECK(first >= 0 && first + local <= world && (local == world || o.process_comm),
             "internal: ranks {}..{} of {} in one process", first, first + local - 1, world);
  KILN_CHECK(o.parallel.dcp == 1 || o.parallel.dcp == world,
             "--dcp {} with --tp {}: decode context parallelism runs over the whole TP group (--dcp equal to --tp) "
             "for now",
             o.parallel.dcp, o.parallel.tp);
  for (int r = first; r < first + local; ++r) spdlog::info("parallel layout: {}", layout.describe(r));
  std::unique_ptr<Checkpoint> ckpt;
  if (!o.random_weights) ckpt = std::make_unique<Checkpoint>(dir);

  KILN_CHECK(local == world || o.make_comm, "internal: a multi-process model needs a communicator factory");
  auto host = make_thread_communicators(local);
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(local));
  std::vector<std::unique_ptr<ops::Backend>> backends(static_cast<size_t>(local));
  std::vector<std::unique_ptr<DeepseekV3Model>> models(static_cast<size_t>(local));
  if (o.thread_init) o.thread_init(0);
  auto workers = std::make_unique<RankWorkers>(local, o.thread_init);
  // Every rank loads at once on its own thread (its own device's memory on CUDA).
  workers->run(
      [&](int index) {
        const auto i = static_cast<size_t>(index);
        const int r = first + index;  // the rank in the whole group
        backends[i] = o.make_backend(index);
        comms[i] = o.make_comm ? o.make_comm(r, *host[i], *backends[i]) : std::move(host[i]);
        ModelWeights w = o.random_weights ? random_rank_weights(c, *backends[i], layout, r, o.seed)
                                          : load_rank_weights(c, *ckpt, *backends[i], layout, r);
        models[i] =
            std::make_unique<DeepseekV3Model>(c, std::move(w), *backends[i], model_shard(layout, r, comms[i].get()));
      },
      [&](int r, const std::string& why) {
        const auto i = static_cast<size_t>(r);
        if (host[i]) host[i]->abort(why);
        if (comms[i]) comms[i]->abort(why);
      });

  auto group = std::make_unique<RankGroup>();
  group->process_comm = o.process_comm;
  group->first_rank = first;
  if (o.process_comm && first == 0) group->remote = make_process_ranks(*o.process_comm, *backends[0]);
  group->comms = std::move(comms);
  for (int r = 1; r < local; ++r) {
    group->backends.push_back(std::move(backends[static_cast<size_t>(r)]));
    group->peers.push_back(std::move(models[static_cast<size_t>(r)]));
  }
  group->workers = std::move(workers);
  if (o.process_comm && o.watch_process_peers) {
    std::vector<Communicator*> mine;
    for (const auto& comm : group->comms) mine.push_back(comm.get());
    group->peer_watches.push_back(watch_peers(*o.process_comm, [mine](int, const std::string& why) {
      spdlog::error("{}: aborting this process's ranks", why);
      for (Communicator* comm : mine) comm->abort(why);
    }));
  }
  if (o.process_comm && o.on_peer_lost)
    group->peer_watches.push_back(watch_peers(*o.process_comm, o.on_peer_lost, 2.0));
  group->host_comms = std::move(host);
  ShardedModel out;
  out.backend = std::move(backends[0]);
  out.model = std::move(models[0]);
  out.model->attach_group(std::move(group));
  return out;
}

}  // namespace kiln::dist

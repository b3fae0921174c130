#include "dist/sharded_model.h"

#include "core/error.h"
#include "core/log.h"
#include "dist/sharded_weights.h"
#include "dist/thread_communicator.h"
#include "model/rank_group.h"

namespace kiln::dist {

ShardedModel load_sharded_model(const ModelConfig& c, const std::string& dir, const ShardedModelOptions& o) {
  KILN_CHECK(o.make_backend, "internal: a sharded model needs a backend factory");
  const ParallelLayout layout(o.parallel, c);  // refuses a split that does not fit, naming it
  const int world = o.parallel.world_size;
  KILN_CHECK(o.parallel.dcp == 1 || o.parallel.dcp == world,
             "--dcp {} with --tp {}: decode context parallelism runs over the whole TP group (--dcp equal to --tp) "
             "for now",
             o.parallel.dcp, o.parallel.tp);
  for (int r = 0; r < world; ++r) spdlog::info("parallel layout: {}", layout.describe(r));
  std::unique_ptr<Checkpoint> ckpt;
  if (!o.random_weights) ckpt = std::make_unique<Checkpoint>(dir);

  auto host = make_thread_communicators(world);
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(world));
  std::vector<std::unique_ptr<ops::Backend>> backends(static_cast<size_t>(world));
  std::vector<std::unique_ptr<DeepseekV3Model>> models(static_cast<size_t>(world));
  if (o.thread_init) o.thread_init(0);
  auto workers = std::make_unique<RankWorkers>(world, o.thread_init);
  // Every rank loads at once on its own thread (its own device's memory on CUDA).
  workers->run(
      [&](int r) {
        const auto i = static_cast<size_t>(r);
        backends[i] = o.make_backend(r);
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
  group->comms = std::move(comms);
  for (int r = 1; r < world; ++r) {
    group->backends.push_back(std::move(backends[static_cast<size_t>(r)]));
    group->peers.push_back(std::move(models[static_cast<size_t>(r)]));
  }
  group->workers = std::move(workers);
  group->host_comms = std::move(host);
  ShardedModel out;
  out.backend = std::move(backends[0]);
  out.model = std::move(models[0]);
  out.model->attach_group(std::move(group));
  return out;
}

}  // namespace kiln::dist

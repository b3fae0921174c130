#include "dist/parallel_layout.h"

#include <algorithm>

#include "core/error.h"

namespace kiln::dist {
namespace {

// The i-th of n equal parts of [0, total) (the caller has checked that n divides total).
Range part(int64_t total, int64_t n, int64_t i) {
  return {total / n * i, total / n * (i + 1)};
}

}  // namespace

ParallelLayout::ParallelLayout(const ParallelConfig& p, const ModelConfig& m) : p_(p), m_(m) {
  KILN_CHECK(p.world_size >= 1, "parallel layout: world size {} (needs at least 1)", p.world_size);
  KILN_CHECK(p.tp >= 1, "--tp {}: needs at least 1", p.tp);
  KILN_CHECK(p.tp == p.world_size,
             "--tp {} on {} ranks: every rank takes part in attention tensor parallelism (attention data "
             "parallelism is not supported), so --tp must equal the rank count",
             p.tp, p.world_size);
  KILN_CHECK(m.num_attention_heads % p.tp == 0, "--tp {}: the model's {} attention heads do not split evenly", p.tp,
             m.num_attention_heads);
  heads_per_rank_ = static_cast<int>(m.num_attention_heads / p.tp);
  KILN_CHECK(p.dcp >= 1 && p.tp % p.dcp == 0, "--dcp {}: must divide --tp {} (a DCP group lies within the TP ranks)",
             p.dcp, p.tp);
  KILN_CHECK(p.dcp_interleave >= 1, "DCP interleave {}: needs at least 1 token", p.dcp_interleave);
  KILN_CHECK(p.ep >= 1 && p.world_size % p.ep == 0, "expert-parallel size {}: must divide the {} ranks", p.ep,
             p.world_size);
  const int64_t moe_tp = p.world_size / p.ep;
  if (m.n_routed_experts > 0) {
    KILN_CHECK(m.n_routed_experts % p.ep == 0,
               "expert parallelism over {}: the model's {} routed experts do not split "
               "evenly",
               p.ep, m.n_routed_experts);
    KILN_CHECK(m.moe_intermediate_size % moe_tp == 0,
               "tensor parallelism {} inside the experts: moe_intermediate_size {} does not split evenly", moe_tp,
               m.moe_intermediate_size);
    experts_per_rank_ = m.n_routed_experts / p.ep;
  }
  KILN_CHECK(!p.ep_alltoall || p.ep > 1,
             "--ep-combine alltoall: needs expert parallelism (--enable-expert-parallel) on more than one rank");
  KILN_CHECK(p.ep_alltoall || (m.n_shared_experts * m.moe_intermediate_size) % p.tp == 0,
             "--tp {}: the shared experts' width {} ({} x {}) does not split evenly", p.tp,
             m.n_shared_experts * m.moe_intermediate_size, m.n_shared_experts, m.moe_intermediate_size);
  if (m.first_k_dense_replace > 0 || m.n_routed_experts == 0)
    KILN_CHECK(m.intermediate_size % p.tp == 0, "--tp {}: the dense MLP's intermediate_size {} does not split evenly",
               p.tp, m.intermediate_size);
  // The vocabulary need not divide: ranks take ceil(V / tp) rows each and the last ones fewer.
  vocab_per_rank_ = (m.vocab_size + p.tp - 1) / p.tp;
}

RankShare ParallelLayout::share(int rank) const {
  KILN_CHECK(rank >= 0 && rank < p_.world_size, "parallel layout: rank {} is outside 0..{}", rank, p_.world_size - 1);
  RankShare s;
  s.rank = rank;
  s.heads = part(m_.num_attention_heads, p_.tp, rank);
  const int64_t moe_tp = p_.world_size / p_.ep;
  s.experts = m_.n_routed_experts > 0 ? part(m_.n_routed_experts, p_.ep, rank / moe_tp) : Range{};
  s.expert_inter = part(m_.moe_intermediate_size, moe_tp, rank % moe_tp);
  // The all-to-all combine runs the shared experts whole on each token's owner (no dense partial).
  s.shared_inter = p_.ep_alltoall ? Range{0, m_.n_shared_experts * m_.moe_intermediate_size}
                                  : part(m_.n_shared_experts * m_.moe_intermediate_size, p_.tp, rank);
  s.dense_inter = m_.intermediate_size % p_.tp == 0 ? part(m_.intermediate_size, p_.tp, rank) : Range{};
  s.vocab = {std::min(m_.vocab_size, vocab_per_rank_ * rank), std::min(m_.vocab_size, vocab_per_rank_ * (rank + 1))};
  s.dcp_rank = rank % p_.dcp;
  const int64_t group = rank / p_.dcp;
  s.dcp_group_heads = {group * p_.dcp * heads_per_rank_, (group + 1) * p_.dcp * heads_per_rank_};
  return s;
}

std::string ParallelLayout::describe(int rank) const {
  const RankShare s = share(rank);
  std::string line =
      fmt::format("rank {}/{}: heads {}..{} ({})", rank, p_.world_size, s.heads.begin, s.heads.end - 1, s.heads.size());
  if (m_.n_routed_experts > 0)
    line += fmt::format(", experts {}..{} inter {}..{}", s.experts.begin, s.experts.end - 1, s.expert_inter.begin,
                        s.expert_inter.end - 1);
  line += fmt::format(", vocab {}..{}", s.vocab.begin, s.vocab.end - 1);
  if (p_.ep_alltoall) line += ", experts combined by all-to-all, shared experts whole";
  if (p_.dcp > 1) line += fmt::format(", dcp rank {}/{}", s.dcp_rank, p_.dcp);
  return line;
}

}  // namespace kiln::dist

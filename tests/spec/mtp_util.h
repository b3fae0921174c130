// Shared by the MTP drafter tests: kiln-tiny's own NextN layer as the engine's speculator.
#pragma once

#include "engine_spec_util.h"
#include "spec/mtp_drafter.h"

namespace kiln::spec {

struct MtpSpec {
  std::shared_ptr<Speculator> speculator;
  MtpDrafter* drafter = nullptr;  // owned by speculator
};

// K drafts per step from kiln-tiny's MTP layer, in a cache of `blocks` blocks of `block_size`
// until the engine sizes it.
inline MtpSpec mtp_speculator(int64_t k, int64_t blocks = 256, int64_t block_size = 16) {
  DeepseekV3Model& target = *models().target;
  auto layer = std::make_unique<MtpLayer>(model_dir("kiln-tiny"), target.config(), target.backend());
  auto drafter = std::make_unique<MtpDrafter>(std::move(layer), target, blocks, block_size);
  MtpSpec s;
  s.drafter = drafter.get();
  s.speculator = std::make_shared<DrafterSpeculator>(std::move(drafter), k, target.config().vocab_size, "mtp");
  return s;
}

inline EngineConfig mtp_config(const MtpSpec& s, int64_t block_size = 8, int64_t num_blocks = 256) {
  EngineConfig c = config(0, block_size, num_blocks);
  c.speculator = s.speculator;
  return c;
}

inline std::vector<int32_t> iota_rows(int64_t n) {
  std::vector<int32_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return r;
}

// One sequence from position 0 in a fresh pool: the batch of `tokens`.
inline ForwardBatch one_sequence(const std::vector<int32_t>& tokens, int64_t blocks) {
  ForwardBatch b;
  const auto T = static_cast<int64_t>(tokens.size());
  b.tokens = tokens;
  b.cu_q = {0, static_cast<int32_t>(T)};
  b.kv_lens = {static_cast<int32_t>(T)};
  b.max_blocks = blocks;
  b.block_tables = iota_rows(blocks);
  b.positions = iota_rows(T);
  b.slot_mapping = iota_rows(T);  // identity block table
  return b;
}

}  // namespace kiln::spec

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

}  // namespace kiln::spec

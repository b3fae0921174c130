// Target hidden states a drafter lacks (spec/ drafters that read them: the MTP layer, a block
// drafter): the engine hands over those of every position it computes (Speculator::accept_hidden),
// but not of positions it never computed (prefix-cache hits) nor those a drafter dropped for room.
// This recomputes them by running the target over the sequence's prefix in a scratch cache of its
// own, so the engine's pool and prefix cache are never touched.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/deepseek_v3.h"

namespace kiln::spec {

struct HiddenRecompute {
  std::span<const int32_t> tokens;  // the sequence's tokens from position 0, at least to the last wanted position
  std::vector<int64_t> positions;   // the positions wanted, ascending
};

// One target forward over every sequence's prefix [0, last wanted position]; returns the `taps`
// (ForwardBatch::hidden_taps) of each wanted position, sequence after sequence: [wanted, taps, hidden].
std::vector<float> recompute_hidden(DeepseekV3Model& target, std::span<const HiddenRecompute> seqs,
                                    const std::vector<int32_t>& taps, int64_t block_size = 64);

}  // namespace kiln::spec

// The sampling uniform: u = f(seed, counter) in [0, 1) from Philox-4x32-10 (Salmon et al., SC'11),
// keyed by the request's seed with the draw index as the counter. Counter-based, so the CPU and
// the GPU draw the same u for the same (seed, counter), and a request's tokens depend on its seed
// and position only, never on what else is batched, on preemption or on the backend.
#pragma once

#include <cstdint>

#include "ops/host_device.h"

namespace kiln::ops {

struct Philox4x32 {
  uint32_t v[4];
};

// Philox-4x32 with 10 rounds; matches the Random123 known-answer vectors (tests/ops).
KILN_HD Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.v[0], p1 = static_cast<uint64_t>(kM1) * ctr.v[2];
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// 64 random bits for draw `counter` of the stream `seed`; the top 53 make the uniform.
KILN_HD uint64_t sample_bits(uint64_t seed, uint64_t counter) {
  const Philox4x32 r =
      philox4x32_10(Philox4x32{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}},
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

// u in [0, 1) on a grid of 2^-53: exactly representable, so u * total is the only rounding a
// backend adds.
KILN_HD double sample_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(sample_bits(seed, counter) >> 11) * 0x1.0p-53;
}

}  // namespace kiln::ops

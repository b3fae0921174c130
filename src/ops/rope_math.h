// Rotary-embedding arithmetic shared by the CPU reference and the CUDA kernels (rope, mla_prepare),
// so every path that rotates q_pe or k_pe pairs, angles and rounds exactly alike.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/host_device.h"

namespace kiln::ops {

// The elements of a rot_dim-wide slice that pair i (of rot_dim / 2) rotates together: adjacent
// (2i, 2i+1) when interleaved (GPT-J style: the DeepSeek-V3 / Kimi checkpoints), else the halves
// (i, i + rot_dim/2) (NeoX style).
struct RopePair {
  int64_t a, b;
};
KILN_HD RopePair rope_pair(int64_t i, int64_t half, bool interleaved) {
  return interleaved ? RopePair{2 * i, 2 * i + 1} : RopePair{i, i + half};
}

// cos and sin of one pair's angle, times YaRN's attention factor.
struct RopeCosSin {
  float c, s;
};
KILN_HD RopeCosSin rope_cos_sin(float inv_freq, int32_t position, float attention_factor) {
  // As transformers: the angle is formed in f32; precise sin/cos on the GPU (not the intrinsics).
  const float ang = inv_freq * static_cast<float>(position);
  float s, c;
#if defined(__CUDA_ARCH__)
  sincosf(ang, &s, &c);
#else
  c = std::cos(ang);
  s = std::sin(ang);
#endif
  return {c * attention_factor, s * attention_factor};
}

// Rotates the pair (xa, xb) in place.
KILN_HD void rope_rotate(float& xa, float& xb, RopeCosSin r) {
  const float a = xa, b = xb;
  xa = a * r.c - b * r.s;
  xb = b * r.c + a * r.s;
}

}  // namespace kiln::ops

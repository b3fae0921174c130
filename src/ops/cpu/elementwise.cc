// Embedding, RMSNorm, residual add, SwiGLU, RoPE, log-softmax.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/rope_math.h"

namespace kiln::ops::cpu {

void copy(const CopyParams& p) {
  const int64_t rep = p.src_repeat > 1 ? p.src_repeat : 1;
  for (int64_t r = 0; r < p.rows; ++r) std::copy_n(p.src + r / rep * p.src_stride, p.cols, p.dst + r * p.dst_stride);
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill_random(const Tensor& t, uint64_t seed, float scale) {
  const int64_t n = t.numel();
  KILN_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "fill_random: unsupported dtype {}", dtype_name(t.dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float u =
        static_cast<float>(mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    const float v = (2.0f * u - 1.0f) * scale;
    if (t.dtype == DType::F32)
      t.as<float>()[i] = v;
    else
      t.as<uint16_t>()[i] = f32_to_bf16(v);
  }
}

void embedding(const EmbeddingParams& p) {
  const size_t esz = dtype_size(p.table_dtype);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t id = p.ids[t] - p.vocab_begin;
    if (p.zero_outside && (id < 0 || id >= p.vocab)) {
      std::fill_n(p.out + t * p.hidden, p.hidden, 0.0f);
      continue;
    }
    KILN_CHECK(id >= 0 && id < p.vocab, "token id {} is outside the vocabulary [0, {})", id, p.vocab);
    const auto* row = static_cast<const char*>(p.table) + static_cast<size_t>(id) * static_cast<size_t>(p.hidden) * esz;
    convert_to_f32(p.table_dtype, row, p.out + t * p.hidden, static_cast<size_t>(p.hidden));
  }
}

void rms_norm(const RmsNormParams& p) {
  std::vector<float> w(static_cast<size_t>(p.dim));
  convert_to_f32(p.weight_dtype, p.weight, w.data(), w.size());
  const int64_t xs = p.x_stride ? p.x_stride : p.dim, os = p.out_stride ? p.out_stride : p.dim;
#pragma omp parallel for if (p.rows > 16)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * xs;
    float* o = p.out + r * os;
    std::vector<float> row;  // x + residual when `sum` does not keep it
    if (p.residual) {        // exactly add() then the norm of the sum
      float* s = p.sum ? p.sum + r * xs : (row.resize(static_cast<size_t>(p.dim)), row.data());
      for (int64_t i = 0; i < p.dim; ++i) s[i] = x[i] + p.residual[r * xs + i];
      x = s;
    }
    double ss = 0;
    for (int64_t i = 0; i < p.dim; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(p.dim)) + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) o[i] = w[static_cast<size_t>(i)] * (x[i] * inv);
  }
}

void add(const AddParams& p) {
  for (int64_t i = 0; i < p.n; ++i) p.out[i] = p.a[i] + p.b[i];
}

void take_tokens(const TakeTokensParams& p) {
  for (int64_t i = 0; i < p.n; ++i)
    if (p.from[i] >= 0) p.ids[i] = p.src[p.from[i]];
}

void swiglu(const SwigluParams& p) {
#pragma omp parallel for if (p.rows > 16)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* g = p.gate_up + r * 2 * p.inter;
    const float* u = g + p.inter;
    float* o = p.out + r * p.inter;
    for (int64_t i = 0; i < p.inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void rope(const RopeParams& p) {
  const int64_t half = p.rot_dim / 2;
  std::vector<RopeCosSin> rot(static_cast<size_t>(half));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i)
      rot[static_cast<size_t>(i)] = rope_cos_sin(p.inv_freq[i], p.positions[t], p.attention_factor);
    for (int64_t h = 0; h < p.num_heads; ++h) {
      float* x = p.x + t * p.token_stride + h * p.head_stride;
      for (int64_t i = 0; i < half; ++i) {
        const RopePair ab = rope_pair(i, half, p.interleaved);
        rope_rotate(x[ab.a], x[ab.b], rot[static_cast<size_t>(i)]);
      }
    }
  }
}

void log_softmax(const LogSoftmaxParams& p) {
#pragma omp parallel for if (p.rows > 4)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* l = p.logits + r * p.vocab;
    float* o = p.out + r * p.vocab;
    float mx = -INFINITY;
    for (int64_t i = 0; i < p.vocab; ++i) mx = std::max(mx, l[i]);
    double sum = 0;
    for (int64_t i = 0; i < p.vocab; ++i) sum += std::exp(static_cast<double>(l[i] - mx));
    const float lse = mx + static_cast<float>(std::log(sum));
    for (int64_t i = 0; i < p.vocab; ++i) o[i] = l[i] - lse;
  }
}

}  // namespace kiln::ops::cpu

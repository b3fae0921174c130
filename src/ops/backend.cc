// The Backend interface's host-side defaults: backends whose ops finish when they return (the CPU)
// have nothing to overlap, so a download completes at once and marks read the host clock.
#include "ops/backend.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kiln::ops {

std::shared_ptr<void> Backend::start_download(const Tensor& src) {
  auto bytes = std::make_shared<std::vector<char>>(src.nbytes());
  download(bytes->data(), src);
  return bytes;
}

void Backend::finish_download(const std::shared_ptr<void>& started, void* dst) {
  const auto& bytes = *static_cast<const std::vector<char>*>(started.get());
  std::memcpy(dst, bytes.data(), bytes.size());
}

std::shared_ptr<void> Backend::mark() {
  synchronize();
  return std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
}

double Backend::elapsed_seconds(const std::shared_ptr<void>& a, const std::shared_ptr<void>& b) {
  using T = std::chrono::steady_clock::time_point;
  return std::chrono::duration<double>(*static_cast<const T*>(b.get()) - *static_cast<const T*>(a.get())).count();
}

void Backend::expert_slice(const ExpertSliceParams& p) {
  if (p.n == 0) return;
  const Tensor ids{p.topk_ids, DType::I32, {p.n}, device()}, wts{p.topk_weights, DType::F32, {p.n}, device()};
  std::vector<int32_t> id(static_cast<size_t>(p.n));
  std::vector<float> w(static_cast<size_t>(p.n));
  download(id.data(), ids);
  download(w.data(), wts);
  for (size_t i = 0; i < id.size(); ++i) {
    const int64_t local = id[i] - p.begin;
    const bool mine = local >= 0 && local < p.count;
    id[i] = mine ? static_cast<int32_t>(local) : 0;
    if (!mine) w[i] = 0.0f;
  }
  upload(ids, id.data());
  upload(wts, w.data());
}

void Backend::attention_merge(const AttentionMergeParams& p) {
  const int64_t P = p.num_parts, R = p.rows, D = p.dim;
  if (R * D == 0) return;
  std::vector<float> parts(static_cast<size_t>(P * R * D)), lse(static_cast<size_t>(P * R)),
      out(static_cast<size_t>(R * D), 0.0f);
  download(parts.data(), Tensor{const_cast<float*>(p.parts), DType::F32, {P * R * D}, device()});
  download(lse.data(), Tensor{const_cast<float*>(p.lse), DType::F32, {P * R}, device()});
  for (int64_t r = 0; r < R; ++r) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t q = 0; q < P; ++q) top = std::max(top, lse[static_cast<size_t>(q * R + r)]);
    if (std::isinf(top) && top < 0) continue;  // no keys anywhere: zeros
    double total = 0;
    for (int64_t q = 0; q < P; ++q) total += std::exp(static_cast<double>(lse[static_cast<size_t>(q * R + r)] - top));
    for (int64_t q = 0; q < P; ++q) {
      const auto w =
          static_cast<float>(std::exp(static_cast<double>(lse[static_cast<size_t>(q * R + r)] - top)) / total);
      for (int64_t d = 0; d < D; ++d)
        out[static_cast<size_t>(r * D + d)] += w * parts[static_cast<size_t>((q * R + r) * D + d)];
    }
  }
  upload(Tensor{p.out, DType::F32, {R * D}, device()}, out.data());
}

}  // namespace kiln::ops

#include "model/host_weight.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/quant.h"

namespace kiln {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return a == 0 ? 0 : (a - 1) / b + 1;
}

HostWeight densified(const HostWeight& w) {
  if (!w.quantized()) return w;
  HostWeight d;
  d.n = w.n;
  d.k = w.k;
  d.dense = dequantize(w);
  return d;
}

bool same_kind(const HostWeight& a, const HostWeight& b) {
  return a.dtype == b.dtype && a.block_k == b.block_k && a.scale_dtype == b.scale_dtype && a.k == b.k;
}

void append(HostWeight& out, const HostWeight& part) {
  out.dense.insert(out.dense.end(), part.dense.begin(), part.dense.end());
  out.codes.insert(out.codes.end(), part.codes.begin(), part.codes.end());
  out.scale.insert(out.scale.end(), part.scale.begin(), part.scale.end());
}

}  // namespace

int64_t HostWeight::grid_n() const {
  return quantized() ? ceil_div(n, block_n) : 0;
}
int64_t HostWeight::grid_k() const {
  return quantized() ? ceil_div(k, block_k) : 0;
}

std::vector<float> dequantize(const HostWeight& w) {
  if (!w.quantized()) return w.dense;
  std::vector<float> out(static_cast<size_t>(w.n * w.k));
  ops::dequantize_rows(w.codes.data(), w.dtype, w.host_scales(), w.n, w.k, 0, w.n, out.data());
  return out;
}

HostWeight with_unit_block_rows(HostWeight w) {
  if (!w.quantized() || w.block_n == 1) return w;
  const int64_t gk = w.grid_k();
  std::vector<float> s(static_cast<size_t>(w.n * gk));
  for (int64_t r = 0; r < w.n; ++r) std::copy_n(w.scale.begin() + (r / w.block_n) * gk, gk, s.begin() + r * gk);
  w.scale = std::move(s);
  w.block_n = 1;
  return w;
}

HostWeight concat_rows(std::vector<HostWeight> parts) {
  KILN_CHECK(!parts.empty(), "internal: concat_rows of nothing");
  bool uniform = true;
  for (const HostWeight& p : parts) {
    KILN_CHECK(p.k == parts[0].k, "internal: stacking weights of {} and {} columns", parts[0].k, p.k);
    uniform = uniform && same_kind(p, parts[0]);
  }
  if (!uniform)
    for (HostWeight& p : parts) p = densified(p);
  if (parts[0].quantized()) {
    // Stacked grids line up only when every part but the last ends on a block edge of one block_n.
    bool aligned = true;
    for (size_t i = 0; i < parts.size(); ++i)
      aligned = aligned && parts[i].block_n == parts[0].block_n &&
                (i + 1 == parts.size() || parts[i].n % parts[i].block_n == 0);
    if (!aligned)
      for (HostWeight& p : parts) p = with_unit_block_rows(std::move(p));
  }
  HostWeight out = parts[0];
  out.dense.clear();
  out.codes.clear();
  out.scale.clear();
  out.n = 0;
  for (const HostWeight& p : parts) {
    append(out, p);
    out.n += p.n;
  }
  return out;
}

HostWeight stack_experts(std::vector<HostWeight> experts) {
  KILN_CHECK(!experts.empty(), "internal: stack_experts of nothing");
  bool uniform = true, same_block = true;
  for (const HostWeight& e : experts) {
    KILN_CHECK(e.n == experts[0].n && e.k == experts[0].k, "internal: experts of different shapes");
    uniform = uniform && same_kind(e, experts[0]);
    same_block = same_block && e.block_n == experts[0].block_n;
  }
  for (HostWeight& e : experts) {
    if (!uniform) e = densified(e);
    if (uniform && !same_block) e = with_unit_block_rows(std::move(e));
  }
  HostWeight out = experts[0];
  out.dense.clear();
  out.codes.clear();
  out.scale.clear();
  out.dense.reserve(experts[0].dense.size() * experts.size());
  out.codes.reserve(experts[0].codes.size() * experts.size());
  out.scale.reserve(experts[0].scale.size() * experts.size());
  // Each expert is freed once appended, so a layer's experts are held about once, not twice (a
  // DeepSeek-V3 FP8 layer's are 11 GB).
  for (HostWeight& e : experts) {
    append(out, e);
    e = HostWeight{};
  }
  return out;  // n, k stay one expert's
}

HostWeight quantize_fp8(const HostWeight& dense, int64_t block_n, int64_t block_k) {
  KILN_CHECK(!dense.quantized(), "internal: quantize_fp8 of a weight already quantized");
  HostWeight q;
  q.n = dense.n;
  q.k = dense.k;
  q.dtype = DType::F8E4M3;
  q.block_n = block_n;
  q.block_k = block_k;
  q.scale_dtype = DType::F32;
  const int64_t gn = ceil_div(q.n, block_n), gk = ceil_div(q.k, block_k);
  q.scale.assign(static_cast<size_t>(gn * gk), 1.0f);
  q.codes.resize(static_cast<size_t>(q.n * q.k));
  for (int64_t bi = 0; bi < gn; ++bi)
    for (int64_t bj = 0; bj < gk; ++bj) {
      const int64_t r1 = std::min(q.n, (bi + 1) * block_n), c1 = std::min(q.k, (bj + 1) * block_k);
      float amax = 0.0f;
      for (int64_t r = bi * block_n; r < r1; ++r)
        for (int64_t c = bj * block_k; c < c1; ++c) amax = std::max(amax, std::fabs(dense.dense[r * q.k + c]));
      const float s = amax > 0.0f && std::isfinite(amax) ? amax / 448.0f : 1.0f;
      q.scale[static_cast<size_t>(bi * gk + bj)] = s;
      for (int64_t r = bi * block_n; r < r1; ++r)
        for (int64_t c = bj * block_k; c < c1; ++c)
          q.codes[static_cast<size_t>(r * q.k + c)] = f32_to_fp8e4m3(dense.dense[r * q.k + c] / s);
    }
  return q;
}

OwnedTensor upload_plain(ops::Backend& be, const std::string& what, const std::vector<float>& v, Shape shape,
                         DType dtype) {
  OwnedTensor t = be.alloc(dtype, std::move(shape));
  KILN_CHECK(static_cast<size_t>(t.t.numel()) == v.size(), "internal: {} size mismatch", what);
  if (dtype == DType::F32) {
    be.upload(t.t, v.data());
  } else {
    KILN_CHECK(dtype == DType::BF16, "internal: unsupported weight dtype {}", dtype_name(dtype));
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    be.upload(t.t, h.data());
  }
  return t;
}

Weight upload_weight(ops::Backend& be, const std::string& what, const HostWeight& h, int64_t experts) {
  const int64_t E = std::max<int64_t>(experts, 1);
  auto shape = [&](int64_t rows, int64_t cols) { return experts > 0 ? Shape{E, rows, cols} : Shape{rows, cols}; };
  if (!h.quantized()) return upload_plain(be, what, h.dense, shape(h.n, h.k), be.weight_dtype());
  Weight w = be.alloc(h.dtype, shape(h.n, ops::weight_row_elems(h.dtype, h.k)));
  KILN_CHECK(static_cast<size_t>(w.t.numel()) * dtype_size(h.dtype) == h.codes.size(),
             "internal: {} code size mismatch", what);
  be.upload(w.t, h.codes.data());
  w.scale = be.alloc(h.scale_dtype, shape(h.grid_n(), h.grid_k()));
  KILN_CHECK(static_cast<size_t>(w.scale.t.numel()) == h.scale.size(), "internal: {} scale size mismatch", what);
  if (h.scale_dtype == DType::F32) {
    be.upload(w.scale.t, h.scale.data());
  } else {
    std::vector<uint16_t> b(h.scale.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(h.scale[i]);
    be.upload(w.scale.t, b.data());
  }
  w.block_n = h.block_n;
  w.block_k = h.block_k;
  return w;
}

}  // namespace kiln

// The quantized decode paths' bandwidth (issue 40): one activation row through linear (the GEMV)
// and one token through moe (the decode kernels) on bf16, FP8 block-scaled and INT4 group-wise
// weights, each as bytes read (weights + scales) over device time, beside the copy bandwidth
// measured in the same run (bytes read + written per second of a 1 GiB device copy).
// Usage: kiln-quant-bench [--reps N]   (prints a table; no assertions: a measurement, not a test)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_ceilings.h"
#include "ops/backend.h"

namespace {

using kiln::DType;
using kiln::ops::Backend;
using kiln::ops::OwnedTensor;
using kiln::ops::WeightScales;

// Deterministic bytes (xorshift); e4m3 codes avoid the NaN pattern S.1111.111.
std::vector<uint8_t> random_bytes(size_t n, uint64_t seed, bool fp8) {
  std::vector<uint8_t> v(n);
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
    uint8_t b = static_cast<uint8_t>(z >> 24);
    if (fp8) b &= 0xb7;  // exponent <= 6 and sign: |v| < 1, never NaN
    v[i] = b;
  }
  return v;
}

struct Weight {
  OwnedTensor w, s;
  DType dtype = DType::BF16;
  WeightScales scales;
  double bytes = 0;  // weights + scales
};

// An [mats * n, k] weight of `kind` (0 bf16, 1 fp8 128x128, 2 int4 1x32 bf16 scales).
Weight make_weight(Backend& be, int kind, int64_t mats, int64_t n, int64_t k, uint64_t seed) {
  Weight r;
  if (kind == 0) {
    r.w = be.alloc(DType::BF16, {mats * n, k});
    be.fill_random(r.w.t, seed, 0.05f);
    r.bytes = static_cast<double>(mats * n * k) * 2;
    return r;
  }
  if (kind == 1) {
    r.dtype = DType::F8E4M3;
    r.w = be.alloc(DType::F8E4M3, {mats * n, k});
    be.upload(r.w.t, random_bytes(static_cast<size_t>(mats * n * k), seed, true).data());
    const int64_t grid = mats * ((n + 127) / 128) * ((k + 127) / 128);
    r.s = be.alloc(DType::F32, {grid});
    be.fill_random(r.s.t, seed + 1, 0.01f);
    r.scales = {r.s.t.data, DType::F32, 128, 128};
    r.bytes = static_cast<double>(mats * n * k) + static_cast<double>(grid) * 4;
    return r;
  }
  r.dtype = DType::I4X8;
  r.w = be.alloc(DType::I4X8, {mats * n, k / 8});
  be.upload(r.w.t, random_bytes(static_cast<size_t>(mats * n * k / 2), seed, false).data());
  const int64_t grid = mats * n * (k / 32);
  r.s = be.alloc(DType::BF16, {grid});
  be.fill_random(r.s.t, seed + 1, 0.01f);
  r.scales = {r.s.t.data, DType::BF16, 1, 32};
  r.bytes = static_cast<double>(mats * n * k) / 2 + static_cast<double>(grid) * 2;
  return r;
}

template <typename F>
double seconds_per_call(Backend& be, F&& f, int reps) {
  for (int i = 0; i < 3; ++i) f();  // warm-up (scratch, caches of the kernel plan)
  auto a = be.mark();
  for (int i = 0; i < reps; ++i) f();
  auto b = be.mark();
  return be.elapsed_seconds(a, b) / reps;
}

const char* kKinds[] = {"bf16", "fp8 128x128", "int4 g32"};

}  // namespace

int main(int argc, char** argv) {
  int reps = 50;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  auto be = kiln::ops::make_cuda_backend();
  const double copy = kiln::bench::measure_copy_gbps(1.0);
  std::printf("copy bandwidth (1 GiB device copy, read + written): %.0f GB/s\n\n", copy);
  std::printf("%-30s %-12s %10s %10s %9s %8s\n", "op", "weights", "MB read", "us", "GB/s", "of copy");
  // GEMV shapes: DeepSeek-V3's dense gate/up (36864 x 7168) and o_proj-like (7168 x 16384),
  // Moonlight's q + kv_a (2112 x 2048).
  struct L {
    int64_t n, k;
  };
  for (L l : {L{36864, 7168}, L{7168, 16384}, L{2112, 2048}})
    for (int kind = 0; kind < 3; ++kind) {
      Weight w = make_weight(*be, kind, 1, l.n, l.k, 7);
      OwnedTensor x = be->alloc(DType::F32, {l.k}), y = be->alloc(DType::F32, {l.n});
      be->fill_random(x.t, 3, 1.0f);
      kiln::ops::LinearParams p{x.f32(), 0, w.w.t.data, w.dtype, y.f32(), 0, 1, l.n, l.k};
      p.w_scales = w.scales;
      const double s = seconds_per_call(
          *be, [&] { be->linear(p); }, reps);
      const std::string op = "linear 1 x " + std::to_string(l.n) + " x " + std::to_string(l.k);
      std::printf("%-30s %-12s %10.1f %10.1f %9.0f %7.0f%%\n", op.c_str(), kKinds[kind], w.bytes / 1e6, s * 1e6,
                  w.bytes / s / 1e9, 100.0 * w.bytes / s / 1e9 / copy);
    }
  // MoE decode, one token, Moonlight-16B-A3B widths: 64 experts (top 6) of 2048 / 1408, two shared
  // experts (2816). Bytes: the 6 chosen experts' and the shared experts' weights.
  const int64_t H = 2048, I = 1408, E = 64, K = 6, S = 2816;
  for (int kind = 0; kind < 3; ++kind) {
    Weight gu = make_weight(*be, kind, E, 2 * I, H, 11), dn = make_weight(*be, kind, E, H, I, 12);
    Weight sgu = make_weight(*be, kind, 1, 2 * S, H, 13), sdn = make_weight(*be, kind, 1, H, S, 14);
    OwnedTensor x = be->alloc(DType::F32, {H}), out = be->alloc(DType::F32, {H});
    OwnedTensor ids = be->alloc(DType::I32, {K}), wts = be->alloc(DType::F32, {K});
    const std::vector<int32_t> idv = {3, 17, 29, 40, 51, 62};
    const std::vector<float> wv(K, 0.3f);
    be->upload(ids.t, idv.data());
    be->upload(wts.t, wv.data());
    be->fill_random(x.t, 5, 1.0f);
    kiln::ops::MoeParams p{
        x.f32(), ids.t.as<int32_t>(), wts.f32(), gu.w.t.data, dn.w.t.data, gu.dtype, out.f32(), 1, H, I, E, K};
    p.w_gate_up_scales = gu.scales, p.w_down_scales = dn.scales;
    p.w_shared_gate_up = sgu.w.t.data, p.w_shared_down = sdn.w.t.data, p.shared_inter = S;
    p.w_shared_gate_up_scales = sgu.scales, p.w_shared_down_scales = sdn.scales;
    const double bytes = (gu.bytes + dn.bytes) * K / E + sgu.bytes + sdn.bytes;
    const double s = seconds_per_call(
        *be, [&] { be->moe(p); }, reps);
    std::printf("%-30s %-12s %10.1f %10.1f %9.0f %7.0f%%\n", "moe 1 token, Moonlight", kKinds[kind], bytes / 1e6,
                s * 1e6, bytes / s / 1e9, 100.0 * bytes / s / 1e9 / copy);
  }
  return 0;
}

// kiln-load-pattern-bench: how fast the prefill expert GEMMs' weight-load pattern can stream from
// HBM with no GEMM around it, for each weight layout one might store. The question it answers:
// would re-laying out the expert weights (tiles contiguous per k-step, as some engines pre-pack
// them) beat reading them row-major, 128 bytes of each of a CTA's 256 rows per step?
//
// Pattern (moe_wgmma.cu's): one CTA per 256 weight rows of an expert, 256 threads, a 4-stage
// cp.async ring of 32 KB stages; each step lands 32 KB, then (optionally) the CTA spins for about
// one step's wgmma time before it issues the next copy. Every thread's 8 source pointers are fixed
// before the loop and advance by a constant per step, as the real kernel's are: computing each
// copy's address per step (64-bit divisions) made the first version of this bench issue-bound
// and show a false 39-52% advantage for the contiguous layout (H200, session 20).
// Layouts of an expert's [rows, K] bf16 matrix:
//   row-major, c bytes of each row per step (c = 128: the kernel; larger c: fewer rows a step);
//   tiled: each CTA's 32 KB of a step contiguous;
//   blocked: 16 rows x 128 bytes contiguous (2 KB blocks), [rows / 16][K / 64][16][64].
// "+ A rows": each step also copies the activation panel a real CTA multiplies, 128 rows x 128 B of
// its expert's row tile (16 KB, shared by the expert's column tiles, so mostly from L2), which is
// the rest of the real kernel's traffic; GB/s count the weights alone.
// Shapes: Moonlight's 64 experts, down [2048, 1408] and gate/up [2816, 2048]. Caches are flushed
// between launches; the best of 4 timed launches is printed.
// Build: part of the CUDA build (bench/CMakeLists.txt). Run: kiln-load-pattern-bench [out.json].
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kStages = 4, kStageBytes = 32768, kABytes = 16384, kThreads = 256;
constexpr int kCopies = kStageBytes / 16 / kThreads;  // 16-byte weight copies per thread and step
constexpr int kACopies = kABytes / 16 / kThreads;     // and activation copies, with A rows
enum Layout : int { kRowMajor, kTiled, kBlocked16 };

__device__ __forceinline__ void copy16(uint32_t dst, const char* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// grid: experts x (rows / (kStageBytes / c)) CTAs. `spin`: clock cycles per step standing in for
// the MMAs. a: null, or activations [experts x 128 rows, row_bytes] (each expert's row tile). `sink`
// is written only if the loaded bytes sum to a value they never do.
__global__ void __launch_bounds__(kThreads, 1)
    load_kernel(const char* w, const char* a, int64_t rows, int64_t row_bytes, int c, Layout layout, int spin,
                uint64_t* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const int stage_bytes = kStageBytes + (a ? kABytes : 0);
  const int cta_rows = kStageBytes / c;
  const int64_t ctas_per_expert = rows / cta_rows, e = blockIdx.x / ctas_per_expert, ct = blockIdx.x % ctas_per_expert;
  const int steps = static_cast<int>(row_bytes / c);
  const char* src[kCopies];
  int64_t stride = c;
  for (int q = 0; q < kCopies; ++q) {
    const int idx = threadIdx.x + q * kThreads;  // this copy's 16-byte chunk of the stage
    const char* expert = w + e * rows * row_bytes;
    if (layout == kRowMajor) {
      const int r = idx / (c / 16), chunk = idx % (c / 16);
      src[q] = expert + (ct * cta_rows + r) * row_bytes + chunk * 16;
    } else if (layout == kTiled) {
      src[q] = expert + ct * steps * int64_t{kStageBytes} + idx * 16;
      stride = kStageBytes;
    } else {
      const int64_t row = ct * cta_rows + idx / 8;
      src[q] = expert + (row / 16) * (row_bytes / 128) * 2048 + (row % 16) * 128 + (idx % 8) * 16;
      stride = 2048;
    }
  }
  const char* a_src[kACopies];
  for (int q = 0; q < kACopies && a; ++q) {
    const int idx = threadIdx.x + q * kThreads;  // 16-byte chunk idx % 8 of tile row idx / 8
    a_src[q] = a + (e * 128 + idx / 8) * row_bytes + (idx % 8) * 16;
  }
  auto issue = [&](int step) {
    if (step < steps) {
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + (step % kStages) * stage_bytes;
#pragma unroll
      for (int q = 0; q < kCopies; ++q) copy16(dst + (threadIdx.x + q * kThreads) * 16, src[q] + step * stride);
      if (a) {
#pragma unroll
        for (int q = 0; q < kACopies; ++q)
          copy16(dst + kStageBytes + (threadIdx.x + q * kThreads) * 16, a_src[q] + step * 128);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  uint64_t sum = 0;
  for (int step = 0; step < steps; ++step) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    sum += smem[(step % kStages) * stage_bytes + threadIdx.x * 4];
    for (const long long t0 = clock64(); clock64() - t0 < spin;) {
    }
    __syncthreads();
    issue(step + kStages - 1);
  }
  if (sum == 12345) *sink = sum;
}

#define CHECK(expr)                                                                             \
  do {                                                                                          \
    cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "kiln-load-pattern-bench: %s: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  constexpr int64_t kExperts = 64;
  struct Shape {
    const char* name;
    int64_t rows, k;
  };
  const Shape shapes[] = {{"down", 2048, 1408}, {"gate/up", 2816, 2048}};
  char *w = nullptr, *a = nullptr, *flush = nullptr;
  uint64_t* sink = nullptr;
  const size_t w_bytes = kExperts * 2816 * 2048 * 2, a_bytes = kExperts * 128 * 2048 * 2,
               flush_bytes = size_t{256} << 20;
  CHECK(cudaMalloc(&w, w_bytes));
  CHECK(cudaMemset(w, 1, w_bytes));
  CHECK(cudaMalloc(&a, a_bytes));
  CHECK(cudaMemset(a, 1, a_bytes));
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMalloc(&sink, sizeof(uint64_t)));
  CHECK(cudaFuncSetAttribute(load_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kStages * (kStageBytes + kABytes)));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::string json = "[";
  struct Variant {
    Layout layout;
    int c;
    const char* name;
    bool with_a = false;
  };
  const Variant variants[] = {{kRowMajor, 128, "row-major, 128 B a row"},   {kRowMajor, 256, "row-major, 256 B a row"},
                              {kTiled, 128, "tiled, 32 KB contiguous"},     {kBlocked16, 128, "16-row 2 KB blocks"},
                              {kRowMajor, 128, "row-major + A rows", true}, {kTiled, 128, "tiled + A rows", true}};
  for (const Shape& s : shapes) {
    const int64_t row_bytes = s.k * 2, bytes = kExperts * s.rows * row_bytes;
    for (int spin : {0, 900}) {
      for (const Variant& v : variants) {
        if (row_bytes % v.c || s.rows % (kStageBytes / v.c)) continue;
        const auto grid = static_cast<unsigned>(kExperts * (s.rows / (kStageBytes / v.c)));
        float best = 1e30f;
        for (int it = 0; it < 5; ++it) {
          CHECK(cudaMemset(flush, it, flush_bytes));
          CHECK(cudaEventRecord(start));
          load_kernel<<<grid, kThreads, kStages*(kStageBytes + (v.with_a ? kABytes : 0))>>>(
              w, v.with_a ? a : nullptr, s.rows, row_bytes, v.c, v.layout, spin, sink);
          CHECK(cudaEventRecord(stop));
          CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          CHECK(cudaEventElapsedTime(&ms, start, stop));
          if (it > 0 && ms < best) best = ms;  // the first launch warms up
        }
        const double gbps = static_cast<double>(bytes) / (best * 1e6);
        std::printf("%-8s spin %4d cycles  %-24s %5u CTAs: %7.1f us  %6.0f GB/s\n", s.name, spin, v.name, grid,
                    best * 1e3, gbps);
        char row[256];
        std::snprintf(row, sizeof(row), "%s{\"shape\":\"%s\",\"spin\":%d,\"layout\":\"%s\",\"us\":%.2f,\"gbps\":%.1f}",
                      json.size() > 1 ? "," : "", s.name, spin, v.name, best * 1e3, gbps);
        json += row;
      }
    }
  }
  CHECK(cudaGetLastError());
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (!f) {
      std::fprintf(stderr, "kiln-load-pattern-bench: cannot write %s\n", argv[1]);
      return 1;
    }
    std::fprintf(f, "%s]\n", json.c_str());
    std::fclose(f);
  }
  return 0;
}

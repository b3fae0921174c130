// The sharded forward's small ops on the GPU (ops/params.h): expert_slice (expert parallelism
// keeping one rank's routed choices) and attention_merge (decode context parallelism's
// log-sum-exp merge of partial attention). Both are memory-trivial; they exist so that neither
// goes through the host (Backend's defaults), which would stall the stream.
#include <cmath>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace kiln::ops::cuda {
namespace {

__global__ void expert_slice_kernel(ExpertSliceParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.n) return;
  const int64_t local = p.topk_ids[i] - p.begin;
  const bool mine = local >= 0 && local < p.count;
  p.topk_ids[i] = mine ? static_cast<int32_t>(local) : 0;
  if (!mine) p.topk_weights[i] = 0.0f;
}

// One thread per (row, column): the parts' weights are recomputed per column, which is cheaper
// than a second pass for the handful of parts (ranks) there are.
__global__ void attention_merge_kernel(AttentionMergeParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * p.dim) return;
  const int64_t r = i / p.dim, d = i % p.dim;
  float top = -INFINITY;
  for (int64_t q = 0; q < p.num_parts; ++q) top = fmaxf(top, p.lse[q * p.rows + r]);
  if (top == -INFINITY) {  // no keys anywhere
    p.out[i] = 0.0f;
    return;
  }
  float total = 0.0f, acc = 0.0f;
  for (int64_t q = 0; q < p.num_parts; ++q) {
    const float w = expf(p.lse[q * p.rows + r] - top);
    total += w;
    acc += w * p.parts[(q * p.rows + r) * p.dim + d];
  }
  p.out[i] = acc / total;
}

}  // namespace

void expert_slice(const ExpertSliceParams& p, cudaStream_t s) {
  if (p.n) expert_slice_kernel<<<blocks_for(p.n, 256), 256, 0, s>>>(p);
}

void attention_merge(const AttentionMergeParams& p, cudaStream_t s) {
  const int64_t n = p.rows * p.dim;
  if (n) attention_merge_kernel<<<blocks_for(n, 256), 256, 0, s>>>(p);
}

}  // namespace kiln::ops::cuda

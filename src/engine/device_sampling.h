// Samples the rows of a step where the logits are (the backend's sample op, DESIGN.md §3): the
// per-row settings and penalty lists go up in one buffer, and only tokens and logprobs come
// back, so a [rows, vocab] logits block never crosses to the host.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "engine/sampler.h"
#include "engine/sequence.h"
#include "ops/backend.h"

namespace kiln {

// Rows sampled on the backend whose results are on their way to the host.
struct DeviceSamples {
  ops::OwnedTensor out;            // [token i32 | logprob f32 | top ids i32 | top logprobs f32] per row
  std::shared_ptr<void> download;  // Backend::start_download of `out`
  int64_t rows = 0, num_top = 0;
  std::vector<int64_t> wanted_top;  // per row: top logprobs asked for (-1: no logprobs at all)
  // [rows] on the backend: the sampled tokens, which the next step may read in place.
  const int32_t* tokens() const { return out.t.as<int32_t>(); }
};

// `logits` [seqs.size(), vocab] on `be`; row i is sampled for seqs[i] with its sampler's seed,
// draw number = its output length, and penalties over its prompt and output. Queues the work and
// the download and returns; finish_sampling waits for the results. One result per row.
DeviceSamples start_sampling(ops::Backend& be, const Tensor& logits, const std::vector<const Sequence*>& seqs);
std::vector<SampleResult> finish_sampling(ops::Backend& be, const DeviceSamples& samples);
// Both at once.
std::vector<SampleResult> sample_on_backend(ops::Backend& be, const Tensor& logits,
                                            const std::vector<const Sequence*>& seqs);

}  // namespace kiln

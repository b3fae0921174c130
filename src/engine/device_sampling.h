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

// `logits` [seqs.size(), vocab] on `be`; row i is sampled for seqs[i] with its sampler's seed,
// draw number = its output length, and penalties over its prompt and output. One result per row.
std::vector<SampleResult> sample_on_backend(ops::Backend& be, const Tensor& logits,
                                            const std::vector<const Sequence*>& seqs);

}  // namespace kiln

// ModelRunner (DESIGN.md §3): turns the scheduler's decisions into a ForwardBatch, runs the model
// over the paged pool and samples the rows that end a sequence, each with the sequence's own
// sampler (its seeded generator), so a request's tokens never depend on what else is batched.
#pragma once

#include <vector>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/deepseek_v3.h"

namespace kiln {

class ModelRunner {
 public:
  // `form`: Auto lets the model choose per step (expanded with prompts, absorbed for pure
  // decode); tests pin one form to compare schedules bit for bit.
  ModelRunner(DeepseekV3Model& model, LatentKvPool& pool, MlaForm form = MlaForm::Auto)
      : model_(model), pool_(pool), form_(form) {}

  // Runs one step; returns one result per scheduled sequence with `sample` set, in order.
  std::vector<SampleResult> run(const SchedulerOutput& out);

  // The step's plain data (block tables padded with block 0 to the longest).
  ForwardBatch build(const SchedulerOutput& out) const;

 private:
  DeepseekV3Model& model_;
  LatentKvPool& pool_;
  MlaForm form_;
};

}  // namespace kiln

// ModelRunner (DESIGN.md §3): turns the scheduler's decisions into a ForwardBatch, runs the model
// over the paged pool and samples the rows that end a sequence, each with the sequence's own
// sampler (its seeded generator), so a request's tokens never depend on what else is batched.
#pragma once

#include <vector>

#include <memory>

#include "engine/device_sampling.h"
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

  // Runs one step; returns one result per scheduled sequence with `sample` set, in order. A row
  // with drafts (num_draft > 0) gets an empty result; its logits [1 + num_draft, vocab] are
  // appended to `verify` instead, in order, for the speculator. With hidden taps set, `hidden`
  // gets one entry per scheduled sequence: for a speculating one, its rows' hidden states
  // [num_tokens + num_draft, taps, hidden] on the host; empty for the others.
  std::vector<SampleResult> run(const SchedulerOutput& out, std::vector<std::vector<float>>* verify = nullptr,
                                std::vector<std::vector<float>>* hidden = nullptr);
  // The target hidden states speculating sequences' rows hand their drafter (ForwardBatch::hidden_taps).
  void set_hidden_taps(std::vector<int32_t> taps) { taps_ = std::move(taps); }

  // A step queued on the backend whose sampled tokens the host has not read yet (the overlapped
  // loop). Every sampled row of such a step is sampled on the backend, and no row wants its
  // logits on the host: Engine overlaps only requests that allow it.
  struct InFlight {
    SchedulerOutput out;
    DeviceSamples samples;
    std::vector<const Sequence*> sampled;  // the sequence of each row of `samples`
    std::shared_ptr<void> start, end;      // device marks around the step's work
  };
  // Queues one step (inputs, forward, sampling, the tokens' download) and returns without waiting.
  // Tokens still pending from `prev` (kPendingToken) are read from its samples on the backend.
  InFlight launch(const SchedulerOutput& out, const InFlight* prev);
  // Waits for a launched step's tokens: one result per sampled sequence, in order.
  std::vector<SampleResult> collect(const InFlight& step);
  // Device time of the last step run or collected, from its first queued op to its last.
  double last_device_seconds() const { return last_device_seconds_; }

  // The step's plain data (block tables padded with block 0 to the longest); pending tokens are
  // taken from prev's samples.
  ForwardBatch build(const SchedulerOutput& out, const InFlight* prev = nullptr) const;

 private:
  DeepseekV3Model& model_;
  LatentKvPool& pool_;
  MlaForm form_;
  std::vector<int32_t> taps_;
  double last_device_seconds_ = 0;
};

}  // namespace kiln

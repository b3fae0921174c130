// The engine loop every front end uses (DESIGN.md §1): `kiln serve`, `kiln generate` and the
// benchmarks submit requests; one loop thread owns the scheduler, the KV pool and the prefix
// cache, and runs schedule -> forward + sample -> commit until no work is left. Other threads
// talk to it only through submit(), the per-request streams and stats().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/spec_policy.h"
#include "engine/speculator.h"
#include "engine/stream.h"
#include "kv/block_allocator.h"
#include "kv/kv_sizing.h"
#include "kv/radix_cache.h"
#include "model/deepseek_v3.h"

namespace kiln {

struct EngineConfig {
  int64_t block_size = 64;  // tokens per KV block
  kv::KvCacheSizing kv;     // how many blocks
  SchedulerConfig scheduler;
  bool prefix_caching = true;
  int64_t max_model_len = 0;  // longest sequence (0: the model's max_position_embeddings)
  MlaForm mla_form = MlaForm::Auto;
  bool cuda_graphs = true;  // replay decode steps from CUDA graphs where the backend has them
  // Schedule and queue step n+1 before reading step n's tokens (SGLang's overlap scheduler, vLLM's
  // async scheduling) whenever every request allows it (Engine::intake says which do).
  bool overlap_schedule = true;
  bool check_invariants = false;  // check the allocator and prefix cache after every step (tests)
  // Speculative decoding (null: off). Steps that verify drafts run on the serial loop: the
  // verifier needs each step's logits on the host before the next step's drafts.
  std::shared_ptr<Speculator> speculator;
  // How many drafts each step verifies (engine/spec_policy.h). Fixed here, so that a library
  // user gets the K it asked for; the command line defaults to adaptive.
  SpecPolicyConfig spec_policy;
};

// Speculative decoding over the engine's life (all zero without a speculator).
struct SpecDecodeStats {
  int64_t verifies = 0;  // sequence verifications (one per speculating row per step)
  int64_t draft_tokens = 0, accepted_tokens = 0;
  std::vector<int64_t> proposed_at, accepted_at;  // [K]: per draft position
  double draft_seconds = 0, verify_seconds = 0;   // drafting; steps with verify rows (their forward)
  SpecPolicyStats policy;                         // what the speculation policy decided
  // Tokens a verification emits on average: accepted drafts + the final token.
  double mean_accepted_length() const {
    return verifies ? static_cast<double>(accepted_tokens + verifies) / static_cast<double>(verifies) : 0.0;
  }
  double acceptance_rate() const {
    return draft_tokens ? static_cast<double>(accepted_tokens) / static_cast<double>(draft_tokens) : 0.0;
  }
};

// A consistent snapshot, taken by the loop after each step.
struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t blocks_total = 0, blocks_free = 0;
  int64_t blocks_cached = 0, blocks_cached_evictable = 0;  // held by the prefix cache
  int64_t block_size = 0, kv_tokens = 0;
  int64_t prefix_hit_tokens = 0, prefix_query_tokens = 0;  // over admissions (preempted ones again)
  int64_t preemptions = 0;
  int64_t requests_submitted = 0, requests_finished = 0, requests_aborted = 0;
  int64_t steps = 0, generated_tokens = 0;
  int64_t overlapped_steps = 0;  // steps queued before the step before them had its tokens read
  // Steps with any prefill (or recompute) tokens vs pure decode steps, and their wall time.
  int64_t prefill_steps = 0, prefill_tokens = 0, decode_steps = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  // Where the loop's time goes, summed over steps: choosing the batch; the forward with sampling
  // (inputs up, the model, tokens down: the device is busy for at most this long); committing
  // tokens, stop checks and streaming out.
  double schedule_seconds = 0, forward_seconds = 0, post_seconds = 0;
  // The device's time from each step's first queued op to its last: its busy time, in-step gaps
  // included (small with CUDA graphs).
  double device_seconds = 0;
  SpecDecodeStats spec;
};

// One line of acceptance statistics for logs and reports ("" when nothing was verified).
std::string spec_summary(const SpecDecodeStats& s);

class Engine {
 public:
  // Sizes and allocates the KV pool (logged in tokens) and starts the loop thread.
  Engine(DeepseekV3Model& model, EngineConfig cfg = {});
  ~Engine();  // stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  // Aborts what is still running (their streams get their final chunks, here) and joins the loop;
  // submit() refuses from then on. Idempotent.
  void stop();

  // Validates the request (throws kiln::Error naming the bad field) and queues it.
  RequestStream submit(Request req);
  void cancel(uint64_t request_id);
  EngineStats stats() const;
  // Blocks until no request is waiting or running.
  void wait_idle();

  const kv::KvCachePlan& kv_plan() const { return plan_; }
  int64_t max_model_len() const { return max_model_len_; }
  // The model's end-of-sequence ids (fixed at construction): where a constraint may end.
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const EngineConfig& config() const { return cfg_; }

 private:
  void loop();
  void intake();                              // moves submitted requests and cancels into the scheduler (loop thread)
  void step_run(const SchedulerOutput& out);  // forward + sample + commit of one schedule (times the forward)
  void finish(Sequence* seq, FinishReason reason, std::string error = {});
  void retire(Sequence* seq);  // a finished sequence leaves the scheduler and frees its KV
  void flush();                // pending outputs to their streams; drops finished sequences
  // A step's times: schedule, forward (with sampling) and post-processing (commit, streams).
  struct StepTimes {
    double schedule = 0, forward = 0, post = 0;
  };
  void publish_stats(const StepTimes& t, const SchedulerOutput& out, bool overlapped);
  // Waits for the step in flight and commits its tokens (adds to times' forward and post).
  void settle(StepTimes& times);
  void check_invariants() const;  // allocator, cache, and every block reference accounted for
  // The speculation policy's hooks (engine_spec.cc): this step's drafts per decode row (true when
  // any row drafts, so the step cannot overlap), and the step's measured time afterwards.
  bool plan_speculation();
  // A live request whose drafter reads the target's hidden states (MTP): every step of it then runs
  // on the serial loop, which is where the states are handed over, whether or not it drafts.
  bool taps_hidden_states() const;
  void observe_speculation(const SchedulerOutput& out, double seconds, double draft_seconds, bool timed);
  // A verified token with the logprobs its request asks for, from its row of the target's logits.
  SampleResult scored(const float* logits, int32_t token, const SamplingParams& p) const;

  DeepseekV3Model& model_;
  EngineConfig cfg_;
  kv::KvCachePlan plan_;
  int64_t max_model_len_ = 0;
  std::vector<int32_t> eos_ids_;

  // Loop-thread state.
  LatentKvPool pool_;
  std::unique_ptr<kv::BlockAllocator> alloc_;
  std::unique_ptr<kv::RadixCache> cache_;  // null without prefix caching
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> touched_;  // sequences with output to flush this iteration
  int64_t finished_ = 0, aborted_ = 0;
  double forward_seconds_ = 0;        // the last step_run's forward
  double flush_seconds_ = 0;          // the last flush, counted in the next step's post-processing
  double device_seconds_ = 0;         // the device's time on the steps settled so far
  SpecDecodeStats spec_;              // published with each step's stats
  int64_t extra_generated_ = 0;       // tokens verify rows emitted past their first, not yet published
  int64_t spec_logged_verifies_ = 0;  // spec_.verifies at the last log line
  std::chrono::steady_clock::time_point spec_logged_at_ = std::chrono::steady_clock::now();
  std::optional<ModelRunner::InFlight> inflight_;  // the overlapped loop's step whose tokens are not read yet
  int64_t unsafe_ = 0;                             // requests (in seqs_) that rule the overlap out
  // How many drafts each step verifies (with a speculator).
  std::unique_ptr<SpecPolicy> policy_;

  // Shared with submitters, under mu_.
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<uint64_t> cancels_;
  bool stop_ = false, busy_ = false;
  uint64_t next_id_ = 1;
  std::mt19937_64 seed_rng_;  // seeds for requests that give none
  EngineStats stats_;

  std::thread thread_;
};

}  // namespace kiln

// The engine's state of one request (nano-vllm's Sequence): its tokens, how many of them have
// latent KV in the pool, the blocks holding it, its sampler and its pending output.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/stop.h"
#include "engine/stream.h"
#include "kv/radix_cache.h"

namespace kiln {

// A token sampled by a step still in flight (the overlapped loop): its place in `tokens` is taken
// so the next step can be scheduled, and it is filled in when the step's results come back.
inline constexpr int32_t kPendingToken = -1;

struct Sequence {
  enum class Status { Waiting, Running, Finished };

  Sequence(uint64_t id, Request req, int64_t max_tokens, std::vector<int32_t> stop_ids,
           std::shared_ptr<StreamState> stream);

  uint64_t id;
  std::vector<int32_t> tokens;  // [prompt + output]
  int64_t num_prompt;
  int64_t max_tokens;  // output tokens allowed (resolved against the context limit)

  // KV state, owned by the scheduler. A preempted sequence drops all of it and recomputes.
  Status status = Status::Waiting;
  int64_t num_computed = 0;                    // leading tokens whose latent KV is in the pool
  std::vector<int32_t> block_table;            // pool blocks in order; one reference each
  kv::RadixCache::Node* cache_node = nullptr;  // deepest prefix-cache node this sequence locks
  int64_t num_cached_blocks = 0;               // leading blocks published to the prefix cache
  bool decoding = false;                       // sampled since its last admission: its steps are decode steps
  int64_t preemptions = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens the prefix cache served at first admission
  bool admitted_once = false;

  Sampler sampler;
  std::shared_ptr<TokenConstraint> constraint;  // may be null
  int64_t prompt_logprobs = -1;                 // alternatives per prompt token (-1: not asked)
  int64_t prompt_logprobs_done = 1;             // prompt tokens [1, this) already reported
  std::unique_ptr<Detokenizer> detokenizer;
  StopStringMatcher stop_strings;
  std::vector<int32_t> stop_ids;  // end-of-sequence ids (unless ignore_eos) and stop_token_ids
  std::shared_ptr<StreamState> stream;
  OutputChunk pending;  // output produced since the last flush to the stream
  std::optional<FinishReason> finish_reason;

  int64_t len() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output() const { return len() - num_prompt; }
  std::span<const int32_t> prompt() const { return {tokens.data(), static_cast<size_t>(num_prompt)}; }
  std::span<const int32_t> output() const { return {tokens.data() + num_prompt, static_cast<size_t>(num_output())}; }
  bool finished() const { return finish_reason.has_value(); }

  // Appends a sampled token to the output and to `pending`, and finishes the sequence when a
  // stop condition holds: a stop id, a stop string in the text, max_tokens or `max_len` tokens.
  void append(const SampleResult& r, int64_t max_len);
  // The same for the token sampled at position `pos`, whose place holds kPendingToken: later
  // pending places are dropped when it finishes the sequence.
  void resolve(int64_t pos, const SampleResult& r, int64_t max_len);
  int64_t steps_in_flight = 0;  // launched steps with this sequence whose results are not in yet
  bool overlap_safe = true;     // its sampling needs nothing from the host between steps
  // Speculation: the most drafts verified per decode step (0: plain decoding), and this step's.
  int64_t spec_tokens = 0;
  int64_t spec_k = 0;  // drafts the speculation policy chose for this step (<= spec_tokens)
  std::vector<int32_t> drafts;
  // Marks it finished (no-op when it already is) and fills the usage fields of `pending`.
  void finish(FinishReason reason, std::string error = {});
};

}  // namespace kiln

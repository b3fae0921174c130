// The per-request output stream between the engine thread (producer) and a front end thread
// (consumer): a thread-safe queue of OutputChunks plus a cancel flag the engine polls every step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/request.h"

namespace kiln {

struct StreamState {
  explicit StreamState(uint64_t request_id) : id(request_id) {}
  const uint64_t id;
  std::atomic<bool> cancel_requested{false};

  // Engine side: queue a chunk; the one with `finish` set must come last.
  void push(OutputChunk c);

  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> listener;  // called after each push (RequestStream::on_output)
  std::deque<OutputChunk> chunks;
  bool finished = false;  // the final chunk was queued
  bool drained = false;   // the final chunk was taken
};

// The consumer's handle. Dropping it before the request finished cancels the request (a client
// that went away), so its KV blocks come back.
class RequestStream {
 public:
  explicit RequestStream(std::shared_ptr<StreamState> s) : s_(std::move(s)) {}
  RequestStream(RequestStream&&) = default;
  RequestStream& operator=(RequestStream&& o) noexcept;
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;
  ~RequestStream();

  uint64_t id() const { return s_->id; }
  // Blocks until output arrives; returns everything pending merged into one chunk. nullopt once
  // the final chunk (finish set) has been returned.
  std::optional<OutputChunk> next();
  // As next(), waiting at most `wait`; nullopt when nothing arrived in time or done().
  std::optional<OutputChunk> next_for(std::chrono::milliseconds wait);
  // Asks the engine to stop the request; a final chunk with finish = abort follows (unless it had
  // already finished).
  void cancel();
  bool done() const;  // the final chunk was returned
  // Calls `fn` whenever output arrives (on the engine thread, or here when some is already
  // waiting), so that an event-driven consumer pulls with next_for(0) instead of waiting. `fn` must
  // be cheap and must not call back into this stream.
  void on_output(std::function<void()> fn);

 private:
  std::optional<OutputChunk> take(std::unique_lock<std::mutex>& lock);
  std::shared_ptr<StreamState> s_;
};

}  // namespace kiln

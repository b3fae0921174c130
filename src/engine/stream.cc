#include "engine/stream.h"

namespace kiln {

void OutputChunk::merge(OutputChunk&& later) {
  token_ids.insert(token_ids.end(), later.token_ids.begin(), later.token_ids.end());
  logprobs.insert(logprobs.end(), later.logprobs.begin(), later.logprobs.end());
  for (auto& t : later.top) top.push_back(std::move(t));
  prompt_logprobs.insert(prompt_logprobs.end(), later.prompt_logprobs.begin(), later.prompt_logprobs.end());
  for (auto& t : later.prompt_top) prompt_top.push_back(std::move(t));
  text += later.text;
  if (later.finish) {
    finish = later.finish;
    stop_token = later.stop_token;
    stop_string = std::move(later.stop_string);
    error = std::move(later.error);
    prompt_tokens = later.prompt_tokens;
    output_tokens = later.output_tokens;
    cached_prompt_tokens = later.cached_prompt_tokens;
  }
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
  }
  return "?";
}

void StreamState::push(OutputChunk c) {
  std::function<void()> wake;
  {
    std::lock_guard lock(mu);
    if (finished) return;
    finished = c.finish.has_value();
    chunks.push_back(std::move(c));
    wake = listener;
  }
  cv.notify_all();
  if (wake) wake();
}

void RequestStream::on_output(std::function<void()> fn) {
  bool waiting = false;
  {
    std::lock_guard lock(s_->mu);
    s_->listener = fn;
    waiting = !s_->chunks.empty();
  }
  if (waiting && fn) fn();
}

RequestStream& RequestStream::operator=(RequestStream&& o) noexcept {
  if (this != &o) {
    if (s_ && !done()) s_->cancel_requested = true;
    s_ = std::move(o.s_);
  }
  return *this;
}

RequestStream::~RequestStream() {
  if (s_ && !done()) s_->cancel_requested = true;
}

std::optional<OutputChunk> RequestStream::take(std::unique_lock<std::mutex>& lock) {
  if (s_->chunks.empty()) return std::nullopt;
  OutputChunk out = std::move(s_->chunks.front());
  s_->chunks.pop_front();
  while (!s_->chunks.empty()) {
    out.merge(std::move(s_->chunks.front()));
    s_->chunks.pop_front();
  }
  if (out.finish) s_->drained = true;
  return out;
}

std::optional<OutputChunk> RequestStream::next() {
  std::unique_lock lock(s_->mu);
  if (s_->drained) return std::nullopt;
  s_->cv.wait(lock, [&] { return !s_->chunks.empty(); });
  return take(lock);
}

std::optional<OutputChunk> RequestStream::next_for(std::chrono::milliseconds wait) {
  std::unique_lock lock(s_->mu);
  if (s_->drained) return std::nullopt;
  s_->cv.wait_for(lock, wait, [&] { return !s_->chunks.empty(); });
  return take(lock);
}

void RequestStream::cancel() {
  s_->cancel_requested = true;
}

bool RequestStream::done() const {
  std::lock_guard lock(s_->mu);
  return s_->drained;
}

}  // namespace kiln

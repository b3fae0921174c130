#include "bench/sse.h"

#include <nlohmann/json.hpp>

namespace kiln::bench {

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  if (bytes.empty()) return;
  size_t i = 0;
  if (skip_lf_ && bytes[0] == '\n') i = 1;
  skip_lf_ = false;
  while (i < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", i);
    if (end == std::string_view::npos) {
      partial_.append(bytes.substr(i));
      return;
    }
    if (partial_.empty()) {
      line(bytes.substr(i, end - i), events);
    } else {
      partial_.append(bytes.substr(i, end - i));
      line(partial_, events);
      partial_.clear();
    }
    i = end + 1;
    if (bytes[end] == '\r') {
      if (i < bytes.size() && bytes[i] == '\n')
        ++i;
      else if (i == bytes.size())
        skip_lf_ = true;
    }
  }
}

void SseParser::line(std::string_view l, std::vector<std::string>& events) {
  if (l.empty()) {
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.substr(0, 5) != "data:") return;  // comments, event:, id:, retry:
  l.remove_prefix(5);
  if (!l.empty() && l[0] == ' ') l.remove_prefix(1);
  if (has_data_) data_.push_back('\n');
  data_.append(l);
  has_data_ = true;
}

namespace {

const std::string* nonempty_string(const nlohmann::json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return nullptr;
  const auto* s = it->get_ptr<const std::string*>();
  return s->empty() ? nullptr : s;
}

}  // namespace

void apply_event(std::string_view data, double now_ms, StreamState& s) {
  if (data == "[DONE]") {
    s.done = true;
    return;
  }
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    if (s.error.empty()) s.error = "malformed event: " + std::string(data.substr(0, 200));
    return;
  }
  if (auto it = j.find("error"); it != j.end() && !it->is_null()) {
    if (s.error.empty()) s.error = "error event: " + it->dump().substr(0, 300);
    return;
  }
  if (auto it = j.find("usage"); it != j.end() && it->is_object()) {
    if (auto p = it->find("prompt_tokens"); p != it->end() && p->is_number_integer())
      s.usage_prompt_tokens = p->get<int64_t>();
    if (auto c = it->find("completion_tokens"); c != it->end() && c->is_number_integer())
      s.usage_completion_tokens = c->get<int64_t>();
  }
  auto ch = j.find("choices");
  if (ch == j.end() || !ch->is_array() || ch->empty() || !(*ch)[0].is_object()) return;
  const nlohmann::json& c = (*ch)[0];
  bool finished = false;
  if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) {
    s.finish_reason = f->get<std::string>();
    finished = true;
  }
  const std::string* text = nonempty_string(c, "text");
  bool role_only = false;
  if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
    for (const char* k : {"content", "reasoning_content", "reasoning"})
      if (!text) text = nonempty_string(*d, k);
    role_only = !text && d->contains("role");
  }
  if (text) s.text.append(*text);
  if (text || (!finished && !role_only)) s.event_ms.push_back(now_ms);
}

}  // namespace kiln::bench

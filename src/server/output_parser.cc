#include "server/output_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

namespace kiln::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

using Markers = ToolMarkers;
// DeepSeek's markers use U+FF5C (｜) and U+2581 (▁), written as UTF-8 here.
constexpr Markers kDeepSeek = {
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "calls\xE2\x96\x81"
    "begin\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "calls\xE2\x96\x81"
    "end\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "begin\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "end\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "sep\xEF\xBD\x9C>"};
constexpr Markers kKimi = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                           "<|tool_call_end|>", "<|tool_call_argument_begin|>"};

const Markers& markers(ToolFormat f) {
  return tool_markers(f);
}

// Length of the longest suffix of `s` that is a proper prefix of `m` (text that may still become `m`).
size_t held_suffix(std::string_view s, std::string_view m) {
  for (size_t k = std::min(s.size(), m.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == m.substr(0, k)) return k;
  return 0;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

const ToolMarkers& tool_markers(ToolFormat f) {
  return f == ToolFormat::KimiK2 ? kKimi : kDeepSeek;
}

std::optional<ToolFormat> parse_tool_format(const std::string& name) {
  for (ToolFormat f : {ToolFormat::None, ToolFormat::DeepSeekV3, ToolFormat::DeepSeekV31, ToolFormat::KimiK2})
    if (name == tool_format_name(f)) return f;
  return std::nullopt;
}

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::DeepSeekV3: return "deepseek_v3";
    case ToolFormat::DeepSeekV31: return "deepseek_v31";
    case ToolFormat::KimiK2: return "kimi_k2";
    default: return "none";
  }
}

std::string make_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

void ParsedDelta::append(ParsedDelta&& d) {
  content += d.content;
  reasoning += d.reasoning;
  for (auto& c : d.tool_calls) add_call(std::move(c));
}

void ParsedDelta::add_call(ParsedToolCall&& c) {
  if (c.id.empty() && !tool_calls.empty() && tool_calls.back().index == c.index)
    tool_calls.back().arguments += c.arguments;
  else
    tool_calls.push_back(std::move(c));
}

OutputParser::OutputParser(ToolFormat tools, bool reasoning, bool in_reasoning)
    : fmt_(tools), reasoning_(reasoning), state_(reasoning && in_reasoning ? State::Reasoning : State::Content) {}

ParsedDelta OutputParser::feed(std::string_view text) {
  buf_.append(text);
  ParsedDelta d;
  run(false, d);
  return d;
}

ParsedDelta OutputParser::finish() {
  ParsedDelta d;
  run(true, d);
  // An unterminated tool section: give the client the raw text rather than lose it.
  if (!buf_.empty()) (state_ == State::Reasoning ? d.reasoning : d.content) += buf_;
  buf_.clear();
  return d;
}

void OutputParser::run(bool final, ParsedDelta& out) {
  for (;;) {
    if (state_ == State::Reasoning) {
      const size_t p = buf_.find(kThinkClose);
      if (p != std::string::npos) {
        out.reasoning += buf_.substr(0, p);
        buf_.erase(0, p + kThinkClose.size());
        state_ = State::Content;
        continue;
      }
      const size_t keep = final ? 0 : held_suffix(buf_, kThinkClose);
      out.reasoning += buf_.substr(0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    if (state_ == State::Content) {
      // The earliest marker that switches state: a think opening, a tool section (or a bare call:
      // models sometimes skip the section marker).
      size_t best = std::string::npos, len = 0;
      State next = State::Content;
      auto consider = [&](std::string_view m, State s, bool consume) {
        const size_t p = buf_.find(m);
        if (p != std::string::npos && p < best) best = p, len = consume ? m.size() : 0, next = s;
      };
      if (reasoning_) consider(kThinkOpen, State::Reasoning, true);
      if (fmt_ != ToolFormat::None) {
        consider(markers(fmt_).section_begin, State::Tools, true);
        consider(markers(fmt_).call_begin, State::Tools, false);
      }
      if (best != std::string::npos) {
        out.content += buf_.substr(0, best);
        buf_.erase(0, best + len);
        state_ = next;
        continue;
      }
      size_t keep = 0;
      if (!final) {
        if (reasoning_) keep = std::max(keep, held_suffix(buf_, kThinkOpen));
        if (fmt_ != ToolFormat::None) {
          keep = std::max(keep, held_suffix(buf_, markers(fmt_).section_begin));
          keep = std::max(keep, held_suffix(buf_, markers(fmt_).call_begin));
        }
      }
      out.content += buf_.substr(0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    // Tools: a call opens once its name is known and streams its arguments until its end marker.
    if (open_) {
      feed_arguments(buf_.find(markers(fmt_).call_end), final, out);
      if (open_) return;
      continue;
    }
    if (!open_call(out)) return;
  }
}

bool OutputParser::open_call(ParsedDelta& out) {
  const Markers& m = markers(fmt_);
  constexpr size_t npos = std::string::npos;
  const size_t se = buf_.find(m.section_end), cb = buf_.find(m.call_begin), ce = buf_.find(m.call_end);
  if (se != npos && se < cb && se < ce) {  // the section ends: back to content
    buf_.erase(0, se + m.section_end.size());
    state_ = State::Content;
    return true;
  }
  // Text ended by an end marker with no call head before it: not a call after all, keep the text.
  auto not_a_call = [&] {
    out.content += buf_.substr(0, ce + m.call_end.size());
    buf_.erase(0, ce + m.call_end.size());
    return true;
  };
  if (ce != npos && ce < cb) return not_a_call();
  if (cb == npos) return false;  // wait (finish() flushes the text raw)
  const size_t after = cb + m.call_begin.size(), sp = buf_.find(m.sep, after);
  if (sp == npos || sp > ce) return ce != npos ? not_a_call() : false;
  const std::string head = trim(std::string_view(buf_).substr(after, sp - after));
  size_t args_at = sp + m.sep.size();
  ParsedToolCall call;
  call.index = calls_;
  bool fenced = false;
  if (fmt_ == ToolFormat::KimiK2) {
    // "functions.NAME:IDX": the id Kimi's template expects back in the tool message.
    call.id = head;
    std::string name = head;
    if (name.rfind("functions.", 0) == 0) name = name.substr(10);
    if (const size_t c = name.rfind(':'); c != std::string::npos) name = name.substr(0, c);
    call.name = name;
  } else if (head == "function") {  // V3: NAME\n```json\nARGS\n```
    const size_t nl = buf_.find('\n', args_at);
    if (nl == npos || nl > ce) {
      if (ce == npos) return false;  // the name may go on (cut off here: content)
      call.name = trim(std::string_view(buf_).substr(args_at, ce - args_at));
      args_at = ce;
    } else {
      call.name = trim(std::string_view(buf_).substr(args_at, nl - args_at));
      args_at = nl + 1;
    }
    fenced = true;
  } else {  // V3.1: NAME<sep>ARGS
    call.name = head;
  }
  if (call.name.empty()) return ce != npos ? not_a_call() : false;
  if (call.id.empty()) call.id = make_tool_call_id();
  out.add_call(std::move(call));
  buf_.erase(0, args_at);
  open_ = true;
  fenced_ = fenced;
  sent_ = 0;
  return true;
}

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

constexpr std::string_view kFence = "```json";

// The arguments of a whole call: trimmed, and V3's fence dropped.
std::string whole_arguments(std::string_view raw, bool fenced) {
  std::string a = trim(raw);
  if (!fenced) return a;
  if (a.rfind(kFence, 0) == 0) a = a.substr(kFence.size());
  if (a.size() >= 3 && a.compare(a.size() - 3, 3, "```") == 0) a.resize(a.size() - 3);
  return trim(a);
}

// What of a call's arguments so far can no longer change, whatever follows: a prefix of
// whole_arguments() of any continuation. Held back: leading whitespace and a fence that may still
// be forming, trailing whitespace (and backticks when fenced), and the start of the end marker.
std::string_view stable_arguments(std::string_view raw, bool fenced, std::string_view end_marker) {
  const size_t held = held_suffix(raw, end_marker);
  raw = raw.substr(0, raw.size() - held);
  size_t b = 0;
  while (b < raw.size() && is_space(raw[b])) ++b;
  std::string_view s = raw.substr(b);
  if (fenced) {
    if (s.size() < kFence.size() && kFence.substr(0, s.size()) == s) return {};
    if (s.substr(0, kFence.size()) == kFence) {
      s = s.substr(kFence.size());
      while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    }
  }
  while (!s.empty() && (is_space(s.back()) || (fenced && s.back() == '`'))) s.remove_suffix(1);
  return s;
}

}  // namespace

void OutputParser::feed_arguments(size_t end, bool final, ParsedDelta& out) {
  const std::string_view m = markers(fmt_).call_end;
  const bool closing = end != std::string::npos || final;
  const std::string_view raw = std::string_view(buf_).substr(0, closing ? std::min(end, buf_.size()) : buf_.size());
  const std::string args = closing ? whole_arguments(raw, fenced_) : std::string(stable_arguments(raw, fenced_, m));
  if (args.size() > sent_) {
    ParsedToolCall piece;
    piece.index = calls_;
    piece.arguments = args.substr(sent_);
    out.add_call(std::move(piece));
    sent_ = args.size();
  }
  if (!closing) return;
  buf_.erase(0, end == std::string::npos ? buf_.size() : end + m.size());
  open_ = false;
  ++calls_;
}

}  // namespace kiln::server

#include "server/output_parser.h"

#include <fmt/format.h>

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
  if (name == "none") return ToolFormat::None;
  if (name == "deepseek_v3") return ToolFormat::DeepSeekV3;
  if (name == "kimi_k2") return ToolFormat::KimiK2;
  return std::nullopt;
}

std::string make_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

void ParsedDelta::append(ParsedDelta&& d) {
  content += d.content;
  reasoning += d.reasoning;
  for (auto& c : d.tool_calls) tool_calls.push_back(std::move(c));
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
    // Tools: emit each call as its end marker arrives; the section end returns to content.
    const Markers& m = markers(fmt_);
    const size_t ce = buf_.find(m.call_end), se = buf_.find(m.section_end);
    if (se != std::string::npos && (ce == std::string::npos || se < ce)) {
      buf_.erase(0, se + m.section_end.size());
      state_ = State::Content;
      continue;
    }
    if (ce == std::string::npos) return;  // wait for the call to complete (finish() flushes it raw)
    ParsedToolCall call;
    if (parse_call(std::string_view(buf_).substr(0, ce), call)) {
      out.tool_calls.push_back(std::move(call));
    } else {
      out.content += buf_.substr(0, ce + m.call_end.size());  // not a call after all: keep the text
    }
    buf_.erase(0, ce + m.call_end.size());
  }
}

bool OutputParser::parse_call(std::string_view s, ParsedToolCall& out) {
  const Markers& m = markers(fmt_);
  const size_t b = s.find(m.call_begin);
  if (b == std::string_view::npos) return false;
  s = s.substr(b + m.call_begin.size());
  const size_t sep = s.find(m.sep);
  if (sep == std::string_view::npos) return false;
  std::string head = trim(s.substr(0, sep));
  std::string_view rest = s.substr(sep + m.sep.size());
  if (fmt_ == ToolFormat::KimiK2) {
    // "functions.NAME:IDX": the id Kimi's template expects back in the tool message.
    out.id = head;
    std::string name = head;
    if (name.rfind("functions.", 0) == 0) name = name.substr(10);
    if (const size_t c = name.rfind(':'); c != std::string::npos) name = name.substr(0, c);
    out.name = name;
    out.arguments = trim(rest);
  } else if (head == "function") {  // V3: NAME\n```json\nARGS\n```
    const size_t nl = rest.find('\n');
    out.name = trim(rest.substr(0, nl));
    std::string args = nl == std::string_view::npos ? std::string() : trim(rest.substr(nl + 1));
    if (args.rfind("```json", 0) == 0) args = args.substr(7);
    if (args.size() >= 3 && args.compare(args.size() - 3, 3, "```") == 0) args.resize(args.size() - 3);
    out.arguments = trim(args);
    out.id = make_tool_call_id();
  } else {  // V3.1: NAME<sep>ARGS
    out.name = head;
    out.arguments = trim(rest);
    out.id = make_tool_call_id();
  }
  ++calls_;
  return !out.name.empty();
}

}  // namespace kiln::server

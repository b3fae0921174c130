#include "server/tool_constraint.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace kiln::server {

TokenVocab::TokenVocab(std::vector<std::string> token_bytes, std::vector<uint8_t> unit)
    : bytes_(std::move(token_bytes)), unit_(std::move(unit)) {
  unit_.resize(bytes_.size(), 0);
  for (size_t i = 0; i < bytes_.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (unit_[i]) {
      units_.push_back(id);
      unit_by_content_.emplace(bytes_[i], id);
    } else if (!bytes_[i].empty()) {
      sorted_ids.push_back(id);
      max_len = std::max(max_len, static_cast<int32_t>(bytes_[i].size()));
    }
  }
  // Sorted by bytes, the tokens under any trie node form one contiguous range: the trie is built
  // from that order without per-node containers.
  std::sort(sorted_ids.begin(), sorted_ids.end(),
            [&](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  build(0, static_cast<int32_t>(sorted_ids.size()), 0);
}

std::optional<int32_t> TokenVocab::unit_for(const std::string& content) const {
  const auto it = unit_by_content_.find(content);
  if (it == unit_by_content_.end()) return std::nullopt;
  return it->second;
}

// The node for the tokens sorted_ids[lo, hi), which share their first `depth` bytes.
int32_t TokenVocab::build(int32_t lo, int32_t hi, int32_t depth) {
  const auto me = static_cast<int32_t>(nodes.size());
  nodes.emplace_back();
  auto len = [&](int32_t i) { return bytes_[static_cast<size_t>(sorted_ids[static_cast<size_t>(i)])].size(); };
  auto byte_at = [&](int32_t i) {
    return static_cast<uint8_t>(
        bytes_[static_cast<size_t>(sorted_ids[static_cast<size_t>(i)])][static_cast<size_t>(depth)]);
  };
  int32_t k = lo;
  while (k < hi && len(k) == static_cast<size_t>(depth)) ++k;  // tokens ending here sort first
  nodes[static_cast<size_t>(me)].tok_begin = lo;
  nodes[static_cast<size_t>(me)].tok_end = k;
  std::vector<std::pair<int32_t, int32_t>> groups;  // [begin, end) per next byte
  for (int32_t i = k; i < hi;) {
    int32_t j = i + 1;
    while (j < hi && byte_at(j) == byte_at(i)) ++j;
    groups.emplace_back(i, j);
    i = j;
  }
  const auto first = static_cast<int32_t>(edge_byte.size());
  nodes[static_cast<size_t>(me)].edge_begin = first;
  nodes[static_cast<size_t>(me)].edge_end = first + static_cast<int32_t>(groups.size());
  for (const auto& g : groups) {
    edge_byte.push_back(byte_at(g.first));
    edge_child.push_back(-1);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const int32_t child = build(groups[g].first, groups[g].second, depth + 1);
    edge_child[static_cast<size_t>(first) + g] = child;
  }
  return me;
}

ToolCallGrammar::ToolCallGrammar(std::shared_ptr<const TokenVocab> vocab, ToolCallStyle style,
                                 const std::vector<ToolSpec>& tools, std::vector<int32_t> end_ids)
    : vocab_(std::move(vocab)), end_ids_(std::move(end_ids)) {
  for (size_t i = 0; i < tools.size(); ++i) {
    names_.add(tools[i].name, static_cast<int32_t>(i));
    grammars_.emplace_back(tools[i].parameters);
  }
  auto bytes = [&](std::string_view b) {
    if (!segs_.empty() && segs_.back().kind == Kind::Bytes)
      segs_.back().bytes += b;
    else
      segs_.push_back({Kind::Bytes, std::string(b), -1});
  };
  // A marker that is one token of the vocabulary is written with that token.
  auto marker = [&](std::string_view m) {
    if (auto id = vocab_->unit_for(std::string(m)))
      segs_.push_back({Kind::Unit, {}, *id});
    else
      bytes(m);
  };
  if (style == ToolCallStyle::PlainJson) {
    segs_.push_back({Kind::Json, {}, -1});
    segs_.push_back({Kind::End, {}, -1});
    return;
  }
  const ToolMarkers& m = tool_markers(style == ToolCallStyle::KimiK2 ? ToolFormat::KimiK2 : ToolFormat::DeepSeekV3);
  marker(m.section_begin);
  marker(m.call_begin);
  if (style == ToolCallStyle::DeepSeekV3) {
    bytes("function");
    marker(m.sep);
    segs_.push_back({Kind::Names, {}, -1});
    bytes("\n```json\n");
    segs_.push_back({Kind::Json, {}, -1});
    bytes("\n```");
  } else if (style == ToolCallStyle::DeepSeekV31) {
    segs_.push_back({Kind::Names, {}, -1});
    marker(m.sep);
    segs_.push_back({Kind::Json, {}, -1});
  } else {
    bytes("functions.");
    segs_.push_back({Kind::Names, {}, -1});
    bytes(":0");
    marker(m.sep);
    segs_.push_back({Kind::Json, {}, -1});
  }
  marker(m.call_end);
  marker(m.section_end);
  segs_.push_back({Kind::End, {}, -1});
}

ToolCallGrammar::State ToolCallGrammar::start() const {
  State s;
  enter(s, 0);
  return s;
}

void ToolCallGrammar::enter(State& s, int32_t seg) const {
  s.seg = seg;
  s.pos = 0;
  if (segs_[static_cast<size_t>(seg)].kind == Kind::Json) s.json = grammars_[static_cast<size_t>(s.tool)].start();
}

bool ToolCallGrammar::feed_byte(State& s, uint8_t b) const {
  for (;;) {
    const Segment& g = segs_[static_cast<size_t>(s.seg)];
    switch (g.kind) {
      case Kind::Bytes:
        if (static_cast<uint8_t>(g.bytes[static_cast<size_t>(s.pos)]) != b) return false;
        if (++s.pos == static_cast<int32_t>(g.bytes.size())) enter(s, s.seg + 1);
        return true;
      case Kind::Names: {
        const int32_t c = names_.child(s.pos, b);
        if (c >= 0) {
          s.pos = c;
          // A name no other name extends is complete at once; else the next byte decides.
          if (names_.value(c) >= 0 && !names_.has_children(c)) {
            s.tool = names_.value(c);
            enter(s, s.seg + 1);
          }
          return true;
        }
        if (names_.value(s.pos) < 0) return false;
        s.tool = names_.value(s.pos);
        enter(s, s.seg + 1);
        continue;  // the byte belongs to what follows the name
      }
      case Kind::Json:
        if (!grammars_[static_cast<size_t>(s.tool)].feed(s.json, b)) return false;
        if (s.json.done) enter(s, s.seg + 1);
        return true;
      default: return false;  // a unit or the end is due
    }
  }
}

bool ToolCallGrammar::feed_unit(State& s, int32_t id) const {
  for (;;) {
    const Segment& g = segs_[static_cast<size_t>(s.seg)];
    if (g.kind == Kind::Unit) {
      if (g.token != id) return false;
      enter(s, s.seg + 1);
      return true;
    }
    if (g.kind == Kind::End) {
      if (std::find(end_ids_.begin(), end_ids_.end(), id) == end_ids_.end()) return false;
      s.finished = true;
      return true;
    }
    if (g.kind == Kind::Names && names_.value(s.pos) >= 0) {  // a name ended by a unit (V3.1's separator)
      s.tool = names_.value(s.pos);
      enter(s, s.seg + 1);
      continue;
    }
    return false;
  }
}

void ToolCallGrammar::walk(int32_t node, int32_t depth, std::vector<uint8_t>& allowed, std::vector<State>& st) const {
  const TokenVocab& v = *vocab_;
  const TokenVocab::Node& n = v.nodes[static_cast<size_t>(node)];
  for (int32_t e = n.edge_begin; e < n.edge_end; ++e) {
    State& next = st[static_cast<size_t>(depth) + 1];
    next.assign(st[static_cast<size_t>(depth)]);
    if (!feed_byte(next, v.edge_byte[static_cast<size_t>(e)])) continue;
    const int32_t child = v.edge_child[static_cast<size_t>(e)];
    const TokenVocab::Node& c = v.nodes[static_cast<size_t>(child)];
    for (int32_t t = c.tok_begin; t < c.tok_end; ++t)
      allowed[static_cast<size_t>(v.sorted_ids[static_cast<size_t>(t)])] = 1;
    walk(child, depth + 1, allowed, st);
  }
}

void ToolCallGrammar::allowed(const State& s, std::vector<uint8_t>& allowed, std::vector<State>& st) const {
  if (s.failed || s.finished) return;
  State probe;
  for (int32_t id : vocab_->units()) {
    probe.assign(s);
    if (feed_unit(probe, id)) allowed[static_cast<size_t>(id)] = 1;
  }
  const Kind k = segs_[static_cast<size_t>(s.seg)].kind;
  if (k == Kind::Bytes || k == Kind::Names || k == Kind::Json) {
    st.resize(static_cast<size_t>(vocab_->max_len) + 2);
    st[0].assign(s);
    walk(0, 0, allowed, st);
  }
}

void ToolCallConstraint::mask(std::span<float> logits) {
  const size_t n = std::min(logits.size(), g_->vocab().size());
  allowed_.assign(g_->vocab().size(), 0);
  g_->allowed(s_, allowed_, scratch_);
  bool any = false;
  for (size_t i = 0; i < n && !any; ++i) any = allowed_[i] != 0;
  // Nothing can follow (the call is complete, or the text went off the grammar): end the output.
  if (!any)
    for (int32_t id : g_->end_ids())
      if (static_cast<size_t>(id) < n) allowed_[static_cast<size_t>(id)] = 1;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i)
    if (i >= n || !allowed_[i]) logits[i] = ninf;
}

void ToolCallConstraint::advance(int32_t token) {
  if (s_.failed || s_.finished) return;
  if (token < 0 || static_cast<size_t>(token) >= g_->vocab().size()) {
    s_.failed = true;
    return;
  }
  const TokenVocab& v = g_->vocab();
  if (v.is_unit(token)) {
    if (!g_->feed_unit(s_, token)) s_.failed = true;
    return;
  }
  for (char ch : v.bytes(token))
    if (!g_->feed_byte(s_, static_cast<uint8_t>(ch))) {
      s_.failed = true;
      return;
    }
}

}  // namespace kiln::server

#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kiln::tok {

void AddedVocab::add(AddedToken t) {
  if (t.content.empty()) return;
  auto it = by_content_.find(t.content);
  if (it != by_content_.end()) {
    tokens_[it->second] = t;  // a later definition of the same content wins
  } else {
    by_content_[t.content] = tokens_.size();
    tokens_.push_back(t);
  }
  by_id_[t.id] = by_content_[t.content];
}

void AddedVocab::build(const std::function<std::string(std::string_view)>& normalize) {
  raw_ = Trie{};
  normalized_ = Trie{};
  has_normalized_ = false;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const AddedToken& t = tokens_[k];
    if (!t.normalized) {
      raw_.insert(t.content, static_cast<int32_t>(k));
      continue;
    }
    std::string content = normalize ? normalize(t.content) : t.content;
    if (!content.empty()) normalized_.insert(content, static_cast<int32_t>(k));
    has_normalized_ = true;
  }
}

void AddedVocab::Trie::insert(std::string_view s, int32_t token) {
  int32_t n = 0;
  first_byte[static_cast<unsigned char>(s[0])] = true;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    auto& next = nodes[static_cast<size_t>(n)].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t{-1}));
    if (it != next.end() && it->first == c) {
      n = it->second;
    } else {
      int32_t child = static_cast<int32_t>(nodes.size());
      next.insert(it, {c, child});
      nodes.emplace_back();
      n = child;
    }
  }
  nodes[static_cast<size_t>(n)].token = token;
}

int32_t AddedVocab::Trie::longest(std::string_view text, size_t i, size_t& len) const {
  int32_t best = -1;
  int32_t n = 0;
  for (size_t j = i; j < text.size(); ++j) {
    auto c = static_cast<unsigned char>(text[j]);
    const auto& next = nodes[static_cast<size_t>(n)].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t{-1}));
    if (it == next.end() || it->first != c) break;
    n = it->second;
    if (nodes[static_cast<size_t>(n)].token >= 0) {
      best = nodes[static_cast<size_t>(n)].token;
      len = j + 1 - i;
    }
  }
  return best;
}

namespace {

char32_t last_char(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i > 0) --i;
  size_t k = i;
  return next_code_point(s, k);
}

}  // namespace

void AddedVocab::split(std::string_view text, bool normalized_pass, size_t base, std::vector<Segment>& out,
                       bool skip_special) const {
  const Trie& trie = normalized_pass ? normalized_ : raw_;
  size_t emitted = 0;  // end of the last piece pushed
  size_t i = 0;
  while (i < text.size()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    size_t len = 0;
    int32_t k = trie.longest(text, i, len);
    if (k < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = tokens_[static_cast<size_t>(k)];
    size_t start = i, stop = i + len;
    i = stop;                       // the matcher resumes after this match even when the match is rejected below
    if (start < emitted) continue;  // overlaps the previous token's rstrip
    if (skip_special && t.special) continue;
    if (t.single_word) {
      bool start_ok = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      size_t q = stop;
      bool stop_ok = stop == text.size() || !is_word_char(next_code_point(text, q));
      if (!start_ok || !stop_ok) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > emitted) {
        size_t p = s - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!is_unicode_whitespace(next_code_point(text, q))) break;
        s = p;
      }
      start = s;
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t q = stop;
        if (!is_unicode_whitespace(next_code_point(text, q))) break;
        stop = q;
      }
      i = stop;
    }
    if (emitted < start) out.push_back({text.substr(emitted, start - emitted), -1, base + emitted});
    out.push_back({text.substr(start, stop - start), static_cast<int64_t>(t.id), base + start});
    emitted = stop;
  }
  if (emitted < text.size() || text.empty()) out.push_back({text.substr(emitted), -1, base + emitted});
}

const AddedToken* AddedVocab::by_id(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<uint32_t> AddedVocab::by_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

}  // namespace kiln::tok

#include "tokenizer/pretokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

using nlohmann::json;

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& s) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  fail("tokenizer.json: split behavior {} is not supported", quote(s));
}

struct Span {
  size_t begin, end;
  bool match;
};

// Turns a covering list of (span, is_delimiter) into pieces, following Hugging Face's
// NormalizedString::split for each behavior.
// noinline: GCC 12 reports a false -Wfree-nonheap-object when this is inlined into callers.
[[gnu::noinline]] void apply_behavior(const Piece& p, std::vector<Span>& spans, Behavior behavior, bool invert,
                                      std::vector<Piece>& out) {
  if (invert)
    for (Span& s : spans) s.match = !s.match;
  std::vector<Span> pieces;  // match flag now means "remove"
  pieces.reserve(spans.size());
  switch (behavior) {
    case Behavior::Isolated:
      for (Span s : spans) pieces.push_back({s.begin, s.end, false});
      break;
    case Behavior::Removed: pieces = spans; break;
    case Behavior::Contiguous: {
      bool prev = false;
      for (Span s : spans) {
        if (s.match == prev && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.begin, s.end, false});
        }
        prev = s.match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev = false;
      for (Span s : spans) {
        if (s.match && !prev && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.begin, s.end, false});
        }
        prev = s.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev = false;
      for (size_t k = spans.size(); k-- > 0;) {
        Span s = spans[k];
        if (s.match && !prev && !pieces.empty()) {
          pieces.back().begin = s.begin;
        } else {
          pieces.push_back({s.begin, s.end, false});
        }
        prev = s.match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
  }
  for (const Span& s : pieces) {
    if (s.match || s.end == s.begin) continue;
    out.push_back({p.text.substr(s.begin, s.end - s.begin), p.at_start && s.begin == 0});
  }
}

void regex_spans(const Regex& re, std::string_view text, std::vector<Span>& spans) {
  spans.clear();
  size_t prev = 0, pos = 0, b, e;
  while (pos <= text.size() && re.search(text, pos, b, e)) {
    if (prev != b) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
    if (e == b) {
      if (e >= text.size()) break;
      size_t n = e;
      next_code_point(text, n);
      pos = n;
    } else {
      pos = e;
    }
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
}

// Each character satisfying pred is its own delimiter (Hugging Face's char-predicate pattern).
void char_spans(std::string_view text, const std::function<bool(char32_t)>& pred, std::vector<Span>& spans) {
  spans.clear();
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    size_t b = i;
    char32_t c = next_code_point(text, i);
    if (!pred(c)) continue;
    if (last < b) spans.push_back({last, b, false});
    spans.push_back({b, i, true});
    last = i;
  }
  if (last < text.size()) spans.push_back({last, text.size(), false});
}

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(const Piece& p, PieceArena& arena, std::vector<Piece>& out) const override {
    std::vector<Piece> cur{p}, next;
    for (size_t k = 0; k < steps_.size(); ++k) {
      std::vector<Piece>& dst = k + 1 == steps_.size() ? out : next;
      if (k + 1 < steps_.size()) next.clear();
      for (const Piece& q : cur) steps_[k]->split(q, arena, dst);
      if (k + 1 < steps_.size()) cur.swap(next);
    }
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class Split : public PreTokenizer {
 public:
  Split(const json& pattern, Behavior behavior, bool invert) : behavior_(behavior), invert_(invert) {
    if (pattern.contains("Regex")) {
      regex_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String")) {
      std::string lit = pattern["String"].get<std::string>();
      regex_ = std::make_unique<Regex>(regex_escape(lit));
    } else {
      fail("tokenizer.json: Split pattern must hold \"String\" or \"Regex\"");
    }
  }
  void split(const Piece& p, PieceArena&, std::vector<Piece>& out) const override {
    std::vector<Span> spans;
    regex_spans(*regex_, p.text, spans);
    apply_behavior(p, spans, behavior_, invert_, out);
  }

 private:
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, bool map_bytes)
      : add_prefix_space_(add_prefix_space), map_bytes_(map_bytes) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern);
  }
  void split(const Piece& in, PieceArena& arena, std::vector<Piece>& out) const override {
    Piece p = in;
    if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) {
      std::string s;
      s.reserve(p.text.size() + 1);
      s += ' ';
      s += p.text;
      p.text = arena.hold(std::move(s));
    }
    size_t first = out.size();
    if (regex_) {
      std::vector<Span> spans;
      regex_spans(*regex_, p.text, spans);
      apply_behavior(p, spans, Behavior::Isolated, false, out);
    } else if (!p.text.empty()) {
      out.push_back(p);
    }
    if (map_bytes_)
      for (size_t k = first; k < out.size(); ++k) out[k].text = arena.hold(bytes_to_byte_level(out[k].text));
  }

 private:
  bool add_prefix_space_, map_bytes_;
  std::unique_ptr<Regex> regex_;
};

class Digits : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void split(const Piece& p, PieceArena&, std::vector<Piece>& out) const override {
    std::vector<Span> spans;
    char_spans(p.text, is_digit, spans);
    apply_behavior(p, spans, individual_ ? Behavior::Isolated : Behavior::Contiguous, false, out);
  }

 private:
  bool individual_;
};

class Metaspace : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  Metaspace(std::string replacement, Prepend prepend, bool split)
      : rep_(std::move(replacement)), prepend_(prepend), split_(split) {
    size_t i = 0;
    rep_cp_ = next_code_point(rep_, i);
  }
  void split(const Piece& p, PieceArena& arena, std::vector<Piece>& out) const override {
    std::string s;
    s.reserve(p.text.size() + 8);
    for (char c : p.text) {
      if (c == ' ') {
        s += rep_;
      } else {
        s += c;
      }
    }
    bool starts = s.compare(0, rep_.size(), rep_) == 0;
    if (!starts && (prepend_ == Prepend::Always || (prepend_ == Prepend::First && p.at_start))) s.insert(0, rep_);
    Piece q{arena.hold(std::move(s)), p.at_start};
    if (!split_) {
      if (!q.text.empty()) out.push_back(q);
      return;
    }
    std::vector<Span> spans;
    char32_t r = rep_cp_;
    char_spans(
        q.text, [r](char32_t c) { return c == r; }, spans);
    apply_behavior(q, spans, Behavior::MergedWithNext, false, out);
  }

 private:
  std::string rep_;
  char32_t rep_cp_;
  Prepend prepend_;
  bool split_;
};

class WhitespaceSplit : public PreTokenizer {
 public:
  void split(const Piece& p, PieceArena&, std::vector<Piece>& out) const override {
    std::vector<Span> spans;
    char_spans(p.text, is_unicode_whitespace, spans);
    apply_behavior(p, spans, Behavior::Removed, false, out);
  }
};

class PunctuationSplit : public PreTokenizer {
 public:
  explicit PunctuationSplit(Behavior b) : behavior_(b) {}
  void split(const Piece& p, PieceArena&, std::vector<Piece>& out) const override {
    std::vector<Span> spans;
    auto is_punct = [](char32_t c) {
      if (c < 0x80)
        return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
    };
    char_spans(p.text, is_punct, spans);
    apply_behavior(p, spans, behavior_, false, out);
  }

 private:
  Behavior behavior_;
};

class RegexPieces : public PreTokenizer {
 public:
  explicit RegexPieces(const std::string& pattern) : regex_(pattern) {}
  void split(const Piece& p, PieceArena&, std::vector<Piece>& out) const override {
    size_t pos = 0, b, e;
    while (pos < p.text.size() && regex_.search(p.text, pos, b, e)) {
      if (e > b) out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
      if (e == b) {
        size_t n = e;
        if (n >= p.text.size()) break;
        next_code_point(p.text, n);
        pos = n;
      } else {
        pos = e;
      }
    }
  }

 private:
  Regex regex_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, bool byte_mode) {
  if (j.is_null()) return nullptr;
  KILN_CHECK(j.is_object() && j.contains("type"), "tokenizer.json: a pre_tokenizer must be an object with a \"type\"");
  std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    bool seen_byte_level = false;
    for (const json& s : j.at("pretokenizers")) {
      KILN_CHECK(!(byte_mode && seen_byte_level),
                 "tokenizer.json: a pre-tokenizer after ByteLevel in a Sequence is not supported");
      seen_byte_level |= s.value("type", "") == "ByteLevel";
      if (auto step = make_pre_tokenizer(s, byte_mode)) steps.push_back(std::move(step));
    }
    if (steps.size() == 1) return std::move(steps[0]);
    return std::make_unique<Sequence>(std::move(steps));
  }
  if (type == "Split")
    return std::make_unique<Split>(j.at("pattern"), parse_behavior(j.at("behavior").get<std::string>()),
                                   j.value("invert", false));
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(j.value("add_prefix_space", true), j.value("use_regex", true), !byte_mode);
  if (type == "Digits") return std::make_unique<Digits>(j.value("individual_digits", false));
  if (type == "Metaspace") {
    Metaspace::Prepend prepend =
        j.value("add_prefix_space", true) ? Metaspace::Prepend::Always : Metaspace::Prepend::Never;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      std::string s = j["prepend_scheme"].get<std::string>();
      prepend = s == "first"   ? Metaspace::Prepend::First
                : s == "never" ? Metaspace::Prepend::Never
                               : Metaspace::Prepend::Always;
    }
    return std::make_unique<Metaspace>(j.value("replacement", std::string("\xE2\x96\x81")), prepend,
                                       j.value("split", true));
  }
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
  if (type == "Whitespace") {
    json split = {
        {"type", "Split"}, {"pattern", {{"Regex", "\\w+|[^\\w\\s]+"}}}, {"behavior", "Removed"}, {"invert", true}};
    return make_pre_tokenizer(split, byte_mode);
  }
  if (type == "Punctuation") return std::make_unique<PunctuationSplit>(parse_behavior(j.value("behavior", "Isolated")));
  fail("tokenizer.json: pre_tokenizer type {} is not supported", quote(type));
}

PreTokenizerInfo inspect_pre_tokenizer(const json& j) {
  PreTokenizerInfo info;
  if (!j.is_object()) return info;
  std::string type = j.value("type", "");
  if (type == "ByteLevel") info.has_byte_level = true;
  if (type == "Sequence" && j.contains("pretokenizers"))
    for (const json& s : j["pretokenizers"]) info.has_byte_level |= inspect_pre_tokenizer(s).has_byte_level;
  return info;
}

std::unique_ptr<PreTokenizer> make_regex_pieces(const std::string& pattern) {
  return std::make_unique<RegexPieces>(pattern);
}

}  // namespace kiln::tok

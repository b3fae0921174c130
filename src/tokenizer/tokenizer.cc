// Loading tokenizer.json and the encode / decode pipeline (the order Hugging Face applies):
// added tokens split the raw text -> each remaining segment is normalised -> normalised added
// tokens split it again -> pre-tokenizer -> BPE per piece -> post-processor.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  KILN_CHECK(f, "cannot open {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(std::string_view text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  KILN_CHECK(!j.is_discarded(), "{} is not valid JSON", what);
  return j;
}

// True when j nests deeper than `limit` (recursion stops at the limit, so this is safe on any input).
bool deeper_than(const json& j, int limit) {
  if (limit <= 0) return true;
  if (j.is_object() || j.is_array())
    for (const auto& e : j)
      if (deeper_than(e, limit - 1)) return true;
  return false;
}

AddedToken parse_added_token(const json& t, const char* where) {
  KILN_CHECK(t.is_object() && t.contains("content") && t["content"].is_string(),
             "{}: an added token needs a string \"content\"", where);
  AddedToken a;
  a.content = t["content"].get<std::string>();
  a.special = t.value("special", false);
  a.lstrip = t.value("lstrip", false);
  a.rstrip = t.value("rstrip", false);
  a.single_word = t.value("single_word", false);
  a.normalized = t.value("normalized", !a.special);
  return a;
}

}  // namespace

std::string config_token_string(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

void add_config_added_tokens(TokenizerImpl& impl) {
  if (!impl.config.is_object() || !impl.config.contains("added_tokens_decoder")) return;
  const json& dec = impl.config["added_tokens_decoder"];
  KILN_CHECK(dec.is_object(), "tokenizer_config.json: added_tokens_decoder must be an object");
  for (auto it = dec.begin(); it != dec.end(); ++it) {
    AddedToken a = parse_added_token(it.value(), "tokenizer_config.json added_tokens_decoder");
    uint64_t id = 0;
    auto r = std::from_chars(it.key().data(), it.key().data() + it.key().size(), id);
    KILN_CHECK(r.ec == std::errc() && r.ptr == it.key().data() + it.key().size() && id < kMaxTokenId,
               "tokenizer_config.json: added_tokens_decoder key {} is not a token id", quote(it.key()));
    a.id = static_cast<uint32_t>(id);
    if (impl.added.by_id(a.id) || impl.added.by_content(a.content)) continue;
    impl.added.add(a);
  }
}

void resolve_special_tokens(TokenizerImpl& impl) {
  impl.bos_token = config_token_string(impl.config, "bos_token");
  impl.eos_token = config_token_string(impl.config, "eos_token");
  auto lookup = [&](const std::string& s) -> std::optional<uint32_t> {
    if (s.empty()) return std::nullopt;
    if (auto id = impl.added.by_content(s)) return id;
    return impl.model->token_to_id(s);
  };
  impl.bos_id = lookup(impl.bos_token);
  impl.eos_id = lookup(impl.eos_token);
}

Tokenizer Tokenizer::from_tokenizer_json(std::string_view text, const json& config) {
  try {
    return build_from_json(parse_json(text, "tokenizer.json"), config);
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong JSON type: report it as a tokenizer.json error, not a crash.
    fail("tokenizer.json: {}", e.what());
  }
}

Tokenizer Tokenizer::build_from_json(const json& j, const json& config) {
  KILN_CHECK(j.is_object() && j.contains("model"), "tokenizer.json: no \"model\" section");
  // The pipeline builders recurse into Sequence steps: refuse absurd nesting up front.
  for (const char* key : {"normalizer", "pre_tokenizer", "post_processor", "decoder"})
    KILN_CHECK(!j.contains(key) || !deeper_than(j[key], 32), "tokenizer.json: \"{}\" is nested too deeply", key);
  auto impl = std::make_shared<TokenizerImpl>();
  impl->config = config;
  const json null;
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : null;
  bool byte_mode = inspect_pre_tokenizer(pre).has_byte_level;
  impl->model = BpeModel::from_hf_json(j["model"], byte_mode);
  byte_mode = impl->model->byte_mode();
  impl->normalizer = make_normalizer(j.contains("normalizer") ? j["normalizer"] : null);
  impl->pre_tokenizer = make_pre_tokenizer(pre, byte_mode);
  impl->post_processor = make_post_processor(j.contains("post_processor") ? j["post_processor"] : null);
  impl->decoder = make_decoder(j.contains("decoder") ? j["decoder"] : null);
  if (j.contains("decoder"))
    impl->byte_fallback_decoder = j["decoder"].dump().find("\"ByteFallback\"") != std::string::npos;
  if (j.contains("added_tokens")) {
    for (const json& t : j["added_tokens"]) {
      AddedToken a = parse_added_token(t, "tokenizer.json added_tokens");
      KILN_CHECK(t.contains("id"), "tokenizer.json: added token {} has no id", quote(a.content));
      a.id = json_token_id(t["id"], "an added token id");
      impl->added.add(a);
    }
  }
  add_config_added_tokens(*impl);
  const Normalizer* norm = impl->normalizer.get();
  impl->added.build([norm](std::string_view s) {
    std::string out(s);
    if (norm) norm->apply(out);
    return out;
  });
  resolve_special_tokens(*impl);
  // transformers rebuilds the post-processor of Llama-style tokenizers from add_bos_token /
  // add_eos_token; DeepSeek-V3 relies on this for its BOS.
  bool add_bos = config.is_object() && config.value("add_bos_token", false);
  bool add_eos = config.is_object() && config.value("add_eos_token", false);
  if ((add_bos && impl->bos_id) || (add_eos && impl->eos_id)) {
    std::vector<uint32_t> prefix, suffix;
    if (add_bos && impl->bos_id) prefix.push_back(*impl->bos_id);
    if (add_eos && impl->eos_id) suffix.push_back(*impl->eos_id);
    impl->post_processor = make_bos_eos_processor(std::move(prefix), std::move(suffix));
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& dir) {
  fs::path d(dir);
  KILN_CHECK(fs::is_directory(d), "tokenizer directory {} does not exist", dir);
  json config;
  fs::path cfg = d / "tokenizer_config.json";
  if (fs::exists(cfg)) config = parse_json(read_file(cfg), cfg.string());
  if (fs::exists(d / "tokenizer.json")) {
    try {
      return from_tokenizer_json(read_file(d / "tokenizer.json"), config);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: {}", (d / "tokenizer.json").string(), e.what());
    }
  }
  if (fs::exists(d / "tiktoken.model")) {
    bool kimi = fs::exists(d / "tokenization_kimi.py");
    return from_tiktoken(read_file(d / "tiktoken.model"), config, kimi);
  }
  fail("tokenizer directory {} has neither tokenizer.json nor tiktoken.model", dir);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens, bool split_special_tokens,
                                        size_t max_tokens) const {
  const TokenizerImpl& t = *impl_;
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = sanitize_utf8(text);
    text = repaired;
  }
  std::vector<uint32_t> ids;
  ids.reserve(std::min(text.size() / 3, max_tokens) + 4);
  auto full = [&] { return ids.size() > max_tokens; };
  PieceArena arena;
  std::vector<Piece> pieces;
  auto encode_plain = [&](std::string_view s, bool at_start) {
    if (s.empty()) return;
    pieces.clear();
    Piece p{s, at_start};
    if (t.pre_tokenizer) {
      t.pre_tokenizer->split(p, arena, pieces);
    } else {
      pieces.push_back(p);
    }
    for (const Piece& q : pieces) {
      if (full()) return;
      t.model->tokenize(q.text, ids);
    }
  };
  std::vector<Segment> segments;
  bool use_added = !t.added.empty();
  if (use_added) {
    t.added.split(text, false, 0, segments, split_special_tokens);
  } else {
    segments.push_back({text, -1, 0});
  }
  std::vector<Segment> sub;
  for (const Segment& seg : segments) {
    if (full()) break;
    if (seg.token >= 0) {
      ids.push_back(static_cast<uint32_t>(seg.token));
      continue;
    }
    std::string_view s = seg.text;
    if (t.normalizer) {
      std::string n(s);
      t.normalizer->apply(n);
      s = arena.hold(std::move(n));
    }
    if (use_added && t.added.has_normalized()) {
      sub.clear();
      t.added.split(s, true, seg.offset, sub, split_special_tokens);
      for (const Segment& q : sub) {
        if (full()) break;
        if (q.token >= 0) {
          ids.push_back(static_cast<uint32_t>(q.token));
        } else {
          encode_plain(q.text, q.offset == 0);
        }
      }
    } else {
      encode_plain(s, seg.offset == 0);
    }
  }
  if (add_special_tokens && t.post_processor) t.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  const TokenizerImpl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids) {
    if (const AddedToken* a = t.added.by_id(id)) {
      if (!(skip_special_tokens && a->special)) tokens.push_back(a->content);
    } else if (const std::string* s = t.model->id_to_token(id)) {
      tokens.push_back(*s);
    }
  }
  return run_decoder(t.decoder.get(), std::move(tokens));
}

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.by_content(token)) return id;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(uint32_t id) const {
  if (const AddedToken* a = impl_->added.by_id(id)) return a->content;
  if (const std::string* s = impl_->model->id_to_token(id)) return *s;
  return std::nullopt;
}

bool Tokenizer::is_special(uint32_t id) const {
  const AddedToken* a = impl_->added.by_id(id);
  return a && a->special;
}

size_t Tokenizer::vocab_size() const {
  size_t n = impl_->model->vocab_size();
  for (const AddedToken& a : impl_->added.tokens()) n = std::max(n, static_cast<size_t>(a.id) + 1);
  return n;
}

size_t Tokenizer::max_token_bytes() const {
  size_t most = 1;
  const size_t n = impl_->model->vocab_size();
  for (size_t id = 0; id < n; ++id)
    if (const std::string* s = impl_->model->id_to_token(static_cast<uint32_t>(id))) most = std::max(most, s->size());
  for (const AddedToken& a : impl_->added.tokens()) most = std::max(most, a.content.size());
  return most;
}

std::optional<uint32_t> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::optional<uint32_t> Tokenizer::eos_id() const {
  return impl_->eos_id;
}
const std::string& Tokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_token;
}
const json& Tokenizer::config() const {
  return impl_->config;
}

}  // namespace kiln::tok

#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

using nlohmann::json;

std::unique_ptr<BpeModel> BpeModel::from_hf_json(const json& model, bool byte_mode) {
  KILN_CHECK(model.is_object(), "tokenizer.json: \"model\" must be an object");
  std::string type = model.value("type", "BPE");
  KILN_CHECK(type == "BPE", "tokenizer.json: model type {} is not supported (only BPE)", quote(type));
  std::unique_ptr<BpeModel> m(new BpeModel());
  auto get_str = [&](const char* key) {
    auto it = model.find(key);
    return it == model.end() || it->is_null() ? std::string() : it->get<std::string>();
  };
  m->prefix_ = get_str("continuing_subword_prefix");
  m->suffix_ = get_str("end_of_word_suffix");
  m->ignore_merges_ = model.value("ignore_merges", false);
  m->byte_fallback_ = model.value("byte_fallback", false);
  m->fuse_unk_ = model.value("fuse_unk", false);
  // Byte mode needs every symbol to be a plain byte; affixes would break that.
  m->byte_mode_ = byte_mode && m->prefix_.empty() && m->suffix_.empty();

  const json& vocab = model.at("vocab");
  KILN_CHECK(vocab.is_object(), "tokenizer.json: model.vocab must be an object");
  m->token_to_id_.reserve(vocab.size());
  std::string raw;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    uint32_t uid = json_token_id(it.value(), "a model.vocab id");
    if (uid >= m->id_to_token_.size()) {
      m->id_to_token_.resize(uid + 1);
      m->has_id_.resize(uid + 1, false);
    }
    m->id_to_token_[uid] = it.key();
    m->has_id_[uid] = true;
    m->token_to_id_.set(it.key(), uid);
    if (m->byte_mode_ && byte_level_to_bytes(it.key(), raw)) m->raw_to_id_.set(raw, uid);
  }
  m->byte_id_.fill(-1);
  if (m->byte_mode_) {
    for (int b = 0; b < 256; ++b) {
      char c = static_cast<char>(b);
      if (const uint32_t* id = m->raw_to_id_.find(std::string_view(&c, 1))) m->byte_id_[static_cast<size_t>(b)] = *id;
    }
  }
  std::string unk = get_str("unk_token");
  if (!unk.empty()) {
    if (const uint32_t* id = m->token_to_id_.find(unk)) m->unk_id_ = *id;
  }

  const json& merges = model.at("merges");
  KILN_CHECK(merges.is_array(), "tokenizer.json: model.merges must be an array");
  m->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& mj = merges[rank];
    std::string a, b;
    if (mj.is_string()) {
      const std::string& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      KILN_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                 "tokenizer.json: merge #{} {} is not two tokens separated by one space", rank, quote(s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      KILN_CHECK(mj.is_array() && mj.size() == 2, "tokenizer.json: merge #{} is not a pair", rank);
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    }
    const uint32_t* ia = m->token_to_id_.find(a);
    const uint32_t* ib = m->token_to_id_.find(b);
    std::string merged = a + (!m->prefix_.empty() && b.rfind(m->prefix_, 0) == 0 ? b.substr(m->prefix_.size()) : b);
    const uint32_t* im = m->token_to_id_.find(merged);
    KILN_CHECK(ia && ib && im, "tokenizer.json: merge #{} ({} {}) uses a token missing from the vocabulary", rank,
               quote(a), quote(b));
    uint64_t key = (uint64_t{*ia} << 32) | *ib;
    // The first (lowest-rank) occurrence of a duplicated pair wins, as in Hugging Face.
    if (!m->merges_.find(key)) m->merges_.set(key, {static_cast<uint32_t>(rank), *im});
  }
  return m;
}

std::unique_ptr<BpeModel> BpeModel::from_tiktoken(std::vector<std::string> ranks) {
  KILN_CHECK(ranks.size() <= kMaxTokenId, "tiktoken.model: rank {} is out of range", ranks.size() - 1);
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->byte_mode_ = true;
  m->tiktoken_ = true;
  m->ignore_merges_ = true;  // tiktoken looks the whole piece up before merging
  m->id_to_token_.resize(ranks.size());
  m->has_id_.assign(ranks.size(), false);
  m->token_to_id_.reserve(ranks.size());
  m->raw_to_id_.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].empty()) continue;
    auto id = static_cast<uint32_t>(i);
    m->has_id_[i] = true;
    m->id_to_token_[i] = bytes_to_byte_level(ranks[i]);
    m->token_to_id_.set(m->id_to_token_[i], id);
    m->raw_to_id_.set(ranks[i], id);
  }
  m->byte_id_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char c = static_cast<char>(b);
    const uint32_t* id = m->raw_to_id_.find(std::string_view(&c, 1));
    // tiktoken looks single bytes up unconditionally (a missing one fails its encoder); without
    // one, text holding that byte would lose it silently here.
    KILN_CHECK(id, "tiktoken.model has no token for the byte 0x{:02X}: every byte needs one", b);
    m->byte_id_[static_cast<size_t>(b)] = *id;
  }
  return m;
}

std::optional<uint32_t> BpeModel::token_to_id(std::string_view token) const {
  if (const uint32_t* id = token_to_id_.find(token)) return *id;
  return std::nullopt;
}

const std::string* BpeModel::id_to_token(uint32_t id) const {
  if (id >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::tokenize(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    const uint32_t* id = byte_mode_ ? raw_to_id_.find(piece) : token_to_id_.find(piece);
    if (id) {
      out.push_back(*id);
      return;
    }
  }
  if (piece.size() > kMaxCachedBytes) {
    merge(piece, out);
    return;
  }
  Shard& shard = cache_[(hash_bytes(piece) >> 32) % kShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(piece);
    if (it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t before = out.size();
  merge(piece, out);
  std::vector<uint32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= kShardCapacity) shard.map.clear();
  shard.map.emplace(std::string(piece), std::move(ids));
}

bool BpeModel::initial_symbols(std::string_view piece, std::vector<Symbol>& syms) const {
  syms.clear();
  auto add = [&](uint32_t id, size_t start, size_t len) {
    int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back({id, static_cast<uint32_t>(start), static_cast<uint32_t>(len), idx - 1, idx + 1});
  };
  if (byte_mode_) {
    for (size_t i = 0; i < piece.size(); ++i) {
      int64_t id = byte_id_[static_cast<unsigned char>(piece[i])];
      if (id >= 0) {
        add(static_cast<uint32_t>(id), i, 1);
      } else if (unk_id_) {
        add(*unk_id_, i, 1);
      }
    }
  } else {
    bool prev_unk = false;
    std::string key;
    for (size_t i = 0; i < piece.size();) {
      size_t start = i;
      next_code_point(piece, i);
      key.clear();
      if (start > 0) key += prefix_;
      key.append(piece.substr(start, i - start));
      if (i == piece.size()) key += suffix_;
      if (const uint32_t* id = token_to_id_.find(key)) {
        add(*id, start, i - start);
        prev_unk = false;
        continue;
      }
      if (byte_fallback_) {
        std::vector<uint32_t> ids;
        for (size_t k = start; k < i; ++k) {
          const uint32_t* bid = token_to_id_.find(fmt::format("<0x{:02X}>", static_cast<unsigned char>(piece[k])));
          if (!bid) break;
          ids.push_back(*bid);
        }
        if (ids.size() == i - start) {
          for (size_t k = 0; k < ids.size(); ++k) add(ids[k], start + k, 1);
          prev_unk = false;
          continue;
        }
      }
      if (unk_id_) {
        if (fuse_unk_ && prev_unk) {
          syms.back().len += static_cast<uint32_t>(i - start);
        } else {
          add(*unk_id_, start, i - start);
        }
        prev_unk = true;
      }
    }
  }
  if (syms.empty()) return false;
  syms.back().next = -1;
  return true;
}

bool BpeModel::pair_rank(std::string_view piece, const Symbol& a, const Symbol& b, uint32_t& rank, uint32_t& id) const {
  if (tiktoken_) {
    const uint32_t* r = raw_to_id_.find(piece.substr(a.start, a.len + b.len));
    if (!r) return false;
    rank = id = *r;
    return true;
  }
  const PairMap::Value* v = merges_.find((uint64_t{a.id} << 32) | b.id);
  if (!v) return false;
  rank = v->rank;
  id = v->id;
  return true;
}

void BpeModel::merge(std::string_view piece, std::vector<uint32_t>& out) const {
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<uint64_t> heap;
  if (!initial_symbols(piece, syms)) return;
  heap.clear();
  auto push = [&](int32_t pos) {
    const Symbol& a = syms[static_cast<size_t>(pos)];
    if (a.next < 0) return;
    uint32_t rank, id;
    if (pair_rank(piece, a, syms[static_cast<size_t>(a.next)], rank, id)) {
      // Lowest rank first; among equal ranks the leftmost pair (smallest start offset).
      heap.push_back((uint64_t{rank} << 32) | a.start);
      std::push_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    }
  };
  // Symbols are indexed by position in syms; the heap stores byte offsets, so map back.
  thread_local std::vector<int32_t> at_offset;
  at_offset.assign(piece.size() + 1, -1);
  for (size_t k = 0; k < syms.size(); ++k) at_offset[syms[k].start] = static_cast<int32_t>(k);
  for (size_t k = 0; k + 1 < syms.size(); ++k) push(static_cast<int32_t>(k));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    uint64_t top = heap.back();
    heap.pop_back();
    int32_t pos = at_offset[static_cast<uint32_t>(top)];
    if (pos < 0) continue;
    Symbol& a = syms[static_cast<size_t>(pos)];
    if (a.len == 0 || a.next < 0) continue;
    Symbol& b = syms[static_cast<size_t>(a.next)];
    uint32_t rank, id;
    if (!pair_rank(piece, a, b, rank, id) || rank != static_cast<uint32_t>(top >> 32)) continue;
    // Merge b into a.
    a.id = id;
    a.len += b.len;
    at_offset[b.start] = -1;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) syms[static_cast<size_t>(a.next)].prev = pos;
    if (a.prev >= 0) push(a.prev);
    push(pos);
  }
  for (int32_t k = 0; k >= 0; k = syms[static_cast<size_t>(k)].next) out.push_back(syms[static_cast<size_t>(k)].id);
}

}  // namespace kiln::tok

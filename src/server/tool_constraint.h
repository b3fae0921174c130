// Constrained decoding for tool_choice "required" and named functions: the output must be exactly
// one tool call in the model's own markup (the format the output parser reads), naming one of the
// offered functions, with arguments that match the function's JSON schema (json_grammar.h), then
// the end-of-sequence token.
//
// The grammar works on bytes; a token is allowed when its bytes can continue the text. Special
// and added tokens (the markup of DeepSeek and Kimi, end of sequence) are "units": a unit is
// allowed only where the grammar expects exactly that token, so markers that are one token in the
// vocabulary are written with it, and spelled out byte by byte only where the vocabulary has no
// such token (the bundled kiln-tiny). TokenVocab holds every token's bytes once per tokenizer, as
// a trie; mask() walks the trie from the current state and prunes a subtree at its first refused
// byte, so a step costs what the grammar allows, not the vocabulary size times the token length.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/constraint.h"
#include "server/json_grammar.h"
#include "server/output_parser.h"

namespace kiln::tok {
class Tokenizer;
}

namespace kiln::server {

class TokenVocab {
 public:
  // token_bytes[i]: what token i stands for; unit[i]: matched only as a whole.
  TokenVocab(std::vector<std::string> token_bytes, std::vector<uint8_t> unit);

  size_t size() const { return bytes_.size(); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_unit(int32_t id) const { return unit_[static_cast<size_t>(id)] != 0; }
  const std::vector<int32_t>& units() const { return units_; }
  std::optional<int32_t> unit_for(const std::string& content) const;

  // The byte trie over the tokens that are not units: node 0 is the root.
  struct Node {
    int32_t edge_begin = 0, edge_end = 0;  // into edge_byte / edge_child
    int32_t tok_begin = 0, tok_end = 0;    // into sorted_ids: the tokens spelled by this path
  };
  std::vector<Node> nodes;
  std::vector<uint8_t> edge_byte;
  std::vector<int32_t> edge_child;
  std::vector<int32_t> sorted_ids;
  int32_t max_len = 0;

 private:
  int32_t build(int32_t lo, int32_t hi, int32_t depth);
  std::vector<std::string> bytes_;
  std::vector<uint8_t> unit_;
  std::vector<int32_t> units_;
  std::unordered_map<std::string, int32_t> unit_by_content_;
};

// Every token's bytes (byte-level BPE: the GPT-2 byte alphabet undone; SentencePiece-style: "▁"
// as a space and "<0xAB>" byte tokens); special tokens, tokens that are not byte-level (added
// markup) and `end_ids` become units. Built once per server (token_vocab.cc).
std::shared_ptr<const TokenVocab> token_vocab(const tok::Tokenizer& t, const std::vector<int32_t>& end_ids);

// DeepSeek-V3 writes "function<sep>NAME\n```json\nARGS\n```"; V3.1 "NAME<sep>ARGS"; Kimi K2
// "functions.NAME:0<argument_begin>ARGS".
// PlainJson: no markup, the output is the one object itself (response_format json_object /
// json_schema), under the first ToolSpec's schema.
enum class ToolCallStyle { DeepSeekV3, DeepSeekV31, KimiK2, PlainJson };

struct ToolSpec {
  std::string name;
  nlohmann::json parameters;  // JSON schema (null: any object)
};

// What one request's calls must look like; immutable, shared by its choices.
class ToolCallGrammar {
 public:
  // `end_ids`: the tokens that may end the output once the call is closed.
  ToolCallGrammar(std::shared_ptr<const TokenVocab> vocab, ToolCallStyle style, const std::vector<ToolSpec>& tools,
                  std::vector<int32_t> end_ids);

  struct State {
    int32_t seg = 0, pos = 0, tool = 0;
    bool failed = false, finished = false;
    JsonState json;
    void assign(const State& o) {
      seg = o.seg, pos = o.pos, tool = o.tool, failed = o.failed, finished = o.finished;
      json.assign(o.json);
    }
  };
  State start() const;
  bool feed_byte(State& s, uint8_t b) const;
  bool feed_unit(State& s, int32_t id) const;
  // Walks the byte trie: sets allowed[id] for every token that can follow `s` (units included).
  void allowed(const State& s, std::vector<uint8_t>& allowed, std::vector<State>& scratch) const;
  const TokenVocab& vocab() const { return *vocab_; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }

 private:
  enum class Kind { Bytes, Unit, Names, Json, End };
  struct Segment {
    Kind kind;
    std::string bytes;   // Bytes
    int32_t token = -1;  // Unit
  };
  void enter(State& s, int32_t seg) const;
  void walk(int32_t node, int32_t depth, std::vector<uint8_t>& allowed, std::vector<State>& st) const;

  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<Segment> segs_;
  LiteralTrie names_;
  std::vector<JsonSchemaGrammar> grammars_;  // per tool
  std::vector<int32_t> end_ids_;
};

// One request's constraint (the engine thread drives it).
class ToolCallConstraint : public TokenConstraint {
 public:
  explicit ToolCallConstraint(std::shared_ptr<const ToolCallGrammar> g) : g_(std::move(g)), s_(g_->start()) {}
  void mask(std::span<float> logits) override;
  void advance(int32_t token) override;
  const ToolCallGrammar::State& state() const { return s_; }

 private:
  std::shared_ptr<const ToolCallGrammar> g_;
  ToolCallGrammar::State s_;
  std::vector<uint8_t> allowed_;
  std::vector<ToolCallGrammar::State> scratch_;
};

}  // namespace kiln::server

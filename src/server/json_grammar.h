// Byte-at-a-time matching of JSON text against a subset of JSON Schema, for constrained decoding
// of tool-call arguments (tool_choice "required" or a named function). A JsonState is a small
// pushdown automaton of plain data: testing a token means copying it and feeding the token's
// bytes, so the caller can walk a trie of the whole vocabulary from one state.
//
// Supported: type object (properties, required, additionalProperties), array (items), string
// (minLength, maxLength), number, integer, boolean, null, enum and const. Anything else (anyOf,
// $ref, type lists, patterns) matches any JSON value. With `properties` given, other keys are
// refused unless additionalProperties says otherwise: a model may then only write the keys the
// function declares. The top level is always an object (OpenAI's arguments are one).
//
// Bounds that keep generation finite whatever the model prefers: at most 16 whitespace bytes in a
// row, numbers of at most 24 bytes (and two exponent digits, so every number is a finite double),
// nesting of at most 24 levels.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln::server {

// A set of byte strings as a trie; a node that ends a string holds its value (else -1).
class LiteralTrie {
 public:
  LiteralTrie() : nodes_(1) {}
  void add(std::string_view s, int32_t value);
  int32_t child(int32_t node, uint8_t b) const;  // -1: none
  int32_t value(int32_t node) const { return nodes_[static_cast<size_t>(node)].value; }
  bool has_children(int32_t node) const { return !nodes_[static_cast<size_t>(node)].next.empty(); }
  bool empty() const { return nodes_.size() == 1; }
  // Whether a string through `node` ends with a value whose bit is clear in `taken` (values of
  // 64 and up always count as free): where a key prefix can still lead to an unwritten key.
  bool reaches_free(int32_t node, uint64_t taken) const {
    const Node& n = nodes_[static_cast<size_t>(node)];
    return n.big || (n.below & ~taken) != 0;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;
    int32_t value = -1;
    uint64_t below = 0;  // bits of the values (< 64) ending at or under this node
    bool big = false;    // a value >= 64 ends at or under this node
  };
  std::vector<Node> nodes_;
};

class JsonSchemaGrammar;

// Where the matcher is. Plain data; copy with assign(), which copies only the frames in use.
struct JsonState {
  static constexpr int kMaxDepth = 24;
  struct Frame {
    uint64_t seen = 0;   // object: properties written (the first 64)
    int32_t node = 0;    // schema node
    int32_t aux = 0;     // trie node (key, literal) or the current key's property index
    uint16_t count = 0;  // characters of a string, bytes of a number
    uint8_t mode = 0;
    uint8_t sub = 0;   // string escape / number phase / which literal trie
    uint8_t utf8 = 0;  // continuation bytes still due
  };
  uint8_t depth = 0;  // frames in use; 0 with done: the top-level object is complete
  uint8_t ws = 0;     // whitespace bytes in a row
  bool done = false;
  Frame frames[kMaxDepth];

  void assign(const JsonState& o) {
    depth = o.depth;
    ws = o.ws;
    done = o.done;
    for (int i = 0; i < depth; ++i) frames[i] = o.frames[i];
  }
};

class JsonSchemaGrammar {
 public:
  // Never throws: a schema it does not understand matches more, not less.
  explicit JsonSchemaGrammar(const nlohmann::json& schema);

  JsonState start() const;
  // Consumes one byte; false (state unspecified) when the text cannot continue with it.
  bool feed(JsonState& s, uint8_t b) const;

 private:
  enum class Kind : uint8_t { Any, Object, Array, String, Number, Integer, Boolean, Null, Enum };
  struct Node {
    Kind kind = Kind::Any;
    std::vector<int32_t> props;  // object: each property's node
    LiteralTrie keys;            // object: JSON-encoded names without the opening quote
    uint64_t required = 0;
    bool additional = true;
    int32_t items = 0;  // array
    int64_t min_length = 0, max_length = -1;
    LiteralTrie values;  // enum: JSON texts
  };
  int32_t compile(const nlohmann::json& schema, int depth);
  bool value_start(JsonState& s, uint8_t b) const;
  bool pop(JsonState& s) const;  // the top value is complete
  bool push(JsonState& s, int32_t node) const;
  const LiteralTrie& literals(const JsonState::Frame& f) const;

  std::vector<Node> nodes_;  // 0: any value
  int32_t root_ = 0;
  LiteralTrie lit_any_, lit_bool_, lit_null_;
};

}  // namespace kiln::server

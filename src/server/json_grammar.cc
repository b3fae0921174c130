#include "server/json_grammar.h"

#include <algorithm>

namespace kiln::server {
namespace {

using nlohmann::json;

// What the top frame is reading.
enum Mode : uint8_t {
  kValue,     // a value of the frame's node, not started (whitespace allowed)
  kObjOpen,   // after '{': a key or '}'
  kObjKey,    // inside a key
  kObjColon,  // after a key: ':' (aux: the key's property, -1 for another key)
  kObjNext,   // after a member: ',' or '}'
  kObjComma,  // after ',': a key
  kArrOpen,   // after '[': a value or ']'
  kArrNext,   // after an element: ',' or ']'
  kString,
  kNumber,
  kLiteral,  // true / false / null or an enum value, matched in a LiteralTrie
};
enum LiteralSet : uint8_t { kEnum, kAnyLiteral, kBoolLiteral, kNullLiteral };

constexpr uint8_t kMaxWhitespace = 16;
constexpr uint16_t kMaxNumberBytes = 24;

bool is_ws(uint8_t b) {
  return b == ' ' || b == '\n' || b == '\t' || b == '\r';
}
bool is_digit(uint8_t b) {
  return b >= '0' && b <= '9';
}
bool is_hex(uint8_t b) {
  return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

enum StringStep { kReject, kConsumed, kClosed };

// One byte of a JSON string's content; `count` counts characters (an escape is one). Only
// well-formed UTF-8 passes (no overlong forms, no surrogates), and u-escapes of surrogates are
// refused too: parsers differ on them (nlohmann rejects a lone one).
// f.utf8: continuation bytes still due (low 2 bits) and the range of the next one (above).
StringStep string_byte(JsonState::Frame& f, uint8_t b, int64_t max_length) {
  if (f.utf8 > 0) {
    static constexpr uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    const int r = f.utf8 >> 2;
    if (b < lo[r] || b > hi[r]) return kReject;
    f.utf8 = static_cast<uint8_t>((f.utf8 & 3) - 1);
    return kConsumed;
  }
  if (f.sub == 1) {  // after a backslash
    if (b == 'u') {
      f.sub = 14;  // four hex digits: 14, 13, 12, 11
      return kConsumed;
    }
    if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
      f.sub = 0;
      return kConsumed;
    }
    return kReject;
  }
  if (f.sub == 20) {  // a u-escape starting with D: D800-DFFF are surrogates
    if (b < '0' || b > '7') return kReject;
    f.sub = 12;
    return kConsumed;
  }
  if (f.sub == 14 && (b == 'd' || b == 'D')) {
    f.sub = 20;
    return kConsumed;
  }
  if (f.sub >= 11) {
    if (!is_hex(b)) return kReject;
    f.sub = f.sub == 11 ? 0 : static_cast<uint8_t>(f.sub - 1);
    return kConsumed;
  }
  if (b == '"') return kClosed;
  if (b < 0x20) return kReject;
  if (max_length >= 0 && f.count >= max_length) return kReject;
  if (b == '\\') {
    f.sub = 1;
  } else if (b >= 0x80) {
    if (b >= 0xC2 && b <= 0xDF)
      f.utf8 = 1;
    else if (b == 0xE0)
      f.utf8 = 2 + 4 * 1;
    else if (b == 0xED)
      f.utf8 = 2 + 4 * 2;
    else if (b >= 0xE1 && b <= 0xEF)
      f.utf8 = 2;
    else if (b == 0xF0)
      f.utf8 = 3 + 4 * 3;
    else if (b == 0xF4)
      f.utf8 = 3 + 4 * 4;
    else if (b >= 0xF1 && b <= 0xF3)
      f.utf8 = 3;
    else
      return kReject;
  }
  if (f.count < 0xFFFF) ++f.count;
  return kConsumed;
}

// JSON number phases: 1 after '-', 2 a leading 0, 3 integer digits, 4 after '.', 5 fraction
// digits, 6 after 'e', 7 after the exponent's sign, 8 exponent digits.
bool number_accepts(uint8_t phase) {
  return phase == 2 || phase == 3 || phase == 5 || phase == 8;
}
int number_next(uint8_t phase, uint8_t b, bool integer) {
  const bool d = is_digit(b);
  switch (phase) {
    case 1: return b == '0' ? 2 : d ? 3 : -1;
    case 2: return integer ? -1 : b == '.' ? 4 : (b == 'e' || b == 'E') ? 6 : -1;
    case 3: return d ? 3 : integer ? -1 : b == '.' ? 4 : (b == 'e' || b == 'E') ? 6 : -1;
    case 4: return d ? 5 : -1;
    case 5: return d ? 5 : (b == 'e' || b == 'E') ? 6 : -1;
    case 6: return (b == '+' || b == '-') ? 7 : d ? 8 : -1;
    case 7:
    case 8: return d ? 8 : -1;
  }
  return -1;
}

int64_t length_of(const json& s, const char* key, int64_t def) {
  if (!s.contains(key) || !s[key].is_number_integer()) return def;
  const int64_t v = s[key].get<int64_t>();
  return v < 0 ? def : std::min<int64_t>(v, 0xFFFF);
}

}  // namespace

void LiteralTrie::add(std::string_view s, int32_t value) {
  int32_t node = 0;
  auto mark = [&](int32_t n) {
    Node& x = nodes_[static_cast<size_t>(n)];
    if (value >= 64)
      x.big = true;
    else if (value >= 0)
      x.below |= uint64_t{1} << value;
  };
  mark(0);
  for (char ch : s) {
    const auto b = static_cast<uint8_t>(ch);
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[static_cast<size_t>(node)].next.emplace_back(b, next);
      nodes_.emplace_back();
    }
    node = next;
    mark(node);
  }
  if (nodes_[static_cast<size_t>(node)].value < 0) nodes_[static_cast<size_t>(node)].value = value;
}

int32_t LiteralTrie::child(int32_t node, uint8_t b) const {
  for (const auto& [c, n] : nodes_[static_cast<size_t>(node)].next)
    if (c == b) return n;
  return -1;
}

JsonSchemaGrammar::JsonSchemaGrammar(const json& schema) : nodes_(1) {
  lit_any_.add("true", 0);
  lit_any_.add("false", 0);
  lit_any_.add("null", 0);
  lit_bool_.add("true", 0);
  lit_bool_.add("false", 0);
  lit_null_.add("null", 0);
  root_ = compile(schema, 0);
  if (nodes_[static_cast<size_t>(root_)].kind != Kind::Object) {  // arguments are always an object
    Node any_object;
    any_object.kind = Kind::Object;
    nodes_.push_back(std::move(any_object));
    root_ = static_cast<int32_t>(nodes_.size() - 1);
  }
}

int32_t JsonSchemaGrammar::compile(const json& s, int depth) {
  if (depth > 32 || !s.is_object()) return 0;
  Node n;
  if (s.contains("enum") && s["enum"].is_array() && !s["enum"].empty()) {
    n.kind = Kind::Enum;
    for (const json& v : s["enum"]) n.values.add(v.dump(), 0);
  } else if (s.contains("const")) {
    n.kind = Kind::Enum;
    n.values.add(s["const"].dump(), 0);
  } else {
    std::string type;
    if (s.contains("type") && s["type"].is_string()) type = s["type"].get<std::string>();
    if (s.contains("type") && s["type"].is_array() && s["type"].size() == 1 && s["type"][0].is_string())
      type = s["type"][0].get<std::string>();
    if (type.empty() && s.contains("properties")) type = "object";
    if (type.empty() && s.contains("items")) type = "array";
    if (type == "object") {
      n.kind = Kind::Object;
      if (s.contains("properties") && s["properties"].is_object())
        for (const auto& [name, sub] : s["properties"].items()) {
          const auto idx = static_cast<int32_t>(n.props.size());
          n.keys.add(json(name).dump().substr(1), idx);  // the encoded name after its opening quote
          const int32_t child = compile(sub, depth + 1);
          n.props.push_back(child);
        }
      if (s.contains("required") && s["required"].is_array())
        for (const json& r : s["required"]) {
          if (!r.is_string()) continue;
          int32_t node = 0;
          for (char ch : json(r).dump().substr(1))
            if (node >= 0) node = n.keys.child(node, static_cast<uint8_t>(ch));
          if (node >= 0 && n.keys.value(node) >= 0 && n.keys.value(node) < 64)
            n.required |= uint64_t{1} << n.keys.value(node);
        }
      const json ap = s.contains("additionalProperties") ? s["additionalProperties"] : json();
      n.additional =
          n.props.empty() ? !(ap.is_boolean() && !ap.get<bool>()) : (ap.is_boolean() ? ap.get<bool>() : ap.is_object());
    } else if (type == "array") {
      n.kind = Kind::Array;
      if (s.contains("items") && s["items"].is_object()) n.items = compile(s["items"], depth + 1);
    } else if (type == "string") {
      n.kind = Kind::String;
      n.min_length = length_of(s, "minLength", 0);
      n.max_length = length_of(s, "maxLength", -1);
      if (n.max_length >= 0 && n.max_length < n.min_length) n.max_length = n.min_length;
    } else if (type == "number") {
      n.kind = Kind::Number;
    } else if (type == "integer") {
      n.kind = Kind::Integer;
    } else if (type == "boolean") {
      n.kind = Kind::Boolean;
    } else if (type == "null") {
      n.kind = Kind::Null;
    } else {
      return 0;
    }
  }
  nodes_.push_back(std::move(n));
  return static_cast<int32_t>(nodes_.size() - 1);
}

JsonState JsonSchemaGrammar::start() const {
  JsonState s;
  s.frames[0] = JsonState::Frame{};
  s.frames[0].node = root_;
  s.frames[0].mode = kValue;
  s.depth = 1;
  return s;
}

bool JsonSchemaGrammar::push(JsonState& s, int32_t node) const {
  if (s.depth >= JsonState::kMaxDepth) return false;
  s.frames[s.depth] = JsonState::Frame{};
  s.frames[s.depth].node = node;
  s.frames[s.depth].mode = kValue;
  ++s.depth;
  return true;
}

bool JsonSchemaGrammar::pop(JsonState& s) const {
  --s.depth;
  if (s.depth == 0) s.done = true;
  return true;
}

const LiteralTrie& JsonSchemaGrammar::literals(const JsonState::Frame& f) const {
  switch (f.sub) {
    case kAnyLiteral: return lit_any_;
    case kBoolLiteral: return lit_bool_;
    case kNullLiteral: return lit_null_;
    default: return nodes_[static_cast<size_t>(f.node)].values;
  }
}

bool JsonSchemaGrammar::value_start(JsonState& s, uint8_t b) const {
  JsonState::Frame& f = s.frames[s.depth - 1];
  const Node& n = nodes_[static_cast<size_t>(f.node)];
  const auto allows = [&](Kind k) { return n.kind == Kind::Any || n.kind == k; };
  auto literal = [&](const LiteralTrie& t, uint8_t set) {
    const int32_t c = t.child(0, b);
    if (c < 0) return false;
    f.mode = kLiteral;
    f.sub = set;
    f.aux = c;
    return true;
  };
  if (n.kind == Kind::Enum) return literal(n.values, kEnum);
  if (b == '{' && allows(Kind::Object)) {
    if (s.depth >= JsonState::kMaxDepth - 1) return false;  // room for a member's value
    f.mode = kObjOpen;
    f.seen = 0;
    return true;
  }
  if (b == '[' && allows(Kind::Array)) {
    if (s.depth >= JsonState::kMaxDepth - 1) return false;
    f.mode = kArrOpen;
    return true;
  }
  if (b == '"' && allows(Kind::String)) {
    f.mode = kString;
    f.sub = f.utf8 = 0;
    f.count = 0;
    return true;
  }
  if ((b == '-' || is_digit(b)) && (allows(Kind::Number) || n.kind == Kind::Integer)) {
    f.mode = kNumber;
    f.sub = b == '-' ? 1 : b == '0' ? 2 : 3;
    f.count = 1;
    return true;
  }
  if (n.kind == Kind::Any) return literal(lit_any_, kAnyLiteral);
  if (n.kind == Kind::Boolean) return literal(lit_bool_, kBoolLiteral);
  if (n.kind == Kind::Null) return literal(lit_null_, kNullLiteral);
  return false;
}

bool JsonSchemaGrammar::feed(JsonState& s, uint8_t b) const {
  if (s.done || s.depth == 0) return false;
  const bool ws = is_ws(b);
  if (!ws) s.ws = 0;
  const auto take_ws = [&] {
    if (s.ws >= kMaxWhitespace) return false;
    ++s.ws;
    return true;
  };
  for (;;) {
    JsonState::Frame& f = s.frames[s.depth - 1];
    const Node& n = nodes_[static_cast<size_t>(f.node)];
    switch (f.mode) {
      case kValue: return ws ? take_ws() : value_start(s, b);
      case kObjOpen:
      case kObjComma:
        if (ws) return take_ws();
        if (b == '}' && f.mode == kObjOpen) return (f.seen & n.required) == n.required && pop(s);
        if (b != '"' || (!n.additional && !n.keys.reaches_free(0, f.seen))) return false;
        f.mode = kObjKey;
        f.aux = 0;
        f.sub = f.utf8 = 0;
        f.count = 0;
        return true;
      case kObjKey: {
        const int32_t next = !n.props.empty() && f.aux >= 0 ? n.keys.child(f.aux, b) : -1;
        auto finish_key = [&](int32_t prop) {
          if (prop >= 0 && prop < 64 && ((f.seen >> prop) & 1)) return false;  // no key twice
          f.mode = kObjColon;
          f.aux = prop;
          return true;
        };
        if (!n.additional) {  // only the declared names not yet written, spelled as the trie holds them
          if (next < 0 || !n.keys.reaches_free(next, f.seen)) return false;
          f.aux = next;
          return n.keys.value(next) >= 0 ? finish_key(n.keys.value(next)) : true;
        }
        const StringStep st = string_byte(f, b, -1);
        if (st == kReject) return false;
        if (st == kClosed) return finish_key(next >= 0 ? n.keys.value(next) : -1);
        f.aux = next;
        return true;
      }
      case kObjColon: {
        if (ws) return take_ws();
        if (b != ':') return false;
        const int32_t prop = f.aux;
        if (prop >= 0 && prop < 64) f.seen |= uint64_t{1} << prop;
        f.mode = kObjNext;
        return push(s, prop >= 0 ? n.props[static_cast<size_t>(prop)] : 0);
      }
      case kObjNext:
        if (ws) return take_ws();
        if (b == '}') return (f.seen & n.required) == n.required && pop(s);
        if (b != ',') return false;
        // Another member only if some key can still be written.
        if (!n.additional && !n.keys.reaches_free(0, f.seen)) return false;
        f.mode = kObjComma;
        return true;
      case kArrOpen:
        if (ws) return take_ws();
        if (b == ']') return pop(s);
        f.mode = kArrNext;
        if (!push(s, n.items)) return false;
        continue;  // the element's first byte
      case kArrNext:
        if (ws) return take_ws();
        if (b == ']') return pop(s);
        return b == ',' && push(s, n.items);
      case kString: {
        const StringStep st = string_byte(f, b, n.kind == Kind::String ? n.max_length : -1);
        if (st == kClosed) return (n.kind != Kind::String || f.count >= n.min_length) && pop(s);
        return st == kConsumed;
      }
      case kNumber: {
        const int next = number_next(f.sub, b, n.kind == Kind::Integer);
        if (next == 8) {  // at most two exponent digits: every number stays a finite double
          f.aux = f.sub == 8 ? f.aux + 1 : 1;
          if (f.aux > 2) return false;
        }
        if (next >= 0) {
          // Past a non-accepting phase ('-', '.', 'e', the exponent's sign) a digit must still fit.
          if (f.count + 1 + (number_accepts(static_cast<uint8_t>(next)) ? 0 : 1) > kMaxNumberBytes) return false;
          f.sub = static_cast<uint8_t>(next);
          ++f.count;
          return true;
        }
        if (!number_accepts(f.sub)) return false;
        pop(s);
        continue;  // the byte after the number belongs to the parent
      }
      case kLiteral: {
        const LiteralTrie& t = literals(f);
        const int32_t c = t.child(f.aux, b);
        if (c >= 0) {
          f.aux = c;
          return true;
        }
        if (t.value(f.aux) < 0) return false;
        pop(s);
        continue;
      }
      default: return false;
    }
  }
}

}  // namespace kiln::server

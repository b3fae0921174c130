#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace kiln::jinja {

using tok::append_utf8;
using tok::next_code_point;

const Value* Args::get(const std::string& name, size_t i) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return i < pos.size() ? &pos[i] : nullptr;
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k.type == Value::Type::String && k.s == key) return &v;
  return nullptr;
}

void Dict::set(const Value& key, Value v) {
  for (auto& [k, old] : items) {
    if (equals(k, key)) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value Value::make_list(std::vector<Value> items, bool tuple) {
  Value v = with_type(Type::List);
  v.list = std::make_shared<List>();
  v.list->items = std::move(items);
  v.list->tuple = tuple;
  return v;
}

Value Value::make_dict(Dict::Kind kind) {
  Value v = with_type(Type::Dict);
  v.dict = std::make_shared<Dict>();
  v.dict->kind = kind;
  return v;
}

Value Value::function(std::string name, std::function<Value(Interpreter&, const Args&)> f) {
  Value v = with_type(Type::Function);
  v.fn = std::make_shared<Function>(Function{std::move(name), std::move(f)});
  return v;
}

namespace {
// Values are walked recursively (conversion, printing, JSON); bound the depth so that deep input
// or a namespace that contains itself is an error, not a stack overflow.
constexpr int kMaxDepth = 256;
void check_depth(int depth) {
  KILN_CHECK(depth <= kMaxDepth, "value nesting is deeper than {} levels", kMaxDepth);
}

Value from_json_at(const nlohmann::ordered_json& j, int depth);
}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) {
  return from_json_at(j, 0);
}

namespace {
Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  check_depth(depth);
  using V = Value;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return V::none();
    case nlohmann::ordered_json::value_t::boolean: return V::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return V::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? V::number(static_cast<double>(u))
                                                  : V::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return V::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return V::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return V::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = V::make_dict();
      d.dict->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict->items.emplace_back(V::string(it.key()), from_json_at(it.value(), depth + 1));
      return d;
    }
    default: return V::none();
  }
}

}  // namespace

bool truthy(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
    case Value::Type::None: return false;
    case Value::Type::Bool: return v.b;
    case Value::Type::Int: return v.i != 0;
    case Value::Type::Float: return v.f != 0;
    case Value::Type::String: return !v.s.empty();
    case Value::Type::List: return !v.list->items.empty();
    case Value::Type::Dict: return v.dict->kind != Dict::Kind::Dict || !v.dict->items.empty();
    case Value::Type::Function: return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type != Value::Type::Float && b.type != Value::Type::Float)
      return (a.type == Value::Type::Bool ? a.b : a.i) == (b.type == Value::Type::Bool ? b.b : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::Type::Undefined:
    case Value::Type::None: return true;
    case Value::Type::String: return a.s == b.s;
    case Value::Type::List: {
      if (a.list == b.list) return true;
      if (a.list->tuple != b.list->tuple || a.list->items.size() != b.list->items.size()) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!equals(a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case Value::Type::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->kind != Dict::Kind::Dict || b.dict->kind != Dict::Kind::Dict) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Type::Function: return a.fn == b.fn;
    default: return false;
  }
}

std::string type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined: return "Undefined";
    case Value::Type::None: return "NoneType";
    case Value::Type::Bool: return "bool";
    case Value::Type::Int: return "int";
    case Value::Type::Float: return "float";
    case Value::Type::String: return "str";
    case Value::Type::List: return v.list->tuple ? "tuple" : "list";
    case Value::Type::Dict:
      return v.dict->kind == Dict::Kind::Namespace ? "Namespace"
             : v.dict->kind == Dict::Kind::Loop    ? "LoopContext"
                                                   : "dict";
    case Value::Type::Function: return "function";
  }
  return "object";
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type != Value::Type::Float && b.type != Value::Type::Float)
      return (a.type == Value::Type::Bool ? a.b : a.i) < (b.type == Value::Type::Bool ? b.b : b.i);
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list->items, &y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!equals(x[k], y[k])) return less(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b));
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  // sci: [-]D[.DDD]e[+-]XX
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (size_t k = 0; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(exp) + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out.append(digits, 0, static_cast<size_t>(exp) + 1);
      out += '.';
      out.append(digits, static_cast<size_t>(exp) + 1);
    }
  } else {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1);
    }
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

std::string py_string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_code_point(s, i);
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!tok::is_python_printable(c)) {
      char buf[16];
      if (c < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  out += q;
  return out;
}

namespace {
std::string repr_at(const Value& v, int depth);
}  // namespace

std::string py_repr(const Value& v) {
  return repr_at(v, 0);
}

namespace {
std::string repr_at(const Value& v, int depth) {
  check_depth(depth);
  switch (v.type) {
    case Value::Type::String: return py_string_repr(v.s);
    case Value::Type::Undefined: return "Undefined";
    case Value::Type::List: {
      std::string out = v.list->tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += ", ";
        out += repr_at(v.list->items[k], depth + 1);
      }
      if (v.list->tuple && v.list->items.size() == 1) out += ",";
      out += v.list->tuple ? ")" : "]";
      return out;
    }
    case Value::Type::Dict: {
      std::string out = v.dict->kind == Dict::Kind::Namespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k) out += ", ";
        out += repr_at(v.dict->items[k].first, depth + 1);
        out += ": ";
        out += repr_at(v.dict->items[k].second, depth + 1);
      }
      out += v.dict->kind == Dict::Kind::Namespace ? "}>" : "}";
      return out;
    }
    default: return py_str(v);
  }
}
}  // namespace

std::string py_str(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined: return "";
    case Value::Type::None: return "None";
    case Value::Type::Bool: return v.b ? "True" : "False";
    case Value::Type::Int: return std::to_string(v.i);
    case Value::Type::Float: return py_float_repr(v.f);
    case Value::Type::String: return v.s;
    case Value::Type::Function: {
      std::string s = "<function ";
      s += v.fn->name;
      s += '>';
      return s;
    }
    default: return py_repr(v);
  }
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    char32_t c = next_code_point(s, i);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
          if (c >= 0x10000) {
            char32_t u = c - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (u >> 10)),
                          static_cast<unsigned>(0xDC00 + (u & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          out.append(s, start, i - start);
        }
      }
    }
  }
  out += '"';
}

std::string json_key(const Value& k) {
  switch (k.type) {
    case Value::Type::String: return k.s;
    case Value::Type::Bool: return k.b ? "true" : "false";
    case Value::Type::None: return "null";
    case Value::Type::Int:
    case Value::Type::Float: return py_str(k);
    default: fail("keys must be str, int, float, bool or None, not {}", type_name(k));
  }
}

void dump(std::string& out, const Value& v, const JsonOptions& o, int level) {
  check_depth(level);
  const std::string item_sep = o.item_sep ? *o.item_sep : (o.indent ? "," : ", ");
  const std::string key_sep = o.key_sep ? *o.key_sep : ": ";
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += *o.indent;
    // A wide indent is written once per line and level: bound the whole, not the indent alone.
    KILN_CHECK(out.size() <= kMaxTemplateString, "tojson result exceeds {} bytes", kMaxTemplateString);
  };
  switch (v.type) {
    case Value::Type::None: out += "null"; return;
    case Value::Type::Bool: out += v.b ? "true" : "false"; return;
    case Value::Type::Int: out += std::to_string(v.i); return;
    case Value::Type::Float:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += py_float_repr(v.f);
      }
      return;
    case Value::Type::String: json_string(out, v.s, o.ensure_ascii); return;
    case Value::Type::List: {
      const auto& items = v.list->items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      if (o.indent) newline(level + 1);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) {
          out += item_sep;
          if (o.indent) newline(level + 1);
        }
        dump(out, items[k], o, level + 1);
      }
      if (o.indent) newline(level);
      out += ']';
      return;
    }
    case Value::Type::Dict: {
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return less(a->first, b->first); });
      out += '{';
      if (o.indent) newline(level + 1);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) {
          out += item_sep;
          if (o.indent) newline(level + 1);
        }
        json_string(out, json_key(items[k]->first), o.ensure_ascii);
        out += key_sep;
        dump(out, items[k]->second, o, level + 1);
      }
      if (o.indent) newline(level);
      out += '}';
      return;
    }
    default: fail("Object of type {} is not JSON serializable", type_name(v));
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  return out;
}

nlohmann::ordered_json to_json(const Value& v) {
  switch (v.type) {
    case Value::Type::None:
    case Value::Type::Undefined: return nullptr;
    case Value::Type::Bool: return v.b;
    case Value::Type::Int: return v.i;
    case Value::Type::Float: return v.f;
    case Value::Type::String: return v.s;
    case Value::Type::List: {
      auto a = nlohmann::ordered_json::array();
      for (const Value& e : v.list->items) a.push_back(to_json(e));
      return a;
    }
    case Value::Type::Dict: {
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.dict->items) o[py_str(k)] = to_json(e);
      return o;
    }
    default: return py_str(v);
  }
}

}  // namespace kiln::jinja

// Values of the Jinja interpreter, with the Python semantics chat templates depend on: str() and
// repr() spelling, truthiness, equality across int/float/bool, ordered dicts, reference semantics
// for lists and dicts, and json.dumps exactly as transformers' `tojson` filter calls it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::jinja {

// The longest string a template may build, its output included, in bytes: a runaway template (a
// model's files are untrusted input) fails instead of exhausting memory. Real chat templates stay
// orders of magnitude below it.
inline constexpr size_t kMaxTemplateString = 16u << 20;

struct Value;
class Interpreter;

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Keyword `name`, else positional index `i`, else nullptr.
  const Value* get(const std::string& name, size_t i) const;
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, const Args&)> call;
};

struct List {
  std::vector<Value> items;
  bool tuple = false;
};

struct Dict {
  enum class Kind { Dict, Namespace, Loop };
  std::vector<std::pair<Value, Value>> items;  // insertion order, like Python dicts
  Kind kind = Kind::Dict;
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(const Value& key, Value v);
};

struct Value {
  enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Function };
  Type type = Type::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; for Undefined, the name that was missing (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> fn;

  static Value undefined(std::string name = "") {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() { return with_type(Type::None); }
  static Value boolean(bool x) {
    Value v = with_type(Type::Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = with_type(Type::Int);
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v = with_type(Type::Float);
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = with_type(Type::String);
    v.s = std::move(x);
    return v;
  }
  static Value make_list(std::vector<Value> items = {}, bool tuple = false);
  static Value make_dict(Dict::Kind kind = Dict::Kind::Dict);
  static Value function(std::string name, std::function<Value(Interpreter&, const Args&)> f);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_string() const { return type == Type::String; }
  bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
  bool is_list() const { return type == Type::List; }
  bool is_dict() const { return type == Type::Dict; }
  bool is_callable() const { return type == Type::Function; }
  double as_double() const {
    return type == Type::Float ? f : type == Type::Bool ? (b ? 1 : 0) : static_cast<double>(i);
  }

 private:
  static Value with_type(Type t) {
    Value v;
    v.type = t;
    return v;
  }
};

bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// Python's a < b; throws kiln::Error for unorderable types.
bool less(const Value& a, const Value& b);
std::string type_name(const Value& v);

std::string py_str(const Value& v);
std::string py_repr(const Value& v);
std::string py_float_repr(double d);
std::string py_string_repr(const std::string& s);

struct JsonOptions {
  std::optional<std::string> indent;  // nullopt: compact; else the indent unit
  std::optional<std::string> item_sep, key_sep;
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python json.dumps. Throws kiln::Error for values JSON cannot hold (Undefined, functions).
std::string json_dumps(const Value& v, const JsonOptions& opt);
nlohmann::ordered_json to_json(const Value& v);

}  // namespace kiln::jinja
